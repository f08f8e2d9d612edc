//! Promises that hold by construction, shown against the real server: GCRA and attempt
//! admissions lock before they read and sample the clock after their locks, failed cleanups
//! are observed as `NoEffect` or `Unknown` end to end, and (compile time, no database) live
//! backend instances implement no serde traits while the configuration does.

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use runlimit_core::{
    BatchDecision, BatchDecisionView, Capacity, Check, CleanupOutcome, Delay, Denial, GcraPolicy, KeyHasher,
    Observation, Observer, PolicyId, QuotaDenial, ScopeId,
    attempts::{AttemptDecision, AttemptDenial, AttemptPolicy},
};
use runlimit_postgres::{
    MaintenanceError, MaintenancePhase, PostgresGcraLimiter, PostgresLimiter,
    attempts::PostgresAttemptLimiter,
};
use sqlx::{Connection, PgConnection, postgres::PgPoolOptions};

use crate::support::*;

/// The database clock in whole milliseconds, as the limiters sample it.
async fn db_now(connection: &mut PgConnection) -> i64 {
    sqlx::query_scalar("SELECT floor(extract(epoch from clock_timestamp()) * 1000)::bigint")
        .fetch_one(connection)
        .await
        .expect("read the database clock")
}

async fn backend_pid(connection: &mut PgConnection) -> i32 {
    sqlx::query_scalar("SELECT pg_backend_pid()").fetch_one(connection).await.expect("backend pid")
}

/// The sessions `pid` is waiting for.
async fn blocking_pids(connection: &mut PgConnection, pid: i32) -> Vec<i32> {
    sqlx::query_scalar("SELECT pg_blocking_pids($1)")
        .bind(pid)
        .fetch_one(connection)
        .await
        .expect("pg_blocking_pids")
}

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

fn gcra_check(policy: &GcraPolicy, subject: runlimit_core::SubjectKey) -> Check<'_, GcraPolicy> {
    Check::new(subject.bind(policy))
}

/// `(tat_ms, tat_remainder, expires_at_ms)` of a GCRA counter.
async fn gcra_row(connection: &mut PgConnection, check: &Check<'_, GcraPolicy>) -> Option<(i64, i64, i64)> {
    sqlx::query_as(
        "SELECT tat_ms, tat_remainder, expires_at_ms FROM public.runlimit_gcra WHERE counter_key = $1",
    )
    .bind(check.counter_key().to_bytes().as_slice())
    .fetch_optional(connection)
    .await
    .expect("read gcra row")
}

/// `(shard, row_count, watermark_ms)` of GCRA shards 7 and 200.
async fn gcra_ledger(connection: &mut PgConnection) -> Vec<(i16, i32, i64)> {
    sqlx::query_as(
        "SELECT shard, row_count, watermark_ms FROM public.runlimit_gcra_shards \
         WHERE shard IN (7, 200) ORDER BY shard",
    )
    .fetch_all(connection)
    .await
    .expect("read gcra ledger")
}

/// A migrated limiter on the ledger-lock protocol, whose promises these tests pin.
async fn gcra_limiter(db: &TestDatabase, connections: u32) -> PostgresGcraLimiter {
    crate::support::ledger_lock_gcra_limiter(db.pool(connections).await).await
}

