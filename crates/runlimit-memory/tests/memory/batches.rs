//! Atomic batches: all or nothing, input order, structural rejections before any work.

use std::time::Duration;

use runlimit_core::{BatchError, Check, Delay, Denial, QuotaDenial, QuotaMode};
use runlimit_memory::{
    GcraBatchError, GcraStore, ManualClock, MemoryBatchError, MemoryStore, MemoryStoreConfig,
};

use crate::support::{allowed, batch_allowed, batch_denied, fixed, gcra, quota_denied, subject};

fn store(config: MemoryStoreConfig) -> (MemoryStore<ManualClock>, ManualClock) {
    let clock = ManualClock::new();
    (MemoryStore::builder(config).with_clock(clock.clone()).build(), clock)
}

#[test]
fn a_denied_batch_names_the_first_denied_index_and_consumes_nothing() {
    let (store, clock) = store(MemoryStoreConfig::new(10).unwrap());
    let roomy = fixed("roomy", 5, 1_000);
    let tight = fixed("tight", 1, 1_000);
    let a = Check::new(subject(&roomy, 1));
    let b = Check::new(subject(&tight, 1));
    let c = Check::new(subject(&roomy, 2));
    assert_eq!(allowed(&store.check(&b).unwrap()), (0, 1_000));
    clock.advance_millis(250);
    let decision = store.check_all(&[a, b, c]).unwrap();
    let quota = QuotaDenial::new(tight.limit(), Delay::from_millis(750));
    assert_eq!(batch_denied(&decision), (1, 3, Denial::QuotaExceeded(quota)));
    assert!(!decision.permits_request());
    // Nothing consumed: a's and c's first checks anchor fresh windows now.
    assert_eq!(allowed(&store.check(&a).unwrap()), (4, 1_000));
    assert_eq!(allowed(&store.check(&c).unwrap()), (4, 1_000));
    assert_eq!(store.stats().entries(), 3);
}

#[test]
fn structural_errors_are_rejected_before_any_work() {
    let config = MemoryStoreConfig::new(10).unwrap().with_maximum_batch_size(3).unwrap();
    let (store, _clock) = store(config);
    let enforced = fixed("p", 5, 1_000);
    let shadow = fixed("q", 5, 1_000).with_quota_mode(QuotaMode::Shadow);
    let a = Check::new(subject(&enforced, 1));
    let b = Check::new(subject(&enforced, 2));
    let s = Check::new(subject(&shadow, 1));

    let empty = store.check_all(&[]).unwrap_err();
    assert_eq!(empty, MemoryBatchError::InvalidBatch { source: BatchError::EmptyBatch });
    assert_eq!(empty.to_string(), "invalid batch");
    assert_eq!(std::error::Error::source(&empty).unwrap().to_string(), "empty batch");
    assert_eq!(
        store.check_all(&[a, b, a, b]).unwrap_err(),
        MemoryBatchError::InvalidBatch { source: BatchError::TooManyChecks { batch_size: 4, maximum: 3 } }
    );
    assert_eq!(
        store.check_all(&[a, s]).unwrap_err(),
        MemoryBatchError::InvalidBatch {
            source: BatchError::MixedQuotaModes { index: 1, mode: QuotaMode::Shadow }
        }
    );
    assert_eq!(
        store.check_all(&[a, b, a]).unwrap_err(),
        MemoryBatchError::InvalidBatch {
            source: BatchError::DuplicateCounterKey { first_index: 0, duplicate_index: 2 }
        }
    );
    assert_eq!(store.stats().entries(), 0, "no rejected batch stored anything");
}

#[test]
fn a_batch_larger_than_its_shard_can_ever_hold_is_a_structural_error() {
    let (store, _clock) = store(MemoryStoreConfig::new(2).unwrap());
    let policy = fixed("p", 5, 1_000);
    let checks: Vec<_> = (0..3).map(|n| Check::new(subject(&policy, n))).collect();
    let error = store.check_all(&checks).unwrap_err();
    assert_eq!(
        error,
        MemoryBatchError::BatchExceedsShardCapacity { shard_index: 0, key_count: 3, capacity: 2 }
    );
    assert_eq!(error.to_string(), "batch targets 3 keys in shard 0, which holds at most 2");
    assert_eq!(batch_allowed(&store.check_all(&checks[..2]).unwrap()).len(), 2);
}

#[test]
fn enforced_batch_reports_the_earliest_index_whatever_the_reason() {
    let (store, _clock) = store(MemoryStoreConfig::new(2).unwrap());
    let policy = fixed("p", 1, 1_000);
    let a = Check::new(subject(&policy, 1));
    store.check(&a).unwrap();
    store.check(&Check::new(subject(&policy, 2))).unwrap();
    let new_key = Check::new(subject(&policy, 3));
    let (index, _, denial) = batch_denied(&store.check_all(&[new_key, a]).unwrap());
    assert_eq!(
        (index, denial),
        (0, Denial::StorageCapacity { retry_after: Some(Delay::from_millis(1_000)) })
    );
    let (index, _, denial) = batch_denied(&store.check_all(&[a, new_key]).unwrap());
    assert_eq!(
        (index, denial),
        (0, Denial::QuotaExceeded(QuotaDenial::new(policy.limit(), Delay::from_millis(1_000))))
    );
}

