//! Every example of envoyproxy/ratelimit's README "Configuration" section (examples 1 to 9),
//! its YAML exactly as the README gives it (`envoy-ratelimit/readme/`), with the requests the
//! README describes and the exact answers: codes, limits, remaining counts and reset durations.
//!
//! Windows are Runlimit's anchored windows (a key's window starts at its first admission), so
//! on the manual clock a fresh window reports the whole unit until reset, where
//! envoyproxy/ratelimit reports the time to the end of an epoch-aligned window.

use crate::support;

use std::time::Duration;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use runlimit_server::ServiceOptions;
use support::{
    DAY, MINUTE, SECOND, call, descriptor, limit_names, overall, request, request_of, serve_memory, views,
    with_hits, with_request_hits,
};

const NO_LIMIT: support::StatusView = (Code::Ok, None, 0, None);

// Example 1: two top-level rules of one key with different values, 500 per second each.
const EXAMPLE_1: &str = include_str!("../envoy-ratelimit/readme/example1.yaml");

#[tokio::test]
async fn example_1_each_value_has_its_own_500_per_second() {
    let (server, clock, mut client) = serve_memory(EXAMPLE_1, ServiceOptions::default()).await;
    let users = || request("mongo_cps", &[&[("database", "users")]]);
    let default = || request("mongo_cps", &[&[("database", "default")]]);

    let first = call(&mut client, users()).await;
    assert_eq!(overall(&first), Code::Ok);
    assert_eq!(views(&first), [(Code::Ok, Some((500, SECOND)), 499, Some(1_000))]);
    // 499 more in one call: the 500th request of the second is allowed, the 501st is not.
    clock.advance(Duration::from_millis(250));
    let rest = call(&mut client, with_request_hits(users(), 499)).await;
    assert_eq!(views(&rest), [(Code::Ok, Some((500, SECOND)), 0, Some(750))]);
    let over = call(&mut client, users()).await;
    assert_eq!(overall(&over), Code::OverLimit);
    assert_eq!(views(&over), [(Code::OverLimit, Some((500, SECOND)), 0, Some(750))]);

    // `default` is another rule: its own counter, untouched.
    let other = call(&mut client, default()).await;
    assert_eq!(overall(&other), Code::Ok);
    assert_eq!(views(&other), [(Code::Ok, Some((500, SECOND)), 499, Some(1_000))]);

    // Any other database matches no rule: OK, no limit.
    let unmatched = call(&mut client, request("mongo_cps", &[&[("database", "orders")]])).await;
    assert_eq!(overall(&unmatched), Code::Ok);
    assert_eq!(views(&unmatched), [NO_LIMIT]);

    // 749 ms later the window has 1 ms left; at 750 ms a new one starts.
    clock.advance(Duration::from_millis(749));
    let still = call(&mut client, users()).await;
    assert_eq!(views(&still), [(Code::OverLimit, Some((500, SECOND)), 0, Some(1))]);
    clock.advance(Duration::from_millis(1));
    let again = call(&mut client, users()).await;
    assert_eq!(overall(&again), Code::Ok);
    assert_eq!(views(&again), [(Code::Ok, Some((500, SECOND)), 499, Some(1_000))]);
    server.stop().await;
}

// Example 2: a placeholder with a nested key-only rule, and a top-level key-only rule.
const EXAMPLE_2: &str = include_str!("../envoy-ratelimit/readme/example2.yaml");

const DAY_MS: u64 = 86_400_000;

