//! `PostgresGcraLimiter`: continuously replenished GCRA quotas shared by every replica of a
//! PostgreSQL database.

mod decide;
pub(crate) mod migrations;
mod protocol;

use std::{fmt, future::Future, time::Instant};

use runlimit_core::{
    BatchDecision, Check, Decision, GcraPolicy, Limiter, Observer, QuotaMode, RateLimitPolicy,
};
use sqlx::{PgConnection, PgPool, Row};
use tokio::time::Instant as Deadline;

use crate::{
    admission::{Evaluated, finish_batch, finish_check, finish_cleanup, validate},
    config::PostgresConfig,
    decide::Plan,
    error::{BatchCheckError, CheckError, CheckPhase, MaintenanceError, MaintenancePhase, MigrationError},
    gcra::decide::{GcraSpec, GcraWrite, LedgerRow, StoredTat, decide_gcra, effective_now},
    limiter::{
        Ending, Lease, acquire_for_maintenance, admit_leased, check_failure, column, end,
        maintenance_commit_failure, maintenance_failure, malformed,
    },
    migrations::run_migrator,
    protocol::{self as script, ScriptOutput},
};

use self::migrations::gcra_shared_history_migrator;

/// GCRA (continuously replenished) rate limiting stored in PostgreSQL and shared by every
/// replica using the same database.
///
/// Implements [`Limiter`] with [`GcraPolicy`] and accepts the same policy-bound checks as
/// `runlimit_memory::GcraStore`, with the same decisions: each check costs one unit, `quota`
/// units replenish continuously over each `period`, a rested subject may spend up to
/// `burst_capacity` at once. Decisions come from [`runlimit_core::gcra::evaluate`], the exact
/// scaled-integer evaluator `GcraStore` uses (`../shared/spec/gcra.md` §3): retry and
/// replenishment durations round up to whole milliseconds, unit counts round down.
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
/// of the 256 capacity shards keeps a committed time watermark, the latest time an allowed
/// admission or a cleanup of that shard used; an operation evaluates at the later of its clock
/// sample and the watermarks of the shards it locked, so a backwards clock step never
/// replenishes quota early or makes a row expire sooner (`gcra.md` §5). Delays are measured at
/// the clock sample and may conservatively include later commit and transport latency.
///
/// # Protocol (GCRA v1)
///
/// One `READ COMMITTED` transaction of two round trips whatever the batch size: begin, the
/// transaction-local settings, lock the ledger rows of every shard the batch touches in
/// ascending shard order (`FOR UPDATE`, before any counter is read or written, including for
/// keys without a row), read the stored arrival times and sample the clock, decide in Rust,
/// then — only when allowed — advance the watermarks, update or insert every member, and commit
/// in input order together. A denial rolls back a transaction that wrote nothing. Locking the
/// shard rather than the key deliberately serializes keys of the same shard. The shard of a key
/// (byte 32 of the counter key) and the locking order are persistent protocol and cannot change
/// in place during a rolling deploy. [`CheckPhase`] names the phases: `Begin` (begin and
/// settings), `Lock` (ledger rows), `Preflight` (read and clock), `Update` (the writes).
///
/// # Capacity
///
/// 256 shards of at most [`MAX_ROWS_PER_SHARD`](crate::MAX_ROWS_PER_SHARD) (65,536) rows,
/// enforced by the database for every writer, with the lower operational bound
/// [`PostgresConfig::maximum_rows_per_shard`] (4,096 by default) checked under the shard lock.
/// A row expires once its key is fully rested; an expired row still occupies its slot until
/// [`cleanup_expired`](Self::cleanup_expired) deletes it, but stays reusable by its own key.
/// Active rows are never evicted.
///
/// # Cancel safety
///
/// As for [`PostgresLimiter`](crate::PostgresLimiter#cancel-safety): nothing happens until
/// the future is first polled; dropping it before `COMMIT` is sent rolls back; dropping it
/// while `COMMIT` is in flight leaves the outcome unknown.
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
pub struct PostgresGcraLimiter<O = ()> {
    pool: PgPool,
    config: PostgresConfig,
    observer: O,
}

