//! Shared by the integration tests: an in-process server on loopback ports, the generated RLS
//! client, request builders and the backends of the test run.
//!
//! Each test binary includes this module with `mod support;`; not every binary uses every
//! helper.
#![allow(dead_code, unreachable_pub, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::{net::SocketAddr, sync::Arc, time::Duration};

use envoy_types::pb::{
    envoy::{
        extensions::common::ratelimit::v3::{
            RateLimitDescriptor,
            rate_limit_descriptor::{Entry, RateLimitOverride},
        },
        service::ratelimit::v3::{
            RateLimitRequest, RateLimitResponse,
            rate_limit_response::{Code, DescriptorStatus},
            rate_limit_service_client::RateLimitServiceClient,
        },
    },
    google::protobuf::{Duration as PbDuration, UInt64Value},
};
use runlimit_core::KeyHasher;
use runlimit_memory::{ManualClock, MemoryStoreConfig};
use runlimit_server::{Backend, RuleTable, Server, Service, ServiceOptions};
use tokio::{sync::oneshot, task::JoinHandle};
use tonic::transport::Channel;

/// The key secret every test server uses (shared backends need one secret).
pub const SECRET: &[u8] = b"runlimit-server test secret, 32+ bytes long";

pub fn hasher() -> KeyHasher {
    KeyHasher::new(SECRET).unwrap()
}

/// A rule table from one YAML text named `test.yaml`; panics with every problem if invalid.
pub fn rules(yaml: &str) -> RuleTable {
    RuleTable::from_sources([("test.yaml", yaml)]).unwrap_or_else(|errors| panic!("invalid rules:\n{errors}"))
}

/// A memory backend on a manual clock (so every window and delay is exact), and the clock.
pub fn memory() -> (Backend, ManualClock) {
    let clock = ManualClock::new();
    let backend =
        Backend::memory_with_clock(MemoryStoreConfig::new(100_000).unwrap(), Arc::new(clock.clone()));
    (backend, clock)
}

/// An in-process server on free loopback ports, stopped when dropped.
pub struct TestServer {
    pub grpc: SocketAddr,
    pub http: SocketAddr,
    pub service: Service,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
}

impl TestServer {
    /// Serves `yaml` from `backend` with `options`.
    pub async fn start(yaml: &str, backend: &Backend, options: ServiceOptions) -> Self {
        let service = Service::new(rules(yaml), backend, hasher(), options);
        Self::serve(service).await
    }

    /// Serves `service`.
    pub async fn serve(service: Service) -> Self {
        let loopback: SocketAddr = "127.0.0.1:0".parse().unwrap();
        let server = Server::with_service(service.clone(), loopback, loopback).await.unwrap();
        Self::run(server).await
    }

    /// Serves `server` (built by the test, e.g. with reloading) and returns once it is ready.
    pub async fn run(server: Server) -> Self {
        let service = server.service().clone();
        let (grpc, http) = (server.grpc_addr().unwrap(), server.http_addr().unwrap());
        let (stop, stopped) = oneshot::channel::<()>();
        let (ready, is_ready) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            server
                .serve_with(
                    async {
                        let _ = stopped.await;
                    },
                    move || {
                        let _ = ready.send(());
                        Ok(())
                    },
                )
                .await
                .unwrap();
        });
        is_ready.await.expect("the server became ready");
        Self { grpc, http, service, stop: Some(stop), task: Some(task) }
    }

    /// A connected RLS client.
    pub async fn client(&self) -> RateLimitServiceClient<Channel> {
        client(self.grpc).await
    }

    /// Stops the server and waits until it has.
    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            task.await.unwrap();
        }
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// An RLS client of the server at `address`, retrying the connection for up to 10 s.
pub async fn client(address: SocketAddr) -> RateLimitServiceClient<Channel> {
    let endpoint = format!("http://{address}");
    for _ in 0..100 {
        if let Ok(client) = RateLimitServiceClient::connect(endpoint.clone()).await {
            return client;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("no gRPC server at {address}");
}

/// A descriptor of `(key, value)` entries.
pub fn descriptor(entries: &[(&str, &str)]) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries
            .iter()
            .map(|(key, value)| Entry { key: (*key).into(), value: (*value).into() })
            .collect(),
        ..RateLimitDescriptor::default()
    }
}

/// The same descriptor with its own `hits_addend`.
pub fn with_hits(mut descriptor: RateLimitDescriptor, hits: u64) -> RateLimitDescriptor {
    descriptor.hits_addend = Some(UInt64Value { value: hits });
    descriptor
}

/// The same descriptor with a limit override (`unit`: `envoy.type.v3.RateLimitUnit`).
pub fn with_override(
    mut descriptor: RateLimitDescriptor,
    requests_per_unit: u32,
    unit: i32,
) -> RateLimitDescriptor {
    descriptor.limit = Some(RateLimitOverride { requests_per_unit, unit });
    descriptor
}

/// A request of `domain` with one descriptor per element of `descriptors`.
pub fn request(domain: &str, descriptors: &[&[(&str, &str)]]) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.into(),
        descriptors: descriptors.iter().map(|entries| descriptor(entries)).collect(),
        hits_addend: 0,
    }
}