#[tokio::test]
async fn example_2_marketing_messages_five_a_day_per_number_and_one_hundred_messages_a_day() {
    let (server, clock, mut client) = serve_memory(EXAMPLE_2, ServiceOptions::default()).await;
    // The README's request: both descriptors, rate limited against all matching rules.
    let both = |number| {
        request(
            "messaging",
            &[&[("message_type", "marketing"), ("to_number", number)], &[("to_number", number)]],
        )
    };
    for sent in 1..=5 {
        let response = call(&mut client, both("2061111111")).await;
        assert_eq!(overall(&response), Code::Ok);
        assert_eq!(
            views(&response),
            [
                (Code::Ok, Some((5, DAY)), 5 - sent, Some(DAY_MS)),
                (Code::Ok, Some((100, DAY)), 100 - sent, Some(DAY_MS)),
            ]
        );
    }
    // The sixth marketing message is over the marketing limit: the aggregate is OVER_LIMIT,
    // and the per-number counter is not charged.
    clock.advance(Duration::from_secs(3_600));
    let sixth = call(&mut client, both("2061111111")).await;
    assert_eq!(overall(&sixth), Code::OverLimit);
    assert_eq!(views(&sixth), [(Code::OverLimit, Some((5, DAY)), 0, Some(DAY_MS - 3_600_000)), NO_LIMIT]);

    // Non-marketing messages to that number still have 95 of their 100.
    let plain = call(&mut client, request("messaging", &[&[("to_number", "2061111111")]])).await;
    assert_eq!(overall(&plain), Code::Ok);
    assert_eq!(views(&plain), [(Code::Ok, Some((100, DAY)), 94, Some(DAY_MS - 3_600_000))]);

    // The nested key-only rule makes a limit per number: another number has its own 5.
    let other = call(&mut client, both("2062222222")).await;
    assert_eq!(
        views(&other),
        [(Code::Ok, Some((5, DAY)), 4, Some(DAY_MS)), (Code::Ok, Some((100, DAY)), 99, Some(DAY_MS))]
    );

    // The placeholder alone has no limit, nor has another message type.
    let placeholder = call(&mut client, request("messaging", &[&[("message_type", "marketing")]])).await;
    assert_eq!(views(&placeholder), [NO_LIMIT]);
    let transactional = call(
        &mut client,
        request("messaging", &[&[("message_type", "transactional"), ("to_number", "2061111111")]]),
    )
    .await;
    assert_eq!(overall(&transactional), Code::Ok);
    assert_eq!(views(&transactional), [NO_LIMIT]);
    server.stop().await;
}

// Example 3: a per-IP limit and a blacklisted IP (`requests_per_unit: 0`).
const EXAMPLE_3: &str = include_str!("../envoy-ratelimit/readme/example3.yaml");

#[tokio::test]
async fn example_3_ten_per_second_per_ip_and_a_blacklisted_ip() {
    let (server, clock, mut client) = serve_memory(EXAMPLE_3, ServiceOptions::default()).await;
    let ip = |address| request("edge_proxy_per_ip", &[&[("remote_address", address)]]);

    for sent in 1..=10 {
        let response = call(&mut client, ip("50.0.0.1")).await;
        assert_eq!(views(&response), [(Code::Ok, Some((10, SECOND)), 10 - sent, Some(1_000))]);
    }
    clock.advance(Duration::from_millis(100));
    let eleventh = call(&mut client, ip("50.0.0.1")).await;
    assert_eq!(overall(&eleventh), Code::OverLimit);
    assert_eq!(views(&eleventh), [(Code::OverLimit, Some((10, SECOND)), 0, Some(900))]);

    // Each IP has its own counter.
    let other = call(&mut client, ip("50.0.0.2")).await;
    assert_eq!(views(&other), [(Code::Ok, Some((10, SECOND)), 9, Some(1_000))]);

    // The most specific match wins: 50.0.0.5 meets its limit of 0, always over, with no
    // reset (no wait helps).
    for _ in 0..3 {
        let blocked = call(&mut client, ip("50.0.0.5")).await;
        assert_eq!(overall(&blocked), Code::OverLimit);
        assert_eq!(views(&blocked), [(Code::OverLimit, Some((0, SECOND)), 0, None)]);
        clock.advance(Duration::from_secs(5));
    }

    // In one request with another IP, the blacklisted one charges nothing to the other.
    let mixed =
        request("edge_proxy_per_ip", &[&[("remote_address", "50.0.0.3")], &[("remote_address", "50.0.0.5")]]);
    let denied = call(&mut client, mixed).await;
    assert_eq!(overall(&denied), Code::OverLimit);
    assert_eq!(views(&denied), [NO_LIMIT, (Code::OverLimit, Some((0, SECOND)), 0, None)]);
    let fresh = call(&mut client, ip("50.0.0.3")).await;
    assert_eq!(views(&fresh), [(Code::Ok, Some((10, SECOND)), 9, Some(1_000))]);
    server.stop().await;
}

