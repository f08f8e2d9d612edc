PREPARE runlimit_gcra_read_one_v1 (pg_catalog.bytea) AS
SELECT (CASE WHEN g.counter_key IS NOT NULL THEN 1 END)::bigint AS ordinal,
       g.tat_ms,
       g.tat_remainder,
       clock.now_ms
FROM (
    SELECT pg_catalog.floor(
               EXTRACT(EPOCH FROM pg_catalog.clock_timestamp()) OPERATOR(pg_catalog.*) 1000
           )::bigint AS now_ms
) AS clock
LEFT JOIN public.runlimit_gcra AS g ON g.counter_key OPERATOR(pg_catalog.=) $1;