/// A batch touching shards 200 and 7, given in descending shard order, waits for a stranger
/// holding shard 200's ledger row while it already holds shard 7's (so it locks ascending,
/// whatever the input order), reads the counters only once every lock is granted (it sees a
/// stored arrival time the stranger committed on shard 7's key while it waited), and samples
/// the clock after the wait: the exact delay of its decision is `tat − now`, which puts its
/// clock sample between the stranger's release and the response, 1.5 s after the request.
/// Then a stranger locking ascending (7, then 200) never deadlocks with the same batch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs RUNLIMIT_POSTGRES_TEST_DATABASE_URL"]
async fn gcra_locks_its_shards_ascending_before_reading_and_samples_the_clock_after() {
    let db = TestDatabase::create("promise_gcra_lock_order").await;
    let limiter = gcra_limiter(&db, 2)
        .await
        .with_config(config().with_operation_timeout(Duration::from_secs(5)).unwrap());
    let mut admin = db.connection().await;
    let admin_pid = backend_pid(&mut admin).await;
    // One unit per 100 ms, burst 1: a check is allowed iff its stored arrival time is not in
    // the future, and a denial's retry_after is exactly `tat − now`.
    let policy = gcra("promise.order", 1, 100, 1);
    let (low, high) = (subject(7, 1), subject(200, 1));
    // Both keys get a row (so the stranger's write below is an update that touches no ledger).
    assert!(
        limiter
            .check_all(&[gcra_check(&policy, low), gcra_check(&policy, high)])
            .await
            .unwrap()
            .permits_request()
    );
    // Both rested before the request, so only what the stranger writes can deny the batch.
    tokio::time::sleep(Duration::from_millis(150)).await;
    let high_row = gcra_row(&mut admin, &gcra_check(&policy, high)).await.expect("shard 200 row");
    let ledger = gcra_ledger(&mut admin).await;
    assert_eq!(ledger.iter().map(|&(shard, rows, _)| (shard, rows)).collect::<Vec<_>>(), [(7, 1), (200, 1)]);

    // The stranger holds shard 200's ledger row.
    let mut stranger = db.connection().await;
    let stranger_pid = backend_pid(&mut stranger).await;
    let mut held = stranger.begin().await.unwrap();
    sqlx::query("SELECT shard FROM public.runlimit_gcra_shards WHERE shard = 200 FOR UPDATE")
        .execute(&mut *held)
        .await
        .unwrap();
    let requested_at = db_now(&mut admin).await;
    let descending = |limiter: PostgresGcraLimiter, policy: GcraPolicy| {
        tokio::spawn(async move {
            limiter.check_all(&[gcra_check(&policy, high), gcra_check(&policy, low)]).await
        })
    };
    let pending = descending(limiter.clone(), policy.clone());
    let waiting = waiting_backend(&mut admin, &db.name, admin_pid).await;
    assert_ne!(waiting, stranger_pid);
    assert_eq!(blocking_pids(&mut admin, waiting).await, [stranger_pid], "it waits for the stranger");
    // While it waits for shard 200 it already holds shard 7: locked ascending, not in input order.
    let mut prober = db.connection().await;
    let probe =
        sqlx::query("SELECT shard FROM public.runlimit_gcra_shards WHERE shard = 7 FOR UPDATE NOWAIT")
            .execute(&mut prober)
            .await
            .unwrap_err();
    assert_eq!(sqlstate(&probe).as_deref(), Some("55P03"), "{probe:?}");
    // A shard outside the batch is free (the 55P03 above is the admission's lock, nothing else).
    sqlx::query("SELECT shard FROM public.runlimit_gcra_shards WHERE shard = 8 FOR UPDATE NOWAIT")
        .execute(&mut prober)
        .await
        .unwrap();

    tokio::time::sleep(Duration::from_millis(1_500)).await;
    // Before releasing, the stranger stores an arrival time 60 s ahead of its own clock on the
    // key of shard 7, whose ledger lock the admission already holds: only a read made after
    // the admission's last lock sees it.
    let stranger_tat: i64 = sqlx::query_scalar(
        "UPDATE public.runlimit_gcra \
         SET tat_ms = clock.tat, tat_remainder = 0, expires_at_ms = clock.tat \
         FROM (SELECT floor(extract(epoch from clock_timestamp()) * 1000)::bigint + 60000 AS tat) AS clock \
         WHERE counter_key = $1 RETURNING tat_ms",
    )
    .bind(gcra_check(&policy, low).counter_key().to_bytes().as_slice())
    .fetch_one(&mut *held)
    .await
    .unwrap();
    let released_at = stranger_tat - 60_000;
    held.commit().await.unwrap();
    let decision = pending.await.unwrap().expect("decided after the wait");
    let answered_at = db_now(&mut admin).await;

    let BatchDecisionView::Denied { index: 1, batch_size: 2, denial: Denial::QuotaExceeded(quota) } =
        decision.view()
    else {
        panic!("expected the shard-7 check (index 1) denied by the stranger's arrival time: {decision:?}")
    };
    let retry_ms = i64::try_from(quota.retry_after().millis()).unwrap();
    let sampled_at = stranger_tat - retry_ms;
    assert_eq!(
        decision,
        BatchDecision::denied(
            1,
            2,
            Denial::QuotaExceeded(QuotaDenial::new(
                Capacity::new(1).unwrap(),
                Delay::from_millis(u64::try_from(retry_ms).unwrap())
            ))
        )
        .unwrap()
    );
    assert!(
        released_at >= requested_at + 1_500,
        "the stranger held the lock 1.5 s: {requested_at} → {released_at}"
    );
    assert!(
        released_at <= sampled_at && sampled_at <= answered_at,
        "the clock was sampled after the release: request {requested_at}, release {released_at}, \
         sample {sampled_at}, answer {answered_at}"
    );
    println!(
        "gcra: sampled {} ms after the release, {} ms after the request",
        sampled_at - released_at,
        sampled_at - requested_at
    );
    // A denial wrote nothing: the stranger's row, the other row and the ledger are as they were.
    assert_eq!(gcra_row(&mut admin, &gcra_check(&policy, low)).await, Some((stranger_tat, 0, stranger_tat)));
    assert_eq!(gcra_row(&mut admin, &gcra_check(&policy, high)).await, Some(high_row));
    assert_eq!(gcra_ledger(&mut admin).await, ledger);

    // Mirror: a stranger locking ascending holds shard 7; the same descending batch waits for
    // it holding nothing else, so the stranger takes shard 200 without waiting (no deadlock).
    let mut held = stranger.begin().await.unwrap();
    sqlx::query("SELECT shard FROM public.runlimit_gcra_shards WHERE shard = 7 FOR UPDATE")
        .execute(&mut *held)
        .await
        .unwrap();
    let pending = descending(limiter.clone(), policy.clone());
    let waiting = waiting_backend(&mut admin, &db.name, admin_pid).await;
    assert_eq!(blocking_pids(&mut admin, waiting).await, [stranger_pid]);
    sqlx::query("SELECT shard FROM public.runlimit_gcra_shards WHERE shard = 200 FOR UPDATE NOWAIT")
        .execute(&mut *held)
        .await
        .expect("shard 200 is free while the batch waits for shard 7");
    held.commit().await.unwrap();
    let decision = pending.await.unwrap().expect("no deadlock, no error");
    assert!(
        matches!(
            decision.view(),
            BatchDecisionView::Denied { index: 1, denial: Denial::QuotaExceeded(_), .. }
        ),
        "{decision:?}"
    );
    drop((admin, stranger, prober));
    db.finish().await;
}

