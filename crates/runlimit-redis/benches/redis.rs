//! Throughput of `RedisLimiter` and `RedisGcraLimiter` against a minimal one-key Lua counter
//! on the same client, and against `PostgresLimiter`, in one run; then Redis memory per live
//! key at 1,000,000 keys.
//!
//! ```text
//! RUNLIMIT_POSTGRES_TEST_DATABASE_URL=postgres://postgres@127.0.0.1:5432/test \
//!     cargo bench -p runlimit-redis
//! ```
//!
//! A documented bench binary (`harness = false`) rather than criterion: the figures of
//! interest are ratios between closed-loop throughputs at a given concurrency. It starts its
//! own `redis-server` on a free loopback port (nothing persisted; `redis-server` must be
//! installed, else it prints a notice and exits successfully), so its figures do not depend on
//! what else a shared server holds. For each concurrency (1, 8 and 32 tasks, each looping on
//! 64 keys of its own; every Redis workload shares one multiplexed connection, as the limiter
//! does) it measures, after a 1 s warm-up, for `RUNLIMIT_BENCH_SECONDS` seconds (default 4)
//! each:
//!
//! - `baseline`: the same redis-rs multiplexed connection running a minimal Lua script per
//!   request with `EVALSHA`: `INCR` of one key and `PEXPIRE` of it (what a naive fixed window
//!   sends, without bounds, batches or server time);
//! - `fixed`: `RedisLimiter::check` of one key (always allowed);
//! - `fixed2`: `RedisLimiter::check_all` of two keys, one subject key bound to two policies
//!   (always allowed);
//! - `gcra`, `gcra2`: the same for `RedisGcraLimiter`;
//! - `tls`: `RedisLimiter::check` of one key over TLS (`rediss://`, rustls) to the same server's
//!   TLS port, with a CA and server certificate the bench generates;
//! - `postgres`: `PostgresLimiter::check` of one key through a pool of 32 connections, when
//!   `RUNLIMIT_POSTGRES_TEST_DATABASE_URL` is set (database `runlimit_redis_bench`, created
//!   and dropped).
//!
//! `RUNLIMIT_BENCH_TASKS=8` restricts the run to one concurrency, and
//! `RUNLIMIT_BENCH_WORKLOADS=baseline,fixed` to the workloads named (for profiling one). At 8
//! tasks it then measures `RUNLIMIT_BENCH_ROUNDS` (default 6) more pairs, the baseline then a
//! fixed-window check, and judges the 0.8x target on the median ratio of all the pairs: client
//! and server share a small machine's cores, so one pair moves with whatever else runs. Likewise
//! it reports the median ratio of a TLS check to a plain check over as many alternating pairs at
//! 8 tasks. Then it fills a fresh
//! limiter with 1,000,000 distinct keys (`RUNLIMIT_BENCH_KEYS` to change) and reports the
//! server's `used_memory` growth per live key.

use std::{
    net::TcpListener,
    process::{Child, Command, Stdio},
    str::FromStr,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use redis::aio::MultiplexedConnection;
use runlimit_core::{Check, FixedWindowPolicy, GcraPolicy, PolicyId, ScopeId, SubjectKey};
use runlimit_postgres::PostgresLimiter;
use runlimit_redis::{RedisConfig, RedisConnector, RedisGcraLimiter, RedisLimiter, RedisTls};
use sqlx::{
    AssertSqlSafe, ConnectOptions, Connection,
    postgres::{PgConnectOptions, PgPoolOptions},
};

const KEYS_PER_TASK: u64 = 64;
const CONCURRENCY: [usize; 3] = [1, 8, 32];

const BASELINE: &str = "local n = redis.call('INCR', KEYS[1]) redis.call('PEXPIRE', KEYS[1], 60000) return n";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Workload {
    Baseline,
    Fixed,
    Fixed2,
    Gcra,
    Gcra2,
    Tls,
    Postgres,
}

impl Workload {
    fn name(self) -> &'static str {
        match self {
            Self::Baseline => "baseline",
            Self::Fixed => "fixed",
            Self::Fixed2 => "fixed2",
            Self::Gcra => "gcra",
            Self::Gcra2 => "gcra2",
            Self::Tls => "tls",
            Self::Postgres => "postgres",
        }
    }

    fn checks_per_request(self) -> u64 {
        match self {
            Self::Fixed2 | Self::Gcra2 => 2,
            _ => 1,
        }
    }
}

