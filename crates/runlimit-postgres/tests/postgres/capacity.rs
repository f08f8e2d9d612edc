//! Hard-bounded cardinality: capacity shards, the ledger, cleanup.

use std::time::Duration;

use runlimit_core::{BatchDecisionView, DecisionView, Denial};

use crate::support::*;

const CLEANUP_SQL: &str = include_str!("../../src/sql/fixed_window_cleanup.sql");

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs RUNLIMIT_POSTGRES_TEST_DATABASE_URL"]
async fn full_shards_deny_new_keys_and_cleanup_frees_slots() {
    let db = TestDatabase::create("tiny_shards").await;
    let limiter = db.limiter_with(4, config().with_maximum_rows_per_shard(2).unwrap()).await;
    let window = Duration::from_millis(600);
    let policy = policy("capacity.tiny", 5, window);
    let (k1, k2, k3) =
        (check(&policy, subject(7, 1)), check(&policy, subject(7, 2)), check(&policy, subject(7, 3)));
    let elsewhere = check(&policy, subject(8, 1));
    let mut connection = db.connection().await;

    assert!(limiter.check(&k1).await.unwrap().permits_request());
    assert!(limiter.check(&k2).await.unwrap().permits_request());
    assert_eq!(ledger_count(&mut connection, 7).await, 2);
    let full = limiter.check(&k3).await.unwrap();
    assert_eq!(full.view(), DecisionView::Denied { denial: &Denial::StorageCapacity { retry_after: None } });
    assert_eq!(stored_used(&mut connection, &k3).await, None);
    // Existing keys in the full shard keep working; other shards have their own headroom.
    let again = limiter.check(&k1).await.unwrap();
    let DecisionView::Allowed { allowance } = again.view() else { panic!("{again:?}") };
    assert_eq!(allowance.available(), 3);
    assert!(limiter.check(&elsewhere).await.unwrap().permits_request());
    // A batch's new keys count against the shard together: one slot in shard 8 is left.
    let batch = [check(&policy, subject(8, 2)), check(&policy, subject(8, 3))];
    let denied = limiter.check_all(&batch).await.unwrap();
    assert_eq!(
        denied.view(),
        BatchDecisionView::Denied {
            index: 1,
            batch_size: 2,
            denial: &Denial::StorageCapacity { retry_after: None }
        }
    );
    assert_eq!(ledger_count(&mut connection, 8).await, 1);

    // Expiry alone frees nothing; cleanup does. Live rows are never evicted.
    tokio::time::sleep(window + Duration::from_millis(100)).await;
    assert!(!limiter.check(&k3).await.unwrap().permits_request());
    assert_eq!(limiter.cleanup_expired(10).await.unwrap(), 3);
    assert_eq!(ledger_count(&mut connection, 7).await, 0);
    assert_eq!(ledger_count(&mut connection, 8).await, 0);
    assert!(limiter.check(&k3).await.unwrap().permits_request());
    assert_eq!(limiter.cleanup_expired(10).await.unwrap(), 0);
    assert_eq!(ledger_count(&mut connection, 7).await, 1);
    db.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs RUNLIMIT_POSTGRES_TEST_DATABASE_URL"]
async fn cleanup_deletes_at_most_its_bound_oldest_first_with_an_index_range_scan() {
    let db = TestDatabase::create("cleanup_bound").await;
    let limiter = db.limiter(4).await;
    let mut connection = db.connection().await;
    // Five expired rows (oldest first: 5, 4, 3, 2, 1 minutes ago) and one live row, in shard 3.
    sqlx::raw_sql(
        "INSERT INTO public.runlimit_fixed_windows (counter_key, used, window_started_at, window_expires_at) \
         SELECT pg_catalog.decode(repeat('00', 32) || '03' || lpad(to_hex(g), 62, '0'), 'hex'), 1, \
                now() - interval '1 hour', now() - g * interval '1 minute' \
         FROM generate_series(1, 5) AS g; \
         INSERT INTO public.runlimit_fixed_windows (counter_key, used, window_started_at, window_expires_at) \
         VALUES (pg_catalog.decode(repeat('00', 32) || '03' || repeat('ff', 31), 'hex'), 1, now(), now() + interval '1 hour');",
    )
    .execute(&mut connection)
    .await
    .unwrap();
    assert_eq!(ledger_count(&mut connection, 3).await, 6);

    assert_eq!(limiter.cleanup_expired(2).await.unwrap(), 2);
    let remaining: Vec<i64> = sqlx::query_scalar(
        "SELECT get_byte(counter_key, 63)::bigint FROM public.runlimit_fixed_windows ORDER BY window_expires_at",
    )
    .fetch_all(&mut connection)
    .await
    .unwrap();
    assert_eq!(remaining, [3, 2, 1, 255]);
    assert_eq!(ledger_count(&mut connection, 3).await, 4);
    assert_eq!(limiter.cleanup_expired(100).await.unwrap(), 3);
    assert_eq!(limiter.cleanup_expired(100).await.unwrap(), 0);
    assert_eq!(limiter.cleanup_expired(0).await.unwrap(), 0);
    assert_eq!(ledger_count(&mut connection, 3).await, 1);

    // One clock sample (an InitPlan) keeps the expiry predicate an index range condition, and
    // the DELETE finds its rows through the primary key. (The table is tiny, so sequential scans
    // are disabled to show which predicates an index can serve.)
    sqlx::raw_sql("SET enable_seqscan = off").execute(&mut connection).await.unwrap();
    let plan: Vec<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "EXPLAIN (COSTS OFF) {}",
        CLEANUP_SQL.replace("{maximum_rows}", "100")
    )))
    .fetch_all(&mut connection)
    .await
    .unwrap();
    let plan = plan.join("\n");
    assert!(plan.contains("Index Scan using runlimit_fixed_windows_expires_at_idx"), "{plan}");
    assert!(plan.contains("Index Cond: (window_expires_at <= $0)"), "{plan}");
    assert!(plan.contains("Index Cond: (counter_key = ANY ($"), "{plan}");
    db.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs RUNLIMIT_POSTGRES_TEST_DATABASE_URL"]
