//! Simple-query scripts: several statements sent as one round trip whose per-statement
//! progress is tracked, the statements every transaction shares, and the readers of their
//! rows.
//!
//! Each statement of a simple-query script is analyzed just before it runs and gets its own
//! `READ COMMITTED` snapshot, so a statement sent after a lock statement in the same script
//! reads what the previous holders of those locks committed, and it is analyzed under the
//! `search_path` an earlier statement of the script set. PostgreSQL answers each statement with
//! a `CommandComplete` and stops at the first error, so the number of completed statements
//! names the statement that failed or was interrupted.
//!
//! Simple queries cannot take bind parameters, so values are rendered into the SQL text. Only
//! values Runlimit produces itself are rendered, and only as integers, booleans and hexadecimal
//! digits passed to `pg_catalog.decode(.., 'hex')`: never caller-supplied text, so the
//! rendering cannot inject SQL and does not depend on `standard_conforming_strings`.

use futures_util::TryStreamExt;
use sqlx::{AssertSqlSafe, Either, PgConnection, Postgres, Row, postgres::PgRow};
use tokio::time::{Instant, timeout_at};

use crate::error::{CheckError, CheckPhase};

const BEGIN_SQL: &str = include_str!("sql/begin.sql");
const BEGIN_READ_ONLY_SQL: &str = include_str!("sql/begin_read_only.sql");
const SETTINGS_SQL: &str = include_str!("sql/settings.sql");

/// Ends an allowed admission, a completion or a cleanup.
pub(crate) const COMMIT: &str = "COMMIT;";

/// Ends a transaction that changed nothing.
pub(crate) const ROLLBACK: &str = "ROLLBACK;";

/// Statements in [`begin`].
pub(crate) const BEGIN_STATEMENTS: usize = 1;

/// `BEGIN ISOLATION LEVEL READ COMMITTED, READ WRITE`, whatever the session defaults.
pub(crate) fn begin() -> &'static str {
    BEGIN_SQL
}

/// `BEGIN ISOLATION LEVEL READ COMMITTED, READ ONLY`: the server rejects any write in the
/// transaction, so a peek cannot change state.
pub(crate) fn begin_read_only() -> &'static str {
    BEGIN_READ_ONLY_SQL
}

/// The transaction-local `statement_timeout` and `lock_timeout` (milliseconds) and
/// `search_path = pg_catalog, pg_temp`, as one statement.
pub(crate) fn settings(timeout_ms: u128) -> String {
    SETTINGS_SQL.replace("{timeout_ms}", &timeout_ms.to_string())
}

/// Appends `bytes` as lowercase hexadecimal. Hand-written: a dozen lines do not justify a
/// dependency.
fn push_hex(out: &mut String, bytes: &[u8]) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    for byte in bytes {
        out.push(char::from(DIGITS[usize::from(byte >> 4)]));
        out.push(char::from(DIGITS[usize::from(byte & 0x0f)]));
    }
}

/// `pg_catalog.decode('<hex>', 'hex')`, a `bytea` literal of `bytes`.
pub(crate) fn bytea(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len() * 2 + 32);
    push_bytea(&mut out, bytes);
    out
}

/// Appends `pg_catalog.decode('<hex>', 'hex')`, a `bytea` literal of `bytes`.
pub(crate) fn push_bytea(out: &mut String, bytes: &[u8]) {
    out.push_str("pg_catalog.decode('");
    push_hex(out, bytes);
    out.push_str("', 'hex')");
}

/// The counter keys as one text argument of the admission functions: the lowercase
/// hexadecimal digits of every key's 64 bytes, concatenated in order.
pub(crate) fn hex_keys(keys: &[[u8; 64]]) -> String {
    let mut out = String::with_capacity(keys.len() * 128);
    for key in keys {
        push_hex(&mut out, key);
    }
    out
}

