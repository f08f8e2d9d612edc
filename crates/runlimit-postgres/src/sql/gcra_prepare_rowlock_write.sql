PREPARE runlimit_gcra_rowlock_write_v1 (
    bigint, smallint[], pg_catalog.bytea[], bigint[], bigint[], bigint[], bigint[], bigint[]
) AS
WITH marked AS (
    UPDATE public.runlimit_gcra_ledger AS l
    SET watermark_ms = $1
    WHERE l.shard OPERATOR(pg_catalog.=) ANY ($2) AND l.watermark_ms OPERATOR(pg_catalog.<) $1
    RETURNING 1
),
updated AS (
    UPDATE public.runlimit_gcra AS g
    SET tat_ms = $4[pg_catalog.array_position($3, g.counter_key)],
        tat_remainder = $5[pg_catalog.array_position($3, g.counter_key)],
        expires_at_ms = $6[pg_catalog.array_position($3, g.counter_key)]
    WHERE g.counter_key OPERATOR(pg_catalog.=) ANY ($3)
      AND g.tat_ms OPERATOR(pg_catalog.=) $7[pg_catalog.array_position($3, g.counter_key)]
      AND g.tat_remainder OPERATOR(pg_catalog.=) $8[pg_catalog.array_position($3, g.counter_key)]
    RETURNING 1
)
SELECT (CASE
            WHEN (SELECT pg_catalog.count(*) FROM updated) OPERATOR(pg_catalog.=) pg_catalog.cardinality($3)
            THEN '0'
            ELSE 'runlimit: a gcra row changed since it was read'
        END)::integer AS verified;
