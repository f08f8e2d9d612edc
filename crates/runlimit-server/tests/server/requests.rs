//! What a request asks for, over gRPC: malformed requests (refused with `INVALID_ARGUMENT`
//! naming the field, charging nothing), `hits_addend`, descriptors reaching one counter, limit
//! overrides and unknown domains.

use crate::support;

use std::time::Duration;

use envoy_types::pb::envoy::{
    extensions::common::ratelimit::v3::RateLimitDescriptor,
    service::ratelimit::v3::{
        RateLimitRequest,
        rate_limit_response::{Code, rate_limit::Unit},
    },
    r#type::v3::RateLimitUnit,
};
use runlimit_server::{
    MAX_DESCRIPTORS, MAX_DOMAIN_LEN, MAX_ENTRIES, MAX_KEY_LEN, MAX_VALUE_LEN, ServiceOptions,
};
use support::{
    DAY, HOUR, MINUTE, SECOND, StatusView, call, call_error, descriptor, limit_names, overall, request,
    request_of, serve_memory, views, with_hits, with_override, with_request_hits,
};

const RULES: &str = "
domain: api
descriptors:
  - key: user
    rate_limit:
      unit: minute
      requests_per_unit: 5
  - key: tenant
    rate_limit:
      unit: minute
      requests_per_unit: 10
  - key: blocked
    rate_limit:
      unit: minute
      requests_per_unit: 0
";

const NO_LIMIT: StatusView = (Code::Ok, None, 0, None);

fn user(remaining: u32, reset_ms: u64) -> StatusView {
    (Code::Ok, Some((5, MINUTE)), remaining, Some(reset_ms))
}

fn alice() -> RateLimitDescriptor {
    descriptor(&[("user", "alice")])
}

// Malformed requests. Each carries a valid descriptor for alice first, so a request charged
// before (or despite) the refusal would show: alice's next request must see the full quota.

/// Sends `malformed`, expects `INVALID_ARGUMENT` with exactly `message`, then proves nothing
/// was charged: alice's first valid request leaves 4 of 5.
async fn assert_refused(malformed: RateLimitRequest, message: &str) {
    let (server, _clock, mut client) = serve_memory(RULES, ServiceOptions::default()).await;
    assert_eq!(call_error(&mut client, malformed).await, (tonic::Code::InvalidArgument, message.to_owned()));
    let next = call(&mut client, request_of("api", vec![alice()])).await;
    assert_eq!(views(&next), [user(4, 60_000)]);
    server.stop().await;
}

/// A request of `api` with alice's descriptor, then `second`.
fn alice_and(second: RateLimitDescriptor) -> RateLimitRequest {
    request_of("api", vec![alice(), second])
}

#[tokio::test]
async fn an_empty_domain_is_refused() {
    assert_refused(request_of("", vec![alice()]), "domain: empty; every request names its rate limit domain")
        .await;
}

#[tokio::test]
async fn a_domain_above_256_bytes_is_refused() {
    assert_eq!(MAX_DOMAIN_LEN, 256);
    assert_refused(
        request_of(&"d".repeat(257), vec![alice()]),
        "domain: 257 bytes long, above the maximum of 256",
    )
    .await;
}

#[tokio::test]
async fn a_domain_is_measured_in_bytes_not_characters() {
    // 129 two-byte characters: 258 bytes.
    assert_refused(
        request_of(&"é".repeat(129), vec![alice()]),
        "domain: 258 bytes long, above the maximum of 256",
    )
    .await;
}

#[tokio::test]
async fn a_domain_of_256_bytes_is_accepted() {
    let (server, _clock, mut client) = serve_memory(RULES, ServiceOptions::default()).await;
    let response = call(&mut client, request_of(&"d".repeat(256), vec![alice()])).await;
    assert_eq!(overall(&response), Code::Ok);
    assert_eq!(views(&response), [NO_LIMIT]);
    server.stop().await;
}

