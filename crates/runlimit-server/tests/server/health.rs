//! The health endpoints: gRPC `grpc.health.v1.Health` and HTTP `GET /healthcheck`.

use crate::support;

use runlimit_server::ServiceOptions;
use support::{TestServer, memory};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tonic_health::pb::{
    HealthCheckRequest, health_check_response::ServingStatus, health_client::HealthClient,
};

const RULES: &str =
    "domain: d\ndescriptors:\n  - key: k\n    rate_limit: { unit: second, requests_per_unit: 1 }\n";

#[tokio::test]
async fn grpc_health_reports_the_rate_limit_service_serving() {
    let (backend, _clock) = memory();
    let server = TestServer::start(RULES, &backend, ServiceOptions::default()).await;
    let channel = tonic::transport::Channel::from_shared(format!("http://{}", server.grpc))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut health = HealthClient::new(channel);
    for service in ["", "envoy.service.ratelimit.v3.RateLimitService"] {
        let response =
            health.check(HealthCheckRequest { service: service.into() }).await.unwrap().into_inner();
        assert_eq!(response.status(), ServingStatus::Serving, "service {service:?}");
    }
    let unknown = health.check(HealthCheckRequest { service: "other".into() }).await.unwrap_err();
    assert_eq!(unknown.code(), tonic::Code::NotFound);
    server.stop().await;
}

/// One HTTP/1.1 request over a fresh connection: the status line and the body.
async fn http_get(address: std::net::SocketAddr, path: &str) -> (String, String) {
    let mut stream = tokio::net::TcpStream::connect(address).await.unwrap();
    let request = format!("GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    let status = response.lines().next().unwrap_or_default().to_owned();
    let body = response.split_once("\r\n\r\n").map(|(_, body)| body.to_owned()).unwrap_or_default();
    (status, body)
}

#[tokio::test]
async fn http_healthcheck_answers_ok_and_metrics_without_a_recorder_is_absent() {
    let (backend, _clock) = memory();
    let server = TestServer::start(RULES, &backend, ServiceOptions::default()).await;
    assert_eq!(
        http_get(server.http, "/healthcheck").await,
        ("HTTP/1.1 200 OK".to_owned(), "OK\n".to_owned())
    );
    assert_eq!(
        http_get(server.http, "/metrics").await,
        ("HTTP/1.1 404 Not Found".to_owned(), "no metrics recorder installed\n".to_owned())
    );
    server.stop().await;
}
