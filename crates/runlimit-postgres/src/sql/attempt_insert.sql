INSERT INTO public.runlimit_attempts (
    attempt_key, capacity_shard, capacity_slot, consecutive_failures, last_failure_at_ms,
    lease_token, lease_deadline_ms, claim_xid, expires_at_ms
)
VALUES ($1, $2, $3, 0, $4, pg_catalog.uuid_send(pg_catalog.gen_random_uuid()), $5, NULL, $6)
RETURNING lease_token
