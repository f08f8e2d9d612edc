//! The service in-process on real shared backends: Redis (the server named by
//! `RUNLIMIT_REDIS_TEST_URL`, under a key prefix of each test's own, deleted at the end) and
//! PostgreSQL (a database of each test's own on the server named by
//! `RUNLIMIT_POSTGRES_TEST_DATABASE_URL`), and a `redis-server` a test starts, pauses, kills and
//! starts again itself.
//!
//! Counts are exact. Durations come from the backend server's clock, so each is asserted to lie
//! between its nominal value less the time the test has run (plus 2 ms of rounding) and the
//! nominal value.
//!
//! ```text
//! RUNLIMIT_REDIS_TEST_URL=redis://127.0.0.1:6379 \
//! RUNLIMIT_POSTGRES_TEST_DATABASE_URL=postgres://postgres@127.0.0.1:5432/test \
//!     cargo test -p runlimit-server --test server shared_backends:: -- --include-ignored
//! ```

use crate::backends;
use crate::support;

use std::{fmt::Write as _, ops::RangeInclusive, time::Instant};

use backends::{OwnCluster, OwnRedis, RedisKeys, TestDatabase, redis_url, unique_prefix};
use envoy_types::pb::envoy::service::ratelimit::v3::{
    RateLimitRequest, RateLimitResponse,
    rate_limit_response::{Code, rate_limit::Unit},
};
use runlimit_postgres::PostgresConfig;
use runlimit_redis::{KeyPrefix, RedisConfig};
use runlimit_server::{Backend, BackendErrorMode, ServiceOptions};
use sha2::{Digest as _, Sha256};
use support::{StatusView, TestServer, call, descriptor, overall, request, views, with_hits};
use tonic::Code as GrpcCode;

const MINUTE: i32 = Unit::Minute as i32;

/// tests/atomic.rs' rules: a broad per-tenant limit and a per-user one, fixed windows.
const FIXED: &str = "
domain: api
descriptors:
  - key: tenant
    rate_limit:
      unit: minute
      requests_per_unit: 10
  - key: user
    rate_limit:
      unit: minute
      requests_per_unit: 2
";

/// The same limits as GCRA quotas (a unit every 6 s for the tenant, every 30 s per user).
const GCRA: &str = "
domain: gcra-api
descriptors:
  - key: tenant
    rate_limit:
      unit: minute
      requests_per_unit: 10
      algorithm: gcra
  - key: user
    rate_limit:
      unit: minute
      requests_per_unit: 2
      algorithm: gcra
";

/// A status as asserted: `(code, current limit, remaining, duration_until_reset within)`.
type Expected = (Code, Option<(u32, i32)>, u32, Option<RangeInclusive<u64>>);

/// The range a backend-measured duration of nominal `millis` must lie in, `since` the first
/// request that could have started it.
fn within(millis: u64, since: Instant) -> Option<RangeInclusive<u64>> {
    let elapsed = u64::try_from(since.elapsed().as_millis()).unwrap();
    Some(millis.saturating_sub(elapsed + 2)..=millis)
}

fn assert_statuses(response: &RateLimitResponse, code: Code, expected: &[Expected]) {
    let actual: Vec<StatusView> = views(response);
    let matches = overall(response) == code
        && actual.len() == expected.len()
        && actual.iter().zip(expected).all(|(actual, expected)| {
            actual.0 == expected.0
                && actual.1 == expected.1
                && actual.2 == expected.2
                && match (&actual.3, &expected.3) {
                    (None, None) => true,
                    (Some(millis), Some(range)) => range.contains(millis),
                    _ => false,
                }
        });
    assert!(
        matches,
        "expected overall {code:?} and {expected:?},\n     got overall {:?} and {actual:?}",
        overall(response)
    );
}

/// Two descriptors, `tenant` and `user`.
fn both(domain: &str, tenant: &str, user: &str) -> RateLimitRequest {
    request(domain, &[&[("tenant", tenant)], &[("user", user)]])
}

