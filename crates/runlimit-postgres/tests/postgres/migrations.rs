//! Migrations: fresh databases, upgrades, histories shared with a host application.

use std::time::Duration;

use runlimit_postgres::{
    ADD_RUNLIMIT_FIXED_WINDOW_ADMISSION_FUNCTIONS_SQL, BOUND_RUNLIMIT_FIXED_WINDOW_CARDINALITY_SQL,
    CREATE_RUNLIMIT_FIXED_WINDOWS_SQL, MIGRATION_VERSIONS, MIGRATOR, MigrationError, PostgresLimiter,
    SET_RUNLIMIT_FIXED_WINDOWS_FILLFACTOR_SQL,
};
use sqlx::{
    PgConnection, SqlSafeStr,
    migrate::{MigrateError, Migration, MigrationType, Migrator},
};

use crate::support::*;

async fn versions(connection: &mut PgConnection) -> Vec<i64> {
    sqlx::query_scalar("SELECT version FROM _sqlx_migrations ORDER BY version")
        .fetch_all(connection)
        .await
        .unwrap()
}

async fn assert_schema(connection: &mut PgConnection) {
    let shards: i64 = sqlx::query_scalar("SELECT count(*) FROM public.runlimit_fixed_window_shards")
        .fetch_one(&mut *connection)
        .await
        .unwrap();
    assert_eq!(shards, 256);
    let options: Vec<String> = sqlx::query_scalar(
        "SELECT unnest(reloptions) FROM pg_catalog.pg_class WHERE oid = 'public.runlimit_fixed_windows'::regclass",
    )
    .fetch_all(&mut *connection)
    .await
    .unwrap();
    assert_eq!(options, ["fillfactor=80"]);
    let triggers: Vec<String> = sqlx::query_scalar(
        "SELECT tgname::text FROM pg_catalog.pg_trigger \
         WHERE tgrelid = 'public.runlimit_fixed_windows'::regclass AND NOT tgisinternal ORDER BY tgname",
    )
    .fetch_all(&mut *connection)
    .await
    .unwrap();
    assert_eq!(
        triggers,
        [
            "runlimit_fixed_windows_count_deletes",
            "runlimit_fixed_windows_count_inserts",
            "runlimit_fixed_windows_forbid_key_change",
            "runlimit_fixed_windows_reset_ledger"
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs RUNLIMIT_POSTGRES_TEST_DATABASE_URL"]
async fn a_fresh_database_migrates_and_migrating_again_changes_nothing() {
    let db = TestDatabase::create("fresh_migrations").await;
    let limiter = db.limiter(2).await;
    let mut connection = db.connection().await;
    assert_eq!(versions(&mut connection).await, MIGRATION_VERSIONS);
    assert_schema(&mut connection).await;
    let policy = policy("migrations.fresh", 2, Duration::from_secs(60));
    assert!(limiter.check(&check(&policy, subject(1, 1))).await.unwrap().permits_request());

    limiter.migrate().await.unwrap();
    limiter.migrate().await.unwrap();
    assert_eq!(versions(&mut connection).await, MIGRATION_VERSIONS);
    assert_eq!(stored_used(&mut connection, &check(&policy, subject(1, 1))).await, Some(1));
    // No session-level migration lock stays behind in the pool.
    let advisory: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_catalog.pg_locks WHERE locktype = 'advisory' \
         AND database = (SELECT oid FROM pg_catalog.pg_database WHERE datname = current_database())",
    )
    .fetch_one(&mut connection)
    .await
    .unwrap();
    assert_eq!(advisory, 0);
    // The strict migrator is happy when Runlimit owns the history alone.
    MIGRATOR.run(&mut connection).await.unwrap();
    db.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs RUNLIMIT_POSTGRES_TEST_DATABASE_URL"]
async fn upgrading_from_only_the_first_migration_seeds_the_ledger() {
    let db = TestDatabase::create("upgrade_first_only").await;
    let mut connection = db.connection().await;
    let first = Migrator::with_migrations(MIGRATOR.iter().take(1).cloned().collect());
    first.run(&mut connection).await.unwrap();
    assert_eq!(versions(&mut connection).await, MIGRATION_VERSIONS[..1]);
    // Rows written by an old replica: 3 in shard 5, 1 in shard 6.
    sqlx::raw_sql(
        "INSERT INTO public.runlimit_fixed_windows (counter_key, used, window_started_at, window_expires_at) \
         SELECT pg_catalog.decode(repeat('00', 32) || s || lpad(to_hex(g), 62, '0'), 'hex'), 1, now(), now() + interval '1 hour' \
         FROM (VALUES ('05', 1), ('05', 2), ('05', 3), ('06', 4)) AS v (s, g)",
    )
    .execute(&mut connection)
    .await
    .unwrap();

    let limiter = PostgresLimiter::new(db.pool(2).await);
    limiter.migrate().await.unwrap();
    assert_eq!(versions(&mut connection).await, MIGRATION_VERSIONS);
    assert_schema(&mut connection).await;
    assert_eq!(ledger_count(&mut connection, 5).await, 3);
    assert_eq!(ledger_count(&mut connection, 6).await, 1);
    assert_eq!(ledger_count(&mut connection, 7).await, 0);
    let shards: Vec<i16> =
        sqlx::query_scalar("SELECT capacity_shard FROM public.runlimit_fixed_windows ORDER BY 1")
            .fetch_all(&mut connection)
            .await
            .unwrap();
    assert_eq!(shards, [5, 5, 5, 6]);
    let policy = policy("migrations.upgrade", 2, Duration::from_secs(60));
    assert!(limiter.check(&check(&policy, subject(5, 9))).await.unwrap().permits_request());
    assert_eq!(ledger_count(&mut connection, 5).await, 4);
    db.finish().await;
}

fn host_migration(version: i64, description: &'static str, sql: &'static str) -> Migration {
    Migration::new(
        version,
        description.into(),
        MigrationType::Simple,
        sqlx::AssertSqlSafe(sql).into_sql_str(),
        false,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs RUNLIMIT_POSTGRES_TEST_DATABASE_URL"]
async fn a_host_application_shares_the_migration_history() {
    let db = TestDatabase::create("shared_history").await;
    let mut connection = db.connection().await;
    let mut host = Migrator::with_migrations(vec![
        host_migration(1, "create accounts", "CREATE TABLE accounts (id bigint PRIMARY KEY)"),
        host_migration(2, "add email", "ALTER TABLE accounts ADD COLUMN email text"),
    ]);
    host.set_ignore_missing(true);
    host.run(&mut connection).await.unwrap();

    let limiter = PostgresLimiter::new(db.pool(2).await);
    limiter.migrate().await.unwrap();
    host.run(&mut connection).await.unwrap();
    limiter.migrate().await.unwrap();
    let mut expected = vec![1, 2];
    expected.extend(MIGRATION_VERSIONS);
    assert_eq!(versions(&mut connection).await, expected);
    assert_schema(&mut connection).await;

    // Strict migrators fail on a shared history, which is why both sides ignore missing ones.
    let strict = MIGRATOR.run(&mut connection).await.unwrap_err();
    assert!(matches!(strict, MigrateError::VersionMissing(1)), "{strict:?}");
    let mut strict_host = Migrator::with_migrations(host.iter().cloned().collect());
    strict_host.set_ignore_missing(false);
    let strict_host = strict_host.run(&mut connection).await.unwrap_err();
    assert!(
        matches!(strict_host, MigrateError::VersionMissing(v) if v == MIGRATION_VERSIONS[0]),
        "{strict_host:?}"
    );

    // A host migration reusing a Runlimit version with other SQL is a checksum mismatch,
    // reported as a migration error; the failed run leaves no lock behind.
    let mut colliding =
        Migrator::with_migrations(vec![host_migration(MIGRATION_VERSIONS[1], "collide", "SELECT 1")]);
    colliding.set_ignore_missing(true);
    let collision = colliding.run(&mut connection).await.unwrap_err();
    assert!(
        matches!(collision, MigrateError::VersionMismatch(v) if v == MIGRATION_VERSIONS[1]),
        "{collision:?}"
    );
    drop(connection);
    let mut connection = db.connection().await;
    let history: i64 =
        sqlx::query_scalar("SELECT count(*) FROM _sqlx_migrations").fetch_one(&mut connection).await.unwrap();
    assert_eq!(history, 2 + i64::try_from(MIGRATION_VERSIONS.len()).unwrap());
    let policy = policy("migrations.shared", 2, Duration::from_secs(60));
    assert!(limiter.check(&check(&policy, subject(1, 1))).await.unwrap().permits_request());
    db.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs RUNLIMIT_POSTGRES_TEST_DATABASE_URL"]
async fn a_strict_host_can_vendor_the_exported_sql() {
    let db = TestDatabase::create("vendored_sql").await;
    let mut connection = db.connection().await;
    // The host's own strict migrator, with the exported statements under the host's versions.
    let host = Migrator::with_migrations(vec![
        host_migration(100, "runlimit create", CREATE_RUNLIMIT_FIXED_WINDOWS_SQL),
        host_migration(101, "runlimit fillfactor", SET_RUNLIMIT_FIXED_WINDOWS_FILLFACTOR_SQL),
        host_migration(102, "runlimit cardinality", BOUND_RUNLIMIT_FIXED_WINDOW_CARDINALITY_SQL),
        host_migration(
            103,
            "runlimit admission functions",
            ADD_RUNLIMIT_FIXED_WINDOW_ADMISSION_FUNCTIONS_SQL,
        ),
    ]);
    host.run(&mut connection).await.unwrap();
    host.run(&mut connection).await.unwrap();
    assert_schema(&mut connection).await;
    let limiter = PostgresLimiter::new(db.pool(2).await);
    let policy = policy("migrations.vendored", 1, Duration::from_secs(60));
    assert!(limiter.check(&check(&policy, subject(1, 1))).await.unwrap().permits_request());
    assert!(!limiter.check(&check(&policy, subject(1, 1))).await.unwrap().permits_request());
    db.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs RUNLIMIT_POSTGRES_TEST_DATABASE_URL"]
async fn a_failed_migration_leaks_no_lock_into_the_pool() {
    let db = TestDatabase::create("failed_migration").await;
    let mut connection = db.connection().await;
    // A conflicting object makes the cardinality migration fail.
    let first_two = Migrator::with_migrations(MIGRATOR.iter().take(2).cloned().collect());
    first_two.run(&mut connection).await.unwrap();
    sqlx::raw_sql("CREATE TABLE public.runlimit_fixed_window_shards (x int)")
        .execute(&mut connection)
        .await
        .unwrap();
    let limiter = PostgresLimiter::new(db.pool(1).await);
    let error = limiter.migrate().await.unwrap_err();
    assert!(
        matches!(error, MigrationError::Migrate { source: MigrateError::ExecuteMigration(_, v) } if v == MIGRATION_VERSIONS[2]),
        "{error:?}"
    );
    assert_eq!(error.to_string(), "failed to apply the runlimit migrations");
    // The dedicated connection was closed: no advisory lock remains and the pool is usable.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let advisory: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_catalog.pg_locks WHERE locktype = 'advisory' \
         AND database = (SELECT oid FROM pg_catalog.pg_database WHERE datname = current_database())",
    )
    .fetch_one(&mut connection)
    .await
    .unwrap();
    assert_eq!(advisory, 0);
    sqlx::raw_sql("DROP TABLE public.runlimit_fixed_window_shards").execute(&mut connection).await.unwrap();
    limiter.migrate().await.unwrap();
    assert_eq!(versions(&mut connection).await, MIGRATION_VERSIONS);
    db.finish().await;
}
