//! PostgreSQL integration tests for `PostgresGcraLimiter`, one binary.
//!
//! Every test needs `RUNLIMIT_POSTGRES_TEST_DATABASE_URL` and runs in its own fresh database
//! (the harness of the fixed-window suite, `postgres/support.rs`). Run them with
//!
//! ```text
//! RUNLIMIT_POSTGRES_TEST_DATABASE_URL=postgres://postgres@127.0.0.1:5432/test \
//!     cargo test -p runlimit-postgres --all-features --test postgres gcra:: -- --include-ignored
//! ```

use crate::support;

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::Duration,
};

use runlimit_core::{
    BatchDecision, BatchDecisionView, Check, ConsumptionStatus, Decision, DecisionView, Denial, GcraPolicy,
    Limiter, Observation, Observer, PolicyId, QuotaMode, ScopeId,
};
use runlimit_memory::{GcraStore, ManualClock, MemoryStoreConfig};
use runlimit_postgres::{
    CREATE_RUNLIMIT_GCRA_SQL, CheckError, CheckPhase, GCRA_MIGRATOR, PostgresConfig, PostgresGcraLimiter,
    PostgresLimiter,
};
use sqlx::{Connection, PgConnection, migrate::Migrator, postgres::PgPoolOptions};
use support::{Cut, Proxy, TestDatabase, subject, waiting_backend};

const IGNORE: &str = "needs RUNLIMIT_POSTGRES_TEST_DATABASE_URL";

fn gcra(id: &str, quota: u64, period_ms: u64, burst: u64) -> GcraPolicy {
    GcraPolicy::new(
        PolicyId::new(id).unwrap(),
        ScopeId::new("subject").unwrap(),
        quota,
        Duration::from_millis(period_ms),
        burst,
    )
    .unwrap()
}

fn check(policy: &GcraPolicy, subject: runlimit_core::SubjectKey) -> Check<'_, GcraPolicy> {
    Check::new(subject.bind(policy))
}

/// A migrated limiter on the ledger-lock protocol: the tests in this file pin that protocol's
/// statements and ledger (`tests/postgres/row_locks.rs` pins the row-lock protocol's).
async fn limiter(db: &TestDatabase, connections: u32) -> PostgresGcraLimiter {
    crate::support::ledger_lock_gcra_limiter(db.pool(connections).await).await
}

/// The database clock in whole milliseconds, as the limiter samples it.
async fn db_now(connection: &mut PgConnection) -> i64 {
    sqlx::query_scalar("SELECT floor(extract(epoch from clock_timestamp()) * 1000)::bigint")
        .fetch_one(connection)
        .await
        .unwrap()
}

async fn set_watermarks(connection: &mut PgConnection, watermark_ms: i64) {
    sqlx::query("UPDATE public.runlimit_gcra_shards SET watermark_ms = $1")
        .bind(watermark_ms)
        .execute(connection)
        .await
        .unwrap();
}

async fn stored_row(connection: &mut PgConnection, check: &Check<'_, GcraPolicy>) -> Option<(i64, i64, i64)> {
    sqlx::query_as(
        "SELECT tat_ms, tat_remainder, expires_at_ms FROM public.runlimit_gcra WHERE counter_key = $1",
    )
    .bind(check.counter_key().to_bytes().as_slice())
    .fetch_optional(connection)
    .await
    .unwrap()
}

async fn row_count(connection: &mut PgConnection) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM public.runlimit_gcra").fetch_one(connection).await.unwrap()
}

fn retry_ms(decision: &Decision) -> Option<u128> {
    match decision.view() {
        DecisionView::Denied { denial: Denial::QuotaExceeded(quota) } => {
            Some(quota.retry_after().duration().as_millis())
        }
        _ => None,
    }
}

/// A deterministic xorshift generator for the differential sequences.
struct Rng(u64);

impl Rng {
    fn next(&mut self, bound: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % bound
    }
}

