//! The Grafana dashboard shipped in `dashboards/runlimit-server.json` queries only metrics a
//! running server emits, with labels and label values it records, and shows every metric of
//! the service's own.
//!
//! One test in this binary serves: it installs the process's global Prometheus recorder, runs
//! an in-process server, sends the requests that make every metric appear, and checks each
//! query against the scraped `GET /metrics`. The others check the checker.

mod support;

use std::{
    collections::{BTreeMap, BTreeSet},
    path::Path,
    sync::Arc,
    time::Duration,
};

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use prometheus_parse::{Sample, Scrape, Value};
use runlimit_memory::{ManualClock, MemoryStoreConfig};
use runlimit_server::{Backend, RuleTable, Server, Service, ServiceOptions, install_metrics};
use support::{TestServer, call, hasher, overall, request};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

const DASHBOARD: &str = include_str!("../dashboards/runlimit-server.json");

const RULES: &str = "
domain: d
descriptors:
  - key: enforced
    rate_limit: { unit: second, requests_per_unit: 1 }
  - key: soft
    shadow_mode: true
    rate_limit: { unit: second, requests_per_unit: 1 }
  - key: user
    detailed_metric: true
    rate_limit: { unit: second, requests_per_unit: 1 }
";

/// Label keys Prometheus adds to every scraped series (the target's).
const TARGET_LABELS: [&str; 2] = ["instance", "job"];