/// 1 s initial delay, 8 s cap, 60 s quiet period, 5 s lease.
fn attempt_policy() -> AttemptPolicy {
    AttemptPolicy::new(
        PolicyId::new("promise.attempt").unwrap(),
        ScopeId::new("identity").unwrap(),
        Duration::from_secs(1),
        Duration::from_secs(8),
        Duration::from_secs(60),
        Duration::from_secs(5),
    )
    .unwrap()
}

/// An attempt admission waits for a stranger holding its shard's row of
/// `runlimit_attempt_shards`, then reads the subject's state the stranger committed while it
/// waited (a lease deadline 30 s past the stranger's clock) and measures its `InProgress`
/// delay from a clock sampled after the wait: `retry_after = deadline − now` puts the sample
/// between the stranger's release and the response, a second after the request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs RUNLIMIT_POSTGRES_TEST_DATABASE_URL"]
async fn attempt_admission_locks_its_shard_before_reading_and_samples_the_clock_after() {
    let db = TestDatabase::create("promise_attempt_lock").await;
    let limiter = Arc::new(
        PostgresAttemptLimiter::new(db.pool(2).await)
            .with_config(config().with_operation_timeout(Duration::from_secs(5)).unwrap()),
    );
    limiter.migrate().await.expect("migrate attempts");
    let mut admin = db.connection().await;
    let admin_pid = backend_pid(&mut admin).await;
    let policy = Arc::new(attempt_policy());
    let hasher = KeyHasher::new(&[3; 32]).unwrap();
    let subject = hasher.hash_attempt_for(&policy, b"user@example.test");
    let key = subject.counter_key().to_bytes();
    let shard = i16::from(subject.subject().as_bytes()[0]);
    assert_eq!(i16::from(key[32]), shard);
    // A live 5 s lease.
    let AttemptDecision::Admitted(receipt) = limiter.acquire(&subject).await.unwrap() else {
        panic!("first attempt admitted")
    };
    drop(receipt);
    let first_deadline: i64 =
        sqlx::query_scalar("SELECT lease_deadline_ms FROM public.runlimit_attempts WHERE attempt_key = $1")
            .bind(&key[..])
            .fetch_one(&mut admin)
            .await
            .unwrap();

    let mut stranger = db.connection().await;
    let stranger_pid = backend_pid(&mut stranger).await;
    let mut held = stranger.begin().await.unwrap();
    sqlx::query(
        "SELECT capacity_shard FROM public.runlimit_attempt_shards WHERE capacity_shard = $1 FOR UPDATE",
    )
    .bind(shard)
    .execute(&mut *held)
    .await
    .unwrap();
    let requested_at = db_now(&mut admin).await;
    let pending = {
        let limiter = Arc::clone(&limiter);
        let policy = Arc::clone(&policy);
        let hasher = hasher.clone();
        tokio::spawn(async move {
            let subject = hasher.hash_attempt_for(&policy, b"user@example.test");
            limiter.acquire(&subject).await.map(|decision| match decision {
                AttemptDecision::Admitted(receipt) => panic!("admitted {receipt:?}"),
                AttemptDecision::Denied(denial) => denial,
            })
        })
    };
    let waiting = waiting_backend(&mut admin, &db.name, admin_pid).await;
    assert_eq!(blocking_pids(&mut admin, waiting).await, [stranger_pid], "it waits for the shard lock");
    // The subject's row itself is not locked by anyone: the admission waits on the shard only.
    let mut prober = db.connection().await;
    sqlx::query("SELECT 1 FROM public.runlimit_attempts WHERE attempt_key = $1 FOR UPDATE NOWAIT")
        .bind(&key[..])
        .execute(&mut prober)
        .await
        .expect("the subject row is free while the admission waits");

    tokio::time::sleep(Duration::from_millis(1_000)).await;
    // Before releasing, the stranger moves the lease deadline to 30 s past its own clock.
    let deadline: i64 = sqlx::query_scalar(
        "UPDATE public.runlimit_attempts \
         SET lease_deadline_ms = clock.now_ms + 30000, expires_at_ms = clock.now_ms + 90000 \
         FROM (SELECT floor(extract(epoch from clock_timestamp()) * 1000)::bigint AS now_ms) AS clock \
         WHERE attempt_key = $1 RETURNING lease_deadline_ms",
    )
    .bind(&key[..])
    .fetch_one(&mut *held)
    .await
    .unwrap();
    let released_at = deadline - 30_000;
    held.commit().await.unwrap();
    let denial = pending.await.unwrap().expect("decided after the wait");
    let answered_at = db_now(&mut admin).await;

    let AttemptDenial::InProgress { retry_after } = denial else {
        panic!("expected InProgress from the committed lease: {denial:?}")
    };
    let sampled_at = deadline - i64::try_from(retry_after.millis()).unwrap();
    assert!(released_at >= requested_at + 1_000, "held 1 s: {requested_at} → {released_at}");
    assert!(
        released_at <= sampled_at && sampled_at <= answered_at,
        "the clock was sampled after the release: request {requested_at}, release {released_at}, \
         sample {sampled_at}, answer {answered_at} (first deadline {first_deadline})"
    );
    println!(
        "attempts: sampled {} ms after the release, {} ms after the request",
        sampled_at - released_at,
        sampled_at - requested_at
    );
    drop((admin, stranger, prober));
    db.finish().await;
}