fn subject(task: usize, n: u64) -> SubjectKey {
    let mut digest = [0u8; 32];
    let id = u64::try_from(task).unwrap_or(0) * 1_000_003 + n;
    // Spread over shards and buckets like HMAC output would be.
    digest[..8].copy_from_slice(&id.wrapping_mul(0x9E37_79B9_7F4A_7C15).to_be_bytes());
    digest[8..16].copy_from_slice(&id.to_le_bytes());
    SubjectKey::from_digest(digest)
}

struct Setup {
    fixed: (FixedWindowPolicy, FixedWindowPolicy),
    gcra: (GcraPolicy, GcraPolicy),
    limiter: RedisLimiter,
    gcra_limiter: RedisGcraLimiter,
    tls_limiter: RedisLimiter,
    baseline: MultiplexedConnection,
    baseline_sha: String,
    postgres: Option<PostgresLimiter>,
}

async fn request(workload: Workload, setup: &Setup, task: usize, n: u64) {
    let key = subject(task, n % KEYS_PER_TASK);
    let permitted = match workload {
        Workload::Baseline => {
            let mut connection = setup.baseline.clone();
            let name = format!("bench:baseline:{task}:{}", n % KEYS_PER_TASK);
            let _: i64 = redis::cmd("EVALSHA")
                .arg(&setup.baseline_sha)
                .arg(1)
                .arg(name)
                .query_async(&mut connection)
                .await
                .expect("baseline script");
            true
        }
        Workload::Fixed => {
            setup.limiter.check(&Check::new(key.bind(&setup.fixed.0))).await.expect("check").permits_request()
        }
        Workload::Tls => setup
            .tls_limiter
            .check(&Check::new(key.bind(&setup.fixed.0)))
            .await
            .expect("TLS check")
            .permits_request(),
        Workload::Fixed2 => {
            let checks = [Check::new(key.bind(&setup.fixed.0)), Check::new(key.bind(&setup.fixed.1))];
            setup.limiter.check_all(&checks).await.expect("check_all").permits_request()
        }
        Workload::Gcra => setup
            .gcra_limiter
            .check(&Check::new(key.bind(&setup.gcra.0)))
            .await
            .expect("gcra check")
            .permits_request(),
        Workload::Gcra2 => {
            let checks = [Check::new(key.bind(&setup.gcra.0)), Check::new(key.bind(&setup.gcra.1))];
            setup.gcra_limiter.check_all(&checks).await.expect("gcra check_all").permits_request()
        }
        Workload::Postgres => {
            let limiter = setup.postgres.as_ref().expect("a PostgreSQL limiter");
            limiter
                .check(&Check::new(key.bind(&setup.fixed.0)))
                .await
                .expect("postgres check")
                .permits_request()
        }
    };
    assert!(permitted, "{} denied: the bench's policies must always allow", workload.name());
}

/// The server's `cmdstat_evalsha` microseconds per call since the last `CONFIG RESETSTAT`.
async fn evalsha_micros(connection: &mut MultiplexedConnection) -> Option<f64> {
    let info: String = redis::cmd("INFO").arg("commandstats").query_async(connection).await.ok()?;
    let line = info.lines().find_map(|line| line.strip_prefix("cmdstat_evalsha:"))?;
    line.split(',').find_map(|field| field.strip_prefix("usec_per_call="))?.trim().parse().ok()
}

