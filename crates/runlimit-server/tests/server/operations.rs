//! Operating the server, in process: reloading the rule files (exact counters before and after,
//! a Kubernetes ConfigMap's symlink swap, a change only polling can see, invalid files kept
//! out), `POST /json` answering as the gRPC call does, and the health reports following the
//! backend (a Redis of the test's own killed, switched to an evicting policy and back, paused
//! while the server starts).
//!
//! The metrics of reloads are asserted in `operations_processes.rs`, on the binary: a test
//! process has one global metrics recorder.
//!
//! ```text
//! RUNLIMIT_REDIS_TEST_URL=redis://127.0.0.1:6379 \
//!     cargo test -p runlimit-server --test server operations:: -- --include-ignored
//! ```

use crate::backends;
use crate::support;

use std::{
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use backends::{Files, OwnRedis, RedisKeys, redis_url, unique_prefix};
use envoy_types::pb::envoy::service::ratelimit::v3::{
    RateLimitRequest, RateLimitResponse,
    rate_limit_response::{Code, DescriptorStatus, rate_limit::Unit},
};
use runlimit_redis::{KeyPrefix, RedisConfig};
use runlimit_server::{Backend, HeaderFormat, RuleTable, Server, Service, ServiceOptions};
use support::{
    Client, HOUR, MINUTE, RLS_SERVICE, StatusView, TestServer, call, call_error, descriptor, eventually,
    grpc_health, hasher, http, memory, request, request_of, rules, views, with_hits, with_override,
};
use tonic_health::pb::health_check_response::ServingStatus;

// ---------------------------------------------------------------------------------------------
// Rules and helpers
// ---------------------------------------------------------------------------------------------

/// Two rules: `client` (5 per hour) and `user` (3 per hour).
pub(crate) const V1: &str = "\
domain: ops
descriptors:
  - key: client
    rate_limit:
      unit: hour
      requests_per_unit: 5
  - key: user
    rate_limit:
      unit: hour
      requests_per_unit: 3
";

/// V1 with `user`'s limit changed to 10 per hour and a third rule, `tenant` (2 per hour);
/// `client` unchanged (but written differently: a comment and the keys in another order).
const V2: &str = "\
domain: ops
descriptors:
  # unchanged, written another way
  - rate_limit:
      requests_per_unit: 5
      unit: hour
    key: client
  - key: user
    rate_limit:
      unit: hour
      requests_per_unit: 10
  - key: tenant
    rate_limit:
      unit: hour
      requests_per_unit: 2
";

const V1_RULES: [&str; 2] = ["ops.client: 5 per hour (fixed_window)", "ops.user: 3 per hour (fixed_window)"];
const V2_RULES: [&str; 3] = [
    "ops.client: 5 per hour (fixed_window)",
    "ops.tenant: 2 per hour (fixed_window)",
    "ops.user: 10 per hour (fixed_window)",
];

/// The line the reload logs (and `Service::reload` returns) for `user`'s change.
const USER_RESTARTED: &str = "ops.user: 3 per hour (fixed_window) -> 10 per hour (fixed_window)";

/// V1 with `user`'s unit misspelled.
const INVALID: &str = "\
domain: ops
descriptors:
  - key: client
    rate_limit:
      unit: hour
      requests_per_unit: 5
  - key: user
    rate_limit:
      unit: hours
      requests_per_unit: 3
";

/// The problem INVALID has, after `FILE: `.
const INVALID_PROBLEM: &str = "descriptors[1].rate_limit.unit: unknown unit `hours`; expected one of second, minute, \
                               hour, day, week, month, year (any letter case)";

/// A one-descriptor request of domain `ops`.
fn one(key: &str, value: &str) -> RateLimitRequest {
    request("ops", &[&[(key, value)]])
}

/// A server of the rules at `path` on `backend`, reloading them (file events, polling every
/// `poll`, SIGHUP), once ready.
async fn reloading(path: &Path, backend: &Backend, poll: Duration) -> TestServer {
    let table = RuleTable::load(path).unwrap_or_else(|errors| panic!("{errors}"));
    let service = Service::new(table, backend, hasher(), ServiceOptions::default());
    let loopback = "127.0.0.1:0".parse().unwrap();
    let server =
        Server::with_service(service, loopback, loopback).await.unwrap().with_reload(path.to_owned(), poll);
    TestServer::run(server).await
}

/// Waits (at most 10 s) until the rules in force are `expected` (as `RuleTable::describe`
/// lists them).
async fn wait_for_rules(service: &Service, expected: &[&str]) {
    let describe = || service.table().describe();
    eventually(Duration::from_secs(10), &format!("rules {expected:?} in force"), || {
        let now = describe();
        async move { now == expected }
    })
    .await;
}

/// `(code, current limit, remaining)` of a status.
type Count = (Code, Option<(u32, i32)>, u32);

/// The [`Count`] of each status: what a Redis-backed answer is asserted by (its durations come
/// from the Redis server's clock).
fn counts(response: &RateLimitResponse) -> Vec<Count> {
    views(response).into_iter().map(|(code, limit, remaining, _)| (code, limit, remaining)).collect()
}

fn unix_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs()
}

fn unix(time: SystemTime) -> u64 {
    time.duration_since(UNIX_EPOCH).unwrap().as_secs()
}

/// The log events of one test's thread (its current-thread runtime runs every task of the
/// server there), as JSON objects.
///
/// One global subscriber writes each event to the buffer of the thread that emitted it. (A
/// subscriber per test, set with `tracing::subscriber::set_default`, misses events: a callsite
/// first reached on a thread without one is cached as uninteresting for every thread.)
#[derive(Clone, Default)]
struct Logs(Arc<Mutex<Vec<u8>>>);

thread_local! {
    static SINK: std::cell::RefCell<Option<Logs>> = const { std::cell::RefCell::new(None) };
}

/// Writes to the buffer of the current thread, if it has one.
struct ThreadSink;

