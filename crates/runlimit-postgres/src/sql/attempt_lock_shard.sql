SELECT capacity_shard
FROM public.runlimit_attempt_shards
WHERE capacity_shard = $1
FOR UPDATE
