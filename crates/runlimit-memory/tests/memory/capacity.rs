//! Hard bounds: per-shard capacity, storage-capacity denials, bounded cleanup, key floods.

use std::time::Duration;

use runlimit_core::{
    Check, CleanupOutcome, DecisionView, Denial, FixedWindowPolicy, GcraPolicy, RateLimitPolicy,
};
use runlimit_memory::{GcraStore, ManualClock, MemoryStore, MemoryStoreConfig};

use crate::support::{
    Recorder, Seen, allowed, batch_allowed, fixed, gcra, quota_denied, storage_denied, subject,
};

fn store(config: MemoryStoreConfig) -> (MemoryStore<ManualClock, Recorder>, ManualClock, Recorder) {
    let clock = ManualClock::new();
    let recorder = Recorder::default();
    let store =
        MemoryStore::builder(config).with_clock(clock.clone()).with_observer(recorder.clone()).build();
    (store, clock, recorder)
}

fn cleanups(seen: &[Seen]) -> Vec<(u64, u64)> {
    seen.iter()
        .filter_map(|seen| match seen {
            Seen::Cleanup { outcome: CleanupOutcome::Removed { count }, maximum } => Some((*count, *maximum)),
            _ => None,
        })
        .collect()
}

#[test]
fn a_full_shard_denies_new_keys_with_the_earliest_expiry_and_keeps_serving_live_ones() {
    let (store, clock, _) = store(MemoryStoreConfig::new(2).unwrap());
    let policy = fixed("p", 3, 1_000);
    let a = Check::new(subject(&policy, 1));
    let b = Check::new(subject(&policy, 2));
    let c = Check::new(subject(&policy, 3));
    store.check(&a).unwrap();
    clock.set(Duration::from_millis(200));
    store.check(&b).unwrap();
    clock.set(Duration::from_millis(300));
    assert_eq!(storage_denied(&store.check(&c).unwrap()), Some(700));
    assert_eq!(allowed(&store.check(&a).unwrap()), (1, 700), "live keys keep their counts");
    assert_eq!(allowed(&store.check(&b).unwrap()), (1, 900));
    clock.set(Duration::from_millis(999));
    assert_eq!(storage_denied(&store.check(&c).unwrap()), Some(1));
    clock.set(Duration::from_millis(1_000));
    // a's window ended: cleanup reclaims its slot for c.
    assert_eq!(allowed(&store.check(&c).unwrap()), (2, 1_000));
    assert_eq!(storage_denied(&store.check(&a).unwrap()), Some(200));
    let stats = store.stats();
    assert_eq!((stats.entries(), stats.capacity(), stats.headroom()), (2, 2, 0));
}

#[test]
fn each_check_removes_at_most_the_configured_number_of_expired_entries() {
    let config = MemoryStoreConfig::new(100).unwrap().with_expired_removals_per_check(3).unwrap();
    let (store, clock, recorder) = store(config);
    let policy = fixed("p", 5, 1_000);
    for n in 0..10 {
        store.check(&Check::new(subject(&policy, n))).unwrap();
    }
    recorder.take();
    clock.set(Duration::from_millis(1_000));
    let probe = Check::new(subject(&policy, 100));
    let mut entries = Vec::new();
    for _ in 0..5 {
        store.check(&probe).unwrap();
        entries.push(store.stats().entries());
    }
    // 10 expired: 3 go per check (the probe itself adds one entry on the first check).
    assert_eq!(entries, [8, 5, 2, 1, 1]);
    assert_eq!(cleanups(&recorder.take()), [(3, 3), (3, 3), (3, 3), (1, 3)]);
}

#[test]
fn a_batch_gets_the_cleanup_allowance_once_per_check_on_the_shard() {
    let config = MemoryStoreConfig::new(100).unwrap().with_expired_removals_per_check(2).unwrap();
    let (store, clock, recorder) = store(config);
    let policy = fixed("p", 5, 1_000);
    for n in 0..10 {
        store.check(&Check::new(subject(&policy, n))).unwrap();
    }
    recorder.take();
    clock.set(Duration::from_millis(1_000));
    let batch: Vec<_> = (100..103).map(|n| Check::new(subject(&policy, n))).collect();
    assert_eq!(batch_allowed(&store.check_all(&batch).unwrap()).len(), 3);
    assert_eq!(store.stats().entries(), 10 - 6 + 3);
    assert_eq!(cleanups(&recorder.take()), [(6, 6)]);
}