/// `'{v₁,v₂,..}'`, the text of an array literal of integers or booleans, for a call argument
/// cast to its array type (`'{1,-2}'::bigint[]`).
pub(crate) fn array_literal<T: std::fmt::Display>(values: impl IntoIterator<Item = T>) -> String {
    use std::fmt::Write as _;
    let mut out = String::from("'{");
    for (index, value) in values.into_iter().enumerate() {
        if index > 0 {
            out.push(',');
        }
        // Writing to a `String` cannot fail.
        let _ = write!(out, "{value}");
    }
    out.push_str("}'");
    out
}

/// `(1, key₁), (2, key₂), ..`: the rows of a `VALUES` list of `(ordinal, counter_key)`, keys
/// rendered with [`push_bytea`].
pub(crate) fn ordinal_keys(keys: &[[u8; 64]]) -> String {
    let mut values = String::with_capacity(keys.len() * 160);
    for (index, key) in keys.iter().enumerate() {
        if index > 0 {
            values.push_str(", ");
        }
        values.push('(');
        values.push_str(&(index + 1).to_string());
        values.push_str(", ");
        push_bytea(&mut values, key);
        values.push(')');
    }
    values
}

/// How a script failed.
#[derive(Debug)]
pub(crate) enum Failure {
    /// The operation deadline elapsed (client side).
    TimedOut,
    /// SQLx reported an error: a database error (the server's answer to the failing
    /// statement) or a connection/protocol failure.
    Sqlx(sqlx::Error),
}

/// A failed script and how many of its statements completed before the failure.
#[derive(Debug)]
pub(crate) struct ScriptError {
    pub(crate) completed: usize,
    pub(crate) failure: Failure,
}

/// The answers to a script.
#[derive(Debug, Default)]
pub(crate) struct ScriptOutput {
    /// Rows affected (or returned), one entry per completed statement.
    pub(crate) affected: Vec<u64>,
    /// Every returned row with the index of the statement that returned it.
    pub(crate) rows: Vec<(usize, PgRow)>,
}

impl ScriptOutput {
    /// The rows returned by statement `statement`.
    pub(crate) fn rows_of(&self, statement: usize) -> impl Iterator<Item = &PgRow> {
        self.rows.iter().filter(move |(index, _)| *index == statement).map(|(_, row)| row)
    }

    /// The single row returned by statement `statement`, if it returned exactly one.
    pub(crate) fn only_row(&self, statement: usize) -> Option<&PgRow> {
        let mut rows = self.rows_of(statement);
        match (rows.next(), rows.next()) {
            (Some(row), None) => Some(row),
            _ => None,
        }
    }
}

/// Runs `sql` as one simple query before `deadline`.
pub(crate) async fn run(
    connection: &mut PgConnection,
    sql: String,
    deadline: Instant,
) -> Result<ScriptOutput, ScriptError> {
    let mut output = ScriptOutput::default();
    let mut stream = sqlx::raw_sql(AssertSqlSafe(sql)).fetch_many(connection);
    loop {
        let completed = output.affected.len();
        match timeout_at(deadline, stream.try_next()).await {
            Err(_) => return Err(ScriptError { completed, failure: Failure::TimedOut }),
            Ok(Err(error)) => return Err(ScriptError { completed, failure: Failure::Sqlx(error) }),
            Ok(Ok(None)) => return Ok(output),
            Ok(Ok(Some(Either::Left(result)))) => output.affected.push(result.rows_affected()),
            Ok(Ok(Some(Either::Right(row)))) => output.rows.push((completed, row)),
        }
    }
}

/// A [`CheckError::MalformedResponse`] of `phase`.
pub(crate) fn malformed(phase: CheckPhase) -> impl Fn(&'static str) -> CheckError {
    move |reason| CheckError::MalformedResponse { phase, reason }
}

