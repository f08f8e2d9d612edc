//! Attempt policies: at most one active attempt per subject, with exponential backoff after
//! failures.
//!
//! This module holds the validated [`AttemptPolicy`]; the limiters that enforce it live in the
//! storage crates. Derive subjects with
//! [`KeyHasher::hash_attempt_for`](crate::KeyHasher::hash_attempt_for).

use std::time::Duration;

use crate::{
    delay::Delay,
    id::{PolicyId, ScopeId},
    policy::{PolicyError, PolicyFingerprint, QuotaPeriod},
};

/// A validated attempt policy.
///
/// At most one active attempt per opaque policy-bound subject. A failure or explicit
/// abandonment increments the consecutive failure count and doubles the retry delay, starting
/// at `initial_delay`, up to `delay_cap`. Full success resets. Inactive failure state expires
/// after `quiet_period`, never while a lease is active. An admission holds a `lease`; an
/// abandoned lease expires as a failure at its deadline.
///
/// These are application-selected security parameters; the library chooses no defaults.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use runlimit_core::{PolicyId, ScopeId, attempts::AttemptPolicy};
///
/// let policy = AttemptPolicy::new(
///     PolicyId::new("auth.password")?,
///     ScopeId::new("identity")?,
///     Duration::from_secs(1),     // initial delay
///     Duration::from_secs(300),   // delay cap
///     Duration::from_secs(3_600), // quiet period
///     Duration::from_secs(30),    // admission lease
/// )?;
/// assert_eq!(policy.retry_delay(0), Duration::ZERO);
/// assert_eq!(policy.retry_delay(1), Duration::from_secs(1));
/// assert_eq!(policy.retry_delay(4), Duration::from_secs(8));
/// assert_eq!(policy.retry_delay(u32::MAX), Duration::from_secs(300));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct AttemptPolicy {
    id: PolicyId,
    scope: ScopeId,
    initial_delay: QuotaPeriod,
    delay_cap: QuotaPeriod,
    quiet_period: QuotaPeriod,
    lease: QuotaPeriod,
    fingerprint: PolicyFingerprint,
}

impl AttemptPolicy {
    /// The fingerprint kind of attempt policies.
    pub const KIND: &'static str = "attempt";

    /// Validates an attempt policy. Every duration must be a nonzero whole number of
    /// milliseconds no longer than [`MAX_WINDOW`](crate::MAX_WINDOW);
    /// `delay_cap ≥ initial_delay` and `quiet_period ≥ delay_cap`.
    ///
    /// # Errors
    ///
    /// [`PolicyError::ZeroDuration`], [`PolicyError::NotWholeMilliseconds`] or
    /// [`PolicyError::DurationTooLong`] naming the parameter (`"initial delay"`,
    /// `"delay cap"`, `"quiet period"`, `"lease"`); [`PolicyError::DurationOrder`] when the
    /// cap is below the initial delay or the quiet period below the cap.
    pub fn new(
        id: PolicyId,
        scope: ScopeId,
        initial_delay: Duration,
        delay_cap: Duration,
        quiet_period: Duration,
        lease: Duration,
    ) -> Result<Self, PolicyError> {
        let initial_delay = QuotaPeriod::named("initial delay", initial_delay)?;
        let delay_cap = QuotaPeriod::named("delay cap", delay_cap)?;
        let quiet_period = QuotaPeriod::named("quiet period", quiet_period)?;
        let lease = QuotaPeriod::named("lease", lease)?;
        if delay_cap < initial_delay {
            return Err(PolicyError::DurationOrder { larger: "delay cap", smaller: "initial delay" });
        }
        if quiet_period < delay_cap {
            return Err(PolicyError::DurationOrder { larger: "quiet period", smaller: "delay cap" });
        }
        let fingerprint = PolicyFingerprint::derive(
            Self::KIND,
            &id,
            &scope,
            &[initial_delay.as_millis(), delay_cap.as_millis(), quiet_period.as_millis(), lease.as_millis()],
        );
        Ok(Self { id, scope, initial_delay, delay_cap, quiet_period, lease, fingerprint })
    }

    /// The policy identifier.
    #[must_use]
    pub fn id(&self) -> &PolicyId {
        &self.id
    }
    /// The scope.
    #[must_use]
    pub fn scope(&self) -> &ScopeId {
        &self.scope
    }
    /// Delay after the first consecutive failure.
    #[must_use]
    pub fn initial_delay(&self) -> QuotaPeriod {
        self.initial_delay
    }
    /// The largest retry delay.
    #[must_use]
    pub fn delay_cap(&self) -> QuotaPeriod {
        self.delay_cap
    }
    /// How long inactive failure state is kept.
    #[must_use]
    pub fn quiet_period(&self) -> QuotaPeriod {
        self.quiet_period
    }
    /// How long an admitted attempt may stay active before it counts as a failure.
    #[must_use]
    pub fn lease(&self) -> QuotaPeriod {
        self.lease
    }
    /// The digest of every parameter (all four durations, id and scope).
    #[must_use]
    pub fn fingerprint(&self) -> &PolicyFingerprint {
        &self.fingerprint
    }

