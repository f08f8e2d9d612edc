//! Real HTTP/1.1 over loopback: an axum server on 127.0.0.1:0 and a hyper-util client.

use std::{
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
};

use axum::{Router, body::Body, routing::post};
use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt as _, Full};
use hyper::body::Incoming;
use hyper_util::{
    client::legacy::{Client, connect::HttpConnector},
    rt::TokioExecutor,
};
use runlimit_axum::RateLimitLayer;
use tokio::{net::TcpListener, task::JoinHandle};
use tower::util::MapRequestLayer;

use crate::support::{Calls, CountingBody, TestLimiter, handler, identity_header, peer, policy, reject};

pub(crate) struct Server {
    address: SocketAddr,
    task: JoinHandle<()>,
}

impl Server {
    pub(crate) async fn start(app: Router) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>()).await.unwrap();
        });
        Self { address, task }
    }

    pub(crate) fn url(&self) -> String {
        format!("http://{}/login", self.address)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

pub(crate) fn client() -> Client<HttpConnector, Full<Bytes>> {
    Client::builder(TokioExecutor::new()).build_http()
}

pub(crate) async fn post_text(
    client: &Client<HttpConnector, Full<Bytes>>,
    url: &str,
    identity: Option<&str>,
    body: &'static str,
) -> (Response<()>, String) {
    let mut request = Request::post(url);
    if let Some(identity) = identity {
        request = request.header("x-identity", identity);
    }
    let response: Response<Incoming> = client.request(request.body(Full::from(body)).unwrap()).await.unwrap();
    let (parts, body) = response.into_parts();
    let bytes = body.collect().await.unwrap().to_bytes();
    (Response::from_parts(parts, ()), String::from_utf8(bytes.to_vec()).unwrap())
}

pub(crate) fn header_names(response: &Response<()>) -> Vec<&str> {
    let mut names: Vec<&str> = response.headers().keys().map(|name| name.as_str()).collect();
    names.sort_unstable();
    names
}

#[tokio::test]
async fn rejection_mapper_output_reaches_the_client() {
    let limiter = TestLimiter::new();
    let calls = Calls::default();
    let app = Router::new()
        .route("/login", post(handler))
        .route_layer(RateLimitLayer::new(Arc::clone(&limiter), policy("client", 2), peer, reject))
        .with_state(calls.clone());
    let server = Server::start(app).await;
    let client = client();

    let (first, body) = post_text(&client, &server.url(), None, "one").await;
    assert_eq!(first.status(), StatusCode::OK);
    assert_eq!(first.headers()["ratelimit-policy"], r#""auth.login-client";q=2;w=60"#);
    assert_eq!(first.headers()["ratelimit"], r#""auth.login-client";r=1;t=60"#);
    assert_eq!(body, "one|client=allowed:1");

    let (second, body) = post_text(&client, &server.url(), None, "two").await;
    assert_eq!(second.headers()["ratelimit"], r#""auth.login-client";r=0;t=60"#);
    assert_eq!(body, "two|client=allowed:0");

    let (denied, body) = post_text(&client, &server.url(), None, "three").await;
    assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(denied.headers()["retry-after"], "60");
    assert_eq!(denied.headers()["ratelimit-policy"], r#""auth.login-client";q=2;w=60"#);
    assert_eq!(denied.headers()["ratelimit"], r#""auth.login-client";r=0;t=60"#);
    assert_eq!(denied.headers()["content-type"], "application/problem+json");
    assert_eq!(
        header_names(&denied),
        ["content-length", "content-type", "date", "ratelimit", "ratelimit-policy", "retry-after"]
    );
    assert_eq!(
        body,
        r#"{"type":"https://iana.org/assignments/http-problem-types#quota-exceeded","status":429,"violated-policies":["auth.login-client"]}"#
    );
    assert_eq!(calls.get(), 2);
    assert_eq!(limiter.checks(), 3);
}

#[tokio::test]
async fn denied_request_bodies_are_never_read_by_the_server() {
    let limiter = TestLimiter::new();
    let calls = Calls::default();
    let reads = Arc::new(AtomicUsize::new(0));
    let counting = {
        let reads = Arc::clone(&reads);
        MapRequestLayer::new(move |request: Request<Body>| {
            request.map(|body| CountingBody::wrap(body, Arc::clone(&reads)))
        })
    };
    let app = Router::new()
        .route("/login", post(handler))
        .route_layer(RateLimitLayer::new(Arc::clone(&limiter), policy("client", 1), peer, reject))
        .layer(counting)
        .with_state(calls.clone());
    let server = Server::start(app).await;
    let client = client();

    let (ok, body) = post_text(&client, &server.url(), None, "read me").await;
    assert_eq!(ok.status(), StatusCode::OK);
    assert_eq!(body, "read me|client=allowed:0");
    let reads_when_admitted = reads.load(Ordering::SeqCst);
    assert!(reads_when_admitted > 0);

    for _ in 0..3 {
        let (denied, _) = post_text(&client, &server.url(), None, "never read").await;
        assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
    }
    assert_eq!(reads.load(Ordering::SeqCst), reads_when_admitted, "no denied body was polled");
    assert_eq!(calls.get(), 1);
}

#[tokio::test]
async fn stacked_gates_over_real_http() {
    let limiter = TestLimiter::new();
    let calls = Calls::default();
    let app = Router::new()
        .route("/login", post(handler))
        .route_layer(RateLimitLayer::new(
            Arc::clone(&limiter),
            policy("identity", 1),
            identity_header,
            reject,
        ))
        .route_layer(RateLimitLayer::new(Arc::clone(&limiter), policy("client", 10), peer, reject))
        .with_state(calls.clone());
    let server = Server::start(app).await;
    let client = client();

    let (ok, body) = post_text(&client, &server.url(), Some("Alice@Example.Test"), "a").await;
    assert_eq!(ok.status(), StatusCode::OK);
    assert_eq!(ok.headers()["ratelimit"], r#""auth.login-client";r=9;t=60, "auth.login-identity";r=0;t=60"#);
    assert_eq!(body, "a|client=allowed:9,identity=allowed:0");

    let (denied, _) = post_text(&client, &server.url(), Some("alice@example.test"), "b").await;
    assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(denied.headers()["ratelimit"], r#""auth.login-identity";r=0;t=60"#);

    let (missing, body) = post_text(&client, &server.url(), None, "c").await;
    assert_eq!(missing.status(), StatusCode::BAD_REQUEST);
    assert_eq!(body, "missing x-identity");

    let (other, body) = post_text(&client, &server.url(), Some("bob@example.test"), "d").await;
    assert_eq!(other.status(), StatusCode::OK);
    assert_eq!(body, "d|client=allowed:6,identity=allowed:0");
    assert_eq!(calls.get(), 2);
}
