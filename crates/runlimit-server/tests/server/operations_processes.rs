//! Operating the built `runlimit-server` binary: a refused reload counted in `/metrics`,
//! SIGHUP, SIGTERM while calls are in flight, JSON logs, the health endpoints following a
//! Redis server of the test's own, calls refused while the backend is prepared, and a reloader
//! that stays idle between changes.
//!
//! Every process (servers, `redis-server`s) is killed when its guard is dropped, also when a
//! test fails. Only `redis-server`s of the tests' own are paused, killed or reconfigured.
//!
//! ```text
//! cargo test -p runlimit-server --test server operations_processes:: -- --include-ignored
//! ```

use crate::backends;
use crate::support;

use std::{
    collections::BTreeSet,
    net::{SocketAddr, TcpStream},
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use crate::operations::V1;
use backends::{FILE_SECRET, Files, OwnRedis, ServerProcess, free_port, http_get, http_post};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, rate_limit_response::Code};
use support::{HOUR, RLS_SERVICE, client, grpc_health, request, views};
use tonic_health::pb::health_check_response::ServingStatus;

/// V1 with `user` at 10 per hour and a third rule, `tenant` (2 per hour).
const V2: &str = "\
domain: ops
descriptors:
  - key: client
    rate_limit:
      unit: hour
      requests_per_unit: 5
  - key: user
    rate_limit:
      unit: hour
      requests_per_unit: 10
  - key: tenant
    rate_limit:
      unit: hour
      requests_per_unit: 2
";

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

const INVALID_PROBLEM: &str = "descriptors[1].rate_limit.unit: unknown unit `hours`; expected one of second, minute, \
                               hour, day, week, month, year (any letter case)";

/// `/rlconfig`'s rule lines for V1 and V2.
const V1_DUMP: &str = "ops.client: unit=HOUR requests_per_unit=5, shadow_mode: false\n\
                       ops.user: unit=HOUR requests_per_unit=3, shadow_mode: false\n";
const V2_DUMP: &str = "ops.client: unit=HOUR requests_per_unit=5, shadow_mode: false\n\
                       ops.tenant: unit=HOUR requests_per_unit=2, shadow_mode: false\n\
                       ops.user: unit=HOUR requests_per_unit=10, shadow_mode: false\n";

const RELOADS: &str = "runlimit_server_config_reloads_total";

/// Starts the binary on the rules and key secret of `files`, on free loopback ports, with
/// `args`.
fn start(files: &Files, args: &[&str]) -> ServerProcess {
    let (rules, secret) = (files.rules(), files.secret());
    let mut all = vec!["--config", rules.as_str(), "--key-secret-file", secret.as_str()];
    all.extend_from_slice(args);
    ServerProcess::start(&all, &[])
}

/// The sample lines of `metric` in a Prometheus text exposition, sorted.
fn metric_lines(body: &str, metric: &str) -> Vec<String> {
    let mut lines: Vec<String> = body
        .lines()
        .filter(|line| line.starts_with(metric) && line[metric.len()..].starts_with(['{', ' ']))
        .map(str::to_owned)
        .collect();
    lines.sort();
    lines
}

/// Polls `GET path` (every 20 ms, at most 10 s) until `done(status line, body)`; returns the
/// last answer.
fn wait_for_http(
    address: SocketAddr,
    path: &str,
    what: &str,
    done: impl Fn(&str, &str) -> bool,
) -> (String, String) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (status, body) = http_get(address, path);
        if done(&status, &body) {
            return (status, body);
        }
        assert!(Instant::now() < deadline, "GET {path}: not {what} within 10 s; last: {status} {body:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits until `/rlconfig` lists `dump`, and returns its body.
fn wait_for_rules(process: &ServerProcess, dump: &str) -> String {
    wait_for_http(process.http, "/rlconfig", "the new rules", |_, body| body.ends_with(dump)).1
}

/// `(code, current limit, remaining)` of a status.
type Count = (Code, Option<(u32, i32)>, u32);

/// One call of domain `ops`: `(code, current limit, remaining)` of its one status.
async fn counted(address: SocketAddr, key: &str, value: &str) -> Count {
    let mut client = client(address).await;
    let response = client.should_rate_limit(request("ops", &[&[(key, value)]])).await.unwrap().into_inner();
    let [(code, limit, remaining, _)] = views(&response)[..] else { panic!("{response:?}") };
    (code, limit, remaining)
}

/// Every line of `stderr` as a JSON object (panics on a line that is not one).
fn json_lines(stderr: &str) -> Vec<serde_json::Map<String, serde_json::Value>> {
    stderr
        .lines()
        .map(|line| match serde_json::from_str::<serde_json::Value>(line) {
            Ok(serde_json::Value::Object(object)) => object,
            _ => panic!("not a JSON object: {line:?}\nstderr:\n{stderr}"),
        })
        .collect()
}

/// The events of `stderr` (JSON lines) whose message is `message`.
fn events(stderr: &str, message: &str) -> Vec<serde_json::Map<String, serde_json::Value>> {
    json_lines(stderr).into_iter().filter(|event| event["message"] == message).collect()
}

fn unix_now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs()
}

