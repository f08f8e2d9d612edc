PREPARE runlimit_gcra_write_one_v1 (bigint, smallint, pg_catalog.bytea, bigint, bigint, bigint) AS
WITH marked AS (
    UPDATE public.runlimit_gcra_shards AS l
    SET watermark_ms = $1
    WHERE l.shard OPERATOR(pg_catalog.=) $2 AND l.watermark_ms OPERATOR(pg_catalog.<) $1
    RETURNING 1
),
updated AS (
    UPDATE public.runlimit_gcra AS g
    SET tat_ms = $4, tat_remainder = $5, expires_at_ms = $6
    WHERE g.counter_key OPERATOR(pg_catalog.=) $3
    RETURNING 1
)
SELECT (CASE
            WHEN (SELECT pg_catalog.count(*) FROM updated) OPERATOR(pg_catalog.=) 1
            THEN '0'
            ELSE 'runlimit: a locked gcra row was not written'
        END)::integer AS verified;
