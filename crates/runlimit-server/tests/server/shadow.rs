//! Shadow mode over gRPC: a rule's own `shadow_mode: true` (its descriptor reads `OK` even
//! when over) and the server's global shadow mode (over-limit descriptors read `OVER_LIMIT`,
//! the overall code is `OK`). In both, a would-be-denied batch consumes nothing.

use crate::support;

use std::time::Duration;

use envoy_types::pb::envoy::{service::ratelimit::v3::rate_limit_response::Code, r#type::v3::RateLimitUnit};
use runlimit_server::ServiceOptions;
use support::{
    MINUTE, StatusView, call, descriptor, overall, request, request_of, serve_memory, views, with_hits,
    with_override,
};

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
  - key: trial
    shadow_mode: true
    rate_limit:
      unit: minute
      requests_per_unit: 3
  - key: beta
    shadow_mode: true
    rate_limit:
      unit: minute
      requests_per_unit: 5
  - key: blocked
    shadow_mode: true
    rate_limit:
      unit: minute
      requests_per_unit: 0
  - key: banned
    rate_limit:
      unit: minute
      requests_per_unit: 0
  - key: internal
    rate_limit:
      unlimited: true
";

const NO_LIMIT: StatusView = (Code::Ok, None, 0, None);

fn global() -> ServiceOptions {
    ServiceOptions { shadow_mode: true, ..ServiceOptions::default() }
}

fn ok(limit: u32, remaining: u32, reset_ms: u64) -> StatusView {
    (Code::Ok, Some((limit, MINUTE)), remaining, Some(reset_ms))
}

fn over(limit: u32, reset_ms: Option<u64>) -> StatusView {
    (Code::OverLimit, Some((limit, MINUTE)), 0, reset_ms)
}

/// Shadow-mode over its limit: `OK`, the limit, 0 remaining, the time until it would pass.
fn shadow_over(limit: u32, reset_ms: Option<u64>) -> StatusView {
    (Code::Ok, Some((limit, MINUTE)), 0, reset_ms)
}

// A rule's own shadow mode.

#[tokio::test]
async fn a_shadow_rule_over_its_limit_reads_ok_with_its_limit_and_retry_time() {
    let (server, clock, mut client) = serve_memory(RULES, ServiceOptions::default()).await;
    let trial = || request("api", &[&[("trial", "t1")]]);
    for remaining in [2, 1, 0] {
        assert_eq!(views(&call(&mut client, trial()).await), [ok(3, remaining, 60_000)]);
    }
    clock.advance(Duration::from_millis(1_500));
    for _ in 0..3 {
        let response = call(&mut client, trial()).await;
        assert_eq!(overall(&response), Code::Ok);
        assert_eq!(views(&response), [shadow_over(3, Some(58_500))]);
    }
    server.stop().await;
}

#[tokio::test]
async fn a_shadow_rule_would_be_denial_consumes_nothing() {
    let (server, _clock, mut client) = serve_memory(RULES, ServiceOptions::default()).await;
    let trial = |hits| request_of("api", vec![with_hits(descriptor(&[("trial", "t1")]), hits)]);
    assert_eq!(views(&call(&mut client, trial(2)).await), [ok(3, 1, 60_000)]);
    // 2 more would exceed 3: admitted, reported, not charged.
    let shadowed = call(&mut client, trial(2)).await;
    assert_eq!(overall(&shadowed), Code::Ok);
    assert_eq!(views(&shadowed), [shadow_over(3, Some(60_000))]);
    // So the last unit is still there.
    assert_eq!(views(&call(&mut client, trial(1)).await), [ok(3, 0, 60_000)]);
    server.stop().await;
}

#[tokio::test]
async fn an_enforced_rule_is_charged_beside_a_shadow_rule_over_its_limit() {
    let (server, _clock, mut client) = serve_memory(RULES, ServiceOptions::default()).await;
    let exhaust =
        call(&mut client, request_of("api", vec![with_hits(descriptor(&[("trial", "t1")]), 3)])).await;
    assert_eq!(views(&exhaust), [ok(3, 0, 60_000)]);
    for remaining in [9, 8, 7] {
        let response = call(&mut client, request("api", &[&[("tenant", "acme")], &[("trial", "t1")]])).await;
        assert_eq!(overall(&response), Code::Ok);
        assert_eq!(views(&response), [ok(10, remaining, 60_000), shadow_over(3, Some(60_000))]);
    }
    server.stop().await;
}

#[tokio::test]
async fn a_shadow_rule_is_not_charged_when_an_enforced_rule_denies() {
    let (server, _clock, mut client) = serve_memory(RULES, ServiceOptions::default()).await;
    let exhaust =
        call(&mut client, request_of("api", vec![with_hits(descriptor(&[("user", "u1")]), 2)])).await;
    assert_eq!(views(&exhaust), [ok(2, 0, 60_000)]);
    let denied = call(&mut client, request("api", &[&[("user", "u1")], &[("trial", "t1")]])).await;
    assert_eq!(overall(&denied), Code::OverLimit);
    assert_eq!(views(&denied), [over(2, Some(60_000)), NO_LIMIT]);
    assert_eq!(views(&call(&mut client, request("api", &[&[("trial", "t1")]])).await), [ok(3, 2, 60_000)]);
    server.stop().await;
}

#[tokio::test]
async fn other_shadow_rules_are_not_charged_when_one_shadow_rule_is_over() {
    let (server, _clock, mut client) = serve_memory(RULES, ServiceOptions::default()).await;
    call(&mut client, request_of("api", vec![with_hits(descriptor(&[("trial", "t1")]), 3)])).await;
    // The shadow batch would be denied: admitted, and neither shadow counter is charged; the
    // other shadow rule's descriptor is not evaluated.
    let response = call(&mut client, request("api", &[&[("beta", "b1")], &[("trial", "t1")]])).await;
    assert_eq!(overall(&response), Code::Ok);
    assert_eq!(views(&response), [NO_LIMIT, shadow_over(3, Some(60_000))]);
    assert_eq!(views(&call(&mut client, request("api", &[&[("beta", "b1")]])).await), [ok(5, 4, 60_000)]);
    server.stop().await;
}

#[tokio::test]
async fn a_shadow_rule_of_zero_reads_ok_without_a_reset() {
    let (server, _clock, mut client) = serve_memory(RULES, ServiceOptions::default()).await;
    let response = call(&mut client, request("api", &[&[("tenant", "acme")], &[("blocked", "x")]])).await;
    assert_eq!(overall(&response), Code::Ok);
    assert_eq!(views(&response), [ok(10, 9, 60_000), shadow_over(0, None)]);
    server.stop().await;
}

#[tokio::test]
async fn a_shadow_rule_of_zero_charges_no_other_shadow_rule() {
    let (server, _clock, mut client) = serve_memory(RULES, ServiceOptions::default()).await;
    let response = call(&mut client, request("api", &[&[("beta", "b1")], &[("blocked", "x")]])).await;
    assert_eq!(overall(&response), Code::Ok);
    assert_eq!(views(&response), [NO_LIMIT, shadow_over(0, None)]);
    assert_eq!(views(&call(&mut client, request("api", &[&[("beta", "b1")]])).await), [ok(5, 4, 60_000)]);
    server.stop().await;
}

#[tokio::test]
async fn shadow_hits_above_the_limit_read_ok_and_charge_no_other_shadow_rule() {
    let (server, _clock, mut client) = serve_memory(RULES, ServiceOptions::default()).await;
    let response = call(
        &mut client,
        request_of(
            "api",
            vec![
                descriptor(&[("tenant", "acme")]),
                descriptor(&[("beta", "b1")]),
                with_hits(descriptor(&[("trial", "t1")]), 4),
            ],
        ),
    )
    .await;
    assert_eq!(overall(&response), Code::Ok);
    assert_eq!(views(&response), [ok(10, 9, 60_000), NO_LIMIT, shadow_over(3, None)]);
    let next = call(&mut client, request("api", &[&[("trial", "t1")], &[("beta", "b1")]])).await;
    assert_eq!(views(&next), [ok(3, 2, 60_000), ok(5, 4, 60_000)]);
    server.stop().await;
}

#[tokio::test]
async fn a_shadow_check_only_descriptor_over_its_limit_reads_ok() {
    let (server, clock, mut client) = serve_memory(RULES, ServiceOptions::default()).await;
    call(&mut client, request_of("api", vec![with_hits(descriptor(&[("trial", "t1")]), 3)])).await;
    clock.advance(Duration::from_secs(15));
    let response = call(
        &mut client,
        request_of(
            "api",
            vec![descriptor(&[("tenant", "acme")]), with_hits(descriptor(&[("trial", "t1")]), 0)],
        ),
    )
    .await;
    assert_eq!(overall(&response), Code::Ok);
    assert_eq!(views(&response), [ok(10, 9, 60_000), shadow_over(3, Some(45_000))]);
    server.stop().await;
}

// Global shadow mode.

#[tokio::test]
async fn global_shadow_reports_over_limit_descriptors_and_answers_ok() {
    let (server, clock, mut client) = serve_memory(RULES, global()).await;
    let user = || request("api", &[&[("user", "u1")]]);
    assert_eq!(views(&call(&mut client, user()).await), [ok(2, 1, 60_000)]);
    assert_eq!(views(&call(&mut client, user()).await), [ok(2, 0, 60_000)]);
    clock.advance(Duration::from_millis(999));
    for _ in 0..3 {
        let response = call(&mut client, user()).await;
        assert_eq!(overall(&response), Code::Ok);
        assert_eq!(views(&response), [over(2, Some(59_001))]);
    }
    server.stop().await;
}

#[tokio::test]
async fn global_shadow_charges_nothing_for_a_request_that_would_be_denied() {
    let (server, _clock, mut client) = serve_memory(RULES, global()).await;
    let both = || request("api", &[&[("tenant", "acme")], &[("user", "u1")]]);
    assert_eq!(views(&call(&mut client, both()).await), [ok(10, 9, 60_000), ok(2, 1, 60_000)]);
    assert_eq!(views(&call(&mut client, both()).await), [ok(10, 8, 60_000), ok(2, 0, 60_000)]);
    for _ in 0..5 {
        let response = call(&mut client, both()).await;
        assert_eq!(overall(&response), Code::Ok);
        assert_eq!(views(&response), [NO_LIMIT, over(2, Some(60_000))]);
    }
    // The tenant still has 8.
    let tenant = call(&mut client, request("api", &[&[("tenant", "acme")]])).await;
    assert_eq!(views(&tenant), [ok(10, 7, 60_000)]);
    server.stop().await;
}

#[tokio::test]
async fn global_shadow_reports_only_the_first_over_limit_descriptor_of_a_would_be_denied_request() {
    let (server, _clock, mut client) = serve_memory(RULES, global()).await;
    call(&mut client, request_of("api", vec![with_hits(descriptor(&[("user", "u1")]), 2)])).await;
    call(&mut client, request_of("api", vec![with_hits(descriptor(&[("user", "u2")]), 2)])).await;
    // Both users are over; the batch stops at the first, so the second is not evaluated.
    let response = call(&mut client, request("api", &[&[("user", "u1")], &[("user", "u2")]])).await;
    assert_eq!(overall(&response), Code::Ok);
    assert_eq!(views(&response), [over(2, Some(60_000)), NO_LIMIT]);
    server.stop().await;
}

#[tokio::test]
async fn global_shadow_charges_nothing_beside_a_rule_of_zero() {
    let (server, _clock, mut client) = serve_memory(RULES, global()).await;
    let response = call(&mut client, request("api", &[&[("tenant", "acme")], &[("banned", "x")]])).await;
    assert_eq!(overall(&response), Code::Ok);
    assert_eq!(views(&response), [NO_LIMIT, over(0, None)]);
    let tenant = call(&mut client, request("api", &[&[("tenant", "acme")]])).await;
    assert_eq!(views(&tenant), [ok(10, 9, 60_000)]);
    server.stop().await;
}

#[tokio::test]
async fn global_shadow_charges_nothing_beside_hits_above_a_limit() {
    let (server, _clock, mut client) = serve_memory(RULES, global()).await;
    let response = call(
        &mut client,
        request_of(
            "api",
            vec![descriptor(&[("tenant", "acme")]), with_hits(descriptor(&[("user", "u1")]), 3)],
        ),
    )
    .await;
    assert_eq!(overall(&response), Code::Ok);
    assert_eq!(views(&response), [NO_LIMIT, over(2, None)]);
    let tenant = call(&mut client, request("api", &[&[("tenant", "acme")], &[("user", "u1")]])).await;
    assert_eq!(views(&tenant), [ok(10, 9, 60_000), ok(2, 1, 60_000)]);
    server.stop().await;
}

#[tokio::test]
async fn global_shadow_charges_nothing_beside_an_exhausted_check_only_descriptor() {
    let (server, clock, mut client) = serve_memory(RULES, global()).await;
    call(&mut client, request_of("api", vec![with_hits(descriptor(&[("user", "u1")]), 2)])).await;
    clock.advance(Duration::from_secs(20));
    let response = call(
        &mut client,
        request_of(
            "api",
            vec![descriptor(&[("tenant", "acme")]), with_hits(descriptor(&[("user", "u1")]), 0)],
        ),
    )
    .await;
    assert_eq!(overall(&response), Code::Ok);
    assert_eq!(views(&response), [NO_LIMIT, over(2, Some(40_000))]);
    let tenant = call(&mut client, request("api", &[&[("tenant", "acme")]])).await;
    assert_eq!(views(&tenant), [ok(10, 9, 60_000)]);
    server.stop().await;
}

#[tokio::test]
async fn global_shadow_also_reports_a_shadow_rule_over_its_limit_as_over_limit() {
    let (server, _clock, mut client) = serve_memory(RULES, global()).await;
    call(&mut client, request_of("api", vec![with_hits(descriptor(&[("trial", "t1")]), 3)])).await;
    let response = call(&mut client, request("api", &[&[("trial", "t1")]])).await;
    assert_eq!(overall(&response), Code::Ok);
    assert_eq!(views(&response), [over(3, Some(60_000))]);
    server.stop().await;
}

#[tokio::test]
async fn global_shadow_applies_to_limit_overrides() {
    let (server, _clock, mut client) = serve_memory(RULES, global()).await;
    let overridden = || {
        request_of("api", vec![with_override(descriptor(&[("path", "/x")]), 1, RateLimitUnit::Minute as i32)])
    };
    assert_eq!(views(&call(&mut client, overridden()).await), [ok(1, 0, 60_000)]);
    let response = call(&mut client, overridden()).await;
    assert_eq!(overall(&response), Code::Ok);
    assert_eq!(views(&response), [over(1, Some(60_000))]);
    server.stop().await;
}

#[tokio::test]
async fn global_shadow_leaves_unlimited_and_unmatched_descriptors_alone() {
    let (server, _clock, mut client) = serve_memory(RULES, global()).await;
    let response = call(&mut client, request("api", &[&[("internal", "i")], &[("nothing", "n")]])).await;
    assert_eq!(overall(&response), Code::Ok);
    assert_eq!(views(&response), [(Code::Ok, None, u32::MAX, None), NO_LIMIT]);
    server.stop().await;
}

// A full store is enforced in every mode: Runlimit's storage-capacity denial fails closed.

/// A server on a memory backend that holds a single key, its clock and a client.
async fn one_key_server(
    options: ServiceOptions,
) -> (support::TestServer, runlimit_memory::ManualClock, support::Client) {
    keys_server(1, options).await
}

/// A server on a memory backend that holds `keys` keys, its clock and a client.
async fn keys_server(
    keys: usize,
    options: ServiceOptions,
) -> (support::TestServer, runlimit_memory::ManualClock, support::Client) {
    let clock = runlimit_memory::ManualClock::new();
    let config = runlimit_memory::MemoryStoreConfig::new(keys).unwrap();
    let backend = runlimit_server::Backend::memory_with_clock(config, std::sync::Arc::new(clock.clone()));
    let server = support::TestServer::start(RULES, &backend, options).await;
    let client = server.client().await;
    (server, clock, client)
}

#[tokio::test]
async fn a_full_store_denies_a_new_key_of_a_shadow_rule() {
    let (server, clock, mut client) = one_key_server(ServiceOptions::default()).await;
    assert_eq!(views(&call(&mut client, request("api", &[&[("tenant", "a")]])).await), [ok(10, 9, 60_000)]);
    clock.advance(Duration::from_secs(10));
    let full = call(&mut client, request("api", &[&[("trial", "t1")]])).await;
    assert_eq!(overall(&full), Code::OverLimit);
    assert_eq!(views(&full), [over(3, Some(50_000))]);
    server.stop().await;
}

#[tokio::test]
async fn a_full_store_denies_a_new_key_under_global_shadow() {
    let (server, clock, mut client) = one_key_server(global()).await;
    assert_eq!(views(&call(&mut client, request("api", &[&[("tenant", "a")]])).await), [ok(10, 9, 60_000)]);
    clock.advance(Duration::from_secs(10));
    let full = call(&mut client, request("api", &[&[("tenant", "b")], &[("internal", "i")]])).await;
    assert_eq!(overall(&full), Code::OverLimit);
    assert_eq!(views(&full), [over(10, Some(50_000)), (Code::Ok, None, u32::MAX, None)]);
    // Once the stored window ends its slot is free again.
    clock.advance(Duration::from_secs(50));
    assert_eq!(views(&call(&mut client, request("api", &[&[("tenant", "b")]])).await), [ok(10, 9, 60_000)]);
    server.stop().await;
}

/// Regression: the enforced batch was committed, then the shadow batch's full store denied the
/// request (429 after its enforced rules were charged). The request is admitted now, as its
/// enforced rules decided; the shadow rule reports the full store as a shadow denial.
#[tokio::test]
async fn a_full_store_after_the_enforced_rules_were_charged_is_a_shadow_denial() {
    let (server, clock, mut client) = keys_server(2, ServiceOptions::default()).await;
    assert_eq!(views(&call(&mut client, request("api", &[&[("tenant", "a")]])).await), [ok(10, 9, 60_000)]);
    assert_eq!(views(&call(&mut client, request("api", &[&[("tenant", "b")]])).await), [ok(10, 9, 60_000)]);
    clock.advance(Duration::from_secs(10));
    let mixed = call(&mut client, request("api", &[&[("tenant", "a")], &[("trial", "t1")]])).await;
    assert_eq!(overall(&mixed), Code::Ok);
    assert_eq!(views(&mixed), [ok(10, 8, 50_000), shadow_over(3, Some(50_000))]);
    // The enforced counter was charged once, as the answer said.
    assert_eq!(views(&call(&mut client, request("api", &[&[("tenant", "a")]])).await), [ok(10, 7, 50_000)]);
    server.stop().await;
}
