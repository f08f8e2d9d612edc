//! The GCRA extension (`algorithm: gcra`, `burst`) over gRPC: exact remaining units and
//! durations on the manual clock, replaying Runlimit's GCRA reference vectors V1 (10 per
//! second, burst 20) and V2 (3 per second, burst 2: an emission interval of 333⅓ ms).

use crate::support;

use std::time::Duration;

use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, rate_limit_response::Code};
use runlimit_server::{HeaderFormat, ServiceOptions};
use support::{
    MINUTE, SECOND, StatusView, call, descriptor, headers, overall, pairs, request, request_of, serve_memory,
    views, with_hits,
};

const RULES: &str = "
domain: metered
descriptors:
  - key: client
    rate_limit:
      unit: second
      requests_per_unit: 10
      algorithm: gcra
      burst: 20
  - key: slow
    rate_limit:
      unit: second
      requests_per_unit: 3
      algorithm: gcra
      burst: 2
  - key: plain
    rate_limit:
      unit: minute
      requests_per_unit: 60
      algorithm: gcra
  - key: none
    rate_limit:
      unit: second
      requests_per_unit: 0
      algorithm: gcra
";

const NO_LIMIT: StatusView = (Code::Ok, None, 0, None);

fn client(remaining: u32, reset_ms: u64) -> StatusView {
    (Code::Ok, Some((10, SECOND)), remaining, Some(reset_ms))
}

fn c1(hits: u64) -> RateLimitRequest {
    request_of("metered", vec![with_hits(descriptor(&[("client", "c1")]), hits)])
}

#[tokio::test]
async fn a_rested_client_spends_its_burst_then_one_unit_per_emission_interval() {
    let (server, clock, mut rls) = serve_memory(RULES, ServiceOptions::default()).await;
    // Remaining is what can be spent now; the reset is the time until fully rested.
    assert_eq!(views(&call(&mut rls, c1(1)).await), [client(19, 100)]);
    assert_eq!(views(&call(&mut rls, c1(19)).await), [client(0, 2_000)]);
    let over = call(&mut rls, c1(1)).await;
    assert_eq!(overall(&over), Code::OverLimit);
    assert_eq!(views(&over), [(Code::OverLimit, Some((10, SECOND)), 0, Some(100))]);
    clock.advance(Duration::from_millis(99));
    assert_eq!(views(&call(&mut rls, c1(1)).await), [(Code::OverLimit, Some((10, SECOND)), 0, Some(1))]);
    clock.advance(Duration::from_millis(1));
    assert_eq!(views(&call(&mut rls, c1(1)).await), [client(0, 2_000)]);
    // 350 ms later 3.5 units came back: 2 whole ones remain after this request.
    clock.advance(Duration::from_millis(350));
    assert_eq!(views(&call(&mut rls, c1(1)).await), [client(2, 1_750)]);
    // 3 more do not fit (2.5 do): denied for the 50 ms until they would, charging nothing.
    let over = call(&mut rls, c1(3)).await;
    assert_eq!(views(&over), [(Code::OverLimit, Some((10, SECOND)), 0, Some(50))]);
    assert_eq!(views(&call(&mut rls, c1(2)).await), [client(0, 1_950)]);
    // Fully rested 1,950 ms later: the whole burst again.
    clock.advance(Duration::from_millis(1_950));
    assert_eq!(views(&call(&mut rls, c1(20)).await), [client(0, 2_000)]);
    server.stop().await;
}

#[tokio::test]
async fn an_emission_interval_of_a_third_of_a_second_rounds_durations_up() {
    let (server, clock, mut client) = serve_memory(RULES, ServiceOptions::default()).await;
    let slow = || request("metered", &[&[("slow", "s1")]]);
    let limit = Some((3, SECOND));
    assert_eq!(views(&call(&mut client, slow()).await), [(Code::Ok, limit, 1, Some(334))]);
    assert_eq!(views(&call(&mut client, slow()).await), [(Code::Ok, limit, 0, Some(667))]);
    assert_eq!(views(&call(&mut client, slow()).await), [(Code::OverLimit, limit, 0, Some(334))]);
    clock.advance(Duration::from_millis(333));
    assert_eq!(views(&call(&mut client, slow()).await), [(Code::OverLimit, limit, 0, Some(1))]);
    clock.advance(Duration::from_millis(1));
    assert_eq!(views(&call(&mut client, slow()).await), [(Code::Ok, limit, 0, Some(666))]);
    server.stop().await;
}

