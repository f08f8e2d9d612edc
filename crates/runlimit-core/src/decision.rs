//! Exhaustive typed decisions for single checks and atomic batches.
//!
//! # Design
//!
//! A denial is not an error. Backends return `Ok(Decision)` for every evaluated check and
//! reserve `Err` for failures to evaluate (a poisoned shard, a database fault), which must be
//! treated as admission failures. Compare governor's `Result<Result<_, NotUntil>, _>`:
//! here an outcome is always a named match arm of [`DecisionView`], and every reason an
//! enforced denial can have is a variant of [`Denial`].

use crate::{delay::Delay, policy::Capacity, policy::QuotaMode};

/// Why [`Allowance::new`] rejected its values.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("available units ({available}) exceed the capacity ({capacity})")]
pub struct AllowanceError {
    /// The rejected available count.
    pub available: u64,
    /// The capacity it exceeded.
    pub capacity: u64,
}

/// What an allowed check leaves: the units still available and when the quota is fully
/// replenished.
///
/// For a fixed window, `capacity` is the limit, `available` the checks left in the current
/// window, and `replenishes_after` the time until the anchored window ends. For GCRA,
/// `capacity` is the burst capacity, `available` the units spendable immediately (rounded
/// down), and `replenishes_after` the time until the subject is fully rested (rounded up to
/// a whole millisecond).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Allowance {
    capacity: Capacity,
    available: u64,
    replenishes_after: Delay,
}

impl Allowance {
    /// Checks that `available` does not exceed `capacity`.
    ///
    /// # Errors
    ///
    /// [`AllowanceError`] when `available > capacity`.
    pub fn new(capacity: Capacity, available: u64, replenishes_after: Delay) -> Result<Self, AllowanceError> {
        if available > capacity.get() {
            return Err(AllowanceError { available, capacity: capacity.get() });
        }
        Ok(Self { capacity, available, replenishes_after })
    }

    /// An allowance whose `available ≤ capacity` the caller (a rule of this crate) has
    /// established.
    #[inline]
    pub(crate) const fn exact(capacity: Capacity, available: u64, replenishes_after: Delay) -> Self {
        debug_assert!(available <= capacity.get());
        Self { capacity, available, replenishes_after }
    }

    /// The policy's capacity (fixed-window limit or GCRA burst capacity).
    #[must_use]
    pub fn capacity(&self) -> Capacity {
        self.capacity
    }

    /// Units still available after this check, at most [`capacity`](Self::capacity).
    #[must_use]
    pub fn available(&self) -> u64 {
        self.available
    }

    /// Time until the quota is fully replenished, measured by the backend.
    #[must_use]
    pub fn replenishes_after(&self) -> Delay {
        self.replenishes_after
    }
}

/// A quota denial: the capacity that was exhausted and when the same check can succeed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct QuotaDenial {
    capacity: Capacity,
    retry_after: Delay,
}

impl QuotaDenial {
    /// A quota denial. Both values are already validated, so this cannot fail.
    #[must_use]
    pub const fn new(capacity: Capacity, retry_after: Delay) -> Self {
        Self { capacity, retry_after }
    }

    /// The exhausted capacity (fixed-window limit or GCRA burst capacity).
    #[must_use]
    pub const fn capacity(&self) -> Capacity {
        self.capacity
    }

    /// The earliest time after which the same check would be allowed, measured by the
    /// backend. Use [`Delay::seconds`] for an HTTP `Retry-After`.
    #[must_use]
    pub const fn retry_after(&self) -> Delay {
        self.retry_after
    }
}

/// Why a check was denied under enforcement. Exhaustive on purpose: every reason is a match
/// arm.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Denial {
    /// The subject's quota is exhausted.
    QuotaExceeded(QuotaDenial),
    /// The backend is full and cannot store a new key. Fail-closed in every quota mode.
    StorageCapacity {
        /// When the backend knows its earliest expiry that could make room for this
        /// operation, the time until then; otherwise `None`.
        retry_after: Option<Delay>,
    },
}

