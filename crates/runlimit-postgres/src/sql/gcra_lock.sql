SELECT l.shard, l.row_count, l.watermark_ms
FROM public.runlimit_gcra_shards AS l
WHERE l.shard = ANY (ARRAY[{shards}]::smallint[])
ORDER BY l.shard
FOR UPDATE OF l;
