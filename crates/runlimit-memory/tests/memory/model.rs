//! Property tests: random sequences of checks and batches of random costs and clock advances,
//! driven through a store and through a plain reference model (a `HashMap` from key to state: no shards, no
//! index, no cleanup), comparing every decision and every error.
//!
//! The model implements the rules from their definitions: fixed windows directly, GCRA from
//! the scaled-integer formulas documented in `runlimit_core::backend::gcra` (not through `runlimit_core::gcra`). Capacity
//! is modelled as "a new key fits while fewer than `max_keys` stored keys are live"; the
//! bounded store is configured with a cleanup bound above the key universe, so its bounded
//! cleanup must find every expired entry and report the exact earliest expiry.

use std::{collections::HashMap, time::Duration};

use proptest::prelude::*;
use runlimit_core::{
    Allowance, BatchDecision, BatchError, Check, Decision, Delay, Denial, FixedWindowPolicy, GcraPolicy,
    PolicySubject, QuotaDenial, QuotaMode, QuotaSnapshot, RateLimitPolicy,
};
use runlimit_memory::{
    GcraBatchError, GcraStore, ManualClock, MemoryBatchError, MemoryStore, MemoryStoreConfig,
};

use crate::support::{fixed, gcra, subject};

#[derive(Clone, Debug)]
enum Op {
    Advance(u64),
    Check(Key),
    Batch(Vec<Key>),
    /// A peek, and whether a check of the key's cost would be allowed.
    Peek(Key),
    Reset(Key),
}

/// `(policy index, subject number, cost seed)`: the check's cost is `1 + seed % capacity`
/// of its policy ([`cost`]), so every cost from 1 to the capacity occurs, 1 most often.
type Key = (usize, u64, u64);

/// The cost of a check of `policy` with the given seed: between 1 and the capacity.
fn cost<P: RateLimitPolicy>(policy: &P, seed: u64) -> u64 {
    1 + seed % policy.capacity().get()
}

/// Cost seeds: half of them 0 (a cost of 1), the rest anything.
fn seed() -> impl Strategy<Value = u64> {
    prop_oneof![Just(0u64), 0u64..8]
}

/// Operations for a store accepting batches of up to `maximum` checks. Batches run one past
/// it, so oversized batches are covered too.
fn ops(maximum: usize) -> impl Strategy<Value = Vec<Op>> {
    let op = prop_oneof![
        // Small steps, large steps, and exact window/emission multiples that land on deadlines.
        3 => prop_oneof![0u64..50, 0u64..700, prop::sample::select(vec![1u64, 250, 333, 334, 700, 1_000, 2_000])]
            .prop_map(Op::Advance),
        4 => (0usize..3, 0u64..4, seed()).prop_map(Op::Check),
        2 => proptest::collection::vec((0usize..3, 0u64..4, seed()), 0..=maximum + 1).prop_map(Op::Batch),
        2 => distinct_batch(maximum + 1),
        1 => (0usize..3, 0u64..4, seed()).prop_map(Op::Peek),
        1 => (0usize..3, 0u64..4, seed()).prop_map(Op::Reset),
    ];
    proptest::collection::vec(op, 1..80)
}

/// A batch of up to `maximum` distinct keys in one quota mode, so that batches of every size
/// reach evaluation (random picks mostly repeat a key or mix modes once batches grow). The
/// store takes batches of two checks, batches of up to four checks on at most two shards and
/// every other batch through paths of their own; these sizes cover all three.
fn distinct_batch(maximum: usize) -> impl Strategy<Value = Op> {
    let enforced: Vec<(usize, u64)> = (0..2).flat_map(|policy| (0..6).map(move |n| (policy, n))).collect();
    let shadowed: Vec<(usize, u64)> = (0..6).map(|n| (2, n)).collect();
    let seeds = proptest::collection::vec(seed(), maximum);
    (prop_oneof![Just(enforced).prop_shuffle(), Just(shadowed).prop_shuffle()], 1..=maximum, seeds).prop_map(
        |(keys, size, seeds)| {
            Op::Batch(
                keys.into_iter().zip(seeds).take(size).map(|((policy, n), seed)| (policy, n, seed)).collect(),
            )
        },
    )
}

/// One algorithm's rule for a check of `cost` at `now`: `Ok((available, replenish ms, new
/// state))` or `Err(retry ms)`.
type Evaluate<P, S> = fn(&P, Option<S>, u64, u64) -> Result<(u64, u64, S), u64>;