impl PostgresGcraLimiter<()> {
    /// A limiter on `pool` with the default [`PostgresConfig`] and no observer.
    ///
    /// Run [`migrate`](Self::migrate) (or the vendored GCRA migrations) before serving traffic.
    #[must_use]
    pub fn new(pool: PgPool) -> Self {
        Self { pool, config: PostgresConfig::default(), observer: () }
    }
}

impl<O> PostgresGcraLimiter<O> {
    /// The largest batch [`check_all`](Self::check_all) accepts: 64 checks. Larger batches
    /// fail with [`BatchError::TooManyChecks`](runlimit_core::BatchError::TooManyChecks).
    pub const MAX_BATCH_SIZE: usize = 64;

    /// Replaces the configuration (timeouts and the operational rows-per-shard bound).
    #[must_use]
    pub fn with_config(mut self, config: PostgresConfig) -> Self {
        self.config = config;
        self
    }

    /// Replaces the observer. It receives one [`Observation`](runlimit_core::Observation) per admission and cleanup,
    /// synchronously, after the transaction is committed or rolled back. Observer panics are
    /// caught.
    #[must_use]
    pub fn with_observer<O2: Observer>(self, observer: O2) -> PostgresGcraLimiter<O2> {
        PostgresGcraLimiter { pool: self.pool, config: self.config, observer }
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

impl<O: Clone> Clone for PostgresGcraLimiter<O> {
    fn clone(&self) -> Self {
        Self { pool: self.pool.clone(), config: self.config, observer: self.observer.clone() }
    }
}

impl<O> fmt::Debug for PostgresGcraLimiter<O> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresGcraLimiter").field("config", &self.config).finish_non_exhaustive()
    }
}

/// A batch reduced to the values sent to the database.
struct Prepared {
    keys: Vec<[u8; 64]>,
    specs: Vec<GcraSpec>,
    /// The distinct shards of the batch, ascending.
    shards: Vec<i16>,
    mode: QuotaMode,
}

