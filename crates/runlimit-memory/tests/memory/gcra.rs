//! GcraStore behaviour of its own, with a manual clock: lazy expiry of fully rested entries.
//! The reference vectors of `runlimit_core::backend::gcra` and the rules every backend shares are
//! scenarios of the conformance suite (`tests/conformance.rs`).

use std::time::Duration;

use runlimit_core::Check;
use runlimit_memory::{GcraStore, ManualClock, MemoryStoreConfig};

use crate::support::{allowed, gcra, subject};

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