/// The outcome of one check. Read it with [`view`](Self::view), [`admit`](Self::admit) or
/// [`permits_request`](Self::permits_request).
///
/// # Examples
///
/// ```
/// use runlimit_core::{Allowance, Capacity, Decision, DecisionView, Delay, QuotaDenial, QuotaMode};
///
/// let capacity = Capacity::new(5)?;
/// let shadow = Decision::quota_exceeded(
///     QuotaDenial::new(capacity, Delay::from_millis(1_500)),
///     QuotaMode::Shadow,
/// );
/// assert!(shadow.permits_request());
/// assert!(matches!(shadow.view(), DecisionView::ShadowDenied { .. }));
///
/// let allowed = Decision::allowed(Allowance::new(capacity, 4, Delay::from_millis(60_000))?);
/// let admitted = allowed.admit().map_err(|_| "denied")?;
/// assert_eq!(admitted.allowance().map(|a| a.available()), Some(4));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Decision {
    inner: Outcome,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Outcome {
    Allowed(Allowance),
    ShadowDenied(QuotaDenial),
    Denied(Denial),
}

/// A borrowed, exhaustive view of a [`Decision`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecisionView<'a> {
    /// The check was allowed and consumed its cost.
    Allowed {
        /// What remains.
        allowance: &'a Allowance,
    },
    /// A shadow policy's quota is exhausted: the request is admitted, nothing was consumed,
    /// and `denial` is what enforcement would have answered.
    ShadowDenied {
        /// The denial enforcement would have returned.
        denial: &'a QuotaDenial,
    },
    /// Enforced denial: the request must be rejected.
    Denied {
        /// Why.
        denial: &'a Denial,
    },
}

/// A decision that lets the request proceed: allowed, or shadow-denied. It cannot hold an
/// enforced denial, so code that receives one never re-checks enforcement.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Admitted {
    /// Allowed; the check's cost consumed.
    Allowed(Allowance),
    /// Shadow-denied; nothing consumed.
    ShadowDenied(QuotaDenial),
}

impl Admitted {
    /// The allowance when allowed, `None` when shadow-denied.
    #[must_use]
    pub fn allowance(&self) -> Option<&Allowance> {
        match self {
            Self::Allowed(allowance) => Some(allowance),
            Self::ShadowDenied(_) => None,
        }
    }
}

impl Decision {
    /// An allowed decision.
    #[must_use]
    pub const fn allowed(allowance: Allowance) -> Self {
        Self { inner: Outcome::Allowed(allowance) }
    }

    /// An enforced denial.
    #[must_use]
    pub const fn denied(denial: Denial) -> Self {
        Self { inner: Outcome::Denied(denial) }
    }

    /// A shadow denial: admitted, nothing consumed.
    #[must_use]
    pub const fn shadow_denied(denial: QuotaDenial) -> Self {
        Self { inner: Outcome::ShadowDenied(denial) }
    }

    /// Quota exhaustion under `mode`: [`Denial::QuotaExceeded`] when enforcing, a shadow
    /// denial when shadowing.
    #[must_use]
    pub const fn quota_exceeded(denial: QuotaDenial, mode: QuotaMode) -> Self {
        match mode {
            QuotaMode::Enforce => Self::denied(Denial::QuotaExceeded(denial)),
            QuotaMode::Shadow => Self::shadow_denied(denial),
        }
    }

    /// The exhaustive view.
    #[must_use]
    pub fn view(&self) -> DecisionView<'_> {
        match &self.inner {
            Outcome::Allowed(allowance) => DecisionView::Allowed { allowance },
            Outcome::ShadowDenied(denial) => DecisionView::ShadowDenied { denial },
            Outcome::Denied(denial) => DecisionView::Denied { denial },
        }
    }

    /// The only boolean admission predicate: true for allowed and shadow-denied decisions,
    /// false for every enforced denial.
    #[must_use]
    pub fn permits_request(&self) -> bool {
        !matches!(self.inner, Outcome::Denied(_))
    }

    /// Splits the decision into the [`Admitted`] value a handler may proceed with, or the
    /// [`Denial`] it must enforce.
    ///
    /// # Errors
    ///
    /// The enforced [`Denial`], for an enforced denial.
    pub fn admit(self) -> Result<Admitted, Denial> {
        match self.inner {
            Outcome::Allowed(allowance) => Ok(Admitted::Allowed(allowance)),
            Outcome::ShadowDenied(denial) => Ok(Admitted::ShadowDenied(denial)),
            Outcome::Denied(denial) => Err(denial),
        }
    }
}