impl Prepared {
    fn new(checks: &[Check<'_, GcraPolicy>], mode: QuotaMode) -> Self {
        let keys: Vec<[u8; 64]> = checks.iter().map(|check| check.counter_key().to_bytes()).collect();
        let specs: Vec<GcraSpec> = checks
            .iter()
            .zip(&keys)
            .map(|(check, key)| GcraSpec {
                parameters: runlimit_core::backend::gcra::GcraParameters::of(check.policy()),
                shard: key[32],
            })
            .collect();
        let mut shards: Vec<i16> = specs.iter().map(|spec| i16::from(spec.shard)).collect();
        shards.sort_unstable();
        shards.dedup();
        Self { keys, specs, shards, mode }
    }
}

/// Parses the ledger rows (statement `statement`) of the locked `shards`.
fn parse_ledger(
    output: &ScriptOutput,
    statement: usize,
    shards: &[i16],
) -> Result<[Option<LedgerRow>; 256], CheckError> {
    let phase = CheckPhase::Lock;
    let bad = malformed(phase);
    let mut ledger = [None; 256];
    let mut seen = Vec::with_capacity(shards.len());
    for (_, row) in output.rows.iter().filter(|(index, _)| *index == statement) {
        let shard: i16 = column(row, "shard", phase)?;
        let row_count: i32 = column(row, "row_count", phase)?;
        let watermark_ms: i64 = column(row, "watermark_ms", phase)?;
        let slot = usize::try_from(shard)
            .ok()
            .and_then(|index| ledger.get_mut(index))
            .ok_or_else(|| bad("ledger shard out of range"))?;
        *slot = Some(LedgerRow { row_count: i64::from(row_count), watermark_ms });
        seen.push(shard);
    }
    if seen != shards {
        return Err(bad("ledger rows do not match the requested shards"));
    }
    Ok(ledger)
}

/// Parses the read rows (statement `statement`): one stored arrival time per check and the
/// clock sample.
fn parse_read(
    output: &ScriptOutput,
    statement: usize,
    batch_size: usize,
) -> Result<(Vec<Option<StoredTat>>, i64), CheckError> {
    let phase = CheckPhase::Preflight;
    let bad = malformed(phase);
    let mut stored = vec![None; batch_size];
    let mut clock = None;
    for (_, row) in output.rows.iter().filter(|(index, _)| *index == statement) {
        let now_ms: i64 = column(row, "now_ms", phase)?;
        if clock.replace(now_ms).is_some_and(|previous| previous != now_ms) {
            return Err(bad("clock samples differ"));
        }
        // The clock-only row of a batch with no stored key has a null ordinal.
        let Some(ordinal) = column::<Option<i64>>(row, "ordinal", phase)? else { continue };
        let tat = StoredTat {
            tat_ms: column(row, "tat_ms", phase)?,
            tat_remainder: column(row, "tat_remainder", phase)?,
        };
        let slot = usize::try_from(ordinal)
            .ok()
            .and_then(|ordinal| ordinal.checked_sub(1))
            .and_then(|index| stored.get_mut(index))
            .ok_or_else(|| bad("row ordinal out of range"))?;
        if slot.replace(tat).is_some() {
            return Err(bad("duplicate row ordinal"));
        }
    }
    let clock = clock.ok_or_else(|| bad("missing clock sample"))?;
    Ok((stored, clock))
}

impl<O: Observer> PostgresGcraLimiter<O> {
    /// Applies the GCRA migrations ([`CREATE_RUNLIMIT_GCRA_SQL`](crate::CREATE_RUNLIMIT_GCRA_SQL)
    /// then [`INDEX_RUNLIMIT_GCRA_SHARD_EXPIRY_SQL`](crate::INDEX_RUNLIMIT_GCRA_SHARD_EXPIRY_SQL))
    /// in order, skipping those already applied (so a database with only the first is
    /// upgraded), tolerating versions owned by other migrators in a shared `_sqlx_migrations`
    /// (`ignore_missing`), including the fixed-window stream. Installs only the GCRA tables;
    /// fixed-window users need no change.
    ///
    /// Runs on a dedicated connection detached from the pool and closed afterwards, so SQLx's
    /// session-level migration lock never leaks into the pool. Not bounded by the operation
    /// timeout.
    ///
    /// # Errors
    ///
    /// [`MigrationError::PoolTimeout`] / [`MigrationError::Acquire`] when no connection can be
    /// acquired; [`MigrationError::Migrate`] when SQLx's migrator fails (for example
    /// `VersionMismatch` for a version applied with different SQL).
    pub async fn migrate(&self) -> Result<(), MigrationError> {
        run_migrator(&self.pool, &self.config, &gcra_shared_history_migrator()).await
    }

    /// Evaluates one unit-cost check, storing the new arrival time when allowed.
    ///
    /// # Errors
    ///
    /// Every [`CheckError`] variant; see its docs for when each occurs and
    /// [`CheckError::consumption`] for whether quota may have been consumed. A denial is not an
    /// error: it is an `Ok` [`Decision`]. An enforced or shadow denial is returned even if the
    /// rollback that follows it fails (that connection is then closed instead of reused). A
    /// stored arrival time no evaluation could have produced is a
    /// [`CheckError::MalformedResponse`].
    ///
    /// # Cancel safety
    ///
    /// See the [type docs](Self#cancel-safety).
    pub async fn check(&self, check: &Check<'_, GcraPolicy>) -> Result<Decision, CheckError> {
        let started = Instant::now();
        let mode = check.policy().quota_mode();
        let result = self.admit(Prepared::new(std::slice::from_ref(check), mode)).await;
        finish_check(&self.observer, check.policy(), result, started)
    }

