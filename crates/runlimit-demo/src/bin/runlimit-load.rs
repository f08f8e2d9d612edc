//! `runlimit-load`: a small, bounded HTTP/1.1 load client for the demo, loopback only.
//!
//! Runs `--concurrency` workers, each with its own keep-alive connection from a hyper-util
//! pool, sending requests back to back until `--duration-secs` elapse or `--requests` have
//! been sent, whichever comes first. Prints the request rate, latency percentiles (an
//! `hdrhistogram` of microseconds, 3 significant figures) and status counts.
//!
//! ```text
//! runlimit-load --url http://127.0.0.1:3000/items --concurrency 32 --duration-secs 10
//! runlimit-load --url http://127.0.0.1:3000/login --method POST \
//!     --body-template '{"identity":"user{n}@example.test","password":"x"}' --distinct 1000
//! ```
//!
//! The target must be a loopback address (`127.0.0.0/8`, `::1` or `localhost`): this tool
//! never sends traffic anywhere else. Why not `oha`/`wrk`: the demo wants a load generator
//! that builds with the workspace (`cargo run -p runlimit-demo --bin runlimit-load`) and
//! cannot be pointed off the machine by mistake; hyper-util and hdrhistogram do the work.

use std::{
    collections::BTreeMap,
    net::IpAddr,
    process::ExitCode,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use bytes::Bytes;
use clap::Parser;
use hdrhistogram::Histogram;
use http::{Method, Request, Uri, header::CONTENT_TYPE};
use http_body_util::{BodyExt as _, Full};
use hyper_util::{
    client::legacy::{Client, connect::HttpConnector},
    rt::TokioExecutor,
};

/// The most workers (and connections) one run may use.
const MAX_CONCURRENCY: usize = 1_024;
/// The longest run, in seconds.
const MAX_DURATION_SECS: u64 = 600;
/// The most requests one run may send.
const MAX_REQUESTS: u64 = 100_000_000;
/// The most distinct bodies a template may expand to.
const MAX_DISTINCT: u64 = 1_000_000;

/// Command-line options.
#[derive(Debug, Parser)]
#[command(name = "runlimit-load", version, about = "Bounded loopback HTTP/1.1 load client for runlimit-demo")]
struct Args {
    /// Target URL; its host must be a loopback address or `localhost`.
    #[arg(long)]
    url: Uri,
    /// HTTP method.
    #[arg(long, default_value = "GET")]
    method: Method,
    /// Request body (sent as application/json); `{n}` is replaced by the request number
    /// modulo --distinct.
    #[arg(long, value_name = "TEMPLATE")]
    body_template: Option<String>,
    /// How many distinct bodies `{n}` cycles through (1 to 1,000,000).
    #[arg(long, value_name = "N", default_value_t = 1)]
    distinct: u64,
    /// Concurrent workers, one connection each (1 to 1,024).
    #[arg(long, value_name = "N", default_value_t = 32)]
    concurrency: usize,
    /// Stop after this many seconds (1 to 600).
    #[arg(long, value_name = "SECONDS", default_value_t = 10)]
    duration_secs: u64,
    /// Stop after this many requests (at most 100,000,000), if reached before the duration.
    #[arg(long, value_name = "N")]
    requests: Option<u64>,
}

#[derive(Default)]
struct Tally {
    histogram: Option<Histogram<u64>>,
    statuses: BTreeMap<u16, u64>,
    errors: u64,
}

fn check_args(args: &Args) -> Result<(), String> {
    let host = args.url.host().ok_or("the URL has no host")?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let loopback =
        host.eq_ignore_ascii_case("localhost") || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback());
    if !loopback {
        return Err(format!("refusing to send load to {host}: only loopback targets are allowed"));
    }
    if args.url.scheme_str() != Some("http") {
        return Err("only http:// URLs are supported".to_owned());
    }
    if !(1..=MAX_CONCURRENCY).contains(&args.concurrency) {
        return Err(format!("--concurrency must be 1 to {MAX_CONCURRENCY}"));
    }
    if !(1..=MAX_DURATION_SECS).contains(&args.duration_secs) {
        return Err(format!("--duration-secs must be 1 to {MAX_DURATION_SECS}"));
    }
    if args.requests.is_some_and(|requests| requests == 0 || requests > MAX_REQUESTS) {
        return Err(format!("--requests must be 1 to {MAX_REQUESTS}"));
    }
    if !(1..=MAX_DISTINCT).contains(&args.distinct) {
        return Err(format!("--distinct must be 1 to {MAX_DISTINCT}"));
    }
    Ok(())
}

