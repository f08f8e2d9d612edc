//! Every public constructor, fed arbitrary input, returns a value or the exact typed error a
//! simple model of its documented rules predicts; none panics.

use std::time::Duration;

use num_bigint::BigUint;
use num_traits::ToPrimitive;
use proptest::{prelude::*, test_runner::FileFailurePersistence};
use runlimit_core::{
    Allowance, AllowanceError, BatchDecision, BatchDecisionError, BatchDecisionView, Capacity, Delay, Denial,
    FixedWindowPolicy, GcraPolicy, IdentifierError, KeyHasher, KeyHasherError, MAX_LIMIT, MAX_WINDOW,
    MAX_WINDOW_MILLIS, PolicyError, PolicyId, QuotaDenial, QuotaMode, QuotaPeriod, ScopeId,
    attempts::AttemptPolicy,
    backend::gcra::{GcraError, GcraOutcome, GcraParameters, TheoreticalArrivalTime, evaluate},
};

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: 1_024,
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource("proptest-regressions"))),
        ..ProptestConfig::default()
    }
}

// --- models ---------------------------------------------------------------------------------

/// ⌈a / b⌉ for b ≥ 1.
fn div_ceil(a: &BigUint, b: &BigUint) -> BigUint {
    (a + b - 1u32) / b
}

fn identifier_model(kind: &'static str, text: &str) -> Result<(), IdentifierError> {
    if text.is_empty() {
        return Err(IdentifierError::Empty { kind });
    }
    if text.len() > 64 {
        return Err(IdentifierError::TooLong { kind, length: text.len(), maximum: 64 });
    }
    for (index, ch) in text.char_indices() {
        let allowed = ch.is_ascii_alphanumeric() || (index > 0 && ".-_:".contains(ch));
        if !allowed {
            return Err(IdentifierError::InvalidCharacter { kind, index });
        }
    }
    Ok(())
}

fn count_model(parameter: &'static str, units: u64) -> Result<u64, PolicyError> {
    match units {
        0 => Err(PolicyError::Zero { parameter }),
        units if units > 9_223_372_036_854_775_807 => {
            Err(PolicyError::TooLarge { parameter, value: units, maximum: 9_223_372_036_854_775_807 })
        }
        units => Ok(units),
    }
}

fn period_model(parameter: &'static str, period: Duration) -> Result<u64, PolicyError> {
    let nanos = period.as_nanos();
    if nanos == 0 {
        return Err(PolicyError::ZeroDuration { parameter });
    }
    if !nanos.is_multiple_of(1_000_000) {
        return Err(PolicyError::NotWholeMilliseconds { parameter });
    }
    let millis = nanos / 1_000_000;
    if millis > 9_007_199_254_740 {
        return Err(PolicyError::DurationTooLong { parameter, maximum_millis: 9_007_199_254_740 });
    }
    Ok(u64::try_from(millis).unwrap())
}

fn replenishment_model(quota: u64, period: u64, burst: u64) -> Result<(), PolicyError> {
    let full = div_ceil(&(BigUint::from(burst) * BigUint::from(period)), &BigUint::from(quota));
    if full > BigUint::from(MAX_WINDOW_MILLIS) {
        return Err(PolicyError::ReplenishmentTooLong {
            millis: full.to_u128().unwrap(),
            maximum_millis: MAX_WINDOW_MILLIS,
        });
    }
    Ok(())
}

// --- strategies -----------------------------------------------------------------------------

fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => "[a-zA-Z0-9._:-]{0,70}",
        2 => "[a-z0-9]{1,3}[a-z0-9._:-]{0,3}[ /\u{e9}\u{0}\u{1F600}.]?[a-z]{0,2}",
        1 => any::<String>(),
        1 => prop::collection::vec("[a-z]", 60..70).prop_map(|chars| chars.concat()),
    ]
}

