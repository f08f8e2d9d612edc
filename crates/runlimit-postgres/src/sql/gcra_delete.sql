WITH locked (shard, now_ms) AS MATERIALIZED (
    VALUES {locked}
),
candidates AS MATERIALIZED (
    SELECT probe.counter_key, probe.expires_at_ms, locked.shard, locked.now_ms
    FROM locked
    CROSS JOIN LATERAL (
        SELECT g.counter_key, g.expires_at_ms
        FROM public.runlimit_gcra AS g
        WHERE g.capacity_shard = locked.shard
          AND g.expires_at_ms <= locked.now_ms
        ORDER BY g.expires_at_ms
        LIMIT {maximum_rows}
    ) AS probe
    ORDER BY probe.expires_at_ms, locked.shard
    LIMIT {maximum_rows}
),
marked AS (
    UPDATE public.runlimit_gcra_shards AS l
    SET watermark_ms = locked.now_ms
    FROM locked
    WHERE l.shard = locked.shard AND l.watermark_ms < locked.now_ms
    RETURNING 1
),
deleted AS (
    DELETE FROM public.runlimit_gcra AS g
    USING candidates
    WHERE g.counter_key = candidates.counter_key
      AND g.expires_at_ms <= candidates.now_ms
    RETURNING 1
)
SELECT pg_catalog.count(*) AS removed FROM deleted;
