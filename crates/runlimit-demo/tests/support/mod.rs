//! Starts the built `runlimit-demo` binary and talks HTTP/1.1 to it over loopback.

#![allow(dead_code, unreachable_pub)]

use std::{
    io::{BufRead as _, BufReader, Read as _},
    net::SocketAddr,
    process::{Child, Command, ExitStatus, Stdio},
    sync::{Arc, Mutex, mpsc},
    thread,
    time::{Duration, Instant},
};

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt as _, Full};
use hyper_util::{
    client::legacy::{Client, connect::HttpConnector},
    rt::TokioExecutor,
};
use runlimit_demo::LISTENING_PREFIX;

/// A running demo process, killed on drop.
pub struct Demo {
    child: Option<Child>,
    pub address: SocketAddr,
    stderr: Arc<Mutex<String>>,
}

/// A secret shared by replicas in the tests (exactly 32 bytes).
pub const SECRET: &str = "demo-e2e-secret-0123456789abcdef";

impl Demo {
    /// Starts the binary with `args` (plus `--listen 127.0.0.1:0`) and `env`, with
    /// `DATABASE_URL`, `REDIS_URL`, `RUNLIMIT_KEY_SECRET` and `RUST_LOG` removed from the
    /// inherited environment first, and waits for the listening line.
    pub fn start(args: &[&str], env: &[(&str, &str)]) -> Self {
        let mut command = Command::new(env!("CARGO_BIN_EXE_runlimit-demo"));
        command
            .args(["--listen", "127.0.0.1:0"])
            .args(args)
            .env_remove("DATABASE_URL")
            .env_remove("REDIS_URL")
            .env_remove("RUNLIMIT_KEY_SECRET")
            .env_remove("RUST_LOG")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = command.spawn().expect("spawn runlimit-demo");
        let stderr = Arc::new(Mutex::new(String::new()));
        let mut err_pipe = child.stderr.take().unwrap();
        let sink = Arc::clone(&stderr);
        thread::spawn(move || {
            let mut buffer = [0u8; 4096];
            while let Ok(n) = err_pipe.read(&mut buffer) {
                if n == 0 {
                    break;
                }
                sink.lock().unwrap().push_str(&String::from_utf8_lossy(&buffer[..n]));
            }
        });
        let stdout = child.stdout.take().unwrap();
        let (sender, receiver) = mpsc::channel();
        thread::spawn(move || {
            let mut lines = BufReader::new(stdout).lines();
            let first = lines.next().and_then(Result::ok);
            let _ = sender.send(first);
            // Keep draining so the child never blocks on a full pipe.
            for _ in lines {}
        });
        let line = match receiver.recv_timeout(Duration::from_secs(60)) {
            Ok(Some(line)) => line,
            other => {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "runlimit-demo did not announce its address ({other:?}); stderr:\n{}",
                    stderr.lock().unwrap()
                );
            }
        };
        let address = line
            .strip_prefix(LISTENING_PREFIX)
            .unwrap_or_else(|| panic!("unexpected first stdout line {line:?}"))
            .parse()
            .unwrap();
        Self { child: Some(child), address, stderr }
    }

    /// Runs the binary to completion (it is expected to fail at startup) and returns its exit
    /// status and stderr.
    pub fn run_to_exit(args: &[&str], env: &[(&str, &str)]) -> (ExitStatus, String) {
        let output = Command::new(env!("CARGO_BIN_EXE_runlimit-demo"))
            .args(["--listen", "127.0.0.1:0"])
            .args(args)
            .env_remove("DATABASE_URL")
            .env_remove("REDIS_URL")
            .env_remove("RUNLIMIT_KEY_SECRET")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .output()
            .unwrap();
        (output.status, String::from_utf8_lossy(&output.stderr).into_owned())
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.address)
    }

    /// Everything the process wrote to stderr so far.
    pub fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// Sends SIGTERM to this process (by its id) and waits up to 30 s for it to exit.
    pub fn terminate(mut self) -> (ExitStatus, String) {
        let mut child = self.child.take().unwrap();
        let status = Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap();
        assert!(status.success());
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                // Let the stderr reader drain the pipe.
                thread::sleep(Duration::from_millis(100));
                return (status, self.stderr());
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                panic!("runlimit-demo did not stop within 30 s of SIGTERM");
            }
            thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Demo {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A complete response.
#[derive(Debug)]
pub struct Reply {
    pub status: StatusCode,
    pub headers: http::HeaderMap,
    pub body: String,
}

impl Reply {
    /// The value of `name`, `None` when absent.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(|value| value.to_str().unwrap())
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap_or_else(|error| panic!("{error}: {:?}", self.body))
    }
}

pub struct Http {
    client: Client<HttpConnector, Full<Bytes>>,
}

impl Http {
    pub fn new() -> Self {
        Self { client: Client::builder(TokioExecutor::new()).build_http() }
    }

    pub async fn send(&self, request: Request<Full<Bytes>>) -> Reply {
        let response = self.client.request(request).await.unwrap();
        let (parts, body) = response.into_parts();
        let bytes = body.collect().await.unwrap().to_bytes();
        Reply {
            status: parts.status,
            headers: parts.headers,
            body: String::from_utf8(bytes.to_vec()).unwrap(),
        }
    }

    pub async fn get(&self, url: &str, headers: &[(&str, &str)]) -> Reply {
        let mut request = Request::get(url);
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        self.send(request.body(Full::new(Bytes::new())).unwrap()).await
    }

    pub async fn post_json(&self, url: &str, body: &str, headers: &[(&str, &str)]) -> Reply {
        let mut request = Request::post(url).header("content-type", "application/json");
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        self.send(request.body(Full::new(Bytes::from(body.to_owned()))).unwrap()).await
    }