impl From<Admitted> for Decision {
    fn from(admitted: Admitted) -> Self {
        match admitted {
            Admitted::Allowed(allowance) => Self::allowed(allowance),
            Admitted::ShadowDenied(denial) => Self::shadow_denied(denial),
        }
    }
}

/// Why a [`BatchDecision`] constructor rejected its values.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BatchDecisionError {
    /// An allowed batch must hold at least one allowance.
    #[error("an allowed batch has no allowances")]
    NoAllowances,
    /// A denied batch's index must be below its size.
    #[error("denied index {index} is not below the batch size {batch_size}")]
    IndexOutOfRange {
        /// The rejected index.
        index: usize,
        /// The batch size.
        batch_size: usize,
    },
}

/// The outcome of an atomic batch: every check allowed (and consumed together), or the first
/// denied check in input order (and nothing consumed).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct BatchDecision {
    inner: BatchOutcome,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum BatchOutcome {
    Allowed(AllowedList),
    Denied { index: usize, batch_size: usize, denial: Denial },
    ShadowDenied { index: usize, batch_size: usize, denial: QuotaDenial },
}

/// The allowances of an allowed batch. One or two are stored inline, so the common small
/// batches of a backend's hot path need no heap allocation; equality, hashing and `Debug` see
/// only the slice, whatever the storage. Hand-written rather than `smallvec`: an inline
/// `SmallVec<[Allowance; 4]>` made every `BatchDecision` over 150 bytes and measured slower
/// (commit 135bedf); this keeps it at 72.
#[derive(Clone)]
enum AllowedList {
    One(Allowance),
    Two([Allowance; 2]),
    Many(Vec<Allowance>),
}

impl AllowedList {
    fn as_slice(&self) -> &[Allowance] {
        match self {
            Self::One(allowance) => std::slice::from_ref(allowance),
            Self::Two(pair) => pair,
            Self::Many(allowances) => allowances,
        }
    }
}

impl PartialEq for AllowedList {
    fn eq(&self, other: &Self) -> bool {
        self.as_slice() == other.as_slice()
    }
}

impl Eq for AllowedList {}

impl std::hash::Hash for AllowedList {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.as_slice().hash(state);
    }
}

impl std::fmt::Debug for AllowedList {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.as_slice().fmt(f)
    }
}

/// A borrowed, exhaustive view of a [`BatchDecision`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BatchDecisionView<'a> {
    /// Every check was allowed and consumed; allowances are in input order, one per check.
    Allowed {
        /// Non-empty, in input order.
        allowances: &'a [Allowance],
    },
    /// The check at `index` was denied under enforcement; nothing was consumed.
    Denied {
        /// Input index of the first denied check, below `batch_size`.
        index: usize,
        /// Number of checks in the batch.
        batch_size: usize,
        /// Why.
        denial: &'a Denial,
    },
    /// The check at `index` of a shadow batch was quota-exhausted; the request is admitted
    /// and nothing was consumed.
    ShadowDenied {
        /// Input index of the first shadow-denied check, below `batch_size`.
        index: usize,
        /// Number of checks in the batch.
        batch_size: usize,
        /// What enforcement would have answered.
        denial: &'a QuotaDenial,
    },
}

impl BatchDecision {
    /// An allowed batch.
    ///
    /// # Errors
    ///
    /// [`BatchDecisionError::NoAllowances`] for an empty vector.
    pub fn allowed(allowances: Vec<Allowance>) -> Result<Self, BatchDecisionError> {
        if allowances.is_empty() {
            return Err(BatchDecisionError::NoAllowances);
        }
        Ok(Self { inner: BatchOutcome::Allowed(AllowedList::Many(allowances)) })
    }

