//! `runlimit_core::backend::gcra::evaluate` against a straightforward reference model in exact
//! rationals: the real-valued GCRA formulas (T = P/Q, τ = (B − 1)·T) with T = P/Q as a `BigRational`, then
//! `ceil`/`floor` only for reporting.
//!
//! Policies are random and valid (including Q or B = `MAX_LIMIT`, P = `MAX_WINDOW`, Q = 1,
//! B = 1, and B at the largest value the full-replenishment bound allows); request sequences
//! are mostly non-decreasing in time, occasionally step backwards, and include exact
//! retry-after boundaries. Every output is compared: allowed/denied, remaining/available,
//! replenish, next unit, retry-after, the new TAT as a rational, its parts and its expiry.

use std::time::Duration;

use num_bigint::BigInt;
use num_rational::BigRational;
use num_traits::ToPrimitive;
use proptest::{prelude::*, test_runner::FileFailurePersistence};
use runlimit_core::{
    Allowance, Capacity, Delay, GcraPolicy, MAX_LIMIT, MAX_WINDOW_MILLIS, PolicyError, PolicyId, QuotaDenial,
    QuotaPeriod, ScopeId,
    backend::gcra::{GcraError, GcraOutcome, GcraParameters, TheoreticalArrivalTime, evaluate},
};

fn int(value: impl Into<BigInt>) -> BigRational {
    BigRational::from_integer(value.into())
}

fn floor(value: &BigRational) -> BigInt {
    value.floor().to_integer()
}

fn ceil(value: &BigRational) -> BigInt {
    value.ceil().to_integer()
}

/// What the reference model answers for one request.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Expected {
    Allowed {
        /// The new TAT in milliseconds, exact.
        tat: BigRational,
        remaining: BigInt,
        replenish: BigInt,
        next_unit: BigInt,
    },
    Denied {
        retry_after: BigInt,
        available: BigInt,
    },
}

/// The real-valued GCRA formulas, verbatim in exact rationals (milliseconds).
struct Reference {
    emission_interval: BigRational,
    burst: BigRational,
    tat: Option<BigRational>,
}

impl Reference {
    fn new(quota: u64, period_ms: u64, burst: u64) -> Self {
        Self { emission_interval: int(period_ms) / int(quota), burst: int(burst), tat: None }
    }

    fn request(&mut self, now_ms: u64, cost: u64) -> Expected {
        let t = &self.emission_interval;
        let now = int(now_ms);
        let base = match &self.tat {
            Some(tat) if *tat > now => tat.clone(),
            _ => now.clone(),
        };
        let cand = &base + int(cost) * t;
        let burst_span = &self.burst * t;
        if &cand - &now <= burst_span {
            let remaining = floor(&((&now + &burst_span - &cand) / t));
            let replenish = ceil(&(&cand - &now));
            let untouched = (&self.burst - int(remaining.clone()) - int(1)) * t;
            let next_unit = ceil(&(&cand - &now - untouched));
            self.tat = Some(cand.clone());
            Expected::Allowed { tat: cand, remaining, replenish, next_unit }
        } else {
            let retry_after = ceil(&(&cand - (&now + &burst_span)));
            // Units spendable now. After the clock steps back past the stored state the
            // §2 quotient is negative; nothing is spendable, so the count is 0, never negative.
            let available = floor(&((&now + &burst_span - &base) / t)).max(BigInt::from(0));
            Expected::Denied { retry_after, available }
        }
    }
}

fn to_u64(value: &BigInt) -> Option<u64> {
    value.to_u64()
}

fn bounded_u64(value: &BigInt) -> u64 {
    to_u64(value).unwrap_or(u64::MAX)
}

