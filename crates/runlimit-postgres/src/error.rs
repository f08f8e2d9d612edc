//! One error type per operation, each classifying whether quota (or rows) may have changed.

use std::{fmt, time::Duration};

use runlimit_core::{BatchError, ConsumptionStatus};

/// The pre-commit phase of an admission that a [`CheckError`] interrupted.
///
/// Every phase precedes `COMMIT`, so an error naming a phase never consumed quota. The phases
/// run in this order; begin, lock and preflight share the first round trip, reserve (only when
/// a key has no row yet) has its own, and update shares the last round trip with `COMMIT`:
///
/// | phase | statement |
/// |---|---|
/// | [`Begin`](Self::Begin) | `BEGIN ISOLATION LEVEL READ COMMITTED, READ WRITE` |
/// | [`Lock`](Self::Lock) | the transaction-local `statement_timeout` and `lock_timeout`, then `pg_catalog.pg_advisory_xact_lock(bigint)` for every key in ascending lock-id order (the prepared statement `runlimit_fixed_window_lock_one_v1` or `_batch_v1`) |
/// | [`Preflight`](Self::Preflight) | row-locks the batch's stored counters by adding each check's cost provisionally (one `UPDATE`), reads them as they were, and samples `pg_catalog.clock_timestamp()` after each row lock (the prepared statement `runlimit_fixed_window_preflight_one_v1` or `_batch_v1`); on a connection that has not prepared these statements yet, the `ROLLBACK` sent first is part of [`Begin`](Self::Begin) and each `PREPARE` (sent right before the `EXECUTE` of its statement) part of that statement's phase |
/// | [`Reserve`](Self::Reserve) | row-locks and reads the counters of the keys the preflight did not return (incrementing provisionally those whose increment fits in `bigint`), locks the capacity ledger rows of their shards in ascending order, reads their row counts, samples the clock again (`public.runlimit_fixed_window_reserve`) |
/// | [`Update`](Self::Update) | re-anchors expired counters and inserts new ones of an allowed batch, verifying its row counts (`public.runlimit_fixed_window_write`); absent when every check is an in-window increment, which the preflight made |
///
/// [`PostgresGcraLimiter`](crate::PostgresGcraLimiter) reports its transaction-local settings in
/// [`Begin`](Self::Begin), the ledger row locks of its shards (the prepared statement
/// `runlimit_gcra_lock_one_v1` or `_lock_v1`) in [`Lock`](Self::Lock), the read of the arrival
/// times and the clock that follows them (`runlimit_gcra_read_one_v1` or `_read_v1`) in
/// [`Preflight`](Self::Preflight), and its writes (`runlimit_gcra_write_one_v1`,
/// `_write_one_insert_v1`, `_write_v1` or `_write_inserts_v1`) in [`Update`](Self::Update).
///
/// A timeout reported by PostgreSQL (its `lock_timeout` or `statement_timeout`) names the
/// statement that waited. PostgreSQL sends a round trip's results together, so a timeout the
/// client measures itself is attributed to the first unanswered statement of the round trip
/// that can wait on a lock. A client-measured timeout while the update round trip is in flight
/// is not a phase timeout but [`CheckError::CommitTimeout`]: the `COMMIT` sent with it may
/// have run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CheckPhase {
    /// Opening the transaction and applying its local settings.
    Begin,
    /// Taking the advisory locks of the batch's keys.
    Lock,
    /// Reading (and row-locking) the existing counters and sampling the database clock.
    Preflight,
    /// Locking and reading the capacity ledger for keys that need a new row.
    Reserve,
    /// Writing the counters of an allowed batch, before `COMMIT`.
    Update,
}

impl fmt::Display for CheckPhase {
    /// Lowercase: `begin`, `lock`, `preflight`, `reserve` or `update`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Begin => "begin",
            Self::Lock => "lock",
            Self::Preflight => "preflight",
            Self::Reserve => "reserve",
            Self::Update => "update",
        })
    }
}

/// The pre-commit phase of a cleanup pass that a [`MaintenanceError`] interrupted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MaintenancePhase {
    /// Opening the transaction and applying its local settings.
    Begin,
    /// The single `DELETE` of expired rows (with its ledger locks), before `COMMIT`.
    Delete,
}

