//! The static-dispatch async `Limiter` trait.

use std::{future::Future, sync::Arc};

use crate::{
    check::Check, decision::BatchDecision, decision::Decision, key::PolicySubject, policy::RateLimitPolicy,
    snapshot::QuotaSnapshot,
};

/// An async admission backend, generic over its storage.
///
/// Application adapters are generic over `L: Limiter` and swap backends without an
/// async-runtime abstraction. Methods return `Send` futures with no required boxing.
///
/// # Cancel safety
///
/// Quota is evaluated and consumed only when the returned future is first polled. Creating
/// and dropping an unpolled future leaves quota unchanged. Dropping a future that has started
/// may or may not have consumed quota (a database backend may be committing); backends
/// document their exact behaviour.
///
/// # Errors are not denials
///
/// `Ok` carries every evaluated outcome, including denials. `Err` means the backend could not
/// evaluate the check, and callers must fail closed. A single check's error type never
/// carries a batch-only variant: [`CheckError`](Self::CheckError) and
/// [`CheckAllError`](Self::CheckAllError) are separate.
///
/// # Not object-safe
///
/// Intentionally: the methods return `impl Future`. Use a generic parameter, or an
/// application-owned enum that implements `Limiter` for runtime selection.
///
/// ```compile_fail
/// use runlimit_core::{FixedWindowPolicy, Limiter};
/// fn pick(_: &dyn Limiter<Policy = FixedWindowPolicy, CheckError = std::io::Error, CheckAllError = std::io::Error>) {}
/// ```
///
/// # Examples
///
/// ```
/// # #![allow(dead_code)]
/// use runlimit_core::{BatchDecision, Check, Limiter};
///
/// async fn admit<L: Limiter>(
///     limiter: &L,
///     checks: &[Check<'_, L::Policy>],
/// ) -> Result<BatchDecision, L::CheckAllError> {
///     limiter.check_all(checks).await
/// }
/// ```
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a Runlimit limiter",
    note = "pass a storage backend such as `runlimit_memory::MemoryStore` or `runlimit_postgres::PostgresLimiter`, not its connection pool or configuration"
)]
pub trait Limiter: Send + Sync {
    /// The policy type this backend evaluates.
    type Policy: RateLimitPolicy;
    /// Every way a single check can fail to be evaluated.
    type CheckError: std::error::Error + Send + Sync + 'static;
    /// Every way an atomic batch can fail to be evaluated, including structural
    /// [`BatchError`](crate::BatchError)s.
    type CheckAllError: std::error::Error + Send + Sync + 'static;

    /// Evaluates one check, consuming its [`cost`](Check::cost) when allowed (see [`Check::with_cost`]).
    fn check(
        &self,
        check: &Check<'_, Self::Policy>,
    ) -> impl Future<Output = Result<Decision, Self::CheckError>> + Send;

    /// Evaluates an atomic batch: all checks are consumed together when every one is allowed,
    /// and nothing is consumed otherwise. A denied decision names the first denied index.
    fn check_all(
        &self,
        checks: &[Check<'_, Self::Policy>],
    ) -> impl Future<Output = Result<BatchDecision, Self::CheckAllError>> + Send;
}

impl<L: Limiter + ?Sized> Limiter for &L {
    type Policy = L::Policy;
    type CheckError = L::CheckError;
    type CheckAllError = L::CheckAllError;

    fn check(
        &self,
        check: &Check<'_, Self::Policy>,
    ) -> impl Future<Output = Result<Decision, Self::CheckError>> + Send {
        (**self).check(check)
    }

    fn check_all(
        &self,
        checks: &[Check<'_, Self::Policy>],
    ) -> impl Future<Output = Result<BatchDecision, Self::CheckAllError>> + Send {
        (**self).check_all(checks)
    }
}

impl<L: Limiter + ?Sized> Limiter for Arc<L> {
    type Policy = L::Policy;
    type CheckError = L::CheckError;
    type CheckAllError = L::CheckAllError;

