//! Sharded, hard-bounded, process-local Runlimit storage: anchored fixed windows
//! ([`MemoryStore`]) and GCRA ([`GcraStore`]).
//!
//! Both stores hold at most a configured number of keys, never evict a live entry to make room,
//! bound the cleanup work of every check, and answer with the exhaustive decisions of
//! [`runlimit_core`]. They enforce a per-process quota; use `runlimit-postgres` for quotas shared
//! across replicas, and keep a coarse memory gate in front of it.
//!
//! # Example
//!
//! Check a client and a normalized identity atomically: if either quota is exhausted, neither
//! counter is consumed.
//!
//! ```
//! use std::time::Duration;
//! use runlimit_core::{
//!     BatchDecisionView, Check, Denial, FixedWindowPolicy, KeyHasher, PolicyId, ScopeId,
//! };
//! use runlimit_memory::{MemoryStore, MemoryStoreConfig};
//!
//! let client_policy = FixedWindowPolicy::new(
//!     PolicyId::new("auth.login")?, ScopeId::new("client")?, 40, Duration::from_secs(60))?;
//! let identity_policy = FixedWindowPolicy::new(
//!     PolicyId::new("auth.login")?, ScopeId::new("identity")?, 8, Duration::from_secs(60))?;
//! // Load one stable, random secret (at least 32 bytes) from secret storage.
//! let key_hasher = KeyHasher::new(b"an example secret of at least 32 bytes")?;
//! let client = key_hasher.hash_for(&client_policy, b"client-network:192.0.2.4");
//! let identity = key_hasher.hash_for(&identity_policy, b"user@example.test");
//!
//! let config = MemoryStoreConfig::new(50_000)?.with_shard_count(64)?;
//! let limiter = MemoryStore::new(config);
//! let checks = [Check::new(client), Check::new(identity)];
//! let decision = limiter.check_all(&checks)?;
//! match decision.view() {
//!     BatchDecisionView::Allowed { allowances } => assert_eq!(allowances.len(), checks.len()),
//!     BatchDecisionView::Denied { index, denial: Denial::QuotaExceeded(quota), .. } => {
//!         println!("check {index} denied; retry after {} seconds", quota.retry_after().seconds());
//!     }
//!     BatchDecisionView::Denied { index, denial: Denial::StorageCapacity { .. }, .. } => {
//!         println!("check {index} denied; backend storage is full");
//!     }
//!     BatchDecisionView::ShadowDenied { index, .. } => {
//!         println!("request admitted after check {index} was shadow denied");
//!     }
//! }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Feature flags
//!
//! | Feature | Default | What it enables |
//! |---|---|---|
//! | `serde` | no | `Serialize`/`Deserialize` for [`MemoryStoreConfig`] (deserialization re-runs every validation, fills defaults, rejects unknown fields) and `Serialize` for [`MemoryStoreStats`]; also enables `runlimit-core/serde`. Live stores never serialize. |
//!
//! # Storage bounds
//!
//! - [`MemoryStoreConfig::new`] sets `max_keys`, the total capacity. The default is one shard,
//!   so all of it is available to any key. [`with_shard_count`](MemoryStoreConfig::with_shard_count)
//!   divides it into fixed per-shard capacities: more lock concurrency, but an uneven key
//!   distribution can fill one shard and deny a new key while other shards have room.
//! - Live entries are never evicted. A new key that cannot fit its shard is denied with
//!   [`Denial::StorageCapacity`](runlimit_core::Denial::StorageCapacity) in every quota mode;
//!   existing keys keep working. Its `retry_after` is the time until the shard's earliest
//!   expiry when the store knows it exactly (see below), else `None`. For a batch short of
//!   room in several shards it is the latest of those shards' earliest expiries; when one
//!   shard lacks more than one slot, the batch may need to wait longer.
//! - A batch with more distinct keys in one shard than that shard can ever hold is rejected
//!   with [`MemoryBatchError::BatchExceedsShardCapacity`] before any lock is taken: waiting
//!   cannot make it fit.
//! - Memory grows with the keys actually stored (about 61 bytes per key, see *Performance*)
//!   and never beyond what `max_keys` entries need.
//!
//! # Cleanup
//!
//! Each check first removes at most
//! [`expired_removals_per_check`](MemoryStoreConfig::expired_removals_per_check) expired entries
//! from its own shard; an atomic batch gets that allowance once for each of its checks on a
//! shard. A fixed-window entry expires at its anchored deadline; a GCRA entry when its full
//! burst capacity has replenished. An expired entry is equivalent to no entry, so cleanup
//! never changes a decision, only the room available to new keys.
//!
//! Expired entries are found through a per-shard min-heap of expiry times that is updated
//! lazily: allowed checks do not touch it, and cleanup re-positions an element whose entry has
//! moved its expiry forward when it reaches the top. Each check does at most
//! `expired_removals_per_check` removals and as many re-positionings, each `O(log n)`, so a
//! check's cleanup work is bounded however many entries are stale. The price of that bound: in
//! a full shard where many entries were extended since they were last positioned, an expired
//! entry can stay hidden behind more stale elements than one check may re-position, and a new
//! key is then denied (with `retry_after: None`) until later checks have caught up.
//!
//! # Clocks
//!
//! [`MemoryStore::new`] and [`GcraStore::new`] use the monotonic [`SystemClock`]. Tests choose
//! their clock before the store exists with `builder(config).with_clock(clock).build()`, for
//! example a [`ManualClock`]; a built store cannot replace its clock because its stored
//! deadlines belong to that clock's coordinate system. Readings are truncated to whole
//! milliseconds, and each shard clamps a reading that goes backwards.
//!
//! # Poisoning
//!
//! If code panics while holding a shard lock, that shard stays poisoned: every later operation
//! touching it fails with [`PoisonedShardError`] (or the batch and GCRA errors wrapping it)
//! without resetting its counters. With the default single shard the entire store is
//! unavailable. Keep admissions failing closed and alert operators. As an explicit
//! availability tradeoff, [`MemoryStore::recover_poisoned`] / [`GcraStore::recover_poisoned`]
//! empty only the poisoned shards, clear their poison flags, keep healthy shards' counters, and
//! return the number recovered. Emptied counters can admit requests their lost state would
//! have denied; replacing the store is a broader reset with the same consequence everywhere.
//!
//! # Errors
//!
//! Every error is an admission failure, distinct from a quota denial, and none consumed quota.
//! Each operation has its own type listing only what it can produce: [`MemoryStore::check`]
//! fails only with [`PoisonedShardError`], [`MemoryStore::check_all`] with
//! [`MemoryBatchError`], [`GcraStore::check`] with [`GcraCheckError`] and
//! [`GcraStore::check_all`] with [`GcraBatchError`], whose `Store` variant wraps the
//! bounded-storage failures shared with [`MemoryStore`].
//!
//! # Observers
//!
//! `with_observer` attaches a [`runlimit_core::Observer`]. It is called synchronously after the
//! shard locks are released, through [`runlimit_core::backend::notify`], which catches panics, so
//! telemetry cannot change a decision. Each admission reports its operation, outcome,
//! consumption, elapsed time and the headroom of its shard (the fullest touched shard, for a
//! batch); each check or batch whose cleanup removed entries also reports a cleanup
//! observation. Observations carry no subject keys. Without an observer, no observation is
//! built and no time is measured.
//!
//! # Key storage and hashing
//!
//! A shard stores one 16-byte value per key: the first 16 bytes of the subject key XORed with
//! the first 16 bytes of the policy fingerprint, both uniform digest outputs. Two counter keys
//! share an entry only if those values collide, with probability at most `(n² + p²) / 2¹²⁹`
//! among `n` stored keys of `p` policies, and a collision would only make two subjects share
//! (and so tighten) one counter. Its hash table
//! uses subject-key bytes directly as the hash instead of SipHash: subject keys are
//! HMAC-SHA-256 outputs under the application's secret, uniform and unpredictable without it,
//! so an attacker cannot aim keys at one bucket or one shard.
//!
//! # Performance
//!
//! `cargo bench -p runlimit-memory` runs both stores and governor's keyed limiter on the same
//! workloads (one thread on 10,000 hot keys, two threads on the same keys, a flood of
//! 1,000,000 distinct keys, a two-check batch) and prints nanoseconds per check, the ratios to
//! governor, and the resident memory per key with 1,000,000 live keys, each measured in a
//! fresh process. Resident memory is about 61 bytes per key with 64 shards (59 with one
//! shard): a 32-byte slot, a 4-byte table index with its control byte at a load factor near
//! one half, and a 16-byte expiry-index element. (The slot held 48 bytes, both 16-byte
//! prefixes side by side, until 2026-12-04: 78 and 75 bytes per key.)

