//! How a limiter reaches Redis, against servers the tests start on loopback: one connection
//! shared by many limiters, Unix sockets, TLS (a private CA, host names, client certificates),
//! ACL users with only what a limiter needs, and the eviction watch.

use crate::support;

use std::{
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
use redis::aio::MultiplexedConnection;
use runlimit_conformance::support::{fixed_window, gcra, subject};
use runlimit_core::{Check, ConsumptionStatus};
use runlimit_redis::{
    CheckError, KeyPrefix, PrepareError, RedisConfig, RedisConnector, RedisGcraLimiter, RedisLimiter,
    RedisTls, UrlError,
};

fn config(prefix: &str) -> RedisConfig {
    RedisConfig::default().with_key_prefix(KeyPrefix::new(prefix).expect("a valid prefix"))
}

/// The clients connected to a server, without the one asking.
async fn other_clients(direct: &mut MultiplexedConnection) -> usize {
    let list: String = redis::cmd("CLIENT").arg("LIST").query_async(direct).await.expect("CLIENT LIST");
    list.lines().count() - 1
}

/// The quota an allowed decision leaves; panics on a denial.
fn available(decision: &runlimit_core::Decision) -> u64 {
    match decision.view() {
        runlimit_core::DecisionView::Allowed { allowance } => allowance.available(),
        other => panic!("expected an allowed decision, got {other:?}"),
    }
}

/// What a check of subject `n` under `policy` leaves.
async fn available_after_check(
    limiter: &RedisLimiter,
    policy: &runlimit_core::FixedWindowPolicy,
    n: u64,
) -> u64 {
    available(&limiter.check(&Check::new(subject(n).bind(policy))).await.expect("a check"))
}

#[test]
#[ignore = "needs redis-server on PATH (starts servers of its own)"]
fn ten_limiters_of_one_connector_hold_one_connection() {
    support::runtime().block_on(async {
        let server = support::own_server(&[]).await;
        let mut direct = support::connect(&server.url()).await;
        assert_eq!(other_clients(&mut direct).await, 0);
        let connector = RedisConnector::new(&server.url()).expect("a valid URL");
        let fixed: Vec<RedisLimiter> = (0..5)
            .map(|n| RedisLimiter::from_connector(&connector).with_config(config(&format!("fixed-{n}"))))
            .collect();
        let gcras: Vec<RedisGcraLimiter> = (0..5)
            .map(|n| RedisGcraLimiter::from_connector(&connector).with_config(config(&format!("gcra-{n}"))))
            .collect();
        let window = fixed_window("connections.shared", 10, 60_000);
        let rate = gcra("connections.shared-gcra", 10, 60_000, 10);
        let mut admissions = Vec::new();
        let window_ref = &window;
        for (n, limiter) in fixed.iter().enumerate() {
            limiter.prepare().await.expect("prepare");
            admissions.push(async move {
                let window = window_ref;
                let check =
                    Check::new(subject(1).bind(window)).with_cost(u64::try_from(n).unwrap() + 1).unwrap();
                available(&limiter.check(&check).await.expect("a check"))
            });
        }
        let fixed_available = futures_join(admissions).await;
        // Each limiter (prefix) counts apart: subject 1 spent n + 1 of 10 in limiter n.
        assert_eq!(fixed_available, [9, 8, 7, 6, 5]);
        for limiter in &gcras {
            limiter.prepare().await.expect("prepare");
            let decision = limiter.check(&Check::new(subject(1).bind(&rate))).await.expect("a check");
            assert_eq!(available(&decision), 9);
        }
        // Ten limiters, two algorithms, ten prefixes, one connection.
        assert_eq!(other_clients(&mut direct).await, 1);

        // A limiter of its own opens its own.
        let alone = RedisLimiter::new(&server.url()).expect("a valid URL").with_config(config("alone"));
        assert_eq!(available_after_check(&alone, &window, 1).await, 9);
        assert_eq!(other_clients(&mut direct).await, 2);
        // A limiter's connector builds more on its connection.
        let more = RedisGcraLimiter::from_connector(&alone.connector()).with_config(config("more"));
        more.check(&Check::new(subject(1).bind(&rate))).await.expect("a check");
        assert_eq!(other_clients(&mut direct).await, 2);
    });
}

/// Runs the futures concurrently, returning their outputs in order.
async fn futures_join<F: std::future::Future<Output = u64>>(futures: Vec<F>) -> Vec<u64> {
    let mut pinned: Vec<_> = futures.into_iter().map(Box::pin).collect();
    let mut outputs = vec![None; pinned.len()];
    std::future::poll_fn(|context| {
        for (future, output) in pinned.iter_mut().zip(outputs.iter_mut()) {
            if output.is_none()
                && let std::task::Poll::Ready(value) = future.as_mut().poll(context)
            {
                *output = Some(value);
            }
        }
        if outputs.iter().all(Option::is_some) {
            std::task::Poll::Ready(())
        } else {
            std::task::Poll::Pending
        }
    })
    .await;
    outputs.into_iter().map(|output| output.unwrap_or_default()).collect()
}

#[test]
#[ignore = "needs redis-server on PATH (starts servers of its own)"]
fn unix_sockets_are_reached_with_either_scheme() {
    support::runtime().block_on(async {
        let directory = tempfile::tempdir().expect("a temporary directory");
        let socket = directory.path().join("redis.sock");
        let socket_text = socket.to_str().expect("a UTF-8 path");
        let _server = support::own_server(&["--unixsocket", socket_text, "--unixsocketperm", "700"]).await;
        let window = fixed_window("connections.unix", 5, 60_000);
        for (n, url) in
            [format!("redis+unix://{socket_text}"), format!("unix://{socket_text}")].iter().enumerate()
        {
            let limiter = RedisLimiter::new(url).expect("a Unix socket URL").with_config(config("unix"));
            assert_eq!(limiter.address(), format!("unix:{socket_text}"));
            limiter.prepare().await.expect("prepare over the socket");
            // The same counter through both URLs: the second limiter sees the first's use.
            let available = available_after_check(&limiter, &window, 7).await;
            assert_eq!(available, 4 - u64::try_from(n).unwrap());
        }
        // A socket nobody listens on names its path and the cause.
        let missing = directory.path().join("missing.sock");
        let limiter = RedisLimiter::new(&format!("redis+unix://{}", missing.display())).expect("a URL");
        let error = limiter.check(&Check::new(subject(1).bind(&window))).await.expect_err("nobody listens");
        assert_eq!(
            error.to_string(),
            format!(
                "could not connect to Redis at unix:{}: No such file or directory (os error 2)",
                missing.display()
            )
        );
        assert_eq!(error.consumption(), ConsumptionStatus::NotConsumed);
    });
}

// ---------------------------------------------------------------------------------------------
// TLS

/// A certificate authority, a server certificate and a client certificate it issued, as PEM
/// files in a temporary directory.
struct Pki {
    directory: tempfile::TempDir,
}

impl Pki {
    /// A CA named `name`; a server certificate for `server_names`; a client certificate.
    fn new(name: &str, server_names: &[&str]) -> Self {
        let directory = tempfile::tempdir().expect("a temporary directory");
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("CA parameters");
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params.distinguished_name.push(rcgen::DnType::CommonName, name);
        let ca =
            CertifiedIssuer::self_signed(ca_params, KeyPair::generate().expect("a CA key")).expect("a CA");
        let write = |file: &str, contents: String| {
            std::fs::write(directory.path().join(file), contents).expect("write")
        };
        write("ca.pem", ca.pem());
        for (role, names) in
            [("server", server_names.iter().map(|name| (*name).to_owned()).collect()), ("client", vec![])]
        {
            let key = KeyPair::generate().expect("a key");
            let mut params = CertificateParams::new(names).expect("parameters");
            params.distinguished_name.push(rcgen::DnType::CommonName, role);
            let certificate = params.signed_by(&key, &ca).expect("a certificate");
            write(&format!("{role}.pem"), certificate.pem());
            write(&format!("{role}.key"), key.serialize_pem());
        }
        Self { directory }
    }

    fn path(&self, file: &str) -> PathBuf {
        self.directory.path().join(file)
    }

    fn read(&self, file: &str) -> Vec<u8> {
        std::fs::read(self.path(file)).expect("read a PEM file")
    }
}

fn text(path: &Path) -> String {
    path.to_str().expect("a UTF-8 path").to_owned()
}

/// A server with a plain port (for the test's own connection) and a TLS port presenting
/// `pki`'s server certificate; `clients` is `tls-auth-clients` (`no` or `yes`).
async fn tls_server(pki: &Pki, clients: &str) -> (support::OwnServer, u16) {
    let tls_port = support::free_port();
    let arguments = [
        "--tls-port".to_owned(),
        tls_port.to_string(),
        "--tls-cert-file".to_owned(),
        text(&pki.path("server.pem")),
        "--tls-key-file".to_owned(),
        text(&pki.path("server.key")),
        "--tls-ca-cert-file".to_owned(),
        text(&pki.path("ca.pem")),
        "--tls-auth-clients".to_owned(),
        clients.to_owned(),
    ];
    let arguments: Vec<&str> = arguments.iter().map(String::as_str).collect();
    (support::own_server(&arguments).await, tls_port)
}

/// Whether `prepare` and a check succeed through `connector`; the check's available count.
async fn admits(connector: &RedisConnector, prefix: &str) -> Result<u64, PrepareError> {
    let limiter = RedisLimiter::from_connector(connector).with_config(config(prefix));
    limiter.prepare().await?;
    Ok(available_after_check(&limiter, &fixed_window("connections.tls", 3, 60_000), 1).await)
}

/// A refused connection: `Unreachable(Connect)` naming `address`, not consumed, whose message
/// contains `cause`.
#[track_caller]
fn assert_refused(result: Result<u64, PrepareError>, address: &str, cause: &str) {
    let error = result.expect_err("a refused connection");
    let PrepareError::Unreachable(check) = &error else { panic!("expected Unreachable, got {error:?}") };
    assert!(matches!(check, CheckError::Connect { address: tried, .. } if tried == address), "{check:?}");
    assert_eq!(check.consumption(), ConsumptionStatus::NotConsumed);
    let message = check.to_string();
    assert!(message.starts_with(&format!("could not connect to Redis at {address}: ")), "{message}");
    assert!(message.contains(cause), "{message} lacks {cause}");
}

#[test]
#[ignore = "needs redis-server built with TLS on PATH (starts servers of its own)"]
fn tls_verifies_the_ca_and_the_host_name() {
    support::runtime().block_on(async {
        let pki = Pki::new("runlimit test CA", &["localhost", "127.0.0.1"]);
        let other = Pki::new("another CA", &["localhost", "127.0.0.1"]);
        let (_server, port) = tls_server(&pki, "no").await;
        let trusted = || RedisTls::with_ca_file(pki.path("ca.pem")).expect("the CA");

        // The right CA, by host name and by IP address: connected, and counting.
        for (host, available) in [("localhost", 2), ("127.0.0.1", 1)] {
            let connector =
                RedisConnector::with_tls(&format!("rediss://{host}:{port}"), trusted()).expect("a rediss URL");
            assert!(connector.uses_tls());
            assert_eq!(admits(&connector, "tls").await.expect("a TLS connection"), available);
        }
        // The CA as PEM bytes works alike.
        let connector = RedisConnector::with_tls(
            &format!("rediss://127.0.0.1:{port}"),
            RedisTls::with_ca_pem(&pki.read("ca.pem")).expect("the CA"),
        )
        .expect("a rediss URL");
        assert_eq!(admits(&connector, "tls").await.expect("a TLS connection"), 0);

        // Another CA, and the system's roots (which never issued the test's certificate).
        let address = format!("127.0.0.1:{port}");
        let wrong_ca = RedisTls::with_ca_file(other.path("ca.pem")).expect("a CA");
        let connector = RedisConnector::with_tls(&format!("rediss://{address}"), wrong_ca).expect("a URL");
        assert_refused(admits(&connector, "tls-wrong-ca").await, &address, "invalid peer certificate: UnknownIssuer");
        match RedisConnector::new(&format!("rediss://{address}")) {
            Ok(connector) => assert_refused(
                admits(&connector, "tls-system").await,
                &address,
                "invalid peer certificate: UnknownIssuer",
            ),
            // A machine without CA certificates says so, by type.
            Err(error) => assert!(matches!(error, UrlError::Tls(runlimit_redis::TlsError::NoSystemRoots { .. })), "{error:?}"),
        }

        // A plain client on the TLS port: the handshake never completes as Redis.
        let plain = RedisConnector::new(&format!("redis://{address}")).expect("a URL");
        let error = admits(&plain, "tls-plain").await.expect_err("no TLS");
        assert!(matches!(&error, PrepareError::Unreachable(check) if check.consumption() == ConsumptionStatus::NotConsumed), "{error:?}");
    });
}

#[test]
#[ignore = "needs redis-server built with TLS on PATH (starts servers of its own)"]
fn a_certificate_for_another_host_is_refused_unless_explicitly_accepted() {
    support::runtime().block_on(async {
        let pki = Pki::new("runlimit test CA", &["redis.internal.example"]);
        let (_server, port) = tls_server(&pki, "no").await;
        let trusted = || RedisTls::with_ca_file(pki.path("ca.pem")).expect("the CA");
        let address = format!("127.0.0.1:{port}");
        let connector = RedisConnector::with_tls(&format!("rediss://{address}"), trusted()).expect("a URL");
        assert_refused(admits(&connector, "tls-host").await, &address, "certificate not valid for name");
        let connector =
            RedisConnector::with_tls(&format!("rediss://{address}"), trusted().danger_accept_any_host_name())
                .expect("a URL");
        assert_eq!(admits(&connector, "tls-host").await.expect("accepted"), 2);
        // Accepting any host name still requires the trusted CA.
        let other = Pki::new("another CA", &["redis.internal.example"]);
        let connector = RedisConnector::with_tls(
            &format!("rediss://{address}"),
            RedisTls::with_ca_file(other.path("ca.pem")).expect("a CA").danger_accept_any_host_name(),
        )
        .expect("a URL");
        assert_refused(
            admits(&connector, "tls-host").await,
            &address,
            "invalid peer certificate: UnknownIssuer",
        );
    });
}

#[test]
#[ignore = "needs redis-server built with TLS on PATH (starts servers of its own)"]
fn mutual_tls_presents_the_client_certificate() {
    support::runtime().block_on(async {
        let pki = Pki::new("runlimit test CA", &["localhost", "127.0.0.1"]);
        let (_server, port) = tls_server(&pki, "yes").await;
        let address = format!("127.0.0.1:{port}");
        let url = format!("rediss://{address}");
        let without = RedisTls::with_ca_file(pki.path("ca.pem")).expect("the CA");
        let connector = RedisConnector::with_tls(&url, without.clone()).expect("a URL");
        let error = admits(&connector, "mtls").await.expect_err("no client certificate");
        let PrepareError::Unreachable(check) = &error else { panic!("expected Unreachable, got {error:?}") };
        assert!(matches!(check, CheckError::Connect { .. }), "{check:?}");
        assert!(
            check.to_string().starts_with(&format!("could not connect to Redis at {address}: ")),
            "{check}"
        );

        let with = without
            .with_client_certificate(&pki.read("client.pem"), &pki.read("client.key"))
            .expect("a client certificate");
        let connector = RedisConnector::with_tls(&url, with).expect("a URL");
        assert_eq!(admits(&connector, "mtls").await.expect("mutual TLS"), 2);
    });
}

#[test]
fn tls_settings_are_validated_before_any_connection() {
    let pki = Pki::new("runlimit test CA", &["localhost"]);
    let tls = RedisTls::with_ca_pem(&pki.read("ca.pem")).expect("the CA");
    let error = RedisConnector::with_tls("redis://127.0.0.1:6379", tls.clone()).expect_err("not rediss");
    assert!(matches!(error, UrlError::TlsNeedsRediss));
    assert_eq!(
        error.to_string(),
        "TLS settings were given for a URL that is not rediss://: use rediss://host[:port]"
    );
    assert!(RedisConnector::with_tls("REDISS://127.0.0.1:6380", tls.clone()).expect("any case").uses_tls());
    // Valkey's schemes: valkeys:// is TLS too, valkey:// is not.
    assert!(RedisConnector::with_tls("valkeys://127.0.0.1:6380", tls.clone()).expect("valkeys").uses_tls());
    assert!(matches!(
        RedisConnector::with_tls("valkey://127.0.0.1:6380", tls.clone()),
        Err(UrlError::TlsNeedsRediss)
    ));
    assert!(!RedisConnector::new("valkey://127.0.0.1:6379").expect("valkey").uses_tls());

    let error = RedisTls::with_ca_pem(b"not PEM at all").expect_err("no certificate");
    assert_eq!(error.to_string(), "the CA PEM holds no PEM certificate");
    let error = RedisTls::with_ca_file("/nonexistent/ca.pem").expect_err("no file");
    assert_eq!(
        error.to_string(),
        "could not read the CA file /nonexistent/ca.pem: No such file or directory (os error 2)"
    );
    let error = tls.clone().with_client_certificate(&pki.read("client.pem"), b"no key").expect_err("no key");
    assert!(error.to_string().starts_with("the client key is not valid PEM: "), "{error}");
    // A key that does not match the certificate: refused when the connector is built.
    let mismatched =
        tls.with_client_certificate(&pki.read("client.pem"), &pki.read("server.key")).expect("parsed");
    let error = RedisConnector::with_tls("rediss://127.0.0.1:6380", mismatched).expect_err("mismatched key");
    assert!(
        error
            .to_string()
            .starts_with("cannot set up TLS for Redis: the client certificate or key was refused: "),
        "{error}"
    );
    // Debug never shows key material.
    let debug = format!("{:?}", RedisTls::with_ca_pem(&pki.read("ca.pem")).expect("the CA"));
    assert_eq!(debug, "RedisTls { roots: 1, client_certificate: false, verify_host_name: true }");
}

// ---------------------------------------------------------------------------------------------
// ACL users

/// The smallest ACL rule set of a limiter with key prefix `prefix` (the crate README's line):
/// its keys only, the commands `prepare`, admissions, peeks, resets and cleanup send, and those
/// their scripts call.
fn minimal_acl(prefix: &str) -> Vec<String> {
    let rules = format!(
        "on >limiter-password resetkeys ~{{{prefix}}}* ~{{{prefix}:* resetchannels -@all +info +script|load \
         +evalsha +time +type +hget +hmget +hset +hdel +zadd +zrem +zrange +zrangebyscore"
    );
    rules.split(' ').map(str::to_owned).collect()
}

async fn set_user(direct: &mut MultiplexedConnection, user: &str, rules: &[String]) {
    let () =
        redis::cmd("ACL").arg("SETUSER").arg(user).arg(rules).query_async(direct).await.expect("ACL SETUSER");
}

#[test]
#[ignore = "needs redis-server on PATH (starts servers of its own)"]
fn an_acl_user_with_the_minimal_rules_does_everything_a_limiter_does() {
    support::runtime().block_on(async {
        let server = support::own_server(&[]).await;
        let mut direct = support::connect(&server.url()).await;
        set_user(&mut direct, "limiter", &minimal_acl("acl")).await;
        let url = format!("redis://limiter:limiter-password@127.0.0.1:{}", server.port());
        let connector = RedisConnector::new(&url).expect("a URL");
        let window = fixed_window("connections.acl", 3, 60_000);
        let rate = gcra("connections.acl-gcra", 3, 60_000, 3);
        let fixed = RedisLimiter::from_connector(&connector).with_config(config("acl"));
        let gcra_limiter = RedisGcraLimiter::from_connector(&connector).with_config(config("acl"));
        fixed.prepare().await.expect("prepare as the ACL user");
        gcra_limiter.prepare().await.expect("prepare as the ACL user");
        assert_eq!(available_after_check(&fixed, &window, 1).await, 2);
        let batch = [Check::new(subject(2).bind(&window)), Check::new(subject(3).bind(&window))];
        let decision = fixed.check_all(&batch).await.expect("a batch");
        assert!(decision.permits_request());
        let snapshot = fixed.peek(subject(1).bind(&window)).await.expect("a peek");
        assert_eq!(snapshot.available(), 2);
        assert!(fixed.reset(subject(1).bind(&window)).await.expect("a reset"));
        assert_eq!(fixed.cleanup_expired(100).await.expect("cleanup"), 0);
        let decision = gcra_limiter.check(&Check::new(subject(1).bind(&rate))).await.expect("a GCRA check");
        assert_eq!(available(&decision), 2);
        assert!(gcra_limiter.reset(subject(1).bind(&rate)).await.expect("a GCRA reset"));

        // Another prefix is outside the user's keys: refused before the script runs.
        let outside = RedisLimiter::from_connector(&connector).with_config(config("elsewhere"));
        let error = outside.check(&Check::new(subject(1).bind(&window))).await.expect_err("not its keys");
        assert!(matches!(&error, CheckError::Server { code, .. } if code == "NOPERM"), "{error:?}");
        assert_eq!(error.consumption(), ConsumptionStatus::NotConsumed);

        // A wrong password names the server and the cause.
        let wrong = RedisLimiter::new(&format!("redis://limiter:wrong@127.0.0.1:{}", server.port())).expect("a URL");
        let error = wrong.check(&Check::new(subject(1).bind(&window))).await.expect_err("refused");
        assert_eq!(
            error.to_string(),
            format!(
                "could not connect to Redis at 127.0.0.1:{}: Password authentication failed - AuthenticationFailed",
                server.port()
            )
        );
        assert_eq!(error.consumption(), ConsumptionStatus::NotConsumed);
        assert!(!format!("{error:?}").contains(":wrong"), "{error:?}");
    });
}

#[test]
#[ignore = "needs redis-server on PATH (starts servers of its own)"]
fn a_user_without_info_is_told_how_to_proceed_and_may_vouch() {
    support::runtime().block_on(async {
        let server = support::own_server(&[]).await;
        let mut direct = support::connect(&server.url()).await;
        let rules: Vec<String> = minimal_acl("vouched").into_iter().filter(|rule| rule != "+info").collect();
        set_user(&mut direct, "no-info", &rules).await;
        let url = format!("redis://no-info:limiter-password@127.0.0.1:{}", server.port());
        let window = fixed_window("connections.vouched", 3, 60_000);

        let limiter = RedisLimiter::new(&url).expect("a URL").with_config(config("vouched"));
        let error = limiter.prepare().await.expect_err("INFO is not permitted");
        assert!(matches!(&error, PrepareError::InfoNotPermitted { .. }), "{error:?}");
        assert_eq!(
            error.to_string(),
            format!(
                "the Redis user may not run INFO at 127.0.0.1:{}, so the server's maxmemory-policy cannot be \
                 checked: grant the user +info, or vouch for noeviction with RedisConnector::vouch_for_noeviction",
                server.port()
            )
        );

        let connector = RedisConnector::new(&url).expect("a URL").vouch_for_noeviction();
        let limiter = RedisLimiter::from_connector(&connector).with_config(config("vouched"));
        limiter.prepare().await.expect("prepare without INFO");
        assert_eq!(available_after_check(&limiter, &window, 1).await, 2);
        assert!(!connector.eviction_watch_running(), "a vouched connector has no watch");
    });
}

// ---------------------------------------------------------------------------------------------
// The eviction watch

#[test]
#[ignore = "needs redis-server on PATH (starts servers of its own)"]
fn the_eviction_watch_fails_closed_while_the_server_may_evict() {
    support::runtime().block_on(async {
        let server = support::own_server(&[]).await;
        let mut direct = support::connect(&server.url()).await;
        let interval = Duration::from_millis(100);
        let connector = RedisConnector::new(&server.url())
            .expect("a URL")
            .with_eviction_watch_interval(interval)
            .expect("a valid interval");
        let limiter = RedisLimiter::from_connector(&connector).with_config(config("watch"));
        assert!(!connector.eviction_watch_running());
        limiter.prepare().await.expect("prepare");
        assert!(connector.eviction_watch_running());
        let window = fixed_window("connections.watch", 1_000_000, 3_600_000);
        let check = Check::new(subject(1).bind(&window));
        assert_eq!(available(&limiter.check(&check).await.expect("a check")), 999_999);

        let set_policy = async |direct: &mut MultiplexedConnection, policy: &str| {
            let () = redis::cmd("CONFIG")
                .arg("SET")
                .arg("maxmemory-policy")
                .arg(policy)
                .query_async(direct)
                .await
                .expect("CONFIG SET maxmemory-policy");
            Instant::now()
        };
        let changed = set_policy(&mut direct, "allkeys-lru").await;
        // Admissions go on until the next reading, then fail closed without being sent.
        let mut admitted = 0u64;
        let error = loop {
            match limiter.check(&check).await {
                Ok(_) => admitted += 1,
                Err(error) => break error,
            }
            assert!(changed.elapsed() < Duration::from_secs(10), "the watch never tripped");
        };
        let noticed = changed.elapsed();
        println!("eviction watch: {admitted} admissions in {noticed:?} passed before it tripped (interval {interval:?})");
        let address = format!("127.0.0.1:{}", server.port());
        assert!(matches!(&error, CheckError::EvictingServer { address: at, policy } if *at == address && policy == "allkeys-lru"), "{error:?}");
        assert_eq!(error.consumption(), ConsumptionStatus::NotConsumed);
        assert_eq!(
            error.to_string(),
            format!(
                "Redis at {address} has maxmemory-policy allkeys-lru, which would evict quota state: refusing every \
                 operation until it is noeviction"
            )
        );
        assert_eq!(connector.evicting_server(), Some((address.clone(), "allkeys-lru".to_owned())));
        // Every limiter of the connector, every operation, and nothing reaches the server.
        let other = RedisGcraLimiter::from_connector(&connector).with_config(config("watch-gcra"));
        let rate = gcra("connections.watch-gcra", 5, 60_000, 5);
        let error = other.check(&Check::new(subject(1).bind(&rate))).await.expect_err("fail closed");
        assert!(matches!(error, CheckError::EvictingServer { .. }), "{error:?}");
        assert!(limiter.peek(subject(1).bind(&window)).await.is_err());
        let error = limiter.prepare().await.expect_err("an evicting server");
        assert!(matches!(error, PrepareError::EvictionPolicy { .. }), "{error:?}");

        let changed = set_policy(&mut direct, "noeviction").await;
        let decision = loop {
            if let Ok(decision) = limiter.check(&check).await {
                break decision;
            }
            assert!(changed.elapsed() < Duration::from_secs(10), "the watch never lifted");
            tokio::time::sleep(Duration::from_millis(5)).await;
        };
        // Nothing was consumed while it failed closed: the count goes on from the admissions
        // that passed.
        assert_eq!(available(&decision), 999_999 - admitted - 1);
        assert_eq!(connector.evicting_server(), None);
        assert!(connector.eviction_watch_rounds() >= 2);

        // Turned off, the watch stops at its next interval and a policy change goes unnoticed.
        let connector = connector.without_eviction_watch();
        tokio::time::sleep(interval * 3).await;
        assert!(!connector.eviction_watch_running());
        set_policy(&mut direct, "allkeys-lru").await;
        tokio::time::sleep(interval * 3).await;
        assert_eq!(available(&limiter.check(&check).await.expect("unwatched")), 999_999 - admitted - 2);
        set_policy(&mut direct, "noeviction").await;
    });
}

#[test]
fn eviction_watch_intervals_are_bounded() {
    let connector = RedisConnector::new("redis://127.0.0.1:6379").expect("a URL");
    for interval in [Duration::ZERO, Duration::from_millis(9), Duration::from_secs(3_601)] {
        let error = connector.clone().with_eviction_watch_interval(interval).expect_err("out of range");
        assert_eq!(
            error.to_string(),
            format!("eviction watch interval {interval:?} is outside 10 ms to 1 hour")
        );
    }
    assert!(connector.with_eviction_watch_interval(Duration::from_millis(10)).is_ok());
}
