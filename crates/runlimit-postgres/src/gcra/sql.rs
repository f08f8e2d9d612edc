//! The GCRA v1 statement protocol of earlier releases: scripts built from the
//! `src/sql/gcra_*.sql` templates and sent through [`crate::script::run`] as simple-query
//! round trips. Admissions now run prepared statements (`super::calls`); these statements
//! remain for peek, reset and cleanup, and as the admission protocol of the hidden
//! `PostgresConfig::with_previous_admission_protocol`.
//!
//! # Admission: two round trips, six statements
//!
//! 1. `BEGIN`, the transaction-local settings (`statement_timeout`, `lock_timeout`,
//!    `search_path`), `gcra_lock.sql` (the ledger rows of every shard the batch touches,
//!    `FOR UPDATE` in ascending shard order — absent keys included, since the lock is on the
//!    shard, not the counter row) and `gcra_read.sql` (the stored arrival times and the
//!    whole-millisecond clock sample `floor(extract(epoch from clock_timestamp()) * 1000)`).
//!    The read is a separate statement so its `READ COMMITTED` snapshot is taken after the
//!    locks: it sees everything the previous holders of those shards committed.
//! 2. `gcra_write.sql` (advance the watermarks of the locked shards, update and insert the
//!    counter rows, verify the row counts before `COMMIT` can run) and `COMMIT`, or just
//!    `ROLLBACK` after a denial.
//!
//! # Cleanup: three round trips
//!
//! 1. `BEGIN`, settings (also `enable_seqscan = off`, see `cleanup_expired`), and
//!    `gcra_discover.sql`: one probe of the shard/expiry index per ledger row (at most 256),
//!    each under that shard's clamped clock `GREATEST(watermark_ms, clock)`, locking the ledger
//!    rows of shards with an expired row in ascending order with `SKIP LOCKED`.
//! 2. `gcra_delete.sql`: per locked shard at most `maximum_rows` eligible rows (oldest first),
//!    then the globally oldest `maximum_rows` of those, deleted; the watermarks of the locked
//!    shards advance to the time used.
//! 3. `COMMIT`.
//!
//! Values are rendered only as integers and hexadecimal digits, as in [`crate::script`].

use crate::{
    gcra::GcraWrite,
    script::{ordinal_keys, push_bytea},
};

const LOCK_SQL: &str = include_str!("../sql/gcra_lock.sql");
const READ_SQL: &str = include_str!("../sql/gcra_read.sql");
const WRITE_SQL: &str = include_str!("../sql/gcra_write.sql");
const CLEANUP_SETTINGS_SQL: &str = include_str!("../sql/gcra_cleanup_settings.sql");
const DISCOVER_SQL: &str = include_str!("../sql/gcra_discover.sql");
const DELETE_SQL: &str = include_str!("../sql/gcra_delete.sql");
const PEEK_SQL: &str = include_str!("../sql/gcra_peek.sql");
const RESET_SQL: &str = include_str!("../sql/gcra_reset.sql");

fn join<T: ToString>(values: &[T]) -> String {
    values.iter().map(T::to_string).collect::<Vec<_>>().join(", ")
}

/// Locks the ledger rows of `shards` (ascending, distinct) and returns `shard`, `row_count`
/// and `watermark_ms` for each.
pub(crate) fn lock(shards: &[i16]) -> String {
    LOCK_SQL.replace("{shards}", &join(shards))
}

/// Reads the arrival time of `key` and the watermark of its shard `shard` without locking
/// either, and samples the clock: exactly one row, with null `tat_ms` and `tat_remainder`
/// when no state is stored.
pub(crate) fn peek(key: &[u8; 64], shard: i16) -> String {
    PEEK_SQL.replace("{key}", &crate::script::bytea(key)).replace("{shard}", &shard.to_string())
}

/// Deletes the state of `key` (the ledger trigger frees its slot) and samples the clock after
/// the deletion: exactly one row, with a null `expires_at_ms` when none was stored. Sent after
/// [`lock`] of the key's shard.
pub(crate) fn reset(key: &[u8; 64]) -> String {
    RESET_SQL.replace("{key}", &crate::script::bytea(key))
}

/// Reads the stored arrival times of `keys` (ordinals start at 1) and samples the clock: one
/// row per stored key, or one row with a null ordinal when none is stored, each carrying
/// `now_ms`.
pub(crate) fn read(keys: &[[u8; 64]]) -> String {
    READ_SQL.replace("{keys}", &ordinal_keys(keys))
}

fn rows<'a>(rows: impl Iterator<Item = (&'a [u8; 64], &'a GcraWrite)>) -> (String, usize) {
    let mut values = String::new();
    let mut count = 0;
    for (key, write) in rows {
        if count > 0 {
            values.push_str(", ");
        }
        values.push('(');
        push_bytea(&mut values, key);
        values.push_str(&format!(
            ", {}::bigint, {}::bigint, {}::bigint)",
            write.tat.tat_ms, write.tat.tat_remainder, write.expires_at_ms
        ));
        count += 1;
    }
    (values, count)
}

