//! The row-lock protocol: GCRA admissions after [`switch_to_row_locks`](crate::PostgresGcraLimiter::switch_to_row_locks).
//!
//! The ledger-lock protocol (`super::one`, `super::calls` on `public.runlimit_gcra_shards`)
//! serializes every admission of a shard on the shard's ledger row. Once every replica runs a
//! release that knows both protocols, the switch moves the 256 ledger rows to
//! `public.runlimit_gcra_ledger` (migration `20250701000003`), and from then on:
//!
//! - a one-check admission of a stored key takes no ledger lock: it is one `UPDATE` of the key's
//!   row (which row-locks it), conditional on the check fitting, evaluated on the row's latest
//!   committed version (PostgreSQL re-evaluates an `UPDATE`'s condition and values on the newest
//!   version after waiting for a concurrent writer), so two admissions of one key never both
//!   decide on the same stored time;
//! - batches, one-checks of new keys, cleanup and reset lock the new ledger rows (ascending shard
//!   order, as before); batches read their keys' rows without row locks and write each only if
//!   it still holds the time read (a one-check `UPDATE` may have moved it: the write is then
//!   refused before `COMMIT` and the batch decided again, reading `FOR NO KEY UPDATE`), and a
//!   one-check of a new key inserts under its shard's ledger lock, so capacity stays exact;
//! - a replica of an earlier release finds no ledger row to lock: its admissions, peeks and
//!   resets fail closed (`MalformedResponse`, nothing consumed) instead of deciding without the
//!   lock it relies on, and its cleanup passes find nothing to clean.
//!
//! # One-check admission: two round trips
//!
//! 1. `BEGIN`, the settings, `EXECUTE runlimit_gcra_rowlock_admit_one_v1`: the clock sample
//!    clamped to the shard's watermark (read without a lock), the stored arrival time as the
//!    statement's snapshot holds it, the shard's row count (without a lock), and the
//!    conditional `UPDATE`, returning the arrival time written.
//! 2. One of:
//!    - the row was updated: `COMMIT` alone. Rust checks the written time against the evaluator:
//!      from `written − cost × P` (the stored time, or any time not after `now`, which the
//!      evaluator treats alike) it must allow the check and write exactly that time;
//!    - the row exists but was not updated (the check did not fit): `EXECUTE
//!      runlimit_gcra_read_one_v1` (the row's latest committed time) and `ROLLBACK`; the denial
//!      is the evaluator's at the first round trip's time from that time (so its delay is
//!      measured from that earlier clock sample: conservative). A row that went away meanwhile
//!      is decided under locks (below);
//!    - the key has no row: a storage-capacity denial and `ROLLBACK` when the shard's row count
//!      is at the configured bound, else `EXECUTE runlimit_gcra_rowlock_insert_one_v1` (insert
//!      under the shard's ledger row lock, refused before `COMMIT` when the shard filled up, a
//!      batch or cleanup moved the shard's watermark past the admission's time, or another
//!      admission inserted the key first; the insert itself leaves the watermark alone)
//!      and `COMMIT`.
//!
//! A refused insert, or a row that went away under the update (a reset or cleanup deleted it),
//! sends the check, after `ROLLBACK`, to the batch statements with locking reads (the shard's
//! ledger row, then the key's row `FOR NO KEY UPDATE`, then the clock): decided under locks, it
//! cannot be refused.
//!
//! # Time
//!
//! The clock is sampled when the `UPDATE` starts. An admission that waits for another admission
//! of the same key decides at that earlier time: a stored arrival time never moves backwards,
//! so this never replenishes early, and the delays it reports are at most the wait longer.

use runlimit_core::{
    QuotaMode,
    backend::gcra::{self, GcraOutcome, GcraParameters, TheoreticalArrivalTime},
};
use sqlx::PgConnection;
use tokio::time::Instant as Deadline;