/// The decimal number right after the first `prefix` in `text`.
fn number_after(text: &str, prefix: &str) -> u64 {
    let (_, rest) = text.split_once(prefix).unwrap_or_else(|| panic!("no {prefix:?} in {text:?}"));
    rest[..rest.find(|c: char| !c.is_ascii_digit()).unwrap_or(rest.len())].parse().unwrap()
}

/// Makes sure the process's reloader has read the rules in force before a test changes them:
/// sends SIGHUP and waits (at most 10 s) for its reload (one more `rules reloaded` line, and one
/// more success in the reloads metric).
///
/// Without it a change made within milliseconds of the listening lines can be lost: the
/// reloader fingerprints the files it takes for the ones in force only after the lines are
/// printed, so it takes changed files for them and never loads them.
fn sync_reloader(process: &ServerProcess) {
    let reloads = || {
        let stderr = process.stderr();
        stderr.lines().filter(|line| line.contains("rules reloaded") && line.contains("SIGHUP")).count()
    };
    let before = reloads();
    process.send("HUP");
    let deadline = Instant::now() + Duration::from_secs(10);
    while reloads() == before {
        assert!(Instant::now() < deadline, "no reload after SIGHUP: {}", process.stderr());
        std::thread::sleep(Duration::from_millis(10));
    }
}

// ---------------------------------------------------------------------------------------------
// Reloads
// ---------------------------------------------------------------------------------------------

/// An invalid file is refused: the old rules keep serving with their counters, `/healthcheck`
/// answers 200 with the problem, `/rlconfig` shows it, and the failure is counted once (the
/// process polls the refused file every second and is told of it by file events too). A
/// valid file then loads: the problem gone, a success counted, counters continuing. (A
/// SIGHUP first, see [`sync_reloader`], counts one success.)
#[tokio::test]
async fn a_refused_reload_is_counted_shown_and_replaced_by_the_next_valid_one() {
    let files = Files::new(V1);
    let process = start(&files, &["--config-poll-interval-secs", "1"]);
    let rules = files.rules();
    for remaining in [4, 3] {
        assert_eq!(
            counted(process.grpc, "client", "192.0.2.4").await,
            (Code::Ok, Some((5, HOUR)), remaining)
        );
    }
    let (_, metrics) = http_get(process.http, "/metrics");
    assert_eq!(metric_lines(&metrics, RELOADS), Vec::<String>::new());
    sync_reloader(&process);
    let (_, metrics) = http_get(process.http, "/metrics");
    assert_eq!(metric_lines(&metrics, RELOADS), [format!("{RELOADS}{{result=\"success\"}} 1")]);

    let before = unix_now();
    files.replace("rules.yaml", INVALID);
    let (status, body) =
        wait_for_http(process.http, "/healthcheck", "the refused reload", |_, body| body != "OK\n");
    assert_eq!(status, "HTTP/1.1 200 OK");
    let problem = format!("{rules}: {INVALID_PROBLEM}");
    let (_, rlconfig) = http_get(process.http, "/rlconfig");
    // The times: the rules in force were loaded by the SIGHUP, the refusal came after `before`.
    let loaded = number_after(&rlconfig, "# loaded at unix time ");
    let refused = number_after(&body, "(at unix time ");
    assert!(loaded <= before && (before..=unix_now()).contains(&refused), "{loaded} {before} {refused}");
    assert_eq!(
        body,
        format!(
            "OK\nthe last reload was refused (at unix time {refused}); the rules loaded at unix time {loaded} still \
             serve:\n{problem}\n"
        )
    );
    assert_eq!(
        rlconfig,
        format!(
            "# loaded at unix time {loaded} from {rules}\n# the last reload was refused (at unix time {refused}):\n#   \
             {problem}\n{V1_DUMP}"
        )
    );

    // The rules in force keep serving.
    assert_eq!(counted(process.grpc, "client", "192.0.2.4").await, (Code::Ok, Some((5, HOUR)), 2));
    assert_eq!(counted(process.grpc, "user", "alice").await, (Code::Ok, Some((3, HOUR)), 2));
    // After another poll (every second), the same refused file is still counted once.
    std::thread::sleep(Duration::from_millis(1_200));
    let (_, metrics) = http_get(process.http, "/metrics");
    assert_eq!(
        metric_lines(&metrics, RELOADS),
        [format!("{RELOADS}{{result=\"failure\"}} 1"), format!("{RELOADS}{{result=\"success\"}} 1")]
    );

    files.replace("rules.yaml", V2);
    let rlconfig = wait_for_rules(&process, V2_DUMP);
    assert_eq!(rlconfig.lines().count(), 4, "no refused reload shown: {rlconfig}");
    assert_eq!(http_get(process.http, "/healthcheck"), ("HTTP/1.1 200 OK".to_owned(), "OK\n".to_owned()));
    let (_, metrics) = http_get(process.http, "/metrics");
    assert_eq!(
        metric_lines(&metrics, RELOADS),
        [format!("{RELOADS}{{result=\"failure\"}} 1"), format!("{RELOADS}{{result=\"success\"}} 2")]
    );
    assert_eq!(counted(process.grpc, "client", "192.0.2.4").await, (Code::Ok, Some((5, HOUR)), 1));
    assert_eq!(counted(process.grpc, "user", "alice").await, (Code::Ok, Some((10, HOUR)), 9));
    assert_eq!(counted(process.grpc, "tenant", "acme").await, (Code::Ok, Some((2, HOUR)), 1));
    let (status, stderr) = tokio::task::spawn_blocking(move || process.terminate()).await.unwrap();
    assert_eq!(status.code(), Some(0), "{stderr}");
}

