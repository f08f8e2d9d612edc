//! `PeerAddressKey` (feature `axum`) over real HTTP: clients keyed by their socket peer when
//! the router is served with `ConnectInfo`, and every request refused, naming the missing
//! call and consuming nothing, when it is not.

use std::{
    net::{IpAddr, SocketAddr},
    sync::Arc,
    time::Duration,
};

use axum::{Router, response::IntoResponse as _, response::Response, routing::post};
use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt as _, Full};
use hyper::body::Incoming;
use hyper_util::{
    client::legacy::{Client, connect::HttpConnector},
    rt::TokioExecutor,
};
use runlimit_axum::{
    MissingPeerAddress, PeerAddressKey, ProblemRejections, RateLimitLayer, RateLimitRejection,
};
use runlimit_core::{FixedWindowPolicy, KeyHasher, PolicyId, ScopeId};
use runlimit_memory::{MemoryStore, MemoryStoreConfig};
use tokio::net::TcpListener;

fn policy() -> FixedWindowPolicy {
    FixedWindowPolicy::new(
        PolicyId::new("auth.login").unwrap(),
        ScopeId::new("client").unwrap(),
        2,
        Duration::from_secs(60),
    )
    .unwrap()
}

fn key() -> PeerAddressKey {
    PeerAddressKey::new(KeyHasher::new(&[3; 32]).unwrap())
}

/// `POST url` from the loopback address `from`, on a fresh connection; the status, the
/// `RateLimit` field when present, and the body.
async fn post_from(from: [u8; 4], url: &str) -> (StatusCode, Option<String>, String) {
    let mut connector = HttpConnector::new();
    connector.set_local_address(Some(IpAddr::from(from)));
    let client: Client<_, Full<Bytes>> =
        Client::builder(TokioExecutor::new()).pool_max_idle_per_host(0).build(connector);
    let response: Response<Incoming> =
        client.request(Request::post(url).body(Full::default()).unwrap()).await.unwrap();
    let (parts, body) = response.into_parts();
    let bytes = body.collect().await.unwrap().to_bytes();
    let field = parts.headers.get("ratelimit").map(|value| value.to_str().unwrap().to_owned());
    (parts.status, field, String::from_utf8(bytes.to_vec()).unwrap())
}

async fn post_to(url: &str) -> (StatusCode, Option<String>, String) {
    post_from([127, 0, 0, 1], url).await
}

async fn listener() -> (TcpListener, String) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/login", listener.local_addr().unwrap());
    (listener, url)
}

#[tokio::test]
async fn without_connect_info_every_request_is_refused_naming_the_call_and_nothing_is_consumed() {
    let store = Arc::new(MemoryStore::new(MemoryStoreConfig::new(100).unwrap()));

    // Served the way a newcomer first writes it: `axum::serve(listener, app)`, no ConnectInfo.
    // The mapper shows the extraction error, as an application's log line would.
    let shows_the_error =
        |rejection: RateLimitRejection<FixedWindowPolicy, MissingPeerAddress, _>| -> Response {
            match rejection {
                RateLimitRejection::Extraction { error, .. } => {
                    (StatusCode::INTERNAL_SERVER_ERROR, error.to_string()).into_response()
                }
                _ => StatusCode::IM_A_TEAPOT.into_response(),
            }
        };
    let gate = RateLimitLayer::new(Arc::clone(&store), policy(), key(), shows_the_error);
    let app = Router::new().route("/login", post(|| async { "welcome" }).route_layer(gate));
    let (plain, plain_url) = listener().await;
    let served = tokio::spawn(async move { axum::serve(plain, app).await.unwrap() });
    for _ in 0..3 {
        assert_eq!(
            post_to(&plain_url).await,
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                None,
                "the request has no peer address (no axum::extract::ConnectInfo<SocketAddr> extension): \
                 serve the router with `into_make_service_with_connect_info::<SocketAddr>()`"
                    .to_owned()
            )
        );
    }
    served.abort();

    // The same store served correctly: the three refusals consumed nothing, so the client still
    // has its whole quota of 2; then the third request is denied.
    let gate = RateLimitLayer::new(Arc::clone(&store), policy(), key(), ProblemRejections::new());
    let app = Router::new().route(
        "/login",
        post(|| async { "welcome" })
            .route_layer(runlimit_axum::AdmissionFieldsLayer::new())
            .route_layer(gate),
    );
    let (with_info, url) = listener().await;
    let served = tokio::spawn(async move {
        axum::serve(with_info, app.into_make_service_with_connect_info::<SocketAddr>()).await.unwrap()
    });
    let first = post_to(&url).await;
    assert_eq!(
        (first.0, first.1.as_deref(), first.2.as_str()),
        (StatusCode::OK, Some(r#""auth.login";r=1;t=60"#), "welcome")
    );
    let second = post_to(&url).await;
    assert_eq!((second.0, second.1.as_deref()), (StatusCode::OK, Some(r#""auth.login";r=0;t=60"#)));
    let third = post_to(&url).await;
    assert_eq!(
        (third.0, third.1.as_deref()),
        (StatusCode::TOO_MANY_REQUESTS, Some(r#""auth.login";r=0;t=60"#))
    );
    served.abort();
}

#[tokio::test]
async fn with_connect_info_peers_have_their_own_quota_whatever_their_source_port() {
    // Every request is a fresh connection, so a fresh source port; 127.0.0.2 is another peer
    // (the whole of 127.0.0.0/8 is loopback on Linux).
    let store = Arc::new(MemoryStore::new(MemoryStoreConfig::new(100).unwrap()));
    let gate = RateLimitLayer::new(store, policy(), key(), ProblemRejections::new());
    let app = Router::new().route("/login", post(|| async { "welcome" }).route_layer(gate));
    let (listener, url) = listener().await;
    let served = tokio::spawn(async move {
        axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>()).await.unwrap()
    });
    let mut statuses = Vec::new();
    for from in
        [[127, 0, 0, 1], [127, 0, 0, 1], [127, 0, 0, 1], [127, 0, 0, 2], [127, 0, 0, 2], [127, 0, 0, 2]]
    {
        statuses.push(post_from(from, &url).await.0);
    }
    assert_eq!(
        statuses,
        [
            StatusCode::OK,
            StatusCode::OK,
            StatusCode::TOO_MANY_REQUESTS,
            StatusCode::OK,
            StatusCode::OK,
            StatusCode::TOO_MANY_REQUESTS
        ]
    );
    served.abort();
}
