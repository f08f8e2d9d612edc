//! Peeks and resets against the real server: a peek writes nothing (row versions, ledger and
//! table contents are byte-identical afterwards, and a fresh key gets no row), a reset keeps
//! the capacity ledger equal to the rows it counts, and each reset is one observation.

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use runlimit_core::{
    Check, GcraPolicy, Observation, Observer, PolicyId, QuotaControl, ResetOutcome, ScopeId,
};
use sqlx::PgConnection;

use crate::support::*;

/// Every reset observation: `policy/scope` and outcome.
#[derive(Clone, Default)]
struct Resets(Arc<Mutex<Vec<(String, ResetOutcome)>>>);

impl Observer for Resets {
    fn observe(&self, observation: &Observation<'_>) {
        if let Observation::Reset(reset) = observation {
            let name = format!("{}/{}", reset.policy().id(), reset.policy().scope());
            self.0.lock().unwrap().push((name, reset.outcome()));
        }
    }
}

impl Resets {
    fn take(&self) -> Vec<(String, ResetOutcome)> {
        std::mem::take(&mut *self.0.lock().unwrap())
    }
}

/// Every row of `table` with its row version (`xmin`, `ctid`) as text, in a stable order: any
/// write, even one rewriting a row with the same values, changes it.
async fn versions(connection: &mut PgConnection, table: &str, order: &str) -> Vec<String> {
    let sql = format!(
        "SELECT (t.xmin::text || ' ' || t.ctid::text || ' ' || t::text) FROM {table} AS t ORDER BY {order}"
    );
    sqlx::query_scalar(sqlx::AssertSqlSafe(sql)).fetch_all(connection).await.expect("read row versions")
}

async fn fixed_window_state(connection: &mut PgConnection) -> (Vec<String>, Vec<String>) {
    (
        versions(connection, "public.runlimit_fixed_windows", "t.counter_key").await,
        versions(connection, "public.runlimit_fixed_window_shards", "t.shard").await,
    )
}

async fn gcra_state(connection: &mut PgConnection) -> (Vec<String>, Vec<String>) {
    let ledger = gcra_ledger_table(connection).await;
    (
        versions(connection, "public.runlimit_gcra", "t.counter_key").await,
        versions(connection, ledger, "t.shard").await,
    )
}

/// Rows of `table` in capacity shard `shard`.
async fn rows_in_shard(connection: &mut PgConnection, table: &str, shard: i16) -> i64 {
    let sql = format!("SELECT count(*) FROM {table} WHERE capacity_shard = $1");
    sqlx::query_scalar(sqlx::AssertSqlSafe(sql)).bind(shard).fetch_one(connection).await.expect("count rows")
}

