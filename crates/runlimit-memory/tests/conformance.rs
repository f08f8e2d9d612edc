//! The shared conformance suite (`runlimit-conformance`) on the memory stores: every
//! fixed-window, GCRA and attempt scenario, on a [`ManualClock`] that only the scenario moves.
//!
//! Tests are named `conformance::fixed_window::<scenario>`, `conformance::gcra::<scenario>`
//! and `conformance::attempts::<scenario>`. Every store has one shard (the default), so any
//! distinct subjects share it; `bounded(n)` replaces the store with a fresh one-shard store of
//! `n` keys on the same clock.

use std::sync::Arc;

use runlimit_conformance::{AttemptBackend, QuotaBackend};
use runlimit_core::{
    AttemptSubject, BatchDecision, Check, Decision, FixedWindowPolicy, GcraPolicy, KeyHasher, Limiter,
    Observer, PolicySubject, QuotaControl, QuotaSnapshot, SubjectKey,
    attempts::{AttemptCompletionResult, AttemptDecision, AttemptObserver, AttemptOutcome, AttemptPolicy},
};
use runlimit_memory::{
    DEFAULT_MAXIMUM_BATCH_SIZE, ManualClock, MemoryAlgorithm, MemoryAttemptLimiter, MemoryAttemptReceipt,
    MemoryStoreConfig, PoisonedShardError, ShardedStore,
};

/// Room for every key an unbounded scenario stores (the largest uses `MAX_BATCH_SIZE + 1`).
const ROOMY: usize = 10_000;

fn config(max_keys: usize) -> MemoryStoreConfig {
    MemoryStoreConfig::new(max_keys).expect("a valid memory store configuration")
}

/// An observer a scenario installs ([`QuotaBackend::observed`]).
type QuotaObserver = Arc<dyn Observer>;

/// An attempt observer a scenario installs ([`AttemptBackend::observed`]).
type AttemptsObserver = Arc<dyn AttemptObserver>;

/// The store under test: without an observer, as every scenario runs it unless it installs
/// one, so the suite covers the path on which no observation is built.
enum Store<P> {
    Plain(ShardedStore<P, ManualClock>),
    Observed(ShardedStore<P, ManualClock, QuotaObserver>),
}

impl<P: MemoryAlgorithm> Limiter for Store<P> {
    type Policy = P;
    type CheckError = P::CheckError;
    type CheckAllError = P::BatchError;

    async fn check(&self, check: &Check<'_, P>) -> Result<Decision, P::CheckError> {
        match self {
            Self::Plain(store) => store.check(check),
            Self::Observed(store) => store.check(check),
        }
    }

    async fn check_all(&self, checks: &[Check<'_, P>]) -> Result<BatchDecision, P::BatchError> {
        match self {
            Self::Plain(store) => store.check_all(checks),
            Self::Observed(store) => store.check_all(checks),
        }
    }
}

impl<P: MemoryAlgorithm> QuotaControl for Store<P> {
    type PeekError = P::CheckError;
    type ResetError = PoisonedShardError;

    async fn peek(&self, subject: PolicySubject<'_, P>) -> Result<QuotaSnapshot, P::CheckError> {
        match self {
            Self::Plain(store) => store.peek(subject),
            Self::Observed(store) => store.peek(subject),
        }
    }

    async fn reset(&self, subject: PolicySubject<'_, P>) -> Result<bool, PoisonedShardError> {
        match self {
            Self::Plain(store) => store.reset(subject),
            Self::Observed(store) => store.reset(subject),
        }
    }
}

/// A memory quota store (`P` = [`FixedWindowPolicy`]: a `MemoryStore`; [`GcraPolicy`]: a
/// `GcraStore`) on a manual clock.
struct MemoryQuota<P> {
    clock: ManualClock,
    store: Store<P>,
}

/// A `MemoryStore<ManualClock>` under test.
type MemoryFixedWindow = MemoryQuota<FixedWindowPolicy>;

/// A `GcraStore<ManualClock>` under test.
type MemoryGcra = MemoryQuota<GcraPolicy>;

impl<P: MemoryAlgorithm> MemoryQuota<P> {
    fn store(clock: &ManualClock, max_keys: usize) -> Store<P> {
        Store::Plain(ShardedStore::<P>::builder(config(max_keys)).with_clock(clock.clone()).build())
    }
}

impl<P: MemoryAlgorithm> QuotaBackend for MemoryQuota<P> {
    type Policy = P;
    type Limiter = Store<P>;

