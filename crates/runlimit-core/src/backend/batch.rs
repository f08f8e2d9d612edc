//! The atomic-batch rule shared by every backend: structural validation, denial precedence
//! and the allowed decision.
//!
//! A batch is all-or-nothing. A backend
//!
//! 1. rejects a structurally invalid batch with [`validate`] before any storage work;
//! 2. evaluates every check in input order against state it holds locked, writing nothing,
//!    and reports each denial to a [`Precedence`];
//! 3. commits every check together only when [`Precedence::denial`] is `None`, and answers
//!    with [`allowed`] (the allowances in input order); otherwise it writes nothing and
//!    answers with [`BatchDenial::into_decision`].
//!
//! # Precedence
//!
//! Storage-capacity denials are enforced in every quota mode. So:
//!
//! - under [`QuotaMode::Enforce`] every denial is enforced, and the one with the lowest input
//!   index wins, whatever its reason;
//! - under [`QuotaMode::Shadow`] the first storage-capacity denial wins over every (shadow)
//!   quota denial, whatever their order; without one, the first quota denial makes the batch
//!   shadow-denied (admitted, nothing consumed).
//!
//! "First enforced denial wins, else first shadow denial", in one place.
//!
//! # Examples
//!
//! ```
//! use runlimit_core::{BatchDecisionView, Capacity, Delay, Denial, QuotaDenial, QuotaMode};
//! use runlimit_core::backend::batch::Precedence;
//!
//! let quota = QuotaDenial::new(Capacity::new(5)?, Delay::from_millis(700));
//! // Shadow mode: check 1 is quota-exhausted, check 3 is a new key for a full shard.
//! let mut precedence = Precedence::new(QuotaMode::Shadow);
//! precedence.quota_exceeded(1, quota);
//! precedence.storage_capacity(3);
//! let denial = precedence.denial().expect("a denial");
//! assert_eq!(denial.index(), 3);
//! let decision = denial.into_decision(4, None)?;
//! assert_eq!(
//!     decision.view(),
//!     BatchDecisionView::Denied { index: 3, batch_size: 4, denial: &Denial::StorageCapacity { retry_after: None } },
//! );
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use crate::{
    batch::BatchError,
    check::Check,
    decision::{Allowance, BatchDecision, BatchDecisionError, Decision, Denial, QuotaDenial},
    delay::Delay,
    key::CounterKey,
    policy::{QuotaMode, RateLimitPolicy},
};

