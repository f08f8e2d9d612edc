//! The documented per-route pattern over real HTTP: the gate on the method router
//! (`post(handler).route_layer(gate)`) and `CorsLayer` outside it, so 404s, 405s and CORS
//! preflights consume no quota and a denied cross-origin request still carries CORS headers.

use std::sync::Arc;

use axum::{Router, routing::post};
use bytes::Bytes;
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::{BodyExt as _, Full};
use runlimit_axum::RateLimitLayer;
use tower_http::cors::CorsLayer;

use crate::{
    real_http::{Server, client},
    support::{Calls, TestLimiter, handler, peer, policy, reject},
};

const ORIGIN: &str = "https://app.example";

/// The crate docs' pattern: the gate wraps the `POST` handler only; CORS wraps the router.
fn app(limiter: &Arc<TestLimiter>, calls: &Calls, cors: bool) -> Router {
    let gate = RateLimitLayer::new(Arc::clone(limiter), policy("client", 2), peer, reject);
    let router = Router::new().route("/login", post(handler).route_layer(gate)).with_state(calls.clone());
    if cors {
        // As the crate docs configure it.
        let cors = CorsLayer::new()
            .allow_origin(http::HeaderValue::from_static(ORIGIN))
            .allow_methods([Method::POST])
            .allow_headers([header::CONTENT_TYPE])
            .expose_headers([
                header::RETRY_AFTER,
                http::HeaderName::from_static("ratelimit"),
                http::HeaderName::from_static("ratelimit-policy"),
            ]);
        router.layer(cors)
    } else {
        router
    }
}

async fn send(server: &Server, method: Method, path: &str, cross_origin: bool) -> (Response<()>, String) {
    let url = server.url().replace("/login", path);
    let mut request = Request::builder().method(method.clone()).uri(url);
    if cross_origin {
        request = request.header(header::ORIGIN, ORIGIN);
    }
    if method == Method::OPTIONS {
        request = request
            .header(header::ACCESS_CONTROL_REQUEST_METHOD, "POST")
            .header(header::ACCESS_CONTROL_REQUEST_HEADERS, "content-type");
    }
    let body = if method == Method::POST { Full::from("hello") } else { Full::new(Bytes::new()) };
    let response = client().request(request.body(body).unwrap()).await.unwrap();
    let (parts, body) = response.into_parts();
    let bytes = body.collect().await.unwrap().to_bytes();
    (Response::from_parts(parts, ()), String::from_utf8(bytes.to_vec()).unwrap())
}

#[tokio::test]
async fn preflights_405s_and_404s_consume_nothing_and_a_denial_keeps_its_cors_headers() {
    let limiter = TestLimiter::new();
    let calls = Calls::default();
    let server = Server::start(app(&limiter, &calls, true)).await;

    // Five preflights, as a browser sends before cross-origin POSTs: answered by CorsLayer.
    for _ in 0..5 {
        let (preflight, _) = send(&server, Method::OPTIONS, "/login", true).await;
        assert_eq!(preflight.status(), StatusCode::OK);
        assert_eq!(preflight.headers()[header::ACCESS_CONTROL_ALLOW_ORIGIN], ORIGIN);
        assert_eq!(preflight.headers()[header::ACCESS_CONTROL_ALLOW_METHODS], "POST");
        assert_eq!(preflight.headers()[header::ACCESS_CONTROL_ALLOW_HEADERS], "content-type");
        assert!(preflight.headers().get("ratelimit").is_none());
    }
    // A GET on the POST-only route, and an unknown path.
    let (get, _) = send(&server, Method::GET, "/login", true).await;
    assert_eq!(get.status(), StatusCode::METHOD_NOT_ALLOWED);
    let (missing, _) = send(&server, Method::POST, "/nope", true).await;
    assert_eq!(missing.status(), StatusCode::NOT_FOUND);
    assert_eq!(limiter.checks(), 0, "nothing above reached the gate");

    // The limit's worth of POSTs, then a 429 that still carries the CORS headers.
    for remaining in [1, 0] {
        let (ok, body) = send(&server, Method::POST, "/login", true).await;
        assert_eq!(ok.status(), StatusCode::OK);
        assert_eq!(ok.headers()["ratelimit"], format!(r#""auth.login-client";r={remaining};t=60"#).as_str());
        assert_eq!(ok.headers()[header::ACCESS_CONTROL_ALLOW_ORIGIN], ORIGIN);
        assert_eq!(body, format!("hello|client=allowed:{remaining}"));
    }
    let (denied, _) = send(&server, Method::POST, "/login", true).await;
    assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(denied.headers()[header::RETRY_AFTER], "60");
    assert_eq!(denied.headers()["ratelimit"], r#""auth.login-client";r=0;t=60"#);
    assert_eq!(denied.headers()[header::ACCESS_CONTROL_ALLOW_ORIGIN], ORIGIN, "a browser can read the 429");
    assert_eq!(
        denied.headers()[header::ACCESS_CONTROL_EXPOSE_HEADERS],
        "retry-after,ratelimit,ratelimit-policy",
        "and its Retry-After and RateLimit fields"
    );
    assert_eq!(limiter.checks(), 3);
    assert_eq!(calls.get(), 2);
}

#[tokio::test]
async fn without_cors_a_preflight_is_a_405_that_consumes_nothing() {
    let limiter = TestLimiter::new();
    let calls = Calls::default();
    let server = Server::start(app(&limiter, &calls, false)).await;
    for _ in 0..5 {
        let (preflight, _) = send(&server, Method::OPTIONS, "/login", true).await;
        assert_eq!(preflight.status(), StatusCode::METHOD_NOT_ALLOWED);
    }
    assert_eq!(send(&server, Method::GET, "/login", false).await.0.status(), StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(limiter.checks(), 0);
    for remaining in [1, 0] {
        let (ok, _) = send(&server, Method::POST, "/login", false).await;
        assert_eq!(ok.headers()["ratelimit"], format!(r#""auth.login-client";r={remaining};t=60"#).as_str());
    }
    assert_eq!(send(&server, Method::POST, "/login", false).await.0.status(), StatusCode::TOO_MANY_REQUESTS);
}

/// Why the docs put the gate on the method router: `Router::route_layer` wraps the whole
/// method router, whose 405 answer (to a preflight, say) then runs behind the gate and spends
/// quota. Pinned so that the docs are revisited if axum ever changes this.
#[tokio::test]
async fn a_router_level_route_layer_spends_quota_on_405s() {
    let limiter = TestLimiter::new();
    let calls = Calls::default();
    let gate = RateLimitLayer::new(Arc::clone(&limiter), policy("client", 2), peer, reject);
    let app = Router::new().route("/login", post(handler)).route_layer(gate).with_state(calls.clone());
    let server = Server::start(app).await;
    for _ in 0..2 {
        let (preflight, _) = send(&server, Method::OPTIONS, "/login", true).await;
        assert_eq!(preflight.status(), StatusCode::METHOD_NOT_ALLOWED);
    }
    assert_eq!(limiter.checks(), 2);
    let (post, _) = send(&server, Method::POST, "/login", true).await;
    assert_eq!(post.status(), StatusCode::TOO_MANY_REQUESTS, "two preflights exhausted the quota");
    assert_eq!(calls.get(), 0);
}
