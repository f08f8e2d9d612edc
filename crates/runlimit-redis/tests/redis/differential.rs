//! Differential property tests: the Lua evaluation of both Redis limiters against the rules of
//! `runlimit_core::backend`, at every step of random histories, over the whole accepted domain.
//!
//! Policies: limits, quotas and bursts of 1 to 4, up to 1,000, 2⁵³ ± 3, `MAX_LIMIT` − 2 to
//! `MAX_LIMIT`, around the scripts' base-10⁹ limbs (10⁹ ± 1, 2·10⁹, 10¹⁸ ± 1) and anywhere;
//! windows and periods of 1 to 3 ms, up to 100 s, round values, `MAX_WINDOW_MILLIS` − 2 to
//! `MAX_WINDOW_MILLIS` and anywhere; GCRA bursts chosen so that the full replenishment
//! ⌈B·P/Q⌉ stays within `MAX_WINDOW_MILLIS` (1, 2, Q, the largest such B and its neighbour,
//! anything below it), a case the constructor still refuses being rejected, not failed.
//!
//! Each case has two policies (in one quota mode, enforced or shadow) and two subjects
//! (often in one shard, often in one bucket; never used by another case), so four counter
//! keys, and replays up to 20 steps at a time pinned through the shard watermarks. A step
//!
//! 1. advances the pinned time by 0, 1 to 3 ms, up to twice the window (full replenishment),
//!    one or two windows (periods) ± 1 ms, or to ± 2 ms of a key's expiry, ± 1 ms of the last
//!    denial's retry instant, or ± 1 ms of a key's next unit;
//! 2. peeks every key;
//! 3. runs one check, or one atomic batch of two to four keys in random order, of random costs
//!    (1, the capacity, half of it, exactly what is available ± 1, a cost that ends exactly
//!    at or next to a 10⁹ limb boundary, anything);
//! 4. reads every key's entry through the documented key layout.
//!
//! A plain reference keeps its own state per key and answers with `fixed_window::evaluate` /
//! `fixed_window::peek` or `gcra::evaluate` / `gcra::peek` at the same pinned time (a batch:
//! every check evaluated in input order, committed only when all are allowed, else the first
//! quota denial). Asserted at every step, exactly:
//!
//! - every decision equals the reference's: allowed, shadow-denied or denied, the batch's
//!   index, the capacity, `available`, and `replenishes_after` / `retry_after` as `Duration`s;
//! - every peek equals the reference's snapshot;
//! - every key's state string equals the reference's (`<deadline>:<used>`, or GCRA `<t>:<r>`
//!   from `TheoreticalArrivalTime::to_parts`), absent only while the reference has none or its
//!   state has expired (a batch that writes nothing may still clean an expired entry), and its
//!   score in the expiry index equals the state's expiry (the deadline, or ⌈tat/Q⌉).
//!
//! Both tests are `#[ignore]`d so a plain `cargo test` needs no server:
//!
//! ```text
//! RUNLIMIT_REDIS_TEST_URL=redis://127.0.0.1:6379 \
//!     cargo test -p runlimit-redis --test redis differential:: -- --include-ignored
//! ```

use crate::support;

use std::{
    fmt::Debug,
    sync::atomic::{AtomicU64, Ordering},
    time::Duration,
};

use proptest::{
    collection::vec,
    prelude::*,
    test_runner::{Config, FileFailurePersistence, TestCaseError, TestRunner},
};
use redis::aio::MultiplexedConnection;
use runlimit_core::{
    Allowance, BatchDecision, BatchDecisionView, Check, Decision, DecisionView, Delay, Denial,
    FixedWindowPolicy, GcraPolicy, MAX_LIMIT, MAX_WINDOW_MILLIS, PolicyError, PolicyId, QuotaDenial,
    QuotaMode, QuotaSnapshot, ScopeId, SubjectKey,
    backend::{
        fixed_window::{self, FixedWindowOutcome, FixedWindowParameters, Window},
        gcra::{self, GcraOutcome, GcraParameters, TheoreticalArrivalTime},
        is_expired,
    },
};
use runlimit_redis::{KeyPrefix, RedisAlgorithm, RedisConfig, RedisStore};

