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

use std::sync::LazyLock;

use crate::{
    error::CheckPhase,
    gcra::{GcraWrite, StoredTat},
    prepared::{Prepared, Statement},
    script::{array_literal, push_bytea},
};

/// Which capacity ledger the statements lock: the one of the ledger-lock protocol
/// (`public.runlimit_gcra_shards`), or the one the row-lock protocol moves its rows to
/// (`public.runlimit_gcra_ledger`; see `super::rowlock`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Ledger {
    /// `public.runlimit_gcra_shards`, until the protocol is switched.
    Shards,
    /// `public.runlimit_gcra_ledger`, after.
    RowLocks,
}

/// The ledger-lock protocol's ledger table, as every statement names it.
pub(crate) const SHARDS_TABLE: &str = "public.runlimit_gcra_shards";
/// The row-lock protocol's ledger table.
pub(crate) const LEDGER_TABLE: &str = "public.runlimit_gcra_ledger";

impl Ledger {
    /// `sql` for this ledger: the ledger-lock protocol's text as it is, or with its ledger
    /// table renamed.
    pub(crate) fn on(self, sql: &str) -> String {
        match self {
            Self::Shards => sql.to_owned(),
            Self::RowLocks => sql.replace(SHARDS_TABLE, LEDGER_TABLE),
        }
    }
}

/// The statements of a batch (and of a one-check admission outside the one-check statements'
/// range) on one ledger.
#[derive(Debug)]
pub(crate) struct Admission {
    /// Whether the writes compare each stored row with the time the read returned and refuse,
    /// before `COMMIT`, when one changed (the row-lock protocol's optimistic batches: see
    /// [`ROW_LOCK_WRITE`]); the one-key write statements are then the batch ones.
    pub(crate) compare_and_set: bool,
    pub(crate) lock: &'static Prepared,
    pub(crate) lock_one: &'static Prepared,
    pub(crate) read: &'static Prepared,
    pub(crate) read_one: &'static Prepared,
    pub(crate) write: &'static Prepared,
    pub(crate) write_inserts: &'static Prepared,
    pub(crate) write_one: &'static Prepared,
    pub(crate) write_one_insert: &'static Prepared,
}

static SHARDS_ADMISSION: Admission = Admission {
    compare_and_set: false,
    lock: &LOCK,
    lock_one: &LOCK_ONE,
    read: &READ,
    read_one: &READ_ONE,
    write: &WRITE,
    write_inserts: &WRITE_INSERTS,
    write_one: &WRITE_ONE,
    write_one_insert: &WRITE_ONE_INSERT,
};

