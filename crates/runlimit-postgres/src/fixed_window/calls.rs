//! The fixed-window admission protocol: statements prepared on each connection (see
//! [`crate::prepared`]) and calls to the functions of migration
//! `20250601000004_add_runlimit_fixed_window_admission_functions`, sent through
//! [`crate::script::run`] as simple-query round trips.
//!
//! # Two round trips per admission
//!
//! An admission is two round trips whatever the batch size:
//!
//! 1. `BEGIN ISOLATION LEVEL READ COMMITTED, READ WRITE`,
//!    `EXECUTE runlimit_fixed_window_lock_one_v1` (one check) or `.._lock_batch_v1` (more: the
//!    transaction-local `statement_timeout` and `lock_timeout`, for a batch also
//!    `plan_cache_mode = force_generic_plan` and `enable_seqscan = off`, then every advisory
//!    lock in ascending order, each wait bounded by `lock_timeout`; `statement_timeout`, armed when a statement starts,
//!    bounds the statements after this one, as with the statements of earlier releases) and
//!    `EXECUTE runlimit_fixed_window_preflight_one_v1` (one check) or
//!    `.._preflight_batch_v1` (more): one `UPDATE` that row-locks every stored counter whose
//!    increment stays within `bigint` by adding the check's cost to it provisionally, and
//!    returns, per counter it incremented, the counter as it was before and a clock sample
//!    taken after that row's lock. PostgreSQL updates the rows one at a time and returns them in
//!    that order, so the sample of the last row is taken after every row lock;
//! 2. `COMMIT` when every check is allowed and every write is such an in-window increment (the
//!    common admission: four statements in all); `SELECT public.runlimit_fixed_window_write(..)`
//!    (re-anchor the counters whose window ended, insert the new ones, verifying the row counts)
//!    then `COMMIT` when some check writes more; `ROLLBACK` after a denial, which also undoes
//!    the provisional increments.
//!
//! An allowed increment commits exactly the provisional increment: the evaluator allows an
//! in-window check only when `used + cost` stays within the limit, hence within `bigint`. A key
//! the preflight did not return (no row, or an increment past `bigint`) adds one round trip
//! between them: `SELECT * FROM public.runlimit_fixed_window_reserve(..)` row-locks and reads
//! those keys' counters (incrementing provisionally any whose increment fits, as the preflight
//! does), locks the capacity ledger rows of their shards, and takes a new clock sample after
//! all those locks.
//!
//! What PostgreSQL parses and plans per admission is `BEGIN`, two `EXECUTE` statements (a name
//! and literal arguments) and `COMMIT`: the table statements are planned once per connection.
//! The lock and preflight stay separate statements, each with its own `READ COMMITTED`
//! snapshot (the preflight's is taken after the advisory locks, so it sees what their previous
//! holders committed), and a failure names its phase by the number of statements that
//! completed, as in the statement protocol of earlier releases (`super::sql`), which takes the
//! same locks in the same order and writes the same rows. The order of the row locks within a
//! batch is the order the `UPDATE` visits the rows: every admission row-locks a counter only
//! while it holds that counter's advisory lock, so no two admissions wait on each other's row
//! locks.
//!
//! Arguments are rendered as exact types: integers and booleans in array literals cast with
//! SQL keywords (`'{1,2}'::bigint[]`), counter keys as `pg_catalog.decode('<hex>', 'hex')` or
//! as hexadecimal digits cast to `pg_catalog.text`; every function name is schema-qualified.
//! Nothing in a statement resolves through `search_path`, no value is caller-supplied text,
//! and no literal contains a backslash, so `standard_conforming_strings` does not matter.

use crate::{
    prepared::Prepared,
    script::{array_literal, hex_keys, push_bytea},
};

/// Sets the transaction-local timeouts (`$1`, milliseconds as text), then takes the advisory
/// lock `$2`: one row. The lock of a one-check admission.
pub(crate) static LOCK_ONE: Prepared = Prepared {
    name: "runlimit_fixed_window_lock_one_v1",
    prepare: include_str!("../sql/fixed_window_prepare_lock_one.sql"),
};

