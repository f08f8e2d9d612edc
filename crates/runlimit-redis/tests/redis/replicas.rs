//! Four replicas sharing quotas: four independent limiters (each `RedisStore::new` opens its own
//! connection) under one key prefix, hammering overlapping counter keys at once with single
//! checks and two- or three-check batches in random member order, on the server's real clock.
//!
//! Every test runs 4 replicas × 3 tasks × 200 admissions (2,400 admissions, about 4,200 checks
//! of costs 1 to 3) over 2 policies × 3 subjects (two subjects share a shard and a bucket, the
//! third is in another shard), records every decision, measures the elapsed time with the
//! server's `TIME` before the first and after the last admission, then checks the decisions
//! against each other and against the state stored in Redis:
//!
//! - fixed windows (`fixed_windows_shared_by_four_replicas`): the whole run is one window per
//!   key. Sorted by the units used after each (limit − `available`), a key's allowed
//!   admissions form one sequential history: the first used exactly its cost, each next exactly
//!   its cost more (no lost update, no double count, no half-written batch: a batch is one
//!   admission of each of its keys' histories). Their `replenishes_after` put every admission
//!   between the server times measured around the run, in that order. Every denial was
//!   possible (the key's units used by admissions not after it, plus its cost, exceed the
//!   limit). The stored `<deadline>:<used>` has used = the sum of the allowed costs involving
//!   the key and deadline = the window's anchor + window. Then one replica drains every key
//!   with cost-1 checks, each answering exactly limit − used − 1, until the first denial:
//!   exactly `limit` units were allowed per key.
//! - GCRA (`gcra_shared_by_four_replicas`), two slow policies (an emission interval of 6 and
//!   8.6 minutes, so nothing replenishes during the run) and two fast ones (40 per second,
//!   burst 25; 15 per second, burst 6). Slow keys: `remaining` = B − units used, so the same
//!   sequential history as fixed windows; ⌈U·P/Q⌉ − `replenishes_after` = the admission's
//!   time − the first admission's time, non-decreasing along the history and within the run;
//!   the stored `<t>:<r>` is exactly the first admission's time·Q + (sum of allowed costs)·P;
//!   a drain allows exactly B units. Fast keys: allowed units ≤ B + ⌊elapsed·Q/P⌋, and the
//!   stored tat lies between the run's start·Q + (allowed units)·P and its end·Q + B·P.
//!
//! The GCRA bound needs no slack: with the script times t₁ ≤ … ≤ tₙ of a key's allowed
//! admissions (each shard's times never decrease: `max(TIME, watermark)`), the tat only grows
//! by each admission's c·P from t₁·Q, and the last admission was allowed, so
//! t₁·Q + C·P ≤ tat ≤ tₙ·Q + B·P, hence C ≤ B + ⌊(tₙ − t₁)·Q/P⌋, and the measured server times
//! bracket t₁ and tₙ (a fresh prefix: every watermark is a `TIME` reading of the run).
//!
//! The tests are `#[ignore]`d so a plain `cargo test` needs no server:
//!
//! ```text
//! RUNLIMIT_REDIS_TEST_URL=redis://127.0.0.1:6379 \
//!     cargo test -p runlimit-redis --test redis replicas:: -- --include-ignored
//! ```

use crate::support;

use std::{collections::HashMap, sync::Arc, time::Duration};

use redis::aio::MultiplexedConnection;
use runlimit_core::{
    Allowance, BatchDecisionView, Check, DecisionView, Denial, FixedWindowPolicy, GcraPolicy, PolicyId,
    QuotaDenial, ScopeId, SubjectKey,
};
use runlimit_redis::{KeyPrefix, RedisAlgorithm, RedisConfig, RedisStore};

const REPLICAS: usize = 4;
const TASKS_PER_REPLICA: usize = 3;
const ADMISSIONS_PER_TASK: usize = 200;
const SUBJECTS: usize = 3;
/// Every test finishes within this, or fails.
const TEST_TIMEOUT: Duration = Duration::from_secs(120);
/// Long enough that no admission of a loaded machine times out (an uncertain outcome would
/// make exact accounting impossible).
const OPERATION_TIMEOUT: Duration = Duration::from_secs(20);

