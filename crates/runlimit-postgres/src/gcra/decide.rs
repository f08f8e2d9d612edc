//! Pure GCRA batch decisions from the locked ledger rows and stored arrival times.
//!
//! Kept free of I/O so every rule, including the classification of malformed responses, is
//! unit-tested without a server. The arithmetic is `runlimit_core::gcra::evaluate`, the
//! evaluator `runlimit_memory::GcraStore` uses.

use runlimit_core::{
    Denial, QuotaDenial, QuotaMode,
    backend::gcra::{self, GcraOutcome, GcraParameters, TheoreticalArrivalTime},
};

use crate::decide::Plan;

/// One check, reduced to what the decision needs.
#[derive(Clone, Copy, Debug)]
pub(crate) struct GcraSpec {
    pub(crate) parameters: GcraParameters,
    pub(crate) shard: u8,
}

/// A stored arrival time as its exact `bigint` parts: `tat = tat_ms × Q + tat_remainder`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct StoredTat {
    pub(crate) tat_ms: i64,
    pub(crate) tat_remainder: i64,
}

/// A locked ledger row: the shard's row count and committed time watermark.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct LedgerRow {
    pub(crate) row_count: i64,
    pub(crate) watermark_ms: i64,
}

/// The row an allowed check writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct GcraWrite {
    /// Whether the key has no row yet (insert) or has one, live or expired (update).
    pub(crate) insert: bool,
    pub(crate) tat: StoredTat,
    /// ⌈tat / Q⌉: the first millisecond at which the row may be deleted.
    pub(crate) expires_at_ms: i64,
}

/// The evaluation time: the clock sample clamped to the latest committed watermark of the
/// locked shards, so a backwards clock step never replenishes quota early.
///
/// # Errors
///
/// A fixed description when the sample or a watermark is negative.
pub(crate) fn effective_now(
    clock_ms: i64,
    watermarks: impl IntoIterator<Item = i64>,
) -> Result<u64, &'static str> {
    let now = watermarks.into_iter().fold(clock_ms, i64::max);
    u64::try_from(clock_ms).ok().and(u64::try_from(now).ok()).ok_or("negative database time")
}

fn stored_tat(stored: StoredTat, parameters: &GcraParameters) -> Option<TheoreticalArrivalTime> {
    let millis = u64::try_from(stored.tat_ms).ok()?;
    let remainder = u64::try_from(stored.tat_remainder).ok()?;
    TheoreticalArrivalTime::from_parts(millis, remainder, parameters)
}

fn to_write(
    insert: bool,
    tat: TheoreticalArrivalTime,
    parameters: &GcraParameters,
) -> Result<GcraWrite, &'static str> {
    const OUT_OF_RANGE: &str = "arrival time does not fit bigint";
    let (millis, remainder) = tat.to_parts(parameters).ok_or(OUT_OF_RANGE)?;
    Ok(GcraWrite {
        insert,
        tat: StoredTat {
            tat_ms: i64::try_from(millis).map_err(|_| OUT_OF_RANGE)?,
            tat_remainder: i64::try_from(remainder).map_err(|_| OUT_OF_RANGE)?,
        },
        expires_at_ms: i64::try_from(tat.expires_at_millis(parameters)).map_err(|_| OUT_OF_RANGE)?,
    })
}

