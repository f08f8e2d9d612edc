//! [`PostgresAttemptLimiter`]: attempt limiting
//! ([`AttemptPolicy`]) shared across replicas, with a
//! low-level seam for completing an attempt inside an application-owned transaction.
//!
//! # Storage
//!
//! One row of `public.runlimit_attempts` per subject with failure state or a lease (see
//! [`CREATE_RUNLIMIT_ATTEMPTS_SQL`]), installed by its own [`ATTEMPTS_MIGRATOR`]; fixed-window
//! and GCRA consumers need no new tables. The state machine is `runlimit_core::backend::attempts`,
//! the one `runlimit_memory::MemoryAttemptLimiter` runs too, evaluated in whole milliseconds of
//! the server clock (`pg_catalog.clock_timestamp()`, sampled after every lock the operation
//! takes, truncated exactly to the millisecond; a stored `i64::MAX` instant is the rules'
//! never-passing saturated instant):
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
mod sql;

use std::{fmt, time::Instant};

use runlimit_core::{
    AttemptSubject, Delay,
    attempts::{
        AttemptCompletionResult, AttemptDecision, AttemptDenial, AttemptEvent, AttemptObservation,
        AttemptObserver, AttemptOperation, AttemptOutcome, AttemptPolicy, AttemptReceipt,
    },
    backend::{
        attempts::{
            self as rules, AttemptReset, AttemptState, Completion, LeaseToken, issue, receipt_key,
            receipt_token,
        },
        notify_attempt,
    },
};
use sqlx::{PgConnection, PgPool, Row, postgres::PgRow};
use tokio::time::timeout_at;

pub use self::migrations::{ATTEMPTS_MIGRATION_VERSIONS, ATTEMPTS_MIGRATOR, CREATE_RUNLIMIT_ATTEMPTS_SQL};
use crate::{
    config::PostgresConfig,
    error::{CheckError, CheckPhase, MigrationError, sqlstate},
    migrations::run_migrator,
    transaction::{self, Ending, sqlx_failure},
};

/// Expired rows a new subject's admission may delete from its shard.
pub const RECLAIMED_ROWS_PER_ADMISSION: i64 = 16;

fn saturating_i64(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

fn delay_between(from: u64, to: u64) -> Delay {
    Delay::from_millis(to.saturating_sub(from))
}

/// A stored instant (milliseconds of the server clock) for the rules: `i64::MAX`, the
/// saturated instant, is the rules' never-passing `u64::MAX`.
fn instant(stored: i64) -> Result<u64, &'static str> {
    if stored == i64::MAX {
        return Ok(u64::MAX);
    }
    u64::try_from(stored).map_err(|_| "negative stored instant")
}

/// An instant of the rules as stored: saturating at `i64::MAX`.
fn stored_instant(instant: u64) -> i64 {
    saturating_i64(instant)
}

/// A subject's stored state, as read under its row lock: the rules' [`AttemptState`], its
/// lease token and whether the reading transaction holds the row's claim.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Stored {
    state: AttemptState,
    token: Option<Vec<u8>>,
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
        let lease_deadline_ms = match (&token, deadline) {
            (Some(_), Some(deadline)) => Some(instant(deadline)?),
            (None, None) => None,
            _ => return Err("lease token and deadline disagree"),
        };
        let state = AttemptState {
            consecutive_failures: failures,
            last_failure_at_ms: instant(last_failure_at)?,
            lease_deadline_ms,
        };
        Ok(Self { state, token, same_transaction })
    }

    /// Whether the stored lease is the one `token` was issued for.
    fn holds(&self, token: &[u8]) -> bool {
        self.token.as_deref() == Some(token)
    }
}

/// The opaque, consuming receipt of an attempt admitted by
/// [`PostgresAttemptLimiter::acquire`]: an [`AttemptReceipt`] holding a [`PostgresLeaseToken`].
///
/// Complete it with [`complete`](PostgresAttemptLimiter::complete) or, inside a host
/// transaction, [`claim_in`](PostgresAttemptLimiter::claim_in) /
/// [`complete_in`](PostgresAttemptLimiter::complete_in); each consumes it. Not `Clone`.
/// Dropping it is no refund: the lease expires as a failure at its deadline. `Debug` shows the
/// policy identifier only, never the subject key or the lease token.
pub type PostgresAttemptReceipt = AttemptReceipt<PostgresLeaseToken>;