/// One algorithm's snapshot rule at `now`: `(available, next unit ms, replenish ms)`.
type Peek<P, S> = fn(&P, Option<S>, u64) -> (u64, Option<u64>, u64);

/// One algorithm's model.
struct Model<'a, P, S> {
    policies: &'a [P; 3],
    evaluate: Evaluate<P, S>,
    peek: Peek<P, S>,
    expiry: fn(&P, S) -> u64,
    /// `None`: unbounded.
    capacity: Option<usize>,
    /// The store's `maximum_batch_size`.
    maximum_batch_size: usize,
    states: HashMap<(usize, u64), S>,
}

/// Policies 0 and 2 are the same policy in different quota modes: one counter.
fn group(policy: usize) -> usize {
    if policy == 2 { 0 } else { policy }
}

impl<P: RateLimitPolicy, S: Copy> Model<'_, P, S> {
    fn live(&self, key: (usize, u64), now: u64) -> Option<S> {
        let policy = &self.policies[key.0];
        self.states.get(&key).copied().filter(|&state| (self.expiry)(policy, state) > now)
    }

    fn live_expiries(&self, now: u64) -> Vec<u64> {
        self.states
            .iter()
            .map(|(&(group, _), &state)| (self.expiry)(&self.policies[group], state))
            .filter(|&at| at > now)
            .collect()
    }

    /// Evaluates `checks` as one atomic operation; commits only when every check is allowed.
    fn apply(&mut self, checks: &[Key], now: u64) -> Result<Vec<Allowance>, (usize, Denial, bool)> {
        let mode = self.policies[checks[0].0].quota_mode();
        let free = self.capacity.map(|capacity| capacity.saturating_sub(self.live_expiries(now).len()));
        let mut new_keys = 0;
        let mut enforced = None;
        let mut shadowed = None;
        let mut results = Vec::new();
        for (index, &(policy_index, subject, seed)) in checks.iter().enumerate() {
            let policy = &self.policies[policy_index];
            let key = (group(policy_index), subject);
            let live = self.live(key, now);
            let capacity = policy.capacity();
            match (self.evaluate)(policy, live, now, cost(policy, seed)) {
                Ok((available, replenish, state)) => {
                    if live.is_none() {
                        new_keys += 1;
                        if free.is_some_and(|free| new_keys > free) && enforced.is_none() {
                            let earliest = self.live_expiries(now).into_iter().min().unwrap();
                            let retry = Some(Delay::from_millis(earliest - now));
                            enforced = Some((index, Denial::StorageCapacity { retry_after: retry }));
                        }
                    }
                    let allowance =
                        Allowance::new(capacity, available, Delay::from_millis(replenish)).unwrap();
                    results.push((key, allowance, state));
                }
                Err(retry) => {
                    let denial = QuotaDenial::new(capacity, Delay::from_millis(retry));
                    match mode {
                        QuotaMode::Enforce if enforced.is_none() => {
                            enforced = Some((index, Denial::QuotaExceeded(denial)));
                        }
                        QuotaMode::Shadow if shadowed.is_none() => {
                            shadowed = Some((index, Denial::QuotaExceeded(denial)));
                        }
                        _ => {}
                    }
                }
            }
        }
        if let Some((index, denial)) = enforced {
            return Err((index, denial, false));
        }
        if let Some((index, denial)) = shadowed {
            return Err((index, denial, true));
        }
        Ok(results
            .into_iter()
            .map(|(key, allowance, state)| {
                self.states.insert(key, state);
                allowance
            })
            .collect())
    }

    fn peek(&self, (policy_index, subject, _): Key, now: u64) -> QuotaSnapshot {
        let policy = &self.policies[policy_index];
        let (available, next, replenish) =
            (self.peek)(policy, self.live((group(policy_index), subject), now), now);
        QuotaSnapshot::new(
            policy.capacity(),
            available,
            next.map(Delay::from_millis),
            Delay::from_millis(replenish),
        )
        .unwrap()
    }

    /// Removes the key's state; whether it was live.
    fn reset(&mut self, (policy, subject, _): Key, now: u64) -> bool {
        let key = (group(policy), subject);
        let live = self.live(key, now).is_some();
        self.states.remove(&key);
        live
    }

    fn check(&mut self, check: Key, now: u64) -> Decision {
        match self.apply(&[check], now) {
            Ok(allowances) => Decision::allowed(allowances[0]),
            Err((_, Denial::QuotaExceeded(denial), true)) => Decision::shadow_denied(denial),
            Err((_, denial, _)) => Decision::denied(denial),
        }
    }

    fn check_all(&mut self, checks: &[Key], now: u64) -> Result<BatchDecision, BatchError> {
        if checks.is_empty() {
            return Err(BatchError::EmptyBatch);
        }
        if checks.len() > self.maximum_batch_size {
            let maximum = self.maximum_batch_size;
            return Err(BatchError::TooManyChecks { batch_size: checks.len(), maximum });
        }
        let mode = self.policies[checks[0].0].quota_mode();
        if let Some(index) =
            checks.iter().position(|&(policy, ..)| self.policies[policy].quota_mode() != mode)
        {
            let mode = self.policies[checks[index].0].quota_mode();
            return Err(BatchError::MixedQuotaModes { index, mode });
        }
        for later in 1..checks.len() {
            let key = |index: usize| (group(checks[index].0), checks[index].1);
            if let Some(first) = (0..later).find(|&earlier| key(earlier) == key(later)) {
                return Err(BatchError::DuplicateCounterKey { first_index: first, duplicate_index: later });
            }
        }
        let size = checks.len();
        Ok(match self.apply(checks, now) {
            Ok(allowances) => BatchDecision::allowed(allowances).unwrap(),
            Err((index, Denial::QuotaExceeded(denial), true)) => {
                BatchDecision::shadow_denied(index, size, denial).unwrap()
            }
            Err((index, denial, _)) => BatchDecision::denied(index, size, denial).unwrap(),
        })
    }
}

