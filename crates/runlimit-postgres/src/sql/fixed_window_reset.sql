WITH deleted AS (
    DELETE FROM public.runlimit_fixed_windows AS w
    WHERE w.counter_key = {key}
    RETURNING (EXTRACT(EPOCH FROM w.window_expires_at) * 1000000)::bigint AS expires_us
)
SELECT deleted.expires_us,
       clock.now_us
FROM (
    SELECT (EXTRACT(EPOCH FROM pg_catalog.clock_timestamp()) * 1000000)::bigint AS now_us
    FROM (SELECT pg_catalog.count(*) FROM deleted) AS after_delete
) AS clock
LEFT JOIN deleted ON true;
