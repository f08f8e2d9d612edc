//! The one-check GCRA admission: two round trips, five statements for a stored key.
//!
//! 1. `BEGIN`, `EXECUTE runlimit_settings_v1` (the transaction's timeouts, in a statement that
//!    touches no table, so they bound every later wait, table locks included),
//!    `EXECUTE runlimit_gcra_lock_one_v1` (the shard's ledger row `FOR UPDATE`: the lock every
//!    GCRA admission, cleanup and reset of the shard takes, so replicas of earlier releases
//!    exclude it and it excludes them) and `EXECUTE runlimit_gcra_preflight_one_v2`: in one
//!    statement, the clock sample clamped to the shard's watermark, the key's stored arrival
//!    time, and, when the check fits, a *provisional* update of the row to
//!    `max(tat, now × Q) + cost × P`, returning the stored and the written arrival times;
//! 2. `COMMIT` when `gcra::evaluate`, from the stored arrival time, allows the check (the
//!    time it allows must be the one written, or the admission fails before `COMMIT`),
//!    `ROLLBACK` when it denies it (then nothing was written, and the statement must not have
//!    written either). A key without a row is decided on no state, and an allowed one is
//!    inserted by `runlimit_gcra_write_one_insert_v1` before `COMMIT`, as in a batch.
//!
//! So a stored key's admission writes one row and sends five statements where the batch
//! statements write two (the key's row and the shard's watermark) and send six; a denial writes
//! nothing (the update's condition is the evaluator's fit test, `cand ≤ now × Q + B × P`). The
//! decision is the evaluator's, as in every other admission: the database computes the arrival
//! time an allowed check stores, in exact `bigint` parts (whole milliseconds and a remainder in
//! `1/Q` ms), and whether it fits; Rust evaluates the stored state itself and accepts the
//! statement's answer only when both agree, failing closed otherwise.
//!
//! One difference in what is stored, on the safe side: these admissions do not advance the
//! shard's watermark. It exists so that a backwards clock step never makes a *deleted* row's
//! key look rested early; only cleanup deletes rows (and advances the watermark to the time it
//! used), and inserts still advance it. An admission at an earlier clock reading than a
//! previous one on the same key evaluates `max(tat, now × Q)`, which never replenishes early
//! either. Every other rule holds as in the batch statements: the row's `expires_at_ms` is
//! its exact `⌈tat / Q⌉`, so cleanup reclaims it at the same millisecond.
//!
//! No sum in the update can overflow `bigint` for a stored state this protocol or the batch
//! statements wrote: a valid policy's full-replenishment time is at most
//! [`MAX_WINDOW_MILLIS`](runlimit_core::MAX_WINDOW_MILLIS) (about 2⁴³ ms), and a stored
//! arrival time is at most that far beyond the clock reading it was written at. A policy
//! outside that range (none validates) would keep the batch statements.

use runlimit_core::{QuotaMode, backend::gcra::GcraParameters};
use sqlx::PgConnection;
use tokio::time::Instant as Deadline;

use super::{
    GcraSpec, GcraWrite, StoredTat, calls, decide, effective_now, parse_ledger, stored_pair, stored_tat,
};
use crate::{
    config::PostgresConfig,
    error::{CheckError, CheckPhase},
    observe::Evaluated,
    prepared::{self, Statement},
    script::{self, column, malformed},
    transaction::{self, Plan},
};

/// What one check adds to an arrival time and the burst's span, in the stored parts: the
/// arguments of the provisional update.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Increment {
    /// `⌊cost × P / Q⌋`.
    pub(crate) millis: i64,
    /// `cost × P mod Q`.
    pub(crate) remainder: i64,
    /// Q.
    pub(crate) quota: i64,
    /// `⌊B × P / Q⌋`: the check fits when the new arrival time is at most `now` plus this
    /// (and [`ceiling_remainder`](Self::ceiling_remainder)).
    pub(crate) ceiling_millis: i64,
    /// `B × P mod Q`.
    pub(crate) ceiling_remainder: i64,
    /// `⌊(B − cost) × P / Q⌋`: the check fits when the stored arrival time is at most `now`
    /// plus this (and [`slack_remainder`](Self::slack_remainder)), the row-lock protocol's form
    /// of the same test.
    pub(crate) slack_millis: i64,
    /// `(B − cost) × P mod Q`.
    pub(crate) slack_remainder: i64,
}

