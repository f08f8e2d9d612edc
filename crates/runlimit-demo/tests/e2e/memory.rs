//! End to end, memory mode: the built `runlimit-demo` binary on 127.0.0.1:0, real HTTP/1.1
//! requests over loopback, exact header strings and problem bodies.

use crate::support;

use std::time::Duration;

use http::StatusCode;
use support::{
    ALICE, ALICE_PASSWORD, Demo, Http, SECRET, assert_fields, assert_ratelimit, attempt_backoff_body,
    attempt_series, check_series, counts, quota_exceeded_body, scraped, unauthorized_body,
};

#[tokio::test]
async fn login_passes_the_client_then_the_identity_gate_with_exact_fields() {
    let demo = Demo::start(
        &[
            "--client-limit",
            "5",
            "--client-window-secs",
            "60",
            "--identity-limit",
            "2",
            "--identity-window-secs",
            "30",
        ],
        &[],
    );
    let http = Http::new();

    // 1: allowed by both gates; correct password.
    let reply = http.login(&demo, ALICE, ALICE_PASSWORD).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.header("content-type"), Some("application/json"));
    assert_eq!(reply.body, r#"{"authenticated":true}"#);
    assert_fields(
        &reply,
        Some(r#""login-client";q=5;w=60, "login-identity";q=2;w=30"#),
        Some(r#""login-client";r=4;t=60, "login-identity";r=1;t=30"#),
        None,
    );

    // 2: the same identity after normalization (trim + lowercase); wrong password -> 401.
    let reply = http.login(&demo, "  Alice@EXAMPLE.test\t", "wrong").await;
    assert_eq!(reply.status, StatusCode::UNAUTHORIZED);
    assert_eq!(reply.header("content-type"), Some("application/problem+json"));
    assert_eq!(
        reply.json(),
        serde_json::json!({
            "type": "about:blank", "title": "Unauthorized", "status": 401,
            "detail": "identity or password is wrong",
        })
    );
    assert_fields(
        &reply,
        Some(r#""login-client";q=5;w=60, "login-identity";q=2;w=30"#),
        Some(r#""login-client";r=3;t=60, "login-identity";r=0;t=30"#),
        None,
    );

    // 3: identity quota exhausted -> 429 from the identity gate (the client gate passed).
    let reply = http.login(&demo, ALICE, ALICE_PASSWORD).await;
    assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(reply.header("content-type"), Some("application/problem+json"));
    assert_fields(
        &reply,
        Some(r#""login-client";q=5;w=60, "login-identity";q=2;w=30"#),
        Some(r#""login-client";r=2;t=60, "login-identity";r=0;t=30"#),
        Some("30"),
    );
    assert_eq!(reply.json(), quota_exceeded_body("login-identity", 30));

    // 4: another identity still has its own quota.
    let reply = http.login(&demo, "bob@example.test", "hunter2hunter2").await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_fields(
        &reply,
        Some(r#""login-client";q=5;w=60, "login-identity";q=2;w=30"#),
        Some(r#""login-client";r=1;t=60, "login-identity";r=1;t=30"#),
        None,
    );

    // 5: an unknown identity is a 401, counted like any other.
    let reply = http.login(&demo, "carol@example.test", "x").await;
    assert_eq!(reply.status, StatusCode::UNAUTHORIZED);
    assert_fields(
        &reply,
        Some(r#""login-client";q=5;w=60, "login-identity";q=2;w=30"#),
        Some(r#""login-client";r=0;t=60, "login-identity";r=1;t=30"#),
        None,
    );

    // 6: client quota exhausted -> 429 from the client gate, before the body is read: even
    // a malformed body gets the 429, not a 400.
    let reply = http.post_json(&demo.url("/login"), "{not json", &[]).await;
    assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(reply.header("content-type"), Some("application/problem+json"));
    assert_fields(&reply, Some(r#""login-client";q=5;w=60"#), Some(r#""login-client";r=0;t=60"#), Some("60"));
    assert_eq!(reply.json(), quota_exceeded_body("login-client", 60));
}

#[tokio::test]
async fn items_gcra_allows_the_burst_then_429() {
    // Quota 1 per 10 s, burst 3: three requests pass, the fourth waits one emission interval.
    let demo = Demo::start(
        &["--items-quota", "1", "--items-period-secs", "10", "--items-burst", "3"],
        &[("RUNLIMIT_KEY_SECRET", SECRET)],
    );
    let http = Http::new();
    // `t` is the time to full replenishment (runlimit-http's documented GCRA choice): one
    // spent unit takes 10 s to come back, two take 20 s, three 30 s.
    for (available, full) in [(2, 10), (1, 20), (0, 30)] {
        let reply = http.get(&demo.url("/items"), &[]).await;
        assert_eq!(reply.status, StatusCode::OK);
        assert_eq!(reply.body, r#"{"items":["apple","banana","cherry"]}"#);
        assert_fields(
            &reply,
            Some(r#""items";q=1;w=10"#),
            Some(&format!(r#""items";r={available};t={full}"#)),
            None,
        );
    }
    let reply = http.get(&demo.url("/items"), &[]).await;
    assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(reply.header("content-type"), Some("application/problem+json"));
    assert_fields(&reply, Some(r#""items";q=1;w=10"#), Some(r#""items";r=0;t=10"#), Some("10"));
    assert_eq!(reply.json(), quota_exceeded_body("items", 10));

    // The items gate and the login client gate are separate quotas.
    let reply = http.login(&demo, ALICE, ALICE_PASSWORD).await;
    assert_eq!(reply.status, StatusCode::OK);
}

#[tokio::test]
async fn healthz_reports_memory_readiness_and_unknown_routes_consume_nothing() {
    let demo = Demo::start(&["--client-limit", "1"], &[]);
    let http = Http::new();
    let reply = http.get(&demo.url("/healthz"), &[]).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.header("content-type"), Some("application/json"));
    assert_eq!(reply.body, r#"{"status":"ready","backend":"memory"}"#);
    assert_eq!(reply.header("ratelimit"), None);

    // 404 and 405 are outside the route layers: no quota is consumed. Both are problems,
    // like every other error.
    let reply = http.get(&demo.url("/nope"), &[]).await;
    assert_eq!(reply.status, StatusCode::NOT_FOUND);
    assert_eq!(reply.header("content-type"), Some("application/problem+json"));
    assert_eq!(
        reply.json(),
        serde_json::json!({"type": "about:blank", "title": "Not Found", "status": 404, "detail": "no such route"})
    );
    let reply = http.get(&demo.url("/login"), &[]).await;
    assert_eq!(reply.status, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(reply.header("allow"), Some("POST"));
    assert_eq!(reply.header("content-type"), Some("application/problem+json"));
    assert_eq!(
        reply.json(),
        serde_json::json!({
            "type": "about:blank", "title": "Method Not Allowed", "status": 405,
            "detail": "method not allowed on this route",
        })
    );
    let reply = http.login(&demo, ALICE, ALICE_PASSWORD).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.header("ratelimit"), Some(r#""login-client";r=0;t=60, "login-identity";r=7;t=600"#));
}

#[tokio::test]
async fn forwarding_headers_are_never_read_without_a_trusted_proxy() {
    let demo = Demo::start(&["--client-limit", "2"], &[]);
    let http = Http::new();
    // Every request claims another client; all are counted as the socket peer, 127.0.0.1.
    let spoofed = [
        [("x-forwarded-for", "198.51.100.1"), ("forwarded", "for=198.51.100.1")],
        [("x-forwarded-for", "198.51.100.2"), ("forwarded", "for=198.51.100.2")],
        [("x-forwarded-for", "198.51.100.3"), ("forwarded", "for=198.51.100.3")],
    ];
    let body = serde_json::json!({ "identity": ALICE, "password": ALICE_PASSWORD }).to_string();
    let mut statuses = Vec::new();
    for headers in &spoofed {
        statuses.push(http.post_json(&demo.url("/login"), &body, headers).await.status);
    }
    assert_eq!(statuses, [StatusCode::OK, StatusCode::OK, StatusCode::TOO_MANY_REQUESTS]);
}

#[tokio::test]
async fn a_trusted_proxy_names_the_client_by_the_rightmost_forwarded_for_entry() {
    let demo =
        Demo::start(&["--client-limit", "1", "--identity-limit", "100", "--trusted-proxy", "127.0.0.1"], &[]);
    let http = Http::new();
    let body = serde_json::json!({ "identity": ALICE, "password": ALICE_PASSWORD }).to_string();
    let login = |xff: &'static str| {
        let http = &http;
        let url = demo.url("/login");
        let body = body.clone();
        async move { http.post_json(&url, &body, &[("x-forwarded-for", xff)]).await }
    };

    assert_eq!(login("198.51.100.7").await.status, StatusCode::OK);
    // Same rightmost entry: the same client, whatever the client-supplied entries say.
    assert_eq!(login("203.0.113.1, 198.51.100.7").await.status, StatusCode::TOO_MANY_REQUESTS);
    // Another rightmost entry: another client.
    assert_eq!(login("198.51.100.7, 198.51.100.8").await.status, StatusCode::OK);
    // IPv6 clients are aggregated to their /64.
    assert_eq!(login("2001:db8:0:1::1").await.status, StatusCode::OK);
    assert_eq!(login("2001:db8:0:1:ffff::2").await.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(login("2001:db8:0:2::1").await.status, StatusCode::OK);

    // A trusted proxy must say whom it forwards for.
    let reply = http.post_json(&demo.url("/login"), &body, &[]).await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST);
    assert_eq!(
        reply.json(),
        serde_json::json!({
            "type": "about:blank", "title": "Bad Request", "status": 400,
            "detail": "trusted proxy sent no X-Forwarded-For",
        })
    );
    let reply = login("not-an-address").await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST);
    assert_eq!(reply.json()["detail"], "trusted proxy sent a malformed X-Forwarded-For entry");
}

#[tokio::test]
async fn bad_bodies_are_refused_after_the_client_gate() {
    let demo = Demo::start(&["--client-limit", "100", "--identity-limit", "100"], &[]);
    let http = Http::new();
    let url = demo.url("/login");

    let too_large = serde_json::json!({ "identity": ALICE, "password": "x".repeat(5_000) }).to_string();
    let reply = http.post_json(&url, &too_large, &[]).await;
    assert_eq!(reply.status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(reply.json()["detail"], "body could not be read; at most 4096 bytes are accepted");
    // The client gate admitted it (and says so); the identity gate never saw it.
    assert_eq!(reply.header("ratelimit"), Some(r#""login-client";r=99;t=60"#));

    let reply = http.post_json(&url, "{not json", &[]).await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST);
    assert_eq!(reply.json()["detail"], "body is not valid JSON");

    let reply = http.post_json(&url, r#"{"identity": 5, "password": "x"}"#, &[]).await;
    assert_eq!(reply.status, StatusCode::UNPROCESSABLE_ENTITY);
    // serde's message would quote the input; the detail is fixed.
    assert_eq!(
        reply.json()["detail"],
        "body must be a JSON object with string members \"identity\" and \"password\""
    );

    let reply = http.post_json(&url, r#"{"identity": "   ", "password": "x"}"#, &[]).await;
    assert_eq!(reply.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(reply.json()["detail"], "identity is empty");

    let reply = http
        .send(
            http::Request::post(&url)
                .header("content-type", "text/plain")
                .body(http_body_util::Full::new(bytes::Bytes::from_static(b"{}")))
                .unwrap(),
        )
        .await;
    assert_eq!(reply.status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
    assert_eq!(reply.header("ratelimit"), Some(r#""login-client";r=95;t=60"#));
}

#[tokio::test]
async fn sigterm_stops_gracefully_and_logs_admissions_without_raw_subjects() {
    let demo = Demo::start(&[], &[]);
    let http = Http::new();
    assert_eq!(http.login(&demo, " Alice@Example.test ", ALICE_PASSWORD).await.status, StatusCode::OK);
    assert_eq!(http.get(&demo.url("/items"), &[]).await.status, StatusCode::OK);

    let (status, stderr) = demo.terminate();
    assert!(status.success(), "exit status {status:?}; stderr:\n{stderr}");
    assert!(
        stderr.contains(
            "RUNLIMIT_KEY_SECRET is not set: generated an ephemeral key secret; counters are not shared \
             across replicas and are lost on restart"
        ),
        "{stderr}"
    );
    for (scope, policy) in [("client", "demo.login"), ("identity", "demo.login"), ("client", "demo.items")] {
        let event = format!(
            r#"runlimit_demo::admission: admission backend="memory" policy="{policy}" scope="{scope}" outcome="allowed" consumption="consumed""#
        );
        assert!(stderr.contains(&event), "missing {event} in:\n{stderr}");
    }
    assert!(stderr.contains("SIGTERM received; shutting down"), "{stderr}");
    assert!(stderr.contains("runlimit_demo::server: stopped"), "{stderr}");
    for secret in ["alice", "Alice", "correct horse", "127.0.0.1", "client-v4"] {
        assert!(!stderr.contains(secret), "stderr leaks {secret:?}:\n{stderr}");
    }
}

#[test]
fn a_short_key_secret_is_refused_at_startup() {
    let (status, stderr) = Demo::run_to_exit(&[], &[("RUNLIMIT_KEY_SECRET", "too short")]);
    assert_eq!(status.code(), Some(1));
    assert_eq!(
        stderr.trim_end(),
        "runlimit-demo: no usable key secret: RUNLIMIT_KEY_SECRET is 9 bytes long, below the minimum of 32"
    );

    let (status, stderr) = Demo::run_to_exit(&["--client-limit", "0"], &[("RUNLIMIT_KEY_SECRET", SECRET)]);
    assert_eq!(status.code(), Some(1));
    assert_eq!(
        stderr.trim_end(),
        "runlimit-demo: invalid rate-limit options: invalid login-client policy: limit must be at least 1"
    );
}

#[tokio::test]
async fn a_full_store_fails_closed_with_temporary_reduced_capacity() {
    // Every memory store holds one key; clients are named by a trusted proxy's header.
    let demo = Demo::start(
        &[
            "--memory-max-keys",
            "1",
            "--memory-shards",
            "1",
            "--trusted-proxy",
            "127.0.0.1",
            "--items-quota",
            "1",
            "--items-period-secs",
            "10",
            "--items-burst",
            "1",
        ],
        &[],
    );
    let http = Http::new();
    let first = [("x-forwarded-for", "198.51.100.1")];
    let second = [("x-forwarded-for", "198.51.100.2")];

    assert_eq!(http.get(&demo.url("/items"), &first).await.status, StatusCode::OK);
    // A new client does not fit: 503, retry when the one stored key expires (its GCRA state
    // is fully replenished 10 s after its request).
    let reply = http.get(&demo.url("/items"), &second).await;
    assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(reply.header("content-type"), Some("application/problem+json"));
    assert_fields(&reply, None, None, Some("10"));
    assert_eq!(
        reply.json(),
        serde_json::json!({
            "type": "https://iana.org/assignments/http-problem-types#temporary-reduced-capacity",
            "title": "Request cannot be satisfied due to temporary server capacity constraints",
            "status": 503,
            "detail": "rate-limit storage of policy \"items\" is full; retry later",
            "violated-policies": ["items"],
        })
    );

    // The identity store is full after one identity: the next identity is refused by the
    // identity gate, and the response still describes the client gate it passed.
    let body = serde_json::json!({ "identity": ALICE, "password": ALICE_PASSWORD }).to_string();
    let reply = http.post_json(&demo.url("/login"), &body, &first).await;
    assert_eq!(reply.status, StatusCode::OK);
    let body =
        serde_json::json!({ "identity": "bob@example.test", "password": "hunter2hunter2" }).to_string();
    let reply = http.post_json(&demo.url("/login"), &body, &first).await;
    assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_fields(
        &reply,
        Some(r#""login-client";q=40;w=60"#),
        Some(r#""login-client";r=38;t=60"#),
        Some("600"),
    );
    assert_eq!(reply.json()["violated-policies"], serde_json::json!(["login-identity"]));
}

#[tokio::test]
async fn password_checks_back_off_per_identity_and_a_success_resets() {
    // Initial delay 1 s, doubling per consecutive failure; client and identity quotas high
    // enough never to refuse here.
    let demo = Demo::start(
        &[
            "--identity-limit",
            "20",
            "--attempt-initial-delay-secs",
            "1",
            "--attempt-delay-cap-secs",
            "60",
            "--attempt-quiet-period-secs",
            "900",
            "--attempt-lease-secs",
            "30",
        ],
        &[],
    );
    let http = Http::new();
    let policy = Some(r#""login-client";q=40;w=60, "login-identity";q=20;w=600"#);
    // Both quota gates admit every request below; `t` may drop by the seconds slept (< 5).
    let fields =
        |client: u64, identity: u64| [("login-client", client, 60), ("login-identity", identity, 600)];

    // 1: wrong password -> 401; the failure starts a 1 s backoff for alice.
    let reply = http.login(&demo, ALICE, "wrong").await;
    assert_eq!(reply.status, StatusCode::UNAUTHORIZED, "{reply:?}");
    assert_eq!(reply.json(), unauthorized_body());
    assert_fields(&reply, policy, Some(r#""login-client";r=39;t=60, "login-identity";r=19;t=600"#), None);

    // 2: immediate retry (even with the right password, after normalization) -> 429 by the
    // attempt limiter, Retry-After 1.
    let reply = http.login(&demo, " Alice@Example.TEST ", ALICE_PASSWORD).await;
    assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS, "{reply:?}");
    assert_eq!(reply.header("content-type"), Some("application/problem+json"));
    assert_eq!(reply.header("ratelimit-policy"), policy);
    assert_eq!(reply.header("retry-after"), Some("1"));
    assert_ratelimit(&reply, &[&fields(38, 18)[..], &[("login-attempts", 0, 1)]].concat(), 5);
    assert!(reply.header("ratelimit").unwrap().ends_with(r#", "login-attempts";r=0;t=1"#));
    assert_eq!(reply.json(), attempt_backoff_body(1));

    // Another identity is not affected.
    let reply = http.login(&demo, "bob@example.test", "hunter2hunter2").await;
    assert_eq!(reply.status, StatusCode::OK, "{reply:?}");

    // 3: after the 1 s delay, wrong again -> 401; now 2 consecutive failures.
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let reply = http.login(&demo, ALICE, "wrong").await;
    assert_eq!(reply.status, StatusCode::UNAUTHORIZED, "{reply:?}");
    assert_eq!(reply.json(), unauthorized_body());
    assert_eq!(reply.header("retry-after"), None);
    assert_ratelimit(&reply, &fields(36, 17), 5);

    // 4: immediate retry -> 429, Retry-After 2 (the delay doubled).
    let reply = http.login(&demo, ALICE, ALICE_PASSWORD).await;
    assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS, "{reply:?}");
    assert_eq!(reply.header("ratelimit-policy"), policy);
    assert_eq!(reply.header("retry-after"), Some("2"));
    assert_ratelimit(&reply, &[&fields(35, 16)[..], &[("login-attempts", 0, 2)]].concat(), 5);
    assert!(reply.header("ratelimit").unwrap().ends_with(r#", "login-attempts";r=0;t=2"#));
    assert_eq!(reply.json(), attempt_backoff_body(2));

    // 5: after the 2 s delay, the right password -> 200, which resets alice's failures.
    tokio::time::sleep(Duration::from_millis(2_100)).await;
    let reply = http.login(&demo, ALICE, ALICE_PASSWORD).await;
    assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
    assert_eq!(reply.body, r#"{"authenticated":true}"#);
    assert_eq!(reply.header("retry-after"), None);
    assert_ratelimit(&reply, &fields(34, 15), 5);

    // 6: reset: a wrong password right after is admitted (401), and the next retry waits the
    // initial 1 s again, not 4 s.
    let reply = http.login(&demo, ALICE, "wrong").await;
    assert_eq!(reply.status, StatusCode::UNAUTHORIZED, "{reply:?}");
    let reply = http.login(&demo, ALICE, "wrong").await;
    assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS, "{reply:?}");
    assert_eq!(reply.header("retry-after"), Some("1"));
    assert_ratelimit(&reply, &[&fields(32, 13)[..], &[("login-attempts", 0, 1)]].concat(), 5);
    assert!(reply.header("ratelimit").unwrap().ends_with(r#", "login-attempts";r=0;t=1"#));
    assert_eq!(reply.json(), attempt_backoff_body(1));

    let (status, stderr) = demo.terminate();
    assert!(status.success(), "{stderr}");
    for (operation, event) in [
        ("admission", "admitted"),
        ("admission", "denied_backoff"),
        ("complete_failure", "completed_failure"),
        ("complete_success", "completed_success"),
    ] {
        let line = format!(
            r#"attempt backend="memory" policy="demo.login" scope="attempt" operation="{operation}" event="{event}""#
        );
        assert!(stderr.contains(&line), "no {line:?} in:\n{stderr}");
    }
    for secret in ["alice", "Alice", "correct horse", "wrong", "127.0.0.1"] {
        assert!(!stderr.contains(secret), "stderr leaks {secret:?}:\n{stderr}");
    }
}

#[tokio::test]
async fn metrics_count_exactly_the_requests_served() {
    let demo = Demo::start(
        &[
            "--client-limit",
            "3",
            "--identity-limit",
            "2",
            "--items-quota",
            "1",
            "--items-period-secs",
            "60",
            "--items-burst",
            "2",
        ],
        &[],
    );
    let http = Http::new();
    // Items: a burst of 2, then 2 refusals.
    for expected in
        [StatusCode::OK, StatusCode::OK, StatusCode::TOO_MANY_REQUESTS, StatusCode::TOO_MANY_REQUESTS]
    {
        assert_eq!(http.get(&demo.url("/items"), &[]).await.status, expected);
    }
    // Logins: success, wrong password, refused by the identity gate (2 per window), then by the
    // client gate (3 per window).
    assert_eq!(http.login(&demo, ALICE, ALICE_PASSWORD).await.status, StatusCode::OK);
    assert_eq!(http.login(&demo, ALICE, "wrong").await.status, StatusCode::UNAUTHORIZED);
    assert_eq!(http.login(&demo, ALICE, ALICE_PASSWORD).await.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(http.login(&demo, ALICE, ALICE_PASSWORD).await.status, StatusCode::TOO_MANY_REQUESTS);
    // Neither 404s nor scrapes are admissions.
    assert_eq!(http.get(&demo.url("/nope"), &[]).await.status, StatusCode::NOT_FOUND);
    assert_eq!(http.get(&demo.url("/metrics"), &[]).await.status, StatusCode::OK);

    let reply = http.get(&demo.url("/metrics"), &[]).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.header("content-type"), Some("text/plain; version=0.0.4; charset=utf-8"));
    assert_eq!(reply.header("ratelimit"), None, "the scrape is ungated");
    let check =
        |policy, scope, outcome, consumption| check_series("memory", policy, scope, outcome, consumption);
    let expected = counts([
        (check("demo.items", "client", "allowed", "consumed"), "2"),
        (check("demo.items", "client", "quota_exceeded", "not_consumed"), "2"),
        (check("demo.login", "client", "allowed", "consumed"), "3"),
        (check("demo.login", "client", "quota_exceeded", "not_consumed"), "1"),
        (check("demo.login", "identity", "allowed", "consumed"), "2"),
        (check("demo.login", "identity", "quota_exceeded", "not_consumed"), "1"),
    ]);
    assert_eq!(scraped(&reply.body, "runlimit_admissions_total"), expected, "{}", reply.body);
    let attempt = |operation, event| attempt_series("memory", operation, event);
    let expected = counts([
        (attempt("admission", "admitted"), "2"),
        (attempt("complete_success", "completed_success"), "1"),
        (attempt("complete_failure", "completed_failure"), "1"),
    ]);
    assert_eq!(scraped(&reply.body, "runlimit_attempts_total"), expected, "{}", reply.body);
    // Durations are histograms in seconds: one sample per admission.
    let durations = scraped(&reply.body, "runlimit_admission_duration_seconds_count");
    assert_eq!(
        durations[r#"backend="memory",policy="demo.items",scope="client",operation="check",outcome="allowed""#],
        "2"
    );
    // No subject material in any label: not the identity, not the client address.
    assert!(!reply.body.contains("alice") && !reply.body.contains("127.0.0.1"), "{}", reply.body);
}
