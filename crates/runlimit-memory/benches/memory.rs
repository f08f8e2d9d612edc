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
//! - `flood/*`: never-seen keys, each checked once; one limiter takes keys until it holds
//!   1,000,000, then a fresh one replaces it (untimed), so the figure averages insertion into
//!   a store of 0 to 1,000,000 keys.
//! - `batch/*`: a two-check atomic `check_all` over two policies on 5,000 subjects, one
//!   subject key bound to both (`SubjectKey::bind`), so both entries share a shard. Every
//!   single-threaded workload thus stores the same number of hot entries (10,000): a batch is
//!   compared with single checks on a working set of the same size, not one that misses the
//!   caches twice as often. (Until 2026-11-30 the batches used 10,000 subjects, 20,000
//!   entries; the README gives both figures.)
//!   governor has no atomic batch, so its figure is two independent `check_key` calls on two
//!   keyed limiters. `two_checks/*` makes the same two checks independently with each
//!   store, isolating the cost of atomicity on the same working set.
//! - `batch_across_shards/*`: the same batch with a different subject key per policy (what
//!   `KeyHasher::hash_for` derives: the policy is part of the HMAC input), so the two entries
//!   usually live on two shards and the batch takes two shard locks.
//! - `weighted_cost_1/*`: the single-threaded workload with every check built through
//!   `Check::with_cost(1)` (governor: `check_key_n` with n = 1), measured in the same rounds as
//!   `single_threaded`, so the weighted path is compared side by side with the plain check.
//!
//! After criterion finishes, the bench prints a summary: ns per check for each limiter, the
//! ratio to governor, the batch-to-single ratio, and resident memory per key with 1,000,000
//! live keys. Memory is measured in a fresh child process per limiter (this binary re-run
//! with `RUNLIMIT_BENCH_MEMORY_PROBE` set), as the growth of `VmRSS` in `/proc/self/status`
//! across building the limiter and inserting the keys; keys are generated on the fly.
//!
//! `RUNLIMIT_BENCH_GROUPS` limits the summary to some of its groups, comma-separated:
//! `single` (the single-threaded rows), `threads`, `flood`, `memory`. With a criterion filter
//! that matches nothing, `RUNLIMIT_BENCH_GROUPS=single cargo bench -p runlimit-memory --
//! zzz_none` measures the single-threaded rows alone in seconds.

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
/// Subjects of the batch workloads: two policies each, so batches store `HOT_KEYS` entries too.
const BATCH_SUBJECTS: usize = 5_000;
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
    /// An atomic two-check batch with a different subject key per policy, `digest` for the
    /// first and `second` (see [`second_digest`]) for the other (governor: two independent
    /// checks).
    fn check_pair_across(&self, digest: &[u8; 32], second: &[u8; 32]) -> bool;
    /// One check of cost 1 through the weighted path (governor: `check_key_n`).
    fn check_weighted(&self, digest: &[u8; 32]) -> bool;
}

/// The second policy's subject key in `batch_across_shards`: another uniform digest, so its
/// shard is independent of the first's. Derived once per subject before the timed loop, as
/// the first digest is: deriving it per operation (an unvectorized 32-byte reversal, about 150
/// instructions) put the harness's own work into the batch's figure.
fn second_digest(digest: &[u8; 32]) -> [u8; 32] {
    let mut other = *digest;
    other.reverse();
    other
}

struct Fixed {
    store: MemoryStore,
    first: FixedWindowPolicy,
    second: FixedWindowPolicy,
}

struct Gcra {
    store: GcraStore,
    first: GcraPolicy,
    second: GcraPolicy,
}

