//! Unit tests of the rule file compiler: every invalid case with its full message, loading
//! from disk, envoyproxy/ratelimit's README examples, `describe` and `restarted_counters`.
//!
//! The YAML of envoyproxy/ratelimit's own test files (`test/config/*.yaml`) is reproduced
//! where a test is named after one.

use std::{fs, path::Path};

use super::*;

/// The table of one file named `test.yaml`; panics with every problem if invalid.
fn table(text: &str) -> RuleTable {
    RuleTable::from_sources([("test.yaml", text)]).unwrap_or_else(|errors| panic!("invalid rules:\n{errors}"))
}

/// Every problem of `sources`, as `check-config` prints them; panics if they are valid.
fn problems<'a>(sources: impl IntoIterator<Item = (&'a str, &'a str)>) -> String {
    match RuleTable::from_sources(sources) {
        Ok(table) => panic!("expected problems, got a valid table: {:?}", table.describe()),
        Err(errors) => errors.to_string(),
    }
}

/// Every problem of one file.
fn problem(name: &str, text: &str) -> String {
    problems([(name, text)])
}

/// One rule file with a single top-level rule `key: a` whose `rate_limit` block is `block`
/// (each line indented under `rate_limit:`).
fn with_rate_limit(block: &str) -> String {
    let mut text = String::from("domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n");
    for line in block.lines() {
        text.push_str("      ");
        text.push_str(line);
        text.push('\n');
    }
    text
}

fn lines(text: &[&str]) -> Vec<String> {
    text.iter().map(|line| (*line).to_owned()).collect()
}

fn rule<'t>(table: &'t RuleTable, domain: &str, path: &str) -> &'t Rule {
    let domain = table.domain(domain).unwrap_or_else(|| panic!("no domain {domain}"));
    domain.rules.iter().find(|rule| &*rule.path == path).unwrap_or_else(|| panic!("no rule {path}"))
}

const UNITS: &str = "second, minute, hour, day, week, month, year";

// --- Invalid documents: syntax, shape, unknown keys, types ---

#[test]
fn bad_yaml_syntax_is_the_readers_message_with_line_and_column() {
    assert_eq!(
        problem("bad_yaml.yaml", "domain: \"test-domain\ndescriptors:\n"),
        "bad_yaml.yaml: found unexpected end of stream at line 3 column 1, while scanning a quoted scalar \
         at line 1 column 9"
    );
    assert_eq!(
        problem("bad_yaml.yaml", "domain: test-domain\n\tdescriptors: []\n"),
        "bad_yaml.yaml: found a tab character that violates indentation at line 2 column 1, while scanning \
         a plain scalar at line 1 column 9"
    );
}

#[test]
fn misspelled_key_ratelimit_names_the_path_and_the_allowed_keys() {
    // envoyproxy/ratelimit test/config/misspelled_key.yaml
    let text = "domain: test-domain
descriptors:
  - key: key1
    value: value1
    ratelimit:
      unit: day
      requests_per_unit: 5
";
    assert_eq!(
        problem("misspelled_key.yaml", text),
        "misspelled_key.yaml: descriptors[0]: unknown field `ratelimit`, expected one of `key`, `value`, \
         `rate_limit`, `descriptors`, `shadow_mode`, `quota_mode`, `detailed_metric`, `value_to_metric`, \
         `share_threshold`, `metadata` at line 5 column 5"
    );
}

#[test]
fn misspelled_key_requestsperunit_names_the_path_and_the_allowed_keys() {
    // envoyproxy/ratelimit test/config/misspelled_key2.yaml
    let text = "domain: test-domain
descriptors:
  - key: key1
    value: value1
    rate_limit:
      unit: day
      requestsperunit: 5
";
    assert_eq!(
        problem("misspelled_key2.yaml", text),
        "misspelled_key2.yaml: descriptors[0].rate_limit: unknown field `requestsperunit`, expected one of \
         `unit`, `requests_per_unit`, `unlimited`, `name`, `replaces`, `algorithm`, `burst` at line 7 column 7"
    );
}

#[test]
fn unknown_top_level_and_replaces_keys() {
    assert_eq!(
        problem("top.yaml", "domain: d\nratelimit: {}\n"),
        "top.yaml: unknown field `ratelimit`, expected `domain` or `descriptors` at line 2 column 1"
    );
    assert_eq!(
        problem(
            "replaces.yaml",
            &with_rate_limit("unit: second\nrequests_per_unit: 1\nreplaces: [{nam: x}]")
        ),
        "replaces.yaml: descriptors[0].rate_limit.replaces[0]: unknown field `nam`, expected `name` at line 7 \
         column 19"
    );
}

#[test]
fn unit_multiplier_is_an_unknown_key() {
    // envoyproxy/ratelimit's unmerged PR #552 (test/config/zero_unit_multiplier.yaml).
    let text = "domain: test-domain
descriptors:
  # 0 unit_multiplier
  - key: key1
    rate_limit:
      unit: second
      requests_per_unit: 5
      unit_multiplier: 0
";
    assert_eq!(
        problem("zero_unit_multiplier.yaml", text),
        "zero_unit_multiplier.yaml: descriptors[0].rate_limit: unknown field `unit_multiplier`, expected one \
         of `unit`, `requests_per_unit`, `unlimited`, `name`, `replaces`, `algorithm`, `burst` at line 8 \
         column 7"
    );
}

#[test]
fn non_string_key_is_named_as_yaml() {
    // envoyproxy/ratelimit test/config/non_string_key.yaml (no trailing newline). Its misspelled
    // `ratelimit` is not reported: shape problems stop the file before its keys are read.
    let text = "0.25: test-domain
descriptors:
  - key: key1
    value: value1
    ratelimit:
      unit: day
      requests_per_unit: 5";
    assert_eq!(
        problem("non_string_key.yaml", text),
        "non_string_key.yaml: key `0.25` is not a string; keys are field names such as `key` or `rate_limit`"
    );
}

#[test]
fn non_string_key_below_the_top_has_its_path() {
    assert_eq!(
        problem("nested.yaml", "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      true: 1\n"),
        "nested.yaml: descriptors[0].rate_limit: key `true` is not a string; keys are field names such as `key` \
         or `rate_limit`"
    );
}

#[test]
fn non_map_list_items_are_each_reported() {
    // envoyproxy/ratelimit test/config/non_map_list.yaml
    let text = "domain: test-domain
descriptors:
  - a
  - b
  - c
";
    assert_eq!(
        problem("non_map_list.yaml", text),
        "non_map_list.yaml: descriptors[0]: is the string \"a\"; every item of this list is a map (such as `key: ...`)
non_map_list.yaml: descriptors[1]: is the string \"b\"; every item of this list is a map (such as `key: ...`)
non_map_list.yaml: descriptors[2]: is the string \"c\"; every item of this list is a map (such as `key: ...`)"
    );
}

#[test]
fn non_map_items_of_nested_lists_are_described_by_kind() {
    let text = "domain: d\ndescriptors:\n  - key: a\n    descriptors: [1, true, [x], ~]\n  -\n";
    assert_eq!(
        problem("nested.yaml", text),
        "nested.yaml: descriptors[0].descriptors[0]: is the number 1; every item of this list is a map (such as `key: ...`)
nested.yaml: descriptors[0].descriptors[1]: is the boolean true; every item of this list is a map (such as `key: ...`)
nested.yaml: descriptors[0].descriptors[2]: is a list; every item of this list is a map (such as `key: ...`)
nested.yaml: descriptors[0].descriptors[3]: is empty; every item of this list is a map (such as `key: ...`)
nested.yaml: descriptors[1]: is empty; every item of this list is a map (such as `key: ...`)"
    );
}

#[test]
fn a_list_where_a_scalar_belongs_is_a_type_error_not_a_list_of_maps() {
    assert_eq!(
        problem("list.yaml", "domain: [a]\ndescriptors: []\n"),
        "list.yaml: domain: invalid type: sequence, expected a string at line 1 column 9"
    );
    let text =
        "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: [5]}\n";
    assert_eq!(
        problem("list.yaml", text),
        "list.yaml: descriptors[0].rate_limit.requests_per_unit: invalid type: sequence, expected u32 at \
         line 4 column 51"
    );
    // `replaces` is a list of maps, each naming a rule.
    let text = "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unlimited: true, replaces: [b]}\n";
    assert_eq!(
        problem("list.yaml", text),
        "list.yaml: descriptors[0].rate_limit.replaces[0]: is the string \"b\"; every item of this list is a \
         map (such as `key: ...`)"
    );
}

#[test]
fn a_document_that_is_a_list_or_a_scalar_is_refused() {
    assert_eq!(
        problem("list.yaml", "- domain: d\n  descriptors: []\n"),
        "list.yaml: the document is a list; a rule file is a map with `domain` and `descriptors`"
    );
    assert_eq!(
        problem("scalar.yaml", "domain\n"),
        "scalar.yaml: the document is the string \"domain\"; a rule file is a map with `domain` and `descriptors`"
    );
    assert_eq!(
        problem("number.yaml", "42\n"),
        "number.yaml: the document is the number 42; a rule file is a map with `domain` and `descriptors`"
    );
}

#[test]
fn several_yaml_documents_in_one_file_are_refused() {
    assert_eq!(
        problem("two.yaml", "domain: a\n---\ndomain: b\n"),
        "two.yaml: deserializing from YAML containing more than one document is not supported"
    );
}

#[test]
fn a_key_given_twice_in_one_map_is_refused() {
    assert_eq!(
        problem("twice.yaml", "domain: a\ndomain: b\n"),
        "twice.yaml: duplicate entry with key \"domain\""
    );
}

// --- Domains ---

#[test]
fn empty_domain() {
    assert_eq!(
        problem("empty_domain.yaml", "domain: \"\"\ndescriptors:\n  - key: a\n"),
        "empty_domain.yaml: domain: is missing or empty; every rule file names its domain"
    );
}

#[test]
fn missing_domain() {
    assert_eq!(
        problem("missing_domain.yaml", "descriptors:\n  - key: a\n"),
        "missing_domain.yaml: domain: is missing or empty; every rule file names its domain"
    );
    assert_eq!(
        problem("null_domain.yaml", "domain:\ndescriptors: []\n"),
        "null_domain.yaml: domain: is missing or empty; every rule file names its domain"
    );
}

