//! The cost of a gate over real HTTP: requests per second of a route behind a GCRA gate with
//! the draft-11 fields against the same server's ungated route, measured by wrk.
//!
//! ```text
//! cargo bench -p runlimit-axum --bench gate
//! ```
//!
//! A documented bench binary (`harness = false`) rather than criterion: the figure of interest
//! is the ratio of two closed-loop throughputs measured by a load client nobody here wrote,
//! [wrk](https://github.com/wg/wrk) (Debian/Ubuntu: `apt-get install wrk`; the bench stops
//! with that hint when it is missing).
//!
//! The server is axum on a Tokio runtime of its own (as many workers as cores), listening on
//! a loopback port, serving the router of `benches/common/mod.rs`: `/ungated`, `/fields` (the
//! gated response's two fields written by the handler) and `/gated` (the crate's ten-line gate:
//! GCRA, `HeaderKey`, `ProblemRejections`, `AdmissionFieldsLayer`), all answering the same 5-byte
//! body; every response is `200`, and the bench checks one response of each route before
//! measuring.
//!
//! wrk sends the same request head to both (`x-api-key: bench-client`), with
//! `RUNLIMIT_BENCH_CONNECTIONS` connections (default 16) on one thread, for
//! `RUNLIMIT_BENCH_SECONDS` (default 3) per run after a 1 s warm-up of each route. Client and
//! server share the cores, so one pair moves with whatever else runs: the bench measures
//! `RUNLIMIT_BENCH_ROUNDS` (default 7) interleaved rounds, prints each, and judges the target (the
//! gated route at least 0.95x the ungated one) on the median ratio. Each round also measures
//! `GET /fields`, whose handler writes the two fields a gated response carries (same response
//! bytes, no gate), and prints the median gated/fields ratio: the share of the cost that is the
//! gate's code rather than the larger response, which wrk and the kernel handle too.
//!
//! Beside the throughputs, each run records the CPU time it cost, from `/proc/self/stat`: this
//! process's own (the server's worker threads; the main thread only waits for wrk) and that of
//! its finished children (the wrk run), divided by the requests wrk completed. The bench prints
//! the medians per route in microseconds per request and the gated and fields routes' excess
//! over the ungated one, so a missed target can be placed on the server or on the client that
//! shares its cores. Off Linux the CPU lines are left out.

use std::{
    net::SocketAddr,
    process::{Command, ExitCode},
};

mod common;

/// The target: gated throughput at least this fraction of ungated.
const TARGET: f64 = 0.95;

fn env_u64(name: &str, default: u64) -> Result<u64, String> {
    match std::env::var(name) {
        Ok(value) => value.parse().map_err(|_| format!("{name}={value} is not a whole number")),
        Err(_) => Ok(default),
    }
}

/// What one wrk run measured.
struct Run {
    /// Requests per second, as wrk reports them.
    rate: f64,
    /// Requests completed.
    requests: f64,
}

/// One wrk run against `url`.
fn wrk(url: &str, connections: u64, seconds: u64) -> Result<Run, String> {
    let output = Command::new("wrk")
        .args([
            "-t1",
            &format!("-c{connections}"),
            &format!("-d{seconds}s"),
            "-H",
            "x-api-key: bench-client",
            url,
        ])
        .output()
        .map_err(|error| {
            format!("cannot run wrk ({error}): install it (Debian/Ubuntu: apt-get install wrk)")
        })?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    if !output.status.success() {
        return Err(format!("wrk failed: {}{}", stdout, String::from_utf8_lossy(&output.stderr)));
    }
    if stdout.contains("Non-2xx") || stdout.contains("Socket errors") {
        return Err(format!("wrk saw errors:\n{stdout}"));
    }
    let rate = stdout
        .lines()
        .find_map(|line| line.strip_prefix("Requests/sec:"))
        .and_then(|rate| rate.trim().parse().ok());
    // "  312345 requests in 3.00s, 40.12MB read"
    let requests = stdout
        .lines()
        .find(|line| line.contains(" requests in "))
        .and_then(|line| line.split_whitespace().next())
        .and_then(|count| count.parse().ok());
    match (rate, requests) {
        (Some(rate), Some(requests)) => Ok(Run { rate, requests }),
        _ => Err(format!("no Requests/sec or request count in wrk's output:\n{stdout}")),
    }
}

/// Microseconds per clock tick of `/proc/<pid>/stat`: `USER_HZ` is 100 on x86 and ARM Linux.
const MICROS_PER_TICK: f64 = 10_000.0;

/// CPU time used so far, in clock ticks: this process's own (the server's worker threads; the
/// main thread only waits for wrk) and that of its waited-for children (every finished wrk
/// run), from `/proc/self/stat` (utime + stime, cutime + cstime). `None` off Linux.
fn cpu_ticks() -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the parenthesized command name start at field 3 (state).
    let fields: Vec<u64> =
        stat.rsplit_once(')')?.1.split_whitespace().skip(11).take(4).map_while(|f| f.parse().ok()).collect();
    match fields.as_slice() {
        [utime, stime, cutime, cstime] => Some((utime + stime, cutime + cstime)),
        _ => None,
    }
}

/// One measured run of a route: its throughput and, when `/proc` is readable, the server's
/// and wrk's CPU time per request in microseconds.
struct Measured {
    rate: f64,
    cpu: Option<(f64, f64)>,
}

fn measure(url: &str, connections: u64, seconds: u64) -> Result<Measured, String> {
    let before = cpu_ticks();
    let run = wrk(url, connections, seconds)?;
    let cpu = before.zip(cpu_ticks()).map(|((server, client), (server_after, client_after))| {
        let per_request = |ticks: u64| ticks as f64 * MICROS_PER_TICK / run.requests.max(1.0);
        (per_request(server_after - server), per_request(client_after - client))
    });
    Ok(Measured { rate: run.rate, cpu })
}