/// Decides a batch at `now_ms` (already clamped by [`effective_now`]) from the stored
/// arrival times (`stored[i]` for check `i`, `None` when the key has no row) and the locked
/// ledger rows of every shard the batch touches.
///
/// Rules (those of `runlimit_memory::GcraStore`): each check costs one unit and is evaluated
/// by [`gcra::evaluate`]; an expired row is equivalent to no state and is reused by its key.
/// A key without a row whose shard already holds `maximum_rows_per_shard` rows (counting new
/// keys of earlier checks in this batch) is a [`Denial::StorageCapacity`] without a delay:
/// expiry does not free a slot, only cleanup does. The first enforced denial in input order
/// wins (capacity denials are enforced in every mode); otherwise the first shadow denial.
///
/// # Errors
///
/// A fixed description of a malformed response: a stored arrival time outside every range the
/// evaluator produces, a touched shard without a ledger row, or mismatched lengths.
pub(crate) fn decide_gcra(
    specs: &[GcraSpec],
    stored: &[Option<StoredTat>],
    now_ms: u64,
    ledger: &[Option<LedgerRow>; 256],
    maximum_rows_per_shard: u32,
    mode: QuotaMode,
) -> Result<Plan<GcraWrite>, &'static str> {
    if specs.len() != stored.len() {
        return Err("stored rows do not match the checks");
    }
    let mut reserved = [0i64; 256];
    let mut first_enforced: Option<(usize, Denial)> = None;
    let mut first_shadow: Option<(usize, QuotaDenial)> = None;
    let mut allowances = Vec::with_capacity(specs.len());
    let mut writes = Vec::with_capacity(specs.len());
    for (index, (spec, row)) in specs.iter().zip(stored).enumerate() {
        let parameters = &spec.parameters;
        let shard = usize::from(spec.shard);
        let ledger_row = ledger[shard].ok_or("missing capacity ledger row")?;
        let tat = match row {
            Some(row) => Some(stored_tat(*row, parameters).ok_or("stored arrival time out of range")?),
            None => None,
        };
        let outcome =
            gcra::evaluate(parameters, tat, now_ms, 1).map_err(|_| "stored arrival time out of range")?;
        let denial = match outcome {
            GcraOutcome::Allowed { tat: next, .. } => {
                if row.is_none() {
                    if ledger_row.row_count.saturating_add(reserved[shard])
                        >= i64::from(maximum_rows_per_shard)
                    {
                        first_enforced.get_or_insert((index, Denial::StorageCapacity { retry_after: None }));
                        continue;
                    }
                    reserved[shard] += 1;
                }
                allowances.push(outcome.allowance(parameters).ok_or("allowance exceeds capacity")?);
                writes.push(to_write(row.is_none(), next, parameters)?);
                continue;
            }
            GcraOutcome::Denied { .. } => outcome.quota_denial(parameters).ok_or("missing quota denial")?,
        };
        match mode {
            QuotaMode::Shadow => {
                first_shadow.get_or_insert((index, denial));
            }
            QuotaMode::Enforce => {
                first_enforced.get_or_insert((index, Denial::QuotaExceeded(denial)));
            }
        }
    }
    Ok(Plan::of(first_enforced, first_shadow, allowances, writes))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use runlimit_core::{Allowance, Capacity, Delay, QuotaPeriod};

    use super::*;

    fn spec(q: u64, p_ms: u64, b: u64, shard: u8) -> GcraSpec {
        let parameters = GcraParameters::new(
            Capacity::new(q).unwrap(),
            QuotaPeriod::new(Duration::from_millis(p_ms)).unwrap(),
            Capacity::new(b).unwrap(),
        )
        .unwrap();
        GcraSpec { parameters, shard }
    }

    fn ledger(entries: &[(u8, i64)]) -> [Option<LedgerRow>; 256] {
        let mut ledger = [None; 256];
        for &(shard, row_count) in entries {
            ledger[usize::from(shard)] = Some(LedgerRow { row_count, watermark_ms: 0 });
        }
        ledger
    }

    fn allowance(b: u64, available: u64, ms: u64) -> Allowance {
        Allowance::new(Capacity::new(b).unwrap(), available, Delay::from_millis(ms)).unwrap()
    }

    #[test]
    fn clamps_to_the_latest_watermark() {
        assert_eq!(effective_now(1_000, [400, 1_500, 900]), Ok(1_500));
        assert_eq!(effective_now(1_000, [400]), Ok(1_000));
        assert_eq!(effective_now(-1, [5]), Err("negative database time"));
    }

    #[test]
    fn vector_v2_through_stored_parts() {
        // Q=3 per 1000 ms, burst 2: two allowed at t=0, then tat = 2000 scaled = (666, 2).
        let specs = [spec(3, 1_000, 2, 4)];
        let rows = ledger(&[(4, 0)]);
        let first = decide_gcra(&specs, &[None], 0, &rows, 10, QuotaMode::Enforce).unwrap();
        let write =
            GcraWrite { insert: true, tat: StoredTat { tat_ms: 333, tat_remainder: 1 }, expires_at_ms: 334 };
        assert_eq!(first, Plan::Allowed { allowances: vec![allowance(2, 1, 334)], writes: vec![write] });
        let second = decide_gcra(&specs, &[Some(write.tat)], 0, &rows, 10, QuotaMode::Enforce).unwrap();
        let tat = StoredTat { tat_ms: 666, tat_remainder: 2 };
        assert_eq!(
            second,
            Plan::Allowed {
                allowances: vec![allowance(2, 0, 667)],
                writes: vec![GcraWrite { insert: false, tat, expires_at_ms: 667 }],
            }
        );
        let denied = decide_gcra(&specs, &[Some(tat)], 333, &rows, 10, QuotaMode::Enforce).unwrap();
        assert_eq!(
            denied,
            Plan::Denied {
                index: 0,
                denial: Denial::QuotaExceeded(QuotaDenial::new(
                    Capacity::new(2).unwrap(),
                    Delay::from_millis(1)
                ))
            }
        );
        // An expired row is reused by its key: updated, not inserted.
        let rested = decide_gcra(&specs, &[Some(tat)], 5_000, &rows, 1, QuotaMode::Enforce).unwrap();
        let Plan::Allowed { writes, .. } = rested else { panic!("{rested:?}") };
        assert!(!writes[0].insert);
    }

    #[test]
    fn shadow_and_capacity() {
        let specs = [spec(1, 1_000, 1, 1), spec(1, 1_000, 1, 5)];
        let exhausted = Some(StoredTat { tat_ms: 1_500, tat_remainder: 0 });
        let quota = QuotaDenial::new(Capacity::new(1).unwrap(), Delay::from_millis(500));
        let room = ledger(&[(1, 1), (5, 3)]);
        let full = ledger(&[(1, 1), (5, 4)]);
        assert_eq!(
            decide_gcra(&specs, &[exhausted, None], 1_000, &room, 4, QuotaMode::Shadow).unwrap(),
            Plan::ShadowDenied { index: 0, denial: quota }
        );
        assert_eq!(
            decide_gcra(&specs, &[exhausted, None], 1_000, &full, 4, QuotaMode::Shadow).unwrap(),
            Plan::Denied { index: 1, denial: Denial::StorageCapacity { retry_after: None } }
        );
        assert_eq!(
            decide_gcra(&specs, &[exhausted, None], 1_000, &full, 4, QuotaMode::Enforce).unwrap(),
            Plan::Denied { index: 0, denial: Denial::QuotaExceeded(quota) }
        );
        // New keys of one batch count against the same shard.
        let same = [spec(1, 1_000, 1, 9), spec(2, 1_000, 1, 9)];
        assert_eq!(
            decide_gcra(&same, &[None, None], 0, &ledger(&[(9, 2)]), 3, QuotaMode::Enforce).unwrap(),
            Plan::Denied { index: 1, denial: Denial::StorageCapacity { retry_after: None } }
        );
    }

    #[test]
    fn malformed_responses() {
        let specs = [spec(3, 1_000, 2, 4)];
        let bad = Some(StoredTat { tat_ms: 1, tat_remainder: 3 });
        assert_eq!(
            decide_gcra(&specs, &[bad], 0, &ledger(&[(4, 0)]), 3, QuotaMode::Enforce),
            Err("stored arrival time out of range")
        );
        let negative = Some(StoredTat { tat_ms: -1, tat_remainder: 0 });
        assert_eq!(
            decide_gcra(&specs, &[negative], 0, &ledger(&[(4, 0)]), 3, QuotaMode::Enforce),
            Err("stored arrival time out of range")
        );
        assert_eq!(
            decide_gcra(&specs, &[None], 0, &ledger(&[]), 3, QuotaMode::Enforce),
            Err("missing capacity ledger row")
        );
        assert_eq!(
            decide_gcra(&specs, &[], 0, &ledger(&[]), 3, QuotaMode::Enforce),
            Err("stored rows do not match the checks")
        );
    }
}
