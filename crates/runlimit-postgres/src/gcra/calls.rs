//! The GCRA admission protocol: statements prepared on each connection (see
//! [`crate::prepared`]), sent through [`crate::script::run`] as simple-query round trips.
//!
//! # Two round trips, six statements
//!
//! 1. `BEGIN ISOLATION LEVEL READ COMMITTED, READ WRITE`, `EXECUTE runlimit_settings_v1` (the
//!    transaction-local `statement_timeout`, `lock_timeout`,
//!    `plan_cache_mode = force_generic_plan` and `enable_seqscan = off` (one generic plan per
//!    statement, an index scan even while a table is small), a statement of their own, so `statement_timeout`
//!    is armed when the next statement starts and bounds all its lock waits together),
//!    `EXECUTE runlimit_gcra_lock_v1` (the ledger rows of every shard the batch touches,
//!    `FOR UPDATE` in ascending shard order, with their row counts and watermarks) and
//!    `EXECUTE runlimit_gcra_read_v1` (in a statement of its own, so its `READ COMMITTED`
//!    snapshot is taken after the locks: the stored arrival times and the whole-millisecond
//!    clock sample, taken after the locks);
//! 2. `EXECUTE runlimit_gcra_write_v1` (advance the watermarks of the locked shards, update the
//!    stored rows, verify the row count) or `runlimit_gcra_write_inserts_v1` (the same, and
//!    insert the new rows in ascending key order) and `COMMIT`, or just `ROLLBACK` after a
//!    denial.
//!
//! A one-check admission runs the settings and the lock of one shard
//! (`runlimit_gcra_lock_one_v1`), then its own preflight (`super::one`: a provisional update;
//! `COMMIT` alone for a stored key). The previous release read and wrote one key through
//! `runlimit_gcra_read_one_v1` and `_write_one_v1`, which the hidden previous-protocol test
//! mode still sends; `_write_one_insert_v1` inserts a new key for both.
//!
//! PostgreSQL plans these statements once per connection; per admission it parses statement
//! names and literal arguments. The statement protocol of earlier releases (`super::sql`)
//! takes the same locks in the same order, writes the same rows and verifies the same way (a
//! missed row makes the write statement fail with SQLSTATE 22P02 and a message naming
//! Runlimit before `COMMIT` runs). Arguments are rendered as in [`crate::fixed_window`]'s
//! calls: exact types, schema-qualified names, integers and hexadecimal digits only.

use crate::{
    error::CheckPhase,
    gcra::GcraWrite,
    prepared::{Prepared, Statement},
    script::{array_literal, push_bytea},
};

/// The transaction-local `statement_timeout` and `lock_timeout` (`$1`, milliseconds as text),
/// `plan_cache_mode = force_generic_plan` and `enable_seqscan = off`: one row.
pub(crate) static SETTINGS: Prepared =
    Prepared { name: "runlimit_settings_v1", prepare: include_str!("../sql/settings_prepare.sql") };

/// Locks the ledger rows of the shards `$1` in ascending order: one row per shard, `(shard,
/// row_count, watermark_ms)`.
pub(crate) static LOCK: Prepared =
    Prepared { name: "runlimit_gcra_lock_v1", prepare: include_str!("../sql/gcra_prepare_lock.sql") };

/// The stored arrival times of the keys `$1` and the clock sample: a row `(ordinal, tat_ms,
/// tat_remainder, now_ms)` per stored key (`ordinal` its 1-based position in `$1`), or one row
/// with null key columns when none is stored.
pub(crate) static READ: Prepared =
    Prepared { name: "runlimit_gcra_read_v1", prepare: include_str!("../sql/gcra_prepare_read.sql") };

/// The writes of a batch without new keys: the watermarks of the shards `$2` advanced to `$1`,
/// the rows of the keys `$3` updated to `($4, $5, $6)[i]`; fails unless every row was updated.
pub(crate) static WRITE: Prepared =
    Prepared { name: "runlimit_gcra_write_v1", prepare: include_str!("../sql/gcra_prepare_write.sql") };

/// [`WRITE`], and the rows of the keys `$7` inserted with `($8, $9, $10)[i]`.
pub(crate) static WRITE_INSERTS: Prepared = Prepared {
    name: "runlimit_gcra_write_inserts_v1",
    prepare: include_str!("../sql/gcra_prepare_write_inserts.sql"),
};

