//! The GCRA row-lock protocol against the real server: the switch moves the capacity ledger
//! exactly and once, replicas that know only the ledger-lock protocol fail closed after it,
//! replicas that know both learn it, and one-check admissions without a shard lock still admit
//! exactly the burst of a key hammered by many replicas at once and exactly the capacity of a
//! shard filled by new keys at once.

use std::{sync::Arc, time::Duration};

use runlimit_core::{BatchDecisionView, Check, ConsumptionStatus, DecisionView, Denial, GcraPolicy};
use runlimit_memory::{GcraStore, ManualClock, MemoryStoreConfig};
use runlimit_postgres::{CheckError, MaintenanceError, PostgresGcraLimiter};
use sqlx::{Connection, PgConnection};

use crate::support::*;

/// A GCRA policy `id` in scope `subject`.
fn gcra(id: &str, quota: u64, period_ms: u64, burst: u64) -> GcraPolicy {
    runlimit_conformance::support::gcra_in(id, "subject", quota, period_ms, burst)
}

fn check(policy: &GcraPolicy, subject: runlimit_core::SubjectKey) -> Check<'_, GcraPolicy> {
    Check::new(subject.bind(policy))
}

/// `(rows, sum of row counts, max watermark)` of a ledger table.
async fn ledger(connection: &mut PgConnection, table: &str) -> (i64, i64, Option<i64>) {
    let sql = format!("SELECT count(*), COALESCE(sum(row_count), 0)::bigint, max(watermark_ms) FROM {table}");
    sqlx::query_as(sqlx::AssertSqlSafe(sql)).fetch_one(connection).await.unwrap()
}

async fn stored(connection: &mut PgConnection, check: &Check<'_, GcraPolicy>) -> Option<(i64, i64)> {
    sqlx::query_as("SELECT tat_ms, tat_remainder FROM public.runlimit_gcra WHERE counter_key = $1")
        .bind(check.counter_key().to_bytes().as_slice())
        .fetch_optional(connection)
        .await
        .unwrap()
}

/// Four replicas with `config`, each with a pool of `connections`, on a fresh database the first
/// one's `migrate` switched to row locks.
async fn replicas(
    db: &TestDatabase,
    connections: u32,
    config: runlimit_postgres::PostgresConfig,
) -> Vec<PostgresGcraLimiter> {
    let mut replicas = vec![gcra_limiter_on(db.pool(connections).await, true).await.with_config(config)];
    for _ in 0..3 {
        replicas.push(PostgresGcraLimiter::new(db.pool(connections).await).with_config(config));
    }
    replicas
}

/// Closes every replica's pool.
async fn close(replicas: &[PostgresGcraLimiter]) {
    for replica in replicas {
        replica.pool().close().await;
    }
}

async fn db_now(connection: &mut PgConnection) -> i64 {
    sqlx::query_scalar("SELECT floor(extract(epoch from clock_timestamp()) * 1000)::bigint")
        .fetch_one(connection)
        .await
        .unwrap()
}