/// SplitMix64: a small deterministic generator, one per task.
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, bound: usize) -> usize {
        usize::try_from(self.next() % u64::try_from(bound).expect("a small bound"))
            .expect("below a usize bound")
    }
}

/// Subjects 0 and 1 share shard 0x5A and bucket 17; subject 2 is in shard 0xB3.
fn subjects() -> Vec<SubjectKey> {
    [(0x5A, 17, 1u64), (0x5A, 17 + 64, 2), (0xB3, 40, 3)]
        .into_iter()
        .map(|(shard, bucket, n)| {
            let mut digest = [0x3Cu8; 32];
            digest[0] = shard;
            digest[1] = bucket;
            digest[2..10].copy_from_slice(&n.to_le_bytes());
            SubjectKey::from_digest(digest)
        })
        .collect()
}

/// What one admission returned.
#[derive(Debug)]
enum Outcome {
    /// One allowance per check, in input order.
    Allowed(Vec<Allowance>),
    /// Denied at `index` by the quota.
    Denied { index: usize, denial: QuotaDenial },
}

/// One admission: its checks `(key, cost)` in input order, and what it returned.
#[derive(Debug)]
struct Record {
    checks: Vec<(usize, u64)>,
    outcome: Outcome,
}

fn quota_denial(denial: &Denial) -> QuotaDenial {
    match denial {
        Denial::QuotaExceeded(denial) => *denial,
        Denial::StorageCapacity { .. } => panic!("a storage-capacity denial with room for every key"),
    }
}

/// The workload of one test: `policies` × `subjects` counter keys (key `k` is policy
/// `k / SUBJECTS`, subject `k % SUBJECTS`).
struct Workload<P> {
    policies: Arc<Vec<P>>,
    subjects: Arc<Vec<SubjectKey>>,
}

impl<P> Clone for Workload<P> {
    fn clone(&self) -> Self {
        Self { policies: Arc::clone(&self.policies), subjects: Arc::clone(&self.subjects) }
    }
}

impl<P: RedisAlgorithm + 'static> Workload<P> {
    fn keys(&self) -> usize {
        self.policies.len() * SUBJECTS
    }

    fn policy(&self, key: usize) -> &P {
        &self.policies[key / SUBJECTS]
    }

    fn check(&self, key: usize, cost: u64) -> Check<'_, P> {
        Check::new(self.subjects[key % SUBJECTS].bind(self.policy(key)))
            .with_cost(cost)
            .expect("a cost within the capacity")
    }

    /// One task: `ADMISSIONS_PER_TASK` admissions through `replica`, half single checks and
    /// half batches of two or three distinct keys in random order, costs 1 to 3.
    async fn hammer(self, replica: RedisStore<P>, seed: u64) -> Vec<Record> {
        let mut random = SplitMix(seed);
        let mut records = Vec::with_capacity(ADMISSIONS_PER_TASK);
        for _ in 0..ADMISSIONS_PER_TASK {
            let size = if random.below(2) == 0 { 1 } else { 2 + random.below(2) };
            let mut keys: Vec<usize> = (0..self.keys()).collect();
            for i in 0..size {
                let j = i + random.below(keys.len() - i);
                keys.swap(i, j);
            }
            let checks: Vec<(usize, u64)> =
                keys[..size].iter().map(|&key| (key, 1 + random.next() % 3)).collect();
            let built: Vec<Check<'_, P>> = checks.iter().map(|&(key, cost)| self.check(key, cost)).collect();
            let outcome = if size == 1 {
                let decision = replica.check(&built[0]).await.expect("a single check");
                match decision.view() {
                    DecisionView::Allowed { allowance } => Outcome::Allowed(vec![*allowance]),
                    DecisionView::Denied { denial } => {
                        Outcome::Denied { index: 0, denial: quota_denial(denial) }
                    }
                    DecisionView::ShadowDenied { .. } => panic!("a shadow denial under enforcement"),
                }
            } else {
                let decision = replica.check_all(&built).await.expect("a batch");
                match decision.view() {
                    BatchDecisionView::Allowed { allowances } => {
                        assert_eq!(allowances.len(), size, "one allowance per check");
                        Outcome::Allowed(allowances.to_vec())
                    }
                    BatchDecisionView::Denied { index, batch_size, denial } => {
                        assert_eq!(batch_size, size);
                        Outcome::Denied { index, denial: quota_denial(denial) }
                    }
                    BatchDecisionView::ShadowDenied { .. } => panic!("a shadow denial under enforcement"),
                }
            };
            records.push(Record { checks, outcome });
        }
        records
    }

    /// Runs every task of every replica at once; returns the records and the server's time
    /// (ms) just before the first and just after the last admission.
    async fn run(
        &self,
        replicas: &[RedisStore<P>],
        connection: &mut MultiplexedConnection,
    ) -> (Vec<Record>, u64, u64) {
        let before = support::server_millis(connection).await;
        let mut tasks = Vec::new();
        for (r, replica) in replicas.iter().enumerate() {
            for t in 0..TASKS_PER_REPLICA {
                let seed = 0x5EED_0000 + u64::try_from(r * TASKS_PER_REPLICA + t).expect("a task number");
                tasks.push(tokio::spawn(self.clone().hammer(replica.clone(), seed)));
            }
        }
        let mut records = Vec::new();
        for task in tasks {
            records.extend(task.await.expect("a hammering task"));
        }
        let after = support::server_millis(connection).await;
        (records, before, after)
    }
}