/// A ledger-lock statement moved to the row-lock protocol's ledger, under the name `name`.
///
/// Derived from the ledger-lock text rather than kept in a second file, so the two protocols'
/// statements cannot drift apart; the text is built once per process and lives as long as it
/// (`String::leak`), as the `&'static` texts of every other prepared statement do.
fn on_ledger(statement: &Prepared, name: &'static str) -> &'static Prepared {
    let prepare = Ledger::RowLocks.on(statement.prepare).replacen(statement.name, name, 1);
    Box::leak(Box::new(Prepared { name, prepare: prepare.leak() }))
}

/// The row-lock ledger's locks, shared by both batch statement sets.
static LEDGER_LOCK: LazyLock<&'static Prepared> =
    LazyLock::new(|| on_ledger(&LOCK, "runlimit_gcra_ledger_lock_v1"));
static LEDGER_LOCK_ONE: LazyLock<&'static Prepared> =
    LazyLock::new(|| on_ledger(&LOCK_ONE, "runlimit_gcra_ledger_lock_one_v1"));

/// Row-lock batches, optimistic: the keys' rows read without a row lock (after the ledger
/// locks, which exclude every other writer but one-check updates), written only if unchanged.
static ROW_LOCK_ADMISSION: LazyLock<Admission> = LazyLock::new(|| Admission {
    compare_and_set: true,
    lock: *LEDGER_LOCK,
    lock_one: *LEDGER_LOCK_ONE,
    read: &READ,
    read_one: &READ_ONE,
    write: &ROW_LOCK_WRITE,
    write_inserts: &ROW_LOCK_WRITE_INSERTS,
    write_one: &ROW_LOCK_WRITE,
    write_one_insert: &ROW_LOCK_WRITE_INSERTS,
});

/// Row-lock batches, pessimistic: the keys' rows row-locked by the read, so nothing changes
/// them before the writes (the last attempt of a batch whose optimistic writes were refused).
static ROW_LOCK_LOCKING_ADMISSION: LazyLock<Admission> = LazyLock::new(|| Admission {
    compare_and_set: false,
    lock: *LEDGER_LOCK,
    lock_one: *LEDGER_LOCK_ONE,
    read: &ROW_LOCK_READ,
    read_one: &ROW_LOCK_READ_ONE,
    write: on_ledger(&WRITE, "runlimit_gcra_ledger_write_v1"),
    write_inserts: on_ledger(&WRITE_INSERTS, "runlimit_gcra_ledger_write_inserts_v1"),
    write_one: on_ledger(&WRITE_ONE, "runlimit_gcra_ledger_write_one_v1"),
    write_one_insert: on_ledger(&WRITE_ONE_INSERT, "runlimit_gcra_ledger_write_one_insert_v1"),
});

/// The batch statements on `ledger`; on row locks, the optimistic ones unless `locking_read`.
pub(crate) fn admission(ledger: Ledger, locking_read: bool) -> &'static Admission {
    match (ledger, locking_read) {
        (Ledger::Shards, _) => &SHARDS_ADMISSION,
        (Ledger::RowLocks, false) => &ROW_LOCK_ADMISSION,
        (Ledger::RowLocks, true) => &ROW_LOCK_LOCKING_ADMISSION,
    }
}

/// The row-lock protocol's optimistic batch write without new keys: [`WRITE`] on the row-lock
/// ledger, each row `$3[i]` updated only while it still holds the arrival time `($7, $8)[i]` the
/// read returned; fails with SQLSTATE 22P02 and the message `runlimit: a gcra row changed since
/// it was read` unless every row was updated (a one-check admission, which takes no ledger lock,
/// changed one since the read), before `COMMIT` can run. Its own text, where the pessimistic
/// set's writes are derived from the ledger-lock ones ([`on_ledger`]): the comparison is what it
/// adds, and it changes what the statement refuses.
pub(crate) static ROW_LOCK_WRITE: Prepared = Prepared {
    name: "runlimit_gcra_rowlock_write_v1",
    prepare: include_str!("../sql/gcra_prepare_rowlock_write.sql"),
};

/// [`ROW_LOCK_WRITE`] with new keys: [`WRITE_INSERTS`] on the row-lock ledger, the expected
/// arrival times of the updated rows in `($11, $12)[i]`.
pub(crate) static ROW_LOCK_WRITE_INSERTS: Prepared = Prepared {
    name: "runlimit_gcra_rowlock_write_inserts_v1",
    prepare: include_str!("../sql/gcra_prepare_rowlock_write_inserts.sql"),
};

/// [`READ`] that also row-locks the stored keys (`FOR NO KEY UPDATE`, in key order) and samples
/// the clock after those locks: the row-lock protocol's batch read, which must exclude
/// one-check admissions, since those take no ledger lock.
pub(crate) static ROW_LOCK_READ: Prepared = Prepared {
    name: "runlimit_gcra_rowlock_read_v1",
    prepare: include_str!("../sql/gcra_prepare_rowlock_read.sql"),
};

/// [`ROW_LOCK_READ`] of one key.
pub(crate) static ROW_LOCK_READ_ONE: Prepared = Prepared {
    name: "runlimit_gcra_rowlock_read_one_v1",
    prepare: include_str!("../sql/gcra_prepare_rowlock_read_one.sql"),
};