/// A check-only request (`hits_addend: 0`) of one descriptor: reads a counter, charges nothing.
fn peek(domain: &str, key: &str, value: &str) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.into(),
        descriptors: vec![with_hits(descriptor(&[(key, value)]), 0)],
        hits_addend: 0,
    }
}

/// The nominal `duration_until_reset` of each status [`scenario`] asserts, in milliseconds.
struct Resets {
    /// The tenant's after its first, second and third admissions.
    tenant: [u64; 3],
    /// mallory's after its first and second admissions, then while it is denied.
    mallory: [u64; 3],
    /// alice's after its first admission.
    alice: u64,
}

/// FIXED's: a fixed window reports its end, a minute after the admission that started it.
const FIXED_RESETS: Resets = Resets { tenant: [60_000; 3], mallory: [60_000; 3], alice: 60_000 };

/// GCRA's: the time until the quota is full again. The tenant's next unit comes 6 s after each
/// admission, a user's 30 s after; a denied request moves neither.
const GCRA_RESETS: Resets =
    Resets { tenant: [6_000, 12_000, 18_000], mallory: [30_000, 60_000, 30_000], alice: 30_000 };

/// tests/atomic.rs' scenario on `backend`, with `rules` (FIXED or GCRA) for `domain`: once the
/// user is over its limit, further requests charge nothing to the tenant.
async fn scenario(backend: &Backend, rules: &str, domain: &str, resets: &Resets) {
    let server = TestServer::start(rules, backend, ServiceOptions::default()).await;
    let mut client = server.client().await;
    let start = Instant::now();
    let [tenant_1, tenant_2, tenant_3] = resets.tenant;
    let [mallory_1, mallory_2, mallory_denied] = resets.mallory;

    let first = call(&mut client, both(domain, "acme", "mallory")).await;
    assert_statuses(
        &first,
        Code::Ok,
        &[
            (Code::Ok, Some((10, MINUTE)), 9, within(tenant_1, start)),
            (Code::Ok, Some((2, MINUTE)), 1, within(mallory_1, start)),
        ],
    );
    let second = call(&mut client, both(domain, "acme", "mallory")).await;
    assert_statuses(
        &second,
        Code::Ok,
        &[
            (Code::Ok, Some((10, MINUTE)), 8, within(tenant_2, start)),
            (Code::Ok, Some((2, MINUTE)), 0, within(mallory_2, start)),
        ],
    );
    // mallory is over the per-user limit: ten more requests, all denied, none charged to acme.
    for _ in 0..10 {
        let denied = call(&mut client, both(domain, "acme", "mallory")).await;
        assert_statuses(
            &denied,
            Code::OverLimit,
            &[
                (Code::Ok, None, 0, None),
                (Code::OverLimit, Some((2, MINUTE)), 0, within(mallory_denied, start)),
            ],
        );
    }
    // A check-only read of the tenant: exactly 8 of its 10 left, nothing charged.
    let tenant = call(&mut client, peek(domain, "tenant", "acme")).await;
    assert_statuses(&tenant, Code::Ok, &[(Code::Ok, Some((10, MINUTE)), 8, within(tenant_2, start))]);
    // The next request of another user takes one of them.
    let alice_start = Instant::now();
    let other = call(&mut client, both(domain, "acme", "alice")).await;
    assert_statuses(
        &other,
        Code::Ok,
        &[
            (Code::Ok, Some((10, MINUTE)), 7, within(tenant_3, start)),
            (Code::Ok, Some((2, MINUTE)), 1, within(resets.alice, alice_start)),
        ],
    );
    server.stop().await;
}

/// A prepared Redis backend at `url` under `prefix`.
async fn redis_backend(url: &str, prefix: &str) -> Backend {
    let config = RedisConfig::default().with_key_prefix(KeyPrefix::new(prefix).unwrap());
    let backend = Backend::redis(url, &config).unwrap();
    backend.prepare().await.unwrap();
    backend
}

/// `{PREFIX:<first 16 hex digits of SHA-256(domain)>}:`, the documented start of every key of
/// a domain.
fn domain_tag(prefix: &str, domain: &str) -> String {
    let digest = Sha256::digest(domain.as_bytes());
    let mut tag = format!("{{{prefix}:");
    for byte in &digest[..8] {
        write!(tag, "{byte:02x}").unwrap();
    }
    tag.push_str("}:");
    tag
}