#![cfg_attr(docsrs, feature(doc_cfg))]
#![doc(test(attr(deny(warnings))))]
#![cfg_attr(not(test), warn(clippy::unwrap_used, clippy::expect_used, clippy::panic))]

mod algorithm;
mod attempts;
mod clock;
mod config;
mod engine;
mod error;
mod key;
mod shard;
mod stats;
mod store;

#[cfg(test)]
mod batch_paths;
#[cfg(test)]
mod pair_paths;
#[cfg(test)]
mod tests;

/// The workspace README's Rust examples, compiled and run as doctests so the README stays true.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
pub struct ReadmeDoctests;

pub use crate::algorithm::MemoryAlgorithm;
pub use crate::attempts::{
    MemoryAttemptLimiter, MemoryAttemptLimiterBuilder, MemoryAttemptReceipt, MemoryLeaseToken,
};
pub use crate::clock::{Clock, ManualClock, SystemClock};
pub use crate::config::{
    DEFAULT_EXPIRED_REMOVALS_PER_CHECK, DEFAULT_MAXIMUM_BATCH_SIZE, DEFAULT_SHARD_COUNT, MAX_BATCH_SIZE,
    MAX_EXPIRED_REMOVALS_PER_CHECK, MAX_KEYS, MAX_SHARD_COUNT, MemoryStoreConfig, MemoryStoreConfigError,
};
pub use crate::error::{GcraBatchError, GcraCheckError, MemoryBatchError, PoisonedShardError};
pub use crate::stats::{MemoryStoreStats, ShardStats};
pub use crate::store::{ShardedStore, ShardedStoreBuilder};

