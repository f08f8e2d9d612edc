-- Runlimit GCRA: the row-lock admission protocol (expand step). Published migration: never edit
-- it; add a new one instead.
--
-- Until an operator switches the protocol, nothing changes: every replica keeps the ledger-lock
-- protocol of 20250701000001 on public.runlimit_gcra_shards. The switch
-- (public.runlimit_gcra_switch_to_row_locks(), called once every replica runs a release that
-- knows both protocols) moves the 256 ledger rows to public.runlimit_gcra_ledger, in one
-- transaction under every old ledger row lock. From then on:
--   * a one-check admission of a stored key is one UPDATE of its row, which row-locks it, with no
--     ledger lock; batches, new keys, cleanup and reset lock the new ledger rows (ascending shard
--     order, as before) and read the keys' rows FOR NO KEY UPDATE, so they exclude those UPDATEs;
--   * a replica of an earlier release finds no ledger row to lock and fails closed (its admissions
--     are refused with an error and consume nothing), so it can never decide beside the new
--     protocol without the lock it relies on.
-- The counting triggers count into both ledgers (only one of them has rows at any time), the old
-- one first, so a writer that was waiting on an old ledger row while the switch committed still
-- counts its rows in the new ledger. They run as the invoking role, so every privilege granted on
-- the old ledger is granted on the new one here: a role that could admit before this migration
-- still can after it, and after the switch.

CREATE TABLE public.runlimit_gcra_ledger (
    shard smallint NOT NULL,
    row_count integer NOT NULL,
    watermark_ms bigint NOT NULL,
    CONSTRAINT runlimit_gcra_ledger_pkey PRIMARY KEY (shard),
    CONSTRAINT runlimit_gcra_ledger_shard_range CHECK (shard >= 0 AND shard <= 255),
    CONSTRAINT runlimit_gcra_ledger_capacity CHECK (row_count >= 0 AND row_count <= 65536)
) WITH (fillfactor = 50);

DO $$
DECLARE
    granted record;
BEGIN
    FOR granted IN
        SELECT a.grantee, a.privilege_type
        FROM pg_catalog.pg_class AS c
        CROSS JOIN LATERAL pg_catalog.aclexplode(c.relacl) AS a
        WHERE c.oid = 'public.runlimit_gcra_shards'::pg_catalog.regclass AND a.grantee <> c.relowner
    LOOP
        IF granted.grantee = 0 THEN
            EXECUTE pg_catalog.format('GRANT %s ON public.runlimit_gcra_ledger TO PUBLIC', granted.privilege_type);
        ELSE
            EXECUTE pg_catalog.format(
                'GRANT %s ON public.runlimit_gcra_ledger TO %I',
                granted.privilege_type,
                (SELECT r.rolname FROM pg_catalog.pg_roles AS r WHERE r.oid = granted.grantee)
            );
        END IF;
    END LOOP;
END
$$;

CREATE OR REPLACE FUNCTION public.runlimit_gcra_count_inserts() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    shard_index smallint;
    added bigint;
BEGIN
    FOR shard_index, added IN
        SELECT n.capacity_shard, pg_catalog.count(*)
        FROM inserted_rows AS n
        GROUP BY n.capacity_shard
        ORDER BY n.capacity_shard
    LOOP
        UPDATE public.runlimit_gcra_shards AS l
        SET row_count = (l.row_count + added)::integer
        WHERE l.shard = shard_index;
        UPDATE public.runlimit_gcra_ledger AS l
        SET row_count = (l.row_count + added)::integer
        WHERE l.shard = shard_index;
    END LOOP;
    RETURN NULL;
END
$$;

CREATE OR REPLACE FUNCTION public.runlimit_gcra_count_deletes() RETURNS trigger
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
        UPDATE public.runlimit_gcra_ledger AS l
        SET row_count = GREATEST(l.row_count - removed, 0)::integer
        WHERE l.shard = shard_index;
    END LOOP;
    RETURN NULL;
END
$$;

CREATE OR REPLACE FUNCTION public.runlimit_gcra_reset_ledger() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    UPDATE public.runlimit_gcra_shards AS l SET row_count = 0 WHERE l.row_count <> 0;
    UPDATE public.runlimit_gcra_ledger AS l SET row_count = 0 WHERE l.row_count <> 0;
    RETURN NULL;
END
$$;

-- The switch. Returns true when this call switched, false when the protocol had already been
-- switched (by an earlier call, or by a concurrent one this call waited for). Locks the old
-- ledger rows in ascending shard order (the order every admission, cleanup and reset takes them
-- in), so it waits for the ledger-lock admissions in flight and none starts on a shard while it
-- runs; then copies each shard's row count (kept exact by the triggers) and starts its new
-- watermark at the later of the old one and the switch's own clock sample, taken after the locks.
CREATE FUNCTION public.runlimit_gcra_switch_to_row_locks() RETURNS boolean
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    locked integer;
    clock_ms bigint;
BEGIN
    SELECT pg_catalog.count(*) INTO locked
    FROM (
        SELECT l.shard FROM public.runlimit_gcra_shards AS l ORDER BY l.shard FOR UPDATE
    ) AS rows;
    IF locked = 0 AND (SELECT pg_catalog.count(*) FROM public.runlimit_gcra_ledger) = 256 THEN
        RETURN false;
    END IF;
    IF locked <> 256 THEN
        RAISE EXCEPTION 'runlimit: public.runlimit_gcra_shards holds % ledger rows, not 256', locked
            USING ERRCODE = 'data_exception';
    END IF;
    clock_ms := pg_catalog.floor(EXTRACT(EPOCH FROM pg_catalog.clock_timestamp()) * 1000)::bigint;
    INSERT INTO public.runlimit_gcra_ledger (shard, row_count, watermark_ms)
    SELECT l.shard, l.row_count, GREATEST(l.watermark_ms, clock_ms)
    FROM public.runlimit_gcra_shards AS l
    ORDER BY l.shard;
    DELETE FROM public.runlimit_gcra_shards;
    RETURN true;
END
$$;
