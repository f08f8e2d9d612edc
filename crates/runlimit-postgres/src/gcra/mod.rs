//! GCRA on PostgreSQL: the GCRA v1 SQL protocol and its row parsing, decided by
//! `runlimit_core::backend::gcra` and the batch rule.
//!
//! # Time
//!
//! Whole milliseconds since the Unix epoch: `floor(extract(epoch from clock_timestamp()) *
//! 1000)` (exact, since PostgreSQL 14 returns `numeric`), sampled after the shard locks and
//! clamped to the committed watermarks of the locked shards.

mod calls;
pub(crate) mod migrations;
mod one;
mod rowlock;
mod sql;

pub(crate) use calls::Ledger;

use runlimit_core::{
    Check, GcraPolicy, QuotaMode, QuotaSnapshot,
    backend::{
        batch::Precedence,
        gcra::{self, GcraError, GcraOutcome, GcraParameters, TheoreticalArrivalTime},
        is_expired,
    },
};
use sqlx::{PgConnection, PgPool, Row, migrate::Migrator};
use tokio::time::Instant as Deadline;

use crate::{
    config::{PostgresConfig, Protocol},
    error::{CheckError, CheckPhase, MaintenanceError, MaintenancePhase},
    migrations::FreshInstall,
    observe::Evaluated,
    prepared::{self, Statement},
    script::{self, ScriptOutput, clock_sample, column, malformed, per_check},
    store::sealed::{Algorithm, FreshInstallHook, Internal, Learned},
    transaction::{self, Plan, maintenance_failure},
};

/// One check, reduced to what the decision needs.
#[derive(Clone, Copy, Debug)]
struct GcraSpec {
    parameters: GcraParameters,
    /// The check's cost, between 1 and the burst capacity.
    cost: u64,
    shard: u8,
}

/// A stored arrival time as its exact `bigint` parts: `tat = tat_ms × Q + tat_remainder`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct StoredTat {
    pub(crate) tat_ms: i64,
    pub(crate) tat_remainder: i64,
}

/// A locked ledger row: the shard's row count and committed time watermark.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct LedgerRow {
    row_count: i64,
    watermark_ms: i64,
}

/// The row an allowed check writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct GcraWrite {
    /// Whether the key has no row yet (insert) or has one, live or expired (update).
    pub(crate) insert: bool,
    pub(crate) tat: StoredTat,
    /// ⌈tat / Q⌉: the first millisecond at which the row may be deleted.
    pub(crate) expires_at_ms: i64,
}

/// The evaluation time: the clock sample clamped to the latest committed watermark of the
/// locked shards, so a backwards clock step never replenishes quota early.
///
/// # Errors
///
/// A fixed description when the sample or a watermark is negative.
fn effective_now(clock_ms: i64, watermarks: impl IntoIterator<Item = i64>) -> Result<u64, &'static str> {
    let now = watermarks.into_iter().fold(clock_ms, i64::max);
    u64::try_from(clock_ms).ok().and(u64::try_from(now).ok()).ok_or("negative database time")
}

/// The arrival time in the columns `ms` and `remainder` of `row`: `None` when both are null (no
/// row), a malformed response of `phase` when only one is.
fn stored_pair(
    row: &sqlx::postgres::PgRow,
    ms: &str,
    remainder: &str,
    phase: CheckPhase,
) -> Result<Option<StoredTat>, CheckError> {
    let parts: (Option<i64>, Option<i64>) = (column(row, ms, phase)?, column(row, remainder, phase)?);
    match parts {
        (Some(tat_ms), Some(tat_remainder)) => Ok(Some(StoredTat { tat_ms, tat_remainder })),
        (None, None) => Ok(None),
        _ => Err(malformed(phase)("half an arrival time")),
    }
}

fn stored_tat(stored: StoredTat, parameters: &GcraParameters) -> Option<TheoreticalArrivalTime> {
    let millis = u64::try_from(stored.tat_ms).ok()?;
    let remainder = u64::try_from(stored.tat_remainder).ok()?;
    TheoreticalArrivalTime::from_parts(millis, remainder, parameters)
}

fn to_write(
    insert: bool,
    tat: TheoreticalArrivalTime,
    parameters: &GcraParameters,
) -> Result<GcraWrite, &'static str> {
    const OUT_OF_RANGE: &str = "arrival time does not fit bigint";
    let (millis, remainder) = tat.to_parts(parameters).ok_or(OUT_OF_RANGE)?;
    Ok(GcraWrite {
        insert,
        tat: StoredTat {
            tat_ms: i64::try_from(millis).map_err(|_| OUT_OF_RANGE)?,
            tat_remainder: i64::try_from(remainder).map_err(|_| OUT_OF_RANGE)?,
        },
        expires_at_ms: i64::try_from(tat.expires_at_millis(parameters)).map_err(|_| OUT_OF_RANGE)?,
    })
}

