//! [`ShardedStore`]: the one store behind [`MemoryStore`](crate::MemoryStore) and
//! [`GcraStore`](crate::GcraStore), generic over what it counts: engine, clock and observer
//! dispatch.

use std::fmt;

use quanta::Instant;

use runlimit_core::{
    AdmissionObservation, AdmissionOperation, AdmissionOutcome, AdmissionPolicy, BatchDecision, Check,
    CleanupObservation, CleanupOutcome, ConsumptionStatus, Decision, Limiter, Observation, Observer,
    PolicySubject, QuotaControl, QuotaSnapshot, ResetObservation, ResetOutcome,
    backend::{admission_outcome, batch_admission_outcome, notify},
};

use crate::{
    algorithm::MemoryAlgorithm,
    clock::{self, Clock, SystemClock},
    config::MemoryStoreConfig,
    engine::{Engine, Observed, Unobserved},
    error::{ObservedFailure, PoisonedShardError},
    stats::MemoryStoreStats,
};

/// A sharded, hard-bounded, process-local store of one algorithm's quotas: anchored fixed
/// windows for [`FixedWindowPolicy`](runlimit_core::FixedWindowPolicy) checks (named
/// [`MemoryStore`](crate::MemoryStore)) or GCRA for
/// [`GcraPolicy`](runlimit_core::GcraPolicy) checks (named [`GcraStore`](crate::GcraStore)).
///
/// Use those two names; this is the type they stand for. What each decision holds is on
/// their pages; the storage bounds, cleanup, clocks, poisoning and observers shared by both
/// are in the [crate documentation](crate).
pub struct ShardedStore<P, C = SystemClock, O = ()> {
    engine: Engine,
    clock: C,
    /// `None` unless a builder attached one: then no observation is built and no elapsed
    /// time is measured on the hot path.
    observer: Option<O>,
    algorithm: std::marker::PhantomData<fn() -> P>,
}

/// Builds a [`ShardedStore`] with a chosen [`Clock`] and [`Observer`]; from
/// [`ShardedStore::builder`] (spelled [`MemoryStore::builder`](crate::MemoryStore) or
/// [`GcraStore::builder`](crate::GcraStore)).
#[must_use = "a builder does nothing until `build` is called"]
pub struct ShardedStoreBuilder<P, C = SystemClock, O = ()> {
    config: MemoryStoreConfig,
    clock: C,
    observer: Option<O>,
    algorithm: std::marker::PhantomData<fn() -> P>,
}

fn saturating_u64(value: usize) -> u64 {
    u64::try_from(value).unwrap_or(u64::MAX)
}

/// Reports one finished operation. Runs after every shard lock is released; [`notify`]
/// catches observer panics, so an observer cannot change the result.
fn observe<'p, D, F: ObservedFailure, O: Observer>(
    observer: &O,
    started: Instant,
    operation: impl FnOnce(Option<usize>) -> AdmissionOperation<'p>,
    result: &Result<D, F>,
    report: &Observed,
    outcome: fn(&D) -> AdmissionOutcome,
) {
    let elapsed = started.elapsed();
    let observation = match result {
        Ok(decision) => {
            if report.cleanup.removed > 0 {
                let cleanup = CleanupObservation::new(
                    CleanupOutcome::Removed { count: saturating_u64(report.cleanup.removed) },
                    saturating_u64(report.cleanup.maximum),
                    report.cleanup.elapsed,
                );
                notify(observer, &Observation::Cleanup(cleanup));
            }
            let consumption =
                if report.consumed { ConsumptionStatus::Consumed } else { ConsumptionStatus::NotConsumed };
            AdmissionObservation::new(operation(report.singled_out), outcome(decision), consumption, elapsed)
                .with_shard_headroom(report.headroom)
        }
        Err(failure) => {
            let outcome = if failure.is_invalid_batch() {
                AdmissionOutcome::InvalidBatch
            } else {
                AdmissionOutcome::Failed
            };
            AdmissionObservation::new(
                operation(failure.singled_out()),
                outcome,
                ConsumptionStatus::NotConsumed,
                elapsed,
            )
        }
    };
    notify(observer, &Observation::Admission(observation));
}

