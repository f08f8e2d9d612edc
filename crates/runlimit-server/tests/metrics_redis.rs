//! `GET /metrics` of a server on Redis: the service's metrics and the Redis limiters'
//! runlimit-metrics (`backend="redis"`, each domain's shards under a `store` of its own), read
//! by a Prometheus text parser and compared by exact sample values.
//!
//! One test in this binary: it installs the process's global Prometheus recorder. It needs
//! `RUNLIMIT_REDIS_TEST_URL` and writes keys under a prefix of its own, deleted at the end.

mod backends;
mod support;

use std::collections::{BTreeMap, BTreeSet};

use backends::{RedisKeys, redis_url, unique_prefix};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use prometheus_parse::{Scrape, Value};
use runlimit_redis::{KeyPrefix, RedisConfig};
use runlimit_server::{Backend, Server, Service, ServiceOptions, install_metrics};
use support::{TestServer, call, hasher, overall, request, rules};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

const RULES_A: &str = "
domain: a
descriptors:
  - key: k
    rate_limit: { unit: hour, requests_per_unit: 1 }
";

const RULES_B: &str = "
domain: b
descriptors:
  - key: k
    rate_limit: { algorithm: gcra, unit: hour, requests_per_unit: 1 }
";

async fn get(address: std::net::SocketAddr, path: &str) -> String {
    let mut stream = tokio::net::TcpStream::connect(address).await.unwrap();
    let request = format!("GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    response.split_once("\r\n\r\n").map(|(_, body)| body.to_owned()).unwrap_or_default()
}

type Labels = BTreeMap<String, String>;

fn labels(pairs: &[(&str, &str)]) -> Labels {
    pairs.iter().map(|(key, value)| ((*key).to_owned(), (*value).to_owned())).collect()
}

/// Every series of the scalar `name` (a histogram's `_count` included): labels and value.
fn series(scrape: &Scrape, name: &str) -> BTreeMap<Labels, f64> {
    scrape
        .samples
        .iter()
        .filter(|sample| sample.metric == name)
        .map(|sample| {
            let value = match sample.value {
                Value::Counter(value) | Value::Gauge(value) | Value::Untyped(value) => value,
                ref other => panic!("{name} is not a scalar: {other:?}"),
            };
            (sample.labels.iter().map(|(key, value)| (key.clone(), value.clone())).collect(), value)
        })
        .collect()
}

fn expected(pairs: &[(&[(&str, &str)], f64)]) -> BTreeMap<Labels, f64> {
    pairs.iter().map(|(pairs, value)| (labels(pairs), *value)).collect()
}

#[tokio::test]
#[ignore = "needs RUNLIMIT_REDIS_TEST_URL"]
async fn on_redis_every_metric_has_its_exact_value_and_each_domain_its_own_shard_series() {
    let handle = install_metrics().expect("the only recorder of this test binary");
    let url = redis_url();
    let prefix = unique_prefix("metrics");
    let keys = RedisKeys::new(&url, &prefix);
    let config = RedisConfig::default().with_key_prefix(KeyPrefix::new(&prefix).unwrap());
    let backend = Backend::redis(&url, &config).unwrap();
    let table = runlimit_server::RuleTable::from_sources([("a.yaml", RULES_A), ("b.yaml", RULES_B)]).unwrap();
    let service = Service::new(table, &backend, hasher(), ServiceOptions::default());
    let loopback = "127.0.0.1:0".parse().unwrap();
    let server =
        Server::with_service(service.clone(), loopback, loopback).await.unwrap().with_metrics(handle);
    let server = TestServer::run(server).await;
    let mut client = server.client().await;

    for domain in ["a", "b"] {
        assert_eq!(overall(&call(&mut client, request(domain, &[&[("k", "x")]])).await), Code::Ok);
        assert_eq!(overall(&call(&mut client, request(domain, &[&[("k", "x")]])).await), Code::OverLimit);
    }
    // A reload builds the Redis limiters again (same store names, counters kept): `x` is
    // still over its limit in `a`.
    service.reload(rules(RULES_A));
    assert_eq!(overall(&call(&mut client, request("a", &[&[("k", "x")]])).await), Code::OverLimit);

    let text = get(server.http, "/metrics").await;
    let metrics = Scrape::parse(text.lines().map(|line| Ok(line.to_owned()))).unwrap();
    assert_eq!(
        series(&metrics, "runlimit_server_requests_total"),
        expected(&[
            (&[("domain", ""), ("code", "ok")], 0.0),
            (&[("domain", ""), ("code", "over_limit")], 0.0),
            (&[("domain", "a"), ("code", "ok")], 1.0),
            (&[("domain", "a"), ("code", "over_limit")], 2.0),
            (&[("domain", "b"), ("code", "ok")], 1.0),
            (&[("domain", "b"), ("code", "over_limit")], 1.0),
        ])
    );
    let decision = |domain: &str, decision: &str, value: f64| {
        (labels(&[("domain", domain), ("rule", &format!("{domain}.k")), ("decision", decision)]), value)
    };
    assert_eq!(
        series(&metrics, "runlimit_server_rule_decisions_total"),
        BTreeMap::from([
            decision("a", "ok", 1.0),
            decision("a", "over_limit", 2.0),
            decision("a", "shadow_over_limit", 0.0),
            decision("a", "not_evaluated", 0.0),
            decision("b", "ok", 1.0),
            decision("b", "over_limit", 1.0),
            decision("b", "shadow_over_limit", 0.0),
            decision("b", "not_evaluated", 0.0),
        ])
    );
    assert_eq!(
        series(&metrics, "runlimit_server_request_duration_seconds_count"),
        expected(&[(&[("domain", "a")], 3.0), (&[("domain", "b")], 2.0), (&[("domain", "")], 0.0)])
    );
    for name in [
        "runlimit_server_backend_failures_total",
        "runlimit_server_storage_full_total",
        "runlimit_server_shadow_denials_total",
        "runlimit_server_detailed_series_dropped_total",
    ] {
        assert_eq!(series(&metrics, name), BTreeMap::new(), "{name}");
    }

    // The Redis limiters' own metrics: one batch per request.
    let admissions = series(&metrics, "runlimit_admissions_total");
    let count = |outcome: &str| -> f64 {
        admissions
            .iter()
            .filter(|(labels, _)| labels["outcome"] == outcome)
            .inspect(|(labels, _)| assert_eq!(labels["backend"], "redis", "{labels:?}"))
            .map(|(_, value)| value)
            .sum()
    };
    assert_eq!([count("allowed"), count("quota_exceeded")], [2.0, 3.0]);
    assert_eq!(admissions.values().sum::<f64>(), 5.0, "{admissions:?}");
    // Each domain's shards are series of their own (`store`), at Redis' bound per shard.
    let capacity = series(&metrics, "runlimit_shard_capacity_entries");
    let stores: BTreeSet<(&str, &str)> =
        capacity.keys().map(|labels| (labels["backend"].as_str(), labels["store"].as_str())).collect();
    assert_eq!(stores, BTreeSet::from([("redis", "a/fixed_window"), ("redis", "b/gcra")]));
    assert!(capacity.values().all(|capacity| *capacity == 4_096.0), "{capacity:?}");
    let entries = series(&metrics, "runlimit_shard_entries");
    assert_eq!(entries.values().sum::<f64>(), 2.0, "one key per domain: {entries:?}");

    server.stop().await;
    assert!(keys.delete() > 0);
}
