//! Response headers over gRPC: the IETF draft-11 fields (`RateLimit-Policy`, `RateLimit`,
//! `Retry-After`) and envoyproxy/ratelimit's (`RateLimit-Limit`, `RateLimit-Remaining`,
//! `RateLimit-Reset`), exact strings, on allowed and over-limit answers.

use crate::support;

use std::time::Duration;

use envoy_types::pb::envoy::{service::ratelimit::v3::rate_limit_response::Code, r#type::v3::RateLimitUnit};
use runlimit_server::{HeaderFormat, ServiceOptions};
use support::{
    MINUTE, SECOND, call, descriptor, headers, overall, pairs, request, request_of, serve_memory, views,
    with_hits, with_override,
};

const RULES: &str = "
domain: api
descriptors:
  - key: tenant
    rate_limit:
      name: per-tenant
      unit: minute
      requests_per_unit: 10
  - key: user
    rate_limit:
      unit: minute
      requests_per_unit: 2
  - key: trial
    shadow_mode: true
    rate_limit:
      unit: hour
      requests_per_unit: 1
  - key: banned
    rate_limit:
      unit: second
      requests_per_unit: 0
  - key: internal
    rate_limit:
      unlimited: true
";

fn draft_11() -> ServiceOptions {
    ServiceOptions { response_headers: Some(HeaderFormat::Draft11), ..ServiceOptions::default() }
}

fn envoy() -> ServiceOptions {
    ServiceOptions { response_headers: Some(HeaderFormat::EnvoyRatelimit), ..ServiceOptions::default() }
}

fn envoy_headers(limit: &str, remaining: &str, reset: &str) -> Vec<(String, String)> {
    pairs(&[("RateLimit-Limit", limit), ("RateLimit-Remaining", remaining), ("RateLimit-Reset", reset)])
}

// Without the option: no headers.

#[tokio::test]
async fn no_headers_without_the_option() {
    let (server, _clock, mut client) = serve_memory(RULES, ServiceOptions::default()).await;
    let response = call(&mut client, request("api", &[&[("user", "alice")]])).await;
    assert_eq!(headers(&response), []);
    let over =
        call(&mut client, request_of("api", vec![with_hits(descriptor(&[("user", "alice")]), 2)])).await;
    assert_eq!(overall(&over), Code::OverLimit);
    assert_eq!(headers(&over), []);
    server.stop().await;
}

// Draft-11.

#[tokio::test]
async fn draft_11_describes_an_allowed_rule_by_its_path() {
    let (server, _clock, mut client) = serve_memory(RULES, draft_11()).await;
    let response = call(&mut client, request("api", &[&[("user", "alice")]])).await;
    assert_eq!(
        headers(&response),
        pairs(&[("RateLimit-Policy", r#""api.user";q=2;w=60"#), ("RateLimit", r#""api.user";r=1;t=60"#)])
    );
    server.stop().await;
}

#[tokio::test]
async fn draft_11_lists_every_evaluated_rule_in_request_order_named_by_name_else_path() {
    let (server, clock, mut client) = serve_memory(RULES, draft_11()).await;
    let both = || request("api", &[&[("tenant", "acme")], &[("user", "alice")]]);
    let response = call(&mut client, both()).await;
    assert_eq!(
        headers(&response),
        pairs(&[
            ("RateLimit-Policy", r#""per-tenant";q=10;w=60, "api.user";q=2;w=60"#),
            ("RateLimit", r#""per-tenant";r=9;t=60, "api.user";r=1;t=60"#),
        ])
    );
    // t rounds the exact time up to whole seconds: 59.999 s is 60, 49.5 s is 50.
    clock.advance(Duration::from_millis(1));
    let later = call(&mut client, request("api", &[&[("tenant", "acme")]])).await;
    assert_eq!(views(&later), [(Code::Ok, Some((10, MINUTE)), 8, Some(59_999))]);
    assert_eq!(
        headers(&later),
        pairs(&[
            ("RateLimit-Policy", r#""per-tenant";q=10;w=60"#),
            ("RateLimit", r#""per-tenant";r=8;t=60"#)
        ])
    );
    clock.advance(Duration::from_millis(10_499));
    let later = call(&mut client, request("api", &[&[("tenant", "acme")]])).await;
    assert_eq!(views(&later), [(Code::Ok, Some((10, MINUTE)), 7, Some(49_500))]);
    assert_eq!(
        headers(&later),
        pairs(&[
            ("RateLimit-Policy", r#""per-tenant";q=10;w=60"#),
            ("RateLimit", r#""per-tenant";r=7;t=50"#)
        ])
    );
    server.stop().await;
}

#[tokio::test]
async fn draft_11_over_limit_describes_the_exhausted_rule_and_adds_retry_after() {
    let (server, clock, mut client) = serve_memory(RULES, draft_11()).await;
    let both = || request("api", &[&[("tenant", "acme")], &[("user", "alice")]]);
    call(&mut client, both()).await;
    call(&mut client, both()).await;
    clock.advance(Duration::from_millis(10_500));
    let over = call(&mut client, both()).await;
    assert_eq!(overall(&over), Code::OverLimit);
    assert_eq!(
        views(&over),
        [(Code::Ok, None, 0, None), (Code::OverLimit, Some((2, MINUTE)), 0, Some(49_500))]
    );
    // The tenant was not evaluated (nothing charged), so it is not described.
    assert_eq!(
        headers(&over),
        pairs(&[
            ("RateLimit-Policy", r#""api.user";q=2;w=60"#),
            ("RateLimit", r#""api.user";r=0;t=50"#),
            ("Retry-After", "50"),
        ])
    );
    server.stop().await;
}

#[tokio::test]
async fn draft_11_describes_a_rule_matched_twice_once_by_its_exhausted_counter() {
    let (server, _clock, mut client) = serve_memory(RULES, draft_11()).await;
    call(&mut client, request_of("api", vec![with_hits(descriptor(&[("user", "bob")]), 2)])).await;
    let allowed = call(&mut client, request("api", &[&[("user", "alice")], &[("user", "carol")]])).await;
    assert_eq!(
        headers(&allowed),
        pairs(&[("RateLimit-Policy", r#""api.user";q=2;w=60"#), ("RateLimit", r#""api.user";r=1;t=60"#)])
    );
    let over = call(&mut client, request("api", &[&[("user", "alice")], &[("user", "bob")]])).await;
    assert_eq!(overall(&over), Code::OverLimit);
    assert_eq!(
        headers(&over),
        pairs(&[
            ("RateLimit-Policy", r#""api.user";q=2;w=60"#),
            ("RateLimit", r#""api.user";r=0;t=60"#),
            ("Retry-After", "60"),
        ])
    );
    server.stop().await;
}

#[tokio::test]
async fn draft_11_adds_nothing_for_unlimited_and_unmatched_descriptors() {
    let (server, _clock, mut client) = serve_memory(RULES, draft_11()).await;
    let response = call(&mut client, request("api", &[&[("internal", "i")], &[("nothing", "n")]])).await;
    assert_eq!(headers(&response), []);
    let unknown = call(&mut client, request("elsewhere", &[&[("user", "alice")]])).await;
    assert_eq!(headers(&unknown), []);
    server.stop().await;
}

#[tokio::test]
async fn draft_11_cannot_describe_a_limit_no_wait_helps() {
    let (server, _clock, mut client) = serve_memory(RULES, draft_11()).await;
    // A zero limit, and hits above a limit: OVER_LIMIT without any field or Retry-After.
    let banned = call(&mut client, request("api", &[&[("banned", "x")]])).await;
    assert_eq!(overall(&banned), Code::OverLimit);
    assert_eq!(headers(&banned), []);
    let too_many =
        call(&mut client, request_of("api", vec![with_hits(descriptor(&[("user", "alice")]), 3)])).await;
    assert_eq!(overall(&too_many), Code::OverLimit);
    assert_eq!(headers(&too_many), []);
    server.stop().await;
}

#[tokio::test]
async fn draft_11_describes_a_check_only_descriptor_without_a_window() {
    let (server, _clock, mut client) = serve_memory(RULES, draft_11()).await;
    let checked =
        call(&mut client, request_of("api", vec![with_hits(descriptor(&[("user", "alice")]), 0)])).await;
    assert_eq!(
        headers(&checked),
        pairs(&[("RateLimit-Policy", r#""api.user";q=2;w=60"#), ("RateLimit", r#""api.user";r=2;t=0"#)])
    );
    server.stop().await;
}

#[tokio::test]
async fn draft_11_describes_a_shadow_rule_over_its_limit_without_retry_after() {
    let (server, clock, mut client) = serve_memory(RULES, draft_11()).await;
    call(&mut client, request("api", &[&[("trial", "t1")]])).await;
    clock.advance(Duration::from_secs(600));
    let response = call(&mut client, request("api", &[&[("tenant", "acme")], &[("trial", "t1")]])).await;
    assert_eq!(overall(&response), Code::Ok);
    assert_eq!(
        headers(&response),
        pairs(&[
            ("RateLimit-Policy", r#""api.trial";q=1;w=3600, "per-tenant";q=10;w=60"#),
            ("RateLimit", r#""api.trial";r=0;t=3000, "per-tenant";r=9;t=60"#),
        ])
    );
    server.stop().await;
}

#[tokio::test]
async fn draft_11_under_global_shadow_describes_the_exhausted_rule_without_retry_after() {
    let options = ServiceOptions { shadow_mode: true, ..draft_11() };
    let (server, _clock, mut client) = serve_memory(RULES, options).await;
    call(&mut client, request_of("api", vec![with_hits(descriptor(&[("user", "alice")]), 2)])).await;
    let response = call(&mut client, request("api", &[&[("user", "alice")]])).await;
    assert_eq!(overall(&response), Code::Ok);
    assert_eq!(views(&response), [(Code::OverLimit, Some((2, MINUTE)), 0, Some(60_000))]);
    assert_eq!(
        headers(&response),
        pairs(&[("RateLimit-Policy", r#""api.user";q=2;w=60"#), ("RateLimit", r#""api.user";r=0;t=60"#)])
    );
    server.stop().await;
}

#[tokio::test]
async fn draft_11_names_a_limit_override_by_its_domain_keys_and_limit() {
    let (server, _clock, mut client) = serve_memory(RULES, draft_11()).await;
    let overridden =
        with_override(descriptor(&[("path", "/upload"), ("method", "PUT")]), 3, RateLimitUnit::Hour as i32);
    let response = call(&mut client, request_of("api", vec![overridden])).await;
    assert_eq!(
        headers(&response),
        pairs(&[
            ("RateLimit-Policy", r#""api.path.method (override 3/hour)";q=3;w=3600"#),
            ("RateLimit", r#""api.path.method (override 3/hour)";r=2;t=3600"#),
        ])
    );
    server.stop().await;
}

#[tokio::test]
async fn draft_11_describes_two_overrides_of_the_same_keys_with_different_limits_apart() {
    let (server, _clock, mut client) = serve_memory(RULES, draft_11()).await;
    let hourly =
        with_override(descriptor(&[("path", "/upload"), ("method", "PUT")]), 3, RateLimitUnit::Hour as i32);
    let per_minute = with_override(
        descriptor(&[("path", "/upload"), ("method", "POST")]),
        5,
        RateLimitUnit::Minute as i32,
    );
    let response = call(&mut client, request_of("api", vec![hourly, per_minute])).await;
    assert_eq!(overall(&response), Code::Ok);
    assert_eq!(
        headers(&response),
        pairs(&[
            (
                "RateLimit-Policy",
                r#""api.path.method (override 3/hour)";q=3;w=3600, "api.path.method (override 5/minute)";q=5;w=60"#
            ),
            (
                "RateLimit",
                r#""api.path.method (override 3/hour)";r=2;t=3600, "api.path.method (override 5/minute)";r=4;t=60"#
            ),
        ])
    );
    server.stop().await;
}

#[tokio::test]
async fn draft_11_names_an_override_whose_keys_cannot_be_a_name_by_an_identifier_of_its_keys_and_limit() {
    let (server, _clock, mut client) = serve_memory(RULES, draft_11()).await;
    // A tab or an accent cannot be part of a draft-11 name (RFC 9651 §3.3.3): an identifier of
    // the domain and keys stands for them, one per set of keys.
    let hourly = with_override(descriptor(&[("path\tname", "/upload")]), 3, RateLimitUnit::Hour as i32);
    let daily = with_override(descriptor(&[("path\tname", "/upload")]), 7, RateLimitUnit::Day as i32);
    let other_keys = with_override(descriptor(&[("méthode", "PUT")]), 3, RateLimitUnit::Hour as i32);
    let response = call(&mut client, request_of("api", vec![hourly, daily, other_keys])).await;
    assert_eq!(
        headers(&response),
        pairs(&[
            (
                "RateLimit-Policy",
                concat!(
                    r#""rls.7c4ad83568ea05c595ce5ae9 (override 3/hour)";q=3;w=3600, "#,
                    r#""rls.7c4ad83568ea05c595ce5ae9 (override 7/day)";q=7;w=86400, "#,
                    r#""rls.ca09d96c13269db1b9a3040b (override 3/hour)";q=3;w=3600"#,
                )
            ),
            (
                "RateLimit",
                concat!(
                    r#""rls.7c4ad83568ea05c595ce5ae9 (override 3/hour)";r=2;t=3600, "#,
                    r#""rls.7c4ad83568ea05c595ce5ae9 (override 7/day)";r=6;t=86400, "#,
                    r#""rls.ca09d96c13269db1b9a3040b (override 3/hour)";r=2;t=3600"#,
                )
            ),
        ])
    );
    server.stop().await;
}

// envoyproxy/ratelimit's headers.

#[tokio::test]
async fn envoy_headers_describe_the_descriptor_with_the_fewest_remaining() {
    let (server, clock, mut client) = serve_memory(RULES, envoy()).await;
    let response = call(&mut client, request("api", &[&[("tenant", "acme")], &[("user", "alice")]])).await;
    assert_eq!(headers(&response), envoy_headers("2", "1", "60"));
    // Reset rounds the exact time up: 59.999 s is 60.
    clock.advance(Duration::from_millis(1));
    let tenant = call(&mut client, request("api", &[&[("tenant", "acme")]])).await;
    assert_eq!(headers(&tenant), envoy_headers("10", "8", "60"));
    clock.advance(Duration::from_millis(29_999));
    let tenant = call(&mut client, request("api", &[&[("tenant", "acme")]])).await;
    assert_eq!(headers(&tenant), envoy_headers("10", "7", "30"));
    server.stop().await;
}

#[tokio::test]
async fn envoy_headers_pick_the_first_of_equal_remaining() {
    let (server, _clock, mut client) = serve_memory(RULES, envoy()).await;
    let response = call(
        &mut client,
        request_of(
            "api",
            vec![with_hits(descriptor(&[("tenant", "acme")]), 9), descriptor(&[("user", "alice")])],
        ),
    )
    .await;
    assert_eq!(views(&response)[0].2, 1);
    assert_eq!(views(&response)[1].2, 1);
    assert_eq!(headers(&response), envoy_headers("10", "1", "60"));
    server.stop().await;
}

#[tokio::test]
async fn envoy_headers_on_over_limit_describe_the_over_limit_descriptor() {
    let (server, clock, mut client) = serve_memory(RULES, envoy()).await;
    call(&mut client, request_of("api", vec![with_hits(descriptor(&[("user", "alice")]), 2)])).await;
    clock.advance(Duration::from_millis(10_500));
    let over = call(&mut client, request("api", &[&[("user", "alice")], &[("tenant", "acme")]])).await;
    assert_eq!(overall(&over), Code::OverLimit);
    assert_eq!(headers(&over), envoy_headers("2", "0", "50"));
    server.stop().await;
}

#[tokio::test]
async fn envoy_headers_on_over_limit_describe_the_last_over_limit_descriptor() {
    let (server, _clock, mut client) = serve_memory(RULES, envoy()).await;
    let over = call(
        &mut client,
        request_of(
            "api",
            vec![descriptor(&[("banned", "x")]), with_hits(descriptor(&[("user", "alice")]), 3)],
        ),
    )
    .await;
    assert_eq!(overall(&over), Code::OverLimit);
    assert_eq!(
        views(&over),
        [(Code::OverLimit, Some((0, SECOND)), 0, None), (Code::OverLimit, Some((2, MINUTE)), 0, None)]
    );
    assert_eq!(headers(&over), envoy_headers("2", "0", "0"));
    let banned = call(&mut client, request("api", &[&[("user", "alice")], &[("banned", "x")]])).await;
    assert_eq!(headers(&banned), envoy_headers("0", "0", "0"));
    server.stop().await;
}

#[tokio::test]
async fn envoy_headers_choose_a_shadow_rule_over_its_limit_as_the_fewest_remaining() {
    let (server, clock, mut client) = serve_memory(RULES, envoy()).await;
    call(&mut client, request("api", &[&[("trial", "t1")]])).await;
    clock.advance(Duration::from_millis(600_500));
    let response = call(&mut client, request("api", &[&[("tenant", "acme")], &[("trial", "t1")]])).await;
    assert_eq!(overall(&response), Code::Ok);
    assert_eq!(headers(&response), envoy_headers("1", "0", "3000"));
    server.stop().await;
}

#[tokio::test]
async fn envoy_headers_are_absent_without_a_limited_descriptor() {
    let (server, _clock, mut client) = serve_memory(RULES, envoy()).await;
    let response = call(&mut client, request("api", &[&[("internal", "i")], &[("nothing", "n")]])).await;
    assert_eq!(headers(&response), []);
    server.stop().await;
}

#[tokio::test]
async fn envoy_headers_describe_a_check_only_descriptor_without_a_window() {
    let (server, _clock, mut client) = serve_memory(RULES, envoy()).await;
    let checked =
        call(&mut client, request_of("api", vec![with_hits(descriptor(&[("user", "alice")]), 0)])).await;
    assert_eq!(headers(&checked), envoy_headers("2", "2", "0"));
    server.stop().await;
}
