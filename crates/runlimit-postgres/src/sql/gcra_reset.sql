WITH deleted AS (
    DELETE FROM public.runlimit_gcra AS g
    WHERE g.counter_key = {key}
    RETURNING g.expires_at_ms
)
SELECT deleted.expires_at_ms,
       clock.now_ms
FROM (
    SELECT pg_catalog.floor(EXTRACT(EPOCH FROM pg_catalog.clock_timestamp()) * 1000)::bigint AS now_ms
    FROM (SELECT pg_catalog.count(*) FROM deleted) AS after_delete
) AS clock
LEFT JOIN deleted ON true;