/// Decides a batch at `now_ms` (already clamped by [`effective_now`]) from the stored
/// arrival times (`stored[i]` for check `i`, `None` when the key has no row) and the locked
/// ledger rows of every shard the batch touches.
///
/// Each check is evaluated at its own cost by [`gcra::evaluate`], the evaluator
/// `runlimit_memory::GcraStore` uses; an expired row is equivalent to no state and is reused
/// by its key. A key without a row whose shard already holds `maximum_rows_per_shard` rows
/// (counting new keys of earlier checks in this batch) is a storage-capacity denial without a
/// delay: expiry does not free a slot, only cleanup does. The batch rule ([`Precedence`])
/// picks the deciding denial. Every row is read, so a malformed row anywhere in the batch is
/// reported.
///
/// # Errors
///
/// A fixed description of a malformed response: a stored arrival time outside every range the
/// evaluator produces, a touched shard without a ledger row, or mismatched lengths.
fn decide(
    specs: &[GcraSpec],
    stored: &[Option<StoredTat>],
    now_ms: u64,
    ledger: &[Option<LedgerRow>; 256],
    maximum_rows_per_shard: u32,
    mode: QuotaMode,
) -> Result<Plan<GcraWrite>, &'static str> {
    if specs.len() != stored.len() {
        return Err("stored rows do not match the checks");
    }
    let mut reserved = [0i64; 256];
    let mut precedence = Precedence::new(mode);
    let mut allowances = Vec::with_capacity(specs.len());
    let mut writes = Vec::with_capacity(specs.len());
    for (index, (spec, row)) in specs.iter().zip(stored).enumerate() {
        let parameters = &spec.parameters;
        let shard = usize::from(spec.shard);
        let ledger_row = ledger[shard].ok_or("missing capacity ledger row")?;
        let tat = match row {
            Some(row) => Some(stored_tat(*row, parameters).ok_or("stored arrival time out of range")?),
            None => None,
        };
        let outcome = gcra::evaluate(parameters, tat, now_ms, spec.cost).map_err(|error| match error {
            GcraError::StateOutOfRange => "stored arrival time out of range",
            _ => "cost out of range",
        })?;
        match outcome {
            GcraOutcome::Allowed { tat: next, .. } => {
                if row.is_none() {
                    if ledger_row.row_count.saturating_add(reserved[shard])
                        >= i64::from(maximum_rows_per_shard)
                    {
                        precedence.storage_capacity(index);
                        continue;
                    }
                    reserved[shard] += 1;
                }
                allowances.push(outcome.allowance(parameters).ok_or("allowance exceeds capacity")?);
                writes.push(to_write(row.is_none(), next, parameters)?);
            }
            GcraOutcome::Denied { .. } => {
                precedence
                    .quota_exceeded(index, outcome.quota_denial(parameters).ok_or("missing quota denial")?);
            }
        }
    }
    if precedence.denial().is_none() && allowances.len() != specs.len() {
        return Err("allowances do not match the checks");
    }
    Ok(Plan::of(&precedence, allowances, writes))
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
    for row in output.rows_of(statement) {
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
    if seen.is_empty() && !shards.is_empty() {
        return Err(bad(LEDGER_GONE));
    }
    if seen != shards {
        return Err(bad("ledger rows do not match the requested shards"));
    }
    Ok(ledger)
}

/// The reason of the malformed response a ledger-lock statement gets once the protocol was
/// switched to row locks: the ledger rows it locks are gone. Replicas that know both protocols
/// learn the switch from it (see [`learn_switch`]); earlier releases fail closed on it.
pub(crate) const LEDGER_GONE: &str =
    "the capacity ledger has no rows: the protocol was switched to row locks";

/// Whether `result` failed on [`LEDGER_GONE`].
fn is_ledger_gone<T>(result: &Result<T, CheckError>) -> bool {
    matches!(result, Err(CheckError::MalformedResponse { reason: LEDGER_GONE, .. }))
}

/// After a ledger-lock statement found no ledger rows: rolls the transaction back and asks
/// whether the row-lock ledger holds all 256 rows, in one round trip. `true` when the protocol
/// was switched, and `learned` records it; `false` on any failure (the caller then reports the
/// original failure and closes the connection).
async fn learn_switch(connection: &mut PgConnection, deadline: Deadline, learned: &Learned) -> bool {
    let sql = format!(
        "{}SELECT pg_catalog.count(*)::bigint AS ledger_rows FROM {};",
        script::ROLLBACK,
        calls::LEDGER_TABLE
    );
    let switched = match script::run(connection, sql, deadline).await {
        Ok(output) => output
            .only_row(1)
            .and_then(|row| row.try_get::<i64, _>("ledger_rows").ok())
            .is_some_and(|rows| rows == 256),
        Err(_) => false,
    };
    if switched {
        learned.set_row_locks();
    }
    switched
}