/// Validates a batch's structure and returns its common quota mode.
///
/// Every backend calls this before touching storage (before taking a lock or acquiring a
/// connection), so the rules and their order are the same everywhere: [`BatchError::EmptyBatch`], then [`BatchError::TooManyChecks`] (when
/// `checks.len() > maximum_batch_size`), then [`BatchError::MixedQuotaModes`], then
/// [`BatchError::DuplicateCounterKey`] (the pair with the smallest later index).
///
/// # Errors
///
/// The first rule violated, as listed above.
pub fn validate<P: RateLimitPolicy>(
    checks: &[Check<'_, P>],
    maximum_batch_size: usize,
) -> Result<QuotaMode, BatchError> {
    let mode = validate_shape(checks, maximum_batch_size)?;
    if let Some((first_index, duplicate_index)) = find_duplicate(checks) {
        return Err(BatchError::DuplicateCounterKey { first_index, duplicate_index });
    }
    Ok(mode)
}

/// Every rule of [`validate`] but the last: [`BatchError::EmptyBatch`], then
/// [`BatchError::TooManyChecks`], then [`BatchError::MixedQuotaModes`]; returns the batch's
/// common quota mode.
///
/// For a backend that derives a storage key per check anyway, where equal counter keys always
/// give equal storage keys: when its storage keys are pairwise distinct, so are the counter
/// keys, and this answers exactly as [`validate`] would; when two storage keys are equal it must
/// call [`validate`], which finds the duplicate (or none, if distinct counter keys share a
/// storage key). The memory stores do this: comparing their 16-byte keys costs less than
/// comparing 64-byte counter keys.
///
/// # Errors
///
/// The first rule violated, as listed above.
#[inline]
pub fn validate_shape<P: RateLimitPolicy>(
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

/// An allowed batch from its allowances in input order, one per check.
///
/// Equal to [`BatchDecision::allowed`] of the same allowances collected into a `Vec`, but one
/// or two allowances are stored inline, without a heap allocation (a backend's hot path).
///
/// # Errors
///
/// [`BatchDecisionError::NoAllowances`] when the iterator yields nothing.
#[inline]
pub fn allowed(allowances: impl IntoIterator<Item = Allowance>) -> Result<BatchDecision, BatchDecisionError> {
    BatchDecision::allowed_from_iter(allowances)
}

/// The denial precedence of one batch (see the [module documentation](self#precedence)):
/// report each check's denial in input order, then read the winner with
/// [`denial`](Self::denial).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Precedence {
    mode: QuotaMode,
    quota: Option<(usize, QuotaDenial)>,
    storage: Option<usize>,
}

impl Precedence {
    /// No denial yet, for a batch whose checks all use `mode` (see [`validate`]).
    #[inline]
    #[must_use]
    pub const fn new(mode: QuotaMode) -> Self {
        Self { mode, quota: None, storage: None }
    }

    /// The batch's quota mode.
    #[must_use]
    pub const fn mode(&self) -> QuotaMode {
        self.mode
    }

    /// Check `index`'s quota is exhausted. Only the first such check is kept.
    #[inline]
    pub fn quota_exceeded(&mut self, index: usize, denial: QuotaDenial) {
        if self.quota.is_none() {
            self.quota = Some((index, denial));
        }
    }

    /// Check `index` was allowed by its quota but needs a storage slot the backend cannot
    /// give it (its shard is full, counting the new keys of earlier checks of the batch).
    /// Only the first such check is kept.
    #[inline]
    pub fn storage_capacity(&mut self, index: usize) {
        if self.storage.is_none() {
            self.storage = Some(index);
        }
    }

    /// Whether no later check can change the winner, so a backend may stop evaluating: an
    /// enforced denial is recorded (any denial under enforcement, a storage denial in shadow
    /// mode).
    #[inline]
    #[must_use]
    pub const fn is_settled(&self) -> bool {
        self.storage.is_some() || (self.quota.is_some() && matches!(self.mode, QuotaMode::Enforce))
    }

    /// The winning denial, or `None` when every check was allowed and the batch may commit.
    #[inline]
    #[must_use]
    pub fn denial(&self) -> Option<BatchDenial> {
        let mode = self.mode;
        match (self.storage, self.quota) {
            (Some(storage), Some((index, denial))) if mode == QuotaMode::Enforce && index < storage => {
                Some(BatchDenial { index, reason: Reason::Quota(denial), mode })
            }
            (Some(index), _) => Some(BatchDenial { index, reason: Reason::Storage, mode }),
            (None, Some((index, denial))) => Some(BatchDenial { index, reason: Reason::Quota(denial), mode }),
            (None, None) => None,
        }
    }
}

/// The denial that decides a batch: see [`Precedence::denial`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchDenial {
    index: usize,
    reason: Reason,
    mode: QuotaMode,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Reason {
    Quota(QuotaDenial),
    Storage,
}

impl BatchDenial {
    /// The input index of the deciding check.
    #[must_use]
    pub const fn index(&self) -> usize {
        self.index
    }

    /// Whether the batch is denied for storage capacity (the backend then computes the delay
    /// it passes to [`into_decision`](Self::into_decision)).
    #[must_use]
    pub const fn is_storage_capacity(&self) -> bool {
        matches!(self.reason, Reason::Storage)
    }

    /// The batch decision: [`Denial::StorageCapacity`] with `storage_retry_after` (the time
    /// until the batch may fit, when the backend knows it; ignored for a quota denial), an
    /// enforced [`Denial::QuotaExceeded`], or a shadow denial. Nothing of the batch is
    /// consumed in any case.
    ///
    /// # Errors
    ///
    /// [`BatchDecisionError::IndexOutOfRange`] unless the deciding index is below
    /// `batch_size`.
    #[inline]
    pub fn into_decision(
        self,
        batch_size: usize,
        storage_retry_after: Option<Delay>,
    ) -> Result<BatchDecision, BatchDecisionError> {
        match self.reason {
            Reason::Storage => BatchDecision::denied(
                self.index,
                batch_size,
                Denial::StorageCapacity { retry_after: storage_retry_after },
            ),
            Reason::Quota(denial) => BatchDecision::quota_exceeded(self.index, batch_size, denial, self.mode),
        }
    }

    /// The same denial as the decision of a single check (a batch of one), for a backend that
    /// decides single checks with the batch rule: [`Denial::StorageCapacity`] with
    /// `storage_retry_after`, an enforced [`Denial::QuotaExceeded`], or a shadow denial.
    #[inline]
    #[must_use]
    pub fn into_check_decision(self, storage_retry_after: Option<Delay>) -> Decision {
        match self.reason {
            Reason::Storage => Decision::denied(Denial::StorageCapacity { retry_after: storage_retry_after }),
            Reason::Quota(denial) => Decision::quota_exceeded(denial, self.mode),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{BatchDecisionView, Capacity};

    fn quota(retry_ms: u64) -> QuotaDenial {
        QuotaDenial::new(Capacity::new(3).unwrap(), Delay::from_millis(retry_ms))
    }

    fn decide(mode: QuotaMode, quotas: &[(usize, u64)], storage: &[usize]) -> Option<BatchDecision> {
        let mut precedence = Precedence::new(mode);
        // Interleave in input order, as a backend reports them.
        let mut events: Vec<(usize, Option<u64>)> = quotas.iter().map(|&(i, r)| (i, Some(r))).collect();
        events.extend(storage.iter().map(|&i| (i, None)));
        events.sort_unstable();
        for (index, retry) in events {
            match retry {
                Some(retry) => precedence.quota_exceeded(index, quota(retry)),
                None => precedence.storage_capacity(index),
            }
        }
        precedence.denial().map(|denial| denial.into_decision(6, Some(Delay::from_millis(42))).unwrap())
    }

    #[test]
    fn enforcement_reports_the_earliest_denial_whatever_its_reason() {
        let storage = Denial::StorageCapacity { retry_after: Some(Delay::from_millis(42)) };
        let at = |index, denial| BatchDecision::denied(index, 6, denial).unwrap();
        assert_eq!(
            decide(QuotaMode::Enforce, &[(1, 10), (4, 20)], &[2]),
            Some(at(1, Denial::QuotaExceeded(quota(10))))
        );
        assert_eq!(decide(QuotaMode::Enforce, &[(3, 10)], &[2, 5]), Some(at(2, storage)));
        assert_eq!(decide(QuotaMode::Enforce, &[], &[]), None);
    }

    #[test]
    fn shadow_mode_lets_a_storage_denial_win_over_every_quota_denial() {
        let storage = Denial::StorageCapacity { retry_after: Some(Delay::from_millis(42)) };
        assert_eq!(
            decide(QuotaMode::Shadow, &[(0, 10)], &[4]),
            Some(BatchDecision::denied(4, 6, storage).unwrap())
        );
        let shadow = decide(QuotaMode::Shadow, &[(2, 10), (3, 20)], &[]).unwrap();
        assert_eq!(
            shadow.view(),
            BatchDecisionView::ShadowDenied { index: 2, batch_size: 6, denial: &quota(10) }
        );
        assert!(shadow.permits_request());
    }

    #[test]
    fn settled_means_no_later_check_can_win() {
        let mut enforce = Precedence::new(QuotaMode::Enforce);
        assert!(!enforce.is_settled());
        enforce.quota_exceeded(0, quota(1));
        assert!(enforce.is_settled());
        let mut shadow = Precedence::new(QuotaMode::Shadow);
        shadow.quota_exceeded(0, quota(1));
        assert!(!shadow.is_settled(), "a later storage denial would still win");
        shadow.storage_capacity(1);
        assert!(shadow.is_settled());
        assert_eq!(shadow.denial().map(|d| (d.index(), d.is_storage_capacity())), Some((1, true)));
        assert_eq!(Precedence::new(QuotaMode::Enforce).denial().map(|d| d.into_decision(0, None)), None);
        let mut out_of_range = Precedence::new(QuotaMode::Enforce);
        out_of_range.storage_capacity(2);
        assert_eq!(
            out_of_range.denial().unwrap().into_decision(2, None),
            Err(BatchDecisionError::IndexOutOfRange { index: 2, batch_size: 2 })
        );
    }
}
