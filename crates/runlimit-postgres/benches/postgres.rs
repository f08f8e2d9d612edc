//! Throughput of `PostgresLimiter` against a plain autocommitted upsert, on the same server in
//! the same run.
//!
//! ```text
//! RUNLIMIT_POSTGRES_TEST_DATABASE_URL=postgres://postgres@127.0.0.1:5432/test \
//!     cargo bench -p runlimit-postgres
//! ```
//!
//! A documented bench binary (`harness = false`) rather than criterion: the figure of interest
//! is a ratio between two closed-loop throughputs at a given concurrency, which criterion's
//! per-iteration latency model does not report. For each concurrency (1, 8 and 32 tasks, each
//! task looping on its own keys through one shared pool of 32 connections) it measures, after
//! a warm-up, for `RUNLIMIT_BENCH_SECONDS` seconds (default 5) each:
//!
//! - `baseline`: one autocommitted `INSERT .. ON CONFLICT DO UPDATE SET used = used + 1` of a
//!   counter row per request (one round trip, one commit);
//! - `single`: `PostgresLimiter::check` of one key (always allowed);
//! - `batch2`: `PostgresLimiter::check_all` of two keys (always allowed);
//! - `gcra`: `PostgresGcraLimiter::check` of one key (always allowed);
//! - `gcra2`: `PostgresGcraLimiter::check_all` of two keys (always allowed).
//!
//! `RUNLIMIT_BENCH_TASKS=8` restricts the run to one concurrency. It prints requests/s, checks/s and the ratio to the baseline's requests/s. The bench
//! creates (and drops) its own database `runlimit_pg_bench`. Without the variable it prints a
//! notice and exits successfully.

use std::{
    str::FromStr,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use runlimit_core::{Check, FixedWindowPolicy, GcraPolicy, MAX_LIMIT, PolicyId, ScopeId, SubjectKey};
use runlimit_postgres::{PostgresGcraLimiter, PostgresLimiter};
use sqlx::{
    AssertSqlSafe, ConnectOptions, Connection, PgPool,
    postgres::{PgConnectOptions, PgPoolOptions},
};

const KEYS_PER_TASK: u64 = 64;
const CONCURRENCY: [usize; 3] = [1, 8, 32];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Workload {
    Baseline,
    Single,
    Batch2,
    Gcra,
    Gcra2,
}

impl Workload {
    fn name(self) -> &'static str {
        match self {
            Self::Baseline => "baseline",
            Self::Single => "single",
            Self::Batch2 => "batch2",
            Self::Gcra => "gcra",
            Self::Gcra2 => "gcra2",
        }
    }

    fn checks_per_request(self) -> u64 {
        match self {
            Self::Baseline | Self::Single | Self::Gcra => 1,
            Self::Batch2 | Self::Gcra2 => 2,
        }
    }
}

fn subject(task: usize, n: u64) -> SubjectKey {
    let mut digest = [0u8; 32];
    digest[..8].copy_from_slice(&(u64::try_from(task).unwrap_or(0) * 1_000_003 + n).to_le_bytes());
    digest[8..16].copy_from_slice(&n.to_be_bytes());
    digest[31] = 0x5A;
    SubjectKey::from_digest(digest)
}

/// The two fixed-window policies, the two GCRA policies and the GCRA limiter (on the same
/// pool as the fixed-window limiter).
type Setup = (FixedWindowPolicy, FixedWindowPolicy, GcraPolicy, GcraPolicy, PostgresGcraLimiter);

async fn run_task(
    workload: Workload,
    task: usize,
    pool: PgPool,
    limiter: Arc<PostgresLimiter>,
    policies: Arc<Setup>,
    stop: Arc<AtomicBool>,
    done: Arc<AtomicU64>,
) {
    let mut n = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let key = subject(task, n % KEYS_PER_TASK);
        match workload {
            Workload::Baseline => {
                let counter_key = Check::new(key.bind(&policies.0)).counter_key().to_bytes();
                sqlx::query(
                    "INSERT INTO bench_baseline (counter_key, used) VALUES ($1, 1) \
                     ON CONFLICT (counter_key) DO UPDATE SET used = bench_baseline.used + 1",
                )
                .bind(counter_key.as_slice())
                .execute(&pool)
                .await
                .expect("baseline upsert");
            }
            Workload::Single => {
                let decision = limiter.check(&Check::new(key.bind(&policies.0))).await.expect("check");
                assert!(decision.permits_request());
            }
            Workload::Batch2 => {
                let checks = [Check::new(key.bind(&policies.0)), Check::new(key.bind(&policies.1))];
                let decision = limiter.check_all(&checks).await.expect("check_all");
                assert!(decision.permits_request());
            }
            Workload::Gcra => {
                let decision =
                    policies.4.check(&Check::new(key.bind(&policies.2))).await.expect("gcra check");
                assert!(decision.permits_request());
            }
            Workload::Gcra2 => {
                let checks = [Check::new(key.bind(&policies.2)), Check::new(key.bind(&policies.3))];
                let decision = policies.4.check_all(&checks).await.expect("gcra check_all");
                assert!(decision.permits_request());
            }
        }
        done.fetch_add(1, Ordering::Relaxed);
        n += 1;
    }
}

