//! Replica-safe rate limiting on PostgreSQL with SQLx: anchored fixed windows, GCRA and
//! attempt limiting, each shared by every replica connected to the same database.
//!
//! - [`PostgresLimiter`] implements the same anchored fixed-window semantics as
//!   `runlimit_memory::MemoryStore` on a SQLx [`PgPool`](sqlx::PgPool): the first allowed
//!   check of a key anchors a window of the policy's length, denied and shadow-denied checks
//!   consume nothing, and an allowed batch commits every member in one transaction. Keys are
//!   locked in a deterministic order with `pg_advisory_xact_lock(bigint)`, and an admission
//!   costs a fixed number of round trips and statements whatever the batch size: statements
//!   prepared on each connection and, for new keys and ended windows, PL/pgSQL functions the
//!   migrations install, whose plans PostgreSQL keeps per connection
//!   (see [the operations guide](operations#admission-functions-and-rolling-deploys)).
//! - [`PostgresGcraLimiter`] shares a continuously replenished GCRA quota the same way and
//!   decides exactly like `runlimit_memory::GcraStore`, fed with whole-millisecond database
//!   time clamped to a committed per-shard watermark. It has its own tables and migration
//!   stream ([`GCRA_MIGRATOR`], [`CREATE_RUNLIMIT_GCRA_SQL`],
//!   [`INDEX_RUNLIMIT_GCRA_SHARD_EXPIRY_SQL`], [`ADD_RUNLIMIT_GCRA_ROW_LOCK_PROTOCOL_SQL`]), and
//!   two admission protocols: shard ledger locks, or, once switched, row locks for one-check
//!   admissions ([`PostgresGcraLimiter::switch_to_row_locks`]).
//! - [`attempts::PostgresAttemptLimiter`] admits at most one active attempt per subject with
//!   exponential backoff after failures, with a seam for completing an attempt inside an
//!   application-owned transaction. Its own tables and migration stream too.
//!
//! The first two are one type, [`PostgresStore`], generic over the policy it counts; all three
//! share one transaction skeleton and decide by the rules every Runlimit backend applies
//! (`runlimit_core::backend`). PostgreSQL is the authority for time
//! (`pg_catalog.clock_timestamp()`, sampled after every lock). Cardinality is hard-bounded by
//! 256 capacity shards whose row counts the database enforces even for writers that bypass the
//! library. Every database failure fails closed and says whether quota may have been consumed.
//!
//! # Example
//!
//! ```no_run
//! use std::time::Duration;
//! use runlimit_core::{BatchDecisionView, Check, FixedWindowPolicy, KeyHasher, PolicyId, ScopeId};
//! use runlimit_postgres::{PostgresConfig, PostgresLimiter};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let pool = sqlx::postgres::PgPoolOptions::new()
//!     .max_connections(16)
//!     .connect(&std::env::var("DATABASE_URL")?)
//!     .await?;
//! let config = PostgresConfig::default()
//!     .with_pool_acquire_timeout(Duration::from_millis(250))?
//!     .with_operation_timeout(Duration::from_millis(500))?;
//! let limiter = PostgresLimiter::new(pool).with_config(config);
//! limiter.migrate().await?; // before serving traffic
//!
//! let client = FixedWindowPolicy::new(
//!     PolicyId::new("auth.login")?, ScopeId::new("client")?, 40, Duration::from_secs(60))?;
//! let identity = FixedWindowPolicy::new(
//!     PolicyId::new("auth.login")?, ScopeId::new("identity")?, 8, Duration::from_secs(60))?;
//! let hasher = KeyHasher::new(std::env::var("RUNLIMIT_KEY_SECRET")?.as_bytes())?;
//! let checks = [
//!     Check::new(hasher.hash_for(&client, b"client-network:192.0.2.4")),
//!     Check::new(hasher.hash_for(&identity, b"user@example.test")),
//! ];
//! match limiter.check_all(&checks).await {
//!     Ok(decision) => match decision.view() {
//!         BatchDecisionView::Allowed { .. } | BatchDecisionView::ShadowDenied { .. } => { /* admit */ }
//!         BatchDecisionView::Denied { index, .. } => println!("check {index} denied"),
//!     },
//!     // Fail closed. `error.consumption()` says whether quota may have been consumed; never
//!     // replay an operation whose commit outcome is unknown.
//!     Err(error) => println!("rate limiter unavailable: {error}"),
//! }
//! # Ok(())
//! # }
//! # let _ = run;
//! ```
//!
//! # Feature flags
//!
//! | Feature | Default | What it enables |
//! |---|---|---|
//! | `serde` | no | `Serialize`/`Deserialize` for [`PostgresConfig`] (durations as exact seconds and nanoseconds; deserialization validates, rejects unknown fields and fills absent fields with defaults). Enables `runlimit-core/serde`. |
//!
//! TLS is left to the application: enable a `sqlx` `tls-*` feature in the application's own
//! dependency on `sqlx`.
//!
//! # Schema
//!
//! Everything lives in the `public` schema, named explicitly everywhere:
//! `public.runlimit_fixed_windows` (one row per counter key) and
//! `public.runlimit_fixed_window_shards` (the capacity ledger, 256 rows), plus four trigger
//! functions `public.runlimit_fixed_windows_*` that pin `search_path = pg_catalog, pg_temp`.
//! The GCRA stream adds `public.runlimit_gcra`, its two capacity ledgers
//! `public.runlimit_gcra_shards` and `public.runlimit_gcra_ledger` (one of the two holds the 256
//! rows: the second once the protocol is switched to row locks), the trigger functions
//! `public.runlimit_gcra_*` and the switch function `public.runlimit_gcra_switch_to_row_locks()`,
//! with the same rules.
//! Every statement an admission sends or prepares names its tables, functions, types and
//! operators schema-qualified (`OPERATOR(pg_catalog.=)`), the PL/pgSQL functions pin
//! `search_path = pg_catalog, pg_temp`, and the other operations (peek, reset, cleanup) set that
//! `search_path` for their transaction before any statement that resolves names, so a
//! caller-controlled `search_path` (a hostile `clock_timestamp()`, `=` operator or same-named
//! table earlier on the path) changes nothing.
//! The migrations themselves run with the migrating connection's `search_path`; run them with a
//! trusted one.
//!
//! The operations guide, [`operations`], covers advisory-lock sharing, shard headroom, cleanup
//! scheduling, autovacuum and monitoring, migrations shared with a host application, and the
//! rules replicas must follow.

