//! [`GcraStore`]: continuously replenished GCRA quotas in process memory.

use std::fmt;

use runlimit_core::{
    BatchDecision, Check, Decision, GcraPolicy, Limiter, Observer,
    gcra::{self, GcraError, GcraOutcome, TheoreticalArrivalTime},
};

use crate::{
    clock::{Clock, SystemClock},
    config::MemoryStoreConfig,
    engine::{Algorithm, Verdict},
    error::{CheckFailure, Failure, GcraBatchError, GcraCheckError},
    shard::Entry,
    stats::MemoryStoreStats,
    store::{Parts, Store},
};

/// GCRA through [`runlimit_core::gcra::evaluate`].
///
/// An entry stores the scaled theoretical arrival time `tat` (milliseconds × Q) exactly, as
/// `expires_at = ⌈tat / Q⌉` (the first millisecond at which the subject is fully rested, so
/// the entry's expiry) and `deficit = expires_at × Q − tat` (in `0..Q`). Both fit 64 bits, and
/// neither storing nor restoring needs a division: `expires_at` is `now + replenish_after`
/// from the evaluator (because `now × Q` is a multiple of Q), and `tat = expires_at × Q −
/// deficit`.
pub(crate) enum Gcra {}

impl Algorithm for Gcra {
    type Policy = GcraPolicy;
    type Error = GcraError;

    fn evaluate(policy: &GcraPolicy, live: Option<Entry>, now: u64) -> Result<Verdict, GcraError> {
        let parameters = policy.gcra_parameters();
        let quota = u128::from(parameters.quota().get());
        let tat = match live {
            // expires_at < 2⁶⁴ and Q ≤ MAX_LIMIT < 2⁶³: the product is below 2¹²⁷.
            Some(entry) => Some(
                (u128::from(entry.expires_at) * quota)
                    .checked_sub(u128::from(entry.value))
                    .map(TheoreticalArrivalTime::from_scaled)
                    .ok_or(GcraError::StateOutOfRange)?,
            ),
            None => None,
        };
        let outcome = gcra::evaluate(&parameters, tat, now, 1)?;
        match outcome {
            GcraOutcome::Allowed { tat, replenish_after_millis, .. } => {
                let expires_at = now.checked_add(replenish_after_millis).ok_or(GcraError::StateOutOfRange)?;
                let deficit = (u128::from(expires_at) * quota)
                    .checked_sub(tat.scaled())
                    .and_then(|deficit| u64::try_from(deficit).ok())
                    .ok_or(GcraError::StateOutOfRange)?;
                let allowance = outcome.allowance(&parameters).ok_or(GcraError::StateOutOfRange)?;
                Ok(Verdict::Allowed { allowance, next: Entry { expires_at, value: deficit } })
            }
            GcraOutcome::Denied { .. } => {
                outcome.quota_denial(&parameters).map(Verdict::Exhausted).ok_or(GcraError::StateOutOfRange)
            }
        }
    }
}

fn narrow_check(failure: CheckFailure<GcraError>) -> GcraCheckError {
    match failure {
        CheckFailure::Poisoned(source) => source.into(),
        CheckFailure::Evaluation(source) => GcraCheckError::Evaluation { source },
    }
}

fn narrow_batch(failure: Failure<GcraError>) -> GcraBatchError {
    match failure.into_storage() {
        Ok(source) => source.into(),
        Err((index, source)) => GcraBatchError::Evaluation { index, source },
    }
}

/// A sharded, hard-bounded, process-local store of GCRA quotas: `quota` units replenish
/// continuously over each `period`, and a rested subject may spend up to `burst_capacity`
/// units at once, with no fixed-window boundary bursts.
///
/// Decisions come from the exact scaled-integer evaluator shared with PostgreSQL,
/// [`runlimit_core::gcra`]: no floats, durations rounded up to whole milliseconds, unit counts
/// rounded down.
///
/// | outcome | values |
/// |---|---|
/// | allowed | [`Allowance`](runlimit_core::Allowance) with `capacity` = burst capacity, `available` = units spendable immediately, `replenishes_after` = time until fully rested |
/// | quota exceeded | [`QuotaDenial`](runlimit_core::QuotaDenial) with `capacity` = burst capacity, `retry_after` = earliest time the check fits; nothing consumed |
/// | shadow policy exhausted | the same denial, shadow-denied; nothing consumed |
/// | new key, shard full | [`Denial::StorageCapacity`](runlimit_core::Denial::StorageCapacity) in every quota mode |
///
/// Each key uses constant-size state and becomes eligible for bounded cleanup once its full
/// burst capacity has replenished. Storage bounds, cleanup, poisoning and observers work as
/// for [`MemoryStore`](crate::MemoryStore); see the [crate documentation](crate).
///
/// # Examples
///
/// The `V1` vector of the GCRA notes: 10 units per second, burst 20.
///
/// ```
/// use std::time::Duration;
/// use runlimit_core::{Check, DecisionView, GcraPolicy, KeyHasher, PolicyId, ScopeId};
/// use runlimit_memory::{GcraStore, ManualClock, MemoryStoreConfig};
///
/// let policy = GcraPolicy::new(
///     PolicyId::new("api.read")?, ScopeId::new("client")?, 10, Duration::from_secs(1), 20)?;
/// let hasher = KeyHasher::new(&[7; 32])?;
/// let clock = ManualClock::new();
/// let store = GcraStore::builder(MemoryStoreConfig::new(1_000)?).with_clock(clock.clone()).build();
/// let check = Check::new(hasher.hash_for(&policy, b"client-network:192.0.2.4"));
///
/// for _ in 0..20 {
///     assert!(store.check(&check)?.permits_request());
/// }
/// assert!(!store.check(&check)?.permits_request());
/// clock.advance(Duration::from_millis(100));
/// let decision = store.check(&check)?;
/// let DecisionView::Allowed { allowance } = decision.view() else { panic!("{decision:?}") };
/// assert_eq!(allowance.available(), 0);
/// assert_eq!(allowance.replenishes_after().duration(), Duration::from_secs(2));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct GcraStore<C = SystemClock, O = ()> {
    inner: Store<Gcra, C, O>,
}