/// Drives `ops` through the store (via the closures) and the model, comparing every result.
fn drive<P: RateLimitPolicy, S: Copy>(
    model: &mut Model<'_, P, S>,
    clock: &ManualClock,
    ops: &[Op],
    store_check: impl Fn(&Check<'_, P>) -> Decision,
    store_check_all: impl Fn(&[Check<'_, P>]) -> Result<BatchDecision, BatchError>,
    store_peek: impl Fn(PolicySubject<'_, P>) -> QuotaSnapshot,
    store_reset: impl Fn(PolicySubject<'_, P>) -> bool,
) -> Result<(), TestCaseError> {
    let policies = model.policies;
    let mut now = 0u64;
    for (step, op) in ops.iter().enumerate() {
        match op {
            Op::Advance(by) => {
                now += by;
                clock.set(Duration::from_millis(now));
            }
            &Op::Check(key) => {
                let actual = store_check(&costed(policies, key));
                let expected = model.check(key, now);
                prop_assert_eq!(actual, expected, "step {} at {} ms: {:?}", step, now, op);
            }
            Op::Batch(batch) => {
                let checks: Vec<_> = batch.iter().map(|&key| costed(policies, key)).collect();
                let actual = store_check_all(&checks);
                let expected = model.check_all(batch, now);
                prop_assert_eq!(actual, expected, "step {} at {} ms: {:?}", step, now, op);
            }
            &Op::Peek(key) => {
                let actual = store_peek(subject(&policies[key.0], key.1));
                let expected = model.peek(key, now);
                prop_assert_eq!(actual, expected, "step {} at {} ms: {:?}", step, now, op);
                let cost = costed(policies, key).cost();
                prop_assert_eq!(actual.would_allow(cost), expected.available() >= cost);
            }
            &Op::Reset(key) => {
                let actual = store_reset(subject(&policies[key.0], key.1));
                let expected = model.reset(key, now);
                prop_assert_eq!(actual, expected, "step {} at {} ms: {:?}", step, now, op);
            }
        }
    }
    Ok(())
}

/// The check of `key`, at its cost.
fn costed<P: RateLimitPolicy>(policies: &[P; 3], (policy, n, seed): Key) -> Check<'_, P> {
    let policy = &policies[policy];
    Check::new(subject(policy, n)).with_cost(cost(policy, seed)).unwrap()
}

fn fixed_policies() -> [FixedWindowPolicy; 3] {
    let base = fixed("model.a", 4, 1_000);
    [base.clone(), fixed("model.b", 3, 250), base.with_quota_mode(QuotaMode::Shadow)]
}

/// Fixed window from its definition: `(deadline, used)`.
fn fixed_evaluate(
    policy: &FixedWindowPolicy,
    live: Option<(u64, u64)>,
    now: u64,
    cost: u64,
) -> Result<(u64, u64, (u64, u64)), u64> {
    let limit = policy.limit().get();
    match live {
        None => {
            let deadline = now + policy.window().as_millis();
            Ok((limit - cost, deadline - now, (deadline, cost)))
        }
        Some((deadline, used)) if used + cost <= limit => {
            Ok((limit - used - cost, deadline - now, (deadline, used + cost)))
        }
        Some((deadline, _)) => Err(deadline - now),
    }
}

fn gcra_policies() -> [GcraPolicy; 3] {
    let base = gcra("model.a", 3, 1_000, 4);
    [base.clone(), gcra("model.b", 1, 700, 3), base.with_quota_mode(QuotaMode::Shadow)]
}

/// GCRA in the scaled-integer form documented in `runlimit_core::backend::gcra`: state is the scaled arrival time (ms × Q).
fn gcra_evaluate(
    policy: &GcraPolicy,
    tat: Option<u128>,
    now: u64,
    cost: u64,
) -> Result<(u64, u64, u128), u64> {
    let q = u128::from(policy.quota().get());
    let p = u128::from(policy.period().as_millis());
    let b = u128::from(policy.burst_capacity().get());
    let now_s = u128::from(now) * q;
    let base = tat.map_or(now_s, |tat| tat.max(now_s));
    let cand = base + u128::from(cost) * p;
    let ceiling = now_s + b * p;
    let narrow = |value: u128| u64::try_from(value).unwrap();
    if cand <= ceiling {
        Ok((narrow((ceiling - cand) / p), narrow((cand - now_s).div_ceil(q)), cand))
    } else {
        Err(narrow((cand - ceiling).div_ceil(q)))
    }
}

/// A fixed-window snapshot from its definition: `L − used` left, every unit back at the
/// deadline.
fn fixed_peek(policy: &FixedWindowPolicy, live: Option<(u64, u64)>, now: u64) -> (u64, Option<u64>, u64) {
    let limit = policy.limit().get();
    match live {
        None => (limit, None, 0),
        Some((deadline, used)) => (limit.saturating_sub(used), Some(deadline - now), deadline - now),
    }
}

/// A GCRA snapshot in the same scaled-integer form: the largest cost that fits now, the wait until one more
/// unit fits (the retry of a cost of `available + 1`), and the wait until fully rested.
fn gcra_peek(policy: &GcraPolicy, tat: Option<u128>, now: u64) -> (u64, Option<u64>, u64) {
    let burst = policy.burst_capacity().get();
    let available =
        (1..=burst).rev().find(|&cost| gcra_evaluate(policy, tat, now, cost).is_ok()).unwrap_or(0);
    if available == burst {
        return (burst, None, 0);
    }
    let next = gcra_evaluate(policy, tat, now, available + 1).unwrap_err();
    let q = u128::from(policy.quota().get());
    let now_s = u128::from(now) * q;
    let ahead = tat.map_or(0, |tat| tat.saturating_sub(now_s));
    (available, Some(next), u64::try_from(ahead.div_ceil(q)).unwrap())
}

fn gcra_expiry(policy: &GcraPolicy, tat: u128) -> u64 {
    u64::try_from(tat.div_ceil(u128::from(policy.quota().get()))).unwrap()
}

/// One shard of 5 keys. Batches of 5 (at most the shard's capacity, so never
/// `BatchExceedsShardCapacity`) take the store's general batch path on one shard.
fn bounded_config() -> MemoryStoreConfig {
    MemoryStoreConfig::new(5)
        .and_then(|c| c.with_expired_removals_per_check(64))
        .and_then(|c| c.with_maximum_batch_size(5))
        .unwrap()
}

/// Four shards, batches of up to 8 checks: one, two, three or four shards per batch.
fn sharded_config() -> MemoryStoreConfig {
    MemoryStoreConfig::new(1_000)
        .and_then(|c| c.with_shard_count(4))
        .and_then(|c| c.with_maximum_batch_size(8))
        .unwrap()
}

fn memory_error(error: MemoryBatchError) -> BatchError {
    match error {
        MemoryBatchError::InvalidBatch { source } => source,
        other => panic!("unexpected store error {other:?}"),
    }
}

fn gcra_error(error: GcraBatchError) -> BatchError {
    match error {
        GcraBatchError::Store { source } => memory_error(source),
        other => panic!("unexpected store error {other:?}"),
    }
}

fn run_fixed(config: MemoryStoreConfig, capacity: Option<usize>, ops: &[Op]) -> Result<(), TestCaseError> {
    let clock = ManualClock::new();
    let store = MemoryStore::builder(config).with_clock(clock.clone()).build();
    let policies = fixed_policies();
    let mut model = Model {
        policies: &policies,
        evaluate: fixed_evaluate,
        peek: fixed_peek,
        expiry: |_, (deadline, _)| deadline,
        capacity,
        maximum_batch_size: config.maximum_batch_size(),
        states: HashMap::new(),
    };
    drive(
        &mut model,
        &clock,
        ops,
        |c| store.check(c).unwrap(),
        |c| store.check_all(c).map_err(memory_error),
        |s| store.peek(s).unwrap(),
        |s| store.reset(s).unwrap(),
    )
}

fn run_gcra(config: MemoryStoreConfig, capacity: Option<usize>, ops: &[Op]) -> Result<(), TestCaseError> {
    let clock = ManualClock::new();
    let store = GcraStore::builder(config).with_clock(clock.clone()).build();
    let policies = gcra_policies();
    let mut model = Model {
        policies: &policies,
        evaluate: gcra_evaluate,
        peek: gcra_peek,
        expiry: gcra_expiry,
        capacity,
        maximum_batch_size: config.maximum_batch_size(),
        states: HashMap::new(),
    };
    drive(
        &mut model,
        &clock,
        ops,
        |c| store.check(c).unwrap(),
        |c| store.check_all(c).map_err(gcra_error),
        |s| store.peek(s).unwrap(),
        |s| store.reset(s).unwrap(),
    )
}

/// Every decision and reset result of `ops` on a fresh store, each operation preceded by a
/// peek of every key when `peeking` (and the store's own peeks dropped from `ops` otherwise).
/// Comparing the two runs shows that peeks never change what checks decide.
macro_rules! outcomes {
    ($store:expr, $policies:expr, $clock:expr, $ops:expr, $peeking:expr) => {{
        let (store, policies, clock) = ($store, $policies, $clock);
        let mut outcomes = Vec::new();
        let mut now = 0u64;
        for op in $ops {
            if $peeking {
                for policy in 0..3 {
                    for n in 0..6 {
                        let _ = store.peek(subject(&policies[policy], n)).unwrap();
                    }
                }
            }
            match op {
                Op::Advance(by) => {
                    now += by;
                    clock.set(Duration::from_millis(now));
                }
                &Op::Check(key) => {
                    outcomes.push(format!("{:?}", store.check(&costed(policies, key)).unwrap()))
                }
                Op::Batch(batch) => {
                    let checks: Vec<_> = batch.iter().map(|&key| costed(policies, key)).collect();
                    outcomes
                        .push(format!("{:?}", store.check_all(&checks).map_err(|error| error.to_string())));
                }
                &Op::Reset(key) => {
                    outcomes.push(format!("{:?}", store.reset(subject(&policies[key.0], key.1))))
                }
                Op::Peek(_) => {}
            }
        }
        outcomes
    }};
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn fixed_window_store_matches_the_model_under_capacity_pressure(ops in ops(5)) {
        run_fixed(bounded_config(), Some(5), &ops)?;
    }

    #[test]
    fn fixed_window_store_matches_the_model_across_shards(ops in ops(8)) {
        run_fixed(sharded_config(), None, &ops)?;
    }

    #[test]
    fn gcra_store_matches_the_model_under_capacity_pressure(ops in ops(5)) {
        run_gcra(bounded_config(), Some(5), &ops)?;
    }

    #[test]
    fn peeks_never_change_fixed_window_decisions(ops in ops(5)) {
        let policies = fixed_policies();
        let run = |peeking: bool| {
            let clock = ManualClock::new();
            let store = MemoryStore::builder(bounded_config()).with_clock(clock.clone()).build();
            outcomes!(&store, &policies, &clock, &ops, peeking)
        };
        prop_assert_eq!(run(true), run(false));
    }

    #[test]
    fn peeks_never_change_gcra_decisions(ops in ops(5)) {
        let policies = gcra_policies();
        let run = |peeking: bool| {
            let clock = ManualClock::new();
            let store = GcraStore::builder(bounded_config()).with_clock(clock.clone()).build();
            outcomes!(&store, &policies, &clock, &ops, peeking)
        };
        prop_assert_eq!(run(true), run(false));
    }

    #[test]
    fn gcra_store_matches_the_model_across_shards(ops in ops(8)) {
        run_gcra(sharded_config(), None, &ops)?;
    }
}