#![cfg_attr(docsrs, feature(doc_cfg))]
#![doc(test(attr(deny(warnings))))]
#![cfg_attr(not(test), warn(clippy::unwrap_used, clippy::expect_used, clippy::panic))]

pub mod attempts;
mod config;
mod error;
mod fixed_window;
mod gcra;
mod migrations;
mod observe;
pub mod operations;
mod prepared;
mod script;
mod store;
mod transaction;
mod url;

pub use crate::config::{
    CAPACITY_SHARDS, ConfigError, MAX_ROWS_PER_SHARD, MAX_TIMEOUT, MAX_TIMEOUT_MILLIS, PostgresConfig,
};
pub use crate::error::{
    BatchCheckError, CheckError, CheckPhase, MaintenanceError, MaintenancePhase, MigrationError,
};
pub use crate::fixed_window::migrations::{
    ADD_RUNLIMIT_FIXED_WINDOW_ADMISSION_FUNCTIONS_SQL, BOUND_RUNLIMIT_FIXED_WINDOW_CARDINALITY_SQL,
    CREATE_RUNLIMIT_FIXED_WINDOWS_SQL, MIGRATION_VERSIONS, MIGRATOR,
    SET_RUNLIMIT_FIXED_WINDOWS_FILLFACTOR_SQL,
};
pub use crate::gcra::migrations::{
    ADD_RUNLIMIT_GCRA_ROW_LOCK_PROTOCOL_SQL, CREATE_RUNLIMIT_GCRA_SQL, GCRA_MIGRATION_VERSIONS,
    GCRA_MIGRATOR, INDEX_RUNLIMIT_GCRA_SHARD_EXPIRY_SQL,
};
pub use crate::store::{PostgresAlgorithm, PostgresStore};
pub use crate::url::connect_options_from_url;