#[test]
fn an_empty_file_has_no_domain() {
    assert_eq!(
        problem("empty.yaml", ""),
        "empty.yaml: domain: is missing or empty; every rule file names its domain"
    );
    assert_eq!(
        problem("comments.yaml", "# nothing here yet\n"),
        "comments.yaml: domain: is missing or empty; every rule file names its domain"
    );
}

#[test]
fn a_domain_without_rules_is_valid() {
    for text in ["domain: d\n", "domain: d\ndescriptors:\n", "domain: d\ndescriptors: []\n"] {
        let table = table(text);
        assert_eq!((table.domain_count(), table.rule_count()), (1, 0), "{text}");
        assert_eq!(table.describe(), Vec::<String>::new());
    }
}

#[test]
fn duplicate_domain_names_the_file_that_defined_it_first() {
    let rules = "domain: test-domain\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1}\n";
    assert_eq!(
        problems([
            ("basic_config.yaml", rules),
            ("other.yaml", "domain: other\n"),
            ("duplicate_domain.yaml", rules)
        ]),
        "duplicate_domain.yaml: domain: `test-domain` is already defined in basic_config.yaml; each domain's \
         rules live in one file"
    );
}

#[test]
fn a_second_definition_of_a_domain_has_its_own_problems_reported() {
    // Regression: a file whose domain was already defined was not compiled, hiding its own
    // problems until it was renamed.
    let first = "domain: d\n";
    let second = "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: foo, requests_per_unit: 1}\n";
    assert_eq!(
        problems([("a.yaml", first), ("b.yaml", second), ("c.yaml", "domain: d\n")]),
        format!(
            "b.yaml: domain: `d` is already defined in a.yaml; each domain's rules live in one file
b.yaml: descriptors[0].rate_limit.unit: unknown unit `foo`; expected one of {UNITS} (any letter case)
c.yaml: domain: `d` is already defined in a.yaml; each domain's rules live in one file"
        )
    );
}

#[test]
fn duplicate_domain_is_reported_even_when_the_first_definition_is_invalid() {
    let bad = "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: foo, requests_per_unit: 1}\n";
    assert_eq!(
        problems([("a.yaml", bad), ("b.yaml", "domain: d\n")]),
        format!(
            "a.yaml: descriptors[0].rate_limit.unit: unknown unit `foo`; expected one of {UNITS} (any letter case)
b.yaml: domain: `d` is already defined in a.yaml; each domain's rules live in one file"
        )
    );
}

// --- Rules ---

#[test]
fn duplicate_key_and_value_at_one_level() {
    // envoyproxy/ratelimit test/config/duplicate_key.yaml
    let text = "domain: test-domain
descriptors:
  - key: key1
    value: value1

  - key: key1
    value: value1
";
    assert_eq!(
        problem("duplicate_key.yaml", text),
        "duplicate_key.yaml: descriptors[1]: duplicates the rule `test-domain.key1_value1` of the same list \
         (same key and value)"
    );
}

#[test]
fn duplicate_key_only_and_wildcard_rules_in_a_nested_list() {
    let text = "domain: d
descriptors:
  - key: top
    descriptors:
      - key: a
      - key: a
        value: x*
      - key: a
        value: ''
      - key: a
        value: x*
";
    assert_eq!(
        problem("dup.yaml", text),
        "dup.yaml: descriptors[0].descriptors[2]: duplicates the rule `d.top.a` of the same list (same key and value)
dup.yaml: descriptors[0].descriptors[3]: duplicates the rule `d.top.a_x*` of the same list (same key and value)"
    );
}

#[test]
fn rules_are_compared_by_key_and_value_not_by_their_key_value_text() {
    // envoyproxy/ratelimit compares `a_b` (key only) and `a`/`b` as the same text `a_b`.
    let text = "domain: d
descriptors:
  - key: a_b
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: a
    value: b
    rate_limit: {unit: second, requests_per_unit: 2}
  - key: a
    value: b
    descriptors:
      - key: c
";
    assert_eq!(
        problem("dup.yaml", text),
        "dup.yaml: descriptors[2]: duplicates the rule `d.a_b` of the same list (same key and value)"
    );
}

#[test]
fn the_same_rule_in_different_lists_is_no_duplicate() {
    let text = "domain: d
descriptors:
  - key: a
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: b
    descriptors:
      - key: a
        rate_limit: {unit: second, requests_per_unit: 2}
";
    assert_eq!(
        table(text).describe(),
        lines(&["d.a: 1 per second (fixed_window)", "d.b.a: 2 per second (fixed_window)"])
    );
}

#[test]
fn empty_key() {
    assert_eq!(
        problem("empty_key.yaml", "domain: d\ndescriptors:\n  - key: \"\"\n    value: v\n"),
        "empty_key.yaml: descriptors[0].key: is missing or empty; every rule has a non-empty `key`"
    );
}

#[test]
fn missing_key() {
    assert_eq!(
        problem(
            "missing_key.yaml",
            "domain: d\ndescriptors:\n  - key: a\n    descriptors:\n      - value: v\n        rate_limit: {unit: second, requests_per_unit: 1}\n"
        ),
        "missing_key.yaml: descriptors[0].descriptors[0].key: is missing or empty; every rule has a non-empty `key`"
    );
}

#[test]
fn bad_unit_foo() {
    // envoyproxy/ratelimit's TestBadLimitUnit: "invalid rate limit unit 'foo'".
    assert_eq!(
        problem("bad_limit_unit.yaml", &with_rate_limit("unit: foo\nrequests_per_unit: 5")),
        format!(
            "bad_limit_unit.yaml: descriptors[0].rate_limit.unit: unknown unit `foo`; expected one of {UNITS} \
             (any letter case)"
        )
    );
}

#[test]
fn bad_unit_minutes() {
    assert_eq!(
        problem("minutes.yaml", &with_rate_limit("unit: minutes\nrequests_per_unit: 5")),
        format!(
            "minutes.yaml: descriptors[0].rate_limit.unit: unknown unit `minutes`; expected one of {UNITS} (any letter case)"
        )
    );
}

#[test]
fn bad_unit_unknown_and_empty() {
    // UNKNOWN is the proto enum's zero value, which envoyproxy/ratelimit refuses as well.
    assert_eq!(
        problem("unknown.yaml", &with_rate_limit("unit: UNKNOWN\nrequests_per_unit: 5")),
        format!(
            "unknown.yaml: descriptors[0].rate_limit.unit: unknown unit `UNKNOWN`; expected one of {UNITS} (any letter case)"
        )
    );
    assert_eq!(
        problem("empty.yaml", &with_rate_limit("unit: ''\nrequests_per_unit: 5")),
        format!(
            "empty.yaml: descriptors[0].rate_limit.unit: unknown unit ``; expected one of {UNITS} (any letter case)"
        )
    );
}

#[test]
fn missing_unit() {
    assert_eq!(
        problem("missing_unit.yaml", &with_rate_limit("requests_per_unit: 5")),
        format!("missing_unit.yaml: descriptors[0].rate_limit.unit: is missing; expected one of {UNITS}")
    );
    assert_eq!(
        problem("null_unit.yaml", &with_rate_limit("unit:\nrequests_per_unit: 5")),
        format!("null_unit.yaml: descriptors[0].rate_limit.unit: is missing; expected one of {UNITS}")
    );
}

#[test]
fn missing_requests_per_unit() {
    assert_eq!(
        problem("missing_rpu.yaml", &with_rate_limit("unit: second")),
        "missing_rpu.yaml: descriptors[0].rate_limit.requests_per_unit: is missing; write the number of requests \
         allowed per unit (0 denies every request)"
    );
}

#[test]
fn an_empty_rate_limit_block_misses_both_unit_and_requests_per_unit() {
    assert_eq!(
        problem("empty_block.yaml", "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {}\n"),
        format!(
            "empty_block.yaml: descriptors[0].rate_limit.unit: is missing; expected one of {UNITS}
empty_block.yaml: descriptors[0].rate_limit.requests_per_unit: is missing; write the number of requests \
allowed per unit (0 denies every request)"
        )
    );
}

#[test]
fn unlimited_with_unit() {
    // envoyproxy/ratelimit test/config/unlimited_with_unit.yaml
    let text = "domain: test-domain
descriptors:
  - key: foo
    rate_limit:
      unlimited: true
      unit: day
      requests_per_unit: 25
";
    assert_eq!(
        problem("unlimited_with_unit.yaml", text),
        "unlimited_with_unit.yaml: descriptors[0].rate_limit.unit: must not be given with `unlimited: true`"
    );
}

#[test]
fn unlimited_with_requests_per_unit_or_a_null_unit_is_valid() {
    let text = "domain: d
descriptors:
  - key: a
    rate_limit: {unlimited: true, requests_per_unit: 25}
  - key: b
    rate_limit: {unlimited: true, unit: }
  - key: c
    rate_limit: {unlimited: false, unit: hour, requests_per_unit: 3}
";
    assert_eq!(
        table(text).describe(),
        lines(&["d.a: unlimited", "d.b: unlimited", "d.c: 3 per hour (fixed_window)"])
    );
}

#[test]
fn replaces_self() {
    // envoyproxy/ratelimit test/config/replaces_self.yaml
    let text = "domain: test-domain
descriptors:
  - key: key1
    value: value1
    descriptors:
      - key: subkey1
        rate_limit:
          name: self
          replaces:
            - name: self
          unit: second
          requests_per_unit: 5
";
    assert_eq!(
        problem("replaces_self.yaml", text),
        "replaces_self.yaml: descriptors[0].descriptors[0].rate_limit.replaces[0].name: `self` is this rule's \
         own name; a rule cannot replace itself"
    );
}

#[test]
fn replaces_empty() {
    // envoyproxy/ratelimit test/config/replaces_empty.yaml
    let text = "domain: test-domain
descriptors:
  - key: key1
    value: value1
    descriptors:
      - key: subkey1
        rate_limit:
          name: self
          replaces:
            - name:
          unit: second
          requests_per_unit: 5
";
    assert_eq!(
        problem("replaces_empty.yaml", text),
        "replaces_empty.yaml: descriptors[0].descriptors[0].rate_limit.replaces[0].name: is empty; each entry of \
         `replaces` names the rule it replaces"
    );
}

