UPDATE public.runlimit_attempts
SET lease_token = pg_catalog.uuid_send(pg_catalog.gen_random_uuid()),
    claim_xid = pg_catalog.pg_current_xact_id()
WHERE attempt_key = $1
RETURNING lease_token
