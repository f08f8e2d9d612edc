PREPARE runlimit_fixed_window_lock_batch_v1 (pg_catalog.text, bigint[]) AS
SELECT pg_catalog.set_config('statement_timeout', $1, true) AS statement_timeout,
       pg_catalog.set_config('lock_timeout', $1, true) AS lock_timeout,
       pg_catalog.set_config('plan_cache_mode', 'force_generic_plan', true) AS plan_cache_mode,
       pg_catalog.set_config('enable_seqscan', 'off', true) AS enable_seqscan,
       (SELECT pg_catalog.count(pg_catalog.pg_advisory_xact_lock(ordered.lock_id))
        FROM (SELECT given.lock_id
              FROM pg_catalog.unnest($2) WITH ORDINALITY AS given (lock_id, position)
              ORDER BY given.position) AS ordered) AS locked;