#[tokio::test]
async fn the_burst_defaults_to_requests_per_unit() {
    let (server, clock, mut client) = serve_memory(RULES, ServiceOptions::default()).await;
    let plain = |hits| request_of("metered", vec![with_hits(descriptor(&[("plain", "p1")]), hits)]);
    let limit = Some((60, MINUTE));
    assert_eq!(views(&call(&mut client, plain(1)).await), [(Code::Ok, limit, 59, Some(1_000))]);
    assert_eq!(views(&call(&mut client, plain(59)).await), [(Code::Ok, limit, 0, Some(60_000))]);
    assert_eq!(views(&call(&mut client, plain(1)).await), [(Code::OverLimit, limit, 0, Some(1_000))]);
    // Above the burst never fits.
    clock.advance(Duration::from_secs(60));
    assert_eq!(views(&call(&mut client, plain(61)).await), [(Code::OverLimit, limit, 0, None)]);
    assert_eq!(views(&call(&mut client, plain(60)).await), [(Code::Ok, limit, 0, Some(60_000))]);
    server.stop().await;
}

#[tokio::test]
async fn hits_above_the_burst_are_over_limit_without_a_reset_and_store_nothing() {
    let (server, _clock, mut rls) = serve_memory(RULES, ServiceOptions::default()).await;
    let over = call(&mut rls, c1(21)).await;
    assert_eq!(overall(&over), Code::OverLimit);
    assert_eq!(views(&over), [(Code::OverLimit, Some((10, SECOND)), 0, None)]);
    assert_eq!(views(&call(&mut rls, c1(1)).await), [client(19, 100)]);
    server.stop().await;
}

#[tokio::test]
async fn a_check_only_descriptor_reads_the_units_spendable_now() {
    let (server, clock, mut rls) = serve_memory(RULES, ServiceOptions::default()).await;
    assert_eq!(views(&call(&mut rls, c1(0)).await), [client(20, 0)]);
    call(&mut rls, c1(5)).await;
    assert_eq!(views(&call(&mut rls, c1(0)).await), [client(15, 500)]);
    call(&mut rls, c1(15)).await;
    clock.advance(Duration::from_millis(30));
    // Exhausted: over limit until the next unit, in 70 ms; the request is denied.
    let denied = call(
        &mut rls,
        request_of(
            "metered",
            vec![descriptor(&[("slow", "s1")]), with_hits(descriptor(&[("client", "c1")]), 0)],
        ),
    )
    .await;
    assert_eq!(overall(&denied), Code::OverLimit);
    assert_eq!(views(&denied), [NO_LIMIT, (Code::OverLimit, Some((10, SECOND)), 0, Some(70))]);
    // slow was not charged.
    assert_eq!(
        views(&call(&mut rls, request("metered", &[&[("slow", "s1")]])).await),
        [(Code::Ok, Some((3, SECOND)), 1, Some(334))]
    );
    server.stop().await;
}

#[tokio::test]
async fn a_gcra_request_over_one_limit_charges_no_other() {
    let (server, _clock, mut client) = serve_memory(RULES, ServiceOptions::default()).await;
    let both = || request("metered", &[&[("client", "c1")], &[("slow", "s1")]]);
    assert_eq!(
        views(&call(&mut client, both()).await),
        [(Code::Ok, Some((10, SECOND)), 19, Some(100)), (Code::Ok, Some((3, SECOND)), 1, Some(334))]
    );
    assert_eq!(
        views(&call(&mut client, both()).await),
        [(Code::Ok, Some((10, SECOND)), 18, Some(200)), (Code::Ok, Some((3, SECOND)), 0, Some(667))]
    );
    for _ in 0..3 {
        let denied = call(&mut client, both()).await;
        assert_eq!(overall(&denied), Code::OverLimit);
        assert_eq!(views(&denied), [NO_LIMIT, (Code::OverLimit, Some((3, SECOND)), 0, Some(334))]);
    }
    assert_eq!(
        views(&call(&mut client, request("metered", &[&[("client", "c1")]])).await),
        [(Code::Ok, Some((10, SECOND)), 17, Some(300))]
    );
    server.stop().await;
}