/// Anchored fixed-window rate limiting stored in PostgreSQL and shared by every replica using
/// the same database.
///
/// Implements [`Limiter`](runlimit_core::Limiter) with
/// [`FixedWindowPolicy`](runlimit_core::FixedWindowPolicy), with the same semantics as
/// `runlimit_memory::MemoryStore`: the first allowed check of a key anchors a window of the
/// policy's length; checks inside it count against the limit; denied and shadow-denied checks
/// consume nothing; an allowed batch commits every member in one transaction and a denied
/// batch consumes nothing. Every decision is `runlimit_core::backend::fixed_window` and the
/// batch rule of `runlimit_core::backend::batch`, the rules every backend applies. The methods
/// are [`PostgresStore`]'s.
///
/// # Protocol
///
/// Each admission is one `READ COMMITTED` transaction of a fixed number of SQL round trips,
/// whatever the batch size (see [`CheckPhase`] for the phases): begin, lock every key's
/// advisory lock in ascending lock-id order, preflight (read and row-lock the counters, then
/// sample `pg_catalog.clock_timestamp()`), reserve (only when a key has no row: lock the
/// capacity ledger rows of the new keys' shards in ascending order), then — only when allowed —
/// update, and commit. The decision is built in Rust from the preflight and reserve responses
/// before anything is written; a denial rolls back a transaction that wrote nothing.
///
/// PostgreSQL is the authority for time. Delays are measured at the clock sample and may
/// overstate the remaining time at the caller by commit and transport latency.
///
/// # Time
///
/// PostgreSQL is the authority: each admission samples `pg_catalog.clock_timestamp()` after
/// its locks. The rule works in whole milliseconds: the sample is truncated to the
/// millisecond, a new window is anchored at it, and a stored window end with a sub-millisecond
/// part (written by a release that anchored at the microsecond) is rounded up, so a window
/// never ends early. Delays are whole milliseconds measured at the clock sample and may
/// overstate the remaining time at the caller by commit and transport latency.
///
/// # Cleanup
///
/// Expiry does not free a capacity slot: [`cleanup_expired`](PostgresStore::cleanup_expired)
/// must delete a row first. Its pass is one transaction and one `DELETE`: the clock is sampled
/// once (so the expiry predicate is an index range condition and finding nothing expired costs
/// one index probe), rows an admission currently holds are skipped, and the affected ledger
/// rows are locked in ascending shard order. A new key in a full shard is denied with
/// [`Denial::StorageCapacity`](runlimit_core::Denial::StorageCapacity) without a delay.
///
/// # Cancel safety
///
/// See [`PostgresStore`](PostgresStore#cancel-safety).
///
/// # Examples
///
/// ```no_run
/// use std::time::Duration;
/// use runlimit_core::{Check, FixedWindowPolicy, KeyHasher, PolicyId, ScopeId};
/// use runlimit_postgres::{PostgresConfig, PostgresLimiter};
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let pool = sqlx::postgres::PgPoolOptions::new()
///     .max_connections(16)
///     .connect("postgres://app@db.internal/app")
///     .await?;
/// let limiter = PostgresLimiter::new(pool)
///     .with_config(PostgresConfig::default().with_operation_timeout(Duration::from_millis(500))?);
/// limiter.migrate().await?;
///
/// let policy = FixedWindowPolicy::new(
///     PolicyId::new("auth.login")?, ScopeId::new("identity")?, 8, Duration::from_secs(60))?;
/// let hasher = KeyHasher::new(&[7u8; 32])?;
/// let decision = limiter.check(&Check::new(hasher.hash_for(&policy, b"user@example.test"))).await?;
/// if !decision.permits_request() {
///     // reject
/// }
/// # Ok(())
/// # }
/// # let _ = run;
/// ```
pub type PostgresLimiter<O = ()> = PostgresStore<runlimit_core::FixedWindowPolicy, O>;

