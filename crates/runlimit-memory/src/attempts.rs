//! [`MemoryAttemptLimiter`]: at most one active attempt per subject, with exponential backoff
//! after failures, in process memory.
//!
//! # State per subject
//!
//! An entry holds the subject's [`AttemptState`] (consecutive failures, the latest failure
//! and at most one lease deadline) and its lease's token. Every instant is a whole millisecond
//! of the limiter's clock. Every transition is the state machine of
//! [`runlimit_core::backend::attempts`], shared with PostgreSQL:
//!
//! - a lease whose deadline has passed is converted into a failure *at its deadline* the next
//!   time the entry is touched (lazily, under the shard lock), so dropping a receipt is no
//!   refund and the backoff it causes is measured from the deadline, not from whenever the
//!   subject is next seen;
//! - the entry expires, and its slot can be reclaimed, at `base + quiet_period`, where `base` is
//!   the lease deadline while a lease exists and the latest failure otherwise, so quiet expiry
//!   never erases an active lease;
//! - a success removes the entry (retry state reset, slot freed).
//!
//! # Bounds
//!
//! Capacity comes from [`MemoryStoreConfig`]: `max_keys` split over `shard_count` shards
//! exactly as for the other memory stores. Each admission first removes at most
//! `expired_removals_per_check` expired entries from its shard, oldest first, using an exact
//! expiry index (a `BTreeSet`, updated on every change, because an early failure can move an
//! entry's expiry *earlier*, which the lazy lower-bound heap of the quota stores cannot
//! represent). A new subject that finds its shard full is denied with
//! [`AttemptDenial::StorageCapacity`]; live failure state and leases are never evicted.

use std::{
    collections::{BTreeSet, HashMap},
    fmt,
    sync::{
        Mutex, MutexGuard,
        atomic::{AtomicU64, Ordering},
    },
    time::Instant,
};

use runlimit_core::{
    AttemptSubject, CounterKey, Delay,
    attempts::{
        AttemptCompletionResult, AttemptDecision, AttemptDenial, AttemptEvent, AttemptObservation,
        AttemptObserver, AttemptOperation, AttemptOutcome, AttemptPolicy, AttemptReceipt,
    },
    backend::{
        attempts::{
            self as rule, AttemptReset, AttemptState, Completion, LeaseToken, issue, receipt_key,
            receipt_token,
        },
        is_expired, notify_attempt,
    },
};

use crate::{
    clock::{self, Clock, SystemClock},
    config::MemoryStoreConfig,
    error::PoisonedShardError,
};

/// Receipt tokens come from one process-wide counter, so a receipt is never accepted by a
/// different limiter (or by the same subject after its entry was removed and recreated).
static NEXT_TOKEN: AtomicU64 = AtomicU64::new(1);

fn next_token() -> u64 {
    NEXT_TOKEN.fetch_add(1, Ordering::Relaxed)
}

/// A subject's stored state: the rule's [`AttemptState`] and the token of its lease, if any.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct AttemptEntry {
    state: AttemptState,
    /// The token of the lease `state` holds; `None` without a lease.
    token: Option<u64>,
}

impl AttemptEntry {
    /// The entry after [`AttemptState::settled`]: an expired lease and its token are gone.
    fn settled(self, now: u64) -> Self {
        let state = self.state.settled(now);
        Self { state, token: self.token.filter(|_| state.lease_deadline_ms.is_some()) }
    }
}

struct AttemptShard {
    entries: HashMap<CounterKey, AttemptEntry>,
    expiry: BTreeSet<(u64, CounterKey)>,
    capacity: usize,
    watermark: u64,
}

impl AttemptShard {
    fn new(capacity: usize) -> Self {
        Self { entries: HashMap::new(), expiry: BTreeSet::new(), capacity, watermark: 0 }
    }

    /// The later of `reading` and every reading this shard has used.
    fn clamp(&mut self, reading: u64) -> u64 {
        self.watermark = self.watermark.max(reading);
        self.watermark
    }

    fn remove_expired(&mut self, now: u64, budget: usize) -> usize {
        let mut removed = 0;
        while removed < budget {
            let Some(&(at, key)) = self.expiry.first() else { break };
            if !is_expired(at, now) {
                break;
            }
            self.expiry.pop_first();
            self.entries.remove(&key);
            removed += 1;
        }
        removed
    }

