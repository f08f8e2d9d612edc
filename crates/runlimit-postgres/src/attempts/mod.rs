//! [`PostgresAttemptLimiter`]: attempt limiting
//! ([`AttemptPolicy`]) shared across replicas, with a
//! low-level seam for completing an attempt inside an application-owned transaction.
//!
//! # Storage
//!
//! One row of `public.runlimit_attempts` per subject with failure state or a lease (see
//! [`CREATE_RUNLIMIT_ATTEMPTS_SQL`]), installed by its own [`ATTEMPTS_MIGRATOR`]; fixed-window
//! and GCRA consumers need no new tables. The state machine is the one of
//! `runlimit_memory::MemoryAttemptLimiter`, evaluated in whole milliseconds of the server clock
//! (`pg_catalog.clock_timestamp()`, sampled after every lock the operation takes):
//!
//! - a lease whose deadline has passed counts as a failure at its deadline (evaluated lazily,
//!   identically by every operation, so it needs no background job);
//! - a row expires at `lease deadline + quiet period` while it has a lease, and at `latest
//!   failure + quiet period` otherwise, so quiet expiry never erases an active lease;
//! - success deletes the row.
//!
//! # Capacity
//!
//! The subject's shard is byte 32 of the 64-byte key (the first subject-key byte; 256 shards).
//! Each row occupies a slot `0..maximum_rows_per_shard` of its shard
//! ([`PostgresConfig::maximum_rows_per_shard`], 4,096 by default); the database checks the
//! slot range 0..=65,535 and uniqueness of `(capacity_shard, capacity_slot)`. Admission locks
//! the shard's row in `public.runlimit_attempt_shards` first, which serializes admissions of
//! one shard (and so makes "at most one active attempt" hold for a key without a row).
//! Admission never waits for a subject row another transaction holds (a host transaction's
//! claim, or a completion in flight): it reads with `SKIP LOCKED` and denies such a subject
//! with `InProgress` (retry after the committed lease deadline, or zero), so a long host
//! transaction never stalls the rest of its shard. A new
//! subject first deletes at most 16 expired rows of its shard (oldest first, skipping rows
//! locked by a host transaction; live rows are never candidates), then takes the lowest free
//! slot, or is denied with
//! [`AttemptDenial::StorageCapacity`]
//! (fail closed).
//!
//! # Transactions
//!
//! Standalone [`acquire`](PostgresAttemptLimiter::acquire) and
//! [`complete`](PostgresAttemptLimiter::complete) run one `READ COMMITTED` transaction each,
//! on a pooled connection, within [`PostgresConfig`]'s timeouts, and report their outcome only
//! after an acknowledged `COMMIT`. Failures are [`CheckError`]s, whose
//! [`consumption`](CheckError::consumption) separates definite non-effect from an unknown
//! commit outcome; never replay an uncertain admission or completion automatically.
//!
//! The seam ([`claim_in`](PostgresAttemptLimiter::claim_in),
//! [`finish_in`](PostgresAttemptLimiter::finish_in),
//! [`complete_in`](PostgresAttemptLimiter::complete_in)) runs its statements on a connection the
//! caller holds inside its own transaction and never commits: its results are provisional
//! ([`StagedAttemptCompletion`]) until the host commits.

mod migrations;

use std::{fmt, time::Instant};

use runlimit_core::backend::notify_attempt;
use runlimit_core::{
    AttemptSubject, Delay,
    attempts::{
        AttemptCompletionResult, AttemptDecision, AttemptDenial, AttemptEvent, AttemptObservation,
        AttemptObserver, AttemptOperation, AttemptOutcome, AttemptPolicy,
    },
};
use sqlx::{AssertSqlSafe, Executor, PgConnection, PgPool, Row, postgres::PgRow};
use tokio::time::timeout_at;

pub use self::migrations::{ATTEMPTS_MIGRATION_VERSIONS, ATTEMPTS_MIGRATOR, CREATE_RUNLIMIT_ATTEMPTS_SQL};
use crate::{
    config::PostgresConfig,
    error::{
        CheckError, CheckPhase, MigrationError, commit_definitely_rolled_back, is_server_timeout, sqlstate,
    },
    limiter::{Lease as PooledConnection, acquire},
    migrations::run_migrator,
    protocol,
};

/// Expired rows a new subject's admission may delete from its shard.
pub const RECLAIMED_ROWS_PER_ADMISSION: i64 = 16;

const NOW_MS: &str = "SELECT pg_catalog.floor(pg_catalog.date_part('epoch', pg_catalog.clock_timestamp()) * 1000)::bigint AS now_ms";
const LOCK_SHARD: &str =
    "SELECT capacity_shard FROM public.runlimit_attempt_shards WHERE capacity_shard = $1 FOR UPDATE";
const READ_ROW: &str = "SELECT consecutive_failures, last_failure_at_ms, lease_token, lease_deadline_ms, \
     COALESCE(claim_xid = pg_catalog.pg_current_xact_id_if_assigned(), false) AS same_transaction \
     FROM public.runlimit_attempts WHERE attempt_key = $1 FOR UPDATE";