fn units() -> impl Strategy<Value = u64> {
    prop_oneof![
        prop::sample::select(vec![0, 1, 2, MAX_LIMIT - 1, MAX_LIMIT, MAX_LIMIT + 1, u64::MAX]),
        0u64..100,
        any::<u64>(),
        1u64..=MAX_LIMIT,
    ]
}

fn duration() -> impl Strategy<Value = Duration> {
    prop_oneof![
        prop::sample::select(vec![
            Duration::ZERO,
            Duration::from_nanos(1),
            Duration::from_millis(1),
            MAX_WINDOW,
            MAX_WINDOW + Duration::from_millis(1),
            MAX_WINDOW + Duration::from_nanos(1),
            Duration::from_secs(u64::MAX),
            Duration::MAX,
        ]),
        (0u64..=20_000).prop_map(Duration::from_millis),
        (0u64..=2 * MAX_WINDOW_MILLIS).prop_map(Duration::from_millis),
        (any::<u64>(), 0u32..1_000_000_000).prop_map(|(secs, nanos)| Duration::new(secs, nanos)),
        (0u64..100, 0u32..1_000_000_000).prop_map(|(secs, nanos)| Duration::new(secs, nanos)),
        (0u64..100, 0u32..1_000).prop_map(|(secs, millis)| Duration::new(secs, millis * 1_000_000)),
    ]
}

fn capacity() -> impl Strategy<Value = Capacity> {
    prop_oneof![Just(1u64), Just(MAX_LIMIT), 1u64..=100, 1u64..=MAX_LIMIT]
        .prop_map(|u| Capacity::new(u).unwrap())
}

fn valid_period() -> impl Strategy<Value = QuotaPeriod> {
    prop_oneof![Just(1u64), Just(MAX_WINDOW_MILLIS), 1u64..=100_000, 1u64..=MAX_WINDOW_MILLIS]
        .prop_map(|ms| QuotaPeriod::new(Duration::from_millis(ms)).unwrap())
}

fn denial() -> impl Strategy<Value = Denial> {
    prop_oneof![
        (capacity(), duration())
            .prop_map(|(c, d)| Denial::QuotaExceeded(QuotaDenial::new(c, Delay::from_duration(d)))),
        prop::option::of(duration())
            .prop_map(|d| Denial::StorageCapacity { retry_after: d.map(Delay::from_duration) }),
    ]
}

fn index() -> impl Strategy<Value = usize> {
    prop_oneof![Just(0usize), Just(usize::MAX), 0usize..8, any::<usize>()]
}

fn ids() -> (PolicyId, ScopeId) {
    (PolicyId::new("p").unwrap(), ScopeId::new("s").unwrap())
}

// --- properties -----------------------------------------------------------------------------

