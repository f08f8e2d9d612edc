UPDATE public.runlimit_attempts
SET consecutive_failures = $2,
    last_failure_at_ms = $3,
    lease_token = pg_catalog.uuid_send(pg_catalog.gen_random_uuid()),
    lease_deadline_ms = $4,
    claim_xid = NULL,
    expires_at_ms = $5
WHERE attempt_key = $1
RETURNING lease_token