/// A key's allowed admissions `(cost, allowance)` and denials `(cost, denial)`, from the
/// records.
struct History {
    allowed: Vec<(u64, Allowance)>,
    denied: Vec<(u64, QuotaDenial)>,
}

fn histories(records: &[Record], keys: usize) -> Vec<History> {
    let mut histories: Vec<History> =
        (0..keys).map(|_| History { allowed: Vec::new(), denied: Vec::new() }).collect();
    for record in records {
        match &record.outcome {
            Outcome::Allowed(allowances) => {
                assert_eq!(allowances.len(), record.checks.len());
                for (&(key, cost), allowance) in record.checks.iter().zip(allowances) {
                    histories[key].allowed.push((cost, *allowance));
                }
            }
            Outcome::Denied { index, denial } => {
                let (key, cost) = record.checks[*index];
                histories[key].denied.push((cost, *denial));
            }
        }
    }
    histories
}

/// Sorts a key's allowed admissions by the units used after each (`capacity − available`,
/// with `capacity` the fixed-window limit or the GCRA burst while nothing replenishes) and
/// checks that they form one sequential history: the first used exactly its cost, each next
/// exactly its cost more. Returns the units used after the last.
fn sequential(name: &str, capacity: u64, allowed: &mut [(u64, Allowance)]) -> u64 {
    allowed.sort_by_key(|(_, allowance)| capacity - allowance.available());
    let mut used = 0;
    for (position, (cost, allowance)) in allowed.iter().enumerate() {
        assert_eq!(allowance.capacity().get(), capacity, "{name}: capacity");
        let after = capacity - allowance.available();
        assert_eq!(
            after,
            used + cost,
            "{name}: allowed admission {position} (cost {cost}) left {after} units used after {used}: \
             a lost, doubled or half-committed update"
        );
        used = after;
    }
    used
}

fn millis(delay: runlimit_core::Delay) -> u64 {
    u64::try_from(delay.millis()).expect("a delay within u64 ms")
}

/// The `<a>:<b>` stored for `key`, with its expiry score.
async fn stored<P: RedisAlgorithm + 'static>(
    connection: &mut MultiplexedConnection,
    prefix: &str,
    tag: &str,
    workload: &Workload<P>,
    key: usize,
) -> Option<(u64, u64)> {
    let (state, _) = support::stored_entry(
        connection,
        prefix,
        tag,
        workload.policy(key),
        &workload.subjects[key % SUBJECTS],
    )
    .await;
    let state = state?;
    let (first, second) = state.split_once(':').expect("a `<a>:<b>` state");
    Some((first.parse().expect("a decimal"), second.parse().expect("a decimal")))
}