/// The switch moves the 256 ledger rows, their counts and watermarks (each at least the
/// switch's clock), in one transaction, and reports it; a second switch changes nothing and
/// says so. A database `migrate` installs the tables on is switched by it.
#[tokio::test]
#[ignore = "needs RUNLIMIT_POSTGRES_TEST_DATABASE_URL"]
async fn the_switch_moves_the_ledger_once() {
    let db = TestDatabase::create("row_locks_switch").await;
    let limiter = ledger_lock_gcra_limiter(db.pool(2).await).await;
    let policy = gcra("row_locks.switch", 1, 60_000, 2);
    for (shard, n) in [(5, 1), (5, 2), (9, 1)] {
        assert!(limiter.check(&check(&policy, subject(shard, n))).await.unwrap().permits_request());
    }
    let mut admin = db.connection().await;
    let far = db_now(&mut admin).await + 86_400_000;
    sqlx::query("UPDATE public.runlimit_gcra_shards SET watermark_ms = $1 WHERE shard = 9")
        .bind(far)
        .execute(&mut admin)
        .await
        .unwrap();
    let before = ledger(&mut admin, "public.runlimit_gcra_shards").await;
    assert_eq!((before.0, before.1), (256, 3));
    let per_shard =
        "SELECT shard, row_count FROM public.runlimit_gcra_ledger WHERE row_count > 0 ORDER BY shard";

    let switched_at = db_now(&mut admin).await;
    assert!(limiter.switch_to_row_locks().await.unwrap());
    assert_eq!(ledger(&mut admin, "public.runlimit_gcra_shards").await, (0, 0, None));
    assert_eq!(ledger(&mut admin, "public.runlimit_gcra_ledger").await, (256, 3, Some(far)));
    let counts: Vec<(i16, i32)> = sqlx::query_as(per_shard).fetch_all(&mut admin).await.unwrap();
    assert_eq!(counts, [(5, 2), (9, 1)]);
    let slowest: i64 = sqlx::query_scalar("SELECT min(watermark_ms) FROM public.runlimit_gcra_ledger")
        .fetch_one(&mut admin)
        .await
        .unwrap();
    assert!(
        slowest >= switched_at,
        "every watermark is at least the switch's clock: {slowest} < {switched_at}"
    );

    assert!(!limiter.switch_to_row_locks().await.unwrap(), "switched once");
    assert_eq!(ledger(&mut admin, "public.runlimit_gcra_ledger").await, (256, 3, Some(far)));
    // Admissions go on from the moved state: the two stored keys of shard 5 keep their
    // arrival times (the burst of 2 has one unit left each), a new key is counted.
    assert!(limiter.check(&check(&policy, subject(5, 1))).await.unwrap().permits_request());
    assert!(!limiter.check(&check(&policy, subject(5, 1))).await.unwrap().permits_request());
    assert!(limiter.check(&check(&policy, subject(5, 3))).await.unwrap().permits_request());
    let counts: Vec<(i16, i32)> = sqlx::query_as(per_shard).fetch_all(&mut admin).await.unwrap();
    assert_eq!(counts, [(5, 3), (9, 1)]);

    // A fresh database is switched by `migrate`.
    let fresh = TestDatabase::create("row_locks_fresh").await;
    let fresh_limiter = gcra_limiter_on(fresh.pool(1).await, true).await;
    let mut fresh_admin = fresh.connection().await;
    assert_eq!(ledger(&mut fresh_admin, "public.runlimit_gcra_shards").await, (0, 0, None));
    assert_eq!(ledger(&mut fresh_admin, "public.runlimit_gcra_ledger").await.0, 256);
    assert!(!fresh_limiter.switch_to_row_locks().await.unwrap());
    drop(fresh_admin);
    fresh.finish().await;
    drop(admin);
    db.finish().await;
}

fn assert_fenced(error: &CheckError, what: &str) {
    assert!(
        matches!(error, CheckError::MalformedResponse { .. }),
        "{what}: an earlier replica fails closed after the switch, got {error:?}"
    );
    assert_eq!(error.consumption(), ConsumptionStatus::NotConsumed, "{what}");
}