impl fmt::Display for MaintenancePhase {
    /// Lowercase: `begin` or `delete`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Begin => "begin",
            Self::Delete => "delete",
        })
    }
}

/// Why a single [`PostgresLimiter::check`](crate::PostgresLimiter::check) could not be
/// evaluated. Treat every variant as an admission failure (fail closed).
///
/// [`consumption`](Self::consumption) says whether quota may have been consumed:
/// only the two commit-outcome-unknown variants
/// ([`CommitOutcomeUnknown`](Self::CommitOutcomeUnknown), [`CommitTimeout`](Self::CommitTimeout))
/// report [`ConsumptionStatus::MayHaveBeenConsumed`]; every other variant happened before
/// `COMMIT` was sent, or was a commit the server reported as rolled back, and reports
/// [`ConsumptionStatus::NotConsumed`]. Runlimit never retries anything automatically; never
/// replay an operation whose consumption is unknown.
///
/// `Debug` shows the SQLSTATE of a wrapped database error but not its message or detail
/// (PostgreSQL puts key values in the detail).
#[derive(thiserror::Error)]
#[non_exhaustive]
pub enum CheckError {
    /// No pooled connection became available within
    /// [`PostgresConfig::pool_acquire_timeout`](crate::PostgresConfig::pool_acquire_timeout).
    #[error("timed out after {timeout:?} waiting for a pooled connection")]
    PoolTimeout {
        /// The configured pool acquisition timeout.
        timeout: Duration,
    },
    /// The pool failed to provide a connection: it is closed, a new connection could not be
    /// opened, or SQLx's own `acquire_timeout` elapsed first.
    #[error("failed to acquire a pooled connection")]
    Acquire {
        /// The pool's error.
        #[source]
        source: sqlx::Error,
    },
    /// The [`operation_timeout`](crate::PostgresConfig::operation_timeout) budget elapsed
    /// in `phase`, measured by the client, or PostgreSQL canceled the statement with its
    /// transaction-local `lock_timeout` (SQLSTATE 55P03) or `statement_timeout` (57014; a
    /// `pg_cancel_backend` is reported the same way). Nothing was committed.
    #[error("operation timed out after {timeout:?} in the {phase} phase")]
    Timeout {
        /// The interrupted phase.
        phase: CheckPhase,
        /// The configured operation timeout.
        timeout: Duration,
    },
    /// The database or the connection failed in `phase`, before `COMMIT` (including a
    /// terminated backend, SQLSTATE 57P01). Nothing was committed.
    #[error("database failure in the {phase} phase")]
    Database {
        /// The interrupted phase.
        phase: CheckPhase,
        /// The SQLx error; see its SQLSTATE with
        /// `source.as_database_error().and_then(|e| e.code())`.
        #[source]
        source: sqlx::Error,
    },
    /// The database answered `phase` with a response of an unexpected shape or value, such
    /// as a missing row, a counter below 1 or an unexpected affected-row count. Decisions are
    /// always built from the response before commit, so nothing was committed.
    #[error("malformed database response in the {phase} phase: {reason}")]
    MalformedResponse {
        /// The phase whose response was malformed.
        phase: CheckPhase,
        /// What was wrong, as a fixed description.
        reason: &'static str,
    },
    /// `COMMIT` failed with an error the server only reports after rolling the transaction
    /// back (SQLSTATE class 23 or 40). Nothing was committed.
    #[error("commit rejected by the database")]
    CommitRejected {
        /// The SQLx error.
        #[source]
        source: sqlx::Error,
    },
    /// `COMMIT` was sent but its acknowledgement was lost (I/O failure, terminated backend,
    /// protocol error). The batch may have been committed. Do not replay it automatically.
    #[error("commit outcome unknown")]
    CommitOutcomeUnknown {
        /// The SQLx error.
        #[source]
        source: sqlx::Error,
    },
    /// The operation budget elapsed while waiting for `COMMIT` to be acknowledged. The batch
    /// may have been committed. Do not replay it automatically.
    #[error("commit outcome unknown after timing out after {timeout:?}")]
    CommitTimeout {
        /// The configured operation timeout.
        timeout: Duration,
    },
}

