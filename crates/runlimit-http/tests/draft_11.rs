//! draft-11 encoding: the draft's examples as vectors, rounding, RFC 9651 limits, name
//! validation, and proptest round-trips through `sfv`'s RFC 9651 parser.

use std::time::Duration;

use http::{HeaderMap, HeaderValue, header::RETRY_AFTER};
use proptest::prelude::*;
use runlimit_core::{
    Admitted, Allowance, Capacity, Decision, Delay, Denial, FixedWindowPolicy, GcraPolicy, PolicyId,
    QuotaDenial, QuotaMode, RateLimitPolicy, ScopeId,
};
use runlimit_http::draft_11::{
    self, MAX_INTEGER, PolicyName, PolicyNameError, QuotaPolicy, QuotaPolicyError, QuotaState, RATELIMIT,
    RATELIMIT_POLICY, RateLimitFields, RateLimitFieldsError, ServiceLimit, ServiceLimitError, quota_policies,
    quota_policy, service_limit, service_limits,
};

// ---------------------------------------------------------------------------------------------
// Helpers

/// One parsed list member: the String value and its parameters, in order.
#[derive(Debug, PartialEq, Eq)]
struct Member {
    name: String,
    params: Vec<(String, i64)>,
}

/// Parses `value` as an RFC 9651 List with `sfv` and returns its String/Integer members.
/// Panics when the value does not parse or holds anything else.
fn parse(value: &HeaderValue) -> Vec<Member> {
    let list: sfv::List = sfv::Parser::new(value.as_bytes())
        .parse()
        .unwrap_or_else(|error| panic!("{value:?} is not an RFC 9651 list: {error}"));
    list.into_iter()
        .map(|entry| {
            let sfv::ListEntry::Item(item) = entry else { panic!("inner list in {value:?}") };
            let name = item.bare_item.as_string().expect("a String bare item").as_str().to_owned();
            let params = item
                .params
                .iter()
                .map(|(key, value)| {
                    (key.as_str().to_owned(), i64::from(value.as_integer().expect("an Integer parameter")))
                })
                .collect();
            Member { name, params }
        })
        .collect()
}

fn member(name: &str, params: &[(&str, i64)]) -> Member {
    Member { name: name.to_owned(), params: params.iter().map(|(k, v)| ((*k).to_owned(), *v)).collect() }
}

fn name(text: &str) -> PolicyName {
    PolicyName::new(text).unwrap()
}

fn fixed(limit: u64, window: Duration) -> FixedWindowPolicy {
    FixedWindowPolicy::new(PolicyId::new("p").unwrap(), ScopeId::new("s").unwrap(), limit, window).unwrap()
}

fn cap(units: u64) -> Capacity {
    Capacity::new(units).unwrap()
}

fn allowance(capacity: u64, available: u64, millis: u64) -> Allowance {
    Allowance::new(cap(capacity), available, Delay::from_millis(millis)).unwrap()
}

fn policy_item(text: &str, limit: u64, seconds: u64) -> QuotaPolicy {
    QuotaPolicy::from_policy(name(text), &fixed(limit, Duration::from_secs(seconds))).unwrap()
}

// ---------------------------------------------------------------------------------------------
// The draft's examples (D11 §3.2, §4.2, §6, App. B), serialized with RFC 9651's ", "

#[test]
fn header_names_are_lowercase_constants() {
    assert_eq!(RATELIMIT_POLICY.as_str(), "ratelimit-policy");
    assert_eq!(RATELIMIT.as_str(), "ratelimit");
}

