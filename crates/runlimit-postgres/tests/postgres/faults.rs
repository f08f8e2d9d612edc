//! Faults: killed backends, lock contention, pool exhaustion, hostile search paths, lost
//! acknowledgements.

use std::time::Duration;

use runlimit_core::{ConsumptionStatus, DecisionView, Denial};
use runlimit_postgres::{BatchCheckError, CheckError, CheckPhase, MaintenanceError, PostgresLimiter};
use sqlx::postgres::PgPoolOptions;

use crate::support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs RUNLIMIT_POSTGRES_TEST_DATABASE_URL"]
async fn a_backend_terminated_before_commit_consumes_nothing() {
    let db = TestDatabase::create("terminated_backend").await;
    let limiter = db.limiter(2).await;
    let policy = policy("faults.terminate", 5, Duration::from_secs(60));
    let check = check(&policy, subject(11, 1));
    assert!(limiter.check(&check).await.unwrap().permits_request());

    // An unrelated session row-locks the counter, so the check blocks in its preflight.
    let mut holder = db.connection().await;
    let holder_pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()").fetch_one(&mut holder).await.unwrap();
    sqlx::raw_sql("BEGIN").execute(&mut holder).await.unwrap();
    sqlx::query("SELECT used FROM public.runlimit_fixed_windows WHERE counter_key = $1 FOR UPDATE")
        .bind(check.counter_key().to_bytes().as_slice())
        .fetch_one(&mut holder)
        .await
        .unwrap();
    let pending = {
        let limiter = limiter.clone();
        let key = check.counter_key();
        let policy = policy.clone();
        tokio::spawn(async move {
            let check = runlimit_core::Check::new(key.subject().bind(&policy));
            limiter.check(&check).await
        })
    };
    let mut observer = db.connection().await;
    let victim = waiting_backend(&mut observer, &db.name, holder_pid).await;
    let terminated: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1)")
        .bind(victim)
        .fetch_one(&mut observer)
        .await
        .unwrap();
    assert!(terminated);
    let error = pending.await.unwrap().unwrap_err();
    assert!(matches!(error, CheckError::Database { phase: CheckPhase::Preflight, .. }), "{error:?}");
    assert_eq!(sqlstate(&error).as_deref(), Some("57P01"));
    assert_eq!(error.consumption(), ConsumptionStatus::NotConsumed);
    assert_eq!(error.to_string(), "database failure in the preflight phase");
    sqlx::raw_sql("ROLLBACK").execute(&mut holder).await.unwrap();
    assert_eq!(stored_used(&mut observer, &check).await, Some(1));
    // The pool replaced the dead connection.
    assert!(limiter.check(&check).await.unwrap().permits_request());
    assert_eq!(stored_used(&mut observer, &check).await, Some(2));
    db.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs RUNLIMIT_POSTGRES_TEST_DATABASE_URL"]
async fn an_unrelated_advisory_lock_holder_times_the_check_out_in_the_lock_phase() {
    let db = TestDatabase::create("advisory_holder").await;
    let timeout = Duration::from_millis(300);
    let limiter = db.limiter_with(2, config().with_operation_timeout(timeout).unwrap()).await;
    let policy = policy("faults.advisory", 5, Duration::from_secs(60));
    let check = check(&policy, subject(12, 1));

    // The documented lock-id derivation, computed by PostgreSQL itself.
    let mut holder = db.connection().await;
    sqlx::query(
        "SELECT pg_advisory_lock(('x' || encode(substr(sha256('runlimit/postgres/fixed-window-lock/v1'::bytea || $1), 1, 8), 'hex'))::bit(64)::bigint)",
    )
    .bind(check.counter_key().to_bytes().as_slice())
    .execute(&mut holder)
    .await
    .unwrap();

    let error = limiter.check(&check).await.unwrap_err();
    assert!(
        matches!(error, CheckError::Timeout { phase: CheckPhase::Lock, timeout: t } if t == timeout),
        "{error:?}"
    );
    assert_eq!(error.consumption(), ConsumptionStatus::NotConsumed);
    assert_eq!(error.phase(), Some(CheckPhase::Lock));
    assert_eq!(error.to_string(), "operation timed out after 300ms in the lock phase");
    let other = check_for(&policy, 13);
    let batch_error = limiter.check_all(&[other, check]).await.unwrap_err();
    assert!(
        matches!(batch_error, BatchCheckError::Check(CheckError::Timeout { phase: CheckPhase::Lock, .. })),
        "{batch_error:?}"
    );
    let mut observer = db.connection().await;
    assert_eq!(stored_used(&mut observer, &check).await, None);
    assert_eq!(stored_used(&mut observer, &other).await, None);

    sqlx::raw_sql("SELECT pg_advisory_unlock_all()").execute(&mut holder).await.unwrap();
    assert!(limiter.check_all(&[other, check]).await.unwrap().permits_request());
    db.finish().await;
}

