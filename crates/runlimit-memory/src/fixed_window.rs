//! [`MemoryStore`]: anchored fixed windows in process memory.

use std::{convert::Infallible, fmt};

use runlimit_core::{
    Allowance, BatchDecision, Check, Decision, Delay, FixedWindowPolicy, Limiter, Observer, QuotaDenial,
};

use crate::{
    clock::{Clock, SystemClock},
    config::MemoryStoreConfig,
    engine::{Algorithm, Verdict},
    error::{CheckFailure, Failure, MemoryBatchError, PoisonedShardError},
    shard::Entry,
    stats::MemoryStoreStats,
    store::{Parts, Store},
};

/// Anchored fixed windows: an entry is `(window deadline, checks used)`.
pub(crate) enum FixedWindow {}

fn allowed(limit: runlimit_core::Capacity, available: u64, replenishes_after: Delay, next: Entry) -> Verdict {
    match Allowance::new(limit, available, replenishes_after) {
        Ok(allowance) => Verdict::Allowed { allowance, next },
        // Unreachable: `available` is `limit - used` with `used >= 1`. Fail closed.
        Err(_) => Verdict::Exhausted(QuotaDenial::new(limit, replenishes_after)),
    }
}

impl Algorithm for FixedWindow {
    type Policy = FixedWindowPolicy;
    type Error = Infallible;

    fn evaluate(policy: &FixedWindowPolicy, live: Option<Entry>, now: u64) -> Result<Verdict, Infallible> {
        let limit = policy.limit();
        Ok(match live {
            // Inside the anchored window: `deadline > now` (or the never-expiring u64::MAX).
            Some(Entry { expires_at: deadline, value: used }) => {
                let rest_of_window = Delay::from_millis(deadline.saturating_sub(now));
                if used < limit.get() {
                    let used = used + 1;
                    allowed(
                        limit,
                        limit.get() - used,
                        rest_of_window,
                        Entry { expires_at: deadline, value: used },
                    )
                } else {
                    Verdict::Exhausted(QuotaDenial::new(limit, rest_of_window))
                }
            }
            // No window, or the previous one ended at or before `now`: this allowed check
            // anchors a new window at `now`. Denied checks never get here (limit >= 1).
            None => {
                let deadline = now.saturating_add(policy.window().as_millis());
                let window = Delay::from_millis(deadline - now);
                allowed(limit, limit.get() - 1, window, Entry { expires_at: deadline, value: 1 })
            }
        })
    }
}

fn narrow_check(failure: CheckFailure<Infallible>) -> PoisonedShardError {
    match failure {
        CheckFailure::Poisoned(error) => error,
        CheckFailure::Evaluation(never) => match never {},
    }
}

fn narrow_batch(failure: Failure<Infallible>) -> MemoryBatchError {
    match failure.into_storage() {
        Ok(error) => error,
        Err((_, never)) => match never {},
    }
}