#[tokio::test]
async fn a_request_without_descriptors_is_refused() {
    assert_refused(
        request_of("api", Vec::new()),
        "descriptors: empty; a request carries at least one descriptor",
    )
    .await;
}

fn users(count: usize) -> Vec<RateLimitDescriptor> {
    (0..count).map(|index| descriptor(&[("user", &format!("user-{index}"))])).collect()
}

#[tokio::test]
async fn more_than_64_descriptors_are_refused() {
    assert_eq!(MAX_DESCRIPTORS, 64);
    let mut descriptors = vec![alice()];
    descriptors.extend(users(64));
    assert_refused(request_of("api", descriptors), "descriptors: 65 descriptors, above the maximum of 64")
        .await;
}

#[tokio::test]
async fn sixty_four_descriptors_are_one_atomic_batch() {
    let (server, _clock, mut client) = serve_memory(RULES, ServiceOptions::default()).await;
    let response = call(&mut client, request_of("api", users(64))).await;
    assert_eq!(overall(&response), Code::Ok);
    assert_eq!(views(&response), vec![user(4, 60_000); 64]);
    // One more user over its limit among 64: nobody is charged.
    let mut descriptors = users(63);
    descriptors.push(with_hits(descriptor(&[("user", "user-63")]), 5));
    let denied = call(&mut client, request_of("api", descriptors)).await;
    assert_eq!(overall(&denied), Code::OverLimit);
    let mut expected = vec![NO_LIMIT; 63];
    expected.push((Code::OverLimit, Some((5, MINUTE)), 0, Some(60_000)));
    assert_eq!(views(&denied), expected);
    let again = call(&mut client, request_of("api", users(64))).await;
    assert_eq!(views(&again), vec![user(3, 60_000); 64]);
    server.stop().await;
}

#[tokio::test]
async fn a_descriptor_without_entries_is_refused() {
    assert_refused(
        alice_and(RateLimitDescriptor::default()),
        "descriptors[1].entries: empty; a descriptor has at least one entry",
    )
    .await;
}

fn entries(count: usize) -> RateLimitDescriptor {
    let keys: Vec<String> = (0..count).map(|index| format!("key{index}")).collect();
    let pairs: Vec<(&str, &str)> = keys.iter().map(|key| (key.as_str(), "v")).collect();
    descriptor(&pairs)
}

#[tokio::test]
async fn more_than_32_entries_are_refused() {
    assert_eq!(MAX_ENTRIES, 32);
    assert_refused(alice_and(entries(33)), "descriptors[1].entries: 33 entries, above the maximum of 32")
        .await;
}

#[tokio::test]
async fn thirty_two_entries_are_accepted() {
    let (server, _clock, mut client) = serve_memory(RULES, ServiceOptions::default()).await;
    let response = call(&mut client, alice_and(entries(32))).await;
    assert_eq!(views(&response), [user(4, 60_000), NO_LIMIT]);
    server.stop().await;
}

#[tokio::test]
async fn an_empty_entry_key_is_refused() {
    assert_refused(alice_and(descriptor(&[("", "x")])), "descriptors[1].entries[0].key: empty").await;
}

#[tokio::test]
async fn an_empty_entry_value_is_refused() {
    assert_refused(
        alice_and(descriptor(&[("tenant", "acme"), ("user", "")])),
        "descriptors[1].entries[1].value: empty",
    )
    .await;
}

#[tokio::test]
async fn a_key_above_256_bytes_is_refused() {
    assert_eq!(MAX_KEY_LEN, 256);
    assert_refused(
        alice_and(descriptor(&[(&"k".repeat(257), "x")])),
        "descriptors[1].entries[0].key: 257 bytes long, above the maximum of 256",
    )
    .await;
}

#[tokio::test]
async fn a_value_above_65536_bytes_is_refused() {
    assert_eq!(MAX_VALUE_LEN, 65_536);
    assert_refused(
        alice_and(descriptor(&[("user", &"v".repeat(65_537))])),
        "descriptors[1].entries[0].value: 65537 bytes long, above the maximum of 65536",
    )
    .await;
}