fn check_for(
    policy: &runlimit_core::FixedWindowPolicy,
    n: u64,
) -> runlimit_core::Check<'_, runlimit_core::FixedWindowPolicy> {
    check(policy, subject(12, n))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs RUNLIMIT_POSTGRES_TEST_DATABASE_URL"]
async fn pool_exhaustion_hits_the_pool_acquire_timeout() {
    let db = TestDatabase::create("pool_exhaustion").await;
    let timeout = Duration::from_millis(200);
    let limiter = db.limiter_with(1, config().with_pool_acquire_timeout(timeout).unwrap()).await;
    let policy = policy("faults.pool", 5, Duration::from_secs(60));
    let check = check(&policy, subject(14, 1));

    let held = limiter.pool().acquire().await.unwrap();
    let error = limiter.check(&check).await.unwrap_err();
    assert!(matches!(error, CheckError::PoolTimeout { timeout: t } if t == timeout), "{error:?}");
    assert_eq!(error.consumption(), ConsumptionStatus::NotConsumed);
    assert_eq!(error.to_string(), "timed out after 200ms waiting for a pooled connection");
    let cleanup = limiter.cleanup_expired(10).await.unwrap_err();
    assert!(matches!(cleanup, MaintenanceError::PoolTimeout { .. }), "{cleanup:?}");
    assert!(!cleanup.may_have_removed_rows());
    drop(held);
    assert!(limiter.check(&check).await.unwrap().permits_request());

    // A closed pool is an acquisition failure, not a timeout.
    limiter.pool().close().await;
    let closed = limiter.check(&check).await.unwrap_err();
    assert!(matches!(closed, CheckError::Acquire { source: sqlx::Error::PoolClosed }), "{closed:?}");
    db.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs RUNLIMIT_POSTGRES_TEST_DATABASE_URL"]
async fn a_hostile_search_path_changes_nothing() {
    let db = TestDatabase::create("hostile_search_path").await;
    db.limiter(1).await; // migrate with a normal search_path
    let mut admin = db.connection().await;
    sqlx::raw_sql(
        "CREATE SCHEMA hostile; \
         CREATE FUNCTION hostile.clock_timestamp() RETURNS timestamptz LANGUAGE sql \
             AS $$ SELECT timestamptz '2000-01-01 00:00:00+00' $$; \
         CREATE FUNCTION hostile.pg_advisory_xact_lock(bigint) RETURNS void LANGUAGE sql AS $$ SELECT $$; \
         CREATE FUNCTION hostile.always_equal(bytea, bytea) RETURNS boolean LANGUAGE sql AS $$ SELECT true $$; \
         CREATE OPERATOR hostile.= (LEFTARG = bytea, RIGHTARG = bytea, FUNCTION = hostile.always_equal); \
         CREATE TABLE hostile.runlimit_fixed_windows (LIKE public.runlimit_fixed_windows); \
         CREATE TABLE hostile.runlimit_fixed_window_shards (LIKE public.runlimit_fixed_window_shards);",
    )
    .execute(&mut admin)
    .await
    .unwrap();
    let options = db.options.clone().options([("search_path", "hostile, public, pg_catalog")]);
    let pool = db.pool_with(PgPoolOptions::new().max_connections(2), options).await;
    // The hostile path is in force on the pool's sessions.
    let unqualified: f64 = sqlx::query_scalar("SELECT EXTRACT(EPOCH FROM clock_timestamp())::float8")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(unqualified, 946_684_800.0);

    let limiter = PostgresLimiter::new(pool);
    let window = Duration::from_secs(60);
    let policy = policy("faults.hostile", 1, window);
    let a = check(&policy, subject(15, 1));
    let b = check(&policy, subject(15, 2));
    let first = limiter.check(&a).await.unwrap();
    let DecisionView::Allowed { allowance } = first.view() else { panic!("{first:?}") };
    assert_eq!(allowance.replenishes_after().duration(), window);
    // A hostile `=` would make b's preflight find a's row; a hostile clock would anchor in 2000.
    assert!(limiter.check(&b).await.unwrap().permits_request());
    let denied = limiter.check(&a).await.unwrap();
    let DecisionView::Denied { denial: Denial::QuotaExceeded(quota) } = denied.view() else {
        panic!("{denied:?}")
    };
    assert!(
        quota.retry_after().duration() <= window && quota.retry_after().duration() > Duration::from_secs(50)
    );
    let anchored_recently: bool = sqlx::query_scalar(
        "SELECT bool_and(abs(EXTRACT(EPOCH FROM window_started_at - pg_catalog.now())) < 60) FROM public.runlimit_fixed_windows",
    )
    .fetch_one(&mut admin)
    .await
    .unwrap();
    assert!(anchored_recently);
    let hostile_rows: i64 = sqlx::query_scalar("SELECT count(*) FROM hostile.runlimit_fixed_windows")
        .fetch_one(&mut admin)
        .await
        .unwrap();
    assert_eq!(hostile_rows, 0);
    assert_eq!(ledger_count(&mut admin, 15).await, 2);
    // Cleanup runs under the same hostile path.
    assert_eq!(limiter.cleanup_expired(10).await.unwrap(), 0);
    db.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs RUNLIMIT_POSTGRES_TEST_DATABASE_URL"]
async fn a_read_only_denial_survives_a_failed_rollback() {
    let db = TestDatabase::create("failed_rollback").await;
    db.limiter(1).await;
    let proxy = Proxy::start(&db.options).await;
    let pool = db.pool_with(PgPoolOptions::new().max_connections(1), proxy.options(&db.options)).await;
    let limiter = PostgresLimiter::new(pool);
    let policy = policy("faults.rollback", 1, Duration::from_secs(60));
    let check = check(&policy, subject(16, 1));
    assert!(limiter.check(&check).await.unwrap().permits_request());

    proxy.arm(Cut::BeforeForwarding(b"ROLLBACK"));
    let denied = limiter.check(&check).await.unwrap();
    assert!(matches!(denied.view(), DecisionView::Denied { denial: Denial::QuotaExceeded(_) }), "{denied:?}");
    // The connection was discarded; the pool opens a new one and the state is intact.
    let again = limiter.check(&check).await.unwrap();
    assert!(matches!(again.view(), DecisionView::Denied { denial: Denial::QuotaExceeded(_) }), "{again:?}");
    let mut observer = db.connection().await;
    assert_eq!(stored_used(&mut observer, &check).await, Some(1));
    db.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs RUNLIMIT_POSTGRES_TEST_DATABASE_URL"]
async fn a_lost_commit_acknowledgement_may_have_consumed() {
    let db = TestDatabase::create("lost_commit").await;
    db.limiter(1).await;
    let proxy = Proxy::start(&db.options).await;
    let pool = db.pool_with(PgPoolOptions::new().max_connections(1), proxy.options(&db.options)).await;
    let limiter = PostgresLimiter::new(pool);
    let policy = policy("faults.commit", 5, Duration::from_secs(60));
    let check = check(&policy, subject(17, 1));
    assert!(limiter.check(&check).await.unwrap().permits_request());

    proxy.arm(Cut::AfterForwarding(b"COMMIT;"));
    let error = limiter.check(&check).await.unwrap_err();
    assert!(matches!(error, CheckError::CommitOutcomeUnknown { .. }), "{error:?}");
    assert_eq!(error.consumption(), ConsumptionStatus::MayHaveBeenConsumed);
    assert_eq!(error.to_string(), "commit outcome unknown");
    // Here the server did commit: the unknown outcome was a consumption, which is why it is
    // never replayed automatically.
    let mut observer = db.connection().await;
    settled_server(&mut observer).await;
    assert_eq!(stored_used(&mut observer, &check).await, Some(2));
    db.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs RUNLIMIT_POSTGRES_TEST_DATABASE_URL"]
async fn a_write_that_misses_a_row_fails_before_commit() {
    // The update and insert statements verify their own row counts, so a write that does not
    // touch every planned row raises an error and the COMMIT sent after it never runs.
    let db = TestDatabase::create("write_verification").await;
    db.limiter(1).await;
    let mut connection = db.connection().await;
    let absent = format!("pg_catalog.decode('{}', 'hex')", "ab".repeat(64));
    let update = include_str!("../../src/sql/fixed_window_update.sql")
        .replace("{updates}", &format!("({absent}, false, 1::bigint, 1000::bigint)"))
        .replace("{now_us}", "0")
        .replace("{expected}", "1");
    let error = sqlx::raw_sql(sqlx::AssertSqlSafe(format!("BEGIN; {update} COMMIT;")))
        .execute(&mut connection)
        .await
        .unwrap_err();
    assert_eq!(sqlstate(&error).as_deref(), Some("22P02"));
    assert_eq!(
        error.as_database_error().unwrap().message(),
        "invalid input syntax for type integer: \"runlimit: a locked counter row was not updated\""
    );
    sqlx::raw_sql("ROLLBACK").execute(&mut connection).await.unwrap();
    let insert = include_str!("../../src/sql/fixed_window_insert.sql")
        .replace("{inserts}", &format!("({absent}, 1::bigint, 1000::bigint)"))
        .replace("{now_us}", "0")
        .replace("{expected}", "2");
    let error = sqlx::raw_sql(sqlx::AssertSqlSafe(format!("BEGIN; {insert} COMMIT;")))
        .execute(&mut connection)
        .await
        .unwrap_err();
    assert_eq!(sqlstate(&error).as_deref(), Some("22P02"));
    sqlx::raw_sql("ROLLBACK").execute(&mut connection).await.unwrap();
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM public.runlimit_fixed_windows")
        .fetch_one(&mut connection)
        .await
        .unwrap();
    assert_eq!(rows, 0);
    db.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs RUNLIMIT_POSTGRES_TEST_DATABASE_URL"]
async fn the_admission_functions_verify_their_rows_and_arguments_before_commit() {
    // The write functions raise P0004 when a row they must write is missing, so the COMMIT
    // sent after them never runs; malformed arguments raise 22023 before anything is touched.
    let db = TestDatabase::create("function_verification").await;
    db.limiter(1).await;
    runlimit_postgres::PostgresGcraLimiter::new(db.pool(1).await).migrate().await.unwrap();
    let mut connection = db.connection().await;
    let absent = "ab".repeat(64);
    let failures = [
        (
            format!(
                "SELECT public.runlimit_fixed_window_write(0::bigint, '{absent}'::pg_catalog.text, \
                 '{{true}}'::boolean[], '{{1}}'::bigint[], '{{1000}}'::bigint[])"
            ),
            "P0004",
            "runlimit: a locked counter row was not updated",
        ),
        (
            "SELECT * FROM public.runlimit_fixed_window_reserve('abc'::pg_catalog.text, '{1}'::bigint[], '{}'::smallint[])"
                .to_owned(),
            "22023",
            "runlimit: invalid fixed-window reserve arguments",
        ),
        (
            format!(
                "SELECT * FROM public.runlimit_fixed_window_reserve('{absent}'::pg_catalog.text, '{{0}}'::bigint[], \
                 '{{}}'::smallint[])"
            ),
            "22023",
            "runlimit: invalid fixed-window cost",
        ),
        (
            format!(
                "SELECT public.runlimit_fixed_window_write(0::bigint, '{absent}'::pg_catalog.text, \
                 '{{true,false}}'::boolean[], '{{1}}'::bigint[], '{{1000}}'::bigint[])"
            ),
            "22023",
            "runlimit: invalid fixed-window write arguments",
        ),
    ];
    for (call, code, message) in failures {
        let error = sqlx::raw_sql(sqlx::AssertSqlSafe(format!("BEGIN; {call}; COMMIT;")))
            .execute(&mut connection)
            .await
            .unwrap_err();
        assert_eq!(sqlstate(&error).as_deref(), Some(code), "{call}");
        assert_eq!(error.as_database_error().unwrap().message(), message, "{call}");
        sqlx::raw_sql("ROLLBACK").execute(&mut connection).await.unwrap();
    }
    // The prepared GCRA write verifies its row counts the same way: a stored row it must
    // update that is missing fails the statement before COMMIT.
    sqlx::raw_sql(include_str!("../../src/sql/gcra_prepare_write.sql"))
        .execute(&mut connection)
        .await
        .unwrap();
    let error = sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "BEGIN; EXECUTE runlimit_gcra_write_v1(0::bigint, '{{171}}'::smallint[], \
         ARRAY[pg_catalog.decode('{absent}', 'hex')]::pg_catalog.bytea[], '{{1}}'::bigint[], '{{0}}'::bigint[], \
         '{{1}}'::bigint[]); COMMIT;"
    )))
    .execute(&mut connection)
    .await
    .unwrap_err();
    assert_eq!(sqlstate(&error).as_deref(), Some("22P02"));
    assert_eq!(
        error.as_database_error().unwrap().message(),
        "invalid input syntax for type integer: \"runlimit: a locked gcra row was not written\""
    );
    sqlx::raw_sql("ROLLBACK").execute(&mut connection).await.unwrap();
    // The provisional increment of a stored counter reports the counter as it was.
    let key = "cd".repeat(64);
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "BEGIN; SELECT public.runlimit_fixed_window_write(1000000::bigint, '{key}'::pg_catalog.text, \
         '{{false}}'::boolean[], '{{4}}'::bigint[], '{{60000}}'::bigint[]); COMMIT;"
    )))
    .execute(&mut connection)
    .await
    .unwrap();
    let (used, expires_us): (Vec<Option<i64>>, Vec<Option<i64>>) = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT used, expires_us FROM public.runlimit_fixed_window_reserve('{key}{absent}'::pg_catalog.text, \
         '{{3,1}}'::bigint[], '{{}}'::smallint[])"
    )))
    .fetch_one(&mut connection)
    .await
    .unwrap();
    assert_eq!(used, [Some(4), None]);
    assert_eq!(expires_us, [Some(61_000_000), None]);
    // That statement autocommitted its increment: 4 + 3.
    let stored: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT used FROM public.runlimit_fixed_windows WHERE counter_key = pg_catalog.decode('{key}', 'hex')"
    )))
    .fetch_one(&mut connection)
    .await
    .unwrap();
    assert_eq!(stored, 7);
    // An increment past bigint is not made: the counter is read (and row-locked) unchanged.
    let full = "ef".repeat(64);
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "BEGIN; SELECT public.runlimit_fixed_window_write(1000000::bigint, '{full}'::pg_catalog.text, \
         '{{false}}'::boolean[], '{{9223372036854775806}}'::bigint[], '{{60000}}'::bigint[]); COMMIT;"
    )))
    .execute(&mut connection)
    .await
    .unwrap();
    let (used,): (Vec<Option<i64>>,) = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT used FROM public.runlimit_fixed_window_reserve('{full}'::pg_catalog.text, '{{5}}'::bigint[], \
         '{{}}'::smallint[])"
    )))
    .fetch_one(&mut connection)
    .await
    .unwrap();
    assert_eq!(used, [Some(9_223_372_036_854_775_806)]);
    let stored: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT used FROM public.runlimit_fixed_windows WHERE counter_key = pg_catalog.decode('{full}', 'hex')"
    )))
    .fetch_one(&mut connection)
    .await
    .unwrap();
    assert_eq!(stored, 9_223_372_036_854_775_806);
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM public.runlimit_gcra")
        .fetch_one(&mut connection)
        .await
        .unwrap();
    assert_eq!(rows, 0);
    db.finish().await;
}
