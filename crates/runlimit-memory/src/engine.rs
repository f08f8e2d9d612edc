//! The sharded engine both stores run on, parameterized by the counting algorithm.
//!
//! Locking protocol: a single check locks its one shard. A batch is validated, its checks are
//! assigned to shards and checked against shard capacities before any lock; then it locks
//! every touched shard in ascending shard index (so two batches can never wait on each other
//! in a cycle), evaluates every check in input order against the locked state, commits all or
//! nothing, and releases the locks. Observers run afterwards, in [`crate::store`].
//!
//! Batches take one of three paths with the same rules: two checks (`check_pair_on_one_shard`
//! and `check_pair_on_two_shards`, the commonest batches, in code written for them), batches
//! of up to [`INLINE`] checks on at most two shards (`check_small`, straight-line code per
//! batch size), and every other batch (`check_all_across_shards`, grouped by shard). All run
//! under the property tests in `tests/memory/model.rs`.

use std::{
    sync::{Mutex, MutexGuard},
    time::Duration,
};

use quanta::Instant;
use smallvec::SmallVec;

use runlimit_core::{
    Allowance, BatchDecision, BatchDecisionError, Check, Decision, Delay, Denial, QuotaDenial, QuotaMode,
    QuotaSnapshot,
    backend::{
        ShardHeadroom,
        batch::{self, BatchDenial, Precedence},
    },
};

use crate::{
    algorithm::sealed::Algorithm,
    config::MemoryStoreConfig,
    error::{CheckFailure, Failure, PoisonedShardError},
    key::{KeyOf, StoredKey},
    shard::{Budget, Entry, Shard},
    stats::{MemoryStoreStats, ShardStats},
};

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
    /// The entry to store, once evaluated as allowed.
    next: Option<Entry>,
}

/// A batch's verdicts so far: the allowances in input order, and the denials in the
/// [`Precedence`] of the batch rule ([`runlimit_core::backend::batch`]).
struct Verdicts {
    /// The allowances of the allowed checks, in input order.
    allowances: SmallVec<[Allowance; INLINE]>,
    precedence: Precedence,
}

impl Verdicts {
    #[inline]
    fn new(mode: QuotaMode) -> Self {
        Self { allowances: SmallVec::new(), precedence: Precedence::new(mode) }
    }

    /// Records the verdict of the check at `index`; returns the entry to store if allowed.
    #[inline]
    fn push(&mut self, index: usize, verdict: Verdict) -> Option<Entry> {
        match verdict {
            Verdict::Allowed { allowance, next } => {
                self.allowances.push(allowance);
                Some(next)
            }
            Verdict::Exhausted(denial) => {
                self.precedence.quota_exceeded(index, denial);
                None
            }
        }
    }

    /// The check at `index` was allowed but its shard has no slot left for it.
    #[inline]
    fn short_of_storage(&mut self, index: usize) {
        self.precedence.storage_capacity(index);
    }

    /// The allowed decision (every verdict allowed).
    #[inline]
    fn allowed(&self) -> Result<(BatchDecision, Option<usize>), BatchDecisionError> {
        let decision = match *self.allowances.as_slice() {
            // The commonest batch, from an array: copied without iterator state (about 5 ns
            // less per two-check batch than through the slice iterator, measured).
            [first, second] => batch::allowed([first, second]),
            _ => batch::allowed(self.allowances.iter().copied()),
        };
        decision.map(|decision| (decision, None))
    }
}

