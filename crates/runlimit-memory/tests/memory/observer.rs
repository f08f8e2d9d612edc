//! Observer dispatch: exact observations, after locks are released, panics isolated.

use std::sync::{Arc, OnceLock, Weak};

use runlimit_core::{
    AdmissionOutcome, Check, ConsumptionStatus, FixedWindowPolicy, Observation, Observer, QuotaMode,
    ResetOutcome, backend::ShardHeadroom,
};
use runlimit_memory::{GcraStore, ManualClock, MemoryStore, MemoryStoreConfig};

use crate::support::{Recorder, Seen, allowed, fixed, gcra, quota_denied, subject};

fn headroom(shard_index: usize, entries: usize, capacity: usize) -> Option<ShardHeadroom> {
    Some(ShardHeadroom { shard_index, entries, capacity })
}

#[test]
fn every_admission_is_observed_with_outcome_consumption_and_headroom() {
    let recorder = Recorder::default();
    let store = MemoryStore::builder(MemoryStoreConfig::new(2).unwrap())
        .with_clock(ManualClock::new())
        .with_observer(recorder.clone())
        .build();
    let policy = fixed("login", 1, 1_000);
    let shadow = fixed("warm", 1, 1_000).with_quota_mode(QuotaMode::Shadow);
    let a = Check::new(subject(&policy, 1));
    let s = Check::new(subject(&shadow, 1));
    store.check(&a).unwrap();
    store.check(&a).unwrap();
    store.check(&s).unwrap();
    store.check(&s).unwrap();
    store.check(&Check::new(subject(&policy, 2))).unwrap();
    assert_eq!(
        recorder.take(),
        [
            Seen::Check {
                policy: "login/test".into(),
                outcome: AdmissionOutcome::Allowed,
                consumption: ConsumptionStatus::Consumed,
                headroom: headroom(0, 1, 2),
            },
            Seen::Check {
                policy: "login/test".into(),
                outcome: AdmissionOutcome::QuotaExceeded,
                consumption: ConsumptionStatus::NotConsumed,
                headroom: headroom(0, 1, 2),
            },
            Seen::Check {
                policy: "warm/test".into(),
                outcome: AdmissionOutcome::Allowed,
                consumption: ConsumptionStatus::Consumed,
                headroom: headroom(0, 2, 2),
            },
            Seen::Check {
                policy: "warm/test".into(),
                outcome: AdmissionOutcome::ShadowDenied,
                consumption: ConsumptionStatus::NotConsumed,
                headroom: headroom(0, 2, 2),
            },
            Seen::Check {
                policy: "login/test".into(),
                outcome: AdmissionOutcome::StorageCapacity,
                consumption: ConsumptionStatus::NotConsumed,
                headroom: headroom(0, 2, 2),
            },
        ]
    );
}

#[test]
fn batches_name_the_denied_check_policy_and_invalid_batches_are_observed() {
    let recorder = Recorder::default();
    let store = MemoryStore::builder(MemoryStoreConfig::new(10).unwrap())
        .with_clock(ManualClock::new())
        .with_observer(recorder.clone())
        .build();
    let roomy = fixed("roomy", 5, 1_000);
    let tight = fixed("tight", 1, 1_000);
    let a = Check::new(subject(&roomy, 1));
    let b = Check::new(subject(&tight, 1));
    store.check_all(&[a, b]).unwrap();
    store.check_all(&[a, b]).unwrap();
    store.check_all(&[a, a]).unwrap_err();
    assert_eq!(
        recorder.take(),
        [
            Seen::Batch {
                size: 2,
                policy: None,
                outcome: AdmissionOutcome::Allowed,
                consumption: ConsumptionStatus::Consumed,
                headroom: headroom(0, 2, 10),
            },
            Seen::Batch {
                size: 2,
                policy: Some("tight/test".into()),
                outcome: AdmissionOutcome::QuotaExceeded,
                consumption: ConsumptionStatus::NotConsumed,
                headroom: headroom(0, 2, 10),
            },
            Seen::Batch {
                size: 2,
                policy: None,
                outcome: AdmissionOutcome::InvalidBatch,
                consumption: ConsumptionStatus::NotConsumed,
                headroom: None,
            },
        ]
    );
}