/// After the switch, replicas that know only the ledger-lock protocol (the release before it,
/// and earlier releases' statements) find no ledger row: their checks, batches, peeks and resets
/// fail closed, their cleanup finds nothing to clean, and they change nothing. A replica of this release that had not heard of
/// the switch learns it from the same missing rows and admits.
#[tokio::test]
#[ignore = "needs RUNLIMIT_POSTGRES_TEST_DATABASE_URL"]
async fn earlier_replicas_fail_closed_after_the_switch_and_current_ones_learn_it() {
    let db = TestDatabase::create("row_locks_fence").await;
    let switcher = ledger_lock_gcra_limiter(db.pool(1).await).await;
    let policy = gcra("row_locks.fence", 1, 60_000, 4);
    let key = check(&policy, subject(12, 1));
    let unaware = PostgresGcraLimiter::new(db.pool(1).await);
    assert!(unaware.check(&key).await.unwrap().permits_request(), "before the switch, on ledger locks");
    let earlier: Vec<PostgresGcraLimiter> = [
        config().with_ledger_lock_protocol(),
        config().with_previous_prepared_protocol(),
        config().with_previous_admission_protocol(),
    ]
    .into_iter()
    .map(|config| PostgresGcraLimiter::new(switcher.pool().clone()).with_config(config))
    .collect();
    for limiter in &earlier {
        assert!(limiter.check(&key).await.unwrap().permits_request(), "before the switch");
    }
    let mut admin = db.connection().await;
    let before = stored(&mut admin, &key).await;
    assert!(switcher.switch_to_row_locks().await.unwrap());

    for (index, limiter) in earlier.iter().enumerate() {
        let what = format!("earlier replica {index}");
        assert_fenced(&limiter.check(&key).await.unwrap_err(), &format!("{what}, check"));
        let batch = [key, check(&policy, subject(12, 2))];
        let error = limiter.check_all(&batch).await.unwrap_err();
        assert_eq!(error.consumption(), ConsumptionStatus::NotConsumed, "{what}, batch");
        assert!(
            matches!(error, runlimit_postgres::BatchCheckError::Check(CheckError::MalformedResponse { .. })),
            "{what}, batch: {error:?}"
        );
        if index == 0 {
            assert_fenced(&limiter.peek(subject(12, 1).bind(&policy)).await.unwrap_err(), "peek");
            let reset = limiter.reset(subject(12, 1).bind(&policy)).await.unwrap_err();
            assert!(matches!(reset, MaintenanceError::MalformedResponse { .. }), "reset: {reset:?}");
            // Its cleanup finds no shard to lock, so nothing to clean.
            assert_eq!(limiter.cleanup_expired(10).await.unwrap(), 0, "cleanup");
        }
    }
    assert_eq!(stored(&mut admin, &key).await, before, "the fenced replicas changed nothing");
    let rows: i64 =
        sqlx::query_scalar("SELECT count(*) FROM public.runlimit_gcra").fetch_one(&mut admin).await.unwrap();
    assert_eq!(rows, 1, "the fenced batches inserted nothing");

    // Four admissions of a burst of 4 so far: the unaware replica's check is denied, with the
    // retry-after the stored time gives: until it is at most (burst − 1) intervals ahead.
    let decision = unaware.check(&key).await.unwrap();
    let DecisionView::Denied { denial: Denial::QuotaExceeded(quota) } = decision.view() else {
        panic!("expected a quota denial, got {decision:?}")
    };
    let (tat_ms, _) = before.unwrap();
    let now = db_now(&mut admin).await;
    let retry = i64::try_from(quota.retry_after().millis()).unwrap();
    assert!(
        (tat_ms - 3 * 60_000 - now..=tat_ms - 3 * 60_000 - now + 1_000).contains(&retry),
        "retry-after {retry} ms against the stored {tat_ms} at {now}"
    );
    assert!(unaware.peek(subject(12, 1).bind(&policy)).await.unwrap().available() == 0);
    // Replicas of this release that had not heard of the switch learn it from a peek, a reset or
    // a cleanup pass just as from a check.
    let peeks = PostgresGcraLimiter::new(switcher.pool().clone());
    assert_eq!(peeks.peek(subject(12, 1).bind(&policy)).await.unwrap().available(), 0);
    let cleans = PostgresGcraLimiter::new(switcher.pool().clone());
    assert_eq!(cleans.cleanup_expired(10).await.unwrap(), 0);
    let resets = PostgresGcraLimiter::new(switcher.pool().clone());
    assert!(!resets.reset(subject(12, 9).bind(&policy)).await.unwrap());
    assert!(unaware.reset(subject(12, 1).bind(&policy)).await.unwrap());
    assert!(unaware.check(&key).await.unwrap().permits_request(), "reset on row locks");
    assert_eq!(ledger(&mut admin, "public.runlimit_gcra_ledger").await.1, 1);
    drop(admin);
    db.finish().await;
}