#[tokio::test]
async fn a_key_of_256_bytes_and_a_value_of_65536_bytes_are_accepted() {
    let (server, _clock, mut client) = serve_memory(RULES, ServiceOptions::default()).await;
    let long_key = "k".repeat(256);
    let long_value = "v".repeat(65_536);
    let response = call(
        &mut client,
        request_of("api", vec![descriptor(&[(&long_key, "x")]), descriptor(&[("user", &long_value)])]),
    )
    .await;
    assert_eq!(views(&response), [NO_LIMIT, user(4, 60_000)]);
    server.stop().await;
}

#[tokio::test]
async fn negative_hits_are_refused() {
    let mut refund = descriptor(&[("user", "alice")]);
    refund.is_negative_hits = true;
    assert_refused(
        alice_and(refund),
        "descriptors[1].is_negative_hits: refunds are not supported; Runlimit never gives consumed quota back",
    )
    .await;
}

#[tokio::test]
async fn an_override_of_unknown_unit_is_refused() {
    assert_refused(
        alice_and(with_override(descriptor(&[("user", "bob")]), 10, RateLimitUnit::Unknown as i32)),
        "descriptors[1].limit.unit: UNKNOWN; expected SECOND, MINUTE, HOUR, DAY, WEEK, MONTH or YEAR",
    )
    .await;
}

#[tokio::test]
async fn an_override_unit_outside_the_enum_is_refused_by_number() {
    // 7 is WEEK in newer Envoy APIs (accepted); 8 is no unit.
    assert_refused(
        alice_and(with_override(descriptor(&[("user", "bob")]), 10, 8)),
        "descriptors[1].limit.unit: 8; expected SECOND, MINUTE, HOUR, DAY, WEEK, MONTH or YEAR",
    )
    .await;
}

#[tokio::test]
async fn a_malformed_request_of_an_unknown_domain_is_refused_too() {
    let (server, _clock, mut client) = serve_memory(RULES, ServiceOptions::default()).await;
    let malformed = request_of("nowhere", vec![descriptor(&[("user", "")])]);
    assert_eq!(
        call_error(&mut client, malformed).await,
        (tonic::Code::InvalidArgument, "descriptors[0].entries[0].value: empty".to_owned())
    );
    server.stop().await;
}

// Messages that are not a valid RateLimitRequest, sent as raw bytes (no generated client sends
// them): `INVALID_ARGUMENT`, not the `INTERNAL` of tonic's prost codec.

/// A length-delimited protobuf field: `number`'s key (wire type 2), the length (one byte: every
/// field here is shorter than 128 bytes) and `bytes`.
fn length_delimited(number: u8, bytes: &[u8]) -> Vec<u8> {
    let mut field = vec![number << 3 | 2, u8::try_from(bytes.len()).unwrap()];
    field.extend_from_slice(bytes);
    field
}

/// A `RateLimitRequest` of domain `api` with alice's descriptor, then one entry of raw `key` and
/// `value` bytes, hand-encoded.
fn alice_and_raw_entry(key: &[u8], value: &[u8]) -> Vec<u8> {
    let entry = |key: &[u8], value: &[u8]| [length_delimited(1, key), length_delimited(2, value)].concat();
    let descriptor = |key: &[u8], value: &[u8]| length_delimited(1, &entry(key, value));
    [
        length_delimited(1, b"api"),
        length_delimited(2, &descriptor(b"user", b"alice")),
        length_delimited(2, &descriptor(key, value)),
    ]
    .concat()
}

/// Sends `message` over a raw HTTP/2 connection, expects `INVALID_ARGUMENT` (3) with exactly
/// `expected`, then proves nothing was charged: alice's first valid request leaves 4 of 5.
async fn assert_undecodable(message: &[u8], expected: &str) {
    let (server, _clock, mut client) = serve_memory(RULES, ServiceOptions::default()).await;
    let mut sender = support::h2_connection(server.grpc).await;
    let (status, text) = support::grpc_status(support::raw_call(&mut sender, message)).await;
    assert_eq!((status.as_str(), text.as_str()), ("3", expected));
    let next = call(&mut client, request_of("api", vec![alice()])).await;
    assert_eq!(views(&next), [user(4, 60_000)]);
    server.stop().await;
}

