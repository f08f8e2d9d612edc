//! The fixed-window statement protocol of earlier releases: scripts built from the
//! `src/sql/fixed_window_*.sql` templates and sent through [`crate::script::run`] as
//! simple-query round trips. Admissions now run prepared statements and admission functions (`super::calls`);
//! these statements remain for peek, reset and cleanup, and as the admission protocol of the
//! hidden `PostgresConfig::with_previous_admission_protocol`, which tests that replicas of both
//! releases interoperate.
//!
//! # Two round trips per admission
//!
//! An allowed admission is two round trips and five statements whatever the batch size:
//!
//! 1. `begin.sql` (`BEGIN ISOLATION LEVEL READ COMMITTED, READ WRITE`),
//!    `fixed_window_lock.sql` (the transaction-local `statement_timeout`, `lock_timeout` and
//!    `search_path`, then every advisory lock in ascending order) and
//!    `fixed_window_preflight.sql` (the stored counters, row-locked, and the clock sample taken
//!    after those row locks);
//! 2. `fixed_window_update.sql` and/or `fixed_window_insert.sql`, then `COMMIT` (or just
//!    `ROLLBACK` after a denial).
//!
//! A key without a row adds one round trip between them: `fixed_window_reserve.sql` (the
//! capacity ledger rows, locked, and a new clock sample taken after those locks).
//!
//! Each statement of a simple-query script is analyzed just before it runs and gets its own
//! `READ COMMITTED` snapshot. So the preflight, sent after the lock statement in the same
//! script, reads what the previous holders of its locks committed, and it is analyzed under the
//! `search_path` the lock statement set (the lock statement itself names only `pg_catalog`
//! functions, schema-qualified). Sending the phases as separate extended-protocol round trips
//! would cost five round trips instead of two. On the reference machine (a 2-core VM) a round
//! trip and a statement each cost the server about as much CPU as executing a small statement,
//! so both counts are kept minimal; see the README's benchmark.
//!
//! The write statements verify their own row counts and fail with an error (SQLSTATE 22P02,
//! message naming Runlimit) before `COMMIT` runs if a row they must write is missing, so a
//! malformed write is always a pre-commit failure. PostgreSQL stops a script at its first error,
//! and inside the explicit transaction that error aborts it, so `COMMIT` never runs after a
//! failed write.
//!
//! Values are rendered into the SQL text as [`crate::script`] describes. The statements are
//! small enough that parsing and planning them each time costs less than the round trips
//! prepared statements would need.

use crate::script::{bytea, ordinal_keys, push_bytea};

const LOCK_SQL: &str = include_str!("../sql/fixed_window_lock.sql");
const PREFLIGHT_SQL: &str = include_str!("../sql/fixed_window_preflight.sql");
const RESERVE_SQL: &str = include_str!("../sql/fixed_window_reserve.sql");
const UPDATE_SQL: &str = include_str!("../sql/fixed_window_update.sql");
const INSERT_SQL: &str = include_str!("../sql/fixed_window_insert.sql");
const CLEANUP_SQL: &str = include_str!("../sql/fixed_window_cleanup.sql");
const PEEK_SQL: &str = include_str!("../sql/fixed_window_peek.sql");
const RESET_SQL: &str = include_str!("../sql/fixed_window_reset.sql");

/// The transaction-local settings, then the advisory locks of `lock_ids` in the given
/// (ascending) order, as one single-row statement. PostgreSQL evaluates a target list left to
/// right, so `lock_timeout` bounds every lock wait of this statement (each on its own);
/// `statement_timeout` is armed when a statement starts, so it bounds the statements after
/// this one. A target list without a `FROM` clause is also the cheapest statement to plan.
pub(crate) fn lock(timeout_ms: u128, lock_ids: &[i64]) -> String {
    let locks: Vec<String> =
        lock_ids.iter().map(|id| format!("pg_catalog.pg_advisory_xact_lock({id})")).collect();
    LOCK_SQL.replace("{timeout_ms}", &timeout_ms.to_string()).replace("{locks}", &locks.join(",\n       "))
}

/// Reads and row-locks the counters of `keys` (ordinals start at 1), then samples the clock:
/// one row per stored key, or one row with a null ordinal when none is stored, each carrying the
/// clock sample.
pub(crate) fn preflight(keys: &[[u8; 64]]) -> String {
    PREFLIGHT_SQL.replace("{keys}", &ordinal_keys(keys))
}

/// Locks and reads the capacity ledger rows of `shards` (ascending order), then samples the
/// clock, in the same row shape as [`preflight`].
pub(crate) fn reserve(shards: &[i16]) -> String {
    let shards: Vec<String> = shards.iter().map(i16::to_string).collect();
    RESERVE_SQL.replace("{shards}", &shards.join(", "))
}

