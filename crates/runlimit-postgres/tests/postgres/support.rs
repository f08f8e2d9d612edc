//! Per-test databases on the server named by `RUNLIMIT_POSTGRES_TEST_DATABASE_URL`.
//!
//! Every test calls [`TestDatabase::create`] with its own name. It connects to the URL's
//! database (the "admin" database), drops a leftover `runlimit_pg_<name>` from an earlier
//! failed run, creates it fresh and hands out pools on it. [`TestDatabase::finish`] drops it
//! at the end of a passing test; a failing test panics before that and keeps its database for
//! debugging, as `#[sqlx::test]` does. The role needs `CREATEDB`.

#![allow(dead_code)]

use std::{str::FromStr, time::Duration};

use runlimit_core::{Check, FixedWindowPolicy, PolicyId, ScopeId, SubjectKey};
use runlimit_postgres::{PostgresConfig, PostgresLimiter};
use sqlx::{
    AssertSqlSafe, ConnectOptions, Connection, PgConnection, PgPool,
    postgres::{PgConnectOptions, PgPoolOptions},
};

pub const DATABASE_URL_VARIABLE: &str = "RUNLIMIT_POSTGRES_TEST_DATABASE_URL";

/// The admin URL. Panics (never silently passes) when the variable is missing.
pub fn admin_url() -> String {
    std::env::var(DATABASE_URL_VARIABLE).unwrap_or_else(|_| {
        panic!("{DATABASE_URL_VARIABLE} must name a PostgreSQL database whose role has CREATEDB, e.g. postgres://postgres@127.0.0.1:5432/test")
    })
}

pub struct TestDatabase {
    pub name: String,
    pub options: PgConnectOptions,
}

impl TestDatabase {
    /// Creates the fresh database `runlimit_pg_<test>`.
    pub async fn create(test: &str) -> Self {
        let admin = PgConnectOptions::from_str(&admin_url()).expect("valid database URL");
        let name = format!("runlimit_pg_{test}");
        assert!(name.len() <= 63, "database name {name} too long");
        let mut connection = admin.connect().await.expect("connect to the admin database");
        sqlx::raw_sql(AssertSqlSafe(format!(r#"DROP DATABASE IF EXISTS "{name}" WITH (FORCE)"#)))
            .execute(&mut connection)
            .await
            .expect("drop leftover database");
        sqlx::raw_sql(AssertSqlSafe(format!(r#"CREATE DATABASE "{name}""#)))
            .execute(&mut connection)
            .await
            .expect("create database");
        connection.close().await.expect("close admin connection");
        let options = admin.database(&name);
        Self { name, options }
    }

    /// A pool on the test database.
    pub async fn pool(&self, max_connections: u32) -> PgPool {
        self.pool_with(PgPoolOptions::new().max_connections(max_connections), self.options.clone()).await
    }

    pub async fn pool_with(&self, pool: PgPoolOptions, options: PgConnectOptions) -> PgPool {
        pool.acquire_timeout(Duration::from_secs(30)).connect_with(options).await.expect("connect test pool")
    }

    /// A dedicated connection for assertions and fault injection.
    pub async fn connection(&self) -> PgConnection {
        self.options.connect().await.expect("connect to the test database")
    }

    /// A migrated limiter on a fresh pool.
    pub async fn limiter(&self, max_connections: u32) -> PostgresLimiter {
        let limiter = PostgresLimiter::new(self.pool(max_connections).await);
        limiter.migrate().await.expect("migrate");
        limiter
    }

    /// Drops the database; call it last in a passing test.
    pub async fn finish(self) {
        let admin = PgConnectOptions::from_str(&admin_url()).expect("valid database URL");
        let mut connection = admin.connect().await.expect("connect to the admin database");
        sqlx::raw_sql(AssertSqlSafe(format!(r#"DROP DATABASE IF EXISTS "{}" WITH (FORCE)"#, self.name)))
            .execute(&mut connection)
            .await
            .expect("drop test database");
        connection.close().await.expect("close admin connection");
    }
}

pub fn policy(id: &str, limit: u64, window: Duration) -> FixedWindowPolicy {
    FixedWindowPolicy::new(PolicyId::new(id).unwrap(), ScopeId::new("subject").unwrap(), limit, window)
        .unwrap()
}

/// A subject key whose capacity shard is `shard` (byte 0 of the subject is byte 32 of the
/// counter key) and whose other bytes encode `n`.
pub fn subject(shard: u8, n: u64) -> SubjectKey {
    let mut digest = [0u8; 32];
    digest[0] = shard;
    digest[1..9].copy_from_slice(&n.to_be_bytes());
    digest[31] = 0xA5;
    SubjectKey::from_digest(digest)
}

pub fn check(policy: &FixedWindowPolicy, subject: SubjectKey) -> Check<'_, FixedWindowPolicy> {
    Check::new(subject.bind(policy))
}

/// The stored `used` of a counter, or `None` when it has no row.
pub async fn stored_used(connection: &mut PgConnection, check: &Check<'_, FixedWindowPolicy>) -> Option<i64> {
    sqlx::query_scalar("SELECT used FROM public.runlimit_fixed_windows WHERE counter_key = $1")
        .bind(check.counter_key().to_bytes().as_slice())
        .fetch_optional(connection)
        .await
        .expect("read counter")
}

pub fn config() -> PostgresConfig {
    PostgresConfig::default()
}