    /// See [`backend::batch::allowed`](crate::backend::batch::allowed).
    #[inline]
    pub(crate) fn allowed_from_iter(
        allowances: impl IntoIterator<Item = Allowance>,
    ) -> Result<Self, BatchDecisionError> {
        // Fused: nothing is read past the first `None`, as with `collect`.
        let mut allowances = allowances.into_iter().fuse();
        let list = match (allowances.next(), allowances.next(), allowances.next()) {
            (None, _, _) => return Err(BatchDecisionError::NoAllowances),
            (Some(first), None, _) => AllowedList::One(first),
            (Some(first), Some(second), None) => AllowedList::Two([first, second]),
            (Some(first), Some(second), Some(third)) => {
                let mut many = Vec::with_capacity(allowances.size_hint().0.saturating_add(3));
                many.extend([first, second, third]);
                many.extend(allowances);
                AllowedList::Many(many)
            }
        };
        Ok(Self { inner: BatchOutcome::Allowed(list) })
    }

    /// A batch denied under enforcement at `index`.
    ///
    /// # Errors
    ///
    /// [`BatchDecisionError::IndexOutOfRange`] unless `index < batch_size`.
    pub fn denied(index: usize, batch_size: usize, denial: Denial) -> Result<Self, BatchDecisionError> {
        check_index(index, batch_size)?;
        Ok(Self { inner: BatchOutcome::Denied { index, batch_size, denial } })
    }

    /// A shadow batch quota-exhausted at `index`.
    ///
    /// # Errors
    ///
    /// [`BatchDecisionError::IndexOutOfRange`] unless `index < batch_size`.
    pub fn shadow_denied(
        index: usize,
        batch_size: usize,
        denial: QuotaDenial,
    ) -> Result<Self, BatchDecisionError> {
        check_index(index, batch_size)?;
        Ok(Self { inner: BatchOutcome::ShadowDenied { index, batch_size, denial } })
    }

    /// Quota exhaustion at `index` under `mode`.
    ///
    /// # Errors
    ///
    /// [`BatchDecisionError::IndexOutOfRange`] unless `index < batch_size`.
    pub fn quota_exceeded(
        index: usize,
        batch_size: usize,
        denial: QuotaDenial,
        mode: QuotaMode,
    ) -> Result<Self, BatchDecisionError> {
        match mode {
            QuotaMode::Enforce => Self::denied(index, batch_size, Denial::QuotaExceeded(denial)),
            QuotaMode::Shadow => Self::shadow_denied(index, batch_size, denial),
        }
    }

    /// The exhaustive view.
    #[must_use]
    pub fn view(&self) -> BatchDecisionView<'_> {
        match &self.inner {
            BatchOutcome::Allowed(allowances) => {
                BatchDecisionView::Allowed { allowances: allowances.as_slice() }
            }
            BatchOutcome::Denied { index, batch_size, denial } => {
                BatchDecisionView::Denied { index: *index, batch_size: *batch_size, denial }
            }
            BatchOutcome::ShadowDenied { index, batch_size, denial } => {
                BatchDecisionView::ShadowDenied { index: *index, batch_size: *batch_size, denial }
            }
        }
    }

    /// True for allowed and shadow-denied batches, false for an enforced denial.
    #[must_use]
    pub fn permits_request(&self) -> bool {
        !matches!(self.inner, BatchOutcome::Denied { .. })
    }

    /// The number of checks the batch held.
    #[must_use]
    pub fn batch_size(&self) -> usize {
        match &self.inner {
            BatchOutcome::Allowed(allowances) => allowances.as_slice().len(),
            BatchOutcome::Denied { batch_size, .. } | BatchOutcome::ShadowDenied { batch_size, .. } => {
                *batch_size
            }
        }
    }
}

fn check_index(index: usize, batch_size: usize) -> Result<(), BatchDecisionError> {
    if index < batch_size { Ok(()) } else { Err(BatchDecisionError::IndexOutOfRange { index, batch_size }) }
}

#[cfg(feature = "serde")]
mod serde_impls {
    use super::*;
    use serde::{Deserialize, Serialize, de::Error as _};

