//! `MemoryStore`, `GcraStore` and governor's keyed limiter on the same workloads.
//!
//! Run with `cargo bench -p runlimit-memory`. Workloads (each store configured with 64 shards;
//! every check is allowed, so the hot path is measured):
//!
//! - `single_threaded/*`: one thread checking 10,000 hot keys in a scattered order.
//!   Fixed windows allow `MAX_LIMIT` per hour; GCRA and governor 100 units per hour with a
//!   burst of 1,000,000, so every check is allowed and every key stays live.
//! - `multi_threaded/*`: two threads checking the same 10,000 keys; time is wall-clock per
//!   check across both threads (aggregate throughput).
//! - `flood/*`: 1,000,000 distinct keys, each checked once, into a fresh limiter (insertion
//!   cost; chunks of 1,000,000 when criterion asks for more iterations).
//! - `batch/*`: a two-check atomic `check_all` over two policies (20,000 entries in all).
//!   governor has no atomic batch, so its figure is two independent `check_key` calls on two
//!   keyed limiters. `batch/*_two_checks` makes the same two checks independently with each
//!   store, isolating the cost of atomicity on the same working set.
//!
//! After criterion finishes, the bench prints a summary: ns per check for each limiter, the
//! ratio to governor, the batch-to-single ratio, and resident memory per key with 1,000,000
//! live keys. Memory is measured in a fresh child process per limiter (this binary re-run
//! with `RUNLIMIT_BENCH_MEMORY_PROBE` set), as the growth of `VmRSS` in `/proc/self/status`
//! across building the limiter and inserting the keys; keys are generated on the fly.

use std::{
    collections::BTreeSet,
    hint::black_box,
    num::NonZeroU32,
    path::PathBuf,
    process::Command,
    sync::{Barrier, Mutex},
    thread,
    time::{Duration, Instant},
};

use criterion::{Criterion, Throughput};
use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};
use runlimit_core::{Check, FixedWindowPolicy, GcraPolicy, MAX_LIMIT, PolicyId, ScopeId, SubjectKey};
use runlimit_memory::{GcraStore, MemoryStore, MemoryStoreConfig};

const HOT_KEYS: u64 = 10_000;
/// A prime stride that visits all hot keys in a scattered order.
const STRIDE: u64 = 7_919;
const FLOOD_KEYS: u64 = 1_000_000;
const SHARDS: usize = 64;
/// 64 × 16,384: every shard can hold its share of 1,000,000 uniform keys (mean 15,625,
/// standard deviation about 124).
const MAX_KEYS: usize = 1_048_576;
const PROBE_ENV: &str = "RUNLIMIT_BENCH_MEMORY_PROBE";

/// A uniform 32-byte digest for key number `n` (splitmix64), standing in for an HMAC output.
fn digest(n: u64) -> [u8; 32] {
    let mut state = n.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 0x5851_f42d_4c95_7f2d;
    let mut out = [0u8; 32];
    for chunk in out.chunks_exact_mut(8) {
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        chunk.copy_from_slice(&(z ^ (z >> 31)).to_le_bytes());
    }
    out
}

fn fixed_policy(id: &str) -> FixedWindowPolicy {
    FixedWindowPolicy::new(
        PolicyId::new(id).unwrap(),
        ScopeId::new("bench").unwrap(),
        MAX_LIMIT,
        Duration::from_secs(3_600),
    )
    .unwrap()
}

/// 100 units per hour (one every 36 s), burst 1,000,000: every check in a run is allowed, and
/// a key that spent one unit stays live (not yet fully rested) for 36 s, so the memory probe
/// measures live keys.
fn gcra_policy(id: &str) -> GcraPolicy {
    GcraPolicy::new(
        PolicyId::new(id).unwrap(),
        ScopeId::new("bench").unwrap(),
        100,
        Duration::from_secs(3_600),
        1_000_000,
    )
    .unwrap()
}

fn config() -> MemoryStoreConfig {
    MemoryStoreConfig::new(MAX_KEYS).and_then(|config| config.with_shard_count(SHARDS)).unwrap()
}

/// The same rate as [`gcra_policy`]: one unit every 36 s, burst 1,000,000.
fn governor() -> DefaultKeyedRateLimiter<[u8; 32]> {
    let burst = NonZeroU32::new(1_000_000).unwrap();
    RateLimiter::keyed(Quota::with_period(Duration::from_secs(36)).unwrap().allow_burst(burst))
}

