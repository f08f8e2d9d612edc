//! `GET /metrics`: the service's counters after a known sequence of requests, exact values.
//!
//! One test in this binary: it installs the process's global Prometheus recorder.

mod support;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use runlimit_server::{Server, Service, ServiceOptions, install_metrics};
use support::{call, client, hasher, memory, overall, request, rules};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

const RULES: &str = "
domain: d
descriptors:
  - key: enforced
    rate_limit: { unit: hour, requests_per_unit: 1 }
  - key: soft
    shadow_mode: true
    rate_limit: { unit: hour, requests_per_unit: 1 }
";

async fn get(address: std::net::SocketAddr, path: &str) -> String {
    let mut stream = tokio::net::TcpStream::connect(address).await.unwrap();
    let request = format!("GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    response.split_once("\r\n\r\n").map(|(_, body)| body.to_owned()).unwrap_or_default()
}

/// The sample lines of `name` in `text`, sorted.
fn samples(text: &str, name: &str) -> Vec<String> {
    let mut lines: Vec<String> =
        text.lines().filter(|line| line.starts_with(&format!("{name}{{"))).map(str::to_owned).collect();
    lines.sort();
    lines
}

#[tokio::test]
async fn requests_and_shadow_denials_are_counted_by_domain_rule_and_code() {
    let handle = install_metrics().expect("the only recorder of this test binary");
    let (backend, _clock) = memory();
    let service = Service::new(rules(RULES), &backend, hasher(), ServiceOptions::default());
    let loopback = "127.0.0.1:0".parse().unwrap();
    let server = Server::with_service(service, loopback, loopback).await.unwrap().with_metrics(handle);
    let (grpc, http) = (server.grpc_addr().unwrap(), server.http_addr().unwrap());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(server.serve(async {
        let _ = stopped.await;
    }));
    let mut client = client(grpc).await;

    // The shadow rule's quota of 1 is used by the first request; the next two would be denied.
    for expected in [Code::Ok, Code::Ok, Code::Ok] {
        assert_eq!(overall(&call(&mut client, request("d", &[&[("soft", "x")]])).await), expected);
    }
    // The enforced rule: one allowed, one denied.
    assert_eq!(overall(&call(&mut client, request("d", &[&[("enforced", "x")]])).await), Code::Ok);
    assert_eq!(overall(&call(&mut client, request("d", &[&[("enforced", "x")]])).await), Code::OverLimit);
    // An unknown domain.
    assert_eq!(overall(&call(&mut client, request("elsewhere", &[&[("k", "v")]])).await), Code::Ok);

    let text = get(http, "/metrics").await;
    assert_eq!(
        samples(&text, "runlimit_server_requests_total"),
        [
            r#"runlimit_server_requests_total{domain="",code="ok"} 1"#,
            // Every domain's series exist from the start, at 0 until counted.
            r#"runlimit_server_requests_total{domain="",code="over_limit"} 0"#,
            r#"runlimit_server_requests_total{domain="d",code="ok"} 4"#,
            r#"runlimit_server_requests_total{domain="d",code="over_limit"} 1"#,
        ]
    );
    assert_eq!(
        samples(&text, "runlimit_server_shadow_denials_total"),
        [r#"runlimit_server_shadow_denials_total{domain="d",rule="d.soft",reason="quota"} 2"#]
    );
    assert!(samples(&text, "runlimit_server_backend_failures_total").is_empty(), "{text}");
    assert!(samples(&text, "runlimit_server_storage_full_total").is_empty(), "{text}");

    // A second server whose store holds one key: its second key is denied, and counted.
    let tiny = runlimit_server::Backend::memory(runlimit_memory::MemoryStoreConfig::new(1).unwrap());
    let tiny = Service::new(rules(RULES), &tiny, hasher(), ServiceOptions::default());
    let tiny = Server::with_service(tiny, loopback, loopback).await.unwrap();
    let tiny_grpc = tiny.grpc_addr().unwrap();
    let (tiny_stop, tiny_stopped) = tokio::sync::oneshot::channel::<()>();
    let tiny_task = tokio::spawn(tiny.serve(async {
        let _ = tiny_stopped.await;
    }));
    let mut tiny_client = support::client(tiny_grpc).await;
    assert_eq!(overall(&call(&mut tiny_client, request("d", &[&[("enforced", "a")]])).await), Code::Ok);
    assert_eq!(
        overall(&call(&mut tiny_client, request("d", &[&[("enforced", "b")]])).await),
        Code::OverLimit
    );
    let text = get(http, "/metrics").await;
    assert_eq!(
        samples(&text, "runlimit_server_storage_full_total"),
        [r#"runlimit_server_storage_full_total{domain="d"} 1"#]
    );
    let _ = tiny_stop.send(());
    tiny_task.await.unwrap().unwrap();
    let _ = stop.send(());
    task.await.unwrap().unwrap();
}
