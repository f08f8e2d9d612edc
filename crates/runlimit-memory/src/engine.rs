//! The sharded engine both stores run on, parameterized by the counting algorithm.
//!
//! Locking protocol: a single check locks its one shard. A batch is validated, grouped by
//! shard and checked against shard capacities before any lock (a batch on one shard skips the
//! grouping); then it locks every touched
//! shard in ascending shard index (so two batches can never wait on each other in a cycle),
//! evaluates every check in input order against the locked state, commits all or nothing, and
//! releases the locks. Observers run afterwards, in [`crate::store`].

use std::{
    sync::{Mutex, MutexGuard},
    time::Duration,
};

use quanta::Instant;
use smallvec::SmallVec;

use runlimit_core::{
    Allowance, BatchDecision, BatchDecisionError, Check, Decision, Delay, Denial, QuotaDenial, QuotaMode,
    RateLimitPolicy, ShardHeadroom, validate_batch,
};

use crate::{
    config::MemoryStoreConfig,
    error::{CheckFailure, Failure, PoisonedShardError},
    key::StoredKey,
    shard::{Budget, Entry, Shard},
    stats::{MemoryStoreStats, ShardStats},
};

/// A counting algorithm: how one check changes one entry.
pub(crate) trait Algorithm {
    /// The policy type it evaluates.
    type Policy: RateLimitPolicy;
    /// Why it may refuse to decide.
    type Error;

    /// Evaluates one unit-cost check at `now` (store milliseconds) against the key's live
    /// entry (`None`: no entry, or an expired one).
    fn evaluate(policy: &Self::Policy, live: Option<Entry>, now: u64) -> Result<Verdict, Self::Error>;
}

/// What an algorithm decided for one check, before storage capacity is considered.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Verdict {
    /// Allowed: store `next` if the batch commits.
    Allowed { allowance: Allowance, next: Entry },
    /// The quota is exhausted; nothing to store.
    Exhausted(QuotaDenial),
}

/// Batches up to this many checks keep their bookkeeping on the stack.
const INLINE: usize = 4;

/// One check of a batch while it is being evaluated.
struct Planned {
    key: StoredKey,
    hash: u64,
    /// Shard index while planning, then position in the locked groups.
    group: usize,
    slot: Option<u32>,
}

/// A batch's verdicts in input order, with its first exhausted quota and its first check short
/// of storage.
#[derive(Default)]
struct Verdicts {
    list: SmallVec<[Verdict; INLINE]>,
    /// The first check whose quota is exhausted.
    exhausted: Option<(usize, QuotaDenial)>,
    /// The first allowed check needing a slot its shard lacks.
    short: Option<usize>,
}

/// Which denial a batch reports, before a storage denial's retry delay is known.
enum Denied {
    Storage(usize),
    Quota(usize, QuotaDenial),
}

impl Verdicts {
    #[inline]
    fn push(&mut self, index: usize, verdict: Verdict) {
        if let Verdict::Exhausted(denial) = verdict {
            self.exhausted.get_or_insert((index, denial));
        }
        self.list.push(verdict);
    }

    /// The check at `index` was allowed but its shard has no slot left for it.
    #[inline]
    fn short_of_storage(&mut self, index: usize) {
        self.short.get_or_insert(index);
    }

    /// The denial to report: storage denials are enforced in every mode, so under enforcement
    /// the earliest denied check wins, and in shadow mode a storage denial wins over any
    /// (shadow) quota denial.
    #[inline]
    fn denial(&self, mode: QuotaMode) -> Option<Denied> {
        match (self.short, self.exhausted) {
            (Some(short), Some((index, denial))) if mode == QuotaMode::Enforce && index < short => {
                Some(Denied::Quota(index, denial))
            }
            (Some(short), _) => Some(Denied::Storage(short)),
            (None, Some((index, denial))) => Some(Denied::Quota(index, denial)),
            (None, None) => None,
        }
    }

    /// The allowed decision (every verdict allowed).
    #[inline]
    fn allowed(&self) -> Result<(BatchDecision, Option<usize>), BatchDecisionError> {
        BatchDecision::allowed_from_iter(self.list.iter().filter_map(|verdict| match *verdict {
            Verdict::Allowed { allowance, .. } => Some(allowance),
            Verdict::Exhausted(_) => None,
        }))
        .map(|decision| (decision, None))
    }
}