proptest! {
    #![proptest_config(config())]

    #[test]
    fn identifiers(text in text()) {
        let model_policy = identifier_model("policy id", &text);
        let model_scope = identifier_model("scope id", &text);
        let policy = PolicyId::new(&text);
        let scope = ScopeId::new(&text);
        prop_assert_eq!(policy.as_ref().map(|_| ()).map_err(Clone::clone), model_policy.clone());
        prop_assert_eq!(scope.as_ref().map(|_| ()).map_err(Clone::clone), model_scope);
        prop_assert_eq!(text.parse::<PolicyId>(), policy.clone());
        if let Ok(policy) = policy {
            prop_assert_eq!(policy.as_str(), text.as_str());
            prop_assert_eq!(policy.to_string(), text.clone());
        }
        if let Err(error) = model_policy {
            // Display names the kind and never panics.
            prop_assert!(error.to_string().starts_with("policy id "));
        }
    }

    #[test]
    fn capacities_and_periods(units in units(), period in duration()) {
        prop_assert_eq!(Capacity::new(units).map(Capacity::get), count_model("capacity", units));
        prop_assert_eq!(QuotaPeriod::new(period).map(QuotaPeriod::as_millis), period_model("period", period));
        if let Ok(valid) = QuotaPeriod::new(period) {
            prop_assert_eq!(valid.duration(), period);
            let millis = valid.as_millis();
            prop_assert_eq!(valid.as_whole_seconds(), millis.is_multiple_of(1000).then_some(millis / 1000));
        }
    }

    #[test]
    fn fixed_window_policies(limit in units(), window in duration(), shadow in any::<bool>()) {
        let (id, scope) = ids();
        let model = count_model("limit", limit).and_then(|_| period_model("window", window));
        let policy = FixedWindowPolicy::new(id, scope, limit, window);
        prop_assert_eq!(policy.as_ref().map(|_| ()).map_err(Clone::clone), model.map(|_| ()));
        if let Ok(policy) = policy {
            prop_assert_eq!(policy.limit().get(), limit);
            prop_assert_eq!(policy.window().duration(), window);
            let mode = if shadow { QuotaMode::Shadow } else { QuotaMode::Enforce };
            let moded = policy.clone().with_quota_mode(mode);
            prop_assert_eq!(
                runlimit_core::RateLimitPolicy::fingerprint(&moded),
                runlimit_core::RateLimitPolicy::fingerprint(&policy)
            );
            prop_assert_eq!(runlimit_core::RateLimitPolicy::quota_mode(&moded), mode);
        }
    }

    #[test]
    fn gcra_policies(quota in units(), period in duration(), burst in units()) {
        let (id, scope) = ids();
        let model = count_model("quota", quota)
            .and_then(|_| period_model("period", period))
            .and_then(|period| count_model("burst capacity", burst).map(|_| period))
            .and_then(|period| replenishment_model(quota, period, burst));
        let policy = GcraPolicy::new(id, scope, quota, period, burst);
        prop_assert_eq!(policy.as_ref().map(|_| ()).map_err(Clone::clone), model);
        if let Ok(policy) = policy {
            let full = div_ceil(&(BigUint::from(burst) * BigUint::from(policy.period().as_millis())), &BigUint::from(quota));
            prop_assert_eq!(BigUint::from(policy.full_replenishment().as_millis()), full);
        }
    }

    #[test]
    fn gcra_parameters(quota in capacity(), period in valid_period(), burst in capacity()) {
        let model = replenishment_model(quota.get(), period.as_millis(), burst.get());
        let parameters = GcraParameters::new(quota, period, burst);
        prop_assert_eq!(parameters.as_ref().map(|_| ()).map_err(Clone::clone), model);
        if let Ok(parameters) = parameters {
            prop_assert_eq!((parameters.quota(), parameters.period(), parameters.burst_capacity()), (quota, period, burst));
        }
    }

    #[test]
    fn attempt_policies(
        initial in duration(),
        cap in duration(),
        quiet in duration(),
        lease in duration(),
        failures in prop_oneof![0u32..80, any::<u32>()],
    ) {
        let (id, scope) = ids();
        let model = (|| {
            let initial = period_model("initial delay", initial)?;
            let cap = period_model("delay cap", cap)?;
            let quiet = period_model("quiet period", quiet)?;
            period_model("lease", lease)?;
            if cap < initial {
                return Err(PolicyError::DurationOrder { larger: "delay cap", smaller: "initial delay" });
            }
            if quiet < cap {
                return Err(PolicyError::DurationOrder { larger: "quiet period", smaller: "delay cap" });
            }
            Ok((initial, cap))
        })();
        let policy = AttemptPolicy::new(id, scope, initial, cap, quiet, lease);
        prop_assert_eq!(policy.as_ref().map(|_| ()).map_err(Clone::clone), model.clone().map(|_| ()));
        if let (Ok(policy), Ok((initial, cap))) = (policy, model) {
            // retry_delay: 0, then initial × 2^(failures − 1), capped; exact and panic-free.
            let expected = if failures == 0 {
                0
            } else {
                let doubled = BigUint::from(initial) << (failures - 1).min(200);
                doubled.min(BigUint::from(cap)).to_u64().unwrap()
            };
            prop_assert_eq!(policy.retry_delay(failures), Duration::from_millis(expected));
        }
    }

    #[test]
    fn key_hashers(secret in prop::collection::vec(any::<u8>(), 0..100)) {
        let result = KeyHasher::new(&secret).map(|_| ());
        let expected = if secret.len() < 32 {
            Err(KeyHasherError::SecretTooShort { length: secret.len(), minimum: 32 })
        } else {
            Ok(())
        };
        prop_assert_eq!(result, expected);
    }

    #[test]
    fn allowances(capacity in capacity(), available in units(), delay in duration()) {
        let result = Allowance::new(capacity, available, Delay::from_duration(delay));
        if available > capacity.get() {
            prop_assert_eq!(result, Err(AllowanceError { available, capacity: capacity.get() }));
        } else {
            let allowance = result.unwrap();
            prop_assert_eq!(
                (allowance.capacity(), allowance.available(), allowance.replenishes_after().duration()),
                (capacity, available, delay)
            );
        }
    }

    #[test]
    fn batch_decisions(
        allowances in prop::collection::vec(
            (capacity(), units(), duration()).prop_filter_map("valid", |(c, a, d)| {
                Allowance::new(c, a, Delay::from_duration(d)).ok()
            }),
            0..4,
        ),
        index in index(),
        batch_size in index(),
        denial in denial(),
        quota in (capacity(), duration()).prop_map(|(c, d)| QuotaDenial::new(c, Delay::from_duration(d))),
        shadow in any::<bool>(),
    ) {
        match BatchDecision::allowed(allowances.clone()) {
            Ok(batch) => {
                prop_assert!(!allowances.is_empty());
                prop_assert_eq!(batch.batch_size(), allowances.len());
                prop_assert_eq!(batch.view(), BatchDecisionView::Allowed { allowances: &allowances });
            }
            Err(error) => {
                prop_assert!(allowances.is_empty());
                prop_assert_eq!(error, BatchDecisionError::NoAllowances);
            }
        }
        let out_of_range = BatchDecisionError::IndexOutOfRange { index, batch_size };
        let denied = BatchDecision::denied(index, batch_size, denial);
        let shadowed = BatchDecision::shadow_denied(index, batch_size, quota);
        let mode = if shadow { QuotaMode::Shadow } else { QuotaMode::Enforce };
        let exceeded = BatchDecision::quota_exceeded(index, batch_size, quota, mode);
        if index < batch_size {
            let denied = denied.unwrap();
            prop_assert_eq!(denied.view(), BatchDecisionView::Denied { index, batch_size, denial: &denial });
            prop_assert!(!denied.permits_request());
            let shadowed = shadowed.unwrap();
            prop_assert_eq!(shadowed.view(), BatchDecisionView::ShadowDenied { index, batch_size, denial: &quota });
            prop_assert!(shadowed.permits_request());
            prop_assert_eq!(exceeded.unwrap().permits_request(), shadow);
        } else {
            prop_assert_eq!(denied, Err(out_of_range.clone()));
            prop_assert_eq!(shadowed, Err(out_of_range.clone()));
            prop_assert_eq!(exceeded, Err(out_of_range));
        }
    }

    #[test]
    fn delays(duration in duration()) {
        let delay = Delay::from_duration(duration);
        let nanos = duration.as_nanos();
        let seconds = u64::try_from(nanos.div_ceil(1_000_000_000)).unwrap_or(u64::MAX);
        prop_assert_eq!(delay.seconds(), seconds);
        prop_assert_eq!(delay.millis(), nanos.div_ceil(1_000_000));
        prop_assert_eq!(delay.duration(), duration);
    }

    /// `gcra::evaluate` with arbitrary state (including TATs no evaluator could produce),
    /// clock and cost: the exact outcome of the scaled-integer formulas computed in
    /// unbounded integers, or the exact error.
    #[test]
    fn gcra_evaluate(
        quota in capacity(),
        period in valid_period(),
        burst in capacity(),
        tat in prop::option::of(prop_oneof![
            any::<u128>(),
            Just(u128::MAX),
            (0u128..1_000).prop_map(|back| u128::MAX - back),
            any::<u64>().prop_map(u128::from),
        ]),
        now in prop_oneof![Just(0u64), Just(u64::MAX), any::<u64>()],
        cost in prop_oneof![Just(0u64), Just(1u64), Just(MAX_LIMIT), Just(MAX_LIMIT + 1), Just(u64::MAX), any::<u64>()],
        cost_near_burst in any::<bool>(),
    ) {
        let Ok(parameters) = GcraParameters::new(quota, period, burst) else {
            return Ok(());
        };
        let cost = if cost_near_burst { burst.get().saturating_add(cost % 2) } else { cost };
        let tat = tat.map(TheoreticalArrivalTime::from_scaled);
        let actual = evaluate(&parameters, tat, now, cost);
        let (q, p, b) = (BigUint::from(quota.get()), BigUint::from(period.as_millis()), BigUint::from(burst.get()));
        let expected = if cost == 0 {
            Err(GcraError::ZeroCost)
        } else if cost > burst.get() {
            Err(GcraError::CostExceedsBurst { cost, burst_capacity: burst.get() })
        } else {
            let now_s = BigUint::from(now) * &q;
            let base = tat.map_or(now_s.clone(), |tat| BigUint::from(tat.scaled()).max(now_s.clone()));
            let cand = &base + BigUint::from(cost) * &p;
            let ceiling = &now_s + &b * &p;
            if cand > BigUint::from(u128::MAX) {
                Err(GcraError::StateOutOfRange)
            } else if cand <= ceiling {
                let remaining = (&ceiling - &cand) / &p;
                let ahead = &cand - &now_s;
                let untouched = (&b - &remaining - 1u32) * &p;
                Ok(GcraOutcome::Allowed {
                    tat: TheoreticalArrivalTime::from_scaled(cand.to_u128().unwrap()),
                    remaining: remaining.to_u64().unwrap(),
                    replenish_after_millis: div_ceil(&ahead, &q).to_u64().unwrap(),
                    next_unit_after_millis: div_ceil(&(&ahead - &untouched), &q).to_u64().unwrap(),
                })
            } else {
                let retry = div_ceil(&(&cand - &ceiling), &q);
                let available = if ceiling > base { (&ceiling - &base) / &p } else { BigUint::from(0u32) };
                match retry.to_u64() {
                    Some(retry_after_millis) => Ok(GcraOutcome::Denied {
                        retry_after_millis,
                        available: available.to_u64().unwrap(),
                    }),
                    None => Err(GcraError::StateOutOfRange),
                }
            }
        };
        prop_assert_eq!(actual, expected);
    }

    #[test]
    fn theoretical_arrival_times(
        quota in capacity(),
        period in valid_period(),
        scaled in prop_oneof![any::<u128>(), Just(u128::MAX), any::<u64>().prop_map(u128::from)],
        millis in any::<u64>(),
        remainder in prop_oneof![any::<u64>(), 0u64..4],
    ) {
        let Ok(parameters) = GcraParameters::new(quota, period, Capacity::new(1).unwrap()) else {
            return Ok(());
        };
        let q = u128::from(quota.get());
        let tat = TheoreticalArrivalTime::from_scaled(scaled);
        prop_assert_eq!(tat.scaled(), scaled);
        prop_assert_eq!(
            tat.to_parts(&parameters),
            u64::try_from(scaled / q).ok().map(|m| (m, u64::try_from(scaled % q).unwrap()))
        );
        prop_assert_eq!(tat.expires_at_millis(&parameters), u64::try_from(scaled.div_ceil(q)).unwrap_or(u64::MAX));
        let rebuilt = TheoreticalArrivalTime::from_parts(millis, remainder, &parameters);
        if remainder >= quota.get() {
            prop_assert_eq!(rebuilt, None);
        } else {
            let rebuilt = rebuilt.unwrap();
            prop_assert_eq!(rebuilt.scaled(), u128::from(millis) * q + u128::from(remainder));
            prop_assert_eq!(rebuilt.to_parts(&parameters), Some((millis, remainder)));
        }
    }
}