    const MAX_BATCH_SIZE: usize = DEFAULT_MAXIMUM_BATCH_SIZE;
    const REPORTS_STORAGE_RETRY: bool = true;

    fn run<F>(_name: &'static str, scenario: F)
    where
        F: AsyncFnOnce(&mut Self),
    {
        let clock = ManualClock::new();
        let mut backend = Self { store: Self::store(&clock, ROOMY), clock };
        futures_executor::block_on(scenario(&mut backend));
    }

    fn limiter(&self) -> &Self::Limiter {
        &self.store
    }

    async fn bounded(&mut self, keys_per_shard: usize) {
        self.store = Self::store(&self.clock, keys_per_shard);
    }

    async fn observed(&mut self, observer: Arc<dyn Observer>) {
        let builder = ShardedStore::<P>::builder(config(ROOMY)).with_clock(self.clock.clone());
        self.store = Store::Observed(builder.with_observer(observer).build());
    }

    fn subjects_in_one_shard(&self, count: usize) -> Vec<SubjectKey> {
        // One shard: any distinct subjects share it.
        (0..).take(count).map(runlimit_conformance::support::subject).collect()
    }

    async fn advance(&mut self, millis: u64) {
        self.clock.advance_millis(millis);
    }

    async fn reclaim_expired(&mut self) {
        // Nothing to schedule: every check first removes expired entries from its shard.
    }
}

/// A `MemoryAttemptLimiter<ManualClock>` under test.
struct MemoryAttempts {
    clock: ManualClock,
    limiter: Attempts,
}

/// The attempt limiter under test: without an observer unless a scenario installs one.
enum Attempts {
    Plain(MemoryAttemptLimiter<ManualClock>),
    Observed(MemoryAttemptLimiter<ManualClock, AttemptsObserver>),
}

impl MemoryAttempts {
    fn limiter(clock: &ManualClock, max_keys: usize) -> Attempts {
        Attempts::Plain(MemoryAttemptLimiter::builder(config(max_keys)).with_clock(clock.clone()).build())
    }
}

impl AttemptBackend for MemoryAttempts {
    type Receipt = MemoryAttemptReceipt;

    fn run<F>(_name: &'static str, scenario: F)
    where
        F: AsyncFnOnce(&mut Self),
    {
        let clock = ManualClock::new();
        let mut backend = Self { limiter: Self::limiter(&clock, ROOMY), clock };
        futures_executor::block_on(scenario(&mut backend));
    }

    async fn acquire(&mut self, subject: &AttemptSubject<'_>) -> AttemptDecision<Self::Receipt> {
        match &self.limiter {
            Attempts::Plain(limiter) => limiter.acquire(subject),
            Attempts::Observed(limiter) => limiter.acquire(subject),
        }
        .expect("the attempt limiter's shard is healthy")
    }

    async fn complete(&mut self, receipt: Self::Receipt, outcome: AttemptOutcome) -> AttemptCompletionResult {
        match &self.limiter {
            Attempts::Plain(limiter) => limiter.complete(receipt, outcome),
            Attempts::Observed(limiter) => limiter.complete(receipt, outcome),
        }
        .expect("the attempt limiter's shard is healthy")
    }

    async fn reset(&mut self, subject: &AttemptSubject<'_>) -> bool {
        match &self.limiter {
            Attempts::Plain(limiter) => limiter.reset(subject),
            Attempts::Observed(limiter) => limiter.reset(subject),
        }
        .expect("the attempt limiter's shard is healthy")
    }

    async fn advance(&mut self, millis: u64) {
        self.clock.advance_millis(millis);
    }

    async fn bounded(&mut self, subjects_per_shard: usize) {
        self.limiter = Self::limiter(&self.clock, subjects_per_shard);
    }

    async fn observed(&mut self, observer: Arc<dyn AttemptObserver>) {
        let builder = MemoryAttemptLimiter::builder(config(ROOMY)).with_clock(self.clock.clone());
        self.limiter = Attempts::Observed(builder.with_observer(observer).build());
    }

    fn subjects_in_one_shard(
        &self,
        _hasher: &KeyHasher,
        _policy: &AttemptPolicy,
        count: usize,
    ) -> Vec<Vec<u8>> {
        // One shard: any distinct subjects share it.
        (0..count).map(|n| format!("subject-{n}@example.test").into_bytes()).collect()
    }
}

mod conformance {
    use super::*;

    runlimit_conformance::fixed_window_scenarios!(MemoryFixedWindow);
    runlimit_conformance::gcra_scenarios!(MemoryGcra);
    runlimit_conformance::attempt_scenarios!(MemoryAttempts);
}