    /// Stores `entry` under `key`, moving its expiry index element from `old_expiry`.
    fn store(
        &mut self,
        key: CounterKey,
        old_expiry: Option<u64>,
        entry: AttemptEntry,
        policy: &AttemptPolicy,
    ) {
        if let Some(old) = old_expiry {
            self.expiry.remove(&(old, key));
        }
        self.expiry.insert((entry.state.expires_at_ms(policy), key));
        self.entries.insert(key, entry);
    }

    fn remove(&mut self, key: CounterKey, old_expiry: u64) {
        self.expiry.remove(&(old_expiry, key));
        self.entries.remove(&key);
    }
}

/// The opaque, consuming receipt of an admitted attempt, from
/// [`MemoryAttemptLimiter::acquire`]: an [`AttemptReceipt`] holding a [`MemoryLeaseToken`].
///
/// Complete it with [`MemoryAttemptLimiter::complete`], which consumes it. It is neither `Clone`
/// nor `Copy`. Dropping it is no refund: the lease expires as a failure evaluated at the lease
/// deadline. `Debug` shows the policy identifier only, never the subject key or the
/// reservation token.
pub type MemoryAttemptReceipt = AttemptReceipt<MemoryLeaseToken>;

/// The lease token of a [`MemoryAttemptReceipt`]: a number drawn from one process-wide counter,
/// so a receipt is never accepted by another limiter, nor by the same subject after its entry
/// was removed and recreated. Opaque: nothing outside this crate can make one, and it is not
/// `Clone`, so no receipt can be issued around the limiter (naming another policy, say):
///
/// ```compile_fail
/// let token = runlimit_memory::MemoryLeaseToken(1); // private field
/// ```
///
/// ```compile_fail
/// fn copy(receipt: &runlimit_memory::MemoryAttemptReceipt) -> runlimit_memory::MemoryLeaseToken {
///     runlimit_core::backend::attempts::receipt_token(receipt).clone() // not `Clone`
/// }
/// ```
pub struct MemoryLeaseToken(u64);

impl LeaseToken for MemoryLeaseToken {
    const RECEIPT_NAME: &'static str = "MemoryAttemptReceipt";
}

impl fmt::Debug for MemoryLeaseToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryLeaseToken").finish_non_exhaustive()
    }
}

/// A hard-bounded, process-local attempt limiter for
/// [`AttemptPolicy`](runlimit_core::attempts::AttemptPolicy).
///
/// At most one active attempt per policy-bound subject
/// ([`KeyHasher::hash_attempt_for`](runlimit_core::KeyHasher::hash_attempt_for)).
/// [`acquire`](Self::acquire) admits an attempt and returns a consuming
/// [`MemoryAttemptReceipt`] holding a lease of the policy's `lease` length;
/// [`complete`](Self::complete) records its [`AttemptOutcome`]:
///
/// - a failure or abandonment increments the consecutive failure count (saturating at
///   `u32::MAX`) and denies admissions for
///   [`AttemptPolicy::retry_delay`](runlimit_core::attempts::AttemptPolicy::retry_delay) from the
///   completion instant (initial delay, doubled per failure, saturating at the cap);
/// - a success resets the subject;
/// - a receipt whose lease has expired, or that does not hold the subject's current reservation,
///   is [`Stale`](AttemptCompletionResult::Stale): nothing is recorded, so a late success never
///   resets a newer reservation. The expired lease itself counted as a failure at its deadline;
/// - failure state without a lease is forgotten `quiet_period` after the latest failure.
///
/// The clock is read once per operation, truncated to whole milliseconds; each shard clamps
/// backwards readings to the latest one it used, so a clock stepping back never shortens a
/// delay. Storage is bounded as described for the other memory stores (see
/// [`MemoryStoreConfig`]); `maximum_batch_size` is unused.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use runlimit_core::{KeyHasher, PolicyId, ScopeId, attempts::*};
/// use runlimit_memory::{ManualClock, MemoryAttemptLimiter, MemoryStoreConfig};
///
/// let policy = AttemptPolicy::new(
///     PolicyId::new("auth.password")?,
///     ScopeId::new("identity")?,
///     Duration::from_secs(1),
///     Duration::from_secs(60),
///     Duration::from_secs(3_600),
///     Duration::from_secs(30),
/// )?;
/// let hasher = KeyHasher::new(&[7; 32])?;
/// let subject = hasher.hash_attempt_for(&policy, b"user@example.test");
/// let clock = ManualClock::new();
/// let limiter =
///     MemoryAttemptLimiter::builder(MemoryStoreConfig::new(1_000)?).with_clock(clock.clone()).build();
///
/// let AttemptDecision::Admitted(receipt) = limiter.acquire(&subject)? else { panic!() };
/// // A second attempt while the first is active is denied.
/// assert!(matches!(limiter.acquire(&subject)?, AttemptDecision::Denied(AttemptDenial::InProgress { .. })));
/// // Wrong password: one failure, one second of backoff.
/// assert_eq!(
///     limiter.complete(receipt, AttemptOutcome::Failure)?,
///     AttemptCompletionResult::FailureRecorded {
///         consecutive_failures: 1,
///         retry_after: runlimit_core::Delay::from_millis(1_000),
///     },
/// );
/// let AttemptDecision::Denied(denial) = limiter.acquire(&subject)? else { panic!() };
/// assert_eq!(denial.retry_after().map(|delay| delay.millis()), Some(1_000));
/// clock.advance(Duration::from_secs(1));
/// let AttemptDecision::Admitted(receipt) = limiter.acquire(&subject)? else { panic!() };
/// assert_eq!(limiter.complete(receipt, AttemptOutcome::Success)?, AttemptCompletionResult::Reset);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct MemoryAttemptLimiter<C = SystemClock, O = ()> {
    config: MemoryStoreConfig,
    shards: Box<[Mutex<AttemptShard>]>,
    clock: C,
    observer: Option<O>,
}

