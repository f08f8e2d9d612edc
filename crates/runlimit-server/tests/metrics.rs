//! `GET /metrics`: every metric of the service after a known sequence of requests, read by a
//! Prometheus text parser (`prometheus-parse`) and compared by exact sample values.
//!
//! One test in this binary: it installs the process's global Prometheus recorder, and the
//! `detailed_metric` bound is per process.

mod support;

use std::{
    collections::{BTreeMap, BTreeSet},
    path::Path,
    sync::Arc,
    time::Duration,
};

use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, rate_limit_response::Code};
use prometheus_parse::{Scrape, Value};
use runlimit_memory::{ManualClock, MemoryStoreConfig};
use runlimit_server::{Backend, RuleTable, Server, Service, ServiceOptions, install_metrics};
use support::{TestServer, call, descriptor, hasher, overall, request, request_of, with_hits, with_override};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

const RULES: &str = "
domain: d
descriptors:
  - key: enforced
    rate_limit: { unit: hour, requests_per_unit: 1 }
  - key: soft
    shadow_mode: true
    rate_limit: { unit: hour, requests_per_unit: 1 }
  - key: named
    rate_limit: { name: login, unit: hour, requests_per_unit: 2 }
  - key: free
    rate_limit: { unlimited: true }
  - key: tenant
    value: acme
    descriptors:
      - key: user
        detailed_metric: true
        rate_limit: { unit: hour, requests_per_unit: 1 }
";

/// `HOUR` in `envoy.type.v3.RateLimitUnit`.
const OVERRIDE_HOUR: i32 = 3;

