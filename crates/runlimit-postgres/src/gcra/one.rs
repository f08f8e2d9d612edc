//! The one-check GCRA admission: two round trips, four statements for a stored key.
//!
//! 1. `BEGIN`, `EXECUTE runlimit_gcra_lock_one_v2` (the transaction-local settings of
//!    `runlimit_settings_v1`, then the shard's ledger row `FOR UPDATE`: the lock every GCRA
//!    admission, cleanup and reset of the shard takes, so replicas of earlier releases exclude
//!    it and it excludes them) and `EXECUTE runlimit_gcra_preflight_one_v2`: in one statement,
//!    the clock sample clamped to the shard's watermark, and a *provisional* update of the
//!    key's row to `max(tat, now × Q) + cost × P`, returning the arrival time written;
//! 2. `COMMIT` when `gcra::evaluate` allows the check from `max(tat, now × Q)` (recovered as
//!    the written time minus `cost × P`; its new arrival time must equal the one written, or
//!    the admission fails before `COMMIT`), `ROLLBACK` when it denies it (the
//!    provisional update is undone, nothing is consumed). A key without a row (the update
//!    matched nothing) is decided on no state, and an allowed one is inserted by
//!    `runlimit_gcra_write_one_insert_v1` before `COMMIT`, as in a batch.
//!
//! So a stored key's admission writes one row and sends four statements where the batch
//! statements write two (the key's row and the shard's watermark) and send six. The decision
//! is the evaluator's, as in every other admission: the database computes only the arrival
//! time an allowed check stores, in exact `bigint` parts (whole milliseconds and a remainder
//! in `1/Q` ms), and the evaluator's answer is compared with it.
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

use runlimit_core::{
    QuotaMode,
    backend::gcra::{GcraParameters, TheoreticalArrivalTime},
};
use sqlx::PgConnection;
use tokio::time::Instant as Deadline;

use super::{GcraSpec, StoredTat, calls, decide, effective_now, parse_ledger, stored_tat};
use crate::{
    config::PostgresConfig,
    error::{CheckError, CheckPhase},
    observe::Evaluated,
    prepared::{self, Statement},
    script::{self, column, malformed},
    transaction::{self, Plan},
};

/// What one check adds to an arrival time, in the stored parts: the arguments of the
/// provisional update.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Increment {
    /// `⌊cost × P / Q⌋`.
    pub(crate) millis: i64,
    /// `cost × P mod Q`.
    pub(crate) remainder: i64,
    /// Q.
    pub(crate) quota: i64,
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
        let full = burst * period / quota;
        if full > MAXIMUM_FULL_REPLENISHMENT_MS {
            return None;
        }
        let added = u128::from(cost) * period;
        Some(Self {
            millis: i64::try_from(added / quota).ok()?,
            remainder: i64::try_from(added % quota).ok()?,
            quota: i64::try_from(quota).ok()?,
        })
    }
}

/// The provisional update's answer.
#[derive(Debug)]
struct Preflight {
    clock_ms: i64,
    now_ms: i64,
    /// The arrival time as written; `None` when the key has no row.
    written: Option<StoredTat>,
}

fn parse_preflight(output: &script::ScriptOutput, statement: usize) -> Result<Preflight, CheckError> {
    let phase = CheckPhase::Preflight;
    let bad = malformed(phase);
    let row = output.only_row(statement).ok_or_else(|| bad("expected one preflight row"))?;
    let parts: (Option<i64>, Option<i64>) =
        (column(row, "next_tat_ms", phase)?, column(row, "next_tat_remainder", phase)?);
    let written = match parts {
        (Some(tat_ms), Some(tat_remainder)) => Some(StoredTat { tat_ms, tat_remainder }),
        (None, None) => None,
        _ => return Err(bad("half an arrival time")),
    };
    Ok(Preflight {
        clock_ms: column(row, "clock_ms", phase)?,
        now_ms: column(row, "now_ms", phase)?,
        written,
    })
}

/// The arrival time a stored key was evaluated from, recovered from the one written: `written
/// − cost × P`, which is `max(tat, now × Q)`. The evaluator's answer from it is its answer
/// from the stored `tat` (it starts from `max(tat, now × Q)` too), so the row as it was need
/// not travel back. `None` when the written time is malformed or the recovered one lies before
/// `now × Q` (the update did not compute `max`).
fn evaluated_from(
    written: StoredTat,
    now_ms: u64,
    spec: &GcraSpec,
) -> Option<(TheoreticalArrivalTime, StoredTat)> {
    let parameters = &spec.parameters;
    let written = stored_tat(written, parameters)?;
    let added = u128::from(spec.cost) * u128::from(parameters.period().as_millis());
    let base = written.scaled().checked_sub(added)?;
    if base < u128::from(now_ms) * u128::from(parameters.quota().get()) {
        return None;
    }
    let base = TheoreticalArrivalTime::from_scaled(base);
    let (millis, remainder) = base.to_parts(parameters)?;
    let stored =
        StoredTat { tat_ms: i64::try_from(millis).ok()?, tat_remainder: i64::try_from(remainder).ok()? };
    Some((written, stored))
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
    let statements = [
        Statement { sql: script::begin().to_owned(), phase: CheckPhase::Begin, executes: None },
        Statement {
            sql: calls::lock_one_v2(shard, config.server_timeout_millis()),
            phase: CheckPhase::Lock,
            executes: Some(&calls::LOCK_ONE_V2),
        },
        Statement {
            sql: calls::preflight_one(key, shard, increment),
            phase: CheckPhase::Preflight,
            executes: Some(&calls::PREFLIGHT_ONE),
        },
    ];
    let (lock_statement, preflight_statement) = (1, 2);
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
        let (written, stored) = match preflight.written {
            Some(written) => {
                let (written, base) = evaluated_from(written, now_ms, &spec)
                    .ok_or_else(|| bad("the provisional update is not an admission's"))?;
                (Some(written), Some(base))
            }
            None => (None, None),
        };
        let plan = decide(&[spec], &[stored], now_ms, &ledger, config.maximum_rows_per_shard(), mode)
            .map_err(&bad)?;
        if let (Plan::Commit { writes, .. }, Some(written)) = (&plan, written)
            && !writes
                .iter()
                .all(|write| !write.insert && stored_tat(write.tat, &spec.parameters) == Some(written))
        {
            return Err(bad("the provisional update differs from the evaluator's"));
        }
        Ok((plan, now_ms))
    })();
    let (plan, now_ms) = match decided {
        Ok(decided) => decided,
        // The transaction is open, with the provisional update: the connection is not reused.
        Err(error) => return (Err(error), false),
    };
    let ending = plan.ending(|writes| match writes {
        [write] if write.insert => (calls::write(&[*key], writes, &[shard], now_ms), 1),
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
            Some(Increment { millis: 333, remainder: 1, quota: 3 })
        );
        assert_eq!(
            Increment::of(&parameters(3, 1_000, 2), 2),
            Some(Increment { millis: 666, remainder: 2, quota: 3 })
        );
        // One unit an hour, burst 50, a check of 50: 180,000,000 ms.
        assert_eq!(
            Increment::of(&parameters(1, 3_600_000, 50), 50),
            Some(Increment { millis: 180_000_000, remainder: 0, quota: 1 })
        );
        // The longest full replenishment a policy may have: its parts, exactly.
        let longest = runlimit_core::MAX_WINDOW_MILLIS;
        assert_eq!(
            Increment::of(&parameters(1, longest, 1), 1),
            Some(Increment { millis: i64::try_from(longest).unwrap(), remainder: 0, quota: 1 })
        );
    }
}
