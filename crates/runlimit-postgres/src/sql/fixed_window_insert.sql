WITH inserted AS (
    INSERT INTO public.runlimit_fixed_windows (counter_key, used, window_started_at, window_expires_at)
    SELECT input.counter_key, input.cost, clock.sampled_at, clock.sampled_at + input.window_ms * INTERVAL '1 millisecond'
    FROM (VALUES {inserts}) AS input (counter_key, cost, window_ms),
         (SELECT pg_catalog.to_timestamp(0) + {now_us}::bigint * INTERVAL '1 microsecond' AS sampled_at) AS clock
    ORDER BY input.counter_key
    RETURNING 1
)
SELECT (CASE WHEN pg_catalog.count(*) = {expected} THEN '0' ELSE 'runlimit: a new counter row was not inserted' END)::integer AS verified
FROM inserted;
