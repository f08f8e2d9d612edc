//! Through `tower::ServiceBuilder` and `ready().call()`, without a router.

use std::{
    convert::Infallible,
    pin::pin,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    task::{Context, Poll, Waker},
};

use axum::{body::Body, response::Response};
use http::{Request, StatusCode};
use runlimit_axum::{Admissions, RateLimitLayer, ResponseFuture};
use tower::{Layer as _, Service, ServiceBuilder, ServiceExt};

use crate::support::{
    CountingBody, PanickingBody, TestLimiter, client_header, describe, identity_header, policy, reject, text,
};

/// An inner service that counts calls, can be made unready, and echoes the admissions.
#[derive(Clone)]
struct Inner {
    ready: Arc<AtomicBool>,
    polls: Arc<AtomicUsize>,
    calls: Arc<AtomicUsize>,
}

impl Inner {
    fn new() -> Self {
        Self { ready: Arc::new(AtomicBool::new(true)), polls: Arc::default(), calls: Arc::default() }
    }
}

impl<B> Service<Request<B>> for Inner {
    type Response = Response;
    type Error = Infallible;
    type Future = std::future::Ready<Result<Response, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.polls.fetch_add(1, Ordering::SeqCst);
        if self.ready.load(Ordering::SeqCst) { Poll::Ready(Ok(())) } else { Poll::Pending }
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let admissions = request.extensions().get::<Admissions>().cloned().unwrap_or_default();
        let summary: Vec<String> = admissions
            .iter()
            .map(|admission| format!("{}={}", admission.policy().scope(), describe(admission.decision())))
            .collect();
        std::future::ready(Ok(Response::new(Body::from(summary.join(",")))))
    }
}

fn request<B>(client: &str, identity: &str, body: B) -> Request<B> {
    Request::post("/").header("x-client", client).header("x-identity", identity).body(body).unwrap()
}

#[tokio::test]
async fn service_builder_runs_layers_in_order_and_records_both() {
    let limiter = TestLimiter::new();
    let inner = Inner::new();
    let mut service = ServiceBuilder::new()
        .layer(RateLimitLayer::new(Arc::clone(&limiter), policy("client", 2), client_header, reject))
        .layer(RateLimitLayer::new(Arc::clone(&limiter), policy("identity", 1), identity_header, reject))
        .service(inner.clone());

    let response = ServiceExt::<Request<Body>>::ready(&mut service)
        .await
        .unwrap()
        .call(request("c", "u", Body::empty()))
        .await
        .unwrap();
    assert_eq!(text(response).await, "client=allowed:1,identity=allowed:0");

    let reads = Arc::new(AtomicUsize::new(0));
    let body = CountingBody::wrap(Body::from("unread"), Arc::clone(&reads));
    let denied = ServiceExt::<Request<Body>>::ready(&mut service)
        .await
        .unwrap()
        .call(request("c", "u", body))
        .await
        .unwrap();
    assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(denied.headers()["ratelimit"], r#""auth.login-identity";r=0;t=60"#);
    assert_eq!(reads.load(Ordering::SeqCst), 0);
    assert_eq!(inner.calls.load(Ordering::SeqCst), 1, "the inner service ran only for the admitted request");
}

#[tokio::test]
async fn denial_never_calls_the_inner_service_for_any_body_type() {
    let limiter = TestLimiter::new();
    let inner = Inner::new();
    let mut service = ServiceBuilder::new()
        .layer(RateLimitLayer::new(Arc::clone(&limiter), policy("client", 1), client_header, reject))
        .service(inner.clone());
    let ok = ServiceExt::<Request<PanickingBody>>::ready(&mut service)
        .await
        .unwrap()
        .call(request("c", "u", PanickingBody))
        .await
        .unwrap();
    assert_eq!(ok.status(), StatusCode::OK);
    let denied = ServiceExt::<Request<PanickingBody>>::ready(&mut service)
        .await
        .unwrap()
        .call(request("c", "u", PanickingBody))
        .await
        .unwrap();
    assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(inner.calls.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn poll_ready_only_forwards_inner_readiness() {
    let limiter = TestLimiter::new();
    let inner = Inner::new();
    let layer = RateLimitLayer::new(Arc::clone(&limiter), policy("client", 1), client_header, reject);
    let mut service = layer.layer(inner.clone());
    let mut cx = Context::from_waker(Waker::noop());

    inner.ready.store(false, Ordering::SeqCst);
    assert!(Service::<Request<Body>>::poll_ready(&mut service, &mut cx).is_pending());
    inner.ready.store(true, Ordering::SeqCst);
    assert!(matches!(Service::<Request<Body>>::poll_ready(&mut service, &mut cx), Poll::Ready(Ok(()))));
    assert_eq!(inner.polls.load(Ordering::SeqCst), 2);
    assert_eq!(limiter.checks(), 0, "readiness never consults the limiter");
}

#[tokio::test]
async fn an_unpolled_response_future_consumes_nothing() {
    let limiter = TestLimiter::new();
    let mut service = ServiceBuilder::new()
        .layer(RateLimitLayer::new(Arc::clone(&limiter), policy("client", 1), client_header, reject))
        .service(Inner::new());
    let future = ServiceExt::<Request<Body>>::ready(&mut service).await.unwrap().call(request(
        "c",
        "u",
        Body::empty(),
    ));
    drop(future);
    assert_eq!(limiter.checks(), 0);
    let response = ServiceExt::<Request<Body>>::ready(&mut service)
        .await
        .unwrap()
        .call(request("c", "u", Body::empty()))
        .await
        .unwrap();
    assert_eq!(text(response).await, "client=allowed:0", "the dropped request consumed no unit");
}

#[tokio::test]
#[should_panic(expected = "runlimit_axum::ResponseFuture polled after completion")]
async fn polling_after_completion_panics() {
    let limiter = TestLimiter::new();
    let mut service =
        RateLimitLayer::new(limiter, policy("client", 1), client_header, reject).layer(Inner::new());
    // No x-client header: rejected by the extractor, so the future is ready at once.
    let mut future = pin!(service.call(Request::new(Body::empty())));
    let mut cx = Context::from_waker(Waker::noop());
    assert!(matches!(future.as_mut().poll(&mut cx), Poll::Ready(Ok(_))));
    let _ = future.as_mut().poll(&mut cx);
}

#[test]
fn futures_and_services_are_send() {
    fn assert_send<T: Send>(_: &T) {}
    fn assert_send_sync_clone<T: Send + Sync + Clone>(_: &T) {}
    fn assert_send_type<T: Send>() {}

    let limiter = TestLimiter::new();
    let layer = RateLimitLayer::new(Arc::clone(&limiter), policy("client", 1), client_header, reject);
    assert_send_sync_clone(&layer);
    let mut service = layer.layer(Inner::new());
    assert_send_sync_clone(&service);
    let checking = service.call(request("c", "u", Body::empty()));
    assert_send(&checking);
    let rejected = service.call(Request::new(Body::empty()));
    assert_send(&rejected);
    assert_send_type::<ResponseFuture<axum::routing::Route, Body>>();
    assert_eq!(format!("{checking:?}"), "ResponseFuture { state: \"Checking\", .. }");
    assert_eq!(format!("{rejected:?}"), "ResponseFuture { state: \"Rejected\", .. }");
}
