//! Pure fixed-window decisions from a database response, and the key-derived lock ids.
//!
//! Kept free of I/O so every rule, including the classification of malformed responses, is
//! unit-tested without a server.

use std::time::Duration;

use runlimit_core::{Allowance, Capacity, Delay, Denial, QuotaDenial, QuotaMode};
use sha2::{Digest, Sha256};

/// Domain tag of the advisory-lock id derivation. See [`lock_id`].
pub(crate) const LOCK_ID_DOMAIN: &[u8] = b"runlimit/postgres/fixed-window-lock/v1";

/// The advisory-lock id of a 64-byte counter key: the first 8 bytes, read as a big-endian
/// signed integer, of `SHA-256(LOCK_ID_DOMAIN || counter_key)`.
///
/// Equal to the SQL expression
/// `('x' || encode(substr(sha256('runlimit/postgres/fixed-window-lock/v1'::bytea || counter_key), 1, 8), 'hex'))::bit(64)::bigint`.
pub(crate) fn lock_id(counter_key: &[u8; 64]) -> i64 {
    let digest = Sha256::new().chain_update(LOCK_ID_DOMAIN).chain_update(counter_key).finalize();
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    i64::from_be_bytes(first)
}

/// The capacity shard of a counter key: byte 32, the first byte of the subject key. Must match
/// the generated column `capacity_shard` of the cardinality migration.
pub(crate) fn shard_of(counter_key: &[u8; 64]) -> u8 {
    counter_key[32]
}

/// One check, reduced to what the decision needs.
#[derive(Clone, Copy, Debug)]
pub(crate) struct CheckSpec {
    pub(crate) limit: Capacity,
    pub(crate) window: Duration,
    pub(crate) shard: u8,
}

/// A stored counter, as read by the preflight phase.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct StoredCounter {
    pub(crate) used: i64,
    /// Window end, microseconds since the Unix epoch (database clock).
    pub(crate) expires_us: i64,
}

/// What to write for one allowed check.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Write {
    /// In-window increment of a stored counter.
    Increment,
    /// Re-anchor an expired stored counter at the clock sample.
    Renew,
    /// Insert a new counter anchored at the clock sample.
    Insert,
}

/// The outcome of a batch decision, for both limiters: `W` is what one allowed check writes
/// (fixed window: [`Write`]; GCRA: `GcraWrite`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Plan<W> {
    /// Every check allowed; `writes[i]` is what check `i` writes.
    Allowed { allowances: Vec<Allowance>, writes: Vec<W> },
    /// Enforced denial at `index`; nothing is written.
    Denied { index: usize, denial: Denial },
    /// Shadow quota denial at `index`; nothing is written.
    ShadowDenied { index: usize, denial: QuotaDenial },
}

impl<W> Plan<W> {
    /// The plan of a batch from its first enforced denial and its first shadow denial (input
    /// indexes): the enforced one wins, then the shadow one; with neither, every check is
    /// allowed with `allowances` and `writes`.
    pub(crate) fn of(
        first_enforced: Option<(usize, Denial)>,
        first_shadow: Option<(usize, QuotaDenial)>,
        allowances: Vec<Allowance>,
        writes: Vec<W>,
    ) -> Self {
        match (first_enforced, first_shadow) {
            (Some((index, denial)), _) => Self::Denied { index, denial },
            (None, Some((index, denial))) => Self::ShadowDenied { index, denial },
            (None, None) => Self::Allowed { allowances, writes },
        }
    }
}

fn micros(duration_us: i64) -> Delay {
    Delay::from_duration(Duration::from_micros(u64::try_from(duration_us).unwrap_or(0)))
}