impl CheckError {
    /// Whether quota may have been consumed: [`ConsumptionStatus::MayHaveBeenConsumed`] for
    /// [`CommitOutcomeUnknown`](Self::CommitOutcomeUnknown) and
    /// [`CommitTimeout`](Self::CommitTimeout), [`ConsumptionStatus::NotConsumed`] for every
    /// other variant. Never [`ConsumptionStatus::Consumed`].
    #[must_use]
    pub fn consumption(&self) -> ConsumptionStatus {
        match self {
            Self::CommitOutcomeUnknown { .. } | Self::CommitTimeout { .. } => {
                ConsumptionStatus::MayHaveBeenConsumed
            }
            Self::PoolTimeout { .. }
            | Self::Acquire { .. }
            | Self::Timeout { .. }
            | Self::Database { .. }
            | Self::MalformedResponse { .. }
            | Self::CommitRejected { .. } => ConsumptionStatus::NotConsumed,
        }
    }

    /// The pre-commit phase the error interrupted, for [`Timeout`](Self::Timeout),
    /// [`Database`](Self::Database) and [`MalformedResponse`](Self::MalformedResponse).
    #[must_use]
    pub fn phase(&self) -> Option<CheckPhase> {
        match self {
            Self::Timeout { phase, .. }
            | Self::Database { phase, .. }
            | Self::MalformedResponse { phase, .. } => Some(*phase),
            _ => None,
        }
    }
}

/// `Debug` for [`CheckError`] and [`MaintenanceError`], which share their variants: database
/// errors are shown redacted (no message or detail), everything else as is.
macro_rules! redacted_debug {
    ($error:ident) => {
        impl fmt::Debug for $error {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                match self {
                    Self::PoolTimeout { timeout } => {
                        f.debug_struct("PoolTimeout").field("timeout", timeout).finish()
                    }
                    Self::Acquire { source } => {
                        f.debug_struct("Acquire").field("source", &Redacted(source)).finish()
                    }
                    Self::Timeout { phase, timeout } => {
                        f.debug_struct("Timeout").field("phase", phase).field("timeout", timeout).finish()
                    }
                    Self::Database { phase, source } => f
                        .debug_struct("Database")
                        .field("phase", phase)
                        .field("source", &Redacted(source))
                        .finish(),
                    Self::MalformedResponse { phase, reason } => f
                        .debug_struct("MalformedResponse")
                        .field("phase", phase)
                        .field("reason", reason)
                        .finish(),
                    Self::CommitRejected { source } => {
                        f.debug_struct("CommitRejected").field("source", &Redacted(source)).finish()
                    }
                    Self::CommitOutcomeUnknown { source } => {
                        f.debug_struct("CommitOutcomeUnknown").field("source", &Redacted(source)).finish()
                    }
                    Self::CommitTimeout { timeout } => {
                        f.debug_struct("CommitTimeout").field("timeout", timeout).finish()
                    }
                }
            }
        }
    };
}

redacted_debug!(CheckError);