#[derive(Debug, Clone, Copy)]
enum Step {
    /// The same millisecond again.
    Same,
    /// A few milliseconds later.
    Small(u64),
    /// `sixteenths / 16` of an emission interval later (rounded down).
    Intervals(u64),
    /// `sixteenths / 16` of the full replenishment time later.
    Replenishment(u64),
    /// Exactly at the last denial's retry-after (must succeed with the same cost).
    AtRetry,
    /// One millisecond before the last denial's retry-after (must still be denied).
    BeforeRetry,
    /// Any amount later (saturating at `u64::MAX`).
    Far(u64),
    /// Backwards: the clock steps back by this many emission-interval sixteenths.
    BackIntervals(u64),
    /// Backwards by a few milliseconds.
    BackSmall(u64),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => Just(Step::Same),
        4 => (1u64..=3).prop_map(Step::Small),
        8 => (0u64..=48).prop_map(Step::Intervals),
        3 => (0u64..=20).prop_map(Step::Replenishment),
        3 => Just(Step::AtRetry),
        3 => Just(Step::BeforeRetry),
        1 => any::<u64>().prop_map(Step::Far),
        1 => (1u64..=32).prop_map(Step::BackIntervals),
        1 => (1u64..=5).prop_map(Step::BackSmall),
    ]
}

#[derive(Debug, Clone, Copy)]
enum Cost {
    One,
    Burst,
    Same,
    Random(u64),
}

fn cost() -> impl Strategy<Value = Cost> {
    prop_oneof![
        6 => Just(Cost::One),
        2 => Just(Cost::Burst),
        2 => Just(Cost::Same),
        3 => any::<u64>().prop_map(Cost::Random),
    ]
}

/// (Q, P ms, B): random, with the extremes weighted in. B is drawn at or below the largest
/// value with ⌈B·P/Q⌉ ≤ MAX_WINDOW, so every generated policy is valid.
fn policy() -> impl Strategy<Value = (u64, u64, u64)> {
    let quota = prop_oneof![
        2 => Just(1u64),
        2 => Just(MAX_LIMIT),
        3 => prop::sample::select(vec![2u64, 3, 7, 10, 60, 1_000, 999_983, MAX_LIMIT - 1]),
        2 => 1u64..=100,
        2 => 1u64..=MAX_LIMIT,
    ];
    let period = prop_oneof![
        2 => Just(1u64),
        2 => Just(MAX_WINDOW_MILLIS),
        3 => prop::sample::select(vec![3u64, 999, 1_000, 60_000, 86_400_000, MAX_WINDOW_MILLIS - 1]),
        2 => 1u64..=100_000,
        2 => 1u64..=MAX_WINDOW_MILLIS,
    ];
    (quota, period).prop_flat_map(|(quota, period)| {
        let largest = largest_burst(quota, period);
        let burst = prop_oneof![
            3 => Just(1u64),
            2 => Just(largest),
            2 => 1u64..=largest.min(50),
            2 => 1u64..=largest,
        ];
        (Just(quota), Just(period), burst)
    })
}

/// min(⌊MAX_WINDOW · Q / P⌋, MAX_LIMIT): ⌈B·P/Q⌉ ≤ W ⇔ B·P/Q ≤ W for integer W.
fn largest_burst(quota: u64, period: u64) -> u64 {
    let bound = u128::from(MAX_WINDOW_MILLIS) * u128::from(quota) / u128::from(period);
    u64::try_from(bound).unwrap_or(u64::MAX).min(MAX_LIMIT)
}

fn start() -> impl Strategy<Value = u64> {
    prop_oneof![
        Just(0u64),
        Just(1_800_000_000_000u64),
        any::<u64>(),
        (0u64..1_000).prop_map(|back| u64::MAX - back),
        Just(u64::MAX),
    ]
}

fn parameters(quota: u64, period: u64, burst: u64) -> Result<GcraParameters, PolicyError> {
    GcraParameters::new(
        Capacity::new(quota).unwrap(),
        QuotaPeriod::new(Duration::from_millis(period)).unwrap(),
        Capacity::new(burst).unwrap(),
    )
}