/// SIGHUP reloads, even with hourly polling and a change no file event announces (written
/// through a hard link in another directory, which inotify reports to that directory only):
/// the change is not seen until the signal, then it is, logged with `trigger: SIGHUP`.
/// SIGHUP also reloads unchanged files (counted, counters untouched), as the first and the
/// last one here do.
#[tokio::test]
async fn sighup_reloads_the_rules() {
    let files = Files::new(V1);
    let process = start(&files, &["--config-poll-interval-secs", "3600", "--log-format", "json"]);
    assert_eq!(counted(process.grpc, "client", "192.0.2.4").await, (Code::Ok, Some((5, HOUR)), 4));
    sync_reloader(&process);
    let first = events(&process.stderr(), "rules reloaded");
    assert_eq!((&first[0]["trigger"], &first[0]["restarted_counters"]), (&"SIGHUP".into(), &0.into()));

    let elsewhere = tempfile::tempdir().unwrap();
    let link = elsewhere.path().join("rules-link.yaml");
    std::fs::hard_link(files.path("rules.yaml"), &link).unwrap();
    std::fs::write(&link, V2).unwrap();
    // Nothing announces the change: well past the reloader's 200 ms settling time, the old
    // rules still serve.
    std::thread::sleep(Duration::from_millis(700));
    assert!(http_get(process.http, "/rlconfig").1.ends_with(V1_DUMP));
    assert_eq!(events(&process.stderr(), "rules reloaded").len(), 1);

    process.send("HUP");
    wait_for_rules(&process, V2_DUMP);
    assert_eq!(counted(process.grpc, "client", "192.0.2.4").await, (Code::Ok, Some((5, HOUR)), 3));
    assert_eq!(counted(process.grpc, "user", "alice").await, (Code::Ok, Some((10, HOUR)), 9));
    let reloads = events(&process.stderr(), "rules reloaded");
    assert_eq!(reloads.len(), 2, "{reloads:?}");
    assert_eq!(reloads[1]["trigger"], "SIGHUP");
    assert_eq!(reloads[1]["level"], "INFO");
    assert_eq!(reloads[1]["restarted_counters"], 1);
    assert_eq!(reloads[1]["rules"], 3);

    process.send("HUP");
    let deadline = Instant::now() + Duration::from_secs(10);
    while events(&process.stderr(), "rules reloaded").len() < 3 {
        assert!(Instant::now() < deadline, "no second SIGHUP reload: {}", process.stderr());
        std::thread::sleep(Duration::from_millis(20));
    }
    let reloads = events(&process.stderr(), "rules reloaded");
    assert_eq!((&reloads[2]["trigger"], &reloads[2]["restarted_counters"]), (&"SIGHUP".into(), &0.into()));
    assert_eq!(counted(process.grpc, "client", "192.0.2.4").await, (Code::Ok, Some((5, HOUR)), 2));
    let (_, metrics) = http_get(process.http, "/metrics");
    assert_eq!(metric_lines(&metrics, RELOADS), [format!("{RELOADS}{{result=\"success\"}} 3")]);
    let (status, stderr) = tokio::task::spawn_blocking(move || process.terminate()).await.unwrap();
    assert_eq!(status.code(), Some(0), "{stderr}");
}

