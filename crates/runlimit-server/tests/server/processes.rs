//! The built `runlimit-server` binary as an operator runs it: two processes sharing one Redis
//! (same `--redis-key-prefix`) or one PostgreSQL database under concurrent clients, the
//! startup errors (exit code and exact stderr), `--help`, and SIGTERM.
//!
//! The shared servers are the ones named by `RUNLIMIT_REDIS_TEST_URL` (each test under a key
//! prefix of its own, deleted at the end) and `RUNLIMIT_POSTGRES_TEST_DATABASE_URL` (each test
//! in a database of its own). Every process is killed when its guard is dropped, also when a
//! test fails.
//!
//! ```text
//! RUNLIMIT_REDIS_TEST_URL=redis://127.0.0.1:6379 \
//! RUNLIMIT_POSTGRES_TEST_DATABASE_URL=postgres://postgres@127.0.0.1:5432/test \
//!     cargo test -p runlimit-server --test server processes:: -- --include-ignored
//! ```

use crate::backends;
use crate::support;

use std::{collections::BTreeMap, net::SocketAddr, time::Duration};

use backends::{
    Files, OwnRedis, RedisKeys, ServerProcess, TestDatabase, free_port, http_get, loopback, redis_url,
    run_to_exit, unique_prefix,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{
    RateLimitRequest,
    rate_limit_response::{Code, rate_limit::Unit},
};
use support::{StatusView, client, descriptor, overall, request, views, with_hits};

const HOUR: i32 = Unit::Hour as i32;

/// One rule of 50 per hour, and a broad tenant rule beside per-user ones.
const RULES: &str = "
domain: shared
descriptors:
  - key: client
    rate_limit:
      unit: hour
      requests_per_unit: 50
  - key: tenant
    value: acme
    rate_limit:
      unit: hour
      requests_per_unit: 1000
  - key: tenant
    value: globex
    rate_limit:
      unit: hour
      requests_per_unit: 30
  - key: user
    rate_limit:
      unit: hour
      requests_per_unit: 20
";

const PROCESSES: usize = 2;
const TASKS_PER_PROCESS: usize = 8;
const REQUESTS_PER_TASK: usize = 16;
/// 256 requests in all.
const TOTAL: usize = PROCESSES * TASKS_PER_PROCESS * REQUESTS_PER_TASK;

/// Starts two processes at once (so they prepare the backend concurrently) with `args`, the
/// rules and the key secret file of `files`.
fn two_processes(files: &Files, args: &[&str]) -> [ServerProcess; 2] {
    let (rules, secret) = (files.rules(), files.secret());
    let mut all = vec!["--config", rules.as_str(), "--key-secret-file", secret.as_str()];
    all.extend_from_slice(args);
    let all = loopback(&all);
    let first = ServerProcess::spawn(&all, &[]);
    let second = ServerProcess::spawn(&all, &[]);
    [first.ready(), second.ready()]
}

/// Sends `TOTAL` requests from `TASKS_PER_PROCESS` concurrent tasks per process (each task with
/// a connection of its own); `make(task, n)` builds the `n`th request of task `task` (tasks
/// numbered across processes). Returns every `(task, n, overall code, statuses)`.
async fn hammer(
    processes: &[ServerProcess],
    make: fn(usize, usize) -> RateLimitRequest,
) -> Vec<(usize, usize, Code, Vec<StatusView>)> {
    let mut tasks = Vec::new();
    for (index, process) in processes.iter().enumerate() {
        for local in 0..TASKS_PER_PROCESS {
            let task = index * TASKS_PER_PROCESS + local;
            let address: SocketAddr = process.grpc;
            tasks.push(tokio::spawn(async move {
                let mut client = client(address).await;
                let mut answers = Vec::with_capacity(REQUESTS_PER_TASK);
                for n in 0..REQUESTS_PER_TASK {
                    let response = client
                        .should_rate_limit(make(task, n))
                        .await
                        .unwrap_or_else(|status| panic!("task {task} request {n}: {status:?}"))
                        .into_inner();
                    answers.push((task, n, overall(&response), views(&response)));
                }
                answers
            }));
        }
    }
    let mut all = Vec::with_capacity(TOTAL);
    for task in tasks {
        all.extend(task.await.unwrap());
    }
    assert_eq!(all.len(), TOTAL);
    all
}

/// A check-only read (`hits_addend: 0`) of one counter through `process`: `(code, remaining)`.
async fn read(process: &ServerProcess, key: &str, value: &str) -> (Code, u32) {
    let request = RateLimitRequest {
        domain: "shared".into(),
        descriptors: vec![with_hits(descriptor(&[(key, value)]), 0)],
        hits_addend: 0,
    };
    let mut client = client(process.grpc).await;
    let response = client.should_rate_limit(request).await.unwrap().into_inner();
    let view = views(&response)[0];
    (view.0, view.2)
}

/// One rule of 50 per hour, hammered through both processes: exactly 50 of `TOTAL` are
/// admitted, each with a distinct remaining count, and both processes then read 0 left.
async fn exactly_the_limit_is_admitted(processes: &[ServerProcess]) {
    let answers = hammer(processes, |_, _| request("shared", &[&[("client", "192.0.2.4")]])).await;
    let admitted: Vec<u32> = answers
        .iter()
        .filter(|(_, _, code, _)| *code == Code::Ok)
        .map(|(_, _, _, statuses)| {
            assert_eq!(statuses[0].0, Code::Ok);
            assert_eq!(statuses[0].1, Some((50, HOUR)));
            statuses[0].2
        })
        .collect();
    assert_eq!(admitted.len(), 50, "admitted {} of {TOTAL}", admitted.len());
    // Every admission took one unit of the one shared counter: remaining 49 down to 0, each once.
    let mut remaining = admitted;
    remaining.sort_unstable();
    assert_eq!(remaining, (0..50).collect::<Vec<u32>>());
    for (_, _, code, statuses) in answers.iter().filter(|(_, _, code, _)| *code != Code::Ok) {
        assert_eq!(*code, Code::OverLimit);
        assert_eq!(statuses[0].0, Code::OverLimit);
        assert_eq!(statuses[0].1, Some((50, HOUR)));
        assert_eq!(statuses[0].2, 0);
    }
    for process in processes {
        assert_eq!(read(process, "client", "192.0.2.4").await, (Code::OverLimit, 0));
    }
}

/// Two descriptors per request, hammered through both processes. Tenant `acme` (1000 per hour)
/// with users a0..a3 (20 each): exactly 80 admitted, 20 per user, and acme's counter charged
/// exactly 80 (920 left): the requests over a user's limit charged nothing. Tenant `globex` (30
/// per hour) with users g0..g3 (20 each): exactly 30 admitted, and each user's counter charged
/// exactly its admitted requests: the requests over the tenant's limit charged no user.
async fn two_descriptor_requests_are_atomic(processes: &[ServerProcess]) {
    let answers = hammer(processes, |task, n| {
        let (tenant, user) = if (task + n) % 2 == 0 {
            ("acme", ["a0", "a1", "a2", "a3"][(task + n / 2) % 4])
        } else {
            ("globex", ["g0", "g1", "g2", "g3"][(task + n / 2) % 4])
        };
        request("shared", &[&[("tenant", tenant)], &[("user", user)]])
    })
    .await;
    let mut admitted: BTreeMap<&str, u32> = BTreeMap::new();
    let mut requests: BTreeMap<&str, u32> = BTreeMap::new();
    for (task, n, code, statuses) in &answers {
        let (tenant, user) = if (task + n) % 2 == 0 {
            ("acme", ["a0", "a1", "a2", "a3"][(task + n / 2) % 4])
        } else {
            ("globex", ["g0", "g1", "g2", "g3"][(task + n / 2) % 4])
        };
        *requests.entry(user).or_default() += 1;
        match code {
            Code::Ok => {
                *admitted.entry(tenant).or_default() += 1;
                *admitted.entry(user).or_default() += 1;
                assert_eq!(statuses[0].0, Code::Ok);
                assert_eq!(statuses[1].0, Code::Ok);
            }
            Code::OverLimit => {
                // Exactly one descriptor is reported over its limit; the other was not charged.
                let over = statuses.iter().filter(|status| status.0 == Code::OverLimit).count();
                assert_eq!(over, 1, "{statuses:?}");
            }
            Code::Unknown => panic!("code UNKNOWN: {statuses:?}"),
        }
    }
    // Each user asked at least 20 times, so every acme user used up its 20.
    assert!(requests.values().all(|&count| count >= 20), "{requests:?}");
    assert_eq!(admitted.get("acme"), Some(&80), "{admitted:?}");
    for user in ["a0", "a1", "a2", "a3"] {
        assert_eq!(admitted.get(user), Some(&20), "{admitted:?}");
    }
    assert_eq!(admitted.get("globex"), Some(&30), "{admitted:?}");
    let globex_users: u32 =
        ["g0", "g1", "g2", "g3"].iter().map(|user| admitted.get(user).copied().unwrap_or(0)).sum();
    assert_eq!(globex_users, 30, "{admitted:?}");

    // The counters, read through either process: exactly the admitted requests were charged.
    for process in processes {
        assert_eq!(read(process, "tenant", "acme").await, (Code::Ok, 920));
        assert_eq!(read(process, "tenant", "globex").await, (Code::OverLimit, 0));
        for user in ["a0", "a1", "a2", "a3"] {
            assert_eq!(read(process, "user", user).await, (Code::OverLimit, 0), "{user}");
        }
        for user in ["g0", "g1", "g2", "g3"] {
            let left = 20 - admitted.get(user).copied().unwrap_or(0);
            let code = if left == 0 { Code::OverLimit } else { Code::Ok };
            assert_eq!(read(process, "user", user).await, (code, left), "{user}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs RUNLIMIT_REDIS_TEST_URL"]
async fn two_processes_on_one_redis_admit_exactly_the_limit() {
    let url = redis_url();
    let prefix = unique_prefix("two-limit");
    let keys = RedisKeys::new(&url, &prefix);
    let files = Files::new(RULES);
    let processes = two_processes(&files, &["--redis-url", &url, "--redis-key-prefix", &prefix]);
    exactly_the_limit_is_admitted(&processes).await;
    for process in processes {
        let (status, stderr) = process.terminate();
        assert_eq!(status.code(), Some(0), "{stderr}");
    }
    assert!(keys.delete() > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs RUNLIMIT_REDIS_TEST_URL"]
async fn two_processes_on_one_redis_charge_two_descriptor_requests_atomically() {
    let url = redis_url();
    let prefix = unique_prefix("two-atomic");
    let keys = RedisKeys::new(&url, &prefix);
    let files = Files::new(RULES);
    let processes = two_processes(&files, &["--redis-url", &url, "--redis-key-prefix", &prefix]);
    two_descriptor_requests_are_atomic(&processes).await;
    drop(processes);
    assert!(keys.delete() > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs RUNLIMIT_POSTGRES_TEST_DATABASE_URL"]
async fn two_processes_on_one_postgres_database_admit_exactly_the_limit() {
    let database = TestDatabase::create("two_limit").await;
    let files = Files::new(RULES);
    let processes =
        two_processes(&files, &["--database-url", &database.url, "--database-max-connections", "4"]);
    exactly_the_limit_is_admitted(&processes).await;
    for process in processes {
        let (status, stderr) = process.terminate();
        assert_eq!(status.code(), Some(0), "{stderr}");
    }
    database.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs RUNLIMIT_POSTGRES_TEST_DATABASE_URL"]
async fn two_processes_on_one_postgres_database_charge_two_descriptor_requests_atomically() {
    let database = TestDatabase::create("two_atomic").await;
    let files = Files::new(RULES);
    let processes =
        two_processes(&files, &["--database-url", &database.url, "--database-max-connections", "4"]);
    two_descriptor_requests_are_atomic(&processes).await;
    drop(processes);
    database.finish().await;
}

/// A start on PostgreSQL, on a fresh database and again on the migrated one, logs its steps at
/// `info` but no PostgreSQL notice. The fixed-window and GCRA migrators each create SQLx's
/// `_sqlx_migrations` table if it is missing, so every start gets the server's "relation
/// \"_sqlx_migrations\" already exists, skipping", which SQLx logs at `info`; the default filter
/// keeps SQLx's notices to `warn` and above.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs RUNLIMIT_POSTGRES_TEST_DATABASE_URL"]
async fn starts_on_postgres_log_no_postgresql_notice() {
    let database = TestDatabase::create("restart_notice").await;
    let files = Files::new(RULES);
    let (rules, secret) = (files.rules(), files.secret());
    let args =
        ["--config", rules.as_str(), "--key-secret-file", secret.as_str(), "--database-url", &database.url];
    for start in ["first", "second"] {
        let (status, stderr) = ServerProcess::start(&args, &[]).terminate();
        assert_eq!(status.code(), Some(0), "{start} start: {stderr}");
        assert!(stderr.contains("backend prepared: serving"), "{start} start logs at info: {stderr}");
        assert!(!stderr.contains("already exists"), "{start} start: {stderr}");
        assert!(!stderr.contains("sqlx::postgres::notice"), "{start} start: {stderr}");
    }
    database.finish().await;
}

/// Two processes with different key secrets on one Redis prefix count apart: a descriptor
/// value's counter is keyed by the secret.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs RUNLIMIT_REDIS_TEST_URL"]
async fn processes_with_different_secrets_do_not_share_counters() {
    let url = redis_url();
    let prefix = unique_prefix("secrets");
    let keys = RedisKeys::new(&url, &prefix);
    let files = Files::new(RULES);
    let other_secret = files.write("other-secret", "another secret of at least thirty-two bytes");
    let rules = files.rules();
    let shared =
        ["--config", rules.as_str(), "--redis-url", url.as_str(), "--redis-key-prefix", prefix.as_str()];
    let secret = files.secret();
    let mut first_args = shared.to_vec();
    first_args.extend(["--key-secret-file", secret.as_str()]);
    let first = ServerProcess::start(&first_args, &[]);
    let second = ServerProcess::start(
        &shared,
        &[("RUNLIMIT_KEY_SECRET", "another secret of at least thirty-two bytes")],
    );
    let third = ServerProcess::start(
        &[shared.as_slice(), &["--key-secret-file", other_secret.as_str()]].concat(),
        &[],
    );
    for (process, remaining) in [(&first, 49), (&first, 48), (&second, 49), (&third, 48)] {
        let mut client = client(process.grpc).await;
        let response = client
            .should_rate_limit(request("shared", &[&[("client", "192.0.2.4")]]))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(views(&response)[0].2, remaining);
    }
    drop((first, second, third));
    assert!(keys.delete() > 0);
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

/// `GET /healthcheck` answers `OK` and `GET /metrics` the service's counters, in Prometheus'
/// text format.
#[tokio::test]
async fn the_http_listener_answers_healthcheck_and_metrics() {
    let files = Files::new(RULES);
    let (rules, secret) = (files.rules(), files.secret());
    let process = ServerProcess::start(&["--config", &rules, "--key-secret-file", &secret], &[]);
    let mut client = client(process.grpc).await;
    let response = client
        .should_rate_limit(request("shared", &[&[("client", "192.0.2.4")]]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(overall(&response), Code::Ok);
    let (status, body) = http_get(process.http, "/healthcheck");
    assert_eq!((status.as_str(), body.as_str()), ("HTTP/1.1 200 OK", "OK\n"));
    let denied = client
        .should_rate_limit(request("shared", &[&[("client", "192.0.2.4")], &[("client", "192.0.2.4")]]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(overall(&denied), Code::Ok);
    let unknown =
        client.should_rate_limit(request("nowhere", &[&[("client", "x")]])).await.unwrap().into_inner();
    assert_eq!(overall(&unknown), Code::Ok);
    let (status, body) = http_get(process.http, "/metrics");
    assert_eq!(status, "HTTP/1.1 200 OK");
    assert_eq!(
        metric_lines(&body, "runlimit_server_requests_total"),
        [
            "runlimit_server_requests_total{domain=\"\",code=\"ok\"} 1",
            "runlimit_server_requests_total{domain=\"\",code=\"over_limit\"} 0",
            "runlimit_server_requests_total{domain=\"shared\",code=\"ok\"} 2",
            "runlimit_server_requests_total{domain=\"shared\",code=\"over_limit\"} 0",
        ]
    );
    let (status, _) = http_get(process.http, "/nothing");
    assert_eq!(status, "HTTP/1.1 404 Not Found");
}

/// `grpc.health.v1.Health/Check` reports the server and the rate limit service SERVING.
#[tokio::test]
async fn grpc_health_reports_serving() {
    use tonic_health::pb::{
        HealthCheckRequest, health_check_response::ServingStatus, health_client::HealthClient,
    };
    let files = Files::new(RULES);
    let (rules, secret) = (files.rules(), files.secret());
    let process = ServerProcess::start(&["--config", &rules, "--key-secret-file", &secret], &[]);
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", process.grpc))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut health = HealthClient::new(channel);
    for service in ["", "envoy.service.ratelimit.v3.RateLimitService"] {
        let response =
            health.check(HealthCheckRequest { service: service.into() }).await.unwrap().into_inner();
        assert_eq!(response.status, ServingStatus::Serving as i32, "{service:?}");
    }
    let unknown = health.check(HealthCheckRequest { service: "nothing".into() }).await.unwrap_err();
    assert_eq!(unknown.code(), tonic::Code::NotFound);
}

/// How a call fails when no connection to the Redis server on loopback `port` can be opened.
fn not_sent(port: u16) -> String {
    format!(
        "rate limit backend failed (no quota was consumed): could not connect to Redis at 127.0.0.1:{port}: \
         Connection refused (os error 111)"
    )
}

/// A process on a Redis server of the test's own: the server is killed (UNAVAILABLE, counted
/// as `not_consumed` in /metrics), then started again on the same port, and the same process
/// answers from it again.
#[tokio::test]
#[ignore = "needs redis-server on PATH (starts a server of its own)"]
async fn a_process_uses_a_restarted_redis_again() {
    let mut redis = OwnRedis::start();
    let url = redis.url();
    let files = Files::new(RULES);
    let (rules, secret) = (files.rules(), files.secret());
    let process = ServerProcess::start(
        &["--config", &rules, "--key-secret-file", &secret, "--redis-url", &url, "--redis-key-prefix", "own"],
        &[],
    );
    let mut client = client(process.grpc).await;
    let one = || request("shared", &[&[("client", "192.0.2.4")]]);
    let response = client.should_rate_limit(one()).await.unwrap().into_inner();
    assert_eq!(views(&response)[0].2, 49);

    redis.stop();
    // The first call may find the old connection not yet seen closed: it is then sent on it,
    // and fails as "may have been consumed" (runlimit-redis cannot tell a request the dead
    // server never read from one it ran). Every later call opens a connection, which fails
    // before anything is sent.
    let first = client.should_rate_limit(one()).await.unwrap_err();
    assert_eq!(first.code(), tonic::Code::Unavailable);
    let sent = first.message().starts_with(
        "rate limit backend failed (quota may have been consumed): the Redis connection failed after the request \
         was sent: ",
    );
    assert!(sent || first.message().starts_with(&not_sent(redis.port())), "{}", first.message());
    for _ in 0..2 {
        let status = client.should_rate_limit(one()).await.unwrap_err();
        assert_eq!(status.code(), tonic::Code::Unavailable);
        assert!(status.message().starts_with(&not_sent(redis.port())), "{}", status.message());
    }
    let (_, body) = http_get(process.http, "/metrics");
    let failures = if sent {
        vec![
            "runlimit_server_backend_failures_total{domain=\"shared\",consumption=\"may_have_been_consumed\"} 1",
            "runlimit_server_backend_failures_total{domain=\"shared\",consumption=\"not_consumed\"} 2",
        ]
    } else {
        vec!["runlimit_server_backend_failures_total{domain=\"shared\",consumption=\"not_consumed\"} 3"]
    };
    assert_eq!(metric_lines(&body, "runlimit_server_backend_failures_total"), failures);
    assert_eq!(
        metric_lines(&body, "runlimit_server_requests_total"),
        [
            "runlimit_server_requests_total{domain=\"\",code=\"ok\"} 0",
            "runlimit_server_requests_total{domain=\"\",code=\"over_limit\"} 0",
            "runlimit_server_requests_total{domain=\"shared\",code=\"ok\"} 1",
            "runlimit_server_requests_total{domain=\"shared\",code=\"over_limit\"} 0",
        ]
    );

    // Nothing was persisted: the counter starts afresh.
    redis.restart();
    let response = client.should_rate_limit(one()).await.unwrap().into_inner();
    assert_eq!(views(&response)[0].2, 49);
    let stderr = process.stderr();
    assert!(stderr.contains("backend failure"), "{stderr}");
    let (status, stderr) = tokio::task::spawn_blocking(move || process.terminate()).await.unwrap();
    assert_eq!(status.code(), Some(0), "{stderr}");
}

// ---------------------------------------------------------------------------------------------
// Startup errors: exit code 1 and one exact message on stderr (logging off, so stderr is
// nothing but the message).
// ---------------------------------------------------------------------------------------------

/// Runs the binary with `args` after `--config`, the rules of `files` and loopback ports, with
/// logging off; returns its exit code and stderr.
fn start_failure(files: &Files, args: &[&str], env: &[(&str, &str)]) -> (Option<i32>, String) {
    let rules = files.rules();
    let mut all = vec!["--config", rules.as_str()];
    all.extend_from_slice(args);
    let mut env = env.to_vec();
    env.push(("RUST_LOG", "off"));
    let exited = run_to_exit(&loopback(&all), &env);
    assert_eq!(exited.stdout, "", "nothing is announced when startup fails");
    (exited.status.code(), exited.stderr)
}

#[test]
fn invalid_rule_files_are_refused_with_every_problem() {
    let files = Files::new(
        "domain: api
descriptors:
  - key: tenant
    rate_limit:
      unit: minutes
      requests_per_unit: 10
  - key: user
    rate_limit:
      unit: minute
",
    );
    let rules = files.rules();
    let (code, stderr) = start_failure(&files, &[], &[]);
    assert_eq!(code, Some(1));
    assert_eq!(
        stderr,
        format!(
            "runlimit-server: invalid rule files (--config):\n\
             {rules}: descriptors[0].rate_limit.unit: unknown unit `minutes`; expected one of second, minute, \
             hour, day, week, month, year (any letter case)\n\
             {rules}: descriptors[1].rate_limit.requests_per_unit: is missing; write the number of requests \
             allowed per unit (0 denies every request)\n"
        )
    );
    // check-config says the same, without the prefix, and exits 1 too.
    let exited = run_to_exit(&["check-config", &rules], &[]);
    assert_eq!(exited.status.code(), Some(1));
    assert_eq!(format!("runlimit-server: invalid rule files (--config):\n{}", exited.stderr), stderr);
}

#[test]
fn an_unreachable_redis_is_named_with_the_fix() {
    let files = Files::new(RULES);
    let port = free_port();
    let url = format!("redis://127.0.0.1:{port}");
    let (code, stderr) = start_failure(&files, &["--redis-url", &url], &[]);
    assert_eq!(code, Some(1));
    assert_eq!(
        stderr,
        format!(
            "runlimit-server: cannot reach Redis at 127.0.0.1:{port} (--redis-url); check that the server runs \
             there, accepts TCP connections, and that the URL's credentials and database are right: could not \
             prepare the Redis server: could not connect to Redis at 127.0.0.1:{port}: Connection refused (os error \
             111)\n"
        )
    );
}

#[test]
#[ignore = "needs redis-server on PATH (starts a server of its own)"]
fn an_evicting_redis_is_refused_with_the_fix() {
    let files = Files::new(RULES);
    let redis = OwnRedis::start();
    let policy = std::process::Command::new("redis-cli")
        .args(["-p", &redis.port().to_string(), "CONFIG", "SET", "maxmemory-policy", "allkeys-lru"])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&policy.stdout), "OK\n");
    let (code, stderr) = start_failure(&files, &["--redis-url", &redis.url()], &[]);
    assert_eq!(code, Some(1));
    assert_eq!(
        stderr,
        format!(
            "runlimit-server: Redis at 127.0.0.1:{0} (--redis-url) cannot hold limits; use Redis 7.0 or newer \
             with maxmemory-policy noeviction (CONFIG SET maxmemory-policy noeviction): Redis at 127.0.0.1:{0} has \
             maxmemory-policy allkeys-lru: Runlimit needs noeviction, so no quota state is ever evicted (CONFIG SET \
             maxmemory-policy noeviction)\n",
            redis.port()
        )
    );
}

#[test]
fn an_unreachable_postgres_is_named_with_the_fix() {
    let files = Files::new(RULES);
    let port = free_port();
    let url = format!("postgres://runlimit:secret-password@127.0.0.1:{port}/limits");
    let (code, stderr) = start_failure(&files, &["--database-url", &url], &[]);
    assert_eq!(code, Some(1));
    assert_eq!(
        stderr,
        format!(
            "runlimit-server: cannot connect to PostgreSQL at 127.0.0.1:{port}/limits (--database-url); check \
             that the server runs there, accepts TCP connections, and that the user, password and database are \
             right: error communicating with database: Connection refused (os error 111)\n"
        )
    );
    assert!(!stderr.contains("secret-password"));
}

#[test]
fn a_database_url_that_is_not_postgres_is_refused() {
    let files = Files::new(RULES);
    let (code, stderr) = start_failure(&files, &["--database-url", "mysql://root@127.0.0.1/limits"], &[]);
    assert_eq!(code, Some(1));
    assert_eq!(
        stderr,
        "runlimit-server: --database-url is not a PostgreSQL URL; expected \
         postgres://USER[:PASSWORD]@HOST[:PORT]/DATABASE: error with configuration: the scheme is `mysql`, not \
         postgres or postgresql\n"
    );
}

#[test]
fn a_port_in_use_is_named_with_its_option() {
    let files = Files::new(RULES);
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = taken.local_addr().unwrap().to_string();
    let rules = files.rules();
    for (option, other) in [("--grpc-addr", "--http-addr"), ("--http-addr", "--grpc-addr")] {
        let exited = run_to_exit(
            &["--config", &rules, option, &address, other, "127.0.0.1:0"],
            &[("RUST_LOG", "off")],
        );
        assert_eq!(exited.status.code(), Some(1));
        assert_eq!(exited.stdout, "");
        assert_eq!(
            exited.stderr,
            format!(
                "runlimit-server: cannot listen on {address} ({option}); is another process using the port? \
                 choose another with {option}: Address already in use (os error 98)\n"
            )
        );
    }
}

#[test]
fn a_short_key_secret_is_refused_with_its_length() {
    let files = Files::new(RULES);
    let short = files.write("short", "short secret\n");
    let (code, stderr) = start_failure(&files, &["--key-secret-file", &short], &[]);
    assert_eq!(code, Some(1));
    assert_eq!(
        stderr,
        format!(
            "runlimit-server: no usable key secret: the key secret (--key-secret-file {short}) is 12 bytes long, \
             below the minimum of 32\n"
        )
    );
    let (code, stderr) = start_failure(&files, &[], &[("RUNLIMIT_KEY_SECRET", "0123456789")]);
    assert_eq!(code, Some(1));
    assert_eq!(
        stderr,
        "runlimit-server: no usable key secret: the key secret (RUNLIMIT_KEY_SECRET) is 10 bytes long, below the \
         minimum of 32\n"
    );
    let secret = files.secret();
    let (code, stderr) = start_failure(
        &files,
        &["--key-secret-file", &secret],
        &[("RUNLIMIT_KEY_SECRET", backends::FILE_SECRET)],
    );
    assert_eq!(code, Some(1));
    assert_eq!(
        stderr,
        "runlimit-server: no usable key secret: both --key-secret-file and RUNLIMIT_KEY_SECRET are set; give the \
         secret one way only\n"
    );
    let missing = files.path("missing").display().to_string();
    let (code, stderr) = start_failure(&files, &["--key-secret-file", &missing], &[]);
    assert_eq!(code, Some(1));
    assert_eq!(
        stderr,
        format!(
            "runlimit-server: no usable key secret: cannot read the key secret file {missing}: No such file or \
             directory (os error 2)\n"
        )
    );
}

#[test]
fn an_invalid_redis_key_prefix_is_refused_with_the_bound() {
    let files = Files::new(RULES);
    let long = "p".repeat(48);
    for prefix in ["bad prefix", "", long.as_str()] {
        // Refused before any connection: the URL's port is closed.
        let url = format!("redis://127.0.0.1:{}", free_port());
        let (code, stderr) = start_failure(&files, &["--redis-url", &url, "--redis-key-prefix", prefix], &[]);
        assert_eq!(code, Some(1));
        assert_eq!(
            stderr,
            format!(
                "runlimit-server: the redis backend could not be prepared: invalid Redis key prefix `{prefix}`: 1 \
                 to 47 ASCII letters, digits, '.', '_', '-' or ':'\n"
            )
        );
    }
}

#[test]
fn an_unusable_redis_url_names_the_option_and_the_form() {
    let files = Files::new(RULES);
    let (code, stderr) = start_failure(&files, &["--redis-url", "http://127.0.0.1:6379"], &[]);
    assert_eq!(code, Some(1));
    assert!(
        stderr.starts_with(
            "runlimit-server: --redis-url is not a usable Redis URL; expected \
             redis://[USER:PASSWORD@]HOST[:PORT][/DB], rediss://[USER:PASSWORD@]HOST[:PORT][/DB] (TLS) or \
             redis+unix:///PATH: "
        ),
        "{stderr}"
    );
}

#[test]
fn shadow_mode_from_the_environment_accepts_the_usual_spellings() {
    let files = Files::new(RULES);
    for value in ["1", "yes", "on", "true", "0", "no", "off", "false"] {
        // Parsed, then refused for an unrelated reason after parsing: an unusable Redis URL.
        let (code, stderr) =
            start_failure(&files, &["--redis-url", "http://x"], &[("RUNLIMIT_SHADOW_MODE", value)]);
        assert_eq!(code, Some(1), "{value}: {stderr}");
        assert!(
            stderr.starts_with("runlimit-server: --redis-url is not a usable Redis URL"),
            "{value}: {stderr}"
        );
    }
    let (code, stderr) = start_failure(&files, &[], &[("RUNLIMIT_SHADOW_MODE", "maybe")]);
    assert_eq!(code, Some(2), "{stderr}");
}

#[test]
fn out_of_range_numbers_are_refused() {
    let files = Files::new(RULES);
    // Regression: 0 made SQLx's pool panic (exit code 101) instead of a usage error.
    let url = format!("postgres://postgres@127.0.0.1:{}/x", free_port());
    let (code, stderr) =
        start_failure(&files, &["--database-url", &url, "--database-max-connections", "0"], &[]);
    assert_eq!(code, Some(2));
    assert_eq!(
        stderr,
        "error: invalid value '0' for '--database-max-connections <N>': 0 is not in 1..=4294967295\n\nFor more \
         information, try '--help'.\n"
    );
    let (code, stderr) = start_failure(&files, &["--cleanup-interval-secs", "0"], &[]);
    assert_eq!(code, Some(2));
    assert_eq!(
        stderr,
        "error: invalid value '0' for '--cleanup-interval-secs <SECONDS>': 0 is not in 1..18446744073709551615\n\n\
         For more information, try '--help'.\n"
    );
    let (code, stderr) = start_failure(&files, &["--memory-shards", "0"], &[]);
    assert_eq!(code, Some(1));
    assert_eq!(
        stderr,
        "runlimit-server: invalid memory store options (--memory-max-keys, --memory-shards): shard_count is 0, \
         outside the accepted range 1..=4096\n"
    );
    let url = format!("redis://127.0.0.1:{}", free_port());
    let (code, stderr) =
        start_failure(&files, &["--redis-url", &url, "--redis-max-keys-per-shard", "0"], &[]);
    assert_eq!(code, Some(1));
    assert_eq!(
        stderr,
        "runlimit-server: invalid Redis options (--redis-key-prefix, --redis-max-keys-per-shard): maximum keys per \
         shard is 0, outside 1 to 1048576\n"
    );
}

#[test]
fn an_unknown_response_headers_value_is_a_usage_error() {
    let files = Files::new(RULES);
    let (code, stderr) = start_failure(&files, &["--response-headers", "draft11"], &[]);
    assert_eq!(code, Some(2));
    assert_eq!(
        stderr,
        "error: invalid value 'draft11' for '--response-headers <FORMAT>'\n  [possible values: draft-11, \
         envoy-ratelimit]\n\nFor more information, try '--help'.\n"
    );
    // The same from the environment variable.
    let (code, stderr) = start_failure(&files, &[], &[("RUNLIMIT_RESPONSE_HEADERS", "draft11")]);
    assert_eq!(code, Some(2));
    assert!(
        stderr.starts_with("error: invalid value 'draft11' for '--response-headers <FORMAT>'\n"),
        "{stderr}"
    );
}

#[test]
fn a_missing_config_is_a_usage_error() {
    let exited = run_to_exit(&loopback(&[]), &[]);
    assert_eq!(exited.status.code(), Some(2));
    assert_eq!(
        exited.stderr,
        "error: the following required arguments were not provided:\n  --config <PATH>\n\nUsage: runlimit-server \
         --config <PATH> --grpc-addr <ADDR> --http-addr <ADDR>\n\nFor more information, try '--help'.\n"
    );
}

/// Every environment variable the server reads, in `--help`.
const ENVIRONMENT: [&str; 20] = [
    "RUNLIMIT_CONFIG",
    "RUNLIMIT_GRPC_ADDR",
    "RUNLIMIT_HTTP_ADDR",
    "RUNLIMIT_REDIS_URL",
    "RUNLIMIT_DATABASE_URL",
    "RUNLIMIT_KEY_SECRET_FILE",
    "RUNLIMIT_KEY_SECRET",
    "RUNLIMIT_SHADOW_MODE",
    "RUNLIMIT_RESPONSE_HEADERS",
    "RUNLIMIT_ON_BACKEND_ERROR",
    "RUNLIMIT_REDIS_KEY_PREFIX",
    "RUNLIMIT_REDIS_MAX_KEYS_PER_SHARD",
    "RUNLIMIT_MEMORY_MAX_KEYS",
    "RUNLIMIT_MEMORY_SHARDS",
    "RUNLIMIT_DATABASE_MAX_CONNECTIONS",
    "RUNLIMIT_CLEANUP_INTERVAL_SECS",
    "RUNLIMIT_CONFIG_POLL_INTERVAL_SECS",
    "RUNLIMIT_PROBE_INTERVAL_SECS",
    "RUNLIMIT_LOG_FORMAT",
    "RUST_LOG",
];

#[test]
fn help_names_every_environment_variable() {
    // The list above is complete: every option's variable, the secret's and RUST_LOG.
    use clap::CommandFactory as _;
    let mut declared: Vec<String> = runlimit_server::Args::command()
        .get_arguments()
        .filter_map(|argument| argument.get_env().map(|name| name.to_string_lossy().into_owned()))
        .collect();
    declared.extend([runlimit_server::KEY_SECRET_ENV.to_owned(), "RUST_LOG".to_owned()]);
    declared.sort();
    let mut listed: Vec<String> = ENVIRONMENT.iter().map(|name| (*name).to_owned()).collect();
    listed.sort();
    assert_eq!(declared, listed);

    let exited = run_to_exit(&["--help"], &[]);
    assert_eq!(exited.status.code(), Some(0));
    assert_eq!(exited.stderr, "");
    for name in ENVIRONMENT {
        assert!(exited.stdout.contains(name), "--help does not mention {name}");
    }
    // Secrets in variables are never echoed back by --help.
    let exited = run_to_exit(
        &["--help"],
        &[
            ("RUNLIMIT_REDIS_URL", "redis://:hunter2@db:6379"),
            ("RUNLIMIT_DATABASE_URL", "postgres://u:hunter2@db/x"),
        ],
    );
    assert!(!exited.stdout.contains("hunter2"), "{}", exited.stdout);
}

// ---------------------------------------------------------------------------------------------
// SIGTERM
// ---------------------------------------------------------------------------------------------

/// A process configured through its environment alone serves, and exits 0 after SIGTERM,
/// logging the shutdown.
#[tokio::test]
async fn sigterm_stops_a_serving_process_with_exit_code_0() {
    let files = Files::new(RULES);
    let (rules, secret) = (files.rules(), files.secret());
    let env = [
        ("RUNLIMIT_CONFIG", rules.as_str()),
        ("RUNLIMIT_GRPC_ADDR", "127.0.0.1:0"),
        ("RUNLIMIT_HTTP_ADDR", "127.0.0.1:0"),
        ("RUNLIMIT_KEY_SECRET_FILE", secret.as_str()),
    ];
    let process = ServerProcess::start_with(&[], &env);
    let mut client = client(process.grpc).await;
    for remaining in [49, 48] {
        let response = client
            .should_rate_limit(request("shared", &[&[("client", "192.0.2.4")]]))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(views(&response)[0].2, remaining);
    }
    // The client's connection stays open (and answers the server's HTTP/2 shutdown PING) on
    // this runtime while the process stops.
    let (status, stderr) = tokio::task::spawn_blocking(move || process.terminate()).await.unwrap();
    drop(client);
    assert_eq!(status.code(), Some(0), "{stderr}");
    assert!(stderr.contains("shutting down: no new connections, finishing in-flight calls"), "{stderr}");
    assert!(stderr.contains("stopped"), "{stderr}");
}

/// SIGTERM (or SIGINT) sent the moment both addresses are announced (before any call) still
/// stops the process cleanly, with exit code 0, never by the signal's default action.
/// Regression: the handlers were installed only once serving started, after the announcement.
#[test]
fn sigterm_right_after_the_announcement_exits_0() {
    let files = Files::new(RULES);
    let (rules, secret) = (files.rules(), files.secret());
    for signal in ["TERM", "INT", "TERM", "INT", "TERM", "INT", "TERM", "INT", "TERM", "INT"] {
        let process = ServerProcess::start(&["--config", &rules, "--key-secret-file", &secret], &[]);
        let (status, stderr) = process.signal(signal);
        assert_eq!(status.code(), Some(0), "SIG{signal}: {status}: {stderr}");
    }
}

/// SIGTERM while clients keep calling: the process exits 0 within the wait, and every call
/// either got an answer or a transport error (none hangs).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_under_load_exits_0() {
    let files = Files::new(RULES);
    let (rules, secret) = (files.rules(), files.secret());
    let process = ServerProcess::start(&["--config", &rules, "--key-secret-file", &secret], &[]);
    let address = process.grpc;
    let load = tokio::spawn(async move {
        let mut client = client(address).await;
        let mut answered = 0_u32;
        loop {
            let call = client.should_rate_limit(request("shared", &[&[("user", "u")]]));
            match tokio::time::timeout(Duration::from_secs(10), call).await {
                Ok(Ok(_)) => answered += 1,
                Ok(Err(_)) => return answered,
                Err(_) => panic!("a call hung after SIGTERM"),
            }
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (status, stderr) = tokio::task::spawn_blocking(move || process.terminate()).await.unwrap();
    assert_eq!(status.code(), Some(0), "{stderr}");
    let answered = load.await.unwrap();
    assert!(answered > 0);
}

/// Clients that opened connections and then went silent (frozen or partitioned peers) do not
/// keep a process from stopping after SIGTERM: it exits 0 once the 10 s grace period is over.
/// Regression: it waited for them forever.
#[test]
fn sigterm_with_a_silent_client_connection_exits_0() {
    use std::io::Write as _;
    let files = Files::new(RULES);
    let (rules, secret) = (files.rules(), files.secret());
    let process = ServerProcess::start(&["--config", &rules, "--key-secret-file", &secret], &[]);
    // The HTTP/2 preface and an empty SETTINGS frame, then nothing: the server's frames are
    // never read or acknowledged.
    let mut silent = std::net::TcpStream::connect(process.grpc).unwrap();
    silent.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00").unwrap();
    // A connection that never even sent the preface, and half an HTTP/1.1 request on the HTTP
    // listener.
    let _mute = std::net::TcpStream::connect(process.grpc).unwrap();
    let mut half = std::net::TcpStream::connect(process.http).unwrap();
    half.write_all(b"GET /healthcheck HTTP/1.1\r\nHost: x\r\n").unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let started = std::time::Instant::now();
    let (status, stderr) = process.terminate();
    assert_eq!(status.code(), Some(0), "{stderr}");
    assert!(started.elapsed() < Duration::from_secs(20), "{:?}", started.elapsed());
    assert!(
        stderr.contains("stopped with connections still open after the shutdown grace period"),
        "{stderr}"
    );
    drop(silent);
}
