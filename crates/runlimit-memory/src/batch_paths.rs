//! The two batch paths against each other: batches of up to four checks on at most two
//! shards take `Engine::check_small`, everything else the grouped path. Both engines run the
//! same random operations (small, unevenly divided shards, so capacity pressure and storage
//! denials happen on every path; clock readings that go backwards; shadow batches), one with
//! every batch forced through the grouped path, and every report (decision, headroom, denied
//! index, consumption, cleanup counts) and the occupancy of every shard must be equal.
//!
//! The reference-model tests in `tests/memory/model.rs` check the rules themselves but model
//! capacity only for one shard; this closes that gap for the two-shard small path.

use std::time::Duration;

use proptest::prelude::*;
use runlimit_core::{
    Check, FixedWindowPolicy, GcraPolicy, KeyHasher, PolicyId, PolicySubject, QuotaMode, ScopeId,
};

use crate::{
    MemoryStoreConfig,
    algorithm::sealed::Algorithm,
    engine::{Engine, Observed},
};

#[derive(Clone, Debug)]
enum Op {
    /// Set the clock reading (it may go backwards: the shards' watermarks must clamp it).
    Clock(u64),
    Advance(u64),
    Check(usize, u64),
    Batch(Vec<(usize, u64)>),
}

fn ops() -> impl Strategy<Value = Vec<Op>> {
    let op = prop_oneof![
        1 => (0u64..3_000).prop_map(Op::Clock),
        3 => prop_oneof![0u64..50, 0u64..700, Just(100u64), Just(300), Just(500)].prop_map(Op::Advance),
        3 => (0usize..3, 0u64..10).prop_map(|(policy, n)| Op::Check(policy, n)),
        // Any policies (mixed modes and duplicates included), then enforced-only and
        // shadow-only batches, which reach evaluation more often.
        6 => proptest::collection::vec((0usize..3, 0u64..10), 1..=6).prop_map(Op::Batch),
        4 => proptest::collection::vec((0usize..2, 0u64..10), 1..=4).prop_map(Op::Batch),
        2 => proptest::collection::vec((2usize..3, 0u64..10), 1..=4).prop_map(Op::Batch),
    ];
    proptest::collection::vec(op, 1..60)
}

/// 1 to 3 shards holding 1 to 10 keys in all (so shard capacities differ by one), 1 to 3
/// expired removals per check.
fn config() -> impl Strategy<Value = MemoryStoreConfig> {
    config_of_up_to(3)
}

/// 1 to `shards` shards holding 1 to 10 keys in all, 1 to 3 expired removals per check,
/// batches of up to six checks.
pub(crate) fn config_of_up_to(shards: usize) -> impl Strategy<Value = MemoryStoreConfig> {
    (1usize..=shards, 1usize..=10, 1usize..=3).prop_filter_map(
        "a valid configuration",
        |(shards, keys, removals)| {
            MemoryStoreConfig::new(keys)
                .and_then(|config| config.with_shard_count(shards))
                .and_then(|config| config.with_expired_removals_per_check(removals))
                .and_then(|config| config.with_maximum_batch_size(6))
                .ok()
        },
    )
}

/// An engine's answer as text: the decision or failure and, for an observed operation, what
/// the observer reads (without the cleanup's wall-clock time).
pub(crate) fn outcome<D: std::fmt::Debug, F: std::fmt::Debug>(
    result: Result<D, F>,
    observed: Option<Observed>,
) -> String {
    match (result, observed) {
        (Ok(decision), Some(mut observed)) => {
            observed.cleanup.elapsed = Duration::ZERO;
            format!("{decision:?} {observed:?}")
        }
        (Ok(decision), None) => format!("{decision:?}"),
        (Err(failure), _) => format!("Err({failure:?})"),
    }
}

fn run<A: Algorithm>(config: MemoryStoreConfig, policies: &[A; 3], ops: &[Op]) -> Result<(), TestCaseError>
where
    A::Error: std::fmt::Debug,
{
    let subjects = subjects(policies);
    let subject = |policy: usize, n: u64| subjects[policy][usize::try_from(n).unwrap()];
    let (small, grouped) = (Engine::new(config), Engine::new(config));
    let mut now = 0u64;
    for (step, op) in ops.iter().enumerate() {
        match op {
            Op::Clock(at) => now = *at,
            Op::Advance(by) => now += by,
            &Op::Check(policy, n) => {
                let check = Check::new(subject(policy, n));
                let (mut seen, mut expected) = (Observed::default(), Observed::default());
                let a = small.check::<A>(&check, now, Some(&mut seen));
                let b = grouped.check::<A>(&check, now, Some(&mut expected));
                prop_assert_eq!(
                    outcome(a, Some(seen)),
                    outcome(b, Some(expected)),
                    "step {}: {:?}",
                    step,
                    op
                );
            }
            Op::Batch(keys) => {
                let checks: Vec<_> = keys.iter().map(|&(policy, n)| Check::new(subject(policy, n))).collect();
                let (mut seen, mut expected) = (Observed::default(), Observed::default());
                let a = small.check_all::<A>(&checks, now, Some(&mut seen));
                let b = grouped.check_all_grouped::<A>(&checks, now, Some(&mut expected));
                prop_assert_eq!(
                    outcome(a, Some(seen)),
                    outcome(b, Some(expected)),
                    "step {}: {:?}",
                    step,
                    op
                );
            }
        }
        prop_assert_eq!(small.stats(), grouped.stats(), "shard occupancy after step {}", step);
    }
    Ok(())
}

/// Subjects 0 to 9 of each policy, `subjects[policy][n]`, keyed by a fixed test secret.
pub(crate) fn subjects<A: Algorithm>(policies: &[A; 3]) -> Vec<Vec<PolicySubject<'_, A>>> {
    let hasher = KeyHasher::new(&[7; 32]).unwrap();
    policies
        .iter()
        .map(|policy| (0..10u64).map(|n| hasher.hash_for(policy, &n.to_be_bytes())).collect())
        .collect()
}

pub(crate) fn fixed(id: &str, limit: u64, window_ms: u64) -> FixedWindowPolicy {
    let window = Duration::from_millis(window_ms);
    FixedWindowPolicy::new(PolicyId::new(id).unwrap(), ScopeId::new("t").unwrap(), limit, window).unwrap()
}

pub(crate) fn gcra(id: &str, quota: u64, period_ms: u64, burst: u64) -> GcraPolicy {
    let period = Duration::from_millis(period_ms);
    GcraPolicy::new(PolicyId::new(id).unwrap(), ScopeId::new("t").unwrap(), quota, period, burst).unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1_024, ..ProptestConfig::default() })]

    #[test]
    fn fixed_window_batch_paths_agree(config in config(), ops in ops()) {
        let base = fixed("a", 2, 300);
        let policies = [base.clone(), fixed("b", 1, 500), base.with_quota_mode(QuotaMode::Shadow)];
        run::<FixedWindowPolicy>(config, &policies, &ops)?;
    }

    #[test]
    fn gcra_batch_paths_agree(config in config(), ops in ops()) {
        let base = gcra("a", 2, 300, 2);
        let policies = [base.clone(), gcra("b", 1, 500, 1), base.with_quota_mode(QuotaMode::Shadow)];
        run::<GcraPolicy>(config, &policies, &ops)?;
    }
}