/// Between changes the reloader reads nothing (apart from its polls, hourly here).
/// Regression: `notify` reports every opening of a file, so each reload's own reading of the
/// rules triggered the next one, five times a second for ever.
#[tokio::test]
async fn the_reloader_is_idle_between_changes() {
    // 256 KiB of comments: each reading of the rules is plain in the process's read count.
    let padding =
        "# padding padding padding padding padding padding padding padding padding padding\n".repeat(3_200);
    let files = Files::new(&format!("{V1}{padding}"));
    let process = start(&files, &["--config-poll-interval-secs", "3600"]);
    sync_reloader(&process);
    files.replace("rules.yaml", &format!("{V2}{padding}"));
    wait_for_rules(&process, V2_DUMP);
    // Past the settling time of the events of the reload itself.
    std::thread::sleep(Duration::from_millis(500));
    let before = process.bytes_read();
    std::thread::sleep(Duration::from_millis(1_500));
    let read = process.bytes_read() - before;
    assert!(read < 64 * 1024, "{read} bytes read in 1.5 s by an idle server");
    let (status, stderr) = tokio::task::spawn_blocking(move || process.terminate()).await.unwrap();
    assert_eq!(status.code(), Some(0), "{stderr}");
}

// ---------------------------------------------------------------------------------------------
// SIGTERM
// ---------------------------------------------------------------------------------------------

/// SIGTERM while a reload is still compiling a large rule set (100,000 rules, about 9 MB; tens
/// of seconds in a debug build) stops the process within the shutdown's bound: the reload is
/// abandoned, not waited for. Regression: the process logged `stopped` at once but exited only
/// when the reload ended.
#[test]
fn sigterm_during_a_long_reload_exits_without_waiting_for_it() {
    use std::fmt::Write as _;
    let files = Files::new(V1);
    let dir = files.dir().display().to_string();
    let secret = files.secret();
    let process = ServerProcess::start(&["--config", &dir, "--key-secret-file", &secret], &[]);
    let mut large = String::from("domain: large\ndescriptors:\n");
    for index in 0..100_000 {
        let _ = writeln!(large, "  - {{key: k{index}, rate_limit: {{unit: second, requests_per_unit: 5}}}}");
    }
    let before = process.bytes_read();
    files.replace("large.yaml", &large);
    process.send("HUP");
    // The reload has read the new file once the process has read that many more bytes.
    let deadline = Instant::now() + Duration::from_secs(30);
    while process.bytes_read() < before + u64::try_from(large.len()).unwrap() {
        assert!(Instant::now() < deadline, "the reload never read the file: {}", process.stderr());
        std::thread::sleep(Duration::from_millis(10));
    }
    let started = Instant::now();
    process.send("TERM");
    let (status, stderr) = process.wait_exit(Duration::from_secs(15));
    assert_eq!(status.code(), Some(0), "{stderr}");
    assert!(stderr.contains("stopped"), "{stderr}");
    // At once: the reload has tens of seconds left (a debug build), which the exit would wait.
    assert!(started.elapsed() < Duration::from_secs(5), "{:?}", started.elapsed());
}

const CLIENTS: usize = 4;
const CALLS_PER_CLIENT: usize = 8;

