PREPARE runlimit_gcra_lock_one_v1 (smallint) AS
SELECT l.shard, l.row_count, l.watermark_ms
FROM public.runlimit_gcra_shards AS l
WHERE l.shard OPERATOR(pg_catalog.=) $1
FOR UPDATE OF l;