#[test]
fn replaces_with_an_empty_string_or_no_name() {
    assert_eq!(
        problem("empty.yaml", &with_rate_limit("unit: second\nrequests_per_unit: 1\nreplaces: [{name: ''}, {}]")),
        "empty.yaml: descriptors[0].rate_limit.replaces[0].name: is empty; each entry of `replaces` names the rule it replaces
empty.yaml: descriptors[0].rate_limit.replaces[1].name: is empty; each entry of `replaces` names the rule it replaces"
    );
}

#[test]
fn replaces_naming_no_rule_of_the_domain() {
    let other = "domain: other\ndescriptors:\n  - key: b\n    rate_limit: {name: elsewhere, unit: second, requests_per_unit: 1}\n";
    let text = "domain: test-domain
descriptors:
  - key: a
    rate_limit:
      unit: second
      requests_per_unit: 1
      replaces:
        - name: elsewhere
";
    assert_eq!(
        problems([("other.yaml", other), ("replaces.yaml", text)]),
        "replaces.yaml: descriptors[0].rate_limit.replaces[0].name: `elsewhere` is the name of no rule in domain \
         `test-domain`"
    );
}

#[test]
fn replaces_may_name_a_rule_defined_later_or_deeper() {
    let text = "domain: d
descriptors:
  - key: a
    rate_limit: {unit: second, requests_per_unit: 1, replaces: [{name: deep}, {name: later}]}
  - key: b
    rate_limit: {unit: second, requests_per_unit: 2, name: later}
    descriptors:
      - key: c
        rate_limit: {unit: second, requests_per_unit: 3, name: deep}
";
    let table = table(text);
    let a = rule(&table, "d", "d.a");
    assert_eq!(a.replaces.iter().map(|name| &**name).collect::<Vec<_>>(), ["deep", "later"]);
    assert_eq!(rule(&table, "d", "d.b").name.as_deref(), Some("later"));
}

#[test]
fn requests_per_unit_above_u32() {
    assert_eq!(
        problem("big.yaml", &with_rate_limit("unit: second\nrequests_per_unit: 5000000000")),
        "big.yaml: descriptors[0].rate_limit.requests_per_unit: invalid value: integer `5000000000`, expected u32 \
         at line 6 column 26"
    );
}

/// Regression: an integer beyond 64 bits read `invalid type: integer `18446744073709551616` as
/// u128, expected any YAML value`, which said neither that it was too large nor what the field
/// allows.
#[test]
fn requests_per_unit_above_u64() {
    assert_eq!(
        problem("big.yaml", &with_rate_limit("unit: second\nrequests_per_unit: 18446744073709551616")),
        "big.yaml: descriptors[0].rate_limit.requests_per_unit: integer `18446744073709551616` is out of range for \
         requests_per_unit: from 0 to 4294967295 at line 6 column 26"
    );
    assert_eq!(
        problem("small.yaml", &with_rate_limit("unit: second\nrequests_per_unit: -9223372036854775809")),
        "small.yaml: descriptors[0].rate_limit.requests_per_unit: integer `-9223372036854775809` is out of range \
         for requests_per_unit: from 0 to 4294967295 at line 6 column 26"
    );
    // In a file with merge keys, read another way, the message is the same.
    let merged = "domain: d\ndescriptors:\n  - <<: { key: a }\n    rate_limit: { unit: second, requests_per_unit: \
                  18446744073709551616 }\n";
    assert_eq!(
        problem("merged.yaml", merged),
        "merged.yaml: descriptors[0].rate_limit.requests_per_unit: integer `18446744073709551616` is out of range \
         for requests_per_unit: from 0 to 4294967295 at line 4 column 52"
    );
}

/// An integer beyond 64 bits in a text field (a descriptor value) is refused too, saying to
/// quote it; quoted, it is the value.
#[test]
fn an_integer_beyond_64_bits_elsewhere_is_to_be_quoted() {
    let text = |value: &str| {
        format!(
            "domain: d\ndescriptors:\n  - key: a\n    value: {value}\n    rate_limit: {{ unit: second, requests_per_unit: 1 }}\n"
        )
    };
    assert_eq!(
        problem("value.yaml", &text("18446744073709551616")),
        "value.yaml: descriptors[0].value: integer `18446744073709551616` is beyond the 64-bit integers a rule file \
         may hold; quote it if it is text at line 4 column 12"
    );
    assert_eq!(
        table(&text("\"18446744073709551616\"")).describe(),
        lines(&["d.a_18446744073709551616: 1 per second (fixed_window)"])
    );
}

/// When the reading stops at another problem first, that problem is reported, as it was.
#[test]
fn an_earlier_problem_is_reported_before_an_integer_beyond_64_bits() {
    let text = "domain: d\ndomain: e\ndescriptors:\n  - key: a\n    rate_limit: { unit: second, requests_per_unit: \
                18446744073709551616 }\n";
    assert_eq!(problem("twice.yaml", text), "twice.yaml: duplicate entry with key \"domain\"");
}

#[test]
fn requests_per_unit_negative() {
    assert_eq!(
        problem("negative.yaml", &with_rate_limit("unit: second\nrequests_per_unit: -1")),
        "negative.yaml: descriptors[0].rate_limit.requests_per_unit: invalid type: integer `-1`, expected u32 at \
         line 6 column 26"
    );
}

#[test]
fn requests_per_unit_not_an_integer() {
    assert_eq!(
        problem("float.yaml", &with_rate_limit("unit: second\nrequests_per_unit: 1.5")),
        "float.yaml: descriptors[0].rate_limit.requests_per_unit: invalid type: floating point `1.5`, expected u32 \
         at line 6 column 26"
    );
    assert_eq!(
        problem("string.yaml", &with_rate_limit("unit: second\nrequests_per_unit: \"5\"")),
        "string.yaml: descriptors[0].rate_limit.requests_per_unit: invalid type: string \"5\", expected u32 at \
         line 6 column 26"
    );
}

#[test]
fn requests_per_unit_at_u32_max_is_valid() {
    let table = table(&with_rate_limit("unit: second\nrequests_per_unit: 4294967295"));
    assert_eq!(table.describe(), lines(&["d.a: 4294967295 per second (fixed_window)"]));
}

#[test]
fn gcra_burst_of_zero() {
    assert_eq!(
        problem(
            "burst0.yaml",
            &with_rate_limit("algorithm: gcra\nunit: second\nrequests_per_unit: 5\nburst: 0")
        ),
        "burst0.yaml: descriptors[0].rate_limit.burst: burst capacity must be at least 1"
    );
}

#[test]
fn gcra_burst_above_the_maximum() {
    assert_eq!(
        problem(
            "burst.yaml",
            &with_rate_limit(
                "algorithm: gcra\nunit: second\nrequests_per_unit: 5\nburst: 9223372036854775808"
            )
        ),
        "burst.yaml: descriptors[0].rate_limit.burst: burst capacity is 9223372036854775808, above the maximum of \
         9223372036854775807"
    );
    assert_eq!(
        problem(
            "burst.yaml",
            &with_rate_limit(
                "algorithm: gcra\nunit: second\nrequests_per_unit: 5\nburst: 18446744073709551616"
            )
        ),
        "burst.yaml: descriptors[0].rate_limit.burst: integer `18446744073709551616` is out of range for burst: \
         from 1 to 9223372036854775807 at line 8 column 14"
    );
}

#[test]
fn gcra_burst_at_the_maximum_is_valid() {
    let text = with_rate_limit(
        "algorithm: gcra\nunit: second\nrequests_per_unit: 4294967295\nburst: 9223372036854775807",
    );
    assert_eq!(
        table(&text).describe(),
        lines(&["d.a: 4294967295 per second (gcra, burst 9223372036854775807)"])
    );
}

#[test]
fn gcra_replenishment_longer_than_runlimit_can_report() {
    // 1,000 years to replenish a burst of 1,000 at 1 a year.
    assert_eq!(
        problem(
            "slow.yaml",
            &with_rate_limit("algorithm: gcra\nunit: year\nrequests_per_unit: 1\nburst: 1000")
        ),
        "slow.yaml: descriptors[0].rate_limit.burst: full replenishment takes 31536000000000 milliseconds, above \
         the maximum of 9007199254740"
    );
}

#[test]
fn share_threshold_on_a_rule_without_a_wildcard() {
    let text = "domain: d
descriptors:
  - key: files
    value: files/a
    share_threshold: true
    rate_limit: {unit: hour, requests_per_unit: 10}
  - key: route
    share_threshold: true
    rate_limit: {unit: hour, requests_per_unit: 10}
";
    assert_eq!(
        problem("share.yaml", text),
        "share.yaml: descriptors[0].share_threshold: applies only to a wildcard rule, whose value holds a `*`, but \
         the rule is `files_files/a`
share.yaml: descriptors[1].share_threshold: applies only to a wildcard rule, whose value holds a `*`, but the \
rule is `route`"
    );
}

#[test]
fn share_threshold_false_on_a_plain_rule_and_true_on_a_wildcard_key_are_valid() {
    let text = "domain: d
descriptors:
  - key: files
    value: files/a
    share_threshold: false
    rate_limit: {unit: hour, requests_per_unit: 10}
  - key: pre*
    share_threshold: true
    rate_limit: {unit: hour, requests_per_unit: 20}
";
    let table = table(text);
    let domain = table.domain("d").unwrap();
    assert_eq!(domain.root.wildcards.len(), 1);
    assert_eq!(domain.root.wildcards[0].1.share.as_deref(), Some("pre*"));
    assert_eq!(domain.root.keys["files"].values["files/a"].share, None);
}

#[test]
fn quota_mode_true_is_not_supported() {
    let text = "domain: d
descriptors:
  - key: a
    quota_mode: true
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: b
    quota_mode: false
    rate_limit: {unit: second, requests_per_unit: 1}
";
    assert_eq!(
        problem("quota.yaml", text),
        "quota.yaml: descriptors[0].quota_mode: `quota_mode: true` is not supported: a request here is admitted \
         only when every matched rule admits it (remove the key, or set it to false)"
    );
}

