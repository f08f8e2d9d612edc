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

pub(crate) const DATABASE_URL_VARIABLE: &str = "RUNLIMIT_POSTGRES_TEST_DATABASE_URL";

/// The admin URL. Panics (never silently passes) when the variable is missing.
pub(crate) fn admin_url() -> String {
    std::env::var(DATABASE_URL_VARIABLE).unwrap_or_else(|_| {
        panic!("{DATABASE_URL_VARIABLE} must name a PostgreSQL database whose role has CREATEDB, e.g. postgres://postgres@127.0.0.1:5432/test")
    })
}

pub(crate) struct TestDatabase {
    pub(crate) name: String,
    pub(crate) options: PgConnectOptions,
}

impl TestDatabase {
    /// Creates the fresh database `runlimit_pg_<test>`.
    pub(crate) async fn create(test: &str) -> Self {
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
    pub(crate) async fn pool(&self, max_connections: u32) -> PgPool {
        self.pool_with(PgPoolOptions::new().max_connections(max_connections), self.options.clone()).await
    }

    pub(crate) async fn pool_with(&self, pool: PgPoolOptions, options: PgConnectOptions) -> PgPool {
        pool.acquire_timeout(Duration::from_secs(30)).connect_with(options).await.expect("connect test pool")
    }

    /// A dedicated connection for assertions and fault injection.
    pub(crate) async fn connection(&self) -> PgConnection {
        self.options.connect().await.expect("connect to the test database")
    }

    /// A migrated limiter on a fresh pool.
    pub(crate) async fn limiter(&self, max_connections: u32) -> PostgresLimiter {
        let limiter = PostgresLimiter::new(self.pool(max_connections).await);
        limiter.migrate().await.expect("migrate");
        limiter
    }

    /// A migrated limiter with `config` on a fresh pool.
    pub(crate) async fn limiter_with(&self, max_connections: u32, config: PostgresConfig) -> PostgresLimiter {
        self.limiter(max_connections).await.with_config(config)
    }

    /// Drops the database; call it last in a passing test.
    pub(crate) async fn finish(self) {
        let admin = PgConnectOptions::from_str(&admin_url()).expect("valid database URL");
        let mut connection = admin.connect().await.expect("connect to the admin database");
        sqlx::raw_sql(AssertSqlSafe(format!(r#"DROP DATABASE IF EXISTS "{}" WITH (FORCE)"#, self.name)))
            .execute(&mut connection)
            .await
            .expect("drop test database");
        connection.close().await.expect("close admin connection");
    }
}

/// Installs the GCRA tables as a release before the row-lock protocol did (its two migrations,
/// in a history other migrators share), so that a later `PostgresGcraLimiter::migrate` finds an
/// existing ledger-lock database: it adds the row-lock migration without switching, as on every
/// database that existed before it. Tests of the ledger-lock protocol start here.
pub(crate) async fn migrate_gcra_as_earlier_release(pool: &PgPool) {
    let earlier = runlimit_postgres::GCRA_MIGRATOR.iter().take(2).cloned().collect();
    let mut migrator = sqlx::migrate::Migrator::with_migrations(earlier);
    migrator.set_ignore_missing(true);
    let mut connection = pool.acquire().await.expect("acquire a connection to migrate");
    migrator.run_direct(None, &mut *connection, false).await.expect("apply the earlier GCRA migrations");
}

/// A migrated `PostgresGcraLimiter` on the ledger-lock protocol (see
/// [`migrate_gcra_as_earlier_release`]).
pub(crate) async fn ledger_lock_gcra_limiter(pool: PgPool) -> runlimit_postgres::PostgresGcraLimiter {
    migrate_gcra_as_earlier_release(&pool).await;
    let limiter = runlimit_postgres::PostgresGcraLimiter::new(pool);
    limiter.migrate().await.expect("migrate");
    limiter
}

/// A migrated `PostgresGcraLimiter` on `pool`: on the row-lock protocol (`row_locks`; a fresh
/// database, which `migrate` switches) or on the ledger-lock protocol.
pub(crate) async fn gcra_limiter_on(pool: PgPool, row_locks: bool) -> runlimit_postgres::PostgresGcraLimiter {
    if row_locks {
        let limiter = runlimit_postgres::PostgresGcraLimiter::new(pool);
        limiter.migrate().await.expect("migrate");
        limiter
    } else {
        ledger_lock_gcra_limiter(pool).await
    }
}

/// The GCRA capacity ledger in use: `public.runlimit_gcra_ledger` once the protocol was switched
/// to row locks (it then holds the 256 rows), else `public.runlimit_gcra_shards`.
pub(crate) async fn gcra_ledger_table(connection: &mut PgConnection) -> &'static str {
    let switched: bool = sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM public.runlimit_gcra_ledger)")
        .fetch_one(connection)
        .await
        .expect("read the row-lock ledger");
    if switched { "public.runlimit_gcra_ledger" } else { "public.runlimit_gcra_shards" }
}

pub(crate) fn policy(id: &str, limit: u64, window: Duration) -> FixedWindowPolicy {
    FixedWindowPolicy::new(PolicyId::new(id).unwrap(), ScopeId::new("subject").unwrap(), limit, window)
        .unwrap()
}

/// A subject key whose capacity shard is `shard` (byte 0 of the subject is byte 32 of the
/// counter key) and whose other bytes encode `n`.
pub(crate) fn subject(shard: u8, n: u64) -> SubjectKey {
    let mut digest = [0u8; 32];
    digest[0] = shard;
    digest[1..9].copy_from_slice(&n.to_be_bytes());
    digest[31] = 0xA5;
    SubjectKey::from_digest(digest)
}

pub(crate) fn check(policy: &FixedWindowPolicy, subject: SubjectKey) -> Check<'_, FixedWindowPolicy> {
    Check::new(subject.bind(policy))
}

/// The stored `used` of a counter, or `None` when it has no row.
pub(crate) async fn stored_used(
    connection: &mut PgConnection,
    check: &Check<'_, FixedWindowPolicy>,
) -> Option<i64> {
    sqlx::query_scalar("SELECT used FROM public.runlimit_fixed_windows WHERE counter_key = $1")
        .bind(check.counter_key().to_bytes().as_slice())
        .fetch_optional(connection)
        .await
        .expect("read counter")
}

pub(crate) fn config() -> PostgresConfig {
    PostgresConfig::default()
}

/// The SQLSTATE of a database error inside a check error, if any.
pub(crate) fn sqlstate(error: &(dyn std::error::Error + 'static)) -> Option<String> {
    let mut current = Some(error);
    while let Some(error) = current {
        if let Some(sqlx::Error::Database(database)) = error.downcast_ref::<sqlx::Error>() {
            return database.code().map(|code| code.into_owned());
        }
        current = error.source();
    }
    None
}

/// Waits until a backend of database `database` other than `except` waits on a lock, and
/// returns its pid.
pub(crate) async fn waiting_backend(connection: &mut PgConnection, database: &str, except: i32) -> i32 {
    for _ in 0..500 {
        let pid: Option<i32> = sqlx::query_scalar(
            "SELECT pid FROM pg_catalog.pg_stat_activity \
             WHERE datname = $1 AND pid <> $2 AND wait_event_type = 'Lock' LIMIT 1",
        )
        .bind(database)
        .bind(except)
        .fetch_optional(&mut *connection)
        .await
        .expect("poll pg_stat_activity");
        if let Some(pid) = pid {
            return pid;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("no backend started waiting on a lock");
}

/// Waits (at most 10 s) until no backend of the current database but `connection`'s own has a
/// transaction open or a statement running: a `COMMIT` that a cut connection forwarded (its
/// answer lost) has then been processed, however busy the server is.
pub(crate) async fn settled_server(connection: &mut PgConnection) {
    for _ in 0..1_000 {
        let busy: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_catalog.pg_stat_activity \
             WHERE datname = pg_catalog.current_database() AND pid <> pg_catalog.pg_backend_pid() \
             AND state IN ('active', 'idle in transaction', 'idle in transaction (aborted)')",
        )
        .fetch_one(&mut *connection)
        .await
        .expect("poll pg_stat_activity");
        if busy == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("a backend of the test database stayed busy for 10 s");
}

/// The ledger row count of `shard`.
pub(crate) async fn ledger_count(connection: &mut PgConnection, shard: i16) -> i32 {
    sqlx::query_scalar("SELECT row_count FROM public.runlimit_fixed_window_shards WHERE shard = $1")
        .bind(shard)
        .fetch_one(connection)
        .await
        .expect("read ledger")
}

/// Where a [`Proxy`] cuts a connection.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Cut {
    /// Drop both sides when a client message containing the pattern arrives, without
    /// forwarding it: the server never sees it and rolls back when the session ends.
    BeforeForwarding(&'static [u8]),
    /// Forward the client message containing the pattern, discard the server's answers and
    /// close the client side shortly after: the server executes the message (a COMMIT commits)
    /// but the client never learns the outcome.
    AfterForwarding(&'static [u8]),
}

/// A loopback TCP proxy in front of the test server that can cut a connection once, on a
/// pattern in the client's bytes.
pub(crate) struct Proxy {
    pub(crate) port: u16,
    armed: std::sync::Arc<std::sync::Mutex<Option<Cut>>>,
}

impl Proxy {
    pub(crate) async fn start(upstream: &PgConnectOptions) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let port = listener.local_addr().expect("proxy address").port();
        let target = format!("{}:{}", upstream.get_host(), upstream.get_port());
        let armed = std::sync::Arc::new(std::sync::Mutex::new(None::<Cut>));
        let shared = armed.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let target = target.clone();
                let armed = shared.clone();
                tokio::spawn(async move {
                    if let Ok(server) = tokio::net::TcpStream::connect(&target).await {
                        relay(client, server, armed).await;
                    }
                });
            }
        });
        Self { port, armed }
    }

    /// Cuts the next connection whose client sends the pattern.
    pub(crate) fn arm(&self, cut: Cut) {
        *self.armed.lock().unwrap() = Some(cut);
    }

    /// Connect options for `database` through the proxy.
    pub(crate) fn options(&self, base: &PgConnectOptions) -> PgConnectOptions {
        base.clone().host("127.0.0.1").port(self.port)
    }
}

async fn relay(
    mut client: tokio::net::TcpStream,
    mut server: tokio::net::TcpStream,
    armed: std::sync::Arc<std::sync::Mutex<Option<Cut>>>,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut from_client = vec![0u8; 64 * 1024];
    let mut from_server = vec![0u8; 64 * 1024];
    loop {
        tokio::select! {
            read = client.read(&mut from_client) => {
                let Ok(n) = read else { return };
                if n == 0 { return; }
                let chunk = &from_client[..n];
                let cut = {
                    let mut armed = armed.lock().unwrap();
                    let hit = armed.and_then(|cut| {
                        let pattern = match cut { Cut::BeforeForwarding(p) | Cut::AfterForwarding(p) => p };
                        chunk.windows(pattern.len()).any(|w| w == pattern).then_some(cut)
                    });
                    if hit.is_some() { *armed = None; }
                    hit
                };
                match cut {
                    Some(Cut::BeforeForwarding(_)) => return,
                    Some(Cut::AfterForwarding(_)) => {
                        let _ = server.write_all(chunk).await;
                        // Let the server execute it; its answer is never relayed.
                        tokio::time::sleep(Duration::from_millis(300)).await;
                        return;
                    }
                    None => if server.write_all(chunk).await.is_err() { return },
                }
            }
            read = server.read(&mut from_server) => {
                let Ok(n) = read else { return };
                if n == 0 || client.write_all(&from_server[..n]).await.is_err() { return; }
            }
        }
    }
}
