//! `PostgresLimiter`: anchored fixed windows shared by every replica of a PostgreSQL database.

use std::{
    fmt,
    future::Future,
    time::{Duration, Instant},
};

use runlimit_core::{
    Allowance, BatchDecision, Check, Decision, FixedWindowPolicy, Limiter, Observer, QuotaMode,
    RateLimitPolicy,
};
use sqlx::{PgConnection, PgPool, Postgres, Row, pool::PoolConnection, postgres::PgRow};
use tokio::time::{Instant as Deadline, timeout};

use crate::{
    admission::{Evaluated, finish_batch, finish_check, finish_cleanup, validate},
    config::PostgresConfig,
    decide::{CheckSpec, Plan, StoredCounter, Write, decide, lock_id, shard_of},
    error::{
        BatchCheckError, CheckError, CheckPhase, MaintenanceError, MaintenancePhase, MigrationError,
        commit_definitely_rolled_back, is_server_timeout,
    },
    migrations::{run_migrator, shared_history_migrator},
    protocol::{self, Failure, ScriptError, ScriptOutput},
};

/// Anchored fixed-window rate limiting stored in PostgreSQL and shared by every replica using
/// the same database.
///
/// Implements [`Limiter`] with [`FixedWindowPolicy`], with the same semantics as
/// `runlimit_memory::MemoryStore`: the first allowed check of a key anchors a window of the
/// policy's length; checks inside it count against the limit; denied and shadow-denied checks
/// consume nothing; an allowed batch commits every member in one transaction and a denied
/// batch consumes nothing.
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
/// # Cancel safety
///
/// Quota is evaluated only when a returned future is first polled; creating and dropping an
/// unpolled future consumes nothing. Dropping a future before it sends `COMMIT` rolls the
/// transaction back (SQLx queues a `ROLLBACK` and tests the connection before reusing it).
/// Dropping it while `COMMIT` is in flight leaves the outcome unknown, like
/// [`CheckError::CommitTimeout`]. An outer timeout should allow for
/// [`pool_acquire_timeout`](PostgresConfig::pool_acquire_timeout) plus
/// [`operation_timeout`](PostgresConfig::operation_timeout) plus scheduling overhead.
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
pub struct PostgresLimiter<O = ()> {
    pool: PgPool,
    config: PostgresConfig,
    observer: O,
}

impl PostgresLimiter<()> {
    /// A limiter on `pool` with the default [`PostgresConfig`] and no observer.
    ///
    /// Run [`migrate`](Self::migrate) (or the vendored migrations) before serving traffic.
    #[must_use]
    pub fn new(pool: PgPool) -> Self {
        Self { pool, config: PostgresConfig::default(), observer: () }
    }
}

impl<O> PostgresLimiter<O> {
    /// The largest batch [`check_all`](Self::check_all) accepts: 64 checks. Larger batches
    /// fail with [`BatchError::TooManyChecks`](runlimit_core::BatchError::TooManyChecks).
    pub const MAX_BATCH_SIZE: usize = 64;

    /// Replaces the configuration.
    #[must_use]
    pub fn with_config(mut self, config: PostgresConfig) -> Self {
        self.config = config;
        self
    }

    /// Replaces the observer. It receives one [`Observation`](runlimit_core::Observation) per admission and cleanup,
    /// synchronously, after the transaction is committed or rolled back. Observer panics are
    /// caught.
    #[must_use]
    pub fn with_observer<O2: Observer>(self, observer: O2) -> PostgresLimiter<O2> {
        PostgresLimiter { pool: self.pool, config: self.config, observer }
    }

    /// The connection pool.
    #[must_use]
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// The configuration.
    #[must_use]
    pub fn config(&self) -> &PostgresConfig {
        &self.config
    }

    /// The observer.
    #[must_use]
    pub fn observer(&self) -> &O {
        &self.observer
    }
}

impl<O: Clone> Clone for PostgresLimiter<O> {
    fn clone(&self) -> Self {
        Self { pool: self.pool.clone(), config: self.config, observer: self.observer.clone() }
    }
}

impl<O> fmt::Debug for PostgresLimiter<O> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresLimiter").field("config", &self.config).finish_non_exhaustive()
    }
}

/// A batch validated and reduced to the values sent to the database.
struct Prepared {
    keys: Vec<[u8; 64]>,
    specs: Vec<CheckSpec>,
    mode: QuotaMode,
}