/// [`LOCK`] of one shard (`$1`).
pub(crate) static LOCK_ONE: Prepared =
    Prepared { name: "runlimit_gcra_lock_one_v1", prepare: include_str!("../sql/gcra_prepare_lock_one.sql") };

/// [`READ`] of one key (`$1`): one row, its ordinal 1 when the key is stored, else null.
pub(crate) static READ_ONE: Prepared =
    Prepared { name: "runlimit_gcra_read_one_v1", prepare: include_str!("../sql/gcra_prepare_read_one.sql") };

/// [`WRITE`] of one stored key (`$3`) in the shard `$2`, with `($4, $5, $6)`.
pub(crate) static WRITE_ONE: Prepared = Prepared {
    name: "runlimit_gcra_write_one_v1",
    prepare: include_str!("../sql/gcra_prepare_write_one.sql"),
};

/// The write of one new key (`$3`, inserted with `($4, $5, $6)`) in the shard `$2`.
pub(crate) static WRITE_ONE_INSERT: Prepared = Prepared {
    name: "runlimit_gcra_write_one_insert_v1",
    prepare: include_str!("../sql/gcra_prepare_write_one_insert.sql"),
};

/// The provisional admission of one stored key (see [`super::one`]): the key `$1` of shard
/// `$2`, an increment of `$3` whole milliseconds and `$4` (below `$5` = Q) units of `1/Q` ms,
/// and the burst's span `$6` ms and `$7` units of `1/Q` ms (B × P, in the same parts). One row:
/// `clock_ms`, `now_ms` (the clock clamped to the shard's watermark), the stored arrival time
/// (`tat_ms`, `tat_remainder`; null when the key has no row) and the arrival time written
/// (`next_tat_ms`, `next_tat_remainder`; null unless the check fits the burst and the row was
/// updated).
pub(crate) static PREFLIGHT_ONE: Prepared = Prepared {
    name: "runlimit_gcra_preflight_one_v2",
    prepare: include_str!("../sql/gcra_prepare_preflight_one.sql"),
};

/// `EXECUTE runlimit_gcra_preflight_one_v2(..)`: the arguments of [`PREFLIGHT_ONE`].
pub(crate) fn preflight_one(key: &[u8; 64], shard: i16, increment: super::one::Increment) -> String {
    let mut sql = format!("EXECUTE {}(", PREFLIGHT_ONE.name);
    push_bytea(&mut sql, key);
    let super::one::Increment { millis, remainder, quota, ceiling_millis, ceiling_remainder } = increment;
    sql.push_str(&format!(
        ", {shard}::smallint, {millis}::bigint, {remainder}::bigint, {quota}::bigint, {ceiling_millis}::bigint, \
         {ceiling_remainder}::bigint);\n"
    ));
    sql
}

/// The statements the write round trip of a one-check admission (`batch` false) or of a batch
/// may execute.
pub(crate) fn writes(batch: bool) -> [&'static Prepared; 2] {
    if batch { [&WRITE, &WRITE_INSERTS] } else { [&WRITE_ONE, &WRITE_ONE_INSERT] }
}

/// The first statements of every GCRA admission's first round trip: `BEGIN`, the settings
/// (both timeouts `timeout_ms` milliseconds) and the lock of `shards` ([`lock`]).
pub(crate) fn opening(timeout_ms: u128, shards: &[i16], batch: bool) -> [Statement; 3] {
    let (lock_sql, lock_prepared) = lock(shards, batch);
    [
        Statement { sql: crate::script::begin().to_owned(), phase: CheckPhase::Begin, executes: None },
        Statement { sql: settings(timeout_ms), phase: CheckPhase::Begin, executes: Some(&SETTINGS) },
        Statement { sql: lock_sql, phase: CheckPhase::Lock, executes: Some(lock_prepared) },
    ]
}

/// `EXECUTE runlimit_settings_v1(..)` with both timeouts `timeout_ms` milliseconds.
pub(crate) fn settings(timeout_ms: u128) -> String {
    format!("EXECUTE {}('{timeout_ms}'::pg_catalog.text);\n", SETTINGS.name)
}