    /// Evaluates an atomic batch of at most [`MAX_BATCH_SIZE`](Self::MAX_BATCH_SIZE) checks, all
    /// at one (clamped) database time: when every check is allowed all are committed together
    /// and the allowances keep input order; otherwise nothing is consumed and the decision names
    /// the first enforced denial in input order (capacity denials are enforced in every mode),
    /// or else the first shadow denial.
    ///
    /// # Errors
    ///
    /// [`BatchCheckError::InvalidBatch`] for a structurally invalid batch (checked by
    /// [`validate_batch`](runlimit_core::validate_batch) before any connection is acquired: empty, too large, mixed quota
    /// modes, duplicate keys), otherwise [`BatchCheckError::Check`] with the same failures as
    /// [`check`](Self::check).
    ///
    /// # Cancel safety
    ///
    /// See the [type docs](Self#cancel-safety).
    pub async fn check_all(
        &self,
        checks: &[Check<'_, GcraPolicy>],
    ) -> Result<BatchDecision, BatchCheckError> {
        let started = Instant::now();
        let mode = validate(&self.observer, checks, Self::MAX_BATCH_SIZE, started)?;
        let result = self.admit(Prepared::new(checks, mode)).await;
        finish_batch(&self.observer, checks, result, started)
    }

    /// Deletes at most `maximum_rows` expired rows (keys fully rested), oldest expiry first,
    /// freeing their capacity slots, and returns how many were deleted.
    ///
    /// One transaction of three round trips. Discovery probes the `(capacity_shard,
    /// expires_at_ms)` index once per shard — at most 256 index probes — each under that shard's
    /// clamped clock `max(clock, watermark)`, and locks the ledger rows of the shards with an
    /// expired row in ascending shard order, skipping shards an admission or another cleanup
    /// holds (`SKIP LOCKED`). Deletion then reads at most `maximum_rows` eligible rows per
    /// locked shard (index range scans; active rows lie outside them), deletes the globally
    /// oldest `maximum_rows` of those and advances the locked shards' watermarks to the time it
    /// used, so a later backwards clock step cannot treat a deleted key as rested early. The
    /// transaction sets `enable_seqscan = off` locally so this bounded index plan is chosen
    /// whatever the table statistics (a small or unanalyzed table otherwise gets sequential
    /// scans). Active rows are never evicted. `maximum_rows == 0` returns `Ok(0)` without
    /// touching the database.
    ///
    /// # Errors
    ///
    /// Every [`MaintenanceError`] variant; only the commit-outcome-unknown ones
    /// ([`MaintenanceError::may_have_removed_rows`]) may have deleted rows. Phases:
    /// [`MaintenancePhase::Begin`] covers begin, settings and discovery,
    /// [`MaintenancePhase::Delete`] the deletion.
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
        let (plan, now_ms) = match self.evaluate(connection, deadline, prepared).await {
            Ok(evaluated) => evaluated,
            Err(error) => return (Err(error), false),
        };
        let ending = Ending::of(plan, |allowances, writes| Ending::Commit {
            allowances,
            writes: protocol::write(&prepared.keys, &writes, &prepared.shards, now_ms),
            statements: 1,
        });
        end(connection, deadline, self.config.operation_timeout(), ending).await
    }

