SELECT w.used,
       (EXTRACT(EPOCH FROM w.window_expires_at) * 1000000)::bigint AS expires_us,
       clock.now_us
FROM (SELECT (EXTRACT(EPOCH FROM pg_catalog.clock_timestamp()) * 1000000)::bigint AS now_us) AS clock
LEFT JOIN public.runlimit_fixed_windows AS w ON w.counter_key = {key};