    fn check(
        &self,
        check: &Check<'_, Self::Policy>,
    ) -> impl Future<Output = Result<Decision, Self::CheckError>> + Send {
        (**self).check(check)
    }

    fn check_all(
        &self,
        checks: &[Check<'_, Self::Policy>],
    ) -> impl Future<Output = Result<BatchDecision, Self::CheckAllError>> + Send {
        (**self).check_all(checks)
    }
}

/// Non-consuming reads and operator resets of one subject's quota state, reachable
/// generically like [`Limiter`], so an application generic over backends gets them too.
///
/// Both take a [`PolicySubject`], a subject key bound to the policy whose state is read or
/// cleared.
///
/// # Peek
///
/// [`peek`](Self::peek) reads the subject's state without consuming anything: it never
/// creates state, never takes a storage slot and never writes. Its [`QuotaSnapshot`] cannot be
/// passed where an admission is expected, and it is a snapshot that a concurrent check may
/// change at once: never admit a request on it.
///
/// # Reset
///
/// [`reset`](Self::reset) removes the subject's state for the policy and returns whether it
/// held live state (an expired leftover is removed too, and reported as `false`): the next
/// check behaves as for a fresh subject, and the storage slot is free again. Quota mode is not
/// part of the storage key, so resetting through a shadow policy clears the enforced
/// counter too. Backends report each reset to their observer as
/// [`Observation::Reset`](crate::Observation::Reset).
///
/// A reset is an operator's action (a support desk unlocking a user): it is not rate limited
/// itself, so do not expose it to the subjects it resets.
///
/// ```
/// # #![allow(dead_code)]
/// use runlimit_core::{PolicySubject, QuotaControl};
///
/// /// Unlocks a subject, reporting whether it was limited.
/// async fn unlock<L: QuotaControl>(limiter: &L, subject: PolicySubject<'_, L::Policy>) -> Result<bool, L::ResetError> {
///     limiter.reset(subject).await
/// }
/// ```
pub trait QuotaControl: Limiter {
    /// Every way a peek can fail to read the state.
    type PeekError: std::error::Error + Send + Sync + 'static;
    /// Every way a reset can fail; whether the state was removed is backend-specific (see
    /// the backend's error).
    type ResetError: std::error::Error + Send + Sync + 'static;

    /// The subject's quota now, without consuming, creating or changing anything.
    fn peek(
        &self,
        subject: PolicySubject<'_, Self::Policy>,
    ) -> impl Future<Output = Result<QuotaSnapshot, Self::PeekError>> + Send;

    /// Removes the subject's state; `true` when it held live state.
    fn reset(
        &self,
        subject: PolicySubject<'_, Self::Policy>,
    ) -> impl Future<Output = Result<bool, Self::ResetError>> + Send;
}

impl<L: QuotaControl + ?Sized> QuotaControl for &L {
    type PeekError = L::PeekError;
    type ResetError = L::ResetError;

    fn peek(
        &self,
        subject: PolicySubject<'_, Self::Policy>,
    ) -> impl Future<Output = Result<QuotaSnapshot, Self::PeekError>> + Send {
        (**self).peek(subject)
    }

    fn reset(
        &self,
        subject: PolicySubject<'_, Self::Policy>,
    ) -> impl Future<Output = Result<bool, Self::ResetError>> + Send {
        (**self).reset(subject)
    }
}

impl<L: QuotaControl + ?Sized> QuotaControl for Arc<L> {
    type PeekError = L::PeekError;
    type ResetError = L::ResetError;

    fn peek(
        &self,
        subject: PolicySubject<'_, Self::Policy>,
    ) -> impl Future<Output = Result<QuotaSnapshot, Self::PeekError>> + Send {
        (**self).peek(subject)
    }

    fn reset(
        &self,
        subject: PolicySubject<'_, Self::Policy>,
    ) -> impl Future<Output = Result<bool, Self::ResetError>> + Send {
        (**self).reset(subject)
    }
}
