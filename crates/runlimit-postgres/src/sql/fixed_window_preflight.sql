WITH found AS MATERIALIZED (
    SELECT input.ordinal, w.used, w.window_expires_at
    FROM (VALUES {keys}) AS input (ordinal, counter_key)
    JOIN public.runlimit_fixed_windows AS w ON w.counter_key = input.counter_key
    FOR NO KEY UPDATE OF w
)
SELECT found.ordinal::bigint AS ordinal,
       found.used,
       (EXTRACT(EPOCH FROM found.window_expires_at) * 1000000)::bigint AS expires_us,
       clock.now_us
FROM (
    SELECT (EXTRACT(EPOCH FROM pg_catalog.clock_timestamp()) * 1000000)::bigint AS now_us
    FROM (SELECT pg_catalog.count(*) FROM found) AS after_row_locks
) AS clock
LEFT JOIN found ON true
ORDER BY found.ordinal;
