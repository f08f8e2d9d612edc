WITH marked AS (
    UPDATE public.runlimit_gcra_shards AS l
    SET watermark_ms = {now_ms}::bigint
    WHERE l.shard = ANY (ARRAY[{shards}]::smallint[]) AND l.watermark_ms < {now_ms}::bigint
    RETURNING 1
){updated}{inserted}
SELECT (CASE WHEN {verified} THEN '0' ELSE 'runlimit: a locked gcra row was not written' END)::integer AS verified;
