//! Real HTTP with the real process-local backends, `runlimit_memory::{MemoryStore, GcraStore}`.

use std::{sync::Arc, time::Duration};

use axum::{Router, routing::post};
use http::StatusCode;
use runlimit_axum::RateLimitLayer;
use runlimit_core::{GcraPolicy, PolicyId, QuotaMode, ScopeId};
use runlimit_memory::{GcraStore, MemoryStore, MemoryStoreConfig};

use crate::{
    real_http::{Server, client, header_names, post_text},
    support::{Calls, WeightedIdentity, handler, identity_header, peer, policy, reject},
};

#[tokio::test]
async fn memory_store_gates_over_real_http() {
    // A hard-bounded per-client gate and a per-identity gate sharing one store.
    let store = Arc::new(MemoryStore::new(MemoryStoreConfig::new(1_000).unwrap()));
    let calls = Calls::default();
    let app = Router::new()
        .route("/login", post(handler))
        .route_layer(RateLimitLayer::new(Arc::clone(&store), policy("identity", 2), identity_header, reject))
        .route_layer(RateLimitLayer::new(Arc::clone(&store), policy("client", 3), peer, reject))
        .with_state(calls.clone());
    let server = Server::start(app).await;
    let client = client();

    let (first, body) = post_text(&client, &server.url(), Some("Carol@Example.Test"), "1").await;
    assert_eq!(first.status(), StatusCode::OK);
    assert_eq!(
        first.headers()["ratelimit-policy"],
        r#""auth.login-client";q=3;w=60, "auth.login-identity";q=2;w=60"#
    );
    // Anchored windows: the remaining time, rounded up, is 60 s within the first second.
    assert_eq!(
        first.headers()["ratelimit"],
        r#""auth.login-client";r=2;t=60, "auth.login-identity";r=1;t=60"#
    );
    assert_eq!(body, "1|client=allowed:2,identity=allowed:1");

    let (second, _) = post_text(&client, &server.url(), Some("carol@example.test"), "2").await;
    assert_eq!(
        second.headers()["ratelimit"],
        r#""auth.login-client";r=1;t=60, "auth.login-identity";r=0;t=60"#
    );

    let (denied, body) = post_text(&client, &server.url(), Some("CAROL@example.test"), "3").await;
    assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(denied.headers()["retry-after"], "60");
    assert_eq!(denied.headers()["ratelimit"], r#""auth.login-identity";r=0;t=60"#);
    assert_eq!(
        header_names(&denied),
        ["content-length", "content-type", "date", "ratelimit", "ratelimit-policy", "retry-after"]
    );
    assert_eq!(
        body,
        r#"{"type":"https://iana.org/assignments/http-problem-types#quota-exceeded","status":429,"violated-policies":["auth.login-identity"]}"#
    );

    // The client gate consumed its third unit before the identity gate denied; the fourth
    // request is denied by the client gate, whatever the identity.
    let (denied, _) = post_text(&client, &server.url(), Some("dave@example.test"), "4").await;
    assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(denied.headers()["ratelimit"], r#""auth.login-client";r=0;t=60"#);
    assert_eq!(calls.get(), 2);
}

#[tokio::test]
async fn gcra_store_gate_over_real_http() {
    // 10 units per second, burst 2: `t` is the time to full replenishment, rounded up.
    let store = Arc::new(GcraStore::new(MemoryStoreConfig::new(1_000).unwrap()));
    let read = GcraPolicy::new(
        PolicyId::new("api.read").unwrap(),
        ScopeId::new("client").unwrap(),
        10,
        Duration::from_secs(1),
        2,
    )
    .unwrap();
    let calls = Calls::default();
    let app = Router::new()
        .route("/login", post(handler))
        .route_layer(RateLimitLayer::new(Arc::clone(&store), read, peer, reject))
        .with_state(calls.clone());
    let server = Server::start(app).await;
    let client = client();

    let (first, body) = post_text(&client, &server.url(), None, "a").await;
    assert_eq!(first.headers()["ratelimit-policy"], r#""api.read-client";q=10;w=1"#);
    assert_eq!(first.headers()["ratelimit"], r#""api.read-client";r=1;t=1"#);
    assert_eq!(body, "a|client=allowed:1");
    // Two more back to back: at least one is denied unless 100 ms passed in between, and a
    // denial's Retry-After is the next unit (≤ 100 ms) rounded up to 1 s.
    let mut statuses = Vec::new();
    for body in ["b", "c"] {
        let (response, _) = post_text(&client, &server.url(), None, body).await;
        if response.status() == StatusCode::TOO_MANY_REQUESTS {
            assert_eq!(response.headers()["retry-after"], "1");
            assert_eq!(response.headers()["ratelimit"], r#""api.read-client";r=0;t=1"#);
        } else {
            assert_eq!(response.status(), StatusCode::OK);
        }
        statuses.push(response.status());
    }
    assert_eq!(calls.get(), 1 + statuses.iter().filter(|status| **status == StatusCode::OK).count());
}

#[tokio::test]
async fn shadow_memory_gate_admits_over_real_http() {
    let store = Arc::new(MemoryStore::new(MemoryStoreConfig::new(10).unwrap()));
    let calls = Calls::default();
    let app = Router::new()
        .route("/login", post(handler))
        .route_layer(RateLimitLayer::new(
            Arc::clone(&store),
            policy("client", 1).with_quota_mode(QuotaMode::Shadow),
            peer,
            reject,
        ))
        .with_state(calls.clone());
    let server = Server::start(app).await;
    let client = client();
    let (_, body) = post_text(&client, &server.url(), None, "a").await;
    assert_eq!(body, "a|client=allowed:0");
    let (shadowed, body) = post_text(&client, &server.url(), None, "b").await;
    assert_eq!(shadowed.status(), StatusCode::OK);
    assert_eq!(shadowed.headers()["ratelimit"], r#""auth.login-client";r=0;t=60"#);
    assert_eq!(body, "b|client=shadow:60");
    assert_eq!(calls.get(), 2);
}

/// Posts `body` with `x-identity: erin` and, when given, `x-cost`.
async fn post_costing(
    server: &Server,
    cost: Option<&str>,
    body: &'static str,
) -> (StatusCode, String, String) {
    use http_body_util::{BodyExt as _, Full};
    let mut request = http::Request::post(server.url()).header("x-identity", "erin");
    if let Some(cost) = cost {
        request = request.header("x-cost", cost);
    }
    let response = client().request(request.body(Full::from(body)).unwrap()).await.unwrap();
    let status = response.status();
    let ratelimit =
        response.headers().get("ratelimit").map_or(String::new(), |value| value.to_str().unwrap().to_owned());
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    (status, ratelimit, String::from_utf8(bytes.to_vec()).unwrap())
}

#[tokio::test]
async fn weighted_requests_consume_the_cost_the_head_declares_over_real_http() {
    // L = 10 per 60 s, keyed by identity, charged by `x-cost`.
    let store = Arc::new(MemoryStore::new(MemoryStoreConfig::new(1_000).unwrap()));
    let calls = Calls::default();
    let app = Router::new()
        .route("/login", post(handler))
        .route_layer(RateLimitLayer::new(
            Arc::clone(&store),
            policy("identity", 10),
            WeightedIdentity,
            reject,
        ))
        .with_state(calls.clone());
    let server = Server::start(app).await;

    // A cost of 4 leaves 10 − 4 = 6, and `r` in the RateLimit field follows it.
    let (status, ratelimit, body) = post_costing(&server, Some("4"), "a").await;
    assert_eq!(
        (status, ratelimit.as_str(), body.as_str()),
        (StatusCode::OK, r#""auth.login-identity";r=6;t=60"#, "a|identity=allowed:6")
    );
    // Impossible costs are the mapper's 413, before the limiter: nothing is consumed.
    let (status, _, body) = post_costing(&server, Some("11"), "b").await;
    assert_eq!(
        (status, body.as_str()),
        (StatusCode::PAYLOAD_TOO_LARGE, "a cost of 11 units exceeds the policy's capacity of 10")
    );
    let (status, _, body) = post_costing(&server, Some("0"), "c").await;
    assert_eq!((status, body.as_str()), (StatusCode::PAYLOAD_TOO_LARGE, "a check must cost at least 1 unit"));
    // A head that does not say what it costs is an extraction error.
    let (status, _, body) = post_costing(&server, Some("lots"), "d").await;
    assert_eq!((status, body.as_str()), (StatusCode::BAD_REQUEST, "missing a numeric x-cost"));
    // 7 does not fit the 6 left: denied, consuming nothing; 6 then fits exactly.
    let (status, ratelimit, _) = post_costing(&server, Some("7"), "e").await;
    assert_eq!(
        (status, ratelimit.as_str()),
        (StatusCode::TOO_MANY_REQUESTS, r#""auth.login-identity";r=0;t=60"#)
    );
    let (status, _, body) = post_costing(&server, Some("6"), "f").await;
    assert_eq!((status, body.as_str()), (StatusCode::OK, "f|identity=allowed:0"));
    // Without the header a request costs 1, which no longer fits.
    let (status, _, _) = post_costing(&server, None, "g").await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(calls.get(), 2, "only the two allowed requests reached the handler");
}
