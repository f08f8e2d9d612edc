//! Unit tests of the matcher: envoyproxy/ratelimit's `GetLimit` cases for basic_config.yaml,
//! wildcard.yaml and share_threshold.yaml (test/config/config_test.go), and the README
//! examples' requests.

use super::match_entries;
use crate::config::{Quota, RuleTable};

/// What a descriptor matched: the rule's path and limit (`path: N per UNIT`, or
/// `path: unlimited`), and the `share_threshold` patterns by entry index.
#[derive(Debug, PartialEq, Eq)]
struct Found {
    rule: String,
    shared: Vec<(usize, String)>,
}

fn found(rule: &str) -> Option<Found> {
    Some(Found { rule: rule.to_owned(), shared: Vec::new() })
}

fn found_shared(rule: &str, shared: &[(usize, &str)]) -> Option<Found> {
    Some(Found {
        rule: rule.to_owned(),
        shared: shared.iter().map(|(index, pattern)| (*index, (*pattern).to_owned())).collect(),
    })
}

fn table(yaml: &str) -> RuleTable {
    RuleTable::from_sources([("test.yaml", yaml)]).unwrap_or_else(|errors| panic!("invalid rules:\n{errors}"))
}

/// Matches `entries` in `domain` of `table`.
fn lookup(table: &RuleTable, domain: &str, entries: &[(&str, &str)]) -> Option<Found> {
    lookup_with(table, domain, entries, &mut String::new())
}

fn lookup_with(
    table: &RuleTable,
    domain: &str,
    entries: &[(&str, &str)],
    scratch: &mut String,
) -> Option<Found> {
    let domain = table.domain(domain).unwrap_or_else(|| panic!("no domain {domain}"));
    let matched = match_entries(domain, entries.iter().map(|(key, value)| (*key, *value)), scratch)?;
    let rule = matched.rule(domain).expect("the matched rule is in its domain");
    assert_eq!(domain.rules[matched.rule].path, rule.path);
    let limit = match &rule.quota {
        Quota::Unlimited => "unlimited".to_owned(),
        Quota::Limited { requests_per_unit, unit, .. } => format!("{requests_per_unit} per {}", unit.name()),
    };
    Some(Found {
        rule: format!("{}: {limit}", rule.path),
        shared: matched.shared.iter().map(|(index, pattern)| (*index, (*pattern).to_owned())).collect(),
    })
}

/// envoyproxy/ratelimit's test/config/basic_config.yaml, with the rules its newest test
/// expects (key4's name, key6 unlimited, key7 detailed_metric).
const BASIC_CONFIG: &str = include_str!("../../tests/envoy-ratelimit/test-config/basic_config.yaml");

#[test]
fn basic_config_unknown_domain_is_not_in_the_table() {
    let table = table(BASIC_CONFIG);
    assert!(table.domain("foo_domain").is_none());
    assert!(table.domain("test-domain").is_some());
}

#[test]
fn basic_config_a_value_the_placeholder_does_not_name_matches_nothing() {
    let table = table(BASIC_CONFIG);
    assert_eq!(lookup(&table, "test-domain", &[("key1", "something")]), None);
}

#[test]
fn basic_config_a_placeholder_without_a_limit_matches_nothing() {
    let table = table(BASIC_CONFIG);
    assert_eq!(lookup(&table, "test-domain", &[("key1", "value1")]), None);
}

#[test]
fn basic_config_a_request_deeper_than_the_config_matches_nothing() {
    let table = table(BASIC_CONFIG);
    // key2=value2 has no children.
    assert_eq!(lookup(&table, "test-domain", &[("key2", "value2"), ("subkey", "subvalue")]), None);
    // subkey5 has only the value subvalue5 and no key-only rule.
    assert_eq!(lookup(&table, "test-domain", &[("key5", "value5"), ("subkey5", "subvalue")]), None);
    // Deeper than the deepest rule, through rules that all have limits.
    assert_eq!(
        lookup(&table, "test-domain", &[("key5", "value5"), ("subkey5", "subvalue5"), ("more", "x")]),
        None
    );
    assert_eq!(lookup(&table, "test-domain", &[("key3", "foo"), ("key3", "foo")]), None);
}