/// The head of one `GET` to `url` (status line and headers), by wrk's peer: a plain request.
async fn head(address: SocketAddr, path: &str) -> Result<String, String> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut stream = tokio::net::TcpStream::connect(address).await.map_err(|error| error.to_string())?;
    let request =
        format!("GET {path} HTTP/1.1\r\nhost: bench\r\nx-api-key: bench-client\r\nconnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.map_err(|error| error.to_string())?;
    let mut response = String::new();
    stream.read_to_string(&mut response).await.map_err(|error| error.to_string())?;
    Ok(response)
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    match values.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => values[n / 2],
        n => (values[n / 2 - 1] + values[n / 2]) / 2.0,
    }
}

fn run() -> Result<(), String> {
    let connections = env_u64("RUNLIMIT_BENCH_CONNECTIONS", 16)?;
    let seconds = env_u64("RUNLIMIT_BENCH_SECONDS", 3)?.max(1);
    let rounds = env_u64("RUNLIMIT_BENCH_ROUNDS", 7)?.max(1);

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|error| error.to_string())?;
    let app = common::router().map_err(|error| error.to_string())?;
    let address = runtime.block_on(async {
        let listener =
            tokio::net::TcpListener::bind("127.0.0.1:0").await.map_err(|error| error.to_string())?;
        let address = listener.local_addr().map_err(|error| error.to_string())?;
        tokio::spawn(async move { axum::serve(listener, app).await });
        Ok::<_, String>(address)
    })?;
    for (path, expected) in [
        ("/ungated", None),
        ("/fields", Some("ratelimit: \"items\";r=")),
        ("/gated", Some("ratelimit: \"items\";r=")),
    ] {
        let response = runtime.block_on(head(address, path))?;
        if !response.starts_with("HTTP/1.1 200 OK") || expected.is_some_and(|field| !response.contains(field))
        {
            return Err(format!("GET {path} answered unexpectedly:\n{response}"));
        }
    }
    let [ungated, fields, gated] =
        ["ungated", "fields", "gated"].map(|path| format!("http://{address}/{path}"));
    for url in [&ungated, &fields, &gated] {
        wrk(url, connections, 1)?;
    }

    println!(
        "GET /gated (GCRA gate + draft-11 fields) against GET /ungated, wrk -t1 -c{connections} -d{seconds}s, \
         {rounds} interleaved rounds (/fields: no gate, the gated response's two fields written by the handler)"
    );
    println!(
        "{:>5} {:>14} {:>14} {:>14} {:>9} {:>9}",
        "round", "ungated req/s", "fields req/s", "gated req/s", "gated/un", "gated/f"
    );
    let mut ratios = Vec::new();
    let mut against_fields = Vec::new();
    // Per route (ungated, fields, gated): server and wrk CPU microseconds per request.
    let mut cpu: [(Vec<f64>, Vec<f64>); 3] = Default::default();
    for round in 1..=rounds {
        let base = measure(&ungated, connections, seconds)?;
        let same_bytes = measure(&fields, connections, seconds)?;
        let with_gate = measure(&gated, connections, seconds)?;
        for (route, run) in [&base, &same_bytes, &with_gate].into_iter().enumerate() {
            if let Some((server, client)) = run.cpu {
                cpu[route].0.push(server);
                cpu[route].1.push(client);
            }
        }
        let (base, same_bytes, with_gate) = (base.rate, same_bytes.rate, with_gate.rate);
        ratios.push(with_gate / base);
        against_fields.push(with_gate / same_bytes);
        println!(
            "{round:>5} {base:>14.0} {same_bytes:>14.0} {with_gate:>14.0} {:>8.2}x {:>8.2}x",
            with_gate / base,
            with_gate / same_bytes
        );
    }
    if cpu.iter().all(|(server, _)| server.len() as u64 == rounds) {
        let [ungated_cpu, fields_cpu, gated_cpu] =
            cpu.map(|(mut server, mut client)| (median(&mut server), median(&mut client)));
        println!(
            "CPU per request, medians (server: this process's worker threads; client: wrk, which \
             shares the cores):"
        );
        for (route, (server, client)) in
            [("ungated", ungated_cpu), ("fields", fields_cpu), ("gated", gated_cpu)]
        {
            println!("  {route:<8} server {server:>6.2} µs   wrk {client:>6.2} µs");
        }
        println!(
            "  gated - ungated: server {:+.2} µs, wrk {:+.2} µs; fields - ungated: server {:+.2} µs, wrk {:+.2} µs",
            gated_cpu.0 - ungated_cpu.0,
            gated_cpu.1 - ungated_cpu.1,
            fields_cpu.0 - ungated_cpu.0,
            fields_cpu.1 - ungated_cpu.1,
        );
    }
    println!(
        "median gated/fields: {:.2}x (the gate's own cost; the rest is the two fields' bytes)",
        median(&mut against_fields)
    );
    let ratio = median(&mut ratios);
    let verdict = if ratio >= TARGET { "met" } else { "missed" };
    println!("median gated/ungated: {ratio:.2}x (target >= {TARGET:.2}x: {verdict})");
    Ok(())
}

fn main() -> ExitCode {
    // `cargo test --benches` and `cargo bench -- --list` pass arguments: build-check only.
    if std::env::args().skip(1).any(|argument| argument == "--list" || argument == "--test") {
        return ExitCode::SUCCESS;
    }
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("gate bench: {message}");
            ExitCode::FAILURE
        }
    }
}