#[test]
fn gcra_batches_commit_together() {
    let clock = ManualClock::new();
    let store = GcraStore::builder(MemoryStoreConfig::new(10).unwrap()).with_clock(clock.clone()).build();
    let fast = gcra("fast", 10, 1_000, 20);
    let slow = gcra("slow", 1, 60_000, 1);
    let a = Check::new(subject(&fast, 1));
    let b = Check::new(subject(&slow, 1));
    assert_eq!(batch_allowed(&store.check_all(&[a, b]).unwrap()), [(19, 100), (0, 60_000)]);
    clock.set(Duration::from_millis(1));
    let (index, size, denial) = batch_denied(&store.check_all(&[a, b]).unwrap());
    assert_eq!((index, size), (1, 2));
    assert_eq!(
        denial,
        Denial::QuotaExceeded(QuotaDenial::new(slow.burst_capacity(), Delay::from_millis(59_999)))
    );
    // The fast policy was not consumed by the denied batch: still 19 left after one hit at 0 ms.
    assert_eq!(allowed(&store.check(&a).unwrap()), (18, 199));
    assert_eq!(quota_denied(&store.check(&b).unwrap()), (1, 59_999));
    assert_eq!(
        store.check_all(&[]).unwrap_err(),
        GcraBatchError::Store { source: MemoryBatchError::InvalidBatch { source: BatchError::EmptyBatch } }
    );
}

/// The shard subject `n` of `policy` lands on in a store of `shards` shards, found through
/// the stats of a scratch store.
fn shard_of(policy: &runlimit_core::FixedWindowPolicy, n: u64, shards: usize) -> usize {
    let (scratch, _clock) = store(MemoryStoreConfig::new(8).unwrap().with_shard_count(shards).unwrap());
    scratch.check(&Check::new(subject(policy, n))).unwrap();
    scratch.stats().shards.iter().position(|shard| shard.entries == 1).unwrap()
}

/// The first `count` subjects of `policy` on each of `shards` shards.
fn subjects_per_shard(
    policy: &runlimit_core::FixedWindowPolicy,
    shards: usize,
    count: usize,
) -> Vec<Vec<u64>> {
    (0..shards)
        .map(|shard| (0..).filter(|&n| shard_of(policy, n, shards) == shard).take(count).collect())
        .collect()
}

#[test]
fn batches_on_one_shard_and_across_shards_follow_the_same_rules() {
    // Two shards of two slots each. Subject keys come from `KeyHasher::hash_for`, so which
    // shard a check lands on is fixed by its key; pick subjects per shard.
    let (store, clock) = store(MemoryStoreConfig::new(4).unwrap().with_shard_count(2).unwrap());
    let policy = fixed("p", 2, 1_000);
    let per_shard = subjects_per_shard(&policy, 2, 3);
    let (zero, one) = (&per_shard[0], &per_shard[1]);
    let check = |n: u64| Check::new(subject(&policy, n));

    // Across both shards, allowed: every check consumed, in input order.
    assert_eq!(batch_allowed(&store.check_all(&[check(zero[0]), check(one[0])]).unwrap()), [(1, 1_000); 2]);
    // Across shards with one new key, then a one-check batch on shard 0: both shards full.
    clock.advance_millis(100);
    assert_eq!(
        batch_allowed(&store.check_all(&[check(one[1]), check(zero[0])]).unwrap()),
        [(1, 1_000), (0, 900)]
    );
    assert_eq!(store.check_all(&[check(zero[1])]).map(|d| batch_allowed(&d)).unwrap(), [(1, 1_000)]);
    assert_eq!(store.stats().headroom(), 0);

    // A batch needing a new slot on each full shard is denied at its first new key, with the
    // latest of the two shards' earliest expiries: zero[0] and one[0] end at 1,000 ms, so
    // both shards can take a key from then on.
    clock.advance_millis(100);
    let both_new = [check(one[0]), check(zero[2]), check(one[2])];
    assert_eq!(
        batch_denied(&store.check_all(&both_new).unwrap()),
        (1, 3, Denial::StorageCapacity { retry_after: Some(Delay::from_millis(800)) })
    );
    // On one full shard: the same denial with that shard's earliest expiry.
    assert_eq!(
        batch_denied(&store.check_all(&[check(zero[2])]).unwrap()),
        (0, 1, Denial::StorageCapacity { retry_after: Some(Delay::from_millis(800)) })
    );
    // Nothing consumed: one[0] still has one check left in its window.
    assert_eq!(allowed(&store.check(&check(one[0])).unwrap()), (0, 800));
    // A quota denial on one shard vetoes the allowed check on the other, across shards and on one.
    let quota = QuotaDenial::new(policy.limit(), Delay::from_millis(800));
    assert_eq!(
        batch_denied(&store.check_all(&[check(one[1]), check(zero[0])]).unwrap()),
        (1, 2, Denial::QuotaExceeded(quota))
    );
    assert_eq!(
        batch_denied(&store.check_all(&[check(zero[1]), check(zero[0])]).unwrap()),
        (1, 2, Denial::QuotaExceeded(quota))
    );
    assert_eq!(allowed(&store.check(&check(one[1])).unwrap()), (0, 900), "one[1] was not consumed");
    assert_eq!(allowed(&store.check(&check(zero[1])).unwrap()), (0, 900), "zero[1] was not consumed");
}