#[test]
fn basic_config_nested_key_only_and_exact_rules() {
    let table = table(BASIC_CONFIG);
    assert_eq!(
        lookup(&table, "test-domain", &[("key1", "value1"), ("subkey1", "something")]),
        found("test-domain.key1_value1.subkey1: 5 per second")
    );
    assert_eq!(
        lookup(&table, "test-domain", &[("key1", "value1"), ("subkey1", "subvalue1")]),
        found("test-domain.key1_value1.subkey1_subvalue1: 10 per second")
    );
}

#[test]
fn basic_config_key_only_default_versus_exact_value() {
    let table = table(BASIC_CONFIG);
    assert_eq!(
        lookup(&table, "test-domain", &[("key2", "something")]),
        found("test-domain.key2: 20 per minute")
    );
    assert_eq!(
        lookup(&table, "test-domain", &[("key2", "value2")]),
        found("test-domain.key2_value2: 30 per minute")
    );
    // An empty request value is no value of the rules: the key-only rule.
    assert_eq!(lookup(&table, "test-domain", &[("key2", "")]), found("test-domain.key2: 20 per minute"));
    // Values are compared exactly, case included.
    assert_eq!(
        lookup(&table, "test-domain", &[("key2", "VALUE2")]),
        found("test-domain.key2: 20 per minute")
    );
    // Keys too.
    assert_eq!(lookup(&table, "test-domain", &[("Key2", "value2")]), None);
}

#[test]
fn basic_config_a_whitelisted_value_does_not_fall_back_to_the_key_only_rule() {
    // No backtracking: key2=value3 chose its own rule, which has no limit.
    let table = table(BASIC_CONFIG);
    assert_eq!(lookup(&table, "test-domain", &[("key2", "value3")]), None);
}

#[test]
fn basic_config_an_intermediate_rule_applies_when_the_request_stops_there() {
    let table = table(BASIC_CONFIG);
    assert_eq!(
        lookup(&table, "test-domain", &[("key5", "value5")]),
        found("test-domain.key5_value5: 15 per day")
    );
    assert_eq!(
        lookup(&table, "test-domain", &[("key5", "value5"), ("subkey5", "subvalue5")]),
        found("test-domain.key5_value5.subkey5_subvalue5: 25 per day")
    );
}

#[test]
fn basic_config_named_unlimited_and_detailed_metric_rules() {
    let table = table(BASIC_CONFIG);
    assert_eq!(lookup(&table, "test-domain", &[("key3", "foo")]), found("test-domain.key3: 1 per hour"));
    assert_eq!(lookup(&table, "test-domain", &[("key4", "foo")]), found("test-domain.key4: 1 per day"));
    assert_eq!(lookup(&table, "test-domain", &[("key6", "foo")]), found("test-domain.key6: unlimited"));
    assert_eq!(
        lookup(&table, "test-domain", &[("key7", "unspecified_value")]),
        found("test-domain.key7: 70 per minute")
    );
    let domain = table.domain("test-domain").unwrap();
    let key4 = domain.rules.iter().find(|rule| &*rule.path == "test-domain.key4").unwrap();
    assert_eq!(key4.name.as_deref(), Some("key4_rate_limit"));
    let key3 = domain.rules.iter().find(|rule| &*rule.path == "test-domain.key3").unwrap();
    assert_eq!(key3.name, None);
}

#[test]
fn basic_config_an_unknown_top_level_key_matches_nothing() {
    let table = table(BASIC_CONFIG);
    assert_eq!(lookup(&table, "test-domain", &[("subkey1", "something")]), None);
    assert_eq!(lookup(&table, "test-domain", &[("nope", "value1"), ("subkey1", "subvalue1")]), None);
}

#[test]
fn no_entries_match_nothing() {
    let basic = table(BASIC_CONFIG);
    assert_eq!(lookup(&basic, "test-domain", &[]), None);
    // Even in a domain whose top-level key-only rule would match any entry.
    let table = table(
        "domain: d\ndescriptors:\n  - key: '*'\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
    );
    assert_eq!(lookup(&table, "d", &[]), None);
    assert_eq!(lookup(&table, "d", &[("anything", "x")]), found("d.*: 1 per second"));
}

