//! The transaction skeleton every operation shares: a pooled connection leased within the pool
//! acquisition timeout, a fresh operation deadline, the decided ending (`ROLLBACK`, or the
//! writes and `COMMIT` in one round trip), and the classification of every failure by whether
//! the operation may have taken effect.
//!
//! Fixed windows, GCRA and attempts supply only their SQL, their row parsing and their
//! decision (their modules beside this one); the rules come from `runlimit_core::backend`.

use std::time::Duration;

use runlimit_core::{
    Allowance,
    backend::batch::{BatchDenial, Precedence},
};
use sqlx::{PgConnection, PgPool, Postgres, pool::PoolConnection};
use tokio::time::{Instant as Deadline, timeout};

use crate::{
    config::PostgresConfig,
    error::{
        CheckError, CheckPhase, MaintenanceError, MaintenancePhase, commit_definitely_rolled_back,
        is_server_timeout,
    },
    observe::Evaluated,
    script::{self, Failure, ScriptError},
};

/// A pooled connection that is closed instead of returned to the pool unless the operation
/// marks it clean (its transaction finished with an acknowledged `COMMIT` or `ROLLBACK`).
///
/// This also covers cancellation: a future dropped mid-transaction drops its connection, and
/// the server rolls back when the session ends.
pub(crate) struct PooledConnection {
    pub(crate) connection: PoolConnection<Postgres>,
    pub(crate) clean: bool,
}

impl Drop for PooledConnection {
    fn drop(&mut self) {
        if !self.clean {
            self.connection.close_on_drop();
        }
    }
}

/// A pooled connection within [`PostgresConfig::pool_acquire_timeout`].
pub(crate) async fn acquire(pool: &PgPool, config: &PostgresConfig) -> Result<PooledConnection, CheckError> {
    match timeout(config.pool_acquire_timeout(), pool.acquire()).await {
        Ok(Ok(connection)) => Ok(PooledConnection { connection, clean: false }),
        Ok(Err(source)) => Err(CheckError::Acquire { source }),
        Err(_) => Err(CheckError::PoolTimeout { timeout: config.pool_acquire_timeout() }),
    }
}

/// A pooled connection for a cleanup pass, within the pool acquisition timeout.
async fn acquire_for_maintenance(
    pool: &PgPool,
    config: &PostgresConfig,
) -> Result<PooledConnection, MaintenanceError> {
    match timeout(config.pool_acquire_timeout(), pool.acquire()).await {
        Ok(Ok(connection)) => Ok(PooledConnection { connection, clean: false }),
        Ok(Err(source)) => Err(MaintenanceError::Acquire { source }),
        Err(_) => Err(MaintenanceError::PoolTimeout { timeout: config.pool_acquire_timeout() }),
    }
}

/// Runs one transaction: acquires a pooled connection within the pool acquisition timeout,
/// gives `work` a fresh operation deadline, and returns the connection to the pool only if
/// `work` reports that its transaction finished cleanly (otherwise it is closed).
pub(crate) async fn run<T>(
    pool: &PgPool,
    config: &PostgresConfig,
    work: impl AsyncFnOnce(&mut PgConnection, Deadline) -> (Result<T, CheckError>, bool),
) -> Result<T, CheckError> {
    let mut leased = acquire(pool, config).await?;
    let deadline = Deadline::now() + config.operation_timeout();
    let (result, clean) = work(&mut leased.connection, deadline).await;
    leased.clean = clean;
    result
}

/// Opens the transaction in one round trip: `BEGIN` and the transaction-local settings, for
/// work that continues with its own statements.
pub(crate) async fn begin(
    connection: &mut PgConnection,
    deadline: Deadline,
    config: &PostgresConfig,
) -> Result<(), CheckError> {
    let mut sql = script::begin().to_owned();
    sql.push_str(&script::settings(config.server_timeout_millis()));
    script::run(connection, sql, deadline).await.map(|_| ()).map_err(|error| {
        check_failure(error, &[CheckPhase::Begin, CheckPhase::Begin], config.operation_timeout())
    })
}

/// What a quota admission decided from the database's answers, before anything is written:
/// commit every check (`writes[i]` is what check `i` writes), or roll back with the batch
/// rule's deciding denial.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Plan<W> {
    /// Every check allowed: one allowance and one write per check, in input order.
    Commit { allowances: Vec<Allowance>, writes: Vec<W> },
    /// Denied (enforced or shadow); nothing is written.
    Rollback(BatchDenial),
}

impl<W> Plan<W> {
    /// The plan once every check was evaluated in input order: the denial `precedence` names,
    /// or else the allowances and writes collected.
    pub(crate) fn of(precedence: &Precedence, allowances: Vec<Allowance>, writes: Vec<W>) -> Self {
        match precedence.denial() {
            Some(denial) => Self::Rollback(denial),
            None => Self::Commit { allowances, writes },
        }
    }

