\set id random(1,512)
BEGIN\; UPDATE bench_baseline SET used = used + 1 WHERE counter_key = decode(lpad(to_hex(:id::bigint),128,'0'),'hex');
COMMIT;