/// The lock statement of `shards` (ascending, distinct) and the statement it executes:
/// [`LOCK_ONE`] for a one-check admission (`batch` false), else [`LOCK`].
pub(crate) fn lock(shards: &[i16], batch: bool) -> (String, &'static Prepared) {
    match shards {
        [shard] if !batch => (format!("EXECUTE {}({shard}::smallint);\n", LOCK_ONE.name), &LOCK_ONE),
        _ => (format!("EXECUTE {}({}::smallint[]);\n", LOCK.name, array_literal(shards)), &LOCK),
    }
}

/// The read statement of `keys` and the statement it executes: [`READ_ONE`] for one key, else
/// [`READ`].
pub(crate) fn read(keys: &[[u8; 64]]) -> (String, &'static Prepared) {
    if let [key] = keys {
        let mut sql = format!("EXECUTE {}(", READ_ONE.name);
        push_bytea(&mut sql, key);
        sql.push_str(");\n");
        return (sql, &READ_ONE);
    }
    let mut sql = format!("EXECUTE {}(", READ.name);
    push_keys(&mut sql, keys.iter());
    sql.push_str(");\n");
    (sql, &READ)
}

/// Appends `ARRAY[pg_catalog.decode('<hex>', 'hex'), ..]::pg_catalog.bytea[]` of `keys`.
fn push_keys<'a>(sql: &mut String, keys: impl Iterator<Item = &'a [u8; 64]>) {
    sql.push_str("ARRAY[");
    for (index, key) in keys.enumerate() {
        if index > 0 {
            sql.push_str(", ");
        }
        push_bytea(sql, key);
    }
    sql.push_str("]::pg_catalog.bytea[]");
}

/// Appends `, '{..}'::bigint[]` three times: the arrival times and expiries of `writes`.
fn push_values<'a>(sql: &mut String, writes: impl Iterator<Item = &'a GcraWrite> + Clone) {
    for values in [
        array_literal(writes.clone().map(|write| write.tat.tat_ms)),
        array_literal(writes.clone().map(|write| write.tat.tat_remainder)),
        array_literal(writes.map(|write| write.expires_at_ms)),
    ] {
        sql.push_str(", ");
        sql.push_str(&values);
        sql.push_str("::bigint[]");
    }
}

