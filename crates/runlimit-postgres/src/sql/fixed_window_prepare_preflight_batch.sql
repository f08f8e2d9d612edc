PREPARE runlimit_fixed_window_preflight_batch_v1 (pg_catalog.bytea[], bigint[]) AS
UPDATE public.runlimit_fixed_windows AS w
SET used = w.used OPERATOR(pg_catalog.+) $2[pg_catalog.array_position($1, w.counter_key)]
WHERE w.counter_key OPERATOR(pg_catalog.=) ANY ($1)
  AND w.used OPERATOR(pg_catalog.<=)
      (9223372036854775807 OPERATOR(pg_catalog.-) $2[pg_catalog.array_position($1, w.counter_key)])
RETURNING pg_catalog.array_position($1, w.counter_key)::bigint AS ordinal,
          w.used OPERATOR(pg_catalog.-) $2[pg_catalog.array_position($1, w.counter_key)] AS used,
          (EXTRACT(EPOCH FROM w.window_expires_at) OPERATOR(pg_catalog.*) 1000000)::bigint AS expires_us,
          (EXTRACT(EPOCH FROM pg_catalog.clock_timestamp()) OPERATOR(pg_catalog.*) 1000000)::bigint AS now_us;