    /// How the plan ends: `ROLLBACK` for a denial, else the writes `render` returns (the SQL
    /// and its number of statements) and `COMMIT`.
    pub(crate) fn ending(self, render: impl FnOnce(&[W]) -> (String, usize)) -> Ending<Evaluated> {
        match self {
            Self::Rollback(denial) => Ending::Rollback(Evaluated::Denied(denial)),
            Self::Commit { allowances, writes } => {
                let (writes, statements) = render(&writes);
                Ending::Commit { value: Evaluated::Allowed(allowances), writes, statements }
            }
        }
    }
}

/// How a decided transaction ends, in its final round trip.
pub(crate) enum Ending<T> {
    /// `writes` (`statements` write statements, each verifying its own row count) then
    /// `COMMIT`, sent together; `value` is the result once `COMMIT` is acknowledged.
    Commit { value: T, writes: String, statements: usize },
    /// Nothing to write: `ROLLBACK`. `value` stands even if the rollback fails (the connection
    /// is then closed instead of reused).
    Rollback(T),
}

/// Sends a transaction's final round trip and classifies its failure: a write answered with an
/// error stopped the script before `COMMIT` ([`write_failure`]); a failure after the writes is
/// a commit failure ([`commit_failure`]). Returns the result and whether the connection is
/// clean.
pub(crate) async fn end<T>(
    connection: &mut PgConnection,
    deadline: Deadline,
    timeout: Duration,
    ending: Ending<T>,
) -> (Result<T, CheckError>, bool) {
    match ending {
        Ending::Rollback(value) => {
            let clean = script::run(connection, script::ROLLBACK.to_owned(), deadline).await.is_ok();
            (Ok(value), clean)
        }
        Ending::Commit { value, mut writes, statements } => {
            writes.push_str(script::COMMIT);
            match script::run(connection, writes, deadline).await {
                // Every statement succeeded, COMMIT included; the writes verified their row counts.
                Ok(_) => (Ok(value), true),
                Err(error) if error.completed < statements => {
                    (Err(write_failure(error.failure, timeout)), false)
                }
                Err(error) => (Err(commit_failure(error, timeout)), false),
            }
        }
    }
}

/// A peek's one round trip: `BEGIN READ ONLY`, the settings, `statement` (the peek's read,
/// one row), `ROLLBACK`. Returns the output and the index of `statement`'s result; a failure
/// is classified as a check's (the caller closes the connection then).
pub(crate) async fn peek(
    connection: &mut PgConnection,
    deadline: Deadline,
    config: &PostgresConfig,
    statement: &str,
) -> Result<(script::ScriptOutput, usize), CheckError> {
    let mut sql = script::begin_read_only().to_owned();
    sql.push_str(&script::settings(config.server_timeout_millis()));
    sql.push_str(statement);
    sql.push_str(script::ROLLBACK);
    let phases = [CheckPhase::Begin, CheckPhase::Begin, CheckPhase::Preflight, CheckPhase::Preflight];
    match script::run(connection, sql, deadline).await {
        Ok(output) => Ok((output, script::BEGIN_STATEMENTS + 1)),
        Err(error) => Err(check_failure(error, &phases, config.operation_timeout())),
    }
}

/// Classifies a failed pre-commit script: `phases[i]` names statement `i`'s phase.
///
/// PostgreSQL sends a script's statement results together at the end of the round trip (or
/// with the first error), so a timeout measured by the client cannot see how far the script
/// got; it is attributed to the first statement not yet answered that can wait on a lock, never
/// to `BEGIN`.
pub(crate) fn check_failure(error: ScriptError, phases: &[CheckPhase], timeout: Duration) -> CheckError {
    let phase_at = |index: usize| phases.get(index).or(phases.last()).copied().unwrap_or(CheckPhase::Begin);
    let ScriptError { completed, failure } = error;
    match failure {
        Failure::TimedOut => {
            let waiting = (completed..phases.len()).find(|index| phases[*index] != CheckPhase::Begin);
            CheckError::Timeout { phase: phase_at(waiting.unwrap_or(completed)), timeout }
        }
        Failure::Sqlx(error) => sqlx_failure(error, phase_at(completed), timeout),
    }
}

/// Classifies a pre-commit SQLx error of `phase`: a server-side timeout or a database failure.
pub(crate) fn sqlx_failure(error: sqlx::Error, phase: CheckPhase, timeout: Duration) -> CheckError {
    if is_server_timeout(&error) {
        CheckError::Timeout { phase, timeout }
    } else {
        CheckError::Database { phase, source: error }
    }
}