/// The admission read: like [`READ_ROW`] but skipping a row another transaction has locked
/// (a host transaction holding a claim, or a completion in flight), so admission never waits
/// on application work while it holds its shard lock.
const READ_ROW_SKIP_LOCKED: &str = "SELECT consecutive_failures, last_failure_at_ms, lease_token, \
     lease_deadline_ms, false AS same_transaction \
     FROM public.runlimit_attempts WHERE attempt_key = $1 FOR UPDATE SKIP LOCKED";
/// Whether a row skipped by [`READ_ROW_SKIP_LOCKED`] exists, and its committed lease deadline.
const LOCKED_ROW: &str = "SELECT lease_deadline_ms FROM public.runlimit_attempts WHERE attempt_key = $1";
const RECLAIM: &str = "DELETE FROM public.runlimit_attempts WHERE attempt_key IN (\
     SELECT attempt_key FROM public.runlimit_attempts \
     WHERE capacity_shard = $1 AND expires_at_ms <= $2 AND expires_at_ms < 9223372036854775807 \
     ORDER BY expires_at_ms LIMIT $3 FOR UPDATE SKIP LOCKED)";
const FREE_SLOT: &str = "SELECT slot::integer AS slot FROM pg_catalog.generate_series(0, $2 - 1) AS slot \
     WHERE NOT EXISTS (SELECT 1 FROM public.runlimit_attempts AS a \
     WHERE a.capacity_shard = $1 AND a.capacity_slot = slot) LIMIT 1";
const EARLIEST_EXPIRY: &str = "SELECT pg_catalog.min(expires_at_ms) AS earliest FROM public.runlimit_attempts WHERE capacity_shard = $1";
const INSERT: &str = "INSERT INTO public.runlimit_attempts (attempt_key, capacity_shard, capacity_slot, \
     consecutive_failures, last_failure_at_ms, lease_token, lease_deadline_ms, claim_xid, expires_at_ms) \
     VALUES ($1, $2, $3, 0, $4, pg_catalog.uuid_send(pg_catalog.gen_random_uuid()), $5, NULL, $6) \
     RETURNING lease_token";
const ADMIT: &str = "UPDATE public.runlimit_attempts SET consecutive_failures = $2, last_failure_at_ms = $3, \
     lease_token = pg_catalog.uuid_send(pg_catalog.gen_random_uuid()), lease_deadline_ms = $4, \
     claim_xid = NULL, expires_at_ms = $5 WHERE attempt_key = $1 RETURNING lease_token";
const RECORD_FAILURE: &str = "UPDATE public.runlimit_attempts SET consecutive_failures = $2, \
     last_failure_at_ms = $3, lease_token = NULL, lease_deadline_ms = NULL, claim_xid = NULL, \
     expires_at_ms = $4 WHERE attempt_key = $1";
const DELETE: &str = "DELETE FROM public.runlimit_attempts WHERE attempt_key = $1";
const CLAIM: &str = "UPDATE public.runlimit_attempts \
     SET lease_token = pg_catalog.uuid_send(pg_catalog.gen_random_uuid()), \
     claim_xid = pg_catalog.pg_current_xact_id() WHERE attempt_key = $1 RETURNING lease_token";

fn saturating_i64(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

fn delay_between(from: i64, to: i64) -> Delay {
    Delay::from_millis(u64::try_from(to.saturating_sub(from)).unwrap_or(0))
}

/// A subject's stored state, as read under its row lock.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Stored {
    failures: u32,
    last_failure_at: i64,
    lease: Option<(Vec<u8>, i64)>,
    same_transaction: bool,
}

impl Stored {
    fn read(row: &PgRow) -> Result<Self, &'static str> {
        let failures: i64 = row.try_get("consecutive_failures").map_err(|_| "undecodable column")?;
        let failures = u32::try_from(failures).map_err(|_| "failure count out of range")?;
        let last_failure_at: i64 = row.try_get("last_failure_at_ms").map_err(|_| "undecodable column")?;
        let token: Option<Vec<u8>> = row.try_get("lease_token").map_err(|_| "undecodable column")?;
        let deadline: Option<i64> = row.try_get("lease_deadline_ms").map_err(|_| "undecodable column")?;
        let same_transaction: bool = row.try_get("same_transaction").map_err(|_| "undecodable column")?;
        let lease = match (token, deadline) {
            (Some(token), Some(deadline)) => Some((token, deadline)),
            (None, None) => None,
            _ => return Err("lease token and deadline disagree"),
        };
        Ok(Self { failures, last_failure_at, lease, same_transaction })
    }

    /// Converts an expired lease into a failure at its deadline.
    fn settle(&mut self, now: i64) {
        if let Some((_, deadline)) = self.lease
            && deadline <= now
            && deadline != i64::MAX
        {
            self.failures = self.failures.saturating_add(1);
            self.last_failure_at = deadline;
            self.lease = None;
        }
    }

    fn holds(&self, token: &[u8]) -> bool {
        self.lease.as_ref().is_some_and(|(held, _)| held == token)
    }
}

