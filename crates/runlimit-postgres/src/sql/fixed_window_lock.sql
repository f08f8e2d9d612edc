SELECT pg_catalog.set_config('statement_timeout', '{timeout_ms}', true),
       pg_catalog.set_config('lock_timeout', '{timeout_ms}', true),
       pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', true),
       {locks};