/// The hand-encoding is right: with valid bytes the same message is served, and charges alice.
#[tokio::test]
async fn a_hand_encoded_request_is_served() {
    let (server, _clock, mut client) = serve_memory(RULES, ServiceOptions::default()).await;
    let mut sender = support::h2_connection(server.grpc).await;
    let message = alice_and_raw_entry(b"user", b"bob");
    assert_eq!(support::grpc_status(support::raw_call(&mut sender, &message)).await, ("0".into(), "".into()));
    let next = call(&mut client, request_of("api", vec![alice()])).await;
    assert_eq!(views(&next), [user(3, 60_000)]);
    server.stop().await;
}

/// Regression: answered `INTERNAL` (13), which says the server failed.
#[tokio::test]
async fn an_entry_value_of_invalid_utf8_is_refused() {
    assert_undecodable(
        &alice_and_raw_entry(b"user", b"b\xffob"),
        "the request could not be decoded: failed to decode Protobuf message: Entry.value: \
         RateLimitDescriptor.entries: RateLimitRequest.descriptors: invalid string value: data is not UTF-8 \
         encoded",
    )
    .await;
}

/// Regression: answered `INTERNAL` (13).
#[tokio::test]
async fn an_entry_key_of_invalid_utf8_is_refused() {
    assert_undecodable(
        &alice_and_raw_entry(b"us\xc3er", b"bob"),
        "the request could not be decoded: failed to decode Protobuf message: Entry.key: \
         RateLimitDescriptor.entries: RateLimitRequest.descriptors: invalid string value: data is not UTF-8 \
         encoded",
    )
    .await;
}

/// Regression: answered `INTERNAL` (13).
#[tokio::test]
async fn a_truncated_message_is_refused() {
    let message = alice_and_raw_entry(b"user", b"bob");
    assert_undecodable(
        &message[..message.len() - 1],
        "the request could not be decoded: failed to decode Protobuf message: RateLimitRequest.descriptors: \
         buffer underflow",
    )
    .await;
}

// hits_addend.

#[tokio::test]
async fn a_request_hits_addend_of_zero_counts_one() {
    let (server, _clock, mut client) = serve_memory(RULES, ServiceOptions::default()).await;
    let response = call(&mut client, with_request_hits(request_of("api", vec![alice()]), 0)).await;
    assert_eq!(views(&response), [user(4, 60_000)]);
    server.stop().await;
}

#[tokio::test]
async fn a_request_hits_addend_charges_every_descriptor() {
    let (server, _clock, mut client) = serve_memory(RULES, ServiceOptions::default()).await;
    let both = with_request_hits(request("api", &[&[("user", "alice")], &[("tenant", "acme")]]), 3);
    let response = call(&mut client, both).await;
    assert_eq!(views(&response), [user(2, 60_000), (Code::Ok, Some((10, MINUTE)), 7, Some(60_000))]);
    server.stop().await;
}

#[tokio::test]
async fn a_descriptor_hits_addend_overrides_the_request_one() {
    let (server, _clock, mut client) = serve_memory(RULES, ServiceOptions::default()).await;
    let mixed = with_request_hits(
        request_of("api", vec![with_hits(alice(), 1), descriptor(&[("tenant", "acme")])]),
        4,
    );
    let response = call(&mut client, mixed).await;
    assert_eq!(views(&response), [user(4, 60_000), (Code::Ok, Some((10, MINUTE)), 6, Some(60_000))]);
    server.stop().await;
}

