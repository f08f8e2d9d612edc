//! In-crate tests that need private access: poisoning (through the test-only
//! `Engine::poison_shard` hook, which panics while holding a shard lock) and the lazy expiry
//! index.

use std::time::Duration;

use runlimit_core::{
    BatchDecisionView, Check, DecisionView, Denial, FixedWindowPolicy, GcraPolicy, KeyHasher, PolicyId,
    PolicySubject, RateLimitPolicy, ScopeId,
};

use crate::{
    GcraCheckError, GcraStore, ManualClock, MemoryBatchError, MemoryStore, MemoryStoreConfig,
    PoisonedShardError,
    key::{KeyOf, StoredKey},
    shard::{Budget, Entry, Shard},
};

fn hasher() -> KeyHasher {
    KeyHasher::new(&[9; 32]).unwrap()
}

/// The first subject (by counter) whose key lands in `shard` of `shard_count`.
fn subject_in_shard<'p, P: RateLimitPolicy>(
    hasher: &KeyHasher,
    policy: &'p P,
    shard: usize,
    shard_count: usize,
    skip: usize,
) -> PolicySubject<'p, P> {
    (0u32..)
        .map(|n| hasher.hash_for(policy, &n.to_be_bytes()))
        .filter(|subject| KeyOf::of(&Check::new(*subject)).shard(shard_count) == shard)
        .nth(skip)
        .unwrap()
}

fn available(decision: &runlimit_core::Decision) -> u64 {
    match decision.view() {
        DecisionView::Allowed { allowance } => allowance.available(),
        other => panic!("expected allowed, got {other:?}"),
    }
}

#[test]
fn a_panic_under_a_shard_lock_poisons_only_that_shard_until_recovered() {
    let policy = FixedWindowPolicy::new(
        PolicyId::new("login").unwrap(),
        ScopeId::new("client").unwrap(),
        5,
        Duration::from_secs(60),
    )
    .unwrap();
    let hasher = hasher();
    let config = MemoryStoreConfig::new(100).unwrap().with_shard_count(4).unwrap();
    let store = MemoryStore::builder(config).with_clock(ManualClock::new()).build();
    let sick = Check::new(subject_in_shard(&hasher, &policy, 2, 4, 0));
    let healthy = Check::new(subject_in_shard(&hasher, &policy, 3, 4, 0));

    assert_eq!(available(&store.check(&sick).unwrap()), 4);
    assert_eq!(available(&store.check(&sick).unwrap()), 3);
    assert_eq!(available(&store.check(&healthy).unwrap()), 4);

    store.engine().poison_shard(2);

    let error = store.check(&sick).unwrap_err();
    assert_eq!(error, PoisonedShardError { shard_index: 2 });
    assert_eq!(error.to_string(), "memory store shard 2 is poisoned by a panic while its lock was held");
    let batch_error = store.check_all(&[healthy, sick]).unwrap_err();
    assert_eq!(
        batch_error,
        MemoryBatchError::PoisonedShard { source: PoisonedShardError { shard_index: 2 } }
    );
    assert_eq!(batch_error.to_string(), "memory store shard unavailable");
    assert_eq!(std::error::Error::source(&batch_error).unwrap().to_string(), error.to_string());

    // The failed batch consumed nothing in the healthy shard, which keeps working.
    assert_eq!(available(&store.check(&healthy).unwrap()), 3);
    // The poisoned shard's counters are not reset while it is poisoned.
    let stats = store.stats();
    assert_eq!(stats.poisoned_shards(), 1);
    assert!(stats.shards[2].poisoned);
    assert_eq!(stats.shards[2].entries, 1);
    assert_eq!(stats.shards[3].entries, 1);

    assert_eq!(store.recover_poisoned(), 1);
    assert_eq!(store.recover_poisoned(), 0);
    let stats = store.stats();
    assert_eq!((stats.poisoned_shards(), stats.shards[2].entries, stats.shards[3].entries), (0, 0, 1));
    // The recovered shard forgot its window (the documented tradeoff); the healthy one kept it.
    assert_eq!(available(&store.check(&sick).unwrap()), 4);
    assert_eq!(available(&store.check(&healthy).unwrap()), 2);
    let decision = store.check_all(&[healthy, sick]).unwrap();
    assert!(matches!(decision.view(), BatchDecisionView::Allowed { allowances } if allowances.len() == 2));
}

#[test]
fn gcra_store_reports_poisoning_through_its_own_errors() {
    let policy = GcraPolicy::new(
        PolicyId::new("api").unwrap(),
        ScopeId::new("client").unwrap(),
        1,
        Duration::from_secs(1),
        3,
    )
    .unwrap();
    let hasher = hasher();
    let store =
        GcraStore::builder(MemoryStoreConfig::new(10).unwrap()).with_clock(ManualClock::new()).build();
    let check = Check::new(hasher.hash_for(&policy, b"subject"));
    assert_eq!(available(&store.check(&check).unwrap()), 2);
    store.engine().poison_shard(0);
    assert_eq!(
        store.check(&check).unwrap_err(),
        GcraCheckError::PoisonedShard { source: PoisonedShardError { shard_index: 0 } }
    );
    assert_eq!(store.check_all(&[check]).unwrap_err().to_string(), "memory store rejected the batch");
    assert_eq!(store.recover_poisoned(), 1);
    assert_eq!(available(&store.check(&check).unwrap()), 2);
}