#[test]
fn exact_error_values_at_the_boundaries() {
    let (id, scope) = ids();
    assert_eq!(Capacity::new(0), Err(PolicyError::Zero { parameter: "capacity" }));
    assert_eq!(
        Capacity::new(MAX_LIMIT + 1),
        Err(PolicyError::TooLarge { parameter: "capacity", value: MAX_LIMIT + 1, maximum: MAX_LIMIT })
    );
    assert_eq!(Capacity::new(MAX_LIMIT).map(Capacity::get), Ok(MAX_LIMIT));
    assert_eq!(
        QuotaPeriod::new(Duration::MAX),
        Err(PolicyError::NotWholeMilliseconds { parameter: "period" })
    );
    assert_eq!(
        QuotaPeriod::new(Duration::from_secs(u64::MAX)),
        Err(PolicyError::DurationTooLong { parameter: "period", maximum_millis: MAX_WINDOW_MILLIS })
    );
    assert_eq!(QuotaPeriod::new(MAX_WINDOW).map(QuotaPeriod::as_millis), Ok(MAX_WINDOW_MILLIS));
    assert_eq!(
        GcraPolicy::new(id.clone(), scope.clone(), 0, Duration::ZERO, 0),
        Err(PolicyError::Zero { parameter: "quota" }),
        "the first parameter's error wins"
    );
    assert_eq!(
        GcraPolicy::new(id.clone(), scope.clone(), 1, Duration::ZERO, 0),
        Err(PolicyError::ZeroDuration { parameter: "period" })
    );
    assert_eq!(
        FixedWindowPolicy::new(id.clone(), scope.clone(), MAX_LIMIT + 1, Duration::ZERO),
        Err(PolicyError::TooLarge { parameter: "limit", value: MAX_LIMIT + 1, maximum: MAX_LIMIT })
    );
    assert_eq!(
        AttemptPolicy::new(
            id,
            scope,
            Duration::from_nanos(1),
            Duration::ZERO,
            Duration::ZERO,
            Duration::ZERO
        ),
        Err(PolicyError::NotWholeMilliseconds { parameter: "initial delay" })
    );
    // Display strings: lowercase, no trailing punctuation.
    assert_eq!(PolicyError::Zero { parameter: "limit" }.to_string(), "limit must be at least 1");
    assert_eq!(
        PolicyError::ReplenishmentTooLong { millis: 2, maximum_millis: 1 }.to_string(),
        "full replenishment takes 2 milliseconds, above the maximum of 1"
    );
    assert_eq!(
        PolicyError::DurationOrder { larger: "delay cap", smaller: "initial delay" }.to_string(),
        "delay cap must be at least initial delay"
    );
    assert_eq!(GcraError::ZeroCost.to_string(), "request cost must be at least 1");
    assert_eq!(
        GcraError::CostExceedsBurst { cost: 6, burst_capacity: 5 }.to_string(),
        "request cost 6 exceeds the burst capacity 5"
    );
    assert_eq!(GcraError::StateOutOfRange.to_string(), "stored theoretical arrival time is out of range");
    assert_eq!(BatchDecisionError::NoAllowances.to_string(), "an allowed batch has no allowances");
    assert_eq!(
        AllowanceError { available: 4, capacity: 3 }.to_string(),
        "available units (4) exceed the capacity (3)"
    );
    assert_eq!(
        IdentifierError::TooLong { kind: "scope id", length: 65, maximum: 64 }.to_string(),
        "scope id is 65 bytes long, above the maximum of 64"
    );
}