/// The admission rule on a settled (or absent) state: `Ok(failures to keep)` or a denial.
fn admission(policy: &AttemptPolicy, stored: Option<&Stored>, now: i64) -> Result<u32, AttemptDenial> {
    let Some(stored) = stored else { return Ok(0) };
    if let Some((_, deadline)) = stored.lease {
        return Err(AttemptDenial::InProgress { retry_after: delay_between(now, deadline) });
    }
    let quiet = saturating_i64(policy.quiet_period().as_millis());
    if stored.failures == 0 || stored.last_failure_at.saturating_add(quiet) <= now {
        return Ok(0);
    }
    let delay =
        saturating_i64(u64::try_from(policy.retry_delay(stored.failures).as_millis()).unwrap_or(u64::MAX));
    let ready_at = stored.last_failure_at.saturating_add(delay);
    if now < ready_at {
        return Err(AttemptDenial::Backoff {
            retry_after: delay_between(now, ready_at),
            consecutive_failures: stored.failures,
        });
    }
    Ok(stored.failures)
}

fn failure_recorded(policy: &AttemptPolicy, failures: u32) -> AttemptCompletionResult {
    AttemptCompletionResult::FailureRecorded {
        consecutive_failures: failures,
        retry_after: Delay::from_duration(policy.retry_delay(failures)),
    }
}

/// The opaque, consuming receipt of an attempt admitted by
/// [`PostgresAttemptLimiter::acquire`].
///
/// Complete it with [`complete`](PostgresAttemptLimiter::complete) or, inside a host
/// transaction, [`claim_in`](PostgresAttemptLimiter::claim_in) /
/// [`complete_in`](PostgresAttemptLimiter::complete_in); each consumes it. Not `Clone`.
/// Dropping it is no refund: the lease expires as a failure at its deadline. `Debug` shows the
/// policy identifier only, never the subject key or the lease token.
#[must_use = "complete the receipt; dropping it counts as a failure at the lease deadline"]
pub struct PostgresAttemptReceipt {
    policy: AttemptPolicy,
    key: [u8; 64],
    token: Vec<u8>,
}

impl PostgresAttemptReceipt {
    /// The attempt policy the attempt was admitted under.
    #[must_use]
    pub fn policy(&self) -> &AttemptPolicy {
        &self.policy
    }
}

impl fmt::Debug for PostgresAttemptReceipt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresAttemptReceipt").field("policy", self.policy.id()).finish_non_exhaustive()
    }
}

/// A reservation claimed inside a host transaction by
/// [`PostgresAttemptLimiter::claim_in`]: fenced to that transaction's ID and to the lease token
/// the claim rotated. Not `Clone`; `Debug` is redacted.
#[must_use = "finish the claim with finish_in inside the same transaction"]
pub struct AttemptClaim {
    policy: AttemptPolicy,
    key: [u8; 64],
    token: Vec<u8>,
}

impl AttemptClaim {
    /// The attempt policy.
    #[must_use]
    pub fn policy(&self) -> &AttemptPolicy {
        &self.policy
    }
}

impl fmt::Debug for AttemptClaim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AttemptClaim").field("policy", self.policy.id()).finish_non_exhaustive()
    }
}

/// The result of [`PostgresAttemptLimiter::claim_in`]. Exhaustive.
#[must_use]
#[derive(Debug)]
pub enum AttemptClaimResult {
    /// The live reservation is locked by the host transaction and its token rotated.
    Claimed(AttemptClaim),
    /// The receipt no longer holds a live reservation (its lease expired and counted as a
    /// failure, or it was superseded). Roll the host transaction back.
    Stale,
}

/// A completion staged inside a host transaction: provisional until the host's `COMMIT` is
/// acknowledged, void if it rolls back. Runlimit reports no observation for it; the host owns
/// the final disposition.
#[must_use = "the completion takes effect only when the host transaction commits"]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StagedAttemptCompletion {
    result: AttemptCompletionResult,
}

impl StagedAttemptCompletion {
    /// What the completion will have recorded once the host transaction commits.
    /// [`AttemptCompletionResult::Stale`] staged nothing; roll back.
    #[must_use]
    pub const fn provisional_result(&self) -> AttemptCompletionResult {
        self.result
    }
}

