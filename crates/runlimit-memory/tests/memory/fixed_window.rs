//! Anchored fixed-window semantics with a manual clock, asserting exact values.

use std::time::Duration;

use runlimit_core::{Check, QuotaMode};
use runlimit_memory::{ManualClock, MemoryStore, MemoryStoreConfig};

use crate::support::{allowed, fixed, quota_denied, shadow_denied, subject};

fn store(max_keys: usize) -> (MemoryStore<ManualClock>, ManualClock) {
    let clock = ManualClock::new();
    let store =
        MemoryStore::builder(MemoryStoreConfig::new(max_keys).unwrap()).with_clock(clock.clone()).build();
    (store, clock)
}

#[test]
fn first_allowed_check_anchors_the_window_and_counts_down() {
    let (store, clock) = store(10);
    let policy = fixed("login", 3, 1_000);
    let check = Check::new(subject(&policy, 1));
    clock.set(Duration::from_millis(5_000));
    assert_eq!(allowed(&store.check(&check).unwrap()), (2, 1_000));
    clock.advance_millis(100);
    assert_eq!(allowed(&store.check(&check).unwrap()), (1, 900));
    clock.advance_millis(100);
    assert_eq!(allowed(&store.check(&check).unwrap()), (0, 800));
    clock.advance_millis(100);
    assert_eq!(quota_denied(&store.check(&check).unwrap()), (3, 700));
    clock.set(Duration::from_millis(5_999));
    assert_eq!(quota_denied(&store.check(&check).unwrap()), (3, 1));
}

#[test]
fn the_window_reanchors_exactly_at_the_deadline_not_before() {
    let (store, clock) = store(10);
    let policy = fixed("login", 1, 60_000);
    let check = Check::new(subject(&policy, 1));
    clock.set(Duration::from_millis(250));
    assert_eq!(allowed(&store.check(&check).unwrap()), (0, 60_000));
    clock.set(Duration::from_millis(60_249));
    assert_eq!(quota_denied(&store.check(&check).unwrap()), (1, 1));
    clock.set(Duration::from_millis(60_250));
    // A new window anchored at 60_250, by this check, ending at 120_250.
    assert_eq!(allowed(&store.check(&check).unwrap()), (0, 60_000));
    clock.set(Duration::from_millis(90_250));
    assert_eq!(quota_denied(&store.check(&check).unwrap()), (1, 30_000));
}

#[test]
fn a_late_first_check_after_an_idle_gap_anchors_at_its_own_time() {
    let (store, clock) = store(10);
    let policy = fixed("login", 2, 1_000);
    let check = Check::new(subject(&policy, 1));
    assert_eq!(allowed(&store.check(&check).unwrap()), (1, 1_000));
    // Long after the window ended: not aligned to multiples of the window.
    clock.set(Duration::from_millis(3_700));
    assert_eq!(allowed(&store.check(&check).unwrap()), (1, 1_000));
    clock.set(Duration::from_millis(4_699));
    assert_eq!(allowed(&store.check(&check).unwrap()), (0, 1));
}

#[test]
fn denied_checks_consume_nothing_and_do_not_move_the_anchor() {
    let (store, clock) = store(10);
    let policy = fixed("login", 2, 1_000);
    let check = Check::new(subject(&policy, 1));
    store.check(&check).unwrap();
    store.check(&check).unwrap();
    for at in [100, 500, 999] {
        clock.set(Duration::from_millis(at));
        assert_eq!(quota_denied(&store.check(&check).unwrap()), (2, 1_000 - u128::from(at)));
    }
    clock.set(Duration::from_millis(1_000));
    assert_eq!(allowed(&store.check(&check).unwrap()), (1, 1_000));
}

#[test]
fn shadow_exhaustion_admits_consumes_nothing_and_shares_counters_with_enforcement() {
    let (store, clock) = store(10);
    let enforced = fixed("login", 2, 1_000);
    let shadow = enforced.clone().with_quota_mode(QuotaMode::Shadow);
    let shadow_check = Check::new(subject(&shadow, 7));
    assert_eq!(allowed(&store.check(&shadow_check).unwrap()), (1, 1_000));
    assert_eq!(allowed(&store.check(&shadow_check).unwrap()), (0, 1_000));
    clock.advance_millis(400);
    let decision = store.check(&shadow_check).unwrap();
    assert!(decision.permits_request());
    assert_eq!(shadow_denied(&decision), (2, 600));
    assert_eq!(shadow_denied(&store.check(&shadow_check).unwrap()), (2, 600));
    // Same fingerprint: switching to enforcement keeps the warmed counter.
    let enforced_check = Check::new(subject(&enforced, 7));
    assert_eq!(quota_denied(&store.check(&enforced_check).unwrap()), (2, 600));
    clock.advance_millis(600);
    assert_eq!(allowed(&store.check(&enforced_check).unwrap()), (1, 1_000));
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