/// envoyproxy/ratelimit's test/config/wildcard.yaml.
const WILDCARD: &str = include_str!("../../tests/envoy-ratelimit/test-config/wildcard.yaml");

#[test]
fn wildcard_trailing_star() {
    let table = table(WILDCARD);
    assert_eq!(
        lookup(&table, "test-domain", &[("wild", "foo1")]),
        found("test-domain.wild_foo*: 20 per minute")
    );
    assert_eq!(
        lookup(&table, "test-domain", &[("wild", "foo/bar/baz")]),
        found("test-domain.wild_foo*: 20 per minute")
    );
    assert_eq!(lookup(&table, "test-domain", &[("wild", "bar")]), None);
    assert_eq!(lookup(&table, "test-domain", &[("wild", "fo")]), None);
}

#[test]
fn wildcard_star_matches_the_empty_string() {
    let table = table(WILDCARD);
    assert_eq!(
        lookup(&table, "test-domain", &[("wild", "foo")]),
        found("test-domain.wild_foo*: 20 per minute")
    );
    assert_eq!(
        lookup(&table, "test-domain", &[("midWild", "barb")]),
        found("test-domain.midWild_bar*b: 20 per minute")
    );
    assert_eq!(
        lookup(&table, "test-domain", &[("multiWild", "foobarbaz")]),
        found("test-domain.multiWild_foo*bar*baz: 20 per minute")
    );
}

#[test]
fn wildcard_in_the_middle() {
    let table = table(WILDCARD);
    assert_eq!(
        lookup(&table, "test-domain", &[("midWild", "barab")]),
        found("test-domain.midWild_bar*b: 20 per minute")
    );
    assert_eq!(lookup(&table, "test-domain", &[("midWild", "bara")]), None);
    assert_eq!(lookup(&table, "test-domain", &[("midWild", "xbarb")]), None);
}

#[test]
fn wildcard_several_stars() {
    let table = table(WILDCARD);
    assert_eq!(
        lookup(&table, "test-domain", &[("multiWild", "foo123bar456baz")]),
        found("test-domain.multiWild_foo*bar*baz: 20 per minute")
    );
    assert_eq!(lookup(&table, "test-domain", &[("multiWild", "foo123baz")]), None);
    assert_eq!(lookup(&table, "test-domain", &[("multiWild", "bar456baz")]), None);
    assert_eq!(lookup(&table, "test-domain", &[("multiWild", "foobazbar")]), None);
}

#[test]
fn wildcard_plain_values_are_not_prefixes() {
    let table = table(WILDCARD);
    assert_eq!(lookup(&table, "test-domain", &[("noWild", "foo1")]), None);
    assert_eq!(
        lookup(&table, "test-domain", &[("noWild", "foo")]),
        found("test-domain.noWild_foo: 20 per minute")
    );
    assert_eq!(
        lookup(&table, "test-domain", &[("noVal", "foo1")]),
        found("test-domain.noVal: 20 per minute")
    );
}

#[test]
fn wildcard_in_a_nested_list() {
    let table = table(WILDCARD);
    assert_eq!(
        lookup(&table, "test-domain", &[("nestedWild", "val1"), ("wild", "goo2")]),
        found("test-domain.nestedWild_val1.wild_goo*: 20 per minute")
    );
    // The top-level `wild: foo*` is not in the nested list.
    assert_eq!(lookup(&table, "test-domain", &[("nestedWild", "val1"), ("wild", "foo2")]), None);
    assert_eq!(lookup(&table, "test-domain", &[("nestedWild", "val1")]), None);
    assert_eq!(lookup(&table, "test-domain", &[("wild", "goo2")]), None);
}

#[test]
fn wildcard_is_matched_against_the_key_value_text() {
    // As in envoyproxy/ratelimit, the pattern is `key_value`, so a `*` in a key-only rule's
    // key matches keys, and the text crosses the `_` between key and value.
    let text = "domain: d
descriptors:
  - key: pre*
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: wild
    value: foo*
    rate_limit: {unit: second, requests_per_unit: 2}
  - key: any
    value: '*'
    rate_limit: {unit: second, requests_per_unit: 3}
";
    let table = table(text);
    assert_eq!(lookup(&table, "d", &[("prefix", "whatever")]), found("d.pre*: 1 per second"));
    assert_eq!(lookup(&table, "d", &[("pre", "")]), found("d.pre*: 1 per second"));
    assert_eq!(lookup(&table, "d", &[("wild_foo", "x")]), found("d.wild_foo*: 2 per second"));
    assert_eq!(lookup(&table, "d", &[("wil", "d_foo")]), None);
    assert_eq!(lookup(&table, "d", &[("any", "")]), found("d.any_*: 3 per second"));
    assert_eq!(lookup(&table, "d", &[("other", "foo")]), None);
}