/// The row-lock protocol's one-check admission (see `super::rowlock`): the key `$1` of shard
/// `$2`, an increment of `$3` whole milliseconds and `$4` (below `$5` = Q) units of `1/Q` ms, and
/// the slack `$6` ms and `$7` units of `1/Q` ms ((B − cost) × P in the same parts): the check
/// fits when the stored arrival time is at most `now` plus the slack. One row: `clock_ms`,
/// `now_ms` (clamped to the shard's watermark), the shard's `row_count` (read without a lock),
/// the arrival time the statement's snapshot holds (`tat_ms`, `tat_remainder`; null without a
/// row) and the one written (`next_tat_ms`, `next_tat_remainder`; null unless the row was
/// updated). No row at all when the ledger row is missing.
pub(crate) static ROW_LOCK_ADMIT_ONE: Prepared = Prepared {
    name: "runlimit_gcra_rowlock_admit_one_v1",
    prepare: include_str!("../sql/gcra_prepare_rowlock_admit_one.sql"),
};

/// The row-lock protocol's insert of one new key: at `$1` (the admission's clamped time) in
/// shard `$2`, the key `$3` with `($4, $5, $6)`, provided the shard's ledger row (locked here)
/// holds fewer than `$7` rows and a watermark at most `$1`, and no row of the key exists; fails
/// with SQLSTATE 22P02 and a message naming Runlimit otherwise, before `COMMIT` can run.
pub(crate) static ROW_LOCK_INSERT_ONE: Prepared = Prepared {
    name: "runlimit_gcra_rowlock_insert_one_v1",
    prepare: include_str!("../sql/gcra_prepare_rowlock_insert_one.sql"),
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
    let super::one::Increment { millis, remainder, quota, ceiling_millis, ceiling_remainder, .. } = increment;
    sql.push_str(&format!(
        ", {shard}::smallint, {millis}::bigint, {remainder}::bigint, {quota}::bigint, {ceiling_millis}::bigint, \
         {ceiling_remainder}::bigint);\n"
    ));
    sql
}

/// `EXECUTE runlimit_gcra_rowlock_admit_one_v1(..)`: the arguments of [`ROW_LOCK_ADMIT_ONE`].
pub(crate) fn row_lock_admit_one(key: &[u8; 64], shard: i16, increment: super::one::Increment) -> String {
    let mut sql = format!("EXECUTE {}(", ROW_LOCK_ADMIT_ONE.name);
    push_bytea(&mut sql, key);
    let super::one::Increment { millis, remainder, quota, slack_millis, slack_remainder, .. } = increment;
    sql.push_str(&format!(
        ", {shard}::smallint, {millis}::bigint, {remainder}::bigint, {quota}::bigint, {slack_millis}::bigint, \
         {slack_remainder}::bigint);\n"
    ));
    sql
}

/// `EXECUTE runlimit_gcra_rowlock_insert_one_v1(..)`: the arguments of [`ROW_LOCK_INSERT_ONE`].
pub(crate) fn row_lock_insert_one(
    key: &[u8; 64],
    shard: i16,
    write: &GcraWrite,
    now_ms: u64,
    maximum_rows: u32,
) -> String {
    let mut sql = format!("EXECUTE {}({now_ms}::bigint, {shard}::smallint, ", ROW_LOCK_INSERT_ONE.name);
    push_bytea(&mut sql, key);
    sql.push_str(&format!(
        ", {}::bigint, {}::bigint, {}::bigint, {maximum_rows}::integer);\n",
        write.tat.tat_ms, write.tat.tat_remainder, write.expires_at_ms
    ));
    sql
}

/// The statements the write round trip of a one-check admission (`batch` false) or of a batch
/// may execute on `ledger`.
pub(crate) fn writes(set: &'static Admission, batch: bool) -> [&'static Prepared; 2] {
    if batch { [set.write, set.write_inserts] } else { [set.write_one, set.write_one_insert] }
}

