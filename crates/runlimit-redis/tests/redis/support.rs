//! Shared by the Redis integration tests: the test server, unique key prefixes, the
//! documented key layout, pinned time and removal of a test's keys.
//!
//! Every test talks to the server named by `RUNLIMIT_REDIS_TEST_URL` (the test command starts
//! a disposable one when it is unset) under key prefixes of its own, and deletes only the keys
//! under them; no test flushes or reconfigures that server. Tests that need a server
//! configured otherwise start their own (`own_server`).

#![allow(dead_code, reason = "each test binary uses part of the support module")]

use std::{
    sync::atomic::{AtomicU64, Ordering},
    time::{SystemTime, UNIX_EPOCH},
};

use redis::{AsyncCommands, aio::MultiplexedConnection};
use runlimit_core::SubjectKey;
use runlimit_redis::Placement;

/// The test server's URL; panics with what to do when it is not set.
pub(crate) fn server_url() -> String {
    std::env::var("RUNLIMIT_REDIS_TEST_URL").unwrap_or_else(|_| {
        panic!(
            "RUNLIMIT_REDIS_TEST_URL is not set: point it at a Redis 7 server the tests may write keys to \
             (e.g. redis://127.0.0.1:6379), or run scripts/test, which starts a disposable one"
        )
    })
}

/// A direct connection to `url`, for setting up and inspecting state.
pub(crate) async fn connect(url: &str) -> MultiplexedConnection {
    try_connect(url).await.unwrap_or_else(|error| panic!("connect to {url}: {error}"))
}

/// [`connect`], returning the error instead of panicking (for servers a test expects to drop
/// connections, such as one a Sentinel is reconfiguring).
pub(crate) async fn try_connect(url: &str) -> redis::RedisResult<MultiplexedConnection> {
    // No response timeout (redis-rs' default is 500 ms): a loaded test machine may take longer
    // to answer a pipeline, and a test waits for its own set-up.
    let config = redis::AsyncConnectionConfig::new().set_response_timeout(None);
    redis::Client::open(url)?.get_multiplexed_async_connection_with_config(&config).await
}