impl Prepared {
    fn new(checks: &[Check<'_, FixedWindowPolicy>], mode: QuotaMode) -> Self {
        let keys: Vec<[u8; 64]> = checks.iter().map(|check| check.counter_key().to_bytes()).collect();
        let specs = checks
            .iter()
            .zip(&keys)
            .map(|(check, key)| CheckSpec {
                limit: check.policy().limit(),
                window: check.policy().window().duration(),
                shard: shard_of(key),
            })
            .collect();
        Self { keys, specs, mode }
    }
}

/// A pooled connection that is closed instead of returned to the pool unless the operation
/// marks it clean (its transaction finished with an acknowledged `COMMIT` or `ROLLBACK`).
///
/// This also covers cancellation: a future dropped mid-transaction drops its lease, and the
/// server rolls back when the session ends.
pub(crate) struct Lease {
    pub(crate) connection: PoolConnection<Postgres>,
    pub(crate) clean: bool,
}

impl Drop for Lease {
    fn drop(&mut self) {
        if !self.clean {
            self.connection.close_on_drop();
        }
    }
}

pub(crate) fn malformed(phase: CheckPhase) -> impl Fn(&'static str) -> CheckError {
    move |reason| CheckError::MalformedResponse { phase, reason }
}

pub(crate) fn column<T>(row: &PgRow, name: &str, phase: CheckPhase) -> Result<T, CheckError>
where
    T: for<'r> sqlx::Decode<'r, Postgres> + sqlx::Type<Postgres>,
{
    row.try_get(name).map_err(|_| CheckError::MalformedResponse { phase, reason: "undecodable column" })
}

/// The clock sample every row of statement `statement` carries (at least one row, all equal).
fn parse_clock(output: &ScriptOutput, statement: usize, phase: CheckPhase) -> Result<i64, CheckError> {
    let mut sample = None;
    for (_, row) in output.rows.iter().filter(|(index, _)| *index == statement) {
        let now_us: i64 = column(row, "now_us", phase)?;
        if sample.replace(now_us).is_some_and(|previous| previous != now_us) {
            return Err(CheckError::MalformedResponse { phase, reason: "clock samples differ" });
        }
    }
    sample.ok_or(CheckError::MalformedResponse { phase, reason: "missing clock sample" })
}

/// Parses the preflight rows (statement `statement` of `output`) into one optional stored
/// counter per check.
fn parse_preflight(
    output: &ScriptOutput,
    statement: usize,
    batch_size: usize,
) -> Result<Vec<Option<StoredCounter>>, CheckError> {
    let phase = CheckPhase::Preflight;
    let bad = malformed(phase);
    let mut stored = vec![None; batch_size];
    for (_, row) in output.rows.iter().filter(|(index, _)| *index == statement) {
        // The clock-only row of a batch with no stored counter has a null ordinal.
        let Some(ordinal) = column::<Option<i64>>(row, "ordinal", phase)? else { continue };
        let used: i64 = column(row, "used", phase)?;
        let expires_us: i64 = column(row, "expires_us", phase)?;
        let slot = usize::try_from(ordinal)
            .ok()
            .and_then(|ordinal| ordinal.checked_sub(1))
            .and_then(|index| stored.get_mut(index))
            .ok_or_else(|| bad("counter ordinal out of range"))?;
        if slot.replace(StoredCounter { used, expires_us }).is_some() {
            return Err(bad("duplicate counter ordinal"));
        }
    }
    Ok(stored)
}

/// Parses the reserve rows (statement 0 of `output`) into the ledger counts of `requested`.
fn parse_reserve(output: &ScriptOutput, requested: &[i16]) -> Result<[Option<i64>; 256], CheckError> {
    let phase = CheckPhase::Reserve;
    let bad = malformed(phase);
    let mut ledger = [None; 256];
    let mut shards = Vec::with_capacity(requested.len());
    for (_, row) in output.rows.iter().filter(|(index, _)| *index == 0) {
        let Some(shard) = column::<Option<i16>>(row, "shard", phase)? else { continue };
        let count: i32 = column(row, "row_count", phase)?;
        let slot = usize::try_from(shard)
            .ok()
            .and_then(|index| ledger.get_mut(index))
            .ok_or_else(|| bad("ledger shard out of range"))?;
        let count = u32::try_from(count).map_err(|_| bad("negative ledger row count"))?;
        *slot = Some(i64::from(count));
        shards.push(shard);
    }
    if shards != requested {
        return Err(bad("ledger rows do not match the requested shards"));
    }
    Ok(ledger)
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
        Failure::Sqlx(error) if is_server_timeout(&error) => {
            CheckError::Timeout { phase: phase_at(completed), timeout }
        }
        Failure::Sqlx(source) => CheckError::Database { phase: phase_at(completed), source },
    }
}

