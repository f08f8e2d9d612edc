//! Replica-safe anchored fixed windows on PostgreSQL, with bundled migrations, hard-bounded
//! cardinality and bounded maintenance.
//!
//! (Crate docs are completed below.)

#![cfg_attr(docsrs, feature(doc_cfg))]
#![doc(test(attr(deny(warnings))))]
#![cfg_attr(not(test), warn(clippy::unwrap_used, clippy::expect_used, clippy::panic))]

mod config;
mod decide;
mod error;
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
pub use crate::limiter::PostgresLimiter;
pub use crate::migrations::{
    BOUND_RUNLIMIT_FIXED_WINDOW_CARDINALITY_SQL, CREATE_RUNLIMIT_FIXED_WINDOWS_SQL, MIGRATION_VERSIONS,
    MIGRATOR, SET_RUNLIMIT_FIXED_WINDOWS_FILLFACTOR_SQL,
};