// Example 4: a request deeper than the rule matches nothing; the nested rule matches.
const EXAMPLE_4_NO_MATCH: &str = include_str!("../envoy-ratelimit/readme/example4.yaml");

const EXAMPLE_4_MATCH: &str = include_str!("../envoy-ratelimit/readme/example4-nested.yaml");

#[tokio::test]
async fn example_4_a_request_deeper_than_the_rule_matches_nothing() {
    let (server, _clock, mut client) = serve_memory(EXAMPLE_4_NO_MATCH, ServiceOptions::default()).await;
    let deep = || request("example4", &[&[("key", "value"), ("subkey", "subvalue")]]);
    let response = call(&mut client, deep()).await;
    assert_eq!(overall(&response), Code::Ok);
    assert_eq!(views(&response), [NO_LIMIT]);
    // Nothing was charged: the one-entry descriptor the rule does match has its 300.
    let shallow = call(&mut client, request("example4", &[&[("key", "value")]])).await;
    assert_eq!(views(&shallow), [(Code::Ok, Some((300, SECOND)), 299, Some(1_000))]);
    server.stop().await;
}

#[tokio::test]
async fn example_4_the_nested_rule_matches_the_two_entry_request() {
    let (server, _clock, mut client) = serve_memory(EXAMPLE_4_MATCH, ServiceOptions::default()).await;
    let deep = || request("example4", &[&[("key", "value"), ("subkey", "subvalue")]]);
    let first = call(&mut client, deep()).await;
    assert_eq!(views(&first), [(Code::Ok, Some((300, SECOND)), 299, Some(1_000))]);
    let second = call(&mut client, deep()).await;
    assert_eq!(views(&second), [(Code::Ok, Some((300, SECOND)), 298, Some(1_000))]);
    // The placeholder alone has no limit.
    let shallow = call(&mut client, request("example4", &[&[("key", "value")]])).await;
    assert_eq!(views(&shallow), [NO_LIMIT]);
    server.stop().await;
}

// Example 5: an unlimited key beside a limited one.
const EXAMPLE_5: &str = include_str!("../envoy-ratelimit/readme/example5.yaml");

#[tokio::test]
async fn example_5_unlimited_answers_ok_with_max_uint32_remaining() {
    let (server, _clock, mut client) = serve_memory(EXAMPLE_5, ServiceOptions::default()).await;
    let unlimited = (Code::Ok, None, u32::MAX, None);
    for _ in 0..3 {
        let response =
            call(&mut client, with_request_hits(request("internal", &[&[("ldap", "server-1")]]), 1_000))
                .await;
        assert_eq!(overall(&response), Code::Ok);
        assert_eq!(views(&response), [unlimited]);
    }
    let both =
        call(&mut client, request("internal", &[&[("ldap", "server-1")], &[("azure", "tenant-1")]])).await;
    assert_eq!(overall(&both), Code::Ok);
    assert_eq!(views(&both), [unlimited, (Code::Ok, Some((100, MINUTE)), 99, Some(60_000))]);
    // Even a request over the azure limit leaves the unlimited descriptor's status alone.
    let over = call(
        &mut client,
        request_of(
            "internal",
            vec![descriptor(&[("ldap", "server-1")]), with_hits(descriptor(&[("azure", "tenant-1")]), 100)],
        ),
    )
    .await;
    assert_eq!(overall(&over), Code::OverLimit);
    assert_eq!(views(&over), [unlimited, (Code::OverLimit, Some((100, MINUTE)), 0, Some(60_000))]);
    server.stop().await;
}

// Example 6: a shadow-mode rule beside an enforced one.
const EXAMPLE_6: &str = include_str!("../envoy-ratelimit/readme/example6.yaml");