/// A sharded, hard-bounded, process-local store of anchored fixed windows.
///
/// Each [`FixedWindowPolicy`] subject gets a window that starts at its first allowed check and
/// lasts the policy's window; at most `limit` checks are allowed in it. Windows are not
/// aligned to wall-clock boundaries. At the deadline (not a millisecond before) the window is
/// over, and the next allowed check anchors a new one at its own time.
///
/// | outcome | values |
/// |---|---|
/// | allowed | [`Allowance`] with `capacity` = limit, `available` = limit − used (after this check), `replenishes_after` = deadline − now |
/// | quota exceeded | [`QuotaDenial`] with `capacity` = limit, `retry_after` = deadline − now; nothing consumed |
/// | shadow policy exhausted | the same [`QuotaDenial`], shadow-denied; nothing consumed |
/// | new key, shard full | [`Denial::StorageCapacity`](runlimit_core::Denial::StorageCapacity) in every quota mode |
///
/// All times are whole milliseconds of the store's [`Clock`], read once per operation, so
/// durations are exact at evaluation time. The policy fingerprint is part of the key, so
/// changing a policy's identifier, scope, limit or window starts independent counters, while
/// switching its [`QuotaMode`](runlimit_core::QuotaMode) keeps them.
///
/// See the [crate documentation](crate) for the storage bounds, cleanup, poisoning and
/// observer rules shared with [`GcraStore`](crate::GcraStore).
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use runlimit_core::{Check, DecisionView, FixedWindowPolicy, KeyHasher, PolicyId, ScopeId};
/// use runlimit_memory::{ManualClock, MemoryStore, MemoryStoreConfig};
///
/// let policy = FixedWindowPolicy::new(
///     PolicyId::new("auth.login")?, ScopeId::new("client")?, 2, Duration::from_secs(60))?;
/// let hasher = KeyHasher::new(&[7; 32])?;
/// let clock = ManualClock::new();
/// let store = MemoryStore::builder(MemoryStoreConfig::new(1_000)?).with_clock(clock.clone()).build();
/// let check = Check::new(hasher.hash_for(&policy, b"client-network:192.0.2.4"));
///
/// store.check(&check)?; // anchors the window at 0 ms
/// clock.advance(Duration::from_millis(15_000));
/// let decision = store.check(&check)?;
/// let DecisionView::Allowed { allowance } = decision.view() else { panic!("{decision:?}") };
/// assert_eq!(allowance.available(), 0);
/// assert_eq!(allowance.replenishes_after().duration(), Duration::from_millis(45_000));
/// assert!(!store.check(&check)?.permits_request());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct MemoryStore<C = SystemClock, O = ()> {
    inner: Store<FixedWindow, C, O>,
}

/// Builds a [`MemoryStore`] with a chosen [`Clock`] and [`Observer`]; from
/// [`MemoryStore::builder`].
#[must_use = "a builder does nothing until `build` is called"]
pub struct MemoryStoreBuilder<C = SystemClock, O = ()> {
    parts: Parts<C, O>,
}

impl MemoryStore {
    /// A store on the [`SystemClock`] with no observer.
    #[must_use]
    pub fn new(config: MemoryStoreConfig) -> Self {
        Self::builder(config).build()
    }

    /// Starts a builder on the [`SystemClock`] with no observer. Choose the clock here: a
    /// built store cannot replace it, because its stored deadlines belong to that clock's
    /// coordinate system.
    ///
    /// ```compile_fail
    /// use runlimit_memory::{ManualClock, MemoryStore, MemoryStoreConfig};
    /// let store = MemoryStore::new(MemoryStoreConfig::new(10)?);
    /// let store = store.with_clock(ManualClock::new()); // no such method
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn builder(config: MemoryStoreConfig) -> MemoryStoreBuilder {
        MemoryStoreBuilder { parts: Parts { config, clock: SystemClock::new(), observer: None } }
    }
}

impl<C: Clock, O: Observer> MemoryStoreBuilder<C, O> {
    /// Uses `clock` instead of the [`SystemClock`], such as a
    /// [`ManualClock`](crate::ManualClock) in tests.
    pub fn with_clock<C2: Clock>(self, clock: C2) -> MemoryStoreBuilder<C2, O> {
        MemoryStoreBuilder { parts: self.parts.with_clock(clock) }
    }

    /// Reports every admission (and every cleanup pass that removed entries) to `observer`,
    /// synchronously, after the shard locks are released. Observer panics are caught.
    pub fn with_observer<O2: Observer>(self, observer: O2) -> MemoryStoreBuilder<C, O2> {
        MemoryStoreBuilder { parts: self.parts.with_observer(observer) }
    }

    /// Builds the store. Shards start empty and grow on demand up to their fixed capacities.
    #[must_use]
    pub fn build(self) -> MemoryStore<C, O> {
        MemoryStore { inner: Store::new(self.parts) }
    }
}