fn key(n: u64) -> StoredKey {
    let policy = FixedWindowPolicy::new(
        PolicyId::new("k").unwrap(),
        ScopeId::new("s").unwrap(),
        1,
        Duration::from_secs(1),
    )
    .unwrap();
    KeyOf::of(&Check::new(hasher().hash_for(&policy, &n.to_be_bytes()))).key
}

fn insert(shard: &mut Shard, n: u64, expires_at: u64) -> StoredKey {
    let key = key(n);
    shard.insert(key, key.hash(), Entry { expires_at, value: n });
    key
}

#[test]
fn cleanup_removes_at_most_the_budget_and_refreshes_stale_positions() {
    let mut shard = Shard::new(10);
    for n in 0..6 {
        insert(&mut shard, n, 100);
    }
    // Extend entries 0 and 1 without touching the index (as allowed checks do).
    for n in 0..2 {
        let key = key(n);
        let slot = shard.find(&key, key.hash()).unwrap();
        shard.set_entry(slot, Entry { expires_at: 500, value: n });
    }
    assert_eq!(shard.remove_expired(99, &mut Budget::new(16, 1)), 0);
    // Budget 2: the two stale tops (slots 0, 1) are refreshed, then two expired entries go.
    let mut budget = Budget::new(2, 1);
    assert_eq!(shard.remove_expired(100, &mut budget), 2);
    assert_eq!(shard.len(), 4);
    assert_eq!(shard.remove_expired(100, &mut Budget::new(16, 1)), 2);
    assert_eq!(shard.len(), 2);
    assert_eq!(shard.earliest_expiry(&mut Budget::new(1, 1)), Some(500));
    // Freed slots are reused and the table still finds every key.
    for n in 10..18 {
        insert(&mut shard, n, 1_000 + n);
    }
    assert_eq!((shard.len(), shard.free()), (10, 0));
    for n in (0..2).chain(10..18) {
        let key = key(n);
        let slot = shard.find(&key, key.hash()).unwrap();
        assert_eq!(shard.entry(slot).unwrap().value, n);
    }
    assert_eq!(shard.find(&key(3), key(3).hash()), None);
}

#[test]
fn remove_frees_the_slot_and_keeps_the_index_exact() {
    let mut shard = Shard::new(3);
    for (n, expires_at) in [(0, 300), (1, 100), (2, 200)] {
        insert(&mut shard, n, expires_at);
    }
    assert_eq!(shard.free(), 0);
    // Remove the entry at the top of the index: the next earliest is exact, and the slot is
    // reused by a new key.
    let removed = key(1);
    shard.remove(shard.find(&removed, removed.hash()).unwrap(), removed.hash());
    assert_eq!((shard.len(), shard.free()), (2, 1));
    assert_eq!(shard.find(&removed, removed.hash()), None);
    assert_eq!(shard.earliest_expiry(&mut Budget::new(1, 1)), Some(200));
    insert(&mut shard, 7, 50);
    assert_eq!(shard.earliest_expiry(&mut Budget::new(1, 1)), Some(50));
    // Cleanup removes exactly the expired entries, never touching a freed slot twice.
    assert_eq!(shard.remove_expired(250, &mut Budget::new(16, 1)), 2);
    assert_eq!(shard.len(), 1);
    let last = key(0);
    assert_eq!(shard.entry(shard.find(&last, last.hash()).unwrap()).unwrap().value, 0);
    shard.remove(shard.find(&last, last.hash()).unwrap(), last.hash());
    assert_eq!((shard.len(), shard.earliest_expiry(&mut Budget::new(1, 1))), (0, None));
    assert_eq!(shard.remove_expired(u64::MAX - 1, &mut Budget::new(16, 1)), 0);
}

#[test]
fn earliest_expiry_is_unknown_when_the_refresh_budget_runs_out() {
    let mut shard = Shard::new(4);
    for n in 0..3 {
        insert(&mut shard, n, 10);
    }
    for n in 0..3 {
        let key = key(n);
        let slot = shard.find(&key, key.hash()).unwrap();
        shard.set_entry(slot, Entry { expires_at: 100 - n, value: n });
    }
    assert_eq!(shard.earliest_expiry(&mut Budget::new(2, 1)), None);
    assert_eq!(shard.earliest_expiry(&mut Budget::new(1, 1)), Some(98));
}

#[test]
fn the_saturated_deadline_never_expires() {
    let mut shard = Shard::new(2);
    insert(&mut shard, 1, u64::MAX);
    assert_eq!(shard.remove_expired(u64::MAX, &mut Budget::new(4, 1)), 0);
    assert_eq!(shard.len(), 1);
    assert!(Entry { expires_at: u64::MAX, value: 0 }.live_at(u64::MAX).is_some());
    assert!(Entry { expires_at: 5, value: 0 }.live_at(5).is_none());
}

#[test]
fn clock_jump_to_the_end_of_time_fails_closed_for_fixed_windows() {
    let policy = FixedWindowPolicy::new(
        PolicyId::new("p").unwrap(),
        ScopeId::new("s").unwrap(),
        2,
        Duration::from_secs(1),
    )
    .unwrap();
    let clock = ManualClock::new();
    let store = MemoryStore::builder(MemoryStoreConfig::new(4).unwrap()).with_clock(clock.clone()).build();
    let check = Check::new(hasher().hash_for(&policy, b"s"));
    clock.set(Duration::MAX);
    assert_eq!(available(&store.check(&check).unwrap()), 1);
    assert_eq!(available(&store.check(&check).unwrap()), 0);
    assert!(matches!(
        store.check(&check).unwrap().view(),
        DecisionView::Denied { denial: Denial::QuotaExceeded(_) }
    ));
}
