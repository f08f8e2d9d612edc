//! A single admission check: a policy and a subject bound to it.

use std::fmt;

use crate::{
    key::{CounterKey, PolicySubject, SubjectKey},
    policy::RateLimitPolicy,
};

/// One admission check: a policy and the opaque subject it counts, costing one unit.
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
pub struct Check<'p, P> {
    subject: PolicySubject<'p, P>,
}

impl<'p, P: RateLimitPolicy> Check<'p, P> {
    /// A check of `subject` against the policy it is bound to.
    #[must_use]
    pub fn new(subject: PolicySubject<'p, P>) -> Self {
        Self { subject }
    }

    /// The policy evaluated.
    #[must_use]
    pub fn policy(&self) -> &'p P {
        self.subject.policy()
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
        f.debug_struct("Check").field("subject", &self.subject).finish()
    }
}