#[tokio::test]
async fn example_6_user_a_is_never_limited_user_b_is_limited_to_twenty_per_second() {
    let (server, clock, mut client) = serve_memory(EXAMPLE_6, ServiceOptions::default()).await;
    let user = |name| request("example6", &[&[("service", "auth-service"), ("user", name)]]);

    for sent in 1..=10 {
        let response = call(&mut client, user("user-a")).await;
        assert_eq!(views(&response), [(Code::Ok, Some((10, SECOND)), 10 - sent, Some(1_000))]);
    }
    clock.advance(Duration::from_millis(400));
    // Over its limit of 10, user-a is still OK: the status carries the limit, 0 remaining and
    // the time until the quota comes back.
    for _ in 0..5 {
        let response = call(&mut client, user("user-a")).await;
        assert_eq!(overall(&response), Code::Ok);
        assert_eq!(views(&response), [(Code::Ok, Some((10, SECOND)), 0, Some(600))]);
    }

    for sent in 1..=20 {
        let response = call(&mut client, user("user-b")).await;
        assert_eq!(views(&response), [(Code::Ok, Some((20, SECOND)), 20 - sent, Some(1_000))]);
    }
    let over = call(&mut client, user("user-b")).await;
    assert_eq!(overall(&over), Code::OverLimit);
    assert_eq!(views(&over), [(Code::OverLimit, Some((20, SECOND)), 0, Some(1_000))]);

    // Another service is another counter of the same rules (the key-only `service`).
    let other =
        call(&mut client, request("example6", &[&[("service", "billing"), ("user", "user-b")]])).await;
    assert_eq!(views(&other), [(Code::Ok, Some((20, SECOND)), 19, Some(1_000))]);
    // A user without a rule matches nothing.
    let unlisted = call(&mut client, user("user-c")).await;
    assert_eq!(views(&unlisted), [NO_LIMIT]);
    server.stop().await;
}

// Example 7: `replaces`.
const EXAMPLE_7: &str = include_str!("../envoy-ratelimit/readme/example7.yaml");

#[tokio::test]
async fn example_7_the_replacing_rule_alone_applies_when_both_match() {
    let (server, _clock, mut client) = serve_memory(EXAMPLE_7, ServiceOptions::default()).await;
    let specific = [("key_1", "value_1"), ("user", "bkthomps")];
    let replacing = [("key_2", "value_2"), ("user", "bkthomps")];

    // Each alone: 5 per second, and 10 per second.
    let alone = call(&mut client, request("example7", &[&specific])).await;
    assert_eq!(views(&alone), [(Code::Ok, Some((5, SECOND)), 4, Some(1_000))]);
    assert_eq!(limit_names(&alone), [Some("specific_limit".to_owned())]);
    let alone = call(&mut client, request("example7", &[&replacing])).await;
    assert_eq!(views(&alone), [(Code::Ok, Some((10, SECOND)), 9, Some(1_000))]);
    assert_eq!(limit_names(&alone), [Some(String::new())]);

    // Both in one request: only the 10 per second rule applies, for nine more requests.
    for sent in 2..=10 {
        let both = call(&mut client, request("example7", &[&specific, &replacing])).await;
        assert_eq!(overall(&both), Code::Ok);
        assert_eq!(views(&both), [NO_LIMIT, (Code::Ok, Some((10, SECOND)), 10 - sent, Some(1_000))]);
    }
    let over = call(&mut client, request("example7", &[&specific, &replacing])).await;
    assert_eq!(overall(&over), Code::OverLimit);
    assert_eq!(views(&over), [NO_LIMIT, (Code::OverLimit, Some((10, SECOND)), 0, Some(1_000))]);

    // The replaced rule's counter was never touched: 4 of its 5 left, as after its first use.
    let specific_again = call(&mut client, request("example7", &[&specific])).await;
    assert_eq!(views(&specific_again), [(Code::Ok, Some((5, SECOND)), 3, Some(1_000))]);
    server.stop().await;
}