/// Classifies a failure before the write statements of the final round trip answered.
pub(crate) fn write_failure(failure: Failure, timeout: Duration) -> CheckError {
    match failure {
        // PostgreSQL answered a write with an error: the script stopped there, the transaction
        // is aborted and the COMMIT sent in the same round trip never ran.
        Failure::Sqlx(error @ sqlx::Error::Database(_)) => sqlx_failure(error, CheckPhase::Update, timeout),
        // No answer to the writes: the COMMIT sent with them may have run.
        Failure::Sqlx(source) => CheckError::CommitOutcomeUnknown { source },
        Failure::TimedOut => CheckError::CommitTimeout { timeout },
    }
}

/// Classifies a failed `COMMIT` by whether it may have committed.
pub(crate) fn commit_failure(error: ScriptError, timeout: Duration) -> CheckError {
    match error.failure {
        Failure::TimedOut => CheckError::CommitTimeout { timeout },
        Failure::Sqlx(source) if commit_definitely_rolled_back(&source) => {
            CheckError::CommitRejected { source }
        }
        Failure::Sqlx(source) => CheckError::CommitOutcomeUnknown { source },
    }
}

/// Classifies a failed pre-commit cleanup statement of `phase`.
pub(crate) fn maintenance_failure(
    failure: Failure,
    phase: MaintenancePhase,
    timeout: Duration,
) -> MaintenanceError {
    match failure {
        Failure::TimedOut => MaintenanceError::Timeout { phase, timeout },
        Failure::Sqlx(error) if is_server_timeout(&error) => MaintenanceError::Timeout { phase, timeout },
        Failure::Sqlx(source) => MaintenanceError::Database { phase, source },
    }
}

/// Runs a maintenance script (a cleanup pass or a reset) whose `DELETE` is statement number
/// `delete_statement`: a failure before it is in [`MaintenancePhase::Begin`] (nothing was
/// deleted), from it on in [`MaintenancePhase::Delete`].
pub(crate) async fn run_maintenance(
    connection: &mut PgConnection,
    sql: String,
    deadline: Deadline,
    delete_statement: usize,
    timeout: Duration,
) -> Result<script::ScriptOutput, MaintenanceError> {
    script::run(connection, sql, deadline).await.map_err(|error| {
        let phase = if error.completed < delete_statement {
            MaintenancePhase::Begin
        } else {
            MaintenancePhase::Delete
        };
        maintenance_failure(error.failure, phase, timeout)
    })
}

/// Runs one cleanup pass in its own transaction: acquires a pooled connection within the pool
/// acquisition timeout and gives `work` a fresh operation deadline. `work` returns how many
/// rows it deleted (`Some`: `COMMIT`, classifying a failed commit by whether it may have
/// committed) or that it found nothing to delete (`None`: `ROLLBACK`, and `Ok(0)`). The
/// connection returns to the pool only after an acknowledged `COMMIT` or `ROLLBACK`.
pub(crate) async fn maintain(
    pool: &PgPool,
    config: &PostgresConfig,
    work: impl AsyncFnOnce(&mut PgConnection, Deadline) -> Result<Option<u64>, MaintenanceError>,
) -> Result<u64, MaintenanceError> {
    let timeout = config.operation_timeout();
    let mut leased = acquire_for_maintenance(pool, config).await?;
    let deadline = Deadline::now() + timeout;
    let Some(removed) = work(&mut leased.connection, deadline).await? else {
        return match script::run(&mut leased.connection, script::ROLLBACK.to_owned(), deadline).await {
            Ok(_) => {
                leased.clean = true;
                Ok(0)
            }
            Err(error) => Err(maintenance_failure(error.failure, MaintenancePhase::Begin, timeout)),
        };
    };
    match script::run(&mut leased.connection, script::COMMIT.to_owned(), deadline).await {
        Ok(_) => {
            leased.clean = true;
            Ok(removed)
        }
        Err(error) => Err(match error.failure {
            Failure::TimedOut => MaintenanceError::CommitTimeout { timeout },
            Failure::Sqlx(source) if commit_definitely_rolled_back(&source) => {
                MaintenanceError::CommitRejected { source }
            }
            Failure::Sqlx(source) => MaintenanceError::CommitOutcomeUnknown { source },
        }),
    }
}

/// The number of rows a cleanup statement reports it deleted (column `removed` of its single
/// row), checked against the requested bound.
pub(crate) fn removed_rows(
    row: Option<&sqlx::postgres::PgRow>,
    maximum_rows: u32,
) -> Result<u64, MaintenanceError> {
    use sqlx::Row;
    let phase = MaintenancePhase::Delete;
    let removed: i64 = row
        .and_then(|row| row.try_get("removed").ok())
        .ok_or(MaintenanceError::MalformedResponse { phase, reason: "expected one removed count" })?;
    u64::try_from(removed).ok().filter(|removed| *removed <= u64::from(maximum_rows)).ok_or(
        MaintenanceError::MalformedResponse { phase, reason: "removed count outside the requested bound" },
    )
}