/// Cleanup observations, without the admissions.
#[derive(Clone, Default)]
struct Cleanups(Arc<Mutex<Vec<(CleanupOutcome, u64)>>>);

impl Cleanups {
    fn take(&self) -> Vec<(CleanupOutcome, u64)> {
        std::mem::take(&mut *self.0.lock().unwrap())
    }
}

impl Observer for Cleanups {
    fn observe(&self, observation: &Observation<'_>) {
        if let Observation::Cleanup(cleanup) = observation {
            self.0.lock().unwrap().push((cleanup.outcome(), cleanup.maximum()));
        }
    }
}

async fn fixed_window_rows(connection: &mut PgConnection) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM public.runlimit_fixed_windows")
        .fetch_one(connection)
        .await
        .unwrap()
}

/// `PostgresLimiter::cleanup_expired`: a pass whose `DELETE` waits for a stranger holding the
/// ledger row it must lock times out in the delete phase, removed nothing and is observed as
/// `NoEffect`; a pass whose `COMMIT` reached the server but whose answer was lost is
/// `CommitOutcomeUnknown`, observed as `Unknown`, and here did remove the rows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs RUNLIMIT_POSTGRES_TEST_DATABASE_URL"]
async fn fixed_window_cleanup_observes_no_effect_and_unknown() {
    let db = TestDatabase::create("promise_fixed_cleanup").await;
    db.limiter(1).await; // migrate directly, not through the proxy
    let proxy = Proxy::start(&db.options).await;
    let pool = db.pool_with(PgPoolOptions::new().max_connections(1), proxy.options(&db.options)).await;
    let cleanups = Cleanups::default();
    let limiter = PostgresLimiter::new(pool).with_observer(cleanups.clone());
    let mut admin = db.connection().await;
    let short = policy("promise.cleanup", 1, Duration::from_millis(50));
    for n in 1..=2 {
        assert!(limiter.check(&check(&short, subject(40, n))).await.unwrap().permits_request());
    }
    tokio::time::sleep(Duration::from_millis(120)).await;
    assert_eq!((fixed_window_rows(&mut admin).await, ledger_count(&mut admin, 40).await), (2, 2));

    // NoEffect: the DELETE needs shard 40's ledger row, which a stranger holds.
    let timeout = Duration::from_millis(300);
    let impatient = limiter.clone().with_config(config().with_operation_timeout(timeout).unwrap());
    let mut stranger = db.connection().await;
    let mut held = stranger.begin().await.unwrap();
    sqlx::query("SELECT shard FROM public.runlimit_fixed_window_shards WHERE shard = 40 FOR UPDATE")
        .execute(&mut *held)
        .await
        .unwrap();
    let error = impatient.cleanup_expired(5).await.unwrap_err();
    assert!(
        matches!(error, MaintenanceError::Timeout { phase: MaintenancePhase::Delete, timeout: t } if t == timeout),
        "{error:?}"
    );
    assert!(!error.may_have_removed_rows());
    assert_eq!(cleanups.take(), [(CleanupOutcome::NoEffect, 5)]);
    held.rollback().await.unwrap();
    assert_eq!((fixed_window_rows(&mut admin).await, ledger_count(&mut admin, 40).await), (2, 2));

    // Unknown: the COMMIT is forwarded, its answer never comes back.
    proxy.arm(Cut::AfterForwarding(b"COMMIT;"));
    let error = limiter.cleanup_expired(6).await.unwrap_err();
    assert!(matches!(error, MaintenanceError::CommitOutcomeUnknown { .. }), "{error:?}");
    assert!(error.may_have_removed_rows());
    assert_eq!(cleanups.take(), [(CleanupOutcome::Unknown, 6)]);
    // The server did commit: both rows and their ledger slots are gone.
    settled_server(&mut admin).await;
    assert_eq!((fixed_window_rows(&mut admin).await, ledger_count(&mut admin, 40).await), (0, 0));
    assert_eq!(limiter.cleanup_expired(7).await.unwrap(), 0);
    assert_eq!(cleanups.take(), [(CleanupOutcome::Removed { count: 0 }, 7)]);
    drop((admin, stranger));
    db.finish().await;
}