/// SIGTERM while 32 gRPC calls from 4 connections and a `POST /json` are in flight (held by a
/// Redis server of the test's own, paused for 600 ms, less than the 1 s Redis operation
/// timeout): new connections are refused at once, every call in flight completes with a valid
/// response (none lost or cut: 33 sent, 33 answered, each taking one distinct unit of the
/// counter), and the process exits 0 well within the grace period.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs redis-server on PATH (starts a server of its own)"]
async fn sigterm_lets_the_calls_in_flight_finish() {
    let redis = OwnRedis::start();
    let files = Files::new(
        "domain: ops\ndescriptors:\n  - key: client\n    rate_limit: { unit: hour, requests_per_unit: 1000 }\n",
    );
    let url = redis.url();
    let process =
        start(&files, &["--redis-url", &url, "--redis-key-prefix", "drain", "--probe-interval-secs", "3600"]);
    let call = || request("ops", &[&[("client", "192.0.2.4")]]);
    let mut clients = Vec::new();
    for index in 0..CLIENTS {
        let mut client = client(process.grpc).await;
        let response = client.should_rate_limit(call()).await.unwrap().into_inner();
        assert_eq!(views(&response)[0].2, 999 - u32::try_from(index).unwrap());
        clients.push(client);
    }

    assert_eq!(redis.cli(&["CLIENT", "PAUSE", "600", "ALL"]), "OK");
    let paused = Instant::now();
    let answered = Arc::new(AtomicUsize::new(0));
    let answers = Arc::clone(&answered);
    let mut calls = Vec::new();
    for client in &clients {
        for _ in 0..CALLS_PER_CLIENT {
            let mut client = client.clone();
            let answered = Arc::clone(&answered);
            calls.push(tokio::spawn(async move {
                let result = client.should_rate_limit(call()).await;
                answered.fetch_add(1, Ordering::SeqCst);
                result
            }));
        }
    }
    // And one through POST /json.
    let http = process.http;
    let json_call = tokio::task::spawn_blocking(move || {
        let answer = http_post(
            http,
            "/json",
            r#"{"domain":"ops","descriptors":[{"entries":[{"key":"client","value":"192.0.2.4"}]}]}"#,
        );
        answered.fetch_add(1, Ordering::SeqCst);
        answer
    });
    let sent = calls.len() + 1;
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert_eq!(answers.load(Ordering::SeqCst), 0, "calls were answered while Redis was paused");
    let signaled = Instant::now();
    process.send("TERM");

    // No new connection: both listening sockets are closed, while the calls are still held.
    let deadline = signaled + Duration::from_secs(2);
    for address in [process.grpc, process.http] {
        while TcpStream::connect(address).is_ok() {
            assert!(Instant::now() < deadline, "{address} still accepts connections after SIGTERM");
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    assert!(
        paused.elapsed() < Duration::from_millis(600),
        "the pause ended before the checks: {:?}",
        paused.elapsed()
    );
    assert_eq!(answers.load(Ordering::SeqCst), 0, "new connections were refused only after the calls ended");

    let mut remaining = BTreeSet::new();
    for call in calls {
        let response =
            call.await.unwrap().unwrap_or_else(|status| panic!("a call in flight failed: {status:?}"));
        let [(code, limit, left, _)] = views(&response.into_inner())[..] else { panic!("one status") };
        assert_eq!((code, limit), (Code::Ok, Some((1000, HOUR))));
        remaining.insert(left);
    }
    let (status, body) = json_call.await.unwrap();
    assert_eq!(status, "HTTP/1.1 200 OK", "{body}");
    let json: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        json["statuses"][0]["currentLimit"],
        serde_json::json!({"requestsPerUnit": 1000, "unit": "HOUR"})
    );
    remaining.insert(u32::try_from(json["statuses"][0]["limitRemaining"].as_u64().unwrap()).unwrap());
    assert_eq!(remaining, (963..=995).collect::<BTreeSet<u32>>(), "{sent} sent");
    drop(clients);
    let (status, stderr) =
        tokio::task::spawn_blocking(move || process.wait_exit(Duration::from_secs(20))).await.unwrap();
    let stopped_after = signaled.elapsed();
    assert_eq!(status.code(), Some(0), "{stderr}");
    assert!(stopped_after < runlimit_server::SHUTDOWN_GRACE, "stopped {stopped_after:?} after SIGTERM");
    assert!(stderr.contains("shutting down: no new connections, finishing in-flight calls"), "{stderr}");
    assert!(!stderr.contains("stopped with connections still open"), "{stderr}");
}

/// What happened to one call of the load.
struct Outcome {
    started: Instant,
    result: Result<Count, tonic::Status>,
}

const LOAD_LIMIT: u32 = 100_000_000;

/// SIGTERM under load on memory: 4 connections with 4 callers each, calling back to back,
/// each caller with a descriptor value of its own. Every call started before the signal is
/// answered, validly, and each caller's answers count its counter down one by one; calls
/// started after it are answered or fail by their connection, never by an answer of the
/// service (the connection refused; a request still queued or being written when the server
/// closed the connection; a stream above the last one the server's GOAWAY says it processed),
/// and none hangs; every call is accounted for; the process exits 0 within the grace period.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_under_load_loses_no_call() {
    let files = Files::new(&format!(
        "domain: ops\ndescriptors:\n  - key: client\n    rate_limit: {{ unit: hour, requests_per_unit: {LOAD_LIMIT} }}\n"
    ));
    let process = start(&files, &[]);
    let sent = Arc::new(AtomicUsize::new(0));
    let mut callers = Vec::new();
    for connection in 0..CLIENTS {
        let client = client(process.grpc).await;
        for caller in 0..4 {
            let mut client = client.clone();
            let sent = Arc::clone(&sent);
            let value = format!("192.0.2.{}", connection * 4 + caller);
            callers.push(tokio::spawn(async move {
                let mut outcomes = Vec::new();
                loop {
                    let started = Instant::now();
                    sent.fetch_add(1, Ordering::SeqCst);
                    let call = client.should_rate_limit(request("ops", &[&[("client", value.as_str())]]));
                    let result = match tokio::time::timeout(Duration::from_secs(15), call).await {
                        Err(_) => panic!("a call hung after SIGTERM"),
                        Ok(Ok(response)) => {
                            let [(code, limit, remaining, _)] = views(&response.into_inner())[..] else {
                                panic!("not one status")
                            };
                            Ok((code, limit, remaining))
                        }
                        Ok(Err(status)) => Err(status),
                    };
                    let failed = result.is_err();
                    outcomes.push(Outcome { started, result });
                    if failed {
                        return outcomes;
                    }
                }
            }));
        }
    }
    tokio::time::sleep(Duration::from_millis(400)).await;
    let signaled = Instant::now();
    process.send("TERM");
    let (status, stderr) =
        tokio::task::spawn_blocking(move || process.wait_exit(Duration::from_secs(20))).await.unwrap();
    assert_eq!(status.code(), Some(0), "{stderr}");
    assert!(signaled.elapsed() < runlimit_server::SHUTDOWN_GRACE, "{:?}", signaled.elapsed());

    let mut total = 0;
    let mut before = 0;
    for caller in callers {
        let outcomes = caller.await.unwrap();
        total += outcomes.len();
        before += outcomes.iter().filter(|outcome| outcome.started < signaled).count();
        let (last, answered) = outcomes.split_last().unwrap();
        for (index, outcome) in answered.iter().enumerate() {
            let left = LOAD_LIMIT - 1 - u32::try_from(index).unwrap();
            assert_eq!(outcome.result.as_ref().unwrap(), &(Code::Ok, Some((LOAD_LIMIT, HOUR)), left));
        }
        // Each caller stops at its first failure, once the server is gone.
        let failure = last.result.as_ref().unwrap_err();
        assert!(last.started >= signaled, "a call started before SIGTERM failed: {failure:?}");
        let transport = std::error::Error::source(failure)
            .is_some_and(|source| source.downcast_ref::<tonic::transport::Error>().is_some());
        assert!(transport, "a call after SIGTERM failed other than by its connection: {failure:?}");
    }
    assert_eq!(total, sent.load(Ordering::SeqCst), "every call sent has an outcome");
    assert!(before > 16, "only {before} calls before the signal");
}