impl<P: MemoryAlgorithm> ShardedStore<P> {
    /// A store on the [`SystemClock`] with no observer.
    #[must_use]
    pub fn new(config: MemoryStoreConfig) -> Self {
        Self::builder(config).build()
    }

    /// Starts a builder on the [`SystemClock`] with no observer. Choose the clock here: a
    /// built store cannot replace it, because its stored deadlines and arrival times belong to
    /// that clock's coordinate system.
    ///
    /// ```compile_fail
    /// use runlimit_memory::{ManualClock, MemoryStore, MemoryStoreConfig};
    /// let store = MemoryStore::new(MemoryStoreConfig::new(10)?);
    /// let store = store.with_clock(ManualClock::new()); // no such method
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn builder(config: MemoryStoreConfig) -> ShardedStoreBuilder<P> {
        ShardedStoreBuilder {
            config,
            clock: SystemClock::new(),
            observer: None,
            algorithm: std::marker::PhantomData,
        }
    }
}

impl<P: MemoryAlgorithm, C: Clock, O: Observer> ShardedStoreBuilder<P, C, O> {
    /// Uses `clock` instead of the [`SystemClock`], such as a
    /// [`ManualClock`](crate::ManualClock) in tests.
    pub fn with_clock<C2: Clock>(self, clock: C2) -> ShardedStoreBuilder<P, C2, O> {
        ShardedStoreBuilder { config: self.config, clock, observer: self.observer, algorithm: self.algorithm }
    }

    /// Reports every admission (and every cleanup pass that removed entries) to `observer`,
    /// synchronously, after the shard locks are released. Observer panics are caught.
    pub fn with_observer<O2: Observer>(self, observer: O2) -> ShardedStoreBuilder<P, C, O2> {
        ShardedStoreBuilder {
            config: self.config,
            clock: self.clock,
            observer: Some(observer),
            algorithm: self.algorithm,
        }
    }

    /// Builds the store. Shards start empty and grow on demand up to their fixed capacities.
    #[must_use]
    pub fn build(self) -> ShardedStore<P, C, O> {
        ShardedStore {
            engine: Engine::new(self.config),
            clock: self.clock,
            observer: self.observer,
            algorithm: std::marker::PhantomData,
        }
    }
}

impl<P: MemoryAlgorithm, C: Clock, O: Observer> ShardedStore<P, C, O> {
    /// Evaluates one check, consuming its [`cost`](runlimit_core::Check::cost) when allowed.
    ///
    /// Before evaluating, removes at most
    /// [`expired_removals_per_check`](MemoryStoreConfig::expired_removals_per_check) expired
    /// entries from the key's shard. A new key that does not fit its full shard is denied with
    /// [`Denial::StorageCapacity`](runlimit_core::Denial::StorageCapacity), whose `retry_after` is the time until the shard's earliest
    /// expiry when the store knows it.
    ///
    /// # Errors
    ///
    /// [`MemoryAlgorithm::CheckError`]: for a [`MemoryStore`](crate::MemoryStore)
    /// [`PoisonedShardError`](crate::PoisonedShardError) when the key's shard is poisoned; for
    /// a [`GcraStore`](crate::GcraStore) a [`GcraCheckError`](crate::GcraCheckError), which adds
    /// [`Evaluation`](crate::GcraCheckError::Evaluation) for a clock reading so large
    /// (hundreds of millions of years) that an arrival time no longer fits. Nothing was
    /// consumed in any case.
    pub fn check(&self, check: &Check<'_, P>) -> Result<Decision, P::CheckError> {
        let Some(observer) = &self.observer else {
            return self
                .engine
                .check::<P>(check, clock::millis(&self.clock), Unobserved)
                .map_err(P::check_error);
        };
        let started = Instant::now();
        let mut observed = Observed::default();
        let result = self.engine.check::<P>(check, clock::millis(&self.clock), &mut observed);
        let operation = |_| AdmissionOperation::Check { policy: AdmissionPolicy::of(check.policy()) };
        observe(observer, started, operation, &result, &observed, admission_outcome);
        result.map_err(P::check_error)
    }