/// Each kind of rule for one key, and wildcards that overlap.
const PRECEDENCE: &str = "domain: d
descriptors:
  - key: k
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: k
    value: f*
    rate_limit: {unit: second, requests_per_unit: 2}
  - key: k
    value: foo*
    rate_limit: {unit: second, requests_per_unit: 3}
  - key: k
    value: foo1
    rate_limit: {unit: second, requests_per_unit: 4}
  - key: k*
    rate_limit: {unit: second, requests_per_unit: 5}
";

#[test]
fn exact_value_is_preferred_over_wildcards() {
    let table = table(PRECEDENCE);
    assert_eq!(lookup(&table, "d", &[("k", "foo1")]), found("d.k_foo1: 4 per second"));
}

#[test]
fn the_first_matching_wildcard_in_file_order_wins() {
    let table = table(PRECEDENCE);
    // `f*` comes before the more specific `foo*`, and both before `k*`.
    assert_eq!(lookup(&table, "d", &[("k", "foo2")]), found("d.k_f*: 2 per second"));
    assert_eq!(lookup(&table, "d", &[("k", "fx")]), found("d.k_f*: 2 per second"));
    assert_eq!(lookup(&table, "d", &[("k", "x")]), found("d.k*: 5 per second"));
    // `k*` matches `k_...` and also other keys starting with `k`.
    assert_eq!(lookup(&table, "d", &[("key", "x")]), found("d.k*: 5 per second"));
}

#[test]
fn wildcard_is_preferred_over_the_key_only_rule() {
    let text = "domain: d
descriptors:
  - key: k
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: k
    value: v*
    rate_limit: {unit: second, requests_per_unit: 2}
";
    let table = table(text);
    assert_eq!(lookup(&table, "d", &[("k", "v1")]), found("d.k_v*: 2 per second"));
    assert_eq!(lookup(&table, "d", &[("k", "x")]), found("d.k: 1 per second"));
    assert_eq!(lookup(&table, "d", &[("k", "")]), found("d.k: 1 per second"));
}

#[test]
fn a_wildcard_choice_does_not_fall_back_to_the_key_only_rule() {
    // No backtracking: `k=ab` chose `a*`, whose children lack `y`; the key-only `k` has it.
    let text = "domain: d
descriptors:
  - key: k
    value: a*
    descriptors:
      - key: x
        rate_limit: {unit: second, requests_per_unit: 1}
  - key: k
    descriptors:
      - key: y
        rate_limit: {unit: second, requests_per_unit: 2}
";
    let table = table(text);
    assert_eq!(lookup(&table, "d", &[("k", "ab"), ("y", "1")]), None);
    assert_eq!(lookup(&table, "d", &[("k", "ab"), ("x", "1")]), found("d.k_a*.x: 1 per second"));
    assert_eq!(lookup(&table, "d", &[("k", "b"), ("y", "1")]), found("d.k.y: 2 per second"));
}

#[test]
fn the_scratch_buffer_may_hold_anything() {
    let table = table(WILDCARD);
    let mut scratch = String::from("wild_foo_left_over_from_an_earlier_request");
    assert_eq!(lookup_with(&table, "test-domain", &[("wild", "bar")], &mut scratch), None);
    assert_eq!(
        lookup_with(&table, "test-domain", &[("midWild", "barab")], &mut scratch),
        found("test-domain.midWild_bar*b: 20 per minute")
    );
    assert_eq!(
        lookup_with(&table, "test-domain", &[("nestedWild", "val1"), ("wild", "goo")], &mut scratch),
        found("test-domain.nestedWild_val1.wild_goo*: 20 per minute")
    );
}