/// One limiter under test, behind a uniform "check key n" interface.
trait Subject: Sync {
    fn check(&self, digest: &[u8; 32]) -> bool;
    /// An atomic two-check batch (governor: two independent checks).
    fn check_pair(&self, digest: &[u8; 32]) -> bool;
    /// The same two checks as two independent single checks.
    fn check_two(&self, digest: &[u8; 32]) -> bool;
}

struct Fixed {
    store: MemoryStore,
    first: FixedWindowPolicy,
    second: FixedWindowPolicy,
}

impl Subject for Fixed {
    fn check(&self, digest: &[u8; 32]) -> bool {
        let check = Check::new(SubjectKey::from_digest(*digest).bind(&self.first));
        self.store.check(&check).unwrap().permits_request()
    }
    fn check_pair(&self, digest: &[u8; 32]) -> bool {
        let subject = SubjectKey::from_digest(*digest);
        let checks = [Check::new(subject.bind(&self.first)), Check::new(subject.bind(&self.second))];
        self.store.check_all(&checks).unwrap().permits_request()
    }
    fn check_two(&self, digest: &[u8; 32]) -> bool {
        let subject = SubjectKey::from_digest(*digest);
        let first = self.store.check(&Check::new(subject.bind(&self.first))).unwrap().permits_request();
        first & self.store.check(&Check::new(subject.bind(&self.second))).unwrap().permits_request()
    }
}

struct Gcra {
    store: GcraStore,
    first: GcraPolicy,
    second: GcraPolicy,
}

impl Subject for Gcra {
    fn check(&self, digest: &[u8; 32]) -> bool {
        let check = Check::new(SubjectKey::from_digest(*digest).bind(&self.first));
        self.store.check(&check).unwrap().permits_request()
    }
    fn check_pair(&self, digest: &[u8; 32]) -> bool {
        let subject = SubjectKey::from_digest(*digest);
        let checks = [Check::new(subject.bind(&self.first)), Check::new(subject.bind(&self.second))];
        self.store.check_all(&checks).unwrap().permits_request()
    }
    fn check_two(&self, digest: &[u8; 32]) -> bool {
        let subject = SubjectKey::from_digest(*digest);
        let first = self.store.check(&Check::new(subject.bind(&self.first))).unwrap().permits_request();
        first & self.store.check(&Check::new(subject.bind(&self.second))).unwrap().permits_request()
    }
}

struct Governor {
    first: DefaultKeyedRateLimiter<[u8; 32]>,
    second: DefaultKeyedRateLimiter<[u8; 32]>,
}

impl Subject for Governor {
    fn check(&self, digest: &[u8; 32]) -> bool {
        self.first.check_key(digest).is_ok()
    }
    fn check_pair(&self, digest: &[u8; 32]) -> bool {
        self.check_two(digest)
    }
    fn check_two(&self, digest: &[u8; 32]) -> bool {
        self.first.check_key(digest).is_ok() & self.second.check_key(digest).is_ok()
    }
}

const LIMITERS: [&str; 3] = ["memory_store", "gcra_store", "governor"];

fn build(name: &str) -> Box<dyn Subject> {
    match name {
        "memory_store" => Box::new(Fixed {
            store: MemoryStore::new(config()),
            first: fixed_policy("bench.first"),
            second: fixed_policy("bench.second"),
        }),
        "gcra_store" => Box::new(Gcra {
            store: GcraStore::new(config()),
            first: gcra_policy("bench.first"),
            second: gcra_policy("bench.second"),
        }),
        _ => Box::new(Governor { first: governor(), second: governor() }),
    }
}

static RAN: Mutex<BTreeSet<String>> = Mutex::new(BTreeSet::new());

fn mark(group: &str, name: &str) {
    RAN.lock().unwrap().insert(format!("{group}/{name}"));
}

fn hot_digests() -> Vec<[u8; 32]> {
    (0..HOT_KEYS).map(|i| digest((i * STRIDE) % HOT_KEYS)).collect()
}

fn single_threaded(c: &mut Criterion) {
    let digests = hot_digests();
    let mut group = c.benchmark_group("single_threaded");
    group.throughput(Throughput::Elements(1));
    for name in LIMITERS {
        let limiter = build(name);
        for d in &digests {
            limiter.check(d);
        }
        let mut i = 0usize;
        group.bench_function(name, |b| {
            mark("single_threaded", name);
            b.iter(|| {
                i = if i + 1 == digests.len() { 0 } else { i + 1 };
                black_box(limiter.check(&digests[i]))
            });
        });
    }
    group.finish();
}