/// Why a [`PostgresLimiter::check_all`](crate::PostgresLimiter::check_all) batch could not be
/// evaluated: the single-check failures plus the structural [`BatchError`] only a batch can
/// produce. `From` widens either.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BatchCheckError {
    /// The batch was rejected by [`validate`](runlimit_core::backend::batch::validate) before any database work
    /// (empty, more than [`PostgresLimiter::MAX_BATCH_SIZE`](crate::PostgresLimiter::MAX_BATCH_SIZE)
    /// checks, mixed quota modes, duplicate counter keys). Nothing was consumed and no
    /// connection was acquired.
    #[error("invalid batch")]
    InvalidBatch(#[source] BatchError),
    /// A failure shared with single checks.
    #[error(transparent)]
    Check(#[from] CheckError),
}

impl From<BatchError> for BatchCheckError {
    fn from(error: BatchError) -> Self {
        Self::InvalidBatch(error)
    }
}

impl BatchCheckError {
    /// Whether quota may have been consumed: [`ConsumptionStatus::NotConsumed`] for
    /// [`InvalidBatch`](Self::InvalidBatch), otherwise [`CheckError::consumption`].
    #[must_use]
    pub fn consumption(&self) -> ConsumptionStatus {
        match self {
            Self::InvalidBatch(_) => ConsumptionStatus::NotConsumed,
            Self::Check(error) => error.consumption(),
        }
    }
}

/// Why [`PostgresLimiter::cleanup_expired`](crate::PostgresLimiter::cleanup_expired) failed.
///
/// [`may_have_removed_rows`](Self::may_have_removed_rows) is true only when `COMMIT` was sent
/// and its outcome is unknown; every other variant removed nothing. Cleanup is idempotent
/// (it only removes expired rows), so retrying an unconfirmed pass on the next schedule is
/// safe; Runlimit never retries by itself.
#[derive(thiserror::Error)]
#[non_exhaustive]
pub enum MaintenanceError {
    /// No pooled connection became available within the pool acquisition timeout.
    #[error("timed out after {timeout:?} waiting for a pooled connection")]
    PoolTimeout {
        /// The configured pool acquisition timeout.
        timeout: Duration,
    },
    /// The pool failed to provide a connection.
    #[error("failed to acquire a pooled connection")]
    Acquire {
        /// The pool's error.
        #[source]
        source: sqlx::Error,
    },
    /// The operation budget elapsed in `phase`, or PostgreSQL canceled the statement
    /// (55P03 or 57014). Nothing was removed.
    #[error("cleanup timed out after {timeout:?} in the {phase} phase")]
    Timeout {
        /// The interrupted phase.
        phase: MaintenancePhase,
        /// The configured operation timeout.
        timeout: Duration,
    },
    /// The database or connection failed in `phase`, before `COMMIT`. Nothing was removed.
    #[error("database failure in the cleanup {phase} phase")]
    Database {
        /// The interrupted phase.
        phase: MaintenancePhase,
        /// The SQLx error.
        #[source]
        source: sqlx::Error,
    },
    /// The `DELETE` returned an unexpected response. Nothing was removed (rolled back).
    #[error("malformed database response in the cleanup {phase} phase: {reason}")]
    MalformedResponse {
        /// The phase whose response was malformed.
        phase: MaintenancePhase,
        /// What was wrong.
        reason: &'static str,
    },
    /// `COMMIT` failed with an error the server reports after rolling back (class 23/40).
    /// Nothing was removed.
    #[error("cleanup commit rejected by the database")]
    CommitRejected {
        /// The SQLx error.
        #[source]
        source: sqlx::Error,
    },
    /// `COMMIT` was sent but its acknowledgement was lost; rows may have been removed.
    #[error("cleanup commit outcome unknown")]
    CommitOutcomeUnknown {
        /// The SQLx error.
        #[source]
        source: sqlx::Error,
    },
    /// The operation budget elapsed while waiting for `COMMIT`; rows may have been removed.
    #[error("cleanup commit outcome unknown after timing out after {timeout:?}")]
    CommitTimeout {
        /// The configured operation timeout.
        timeout: Duration,
    },
}

impl MaintenanceError {
    /// True for [`CommitOutcomeUnknown`](Self::CommitOutcomeUnknown) and
    /// [`CommitTimeout`](Self::CommitTimeout): the pass may have removed rows. False for every
    /// other variant: it definitely removed nothing.
    #[must_use]
    pub fn may_have_removed_rows(&self) -> bool {
        matches!(self, Self::CommitOutcomeUnknown { .. } | Self::CommitTimeout { .. })
    }
}

redacted_debug!(MaintenanceError);

/// Why [`PostgresLimiter::migrate`](crate::PostgresLimiter::migrate) failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MigrationError {
    /// No pooled connection became available within the pool acquisition timeout.
    #[error("timed out after {timeout:?} waiting for a pooled connection")]
    PoolTimeout {
        /// The configured pool acquisition timeout.
        timeout: Duration,
    },
    /// The pool failed to provide a connection.
    #[error("failed to acquire a pooled connection")]
    Acquire {
        /// The pool's error.
        #[source]
        source: sqlx::Error,
    },
    /// SQLx's migrator failed: a checksum mismatch (`VersionMismatch`) for an edited or
    /// colliding version, a `Dirty` history, or a failing migration statement. The dedicated
    /// connection was closed, releasing SQLx's session-level migration lock.
    #[error("failed to apply the runlimit migrations")]
    Migrate {
        /// SQLx's migration error.
        #[source]
        source: sqlx::migrate::MigrateError,
    },
}

/// Debug for a SQLx error that keeps the SQLSTATE and drops database message and detail.
struct Redacted<'a>(&'a sqlx::Error);