    /// Evaluates an atomic batch: when every check is allowed, all are consumed together and
    /// the allowances are returned in input order; otherwise nothing is consumed and the
    /// decision names the deciding index (the rule of
    /// [`runlimit_core::backend::batch`]: under enforcement the first denial in input order,
    /// whatever its reason; in shadow mode a storage denial wins over every shadow denial,
    /// because storage capacity fails closed in every mode).
    ///
    /// Each check entitles its shard to the configured expired-entry removals.
    ///
    /// # Errors
    ///
    /// [`MemoryAlgorithm::BatchError`]: a [`MemoryBatchError`](crate::MemoryBatchError)
    /// (wrapped in [`GcraBatchError::Store`](crate::GcraBatchError::Store) for a
    /// [`GcraStore`](crate::GcraStore)):
    ///
    /// - [`InvalidBatch`](crate::MemoryBatchError::InvalidBatch): empty, larger than
    ///   [`maximum_batch_size`](MemoryStoreConfig::maximum_batch_size), mixed quota modes or
    ///   a repeated storage key; checked before any storage work.
    /// - [`BatchExceedsShardCapacity`](crate::MemoryBatchError::BatchExceedsShardCapacity):
    ///   more distinct keys in one shard than it can ever hold; checked before any lock.
    /// - [`PoisonedShard`](crate::MemoryBatchError::PoisonedShard): a touched shard is
    ///   poisoned.
    ///
    /// A [`GcraStore`](crate::GcraStore) adds
    /// [`GcraBatchError::Evaluation`](crate::GcraBatchError::Evaluation) naming the check the
    /// evaluator could not decide. Nothing was consumed in any error case.
    pub fn check_all(&self, checks: &[Check<'_, P>]) -> Result<BatchDecision, P::BatchError> {
        let Some(observer) = &self.observer else {
            return self
                .engine
                .check_all::<P>(checks, clock::millis(&self.clock), Unobserved)
                .map_err(P::batch_error);
        };
        let started = Instant::now();
        let mut observed = Observed::default();
        let result = self.engine.check_all::<P>(checks, clock::millis(&self.clock), &mut observed);
        let operation = |index: Option<usize>| AdmissionOperation::Batch {
            size: checks.len(),
            policy: index
                .and_then(|index| checks.get(index))
                .map(|check| AdmissionPolicy::of(check.policy())),
        };
        observe(observer, started, operation, &result, &observed, batch_admission_outcome);
        result.map_err(P::batch_error)
    }

    /// The subject's quota now, without consuming, creating or changing anything: no entry is
    /// created, no slot taken, no expired entry removed and the shard's clock watermark is not
    /// moved. A snapshot that a concurrent check may change at once (see
    /// [`QuotaSnapshot`]); never admit on it.
    ///
    /// Reads the subject's entry under its shard lock, at the store clock clamped to the
    /// latest reading the shard has used (as a check is), with the rule of the store's
    /// algorithm (`runlimit_core::backend::fixed_window::peek` or `gcra::peek`). Not reported
    /// to the observer.
    ///
    /// # Errors
    ///
    /// The same as [`check`](Self::check), with nothing changed in any case.
    pub fn peek(&self, subject: PolicySubject<'_, P>) -> Result<QuotaSnapshot, P::CheckError> {
        let check = Check::new(subject);
        self.engine.peek::<P>(&check, clock::millis(&self.clock)).map_err(P::check_error)
    }

    /// Removes the subject's entry for its policy and returns whether it was live (an expired
    /// entry not yet reclaimed is removed too, and reported as `false`). Its slot is free at
    /// once, so a full shard admits a new key afterwards, and the next check of the subject
    /// behaves as for a fresh key. Quota mode is not part of the key: a reset through a shadow
    /// policy clears the enforced counter too.
    ///
    /// Reported to the observer as [`Observation::Reset`]. Costs `O(n)` in the shard's
    /// entries (the expiry index is rebuilt without the entry), so it is meant for operators,
    /// not for every request.
    ///
    /// # Errors
    ///
    /// [`PoisonedShardError`] when the subject's shard is poisoned; nothing was removed.
    pub fn reset(&self, subject: PolicySubject<'_, P>) -> Result<bool, PoisonedShardError> {
        let started = self.observer.as_ref().map(|_| Instant::now());
        let check = Check::new(subject);
        let result = self.engine.reset::<P>(&check, clock::millis(&self.clock));
        if let (Some(observer), Some(started)) = (&self.observer, started) {
            let outcome = match result {
                Ok(true) => ResetOutcome::Removed,
                Ok(false) => ResetOutcome::NothingStored,
                Err(_) => ResetOutcome::NoEffect,
            };
            let policy = AdmissionPolicy::of(subject.policy());
            notify(observer, &Observation::Reset(ResetObservation::new(policy, outcome, started.elapsed())));
        }
        result
    }

    /// Empties every poisoned shard, clears its poison flag and returns how many shards were
    /// recovered. Healthy shards keep their counters.
    ///
    /// An explicit availability tradeoff: the recovered shards forget their windows and
    /// arrival times (their subjects become fully rested), so requests their lost state would
    /// have denied can be admitted. Keep admissions failing closed and alert operators before
    /// choosing to call this.
    pub fn recover_poisoned(&self) -> usize {
        self.engine.recover_poisoned()
    }

    /// A snapshot of each shard's entries, capacity and poison state.
    #[must_use]
    pub fn stats(&self) -> MemoryStoreStats {
        self.engine.stats()
    }

    /// The store's configuration.
    #[must_use]
    pub fn config(&self) -> &MemoryStoreConfig {
        self.engine.config()
    }

    #[cfg(test)]
    pub(crate) fn engine(&self) -> &Engine {
        &self.engine
    }
}

impl<P: MemoryAlgorithm, C, O> fmt::Debug for ShardedStore<P, C, O> {
    /// `MemoryStore { .. }` or `GcraStore { .. }`: no keys, no counters.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct(P::NAMES.0).finish_non_exhaustive()
    }
}