    /// `POST /login` for `identity` with `password`.
    pub async fn login(&self, demo: &Demo, identity: &str, password: &str) -> Reply {
        let body = serde_json::json!({ "identity": identity, "password": password }).to_string();
        self.post_json(&demo.url("/login"), &body, &[]).await
    }
}

/// `admin` (a PostgreSQL URL) with its database path replaced by `database` (query parameters
/// kept).
pub fn with_database(admin: &str, database: &str) -> String {
    let (base, query) = admin.split_once('?').map_or((admin, None), |(base, query)| (base, Some(query)));
    let authority_start = base.find("://").map_or(0, |index| index + 3);
    let base = match base[authority_start..].find('/') {
        Some(slash) => &base[..authority_start + slash],
        None => base,
    };
    match query {
        Some(query) => format!("{base}/{database}?{query}"),
        None => format!("{base}/{database}"),
    }
}

pub const ALICE: &str = "alice@example.test";
pub const ALICE_PASSWORD: &str = "correct horse battery staple";

/// `1 second` or `N seconds`, as the demo's details say it.
pub fn seconds(retry: u64) -> String {
    if retry == 1 { "1 second".to_owned() } else { format!("{retry} seconds") }
}

/// The exact quota-exceeded problem body for `name`, with `retry` seconds.
pub fn quota_exceeded_body(name: &str, retry: u64) -> serde_json::Value {
    serde_json::json!({
        "type": "https://iana.org/assignments/http-problem-types#quota-exceeded",
        "title": "Request cannot be satisfied as assigned quota has been exceeded",
        "status": 429,
        "detail": format!("quota of policy \"{name}\" is exhausted; retry after {}", seconds(retry)),
        "violated-policies": [name],
    })
}

/// Asserts the exact `RateLimit-Policy`, `RateLimit` and `Retry-After` fields of `reply`.
#[track_caller]
pub fn assert_fields(reply: &Reply, policy: Option<&str>, limit: Option<&str>, retry_after: Option<&str>) {
    assert_eq!(reply.header("ratelimit-policy"), policy, "RateLimit-Policy of {reply:?}");
    assert_eq!(reply.header("ratelimit"), limit, "RateLimit of {reply:?}");
    assert_eq!(reply.header("retry-after"), retry_after, "Retry-After of {reply:?}");
}

/// The exact problem body of a `login-attempts` backoff denial with `retry` seconds.
pub fn attempt_backoff_body(retry: u64) -> serde_json::Value {
    serde_json::json!({
        "type": "https://iana.org/assignments/http-problem-types#quota-exceeded",
        "title": "Request cannot be satisfied as assigned quota has been exceeded",
        "status": 429,
        "detail": format!(
            "password checks of policy \"login-attempts\" are backing off after a failed attempt; \
             retry after {}",
            seconds(retry)
        ),
        "violated-policies": ["login-attempts"],
    })
}

/// The exact 401 problem body.
pub fn unauthorized_body() -> serde_json::Value {
    serde_json::json!({
        "type": "about:blank", "title": "Unauthorized", "status": 401,
        "detail": "identity or password is wrong",
    })
}

/// Asserts `RateLimit` of `reply` item by item: each item's name and `r` exactly as in
/// `expected` (`[(name, r, window)]`), and its `t` (the time to the end of an anchored window,
/// which moves with the wall clock while a test sleeps) between `window - slack` and
/// `window` seconds.
#[track_caller]
pub fn assert_ratelimit(reply: &Reply, expected: &[(&str, u64, u64)], slack: u64) {
    let value = reply.header("ratelimit").unwrap_or_else(|| panic!("no RateLimit in {reply:?}"));
    let items: Vec<&str> = value.split(", ").collect();
    assert_eq!(items.len(), expected.len(), "RateLimit {value:?}");
    for (item, (name, remaining, window)) in items.iter().zip(expected) {
        let (head, t) = item.rsplit_once(";t=").unwrap_or_else(|| panic!("no t in {item:?}"));
        assert_eq!(head, format!("\"{name}\";r={remaining}"), "RateLimit {value:?}");
        let t: u64 = t.parse().unwrap();
        assert!(
            (window.saturating_sub(slack)..=*window).contains(&t),
            "t={t} outside its window in {value:?}"
        );
    }
}

/// The series of `metric` in a Prometheus text scrape, as `labels -> value` (`labels` as
/// rendered between the braces).
pub fn scraped(body: &str, metric: &str) -> std::collections::BTreeMap<String, String> {
    body.lines()
        .filter_map(|line| line.strip_prefix(metric)?.strip_prefix('{'))
        .map(|rest| {
            let (labels, value) = rest.rsplit_once("} ").unwrap_or_else(|| panic!("a sample line: {rest}"));
            (labels.to_owned(), value.to_owned())
        })
        .collect()
}

/// The labels of a `runlimit_admissions_total` series of a single check, as a scrape renders
/// them.
pub fn check_series(backend: &str, policy: &str, scope: &str, outcome: &str, consumption: &str) -> String {
    format!(
        r#"backend="{backend}",policy="{policy}",scope="{scope}",operation="check",outcome="{outcome}",consumption="{consumption}""#
    )
}

/// The labels of a `runlimit_attempts_total` series of the demo's `login-attempts` policy.
pub fn attempt_series(backend: &str, operation: &str, event: &str) -> String {
    format!(
        r#"backend="{backend}",policy="demo.login",scope="attempt",operation="{operation}",event="{event}""#
    )
}

/// `labels -> value` pairs as [`scraped`] returns them.
pub fn counts<const N: usize>(series: [(String, &str); N]) -> std::collections::BTreeMap<String, String> {
    series.into_iter().map(|(labels, value)| (labels, value.to_owned())).collect()
}