    /// The retry delay after `consecutive_failures` failures: zero for none, then
    /// `initial_delay × 2^(failures − 1)`, saturating at `delay_cap`. Whole milliseconds.
    #[must_use]
    pub fn retry_delay(&self, consecutive_failures: u32) -> Duration {
        if consecutive_failures == 0 {
            return Duration::ZERO;
        }
        let initial = self.initial_delay.as_millis();
        let cap = self.delay_cap.as_millis();
        let millis = 1u64
            .checked_shl(consecutive_failures - 1)
            .and_then(|factor| initial.checked_mul(factor))
            .map_or(cap, |delay| delay.min(cap));
        Duration::from_millis(millis)
    }
}

/// How an admitted attempt ended, reported when its receipt is completed.
///
/// Exhaustive on purpose: every caller names each outcome.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AttemptOutcome {
    /// Full success: the consecutive failure count and retry delay reset to zero.
    Success,
    /// The attempt failed (for example, a wrong password): one more consecutive failure.
    Failure,
    /// The caller gave up on the attempt without a verdict. Counted exactly like
    /// [`Failure`](Self::Failure), so abandoning never refunds an admission.
    Abandoned,
}

/// Why an attempt was not admitted. Exhaustive.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AttemptDenial {
    /// Another attempt for the same subject holds a live lease. `retry_after` is the time until
    /// that lease's deadline, whole milliseconds; if the holder then fails, the backoff delay
    /// follows on top of it.
    InProgress {
        /// Time until the active lease expires.
        retry_after: Delay,
    },
    /// The subject is backing off after `consecutive_failures` failures. `retry_after` is the
    /// remaining part of [`AttemptPolicy::retry_delay`] measured from the latest failure,
    /// whole milliseconds (PostgreSQL: may overstate by commit and transport latency).
    Backoff {
        /// Time until the next attempt is admitted.
        retry_after: Delay,
        /// Consecutive failures recorded for the subject (saturates at `u32::MAX`).
        consecutive_failures: u32,
    },
    /// The subject has no stored state and the backend's storage (shard) is full. Active
    /// failure state is never evicted to make room. `retry_after` is the earliest time an
    /// existing entry expires, when the backend knows it.
    StorageCapacity {
        /// Earliest known time at which room may free up.
        retry_after: Option<Delay>,
    },
}

impl AttemptDenial {
    /// The denial's retry delay: `Some` for every reason except a storage-capacity denial
    /// without a known expiry.
    #[must_use]
    pub const fn retry_after(&self) -> Option<Delay> {
        match *self {
            Self::InProgress { retry_after } | Self::Backoff { retry_after, .. } => Some(retry_after),
            Self::StorageCapacity { retry_after } => retry_after,
        }
    }

    /// The reason without its measurements, for telemetry.
    #[must_use]
    pub const fn reason(&self) -> AttemptDenialReason {
        match self {
            Self::InProgress { .. } => AttemptDenialReason::InProgress,
            Self::Backoff { .. } => AttemptDenialReason::Backoff,
            Self::StorageCapacity { .. } => AttemptDenialReason::StorageCapacity,
        }
    }
}

/// The reason of an [`AttemptDenial`] without its measurements. Exhaustive.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AttemptDenialReason {
    /// [`AttemptDenial::InProgress`].
    InProgress,
    /// [`AttemptDenial::Backoff`].
    Backoff,
    /// [`AttemptDenial::StorageCapacity`].
    StorageCapacity,
}

/// The result of an attempt admission: the backend's opaque receipt `R`, or a denial.
///
/// The receipt is consumed by completing it. Dropping it is no refund: the lease expires as a
/// failure evaluated at the lease deadline.
#[must_use = "an admitted attempt's receipt must be completed; dropping it counts as a failure at the lease deadline"]
#[derive(Debug)]
pub enum AttemptDecision<R> {
    /// Admitted: the receipt holds the subject's single active lease.
    Admitted(R),
    /// Not admitted.
    Denied(AttemptDenial),
}

