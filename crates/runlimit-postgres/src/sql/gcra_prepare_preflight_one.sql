PREPARE runlimit_gcra_preflight_one_v2 (pg_catalog.bytea, smallint, bigint, bigint, bigint, bigint, bigint) AS
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
next AS (
    SELECT n.old_ms, n.old_remainder, n.tat_ms, n.tat_remainder,
           n.tat_ms OPERATOR(pg_catalog.+) (CASE WHEN n.tat_remainder OPERATOR(pg_catalog.>) 0 THEN 1 ELSE 0 END)::bigint AS expires_at_ms,
           (n.tat_ms OPERATOR(pg_catalog.<) n.ceiling_ms
            OR (n.tat_ms OPERATOR(pg_catalog.=) n.ceiling_ms AND n.tat_remainder OPERATOR(pg_catalog.<=) $7)) AS allowed
    FROM (
        SELECT b.old_ms, b.old_remainder, b.now_ms OPERATOR(pg_catalog.+) $6 AS ceiling_ms,
               b.base_ms OPERATOR(pg_catalog.+) $3 OPERATOR(pg_catalog.+) (CASE WHEN b.carry THEN 1 ELSE 0 END)::bigint AS tat_ms,
               CASE WHEN b.carry THEN b.base_remainder OPERATOR(pg_catalog.-) ($5 OPERATOR(pg_catalog.-) $4)
                    ELSE b.base_remainder OPERATOR(pg_catalog.+) $4
               END AS tat_remainder
        FROM (
            SELECT a.old_ms, a.old_remainder, a.now_ms, a.base_ms, a.base_remainder,
                   a.base_remainder OPERATOR(pg_catalog.>=) ($5 OPERATOR(pg_catalog.-) $4) AS carry
            FROM (
                SELECT o.tat_ms AS old_ms, o.tat_remainder AS old_remainder, c.now_ms,
                       CASE WHEN h.ahead THEN o.tat_ms ELSE c.now_ms END AS base_ms,
                       CASE WHEN h.ahead THEN o.tat_remainder ELSE 0::bigint END AS base_remainder
                FROM clock AS c
                CROSS JOIN public.runlimit_gcra AS o
                CROSS JOIN LATERAL (
                    SELECT o.tat_ms OPERATOR(pg_catalog.>) c.now_ms
                           OR (o.tat_ms OPERATOR(pg_catalog.=) c.now_ms AND o.tat_remainder OPERATOR(pg_catalog.>) 0) AS ahead
                ) AS h
                WHERE o.counter_key OPERATOR(pg_catalog.=) $1
            ) AS a
        ) AS b
    ) AS n
),
updated AS (
    UPDATE public.runlimit_gcra AS g
    SET tat_ms = n.tat_ms, tat_remainder = n.tat_remainder, expires_at_ms = n.expires_at_ms
    FROM next AS n
    WHERE g.counter_key OPERATOR(pg_catalog.=) $1 AND n.allowed
    RETURNING g.tat_ms, g.tat_remainder
)
SELECT c.clock_ms, c.now_ms,
       n.old_ms AS tat_ms, n.old_remainder AS tat_remainder,
       u.tat_ms AS next_tat_ms, u.tat_remainder AS next_tat_remainder
FROM clock AS c
LEFT JOIN next AS n ON true
LEFT JOIN updated AS u ON true;