/// Why a seam operation ([`claim_in`](PostgresAttemptLimiter::claim_in),
/// [`finish_in`](PostgresAttemptLimiter::finish_in),
/// [`complete_in`](PostgresAttemptLimiter::complete_in)) failed. The host transaction is in an
/// unknown or aborted state: roll it back. `Debug` shows only the SQLSTATE.
#[derive(thiserror::Error)]
#[non_exhaustive]
pub enum AttemptSeamError {
    /// A statement failed (including the host's `statement_timeout` or `lock_timeout`).
    #[error("database failure in the attempt {step} statement")]
    Database {
        /// The failing statement: `read`, `clock`, `claim` or `write`.
        step: &'static str,
        /// The SQLx error.
        #[source]
        source: sqlx::Error,
    },
    /// The database answered with an unexpected shape or value.
    #[error("malformed database response: {reason}")]
    MalformedResponse {
        /// What was wrong, as a fixed description.
        reason: &'static str,
    },
}

impl fmt::Debug for AttemptSeamError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Database { step, source } => {
                f.debug_struct("Database").field("step", step).field("sqlstate", &sqlstate(source)).finish()
            }
            Self::MalformedResponse { reason } => {
                f.debug_struct("MalformedResponse").field("reason", reason).finish()
            }
        }
    }
}

/// A failure inside one of the shared statement helpers: the step and the error.
enum StepError {
    Database(&'static str, sqlx::Error),
    Malformed(&'static str),
}

impl From<StepError> for AttemptSeamError {
    fn from(error: StepError) -> Self {
        match error {
            StepError::Database(step, source) => Self::Database { step, source },
            StepError::Malformed(reason) => Self::MalformedResponse { reason },
        }
    }
}

async fn read_row(connection: &mut PgConnection, key: &[u8; 64]) -> Result<Option<Stored>, StepError> {
    let row = sqlx::query(READ_ROW)
        .bind(&key[..])
        .fetch_optional(&mut *connection)
        .await
        .map_err(|error| StepError::Database("read", error))?;
    row.as_ref().map(Stored::read).transpose().map_err(StepError::Malformed)
}

async fn now_ms(connection: &mut PgConnection) -> Result<i64, StepError> {
    let row =
        sqlx::query(NOW_MS).fetch_one(&mut *connection).await.map_err(|e| StepError::Database("clock", e))?;
    row.try_get("now_ms").map_err(|_| StepError::Malformed("undecodable clock"))
}

/// Writes `outcome` for a row whose reservation the caller holds (row locked).
async fn record(
    connection: &mut PgConnection,
    policy: &AttemptPolicy,
    key: &[u8; 64],
    failures: u32,
    outcome: AttemptOutcome,
    now: i64,
) -> Result<AttemptCompletionResult, StepError> {
    let result = match outcome {
        AttemptOutcome::Success => sqlx::query(DELETE)
            .bind(&key[..])
            .execute(&mut *connection)
            .await
            .map(|done| done.rows_affected()),
        AttemptOutcome::Failure | AttemptOutcome::Abandoned => {
            let quiet = saturating_i64(policy.quiet_period().as_millis());
            sqlx::query(RECORD_FAILURE)
                .bind(&key[..])
                .bind(i64::from(failures.saturating_add(1)))
                .bind(now)
                .bind(now.saturating_add(quiet))
                .execute(&mut *connection)
                .await
                .map(|done| done.rows_affected())
        }
    };
    match result {
        Ok(1) => Ok(match outcome {
            AttemptOutcome::Success => AttemptCompletionResult::Reset,
            AttemptOutcome::Failure | AttemptOutcome::Abandoned => {
                failure_recorded(policy, failures.saturating_add(1))
            }
        }),
        Ok(_) => Err(StepError::Malformed("completion affected no row")),
        Err(error) => Err(StepError::Database("write", error)),
    }
}

/// Reads, settles and (if the receipt still holds the live lease) records `outcome`.
async fn complete_locked(
    connection: &mut PgConnection,
    policy: &AttemptPolicy,
    key: &[u8; 64],
    token: &[u8],
    outcome: AttemptOutcome,
) -> Result<AttemptCompletionResult, StepError> {
    let stored = read_row(connection, key).await?;
    let now = now_ms(connection).await?;
    let Some(mut stored) = stored else { return Ok(AttemptCompletionResult::Stale) };
    stored.settle(now);
    if !stored.holds(token) {
        return Ok(AttemptCompletionResult::Stale);
    }
    record(connection, policy, key, stored.failures, outcome, now).await
}

/// A PostgreSQL attempt limiter for [`AttemptPolicy`]; see the [module docs](self).
///
/// # Examples
///
/// ```no_run
/// use std::time::Duration;
/// use runlimit_core::{KeyHasher, PolicyId, ScopeId, attempts::*};
/// use runlimit_postgres::attempts::PostgresAttemptLimiter;
///
/// # async fn run(pool: sqlx::PgPool) -> Result<(), Box<dyn std::error::Error>> {
/// let policy = AttemptPolicy::new(
///     PolicyId::new("auth.password")?, ScopeId::new("identity")?,
///     Duration::from_secs(1), Duration::from_secs(300), Duration::from_secs(3_600), Duration::from_secs(30),
/// )?;
/// let hasher = KeyHasher::new(&[7; 32])?;
/// let limiter = PostgresAttemptLimiter::new(pool);
/// limiter.migrate().await?;
/// let subject = hasher.hash_attempt_for(&policy, b"user@example.test");
/// match limiter.acquire(&subject).await? {
///     AttemptDecision::Admitted(receipt) => {
///         let password_ok = false; // verify outside any transaction
///         let outcome = if password_ok { AttemptOutcome::Success } else { AttemptOutcome::Failure };
///         let _result = limiter.complete(receipt, outcome).await?;
///     }
///     AttemptDecision::Denied(denial) => {
///         let _retry_after = denial.retry_after().map(|delay| delay.seconds());
///     }
/// }
/// # Ok(()) }
/// # let _ = run;
/// ```
pub struct PostgresAttemptLimiter<O = ()> {
    pool: PgPool,
    config: PostgresConfig,
    observer: O,
}

impl PostgresAttemptLimiter {
    /// A limiter on `pool` with the default [`PostgresConfig`] and no observer. Run
    /// [`migrate`](Self::migrate) (or vendor [`CREATE_RUNLIMIT_ATTEMPTS_SQL`]) first.
    #[must_use]
    pub fn new(pool: PgPool) -> Self {
        Self { pool, config: PostgresConfig::default(), observer: () }
    }
}

impl<O> fmt::Debug for PostgresAttemptLimiter<O> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresAttemptLimiter").field("config", &self.config).finish_non_exhaustive()
    }
}