/// The report of a decided batch.
fn report<E>(
    decision: Result<(BatchDecision, Option<usize>), BatchDecisionError>,
    headroom: ShardHeadroom,
    cleanup: CleanupWork,
) -> Result<Report<BatchDecision>, Failure<E>> {
    match decision {
        Ok((decision, singled_out)) => {
            let consumed = singled_out.is_none();
            Ok(Report { decision, headroom, singled_out, consumed, cleanup })
        }
        // Unreachable: every index is below the batch size and an allowed batch is
        // non-empty. Fail closed as an invalid batch rather than panic.
        Err(_) => Err(Failure::Invalid(runlimit_core::BatchError::EmptyBatch)),
    }
}

/// The shard every check of `checks` lives on, if they share one.
fn one_shard<P: RateLimitPolicy>(checks: &[Check<'_, P>], shard_count: usize) -> Option<usize> {
    let (first, rest) = checks.split_first()?;
    let shard = StoredKey::of(first).shard(shard_count);
    rest.iter().all(|check| StoredKey::of(check).shard(shard_count) == shard).then_some(shard)
}

/// One locked shard of a batch.
struct Group<'a> {
    shard_index: usize,
    /// Checks of the batch on this shard.
    checks: usize,
    shard: MutexGuard<'a, Shard>,
    budget: Budget,
    /// Checks needing a new slot so far.
    new_keys: usize,
    /// Whether the shard lacks room for them.
    short: bool,
}

/// Pads a shard lock to its own cache lines so neighbouring shards do not false-share.
/// (Two cache lines: adjacent-line prefetchers pull pairs.) Hand-written because it is one
/// attribute; a crate would add a dependency for no code.
#[repr(align(128))]
struct Padded(Mutex<Shard>);

/// The outcome of one operation, with what the observer needs.
#[derive(Debug)]
pub(crate) struct Report<D> {
    pub(crate) decision: D,
    /// Headroom of the touched shard (the one with the least headroom, for a batch); only
    /// computed for batches when an observer will read it.
    pub(crate) headroom: ShardHeadroom,
    /// The input index the outcome singles out (a denied check), for batches.
    pub(crate) singled_out: Option<usize>,
    /// Whether quota was consumed.
    pub(crate) consumed: bool,
    pub(crate) cleanup: CleanupWork,
}

/// Expired-entry removal done by one operation.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct CleanupWork {
    pub(crate) removed: usize,
    pub(crate) maximum: usize,
    pub(crate) elapsed: Duration,
}

pub(crate) struct Engine {
    shards: Box<[Padded]>,
    config: MemoryStoreConfig,
    /// `max_keys / shard_count` and `max_keys % shard_count`, precomputed: shard `i` holds
    /// `base + 1` entries when `i < extra`, else `base`.
    base_capacity: usize,
    extra_capacity: usize,
}

fn lock(shards: &[Padded], shard_index: usize) -> Result<MutexGuard<'_, Shard>, PoisonedShardError> {
    let shard = shards.get(shard_index).ok_or(PoisonedShardError { shard_index })?;
    shard.0.lock().map_err(|_| PoisonedShardError { shard_index })
}

/// Runs the bounded cleanup of one shard, timing it only when someone observes.
fn clean(shard: &mut Shard, now: u64, budget: &mut Budget, timed: bool, work: &mut CleanupWork) {
    let started = timed.then(Instant::now);
    work.removed += shard.remove_expired(now, budget);
    if let Some(started) = started {
        work.elapsed += started.elapsed();
    }
}

fn storage_denial(retry_after_millis: Option<u64>, now: u64) -> Denial {
    Denial::StorageCapacity {
        retry_after: retry_after_millis.map(|at| Delay::from_millis(at.saturating_sub(now))),
    }
}

impl Engine {
    pub(crate) fn new(config: MemoryStoreConfig) -> Self {
        let shards = (0..config.shard_count())
            .map(|index| Padded(Mutex::new(Shard::new(config.shard_capacity(index).unwrap_or(0)))))
            .collect();
        Self {
            shards,
            config,
            base_capacity: config.max_keys() / config.shard_count(),
            extra_capacity: config.max_keys() % config.shard_count(),
        }
    }

    /// The fixed capacity of shard `shard_index` (see [`MemoryStoreConfig::shard_capacity`]).
    fn capacity(&self, shard_index: usize) -> usize {
        self.base_capacity + usize::from(shard_index < self.extra_capacity)
    }