/// How far ahead of the server's clock the pinned time starts: about 11.6 days. A case
/// advances by at most 20 × 2 × `MAX_WINDOW_MILLIS` ≈ 3.6·10¹⁴ ms, so every millisecond value
/// the scripts see stays below 10¹⁵ (and 2⁵³).
const AHEAD_MILLIS: u64 = 1_000_000_000;
/// Cases per test.
const CASES: u32 = 96;
/// The most steps of one case.
const MAX_STEPS: usize = 20;
/// Counter keys per case: two policies × two subjects; key `k` is policy `k / 2`, subject
/// `k % 2`.
const KEYS: usize = 4;
/// The scripts' limb base.
const LIMB: u64 = 1_000_000_000;
const TWO_53: u64 = 1 << 53;

/// One algorithm's reference: the core rule, and the state encoding of the documented layout.
trait Rule: RedisAlgorithm + Debug + 'static {
    /// The algorithm's tag in key names.
    const KEY_TAG: &'static str;
    /// The generated parameters of a policy.
    type Params: Clone + Debug;
    /// The reference's state of one key.
    type Stored: Copy + Debug;

    fn build(id: &str, params: &Self::Params, mode: QuotaMode) -> Result<Self, PolicyError>;
    /// `Ok((allowance, state to store))` or `Err(denial)`.
    fn decide(
        &self,
        state: Option<Self::Stored>,
        now: u64,
        cost: u64,
    ) -> Result<(Allowance, Self::Stored), QuotaDenial>;
    fn snapshot(&self, state: Option<Self::Stored>, now: u64) -> QuotaSnapshot;
    /// The stored string of a state.
    fn encode(&self, state: Self::Stored) -> String;
    /// The first millisecond at which the state is equivalent to none.
    fn expiry(&self, state: Self::Stored) -> u64;
    /// The window, or the full replenishment time.
    fn span(&self) -> u64;
    /// The window, or the period.
    fn period_millis(&self) -> u64;
}

impl Rule for FixedWindowPolicy {
    const KEY_TAG: &'static str = "fw";
    /// `(limit, window ms)`.
    type Params = (u64, u64);
    type Stored = Window;

    fn build(id: &str, &(limit, window): &(u64, u64), mode: QuotaMode) -> Result<Self, PolicyError> {
        Ok(Self::new(policy_id(id), scope(), limit, Duration::from_millis(window))?.with_quota_mode(mode))
    }

    fn decide(&self, state: Option<Window>, now: u64, cost: u64) -> Result<(Allowance, Window), QuotaDenial> {
        match fixed_window::evaluate(&FixedWindowParameters::of(self), state, now, cost) {
            FixedWindowOutcome::Allowed { allowance, window, .. } => Ok((allowance, window)),
            FixedWindowOutcome::Exhausted(denial) => Err(denial),
        }
    }

    fn snapshot(&self, state: Option<Window>, now: u64) -> QuotaSnapshot {
        fixed_window::peek(&FixedWindowParameters::of(self), state, now)
    }

    fn encode(&self, state: Window) -> String {
        format!("{}:{}", state.deadline_ms(), state.used())
    }

    fn expiry(&self, state: Window) -> u64 {
        state.deadline_ms()
    }

    fn span(&self) -> u64 {
        self.window().as_millis()
    }

    fn period_millis(&self) -> u64 {
        self.window().as_millis()
    }
}

impl Rule for GcraPolicy {
    const KEY_TAG: &'static str = "gcra";
    /// `(quota, period ms, burst)`.
    type Params = (u64, u64, u64);
    type Stored = TheoreticalArrivalTime;

    fn build(
        id: &str,
        &(quota, period, burst): &(u64, u64, u64),
        mode: QuotaMode,
    ) -> Result<Self, PolicyError> {
        Ok(Self::new(policy_id(id), scope(), quota, Duration::from_millis(period), burst)?
            .with_quota_mode(mode))
    }

    fn decide(
        &self,
        state: Option<TheoreticalArrivalTime>,
        now: u64,
        cost: u64,
    ) -> Result<(Allowance, TheoreticalArrivalTime), QuotaDenial> {
        let parameters = GcraParameters::of(self);
        let outcome =
            gcra::evaluate(parameters, state, now, cost).expect("the reference's own state and a valid cost");
        match outcome {
            GcraOutcome::Allowed { tat, .. } => {
                Ok((outcome.allowance(parameters).expect("an allowance"), tat))
            }
            GcraOutcome::Denied { .. } => Err(outcome.quota_denial(parameters).expect("a denial")),
        }
    }