fn sixteenths(amount: u64, quota: u64, period: u64, sixteenths: u64) -> u64 {
    let value = u128::from(amount) * u128::from(period) * u128::from(sixteenths) / (u128::from(quota) * 16);
    u64::try_from(value).unwrap_or(u64::MAX)
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 1_024,
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource("proptest-regressions"))),
        ..ProptestConfig::default()
    })]

    #[test]
    fn evaluate_matches_rational_reference(
        (quota, period, burst) in policy(),
        start in start(),
        steps in prop::collection::vec((step(), cost()), 1..48),
    ) {
        let params = parameters(quota, period, burst).unwrap();
        // The policy constructor accepts the same numbers and yields the same parameters.
        let policy = GcraPolicy::new(
            PolicyId::new("p").unwrap(),
            ScopeId::new("s").unwrap(),
            quota,
            Duration::from_millis(period),
            burst,
        )
        .unwrap();
        prop_assert_eq!(*GcraParameters::of(&policy), params);
        // The bound is tight: one more unit of burst is rejected with the exact replenishment.
        if burst == largest_burst(quota, period) && burst < MAX_LIMIT {
            let over = (u128::from(burst) + 1) * u128::from(period);
            prop_assert_eq!(
                parameters(quota, period, burst + 1),
                Err(PolicyError::ReplenishmentTooLong {
                    millis: over.div_ceil(u128::from(quota)),
                    maximum_millis: MAX_WINDOW_MILLIS,
                })
            );
        }

        let full = sixteenths(burst, quota, period, 16);
        let mut reference = Reference::new(quota, period, burst);
        let mut tat: Option<TheoreticalArrivalTime> = None;
        let mut now = start;
        let mut last_cost = 1u64;
        // The latest denial since the last allowed request: (time, retry-after, cost).
        let mut last_denial: Option<(u64, u64, u64)> = None;
        for (index, (step, cost)) in steps.into_iter().enumerate() {
            let mut expect_allowed = None;
            let mut retry_cost = None;
            now = match step {
                Step::Same => now,
                Step::Small(ms) => now.saturating_add(ms),
                Step::Intervals(n) => now.saturating_add(sixteenths(1, quota, period, n)),
                Step::Replenishment(n) => now.saturating_add(full / 16 * n),
                Step::AtRetry | Step::BeforeRetry => match last_denial {
                    Some((at, retry, denied_cost)) => {
                        let target = if matches!(step, Step::AtRetry) { retry } else { retry - 1 };
                        match at.checked_add(target) {
                            Some(then) => {
                                expect_allowed = Some(matches!(step, Step::AtRetry));
                                retry_cost = Some(denied_cost);
                                then
                            }
                            None => now,
                        }
                    }
                    None => now.saturating_add(1),
                },
                Step::Far(ms) => now.saturating_add(ms),
                Step::BackIntervals(n) => now.saturating_sub(sixteenths(1, quota, period, n)),
                Step::BackSmall(ms) => now.saturating_sub(ms),
            };
            let cost = match (retry_cost, cost) {
                // Retry boundaries are defined for the denied request's cost.
                (Some(denied_cost), _) => denied_cost,
                (None, Cost::One) => 1,
                (None, Cost::Burst) => burst,
                (None, Cost::Same) => last_cost,
                (None, Cost::Random(r)) => 1 + r % burst,
            };
            last_cost = cost;

            let expected = reference.request(now, cost);
            let actual = evaluate(&params, tat, now, cost);
            let context = format!("step {index}: now {now}, cost {cost}, expected {expected:?}, got {actual:?}");
            if let Some(allowed) = expect_allowed {
                prop_assert_eq!(matches!(expected, Expected::Allowed { .. }), allowed, "{}", context);
            }
            match (&expected, actual) {
                (
                    Expected::Allowed { tat: want_tat, remaining, replenish, next_unit },
                    Ok(outcome @ GcraOutcome::Allowed {
                        tat: got_tat,
                        remaining: got_remaining,
                        replenish_after_millis,
                        next_unit_after_millis,
                    }),
                ) => {
                    prop_assert_eq!(&BigRational::new(BigInt::from(got_tat.scaled()), BigInt::from(quota)), want_tat, "{}", &context);
                    prop_assert_eq!(&BigInt::from(got_remaining), remaining, "{}", &context);
                    prop_assert_eq!(&BigInt::from(replenish_after_millis), replenish, "{}", &context);
                    prop_assert_eq!(&BigInt::from(next_unit_after_millis), next_unit, "{}", &context);
                    prop_assert!(got_remaining < burst);
                    // Parts and expiry of the stored state.
                    let millis_part = floor(want_tat);
                    let parts = got_tat.to_parts(&params);
                    match to_u64(&millis_part) {
                        Some(millis) => {
                            let remainder = (want_tat - int(millis_part.clone())) * int(quota);
                            prop_assert_eq!(
                                parts,
                                Some((millis, remainder.to_integer().to_u64().unwrap())),
                                "{}", &context
                            );
                            prop_assert_eq!(
                                TheoreticalArrivalTime::from_parts(millis, parts.unwrap().1, &params),
                                Some(got_tat)
                            );
                        }
                        None => prop_assert_eq!(parts, None, "{}", &context),
                    }
                    prop_assert_eq!(got_tat.expires_at_millis(&params), bounded_u64(&ceil(want_tat)), "{}", &context);
                    // The decision values the outcome converts into.
                    prop_assert_eq!(
                        outcome.allowance(&params),
                        Some(
                            Allowance::new(
                                Capacity::new(burst).unwrap(),
                                got_remaining,
                                Delay::from_millis(replenish_after_millis)
                            )
                            .unwrap()
                        )
                    );
                    prop_assert_eq!(outcome.quota_denial(&params), None);
                    tat = Some(got_tat);
                    last_denial = None;
                }
                (
                    Expected::Denied { retry_after, available },
                    Ok(outcome @ GcraOutcome::Denied { retry_after_millis, available: got_available }),
                ) => {
                    prop_assert_eq!(&BigInt::from(retry_after_millis), retry_after, "{}", &context);
                    prop_assert_eq!(&BigInt::from(got_available), available, "{}", &context);
                    prop_assert!(retry_after_millis >= 1);
                    prop_assert!(got_available < cost, "{}", &context);
                    prop_assert_eq!(
                        outcome.quota_denial(&params),
                        Some(QuotaDenial::new(Capacity::new(burst).unwrap(), Delay::from_millis(retry_after_millis)))
                    );
                    prop_assert_eq!(outcome.allowance(&params), None);
                    last_denial = Some((now, retry_after_millis, cost));
                }
                // A clock far behind the stored state can make the retry-after exceed u64
                // milliseconds; the evaluator reports that instead of wrapping.
                (Expected::Denied { retry_after, .. }, Err(GcraError::StateOutOfRange))
                    if to_u64(retry_after).is_none() => {}
                _ => prop_assert!(false, "{}", context),
            }
        }
    }
}

