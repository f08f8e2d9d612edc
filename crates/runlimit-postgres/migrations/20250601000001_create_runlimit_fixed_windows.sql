-- Runlimit fixed-window counters: one row per counter key (policy fingerprint || subject key).
-- Published migration: never edit it (SQLx checksums applied versions); add a new one instead.
CREATE TABLE IF NOT EXISTS public.runlimit_fixed_windows (
    counter_key pg_catalog.bytea NOT NULL,
    used bigint NOT NULL,
    window_started_at timestamp with time zone NOT NULL,
    window_expires_at timestamp with time zone NOT NULL,
    CONSTRAINT runlimit_fixed_windows_pkey PRIMARY KEY (counter_key),
    CONSTRAINT runlimit_fixed_windows_counter_key_length CHECK (pg_catalog.octet_length(counter_key) = 64),
    CONSTRAINT runlimit_fixed_windows_used_positive CHECK (used >= 1),
    CONSTRAINT runlimit_fixed_windows_window_order CHECK (window_expires_at > window_started_at)
);

CREATE INDEX IF NOT EXISTS runlimit_fixed_windows_expires_at_idx
    ON public.runlimit_fixed_windows (window_expires_at);