/// FNV-1a of `text`: stable names from test names.
fn fnv(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |hash, byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// A key prefix no other test (or earlier run) uses: `rlt-<hash of name>-<pid>-<n>`.
pub(crate) fn unique_prefix(name: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
    format!(
        "rlt-{:08x}-{}-{nanos}-{}",
        fnv(name) >> 32,
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// The documented key-name base of `shard` (`tag`: `fw` or `gcra`).
pub(crate) fn base(prefix: &str, tag: &str, placement: Placement, shard: u8) -> String {
    match placement {
        Placement::SingleSlot => format!("{{{prefix}}}:{tag}1:{shard:02x}:"),
        Placement::PerShard => format!("{{{prefix}:{tag}1:{shard:02x}}}:"),
    }
}

/// The documented hash of `shard`: its entries and the fields `w`, `n`, `e`
/// ([`Placement::SingleSlot`]).
pub(crate) fn shard_hash(prefix: &str, tag: &str, shard: u8) -> String {
    format!("{}s", base(prefix, tag, Placement::SingleSlot, shard))
}

/// The documented expiry set of `bucket` in `shard` ([`Placement::SingleSlot`]).
pub(crate) fn expiry_set(prefix: &str, tag: &str, shard: u8, bucket: u8) -> String {
    format!("{}x{bucket}", base(prefix, tag, Placement::SingleSlot, shard))
}

/// The server's time in whole milliseconds.
pub(crate) async fn server_millis(connection: &mut MultiplexedConnection) -> u64 {
    let (seconds, micros): (u64, u64) = redis::cmd("TIME").query_async(connection).await.expect("TIME");
    seconds * 1_000 + micros / 1_000
}

/// Pins the time of every shard of a limiter at `millis` by setting every shard's watermark
/// (the script uses `max(TIME, watermark)`, so a watermark ahead of the server's clock is the
/// time the limiter sees).
pub(crate) async fn pin(
    connection: &mut MultiplexedConnection,
    prefix: &str,
    tag: &str,
    placement: Placement,
    millis: u64,
) {
    let mut pipe = redis::pipe();
    for shard in 0..=u8::MAX {
        pipe.hset(format!("{}s", base(prefix, tag, placement, shard)), "w", millis).ignore();
    }
    let () = pipe.query_async(connection).await.expect("pin the shard watermarks");
}

/// Deletes every key under `prefix`.
pub(crate) async fn delete_prefix(connection: &mut MultiplexedConnection, prefix: &str) {
    for pattern in [format!("{{{prefix}}}*"), format!("{{{prefix}:*")] {
        let keys: Vec<String> = {
            let mut iter: redis::AsyncIter<'_, String> =
                connection.scan_match(&pattern).await.expect("SCAN the test's keys");
            let mut keys = Vec::new();
            while let Some(key) = iter.next_item().await {
                keys.push(key.expect("a key name"));
            }
            keys
        };
        for chunk in keys.chunks(500) {
            let () = connection.del(chunk).await.expect("DEL the test's keys");
        }
    }
}

/// Every key under `prefix`.
pub(crate) async fn keys_under(connection: &mut MultiplexedConnection, prefix: &str) -> Vec<String> {
    let mut all = Vec::new();
    for pattern in [format!("{{{prefix}}}*"), format!("{{{prefix}:*")] {
        let mut iter: redis::AsyncIter<'_, String> = connection.scan_match(&pattern).await.expect("SCAN");
        while let Some(key) = iter.next_item().await {
            all.push(key.expect("a key name"));
        }
    }
    all.sort();
    all
}

/// Subject key `n` (the conformance suite's) with its first byte, the shard, set to `shard`.
pub(crate) fn subject_in(shard: u8, n: u64) -> SubjectKey {
    let mut digest = *runlimit_conformance::support::subject(n).as_bytes();
    digest[0] = shard;
    SubjectKey::from_digest(digest)
}

/// A multi-threaded runtime for one test.
pub(crate) fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime")
}

/// A `redis-server` of the test's own on a free loopback port (`--save '' --appendonly no`),
/// for tests that reconfigure, flush or fill a server: killed when dropped.
pub(crate) struct OwnServer {
    child: std::process::Child,
    port: u16,
    /// The server's working directory (`--dir`): a replica's RDB lands there, never in the
    /// test's working directory, where every later server would load it.
    _directory: tempfile::TempDir,
}

impl OwnServer {
    /// The server's URL.
    pub(crate) fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// The server's port on 127.0.0.1.
    pub(crate) fn port(&self) -> u16 {
        self.port
    }
}

impl Drop for OwnServer {
    fn drop(&mut self) {
        // Best effort: the process may already be gone.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A loopback port nothing listens on (bound to port 0, then released).
pub(crate) fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("bind a loopback port")
        .port()
}

/// Whether the server at `url` answers within a second and is the process `pid` (`INFO
/// server`'s `process_id`): another test's server may hold the port when two tests drew the
/// same free port, and this one has not exited yet.
pub(crate) async fn answers_as(url: &str, pid: u32) -> bool {
    let attempt = async {
        let mut connection = redis::Client::open(url).ok()?.get_multiplexed_async_connection().await.ok()?;
        let info: String = redis::cmd("INFO").arg("server").query_async(&mut connection).await.ok()?;
        let process =
            info.lines().find_map(|line| line.strip_prefix("process_id:"))?.trim().parse::<u32>().ok()?;
        Some(process == pid)
    };
    tokio::time::timeout(std::time::Duration::from_secs(1), attempt).await.ok().flatten().unwrap_or(false)
}

/// Starts `redis-server` on a free loopback port with `extra` arguments (such as
/// `["--maxmemory", "2mb"]`) and waits until it answers `PING` (at most 10 s per attempt; a
/// new port is tried when the server exits, e.g. because the port was taken meanwhile).
/// Panics, naming what to install, when `redis-server` is not on `PATH`.
pub(crate) async fn own_server(extra: &[&str]) -> OwnServer {
    for _attempt in 0..5 {
        let port = free_port();
        let directory = tempfile::tempdir().expect("a temporary directory");
        let mut command = std::process::Command::new("redis-server");
        command
            .args(["--port", &port.to_string(), "--save", "", "--appendonly", "no", "--bind", "127.0.0.1"])
            .arg("--dir")
            .arg(directory.path())
            .args(extra)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null());
        let child = match command.spawn() {
            Ok(child) => child,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => panic!(
                "redis-server is not on PATH: install Redis 7 (e.g. `apt-get install redis-server`) to run \
                 the tests that start a server of their own"
            ),
            Err(error) => panic!("start redis-server: {error}"),
        };
        let mut server = OwnServer { child, port, _directory: directory };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            if server.child.try_wait().expect("poll redis-server").is_some() {
                break;
            }
            if answers_as(&server.url(), server.child.id()).await {
                return server;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "redis-server on port {port} did not answer PING within 10 s"
            );
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    }
    panic!("redis-server exited before answering PING five times (arguments: {extra:?})")
}

/// A counter key's stored state (in `<base>s`) and its expiry score (`<base>x<bucket>`), read
/// through the documented layout under
/// [`Placement::SingleSlot`]: member = the first 8 bytes of the policy fingerprint and the
/// first 16 of the subject key, shard = subject byte 0, bucket = subject byte 1 modulo 64.
pub(crate) async fn stored_entry<P: runlimit_core::RateLimitPolicy>(
    connection: &mut MultiplexedConnection,
    prefix: &str,
    tag: &str,
    policy: &P,
    subject: &SubjectKey,
) -> (Option<String>, Option<f64>) {
    let subject = subject.as_bytes();
    let member = [&policy.fingerprint().as_bytes()[..8], &subject[..16]].concat();
    let bucket = subject[1] % 64;
    let state: Option<String> =
        connection.hget(shard_hash(prefix, tag, subject[0]), &member).await.expect("HGET a stored state");
    let expiry: Option<f64> = connection
        .zscore(expiry_set(prefix, tag, subject[0], bucket), &member)
        .await
        .expect("ZSCORE a stored expiry");
    (state, expiry)
}
