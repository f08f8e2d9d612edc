\set id random(1,512)
BEGIN ISOLATION LEVEL READ COMMITTED, READ WRITE\; SELECT public.runlimit_fixed_window_lock(5000::bigint, ('{' || :id || '}')::bigint[])\; SELECT * FROM public.runlimit_fixed_window_preflight(pg_catalog.lpad(pg_catalog.to_hex(:id::bigint), 128, '0')::pg_catalog.text, '{1}'::bigint[]);
COMMIT;
