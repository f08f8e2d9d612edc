SELECT g.tat_ms,
       g.tat_remainder,
       l.watermark_ms,
       clock.now_ms
FROM (
    SELECT pg_catalog.floor(EXTRACT(EPOCH FROM pg_catalog.clock_timestamp()) * 1000)::bigint AS now_ms
) AS clock
LEFT JOIN public.runlimit_gcra AS g ON g.counter_key = {key}
LEFT JOIN public.runlimit_gcra_shards AS l ON l.shard = {shard};