impl fmt::Debug for Redacted<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            sqlx::Error::Database(error) => {
                f.debug_struct("Database").field("code", &error.code()).finish_non_exhaustive()
            }
            sqlx::Error::Io(error) => f.debug_tuple("Io").field(&error.kind()).finish(),
            sqlx::Error::PoolTimedOut => f.write_str("PoolTimedOut"),
            sqlx::Error::PoolClosed => f.write_str("PoolClosed"),
            _ => f.debug_struct("Error").finish_non_exhaustive(),
        }
    }
}

/// The SQLSTATE of a database error, if any.
pub(crate) fn sqlstate(error: &sqlx::Error) -> Option<String> {
    error.as_database_error().and_then(|e| e.code()).map(|code| code.into_owned())
}

/// 55P03 (`lock_not_available`, from `lock_timeout`) and 57014 (`query_canceled`, from
/// `statement_timeout` or a cancel request).
pub(crate) fn is_server_timeout(error: &sqlx::Error) -> bool {
    matches!(sqlstate(error).as_deref(), Some("55P03" | "57014"))
}

/// Errors PostgreSQL only reports for a `COMMIT` after rolling the transaction back:
/// integrity constraint violations (class 23, deferred constraints) and transaction rollbacks
/// (class 40, serialization failure or deadlock). Everything else leaves the outcome unknown:
/// the connection may have failed after the server committed.
pub(crate) fn commit_definitely_rolled_back(error: &sqlx::Error) -> bool {
    sqlstate(error).is_some_and(|code| code.starts_with("23") || code.starts_with("40"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn consumption_classification() {
        let timeout = Duration::from_millis(5);
        assert_eq!(
            CheckError::Timeout { phase: CheckPhase::Lock, timeout }.consumption(),
            ConsumptionStatus::NotConsumed
        );
        assert_eq!(
            CheckError::MalformedResponse { phase: CheckPhase::Preflight, reason: "x" }.consumption(),
            ConsumptionStatus::NotConsumed
        );
        assert_eq!(
            CheckError::CommitTimeout { timeout }.consumption(),
            ConsumptionStatus::MayHaveBeenConsumed
        );
        assert_eq!(
            CheckError::CommitOutcomeUnknown { source: sqlx::Error::PoolClosed }.consumption(),
            ConsumptionStatus::MayHaveBeenConsumed
        );
        assert_eq!(
            CheckError::CommitRejected { source: sqlx::Error::PoolClosed }.consumption(),
            ConsumptionStatus::NotConsumed
        );
        assert_eq!(
            BatchCheckError::from(BatchError::EmptyBatch).consumption(),
            ConsumptionStatus::NotConsumed
        );
        assert_eq!(
            BatchCheckError::from(CheckError::CommitTimeout { timeout }).consumption(),
            ConsumptionStatus::MayHaveBeenConsumed
        );
        assert!(MaintenanceError::CommitTimeout { timeout }.may_have_removed_rows());
        assert!(
            !MaintenanceError::Timeout { phase: MaintenancePhase::Delete, timeout }.may_have_removed_rows()
        );
    }

    #[test]
    fn messages() {
        let timeout = Duration::from_millis(300);
        assert_eq!(
            CheckError::Timeout { phase: CheckPhase::Lock, timeout }.to_string(),
            "operation timed out after 300ms in the lock phase"
        );
        assert_eq!(
            CheckError::PoolTimeout { timeout }.to_string(),
            "timed out after 300ms waiting for a pooled connection"
        );
        assert_eq!(
            CheckError::MalformedResponse { phase: CheckPhase::Update, reason: "affected row count differs" }
                .to_string(),
            "malformed database response in the update phase: affected row count differs"
        );
        let invalid = BatchCheckError::from(BatchError::EmptyBatch);
        assert_eq!(invalid.to_string(), "invalid batch");
        assert_eq!(
            std::error::Error::source(&invalid).map(ToString::to_string).as_deref(),
            Some("empty batch")
        );
        assert_eq!(
            format!("{:?}", CheckError::Acquire { source: sqlx::Error::PoolTimedOut }),
            "Acquire { source: PoolTimedOut }"
        );
        assert_eq!(
            format!("{:?}", MaintenanceError::Acquire { source: sqlx::Error::PoolTimedOut }),
            "Acquire { source: PoolTimedOut }"
        );
    }
}