#[test]
fn a_stale_index_position_is_refreshed_to_report_the_exact_earliest_expiry() {
    // GCRA entries move their expiry on every allowed check without touching the index.
    let clock = ManualClock::new();
    let store = GcraStore::builder(MemoryStoreConfig::new(2).unwrap()).with_clock(clock.clone()).build();
    let policy = gcra("p", 1, 1_000, 2);
    let a = Check::new(subject(&policy, 1));
    let b = Check::new(subject(&policy, 2));
    assert_eq!(allowed(&store.check(&a).unwrap()), (1, 1_000));
    assert_eq!(allowed(&store.check(&a).unwrap()), (0, 2_000));
    assert_eq!(allowed(&store.check(&b).unwrap()), (1, 1_000));
    clock.set(Duration::from_millis(500));
    // a's indexed expiry (1000) is stale (real: 2000); b really expires at 1000.
    assert_eq!(storage_denied(&store.check(&Check::new(subject(&policy, 3))).unwrap()), Some(500));
    clock.set(Duration::from_millis(1_000));
    assert_eq!(allowed(&store.check(&Check::new(subject(&policy, 3))).unwrap()), (1, 1_000));
    assert_eq!(allowed(&store.check(&a).unwrap()), (0, 2_000));
    assert_eq!(quota_denied(&store.check(&a).unwrap()), (2, 1_000));
}

fn flood<P: RateLimitPolicy>(
    policy: &P,
    check: impl Fn(&Check<'_, P>) -> runlimit_core::Decision,
    stats: impl Fn() -> runlimit_memory::MemoryStoreStats,
    clock: &ManualClock,
) -> Vec<u64> {
    const MAX_KEYS: usize = 1_000;
    let mut admitted = Vec::new();
    for n in 0..20_000 {
        clock.set(Duration::from_millis(n / 100));
        let decision = check(&Check::new(subject(policy, n)));
        match decision.view() {
            DecisionView::Allowed { .. } => admitted.push(n),
            DecisionView::Denied { denial: Denial::StorageCapacity { retry_after } } => {
                // Everything stored is live, anchored in the first 10 ms of a 60 s window.
                let retry = retry_after.expect("the earliest expiry is known").duration().as_millis();
                assert!((59_800..=60_000).contains(&retry), "retry {retry}");
            }
            other => panic!("key {n}: {other:?}"),
        }
        let stats = stats();
        assert!(stats.entries() <= MAX_KEYS);
        assert!(stats.shards.iter().all(|shard| shard.entries <= shard.capacity));
    }
    // Every shard filled up exactly; every key past capacity was refused.
    assert_eq!(admitted.len(), MAX_KEYS);
    assert_eq!(stats().headroom(), 0);
    admitted
}

#[test]
fn a_key_flood_stays_bounded_and_never_costs_a_live_key_its_count() {
    let config = MemoryStoreConfig::new(1_000).unwrap().with_shard_count(4).unwrap();
    let (store, clock, _) = store(config);
    let policy: FixedWindowPolicy = fixed("p", 5, 60_000);
    let admitted = flood(&policy, |check| store.check(check).unwrap(), || store.stats(), &clock);
    clock.set(Duration::from_millis(1_000));
    for &n in &admitted {
        let (available, _) = allowed(&store.check(&Check::new(subject(&policy, n))).unwrap());
        assert_eq!(available, 3, "key {n} kept its count");
    }
    // Once the windows end, new keys are admitted again through bounded cleanup.
    clock.set(Duration::from_millis(60_200));
    for n in 20_000..20_010 {
        assert_eq!(allowed(&store.check(&Check::new(subject(&policy, n))).unwrap()), (4, 60_000));
    }
}

#[test]
fn a_gcra_key_flood_stays_bounded_too() {
    let clock = ManualClock::new();
    let config = MemoryStoreConfig::new(1_000).unwrap().with_shard_count(4).unwrap();
    let store = GcraStore::builder(config).with_clock(clock.clone()).build();
    // Burst 5, one unit per 60 s: a key that spent one unit is fully rested 60 s later.
    let policy: GcraPolicy = gcra("p", 1, 60_000, 5);
    let admitted = flood(&policy, |check| store.check(check).unwrap(), || store.stats(), &clock);
    for &n in &admitted {
        assert_eq!(allowed(&store.check(&Check::new(subject(&policy, n))).unwrap()).0, 3, "key {n}");
    }
}
