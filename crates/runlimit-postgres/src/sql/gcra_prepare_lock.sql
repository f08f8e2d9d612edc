PREPARE runlimit_gcra_lock_v1 (smallint[]) AS
SELECT l.shard, l.row_count, l.watermark_ms
FROM public.runlimit_gcra_shards AS l
WHERE l.shard OPERATOR(pg_catalog.=) ANY ($1)
ORDER BY l.shard
FOR UPDATE OF l;