#[test]
fn unknown_algorithm() {
    assert_eq!(
        problem("alg.yaml", &with_rate_limit("algorithm: leaky_bucket\nunit: second\nrequests_per_unit: 1")),
        "alg.yaml: descriptors[0].rate_limit.algorithm: unknown algorithm `leaky_bucket`; expected `fixed_window` \
         (the default) or `gcra`"
    );
    // Algorithm names, unlike units, are not case-insensitive.
    assert_eq!(
        problem("alg.yaml", &with_rate_limit("algorithm: GCRA\nunit: second\nrequests_per_unit: 1")),
        "alg.yaml: descriptors[0].rate_limit.algorithm: unknown algorithm `GCRA`; expected `fixed_window` (the \
         default) or `gcra`"
    );
}

#[test]
fn burst_without_gcra() {
    assert_eq!(
        problem("burst.yaml", &with_rate_limit("unit: second\nrequests_per_unit: 1\nburst: 4")),
        "burst.yaml: descriptors[0].rate_limit.burst: applies only with `algorithm: gcra`"
    );
    assert_eq!(
        problem(
            "burst.yaml",
            &with_rate_limit("algorithm: fixed_window\nunit: second\nrequests_per_unit: 1\nburst: 4")
        ),
        "burst.yaml: descriptors[0].rate_limit.burst: applies only with `algorithm: gcra`"
    );
}

#[test]
fn two_algorithms_in_one_domain() {
    let text = "domain: d
descriptors:
  - key: a
    rate_limit: {unit: second, requests_per_unit: 1, algorithm: gcra}
  - key: b
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: c
    descriptors:
      - key: e
        rate_limit: {unit: minute, requests_per_unit: 1, algorithm: fixed_window}
  - key: f
    rate_limit: {unit: minute, requests_per_unit: 1, algorithm: gcra}
";
    assert_eq!(
        problem("mixed.yaml", text),
        "mixed.yaml: descriptors[1].rate_limit.algorithm: is `fixed_window`, but rule `descriptors[0].rate_limit` \
         of the same domain uses `gcra`; every rule of a domain uses one algorithm, because a request is admitted \
         as one atomic batch of one limiter
mixed.yaml: descriptors[2].descriptors[0].rate_limit.algorithm: is `fixed_window`, but rule \
`descriptors[0].rate_limit` of the same domain uses `gcra`; every rule of a domain uses one algorithm, because \
a request is admitted as one atomic batch of one limiter"
    );
}

#[test]
fn two_domains_may_use_two_algorithms() {
    let gcra = "domain: g\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 10, algorithm: gcra, burst: 20}\n";
    let fixed =
        "domain: f\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 10}\n";
    let table = RuleTable::from_sources([("g.yaml", gcra), ("f.yaml", fixed)]).unwrap();
    assert_eq!(table.domain("g").unwrap().algorithm, Algorithm::Gcra);
    assert_eq!(table.domain("f").unwrap().algorithm, Algorithm::FixedWindow);
    assert_eq!(
        table.describe(),
        lines(&["f.a: 10 per second (fixed_window)", "g.a: 10 per second (gcra, burst 20)"])
    );
}

#[test]
fn unlimited_and_zero_rules_do_not_fix_the_algorithm_but_unlimited_ignores_it() {
    // An unlimited rule's `algorithm` and `burst` are not checked against the domain's.
    let text = "domain: d
descriptors:
  - key: a
    rate_limit: {unlimited: true, algorithm: gcra, burst: 3}
  - key: b
    rate_limit: {unit: minute, requests_per_unit: 0}
  - key: c
    rate_limit: {unit: minute, requests_per_unit: 2}
";
    let table = table(text);
    assert_eq!(table.domain("d").unwrap().algorithm, Algorithm::FixedWindow);
    assert_eq!(
        table.describe(),
        lines(&["d.a: unlimited", "d.b: 0 per minute (fixed_window)", "d.c: 2 per minute (fixed_window)"])
    );
}

#[test]
fn metadata_is_arbitrary_yaml() {
    // Regression: lists of scalars and non-string keys inside `metadata` were refused as
    // "is the string ...; every item of this list is a map".
    let text = "domain: d
descriptors:
  - key: a
    metadata:
      tags: [x, 2]
      1: {nested: [true]}
    detailed_metric: true
    value_to_metric: false
    rate_limit: {unit: second, requests_per_unit: 1}
";
    assert_eq!(table(text).describe(), lines(&["d.a: 1 per second (fixed_window)"]));
}

#[test]
fn several_problems_in_one_file_are_all_reported_in_document_order() {
    // Regression: an unknown `replaces` name was reported after every other problem of the
    // domain, not where it is.
    let text = "domain: d
descriptors:
  - key: a
    rate_limit:
      unit: second
      requests_per_unit: 1
      replaces: [{name: nope}]
  - key: b
    rate_limit: {unit: minutes, requests_per_unit: 1}
  - key: b
  - key: c
    share_threshold: true
    descriptors:
      - key: d
        rate_limit: {unlimited: true, unit: day, replaces: [{name: gone}, {name: ''}]}
      - key: e
        quota_mode: true
        rate_limit: {requests_per_unit: 1, burst: 2}
";
    assert_eq!(
        problem("many.yaml", text),
        format!(
            "many.yaml: descriptors[0].rate_limit.replaces[0].name: `nope` is the name of no rule in domain `d`
many.yaml: descriptors[1].rate_limit.unit: unknown unit `minutes`; expected one of {UNITS} (any letter case)
many.yaml: descriptors[2]: duplicates the rule `d.b` of the same list (same key and value)
many.yaml: descriptors[3].share_threshold: applies only to a wildcard rule, whose value holds a `*`, but the rule is `c`
many.yaml: descriptors[3].descriptors[0].rate_limit.replaces[0].name: `gone` is the name of no rule in domain `d`
many.yaml: descriptors[3].descriptors[0].rate_limit.replaces[1].name: is empty; each entry of `replaces` names the rule it replaces
many.yaml: descriptors[3].descriptors[0].rate_limit.unit: must not be given with `unlimited: true`
many.yaml: descriptors[3].descriptors[1].quota_mode: `quota_mode: true` is not supported: a request here is admitted only when every matched rule admits it (remove the key, or set it to false)
many.yaml: descriptors[3].descriptors[1].rate_limit.burst: applies only with `algorithm: gcra`
many.yaml: descriptors[3].descriptors[1].rate_limit.unit: is missing; expected one of {UNITS}"
        )
    );
}

#[test]
fn problems_under_a_rule_without_key_or_a_duplicate_are_reported() {
    // Regression: the `rate_limit` and the children of such a rule were skipped, hiding their
    // problems until the first was fixed.
    let text = "domain: d
descriptors:
  - value: x
    rate_limit: {unit: fortnight, requests_per_unit: 1}
    descriptors:
      - key: b
        rate_limit: {unit: minutes, requests_per_unit: 1}
  - key: a
  - key: a
    descriptors:
      - key: b
        rate_limit: {unit: hours, requests_per_unit: 1}
";
    assert_eq!(
        problem("hidden.yaml", text),
        format!(
            "hidden.yaml: descriptors[0].key: is missing or empty; every rule has a non-empty `key`
hidden.yaml: descriptors[0].rate_limit.unit: unknown unit `fortnight`; expected one of {UNITS} (any letter case)
hidden.yaml: descriptors[0].descriptors[0].rate_limit.unit: unknown unit `minutes`; expected one of {UNITS} (any letter case)
hidden.yaml: descriptors[2]: duplicates the rule `d.a` of the same list (same key and value)
hidden.yaml: descriptors[2].descriptors[0].rate_limit.unit: unknown unit `hours`; expected one of {UNITS} (any letter case)"
        )
    );
}

#[test]
fn problems_of_several_files_come_in_source_order() {
    let a = "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: foo, requests_per_unit: 1}\n";
    let b = "domain: b\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n";
    let c = "domain: c\ndescriptors:\n  - key: ''\n";
    assert_eq!(
        problems([("z.yaml", a), ("b.yaml", b), ("c.yaml", c), ("bad.yaml", "[")]),
        format!(
            "z.yaml: descriptors[0].rate_limit.unit: unknown unit `foo`; expected one of {UNITS} (any letter case)
c.yaml: descriptors[0].key: is missing or empty; every rule has a non-empty `key`
bad.yaml: did not find expected node content at line 2 column 1, while parsing a flow node"
        )
    );
}

#[test]
fn each_problem_has_its_file_location_and_kind() {
    let Err(errors) =
        RuleTable::from_sources([("x.yaml", with_rate_limit("unit: foo\nrequests_per_unit: 1"))])
    else {
        panic!("expected a problem");
    };
    let [error] = errors.errors() else { panic!("expected one problem: {errors}") };
    assert_eq!(error.file(), Path::new("x.yaml"));
    assert_eq!(error.location(), "descriptors[0].rate_limit.unit");
    assert!(
        matches!(error.kind(), ConfigErrorKind::InvalidUnit { unit } if unit == "foo"),
        "{:?}",
        error.kind()
    );
    assert!(std::error::Error::source(error).is_none());
}

// --- Loading from disk ---

fn write(dir: &Path, name: &str, text: &str) {
    fs::write(dir.join(name), text).unwrap();
}

fn rules_of(domain: &str, limit: u32) -> String {
    format!(
        "domain: {domain}\ndescriptors:\n  - key: k\n    rate_limit: {{unit: second, requests_per_unit: {limit}}}\n"
    )
}

#[test]
fn a_directory_without_rule_files() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "notes.txt", "domain: d\n");
    write(dir.path(), ".hidden.yaml", "domain: d\n");
    fs::create_dir(dir.path().join("sub.yaml")).unwrap();
    let errors = RuleTable::load(dir.path()).unwrap_err();
    assert_eq!(errors.to_string(), format!("{}: holds no rule file (*.yaml or *.yml)", dir.path().display()));
    assert!(matches!(errors.errors()[0].kind(), ConfigErrorKind::NoRuleFiles));
    assert_eq!(errors.errors()[0].file(), dir.path());
}