/// The opaque, consuming receipt of an admitted attempt, holding the subject's single active
/// lease: `runlimit_memory::MemoryAttemptReceipt` and
/// `runlimit_postgres::attempts::PostgresAttemptReceipt` are its two forms, each with its
/// backend's opaque lease token `T`.
///
/// Complete it with the limiter that issued it, which consumes it. It is neither `Clone` nor
/// `Copy`, and only a backend can issue one. Dropping it is no refund: the lease expires as a
/// failure evaluated at the lease deadline. `Debug` shows the policy identifier only, never the
/// subject key or the lease token.
#[must_use = "complete the receipt; dropping it counts as a failure at the lease deadline"]
pub struct AttemptReceipt<T> {
    pub(crate) policy: AttemptPolicy,
    pub(crate) key: crate::key::CounterKey,
    pub(crate) token: T,
}

impl<T> AttemptReceipt<T> {
    /// The attempt policy the attempt was admitted under.
    #[must_use]
    pub fn policy(&self) -> &AttemptPolicy {
        &self.policy
    }
}

impl<T: crate::backend::attempts::LeaseToken> std::fmt::Debug for AttemptReceipt<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct(T::RECEIPT_NAME).field("policy", self.policy.id()).finish_non_exhaustive()
    }
}

/// What completing a receipt recorded. Exhaustive.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AttemptCompletionResult {
    /// [`AttemptOutcome::Success`] was recorded: retry state is reset.
    Reset,
    /// A failure or abandonment was recorded.
    FailureRecorded {
        /// Consecutive failures now recorded (saturates at `u32::MAX`).
        consecutive_failures: u32,
        /// The retry delay before the next admission, from the completion instant: exactly
        /// [`AttemptPolicy::retry_delay`]`(consecutive_failures)`.
        retry_after: Delay,
    },
    /// The receipt no longer holds the live reservation: its lease expired (and was counted as a
    /// failure at its deadline) or it was otherwise superseded. Nothing was recorded; a late
    /// success never resets a newer reservation.
    Stale,
}

/// Receives attempt observations from an attempt limiter.
///
/// Callbacks run synchronously after memory locks are released or database transactions are
/// finalized. Backends call them through
/// [`backend::notify_attempt`](crate::backend::notify_attempt), which catches panics, so
/// telemetry can never change an attempt result. `()` is the no-op observer.
pub trait AttemptObserver: Send + Sync {
    /// Called once per admission or completion.
    fn observe_attempt(&self, observation: &AttemptObservation<'_>) {
        let _ = observation;
    }
}

impl AttemptObserver for () {}

impl<O: AttemptObserver + ?Sized> AttemptObserver for std::sync::Arc<O> {
    fn observe_attempt(&self, observation: &AttemptObservation<'_>) {
        (**self).observe_attempt(observation);
    }
}

impl<O: AttemptObserver + ?Sized> AttemptObserver for Box<O> {
    fn observe_attempt(&self, observation: &AttemptObservation<'_>) {
        (**self).observe_attempt(observation);
    }
}

impl<O: AttemptObserver + ?Sized> AttemptObserver for &O {
    fn observe_attempt(&self, observation: &AttemptObservation<'_>) {
        (**self).observe_attempt(observation);
    }
}

/// Which attempt operation an observation describes. Exhaustive.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AttemptOperation {
    /// An admission (`acquire`).
    Admission,
    /// A standalone completion with the given outcome.
    Completion(AttemptOutcome),
    /// An operator's reset of the subject's failure state.
    Reset,
}

/// How an observed attempt operation ended. Exhaustive, and free of subjects and tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AttemptEvent {
    /// An attempt was admitted (committed, for PostgreSQL).
    Admitted,
    /// An admission was denied.
    Denied(AttemptDenialReason),
    /// A completion was recorded (committed, for PostgreSQL).
    Completed(AttemptOutcome),
    /// A completion found its receipt stale; nothing was recorded.
    Stale,
    /// A reset was applied (committed, for PostgreSQL); `had_live_state` is what it reported.
    Reset {
        /// Whether the subject held live failure state or a live lease.
        had_live_state: bool,
    },
    /// The operation's commit outcome is unknown: it may have taken effect. Never replay it
    /// automatically.
    UncertainCommit,
    /// The operation failed and definitely had no effect.
    Failed,
}

/// One attempt operation's telemetry: policy identity, operation, event and elapsed time.
/// Never includes the subject key or a receipt token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttemptObservation<'a> {
    policy: &'a AttemptPolicy,
    operation: AttemptOperation,
    event: AttemptEvent,
    elapsed: Duration,
}