// ---------------------------------------------------------------------------------------------
// Logs
// ---------------------------------------------------------------------------------------------

/// `--log-format json`: every stderr line is one JSON object (timestamp, level, message,
/// target), for startup, listening, reloads (on SIGHUP, refused, done) and shutdown; no line
/// holds a descriptor value sent, or the key secret.
#[tokio::test]
async fn json_logs_are_one_object_per_line_without_values_or_the_secret() {
    const VALUES: [&str; 4] = [
        "value-sent-by-a-test-7f3a",
        "json-value-sent-by-a-test-9c1d",
        "refused-value-4b2e",
        "other-domain-value-5e6f",
    ];
    let files = Files::new(V1);
    let process = start(&files, &["--log-format", "json", "--config-poll-interval-secs", "1"]);
    let mut client = client(process.grpc).await;
    for _ in 0..7 {
        client
            .should_rate_limit(request("ops", &[&[("user", VALUES[0])], &[("client", VALUES[0])]]))
            .await
            .unwrap();
    }
    let body = format!(
        r#"{{"domain":"ops","descriptors":[{{"entries":[{{"key":"user","value":"{}"}}]}}]}}"#,
        VALUES[1]
    );
    for _ in 0..4 {
        http_post(process.http, "/json", &body);
    }
    let refused =
        RateLimitRequest { hits_addend: 0, ..request("ops", &[&[("user", VALUES[2])], &[("", VALUES[2])]]) };
    assert_eq!(client.should_rate_limit(refused).await.unwrap_err().code(), tonic::Code::InvalidArgument);
    client.should_rate_limit(request("elsewhere", &[&[("user", VALUES[3])]])).await.unwrap();

    sync_reloader(&process);
    files.replace("rules.yaml", INVALID);
    wait_for_http(process.http, "/healthcheck", "the refused reload", |_, body| body != "OK\n");
    files.replace("rules.yaml", V2);
    wait_for_rules(&process, V2_DUMP);
    let (status, stderr) = tokio::task::spawn_blocking(move || process.terminate()).await.unwrap();
    assert_eq!(status.code(), Some(0), "{stderr}");

    let lines = json_lines(&stderr);
    for line in &lines {
        for field in ["timestamp", "level", "message", "target"] {
            assert!(line.contains_key(field), "no {field}: {line:?}");
        }
    }
    let messages: Vec<&str> = lines.iter().map(|line| line["message"].as_str().unwrap()).collect();
    let rules = files.rules();
    let expected = [
        "rules loaded",
        "backend prepared: serving",
        "listening",
        "rules reloaded",
        "reload refused: the rules in force keep serving",
        "invalid rule files",
        "rules reloaded",
        "reload restarts this rule's counters (changed limit, unit, algorithm, burst or share_threshold): every \
         client gets the new limit's whole quota at once",
        "shutting down: no new connections, finishing in-flight calls",
        "stopped",
    ];
    assert_eq!(messages, expected, "{stderr}");
    assert_eq!(lines[0]["config"], rules.as_str());
    assert_eq!(
        (&lines[0]["backend"], &lines[0]["domains"], &lines[0]["rules"]),
        (&"memory".into(), &1.into(), &2.into())
    );
    assert_eq!((&lines[3]["trigger"], &lines[3]["restarted_counters"]), (&"SIGHUP".into(), &0.into()));
    assert_eq!(lines[5]["problem"], format!("{rules}: {INVALID_PROBLEM}").as_str());
    assert_eq!(lines[5]["level"], "ERROR");
    assert!(["file event", "poll"].contains(&lines[6]["trigger"].as_str().unwrap()), "{:?}", lines[6]);
    assert_eq!(lines[7]["rule"], "ops.user: 3 per hour (fixed_window) -> 10 per hour (fixed_window)");
    for value in VALUES.iter().chain([&FILE_SECRET]) {
        assert!(!stderr.contains(value), "{value} in the logs:\n{stderr}");
    }
}

