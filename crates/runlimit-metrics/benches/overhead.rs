//! What `MetricsObserver` adds to a memory-store check.
//!
//! Run with `cargo bench -p runlimit-metrics`. Two `MemoryStore`s (64 shards) check the same
//! 10,000 hot keys in a scattered order, every check allowed (`MAX_LIMIT` per hour):
//!
//! - `check/no_observer`: the store without an observer (no observation is built);
//! - `check/noop_observer`: the store with the no-op observer `()`, so each check builds and
//!   delivers its observation (timing, headroom) and nothing records it: the store's own
//!   share of the overhead;
//! - `check/metrics_prometheus`: the store with `MetricsObserver`, while
//!   `metrics-exporter-prometheus`'s recorder is installed as the global recorder (its
//!   histograms configured with buckets and its upkeep running every 250 ms on a thread of
//!   its own, as a service scraping them would), so every check records a counter, a
//!   histogram sample and two shard gauges into a real registry.
//!
//! After criterion, an interleaved min-of-rounds table measures both again, alternating in
//! the same rounds (robust to a busy machine), and prints ns per check, the overhead in ns
//! and the ratio.

use std::{
    hint::black_box,
    time::{Duration, Instant},
};

use criterion::Criterion;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
use runlimit_core::{Check, FixedWindowPolicy, MAX_LIMIT, Observer, PolicyId, ScopeId, SubjectKey};
use runlimit_memory::{MemoryStore, MemoryStoreConfig, SystemClock};
use runlimit_metrics::MetricsObserver;

const HOT_KEYS: u64 = 10_000;
const STRIDE: u64 = 7_919;
const ROUNDS: usize = 31;
const CHECKS_PER_ROUND: u64 = 200_000;
/// How often the recorder's upkeep runs, on its own thread.
const UPKEEP: Duration = Duration::from_millis(250);

fn policy() -> FixedWindowPolicy {
    FixedWindowPolicy::new(
        PolicyId::new("bench").expect("valid id"),
        ScopeId::new("client").expect("valid scope"),
        MAX_LIMIT,
        Duration::from_secs(3_600),
    )
    .expect("valid policy")
}

fn keys() -> Vec<SubjectKey> {
    (0..HOT_KEYS)
        .map(|n| {
            let mut digest = [0u8; 32];
            digest[..8].copy_from_slice(&n.wrapping_mul(0x9E37_79B9_7F4A_7C15).to_le_bytes());
            digest[8..16].copy_from_slice(&n.to_le_bytes());
            SubjectKey::from_digest(digest)
        })
        .collect()
}

fn config() -> MemoryStoreConfig {
    MemoryStoreConfig::new(64 * 1_024).and_then(|config| config.with_shard_count(64)).expect("valid config")
}

/// Runs `n` checks starting at key index `*cursor`.
fn run<O: Observer>(
    store: &MemoryStore<SystemClock, O>,
    policy: &FixedWindowPolicy,
    keys: &[SubjectKey],
    cursor: &mut u64,
    n: u64,
) {
    for _ in 0..n {
        *cursor = (*cursor + STRIDE) % HOT_KEYS;
        let key = keys[usize::try_from(*cursor).expect("small index")];
        let decision = store.check(&Check::new(key.bind(policy))).expect("healthy shard");
        black_box(decision);
    }
}

fn main() {
    let handle = PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), &[1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 0.1, 1.0])
        .expect("valid buckets")
        .install_recorder()
        .expect("the only recorder of this process");
    // As a service does: upkeep drains histogram samples into their buckets, so they do not
    // pile up for the whole run.
    std::thread::spawn(move || {
        loop {
            std::thread::sleep(UPKEEP);
            handle.run_upkeep();
        }
    });
    let policy = policy();
    let keys = keys();
    let plain = MemoryStore::builder(config()).build();
    let noop = MemoryStore::builder(config()).with_observer(()).build();
    let observed = MemoryStore::builder(config()).with_observer(MetricsObserver::new("memory")).build();
    // Warm both stores: every key stored, every series registered.
    let (mut plain_cursor, mut noop_cursor, mut observed_cursor) = (0, 0, 0);
    run(&plain, &policy, &keys, &mut plain_cursor, HOT_KEYS * 2);
    run(&noop, &policy, &keys, &mut noop_cursor, HOT_KEYS * 2);
    run(&observed, &policy, &keys, &mut observed_cursor, HOT_KEYS * 2);

    let mut criterion = Criterion::default().configure_from_args();
    let mut group = criterion.benchmark_group("check");
    group.bench_function("no_observer", |b| b.iter(|| run(&plain, &policy, &keys, &mut plain_cursor, 1)));
    group.bench_function("noop_observer", |b| b.iter(|| run(&noop, &policy, &keys, &mut noop_cursor, 1)));
    group.bench_function("metrics_prometheus", |b| {
        b.iter(|| run(&observed, &policy, &keys, &mut observed_cursor, 1));
    });
    group.finish();
    criterion.final_summary();

    let (mut plain_best, mut noop_best, mut observed_best) = (f64::INFINITY, f64::INFINITY, f64::INFINITY);
    for _ in 0..ROUNDS {
        let started = Instant::now();
        run(&plain, &policy, &keys, &mut plain_cursor, CHECKS_PER_ROUND);
        plain_best = plain_best.min(per_check(started.elapsed()));
        let started = Instant::now();
        run(&noop, &policy, &keys, &mut noop_cursor, CHECKS_PER_ROUND);
        noop_best = noop_best.min(per_check(started.elapsed()));
        let started = Instant::now();
        run(&observed, &policy, &keys, &mut observed_cursor, CHECKS_PER_ROUND);
        observed_best = observed_best.min(per_check(started.elapsed()));
    }
    println!("\nInterleaved, min of {ROUNDS} rounds of {CHECKS_PER_ROUND} checks (ns per check):");
    println!("| MemoryStore check | ns |");
    println!("|---|---:|");
    println!("| no observer | {plain_best:.1} |");
    println!("| no-op observer `()` | {noop_best:.1} |");
    println!("| MetricsObserver, Prometheus recorder | {observed_best:.1} |");
    println!(
        "overhead: {:.1} ns per check ({:.2}x the check without an observer)",
        observed_best - plain_best,
        observed_best / plain_best
    );
    println!(
        "of which the store's own observation (timing, headroom): {:.1} ns; MetricsObserver itself: {:.1} ns",
        noop_best - plain_best,
        observed_best - noop_best
    );
}

#[allow(clippy::cast_precision_loss, reason = "benchmark arithmetic on small counts")]
fn per_check(elapsed: Duration) -> f64 {
    elapsed.as_nanos() as f64 / CHECKS_PER_ROUND as f64
}