/// Builds a [`MemoryAttemptLimiter`] with a chosen [`Clock`] and [`AttemptObserver`]; from
/// [`MemoryAttemptLimiter::builder`].
#[must_use = "a builder does nothing until `build` is called"]
pub struct MemoryAttemptLimiterBuilder<C = SystemClock, O = ()> {
    config: MemoryStoreConfig,
    clock: C,
    observer: Option<O>,
}

impl MemoryAttemptLimiter {
    /// A limiter on the [`SystemClock`] with no observer.
    #[must_use]
    pub fn new(config: MemoryStoreConfig) -> Self {
        Self::builder(config).build()
    }

    /// Starts a builder on the [`SystemClock`] with no observer. Choose the clock here: a built
    /// limiter cannot replace it, because its stored instants belong to that clock.
    pub fn builder(config: MemoryStoreConfig) -> MemoryAttemptLimiterBuilder {
        MemoryAttemptLimiterBuilder { config, clock: SystemClock::new(), observer: None }
    }
}

impl<C: Clock, O: AttemptObserver> MemoryAttemptLimiterBuilder<C, O> {
    /// Uses `clock` instead of the [`SystemClock`], such as a
    /// [`ManualClock`](crate::ManualClock) in tests.
    pub fn with_clock<C2: Clock>(self, clock: C2) -> MemoryAttemptLimiterBuilder<C2, O> {
        MemoryAttemptLimiterBuilder { config: self.config, clock, observer: self.observer }
    }

    /// Reports every admission and completion to `observer`, synchronously, after the shard
    /// lock is released. Observer panics are caught.
    pub fn with_observer<O2: AttemptObserver>(self, observer: O2) -> MemoryAttemptLimiterBuilder<C, O2> {
        MemoryAttemptLimiterBuilder { config: self.config, clock: self.clock, observer: Some(observer) }
    }

    /// Builds the limiter; shards start empty.
    #[must_use]
    pub fn build(self) -> MemoryAttemptLimiter<C, O> {
        let shards = (0..self.config.shard_count())
            .map(|index| Mutex::new(AttemptShard::new(self.config.shard_capacity(index).unwrap_or(0))))
            .collect();
        MemoryAttemptLimiter { config: self.config, shards, clock: self.clock, observer: self.observer }
    }
}

