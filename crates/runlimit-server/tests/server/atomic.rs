//! The guarantee envoyproxy/ratelimit lacks (envoyproxy/ratelimit#1060, "counter pollution"): a request
//! over one limit charges no other.

use crate::support;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{Code, rate_limit::Unit};
use runlimit_server::ServiceOptions;
use support::{TestServer, call, memory, overall, request, views};

const RULES: &str = "
domain: api
descriptors:
  - key: tenant
    rate_limit:
      unit: minute
      requests_per_unit: 10
  - key: user
    rate_limit:
      unit: minute
      requests_per_unit: 2
";

#[tokio::test]
async fn a_request_over_the_per_user_limit_leaves_the_broad_counter_untouched() {
    let (backend, _clock) = memory();
    let server = TestServer::start(RULES, &backend, ServiceOptions::default()).await;
    let mut client = server.client().await;
    let minute = Unit::Minute as i32;
    let both = || request("api", &[&[("tenant", "acme")], &[("user", "mallory")]]);

    let first = call(&mut client, both()).await;
    assert_eq!(overall(&first), Code::Ok);
    assert_eq!(
        views(&first),
        [(Code::Ok, Some((10, minute)), 9, Some(60_000)), (Code::Ok, Some((2, minute)), 1, Some(60_000))]
    );
    let second = call(&mut client, both()).await;
    assert_eq!(views(&second)[..1], [(Code::Ok, Some((10, minute)), 8, Some(60_000))]);
    // mallory is over the per-user limit: ten more requests, all denied, none charged to acme.
    for _ in 0..10 {
        let denied = call(&mut client, both()).await;
        assert_eq!(overall(&denied), Code::OverLimit);
        assert_eq!(
            views(&denied),
            [(Code::Ok, None, 0, None), (Code::OverLimit, Some((2, minute)), 0, Some(60_000))]
        );
    }
    // The tenant still has exactly 8 of its 10: the next request of another user takes one.
    let other = call(&mut client, request("api", &[&[("tenant", "acme")], &[("user", "alice")]])).await;
    assert_eq!(
        views(&other),
        [(Code::Ok, Some((10, minute)), 7, Some(60_000)), (Code::Ok, Some((2, minute)), 1, Some(60_000))]
    );
    server.stop().await;
}

/// Each domain has its own memory stores: one domain whose store is full (a flood of distinct
/// values) does not deny new keys of another.
#[tokio::test]
async fn a_full_store_of_one_domain_leaves_other_domains_alone() {
    let rules = "
domain: flooded
descriptors:
  - key: user
    rate_limit: { unit: day, requests_per_unit: 1 }
";
    let other = "
domain: calm
descriptors:
  - key: ip
    rate_limit: { unit: second, requests_per_unit: 100 }
";
    let clock = runlimit_memory::ManualClock::new();
    let config = runlimit_memory::MemoryStoreConfig::new(2).unwrap();
    let backend = runlimit_server::Backend::memory_with_clock(config, std::sync::Arc::new(clock.clone()));
    let table = runlimit_server::RuleTable::from_sources([("a.yaml", rules), ("b.yaml", other)]).unwrap();
    let service =
        runlimit_server::Service::new(table, &backend, support::hasher(), ServiceOptions::default());
    let server = TestServer::serve(service).await;
    let mut client = server.client().await;
    let day = Unit::Day as i32;
    for user in ["u1", "u2"] {
        assert_eq!(
            views(&call(&mut client, request("flooded", &[&[("user", user)]])).await),
            [(Code::Ok, Some((1, day)), 0, Some(86_400_000))]
        );
    }
    // The flooded domain's store is full: a new user is denied until a stored day ends.
    let full = call(&mut client, request("flooded", &[&[("user", "u3")]])).await;
    assert_eq!(overall(&full), Code::OverLimit);
    assert_eq!(views(&full), [(Code::OverLimit, Some((1, day)), 0, Some(86_400_000))]);
    // The other domain still admits new keys.
    let calm = call(&mut client, request("calm", &[&[("ip", "192.0.2.1")]])).await;
    assert_eq!(views(&calm), [(Code::Ok, Some((100, Unit::Second as i32)), 99, Some(1_000))]);
    server.stop().await;
}
