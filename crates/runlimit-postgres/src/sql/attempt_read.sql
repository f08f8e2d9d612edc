SELECT consecutive_failures, last_failure_at_ms, lease_token, lease_deadline_ms,
       COALESCE(claim_xid = pg_catalog.pg_current_xact_id_if_assigned(), false) AS same_transaction
FROM public.runlimit_attempts
WHERE attempt_key = $1
FOR UPDATE
