WITH candidates AS MATERIALIZED (
    SELECT w.counter_key, w.capacity_shard
    FROM public.runlimit_fixed_windows AS w
    WHERE w.window_expires_at <= (SELECT pg_catalog.date_trunc('milliseconds', pg_catalog.clock_timestamp()))
    ORDER BY w.window_expires_at
    LIMIT {maximum_rows}
    FOR UPDATE OF w SKIP LOCKED
),
ledger AS MATERIALIZED (
    SELECT l.shard
    FROM public.runlimit_fixed_window_shards AS l
    WHERE l.shard IN (SELECT candidates.capacity_shard FROM candidates)
    ORDER BY l.shard
    FOR UPDATE
),
deleted AS (
    DELETE FROM public.runlimit_fixed_windows AS w
    WHERE w.counter_key = ANY (ARRAY(SELECT candidates.counter_key FROM candidates))
      AND (SELECT pg_catalog.count(*) FROM ledger) >= 0
    RETURNING 1
)
SELECT pg_catalog.count(*) AS removed FROM deleted;
