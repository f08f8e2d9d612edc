PREPARE runlimit_gcra_preflight_one_v2 (pg_catalog.bytea, smallint, bigint, bigint, bigint) AS
WITH clock AS (
    SELECT t.clock_ms, GREATEST(t.clock_ms, l.watermark_ms) AS now_ms
    FROM (
        SELECT pg_catalog.floor(
                   EXTRACT(EPOCH FROM pg_catalog.clock_timestamp()) OPERATOR(pg_catalog.*) 1000
               )::bigint AS clock_ms
    ) AS t
    CROSS JOIN public.runlimit_gcra_shards AS l
    WHERE l.shard OPERATOR(pg_catalog.=) $2
),
updated AS (
    UPDATE public.runlimit_gcra AS g
    SET tat_ms = ((CASE WHEN (g.tat_ms OPERATOR(pg_catalog.>) c.now_ms OR (g.tat_ms OPERATOR(pg_catalog.=) c.now_ms AND g.tat_remainder OPERATOR(pg_catalog.>) 0)) THEN g.tat_ms ELSE c.now_ms END) OPERATOR(pg_catalog.+) $3 OPERATOR(pg_catalog.+) (CASE WHEN ((CASE WHEN (g.tat_ms OPERATOR(pg_catalog.>) c.now_ms OR (g.tat_ms OPERATOR(pg_catalog.=) c.now_ms AND g.tat_remainder OPERATOR(pg_catalog.>) 0)) THEN g.tat_remainder ELSE 0::bigint END) OPERATOR(pg_catalog.>=) ($5 OPERATOR(pg_catalog.-) $4)) THEN 1 ELSE 0 END)::bigint),
        tat_remainder = (CASE WHEN ((CASE WHEN (g.tat_ms OPERATOR(pg_catalog.>) c.now_ms OR (g.tat_ms OPERATOR(pg_catalog.=) c.now_ms AND g.tat_remainder OPERATOR(pg_catalog.>) 0)) THEN g.tat_remainder ELSE 0::bigint END) OPERATOR(pg_catalog.>=) ($5 OPERATOR(pg_catalog.-) $4)) THEN (CASE WHEN (g.tat_ms OPERATOR(pg_catalog.>) c.now_ms OR (g.tat_ms OPERATOR(pg_catalog.=) c.now_ms AND g.tat_remainder OPERATOR(pg_catalog.>) 0)) THEN g.tat_remainder ELSE 0::bigint END) OPERATOR(pg_catalog.-) ($5 OPERATOR(pg_catalog.-) $4) ELSE (CASE WHEN (g.tat_ms OPERATOR(pg_catalog.>) c.now_ms OR (g.tat_ms OPERATOR(pg_catalog.=) c.now_ms AND g.tat_remainder OPERATOR(pg_catalog.>) 0)) THEN g.tat_remainder ELSE 0::bigint END) OPERATOR(pg_catalog.+) $4 END),
        expires_at_ms = (((CASE WHEN (g.tat_ms OPERATOR(pg_catalog.>) c.now_ms OR (g.tat_ms OPERATOR(pg_catalog.=) c.now_ms AND g.tat_remainder OPERATOR(pg_catalog.>) 0)) THEN g.tat_ms ELSE c.now_ms END) OPERATOR(pg_catalog.+) $3 OPERATOR(pg_catalog.+) (CASE WHEN ((CASE WHEN (g.tat_ms OPERATOR(pg_catalog.>) c.now_ms OR (g.tat_ms OPERATOR(pg_catalog.=) c.now_ms AND g.tat_remainder OPERATOR(pg_catalog.>) 0)) THEN g.tat_remainder ELSE 0::bigint END) OPERATOR(pg_catalog.>=) ($5 OPERATOR(pg_catalog.-) $4)) THEN 1 ELSE 0 END)::bigint) OPERATOR(pg_catalog.+) (CASE WHEN (CASE WHEN ((CASE WHEN (g.tat_ms OPERATOR(pg_catalog.>) c.now_ms OR (g.tat_ms OPERATOR(pg_catalog.=) c.now_ms AND g.tat_remainder OPERATOR(pg_catalog.>) 0)) THEN g.tat_remainder ELSE 0::bigint END) OPERATOR(pg_catalog.>=) ($5 OPERATOR(pg_catalog.-) $4)) THEN (CASE WHEN (g.tat_ms OPERATOR(pg_catalog.>) c.now_ms OR (g.tat_ms OPERATOR(pg_catalog.=) c.now_ms AND g.tat_remainder OPERATOR(pg_catalog.>) 0)) THEN g.tat_remainder ELSE 0::bigint END) OPERATOR(pg_catalog.-) ($5 OPERATOR(pg_catalog.-) $4) ELSE (CASE WHEN (g.tat_ms OPERATOR(pg_catalog.>) c.now_ms OR (g.tat_ms OPERATOR(pg_catalog.=) c.now_ms AND g.tat_remainder OPERATOR(pg_catalog.>) 0)) THEN g.tat_remainder ELSE 0::bigint END) OPERATOR(pg_catalog.+) $4 END) OPERATOR(pg_catalog.>) 0 THEN 1 ELSE 0 END)::bigint)
    FROM clock AS c
    WHERE g.counter_key OPERATOR(pg_catalog.=) $1
    RETURNING g.tat_ms, g.tat_remainder
)
SELECT c.clock_ms, c.now_ms, u.tat_ms AS next_tat_ms, u.tat_remainder AS next_tat_remainder
FROM clock AS c
LEFT JOIN updated AS u ON true;