#[test]
fn batch_headroom_is_the_fullest_touched_shard() {
    let recorder = Recorder::default();
    let config = MemoryStoreConfig::new(8).unwrap().with_shard_count(2).unwrap();
    let store =
        MemoryStore::builder(config).with_clock(ManualClock::new()).with_observer(recorder.clone()).build();
    let policy = fixed("p", 5, 1_000);
    // Find one key in each shard through the observed headroom.
    let mut by_shard: [Option<u64>; 2] = [None, None];
    for n in 0.. {
        store.check(&Check::new(subject(&policy, n))).unwrap();
        let Some(Seen::Check { headroom: Some(headroom), .. }) = recorder.take().pop() else { panic!() };
        by_shard[headroom.shard_index].get_or_insert(n);
        if by_shard.iter().all(Option::is_some) {
            break;
        }
    }
    let stats = store.stats();
    let fuller = usize::from(stats.shards[1].headroom() < stats.shards[0].headroom());
    let checks: Vec<_> = by_shard.iter().map(|n| Check::new(subject(&policy, n.unwrap()))).collect();
    store.check_all(&checks).unwrap();
    let Some(Seen::Batch { headroom: Some(seen), .. }) = recorder.take().pop() else { panic!() };
    assert_eq!(seen.shard_index, fuller);
    assert_eq!(seen.entries, stats.shards[fuller].entries);
    assert_eq!(seen.capacity, 4);
}

#[derive(Default)]
struct Reentrant {
    store: OnceLock<Weak<MemoryStore<ManualClock, Arc<Self>>>>,
    policy: OnceLock<FixedWindowPolicy>,
    seen: std::sync::Mutex<Vec<usize>>,
}

impl Observer for Reentrant {
    fn observe(&self, observation: &Observation<'_>) {
        // Would deadlock if the store still held a shard lock while calling observers.
        if let (Observation::Admission(_), Some(store)) =
            (observation, self.store.get().and_then(Weak::upgrade))
        {
            self.seen.lock().unwrap().push(store.stats().entries());
        }
    }
}

#[test]
fn observers_run_after_locks_are_released() {
    let observer = Arc::new(Reentrant::default());
    let store = Arc::new(
        MemoryStore::builder(MemoryStoreConfig::new(4).unwrap())
            .with_clock(ManualClock::new())
            .with_observer(Arc::clone(&observer))
            .build(),
    );
    observer.store.set(Arc::downgrade(&store)).unwrap();
    observer.policy.set(fixed("p", 5, 1_000)).unwrap();
    let policy = observer.policy.get().unwrap();
    store.check(&Check::new(subject(policy, 1))).unwrap();
    store.check_all(&[Check::new(subject(policy, 2)), Check::new(subject(policy, 3))]).unwrap();
    assert_eq!(*observer.seen.lock().unwrap(), [1, 3]);
}

struct Panics;

impl Observer for Panics {
    fn observe(&self, _: &Observation<'_>) {
        panic!("observer bug");
    }
}

#[test]
fn a_panicking_observer_never_changes_a_decision_or_poisons_a_shard() {
    let store = GcraStore::builder(MemoryStoreConfig::new(4).unwrap())
        .with_clock(ManualClock::new())
        .with_observer(Panics)
        .build();
    let policy = gcra("p", 1, 1_000, 2);
    let check = Check::new(subject(&policy, 1));
    assert_eq!(allowed(&store.check(&check).unwrap()), (1, 1_000));
    assert_eq!(allowed(&store.check(&check).unwrap()), (0, 2_000));
    assert_eq!(quota_denied(&store.check(&check).unwrap()), (2, 1_000));
    assert_eq!(store.stats().poisoned_shards(), 0);
}

#[test]
fn each_reset_is_one_observation_and_peeks_are_not_observed() {
    let recorder = Recorder::default();
    let store = MemoryStore::builder(MemoryStoreConfig::new(2).unwrap())
        .with_clock(ManualClock::new())
        .with_observer(recorder.clone())
        .build();
    let policy = fixed("login", 1, 1_000);
    store.check(&Check::new(subject(&policy, 1))).unwrap();
    recorder.take();
    assert!(store.peek(subject(&policy, 1)).unwrap().available() == 0);
    assert!(store.reset(subject(&policy, 1)).unwrap());
    assert!(!store.reset(subject(&policy, 1)).unwrap());
    assert_eq!(
        recorder.take(),
        [
            Seen::Reset { policy: "login/test".into(), outcome: ResetOutcome::Removed },
            Seen::Reset { policy: "login/test".into(), outcome: ResetOutcome::NothingStored },
        ]
    );
    let gcra_recorder = Recorder::default();
    let gcra_store = GcraStore::builder(MemoryStoreConfig::new(2).unwrap())
        .with_clock(ManualClock::new())
        .with_observer(gcra_recorder.clone())
        .build();
    let policy = gcra("api", 1, 1_000, 1);
    assert!(!gcra_store.reset(subject(&policy, 1)).unwrap());
    assert_eq!(
        gcra_recorder.take(),
        [Seen::Reset { policy: "api/test".into(), outcome: ResetOutcome::NothingStored }]
    );
}