/// Exact differential test: PostgreSQL time is pinned through the shard watermarks (the
/// limiter evaluates at `max(clock, watermark)`, and the watermark is far ahead of the clock),
/// so the manual clock of `GcraStore` and the database agree to the millisecond and every
/// decision must be identical, `retry_after` and allowances included.
#[tokio::test]
#[ignore = "needs RUNLIMIT_POSTGRES_TEST_DATABASE_URL"]
async fn differential_against_gcra_store_with_pinned_time() {
    let _ = IGNORE;
    let db = TestDatabase::create("gcra_differential_pinned").await;
    let limiter = limiter(&db, 2).await;
    let mut admin = db.connection().await;
    let clock = ManualClock::new();
    let store = GcraStore::builder(MemoryStoreConfig::new(10_000).unwrap()).with_clock(clock.clone()).build();
    let policies = [
        gcra("diff.v2", 3, 1_000, 2),
        gcra("diff.v1", 10, 1_000, 20),
        gcra("diff.minute", 1, 60_000, 1),
        gcra("diff.v5", 2, 1_000, 4),
    ];
    let shadow = policies[0].clone().with_quota_mode(QuotaMode::Shadow);
    // Subjects on shards 3, 3, 7, 200: same-shard keys share a ledger lock.
    let subjects = [subject(3, 1), subject(3, 2), subject(7, 1), subject(200, 9)];
    let base = db_now(&mut admin).await + 10 * 24 * 3_600_000;
    let mut offset = 0u64;
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let steps_ms = [0, 0, 0, 0, 1, 50, 99, 100, 333, 334, 500, 1_000, 2_500, 61_000];
    let (mut allowed, mut denied) = (0, 0);
    for step in 0..400 {
        offset += steps_ms[usize::try_from(rng.next(steps_ms.len() as u64)).unwrap()];
        clock.set(Duration::from_millis(offset));
        set_watermarks(&mut admin, base + i64::try_from(offset).unwrap()).await;
        let pick = |rng: &mut Rng| {
            (
                usize::try_from(rng.next(policies.len() as u64)).unwrap(),
                usize::try_from(rng.next(subjects.len() as u64)).unwrap(),
            )
        };
        match rng.next(5) {
            0 | 1 => {
                let (p, s) = pick(&mut rng);
                let check = check(&policies[p], subjects[s]);
                let memory = store.check(&check).unwrap();
                let postgres = limiter.check(&check).await.unwrap();
                assert_eq!(postgres, memory, "step {step} at {offset} ms");
                if memory.permits_request() { allowed += 1 } else { denied += 1 }
            }
            2 => {
                let s = usize::try_from(rng.next(subjects.len() as u64)).unwrap();
                let check = check(&shadow, subjects[s]);
                let memory = store.check(&check).unwrap();
                let postgres = limiter.check(&check).await.unwrap();
                assert_eq!(postgres, memory, "shadow step {step} at {offset} ms");
            }
            _ => {
                let mut pairs = Vec::new();
                for _ in 0..1 + rng.next(3) {
                    let pair = pick(&mut rng);
                    if !pairs.contains(&pair) {
                        pairs.push(pair);
                    }
                }
                let checks: Vec<_> = pairs.iter().map(|&(p, s)| check(&policies[p], subjects[s])).collect();
                let memory = store.check_all(&checks).unwrap();
                let postgres = limiter.check_all(&checks).await.unwrap();
                assert_eq!(postgres, memory, "batch step {step} at {offset} ms");
                if memory.permits_request() { allowed += 1 } else { denied += 1 }
            }
        }
    }
    assert!(allowed >= 50 && denied >= 25, "allowed {allowed}, denied {denied}");
    db.finish().await;
}

/// Differential test on the real database clock: the memory store is evaluated at the database
/// time measured just before the PostgreSQL check; decisions agree and `retry_after` differs
/// by at most the largest measured skew (the database time elapsed around a check) so far.
#[tokio::test]
#[ignore = "needs RUNLIMIT_POSTGRES_TEST_DATABASE_URL"]
async fn differential_against_gcra_store_on_the_database_clock() {
    let db = TestDatabase::create("gcra_differential_clock").await;
    let limiter = limiter(&db, 2).await;
    let mut admin = db.connection().await;
    let clock = ManualClock::new();
    let store = GcraStore::builder(MemoryStoreConfig::new(100).unwrap()).with_clock(clock.clone()).build();
    let policy = gcra("diff.clock", 1, 2_000, 2);
    let check = check(&policy, subject(9, 1));
    let origin = db_now(&mut admin).await;
    // allow, allow, deny, (wait out one unit) allow, deny
    let plan: [(u64, bool); 5] = [(0, true), (0, true), (0, false), (2_600, true), (0, false)];
    let mut worst_skew = 0;
    for (step, (sleep_ms, expect_allowed)) in plan.into_iter().enumerate() {
        tokio::time::sleep(Duration::from_millis(sleep_ms)).await;
        let before = db_now(&mut admin).await;
        clock.set(Duration::from_millis(u64::try_from(before - origin).unwrap()));
        let memory = store.check(&check).unwrap();
        let postgres = limiter.check(&check).await.unwrap();
        let skew = u128::try_from(db_now(&mut admin).await - before).unwrap();
        worst_skew = worst_skew.max(skew);
        assert_eq!(memory.permits_request(), expect_allowed, "memory step {step}");
        assert_eq!(postgres.permits_request(), expect_allowed, "postgres step {step}");
        if let (Some(memory), Some(postgres)) = (retry_ms(&memory), retry_ms(&postgres)) {
            // Both states were written at database times within the measured skews of their
            // steps, and this check's sample is within this step's skew.
            assert!(
                postgres.abs_diff(memory) <= worst_skew,
                "step {step}: {postgres} vs {memory} (skew {worst_skew})"
            );
        }
    }
    println!("worst measured skew: {worst_skew} ms");
    db.finish().await;
}

