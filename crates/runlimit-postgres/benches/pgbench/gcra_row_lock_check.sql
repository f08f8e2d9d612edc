\set id random(1,512)
\set shard :id % 256
BEGIN ISOLATION LEVEL READ COMMITTED, READ WRITE\; EXECUTE runlimit_settings_v1('5000'::pg_catalog.text)\; EXECUTE runlimit_gcra_rowlock_admit_one_v1(pg_catalog.decode(pg_catalog.lpad(pg_catalog.to_hex(:id::bigint), 64, '0') || pg_catalog.lpad(pg_catalog.to_hex(:shard::bigint), 2, '0') || pg_catalog.repeat('0', 62), 'hex'), :shard::smallint, 1000::bigint, 0::bigint, 1::bigint, 1000000000000::bigint, 0::bigint);
COMMIT;