#[test]
fn draft_vector_burst_and_daily() {
    let items = [policy_item("burst", 100, 60), policy_item("daily", 1000, 86_400)];
    let value = quota_policies(&items).unwrap();
    assert_eq!(value, r#""burst";q=100;w=60, "daily";q=1000;w=86400"#);
    assert_eq!(
        parse(&value),
        [member("burst", &[("q", 100), ("w", 60)]), member("daily", &[("q", 1000), ("w", 86_400)])]
    );
    // The draft writes the same list without the space; both parse to the same members.
    let draft = HeaderValue::from_static(r#""burst";q=100;w=60,"daily";q=1000;w=86400"#);
    assert_eq!(parse(&draft), parse(&value));
}

#[test]
fn draft_vector_default_policy() {
    let value = quota_policy(&policy_item("default", 100, 10));
    assert_eq!(value, r#""default";q=100;w=10"#);
    assert_eq!(parse(&value), [member("default", &[("q", 100), ("w", 10)])]);
}

#[test]
fn draft_vector_default_service_limit() {
    let value = service_limit(&name("default"), allowance(100, 50, 30_000)).unwrap();
    assert_eq!(value, r#""default";r=50;t=30"#);
    assert_eq!(parse(&value), [member("default", &[("r", 50), ("t", 30)])]);
}

#[test]
fn draft_vector_problem_policy() {
    let denial = QuotaDenial::new(cap(10), Delay::from_millis(10_000));
    let value = service_limit(&name("problemPolicy"), denial).unwrap();
    assert_eq!(value, r#""problemPolicy";r=0;t=10"#);
}

#[test]
fn draft_vector_dynamic_push_back() {
    // D11 App. B.3: RateLimit-Policy: "dynamic";q=100;w=60 and RateLimit: "dynamic";r=15;t=40
    // (the application adds its own Retry-After: 20).
    let mut fields = RateLimitFields::new();
    fields.push(name("dynamic"), &fixed(100, Duration::from_secs(60)), allowance(100, 15, 40_000)).unwrap();
    let mut headers = HeaderMap::new();
    headers.insert(RETRY_AFTER, HeaderValue::from_static("20"));
    fields.insert_into(&mut headers);
    assert_eq!(headers[RATELIMIT_POLICY], r#""dynamic";q=100;w=60"#);
    assert_eq!(headers[RATELIMIT], r#""dynamic";r=15;t=40"#);
    assert_eq!(headers[RETRY_AFTER], "20");
    assert_eq!(headers.len(), 3);
}

// ---------------------------------------------------------------------------------------------
// Rounding: dynamic durations round up; policy windows must be exact

#[test]
fn effective_window_rounds_up_to_whole_seconds() {
    let cases = [(0, 0), (1, 1), (999, 1), (1_000, 1), (1_001, 2), (29_001, 30), (59_999, 60), (60_000, 60)];
    for (millis, seconds) in cases {
        let allowed = service_limit(&name("a"), allowance(5, 1, millis)).unwrap();
        assert_eq!(allowed, format!(r#""a";r=1;t={seconds}"#), "allowance of {millis} ms");
        let denied = service_limit(&name("a"), QuotaDenial::new(cap(5), Delay::from_millis(millis))).unwrap();
        assert_eq!(denied, format!(r#""a";r=0;t={seconds}"#), "denial of {millis} ms");
    }
    let nanos = Delay::from_duration(Duration::new(7, 1));
    assert_eq!(service_limit(&name("a"), QuotaDenial::new(cap(5), nanos)).unwrap(), r#""a";r=0;t=8"#);
}

#[test]
fn policy_window_must_be_whole_seconds() {
    for millis in [1, 500, 999, 1_001, 1_500, 60_001] {
        let policy = fixed(10, Duration::from_millis(millis));
        assert_eq!(
            QuotaPolicy::from_policy(name("a"), &policy),
            Err(QuotaPolicyError::WindowNotWholeSeconds { millis }),
            "window of {millis} ms"
        );
    }
    assert_eq!(quota_policy(&policy_item("a", 10, 1)), r#""a";q=10;w=1"#);
    let gcra = GcraPolicy::new(
        PolicyId::new("p").unwrap(),
        ScopeId::new("s").unwrap(),
        3,
        Duration::from_millis(2_500),
        3,
    )
    .unwrap();
    assert_eq!(
        QuotaPolicy::from_policy(name("a"), &gcra),
        Err(QuotaPolicyError::WindowNotWholeSeconds { millis: 2_500 })
    );
}

// ---------------------------------------------------------------------------------------------
// RFC 9651 integer range

#[test]
fn quota_at_integer_maximum_is_accepted_and_one_above_rejected() {
    let item =
        QuotaPolicy::from_policy(name("big"), &fixed(999_999_999_999_999, Duration::from_secs(1))).unwrap();
    let value = quota_policy(&item);
    assert_eq!(value, r#""big";q=999999999999999;w=1"#);
    assert_eq!(parse(&value), [member("big", &[("q", 999_999_999_999_999), ("w", 1)])]);

    let too_big = fixed(1_000_000_000_000_000, Duration::from_secs(1));
    let error = QuotaPolicy::from_policy(name("big"), &too_big).unwrap_err();
    assert_eq!(
        error,
        QuotaPolicyError::QuotaOutOfRange { quota: 1_000_000_000_000_000, maximum: MAX_INTEGER }
    );
    assert_eq!(
        error.to_string(),
        "quota 1000000000000000 is above the structured field integer maximum of 999999999999999"
    );
    // sfv agrees that 16 digits is not an Integer.
    assert!(sfv::Parser::new(r#""big";q=1000000000000000;w=1"#).parse::<sfv::List>().is_err());
}

#[test]
fn available_at_integer_maximum_is_accepted_and_one_above_rejected() {
    let capacity = 1_000_000_000_000_000;
    let ok = service_limit(&name("a"), allowance(capacity, MAX_INTEGER, 1_000)).unwrap();
    assert_eq!(ok, r#""a";r=999999999999999;t=1"#);
    assert_eq!(
        service_limit(&name("a"), allowance(capacity, capacity, 1_000)),
        Err(ServiceLimitError::AvailableOutOfRange { available: capacity, maximum: MAX_INTEGER })
    );
}

#[test]
fn effective_window_at_integer_maximum_is_accepted_and_one_above_rejected() {
    let max = Delay::from_duration(Duration::from_secs(MAX_INTEGER));
    let ok = service_limit(&name("a"), QuotaDenial::new(cap(1), max)).unwrap();
    assert_eq!(ok, r#""a";r=0;t=999999999999999"#);
    // One nanosecond more rounds up to 10^15 seconds.
    let over = Delay::from_duration(Duration::new(MAX_INTEGER, 1));
    assert_eq!(
        service_limit(&name("a"), QuotaDenial::new(cap(1), over)),
        Err(ServiceLimitError::WindowOutOfRange { seconds: 1_000_000_000_000_000, maximum: MAX_INTEGER })
    );
    let saturated = Delay::from_duration(Duration::MAX);
    assert_eq!(
        ServiceLimit::new(name("a"), QuotaDenial::new(cap(1), saturated)),
        Err(ServiceLimitError::WindowOutOfRange { seconds: u64::MAX, maximum: MAX_INTEGER })
    );
}

// ---------------------------------------------------------------------------------------------
// Names

#[test]
fn names_are_escaped() {
    let value = service_limit(&name(r#"a"b\c"#), allowance(2, 1, 1_000)).unwrap();
    assert_eq!(value, r#""a\"b\\c";r=1;t=1"#);
    assert_eq!(parse(&value), [member(r#"a"b\c"#, &[("r", 1), ("t", 1)])]);
    let spaced = quota_policy(&policy_item(" x y ", 1, 1));
    assert_eq!(spaced, r#"" x y ";q=1;w=1"#);
    let punctuation = quota_policy(&policy_item("~!;,=:()", 1, 1));
    assert_eq!(punctuation, r#""~!;,=:()";q=1;w=1"#);
    assert_eq!(parse(&punctuation), [member("~!;,=:()", &[("q", 1), ("w", 1)])]);
}

#[test]
fn names_outside_printable_ascii_are_rejected() {
    let invalid = |index| Err(PolicyNameError::InvalidCharacter { index });
    assert_eq!(PolicyName::new("caf\u{e9}"), invalid(3));
    assert_eq!(PolicyName::new("\u{1F600}"), invalid(0));
    assert_eq!(PolicyName::new("a\tb"), invalid(1));
    assert_eq!(PolicyName::new("a\r\nb"), invalid(1));
    assert_eq!(PolicyName::new("ab\n"), invalid(2));
    assert_eq!(PolicyName::new("\0"), invalid(0));
    assert_eq!(PolicyName::new("del\u{7f}"), invalid(3));
    assert_eq!(PolicyName::new("\u{1f}"), invalid(0));
    assert_eq!(PolicyName::new(""), Err(PolicyNameError::Empty));
    assert_eq!(
        PolicyName::new(&"x".repeat(1025)),
        Err(PolicyNameError::TooLong { length: 1025, maximum: PolicyName::MAX_LEN })
    );
    assert_eq!(PolicyName::new(&"x".repeat(1024)).map(|n| n.as_str().len()), Ok(1024));
    assert_eq!(
        PolicyName::new("\u{7f}").unwrap_err().to_string(),
        "policy name has a character outside printable ASCII at byte 0"
    );
}

#[test]
fn policy_ids_are_always_valid_names() {
    let id = PolicyId::new("auth.login:v2_a-b").unwrap();
    assert_eq!(PolicyName::from(&id).as_str(), "auth.login:v2_a-b");
    assert_eq!("x y".parse::<PolicyName>(), Ok(name("x y")));
    assert_eq!(PolicyName::try_from("q"), Ok(name("q")));
    assert_eq!(format!("{:?} {}", name("a\"b"), name("a\"b")), r#"PolicyName("a\"b") a"b"#);
}

// ---------------------------------------------------------------------------------------------
// Quota states

#[test]
fn quota_states_from_every_accepted_source() {
    let allowed = allowance(10, 7, 4_200);
    let denial = QuotaDenial::new(cap(10), Delay::from_millis(800));
    let n = name("n");
    let expect_allowed = r#""n";r=7;t=5"#;
    let expect_denied = r#""n";r=0;t=1"#;
    assert_eq!(service_limit(&n, allowed).unwrap(), expect_allowed);
    assert_eq!(service_limit(&n, QuotaState::from(&allowed)).unwrap(), expect_allowed);
    assert_eq!(service_limit(&n, Admitted::Allowed(allowed)).unwrap(), expect_allowed);
    assert_eq!(service_limit(&n, QuotaState::from(&Admitted::Allowed(allowed))).unwrap(), expect_allowed);
    assert_eq!(service_limit(&n, denial).unwrap(), expect_denied);
    assert_eq!(service_limit(&n, QuotaState::from(&denial)).unwrap(), expect_denied);
    // Shadow denial: admitted, yet reports what enforcement would have applied.
    let shadow = Decision::quota_exceeded(denial, QuotaMode::Shadow).admit().unwrap();
    assert_eq!(shadow, Admitted::ShadowDenied(denial));
    assert_eq!(service_limit(&n, shadow).unwrap(), expect_denied);
    assert_eq!(QuotaState::from(shadow), QuotaState::Exhausted(denial));
    assert_eq!(QuotaState::from(shadow).available(), 0);
    assert_eq!(QuotaState::from(shadow).effective_window(), Delay::from_millis(800));

    // A rejection mapper passes the QuotaDenial of the QuotaExceeded arm.
    let enforced = Decision::quota_exceeded(denial, QuotaMode::Enforce).admit().unwrap_err();
    let value = match enforced {
        Denial::QuotaExceeded(quota) => Some(service_limit(&n, quota).unwrap()),
        Denial::StorageCapacity { .. } => None,
    };
    assert_eq!(value.unwrap(), expect_denied);
}

#[test]
fn gcra_policy_advertises_quota_per_period_and_full_replenishment() {
    // Q = 10 per second, burst 20 (reference vector V1). After the 5th hit at t=0: 15 remaining,
    // fully rested after 500 ms, which is what an Allowance carries.
    let policy = GcraPolicy::new(
        PolicyId::new("api.read").unwrap(),
        ScopeId::new("client").unwrap(),
        10,
        Duration::from_secs(1),
        20,
    )
    .unwrap();
    let state = Allowance::new(policy.capacity(), 15, Delay::from_millis(500)).unwrap();
    let mut fields = RateLimitFields::new();
    fields.push(PolicyName::from(policy.id()), &policy, state).unwrap();
    assert_eq!(fields.policy_value().unwrap(), r#""api.read";q=10;w=1"#);
    assert_eq!(fields.service_limit_value().unwrap(), r#""api.read";r=15;t=1"#);
    let (policy_value, limit_value) = fields.values().unwrap();
    assert_eq!(policy_value, r#""api.read";q=10;w=1"#);
    assert_eq!(limit_value, r#""api.read";r=15;t=1"#);
    // r may exceed q: a rested subject holds the full burst capacity.
    let rested = Allowance::new(policy.capacity(), 19, Delay::from_millis(100)).unwrap();
    assert_eq!(service_limit(&name("api.read"), rested).unwrap(), r#""api.read";r=19;t=1"#);
}

// ---------------------------------------------------------------------------------------------
// Lists and the fields builder

#[test]
fn empty_lists_are_not_fields() {
    assert_eq!(quota_policies(&[]), None);
    assert_eq!(service_limits(&[]), None);
    let fields = RateLimitFields::new();
    assert!(fields.is_empty());
    assert_eq!(fields.policy_value(), None);
    assert_eq!(fields.values(), None);
    let mut headers = HeaderMap::new();
    fields.insert_into(&mut headers);
    assert!(headers.is_empty());
}

#[test]
fn service_limit_lists_keep_order() {
    let items = [
        ServiceLimit::new(name("b"), allowance(3, 2, 1_500)).unwrap(),
        ServiceLimit::new(name("a"), QuotaDenial::new(cap(3), Delay::from_millis(2_000))).unwrap(),
        ServiceLimit::new(name("c"), allowance(3, 3, 0)).unwrap(),
    ];
    assert_eq!((items[0].name().as_str(), items[0].available(), items[0].window_seconds()), ("b", 2, 2));
    let value = service_limits(&items).unwrap();
    assert_eq!(value, r#""b";r=2;t=2, "a";r=0;t=2, "c";r=3;t=0"#);
    assert_eq!(
        parse(&value),
        [
            member("b", &[("r", 2), ("t", 2)]),
            member("a", &[("r", 0), ("t", 2)]),
            member("c", &[("r", 3), ("t", 0)])
        ]
    );
}

#[test]
fn fields_push_is_all_or_nothing_and_insert_replaces() {
    let mut fields = RateLimitFields::new();
    let error = fields
        .push(name("x"), &fixed(10, Duration::from_millis(1_500)), allowance(10, 9, 1_000))
        .unwrap_err();
    assert_eq!(
        error,
        RateLimitFieldsError::Policy { source: QuotaPolicyError::WindowNotWholeSeconds { millis: 1_500 } }
    );
    assert_eq!(error.to_string(), "policy cannot be described in RateLimit-Policy");
    let overflow = QuotaDenial::new(cap(10), Delay::from_duration(Duration::MAX));
    let error = fields.push(name("x"), &fixed(10, Duration::from_secs(1)), overflow).unwrap_err();
    assert!(matches!(
        error,
        RateLimitFieldsError::ServiceLimit { source: ServiceLimitError::WindowOutOfRange { .. } }
    ));
    assert!(fields.is_empty());
    assert!(fields.quota_policies().is_empty() && fields.service_limits().is_empty());

    fields.push(name("x"), &fixed(10, Duration::from_secs(1)), allowance(10, 9, 1_000)).unwrap();
    let mut headers = HeaderMap::new();
    headers.append(RATELIMIT, HeaderValue::from_static("stale"));
    headers.append(RATELIMIT, HeaderValue::from_static("stale2"));
    fields.insert_into(&mut headers);
    assert_eq!(headers.get_all(RATELIMIT).iter().collect::<Vec<_>>(), [r#""x";r=9;t=1"#]);
    assert_eq!(headers[RATELIMIT_POLICY], r#""x";q=10;w=1"#);
}

#[test]
fn dyn_policies_are_accepted() {
    let policy = fixed(7, Duration::from_secs(3));
    let dynamic: &dyn RateLimitPolicy = &policy;
    let item = QuotaPolicy::from_policy(name("d"), dynamic).unwrap();
    assert_eq!((item.quota(), item.window_seconds(), item.name().as_str()), (7, 3, "d"));
    let mut fields = RateLimitFields::new();
    fields.push(name("d"), dynamic, allowance(7, 6, 3_000)).unwrap();
    assert_eq!(fields.policy_value().unwrap(), r#""d";q=7;w=3"#);
}

#[test]
fn module_docs_example_matches() {
    // The crate-level example, spelled out with the free functions.
    let item = QuotaPolicy::from_policy(name("default"), &fixed(100, Duration::from_secs(60))).unwrap();
    assert_eq!(quota_policy(&item), r#""default";q=100;w=60"#);
    assert_eq!(
        draft_11::service_limit(&name("default"), allowance(100, 50, 29_500)).unwrap(),
        r#""default";r=50;t=30"#
    );
}

// ---------------------------------------------------------------------------------------------
// Property tests: every output parses with sfv to exactly the model's members

/// Names drawn from the whole sf-string alphabet, weighted towards `"` and `\`.
fn valid_name() -> impl Strategy<Value = String> {
    proptest::collection::vec(
        prop_oneof![
            3 => (0x20u8..=0x7e).prop_map(char::from),
            1 => Just('"'),
            1 => Just('\\'),
        ],
        1..40,
    )
    .prop_map(|chars| chars.into_iter().collect())
}

/// Model of RFC 9651 §3.3.3 plus Runlimit's non-empty / 1,024-byte rule.
fn model_name_error(text: &str) -> Option<PolicyNameError> {
    if text.is_empty() {
        Some(PolicyNameError::Empty)
    } else if text.len() > 1024 {
        Some(PolicyNameError::TooLong { length: text.len(), maximum: 1024 })
    } else {
        text.bytes()
            .position(|b| !(b' '..=b'~').contains(&b))
            .map(|index| PolicyNameError::InvalidCharacter { index })
    }
}

/// Quotas and counts around the RFC 9651 limit as well as small ones.
fn count() -> impl Strategy<Value = u64> {
    prop_oneof![1u64..=1_000, MAX_INTEGER - 3..=MAX_INTEGER + 3, 1u64..=runlimit_core::MAX_LIMIT,]
}

fn i(value: u64) -> i64 {
    i64::try_from(value).unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn name_validation_matches_model(text in any::<String>()) {
        prop_assert_eq!(PolicyName::new(&text).err(), model_name_error(&text));
    }

    #[test]
    fn printable_name_validation_matches_model(text in "[\\x00-\\x7f]{0,8}") {
        prop_assert_eq!(PolicyName::new(&text).err(), model_name_error(&text));
    }

    #[test]
    fn quota_policy_round_trips(
        text in valid_name(),
        quota in count(),
        window_millis in prop_oneof![1u64..=100_000, (1u64..=10_000_000).prop_map(|s| s * 1000)],
    ) {
        let policy = fixed(quota, Duration::from_millis(window_millis));
        let result = QuotaPolicy::from_policy(name(&text), &policy);
        if quota > MAX_INTEGER {
            prop_assert_eq!(result, Err(QuotaPolicyError::QuotaOutOfRange { quota, maximum: MAX_INTEGER }));
        } else if window_millis % 1000 != 0 {
            prop_assert_eq!(result, Err(QuotaPolicyError::WindowNotWholeSeconds { millis: window_millis }));
        } else {
            let value = quota_policy(&result.unwrap());
            prop_assert!(!value.is_empty());
            prop_assert_eq!(
                parse(&value),
                vec![member(&text, &[("q", i(quota)), ("w", i(window_millis / 1000))])]
            );
        }
    }

    #[test]
    fn service_limit_round_trips(
        text in valid_name(),
        capacity in count(),
        fraction in 0.0f64..=1.0,
        nanos in prop_oneof![0u64..=200_000_000_000, any::<u64>()],
        denied in any::<bool>(),
    ) {
        #[expect(clippy::cast_possible_truncation, clippy::cast_sign_loss, clippy::cast_precision_loss,
            reason = "test input generation only")]
        let available = ((capacity as f64 * fraction) as u64).min(capacity);
        let delay = Delay::from_duration(Duration::from_nanos(nanos));
        let state = if denied {
            QuotaState::from(QuotaDenial::new(cap(capacity), delay))
        } else {
            QuotaState::from(Allowance::new(cap(capacity), available, delay).unwrap())
        };
        let r = if denied { 0 } else { available };
        let t = nanos.div_ceil(1_000_000_000);
        let result = service_limit(&name(&text), state);
        if r > MAX_INTEGER {
            prop_assert_eq!(result, Err(ServiceLimitError::AvailableOutOfRange { available: r, maximum: MAX_INTEGER }));
        } else if t > MAX_INTEGER {
            prop_assert_eq!(result, Err(ServiceLimitError::WindowOutOfRange { seconds: t, maximum: MAX_INTEGER }));
        } else {
            let value = result.unwrap();
            prop_assert_eq!(parse(&value), vec![member(&text, &[("r", i(r)), ("t", i(t))])]);
        }
    }

    #[test]
    fn lists_round_trip(
        members in proptest::collection::vec((valid_name(), 1u64..=MAX_INTEGER, 1u64..=100_000, 0u64..=u64::from(u32::MAX)), 0..6),
    ) {
        let policies: Vec<QuotaPolicy> =
            members.iter().map(|(text, quota, seconds, _)| policy_item(text, *quota, *seconds)).collect();
        let limits: Vec<ServiceLimit> = members
            .iter()
            .map(|(text, quota, _, millis)| ServiceLimit::new(name(text), allowance(*quota, *quota / 2, *millis)).unwrap())
            .collect();
        let (policy_value, limit_value) = (quota_policies(&policies), service_limits(&limits));
        if members.is_empty() {
            prop_assert_eq!(policy_value, None);
            prop_assert_eq!(limit_value, None);
        } else {
            let expected_policies: Vec<Member> = members
                .iter()
                .map(|(text, quota, seconds, _)| member(text, &[("q", i(*quota)), ("w", i(*seconds))]))
                .collect();
            let expected_limits: Vec<Member> = members
                .iter()
                .map(|(text, quota, _, millis)| member(text, &[("r", i(quota / 2)), ("t", i(millis.div_ceil(1000)))]))
                .collect();
            let policy_value = policy_value.unwrap();
            let limit_value = limit_value.unwrap();
            prop_assert_eq!(parse(&policy_value), expected_policies);
            prop_assert_eq!(parse(&limit_value), expected_limits);
            // The serializer's own output is canonical: sfv re-serializes it unchanged.
            let reparsed: sfv::List = sfv::Parser::new(policy_value.as_bytes()).parse().unwrap();
            prop_assert_eq!(sfv::FieldType::serialize(&reparsed).unwrap(), policy_value.to_str().unwrap());
        }
    }
}
