//! The fixed-window admission protocol: calls to the functions of migration
//! `20250601000004_add_runlimit_fixed_window_admission_functions`, sent through
//! [`crate::script::run`] as simple-query round trips.
//!
//! # Two round trips per admission
//!
//! An admission is two round trips whatever the batch size:
//!
//! 1. `BEGIN ISOLATION LEVEL READ COMMITTED, READ WRITE`,
//!    `SELECT public.runlimit_fixed_window_lock(..)` (the transaction-local `statement_timeout`
//!    and `lock_timeout`, then every advisory lock in ascending order, each wait bounded by
//!    `lock_timeout`; `statement_timeout`, armed when a statement starts, bounds the statements
//!    after this one, as with the statements of earlier releases) and
//!    `SELECT * FROM public.runlimit_fixed_window_preflight(..)`: every stored counter
//!    row-locked by adding the check's cost to it provisionally, the counters as they were
//!    before, and the clock sample taken after those row locks;
//! 2. `COMMIT` when every check is allowed and every write is such an in-window increment (the
//!    common admission: four statements in all); `SELECT public.runlimit_fixed_window_write(..)`
//!    (re-anchor the counters whose window ended, insert the new ones, verifying the row counts)
//!    then `COMMIT` when some check writes more; `ROLLBACK` after a denial, which also undoes
//!    the provisional increments.
//!
//! An allowed increment commits exactly the provisional increment: the evaluator allows an
//! in-window check only when `used + cost` stays within the limit, hence within `bigint`, and
//! the preflight makes every increment that stays within `bigint`. A key without a row adds
//! one round trip between them: `SELECT * FROM public.runlimit_fixed_window_reserve(..)` (the
//! capacity ledger rows, locked, and a new clock sample taken after those locks).
//!
//! PL/pgSQL plans the statements inside the functions once per connection and keeps the plans;
//! what PostgreSQL parses and plans per admission is only the call statements, a function name
//! and literal arguments. The lock and preflight calls stay separate statements, each with its
//! own `READ COMMITTED` snapshot, so a failure names its phase by the number of statements that
//! completed, as in the statement protocol of earlier releases (`super::sql`), which takes the
//! same locks in the same order and writes the same rows.
//!
//! Arguments are rendered as the functions' exact types: integers and booleans in array
//! literals cast with SQL keywords (`'{1,2}'::bigint[]`), counter keys as hexadecimal digits
//! cast to `pg_catalog.text`; every function name is schema-qualified. Nothing in a call
//! resolves through `search_path`, no value is caller-supplied text, and no literal contains a
//! backslash, so `standard_conforming_strings` does not matter.

use crate::script::{array_literal, hex_keys};

/// `SELECT public.runlimit_fixed_window_lock(..)`: the timeouts (`timeout_ms` milliseconds),
/// then the advisory locks of `lock_ids` in the given (ascending) order. One row.
pub(crate) fn lock(timeout_ms: u128, lock_ids: &[i64]) -> String {
    format!(
        "SELECT public.runlimit_fixed_window_lock({timeout_ms}::bigint, {}::bigint[]);\n",
        array_literal(lock_ids)
    )
}

/// `SELECT * FROM public.runlimit_fixed_window_preflight(..)` of `keys`, incrementing each
/// stored counter provisionally by its check's cost (`costs[i]` for `keys[i]`): one row,
/// `used` and `expires_us` with one element per key as stored before the increment (null
/// without a row) and the clock sample `now_us`.
pub(crate) fn preflight(keys: &[[u8; 64]], costs: &[u64]) -> String {
    format!(
        "SELECT * FROM public.runlimit_fixed_window_preflight('{}'::pg_catalog.text, {}::bigint[]);\n",
        hex_keys(keys),
        array_literal(costs)
    )
}

/// `SELECT * FROM public.runlimit_fixed_window_reserve(..)` of `shards` (ascending): one row,
/// `row_counts` with one element per shard and the clock sample `now_us`.
pub(crate) fn reserve(shards: &[i16]) -> String {
    format!("SELECT * FROM public.runlimit_fixed_window_reserve({}::smallint[]);\n", array_literal(shards))
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
        assert_eq!(
            lock(1_500, &[-5, 7]),
            "SELECT public.runlimit_fixed_window_lock(1500::bigint, '{-5,7}'::bigint[]);\n"
        );
        assert_eq!(
            preflight(&[key], &[3]),
            format!(
                "SELECT * FROM public.runlimit_fixed_window_preflight('{}'::pg_catalog.text, '{{3}}'::bigint[]);\n",
                "ab".repeat(64)
            )
        );
        assert_eq!(
            reserve(&[0, 255]),
            "SELECT * FROM public.runlimit_fixed_window_reserve('{0,255}'::smallint[]);\n"
        );
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