/// An open standalone transaction and its operation deadline.
struct Open {
    lease: PooledConnection,
    deadline: tokio::time::Instant,
}

/// What the pre-commit part of an admission decided.
enum Admission {
    Denied(AttemptDenial),
    Admitted(Vec<u8>),
}

impl<O: AttemptObserver> PostgresAttemptLimiter<O> {
    /// Replaces the configuration: timeouts and the operational rows-per-shard bound.
    #[must_use]
    pub fn with_config(mut self, config: PostgresConfig) -> Self {
        self.config = config;
        self
    }

    /// Replaces the observer. Standalone operations report admitted, denied, completed, stale,
    /// uncertain-commit and failed outcomes after their transaction ends; seam operations report
    /// nothing. Observer panics are caught.
    #[must_use]
    pub fn with_observer<O2: AttemptObserver>(self, observer: O2) -> PostgresAttemptLimiter<O2> {
        PostgresAttemptLimiter { pool: self.pool, config: self.config, observer }
    }

    /// The configuration.
    #[must_use]
    pub fn config(&self) -> &PostgresConfig {
        &self.config
    }

    /// Applies [`ATTEMPTS_MIGRATOR`] with `ignore_missing` set, on a dedicated connection.
    ///
    /// # Errors
    ///
    /// [`MigrationError`] when no connection is available or a migration fails.
    pub async fn migrate(&self) -> Result<(), MigrationError> {
        run_migrator(&self.pool, &self.config, &migrations::attempts_shared_history_migrator()).await
    }

    fn observe(
        &self,
        policy: &AttemptPolicy,
        operation: AttemptOperation,
        event: AttemptEvent,
        start: Instant,
    ) {
        notify_attempt(&self.observer, &AttemptObservation::new(policy, operation, event, start.elapsed()));
    }

    /// Admits an attempt for `subject` or says why not (see the [module docs](self)).
    ///
    /// Delays are whole milliseconds of the server clock measured at evaluation time; they may
    /// overstate by commit and transport latency.
    ///
    /// # Errors
    ///
    /// [`CheckError`]: every variant is an admission failure. Only
    /// [`CheckError::CommitOutcomeUnknown`] and [`CheckError::CommitTimeout`] may have admitted
    /// (and so leased) an attempt whose receipt is lost; the lease then expires as a failure.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future before it resolves gives no acknowledgement and can race with
    /// `COMMIT`; the connection is closed rather than reused.
    pub async fn acquire(
        &self,
        subject: &AttemptSubject<'_>,
    ) -> Result<AttemptDecision<PostgresAttemptReceipt>, CheckError> {
        let start = Instant::now();
        let policy = subject.policy();
        let result = self.acquire_transaction(subject).await;
        let event = match &result {
            Ok(AttemptDecision::Admitted(_)) => AttemptEvent::Admitted,
            Ok(AttemptDecision::Denied(denial)) => AttemptEvent::Denied(denial.reason()),
            Err(error) if error.consumption() == runlimit_core::ConsumptionStatus::MayHaveBeenConsumed => {
                AttemptEvent::UncertainCommit
            }
            Err(_) => AttemptEvent::Failed,
        };
        self.observe(policy, AttemptOperation::Admission, event, start);
        result
    }