/// Full-replenishment times above this (ms) keep the batch statements; every valid policy's
/// is at most `MAX_WINDOW_MILLIS`, far below.
const MAXIMUM_FULL_REPLENISHMENT_MS: u128 = 1 << 61;

impl Increment {
    /// The increment of a check of `cost` units, or `None` for a policy beyond this protocol's
    /// range (see the module documentation).
    pub(crate) fn of(parameters: &GcraParameters, cost: u64) -> Option<Self> {
        let quota = u128::from(parameters.quota().get());
        let period = u128::from(parameters.period().as_millis());
        let burst = u128::from(parameters.burst_capacity().get());
        // B, Q < 2⁶³ and P < 2⁵⁴: every product fits u128.
        if burst * period / quota > MAXIMUM_FULL_REPLENISHMENT_MS {
            return None;
        }
        let added = u128::from(cost) * period;
        let span = burst * period;
        let slack = span.checked_sub(added)?;
        Some(Self {
            millis: i64::try_from(added / quota).ok()?,
            remainder: i64::try_from(added % quota).ok()?,
            quota: i64::try_from(quota).ok()?,
            ceiling_millis: i64::try_from(span / quota).ok()?,
            ceiling_remainder: i64::try_from(span % quota).ok()?,
            slack_millis: i64::try_from(slack / quota).ok()?,
            slack_remainder: i64::try_from(slack % quota).ok()?,
        })
    }
}

/// The preflight's answer.
#[derive(Debug)]
struct Preflight {
    clock_ms: i64,
    now_ms: i64,
    /// The stored arrival time; `None` when the key has no row.
    stored: Option<StoredTat>,
    /// The arrival time written; `None` unless the check fit and the row was updated.
    written: Option<StoredTat>,
}

fn parse_preflight(output: &script::ScriptOutput, statement: usize) -> Result<Preflight, CheckError> {
    let phase = CheckPhase::Preflight;
    let bad = malformed(phase);
    let row = output.only_row(statement).ok_or_else(|| bad("expected one preflight row"))?;
    let preflight = Preflight {
        clock_ms: column(row, "clock_ms", phase)?,
        now_ms: column(row, "now_ms", phase)?,
        stored: stored_pair(row, "tat_ms", "tat_remainder", phase)?,
        written: stored_pair(row, "next_tat_ms", "next_tat_remainder", phase)?,
    };
    if preflight.written.is_some() && preflight.stored.is_none() {
        return Err(bad("an arrival time written for a key without a row"));
    }
    Ok(preflight)
}

/// Whether the statement's answer is the evaluator's: for a stored key, an allowed check wrote
/// exactly the arrival time the plan stores and a denied one wrote nothing; a key without a
/// row was not written.
fn agrees(plan: &Plan<GcraWrite>, preflight: &Preflight, parameters: &GcraParameters) -> bool {
    match (plan, preflight.stored, preflight.written) {
        (Plan::Commit { writes, .. }, Some(_), Some(written)) => match writes.as_slice() {
            [write] => !write.insert && stored_tat(written, parameters).is_some() && write.tat == written,
            _ => false,
        },
        (Plan::Commit { writes, .. }, None, None) => writes.iter().all(|write| write.insert),
        (Plan::Rollback(_), _, None) => true,
        _ => false,
    }
}