#[tokio::test]
async fn a_descriptor_hits_addend_of_zero_checks_without_charging() {
    let (server, clock, mut client) = serve_memory(RULES, ServiceOptions::default()).await;
    let check = || with_request_hits(request_of("api", vec![with_hits(alice(), 0)]), 3);
    // No window yet: the full quota, nothing to wait for (0 ms until reset).
    let fresh = call(&mut client, check()).await;
    assert_eq!(overall(&fresh), Code::Ok);
    assert_eq!(views(&fresh), [user(5, 0)]);
    // Still no window: the first charge anchors one of a whole minute.
    clock.advance(Duration::from_secs(7));
    let charged = call(&mut client, request_of("api", vec![alice()])).await;
    assert_eq!(views(&charged), [user(4, 60_000)]);
    clock.advance(Duration::from_secs(10));
    let checked = call(&mut client, check()).await;
    assert_eq!(views(&checked), [user(4, 50_000)]);
    let next = call(&mut client, request_of("api", vec![alice()])).await;
    assert_eq!(views(&next), [user(3, 50_000)]);
    server.stop().await;
}

#[tokio::test]
async fn a_check_only_descriptor_over_its_limit_denies_the_request() {
    let (server, clock, mut client) = serve_memory(RULES, ServiceOptions::default()).await;
    let exhaust = call(&mut client, request_of("api", vec![with_hits(alice(), 5)])).await;
    assert_eq!(views(&exhaust), [user(0, 60_000)]);
    clock.advance(Duration::from_millis(12_345));
    let request = || request_of("api", vec![descriptor(&[("tenant", "acme")]), with_hits(alice(), 0)]);
    let denied = call(&mut client, request()).await;
    assert_eq!(overall(&denied), Code::OverLimit);
    assert_eq!(views(&denied), [NO_LIMIT, (Code::OverLimit, Some((5, MINUTE)), 0, Some(47_655))]);
    // The tenant was not charged; once alice's window ends the request passes.
    clock.advance(Duration::from_millis(47_655));
    let allowed = call(&mut client, request()).await;
    assert_eq!(overall(&allowed), Code::Ok);
    assert_eq!(views(&allowed), [(Code::Ok, Some((10, MINUTE)), 9, Some(60_000)), user(5, 0)]);
    server.stop().await;
}

#[tokio::test]
async fn hits_above_the_limit_are_over_limit_without_a_reset_and_store_nothing() {
    let (server, clock, mut client) = serve_memory(RULES, ServiceOptions::default()).await;
    let too_many = call(&mut client, request_of("api", vec![with_hits(alice(), 6)])).await;
    assert_eq!(overall(&too_many), Code::OverLimit);
    assert_eq!(views(&too_many), [(Code::OverLimit, Some((5, MINUTE)), 0, None)]);
    let request_level =
        call(&mut client, with_request_hits(request("api", &[&[("tenant", "acme")]]), 11)).await;
    assert_eq!(views(&request_level), [(Code::OverLimit, Some((10, MINUTE)), 0, None)]);
    let huge = call(&mut client, request_of("api", vec![with_hits(alice(), u64::MAX)])).await;
    assert_eq!(views(&huge), [(Code::OverLimit, Some((5, MINUTE)), 0, None)]);
    // Nothing was stored: 30 s later, the first charge opens a whole new minute.
    clock.advance(Duration::from_secs(30));
    let next = call(&mut client, request("api", &[&[("user", "alice")], &[("tenant", "acme")]])).await;
    assert_eq!(views(&next), [user(4, 60_000), (Code::Ok, Some((10, MINUTE)), 9, Some(60_000))]);
    server.stop().await;
}

#[tokio::test]
async fn hits_up_to_the_limit_fit_and_hits_above_what_is_left_charge_nothing() {
    let (server, clock, mut client) = serve_memory(RULES, ServiceOptions::default()).await;
    let three = call(&mut client, request_of("api", vec![with_hits(alice(), 3)])).await;
    assert_eq!(views(&three), [user(2, 60_000)]);
    clock.advance(Duration::from_secs(1));
    let over = call(&mut client, request_of("api", vec![with_hits(alice(), 3)])).await;
    assert_eq!(views(&over), [(Code::OverLimit, Some((5, MINUTE)), 0, Some(59_000))]);
    let rest = call(&mut client, request_of("api", vec![with_hits(alice(), 2)])).await;
    assert_eq!(views(&rest), [user(0, 59_000)]);
    server.stop().await;
}

