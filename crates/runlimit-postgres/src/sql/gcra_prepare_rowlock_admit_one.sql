PREPARE runlimit_gcra_rowlock_admit_one_v1 (pg_catalog.bytea, smallint, bigint, bigint, bigint, bigint, bigint) AS
WITH clock AS MATERIALIZED (
    SELECT t.clock_ms, GREATEST(t.clock_ms, l.watermark_ms) AS now_ms, l.row_count
    FROM (
        SELECT pg_catalog.floor(
                   EXTRACT(EPOCH FROM pg_catalog.clock_timestamp()) OPERATOR(pg_catalog.*) 1000
               )::bigint AS clock_ms
    ) AS t
    CROSS JOIN public.runlimit_gcra_ledger AS l
    WHERE l.shard OPERATOR(pg_catalog.=) $2
),
stored AS MATERIALIZED (
    SELECT o.tat_ms, o.tat_remainder
    FROM public.runlimit_gcra AS o
    WHERE o.counter_key OPERATOR(pg_catalog.=) $1
),
updated AS (
    UPDATE public.runlimit_gcra AS g
    SET (tat_ms, tat_remainder, expires_at_ms) = (
        SELECT n.tat_ms, n.tat_remainder,
               n.tat_ms OPERATOR(pg_catalog.+) (CASE WHEN n.tat_remainder OPERATOR(pg_catalog.>) 0 THEN 1 ELSE 0 END)::bigint
        FROM (
            SELECT CASE WHEN a.ahead
                        THEN g.tat_ms OPERATOR(pg_catalog.+) $3 OPERATOR(pg_catalog.+) (CASE WHEN a.carry THEN 1 ELSE 0 END)::bigint
                        ELSE c.now_ms OPERATOR(pg_catalog.+) $3
                   END AS tat_ms,
                   CASE WHEN a.ahead
                        THEN g.tat_remainder OPERATOR(pg_catalog.+) $4 OPERATOR(pg_catalog.-) (CASE WHEN a.carry THEN $5 ELSE 0 END)::bigint
                        ELSE $4
                   END AS tat_remainder
            FROM (
                SELECT (g.tat_ms OPERATOR(pg_catalog.>) c.now_ms
                        OR (g.tat_ms OPERATOR(pg_catalog.=) c.now_ms AND g.tat_remainder OPERATOR(pg_catalog.>) 0)) AS ahead,
                       g.tat_remainder OPERATOR(pg_catalog.>=) ($5 OPERATOR(pg_catalog.-) $4) AS carry
            ) AS a
        ) AS n
    )
    FROM clock AS c
    WHERE g.counter_key OPERATOR(pg_catalog.=) $1
      AND (g.tat_ms OPERATOR(pg_catalog.<) (c.now_ms OPERATOR(pg_catalog.+) $6)
           OR (g.tat_ms OPERATOR(pg_catalog.=) (c.now_ms OPERATOR(pg_catalog.+) $6)
               AND g.tat_remainder OPERATOR(pg_catalog.<=) $7))
    RETURNING g.tat_ms, g.tat_remainder
)
SELECT c.clock_ms, c.now_ms, c.row_count,
       s.tat_ms, s.tat_remainder,
       u.tat_ms AS next_tat_ms, u.tat_remainder AS next_tat_remainder
FROM clock AS c
LEFT JOIN stored AS s ON true
LEFT JOIN updated AS u ON true;