/// `Subject` for a store wrapper with `store`, `first` and `second` fields: both stores share
/// one API, so one body serves both.
macro_rules! store_subject {
    ($wrapper:ident) => {
        impl Subject for $wrapper {
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
                let first =
                    self.store.check(&Check::new(subject.bind(&self.first))).unwrap().permits_request();
                first & self.store.check(&Check::new(subject.bind(&self.second))).unwrap().permits_request()
            }
            fn check_pair_across(&self, digest: &[u8; 32], second: &[u8; 32]) -> bool {
                let checks = [
                    Check::new(SubjectKey::from_digest(*digest).bind(&self.first)),
                    Check::new(SubjectKey::from_digest(*second).bind(&self.second)),
                ];
                self.store.check_all(&checks).unwrap().permits_request()
            }
            fn check_weighted(&self, digest: &[u8; 32]) -> bool {
                let check = Check::new(SubjectKey::from_digest(*digest).bind(&self.first))
                    .with_cost(black_box(1))
                    .unwrap();
                self.store.check(&check).unwrap().permits_request()
            }
        }
    };
}

store_subject!(Fixed);
store_subject!(Gcra);

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
    fn check_pair_across(&self, digest: &[u8; 32], second: &[u8; 32]) -> bool {
        self.first.check_key(digest).is_ok() & self.second.check_key(second).is_ok()
    }
    fn check_weighted(&self, digest: &[u8; 32]) -> bool {
        matches!(self.first.check_key_n(digest, black_box(NonZeroU32::MIN)), Ok(Ok(())))
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

fn hot_digests() -> Vec<[u8; 32]> {
    (0..HOT_KEYS).map(|i| digest((i * STRIDE) % HOT_KEYS)).collect()
}

/// One benchmarked workload. `run` executes `iters` operations of it and returns the time they
/// took; criterion and the interleaved summary measure through the same function.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Workload {
    /// One thread, one check per operation, over the hot keys.
    Single,
    /// Two threads sharing the operations over the same hot keys; wall-clock time.
    TwoThreads,
    /// One check per operation on a never-seen key, into a fresh limiter per 1,000,000 keys.
    Flood,
    /// One atomic two-check batch per operation (governor: two independent checks).
    Batch,
    /// The batch's two checks made independently, on the same keys.
    TwoChecks,
    /// One atomic two-check batch with a subject key per policy (usually two shards).
    BatchAcross,
    /// [`Single`](Self::Single) through `Check::with_cost(1)`.
    Weighted,
}

impl Workload {
    const ALL: [(Self, &'static str); 7] = [
        (Self::Single, "single_threaded"),
        (Self::TwoThreads, "multi_threaded"),
        (Self::Flood, "flood"),
        (Self::Batch, "batch"),
        (Self::TwoChecks, "two_checks"),
        (Self::BatchAcross, "batch_across_shards"),
        (Self::Weighted, "weighted_cost_1"),
    ];

    fn limiters(self) -> &'static [&'static str] {
        match self {
            // governor's batch figure already is two independent checks.
            Self::TwoChecks => &LIMITERS[..2],
            _ => &LIMITERS,
        }
    }
}

/// Per-(workload, limiter) state kept across calls: the limiter with its warmed keys, and the
/// position in the key sequence.
struct Bench {
    name: &'static str,
    limiter: Box<dyn Subject>,
    digests: Vec<[u8; 32]>,
    /// `second_digest` of each of `digests` (`batch_across_shards` only, else empty).
    seconds: Vec<[u8; 32]>,
    cursor: usize,
    next_key: u64,
}

impl Bench {
    fn new(workload: Workload, name: &'static str) -> Self {
        let limiter = build(name);
        let mut digests = hot_digests();
        // Store exactly the workload's keys: 10,000 entries, from 10,000 subjects for single
        // checks and from 5,000 subjects under two policies for batches.
        if matches!(workload, Workload::Batch | Workload::TwoChecks | Workload::BatchAcross) {
            digests.truncate(BATCH_SUBJECTS);
        }
        let seconds: Vec<[u8; 32]> = if workload == Workload::BatchAcross {
            digests.iter().map(second_digest).collect()
        } else {
            Vec::new()
        };
        for (index, d) in digests.iter().enumerate() {
            match workload {
                Workload::Single | Workload::TwoThreads | Workload::Weighted => drop(limiter.check(d)),
                Workload::Batch | Workload::TwoChecks => drop(limiter.check_pair(d)),
                Workload::BatchAcross => drop(limiter.check_pair_across(d, &seconds[index])),
                Workload::Flood => {}
            }
        }
        Self { name, limiter, digests, seconds, cursor: 0, next_key: 0 }
    }

