UPDATE public.runlimit_attempts
SET consecutive_failures = 0,
    last_failure_at_ms = $2,
    expires_at_ms = $3
WHERE attempt_key = $1