/// Four replicas under one fresh prefix, prepared.
async fn replicas<P: RedisAlgorithm>(prefix: &str) -> Vec<RedisStore<P>> {
    let config = RedisConfig::default()
        .with_key_prefix(KeyPrefix::new(prefix).expect("a valid prefix"))
        .with_operation_timeout(OPERATION_TIMEOUT)
        .expect("a valid timeout");
    let mut replicas = Vec::with_capacity(REPLICAS);
    for _ in 0..REPLICAS {
        let replica =
            RedisStore::<P>::new(&support::server_url()).expect("a valid URL").with_config(config.clone());
        replica.prepare().await.expect("prepare the test server");
        replicas.push(replica);
    }
    replicas
}

/// Drains `key` through `replica` with cost-1 checks until the first denial; each allowed
/// check must answer exactly `capacity − used − 1` available. Returns the units used then.
async fn drain<P: RedisAlgorithm + 'static>(
    name: &str,
    replica: &RedisStore<P>,
    workload: &Workload<P>,
    key: usize,
    capacity: u64,
    mut used: u64,
) -> u64 {
    loop {
        let decision = replica.check(&workload.check(key, 1)).await.expect("a drain check");
        match decision.view() {
            DecisionView::Allowed { allowance } => {
                used += 1;
                assert_eq!(allowance.available(), capacity - used, "{name}: drain check after {used} units");
            }
            DecisionView::Denied { denial } => {
                quota_denial(denial);
                return used;
            }
            DecisionView::ShadowDenied { .. } => panic!("a shadow denial under enforcement"),
        }
    }
}

fn fixed(id: &str, limit: u64, window: Duration) -> FixedWindowPolicy {
    FixedWindowPolicy::new(
        PolicyId::new(id).expect("an id"),
        ScopeId::new("subject").expect("a scope"),
        limit,
        window,
    )
    .expect("a valid policy")
}

fn gcra(id: &str, quota: u64, period_ms: u64, burst: u64) -> GcraPolicy {
    GcraPolicy::new(
        PolicyId::new(id).expect("an id"),
        ScopeId::new("subject").expect("a scope"),
        quota,
        Duration::from_millis(period_ms),
        burst,
    )
    .expect("a valid policy")
}

fn run_test(name: &str, test: impl AsyncFnOnce(&str, &mut MultiplexedConnection)) {
    support::runtime().block_on(async {
        let mut connection = support::connect(&support::server_url()).await;
        let prefix = support::unique_prefix(name);
        tokio::time::timeout(TEST_TIMEOUT, test(&prefix, &mut connection))
            .await
            .unwrap_or_else(|_| panic!("{name} took over {TEST_TIMEOUT:?} (keys kept under {prefix})"));
        support::delete_prefix(&mut connection, &prefix).await;
        assert!(support::keys_under(&mut connection, &prefix).await.is_empty());
    });
}