/// Classifies a failure before the write statements of the final round trip answered.
pub(crate) fn write_failure(failure: Failure, timeout: Duration) -> CheckError {
    match failure {
        // PostgreSQL answered a write with an error: the script stopped there, the transaction
        // is aborted and the COMMIT sent in the same round trip never ran.
        Failure::Sqlx(error @ sqlx::Error::Database(_)) if is_server_timeout(&error) => {
            CheckError::Timeout { phase: CheckPhase::Update, timeout }
        }
        Failure::Sqlx(source @ sqlx::Error::Database(_)) => {
            CheckError::Database { phase: CheckPhase::Update, source }
        }
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

/// How a decided admission ends, in its final round trip.
pub(crate) enum Ending {
    /// Allowed: `writes` (`statements` write statements, each verifying its own row count)
    /// then `COMMIT`, sent together.
    Commit { allowances: Vec<Allowance>, writes: String, statements: usize },
    /// An enforced or shadow denial: `ROLLBACK`. The denial stands even if the rollback fails.
    Rollback(Evaluated),
}

impl Ending {
    /// How `plan` ends: `ROLLBACK` for a denial, else the writes `commit` renders from the
    /// allowances and each check's write.
    pub(crate) fn of<W>(plan: Plan<W>, commit: impl FnOnce(Vec<Allowance>, Vec<W>) -> Self) -> Self {
        match plan {
            Plan::Denied { index, denial } => Self::Rollback(Evaluated::Denied { index, denial }),
            Plan::ShadowDenied { index, denial } => Self::Rollback(Evaluated::ShadowDenied { index, denial }),
            Plan::Allowed { allowances, writes } => commit(allowances, writes),
        }
    }
}

/// Runs one admission transaction, shared by the fixed-window and GCRA limiters: acquires a
/// pooled connection within the pool acquisition timeout, gives `transaction` a fresh
/// operation deadline, and returns the connection to the pool only if `transaction` reports
/// that its transaction finished cleanly (otherwise the [`Lease`] closes it).
pub(crate) async fn admit_leased(
    pool: &PgPool,
    config: &PostgresConfig,
    transaction: impl AsyncFnOnce(&mut PgConnection, Deadline) -> (Result<Evaluated, CheckError>, bool),
) -> Result<Evaluated, CheckError> {
    let connection = acquire(pool, config).await?;
    let mut lease = Lease { connection, clean: false };
    let deadline = Deadline::now() + config.operation_timeout();
    let (result, clean) = transaction(&mut lease.connection, deadline).await;
    lease.clean = clean;
    result
}

/// Sends an admission's final round trip and classifies its failure: a write answered with an
/// error stopped the script before `COMMIT` ([`write_failure`]); a failure after the writes is
/// a commit failure ([`commit_failure`]). Returns the result and whether the transaction
/// finished cleanly.
pub(crate) async fn end(
    connection: &mut PgConnection,
    deadline: Deadline,
    timeout: Duration,
    ending: Ending,
) -> (Result<Evaluated, CheckError>, bool) {
    match ending {
        Ending::Rollback(denied) => {
            let clean = protocol::run(connection, protocol::ROLLBACK.to_owned(), deadline).await.is_ok();
            (Ok(denied), clean)
        }
        Ending::Commit { allowances, mut writes, statements } => {
            writes.push_str(protocol::COMMIT);
            match protocol::run(connection, writes, deadline).await {
                // Every statement succeeded, COMMIT included; the writes verified their row counts.
                Ok(_) => (Ok(Evaluated::Allowed(allowances)), true),
                Err(error) if error.completed < statements => {
                    (Err(write_failure(error.failure, timeout)), false)
                }
                Err(error) => (Err(commit_failure(error, timeout)), false),
            }
        }
    }
}

pub(crate) async fn acquire(
    pool: &PgPool,
    config: &PostgresConfig,
) -> Result<PoolConnection<Postgres>, CheckError> {
    match timeout(config.pool_acquire_timeout(), pool.acquire()).await {
        Ok(Ok(connection)) => Ok(connection),
        Ok(Err(source)) => Err(CheckError::Acquire { source }),
        Err(_) => Err(CheckError::PoolTimeout { timeout: config.pool_acquire_timeout() }),
    }
}

/// Acquires a connection for a cleanup pass within the pool acquisition timeout.
pub(crate) async fn acquire_for_maintenance(
    pool: &PgPool,
    config: &PostgresConfig,
) -> Result<PoolConnection<Postgres>, MaintenanceError> {
    match timeout(config.pool_acquire_timeout(), pool.acquire()).await {
        Ok(Ok(connection)) => Ok(connection),
        Ok(Err(source)) => Err(MaintenanceError::Acquire { source }),
        Err(_) => Err(MaintenanceError::PoolTimeout { timeout: config.pool_acquire_timeout() }),
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

/// Classifies a failed cleanup `COMMIT` by whether it may have committed.
pub(crate) fn maintenance_commit_failure(failure: Failure, timeout: Duration) -> MaintenanceError {
    match failure {
        Failure::TimedOut => MaintenanceError::CommitTimeout { timeout },
        Failure::Sqlx(source) if commit_definitely_rolled_back(&source) => {
            MaintenanceError::CommitRejected { source }
        }
        Failure::Sqlx(source) => MaintenanceError::CommitOutcomeUnknown { source },
    }
}

impl<O: Observer> PostgresLimiter<O> {
    /// Applies the bundled migrations, tolerating versions owned by other migrators that
    /// share SQLx's `_sqlx_migrations` history (`ignore_missing`).
    ///
    /// Runs on a dedicated connection detached from the pool and closed afterwards, so SQLx's
    /// session-level migration advisory lock can never leak back into the pool when a
    /// migration fails (`../shared/spec/sqlx-postgres.md` §2). Not bounded by the operation
    /// timeout: the cardinality migration rewrites the counter table under an `ACCESS
    /// EXCLUSIVE` lock. Idempotent: already applied versions are skipped after their checksum
    /// is verified. See the [operations guide](crate::operations#migrations) for sharing the
    /// history with a host application.
    ///
    /// # Errors
    ///
    /// [`MigrationError::PoolTimeout`] / [`MigrationError::Acquire`] when no connection can be
    /// acquired; [`MigrationError::Migrate`] when SQLx's migrator fails (for example
    /// `VersionMismatch` for a version another migrator applied with different SQL).
    pub async fn migrate(&self) -> Result<(), MigrationError> {
        run_migrator(&self.pool, &self.config, &shared_history_migrator()).await
    }

    /// Evaluates one check, consuming one unit when allowed.
    ///
    /// # Errors
    ///
    /// Every [`CheckError`] variant; see its docs for when each occurs and
    /// [`CheckError::consumption`] for whether quota may have been consumed. A denial is not an
    /// error: it is an `Ok` [`Decision`]. An enforced or shadow denial is returned even if the
    /// rollback that follows it fails (that connection is then closed instead of reused).
    ///
    /// # Cancel safety
    ///
    /// See the [type docs](Self#cancel-safety).
    pub async fn check(&self, check: &Check<'_, FixedWindowPolicy>) -> Result<Decision, CheckError> {
        let started = Instant::now();
        let mode = check.policy().quota_mode();
        let result = self.admit(Prepared::new(std::slice::from_ref(check), mode)).await;
        finish_check(&self.observer, check.policy(), result, started)
    }

    /// Evaluates an atomic batch of at most [`MAX_BATCH_SIZE`](Self::MAX_BATCH_SIZE) checks:
    /// when every check is allowed all are consumed in one transaction; otherwise nothing is
    /// consumed and the decision names the first enforced denial in input order (capacity
    /// denials are enforced in every mode), or else the first shadow denial.
    ///
    /// # Errors
    ///
    /// [`BatchCheckError::InvalidBatch`] for a structurally invalid batch (checked by
    /// [`validate_batch`](runlimit_core::validate_batch) before any connection is acquired), otherwise
    /// [`BatchCheckError::Check`] with the same failures as [`check`](Self::check).
    ///
    /// # Cancel safety
    ///
    /// See the [type docs](Self#cancel-safety).
    pub async fn check_all(
        &self,
        checks: &[Check<'_, FixedWindowPolicy>],
    ) -> Result<BatchDecision, BatchCheckError> {
        let started = Instant::now();
        let mode = validate(&self.observer, checks, Self::MAX_BATCH_SIZE, started)?;
        let result = self.admit(Prepared::new(checks, mode)).await;
        finish_batch(&self.observer, checks, result, started)
    }

    /// Deletes at most `maximum_rows` expired counter rows, oldest expiry first, freeing their
    /// capacity-ledger slots, and returns how many were deleted.
    ///
    /// One transaction, one `DELETE`: the clock is sampled once (so the expiry predicate is an
    /// index range condition and finding nothing expired costs one index probe), rows an
    /// admission currently holds are skipped, and the affected ledger rows are locked in
    /// ascending shard order. Expired rows never affect decisions; cleanup only reclaims
    /// storage and capacity. Schedule it periodically (see the
    /// [operations guide](crate::operations#cleanup)). `maximum_rows == 0` returns `Ok(0)`
    /// without touching the database.
    ///
    /// # Errors
    ///
    /// Every [`MaintenanceError`] variant; only the commit-outcome-unknown ones
    /// ([`MaintenanceError::may_have_removed_rows`]) may have deleted rows.
    pub async fn cleanup_expired(&self, maximum_rows: u32) -> Result<u64, MaintenanceError> {
        let started = Instant::now();
        let result = if maximum_rows == 0 { Ok(0) } else { self.run_cleanup(maximum_rows).await };
        finish_cleanup(&self.observer, maximum_rows, result, started)
    }

    async fn admit(&self, prepared: Prepared) -> Result<Evaluated, CheckError> {
        admit_leased(&self.pool, &self.config, async |connection, deadline| {
            self.admit_on(connection, deadline, &prepared).await
        })
        .await
    }

    /// The admission transaction. Returns the result and whether the connection finished its
    /// transaction cleanly and may return to the pool.
    async fn admit_on(
        &self,
        connection: &mut PgConnection,
        deadline: Deadline,
        prepared: &Prepared,
    ) -> (Result<Evaluated, CheckError>, bool) {
        let (plan, now_us) = match self.evaluate(connection, deadline, prepared).await {
            Ok(evaluated) => evaluated,
            Err(error) => return (Err(error), false),
        };
        let ending = Ending::of(plan, |allowances, writes| {
            // Update phase: at most one UPDATE and one INSERT whatever the batch size, then COMMIT,
            // in one round trip. The writes verify their own row counts before COMMIT can run.
            let window_ms = |spec: &CheckSpec| u64::try_from(spec.window.as_millis()).unwrap_or(u64::MAX);
            let mut updates = Vec::new();
            let mut inserts = Vec::new();
            for ((key, spec), write) in prepared.keys.iter().zip(&prepared.specs).zip(&writes) {
                match write {
                    Write::Increment => updates.push((key, false, window_ms(spec))),
                    Write::Renew => updates.push((key, true, window_ms(spec))),
                    Write::Insert => inserts.push((key, window_ms(spec))),
                }
            }
            let mut script = String::new();
            if !updates.is_empty() {
                script.push_str(&protocol::update(&updates, now_us));
            }
            if !inserts.is_empty() {
                script.push_str(&protocol::insert(&inserts, now_us));
            }
            let statements = usize::from(!updates.is_empty()) + usize::from(!inserts.is_empty());
            Ending::Commit { allowances, writes: script, statements }
        });
        end(connection, deadline, self.config.operation_timeout(), ending).await
    }

    /// Begin, lock, preflight and (when a key has no row) reserve, then the pure decision.
    /// Returns the plan and the clock sample it was decided at.
    async fn evaluate(
        &self,
        connection: &mut PgConnection,
        deadline: Deadline,
        prepared: &Prepared,
    ) -> Result<(Plan<Write>, i64), CheckError> {
        let config = &self.config;
        let timeout = config.operation_timeout();
        let mut lock_ids: Vec<i64> = prepared.keys.iter().map(lock_id).collect();
        lock_ids.sort_unstable();
        lock_ids.dedup();

        // One round trip: BEGIN, the settings and locks, the preflight with its clock sample.
        let mut script = protocol::begin().to_owned();
        script.push_str(&protocol::lock(config.server_timeout_millis(), &lock_ids));
        script.push_str(&protocol::preflight(&prepared.keys));
        let lock_statement = protocol::BEGIN_STATEMENTS;
        let mut phases = vec![CheckPhase::Begin; lock_statement];
        phases.extend([CheckPhase::Lock, CheckPhase::Preflight]);
        let output = protocol::run(connection, script, deadline)
            .await
            .map_err(|error| check_failure(error, &phases, timeout))?;
        if output.affected.len() != phases.len() {
            return Err(CheckError::MalformedResponse {
                phase: CheckPhase::Preflight,
                reason: "statement count differs",
            });
        }
        if output.only_row(lock_statement).is_none() {
            return Err(CheckError::MalformedResponse {
                phase: CheckPhase::Lock,
                reason: "expected one lock row",
            });
        }
        let stored = parse_preflight(&output, lock_statement + 1, prepared.keys.len())?;
        let mut now_us = parse_clock(&output, lock_statement + 1, CheckPhase::Preflight)?;

        let mut missing_shards: Vec<i16> = prepared
            .specs
            .iter()
            .zip(&stored)
            .filter(|(_, counter)| counter.is_none())
            .map(|(spec, _)| i16::from(spec.shard))
            .collect();
        missing_shards.sort_unstable();
        missing_shards.dedup();
        let mut ledger = [None; 256];
        let mut phase = CheckPhase::Preflight;
        if !missing_shards.is_empty() {
            phase = CheckPhase::Reserve;
            let output = protocol::run(connection, protocol::reserve(&missing_shards), deadline)
                .await
                .map_err(|error| check_failure(error, &[CheckPhase::Reserve], timeout))?;
            ledger = parse_reserve(&output, &missing_shards)?;
            now_us = parse_clock(&output, 0, phase)?;
        }
        let plan =
            decide(&prepared.specs, &stored, now_us, &ledger, config.maximum_rows_per_shard(), prepared.mode)
                .map_err(malformed(phase))?;
        Ok((plan, now_us))
    }

    async fn run_cleanup(&self, maximum_rows: u32) -> Result<u64, MaintenanceError> {
        let config = &self.config;
        let timeout_value = config.operation_timeout();
        let connection = acquire_for_maintenance(&self.pool, config).await?;
        let mut lease = Lease { connection, clean: false };
        let deadline = Deadline::now() + timeout_value;

        let mut script = protocol::begin().to_owned();
        script.push_str(&protocol::settings(config.server_timeout_millis()));
        script.push_str(&protocol::cleanup(maximum_rows));
        let delete_statement = protocol::BEGIN_STATEMENTS + 1;
        let output = protocol::run(&mut lease.connection, script, deadline).await.map_err(|error| {
            let phase = if error.completed < delete_statement {
                MaintenancePhase::Begin
            } else {
                MaintenancePhase::Delete
            };
            maintenance_failure(error.failure, phase, timeout_value)
        })?;
        let phase = MaintenancePhase::Delete;
        let removed: i64 = output
            .only_row(delete_statement)
            .and_then(|row| row.try_get("removed").ok())
            .ok_or(MaintenanceError::MalformedResponse { phase, reason: "expected one removed count" })?;
        let removed = u64::try_from(removed)
            .ok()
            .filter(|removed| *removed <= u64::from(maximum_rows))
            .ok_or(MaintenanceError::MalformedResponse {
                phase,
                reason: "removed count outside the requested bound",
            })?;
        match protocol::run(&mut lease.connection, protocol::COMMIT.to_owned(), deadline).await {
            Ok(_) => {
                lease.clean = true;
                Ok(removed)
            }
            Err(error) => Err(maintenance_commit_failure(error.failure, timeout_value)),
        }
    }
}

impl<O: Observer> Limiter for PostgresLimiter<O> {
    type Policy = FixedWindowPolicy;
    type CheckError = CheckError;
    type CheckAllError = BatchCheckError;

    fn check(
        &self,
        check: &Check<'_, Self::Policy>,
    ) -> impl Future<Output = Result<Decision, Self::CheckError>> + Send {
        Self::check(self, check)
    }

    fn check_all(
        &self,
        checks: &[Check<'_, Self::Policy>],
    ) -> impl Future<Output = Result<BatchDecision, Self::CheckAllError>> + Send {
        Self::check_all(self, checks)
    }
}
