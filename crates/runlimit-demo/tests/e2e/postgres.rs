//! End to end, PostgreSQL mode: two replicas of the built `runlimit-demo` binary on two
//! loopback ports, sharing one fresh database created for the test.
//!
//! Needs `RUNLIMIT_POSTGRES_TEST_DATABASE_URL` (a role with `CREATEDB`); panics without it.
//! The databases `runlimit_demo_e2e` and `runlimit_demo_e2e_attempts` are dropped by the
//! tests themselves (a failing test keeps it
//! for inspection; the next run drops the leftover first).

use crate::{
    admin::{admin_sql, admin_url},
    support,
};

use std::time::{Duration, Instant};

use http::StatusCode;
use sqlx::{Connection as _, PgConnection};
use support::{
    ALICE, ALICE_PASSWORD, Demo, Http, SECRET, assert_fields, attempt_backoff_body, attempt_series,
    check_series, counts, quota_exceeded_body, scraped, unauthorized_body, with_database,
};

const DATABASE: &str = "runlimit_demo_e2e";
const ATTEMPTS_DATABASE: &str = "runlimit_demo_e2e_attempts";

#[test]
fn database_urls() {
    assert_eq!(
        with_database("postgres://postgres@127.0.0.1:5432/test", "x"),
        "postgres://postgres@127.0.0.1:5432/x"
    );
    assert_eq!(
        with_database("postgres://u:p@h/test?sslmode=disable", "x"),
        "postgres://u:p@h/x?sslmode=disable"
    );
    assert_eq!(with_database("postgres://h:5432", "x"), "postgres://h:5432/x");
}