// ---------------------------------------------------------------------------------------------
// Health and readiness
// ---------------------------------------------------------------------------------------------

/// With `--probe-interval-secs 1`: a killed Redis turns `/healthcheck` to 503 with the reason
/// and gRPC health to NOT_SERVING within a few probes, logged once; a restarted one turns both
/// back, logged once.
#[tokio::test]
#[ignore = "needs redis-server on PATH (starts a server of its own)"]
async fn health_follows_a_killed_and_restarted_redis() {
    let mut redis = OwnRedis::start();
    let port = redis.port();
    let files = Files::new(V1);
    let url = redis.url();
    let process = start(&files, &["--redis-url", &url, "--probe-interval-secs", "1", "--log-format", "json"]);
    assert_eq!(http_get(process.http, "/healthcheck"), ("HTTP/1.1 200 OK".to_owned(), "OK\n".to_owned()));
    assert_eq!(grpc_health(process.grpc, RLS_SERVICE).await.unwrap(), ServingStatus::Serving);

    redis.stop();
    let reason = format!(
        "Redis at 127.0.0.1:{port} cannot be used: could not prepare the Redis server: could not connect to Redis \
         at 127.0.0.1:{port}: Connection refused (os error 111)"
    );
    let (status, body) =
        wait_for_http(process.http, "/healthcheck", "503", |status, _| status.contains("503"));
    assert_eq!(
        (status.as_str(), body),
        ("HTTP/1.1 503 Service Unavailable", format!("backend not ready: {reason}\n"))
    );
    assert_eq!(grpc_health(process.grpc, RLS_SERVICE).await.unwrap(), ServingStatus::NotServing);

    redis.restart();
    wait_for_http(process.http, "/healthcheck", "200", |status, _| status.contains("200"));
    assert_eq!(grpc_health(process.grpc, RLS_SERVICE).await.unwrap(), ServingStatus::Serving);
    let (status, stderr) = tokio::task::spawn_blocking(move || process.terminate()).await.unwrap();
    assert_eq!(status.code(), Some(0), "{stderr}");
    let down = events(&stderr, "backend not ready");
    assert_eq!(down.len(), 1, "{stderr}");
    assert_eq!((&down[0]["level"], &down[0]["backend"]), (&"ERROR".into(), &"redis".into()));
    assert_eq!(down[0]["reason"], reason.as_str());
    let up = events(&stderr, "backend ready again");
    assert_eq!(up.len(), 1, "{stderr}");
    assert_eq!((&up[0]["level"], &up[0]["backend"]), (&"INFO".into(), &"redis".into()));
}

