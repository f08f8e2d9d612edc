PREPARE runlimit_fixed_window_lock_one_v1 (pg_catalog.text, bigint) AS
SELECT pg_catalog.set_config('statement_timeout', $1, true) AS statement_timeout,
       pg_catalog.set_config('lock_timeout', $1, true) AS lock_timeout,
       pg_catalog.pg_advisory_xact_lock($2) AS locked;
