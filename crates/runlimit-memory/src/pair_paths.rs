//! The two-check paths (`Engine::check_pair_on_one_shard`, `check_pair_on_two_shards`)
//! against the grouped path: both engines run the same random operations and every report
//! (decision, headroom, denied index, consumption, cleanup counts) and the occupancy of every
//! shard must be equal. Beyond what `batch_paths.rs` generates: weighted costs, one subject key
//! bound to two policies (both keys on one shard), clocks near `u64::MAX` (GCRA evaluation
//! errors at index 0 and at index 1), unobserved checks (`timed = false`) and poisoned
//! shards.

use proptest::prelude::*;
use runlimit_core::{Check, FixedWindowPolicy, GcraPolicy, PolicySubject, QuotaMode};

use crate::{
    MemoryStoreConfig,
    algorithm::sealed::Algorithm,
    batch_paths::{config_of_up_to, fixed, gcra, outcome, subjects},
    engine::{Engine, Observed},
};

#[derive(Clone, Debug)]
enum Op {
    Clock(u64),
    Advance(u64),
    Check(usize, u64, u64),
    /// Two checks: (policy, subject, cost, bind to the first check's subject key).
    Pair([(usize, u64, u64); 2], bool),
    Poison(usize),
}

fn ops() -> impl Strategy<Value = Vec<Op>> {
    let pick = (0usize..3, 0u64..10, 1u64..=2);
    let op = prop_oneof![
        5 => prop_oneof![
            0u64..3_000,
            Just(u64::MAX - 1_000),
            Just(u64::MAX - 300),
            Just(u64::MAX - 160),
            Just(u64::MAX),
        ].prop_map(Op::Clock),
        15 => prop_oneof![0u64..50, 0u64..700, Just(100u64), Just(300), Just(500)].prop_map(Op::Advance),
        15 => pick.clone().prop_map(|(p, n, c)| Op::Check(p, n, c)),
        40 => (pick.clone(), pick, any::<bool>()).prop_map(|(a, b, bound)| Op::Pair([a, b], bound)),
        1 => prop_oneof![Just(0usize), 0usize..3].prop_map(Op::Poison),
    ];
    proptest::collection::vec(op, 1..60)
}

fn run<A: Algorithm>(
    config: MemoryStoreConfig,
    policies: &[A; 3],
    ops: &[Op],
    timed: bool,
) -> Result<(), TestCaseError>
where
    A::Error: std::fmt::Debug,
{
    let subjects = subjects(policies);
    let check = |(policy, n, cost): (usize, u64, u64), bound: Option<PolicySubject<'_, A>>| {
        let subject = match bound {
            Some(other) => other.into_unbound_subject_key().bind(&policies[policy]),
            None => subjects[policy][usize::try_from(n).unwrap()],
        };
        let check = Check::new(subject);
        check.with_cost(cost).unwrap_or(check)
    };
    let (pair, grouped) = (Engine::new(config), Engine::new(config));
    let mut now = 0u64;
    for (step, op) in ops.iter().enumerate() {
        match op {
            Op::Clock(at) => now = *at,
            Op::Advance(by) => now = now.saturating_add(*by),
            &Op::Check(policy, n, cost) => {
                let c = check((policy, n, cost), None);
                let (mut seen, mut expected) = (Observed::default(), Observed::default());
                let a = pair.check::<A>(&c, now, timed.then_some(&mut seen));
                let b = grouped.check::<A>(&c, now, timed.then_some(&mut expected));
                let (seen, expected) = (timed.then_some(seen), timed.then_some(expected));
                prop_assert_eq!(outcome(a, seen), outcome(b, expected), "step {}: {:?}", step, op);
            }
            Op::Pair([first, second], bound) => {
                let one = check(*first, None);
                let two = check(*second, bound.then(|| subjects[first.0][usize::try_from(first.1).unwrap()]));
                let checks = [one, two];
                let (mut seen, mut expected) = (Observed::default(), Observed::default());
                let a = pair.check_all::<A>(&checks, now, timed.then_some(&mut seen));
                let b = grouped.check_all_grouped::<A>(&checks, now, timed.then_some(&mut expected));
                let (seen, expected) = (timed.then_some(seen), timed.then_some(expected));
                prop_assert_eq!(outcome(a, seen), outcome(b, expected), "step {}: {:?}", step, op);
            }
            &Op::Poison(shard) => {
                if shard < config.shard_count() {
                    pair.poison_shard(shard);
                    grouped.poison_shard(shard);
                }
            }
        }
        prop_assert_eq!(pair.stats(), grouped.stats(), "shard occupancy after step {}", step);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2_048, ..ProptestConfig::default() })]

    #[test]
    fn fixed_window_pairs_agree_with_the_grouped_path(config in config_of_up_to(4), ops in ops(), timed in any::<bool>()) {
        let base = fixed("a", 2, 300);
        let policies = [base.clone(), fixed("b", 1, 500), base.with_quota_mode(QuotaMode::Shadow)];
        run::<FixedWindowPolicy>(config, &policies, &ops, timed)?;
    }

    #[test]
    fn gcra_pairs_agree_with_the_grouped_path(config in config_of_up_to(4), ops in ops(), timed in any::<bool>()) {
        let base = gcra("a", 2, 300, 2);
        let policies = [base.clone(), gcra("b", 1, 500, 1), base.with_quota_mode(QuotaMode::Shadow)];
        run::<GcraPolicy>(config, &policies, &ops, timed)?;
    }
}
