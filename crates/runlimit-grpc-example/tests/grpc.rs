//! The gRPC gate over a real loopback connection: a tonic server behind `RateLimitLayer` on a
//! `MemoryStore` with a manual clock, called by the generated tonic client.

use std::{sync::Arc, time::Duration};

use runlimit_axum::RateLimitLayer;
use runlimit_core::{FixedWindowPolicy, KeyHasher, PolicyId, ScopeId};
use runlimit_grpc_example::{
    API_KEY, ApiKey, Catalogue, Liveness,
    pb::{
        ListRequest, PingRequest, items_client::ItemsClient, items_server::ItemsServer,
        probe_client::ProbeClient, probe_server::ProbeServer,
    },
    reject,
};
use runlimit_memory::{ManualClock, MemoryStore, MemoryStoreConfig};
use tonic::{Code, transport::Channel};
use tonic_types::StatusExt;

const SECRET: &[u8] = b"grpc-example-test-secret-0123456789abcdef";

/// Serves the catalogue behind a gate of 3 calls per 60 s per API key on 127.0.0.1:0, and
/// returns a connected client, the catalogue (to count its calls), the clock and the channel.
async fn start() -> (ItemsClient<Channel>, Catalogue, ManualClock, Channel) {
    let clock = ManualClock::new();
    let config = MemoryStoreConfig::new(1_000).expect("valid config");
    let store = Arc::new(MemoryStore::builder(config).with_clock(clock.clone()).build());
    let policy = FixedWindowPolicy::new(
        PolicyId::new("items").expect("valid id"),
        ScopeId::new("api-key").expect("valid scope"),
        3,
        Duration::from_secs(60),
    )
    .expect("valid policy");
    let hasher = KeyHasher::new(SECRET).expect("a long secret");
    let gate = RateLimitLayer::new(store, policy, ApiKey::new(hasher), reject);
    let catalogue = Catalogue::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind loopback");
    let address = listener.local_addr().expect("bound address");
    // Only the Items service is gated; the probe beside it is not.
    let items = tower::ServiceBuilder::new().layer(gate).service(ItemsServer::new(catalogue.clone()));
    let server = tonic::transport::Server::builder()
        .add_service(items)
        .add_service(ProbeServer::new(Liveness))
        .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener));
    tokio::spawn(async move { server.await.expect("the server runs") });
    let channel = Channel::from_shared(format!("http://{address}"))
        .expect("valid uri")
        .connect()
        .await
        .expect("connect");
    (ItemsClient::new(channel.clone()), catalogue, clock, channel)
}

fn request(api_key: Option<&str>) -> tonic::Request<ListRequest> {
    let mut request = tonic::Request::new(ListRequest {});
    if let Some(key) = api_key {
        request.metadata_mut().insert(API_KEY, key.parse().expect("ascii metadata"));
    }
    request
}

fn metadata<'a>(metadata: &'a tonic::metadata::MetadataMap, key: &str) -> Option<&'a str> {
    metadata.get(key).map(|value| value.to_str().expect("ascii metadata"))
}

#[tokio::test]
async fn allowed_calls_carry_fields_then_resource_exhausted_with_the_exact_retry() {
    let (mut client, catalogue, clock, _) = start().await;
    for remaining in [2, 1, 0] {
        let reply = client.list(request(Some("key-a"))).await.expect("admitted");
        assert_eq!(reply.get_ref().items, ["apple", "banana", "cherry"]);
        assert_eq!(metadata(reply.metadata(), "ratelimit-policy"), Some(r#""items";q=3;w=60"#));
        let fields = format!(r#""items";r={remaining};t=60"#);
        assert_eq!(metadata(reply.metadata(), "ratelimit"), Some(fields.as_str()));
    }
    assert_eq!(catalogue.calls(), 3);

    // 15.5 s later: the 4th call is refused, 44.5 s before the window ends.
    clock.advance_millis(15_500);
    let status = client.list(request(Some("key-a"))).await.expect_err("refused");
    assert_eq!(status.code(), Code::ResourceExhausted);
    assert_eq!(status.message(), "quota of policy items exhausted");
    let retry = status.get_error_details().retry_info().and_then(|info| info.retry_delay);
    assert_eq!(retry, Some(Duration::from_millis(44_500)), "RetryInfo carries the exact retry");
    assert_eq!(metadata(status.metadata(), "ratelimit-policy"), Some(r#""items";q=3;w=60"#));
    assert_eq!(metadata(status.metadata(), "ratelimit"), Some(r#""items";r=0;t=45"#));
    assert_eq!(catalogue.calls(), 3, "a denied call never reaches the service");

    // Another key has its own quota; once the window is over, the first key is admitted again.
    assert!(client.list(request(Some("key-b"))).await.is_ok());
    clock.advance_millis(44_500);
    let reply = client.list(request(Some("key-a"))).await.expect("a fresh window");
    assert_eq!(metadata(reply.metadata(), "ratelimit"), Some(r#""items";r=2;t=60"#));
    assert_eq!(catalogue.calls(), 5);
}

#[tokio::test]
async fn a_call_without_an_api_key_is_unauthenticated_and_consumes_nothing() {
    let (mut client, catalogue, _, _) = start().await;
    let status = client.list(request(None)).await.expect_err("refused");
    assert_eq!(status.code(), Code::Unauthenticated);
    assert_eq!(status.message(), "the request has no x-api-key metadata");
    let status = client.list(request(Some(""))).await.expect_err("an empty key is no key");
    assert_eq!(status.code(), Code::Unauthenticated);
    assert_eq!(catalogue.calls(), 0);
    let reply = client.list(request(Some("key-a"))).await.expect("admitted");
    assert_eq!(metadata(reply.metadata(), "ratelimit"), Some(r#""items";r=2;t=60"#));
}

#[tokio::test]
async fn the_ungated_service_beside_the_gate_consumes_nothing() {
    let (mut client, catalogue, _, channel) = start().await;
    let mut probe = ProbeClient::new(channel);
    for _ in 0..5 {
        // No API key: the probe never passes the Items gate, so nothing is required or spent.
        probe.ping(PingRequest {}).await.expect("the probe answers");
    }
    let reply = client.list(request(Some("key-a"))).await.expect("admitted");
    assert_eq!(
        metadata(reply.metadata(), "ratelimit"),
        Some(r#""items";r=2;t=60"#),
        "the whole quota is left"
    );
    assert_eq!(catalogue.calls(), 1);
}
