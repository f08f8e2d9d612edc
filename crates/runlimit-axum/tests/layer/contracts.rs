//! Tower contracts over real HTTP: every per-connection clone of the service shares one
//! limiter; `poll_ready` only forwards the inner service's readiness (quota is never checked
//! or awaited in it); and a response future dropped before completion, during the check or
//! after it, leaves the limiter consistent.

use std::{
    convert::Infallible,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    time::Duration,
};

use std::net::SocketAddr;

use axum::{Router, body::Body, extract::ConnectInfo, response::Response, routing::post};
use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::Full;
use hyper_util::{client::legacy::Client, rt::TokioExecutor};
use runlimit_axum::RateLimitLayer;
use runlimit_core::{BatchDecision, Check, Decision, FixedWindowPolicy, Limiter};
use tokio::sync::Notify;
use tower::{limit::ConcurrencyLimitLayer, make::Shared};

use crate::{
    real_http::{Server, client, post_text},
    support::{BackendDown, Calls, TestLimiter, handler, identity_header, policy, reject},
};

/// A client that opens a new connection for every request (no pooled connections), so each
/// request is served by its own clone of the service.
fn one_connection_per_request() -> Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>> {
    Client::builder(TokioExecutor::new()).pool_max_idle_per_host(0).build_http()
}