    fn snapshot(&self, state: Option<TheoreticalArrivalTime>, now: u64) -> QuotaSnapshot {
        gcra::peek(GcraParameters::of(self), state, now).expect("the reference's own state")
    }

    fn encode(&self, state: TheoreticalArrivalTime) -> String {
        let (millis, remainder) =
            state.to_parts(GcraParameters::of(self)).expect("parts of a reachable state");
        format!("{millis}:{remainder}")
    }

    fn expiry(&self, state: TheoreticalArrivalTime) -> u64 {
        state.expires_at_millis(GcraParameters::of(self))
    }

    fn span(&self) -> u64 {
        self.full_replenishment().as_millis()
    }

    fn period_millis(&self) -> u64 {
        self.period().as_millis()
    }
}

fn policy_id(id: &str) -> PolicyId {
    PolicyId::new(id).expect("a valid policy id")
}

fn scope() -> ScopeId {
    ScopeId::new("subject").expect("a valid scope")
}

// --- Generated cases ---------------------------------------------------------------------------

/// A check's cost, resolved against the key's policy and reference state at the step's time,
/// then clamped to 1..=capacity.
#[derive(Clone, Copy, Debug)]
enum Cost {
    One,
    Full,
    Half,
    /// What is available now, plus -1, 0 or 1: the exact fit and both neighbours.
    Available(i8),
    /// The cost that brings the units used (capacity − available) to the next multiple of 10⁹,
    /// plus -1, 0 or 1: limb carries.
    Carry(i8),
    /// `1 + seed % capacity`.
    Any(u64),
}

/// How far a step moves the pinned time, resolved against the reference.
#[derive(Clone, Copy, Debug)]
enum Advance {
    None,
    Small(u64),
    /// To a key's expiry (deadline or ⌈tat/Q⌉) plus -2..=2 ms; 0 without a later one.
    Expiry(usize, i64),
    /// To the last denial's retry instant plus -1..=1 ms; 0 without a later one.
    Retry(i64),
    /// By a key's `next_unit_after` plus -1..=1 ms; 0 when its quota is full.
    NextUnit(usize, i64),
    /// By `per_mille / 1000` of the window (full replenishment), up to twice it.
    Span(u64),
    /// By one or two windows (periods), plus -1..=1 ms.
    Periods(u64, i64),
}

#[derive(Clone, Debug)]
enum Op {
    Check(usize, Cost),
    /// Distinct keys in input order.
    Batch(Vec<(usize, Cost)>),
}

#[derive(Clone, Debug)]
struct Case<T> {
    policies: [T; 2],
    shadow: bool,
    /// The two subjects' first bytes (shard) and second bytes (bucket byte).
    placements: [(u8, u8); 2],
    /// The case's first instant, after the test's base time.
    start: u64,
    steps: Vec<(Advance, Op)>,
}

/// Limits, quotas and bursts across the accepted domain.
fn count() -> impl Strategy<Value = u64> {
    prop_oneof![
        2 => 1u64..=4,
        2 => 1u64..=1_000,
        2 => (TWO_53 - 3)..=(TWO_53 + 3),
        1 => (MAX_LIMIT - 2)..=MAX_LIMIT,
        2 => prop::sample::select(vec![
            LIMB - 1,
            LIMB,
            LIMB + 1,
            2 * LIMB,
            LIMB * LIMB - 1,
            LIMB * LIMB,
            LIMB * LIMB + 1,
        ]),
        1 => 1u64..=MAX_LIMIT,
    ]
}

/// Windows and periods across the accepted domain, in ms.
fn millis() -> impl Strategy<Value = u64> {
    prop_oneof![
        2 => 1u64..=3,
        2 => 1u64..=100_000,
        1 => prop::sample::select(vec![333u64, 1_000, 60_000, 3_600_000, 86_400_000]),
        2 => (MAX_WINDOW_MILLIS - 2)..=MAX_WINDOW_MILLIS,
        1 => 1u64..=MAX_WINDOW_MILLIS,
    ]
}

/// The largest burst whose full replenishment ⌈B·P/Q⌉ is at most `MAX_WINDOW_MILLIS`:
/// B·P ≤ `MAX_WINDOW_MILLIS`·Q. At least 1, since P ≤ `MAX_WINDOW_MILLIS`.
fn largest_burst(quota: u64, period: u64) -> u64 {
    let most = u128::from(MAX_WINDOW_MILLIS) * u128::from(quota) / u128::from(period);
    u64::try_from(most.min(u128::from(MAX_LIMIT))).unwrap_or(MAX_LIMIT)
}

