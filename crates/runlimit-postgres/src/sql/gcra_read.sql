WITH found AS MATERIALIZED (
    SELECT input.ordinal, g.tat_ms, g.tat_remainder
    FROM (VALUES {keys}) AS input (ordinal, counter_key)
    JOIN public.runlimit_gcra AS g ON g.counter_key = input.counter_key
)
SELECT found.ordinal::bigint AS ordinal,
       found.tat_ms,
       found.tat_remainder,
       clock.now_ms
FROM (
    SELECT pg_catalog.floor(EXTRACT(EPOCH FROM pg_catalog.clock_timestamp()) * 1000)::bigint AS now_ms
) AS clock
LEFT JOIN found ON true
ORDER BY found.ordinal;
