-- The shard/expiry index bounded cleanup probes: one index range per capacity shard,
-- "capacity_shard = s AND expires_at_ms <= the shard's clamped clock", oldest first.
CREATE INDEX IF NOT EXISTS runlimit_gcra_shard_expiry_idx
    ON public.runlimit_gcra (capacity_shard, expires_at_ms);