/// A sharded, hard-bounded, process-local store of anchored fixed windows.
///
/// Each [`FixedWindowPolicy`](runlimit_core::FixedWindowPolicy) subject gets a window that starts at its first allowed check and
/// lasts the policy's window; at most `limit` checks are allowed in it. Windows are not
/// aligned to wall-clock boundaries. At the deadline (not a millisecond before) the window is
/// over, and the next allowed check anchors a new one at its own time.
///
/// | outcome | values |
/// |---|---|
/// | allowed | [`Allowance`](runlimit_core::Allowance) with `capacity` = limit, `available` = limit − used (after this check), `replenishes_after` = deadline − now |
/// | quota exceeded | [`QuotaDenial`](runlimit_core::QuotaDenial) with `capacity` = limit, `retry_after` = deadline − now; nothing consumed |
/// | shadow policy exhausted | the same [`QuotaDenial`](runlimit_core::QuotaDenial), shadow-denied; nothing consumed |
/// | new key, shard full | [`Denial::StorageCapacity`](runlimit_core::Denial::StorageCapacity) in every quota mode |
///
/// All times are whole milliseconds of the store's [`Clock`], read once per operation, so
/// durations are exact at evaluation time. The policy fingerprint is part of the key, so
/// changing a policy's identifier, scope, limit or window starts independent counters, while
/// switching its [`QuotaMode`](runlimit_core::QuotaMode) keeps them.
///
/// The decisions come from [`runlimit_core::backend::fixed_window`], the rule every
/// fixed-window backend applies. See the [crate documentation](crate) for the storage
/// bounds, cleanup, poisoning and observer rules shared with [`GcraStore`]; the methods are
/// [`ShardedStore`]'s.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use runlimit_core::{Check, DecisionView, FixedWindowPolicy, KeyHasher, PolicyId, ScopeId};
/// use runlimit_memory::{ManualClock, MemoryStore, MemoryStoreConfig};
///
/// let policy = FixedWindowPolicy::new(
///     PolicyId::new("auth.login")?, ScopeId::new("client")?, 2, Duration::from_secs(60))?;
/// let hasher = KeyHasher::new(&[7; 32])?;
/// let clock = ManualClock::new();
/// let store = MemoryStore::builder(MemoryStoreConfig::new(1_000)?).with_clock(clock.clone()).build();
/// let check = Check::new(hasher.hash_for(&policy, b"client-network:192.0.2.4"));
///
/// store.check(&check)?; // anchors the window at 0 ms
/// clock.advance(Duration::from_millis(15_000));
/// let decision = store.check(&check)?;
/// let DecisionView::Allowed { allowance } = decision.view() else { panic!("{decision:?}") };
/// assert_eq!(allowance.available(), 0);
/// assert_eq!(allowance.replenishes_after().duration(), Duration::from_millis(45_000));
/// assert!(!store.check(&check)?.permits_request());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub type MemoryStore<C = SystemClock, O = ()> = ShardedStore<runlimit_core::FixedWindowPolicy, C, O>;

