//! Closed-loop throughput and latency of `ShouldRateLimit` over real gRPC on loopback:
//! runlimit-server in memory and Redis mode beside the bare tonic server stack (the floor) and
//! beside `RedisLimiter` called in-process, in one run.
//!
//! ```text
//! RUNLIMIT_BENCH_SECONDS=4 cargo bench -p runlimit-server
//! ```
//!
//! A documented bench binary (`harness = false`) rather than criterion, as in
//! `crates/runlimit-redis/benches/redis.rs`: the figures of interest are ratios between
//! closed-loop throughputs at a given concurrency. Each request is what Envoy sends for a
//! typical route: domain `bench`, two descriptors, `("remote_address", IP)` and
//! `("user", ID)`, each matched by a per-value rule of 1,000,000,000 requests per hour (so
//! everything is allowed; every response is checked to be `OK` with two statuses). Each task
//! loops over 256 (IP, user) pairs of its own. The servers run on a Tokio runtime of their
//! own (as many workers as cores, as the binary's `#[tokio::main]`); the load client runs on
//! a second one in the same process, so client and server share the machine's cores. The
//! client sends over `RUNLIMIT_BENCH_CHANNELS` tonic `Channel`s per server (default 2, as
//! Envoy opens one HTTP/2 connection per worker thread; task `i` uses channel `i mod n`),
//! each multiplexing its tasks' calls on one HTTP/2 connection. The rows:
//!
//! - `floor`: the same tonic server stack as runlimit-server's (`tonic::transport::Server`
//!   with the gRPC health service and a `RateLimitServiceServer` on a `TcpIncoming` from a
//!   bound listener), without the listener's bounds (README, "Endpoints": the connection cap,
//!   the request deadline and byte budget), whose handler answers without a limiter: `OK` and one `OK` status per
//!   descriptor, of the same shape as the real ones (current limit, remaining, reset);
//! - `memory`: runlimit-server (`Service::new` over `Backend::memory` with the binary's
//!   defaults, 1,000,000 keys in 16 shards, served by `Server::with_service` and `serve`);
//! - `direct`: `RedisLimiter::check_all` called in-process, at the same concurrency, with the
//!   same batch as the server's (one check per descriptor, both policies of the same limit and
//!   window), the subject keys derived per call with `KeyHasher::hash_for` from the same
//!   subject bytes, on a key prefix of the same length as the server's domain prefix;
//! - `redis`: runlimit-server on `Backend::redis` (the binary's defaults: key prefix
//!   `runlimit-server`, 4,096 keys per shard), against a private `redis-server` the bench
//!   starts on a free loopback port (nothing persisted). Without `redis-server` the Redis
//!   rows are skipped with a notice.
//!
//! At 1, 16 and 64 concurrent tasks (each sending its next call when the previous answered),
//! every row runs 1 s of warm-up, then `RUNLIMIT_BENCH_SECONDS` (default 4) of measurement:
//! requests per second and the p50 and p99 latency of a call (hdrhistogram, each call timed by
//! the client from sending to the decoded answer). The targets: runlimit-server in memory mode
//! at least 0.8x the floor's throughput, and in Redis mode at least 0.8x direct
//! `RedisLimiter`'s. Client and server share the cores, so one pair of measurements moves
//! with whatever else runs: after the tables the bench measures `RUNLIMIT_BENCH_ROUNDS`
//! (default 4) more rounds at 16 tasks, each `floor` then `memory`, then `direct` then
//! `redis`, and judges each target on the median ratio of those pairs and the table's pair,
//! printing `met` or `missed`. The Redis row also shows the ratio it would reach if a call
//! through runlimit-server cost exactly the floor's gRPC hop plus direct's Redis call,
//! `floor / (floor + direct)`: the time of a call at 1 task, and its CPU where client, servers
//! and `redis-server` share saturated cores, add up that way.
//!
//! The process installs the Prometheus recorder as the binary does (`install_metrics`), so
//! runlimit-server's own counters cost what they cost in production; `RUNLIMIT_BENCH_METRICS=0`
//! leaves it out. `RUNLIMIT_BENCH_TASKS=16` restricts the tables to one concurrency,
//! `RUNLIMIT_BENCH_WORKLOADS=floor,memory` to the rows named (for profiling one), and
//! `RUNLIMIT_BENCH_ROUNDS=0` skips the extra pairs. Figures from a busy machine are only good
//! for ratios taken side by side; see the README's "Performance" section for the reference
//! runs.