/// Builds a [`GcraStore`] with a chosen [`Clock`] and [`Observer`]; from
/// [`GcraStore::builder`].
#[must_use = "a builder does nothing until `build` is called"]
pub struct GcraStoreBuilder<C = SystemClock, O = ()> {
    parts: Parts<C, O>,
}

impl GcraStore {
    /// A GCRA store on the [`SystemClock`] with no observer.
    #[must_use]
    pub fn new(config: MemoryStoreConfig) -> Self {
        Self::builder(config).build()
    }

    /// Starts a builder on the [`SystemClock`] with no observer. The clock is fixed once the
    /// store is built: stored arrival times are offsets of that clock.
    pub fn builder(config: MemoryStoreConfig) -> GcraStoreBuilder {
        GcraStoreBuilder { parts: Parts { config, clock: SystemClock::new(), observer: None } }
    }
}

impl<C: Clock, O: Observer> GcraStoreBuilder<C, O> {
    /// Uses `clock` instead of the [`SystemClock`].
    pub fn with_clock<C2: Clock>(self, clock: C2) -> GcraStoreBuilder<C2, O> {
        GcraStoreBuilder { parts: self.parts.with_clock(clock) }
    }

    /// Attaches an observer, called after shard locks are released; its panics are caught.
    pub fn with_observer<O2: Observer>(self, observer: O2) -> GcraStoreBuilder<C, O2> {
        GcraStoreBuilder { parts: self.parts.with_observer(observer) }
    }

    /// Builds the store with empty shards.
    #[must_use]
    pub fn build(self) -> GcraStore<C, O> {
        GcraStore { inner: Store::new(self.parts) }
    }
}

impl<C: Clock, O: Observer> GcraStore<C, O> {
    /// Evaluates one unit-cost check, storing the new arrival time when allowed.
    ///
    /// Cleanup and storage capacity work as for [`MemoryStore::check`](crate::MemoryStore::check).
    ///
    /// # Errors
    ///
    /// - [`GcraCheckError::PoisonedShard`] when the key's shard is poisoned.
    /// - [`GcraCheckError::Evaluation`] when the evaluator cannot represent the result (clock
    ///   readings beyond hundreds of millions of years).
    ///
    /// Nothing was consumed in either case.
    pub fn check(&self, check: &Check<'_, GcraPolicy>) -> Result<Decision, GcraCheckError> {
        self.inner.check(check).map_err(narrow_check)
    }

    /// Evaluates an atomic batch, all or nothing, in input order; see
    /// [`MemoryStore::check_all`](crate::MemoryStore::check_all) for the rules.
    ///
    /// # Errors
    ///
    /// - [`GcraBatchError::Store`] wrapping a [`MemoryBatchError`](crate::MemoryBatchError):
    ///   an invalid batch, a batch exceeding a shard's capacity, or a poisoned shard.
    /// - [`GcraBatchError::Evaluation`] naming the check the evaluator could not decide.
    ///
    /// Nothing was consumed in any error case.
    pub fn check_all(&self, checks: &[Check<'_, GcraPolicy>]) -> Result<BatchDecision, GcraBatchError> {
        self.inner.check_all(checks).map_err(narrow_batch)
    }

    /// Empties every poisoned shard, clears its poison flag and returns the number recovered;
    /// healthy shards keep their arrival times. Recovered subjects become fully rested, so
    /// this can admit requests their lost state would have denied.
    pub fn recover_poisoned(&self) -> usize {
        self.inner.recover_poisoned()
    }

    /// Per-shard entries, capacities and poison flags.
    #[must_use]
    pub fn stats(&self) -> MemoryStoreStats {
        self.inner.stats()
    }

    /// The configuration the store was built with.
    #[must_use]
    pub fn config(&self) -> &MemoryStoreConfig {
        self.inner.config()
    }

    #[cfg(test)]
    pub(crate) fn engine(&self) -> &crate::engine::Engine {
        self.inner.engine()
    }
}

impl<C, O> fmt::Debug for GcraStore<C, O> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GcraStore").finish_non_exhaustive()
    }
}

impl<C, O> fmt::Debug for GcraStoreBuilder<C, O> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GcraStoreBuilder").field("config", &self.parts.config).finish_non_exhaustive()
    }
}

/// The async face of [`GcraStore`]; evaluation is synchronous and never waits.
///
/// # Cancel safety
///
/// Nothing happens until the returned future is first polled; dropping it unpolled consumes
/// no quota.
impl<C: Clock, O: Observer> Limiter for GcraStore<C, O> {
    type Policy = GcraPolicy;
    type CheckError = GcraCheckError;
    type CheckAllError = GcraBatchError;

    async fn check(&self, check: &Check<'_, GcraPolicy>) -> Result<Decision, GcraCheckError> {
        self.inner.check(check).map_err(narrow_check)
    }

    async fn check_all(&self, checks: &[Check<'_, GcraPolicy>]) -> Result<BatchDecision, GcraBatchError> {
        self.inner.check_all(checks).map_err(narrow_batch)
    }
}