/// Calls `ShouldRateLimit`, panicking on a gRPC error.
pub async fn call(
    client: &mut RateLimitServiceClient<Channel>,
    request: RateLimitRequest,
) -> RateLimitResponse {
    client.should_rate_limit(request).await.unwrap().into_inner()
}

/// A compact view of a status for exact assertions:
/// `(code, Some((requests_per_unit, unit)) or None, limit_remaining, duration_until_reset in ms)`.
pub type StatusView = (Code, Option<(u32, i32)>, u32, Option<u64>);

pub fn view(status: &DescriptorStatus) -> StatusView {
    (
        Code::try_from(status.code).unwrap(),
        status.current_limit.as_ref().map(|limit| (limit.requests_per_unit, limit.unit)),
        status.limit_remaining,
        status.duration_until_reset.as_ref().map(millis),
    )
}

pub fn views(response: &RateLimitResponse) -> Vec<StatusView> {
    response.statuses.iter().map(view).collect()
}

pub fn overall(response: &RateLimitResponse) -> Code {
    Code::try_from(response.overall_code).unwrap()
}

pub fn millis(duration: &PbDuration) -> u64 {
    u64::try_from(duration.seconds).unwrap() * 1_000 + u64::try_from(duration.nanos).unwrap() / 1_000_000
}

// Helpers added for the end-to-end suites (readme_examples, requests, shadow, headers, gcra).

/// A request of `domain` carrying `descriptors` as built (with hits, overrides and so on).
pub fn request_of(domain: &str, descriptors: Vec<RateLimitDescriptor>) -> RateLimitRequest {
    RateLimitRequest { domain: domain.into(), descriptors, hits_addend: 0 }
}

/// The same request with its request-level `hits_addend`.
pub fn with_request_hits(mut request: RateLimitRequest, hits: u32) -> RateLimitRequest {
    request.hits_addend = hits;
    request
}

/// Calls `ShouldRateLimit` expecting a gRPC error: its code and message.
pub async fn call_error(
    client: &mut RateLimitServiceClient<Channel>,
    request: RateLimitRequest,
) -> (tonic::Code, String) {
    match client.should_rate_limit(request).await {
        Ok(response) => panic!("expected a gRPC error, got {:?}", response.into_inner()),
        Err(status) => (status.code(), status.message().to_owned()),
    }
}

/// The response's `response_headers_to_add` as `(name, value)` pairs, in order.
pub fn headers(response: &RateLimitResponse) -> Vec<(String, String)> {
    response.response_headers_to_add.iter().map(|header| (header.key.clone(), header.value.clone())).collect()
}

/// `(name, value)` pairs from string slices, to compare with [`headers`].
pub fn pairs(expected: &[(&str, &str)]) -> Vec<(String, String)> {
    expected.iter().map(|(name, value)| ((*name).to_owned(), (*value).to_owned())).collect()
}

/// Each status's `current_limit.name` (`None` without a current limit).
pub fn limit_names(response: &RateLimitResponse) -> Vec<Option<String>> {
    response
        .statuses
        .iter()
        .map(|status| status.current_limit.as_ref().map(|limit| limit.name.clone()))
        .collect()
}

/// A server for `yaml` on a fresh manual-clock memory backend, its clock and a client.
pub async fn serve_memory(
    yaml: &str,
    options: ServiceOptions,
) -> (TestServer, ManualClock, RateLimitServiceClient<Channel>) {
    let (backend, clock) = memory();
    let server = TestServer::start(yaml, &backend, options).await;
    let client = server.client().await;
    (server, clock, client)
}

/// The generated RLS client on a tonic channel.
pub type Client = RateLimitServiceClient<Channel>;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit as RlsUnit;

/// The `current_limit.unit` numbers of the response (`RateLimitResponse.RateLimit.Unit`).
pub const SECOND: i32 = RlsUnit::Second as i32;
pub const MINUTE: i32 = RlsUnit::Minute as i32;
pub const HOUR: i32 = RlsUnit::Hour as i32;
pub const DAY: i32 = RlsUnit::Day as i32;

// Helpers added for the operations suite (operations.rs).

impl TestServer {
    /// Serves `server` without waiting until it is ready (its backend prepared): returns the
    /// server and a receiver that resolves once it is.
    pub fn spawn(server: Server) -> (Self, oneshot::Receiver<()>) {
        let service = server.service().clone();
        let (grpc, http) = (server.grpc_addr().unwrap(), server.http_addr().unwrap());
        let (stop, stopped) = oneshot::channel::<()>();
        let (ready, is_ready) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            server
                .serve_with(
                    async {
                        let _ = stopped.await;
                    },
                    move || {
                        let _ = ready.send(());
                        Ok(())
                    },
                )
                .await
                .unwrap();
        });
        (Self { grpc, http, service, stop: Some(stop), task: Some(task) }, is_ready)
    }
}

