DELETE FROM public.runlimit_attempts
WHERE attempt_key = $1
