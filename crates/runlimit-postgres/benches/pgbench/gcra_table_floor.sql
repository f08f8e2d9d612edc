\set id random(1,512)
\set shard :id % 256
BEGIN ISOLATION LEVEL READ COMMITTED, READ WRITE\; UPDATE public.runlimit_gcra SET tat_ms = tat_ms + 1, expires_at_ms = expires_at_ms + 1 WHERE counter_key = pg_catalog.decode(pg_catalog.lpad(pg_catalog.to_hex(:id::bigint), 64, '0') || pg_catalog.lpad(pg_catalog.to_hex(:shard::bigint), 2, '0') || pg_catalog.repeat('0', 62), 'hex') RETURNING tat_ms;
COMMIT;
