//! Shared by `shared_backends.rs` and `processes.rs`: the Redis and PostgreSQL servers of the
//! test run, per-test key prefixes and databases, `redis-server`s of a test's own, and
//! processes of the built `runlimit-server` binary.
//!
//! The shared servers are named by `RUNLIMIT_REDIS_TEST_URL` and
//! `RUNLIMIT_POSTGRES_TEST_DATABASE_URL` (the tests panic with what to do when one is
//! missing). Nothing here flushes or reconfigures them: a test writes Redis keys only under a
//! `--redis-key-prefix` of its own ([`unique_prefix`]), deleted by [`RedisKeys`] when it is
//! dropped, also when the test fails, and works in a PostgreSQL database of its own
//! ([`TestDatabase`]), dropped at the end of a passing test and kept for inspection when it
//! fails. Every child process (servers, `redis-server`s) is killed when its guard is dropped.
#![allow(dead_code, unreachable_pub, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::{
    io::{BufRead as _, BufReader, Read as _, Write as _},
    net::{SocketAddr, TcpStream},
    path::{Path, PathBuf},
    process::{Child, Command, ExitStatus, Stdio},
    str::FromStr as _,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
        mpsc,
    },
    thread,
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use runlimit_server::{GRPC_LISTENING_PREFIX, HTTP_LISTENING_PREFIX};
use sqlx::{
    AssertSqlSafe, ConnectOptions as _, Connection as _, PgPool,
    postgres::{PgConnectOptions, PgPoolOptions},
};

pub const REDIS_URL_VARIABLE: &str = "RUNLIMIT_REDIS_TEST_URL";
pub const DATABASE_URL_VARIABLE: &str = "RUNLIMIT_POSTGRES_TEST_DATABASE_URL";

/// The shared Redis server's URL; panics with what to do when the variable is not set.
pub fn redis_url() -> String {
    std::env::var(REDIS_URL_VARIABLE).unwrap_or_else(|_| {
        panic!(
            "{REDIS_URL_VARIABLE} is not set: point it at a Redis 7 server (maxmemory-policy noeviction) the \
             tests may write their own keys to (e.g. redis://127.0.0.1:6379), or run scripts/test, which \
             starts a disposable one"
        )
    })
}

/// The PostgreSQL admin URL; panics with what to do when the variable is not set.
pub fn admin_url() -> String {
    std::env::var(DATABASE_URL_VARIABLE).unwrap_or_else(|_| {
        panic!(
            "{DATABASE_URL_VARIABLE} is not set: name a PostgreSQL database whose role has CREATEDB (e.g. \
             postgres://postgres@127.0.0.1:5432/test), or run scripts/test, which starts a disposable server"
        )
    })
}

/// A name no other test, process or earlier run uses: `<test, at most 14 bytes>-<pid>-<n>-<ns>`
/// (at most 42 bytes: a valid `--redis-key-prefix`).
pub fn unique_name(test: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |since| since.subsec_nanos());
    let test: String = test.chars().take(14).collect();
    format!("{test}-{}-{}-{nanos}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed))
}

/// A `--redis-key-prefix` of this test's own: `rls-` and [`unique_name`].
pub fn unique_prefix(test: &str) -> String {
    let prefix = format!("rls-{}", unique_name(test));
    assert!(prefix.len() <= runlimit_server::MAX_REDIS_KEY_PREFIX_LEN, "{prefix} is too long");
    prefix
}