use std::{
    net::SocketAddr,
    process::{Child, Command, Stdio},
    str::FromStr,
    sync::{
        Arc,
        atomic::{AtomicU8, Ordering},
    },
    time::{Duration, Instant},
};

use envoy_types::pb::{
    envoy::{
        extensions::common::ratelimit::v3::{RateLimitDescriptor, rate_limit_descriptor::Entry},
        service::ratelimit::v3::{
            RateLimitRequest, RateLimitResponse,
            rate_limit_response::{Code, DescriptorStatus, RateLimit, rate_limit::Unit as RlsUnit},
            rate_limit_service_client::RateLimitServiceClient,
            rate_limit_service_server::{RateLimitService, RateLimitServiceServer},
        },
    },
    google::protobuf::Duration as PbDuration,
};
use hdrhistogram::Histogram;
use runlimit_core::{Check, FixedWindowPolicy, KeyHasher, PolicyId, ScopeId};
use runlimit_memory::MemoryStoreConfig;
use runlimit_redis::{KeyPrefix, RedisConfig, RedisLimiter};
use runlimit_server::{Backend, RuleTable, Server, Service, ServiceOptions};
use tokio::{net::TcpListener, runtime::Runtime, sync::oneshot, task::JoinHandle};
use tonic::{
    Request, Response, Status,
    transport::{Channel, Endpoint, server::TcpIncoming},
};

const CONCURRENCY: [usize; 3] = [1, 16, 64];
/// The concurrency the targets are judged at.
const PAIR_TASKS: usize = 16;
/// Distinct (IP, user) pairs each task loops over.
const VALUES_PER_TASK: usize = 256;
const WARM_UP: Duration = Duration::from_secs(1);
const TARGET: f64 = 0.8;
const LIMIT: u32 = 1_000_000_000;
const SECRET: &[u8] = b"runlimit-server bench secret, 32+ bytes long";
const DOMAIN: &str = "bench";
const RULES: &str = "\
domain: bench
descriptors:
  - key: remote_address
    rate_limit:
      unit: hour
      requests_per_unit: 1000000000
  - key: user
    rate_limit:
      name: per_user
      unit: hour
      requests_per_unit: 1000000000
";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Row {
    Floor,
    Memory,
    Direct,
    Redis,
}

impl Row {
    /// Measured in this order, so each target's pair is measured back to back.
    const ALL: [Self; 4] = [Self::Floor, Self::Memory, Self::Direct, Self::Redis];

    fn name(self) -> &'static str {
        match self {
            Self::Floor => "floor",
            Self::Memory => "memory",
            Self::Direct => "direct",
            Self::Redis => "redis",
        }
    }

    fn description(self) -> &'static str {
        match self {
            Self::Floor => "tonic RLS stack, no limiter",
            Self::Memory => "runlimit-server, memory",
            Self::Direct => "RedisLimiter in-process",
            Self::Redis => "runlimit-server, Redis",
        }
    }

    /// The row a target compares this one with.
    fn reference(self) -> Option<Self> {
        match self {
            Self::Memory => Some(Self::Floor),
            Self::Redis => Some(Self::Direct),
            Self::Floor | Self::Direct => None,
        }
    }
}

fn env<T: FromStr>(name: &str, default: T) -> T {
    std::env::var(name).ok().and_then(|value| value.trim().parse().ok()).unwrap_or(default)
}

#[derive(Debug)]
struct Settings {
    seconds: u64,
    rounds: usize,
    channels: usize,
    metrics: bool,
    tasks: Option<usize>,
    rows: Vec<Row>,
}