fn fixed_window_params() -> impl Strategy<Value = (u64, u64)> {
    (count(), millis())
}

fn gcra_params() -> impl Strategy<Value = (u64, u64, u64)> {
    (count(), millis()).prop_flat_map(|(quota, period)| {
        let most = largest_burst(quota, period);
        let burst = prop_oneof![
            1 => Just(1u64),
            1 => Just(2u64.min(most)),
            2 => Just(most),
            1 => Just(most.saturating_sub(1).max(1)),
            2 => Just(quota.min(most)),
            2 => 1..=most,
            2 => count().prop_map(move |burst| burst.min(most)),
        ];
        (Just(quota), Just(period), burst)
    })
}

fn cost() -> impl Strategy<Value = Cost> {
    prop_oneof![
        3 => Just(Cost::One),
        1 => Just(Cost::Full),
        1 => Just(Cost::Half),
        3 => (-1i8..=1).prop_map(Cost::Available),
        1 => (-1i8..=1).prop_map(Cost::Carry),
        2 => any::<u64>().prop_map(Cost::Any),
    ]
}

fn key() -> impl Strategy<Value = usize> {
    // Key 0 more often, so that some key gets a long history.
    prop_oneof![2 => Just(0usize), 3 => 0..KEYS]
}

fn advance() -> impl Strategy<Value = Advance> {
    prop_oneof![
        3 => Just(Advance::None),
        2 => (1u64..=3).prop_map(Advance::Small),
        3 => (key(), -2i64..=2).prop_map(|(key, delta)| Advance::Expiry(key, delta)),
        2 => (-1i64..=1).prop_map(Advance::Retry),
        2 => (key(), -1i64..=1).prop_map(|(key, delta)| Advance::NextUnit(key, delta)),
        2 => (0u64..=2_000).prop_map(Advance::Span),
        1 => (1u64..=2, -1i64..=1).prop_map(|(periods, delta)| Advance::Periods(periods, delta)),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (key(), cost()).prop_map(|(key, cost)| Op::Check(key, cost)),
        1 => (Just((0..KEYS).collect::<Vec<_>>()).prop_shuffle(), 2..=KEYS, vec(cost(), KEYS)).prop_map(
            |(keys, size, costs)| Op::Batch(keys.into_iter().zip(costs).take(size).collect())
        ),
    ]
}

fn placements() -> impl Strategy<Value = [(u8, u8); 2]> {
    prop_oneof![
        // One shard, one bucket.
        any::<(u8, u8)>().prop_map(|place| [place, place]),
        // One shard, any buckets.
        any::<(u8, u8, u8)>().prop_map(|(shard, a, b)| [(shard, a), (shard, b)]),
        any::<[(u8, u8); 2]>(),
    ]
}

fn cases<S: Strategy>(params: fn() -> S) -> impl Strategy<Value = Case<S::Value>>
where
    S::Value: Clone + Debug,
{
    (
        [params(), params()],
        prop::bool::weighted(0.2),
        placements(),
        0u64..1_000_000,
        vec((advance(), op()), 1..=MAX_STEPS),
    )
        .prop_map(|(policies, shadow, placements, start, steps)| Case {
            policies,
            shadow,
            placements,
            start,
            steps,
        })
}

// --- Running a case ----------------------------------------------------------------------------

/// One test's limiter, direct connection, key prefix and base time.
struct Env<P: Rule> {
    limiter: RedisStore<P>,
    connection: MultiplexedConnection,
    prefix: String,
    base: u64,
}

/// A subject no other case (or shrinking run) uses: the case's shard and bucket bytes, then a
/// process-wide counter in bytes 2 to 9 (inside the 16 bytes of the member name).
fn fresh_subject((shard, bucket): (u8, u8)) -> SubjectKey {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    let mut digest = [0xA5u8; 32];
    digest[0] = shard;
    digest[1] = bucket;
    digest[2..10].copy_from_slice(&NEXT.fetch_add(1, Ordering::Relaxed).to_le_bytes());
    SubjectKey::from_digest(digest)
}

