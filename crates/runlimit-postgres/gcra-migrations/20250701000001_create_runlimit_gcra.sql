-- Runlimit GCRA v1 storage: one row per counter key (policy fingerprint || subject key) and a
-- ledger of 256 capacity shards. Published migration: never edit it (SQLx checksums applied
-- versions); add a new one instead.
--
-- The shard of a row is byte 32 of its counter key (the first byte of the HMAC subject key),
-- stored in a generated column. The shard derivation and the ascending-shard locking order are
-- persistent protocol. Each ledger row holds:
--   row_count     the rows of the shard, maintained by statement-level triggers, so writers
--                 that bypass the library are counted too; the CHECK constraint
--                 runlimit_gcra_shards_capacity refuses a 65,537th row (SQLSTATE 23514);
--   watermark_ms  the latest database time (whole ms since the Unix epoch) any committed
--                 admission or cleanup of the shard used; later operations evaluate at
--                 GREATEST(clock, watermark_ms), so a backwards clock step never refills early.
-- The theoretical arrival time (ms x Q, Q the policy's quota) is stored as its exact parts
-- tat_ms = tat / Q and tat_remainder = tat mod Q; expires_at_ms = ceil(tat / Q) is the first
-- millisecond at which the key is fully rested and its row may be deleted. Trigger functions
-- pin search_path.

CREATE TABLE public.runlimit_gcra_shards (
    shard smallint NOT NULL,
    row_count integer NOT NULL,
    watermark_ms bigint NOT NULL,
    CONSTRAINT runlimit_gcra_shards_pkey PRIMARY KEY (shard),
    CONSTRAINT runlimit_gcra_shards_shard_range CHECK (shard >= 0 AND shard <= 255),
    CONSTRAINT runlimit_gcra_shards_capacity CHECK (row_count >= 0 AND row_count <= 65536)
) WITH (fillfactor = 50);

INSERT INTO public.runlimit_gcra_shards (shard, row_count, watermark_ms)
SELECT s.shard::smallint, 0, 0
FROM pg_catalog.generate_series(0, 255) AS s (shard);

CREATE TABLE public.runlimit_gcra (
    counter_key pg_catalog.bytea NOT NULL,
    capacity_shard smallint NOT NULL
        GENERATED ALWAYS AS (pg_catalog.get_byte(counter_key, 32)::smallint) STORED,
    tat_ms bigint NOT NULL,
    tat_remainder bigint NOT NULL,
    expires_at_ms bigint NOT NULL,
    CONSTRAINT runlimit_gcra_pkey PRIMARY KEY (counter_key),
    CONSTRAINT runlimit_gcra_counter_key_length CHECK (pg_catalog.octet_length(counter_key) = 64),
    CONSTRAINT runlimit_gcra_tat_nonnegative CHECK (tat_ms >= 0 AND tat_remainder >= 0),
    CONSTRAINT runlimit_gcra_expiry_order CHECK (expires_at_ms >= tat_ms)
) WITH (fillfactor = 80);

CREATE FUNCTION public.runlimit_gcra_count_inserts() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    shard_index smallint;
    added bigint;
BEGIN
    -- One UPDATE per shard, in ascending shard order, the order the library locks them in.
    FOR shard_index, added IN
        SELECT n.capacity_shard, pg_catalog.count(*)
        FROM inserted_rows AS n
        GROUP BY n.capacity_shard
        ORDER BY n.capacity_shard
    LOOP
        UPDATE public.runlimit_gcra_shards AS l
        SET row_count = (l.row_count + added)::integer
        WHERE l.shard = shard_index;
    END LOOP;
    RETURN NULL;
END
$$;

CREATE FUNCTION public.runlimit_gcra_count_deletes() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    shard_index smallint;
    removed bigint;
BEGIN
    FOR shard_index, removed IN
        SELECT o.capacity_shard, pg_catalog.count(*)
        FROM deleted_rows AS o
        GROUP BY o.capacity_shard
        ORDER BY o.capacity_shard
    LOOP
        UPDATE public.runlimit_gcra_shards AS l
        SET row_count = GREATEST(l.row_count - removed, 0)::integer
        WHERE l.shard = shard_index;
    END LOOP;
    RETURN NULL;
END
$$;

CREATE FUNCTION public.runlimit_gcra_reset_ledger() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    UPDATE public.runlimit_gcra_shards AS l SET row_count = 0 WHERE l.row_count <> 0;
    RETURN NULL;
END
$$;

CREATE FUNCTION public.runlimit_gcra_forbid_key_change() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF NEW.counter_key IS DISTINCT FROM OLD.counter_key THEN
        RAISE EXCEPTION 'runlimit_gcra.counter_key cannot be changed'
            USING ERRCODE = 'check_violation', CONSTRAINT = 'runlimit_gcra_shards_capacity';
    END IF;
    RETURN NEW;
END
$$;

CREATE TRIGGER runlimit_gcra_count_inserts
    AFTER INSERT ON public.runlimit_gcra
    REFERENCING NEW TABLE AS inserted_rows
    FOR EACH STATEMENT EXECUTE FUNCTION public.runlimit_gcra_count_inserts();

CREATE TRIGGER runlimit_gcra_count_deletes
    AFTER DELETE ON public.runlimit_gcra
    REFERENCING OLD TABLE AS deleted_rows
    FOR EACH STATEMENT EXECUTE FUNCTION public.runlimit_gcra_count_deletes();

CREATE TRIGGER runlimit_gcra_reset_ledger
    AFTER TRUNCATE ON public.runlimit_gcra
    FOR EACH STATEMENT EXECUTE FUNCTION public.runlimit_gcra_reset_ledger();

-- Only fires for UPDATEs that name counter_key, so admissions pay nothing for it.
CREATE TRIGGER runlimit_gcra_forbid_key_change
    BEFORE UPDATE OF counter_key ON public.runlimit_gcra
    FOR EACH ROW EXECUTE FUNCTION public.runlimit_gcra_forbid_key_change();
