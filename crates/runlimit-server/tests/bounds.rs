//! What no client can grow: the metric series (limit overrides with keys of the client's
//! choosing), and the HTTP listener's connections (a connection that never finishes its
//! headers, or a `POST /json` body, is closed).
//!
//! One test per concern; the first installs this binary's global Prometheus recorder.

mod support;

use std::{collections::BTreeSet, time::Duration};

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use runlimit_memory::MemoryStoreConfig;
use runlimit_server::{
    BODY_READ_TIMEOUT, Backend, HEADER_READ_TIMEOUT, Server, Service, ServiceOptions, install_metrics,
};
use support::{TestServer, call, descriptor, hasher, overall, request_of, rules, with_override};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

const RULES: &str =
    "domain: d\ndescriptors:\n  - key: k\n    rate_limit: { unit: hour, requests_per_unit: 5 }\n";

async fn get(address: std::net::SocketAddr, path: &str) -> String {
    let mut stream = tokio::net::TcpStream::connect(address).await.unwrap();
    let request = format!("GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    response.split_once("\r\n\r\n").map(|(_, body)| body.to_owned()).unwrap_or_default()
}

/// Regression: a limit override's policy identifier was derived from its entry keys, and the
/// limiters' metrics label series by policy: 30 requests with keys of their own added 600
/// lines to `/metrics`. Overrides share one policy identifier per domain now (their counters
/// stay apart: the subject holds the keys and values, the fingerprint the limit).
#[tokio::test]
async fn limit_overrides_with_keys_of_the_clients_choosing_add_no_metric_series() {
    let handle = install_metrics().expect("the only recorder of this test binary");
    let backend = Backend::memory(MemoryStoreConfig::new(10_000).unwrap());
    let service = Service::new(rules(RULES), &backend, hasher(), ServiceOptions::default());
    let loopback = "127.0.0.1:0".parse().unwrap();
    let server = TestServer::run(
        Server::with_service(service, loopback, loopback).await.unwrap().with_metrics(handle),
    )
    .await;
    let mut client = server.client().await;
    for index in 0..30 {
        let key = format!("chosen_key_{index}");
        let override_hour = with_override(descriptor(&[(key.as_str(), "v")]), 1, 3);
        // Twice: the second is over the override's limit of 1, so each key's counter is its own.
        assert_eq!(overall(&call(&mut client, request_of("d", vec![override_hour.clone()])).await), Code::Ok);
        assert_eq!(overall(&call(&mut client, request_of("d", vec![override_hour])).await), Code::OverLimit);
    }
    let text = get(server.http, "/metrics").await;
    let policies: BTreeSet<&str> = text
        .lines()
        .filter(|line| line.starts_with("runlimit_admissions_total{"))
        .filter_map(|line| line.split("policy=\"").nth(1)?.split('"').next())
        // An allowed batch singles out no policy: `""`.
        .filter(|policy| !policy.is_empty())
        .collect();
    assert_eq!(policies.len(), 1, "one policy for every override of the domain: {policies:?}");
    let lines = text.lines().filter(|line| line.starts_with("runlimit_admission")).count();
    // One policy, each outcome (allowed, denied) once: the same whatever the number of keys.
    assert!(lines <= 40, "{lines} runlimit_admission* lines:\n{text}");
    server.stop().await;
}

/// A connection that starts a request and never finishes its headers is closed after
/// [`HEADER_READ_TIMEOUT`] (it would otherwise hold a file descriptor for ever).
#[tokio::test]
async fn a_connection_that_never_finishes_its_headers_is_closed() {
    let backend = Backend::memory(MemoryStoreConfig::new(10).unwrap());
    let service = Service::new(rules(RULES), &backend, hasher(), ServiceOptions::default());
    let loopback = "127.0.0.1:0".parse().unwrap();
    let server = TestServer::run(Server::with_service(service, loopback, loopback).await.unwrap()).await;
    let mut stream = tokio::net::TcpStream::connect(server.http).await.unwrap();
    stream.write_all(b"GET /healthcheck HTTP/1.1\r\nHost: x\r\n").await.unwrap();
    let started = std::time::Instant::now();
    let mut rest = Vec::new();
    let read =
        tokio::time::timeout(HEADER_READ_TIMEOUT + Duration::from_secs(5), stream.read_to_end(&mut rest))
            .await;
    assert!(read.is_ok(), "still open after {:?}", started.elapsed());
    assert!(started.elapsed() >= HEADER_READ_TIMEOUT - Duration::from_millis(100), "{:?}", started.elapsed());
    // Other clients were served meanwhile, and still are.
    assert_eq!(get(server.http, "/healthcheck").await, "OK\n");
    server.stop().await;
}

/// A `POST /json` whose body stops short of its `Content-Length` (one byte every 4 s) is
/// answered `408` once [`BODY_READ_TIMEOUT`] has passed, and its connection closed.
/// Regression: only the headers had a deadline, so such bodies held the connection for as long
/// as they trickled, and 1,024 of them took every place of the HTTP listener.
#[tokio::test]
async fn a_json_body_that_never_arrives_is_answered_408() {
    let backend = Backend::memory(MemoryStoreConfig::new(10).unwrap());
    let service = Service::new(rules(RULES), &backend, hasher(), ServiceOptions::default());
    let loopback = "127.0.0.1:0".parse().unwrap();
    let server = TestServer::run(Server::with_service(service, loopback, loopback).await.unwrap()).await;
    let mut stream = tokio::net::TcpStream::connect(server.http).await.unwrap();
    stream
        .write_all(
            b"POST /json HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 10\r\n\r\n",
        )
        .await
        .unwrap();
    let started = std::time::Instant::now();
    let (mut reader, mut writer) = stream.into_split();
    let trickle = tokio::spawn(async move {
        for _ in 0..10 {
            if writer.write_all(b" ").await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_secs(4)).await;
        }
    });
    let mut response = Vec::new();
    let read =
        tokio::time::timeout(BODY_READ_TIMEOUT + Duration::from_secs(5), reader.read_to_end(&mut response))
            .await;
    assert!(read.is_ok(), "still open after {:?}", started.elapsed());
    let response = String::from_utf8_lossy(&response);
    assert!(response.starts_with("HTTP/1.1 408 Request Timeout\r\n"), "{response}");
    assert!(response.ends_with("\r\n\r\nthe request body was not received within 10 s\n"), "{response}");
    assert!(started.elapsed() >= BODY_READ_TIMEOUT - Duration::from_millis(100), "{:?}", started.elapsed());
    trickle.abort();
    server.stop().await;
}