    #[derive(Serialize, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct AllowanceRepr {
        capacity: Capacity,
        available: u64,
        replenishes_after: Delay,
    }

    impl Serialize for Allowance {
        fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
            AllowanceRepr {
                capacity: self.capacity,
                available: self.available,
                replenishes_after: self.replenishes_after,
            }
            .serialize(serializer)
        }
    }
    impl<'de> Deserialize<'de> for Allowance {
        fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
            let repr = AllowanceRepr::deserialize(deserializer)?;
            Self::new(repr.capacity, repr.available, repr.replenishes_after).map_err(D::Error::custom)
        }
    }

    #[derive(Serialize, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct QuotaDenialRepr {
        capacity: Capacity,
        retry_after: Delay,
    }

    impl Serialize for QuotaDenial {
        fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
            QuotaDenialRepr { capacity: self.capacity, retry_after: self.retry_after }.serialize(serializer)
        }
    }
    impl<'de> Deserialize<'de> for QuotaDenial {
        fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
            let repr = QuotaDenialRepr::deserialize(deserializer)?;
            Ok(Self::new(repr.capacity, repr.retry_after))
        }
    }

    /// `{"reason": "quota_exceeded", "capacity": 5, "retry_after": {...}}` or
    /// `{"reason": "storage_capacity", "retry_after": null}`.
    #[derive(Serialize, Deserialize)]
    #[serde(tag = "reason", rename_all = "snake_case", deny_unknown_fields)]
    enum DenialRepr {
        QuotaExceeded { capacity: Capacity, retry_after: Delay },
        StorageCapacity { retry_after: Option<Delay> },
    }

    impl From<Denial> for DenialRepr {
        fn from(denial: Denial) -> Self {
            match denial {
                Denial::QuotaExceeded(quota) => {
                    Self::QuotaExceeded { capacity: quota.capacity, retry_after: quota.retry_after }
                }
                Denial::StorageCapacity { retry_after } => Self::StorageCapacity { retry_after },
            }
        }
    }
    impl From<DenialRepr> for Denial {
        fn from(repr: DenialRepr) -> Self {
            match repr {
                DenialRepr::QuotaExceeded { capacity, retry_after } => {
                    Self::QuotaExceeded(QuotaDenial::new(capacity, retry_after))
                }
                DenialRepr::StorageCapacity { retry_after } => Self::StorageCapacity { retry_after },
            }
        }
    }

    impl Serialize for Denial {
        fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
            DenialRepr::from(*self).serialize(serializer)
        }
    }
    impl<'de> Deserialize<'de> for Denial {
        fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
            DenialRepr::deserialize(deserializer).map(Self::from)
        }
    }

    #[derive(Serialize, Deserialize)]
    #[serde(tag = "outcome", rename_all = "snake_case", deny_unknown_fields)]
    enum DecisionRepr {
        Allowed { allowance: Allowance },
        ShadowDenied { denial: QuotaDenial },
        Denied { denial: Denial },
    }

    impl Serialize for Decision {
        /// `{"outcome": "allowed" | "shadow_denied" | "denied", ...}`.
        fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
            match self.inner {
                Outcome::Allowed(allowance) => DecisionRepr::Allowed { allowance },
                Outcome::ShadowDenied(denial) => DecisionRepr::ShadowDenied { denial },
                Outcome::Denied(denial) => DecisionRepr::Denied { denial },
            }
            .serialize(serializer)
        }
    }
    impl<'de> Deserialize<'de> for Decision {
        fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
            Ok(match DecisionRepr::deserialize(deserializer)? {
                DecisionRepr::Allowed { allowance } => Self::allowed(allowance),
                DecisionRepr::ShadowDenied { denial } => Self::shadow_denied(denial),
                DecisionRepr::Denied { denial } => Self::denied(denial),
            })
        }
    }

    #[derive(Serialize, Deserialize)]
    #[serde(tag = "outcome", rename_all = "snake_case", deny_unknown_fields)]
    enum BatchDecisionRepr {
        Allowed { allowances: Vec<Allowance> },
        Denied { index: usize, batch_size: usize, denial: Denial },
        ShadowDenied { index: usize, batch_size: usize, denial: QuotaDenial },
    }

    impl Serialize for BatchDecision {
        fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
            match &self.inner {
                BatchOutcome::Allowed(allowances) => {
                    BatchDecisionRepr::Allowed { allowances: allowances.as_slice().to_vec() }
                }
                BatchOutcome::Denied { index, batch_size, denial } => {
                    BatchDecisionRepr::Denied { index: *index, batch_size: *batch_size, denial: *denial }
                }
                BatchOutcome::ShadowDenied { index, batch_size, denial } => BatchDecisionRepr::ShadowDenied {
                    index: *index,
                    batch_size: *batch_size,
                    denial: *denial,
                },
            }
            .serialize(serializer)
        }
    }
    impl<'de> Deserialize<'de> for BatchDecision {
        fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
            match BatchDecisionRepr::deserialize(deserializer)? {
                BatchDecisionRepr::Allowed { allowances } => Self::allowed(allowances),
                BatchDecisionRepr::Denied { index, batch_size, denial } => {
                    Self::denied(index, batch_size, denial)
                }
                BatchDecisionRepr::ShadowDenied { index, batch_size, denial } => {
                    Self::shadow_denied(index, batch_size, denial)
                }
            }
            .map_err(D::Error::custom)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cap(n: u64) -> Capacity {
        Capacity::new(n).unwrap()
    }

    #[test]
    fn allowance_checks_available() {
        assert_eq!(Allowance::new(cap(3), 4, Delay::ZERO), Err(AllowanceError { available: 4, capacity: 3 }));
        assert_eq!(Allowance::new(cap(3), 3, Delay::ZERO).map(|a| a.available()), Ok(3));
    }

    #[test]
    fn admission_predicates() {
        let quota = QuotaDenial::new(cap(2), Delay::from_millis(10));
        let denied = Decision::quota_exceeded(quota, QuotaMode::Enforce);
        assert!(!denied.permits_request());
        assert_eq!(denied.admit(), Err(Denial::QuotaExceeded(quota)));
        let storage = Decision::denied(Denial::StorageCapacity { retry_after: None });
        assert!(!storage.permits_request());
        let shadow = Decision::quota_exceeded(quota, QuotaMode::Shadow);
        assert_eq!(shadow.clone().admit(), Ok(Admitted::ShadowDenied(quota)));
        assert_eq!(Decision::from(Admitted::ShadowDenied(quota)), shadow);
    }

    #[test]
    fn batch_invariants() {
        assert_eq!(BatchDecision::allowed(vec![]), Err(BatchDecisionError::NoAllowances));
        let denial = Denial::StorageCapacity { retry_after: None };
        assert_eq!(
            BatchDecision::denied(2, 2, denial),
            Err(BatchDecisionError::IndexOutOfRange { index: 2, batch_size: 2 })
        );
        let batch = BatchDecision::denied(1, 2, denial).unwrap();
        assert_eq!(batch.view(), BatchDecisionView::Denied { index: 1, batch_size: 2, denial: &denial });
        assert!(!batch.permits_request());
        assert_eq!(batch.batch_size(), 2);
    }

    #[test]
    fn inline_allowed_batches_equal_their_vec_form() {
        use std::hash::{BuildHasher, RandomState};
        assert_eq!(BatchDecision::allowed_from_iter([]), Err(BatchDecisionError::NoAllowances));
        let allowances: Vec<Allowance> =
            (0..4).map(|n| Allowance::new(cap(9), n, Delay::from_millis(n * 10)).unwrap()).collect();
        let hasher = RandomState::new();
        for len in 1..=4 {
            let expected = &allowances[..len];
            let inline = BatchDecision::allowed_from_iter(expected.iter().copied()).unwrap();
            let heap = BatchDecision::allowed(expected.to_vec()).unwrap();
            assert_eq!(inline.view(), BatchDecisionView::Allowed { allowances: expected });
            assert_eq!(inline.batch_size(), len);
            assert!(inline.permits_request());
            assert_eq!(inline, heap);
            assert_eq!(hasher.hash_one(&inline), hasher.hash_one(&heap));
            assert_eq!(format!("{inline:?}"), format!("{heap:?}"));
            assert_eq!(inline.clone(), heap);
        }
        let one = BatchDecision::allowed_from_iter(allowances[..1].iter().copied()).unwrap();
        assert_ne!(one, BatchDecision::allowed_from_iter(allowances[1..2].iter().copied()).unwrap());
        assert_ne!(one, BatchDecision::allowed(allowances[..2].to_vec()).unwrap());
    }
}
