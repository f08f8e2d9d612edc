PREPARE runlimit_settings_v1 (pg_catalog.text) AS
SELECT pg_catalog.set_config('statement_timeout', $1, true) AS statement_timeout,
       pg_catalog.set_config('lock_timeout', $1, true) AS lock_timeout,
       pg_catalog.set_config('plan_cache_mode', 'force_generic_plan', true) AS plan_cache_mode,
       pg_catalog.set_config('enable_seqscan', 'off', true) AS enable_seqscan;