#[test]
fn a_missing_path_cannot_be_read_and_says_why() {
    // Regression: the operating system's reason was left out of the report.
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.yaml");
    let errors = RuleTable::load(&missing).unwrap_err();
    assert_eq!(
        errors.to_string(),
        format!("{}: cannot be read: No such file or directory (os error 2)", missing.display())
    );
    let [error] = errors.errors() else { panic!("one problem expected") };
    assert_eq!(error.to_string(), format!("{}: cannot be read", missing.display()));
    assert!(
        matches!(error.kind(), ConfigErrorKind::Read { source } if source.kind() == std::io::ErrorKind::NotFound)
    );
    assert!(std::error::Error::source(error).is_some());
}

#[test]
fn a_rule_file_that_is_not_utf8_cannot_be_read() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "a.yaml", &rules_of("a", 1));
    fs::write(dir.path().join("b.yaml"), b"domain: \xff\n").unwrap();
    fs::write(dir.path().join("c.yml"), b"\xfe").unwrap();
    assert_eq!(
        RuleTable::load(dir.path()).unwrap_err().to_string(),
        format!(
            "{0}/b.yaml: cannot be read: stream did not contain valid UTF-8
{0}/c.yml: cannot be read: stream did not contain valid UTF-8",
            dir.path().display()
        )
    );
}

#[test]
fn rule_files_past_the_byte_bound_together_are_refused_at_the_file_that_passes_it() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (rules_of("a", 1), rules_of("b", 1));
    write(dir.path(), "a.yaml", &a);
    write(dir.path(), "b.yaml", &b);
    // A file after the one that passes the bound is not read, even when it cannot be.
    fs::write(dir.path().join("c.yaml"), b"\xff").unwrap();
    let (a_len, total) = (a.len() as u64, (a.len() + b.len()) as u64);
    // Exactly the three files' size fits: the third, not UTF-8, is reported for that.
    let errors = read_sources_within(dir.path(), total + 1).unwrap_err();
    assert_eq!(
        errors.to_string(),
        format!("{}/c.yaml: cannot be read: stream did not contain valid UTF-8", dir.path().display())
    );
    // Within the first two files: the second passes the bound; the third is not read.
    let errors = read_sources_within(dir.path(), total - 1).unwrap_err();
    assert_eq!(
        errors.to_string(),
        format!(
            "{}/b.yaml: is larger than the {} bytes left of the {} one load reads from its rule files \
             (the files before it hold {a_len})",
            dir.path().display(),
            total - 1 - a_len,
            total - 1
        )
    );
    let [error] = errors.errors() else { panic!("one problem expected") };
    assert!(matches!(
        error.kind(),
        ConfigErrorKind::TooLarge { maximum, before } if (*maximum, *before) == (total - 1, a_len)
    ));
    // Within the bound, the texts are the files' own.
    fs::remove_file(dir.path().join("c.yaml")).unwrap();
    let sources = read_sources_within(dir.path(), total).unwrap();
    let texts: Vec<&str> = sources.iter().map(|(_, text)| text.as_str()).collect();
    assert_eq!(texts, [a.as_str(), b.as_str()]);
}

#[test]
fn a_rule_file_larger_than_the_bound_is_refused_by_its_size() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("huge.yaml");
    // A sparse file: no disk space, and refused by its size without being read.
    fs::File::create(&path).unwrap().set_len(MAX_RULE_FILE_BYTES + 1).unwrap();
    assert_eq!(
        RuleTable::load(&path).unwrap_err().to_string(),
        format!(
            "{}: is larger than 67108864 bytes, the most one load reads from its rule files",
            path.display()
        )
    );
    // One byte less is read (64 MiB of zeros), and refused as YAML, not for its size.
    fs::File::create(&path).unwrap().set_len(MAX_RULE_FILE_BYTES).unwrap();
    assert_eq!(
        RuleTable::load(&path).unwrap_err().to_string(),
        format!("{}: control characters are not allowed", path.display())
    );
}

#[cfg(target_os = "linux")]
#[test]
fn a_device_given_as_the_path_is_read_up_to_the_bound() {
    // `/dev/zero` has no end and reports no size: one byte more than the bound is read.
    let errors = read_sources_within(Path::new("/dev/zero"), 1_024).unwrap_err();
    assert_eq!(
        errors.to_string(),
        "/dev/zero: is larger than 1024 bytes, the most one load reads from its rule files"
    );
}

#[cfg(unix)]
#[test]
fn a_named_pipe_or_device_in_the_rule_directory_is_refused_unopened() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "a.yaml", &rules_of("a", 1));
    // No process ever writes to this pipe: opening it would block the load for good.
    let status = std::process::Command::new("mkfifo").arg(dir.path().join("pipe.yaml")).status().unwrap();
    assert!(status.success());
    std::os::unix::fs::symlink("/dev/null", dir.path().join("null.yml")).unwrap();
    let errors = RuleTable::load(dir.path()).unwrap_err();
    let message = "is not a regular file (a named pipe, socket or device); only regular files are read as \
                   rule files";
    assert_eq!(
        errors.to_string(),
        format!("{0}/null.yml: {message}\n{0}/pipe.yaml: {message}", dir.path().display())
    );
    assert!(errors.errors().iter().all(|error| matches!(error.kind(), ConfigErrorKind::NotAFile)));
}

#[test]
fn a_file_path_is_read_whatever_its_name() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "rules.conf", &rules_of("d", 3));
    let table = RuleTable::load(&dir.path().join("rules.conf")).unwrap();
    assert_eq!(table.files(), [dir.path().join("rules.conf")]);
    assert_eq!(table.describe(), lines(&["d.k: 3 per second (fixed_window)"]));
}

#[test]
fn a_directory_is_read_in_name_order_without_dotfiles_other_files_or_subdirectories() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path();
    write(path, "b.yml", &rules_of("b", 2));
    write(path, "a.yaml", &rules_of("a", 1));
    write(path, "C.yaml", &rules_of("c", 3));
    write(path, "a.yaml.bak", "not: [yaml");
    write(path, "README.md", "# rules");
    write(path, "x.YAML", "not: [yaml");
    write(path, ".a.yaml", "not: [yaml");
    fs::create_dir(path.join("nested.yaml")).unwrap();
    write(&path.join("nested.yaml"), "inner.yaml", "not: [yaml");
    let table = RuleTable::load(path).unwrap();
    assert_eq!(table.files(), [path.join("C.yaml"), path.join("a.yaml"), path.join("b.yml")]);
    assert_eq!(table.domain_count(), 3);
    assert_eq!(
        table.describe(),
        lines(&[
            "a.k: 1 per second (fixed_window)",
            "b.k: 2 per second (fixed_window)",
            "c.k: 3 per second (fixed_window)"
        ])
    );
}

#[test]
fn a_duplicate_domain_in_a_directory_names_the_earlier_file_by_name_order() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "2.yaml", &rules_of("d", 2));
    write(dir.path(), "1.yaml", &rules_of("d", 1));
    assert_eq!(
        RuleTable::load(dir.path()).unwrap_err().to_string(),
        format!(
            "{0}/2.yaml: domain: `d` is already defined in {0}/1.yaml; each domain's rules live in one file",
            dir.path().display()
        )
    );
}

#[cfg(unix)]
#[test]
fn symbolic_links_are_followed_as_in_a_configmap_mount() {
    use std::os::unix::fs::symlink;

    // A Kubernetes ConfigMap volume: the files live in a timestamped directory reached through
    // `..data`, and each visible name is a link to `..data/NAME`.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path();
    let data = path.join("..2026_12_04_07_34_34.123456789");
    fs::create_dir(&data).unwrap();
    write(&data, "edge.yaml", &rules_of("edge", 5));
    write(&data, "api.yaml", &rules_of("api", 6));
    symlink(&data, path.join("..data")).unwrap();
    symlink(Path::new("..data/edge.yaml"), path.join("edge.yaml")).unwrap();
    symlink(Path::new("..data/api.yaml"), path.join("api.yaml")).unwrap();
    // A link to a directory is skipped, as a subdirectory is.
    symlink(&data, path.join("dir.yaml")).unwrap();
    let table = RuleTable::load(path).unwrap();
    assert_eq!(table.files(), [path.join("api.yaml"), path.join("edge.yaml")]);
    assert_eq!(
        table.describe(),
        lines(&["api.k: 6 per second (fixed_window)", "edge.k: 5 per second (fixed_window)"])
    );
    // A link given as the path is followed too.
    let table = RuleTable::load(&path.join("edge.yaml")).unwrap();
    assert_eq!(table.describe(), lines(&["edge.k: 5 per second (fixed_window)"]));
    // A dangling link named like a rule file refuses the whole directory (its domain's limits
    // would otherwise vanish), and so does a link loop.
    for (name, target, why) in [
        ("gone.yaml", "..data/gone.yaml", "No such file or directory (os error 2)"),
        ("loop.yaml", "loop.yaml", "Too many levels of symbolic links (os error 40)"),
    ] {
        symlink(Path::new(target), path.join(name)).unwrap();
        let error = RuleTable::load(path).unwrap_err();
        assert_eq!(error.to_string(), format!("{}: cannot be read: {why}", path.join(name).display()));
        fs::remove_file(path.join(name)).unwrap();
    }
    // Both at once: each is reported.
    symlink(Path::new("..data/gone.yaml"), path.join("gone.yaml")).unwrap();
    symlink(Path::new("loop.yaml"), path.join("loop.yaml")).unwrap();
    assert_eq!(
        RuleTable::load(path).unwrap_err().to_string(),
        format!(
            "{}: cannot be read: No such file or directory (os error 2)\n\
             {}: cannot be read: Too many levels of symbolic links (os error 40)",
            path.join("gone.yaml").display(),
            path.join("loop.yaml").display()
        )
    );
}

#[test]
fn a_byte_order_mark_is_not_part_of_the_document() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "bom.yaml", &format!("\u{feff}{}", rules_of("bom", 3)));
    let table = RuleTable::load(dir.path()).unwrap();
    assert_eq!(table.describe(), lines(&["bom.k: 3 per second (fixed_window)"]));
}

/// A rule file of `levels` descriptor levels, in block style, the deepest one limited:
/// `levels × 2 + 2` nested maps and lists (its `rate_limit` map included).
fn nested_rules(levels: usize) -> String {
    let mut text = String::from("domain: deep\ndescriptors:\n");
    for level in 0..levels {
        let indent = "    ".repeat(level);
        let _ = writeln!(text, "{indent}  - key: k{level}");
        if level + 1 < levels {
            let _ = writeln!(text, "{indent}    descriptors:");
        } else {
            let _ = writeln!(text, "{indent}    rate_limit: {{unit: second, requests_per_unit: 1}}");
        }
    }
    text
}