use super::{
    GcraSpec, GcraWrite, LedgerRow, StoredTat, calls, decide, one::Increment, stored_pair, stored_tat,
};
use crate::{
    config::PostgresConfig,
    error::{CheckError, CheckPhase, sqlstate},
    observe::Evaluated,
    prepared::{self, Statement},
    script::{self, column, malformed},
    transaction::{self, Ending, Plan, check_failure},
};

/// The first round trip's answer.
#[derive(Debug)]
struct Answer {
    clock_ms: i64,
    now_ms: i64,
    row_count: i64,
    stored: Option<StoredTat>,
    written: Option<StoredTat>,
}

fn parse_answer(output: &script::ScriptOutput, statement: usize) -> Result<Answer, CheckError> {
    let phase = CheckPhase::Preflight;
    let bad = malformed(phase);
    let row =
        output.only_row(statement).ok_or_else(|| bad("the row-lock ledger has no row for the shard"))?;
    let row_count: i32 = column(row, "row_count", phase)?;
    let answer = Answer {
        clock_ms: column(row, "clock_ms", phase)?,
        now_ms: column(row, "now_ms", phase)?,
        row_count: i64::from(row_count),
        stored: stored_pair(row, "tat_ms", "tat_remainder", phase)?,
        written: stored_pair(row, "next_tat_ms", "next_tat_remainder", phase)?,
    };
    Ok(answer)
}

/// The allowance of a check the statement admitted by writing `written` at `now_ms`, if the
/// evaluator agrees: from the stored time the statement's snapshot held (`snapshot`), or, when
/// the row changed between the snapshot and the update (another admission of the key committed
/// while this one waited for its row lock), from `written − cost × P`, which must then lie after
/// the snapshot's time (a row's arrival time never moves back while it exists), the evaluator must
/// allow the check and store exactly `written`.
fn verified_allowance(
    spec: &GcraSpec,
    snapshot: StoredTat,
    written: StoredTat,
    now_ms: u64,
) -> Result<runlimit_core::Allowance, &'static str> {
    const DISAGREES: &str = "the update differs from the evaluator's decision";
    let parameters: &GcraParameters = &spec.parameters;
    let out_of_range = "stored arrival time out of range";
    let written_tat = stored_tat(written, parameters).ok_or(out_of_range)?;
    let snapshot_tat = stored_tat(snapshot, parameters).ok_or(out_of_range)?;
    let allows = |stored: TheoreticalArrivalTime| {
        let outcome = gcra::evaluate(parameters, Some(stored), now_ms, spec.cost).ok()?;
        match outcome {
            GcraOutcome::Allowed { tat, .. } if tat == written_tat => outcome.allowance(parameters),
            _ => None,
        }
    };
    if let Some(allowance) = allows(snapshot_tat) {
        return Ok(allowance);
    }
    let increment = u128::from(spec.cost) * u128::from(parameters.period().as_millis());
    let before = written_tat.scaled().checked_sub(increment).ok_or(DISAGREES)?;
    if before <= snapshot_tat.scaled() {
        return Err(DISAGREES);
    }
    allows(TheoreticalArrivalTime::from_scaled(before)).ok_or(DISAGREES)
}

/// Whether `error` is a write statement's own refusal of a row-lock protocol's write, before
/// `COMMIT`: the insert of a new key (see [`ROW_LOCK_INSERT_ONE`](calls::ROW_LOCK_INSERT_ONE))
/// or an optimistic batch write (see [`ROW_LOCK_WRITE`](calls::ROW_LOCK_WRITE)).
fn is_refusal(error: &CheckError) -> bool {
    match error {
        CheckError::Database { source, .. } => {
            sqlstate(source).as_deref() == Some("22P02")
                && source.as_database_error().is_some_and(|error| {
                    let message = error.message();
                    message.contains("runlimit: a new gcra row was not inserted")
                        || message.contains("runlimit: a gcra row changed since it was read")
                })
        }
        _ => false,
    }
}

/// Whether `result` failed on a row-lock write's own refusal (see [`is_refusal`]).
pub(crate) fn is_refused<T>(result: &Result<T, CheckError>) -> bool {
    result.as_ref().err().is_some_and(is_refusal)
}

