//! Structural batch validation shared by every backend.

use crate::{check::Check, key::CounterKey, policy::QuotaMode, policy::RateLimitPolicy};

/// Why a batch was rejected before any backend work: a caller error, never a quota denial.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BatchError {
    /// The batch held no checks. Rejected rather than vacuously allowed, so a caller that
    /// filtered every check out fails closed instead of admitting an unevaluated request.
    #[error("empty batch")]
    EmptyBatch,
    /// The batch held more checks than the backend accepts in one atomic operation.
    #[error("batch of {batch_size} checks exceeds the maximum of {maximum}")]
    TooManyChecks {
        /// Number of checks given.
        batch_size: usize,
        /// The backend's configured maximum.
        maximum: usize,
    },
    /// Checks in the batch use different [`QuotaMode`]s. A batch is all-or-nothing, so a
    /// shadow policy cannot share one with enforced policies; check it separately.
    #[error("check {index} uses quota mode {mode:?}, unlike check 0")]
    MixedQuotaModes {
        /// Index of the first check whose mode differs from check 0's.
        index: usize,
        /// That check's mode.
        mode: QuotaMode,
    },
    /// Two checks share one storage key (same policy fingerprint and subject key).
    #[error("check {duplicate_index} repeats the storage key of check {first_index}")]
    DuplicateCounterKey {
        /// The earlier check.
        first_index: usize,
        /// The later check with the same key.
        duplicate_index: usize,
    },
}

/// Validates a batch's structure and returns its common quota mode.
///
/// Every backend calls this before touching storage, so the rules and their order are the
/// same everywhere: [`BatchError::EmptyBatch`], then [`BatchError::TooManyChecks`] (when
/// `checks.len() > maximum_batch_size`), then [`BatchError::MixedQuotaModes`], then
/// [`BatchError::DuplicateCounterKey`] (the pair with the smallest later index).
///
/// # Errors
///
/// The first rule violated, as listed above.
pub fn validate_batch<P: RateLimitPolicy>(
    checks: &[Check<'_, P>],
    maximum_batch_size: usize,
) -> Result<QuotaMode, BatchError> {
    let Some(first) = checks.first() else {
        return Err(BatchError::EmptyBatch);
    };
    if checks.len() > maximum_batch_size {
        return Err(BatchError::TooManyChecks { batch_size: checks.len(), maximum: maximum_batch_size });
    }
    let mode = first.policy().quota_mode();
    if let Some((index, check)) = checks.iter().enumerate().find(|(_, c)| c.policy().quota_mode() != mode) {
        return Err(BatchError::MixedQuotaModes { index, mode: check.policy().quota_mode() });
    }
    if let Some((first_index, duplicate_index)) = find_duplicate(checks) {
        return Err(BatchError::DuplicateCounterKey { first_index, duplicate_index });
    }
    Ok(mode)
}

fn find_duplicate<P: RateLimitPolicy>(checks: &[Check<'_, P>]) -> Option<(usize, usize)> {
    if checks.len() <= 16 {
        // Pairwise, without allocating: this runs on every batch admission, and small
        // batches are the common case (at most 120 comparisons of two 32-byte halves).
        // Fingerprints first: batches usually share one subject under distinct policies.
        for later in 1..checks.len() {
            let (fingerprint, subject) = (checks[later].policy().fingerprint(), checks[later].subject());
            if let Some(earlier) = checks[..later]
                .iter()
                .position(|check| check.policy().fingerprint() == fingerprint && check.subject() == subject)
            {
                return Some((earlier, later));
            }
        }
        return None;
    }
    let mut keyed: Vec<(CounterKey, usize)> = checks.iter().map(Check::counter_key).zip(0..).collect();
    keyed.sort_unstable();
    // Sorted by (key, index): the first two entries of each run of equal keys are that
    // key's earliest pair. Report the pair whose later index is smallest.
    let mut best: Option<(usize, usize)> = None;
    let mut start = 0;
    while start < keyed.len() {
        let mut end = start + 1;
        while end < keyed.len() && keyed[end].0 == keyed[start].0 {
            end += 1;
        }
        if end - start >= 2 {
            let pair = (keyed[start].1, keyed[start + 1].1);
            if best.is_none_or(|(_, later)| pair.1 < later) {
                best = Some(pair);
            }
        }
        start = end;
    }
    best
}