#[test]
fn sixty_three_descriptor_levels_are_read_and_sixty_four_are_too_deep() {
    let table = table(&nested_rules(63));
    assert_eq!(table.rule_count(), 1);
    // The 129th collection is the 64th level's own map, on its `key` line (the last but one).
    assert_eq!(
        problem("deep.yaml", &nested_rules(64)),
        "deep.yaml: nests maps and lists more than 128 levels deep (by line 129 column 257); a rule \
         file may nest 128, which is 63 descriptor levels"
    );
}

#[test]
fn deep_flow_nesting_is_refused_before_the_yaml_reader_reads_it() {
    // Flow maps and lists nested 8,000 deep (200 KB): libyaml, which reads the whole document
    // before serde_norway's depth limit applies, took seconds on it (a minute at 1 MB); the
    // depth check stops where its own parser's flow depth limit (255 levels) does.
    let levels = 8_000;
    let text = format!(
        "domain: d\ndescriptors: {}[]{}\n",
        "[{key: a, descriptors: ".repeat(levels),
        "}]".repeat(levels)
    );
    assert_eq!(
        problem("flow.yaml", &text),
        "flow.yaml: nests maps and lists more than 128 levels deep (by line 2 column 2936); a rule \
         file may nest 128, which is 63 descriptor levels"
    );
    // Flow nesting within the limit is read as block nesting is.
    let flow = "domain: d\ndescriptors: [{key: a, descriptors: [{key: b, rate_limit: {unit: second, \
                requests_per_unit: 2}}]}]\n";
    assert_eq!(table(flow).describe(), lines(&["d.a.b: 2 per second (fixed_window)"]));
}

#[test]
fn merge_keys_are_applied_with_a_maps_own_keys_first() {
    // envoyproxy/ratelimit's YAML reader applies `<<` (https://yaml.org/type/merge.html).
    let text = "domain: merged
descriptors:
  - key: a
    rate_limit: &per_second
      unit: second
      requests_per_unit: 10
  - key: b
    rate_limit:
      <<: *per_second
      requests_per_unit: 20
  - &shadowed
    key: c
    shadow_mode: true
    rate_limit:
      <<: [{unit: minute}, *per_second]
      requests_per_unit: 30
  - <<: *shadowed
    key: d
";
    assert_eq!(
        table(text).describe(),
        lines(&[
            "merged.a: 10 per second (fixed_window)",
            "merged.b: 20 per second (fixed_window)",
            "merged.c: 30 per minute (fixed_window) [shadow]",
            "merged.d: 30 per minute (fixed_window) [shadow]",
        ])
    );
}

#[test]
fn a_merged_file_has_its_problems_reported_with_their_paths() {
    let defaults = "domain: d\ndefaults: &defaults\n  unit: second\ndescriptors:\n";
    // Defaults kept under a key of their own are an unknown field, merged or not, as in
    // envoyproxy/ratelimit, which validates every key; the anchor goes on a first use instead.
    assert_eq!(
        problem(
            "merge.yaml",
            &format!("{defaults}  - key: a\n    rate_limit:\n      <<: *defaults\n      rpu: 1\n")
        ),
        "merge.yaml: defaults: unknown field `defaults`, expected `domain` or `descriptors`"
    );
    let text = "domain: d
descriptors:
  - key: a
    rate_limit: &limit
      unit: second
      requests_per_unit: 1
  - key: b
    rate_limit:
      <<: *limit
      requests_per_unit: many
";
    assert_eq!(
        problem("merge.yaml", text),
        "merge.yaml: descriptors[1].rate_limit.requests_per_unit: invalid type: string \"many\", expected u32"
    );
    assert_eq!(
        problem("merge.yaml", "domain: d\ndescriptors:\n  - <<: 5\n    key: a\n"),
        "merge.yaml: descriptors[0].<<: is the number 5; a merge key `<<` takes a map or a list of maps"
    );
    assert_eq!(
        problem("merge.yaml", "domain: d\ndescriptors:\n  - <<: [{key: a}, b]\n"),
        "merge.yaml: descriptors[0].<<[1]: is the string \"b\"; a merge key `<<` takes a map or a list of maps"
    );
}

#[test]
fn merges_chain_and_leave_scalars_strings_as_without_merges() {
    // A merged map's own `<<` is resolved first; `value: 500` and `key: 1` are strings, as
    // they are in a file without merges; `<<` inside `metadata` is left alone.
    let text = "domain: 2024
descriptors:
  - key: 1
    value: 500
    metadata: {<<: 5}
    rate_limit: &minute
      unit: minute
      requests_per_unit: 1
  - key: b
    value: true
    rate_limit: &hourly
      <<: *minute
      unit: hour
  - key: c
    rate_limit:
      <<: *hourly
      requests_per_unit: 3
";
    assert_eq!(
        table(text).describe(),
        lines(&[
            "2024.1_500: 1 per minute (fixed_window)",
            "2024.b_true: 1 per hour (fixed_window)",
            "2024.c: 3 per hour (fixed_window)",
        ])
    );
    let without_merges = "domain: 2024
descriptors:
  - {key: 1, value: 500, rate_limit: {unit: minute, requests_per_unit: 1}}
  - {key: b, value: true, rate_limit: {unit: hour, requests_per_unit: 1}}
  - {key: c, rate_limit: {unit: hour, requests_per_unit: 3}}
";
    assert_eq!(table(without_merges).describe(), table(text).describe());
}

// --- Valid rules: envoyproxy/ratelimit's README examples ---

#[test]
fn readme_example_1_two_values_of_one_key() {
    let text = include_str!("../../tests/envoy-ratelimit/readme/example1.yaml");
    let table = table(text);
    assert_eq!((table.domain_count(), table.rule_count()), (1, 2));
    assert_eq!(
        table.describe(),
        lines(&[
            "mongo_cps.database_default: 500 per second (fixed_window)",
            "mongo_cps.database_users: 500 per second (fixed_window)",
        ])
    );
}

#[test]
fn readme_example_2_nested_and_top_level_key_only_rules() {
    let text = include_str!("../../tests/envoy-ratelimit/readme/example2.yaml");
    let table = table(text);
    assert_eq!(table.rule_count(), 2);
    assert_eq!(
        table.describe(),
        lines(&[
            "messaging.message_type_marketing.to_number: 5 per day (fixed_window)",
            "messaging.to_number: 100 per day (fixed_window)",
        ])
    );
}

#[test]
fn readme_example_3_a_black_listed_value() {
    let text = include_str!("../../tests/envoy-ratelimit/readme/example3.yaml");
    let table = table(text);
    assert_eq!(
        table.describe(),
        lines(&[
            "edge_proxy_per_ip.remote_address: 10 per second (fixed_window)",
            "edge_proxy_per_ip.remote_address_50.0.0.5: 0 per second (fixed_window)",
        ])
    );
    // A limit of 0 has no policy: every request is denied without touching storage.
    let black = rule(&table, "edge_proxy_per_ip", "edge_proxy_per_ip.remote_address_50.0.0.5");
    assert!(matches!(black.quota, Quota::Limited { requests_per_unit: 0, unit: Unit::Second, policy: None }));
    let per_ip = rule(&table, "edge_proxy_per_ip", "edge_proxy_per_ip.remote_address");
    assert!(matches!(
        per_ip.quota,
        Quota::Limited { requests_per_unit: 10, unit: Unit::Second, policy: Some(_) }
    ));
}

#[test]
fn readme_example_4_both_files() {
    let flat = include_str!("../../tests/envoy-ratelimit/readme/example4.yaml");
    let nested = include_str!("../../tests/envoy-ratelimit/readme/example4-nested.yaml");
    assert_eq!(table(flat).describe(), lines(&["example4.key_value: 300 per second (fixed_window)"]));
    assert_eq!(
        table(nested).describe(),
        lines(&["example4.key_value.subkey: 300 per second (fixed_window)"])
    );
}

#[test]
fn readme_example_5_unlimited() {
    let text = include_str!("../../tests/envoy-ratelimit/readme/example5.yaml");
    let table = table(text);
    assert_eq!(table.rule_count(), 2);
    assert_eq!(
        table.describe(),
        lines(&["internal.azure: 100 per minute (fixed_window)", "internal.ldap: unlimited"])
    );
    assert!(matches!(rule(&table, "internal", "internal.ldap").quota, Quota::Unlimited));
}

#[test]
fn readme_example_6_shadow_mode() {
    let text = include_str!("../../tests/envoy-ratelimit/readme/example6.yaml");
    let table = table(text);
    assert_eq!(
        table.describe(),
        lines(&[
            "example6.service.user_user-a: 10 per second (fixed_window) [shadow]",
            "example6.service.user_user-b: 20 per second (fixed_window)",
        ])
    );
    let shadow = rule(&table, "example6", "example6.service.user_user-a");
    assert!(shadow.shadow);
    let Quota::Limited { policy: Some(RulePolicy::FixedWindow(policy)), .. } = &shadow.quota else {
        panic!("a fixed-window policy expected: {:?}", shadow.quota)
    };
    assert_eq!(runlimit_core::RateLimitPolicy::quota_mode(policy), QuotaMode::Shadow);
    assert!(!rule(&table, "example6", "example6.service.user_user-b").shadow);
}

#[test]
fn readme_example_7_replaces() {
    let text = include_str!("../../tests/envoy-ratelimit/readme/example7.yaml");
    let table = table(text);
    assert_eq!(
        table.describe(),
        lines(&[
            "example7.key_1_value_1.user_bkthomps: 5 per second (fixed_window)",
            "example7.key_2_value_2.user_bkthomps: 10 per second (fixed_window)",
        ])
    );
    let named = rule(&table, "example7", "example7.key_1_value_1.user_bkthomps");
    assert_eq!(named.name.as_deref(), Some("specific_limit"));
    assert_eq!(named.header_name.as_str(), "specific_limit");
    let replacing = rule(&table, "example7", "example7.key_2_value_2.user_bkthomps");
    assert_eq!(replacing.replaces.iter().map(|name| &**name).collect::<Vec<_>>(), ["specific_limit"]);
    assert_eq!(replacing.header_name.as_str(), "example7.key_2_value_2.user_bkthomps");
}