/// envoyproxy/ratelimit's test/config/share_threshold.yaml, in part.
const SHARE_THRESHOLD: &str = include_str!("../../tests/envoy-ratelimit/test-config/share_threshold.yaml");

#[test]
fn share_threshold_records_the_pattern_of_a_wildcard_match() {
    let table = table(SHARE_THRESHOLD);
    for value in ["files/a.pdf", "files/b.csv", "files/"] {
        assert_eq!(
            lookup(&table, "test-domain", &[("files", value)]),
            found_shared("test-domain.files_files/*: 10 per hour", &[(0, "files_files/*")]),
            "{value}"
        );
    }
}

#[test]
fn share_threshold_absent_records_nothing() {
    let table = table(SHARE_THRESHOLD);
    assert_eq!(
        lookup(&table, "test-domain", &[("files_no_share", "files_no_share/a.pdf")]),
        found("test-domain.files_no_share_files_no_share/*: 10 per hour")
    );
}

#[test]
fn share_threshold_exact_match_records_nothing() {
    let table = table(SHARE_THRESHOLD);
    assert_eq!(
        lookup(&table, "test-domain", &[("file", "test1")]),
        found("test-domain.file_test1: 50 per minute")
    );
    for value in ["test2", "test23", "test"] {
        assert_eq!(
            lookup(&table, "test-domain", &[("file", value)]),
            found_shared("test-domain.file_test*: 100 per minute", &[(0, "file_test*")]),
            "{value}"
        );
    }
    assert_eq!(
        lookup(&table, "test-domain", &[("file", "test123")]).unwrap().shared,
        [(0, "file_test*".to_owned())]
    );
}

#[test]
fn share_threshold_nested_below_an_exact_match() {
    let table = table(SHARE_THRESHOLD);
    assert_eq!(
        lookup(&table, "test-domain", &[("parent", "value1"), ("files", "nested/x")]),
        found_shared("test-domain.parent_value1.files_nested/*: 200 per hour", &[(1, "files_nested/*")])
    );
}

#[test]
fn share_threshold_on_a_level_without_a_limit_is_recorded_for_its_entry() {
    let table = table(SHARE_THRESHOLD);
    // path/* shares (no limit of its own), file/* does not, type is key-only.
    assert_eq!(
        lookup(&table, "test-domain", &[("path", "path/a"), ("file", "file/b"), ("type", "pdf")]),
        found_shared("test-domain.path_path/*.file_file/*.type: 120 per minute", &[(0, "path_path/*")])
    );
    // Both wildcard levels share.
    assert_eq!(
        lookup(&table, "test-domain", &[("user", "user/1"), ("res", "res/2"), ("action", "read")]),
        found_shared(
            "test-domain.user_user/*.res_res/*.action: 150 per minute",
            &[(0, "user_user/*"), (1, "res_res/*")]
        )
    );
    assert_eq!(
        lookup(&table, "test-domain", &[("tenant", "t1prod"), ("resource", "resXv2")]),
        found_shared(
            "test-domain.tenant_t*prod.resource_res*v2: 90 per minute",
            &[(0, "tenant_t*prod"), (1, "resource_res*v2")]
        )
    );
}

#[test]
fn share_threshold_request_stopping_at_a_level_without_a_limit_matches_nothing() {
    let table = table(SHARE_THRESHOLD);
    assert_eq!(lookup(&table, "test-domain", &[("path", "path/a")]), None);
    assert_eq!(lookup(&table, "test-domain", &[("user", "user/1"), ("res", "res/2")]), None);
    assert_eq!(lookup(&table, "test-domain", &[("tenant", "t1prod"), ("resource", "resXv3")]), None);
}

// --- envoyproxy/ratelimit's README examples, as requests ---

#[test]
fn readme_example_1_unlisted_value_matches_nothing() {
    let table = table(include_str!("../../tests/envoy-ratelimit/readme/example1.yaml"));
    assert_eq!(
        lookup(&table, "mongo_cps", &[("database", "users")]),
        found("mongo_cps.database_users: 500 per second")
    );
    assert_eq!(
        lookup(&table, "mongo_cps", &[("database", "default")]),
        found("mongo_cps.database_default: 500 per second")
    );
    assert_eq!(lookup(&table, "mongo_cps", &[("database", "other")]), None);
}