/// Sets the transaction-local timeouts (`$1`, milliseconds as text),
/// `plan_cache_mode = force_generic_plan` (so the batch preflight keeps one plan for every
/// batch instead of planning each execution) and `enable_seqscan = off` (so that plan is an
/// index scan even while the table is small), then takes the advisory locks of `$2` in array
/// order: one row. The lock of a batch.
pub(crate) static LOCK_BATCH: Prepared = Prepared {
    name: "runlimit_fixed_window_lock_batch_v1",
    prepare: include_str!("../sql/fixed_window_prepare_lock_batch.sql"),
};

/// The preflight of one key (`$1`, cost `$2`): a row `(ordinal = 1, used, expires_us,
/// now_us)` when the key's counter is stored and its increment stays within `bigint`, else
/// none.
pub(crate) static PREFLIGHT_ONE: Prepared = Prepared {
    name: "runlimit_fixed_window_preflight_one_v1",
    prepare: include_str!("../sql/fixed_window_prepare_preflight_one.sql"),
};

/// The preflight of several keys (`$1`, costs `$2` in the same order): a row per counter it
/// incremented, `ordinal` its key's 1-based position in `$1`, in the order the rows were
/// updated.
pub(crate) static PREFLIGHT_BATCH: Prepared = Prepared {
    name: "runlimit_fixed_window_preflight_batch_v1",
    prepare: include_str!("../sql/fixed_window_prepare_preflight_batch.sql"),
};

/// The lock statement of the advisory locks `lock_ids` (ascending, distinct) with both timeouts
/// `timeout_ms` milliseconds, and the statement it executes: [`LOCK_ONE`] for the one lock of a
/// one-check admission (`batch` false), else [`LOCK_BATCH`].
pub(crate) fn lock(timeout_ms: u128, lock_ids: &[i64], batch: bool) -> (String, &'static Prepared) {
    match lock_ids {
        [lock_id] if !batch => (
            // Quoted: `-9223372036854775808::bigint` would cast the positive number first.
            format!("EXECUTE {}('{timeout_ms}'::pg_catalog.text, '{lock_id}'::bigint);\n", LOCK_ONE.name),
            &LOCK_ONE,
        ),
        _ => (
            format!(
                "EXECUTE {}('{timeout_ms}'::pg_catalog.text, {}::bigint[]);\n",
                LOCK_BATCH.name,
                array_literal(lock_ids)
            ),
            &LOCK_BATCH,
        ),
    }
}

/// The preflight of `keys` (`costs[i]` for `keys[i]`) and the statement it executes.
pub(crate) fn preflight(keys: &[[u8; 64]], costs: &[u64]) -> (String, &'static Prepared) {
    let mut sql = String::from("EXECUTE ");
    match (keys, costs) {
        ([key], [cost]) => {
            sql.push_str(PREFLIGHT_ONE.name);
            sql.push('(');
            push_bytea(&mut sql, key);
            sql.push_str(&format!(", {cost}::bigint);\n"));
            (sql, &PREFLIGHT_ONE)
        }
        _ => {
            sql.push_str(PREFLIGHT_BATCH.name);
            sql.push_str("(ARRAY[");
            for (index, key) in keys.iter().enumerate() {
                if index > 0 {
                    sql.push_str(", ");
                }
                push_bytea(&mut sql, key);
            }
            sql.push_str(&format!("]::pg_catalog.bytea[], {}::bigint[]);\n", array_literal(costs)));
            (sql, &PREFLIGHT_BATCH)
        }
    }
}

/// `SELECT * FROM public.runlimit_fixed_window_reserve(..)` of the keys the preflight did not
/// return (`costs[i]` for `keys[i]`) and the ledger rows of `shards` (ascending): one row,
/// `used` and `expires_us` with one element per key, `row_counts` one per shard, and the clock
/// sample `now_us`.
pub(crate) fn reserve(keys: &[[u8; 64]], costs: &[u64], shards: &[i16]) -> String {
    format!(
        "SELECT * FROM public.runlimit_fixed_window_reserve('{}'::pg_catalog.text, {}::bigint[], {}::smallint[]);\n",
        hex_keys(keys),
        array_literal(costs),
        array_literal(shards)
    )
}