/// Sets the watermark of each of `shards` to `millis`: the time the limiter sees there.
async fn pin(connection: &mut MultiplexedConnection, prefix: &str, tag: &str, shards: &[u8], millis: u64) {
    let mut pipe = redis::pipe();
    for &shard in shards {
        pipe.hset(support::shard_hash(prefix, tag, shard), "w", millis).ignore();
    }
    let () = pipe.query_async(connection).await.expect("pin the shard watermarks");
}

fn millis_of(delay: Delay) -> u64 {
    u64::try_from(delay.millis()).expect("a delay within u64 ms")
}

/// `target + delta − now`, or 0 when that is not ahead of `now`.
fn until(target: u64, delta: i64, now: u64) -> u64 {
    target.saturating_add_signed(delta).saturating_sub(now)
}

/// A decision's fields, with delays as exact `Duration`s (`Delay::duration`):
/// `(outcome, capacity, available, replenishes_after or retry_after)`.
type Summary = (&'static str, u64, Option<u64>, Option<Duration>);

fn allowance_summary(allowance: &Allowance) -> Summary {
    (
        "allowed",
        allowance.capacity().get(),
        Some(allowance.available()),
        Some(allowance.replenishes_after().duration()),
    )
}

fn denial_summary(outcome: &'static str, denial: &Denial) -> Summary {
    match denial {
        Denial::QuotaExceeded(quota) => {
            (outcome, quota.capacity().get(), None, Some(quota.retry_after().duration()))
        }
        Denial::StorageCapacity { retry_after } => ("storage", 0, None, retry_after.map(Delay::duration)),
    }
}

fn summary(view: DecisionView<'_>) -> Summary {
    match view {
        DecisionView::Allowed { allowance } => allowance_summary(allowance),
        DecisionView::ShadowDenied { denial } => {
            ("shadow-denied", denial.capacity().get(), None, Some(denial.retry_after().duration()))
        }
        DecisionView::Denied { denial } => denial_summary("denied", denial),
    }
}

fn batch_summary(view: BatchDecisionView<'_>) -> (Option<usize>, Vec<Summary>) {
    match view {
        BatchDecisionView::Allowed { allowances } => {
            (None, allowances.iter().map(allowance_summary).collect())
        }
        BatchDecisionView::ShadowDenied { index, denial, .. } => (
            Some(index),
            vec![("shadow-denied", denial.capacity().get(), None, Some(denial.retry_after().duration()))],
        ),
        BatchDecisionView::Denied { index, denial, .. } => {
            (Some(index), vec![denial_summary("denied", denial)])
        }
    }
}

/// One case's reference and where it stands.
struct Run<'a, P: Rule> {
    policies: &'a [P; 2],
    subjects: [SubjectKey; 2],
    states: [Option<P::Stored>; KEYS],
    now: u64,
    /// The instant the last denial said to retry at.
    retry_at: Option<u64>,
}

impl<P: Rule> Run<'_, P> {
    fn policy(&self, key: usize) -> &P {
        &self.policies[key / 2]
    }

    fn subject(&self, key: usize) -> SubjectKey {
        self.subjects[key % 2]
    }

    fn check(&self, key: usize, cost: u64) -> Check<'_, P> {
        Check::new(self.subject(key).bind(self.policy(key)))
            .with_cost(cost)
            .expect("a cost within the capacity")
    }

    fn advance(&self, advance: Advance) -> u64 {
        let now = self.now;
        match advance {
            Advance::None => 0,
            Advance::Small(millis) => millis,
            Advance::Expiry(key, delta) => {
                self.states[key].map_or(0, |state| until(self.policy(key).expiry(state), delta, now))
            }
            Advance::Retry(delta) => self.retry_at.map_or(0, |at| until(at, delta, now)),
            Advance::NextUnit(key, delta) => self
                .policy(key)
                .snapshot(self.states[key], now)
                .next_unit_after()
                .map_or(0, |delay| millis_of(delay).saturating_add_signed(delta)),
            Advance::Span(per_mille) => {
                let span = u128::from(self.policies[0].span().max(self.policies[1].span()));
                u64::try_from(span * u128::from(per_mille) / 1_000).expect("at most twice a span")
            }
            Advance::Periods(periods, delta) => {
                (self.policies[0].period_millis() * periods).saturating_add_signed(delta)
            }
        }
    }

    fn cost(&self, key: usize, cost: Cost) -> u64 {
        let policy = self.policy(key);
        let capacity = policy.capacity().get();
        let available = policy.snapshot(self.states[key], self.now).available();
        let wanted = match cost {
            Cost::One => 1,
            Cost::Full => i128::from(capacity),
            Cost::Half => i128::from(capacity / 2),
            Cost::Available(delta) => i128::from(available) + i128::from(delta),
            Cost::Carry(delta) => {
                let used = capacity - available;
                i128::from(LIMB - used % LIMB) + i128::from(delta)
            }
            Cost::Any(seed) => i128::from(1 + seed % capacity),
        };
        u64::try_from(wanted.clamp(1, i128::from(capacity))).expect("clamped to the capacity")
    }
}

