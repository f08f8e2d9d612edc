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
    AttemptSubject, FixedWindowPolicy, GcraPolicy, KeyHasher, Observer, SubjectKey,
    attempts::{AttemptCompletionResult, AttemptDecision, AttemptObserver, AttemptOutcome, AttemptPolicy},
};
use runlimit_memory::{
    DEFAULT_MAXIMUM_BATCH_SIZE, ManualClock, MemoryAlgorithm, MemoryAttemptLimiter, MemoryAttemptReceipt,
    MemoryStoreConfig, ShardedStore,
};

/// Room for every key an unbounded scenario stores (the largest uses `MAX_BATCH_SIZE + 1`).
const ROOMY: usize = 10_000;

fn config(max_keys: usize) -> MemoryStoreConfig {
    MemoryStoreConfig::new(max_keys).expect("a valid memory store configuration")
}

/// The observer every store under the suite reports to: `()` unless a scenario installs its own.
type QuotaObserver = Arc<dyn Observer>;

/// The attempt observer every limiter under the suite reports to.
type AttemptsObserver = Arc<dyn AttemptObserver>;

/// A memory quota store (`P` = [`FixedWindowPolicy`]: a `MemoryStore`; [`GcraPolicy`]: a
/// `GcraStore`) on a manual clock.
struct MemoryQuota<P> {
    clock: ManualClock,
    store: ShardedStore<P, ManualClock, QuotaObserver>,
}

/// A `MemoryStore<ManualClock>` under test.
type MemoryFixedWindow = MemoryQuota<FixedWindowPolicy>;

/// A `GcraStore<ManualClock>` under test.
type MemoryGcra = MemoryQuota<GcraPolicy>;

impl<P: MemoryAlgorithm> MemoryQuota<P> {
    fn store(
        clock: &ManualClock,
        max_keys: usize,
        observer: QuotaObserver,
    ) -> ShardedStore<P, ManualClock, QuotaObserver> {
        ShardedStore::<P>::builder(config(max_keys)).with_clock(clock.clone()).with_observer(observer).build()
    }
}

impl<P: MemoryAlgorithm> QuotaBackend for MemoryQuota<P> {
    type Policy = P;
    type Limiter = ShardedStore<P, ManualClock, QuotaObserver>;

    const MAX_BATCH_SIZE: usize = DEFAULT_MAXIMUM_BATCH_SIZE;
    const REPORTS_STORAGE_RETRY: bool = true;

    fn run<F>(_name: &'static str, scenario: F)
    where
        F: AsyncFnOnce(&mut Self),
    {
        let clock = ManualClock::new();
        let mut backend = Self { store: Self::store(&clock, ROOMY, Arc::new(())), clock };
        futures_executor::block_on(scenario(&mut backend));
    }

    fn limiter(&self) -> &Self::Limiter {
        &self.store
    }

    async fn bounded(&mut self, keys_per_shard: usize) {
        self.store = Self::store(&self.clock, keys_per_shard, Arc::new(()));
    }

    async fn observed(&mut self, observer: Arc<dyn Observer>) {
        self.store = Self::store(&self.clock, ROOMY, observer);
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
    limiter: MemoryAttemptLimiter<ManualClock, AttemptsObserver>,
}

impl MemoryAttempts {
    fn limiter(
        clock: &ManualClock,
        max_keys: usize,
        observer: AttemptsObserver,
    ) -> MemoryAttemptLimiter<ManualClock, AttemptsObserver> {
        MemoryAttemptLimiter::builder(config(max_keys))
            .with_clock(clock.clone())
            .with_observer(observer)
            .build()
    }
}

impl AttemptBackend for MemoryAttempts {
    type Receipt = MemoryAttemptReceipt;

    fn run<F>(_name: &'static str, scenario: F)
    where
        F: AsyncFnOnce(&mut Self),
    {
        let clock = ManualClock::new();
        let mut backend = Self { limiter: Self::limiter(&clock, ROOMY, Arc::new(())), clock };
        futures_executor::block_on(scenario(&mut backend));
    }

    async fn acquire(&mut self, subject: &AttemptSubject<'_>) -> AttemptDecision<Self::Receipt> {
        self.limiter.acquire(subject).expect("the attempt limiter's shard is healthy")
    }

    async fn complete(&mut self, receipt: Self::Receipt, outcome: AttemptOutcome) -> AttemptCompletionResult {
        self.limiter.complete(receipt, outcome).expect("the attempt limiter's shard is healthy")
    }

    async fn reset(&mut self, subject: &AttemptSubject<'_>) -> bool {
        self.limiter.reset(subject).expect("the attempt limiter's shard is healthy")
    }

    async fn advance(&mut self, millis: u64) {
        self.clock.advance_millis(millis);
    }

    async fn bounded(&mut self, subjects_per_shard: usize) {
        self.limiter = Self::limiter(&self.clock, subjects_per_shard, Arc::new(()));
    }

    async fn observed(&mut self, observer: Arc<dyn AttemptObserver>) {
        self.limiter = Self::limiter(&self.clock, ROOMY, observer);
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
