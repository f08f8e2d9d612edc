//! Helpers shared by every scenario: policies, subjects, checks, and unpacking of decisions.
//!
//! Every unpacking helper is `#[track_caller]` and panics with the whole decision when it is
//! not the expected kind, so a failing scenario names the line and shows what the backend
//! answered. Durations are unpacked as exact whole milliseconds ([`millis`]): a delay with a
//! sub-millisecond part fails the scenario instead of being rounded.

use std::{
    error::Error,
    sync::atomic::{AtomicUsize, Ordering},
    time::Duration,
};

use runlimit_core::{
    AttemptSubject, BatchDecision, BatchDecisionView, BatchError, Check, Decision, DecisionView, Delay,
    Denial, FixedWindowPolicy, GcraPolicy, KeyHasher, Limiter, Observation, Observer, PolicyId,
    PolicySubject, QuotaControl, QuotaDenial, QuotaSnapshot, RateLimitPolicy, ScopeId, SubjectKey,
    attempts::{
        AttemptCompletionResult, AttemptDecision, AttemptDenial, AttemptObservation, AttemptObserver,
        AttemptPolicy,
    },
};

use crate::{AttemptBackend, QuotaBackend};

/// The scope of every policy built by the constructors without an explicit scope.
pub const SCOPE: &str = "conformance";

/// The secret of [`hasher`]: a fixed test value of 40 bytes.
pub const TEST_SECRET: &[u8] = b"runlimit conformance suite test secret!!";

/// A [`KeyHasher`] on [`TEST_SECRET`], for scenarios that derive attempt subjects.
#[must_use]
pub fn hasher() -> KeyHasher {
    KeyHasher::new(TEST_SECRET).expect("the conformance test secret is long enough")
}

/// A fixed-window policy `id` in scope [`SCOPE`]: `limit` checks per `window_ms`.
#[must_use]
pub fn fixed_window(id: &str, limit: u64, window_ms: u64) -> FixedWindowPolicy {
    fixed_window_in(id, SCOPE, limit, window_ms)
}

/// A fixed-window policy `id` in `scope`: `limit` checks per `window_ms`.
#[must_use]
pub fn fixed_window_in(id: &str, scope: &str, limit: u64, window_ms: u64) -> FixedWindowPolicy {
    FixedWindowPolicy::new(
        PolicyId::new(id).expect("a valid policy id"),
        ScopeId::new(scope).expect("a valid scope id"),
        limit,
        Duration::from_millis(window_ms),
    )
    .unwrap_or_else(|error| panic!("fixed-window policy {id} ({limit} per {window_ms} ms): {error}"))
}

/// A GCRA policy `id` in scope [`SCOPE`]: `quota` units per `period_ms`, burst `burst`.
#[must_use]
pub fn gcra(id: &str, quota: u64, period_ms: u64, burst: u64) -> GcraPolicy {
    gcra_in(id, SCOPE, quota, period_ms, burst)
}

/// A GCRA policy `id` in `scope`: `quota` units per `period_ms`, burst `burst`.
#[must_use]
pub fn gcra_in(id: &str, scope: &str, quota: u64, period_ms: u64, burst: u64) -> GcraPolicy {
    GcraPolicy::new(
        PolicyId::new(id).expect("a valid policy id"),
        ScopeId::new(scope).expect("a valid scope id"),
        quota,
        Duration::from_millis(period_ms),
        burst,
    )
    .unwrap_or_else(|error| panic!("GCRA policy {id} ({quota} per {period_ms} ms, burst {burst}): {error}"))
}

/// An attempt policy `id` in `scope` with the given initial delay, delay cap, quiet period and
/// lease, all in milliseconds.
#[must_use]
pub fn attempt_policy(
    id: &str,
    scope: &str,
    initial_ms: u64,
    cap_ms: u64,
    quiet_ms: u64,
    lease_ms: u64,
) -> AttemptPolicy {
    AttemptPolicy::new(
        PolicyId::new(id).expect("a valid policy id"),
        ScopeId::new(scope).expect("a valid scope id"),
        Duration::from_millis(initial_ms),
        Duration::from_millis(cap_ms),
        Duration::from_millis(quiet_ms),
        Duration::from_millis(lease_ms),
    )
    .unwrap_or_else(|error| panic!("attempt policy {id}/{scope}: {error}"))
}

