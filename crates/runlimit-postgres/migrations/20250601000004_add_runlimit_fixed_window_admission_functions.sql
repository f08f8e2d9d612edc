-- Runlimit fixed-window admission functions. Published migration: never edit it (SQLx
-- checksums applied versions); add a new one instead.
--
-- PL/pgSQL keeps the plans of the statements inside a function for the whole session, so an
-- admission that calls these functions parses and plans the table statements once per
-- connection instead of once per admission. The common admission (every key stored, every
-- increment in its window) needs neither function: it runs statements Runlimit prepares on
-- each connection. These functions serve the rest: keys without a stored counter (the
-- capacity ledger) and windows that ended (re-anchoring). They take the same locks in the same
-- order as the statements earlier releases send (advisory locks ascending, then the counter
-- rows FOR NO KEY UPDATE, the ledger rows FOR UPDATE ascending), commit the same rows and
-- sample the same clock, so replicas of both releases can share the tables during a rolling
-- deploy.
--
-- Each function is SECURITY INVOKER (it runs with the caller's privileges), pins
-- search_path = pg_catalog, pg_temp and names every object schema-qualified. Counter keys are
-- passed as the lowercase hexadecimal text of their bytes, 64 bytes per key, concatenated.
-- A malformed argument raises SQLSTATE 22023 (invalid_parameter_value); a write that does
-- not touch exactly the planned rows raises SQLSTATE P0004 (assert_failure) before the caller
-- can commit.

-- For the keys the provisional increments of the preflight did not find: row-locks each stored
-- counter (FOR NO KEY UPDATE, in the given order) and adds costs[i] to the counter of key i
-- provisionally when that stays within bigint, as the preflight does; then locks (FOR UPDATE, in
-- the given ascending order) and reads the capacity ledger rows of the shards; then samples the
-- clock after all those locks. used[i] and expires_us[i] (the window end in microseconds since
-- the Unix epoch) are the counter of key i as it was before any increment, null when the key
-- has no row; row_counts[i] belongs to shards[i] and is null when the shard has no ledger row;
-- now_us is the clock sample in microseconds since the Unix epoch.
CREATE FUNCTION public.runlimit_fixed_window_reserve(
    counter_keys text,
    costs bigint[],
    shards smallint[],
    OUT used bigint[],
    OUT expires_us bigint[],
    OUT row_counts integer[],
    OUT now_us bigint
)
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    keys bytea;
    key bytea;
    checks integer;
    cost bigint;
    found_used bigint;
    found_expires timestamp with time zone;
    shard_index smallint;
    found_count integer;
BEGIN
    IF counter_keys IS NULL OR pg_catalog.length(counter_keys) % 128 <> 0 OR shards IS NULL THEN
        RAISE EXCEPTION 'runlimit: invalid fixed-window reserve arguments' USING ERRCODE = '22023';
    END IF;
    keys := pg_catalog.decode(counter_keys, 'hex');
    checks := pg_catalog.length(keys) / 64;
    IF pg_catalog.length(keys) * 2 <> pg_catalog.length(counter_keys)
        OR pg_catalog.cardinality(costs) IS DISTINCT FROM checks THEN
        RAISE EXCEPTION 'runlimit: invalid fixed-window reserve arguments' USING ERRCODE = '22023';
    END IF;
    used := '{}';
    expires_us := '{}';
    FOR position IN 1 .. checks LOOP
        key := pg_catalog.substring(keys, position * 64 - 63, 64);
        cost := costs[position];
        IF cost IS NULL OR cost < 1 THEN
            RAISE EXCEPTION 'runlimit: invalid fixed-window cost' USING ERRCODE = '22023';
        END IF;
        SELECT w.used, w.window_expires_at INTO found_used, found_expires
        FROM public.runlimit_fixed_windows AS w
        WHERE w.counter_key = key
        FOR NO KEY UPDATE OF w;
        IF found_used <= 9223372036854775807 - cost THEN
            UPDATE public.runlimit_fixed_windows AS w
            SET used = w.used + cost
            WHERE w.counter_key = key;
        END IF;
        used := used || found_used;
        expires_us := expires_us || (EXTRACT(EPOCH FROM found_expires) * 1000000)::bigint;
    END LOOP;
    row_counts := '{}';
    FOREACH shard_index IN ARRAY shards LOOP
        SELECT l.row_count INTO found_count
        FROM public.runlimit_fixed_window_shards AS l
        WHERE l.shard = shard_index
        FOR UPDATE OF l;
        row_counts := row_counts || found_count;
    END LOOP;
    now_us := (EXTRACT(EPOCH FROM pg_catalog.clock_timestamp()) * 1000000)::bigint;
END
$$;

-- Writes what an allowed batch writes beyond the provisional increments the preflight (and
-- runlimit_fixed_window_reserve) already made, anchored at now_us (microseconds since the Unix epoch): for key i, re-anchor
-- its stored counter (renew[i] true) or insert a new counter (renew[i] false) at now_us, with
-- costs[i] used and a window of window_ms[i] milliseconds. The re-anchoring updates run key by
-- key, then one INSERT takes every new counter in ascending key order. Raises P0004 unless
-- every update touched its row and every insert added one.
CREATE FUNCTION public.runlimit_fixed_window_write(
    now_us bigint,
    counter_keys text,
    renew boolean[],
    costs bigint[],
    window_ms bigint[]
)
RETURNS void
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    keys bytea;
    key bytea;
    checks integer;
    sampled_at timestamp with time zone;
    new_keys bytea[] := '{}';
    new_costs bigint[] := '{}';
    new_window_ms bigint[] := '{}';
    inserted bigint;
BEGIN
    IF now_us IS NULL OR counter_keys IS NULL OR pg_catalog.length(counter_keys) = 0
        OR pg_catalog.length(counter_keys) % 128 <> 0 THEN
        RAISE EXCEPTION 'runlimit: invalid fixed-window write arguments' USING ERRCODE = '22023';
    END IF;
    keys := pg_catalog.decode(counter_keys, 'hex');
    checks := pg_catalog.length(keys) / 64;
    IF pg_catalog.length(keys) * 2 <> pg_catalog.length(counter_keys)
        OR pg_catalog.cardinality(renew) IS DISTINCT FROM checks
        OR pg_catalog.cardinality(costs) IS DISTINCT FROM checks
        OR pg_catalog.cardinality(window_ms) IS DISTINCT FROM checks THEN
        RAISE EXCEPTION 'runlimit: invalid fixed-window write arguments' USING ERRCODE = '22023';
    END IF;
    sampled_at := pg_catalog.to_timestamp(0) + now_us * INTERVAL '1 microsecond';
    FOR position IN 1 .. checks LOOP
        key := pg_catalog.substring(keys, position * 64 - 63, 64);
        IF renew[position] THEN
            UPDATE public.runlimit_fixed_windows AS w
            SET used = costs[position],
                window_started_at = sampled_at,
                window_expires_at = sampled_at + window_ms[position] * INTERVAL '1 millisecond'
            WHERE w.counter_key = key;
            IF NOT FOUND THEN
                RAISE EXCEPTION 'runlimit: a locked counter row was not updated' USING ERRCODE = 'P0004';
            END IF;
        ELSE
            new_keys := new_keys || key;
            new_costs := new_costs || costs[position];
            new_window_ms := new_window_ms || window_ms[position];
        END IF;
    END LOOP;
    IF pg_catalog.cardinality(new_keys) > 0 THEN
        INSERT INTO public.runlimit_fixed_windows (counter_key, used, window_started_at, window_expires_at)
        SELECT n.counter_key, n.cost, sampled_at, sampled_at + n.window_ms * INTERVAL '1 millisecond'
        FROM ROWS FROM (
            pg_catalog.unnest(new_keys),
            pg_catalog.unnest(new_costs),
            pg_catalog.unnest(new_window_ms)
        ) AS n (counter_key, cost, window_ms)
        ORDER BY n.counter_key;
        GET DIAGNOSTICS inserted = ROW_COUNT;
        IF inserted <> pg_catalog.cardinality(new_keys) THEN
            RAISE EXCEPTION 'runlimit: a new counter row was not inserted' USING ERRCODE = 'P0004';
        END IF;
    END IF;
END
$$;
