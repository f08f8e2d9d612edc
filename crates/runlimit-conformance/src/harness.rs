//! What a backend implements to run the suite.

use std::{future::Future, sync::Arc};

use runlimit_core::{
    AttemptSubject, KeyHasher, Observer, QuotaControl, RateLimitPolicy, SubjectKey,
    attempts::{AttemptCompletionResult, AttemptDecision, AttemptObserver, AttemptOutcome, AttemptPolicy},
};

/// A quota backend under test for one algorithm: its limiter, a controlled clock and its
/// storage bounds.
///
/// Every scenario starts on a fresh backend whose clock reads 0 ms (time is relative to the
/// backend's origin) and whose storage has room for every key a scenario uses, unless the
/// scenario asks for [`bounded`](Self::bounded) storage.
pub trait QuotaBackend: Sized {
    /// The policy type the backend evaluates.
    type Policy: RateLimitPolicy;
    /// The limiter under test, with its peeks and resets.
    type Limiter: QuotaControl<Policy = Self::Policy>;

    /// The largest batch the limiter accepts.
    const MAX_BATCH_SIZE: usize;

    /// Whether a storage-capacity denial reports the time until the earliest expiry that may
    /// make room (`Some`), or never knows it (`None`, as for PostgreSQL, where only cleanup
    /// frees a slot).
    const REPORTS_STORAGE_RETRY: bool;

    /// Builds a fresh backend for the scenario `name` (unique per scenario, usable as a
    /// database or key-prefix name), runs `scenario` on it to completion and tears it down.
    /// Called once per generated `#[test]`.
    fn run<F>(name: &'static str, scenario: F)
    where
        F: AsyncFnOnce(&mut Self);

    /// The limiter under test.
    fn limiter(&self) -> &Self::Limiter;

    /// Replaces the limiter with a fresh, empty one whose storage shards each hold at most
    /// `keys_per_shard` keys, on the same clock.
    fn bounded(&mut self, keys_per_shard: usize) -> impl Future<Output = ()>;

    /// Replaces the limiter with a fresh, empty one with room for every key a scenario uses,
    /// on the same clock, that reports every observation to `observer`.
    fn observed(&mut self, observer: Arc<dyn Observer>) -> impl Future<Output = ()>;

    /// `count` distinct subject keys that share one storage shard of this backend.
    fn subjects_in_one_shard(&self, count: usize) -> Vec<SubjectKey>;

    /// Moves the backend's clock forward by `millis`.
    fn advance(&mut self, millis: u64) -> impl Future<Output = ()>;

    /// Reclaims expired storage the way an operator schedules it: PostgreSQL runs
    /// `cleanup_expired`; a memory store does nothing, because its checks reclaim expired
    /// entries as they go.
    fn reclaim_expired(&mut self) -> impl Future<Output = ()>;
}

/// An attempt limiter under test.
///
/// Every scenario starts on a fresh backend whose clock reads 0 ms and whose storage has room
/// for every subject a scenario uses, unless it asks for [`bounded`](Self::bounded) storage.
pub trait AttemptBackend: Sized {
    /// The backend's receipt.
    type Receipt: std::fmt::Debug;

    /// Builds a fresh backend for the scenario `name`, runs `scenario` on it and tears it down.
    fn run<F>(name: &'static str, scenario: F)
    where
        F: AsyncFnOnce(&mut Self);

    /// Admits an attempt or says why not; panics on a backend error.
    fn acquire(
        &mut self,
        subject: &AttemptSubject<'_>,
    ) -> impl Future<Output = AttemptDecision<Self::Receipt>>;

    /// Completes a receipt; panics on a backend error.
    fn complete(
        &mut self,
        receipt: Self::Receipt,
        outcome: AttemptOutcome,
    ) -> impl Future<Output = AttemptCompletionResult>;

    /// An operator's reset of the subject's failure state; whether it held live state. Panics
    /// on a backend error.
    fn reset(&mut self, subject: &AttemptSubject<'_>) -> impl Future<Output = bool>;

    /// Moves the backend's clock forward by `millis`.
    fn advance(&mut self, millis: u64) -> impl Future<Output = ()>;

    /// Replaces the limiter with a fresh, empty one whose shards each hold at most
    /// `subjects_per_shard` subjects, on the same clock.
    fn bounded(&mut self, subjects_per_shard: usize) -> impl Future<Output = ()>;

    /// Replaces the limiter with a fresh, empty one with room for every subject a scenario
    /// uses, on the same clock, that reports every observation to `observer`.
    fn observed(&mut self, observer: Arc<dyn AttemptObserver>) -> impl Future<Output = ()>;

    /// `count` distinct normalized subjects (inputs to [`KeyHasher::hash_attempt_for`]) whose
    /// keys under `policy` and `hasher` share one storage shard of this backend.
    fn subjects_in_one_shard(&self, hasher: &KeyHasher, policy: &AttemptPolicy, count: usize)
    -> Vec<Vec<u8>>;
}