/// Sixteen tasks over four replicas hammer one key with single checks and two-key batches
/// (with a second key) on the row-lock protocol: the one-checks take no shard lock, yet the key
/// admits exactly its burst, the second key exactly what the batches that were allowed took,
/// and the stored arrival times are exactly the admissions' sum, so no admission decided on a
/// time another had already moved.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs RUNLIMIT_POSTGRES_TEST_DATABASE_URL"]
async fn a_hammered_key_admits_exactly_its_burst() {
    const BURST: u64 = 40;
    const INTERVAL_MS: i64 = 90_000; // one unit per 90 s: nothing replenishes during the test
    let db = TestDatabase::create("row_locks_hammer").await;
    let patient = config().with_operation_timeout(Duration::from_secs(10)).unwrap();
    let replicas = replicas(&db, 4, patient).await;
    let policy = Arc::new(gcra("row_locks.hammer", 1, 90_000, BURST));
    let mut admin = db.connection().await;
    let start = db_now(&mut admin).await;
    let mut tasks = Vec::new();
    for (index, replica) in replicas.iter().enumerate() {
        for worker in 0..4usize {
            let replica = replica.clone();
            let policy = Arc::clone(&policy);
            tasks.push(tokio::spawn(async move {
                let (mut hot, mut cold) = (0u64, 0u64);
                for operation in 0..12usize {
                    let hot_key = check(&policy, subject(77, 1));
                    if (index + worker + operation) % 3 == 0 {
                        let batch = [hot_key, check(&policy, subject(78, 1))];
                        let decision = replica.check_all(&batch).await.expect("no errors");
                        if matches!(decision.view(), BatchDecisionView::Allowed { .. }) {
                            hot += 1;
                            cold += 1;
                        }
                    } else if replica.check(&hot_key).await.expect("no errors").permits_request() {
                        hot += 1;
                    }
                }
                (hot, cold)
            }));
        }
    }
    let (mut hot, mut cold) = (0, 0);
    for task in tasks {
        let (h, c) = task.await.unwrap();
        hot += h;
        cold += c;
    }
    let elapsed = db_now(&mut admin).await - start;
    assert!(elapsed < INTERVAL_MS, "{elapsed} ms");
    assert_eq!(hot, BURST, "16 × 12 = 192 attempts on a burst of {BURST}");
    let hot_tat = stored(&mut admin, &check(&policy, subject(77, 1))).await.unwrap();
    assert_eq!((hot_tat.0 - start).div_euclid(INTERVAL_MS), i64::try_from(BURST).unwrap());
    assert_eq!(hot_tat.1, 0);
    let cold_tat = stored(&mut admin, &check(&policy, subject(78, 1))).await.unwrap();
    assert_eq!((cold_tat.0 - start).div_euclid(INTERVAL_MS), i64::try_from(cold).unwrap());
    assert_eq!(ledger(&mut admin, "public.runlimit_gcra_ledger").await.1, 2);
    drop(admin);
    close(&replicas).await;
    db.finish().await;
}

/// Twenty new keys of one shard at once from four replicas, the shard bounded at 5 rows: exactly
/// 5 are admitted, the others get a storage-capacity denial, and the ledger counts the 5 rows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs RUNLIMIT_POSTGRES_TEST_DATABASE_URL"]
async fn new_keys_fill_a_shard_exactly() {
    let db = TestDatabase::create("row_locks_capacity").await;
    let bounded = config()
        .with_maximum_rows_per_shard(5)
        .unwrap()
        .with_operation_timeout(Duration::from_secs(10))
        .unwrap();
    let replicas = replicas(&db, 5, bounded).await;
    let policy = Arc::new(gcra("row_locks.capacity", 1, 60_000, 1));
    let mut tasks = Vec::new();
    for n in 0..20u64 {
        let replica = replicas[usize::try_from(n % 4).unwrap()].clone();
        let policy = Arc::clone(&policy);
        tasks.push(tokio::spawn(async move {
            let decision = replica.check(&check(&policy, subject(33, n))).await.expect("no errors");
            match decision.view() {
                DecisionView::Allowed { .. } => true,
                DecisionView::Denied { denial: Denial::StorageCapacity { .. } } => false,
                other => panic!("unexpected {other:?}"),
            }
        }));
    }
    let mut admitted = 0;
    for task in tasks {
        admitted += usize::from(task.await.unwrap());
    }
    assert_eq!(admitted, 5);
    let mut admin = db.connection().await;
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM public.runlimit_gcra WHERE capacity_shard = 33")
        .fetch_one(&mut admin)
        .await
        .unwrap();
    let counted: i32 =
        sqlx::query_scalar("SELECT row_count FROM public.runlimit_gcra_ledger WHERE shard = 33")
            .fetch_one(&mut admin)
            .await
            .unwrap();
    assert_eq!((rows, counted), (5, 5));
    drop(admin);
    close(&replicas).await;
    db.finish().await;
}

