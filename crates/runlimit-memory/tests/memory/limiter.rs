//! The async `Limiter` face: lazy futures, Send, generic use.

use futures_executor::block_on;
use runlimit_core::{BatchDecision, Check, Limiter};
use runlimit_memory::{GcraStore, ManualClock, MemoryStore, MemoryStoreConfig};

use crate::support::{allowed, batch_allowed, fixed, gcra, subject};

fn assert_send<T: Send>(_: &T) {}
fn assert_sync<T: Send + Sync>() {}

async fn admit<L: Limiter>(
    limiter: &L,
    checks: &[Check<'_, L::Policy>],
) -> Result<BatchDecision, L::CheckAllError> {
    limiter.check_all(checks).await
}

#[test]
fn stores_are_send_and_sync_limiters() {
    assert_sync::<MemoryStore>();
    assert_sync::<GcraStore>();
    assert_sync::<MemoryStore<ManualClock, crate::support::Recorder>>();
}

#[test]
fn quota_is_consumed_only_when_the_future_is_first_polled() {
    let store =
        MemoryStore::builder(MemoryStoreConfig::new(4).unwrap()).with_clock(ManualClock::new()).build();
    let policy = fixed("p", 3, 1_000);
    let check = Check::new(subject(&policy, 1));
    let unpolled = Limiter::check(&store, &check);
    assert_send(&unpolled);
    drop(unpolled);
    let unpolled_batch = Limiter::check_all(&store, std::slice::from_ref(&check));
    assert_send(&unpolled_batch);
    drop(unpolled_batch);
    assert_eq!(store.stats().entries(), 0);
    assert_eq!(allowed(&block_on(Limiter::check(&store, &check)).unwrap()), (2, 1_000));
    assert_eq!(batch_allowed(&block_on(admit(&store, &[check])).unwrap()), [(1, 1_000)]);
}

#[test]
fn gcra_store_is_a_generic_limiter_too() {
    let store = GcraStore::builder(MemoryStoreConfig::new(4).unwrap()).with_clock(ManualClock::new()).build();
    let policy = gcra("p", 10, 1_000, 20);
    let check = Check::new(subject(&policy, 1));
    let unpolled = Limiter::check(&store, &check);
    assert_send(&unpolled);
    drop(unpolled);
    assert_eq!(allowed(&block_on(Limiter::check(&store, &check)).unwrap()), (19, 100));
    let shared = std::sync::Arc::new(store);
    assert_eq!(batch_allowed(&block_on(admit(&shared, &[check])).unwrap()), [(18, 200)]);
}