fn multi_threaded(c: &mut Criterion) {
    let digests = hot_digests();
    let mut group = c.benchmark_group("multi_threaded");
    group.throughput(Throughput::Elements(1));
    for name in LIMITERS {
        let limiter = build(name);
        for d in &digests {
            limiter.check(d);
        }
        group.bench_function(name, |b| {
            mark("multi_threaded", name);
            b.iter_custom(|iters| {
                let barrier = Barrier::new(2);
                let (limiter, digests, barrier) = (&*limiter, &digests, &barrier);
                thread::scope(|scope| {
                    let workers: Vec<_> = (0..2u64)
                        .map(|worker| {
                            scope.spawn(move || {
                                let share = iters / 2 + (iters % 2) * worker;
                                let mut i = usize::try_from(worker * HOT_KEYS / 2).unwrap();
                                barrier.wait();
                                let started = Instant::now();
                                for _ in 0..share {
                                    i = if i + 1 == digests.len() { 0 } else { i + 1 };
                                    black_box(limiter.check(&digests[i]));
                                }
                                started.elapsed()
                            })
                        })
                        .collect();
                    workers.into_iter().map(|worker| worker.join().unwrap()).max().unwrap()
                })
            });
        });
    }
    group.finish();
}

fn flood(c: &mut Criterion) {
    let mut group = c.benchmark_group("flood");
    group.throughput(Throughput::Elements(1));
    group.sample_size(10);
    for name in LIMITERS {
        let mut next_key = 0u64;
        group.bench_function(name, |b| {
            mark("flood", name);
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                let mut remaining = iters;
                while remaining > 0 {
                    let chunk = remaining.min(FLOOD_KEYS);
                    let limiter = build(name);
                    let started = Instant::now();
                    for _ in 0..chunk {
                        next_key += 1;
                        black_box(limiter.check(&digest(next_key)));
                    }
                    total += started.elapsed();
                    remaining -= chunk;
                }
                total
            });
        });
    }
    group.finish();
}

fn batch(c: &mut Criterion) {
    let digests = hot_digests();
    let mut group = c.benchmark_group("batch");
    group.throughput(Throughput::Elements(1));
    for name in LIMITERS {
        let limiter = build(name);
        for d in &digests {
            limiter.check_pair(d);
        }
        let mut i = 0usize;
        group.bench_function(name, |b| {
            mark("batch", name);
            b.iter(|| {
                i = if i + 1 == digests.len() { 0 } else { i + 1 };
                black_box(limiter.check_pair(&digests[i]))
            });
        });
        if name != "governor" {
            // Baseline on the same keys: the two checks made independently (not atomic).
            let baseline = format!("{name}_two_checks");
            group.bench_function(&baseline, |b| {
                mark("batch", &baseline);
                b.iter(|| {
                    i = if i + 1 == digests.len() { 0 } else { i + 1 };
                    black_box(limiter.check_two(&digests[i]))
                });
            });
        }
    }
    group.finish();
}

/// Resident set size of this process in bytes, from `/proc/self/status` (Linux).
fn resident_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|line| line.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Child-process body: fill one limiter with 1,000,000 live keys and print bytes per key.
fn memory_probe(which: &str) {
    let before = resident_bytes().expect("VmRSS needs Linux /proc");
    let (admitted, entries, limiter): (u64, String, Box<dyn std::any::Any>) = match which {
        "memory_store_1_shard" => {
            let store = MemoryStore::new(MemoryStoreConfig::new(1_000_000).unwrap());
            let policy = fixed_policy("bench.first");
            let admitted = (0..FLOOD_KEYS)
                .filter(|&n| {
                    store
                        .check(&Check::new(SubjectKey::from_digest(digest(n)).bind(&policy)))
                        .unwrap()
                        .permits_request()
                })
                .count();
            (admitted as u64, store.stats().entries().to_string(), Box::new(store))
        }
        "memory_store" | "gcra_store" | "governor" => {
            let limiter = build(which);
            let admitted = (0..FLOOD_KEYS).filter(|&n| limiter.check(&digest(n))).count();
            (admitted as u64, "-".into(), Box::new(limiter))
        }
        other => panic!("unknown probe {other}"),
    };
    let after = resident_bytes().unwrap();
    assert_eq!(admitted, FLOOD_KEYS, "every key must be live");
    let per_key = after.saturating_sub(before) as f64 / FLOOD_KEYS as f64;
    println!("{per_key:.1} {entries}");
    drop(limiter);
}