/// The row-lock protocol decides exactly as `GcraStore` at the same instants: time is pinned
/// through the row-lock ledger's watermarks (far ahead of the clock), single checks, shadow
/// checks and batches over four policies and four keys, for 300 random steps.
#[tokio::test]
#[ignore = "needs RUNLIMIT_POSTGRES_TEST_DATABASE_URL"]
async fn decides_as_gcra_store_at_pinned_instants() {
    let db = TestDatabase::create("row_locks_differential").await;
    let limiter = gcra_limiter_on(db.pool(2).await, true).await;
    let mut admin = db.connection().await;
    let clock = ManualClock::new();
    let store = GcraStore::builder(MemoryStoreConfig::new(10_000).unwrap()).with_clock(clock.clone()).build();
    let policies = [
        gcra("diff.v2", 3, 1_000, 2),
        gcra("diff.v1", 10, 1_000, 20),
        gcra("diff.minute", 1, 60_000, 1),
        gcra("diff.v5", 2, 1_000, 4),
    ];
    let shadow = policies[0].clone().with_quota_mode(runlimit_core::QuotaMode::Shadow);
    let subjects = [subject(3, 1), subject(3, 2), subject(7, 1), subject(200, 9)];
    let base = db_now(&mut admin).await + 10 * 24 * 3_600_000;
    let mut offset = 0u64;
    let mut state = 0x2545_F491_4F6C_DD1Du64;
    let mut next = |bound: u64| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state % bound
    };
    let steps_ms = [0, 0, 0, 1, 50, 99, 100, 333, 334, 500, 1_000, 2_500, 61_000];
    for step in 0..300 {
        offset += steps_ms[usize::try_from(next(steps_ms.len() as u64)).unwrap()];
        clock.set(Duration::from_millis(offset));
        sqlx::query("UPDATE public.runlimit_gcra_ledger SET watermark_ms = $1")
            .bind(base + i64::try_from(offset).unwrap())
            .execute(&mut admin)
            .await
            .unwrap();
        let s = usize::try_from(next(subjects.len() as u64)).unwrap();
        let p = usize::try_from(next(policies.len() as u64)).unwrap();
        match next(4) {
            0 | 1 => {
                let check = check(&policies[p], subjects[s]);
                assert_eq!(limiter.check(&check).await.unwrap(), store.check(&check).unwrap(), "step {step}");
            }
            2 => {
                let check = check(&shadow, subjects[s]);
                assert_eq!(
                    limiter.check(&check).await.unwrap(),
                    store.check(&check).unwrap(),
                    "shadow {step}"
                );
            }
            _ => {
                let other = (s + 1 + usize::try_from(next(3)).unwrap()) % subjects.len();
                let checks = [check(&policies[p], subjects[s]), check(&policies[p], subjects[other])];
                assert_eq!(
                    limiter.check_all(&checks).await.unwrap(),
                    store.check_all(&checks).unwrap(),
                    "batch {step}"
                );
            }
        }
    }
    drop(admin);
    db.finish().await;
}