/// With the watermark ahead of the database clock (a backwards clock step), time stands still
/// at the watermark: nothing replenishes until the clock passes it.
#[tokio::test]
#[ignore = "needs RUNLIMIT_POSTGRES_TEST_DATABASE_URL"]
async fn a_watermark_ahead_of_the_clock_stops_replenishment() {
    let db = TestDatabase::create("gcra_watermark").await;
    let limiter = limiter(&db, 2).await;
    let mut admin = db.connection().await;
    let policy = gcra("watermark", 1, 1_000, 2);
    let check = check(&policy, subject(42, 1));
    let watermark = db_now(&mut admin).await + 2_500;
    sqlx::query("UPDATE public.runlimit_gcra_shards SET watermark_ms = $1 WHERE shard = 42")
        .bind(watermark)
        .execute(&mut admin)
        .await
        .unwrap();
    // Evaluated at the watermark, not at the clock: the stored arrival time is watermark + 2 s.
    assert!(limiter.check(&check).await.unwrap().permits_request());
    assert!(limiter.check(&check).await.unwrap().permits_request());
    assert_eq!(stored_row(&mut admin, &check).await, Some((watermark + 2_000, 0, watermark + 2_000)));
    for _ in 0..3 {
        let decision = limiter.check(&check).await.unwrap();
        assert_eq!(retry_ms(&decision), Some(1_000), "{decision:?}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    // A denial rolls its provisional update back: the row is as the second admission left it.
    assert_eq!(stored_row(&mut admin, &check).await, Some((watermark + 2_000, 0, watermark + 2_000)));
    // 1.5 s of clock time passed, still before the watermark: nothing replenished.
    assert!(db_now(&mut admin).await < watermark);
    assert_eq!(retry_ms(&limiter.check(&check).await.unwrap()), Some(1_000));
    // Once the clock passes watermark + 1 s, one unit is back.
    while db_now(&mut admin).await < watermark + 1_000 {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(limiter.check(&check).await.unwrap().permits_request());
    let shard_42 = "SELECT watermark_ms FROM public.runlimit_gcra_shards WHERE shard = 42";
    // An admission of a stored key leaves the watermark to cleanup and inserts (its own
    // `max(tat, now)` never replenishes early at an earlier reading).
    let unmoved: i64 = sqlx::query_scalar(shard_42).fetch_one(&mut admin).await.unwrap();
    assert_eq!(unmoved, watermark, "an update does not move it");
    // A new key's insert commits the clock it used.
    assert!(limiter.check(&Check::new(subject(42, 2).bind(&policy))).await.unwrap().permits_request());
    let advanced: i64 = sqlx::query_scalar(shard_42).fetch_one(&mut admin).await.unwrap();
    assert!(advanced >= watermark + 1_000, "watermark advanced to the clock: {advanced}");
    db.finish().await;
}

/// Four pools (four replicas) hammer overlapping keys with single checks and batches: the
/// units admitted per key never exceed burst + replenishment over the elapsed database time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs RUNLIMIT_POSTGRES_TEST_DATABASE_URL"]
async fn four_replicas_never_exceed_burst_plus_replenishment() {
    let db = TestDatabase::create("gcra_replicas").await;
    // Twelve tasks contend for the ledger rows of three shards with `fsync` on: on a loaded
    // machine a lock wait can outlast the default 2 s budget. A timeout is no deadlock and not
    // what this test is about (PostgreSQL's deadlock detector would fail the test), so allow 15 s.
    let patient = PostgresConfig::default().with_operation_timeout(Duration::from_secs(15)).unwrap();
    let first = limiter(&db, 4).await.with_config(patient);
    let mut admin = db.connection().await;
    let policy = Arc::new(gcra("replicas", 10, 1_000, 5));
    let subjects = [subject(1, 1), subject(1, 2), subject(2, 1), subject(250, 1)];
    let admitted = Arc::new(Mutex::new(HashMap::<usize, u64>::new()));
    let start = db_now(&mut admin).await;
    let mut tasks = Vec::new();
    for replica in 0..4u32 {
        let limiter = if replica == 0 {
            first.clone()
        } else {
            PostgresGcraLimiter::new(db.pool(4).await).with_config(patient)
        };
        for worker in 0..3u32 {
            let limiter = limiter.clone();
            let policy = Arc::clone(&policy);
            let admitted = Arc::clone(&admitted);
            tasks.push(tokio::spawn(async move {
                let deadline = tokio::time::Instant::now() + Duration::from_millis(2_500);
                let mut n = usize::try_from(replica * 3 + worker).unwrap();
                while tokio::time::Instant::now() < deadline {
                    let a = n % subjects.len();
                    let b = (n + 1 + n / subjects.len()) % subjects.len();
                    let indexes: Vec<usize> = if a == b || n % 3 == 0 { vec![a] } else { vec![a, b] };
                    let checks: Vec<_> = indexes.iter().map(|&i| check(&policy, subjects[i])).collect();
                    let decision = limiter.check_all(&checks).await.expect("no errors, no deadlocks");
                    if let BatchDecisionView::Allowed { allowances } = decision.view() {
                        assert_eq!(allowances.len(), indexes.len());
                        let mut admitted = admitted.lock().unwrap();
                        for index in &indexes {
                            *admitted.entry(*index).or_default() += 1;
                        }
                    }
                    n += 1;
                }
            }));
        }
    }
    for task in tasks {
        task.await.unwrap();
    }
    let elapsed = u64::try_from(db_now(&mut admin).await - start).unwrap();
    // burst 5 + 10 units per second of elapsed database time (rounded down) per key.
    let bound = 5 + elapsed * 10 / 1_000;
    let admitted = admitted.lock().unwrap().clone();
    for (index, count) in &admitted {
        assert!(*count <= bound, "key {index}: {count} admitted > bound {bound} over {elapsed} ms");
        assert!(*count >= 5, "key {index}: only {count} admitted");
    }
    assert_eq!(admitted.len(), subjects.len());
    println!("admitted {admitted:?}, bound {bound} over {elapsed} ms");
    db.finish().await;
}

/// The plan of the cleanup discovery statement probes the shard/expiry index and never scans
/// a table sequentially, on an empty table and on one with many rows.
#[tokio::test]
#[ignore = "needs RUNLIMIT_POSTGRES_TEST_DATABASE_URL"]
async fn cleanup_discovery_uses_index_scans_only() {
    let db = TestDatabase::create("gcra_explain").await;
    let _limiter = limiter(&db, 1).await;
    let mut admin = db.connection().await;
    let discover = include_str!("../../src/sql/gcra_discover.sql").trim_end().trim_end_matches(';');
    let settings = include_str!("../../src/sql/gcra_cleanup_settings.sql").replace("{timeout_ms}", "5000");
    for populated in [false, true] {
        if populated {
            sqlx::raw_sql(
                "INSERT INTO public.runlimit_gcra (counter_key, tat_ms, tat_remainder, expires_at_ms) \
                 SELECT decode(lpad(to_hex(i), 64, '0') || lpad(to_hex(i % 256), 2, '0') || repeat('ab', 31), 'hex'), \
                        2000000000000 + i, 0, 2000000000000 + i \
                 FROM generate_series(1, 20000) AS i; ANALYZE public.runlimit_gcra;",
            )
            .execute(&mut admin)
            .await
            .unwrap();
        }
        let mut tx = admin.begin().await.unwrap();
        sqlx::raw_sql(sqlx::AssertSqlSafe(settings.clone())).execute(&mut *tx).await.unwrap();
        let plan: Vec<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!("EXPLAIN {discover}")))
            .fetch_all(&mut *tx)
            .await
            .unwrap();
        tx.rollback().await.unwrap();
        let plan = plan.join("\n");
        println!("populated: {populated}\n{plan}");
        assert!(!plan.contains("Seq Scan"), "{plan}");
        assert!(
            plan.contains("Index Only Scan using runlimit_gcra_shard_expiry_idx")
                || plan.contains("Index Scan using runlimit_gcra_shard_expiry_idx"),
            "{plan}"
        );
        assert!(plan.contains("Index Cond: ((capacity_shard = l.shard) AND (expires_at_ms <="), "{plan}");
        assert!(plan.contains("Index Scan using runlimit_gcra_shards_pkey"), "{plan}");
    }
    db.finish().await;
}

async fn expire_rows(limiter: &PostgresGcraLimiter, policy: &GcraPolicy, keys: &[runlimit_core::SubjectKey]) {
    for key in keys {
        assert!(limiter.check(&check(policy, *key)).await.unwrap().permits_request());
    }
}

/// Cleanup deletes at most its bound, oldest first, never active rows, skips a busy shard, and
/// frees the slots.
#[tokio::test]
#[ignore = "needs RUNLIMIT_POSTGRES_TEST_DATABASE_URL"]
async fn cleanup_is_bounded_ordered_and_skips_busy_shards() {
    let db = TestDatabase::create("gcra_cleanup").await;
    let limiter = limiter(&db, 2).await;
    let mut admin = db.connection().await;
    let short = gcra("cleanup.short", 1, 50, 1);
    let long = gcra("cleanup.long", 1, 3_600_000, 1);
    assert_eq!(limiter.cleanup_expired(10).await.unwrap(), 0);
    expire_rows(&limiter, &short, &[subject(1, 1)]).await;
    tokio::time::sleep(Duration::from_millis(5)).await;
    expire_rows(&limiter, &short, &[subject(2, 1), subject(2, 2)]).await;
    tokio::time::sleep(Duration::from_millis(5)).await;
    expire_rows(&limiter, &short, &[subject(3, 1)]).await;
    expire_rows(&limiter, &long, &[subject(1, 9), subject(2, 9)]).await;
    tokio::time::sleep(Duration::from_millis(120)).await;
    assert_eq!(row_count(&mut admin).await, 6);
    assert_eq!(limiter.cleanup_expired(0).await.unwrap(), 0);

    // Shard 1 is busy: an admission-like holder of its ledger row.
    let mut holder = db.connection().await;
    let mut tx = holder.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM public.runlimit_gcra_shards WHERE shard = 1 FOR UPDATE")
        .execute(&mut *tx)
        .await
        .unwrap();
    // Oldest first across the unlocked shards: both shard-2 rows, not shard 3's.
    assert_eq!(limiter.cleanup_expired(2).await.unwrap(), 2);
    assert!(stored_row(&mut admin, &check(&short, subject(2, 1))).await.is_none());
    assert!(stored_row(&mut admin, &check(&short, subject(3, 1))).await.is_some());
    assert_eq!(limiter.cleanup_expired(10).await.unwrap(), 1);
    assert!(stored_row(&mut admin, &check(&short, subject(1, 1))).await.is_some(), "busy shard skipped");
    tx.rollback().await.unwrap();
    assert_eq!(limiter.cleanup_expired(10).await.unwrap(), 1);
    // Only the active rows remain; the ledger counts match.
    assert_eq!(row_count(&mut admin).await, 2);
    let ledger: i64 = sqlx::query_scalar("SELECT sum(row_count)::bigint FROM public.runlimit_gcra_shards")
        .fetch_one(&mut admin)
        .await
        .unwrap();
    assert_eq!(ledger, 2);
    assert_eq!(limiter.cleanup_expired(10).await.unwrap(), 0);
    db.finish().await;
}

/// A full shard denies new keys, existing keys (even expired ones) keep working, cleanup frees
/// the slot, and the database refuses a 65,537th row however it is written.
#[tokio::test]
#[ignore = "needs RUNLIMIT_POSTGRES_TEST_DATABASE_URL"]
async fn capacity_is_bounded_per_shard() {
    let db = TestDatabase::create("gcra_capacity").await;
    let limiter =
        limiter(&db, 2).await.with_config(PostgresConfig::default().with_maximum_rows_per_shard(2).unwrap());
    let mut admin = db.connection().await;
    let short = gcra("capacity.short", 1, 50, 1);
    let long = gcra("capacity.long", 1, 3_600_000, 2);
    assert!(limiter.check(&check(&short, subject(5, 1))).await.unwrap().permits_request());
    assert!(limiter.check(&check(&long, subject(5, 2))).await.unwrap().permits_request());
    let full = limiter.check(&check(&long, subject(5, 3))).await.unwrap();
    assert_eq!(full, Decision::denied(Denial::StorageCapacity { retry_after: None }));
    // Other shards and existing keys are unaffected.
    assert!(limiter.check(&check(&long, subject(6, 3))).await.unwrap().permits_request());
    assert!(limiter.check(&check(&long, subject(5, 2))).await.unwrap().permits_request());
    // A batch with a new key in the full shard consumes nothing.
    let batch = [check(&long, subject(6, 3)), check(&long, subject(5, 4))];
    let decision = limiter.check_all(&batch).await.unwrap();
    assert_eq!(decision, BatchDecision::denied(1, 2, Denial::StorageCapacity { retry_after: None }).unwrap());
    // The expired row is reused by its own key while it still occupies its slot.
    tokio::time::sleep(Duration::from_millis(80)).await;
    assert!(limiter.check(&check(&short, subject(5, 1))).await.unwrap().permits_request());
    tokio::time::sleep(Duration::from_millis(80)).await;
    assert!(!limiter.check(&check(&long, subject(5, 3))).await.unwrap().permits_request());
    assert_eq!(limiter.cleanup_expired(10).await.unwrap(), 1);
    assert!(limiter.check(&check(&long, subject(5, 3))).await.unwrap().permits_request());

    // The database-enforced ceiling: a raw INSERT past 65,536 rows in a shard fails with 23514.
    sqlx::query("UPDATE public.runlimit_gcra_shards SET row_count = 65536 WHERE shard = 9")
        .execute(&mut admin)
        .await
        .unwrap();
    let error = sqlx::query(
        "INSERT INTO public.runlimit_gcra (counter_key, tat_ms, tat_remainder, expires_at_ms) \
         VALUES (decode(repeat('00', 32) || '09' || repeat('00', 31), 'hex'), 1, 0, 1)",
    )
    .execute(&mut admin)
    .await
    .unwrap_err();
    assert_eq!(error.as_database_error().and_then(|e| e.code()).as_deref(), Some("23514"));
    assert_eq!(error.as_database_error().and_then(|e| e.constraint()), Some("runlimit_gcra_shards_capacity"));
    db.finish().await;
}

/// Shadow denials and enforced denials consume nothing; an allowed batch commits all members.
#[tokio::test]
#[ignore = "needs RUNLIMIT_POSTGRES_TEST_DATABASE_URL"]
async fn denials_consume_nothing_and_batches_are_atomic() {
    let db = TestDatabase::create("gcra_rules").await;
    let limiter = limiter(&db, 2).await;
    let mut admin = db.connection().await;
    let policy = gcra("rules", 1, 3_600_000, 1);
    let shadow = policy.clone().with_quota_mode(QuotaMode::Shadow);
    let a = check(&policy, subject(1, 1));
    let b = check(&policy, subject(1, 2));
    assert!(limiter.check(&a).await.unwrap().permits_request());
    let before = stored_row(&mut admin, &a).await;
    let denied = limiter.check(&a).await.unwrap();
    assert!(!denied.permits_request());
    let shadowed = limiter.check(&check(&shadow, subject(1, 1))).await.unwrap();
    assert!(matches!(shadowed.view(), DecisionView::ShadowDenied { .. }), "{shadowed:?}");
    assert_eq!(stored_row(&mut admin, &a).await, before);
    // The denied batch leaves b untouched; b alone is then allowed.
    let decision = Limiter::check_all(&limiter, &[b, a]).await.unwrap();
    assert!(matches!(decision.view(), BatchDecisionView::Denied { index: 1, .. }), "{decision:?}");
    assert_eq!(stored_row(&mut admin, &b).await, None);
    assert!(limiter.check(&b).await.unwrap().permits_request());
    db.finish().await;
}

/// A backend terminated while waiting for its shard lock fails before commit: nothing consumed.
/// A holder of the shard lock makes a check time out naming the lock phase.
#[tokio::test]
#[ignore = "needs RUNLIMIT_POSTGRES_TEST_DATABASE_URL"]
async fn a_terminated_backend_consumes_nothing() {
    let db = TestDatabase::create("gcra_terminated").await;
    let limiter = limiter(&db, 2).await;
    let mut admin = db.connection().await;
    let policy = gcra("faults", 1, 3_600_000, 3);
    let key = check(&policy, subject(17, 1));
    assert!(limiter.check(&key).await.unwrap().permits_request());
    let before = stored_row(&mut admin, &key).await;

    let mut holder = db.connection().await;
    let mut tx = holder.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM public.runlimit_gcra_shards WHERE shard = 17 FOR UPDATE")
        .execute(&mut *tx)
        .await
        .unwrap();
    let admin_pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()").fetch_one(&mut admin).await.unwrap();
    let pending = {
        let limiter = limiter.clone();
        let policy = policy.clone();
        tokio::spawn(async move { limiter.check(&check(&policy, subject(17, 1))).await })
    };
    let waiting = waiting_backend(&mut admin, &db.name, admin_pid).await;
    let terminated: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1)")
        .bind(waiting)
        .fetch_one(&mut admin)
        .await
        .unwrap();
    assert!(terminated);
    let error = pending.await.unwrap().unwrap_err();
    assert!(matches!(error, CheckError::Database { phase: CheckPhase::Lock, .. }), "{error:?}");
    assert_eq!(error.consumption(), ConsumptionStatus::NotConsumed);

    // With the lock still held, a short operation timeout names the lock phase.
    let impatient = limiter
        .clone()
        .with_config(PostgresConfig::default().with_operation_timeout(Duration::from_millis(300)).unwrap());
    let error = impatient.check(&key).await.unwrap_err();
    assert!(matches!(error, CheckError::Timeout { phase: CheckPhase::Lock, .. }), "{error:?}");
    tx.rollback().await.unwrap();
    assert_eq!(stored_row(&mut admin, &key).await, before, "nothing consumed");
    let decision = limiter.check(&key).await.unwrap();
    let DecisionView::Allowed { allowance } = decision.view() else { panic!("{decision:?}") };
    assert_eq!(allowance.available(), 1, "exactly one unit consumed before");
    db.finish().await;
}