#[test]
#[ignore = "needs RUNLIMIT_REDIS_TEST_URL"]
fn fixed_windows_shared_by_four_replicas() {
    run_test("replicas_fixed_window", async |prefix, connection| {
        // One window for the whole run: ten minutes. Policy a's keys usually still have room
        // when the run ends (the drain allows the rest), policy b's are exhausted during it.
        let window = Duration::from_secs(600);
        let window_ms = 600_000;
        let workload = Workload {
            policies: Arc::new(vec![fixed("replicas.a", 1_000, window), fixed("replicas.b", 350, window)]),
            subjects: Arc::new(subjects()),
        };
        let replicas = replicas::<FixedWindowPolicy>(prefix).await;
        let (records, before, after) = workload.run(&replicas, connection).await;
        let elapsed = after - before;
        assert!(elapsed < window_ms / 2, "the run took {elapsed} ms, longer than the window allows");
        let batches = records.iter().filter(|record| record.checks.len() > 1).count();
        let allowed_batches = records
            .iter()
            .filter(|record| record.checks.len() > 1 && matches!(record.outcome, Outcome::Allowed(_)))
            .count();
        let mut summary = Vec::new();
        for (key, mut history) in histories(&records, workload.keys()).into_iter().enumerate() {
            let name = format!("fixed-window key {key}");
            let limit = workload.policy(key).limit().get();
            let used = sequential(&name, limit, &mut history.allowed);
            assert!(used > 0, "{name}: nothing allowed");
            // Every admission's time, from its replenishes_after = deadline − now.
            let (deadline, stored_used) =
                stored(connection, prefix, "fw", &workload, key).await.expect("a stored window");
            assert_eq!(stored_used, used, "{name}: stored used vs the sum of the allowed costs");
            let anchor = deadline - window_ms;
            assert!(
                (before..=after).contains(&anchor),
                "{name}: window anchored at {anchor}, outside {before}..={after}"
            );
            let mut previous = anchor;
            for (position, (_, allowance)) in history.allowed.iter().enumerate() {
                assert!(allowance.replenishes_after() <= runlimit_core::Delay::from_millis(window_ms));
                let at = deadline - millis(allowance.replenishes_after());
                assert!(
                    previous <= at && at <= after,
                    "{name}: allowed admission {position} at {at} ms, after one at {previous} ms, run ended at {after}"
                );
                previous = at;
            }
            // Every denial was possible: the units used by admissions at or before its time
            // (an upper bound of what it saw), plus its cost, exceed the limit.
            for (cost, denial) in &history.denied {
                assert_eq!(denial.capacity().get(), limit);
                let at = deadline - millis(denial.retry_after());
                assert!(
                    (anchor..=after).contains(&at),
                    "{name}: a denial at {at} ms, outside {anchor}..={after}"
                );
                let seen = history
                    .allowed
                    .iter()
                    .filter(|(_, allowance)| deadline - millis(allowance.replenishes_after()) <= at)
                    .map(|(_, allowance)| limit - allowance.available())
                    .max()
                    .unwrap_or(0);
                assert!(
                    seen + cost > limit,
                    "{name}: a cost-{cost} check denied at {at} ms with at most {seen} of {limit} used"
                );
            }
            let drained = drain(&name, &replicas[key % REPLICAS], &workload, key, limit, used).await;
            assert_eq!(drained, limit, "{name}: units allowed in the window");
            let (_, stored_used) =
                stored(connection, prefix, "fw", &workload, key).await.expect("a stored window");
            assert_eq!(stored_used, limit, "{name}: stored used after the drain");
            summary.push((key, used, history.allowed.len(), history.denied.len()));
        }
        eprintln!(
            "fixed windows: {} admissions ({batches} batches, {allowed_batches} allowed) in {elapsed} ms; \
             per key (key, units allowed before the drain, allowed admissions, denials): {summary:?}",
            records.len()
        );
    });
}