/// The reference vectors of `runlimit_core::backend::gcra` through the reference model itself, so the model is pinned to
/// the spec and not only to the evaluator.
#[test]
fn reference_model_reproduces_spec_vectors() {
    let allowed = |remaining: u64, replenish: u64| (true, remaining, replenish);
    let denied = |retry: u64, available: u64| (false, retry, available);
    let run = |quota, period, burst, steps: &[(u64, u64, (bool, u64, u64))]| {
        let mut reference = Reference::new(quota, period, burst);
        for (index, &(now, cost, want)) in steps.iter().enumerate() {
            let got = match reference.request(now, cost) {
                Expected::Allowed { remaining, replenish, .. } => {
                    (true, to_u64(&remaining).unwrap(), to_u64(&replenish).unwrap())
                }
                Expected::Denied { retry_after, available } => {
                    (false, to_u64(&retry_after).unwrap(), to_u64(&available).unwrap())
                }
            };
            assert_eq!(got, want, "Q={quota} P={period} B={burst} step {index}");
        }
    };
    run(
        3,
        1_000,
        2,
        &[
            (0, 1, allowed(1, 334)),
            (0, 1, allowed(0, 667)),
            (0, 1, denied(334, 0)),
            (333, 1, denied(1, 0)),
            (334, 1, allowed(0, 666)),
            (667, 1, allowed(0, 667)),
            (1_000, 1, allowed(0, 667)),
            (5_000, 1, allowed(1, 334)),
        ],
    );
    run(
        1,
        60_000,
        1,
        &[(0, 1, allowed(0, 60_000)), (1, 1, denied(59_999, 0)), (60_000, 1, allowed(0, 60_000))],
    );
    run(
        5,
        1_000,
        5,
        &[
            (0, 3, allowed(2, 600)),
            (0, 3, denied(200, 2)),
            (199, 3, denied(1, 2)),
            (200, 3, allowed(0, 1_000)),
        ],
    );
    run(
        2,
        1_000,
        4,
        &[
            (0, 1, allowed(3, 500)),
            (0, 1, allowed(2, 1_000)),
            (0, 1, allowed(1, 1_500)),
            (0, 1, allowed(0, 2_000)),
            (0, 1, denied(500, 0)),
            (250, 1, denied(250, 0)),
            (500, 1, allowed(0, 2_000)),
            (1_250, 1, allowed(0, 1_750)),
            (2_000, 1, allowed(1, 1_500)),
            (2_001, 1, allowed(0, 1_999)),
        ],
    );
    // V1's next-unit figure: after the 5th hit at t = 0, one more unit in 100 ms.
    let mut reference = Reference::new(10, 1_000, 20);
    let mut last = None;
    for _ in 0..5 {
        last = Some(reference.request(0, 1));
    }
    let Some(Expected::Allowed { remaining, replenish, next_unit, .. }) = last else { panic!("allowed") };
    assert_eq!((remaining, replenish, next_unit), (BigInt::from(15), BigInt::from(500), BigInt::from(100)));
}