fn probe(which: &str) -> Option<f64> {
    let output = Command::new(std::env::current_exe().ok()?).env(PROBE_ENV, which).output().ok()?;
    let stdout = String::from_utf8(output.stdout).ok()?;
    stdout.split_whitespace().next()?.parse().ok()
}

fn output_directory() -> PathBuf {
    std::env::var_os("CRITERION_HOME").map(PathBuf::from).unwrap_or_else(|| {
        std::env::var_os("CARGO_TARGET_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../target")))
            .join("criterion")
    })
}

/// Criterion's estimate (slope when available, else mean) in ns per iteration, for a bench
/// that ran in this process.
fn estimate(directory: &std::path::Path, group: &str, name: &str) -> Option<f64> {
    if !RAN.lock().unwrap().contains(&format!("{group}/{name}")) {
        return None;
    }
    let path = directory.join(group).join(name).join("new").join("estimates.json");
    let json: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(path).ok()?).ok()?;
    let pick =
        |key: &str| json.get(key).and_then(|e| e.get("point_estimate")).and_then(serde_json::Value::as_f64);
    pick("slope").or_else(|| pick("mean"))
}

fn cell(value: Option<f64>) -> String {
    value.map_or_else(|| "-".to_owned(), |value| format!("{value:.1}"))
}

fn ratio(numerator: Option<f64>, denominator: Option<f64>) -> String {
    match (numerator, denominator) {
        (Some(n), Some(d)) if d > 0.0 => format!("{:.2}x", n / d),
        _ => "-".to_owned(),
    }
}

fn summary(directory: &std::path::Path) {
    let workloads = [
        ("single_threaded", "one thread, 10,000 hot keys"),
        ("multi_threaded", "two threads, same 10,000 keys"),
        ("flood", "flood of 1,000,000 distinct keys"),
        ("batch", "two-check batch (per batch)"),
    ];
    println!();
    println!("runlimit-memory vs governor 0.10: ns per check (lower is better), {SHARDS} shards");
    println!(
        "{:<34} {:>12} {:>12} {:>12} {:>14} {:>14}",
        "workload", "MemoryStore", "GcraStore", "governor", "Memory/gov", "Gcra/gov"
    );
    let mut figures = std::collections::HashMap::new();
    for (group, label) in workloads {
        let [memory, gcra, governor] = LIMITERS.map(|name| estimate(directory, group, name));
        figures.insert(group, (memory, gcra));
        println!(
            "{label:<34} {:>12} {:>12} {:>12} {:>14} {:>14}",
            cell(memory),
            cell(gcra),
            cell(governor),
            ratio(memory, governor),
            ratio(gcra, governor)
        );
    }
    println!("(governor's batch figure is two independent checks; it has no atomic batch)");
    let (single_memory, single_gcra) = figures["single_threaded"];
    let (batch_memory, batch_gcra) = figures["batch"];
    println!(
        "two-check batch / single check: MemoryStore {}, GcraStore {} (target <= 2.50x)",
        ratio(batch_memory, single_memory),
        ratio(batch_gcra, single_gcra)
    );
    let two = |name: &str| estimate(directory, "batch", &format!("{name}_two_checks"));
    println!(
        "two-check batch / two independent checks on the same keys: MemoryStore {}, GcraStore {}",
        ratio(batch_memory, two("memory_store")),
        ratio(batch_gcra, two("gcra_store"))
    );
    println!("single hot-key check / governor target: <= 1.50x");
    println!();
    println!("resident memory with 1,000,000 live keys (fresh process each; target <= 128 bytes/key):");
    for (which, label) in [
        ("memory_store", "MemoryStore, 64 shards"),
        ("memory_store_1_shard", "MemoryStore, 1 shard (max_keys 1,000,000)"),
        ("gcra_store", "GcraStore, 64 shards"),
        ("governor", "governor keyed (DashMap)"),
    ] {
        println!("  {label:<44} {:>8} bytes/key", cell(probe(which)));
    }
}

fn main() {
    if let Ok(which) = std::env::var(PROBE_ENV) {
        memory_probe(&which);
        return;
    }
    let benchmarking = std::env::args().any(|arg| arg == "--bench");
    let directory = output_directory();
    let mut criterion = Criterion::default()
        .output_directory(&directory)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .configure_from_args();
    single_threaded(&mut criterion);
    multi_threaded(&mut criterion);
    flood(&mut criterion);
    batch(&mut criterion);
    criterion.final_summary();
    if benchmarking {
        summary(&directory);
    }
}