#[test]
#[ignore = "needs RUNLIMIT_REDIS_TEST_URL"]
fn gcra_shared_by_four_replicas() {
    run_test("replicas_gcra", async |prefix, connection| {
        // Slow: emission intervals of 360 s and 3,600,001/7 ≈ 514.3 s (remainders never 0).
        // Fast: 40 per second with a burst of 25, and 3 per 200 ms with a burst of 6.
        let workload = Workload {
            policies: Arc::new(vec![
                gcra("replicas.slow.a", 10, 3_600_000, 400),
                gcra("replicas.slow.b", 7, 3_600_001, 260),
                gcra("replicas.fast.a", 40, 1_000, 25),
                gcra("replicas.fast.b", 3, 200, 6),
            ]),
            subjects: Arc::new(subjects()),
        };
        let slow = 2 * SUBJECTS;
        let replicas = replicas::<GcraPolicy>(prefix).await;
        let (records, before, after) = workload.run(&replicas, connection).await;
        let elapsed = after - before;
        let mut summary = HashMap::new();
        for (key, mut history) in histories(&records, workload.keys()).into_iter().enumerate() {
            let policy = workload.policy(key);
            let (quota, period, burst) =
                (policy.quota().get(), policy.period().as_millis(), policy.burst_capacity().get());
            let name = format!("GCRA key {key} ({quota} per {period} ms, burst {burst})");
            let tat = stored(connection, prefix, "gcra", &workload, key)
                .await
                .map(|(t, r)| u128::from(t) * u128::from(quota) + u128::from(r));
            let allowed: u64 = history.allowed.iter().map(|(cost, _)| cost).sum();
            if key < slow {
                // Nothing replenishes during the run: (now − t₁)·Q < P for every admission.
                assert!(
                    u128::from(elapsed) * u128::from(quota) < u128::from(period),
                    "{name}: the run was too slow"
                );
                let used = sequential(&name, burst, &mut history.allowed);
                assert_eq!(used, allowed);
                assert!(used > 0, "{name}: nothing allowed");
                // The stored tat is exactly t₁·Q + C·P, t₁ the first admission's time.
                let tat = tat.expect("a stored state");
                let spent = u128::from(used) * u128::from(period);
                let first = tat.checked_sub(spent).expect("tat ≥ C·P");
                assert_eq!(first % u128::from(quota), 0, "{name}: stored tat {tat} is not t₁·Q + C·P");
                let first = u64::try_from(first / u128::from(quota)).expect("a time in ms");
                assert!(
                    (before..=after).contains(&first),
                    "{name}: first admission at {first}, outside {before}..={after}"
                );
                // replenishes_after = t₁ − now + ⌈U·P/Q⌉: every admission's time, in history order.
                let mut previous = first;
                for (position, (_, allowance)) in history.allowed.iter().enumerate() {
                    let units = burst - allowance.available();
                    let ahead =
                        u64::try_from((u128::from(units) * u128::from(period)).div_ceil(u128::from(quota)))
                            .expect("ms");
                    let at = (first + ahead)
                        .checked_sub(millis(allowance.replenishes_after()))
                        .expect("an admission after the first");
                    assert!(
                        previous <= at && at <= after,
                        "{name}: allowed admission {position} at {at} ms, after one at {previous} ms, run ended at {after}"
                    );
                    previous = at;
                }
                for (cost, denial) in &history.denied {
                    assert_eq!(denial.capacity().get(), burst);
                    assert!(
                        used + cost > burst,
                        "{name}: a cost-{cost} check denied with at most {used} of {burst} used"
                    );
                }
                let drained = drain(&name, &replicas[key % REPLICAS], &workload, key, burst, used).await;
                assert_eq!(drained, burst, "{name}: units allowed");
                let end = support::server_millis(connection).await;
                assert!(
                    u128::from(end - before) * u128::from(quota) < u128::from(period),
                    "{name}: the drain was too slow"
                );
                summary.insert(key, (used, history.allowed.len(), history.denied.len(), None));
            } else {
                // Never above the burst plus what replenished over the run.
                let replenished = u128::from(elapsed) * u128::from(quota) / u128::from(period);
                let bound = u128::from(burst) + replenished;
                assert!(
                    u128::from(allowed) <= bound,
                    "{name}: {allowed} units allowed in {elapsed} ms, above {bound}"
                );
                // t₁·Q + C·P ≤ tat ≤ tₙ·Q + B·P, with before ≤ t₁ ≤ tₙ ≤ after.
                if allowed > 0 {
                    let tat = tat.expect("a stored state");
                    let lowest =
                        u128::from(before) * u128::from(quota) + u128::from(allowed) * u128::from(period);
                    let highest =
                        u128::from(after) * u128::from(quota) + u128::from(burst) * u128::from(period);
                    assert!(
                        (lowest..=highest).contains(&tat),
                        "{name}: stored tat {tat} outside {lowest}..={highest}"
                    );
                }
                for (_, denial) in &history.denied {
                    assert_eq!(denial.capacity().get(), burst);
                    assert!(denial.retry_after() > runlimit_core::Delay::ZERO);
                }
                summary.insert(key, (allowed, history.allowed.len(), history.denied.len(), Some(bound)));
            }
        }
        let mut summary: Vec<_> = summary.into_iter().collect();
        summary.sort_unstable();
        eprintln!(
            "GCRA: {} admissions in {elapsed} ms; per key (key, (units allowed before any drain, allowed \
             admissions, denials, bound of a fast key)): {summary:?}",
            records.len()
        );
    });
}
