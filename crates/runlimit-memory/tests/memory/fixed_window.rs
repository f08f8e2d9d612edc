//! Fixed-window behaviour of the memory store with a manual clock, asserting exact values: its
//! clock handling (clamping, truncation) and its stats. The rules every backend shares are
//! scenarios of the conformance suite (`tests/conformance.rs`).

use std::time::Duration;

use runlimit_core::Check;
use runlimit_memory::{ManualClock, MemoryStore, MemoryStoreConfig};

use crate::support::{allowed, fixed, quota_denied, subject};

fn store(max_keys: usize) -> (MemoryStore<ManualClock>, ManualClock) {
    let clock = ManualClock::new();
    let store =
        MemoryStore::builder(MemoryStoreConfig::new(max_keys).unwrap()).with_clock(clock.clone()).build();
    (store, clock)
}

#[test]
fn every_policy_parameter_starts_an_independent_counter() {
    let (store, _clock) = store(10);
    let base = fixed("login", 1, 1_000);
    let other_limit = fixed("login", 2, 1_000);
    let other_window = fixed("login", 1, 2_000);
    let other_id = fixed("signup", 1, 1_000);
    assert_eq!(allowed(&store.check(&Check::new(subject(&base, 1))).unwrap()), (0, 1_000));
    assert_eq!(quota_denied(&store.check(&Check::new(subject(&base, 1))).unwrap()), (1, 1_000));
    assert_eq!(allowed(&store.check(&Check::new(subject(&other_limit, 1))).unwrap()), (1, 1_000));
    assert_eq!(allowed(&store.check(&Check::new(subject(&other_window, 1))).unwrap()), (0, 2_000));
    assert_eq!(allowed(&store.check(&Check::new(subject(&other_id, 1))).unwrap()), (0, 1_000));
    assert_eq!(allowed(&store.check(&Check::new(subject(&base, 2))).unwrap()), (0, 1_000));
    assert_eq!(store.stats().entries(), 5);
}

#[test]
fn a_backwards_clock_is_clamped_to_the_latest_reading() {
    let (store, clock) = store(10);
    let policy = fixed("login", 1, 1_000);
    let check = Check::new(subject(&policy, 1));
    clock.set(Duration::from_millis(10_000));
    assert_eq!(allowed(&store.check(&check).unwrap()), (0, 1_000));
    clock.set(Duration::from_millis(500));
    // Still evaluated at 10_000: the window has not ended early.
    assert_eq!(quota_denied(&store.check(&check).unwrap()), (1, 1_000));
    clock.set(Duration::from_millis(10_999));
    assert_eq!(quota_denied(&store.check(&check).unwrap()), (1, 1));
}

#[test]
fn sub_millisecond_clock_readings_are_truncated() {
    let (store, clock) = store(10);
    let policy = fixed("login", 1, 1_000);
    let check = Check::new(subject(&policy, 1));
    clock.set(Duration::from_micros(1_999));
    assert_eq!(allowed(&store.check(&check).unwrap()), (0, 1_000));
    clock.set(Duration::from_micros(2_500));
    assert_eq!(quota_denied(&store.check(&check).unwrap()), (1, 999));
}
