//! Fault injection on both Redis limiters, against real servers: every failure is classified by
//! whether quota may have been consumed, and the stored state afterwards shows that the
//! classification was honest.
//!
//! Connection faults go through a loopback TCP proxy written here ([`Proxy`]) that can refuse
//! or hold new connections, cut every connection, and hold back or drop the server's replies.
//! Server faults (`SCRIPT FLUSH`, eviction policies, `maxmemory`, a read-only replica) use a
//! `redis-server` each test starts for itself ([`support::own_server`]); nothing here flushes
//! or reconfigures the shared server named by `RUNLIMIT_REDIS_TEST_URL`, where tests work under
//! key prefixes of their own and delete them when they pass. Run with
//!
//! ```text
//! RUNLIMIT_REDIS_TEST_URL=redis://127.0.0.1:6379 \
//!     cargo test -p runlimit-redis --test redis faults:: -- --include-ignored
//! ```

use crate::support;

use std::{
    collections::BTreeMap,
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicU64, AtomicUsize, Ordering},
    },
    time::Duration,
};

use redis::{AsyncCommands, ConnectionAddr, IntoConnectionInfo, aio::MultiplexedConnection};
use runlimit_conformance::support::{check, fixed_window, gcra};
use runlimit_core::{
    Allowance, BatchDecision, Capacity, Check, ConsumptionStatus, Decision, Delay, FixedWindowPolicy,
    QuotaSnapshot, RateLimitPolicy, SubjectKey,
};
use runlimit_redis::{
    BatchCheckError, CheckError, KeyPrefix, Placement, PrepareError, RedisConfig, RedisGcraLimiter,
    RedisLimiter,
};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
    sync::watch,
    task::JoinHandle,
    time::Instant,
};

const FW: &str = "fw";
const GCRA: &str = "gcra";
/// How far ahead of the server's clock a test pins its limiter's time (about 11.6 days), so
/// windows and deadlines are exact.
const AHEAD_MILLIS: u64 = 1_000_000_000;
/// How long any polled condition may take before the test fails.
const PATIENCE: Duration = Duration::from_secs(10);
/// The short timeouts the timeout tests configure.
const SHORT: Duration = Duration::from_millis(200);

// ---------------------------------------------------------------------------------------------
// The proxy
// ---------------------------------------------------------------------------------------------

/// What the proxy does with a new client connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Accepting {
    /// Connects it to the server and forwards bytes both ways.
    Forward,
    /// Closes it at once (the client's handshake fails).
    Close,
    /// Keeps it open without reading or answering (the client's handshake never completes)
    /// until the mode changes or connections are cut.
    Hold,
}

/// What the proxy does with bytes from the server to the client (client-to-server bytes are
/// always forwarded at once).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Replies {
    /// Forwards them.
    Forward,
    /// Holds them back until the mode changes.
    Hold,
    /// Drops them and closes the connection (both sides): the request reached the server,
    /// its reply never reaches the client.
    DropAndCut,
}

/// What went through the proxy, in bytes, and how many connections it forwards now.
#[derive(Debug, Default)]
struct Traffic {
    open: AtomicUsize,
    to_server: AtomicU64,
    from_server: AtomicU64,
    dropped: AtomicU64,
}

impl Traffic {
    fn sent(&self) -> u64 {
        self.to_server.load(Ordering::SeqCst)
    }

    fn received(&self) -> u64 {
        self.from_server.load(Ordering::SeqCst)
    }

    fn dropped_bytes(&self) -> u64 {
        self.dropped.load(Ordering::SeqCst)
    }
}

/// Decrements the open-connection count when a forwarding task ends.
struct Open(Arc<Traffic>);

impl Drop for Open {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A loopback TCP proxy in front of a Redis server, controlled by the test.
struct Proxy {
    address: SocketAddr,
    accepting: watch::Sender<Accepting>,
    replies: watch::Sender<Replies>,
    /// The cut generation: every connection accepted under an older generation is closed.
    cuts: watch::Sender<u64>,
    traffic: Arc<Traffic>,
    task: JoinHandle<()>,
}

impl Proxy {
    /// A proxy on 127.0.0.1 (a free port) forwarding to the server of `url`.
    async fn start(url: &str) -> Self {
        let info = url.into_connection_info().expect("a Redis URL");
        let ConnectionAddr::Tcp(host, port) = info.addr().clone() else {
            panic!("the test server's URL must name a TCP address: {url}")
        };
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind the proxy");
        let address = listener.local_addr().expect("the proxy's address");
        let (accepting, _) = watch::channel(Accepting::Forward);
        let (replies, _) = watch::channel(Replies::Forward);
        let (cuts, _) = watch::channel(0u64);
        let traffic = Arc::new(Traffic::default());
        let task = tokio::spawn(accept_loop(
            listener,
            format!("{host}:{port}"),
            accepting.subscribe(),
            replies.subscribe(),
            cuts.subscribe(),
            Arc::clone(&traffic),
        ));
        Self { address, accepting, replies, cuts, traffic, task }
    }

    /// `url` with the proxy's address in place of the server's (credentials and database
    /// kept).
    fn url(&self, url: &str) -> String {
        let (scheme, rest) = url.split_once("://").expect("a redis:// URL");
        let (authority, path) = rest.split_once('/').map_or((rest, None), |(a, p)| (a, Some(p)));
        let credentials = authority.rsplit_once('@').map(|(credentials, _)| credentials);
        let mut proxied = format!("{scheme}://");
        if let Some(credentials) = credentials {
            proxied.push_str(credentials);
            proxied.push('@');
        }
        proxied.push_str(&self.address.to_string());
        if let Some(path) = path {
            proxied.push('/');
            proxied.push_str(path);
        }
        proxied
    }

    fn accept(&self, mode: Accepting) {
        self.accepting.send_replace(mode);
    }

    fn replies(&self, mode: Replies) {
        self.replies.send_replace(mode);
    }