/// Increments by `cost` (`renew == false`) or re-anchors with `cost` used (`renew == true`)
/// stored counters; rows are `(key, renew, cost, window_ms)`. The evaluator admitted each
/// cost, so `used + cost` stays within the limit and never overflows `bigint`.
pub(crate) fn update(rows: &[(&[u8; 64], bool, u64, u64)], now_us: i64) -> String {
    let mut values = String::with_capacity(rows.len() * 190);
    for (index, (key, renew, cost, window_ms)) in rows.iter().enumerate() {
        if index > 0 {
            values.push_str(", ");
        }
        values.push('(');
        push_bytea(&mut values, *key);
        values.push_str(if *renew { ", true, " } else { ", false, " });
        values.push_str(&cost.to_string());
        values.push_str("::bigint, ");
        values.push_str(&window_ms.to_string());
        values.push_str("::bigint)");
    }
    UPDATE_SQL
        .replace("{updates}", &values)
        .replace("{now_us}", &now_us.to_string())
        .replace("{expected}", &rows.len().to_string())
}

/// Inserts new counters anchored at `now_us`; rows are `(key, cost, window_ms)`, the new
/// counter's `used` being the check's cost.
pub(crate) fn insert(rows: &[(&[u8; 64], u64, u64)], now_us: i64) -> String {
    let mut values = String::with_capacity(rows.len() * 180);
    for (index, (key, cost, window_ms)) in rows.iter().enumerate() {
        if index > 0 {
            values.push_str(", ");
        }
        values.push('(');
        push_bytea(&mut values, *key);
        values.push_str(", ");
        values.push_str(&cost.to_string());
        values.push_str("::bigint, ");
        values.push_str(&window_ms.to_string());
        values.push_str("::bigint)");
    }
    INSERT_SQL
        .replace("{inserts}", &values)
        .replace("{now_us}", &now_us.to_string())
        .replace("{expected}", &rows.len().to_string())
}

/// Reads the counter of `key` without locking it, and samples the clock: exactly one row,
/// with null `used` and `expires_us` when no counter is stored.
pub(crate) fn peek(key: &[u8; 64]) -> String {
    PEEK_SQL.replace("{key}", &bytea(key))
}

/// Deletes the counter of `key` (the ledger trigger frees its slot) and samples the clock
/// after the deletion: exactly one row, with a null `expires_us` when none was stored.
pub(crate) fn reset(key: &[u8; 64]) -> String {
    RESET_SQL.replace("{key}", &bytea(key))
}

/// Deletes at most `maximum_rows` expired counters.
pub(crate) fn cleanup(maximum_rows: u32) -> String {
    CLEANUP_SQL.replace("{maximum_rows}", &maximum_rows.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_only_digits_and_hex() {
        let mut key = [0u8; 64];
        key[0] = 0xAB;
        key[63] = 0x01;
        let sql = preflight(&[key]);
        assert!(sql.contains("(VALUES (1, pg_catalog.decode('ab00"), "{sql}");
        assert!(sql.contains("0001', 'hex'))"), "{sql}");
        let lock = lock(1_500, &[-5, 7]);
        assert!(
            lock.contains(
                "pg_catalog.pg_advisory_xact_lock(-5),\n       pg_catalog.pg_advisory_xact_lock(7);"
            ),
            "{lock}"
        );
        assert!(lock.contains("pg_catalog.set_config('lock_timeout', '1500', true)"), "{lock}");
        assert_eq!(lock.matches(';').count(), 1);
        assert!(reserve(&[0, 255]).contains("ARRAY[0, 255]::smallint[]"));
        assert!(update(&[(&key, true, 3, 60_000)], 17).contains("'hex'), true, 3::bigint, 60000::bigint)"));
        assert!(update(&[(&key, true, 3, 60_000)], 17).contains("17::bigint"));
        assert!(update(&[(&key, true, 3, 60_000)], 17).contains("pg_catalog.count(*) = 1 THEN"));
        assert!(
            insert(&[(&key, 9_223_372_036_854_775_807, 5)], -3)
                .contains("'hex'), 9223372036854775807::bigint, 5::bigint)")
        );
        assert!(cleanup(250).contains("LIMIT 250"));
        assert!(peek(&key).contains("w.counter_key = pg_catalog.decode('ab00"), "{}", peek(&key));
        assert!(reset(&key).contains("w.counter_key = pg_catalog.decode('ab00"), "{}", reset(&key));
    }
}