    /// Records the outcome of an admitted attempt, consuming its receipt, in one transaction.
    /// Returns only after `COMMIT` is acknowledged: [`AttemptCompletionResult::Reset`],
    /// [`AttemptCompletionResult::FailureRecorded`], or [`AttemptCompletionResult::Stale`]
    /// (nothing recorded; the lease had expired or was superseded).
    ///
    /// # Errors
    ///
    /// [`CheckError`]. [`consumption`](CheckError::consumption) `MayHaveBeenConsumed` means the
    /// completion may have been recorded; never replay it automatically. Any other error
    /// recorded nothing, and the lease will expire as a failure at its deadline.
    pub async fn complete(
        &self,
        receipt: PostgresAttemptReceipt,
        outcome: AttemptOutcome,
    ) -> Result<AttemptCompletionResult, CheckError> {
        let start = Instant::now();
        let result = self.complete_transaction(&receipt, outcome).await;
        let event = match &result {
            Ok(AttemptCompletionResult::Stale) => AttemptEvent::Stale,
            Ok(_) => AttemptEvent::Completed(outcome),
            Err(error) if error.consumption() == runlimit_core::ConsumptionStatus::MayHaveBeenConsumed => {
                AttemptEvent::UncertainCommit
            }
            Err(_) => AttemptEvent::Failed,
        };
        self.observe(&receipt.policy, AttemptOperation::Completion(outcome), event, start);
        result
    }

    /// Acquires a pooled connection and opens a `READ COMMITTED` transaction with the
    /// transaction-local timeouts and `search_path`, within the operation budget.
    async fn open(&self) -> Result<Open, CheckError> {
        let mut lease =
            PooledConnection { connection: acquire(&self.pool, &self.config).await?, clean: false };
        let timeout = self.config.operation_timeout();
        let deadline = tokio::time::Instant::now() + timeout;
        let settings = protocol::settings(self.config.server_timeout_millis());
        let connection: &mut PgConnection = &mut lease.connection;
        let begun = timeout_at(deadline, async move {
            connection.execute(protocol::begin()).await?;
            connection.execute(AssertSqlSafe(settings)).await
        })
        .await;
        match begun {
            Ok(Ok(_)) => Ok(Open { lease, deadline }),
            Ok(Err(source)) if is_server_timeout(&source) => {
                Err(CheckError::Timeout { phase: CheckPhase::Begin, timeout })
            }
            Ok(Err(source)) => Err(CheckError::Database { phase: CheckPhase::Begin, source }),
            Err(_) => Err(CheckError::Timeout { phase: CheckPhase::Begin, timeout }),
        }
    }

    /// Ends the transaction of `open` after its work returned `outcome` (`Err` when the budget
    /// elapsed in `phase`): `COMMIT` when the work says so, else `ROLLBACK`, classifying
    /// failures. A failed rollback after a no-change result only costs the connection.
    async fn close<T>(
        &self,
        mut open: Open,
        phase: CheckPhase,
        outcome: Result<Result<(T, bool), StepError>, tokio::time::error::Elapsed>,
    ) -> Result<T, CheckError> {
        let timeout = self.config.operation_timeout();
        let (value, commit) = match outcome {
            Err(_) => return Err(CheckError::Timeout { phase, timeout }),
            Ok(Err(StepError::Database(_, source))) if is_server_timeout(&source) => {
                return Err(CheckError::Timeout { phase, timeout });
            }
            Ok(Err(StepError::Database(_, source))) => return Err(CheckError::Database { phase, source }),
            Ok(Err(StepError::Malformed(reason))) => {
                return Err(CheckError::MalformedResponse { phase, reason });
            }
            Ok(Ok(done)) => done,
        };
        let connection = &mut open.lease.connection;
        if !commit {
            if let Ok(Ok(_)) = timeout_at(open.deadline, connection.execute(protocol::ROLLBACK)).await {
                open.lease.clean = true;
            }
            return Ok(value);
        }
        match timeout_at(open.deadline, connection.execute(protocol::COMMIT)).await {
            Ok(Ok(_)) => {
                open.lease.clean = true;
                Ok(value)
            }
            Ok(Err(source)) if commit_definitely_rolled_back(&source) => {
                Err(CheckError::CommitRejected { source })
            }
            Ok(Err(source)) => Err(CheckError::CommitOutcomeUnknown { source }),
            Err(_) => Err(CheckError::CommitTimeout { timeout }),
        }
    }

