\set id random(1,512)
INSERT INTO bench_baseline (counter_key, used) VALUES (decode(lpad(to_hex(:id::bigint),128,'0'),'hex'), 1) ON CONFLICT (counter_key) DO UPDATE SET used = bench_baseline.used + 1;