// Example 8: `detailed_metric` (accepted; it only shapes envoyproxy/ratelimit's stats keys).
// The README's prose says `key_1` and "/ sec"; its YAML, used here, says `key1` and minute.
const EXAMPLE_8: &str = include_str!("../envoy-ratelimit/readme/example8.yaml");

#[tokio::test]
async fn example_8_each_unspecified_value_has_its_own_ten_and_value1_has_twenty() {
    let (server, _clock, mut client) = serve_memory(EXAMPLE_8, ServiceOptions::default()).await;
    let key1 = |value| request("example8", &[&[("key1", value)]]);

    let exhaust = call(&mut client, with_request_hits(key1("unspecified_value"), 10)).await;
    assert_eq!(views(&exhaust), [(Code::Ok, Some((10, MINUTE)), 0, Some(60_000))]);
    let over = call(&mut client, key1("unspecified_value")).await;
    assert_eq!(views(&over), [(Code::OverLimit, Some((10, MINUTE)), 0, Some(60_000))]);

    let second_value = call(&mut client, key1("unspecified_value2")).await;
    assert_eq!(views(&second_value), [(Code::Ok, Some((10, MINUTE)), 9, Some(60_000))]);
    let value1 = call(&mut client, key1("value1")).await;
    assert_eq!(views(&value1), [(Code::Ok, Some((20, MINUTE)), 19, Some(60_000))]);
    server.stop().await;
}

// Example 9: wildcards, trailing, in the middle and several.
const EXAMPLE_9_TRAILING: &str = include_str!("../envoy-ratelimit/readme/example9.yaml");

const EXAMPLE_9_MIDDLE: &str = include_str!("../envoy-ratelimit/readme/example9-middle.yaml");

const EXAMPLE_9_SEVERAL: &str = include_str!("../envoy-ratelimit/readme/example9-several.yaml");

/// Asserts that each of `matching` is limited with a counter of its own, and each of
/// `others` matches nothing.
async fn assert_wildcard(yaml: &str, key: &str, matching: &[&str], others: &[&str]) {
    let (server, _clock, mut client) = serve_memory(yaml, ServiceOptions::default()).await;
    let limited = |remaining| (Code::Ok, Some((20, MINUTE)), remaining, Some(60_000));
    for (index, value) in matching.iter().enumerate() {
        // The first value takes 5 units, the others 1: distinct counters show it.
        let hits = if index == 0 { 5 } else { 1 };
        let response =
            call(&mut client, with_request_hits(request("example9", &[&[(key, value)]]), hits)).await;
        assert_eq!(views(&response), [limited(20 - hits)], "{value}");
    }
    let again = call(&mut client, request("example9", &[&[(key, matching[0])]])).await;
    assert_eq!(views(&again), [limited(14)], "{}", matching[0]);
    for value in others {
        let response = call(&mut client, request("example9", &[&[(key, value)]])).await;
        assert_eq!(overall(&response), Code::Ok);
        assert_eq!(views(&response), [NO_LIMIT], "{value}");
    }
    server.stop().await;
}

#[tokio::test]
async fn example_9_a_trailing_wildcard_matches_value1_value2_and_value_xyz() {
    assert_wildcard(
        EXAMPLE_9_TRAILING,
        "key1",
        &["value1", "value2", "valueXYZ", "value"],
        &["valu", "xvalue1"],
    )
    .await;
}

#[tokio::test]
async fn example_9_a_middle_wildcard_matches_any_segment_but_not_another_suffix() {
    assert_wildcard(
        EXAMPLE_9_MIDDLE,
        "path",
        &["/api/123/action", "/api/user-id/action", "/api//action"],
        &["/api/123/other", "/api/123/action/more"],
    )
    .await;
}

#[tokio::test]
async fn example_9_several_wildcards_match_in_order() {
    assert_wildcard(
        EXAMPLE_9_SEVERAL,
        "route",
        &["/api/v1/resource/123/action", "/api/v2/resource/456/action"],
        &["/api/v1/resource/123/other", "/api/v1/other/123/action"],
    )
    .await;
}
