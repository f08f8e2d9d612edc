//! The GCRA admission protocol: calls to the functions of migration
//! `20250701000003_add_runlimit_gcra_admission_functions`, sent through
//! [`crate::script::run`] as simple-query round trips.
//!
//! # Two round trips, five statements
//!
//! 1. `BEGIN ISOLATION LEVEL READ COMMITTED, READ WRITE`, the transaction-local
//!    `statement_timeout`, `lock_timeout` and `search_path` (a statement of their own, so
//!    `statement_timeout` is armed when the next statement starts and bounds all its lock waits
//!    together), and `SELECT * FROM public.runlimit_gcra_lock_read(..)`: the ledger rows of
//!    every shard the batch touches (`FOR UPDATE`, ascending shard order), then, in a statement
//!    of its own inside the function (so its `READ COMMITTED` snapshot is taken after the
//!    locks), the stored arrival times, and the whole-millisecond clock sample. Only the ledger
//!    locks can wait, so a failure of this statement is reported in the lock phase.
//! 2. `SELECT public.runlimit_gcra_write(..)` (advance the watermarks of the locked shards,
//!    update and insert the rows, verify the row counts) and `COMMIT`, or just `ROLLBACK`
//!    after a denial.
//!
//! PL/pgSQL plans the statements inside the functions once per connection; PostgreSQL parses
//! and plans per admission only the call statements. The statement protocol of earlier
//! releases (`super::sql`) takes the same locks in the same order and writes the same rows.
//! Arguments are rendered as in [`crate::fixed_window`]'s calls: exact types, schema-qualified
//! names, integers, booleans and hexadecimal digits only.

use crate::{
    gcra::GcraWrite,
    script::{array_literal, hex_keys},
};

/// `SELECT * FROM public.runlimit_gcra_lock_read(..)`: the ledger rows of `shards` (ascending,
/// distinct), then the stored arrival times of `keys` and the clock sample. One row: `row_counts` and `watermarks_ms` with one
/// element per shard, `tat_ms` and `tat_remainder` with one per key (null without a row), and
/// `now_ms`.
pub(crate) fn lock_read(shards: &[i16], keys: &[[u8; 64]]) -> String {
    format!(
        "SELECT * FROM public.runlimit_gcra_lock_read({}::smallint[], '{}'::pg_catalog.text);\n",
        array_literal(shards),
        hex_keys(keys)
    )
}

/// `SELECT public.runlimit_gcra_write(..)`: advances the watermarks of `shards` to `now_ms` and
/// writes one row per key.
pub(crate) fn write(keys: &[[u8; 64]], writes: &[GcraWrite], shards: &[i16], now_ms: u64) -> String {
    format!(
        "SELECT public.runlimit_gcra_write({now_ms}::bigint, {}::smallint[], '{}'::pg_catalog.text, \
         {}::boolean[], {}::bigint[], {}::bigint[], {}::bigint[]);\n",
        array_literal(shards),
        hex_keys(keys),
        array_literal(writes.iter().map(|write| write.insert)),
        array_literal(writes.iter().map(|write| write.tat.tat_ms)),
        array_literal(writes.iter().map(|write| write.tat.tat_remainder)),
        array_literal(writes.iter().map(|write| write.expires_at_ms)),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gcra::StoredTat;

    #[test]
    fn renders_calls_of_exact_types() {
        let key = [0xAB; 64];
        assert_eq!(
            lock_read(&[0, 7, 255], &[key]),
            format!(
                "SELECT * FROM public.runlimit_gcra_lock_read('{{0,7,255}}'::smallint[], \
                 '{}'::pg_catalog.text);\n",
                "ab".repeat(64)
            )
        );
        let insert =
            GcraWrite { insert: true, tat: StoredTat { tat_ms: 10, tat_remainder: 2 }, expires_at_ms: 11 };
        let update = GcraWrite { insert: false, ..insert };
        assert_eq!(
            write(&[key, key], &[insert, update], &[171], 9),
            format!(
                "SELECT public.runlimit_gcra_write(9::bigint, '{{171}}'::smallint[], '{}'::pg_catalog.text, \
                 '{{true,false}}'::boolean[], '{{10,10}}'::bigint[], '{{2,2}}'::bigint[], '{{11,11}}'::bigint[]);\n",
                "ab".repeat(128)
            )
        );
    }
}
