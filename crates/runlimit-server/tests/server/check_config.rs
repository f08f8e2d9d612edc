//! `runlimit-server check-config PATH [--previous OLD]`, run as the built binary: the summary
//! line and exit 0 for valid rules, every problem on stderr and exit 1 for invalid ones, and
//! the counters a change restarts.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

/// What a run printed and how it exited.
#[derive(Debug, PartialEq, Eq)]
struct Run {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

fn check_config(args: &[&Path]) -> Run {
    let output = Command::new(env!("CARGO_BIN_EXE_runlimit-server"))
        .arg("check-config")
        .args(args)
        // The command must not depend on the server's environment.
        .env_remove("RUNLIMIT_CONFIG")
        .output()
        .expect("the binary runs");
    Run {
        code: output.status.code(),
        stdout: String::from_utf8(output.stdout).unwrap(),
        stderr: String::from_utf8(output.stderr).unwrap(),
    }
}

fn ok(stdout: &str) -> Run {
    Run { code: Some(0), stdout: stdout.to_owned(), stderr: String::new() }
}

fn failed(stdout: &str, stderr: &str) -> Run {
    Run { code: Some(1), stdout: stdout.to_owned(), stderr: stderr.to_owned() }
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    fs::write(&path, text).unwrap();
    path
}

/// envoyproxy/ratelimit's README example 2.
const MESSAGING: &str = include_str!("../envoy-ratelimit/readme/example2.yaml");

/// envoyproxy/ratelimit's README example 5.
const INTERNAL: &str = include_str!("../envoy-ratelimit/readme/example5.yaml");

#[test]
fn a_valid_file_prints_the_summary_and_exits_0() {
    let dir = tempfile::tempdir().unwrap();
    let file = write(dir.path(), "messaging.yaml", MESSAGING);
    assert_eq!(
        check_config(&[&file]),
        ok(&format!("{}: valid (1 domain, 2 rules, 1 file)\n", file.display()))
    );
}

#[test]
fn a_valid_directory_counts_every_file() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "messaging.yaml", MESSAGING);
    write(dir.path(), "internal.yml", INTERNAL);
    write(dir.path(), "empty.yaml", "domain: empty\n");
    write(dir.path(), "notes.txt", "not rules");
    write(dir.path(), ".hidden.yaml", "not: [rules");
    assert_eq!(
        check_config(&[dir.path()]),
        ok(&format!("{}: valid (3 domains, 4 rules, 3 files)\n", dir.path().display()))
    );
}

/// Within a `rate_limit` block, problems come in a fixed order (`replaces`, `algorithm`,
/// `burst`, `unit`, `requests_per_unit`), whatever the order of the keys in the file.
#[test]
fn invalid_rules_print_every_problem_on_stderr_and_exit_1() {
    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        "a.yaml",
        "domain: a
descriptors:
  - key: user
    rate_limit:
      unit: minutes
      requests_per_unit: 10
      replaces:
        - name: nothing
  - key: user
",
    );
    write(dir.path(), "b.yaml", "domain: a\n");
    write(dir.path(), "c.yaml", "domain: c\ndescriptors:\n  - key: k\n    ratelimit: {}\n");
    write(dir.path(), "d.yaml", MESSAGING);
    let dir_text = dir.path().display();
    assert_eq!(
        check_config(&[dir.path()]),
        failed(
            "",
            &format!(
                "{dir_text}/a.yaml: descriptors[0].rate_limit.replaces[0].name: `nothing` is the name of no rule in \
                 domain `a`
{dir_text}/a.yaml: descriptors[0].rate_limit.unit: unknown unit `minutes`; expected one of second, minute, hour, \
day, week, month, year (any letter case)
{dir_text}/a.yaml: descriptors[1]: duplicates the rule `a.user` of the same list (same key and value)
{dir_text}/b.yaml: domain: `a` is already defined in {dir_text}/a.yaml; each domain's rules live in one file
{dir_text}/c.yaml: descriptors[0]: unknown field `ratelimit`, expected one of `key`, `value`, `rate_limit`, \
`descriptors`, `shadow_mode`, `quota_mode`, `detailed_metric`, `value_to_metric`, `share_threshold`, `metadata` \
at line 4 column 5
"
            )
        )
    );
}

#[test]
fn a_missing_path_says_why_it_cannot_be_read() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing");
    assert_eq!(
        check_config(&[&missing]),
        failed(
            "",
            &format!("{}: cannot be read: No such file or directory (os error 2)\n", missing.display())
        )
    );
}

#[test]
fn a_directory_without_rule_files_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "rules.json", "{}");
    assert_eq!(
        check_config(&[dir.path()]),
        failed("", &format!("{}: holds no rule file (*.yaml or *.yml)\n", dir.path().display()))
    );
}

/// The rules in service before the change.
const OLD: &str = "domain: api
descriptors:
  - key: same
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: limit
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: unit
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: renamed
    rate_limit: {unit: minute, requests_per_unit: 10, name: before}
  - key: removed
    rate_limit: {unit: minute, requests_per_unit: 10}
";

