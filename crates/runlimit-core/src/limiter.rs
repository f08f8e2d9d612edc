//! The static-dispatch async `Limiter` trait.

use std::{future::Future, sync::Arc};

use crate::{check::Check, decision::BatchDecision, decision::Decision, policy::RateLimitPolicy};

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