    async fn acquire_transaction(
        &self,
        subject: &AttemptSubject<'_>,
    ) -> Result<AttemptDecision<PostgresAttemptReceipt>, CheckError> {
        let policy = subject.policy();
        let key = subject.counter_key().to_bytes();
        let shard = i16::from(key[32]);
        let maximum_rows = i32::try_from(self.config.maximum_rows_per_shard()).unwrap_or(i32::MAX);
        let mut open = self.open().await?;
        let deadline = open.deadline;
        let mut phase = CheckPhase::Lock;
        let outcome = {
            let connection: &mut PgConnection = &mut open.lease.connection;
            let phase = &mut phase;
            timeout_at(deadline, async move {
                sqlx::query(LOCK_SHARD)
                    .bind(shard)
                    .fetch_one(&mut *connection)
                    .await
                    .map_err(|error| StepError::Database("lock", error))?;
                *phase = CheckPhase::Preflight;
                let stored = sqlx::query(READ_ROW_SKIP_LOCKED)
                    .bind(&key[..])
                    .fetch_optional(&mut *connection)
                    .await
                    .map_err(|error| StepError::Database("read", error))?;
                let stored = stored.as_ref().map(Stored::read).transpose().map_err(StepError::Malformed)?;
                let locked = if stored.is_none() {
                    sqlx::query(LOCKED_ROW)
                        .bind(&key[..])
                        .fetch_optional(&mut *connection)
                        .await
                        .map_err(|error| StepError::Database("read", error))?
                        .map(|row| row.try_get::<Option<i64>, _>("lease_deadline_ms"))
                        .transpose()
                        .map_err(|_| StepError::Malformed("undecodable column"))?
                } else {
                    None
                };
                let now = now_ms(connection).await?;
                if let Some(deadline) = locked {
                    // Another transaction holds the row: its attempt is being completed.
                    let retry_after = deadline.map_or(Delay::ZERO, |deadline| delay_between(now, deadline));
                    return Ok((Admission::Denied(AttemptDenial::InProgress { retry_after }), false));
                }
                let mut settled = stored.clone();
                if let Some(state) = settled.as_mut() {
                    state.settle(now);
                }
                let failures = match admission(policy, settled.as_ref(), now) {
                    Ok(failures) => failures,
                    Err(denial) => return Ok((Admission::Denied(denial), false)),
                };
                let lease_ms = saturating_i64(policy.lease().as_millis());
                let quiet = saturating_i64(policy.quiet_period().as_millis());
                let deadline = now.saturating_add(lease_ms);
                let expires = deadline.saturating_add(quiet);
                let row = if let Some(settled) = settled {
                    *phase = CheckPhase::Update;
                    sqlx::query(ADMIT)
                        .bind(&key[..])
                        .bind(i64::from(failures))
                        .bind(settled.last_failure_at)
                        .bind(deadline)
                        .bind(expires)
                        .fetch_one(&mut *connection)
                        .await
                } else {
                    *phase = CheckPhase::Reserve;
                    sqlx::query(RECLAIM)
                        .bind(shard)
                        .bind(now)
                        .bind(RECLAIMED_ROWS_PER_ADMISSION)
                        .execute(&mut *connection)
                        .await
                        .map_err(|error| StepError::Database("reclaim", error))?;
                    let slot = sqlx::query(FREE_SLOT)
                        .bind(shard)
                        .bind(maximum_rows)
                        .fetch_optional(&mut *connection)
                        .await
                        .map_err(|error| StepError::Database("slot", error))?;
                    let Some(slot) = slot else {
                        let earliest: Option<i64> = sqlx::query(EARLIEST_EXPIRY)
                            .bind(shard)
                            .fetch_one(&mut *connection)
                            .await
                            .map_err(|error| StepError::Database("slot", error))?
                            .try_get("earliest")
                            .map_err(|_| StepError::Malformed("undecodable column"))?;
                        let retry_after =
                            earliest.filter(|at| *at != i64::MAX).map(|at| delay_between(now, at));
                        return Ok((
                            Admission::Denied(AttemptDenial::StorageCapacity { retry_after }),
                            false,
                        ));
                    };
                    let slot: i32 =
                        slot.try_get("slot").map_err(|_| StepError::Malformed("undecodable column"))?;
                    *phase = CheckPhase::Update;
                    sqlx::query(INSERT)
                        .bind(&key[..])
                        .bind(shard)
                        .bind(slot)
                        .bind(now)
                        .bind(deadline)
                        .bind(expires)
                        .fetch_one(&mut *connection)
                        .await
                };
                let row = row.map_err(|error| StepError::Database("write", error))?;
                let token: Vec<u8> =
                    row.try_get("lease_token").map_err(|_| StepError::Malformed("undecodable column"))?;
                Ok((Admission::Admitted(token), true))
            })
            .await
        };
        let admission = self.close(open, phase, outcome).await?;
        Ok(match admission {
            Admission::Denied(denial) => AttemptDecision::Denied(denial),
            Admission::Admitted(token) => {
                AttemptDecision::Admitted(PostgresAttemptReceipt { policy: policy.clone(), key, token })
            }
        })
    }

    async fn complete_transaction(
        &self,
        receipt: &PostgresAttemptReceipt,
        outcome: AttemptOutcome,
    ) -> Result<AttemptCompletionResult, CheckError> {
        let mut open = self.open().await?;
        let deadline = open.deadline;
        let mut phase = CheckPhase::Lock;
        let outcome = {
            let connection: &mut PgConnection = &mut open.lease.connection;
            let phase = &mut phase;
            timeout_at(deadline, async move {
                let result =
                    complete_locked(connection, &receipt.policy, &receipt.key, &receipt.token, outcome)
                        .await?;
                *phase = CheckPhase::Update;
                let commit = result != AttemptCompletionResult::Stale;
                Ok((result, commit))
            })
            .await
        };
        self.close(open, phase, outcome).await
    }