fn fail(message: String) -> TestCaseError {
    TestCaseError::fail(message)
}

async fn run_case<P: Rule>(env: &Env<P>, case: &Case<P::Params>) -> Result<(), TestCaseError> {
    let mode = if case.shadow { QuotaMode::Shadow } else { QuotaMode::Enforce };
    let built = [P::build("diff.p0", &case.policies[0], mode), P::build("diff.p1", &case.policies[1], mode)];
    let policies = match built {
        [Ok(first), Ok(second)] => [first, second],
        // Outside the accepted domain (a GCRA replenishment above MAX_WINDOW): skip.
        _ => return Err(TestCaseError::reject("a policy the constructor refuses")),
    };
    let mut connection = env.connection.clone();
    let subjects = case.placements.map(fresh_subject);
    let mut shards: Vec<u8> = subjects.iter().map(|subject| subject.as_bytes()[0]).collect();
    shards.dedup();
    let mut run = Run::<P> {
        policies: &policies,
        subjects,
        states: [None; KEYS],
        now: env.base + case.start,
        retry_at: None,
    };
    for (step, &(advance, ref op)) in case.steps.iter().enumerate() {
        run.now += run.advance(advance);
        let now = run.now;
        pin(&mut connection, &env.prefix, P::KEY_TAG, &shards, now).await;

        for key in 0..KEYS {
            let got = env.limiter.peek(run.subject(key).bind(run.policy(key))).await.map_err(|error| {
                fail(format!("step {step}: peek of key {key} at {now} ms failed: {error}"))
            })?;
            let want = run.policy(key).snapshot(run.states[key], now);
            prop_assert_eq!(got, want, "step {}: peek of key {} at {} ms", step, key, now);
        }

        match op {
            &Op::Check(key, cost) => {
                let cost = run.cost(key, cost);
                let got = env.limiter.check(&run.check(key, cost)).await.map_err(|error| {
                    fail(format!("step {step}: check of key {key}, cost {cost}, at {now} ms failed: {error}"))
                })?;
                let want = match run.policy(key).decide(run.states[key], now, cost) {
                    Ok((allowance, next)) => {
                        run.states[key] = Some(next);
                        Decision::allowed(allowance)
                    }
                    Err(denial) => {
                        run.retry_at = Some(now + millis_of(denial.retry_after()));
                        Decision::quota_exceeded(denial, mode)
                    }
                };
                prop_assert_eq!(
                    summary(got.view()),
                    summary(want.view()),
                    "step {}: check of key {}, cost {}, at {} ms",
                    step,
                    key,
                    cost,
                    now
                );
                prop_assert_eq!(got, want);
            }
            Op::Batch(members) => {
                let members: Vec<(usize, u64)> =
                    members.iter().map(|&(key, cost)| (key, run.cost(key, cost))).collect();
                let checks: Vec<Check<'_, P>> =
                    members.iter().map(|&(key, cost)| run.check(key, cost)).collect();
                let got = env.limiter.check_all(&checks).await.map_err(|error| {
                    fail(format!("step {step}: batch {members:?} at {now} ms failed: {error}"))
                })?;
                let mut allowances = Vec::new();
                let mut next = Vec::new();
                let mut first_denial = None;
                for (index, &(key, cost)) in members.iter().enumerate() {
                    match run.policy(key).decide(run.states[key], now, cost) {
                        Ok((allowance, state)) => {
                            allowances.push(allowance);
                            next.push((key, state));
                        }
                        Err(denial) => {
                            first_denial.get_or_insert((index, denial));
                        }
                    }
                }
                let want = match first_denial {
                    None => {
                        for (key, state) in next {
                            run.states[key] = Some(state);
                        }
                        BatchDecision::allowed(allowances).expect("a non-empty batch")
                    }
                    Some((index, denial)) => {
                        run.retry_at = Some(now + millis_of(denial.retry_after()));
                        BatchDecision::quota_exceeded(index, members.len(), denial, mode)
                            .expect("an index in range")
                    }
                };
                prop_assert_eq!(
                    batch_summary(got.view()),
                    batch_summary(want.view()),
                    "step {}: batch {:?} at {} ms",
                    step,
                    members,
                    now
                );
                prop_assert_eq!(got.view(), want.view());
            }
        }

        for key in 0..KEYS {
            let policy = run.policy(key);
            let (state, expiry) =
                support::stored_entry(&mut connection, &env.prefix, P::KEY_TAG, policy, &run.subject(key))
                    .await;
            match run.states[key] {
                None => prop_assert_eq!(
                    (state, expiry),
                    (None, None),
                    "step {}: key {} has no reference state at {} ms",
                    step,
                    key,
                    now
                ),
                Some(reference) => {
                    let cleaned =
                        state.is_none() && expiry.is_none() && is_expired(policy.expiry(reference), now);
                    if !cleaned {
                        prop_assert_eq!(
                            state,
                            Some(policy.encode(reference)),
                            "step {}: stored state of key {} at {} ms",
                            step,
                            key,
                            now
                        );
                        // The expiry set scores a member by a lower bound of its state's expiry
                        // (exact when the member was added; admissions of a stored key never
                        // rewrite it, since an expiry never decreases): a whole number of ms, at
                        // most the real expiry. Scores below 2^53 are exact.
                        let score =
                            expiry.unwrap_or_else(|| panic!("step {step}: key {key} has no expiry score"));
                        prop_assert!(
                            score.fract() == 0.0 && score >= 0.0 && score <= policy.expiry(reference) as f64,
                            "step {}: expiry score {} of key {} at {} ms is not a lower bound of {}",
                            step,
                            score,
                            key,
                            now,
                            policy.expiry(reference)
                        );
                    }
                }
            }
        }
    }
    Ok(())
}