/// Runs `redis-cli -u url args...` and returns its stdout.
fn redis_cli(url: &str, args: &[&str]) -> String {
    let output =
        Command::new("redis-cli").arg("-u").arg(url).args(args).stdin(Stdio::null()).output().unwrap_or_else(
            |error| {
                panic!("cannot run redis-cli ({error}): install Redis 7 (e.g. apt-get install redis-server)")
            },
        );
    assert!(output.status.success(), "redis-cli {args:?}: {}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8(output.stdout).unwrap()
}

/// The keys one test writes to a Redis server: every key under its prefix (each domain's keys
/// are under `{PREFIX:<domain hash>}`), deleted when dropped, never anything else.
pub struct RedisKeys {
    url: String,
    prefix: String,
}

impl RedisKeys {
    pub fn new(url: &str, prefix: &str) -> Self {
        Self { url: url.to_owned(), prefix: prefix.to_owned() }
    }

    /// Every key under the prefix (`SCAN MATCH {PREFIX:*`, so the server is never blocked).
    pub fn all(&self) -> Vec<String> {
        let pattern = format!("{{{}:*", self.prefix);
        let mut keys: Vec<String> = redis_cli(&self.url, &["--scan", "--pattern", &pattern])
            .lines()
            .filter(|line| !line.is_empty())
            .map(str::to_owned)
            .collect();
        keys.sort();
        keys.dedup();
        keys
    }

    /// Deletes every key under the prefix; returns how many there were.
    pub fn delete(&self) -> usize {
        let keys = self.all();
        for chunk in keys.chunks(200) {
            let mut args = vec!["DEL"];
            args.extend(chunk.iter().map(String::as_str));
            redis_cli(&self.url, &args);
        }
        keys.len()
    }
}

impl Drop for RedisKeys {
    fn drop(&mut self) {
        if thread::panicking() {
            // Best effort: a second panic would abort the test binary.
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.delete()));
        } else {
            self.delete();
        }
    }
}

/// A loopback port nothing listens on (bound to port 0, then released).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// Whether a server on 127.0.0.1:`port` answers `PING` with `PONG` within 200 ms.
fn answers_ping(port: u16) -> bool {
    let attempt = || -> std::io::Result<bool> {
        let address = SocketAddr::from(([127, 0, 0, 1], port));
        let mut stream = TcpStream::connect_timeout(&address, Duration::from_millis(200))?;
        stream.set_read_timeout(Some(Duration::from_millis(200)))?;
        stream.write_all(b"*1\r\n$4\r\nPING\r\n")?;
        let mut reply = [0u8; 7];
        stream.read_exact(&mut reply)?;
        Ok(&reply == b"+PONG\r\n")
    };
    attempt().unwrap_or(false)
}

/// Whether the server on 127.0.0.1:`port` is the process `pid` (`INFO server`'s
/// `process_id`, read within 200 ms): another test's server may hold the port when two tests
/// drew the same free port, and this one has not exited yet.
fn served_by(port: u16, pid: u32) -> bool {
    let attempt = || -> std::io::Result<bool> {
        let address = SocketAddr::from(([127, 0, 0, 1], port));
        let mut stream = TcpStream::connect_timeout(&address, Duration::from_millis(200))?;
        stream.set_read_timeout(Some(Duration::from_millis(200)))?;
        stream.write_all(b"*2\r\n$4\r\nINFO\r\n$6\r\nserver\r\n")?;
        let mut reply = Vec::new();
        let mut chunk = [0u8; 4096];
        let wanted = format!("process_id:{pid}\r\n");
        while !String::from_utf8_lossy(&reply).contains("process_id:") || !reply.ends_with(b"\r\n\r\n") {
            let read = stream.read(&mut chunk)?;
            if read == 0 {
                break;
            }
            reply.extend_from_slice(&chunk[..read]);
        }
        Ok(String::from_utf8_lossy(&reply).contains(&wanted))
    };
    attempt().unwrap_or(false)
}

/// A `redis-server` of the test's own on a loopback port (`--save '' --appendonly no`), which
/// the test may stop and start again on the same port; killed when dropped.
pub struct OwnRedis {
    child: Option<Child>,
    port: u16,
}

impl OwnRedis {
    /// Starts one on a free port and waits (at most 10 s) until it answers `PING`.
    pub fn start() -> Self {
        for _attempt in 0..5 {
            let mut server = Self { child: None, port: free_port() };
            if server.restart_once() {
                return server;
            }
        }
        panic!("redis-server exited before answering PING, five times");
    }

    /// Starts it again on the same port (after [`stop`](Self::stop)).
    pub fn restart(&mut self) {
        assert!(self.child.is_none(), "redis-server on port {} still runs", self.port);
        assert!(self.restart_once(), "redis-server did not start again on port {}", self.port);
    }