/// The first statements of every GCRA admission's first round trip that locks ledger rows:
/// `BEGIN`, the settings (both timeouts `timeout_ms` milliseconds) and the lock of `shards` on
/// `ledger` ([`lock`]).
pub(crate) fn opening(
    set: &'static Admission,
    timeout_ms: u128,
    shards: &[i16],
    batch: bool,
) -> [Statement; 3] {
    let (lock_sql, lock_prepared) = lock(set, shards, batch);
    let [begin, settings] = begin_and_settings(timeout_ms);
    [begin, settings, Statement { sql: lock_sql, phase: CheckPhase::Lock, executes: Some(lock_prepared) }]
}

/// `BEGIN` and the settings (both timeouts `timeout_ms` milliseconds).
pub(crate) fn begin_and_settings(timeout_ms: u128) -> [Statement; 2] {
    [
        Statement { sql: crate::script::begin().to_owned(), phase: CheckPhase::Begin, executes: None },
        Statement { sql: settings(timeout_ms), phase: CheckPhase::Begin, executes: Some(&SETTINGS) },
    ]
}

/// `EXECUTE runlimit_settings_v1(..)` with both timeouts `timeout_ms` milliseconds.
pub(crate) fn settings(timeout_ms: u128) -> String {
    format!("EXECUTE {}('{timeout_ms}'::pg_catalog.text);\n", SETTINGS.name)
}

/// The lock statement of `shards` (ascending, distinct) on `ledger` and the statement it
/// executes: [`LOCK_ONE`] (or its row-lock twin) for a one-check admission (`batch` false), else
/// [`LOCK`].
pub(crate) fn lock(set: &'static Admission, shards: &[i16], batch: bool) -> (String, &'static Prepared) {
    match shards {
        [shard] if !batch => (format!("EXECUTE {}({shard}::smallint);\n", set.lock_one.name), set.lock_one),
        _ => (format!("EXECUTE {}({}::smallint[]);\n", set.lock.name, array_literal(shards)), set.lock),
    }
}