/// A batch on row locks reads its keys' rows without locking them, so a one-check admission
/// may change one between the batch's read and its write: the write is then refused before
/// `COMMIT`, and the batch is decided again on the row as that admission left it, reading the
/// rows with row locks this time (so a second attempt cannot be refused). Here a
/// stranger's update stands for that admission: it holds the key's row while the batch reads and
/// tries to write, then commits one more emission interval; the batch is allowed, and the
/// stored time is the stranger's plus the batch's interval, not the batch's first decision
/// written over it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs RUNLIMIT_POSTGRES_TEST_DATABASE_URL"]
async fn a_batch_decides_again_when_a_row_changed_after_its_read() {
    const INTERVAL_MS: i64 = 60_000;
    let db = TestDatabase::create("row_locks_batch_retry").await;
    let patient = config().with_operation_timeout(Duration::from_secs(10)).unwrap();
    let limiter = gcra_limiter_on(db.pool(2).await, true).await.with_config(patient);
    let policy = gcra("row_locks.retry", 1, 60_000, 5);
    let (hot, other) = (check(&policy, subject(90, 1)), check(&policy, subject(91, 1)));
    assert!(limiter.check(&hot).await.unwrap().permits_request());
    let mut admin = db.connection().await;
    let (first, _) = stored(&mut admin, &hot).await.unwrap();

    let mut stranger = db.connection().await;
    let stranger_pid: i32 =
        sqlx::query_scalar("SELECT pg_backend_pid()").fetch_one(&mut stranger).await.unwrap();
    sqlx::raw_sql("BEGIN").execute(&mut stranger).await.unwrap();
    sqlx::query(
        "UPDATE public.runlimit_gcra SET tat_ms = tat_ms + $2, expires_at_ms = expires_at_ms + $2 \
         WHERE counter_key = $1",
    )
    .bind(hot.counter_key().to_bytes().as_slice())
    .bind(INTERVAL_MS)
    .execute(&mut stranger)
    .await
    .unwrap();
    let batch = {
        let limiter = limiter.clone();
        let policy = policy.clone();
        tokio::spawn(async move {
            let checks = [check(&policy, subject(90, 1)), check(&policy, subject(91, 1))];
            limiter.check_all(&checks).await
        })
    };
    // The batch read the row as it was (the stranger has not committed) and now waits for the
    // row to write it.
    waiting_backend(&mut admin, &db.name, stranger_pid).await;
    sqlx::raw_sql("COMMIT").execute(&mut stranger).await.unwrap();
    let decision = batch.await.unwrap().expect("the batch is decided again, not failed");
    assert!(matches!(decision.view(), BatchDecisionView::Allowed { .. }), "{decision:?}");
    let (after, remainder) = stored(&mut admin, &hot).await.unwrap();
    assert_eq!((after - first, remainder), (2 * INTERVAL_MS, 0), "the stranger's interval and the batch's");
    assert!(stored(&mut admin, &other).await.is_some());
    drop((admin, stranger));
    db.finish().await;
}

