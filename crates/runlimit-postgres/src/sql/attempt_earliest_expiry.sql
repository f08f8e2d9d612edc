SELECT pg_catalog.min(expires_at_ms) AS earliest
FROM public.runlimit_attempts
WHERE capacity_shard = $1