/// Builds a [`MemoryStore`] with a chosen [`Clock`] and [`runlimit_core::Observer`]; from
/// [`MemoryStore::builder`](ShardedStore::builder).
pub type MemoryStoreBuilder<C = SystemClock, O = ()> =
    ShardedStoreBuilder<runlimit_core::FixedWindowPolicy, C, O>;

/// A sharded, hard-bounded, process-local store of GCRA quotas: `quota` units replenish
/// continuously over each `period`, and a rested subject may spend up to `burst_capacity`
/// units at once, with no fixed-window boundary bursts.
///
/// Decisions come from the exact scaled-integer evaluator shared with PostgreSQL,
/// [`runlimit_core::backend::gcra`]: no floats, durations rounded up to whole milliseconds, unit counts
/// rounded down.
///
/// | outcome | values |
/// |---|---|
/// | allowed | [`Allowance`](runlimit_core::Allowance) with `capacity` = burst capacity, `available` = units spendable immediately, `replenishes_after` = time until fully rested |
/// | quota exceeded | [`QuotaDenial`](runlimit_core::QuotaDenial) with `capacity` = burst capacity, `retry_after` = earliest time the check fits; nothing consumed |
/// | shadow policy exhausted | the same denial, shadow-denied; nothing consumed |
/// | new key, shard full | [`Denial::StorageCapacity`](runlimit_core::Denial::StorageCapacity) in every quota mode |
///
/// Each key uses constant-size state and becomes eligible for bounded cleanup once its full
/// burst capacity has replenished. Storage bounds, cleanup, poisoning and observers work as
/// for [`MemoryStore`]; see the [crate documentation](crate). The methods are
/// [`ShardedStore`]'s.
///
/// # Examples
///
/// 10 units per second, burst 20 (an emission interval of 100 ms).
///
/// ```
/// use std::time::Duration;
/// use runlimit_core::{Check, DecisionView, GcraPolicy, KeyHasher, PolicyId, ScopeId};
/// use runlimit_memory::{GcraStore, ManualClock, MemoryStoreConfig};
///
/// let policy = GcraPolicy::new(
///     PolicyId::new("api.read")?, ScopeId::new("client")?, 10, Duration::from_secs(1), 20)?;
/// let hasher = KeyHasher::new(&[7; 32])?;
/// let clock = ManualClock::new();
/// let store = GcraStore::builder(MemoryStoreConfig::new(1_000)?).with_clock(clock.clone()).build();
/// let check = Check::new(hasher.hash_for(&policy, b"client-network:192.0.2.4"));
///
/// for _ in 0..20 {
///     assert!(store.check(&check)?.permits_request());
/// }
/// assert!(!store.check(&check)?.permits_request());
/// clock.advance(Duration::from_millis(100));
/// let decision = store.check(&check)?;
/// let DecisionView::Allowed { allowance } = decision.view() else { panic!("{decision:?}") };
/// assert_eq!(allowance.available(), 0);
/// assert_eq!(allowance.replenishes_after().duration(), Duration::from_secs(2));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub type GcraStore<C = SystemClock, O = ()> = ShardedStore<runlimit_core::GcraPolicy, C, O>;

/// Builds a [`GcraStore`] with a chosen [`Clock`] and [`runlimit_core::Observer`]; from
/// [`GcraStore::builder`](ShardedStore::builder).
pub type GcraStoreBuilder<C = SystemClock, O = ()> = ShardedStoreBuilder<runlimit_core::GcraPolicy, C, O>;

/// This crate's README (what crates.io shows), compiled and run as doctests so it stays true.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct CrateReadmeDoctests;
