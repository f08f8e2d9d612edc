PREPARE runlimit_gcra_lock_one_v2 (smallint, pg_catalog.text) AS
SELECT l.shard, l.row_count, l.watermark_ms
FROM public.runlimit_gcra_shards AS l
WHERE l.shard OPERATOR(pg_catalog.=) $1
  AND pg_catalog.set_config('statement_timeout', $2, true) IS NOT NULL
  AND pg_catalog.set_config('lock_timeout', $2, true) IS NOT NULL
  AND pg_catalog.set_config('plan_cache_mode', 'force_generic_plan', true) IS NOT NULL
  AND pg_catalog.set_config('enable_seqscan', 'off', true) IS NOT NULL
FOR UPDATE OF l;
