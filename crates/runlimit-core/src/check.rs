//! A single admission check: a policy, a subject bound to it, and the units it costs.

use std::fmt;

use crate::{
    key::{CounterKey, PolicySubject, SubjectKey},
    policy::{Capacity, RateLimitPolicy},
};

/// Why [`Check::with_cost`] rejected a cost: a caller or configuration error, never a quota
/// denial (waiting cannot make an impossible cost fit).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CostError {
    /// A check costs at least one unit.
    #[error("a check must cost at least 1 unit")]
    Zero,
    /// The cost is above what the policy can ever grant at once: its
    /// [`capacity`](RateLimitPolicy::capacity), the limit of a fixed window or the burst
    /// capacity of a GCRA policy.
    #[error("a cost of {cost} units exceeds the policy's capacity of {capacity}")]
    ExceedsCapacity {
        /// The rejected cost.
        cost: u64,
        /// The policy's capacity.
        capacity: Capacity,
    },
}

/// One admission check: a policy, the opaque subject it counts, and its cost in units (1
/// unless [`with_cost`](Self::with_cost) says otherwise).
///
/// Built only from a [`PolicySubject`], so the policy a key was derived for is the policy
/// that is evaluated. An unbound [`SubjectKey`] does not compile:
///
/// ```compile_fail
/// use runlimit_core::{Check, FixedWindowPolicy, SubjectKey};
/// let check: Check<'_, FixedWindowPolicy> = Check::new(SubjectKey::from_digest([0; 32]));
/// ```
///
/// Bind it explicitly instead, with [`SubjectKey::bind`].
///
/// # Weighted checks
///
/// A check may cost several units, such as API credits or bytes:
/// [`with_cost`](Self::with_cost) validates the cost against the policy once, when the check
/// is built. A fixed window allows it iff the units used in the window plus the cost fit the
/// limit, and then consumes exactly the cost; a GCRA policy spends the cost in one step of
/// the evaluator. A denied check consumes nothing, and its `retry_after` is the earliest time
/// the same cost fits. An allowance's `available` is what remains after this check's cost.
///
/// ```
/// use std::time::Duration;
/// use runlimit_core::{Check, CostError, FixedWindowPolicy, KeyHasher, PolicyId, ScopeId};
///
/// let policy = FixedWindowPolicy::new(
///     PolicyId::new("api.credits")?, ScopeId::new("account")?, 100, Duration::from_secs(60))?;
/// let hasher = KeyHasher::new(&[7; 32])?;
/// let subject = hasher.hash_for(&policy, b"account-42");
/// let check = Check::new(subject).with_cost(25)?;
/// assert_eq!(check.cost(), 25);
/// assert_eq!(Check::new(subject).with_cost(0).unwrap_err(), CostError::Zero);
/// assert!(matches!(Check::new(subject).with_cost(101), Err(CostError::ExceedsCapacity { cost: 101, .. })));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct Check<'p, P> {
    subject: PolicySubject<'p, P>,
    /// Between 1 and the policy's capacity (validated by `with_cost`).
    cost: u64,
}

impl<'p, P: RateLimitPolicy> Check<'p, P> {
    /// A check of `subject` against the policy it is bound to, costing one unit.
    #[inline]
    #[must_use]
    pub fn new(subject: PolicySubject<'p, P>) -> Self {
        Self { subject, cost: 1 }
    }

    /// The same check costing `cost` units.
    ///
    /// # Errors
    ///
    /// [`CostError::Zero`] for 0; [`CostError::ExceedsCapacity`] when `cost` is above the
    /// policy's [`capacity`](RateLimitPolicy::capacity) (the fixed-window limit or the GCRA
    /// burst capacity), which no wait could make fit. Every cost up to
    /// [`MAX_LIMIT`](crate::MAX_LIMIT) that the policy accepts is evaluated without overflow by
    /// every backend.
    pub fn with_cost(self, cost: u64) -> Result<Self, CostError> {
        let capacity = self.subject.policy().capacity();
        if cost == 0 {
            return Err(CostError::Zero);
        }
        if cost > capacity.get() {
            return Err(CostError::ExceedsCapacity { cost, capacity });
        }
        Ok(Self { cost, ..self })
    }

    /// The policy evaluated.
    #[must_use]
    pub fn policy(&self) -> &'p P {
        self.subject.policy()
    }

    /// The units this check costs: between 1 and the policy's capacity.
    #[inline]
    #[must_use]
    pub fn cost(&self) -> u64 {
        self.cost
    }

    /// Escape hatch: the opaque subject key, unbound.
    #[must_use]
    pub fn subject(&self) -> SubjectKey {
        self.subject.key()
    }

    /// The storage key: the policy's fingerprint and the subject key.
    #[must_use]
    pub fn counter_key(&self) -> CounterKey {
        CounterKey::new(*self.subject.policy().fingerprint(), self.subject.key())
    }
}

impl<P> Clone for Check<'_, P> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<P> Copy for Check<'_, P> {}

impl<P: RateLimitPolicy> fmt::Debug for Check<'_, P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Check").field("subject", &self.subject).field("cost", &self.cost).finish()
    }
}