#[tokio::test]
async fn every_connection_clone_shares_the_limiter() {
    // The limiter moves into the layer by value: only the layer's own sharing can make the
    // per-connection clones of the service count against one quota.
    let gate = RateLimitLayer::new(TestLimiter::owned(), policy("identity", 3), identity_header, reject);
    let probe = gate.clone();
    let calls = Calls::default();
    let peers = Arc::new(std::sync::Mutex::new(std::collections::BTreeSet::new()));
    let record_peer = {
        let peers = Arc::clone(&peers);
        tower::util::MapRequestLayer::new(move |request: Request<Body>| {
            if let Some(ConnectInfo(peer)) = request.extensions().get::<ConnectInfo<SocketAddr>>() {
                peers.lock().unwrap().insert(*peer);
            }
            request
        })
    };
    let app = Router::new()
        .route("/login", post(handler).route_layer(gate))
        .layer(record_peer)
        .with_state(calls.clone());
    let server = Server::start(app).await;
    let mut statuses = Vec::new();
    for _ in 0..4 {
        // A fresh client per request, without pooling: every request is its own connection.
        let (response, _) = post_text(&one_connection_per_request(), &server.url(), Some("alice"), "x").await;
        statuses.push((response.status(), response.headers().get("ratelimit").cloned()));
    }
    let fields =
        |remaining: u64| Some(format!(r#""auth.login-identity";r={remaining};t=60"#).parse().unwrap());
    assert_eq!(
        statuses,
        [
            (StatusCode::OK, fields(2)),
            (StatusCode::OK, fields(1)),
            (StatusCode::OK, fields(0)),
            (StatusCode::TOO_MANY_REQUESTS, fields(0)),
        ]
    );
    assert_eq!(peers.lock().unwrap().len(), 4, "four connections, four service clones");
    assert_eq!(probe.limiter().checks(), 4, "one limiter behind every clone");
}

/// Counts how often its inner service was not ready when polled.
#[derive(Clone)]
struct ReadinessProbe<S> {
    inner: S,
    pending: Arc<AtomicUsize>,
}

impl<S: tower::Service<Request<Body>>> tower::Service<Request<Body>> for ReadinessProbe<S> {
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut std::task::Context<'_>) -> std::task::Poll<Result<(), S::Error>> {
        let ready = self.inner.poll_ready(cx);
        if ready.is_pending() {
            self.pending.fetch_add(1, Ordering::SeqCst);
        }
        ready
    }

    fn call(&mut self, request: Request<Body>) -> S::Future {
        self.inner.call(request)
    }
}

/// Waits (at most 10 s) until `condition` holds.
async fn eventually(condition: impl Fn() -> bool) {
    within(async {
        while !condition() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
}

/// Awaits `future` for at most 10 s: a step that never happens fails the test instead of
/// hanging it.
async fn within<F: std::future::Future>(future: F) -> F::Output {
    tokio::time::timeout(Duration::from_secs(10), future).await.expect("the step happens within 10 s")
}

#[tokio::test]
async fn poll_ready_waits_for_the_inner_service_without_checking_quota() {
    let limiter = TestLimiter::new();
    let (started, release) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    // A plain Tower stack (axum's own `Route` is always ready, so a router would hide the
    // inner readiness): the gate, then a concurrency limit of one, then a handler that holds
    // its request until released. The limit's readiness is what the gate's `poll_ready` must
    // forward; `axum::serve` drives `poll_ready` then `call` per request.
    let handler = {
        let (started, release) = (Arc::clone(&started), Arc::clone(&release));
        tower::service_fn(move |_: Request<Body>| {
            let (started, release) = (Arc::clone(&started), Arc::clone(&release));
            async move {
                started.notify_one();
                release.notified().await;
                Ok::<_, Infallible>(Response::new(Body::from("released")))
            }
        })
    };
    let pending = Arc::new(AtomicUsize::new(0));
    let probe = {
        let pending = Arc::clone(&pending);
        tower::layer::layer_fn(move |inner| ReadinessProbe { inner, pending: Arc::clone(&pending) })
    };
    let stack = tower::ServiceBuilder::new()
        .layer(RateLimitLayer::new(Arc::clone(&limiter), policy("identity", 5), identity_header, reject))
        .layer(probe)
        .layer(ConcurrencyLimitLayer::new(1))
        .service(handler);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/login", listener.local_addr().unwrap());
    let server = tokio::spawn(async move { axum::serve(listener, Shared::new(stack)).await.unwrap() });

    let first = tokio::spawn({
        let url = url.clone();
        async move { post_text(&one_connection_per_request(), &url, Some("alice"), "1").await }
    });
    within(started.notified()).await;
    assert_eq!(limiter.checks(), 1);
    let second = tokio::spawn({
        let url = url.clone();
        async move { post_text(&one_connection_per_request(), &url, Some("alice"), "2").await }
    });
    // The second request reaches the gate's `poll_ready`, which finds the inner service not
    // ready (its only slot is taken); its quota is neither checked nor waited for meanwhile.
    eventually(|| pending.load(Ordering::SeqCst) > 0).await;
    assert!(!second.is_finished());
    assert_eq!(limiter.checks(), 1, "no check before the inner service is ready");

    release.notify_one();
    let (first, body) = within(first).await.unwrap();
    assert_eq!((first.status(), body.as_str()), (StatusCode::OK, "released"));
    within(started.notified()).await;
    assert_eq!(limiter.checks(), 2);
    release.notify_one();
    let (second, body) = within(second).await.unwrap();
    assert_eq!((second.status(), body.as_str()), (StatusCode::OK, "released"));
    server.abort();
}

/// Sets a flag when dropped: proof that the server dropped the handler's future.
struct DropFlag(Arc<AtomicBool>);

impl Drop for DropFlag {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

#[tokio::test]
async fn a_response_future_dropped_mid_request_leaves_the_limiter_consistent() {
    let limiter = TestLimiter::new();
    let calls = Calls::default();
    let (started, dropped) = (Arc::new(Notify::new()), Arc::new(AtomicBool::new(false)));
    let gate = RateLimitLayer::new(Arc::clone(&limiter), policy("identity", 3), identity_header, reject);
    let never = {
        let (started, dropped) = (Arc::clone(&started), Arc::clone(&dropped));
        post(move || async move {
            let _flag = DropFlag(dropped);
            started.notify_one();
            std::future::pending::<&'static str>().await
        })
    };
    let app = Router::new()
        .route("/slow", never.route_layer(gate.clone()))
        .route("/login", post(handler).route_layer(gate))
        .with_state(calls.clone());
    let server = Server::start(app).await;

    // The client gives up while the handler is running: the connection closes and the server
    // drops the response future with the admission already recorded.
    let slow = server.url().replace("/login", "/slow");
    let abandoned =
        tokio::spawn(
            async move { post_text(&one_connection_per_request(), &slow, Some("alice"), "x").await },
        );
    within(started.notified()).await;
    abandoned.abort();
    for _ in 0..100 {
        if dropped.load(Ordering::SeqCst) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(dropped.load(Ordering::SeqCst), "the server dropped the handler's future");

    // The abandoned request spent exactly one unit; the next ones count on from it.
    let (ok, body) = post_text(&client(), &server.url(), Some("alice"), "next").await;
    assert_eq!(ok.headers()["ratelimit"], r#""auth.login-identity";r=1;t=60"#);
    assert_eq!(body, "next|identity=allowed:1");
    let (ok, _) = post_text(&client(), &server.url(), Some("alice"), "last").await;
    assert_eq!(ok.headers()["ratelimit"], r#""auth.login-identity";r=0;t=60"#);
    let (denied, _) = post_text(&client(), &server.url(), Some("alice"), "over").await;
    assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(limiter.checks(), 4);
    assert_eq!(calls.get(), 2);
}

/// A limiter whose checks, while `hold` is set, announce themselves on `entered` and then wait
/// forever before the inner limiter evaluates them; `dropped` is set when such a waiting check
/// is dropped.
struct SlowLimiter {
    inner: TestLimiter,
    hold: AtomicBool,
    entered: Notify,
    dropped: Arc<AtomicBool>,
}

impl Limiter for SlowLimiter {
    type Policy = FixedWindowPolicy;
    type CheckError = BackendDown;
    type CheckAllError = BackendDown;

    async fn check(&self, check: &Check<'_, FixedWindowPolicy>) -> Result<Decision, BackendDown> {
        if self.hold.load(Ordering::SeqCst) {
            let _flag = DropFlag(Arc::clone(&self.dropped));
            self.entered.notify_one();
            std::future::pending::<()>().await;
        }
        self.inner.check(check).await
    }

    async fn check_all(&self, checks: &[Check<'_, FixedWindowPolicy>]) -> Result<BatchDecision, BackendDown> {
        self.inner.check_all(checks).await
    }
}

#[tokio::test]
async fn a_response_future_dropped_during_the_check_consumes_nothing_and_frees_the_inner_slot() {
    let dropped = Arc::new(AtomicBool::new(false));
    let limiter = Arc::new(SlowLimiter {
        inner: TestLimiter::owned(),
        hold: AtomicBool::new(true),
        entered: Notify::new(),
        dropped: Arc::clone(&dropped),
    });
    let calls = Arc::new(AtomicUsize::new(0));
    let handler = {
        let calls = Arc::clone(&calls);
        tower::service_fn(move |_: Request<Body>| {
            calls.fetch_add(1, Ordering::SeqCst);
            async { Ok::<_, Infallible>(Response::new(Body::from("served"))) }
        })
    };
    // A concurrency limit of one inside the gate: the abandoned request held its only slot.
    let stack = tower::ServiceBuilder::new()
        .layer(RateLimitLayer::new(Arc::clone(&limiter), policy("identity", 3), identity_header, reject))
        .layer(ConcurrencyLimitLayer::new(1))
        .service(handler);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/login", listener.local_addr().unwrap());
    let server = tokio::spawn(async move { axum::serve(listener, Shared::new(stack)).await.unwrap() });

    // The client gives up while the gate's check is running.
    let abandoned = tokio::spawn({
        let url = url.clone();
        async move { post_text(&one_connection_per_request(), &url, Some("alice"), "x").await }
    });
    within(limiter.entered.notified()).await;
    abandoned.abort();
    eventually(|| dropped.load(Ordering::SeqCst)).await;
    assert_eq!(limiter.inner.checks(), 0, "the dropped check evaluated nothing");
    assert_eq!(calls.load(Ordering::SeqCst), 0, "and never reached the service");

    // The next request finds the whole quota and the inner service's slot free.
    limiter.hold.store(false, Ordering::SeqCst);
    let (ok, body) = within(post_text(&client(), &url, Some("alice"), "next")).await;
    assert_eq!((ok.status(), body.as_str()), (StatusCode::OK, "served"));
    assert_eq!(limiter.inner.checks(), 1);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    server.abort();
}
