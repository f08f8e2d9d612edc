//! The `Limiter` trait shape, shown with a toy in-test implementation: its futures are `Send`
//! through `&L`, `Arc<L>` and generic code (so they can be spawned on a multi-threaded
//! runtime), and single checks and batches keep separate error types.
//!
//! Whether a real backend's unpolled future consumes nothing is that backend's concern; the
//! toy does all its work inside the returned future, which the last test demonstrates.

use std::{
    collections::HashMap,
    fmt,
    future::Future,
    sync::{Arc, Mutex},
    time::Duration,
};

use futures_executor::block_on;
use runlimit_core::{
    Allowance, BatchDecision, BatchDecisionView, BatchError, Check, CounterKey, Decision, DecisionView,
    Delay, FixedWindowPolicy, Limiter, PolicyId, QuotaDenial, QuotaMode, RateLimitPolicy, ScopeId,
    SubjectKey, backend::batch::validate as validate_batch,
};

/// A toy limiter: a per-key count that never resets (enough to show the trait's shape).
#[derive(Debug, Default)]
struct Toy {
    used: Mutex<HashMap<CounterKey, u64>>,
}

#[derive(Debug)]
struct Poisoned;

impl fmt::Display for Poisoned {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("toy state poisoned")
    }
}
impl std::error::Error for Poisoned {}

#[derive(Debug)]
enum ToyBatchError {
    Batch(BatchError),
    Poisoned,
}

impl fmt::Display for ToyBatchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Batch(_) => f.write_str("invalid batch"),
            Self::Poisoned => f.write_str("toy state poisoned"),
        }
    }
}
impl std::error::Error for ToyBatchError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Batch(error) => Some(error),
            Self::Poisoned => None,
        }
    }
}

const MAX_BATCH: usize = 4;

impl Toy {
    fn decide(used: u64, policy: &FixedWindowPolicy) -> Result<Allowance, QuotaDenial> {
        let limit = policy.limit();
        if used < limit.get() {
            Ok(Allowance::new(limit, limit.get() - used - 1, Delay::from_millis(policy.window().as_millis()))
                .expect("available is below the limit"))
        } else {
            Err(QuotaDenial::new(limit, Delay::from_millis(policy.window().as_millis())))
        }
    }

    fn used(&self, key: &CounterKey) -> u64 {
        self.used.lock().unwrap().get(key).copied().unwrap_or(0)
    }
}

impl Limiter for Toy {
    type Policy = FixedWindowPolicy;
    type CheckError = Poisoned;
    type CheckAllError = ToyBatchError;

    fn check(
        &self,
        check: &Check<'_, Self::Policy>,
    ) -> impl Future<Output = Result<Decision, Self::CheckError>> + Send {
        let check = *check;
        // All work happens when the future is polled.
        async move {
            let mut used = self.used.lock().map_err(|_| Poisoned)?;
            let count = used.entry(check.counter_key()).or_insert(0);
            match Self::decide(*count, check.policy()) {
                Ok(allowance) => {
                    *count += 1;
                    Ok(Decision::allowed(allowance))
                }
                Err(denial) => Ok(Decision::quota_exceeded(denial, check.policy().quota_mode())),
            }
        }
    }