/// Subject-key bytes 8..16 mapped onto `0..shard_count` by multiply-high, as the quota stores
/// do (the key is a uniform HMAC output, see the crate's key layout notes).
fn shard_of(key: &CounterKey, shard_count: usize) -> usize {
    let subject = key.subject();
    let mut word = [0u8; 8];
    if let Some(bytes) = subject.as_bytes().get(8..16) {
        word.copy_from_slice(bytes);
    }
    let count = u128::try_from(shard_count).unwrap_or(u128::MAX);
    usize::try_from((u128::from(u64::from_le_bytes(word)) * count) >> 64).unwrap_or(0)
}

impl<C: Clock, O: AttemptObserver> MemoryAttemptLimiter<C, O> {
    /// The configuration.
    #[must_use]
    pub fn config(&self) -> &MemoryStoreConfig {
        &self.config
    }

    fn lock(&self, index: usize) -> Result<MutexGuard<'_, AttemptShard>, PoisonedShardError> {
        self.shards
            .get(index)
            .and_then(|shard| shard.lock().ok())
            .ok_or(PoisonedShardError { shard_index: index })
    }

    fn observe(
        &self,
        policy: &AttemptPolicy,
        operation: AttemptOperation,
        event: AttemptEvent,
        start: Instant,
    ) {
        if let Some(observer) = &self.observer {
            let observation = AttemptObservation::new(policy, operation, event, start.elapsed());
            notify_attempt(observer, &observation);
        }
    }

    /// Admits an attempt for `subject` or says why not.
    ///
    /// Admitted: the subject has no active lease and no pending backoff; the returned receipt
    /// holds a lease until `now + lease`. Denied with [`AttemptDenial::InProgress`] (time to the
    /// active lease's deadline), [`AttemptDenial::Backoff`] (time to `latest failure +
    /// retry_delay(failures)`) or, for a subject without state in a full shard,
    /// [`AttemptDenial::StorageCapacity`] (time to the shard's earliest expiry). Delays are
    /// whole milliseconds of the limiter's clock.
    ///
    /// # Errors
    ///
    /// [`PoisonedShardError`] when the subject's shard is poisoned; nothing was admitted.
    pub fn acquire(
        &self,
        subject: &AttemptSubject<'_>,
    ) -> Result<AttemptDecision<MemoryAttemptReceipt>, PoisonedShardError> {
        let start = Instant::now();
        let policy = subject.policy();
        let result = self.acquire_locked(subject);
        let event = match &result {
            Ok(AttemptDecision::Admitted(_)) => AttemptEvent::Admitted,
            Ok(AttemptDecision::Denied(denial)) => AttemptEvent::Denied(denial.reason()),
            Err(_) => AttemptEvent::Failed,
        };
        self.observe(policy, AttemptOperation::Admission, event, start);
        result
    }

    fn acquire_locked(
        &self,
        subject: &AttemptSubject<'_>,
    ) -> Result<AttemptDecision<MemoryAttemptReceipt>, PoisonedShardError> {
        let policy = subject.policy();
        let key = subject.counter_key();
        let reading = clock::millis(&self.clock);
        let mut shard = self.lock(shard_of(&key, self.shards.len()))?;
        let now = shard.clamp(reading);
        shard.remove_expired(now, self.config.expired_removals_per_check());
        let existing = shard.entries.get(&key).copied();
        if existing.is_none() && shard.entries.len() >= shard.capacity {
            // A new subject and a full shard: live state is never evicted to make room.
            let retry_after = shard
                .expiry
                .first()
                .filter(|(at, _)| *at != u64::MAX)
                .map(|(at, _)| Delay::from_millis(at.saturating_sub(now)));
            return Ok(AttemptDecision::Denied(AttemptDenial::StorageCapacity { retry_after }));
        }
        let old_expiry = existing.map(|old| old.state.expires_at_ms(policy));
        match rule::admit(policy, existing.map(|entry| entry.state), now) {
            Err(denial) => {
                // Persist a settled lease so the index matches the entry (the rule says both are
                // the same state).
                if let Some(old) = existing
                    && old.settled(now) != old
                {
                    shard.store(key, old_expiry, old.settled(now), policy);
                }
                Ok(AttemptDecision::Denied(denial))
            }
            Ok(state) => {
                let token = next_token();
                shard.store(key, old_expiry, AttemptEntry { state, token: Some(token) }, policy);
                Ok(AttemptDecision::Admitted(issue(policy.clone(), key, MemoryLeaseToken(token))))
            }
        }
    }

    /// Records the outcome of an admitted attempt, consuming its receipt.
    ///
    /// Returns [`AttemptCompletionResult::Reset`] for a success,
    /// [`AttemptCompletionResult::FailureRecorded`] for a failure or abandonment (the new count
    /// and the full retry delay from now), or [`AttemptCompletionResult::Stale`] when the
    /// receipt's lease had already expired at completion time (it counted as a failure at its
    /// deadline) or the receipt does not hold the subject's reservation. A receipt is completed
    /// on the limiter that issued it; any other limiter answers `Stale`.
    ///
    /// # Errors
    ///
    /// [`PoisonedShardError`] when the subject's shard is poisoned; nothing was recorded and
    /// the lease will expire as a failure at its deadline.
    pub fn complete(
        &self,
        receipt: MemoryAttemptReceipt,
        outcome: AttemptOutcome,
    ) -> Result<AttemptCompletionResult, PoisonedShardError> {
        let start = Instant::now();
        let result = self.complete_locked(&receipt, outcome);
        let event = match &result {
            Ok(AttemptCompletionResult::Stale) => AttemptEvent::Stale,
            Ok(_) => AttemptEvent::Completed(outcome),
            Err(_) => AttemptEvent::Failed,
        };
        self.observe(receipt.policy(), AttemptOperation::Completion(outcome), event, start);
        result
    }

    fn complete_locked(
        &self,
        receipt: &MemoryAttemptReceipt,
        outcome: AttemptOutcome,
    ) -> Result<AttemptCompletionResult, PoisonedShardError> {
        let key = *receipt_key(receipt);
        let policy = receipt.policy();
        let reading = clock::millis(&self.clock);
        let mut shard = self.lock(shard_of(&key, self.shards.len()))?;
        let now = shard.clamp(reading);
        let existing = shard.entries.get(&key).copied();
        let holds = existing.is_some_and(|entry| entry.token == Some(receipt_token(receipt).0));
        let old_expiry = existing.map(|old| old.state.expires_at_ms(policy));
        let completion = rule::complete(policy, existing.map(|entry| entry.state), holds, outcome, now);
        match completion {
            Completion::Remove => shard.remove(key, old_expiry.unwrap_or(u64::MAX)),
            Completion::Store { state, .. } => {
                shard.store(key, old_expiry, AttemptEntry { state, token: None }, policy);
            }
            Completion::Stale { .. } => {
                if let Some(old) = existing
                    && old.settled(now) != old
                {
                    shard.store(key, old_expiry, old.settled(now), policy);
                }
            }
        }
        Ok(completion.result())
    }

    /// An operator's reset of `subject`'s failure state (a support desk unlocking a user):
    /// its failures and backoff are forgotten, so its next admission behaves as for a subject
    /// that never failed. Returns whether it held live state (failures within the quiet
    /// period, or a live lease).
    ///
    /// A reset never cancels a live lease: the attempt in flight keeps its reservation, a
    /// concurrent `acquire` is still denied [`InProgress`](AttemptDenial::InProgress), and the
    /// outstanding receipt completes normally (a success removes the state; a failure counts
    /// as the first after the reset). Without a live lease the subject's entry is removed and
    /// its slot freed. Reported to the observer as [`AttemptOperation::Reset`] with
    /// [`AttemptEvent::Reset`]. See `runlimit_core::backend::attempts::reset` for the rule.
    ///
    /// # Errors
    ///
    /// [`PoisonedShardError`] when the subject's shard is poisoned; nothing was changed.
    pub fn reset(&self, subject: &AttemptSubject<'_>) -> Result<bool, PoisonedShardError> {
        let start = Instant::now();
        let result = self.reset_locked(subject);
        let event = match result {
            Ok(had_live_state) => AttemptEvent::Reset { had_live_state },
            Err(_) => AttemptEvent::Failed,
        };
        self.observe(subject.policy(), AttemptOperation::Reset, event, start);
        result
    }

    fn reset_locked(&self, subject: &AttemptSubject<'_>) -> Result<bool, PoisonedShardError> {
        let policy = subject.policy();
        let key = subject.counter_key();
        let reading = clock::millis(&self.clock);
        let mut shard = self.lock(shard_of(&key, self.shards.len()))?;
        let now = shard.clamp(reading);
        let Some(existing) = shard.entries.get(&key).copied() else { return Ok(false) };
        let old_expiry = existing.state.expires_at_ms(policy);
        let plan = rule::reset(policy, Some(existing.state), now);
        match plan {
            AttemptReset::NothingLive | AttemptReset::Remove => shard.remove(key, old_expiry),
            AttemptReset::KeepLease { state } => {
                // The lease is live, so the settled entry still holds its token.
                let token = existing.settled(now).token;
                shard.store(key, Some(old_expiry), AttemptEntry { state, token }, policy);
            }
        }
        Ok(plan.had_live_state())
    }

    /// Stored subjects, live or expired-but-not-yet-removed, summed over shards (poisoned
    /// shards count as empty).
    #[must_use]
    pub fn len(&self) -> usize {
        self.shards.iter().filter_map(|shard| shard.lock().ok()).map(|shard| shard.entries.len()).sum()
    }

    /// Whether no subject is stored.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Empties poisoned shards and clears their poison flags, returning how many were
    /// recovered. Forgetting their failure state can admit attempts the lost state would have
    /// denied; keep healthy shards untouched.
    pub fn recover_poisoned(&self) -> usize {
        let mut recovered = 0;
        for shard in &*self.shards {
            if shard.is_poisoned() {
                let mut guard = shard.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                *guard = AttemptShard { watermark: guard.watermark, ..AttemptShard::new(guard.capacity) };
                shard.clear_poison();
                recovered += 1;
            }
        }
        recovered
    }
}

