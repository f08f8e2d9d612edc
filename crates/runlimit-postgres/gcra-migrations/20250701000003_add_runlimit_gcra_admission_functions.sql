-- Runlimit GCRA admission functions. Published migration: never edit it (SQLx checksums
-- applied versions); add a new one instead.
--
-- PL/pgSQL keeps the plans of the statements inside a function for the whole session, so an
-- admission that calls these functions parses and plans the table statements once per
-- connection instead of once per admission; what remains per admission is the small call
-- statement. The functions take the same locks in the same order as the statements earlier
-- releases send (the ledger rows of the touched shards FOR UPDATE, ascending), write the same
-- rows and sample the same clock, so replicas of both releases can share the tables during a
-- rolling deploy.
--
-- Each function is SECURITY INVOKER (it runs with the caller's privileges), pins
-- search_path = pg_catalog, pg_temp and names every object schema-qualified. Counter keys are
-- passed as the lowercase hexadecimal text of their bytes, 64 bytes per key, concatenated.
-- A malformed argument raises SQLSTATE 22023 (invalid_parameter_value); a write that does
-- not touch exactly the planned rows raises SQLSTATE P0004 (assert_failure) before the caller
-- can commit.

-- Called after the transaction-local statement_timeout and lock_timeout are set, in a statement
-- of their own (PostgreSQL arms statement_timeout when a statement starts, so it then bounds
-- this call as a whole). Locks the ledger rows of the shards, FOR UPDATE in the given
-- (ascending) order; then, in a statement of its
-- own (so its READ COMMITTED snapshot is taken after those locks and sees what their previous
-- holders committed), the stored arrival times of the keys; then the clock sample in whole
-- milliseconds since the Unix epoch, floor(extract(epoch from clock_timestamp()) * 1000).
-- row_counts[i] and watermarks_ms[i] belong to shards[i] (null when the shard has no ledger
-- row); tat_ms[j] and tat_remainder[j] belong to key j (null when it has no row).
CREATE FUNCTION public.runlimit_gcra_lock_read(
    shards smallint[],
    counter_keys text,
    OUT row_counts integer[],
    OUT watermarks_ms bigint[],
    OUT tat_ms bigint[],
    OUT tat_remainder bigint[],
    OUT now_ms bigint
)
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    shard_index smallint;
    found_count integer;
    found_watermark bigint;
    keys bytea;
    key bytea;
    found_ms bigint;
    found_remainder bigint;
BEGIN
    IF shards IS NULL OR counter_keys IS NULL OR pg_catalog.length(counter_keys) = 0
        OR pg_catalog.length(counter_keys) % 128 <> 0 THEN
        RAISE EXCEPTION 'runlimit: invalid gcra lock arguments' USING ERRCODE = '22023';
    END IF;
    keys := pg_catalog.decode(counter_keys, 'hex');
    IF pg_catalog.length(keys) * 2 <> pg_catalog.length(counter_keys) THEN
        RAISE EXCEPTION 'runlimit: invalid gcra lock arguments' USING ERRCODE = '22023';
    END IF;
    row_counts := '{}';
    watermarks_ms := '{}';
    FOREACH shard_index IN ARRAY shards LOOP
        SELECT l.row_count, l.watermark_ms INTO found_count, found_watermark
        FROM public.runlimit_gcra_shards AS l
        WHERE l.shard = shard_index
        FOR UPDATE OF l;
        row_counts := row_counts || found_count;
        watermarks_ms := watermarks_ms || found_watermark;
    END LOOP;
    tat_ms := '{}';
    tat_remainder := '{}';
    FOR position IN 0 .. pg_catalog.length(keys) / 64 - 1 LOOP
        key := pg_catalog.substring(keys, position * 64 + 1, 64);
        SELECT g.tat_ms, g.tat_remainder INTO found_ms, found_remainder
        FROM public.runlimit_gcra AS g
        WHERE g.counter_key = key;
        tat_ms := tat_ms || found_ms;
        tat_remainder := tat_remainder || found_remainder;
    END LOOP;
    now_ms := pg_catalog.floor(EXTRACT(EPOCH FROM pg_catalog.clock_timestamp()) * 1000)::bigint;
END
$$;

-- Writes an allowed batch decided at now_ms: advances the watermark of every locked shard
-- still behind now_ms, then per key i stores the arrival time (tat_ms[i], tat_remainder[i])
-- and expires_at_ms[i], updating the key's row when inserts[i] is false and collecting it
-- for one INSERT (ascending key order) when true. Raises P0004 unless every update touched
-- its row and every insert added one.
CREATE FUNCTION public.runlimit_gcra_write(
    now_ms bigint,
    shards smallint[],
    counter_keys text,
    inserts boolean[],
    tat_ms bigint[],
    tat_remainder bigint[],
    expires_at_ms bigint[]
)
RETURNS void
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    keys bytea;
    key bytea;
    checks integer;
    shard_index smallint;
    new_keys bytea[] := '{}';
    new_tat_ms bigint[] := '{}';
    new_tat_remainder bigint[] := '{}';
    new_expires_at_ms bigint[] := '{}';
    inserted bigint;
BEGIN
    IF now_ms IS NULL OR shards IS NULL OR counter_keys IS NULL OR pg_catalog.length(counter_keys) = 0
        OR pg_catalog.length(counter_keys) % 128 <> 0 THEN
        RAISE EXCEPTION 'runlimit: invalid gcra write arguments' USING ERRCODE = '22023';
    END IF;
    keys := pg_catalog.decode(counter_keys, 'hex');
    checks := pg_catalog.length(keys) / 64;
    IF pg_catalog.length(keys) * 2 <> pg_catalog.length(counter_keys)
        OR pg_catalog.cardinality(inserts) IS DISTINCT FROM checks
        OR pg_catalog.cardinality(tat_ms) IS DISTINCT FROM checks
        OR pg_catalog.cardinality(tat_remainder) IS DISTINCT FROM checks
        OR pg_catalog.cardinality(expires_at_ms) IS DISTINCT FROM checks THEN
        RAISE EXCEPTION 'runlimit: invalid gcra write arguments' USING ERRCODE = '22023';
    END IF;
    FOREACH shard_index IN ARRAY shards LOOP
        UPDATE public.runlimit_gcra_shards AS l
        SET watermark_ms = now_ms
        WHERE l.shard = shard_index AND l.watermark_ms < now_ms;
    END LOOP;
    FOR position IN 1 .. checks LOOP
        key := pg_catalog.substring(keys, position * 64 - 63, 64);
        IF inserts[position] THEN
            new_keys := new_keys || key;
            new_tat_ms := new_tat_ms || tat_ms[position];
            new_tat_remainder := new_tat_remainder || tat_remainder[position];
            new_expires_at_ms := new_expires_at_ms || expires_at_ms[position];
        ELSE
            UPDATE public.runlimit_gcra AS g
            SET tat_ms = runlimit_gcra_write.tat_ms[position],
                tat_remainder = runlimit_gcra_write.tat_remainder[position],
                expires_at_ms = runlimit_gcra_write.expires_at_ms[position]
            WHERE g.counter_key = key;
            IF NOT FOUND THEN
                RAISE EXCEPTION 'runlimit: a locked gcra row was not written' USING ERRCODE = 'P0004';
            END IF;
        END IF;
    END LOOP;
    IF pg_catalog.cardinality(new_keys) > 0 THEN
        INSERT INTO public.runlimit_gcra (counter_key, tat_ms, tat_remainder, expires_at_ms)
        SELECT n.counter_key, n.tat_ms, n.tat_remainder, n.expires_at_ms
        FROM ROWS FROM (
            pg_catalog.unnest(new_keys),
            pg_catalog.unnest(new_tat_ms),
            pg_catalog.unnest(new_tat_remainder),
            pg_catalog.unnest(new_expires_at_ms)
        ) AS n (counter_key, tat_ms, tat_remainder, expires_at_ms)
        ORDER BY n.counter_key;
        GET DIAGNOSTICS inserted = ROW_COUNT;
        IF inserted <> pg_catalog.cardinality(new_keys) THEN
            RAISE EXCEPTION 'runlimit: a locked gcra row was not written' USING ERRCODE = 'P0004';
        END IF;
    END IF;
END
$$;