/// Decides a batch from the stored counters (`stored[i]` for check `i`), the clock sample
/// `now_us` and, when some key has no row, the locked ledger row counts.
///
/// Rules (the same as `runlimit_memory::MemoryStore`): a missing or expired counter
/// (`expires <= now`) starts a new window; a live counter below the limit is incremented; a
/// live counter at the limit is a quota denial whose `retry_after` is `expires - now`. A
/// missing key whose shard already holds `maximum_rows_per_shard` rows (counting new keys of
/// earlier checks in this batch) is a [`Denial::StorageCapacity`] without a delay: expiry
/// does not free a slot, only cleanup does. The first enforced denial in input order wins
/// (capacity denials are enforced in every mode); otherwise the first shadow denial.
///
/// # Errors
///
/// A fixed description of a malformed response: a stored `used` below 1, or a missing key
/// whose shard has no ledger count.
pub(crate) fn decide(
    specs: &[CheckSpec],
    stored: &[Option<StoredCounter>],
    now_us: i64,
    ledger: &[Option<i64>; 256],
    maximum_rows_per_shard: u32,
    mode: QuotaMode,
) -> Result<Plan<Write>, &'static str> {
    if specs.len() != stored.len() {
        return Err("counter rows do not match the checks");
    }
    let mut reserved = [0i64; 256];
    let mut first_enforced: Option<(usize, Denial)> = None;
    let mut first_shadow: Option<(usize, QuotaDenial)> = None;
    let mut allowances = Vec::with_capacity(specs.len());
    let mut writes = Vec::with_capacity(specs.len());
    for (index, (spec, counter)) in specs.iter().zip(stored).enumerate() {
        let limit = spec.limit.get();
        let fresh = || Allowance::new(spec.limit, limit - 1, Delay::from_duration(spec.window));
        let outcome = match counter {
            Some(counter) => {
                let used = u64::try_from(counter.used)
                    .ok()
                    .filter(|used| *used >= 1)
                    .ok_or("stored used below 1")?;
                if counter.expires_us <= now_us {
                    Ok((fresh(), Write::Renew))
                } else {
                    let remaining = micros(counter.expires_us.saturating_sub(now_us));
                    if used >= limit {
                        Err(Denial::QuotaExceeded(QuotaDenial::new(spec.limit, remaining)))
                    } else {
                        Ok((Allowance::new(spec.limit, limit - used - 1, remaining), Write::Increment))
                    }
                }
            }
            None => {
                let shard = usize::from(spec.shard);
                let count = ledger[shard].ok_or("missing capacity ledger row")?;
                if count.saturating_add(reserved[shard]) >= i64::from(maximum_rows_per_shard) {
                    Err(Denial::StorageCapacity { retry_after: None })
                } else {
                    reserved[shard] += 1;
                    Ok((fresh(), Write::Insert))
                }
            }
        };
        match outcome {
            Ok((allowance, write)) => {
                allowances.push(allowance.map_err(|_| "allowance exceeds capacity")?);
                writes.push(write);
            }
            Err(Denial::QuotaExceeded(quota)) if mode == QuotaMode::Shadow => {
                first_shadow.get_or_insert((index, quota));
            }
            Err(denial) => {
                first_enforced.get_or_insert((index, denial));
                if mode == QuotaMode::Enforce {
                    break;
                }
            }
        }
    }
    Ok(Plan::of(first_enforced, first_shadow, allowances, writes))
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_700_000_000_000_000;

    fn spec(limit: u64, window_ms: u64, shard: u8) -> CheckSpec {
        CheckSpec { limit: Capacity::new(limit).unwrap(), window: Duration::from_millis(window_ms), shard }
    }

    fn stored(used: i64, expires_in_us: i64) -> Option<StoredCounter> {
        Some(StoredCounter { used, expires_us: NOW + expires_in_us })
    }

    fn ledger(entries: &[(u8, i64)]) -> [Option<i64>; 256] {
        let mut ledger = [None; 256];
        for &(shard, count) in entries {
            ledger[usize::from(shard)] = Some(count);
        }
        ledger
    }

    fn allowance(limit: u64, available: u64, delay_us: u64) -> Allowance {
        Allowance::new(
            Capacity::new(limit).unwrap(),
            available,
            Delay::from_duration(Duration::from_micros(delay_us)),
        )
        .unwrap()
    }

    #[test]
    fn lock_id_is_stable() {
        // Pinned so the documented derivation (and the SQL expression) cannot drift silently.
        assert_eq!(lock_id(&[0u8; 64]), -6_214_308_709_475_546_244);
        assert_ne!(lock_id(&[0u8; 64]), lock_id(&[1u8; 64]));
        let mut key = [0u8; 64];
        key[32] = 7;
        assert_eq!(shard_of(&key), 7);
    }

    #[test]
    fn fresh_increment_renew_and_deny() {
        let specs = [spec(3, 60_000, 1), spec(3, 60_000, 2), spec(3, 60_000, 3)];
        let rows = [None, stored(1, 2_500), stored(3, 0)];
        let plan = decide(&specs, &rows, NOW, &ledger(&[(1, 0)]), 10, QuotaMode::Enforce).unwrap();
        assert_eq!(
            plan,
            Plan::Allowed {
                allowances: vec![
                    allowance(3, 2, 60_000_000),
                    allowance(3, 1, 2_500),
                    allowance(3, 2, 60_000_000)
                ],
                writes: vec![Write::Insert, Write::Increment, Write::Renew],
            }
        );
    }

    #[test]
    fn quota_denial_reports_remaining_window() {
        let specs = [spec(2, 60_000, 1), spec(2, 60_000, 2)];
        let rows = [stored(1, 10), stored(2, 1_234_567)];
        assert_eq!(
            decide(&specs, &rows, NOW, &ledger(&[]), 10, QuotaMode::Enforce).unwrap(),
            Plan::Denied {
                index: 1,
                denial: Denial::QuotaExceeded(QuotaDenial::new(
                    Capacity::new(2).unwrap(),
                    Delay::from_duration(Duration::from_micros(1_234_567))
                )),
            }
        );
        // A counter above the limit (written by someone else) is exhausted, not malformed.
        assert!(matches!(
            decide(&specs[..1], &[stored(9, 5)], NOW, &ledger(&[]), 10, QuotaMode::Enforce).unwrap(),
            Plan::Denied { index: 0, .. }
        ));
    }

    #[test]
    fn shadow_denial_yields_to_a_later_capacity_denial() {
        let specs = [spec(1, 1_000, 1), spec(1, 1_000, 5)];
        let rows = [stored(1, 500), None];
        let quota =
            QuotaDenial::new(Capacity::new(1).unwrap(), Delay::from_duration(Duration::from_micros(500)));
        assert_eq!(
            decide(&specs, &rows, NOW, &ledger(&[(5, 3)]), 4, QuotaMode::Shadow).unwrap(),
            Plan::ShadowDenied { index: 0, denial: quota }
        );
        assert_eq!(
            decide(&specs, &rows, NOW, &ledger(&[(5, 4)]), 4, QuotaMode::Shadow).unwrap(),
            Plan::Denied { index: 1, denial: Denial::StorageCapacity { retry_after: None } }
        );
        assert_eq!(
            decide(&specs, &rows, NOW, &ledger(&[(5, 4)]), 4, QuotaMode::Enforce).unwrap(),
            Plan::Denied { index: 0, denial: Denial::QuotaExceeded(quota) }
        );
    }

    #[test]
    fn capacity_counts_new_keys_of_the_same_batch() {
        let specs = [spec(5, 1_000, 9), spec(5, 1_000, 9), spec(5, 1_000, 9)];
        let rows = [None, stored(1, 100), None];
        // Shard 9 holds 2 of 3: the first new key fits, the second does not.
        assert_eq!(
            decide(&specs, &rows, NOW, &ledger(&[(9, 2)]), 3, QuotaMode::Enforce).unwrap(),
            Plan::Denied { index: 2, denial: Denial::StorageCapacity { retry_after: None } }
        );
        // An existing key in a full shard keeps working.
        assert!(matches!(
            decide(&specs[1..2], &rows[1..2], NOW, &ledger(&[(9, 3)]), 3, QuotaMode::Enforce).unwrap(),
            Plan::Allowed { .. }
        ));
    }

    #[test]
    fn malformed_responses() {
        let specs = [spec(5, 1_000, 9)];
        assert_eq!(
            decide(&specs, &[stored(0, 5)], NOW, &ledger(&[]), 3, QuotaMode::Enforce),
            Err("stored used below 1")
        );
        assert_eq!(
            decide(&specs, &[None], NOW, &ledger(&[]), 3, QuotaMode::Enforce),
            Err("missing capacity ledger row")
        );
        assert_eq!(
            decide(&specs, &[], NOW, &ledger(&[]), 3, QuotaMode::Enforce),
            Err("counter rows do not match the checks")
        );
    }
}