/// SplitMix64's finalizer: a bijection of `u64` with good avalanche.
const fn mix(value: u64) -> u64 {
    let mut z = value.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Subject key number `n`: a digest whose 32 bytes are all derived from `n`
/// ([`SubjectKey::from_digest`], as its contract allows for tests).
///
/// `n` is spread into every byte (four mixed 64-bit lanes), so distinct numbers give distinct
/// keys in every byte range a backend may use (a memory store's table hash and shard, a
/// PostgreSQL capacity shard), and keys look as uniform as HMAC outputs. Which shard a key lands
/// on is backend-specific: scenarios that need one shard use
/// [`QuotaBackend::subjects_in_one_shard`] instead.
#[must_use]
pub fn subject(n: u64) -> SubjectKey {
    let mut digest = [0u8; 32];
    for (lane, chunk) in (0u64..).zip(digest.chunks_exact_mut(8)) {
        chunk.copy_from_slice(&mix(n.wrapping_mul(4).wrapping_add(lane)).to_le_bytes());
    }
    SubjectKey::from_digest(digest)
}

/// A check of `subject` against `policy` (explicitly bound, as tests may).
#[must_use]
pub fn check<P: RateLimitPolicy>(policy: &P, subject: SubjectKey) -> Check<'_, P> {
    Check::new(subject.bind(policy))
}

/// A check of `subject` against `policy` costing `cost` units; panics when the cost is
/// rejected (see [`Check::with_cost`]).
#[track_caller]
#[must_use]
pub fn costly<P: RateLimitPolicy>(policy: &P, subject: SubjectKey, cost: u64) -> Check<'_, P> {
    check(policy, subject).with_cost(cost).unwrap_or_else(|error| panic!("a cost of {cost}: {error}"))
}

/// Evaluates one check on the backend's limiter; panics if the backend fails to decide.
pub async fn decide<B: QuotaBackend>(backend: &B, check: &Check<'_, B::Policy>) -> Decision {
    backend
        .limiter()
        .check(check)
        .await
        .unwrap_or_else(|error| panic!("the check failed instead of deciding: {error:?}"))
}

/// Peeks at `subject` on the backend's limiter; panics if the backend fails to read.
pub async fn peek<B: QuotaBackend>(backend: &B, subject: PolicySubject<'_, B::Policy>) -> QuotaSnapshot {
    backend
        .limiter()
        .peek(subject)
        .await
        .unwrap_or_else(|error| panic!("the peek failed instead of reading: {error:?}"))
}

/// `(available, next_unit_after ms, replenishes_after ms)` of a snapshot, `None` for the next
/// unit of a full quota.
#[track_caller]
#[must_use]
pub fn snapshot(snapshot: &QuotaSnapshot) -> (u64, Option<u64>, u64) {
    (snapshot.available(), snapshot.next_unit_after().map(millis), millis(snapshot.replenishes_after()))
}

/// Resets `subject` on the backend's limiter; panics if the backend fails to reset.
pub async fn reset<B: QuotaBackend>(backend: &B, subject: PolicySubject<'_, B::Policy>) -> bool {
    backend.limiter().reset(subject).await.unwrap_or_else(|error| panic!("the reset failed: {error:?}"))
}

