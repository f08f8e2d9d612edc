//! The guarantee envoyproxy/ratelimit lacks (its issue 1060, "counter pollution"): a request
//! over one limit charges no other.

mod support;

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