impl<C: Clock, O: Observer> MemoryStore<C, O> {
    /// Evaluates one check, consuming one unit of its window when allowed.
    ///
    /// Before evaluating, removes at most
    /// [`expired_removals_per_check`](MemoryStoreConfig::expired_removals_per_check) expired
    /// entries from the key's shard. A new key that does not fit its full shard is denied with
    /// [`Denial::StorageCapacity`](runlimit_core::Denial::StorageCapacity), whose `retry_after`
    /// is the time until the shard's earliest expiry when the store knows it.
    ///
    /// # Errors
    ///
    /// [`PoisonedShardError`] when the key's shard is poisoned. Nothing was consumed.
    pub fn check(&self, check: &Check<'_, FixedWindowPolicy>) -> Result<Decision, PoisonedShardError> {
        self.inner.check(check).map_err(narrow_check)
    }

    /// Evaluates an atomic batch: when every check is allowed, all are consumed together and
    /// the allowances are returned in input order; otherwise nothing is consumed and the
    /// decision names the first denied index.
    ///
    /// Enforced denials (quota or storage) take precedence over shadow denials: a shadow batch
    /// that is also short of storage is denied for storage, which fails closed in every mode.
    /// Each check entitles its shard to the configured expired-entry removals.
    ///
    /// # Errors
    ///
    /// - [`MemoryBatchError::InvalidBatch`]: empty, larger than
    ///   [`maximum_batch_size`](MemoryStoreConfig::maximum_batch_size), mixed quota modes or
    ///   a repeated storage key; checked before any storage work.
    /// - [`MemoryBatchError::BatchExceedsShardCapacity`]: more distinct keys in one shard than
    ///   it can ever hold; checked before any lock.
    /// - [`MemoryBatchError::PoisonedShard`]: a touched shard is poisoned.
    ///
    /// Nothing was consumed in any error case.
    pub fn check_all(
        &self,
        checks: &[Check<'_, FixedWindowPolicy>],
    ) -> Result<BatchDecision, MemoryBatchError> {
        self.inner.check_all(checks).map_err(narrow_batch)
    }

    /// Empties every poisoned shard, clears its poison flag and returns how many shards were
    /// recovered. Healthy shards keep their counters.
    ///
    /// An explicit availability tradeoff: the recovered shards forget their windows, so
    /// requests their lost state would have denied can be admitted. Keep admissions failing
    /// closed and alert operators before choosing to call this.
    pub fn recover_poisoned(&self) -> usize {
        self.inner.recover_poisoned()
    }

    /// A snapshot of each shard's entries, capacity and poison state.
    #[must_use]
    pub fn stats(&self) -> MemoryStoreStats {
        self.inner.stats()
    }

    /// The store's configuration.
    #[must_use]
    pub fn config(&self) -> &MemoryStoreConfig {
        self.inner.config()
    }

    #[cfg(test)]
    pub(crate) fn engine(&self) -> &crate::engine::Engine {
        self.inner.engine()
    }
}

impl<C, O> fmt::Debug for MemoryStore<C, O> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryStore").finish_non_exhaustive()
    }
}

impl<C, O> fmt::Debug for MemoryStoreBuilder<C, O> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryStoreBuilder").field("config", &self.parts.config).finish_non_exhaustive()
    }
}

/// The async face of [`MemoryStore`]; evaluation is synchronous and never waits.
///
/// # Cancel safety
///
/// The returned futures do nothing until first polled, and complete on that first poll.
/// Creating and dropping an unpolled future consumes no quota.
impl<C: Clock, O: Observer> Limiter for MemoryStore<C, O> {
    type Policy = FixedWindowPolicy;
    type CheckError = PoisonedShardError;
    type CheckAllError = MemoryBatchError;

    async fn check(&self, check: &Check<'_, FixedWindowPolicy>) -> Result<Decision, PoisonedShardError> {
        self.inner.check(check).map_err(narrow_check)
    }

    async fn check_all(
        &self,
        checks: &[Check<'_, FixedWindowPolicy>],
    ) -> Result<BatchDecision, MemoryBatchError> {
        self.inner.check_all(checks).map_err(narrow_batch)
    }
}