/// GCRA (continuously replenished) rate limiting stored in PostgreSQL and shared by every
/// replica using the same database.
///
/// Implements [`Limiter`](runlimit_core::Limiter) with [`GcraPolicy`](runlimit_core::GcraPolicy)
/// and accepts the same policy-bound checks as
/// `runlimit_memory::GcraStore`, with the same decisions: each check costs its [`cost`](runlimit_core::Check::cost), `quota`
/// units replenish continuously over each `period`, a rested subject may spend up to
/// `burst_capacity` at once. Decisions come from `runlimit_core::backend::gcra::evaluate`, the
/// exact scaled-integer evaluator `GcraStore` uses, and the batch rule of
/// `runlimit_core::backend::batch`: retry and replenishment durations round up to whole
/// milliseconds, unit counts round down. The methods are [`PostgresStore`]'s.
///
/// | outcome | values |
/// |---|---|
/// | allowed | [`Allowance`](runlimit_core::Allowance): `capacity` = burst capacity, `available` = units spendable immediately, `replenishes_after` = time until fully rested |
/// | quota exceeded | [`QuotaDenial`](runlimit_core::QuotaDenial): `capacity` = burst capacity, `retry_after` = earliest whole millisecond the check fits; nothing consumed |
/// | shadow policy exhausted | the same denial, shadow-denied; nothing consumed |
/// | new key, shard full | [`Denial::StorageCapacity`](runlimit_core::Denial::StorageCapacity) without a delay, in every quota mode (only cleanup frees a slot) |
///
/// # Time
///
/// PostgreSQL is the authority: each admission samples `pg_catalog.clock_timestamp()` after
/// its locks and truncates it to whole milliseconds since the Unix epoch
/// (`floor(extract(epoch from ..) * 1000)`, exact since PostgreSQL 14 returns `numeric`). Each
/// of the 256 capacity shards keeps a committed time watermark, the latest time a cleanup, an
/// insert or a batch of that shard used; an operation evaluates at the later of its clock
/// sample and the watermarks of the shards it locked, so a backwards clock step never
/// replenishes quota early or makes a row expire sooner. (A one-check admission of a stored
/// key does not advance it: its own `max(tat, now)` never replenishes early at an earlier
/// reading, and only deleted rows need the watermark.) Delays are measured at
/// the clock sample and may conservatively include later commit and transport latency.
///
/// # Protocols: ledger locks, then row locks
///
/// A database runs one of two admission protocols. Every database starts on the *ledger-lock*
/// protocol except one whose GCRA tables [`migrate`](PostgresStore::migrate) installs, which it
/// switches to *row locks* at once; an existing database stays on ledger locks until its
/// operator calls [`switch_to_row_locks`](PostgresStore::switch_to_row_locks), once every replica
/// runs this release or a later one (see the
/// [operations guide](operations#switching-gcra-to-row-locks)). The switch is one way. Both
/// protocols give every guarantee above and below; they differ in what an admission locks.
///
/// **Ledger locks.** One `READ COMMITTED` transaction of two round trips whatever the batch
/// size. A batch: begin, the transaction-local settings, lock the ledger rows of every shard
/// the batch touches in ascending shard order (`FOR UPDATE`, before any counter is read or
/// written, including for keys without a row), read the stored arrival times and sample the
/// clock, decide in Rust, then — only when allowed — advance the watermarks, update or insert
/// every member, and commit in input order together. A denial rolls back a transaction that
/// wrote nothing. A one-check admission takes the same settings and ledger row lock, then, in
/// the statement that samples the clock, reads the key's arrival time and, when the check fits,
/// updates the row *provisionally* to `max(tat, now × Q) + cost × P`; Rust decides from the
/// stored time with the same evaluator, checks that the statement wrote exactly what it allows
/// (or nothing, for a denial), and sends `COMMIT` alone or `ROLLBACK`. A new key is inserted
/// before `COMMIT` as in a batch. Locking the shard rather than the key serializes keys of the
/// same shard.
///
/// **Row locks.** The ledger rows live in `public.runlimit_gcra_ledger` instead. A one-check
/// admission of a stored key takes no ledger lock: after the settings, one statement samples
/// the clock (clamped to the shard's watermark) and updates the key's row to
/// `max(tat, now × Q) + cost × P` when the check fits, evaluated by PostgreSQL on the row's latest committed
/// version (an `UPDATE` that waited for a concurrent writer re-evaluates its condition and
/// values on the version that writer committed), so two admissions of a key never decide on
/// the same stored time. Rust checks the written time against the evaluator and sends `COMMIT`
/// alone; a check that does not fit writes nothing, and the second round trip reads the key's
/// latest time (its retry-after is measured from it, at the first statement's clock sample)
/// with `ROLLBACK`; a new key is inserted under its shard's ledger row lock, which also bounds
/// the shard's rows. A check whose key's row went away under it, or whose insert was refused
/// (another admission inserted the key, or a batch or cleanup moved the shard's watermark past
/// its clock sample), is decided again as a batch of one with locking reads. Batches, cleanup and
/// resets lock ledger rows as before; batches read their keys' rows without row locks and write
/// each only if it still holds the time read, so a one-check update in between makes the write
/// refuse before `COMMIT`, and the batch is decided again, this time reading its rows `FOR NO
/// KEY UPDATE` (in key order) before sampling the clock. A one-check admission that waits for
/// another admission of the same key decides at the clock sample taken when its statement
/// started, before the wait: never early, and its delays are at most the wait longer.
///
/// Replicas that know both protocols learn the switch from the database (the ledger-lock
/// statements find no ledger row; the admission is then rolled back and made on row locks), so
/// they need no restart. Replicas of releases before the row-lock protocol find no ledger row
/// either, and fail closed with [`CheckError::MalformedResponse`] (nothing consumed): after the
/// switch they can no longer decide beside the row-lock admissions without the lock they rely
/// on. The shard of a key (byte 32 of the counter key) and the shard locking order are
/// persistent protocol. [`CheckPhase`] names the phases: `Begin` (begin and settings), `Lock`
/// (ledger rows), `Preflight` (read, clock and, for a row-lock one-check, its update),
/// `Update` (the writes).
///
/// # Capacity
///
/// 256 shards of at most [`MAX_ROWS_PER_SHARD`] (65,536) rows,
/// enforced by the database for every writer, with the lower operational bound
/// [`PostgresConfig::maximum_rows_per_shard`] (4,096 by default) checked under the shard lock
/// (on row locks, by the insert of a new key, under its shard's ledger row lock).
/// A row expires once its key is fully rested; an expired row still occupies its slot until
/// [`cleanup_expired`](PostgresStore::cleanup_expired) deletes it, but stays reusable by its own
/// key. Active rows are never evicted.
///
/// # Cleanup
///
/// One transaction of three round trips. Discovery probes the `(capacity_shard,
/// expires_at_ms)` index once per shard (at most 256 index probes), each under that shard's
/// clamped clock `max(clock, watermark)`, and locks the ledger rows of the shards with an
/// expired row in ascending shard order, skipping shards an admission or another cleanup holds
/// (`SKIP LOCKED`); the deletion re-checks each row's expiry on its latest version, so a row a
/// row-lock admission renewed meanwhile is kept. Deletion then reads at most `maximum_rows` eligible rows per locked shard
/// (index range scans; active rows lie outside them), deletes the globally oldest
/// `maximum_rows` of those and advances the locked shards' watermarks to the time it used, so a
/// later backwards clock step cannot treat a deleted key as rested early. The transaction sets
/// `enable_seqscan = off` locally so this bounded index plan is chosen whatever the table
/// statistics (a small or unanalyzed table otherwise gets sequential scans). Phases:
/// [`MaintenancePhase::Begin`] covers begin, settings and discovery,
/// [`MaintenancePhase::Delete`] the deletion.
///
/// # Cancel safety
///
/// See [`PostgresStore`](PostgresStore#cancel-safety): nothing happens until the future is
/// first polled; dropping it before `COMMIT` is sent rolls back; dropping it while `COMMIT` is
/// in flight leaves the outcome unknown.
///
/// # Examples
///
/// ```no_run
/// use std::time::Duration;
/// use runlimit_core::{Check, GcraPolicy, KeyHasher, PolicyId, ScopeId};
/// use runlimit_postgres::PostgresGcraLimiter;
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let pool = sqlx::postgres::PgPoolOptions::new()
///     .max_connections(16)
///     .connect("postgres://app@db.internal/app")
///     .await?;
/// let limiter = PostgresGcraLimiter::new(pool);
/// limiter.migrate().await?;
///
/// let policy = GcraPolicy::new(
///     PolicyId::new("api.read")?, ScopeId::new("client")?, 10, Duration::from_secs(1), 20)?;
/// let hasher = KeyHasher::new(&[7u8; 32])?;
/// let check = Check::new(hasher.hash_for(&policy, b"client-network:192.0.2.4"));
/// if !limiter.check(&check).await?.permits_request() {
///     // reject
/// }
/// // Periodically, for example every few seconds:
/// let removed = limiter.cleanup_expired(1_000).await?;
/// # let _ = removed;
/// # Ok(())
/// # }
/// # let _ = run;
/// ```
pub type PostgresGcraLimiter<O = ()> = PostgresStore<runlimit_core::GcraPolicy, O>;

/// This crate's README (what crates.io shows), compiled and run as doctests so it stays true.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct CrateReadmeDoctests;