/// The largest policy at the largest clock reading: the reference and the evaluator agree
/// without overflow (see the Overflow section of `runlimit_core::backend::gcra`).
#[test]
fn extremes_agree() {
    for (quota, period, burst) in [
        (MAX_LIMIT, MAX_WINDOW_MILLIS, MAX_LIMIT),
        (1, MAX_WINDOW_MILLIS, 1),
        (MAX_LIMIT, 1, MAX_LIMIT),
        (MAX_LIMIT, MAX_WINDOW_MILLIS, 1),
        (1, 1, MAX_WINDOW_MILLIS),
    ] {
        let params = parameters(quota, period, burst).unwrap();
        let mut reference = Reference::new(quota, period, burst);
        let mut tat = None;
        for (now, cost) in [(u64::MAX, burst), (u64::MAX, 1), (u64::MAX - 1, 1), (0, 1), (u64::MAX, burst)] {
            let expected = reference.request(now, cost);
            let actual = evaluate(&params, tat, now, cost);
            match (&expected, &actual) {
                (
                    Expected::Allowed { tat: want, replenish, .. },
                    Ok(GcraOutcome::Allowed { tat: got, replenish_after_millis, .. }),
                ) => {
                    assert_eq!(BigRational::new(BigInt::from(got.scaled()), BigInt::from(quota)), *want);
                    assert_eq!(BigInt::from(*replenish_after_millis), *replenish);
                    tat = Some(*got);
                }
                (
                    Expected::Denied { retry_after, .. },
                    Ok(GcraOutcome::Denied { retry_after_millis, .. }),
                ) => {
                    assert_eq!(BigInt::from(*retry_after_millis), *retry_after);
                }
                (Expected::Denied { retry_after, .. }, Err(GcraError::StateOutOfRange)) => {
                    assert!(to_u64(retry_after).is_none(), "{quota} {period} {burst} at {now}");
                }
                _ => panic!("Q={quota} P={period} B={burst} now={now}: {expected:?} vs {actual:?}"),
            }
        }
    }
}

/// `TheoreticalArrivalTime::to_parts` fits PostgreSQL `bigint` exactly up to
/// `now_ms = i64::MAX − MAX_WINDOW_MILLIS` (the millisecond part is at most now plus the full
/// replenishment time), and not one millisecond later.
#[test]
fn parts_fit_bigint_up_to_the_documented_clock() {
    let bigint_max = u64::try_from(i64::MAX).unwrap();
    let params = parameters(1, MAX_WINDOW_MILLIS, 1).unwrap();
    let limit = bigint_max - MAX_WINDOW_MILLIS;
    for (now, millis) in [(limit, bigint_max), (limit + 1, bigint_max + 1)] {
        let Ok(GcraOutcome::Allowed { tat, .. }) = evaluate(&params, None, now, 1) else { panic!("allowed") };
        assert_eq!(tat.to_parts(&params), Some((millis, 0)));
    }
    // The remainder is below Q, which is at most MAX_LIMIT = i64::MAX.
    let params = parameters(MAX_LIMIT, 3, 1).unwrap();
    let Ok(GcraOutcome::Allowed { tat, .. }) = evaluate(&params, None, limit, 1) else { panic!("allowed") };
    assert_eq!(tat.to_parts(&params), Some((limit, 3)));
}
