WITH updated AS (
    UPDATE public.runlimit_fixed_windows AS w
    SET used = CASE WHEN input.renew THEN input.cost ELSE w.used + input.cost END,
        window_started_at = CASE WHEN input.renew THEN clock.sampled_at ELSE w.window_started_at END,
        window_expires_at = CASE
            WHEN input.renew THEN clock.sampled_at + input.window_ms * INTERVAL '1 millisecond'
            ELSE w.window_expires_at
        END
    FROM (VALUES {updates}) AS input (counter_key, renew, cost, window_ms),
         (SELECT pg_catalog.to_timestamp(0) + {now_us}::bigint * INTERVAL '1 microsecond' AS sampled_at) AS clock
    WHERE w.counter_key = input.counter_key
    RETURNING 1
)
SELECT (CASE WHEN pg_catalog.count(*) = {expected} THEN '0' ELSE 'runlimit: a locked counter row was not updated' END)::integer AS verified
FROM updated;