    fn run(&mut self, workload: Workload, iters: u64) -> Duration {
        if workload == Workload::Flood {
            return self.flood(iters);
        }
        let digests = &self.digests;
        let seconds = &self.seconds;
        let limiter = &*self.limiter;
        let mut i = self.cursor;
        // The index of the next subject in `digests` (and `seconds`).
        let mut next = || {
            i = if i + 1 == digests.len() { 0 } else { i + 1 };
            i
        };
        let elapsed = match workload {
            Workload::Single => timed(|| {
                for _ in 0..iters {
                    black_box(limiter.check(&digests[next()]));
                }
            }),
            Workload::Batch => timed(|| {
                for _ in 0..iters {
                    black_box(limiter.check_pair(&digests[next()]));
                }
            }),
            Workload::TwoChecks => timed(|| {
                for _ in 0..iters {
                    black_box(limiter.check_two(&digests[next()]));
                }
            }),
            Workload::BatchAcross => timed(|| {
                for _ in 0..iters {
                    let index = next();
                    black_box(limiter.check_pair_across(&digests[index], &seconds[index]));
                }
            }),
            Workload::Weighted => timed(|| {
                for _ in 0..iters {
                    black_box(limiter.check_weighted(&digests[next()]));
                }
            }),
            Workload::TwoThreads => two_threads(limiter, digests, iters),
            Workload::Flood => Duration::ZERO, // handled above
        };
        self.cursor = i;
        elapsed
    }

    /// One limiter takes the flood until it holds `FLOOD_KEYS` keys, across calls; then a fresh
    /// one replaces it (untimed), so every figure averages inserting into a store of 0 to
    /// 1,000,000 keys.
    fn flood(&mut self, iters: u64) -> Duration {
        let mut total = Duration::ZERO;
        let mut remaining = iters;
        while remaining > 0 {
            if self.next_key.is_multiple_of(FLOOD_KEYS) && self.next_key > 0 {
                self.limiter = build(self.name);
            }
            let chunk = remaining.min(FLOOD_KEYS - self.next_key % FLOOD_KEYS);
            let (first, limiter) = (self.next_key, &*self.limiter);
            total += timed(|| {
                for n in first..first + chunk {
                    black_box(limiter.check(&digest(n)));
                }
            });
            self.next_key += chunk;
            remaining -= chunk;
        }
        total
    }
}

fn timed(f: impl FnOnce()) -> Duration {
    let started = Instant::now();
    f();
    started.elapsed()
}

fn two_threads(limiter: &dyn Subject, digests: &[[u8; 32]], iters: u64) -> Duration {
    let barrier = Barrier::new(2);
    thread::scope(|scope| {
        let workers: Vec<_> = (0..2u64)
            .map(|worker| {
                let barrier = &barrier;
                scope.spawn(move || {
                    let share = iters / 2 + (iters % 2) * worker;
                    let mut i = usize::try_from(worker * HOT_KEYS / 2).unwrap();
                    barrier.wait();
                    timed(|| {
                        for _ in 0..share {
                            i = if i + 1 == digests.len() { 0 } else { i + 1 };
                            black_box(limiter.check(&digests[i]));
                        }
                    })
                })
            })
            .collect();
        workers.into_iter().map(|worker| worker.join().unwrap()).max().unwrap()
    })
}

fn criterion_benches(c: &mut Criterion) {
    for (workload, group_name) in Workload::ALL {
        let mut group = c.benchmark_group(group_name);
        group.throughput(Throughput::Elements(1));
        if workload == Workload::Flood {
            group.sample_size(10);
        }
        for &name in workload.limiters() {
            let mut bench = Bench::new(workload, name);
            group.bench_function(name, |b| {
                RAN.lock().unwrap().insert(format!("{group_name}/{name}"));
                b.iter_custom(|iters| bench.run(workload, iters));
            });
        }
        group.finish();
    }
}