/// While the backend is prepared (a Redis server of the test's own paused for 900 ms, less
/// than the 1 s Redis operation timeout the binary uses), the listeners are already up: calls
/// are refused UNAVAILABLE (nothing consumed), `/json` 503, `/healthcheck` 503 and gRPC health
/// NOT_SERVING. Then the process announces its addresses and serves.
#[tokio::test]
#[ignore = "needs redis-server on PATH (starts a server of its own)"]
async fn calls_are_refused_while_the_backend_is_prepared() {
    let redis = OwnRedis::start();
    let files = Files::new(V1);
    let (rules, secret, url) = (files.rules(), files.secret(), redis.url());
    let grpc: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let http: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let (grpc_text, http_text) = (grpc.to_string(), http.to_string());
    let args = [
        "--config",
        &rules,
        "--key-secret-file",
        &secret,
        "--redis-url",
        &url,
        "--grpc-addr",
        &grpc_text,
        "--http-addr",
        &http_text,
    ];
    assert_eq!(redis.cli(&["CLIENT", "PAUSE", "900", "ALL"]), "OK");
    let paused = Instant::now();
    let starting = ServerProcess::spawn(&args, &[]);
    // The HTTP listener is bound before the backend is prepared.
    while TcpStream::connect(http).is_err() {
        assert!(paused.elapsed() < Duration::from_millis(700), "the HTTP listener was not bound in time");
        std::thread::sleep(Duration::from_millis(2));
    }
    let health = http_get(http, "/healthcheck");
    let not_ready = "not ready: the rate limit backend is being prepared (no quota was consumed)";
    let json = http_post(
        http,
        "/json",
        r#"{"domain":"ops","descriptors":[{"entries":[{"key":"client","value":"192.0.2.4"}]}]}"#,
    );
    let grpc_health_status = grpc_health(grpc, RLS_SERVICE).await.unwrap();
    let mut early = client(grpc).await;
    let refused = early.should_rate_limit(request("ops", &[&[("client", "192.0.2.4")]])).await.unwrap_err();
    let checked = paused.elapsed();
    assert!(checked < Duration::from_millis(900), "the checks ran after the pause: {checked:?}");
    assert_eq!(health, ("HTTP/1.1 503 Service Unavailable".to_owned(), "preparing the backend\n".to_owned()));
    assert_eq!(json, ("HTTP/1.1 503 Service Unavailable".to_owned(), format!("{not_ready}\n")));
    assert_eq!(grpc_health_status, ServingStatus::NotServing);
    assert_eq!((refused.code(), refused.message()), (tonic::Code::Unavailable, not_ready));

    let process = tokio::task::spawn_blocking(move || starting.ready()).await.unwrap();
    assert_eq!((process.grpc, process.http), (grpc, http));
    assert_eq!(http_get(http, "/healthcheck"), ("HTTP/1.1 200 OK".to_owned(), "OK\n".to_owned()));
    assert_eq!(grpc_health(grpc, RLS_SERVICE).await.unwrap(), ServingStatus::Serving);
    // Nothing was consumed by the refused calls.
    assert_eq!(counted(grpc, "client", "192.0.2.4").await, (Code::Ok, Some((5, HOUR)), 4));
    let (status, stderr) = tokio::task::spawn_blocking(move || process.terminate()).await.unwrap();
    assert_eq!(status.code(), Some(0), "{stderr}");
}
