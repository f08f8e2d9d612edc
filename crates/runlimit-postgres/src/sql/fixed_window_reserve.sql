WITH locked AS MATERIALIZED (
    SELECT l.shard, l.row_count
    FROM public.runlimit_fixed_window_shards AS l
    WHERE l.shard = ANY (ARRAY[{shards}]::smallint[])
    ORDER BY l.shard
    FOR UPDATE
)
SELECT locked.shard, locked.row_count, clock.now_us
FROM (
    SELECT (EXTRACT(EPOCH FROM pg_catalog.clock_timestamp()) * 1000000)::bigint AS now_us
    FROM (SELECT pg_catalog.count(*) FROM locked) AS after_ledger_locks
) AS clock
LEFT JOIN locked ON true
ORDER BY locked.shard;