    pub(crate) fn config(&self) -> &MemoryStoreConfig {
        &self.config
    }

    /// Evaluates one check at clock reading `clock_now`.
    pub(crate) fn check<A: Algorithm>(
        &self,
        check: &Check<'_, A::Policy>,
        clock_now: u64,
        timed: bool,
    ) -> Result<Report<Decision>, CheckFailure<A::Error>> {
        let key = StoredKey::of(check);
        let hash = key.hash();
        let shard_index = key.shard(self.shards.len());
        let mut shard = lock(&self.shards, shard_index).map_err(CheckFailure::Poisoned)?;
        let now = clock_now.max(shard.watermark());
        shard.advance_watermark(now);

        let per_check = self.config.expired_removals_per_check();
        let mut budget = Budget::new(per_check, 1);
        let mut cleanup = CleanupWork { maximum: per_check, ..CleanupWork::default() };
        clean(&mut shard, now, &mut budget, timed, &mut cleanup);

        let slot = shard.find(&key, hash);
        let live = slot.and_then(|slot| shard.entry(slot)).and_then(|entry| entry.live_at(now));
        let verdict = A::evaluate(check.policy(), live, now).map_err(CheckFailure::Evaluation)?;
        let (decision, consumed) = match verdict {
            Verdict::Exhausted(denial) => {
                (Decision::quota_exceeded(denial, check.policy().quota_mode()), false)
            }
            Verdict::Allowed { allowance, next } => match slot {
                Some(slot) => {
                    shard.set_entry(slot, next);
                    (Decision::allowed(allowance), true)
                }
                None if shard.free() > 0 => {
                    shard.insert(key, hash, next);
                    (Decision::allowed(allowance), true)
                }
                None => {
                    let earliest = shard.earliest_expiry(&mut budget);
                    (Decision::denied(storage_denial(earliest, now)), false)
                }
            },
        };
        Ok(Report { decision, headroom: shard.headroom(shard_index), singled_out: None, consumed, cleanup })
    }