#[tokio::test]
async fn a_zero_limit_rule_denies_the_request_and_charges_nothing() {
    let (server, _clock, mut client) = serve_memory(RULES, ServiceOptions::default()).await;
    let denied = call(&mut client, request("api", &[&[("user", "alice")], &[("blocked", "x")]])).await;
    assert_eq!(overall(&denied), Code::OverLimit);
    assert_eq!(views(&denied), [NO_LIMIT, (Code::OverLimit, Some((0, MINUTE)), 0, None)]);
    // Even a check-only descriptor of a zero limit is over.
    let checked =
        call(&mut client, request_of("api", vec![with_hits(descriptor(&[("blocked", "x")]), 0)])).await;
    assert_eq!(views(&checked), [(Code::OverLimit, Some((0, MINUTE)), 0, None)]);
    let next = call(&mut client, request_of("api", vec![alice()])).await;
    assert_eq!(views(&next), [user(4, 60_000)]);
    server.stop().await;
}

// Descriptors reaching one counter.

#[tokio::test]
async fn two_descriptors_of_one_counter_are_one_check_costing_the_sum() {
    let (server, _clock, mut client) = serve_memory(RULES, ServiceOptions::default()).await;
    let twice = call(&mut client, request_of("api", vec![alice(), alice()])).await;
    assert_eq!(views(&twice), [user(3, 60_000), user(3, 60_000)]);
    let weighted =
        call(&mut client, request_of("api", vec![with_hits(alice(), 1), with_hits(alice(), 2)])).await;
    assert_eq!(views(&weighted), [user(0, 60_000), user(0, 60_000)]);
    let over = call(&mut client, request_of("api", vec![alice(), alice()])).await;
    assert_eq!(overall(&over), Code::OverLimit);
    let denied = (Code::OverLimit, Some((5, MINUTE)), 0, Some(60_000));
    assert_eq!(views(&over), [denied, denied]);
    server.stop().await;
}

#[tokio::test]
async fn two_descriptors_of_one_counter_whose_sum_exceeds_the_limit_charge_nothing() {
    let (server, _clock, mut client) = serve_memory(RULES, ServiceOptions::default()).await;
    // 3 + 3 > 5: neither is charged, though each alone would fit.
    let over = call(&mut client, request_of("api", vec![with_hits(alice(), 3), with_hits(alice(), 3)])).await;
    assert_eq!(overall(&over), Code::OverLimit);
    let never = (Code::OverLimit, Some((5, MINUTE)), 0, None);
    assert_eq!(views(&over), [never, never]);
    let next = call(&mut client, request_of("api", vec![alice()])).await;
    assert_eq!(views(&next), [user(4, 60_000)]);
    server.stop().await;
}

#[tokio::test]
async fn descriptors_of_different_values_are_different_counters() {
    let (server, _clock, mut client) = serve_memory(RULES, ServiceOptions::default()).await;
    let response = call(
        &mut client,
        request_of("api", vec![with_hits(alice(), 2), with_hits(descriptor(&[("user", "bob")]), 5)]),
    )
    .await;
    assert_eq!(views(&response), [user(3, 60_000), user(0, 60_000)]);
    server.stop().await;
}

#[tokio::test]
async fn a_check_only_descriptor_sees_the_counter_before_the_request_charges_it() {
    let (server, _clock, mut client) = serve_memory(RULES, ServiceOptions::default()).await;
    call(&mut client, request_of("api", vec![alice()])).await;
    let response =
        call(&mut client, request_of("api", vec![with_hits(alice(), 0), with_hits(alice(), 2)])).await;
    assert_eq!(views(&response), [user(4, 60_000), user(2, 60_000)]);
    server.stop().await;
}