/// `SELECT public.runlimit_fixed_window_write(..)`: per key `(renew, cost, window_ms)`, a
/// stored counter re-anchored (`renew`) or a new counter inserted at `now_us` with `cost` used.
pub(crate) fn write(keys: &[[u8; 64]], writes: &[(bool, u64, u64)], now_us: i64) -> String {
    format!(
        "SELECT public.runlimit_fixed_window_write({now_us}::bigint, '{}'::pg_catalog.text, \
         {}::boolean[], {}::bigint[], {}::bigint[]);\n",
        hex_keys(keys),
        array_literal(writes.iter().map(|(renew, _, _)| renew)),
        array_literal(writes.iter().map(|(_, cost, _)| cost)),
        array_literal(writes.iter().map(|(_, _, window_ms)| window_ms)),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_calls_of_exact_types() {
        let key = [0xAB; 64];
        let decoded = format!("pg_catalog.decode('{}', 'hex')", "ab".repeat(64));
        let (batch_lock, statement) = lock(1_500, &[-5, 7], true);
        assert_eq!(
            batch_lock,
            "EXECUTE runlimit_fixed_window_lock_batch_v1('1500'::pg_catalog.text, '{-5,7}'::bigint[]);\n"
        );
        assert_eq!(statement.name, LOCK_BATCH.name);
        assert_eq!(lock(1_500, &[-5], true).1.name, LOCK_BATCH.name);
        let (one_lock, statement) = lock(1_500, &[-5], false);
        assert_eq!(
            one_lock,
            "EXECUTE runlimit_fixed_window_lock_one_v1('1500'::pg_catalog.text, '-5'::bigint);\n"
        );
        assert!(lock(1_500, &[i64::MIN], false).0.ends_with(", '-9223372036854775808'::bigint);\n"));
        assert_eq!(statement.name, LOCK_ONE.name);
        let (one, statement) = preflight(&[key], &[3]);
        assert_eq!(one, format!("EXECUTE runlimit_fixed_window_preflight_one_v1({decoded}, 3::bigint);\n"));
        assert_eq!(statement.name, PREFLIGHT_ONE.name);
        let (batch, statement) = preflight(&[key, key], &[3, 1]);
        assert_eq!(
            batch,
            format!(
                "EXECUTE runlimit_fixed_window_preflight_batch_v1(ARRAY[{decoded}, {decoded}]::pg_catalog.bytea[], \
                 '{{3,1}}'::bigint[]);\n"
            )
        );
        assert_eq!(statement.name, PREFLIGHT_BATCH.name);
        assert_eq!(
            reserve(&[key], &[2], &[0, 255]),
            format!(
                "SELECT * FROM public.runlimit_fixed_window_reserve('{}'::pg_catalog.text, '{{2}}'::bigint[], \
                 '{{0,255}}'::smallint[]);\n",
                "ab".repeat(64)
            )
        );
        for statement in [&LOCK_ONE, &LOCK_BATCH, &PREFLIGHT_ONE, &PREFLIGHT_BATCH] {
            assert!(
                statement.prepare.starts_with(&format!("PREPARE {} (", statement.name)),
                "{}",
                statement.name
            );
            assert!(statement.prepare.trim_end().ends_with(';'), "{}", statement.name);
            assert!(!statement.prepare.contains('\\'), "{}", statement.name);
        }
        assert_eq!(
            write(&[key, key], &[(true, 3, 60_000), (false, 1, 5)], 17),
            format!(
                "SELECT public.runlimit_fixed_window_write(17::bigint, '{}'::pg_catalog.text, \
                 '{{true,false}}'::boolean[], '{{3,1}}'::bigint[], '{{60000,5}}'::bigint[]);\n",
                "ab".repeat(128)
            )
        );
    }
}
