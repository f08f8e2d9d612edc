WITH clock AS MATERIALIZED (
    SELECT pg_catalog.floor(EXTRACT(EPOCH FROM pg_catalog.clock_timestamp()) * 1000)::bigint AS now_ms
)
SELECT l.shard, GREATEST(l.watermark_ms, clock.now_ms) AS now_ms
FROM clock
CROSS JOIN public.runlimit_gcra_shards AS l
CROSS JOIN LATERAL (
    SELECT g.expires_at_ms
    FROM public.runlimit_gcra AS g
    WHERE g.capacity_shard = l.shard
      AND g.expires_at_ms <= GREATEST(l.watermark_ms, clock.now_ms)
    ORDER BY g.expires_at_ms
    LIMIT 1
) AS probe
ORDER BY l.shard
FOR UPDATE OF l SKIP LOCKED;