// Limit overrides.

#[tokio::test]
async fn an_override_limits_a_descriptor_no_rule_matches() {
    let (server, clock, mut client) = serve_memory(RULES, ServiceOptions::default()).await;
    let overridden = || {
        request_of(
            "api",
            vec![with_override(descriptor(&[("path", "/upload")]), 2, RateLimitUnit::Minute as i32)],
        )
    };
    let first = call(&mut client, overridden()).await;
    assert_eq!(views(&first), [(Code::Ok, Some((2, MINUTE)), 1, Some(60_000))]);
    assert_eq!(limit_names(&first), [Some(String::new())]);
    clock.advance(Duration::from_secs(20));
    let second = call(&mut client, overridden()).await;
    assert_eq!(views(&second), [(Code::Ok, Some((2, MINUTE)), 0, Some(40_000))]);
    let third = call(&mut client, overridden()).await;
    assert_eq!(overall(&third), Code::OverLimit);
    assert_eq!(views(&third), [(Code::OverLimit, Some((2, MINUTE)), 0, Some(40_000))]);
    // Each value has its own counter.
    let other = call(
        &mut client,
        request_of(
            "api",
            vec![with_override(descriptor(&[("path", "/download")]), 2, RateLimitUnit::Minute as i32)],
        ),
    )
    .await;
    assert_eq!(views(&other), [(Code::Ok, Some((2, MINUTE)), 1, Some(60_000))]);
    server.stop().await;
}

#[tokio::test]
async fn an_override_takes_the_place_of_the_matching_rule() {
    let (server, _clock, mut client) = serve_memory(RULES, ServiceOptions::default()).await;
    let overridden = call(
        &mut client,
        request_of("api", vec![with_hits(with_override(alice(), 100, RateLimitUnit::Hour as i32), 50)]),
    )
    .await;
    assert_eq!(views(&overridden), [(Code::Ok, Some((100, HOUR)), 50, Some(3_600_000))]);
    // The rule's counter was not touched.
    let plain = call(&mut client, request_of("api", vec![alice()])).await;
    assert_eq!(views(&plain), [user(4, 60_000)]);
    server.stop().await;
}

#[tokio::test]
async fn overrides_of_different_limits_count_apart_and_equal_ones_merge() {
    let (server, _clock, mut client) = serve_memory(RULES, ServiceOptions::default()).await;
    let limited = |limit| with_override(alice(), limit, RateLimitUnit::Day as i32);
    let first = call(&mut client, request_of("api", vec![limited(3), limited(3), limited(4)])).await;
    assert_eq!(
        views(&first),
        [
            (Code::Ok, Some((3, DAY)), 1, Some(86_400_000)),
            (Code::Ok, Some((3, DAY)), 1, Some(86_400_000)),
            (Code::Ok, Some((4, DAY)), 3, Some(86_400_000)),
        ]
    );
    server.stop().await;
}

#[tokio::test]
async fn override_units_map_to_the_same_response_units() {
    let (server, _clock, mut client) = serve_memory(RULES, ServiceOptions::default()).await;
    let cases = [
        (RateLimitUnit::Second, SECOND, 1_000),
        (RateLimitUnit::Minute, MINUTE, 60_000),
        (RateLimitUnit::Hour, HOUR, 3_600_000),
        (RateLimitUnit::Day, DAY, 86_400_000),
        (RateLimitUnit::Month, Unit::Month as i32, 2_592_000_000),
        (RateLimitUnit::Year, Unit::Year as i32, 31_536_000_000),
    ];
    for (unit, response_unit, window_ms) in cases {
        let response = call(
            &mut client,
            request_of(
                "api",
                vec![with_override(descriptor(&[("path", unit.as_str_name())]), 7, unit as i32)],
            ),
        )
        .await;
        assert_eq!(views(&response), [(Code::Ok, Some((7, response_unit)), 6, Some(window_ms))], "{unit:?}");
    }
    // WEEK (7) of newer Envoy API versions, which this API version's enum lacks.
    let week =
        call(&mut client, request_of("api", vec![with_override(descriptor(&[("path", "WEEK")]), 7, 7)]))
            .await;
    assert_eq!(views(&week), [(Code::Ok, Some((7, Unit::Week as i32)), 6, Some(604_800_000))]);
    server.stop().await;
}