    /// Seam: locks and validates the receipt's live reservation inside the caller's transaction
    /// and rotates its lease token, consuming the receipt.
    ///
    /// `connection` must be inside an open transaction the caller owns (an autocommit
    /// connection makes every later [`finish_in`](Self::finish_in) `Stale`). The returned claim
    /// is fenced to this transaction's ID (`pg_current_xact_id()`) and to the rotated token:
    /// rolling back a savepoint containing the claim reverts the token and makes the claim
    /// stale; releasing the savepoint keeps it and its row lock. While the claim holds the row
    /// lock, time spent on application work does not expire it. No statement here commits, and
    /// no observation is reported. Run expensive credential verification *before* opening the
    /// transaction.
    ///
    /// # Errors
    ///
    /// [`AttemptSeamError`]; roll the host transaction back.
    pub async fn claim_in(
        &self,
        connection: &mut PgConnection,
        receipt: PostgresAttemptReceipt,
    ) -> Result<AttemptClaimResult, AttemptSeamError> {
        let stored = read_row(connection, &receipt.key).await?;
        let now = now_ms(connection).await?;
        let Some(mut stored) = stored else { return Ok(AttemptClaimResult::Stale) };
        stored.settle(now);
        if !stored.holds(&receipt.token) {
            return Ok(AttemptClaimResult::Stale);
        }
        let row = sqlx::query(CLAIM)
            .bind(&receipt.key[..])
            .fetch_one(&mut *connection)
            .await
            .map_err(|source| AttemptSeamError::Database { step: "claim", source })?;
        let token: Vec<u8> = row
            .try_get("lease_token")
            .map_err(|_| AttemptSeamError::MalformedResponse { reason: "undecodable column" })?;
        Ok(AttemptClaimResult::Claimed(AttemptClaim { policy: receipt.policy, key: receipt.key, token }))
    }

    /// Seam: stages the final `outcome` of a claimed attempt in the claim's transaction.
    ///
    /// The result is provisional until the host commits. It is
    /// [`AttemptCompletionResult::Stale`] (nothing staged) when the claim is used in another
    /// transaction, after a savepoint containing the claim was rolled back, or after the row
    /// changed. The lease deadline is not re-checked: the claim's row lock holds the
    /// reservation during application work.
    ///
    /// # Errors
    ///
    /// [`AttemptSeamError`]; roll the host transaction back.
    pub async fn finish_in(
        &self,
        connection: &mut PgConnection,
        claim: AttemptClaim,
        outcome: AttemptOutcome,
    ) -> Result<StagedAttemptCompletion, AttemptSeamError> {
        let stored = read_row(connection, &claim.key).await?;
        let now = now_ms(connection).await?;
        let result = match stored {
            Some(stored) if stored.same_transaction && stored.holds(&claim.token) => {
                record(connection, &claim.policy, &claim.key, stored.failures, outcome, now).await?
            }
            _ => AttemptCompletionResult::Stale,
        };
        Ok(StagedAttemptCompletion { result })
    }

    /// Seam: validates the receipt's live reservation and stages its already-final `outcome` in
    /// the caller's transaction, in one step (a [`claim_in`](Self::claim_in) and
    /// [`finish_in`](Self::finish_in) without application work in between). Provisional until
    /// the host commits; [`AttemptCompletionResult::Stale`] staged nothing.
    ///
    /// # Errors
    ///
    /// [`AttemptSeamError`]; roll the host transaction back.
    pub async fn complete_in(
        &self,
        connection: &mut PgConnection,
        receipt: PostgresAttemptReceipt,
        outcome: AttemptOutcome,
    ) -> Result<StagedAttemptCompletion, AttemptSeamError> {
        let result =
            complete_locked(connection, &receipt.policy, &receipt.key, &receipt.token, outcome).await?;
        Ok(StagedAttemptCompletion { result })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settle_counts_an_expired_lease_as_a_failure_at_its_deadline() {
        let mut stored =
            Stored { failures: 2, last_failure_at: 10, lease: Some((vec![1], 100)), same_transaction: false };
        stored.settle(99);
        assert_eq!(stored.lease, Some((vec![1], 100)));
        stored.settle(100);
        assert_eq!((stored.failures, stored.last_failure_at, stored.lease.clone()), (3, 100, None));
        let mut saturated = Stored { failures: u32::MAX, ..stored.clone() };
        saturated.lease = Some((vec![2], 200));
        saturated.settle(500);
        assert_eq!(saturated.failures, u32::MAX);
    }

    #[test]
    fn seam_error_messages() {
        assert_eq!(
            AttemptSeamError::MalformedResponse { reason: "undecodable column" }.to_string(),
            "malformed database response: undecodable column"
        );
        assert_eq!(
            AttemptSeamError::Database { step: "claim", source: sqlx::Error::PoolClosed }.to_string(),
            "database failure in the attempt claim statement"
        );
    }
}