impl<C, O> fmt::Debug for MemoryAttemptLimiter<C, O> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryAttemptLimiter").field("config", &self.config).finish_non_exhaustive()
    }
}

impl<C, O> fmt::Debug for MemoryAttemptLimiterBuilder<C, O> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryAttemptLimiterBuilder").field("config", &self.config).finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use runlimit_core::{KeyHasher, PolicyId, ScopeId};

    use super::*;
    use crate::ManualClock;

    #[test]
    fn failure_count_saturates_at_u32_max_and_delay_at_cap() {
        let policy = AttemptPolicy::new(
            PolicyId::new("p").unwrap(),
            ScopeId::new("s").unwrap(),
            Duration::from_millis(100),
            Duration::from_millis(1_000),
            Duration::from_millis(5_000),
            Duration::from_millis(50),
        )
        .unwrap();
        let hasher = KeyHasher::new(&[3; 32]).unwrap();
        let subject = hasher.hash_attempt_for(&policy, b"s");
        let clock = ManualClock::new();
        let limiter = MemoryAttemptLimiter::builder(MemoryStoreConfig::new(4).unwrap())
            .with_clock(clock.clone())
            .build();
        let AttemptDecision::Admitted(receipt) = limiter.acquire(&subject).unwrap() else { panic!() };
        // Seed the entry one failure short of saturation.
        {
            let mut shard = limiter.lock(shard_of(&subject.counter_key(), 1)).unwrap();
            let entry = shard.entries.get_mut(&subject.counter_key()).unwrap();
            entry.state.consecutive_failures = u32::MAX - 1;
        }
        assert_eq!(
            limiter.complete(receipt, AttemptOutcome::Failure).unwrap(),
            AttemptCompletionResult::FailureRecorded {
                consecutive_failures: u32::MAX,
                retry_after: Delay::from_millis(1_000)
            }
        );
        clock.advance_millis(1_000);
        let AttemptDecision::Admitted(receipt) = limiter.acquire(&subject).unwrap() else { panic!() };
        assert_eq!(
            limiter.complete(receipt, AttemptOutcome::Abandoned).unwrap(),
            AttemptCompletionResult::FailureRecorded {
                consecutive_failures: u32::MAX,
                retry_after: Delay::from_millis(1_000)
            }
        );
        assert_eq!(
            limiter.acquire(&subject).unwrap().denial(),
            Some(AttemptDenial::Backoff {
                retry_after: Delay::from_millis(1_000),
                consecutive_failures: u32::MAX
            })
        );
    }

    trait DenialOf {
        fn denial(self) -> Option<AttemptDenial>;
    }
    impl DenialOf for AttemptDecision<MemoryAttemptReceipt> {
        fn denial(self) -> Option<AttemptDenial> {
            match self {
                Self::Denied(denial) => Some(denial),
                Self::Admitted(_) => None,
            }
        }
    }
}
