//! Shared anchored fixed windows and GCRA on Redis (or Valkey), with Runlimit's guarantees.
//!
//! [`RedisLimiter`] (anchored fixed windows) and [`RedisGcraLimiter`] (GCRA) implement
//! [`runlimit_core::Limiter`] and [`runlimit_core::QuotaControl`] for quotas shared by every
//! replica that uses the same server and [key prefix](RedisConfig::key_prefix). Decisions are
//! exactly those of the memory and PostgreSQL backends: the same rules of
//! `runlimit_core::backend`, the same conformance suite.
//!
//! # Example
//!
//! ```no_run
//! use std::time::Duration;
//! use runlimit_core::{Check, FixedWindowPolicy, KeyHasher, PolicyId, ScopeId};
//! use runlimit_redis::RedisLimiter;
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let policy = FixedWindowPolicy::new(
//!     PolicyId::new("api.read")?, ScopeId::new("account")?, 100, Duration::from_secs(60))?;
//! let key_hasher = KeyHasher::new(b"an example secret of at least 32 bytes")?;
//! let limiter = RedisLimiter::new("redis://127.0.0.1:6379")?;
//! limiter.prepare().await?; // Redis >= 7.0, noeviction, scripts loaded
//! let decision = limiter.check(&Check::new(key_hasher.hash_for(&policy, b"account:42"))).await?;
//! assert!(decision.permits_request());
//! # Ok(())
//! # }
//! # let _ = run;
//! ```
//!
//! # One script per admission
//!
//! A single check or a whole atomic batch is one Lua script, called with `EVALSHA` (after
//! `NOSCRIPT`, the script is loaded and sent once more, which is safe: it did not run). The
//! script reads everything and evaluates every check first, and writes only when every check
//! is allowed and every new key fits its shard: Redis never rolls a script back, so nothing
//! after the first write can fail. The decision returned to the caller is computed by
//! `runlimit_core::backend`'s rules from the state the script read and the time it used, and
//! checked against what the script did; a disagreement is an error, never a decision.
//!
//! # Time
//!
//! Time is the server's: `TIME` inside the script, truncated to whole milliseconds and
//! clamped up to a per-shard watermark of the latest time an operation on the shard used, so
//! a server clock stepping back, or a failover to a server whose clock is behind, never
//! replenishes early. The client never sends a time. Scripts replicate their effects (Redis
//! 7.0 or newer), so replicas never re-run them against their own clocks. Delays are measured
//! when the script runs and may overstate the remaining time at the caller by the reply's
//! transport time.
//!
//! # Exact arithmetic
//!
//! Lua numbers are doubles, exact only below 2⁵³. The scripts keep every millisecond value
//! below 2⁵³ (times and deadlines near the current time plus at most
//! [`MAX_WINDOW`](runlimit_core::MAX_WINDOW)), hold 64-bit counts and GCRA remainders as two
//! exact base-10⁹ limbs, and never format a number with Lua's `tostring`. GCRA state is kept
//! relative to the current time: the client divides the policy's scaled products by the
//! quota exactly, in 128 bits, and the script only compares, adds and subtracts. So every
//! policy `runlimit_core` accepts, up to [`MAX_LIMIT`](runlimit_core::MAX_LIMIT) units and
//! [`MAX_WINDOW`](runlimit_core::MAX_WINDOW), is evaluated exactly: there is no narrower
//! domain and no approximation.
//!
//! # Storage bounds
//!
//! State is grouped into [`SHARDS`] shards by the first byte of the subject key, each holding
//! at most [`RedisConfig::maximum_keys_per_shard`] keys (4,096 by default). A new key for a
//! full shard is denied with `Denial::StorageCapacity`, with the time until the shard's
//! earliest expiry (when at most 256 stored states must be read to know it; otherwise without
//! a delay); live state is never evicted. An admission whose new keys may not fit their shard
//! first removes up to [`RedisConfig::expired_removals_per_check`] expired entries per check
//! from it (expired entries change no decision except by holding a slot, so an admission with
//! room cleans nothing); schedule [`RedisStore::cleanup_expired`] to reclaim memory in every
//! shard. No Redis TTL is set or decides anything. [`RedisStore::prepare`] refuses a server whose `maxmemory-policy` is not
//! `noeviction` (eviction silently resets limits), and the scripts do not set `allow-oom`,
//! so a server over `maxmemory` refuses them before they run (not consumed).
//!
//! The key layout (protocol version 1), per shard, with `<base>` = `{<prefix>}:<fw|gcra>1:<shard as two hex digits>:`
//! (or `{<prefix>:<fw|gcra>1:<shard>}:` under [`Placement::PerShard`]):
//!
//! | key | type | holds |
//! |---|---|---|
//! | `<base>s` | hash | member → state (`<deadline ms>:<used>`, or GCRA `<t>:<r>`), and the fields `w` (the shard's time watermark in ms), `n` (the entries it holds) and `e` (a lower bound of its earliest expiry in ms) |
//! | `<base>i` | sorted set | each non-empty expiry bucket (0 to 63), scored by a lower bound of its earliest expiry |
//! | `<base>x<bucket>` | sorted set | member, scored by its state's expiry in ms |
//!
//! A member is 24 opaque bytes (8 of the policy fingerprint, 16 of the HMAC subject key): no
//! raw subject is ever stored. The bucket is the subject key's second byte modulo 64.
//!
//! An admission of keys stored in one shard (a single check, or a batch within one shard) is
//! three commands: `TIME`, one `HMGET` of the states and the shard's fields, one `HSET` of them
//! all. Expiry scores are lower bounds: exact when a member is added, and never rewritten by
//! admissions, since an entry's expiry never decreases (time only moves forward). Cleanup (by admissions, up to
//! [`RedisConfig::expired_removals_per_check`] entries per check, and by
//! [`RedisStore::cleanup_expired`]) reads the state behind each score that has passed, removes
//! the expired entries and re-scores the live ones at their real expiry, as the memory stores'
//! lazy expiry heap does. Small expiry buckets are stored compactly by Redis (listpacks below
//! `zset-max-listpack-entries`, 128 by default).
//!
//! # Failures
//!
//! Every error fails closed and says whether quota may have been consumed
//! ([`CheckError::consumption`]): nothing is sent before a live connection is at hand, so
//! connection failures are `NotConsumed`; an error reply means the script did not write
//! (`NotConsumed`); a timeout or lost connection after the request was handed to the
//! connection is `MayHaveBeenConsumed`. Nothing is retried (redis-rs' connection manager
//! and cluster client are not used on the admission path because they resend commands).
//! Admissions never go to replicas. Replication is asynchronous: a failover can lose
//! acknowledged admissions, which over-admits by at most what the new primary had not
//! received.
//!
//! # Redis Cluster
//!
//! All keys of one admission share a hash slot by construction: under
//! [`Placement::SingleSlot`] (the default) the whole limiter is one slot, so any batch is
//! atomic; under [`Placement::PerShard`] each shard is its own slot and a batch must stay in
//! one shard ([`BatchCheckError::SpansShards`] otherwise, before any I/O, on every server).
//! [`RedisStore::prepare`] detects a cluster from the URL's server, reads its slot map and
//! from then on sends each script straight to the primary of its slot (every key of a limiter
//! shard shares one slot, so the client computes it before sending). A redirection (`MOVED`,
//! `ASK`, `TRYAGAIN`, `CLUSTERDOWN`) is not followed: it is returned as a `NotConsumed`
//! [`CheckError::Server`] (the script did not run) and the slot map is read again, so the next
//! admission goes where the cluster now says. Admissions never go to replicas.
//!
//! # Connections
//!
//! A [`RedisConnector`] holds one multiplexed connection per server (per cluster primary) and
//! is shared by every limiter built from it ([`RedisStore::from_connector`]), so a process
//! needs one per Redis deployment. It opens TCP (`redis://`), TLS (`rediss://`, rustls with
//! the system's roots or a [`RedisTls`] of your own: a private CA, a client certificate) and
//! Unix sockets (`redis+unix://`, `unix://`), finds the primary through Redis Sentinel
//! ([`RedisSentinel`]), authenticates ACL users, and runs the
//! [eviction watch](RedisConnector#the-eviction-watch): an evicting `maxmemory-policy` set
//! after [`RedisStore::prepare`] makes every operation fail closed within one interval (1 s by
//! default) and one round of readings. Every connection-level error names the server it tried and the cause.
//!
//! # Servers
//!
//! Tested against Redis 7.0.15 (TCP, TLS, Unix sockets, ACL users, Redis Cluster). Valkey
//! speaks the same protocol but has not been tested: no Valkey server package was installable
//! on the test machine (Debian 12).

#![cfg_attr(docsrs, feature(doc_cfg))]
#![doc(test(attr(deny(warnings))))]
#![cfg_attr(not(test), warn(clippy::unwrap_used, clippy::expect_used, clippy::panic))]

mod algorithm;
mod client;
mod config;
mod connector;
mod error;
mod layout;
mod observe;
mod store;
mod watch;

pub use crate::algorithm::RedisAlgorithm;
pub use crate::config::{
    ConfigError, KeyPrefix, MAX_EXPIRED_REMOVALS_PER_CHECK, MAX_KEY_PREFIX_LEN, MAX_KEYS_PER_SHARD,
    MAX_TIMEOUT, Placement, RedisConfig, SHARDS,
};
pub use crate::connector::{RedisConnector, RedisSentinel, RedisTls};
pub use crate::error::{BatchCheckError, CheckError, MaintenanceError, PrepareError, TlsError, UrlError};
pub use crate::store::{RedisGcraLimiter, RedisLimiter, RedisStore};
pub use crate::watch::{
    DEFAULT_EVICTION_WATCH_INTERVAL, MAX_EVICTION_WATCH_INTERVAL, MIN_EVICTION_WATCH_INTERVAL,
};

/// This crate's README (what crates.io shows), compiled as doctests so it stays true.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct CrateReadmeDoctests;