#[tokio::test]
#[ignore = "needs RUNLIMIT_POSTGRES_TEST_DATABASE_URL"]
async fn two_replicas_share_the_identity_quota_and_the_items_burst_and_keep_their_own_client_gates() {
    let admin = admin_url();
    admin_sql(format!(r#"DROP DATABASE IF EXISTS "{DATABASE}" WITH (FORCE)"#)).await;
    admin_sql(format!(r#"CREATE DATABASE "{DATABASE}""#)).await;
    let url = with_database(&admin, DATABASE);

    let args = [
        "--client-limit",
        "5",
        "--client-window-secs",
        "60",
        "--identity-limit",
        "5",
        "--identity-window-secs",
        "60",
        "--items-quota",
        "1",
        "--items-period-secs",
        "10",
        "--items-burst",
        "3",
    ];
    let env = [("RUNLIMIT_KEY_SECRET", SECRET), ("DATABASE_URL", url.as_str())];
    // Both replicas apply the migrations at start (the second finds them applied).
    let a = Demo::start(&args, &env);
    let b = Demo::start(&args, &env);
    assert_ne!(a.address, b.address);
    let http = Http::new();

    for replica in [&a, &b] {
        let reply = http.get(&replica.url("/healthz"), &[]).await;
        assert_eq!(reply.status, StatusCode::OK);
        assert_eq!(reply.body, r#"{"status":"ready","backend":"postgres"}"#);
    }

    let policy = Some(r#""login-client";q=5;w=60, "login-identity";q=5;w=60"#);
    // Three logins on A, two on B: one identity quota of 5 across both replicas. B's
    // `login-client` window is anchored after this instant (by B's first login).
    let before_b_anchor = Instant::now();
    for (replica, client_left, identity_left) in [(&a, 4, 4), (&a, 3, 3), (&a, 2, 2), (&b, 4, 1), (&b, 3, 0)]
    {
        let reply = http.login(replica, ALICE, ALICE_PASSWORD).await;
        assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
        assert_fields(
            &reply,
            policy,
            Some(&format!(r#""login-client";r={client_left};t=60, "login-identity";r={identity_left};t=60"#)),
            None,
        );
    }
    // The sixth is refused on either replica, by the shared identity gate.
    for (replica, client_left) in [(&a, 1), (&b, 2)] {
        let reply = http.login(replica, " ALICE@example.test", ALICE_PASSWORD).await;
        assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(reply.header("content-type"), Some("application/problem+json"));
        assert_fields(
            &reply,
            policy,
            Some(&format!(r#""login-client";r={client_left};t=60, "login-identity";r=0;t=60"#)),
            Some("60"),
        );
        assert_eq!(reply.json(), quota_exceeded_body("login-identity", 60));
    }

    // The client gate is per process: A's is now exhausted, B's is not.
    let reply = http.login(&a, "bob@example.test", "hunter2hunter2").await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.header("ratelimit"), Some(r#""login-client";r=0;t=60, "login-identity";r=4;t=60"#));
    let reply = http.login(&a, "bob@example.test", "hunter2hunter2").await;
    assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS);
    assert_fields(&reply, Some(r#""login-client";q=5;w=60"#), Some(r#""login-client";r=0;t=60"#), Some("60"));
    assert_eq!(reply.json(), quota_exceeded_body("login-client", 60));
    let reply = http.login(&b, "bob@example.test", "hunter2hunter2").await;
    assert_eq!(reply.status, StatusCode::OK);
    // ... while bob's identity count is shared: A's login left 4, this one leaves 3.
    assert_eq!(reply.header("ratelimit"), Some(r#""login-client";r=1;t=60, "login-identity";r=3;t=60"#));

    // The identity counters live in PostgreSQL (two subjects), the client counters do not.
    let mut connection = PgConnection::connect(&url).await.unwrap();
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM runlimit_fixed_windows")
        .fetch_one(&mut connection)
        .await
        .unwrap();
    assert_eq!(rows, 2);

    // The items GCRA burst of 3 (1 per 10 s) is shared: two requests on A, one on B, then
    // both replicas refuse. `t` is the time to full replenishment, rounded up (the few
    // milliseconds between requests stay below one whole second).
    for (replica, available, full) in [(&a, 2, 10), (&a, 1, 20), (&b, 0, 30)] {
        let reply = http.get(&replica.url("/items"), &[]).await;
        assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
        assert_eq!(reply.body, r#"{"items":["apple","banana","cherry"]}"#);
        assert_fields(
            &reply,
            Some(r#""items";q=1;w=10"#),
            Some(&format!(r#""items";r={available};t={full}"#)),
            None,
        );
    }
    for replica in [&a, &b] {
        let reply = http.get(&replica.url("/items"), &[]).await;
        assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS, "{reply:?}");
        assert_eq!(reply.header("content-type"), Some("application/problem+json"));
        assert_fields(&reply, Some(r#""items";q=1;w=10"#), Some(r#""items";r=0;t=10"#), Some("10"));
        assert_eq!(reply.json(), quota_exceeded_body("items", 10));
    }
    // A's own metrics: the PostgreSQL gates it checked (the other replica's are its own).
    let reply = http.get(&a.url("/metrics"), &[]).await;
    assert_eq!(reply.status, StatusCode::OK);
    // Exactly these `backend="postgres"` series, with these counts: identity, alice 3 allowed
    // and 1 refused, bob 1 allowed (his second login stopped at A's client gate); items 2
    // allowed and 1 refused; 4 password checks admitted, 4 successes.
    let postgres = |metric: &str| {
        scraped(&reply.body, metric)
            .into_iter()
            .filter(|(labels, _)| labels.starts_with(r#"backend="postgres","#))
            .collect::<std::collections::BTreeMap<String, String>>()
    };
    let check =
        |policy, scope, outcome, consumption| check_series("postgres", policy, scope, outcome, consumption);
    let expected = counts([
        (check("demo.login", "identity", "allowed", "consumed"), "4"),
        (check("demo.login", "identity", "quota_exceeded", "not_consumed"), "1"),
        (check("demo.items", "client", "allowed", "consumed"), "2"),
        (check("demo.items", "client", "quota_exceeded", "not_consumed"), "1"),
    ]);
    assert_eq!(postgres("runlimit_admissions_total"), expected, "{}", reply.body);
    let attempt = |operation, event| attempt_series("postgres", operation, event);
    let expected = counts([
        (attempt("admission", "admitted"), "4"),
        (attempt("complete_success", "completed_success"), "4"),
    ]);
    assert_eq!(postgres("runlimit_attempts_total"), expected, "{}", reply.body);

    // One GCRA row (one client: 127.0.0.1) in PostgreSQL.
    let rows: i64 =
        sqlx::query_scalar("SELECT count(*) FROM runlimit_gcra").fetch_one(&mut connection).await.unwrap();
    assert_eq!(rows, 1);
    connection.close().await.unwrap();

    // Losing the database fails closed: /healthz is 503 and logins are refused with 503.
    admin_sql(format!(r#"DROP DATABASE "{DATABASE}" WITH (FORCE)"#)).await;
    let reply = http.get(&b.url("/healthz"), &[]).await;
    assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        reply.body,
        r#"{"status":"unavailable","backend":"postgres","reason":"database query failed"}"#
    );
    let reply = http.login(&b, "carol@example.test", "x").await;
    assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(reply.header("content-type"), Some("application/problem+json"));
    // B's client window has run for at most `before_b_anchor.elapsed()` (dropping a database
    // may take seconds on a busy machine), so `t`, rounded up, is 60 minus at most that.
    let elapsed = before_b_anchor.elapsed().as_secs();
    let field = reply.header("ratelimit").expect("the RateLimit field");
    let t: u64 = field
        .strip_prefix(r#""login-client";r=0;t="#)
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("unexpected RateLimit field {field:?}"));
    assert!((60_u64.saturating_sub(elapsed + 1)..=60).contains(&t), "t={t} after {elapsed} s");
    assert_eq!(
        reply.json(),
        serde_json::json!({
            "type": "about:blank", "title": "Service Unavailable", "status": 503,
            "detail": "rate-limit backend unavailable; the request was not admitted",
        })
    );

    for replica in [a, b] {
        let (status, stderr) = replica.terminate();
        assert!(status.success(), "{stderr}");
        assert!(stderr.contains("runlimit-postgres migrations applied"), "{stderr}");
        // Each migrator creates SQLx's `_sqlx_migrations` if it is missing, and the server's
        // "already exists, skipping" notices would otherwise be logged at info.
        assert!(!stderr.contains("sqlx::postgres::notice"), "{stderr}");
        assert!(
            stderr.contains(
                r#"admission backend="postgres" policy="demo.login" scope="identity" outcome="quota_exceeded""#
            ),
            "{stderr}"
        );
        assert!(
            stderr.contains(
                r#"admission backend="postgres" policy="demo.items" scope="client" outcome="quota_exceeded""#
            ),
            "{stderr}"
        );
        for secret in ["alice", "ALICE", "bob@", "correct horse", "hunter2", "127.0.0.1", "postgres://"] {
            assert!(!stderr.contains(secret), "stderr leaks {secret:?}:\n{stderr}");
        }
    }
}

#[tokio::test]
#[ignore = "needs RUNLIMIT_POSTGRES_TEST_DATABASE_URL"]
async fn two_replicas_share_each_identitys_password_check_backoff() {
    let admin = admin_url();
    admin_sql(format!(r#"DROP DATABASE IF EXISTS "{ATTEMPTS_DATABASE}" WITH (FORCE)"#)).await;
    admin_sql(format!(r#"CREATE DATABASE "{ATTEMPTS_DATABASE}""#)).await;
    let url = with_database(&admin, ATTEMPTS_DATABASE);

    let args =
        ["--identity-limit", "20", "--attempt-initial-delay-secs", "1", "--attempt-delay-cap-secs", "60"];
    let env = [("RUNLIMIT_KEY_SECRET", SECRET), ("DATABASE_URL", url.as_str())];
    let a = Demo::start(&args, &env);
    let b = Demo::start(&args, &env);
    let http = Http::new();

    // A failure on A puts alice in backoff on B too.
    let reply = http.login(&a, ALICE, "wrong").await;
    assert_eq!(reply.status, StatusCode::UNAUTHORIZED, "{reply:?}");
    assert_eq!(reply.json(), unauthorized_body());
    let reply = http.login(&b, ALICE, ALICE_PASSWORD).await;
    assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS, "{reply:?}");
    assert_eq!(reply.header("content-type"), Some("application/problem+json"));
    assert_eq!(reply.header("retry-after"), Some("1"));
    assert_eq!(reply.json(), attempt_backoff_body(1));

    // After the delay, a second failure on B doubles the backoff seen on A.
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let reply = http.login(&b, ALICE, "wrong").await;
    assert_eq!(reply.status, StatusCode::UNAUTHORIZED, "{reply:?}");
    let reply = http.login(&a, ALICE, ALICE_PASSWORD).await;
    assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS, "{reply:?}");
    assert_eq!(reply.header("retry-after"), Some("2"));
    assert_eq!(reply.json(), attempt_backoff_body(2));

    // After that delay, a success on A resets alice for B: B's next failure backs off 1 s.
    tokio::time::sleep(Duration::from_millis(2_100)).await;
    let reply = http.login(&a, ALICE, ALICE_PASSWORD).await;
    assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
    assert_eq!(reply.body, r#"{"authenticated":true}"#);
    let reply = http.login(&b, ALICE, "wrong").await;
    assert_eq!(reply.status, StatusCode::UNAUTHORIZED, "{reply:?}");
    let reply = http.login(&a, ALICE, "wrong").await;
    assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS, "{reply:?}");
    assert_eq!(reply.header("retry-after"), Some("1"));
    assert_eq!(reply.json(), attempt_backoff_body(1));

    // One attempt row (alice, in backoff) in PostgreSQL.
    let mut connection = PgConnection::connect(&url).await.unwrap();
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM runlimit_attempts")
        .fetch_one(&mut connection)
        .await
        .unwrap();
    assert_eq!(rows, 1);

    // The attempt limiter fails closed: without its table (the quota gates still work) a
    // login is refused with 503 and nothing is authenticated.
    sqlx::raw_sql("DROP TABLE runlimit_attempts").execute(&mut connection).await.unwrap();
    connection.close().await.unwrap();
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

    let (status, b_stderr) = b.terminate();
    assert!(status.success(), "{b_stderr}");
    assert!(b_stderr.contains("attempt limiter failed; request refused"), "{b_stderr}");
    assert!(b_stderr.contains("may_have_been_admitted=false"), "{b_stderr}");
    let (status, a_stderr) = a.terminate();
    assert!(status.success(), "{a_stderr}");
    for stderr in [a_stderr, b_stderr] {
        assert!(
            stderr.contains(
                r#"attempt backend="postgres" policy="demo.login" scope="attempt" operation="admission" event="denied_backoff""#
            ),
            "{stderr}"
        );
        for secret in ["alice", "correct horse", "postgres://"] {
            assert!(!stderr.contains(secret), "stderr leaks {secret:?}:\n{stderr}");
        }
    }
    admin_sql(format!(r#"DROP DATABASE "{ATTEMPTS_DATABASE}" WITH (FORCE)"#)).await;
}

#[test]
#[ignore = "needs RUNLIMIT_POSTGRES_TEST_DATABASE_URL"]
fn a_missing_database_is_named_once_with_the_address() {
    let url = with_database(&admin_url(), "runlimit_demo_no_such_database");
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_runlimit-demo"))
        .args(["--listen", "127.0.0.1:0", "--database-url", &url])
        .env("RUNLIMIT_KEY_SECRET", SECRET)
        .output()
        .expect("the demo binary runs");
    assert!(!output.status.success());
    let stderr = String::from_utf8(output.stderr).unwrap();
    let last = stderr.lines().rfind(|line| !line.trim().is_empty()).unwrap();
    assert!(
        last.starts_with("runlimit-demo: PostgreSQL at ")
            && last.contains("/runlimit_demo_no_such_database (--database-url) refused the connection: ")
            && last.contains("; create it (createdb -h ")
            && !last.contains(" at line "),
        "{last}"
    );
    assert_eq!(
        last.matches(r#"database "runlimit_demo_no_such_database" does not exist"#).count(),
        1,
        "{last}"
    );
}