/// Begin, lock and read in one round trip, then the decision. Returns the plan and the clamped
/// time it was decided at.
async fn evaluate(
    connection: &mut PgConnection,
    deadline: Deadline,
    config: &PostgresConfig,
    keys: &[[u8; 64]],
    specs: &[GcraSpec],
    shards: &[i16],
    mode: QuotaMode,
) -> Result<Decided, CheckError> {
    let statements = [
        Statement { sql: script::begin().to_owned(), phase: CheckPhase::Begin, executes: None },
        Statement {
            sql: script::settings(config.server_timeout_millis()),
            phase: CheckPhase::Begin,
            executes: None,
        },
        Statement { sql: sql::lock(shards), phase: CheckPhase::Lock, executes: None },
        Statement { sql: sql::read(keys), phase: CheckPhase::Preflight, executes: None },
    ];
    let lock_statement = 2;
    let output =
        prepared::run_phases(connection, &statements, deadline, &[], config.operation_timeout()).await?;
    decide_answer(&output, lock_statement, shards, specs, config, mode)
}

/// Decides from the first round trip's answer: the ledger rows of `shards` (statement
/// `lock_statement`), then the arrival times and the clock sample (the statement after it),
/// both protocols' shapes alike. Returns the plan, the clamped time it was decided at and the
/// stored arrival times it was decided from.
fn decide_answer(
    output: &ScriptOutput,
    lock_statement: usize,
    shards: &[i16],
    specs: &[GcraSpec],
    config: &PostgresConfig,
    mode: QuotaMode,
) -> Result<Decided, CheckError> {
    let ledger = parse_ledger(output, lock_statement, shards)?;
    let read = lock_statement + 1;
    let phase = CheckPhase::Preflight;
    let stored = per_check(output, read, specs.len(), phase, |row| {
        Ok(StoredTat {
            tat_ms: column(row, "tat_ms", phase)?,
            tat_remainder: column(row, "tat_remainder", phase)?,
        })
    })?;
    let clock_ms = clock_sample(output, read, "now_ms", phase)?;
    let bad = malformed(phase);
    let now_ms =
        effective_now(clock_ms, ledger.iter().flatten().map(|row| row.watermark_ms)).map_err(&bad)?;
    let plan = decide(specs, &stored, now_ms, &ledger, config.maximum_rows_per_shard(), mode).map_err(bad)?;
    Ok((plan, now_ms, stored))
}

/// A batch's plan, the clamped time it was decided at and the stored arrival times it was
/// decided from (`None` for a key without a row).
type Decided = (Plan<GcraWrite>, u64, Vec<Option<StoredTat>>);

/// [`evaluate`] through the statements prepared on each connection (see [`calls`]): begin,
/// the settings, the ledger locks and the read in one round trip, then the decision.
async fn evaluate_calls(
    set: &'static calls::Admission,
    connection: &mut PgConnection,
    deadline: Deadline,
    config: &PostgresConfig,
    admission: &Admission<'_>,
) -> Result<Decided, CheckError> {
    let Admission { keys, specs, shards, mode } = *admission;
    let batch = keys.len() > 1;
    let [begin, settings, lock] = calls::opening(set, config.server_timeout_millis(), shards, batch);
    let (read_sql, read_prepared) = calls::read(set, keys);
    let read = Statement { sql: read_sql, phase: CheckPhase::Preflight, executes: Some(read_prepared) };
    let statements = [begin, settings, lock, read];
    let lock_statement = 2;
    let later = calls::writes(set, batch || set.compare_and_set);
    let output =
        prepared::run_phases(connection, &statements, deadline, &later, config.operation_timeout()).await?;
    decide_answer(&output, lock_statement, shards, specs, config, mode)
}