async fn get(address: std::net::SocketAddr, path: &str) -> String {
    let mut stream = tokio::net::TcpStream::connect(address).await.unwrap();
    let request = format!("GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    response.split_once("\r\n\r\n").map(|(_, body)| body.to_owned()).unwrap_or_default()
}

/// A label set, sorted.
type Labels = BTreeMap<String, String>;

fn labels(pairs: &[(&str, &str)]) -> Labels {
    pairs.iter().map(|(key, value)| ((*key).to_owned(), (*value).to_owned())).collect()
}

/// `GET /metrics`, parsed.
async fn scrape(http: std::net::SocketAddr) -> Scrape {
    let text = get(http, "/metrics").await;
    Scrape::parse(text.lines().map(|line| Ok(line.to_owned()))).expect("Prometheus text")
}

/// Every series of the counter or gauge `name`: its labels and value.
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

/// The expected series of `name`, as `(labels, value)` pairs.
fn expected(pairs: &[(&[(&str, &str)], f64)]) -> BTreeMap<Labels, f64> {
    pairs.iter().map(|(pairs, value)| (labels(pairs), *value)).collect()
}

/// The four `runlimit_server_rule_decisions_total` series of a plain rule label.
fn decisions(domain: &str, rule: &str, [ok, over, shadow, not_evaluated]: [f64; 4]) -> Vec<(Labels, f64)> {
    [("ok", ok), ("over_limit", over), ("shadow_over_limit", shadow), ("not_evaluated", not_evaluated)]
        .into_iter()
        .map(|(decision, value)| {
            (labels(&[("domain", domain), ("rule", rule), ("decision", decision)]), value)
        })
        .collect()
}

/// A request of the detailed rule: tenant `acme`, user `user`.
fn detailed(user: &str) -> RateLimitRequest {
    request("d", &[&[("tenant", "acme"), ("user", user)]])
}

/// Waits until `GET /metrics` has `name{labels}`, for at most 10 s.
async fn until_counted(http: std::net::SocketAddr, name: &str, pairs: &[(&str, &str)]) {
    for _ in 0..200 {
        if series(&scrape(http).await, name).contains_key(&labels(pairs)) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{name}{pairs:?} never appeared");
}

fn write(dir: &Path, text: &str) {
    // Written aside and renamed, as an editor or a ConfigMap update does: never read half-written.
    let staged = dir.join(".rules.yaml.tmp");
    std::fs::write(&staged, text).unwrap();
    std::fs::rename(&staged, dir.join("rules.yaml")).unwrap();
}

#[tokio::test]
async fn every_metric_has_its_exact_value_after_a_known_sequence_of_requests() {
    let handle = install_metrics().expect("the only recorder of this test binary");
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), RULES);
    let clock = ManualClock::new();
    let backend =
        Backend::memory_with_clock(MemoryStoreConfig::new(100_000).unwrap(), Arc::new(clock.clone()));
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
    let call_d = |request| {
        let service = service.clone();
        async move { service.should_rate_limit(&request).await.unwrap() }
    };

    // 1. The shadow rule's quota of 1 is used by the first request; the next two would be
    //    denied (shadow_over_limit), and are admitted.
    for _ in 0..3 {
        assert_eq!(overall(&call(&mut client, request("d", &[&[("soft", "x")]])).await), Code::Ok);
    }
    // 2. The enforced rule: one allowed, one denied.
    assert_eq!(overall(&call(&mut client, request("d", &[&[("enforced", "x")]])).await), Code::Ok);
    assert_eq!(overall(&call(&mut client, request("d", &[&[("enforced", "x")]])).await), Code::OverLimit);
    // 3. Two descriptors: the enforced one is over its limit, so `login` is not evaluated.
    let both = request("d", &[&[("enforced", "x")], &[("named", "n")]]);
    assert_eq!(overall(&call(&mut client, both).await), Code::OverLimit);
    // 4. `login` alone: allowed. Then checked without charging (`hits_addend` 0): still ok.
    assert_eq!(overall(&call(&mut client, request("d", &[&[("named", "n")]])).await), Code::Ok);
    let peek = request_of("d", vec![with_hits(descriptor(&[("named", "n")]), 0)]);
    assert_eq!(overall(&call(&mut client, peek).await), Code::Ok);
    // 5. A limit override: counted as `d.(override)`, whatever its entries.
    let limited = with_override(descriptor(&[("enforced", "y")]), 1, OVERRIDE_HOUR);
    assert_eq!(overall(&call(&mut client, request_of("d", vec![limited])).await), Code::Ok);
    // 6. An unlimited rule, and a descriptor no rule matches: answered, no rule decision.
    assert_eq!(overall(&call(&mut client, request("d", &[&[("free", "x")]])).await), Code::Ok);
    assert_eq!(overall(&call(&mut client, request("d", &[&[("nothing", "x")]])).await), Code::Ok);
    // 7. An unknown domain.
    assert_eq!(overall(&call(&mut client, request("elsewhere", &[&[("k", "v")]])).await), Code::Ok);
    // 8. The detailed rule: `u1` allowed, then denied; 999 more users reach the process's bound
    //    of 1,000 detailed values; a label above 1,024 bytes and the 1,001st user are counted
    //    under `d.tenant_acme.user (other values)`.
    assert_eq!(overall(&call(&mut client, detailed("u1")).await), Code::Ok);
    assert_eq!(overall(&call(&mut client, detailed("u1")).await), Code::OverLimit);
    let long = "v".repeat(1_024);
    assert_eq!(overall(&call_d(detailed(&long)).await), Code::Ok);
    for user in 2..=1_000 {
        assert_eq!(overall(&call_d(detailed(&format!("u{user}"))).await), Code::Ok);
    }
    assert_eq!(overall(&call_d(detailed("u1001")).await), Code::Ok);
    // d: 3 + 2 + 1 + 2 + 1 + 2 + 2 + 1 + 999 + 1 = 1,014 calls, 3 of them over the limit.

    // 9. A store of one key (domain `tiny`): its second key finds the store full.
    let tiny = Service::new(
        support::rules(
            "domain: tiny\ndescriptors:\n  - key: k\n    rate_limit: { unit: hour, requests_per_unit: 1 }\n",
        ),
        &Backend::memory(MemoryStoreConfig::new(1).unwrap()),
        hasher(),
        ServiceOptions::default(),
    );
    assert_eq!(overall(&tiny.should_rate_limit(&request("tiny", &[&[("k", "a")]])).await.unwrap()), Code::Ok);
    assert_eq!(
        overall(&tiny.should_rate_limit(&request("tiny", &[&[("k", "b")]])).await.unwrap()),
        Code::OverLimit
    );

    // 10. A backend that fails (Redis on a port nothing listens on): `UNAVAILABLE`, nothing
    //     consumed, counted as a backend failure and timed, but not as an answered request.
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
    let failure = broken.should_rate_limit(&request("broken", &[&[("k", "a")]])).await.unwrap_err();
    assert_eq!(failure.code(), tonic::Code::Unavailable, "{failure:?}");

    // 11. Reloads: a refused one (the old rules keep serving), then one that adds a rule.
    write(
        dir.path(),
        "domain: d\ndescriptors:\n  - key: enforced\n    rate_limit: { unit: minutes, requests_per_unit: 1 }\n",
    );
    until_counted(server.http, "runlimit_server_config_reloads_total", &[("result", "failure")]).await;
    write(
        dir.path(),
        &format!("{RULES}  - key: added\n    rate_limit: {{ unit: hour, requests_per_unit: 5 }}\n"),
    );
    until_counted(server.http, "runlimit_server_config_reloads_total", &[("result", "success")]).await;

    let metrics = scrape(server.http).await;
    assert_eq!(
        series(&metrics, "runlimit_server_requests_total"),
        expected(&[
            (&[("domain", ""), ("code", "ok")], 1.0),
            // Every domain's series exist from the start, at 0 until counted.
            (&[("domain", ""), ("code", "over_limit")], 0.0),
            (&[("domain", "d"), ("code", "ok")], 1_011.0),
            (&[("domain", "d"), ("code", "over_limit")], 3.0),
            (&[("domain", "tiny"), ("code", "ok")], 1.0),
            (&[("domain", "tiny"), ("code", "over_limit")], 1.0),
            (&[("domain", "broken"), ("code", "ok")], 0.0),
            (&[("domain", "broken"), ("code", "over_limit")], 0.0),
        ])
    );

    // Every limited rule's four plain series exist from the start; the detailed rule has one
    // series per value and decision recorded, and its `(other values)`.
    let mut rules: BTreeMap<Labels, f64> = [
        decisions("d", "d.enforced", [1.0, 2.0, 0.0, 0.0]),
        decisions("d", "d.soft", [1.0, 0.0, 2.0, 0.0]),
        // Named rules are counted by name: not evaluated once, allowed, then peeked.
        decisions("d", "login", [2.0, 0.0, 0.0, 1.0]),
        // Added by the reload.
        decisions("d", "d.added", [0.0; 4]),
        decisions("tiny", "tiny.k", [1.0, 1.0, 0.0, 0.0]),
        // A backend failure decides nothing.
        decisions("broken", "broken.k", [0.0; 4]),
    ]
    .into_iter()
    .flatten()
    .collect();
    let rule = |domain: &str, rule: &str, decision: &str| {
        labels(&[("domain", domain), ("rule", rule), ("decision", decision)])
    };
    rules.insert(rule("d", "d.(override)", "ok"), 1.0);
    rules.insert(rule("d", "d.tenant_acme.user_u1", "ok"), 1.0);
    rules.insert(rule("d", "d.tenant_acme.user_u1", "over_limit"), 1.0);
    for user in 2..=1_000 {
        rules.insert(rule("d", &format!("d.tenant_acme.user_u{user}"), "ok"), 1.0);
    }
    rules.insert(rule("d", "d.tenant_acme.user (other values)", "ok"), 2.0);
    let recorded = series(&metrics, "runlimit_server_rule_decisions_total");
    let differences: BTreeSet<_> = recorded
        .iter()
        .filter(|(labels, value)| rules.get(*labels) != Some(value))
        .map(|(labels, value)| format!("recorded {labels:?} = {value}"))
        .chain(
            rules
                .iter()
                .filter(|(labels, value)| recorded.get(*labels) != Some(value))
                .map(|(labels, value)| format!("expected {labels:?} = {value}")),
        )
        .collect();
    assert!(differences.is_empty(), "{differences:#?}");
    assert_eq!(recorded.len(), 6 * 4 + 1 + 1_000 + 1 + 1);
    assert_eq!(
        series(&metrics, "runlimit_server_detailed_series_dropped_total"),
        expected(&[(&[("domain", "d")], 2.0)])
    );

    assert_eq!(
        series(&metrics, "runlimit_server_shadow_denials_total"),
        expected(&[(&[("domain", "d"), ("rule", "d.soft"), ("reason", "quota")], 2.0)])
    );
    assert_eq!(
        series(&metrics, "runlimit_server_storage_full_total"),
        expected(&[(&[("domain", "tiny")], 1.0)])
    );
    assert_eq!(
        series(&metrics, "runlimit_server_backend_failures_total"),
        expected(&[(&[("domain", "broken"), ("consumption", "not_consumed")], 1.0)])
    );
    assert_eq!(
        series(&metrics, "runlimit_server_config_reloads_total"),
        expected(&[(&[("result", "failure")], 1.0), (&[("result", "success")], 1.0)])
    );
    let age = series(&metrics, "runlimit_server_config_age_seconds");
    let age = age.get(&Labels::new()).copied().expect("the config age");
    assert!((0.0..60.0).contains(&age), "the rules were reloaded just now: {age} s");

    // The latency histogram: one sample per timed call, in the documented buckets.
    let histograms: BTreeMap<Labels, Vec<(f64, f64)>> = metrics
        .samples
        .iter()
        .filter(|sample| sample.metric == "runlimit_server_request_duration_seconds")
        .map(|sample| {
            let Value::Histogram(buckets) = &sample.value else { panic!("a histogram: {sample:?}") };
            let labels = sample.labels.iter().map(|(key, value)| (key.clone(), value.clone())).collect();
            (labels, buckets.iter().map(|bucket| (bucket.less_than, bucket.count)).collect())
        })
        .collect();
    let bounds = [
        1e-5,
        2.5e-5,
        5e-5,
        1e-4,
        2.5e-4,
        5e-4,
        1e-3,
        2.5e-3,
        5e-3,
        1e-2,
        2e-2,
        5e-2,
        0.1,
        0.25,
        1.0,
        5.0,
        f64::INFINITY,
    ];
    for buckets in histograms.values() {
        assert_eq!(buckets.iter().map(|(bound, _)| *bound).collect::<Vec<_>>(), bounds);
        assert!(buckets.windows(2).all(|pair| pair[0].1 <= pair[1].1), "cumulative: {buckets:?}");
    }
    let total = |domain: &str| histograms[&labels(&[("domain", domain)])].last().unwrap().1;
    assert_eq!([total("d"), total(""), total("tiny"), total("broken")], [1_014.0, 1.0, 2.0, 1.0]);
    assert_eq!(
        series(&metrics, "runlimit_server_request_duration_seconds_count"),
        expected(&[
            (&[("domain", "d")], 1_014.0),
            (&[("domain", "")], 1.0),
            (&[("domain", "tiny")], 2.0),
            (&[("domain", "broken")], 1.0),
        ])
    );
    for (labels, sum) in series(&metrics, "runlimit_server_request_duration_seconds_sum") {
        assert!(sum > 0.0, "{labels:?}: {sum}");
    }

    // runlimit-metrics, from the limiters: every batch (one per request with limited rules;
    // `soft` is a shadow batch) and the shard gauges of each domain's memory store.
    let admissions = series(&metrics, "runlimit_admissions_total");
    let sum = |backend: &str, outcome: &str| -> f64 {
        admissions
            .iter()
            .filter(|(labels, _)| labels["backend"] == backend && labels["outcome"] == outcome)
            .map(|(_, value)| value)
            .sum()
    };
    // d: soft 1 + enforced 1 + login 1 + override 1 + detailed 1 + 1 + 999 + 1 allowed; tiny: 1.
    assert_eq!(sum("memory", "allowed"), 1_007.0);
    assert_eq!(sum("memory", "shadow_denied"), 2.0);
    // d: enforced twice (once with login in the batch), u1 once; tiny's full store once.
    assert_eq!(sum("memory", "quota_exceeded"), 3.0);
    assert_eq!(sum("memory", "storage_capacity"), 1.0);
    assert_eq!(sum("redis", "failed"), 1.0);
    let capacity = series(&metrics, "runlimit_shard_capacity_entries");
    let stores: BTreeSet<&str> = capacity.keys().map(|labels| labels["store"].as_str()).collect();
    assert_eq!(stores, BTreeSet::from(["d/fixed_window", "tiny/fixed_window"]));
    let entries = series(&metrics, "runlimit_shard_entries");
    let stored = |store: &str| -> f64 {
        entries.iter().filter(|(labels, _)| labels["store"] == store).map(|(_, value)| value).sum()
    };
    assert_eq!(stored("tiny/fixed_window"), 1.0);

    server.stop().await;
}