fn differential<P: Rule, S: Strategy<Value = P::Params>>(name: &'static str, params: fn() -> S) {
    let runtime = support::runtime();
    let env = runtime.block_on(async {
        let url = support::server_url();
        let mut connection = support::connect(&url).await;
        let base = support::server_millis(&mut connection).await + AHEAD_MILLIS;
        let prefix = support::unique_prefix(name);
        let config = RedisConfig::default().with_key_prefix(KeyPrefix::new(&prefix).expect("a valid prefix"));
        let limiter = RedisStore::<P>::new(&url).expect("a valid URL").with_config(config);
        limiter.prepare().await.expect("prepare the test server");
        Env { limiter, connection, prefix, base }
    });
    let mut runner = TestRunner::new(Config {
        cases: CASES,
        max_shrink_iters: 1_024,
        max_shrink_time: 120_000,
        // A failure's seed goes to tests/redis/differential.proptest-regressions.
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource("proptest-regressions"))),
        source_file: Some(file!()),
        test_name: Some(name),
        ..Config::default()
    });
    let result = runner.run(&cases(params), |case| {
        runtime.block_on(async {
            tokio::time::timeout(Duration::from_secs(60), run_case(&env, &case))
                .await
                .unwrap_or_else(|_| Err(fail("the case took over 60 s".to_owned())))
        })
    });
    match result {
        // Keys are kept for inspection when a case fails.
        Ok(()) => runtime.block_on(async {
            let mut connection = env.connection.clone();
            support::delete_prefix(&mut connection, &env.prefix).await;
            assert!(support::keys_under(&mut connection, &env.prefix).await.is_empty());
        }),
        Err(error) => panic!("{name} (keys kept under prefix {}): {error}", env.prefix),
    }
}

#[test]
#[ignore = "needs RUNLIMIT_REDIS_TEST_URL"]
fn fixed_window_lua_matches_the_core_rule() {
    differential::<FixedWindowPolicy, _>("differential_fixed_window", fixed_window_params);
}

#[test]
#[ignore = "needs RUNLIMIT_REDIS_TEST_URL"]
fn gcra_lua_matches_the_core_rule() {
    differential::<GcraPolicy, _>("differential_gcra", gcra_params);
}