fn bodies(args: &Args) -> Vec<Bytes> {
    match &args.body_template {
        None => vec![Bytes::new()],
        Some(template) if template.contains("{n}") => {
            (0..args.distinct).map(|n| Bytes::from(template.replace("{n}", &n.to_string()))).collect()
        }
        Some(template) => vec![Bytes::from(template.clone())],
    }
}

async fn worker(
    client: Client<HttpConnector, Full<Bytes>>,
    args: Arc<Args>,
    bodies: Arc<Vec<Bytes>>,
    sent: Arc<AtomicU64>,
    deadline: Instant,
) -> Result<Tally, String> {
    let mut tally = Tally {
        histogram: Some(Histogram::new_with_bounds(1, 60_000_000, 3).map_err(|error| error.to_string())?),
        ..Tally::default()
    };
    let limit = args.requests.unwrap_or(u64::MAX);
    loop {
        if Instant::now() >= deadline {
            break;
        }
        let n = sent.fetch_add(1, Ordering::Relaxed);
        if n >= limit {
            break;
        }
        let body = bodies[usize::try_from(n % bodies.len() as u64).unwrap_or(0)].clone();
        let mut request = Request::builder().method(args.method.clone()).uri(args.url.clone());
        if args.body_template.is_some() {
            request = request.header(CONTENT_TYPE, "application/json");
        }
        let request = request.body(Full::new(body)).map_err(|error| error.to_string())?;
        let started = Instant::now();
        let outcome = match client.request(request).await {
            Ok(response) => {
                let status = response.status().as_u16();
                response.into_body().collect().await.map(|_| status).map_err(|_| ())
            }
            Err(_) => Err(()),
        };
        let micros = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX).max(1);
        match outcome {
            Ok(status) => {
                if let Some(histogram) = tally.histogram.as_mut() {
                    histogram.saturating_record(micros);
                }
                *tally.statuses.entry(status).or_default() += 1;
            }
            Err(()) => tally.errors += 1,
        }
    }
    Ok(tally)
}

fn millis(micros: u64) -> String {
    format!("{:.3}", micros as f64 / 1_000.0)
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    if let Err(message) = check_args(&args) {
        eprintln!("runlimit-load: {message}");
        return ExitCode::FAILURE;
    }
    let bodies = Arc::new(bodies(&args));
    let args = Arc::new(args);
    let client = Client::builder(TokioExecutor::new()).pool_max_idle_per_host(args.concurrency).build_http();
    let sent = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let deadline = started + Duration::from_secs(args.duration_secs);
    let workers: Vec<_> = (0..args.concurrency)
        .map(|_| {
            tokio::spawn(worker(
                client.clone(),
                Arc::clone(&args),
                Arc::clone(&bodies),
                Arc::clone(&sent),
                deadline,
            ))
        })
        .collect();

    let mut total = Tally::default();
    for worker in workers {
        let tally = match worker.await {
            Ok(Ok(tally)) => tally,
            Ok(Err(message)) => {
                eprintln!("runlimit-load: {message}");
                return ExitCode::FAILURE;
            }
            Err(error) => {
                eprintln!("runlimit-load: worker failed: {error}");
                return ExitCode::FAILURE;
            }
        };
        match (&mut total.histogram, tally.histogram) {
            (Some(into), Some(from)) => {
                if into.add(&from).is_err() {
                    eprintln!("runlimit-load: cannot merge histograms");
                    return ExitCode::FAILURE;
                }
            }
            (slot @ None, from) => *slot = from,
            (Some(_), None) => {}
        }
        for (status, count) in tally.statuses {
            *total.statuses.entry(status).or_default() += count;
        }
        total.errors += tally.errors;
    }
    let elapsed = started.elapsed().as_secs_f64();
    let Some(histogram) = total.histogram else {
        eprintln!("runlimit-load: no worker ran");
        return ExitCode::FAILURE;
    };
    let completed = histogram.len();
    let statuses: Vec<String> =
        total.statuses.iter().map(|(status, count)| format!("{status}={count}")).collect();
    println!(
        "runlimit-load: {} {} concurrency={} elapsed={elapsed:.2}s",
        args.method, args.url, args.concurrency
    );
    println!(
        "requests: {completed} completed, {} errors, {:.0} req/s",
        total.errors,
        completed as f64 / elapsed
    );
    println!(
        "latency ms: p50={} p90={} p99={} p99.9={} max={}",
        millis(histogram.value_at_quantile(0.50)),
        millis(histogram.value_at_quantile(0.90)),
        millis(histogram.value_at_quantile(0.99)),
        millis(histogram.value_at_quantile(0.999)),
        millis(histogram.max()),
    );
    println!("statuses: {}", statuses.join(" "));
    ExitCode::SUCCESS
}