/// The write statement of an allowed batch decided at `now_ms`: advances the watermarks of
/// `shards` and writes one row per key ([`WRITE_ONE`] or [`WRITE_ONE_INSERT`] for a one-check
/// admission; for a batch [`WRITE`], or [`WRITE_INSERTS`] when a key is new).
pub(crate) fn write(keys: &[[u8; 64]], writes: &[GcraWrite], shards: &[i16], now_ms: u64) -> String {
    if let ([key], [write], [shard]) = (keys, writes, shards) {
        let statement = if write.insert { &WRITE_ONE_INSERT } else { &WRITE_ONE };
        let mut sql = format!("EXECUTE {}({now_ms}::bigint, {shard}::smallint, ", statement.name);
        push_bytea(&mut sql, key);
        sql.push_str(&format!(
            ", {}::bigint, {}::bigint, {}::bigint);\n",
            write.tat.tat_ms, write.tat.tat_remainder, write.expires_at_ms
        ));
        return sql;
    }
    let pairs = || keys.iter().zip(writes);
    let updates = || pairs().filter(|(_, write)| !write.insert);
    let inserts = || pairs().filter(|(_, write)| write.insert);
    let statement = if inserts().next().is_some() { &WRITE_INSERTS } else { &WRITE };
    let mut sql =
        format!("EXECUTE {}({now_ms}::bigint, {}::smallint[], ", statement.name, array_literal(shards));
    push_keys(&mut sql, updates().map(|(key, _)| key));
    push_values(&mut sql, updates().map(|(_, write)| write));
    if statement.name == WRITE_INSERTS.name {
        sql.push_str(", ");
        push_keys(&mut sql, inserts().map(|(key, _)| key));
        push_values(&mut sql, inserts().map(|(_, write)| write));
    }
    sql.push_str(");\n");
    sql
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gcra::StoredTat;

    #[test]
    fn renders_calls_of_exact_types() {
        let key = [0xAB; 64];
        let decoded = format!("pg_catalog.decode('{}', 'hex')", "ab".repeat(64));
        assert_eq!(settings(1_500), "EXECUTE runlimit_settings_v1('1500'::pg_catalog.text);\n");
        assert_eq!(lock(&[0, 7, 255], true).0, "EXECUTE runlimit_gcra_lock_v1('{0,7,255}'::smallint[]);\n");
        assert_eq!(lock(&[7], true).1.name, LOCK.name);
        assert_eq!(
            lock(&[7], false),
            ("EXECUTE runlimit_gcra_lock_one_v1(7::smallint);\n".to_owned(), &LOCK_ONE)
        );
        assert_eq!(
            read(&[key, key]).0,
            format!("EXECUTE runlimit_gcra_read_v1(ARRAY[{decoded}, {decoded}]::pg_catalog.bytea[]);\n")
        );
        assert_eq!(read(&[key]), (format!("EXECUTE runlimit_gcra_read_one_v1({decoded});\n"), &READ_ONE));
        let insert =
            GcraWrite { insert: true, tat: StoredTat { tat_ms: 10, tat_remainder: 2 }, expires_at_ms: 11 };
        let update =
            GcraWrite { insert: false, tat: StoredTat { tat_ms: 20, tat_remainder: 3 }, expires_at_ms: 21 };
        assert_eq!(
            write(&[key, key], &[insert, update], &[171], 9),
            format!(
                "EXECUTE runlimit_gcra_write_inserts_v1(9::bigint, '{{171}}'::smallint[], \
                 ARRAY[{decoded}]::pg_catalog.bytea[], '{{20}}'::bigint[], '{{3}}'::bigint[], '{{21}}'::bigint[], \
                 ARRAY[{decoded}]::pg_catalog.bytea[], '{{10}}'::bigint[], '{{2}}'::bigint[], '{{11}}'::bigint[]);\n"
            )
        );
        assert_eq!(
            write(&[key, key], &[update, update], &[171], 9),
            format!(
                "EXECUTE runlimit_gcra_write_v1(9::bigint, '{{171}}'::smallint[], \
                 ARRAY[{decoded}, {decoded}]::pg_catalog.bytea[], '{{20,20}}'::bigint[], '{{3,3}}'::bigint[], \
                 '{{21,21}}'::bigint[]);\n"
            )
        );
        assert_eq!(
            write(&[key], &[update], &[171], 9),
            format!(
                "EXECUTE runlimit_gcra_write_one_v1(9::bigint, 171::smallint, {decoded}, 20::bigint, 3::bigint, 21::bigint);\n"
            )
        );
        assert_eq!(
            write(&[key], &[insert], &[171], 9),
            format!(
                "EXECUTE runlimit_gcra_write_one_insert_v1(9::bigint, 171::smallint, {decoded}, 10::bigint, 2::bigint, \
                 11::bigint);\n"
            )
        );
        assert_eq!(writes(false), [&WRITE_ONE, &WRITE_ONE_INSERT]);
        assert_eq!(writes(true), [&WRITE, &WRITE_INSERTS]);
        let increment = crate::gcra::one::Increment {
            millis: 333,
            remainder: 1,
            quota: 3,
            ceiling_millis: 666,
            ceiling_remainder: 2,
        };
        assert_eq!(
            preflight_one(&key, 171, increment),
            format!(
                "EXECUTE runlimit_gcra_preflight_one_v2({decoded}, 171::smallint, 333::bigint, 1::bigint, \
                 3::bigint, 666::bigint, 2::bigint);\n"
            )
        );
        for statement in [
            &PREFLIGHT_ONE,
            &SETTINGS,
            &LOCK,
            &READ,
            &WRITE,
            &WRITE_INSERTS,
            &LOCK_ONE,
            &READ_ONE,
            &WRITE_ONE,
            &WRITE_ONE_INSERT,
        ] {
            assert!(
                statement.prepare.starts_with(&format!("PREPARE {} (", statement.name)),
                "{}",
                statement.name
            );
            assert!(statement.prepare.trim_end().ends_with(';'), "{}", statement.name);
            assert_eq!(statement.prepare.matches(';').count(), 1, "{}", statement.name);
        }
    }
}
