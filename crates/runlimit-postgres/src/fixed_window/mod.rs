//! Anchored fixed windows on PostgreSQL: the fixed-window SQL protocol and its row parsing,
//! decided by `runlimit_core::backend::fixed_window` and the batch rule.
//!
//! # Time
//!
//! The rules work in whole milliseconds. The protocol samples `pg_catalog.clock_timestamp()`
//! in microseconds after its locks; the decision truncates the sample to the millisecond, and a
//! stored window end is rounded up to the next whole millisecond (windows anchored by this
//! release start at a whole millisecond, so only windows written by an earlier release, which
//! anchored at the microsecond, are rounded, and never end early). A new window is anchored at
//! the truncated sample, stored as its microsecond count.

mod calls;
pub(crate) mod migrations;
mod sql;

use runlimit_core::{
    Check, FixedWindowPolicy, QuotaMode, QuotaSnapshot,
    backend::{
        batch::Precedence,
        fixed_window::{self, FixedWindowOutcome, FixedWindowParameters, Window},
        is_expired,
    },
};
use sha2::{Digest, Sha256};
use sqlx::{PgConnection, PgPool, migrate::Migrator};
use tokio::time::Instant as Deadline;

use crate::{
    config::{PostgresConfig, Protocol},
    error::{CheckError, CheckPhase, MaintenanceError, MaintenancePhase},
    observe::Evaluated,
    prepared::{self, Statement},
    script::{self, ScriptOutput, clock_sample, column, malformed, per_check},
    store::sealed::{Algorithm, Internal, Learned},
    transaction::{self, Plan, check_failure},
};

/// Domain tag of the advisory-lock id derivation. See [`lock_id`].
pub(crate) const LOCK_ID_DOMAIN: &[u8] = b"runlimit/postgres/fixed-window-lock/v1";

/// The advisory-lock id of a 64-byte counter key: the first 8 bytes, read as a big-endian
/// signed integer, of `SHA-256(LOCK_ID_DOMAIN || counter_key)`.
///
/// Equal to the SQL expression
/// `('x' || encode(substr(sha256('runlimit/postgres/fixed-window-lock/v1'::bytea || counter_key), 1, 8), 'hex'))::bit(64)::bigint`.
pub(crate) fn lock_id(counter_key: &[u8; 64]) -> i64 {
    let digest = Sha256::new().chain_update(LOCK_ID_DOMAIN).chain_update(counter_key).finalize();
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    i64::from_be_bytes(first)
}

/// The advisory-lock ids of `keys`, ascending and distinct: the order every admission locks
/// them in.
fn lock_ids(keys: &[[u8; 64]]) -> Vec<i64> {
    let mut ids: Vec<i64> = keys.iter().map(lock_id).collect();
    ids.sort_unstable();
    ids.dedup();
    ids
}

/// The capacity shard of a counter key: byte 32, the first byte of the subject key. Must match
/// the generated column `capacity_shard` of the cardinality migration.
pub(crate) fn shard_of(counter_key: &[u8; 64]) -> u8 {
    counter_key[32]
}

/// One check, reduced to what the decision needs.
#[derive(Clone, Copy, Debug)]
struct Spec {
    parameters: FixedWindowParameters,
    /// The check's cost, between 1 and the limit.
    cost: u64,
    shard: u8,
}

/// A stored counter, as read by the preflight phase.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct StoredCounter {
    used: i64,
    /// Window end, microseconds since the Unix epoch (database clock).
    expires_us: i64,
}

/// What to write for one allowed check.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Write {
    /// In-window increment of a stored counter by the check's cost.
    Increment,
    /// Re-anchor an expired stored counter at the clock sample.
    Renew,
    /// Insert a new counter anchored at the clock sample.
    Insert,
}

/// The clock sample, truncated to whole milliseconds since the Unix epoch.
fn sample_millis(now_us: i64) -> Result<u64, &'static str> {
    u64::try_from(now_us.div_euclid(1_000)).map_err(|_| "negative database time")
}