/// Evaluates an atomic batch on the backend's limiter; panics if the backend fails to decide.
pub async fn decide_all<B: QuotaBackend>(backend: &B, checks: &[Check<'_, B::Policy>]) -> BatchDecision {
    backend
        .limiter()
        .check_all(checks)
        .await
        .unwrap_or_else(|error| panic!("the batch failed instead of deciding: {error:?}"))
}

/// Submits a batch that must be rejected structurally and returns the [`BatchError`] found in
/// the error's [`source`](Error::source) chain; panics on a decision or on any other error.
pub async fn rejected_batch<B: QuotaBackend>(backend: &B, checks: &[Check<'_, B::Policy>]) -> BatchError {
    match backend.limiter().check_all(checks).await {
        Ok(decision) => panic!("expected a structural rejection, got the decision {decision:?}"),
        Err(error) => batch_error(&error)
            .unwrap_or_else(|| panic!("expected a BatchError in the error chain, got {error:?}")),
    }
}

/// The [`BatchError`] of a backend's batch error: the error itself or the first error of its
/// [`source`](Error::source) chain that is one (backends wrap it in their own batch error).
#[must_use]
pub fn batch_error(error: &(dyn Error + 'static)) -> Option<BatchError> {
    let mut current = Some(error);
    while let Some(error) = current {
        if let Some(batch) = error.downcast_ref::<BatchError>() {
            return Some(batch.clone());
        }
        current = error.source();
    }
    None
}

/// A delay as exact whole milliseconds; panics when it has a sub-millisecond part (every
/// duration a backend measures on whole-millisecond time is whole) or does not fit `u64`.
#[track_caller]
#[must_use]
pub fn millis(delay: Delay) -> u64 {
    let duration = delay.duration();
    assert!(
        duration.subsec_nanos().is_multiple_of(1_000_000),
        "expected a whole number of milliseconds, got {duration:?}"
    );
    u64::try_from(duration.as_millis()).unwrap_or_else(|_| panic!("delay {duration:?} does not fit u64 ms"))
}

/// `(available, replenishes_after ms)` of an allowed decision.
#[track_caller]
#[must_use]
pub fn allowed(decision: &Decision) -> (u64, u64) {
    match decision.view() {
        DecisionView::Allowed { allowance } => (allowance.available(), millis(allowance.replenishes_after())),
        _ => panic!("expected an allowed decision, got {decision:?}"),
    }
}

/// `(capacity, available, replenishes_after ms)` of an allowed decision.
#[track_caller]
#[must_use]
pub fn allowed_with_capacity(decision: &Decision) -> (u64, u64, u64) {
    match decision.view() {
        DecisionView::Allowed { allowance } => {
            (allowance.capacity().get(), allowance.available(), millis(allowance.replenishes_after()))
        }
        _ => panic!("expected an allowed decision, got {decision:?}"),
    }
}

/// `(capacity, retry_after ms)` of an enforced quota denial.
#[track_caller]
#[must_use]
pub fn quota_denied(decision: &Decision) -> (u64, u64) {
    match decision.view() {
        DecisionView::Denied { denial: Denial::QuotaExceeded(quota) } => {
            assert!(!decision.permits_request(), "an enforced denial must not permit: {decision:?}");
            (quota.capacity().get(), millis(quota.retry_after()))
        }
        _ => panic!("expected an enforced quota denial, got {decision:?}"),
    }
}

/// `(capacity, retry_after ms)` of a shadow denial, which must permit the request.
#[track_caller]
#[must_use]
pub fn shadow_denied(decision: &Decision) -> (u64, u64) {
    match decision.view() {
        DecisionView::ShadowDenied { denial } => {
            assert!(decision.permits_request(), "a shadow denial must permit: {decision:?}");
            (denial.capacity().get(), millis(denial.retry_after()))
        }
        _ => panic!("expected a shadow denial, got {decision:?}"),
    }
}

/// `retry_after` (exact ms, when reported) of an enforced storage-capacity denial, which must
/// not permit the request.
#[track_caller]
#[must_use]
pub fn storage_denied(decision: &Decision) -> Option<u64> {
    match decision.view() {
        DecisionView::Denied { denial: Denial::StorageCapacity { retry_after } } => {
            assert!(!decision.permits_request(), "a storage denial must not permit: {decision:?}");
            retry_after.map(millis)
        }
        _ => panic!("expected a storage-capacity denial, got {decision:?}"),
    }
}

/// The `retry_after` a storage-capacity denial of backend `B` reports when the shard's
/// earliest expiry is `millis` away: `Some(millis)` when `B` reports it
/// ([`QuotaBackend::REPORTS_STORAGE_RETRY`]), else `None`.
#[must_use]
pub fn storage_retry<B: QuotaBackend>(millis: u64) -> Option<u64> {
    B::REPORTS_STORAGE_RETRY.then_some(millis)
}

/// The storage-capacity [`Denial`] of backend `B` when the shard's earliest expiry is
/// `millis` away (see [`storage_retry`]).
#[must_use]
pub fn storage_denial<B: QuotaBackend>(millis: u64) -> Denial {
    Denial::StorageCapacity { retry_after: storage_retry::<B>(millis).map(Delay::from_millis) }
}

/// An enforced quota [`Denial`] of `capacity` units, retrying after `retry_ms`.
#[track_caller]
#[must_use]
pub fn quota_denial(capacity: u64, retry_ms: u64) -> Denial {
    let capacity = runlimit_core::Capacity::new(capacity).expect("a valid capacity");
    Denial::QuotaExceeded(QuotaDenial::new(capacity, Delay::from_millis(retry_ms)))
}

/// `(available, replenishes_after ms)` of each allowance of an allowed batch, in order.
#[track_caller]
#[must_use]
pub fn batch_allowed(decision: &BatchDecision) -> Vec<(u64, u64)> {
    match decision.view() {
        BatchDecisionView::Allowed { allowances } => {
            assert_eq!(allowances.len(), decision.batch_size(), "one allowance per check: {decision:?}");
            allowances
                .iter()
                .map(|allowance| (allowance.available(), millis(allowance.replenishes_after())))
                .collect()
        }
        _ => panic!("expected an allowed batch, got {decision:?}"),
    }
}

/// `(index, batch_size, denial)` of a batch denied under enforcement, which must not permit.
#[track_caller]
#[must_use]
pub fn batch_denied(decision: &BatchDecision) -> (usize, usize, Denial) {
    match decision.view() {
        BatchDecisionView::Denied { index, batch_size, denial } => {
            assert!(!decision.permits_request(), "a denied batch must not permit: {decision:?}");
            (index, batch_size, *denial)
        }
        _ => panic!("expected a denied batch, got {decision:?}"),
    }
}

/// `(index, batch_size, capacity, retry_after ms)` of a shadow-denied batch, which must permit.
#[track_caller]
#[must_use]
pub fn batch_shadow_denied(decision: &BatchDecision) -> (usize, usize, u64, u64) {
    match decision.view() {
        BatchDecisionView::ShadowDenied { index, batch_size, denial } => {
            assert!(decision.permits_request(), "a shadow-denied batch must permit: {decision:?}");
            (index, batch_size, denial.capacity().get(), millis(denial.retry_after()))
        }
        _ => panic!("expected a shadow-denied batch, got {decision:?}"),
    }
}

/// Acquires an attempt that must be admitted and returns its receipt.
pub async fn admit<B: AttemptBackend>(backend: &mut B, subject: &AttemptSubject<'_>) -> B::Receipt {
    match backend.acquire(subject).await {
        AttemptDecision::Admitted(receipt) => receipt,
        AttemptDecision::Denied(denial) => panic!("expected an admitted attempt, got {denial:?}"),
    }
}

/// Acquires an attempt that must be denied and returns the denial.
pub async fn deny<B: AttemptBackend>(backend: &mut B, subject: &AttemptSubject<'_>) -> AttemptDenial {
    match backend.acquire(subject).await {
        AttemptDecision::Admitted(receipt) => panic!("expected a denied attempt, got {receipt:?}"),
        AttemptDecision::Denied(denial) => denial,
    }
}

/// [`AttemptCompletionResult::FailureRecorded`] with `failures` and a `retry_ms` delay.
#[must_use]
pub const fn failure_recorded(failures: u32, retry_ms: u64) -> AttemptCompletionResult {
    AttemptCompletionResult::FailureRecorded {
        consecutive_failures: failures,
        retry_after: Delay::from_millis(retry_ms),
    }
}

/// [`AttemptDenial::Backoff`] after `failures`, retrying after `retry_ms`.
#[must_use]
pub const fn backoff(failures: u32, retry_ms: u64) -> AttemptDenial {
    AttemptDenial::Backoff { retry_after: Delay::from_millis(retry_ms), consecutive_failures: failures }
}

/// [`AttemptDenial::InProgress`], retrying after `retry_ms`.
#[must_use]
pub const fn in_progress(retry_ms: u64) -> AttemptDenial {
    AttemptDenial::InProgress { retry_after: Delay::from_millis(retry_ms) }
}

/// [`AttemptDenial::StorageCapacity`] retrying after `retry_ms` (the time until the shard's
/// earliest expiry, which every attempt backend reports).
#[must_use]
pub const fn attempt_storage_denial(retry_ms: u64) -> AttemptDenial {
    AttemptDenial::StorageCapacity { retry_after: Some(Delay::from_millis(retry_ms)) }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    #[test]
    fn subjects_are_distinct_in_every_lane() {
        let keys: Vec<[u8; 32]> = (0..1_000).map(|n| *subject(n).as_bytes()).collect();
        for range in [0..8, 8..16, 16..24, 24..32] {
            let lanes: HashSet<&[u8]> = keys.iter().map(|key| &key[range.clone()]).collect();
            assert_eq!(lanes.len(), keys.len(), "bytes {range:?} collide");
        }
        let first_bytes: HashSet<u8> = keys.iter().map(|key| key[0]).collect();
        assert!(first_bytes.len() > 200, "the first byte is spread too: {}", first_bytes.len());
    }

    #[test]
    fn batch_error_walks_the_source_chain() {
        #[derive(Debug)]
        struct Wrapper(BatchError);
        impl std::fmt::Display for Wrapper {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("wrapped")
            }
        }
        impl Error for Wrapper {
            fn source(&self) -> Option<&(dyn Error + 'static)> {
                Some(&self.0)
            }
        }
        #[derive(Debug)]
        struct Outer(Wrapper);
        impl std::fmt::Display for Outer {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("outer")
            }
        }
        impl Error for Outer {
            fn source(&self) -> Option<&(dyn Error + 'static)> {
                Some(&self.0)
            }
        }
        assert_eq!(batch_error(&BatchError::EmptyBatch), Some(BatchError::EmptyBatch));
        assert_eq!(batch_error(&Outer(Wrapper(BatchError::EmptyBatch))), Some(BatchError::EmptyBatch));
        assert_eq!(batch_error(&std::fmt::Error), None);
    }

    #[test]
    #[should_panic(expected = "whole number of milliseconds")]
    fn millis_refuses_sub_millisecond_delays() {
        let _ = millis(Delay::from_duration(Duration::from_micros(1_500)));
    }
}

/// A panic payload whose own `Drop` panics.
struct PanicsOnDrop;

impl Drop for PanicsOnDrop {
    fn drop(&mut self) {
        panic!("a hostile observer's panic payload, panicking as it is dropped");
    }
}

/// An observer written as an attacker would: it counts each call, then panics with a payload
/// whose own `Drop` panics. A backend must return every result as if it had no observer, with
/// nothing unwinding into its caller.
#[derive(Debug, Default)]
pub struct HostileObserver {
    calls: AtomicUsize,
}

impl HostileObserver {
    /// How many observations it received.
    #[must_use]
    pub fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }

    fn strike(&self) {
        self.calls.fetch_add(1, Ordering::SeqCst);
        std::panic::panic_any(PanicsOnDrop);
    }
}

impl Observer for HostileObserver {
    fn observe(&self, _: &Observation<'_>) {
        self.strike();
    }
}

impl AttemptObserver for HostileObserver {
    fn observe_attempt(&self, _: &AttemptObservation<'_>) {
        self.strike();
    }
}