/// Advances the watermarks of `shards` to `now_ms` and writes the rows of an allowed batch,
/// failing (SQLSTATE 22P02, before `COMMIT` can run) if a row count differs.
pub(crate) fn write(keys: &[[u8; 64]], writes: &[GcraWrite], shards: &[i16], now_ms: u64) -> String {
    let (updates, updated) = rows(keys.iter().zip(writes).filter(|(_, write)| !write.insert));
    let (inserts, inserted) = rows(keys.iter().zip(writes).filter(|(_, write)| write.insert));
    let columns = "AS input (counter_key, tat_ms, tat_remainder, expires_at_ms)";
    let mut verified = Vec::new();
    let updated_cte = if updated > 0 {
        verified.push(format!("(SELECT pg_catalog.count(*) FROM updated) = {updated}"));
        format!(
            ",\nupdated AS (\n    UPDATE public.runlimit_gcra AS g\n    SET tat_ms = input.tat_ms, \
             tat_remainder = input.tat_remainder, expires_at_ms = input.expires_at_ms\n    \
             FROM (VALUES {updates}) {columns}\n    WHERE g.counter_key = input.counter_key\n    RETURNING 1\n)"
        )
    } else {
        String::new()
    };
    let inserted_cte = if inserted > 0 {
        verified.push(format!("(SELECT pg_catalog.count(*) FROM inserted) = {inserted}"));
        format!(
            ",\ninserted AS (\n    INSERT INTO public.runlimit_gcra (counter_key, tat_ms, tat_remainder, \
             expires_at_ms)\n    SELECT input.counter_key, input.tat_ms, input.tat_remainder, \
             input.expires_at_ms\n    FROM (VALUES {inserts}) {columns}\n    ORDER BY input.counter_key\n    \
             RETURNING 1\n)"
        )
    } else {
        String::new()
    };
    if verified.is_empty() {
        verified.push("true".to_owned());
    }
    WRITE_SQL
        .replace("{updated}", &updated_cte)
        .replace("{inserted}", &inserted_cte)
        .replace("{verified}", &verified.join(" AND "))
        .replace("{shards}", &join(shards))
        .replace("{now_ms}", &now_ms.to_string())
}

/// The cleanup transaction's settings: timeouts, `search_path` and `enable_seqscan = off`.
pub(crate) fn cleanup_settings(timeout_ms: u128) -> String {
    CLEANUP_SETTINGS_SQL.replace("{timeout_ms}", &timeout_ms.to_string())
}

/// The discovery statement: locks (skipping busy ones) the ledger rows of the shards with an
/// expired row, ascending, returning `shard` and its clamped `now_ms`.
pub(crate) fn discover() -> &'static str {
    DISCOVER_SQL
}

/// Deletes at most `maximum_rows` expired rows of the `locked` shards (`(shard, now_ms)`).
pub(crate) fn delete(locked: &[(i16, i64)], maximum_rows: u32) -> String {
    let values: Vec<String> =
        locked.iter().map(|(shard, now_ms)| format!("({shard}::smallint, {now_ms}::bigint)")).collect();
    DELETE_SQL.replace("{locked}", &values.join(", ")).replace("{maximum_rows}", &maximum_rows.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gcra::StoredTat;

    #[test]
    fn renders_only_digits_and_hex() {
        assert!(lock(&[0, 7, 255]).contains("ARRAY[0, 7, 255]::smallint[]"));
        let key = [0xABu8; 64];
        assert!(read(&[key]).contains("(VALUES (1, pg_catalog.decode('abab"));
        let insert =
            GcraWrite { insert: true, tat: StoredTat { tat_ms: 10, tat_remainder: 2 }, expires_at_ms: 11 };
        let update = GcraWrite { insert: false, ..insert };
        let sql = write(&[key, key], &[insert, update], &[171], 9);
        assert!(sql.contains("'hex'), 10::bigint, 2::bigint, 11::bigint)"), "{sql}");
        assert!(sql.contains("(SELECT pg_catalog.count(*) FROM updated) = 1 AND"), "{sql}");
        assert!(sql.contains("(SELECT pg_catalog.count(*) FROM inserted) = 1 THEN"), "{sql}");
        assert!(sql.contains("SET watermark_ms = 9::bigint"), "{sql}");
        assert_eq!(sql.matches(';').count(), 1);
        let only_update = write(&[key], &[update], &[171], 9);
        assert!(!only_update.contains("inserted"), "{only_update}");
        assert!(delete(&[(3, 17)], 25).contains("VALUES (3::smallint, 17::bigint)"));
        assert!(delete(&[(3, 17)], 25).contains("LIMIT 25"));
        assert!(cleanup_settings(70).contains("'enable_seqscan', 'off', true"));
        assert_eq!(discover().matches(';').count(), 1);
    }
}