impl<P: MemoryAlgorithm, C, O> fmt::Debug for ShardedStoreBuilder<P, C, O> {
    /// `MemoryStoreBuilder { config: .. }` or `GcraStoreBuilder { config: .. }`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct(P::NAMES.1).field("config", &self.config).finish_non_exhaustive()
    }
}

/// The async face of a [`ShardedStore`]; evaluation is synchronous and never waits.
///
/// # Cancel safety
///
/// The returned futures do nothing until first polled, and complete on that first poll.
/// Creating and dropping an unpolled future consumes no quota.
impl<P: MemoryAlgorithm, C: Clock, O: Observer> Limiter for ShardedStore<P, C, O> {
    type Policy = P;
    type CheckError = P::CheckError;
    type CheckAllError = P::BatchError;

    async fn check(&self, check: &Check<'_, P>) -> Result<Decision, P::CheckError> {
        Self::check(self, check)
    }

    async fn check_all(&self, checks: &[Check<'_, P>]) -> Result<BatchDecision, P::BatchError> {
        Self::check_all(self, checks)
    }
}

/// Peeks and resets of a [`ShardedStore`], synchronous like its checks and complete on the
/// first poll.
impl<P: MemoryAlgorithm, C: Clock, O: Observer> QuotaControl for ShardedStore<P, C, O> {
    type PeekError = P::CheckError;
    type ResetError = PoisonedShardError;

    async fn peek(&self, subject: PolicySubject<'_, P>) -> Result<QuotaSnapshot, P::CheckError> {
        Self::peek(self, subject)
    }

    async fn reset(&self, subject: PolicySubject<'_, P>) -> Result<bool, PoisonedShardError> {
        Self::reset(self, subject)
    }
}