/// The lease token of a [`PostgresAttemptReceipt`]: 16 random bytes (`gen_random_uuid()`)
/// stored with the lease and rotated by every admission and claim. Opaque: nothing outside
/// this crate can make one; `Debug` is redacted.
pub struct PostgresLeaseToken(Vec<u8>);

impl LeaseToken for PostgresLeaseToken {
    const RECEIPT_NAME: &'static str = "PostgresAttemptReceipt";
}

impl fmt::Debug for PostgresLeaseToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresLeaseToken").finish_non_exhaustive()
    }
}

/// A reservation claimed inside a host transaction by
/// [`PostgresAttemptLimiter::claim_in`]: fenced to that transaction's ID and to the lease token
/// the claim rotated. Not `Clone`; `Debug` shows the policy identifier only.
#[must_use = "finish the claim with finish_in inside the same transaction"]
pub struct AttemptClaim(AttemptReceipt<ClaimToken>);

/// The token a claim rotated the lease to (the claim is a receipt of its own kind, so a claim
/// and a receipt can never stand in for each other).
struct ClaimToken(Vec<u8>);

impl LeaseToken for ClaimToken {
    const RECEIPT_NAME: &'static str = "AttemptClaim";
}

impl AttemptClaim {
    /// The attempt policy.
    #[must_use]
    pub fn policy(&self) -> &AttemptPolicy {
        self.0.policy()
    }
}

impl fmt::Debug for AttemptClaim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
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
    let row = sqlx::query(sql::READ_ROW)
        .bind(&key[..])
        .fetch_optional(&mut *connection)
        .await
        .map_err(|error| StepError::Database("read", error))?;
    row.as_ref().map(Stored::read).transpose().map_err(StepError::Malformed)
}

/// The server clock, sampled after every lock the operation took.
async fn now_ms(connection: &mut PgConnection) -> Result<u64, StepError> {
    let row = sqlx::query(sql::NOW_MS)
        .fetch_one(&mut *connection)
        .await
        .map_err(|e| StepError::Database("clock", e))?;
    let now: i64 = row.try_get("now_ms").map_err(|_| StepError::Malformed("undecodable clock"))?;
    u64::try_from(now).map_err(|_| StepError::Malformed("negative database time"))
}

/// Writes `completion` (from the rules) for a row whose reservation the caller holds (row
/// locked), and returns its result.
async fn write_completion(
    connection: &mut PgConnection,
    policy: &AttemptPolicy,
    key: &[u8; 64],
    completion: Completion,
) -> Result<AttemptCompletionResult, StepError> {
    let written = match completion {
        Completion::Stale { .. } => return Ok(AttemptCompletionResult::Stale),
        Completion::Remove => sqlx::query(sql::DELETE).bind(&key[..]).execute(&mut *connection).await,
        Completion::Store { state, .. } => {
            sqlx::query(sql::RECORD_FAILURE)
                .bind(&key[..])
                .bind(i64::from(state.consecutive_failures))
                .bind(stored_instant(state.last_failure_at_ms))
                .bind(stored_instant(state.expires_at_ms(policy)))
                .execute(&mut *connection)
                .await
        }
    };
    match written.map(|done| done.rows_affected()) {
        Ok(1) => Ok(completion.result()),
        Ok(_) => Err(StepError::Malformed("completion affected no row")),
        Err(error) => Err(StepError::Database("write", error)),
    }
}