#[test]
fn readme_example_2_each_descriptor_matches_its_own_rule() {
    let table = table(
        "domain: messaging
descriptors:
  - key: message_type
    value: marketing
    descriptors:
      - key: to_number
        rate_limit:
          unit: day
          requests_per_unit: 5
  - key: to_number
    rate_limit:
      unit: day
      requests_per_unit: 100
",
    );
    assert_eq!(
        lookup(&table, "messaging", &[("message_type", "marketing"), ("to_number", "2061111111")]),
        found("messaging.message_type_marketing.to_number: 5 per day")
    );
    assert_eq!(
        lookup(&table, "messaging", &[("to_number", "2061111111")]),
        found("messaging.to_number: 100 per day")
    );
    assert_eq!(lookup(&table, "messaging", &[("message_type", "marketing")]), None);
    assert_eq!(
        lookup(&table, "messaging", &[("message_type", "transactional"), ("to_number", "2061111111")]),
        None
    );
}

#[test]
fn readme_example_3_the_most_specific_match() {
    let table = table(
        "domain: edge_proxy_per_ip
descriptors:
  - key: remote_address
    rate_limit:
      unit: second
      requests_per_unit: 10
  - key: remote_address
    value: 50.0.0.5
    rate_limit:
      unit: second
      requests_per_unit: 0
",
    );
    assert_eq!(
        lookup(&table, "edge_proxy_per_ip", &[("remote_address", "50.0.0.1")]),
        found("edge_proxy_per_ip.remote_address: 10 per second")
    );
    assert_eq!(
        lookup(&table, "edge_proxy_per_ip", &[("remote_address", "50.0.0.5")]),
        found("edge_proxy_per_ip.remote_address_50.0.0.5: 0 per second")
    );
}

#[test]
fn readme_example_4_the_request_needs_as_many_entries_as_levels() {
    let flat = table(include_str!("../../tests/envoy-ratelimit/readme/example4.yaml"));
    let nested = table(include_str!("../../tests/envoy-ratelimit/readme/example4-nested.yaml"));
    let request = [("key", "value"), ("subkey", "subvalue")];
    assert_eq!(lookup(&flat, "example4", &request), None);
    assert_eq!(lookup(&nested, "example4", &request), found("example4.key_value.subkey: 300 per second"));
}

#[test]
fn readme_example_6_key_only_parent() {
    let table = table(include_str!("../../tests/envoy-ratelimit/readme/example6.yaml"));
    assert_eq!(
        lookup(&table, "example6", &[("service", "auth-service"), ("user", "user-a")]),
        found("example6.service.user_user-a: 10 per second")
    );
    assert_eq!(
        lookup(&table, "example6", &[("service", "other"), ("user", "user-b")]),
        found("example6.service.user_user-b: 20 per second")
    );
    assert_eq!(lookup(&table, "example6", &[("service", "auth-service"), ("user", "user-c")]), None);
}

#[test]
fn readme_example_9_wildcards_anywhere() {
    let table = table(
        "domain: example9
descriptors:
  - key: key1
    value: value*
    rate_limit:
      unit: minute
      requests_per_unit: 20
  - key: path
    value: /api/*/action
    rate_limit:
      unit: minute
      requests_per_unit: 20
  - key: route
    value: /api/*/resource/*/action
    rate_limit:
      unit: minute
      requests_per_unit: 20
",
    );
    for value in ["value1", "value2", "valueXYZ"] {
        assert_eq!(
            lookup(&table, "example9", &[("key1", value)]),
            found("example9.key1_value*: 20 per minute")
        );
    }
    for value in ["/api/123/action", "/api/user-id/action"] {
        assert_eq!(
            lookup(&table, "example9", &[("path", value)]),
            found("example9.path_/api/*/action: 20 per minute")
        );
    }
    assert_eq!(lookup(&table, "example9", &[("path", "/api/123/other")]), None);
    for value in ["/api/v1/resource/123/action", "/api/v2/resource/456/action"] {
        assert_eq!(
            lookup(&table, "example9", &[("route", value)]),
            found("example9.route_/api/*/resource/*/action: 20 per minute")
        );
    }
    assert_eq!(lookup(&table, "example9", &[("route", "/api/v1/resource/123")]), None);
}