#[tokio::test]
async fn two_gcra_descriptors_of_one_counter_are_one_check_costing_the_sum() {
    let (server, _clock, mut rls) = serve_memory(RULES, ServiceOptions::default()).await;
    let twice = call(&mut rls, request("metered", &[&[("client", "c1")], &[("client", "c1")]])).await;
    assert_eq!(views(&twice), [client(18, 200), client(18, 200)]);
    server.stop().await;
}

#[tokio::test]
async fn a_gcra_rule_of_zero_is_over_limit_without_a_reset() {
    let (server, _clock, mut rls) = serve_memory(RULES, ServiceOptions::default()).await;
    let denied = call(&mut rls, request("metered", &[&[("client", "c1")], &[("none", "x")]])).await;
    assert_eq!(overall(&denied), Code::OverLimit);
    assert_eq!(views(&denied), [NO_LIMIT, (Code::OverLimit, Some((0, SECOND)), 0, None)]);
    assert_eq!(views(&call(&mut rls, c1(1)).await), [client(19, 100)]);
    server.stop().await;
}

#[tokio::test]
async fn global_shadow_gcra_charges_nothing_when_a_request_would_be_denied() {
    let options = ServiceOptions { shadow_mode: true, ..ServiceOptions::default() };
    let (server, _clock, mut client) = serve_memory(RULES, options).await;
    call(&mut client, request_of("metered", vec![with_hits(descriptor(&[("slow", "s1")]), 2)])).await;
    let response = call(&mut client, request("metered", &[&[("client", "c1")], &[("slow", "s1")]])).await;
    assert_eq!(overall(&response), Code::Ok);
    assert_eq!(views(&response), [NO_LIMIT, (Code::OverLimit, Some((3, SECOND)), 0, Some(334))]);
    assert_eq!(
        views(&call(&mut client, request("metered", &[&[("client", "c1")]])).await),
        [(Code::Ok, Some((10, SECOND)), 19, Some(100))]
    );
    server.stop().await;
}

#[tokio::test]
async fn draft_11_headers_give_the_replenishment_rate_and_the_time_until_rested() {
    let options =
        ServiceOptions { response_headers: Some(HeaderFormat::Draft11), ..ServiceOptions::default() };
    let (server, clock, mut client) = serve_memory(RULES, options).await;
    let response = call(&mut client, request("metered", &[&[("client", "c1")], &[("plain", "p1")]])).await;
    assert_eq!(
        headers(&response),
        pairs(&[
            ("RateLimit-Policy", r#""metered.client";q=10;w=1, "metered.plain";q=60;w=60"#),
            ("RateLimit", r#""metered.client";r=19;t=1, "metered.plain";r=59;t=1"#),
        ])
    );
    call(&mut client, request_of("metered", vec![with_hits(descriptor(&[("client", "c1")]), 19)])).await;
    clock.advance(Duration::from_millis(40));
    let over = call(&mut client, request("metered", &[&[("client", "c1")]])).await;
    assert_eq!(views(&over), [(Code::OverLimit, Some((10, SECOND)), 0, Some(60))]);
    assert_eq!(
        headers(&over),
        pairs(&[
            ("RateLimit-Policy", r#""metered.client";q=10;w=1"#),
            ("RateLimit", r#""metered.client";r=0;t=1"#),
            ("Retry-After", "1"),
        ])
    );
    server.stop().await;
}

#[tokio::test]
async fn envoy_headers_give_requests_per_unit_as_the_limit_and_the_burst_left_as_remaining() {
    let options =
        ServiceOptions { response_headers: Some(HeaderFormat::EnvoyRatelimit), ..ServiceOptions::default() };
    let (server, _clock, mut rls) = serve_memory(RULES, options).await;
    let response = call(&mut rls, c1(1)).await;
    assert_eq!(views(&response), [client(19, 100)]);
    assert_eq!(
        headers(&response),
        pairs(&[("RateLimit-Limit", "10"), ("RateLimit-Remaining", "19"), ("RateLimit-Reset", "1")])
    );
    server.stop().await;
}
