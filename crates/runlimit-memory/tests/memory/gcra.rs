//! GcraStore against the verified vectors of the GCRA notes (`gcra.md` §8), with a manual clock.

use std::time::Duration;

use runlimit_core::{Check, GcraPolicy, QuotaMode};
use runlimit_memory::{GcraStore, ManualClock, MemoryStoreConfig};

use crate::support::{allowed, gcra, quota_denied, shadow_denied, subject};

/// `Ok((remaining, replenish ms))` or `Err(retry ms)` at a time in ms.
type Step = (u64, Result<(u64, u128), u128>);

fn run(policy: &GcraPolicy, steps: &[Step]) {
    let clock = ManualClock::new();
    let store = GcraStore::builder(MemoryStoreConfig::new(4).unwrap()).with_clock(clock.clone()).build();
    let check = Check::new(subject(policy, 1));
    for (i, &(at, expected)) in steps.iter().enumerate() {
        clock.set(Duration::from_millis(at));
        let decision = store.check(&check).unwrap();
        match expected {
            Ok(want) => assert_eq!(allowed(&decision), want, "step {i} at {at} ms"),
            Err(retry) => {
                assert_eq!(
                    quota_denied(&decision),
                    (policy.burst_capacity().get(), retry),
                    "step {i} at {at} ms"
                )
            }
        }
    }
}

#[test]
fn vector_v1_burst_then_steady_rate() {
    // Q = 10 per 1000 ms, burst 20 (T = 100 ms).
    let mut steps: Vec<Step> = (0..20).map(|i| (0, Ok((19 - i, 100 * u128::from(i + 1))))).collect();
    steps.extend([
        (0, Err(100)),
        (100, Ok((0, 2_000))),
        (150, Err(50)),
        (199, Err(1)),
        (200, Ok((0, 2_000))),
        // Steady rate: one unit every 100 ms, no more.
        (300, Ok((0, 2_000))),
        (400, Ok((0, 2_000))),
        (450, Err(50)),
        (3_000, Ok((19, 100))),
    ]);
    run(&gcra("api", 10, 1_000, 20), &steps);
}

#[test]
fn vector_v2_non_integer_emission_interval() {
    run(
        &gcra("api", 3, 1_000, 2),
        &[
            (0, Ok((1, 334))),
            (0, Ok((0, 667))),
            (0, Err(334)),
            (333, Err(1)),
            (334, Ok((0, 666))),
            (667, Ok((0, 667))),
            (1_000, Ok((0, 667))),
            (5_000, Ok((1, 334))),
        ],
    );
}

#[test]
fn vector_v3_one_per_minute() {
    run(
        &gcra("api", 1, 60_000, 1),
        &[
            (0, Ok((0, 60_000))),
            (1, Err(59_999)),
            (59_999, Err(1)),
            (60_000, Ok((0, 60_000))),
            (60_000, Err(60_000)),
        ],
    );
}

#[test]
fn vector_v5_half_second_interval() {
    run(
        &gcra("api", 2, 1_000, 4),
        &[
            (0, Ok((3, 500))),
            (0, Ok((2, 1_000))),
            (0, Ok((1, 1_500))),
            (0, Ok((0, 2_000))),
            (0, Err(500)),
            (250, Err(250)),
            (499, Err(1)),
            (500, Ok((0, 2_000))),
            (1_250, Ok((0, 1_750))),
            (2_000, Ok((1, 1_500))),
            (2_001, Ok((0, 1_999))),
        ],
    );
}

#[test]
fn gcra_shadow_exhaustion_consumes_nothing() {
    let clock = ManualClock::new();
    let store = GcraStore::builder(MemoryStoreConfig::new(4).unwrap()).with_clock(clock.clone()).build();
    let shadow = gcra("api", 2, 1_000, 2).with_quota_mode(QuotaMode::Shadow);
    let check = Check::new(subject(&shadow, 1));
    assert_eq!(allowed(&store.check(&check).unwrap()), (1, 500));
    assert_eq!(allowed(&store.check(&check).unwrap()), (0, 1_000));
    clock.set(Duration::from_millis(100));
    for _ in 0..3 {
        assert_eq!(shadow_denied(&store.check(&check).unwrap()), (2, 400));
    }
    clock.set(Duration::from_millis(500));
    assert_eq!(allowed(&store.check(&check).unwrap()), (0, 1_000));
}

#[test]
fn gcra_entries_expire_when_fully_replenished() {
    // V2 state after two hits at 0 ms: tat = 2000 scaled, expiry ⌈2000 / 3⌉ = 667 ms.
    let clock = ManualClock::new();
    let store = GcraStore::builder(MemoryStoreConfig::new(4).unwrap()).with_clock(clock.clone()).build();
    let policy = gcra("api", 3, 1_000, 2);
    let first = Check::new(subject(&policy, 1));
    let other = Check::new(subject(&policy, 2));
    store.check(&first).unwrap();
    store.check(&first).unwrap();
    clock.set(Duration::from_millis(666));
    store.check(&other).unwrap();
    assert_eq!(store.stats().entries(), 2);
    clock.set(Duration::from_millis(667));
    store.check(&other).unwrap();
    assert_eq!(store.stats().entries(), 1, "the fully rested entry is removed at 667 ms, not before");
    // Removing it changed nothing: the subject is fully rested either way.
    assert_eq!(allowed(&store.check(&first).unwrap()), (1, 334));
}