/// Distinct new keys of one shard from many replicas at once: each one-check's insert waits for
/// the shard's ledger row, which other inserts hold; none is refused for it, or, when a batch
/// moved the shard's watermark past its clock sample meanwhile, it is decided again under
/// locks: every check is allowed, none fails, and the ledger counts every row.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs RUNLIMIT_POSTGRES_TEST_DATABASE_URL"]
async fn new_keys_of_one_shard_at_once_are_all_admitted() {
    let db = TestDatabase::create("row_locks_new_keys").await;
    let roomy = config()
        .with_maximum_rows_per_shard(10_000)
        .unwrap()
        .with_operation_timeout(Duration::from_secs(10))
        .unwrap();
    let replicas = replicas(&db, 4, roomy).await;
    let policy = Arc::new(gcra("row_locks.new_keys", 1, 60_000, 100));
    let mut tasks = Vec::new();
    for worker in 0..16u64 {
        let replica = replicas[usize::try_from(worker % 4).unwrap()].clone();
        let policy = Arc::clone(&policy);
        tasks.push(tokio::spawn(async move {
            for n in 0..25u64 {
                let key = check(&policy, subject(61, worker * 1_000 + n));
                if n % 5 == 4 {
                    // Now and then a batch of a new key and a stored one, which moves the watermark.
                    let stored = check(&policy, subject(61, worker * 1_000));
                    let decision = replica.check_all(&[key, stored]).await.expect("no errors");
                    assert!(matches!(decision.view(), BatchDecisionView::Allowed { .. }), "{decision:?}");
                } else {
                    assert!(replica.check(&key).await.expect("no errors").permits_request());
                }
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let mut admin = db.connection().await;
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM public.runlimit_gcra WHERE capacity_shard = 61")
        .fetch_one(&mut admin)
        .await
        .unwrap();
    let counted: i32 =
        sqlx::query_scalar("SELECT row_count FROM public.runlimit_gcra_ledger WHERE shard = 61")
            .fetch_one(&mut admin)
            .await
            .unwrap();
    assert_eq!((rows, i64::from(counted)), (400, 400));
    drop(admin);
    close(&replicas).await;
    db.finish().await;
}

/// A role with only the privileges an application needed before the row-lock protocol (every
/// change of `public.runlimit_gcra`, reading and updating its ledger) still admits new keys after
/// this release's migration (the counting triggers, which run as that role, now also write the
/// row-lock ledger, whose privileges the migration copies from the old one) and after the switch.
#[tokio::test]
#[ignore = "needs RUNLIMIT_POSTGRES_TEST_DATABASE_URL"]
async fn a_least_privileged_role_admits_before_and_after_the_switch() {
    let db = TestDatabase::create("row_locks_privileges").await;
    let owner = db.pool(1).await;
    migrate_gcra_as_earlier_release(&owner).await;
    let role = format!("runlimit_rl_app_{}", std::process::id());
    for statement in [
        format!("DROP ROLE IF EXISTS {role}"),
        format!("CREATE ROLE {role} LOGIN"),
        format!("GRANT USAGE ON SCHEMA public TO {role}"),
        format!("GRANT SELECT, INSERT, UPDATE, DELETE ON public.runlimit_gcra TO {role}"),
        format!("GRANT SELECT, UPDATE ON public.runlimit_gcra_shards TO {role}"),
    ] {
        sqlx::raw_sql(sqlx::AssertSqlSafe(statement)).execute(&owner).await.unwrap();
    }
    let migrated = PostgresGcraLimiter::new(owner.clone());
    migrated.migrate().await.unwrap();
    let app_pool = db
        .pool_with(
            sqlx::postgres::PgPoolOptions::new().max_connections(1),
            db.options.clone().username(&role),
        )
        .await;
    let app = PostgresGcraLimiter::new(app_pool.clone());
    let policy = gcra("row_locks.privileges", 1, 60_000, 2);
    assert!(app.check(&check(&policy, subject(14, 1))).await.unwrap().permits_request(), "before the switch");
    assert!(migrated.switch_to_row_locks().await.unwrap());
    assert!(app.check(&check(&policy, subject(14, 2))).await.unwrap().permits_request(), "after the switch");
    assert!(app.check(&check(&policy, subject(14, 2))).await.unwrap().permits_request(), "a stored key");
    app_pool.close().await;
    owner.close().await;
    db.finish().await;
    let mut admin = sqlx::postgres::PgConnection::connect(&admin_url()).await.unwrap();
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("DROP ROLE {role}"))).execute(&mut admin).await.unwrap();
}

/// A one-check of a new key whose insert finds the shard's watermark moved past its clock sample
/// (a stranger holding the shard's ledger row stands for a batch or cleanup that advances it) is
/// refused once, then decided under locks, with the clock sampled after them: it is allowed, and
/// its arrival time starts at or after the watermark it waited for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs RUNLIMIT_POSTGRES_TEST_DATABASE_URL"]
async fn a_refused_insert_is_decided_again_under_locks() {
    let db = TestDatabase::create("row_locks_refused_insert").await;
    let patient = config().with_operation_timeout(Duration::from_secs(10)).unwrap();
    let limiter = gcra_limiter_on(db.pool(2).await, true).await.with_config(patient);
    let policy = gcra("row_locks.refused", 1, 60_000, 5);
    let key = check(&policy, subject(40, 1));
    let mut admin = db.connection().await;
    let mut stranger = db.connection().await;
    let stranger_pid: i32 =
        sqlx::query_scalar("SELECT pg_backend_pid()").fetch_one(&mut stranger).await.unwrap();
    sqlx::raw_sql("BEGIN; SELECT 1 FROM public.runlimit_gcra_ledger WHERE shard = 40 FOR UPDATE")
        .execute(&mut stranger)
        .await
        .unwrap();
    let admission = {
        let limiter = limiter.clone();
        let policy = policy.clone();
        tokio::spawn(async move { limiter.check(&check(&policy, subject(40, 1))).await })
    };
    // The admission sampled its clock and waits to insert; the stranger moves the watermark a
    // second past the clock and commits.
    waiting_backend(&mut admin, &db.name, stranger_pid).await;
    let watermark: i64 = sqlx::query_scalar(
        "UPDATE public.runlimit_gcra_ledger \
         SET watermark_ms = floor(extract(epoch from clock_timestamp()) * 1000)::bigint + 1000 \
         WHERE shard = 40 RETURNING watermark_ms",
    )
    .fetch_one(&mut stranger)
    .await
    .unwrap();
    sqlx::raw_sql("COMMIT").execute(&mut stranger).await.unwrap();
    let decision = admission.await.unwrap().expect("decided under locks, not failed");
    assert!(decision.permits_request(), "{decision:?}");
    let (tat_ms, _) = stored(&mut admin, &key).await.unwrap();
    assert_eq!(tat_ms, watermark + 60_000, "decided at the watermark, one interval on");
    drop((admin, stranger));
    db.finish().await;
}

/// Four seconds of every operation at once on shared shards from four replicas: one-checks and
/// batches of a hot key, one-checks of new keys, resets and cleanup of a second shard. Nothing
/// fails, the hot key stays within its burst plus what replenished, and every shard's ledger
/// count equals its rows.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs RUNLIMIT_POSTGRES_TEST_DATABASE_URL"]
async fn every_operation_at_once_fails_nothing_and_stays_in_bounds() {
    const BURST: u64 = 3;
    const INTERVAL_MS: u64 = 50;
    let db = TestDatabase::create("row_locks_mixed").await;
    let patient = config().with_operation_timeout(Duration::from_secs(10)).unwrap();
    let replicas = replicas(&db, 4, patient).await;
    let policy = Arc::new(gcra("row_locks.mixed", 1, INTERVAL_MS, BURST));
    let started = std::time::Instant::now();
    let mut tasks = Vec::new();
    for (index, replica) in replicas.iter().enumerate() {
        for worker in 0..4u64 {
            let (replica, policy) = (replica.clone(), Arc::clone(&policy));
            tasks.push(tokio::spawn(async move {
                let (mut hot, mut operation) = (0u64, 0u64);
                let mine = u64::try_from(index).unwrap() * 4 + worker;
                while started.elapsed() < Duration::from_secs(4) {
                    operation += 1;
                    let hot_key = check(&policy, subject(10, 1));
                    let shared = subject(11, operation % 3);
                    match (mine + operation) % 7 {
                        0 => {
                            let batch = [check(&policy, shared), hot_key];
                            let decision = replica.check_all(&batch).await.expect("batch");
                            hot += u64::from(matches!(decision.view(), BatchDecisionView::Allowed { .. }));
                        }
                        1 => {
                            replica.reset(shared.bind(&policy)).await.expect("reset");
                        }
                        2 => {
                            replica.cleanup_expired(50).await.expect("cleanup");
                        }
                        3 => {
                            replica.check(&check(&policy, subject(11, 1_000 + mine))).await.expect("new key");
                        }
                        _ => {
                            hot += u64::from(replica.check(&hot_key).await.expect("check").permits_request())
                        }
                    }
                }
                hot
            }));
        }
    }
    let mut hot = 0;
    for task in tasks {
        hot += task.await.unwrap();
    }
    let elapsed_ms = u64::try_from(started.elapsed().as_millis()).unwrap();
    assert!(hot <= BURST + elapsed_ms / INTERVAL_MS + 1, "{hot} admitted in {elapsed_ms} ms");
    let mut admin = db.connection().await;
    let mismatched: Vec<(i16, i32, i64)> = sqlx::query_as(
        "SELECT l.shard, l.row_count, (SELECT count(*) FROM public.runlimit_gcra AS g WHERE g.capacity_shard = l.shard) \
         FROM public.runlimit_gcra_ledger AS l \
         WHERE l.row_count <> (SELECT count(*) FROM public.runlimit_gcra AS g WHERE g.capacity_shard = l.shard)",
    )
    .fetch_all(&mut admin)
    .await
    .unwrap();
    assert!(mismatched.is_empty(), "{mismatched:?}");
    drop(admin);
    close(&replicas).await;
    db.finish().await;
}