/// Runs `public.runlimit_gcra_switch_to_row_locks()` in a transaction of its own (see
/// [`PostgresGcraLimiter::switch_to_row_locks`](crate::PostgresGcraLimiter::switch_to_row_locks)):
/// whether this call switched.
pub(crate) async fn switch_to_row_locks(
    pool: &PgPool,
    config: &PostgresConfig,
) -> Result<bool, MaintenanceError> {
    let timeout = config.operation_timeout();
    let switched = transaction::maintain(pool, config, async |connection, deadline| {
        let mut sql = script::begin().to_owned();
        sql.push_str(&script::settings(config.server_timeout_millis()));
        sql.push_str("SELECT public.runlimit_gcra_switch_to_row_locks() AS switched;");
        let switch_statement = script::BEGIN_STATEMENTS + 1;
        let output =
            transaction::run_maintenance(connection, sql, deadline, switch_statement, timeout).await?;
        let switched: bool = output
            .only_row(switch_statement)
            .and_then(|row| row.try_get("switched").ok())
            .ok_or(MaintenanceError::MalformedResponse {
            phase: MaintenancePhase::Delete,
            reason: "expected one switch row",
        })?;
        Ok(Some(u64::from(switched)))
    })
    .await?;
    Ok(switched == 1)
}

/// A validated batch, reduced to what an admission needs.
struct Admission<'a> {
    keys: &'a [[u8; 64]],
    specs: &'a [GcraSpec],
    /// The shards of the keys, ascending, distinct.
    shards: &'a [i16],
    mode: QuotaMode,
}

impl Admission<'_> {
    /// Admits the batch on `ledger`'s protocol. Returns the result and whether the connection
    /// is clean.
    async fn run(
        &self,
        ledger: Ledger,
        connection: &mut PgConnection,
        deadline: Deadline,
        config: &PostgresConfig,
    ) -> (Result<Evaluated, CheckError>, bool) {
        let Self { keys, specs, shards, mode } = *self;
        let protocol = config.protocol();
        // On row locks, a one-check admission that could not decide without locks (its key's
        // row went away under it, or the insert of its new key was refused) is decided as a
        // batch of one on locking reads.
        let mut locking_only = false;
        if let (Protocol::Prepared | Protocol::LedgerLockPrepared, [key], [spec]) = (protocol, keys, specs)
            && let Some(increment) = one::Increment::of(&spec.parameters, spec.cost)
        {
            match ledger {
                Ledger::Shards => {
                    return one::admit(connection, deadline, config, key, *spec, increment, mode).await;
                }
                Ledger::RowLocks => {
                    match rowlock::admit(connection, deadline, config, key, *spec, increment, mode).await {
                        Some(done) => return done,
                        None => locking_only = true,
                    }
                }
            }
        }
        if protocol == Protocol::Statements {
            let (plan, now_ms, _) =
                match evaluate(connection, deadline, config, keys, specs, shards, mode).await {
                    Ok(evaluated) => evaluated,
                    Err(error) => return (Err(error), false),
                };
            let ending = plan.ending(|writes| (sql::write(keys, writes, shards, now_ms), 1));
            return transaction::end(connection, deadline, config.operation_timeout(), ending).await;
        }
        // On row locks, a batch reads its rows without locking them and writes them only if a
        // one-check admission did not change one meanwhile; when one did, the write is refused
        // before `COMMIT`, the transaction rolled back and the batch decided again, this time
        // locking the rows as it reads them, so it cannot be refused again.
        if ledger == Ledger::RowLocks && !locking_only {
            let (result, clean) =
                self.decide_and_end(calls::admission(ledger, false), connection, deadline, config).await;
            if !rowlock::is_refused(&result) {
                return (result, clean);
            }
            if script::run(connection, script::ROLLBACK.to_owned(), deadline).await.is_err() {
                return (result, false);
            }
        }
        let set = calls::admission(ledger, ledger == Ledger::RowLocks);
        self.decide_and_end(set, connection, deadline, config).await
    }

    /// One transaction through the statements of `set`: the decision, then its ending. Returns
    /// the result and whether the connection is clean.
    async fn decide_and_end(
        &self,
        set: &'static calls::Admission,
        connection: &mut PgConnection,
        deadline: Deadline,
        config: &PostgresConfig,
    ) -> (Result<Evaluated, CheckError>, bool) {
        let (plan, now_ms, stored) = match evaluate_calls(set, connection, deadline, config, self).await {
            Ok(evaluated) => evaluated,
            Err(error) => return (Err(error), false),
        };
        let ending =
            plan.ending(|writes| (calls::write(set, self.keys, writes, &stored, self.shards, now_ms), 1));
        transaction::end(connection, deadline, config.operation_timeout(), ending).await
    }
}

/// Whether `config` stands for a replica that knows the row-lock protocol (the hidden
/// earlier-release modes stand for replicas that know only the ledger-lock one, and never learn
/// the switch).
fn learns(config: &PostgresConfig) -> bool {
    config.protocol() == Protocol::Prepared
}

/// The ledger a replica of `config` starts an operation on: the row-lock one once it learned the
/// switch.
fn known_ledger(learned: &Learned, config: &PostgresConfig) -> Ledger {
    if learns(config) && learned.row_locks() { Ledger::RowLocks } else { Ledger::Shards }
}