impl Settings {
    fn from_env() -> Self {
        let rows = match std::env::var("RUNLIMIT_BENCH_WORKLOADS") {
            Ok(only) => Row::ALL
                .into_iter()
                .filter(|row| only.split(',').any(|name| name.trim() == row.name()))
                .collect(),
            Err(_) => Row::ALL.to_vec(),
        };
        Self {
            seconds: env("RUNLIMIT_BENCH_SECONDS", 4),
            rounds: env("RUNLIMIT_BENCH_ROUNDS", 4),
            channels: env("RUNLIMIT_BENCH_CHANNELS", 2).max(1),
            metrics: env("RUNLIMIT_BENCH_METRICS", 1) != 0,
            tasks: std::env::var("RUNLIMIT_BENCH_TASKS").ok().and_then(|value| value.trim().parse().ok()),
            rows,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The floor: the same server stack, answering without a limiter.

/// Answers `OK` with one `OK` status per descriptor, shaped like runlimit-server's.
#[derive(Clone, Copy, Debug)]
struct Floor;

#[tonic::async_trait]
impl RateLimitService for Floor {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        let request = request.get_ref();
        let statuses = request
            .descriptors
            .iter()
            .map(|descriptor| {
                let per_user = descriptor.entries.first().is_some_and(|entry| entry.key == "user");
                DescriptorStatus {
                    code: Code::Ok.into(),
                    current_limit: Some(RateLimit {
                        name: if per_user { "per_user" } else { "" }.to_owned(),
                        requests_per_unit: LIMIT,
                        unit: RlsUnit::Hour.into(),
                    }),
                    limit_remaining: LIMIT - 1,
                    duration_until_reset: Some(PbDuration { seconds: 1_799, nanos: 500_000_000 }),
                    ..DescriptorStatus::default()
                }
            })
            .collect();
        Ok(Response::new(RateLimitResponse {
            overall_code: Code::Ok.into(),
            statuses,
            ..RateLimitResponse::default()
        }))
    }
}

// ---------------------------------------------------------------------------------------------
// The servers, on their own runtime.

/// A private `redis-server`, killed on drop.
#[derive(Debug)]
struct RedisProcess {
    child: Child,
    url: String,
}

impl Drop for RedisProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_redis() -> Option<RedisProcess> {
    let port = std::net::TcpListener::bind("127.0.0.1:0").ok()?.local_addr().ok()?.port();
    let child = Command::new("redis-server")
        .args(["--bind", "127.0.0.1", "--port", &port.to_string(), "--save", "", "--appendonly", "no"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    let process = RedisProcess { child, url: format!("redis://127.0.0.1:{port}") };
    for _ in 0..100 {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return Some(process);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    None
}

#[derive(Debug)]
struct Servers {
    floor: SocketAddr,
    memory: SocketAddr,
    redis: Option<SocketAddr>,
    stops: Vec<oneshot::Sender<()>>,
    tasks: Vec<JoinHandle<()>>,
}

fn loopback() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 0))
}

fn hasher() -> KeyHasher {
    KeyHasher::new(SECRET).expect("a valid key secret")
}

/// Serves `service` as the binary does; returns the gRPC address.
async fn serve_runlimit(
    service: Service,
    stops: &mut Vec<oneshot::Sender<()>>,
) -> (SocketAddr, JoinHandle<()>) {
    let server = Server::with_service(service, loopback(), loopback()).await.expect("bind loopback");
    let address = server.grpc_addr().expect("gRPC address");
    let (stop, stopped) = oneshot::channel::<()>();
    stops.push(stop);
    let task = tokio::spawn(async move {
        server
            .serve(async {
                let _ = stopped.await;
            })
            .await
            .expect("runlimit-server");
    });
    (address, task)
}

/// Serves [`Floor`] on the stack `Server::serve` builds for the gRPC listener: the health
/// service beside the RLS service, on a `TcpIncoming` from a bound listener with
/// `TCP_NODELAY` (keep the two in step when `Server::serve` changes them).
async fn serve_floor(stops: &mut Vec<oneshot::Sender<()>>) -> (SocketAddr, JoinHandle<()>) {
    let listener = TcpListener::bind(loopback()).await.expect("bind loopback");
    let address = listener.local_addr().expect("floor address");
    let (reporter, health) = tonic_health::server::health_reporter();
    reporter.set_serving::<RateLimitServiceServer<Floor>>().await;
    let (stop, stopped) = oneshot::channel::<()>();
    stops.push(stop);
    let task = tokio::spawn(async move {
        tonic::transport::Server::builder()
            .add_service(health)
            .add_service(RateLimitServiceServer::new(Floor))
            .serve_with_incoming_shutdown(TcpIncoming::from(listener).with_nodelay(Some(true)), async {
                let _ = stopped.await;
            })
            .await
            .expect("floor server");
    });
    (address, task)
}

async fn start_servers(redis_url: Option<&str>) -> Servers {
    let rules = || RuleTable::from_sources([("bench.yaml", RULES)]).expect("valid bench rules");
    let mut stops = Vec::new();
    let mut tasks = Vec::new();

    let (floor, task) = serve_floor(&mut stops).await;
    tasks.push(task);

    let config = MemoryStoreConfig::new(1_000_000)
        .and_then(|config| config.with_shard_count(16))
        .expect("memory store config");
    let service = Service::new(rules(), &Backend::memory(config), hasher(), ServiceOptions::default());
    let (memory, task) = serve_runlimit(service, &mut stops).await;
    tasks.push(task);

    let mut redis = None;
    if let Some(url) = redis_url {
        let config = RedisConfig::default()
            .with_key_prefix(KeyPrefix::new("runlimit-server").expect("prefix"))
            .with_maximum_keys_per_shard(4_096)
            .expect("keys per shard");
        let backend = Backend::redis(url, &config).expect("Redis backend");
        match backend.prepare().await {
            Ok(()) => {
                let service = Service::new(rules(), &backend, hasher(), ServiceOptions::default());
                let (address, task) = serve_runlimit(service, &mut stops).await;
                tasks.push(task);
                redis = Some(address);
            }
            Err(error) => {
                println!(
                    "(Redis backend not ready: {}; no Redis rows)",
                    runlimit_server::error_chain(&error)
                );
            }
        }
    }
    Servers { floor, memory, redis, stops, tasks }
}

// ---------------------------------------------------------------------------------------------
// The client side.

/// `RedisLimiter` called in-process with the server's batch.
#[derive(Debug)]
struct Direct {
    limiter: RedisLimiter,
    hasher: KeyHasher,
    address: FixedWindowPolicy,
    user: FixedWindowPolicy,
}

async fn direct(url: &str) -> Option<Direct> {
    // The server's domain prefix is `runlimit-server:` and 16 hex digits; this one has the
    // same length, and the policies the same limit, window and identifier lengths.
    let config = RedisConfig::default()
        .with_key_prefix(KeyPrefix::new("runlimit-direct:0123456789abcdef").expect("prefix"))
        .with_maximum_keys_per_shard(4_096)
        .expect("keys per shard");
    let limiter = RedisLimiter::new(url).expect("Redis URL").with_config(config);
    if let Err(error) = limiter.prepare().await {
        println!("(direct RedisLimiter not ready: {}; no direct row)", runlimit_server::error_chain(&error));
        return None;
    }
    let policy = |id: &str| {
        FixedWindowPolicy::new(
            PolicyId::new(id).expect("policy id"),
            ScopeId::new("descriptor").expect("scope"),
            u64::from(LIMIT),
            Duration::from_secs(3_600),
        )
        .expect("policy")
    };
    Some(Direct {
        limiter,
        hasher: hasher(),
        address: policy("rls.000000000000000000000001"),
        user: policy("rls.000000000000000000000002"),
    })
}

#[derive(Debug)]
struct Targets {
    floor: Vec<Channel>,
    memory: Vec<Channel>,
    redis: Option<Vec<Channel>>,
    direct: Option<Arc<Direct>>,
}

impl Targets {
    fn has(&self, row: Row) -> bool {
        match row {
            Row::Floor | Row::Memory => true,
            Row::Redis => self.redis.is_some(),
            Row::Direct => self.direct.is_some(),
        }
    }
}

/// `count` channels to `address`, each its own HTTP/2 connection, connected now.
async fn channels(address: SocketAddr, count: usize) -> Vec<Channel> {
    let endpoint = Endpoint::from_shared(format!("http://{address}")).expect("endpoint");
    let mut channels = Vec::with_capacity(count);
    for _ in 0..count {
        let mut attempts = 0;
        let channel = loop {
            match endpoint.connect().await {
                Ok(channel) => break channel,
                Err(error) if attempts >= 100 => panic!("no gRPC server at {address}: {error}"),
                Err(_) => {
                    attempts += 1;
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        };
        channels.push(channel);
    }
    channels
}

/// The (IP, user) values of `task`, distinct across tasks.
fn values(task: usize) -> impl Iterator<Item = (String, String)> {
    (0..VALUES_PER_TASK)
        .map(move |i| (format!("10.{}.{}.{}", task / 256, task % 256, i), format!("user-{task}-{i}")))
}

fn descriptor(key: &str, value: String) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: vec![Entry { key: key.to_owned(), value }],
        ..RateLimitDescriptor::default()
    }
}

/// The bytes runlimit-server hashes into a one-entry descriptor's counter key: a tag, then the
/// key and the value, each length-prefixed.
fn subject(key: &str, value: &str) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(1 + 16 + key.len() + value.len());
    bytes.push(b'E');
    for text in [key, value] {
        bytes.extend_from_slice(&(text.len() as u64).to_be_bytes());
        bytes.extend_from_slice(text.as_bytes());
    }
    bytes
}

/// One task's way of making a call.
enum Caller {
    Grpc { client: RateLimitServiceClient<Channel>, requests: Vec<RateLimitRequest> },
    Direct { direct: Arc<Direct>, subjects: Vec<(Vec<u8>, Vec<u8>)> },
}

impl Caller {
    fn new(row: Row, task: usize, targets: &Targets) -> Self {
        let pick = |channels: &[Channel]| channels[task % channels.len()].clone();
        let channel = match row {
            Row::Floor => pick(&targets.floor),
            Row::Memory => pick(&targets.memory),
            Row::Redis => pick(targets.redis.as_deref().expect("a Redis-mode server")),
            Row::Direct => {
                let direct = Arc::clone(targets.direct.as_ref().expect("a direct limiter"));
                let subjects = values(task)
                    .map(|(ip, user)| (subject("remote_address", &ip), subject("user", &user)))
                    .collect();
                return Self::Direct { direct, subjects };
            }
        };
        let requests = values(task)
            .map(|(ip, user)| RateLimitRequest {
                domain: DOMAIN.to_owned(),
                descriptors: vec![descriptor("remote_address", ip), descriptor("user", user)],
                hits_addend: 0,
            })
            .collect();
        Self::Grpc { client: RateLimitServiceClient::new(channel), requests }
    }

