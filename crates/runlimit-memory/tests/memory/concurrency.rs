//! Many threads hammering the same keys through `check_all` and `check`: no key is ever
//! admitted beyond its limit within a window, and no batch half-commits.

use std::{
    sync::{Arc, Barrier},
    thread,
};

use runlimit_core::{BatchDecisionView, Check, DecisionView, FixedWindowPolicy, GcraPolicy, RateLimitPolicy};
use runlimit_memory::{GcraStore, ManualClock, MemoryStore, MemoryStoreConfig};

use crate::support::{fixed, gcra, subject};

const THREADS: usize = 8;
const OPERATIONS: usize = 3_000;
const KEYS: u64 = 6;
const KEY_COUNT: usize = 6;

/// A tiny deterministic generator per thread (xorshift64*).
struct Rng(u64);

impl Rng {
    fn below(&mut self, bound: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % bound
    }
}

/// Runs the hammer and returns, per key, how many units the threads saw admitted.
fn hammer<P: RateLimitPolicy>(
    policy: &P,
    check: impl Fn(&Check<'_, P>) -> bool + Sync,
    check_all: impl Fn(&[Check<'_, P>]) -> bool + Sync,
) -> Vec<u64> {
    let barrier = Barrier::new(THREADS);
    let per_thread: Vec<Vec<u64>> = thread::scope(|scope| {
        let handles: Vec<_> = (0..THREADS)
            .map(|thread_index| {
                let (barrier, check, check_all) = (&barrier, &check, &check_all);
                scope.spawn(move || {
                    let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ (thread_index as u64 + 1));
                    let mut admitted = vec![0u64; KEY_COUNT];
                    barrier.wait();
                    for _ in 0..OPERATIONS {
                        let first = rng.below(KEYS);
                        if rng.below(4) == 0 {
                            if check(&Check::new(subject(policy, first))) {
                                admitted[usize::try_from(first).unwrap()] += 1;
                            }
                        } else {
                            let second = (first + 1 + rng.below(KEYS - 1)) % KEYS;
                            let batch =
                                [Check::new(subject(policy, first)), Check::new(subject(policy, second))];
                            if check_all(&batch) {
                                admitted[usize::try_from(first).unwrap()] += 1;
                                admitted[usize::try_from(second).unwrap()] += 1;
                            }
                        }
                    }
                    admitted
                })
            })
            .collect();
        handles.into_iter().map(|handle| handle.join().unwrap()).collect()
    });
    (0..KEY_COUNT).map(|key| per_thread.iter().map(|counts| counts[key]).sum()).collect()
}

fn batch_admitted(view: BatchDecisionView<'_>) -> bool {
    matches!(view, BatchDecisionView::Allowed { .. })
}

#[test]
fn fixed_windows_never_over_admit_and_batches_never_half_commit() {
    const LIMIT: u64 = 200;
    let config = MemoryStoreConfig::new(64).unwrap().with_shard_count(4).unwrap();
    let store = Arc::new(MemoryStore::builder(config).with_clock(ManualClock::new()).build());
    let policy: FixedWindowPolicy = fixed("hammer", LIMIT, 3_600_000);
    let admitted = hammer(
        &policy,
        |check| matches!(store.check(check).unwrap().view(), DecisionView::Allowed { .. }),
        |checks| batch_admitted(store.check_all(checks).unwrap().view()),
    );
    for (key, &count) in admitted.iter().enumerate() {
        assert!(count <= LIMIT, "key {key} admitted {count} > {LIMIT}");
        // The store's counter equals exactly what the threads saw committed: a half-committed
        // batch would leave the store ahead of the observed admissions.
        let probe = store.check(&Check::new(subject(&policy, key as u64))).unwrap();
        match probe.view() {
            DecisionView::Allowed { allowance } => {
                assert_eq!(allowance.available(), LIMIT - count - 1, "key {key}")
            }
            DecisionView::Denied { .. } => assert_eq!(count, LIMIT, "key {key}"),
            DecisionView::ShadowDenied { .. } => unreachable!(),
        }
    }
    // With far more attempts than quota, the keys were driven to exhaustion.
    assert!(admitted.iter().filter(|&&count| count == LIMIT).count() >= 4, "{admitted:?}");
}

#[test]
fn gcra_never_over_admits_under_contention() {
    const BURST: u64 = 150;
    let config = MemoryStoreConfig::new(64).unwrap().with_shard_count(3).unwrap();
    let store = GcraStore::builder(config).with_clock(ManualClock::new()).build();
    // One unit per hour: with a frozen clock, exactly the burst is available.
    let policy: GcraPolicy = gcra("hammer", 1, 3_600_000, BURST);
    let admitted = hammer(
        &policy,
        |check| matches!(store.check(check).unwrap().view(), DecisionView::Allowed { .. }),
        |checks| batch_admitted(store.check_all(checks).unwrap().view()),
    );
    for (key, &count) in admitted.iter().enumerate() {
        assert!(count <= BURST, "key {key} admitted {count} > {BURST}");
        let probe = store.check(&Check::new(subject(&policy, key as u64))).unwrap();
        match probe.view() {
            DecisionView::Allowed { allowance } => {
                assert_eq!(allowance.available(), BURST - count - 1, "key {key}")
            }
            DecisionView::Denied { .. } => assert_eq!(count, BURST, "key {key}"),
            DecisionView::ShadowDenied { .. } => unreachable!(),
        }
    }
}