impl std::io::Write for ThreadSink {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        SINK.with(|sink| {
            if let Some(logs) = &*sink.borrow() {
                logs.0.lock().unwrap().extend_from_slice(bytes);
            }
        });
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Logs {
    /// Captures the `info` and above events of this thread from now on.
    fn capture() -> Self {
        static INSTALL: std::sync::Once = std::sync::Once::new();
        INSTALL.call_once(|| {
            tracing_subscriber::fmt()
                .json()
                .flatten_event(true)
                .with_max_level(tracing::Level::INFO)
                .with_writer(|| ThreadSink)
                .init();
        });
        let logs = Self::default();
        SINK.with(|sink| *sink.borrow_mut() = Some(logs.clone()));
        logs
    }

    /// Every event so far whose `message` is `message`.
    fn events(&self, message: &str) -> Vec<serde_json::Value> {
        let text = String::from_utf8(self.0.lock().unwrap().clone()).unwrap();
        text.lines()
            .map(|line| serde_json::from_str::<serde_json::Value>(line).unwrap())
            .filter(|event| event["message"] == message)
            .collect()
    }
}

const RELOADED: &str = "rules reloaded";
const RESTARTS: &str = "reload restarts this rule's counters (changed limit, unit, algorithm, burst or \
                        share_threshold): every client gets the new limit's whole quota at once";

// ---------------------------------------------------------------------------------------------
// Reloading with exact counters
// ---------------------------------------------------------------------------------------------

/// In memory on a manual clock, so every remaining count and window is exact: after a reload
/// that changes only `user`'s limit and adds `tenant`, `client` continues exactly where it was
/// (same counter, same window), `user` starts afresh under its new limit (a whole new quota
/// and window), `tenant` works, and the restarted rule is logged. Reloading back to the old
/// limit finds `user`'s old counter again: a counter is identified by its rule and limit.
#[tokio::test]
async fn a_reload_keeps_unchanged_counters_and_restarts_changed_rules_in_memory() {
    let logs = Logs::capture();
    let files = Files::new(V1);
    let (backend, clock) = memory();
    let server = reloading(&files.path("rules.yaml"), &backend, Duration::from_millis(100)).await;
    let mut client = server.client().await;

    for remaining in [4, 3] {
        let response = call(&mut client, one("client", "192.0.2.4")).await;
        assert_eq!(views(&response), [(Code::Ok, Some((5, HOUR)), remaining, Some(3_600_000))]);
    }
    for remaining in [2, 1] {
        let response = call(&mut client, one("user", "alice")).await;
        assert_eq!(views(&response), [(Code::Ok, Some((3, HOUR)), remaining, Some(3_600_000))]);
    }
    let unknown = call(&mut client, one("tenant", "acme")).await;
    assert_eq!(views(&unknown), [(Code::Ok, None, 0, None)]);

    // Ten minutes later, the files change.
    clock.advance(Duration::from_secs(600));
    files.replace("rules.yaml", V2);
    wait_for_rules(&server.service, &V2_RULES).await;

    // client: the same counter and window (50 minutes left of it).
    let response = call(&mut client, one("client", "192.0.2.4")).await;
    assert_eq!(views(&response), [(Code::Ok, Some((5, HOUR)), 2, Some(3_000_000))]);
    // user: a new counter of 10, its window starting now.
    let response = call(&mut client, one("user", "alice")).await;
    assert_eq!(views(&response), [(Code::Ok, Some((10, HOUR)), 9, Some(3_600_000))]);
    // tenant: new.
    for (code, remaining) in [(Code::Ok, 1), (Code::Ok, 0), (Code::OverLimit, 0)] {
        let response = call(&mut client, one("tenant", "acme")).await;
        assert_eq!(views(&response), [(code, Some((2, HOUR)), remaining, Some(3_600_000))]);
    }

    let reloads = logs.events(RELOADED);
    assert_eq!(reloads.len(), 1, "{reloads:?}");
    assert!(["file event", "poll"].contains(&reloads[0]["trigger"].as_str().unwrap()), "{reloads:?}");
    assert_eq!(reloads[0]["level"], "INFO");
    assert_eq!(reloads[0]["domains"], 1);
    assert_eq!(reloads[0]["rules"], 3);
    assert_eq!(reloads[0]["restarted_counters"], 1);
    assert_eq!(reloads[0]["config"], files.rules());
    let restarts = logs.events(RESTARTS);
    assert_eq!(restarts.len(), 1, "{restarts:?}");
    assert_eq!(restarts[0]["level"], "WARN");
    assert_eq!(restarts[0]["rule"], USER_RESTARTED);

    // Service::reload returns the same lines. Back to 3 per hour, `user` finds its first
    // counter again (1 left, 50 minutes of its window), `tenant` is gone.
    assert_eq!(
        server.service.reload(rules(V1)),
        ["ops.user: 10 per hour (fixed_window) -> 3 per hour (fixed_window)"]
    );
    let response = call(&mut client, one("user", "alice")).await;
    assert_eq!(views(&response), [(Code::Ok, Some((3, HOUR)), 0, Some(3_000_000))]);
    let response = call(&mut client, one("tenant", "acme")).await;
    assert_eq!(views(&response), [(Code::Ok, None, 0, None)]);
    server.stop().await;
}

/// The same on the shared Redis (under a key prefix of the test's own): counters live in
/// Redis, keyed by rule and limit, so a reload keeps `client`'s exactly and starts `user`'s
/// afresh.
#[tokio::test]
#[ignore = "needs RUNLIMIT_REDIS_TEST_URL"]
async fn a_reload_keeps_unchanged_counters_and_restarts_changed_rules_on_redis() {
    let logs = Logs::capture();
    let url = redis_url();
    let prefix = unique_prefix("reload");
    let keys = RedisKeys::new(&url, &prefix);
    let backend =
        Backend::redis(&url, &RedisConfig::default().with_key_prefix(KeyPrefix::new(&prefix).unwrap()))
            .unwrap();
    let files = Files::new(V1);
    let server = reloading(&files.path("rules.yaml"), &backend, Duration::from_millis(100)).await;
    let mut client = server.client().await;

    for remaining in [4, 3] {
        let response = call(&mut client, one("client", "192.0.2.4")).await;
        assert_eq!(counts(&response), [(Code::Ok, Some((5, HOUR)), remaining)]);
    }
    for remaining in [2, 1] {
        let response = call(&mut client, one("user", "alice")).await;
        assert_eq!(counts(&response), [(Code::Ok, Some((3, HOUR)), remaining)]);
    }

    files.replace("rules.yaml", V2);
    wait_for_rules(&server.service, &V2_RULES).await;

    for remaining in [2, 1, 0] {
        let response = call(&mut client, one("client", "192.0.2.4")).await;
        assert_eq!(counts(&response), [(Code::Ok, Some((5, HOUR)), remaining)]);
    }
    let response = call(&mut client, one("client", "192.0.2.4")).await;
    assert_eq!(counts(&response), [(Code::OverLimit, Some((5, HOUR)), 0)]);
    for remaining in [9, 8] {
        let response = call(&mut client, one("user", "alice")).await;
        assert_eq!(counts(&response), [(Code::Ok, Some((10, HOUR)), remaining)]);
    }
    let response = call(&mut client, one("tenant", "acme")).await;
    assert_eq!(counts(&response), [(Code::Ok, Some((2, HOUR)), 1)]);

    let restarts = logs.events(RESTARTS);
    assert_eq!(restarts.len(), 1, "{restarts:?}");
    assert_eq!(restarts[0]["rule"], USER_RESTARTED);
    server.stop().await;
    assert!(keys.delete() > 0);
}

/// Publishes `files` into `dir` the way the kubelet updates a ConfigMap volume: the files in a
/// new timestamped directory `..<version>`, the `..data` symbolic link swapped to it by a
/// rename, each file a symbolic link `NAME -> ..data/NAME`, the previous directory removed.
fn publish_configmap(dir: &Path, version: u32, files: &[(&str, &str)]) {
    let timestamped = format!("..2026_08_06_12_00_{version:02}.{version:09}");
    std::fs::create_dir(dir.join(&timestamped)).unwrap();
    for (name, text) in files {
        std::fs::write(dir.join(&timestamped).join(name), text).unwrap();
    }
    let previous = std::fs::read_link(dir.join("..data")).ok();
    std::os::unix::fs::symlink(&timestamped, dir.join("..data_tmp")).unwrap();
    std::fs::rename(dir.join("..data_tmp"), dir.join("..data")).unwrap();
    for (name, _) in files {
        let link = dir.join(name);
        if std::fs::symlink_metadata(&link).is_err() {
            std::os::unix::fs::symlink(PathBuf::from("..data").join(name), link).unwrap();
        }
    }
    if let Some(previous) = previous {
        std::fs::remove_dir_all(dir.join(previous)).unwrap();
    }
}

/// A ConfigMap mounted as a directory: the swap of its `..data` link is seen (by file events:
/// polling is hourly here) and the counters of unchanged rules continue.
#[tokio::test]
async fn a_configmap_update_is_picked_up_from_its_symlink_swap() {
    let logs = Logs::capture();
    let dir = tempfile::tempdir().unwrap();
    publish_configmap(dir.path(), 1, &[("rules.yaml", V1)]);
    let (backend, _clock) = memory();
    let server = reloading(dir.path(), &backend, Duration::from_secs(3_600)).await;
    let mut client = server.client().await;
    for remaining in [4, 3] {
        let response = call(&mut client, one("client", "192.0.2.4")).await;
        assert_eq!(counts(&response), [(Code::Ok, Some((5, HOUR)), remaining)]);
    }

    publish_configmap(dir.path(), 2, &[("rules.yaml", V2)]);
    wait_for_rules(&server.service, &V2_RULES).await;
    let response = call(&mut client, one("client", "192.0.2.4")).await;
    assert_eq!(counts(&response), [(Code::Ok, Some((5, HOUR)), 2)]);
    let response = call(&mut client, one("user", "alice")).await;
    assert_eq!(counts(&response), [(Code::Ok, Some((10, HOUR)), 9)]);
    let reloads = logs.events(RELOADED);
    assert_eq!(reloads.len(), 1, "{reloads:?}");
    // Reported by the watcher (or, had the swap come before it started, found by the
    // reloader's first poll, which is at once).
    assert!(["file event", "poll"].contains(&reloads[0]["trigger"].as_str().unwrap()), "{reloads:?}");
    // The files in force are named by their link in the mounted directory.
    let rlconfig = http(server.http, "GET", "/rlconfig", "").await;
    let first_line = rlconfig.body.lines().next().unwrap().to_owned();
    assert!(
        first_line.ends_with(&format!(" from {}", dir.path().join("rules.yaml").display())),
        "{first_line}"
    );

    // A third version, which adds a file.
    publish_configmap(dir.path(), 3, &[("rules.yaml", V1), ("more.yaml", "domain: more\ndescriptors: []\n")]);
    wait_for_rules(&server.service, &V1_RULES).await;
    assert_eq!(server.service.table().files().len(), 2);
    server.stop().await;
}

/// A change no file event announces (written through a hard link in another directory, which
/// inotify reports to that directory only) is found by polling.
#[tokio::test]
async fn polling_finds_a_change_no_file_event_announces() {
    let logs = Logs::capture();
    let files = Files::new(V1);
    let elsewhere = tempfile::tempdir().unwrap();
    let link = elsewhere.path().join("rules-link.yaml");
    std::fs::hard_link(files.path("rules.yaml"), &link).unwrap();
    let (backend, _clock) = memory();
    let server = reloading(&files.path("rules.yaml"), &backend, Duration::from_millis(300)).await;
    std::fs::write(&link, V2).unwrap();
    wait_for_rules(&server.service, &V2_RULES).await;
    let reloads = logs.events(RELOADED);
    assert_eq!(reloads.len(), 1, "{reloads:?}");
    assert_eq!(reloads[0]["trigger"], "poll");
    server.stop().await;
}

// ---------------------------------------------------------------------------------------------
// Invalid rule files kept out
// ---------------------------------------------------------------------------------------------

/// `GET /healthcheck`'s body while the last reload is refused: `OK` and the problems, with
/// the time of the refusal (checked to lie between `since` and now) and of the rules in force.
fn refused_health(body: &str, service: &Service, since: u64, problems: &str) {
    let at = body
        .strip_prefix("OK\nthe last reload was refused (at unix time ")
        .and_then(|rest| rest.split_once(')'))
        .map(|(at, _)| at.parse::<u64>().unwrap())
        .unwrap_or_else(|| panic!("{body:?}"));
    assert!((since..=unix_now()).contains(&at), "refused at {at}, not since {since}");
    assert_eq!(
        body,
        format!(
            "OK\nthe last reload was refused (at unix time {at}); the rules loaded at unix time {} still serve:\n\
             {problems}\n",
            unix(service.loaded_at())
        )
    );
}

/// An invalid file never replaces the rules in force: they keep serving with their counters,
/// `/healthcheck` answers 200 with the problem (file, document path, cause), `/rlconfig` shows
/// it above the rules in force; a valid file then loads, and the problem is gone.
#[tokio::test]
async fn an_invalid_reload_is_kept_out_and_shown_until_a_valid_one_arrives() {
    let logs = Logs::capture();
    let files = Files::new(V1);
    let (backend, _clock) = memory();
    let server = reloading(&files.path("rules.yaml"), &backend, Duration::from_millis(100)).await;
    let mut client = server.client().await;
    let loaded = unix(server.service.loaded_at());
    let response = call(&mut client, one("client", "192.0.2.4")).await;
    assert_eq!(views(&response), [(Code::Ok, Some((5, HOUR)), 4, Some(3_600_000))]);

    let before = unix_now();
    files.replace("rules.yaml", INVALID);
    let health = || http(server.http, "GET", "/healthcheck", "");
    eventually(Duration::from_secs(10), "the refused reload shown", || async {
        health().await.body != "OK\n"
    })
    .await;
    let answer = health().await;
    assert_eq!((answer.status, answer.content_type.as_str()), (200, "text/plain; charset=utf-8"));
    let problem = format!("{}: {INVALID_PROBLEM}", files.rules());
    refused_health(&answer.body, &server.service, before, &problem);
    assert_eq!(unix(server.service.loaded_at()), loaded);
    assert_eq!(server.service.table().describe(), V1_RULES);

    // The old rules keep serving, counters exact.
    for remaining in [3, 2] {
        let response = call(&mut client, one("client", "192.0.2.4")).await;
        assert_eq!(views(&response), [(Code::Ok, Some((5, HOUR)), remaining, Some(3_600_000))]);
    }
    let response = call(&mut client, one("user", "alice")).await;
    assert_eq!(views(&response), [(Code::Ok, Some((3, HOUR)), 2, Some(3_600_000))]);

    let rlconfig = http(server.http, "GET", "/rlconfig", "").await;
    let refused_at =
        answer.body["OK\nthe last reload was refused (at unix time ".len()..].split(')').next().unwrap();
    assert_eq!(rlconfig.status, 200);
    assert_eq!(
        rlconfig.body,
        format!(
            "# loaded at unix time {loaded} from {rules}\n\
             # the last reload was refused (at unix time {refused_at}):\n\
             #   {problem}\n\
             ops.client: unit=HOUR requests_per_unit=5, shadow_mode: false\n\
             ops.user: unit=HOUR requests_per_unit=3, shadow_mode: false\n",
            rules = files.rules()
        )
    );
    let refusals = logs.events("reload refused: the rules in force keep serving");
    assert_eq!(refusals.len(), 1, "{refusals:?}");
    assert_eq!(refusals[0]["level"], "ERROR");
    assert_eq!(refusals[0]["problems"], 1);
    let problems = logs.events("invalid rule files");
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert_eq!(problems[0]["problem"], problem.as_str());

    // A valid file: in force, the problem gone, the unchanged rule's counter continuing.
    files.replace("rules.yaml", V2);
    wait_for_rules(&server.service, &V2_RULES).await;
    assert_eq!(
        health().await,
        support::HttpAnswer {
            status: 200,
            content_type: "text/plain; charset=utf-8".to_owned(),
            body: "OK\n".to_owned()
        }
    );
    let rlconfig = http(server.http, "GET", "/rlconfig", "").await;
    assert_eq!(
        rlconfig.body,
        format!(
            "# loaded at unix time {} from {}\n\
             ops.client: unit=HOUR requests_per_unit=5, shadow_mode: false\n\
             ops.tenant: unit=HOUR requests_per_unit=2, shadow_mode: false\n\
             ops.user: unit=HOUR requests_per_unit=10, shadow_mode: false\n",
            unix(server.service.loaded_at()),
            files.rules()
        )
    );
    let response = call(&mut client, one("client", "192.0.2.4")).await;
    assert_eq!(views(&response), [(Code::Ok, Some((5, HOUR)), 1, Some(3_600_000))]);
    // The same refused files were reported once (polling every 100 ms read them many times).
    assert_eq!(logs.events("reload refused: the rules in force keep serving").len(), 1);
    server.stop().await;
}

/// Rules whose key holds a line feed and a terminal escape (YAML's `\n` and `\e` in double
/// quotes), with `unit`.
fn rules_with_controls(unit: &str) -> String {
    format!(
        "domain: ops\ndescriptors:\n  - key: \"cli\\nent\\e[2J\"\n    rate_limit:\n      unit: \"{unit}\"\n      \
         requests_per_unit: 5\n"
    )
}

/// `/rlconfig` and `/healthcheck` show the control characters of rule files escaped, in the
/// rules in force and in the problems of a refused reload: one line each. Regression: they
/// were shown raw, so a rule or a problem spanned several lines and carried terminal escapes.
#[tokio::test]
async fn rlconfig_and_healthcheck_escape_the_control_characters_of_rule_files() {
    let files = Files::new(&rules_with_controls("hour"));
    let (backend, _clock) = memory();
    let server = reloading(&files.path("rules.yaml"), &backend, Duration::from_millis(100)).await;
    let loaded = unix(server.service.loaded_at());
    let rule = "ops.cli\\nent\\u{1b}[2J: unit=HOUR requests_per_unit=5, shadow_mode: false";
    let rlconfig = http(server.http, "GET", "/rlconfig", "").await;
    assert_eq!(rlconfig.body, format!("# loaded at unix time {loaded} from {}\n{rule}\n", files.rules()));

    let before = unix_now();
    files.replace("rules.yaml", &rules_with_controls("ho\\nur\\e[31m"));
    let health = || http(server.http, "GET", "/healthcheck", "");
    eventually(Duration::from_secs(10), "the refused reload shown", || async {
        health().await.body != "OK\n"
    })
    .await;
    let problem = format!(
        "{}: descriptors[0].rate_limit.unit: unknown unit `ho\\nur\\u{{1b}}[31m`; expected one of second, minute, \
         hour, day, week, month, year (any letter case)",
        files.rules()
    );
    let answer = health().await;
    refused_health(&answer.body, &server.service, before, &problem);
    let refused_at =
        answer.body["OK\nthe last reload was refused (at unix time ".len()..].split(')').next().unwrap();
    let rlconfig = http(server.http, "GET", "/rlconfig", "").await;
    assert_eq!(
        rlconfig.body,
        format!(
            "# loaded at unix time {loaded} from {rules}\n\
             # the last reload was refused (at unix time {refused_at}):\n\
             #   {problem}\n\
             {rule}\n",
            rules = files.rules()
        )
    );
    assert!(!rlconfig.body.contains('\u{1b}'), "{:?}", rlconfig.body);
    server.stop().await;
}

/// An invalid edit undone (the files back to the very text in force), and a rule file that
/// disappears and comes back unchanged: nothing new to load, and the problem is no longer
/// reported. Regression: `/healthcheck` kept reporting the refused reload until some other
/// change was made.
#[tokio::test]
async fn an_invalid_edit_undone_clears_the_problem() {
    let files = Files::new(V1);
    let (backend, _clock) = memory();
    let server = reloading(&files.path("rules.yaml"), &backend, Duration::from_millis(100)).await;
    let loaded = server.service.loaded_at();
    let health = || http(server.http, "GET", "/healthcheck", "");

    files.replace("rules.yaml", INVALID);
    eventually(Duration::from_secs(10), "the refused reload shown", || async {
        health().await.body != "OK\n"
    })
    .await;
    files.replace("rules.yaml", V1);
    eventually(Duration::from_secs(10), "the problem gone", || async { health().await.body == "OK\n" }).await;
    assert_eq!(server.service.loaded_at(), loaded, "nothing was reloaded");

    // The file goes away (a read error is refused like an invalid file), then comes back.
    let rules = files.rules();
    let aside = files.path("rules.yaml.aside");
    std::fs::rename(&rules, &aside).unwrap();
    eventually(Duration::from_secs(10), "the unreadable file shown", || async {
        health().await.body != "OK\n"
    })
    .await;
    let body = health().await.body;
    let problem = format!("{rules}: cannot be read: No such file or directory (os error 2)");
    assert!(body.ends_with(&format!("still serve:\n{problem}\n")), "{body:?}");
    std::fs::rename(&aside, &rules).unwrap();
    eventually(Duration::from_secs(10), "the problem gone", || async { health().await.body == "OK\n" }).await;
    assert_eq!(server.service.loaded_at(), loaded, "nothing was reloaded");
    assert_eq!(server.service.table().describe(), V1_RULES);
    server.stop().await;
}

// ---------------------------------------------------------------------------------------------
// POST /json
// ---------------------------------------------------------------------------------------------

/// The rules of the `/json` test: a plain rule, a named one and an unlimited one.
const WEB: &str = "\
domain: web
descriptors:
  - key: client
    rate_limit:
      unit: minute
      requests_per_unit: 2
  - key: path
    value: /login
    rate_limit:
      name: login
      unit: second
      requests_per_unit: 1
  - key: health
    rate_limit:
      unlimited: true
";

/// A JSON string literal.
fn quoted(text: &str) -> String {
    serde_json::to_string(text).unwrap()
}

/// A `google.protobuf.Duration` in proto3 JSON: seconds and 0, 3, 6 or 9 fractional digits.
fn duration_json(seconds: i64, nanos: i32) -> String {
    assert!(seconds >= 0 && nanos >= 0);
    match nanos {
        0 => format!("{seconds}s"),
        n if n % 1_000_000 == 0 => format!("{seconds}.{:03}s", n / 1_000_000),
        n if n % 1_000 == 0 => format!("{seconds}.{:06}s", n / 1_000),
        n => format!("{seconds}.{n:09}s"),
    }
}

fn status_json(status: &DescriptorStatus) -> String {
    let mut members = Vec::new();
    if status.code != 0 {
        members.push(format!("\"code\":{}", quoted(Code::try_from(status.code).unwrap().as_str_name())));
    }
    if let Some(limit) = &status.current_limit {
        let mut inner = Vec::new();
        if !limit.name.is_empty() {
            inner.push(format!("\"name\":{}", quoted(&limit.name)));
        }
        if limit.requests_per_unit != 0 {
            inner.push(format!("\"requestsPerUnit\":{}", limit.requests_per_unit));
        }
        if limit.unit != 0 {
            inner.push(format!("\"unit\":{}", quoted(Unit::try_from(limit.unit).unwrap().as_str_name())));
        }
        members.push(format!("\"currentLimit\":{{{}}}", inner.join(",")));
    }
    if status.limit_remaining != 0 {
        members.push(format!("\"limitRemaining\":{}", status.limit_remaining));
    }
    if let Some(duration) = &status.duration_until_reset {
        members.push(format!(
            "\"durationUntilReset\":{}",
            quoted(&duration_json(duration.seconds, duration.nanos))
        ));
    }
    assert!(status.quota.is_none(), "the service sets no quota");
    format!("{{{}}}", members.join(","))
}

/// The proto3 JSON of `response`, built by hand from its fields: lowerCamelCase names in
/// declaration order, default values left out, enums by name, no whitespace.
fn response_json(response: &RateLimitResponse) -> String {
    let mut members = Vec::new();
    if response.overall_code != 0 {
        members.push(format!(
            "\"overallCode\":{}",
            quoted(Code::try_from(response.overall_code).unwrap().as_str_name())
        ));
    }
    if !response.statuses.is_empty() {
        let statuses: Vec<String> = response.statuses.iter().map(status_json).collect();
        members.push(format!("\"statuses\":[{}]", statuses.join(",")));
    }
    if !response.response_headers_to_add.is_empty() {
        let headers: Vec<String> = response
            .response_headers_to_add
            .iter()
            .map(|header| {
                assert!(header.raw_value.is_empty());
                format!("{{\"key\":{},\"value\":{}}}", quoted(&header.key), quoted(&header.value))
            })
            .collect();
        members.push(format!("\"responseHeadersToAdd\":[{}]", headers.join(",")));
    }
    assert!(response.request_headers_to_add.is_empty() && response.raw_body.is_empty());
    assert!(response.dynamic_metadata.is_none() && response.quota.is_none());
    format!("{{{}}}", members.join(","))
}

/// Two identical servers (same rules and options, each on its own manual-clock memory
/// backend): the same request sequence through gRPC on one and `POST /json` on the other
/// gives the same answers, the JSON one the proto3 JSON of the gRPC one, with 200 for `OK` and
/// 429 for `OVER_LIMIT`; a request the service refuses gets 400 and the gRPC error's message.
#[tokio::test]
async fn json_answers_as_grpc_does() {
    let options =
        ServiceOptions { response_headers: Some(HeaderFormat::Draft11), ..ServiceOptions::default() };
    let (grpc_backend, grpc_clock) = memory();
    let (json_backend, json_clock) = memory();
    let grpc_server = TestServer::start(WEB, &grpc_backend, options).await;
    let json_server = TestServer::start(WEB, &json_backend, options).await;
    let mut client = grpc_server.client().await;

    let cases: Vec<(&str, RateLimitRequest, u16)> = vec![
        (
            r#"{"domain":"web","descriptors":[{"entries":[{"key":"client","value":"192.0.2.4"}]}]}"#,
            request("web", &[&[("client", "192.0.2.4")]]),
            200,
        ),
        // Two descriptors, the second a named rule; the proto field names work too.
        (
            r#"{"domain":"web","descriptors":[{"entries":[{"key":"client","value":"192.0.2.4"}]},
                {"entries":[{"key":"path","value":"/login"}]}],"hits_addend":1}"#,
            request("web", &[&[("client", "192.0.2.4")], &[("path", "/login")]]),
            200,
        ),
        // Over the limit: 429, with the draft-11 fields and Retry-After.
        (
            r#"{"domain":"web","descriptors":[{"entries":[{"key":"client","value":"192.0.2.4"}]},
                {"entries":[{"key":"path","value":"/login"}]}]}"#,
            request("web", &[&[("client", "192.0.2.4")], &[("path", "/login")]]),
            429,
        ),
        // A check-only read (descriptor hitsAddend 0, as a decimal string), an unlimited rule,
        // no rule.
        (
            r#"{"domain":"web","descriptors":[{"entries":[{"key":"client","value":"198.51.100.7"}],"hitsAddend":"0"},
                {"entries":[{"key":"health","value":"x"}]},{"entries":[{"key":"other","value":"y"}]}]}"#,
            request_of(
                "web",
                vec![
                    with_hits(descriptor(&[("client", "198.51.100.7")]), 0),
                    descriptor(&[("health", "x")]),
                    descriptor(&[("other", "y")]),
                ],
            ),
            200,
        ),
        // A limit override, and hits of 3 for the request.
        (
            r#"{"domain":"web","hitsAddend":3,"descriptors":[{"entries":[{"key":"client","value":"203.0.113.9"}],
                "limit":{"requestsPerUnit":10,"unit":"HOUR"}}]}"#,
            support::with_request_hits(
                request_of(
                    "web",
                    vec![with_override(
                        descriptor(&[("client", "203.0.113.9")]),
                        10,
                        envoy_types::pb::envoy::r#type::v3::RateLimitUnit::Hour as i32,
                    )],
                ),
                3,
            ),
            200,
        ),
        // A domain without rules.
        (
            r#"{"domain":"elsewhere","descriptors":[{"entries":[{"key":"k","value":"v"}]}]}"#,
            request("elsewhere", &[&[("k", "v")]]),
            200,
        ),
    ];
    for (index, (body, request, status)) in cases.into_iter().enumerate() {
        // 1.5 s between requests, on both clocks: durations with fractions of a second.
        grpc_clock.advance(Duration::from_millis(1_500));
        json_clock.advance(Duration::from_millis(1_500));
        let expected = call(&mut client, request).await;
        let answer = http(json_server.http, "POST", "/json", body).await;
        assert_eq!(
            (answer.status, answer.content_type.as_str(), answer.body.as_str()),
            (status, "application/json", response_json(&expected).as_str()),
            "case {index}: {expected:?}"
        );
    }

    // A request the service refuses: 400 and the message gRPC's INVALID_ARGUMENT carries.
    for (body, request) in [
        (r#"{"domain":"web","descriptors":[]}"#, request_of("web", vec![])),
        (
            r#"{"domain":"web","descriptors":[{"entries":[{"key":"client","value":""}]}]}"#,
            request("web", &[&[("client", "")]]),
        ),
        (
            r#"{"domain":"web","descriptors":[{"entries":[{"key":"client","value":"x"}],"isNegativeHits":true}]}"#,
            request_of(
                "web",
                vec![envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor {
                    is_negative_hits: true,
                    ..descriptor(&[("client", "x")])
                }],
            ),
        ),
    ] {
        let (code, message) = call_error(&mut client, request).await;
        assert_eq!(code, tonic::Code::InvalidArgument);
        let answer = http(json_server.http, "POST", "/json", body).await;
        assert_eq!(
            (answer.status, answer.content_type.as_str(), answer.body),
            (400, "text/plain; charset=utf-8", format!("{message}\n"))
        );
    }

    // Bodies that are not a RateLimitRequest: 400 and where.
    for (body, message) in [
        ("", "EOF while parsing a value at line 1 column 0"),
        (r#"{"domain":"dummy""#, "EOF while parsing an object at line 1 column 17"),
        (
            r#"{"domain":"d","descriptors":[{"entries":[{"key":"a","value":"b"},{"key":"c","valu":"d"}]}]}"#,
            "descriptors[0].entries[1]: unknown field `valu`, expected `key` or `value`",
        ),
        (r#"{"domain":5}"#, "domain: invalid type: integer `5`, expected a string"),
    ] {
        let answer = http(json_server.http, "POST", "/json", body).await;
        assert_eq!(
            (answer.status, answer.content_type.as_str(), answer.body),
            (400, "text/plain; charset=utf-8", format!("{message}\n")),
            "{body}"
        );
    }
    // Nothing the refused bodies carried was charged: the counters still agree.
    grpc_clock.advance(Duration::from_millis(250));
    json_clock.advance(Duration::from_millis(250));
    let peek = request_of("web", vec![with_hits(descriptor(&[("client", "x")]), 0)]);
    let expected = call(&mut client, peek).await;
    // No window started: nothing to wait for.
    assert_eq!(views(&expected), [(Code::Ok, Some((2, MINUTE)), 2, Some(0))] as [StatusView; 1]);
    let answer = http(
        json_server.http,
        "POST",
        "/json",
        r#"{"domain":"web","descriptors":[{"entries":[{"key":"client","value":"x"}],"hitsAddend":0}]}"#,
    )
    .await;
    assert_eq!(answer.body, response_json(&expected));
    grpc_server.stop().await;
    json_server.stop().await;
}

// ---------------------------------------------------------------------------------------------
// Health
// ---------------------------------------------------------------------------------------------

/// A Redis backend on `redis` (a server of the test's own) with generous timeouts, so a paused
/// server delays the backend rather than failing it.
fn own_redis_backend(redis: &OwnRedis) -> Backend {
    let config = RedisConfig::default()
        .with_key_prefix(KeyPrefix::new("ops").unwrap())
        .with_operation_timeout(Duration::from_secs(10))
        .unwrap()
        .with_connect_timeout(Duration::from_secs(10))
        .unwrap();
    Backend::redis(&redis.url(), &config).unwrap()
}

/// Waits (at most 10 s) until `/healthcheck` answers `status` and `body`, and the gRPC
/// health of the rate limit service and of the whole server (`""`, what Envoy's gRPC health
/// checks ask by default) is `grpc`.
async fn wait_for_health(server: &TestServer, status: u16, body: &str, grpc: ServingStatus) {
    let describe = format!("/healthcheck {status} {body:?}, gRPC {grpc:?}");
    eventually(Duration::from_secs(10), &describe, || async {
        let answer = http(server.http, "GET", "/healthcheck", "").await;
        let service = grpc_health(server.grpc, RLS_SERVICE).await;
        let whole = grpc_health(server.grpc, "").await;
        answer.status == status
            && answer.body == body
            && service.is_ok_and(|health| health == grpc)
            && whole.is_ok_and(|health| health == grpc)
    })
    .await;
}

/// With a readiness probe every 200 ms: killing the Redis server turns `/healthcheck` to 503
/// with the reason and the gRPC health to NOT_SERVING (calls fail with the backend's error,
/// `/json` with 503 and the same message); starting it again turns both back; an evicting
/// `maxmemory-policy` is reported by name, and `noeviction` again is healthy again.
#[tokio::test]
#[ignore = "needs redis-server on PATH (starts a server of its own)"]
async fn health_follows_the_redis_server() {
    let mut redis = OwnRedis::start();
    let port = redis.port();
    let backend = own_redis_backend(&redis);
    let service = Service::new(rules(V1), &backend, hasher(), ServiceOptions::default());
    let loopback = "127.0.0.1:0".parse().unwrap();
    let server = Server::with_service(service, loopback, loopback)
        .await
        .unwrap()
        .with_probe_interval(Duration::from_millis(200));
    let server = TestServer::run(server).await;
    let mut client = server.client().await;
    wait_for_health(&server, 200, "OK\n", ServingStatus::Serving).await;
    assert_eq!(grpc_health(server.grpc, "").await.unwrap(), ServingStatus::Serving);
    let response = call(&mut client, one("client", "192.0.2.4")).await;
    assert_eq!(counts(&response), [(Code::Ok, Some((5, HOUR)), 4)]);

    redis.stop();
    let refused =
        format!("could not connect to Redis at 127.0.0.1:{port}: Connection refused (os error 111)");
    wait_for_health(
        &server,
        503,
        &format!("backend not ready: Redis at 127.0.0.1:{port} cannot be used: could not prepare the Redis server: {refused}\n"),
        ServingStatus::NotServing,
    )
    .await;
    // Calls fail with the backend's error: UNAVAILABLE, and 503 through /json. (The first
    // call may still find the old connection open; the probe has seen it closed already.)
    let (code, message) = call_error(&mut client, one("client", "192.0.2.4")).await;
    assert_eq!(code, tonic::Code::Unavailable);
    let expected = format!("rate limit backend failed (no quota was consumed): {refused}");
    assert_eq!(message, expected);
    let answer = http(
        server.http,
        "POST",
        "/json",
        r#"{"domain":"ops","descriptors":[{"entries":[{"key":"client","value":"192.0.2.4"}]}]}"#,
    )
    .await;
    assert_eq!((answer.status, answer.body), (503, format!("{expected}\n")));

    redis.restart();
    wait_for_health(&server, 200, "OK\n", ServingStatus::Serving).await;
    // Nothing was persisted: a fresh counter.
    let response = call(&mut client, one("client", "192.0.2.4")).await;
    assert_eq!(counts(&response), [(Code::Ok, Some((5, HOUR)), 4)]);

    assert_eq!(redis.cli(&["CONFIG", "SET", "maxmemory-policy", "allkeys-lru"]), "OK");
    wait_for_health(
        &server,
        503,
        &format!(
            "backend not ready: Redis at 127.0.0.1:{port} cannot be used: Redis at 127.0.0.1:{port} has \
             maxmemory-policy allkeys-lru: Runlimit needs noeviction, so no quota state is ever evicted (CONFIG SET \
             maxmemory-policy noeviction)\n"
        ),
        ServingStatus::NotServing,
    )
    .await;
    assert_eq!(redis.cli(&["CONFIG", "SET", "maxmemory-policy", "noeviction"]), "OK");
    wait_for_health(&server, 200, "OK\n", ServingStatus::Serving).await;
    server.stop().await;
}

/// While the backend is prepared (here: a Redis server paused by `CLIENT PAUSE` for 2 s), the
/// listeners already answer, not ready: `/healthcheck` 503 `preparing the backend`, gRPC
/// health NOT_SERVING, calls refused `UNAVAILABLE` (regression: a server built by
/// `Server::with_service` answered them). Then ready.
#[tokio::test]
#[ignore = "needs redis-server on PATH (starts a server of its own)"]
async fn the_listeners_report_not_ready_while_the_backend_is_prepared() {
    let redis = OwnRedis::start();
    let backend = own_redis_backend(&redis);
    let service = Service::new(rules(V1), &backend, hasher(), ServiceOptions::default());
    let loopback = "127.0.0.1:0".parse().unwrap();
    let server = Server::with_service(service, loopback, loopback).await.unwrap();
    assert_eq!(redis.cli(&["CLIENT", "PAUSE", "2000", "ALL"]), "OK");
    let paused = std::time::Instant::now();
    let (server, ready) = TestServer::spawn(server);

    let answer = http(server.http, "GET", "/healthcheck", "").await;
    assert_eq!((answer.status, answer.body.as_str()), (503, "preparing the backend\n"));
    assert_eq!(grpc_health(server.grpc, RLS_SERVICE).await.unwrap(), ServingStatus::NotServing);
    assert_eq!(grpc_health(server.grpc, "").await.unwrap(), ServingStatus::NotServing);
    let mut early: Client = server.client().await;
    assert_eq!(
        call_error(&mut early, one("client", "192.0.2.4")).await,
        (
            tonic::Code::Unavailable,
            "not ready: the rate limit backend is being prepared (no quota was consumed)".to_owned()
        )
    );
    assert!(paused.elapsed() < Duration::from_millis(1_500), "the checks ran late: {:?}", paused.elapsed());

    tokio::time::timeout(Duration::from_secs(20), ready).await.unwrap().unwrap();
    let answer = http(server.http, "GET", "/healthcheck", "").await;
    assert_eq!((answer.status, answer.body.as_str()), (200, "OK\n"));
    assert_eq!(grpc_health(server.grpc, RLS_SERVICE).await.unwrap(), ServingStatus::Serving);
    let mut client: Client = server.client().await;
    let response = call(&mut client, one("client", "192.0.2.4")).await;
    assert_eq!(counts(&response), [(Code::Ok, Some((5, HOUR)), 4)]);
    server.stop().await;
}

/// Regression: the reloader took the files on disk as the rules in force only once the backend
/// was prepared, so a change made while the server started was never loaded. The files'
/// fingerprint is taken with the table now: the change is loaded at the first poll.
#[tokio::test]
#[ignore = "needs redis-server on PATH (starts a server of its own)"]
async fn a_change_made_while_the_backend_is_prepared_is_loaded_once_ready() {
    let redis = OwnRedis::start();
    let backend = own_redis_backend(&redis);
    let directory = tempfile::tempdir().unwrap();
    let path = directory.path().join("rules.yaml");
    std::fs::write(&path, V1).unwrap();
    let service =
        Service::new(RuleTable::load(&path).unwrap(), &backend, hasher(), ServiceOptions::default());
    let loopback = "127.0.0.1:0".parse().unwrap();
    let server = Server::with_service(service, loopback, loopback)
        .await
        .unwrap()
        .with_reload(path.clone(), Duration::from_millis(200));
    assert_eq!(redis.cli(&["CLIENT", "PAUSE", "1500", "ALL"]), "OK");
    let (server, ready) = TestServer::spawn(server);
    std::fs::write(&path, V2).unwrap();
    tokio::time::timeout(Duration::from_secs(20), ready).await.unwrap().unwrap();
    wait_for_rules(&server.service, &V2_RULES).await;
    server.stop().await;
}

/// A Redis that still answers, reads and holds the scripts but refuses writes (a replica:
/// `REPLICAOF`) is not ready: the probe admits once, and every call would fail.
#[tokio::test]
#[ignore = "needs redis-server on PATH (starts a server of its own)"]
async fn a_redis_that_refuses_writes_is_not_ready() {
    let redis = OwnRedis::start();
    let backend = own_redis_backend(&redis);
    let service = Service::new(rules(V1), &backend, hasher(), ServiceOptions::default());
    let loopback = "127.0.0.1:0".parse().unwrap();
    let server = Server::with_service(service, loopback, loopback)
        .await
        .unwrap()
        .with_probe_interval(Duration::from_millis(200));
    let server = TestServer::run(server).await;
    wait_for_health(&server, 200, "OK\n", ServingStatus::Serving).await;
    // A replica of a primary that does not exist: read-only.
    assert_eq!(redis.cli(&["REPLICAOF", "127.0.0.1", "1"]), "OK");
    eventually(Duration::from_secs(10), "503 naming the refused write", || async {
        let answer = http(server.http, "GET", "/healthcheck", "").await;
        answer.status == 503
            && answer.body.starts_with("backend not ready: Redis refuses admissions: ")
            && answer.body.contains("READONLY")
    })
    .await;
    assert_eq!(grpc_health(server.grpc, "").await.unwrap(), ServingStatus::NotServing);
    assert_eq!(redis.cli(&["REPLICAOF", "NO", "ONE"]), "OK");
    wait_for_health(&server, 200, "OK\n", ServingStatus::Serving).await;
    server.stop().await;
}

/// Regression: `--config` a symbolic link to a directory (`current -> v1`), re-pointed to
/// another (`v2`) by renaming a new link over it: the swap happens in the link's directory,
/// which is watched now (polling is hourly here). Edits inside the new target are seen too.
#[tokio::test]
async fn a_re_pointed_directory_link_and_edits_in_its_new_target_are_seen() {
    let root = tempfile::tempdir().unwrap();
    for (version, text) in [("v1", V1), ("v2", V2)] {
        std::fs::create_dir(root.path().join(version)).unwrap();
        std::fs::write(root.path().join(version).join("rules.yaml"), text).unwrap();
    }
    let current = root.path().join("current");
    std::os::unix::fs::symlink("v1", &current).unwrap();
    let (backend, _clock) = memory();
    let server = reloading(&current, &backend, Duration::from_secs(3_600)).await;
    wait_for_rules(&server.service, &V1_RULES).await;

    let next = root.path().join("current.next");
    std::os::unix::fs::symlink("v2", &next).unwrap();
    std::fs::rename(&next, &current).unwrap();
    wait_for_rules(&server.service, &V2_RULES).await;

    // An edit inside v2, now the target: replaced by a rename, as deployment tools do.
    let staged = root.path().join("v2").join(".rules.yaml.tmp");
    std::fs::write(&staged, V1).unwrap();
    std::fs::rename(&staged, root.path().join("v2").join("rules.yaml")).unwrap();
    wait_for_rules(&server.service, &V1_RULES).await;
    server.stop().await;
}