/// The read statement of `keys` on `ledger` and the statement it executes: [`READ_ONE`] (or
/// [`ROW_LOCK_READ_ONE`]) for one key, else [`READ`] (or [`ROW_LOCK_READ`]).
pub(crate) fn read(set: &'static Admission, keys: &[[u8; 64]]) -> (String, &'static Prepared) {
    if let [key] = keys {
        let mut sql = format!("EXECUTE {}(", set.read_one.name);
        push_bytea(&mut sql, key);
        sql.push_str(");\n");
        return (sql, set.read_one);
    }
    let mut sql = format!("EXECUTE {}(", set.read.name);
    push_keys(&mut sql, keys.iter());
    sql.push_str(");\n");
    (sql, set.read)
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
pub(crate) fn write(
    set: &'static Admission,
    keys: &[[u8; 64]],
    writes: &[GcraWrite],
    stored: &[Option<StoredTat>],
    shards: &[i16],
    now_ms: u64,
) -> String {
    if let ([key], [write], [shard], false) = (keys, writes, shards, set.compare_and_set) {
        let statement = if write.insert { set.write_one_insert } else { set.write_one };
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
    let statement = if inserts().next().is_some() { set.write_inserts } else { set.write };
    let mut sql =
        format!("EXECUTE {}({now_ms}::bigint, {}::smallint[], ", statement.name, array_literal(shards));
    push_keys(&mut sql, updates().map(|(key, _)| key));
    push_values(&mut sql, updates().map(|(_, write)| write));
    if statement.name == set.write_inserts.name {
        sql.push_str(", ");
        push_keys(&mut sql, inserts().map(|(key, _)| key));
        push_values(&mut sql, inserts().map(|(_, write)| write));
    }
    if set.compare_and_set {
        // The arrival times the read returned for the updated keys, in the same order.
        let previous = || {
            writes
                .iter()
                .zip(stored)
                .filter(|(write, _)| !write.insert)
                .map(|(_, stored)| stored.unwrap_or(NONE))
        };
        for values in [
            array_literal(previous().map(|tat| tat.tat_ms)),
            array_literal(previous().map(|tat| tat.tat_remainder)),
        ] {
            sql.push_str(", ");
            sql.push_str(&values);
            sql.push_str("::bigint[]");
        }
    }
    sql.push_str(");\n");
    sql
}

/// No arrival time a row can hold (`tat_ms` is never negative): what an updated key without a
/// read time is compared with, so its write is refused rather than made blind.
const NONE: StoredTat = StoredTat { tat_ms: -1, tat_remainder: -1 };

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gcra::StoredTat;

    #[test]
    fn renders_calls_of_exact_types() {
        let key = [0xAB; 64];
        let decoded = format!("pg_catalog.decode('{}', 'hex')", "ab".repeat(64));
        assert_eq!(settings(1_500), "EXECUTE runlimit_settings_v1('1500'::pg_catalog.text);\n");
        assert_eq!(
            lock(admission(Ledger::Shards, false), &[0, 7, 255], true).0,
            "EXECUTE runlimit_gcra_lock_v1('{0,7,255}'::smallint[]);\n"
        );
        assert_eq!(lock(admission(Ledger::Shards, false), &[7], true).1.name, LOCK.name);
        assert_eq!(
            lock(admission(Ledger::Shards, false), &[7], false),
            ("EXECUTE runlimit_gcra_lock_one_v1(7::smallint);\n".to_owned(), &LOCK_ONE)
        );
        assert_eq!(
            read(admission(Ledger::Shards, false), &[key, key]).0,
            format!("EXECUTE runlimit_gcra_read_v1(ARRAY[{decoded}, {decoded}]::pg_catalog.bytea[]);\n")
        );
        assert_eq!(
            read(admission(Ledger::Shards, false), &[key]),
            (format!("EXECUTE runlimit_gcra_read_one_v1({decoded});\n"), &READ_ONE)
        );
        let insert =
            GcraWrite { insert: true, tat: StoredTat { tat_ms: 10, tat_remainder: 2 }, expires_at_ms: 11 };
        let update =
            GcraWrite { insert: false, tat: StoredTat { tat_ms: 20, tat_remainder: 3 }, expires_at_ms: 21 };
        assert_eq!(
            write(admission(Ledger::Shards, false), &[key, key], &[insert, update], &[], &[171], 9),
            format!(
                "EXECUTE runlimit_gcra_write_inserts_v1(9::bigint, '{{171}}'::smallint[], \
                 ARRAY[{decoded}]::pg_catalog.bytea[], '{{20}}'::bigint[], '{{3}}'::bigint[], '{{21}}'::bigint[], \
                 ARRAY[{decoded}]::pg_catalog.bytea[], '{{10}}'::bigint[], '{{2}}'::bigint[], '{{11}}'::bigint[]);\n"
            )
        );
        assert_eq!(
            write(admission(Ledger::Shards, false), &[key, key], &[update, update], &[], &[171], 9),
            format!(
                "EXECUTE runlimit_gcra_write_v1(9::bigint, '{{171}}'::smallint[], \
                 ARRAY[{decoded}, {decoded}]::pg_catalog.bytea[], '{{20,20}}'::bigint[], '{{3,3}}'::bigint[], \
                 '{{21,21}}'::bigint[]);\n"
            )
        );
        assert_eq!(
            write(admission(Ledger::Shards, false), &[key], &[update], &[], &[171], 9),
            format!(
                "EXECUTE runlimit_gcra_write_one_v1(9::bigint, 171::smallint, {decoded}, 20::bigint, 3::bigint, 21::bigint);\n"
            )
        );
        assert_eq!(
            write(admission(Ledger::Shards, false), &[key], &[insert], &[], &[171], 9),
            format!(
                "EXECUTE runlimit_gcra_write_one_insert_v1(9::bigint, 171::smallint, {decoded}, 10::bigint, 2::bigint, \
                 11::bigint);\n"
            )
        );
        assert_eq!(writes(admission(Ledger::Shards, false), false), [&WRITE_ONE, &WRITE_ONE_INSERT]);
        assert_eq!(writes(admission(Ledger::Shards, false), true), [&WRITE, &WRITE_INSERTS]);
        let increment = crate::gcra::one::Increment {
            millis: 333,
            remainder: 1,
            quota: 3,
            ceiling_millis: 666,
            ceiling_remainder: 2,
            slack_millis: 333,
            slack_remainder: 1,
        };
        assert_eq!(
            preflight_one(&key, 171, increment),
            format!(
                "EXECUTE runlimit_gcra_preflight_one_v2({decoded}, 171::smallint, 333::bigint, 1::bigint, \
                 3::bigint, 666::bigint, 2::bigint);\n"
            )
        );
        // Row locks: optimistic batches compare the updated rows with the times read.
        let stored = [None, Some(StoredTat { tat_ms: 19, tat_remainder: 1 })];
        let optimistic = admission(Ledger::RowLocks, false);
        assert_eq!(
            write(optimistic, &[key, key], &[insert, update], &stored, &[171], 9),
            format!(
                "EXECUTE runlimit_gcra_rowlock_write_inserts_v1(9::bigint, '{{171}}'::smallint[], \
                 ARRAY[{decoded}]::pg_catalog.bytea[], '{{20}}'::bigint[], '{{3}}'::bigint[], '{{21}}'::bigint[], \
                 ARRAY[{decoded}]::pg_catalog.bytea[], '{{10}}'::bigint[], '{{2}}'::bigint[], '{{11}}'::bigint[], \
                 '{{19}}'::bigint[], '{{1}}'::bigint[]);\n"
            )
        );
        assert_eq!(
            write(optimistic, &[key], &[update], &stored[1..], &[171], 9),
            format!(
                "EXECUTE runlimit_gcra_rowlock_write_v1(9::bigint, '{{171}}'::smallint[], \
                 ARRAY[{decoded}]::pg_catalog.bytea[], '{{20}}'::bigint[], '{{3}}'::bigint[], '{{21}}'::bigint[], \
                 '{{19}}'::bigint[], '{{1}}'::bigint[]);\n"
            )
        );
        assert_eq!(writes(optimistic, false), [&ROW_LOCK_WRITE, &ROW_LOCK_WRITE_INSERTS]);
        assert_eq!(
            lock(optimistic, &[7], false).0,
            "EXECUTE runlimit_gcra_ledger_lock_one_v1(7::smallint);\n"
        );
        let locking = admission(Ledger::RowLocks, true);
        assert_eq!(read(locking, &[key]).1.name, ROW_LOCK_READ_ONE.name);
        assert_eq!(
            write(locking, &[key], &[update], &stored[1..], &[171], 9),
            format!(
                "EXECUTE runlimit_gcra_ledger_write_one_v1(9::bigint, 171::smallint, {decoded}, 20::bigint, 3::bigint, 21::bigint);\n"
            )
        );
        // The row-lock ledger's statements are the ledger-lock ones on the other table.
        assert!(locking.write.prepare.contains("UPDATE public.runlimit_gcra_ledger AS l"));
        assert!(!locking.write.prepare.contains("runlimit_gcra_shards"));
        for set in [optimistic, locking] {
            for statement in [
                set.lock,
                set.lock_one,
                set.read,
                set.read_one,
                set.write,
                set.write_inserts,
                set.write_one,
                set.write_one_insert,
                &ROW_LOCK_ADMIT_ONE,
                &ROW_LOCK_INSERT_ONE,
            ] {
                assert!(
                    statement.prepare.starts_with(&format!("PREPARE {} (", statement.name)),
                    "{}",
                    statement.name
                );
                assert_eq!(statement.prepare.matches(';').count(), 1, "{}", statement.name);
                assert!(!statement.prepare.contains("runlimit_gcra_shards"), "{}", statement.name);
            }
        }
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