/// Requests per second of `workload` at `tasks` concurrent tasks, and the server's
/// microseconds per script call during the measurement (Redis workloads).
async fn measure(
    workload: Workload,
    tasks: usize,
    setup: &Arc<Setup>,
    duration: Duration,
) -> (f64, Option<f64>) {
    let mut stats = setup.baseline.clone();
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let handles: Vec<_> = (0..tasks)
        .map(|task| {
            let (setup, stop, done) = (Arc::clone(setup), Arc::clone(&stop), Arc::clone(&done));
            tokio::spawn(async move {
                let mut n = 0;
                while !stop.load(Ordering::Relaxed) {
                    request(workload, &setup, task, n).await;
                    done.fetch_add(1, Ordering::Relaxed);
                    n += 1;
                }
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let () = redis::cmd("CONFIG").arg("RESETSTAT").query_async(&mut stats).await.expect("CONFIG RESETSTAT");
    let before = done.load(Ordering::Relaxed);
    let started = Instant::now();
    tokio::time::sleep(duration).await;
    let after = done.load(Ordering::Relaxed);
    let elapsed = started.elapsed();
    let micros = if workload == Workload::Postgres { None } else { evalsha_micros(&mut stats).await };
    stop.store(true, Ordering::Relaxed);
    for handle in handles {
        handle.await.expect("bench task");
    }
    #[allow(clippy::cast_precision_loss)]
    let rate = (after - before) as f64 / elapsed.as_secs_f64();
    (rate, micros)
}

/// A private `redis-server`, killed on drop, with a TLS port presenting a certificate for
/// `127.0.0.1` that `ca` (PEM) issued.
struct Server {
    child: Child,
    url: String,
    tls_url: String,
    ca: String,
    _certificates: tempfile::TempDir,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> Option<u16> {
    Some(TcpListener::bind("127.0.0.1:0").ok()?.local_addr().ok()?.port())
}

fn start_server() -> Option<Server> {
    let port = free_port()?;
    let tls_port = free_port()?;
    let directory = tempfile::tempdir().ok()?;
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).ok()?;
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca = rcgen::CertifiedIssuer::self_signed(ca_params, rcgen::KeyPair::generate().ok()?).ok()?;
    let key = rcgen::KeyPair::generate().ok()?;
    let certificate =
        rcgen::CertificateParams::new(vec!["127.0.0.1".to_owned()]).ok()?.signed_by(&key, &ca).ok()?;
    let (cert_file, key_file) = (directory.path().join("server.pem"), directory.path().join("server.key"));
    std::fs::write(&cert_file, certificate.pem()).ok()?;
    std::fs::write(&key_file, key.serialize_pem()).ok()?;
    let child = Command::new("redis-server")
        .args(["--bind", "127.0.0.1", "--port", &port.to_string(), "--save", "", "--appendonly", "no"])
        .args(["--tls-port", &tls_port.to_string(), "--tls-auth-clients", "no"])
        .arg("--tls-cert-file")
        .arg(&cert_file)
        .arg("--tls-key-file")
        .arg(&key_file)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    let server = Server {
        child,
        url: format!("redis://127.0.0.1:{port}"),
        tls_url: format!("rediss://127.0.0.1:{tls_port}"),
        ca: ca.pem(),
        _certificates: directory,
    };
    for _ in 0..100 {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return Some(server);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    None
}

async fn used_memory(connection: &mut MultiplexedConnection) -> u64 {
    let info: String = redis::cmd("INFO").arg("memory").query_async(connection).await.expect("INFO memory");
    info.lines()
        .find_map(|line| line.strip_prefix("used_memory:"))
        .and_then(|value| value.trim().parse().ok())
        .expect("used_memory in INFO")
}

async fn admin_execute(admin: &PgConnectOptions, sql: String) {
    let mut connection = admin.connect().await.expect("connect to the admin database");
    sqlx::raw_sql(AssertSqlSafe(sql)).execute(&mut connection).await.expect("admin statement");
    connection.close().await.expect("close admin connection");
}

fn policies(scope: &str) -> (FixedWindowPolicy, GcraPolicy) {
    // A limit no run reaches (10^12 units per hour). Limits of at most 15 digits, which every
    // realistic policy has, take the scripts' plain-number path; the exact limb path for larger
    // ones is slower.
    let fixed = FixedWindowPolicy::new(
        PolicyId::new("bench").expect("id"),
        ScopeId::new(scope).expect("scope"),
        1_000_000_000_000,
        Duration::from_secs(3_600),
    )
    .expect("policy");
    // A million units per second with a burst of a million: always allowed at these rates.
    let gcra = GcraPolicy::new(
        PolicyId::new("bench").expect("id"),
        ScopeId::new(scope).expect("scope"),
        1_000_000,
        Duration::from_secs(1),
        1_000_000,
    )
    .expect("gcra policy");
    (fixed, gcra)
}

/// `RUNLIMIT_BENCH_ROUNDS`: the alternating pairs measured for a verdict (default 6).
fn bench_rounds() -> usize {
    std::env::var("RUNLIMIT_BENCH_ROUNDS").ok().and_then(|s| s.parse().ok()).unwrap_or(6)
}

/// Sorts `ratios` and returns their median (`ratios` is never empty here).
fn sorted_median(ratios: &mut [f64]) -> f64 {
    ratios.sort_by(f64::total_cmp);
    let middle = ratios.len() / 2;
    if ratios.len() % 2 == 1 { ratios[middle] } else { (ratios[middle - 1] + ratios[middle]) / 2.0 }
}

fn main() {
    let Some(server) = start_server() else {
        println!("runlimit-redis bench skipped: redis-server is not installed or did not start");
        return;
    };
    let seconds: u64 = std::env::var("RUNLIMIT_BENCH_SECONDS").ok().and_then(|s| s.parse().ok()).unwrap_or(4);
    let only: Option<usize> = std::env::var("RUNLIMIT_BENCH_TASKS").ok().and_then(|s| s.parse().ok());
    let fill: u64 =
        std::env::var("RUNLIMIT_BENCH_KEYS").ok().and_then(|s| s.parse().ok()).unwrap_or(1_000_000);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    let url = server.url.clone();
    let (tls_url, ca) = (server.tls_url.clone(), server.ca.clone());
    runtime.block_on(async move {
        let client = redis::Client::open(url.as_str()).expect("server URL");
        let mut baseline = client.get_multiplexed_async_connection().await.expect("baseline connection");
        let baseline_sha: String =
            redis::cmd("SCRIPT").arg("LOAD").arg(BASELINE).query_async(&mut baseline).await.expect("SCRIPT LOAD");
        let limiter = RedisLimiter::new(&url).expect("URL");
        limiter.prepare().await.expect("prepare");
        let gcra_limiter = RedisGcraLimiter::new(&url).expect("URL");
        gcra_limiter.prepare().await.expect("prepare");
        let tls = RedisTls::with_ca_pem(ca.as_bytes()).expect("the bench CA");
        let tls_limiter = RedisLimiter::from_connector(&RedisConnector::with_tls(&tls_url, tls).expect("a rediss URL"))
            .with_config(RedisConfig::default().with_key_prefix(runlimit_redis::KeyPrefix::new("tls").expect("prefix")));
        tls_limiter.prepare().await.expect("prepare over TLS");
        let version: String = redis::cmd("INFO").arg("server").query_async(&mut baseline).await.expect("INFO");
        let version = version.lines().find_map(|line| line.strip_prefix("redis_version:")).unwrap_or("?").trim().to_owned();

        let postgres_url = std::env::var("RUNLIMIT_POSTGRES_TEST_DATABASE_URL").ok();
        let mut postgres = None;
        let admin = postgres_url.as_deref().map(|url| PgConnectOptions::from_str(url).expect("valid database URL"));
        let name = "runlimit_redis_bench";
        if let Some(admin) = &admin {
            admin_execute(admin, format!(r#"DROP DATABASE IF EXISTS "{name}" WITH (FORCE)"#)).await;
            admin_execute(admin, format!(r#"CREATE DATABASE "{name}""#)).await;
            let pool = PgPoolOptions::new()
                .max_connections(32)
                .min_connections(32)
                .connect_with(admin.clone().database(name))
                .await
                .expect("bench pool");
            let limiter = PostgresLimiter::new(pool);
            limiter.migrate().await.expect("migrate");
            postgres = Some(limiter);
        } else {
            println!("(RUNLIMIT_POSTGRES_TEST_DATABASE_URL is not set: no PostgresLimiter row)");
        }
        let (first, gcra_first) = policies("first");
        let (second, gcra_second) = policies("second");
        let setup = Arc::new(Setup {
            fixed: (first, second),
            gcra: (gcra_first, gcra_second),
            limiter,
            gcra_limiter,
            tls_limiter,
            baseline,
            baseline_sha,
            postgres,
        });

        println!("Redis {version} (private server), {seconds} s per row after a 1 s warm-up\n");
        println!(
            "{:>5}  {:>8}  {:>12}  {:>12}  {:>11}  {:>11}  {:>14}",
            "tasks", "workload", "requests/s", "checks/s", "vs baseline", "vs postgres", "server µs/call"
        );
        let mut summary = Vec::new();
        let mut workloads =
            vec![Workload::Baseline, Workload::Fixed, Workload::Fixed2, Workload::Gcra, Workload::Gcra2, Workload::Tls];
        if setup.postgres.is_some() {
            workloads.push(Workload::Postgres);
        }
        if let Ok(only) = std::env::var("RUNLIMIT_BENCH_WORKLOADS") {
            workloads.retain(|workload| only.split(',').any(|name| name.trim() == workload.name()));
        }
        for tasks in CONCURRENCY.into_iter().filter(|tasks| only.is_none_or(|only| only == *tasks)) {
            let mut rates = Vec::new();
            for &workload in &workloads {
                rates.push((workload, measure(workload, tasks, &setup, Duration::from_secs(seconds)).await));
            }
            let rate_of = |wanted| rates.iter().find(|(workload, _)| *workload == wanted).map(|(_, (rate, _))| *rate);
            let baseline = rate_of(Workload::Baseline).unwrap_or(f64::NAN);
            let postgres = rate_of(Workload::Postgres);
            for &(workload, (rate, micros)) in &rates {
                #[allow(clippy::cast_precision_loss)]
                let checks = rate * workload.checks_per_request() as f64;
                let versus = postgres.map_or_else(|| "-".to_owned(), |postgres| format!("{:.1}x", rate / postgres));
                let micros = micros.map_or_else(|| "-".to_owned(), |micros| format!("{micros:.2}"));
                println!(
                    "{tasks:>5}  {:>8}  {rate:>12.0}  {checks:>12.0}  {:>10.2}x  {versus:>11}  {micros:>14}",
                    workload.name(),
                    rate / baseline
                );
                summary.push((tasks, workload, rate / baseline, postgres.map(|postgres| rate / postgres)));
            }
        }
        if let Some((_, _, ratio, versus)) = summary.iter().find(|(tasks, workload, _, _)| *tasks == 8 && *workload == Workload::Fixed) {
            // On a small machine the client and the server share the cores, and one pair of
            // measurements moves with whatever else runs: the target is judged on the median
            // of the table's pair and `rounds` more pairs, each baseline then check.
            let rounds = bench_rounds();
            let mut ratios = vec![*ratio];
            if workloads.contains(&Workload::Baseline) {
                for round in 1..=rounds {
                    let duration = Duration::from_secs(seconds);
                    let (baseline, _) = measure(Workload::Baseline, 8, &setup, duration).await;
                    let (fixed, _) = measure(Workload::Fixed, 8, &setup, duration).await;
                    println!("round {round} at 8 tasks: baseline {baseline:.0}/s, fixed {fixed:.0}/s, {:.2}x", fixed / baseline);
                    ratios.push(fixed / baseline);
                }
            }
            let median = sorted_median(&mut ratios);
            let verdict = if median >= 0.8 { "meets" } else { "misses" };
            println!(
                "\nfixed single check at 8 tasks: median {median:.2}x the baseline over {} alternating pairs \
                 (from {:.2}x to {:.2}x; {verdict} the 0.8x target)",
                ratios.len(),
                ratios[0],
                ratios[ratios.len() - 1]
            );
            if let Some(versus) = versus {
                let verdict = if *versus >= 10.0 { "meets" } else { "misses" };
                println!("fixed single check at 8 tasks: {versus:.1}x PostgresLimiter ({verdict} the 10x target)");
            }
        }
        if workloads.contains(&Workload::Tls) && workloads.contains(&Workload::Fixed) && only.is_none_or(|only| only == 8) {
            // The same judgement for TLS: alternating pairs, plain then TLS, on one server.
            let rounds = bench_rounds();
            let mut ratios = Vec::new();
            for round in 1..=rounds.max(1) {
                let duration = Duration::from_secs(seconds);
                let (plain, _) = measure(Workload::Fixed, 8, &setup, duration).await;
                let (tls, _) = measure(Workload::Tls, 8, &setup, duration).await;
                println!("round {round} at 8 tasks: plain {plain:.0}/s, TLS {tls:.0}/s, {:.2}x", tls / plain);
                ratios.push(tls / plain);
            }
            let median = sorted_median(&mut ratios);
            println!(
                "\nTLS single check at 8 tasks: median {median:.2}x a plain check over {} alternating pairs (from \
                 {:.2}x to {:.2}x)",
                ratios.len(),
                ratios[0],
                ratios[ratios.len() - 1]
            );
        }

        // Memory per live key: a fresh limiter (own prefix) filled with `fill` distinct keys.
        let mut connection = client.get_multiplexed_async_connection().await.expect("connection");
        let before = used_memory(&mut connection).await;
        let config = RedisConfig::default()
            .with_key_prefix(runlimit_redis::KeyPrefix::new("fill").expect("prefix"))
            .with_maximum_keys_per_shard(16_384)
            .expect("bound");
        let filler = Arc::new(RedisLimiter::new(&url).expect("URL").with_config(config));
        let policy = Arc::new(setup.fixed.0.clone());
        let next = Arc::new(AtomicU64::new(0));
        let started = Instant::now();
        let handles: Vec<_> = (0..32)
            .map(|_| {
                let (filler, policy, next) = (Arc::clone(&filler), Arc::clone(&policy), Arc::clone(&next));
                tokio::spawn(async move {
                    loop {
                        let n = next.fetch_add(1, Ordering::Relaxed);
                        if n >= fill {
                            break;
                        }
                        let key = subject(7_777, n);
                        let decision = filler.check(&Check::new(key.bind(&*policy))).await.expect("fill check");
                        assert!(decision.permits_request(), "fill denied");
                    }
                })
            })
            .collect();
        for handle in handles {
            handle.await.expect("fill task");
        }
        let after = used_memory(&mut connection).await;
        #[allow(clippy::cast_precision_loss)]
        let per_key = after.saturating_sub(before) as f64 / fill as f64;
        let verdict = if per_key <= 200.0 { "meets" } else { "misses" };
        println!(
            "\nmemory: {fill} live keys in {:.1} s, used_memory +{} bytes = {per_key:.1} bytes per live key ({verdict} the 200-byte target)",
            started.elapsed().as_secs_f64(),
            after.saturating_sub(before)
        );

        if let (Some(admin), Some(postgres)) = (&admin, &setup.postgres) {
            postgres.pool().close().await;
            admin_execute(admin, format!(r#"DROP DATABASE IF EXISTS "{name}" WITH (FORCE)"#)).await;
        }
    });
    drop(server);
}