/// A table lock on the ledger (an operator's `ALTER TABLE`, `VACUUM FULL` or `LOCK TABLE`, even
/// one only queued) ends a one-check admission's wait by the transaction's own `lock_timeout`:
/// the settings run in a statement that touches no table, before the lock statement needs the
/// table, so the server gives up the wait instead of queueing behind the operator until the
/// lock is released (a client that stopped waiting does not stop a waiting backend).
#[tokio::test]
#[ignore = "needs RUNLIMIT_POSTGRES_TEST_DATABASE_URL"]
async fn a_table_lock_on_the_ledger_ends_the_wait_on_the_server() {
    let db = TestDatabase::create("gcra_table_lock").await;
    let limiter = limiter(&db, 2)
        .await
        .with_config(PostgresConfig::default().with_operation_timeout(Duration::from_millis(500)).unwrap());
    let mut admin = db.connection().await;
    let policy = gcra("table.lock", 1, 3_600_000, 3);
    let key = check(&policy, subject(23, 1));
    assert!(limiter.check(&key).await.unwrap().permits_request(), "the connection's statements are prepared");
    let mut holder = db.connection().await;
    let holder_pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()").fetch_one(&mut holder).await.unwrap();
    let mut tx = holder.begin().await.unwrap();
    sqlx::query("LOCK TABLE public.runlimit_gcra_shards IN ACCESS EXCLUSIVE MODE")
        .execute(&mut *tx)
        .await
        .unwrap();
    let error = limiter.check(&key).await.unwrap_err();
    assert!(
        matches!(
            error,
            CheckError::Timeout { phase: CheckPhase::Lock, .. }
                | CheckError::Database { phase: CheckPhase::Lock, .. }
        ),
        "{error:?}"
    );
    assert_eq!(error.consumption(), ConsumptionStatus::NotConsumed);
    // The lock is still held: no backend of this database but the holder waits on a lock for
    // longer than the server's timeout takes to fire.
    let waiting = "SELECT count(*) FROM pg_catalog.pg_stat_activity \
                   WHERE datname = current_database() AND pid <> pg_backend_pid() AND pid <> $1 \
                   AND wait_event_type = 'Lock'";
    let mut still_waiting = -1;
    for _ in 0..100 {
        still_waiting =
            sqlx::query_scalar::<_, i64>(waiting).bind(holder_pid).fetch_one(&mut admin).await.unwrap();
        if still_waiting == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(still_waiting, 0, "a backend still queues behind the table lock");
    tx.rollback().await.unwrap();
    assert!(limiter.check(&key).await.unwrap().permits_request());
    db.finish().await;
}

/// `migrate()` on a fresh database, on one with only the first GCRA migration, and next to the
/// fixed-window stream in one shared `_sqlx_migrations` history, in either order.
#[tokio::test]
#[ignore = "needs RUNLIMIT_POSTGRES_TEST_DATABASE_URL"]
async fn migrations_upgrade_and_share_the_history() {
    let db = TestDatabase::create("gcra_migrations").await;
    let mut admin = db.connection().await;
    // Only the first migration, as a host that vendored it would have.
    let first = Migrator::with_migrations(GCRA_MIGRATOR.iter().take(1).cloned().collect());
    first.run(&mut admin).await.unwrap();
    let index = "SELECT count(*) FROM pg_indexes WHERE indexname = 'runlimit_gcra_shard_expiry_idx'";
    assert_eq!(sqlx::query_scalar::<_, i64>(index).fetch_one(&mut admin).await.unwrap(), 0);
    let gcra = PostgresGcraLimiter::new(db.pool(2).await);
    gcra.migrate().await.unwrap();
    assert_eq!(sqlx::query_scalar::<_, i64>(index).fetch_one(&mut admin).await.unwrap(), 1);
    let fixed = PostgresLimiter::new(db.pool(2).await);
    fixed.migrate().await.unwrap();
    gcra.migrate().await.unwrap();
    let versions: Vec<i64> = sqlx::query_scalar("SELECT version FROM _sqlx_migrations ORDER BY version")
        .fetch_all(&mut admin)
        .await
        .unwrap();
    assert_eq!(
        versions,
        [
            20_250_601_000_001,
            20_250_601_000_002,
            20_250_601_000_003,
            20_250_601_000_004,
            20_250_701_000_001,
            20_250_701_000_002,
            20_250_701_000_003
        ]
    );
    assert!(CREATE_RUNLIMIT_GCRA_SQL.contains("CREATE TABLE public.runlimit_gcra ("));
    // A database with GCRA tables before this migrator ran is not switched: replicas of earlier
    // releases may be running on it.
    let ledger_rows = "SELECT (SELECT count(*) FROM public.runlimit_gcra_shards), \
                       (SELECT count(*) FROM public.runlimit_gcra_ledger)";
    assert_eq!(sqlx::query_as::<_, (i64, i64)>(ledger_rows).fetch_one(&mut admin).await.unwrap(), (256, 0));
    let policy = gcra_policy_for_migrations();
    assert!(gcra.check(&check(&policy, subject(0, 0))).await.unwrap().permits_request());
    assert!(matches!(gcra.cleanup_expired(5).await, Ok(0)));
    admin.close().await.unwrap();
    db.finish().await;
}

fn gcra_policy_for_migrations() -> GcraPolicy {
    gcra("migrations", 1, 1_000, 1)
}

/// A lost `COMMIT` acknowledgement is an unknown outcome (here the server did commit: it was a
/// consumption, which is why it is never replayed); a lost `ROLLBACK` after a denial still
/// returns the denial.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs RUNLIMIT_POSTGRES_TEST_DATABASE_URL"]
async fn lost_commit_is_uncertain_and_lost_rollback_keeps_the_denial() {
    let db = TestDatabase::create("gcra_lost_commit").await;
    let _migrated = limiter(&db, 1).await;
    let proxy = Proxy::start(&db.options).await;
    let pool = db.pool_with(PgPoolOptions::new().max_connections(1), proxy.options(&db.options)).await;
    let limiter = PostgresGcraLimiter::new(pool);
    let mut admin = db.connection().await;
    let policy = gcra("faults.commit", 1, 3_600_000, 2);
    let key = check(&policy, subject(21, 1));
    assert!(limiter.check(&key).await.unwrap().permits_request());
    let before = stored_row(&mut admin, &key).await.unwrap();

    proxy.arm(Cut::AfterForwarding(b"COMMIT;"));
    let error = limiter.check(&key).await.unwrap_err();
    assert!(matches!(error, CheckError::CommitOutcomeUnknown { .. }), "{error:?}");
    assert_eq!(error.consumption(), ConsumptionStatus::MayHaveBeenConsumed);
    support::settled_server(&mut admin).await;
    let after = stored_row(&mut admin, &key).await.unwrap();
    assert_eq!(after.0, before.0 + 3_600_000, "the unacknowledged commit consumed one unit");

    // The pool replaced the cut connection. A new connection prepares its statements on its
    // first admission, behind a first round trip that fails and is rolled back; admit once
    // (a denial) before arming, so the cut hits the ROLLBACK that ends a denial.
    assert!(!limiter.check(&key).await.unwrap().permits_request());
    proxy.arm(Cut::BeforeForwarding(b"ROLLBACK"));
    let denied = limiter.check(&key).await.unwrap();
    assert!(matches!(denied.view(), DecisionView::Denied { denial: Denial::QuotaExceeded(_) }), "{denied:?}");
    assert_eq!(stored_row(&mut admin, &key).await.unwrap(), after);
    db.finish().await;
}

#[derive(Clone, Default)]
struct Recorder(Arc<Mutex<Vec<String>>>);

impl Observer for Recorder {
    fn observe(&self, observation: &Observation<'_>) {
        let entry = match observation {
            Observation::Admission(admission) => {
                format!("{:?}/{:?}", admission.outcome(), admission.consumption())
            }
            Observation::Cleanup(cleanup) => {
                format!("cleanup {:?} of {}", cleanup.outcome(), cleanup.maximum())
            }
            Observation::Reset(reset) => format!("reset {:?}", reset.outcome()),
        };
        self.0.lock().unwrap().push(entry);
    }
}

/// One observation per admission and cleanup, with outcome and consumption certainty.
#[tokio::test]
#[ignore = "needs RUNLIMIT_POSTGRES_TEST_DATABASE_URL"]
async fn observations_for_every_admission_and_cleanup() {
    let db = TestDatabase::create("gcra_observer").await;
    let recorder = Recorder::default();
    let limiter = limiter(&db, 2).await.with_observer(recorder.clone());
    let policy = gcra("observer", 1, 3_600_000, 1);
    let key = check(&policy, subject(30, 1));
    assert!(limiter.check(&key).await.unwrap().permits_request());
    assert!(!limiter.check(&key).await.unwrap().permits_request());
    assert!(limiter.check_all(&[key, key]).await.is_err());
    assert_eq!(limiter.cleanup_expired(7).await.unwrap(), 0);
    assert_eq!(
        *recorder.0.lock().unwrap(),
        [
            "Allowed/Consumed",
            "QuotaExceeded/NotConsumed",
            "InvalidBatch/NotConsumed",
            "cleanup Removed { count: 0 } of 7",
        ]
    );
    db.finish().await;
}
