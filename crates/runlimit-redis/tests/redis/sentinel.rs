//! Redis Sentinel: a primary, a replica and three Sentinels on loopback, started by the test;
//! two failovers under load (`SENTINEL FAILOVER`, then a killed primary). Admissions resume on
//! each new primary, every error is classified, and the counter keeps its window.

use crate::support;

use std::{
    process::{Child, Command, Stdio},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use runlimit_conformance::support::{fixed_window, subject};
use runlimit_core::{Check, ConsumptionStatus, DecisionView};
use runlimit_redis::{
    CheckError, KeyPrefix, RedisConfig, RedisConnector, RedisLimiter, RedisSentinel, UrlError,
};

const SERVICE: &str = "runlimit-test";

/// A `redis-server --sentinel` of the test's own: killed when dropped.
struct OwnSentinel {
    child: Child,
    port: u16,
    _directory: tempfile::TempDir,
}

impl Drop for OwnSentinel {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl OwnSentinel {
    /// A Sentinel monitoring the primary on `primary_port` (quorum 2, down after 1 s), once it
    /// answers as itself. As with `support::own_server`, a new port is drawn when the Sentinel
    /// exits (the port was taken meanwhile) and another test's server answering on the port
    /// is not taken for it (tests run in parallel and may draw the same free port).
    async fn start(primary_port: u16) -> Self {
        for _attempt in 0..5 {
            let directory = tempfile::tempdir().expect("a temporary directory");
            let port = support::free_port();
            let config = directory.path().join("sentinel.conf");
            std::fs::write(
                &config,
                format!(
                    "port {port}\nbind 127.0.0.1\ndir {}\nsentinel monitor {SERVICE} 127.0.0.1 {primary_port} 2\n\
                     sentinel down-after-milliseconds {SERVICE} 1000\nsentinel failover-timeout {SERVICE} 4000\n\
                     sentinel parallel-syncs {SERVICE} 1\n",
                    directory.path().display()
                ),
            )
            .expect("write sentinel.conf");
            let child = Command::new("redis-server")
                .arg(&config)
                .arg("--sentinel")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("start redis-server --sentinel");
            let mut sentinel = Self { child, port, _directory: directory };
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                if sentinel.child.try_wait().expect("poll redis-server --sentinel").is_some() {
                    break;
                }
                if support::answers_as(&sentinel.url(), sentinel.child.id()).await {
                    return sentinel;
                }
                assert!(Instant::now() < deadline, "the Sentinel on port {port} did not answer within 10 s");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        panic!("redis-server --sentinel exited before answering five times")
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }
}

async fn sentinel_query(url: &str, arguments: &[&str]) -> Option<redis::Value> {
    let attempt = async {
        let mut connection = redis::Client::open(url).ok()?.get_multiplexed_async_connection().await.ok()?;
        redis::cmd("SENTINEL").arg(arguments).query_async(&mut connection).await.ok()
    };
    tokio::time::timeout(Duration::from_secs(1), attempt).await.ok().flatten()
}

fn array_len(value: Option<redis::Value>) -> usize {
    match value {
        Some(redis::Value::Array(items)) => items.len(),
        _ => 0,
    }
}

async fn wait_until<F: AsyncFnMut() -> bool>(what: &str, limit: Duration, mut condition: F) {
    let started = Instant::now();
    while !condition().await {
        assert!(started.elapsed() < limit, "{what}: not within {limit:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A server's `ROLE` on a fresh connection (a Sentinel reconfiguring a server closes its
/// clients' connections); empty when it cannot be read.
async fn role(url: &str) -> String {
    // The connection itself may be refused or cut while the server is reconfigured.
    let Ok(mut connection) = support::try_connect(url).await else {
        return String::new();
    };
    let Ok(reply) = redis::cmd("ROLE").query_async::<redis::Value>(&mut connection).await else {
        return String::new();
    };
    match reply {
        redis::Value::Array(fields) => match fields.first() {
            Some(redis::Value::BulkString(bytes)) => String::from_utf8_lossy(bytes).into_owned(),
            other => format!("{other:?}"),
        },
        other => format!("{other:?}"),
    }
}

/// What the load saw.
#[derive(Default, Debug)]
struct Tally {
    allowed: u64,
    may_have_been_consumed: u64,
    not_consumed: u64,
    /// Each error's variant name and consumption class, once per distinct pair.
    kinds: Vec<(String, ConsumptionStatus)>,
    /// The address of each allowed admission, as it changed.
    servers: Vec<String>,
}

fn variant(error: &CheckError) -> String {
    let debug = format!("{error:?}");
    let name = debug.split([' ', '{', '(']).next().unwrap_or_default().to_owned();
    match error {
        CheckError::Server { code, .. } => format!("{name} {code}"),
        _ => name,
    }
}

#[test]
#[ignore = "needs redis-server on PATH (starts servers and Sentinels of its own)"]
fn admissions_follow_two_failovers_and_every_error_is_classified() {
    support::runtime().block_on(async {
        let first = support::own_server(&[]).await;
        let second = support::own_server(&["--replicaof", "127.0.0.1", &first.port().to_string()]).await;
        let mut replica = support::connect(&second.url()).await;
        wait_until("the replica to sync", Duration::from_secs(20), async || {
            let info: String = redis::cmd("INFO").arg("replication").query_async(&mut replica).await.expect("INFO");
            info.contains("master_link_status:up")
        })
        .await;
        let mut sentinels = Vec::new();
        for _ in 0..3 {
            sentinels.push(OwnSentinel::start(first.port()).await);
        }
        for sentinel in &sentinels {
            // Each knows the replica and both other Sentinels: a failover can be agreed.
            // (Sentinels learn replicas from the primary's INFO every 10 s and each other from
            // hello messages every 2 s; 60 s leaves room for a loaded machine.)
            wait_until("a Sentinel to see the replica and its peers", Duration::from_secs(60), async || {
                array_len(sentinel_query(&sentinel.url(), &["REPLICAS", SERVICE]).await) == 1
                    && array_len(sentinel_query(&sentinel.url(), &["SENTINELS", SERVICE]).await) == 2
            })
            .await;
        }

        let urls: Vec<String> = sentinels.iter().map(OwnSentinel::url).collect();
        let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
        let connector = RedisConnector::sentinel(RedisSentinel::new(SERVICE, &urls).expect("Sentinels"))
            .expect("a connector")
            .with_eviction_watch_interval(Duration::from_millis(200))
            .expect("an interval");
        let config = RedisConfig::default()
            .with_key_prefix(KeyPrefix::new("sentinel").expect("a prefix"))
            .with_operation_timeout(Duration::from_millis(500))
            .expect("a timeout")
            .with_connect_timeout(Duration::from_millis(500))
            .expect("a timeout");
        let limiter = RedisLimiter::from_connector(&connector).with_config(config);
        assert_eq!(limiter.address(), format!("sentinel service {SERVICE}"));
        limiter.prepare().await.expect("prepare through the Sentinels");
        let first_address = format!("127.0.0.1:{}", first.port());
        let second_address = format!("127.0.0.1:{}", second.port());
        assert_eq!(limiter.address(), first_address);

        let window = fixed_window("sentinel.failover", 10_000_000, 3_600_000);
        let check = Check::new(subject(1).bind(&window));
        let opened = limiter.check(&check).await.expect("the first admission");
        let DecisionView::Allowed { allowance } = opened.view() else { panic!("{opened:?}") };
        let window_ends = Instant::now() + allowance.replenishes_after().duration();

        // The load: one admission after another until told to stop.
        let tally = Arc::new(Mutex::new(Tally { allowed: 1, servers: vec![first_address.clone()], ..Tally::default() }));
        let stop = Arc::new(AtomicBool::new(false));
        let load = {
            let (limiter, tally, stop) = (limiter.clone(), Arc::clone(&tally), Arc::clone(&stop));
            let window = window.clone();
            tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    let result = limiter.check(&Check::new(subject(1).bind(&window))).await;
                    let failed = result.is_err();
                    {
                    let mut tally = tally.lock().expect("the tally");
                    match result {
                        Ok(decision) => {
                            assert!(decision.permits_request(), "{decision:?}");
                            tally.allowed += 1;
                            let address = limiter.address();
                            if tally.servers.last() != Some(&address) {
                                tally.servers.push(address);
                            }
                        }
                        Err(error) => {
                            let class = error.consumption();
                            match class {
                                ConsumptionStatus::MayHaveBeenConsumed => tally.may_have_been_consumed += 1,
                                _ => tally.not_consumed += 1,
                            }
                            let kind = (variant(&error), class);
                            if !tally.kinds.contains(&kind) {
                                tally.kinds.push(kind);
                            }
                        }
                    }
                    }
                    if failed {
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                }
            })
        };
        let allowed_on = |address: String| {
            let tally = Arc::clone(&tally);
            async move || {
                let tally = tally.lock().expect("the tally");
                tally.servers.last() == Some(&address) && tally.allowed > 0
            }
        };
        tokio::time::sleep(Duration::from_millis(300)).await;

        // 1. A failover Sentinel is told to make.
        let reply = sentinel_query(&sentinels[0].url(), &["FAILOVER", SERVICE]).await;
        assert_eq!(reply, Some(redis::Value::Okay));
        let started = Instant::now();
        wait_until("admissions on the promoted replica", Duration::from_secs(30), allowed_on(second_address.clone()))
            .await;
        let first_failover = started.elapsed();
        wait_until("the old primary to follow the new one", Duration::from_secs(30), async || {
            role(&first.url()).await == "slave"
        })
        .await;
        wait_until("the old primary to sync", Duration::from_secs(30), async || {
            let mut promoted = support::connect(&second.url()).await;
            let info: String =
                redis::cmd("INFO").arg("replication").query_async(&mut promoted).await.unwrap_or_default();
            info.contains("connected_slaves:1") && info.contains("state=online")
        })
        .await;
        tokio::time::sleep(Duration::from_millis(300)).await;

        // 2. The new primary dies: the Sentinels notice (1 s) and promote the first server.
        drop(second);
        let started = Instant::now();
        wait_until("admissions on the first server again", Duration::from_secs(60), allowed_on(first_address.clone()))
            .await;
        let second_failover = started.elapsed();
        tokio::time::sleep(Duration::from_millis(300)).await;
        stop.store(true, Ordering::Relaxed);
        load.await.expect("the load task");

        let snapshot = limiter.peek(subject(1).bind(&window)).await.expect("a peek on the last primary");
        let tally = tally.lock().expect("the tally");
        let used = 10_000_000 - snapshot.available();
        let ends = Instant::now() + snapshot.replenishes_after().duration();
        println!(
            "sentinel failovers: {} admissions allowed, {} errors not consumed, {} may have been consumed; {used} \
             counted on the last primary; over-admission (allowed but lost) {}; errors {:?}; servers {:?}; \
             failovers took {first_failover:?} and {second_failover:?}",
            tally.allowed,
            tally.not_consumed,
            tally.may_have_been_consumed,
            tally.allowed.saturating_sub(used),
            tally.kinds,
            tally.servers,
        );
        assert_eq!(tally.servers, [first_address.clone(), second_address, first_address]);
        // A NotConsumed error never wrote: the count is at most what was allowed plus what may
        // have been consumed (lost acknowledged writes can only lower it).
        assert!(used <= tally.allowed + tally.may_have_been_consumed, "{used} > {tally:?}");
        // Every error is one whose class is known: nothing else appears.
        for (kind, class) in &tally.kinds {
            let expected = match kind.as_str() {
                "Connect" | "ConnectTimeout" | "NoPrimary" | "Server READONLY" | "Server LOADING"
                | "Server MASTERDOWN" => ConsumptionStatus::NotConsumed,
                "Connection" | "Timeout" => ConsumptionStatus::MayHaveBeenConsumed,
                other => panic!("an unexpected error during failover: {other}"),
            };
            assert_eq!(*class, expected, "{kind}");
        }
        // The counter kept its window through both failovers: it ends when it did, never
        // earlier (a window reopened early would end an hour from now).
        let drift = if ends > window_ends { ends - window_ends } else { window_ends - ends };
        assert!(drift < Duration::from_secs(2), "the window moved by {drift:?}");
    });
}

#[test]
fn sentinel_settings_are_validated() {
    assert!(matches!(RedisSentinel::new(SERVICE, &[]), Err(UrlError::NoSentinels)));
    assert!(matches!(RedisSentinel::new("", &["redis://127.0.0.1:26379"]), Err(UrlError::NoSentinels)));
    assert!(matches!(
        RedisSentinel::new(SERVICE, &["redis+unix:///tmp/s.sock"]),
        Err(UrlError::UnsupportedScheme)
    ));
    let sentinel =
        RedisSentinel::new(SERVICE, &["redis://:secret@127.0.0.1:26379", "redis://127.0.0.1:26380"])
            .expect("Sentinels")
            .with_primary_credentials(Some("runlimit"), "another-secret");
    let debug = format!("{sentinel:?}");
    assert_eq!(
        debug,
        "RedisSentinel { service: \"runlimit-test\", sentinels: [\"127.0.0.1:26379\", \"127.0.0.1:26380\"], .. }"
    );
}

#[test]
#[ignore = "needs redis-server on PATH"]
fn no_reachable_sentinel_names_them_and_is_not_consumed() {
    support::runtime().block_on(async {
        let (one, two) = (support::free_port(), support::free_port());
        let sentinel = RedisSentinel::new(
            SERVICE,
            &[&format!("redis://127.0.0.1:{one}"), &format!("redis://127.0.0.1:{two}")],
        )
        .expect("Sentinels");
        let limiter = RedisLimiter::from_connector(&RedisConnector::sentinel(sentinel).expect("a connector"));
        let window = fixed_window("sentinel.none", 5, 60_000);
        let error = limiter.check(&Check::new(subject(1).bind(&window))).await.expect_err("no Sentinel");
        assert_eq!(error.consumption(), ConsumptionStatus::NotConsumed);
        assert_eq!(
            error.to_string(),
            format!(
                "no Sentinel of 127.0.0.1:{one}, 127.0.0.1:{two} named a reachable primary for service {SERVICE}: \
                 127.0.0.1:{two}: Connection refused (os error 111)"
            )
        );
        // A Sentinel that does not monitor the service says so.
        let server = support::own_server(&[]).await;
        let lone = OwnSentinel::start(server.port()).await;
        wait_until("the Sentinel to answer", Duration::from_secs(10), async || {
            sentinel_query(&lone.url(), &["GET-MASTER-ADDR-BY-NAME", SERVICE]).await.is_some()
        })
        .await;
        let sentinel = RedisSentinel::new("another-service", &[&lone.url()]).expect("Sentinels");
        let limiter = RedisLimiter::from_connector(&RedisConnector::sentinel(sentinel).expect("a connector"));
        let error = limiter.check(&Check::new(subject(1).bind(&window))).await.expect_err("unknown service");
        assert_eq!(
            error.to_string(),
            format!(
                "no Sentinel of 127.0.0.1:{port} named a reachable primary for service another-service: \
                 127.0.0.1:{port}: does not monitor a service named another-service",
                port = lone.port
            )
        );
    });
}

// ---------------------------------------------------------------------------------------------
// With a scripted Sentinel: what the connector does when the Sentinels' answer changes.

/// A fake Sentinel on a loopback port: answers `SENTINEL GET-MASTER-ADDR-BY-NAME` with
/// 127.0.0.1 and the port `primary` holds at the time, `+OK` to anything else; with `mute`, it
/// accepts connections and never answers.
async fn fake_sentinel(primary: Arc<Mutex<u16>>, mute: bool) -> u16 {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = listener.local_addr().expect("an address").port();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let primary = Arc::clone(&primary);
            tokio::spawn(async move {
                let (read, mut write) = stream.into_split();
                let mut read = BufReader::new(read);
                loop {
                    let mut line = String::new();
                    if read.read_line(&mut line).await.unwrap_or(0) == 0 {
                        return;
                    }
                    let count: usize = line.trim().trim_start_matches('*').parse().unwrap_or(0);
                    let mut arguments = Vec::new();
                    for _ in 0..count {
                        let (mut length, mut argument) = (String::new(), String::new());
                        if read.read_line(&mut length).await.is_err()
                            || read.read_line(&mut argument).await.is_err()
                        {
                            return;
                        }
                        arguments.push(argument.trim().to_uppercase());
                    }
                    if mute {
                        continue;
                    }
                    let reply = if arguments.first().map(String::as_str) == Some("SENTINEL") {
                        let port = primary.lock().expect("the primary").to_string();
                        format!("*2\r\n$9\r\n127.0.0.1\r\n${}\r\n{port}\r\n", port.len())
                    } else {
                        "+OK\r\n".to_owned()
                    };
                    if write.write_all(reply.as_bytes()).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    port
}

fn short_timeouts(prefix: &str) -> RedisConfig {
    timeouts(prefix, Duration::from_millis(100))
}

/// Keys under `prefix`; `timeout` to connect and for each operation.
fn timeouts(prefix: &str, timeout: Duration) -> RedisConfig {
    RedisConfig::default()
        .with_key_prefix(KeyPrefix::new(prefix).expect("a prefix"))
        .with_connect_timeout(timeout)
        .expect("a timeout")
        .with_operation_timeout(timeout)
        .expect("a timeout")
}

async fn set_policy(url: &str, policy: &str) {
    let mut connection = support::connect(url).await;
    let () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory-policy")
        .arg(policy)
        .query_async(&mut connection)
        .await
        .expect("CONFIG SET maxmemory-policy");
}

async fn dbsize(url: &str) -> u64 {
    let mut connection = support::connect(url).await;
    redis::cmd("DBSIZE").query_async(&mut connection).await.expect("DBSIZE")
}

fn connector_of(sentinels: &[u16]) -> RedisConnector {
    let urls: Vec<String> = sentinels.iter().map(|port| format!("redis://127.0.0.1:{port}")).collect();
    let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
    RedisConnector::sentinel(RedisSentinel::new("svc", &urls).expect("Sentinels")).expect("a connector")
}

/// Sentinels that never answer: every waiting operation fails within about the connect
/// timeout (they share one ask), not one after another.
#[test]
#[ignore = "needs redis-server on PATH"]
fn operations_waiting_for_silent_sentinels_fail_within_the_connect_timeout() {
    support::runtime().block_on(async {
        let primary = Arc::new(Mutex::new(1u16));
        let silent = [
            fake_sentinel(Arc::clone(&primary), true).await,
            fake_sentinel(Arc::clone(&primary), true).await,
        ];
        let limiter =
            RedisLimiter::from_connector(&connector_of(&silent)).with_config(short_timeouts("silent"));
        let window = fixed_window("sentinel.silent", 5, 60_000);
        let started = Instant::now();
        let tasks: Vec<_> = (0..20u64)
            .map(|n| {
                let (limiter, window) = (limiter.clone(), window.clone());
                tokio::spawn(async move { limiter.check(&Check::new(subject(n).bind(&window))).await })
            })
            .collect();
        for task in tasks {
            let error = task.await.expect("a task").expect_err("no Sentinel answers");
            assert!(matches!(error, CheckError::NoPrimary { .. }), "{error:?}");
            assert_eq!(error.consumption(), ConsumptionStatus::NotConsumed);
        }
        // 20 operations behind two silent Sentinels, 100 ms connect timeout: one shared wait,
        // not twenty (before, the slowest waited 4 s).
        assert!(started.elapsed() < Duration::from_secs(1), "{:?}", started.elapsed());
    });
}

/// The Sentinels are asked concurrently, so their failures arrive in any order; the reason an
/// error names is the last configured Sentinel's, whichever failed last. Here the last one
/// refuses at once while the first accepts and hangs up 100 ms later, with the `SENTINEL`
/// command unread (so with an arrival-order rule it would be the first one's reason). Then the
/// other way round, which rules out a first-configured rule. The timeouts are far longer than
/// 100 ms, so no timeout decides the race.
#[test]
#[ignore = "needs redis-server on PATH"]
fn the_reason_named_is_the_last_configured_sentinels_whatever_the_arrival_order() {
    support::runtime().block_on(async {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let late = listener.local_addr().expect("an address").port();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(async move {
                    // Hang up with the command unread, so the client reads a reset, however late
                    // its command arrives.
                    if stream.readable().await.is_ok() {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                    drop(stream);
                });
            }
        });
        let refused = support::free_port();
        let window = fixed_window("sentinel.order", 5, 60_000);
        let config = |prefix: &str| timeouts(prefix, Duration::from_secs(5));

        let limiter = RedisLimiter::from_connector(&connector_of(&[late, refused]))
            .with_config(config("sentinel-order-a"));
        let error = limiter.check(&Check::new(subject(1).bind(&window))).await.expect_err("no primary");
        assert_eq!(error.consumption(), ConsumptionStatus::NotConsumed);
        assert_eq!(
            error.to_string(),
            format!(
                "no Sentinel of 127.0.0.1:{late}, 127.0.0.1:{refused} named a reachable primary for service \
                 svc: 127.0.0.1:{refused}: Connection refused (os error 111)"
            )
        );

        let limiter = RedisLimiter::from_connector(&connector_of(&[refused, late]))
            .with_config(config("sentinel-order-b"));
        let error = limiter.check(&Check::new(subject(1).bind(&window))).await.expect_err("no primary");
        assert_eq!(
            error.to_string(),
            format!(
                "no Sentinel of 127.0.0.1:{refused}, 127.0.0.1:{late} named a reachable primary for service \
                 svc: 127.0.0.1:{late}: Connection reset by peer (os error 104)"
            )
        );
    });
}

/// A newly named primary whose policy evicts is never written to: the operation that found it
/// fails closed, and so does every later one until it is `noeviction`.
#[test]
#[ignore = "needs redis-server on PATH"]
fn a_new_primary_that_evicts_is_never_written_to() {
    support::runtime().block_on(async {
        let first = support::own_server(&[]).await;
        let evicting = support::own_server(&["--maxmemory-policy", "allkeys-lru"]).await;
        let primary = Arc::new(Mutex::new(first.port()));
        let sentinel = fake_sentinel(Arc::clone(&primary), false).await;
        let connector = connector_of(&[sentinel])
            .with_eviction_watch_interval(Duration::from_secs(3_600))
            .expect("an interval");
        let limiter = RedisLimiter::from_connector(&connector).with_config(short_timeouts("evicting"));
        limiter.prepare().await.expect("prepare");
        let window = fixed_window("sentinel.evicting", 1_000, 60_000);
        let check = Check::new(subject(1).bind(&window));
        limiter.check(&check).await.expect("on the first primary");
        // The first primary dies and the Sentinel names the evicting server.
        *primary.lock().expect("the primary") = evicting.port();
        drop(first);
        // The first call may still find the dead primary's connection open (a lost reply: may have
        // been consumed); then the Sentinel is asked, and the new primary's policy read.
        let mut tries = 0;
        loop {
            let error = limiter.check(&check).await.expect_err("no primary to admit on");
            match &error {
                CheckError::EvictingServer { .. } => break,
                CheckError::Connection { .. } => {
                    assert_eq!(error.consumption(), ConsumptionStatus::MayHaveBeenConsumed);
                }
                other => assert_eq!(other.consumption(), ConsumptionStatus::NotConsumed, "{other:?}"),
            }
            tries += 1;
            assert!(tries < 10, "the evicting primary was never found: {error:?}");
        }
        for _ in 0..3 {
            let error = limiter.check(&check).await.expect_err("an evicting primary");
            assert!(
                matches!(&error, CheckError::EvictingServer { policy, .. } if policy == "allkeys-lru"),
                "{error:?}"
            );
        }
        assert_eq!(dbsize(&evicting.url()).await, 0, "nothing was written to the evicting server");
        set_policy(&evicting.url(), "noeviction").await;
        limiter.prepare().await.expect("prepare on the new primary");
        assert_eq!(connector.evicting_server(), None);
        assert!(limiter.check(&check).await.expect("on the new primary").permits_request());
    });
}

/// A verdict about a server that is no longer the primary goes when the Sentinels name
/// another: the watch reads the new primary and admissions resume.
#[test]
#[ignore = "needs redis-server on PATH"]
fn a_verdict_about_a_former_primary_is_dropped() {
    support::runtime().block_on(async {
        let first = support::own_server(&[]).await;
        let second = support::own_server(&[]).await;
        let primary = Arc::new(Mutex::new(first.port()));
        let sentinel = fake_sentinel(Arc::clone(&primary), false).await;
        let connector = connector_of(&[sentinel])
            .with_eviction_watch_interval(Duration::from_millis(50))
            .expect("an interval");
        let limiter = RedisLimiter::from_connector(&connector).with_config(short_timeouts("former"));
        limiter.prepare().await.expect("prepare");
        let window = fixed_window("sentinel.former", 1_000, 60_000);
        let check = Check::new(subject(1).bind(&window));
        limiter.check(&check).await.expect("on the first primary");
        set_policy(&first.url(), "allkeys-lru").await;
        wait_until("the watch to trip", Duration::from_secs(10), async || {
            connector.evicting_server().is_some()
        })
        .await;
        // The operator fails over to the second server (which does not evict).
        *primary.lock().expect("the primary") = second.port();
        wait_until("admissions on the second server", Duration::from_secs(10), async || {
            limiter.check(&check).await.is_ok()
        })
        .await;
        assert_eq!(limiter.address(), format!("127.0.0.1:{}", second.port()));
        assert_eq!(connector.evicting_server(), None);
    });
}

/// The watch started by a `prepare` on a runtime that has since shut down starts again with
/// the next `prepare`.
#[test]
#[ignore = "needs redis-server on PATH"]
fn the_watch_restarts_after_its_runtime_shut_down() {
    let runtime = support::runtime();
    let server = runtime.block_on(support::own_server(&[]));
    let connector = RedisConnector::new(&server.url())
        .expect("a URL")
        .with_eviction_watch_interval(Duration::from_millis(50))
        .expect("an interval");
    let limiter = RedisLimiter::from_connector(&connector).with_config(short_timeouts("runtime"));
    {
        let first = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
        first.block_on(limiter.prepare()).expect("prepare");
        assert!(connector.eviction_watch_running());
    }
    assert!(!connector.eviction_watch_running(), "the watch ended with its runtime");
    runtime.block_on(async {
        limiter.prepare().await.expect("prepare again");
        assert!(connector.eviction_watch_running());
        let window = fixed_window("sentinel.runtime", 1_000, 60_000);
        let check = Check::new(subject(1).bind(&window));
        set_policy(&server.url(), "allkeys-lru").await;
        wait_until("the watch to trip", Duration::from_secs(10), async || {
            matches!(limiter.check(&check).await, Err(CheckError::EvictingServer { .. }))
        })
        .await;
    });
}
