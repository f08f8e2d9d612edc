PREPARE runlimit_gcra_write_one_insert_v1 (bigint, smallint, pg_catalog.bytea, bigint, bigint, bigint) AS
WITH marked AS (
    UPDATE public.runlimit_gcra_shards AS l
    SET watermark_ms = $1
    WHERE l.shard OPERATOR(pg_catalog.=) $2 AND l.watermark_ms OPERATOR(pg_catalog.<) $1
    RETURNING 1
),
inserted AS (
    INSERT INTO public.runlimit_gcra (counter_key, tat_ms, tat_remainder, expires_at_ms)
    VALUES ($3, $4, $5, $6)
    RETURNING 1
)
SELECT (CASE
            WHEN (SELECT pg_catalog.count(*) FROM inserted) OPERATOR(pg_catalog.=) 1
            THEN '0'
            ELSE 'runlimit: a locked gcra row was not written'
        END)::integer AS verified;