#[tokio::test]
#[ignore = "needs RUNLIMIT_REDIS_TEST_URL"]
async fn on_redis_a_request_over_the_per_user_limit_leaves_the_broad_counter_untouched() {
    let url = redis_url();
    let prefix = unique_prefix("atomic");
    let keys = RedisKeys::new(&url, &prefix);
    let backend = redis_backend(&url, &prefix).await;
    scenario(&backend, FIXED, "api", &FIXED_RESETS).await;
    // Every key is under the domain's hash tag, so a domain is one slot of a Redis Cluster.
    let written = keys.all();
    let tag = domain_tag(&prefix, "api");
    assert!(!written.is_empty());
    assert!(written.iter().all(|key| key.starts_with(&tag)), "{tag} {written:?}");
    assert_eq!(keys.delete(), written.len());
    assert_eq!(keys.all(), Vec::<String>::new());
}

/// On a Redis Cluster every domain's keys share its hash tag, so each request is one script on
/// the node owning that slot: the atomic scenario holds there, for two domains, and each
/// domain's keys are all on one node.
#[tokio::test]
#[ignore = "needs redis-server and redis-cli on PATH (starts a Redis Cluster of its own)"]
async fn on_a_redis_cluster_each_domain_is_one_slot_and_requests_stay_atomic() {
    let cluster = OwnCluster::start();
    let prefix = "rls-cluster";
    let backend = redis_backend(&cluster.url(0), prefix).await;
    let web = FIXED.replace("domain: api", "domain: web");
    for (rules, domain) in [(FIXED, "api"), (web.as_str(), "web")] {
        scenario(&backend, rules, domain, &FIXED_RESETS).await;
        // The tag between the braces decides the slot; only that slot's node holds keys of it.
        let tag = domain_tag(prefix, domain);
        let inner = &tag[1..tag.len() - 2];
        let slot: u16 = cluster.cli(cluster.ports[0], &["CLUSTER", "KEYSLOT", inner]).parse().unwrap();
        let pattern = format!("{{{inner}}}*");
        let holders: Vec<(u16, usize)> = cluster
            .ports
            .iter()
            .map(|port| {
                let keys = cluster.cli(*port, &["--scan", "--pattern", &pattern]);
                (*port, keys.lines().filter(|line| !line.is_empty()).count())
            })
            .filter(|(_, count)| *count > 0)
            .collect();
        assert_eq!(holders.len(), 1, "domain {domain} (slot {slot}): keys on {holders:?}");
        let owner = cluster.cli(holders[0].0, &["CLUSTER", "COUNTKEYSINSLOT", &slot.to_string()]);
        assert_eq!(owner.parse::<usize>().unwrap(), holders[0].1, "domain {domain}: all keys in slot {slot}");
    }
}

#[tokio::test]
#[ignore = "needs RUNLIMIT_REDIS_TEST_URL"]
async fn on_redis_gcra_quotas_are_atomic_too() {
    let url = redis_url();
    let prefix = unique_prefix("gcra");
    let keys = RedisKeys::new(&url, &prefix);
    let backend = redis_backend(&url, &prefix).await;
    scenario(&backend, GCRA, "gcra-api", &GCRA_RESETS).await;
    let written = keys.all();
    let tag = domain_tag(&prefix, "gcra-api");
    assert!(!written.is_empty());
    assert!(written.iter().all(|key| key.starts_with(&tag)), "{tag} {written:?}");
}