/// Noise-robust figures for a shared machine: many rounds, each measuring every limiter on
/// every workload of `workloads` for one short burst back to back; the minimum over rounds of
/// each (workload, limiter), in ns per operation. Interference only ever adds time, and
/// everything compared is measured at the same moments, so minima and their ratios are stable
/// where means are not. That is why the single-threaded workloads (single check, batches, two
/// independent checks) share one set of rounds: the batch-to-single ratio compares figures
/// taken side by side. Each timed burst follows an untimed one over the same keys, so caches
/// are as warm as in a long run.
fn interleaved(workloads: &[Workload]) -> Vec<(Workload, Vec<f64>)> {
    // Bursts of about a millisecond fit between preemptions; a whole flood per round.
    let (iters, rounds) = match workloads.first() {
        Some(Workload::Flood) => (FLOOD_KEYS, 3),
        Some(Workload::TwoThreads) => (40_000, 61),
        _ => (10_000, 101),
    };
    let mut benches: Vec<(Workload, Bench)> = workloads
        .iter()
        .flat_map(|&workload| {
            workload.limiters().iter().map(move |&name| (workload, Bench::new(workload, name)))
        })
        .collect();
    let mut best = vec![f64::INFINITY; benches.len()];
    for _ in 0..rounds {
        for ((workload, bench), best) in benches.iter_mut().zip(&mut best) {
            if *workload != Workload::Flood {
                // Untimed pass first: the previous burst evicted this one's keys.
                bench.run(*workload, iters);
            }
            let elapsed = bench.run(*workload, iters);
            *best = best.min(elapsed.as_secs_f64() * 1e9 / iters as f64);
        }
    }
    workloads
        .iter()
        .map(|&workload| {
            let figures = benches
                .iter()
                .zip(&best)
                .filter(|((w, _), _)| *w == workload)
                .map(|(_, best)| *best)
                .collect();
            (workload, figures)
        })
        .collect()
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

/// `numerator / denominator` against an upper `target`: "0.78x (target <= 0.80x: met)".
fn judged(numerator: Option<f64>, denominator: Option<f64>, target: f64) -> String {
    match (numerator, denominator) {
        (Some(n), Some(d)) if d > 0.0 => {
            let verdict = if n / d <= target { "met" } else { "missed" };
            format!("{:.2}x (target <= {target:.2}x: {verdict})", n / d)
        }
        _ => "-".to_owned(),
    }
}

/// Targets: a two-check batch at most this many times a single check of the same store.
const BATCH_TARGET: f64 = 1.5;
/// Targets: a single check at most this many times governor's (MemoryStore, GcraStore).
const SINGLE_TARGETS: [f64; 2] = [1.5, 0.8];
/// Target: resident bytes per live key.
const BYTES_PER_KEY_TARGET: f64 = 64.0;

fn print_table(title: &str, figures: &dyn Fn(Workload, &str) -> Option<f64>) {
    println!();
    println!("{title}");
    println!(
        "{:<36} {:>12} {:>12} {:>12} {:>12} {:>12}",
        "workload (ns per operation)", "MemoryStore", "GcraStore", "governor", "Memory/gov", "Gcra/gov"
    );
    for (workload, label) in [
        (Workload::Single, "one thread, 10,000 hot keys"),
        (Workload::TwoThreads, "two threads, same 10,000 keys"),
        (Workload::Flood, "flood of 1,000,000 distinct keys"),
        (Workload::Batch, "two-check batch"),
        (Workload::TwoChecks, "same two checks, independently"),
        (Workload::BatchAcross, "two-check batch across shards"),
        (Workload::Weighted, "one thread, with_cost(1) checks"),
    ] {
        let [memory, gcra, governor] = LIMITERS.map(|name| figures(workload, name));
        println!(
            "{label:<36} {:>12} {:>12} {:>12} {:>12} {:>12}",
            cell(memory),
            cell(gcra),
            cell(governor),
            ratio(memory, governor),
            ratio(gcra, governor)
        );
    }
    let single = |name| figures(Workload::Single, name);
    let batch = |name| figures(Workload::Batch, name);
    let two = |name| figures(Workload::TwoChecks, name);
    let across = |name| figures(Workload::BatchAcross, name);
    println!(
        "single check / governor's: MemoryStore {}, GcraStore {}",
        judged(single("memory_store"), single("governor"), SINGLE_TARGETS[0]),
        judged(single("gcra_store"), single("governor"), SINGLE_TARGETS[1])
    );
    println!(
        "two-check batch / single check: MemoryStore {}, GcraStore {}",
        judged(batch("memory_store"), single("memory_store"), BATCH_TARGET),
        judged(batch("gcra_store"), single("gcra_store"), BATCH_TARGET)
    );
    println!(
        "two-check batch across shards / single check: MemoryStore {}, GcraStore {}",
        judged(across("memory_store"), single("memory_store"), BATCH_TARGET),
        judged(across("gcra_store"), single("gcra_store"), BATCH_TARGET)
    );
    println!(
        "two-check batch / the same two checks made independently: MemoryStore {}, GcraStore {}",
        ratio(batch("memory_store"), two("memory_store")),
        ratio(batch("gcra_store"), two("gcra_store"))
    );
    let weighted = |name| figures(Workload::Weighted, name);
    println!(
        "with_cost(1) check / plain single check (target: within noise): MemoryStore {}, GcraStore {}, governor check_key_n {}",
        ratio(weighted("memory_store"), single("memory_store")),
        ratio(weighted("gcra_store"), single("gcra_store")),
        ratio(weighted("governor"), single("governor"))
    );
}

/// Whether the summary measures `group` (`single`, `threads`, `flood` or `memory`): every group
/// unless `RUNLIMIT_BENCH_GROUPS` lists some, comma-separated (for quicker iterations, e.g.
/// `RUNLIMIT_BENCH_GROUPS=single cargo bench -p runlimit-memory -- zzz_none`, which skips
/// criterion's own runs too).
fn selected(group: &str) -> bool {
    std::env::var("RUNLIMIT_BENCH_GROUPS").map_or(true, |groups| groups.split(',').any(|g| g.trim() == group))
}

fn summary(directory: &std::path::Path) {
    println!();
    println!("runlimit-memory vs governor 0.10, {SHARDS} shards.");
    println!("governor has no atomic batch: its batch figure is two independent checks.");
    let group = |workload: Workload| Workload::ALL.iter().find(|(w, _)| *w == workload).map(|(_, g)| *g);
    print_table("criterion estimates (slope, else mean):", &|workload, name| {
        estimate(directory, group(workload)?, name)
    });
    let measured: Vec<(Workload, Vec<f64>)> = [
        (
            "single",
            &[
                Workload::Single,
                Workload::Weighted,
                Workload::Batch,
                Workload::TwoChecks,
                Workload::BatchAcross,
            ][..],
        ),
        ("threads", &[Workload::TwoThreads]),
        ("flood", &[Workload::Flood]),
    ]
    .into_iter()
    .filter(|(name, _)| selected(name))
    .flat_map(|(_, workloads)| interleaved(workloads))
    .collect();
    print_table("interleaved minimum of rounds (robust on a shared machine):", &|workload, name| {
        let (_, figures) = measured.iter().find(|(w, _)| *w == workload)?;
        let index = workload.limiters().iter().position(|&n| n == name)?;
        figures.get(index).copied()
    });
    if !selected("memory") {
        return;
    }
    println!();
    println!(
        "resident memory with 1,000,000 live keys (fresh process each; target <= {BYTES_PER_KEY_TARGET:.0} bytes/key):"
    );
    for (which, label) in [
        ("memory_store", "MemoryStore, 64 shards"),
        ("memory_store_1_shard", "MemoryStore, 1 shard (max_keys 1,000,000)"),
        ("gcra_store", "GcraStore, 64 shards"),
        ("governor", "governor keyed (DashMap)"),
    ] {
        let bytes = probe(which);
        let verdict = match bytes {
            _ if which == "governor" => "",
            Some(bytes) if bytes <= BYTES_PER_KEY_TARGET => " (met)",
            _ => " (missed)",
        };
        println!("  {label:<44} {:>8} bytes/key{verdict}", cell(bytes));
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
    criterion_benches(&mut criterion);
    criterion.final_summary();
    if benchmarking {
        summary(&directory);
    }
}