async fn get(address: std::net::SocketAddr, path: &str) -> String {
    let mut stream = tokio::net::TcpStream::connect(address).await.unwrap();
    let request = format!("GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    response.split_once("\r\n\r\n").map(|(_, body)| body.to_owned()).unwrap_or_default()
}

async fn scrape(http: std::net::SocketAddr) -> Scrape {
    let text = get(http, "/metrics").await;
    Scrape::parse(text.lines().map(|line| Ok(line.to_owned()))).expect("Prometheus text")
}

fn write(dir: &Path, text: &str) {
    let staged = dir.join(".rules.yaml.tmp");
    std::fs::write(&staged, text).unwrap();
    std::fs::rename(&staged, dir.join("rules.yaml")).unwrap();
}

/// What the scrape holds: each series name (a histogram `h` as `h_bucket`, `h_sum` and
/// `h_count`) with the values each of its label keys takes.
#[derive(Debug, Default)]
struct Emitted {
    series: BTreeMap<String, BTreeMap<String, BTreeSet<String>>>,
}

impl Emitted {
    fn new(scrape: &Scrape) -> Self {
        let mut emitted = Self::default();
        for Sample { metric, labels, value, .. } in &scrape.samples {
            let names = match value {
                Value::Histogram(_) => vec![format!("{metric}_bucket")],
                _ => vec![metric.clone()],
            };
            for name in names {
                let keys = emitted.series.entry(name.clone()).or_default();
                for (key, value) in labels.iter() {
                    keys.entry(key.clone()).or_default().insert(value.clone());
                }
                if name.ends_with("_bucket") {
                    keys.entry("le".to_owned()).or_default();
                }
            }
        }
        emitted
    }

    fn labels(&self, series: &str) -> &BTreeMap<String, BTreeSet<String>> {
        self.series.get(series).unwrap_or_else(|| panic!("{series} is not emitted"))
    }
}

/// Every query string of the dashboard (panel `expr`s, and template variables' `query`s that
/// name a metric), wherever it is nested.
fn queries(value: &serde_json::Value, found: &mut Vec<String>) {
    match value {
        serde_json::Value::Object(map) => {
            for (key, value) in map {
                match (key.as_str(), value) {
                    ("expr", serde_json::Value::String(expr)) => found.push(expr.clone()),
                    ("query", serde_json::Value::String(query)) if query.contains("runlimit_") => {
                        found.push(query.clone());
                    }
                    _ => queries(value, found),
                }
            }
        }
        serde_json::Value::Array(items) => items.iter().for_each(|item| queries(item, found)),
        _ => {}
    }
}

/// The PromQL identifiers of `expr` that start with `runlimit_` (metric names; label names and
/// functions never do).
fn runlimit_identifiers(expr: &str) -> Vec<&str> {
    expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
        .filter(|word| word.starts_with("runlimit_"))
        .collect()
}

/// Checks that every metric `expr` queries is emitted, that every `{key op "value"}` matcher
/// names a label its series carry (and, for a literal value, one recorded), and that every
/// `by (...)` grouping uses labels its series carry.
fn check(expr: &str, emitted: &Emitted) {
    let identifiers = runlimit_identifiers(expr);
    assert!(!identifiers.is_empty(), "query names no runlimit metric: {expr}");
    let mut available: BTreeSet<&str> = TARGET_LABELS.into_iter().collect();
    for series in &identifiers {
        available.extend(emitted.labels(series).keys().map(String::as_str));
    }
    for (index, _) in expr.match_indices('{') {
        let series = runlimit_identifiers(&expr[..index]).pop().expect("a matcher follows a series name");
        assert!(expr[..index].ends_with(series), "a matcher follows {series} directly in {expr}");
        let body = &expr[index + 1..index + expr[index..].find('}').expect("closed matcher")];
        let labels = emitted.labels(series);
        for matcher in body.split(',').map(str::trim).filter(|matcher| !matcher.is_empty()) {
            let (key, rest) = matcher.split_at(matcher.find(['=', '!']).expect("an operator"));
            let key = key.trim();
            let values = labels.get(key).unwrap_or_else(|| panic!("{series} has no label {key} ({expr})"));
            let value = rest.trim_start_matches(['=', '!', '~']).trim().trim_matches('"');
            if value.contains('$') || value.contains(".*") {
                continue;
            }
            for alternative in value.split('|') {
                assert!(
                    values.contains(alternative),
                    "{series}{{{key}={alternative:?}}} is never recorded ({expr})"
                );
            }
        }
    }
    for (index, _) in expr.match_indices("by (") {
        let group = &expr[index + 4..index + expr[index..].find(')').expect("closed grouping")];
        for key in group.split(',').map(str::trim) {
            assert!(available.contains(key), "grouping by {key}, which none of its series carries ({expr})");
        }
    }
    if let Some(start) = expr.find("label_values(") {
        let arguments = &expr
            [start + "label_values(".len()..expr[start..].find(')').map_or(expr.len(), |end| start + end)];
        if let Some((series, key)) = arguments.split_once(',') {
            assert!(
                emitted.labels(series.trim()).contains_key(key.trim()),
                "{series} has no label {key} ({expr})"
            );
        }
    }
}

/// The metric a series name belongs to: a histogram's `_bucket`, `_sum` and `_count` are its.
fn metric_of(series: &str, emitted: &Emitted) -> String {
    for suffix in ["_bucket", "_sum", "_count"] {
        if let Some(base) = series.strip_suffix(suffix)
            && emitted.series.contains_key(&format!("{base}_bucket"))
        {
            return base.to_owned();
        }
    }
    series.to_owned()
}

#[tokio::test]
async fn every_dashboard_query_names_an_emitted_metric_and_every_service_metric_is_shown() {
    let handle = install_metrics().expect("the only recorder of this test binary");
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), RULES);
    // One shard of two keys: a third key finds the store full; expired keys are cleaned up
    // by the next admission.
    let clock = ManualClock::new();
    let config = MemoryStoreConfig::new(2).unwrap().with_shard_count(1).unwrap();
    let backend = Backend::memory_with_clock(config, Arc::new(clock.clone()));
    let service =
        Service::new(RuleTable::load(dir.path()).unwrap(), &backend, hasher(), ServiceOptions::default());
    let loopback = "127.0.0.1:0".parse().unwrap();
    let server = Server::with_service(service.clone(), loopback, loopback)
        .await
        .unwrap()
        .with_metrics(handle)
        .with_reload(dir.path().to_owned(), Duration::from_millis(100));
    let server = TestServer::run(server).await;
    let mut client = server.client().await;

    // A shadow-mode would-denial, an enforced denial, a full store.
    for _ in 0..2 {
        assert_eq!(overall(&call(&mut client, request("d", &[&[("soft", "x")]])).await), Code::Ok);
    }
    assert_eq!(overall(&call(&mut client, request("d", &[&[("enforced", "a")]])).await), Code::Ok);
    assert_eq!(overall(&call(&mut client, request("d", &[&[("enforced", "a")]])).await), Code::OverLimit);
    assert_eq!(overall(&call(&mut client, request("d", &[&[("enforced", "b")]])).await), Code::OverLimit);
    // Both keys expire; the next admission removes them (a cleanup observation).
    clock.advance(Duration::from_secs(2));
    assert_eq!(overall(&call(&mut client, request("d", &[&[("enforced", "c")]])).await), Code::Ok);
    // A detailed label longer than the bound: counted under `(other values)`.
    let long = "v".repeat(1_100);
    assert_eq!(overall(&call(&mut client, request("d", &[&[("user", &long)]])).await), Code::Ok);
    // A backend failure.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let broken_backend =
        Backend::redis(&format!("redis://{closed}"), &runlimit_redis::RedisConfig::default()).unwrap();
    let broken = Service::new(
        support::rules(
            "domain: broken\ndescriptors:\n  - key: k\n    rate_limit: { unit: hour, requests_per_unit: 1 }\n",
        ),
        &broken_backend,
        hasher(),
        ServiceOptions::default(),
    );
    assert!(broken.should_rate_limit(&request("broken", &[&[("k", "a")]])).await.is_err());
    // A reload.
    write(
        dir.path(),
        &format!("{RULES}  - key: added\n    rate_limit: {{ unit: hour, requests_per_unit: 5 }}\n"),
    );
    let mut metrics = scrape(server.http).await;
    for _ in 0..200 {
        if metrics.samples.iter().any(|sample| sample.metric == "runlimit_server_config_reloads_total") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        metrics = scrape(server.http).await;
    }
    let emitted = Emitted::new(&metrics);

    let dashboard: serde_json::Value = serde_json::from_str(DASHBOARD).expect("the dashboard is JSON");
    let mut found = Vec::new();
    queries(&dashboard, &mut found);
    assert!(found.len() >= 15, "the dashboard has its queries: {found:?}");
    let mut shown = BTreeSet::new();
    for expr in &found {
        check(expr, &emitted);
        shown.extend(runlimit_identifiers(expr).into_iter().map(|series| metric_of(series, &emitted)));
    }
    // Every metric of the service's own has a panel.
    let service_metrics: BTreeSet<String> = emitted
        .series
        .keys()
        .map(|series| metric_of(series, &emitted))
        .filter(|metric| metric.starts_with("runlimit_server_"))
        .collect();
    assert_eq!(service_metrics.len(), 9, "{service_metrics:?}");
    let missing: Vec<_> = service_metrics.difference(&shown).collect();
    assert!(missing.is_empty(), "metrics without a panel: {missing:?}");
    // And the limiters' admission, shard and cleanup metrics.
    for metric in [
        "runlimit_admissions_total",
        "runlimit_admission_duration_seconds",
        "runlimit_shard_entries",
        "runlimit_shard_capacity_entries",
        "runlimit_cleanups_total",
        "runlimit_cleanup_removed_entries_total",
    ] {
        assert!(shown.contains(metric), "{metric} has no panel");
    }
    server.stop().await;
}

#[test]
#[should_panic(expected = "is never recorded")]
fn a_misspelt_label_value_fails_the_check() {
    let mut emitted = Emitted::default();
    emitted
        .series
        .entry("runlimit_server_rule_decisions_total".to_owned())
        .or_default()
        .entry("decision".to_owned())
        .or_default()
        .insert("over_limit".to_owned());
    check(r#"sum(rate(runlimit_server_rule_decisions_total{decision="overlimit"}[5m]))"#, &emitted);
}

#[test]
#[should_panic(expected = "is not emitted")]
fn a_metric_not_emitted_fails_the_check() {
    check("sum(rate(runlimit_server_requests[5m]))", &Emitted::default());
}