    /// Closes every connection and waits until the proxy forwards none.
    async fn cut_all(&self) {
        self.cuts.send_modify(|generation| *generation += 1);
        poll("the proxy to close every connection", || async {
            self.traffic.open.load(Ordering::SeqCst) == 0
        })
        .await;
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
        self.cuts.send_modify(|generation| *generation += 1);
    }
}

async fn accept_loop(
    listener: TcpListener,
    upstream: String,
    accepting: watch::Receiver<Accepting>,
    replies: watch::Receiver<Replies>,
    cuts: watch::Receiver<u64>,
    traffic: Arc<Traffic>,
) {
    loop {
        let Ok((client, _)) = listener.accept().await else { continue };
        // The generation is read before the mode: a cut sets the mode first, so a connection
        // accepted around a cut is either closed by the mode or cut by the generation.
        let generation = *cuts.borrow();
        match *accepting.borrow() {
            Accepting::Close => drop(client),
            Accepting::Hold => {
                let mut accepting = accepting.clone();
                let mut cuts = cuts.clone();
                tokio::spawn(async move {
                    let _held = client;
                    tokio::select! {
                        _ = accepting.wait_for(|mode| *mode != Accepting::Hold) => {}
                        _ = cuts.wait_for(|cut| *cut > generation) => {}
                    }
                });
            }
            Accepting::Forward => {
                traffic.open.fetch_add(1, Ordering::SeqCst);
                let open = Open(Arc::clone(&traffic));
                tokio::spawn(forward(
                    client,
                    upstream.clone(),
                    replies.clone(),
                    cuts.clone(),
                    generation,
                    open,
                ));
            }
        }
    }
}

async fn forward(
    client: TcpStream,
    upstream: String,
    mut replies: watch::Receiver<Replies>,
    mut cuts: watch::Receiver<u64>,
    generation: u64,
    open: Open,
) {
    let traffic = Arc::clone(&open.0);
    let Ok(server) = TcpStream::connect(&upstream).await else { return };
    let (_, _) = (client.set_nodelay(true), server.set_nodelay(true));
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    let up = async {
        let mut buffer = vec![0u8; 16 * 1024];
        loop {
            let n = match client_read.read(&mut buffer).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            if server_write.write_all(&buffer[..n]).await.is_err() {
                return;
            }
            traffic.to_server.fetch_add(n as u64, Ordering::SeqCst);
        }
    };
    let down = async {
        let mut buffer = vec![0u8; 16 * 1024];
        loop {
            let n = match server_read.read(&mut buffer).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            traffic.from_server.fetch_add(n as u64, Ordering::SeqCst);
            let mode = match replies.wait_for(|mode| *mode != Replies::Hold).await {
                Ok(mode) => *mode,
                Err(_) => return,
            };
            match mode {
                Replies::Forward | Replies::Hold => {
                    if client_write.write_all(&buffer[..n]).await.is_err() {
                        return;
                    }
                }
                Replies::DropAndCut => {
                    traffic.dropped.fetch_add(n as u64, Ordering::SeqCst);
                    return;
                }
            }
        }
    };
    tokio::select! {
        () = up => {}
        () = down => {}
        _ = cuts.wait_for(|cut| *cut > generation) => {}
    }
    drop(open);
}

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

/// Polls `condition` every 10 ms until it holds; fails the test after [`PATIENCE`].
async fn poll<F, Fut>(what: &str, mut condition: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + PATIENCE;
    while !condition().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Makes sure `limiter` has a live connection through `proxy` (forwarding replies) by peeking
/// at `subject`, which consumes nothing, and checks the peek's snapshot.
async fn warm(
    limiter: &RedisLimiter,
    proxy: &Proxy,
    subject: runlimit_core::PolicySubject<'_, FixedWindowPolicy>,
    expected: QuotaSnapshot,
) {
    proxy.replies(Replies::Forward);
    assert_eq!(limiter.peek(subject).await.expect("a peek"), expected);
}

/// A test's limiter keys on one server: a unique prefix, a direct connection and (for the
/// tags it pinned) the limiter's time, pinned through the shard watermarks.
struct Keys {
    direct: MultiplexedConnection,
    prefix: String,
    now: u64,
}

impl Keys {
    /// Keys under a new prefix on `url`, with time pinned for `tags` (`fw`, `gcra`).
    async fn pinned(url: &str, name: &str, tags: &[&str]) -> Self {
        let mut keys = Self::unpinned(url, name).await;
        keys.now = support::server_millis(&mut keys.direct).await + AHEAD_MILLIS;
        for tag in tags {
            support::pin(&mut keys.direct, &keys.prefix, tag, Placement::SingleSlot, keys.now).await;
        }
        keys
    }

    /// Keys under a new prefix on `url`, time not pinned (nothing written).
    async fn unpinned(url: &str, name: &str) -> Self {
        Self { direct: support::connect(url).await, prefix: support::unique_prefix(name), now: 0 }
    }

    fn config(&self) -> RedisConfig {
        RedisConfig::default().with_key_prefix(KeyPrefix::new(&self.prefix).expect("a valid prefix"))
    }

    /// The hash of `check`'s shard and its member name, per the documented layout.
    fn place<P: RateLimitPolicy>(&self, tag: &str, check: &Check<'_, P>) -> (String, Vec<u8>) {
        let subject = check.subject();
        let subject = subject.as_bytes();
        let counter = check.counter_key();
        let mut member = counter.fingerprint().as_bytes()[..8].to_vec();
        member.extend_from_slice(&subject[..16]);
        (support::shard_hash(&self.prefix, tag, subject[0]), member)
    }

    /// The expiry set of `check`'s bucket, per the documented layout.
    fn expiries<P: RateLimitPolicy>(&self, tag: &str, check: &Check<'_, P>) -> String {
        let subject = check.subject();
        let subject = subject.as_bytes();
        support::expiry_set(&self.prefix, tag, subject[0], subject[1] % 64)
    }

    /// The stored state of `check`'s subject, read directly.
    async fn stored<P: RateLimitPolicy>(&mut self, tag: &str, check: &Check<'_, P>) -> Option<String> {
        let (key, member) = self.place(tag, check);
        self.direct.hget(key, member).await.expect("HGET a stored state")
    }

    /// Writes `state` as `check`'s stored state, as a foreign writer would.
    async fn store<P: RateLimitPolicy>(&mut self, tag: &str, check: &Check<'_, P>, state: &str) {
        let (key, member) = self.place(tag, check);
        let () = self.direct.hset(key, member, state).await.expect("HSET a stored state");
    }

    /// The fields `w`, `n` and `e` of `shard`'s hash that are set, read directly.
    async fn meta(&mut self, tag: &str, shard: u8) -> BTreeMap<String, String> {
        let key = support::shard_hash(&self.prefix, tag, shard);
        let values: Vec<Option<String>> = redis::cmd("HMGET")
            .arg(key)
            .arg(&["w", "n", "e"][..])
            .query_async(&mut self.direct)
            .await
            .expect("HMGET");
        ["w", "n", "e"]
            .into_iter()
            .zip(values)
            .filter_map(|(field, value)| Some((field.to_owned(), value?)))
            .collect()
    }

    /// The watermark and entry count of `shard` (fields `w` and `n` of its hash).
    async fn counts(&mut self, tag: &str, shard: u8) -> (Option<u64>, Option<u64>) {
        let key = support::shard_hash(&self.prefix, tag, shard);
        let (w, n): (Option<u64>, Option<u64>) = redis::cmd("HMGET")
            .arg(key)
            .arg("w")
            .arg("n")
            .query_async(&mut self.direct)
            .await
            .expect("HMGET");
        (w, n)
    }

    /// Every key under the prefix.
    async fn all(&mut self) -> Vec<String> {
        support::keys_under(&mut self.direct, &self.prefix).await
    }

    /// Deletes every key under the prefix.
    async fn finish(mut self) {
        support::delete_prefix(&mut self.direct, &self.prefix).await;
    }
}

/// An allowed fixed-window decision of `limit` with `available` left, replenished after
/// `millis`.
fn allowed(limit: u64, available: u64, millis: u64) -> Decision {
    Decision::allowed(allowance(limit, available, millis))
}

fn allowance(limit: u64, available: u64, millis: u64) -> Allowance {
    Allowance::new(Capacity::new(limit).expect("a valid capacity"), available, Delay::from_millis(millis))
        .expect("a valid allowance")
}

fn full(limit: u64) -> QuotaSnapshot {
    QuotaSnapshot::full(Capacity::new(limit).expect("a valid capacity"))
}

/// A fixed-window snapshot: `available` of `limit` left until the window ends in `millis`.
fn window_snapshot(limit: u64, available: u64, millis: u64) -> QuotaSnapshot {
    let delay = Delay::from_millis(millis);
    QuotaSnapshot::new(Capacity::new(limit).expect("a valid capacity"), available, Some(delay), delay)
        .expect("a valid snapshot")
}

/// Subject `n` in `shard` (its second byte, and so its bucket, from `n`).
fn subject(shard: u8, n: u64) -> SubjectKey {
    support::subject_in(shard, n)
}

/// The `(calls, rejected_calls, failed_calls)` of `command` in `INFO commandstats` (zeros
/// when it has not run since the last `CONFIG RESETSTAT`).
async fn command_stats(direct: &mut MultiplexedConnection, command: &str) -> (u64, u64, u64) {
    let info: String = redis::cmd("INFO").arg("commandstats").query_async(direct).await.expect("INFO");
    let prefix = format!("cmdstat_{command}:");
    let Some(line) = info.lines().find_map(|line| line.strip_prefix(prefix.as_str())) else {
        return (0, 0, 0);
    };
    let field = |name: &str| {
        line.split(',')
            .find_map(|part| part.strip_prefix(name)?.strip_prefix('='))
            .and_then(|value| value.parse().ok())
            .unwrap_or_else(|| panic!("{name} in {line}"))
    };
    (field("calls"), field("rejected_calls"), field("failed_calls"))
}

/// Asserts `error` is `CheckError::Server` with `code` and the server's `detail`, not
/// consumed, and shows only the code.
#[track_caller]
fn assert_server_error(error: &CheckError, expected_code: &str, expected_detail: &str) {
    let CheckError::Server { code, source } = error else { panic!("expected Server, got {error:?}") };
    assert_eq!(code, expected_code);
    assert_eq!(source.code(), Some(expected_code));
    // A script's own error carries the server's " script: <sha>, on @user_script:<line>." suffix.
    let detail = source.detail().expect("an error detail");
    assert_eq!(detail.split_once(" script: ").map_or(detail, |(detail, _)| detail), expected_detail);
    assert_eq!(error.consumption(), ConsumptionStatus::NotConsumed);
    assert_eq!(error.to_string(), format!("Redis refused the operation with {expected_code}"));
}

/// A `Connect` error naming `address`, not consumed.
#[track_caller]
fn assert_connect(error: &CheckError, address: &str) {
    let CheckError::Connect { address: tried, .. } = error else { panic!("expected Connect, got {error:?}") };
    assert_eq!(tried, address);
    assert_eq!(error.consumption(), ConsumptionStatus::NotConsumed);
    let message = error.to_string();
    let cause = message.strip_prefix(&format!("could not connect to Redis at {address}: "));
    assert!(cause.is_some_and(|cause| !cause.is_empty()), "{message}");
}

#[track_caller]
fn assert_connection(error: &CheckError) {
    assert!(matches!(error, CheckError::Connection { .. }), "expected Connection, got {error:?}");
    assert_eq!(error.consumption(), ConsumptionStatus::MayHaveBeenConsumed);
    assert_eq!(error.to_string(), "the Redis connection failed after the request was sent");
}

#[track_caller]
fn batch_cause(error: &BatchCheckError) -> &CheckError {
    match error {
        BatchCheckError::Check(cause) => {
            assert_eq!(error.consumption(), cause.consumption());
            assert_eq!(error.to_string(), cause.to_string());
            cause
        }
        other => panic!("expected a check failure, got {other:?}"),
    }
}

// ---------------------------------------------------------------------------------------------
// Connection faults, through the proxy, on the shared server
// ---------------------------------------------------------------------------------------------

/// A connection cut before the request is written (the proxy closes every connection and
/// refuses new ones) fails with `Connect` once the limiter has noticed, `NotConsumed`, and
/// changes nothing; a connection whose handshake never completes fails with `ConnectTimeout`
/// after the connect timeout, `NotConsumed`. When the proxy accepts again, the next check
/// succeeds and counts exactly one more.
#[test]
#[ignore = "needs RUNLIMIT_REDIS_TEST_URL"]
fn a_connection_cut_before_the_request_is_written_consumes_nothing() {
    support::runtime().block_on(async {
        let url = support::server_url();
        let mut keys = Keys::pinned(&url, "faults-cut-before", &[FW]).await;
        let proxy = Proxy::start(&url).await;
        let limiter = RedisLimiter::new(&proxy.url(&url)).expect("a valid URL").with_config(keys.config());
        limiter.prepare().await.expect("prepare through the proxy");
        let policy = fixed_window("faults.cut-before", 10, 60_000);
        let (shard, other_shard) = (0x42, 0x43);
        let one = check(&policy, subject(shard, 1));
        let two = check(&policy, subject(other_shard, 2));
        for available in [9, 8, 7] {
            assert_eq!(limiter.check(&one).await.expect("a check"), allowed(10, available, 60_000));
        }
        let deadline = keys.now + 60_000;
        assert_eq!(keys.stored(FW, &one).await, Some(format!("{deadline}:3")));
        assert_eq!(keys.counts(FW, shard).await, (Some(keys.now), Some(1)));
        let before = (keys.meta(FW, shard).await, keys.meta(FW, other_shard).await);

        proxy.accept(Accepting::Close);
        proxy.cut_all().await;
        let sent = proxy.traffic.sent();
        // Wait until the limiter has noticed the closed connection; a peek consumes nothing,
        // and until the driver has seen the close it may still fail after sending.
        poll("the limiter to notice the cut", || async {
            match limiter.peek(one.subject().bind(&policy)).await {
                Err(CheckError::Connect { .. }) => true,
                Err(CheckError::Connection { .. }) => false,
                other => panic!("a peek through a closed proxy: {other:?}"),
            }
        })
        .await;

        let error = limiter.check(&one).await.expect_err("no connection");
        assert_connect(&error, &limiter.address());
        let error = limiter.check_all(&[one, two]).await.expect_err("no connection");
        assert_connect(batch_cause(&error), &limiter.address());

        // A connection that opens but never completes its handshake: the connect timeout.
        proxy.accept(Accepting::Hold);
        let impatient =
            limiter.clone().with_config(keys.config().with_connect_timeout(SHORT).expect("valid"));
        let error = impatient.check(&one).await.expect_err("no handshake");
        assert!(matches!(error, CheckError::ConnectTimeout { timeout, .. } if timeout == SHORT), "{error:?}");
        assert_eq!(error.consumption(), ConsumptionStatus::NotConsumed);
        assert_eq!(
            error.to_string(),
            format!("timed out after 200ms connecting to Redis at {}", limiter.address())
        );
        let error = impatient.check_all(&[one, two]).await.expect_err("no handshake");
        assert!(
            matches!(batch_cause(&error), CheckError::ConnectTimeout { timeout, .. } if *timeout == SHORT)
        );

        // Nothing reached the server and nothing changed.
        assert_eq!(proxy.traffic.sent(), sent);
        assert_eq!(keys.stored(FW, &one).await, Some(format!("{deadline}:3")));
        assert_eq!(keys.stored(FW, &two).await, None);
        assert_eq!((keys.meta(FW, shard).await, keys.meta(FW, other_shard).await), before);

        // Accepting again: exactly one more.
        proxy.accept(Accepting::Forward);
        assert_eq!(limiter.check(&one).await.expect("a check after recovery"), allowed(10, 6, 60_000));
        assert_eq!(keys.stored(FW, &one).await, Some(format!("{deadline}:4")));
        assert_eq!(keys.stored(FW, &two).await, None);
        assert_eq!(keys.counts(FW, shard).await, (Some(keys.now), Some(1)));
        assert_eq!(
            limiter.peek(one.subject().bind(&policy)).await.expect("a peek"),
            window_snapshot(10, 6, 60_000)
        );
        keys.finish().await;
    });
}

/// A connection cut after the request was written (the proxy forwards the request, then
/// drops the reply and closes the connection) fails with `Connection`, `MayHaveBeenConsumed`,
/// and the state shows the script did run: the status is honest. The same for a batch (both
/// checks counted) and a reset (`may_have_removed_entries`, and the state is gone).
#[test]
#[ignore = "needs RUNLIMIT_REDIS_TEST_URL"]
fn b_connection_cut_after_the_request_is_written_may_have_consumed() {
    support::runtime().block_on(async {
        let url = support::server_url();
        let mut keys = Keys::pinned(&url, "faults-cut-after", &[FW]).await;
        let proxy = Proxy::start(&url).await;
        let limiter = RedisLimiter::new(&proxy.url(&url)).expect("a valid URL").with_config(keys.config());
        limiter.prepare().await.expect("prepare through the proxy");
        let policy = fixed_window("faults.cut-after", 10, 60_000);
        let shard = 0x5a;
        let one = check(&policy, subject(shard, 1));
        let two = check(&policy, subject(shard, 2));
        let deadline = keys.now + 60_000;
        assert_eq!(limiter.check(&one).await.expect("a check"), allowed(10, 9, 60_000));

        // Each fault needs a live connection first: a new connection's handshake replies would
        // be dropped too, which fails the connect (nothing sent) instead.
        warm(&limiter, &proxy, one.subject().bind(&policy), window_snapshot(10, 9, 60_000)).await;
        proxy.replies(Replies::DropAndCut);
        let error = limiter.check(&one).await.expect_err("the reply is dropped");
        assert_connection(&error);
        assert!(proxy.traffic.dropped_bytes() > 0, "the server replied, so the script ran");
        assert_eq!(keys.stored(FW, &one).await, Some(format!("{deadline}:2")));
        assert_eq!(keys.counts(FW, shard).await, (Some(keys.now), Some(1)));

        warm(&limiter, &proxy, one.subject().bind(&policy), window_snapshot(10, 8, 60_000)).await;
        proxy.replies(Replies::DropAndCut);
        let dropped = proxy.traffic.dropped_bytes();
        let error = limiter.check_all(&[one, two]).await.expect_err("the reply is dropped");
        assert_connection(batch_cause(&error));
        assert!(proxy.traffic.dropped_bytes() > dropped);
        assert_eq!(keys.stored(FW, &one).await, Some(format!("{deadline}:3")));
        assert_eq!(keys.stored(FW, &two).await, Some(format!("{deadline}:1")));
        assert_eq!(keys.counts(FW, shard).await, (Some(keys.now), Some(2)));

        warm(&limiter, &proxy, one.subject().bind(&policy), window_snapshot(10, 7, 60_000)).await;
        proxy.replies(Replies::DropAndCut);
        let error = limiter.reset(one.subject().bind(&policy)).await.expect_err("the reply is dropped");
        assert_connection(error.cause());
        assert!(error.may_have_removed_entries());
        assert_eq!(error.removed_before_failure(), 0);
        assert_eq!(error.to_string(), "Redis maintenance failed");
        assert_eq!(keys.stored(FW, &one).await, None);
        assert_eq!(keys.counts(FW, shard).await, (Some(keys.now), Some(1)));

        proxy.replies(Replies::Forward);
        assert_eq!(limiter.check(&one).await.expect("a check after recovery"), allowed(10, 9, 60_000));
        assert_eq!(limiter.check(&two).await.expect("a check after recovery"), allowed(10, 8, 60_000));
        assert_eq!(keys.stored(FW, &one).await, Some(format!("{deadline}:1")));
        assert_eq!(keys.stored(FW, &two).await, Some(format!("{deadline}:2")));
        assert_eq!(keys.counts(FW, shard).await, (Some(keys.now), Some(2)));
        keys.finish().await;
    });
}

/// A reply slower than the operation timeout (the proxy holds the server's reply back) fails
/// with `Timeout { timeout }`, `MayHaveBeenConsumed`, and the script did run; the connection
/// is replaced, so the next check succeeds and counts exactly one more.
#[test]
#[ignore = "needs RUNLIMIT_REDIS_TEST_URL"]
fn c_a_reply_slower_than_the_operation_timeout_may_have_consumed() {
    support::runtime().block_on(async {
        let url = support::server_url();
        let mut keys = Keys::pinned(&url, "faults-slow-reply", &[FW]).await;
        let proxy = Proxy::start(&url).await;
        let config = keys
            .config()
            .with_operation_timeout(SHORT)
            .and_then(|config| config.with_connect_timeout(SHORT))
            .expect("valid timeouts");
        let limiter = RedisLimiter::new(&proxy.url(&url)).expect("a valid URL").with_config(config);
        limiter.prepare().await.expect("prepare through the proxy");
        let policy = fixed_window("faults.slow-reply", 10, 60_000);
        let shard = 0x07;
        let one = check(&policy, subject(shard, 1));
        let deadline = keys.now + 60_000;
        assert_eq!(limiter.check(&one).await.expect("a check"), allowed(10, 9, 60_000));

        proxy.replies(Replies::Hold);
        let replied = proxy.traffic.received();
        let started = Instant::now();
        let error = limiter.check(&one).await.expect_err("the reply is held back");
        assert!(started.elapsed() >= SHORT);
        assert!(matches!(error, CheckError::Timeout { timeout } if timeout == SHORT), "{error:?}");
        assert_eq!(error.consumption(), ConsumptionStatus::MayHaveBeenConsumed);
        assert_eq!(error.to_string(), "timed out after 200ms waiting for Redis after the request was sent");
        // The server's reply reached the proxy: the script ran.
        poll("the server's reply", || async { proxy.traffic.received() > replied }).await;
        assert_eq!(keys.stored(FW, &one).await, Some(format!("{deadline}:2")));
        assert_eq!(keys.counts(FW, shard).await, (Some(keys.now), Some(1)));

        // The timed-out connection was replaced: the new one's handshake reply is held back
        // too, so this batch never gets a connection and sends nothing.
        let error = limiter.check_all(&[one]).await.expect_err("the handshake reply is held back");
        assert!(
            matches!(batch_cause(&error), CheckError::ConnectTimeout { timeout, .. } if *timeout == SHORT)
        );
        assert_eq!(error.consumption(), ConsumptionStatus::NotConsumed);
        assert_eq!(keys.stored(FW, &one).await, Some(format!("{deadline}:2")));

        // A batch on a live connection whose reply is held back.
        warm(&limiter, &proxy, one.subject().bind(&policy), window_snapshot(10, 8, 60_000)).await;
        proxy.replies(Replies::Hold);
        let replied = proxy.traffic.received();
        let error = limiter.check_all(&[one]).await.expect_err("the reply is held back");
        assert!(matches!(batch_cause(&error), CheckError::Timeout { timeout } if *timeout == SHORT));
        assert_eq!(error.consumption(), ConsumptionStatus::MayHaveBeenConsumed);
        poll("the server's reply", || async { proxy.traffic.received() > replied }).await;
        assert_eq!(keys.stored(FW, &one).await, Some(format!("{deadline}:3")));

        proxy.replies(Replies::Forward);
        assert_eq!(limiter.check(&one).await.expect("a check after recovery"), allowed(10, 6, 60_000));
        assert_eq!(keys.stored(FW, &one).await, Some(format!("{deadline}:4")));
        assert_eq!(keys.counts(FW, shard).await, (Some(keys.now), Some(1)));
        keys.finish().await;
    });
}

/// A limiter whose server does not listen: every operation fails with `Connect`,
/// `NotConsumed`, and `prepare` with `Unreachable`.
#[test]
#[ignore = "needs RUNLIMIT_REDIS_TEST_URL"]
fn nothing_listening_is_connect_and_not_consumed() {
    support::runtime().block_on(async {
        let port = support::free_port();
        let address = format!("127.0.0.1:{port}");
        let limiter = RedisLimiter::new(&format!("redis://:a-password@127.0.0.1:{port}"))
            .expect("a valid URL")
            .with_config(RedisConfig::default().with_key_prefix(KeyPrefix::new("unused").expect("valid")));
        let policy = fixed_window("faults.nothing-listening", 10, 60_000);
        let one = check(&policy, subject(1, 1));
        let error = limiter.check(&one).await.expect_err("nothing listens");
        assert_connect(&error, &address);
        // The address and the cause, never the password.
        assert_eq!(
            error.to_string(),
            format!("could not connect to Redis at {address}: Connection refused (os error 111)")
        );
        assert!(!format!("{error:?}").contains("a-password"));
        assert_connect(batch_cause(&limiter.check_all(&[one]).await.expect_err("nothing listens")), &address);
        assert_connect(&limiter.peek(one.subject().bind(&policy)).await.expect_err("nothing listens"), &address);
        let error = limiter.reset(one.subject().bind(&policy)).await.expect_err("nothing listens");
        assert_connect(error.cause(), &address);
        assert!(!error.may_have_removed_entries());
        let error = limiter.prepare().await.expect_err("nothing listens");
        assert_eq!(
            error.to_string(),
            format!(
                "could not prepare the Redis server: could not connect to Redis at {address}: Connection refused \
                 (os error 111)"
            )
        );
        let PrepareError::Unreachable(cause) = &error else { panic!("expected Unreachable, got {error:?}") };
        assert_connect(cause, &address);
    });
}

// ---------------------------------------------------------------------------------------------
// Server faults, on servers of the tests' own
// ---------------------------------------------------------------------------------------------

/// `SCRIPT FLUSH` between checks: the next check gets `NOSCRIPT`, loads the script once,
/// resends once and consumes exactly once; the same for a batch, a peek and a reset.
#[test]
#[ignore = "needs RUNLIMIT_REDIS_TEST_URL"]
fn script_flush_between_checks_reloads_once_and_consumes_once() {
    support::runtime().block_on(async {
        let server = support::own_server(&[]).await;
        let url = server.url();
        let mut keys = Keys::pinned(&url, "faults-script-flush", &[FW]).await;
        let limiter = RedisLimiter::new(&url).expect("a valid URL").with_config(keys.config());
        limiter.prepare().await.expect("prepare");
        let policy = fixed_window("faults.script-flush", 10, 60_000);
        let shard = 0x99;
        let one = check(&policy, subject(shard, 1));
        let two = check(&policy, subject(shard, 2));
        let deadline = keys.now + 60_000;
        assert_eq!(limiter.check(&one).await.expect("a check"), allowed(10, 9, 60_000));

        let flush = async |direct: &mut MultiplexedConnection| {
            let () = redis::cmd("SCRIPT").arg("FLUSH").query_async(direct).await.expect("SCRIPT FLUSH");
            let () = redis::cmd("CONFIG").arg("RESETSTAT").query_async(direct).await.expect("RESETSTAT");
        };
        flush(&mut keys.direct).await;
        assert_eq!(limiter.check(&one).await.expect("a check after SCRIPT FLUSH"), allowed(10, 8, 60_000));
        assert_eq!(keys.stored(FW, &one).await, Some(format!("{deadline}:2")));
        // One EVALSHA refused with NOSCRIPT (failed, did not run), one SCRIPT LOAD, one
        // EVALSHA that ran.
        assert_eq!(command_stats(&mut keys.direct, "evalsha").await, (2, 0, 1));
        assert_eq!(command_stats(&mut keys.direct, "script|load").await, (1, 0, 0));

        flush(&mut keys.direct).await;
        assert_eq!(
            limiter.check_all(&[one, two]).await.expect("a batch after SCRIPT FLUSH"),
            BatchDecision::allowed(vec![allowance(10, 7, 60_000), allowance(10, 9, 60_000)]).expect("valid")
        );
        assert_eq!(keys.stored(FW, &one).await, Some(format!("{deadline}:3")));
        assert_eq!(keys.stored(FW, &two).await, Some(format!("{deadline}:1")));
        assert_eq!(command_stats(&mut keys.direct, "evalsha").await, (2, 0, 1));
        assert_eq!(command_stats(&mut keys.direct, "script|load").await, (1, 0, 0));

        flush(&mut keys.direct).await;
        assert_eq!(
            limiter.peek(one.subject().bind(&policy)).await.expect("a peek after SCRIPT FLUSH"),
            window_snapshot(10, 7, 60_000)
        );
        assert_eq!(command_stats(&mut keys.direct, "evalsha").await, (2, 0, 1));

        flush(&mut keys.direct).await;
        assert!(limiter.reset(two.subject().bind(&policy)).await.expect("a reset after SCRIPT FLUSH"));
        assert_eq!(command_stats(&mut keys.direct, "evalsha").await, (2, 0, 1));
        assert_eq!(keys.stored(FW, &two).await, None);
        assert_eq!(keys.stored(FW, &one).await, Some(format!("{deadline}:3")));
        assert_eq!(keys.counts(FW, shard).await, (Some(keys.now), Some(1)));
    });
}

/// `prepare` refuses a server that may evict keys, naming its policy exactly, and accepts it
/// once it is `noeviction`; a refused `prepare` writes nothing.
#[test]
#[ignore = "needs RUNLIMIT_REDIS_TEST_URL"]
fn prepare_refuses_eviction_policies() {
    support::runtime().block_on(async {
        let server = support::own_server(&["--maxmemory", "64mb", "--maxmemory-policy", "allkeys-lru"]).await;
        let url = server.url();
        let mut direct = support::connect(&url).await;
        let limiter = RedisLimiter::new(&url).expect("a valid URL");
        let gcra_limiter = RedisGcraLimiter::new(&url).expect("a valid URL");
        for policy in ["allkeys-lru", "volatile-lru", "allkeys-lfu", "volatile-ttl", "allkeys-random"] {
            let () = redis::cmd("CONFIG")
                .arg("SET")
                .arg("maxmemory-policy")
                .arg(policy)
                .query_async(&mut direct)
                .await
                .expect("CONFIG SET maxmemory-policy");
            for error in [
                limiter.prepare().await.expect_err("an evicting server"),
                gcra_limiter.prepare().await.expect_err("an evicting server"),
            ] {
                assert!(
                    matches!(&error, PrepareError::EvictionPolicy { policy: reported, .. } if reported == policy),
                    "{error:?}"
                );
                assert_eq!(
                    error.to_string(),
                    format!(
                        "Redis at 127.0.0.1:{} has maxmemory-policy {policy}: Runlimit needs noeviction, so no quota \
                         state is ever evicted (CONFIG SET maxmemory-policy noeviction)",
                        server.port()
                    )
                );
            }
        }
        let scripts: Vec<u64> =
            redis::cmd("INFO").arg("memory").query_async::<String>(&mut direct).await.map_or_else(
                |error| panic!("INFO: {error}"),
                |info| {
                    info.lines()
                        .filter_map(|line| line.strip_prefix("number_of_cached_scripts:"))
                        .filter_map(|count| count.trim().parse().ok())
                        .collect()
                },
            );
        assert_eq!(scripts, vec![0], "a refused prepare loads no script");
        let size: u64 = redis::cmd("DBSIZE").query_async(&mut direct).await.expect("DBSIZE");
        assert_eq!(size, 0);

        let () = redis::cmd("CONFIG")
            .arg("SET")
            .arg("maxmemory-policy")
            .arg("noeviction")
            .query_async(&mut direct)
            .await
            .expect("CONFIG SET maxmemory-policy");
        limiter.prepare().await.expect("a noeviction server");
        gcra_limiter.prepare().await.expect("a noeviction server");
        let size: u64 = redis::cmd("DBSIZE").query_async(&mut direct).await.expect("DBSIZE");
        assert_eq!(size, 0, "prepare writes no key");
    });
}

/// Over `maxmemory` with `noeviction`, the server refuses admission scripts before they run:
/// `Server { code: "OOM" }`, `NotConsumed`, for single checks, batches and resets alike, and
/// nothing is written (no partial batch); read-only peeks still work. Once memory is raised,
/// every subject still has its full quota and the first check counts one.
#[test]
#[ignore = "needs RUNLIMIT_REDIS_TEST_URL"]
fn out_of_memory_refuses_admissions_before_they_run() {
    support::runtime().block_on(async {
        let server = support::own_server(&["--maxmemory", "2mb", "--maxmemory-policy", "noeviction"]).await;
        let url = server.url();
        let mut keys = Keys::unpinned(&url, "faults-oom").await;
        let limiter = RedisLimiter::new(&url).expect("a valid URL").with_config(keys.config());
        let gcra_limiter = RedisGcraLimiter::new(&url).expect("a valid URL").with_config(keys.config());
        limiter.prepare().await.expect("prepare");
        gcra_limiter.prepare().await.expect("prepare");

        // Fill memory with junk until the server refuses a write.
        let mut junk = 0;
        loop {
            assert!(junk < 64, "2 MB of maxmemory never filled");
            let reply: redis::RedisResult<u64> = redis::cmd("SETRANGE")
                .arg(format!("junk:{junk}"))
                .arg(512 * 1024 - 1)
                .arg("x")
                .query_async(&mut keys.direct)
                .await;
            match reply {
                Ok(length) => assert_eq!(length, 512 * 1024),
                Err(error) if error.code() == Some("OOM") => break,
                Err(error) => panic!("SETRANGE: {error}"),
            }
            junk += 1;
        }

        let oom = "command not allowed when used memory > 'maxmemory'.";
        let policy = fixed_window("faults.oom", 10, 60_000);
        let gcra_policy = gcra("faults.oom-gcra", 10, 1_000, 10);
        let one = check(&policy, subject(0x10, 1));
        let two = check(&policy, subject(0x11, 2));
        let three = check(&policy, subject(0x10, 3));
        let paced = check(&gcra_policy, subject(0x12, 4));
        assert_server_error(&limiter.check(&one).await.expect_err("out of memory"), "OOM", oom);
        let error = limiter.check_all(&[one, two, three]).await.expect_err("out of memory");
        assert_server_error(batch_cause(&error), "OOM", oom);
        assert_server_error(&gcra_limiter.check(&paced).await.expect_err("out of memory"), "OOM", oom);
        let error = limiter.reset(one.subject().bind(&policy)).await.expect_err("out of memory");
        assert_server_error(error.cause(), "OOM", oom);
        assert!(!error.may_have_removed_entries());
        // A peek is a read-only script: the server runs it.
        assert_eq!(limiter.peek(one.subject().bind(&policy)).await.expect("a read-only peek"), full(10));

        let () = redis::cmd("CONFIG")
            .arg("SET")
            .arg("maxmemory")
            .arg("0")
            .query_async(&mut keys.direct)
            .await
            .expect("CONFIG SET maxmemory");
        assert_eq!(keys.all().await, Vec::<String>::new(), "the refused admissions wrote nothing");
        for check in [one, two, three] {
            assert_eq!(limiter.peek(check.subject().bind(&policy)).await.expect("a peek"), full(10));
        }
        assert_eq!(gcra_limiter.peek(paced.subject().bind(&gcra_policy)).await.expect("a peek"), full(10));
        let decision = limiter.check(&one).await.expect("a check with memory");
        let deadline = keys.stored(FW, &one).await.expect("the check stored its window");
        let (deadline, used) = deadline.split_once(':').expect("<deadline>:<used>");
        assert_eq!(used, "1");
        let (now, entries) = keys.counts(FW, 0x10).await;
        assert_eq!(entries, Some(1));
        let now = now.expect("a watermark");
        assert_eq!(deadline.parse::<u64>().expect("a number"), now + 60_000);
        assert_eq!(decision, allowed(10, 9, 60_000));
        assert_eq!(keys.stored(FW, &two).await, None);
        assert_eq!(keys.stored(FW, &three).await, None);
    });
}

/// A read-only replica refuses admission scripts before they run (`READONLY`, `NotConsumed`)
/// and writes nothing; read-only peeks are served.
#[test]
#[ignore = "needs RUNLIMIT_REDIS_TEST_URL"]
fn a_read_only_replica_refuses_admissions_before_they_run() {
    support::runtime().block_on(async {
        // A replica of a primary that does not exist: it serves its (empty) data read-only.
        let missing_primary = support::free_port().to_string();
        let server = support::own_server(&["--replicaof", "127.0.0.1", &missing_primary]).await;
        let url = server.url();
        let mut keys = Keys::unpinned(&url, "faults-replica").await;
        let limiter = RedisLimiter::new(&url).expect("a valid URL").with_config(keys.config());
        limiter.prepare().await.expect("prepare a replica");
        let policy = fixed_window("faults.replica", 10, 60_000);
        let one = check(&policy, subject(0x20, 1));
        let two = check(&policy, subject(0x21, 2));
        let readonly = "You can't write against a read only replica.";
        assert_server_error(&limiter.check(&one).await.expect_err("a replica"), "READONLY", readonly);
        let error = limiter.check_all(&[one, two]).await.expect_err("a replica");
        assert_server_error(batch_cause(&error), "READONLY", readonly);
        assert_eq!(limiter.peek(one.subject().bind(&policy)).await.expect("a read-only peek"), full(10));
        assert_eq!(keys.all().await, Vec::<String>::new());
    });
}

// ---------------------------------------------------------------------------------------------
// Foreign writes to the documented key layout, on the shared server
// ---------------------------------------------------------------------------------------------

/// A malformed stored value (state, shard watermark, entry count, expiry bound) makes the script fail
/// before its first write: `Server { code: "RUNLIMIT" }`, `NotConsumed`, and nothing changes,
/// not even the well-formed checks of the same batch. A peek of a malformed state that the
/// peek script returns as it is fails in the client with `MalformedReply`, `NotConsumed`.
#[test]
#[ignore = "needs RUNLIMIT_REDIS_TEST_URL"]
fn malformed_stored_values_are_refused_before_any_write() {
    support::runtime().block_on(async {
        let url = support::server_url();
        let mut keys = Keys::pinned(&url, "faults-malformed", &[FW, GCRA]).await;
        let limiter = RedisLimiter::new(&url).expect("a valid URL").with_config(keys.config());
        let gcra_limiter = RedisGcraLimiter::new(&url).expect("a valid URL").with_config(keys.config());
        limiter.prepare().await.expect("prepare");
        gcra_limiter.prepare().await.expect("prepare");
        let policy = fixed_window("faults.malformed", 10, 60_000);
        let deadline = keys.now + 60_000;
        let (good_shard, bad_shard) = (0x30, 0x31);
        let good = check(&policy, subject(good_shard, 1));
        let bad = check(&policy, subject(bad_shard, 2));
        let before = (keys.meta(FW, good_shard).await, keys.meta(FW, bad_shard).await);
        assert_eq!(before.0, BTreeMap::from([("w".to_owned(), keys.now.to_string())]));

        let detail = "malformed fixed-window state";
        for state in [
            "garbage".to_owned(),
            format!("{deadline}:0"),
            "1234567890123456:1".to_owned(),
            format!("{deadline}:-1"),
        ] {
            let state = state.as_str();
            keys.store(FW, &bad, state).await;
            assert_server_error(
                &limiter.check(&bad).await.expect_err("a malformed state"),
                "RUNLIMIT",
                detail,
            );
            let error = limiter.check_all(&[good, bad]).await.expect_err("a malformed state");
            assert_server_error(batch_cause(&error), "RUNLIMIT", detail);
            assert_eq!(keys.stored(FW, &bad).await.as_deref(), Some(state));
            assert_eq!(keys.stored(FW, &good).await, None, "no partial batch");
            assert_eq!((keys.meta(FW, good_shard).await, keys.meta(FW, bad_shard).await), before);
        }
        // The peek script returns the state as it is; the client refuses it.
        let error = limiter.peek(bad.subject().bind(&policy)).await.expect_err("a malformed state");
        assert!(
            matches!(
                error,
                CheckError::MalformedReply {
                    reason: "malformed stored state",
                    consumption: ConsumptionStatus::NotConsumed
                }
            ),
            "{error:?}"
        );
        assert_eq!(error.consumption(), ConsumptionStatus::NotConsumed);
        assert_eq!(error.to_string(), "malformed Redis reply: malformed stored state");

        // A malformed watermark or entry count of the shard.
        let bad_meta = support::shard_hash(&keys.prefix, FW, bad_shard);
        let () = keys.direct.hset(&bad_meta, "w", "soon").await.expect("HSET");
        let fresh = check(&policy, subject(bad_shard, 3));
        let detail = "malformed shard watermark";
        assert_server_error(
            &limiter.check(&fresh).await.expect_err("a malformed watermark"),
            "RUNLIMIT",
            detail,
        );
        let error = limiter.check_all(&[good, fresh]).await.expect_err("a malformed watermark");
        assert_server_error(batch_cause(&error), "RUNLIMIT", detail);
        let error = limiter.peek(fresh.subject().bind(&policy)).await.expect_err("a malformed watermark");
        assert_server_error(&error, "RUNLIMIT", detail);
        let () = keys.direct.hset(&bad_meta, "w", keys.now).await.expect("HSET");
        let () = keys.direct.hset(&bad_meta, "n", "many").await.expect("HSET");
        let detail = "malformed shard entry count";
        assert_server_error(&limiter.check(&fresh).await.expect_err("a malformed count"), "RUNLIMIT", detail);
        let error = limiter.check_all(&[good, fresh]).await.expect_err("a malformed count");
        assert_server_error(batch_cause(&error), "RUNLIMIT", detail);
        let () = keys.direct.hset(&bad_meta, "n", 0).await.expect("HSET");
        let () = keys.direct.hset(&bad_meta, "e", "later").await.expect("HSET");
        let detail = "malformed shard expiry bound";
        assert_server_error(&limiter.check(&fresh).await.expect_err("a malformed bound"), "RUNLIMIT", detail);
        let error = limiter.check_all(&[good, fresh]).await.expect_err("a malformed bound");
        assert_server_error(batch_cause(&error), "RUNLIMIT", detail);
        assert_eq!(keys.stored(FW, &fresh).await, None);
        assert_eq!(keys.stored(FW, &good).await, None, "no partial batch");
        assert_eq!(keys.meta(FW, good_shard).await, before.0);

        // A GCRA remainder not below the quota.
        let gcra_policy = gcra("faults.malformed-gcra", 10, 1_000, 10);
        let tat = check(&gcra_policy, subject(good_shard, 4));
        keys.store(GCRA, &tat, &format!("{}:999999999999", keys.now)).await;
        let error = gcra_limiter.check(&tat).await.expect_err("a malformed GCRA state");
        assert_server_error(&error, "RUNLIMIT", "malformed GCRA state");
        assert_eq!(keys.stored(GCRA, &tat).await, Some(format!("{}:999999999999", keys.now)));
        assert_eq!(keys.meta(GCRA, good_shard).await, before.0);

        // The good subject was never counted anywhere: its first check is its first unit.
        assert_eq!(limiter.check(&good).await.expect("a check"), allowed(10, 9, 60_000));
        assert_eq!(keys.stored(FW, &good).await, Some(format!("{deadline}:1")));
        keys.finish().await;
    });
}

/// Layout keys the script reads before its first write (the meta hash, the bucket's state
/// hash) holding another Redis type (a foreign writer): the server's `WRONGTYPE` error reply
/// comes before any write, so `Server { code: "WRONGTYPE" }`, `NotConsumed`, is honest: nothing
/// changed.
#[test]
#[ignore = "needs RUNLIMIT_REDIS_TEST_URL"]
fn layout_keys_of_another_type_read_before_any_write_are_refused() {
    support::runtime().block_on(async {
        let url = support::server_url();
        let mut keys = Keys::pinned(&url, "faults-wrong-type-read", &[FW]).await;
        let limiter = RedisLimiter::new(&url).expect("a valid URL").with_config(keys.config());
        limiter.prepare().await.expect("prepare");
        let policy = fixed_window("faults.wrong-type-read", 10, 60_000);
        let wrong_type = "Operation against a key holding the wrong kind of value";

        // The shard's hash is a string.
        let (good_shard, states_shard, meta_shard) = (0x70, 0x71, 0x72);
        let good = check(&policy, subject(good_shard, 1));
        let one = check(&policy, subject(states_shard, 2));
        let (states, _) = keys.place(FW, &one);
        let () = keys.direct.set(&states, "not a hash").await.expect("SET");
        let before = keys.all().await;
        assert_server_error(&limiter.check(&one).await.expect_err("a string"), "WRONGTYPE", wrong_type);
        let error = limiter.check_all(&[good, one]).await.expect_err("a string");
        assert_server_error(batch_cause(&error), "WRONGTYPE", wrong_type);
        let value: String = keys.direct.get(&states).await.expect("GET");
        assert_eq!(value, "not a hash");
        assert_eq!(keys.all().await, before);
        assert_eq!(keys.stored(FW, &good).await, None, "no partial batch");

        // Another shard's hash is a string: a peek is refused too.
        let two = check(&policy, subject(meta_shard, 3));
        let meta = support::shard_hash(&keys.prefix, FW, meta_shard);
        let () = keys.direct.set(&meta, "not a hash").await.expect("SET");
        assert_server_error(&limiter.check(&two).await.expect_err("a string"), "WRONGTYPE", wrong_type);
        let error = limiter.check_all(&[good, two]).await.expect_err("a string");
        assert_server_error(batch_cause(&error), "WRONGTYPE", wrong_type);
        let error = limiter.peek(two.subject().bind(&policy)).await.expect_err("a string");
        assert_server_error(&error, "WRONGTYPE", wrong_type);
        let value: String = keys.direct.get(&meta).await.expect("GET");
        assert_eq!(value, "not a hash");
        assert_eq!(keys.all().await, before);
        keys.finish().await;
    });
}

/// Layout keys the script only writes after its first write (the bucket's expiry sorted
/// set; the shard's index while the shard's expiry bound lies ahead) holding another Redis
/// type (a foreign writer): whatever the classification, it must be honest. An admission
/// error that says `NotConsumed` must leave the subject's state unwritten, and a reset error
/// that says nothing may have been removed must leave the state in place.
#[test]
#[ignore = "needs RUNLIMIT_REDIS_TEST_URL"]
fn layout_keys_of_another_type_written_after_the_first_write_are_classified_honestly() {
    support::runtime().block_on(async {
        let url = support::server_url();
        let mut keys = Keys::pinned(&url, "faults-wrong-type-write", &[FW]).await;
        let limiter = RedisLimiter::new(&url).expect("a valid URL").with_config(keys.config());
        limiter.prepare().await.expect("prepare");
        let policy = fixed_window("faults.wrong-type-write", 10, 60_000);
        let (expiries_shard, index_shard) = (0x61, 0x62);

        // The expiry sorted set of the subject's bucket is a string.
        let one = check(&policy, subject(expiries_shard, 1));
        let expiries = keys.expiries(FW, &one);
        let () = keys.direct.set(&expiries, "not a sorted set").await.expect("SET");
        let error = limiter.check(&one).await.expect_err("a string");
        let stored = keys.stored(FW, &one).await;
        let counts = keys.counts(FW, expiries_shard).await;

        // The shard's index is a string, and an earlier check set the shard's expiry bound
        // ahead of now, so the read phase does not read the index.
        let first = check(&policy, subject(index_shard, 2));
        let second = check(&policy, subject(index_shard, 3));
        assert_eq!(limiter.check(&first).await.expect("a check"), allowed(10, 9, 60_000));
        let index = format!("{}i", support::base(&keys.prefix, FW, Placement::SingleSlot, index_shard));
        let () = keys.direct.del(&index).await.expect("DEL");
        let () = keys.direct.set(&index, "not a sorted set").await.expect("SET");
        let index_error = limiter.check(&second).await.expect_err("a string");
        let index_stored = keys.stored(FW, &second).await;
        let index_counts = keys.counts(FW, index_shard).await;

        // A reset of a stored subject whose bucket's expiry set became a string.
        let reset_shard = 0x63;
        let third = check(&policy, subject(reset_shard, 4));
        assert_eq!(limiter.check(&third).await.expect("a check"), allowed(10, 9, 60_000));
        let expiries = keys.expiries(FW, &third);
        let () = keys.direct.del(&expiries).await.expect("DEL");
        let () = keys.direct.set(&expiries, "not a sorted set").await.expect("SET");
        let reset_error = limiter.reset(third.subject().bind(&policy)).await.expect_err("a string");
        let reset_stored = keys.stored(FW, &third).await;

        // Everything needed to diagnose a failure is in the values: delete the keys first.
        keys.finish().await;
        // The read phase checks the type of every key the write phase would write without
        // reading it, so each failure happens before the first write: nothing was written.
        let runlimit =
            |error: &CheckError| matches!(error, CheckError::Server { code, .. } if code == "RUNLIMIT");
        assert!(runlimit(&error), "{error:?}");
        assert_eq!((error.consumption(), stored), (ConsumptionStatus::NotConsumed, None), "{counts:?}");
        assert!(runlimit(&index_error), "{index_error:?}");
        assert_eq!(
            (index_error.consumption(), index_stored),
            (ConsumptionStatus::NotConsumed, None),
            "{index_counts:?}"
        );
        assert!(runlimit(reset_error.cause()), "{reset_error:?}");
        assert!(!reset_error.may_have_removed_entries());
        assert!(reset_stored.is_some(), "the reset removed nothing");
    });
}