/// Two domains on one Redis backend and prefix count apart: the same descriptor in `api` and
/// in `other` are two counters, under two hash tags.
#[tokio::test]
#[ignore = "needs RUNLIMIT_REDIS_TEST_URL"]
async fn on_redis_each_domain_has_its_own_keys() {
    const TWO_DOMAINS: &str = "
domain: api
descriptors:
  - key: tenant
    rate_limit:
      unit: minute
      requests_per_unit: 10
";
    const OTHER: &str = "
domain: other
descriptors:
  - key: tenant
    rate_limit:
      unit: minute
      requests_per_unit: 10
";
    let url = redis_url();
    let prefix = unique_prefix("domains");
    let keys = RedisKeys::new(&url, &prefix);
    let backend = redis_backend(&url, &prefix).await;
    let rules = runlimit_server::RuleTable::from_sources([("api.yaml", TWO_DOMAINS), ("other.yaml", OTHER)])
        .unwrap_or_else(|errors| panic!("{errors}"));
    let service =
        runlimit_server::Service::new(rules, &backend, support::hasher(), ServiceOptions::default());
    let server = TestServer::serve(service).await;
    let mut client = server.client().await;
    let start = Instant::now();
    for remaining in [9, 8, 7] {
        let response = call(&mut client, request("api", &[&[("tenant", "acme")]])).await;
        assert_statuses(
            &response,
            Code::Ok,
            &[(Code::Ok, Some((10, MINUTE)), remaining, within(60_000, start))],
        );
    }
    let response = call(&mut client, request("other", &[&[("tenant", "acme")]])).await;
    assert_statuses(&response, Code::Ok, &[(Code::Ok, Some((10, MINUTE)), 9, within(60_000, start))]);
    server.stop().await;
    let written = keys.all();
    let (api, other) = (domain_tag(&prefix, "api"), domain_tag(&prefix, "other"));
    assert!(written.iter().any(|key| key.starts_with(&api)), "{written:?}");
    assert!(written.iter().any(|key| key.starts_with(&other)), "{written:?}");
    assert!(written.iter().all(|key| key.starts_with(&api) || key.starts_with(&other)), "{written:?}");
}

#[tokio::test]
#[ignore = "needs RUNLIMIT_POSTGRES_TEST_DATABASE_URL"]
async fn on_postgres_a_request_over_the_per_user_limit_leaves_the_broad_counter_untouched() {
    let database = TestDatabase::create("atomic").await;
    let backend = Backend::postgres(database.pool(4).await, PostgresConfig::default());
    backend.prepare().await.unwrap();
    // Preparing twice (a second replica starting) is harmless.
    backend.prepare().await.unwrap();
    scenario(&backend, FIXED, "api", &FIXED_RESETS).await;
    drop(backend);
    database.finish().await;
}

#[tokio::test]
#[ignore = "needs RUNLIMIT_POSTGRES_TEST_DATABASE_URL"]
async fn on_postgres_gcra_quotas_are_atomic_too() {
    let database = TestDatabase::create("gcra").await;
    let backend = Backend::postgres(database.pool(4).await, PostgresConfig::default());
    backend.prepare().await.unwrap();
    scenario(&backend, GCRA, "gcra-api", &GCRA_RESETS).await;
    drop(backend);
    database.finish().await;
}

/// How a call fails when no connection to the Redis server on loopback `port` can be opened.
fn not_sent(port: u16) -> String {
    format!(
        "rate limit backend failed (no quota was consumed): could not connect to Redis at 127.0.0.1:{port}: \
         Connection refused (os error 111)"
    )
}

/// The gRPC error of a call that must fail.
async fn failed_call(
    client: &mut envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient<
        tonic::transport::Channel,
    >,
    request: RateLimitRequest,
) -> tonic::Status {
    match client.should_rate_limit(request).await {
        Ok(response) => panic!("expected an error, got {:?}", response.into_inner()),
        Err(status) => status,
    }
}