/// The GCRA protocols (see [`PostgresGcraLimiter`](crate::PostgresGcraLimiter)).
#[expect(private_interfaces, reason = "the sealed half of `PostgresAlgorithm`: only this crate calls it")]
impl Algorithm for GcraPolicy {
    const NAME: &'static str = "PostgresGcraLimiter";

    fn migrator(_: Internal) -> Migrator {
        crate::migrations::shared_history(&migrations::GCRA_MIGRATOR)
    }

    /// A database without the GCRA tables has no replica on the ledger-lock protocol: it is
    /// switched to row locks right after its first migration.
    fn fresh_install(_: Internal) -> Option<FreshInstallHook> {
        let install = FreshInstall {
            probe: "SELECT pg_catalog.to_regclass('public.runlimit_gcra_shards') IS NULL",
            then: "SELECT public.runlimit_gcra_switch_to_row_locks()",
        };
        Some((install, Learned::set_row_locks))
    }

    async fn admit(
        _: Internal,
        learned: &Learned,
        connection: &mut PgConnection,
        deadline: Deadline,
        config: &PostgresConfig,
        checks: &[Check<'_, Self>],
        mode: QuotaMode,
    ) -> (Result<Evaluated, CheckError>, bool) {
        let keys: Vec<[u8; 64]> = checks.iter().map(|check| check.counter_key().to_bytes()).collect();
        let specs: Vec<GcraSpec> = checks
            .iter()
            .zip(&keys)
            .map(|(check, key)| GcraSpec {
                parameters: *GcraParameters::of(check.policy()),
                cost: check.cost(),
                shard: key[32],
            })
            .collect();
        let mut shards: Vec<i16> = specs.iter().map(|spec| i16::from(spec.shard)).collect();
        shards.sort_unstable();
        shards.dedup();
        let admission = Admission { keys: &keys, specs: &specs, shards: &shards, mode };
        let ledger = known_ledger(learned, config);
        let (result, clean) = admission.run(ledger, connection, deadline, config).await;
        if ledger == Ledger::Shards
            && learns(config)
            && is_ledger_gone(&result)
            && learn_switch(connection, deadline, learned).await
        {
            return admission.run(Ledger::RowLocks, connection, deadline, config).await;
        }
        (result, clean)
    }

    /// `BEGIN READ ONLY`, the settings, the unlocked read of the arrival time and of the
    /// shard's watermark with a clock sample, `ROLLBACK`: one round trip, decided by
    /// `gcra::peek` at the sample clamped to the watermark, as a check would be.
    async fn peek(
        _: Internal,
        learned: &Learned,
        connection: &mut PgConnection,
        deadline: Deadline,
        config: &PostgresConfig,
        policy: &Self,
        key: &[u8; 64],
    ) -> (Result<QuotaSnapshot, CheckError>, bool) {
        let ledger = known_ledger(learned, config);
        let (result, clean) = peek_on(ledger, connection, deadline, config, policy, key).await;
        if ledger == Ledger::Shards
            && learns(config)
            && is_ledger_gone(&result)
            && learn_switch(connection, deadline, learned).await
        {
            return peek_on(Ledger::RowLocks, connection, deadline, config, policy, key).await;
        }
        (result, clean)
    }

    /// The shard's ledger row lock (as an admission of a new key takes), then the `DELETE` with
    /// a clock sample after it; the ledger trigger frees the slot. Live when the row's expiry is
    /// after the sample clamped to the shard's watermark, as an admission would judge it.
    async fn reset(
        _: Internal,
        learned: &Learned,
        connection: &mut PgConnection,
        deadline: Deadline,
        config: &PostgresConfig,
        key: &[u8; 64],
    ) -> Result<Option<u64>, MaintenanceError> {
        let ledger = known_ledger(learned, config);
        match reset_on(ledger, connection, deadline, config, key).await {
            Err(MaintenanceError::MalformedResponse { reason: LEDGER_GONE, .. })
                if ledger == Ledger::Shards
                    && learns(config)
                    && learn_switch(connection, deadline, learned).await =>
            {
                reset_on(Ledger::RowLocks, connection, deadline, config, key).await
            }
            result => result,
        }
    }

    /// One transaction of three round trips. Discovery probes the `(capacity_shard,
    /// expires_at_ms)` index once per shard (at most 256 index probes), each under that shard's
    /// clamped clock `max(clock, watermark)`, and locks the ledger rows of the shards with an
    /// expired row in ascending shard order, skipping shards an admission or another cleanup
    /// holds (`SKIP LOCKED`). Deletion then reads at most `maximum_rows` eligible rows per
    /// locked shard (index range scans; active rows lie outside them), deletes the globally
    /// oldest `maximum_rows` of those and advances the locked shards' watermarks to the time it
    /// used, so a later backwards clock step cannot treat a deleted key as rested early. The
    /// transaction sets `enable_seqscan = off` locally so this bounded index plan is chosen
    /// whatever the table statistics. Phases: [`MaintenancePhase::Begin`] covers begin,
    /// settings and discovery, [`MaintenancePhase::Delete`] the deletion.
    async fn cleanup(
        _: Internal,
        learned: &Learned,
        pool: &PgPool,
        config: &PostgresConfig,
        maximum_rows: u32,
    ) -> Result<u64, MaintenanceError> {
        let ledger = known_ledger(learned, config);
        match cleanup_on(ledger, learns(config).then_some(learned), pool, config, maximum_rows).await {
            Err(MaintenanceError::MalformedResponse { reason: LEDGER_GONE, .. })
                if ledger == Ledger::Shards && learned.row_locks() =>
            {
                cleanup_on(Ledger::RowLocks, None, pool, config, maximum_rows).await
            }
            result => result,
        }
    }
}

/// [`Algorithm::peek`] on `ledger`.
async fn peek_on(
    ledger: Ledger,
    connection: &mut PgConnection,
    deadline: Deadline,
    config: &PostgresConfig,
    policy: &GcraPolicy,
    key: &[u8; 64],
) -> (Result<QuotaSnapshot, CheckError>, bool) {
    let read = ledger.on(&sql::peek(key, i16::from(key[32])));
    let (output, read) = match transaction::peek(connection, deadline, config, &read).await {
        Ok(output) => output,
        Err(error) => return (Err(error), false),
    };
    let phase = CheckPhase::Preflight;
    let bad = malformed(phase);
    let parameters = GcraParameters::of(policy);
    let parsed = (|| {
        let row = output.only_row(read).ok_or_else(|| bad("expected one peek row"))?;
        let stored = stored_pair(row, "tat_ms", "tat_remainder", phase)?;
        let watermark_ms: Option<i64> = column(row, "watermark_ms", phase)?;
        let clock_ms: i64 = column(row, "now_ms", phase)?;
        let watermark_ms = watermark_ms.ok_or_else(|| bad(LEDGER_GONE))?;
        let now_ms = effective_now(clock_ms, [watermark_ms]).map_err(&bad)?;
        let tat = match stored {
            Some(stored) => {
                Some(stored_tat(stored, parameters).ok_or_else(|| bad("stored arrival time out of range"))?)
            }
            None => None,
        };
        gcra::peek(parameters, tat, now_ms).map_err(|_| bad("stored arrival time out of range"))
    })();
    (parsed, true)
}

/// [`Algorithm::reset`] on `ledger`.
async fn reset_on(
    ledger: Ledger,
    connection: &mut PgConnection,
    deadline: Deadline,
    config: &PostgresConfig,
    key: &[u8; 64],
) -> Result<Option<u64>, MaintenanceError> {
    let timeout = config.operation_timeout();
    let shard = i16::from(key[32]);
    let mut sql = script::begin().to_owned();
    sql.push_str(&script::settings(config.server_timeout_millis()));
    sql.push_str(&ledger.on(&sql::lock(&[shard])));
    sql.push_str(&sql::reset(key));
    let lock_statement = script::BEGIN_STATEMENTS + 1;
    let delete_statement = lock_statement + 1;
    let output = transaction::run_maintenance(connection, sql, deadline, delete_statement, timeout).await?;
    let bad = |reason| MaintenanceError::MalformedResponse { phase: MaintenancePhase::Delete, reason };
    let get = |row: &sqlx::postgres::PgRow, name: &str| -> Result<Option<i64>, MaintenanceError> {
        row.try_get(name).map_err(|_| bad("undecodable column"))
    };
    if output.rows_of(lock_statement).next().is_none() {
        // The ledger row is gone (the `DELETE` ran regardless): the protocol was switched. The
        // transaction is left open and rolled back by the caller (or the session's end).
        return Err(MaintenanceError::MalformedResponse {
            phase: MaintenancePhase::Begin,
            reason: LEDGER_GONE,
        });
    }
    let ledger_row = output.only_row(lock_statement).ok_or_else(|| bad("expected one ledger row"))?;
    let watermark_ms = get(ledger_row, "watermark_ms")?.ok_or_else(|| bad("missing watermark"))?;
    let row = output.only_row(delete_statement).ok_or_else(|| bad("expected one reset row"))?;
    let expires_at_ms = get(row, "expires_at_ms")?;
    let clock_ms = get(row, "now_ms")?.ok_or_else(|| bad("missing clock sample"))?;
    let now_ms = effective_now(clock_ms, [watermark_ms]).map_err(bad)?;
    Ok(expires_at_ms.map(|expires| u64::from(!is_expired(u64::try_from(expires).unwrap_or(0), now_ms))))
}

/// [`Algorithm::cleanup`] on `ledger`. On the ledger-lock protocol of a replica that can learn
/// the switch (`learned`), discovery also counts the ledger's rows: none means the protocol was
/// switched, which `learned` then records (a [`LEDGER_GONE`] failure the caller retries on the
/// row-lock ledger).
async fn cleanup_on(
    ledger: Ledger,
    learned: Option<&Learned>,
    pool: &PgPool,
    config: &PostgresConfig,
    maximum_rows: u32,
) -> Result<u64, MaintenanceError> {
    let timeout = config.operation_timeout();
    transaction::maintain(pool, config, async |connection, deadline| {
        // Round trip 1: begin, settings, discovery with the shard locks.
        let mut sql = script::begin().to_owned();
        sql.push_str(&sql::cleanup_settings(config.server_timeout_millis()));
        sql.push_str(&ledger.on(sql::discover()));
        let discover_statement = script::BEGIN_STATEMENTS + 1;
        // A replica that can learn the switch also counts the ledger's rows (one that cannot,
        // as a release before the row-lock protocol, finds nothing to clean after the switch).
        let counts_ledger = ledger == Ledger::Shards && learned.is_some();
        if counts_ledger {
            sql.push_str(&format!(
                "SELECT pg_catalog.count(*)::bigint AS ledger_rows FROM {};",
                calls::SHARDS_TABLE
            ));
        }
        let output = script::run(&mut *connection, sql, deadline)
            .await
            .map_err(|error| maintenance_failure(error.failure, MaintenancePhase::Begin, timeout))?;
        let begin_malformed =
            |reason| MaintenanceError::MalformedResponse { phase: MaintenancePhase::Begin, reason };
        if counts_ledger {
            let rows: i64 = output
                .only_row(discover_statement + 1)
                .and_then(|row| row.try_get("ledger_rows").ok())
                .ok_or_else(|| begin_malformed("undecodable column"))?;
            if rows == 0
                && let Some(learned) = learned
            {
                // The protocol was switched: learn it (the caller retries on the row-lock ledger).
                learn_switch(connection, deadline, learned).await;
                return Err(begin_malformed(LEDGER_GONE));
            }
        }
        let mut locked = Vec::new();
        for row in output.rows_of(discover_statement) {
            let shard: i16 = row.try_get("shard").map_err(|_| begin_malformed("undecodable column"))?;
            let now_ms: i64 = row.try_get("now_ms").map_err(|_| begin_malformed("undecodable column"))?;
            locked.push((shard, now_ms));
        }
        if locked.is_empty() {
            // Nothing expired in an idle shard: end the read-only transaction.
            return Ok(None);
        }
        // Round trip 2: the bounded deletion; the commit is the third.
        let phase = MaintenancePhase::Delete;
        let output = script::run(connection, ledger.on(&sql::delete(&locked, maximum_rows)), deadline)
            .await
            .map_err(|error| maintenance_failure(error.failure, phase, timeout))?;
        transaction::removed_rows(output.only_row(0), maximum_rows).map(Some)
    })
    .await
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use runlimit_core::{Allowance, Capacity, Delay, QuotaPeriod};

    use super::*;
    use runlimit_core::{QuotaDenial, backend::batch::Precedence};

    /// The plan of a batch denied by `(index, reason)`: a quota denial, or storage (`None`).
    fn rollback(mode: QuotaMode, index: usize, quota: Option<QuotaDenial>) -> Plan<GcraWrite> {
        let mut precedence = Precedence::new(mode);
        match quota {
            Some(quota) => precedence.quota_exceeded(index, quota),
            None => precedence.storage_capacity(index),
        }
        Plan::Rollback(precedence.denial().unwrap())
    }

    fn spec(q: u64, p_ms: u64, b: u64, shard: u8) -> GcraSpec {
        let parameters = GcraParameters::new(
            Capacity::new(q).unwrap(),
            QuotaPeriod::new(Duration::from_millis(p_ms)).unwrap(),
            Capacity::new(b).unwrap(),
        )
        .unwrap();
        GcraSpec { parameters, cost: 1, shard }
    }

    fn ledger(entries: &[(u8, i64)]) -> [Option<LedgerRow>; 256] {
        let mut ledger = [None; 256];
        for &(shard, row_count) in entries {
            ledger[usize::from(shard)] = Some(LedgerRow { row_count, watermark_ms: 0 });
        }
        ledger
    }

    fn allowance(b: u64, available: u64, ms: u64) -> Allowance {
        Allowance::new(Capacity::new(b).unwrap(), available, Delay::from_millis(ms)).unwrap()
    }

    #[test]
    fn clamps_to_the_latest_watermark() {
        assert_eq!(effective_now(1_000, [400, 1_500, 900]), Ok(1_500));
        assert_eq!(effective_now(1_000, [400]), Ok(1_000));
        assert_eq!(effective_now(-1, [5]), Err("negative database time"));
    }

    #[test]
    fn vector_v2_through_stored_parts() {
        // Q=3 per 1000 ms, burst 2: two allowed at t=0, then tat = 2000 scaled = (666, 2).
        let specs = [spec(3, 1_000, 2, 4)];
        let rows = ledger(&[(4, 0)]);
        let first = decide(&specs, &[None], 0, &rows, 10, QuotaMode::Enforce).unwrap();
        let write =
            GcraWrite { insert: true, tat: StoredTat { tat_ms: 333, tat_remainder: 1 }, expires_at_ms: 334 };
        assert_eq!(first, Plan::Commit { allowances: vec![allowance(2, 1, 334)], writes: vec![write] });
        let second = decide(&specs, &[Some(write.tat)], 0, &rows, 10, QuotaMode::Enforce).unwrap();
        let tat = StoredTat { tat_ms: 666, tat_remainder: 2 };
        assert_eq!(
            second,
            Plan::Commit {
                allowances: vec![allowance(2, 0, 667)],
                writes: vec![GcraWrite { insert: false, tat, expires_at_ms: 667 }],
            }
        );
        let denied = decide(&specs, &[Some(tat)], 333, &rows, 10, QuotaMode::Enforce).unwrap();
        assert_eq!(
            denied,
            rollback(
                QuotaMode::Enforce,
                0,
                Some(QuotaDenial::new(Capacity::new(2).unwrap(), Delay::from_millis(1)))
            )
        );
        // An expired row is reused by its key: updated, not inserted.
        let rested = decide(&specs, &[Some(tat)], 5_000, &rows, 1, QuotaMode::Enforce).unwrap();
        let Plan::Commit { writes, .. } = rested else { panic!("{rested:?}") };
        assert!(!writes[0].insert);
    }

    #[test]
    fn shadow_and_capacity() {
        let specs = [spec(1, 1_000, 1, 1), spec(1, 1_000, 1, 5)];
        let exhausted = Some(StoredTat { tat_ms: 1_500, tat_remainder: 0 });
        let quota = QuotaDenial::new(Capacity::new(1).unwrap(), Delay::from_millis(500));
        let room = ledger(&[(1, 1), (5, 3)]);
        let full = ledger(&[(1, 1), (5, 4)]);
        assert_eq!(
            decide(&specs, &[exhausted, None], 1_000, &room, 4, QuotaMode::Shadow).unwrap(),
            rollback(QuotaMode::Shadow, 0, Some(quota))
        );
        assert_eq!(
            decide(&specs, &[exhausted, None], 1_000, &full, 4, QuotaMode::Shadow).unwrap(),
            rollback(QuotaMode::Shadow, 1, None)
        );
        assert_eq!(
            decide(&specs, &[exhausted, None], 1_000, &full, 4, QuotaMode::Enforce).unwrap(),
            rollback(QuotaMode::Enforce, 0, Some(quota))
        );
        // New keys of one batch count against the same shard.
        let same = [spec(1, 1_000, 1, 9), spec(2, 1_000, 1, 9)];
        assert_eq!(
            decide(&same, &[None, None], 0, &ledger(&[(9, 2)]), 3, QuotaMode::Enforce).unwrap(),
            rollback(QuotaMode::Enforce, 1, None)
        );
    }

    #[test]
    fn malformed_responses() {
        let specs = [spec(3, 1_000, 2, 4)];
        let bad = Some(StoredTat { tat_ms: 1, tat_remainder: 3 });
        assert_eq!(
            decide(&specs, &[bad], 0, &ledger(&[(4, 0)]), 3, QuotaMode::Enforce),
            Err("stored arrival time out of range")
        );
        let negative = Some(StoredTat { tat_ms: -1, tat_remainder: 0 });
        assert_eq!(
            decide(&specs, &[negative], 0, &ledger(&[(4, 0)]), 3, QuotaMode::Enforce),
            Err("stored arrival time out of range")
        );
        assert_eq!(
            decide(&specs, &[None], 0, &ledger(&[]), 3, QuotaMode::Enforce),
            Err("missing capacity ledger row")
        );
        assert_eq!(
            decide(&specs, &[], 0, &ledger(&[]), 3, QuotaMode::Enforce),
            Err("stored rows do not match the checks")
        );
    }
}
