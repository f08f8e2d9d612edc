-- Hard-bound fixed-window cardinality: 256 capacity shards of at most 65,536 rows each.
--
-- The shard of a row is byte 32 of its counter key (the first byte of the HMAC subject key),
-- stored in a generated column. A ledger row per shard counts the rows of that shard. It is
-- maintained by statement-level triggers with transition tables, so writers that bypass the
-- library (older replicas during a rolling deploy, manual INSERTs) are bounded too: a statement
-- that would take a shard past 65,536 rows fails with SQLSTATE 23514 naming the constraint
-- runlimit_fixed_window_shards_capacity. Trigger functions pin search_path.

LOCK TABLE public.runlimit_fixed_windows IN ACCESS EXCLUSIVE MODE;

ALTER TABLE public.runlimit_fixed_windows
    ADD COLUMN capacity_shard smallint NOT NULL
        GENERATED ALWAYS AS (pg_catalog.get_byte(counter_key, 32)::smallint) STORED;

CREATE TABLE public.runlimit_fixed_window_shards (
    shard smallint NOT NULL,
    row_count integer NOT NULL,
    CONSTRAINT runlimit_fixed_window_shards_pkey PRIMARY KEY (shard),
    CONSTRAINT runlimit_fixed_window_shards_shard_range CHECK (shard >= 0 AND shard <= 255),
    CONSTRAINT runlimit_fixed_window_shards_row_count_nonnegative CHECK (row_count >= 0)
) WITH (fillfactor = 50);

INSERT INTO public.runlimit_fixed_window_shards (shard, row_count)
SELECT s.shard::smallint, pg_catalog.count(w.counter_key)::integer
FROM pg_catalog.generate_series(0, 255) AS s (shard)
LEFT JOIN public.runlimit_fixed_windows AS w ON w.capacity_shard = s.shard
GROUP BY s.shard;

CREATE FUNCTION public.runlimit_fixed_windows_count_inserts() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    shard_index smallint;
    added bigint;
    total bigint;
BEGIN
    -- One UPDATE per shard, in ascending shard order, so concurrent writers lock ledger rows in
    -- the same order as the library does.
    FOR shard_index, added IN
        SELECT n.capacity_shard, pg_catalog.count(*)
        FROM inserted_rows AS n
        GROUP BY n.capacity_shard
        ORDER BY n.capacity_shard
    LOOP
        UPDATE public.runlimit_fixed_window_shards AS l
        SET row_count = (l.row_count + added)::integer
        WHERE l.shard = shard_index
        RETURNING l.row_count INTO total;
        IF total IS NULL THEN
            RAISE EXCEPTION 'runlimit_fixed_windows capacity shard % has no ledger row', shard_index
                USING ERRCODE = 'check_violation', CONSTRAINT = 'runlimit_fixed_window_shards_capacity';
        END IF;
        IF total > 65536 THEN
            RAISE EXCEPTION 'runlimit_fixed_windows capacity shard % is full', shard_index
                USING ERRCODE = 'check_violation',
                      CONSTRAINT = 'runlimit_fixed_window_shards_capacity',
                      DETAIL = 'A capacity shard holds at most 65536 rows.',
                      HINT = 'Delete expired rows, for example with PostgresLimiter::cleanup_expired.';
        END IF;
    END LOOP;
    RETURN NULL;
END
$$;

CREATE FUNCTION public.runlimit_fixed_windows_count_deletes() RETURNS trigger
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
        UPDATE public.runlimit_fixed_window_shards AS l
        SET row_count = GREATEST(l.row_count - removed, 0)::integer
        WHERE l.shard = shard_index;
    END LOOP;
    RETURN NULL;
END
$$;

CREATE FUNCTION public.runlimit_fixed_windows_reset_ledger() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    UPDATE public.runlimit_fixed_window_shards AS l SET row_count = 0 WHERE l.row_count <> 0;
    RETURN NULL;
END
$$;

CREATE FUNCTION public.runlimit_fixed_windows_forbid_key_change() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF NEW.counter_key IS DISTINCT FROM OLD.counter_key THEN
        RAISE EXCEPTION 'runlimit_fixed_windows.counter_key cannot be changed'
            USING ERRCODE = 'check_violation', CONSTRAINT = 'runlimit_fixed_window_shards_capacity';
    END IF;
    RETURN NEW;
END
$$;

CREATE TRIGGER runlimit_fixed_windows_count_inserts
    AFTER INSERT ON public.runlimit_fixed_windows
    REFERENCING NEW TABLE AS inserted_rows
    FOR EACH STATEMENT EXECUTE FUNCTION public.runlimit_fixed_windows_count_inserts();

CREATE TRIGGER runlimit_fixed_windows_count_deletes
    AFTER DELETE ON public.runlimit_fixed_windows
    REFERENCING OLD TABLE AS deleted_rows
    FOR EACH STATEMENT EXECUTE FUNCTION public.runlimit_fixed_windows_count_deletes();

CREATE TRIGGER runlimit_fixed_windows_reset_ledger
    AFTER TRUNCATE ON public.runlimit_fixed_windows
    FOR EACH STATEMENT EXECUTE FUNCTION public.runlimit_fixed_windows_reset_ledger();

-- Only fires for UPDATEs that name counter_key, so counter increments pay nothing for it.
CREATE TRIGGER runlimit_fixed_windows_forbid_key_change
    BEFORE UPDATE OF counter_key ON public.runlimit_fixed_windows
    FOR EACH ROW EXECUTE FUNCTION public.runlimit_fixed_windows_forbid_key_change();