/// A Redis server of the test's own goes unresponsive, then away, then comes back on the same
/// port: UNAVAILABLE saying quota may have been consumed (and it was), UNAVAILABLE saying no
/// quota was consumed, the `--on-backend-error` answers, then service again without a restart.
#[tokio::test]
#[ignore = "needs redis-server on PATH (starts a server of its own)"]
async fn losing_redis_answers_unavailable_and_a_restarted_redis_is_used_again() {
    let mut redis = OwnRedis::start();
    let url = redis.url();
    let prefix = unique_prefix("lost");
    let backend = redis_backend(&url, &prefix).await;
    let server = TestServer::start(FIXED, &backend, ServiceOptions::default()).await;
    let closed =
        ServiceOptions { on_backend_error: BackendErrorMode::OverLimit, ..ServiceOptions::default() };
    let fail_closed = TestServer::start(FIXED, &backend, closed).await;
    let open = ServiceOptions { on_backend_error: BackendErrorMode::Ok, ..ServiceOptions::default() };
    let fail_open = TestServer::start(FIXED, &backend, open).await;
    let mut client = server.client().await;
    let start = Instant::now();

    let first = call(&mut client, both("api", "acme", "u1")).await;
    assert_statuses(
        &first,
        Code::Ok,
        &[
            (Code::Ok, Some((10, MINUTE)), 9, within(60_000, start)),
            (Code::Ok, Some((2, MINUTE)), 1, within(60_000, start)),
        ],
    );

    // The server stops answering for 2.5 s (CLIENT PAUSE): the admission is sent, and times out
    // after runlimit-redis' 1 s operation timeout. It runs once the pause ends.
    let paused = std::process::Command::new("redis-cli")
        .args(["-p", &redis.port().to_string(), "CLIENT", "PAUSE", "2500", "ALL"])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&paused.stdout), "OK\n");
    let paused_at = Instant::now();
    let status = failed_call(&mut client, both("api", "acme", "u2")).await;
    assert_eq!(status.code(), GrpcCode::Unavailable);
    assert_eq!(
        status.message(),
        "rate limit backend failed (quota may have been consumed): timed out after 1s waiting for Redis after \
         the request was sent"
    );
    tokio::time::sleep(std::time::Duration::from_millis(2_700).saturating_sub(paused_at.elapsed())).await;
    // It was: both acme and u2 were charged by the request that timed out.
    let third = call(&mut client, both("api", "acme", "u3")).await;
    assert_eq!(views(&third)[0].2, 7, "{:?}", views(&third));
    let u2 = call(&mut client, peek("api", "user", "u2")).await;
    assert_eq!(views(&u2)[0].2, 1, "{:?}", views(&u2));

    // The server is gone. The first call may still find the old connection not yet seen
    // closed, be sent on it and fail as "may have been consumed" (runlimit-redis cannot tell a
    // request the dead server never read from one it ran); every later call fails to open a
    // connection, before anything is sent: nothing was consumed.
    redis.stop();
    let first = failed_call(&mut client, both("api", "acme", "u4")).await;
    assert_eq!(first.code(), GrpcCode::Unavailable);
    assert!(
        first.message().starts_with(&not_sent(redis.port()))
            || first.message().starts_with(
                "rate limit backend failed (quota may have been consumed): the Redis connection failed after the \
                 request was sent: "
            ),
        "{}",
        first.message()
    );
    let status = failed_call(&mut client, both("api", "acme", "u4")).await;
    assert_eq!(status.code(), GrpcCode::Unavailable);
    assert_eq!(status.message(), not_sent(redis.port()));
    let closed = call(&mut fail_closed.client().await, both("api", "acme", "u4")).await;
    assert_eq!(overall(&closed), Code::OverLimit);
    assert_eq!(
        views(&closed),
        [(Code::OverLimit, Some((10, MINUTE)), 0, None), (Code::OverLimit, Some((2, MINUTE)), 0, None)]
    );
    let open = call(&mut fail_open.client().await, both("api", "acme", "u4")).await;
    assert_eq!(overall(&open), Code::Ok);
    assert_eq!(views(&open), [(Code::Ok, None, 0, None), (Code::Ok, None, 0, None)]);

    // Back on the same port, empty (nothing was persisted): the same rate limit server uses it
    // again, reloading its scripts.
    redis.restart();
    let again = Instant::now();
    let back = call(&mut client, both("api", "acme", "u5")).await;
    assert_statuses(
        &back,
        Code::Ok,
        &[
            (Code::Ok, Some((10, MINUTE)), 9, within(60_000, again)),
            (Code::Ok, Some((2, MINUTE)), 1, within(60_000, again)),
        ],
    );
    server.stop().await;
    fail_closed.stop().await;
    fail_open.stop().await;
}