/// Batches of more than four checks, or touching three or more shards, take the store's
/// grouped batch path (smaller batches on at most two shards have one of their own): the same
/// rules, with exact values.
#[test]
fn batches_on_three_shards_and_large_batches_follow_the_same_rules() {
    // Three shards of two slots each.
    let (store, clock) = store(MemoryStoreConfig::new(6).unwrap().with_shard_count(3).unwrap());
    let policy = fixed("p", 2, 1_000);
    let on = subjects_per_shard(&policy, 3, 3);
    let check = |shard: usize, k: usize| Check::new(subject(&policy, on[shard][k]));

    // Shard 0 fills at 0 ms (expiring at 1,000 ms), shard 2 at 100 ms (at 1,100 ms).
    let batch = [check(0, 0), check(0, 1), check(1, 0)];
    assert_eq!(batch_allowed(&store.check_all(&batch).unwrap()), [(1, 1_000); 3]);
    clock.advance_millis(100);
    // Three shards: allowed, in input order.
    let batch = [check(2, 0), check(1, 0), check(2, 1)];
    assert_eq!(batch_allowed(&store.check_all(&batch).unwrap()), [(1, 1_000), (0, 900), (1, 1_000)]);

    // New keys on full shards 0 and 2: denied at the first one, retrying once both have room
    // (the later of 1,000 and 1,100 ms); the allowed check on shard 1 is not consumed.
    clock.advance_millis(100);
    let batch = [check(1, 1), check(0, 2), check(2, 2)];
    assert_eq!(
        batch_denied(&store.check_all(&batch).unwrap()),
        (1, 3, Denial::StorageCapacity { retry_after: Some(Delay::from_millis(900)) })
    );
    assert_eq!(store.stats().shards[1].entries, 1, "check(1, 1) was not stored");

    // Five checks on three shards: a quota denial at index 3 vetoes every other check.
    let batch = [check(1, 1), check(0, 0), check(2, 0), check(1, 0), check(0, 1)];
    let quota = QuotaDenial::new(policy.limit(), Delay::from_millis(800));
    assert_eq!(batch_denied(&store.check_all(&batch).unwrap()), (3, 5, Denial::QuotaExceeded(quota)));
    assert_eq!(allowed(&store.check(&check(0, 0)).unwrap()), (0, 800), "check(0, 0) was not consumed");

    // Five checks on one shard (one shard of 6 slots): allowed, in input order.
    let one_shard = MemoryStore::new(MemoryStoreConfig::new(6).unwrap());
    let batch: Vec<_> = (0..5).map(|n| Check::new(subject(&policy, n))).collect();
    assert_eq!(batch_allowed(&one_shard.check_all(&batch).unwrap()), [(1, 1_000); 5]);
}

/// A batch larger than a shard's capacity is rejected before any lock, naming the
/// lowest-numbered shard that cannot hold its share, on both batch paths.
#[test]
fn batches_exceeding_a_shard_name_the_lowest_such_shard() {
    // Three shards of one slot each.
    let (store, _clock) = store(MemoryStoreConfig::new(3).unwrap().with_shard_count(3).unwrap());
    let policy = fixed("p", 2, 1_000);
    let on = subjects_per_shard(&policy, 3, 3);
    let check = |shard: usize, k: usize| Check::new(subject(&policy, on[shard][k]));
    let exceeds = |shard_index, key_count| MemoryBatchError::BatchExceedsShardCapacity {
        shard_index,
        key_count,
        capacity: 1,
    };
    // Two shards, shard 1 first in input order: shard 0 is named.
    let batch = [check(1, 0), check(1, 1), check(0, 0), check(0, 1)];
    assert_eq!(store.check_all(&batch).unwrap_err(), exceeds(0, 2));
    let batch = [check(1, 0), check(1, 1), check(1, 2), check(0, 0)];
    assert_eq!(store.check_all(&batch).unwrap_err(), exceeds(1, 3));
    // Three shards (the grouped path).
    let batch = [check(2, 0), check(2, 1), check(0, 0), check(1, 0), check(1, 1)];
    assert_eq!(store.check_all(&batch).unwrap_err(), exceeds(1, 2));
    assert_eq!(store.stats().entries(), 0, "nothing was stored");
}
