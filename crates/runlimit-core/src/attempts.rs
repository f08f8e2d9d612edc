//! Attempt policies: at most one active attempt per subject, with exponential backoff after
//! failures.
//!
//! This module holds the validated [`AttemptPolicy`]; the limiters that enforce it live in the
//! storage crates. Derive subjects with
//! [`KeyHasher::hash_attempt_for`](crate::KeyHasher::hash_attempt_for).

use std::time::Duration;

use crate::{
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
}