/// The array column `name` of `row`: one element per check (`expected` of them), each null
/// when the check's key has no row; otherwise a malformed response of `phase`.
pub(crate) fn per_check_array<T>(
    row: &PgRow,
    name: &str,
    expected: usize,
    phase: CheckPhase,
) -> Result<Vec<Option<T>>, CheckError>
where
    Vec<Option<T>>: for<'r> sqlx::Decode<'r, Postgres> + sqlx::Type<Postgres>,
{
    let values: Vec<Option<T>> = column(row, name, phase)?;
    if values.len() == expected {
        Ok(values)
    } else {
        Err(CheckError::MalformedResponse { phase, reason: "array length differs from the checks" })
    }
}

/// Column `name` of `row`, or a malformed response of `phase`.
pub(crate) fn column<T>(row: &PgRow, name: &str, phase: CheckPhase) -> Result<T, CheckError>
where
    T: for<'r> sqlx::Decode<'r, Postgres> + sqlx::Type<Postgres>,
{
    row.try_get(name).map_err(|_| CheckError::MalformedResponse { phase, reason: "undecodable column" })
}

/// The clock sample (column `name`) every row of statement `statement` carries: at least one
/// row, all equal.
pub(crate) fn clock_sample(
    output: &ScriptOutput,
    statement: usize,
    name: &str,
    phase: CheckPhase,
) -> Result<i64, CheckError> {
    let mut sample = None;
    for row in output.rows_of(statement) {
        let now: i64 = column(row, name, phase)?;
        if sample.replace(now).is_some_and(|previous| previous != now) {
            return Err(CheckError::MalformedResponse { phase, reason: "clock samples differ" });
        }
    }
    sample.ok_or(CheckError::MalformedResponse { phase, reason: "missing clock sample" })
}

/// One value per check from the rows of statement `statement`, each naming its check by the
/// 1-based `ordinal` column and parsed by `parse`; `None` for a check without a row. A row with
/// a null ordinal (the clock-only row of a batch with no stored key) is skipped.
pub(crate) fn per_check<T>(
    output: &ScriptOutput,
    statement: usize,
    batch_size: usize,
    phase: CheckPhase,
    parse: impl Fn(&PgRow) -> Result<T, CheckError>,
) -> Result<Vec<Option<T>>, CheckError> {
    let bad = malformed(phase);
    let mut values: Vec<Option<T>> = std::iter::repeat_with(|| None).take(batch_size).collect();
    for row in output.rows_of(statement) {
        let Some(ordinal) = column::<Option<i64>>(row, "ordinal", phase)? else { continue };
        let slot = usize::try_from(ordinal)
            .ok()
            .and_then(|ordinal| ordinal.checked_sub(1))
            .and_then(|index| values.get_mut(index))
            .ok_or_else(|| bad("row ordinal out of range"))?;
        if slot.replace(parse(row)?).is_some() {
            return Err(bad("duplicate row ordinal"));
        }
    }
    Ok(values)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_only_digits_and_hex() {
        let mut key = [0u8; 64];
        key[0] = 0xAB;
        key[63] = 0x01;
        let values = ordinal_keys(&[key, [0; 64]]);
        assert!(values.starts_with("(1, pg_catalog.decode('ab00"), "{values}");
        assert!(values.contains("0001', 'hex')), (2, pg_catalog.decode('0000"), "{values}");
        assert_eq!(begin().matches(';').count(), BEGIN_STATEMENTS);
        assert_eq!(hex_keys(&[key, [0x10; 64]]), format!("ab{}01{}", "00".repeat(62), "10".repeat(64)));
        assert_eq!(array_literal([-5i64, 7]), "'{-5,7}'");
        assert_eq!(array_literal([true, false]), "'{true,false}'");
        assert_eq!(array_literal(Vec::<i16>::new()), "'{}'");
        assert!(settings(7).contains("pg_catalog.set_config('statement_timeout', '7', true)"));
        assert!(settings(7).contains("pg_catalog.set_config('lock_timeout', '7', true)"));
        assert!(settings(7).contains("pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', true)"));
    }
}