    // An implementation may also be an `async fn`; the compiler checks it against the trait's
    // `+ Send` bound.
    async fn check_all(
        &self,
        checks: &[Check<'_, Self::Policy>],
    ) -> Result<BatchDecision, Self::CheckAllError> {
        let mode = validate_batch(checks, MAX_BATCH).map_err(ToyBatchError::Batch)?;
        let mut used = self.used.lock().map_err(|_| ToyBatchError::Poisoned)?;
        let mut allowances = Vec::with_capacity(checks.len());
        for (index, check) in checks.iter().enumerate() {
            let count = used.get(&check.counter_key()).copied().unwrap_or(0);
            match Self::decide(count, check.policy()) {
                Ok(allowance) => allowances.push(allowance),
                Err(denial) => {
                    return Ok(BatchDecision::quota_exceeded(index, checks.len(), denial, mode)
                        .expect("index is below the batch size"));
                }
            }
        }
        for check in checks {
            *used.entry(check.counter_key()).or_insert(0) += 1;
        }
        Ok(BatchDecision::allowed(allowances).expect("validated batches are non-empty"))
    }
}

fn assert_send<T: Send>(_: &T) {}

fn policy(limit: u64) -> FixedWindowPolicy {
    FixedWindowPolicy::new(
        PolicyId::new("api").unwrap(),
        ScopeId::new("client").unwrap(),
        limit,
        Duration::from_secs(1),
    )
    .unwrap()
}

/// The spec's adapter example, generic over any limiter.
async fn admit<L: Limiter>(
    limiter: &L,
    checks: &[Check<'_, L::Policy>],
) -> Result<BatchDecision, L::CheckAllError> {
    limiter.check_all(checks).await
}

/// In generic code the trait alone guarantees `Send` futures.
fn generic_futures_are_send<L: Limiter>(limiter: &L, check: &Check<'_, L::Policy>) {
    assert_send(&limiter.check(check));
    assert_send(&limiter.check_all(std::slice::from_ref(check)));
    assert_send(&admit(limiter, std::slice::from_ref(check)));
}

/// What a multi-threaded executor's `spawn` requires: `Send + 'static`.
fn spawnable<F: Future + Send + 'static>(future: F) -> F {
    future
}

#[test]
fn futures_are_send_through_every_handle() {
    let toy = Toy::default();
    let policy = policy(2);
    let check = Check::new(SubjectKey::from_digest([1; 32]).bind(&policy));

    assert_send(&Limiter::check(&toy, &check));
    assert_send(&Limiter::check_all(&toy, &[check]));
    assert_send(&Limiter::check(&&toy, &check));
    let shared = Arc::new(toy);
    assert_send(&Limiter::check(&shared, &check));
    assert_send(&Limiter::check_all(&shared, &[check]));
    generic_futures_are_send(&*shared, &check);
    generic_futures_are_send(&&*shared, &check);
    generic_futures_are_send(&shared, &check);

    // An owned Arc<L> moved into a 'static task that builds its own check.
    let task = spawnable({
        let limiter = Arc::clone(&shared);
        async move {
            let policy = self::policy(2);
            let check = Check::new(SubjectKey::from_digest([9; 32]).bind(&policy));
            Limiter::check(&limiter, &check).await
        }
    });
    let decision = block_on(task).unwrap();
    assert_eq!(decision.view(), DecisionView::Allowed { allowance: &allowance(2, 1) });
}

fn allowance(limit: u64, available: u64) -> Allowance {
    Allowance::new(runlimit_core::Capacity::new(limit).unwrap(), available, Delay::from_millis(1_000))
        .unwrap()
}

#[test]
fn handles_share_state_and_report_exact_decisions() {
    let toy = Arc::new(Toy::default());
    let enforce = policy(2);
    let shadow = policy(2).with_quota_mode(QuotaMode::Shadow);
    let key = SubjectKey::from_digest([1; 32]);
    let check = Check::new(key.bind(&enforce));

    let first = block_on(Limiter::check(&*toy, &check)).unwrap();
    assert_eq!(first.view(), DecisionView::Allowed { allowance: &allowance(2, 1) });
    let second = block_on(Limiter::check(&toy, &check)).unwrap();
    assert_eq!(second.view(), DecisionView::Allowed { allowance: &allowance(2, 0) });
    let third = block_on(Limiter::check(&&*toy, &check)).unwrap();
    assert!(!third.permits_request());
    // The shadow policy shares the fingerprint, so the same counter: shadow-denied, admitted.
    let shadowed = block_on(Limiter::check(&toy, &Check::new(key.bind(&shadow)))).unwrap();
    assert!(shadowed.permits_request());
    assert!(matches!(shadowed.view(), DecisionView::ShadowDenied { .. }));

    // Batches: structural errors surface through CheckAllError, with the BatchError as source.
    let other = Check::new(SubjectKey::from_digest([2; 32]).bind(&enforce));
    let error = block_on(admit(&*toy, &[other, other])).unwrap_err();
    assert!(matches!(
        error,
        ToyBatchError::Batch(BatchError::DuplicateCounterKey { first_index: 0, duplicate_index: 1 })
    ));
    assert_eq!(
        std::error::Error::source(&error).map(ToString::to_string),
        Some("check 1 repeats the storage key of check 0".to_owned())
    );
    let denied = block_on(admit(&toy, &[other, check])).unwrap();
    assert_eq!(denied.batch_size(), 2);
    assert!(matches!(denied.view(), BatchDecisionView::Denied { index: 1, batch_size: 2, .. }));
    // Nothing was consumed by the denied batch.
    assert_eq!(toy.used(&other.counter_key()), 0);
}

#[test]
fn the_toy_consumes_nothing_until_polled() {
    let toy = Toy::default();
    let policy = policy(1);
    let check = Check::new(SubjectKey::from_digest([3; 32]).bind(&policy));
    for _ in 0..3 {
        let unpolled = Limiter::check(&toy, &check);
        drop(unpolled);
        let checks = [check];
        let unpolled_batch = Limiter::check_all(&toy, &checks);
        drop(unpolled_batch);
    }
    assert_eq!(toy.used(&check.counter_key()), 0);
    let decision = block_on(Limiter::check(&toy, &check)).unwrap();
    assert_eq!(decision.view(), DecisionView::Allowed { allowance: &allowance(1, 0) });
    assert_eq!(toy.used(&check.counter_key()), 1);
    assert_eq!(check.policy().quota_mode(), QuotaMode::Enforce);
}