/// A stored window end in whole milliseconds, rounded up (a window never ends early); a
/// window that ended before the Unix epoch ends at 0.
fn deadline_millis(expires_us: i64) -> u64 {
    u64::try_from(expires_us).map_or(0, |micros| micros.div_ceil(1_000))
}

/// Decides a batch from the stored counters (`stored[i]` for check `i`), the clock sample
/// `now_us` and, when some key has no row, the locked ledger row counts.
///
/// Every check is [`fixed_window::evaluate`] at the truncated sample (see the [module
/// docs](self#time)). A missing key whose shard already holds `maximum_rows_per_shard` rows
/// (counting new keys of earlier checks in this batch) is a storage-capacity denial without a
/// delay: expiry does not free a slot, only cleanup does. The batch rule
/// ([`Precedence`]) picks the deciding denial.
///
/// # Errors
///
/// A fixed description of a malformed response: a stored `used` below 1, a negative clock
/// sample, or a missing key whose shard has no ledger count.
fn decide(
    specs: &[Spec],
    stored: &[Option<StoredCounter>],
    now_us: i64,
    ledger: &[Option<i64>; 256],
    maximum_rows_per_shard: u32,
    mode: QuotaMode,
) -> Result<Plan<Write>, &'static str> {
    if specs.len() != stored.len() {
        return Err("counter rows do not match the checks");
    }
    let now = sample_millis(now_us)?;
    let mut reserved = [0i64; 256];
    let mut precedence = Precedence::new(mode);
    let mut allowances = Vec::with_capacity(specs.len());
    let mut writes = Vec::with_capacity(specs.len());
    for (index, (spec, counter)) in specs.iter().zip(stored).enumerate() {
        let window = match counter {
            Some(counter) => {
                let used = u64::try_from(counter.used).map_err(|_| "stored used below 1")?;
                Some(
                    Window::new(deadline_millis(counter.expires_us), used)
                        .map_err(|_| "stored used below 1")?,
                )
            }
            None => None,
        };
        match fixed_window::evaluate(&spec.parameters, window, now, spec.cost) {
            FixedWindowOutcome::Exhausted(denial) => precedence.quota_exceeded(index, denial),
            FixedWindowOutcome::Allowed { allowance, anchored, .. } => {
                let write = match (counter, anchored) {
                    (Some(_), false) => Write::Increment,
                    (Some(_), true) => Write::Renew,
                    (None, _) => Write::Insert,
                };
                let shard = usize::from(spec.shard);
                let short = match write {
                    Write::Insert => {
                        let count = ledger[shard].ok_or("missing capacity ledger row")?;
                        count.saturating_add(reserved[shard]) >= i64::from(maximum_rows_per_shard)
                    }
                    Write::Increment | Write::Renew => false,
                };
                if short {
                    precedence.storage_capacity(index);
                } else {
                    reserved[shard] += i64::from(write == Write::Insert);
                    allowances.push(allowance);
                    writes.push(write);
                }
            }
        }
        // Under enforcement no later check can change the deciding denial: stop reading. (In
        // shadow mode every row is read, so a malformed one anywhere is reported.)
        if mode == QuotaMode::Enforce && precedence.is_settled() {
            break;
        }
    }
    if precedence.denial().is_none() && allowances.len() != specs.len() {
        return Err("allowances do not match the checks");
    }
    Ok(Plan::of(&precedence, allowances, writes))
}

/// The shards, ascending and distinct, of the checks whose key has no stored counter: the
/// ledger rows the reserve phase locks.
fn missing_shards(specs: &[Spec], stored: &[Option<StoredCounter>]) -> Vec<i16> {
    let mut shards: Vec<i16> = specs
        .iter()
        .zip(stored)
        .filter(|(_, counter)| counter.is_none())
        .map(|(spec, _)| i16::from(spec.shard))
        .collect();
    shards.sort_unstable();
    shards.dedup();
    shards
}