async fn gcra_rows(connection: &mut PgConnection) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM public.runlimit_gcra").fetch_one(connection).await.unwrap()
}

async fn gcra_shard_41(connection: &mut PgConnection) -> (i32, i64) {
    sqlx::query_as("SELECT row_count, watermark_ms FROM public.runlimit_gcra_shards WHERE shard = 41")
        .fetch_one(connection)
        .await
        .unwrap()
}

/// `PostgresGcraLimiter::cleanup_expired`: a pass whose connection dies before its `DELETE`
/// reaches the server fails in the delete phase, removed nothing and is observed as
/// `NoEffect`; a pass whose `COMMIT` reached the server but whose answer was lost is
/// `CommitOutcomeUnknown`, observed as `Unknown`, and here did remove the rows (and advanced
/// the shard's watermark).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs RUNLIMIT_POSTGRES_TEST_DATABASE_URL"]
async fn gcra_cleanup_observes_no_effect_and_unknown() {
    let db = TestDatabase::create("promise_gcra_cleanup").await;
    gcra_limiter(&db, 1).await;
    let proxy = Proxy::start(&db.options).await;
    let pool = db.pool_with(PgPoolOptions::new().max_connections(1), proxy.options(&db.options)).await;
    let cleanups = Cleanups::default();
    let limiter = PostgresGcraLimiter::new(pool).with_observer(cleanups.clone());
    let mut admin = db.connection().await;
    let short = gcra("promise.cleanup", 1, 50, 1);
    for n in 1..=2 {
        assert!(limiter.check(&gcra_check(&short, subject(41, n))).await.unwrap().permits_request());
    }
    tokio::time::sleep(Duration::from_millis(120)).await;
    let (rows, watermark) = gcra_shard_41(&mut admin).await;
    assert_eq!((gcra_rows(&mut admin).await, rows), (2, 2));

    // NoEffect: discovery ran and locked shard 41; the DELETE never reaches the server.
    proxy.arm(Cut::BeforeForwarding(b"DELETE FROM public.runlimit_gcra"));
    let error = limiter.cleanup_expired(5).await.unwrap_err();
    assert!(
        matches!(
            &error,
            MaintenanceError::Database { phase: MaintenancePhase::Delete, source } if sqlstate(source).is_none()
        ),
        "{error:?}"
    );
    assert!(!error.may_have_removed_rows());
    assert_eq!(cleanups.take(), [(CleanupOutcome::NoEffect, 5)]);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(gcra_rows(&mut admin).await, 2);
    assert_eq!(gcra_shard_41(&mut admin).await, (2, watermark), "nothing removed, watermark unchanged");

    // Unknown: the COMMIT is forwarded, its answer never comes back.
    proxy.arm(Cut::AfterForwarding(b"COMMIT;"));
    let error = limiter.cleanup_expired(6).await.unwrap_err();
    assert!(matches!(error, MaintenanceError::CommitOutcomeUnknown { .. }), "{error:?}");
    assert!(error.may_have_removed_rows());
    assert_eq!(cleanups.take(), [(CleanupOutcome::Unknown, 6)]);
    // The server did commit: both rows are gone, their slots freed, the watermark advanced.
    settled_server(&mut admin).await;
    assert_eq!(gcra_rows(&mut admin).await, 0);
    let (rows, advanced) = gcra_shard_41(&mut admin).await;
    assert_eq!(rows, 0);
    assert!(advanced > watermark, "watermark {watermark} → {advanced}");
    assert_eq!(limiter.cleanup_expired(7).await.unwrap(), 0);
    assert_eq!(cleanups.take(), [(CleanupOutcome::Removed { count: 0 }, 7)]);
    drop(admin);
    db.finish().await;
}