    /// Evaluates an atomic batch at clock reading `clock_now`.
    ///
    /// Bookkeeping for up to [`INLINE`] checks lives in inline vectors, and an allowed
    /// decision of one or two checks is stored inline too
    /// ([`BatchDecision::allowed_from_iter`]): a batch of one or two checks allocates nothing.
    pub(crate) fn check_all<A: Algorithm>(
        &self,
        checks: &[Check<'_, A::Policy>],
        clock_now: u64,
        timed: bool,
    ) -> Result<Report<BatchDecision>, Failure<A::Error>> {
        let mode = validate_batch(checks, self.config.maximum_batch_size()).map_err(Failure::Invalid)?;
        let shard_count = self.shards.len();
        match one_shard(checks, shard_count) {
            Some(shard_index) => self.check_all_on_shard::<A>(checks, shard_index, mode, clock_now, timed),
            None => self.check_all_across_shards::<A>(checks, mode, clock_now, timed),
        }
    }

    /// A batch whose keys share one shard: every batch on a one-shard store, and a batch of
    /// one subject key bound to several policies (`SubjectKey::bind`; the shard comes from the
    /// subject key). The same rules as
    /// [`check_all_across_shards`](Self::check_all_across_shards) on a single locked shard,
    /// without its grouping bookkeeping, which measured about a fifth of a two-check batch.
    fn check_all_on_shard<A: Algorithm>(
        &self,
        checks: &[Check<'_, A::Policy>],
        shard_index: usize,
        mode: QuotaMode,
        clock_now: u64,
        timed: bool,
    ) -> Result<Report<BatchDecision>, Failure<A::Error>> {
        let batch_size = checks.len();
        let capacity = self.capacity(shard_index);
        if batch_size > capacity {
            return Err(Failure::ExceedsShard { shard_index, key_count: batch_size, capacity });
        }
        let mut shard = lock(&self.shards, shard_index).map_err(Failure::Poisoned)?;
        let now = clock_now.max(shard.watermark());
        shard.advance_watermark(now);
        let per_check = self.config.expired_removals_per_check();
        let mut budget = Budget::new(per_check, batch_size);
        let mut cleanup =
            CleanupWork { maximum: per_check.saturating_mul(batch_size), ..CleanupWork::default() };
        clean(&mut shard, now, &mut budget, timed, &mut cleanup);

        // Look every key up first: independent lookups let their cache misses overlap.
        let mut found: SmallVec<[(StoredKey, u64, Option<u32>); INLINE]> = SmallVec::new();
        for check in checks {
            let key = StoredKey::of(check);
            let hash = key.hash();
            found.push((key, hash, shard.find(&key, hash)));
        }

        // Evaluate in input order without mutating anything.
        let mut verdicts = Verdicts::default();
        let mut new_keys = 0;
        for (index, (check, &(_, _, slot))) in checks.iter().zip(&found).enumerate() {
            let live = slot.and_then(|slot| shard.entry(slot)).and_then(|entry| entry.live_at(now));
            let verdict = A::evaluate(check.policy(), live, now)
                .map_err(|source| Failure::Evaluation { index, source })?;
            if slot.is_none() && matches!(verdict, Verdict::Allowed { .. }) {
                new_keys += 1;
                if new_keys > shard.free() {
                    verdicts.short_of_storage(index);
                }
            }
            verdicts.push(index, verdict);
        }

        let decision = match verdicts.denial(mode) {
            Some(Denied::Storage(index)) => {
                let earliest = shard.earliest_expiry(&mut budget);
                BatchDecision::denied(index, batch_size, storage_denial(earliest, now))
                    .map(|d| (d, Some(index)))
            }
            Some(Denied::Quota(index, denial)) => {
                BatchDecision::quota_exceeded(index, batch_size, denial, mode).map(|d| (d, Some(index)))
            }
            None => {
                for (verdict, &(key, hash, slot)) in verdicts.list.iter().zip(&found) {
                    if let Verdict::Allowed { next, .. } = *verdict {
                        match slot {
                            Some(slot) => shard.set_entry(slot, next),
                            None => shard.insert(key, hash, next),
                        }
                    }
                }
                verdicts.allowed()
            }
        };
        let headroom = shard.headroom(shard_index);
        drop(shard);
        report(decision, headroom, cleanup)
    }

    /// A batch spanning several shards: grouped by shard and checked against shard capacities
    /// before any lock, then locked in ascending shard index (so two batches can never wait on
    /// each other in a cycle).
    fn check_all_across_shards<A: Algorithm>(
        &self,
        checks: &[Check<'_, A::Policy>],
        mode: QuotaMode,
        clock_now: u64,
        timed: bool,
    ) -> Result<Report<BatchDecision>, Failure<A::Error>> {
        let batch_size = checks.len();

        // Plan each check, and collect the touched shards, ascending, with their check counts.
        let shard_count = self.shards.len();
        let mut planned: SmallVec<[Planned; INLINE]> = SmallVec::new();
        let mut spans: SmallVec<[(usize, usize); INLINE]> = SmallVec::new();
        for check in checks {
            let key = StoredKey::of(check);
            let shard = key.shard(shard_count);
            match spans.binary_search_by_key(&shard, |&(index, _)| index) {
                Ok(position) => spans[position].1 += 1,
                Err(position) => spans.insert(position, (shard, 1)),
            }
            planned.push(Planned { key, hash: key.hash(), group: shard, slot: None });
        }
        // Every shard holds at least `base_capacity` keys, so smaller batches always fit.
        if batch_size > self.base_capacity {
            for &(shard_index, key_count) in &spans {
                let capacity = self.capacity(shard_index);
                if key_count > capacity {
                    return Err(Failure::ExceedsShard { shard_index, key_count, capacity });
                }
            }
        }

        // Lock in ascending shard order, then clamp the clock and clean each shard.
        let per_check = self.config.expired_removals_per_check();
        let mut locked: SmallVec<[Group<'_>; INLINE]> = SmallVec::new();
        for &(shard_index, checks) in &spans {
            let shard = lock(&self.shards, shard_index).map_err(Failure::Poisoned)?;
            let budget = Budget::new(per_check, checks);
            locked.push(Group { shard_index, checks, shard, budget, new_keys: 0, short: false });
        }
        let groups = locked.as_mut_slice();
        let now = groups.iter().map(|group| group.shard.watermark()).fold(clock_now, u64::max);
        let mut cleanup = CleanupWork::default();
        for group in groups.iter_mut() {
            group.shard.advance_watermark(now);
            cleanup.maximum = cleanup.maximum.saturating_add(per_check.saturating_mul(group.checks));
            clean(&mut group.shard, now, &mut group.budget, timed, &mut cleanup);
        }

        // Look every key up first: independent lookups let their cache misses overlap.
        for plan in &mut planned {
            // From shard index to position among the groups (present by construction).
            plan.group = spans.binary_search_by_key(&plan.group, |&(index, _)| index).unwrap_or(0);
            plan.slot = groups[plan.group].shard.find(&plan.key, plan.hash);
        }

        // Evaluate in input order without mutating anything.
        let mut verdicts = Verdicts::default();
        for (index, (check, plan)) in checks.iter().zip(&planned).enumerate() {
            let group = &mut groups[plan.group];
            let live =
                plan.slot.and_then(|slot| group.shard.entry(slot)).and_then(|entry| entry.live_at(now));
            let verdict = A::evaluate(check.policy(), live, now)
                .map_err(|source| Failure::Evaluation { index, source })?;
            if plan.slot.is_none() && matches!(verdict, Verdict::Allowed { .. }) {
                group.new_keys += 1;
                if group.new_keys > group.shard.free() {
                    group.short = true;
                    verdicts.short_of_storage(index);
                }
            }
            verdicts.push(index, verdict);
        }

        let decision = match verdicts.denial(mode) {
            Some(Denied::Storage(index)) => {
                // The batch may fit once every short shard has room: the latest of their
                // earliest expiries (a lower bound when a shard lacks more than one slot).
                let mut latest = Some(0u64);
                for group in groups.iter_mut().filter(|group| group.short) {
                    latest = match (latest, group.shard.earliest_expiry(&mut group.budget)) {
                        (Some(latest), Some(at)) => Some(latest.max(at)),
                        _ => None,
                    };
                }
                BatchDecision::denied(index, batch_size, storage_denial(latest, now))
                    .map(|d| (d, Some(index)))
            }
            Some(Denied::Quota(index, denial)) => {
                BatchDecision::quota_exceeded(index, batch_size, denial, mode).map(|d| (d, Some(index)))
            }
            None => {
                for (plan, verdict) in planned.iter().zip(&verdicts.list) {
                    if let Verdict::Allowed { next, .. } = *verdict {
                        let shard = &mut groups[plan.group].shard;
                        match plan.slot {
                            Some(slot) => shard.set_entry(slot, next),
                            None => shard.insert(plan.key, plan.hash, next),
                        }
                    }
                }
                verdicts.allowed()
            }
        };
        // Only observers read the headroom.
        let headroom = if timed {
            groups
                .iter()
                .map(|group| group.shard.headroom(group.shard_index))
                .min_by_key(ShardHeadroom::headroom)
                .unwrap_or(ShardHeadroom { shard_index: 0, entries: 0, capacity: 0 })
        } else {
            ShardHeadroom { shard_index: 0, entries: 0, capacity: 0 }
        };
        drop(locked);
        report(decision, headroom, cleanup)
    }

    /// Empties every poisoned shard and clears its poison; returns how many were recovered.
    pub(crate) fn recover_poisoned(&self) -> usize {
        let mut recovered = 0;
        for shard in &self.shards {
            if !shard.0.is_poisoned() {
                continue;
            }
            match shard.0.lock() {
                Ok(_) => {}
                Err(poisoned) => {
                    let mut guard = poisoned.into_inner();
                    guard.clear();
                    shard.0.clear_poison();
                    drop(guard);
                    recovered += 1;
                }
            }
        }
        recovered
    }

    /// A snapshot of every shard's occupancy. Locks each shard briefly, one at a time.
    pub(crate) fn stats(&self) -> MemoryStoreStats {
        let shards = self
            .shards
            .iter()
            .enumerate()
            .map(|(shard_index, shard)| {
                let (guard, poisoned) = match shard.0.lock() {
                    Ok(guard) => (guard, false),
                    Err(poisoned) => (poisoned.into_inner(), true),
                };
                ShardStats {
                    shard_index,
                    entries: guard.len(),
                    capacity: guard.capacity(),
                    headroom: guard.free(),
                    poisoned,
                }
            })
            .collect();
        MemoryStoreStats { shards }
    }

    /// Test support: panics while holding shard `shard_index`'s lock, poisoning it.
    #[cfg(test)]
    pub(crate) fn poison_shard(&self, shard_index: usize) {
        let shards = &self.shards;
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let _guard = shards[shard_index].0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            panic!("test panic while holding shard {shard_index}");
        }));
        assert!(result.is_err());
    }
}