    async fn call(&mut self, n: usize) {
        match self {
            Self::Grpc { client, requests } => {
                let request = requests[n % requests.len()].clone();
                let response = client.should_rate_limit(request).await.expect("ShouldRateLimit").into_inner();
                assert!(
                    response.overall_code == i32::from(Code::Ok) && response.statuses.len() == 2,
                    "unexpected answer: {response:?}"
                );
            }
            Self::Direct { direct, subjects } => {
                let (address, user) = &subjects[n % subjects.len()];
                let checks = [
                    Check::new(direct.hasher.hash_for(&direct.address, address)),
                    Check::new(direct.hasher.hash_for(&direct.user, user)),
                ];
                let decision = direct.limiter.check_all(&checks).await.expect("check_all");
                assert!(
                    decision.permits_request(),
                    "direct RedisLimiter denied: the limits must always allow"
                );
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Measuring.

const WARMING: u8 = 0;
const MEASURING: u8 = 1;
const STOPPED: u8 = 2;

#[derive(Clone, Copy, Debug)]
struct Measurement {
    rate: f64,
    p50: Duration,
    p99: Duration,
}

fn histogram() -> Histogram<u64> {
    // Nanoseconds, 1 ns to 60 s, 3 significant digits.
    Histogram::new_with_bounds(1, 60_000_000_000, 3).expect("histogram bounds")
}

/// `tasks` closed-loop tasks calling through `row`: 1 s of warm-up, then `duration` measured.
/// A call counts when it completes inside the measured interval.
async fn measure(row: Row, tasks: usize, targets: &Arc<Targets>, duration: Duration) -> Measurement {
    let phase = Arc::new(AtomicU8::new(WARMING));
    let handles: Vec<_> = (0..tasks)
        .map(|task| {
            let (targets, phase) = (Arc::clone(targets), Arc::clone(&phase));
            tokio::spawn(async move {
                let mut caller = Caller::new(row, task, &targets);
                let mut latencies = histogram();
                let mut n = 0;
                loop {
                    if phase.load(Ordering::Relaxed) == STOPPED {
                        break;
                    }
                    let started = Instant::now();
                    caller.call(n).await;
                    if phase.load(Ordering::Relaxed) == MEASURING {
                        let nanos = u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX);
                        latencies.saturating_record(nanos.max(1));
                    }
                    n += 1;
                }
                latencies
            })
        })
        .collect();
    tokio::time::sleep(WARM_UP).await;
    phase.store(MEASURING, Ordering::Relaxed);
    let started = Instant::now();
    tokio::time::sleep(duration).await;
    phase.store(STOPPED, Ordering::Relaxed);
    let elapsed = started.elapsed();
    let mut latencies = histogram();
    for handle in handles {
        latencies.add(handle.await.expect("bench task")).expect("histograms of the same bounds");
    }
    #[allow(clippy::cast_precision_loss)]
    let rate = latencies.len() as f64 / elapsed.as_secs_f64();
    Measurement {
        rate,
        p50: Duration::from_nanos(latencies.value_at_quantile(0.5)),
        p99: Duration::from_nanos(latencies.value_at_quantile(0.99)),
    }
}

fn micros(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1e6
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    let middle = values.len() / 2;
    if values.len() % 2 == 1 { values[middle] } else { f64::midpoint(values[middle - 1], values[middle]) }
}

async fn run(settings: &Settings, targets: Arc<Targets>) {
    let duration = Duration::from_secs(settings.seconds);
    let rows: Vec<Row> = settings.rows.iter().copied().filter(|row| targets.has(*row)).collect();
    // The table's ratio of each target at `PAIR_TASKS`, then the extra pairs'.
    let mut pairs: Vec<(Row, Vec<f64>)> = Vec::new();
    for tasks in CONCURRENCY.into_iter().filter(|tasks| settings.tasks.is_none_or(|only| only == *tasks)) {
        let mut measured: Vec<(Row, Measurement)> = Vec::new();
        for &row in &rows {
            measured.push((row, measure(row, tasks, &targets, duration).await));
        }
        println!("\n{tasks} concurrent requests");
        println!(
            "{:<8} {:<28} {:>11} {:>9} {:>9}  throughput ratio",
            "row", "what", "requests/s", "p50 µs", "p99 µs"
        );
        for &(row, measurement) in &measured {
            let reference = row
                .reference()
                .and_then(|reference| measured.iter().find(|(other, _)| *other == reference))
                .map(|&(reference, of)| (reference, measurement.rate / of.rate));
            let mut ratio = reference.map_or_else(String::new, |(reference, ratio)| {
                format!("{ratio:.2}x {} (target: at least {TARGET}x)", reference.name())
            });
            let rate_of = |wanted| measured.iter().find(|(other, _)| *other == wanted).map(|(_, of)| of.rate);
            if row == Row::Redis
                && let (Some(floor), Some(direct)) = (rate_of(Row::Floor), rate_of(Row::Direct))
            {
                // A call's cost if the gRPC hop (the floor's) and the Redis call (direct's)
                // simply add up: its time at 1 task, its CPU once the cores are saturated.
                ratio.push_str(&format!("; additive bound {:.2}x", floor / (floor + direct)));
            }
            println!(
                "{:<8} {:<28} {:>11.0} {:>9.1} {:>9.1}  {ratio}",
                row.name(),
                row.description(),
                measurement.rate,
                micros(measurement.p50),
                micros(measurement.p99)
            );
            if tasks == PAIR_TASKS
                && let Some((_, ratio)) = reference
            {
                pairs.push((row, vec![ratio]));
            }
        }
    }

    if pairs.is_empty() {
        println!("\n(no {PAIR_TASKS}-task pair measured: the targets are not judged)");
        return;
    }
    if settings.rounds > 0 {
        println!("\n{} more alternating pairs at {PAIR_TASKS} tasks", settings.rounds);
    }
    for round in 1..=settings.rounds {
        let mut line = format!("round {round}:");
        for (row, ratios) in &mut pairs {
            let Some(reference) = row.reference() else { continue };
            let before = measure(reference, PAIR_TASKS, &targets, duration).await;
            let after = measure(*row, PAIR_TASKS, &targets, duration).await;
            let ratio = after.rate / before.rate;
            line.push_str(&format!(
                "  {} {:.0}/s, {} {:.0}/s: {ratio:.2}x;",
                reference.name(),
                before.rate,
                row.name(),
                after.rate
            ));
            ratios.push(ratio);
        }
        println!("{}", line.trim_end_matches(';'));
    }
    println!("\ntargets, at {PAIR_TASKS} tasks, on the median of the table's pair and the rounds':");
    for (row, ratios) in &mut pairs {
        let reference = row.reference().map_or("?", Row::name);
        let count = ratios.len();
        let middle = median(ratios);
        let verdict = if middle >= TARGET { "met" } else { "missed" };
        println!(
            "  {} / {} throughput ({}): median {middle:.2}x over {count} pairs (from {:.2}x to {:.2}x); \
             target at least {TARGET}x: {verdict}",
            row.name(),
            reference,
            if *row == Row::Memory {
                "runlimit-server memory mode / tonic floor"
            } else {
                "runlimit-server Redis mode / direct RedisLimiter"
            },
            ratios[0],
            ratios[count - 1]
        );
    }
    for wanted in [Row::Memory, Row::Redis] {
        if !pairs.iter().any(|(row, _)| *row == wanted) {
            println!(
                "  {} / {}: not measured, not judged",
                wanted.name(),
                wanted.reference().map_or("?", Row::name)
            );
        }
    }
}

fn runtime(name: &str, workers: usize) -> Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .thread_name(name)
        .enable_all()
        .build()
        .expect("tokio runtime")
}

fn main() {
    let settings = Settings::from_env();
    let cores = std::thread::available_parallelism().map_or(2, std::num::NonZero::get);
    let redis = start_redis();
    if redis.is_none() {
        println!(
            "(redis-server is not installed or did not start: no Redis rows, the Redis target is not judged)"
        );
    }
    let server_runtime = runtime("rls-server", cores);
    let client_runtime = runtime("rls-client", cores);
    let metrics =
        settings.metrics && server_runtime.block_on(async { runlimit_server::install_metrics().is_some() });

    let mut servers = server_runtime.block_on(start_servers(redis.as_ref().map(|redis| redis.url.as_str())));
    let per_server = settings.channels;
    let targets = client_runtime.block_on(async {
        let direct = match &redis {
            Some(redis) => direct(&redis.url).await.map(Arc::new),
            None => None,
        };
        let redis = match servers.redis {
            Some(address) => Some(channels(address, per_server).await),
            None => None,
        };
        Arc::new(Targets {
            floor: channels(servers.floor, per_server).await,
            memory: channels(servers.memory, per_server).await,
            redis,
            direct,
        })
    });
    println!(
        "runlimit-server RLS bench: {cores} cores shared by the client and the servers; {} s per row after a {} s \
         warm-up; {per_server} channel(s) per server; {VALUES_PER_TASK} (IP, user) pairs per task; Prometheus \
         recorder {}",
        settings.seconds,
        WARM_UP.as_secs(),
        if metrics { "installed" } else { "not installed" }
    );
    client_runtime.block_on(run(&settings, targets));

    drop(client_runtime);
    for stop in servers.stops.drain(..) {
        let _ = stop.send(());
    }
    server_runtime.block_on(async {
        for task in servers.tasks.drain(..) {
            let _ = tokio::time::timeout(Duration::from_secs(5), task).await;
        }
    });
    server_runtime.shutdown_timeout(Duration::from_secs(1));
    drop(redis);
}