async fn the_database_refuses_a_raw_insert_past_65536_rows_in_one_shard() {
    let db = TestDatabase::create("raw_insert_bound").await;
    let limiter = db.limiter_with(4, config().with_maximum_rows_per_shard(65_536).unwrap()).await;
    let mut connection = db.connection().await;
    let insert = |shard: &str, from: u32, to: u32| {
        format!(
            "INSERT INTO public.runlimit_fixed_windows (counter_key, used, window_started_at, window_expires_at) \
             SELECT pg_catalog.decode(repeat('00', 32) || '{shard}' || lpad(to_hex(g), 62, '0'), 'hex'), 1, \
                    now(), now() + interval '1 hour' \
             FROM generate_series({from}, {to}) AS g"
        )
    };
    // One statement of 65,537 rows is refused as a whole.
    let error = sqlx::raw_sql(sqlx::AssertSqlSafe(insert("09", 1, 65_537)))
        .execute(&mut connection)
        .await
        .unwrap_err();
    assert_eq!(sqlstate(&error).as_deref(), Some("23514"));
    let database = error.as_database_error().unwrap();
    assert_eq!(database.constraint(), Some("runlimit_fixed_window_shards_capacity"));
    assert_eq!(database.message(), "runlimit_fixed_windows capacity shard 9 is full");
    assert_eq!(ledger_count(&mut connection, 9).await, 0);

    // Exactly 65,536 fit; one more, in a separate statement, is refused.
    sqlx::raw_sql(sqlx::AssertSqlSafe(insert("09", 1, 65_536))).execute(&mut connection).await.unwrap();
    assert_eq!(ledger_count(&mut connection, 9).await, 65_536);
    let error = sqlx::raw_sql(sqlx::AssertSqlSafe(insert("09", 65_537, 65_537)))
        .execute(&mut connection)
        .await
        .unwrap_err();
    assert_eq!(sqlstate(&error).as_deref(), Some("23514"));
    // Other shards are unaffected, and the library denies new keys of the full shard.
    sqlx::raw_sql(sqlx::AssertSqlSafe(insert("0a", 1, 1))).execute(&mut connection).await.unwrap();
    let policy = policy("capacity.raw", 1, Duration::from_secs(60));
    let denied = limiter.check(&check(&policy, subject(9, 1))).await.unwrap();
    assert_eq!(
        denied.view(),
        DecisionView::Denied { denial: &Denial::StorageCapacity { retry_after: None } }
    );

    // Deletes and TRUNCATE keep the ledger exact; counter keys cannot move between shards.
    sqlx::raw_sql("DELETE FROM public.runlimit_fixed_windows WHERE capacity_shard = 9 AND get_byte(counter_key, 63) < 16")
        .execute(&mut connection)
        .await
        .unwrap();
    let remaining: i64 =
        sqlx::query_scalar("SELECT count(*) FROM public.runlimit_fixed_windows WHERE capacity_shard = 9")
            .fetch_one(&mut connection)
            .await
            .unwrap();
    assert_eq!(i64::from(ledger_count(&mut connection, 9).await), remaining);
    let error = sqlx::raw_sql(
        "UPDATE public.runlimit_fixed_windows SET counter_key = pg_catalog.decode(repeat('11', 64), 'hex') \
         WHERE capacity_shard = 10",
    )
    .execute(&mut connection)
    .await
    .unwrap_err();
    assert_eq!(sqlstate(&error).as_deref(), Some("23514"));
    sqlx::raw_sql("TRUNCATE public.runlimit_fixed_windows").execute(&mut connection).await.unwrap();
    let total: i64 = sqlx::query_scalar("SELECT sum(row_count) FROM public.runlimit_fixed_window_shards")
        .fetch_one(&mut connection)
        .await
        .unwrap();
    assert_eq!(total, 0);
    db.finish().await;
}