#[test]
fn readme_example_8_detailed_metric() {
    let text = include_str!("../../tests/envoy-ratelimit/readme/example8.yaml");
    assert_eq!(
        table(text).describe(),
        lines(&[
            "example8.key1: 10 per minute (fixed_window)",
            "example8.key1_value1: 20 per minute (fixed_window)"
        ])
    );
    // `detailed_metric` is carried to the rule it is written on (it names the rule's metric
    // series by the request's values), and only to it.
    assert!(rule(&table(text), "example8", "example8.key1").detailed_metric);
    assert!(!rule(&table(text), "example8", "example8.key1_value1").detailed_metric);
}

#[test]
fn readme_example_9_wildcards() {
    let trailing = include_str!("../../tests/envoy-ratelimit/readme/example9.yaml");
    let middle = include_str!("../../tests/envoy-ratelimit/readme/example9-middle.yaml");
    let multiple = include_str!("../../tests/envoy-ratelimit/readme/example9-several.yaml");
    assert_eq!(table(trailing).describe(), lines(&["example9.key1_value*: 20 per minute (fixed_window)"]));
    assert_eq!(
        table(middle).describe(),
        lines(&["example9.path_/api/*/action: 20 per minute (fixed_window)"])
    );
    assert_eq!(
        table(multiple).describe(),
        lines(&["example9.route_/api/*/resource/*/action: 20 per minute (fixed_window)"])
    );
    let table = table(multiple);
    let domain = table.domain("example9").unwrap();
    assert!(domain.root.keys.is_empty());
    assert_eq!(domain.root.wildcards.len(), 1);
    assert_eq!(domain.root.wildcards[0].1.share, None);
}

#[test]
fn readme_example_10_value_to_metric() {
    let text = "domain: example10
descriptors:
  - key: route
    value_to_metric: true
    descriptors:
      - key: http_method
        value_to_metric: true
        descriptors:
          - key: subject_id
            rate_limit:
              unit: minute
              requests_per_unit: 60
";
    assert_eq!(
        table(text).describe(),
        lines(&["example10.route.http_method.subject_id: 60 per minute (fixed_window)"])
    );
}