    fn restart_once(&mut self) -> bool {
        let child = Command::new("redis-server")
            .args([
                "--port",
                &self.port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|error| {
                panic!(
                    "cannot start redis-server ({error}): install Redis 7 (e.g. apt-get install redis-server)"
                )
            });
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if self.child.as_mut().unwrap().try_wait().unwrap().is_some() {
                self.child = None;
                return false;
            }
            let pid = self.child.as_ref().unwrap().id();
            if answers_ping(self.port) && served_by(self.port, pid) {
                return true;
            }
            assert!(
                Instant::now() < deadline,
                "redis-server on port {} did not answer PING in 10 s",
                self.port
            );
            thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// Kills it (SIGKILL, by its process id) and waits until it has exited.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for OwnRedis {
    fn drop(&mut self) {
        self.stop();
    }
}

/// `url` (a PostgreSQL URL) naming database `database` instead of its own.
pub fn with_database(url: &str, database: &str) -> String {
    let (scheme, rest) = url.split_once("://").expect("a URL with a scheme");
    let (rest, query) = match rest.split_once('?') {
        Some((rest, query)) => (rest, Some(query)),
        None => (rest, None),
    };
    let authority = rest.split_once('/').map_or(rest, |(authority, _)| authority);
    match query {
        Some(query) => format!("{scheme}://{authority}/{database}?{query}"),
        None => format!("{scheme}://{authority}/{database}"),
    }
}

/// Runs one statement on the admin database.
async fn admin_sql(sql: String) {
    let admin = PgConnectOptions::from_str(&admin_url()).expect("a valid PostgreSQL URL");
    let mut connection = admin.connect().await.expect("connect to the admin database");
    sqlx::raw_sql(AssertSqlSafe(sql)).execute(&mut connection).await.expect("an admin statement");
    connection.close().await.expect("close the admin connection");
}

/// A PostgreSQL database of one test's own, `rls_<test>_<pid>_<n>`: created empty, dropped by
/// [`finish`](Self::finish) at the end of a passing test, kept when the test fails.
pub struct TestDatabase {
    pub name: String,
    pub url: String,
}

impl TestDatabase {
    pub async fn create(test: &str) -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let name = format!("rls_{test}_{}_{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed));
        assert!(name.len() <= 63, "database name {name} is too long");
        admin_sql(format!(r#"DROP DATABASE IF EXISTS "{name}" WITH (FORCE)"#)).await;
        admin_sql(format!(r#"CREATE DATABASE "{name}""#)).await;
        let url = with_database(&admin_url(), &name);
        Self { name, url }
    }

    /// A pool of at most `max_connections` on the database.
    pub async fn pool(&self, max_connections: u32) -> PgPool {
        let options = PgConnectOptions::from_str(&self.url).expect("a valid PostgreSQL URL");
        PgPoolOptions::new()
            .max_connections(max_connections)
            .acquire_timeout(Duration::from_secs(30))
            .connect_with(options)
            .await
            .expect("connect a pool to the test database")
    }

    /// Drops the database (and any connection still open on it).
    pub async fn finish(self) {
        admin_sql(format!(r#"DROP DATABASE IF EXISTS "{}" WITH (FORCE)"#, self.name)).await;
    }
}

/// A directory holding `rules.yaml` (the rules) and `secret` (a 40-byte key secret and a
/// newline), removed when dropped.
pub struct Files {
    dir: tempfile::TempDir,
}

/// The key secret [`Files`] writes (40 bytes).
pub const FILE_SECRET: &str = "runlimit-server process test secret 0123";

impl Files {
    pub fn new(yaml: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("rules.yaml"), yaml).unwrap();
        std::fs::write(dir.path().join("secret"), format!("{FILE_SECRET}\n")).unwrap();
        Self { dir }
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// `rules.yaml`'s path, as a string.
    pub fn rules(&self) -> String {
        self.path("rules.yaml").display().to_string()
    }

    /// `secret`'s path, as a string.
    pub fn secret(&self) -> String {
        self.path("secret").display().to_string()
    }

    /// Writes `name` with `contents`; returns its path as a string.
    pub fn write(&self, name: &str, contents: &str) -> String {
        let path = self.path(name);
        std::fs::write(&path, contents).unwrap();
        path.display().to_string()
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

/// The binary under test, with an empty environment but `env` (so no `RUNLIMIT_*` variable of
/// the test run leaks in).
pub fn command(args: &[&str], env: &[(&str, &str)]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_runlimit-server"));
    command.env_clear().envs(env.iter().copied()).args(args).stdin(Stdio::null());
    command
}

/// What a process that exited printed.
#[derive(Debug)]
pub struct Exited {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

/// Runs the binary to completion (within 60 s).
pub fn run_to_exit(args: &[&str], env: &[(&str, &str)]) -> Exited {
    let mut child = command(args, env).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let stdout = drain(child.stdout.take().unwrap());
    let stderr = drain(child.stderr.take().unwrap());
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("runlimit-server {args:?} did not exit within 60 s; stderr:\n{}", stderr.join());
        }
        thread::sleep(Duration::from_millis(10));
    };
    Exited { status, stdout: stdout.join(), stderr: stderr.join() }
}

/// A pipe read to its end on a thread of its own.
pub struct Drained {
    text: Arc<Mutex<String>>,
    reader: Option<thread::JoinHandle<()>>,
}

impl Drained {
    /// Everything read so far.
    pub fn now(&self) -> String {
        self.text.lock().unwrap().clone()
    }

    /// Everything, once the pipe is closed (the process exited).
    pub fn join(mut self) -> String {
        if let Some(reader) = self.reader.take() {
            let _ = reader.join();
        }
        self.now()
    }
}

pub fn drain(mut pipe: impl std::io::Read + Send + 'static) -> Drained {
    let text = Arc::new(Mutex::new(String::new()));
    let sink = Arc::clone(&text);
    let reader = thread::spawn(move || {
        let mut buffer = [0u8; 4096];
        while let Ok(read) = pipe.read(&mut buffer) {
            if read == 0 {
                break;
            }
            sink.lock().unwrap().push_str(&String::from_utf8_lossy(&buffer[..read]));
        }
    });
    Drained { text, reader: Some(reader) }
}

/// A running `runlimit-server` process: killed (SIGKILL) when dropped, unless
/// [`terminate`](Self::terminate)d.
pub struct ServerProcess {
    child: Option<Child>,
    pub grpc: SocketAddr,
    pub http: SocketAddr,
    stderr: Option<Drained>,
}

/// A process started but not yet announced (so several can start at once).
pub struct Starting {
    child: Option<Child>,
    lines: mpsc::Receiver<String>,
    stderr: Option<Drained>,
}

impl Starting {
    /// Waits (at most 60 s) for the two listening lines.
    pub fn ready(mut self) -> ServerProcess {
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut grpc = None;
        let mut http = None;
        while grpc.is_none() || http.is_none() {
            let left = deadline.saturating_duration_since(Instant::now());
            let Ok(line) = self.lines.recv_timeout(left) else {
                let mut child = self.child.take().unwrap();
                let _ = child.kill();
                let status = child.wait().unwrap();
                panic!(
                    "runlimit-server did not announce both addresses ({status}); stderr:\n{}",
                    self.stderr.take().unwrap().join()
                );
            };
            if let Some(address) = line.strip_prefix(GRPC_LISTENING_PREFIX) {
                grpc = Some(address.parse().unwrap());
            } else if let Some(address) = line.strip_prefix(HTTP_LISTENING_PREFIX) {
                http = Some(address.parse().unwrap());
            } else {
                panic!("unexpected stdout line {line:?}");
            }
        }
        ServerProcess {
            child: self.child.take(),
            grpc: grpc.unwrap(),
            http: http.unwrap(),
            stderr: self.stderr.take(),
        }
    }
}

impl Drop for Starting {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl ServerProcess {
    /// Spawns the binary with `args` and `env` as they are.
    pub fn spawn(args: &[&str], env: &[(&str, &str)]) -> Starting {
        let mut child = command(args, env).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
        let stderr = drain(child.stderr.take().unwrap());
        let stdout = child.stdout.take().unwrap();
        let (sender, lines) = mpsc::channel();
        thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if sender.send(line).is_err() {
                    // Keep draining so the child never blocks on a full pipe.
                    continue;
                }
            }
        });
        Starting { child: Some(child), lines, stderr: Some(stderr) }
    }

    /// Starts the binary on free loopback ports (`--grpc-addr 127.0.0.1:0 --http-addr
    /// 127.0.0.1:0` before `args`) and waits until it announces both.
    pub fn start(args: &[&str], env: &[(&str, &str)]) -> Self {
        Self::spawn(&loopback(args), env).ready()
    }

    /// Starts the binary with `args` and `env` as they are and waits until it announces both
    /// addresses.
    pub fn start_with(args: &[&str], env: &[(&str, &str)]) -> Self {
        Self::spawn(args, env).ready()
    }

    /// Everything the process wrote to stderr so far.
    pub fn stderr(&self) -> String {
        self.stderr.as_ref().map(Drained::now).unwrap_or_default()
    }

    /// The process id.
    pub fn id(&self) -> u32 {
        self.child.as_ref().unwrap().id()
    }

    /// Sends SIGTERM (`kill -TERM PID`) and waits (at most 30 s) for the process to exit;
    /// returns its status and stderr.
    pub fn terminate(self) -> (ExitStatus, String) {
        self.signal("TERM")
    }

    /// Sends `signal` (`kill -SIGNAL PID`, e.g. `INT`) and waits (at most 30 s) for the process
    /// to exit; returns its status and stderr.
    pub fn signal(mut self, signal: &str) -> (ExitStatus, String) {
        let mut child = self.child.take().unwrap();
        let sent =
            Command::new("kill").arg(format!("-{signal}")).arg(child.id().to_string()).status().unwrap();
        assert!(sent.success(), "kill -{signal} {}", child.id());
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                return (status, self.stderr.take().unwrap().join());
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!("runlimit-server did not exit within 30 s of SIG{signal}; stderr:\n{}", self.stderr());
            }
            thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// `--grpc-addr 127.0.0.1:0 --http-addr 127.0.0.1:0` and `args`.
pub fn loopback<'a>(args: &[&'a str]) -> Vec<&'a str> {
    let mut all = vec!["--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"];
    all.extend_from_slice(args);
    all
}

/// `GET path` over HTTP/1.1 on `address`: the status line and the body.
pub fn http_get(address: SocketAddr, path: &str) -> (String, String) {
    let mut stream = TcpStream::connect(address).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(stream, "GET {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n").unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
    let status = head.lines().next().unwrap_or_default().to_owned();
    (status, body.to_owned())
}

/// A three-primary Redis Cluster of the test's own on loopback ports (no replicas, nothing
/// persisted), stopped when dropped.
pub struct OwnCluster {
    pub ports: Vec<u16>,
    servers: Vec<Child>,
    dir: tempfile::TempDir,
}

impl OwnCluster {
    /// Starts the three nodes, joins them (`redis-cli --cluster create`) and waits (at most
    /// 30 s) for `cluster_state:ok` on each.
    pub fn start() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let ports: Vec<u16> = (0..3).map(|_| free_port()).collect();
        let servers = ports
            .iter()
            .map(|port| {
                let config = dir.path().join(format!("nodes-{port}.conf"));
                Command::new("redis-server")
                    .args(["--bind", "127.0.0.1", "--port", &port.to_string(), "--cluster-enabled", "yes"])
                    .args(["--cluster-config-file", config.to_str().unwrap()])
                    .args(["--save", "", "--appendonly", "no", "--dir", dir.path().to_str().unwrap()])
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .spawn()
                    .expect("redis-server on PATH")
            })
            .collect();
        let cluster = Self { ports, servers, dir };
        for port in &cluster.ports {
            cluster.wait(*port, &["PING"], "PONG");
        }
        let mut create = Command::new("redis-cli");
        create.args(["--cluster", "create"]);
        for port in &cluster.ports {
            create.arg(format!("127.0.0.1:{port}"));
        }
        let output = create.args(["--cluster-replicas", "0", "--cluster-yes"]).output().unwrap();
        assert!(output.status.success(), "cluster create: {}", String::from_utf8_lossy(&output.stdout));
        for port in &cluster.ports {
            cluster.wait(*port, &["CLUSTER", "INFO"], "cluster_state:ok");
        }
        cluster
    }

    /// The URL of node `index`.
    pub fn url(&self, index: usize) -> String {
        format!("redis://127.0.0.1:{}", self.ports[index])
    }

    /// `redis-cli -p PORT ARGS...`'s output, trimmed.
    pub fn cli(&self, port: u16, args: &[&str]) -> String {
        let output = Command::new("redis-cli").args(["-p", &port.to_string()]).args(args).output().unwrap();
        String::from_utf8_lossy(&output.stdout).trim().to_owned()
    }

    fn wait(&self, port: u16, args: &[&str], expected: &str) {
        let started = std::time::Instant::now();
        while !self.cli(port, args).contains(expected) {
            assert!(started.elapsed() < std::time::Duration::from_secs(30), "node {port}: no {expected}");
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    }
}

impl Drop for OwnCluster {
    fn drop(&mut self) {
        for server in &mut self.servers {
            let _ = server.kill();
            let _ = server.wait();
        }
        let _ = &self.dir;
    }
}

// Helpers added for the operations suites (operations.rs, operations_processes.rs).

impl OwnRedis {
    /// `redis-cli -p PORT ARGS...`'s stdout, trimmed.
    pub fn cli(&self, args: &[&str]) -> String {
        let output = Command::new("redis-cli")
            .args(["-p", &self.port.to_string()])
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert!(output.status.success(), "redis-cli {args:?}: {}", String::from_utf8_lossy(&output.stderr));
        String::from_utf8_lossy(&output.stdout).trim().to_owned()
    }
}

impl Files {
    /// Replaces `name` with `contents` atomically (written to a hidden file, then renamed over
    /// it), as editors and configuration tools do: a reader sees the old text or the new one,
    /// never a partial file.
    pub fn replace(&self, name: &str, contents: &str) {
        let temporary = self.path(&format!(".{name}.tmp"));
        std::fs::write(&temporary, contents).unwrap();
        std::fs::rename(&temporary, self.path(name)).unwrap();
    }
}

impl ServerProcess {
    /// Sends `signal` (`kill -SIGNAL PID`, e.g. `HUP`) and returns at once.
    pub fn send(&self, signal: &str) {
        let id = self.child.as_ref().unwrap().id();
        let sent = Command::new("kill").arg(format!("-{signal}")).arg(id.to_string()).status().unwrap();
        assert!(sent.success(), "kill -{signal} {id}");
    }

    /// Waits (at most `within`) for the process to exit; returns its status and stderr.
    pub fn wait_exit(mut self, within: Duration) -> (ExitStatus, String) {
        let mut child = self.child.take().unwrap();
        let deadline = Instant::now() + within;
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                return (status, self.stderr.take().unwrap().join());
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!("runlimit-server did not exit within {within:?}; stderr:\n{}", self.stderr());
            }
            thread::sleep(Duration::from_millis(5));
        }
    }

    /// The bytes the process has read so far (`rchar` of `/proc/PID/io`: files, pipes and
    /// sockets alike).
    pub fn bytes_read(&self) -> u64 {
        let io = std::fs::read_to_string(format!("/proc/{}/io", self.id())).unwrap();
        io.lines().find_map(|line| line.strip_prefix("rchar: ")).unwrap().parse().unwrap()
    }
}

/// `POST path` with `body` over HTTP/1.1 on `address`: the status line and the body.
pub fn http_post(address: SocketAddr, path: &str, body: &str) -> (String, String) {
    let mut stream = TcpStream::connect(address).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        stream,
        "POST {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
    let status = head.lines().next().unwrap_or_default().to_owned();
    (status, body.to_owned())
}
