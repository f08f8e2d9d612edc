//! Through `axum::Router::oneshot`.

use std::sync::{
    Arc,
    atomic::{AtomicUsize, Ordering},
};

use axum::{Router, body::Body, routing::post};
use http::{Request, StatusCode};
use runlimit_axum::RateLimitLayer;
use runlimit_core::{FixedWindowPolicy, SubjectKey};
use tower::ServiceExt as _;

use crate::support::{
    Calls, CountingBody, MissingHeader, Mode, PanickingBody, TestLimiter, client_header, handler, hasher,
    identity_header, policy, reject, shadow, text,
};

fn request(client: Option<&str>, identity: Option<&str>, body: Body) -> Request<Body> {
    let mut builder = Request::post("/login");
    if let Some(client) = client {
        builder = builder.header("x-client", client);
    }
    if let Some(identity) = identity {
        builder = builder.header("x-identity", identity);
    }
    builder.body(body).unwrap()
}

fn client_gate(limiter: &Arc<TestLimiter>, policy: FixedWindowPolicy) -> Router {
    Router::new()
        .route("/login", post(handler))
        .route_layer(RateLimitLayer::new(Arc::clone(limiter), policy, client_header, reject))
        .with_state(Calls::default())
}

#[tokio::test]
async fn allowed_request_reaches_handler_with_its_admission() {
    let limiter = TestLimiter::new();
    let calls = Calls::default();
    let app = Router::new()
        .route("/login", post(handler))
        .route_layer(RateLimitLayer::new(Arc::clone(&limiter), policy("client", 2), client_header, reject))
        .with_state(calls.clone());
    let reads = Arc::new(AtomicUsize::new(0));
    let body = CountingBody::wrap(Body::from("hello"), Arc::clone(&reads));

    let response = app.oneshot(request(Some("c1"), None, body)).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.headers()["ratelimit-policy"], r#""auth.login-client";q=2;w=60"#);
    assert_eq!(response.headers()["ratelimit"], r#""auth.login-client";r=1;t=60"#);
    assert_eq!(text(response).await, "hello|client=allowed:1");
    assert_eq!(calls.get(), 1);
    assert!(reads.load(Ordering::SeqCst) > 0, "the handler read the admitted body");
    assert_eq!(limiter.checks(), 1);
}

#[tokio::test]
async fn enforced_denial_short_circuits_before_the_body_is_read() {
    let limiter = TestLimiter::new();
    let calls = Calls::default();
    let app = Router::new()
        .route("/login", post(handler))
        .route_layer(RateLimitLayer::new(Arc::clone(&limiter), policy("client", 1), client_header, reject))
        .with_state(calls.clone());

    let first = app.clone().oneshot(request(Some("c1"), None, Body::from("a"))).await.unwrap();
    assert_eq!(first.status(), StatusCode::OK);

    let reads = Arc::new(AtomicUsize::new(0));
    let body = CountingBody::wrap(Body::from("never read"), Arc::clone(&reads));
    let denied = app.clone().oneshot(request(Some("c1"), None, body)).await.unwrap();
    assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(denied.headers()["retry-after"], "60");
    assert_eq!(denied.headers()["ratelimit"], r#""auth.login-client";r=0;t=60"#);
    assert_eq!(reads.load(Ordering::SeqCst), 0, "a denied request's body is never polled");
    assert_eq!(calls.get(), 1, "the handler ran for the first request only");

    // A body that panics on read is never touched either.
    let denied = app.clone().oneshot(request(Some("c1"), None, Body::new(PanickingBody))).await.unwrap();
    assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(calls.get(), 1);
    // Another client still has its own quota.
    let other = app.oneshot(request(Some("c2"), None, Body::from("b"))).await.unwrap();
    assert_eq!(text(other).await, "b|client=allowed:0");
    assert_eq!(limiter.checks(), 4);
}

#[tokio::test]
async fn stacked_layers_are_both_recorded_outermost_first() {
    let limiter = TestLimiter::new();
    let calls = Calls::default();
    let client = Arc::new(policy("client", 3));
    let identity = Arc::new(policy("identity", 2));
    // In axum the layer added last runs first: client, then identity.
    let app = Router::new()
        .route("/login", post(handler))
        .route_layer(RateLimitLayer::new(
            Arc::clone(&limiter),
            Arc::clone(&identity),
            identity_header,
            reject,
        ))
        .route_layer(RateLimitLayer::new(Arc::clone(&limiter), Arc::clone(&client), client_header, reject))
        .with_state(calls.clone());

    let ok =
        app.clone().oneshot(request(Some("c1"), Some("USER@example.test"), Body::from("1"))).await.unwrap();
    assert_eq!(ok.status(), StatusCode::OK);
    assert_eq!(ok.headers()["ratelimit"], r#""auth.login-client";r=2;t=60, "auth.login-identity";r=1;t=60"#);
    assert_eq!(
        ok.headers()["ratelimit-policy"],
        r#""auth.login-client";q=3;w=60, "auth.login-identity";q=2;w=60"#
    );
    assert_eq!(text(ok).await, "1|client=allowed:2,identity=allowed:1");

    // The identity is normalized by the extractor, so the case differs but the quota is shared.
    let ok =
        app.clone().oneshot(request(Some("c2"), Some("user@example.test"), Body::from("2"))).await.unwrap();
    assert_eq!(text(ok).await, "2|client=allowed:2,identity=allowed:0");

    // The identity gate denies; the client gate had already consumed (separate checks).
    let denied =
        app.clone().oneshot(request(Some("c1"), Some("user@EXAMPLE.test"), Body::from("3"))).await.unwrap();
    assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(denied.headers()["ratelimit"], r#""auth.login-identity";r=0;t=60"#);
    assert_eq!(
        text(denied).await,
        r#"{"type":"https://iana.org/assignments/http-problem-types#quota-exceeded","status":429,"violated-policies":["auth.login-identity"]}"#
    );
    assert_eq!(calls.get(), 2);
    assert_eq!(limiter.checks(), 6);

    // An outer denial stops the request before the inner gate is checked.
    for identity in ["other0", "other1", "other2"] {
        let ok = app.clone().oneshot(request(Some("c3"), Some(identity), Body::empty())).await.unwrap();
        assert_eq!(ok.status(), StatusCode::OK);
    }
    let checks = limiter.checks();
    let denied = app.oneshot(request(Some("c3"), Some("fresh"), Body::empty())).await.unwrap();
    assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(denied.headers()["ratelimit"], r#""auth.login-client";r=0;t=60"#);
    assert_eq!(limiter.checks(), checks + 1, "the client denial skips the identity gate");
    assert_eq!(calls.get(), 5);
}

#[tokio::test]
async fn admissions_are_looked_up_by_policy() {
    let limiter = TestLimiter::new();
    let client = Arc::new(policy("client", 5));
    let identity = Arc::new(shadow("identity", 1));
    let unrelated = policy("client", 6);
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let record = {
        let (client, identity, seen) = (Arc::clone(&client), Arc::clone(&identity), Arc::clone(&seen));
        move |axum::Extension(admissions): axum::Extension<runlimit_axum::Admissions>| {
            let mut seen = seen.lock().unwrap();
            seen.push(admissions.get(&*client).map(|a| crate::support::describe(a.decision())));
            seen.push(admissions.get(&*identity).map(|a| crate::support::describe(a.decision())));
            seen.push(admissions.get(&unrelated).map(|a| crate::support::describe(a.decision())));
            seen.push(Some(format!("{admissions:?}")));
            async {}
        }
    };
    let app = Router::new()
        .route("/login", post(record))
        .route_layer(RateLimitLayer::new(
            Arc::clone(&limiter),
            Arc::clone(&identity),
            identity_header,
            reject,
        ))
        .route_layer(RateLimitLayer::new(Arc::clone(&limiter), Arc::clone(&client), client_header, reject));
    for _ in 0..2 {
        let response = app.clone().oneshot(request(Some("c"), Some("u"), Body::empty())).await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
    }
    let seen = seen.lock().unwrap();
    assert_eq!(seen[0..3], [Some("allowed:4".to_owned()), Some("allowed:0".to_owned()), None]);
    assert_eq!(seen[4..7], [Some("allowed:3".to_owned()), Some("shadow:60".to_owned()), None]);
    assert_eq!(
        seen[7].as_deref().unwrap(),
        "[Admission { policy: PolicyId(\"auth.login\"), scope: ScopeId(\"client\"), quota_mode: Enforce, decision: \
         Allowed(Allowance { capacity: Capacity(5), available: 3, replenishes_after: Delay(60s) }) }, \
         Admission { policy: PolicyId(\"auth.login\"), scope: ScopeId(\"identity\"), quota_mode: Shadow, decision: \
         ShadowDenied(QuotaDenial { capacity: Capacity(1), retry_after: Delay(60s) }) }]"
    );
}

#[tokio::test]
async fn shadow_mode_admits_and_reports_what_enforcement_would_have_applied() {
    let limiter = TestLimiter::new();
    let app = client_gate(&limiter, shadow("client", 1));
    let first = app.clone().oneshot(request(Some("c1"), None, Body::from("a"))).await.unwrap();
    assert_eq!(text(first).await, "a|client=allowed:0");
    for body in ["b", "c"] {
        let shadowed = app.clone().oneshot(request(Some("c1"), None, Body::from(body))).await.unwrap();
        assert_eq!(shadowed.status(), StatusCode::OK);
        assert_eq!(shadowed.headers()["ratelimit"], r#""auth.login-client";r=0;t=60"#);
        assert!(shadowed.headers().get("retry-after").is_none());
        assert_eq!(text(shadowed).await, format!("{body}|client=shadow:60"));
    }
}

#[tokio::test]
async fn extractor_errors_are_mapped_without_consulting_the_limiter() {
    let limiter = TestLimiter::new();
    let calls = Calls::default();
    let app = Router::new()
        .route("/login", post(handler))
        .route_layer(RateLimitLayer::new(Arc::clone(&limiter), policy("client", 5), client_header, reject))
        .with_state(calls.clone());
    let response = app.oneshot(request(None, None, Body::new(PanickingBody))).await.unwrap();
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    assert_eq!(text(response).await, "missing x-client");
    assert_eq!(limiter.checks(), 0);
    assert_eq!(calls.get(), 0);
}

#[tokio::test]
async fn backend_errors_and_storage_denials_are_mapped_fail_closed() {
    let limiter = TestLimiter::new();
    let calls = Calls::default();
    let app = Router::new()
        .route("/login", post(handler))
        .route_layer(RateLimitLayer::new(Arc::clone(&limiter), shadow("client", 5), client_header, reject))
        .with_state(calls.clone());

    limiter.set_mode(Mode::Fail);
    let response = app.clone().oneshot(request(Some("c"), None, Body::new(PanickingBody))).await.unwrap();
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(text(response).await, "client unavailable: backend down");

    // Storage capacity is fail-closed even for a shadow policy.
    limiter.set_mode(Mode::Full);
    let response = app.clone().oneshot(request(Some("c"), None, Body::new(PanickingBody))).await.unwrap();
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(response.headers()["retry-after"], "7");
    assert!(response.headers().get("ratelimit").is_none());
    assert_eq!(text(response).await, "storage full");

    limiter.set_mode(Mode::Normal);
    let response = app.oneshot(request(Some("c"), None, Body::from("ok"))).await.unwrap();
    assert_eq!(text(response).await, "ok|client=allowed:4");
    assert_eq!(calls.get(), 1);
    assert_eq!(limiter.checks(), 3);
}

#[tokio::test]
async fn the_extractor_cannot_substitute_the_policy() {
    // The extractor hashes for another policy; the layer still binds the key to, evaluates
    // and records its own configured policy.
    let limiter = TestLimiter::new();
    let configured = Arc::new(policy("client", 1));
    let elsewhere = policy("elsewhere", 100);
    let extractor =
        move |_: &http::request::Parts, _: &FixedWindowPolicy| -> Result<SubjectKey, MissingHeader> {
            Ok(hasher().hash_for(&elsewhere, b"subject").into_unbound_subject_key())
        };
    let calls = Calls::default();
    let app = Router::new()
        .route("/login", post(handler))
        .route_layer(RateLimitLayer::new(Arc::clone(&limiter), Arc::clone(&configured), extractor, reject))
        .with_state(calls.clone());
    let ok = app.clone().oneshot(request(None, None, Body::from("x"))).await.unwrap();
    assert_eq!(text(ok).await, "x|client=allowed:0");
    let denied = app.oneshot(request(None, None, Body::from("y"))).await.unwrap();
    assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS, "counted under the configured limit of 1");
}

#[tokio::test]
async fn layer_debug_names_the_policy_only() {
    let limiter = TestLimiter::new();
    let layer = RateLimitLayer::new(limiter, shadow("client", 5), client_header, reject);
    assert_eq!(
        format!("{layer:?}"),
        r#"RateLimitLayer { policy: PolicyId("auth.login"), scope: ScopeId("client"), quota_mode: Shadow, .. }"#
    );
    assert_eq!(layer.policy().limit().get(), 5);
    assert_eq!(layer.limiter().checks(), 0);
}