#[test]
fn readme_example_11_share_threshold() {
    let text = "domain: example11
descriptors:
  # With share_threshold: true, all files/* matches share the same threshold
  - key: files
    value: files/*
    share_threshold: true
    rate_limit:
      unit: hour
      requests_per_unit: 10

  # Without share_threshold, each files_no_share/* match has its own isolated threshold
  - key: files_no_share
    value: files_no_share/*
    share_threshold: false
    rate_limit:
      unit: hour
      requests_per_unit: 10
";
    let table = table(text);
    assert_eq!(
        table.describe(),
        lines(&[
            "example11.files_files/*: 10 per hour (fixed_window)",
            "example11.files_no_share_files_no_share/*: 10 per hour (fixed_window)",
        ])
    );
    let wildcards = &table.domain("example11").unwrap().root.wildcards;
    let shares: Vec<_> = wildcards.iter().map(|(_, node)| node.share.as_deref()).collect();
    assert_eq!(shares, [Some("files_files/*"), None]);
}

#[test]
fn readme_rules_in_one_table() {
    let sources = [
        (
            "messaging.yaml",
            "domain: messaging\ndescriptors:\n  - key: to_number\n    rate_limit: {unit: day, requests_per_unit: 100}\n",
        ),
        (
            "internal.yaml",
            "domain: internal\ndescriptors:\n  - key: ldap\n    rate_limit: {unlimited: true}\n",
        ),
    ];
    let table = RuleTable::from_sources(sources).unwrap();
    assert_eq!((table.domain_count(), table.rule_count()), (2, 2));
    assert_eq!(table.files(), [Path::new("messaging.yaml"), Path::new("internal.yaml")]);
    assert_eq!(
        format!("{table:?}"),
        "RuleTable { domains: 2, rules: 2, files: [\"messaging.yaml\", \"internal.yaml\"] }"
    );
}

// --- Units, algorithms, describe ---

#[test]
fn units_in_any_letter_case_with_their_lengths() {
    let text = "domain: d
descriptors:
  - {key: a, rate_limit: {unit: second, requests_per_unit: 1}}
  - {key: b, rate_limit: {unit: Minute, requests_per_unit: 1}}
  - {key: c, rate_limit: {unit: HOUR, requests_per_unit: 1}}
  - {key: d, rate_limit: {unit: dAy, requests_per_unit: 1}}
  - {key: e, rate_limit: {unit: week, requests_per_unit: 1}}
  - {key: f, rate_limit: {unit: MONTH, requests_per_unit: 1}}
  - {key: g, rate_limit: {unit: Year, requests_per_unit: 1}}
";
    assert_eq!(
        table(text).describe(),
        lines(&[
            "d.a: 1 per second (fixed_window)",
            "d.b: 1 per minute (fixed_window)",
            "d.c: 1 per hour (fixed_window)",
            "d.d: 1 per day (fixed_window)",
            "d.e: 1 per week (fixed_window)",
            "d.f: 1 per month (fixed_window)",
            "d.g: 1 per year (fixed_window)",
        ])
    );
    let seconds: Vec<u64> = Unit::ALL.iter().map(|unit| unit.seconds()).collect();
    assert_eq!(seconds, [1, 60, 3_600, 86_400, 604_800, 2_592_000, 31_536_000]);
    assert_eq!(Unit::from_name("WeEk"), Some(Unit::Week));
    assert_eq!(Unit::from_name("weeks"), None);
    assert_eq!(Unit::Month.duration(), Duration::from_secs(2_592_000));
}

#[test]
fn gcra_rules_describe_their_burst() {
    let text = "domain: api
descriptors:
  - key: api_key
    rate_limit:
      algorithm: gcra
      unit: second
      requests_per_unit: 10
      burst: 20
  - key: user
    rate_limit: {algorithm: gcra, unit: minute, requests_per_unit: 60}
  - key: blocked
    rate_limit: {algorithm: gcra, unit: minute, requests_per_unit: 0}
";
    let table = table(text);
    assert_eq!(table.domain("api").unwrap().algorithm, Algorithm::Gcra);
    assert_eq!(
        table.describe(),
        lines(&[
            "api.api_key: 10 per second (gcra, burst 20)",
            "api.blocked: 0 per minute (gcra)",
            "api.user: 60 per minute (gcra, burst 60)",
        ])
    );
}

#[test]
fn describe_sorts_every_domain_by_path() {
    let a = "domain: b\ndescriptors:\n  - key: z\n    rate_limit: {unit: second, requests_per_unit: 1}\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 2}\n";
    let b = "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 3}\n    shadow_mode: true\n";
    let table = RuleTable::from_sources([("1.yaml", a), ("2.yaml", b)]).unwrap();
    assert_eq!(
        table.describe(),
        lines(&[
            "a.k: 3 per second (fixed_window) [shadow]",
            "b.a: 2 per second (fixed_window)",
            "b.z: 1 per second (fixed_window)",
        ])
    );
}

#[test]
fn global_shadow_mode_marks_every_limited_rule() {
    let text = "domain: d
descriptors:
  - key: a
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: b
    rate_limit: {unlimited: true}
  - key: c
    rate_limit: {unit: second, requests_per_unit: 0}
";
    assert_eq!(
        table(text).into_shadow().describe(),
        lines(&[
            "d.a: 1 per second (fixed_window) [shadow]",
            "d.b: unlimited",
            "d.c: 0 per second (fixed_window) [shadow]",
        ])
    );
}

#[test]
fn only_rules_with_a_rate_limit_are_rules() {
    let text = "domain: d
descriptors:
  - key: a
    value: placeholder
    descriptors:
      - key: b
        value: whitelisted
      - key: c
        rate_limit: {unit: second, requests_per_unit: 1}
  - key: e
    rate_limit:
";
    let table = table(text);
    assert_eq!(table.rule_count(), 1);
    assert_eq!(table.describe(), lines(&["d.a_placeholder.c: 1 per second (fixed_window)"]));
    let domain = table.domain("d").unwrap();
    let placeholder = &domain.root.keys["a"].values["placeholder"];
    assert_eq!(placeholder.rule, None);
    assert_eq!(placeholder.children.keys["b"].values["whitelisted"].rule, None);
    assert_eq!(domain.root.keys["e"].default.as_ref().map(|node| node.rule), Some(None));
}

// --- Names and policy identity ---

#[test]
fn header_names_are_the_name_else_the_path_else_the_policy_identifier() {
    let text = "domain: d
descriptors:
  - key: a
    rate_limit: {unit: second, requests_per_unit: 1, name: my limit}
  - key: b
    value: caf\u{e9}
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: c
    rate_limit: {unit: second, requests_per_unit: 1, name: \"\"}
";
    let table = table(text);
    assert_eq!(rule(&table, "d", "d.a").header_name.as_str(), "my limit");
    assert_eq!(rule(&table, "d", "d.c").header_name.as_str(), "d.c");
    assert_eq!(rule(&table, "d", "d.c").name, None);
    let accented = rule(&table, "d", "d.b_caf\u{e9}");
    let Quota::Limited { policy: Some(RulePolicy::FixedWindow(policy)), .. } = &accented.quota else {
        panic!("a fixed-window policy expected")
    };
    let id = runlimit_core::RateLimitPolicy::id(policy).as_str().to_owned();
    assert_eq!(accented.header_name.as_str(), id);
    assert_eq!((id.len(), &id[..4]), (28, "rls."));
}

#[test]
fn policy_identifiers_depend_on_domain_and_path_only() {
    let id = |text: &str, path: &str| {
        let table = table(text);
        let rule = rule(&table, text.lines().next().unwrap().trim_start_matches("domain: "), path);
        match &rule.quota {
            Quota::Limited { policy: Some(RulePolicy::FixedWindow(policy)), .. } => {
                runlimit_core::RateLimitPolicy::id(policy).as_str().to_owned()
            }
            Quota::Limited { policy: Some(RulePolicy::Gcra(policy)), .. } => {
                runlimit_core::RateLimitPolicy::id(policy).as_str().to_owned()
            }
            quota => panic!("no policy: {quota:?}"),
        }
    };
    let base = id(
        "domain: d\ndescriptors:\n  - {key: a, value: b, rate_limit: {unit: second, requests_per_unit: 1}}\n",
        "d.a_b",
    );
    let other_limit = id(
        "domain: d\ndescriptors:\n  - {key: x}\n  - {key: a, value: b, rate_limit: {unit: hour, requests_per_unit: 9, name: n, algorithm: gcra}}\n",
        "d.a_b",
    );
    let key_only = id(
        "domain: d\ndescriptors:\n  - {key: a_b, rate_limit: {unit: second, requests_per_unit: 1}}\n",
        "d.a_b",
    );
    let other_domain = id(
        "domain: e\ndescriptors:\n  - {key: a, value: b, rate_limit: {unit: second, requests_per_unit: 1}}\n",
        "e.a_b",
    );
    assert_eq!(base, other_limit);
    assert_ne!(base, key_only);
    assert_ne!(base, other_domain);
    assert_eq!(base, policy_id("rule", "d", [("a", Some("b"))]).as_str());
}

// --- restarted_counters ---

#[test]
fn restarted_counters_lists_changed_limits_units_algorithms_and_bursts() {
    let old = RuleTable::from_sources([
        (
            "f.yaml",
            "domain: f
descriptors:
  - key: same
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: limit
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: unit
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: renamed
    rate_limit: {unit: minute, requests_per_unit: 10, name: old}
  - key: gone
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: shadow
    rate_limit: {unit: minute, requests_per_unit: 10}
",
        ),
        ("g.yaml", "domain: g\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 5}\n"),
        (
            "h.yaml",
            "domain: h\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 5, algorithm: gcra}\n",
        ),
    ])
    .unwrap();
    let new = RuleTable::from_sources([
        (
            "f.yaml",
            "domain: f
descriptors:
  - key: new
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: shadow
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: renamed
    rate_limit: {unit: minute, requests_per_unit: 10, name: new}
  - key: unit
    rate_limit: {unit: MINUTE, requests_per_unit: 10}
  - key: limit
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: same
    rate_limit: {unit: hour, requests_per_unit: 10}
",
        ),
        ("g.yaml", "domain: g\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 5, algorithm: gcra}\n"),
        (
            "h.yaml",
            "domain: h\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 5, algorithm: gcra, burst: 6}\n",
        ),
    ])
    .unwrap();
    assert_eq!(
        new.restarted_counters(&old),
        lines(&[
            "f.limit: 10 per minute (fixed_window) -> 20 per minute (fixed_window)",
            "f.same: 10 per minute (fixed_window) -> 10 per hour (fixed_window)",
            "g.a: 5 per second (fixed_window) -> 5 per second (gcra, burst 5)",
            "h.a: 5 per second (gcra, burst 5) -> 5 per second (gcra, burst 6)",
        ])
    );
    assert_eq!(old.restarted_counters(&old), Vec::<String>::new());
}

#[test]
fn restarted_counters_ignores_new_domains_and_lists_unlimited_changes() {
    let old =
        table("domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 5}\n");
    let new = RuleTable::from_sources([
        ("d.yaml", "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unlimited: true}\n"),
        (
            "e.yaml",
            "domain: e\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
        ),
    ])
    .unwrap();
    assert_eq!(new.restarted_counters(&old), lines(&["d.a: 5 per second (fixed_window) -> unlimited"]));
    assert_eq!(old.restarted_counters(&new), lines(&["d.a: unlimited -> 5 per second (fixed_window)"]));
}

/// Regression: rules were paired by their path text, and key `a_b` has the same text as key `a`
/// with value `b`, so an unchanged table listed a restart between the two.
#[test]
fn restarted_counters_pairs_rules_by_key_and_value_not_by_path_text() {
    let text = "domain: d
descriptors:
  - key: a
    value: b
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: a_b
    rate_limit: {unit: minute, requests_per_unit: 20}
";
    assert_eq!(table(text).restarted_counters(&table(text)), Vec::<String>::new());
    let changed = text.replace("requests_per_unit: 20", "requests_per_unit: 5");
    assert_eq!(
        table(&changed).restarted_counters(&table(text)),
        lines(&["d.a_b: 20 per minute (fixed_window) -> 5 per minute (fixed_window)"])
    );
}

/// Turning `share_threshold` on or off changes which values share a counter: every counter of
/// the rule starts afresh, and the change is listed.
#[test]
fn restarted_counters_lists_share_threshold_changes_along_the_path() {
    let shared = "domain: d
descriptors:
  - key: files
    value: files/*
    share_threshold: true
    rate_limit: {unit: hour, requests_per_unit: 2}
  - key: route
    value: api/*
    share_threshold: true
    descriptors:
      - key: method
        rate_limit: {unit: minute, requests_per_unit: 60}
";
    let separate = shared.replace("share_threshold: true", "share_threshold: false");
    assert_eq!(
        table(&separate).restarted_counters(&table(shared)),
        lines(&[
            "d.files_files/*: 2 per hour (fixed_window), shared by `files_files/*` -> 2 per hour (fixed_window)",
            "d.route_api/*.method: 60 per minute (fixed_window), shared by `route_api/*` -> 60 per minute \
             (fixed_window)",
        ])
    );
    assert_eq!(table(shared).restarted_counters(&table(shared)), Vec::<String>::new());
}

// --- Control characters of keys and values, escaped wherever they are shown ---

/// An unknown key holding a line feed and a terminal escape (YAML's `\n` and `\e` in double
/// quotes): in the YAML reader's message.
const UNKNOWN_CONTROLS: &str = "domain: u\ndescriptors:\n  - key: a\n    \"bad\\nkey\\e[31m\": 1\n";

/// A unit and a rule key (in a duplicate's path) holding them.
const CONTROLS: &str = r#"domain: d
descriptors:
  - key: "k\n\e[2J"
    rate_limit: { unit: minute, requests_per_unit: 1 }
  - key: "k\n\e[2J"
    rate_limit: { unit: "min\nute\e[0m", requests_per_unit: 1 }
"#;

/// An unknown key with a tab and an escape brought in by a merge key: in the document path too.
const MERGED_CONTROLS: &str = "domain: m\ndescriptors:\n  - key: m\n    <<: { \"\\t\\e\": 1 }\n";

/// Regression: the control characters were printed raw, so one problem spanned several lines
/// and could drive the terminal showing it. Each is escaped as `char::escape_debug` writes it.
#[test]
fn control_characters_of_keys_and_values_are_escaped_in_problems() {
    let text = problems([
        ("unknown.yaml", UNKNOWN_CONTROLS),
        ("controls.yaml", CONTROLS),
        ("merged.yaml", MERGED_CONTROLS),
    ]);
    assert_eq!(
        text.lines().collect::<Vec<_>>(),
        [
            "unknown.yaml: descriptors[0]: unknown field `bad\\nkey\\u{1b}[31m`, expected one of `key`, `value`, \
             `rate_limit`, `descriptors`, `shadow_mode`, `quota_mode`, `detailed_metric`, `value_to_metric`, \
             `share_threshold`, `metadata` at line 4 column 5",
            "controls.yaml: descriptors[1]: duplicates the rule `d.k\\n\\u{1b}[2J` of the same list (same key and \
             value)",
            "controls.yaml: descriptors[1].rate_limit.unit: unknown unit `min\\nute\\u{1b}[0m`; expected one of second, \
             minute, hour, day, week, month, year (any letter case)",
            "merged.yaml: descriptors[0].\\t\\u{1b}: unknown field `\\t\\u{1b}`, expected one of `key`, `value`, \
             `rate_limit`, `descriptors`, `shadow_mode`, `quota_mode`, `detailed_metric`, `value_to_metric`, \
             `share_threshold`, `metadata`",
        ]
    );
    // Each problem is one line, and nothing else is a control character.
    assert!(!text.replace('\n', "").contains(char::is_control), "{text:?}");
}

/// A problem's kind displays its values escaped too; its fields keep them as found.
#[test]
fn a_problem_keeps_the_values_as_found_and_displays_them_escaped() {
    let sources =
        [("unknown.yaml", UNKNOWN_CONTROLS), ("controls.yaml", CONTROLS), ("merged.yaml", MERGED_CONTROLS)];
    let Err(errors) = RuleTable::from_sources(sources) else { panic!("valid") };
    let unit = &errors.errors()[2];
    assert!(matches!(unit.kind(), ConfigErrorKind::InvalidUnit { unit } if unit == "min\nute\u{1b}[0m"));
    assert_eq!(
        unit.kind().to_string(),
        "unknown unit `min\\nute\\u{1b}[0m`; expected one of second, minute, hour, day, week, month, year (any \
         letter case)"
    );
    let ConfigErrorKind::Yaml { message } = errors.errors()[3].kind() else {
        panic!("{:?}", errors.errors()[3])
    };
    assert!(
        message.starts_with("descriptors[0].\t\u{1b}: unknown field `\t\u{1b}`, expected"),
        "{message:?}"
    );
}

/// Regression: `describe`, `dump` (`/rlconfig`) and `restarted_counters` (`check-config
/// --previous`, the reload's warnings) printed rule paths with their control characters raw.
#[test]
fn rule_lines_escape_the_control_characters_of_keys_and_values() {
    let rules = |limit: u32| {
        table(&format!(
            "domain: \"d\\e\"\ndescriptors:\n  - key: \"k\\n\\e[2J\"\n    value: \"v\\r\"\n    rate_limit: {{ unit: \
             minute, requests_per_unit: {limit} }}\n"
        ))
    };
    let (old, new) = (rules(1), rules(2));
    assert_eq!(new.describe(), lines(&["d\\u{1b}.k\\n\\u{1b}[2J_v\\r: 2 per minute (fixed_window)"]));
    assert_eq!(
        new.dump(),
        lines(&["d\\u{1b}.k\\n\\u{1b}[2J_v\\r: unit=MINUTE requests_per_unit=2, shadow_mode: false"])
    );
    assert_eq!(
        new.restarted_counters(&old),
        lines(&["d\\u{1b}.k\\n\\u{1b}[2J_v\\r: 1 per minute (fixed_window) -> 2 per minute (fixed_window)"])
    );
}