#[tokio::test]
async fn an_override_of_zero_is_over_limit_without_a_reset() {
    let (server, _clock, mut client) = serve_memory(RULES, ServiceOptions::default()).await;
    let response = call(
        &mut client,
        request_of(
            "api",
            vec![alice(), with_override(descriptor(&[("path", "/")]), 0, RateLimitUnit::Second as i32)],
        ),
    )
    .await;
    assert_eq!(overall(&response), Code::OverLimit);
    assert_eq!(views(&response), [NO_LIMIT, (Code::OverLimit, Some((0, SECOND)), 0, None)]);
    let next = call(&mut client, request_of("api", vec![alice()])).await;
    assert_eq!(views(&next), [user(4, 60_000)]);
    server.stop().await;
}

const GCRA_RULES: &str = "
domain: metered
descriptors:
  - key: client
    rate_limit:
      unit: second
      requests_per_unit: 10
      algorithm: gcra
";

#[tokio::test]
async fn an_override_uses_the_domain_algorithm() {
    let (server, _clock, mut client) = serve_memory(GCRA_RULES, ServiceOptions::default()).await;
    // GCRA with a burst of the override's 4 per second: one unit back every 250 ms.
    let overridden = || {
        request_of(
            "metered",
            vec![with_override(descriptor(&[("client", "c1")]), 4, RateLimitUnit::Second as i32)],
        )
    };
    let first = call(&mut client, overridden()).await;
    assert_eq!(views(&first), [(Code::Ok, Some((4, SECOND)), 3, Some(250))]);
    let second = call(&mut client, overridden()).await;
    assert_eq!(views(&second), [(Code::Ok, Some((4, SECOND)), 2, Some(500))]);
    server.stop().await;
}

#[tokio::test]
async fn an_override_in_an_unknown_domain_is_ignored() {
    let (server, _clock, mut client) = serve_memory(RULES, ServiceOptions::default()).await;
    let response = call(
        &mut client,
        request_of("elsewhere", vec![with_override(alice(), 1, RateLimitUnit::Second as i32)]),
    )
    .await;
    assert_eq!(overall(&response), Code::Ok);
    assert_eq!(views(&response), [NO_LIMIT]);
    server.stop().await;
}

// Unknown domains.

#[tokio::test]
async fn every_descriptor_of_an_unknown_domain_is_ok_without_a_limit() {
    let (server, _clock, mut client) = serve_memory(RULES, ServiceOptions::default()).await;
    for _ in 0..3 {
        let response = call(
            &mut client,
            request_of(
                "other",
                vec![with_hits(alice(), 100), descriptor(&[("blocked", "x")]), descriptor(&[("k", "v")])],
            ),
        )
        .await;
        assert_eq!(overall(&response), Code::Ok);
        assert_eq!(views(&response), [NO_LIMIT; 3]);
        assert!(response.response_headers_to_add.is_empty());
    }
    // Domains are matched exactly, letter case included.
    let upper = call(&mut client, request_of("API", vec![with_hits(alice(), 100)])).await;
    assert_eq!(views(&upper), [NO_LIMIT]);
    server.stop().await;
}

// The server answers many clients: the same counters whichever connection asks.

#[tokio::test]
async fn counters_are_shared_by_every_connection() {
    let (server, _clock, mut first) = serve_memory(RULES, ServiceOptions::default()).await;
    let mut second = server.client().await;
    let one = call(&mut first, request_of("api", vec![alice()])).await;
    let two = call(&mut second, request_of("api", vec![alice()])).await;
    assert_eq!((views(&one), views(&two)), (vec![user(4, 60_000)], vec![user(3, 60_000)]));
    server.stop().await;
}
