PREPARE runlimit_gcra_rowlock_read_one_v1 (pg_catalog.bytea) AS
WITH found AS MATERIALIZED (
    SELECT g.tat_ms, g.tat_remainder
    FROM public.runlimit_gcra AS g
    WHERE g.counter_key OPERATOR(pg_catalog.=) $1
    FOR NO KEY UPDATE OF g
),
clock AS MATERIALIZED (
    SELECT pg_catalog.floor(
               EXTRACT(EPOCH FROM pg_catalog.clock_timestamp()) OPERATOR(pg_catalog.*) 1000
           )::bigint AS now_ms
    FROM (SELECT pg_catalog.count(*) FROM found) AS after_locks
)
SELECT (CASE WHEN found.tat_ms IS NOT NULL THEN 1 END)::bigint AS ordinal,
       found.tat_ms,
       found.tat_remainder,
       clock.now_ms
FROM clock
LEFT JOIN found ON true;