/// The two checks of a pair batch evaluated in input order, against their live entries at
/// `now`; an evaluation error names its check's index.
#[inline(always)]
fn evaluate_pair<A: Algorithm>(
    checks: [&Check<'_, A>; 2],
    live: [Option<Entry>; 2],
    now: u64,
) -> Result<[Verdict; 2], Failure<A::Error>> {
    let first = checks[0]
        .policy()
        .evaluate(live[0], now, checks[0].cost())
        .map_err(|source| Failure::Evaluation { index: 0, source })?;
    let second = checks[1]
        .policy()
        .evaluate(live[1], now, checks[1].cost())
        .map_err(|source| Failure::Evaluation { index: 1, source })?;
    Ok([first, second])
}

/// The decision of a pair batch decided under its locks: both allowances (allowed), or the
/// denial the batch rule picked and its retry-after.
#[inline(always)]
fn pair_decision(
    decided: Result<[Allowance; 2], (BatchDenial, Option<Delay>)>,
) -> Result<(BatchDecision, Option<usize>), BatchDecisionError> {
    match decided {
        Ok(allowances) => batch::allowed(allowances).map(|decision| (decision, None)),
        Err((denial, retry_after)) => {
            denial.into_decision(2, retry_after).map(|decision| (decision, Some(denial.index())))
        }
    }
}

/// A decided batch: its decision, and what an observer reads when `observed` asks for it.
#[inline(always)]
fn report<E>(
    decision: Result<(BatchDecision, Option<usize>), BatchDecisionError>,
    headroom: ShardHeadroom,
    cleanup: CleanupWork,
    observed: impl Sink,
) -> Result<BatchDecision, Failure<E>> {
    match decision {
        Ok((decision, singled_out)) => Ok(finish(decision, observed, || Observed {
            headroom,
            singled_out,
            consumed: singled_out.is_none(),
            cleanup,
        })),
        // Unreachable: every index is below the batch size and an allowed batch is
        // non-empty. Fail closed as an invalid batch rather than panic.
        Err(_) => Err(Failure::Invalid(runlimit_core::BatchError::EmptyBatch)),
    }
}

/// A shard index and the number of a batch's checks on it.
type Span = (usize, usize);

/// The shards of a batch of `N` checks touching at most two, from each check's shard: the
/// first check's shard and the number of checks on it, then the other shard (if any) and its
/// count. `None` for three or more.
#[inline(always)]
fn two_shards<const N: usize>(shards: &[usize; N]) -> Option<(Span, Option<Span>)> {
    let (&first, rest) = shards.split_first()?;
    let mut first = (first, 1);
    let mut second = None;
    for &shard in rest {
        match &mut second {
            _ if shard == first.0 => first.1 += 1,
            None => second = Some((shard, 1)),
            Some((index, count)) if *index == shard => *count += 1,
            Some(_) => return None,
        }
    }
    Some((first, second))
}

/// The shard a check of a batch on two shards lives on: `other` when `on_other`, else
/// `first`.
#[inline(always)]
fn pick<'g>(first: &'g Shard, other: Option<&'g Shard>, on_other: bool) -> &'g Shard {
    match (on_other, other) {
        (true, Some(other)) => other,
        _ => first,
    }
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

/// What an observer reads of one operation besides its decision. An operation fills it only
/// for an observed store (see [`Sink`]): returned with every decision, it cost an unobserved
/// check about 4 ns (a `MemoryStore` check 30.3 ns against 26.2 ns, `RUNLIMIT_BENCH_GROUPS=single
/// cargo bench -p runlimit-memory`, same sitting).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Observed {
    /// Headroom of the touched shard (the one with the least headroom, for a batch).
    pub(crate) headroom: ShardHeadroom,
    /// The input index the outcome singles out (a denied check), for batches.
    pub(crate) singled_out: Option<usize>,
    /// Whether quota was consumed.
    pub(crate) consumed: bool,
    pub(crate) cleanup: CleanupWork,
}

impl Default for Observed {
    fn default() -> Self {
        Self {
            headroom: ShardHeadroom { shard_index: 0, entries: 0, capacity: 0 },
            singled_out: None,
            consumed: false,
            cleanup: CleanupWork::default(),
        }
    }
}

/// Where an operation leaves what an observer reads: nowhere ([`Unobserved`]: a store
/// without an observer, for which every operation is compiled without the bookkeeping) or
/// in an [`Observed`].
pub(crate) trait Sink {
    /// Whether the facts are read: cleanup is then timed and the headroom computed.
    fn timed(&self) -> bool;
    /// Stores the facts (computed only when read).
    fn record(self, facts: impl FnOnce() -> Observed);
}

/// No observer: nothing is recorded.
pub(crate) struct Unobserved;

impl Sink for Unobserved {
    #[inline(always)]
    fn timed(&self) -> bool {
        false
    }
    #[inline(always)]
    fn record(self, _: impl FnOnce() -> Observed) {}
}

impl Sink for &mut Observed {
    #[inline(always)]
    fn timed(&self) -> bool {
        true
    }
    #[inline(always)]
    fn record(self, facts: impl FnOnce() -> Observed) {
        *self = facts();
    }
}

/// Test support: observed or not, decided at run time.
#[cfg(test)]
impl Sink for Option<&mut Observed> {
    fn timed(&self) -> bool {
        self.is_some()
    }
    fn record(self, facts: impl FnOnce() -> Observed) {
        if let Some(observed) = self {
            *observed = facts();
        }
    }
}

/// Records what an observer reads, when `observed` reads it, and returns the decision.
#[inline(always)]
fn finish<D>(decision: D, observed: impl Sink, facts: impl FnOnce() -> Observed) -> D {
    observed.record(facts);
    decision
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
#[inline]
fn clean(shard: &mut Shard, now: u64, budget: &mut Budget, timed: bool, work: &mut CleanupWork) {
    let started = timed.then(Instant::now);
    work.removed += shard.remove_expired(now, budget);
    if let Some(started) = started {
        work.elapsed += started.elapsed();
    }
}

/// The time from `now` until `at` (store milliseconds), when known.
fn delay_until(at: Option<u64>, now: u64) -> Option<Delay> {
    at.map(|at| Delay::from_millis(at.saturating_sub(now)))
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

    /// Evaluates one check at clock reading `clock_now`, leaving what an observer reads in
    /// `observed`.
    #[inline]
    pub(crate) fn check<A: Algorithm>(
        &self,
        check: &Check<'_, A>,
        clock_now: u64,
        observed: impl Sink,
    ) -> Result<Decision, CheckFailure<A::Error>> {
        let timed = observed.timed();
        let of = KeyOf::of(check);
        let (key, hash) = (of.key, of.key.hash());
        let shard_index = of.shard(self.shards.len());
        let mut shard = lock(&self.shards, shard_index).map_err(CheckFailure::Poisoned)?;
        let now = clock_now.max(shard.watermark());
        shard.advance_watermark(now);

        let per_check = self.config.expired_removals_per_check();
        let mut budget = Budget::new(per_check, 1);
        let mut cleanup = CleanupWork { maximum: per_check, ..CleanupWork::default() };
        clean(&mut shard, now, &mut budget, timed, &mut cleanup);

        let slot = shard.find(&key, hash);
        let live = slot.and_then(|slot| shard.entry(slot)).and_then(|entry| entry.live_at(now));
        let verdict = check.policy().evaluate(live, now, check.cost()).map_err(CheckFailure::Evaluation)?;
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
                    (
                        Decision::denied(Denial::StorageCapacity { retry_after: delay_until(earliest, now) }),
                        false,
                    )
                }
            },
        };
        // Only observers read the headroom.
        let headroom = if timed {
            shard.headroom(shard_index)
        } else {
            ShardHeadroom { shard_index, entries: 0, capacity: 0 }
        };
        drop(shard);
        Ok(finish(decision, observed, || Observed { headroom, singled_out: None, consumed, cleanup }))
    }

    /// The quota of `check`'s key at clock reading `clock_now` (clamped to the shard's
    /// watermark, which it does not move), without cleanup or any other write.
    pub(crate) fn peek<A: Algorithm>(
        &self,
        check: &Check<'_, A>,
        clock_now: u64,
    ) -> Result<QuotaSnapshot, CheckFailure<A::Error>> {
        let of = KeyOf::of(check);
        let key = of.key;
        let shard = lock(&self.shards, of.shard(self.shards.len())).map_err(CheckFailure::Poisoned)?;
        let now = clock_now.max(shard.watermark());
        let live = shard
            .find(&key, key.hash())
            .and_then(|slot| shard.entry(slot))
            .and_then(|entry| entry.live_at(now));
        check.policy().peek(live, now).map_err(CheckFailure::Evaluation)
    }

    /// Removes the entry of `check`'s key, live or expired, at clock reading `clock_now`;
    /// `true` when it was live. See [`Shard::remove`] for the cost.
    pub(crate) fn reset<A: Algorithm>(
        &self,
        check: &Check<'_, A>,
        clock_now: u64,
    ) -> Result<bool, PoisonedShardError> {
        let of = KeyOf::of(check);
        let (key, hash) = (of.key, of.key.hash());
        let mut shard = lock(&self.shards, of.shard(self.shards.len()))?;
        let now = clock_now.max(shard.watermark());
        shard.advance_watermark(now);
        let Some(slot) = shard.find(&key, hash) else { return Ok(false) };
        let live = shard.entry(slot).and_then(|entry| entry.live_at(now)).is_some();
        shard.remove(slot, hash);
        Ok(live)
    }

    /// Evaluates an atomic batch at clock reading `clock_now`.
    ///
    /// Bookkeeping for up to [`INLINE`] checks lives in arrays or inline vectors, and an
    /// allowed decision of one or two checks is stored inline too
    /// ([`batch::allowed`]): a batch of one or two checks allocates nothing.
    #[inline(always)]
    pub(crate) fn check_all<A: Algorithm>(
        &self,
        checks: &[Check<'_, A>],
        clock_now: u64,
        observed: impl Sink,
    ) -> Result<BatchDecision, Failure<A::Error>> {
        // Up to `INLINE` checks, the duplicate-key rule is left to `check_small`, which compares
        // the stored keys it derives anyway (see `batch::validate_shape`); larger batches take
        // the full rule here.
        let maximum = self.config.maximum_batch_size();
        let validated = if checks.len() <= INLINE {
            batch::validate_shape(checks, maximum)
        } else {
            batch::validate(checks, maximum)
        };
        let mode = validated.map_err(Failure::Invalid)?;
        match checks.len() {
            1 => self.check_small::<A, 1>(checks, mode, clock_now, observed),
            2 => self.check_small::<A, 2>(checks, mode, clock_now, observed),
            3 => self.check_small::<A, 3>(checks, mode, clock_now, observed),
            4 => self.check_small::<A, 4>(checks, mode, clock_now, observed),
            _ => self.check_all_across_shards::<A>(checks, mode, clock_now, observed),
        }
    }

    /// A batch of `N` checks (1 to [`INLINE`]) whose keys live on one or two shards: the
    /// common shapes, such as one subject key bound to several policies (`SubjectKey::bind`;
    /// the shard comes from the subject key), two subject keys (an address and an account),
    /// or one subject key per policy as `KeyHasher::hash_for` derives. The same rules as
    /// [`check_all_across_shards`](Self::check_all_across_shards), which takes the batch
    /// when it touches three or more shards (or `checks` is not `N` long).
    ///
    /// Monomorphized per batch size: every per-check value lives in an array of `N` and the
    /// two shards in two locals, so a two-check batch compiles to straight-line code.
    /// Measured (`cargo bench -p runlimit-memory`, two-check batch across two shards, 64
    /// shards, 10,000 hot entries): 72 ns, against 111 ns when such batches took the grouped
    /// path.
    #[allow(clippy::needless_range_loop)] // several arrays indexed in step
    fn check_small<A: Algorithm, const N: usize>(
        &self,
        checks: &[Check<'_, A>],
        mode: QuotaMode,
        clock_now: u64,
        observed: impl Sink,
    ) -> Result<BatchDecision, Failure<A::Error>> {
        let timed = observed.timed();
        let Ok(checks) = <&[Check<'_, A>; N]>::try_from(checks) else {
            batch::validate(checks, self.config.maximum_batch_size()).map_err(Failure::Invalid)?;
            return self.check_all_across_shards::<A>(checks, mode, clock_now, observed);
        };
        let batch_size = N;
        let shard_count = self.shards.len();
        // Plain loops over arrays: `array::from_fn` measured slower (its closures were not
        // inlined).
        let mut keys = [StoredKey::ZERO; N];
        let mut shards = [0; N];
        for index in 0..N {
            let of = KeyOf::of(&checks[index]);
            keys[index] = of.key;
            shards[index] = of.shard(shard_count);
        }
        // Equal counter keys give equal stored keys: pairwise distinct stored keys settle the
        // duplicate-key rule; otherwise the full rule decides.
        if (1..N).any(|later| keys[..later].contains(&keys[later])) {
            batch::validate(checks, self.config.maximum_batch_size()).map_err(Failure::Invalid)?;
        }
        let Some((first, second)) = two_shards(&shards) else {
            return self.check_all_across_shards::<A>(checks, mode, clock_now, observed);
        };
        // Two checks: straight-line paths of their own. Every shard holds at least
        // `base_capacity` keys: two keys of one shard fit when it is 2 or more, one key of
        // each of two shards when it is 1 or more (otherwise the path below checks the
        // shard's own capacity).
        if let ([one, two], [first_key, second_key]) = (checks.as_slice(), keys.as_slice()) {
            let (checks, keys) = ([one, two], [*first_key, *second_key]);
            match second {
                None if N <= self.base_capacity => {
                    return self
                        .check_pair_on_one_shard::<A>(checks, keys, first.0, mode, clock_now, observed);
                }
                Some((other, _)) if self.base_capacity >= 1 => {
                    return self.check_pair_on_two_shards::<A>(
                        checks,
                        keys,
                        [first.0, other],
                        mode,
                        clock_now,
                        observed,
                    );
                }
                _ => {}
            }
        }
        // Every shard holds at least `base_capacity` keys, so smaller batches always fit.
        if N > self.base_capacity {
            // Ascending shard index, as the grouped path reports them.
            let mut spans = [Some(first), second];
            if let [Some(low), Some(high)] = spans
                && high.0 < low.0
            {
                spans = [Some(high), Some(low)];
            }
            for (shard_index, key_count) in spans.into_iter().flatten() {
                let capacity = self.capacity(shard_index);
                if key_count > capacity {
                    return Err(Failure::ExceedsShard { shard_index, key_count, capacity });
                }
            }
        }
        // Lock in ascending shard index.
        let (mut shard, mut other) = match second {
            Some((second, _)) if second < first.0 => {
                let other = lock(&self.shards, second).map_err(Failure::Poisoned)?;
                (lock(&self.shards, first.0).map_err(Failure::Poisoned)?, Some(other))
            }
            Some((second, _)) => {
                let shard = lock(&self.shards, first.0).map_err(Failure::Poisoned)?;
                (shard, Some(lock(&self.shards, second).map_err(Failure::Poisoned)?))
            }
            None => (lock(&self.shards, first.0).map_err(Failure::Poisoned)?, None),
        };
        let now = clock_now.max(shard.watermark()).max(other.as_ref().map_or(0, |other| other.watermark()));
        let per_check = self.config.expired_removals_per_check();
        let mut budget = Budget::new(per_check, first.1);
        let mut other_budget = Budget::new(per_check, second.map_or(0, |(_, checks)| checks));
        let mut cleanup =
            CleanupWork { maximum: per_check.saturating_mul(batch_size), ..CleanupWork::default() };
        shard.advance_watermark(now);
        clean(&mut shard, now, &mut budget, timed, &mut cleanup);
        if let Some(other) = &mut other {
            other.advance_watermark(now);
            clean(other, now, &mut other_budget, timed, &mut cleanup);
        }

        // Look every key up first: independent lookups let their cache misses overlap.
        let mut on_other = [false; N];
        let mut slots = [None; N];
        for index in 0..N {
            on_other[index] = shards[index] != first.0;
            slots[index] =
                pick(&shard, other.as_deref(), on_other[index]).find(&keys[index], keys[index].hash());
        }

        // Evaluate in input order without mutating anything.
        let mut verdicts = Verdicts::new(mode);
        let mut next: [Option<Entry>; N] = [None; N];
        // Allowed checks needing a new slot so far, on the first shard and on the other.
        let mut new_keys = [0, 0];
        let mut short = [false, false];
        for index in 0..N {
            let held = pick(&shard, other.as_deref(), on_other[index]);
            let live = slots[index].and_then(|slot| held.entry(slot)).and_then(|entry| entry.live_at(now));
            let verdict = checks[index]
                .policy()
                .evaluate(live, now, checks[index].cost())
                .map_err(|source| Failure::Evaluation { index, source })?;
            next[index] = verdicts.push(index, verdict);
            if slots[index].is_none() && next[index].is_some() {
                let side = usize::from(on_other[index]);
                if let (Some(new_keys), Some(short)) = (new_keys.get_mut(side), short.get_mut(side)) {
                    *new_keys += 1;
                    if *new_keys > held.free() {
                        *short = true;
                        verdicts.short_of_storage(index);
                    }
                }
            }
        }

        let decision = match verdicts.precedence.denial() {
            Some(denial) => {
                let mut retry_after = None;
                if denial.is_storage_capacity() {
                    // The batch may fit once every short shard has room: the latest of their
                    // earliest expiries (a lower bound when a shard lacks more than one slot).
                    let [short, other_short] = short;
                    let mut latest = Some(0u64);
                    if short {
                        latest = latest.zip(shard.earliest_expiry(&mut budget)).map(|(a, b)| a.max(b));
                    }
                    if let (true, Some(other)) = (other_short, other.as_mut()) {
                        latest = latest.zip(other.earliest_expiry(&mut other_budget)).map(|(a, b)| a.max(b));
                    }
                    retry_after = delay_until(latest, now);
                }
                denial.into_decision(batch_size, retry_after).map(|d| (d, Some(denial.index())))
            }
            None => {
                for index in 0..N {
                    let Some(next) = next[index] else { continue };
                    let held = match (on_other[index], other.as_deref_mut()) {
                        (true, Some(other)) => other,
                        _ => &mut *shard,
                    };
                    match slots[index] {
                        Some(slot) => held.set_entry(slot, next),
                        None => held.insert(keys[index], keys[index].hash(), next),
                    }
                }
                verdicts.allowed()
            }
        };
        // Only observers read the headroom: the touched shard with the least (the lower index
        // on a tie).
        let mut headroom = ShardHeadroom { shard_index: 0, entries: 0, capacity: 0 };
        if timed {
            headroom = shard.headroom(first.0);
            if let (Some(other), Some((shard_index, _))) = (&other, second) {
                let candidate = other.headroom(shard_index);
                if (candidate.headroom(), shard_index) < (headroom.headroom(), headroom.shard_index) {
                    headroom = candidate;
                }
            }
        }
        drop(shard);
        drop(other);
        report(decision, headroom, cleanup, observed)
    }

    /// The commonest batch on its own path: two checks whose keys share a shard (one subject
    /// key bound to two policies). The same rules as [`check_small`](Self::check_small), in
    /// straight-line code without the second shard's bookkeeping: both checks allowed (the
    /// common case) commit at once; otherwise the batch rule's [`Precedence`] picks the denial
    /// and nothing is stored. The caller has checked that two keys fit the shard.
    ///
    /// Measured when it was introduced (`RUNLIMIT_BENCH_GROUPS=single cargo bench -p
    /// runlimit-memory`, 64 shards, 10,000 hot entries, five runs; later changes to the shared
    /// code made both paths faster): a `MemoryStore` batch 48–49 ns against 58–59 ns on the
    /// general small-batch path, a `GcraStore` batch 56–58 ns against 70 ns. (Variants that
    /// moved this dispatch into `check_all` or kept the verdicts in arrays of options measured
    /// slower: 60 and 64 ns.)
    #[inline(always)]
    fn check_pair_on_one_shard<A: Algorithm>(
        &self,
        checks: [&Check<'_, A>; 2],
        keys: [StoredKey; 2],
        shard_index: usize,
        mode: QuotaMode,
        clock_now: u64,
        observed: impl Sink,
    ) -> Result<BatchDecision, Failure<A::Error>> {
        let timed = observed.timed();
        let mut shard = lock(&self.shards, shard_index).map_err(Failure::Poisoned)?;
        let now = clock_now.max(shard.watermark());
        shard.advance_watermark(now);
        let per_check = self.config.expired_removals_per_check();
        let mut budget = Budget::new(per_check, 2);
        let mut cleanup = CleanupWork { maximum: per_check.saturating_mul(2), ..CleanupWork::default() };
        clean(&mut shard, now, &mut budget, timed, &mut cleanup);

        let hashes = [keys[0].hash(), keys[1].hash()];
        let slots = [shard.find(&keys[0], hashes[0]), shard.find(&keys[1], hashes[1])];
        let live =
            |slot: Option<u32>| slot.and_then(|slot| shard.entry(slot)).and_then(|entry| entry.live_at(now));
        let [first, second] = evaluate_pair(checks, [live(slots[0]), live(slots[1])], now)?;
        let new_keys = usize::from(slots[0].is_none()) + usize::from(slots[1].is_none());
        let free = shard.free();

        // Decided under the lock; the decision is built once it is released.
        let decided = match (first, second) {
            (
                Verdict::Allowed { allowance: first_allowance, next: first_next },
                Verdict::Allowed { allowance: second_allowance, next: second_next },
            ) if new_keys <= free => {
                for (index, next) in [(0, first_next), (1, second_next)] {
                    match slots[index] {
                        Some(slot) => shard.set_entry(slot, next),
                        None => shard.insert(keys[index], hashes[index], next),
                    }
                }
                Ok([first_allowance, second_allowance])
            }
            (first, second) => {
                let mut precedence = Precedence::new(mode);
                // Allowed checks needing a new slot, counted in input order.
                let mut needed = 0;
                for (index, verdict) in [first, second].into_iter().enumerate() {
                    match verdict {
                        Verdict::Allowed { .. } if slots[index].is_none() => {
                            needed += 1;
                            if needed > free {
                                precedence.storage_capacity(index);
                            }
                        }
                        Verdict::Allowed { .. } => {}
                        Verdict::Exhausted(denial) => precedence.quota_exceeded(index, denial),
                    }
                }
                // A check was exhausted or the allowed ones lack slots: there is a denial.
                let Some(denial) = precedence.denial() else {
                    return Err(Failure::Invalid(runlimit_core::BatchError::EmptyBatch));
                };
                let retry_after = if denial.is_storage_capacity() {
                    // The earliest expiry: a lower bound when the shard lacks two slots.
                    delay_until(shard.earliest_expiry(&mut budget), now)
                } else {
                    None
                };
                Err((denial, retry_after))
            }
        };
        let headroom = if timed {
            shard.headroom(shard_index)
        } else {
            ShardHeadroom { shard_index, entries: 0, capacity: 0 }
        };
        drop(shard);
        report(pair_decision(decided), headroom, cleanup, observed)
    }

    /// Two checks whose keys live on two shards (a subject key per policy, as
    /// `KeyHasher::hash_for` derives): the same rules as [`check_small`](Self::check_small) in
    /// straight-line code, like [`check_pair_on_one_shard`](Self::check_pair_on_one_shard),
    /// with the two shards locked in ascending index.
    ///
    /// Measured as that one: a `MemoryStore` batch across two shards 57–60 ns against 64–66 ns
    /// on the general small-batch path, a `GcraStore` batch 65 ns against 76–77 ns.
    #[inline(always)]
    fn check_pair_on_two_shards<A: Algorithm>(
        &self,
        checks: [&Check<'_, A>; 2],
        keys: [StoredKey; 2],
        shard_indexes: [usize; 2],
        mode: QuotaMode,
        clock_now: u64,
        observed: impl Sink,
    ) -> Result<BatchDecision, Failure<A::Error>> {
        let timed = observed.timed();
        // `shards[i]` holds key `i`; the lower index is locked first.
        let mut shards = if shard_indexes[0] < shard_indexes[1] {
            let first = lock(&self.shards, shard_indexes[0]).map_err(Failure::Poisoned)?;
            [first, lock(&self.shards, shard_indexes[1]).map_err(Failure::Poisoned)?]
        } else {
            let second = lock(&self.shards, shard_indexes[1]).map_err(Failure::Poisoned)?;
            [lock(&self.shards, shard_indexes[0]).map_err(Failure::Poisoned)?, second]
        };
        let now = clock_now.max(shards[0].watermark()).max(shards[1].watermark());
        let per_check = self.config.expired_removals_per_check();
        let mut budgets = [Budget::new(per_check, 1), Budget::new(per_check, 1)];
        let mut cleanup = CleanupWork { maximum: per_check.saturating_mul(2), ..CleanupWork::default() };
        for (shard, budget) in shards.iter_mut().zip(&mut budgets) {
            shard.advance_watermark(now);
            clean(shard, now, budget, timed, &mut cleanup);
        }

        let hashes = [keys[0].hash(), keys[1].hash()];
        let slots = [shards[0].find(&keys[0], hashes[0]), shards[1].find(&keys[1], hashes[1])];
        let live = |index: usize| {
            slots[index].and_then(|slot| shards[index].entry(slot)).and_then(|entry| entry.live_at(now))
        };
        let [first, second] = evaluate_pair(checks, [live(0), live(1)], now)?;
        // A shard is short when its key needs a new slot and it has none left.
        let short =
            [slots[0].is_none() && shards[0].free() == 0, slots[1].is_none() && shards[1].free() == 0];

        // Decided under the locks; the decision is built once they are released.
        let decided = match (first, second) {
            (
                Verdict::Allowed { allowance: first_allowance, next: first_next },
                Verdict::Allowed { allowance: second_allowance, next: second_next },
            ) if short == [false, false] => {
                for (index, next) in [(0, first_next), (1, second_next)] {
                    match slots[index] {
                        Some(slot) => shards[index].set_entry(slot, next),
                        None => shards[index].insert(keys[index], hashes[index], next),
                    }
                }
                Ok([first_allowance, second_allowance])
            }
            (first, second) => {
                let mut precedence = Precedence::new(mode);
                let mut short_of_storage = [false, false];
                for (index, verdict) in [first, second].into_iter().enumerate() {
                    match verdict {
                        Verdict::Allowed { .. } if short[index] => {
                            short_of_storage[index] = true;
                            precedence.storage_capacity(index);
                        }
                        Verdict::Allowed { .. } => {}
                        Verdict::Exhausted(denial) => precedence.quota_exceeded(index, denial),
                    }
                }
                // A check was exhausted or an allowed one lacks a slot: there is a denial.
                let Some(denial) = precedence.denial() else {
                    return Err(Failure::Invalid(runlimit_core::BatchError::EmptyBatch));
                };
                let mut retry_after = None;
                if denial.is_storage_capacity() {
                    // The batch may fit once every short shard has room: the latest of their
                    // earliest expiries.
                    let mut latest = Some(0u64);
                    for ((shard, budget), short) in shards.iter_mut().zip(&mut budgets).zip(short_of_storage)
                    {
                        if short {
                            latest = latest.zip(shard.earliest_expiry(budget)).map(|(a, b)| a.max(b));
                        }
                    }
                    retry_after = delay_until(latest, now);
                }
                Err((denial, retry_after))
            }
        };
        // Only observers read the headroom: the shard with the least (the lower index on a tie).
        let mut headroom = ShardHeadroom { shard_index: 0, entries: 0, capacity: 0 };
        if timed {
            let [first, second] =
                [shards[0].headroom(shard_indexes[0]), shards[1].headroom(shard_indexes[1])];
            headroom = if (second.headroom(), second.shard_index) < (first.headroom(), first.shard_index) {
                second
            } else {
                first
            };
        }
        drop(shards);
        report(pair_decision(decided), headroom, cleanup, observed)
    }

    /// Any batch: grouped by shard and checked against shard capacities before any lock,
    /// then locked in ascending shard index (so two batches can never wait on each other in a
    /// cycle). Takes every batch [`check_small`](Self::check_small) does not: more than
    /// [`INLINE`] checks, or three or more shards.
    fn check_all_across_shards<A: Algorithm>(
        &self,
        checks: &[Check<'_, A>],
        mode: QuotaMode,
        clock_now: u64,
        observed: impl Sink,
    ) -> Result<BatchDecision, Failure<A::Error>> {
        let timed = observed.timed();
        let batch_size = checks.len();

        // Plan each check, and collect the touched shards, ascending, with their check counts.
        let shard_count = self.shards.len();
        let mut planned: SmallVec<[Planned; INLINE]> = SmallVec::new();
        let mut spans: SmallVec<[(usize, usize); INLINE]> = SmallVec::new();
        for check in checks {
            let of = KeyOf::of(check);
            let (key, shard) = (of.key, of.shard(shard_count));
            match spans.binary_search_by_key(&shard, |&(index, _)| index) {
                Ok(position) => spans[position].1 += 1,
                Err(position) => spans.insert(position, (shard, 1)),
            }
            planned.push(Planned { key, hash: key.hash(), group: shard, slot: None, next: None });
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
        let mut verdicts = Verdicts::new(mode);
        for (index, (check, plan)) in checks.iter().zip(&mut planned).enumerate() {
            let group = &mut groups[plan.group];
            let live =
                plan.slot.and_then(|slot| group.shard.entry(slot)).and_then(|entry| entry.live_at(now));
            let verdict = check
                .policy()
                .evaluate(live, now, check.cost())
                .map_err(|source| Failure::Evaluation { index, source })?;
            plan.next = verdicts.push(index, verdict);
            if plan.slot.is_none() && plan.next.is_some() {
                group.new_keys += 1;
                if group.new_keys > group.shard.free() {
                    group.short = true;
                    verdicts.short_of_storage(index);
                }
            }
        }

        let decision = match verdicts.precedence.denial() {
            Some(denial) => {
                let mut retry_after = None;
                if denial.is_storage_capacity() {
                    // The batch may fit once every short shard has room: the latest of their
                    // earliest expiries (a lower bound when a shard lacks more than one slot).
                    let mut latest = Some(0u64);
                    for group in groups.iter_mut().filter(|group| group.short) {
                        latest = match (latest, group.shard.earliest_expiry(&mut group.budget)) {
                            (Some(latest), Some(at)) => Some(latest.max(at)),
                            _ => None,
                        };
                    }
                    retry_after = delay_until(latest, now);
                }
                denial.into_decision(batch_size, retry_after).map(|d| (d, Some(denial.index())))
            }
            None => {
                for plan in &planned {
                    if let Some(next) = plan.next {
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
        report(decision, headroom, cleanup, observed)
    }

    /// Test support: a batch through the grouped path whatever its shape, so tests can
    /// compare it with [`check_small`](Self::check_small) on the same operations.
    #[cfg(test)]
    pub(crate) fn check_all_grouped<A: Algorithm>(
        &self,
        checks: &[Check<'_, A>],
        clock_now: u64,
        observed: impl Sink,
    ) -> Result<BatchDecision, Failure<A::Error>> {
        let mode = batch::validate(checks, self.config.maximum_batch_size()).map_err(Failure::Invalid)?;
        self.check_all_across_shards::<A>(checks, mode, clock_now, observed)
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
