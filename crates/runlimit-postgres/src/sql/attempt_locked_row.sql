SELECT lease_deadline_ms
FROM public.runlimit_attempts
WHERE attempt_key = $1