/// With the `serde` feature: live PostgreSQL backend instances (limiters, receipts, claims)
/// implement no serde trait, while their configuration does. Checked at compile time; the
/// test below runs the positive side too and needs no database.
#[cfg(feature = "serde")]
mod serde_traits {
    use ::serde::{Deserialize, Serialize, de::DeserializeOwned};
    use runlimit_postgres::{
        PostgresConfig, PostgresGcraLimiter, PostgresLimiter,
        attempts::{AttemptClaim, PostgresAttemptLimiter, PostgresAttemptReceipt},
    };
    use static_assertions::{assert_impl_all, assert_not_impl_any};

    assert_impl_all!(PostgresConfig: Serialize, DeserializeOwned);
    assert_not_impl_any!(PostgresLimiter: Serialize, DeserializeOwned, Deserialize<'static>);
    assert_not_impl_any!(PostgresGcraLimiter: Serialize, DeserializeOwned, Deserialize<'static>);
    assert_not_impl_any!(PostgresAttemptLimiter: Serialize, DeserializeOwned, Deserialize<'static>);
    assert_not_impl_any!(PostgresAttemptReceipt: Serialize, DeserializeOwned, Deserialize<'static>);
    assert_not_impl_any!(AttemptClaim: Serialize, DeserializeOwned, Deserialize<'static>);

    #[test]
    fn live_postgres_instances_implement_no_serde_traits_but_the_config_does() {
        let config = PostgresConfig::default();
        let json = serde_json::to_string(&config).expect("serialize the config");
        assert_eq!(serde_json::from_str::<PostgresConfig>(&json).expect("deserialize the config"), config);
    }
}