/// Admits one check through the row-lock statements (see the [module docs](self)): the result
/// and whether the connection is clean, or `None` when the check must be decided under locks
/// (the connection is then clean: its transaction was rolled back).
pub(crate) async fn admit(
    connection: &mut PgConnection,
    deadline: Deadline,
    config: &PostgresConfig,
    key: &[u8; 64],
    spec: GcraSpec,
    increment: Increment,
    mode: QuotaMode,
) -> Option<(Result<Evaluated, CheckError>, bool)> {
    let timeout = config.operation_timeout();
    let shard = i16::from(spec.shard);
    let [begin, settings] = calls::begin_and_settings(config.server_timeout_millis());
    let admit = Statement {
        sql: calls::row_lock_admit_one(key, shard, increment),
        phase: CheckPhase::Preflight,
        executes: Some(&calls::ROW_LOCK_ADMIT_ONE),
    };
    let statements = [begin, settings, admit];
    let later = [&calls::READ_ONE, &calls::ROW_LOCK_INSERT_ONE];
    let output = match prepared::run_phases(connection, &statements, deadline, &later, timeout).await {
        Ok(output) => output,
        Err(error) => return Some((Err(error), false)),
    };
    let bad = malformed(CheckPhase::Preflight);
    let answer = match parse_answer(&output, 2) {
        Ok(answer) => answer,
        Err(error) => return Some((Err(error), false)),
    };
    let now_ms = match (u64::try_from(answer.clock_ms), u64::try_from(answer.now_ms)) {
        (Ok(clock), Ok(now)) if now >= clock => now,
        _ => return Some((Err(bad("negative or unclamped database time")), false)),
    };
    let ledger_row = LedgerRow { row_count: answer.row_count, watermark_ms: answer.now_ms };
    let mut ledger = [None; 256];
    ledger[usize::from(spec.shard)] = Some(ledger_row);
    match (answer.stored, answer.written) {
        (Some(snapshot), Some(written)) => {
            let allowance = match verified_allowance(&spec, snapshot, written, now_ms) {
                Ok(allowance) => allowance,
                // The transaction holds the update: the connection is not reused, so the server
                // rolls it back.
                Err(reason) => return Some((Err(bad(reason)), false)),
            };
            let ending = Ending::Commit {
                value: Evaluated::Allowed(vec![allowance]),
                writes: String::new(),
                statements: 0,
            };
            Some(transaction::end(connection, deadline, timeout, ending).await)
        }
        (None, Some(_)) => Some((Err(bad("an arrival time written for a key without a row")), false)),
        (Some(_), None) => {
            // Not updated: read the row's latest committed time, and end the transaction.
            let (read_sql, _) = calls::read(calls::admission(calls::Ledger::Shards, false), &[*key]);
            let sql = format!("{read_sql}{}", script::ROLLBACK);
            let output = match script::run(connection, sql, deadline).await {
                Ok(output) => output,
                Err(error) => {
                    let phases = [CheckPhase::Preflight, CheckPhase::Preflight];
                    return Some((Err(check_failure(error, &phases, timeout)), false));
                }
            };
            let phase = CheckPhase::Preflight;
            let fresh = output
                .only_row(0)
                .ok_or_else(|| bad("expected one read row"))
                .and_then(|row| stored_pair(row, "tat_ms", "tat_remainder", phase));
            let fresh = match fresh {
                Ok(fresh) => fresh,
                Err(error) => return Some((Err(error), true)),
            };
            match decide(&[spec], &[fresh], now_ms, &ledger, config.maximum_rows_per_shard(), mode) {
                Ok(Plan::Rollback(denial)) => Some((Ok(Evaluated::Denied(denial)), true)),
                // The row was deleted (or deleted and inserted again) since the update passed it
                // over: decide under locks.
                Ok(Plan::Commit { .. }) => None,
                Err(reason) => Some((Err(bad(reason)), true)),
            }
        }
        (None, None) => {
            let plan = match decide(&[spec], &[None], now_ms, &ledger, config.maximum_rows_per_shard(), mode)
            {
                Ok(plan) => plan,
                Err(reason) => return Some((Err(bad(reason)), false)),
            };
            let maximum_rows = config.maximum_rows_per_shard();
            let ending = plan.ending(|writes: &[GcraWrite]| match writes {
                [write] => (calls::row_lock_insert_one(key, shard, write, now_ms, maximum_rows), 1),
                _ => (String::new(), 0),
            });
            let (result, clean) = transaction::end(connection, deadline, timeout, ending).await;
            match result {
                Err(error) if is_refusal(&error) => {
                    // The insert was refused before `COMMIT` ran: end the aborted transaction and
                    // decide under locks, on what is stored now.
                    match script::run(connection, script::ROLLBACK.to_owned(), deadline).await {
                        Ok(_) => None,
                        Err(_) => Some((Err(error), false)),
                    }
                }
                result => Some((result, clean)),
            }
        }
    }
}

