\set id random(1,512)
BEGIN ISOLATION LEVEL READ COMMITTED, READ WRITE\; EXECUTE runlimit_fixed_window_lock_one_v1('5000'::pg_catalog.text, :id::bigint)\; EXECUTE runlimit_fixed_window_preflight_one_v1(pg_catalog.decode(pg_catalog.lpad(pg_catalog.to_hex(:id::bigint), 128, '0'), 'hex'), 1::bigint);
COMMIT;
