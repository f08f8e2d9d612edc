//! Replica-safe anchored fixed windows on PostgreSQL: a [`Limiter`](runlimit_core::Limiter)
//! whose quota is shared by every replica connected to the same database.
//!
//! [`PostgresLimiter`] implements the same anchored fixed-window semantics as
//! `runlimit_memory::MemoryStore` on a SQLx [`PgPool`](sqlx::PgPool): the first allowed check
//! of a key anchors a window of the policy's length, denied and shadow-denied checks consume
//! nothing, and an allowed batch commits every member in one transaction. PostgreSQL is the
//! authority for time (`pg_catalog.clock_timestamp()`), keys are locked in a deterministic order
//! with `pg_advisory_xact_lock(bigint)`, and an admission costs a fixed number of round trips
//! whatever the batch size. Cardinality is hard-bounded by 256 capacity shards whose row counts
//! a trigger-maintained ledger enforces even for writers that bypass the library. Every
//! database failure fails closed and says whether quota may have been consumed.
//!
//! [`PostgresGcraLimiter`] shares a continuously replenished GCRA quota the same way: it
//! implements [`Limiter`](runlimit_core::Limiter) with
//! [`GcraPolicy`](runlimit_core::GcraPolicy) and decides exactly like
//! `runlimit_memory::GcraStore`, through the shared evaluator [`runlimit_core::gcra`], fed with
//! whole-millisecond database time clamped to a committed per-shard watermark. It has its own
//! tables and its own migration stream ([`GCRA_MIGRATOR`], [`CREATE_RUNLIMIT_GCRA_SQL`],
//! [`INDEX_RUNLIMIT_GCRA_SHARD_EXPIRY_SQL`]); fixed-window users need no schema or workflow
//! change. Its type docs describe the GCRA v1 protocol, capacity and cleanup.
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
//! The GCRA stream adds `public.runlimit_gcra`, `public.runlimit_gcra_shards` and the trigger
//! functions `public.runlimit_gcra_*`, with the same rules.
//! Every admission and cleanup sets the transaction-local `search_path` to
//! `pg_catalog, pg_temp` before any statement that resolves names, and names only
//! schema-qualified functions before that, so a caller-controlled `search_path` (a hostile
//! `clock_timestamp()`, `=` operator or same-named table earlier on the path) changes nothing.
//! The migrations themselves run with the migrating connection's `search_path`; run them with a
//! trusted one.
//!
//! The operations guide, [`operations`], covers advisory-lock sharing, shard headroom, cleanup
//! scheduling, autovacuum and monitoring, migrations shared with a host application, and the
//! rules replicas must follow.

#![cfg_attr(docsrs, feature(doc_cfg))]
#![doc(test(attr(deny(warnings))))]
#![cfg_attr(not(test), warn(clippy::unwrap_used, clippy::expect_used, clippy::panic))]

mod admission;
pub mod attempts;
mod config;
mod decide;
mod error;
mod gcra;
mod limiter;
mod migrations;
pub mod operations;
mod protocol;

pub use crate::config::{
    CAPACITY_SHARDS, ConfigError, MAX_ROWS_PER_SHARD, MAX_TIMEOUT, MAX_TIMEOUT_MILLIS, PostgresConfig,
};
pub use crate::error::{
    BatchCheckError, CheckError, CheckPhase, MaintenanceError, MaintenancePhase, MigrationError,
};
pub use crate::gcra::{
    PostgresGcraLimiter,
    migrations::{
        CREATE_RUNLIMIT_GCRA_SQL, GCRA_MIGRATION_VERSIONS, GCRA_MIGRATOR,
        INDEX_RUNLIMIT_GCRA_SHARD_EXPIRY_SQL,
    },
};
pub use crate::limiter::PostgresLimiter;
pub use crate::migrations::{
    BOUND_RUNLIMIT_FIXED_WINDOW_CARDINALITY_SQL, CREATE_RUNLIMIT_FIXED_WINDOWS_SQL, MIGRATION_VERSIONS,
    MIGRATOR, SET_RUNLIMIT_FIXED_WINDOWS_FILLFACTOR_SQL,
};