/// [`to_write`] for the tests' expected values.
#[cfg(test)]
fn write_of(tat: TheoreticalArrivalTime, parameters: &GcraParameters) -> GcraWrite {
    super::to_write(false, tat, parameters).unwrap()
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use runlimit_core::{Capacity, QuotaPeriod};

    use super::*;

    fn spec(q: u64, p_ms: u64, b: u64, cost: u64) -> GcraSpec {
        let parameters = GcraParameters::new(
            Capacity::new(q).unwrap(),
            QuotaPeriod::new(Duration::from_millis(p_ms)).unwrap(),
            Capacity::new(b).unwrap(),
        )
        .unwrap();
        GcraSpec { parameters, cost, shard: 3 }
    }

    #[test]
    fn a_written_time_is_checked_against_the_evaluator() {
        let allowance = |available, ms| {
            runlimit_core::Allowance::new(
                Capacity::new(2).unwrap(),
                available,
                runlimit_core::Delay::from_millis(ms),
            )
            .unwrap()
        };
        // 3 per 1,000 ms, burst 2, at t = 0: from 0, the first check writes 333 ms and 1/3.
        let one = spec(3, 1_000, 2, 1);
        let zero = StoredTat { tat_ms: 0, tat_remainder: 0 };
        let first = StoredTat { tat_ms: 333, tat_remainder: 1 };
        assert_eq!(verified_allowance(&one, zero, first, 0), Ok(allowance(1, 334)));
        // The second writes 666 ms and 2/3 from 333 ms and 1/3.
        let second = StoredTat { tat_ms: 666, tat_remainder: 2 };
        assert_eq!(verified_allowance(&one, first, second, 0), Ok(allowance(0, 667)));
        // A time one unit of 1/Q ms off is not what the evaluator writes from the snapshot, and
        // the time it would come from (333 ms) lies before the snapshot's.
        let off = StoredTat { tat_ms: 666, tat_remainder: 1 };
        assert_eq!(
            verified_allowance(&one, first, off, 0),
            Err("the update differs from the evaluator's decision")
        );
        // The row advanced while the update waited: 333 ms and 1/3 was committed after the
        // snapshot of 0, and the update wrote the second check's time from it.
        assert_eq!(verified_allowance(&one, zero, second, 0), Ok(allowance(0, 667)));
        // A time beyond the burst is refused: the evaluator would have denied it.
        let beyond = StoredTat { tat_ms: 999, tat_remainder: 2 };
        assert!(verified_allowance(&one, second, beyond, 0).is_err());
        // A rested key writes now + one increment, whatever it stored before.
        let rested = write_of(TheoreticalArrivalTime::from_scaled(3 * 5_000 + 1_000), &one.parameters);
        assert_eq!(rested.tat, StoredTat { tat_ms: 5_333, tat_remainder: 1 });
        assert_eq!(verified_allowance(&one, second, rested.tat, 5_000), Ok(allowance(1, 334)));
    }
}