    /// Begin, lock and read in one round trip, then the pure decision. Returns the plan and the
    /// clamped time it was decided at.
    async fn evaluate(
        &self,
        connection: &mut PgConnection,
        deadline: Deadline,
        prepared: &Prepared,
    ) -> Result<(Plan<GcraWrite>, u64), CheckError> {
        let config = &self.config;
        let mut sql = script::begin().to_owned();
        sql.push_str(&script::settings(config.server_timeout_millis()));
        sql.push_str(&protocol::lock(&prepared.shards));
        sql.push_str(&protocol::read(&prepared.keys));
        let lock_statement = script::BEGIN_STATEMENTS + 1;
        let mut phases = vec![CheckPhase::Begin; lock_statement];
        phases.extend([CheckPhase::Lock, CheckPhase::Preflight]);
        let output = script::run(connection, sql, deadline)
            .await
            .map_err(|error| check_failure(error, &phases, config.operation_timeout()))?;
        if output.affected.len() != phases.len() {
            return Err(CheckError::MalformedResponse {
                phase: CheckPhase::Preflight,
                reason: "statement count differs",
            });
        }
        let ledger = parse_ledger(&output, lock_statement, &prepared.shards)?;
        let (stored, clock_ms) = parse_read(&output, lock_statement + 1, prepared.keys.len())?;
        let bad = malformed(CheckPhase::Preflight);
        let now_ms =
            effective_now(clock_ms, ledger.iter().flatten().map(|row| row.watermark_ms)).map_err(&bad)?;
        let plan = decide_gcra(
            &prepared.specs,
            &stored,
            now_ms,
            &ledger,
            config.maximum_rows_per_shard(),
            prepared.mode,
        )
        .map_err(bad)?;
        Ok((plan, now_ms))
    }

    async fn run_cleanup(&self, maximum_rows: u32) -> Result<u64, MaintenanceError> {
        let config = &self.config;
        let timeout = config.operation_timeout();
        let connection = acquire_for_maintenance(&self.pool, config).await?;
        let mut lease = Lease { connection, clean: false };
        let deadline = Deadline::now() + timeout;

        // Round trip 1: begin, settings, discovery with the shard locks.
        let mut sql = script::begin().to_owned();
        sql.push_str(&protocol::cleanup_settings(config.server_timeout_millis()));
        sql.push_str(protocol::discover());
        let discover_statement = script::BEGIN_STATEMENTS + 1;
        let output = script::run(&mut lease.connection, sql, deadline)
            .await
            .map_err(|error| maintenance_failure(error.failure, MaintenancePhase::Begin, timeout))?;
        let begin_malformed =
            |reason| MaintenanceError::MalformedResponse { phase: MaintenancePhase::Begin, reason };
        let mut locked = Vec::new();
        for (_, row) in output.rows.iter().filter(|(index, _)| *index == discover_statement) {
            let shard: i16 = row.try_get("shard").map_err(|_| begin_malformed("undecodable column"))?;
            let now_ms: i64 = row.try_get("now_ms").map_err(|_| begin_malformed("undecodable column"))?;
            locked.push((shard, now_ms));
        }
        if locked.is_empty() {
            // Nothing expired in an idle shard: end the read-only transaction.
            return match script::run(&mut lease.connection, script::ROLLBACK.to_owned(), deadline).await {
                Ok(_) => {
                    lease.clean = true;
                    Ok(0)
                }
                Err(error) => Err(maintenance_failure(error.failure, MaintenancePhase::Begin, timeout)),
            };
        }

        // Round trip 2: the bounded deletion.
        let phase = MaintenancePhase::Delete;
        let output = script::run(&mut lease.connection, protocol::delete(&locked, maximum_rows), deadline)
            .await
            .map_err(|error| maintenance_failure(error.failure, phase, timeout))?;
        let removed: i64 = output
            .only_row(0)
            .and_then(|row| row.try_get("removed").ok())
            .ok_or(MaintenanceError::MalformedResponse { phase, reason: "expected one removed count" })?;
        let removed = u64::try_from(removed)
            .ok()
            .filter(|removed| *removed <= u64::from(maximum_rows))
            .ok_or(MaintenanceError::MalformedResponse {
                phase,
                reason: "removed count outside the requested bound",
            })?;

        // Round trip 3: commit.
        match script::run(&mut lease.connection, script::COMMIT.to_owned(), deadline).await {
            Ok(_) => {
                lease.clean = true;
                Ok(removed)
            }
            Err(error) => Err(maintenance_commit_failure(error.failure, timeout)),
        }
    }
}

impl<O: Observer> Limiter for PostgresGcraLimiter<O> {
    type Policy = GcraPolicy;
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