impl<'a> AttemptObservation<'a> {
    /// An observation.
    #[must_use]
    pub const fn new(
        policy: &'a AttemptPolicy,
        operation: AttemptOperation,
        event: AttemptEvent,
        elapsed: Duration,
    ) -> Self {
        Self { policy, operation, event, elapsed }
    }
    /// The policy (its identifier, scope and fingerprint; no subject).
    #[must_use]
    pub const fn policy(&self) -> &'a AttemptPolicy {
        self.policy
    }
    /// The operation.
    #[must_use]
    pub const fn operation(&self) -> AttemptOperation {
        self.operation
    }
    /// How it ended.
    #[must_use]
    pub const fn event(&self) -> AttemptEvent {
        self.event
    }
    /// Wall time the backend spent on the operation.
    #[must_use]
    pub const fn elapsed(&self) -> Duration {
        self.elapsed
    }
}

#[cfg(feature = "serde")]
mod serde_impls {
    use super::*;
    use serde::{Deserialize, Serialize};

    #[derive(Serialize, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct AttemptPolicyRepr {
        id: PolicyId,
        scope: ScopeId,
        initial_delay: Duration,
        delay_cap: Duration,
        quiet_period: Duration,
        lease: Duration,
    }

    impl Serialize for AttemptPolicy {
        fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
            AttemptPolicyRepr {
                id: self.id.clone(),
                scope: self.scope.clone(),
                initial_delay: self.initial_delay.duration(),
                delay_cap: self.delay_cap.duration(),
                quiet_period: self.quiet_period.duration(),
                lease: self.lease.duration(),
            }
            .serialize(serializer)
        }
    }

    impl<'de> Deserialize<'de> for AttemptPolicy {
        fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
            let r = AttemptPolicyRepr::deserialize(deserializer)?;
            Self::new(r.id, r.scope, r.initial_delay, r.delay_cap, r.quiet_period, r.lease)
                .map_err(serde::de::Error::custom)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn new(i: u64, c: u64, q: u64, l: u64) -> Result<AttemptPolicy, PolicyError> {
        AttemptPolicy::new(
            PolicyId::new("p").unwrap(),
            ScopeId::new("s").unwrap(),
            Duration::from_millis(i),
            Duration::from_millis(c),
            Duration::from_millis(q),
            Duration::from_millis(l),
        )
    }

    #[test]
    fn validation() {
        assert_eq!(new(0, 1, 1, 1), Err(PolicyError::ZeroDuration { parameter: "initial delay" }));
        assert_eq!(new(1, 1, 1, 0), Err(PolicyError::ZeroDuration { parameter: "lease" }));
        assert_eq!(
            new(2, 1, 5, 1),
            Err(PolicyError::DurationOrder { larger: "delay cap", smaller: "initial delay" })
        );
        assert_eq!(
            new(1, 5, 4, 1),
            Err(PolicyError::DurationOrder { larger: "quiet period", smaller: "delay cap" })
        );
        let a = new(1, 5, 5, 1).unwrap();
        assert_ne!(a.fingerprint(), new(1, 5, 5, 2).unwrap().fingerprint());
        assert_ne!(a.fingerprint(), new(1, 5, 6, 1).unwrap().fingerprint());
    }

    #[test]
    fn backoff_sequence() {
        let p = new(100, 1_000, 1_000, 1).unwrap();
        let got: Vec<u128> = (0..8).map(|f| p.retry_delay(f).as_millis()).collect();
        assert_eq!(got, [0, 100, 200, 400, 800, 1_000, 1_000, 1_000]);
        assert_eq!(p.retry_delay(64).as_millis(), 1_000);
        assert_eq!(p.retry_delay(u32::MAX).as_millis(), 1_000);
    }

    struct Panics;
    impl AttemptObserver for Panics {
        fn observe_attempt(&self, _: &AttemptObservation<'_>) {
            panic!("observer bug");
        }
    }

    #[test]
    fn notify_attempt_isolates_panics() {
        let policy = new(1, 5, 5, 1).unwrap();
        let observation = AttemptObservation::new(
            &policy,
            AttemptOperation::Completion(AttemptOutcome::Abandoned),
            AttemptEvent::Completed(AttemptOutcome::Abandoned),
            Duration::ZERO,
        );
        assert!(!crate::backend::notify_attempt(&Panics, &observation));
        assert!(crate::backend::notify_attempt(&(), &observation));
        assert_eq!(observation.event(), AttemptEvent::Completed(AttemptOutcome::Abandoned));
    }

    #[test]
    fn denial_accessors() {
        let backoff =
            AttemptDenial::Backoff { retry_after: Delay::from_millis(400), consecutive_failures: 3 };
        assert_eq!(backoff.retry_after(), Some(Delay::from_millis(400)));
        assert_eq!(backoff.reason(), AttemptDenialReason::Backoff);
        assert_eq!(AttemptDenial::StorageCapacity { retry_after: None }.retry_after(), None);
        assert_eq!(
            AttemptDenial::InProgress { retry_after: Delay::from_millis(7) }.reason(),
            AttemptDenialReason::InProgress
        );
    }
}
