//! End to end, Redis mode: two processes of the built `runlimit-demo` binary on two loopback
//! ports, sharing one Redis server.
//!
//! The shared server is the one named by `RUNLIMIT_REDIS_TEST_URL` (the tests panic without
//! it). It is never flushed or reconfigured: each test passes a `--redis-key-prefix` unique to
//! the run and deletes its own keys (`SCAN MATCH {prefix}*`, then `DEL`), also when it fails.
//! The mixed-mode test also needs `RUNLIMIT_POSTGRES_TEST_DATABASE_URL` (a role with
//! `CREATEDB`); the fail-closed test starts a `redis-server` of its own from `PATH`, which it
//! may stop and reconfigure.
//!
//! ```text
//! RUNLIMIT_REDIS_TEST_URL=redis://127.0.0.1:6379 \
//! RUNLIMIT_POSTGRES_TEST_DATABASE_URL=postgres://postgres@127.0.0.1:5432/test \
//!     cargo test -p runlimit-demo --test e2e redis:: -- --include-ignored
//! ```

use crate::{
    admin::{admin_sql, admin_url},
    support,
};

use std::{
    collections::BTreeMap,
    process::{Child, Command, Stdio},
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use clap::Parser as _;
use http::StatusCode;
use runlimit_core::QuotaSnapshot;
use runlimit_demo::{Args, ClientNetwork, Gates, key_hasher_from_env};
use runlimit_redis::{KeyPrefix, RedisConfig, RedisGcraLimiter, RedisLimiter};
use sqlx::{Connection as _, PgConnection};
use support::{
    ALICE, ALICE_PASSWORD, Demo, Http, Reply, SECRET, assert_ratelimit, attempt_backoff_body, attempt_series,
    check_series, counts, quota_exceeded_body, scraped, unauthorized_body, with_database,
};

const REDIS_URL_VARIABLE: &str = "RUNLIMIT_REDIS_TEST_URL";
const MIXED_DATABASE: &str = "runlimit_demo_e2e_redis_mixed";

fn redis_url() -> String {
    std::env::var(REDIS_URL_VARIABLE).unwrap_or_else(|_| {
        panic!(
            "{REDIS_URL_VARIABLE} must name a Redis 7 server (maxmemory-policy noeviction) the tests may \
             write their own keys to, e.g. redis://127.0.0.1:6379"
        )
    })
}

/// A `--redis-key-prefix` no other run uses: `runlimit-demo-e2e-<test>-<pid>-<ns since epoch>`.
fn unique_prefix(test: &str) -> String {
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos();
    format!("runlimit-demo-e2e-{test}-{}-{nanos}", std::process::id())
}

/// The keys of one test run on the shared server: every key under `{prefix}`, deleted on drop
/// (so also when the test fails), never anything else.
struct RedisKeys {
    connection: redis::Connection,
    prefix: String,
}

impl RedisKeys {
    fn new(url: &str, prefix: &str) -> Self {
        let client = redis::Client::open(url).expect("a valid Redis URL");
        let connection =
            client.get_connection_with_timeout(Duration::from_secs(5)).expect("connect to the test Redis");
        Self { connection, prefix: prefix.to_owned() }
    }

    /// Every key matching `pattern` (SCAN, so the server is never blocked).
    fn scan(&mut self, pattern: &str) -> Vec<String> {
        let mut keys = Vec::new();
        let mut cursor = 0_u64;
        loop {
            let (next, batch): (u64, Vec<String>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(pattern)
                .arg("COUNT")
                .arg(1_000)
                .query(&mut self.connection)
                .expect("SCAN");
            keys.extend(batch);
            if next == 0 {
                return keys;
            }
            cursor = next;
        }
    }

    /// Every key of this run: `{prefix}*`.
    fn all(&mut self) -> Vec<String> {
        let pattern = format!("{{{}}}*", self.prefix);
        self.scan(&pattern)
    }

    /// How many keys a limiter of this run has (`tag` `fw` or `gcra`): `{prefix}:<tag>1:*`.
    fn count(&mut self, tag: &str) -> usize {
        let pattern = format!("{{{}}}:{tag}1:*", self.prefix);
        self.scan(&pattern).len()
    }

    /// Deletes every key of this run and returns how many there were.
    fn delete(&mut self) -> usize {
        let keys = self.all();
        for chunk in keys.chunks(500) {
            let _: u64 = redis::cmd("DEL").arg(chunk).query(&mut self.connection).expect("DEL");
        }
        keys.len()
    }
}

impl Drop for RedisKeys {
    fn drop(&mut self) {
        if std::thread::panicking() {
            // Best effort: a second panic would abort the test process.
            let pattern = format!("{{{}}}*", self.prefix);
            let mut cursor = 0_u64;
            loop {
                let Ok((next, batch)) = redis::cmd("SCAN")
                    .arg(cursor)
                    .arg("MATCH")
                    .arg(&pattern)
                    .arg("COUNT")
                    .arg(1_000)
                    .query::<(u64, Vec<String>)>(&mut self.connection)
                else {
                    return;
                };
                if !batch.is_empty() {
                    let _ = redis::cmd("DEL").arg(&batch).query::<u64>(&mut self.connection);
                }
                if next == 0 {
                    return;
                }
                cursor = next;
            }
        }
        self.delete();
    }
}

/// What the demo stored in Redis, read back through the public API (`peek`, which changes
/// nothing) with the demo's own policies and key derivation: independent of the key layout.
struct Stored {
    gates: Gates,
    hasher: runlimit_core::KeyHasher,
    identity: RedisLimiter,
    items: RedisGcraLimiter,
}

impl Stored {
    /// For demo options `args` (their limits and `--redis-key-prefix`), the server at `url` and
    /// the test secret.
    fn new(url: &str, args: &[&str]) -> Self {
        let args =
            Args::try_parse_from(std::iter::once("runlimit-demo").chain(args.iter().copied())).unwrap();
        let prefix = KeyPrefix::new(args.redis_key_prefix.as_str()).unwrap();
        let config = RedisConfig::default().with_key_prefix(prefix);
        let (hasher, _) = key_hasher_from_env(Some(SECRET.into())).unwrap();
        Self {
            gates: Gates::new(&args).unwrap(),
            hasher,
            identity: RedisLimiter::new(url).unwrap().with_config(config.clone()),
            items: RedisGcraLimiter::new(url).unwrap().with_config(config),
        }
    }

    /// The `login-identity` quota of a normalized identity.
    async fn identity(&self, identity: &str) -> QuotaSnapshot {
        let subject = self.hasher.hash_for(&*self.gates.login_identity, identity.as_bytes());
        self.identity.peek(subject).await.unwrap()
    }

    /// The `items` quota of a client address.
    async fn items(&self, client: &str) -> QuotaSnapshot {
        let subject = ClientNetwork::of(client.parse().unwrap()).subject();
        self.items.peek(self.hasher.hash_for(&*self.gates.items, subject.as_bytes())).await.unwrap()
    }
}

/// The seconds since `since`, rounded down: how far an anchored window (or a GCRA
/// replenishment time) started after `since` can have moved, so its `t` is exact (slack 0)
/// whenever the steps since `since` took under a second.
fn slack(since: Instant) -> u64 {
    since.elapsed().as_secs()
}

/// The `t` of the `name` item of `reply`'s `RateLimit` field.
fn t_of(reply: &Reply, name: &str) -> u64 {
    let field = reply.header("ratelimit").unwrap_or_else(|| panic!("no RateLimit in {reply:?}"));
    field
        .split(", ")
        .find_map(|item| item.strip_prefix(&format!("\"{name}\";"))?.rsplit_once(";t=")?.1.parse().ok())
        .unwrap_or_else(|| panic!("no {name} item with a t in {field:?}"))
}

/// Asserts a 429 `quota-exceeded` refusal by `name`: the exact `RateLimit-Policy`, the
/// `RateLimit` items, and a `Retry-After` equal to the refusing item's `t` (which is `window`
/// minus at most `slack`), with the exact problem body.
#[track_caller]
fn assert_refused(reply: &Reply, policy: &str, items: &[(&str, u64, u64)], name: &str, slack: u64) {
    assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS, "{reply:?}");
    assert_eq!(reply.header("content-type"), Some("application/problem+json"));
    assert_eq!(reply.header("ratelimit-policy"), Some(policy));
    assert_ratelimit(reply, items, slack);
    let retry = t_of(reply, name);
    assert_eq!(reply.header("retry-after"), Some(retry.to_string().as_str()), "{reply:?}");
    assert_eq!(reply.json(), quota_exceeded_body(name, retry));
}

/// The `backend="redis"` series of `metric` in a scrape.
fn redis_series(body: &str, metric: &str) -> BTreeMap<String, String> {
    scraped(body, metric)
        .into_iter()
        .filter(|(labels, _)| labels.starts_with(r#"backend="redis","#))
        .collect()
}

#[tokio::test]
#[ignore = "needs RUNLIMIT_REDIS_TEST_URL"]
async fn two_processes_on_one_redis_share_the_identity_quota_and_the_items_burst() {
    let url = redis_url();
    let prefix = unique_prefix("shared");
    let mut keys = RedisKeys::new(&url, &prefix);
    let args = [
        "--identity-limit",
        "8",
        "--identity-window-secs",
        "600",
        "--items-quota",
        "1",
        "--items-period-secs",
        "10",
        "--items-burst",
        "3",
        "--redis-key-prefix",
        &prefix,
    ];
    let env = [("RUNLIMIT_KEY_SECRET", SECRET), ("REDIS_URL", url.as_str())];
    let a = Demo::start(&args, &env);
    let b = Demo::start(&args, &env);
    assert_ne!(a.address, b.address);
    let http = Http::new();

    for replica in [&a, &b] {
        let reply = http.get(&replica.url("/healthz"), &[]).await;
        assert_eq!(reply.status, StatusCode::OK);
        assert_eq!(reply.body, r#"{"status":"ready","backend":"redis"}"#);
    }
    // Preparing writes nothing: no key exists before the first admission.
    assert_eq!(keys.all(), Vec::<String>::new());

    // Twelve logins of one identity, alternating between the processes: the shared identity
    // quota of 8 admits exactly 8 (the password check then succeeds), and refuses the rest on
    // either process. Each process's client gate (40 per 60 s, in memory) counts only its own
    // six requests.
    let policy = r#""login-client";q=40;w=60, "login-identity";q=8;w=600"#;
    let since = Instant::now();
    let mut statuses = Vec::new();
    for i in 0..12_u64 {
        let replica = if i % 2 == 0 { &a } else { &b };
        let client_left = 39 - i / 2;
        let reply = http.login(replica, ALICE, ALICE_PASSWORD).await;
        statuses.push(reply.status.as_u16());
        if i < 8 {
            assert_eq!(reply.status, StatusCode::OK, "login {i}: {reply:?}");
            assert_eq!(reply.body, r#"{"authenticated":true}"#);
            assert_eq!(reply.header("ratelimit-policy"), Some(policy));
            assert_ratelimit(
                &reply,
                &[("login-client", client_left, 60), ("login-identity", 7 - i, 600)],
                slack(since),
            );
            assert_eq!(reply.header("retry-after"), None);
        } else {
            assert_refused(
                &reply,
                policy,
                &[("login-client", client_left, 60), ("login-identity", 0, 600)],
                "login-identity",
                slack(since),
            );
        }
    }
    assert_eq!(statuses, [200, 200, 200, 200, 200, 200, 200, 200, 429, 429, 429, 429]);

    // The items GCRA burst of 3 (1 per 10 s) is shared: two requests on A, one on B, then both
    // refuse. `t` of an admitted request is the time to full replenishment, rounded up.
    let since = Instant::now();
    for (replica, available, full) in [(&a, 2, 10), (&a, 1, 20), (&b, 0, 30)] {
        let reply = http.get(&replica.url("/items"), &[]).await;
        assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
        assert_eq!(reply.body, r#"{"items":["apple","banana","cherry"]}"#);
        assert_eq!(reply.header("ratelimit-policy"), Some(r#""items";q=1;w=10"#));
        assert_ratelimit(&reply, &[("items", available, full)], slack(since));
        assert_eq!(reply.header("retry-after"), None);
    }
    for replica in [&a, &b] {
        let reply = http.get(&replica.url("/items"), &[]).await;
        assert_refused(&reply, r#""items";q=1;w=10"#, &[("items", 0, 10)], "items", slack(since));
    }

    // The state is in Redis, under this run's prefix: alice's identity quota and the items burst
    // of 127.0.0.1 are exhausted there; bob and another client were never stored.
    let stored = Stored::new(&url, &args);
    assert_eq!(stored.identity(ALICE).await.available(), 0);
    assert!(stored.identity("bob@example.test").await.is_full());
    assert_eq!(stored.items("127.0.0.1").await.available(), 0);
    assert!(stored.items("127.0.0.2").await.is_full());
    assert!(keys.count("fw") > 0 && keys.count("gcra") > 0, "{:?}", keys.all());

    // Each process's own metrics: each checked alice 6 times (4 allowed, 2 refused); A checked
    // items 3 times (2 allowed, 1 refused), B twice (1 allowed, 1 refused). The password checks
    // stay in memory: 4 admitted and 4 successes per process.
    for (replica, items_allowed) in [(&a, "2"), (&b, "1")] {
        let reply = http.get(&replica.url("/metrics"), &[]).await;
        assert_eq!(reply.status, StatusCode::OK);
        let check =
            |policy, scope, outcome, consumption| check_series("redis", policy, scope, outcome, consumption);
        let expected = counts([
            (check("demo.login", "identity", "allowed", "consumed"), "4"),
            (check("demo.login", "identity", "quota_exceeded", "not_consumed"), "2"),
            (check("demo.items", "client", "allowed", "consumed"), items_allowed),
            (check("demo.items", "client", "quota_exceeded", "not_consumed"), "1"),
        ]);
        assert_eq!(redis_series(&reply.body, "runlimit_admissions_total"), expected, "{}", reply.body);
        let attempts = scraped(&reply.body, "runlimit_attempts_total");
        let expected = counts([
            (attempt_series("memory", "admission", "admitted"), "4"),
            (attempt_series("memory", "complete_success", "completed_success"), "4"),
        ]);
        assert_eq!(attempts, expected, "{}", reply.body);
    }

    for replica in [a, b] {
        let (status, stderr) = replica.terminate();
        assert!(status.success(), "{stderr}");
        assert!(stderr.contains("runlimit-redis server checked and scripts loaded"), "{stderr}");
        assert!(
            stderr.contains(
                r#"client_gate="memory" identity_gate="redis" items_gate="redis" attempt_limiter="memory""#
            ),
            "{stderr}"
        );
        for (policy, scope) in [("demo.login", "identity"), ("demo.items", "client")] {
            assert!(
                stderr.contains(&format!(
                    r#"admission backend="redis" policy="{policy}" scope="{scope}" outcome="quota_exceeded" consumption="not_consumed""#
                )),
                "{stderr}"
            );
        }
        for secret in ["alice", "ALICE", "correct horse", "redis://"] {
            assert!(!stderr.contains(secret), "stderr leaks {secret:?}:\n{stderr}");
        }
    }

    assert!(keys.delete() > 0);
    assert_eq!(keys.all(), Vec::<String>::new());
}

#[tokio::test]
#[ignore = "needs RUNLIMIT_REDIS_TEST_URL and RUNLIMIT_POSTGRES_TEST_DATABASE_URL"]
async fn with_redis_and_postgres_the_quotas_use_redis_the_attempts_postgres_and_healthz_reports_both() {
    let url = redis_url();
    let prefix = unique_prefix("mixed");
    let mut keys = RedisKeys::new(&url, &prefix);
    let admin = admin_url();
    admin_sql(format!(r#"DROP DATABASE IF EXISTS "{MIXED_DATABASE}" WITH (FORCE)"#)).await;
    admin_sql(format!(r#"CREATE DATABASE "{MIXED_DATABASE}""#)).await;
    let database = with_database(&admin, MIXED_DATABASE);

    let args = ["--identity-limit", "20", "--identity-window-secs", "600", "--redis-key-prefix", &prefix];
    let env =
        [("RUNLIMIT_KEY_SECRET", SECRET), ("REDIS_URL", url.as_str()), ("DATABASE_URL", database.as_str())];
    let a = Demo::start(&args, &env);
    let b = Demo::start(&args, &env);
    let http = Http::new();

    let ready = concat!(
        r#"{"status":"ready","backend":"redis+postgres","backends":["#,
        r#"{"backend":"memory","gates":["login-client"],"status":"ready"},"#,
        r#"{"backend":"redis","gates":["login-identity","items"],"status":"ready"},"#,
        r#"{"backend":"postgres","gates":["login-attempts"],"status":"ready"}]}"#
    );
    for replica in [&a, &b] {
        let reply = http.get(&replica.url("/healthz"), &[]).await;
        assert_eq!(reply.status, StatusCode::OK);
        assert_eq!(reply.body, ready);
    }

    // A failure on A puts alice in backoff on B (the attempt limiter is in PostgreSQL), while
    // both logins counted against one identity quota (in Redis): 19 left after A's, 18 after
    // B's.
    let since = Instant::now();
    let reply = http.login(&a, ALICE, "wrong").await;
    assert_eq!(reply.status, StatusCode::UNAUTHORIZED, "{reply:?}");
    assert_eq!(reply.json(), unauthorized_body());
    assert_ratelimit(&reply, &[("login-client", 39, 60), ("login-identity", 19, 600)], slack(since));
    let reply = http.login(&b, ALICE, ALICE_PASSWORD).await;
    assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS, "{reply:?}");
    assert_eq!(reply.header("retry-after"), Some("1"));
    assert_ratelimit(
        &reply,
        &[("login-client", 39, 60), ("login-identity", 18, 600), ("login-attempts", 0, 1)],
        slack(since),
    );
    assert_eq!(reply.json(), attempt_backoff_body(1));

    // Where the state is: alice's identity counter in Redis (18 of 20 left), her attempt row in
    // PostgreSQL.
    let stored = Stored::new(&url, &args);
    assert_eq!(stored.identity(ALICE).await.available(), 18);
    assert!(keys.count("fw") > 0, "{:?}", keys.all());
    let mut connection = PgConnection::connect(&database).await.unwrap();
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM runlimit_attempts")
        .fetch_one(&mut connection)
        .await
        .unwrap();
    assert_eq!(rows, 1);
    connection.close().await.unwrap();

    // Losing the database: /healthz names the backend that is down and the gates it serves;
    // a login passes both quota gates and is refused by the attempt limiter with 503, while
    // /items (Redis only) still answers.
    admin_sql(format!(r#"DROP DATABASE "{MIXED_DATABASE}" WITH (FORCE)"#)).await;
    let reply = http.get(&b.url("/healthz"), &[]).await;
    assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        reply.body,
        concat!(
            r#"{"status":"unavailable","backend":"redis+postgres","reason":"database query failed","backends":["#,
            r#"{"backend":"memory","gates":["login-client"],"status":"ready"},"#,
            r#"{"backend":"redis","gates":["login-identity","items"],"status":"ready"},"#,
            r#"{"backend":"postgres","gates":["login-attempts"],"status":"unavailable","reason":"database query failed"}]}"#
        )
    );
    let reply = http.login(&b, "bob@example.test", "hunter2hunter2").await;
    assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE, "{reply:?}");
    assert_eq!(reply.header("content-type"), Some("application/problem+json"));
    assert_eq!(reply.header("retry-after"), None);
    assert_eq!(
        reply.json(),
        serde_json::json!({
            "type": "about:blank", "title": "Service Unavailable", "status": 503,
            "detail": "rate-limit backend unavailable; the request was not admitted",
        })
    );
    let reply = http.get(&b.url("/items"), &[]).await;
    assert_eq!(reply.status, StatusCode::OK, "{reply:?}");

    for replica in [a, b] {
        let (status, stderr) = replica.terminate();
        assert!(status.success(), "{stderr}");
        assert!(stderr.contains("runlimit-postgres migrations applied"), "{stderr}");
        assert!(
            stderr.contains(
                r#"client_gate="memory" identity_gate="redis" items_gate="redis" attempt_limiter="postgres""#
            ),
            "{stderr}"
        );
        for secret in ["alice", "correct horse", "redis://", "postgres://"] {
            assert!(!stderr.contains(secret), "stderr leaks {secret:?}:\n{stderr}");
        }
    }
    assert!(keys.delete() > 0);
    assert_eq!(keys.all(), Vec::<String>::new());
}

/// A `redis-server` this test started on a free loopback port; killed on drop.
struct OwnRedis {
    child: Child,
    port: u16,
}

impl OwnRedis {
    /// Starts `redis-server` with `extra` arguments and waits (at most 10 s) until it answers
    /// `PING`. Panics, naming what to install, when `redis-server` is not on `PATH`.
    fn start(extra: &[&str]) -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|error| {
                panic!(
                    "cannot start redis-server ({error}): install Redis 7, e.g. apt-get install redis-server"
                )
            });
        let mut server = Self { child, port };
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            assert!(server.child.try_wait().unwrap().is_none(), "redis-server on port {port} exited");
            let client = redis::Client::open(server.url()).unwrap();
            if let Ok(mut connection) = client.get_connection_with_timeout(Duration::from_millis(200))
                && redis::cmd("PING").query::<String>(&mut connection).is_ok()
            {
                return server;
            }
            assert!(Instant::now() < deadline, "redis-server on port {port} did not answer PING within 10 s");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Runs one command on it.
    fn command(&self, args: &[&str]) {
        let client = redis::Client::open(self.url()).unwrap();
        let mut connection = client.get_connection().unwrap();
        let mut command = redis::cmd(args[0]);
        for arg in &args[1..] {
            command.arg(*arg);
        }
        let _: redis::Value = command.query(&mut connection).unwrap();
    }

    /// Kills the server (by its process id) and waits for it to exit.
    fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for OwnRedis {
    fn drop(&mut self) {
        self.stop();
    }
}

#[tokio::test]
#[ignore = "needs redis-server on PATH (starts a server of its own)"]
async fn an_evicting_server_is_refused_at_start_and_losing_redis_fails_closed() {
    let mut server = OwnRedis::start(&["--maxmemory-policy", "allkeys-lru"]);
    let url = server.url();
    let env = [("RUNLIMIT_KEY_SECRET", SECRET), ("REDIS_URL", url.as_str())];

    // Eviction would silently reset limits: the demo refuses to start, naming the address, the
    // cause and the fix.
    let (status, stderr) = Demo::run_to_exit(&[], &env);
    assert!(!status.success());
    let last = stderr.lines().rfind(|line| !line.trim().is_empty()).unwrap();
    assert_eq!(
        last,
        format!(
            "runlimit-demo: Redis at 127.0.0.1:{0} (--redis-url) cannot hold the demo's limits; use a standalone \
             Redis 7.0 or newer with maxmemory-policy noeviction (CONFIG SET maxmemory-policy noeviction): \
             Redis at 127.0.0.1:{0} has maxmemory-policy allkeys-lru: Runlimit needs noeviction, so no quota state \
             is ever evicted (CONFIG SET maxmemory-policy noeviction)",
            server.port
        )
    );

    server.command(&["CONFIG", "SET", "maxmemory-policy", "noeviction"]);
    let demo = Demo::start(&[], &env);
    let http = Http::new();
    let reply = http.get(&demo.url("/healthz"), &[]).await;
    assert_eq!(reply.body, r#"{"status":"ready","backend":"redis"}"#);
    let reply = http.get(&demo.url("/items"), &[]).await;
    assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
    assert_eq!(reply.header("ratelimit"), Some(r#""items";r=19;t=1"#));

    // Redis is gone: /healthz is 503, and both Redis gates refuse with 503 (fail closed).
    server.stop();
    let since = Instant::now();
    let reply = http.get(&demo.url("/healthz"), &[]).await;
    assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(reply.body, r#"{"status":"unavailable","backend":"redis","reason":"redis probe failed"}"#);
    let unavailable = serde_json::json!({
        "type": "about:blank", "title": "Service Unavailable", "status": 503,
        "detail": "rate-limit backend unavailable; the request was not admitted",
    });
    let reply = http.get(&demo.url("/items"), &[]).await;
    assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE, "{reply:?}");
    assert_eq!(reply.header("content-type"), Some("application/problem+json"));
    assert_eq!(reply.header("ratelimit"), None);
    assert_eq!(reply.json(), unavailable);
    // The login passed the memory client gate, whose fields it carries, then the Redis identity
    // gate failed.
    let reply = http.login(&demo, ALICE, ALICE_PASSWORD).await;
    assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE, "{reply:?}");
    assert_eq!(reply.header("ratelimit-policy"), Some(r#""login-client";q=40;w=60"#));
    assert_ratelimit(&reply, &[("login-client", 39, 60)], slack(since));
    assert_eq!(reply.json(), unavailable);

    let (status, stderr) = demo.terminate();
    assert!(status.success(), "{stderr}");
    assert!(stderr.contains("redis readiness probe failed"), "{stderr}");
    assert!(stderr.contains("identity gate backend failed; request refused"), "{stderr}");
    assert!(stderr.contains("rate-limit backend failed; request refused"), "{stderr}");
    assert!(!stderr.contains("alice"), "{stderr}");
}
