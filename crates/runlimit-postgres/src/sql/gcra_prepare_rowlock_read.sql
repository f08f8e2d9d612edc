PREPARE runlimit_gcra_rowlock_read_v1 (pg_catalog.bytea[]) AS
WITH found AS MATERIALIZED (
    SELECT pg_catalog.array_position($1, g.counter_key)::bigint AS ordinal, g.tat_ms, g.tat_remainder
    FROM public.runlimit_gcra AS g
    WHERE g.counter_key OPERATOR(pg_catalog.=) ANY ($1)
    ORDER BY g.counter_key
    FOR NO KEY UPDATE OF g
),
clock AS MATERIALIZED (
    SELECT pg_catalog.floor(
               EXTRACT(EPOCH FROM pg_catalog.clock_timestamp()) OPERATOR(pg_catalog.*) 1000
           )::bigint AS now_ms
    FROM (SELECT pg_catalog.count(*) FROM found) AS after_locks
)
SELECT found.ordinal, found.tat_ms, found.tat_remainder, clock.now_ms
FROM clock
LEFT JOIN found ON true
ORDER BY found.ordinal;
