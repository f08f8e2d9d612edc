-- Runlimit attempt limiting (AttemptPolicy): one row per subject with failure state or a lease.
-- 256 capacity shards; each row owns one slot 0..65535 of its shard, unique per shard.
CREATE TABLE public.runlimit_attempt_shards (
    capacity_shard smallint PRIMARY KEY
        CONSTRAINT runlimit_attempt_shards_range CHECK (capacity_shard BETWEEN 0 AND 255)
);

INSERT INTO public.runlimit_attempt_shards (capacity_shard)
SELECT shard FROM pg_catalog.generate_series(0, 255) AS shard;

CREATE TABLE public.runlimit_attempts (
    attempt_key bytea PRIMARY KEY
        CONSTRAINT runlimit_attempts_key_length CHECK (pg_catalog.octet_length(attempt_key) = 64),
    capacity_shard smallint NOT NULL
        CONSTRAINT runlimit_attempts_shard_range CHECK (capacity_shard BETWEEN 0 AND 255),
    capacity_slot integer NOT NULL
        CONSTRAINT runlimit_attempts_slot_range CHECK (capacity_slot BETWEEN 0 AND 65535),
    consecutive_failures bigint NOT NULL
        CONSTRAINT runlimit_attempts_failures_range CHECK (consecutive_failures BETWEEN 0 AND 4294967295),
    last_failure_at_ms bigint NOT NULL,
    lease_token bytea,
    lease_deadline_ms bigint,
    claim_xid xid8,
    expires_at_ms bigint NOT NULL,
    CONSTRAINT runlimit_attempts_lease_shape CHECK ((lease_token IS NULL) = (lease_deadline_ms IS NULL)),
    CONSTRAINT runlimit_attempts_capacity_slot_key UNIQUE (capacity_shard, capacity_slot)
);

CREATE INDEX runlimit_attempts_shard_expiry_idx ON public.runlimit_attempts (capacity_shard, expires_at_ms);