/// Parses the reserve rows (statement 0 of `output`) into the ledger counts of `requested`.
fn parse_reserve(output: &ScriptOutput, requested: &[i16]) -> Result<[Option<i64>; 256], CheckError> {
    let phase = CheckPhase::Reserve;
    let bad = malformed(phase);
    let mut ledger = [None; 256];
    let mut shards = Vec::with_capacity(requested.len());
    for row in output.rows_of(0) {
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

/// Begin, lock, preflight and (when a key has no row) reserve, then the decision. Returns the
/// plan and the clock sample it was decided at, truncated to the millisecond, in microseconds.
async fn evaluate(
    connection: &mut PgConnection,
    deadline: Deadline,
    config: &PostgresConfig,
    keys: &[[u8; 64]],
    specs: &[Spec],
    mode: QuotaMode,
) -> Result<(Plan<Write>, i64), CheckError> {
    let timeout = config.operation_timeout();

    // One round trip: BEGIN, the settings and locks, the preflight with its clock sample.
    let statements = [
        Statement { sql: script::begin().to_owned(), phase: CheckPhase::Begin, executes: None },
        Statement {
            sql: sql::lock(config.server_timeout_millis(), &lock_ids(keys)),
            phase: CheckPhase::Lock,
            executes: None,
        },
        Statement { sql: sql::preflight(keys), phase: CheckPhase::Preflight, executes: None },
    ];
    let lock_statement = 1;
    let output = prepared::run_phases(connection, &statements, deadline, &[], timeout).await?;
    if output.only_row(lock_statement).is_none() {
        return Err(CheckError::MalformedResponse {
            phase: CheckPhase::Lock,
            reason: "expected one lock row",
        });
    }
    let preflight = lock_statement + 1;
    let stored = per_check(&output, preflight, keys.len(), CheckPhase::Preflight, |row| {
        Ok(StoredCounter {
            used: column(row, "used", CheckPhase::Preflight)?,
            expires_us: column(row, "expires_us", CheckPhase::Preflight)?,
        })
    })?;
    let mut now_us = clock_sample(&output, preflight, "now_us", CheckPhase::Preflight)?;

    let missing_shards = missing_shards(specs, &stored);
    let mut ledger = [None; 256];
    let mut phase = CheckPhase::Preflight;
    if !missing_shards.is_empty() {
        phase = CheckPhase::Reserve;
        let output = script::run(connection, sql::reserve(&missing_shards), deadline)
            .await
            .map_err(|error| check_failure(error, &[CheckPhase::Reserve], timeout))?;
        ledger = parse_reserve(&output, &missing_shards)?;
        now_us = clock_sample(&output, 0, "now_us", phase)?;
    }
    let plan = decide(specs, &stored, now_us, &ledger, config.maximum_rows_per_shard(), mode)
        .map_err(malformed(phase))?;
    Ok((plan, now_us.div_euclid(1_000) * 1_000))
}

/// Pairs the per-key `used` and `expires_us` arrays of the reserve call.
fn stored_counters(
    used: Vec<Option<i64>>,
    expires_us: Vec<Option<i64>>,
) -> Result<Vec<Option<StoredCounter>>, CheckError> {
    used.into_iter()
        .zip(expires_us)
        .map(|pair| match pair {
            (Some(used), Some(expires_us)) => Ok(Some(StoredCounter { used, expires_us })),
            (None, None) => Ok(None),
            _ => Err(malformed(CheckPhase::Reserve)("a counter without its window end")),
        })
        .collect()
}

/// [`evaluate`] through the prepared statements and admission functions (see [`calls`]):
/// begin, lock and preflight in one round trip, the reserve call in a second when the
/// preflight did not return every key, then the decision.
async fn evaluate_calls(
    connection: &mut PgConnection,
    deadline: Deadline,
    config: &PostgresConfig,
    keys: &[[u8; 64]],
    specs: &[Spec],
    mode: QuotaMode,
) -> Result<(Plan<Write>, i64), CheckError> {
    let timeout = config.operation_timeout();
    let costs: Vec<u64> = specs.iter().map(|spec| spec.cost).collect();

    let (lock_sql, lock_prepared) =
        calls::lock(config.server_timeout_millis(), &lock_ids(keys), keys.len() > 1);
    let (preflight_sql, preflight_statement) = calls::preflight(keys, &costs);
    let statements = [
        Statement { sql: script::begin().to_owned(), phase: CheckPhase::Begin, executes: None },
        Statement { sql: lock_sql, phase: CheckPhase::Lock, executes: Some(lock_prepared) },
        Statement { sql: preflight_sql, phase: CheckPhase::Preflight, executes: Some(preflight_statement) },
    ];
    let (lock_statement, preflight) = (1, 2);
    let output = prepared::run_phases(connection, &statements, deadline, &[], timeout).await?;
    if output.only_row(lock_statement).is_none() {
        return Err(CheckError::MalformedResponse {
            phase: CheckPhase::Lock,
            reason: "expected one lock row",
        });
    }
    let mut stored = per_check(&output, preflight, keys.len(), CheckPhase::Preflight, |row| {
        Ok(StoredCounter {
            used: column(row, "used", CheckPhase::Preflight)?,
            expires_us: column(row, "expires_us", CheckPhase::Preflight)?,
        })
    })?;
    // The sample of the row updated last was taken after every row lock.
    let mut now_us = match output.rows_of(preflight).last() {
        Some(row) => Some(column::<i64>(row, "now_us", CheckPhase::Preflight)?),
        None => None,
    };

    let unreturned: Vec<usize> = (0..keys.len()).filter(|index| stored[*index].is_none()).collect();
    let mut ledger = [None; 256];
    let mut phase = CheckPhase::Preflight;
    if !unreturned.is_empty() {
        phase = CheckPhase::Reserve;
        let unreturned_keys: Vec<[u8; 64]> = unreturned.iter().map(|index| keys[*index]).collect();
        let unreturned_costs: Vec<u64> = unreturned.iter().map(|index| costs[*index]).collect();
        let shards = missing_shards(specs, &stored);
        let output =
            script::run(connection, calls::reserve(&unreturned_keys, &unreturned_costs, &shards), deadline)
                .await
                .map_err(|error| check_failure(error, &[CheckPhase::Reserve], timeout))?;
        let row = output
            .only_row(0)
            .ok_or(CheckError::MalformedResponse { phase, reason: "expected one reserve row" })?;
        let found = stored_counters(
            script::per_check_array(row, "used", unreturned.len(), phase)?,
            script::per_check_array(row, "expires_us", unreturned.len(), phase)?,
        )?;
        for (index, counter) in unreturned.iter().zip(found) {
            stored[*index] = counter;
        }
        let counts: Vec<Option<i32>> = script::per_check_array(row, "row_counts", shards.len(), phase)?;
        for (shard, count) in shards.iter().zip(counts) {
            let Some(count) = count else { continue };
            let count = u32::try_from(count).map_err(|_| malformed(phase)("negative ledger row count"))?;
            // `shard` came from a `u8`, so it indexes the ledger.
            ledger[usize::from(shard.unsigned_abs())] = Some(i64::from(count));
        }
        now_us = Some(column(row, "now_us", phase)?);
    }
    let now_us = now_us.ok_or(CheckError::MalformedResponse { phase, reason: "missing clock sample" })?;
    let plan = decide(specs, &stored, now_us, &ledger, config.maximum_rows_per_shard(), mode)
        .map_err(malformed(phase))?;
    Ok((plan, now_us.div_euclid(1_000) * 1_000))
}

/// The write call of an allowed batch anchored at `anchor_us`: nothing when every write is an
/// in-window increment (the preflight made those), else one statement whatever the batch size,
/// for the re-anchored and the new counters.
fn render_call_writes(
    keys: &[[u8; 64]],
    specs: &[Spec],
    writes: &[Write],
    anchor_us: i64,
) -> (String, usize) {
    let mut written_keys = Vec::new();
    let mut rows = Vec::new();
    for ((key, spec), write) in keys.iter().zip(specs).zip(writes) {
        let renew = match write {
            Write::Increment => continue,
            Write::Renew => true,
            Write::Insert => false,
        };
        written_keys.push(*key);
        rows.push((renew, spec.cost, spec.parameters.window().as_millis()));
    }
    if rows.is_empty() { (String::new(), 0) } else { (calls::write(&written_keys, &rows, anchor_us), 1) }
}

/// The write statements of an allowed batch anchored at `anchor_us`: at most one `UPDATE` and
/// one `INSERT` whatever the batch size, each verifying its own row count.
fn render_writes(keys: &[[u8; 64]], specs: &[Spec], writes: &[Write], anchor_us: i64) -> (String, usize) {
    let window_ms = |spec: &Spec| spec.parameters.window().as_millis();
    let mut updates = Vec::new();
    let mut inserts = Vec::new();
    for ((key, spec), write) in keys.iter().zip(specs).zip(writes) {
        match write {
            Write::Increment => updates.push((key, false, spec.cost, window_ms(spec))),
            Write::Renew => updates.push((key, true, spec.cost, window_ms(spec))),
            Write::Insert => inserts.push((key, spec.cost, window_ms(spec))),
        }
    }
    let mut sql = String::new();
    if !updates.is_empty() {
        sql.push_str(&sql::update(&updates, anchor_us));
    }
    if !inserts.is_empty() {
        sql.push_str(&sql::insert(&inserts, anchor_us));
    }
    (sql, usize::from(!updates.is_empty()) + usize::from(!inserts.is_empty()))
}

/// The fixed-window protocol (see [`PostgresLimiter`](crate::PostgresLimiter)).
#[expect(private_interfaces, reason = "the sealed half of `PostgresAlgorithm`: only this crate calls it")]
impl Algorithm for FixedWindowPolicy {
    const NAME: &'static str = "PostgresLimiter";

    fn migrator(_: Internal) -> Migrator {
        crate::migrations::shared_history(&migrations::MIGRATOR)
    }

    async fn admit(
        _: Internal,
        _: &Learned,
        connection: &mut PgConnection,
        deadline: Deadline,
        config: &PostgresConfig,
        checks: &[Check<'_, Self>],
        mode: QuotaMode,
    ) -> (Result<Evaluated, CheckError>, bool) {
        let keys: Vec<[u8; 64]> = checks.iter().map(|check| check.counter_key().to_bytes()).collect();
        let specs: Vec<Spec> = checks
            .iter()
            .zip(&keys)
            .map(|(check, key)| Spec {
                parameters: FixedWindowParameters::of(check.policy()),
                cost: check.cost(),
                shard: shard_of(key),
            })
            .collect();
        let protocol = config.protocol();
        let evaluated = match protocol {
            Protocol::Prepared | Protocol::PreviousPrepared | Protocol::LedgerLockPrepared => {
                evaluate_calls(connection, deadline, config, &keys, &specs, mode).await
            }
            Protocol::Statements => evaluate(connection, deadline, config, &keys, &specs, mode).await,
        };
        let (plan, anchor_us) = match evaluated {
            Ok(evaluated) => evaluated,
            Err(error) => return (Err(error), false),
        };
        let ending = plan.ending(|writes| match protocol {
            Protocol::Prepared | Protocol::PreviousPrepared | Protocol::LedgerLockPrepared => {
                render_call_writes(&keys, &specs, writes, anchor_us)
            }
            Protocol::Statements => render_writes(&keys, &specs, writes, anchor_us),
        });
        transaction::end(connection, deadline, config.operation_timeout(), ending).await
    }

    /// `BEGIN READ ONLY`, the settings, the unlocked read of the counter with a clock
    /// sample, `ROLLBACK`: one round trip, decided by `fixed_window::peek` at the truncated
    /// sample, exactly as a check at that instant would read the row (a stored window end
    /// rounded up).
    async fn peek(
        _: Internal,
        _: &Learned,
        connection: &mut PgConnection,
        deadline: Deadline,
        config: &PostgresConfig,
        policy: &Self,
        key: &[u8; 64],
    ) -> (Result<QuotaSnapshot, CheckError>, bool) {
        let (output, read) = match transaction::peek(connection, deadline, config, &sql::peek(key)).await {
            Ok(output) => output,
            Err(error) => return (Err(error), false),
        };
        let phase = CheckPhase::Preflight;
        let bad = malformed(phase);
        let parsed = (|| {
            let row = output.only_row(read).ok_or_else(|| bad("expected one peek row"))?;
            let used: Option<i64> = column(row, "used", phase)?;
            let expires_us: Option<i64> = column(row, "expires_us", phase)?;
            let now = sample_millis(column(row, "now_us", phase)?).map_err(&bad)?;
            let window = match (used, expires_us) {
                (Some(used), Some(expires_us)) => Some(
                    u64::try_from(used)
                        .ok()
                        .and_then(|used| Window::new(deadline_millis(expires_us), used).ok())
                        .ok_or_else(|| bad("stored used below 1"))?,
                ),
                (None, None) => None,
                _ => return Err(bad("a counter row without its window")),
            };
            Ok(fixed_window::peek(&FixedWindowParameters::of(policy), window, now))
        })();
        (parsed, true)
    }

    /// The key's advisory lock (as an admission takes first), then the `DELETE` with a clock
    /// sample after it; the ledger trigger frees the slot. Live when the stored window end,
    /// rounded up to the millisecond, is after the truncated sample, as an admission would
    /// judge it.
    async fn reset(
        _: Internal,
        _: &Learned,
        connection: &mut PgConnection,
        deadline: Deadline,
        config: &PostgresConfig,
        key: &[u8; 64],
    ) -> Result<Option<u64>, MaintenanceError> {
        let timeout = config.operation_timeout();
        let mut sql = script::begin().to_owned();
        sql.push_str(&sql::lock(config.server_timeout_millis(), &[lock_id(key)]));
        sql.push_str(&sql::reset(key));
        let delete_statement = script::BEGIN_STATEMENTS + 1;
        let output =
            transaction::run_maintenance(connection, sql, deadline, delete_statement, timeout).await?;
        let bad = |reason| MaintenanceError::MalformedResponse { phase: MaintenancePhase::Delete, reason };
        let row = output.only_row(delete_statement).ok_or_else(|| bad("expected one reset row"))?;
        let expires_us: Option<i64> =
            sqlx::Row::try_get(row, "expires_us").map_err(|_| bad("undecodable column"))?;
        let now_us: i64 = sqlx::Row::try_get(row, "now_us").map_err(|_| bad("undecodable column"))?;
        let now = sample_millis(now_us).map_err(bad)?;
        Ok(expires_us.map(|expires_us| u64::from(!is_expired(deadline_millis(expires_us), now))))
    }

    /// One transaction, one `DELETE`: the clock is sampled once (so the expiry predicate is an
    /// index range condition and finding nothing expired costs one index probe), rows an
    /// admission currently holds are skipped, and the affected ledger rows are locked in
    /// ascending shard order.
    async fn cleanup(
        _: Internal,
        _: &Learned,
        pool: &PgPool,
        config: &PostgresConfig,
        maximum_rows: u32,
    ) -> Result<u64, MaintenanceError> {
        let timeout = config.operation_timeout();
        transaction::maintain(pool, config, async |connection, deadline| {
            let mut sql = script::begin().to_owned();
            sql.push_str(&script::settings(config.server_timeout_millis()));
            sql.push_str(&sql::cleanup(maximum_rows));
            let delete_statement = script::BEGIN_STATEMENTS + 1;
            let output =
                transaction::run_maintenance(connection, sql, deadline, delete_statement, timeout).await?;
            transaction::removed_rows(output.only_row(delete_statement), maximum_rows).map(Some)
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use runlimit_core::{
        Allowance, Capacity, Delay, Denial, PolicyId, QuotaDenial, ScopeId, backend::batch::Precedence,
    };

    use super::*;

    /// A whole millisecond, in microseconds since the Unix epoch.
    const NOW: i64 = 1_700_000_000_000_000;

    fn spec(limit: u64, window_ms: u64, shard: u8) -> Spec {
        let policy = FixedWindowPolicy::new(
            PolicyId::new("p").unwrap(),
            ScopeId::new("s").unwrap(),
            limit,
            Duration::from_millis(window_ms),
        )
        .unwrap();
        Spec { parameters: FixedWindowParameters::of(&policy), cost: 1, shard }
    }

    fn stored(used: i64, expires_in_us: i64) -> Option<StoredCounter> {
        Some(StoredCounter { used, expires_us: NOW + expires_in_us })
    }

    fn ledger(entries: &[(u8, i64)]) -> [Option<i64>; 256] {
        let mut ledger = [None; 256];
        for &(shard, count) in entries {
            ledger[usize::from(shard)] = Some(count);
        }
        ledger
    }

    fn allowance(limit: u64, available: u64, delay_ms: u64) -> Allowance {
        Allowance::new(Capacity::new(limit).unwrap(), available, Delay::from_millis(delay_ms)).unwrap()
    }

    /// The plan of a batch denied by the first `(index, reason)` reported.
    fn denied(mode: QuotaMode, index: usize, quota: Option<QuotaDenial>) -> Plan<Write> {
        let mut precedence = Precedence::new(mode);
        match quota {
            Some(quota) => precedence.quota_exceeded(index, quota),
            None => precedence.storage_capacity(index),
        }
        Plan::Rollback(precedence.denial().unwrap())
    }

    #[test]
    fn lock_id_is_stable() {
        // Pinned so the documented derivation (and the SQL expression) cannot drift silently.
        assert_eq!(lock_id(&[0u8; 64]), -6_214_308_709_475_546_244);
        assert_ne!(lock_id(&[0u8; 64]), lock_id(&[1u8; 64]));
        let mut key = [0u8; 64];
        key[32] = 7;
        assert_eq!(shard_of(&key), 7);
    }

    #[test]
    fn fresh_increment_renew_and_deny() {
        let specs = [spec(3, 60_000, 1), spec(3, 60_000, 2), spec(3, 60_000, 3)];
        let rows = [None, stored(1, 2_000), stored(3, 0)];
        let plan = decide(&specs, &rows, NOW, &ledger(&[(1, 0)]), 10, QuotaMode::Enforce).unwrap();
        assert_eq!(
            plan,
            Plan::Commit {
                allowances: vec![allowance(3, 2, 60_000), allowance(3, 1, 2), allowance(3, 2, 60_000)],
                writes: vec![Write::Insert, Write::Increment, Write::Renew],
            }
        );
    }

    #[test]
    fn times_are_whole_milliseconds_rounded_so_no_window_ends_early() {
        // A sample 999 µs into a millisecond is that millisecond; a window written at the
        // microsecond (before whole-millisecond anchoring) ending 2,001 µs after NOW ends at
        // NOW + 3 ms.
        let specs = [spec(3, 60_000, 1)];
        let plan =
            decide(&specs, &[stored(1, 2_001)], NOW + 999, &ledger(&[]), 10, QuotaMode::Enforce).unwrap();
        assert_eq!(
            plan,
            Plan::Commit { allowances: vec![allowance(3, 1, 3)], writes: vec![Write::Increment] }
        );
        assert_eq!(sample_millis(NOW + 999), Ok(1_700_000_000_000));
        assert_eq!(sample_millis(-1), Err("negative database time"));
        assert_eq!(deadline_millis(-5), 0);
        // Exactly at the rounded-up end the window is over.
        let plan =
            decide(&specs, &[stored(3, 2_001)], NOW + 3_000, &ledger(&[]), 10, QuotaMode::Enforce).unwrap();
        assert_eq!(
            plan,
            Plan::Commit { allowances: vec![allowance(3, 2, 60_000)], writes: vec![Write::Renew] }
        );
    }

    #[test]
    fn quota_denial_reports_remaining_window() {
        let specs = [spec(2, 60_000, 1), spec(2, 60_000, 2)];
        let rows = [stored(1, 10_000), stored(2, 1_234_000)];
        let quota = QuotaDenial::new(Capacity::new(2).unwrap(), Delay::from_millis(1_234));
        assert_eq!(
            decide(&specs, &rows, NOW, &ledger(&[]), 10, QuotaMode::Enforce).unwrap(),
            denied(QuotaMode::Enforce, 1, Some(quota))
        );
        // A counter above the limit (written by someone else) is exhausted, not malformed.
        assert!(matches!(
            decide(&specs[..1], &[stored(9, 5_000)], NOW, &ledger(&[]), 10, QuotaMode::Enforce).unwrap(),
            Plan::Rollback(denial) if denial.index() == 0 && !denial.is_storage_capacity()
        ));
    }

    #[test]
    fn shadow_denial_yields_to_a_later_capacity_denial() {
        let specs = [spec(1, 1_000, 1), spec(1, 1_000, 5)];
        let rows = [stored(1, 500_000), None];
        let quota = QuotaDenial::new(Capacity::new(1).unwrap(), Delay::from_millis(500));
        assert_eq!(
            decide(&specs, &rows, NOW, &ledger(&[(5, 3)]), 4, QuotaMode::Shadow).unwrap(),
            denied(QuotaMode::Shadow, 0, Some(quota))
        );
        let storage = decide(&specs, &rows, NOW, &ledger(&[(5, 4)]), 4, QuotaMode::Shadow).unwrap();
        assert_eq!(storage, denied(QuotaMode::Shadow, 1, None));
        let Plan::Rollback(denial) = storage else { unreachable!() };
        assert_eq!(
            denial.into_check_decision(None),
            runlimit_core::Decision::denied(Denial::StorageCapacity { retry_after: None })
        );
        assert_eq!(
            decide(&specs, &rows, NOW, &ledger(&[(5, 4)]), 4, QuotaMode::Enforce).unwrap(),
            denied(QuotaMode::Enforce, 0, Some(quota))
        );
    }

    #[test]
    fn capacity_counts_new_keys_of_the_same_batch() {
        let specs = [spec(5, 1_000, 9), spec(5, 1_000, 9), spec(5, 1_000, 9)];
        let rows = [None, stored(1, 100_000), None];
        // Shard 9 holds 2 of 3: the first new key fits, the second does not.
        assert_eq!(
            decide(&specs, &rows, NOW, &ledger(&[(9, 2)]), 3, QuotaMode::Enforce).unwrap(),
            denied(QuotaMode::Enforce, 2, None)
        );
        // An existing key in a full shard keeps working.
        assert!(matches!(
            decide(&specs[1..2], &rows[1..2], NOW, &ledger(&[(9, 3)]), 3, QuotaMode::Enforce).unwrap(),
            Plan::Commit { .. }
        ));
    }

    #[test]
    fn malformed_responses() {
        let specs = [spec(5, 1_000, 9)];
        assert_eq!(
            decide(&specs, &[stored(0, 5_000)], NOW, &ledger(&[]), 3, QuotaMode::Enforce),
            Err("stored used below 1")
        );
        assert_eq!(
            decide(&specs, &[stored(-1, 5_000)], NOW, &ledger(&[]), 3, QuotaMode::Enforce),
            Err("stored used below 1")
        );
        assert_eq!(
            decide(&specs, &[None], NOW, &ledger(&[]), 3, QuotaMode::Enforce),
            Err("missing capacity ledger row")
        );
        assert_eq!(
            decide(&specs, &[], NOW, &ledger(&[]), 3, QuotaMode::Enforce),
            Err("counter rows do not match the checks")
        );
    }
}