/// Requests per second of `workload` at `tasks` concurrent tasks.
async fn measure(
    workload: Workload,
    tasks: usize,
    pool: &PgPool,
    limiter: &Arc<PostgresLimiter>,
    policies: &Arc<Setup>,
    warm_up: Duration,
    duration: Duration,
) -> f64 {
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let handles: Vec<_> = (0..tasks)
        .map(|task| {
            tokio::spawn(run_task(
                workload,
                task,
                pool.clone(),
                Arc::clone(limiter),
                Arc::clone(policies),
                Arc::clone(&stop),
                Arc::clone(&done),
            ))
        })
        .collect();
    tokio::time::sleep(warm_up).await;
    let before = done.load(Ordering::Relaxed);
    let started = Instant::now();
    tokio::time::sleep(duration).await;
    let after = done.load(Ordering::Relaxed);
    let elapsed = started.elapsed();
    stop.store(true, Ordering::Relaxed);
    for handle in handles {
        handle.await.expect("bench task");
    }
    #[allow(clippy::cast_precision_loss)]
    let rate = (after - before) as f64 / elapsed.as_secs_f64();
    rate
}

async fn admin_execute(admin: &PgConnectOptions, sql: String) {
    let mut connection = admin.connect().await.expect("connect to the admin database");
    sqlx::raw_sql(AssertSqlSafe(sql)).execute(&mut connection).await.expect("admin statement");
    connection.close().await.expect("close admin connection");
}

fn main() {
    let Ok(url) = std::env::var("RUNLIMIT_POSTGRES_TEST_DATABASE_URL") else {
        println!("runlimit-postgres bench skipped: set RUNLIMIT_POSTGRES_TEST_DATABASE_URL");
        return;
    };
    let seconds: u64 = std::env::var("RUNLIMIT_BENCH_SECONDS").ok().and_then(|s| s.parse().ok()).unwrap_or(5);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    runtime.block_on(async move {
        let admin = PgConnectOptions::from_str(&url).expect("valid database URL");
        let name = "runlimit_pg_bench";
        admin_execute(&admin, format!(r#"DROP DATABASE IF EXISTS "{name}" WITH (FORCE)"#)).await;
        admin_execute(&admin, format!(r#"CREATE DATABASE "{name}""#)).await;
        let pool = PgPoolOptions::new()
            .max_connections(32)
            .min_connections(32)
            .connect_with(admin.clone().database(name))
            .await
            .expect("bench pool");
        let limiter = Arc::new(PostgresLimiter::new(pool.clone()));
        limiter.migrate().await.expect("migrate");
        sqlx::raw_sql(
            "CREATE TABLE bench_baseline (counter_key bytea PRIMARY KEY, used bigint NOT NULL) \
             WITH (fillfactor = 80)",
        )
        .execute(&pool)
        .await
        .expect("baseline table");
        let policy = |scope: &str| {
            FixedWindowPolicy::new(
                PolicyId::new("bench").expect("id"),
                ScopeId::new(scope).expect("scope"),
                MAX_LIMIT,
                Duration::from_secs(3_600),
            )
            .expect("policy")
        };
        let gcra = PostgresGcraLimiter::new(pool.clone());
        gcra.migrate().await.expect("migrate gcra");
        // A million units per second with a burst of a million: always allowed at these rates.
        let gcra_policy = |scope: &str| {
            GcraPolicy::new(
                PolicyId::new("bench").expect("id"),
                ScopeId::new(scope).expect("scope"),
                1_000_000,
                Duration::from_secs(1),
                1_000_000,
            )
            .expect("gcra policy")
        };
        let policies =
            Arc::new((policy("first"), policy("second"), gcra_policy("first"), gcra_policy("second"), gcra));
        let server: String =
            sqlx::query_scalar("SELECT pg_catalog.version()").fetch_one(&pool).await.expect("version");
        println!("server: {server}");
        println!("measuring {seconds} s per row after a 1 s warm-up; pool of 32 connections\n");
        println!(
            "{:>5}  {:>8}  {:>12}  {:>12}  {:>16}",
            "tasks", "workload", "requests/s", "checks/s", "vs baseline req/s"
        );
        let only: Option<usize> = std::env::var("RUNLIMIT_BENCH_TASKS").ok().and_then(|s| s.parse().ok());
        let mut summary = Vec::new();
        for tasks in CONCURRENCY.into_iter().filter(|tasks| only.is_none_or(|only| only == *tasks)) {
            let mut baseline = 0.0;
            for workload in
                [Workload::Baseline, Workload::Single, Workload::Batch2, Workload::Gcra, Workload::Gcra2]
            {
                let rate = measure(
                    workload,
                    tasks,
                    &pool,
                    &limiter,
                    &policies,
                    Duration::from_secs(1),
                    Duration::from_secs(seconds),
                )
                .await;
                if workload == Workload::Baseline {
                    baseline = rate;
                }
                #[allow(clippy::cast_precision_loss)]
                let checks = rate * workload.checks_per_request() as f64;
                let ratio = rate / baseline;
                println!("{tasks:>5}  {:>8}  {rate:>12.0}  {checks:>12.0}  {ratio:>15.2}x", workload.name());
                summary.push((tasks, workload, ratio));
            }
        }
        if let Some((_, _, ratio)) =
            summary.iter().find(|(tasks, workload, _)| *tasks == 8 && *workload == Workload::Single)
        {
            let verdict = if *ratio >= 0.6 { "meets" } else { "misses" };
            println!("\nsingle check at 8 tasks: {ratio:.2}x the baseline ({verdict} the 0.6x target)");
        }
        if let Some((_, _, ratio)) =
            summary.iter().find(|(tasks, workload, _)| *tasks == 8 && *workload == Workload::Gcra)
        {
            let verdict = if *ratio >= 0.6 { "meets" } else { "misses" };
            println!("gcra single check at 8 tasks: {ratio:.2}x the baseline ({verdict} the 0.6x target)");
        }
        pool.close().await;
        admin_execute(&admin, format!(r#"DROP DATABASE IF EXISTS "{name}" WITH (FORCE)"#)).await;
    });
}