/// An HTTP/1.1 answer: the status code, the `content-type` header (empty when absent) and the
/// body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HttpAnswer {
    pub status: u16,
    pub content_type: String,
    pub body: String,
}

/// One HTTP/1.1 request (`method path`, with `body` when not empty) over a fresh connection.
pub async fn http(address: SocketAddr, method: &str, path: &str, body: &str) -> HttpAnswer {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut stream = tokio::net::TcpStream::connect(address).await.unwrap();
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = Vec::new();
    stream.read_to_end(&mut response).await.unwrap();
    let response = String::from_utf8(response).unwrap();
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
    let mut lines = head.lines();
    let status = lines.next().unwrap_or_default().split(' ').nth(1).unwrap_or_default().parse().unwrap();
    let content_type = lines
        .filter_map(|line| line.split_once(':'))
        .find(|(name, _)| name.eq_ignore_ascii_case("content-type"))
        .map(|(_, value)| value.trim().to_owned())
        .unwrap_or_default();
    HttpAnswer { status, content_type, body: body.to_owned() }
}

/// `grpc.health.v1.Health/Check` of `service` ("" for the whole server) on `address`.
pub async fn grpc_health(
    address: SocketAddr,
    service: &str,
) -> Result<tonic_health::pb::health_check_response::ServingStatus, tonic::Status> {
    use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{address}"))
        .unwrap()
        .connect()
        .await
        .map_err(|error| tonic::Status::unavailable(error.to_string()))?;
    let response = HealthClient::new(channel).check(HealthCheckRequest { service: service.into() }).await?;
    Ok(response.into_inner().status())
}

/// The RLS service's name, as the gRPC health service knows it.
pub const RLS_SERVICE: &str = "envoy.service.ratelimit.v3.RateLimitService";

/// Polls until `what` is true, for at most `within`; panics with `describe()` when it never is.
pub async fn eventually<F, Fut>(within: Duration, describe: &str, mut what: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + within;
    while !what().await {
        assert!(tokio::time::Instant::now() < deadline, "not within {within:?}: {describe}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

// A raw HTTP/2 client (h2): gRPC calls no generated client can send (stalled, or carrying bytes
// that are not a valid message).

/// An HTTP/2 connection to `address`, ready to send requests.
pub async fn h2_connection(address: SocketAddr) -> h2::client::SendRequest<bytes::Bytes> {
    let tcp = tokio::net::TcpStream::connect(address).await.unwrap();
    let (sender, connection) = h2::client::handshake(tcp).await.unwrap();
    tokio::spawn(connection);
    sender.ready().await.unwrap()
}

/// Starts a `ShouldRateLimit` call on `sender` (gRPC headers, no body yet): its response's
/// future and the request stream to send the body on.
pub fn start_call(
    sender: &mut h2::client::SendRequest<bytes::Bytes>,
) -> (h2::client::ResponseFuture, h2::SendStream<bytes::Bytes>) {
    let request =
        http::Request::post("http://localhost/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit")
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .body(())
            .unwrap();
    sender.send_request(request, false).unwrap()
}

/// A `ShouldRateLimit` call on `sender` whose one gRPC message (uncompressed) is `message`, sent
/// whole; its response's future.
pub fn raw_call(
    sender: &mut h2::client::SendRequest<bytes::Bytes>,
    message: &[u8],
) -> h2::client::ResponseFuture {
    let (response, mut stream) = start_call(sender);
    let mut frame = vec![0_u8];
    frame.extend_from_slice(&u32::try_from(message.len()).unwrap().to_be_bytes());
    frame.extend_from_slice(message);
    stream.send_data(bytes::Bytes::from(frame), true).unwrap();
    response
}

/// `grpc-message`'s percent-encoding undone (gRPC over HTTP/2, "Responses").
pub fn percent_decoded(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut decoded = Vec::with_capacity(bytes.len());
    let mut index = 0;
    while index < bytes.len() {
        let escaped = text.get(index + 1..index + 3).and_then(|hex| u8::from_str_radix(hex, 16).ok());
        match (bytes[index], escaped) {
            (b'%', Some(byte)) => {
                decoded.push(byte);
                index += 3;
            }
            (byte, _) => {
                decoded.push(byte);
                index += 1;
            }
        }
    }
    String::from_utf8(decoded).unwrap()
}

/// The `grpc-status` and decoded `grpc-message` a response carries, in its headers (a
/// trailers-only response) or its trailers.
pub async fn grpc_status(response: h2::client::ResponseFuture) -> (String, String) {
    let response = response.await.unwrap();
    let field = |headers: &http::HeaderMap, name: &str| {
        headers.get(name).map(|value| percent_decoded(value.to_str().unwrap())).unwrap_or_default()
    };
    if response.headers().contains_key("grpc-status") {
        return (field(response.headers(), "grpc-status"), field(response.headers(), "grpc-message"));
    }
    let mut body = response.into_body();
    while let Some(data) = body.data().await {
        data.unwrap();
    }
    let trailers = body.trailers().await.unwrap().unwrap_or_default();
    (field(&trailers, "grpc-status"), field(&trailers, "grpc-message"))
}
