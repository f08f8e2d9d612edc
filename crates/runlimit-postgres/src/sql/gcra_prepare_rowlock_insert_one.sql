PREPARE runlimit_gcra_rowlock_insert_one_v1 (bigint, smallint, pg_catalog.bytea, bigint, bigint, bigint, integer) AS
WITH ledger AS MATERIALIZED (
    SELECT l.row_count, l.watermark_ms
    FROM public.runlimit_gcra_ledger AS l
    WHERE l.shard OPERATOR(pg_catalog.=) $2
    FOR UPDATE OF l
),
inserted AS (
    INSERT INTO public.runlimit_gcra (counter_key, tat_ms, tat_remainder, expires_at_ms)
    SELECT $3, $4, $5, $6
    FROM ledger
    WHERE ledger.watermark_ms OPERATOR(pg_catalog.<=) $1 AND ledger.row_count OPERATOR(pg_catalog.<) $7
    ON CONFLICT (counter_key) DO NOTHING
    RETURNING 1
)
SELECT (CASE
            WHEN (SELECT pg_catalog.count(*) FROM inserted) OPERATOR(pg_catalog.=) 1
            THEN '0'
            ELSE 'runlimit: a new gcra row was not inserted'
        END)::integer AS verified;