/// Admits one check through the statements above. Returns the result and whether the
/// connection is clean.
pub(crate) async fn admit(
    connection: &mut PgConnection,
    deadline: Deadline,
    config: &PostgresConfig,
    key: &[u8; 64],
    spec: GcraSpec,
    increment: Increment,
    mode: QuotaMode,
) -> (Result<Evaluated, CheckError>, bool) {
    let shard = i16::from(spec.shard);
    let [begin, settings, lock] = calls::opening(
        calls::admission(calls::Ledger::Shards, false),
        config.server_timeout_millis(),
        &[shard],
        false,
    );
    let preflight = Statement {
        sql: calls::preflight_one(key, shard, increment),
        phase: CheckPhase::Preflight,
        executes: Some(&calls::PREFLIGHT_ONE),
    };
    let statements = [begin, settings, lock, preflight];
    let (lock_statement, preflight_statement) = (2, 3);
    let output = match prepared::run_phases(
        connection,
        &statements,
        deadline,
        &[&calls::WRITE_ONE_INSERT],
        config.operation_timeout(),
    )
    .await
    {
        Ok(output) => output,
        Err(error) => return (Err(error), false),
    };
    let decided = (|| {
        let ledger = parse_ledger(&output, lock_statement, &[shard])?;
        let preflight = parse_preflight(&output, preflight_statement)?;
        let bad = malformed(CheckPhase::Preflight);
        let watermarks = ledger.iter().flatten().map(|row| row.watermark_ms);
        let now_ms = effective_now(preflight.clock_ms, watermarks).map_err(&bad)?;
        if i64::try_from(now_ms).ok() != Some(preflight.now_ms) {
            return Err(bad("the update's time is not the clamped clock"));
        }
        let plan =
            decide(&[spec], &[preflight.stored], now_ms, &ledger, config.maximum_rows_per_shard(), mode)
                .map_err(&bad)?;
        if !agrees(&plan, &preflight, &spec.parameters) {
            return Err(bad("the provisional update differs from the evaluator's decision"));
        }
        Ok((plan, now_ms))
    })();
    let (plan, now_ms) = match decided {
        Ok(decided) => decided,
        // The transaction is open, perhaps with the provisional update: the connection is not
        // reused, so the server rolls it back.
        Err(error) => return (Err(error), false),
    };
    let ending = plan.ending(|writes| match writes {
        [write] if write.insert => (
            calls::write(
                calls::admission(calls::Ledger::Shards, false),
                &[*key],
                writes,
                &[],
                &[shard],
                now_ms,
            ),
            1,
        ),
        // The provisional update is the write: `COMMIT` alone.
        _ => (String::new(), 0),
    });
    transaction::end(connection, deadline, config.operation_timeout(), ending).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use runlimit_core::{Capacity, QuotaPeriod, backend::gcra::GcraParameters};
    use std::time::Duration;

    fn parameters(q: u64, p_ms: u64, b: u64) -> GcraParameters {
        GcraParameters::new(
            Capacity::new(q).unwrap(),
            QuotaPeriod::new(Duration::from_millis(p_ms)).unwrap(),
            Capacity::new(b).unwrap(),
        )
        .unwrap()
    }

    #[test]
    fn increments_in_exact_parts() {
        // 3 per 1,000 ms, burst 2: one unit is 333 ms and 1/3; full replenishment 666 ms.
        assert_eq!(
            Increment::of(&parameters(3, 1_000, 2), 1),
            Some(Increment {
                millis: 333,
                remainder: 1,
                quota: 3,
                ceiling_millis: 666,
                ceiling_remainder: 2,
                slack_millis: 333,
                slack_remainder: 1,
            })
        );
        assert_eq!(
            Increment::of(&parameters(3, 1_000, 2), 2),
            Some(Increment {
                millis: 666,
                remainder: 2,
                quota: 3,
                ceiling_millis: 666,
                ceiling_remainder: 2,
                slack_millis: 0,
                slack_remainder: 0,
            })
        );
        // One unit an hour, burst 50, a check of 50: 180,000,000 ms.
        assert_eq!(
            Increment::of(&parameters(1, 3_600_000, 50), 50),
            Some(Increment {
                millis: 180_000_000,
                remainder: 0,
                quota: 1,
                ceiling_millis: 180_000_000,
                ceiling_remainder: 0,
                slack_millis: 0,
                slack_remainder: 0,
            })
        );
        // The longest full replenishment a policy may have: its parts, exactly.
        let longest = runlimit_core::MAX_WINDOW_MILLIS;
        assert_eq!(
            Increment::of(&parameters(1, longest, 1), 1),
            Some(Increment {
                millis: i64::try_from(longest).unwrap(),
                remainder: 0,
                quota: 1,
                ceiling_millis: i64::try_from(longest).unwrap(),
                ceiling_remainder: 0,
                slack_millis: 0,
                slack_remainder: 0,
            })
        );
    }
}
