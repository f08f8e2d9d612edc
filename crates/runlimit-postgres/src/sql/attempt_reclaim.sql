DELETE FROM public.runlimit_attempts
WHERE attempt_key IN (
    SELECT attempt_key
    FROM public.runlimit_attempts
    WHERE capacity_shard = $1 AND expires_at_ms <= $2 AND expires_at_ms < 9223372036854775807
    ORDER BY expires_at_ms
    LIMIT $3
    FOR UPDATE SKIP LOCKED
)