/// Reads the subject's state and completes the receipt holding `token` by the rules (settling
/// an expired lease first, so a receipt whose lease expired is stale).
async fn complete_locked(
    connection: &mut PgConnection,
    policy: &AttemptPolicy,
    key: &[u8; 64],
    token: &[u8],
    outcome: AttemptOutcome,
) -> Result<AttemptCompletionResult, StepError> {
    let stored = read_row(connection, key).await?;
    let now = now_ms(connection).await?;
    let holds = stored.as_ref().is_some_and(|stored| stored.holds(token));
    let completion = rules::complete(policy, stored.map(|stored| stored.state), holds, outcome, now);
    write_completion(connection, policy, key, completion).await
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
        run_migrator(&self.pool, &self.config, &crate::migrations::shared_history(&ATTEMPTS_MIGRATOR)).await
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
        self.observe(receipt.policy(), AttemptOperation::Completion(outcome), event, start);
        result
    }

    /// An operator's reset of `subject`'s failure state (a support desk unlocking a user), in
    /// one transaction: its failures and backoff are forgotten, so its next admission behaves
    /// as for a subject that never failed. Returns, after `COMMIT` is acknowledged, whether it
    /// held live state (failures within the quiet period, or a live lease).
    ///
    /// A reset never cancels a live lease: the attempt in flight keeps its reservation and its
    /// token, a concurrent `acquire` is still denied
    /// [`InProgress`](runlimit_core::attempts::AttemptDenial::InProgress), and the outstanding
    /// receipt completes normally (a success removes the state; a failure counts as the first
    /// after the reset). A claim held by a host transaction ([`claim_in`](Self::claim_in)) is
    /// waited for, within the operation timeout, because the reset locks the subject's row as
    /// a completion does. Without a live lease the row is deleted and its slot freed.
    /// Reported to the observer as [`AttemptOperation::Reset`] with
    /// [`AttemptEvent::Reset`]. See `runlimit_core::backend::attempts::reset` for the rule.
    ///
    /// # Errors
    ///
    /// [`CheckError`]. [`consumption`](CheckError::consumption) `MayHaveBeenConsumed` means
    /// the reset may have been applied; any other error changed nothing.
    pub async fn reset(&self, subject: &AttemptSubject<'_>) -> Result<bool, CheckError> {
        let start = Instant::now();
        let policy = subject.policy();
        let key = subject.counter_key().to_bytes();
        let result = self
            .standalone(async |connection, phase| {
                *phase = CheckPhase::Preflight;
                let Some(stored) = read_row(connection, &key).await? else { return Ok((false, false)) };
                let now = now_ms(connection).await?;
                let plan = rules::reset(policy, Some(stored.state), now);
                *phase = CheckPhase::Update;
                let write = match plan {
                    AttemptReset::NothingLive | AttemptReset::Remove => {
                        sqlx::query(sql::DELETE).bind(&key[..]).execute(&mut *connection).await
                    }
                    AttemptReset::KeepLease { state } => {
                        sqlx::query(sql::RESET_FAILURES)
                            .bind(&key[..])
                            .bind(stored_instant(state.last_failure_at_ms))
                            .bind(stored_instant(state.expires_at_ms(policy)))
                            .execute(&mut *connection)
                            .await
                    }
                };
                let written = write.map_err(|error| StepError::Database("write", error))?;
                if written.rows_affected() != 1 {
                    return Err(StepError::Malformed("the locked row was not written"));
                }
                Ok((plan.had_live_state(), true))
            })
            .await;
        let event = match &result {
            Ok(had_live_state) => AttemptEvent::Reset { had_live_state: *had_live_state },
            Err(error) if error.consumption() == runlimit_core::ConsumptionStatus::MayHaveBeenConsumed => {
                AttemptEvent::UncertainCommit
            }
            Err(_) => AttemptEvent::Failed,
        };
        self.observe(policy, AttemptOperation::Reset, event, start);
        result
    }

    /// Runs a standalone operation in its own transaction: acquires a pooled connection, opens
    /// a `READ COMMITTED` transaction with the transaction-local timeouts and `search_path`,
    /// runs `work` within the operation budget (it names the phase it is in), then `COMMIT`s
    /// when `work` says so and `ROLLBACK`s otherwise, classifying every failure. A failed
    /// rollback after a no-change result only costs the connection.
    async fn standalone<T>(
        &self,
        work: impl AsyncFnOnce(&mut PgConnection, &mut CheckPhase) -> Result<(T, bool), StepError>,
    ) -> Result<T, CheckError> {
        let config = &self.config;
        let timeout = config.operation_timeout();
        transaction::run(&self.pool, config, async |connection, deadline| {
            if let Err(error) = transaction::begin(connection, deadline, config).await {
                return (Err(error), false);
            }
            let mut phase = CheckPhase::Lock;
            let outcome = timeout_at(deadline, work(&mut *connection, &mut phase)).await;
            let (value, commit) = match outcome {
                Ok(Ok(done)) => done,
                Err(_) => return (Err(CheckError::Timeout { phase, timeout }), false),
                Ok(Err(StepError::Database(_, source))) => {
                    return (Err(sqlx_failure(source, phase, timeout)), false);
                }
                Ok(Err(StepError::Malformed(reason))) => {
                    return (Err(CheckError::MalformedResponse { phase, reason }), false);
                }
            };
            let ending = if commit {
                Ending::Commit { value, writes: String::new(), statements: 0 }
            } else {
                Ending::Rollback(value)
            };
            transaction::end(connection, deadline, timeout, ending).await
        })
        .await
    }

    async fn acquire_transaction(
        &self,
        subject: &AttemptSubject<'_>,
    ) -> Result<AttemptDecision<PostgresAttemptReceipt>, CheckError> {
        let policy = subject.policy();
        let key = subject.counter_key().to_bytes();
        let shard = i16::from(key[32]);
        let maximum_rows = i32::try_from(self.config.maximum_rows_per_shard()).unwrap_or(i32::MAX);
        let admission = self
            .standalone(async |connection, phase| {
                sqlx::query(sql::LOCK_SHARD)
                    .bind(shard)
                    .fetch_one(&mut *connection)
                    .await
                    .map_err(|error| StepError::Database("lock", error))?;
                *phase = CheckPhase::Preflight;
                let stored = sqlx::query(sql::READ_ROW_SKIP_LOCKED)
                    .bind(&key[..])
                    .fetch_optional(&mut *connection)
                    .await
                    .map_err(|error| StepError::Database("read", error))?;
                let stored = stored.as_ref().map(Stored::read).transpose().map_err(StepError::Malformed)?;
                let locked = if stored.is_none() {
                    sqlx::query(sql::LOCKED_ROW)
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
                    let retry_after = match deadline {
                        Some(deadline) => {
                            delay_between(now, instant(deadline).map_err(StepError::Malformed)?)
                        }
                        None => Delay::ZERO,
                    };
                    return Ok((Admission::Denied(AttemptDenial::InProgress { retry_after }), false));
                }
                let is_new = stored.is_none();
                let state = match rules::admit(policy, stored.map(|stored| stored.state), now) {
                    Ok(state) => state,
                    Err(denial) => return Ok((Admission::Denied(denial), false)),
                };
                let deadline = stored_instant(state.lease_deadline_ms.unwrap_or(u64::MAX));
                let expires = stored_instant(state.expires_at_ms(policy));
                let last_failure_at = stored_instant(state.last_failure_at_ms);
                let row = if is_new {
                    *phase = CheckPhase::Reserve;
                    sqlx::query(sql::RECLAIM)
                        .bind(shard)
                        .bind(stored_instant(now))
                        .bind(RECLAIMED_ROWS_PER_ADMISSION)
                        .execute(&mut *connection)
                        .await
                        .map_err(|error| StepError::Database("reclaim", error))?;
                    let slot = sqlx::query(sql::FREE_SLOT)
                        .bind(shard)
                        .bind(maximum_rows)
                        .fetch_optional(&mut *connection)
                        .await
                        .map_err(|error| StepError::Database("slot", error))?;
                    let Some(slot) = slot else {
                        let earliest: Option<i64> = sqlx::query(sql::EARLIEST_EXPIRY)
                            .bind(shard)
                            .fetch_one(&mut *connection)
                            .await
                            .map_err(|error| StepError::Database("slot", error))?
                            .try_get("earliest")
                            .map_err(|_| StepError::Malformed("undecodable column"))?;
                        let earliest = earliest.map(instant).transpose().map_err(StepError::Malformed)?;
                        let retry_after =
                            earliest.filter(|at| *at != u64::MAX).map(|at| delay_between(now, at));
                        return Ok((
                            Admission::Denied(AttemptDenial::StorageCapacity { retry_after }),
                            false,
                        ));
                    };
                    let slot: i32 =
                        slot.try_get("slot").map_err(|_| StepError::Malformed("undecodable column"))?;
                    *phase = CheckPhase::Update;
                    sqlx::query(sql::INSERT)
                        .bind(&key[..])
                        .bind(shard)
                        .bind(slot)
                        .bind(last_failure_at)
                        .bind(deadline)
                        .bind(expires)
                        .fetch_one(&mut *connection)
                        .await
                } else {
                    *phase = CheckPhase::Update;
                    sqlx::query(sql::ADMIT)
                        .bind(&key[..])
                        .bind(i64::from(state.consecutive_failures))
                        .bind(last_failure_at)
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
            .await?;
        Ok(match admission {
            Admission::Denied(denial) => AttemptDecision::Denied(denial),
            Admission::Admitted(token) => AttemptDecision::Admitted(issue(
                policy.clone(),
                subject.counter_key(),
                PostgresLeaseToken(token),
            )),
        })
    }

    async fn complete_transaction(
        &self,
        receipt: &PostgresAttemptReceipt,
        outcome: AttemptOutcome,
    ) -> Result<AttemptCompletionResult, CheckError> {
        self.standalone(async |connection, phase| {
            let result = complete_locked(
                connection,
                receipt.policy(),
                &receipt_key(receipt).to_bytes(),
                &receipt_token(receipt).0,
                outcome,
            )
            .await?;
            *phase = CheckPhase::Update;
            let commit = result != AttemptCompletionResult::Stale;
            Ok((result, commit))
        })
        .await
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
        let counter_key = *receipt_key(&receipt);
        let key = counter_key.to_bytes();
        let token = &receipt_token(&receipt).0;
        let stored = read_row(connection, &key).await?;
        let now = now_ms(connection).await?;
        let Some(stored) = stored else { return Ok(AttemptClaimResult::Stale) };
        // An expired lease counts as a failure at its deadline: its receipt is stale.
        if !stored.holds(token) || stored.state.settled(now).lease_deadline_ms.is_none() {
            return Ok(AttemptClaimResult::Stale);
        }
        let row = sqlx::query(sql::CLAIM)
            .bind(&key[..])
            .fetch_one(&mut *connection)
            .await
            .map_err(|source| AttemptSeamError::Database { step: "claim", source })?;
        let token: Vec<u8> = row
            .try_get("lease_token")
            .map_err(|_| AttemptSeamError::MalformedResponse { reason: "undecodable column" })?;
        Ok(AttemptClaimResult::Claimed(AttemptClaim(issue(
            receipt.policy().clone(),
            counter_key,
            ClaimToken(token),
        ))))
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
        let claim = &claim.0;
        let key = receipt_key(claim).to_bytes();
        let stored = read_row(connection, &key).await?;
        let now = now_ms(connection).await?;
        let result = match stored {
            Some(stored) if stored.same_transaction && stored.holds(&receipt_token(claim).0) => {
                let completion = rules::record(claim.policy(), stored.state, outcome, now);
                write_completion(connection, claim.policy(), &key, completion).await?
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
        let key = receipt_key(&receipt).to_bytes();
        let result =
            complete_locked(connection, receipt.policy(), &key, &receipt_token(&receipt).0, outcome).await?;
        Ok(StagedAttemptCompletion { result })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_expired_stored_lease_settles_into_a_failure_at_its_deadline() {
        let state =
            AttemptState { consecutive_failures: 2, last_failure_at_ms: 10, lease_deadline_ms: Some(100) };
        let stored = Stored { state, token: Some(vec![1]), same_transaction: false };
        assert_eq!(stored.state.settled(99), state);
        let settled = stored.state.settled(100);
        assert_eq!(
            (settled.consecutive_failures, settled.last_failure_at_ms, settled.lease_deadline_ms),
            (3, 100, None)
        );
        let saturated =
            AttemptState { consecutive_failures: u32::MAX, lease_deadline_ms: Some(200), ..settled };
        assert_eq!(saturated.settled(500).consecutive_failures, u32::MAX);
        assert!(stored.holds(&[1]));
        assert!(!stored.holds(&[2]));
    }

    #[test]
    fn stored_instants_map_the_saturated_instant_both_ways() {
        assert_eq!(instant(i64::MAX), Ok(u64::MAX));
        assert_eq!(instant(1_700_000_000_000), Ok(1_700_000_000_000));
        assert_eq!(instant(-1), Err("negative stored instant"));
        assert_eq!(stored_instant(u64::MAX), i64::MAX);
        assert_eq!(stored_instant(u64::MAX - 1), i64::MAX);
        assert_eq!(stored_instant(5), 5);
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