async fn gcra_ledger_count(connection: &mut PgConnection, shard: i16) -> i32 {
    let ledger = gcra_ledger_table(connection).await;
    let sql = format!("SELECT row_count FROM {ledger} WHERE shard = $1");
    sqlx::query_scalar(sqlx::AssertSqlSafe(sql)).bind(shard).fetch_one(connection).await.expect("read ledger")
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

#[tokio::test]
#[ignore = "needs RUNLIMIT_POSTGRES_TEST_DATABASE_URL"]
async fn fixed_window_peeks_write_nothing() {
    let db = TestDatabase::create("peek_fixed_window").await;
    let limiter = db.limiter(2).await;
    let policy = policy("control.peek", 5, Duration::from_secs(60));
    let (stored, fresh) = (subject(7, 1), subject(7, 2));
    assert!(limiter.check(&check(&policy, stored).with_cost(2).unwrap()).await.unwrap().permits_request());
    let mut connection = db.connection().await;
    let before = fixed_window_state(&mut connection).await;
    for _ in 0..3 {
        let read = limiter.peek(stored.bind(&policy)).await.unwrap();
        assert_eq!(read.available(), 3);
        let read = QuotaControl::peek(&limiter, fresh.bind(&policy)).await.unwrap();
        assert!(read.is_full());
    }
    assert_eq!(fixed_window_state(&mut connection).await, before, "a peek changed a row or the ledger");
    assert_eq!(stored_used(&mut connection, &check(&policy, fresh)).await, None);
    assert_eq!(ledger_count(&mut connection, 7).await, 1);
    db.finish().await;
}

#[tokio::test]
#[ignore = "needs RUNLIMIT_POSTGRES_TEST_DATABASE_URL"]
async fn gcra_peeks_write_nothing() {
    for row_locks in [false, true] {
        gcra_peek_writes_nothing(row_locks).await;
    }
}

async fn gcra_peek_writes_nothing(row_locks: bool) {
    let db = TestDatabase::create(if row_locks { "peek_gcra_row_locks" } else { "peek_gcra" }).await;
    let limiter = gcra_limiter_on(db.pool(2).await, row_locks).await;
    let policy = gcra("control.peek", 1, 60_000, 3);
    let (stored, fresh) = (subject(9, 1), subject(9, 2));
    assert!(limiter.check(&Check::new(stored.bind(&policy))).await.unwrap().permits_request());
    let mut connection = db.connection().await;
    let before = gcra_state(&mut connection).await;
    for _ in 0..3 {
        assert_eq!(limiter.peek(stored.bind(&policy)).await.unwrap().available(), 2);
        assert!(limiter.peek(fresh.bind(&policy)).await.unwrap().is_full());
    }
    assert_eq!(gcra_state(&mut connection).await, before, "a peek changed a row, the ledger or a watermark");
    assert_eq!(gcra_ledger_count(&mut connection, 9).await, 1);
    db.finish().await;
}

#[tokio::test]
#[ignore = "needs RUNLIMIT_POSTGRES_TEST_DATABASE_URL"]
async fn fixed_window_resets_keep_the_ledger_exact_and_are_observed_once() {
    let db = TestDatabase::create("reset_fixed_window").await;
    let resets = Resets::default();
    let limiter = db
        .limiter_with(2, config().with_maximum_rows_per_shard(3).unwrap())
        .await
        .with_observer(resets.clone());
    let policy = policy("control.reset", 2, Duration::from_secs(60));
    let keys: Vec<_> = (1..=4).map(|n| subject(7, n)).collect();
    for key in &keys[..3] {
        assert!(limiter.check(&check(&policy, *key)).await.unwrap().permits_request());
    }
    assert!(!limiter.check(&check(&policy, keys[3])).await.unwrap().permits_request(), "the shard is full");
    let mut connection = db.connection().await;
    let table = "public.runlimit_fixed_windows";
    assert_eq!(
        (ledger_count(&mut connection, 7).await, rows_in_shard(&mut connection, table, 7).await),
        (3, 3)
    );

    assert!(limiter.reset(keys[1].bind(&policy)).await.unwrap());
    assert_eq!(resets.take(), [("control.reset/subject".to_owned(), ResetOutcome::Removed)]);
    assert_eq!(
        (ledger_count(&mut connection, 7).await, rows_in_shard(&mut connection, table, 7).await),
        (2, 2)
    );
    assert_eq!(stored_used(&mut connection, &check(&policy, keys[1])).await, None);
    assert!(!limiter.reset(keys[1].bind(&policy)).await.unwrap());
    assert_eq!(resets.take(), [("control.reset/subject".to_owned(), ResetOutcome::NothingStored)]);
    assert_eq!(ledger_count(&mut connection, 7).await, 2);

    // The freed slot admits the new key; the shard is full again.
    assert!(limiter.check(&check(&policy, keys[3])).await.unwrap().permits_request());
    assert!(!limiter.check(&check(&policy, keys[1])).await.unwrap().permits_request());
    assert_eq!(
        (ledger_count(&mut connection, 7).await, rows_in_shard(&mut connection, table, 7).await),
        (3, 3)
    );
    let total: i64 = sqlx::query_scalar("SELECT sum(row_count) FROM public.runlimit_fixed_window_shards")
        .fetch_one(&mut connection)
        .await
        .unwrap();
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM public.runlimit_fixed_windows")
        .fetch_one(&mut connection)
        .await
        .unwrap();
    assert_eq!(total, rows);
    db.finish().await;
}

#[tokio::test]
#[ignore = "needs RUNLIMIT_POSTGRES_TEST_DATABASE_URL"]
async fn gcra_resets_keep_the_ledger_exact_and_are_observed_once() {
    for row_locks in [false, true] {
        gcra_resets_keep_the_ledger_exact(row_locks).await;
    }
}

async fn gcra_resets_keep_the_ledger_exact(row_locks: bool) {
    let db = TestDatabase::create(if row_locks { "reset_gcra_row_locks" } else { "reset_gcra" }).await;
    let resets = Resets::default();
    let limiter = gcra_limiter_on(db.pool(2).await, row_locks)
        .await
        .with_config(config().with_maximum_rows_per_shard(2).unwrap())
        .with_observer(resets.clone());
    let policy = gcra("control.reset", 1, 60_000, 1);
    let keys: Vec<_> = (1..=3).map(|n| subject(200, n)).collect();
    for key in &keys[..2] {
        assert!(limiter.check(&Check::new(key.bind(&policy))).await.unwrap().permits_request());
    }
    assert!(!limiter.check(&Check::new(keys[2].bind(&policy))).await.unwrap().permits_request());
    let mut connection = db.connection().await;
    let table = "public.runlimit_gcra";
    assert_eq!(
        (gcra_ledger_count(&mut connection, 200).await, rows_in_shard(&mut connection, table, 200).await),
        (2, 2)
    );

    assert!(limiter.reset(keys[0].bind(&policy)).await.unwrap());
    assert!(!limiter.reset(keys[0].bind(&policy)).await.unwrap());
    assert_eq!(
        resets.take(),
        [
            ("control.reset/subject".to_owned(), ResetOutcome::Removed),
            ("control.reset/subject".to_owned(), ResetOutcome::NothingStored),
        ]
    );
    assert_eq!(
        (gcra_ledger_count(&mut connection, 200).await, rows_in_shard(&mut connection, table, 200).await),
        (1, 1)
    );
    // The subject is rested again, and the freed slot takes the refused key.
    assert!(limiter.peek(keys[0].bind(&policy)).await.unwrap().is_full());
    assert!(limiter.check(&Check::new(keys[2].bind(&policy))).await.unwrap().permits_request());
    assert_eq!(
        (gcra_ledger_count(&mut connection, 200).await, rows_in_shard(&mut connection, table, 200).await),
        (2, 2)
    );
    db.finish().await;
}
