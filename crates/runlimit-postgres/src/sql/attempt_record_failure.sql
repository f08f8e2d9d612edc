UPDATE public.runlimit_attempts
SET consecutive_failures = $2,
    last_failure_at_ms = $3,
    lease_token = NULL,
    lease_deadline_ms = NULL,
    claim_xid = NULL,
    expires_at_ms = $4
WHERE attempt_key = $1