#[test]
fn previous_lists_the_counters_a_change_restarts() {
    let old = tempfile::tempdir().unwrap();
    write(old.path(), "api.yaml", OLD);
    write(
        old.path(),
        "edge.yaml",
        "domain: edge\ndescriptors:\n  - key: ip\n    rate_limit: {unit: second, requests_per_unit: 5}\n",
    );
    let new = tempfile::tempdir().unwrap();
    // Reordered, one rule renamed (kept), one removed, one added, one in shadow mode (kept).
    write(
        new.path(),
        "api.yaml",
        "domain: api
descriptors:
  - key: added
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: unit
    rate_limit: {unit: hour, requests_per_unit: 10}
  - key: renamed
    rate_limit: {unit: minute, requests_per_unit: 10, name: after}
  - key: limit
    rate_limit: {unit: minute, requests_per_unit: 25}
  - key: same
    shadow_mode: true
    rate_limit: {unit: MINUTE, requests_per_unit: 10}
",
    );
    write(
        new.path(),
        "edge.yaml",
        "domain: edge\ndescriptors:\n  - key: ip\n    rate_limit: {unit: second, requests_per_unit: 5, algorithm: gcra}\n",
    );
    assert_eq!(
        check_config(&[new.path(), Path::new("--previous"), old.path()]),
        ok(&format!(
            "{}: valid (2 domains, 6 rules, 2 files)
counters that restart (every client gets the new limit's full quota at once):
  api.limit: 10 per minute (fixed_window) -> 25 per minute (fixed_window)
  api.unit: 10 per minute (fixed_window) -> 10 per hour (fixed_window)
  edge.ip: 5 per second (fixed_window) -> 5 per second (gcra, burst 5)
",
            new.path().display()
        ))
    );
}

#[test]
fn previous_without_a_restart_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let old = write(dir.path(), "old.yaml", OLD);
    let new = write(dir.path(), "new.yaml", &OLD.replace("name: before", "name: after"));
    assert_eq!(
        check_config(&[&new, Path::new("--previous"), &old]),
        ok(&format!("{}: valid (1 domain, 5 rules, 1 file)\nno rule's counters restart\n", new.display()))
    );
}

#[test]
fn previous_invalid_is_reported_after_the_summary_and_exits_1() {
    let dir = tempfile::tempdir().unwrap();
    let old = write(
        dir.path(),
        "old.yaml",
        "domain: api\ndescriptors:\n  - key: a\n    rate_limit: {unit: second}\n",
    );
    let new = write(dir.path(), "new.yaml", OLD);
    assert_eq!(
        check_config(&[&new, Path::new("--previous"), &old]),
        failed(
            &format!("{}: valid (1 domain, 5 rules, 1 file)\n", new.display()),
            &format!(
                "--previous {0}: {0}: descriptors[0].rate_limit.requests_per_unit: is missing; write the number of \
                 requests allowed per unit (0 denies every request)\n",
                old.display()
            )
        )
    );
}

#[test]
fn invalid_new_rules_are_reported_before_previous_is_read() {
    let dir = tempfile::tempdir().unwrap();
    let new = write(dir.path(), "new.yaml", "- not a map\n");
    let missing = dir.path().join("missing.yaml");
    assert_eq!(
        check_config(&[&new, Path::new("--previous"), &missing]),
        failed(
            "",
            &format!(
                "{}: the document is a list; a rule file is a map with `domain` and `descriptors`\n",
                new.display()
            )
        )
    );
}

/// Regression: the problems printed a file's control characters raw, so one problem spanned
/// several lines and the escape reached the terminal. Each problem is one line now, every control
/// character escaped as Rust's `char::escape_debug` writes it.
#[test]
fn control_characters_in_problems_are_escaped_one_problem_a_line() {
    let dir = tempfile::tempdir().unwrap();
    // A line feed and a terminal escape (YAML's `\n` and `\e` in double quotes) in a key and in a
    // value.
    let unknown = write(
        dir.path(),
        "key.yaml",
        "domain: api\ndescriptors:\n  - key: a\n    rate_limit: {unit: minute, requests_per_unit: 1}\n\
         \x20   \"bad\\nkey\\e[31m\": 1\n",
    );
    let unit = write(
        dir.path(),
        "value.yaml",
        "domain: u\ndescriptors:\n  - key: a\n    rate_limit: {unit: \"min\\nute\\e[0m\", requests_per_unit: 1}\n",
    );
    let run = check_config(&[dir.path()]);
    assert_eq!(
        run,
        failed(
            "",
            &format!(
                "{}: descriptors[0]: unknown field `bad\\nkey\\u{{1b}}[31m`, expected one of `key`, `value`, \
                 `rate_limit`, `descriptors`, `shadow_mode`, `quota_mode`, `detailed_metric`, `value_to_metric`, \
                 `share_threshold`, `metadata` at line 5 column 5\n\
                 {}: descriptors[0].rate_limit.unit: unknown unit `min\\nute\\u{{1b}}[0m`; expected one of second, \
                 minute, hour, day, week, month, year (any letter case)\n",
                unknown.display(),
                unit.display()
            )
        )
    );
    assert_eq!(run.stderr.lines().count(), 2);
    assert!(!run.stderr.contains('\u{1b}'), "{:?}", run.stderr);
}

/// Regression: the counters `--previous` lists named the rule by its path raw.
#[test]
fn previous_escapes_control_characters_in_the_rules_it_lists() {
    let dir = tempfile::tempdir().unwrap();
    let valid = |limit: u32| {
        format!(
            "domain: api\ndescriptors:\n  - key: \"user\\n\\e[2J\"\n    rate_limit: {{unit: minute, \
             requests_per_unit: {limit}}}\n"
        )
    };
    let old = write(dir.path(), "old.yaml", &valid(5));
    let new = write(dir.path(), "new.yaml", &valid(6));
    assert_eq!(
        check_config(&[&new, Path::new("--previous"), &old]),
        ok(&format!(
            "{}: valid (1 domain, 1 rule, 1 file)
counters that restart (every client gets the new limit's full quota at once):
  api.user\\n\\u{{1b}}[2J: 5 per minute (fixed_window) -> 6 per minute (fixed_window)
",
            new.display()
        ))
    );
}
