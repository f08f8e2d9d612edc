//! GCRA (continuously replenished) quotas, their atomic batches and their storage bounds.
//!
//! Every scenario is generic over a [`QuotaBackend`] whose policy is [`GcraPolicy`], starts
//! at 0 ms on a fresh backend and asserts exact values. The arithmetic is the exact
//! scaled-integer form of [`runlimit_core::backend::gcra`], for quota `Q` per
//! period `P` ms and burst `B`, with every instant scaled by `Q` (`now_s = now × Q`, the
//! emission interval is then exactly `P`):
//!
//! ```text
//! cand = max(tat, now_s) + c·P;  ceiling = now_s + B·P;  allowed ⇔ cand ≤ ceiling
//! allowed: available = ⌊(ceiling − cand) / P⌋,  replenishes_after = ⌈(cand − now_s) / Q⌉ ms
//! denied:  retry_after = ⌈(cand − ceiling) / Q⌉ ms;  state expiry at ⌈tat / Q⌉ ms
//! ```
//!
//! for a check of cost `c` (1 unless a scenario says otherwise). The doc comment of each
//! scenario spells out the numbers behind its expected values.

use std::sync::Arc;

use runlimit_core::{Check, CostError, GcraPolicy, MAX_LIMIT, MAX_WINDOW_MILLIS, QuotaMode, RateLimitPolicy};

use crate::{
    QuotaBackend,
    support::{
        HostileObserver, allowed, allowed_with_capacity, batch_allowed, batch_denied, batch_shadow_denied,
        check, costly, decide, decide_all, gcra, gcra_in, peek, quota_denial, quota_denied, rejected_batch,
        reset, shadow_denied, snapshot, storage_denial, storage_denied, storage_retry, subject,
    },
};

/// The scenario list: one name per `pub async fn` of this module (a unit test checks it).
#[doc(hidden)]
#[macro_export]
macro_rules! __gcra_scenario_names {
    ($($args:tt)*) => {
        $crate::__scenarios! { $($args)* [
            vector_v1_burst_then_steady_rate_without_drift
            vector_v2_non_integer_emission_interval
            vector_v3_one_unit_per_minute
            vector_v5_half_second_emission_interval
            no_extra_unit_after_a_long_idle
            shadow_exhaustion_consumes_nothing_and_shares_the_counter
            every_parameter_starts_an_independent_counter
            extreme_parameters_work_with_exact_values
            allowed_batch_consumes_every_check_in_input_order
            denied_batch_names_the_first_denied_index_and_consumes_nothing
            shadow_denied_batch_admits_and_consumes_nothing
            structural_batch_rejections_happen_before_any_work
            batch_denial_precedence_between_quota_and_storage
            full_shard_denies_a_new_key_and_keeps_live_keys
            full_shard_denies_a_new_key_in_shadow_mode
            expired_keys_are_reclaimed_and_free_their_slots
            cost_three_on_ten_per_second_burst_five_exact_sequence
            costs_outside_one_to_the_burst_are_rejected_when_the_check_is_built
            batch_member_whose_cost_does_not_fit_consumes_nothing_from_the_others
            cost_of_max_limit_on_a_max_limit_policy
            peek_reports_the_exact_state_without_consuming_anything
            peek_never_creates_state_or_takes_a_slot
            reset_clears_the_state_and_frees_the_slot
            a_hostile_observer_changes_no_result
        ] }
    };
}

crate::__gcra_scenario_names! { @names }

/// One step of a vector: the absolute time in ms, then `Ok((available, replenishes_after
/// ms))` for an allowed check or `Err(retry_after ms)` for a quota denial.
type Step = (u64, Result<(u64, u64), u64>);

/// Runs `steps` for one subject of `policy`, moving the clock to each step's time.
async fn run_vector<B: QuotaBackend<Policy = GcraPolicy>>(
    backend: &mut B,
    policy: &GcraPolicy,
    steps: &[Step],
) {
    let key = check(policy, subject(1));
    let burst = policy.burst_capacity().get();
    let mut now = 0;
    for (index, &(at, expected)) in steps.iter().enumerate() {
        assert!(at >= now, "vector steps go forward in time");
        backend.advance(at - now).await;
        now = at;
        let decision = decide(backend, &key).await;
        match expected {
            Ok(want) => {
                assert_eq!(
                    allowed_with_capacity(&decision),
                    (burst, want.0, want.1),
                    "step {index} at {at} ms"
                );
            }
            Err(retry) => assert_eq!(quota_denied(&decision), (burst, retry), "step {index} at {at} ms"),
        }
    }
}

/// reference vector V1 (`runlimit_core::backend::gcra`), Q = 10 per 1,000 ms, B = 20 (T = 100 ms): a rested key spends its whole
/// burst at once, then exactly one unit per emission interval, without drift.
///
/// Scaled by Q = 10: T = P = 1,000, B·P = 20,000. Hit k (1..=20) at 0 ms: cand = 1,000·k,
/// available ⌊(20,000 − 1,000·k) / 1,000⌋ = 20 − k, replenish 1,000·k / 10 = 100·k ms. Hit 21
/// at 0: cand 21,000 > 20,000, retry ⌈1,000 / 10⌉ = 100. At 100 ms (ceiling 21,000): allowed,
/// 0 left, replenish (21,000 − 1,000) / 10 = 2,000. At 150: cand 22,000 − ceiling 21,500 →
/// retry 50; at 199: 1; at 200, 300, 400: allowed (0, 2,000) each; at 450: cand 25,000 −
/// ceiling 24,500 → retry 50 (still one unit per 100 ms). At 3,000 ms the key is rested
/// (tat 24,000 < now_s 30,000): 19 left, replenish 100.
pub async fn vector_v1_burst_then_steady_rate_without_drift<B: QuotaBackend<Policy = GcraPolicy>>(
    backend: &mut B,
) {
    let mut steps: Vec<Step> = (1..=20).map(|k| (0, Ok((20 - k, 100 * k)))).collect();
    steps.extend([
        (0, Err(100)),
        (100, Ok((0, 2_000))),
        (150, Err(50)),
        (199, Err(1)),
        (200, Ok((0, 2_000))),
        (300, Ok((0, 2_000))),
        (400, Ok((0, 2_000))),
        (450, Err(50)),
        (3_000, Ok((19, 100))),
    ]);
    run_vector(backend, &gcra("gcra.v1", 10, 1_000, 20), &steps).await;
}

/// reference vector V2 (`runlimit_core::backend::gcra`), Q = 3 per 1,000 ms, B = 2: the emission interval T = 333⅓ ms is not a
/// whole number, and every reported duration rounds up to the next whole millisecond.
///
/// Scaled by Q = 3: P = 1,000, B·P = 2,000. At 0: cand 1,000 → 1 left, replenish ⌈1,000/3⌉ =
/// 334; cand 2,000 → 0 left, ⌈2,000/3⌉ = 667; cand 3,000 > 2,000 → retry ⌈1,000/3⌉ = 334. At
/// 333 (now_s 999, ceiling 2,999): retry ⌈1/3⌉ = 1. At 334 (now_s 1,002, ceiling 3,002):
/// allowed, 0 left, replenish ⌈1,998/3⌉ = 666. At 667 (now_s 2,001): cand 4,000 ≤ 4,001,
/// replenish ⌈1,999/3⌉ = 667. At 1,000 (now_s 3,000): cand 5,000 = ceiling, replenish
/// ⌈2,000/3⌉ = 667. At 5,000 the key is rested: 1 left, 334.
pub async fn vector_v2_non_integer_emission_interval<B: QuotaBackend<Policy = GcraPolicy>>(backend: &mut B) {
    let steps: [Step; 8] = [
        (0, Ok((1, 334))),
        (0, Ok((0, 667))),
        (0, Err(334)),
        (333, Err(1)),
        (334, Ok((0, 666))),
        (667, Ok((0, 667))),
        (1_000, Ok((0, 667))),
        (5_000, Ok((1, 334))),
    ];
    run_vector(backend, &gcra("gcra.v2", 3, 1_000, 2), &steps).await;
}

/// reference vector V3 (`runlimit_core::backend::gcra`), Q = 1 per 60,000 ms, B = 1: one unit per minute, with the exact retry
/// counted down to the millisecond.
///
/// Scaled by Q = 1 (milliseconds): at 0, cand 60,000 ≤ 60,000 → 0 left, replenish 60,000. At
/// 1: cand 120,000 − ceiling 60,001 → retry 59,999; at 59,999: 1. At 60,000: cand 120,000 =
/// ceiling → allowed, replenish 60,000; again at 60,000: cand 180,000 − 120,000 → retry
/// 60,000.
pub async fn vector_v3_one_unit_per_minute<B: QuotaBackend<Policy = GcraPolicy>>(backend: &mut B) {
    let steps: [Step; 5] = [
        (0, Ok((0, 60_000))),
        (1, Err(59_999)),
        (59_999, Err(1)),
        (60_000, Ok((0, 60_000))),
        (60_000, Err(60_000)),
    ];
    run_vector(backend, &gcra("gcra.v3", 1, 60_000, 1), &steps).await;
}

/// reference vector V5 (`runlimit_core::backend::gcra`), Q = 2 per 1,000 ms, B = 4 (T = 500 ms): a burst of four, then the
/// steady rate, and partial replenishment between units.
///
/// Scaled by Q = 2: P = 1,000, B·P = 4,000. Hit k (1..=4) at 0: 4 − k left, replenish
/// 500·k. At 0: cand 5,000 − 4,000 → retry 500; at 250 (ceiling 4,500): 250; at 499 (ceiling
/// 4,998): ⌈2/2⌉ = 1. At 500 (ceiling 5,000): allowed, 0 left, replenish (5,000 − 1,000)/2 =
/// 2,000. At 1,250 (now_s 2,500): cand 6,000 ≤ 6,500, 0 left, ⌈3,500/2⌉ = 1,750. At 2,000
/// (now_s 4,000): cand 7,000, ⌊(8,000 − 7,000)/1,000⌋ = 1 left, 1,500. At 2,001 (now_s
/// 4,002): cand 8,000 ≤ 8,002, 0 left, ⌈3,998/2⌉ = 1,999.
pub async fn vector_v5_half_second_emission_interval<B: QuotaBackend<Policy = GcraPolicy>>(backend: &mut B) {
    let steps: [Step; 11] = [
        (0, Ok((3, 500))),
        (0, Ok((2, 1_000))),
        (0, Ok((1, 1_500))),
        (0, Ok((0, 2_000))),
        (0, Err(500)),
        (250, Err(250)),
        (499, Err(1)),
        (500, Ok((0, 2_000))),
        (1_250, Ok((0, 1_750))),
        (2_000, Ok((1, 1_500))),
        (2_001, Ok((0, 1_999))),
    ];
    run_vector(backend, &gcra("gcra.v5", 2, 1_000, 4), &steps).await;
}

/// However long a key rests, it never holds more than its burst: after an hour idle exactly
/// B = 4 checks are allowed at once, and the fifth is denied with the exact retry.
///
/// Q = 2 per 1,000 ms, B = 4, as V5: hits 1..=4 at one instant leave 3, 2, 1, 0 with
/// replenish 500, 1,000, 1,500, 2,000; the fifth has cand 5,000 − ceiling 4,000 (scaled) →
/// retry ⌈1,000/2⌉ = 500.
pub async fn no_extra_unit_after_a_long_idle<B: QuotaBackend<Policy = GcraPolicy>>(backend: &mut B) {
    let policy = gcra("gcra.idle", 2, 1_000, 4);
    let key = check(&policy, subject(1));
    for round in 0..2 {
        for (available, replenish) in [(3, 500), (2, 1_000), (1, 1_500), (0, 2_000)] {
            assert_eq!(allowed(&decide(backend, &key).await), (available, replenish), "round {round}");
        }
        assert_eq!(quota_denied(&decide(backend, &key).await), (4, 500), "round {round}: no burst + 1");
        backend.advance(3_600_000).await;
    }
}

/// A shadow policy consumes while it has quota; exhausted, it admits (shadow-denied) with the
/// denial enforcement would give, and consumes nothing. Quota mode is not in the fingerprint:
/// the enforced twin sees the same state, before and after.
///
/// Q = 2 per 1,000 ms, B = 2 (scaled P = 1,000, B·P = 2,000). Two hits at 0 leave 1 (500 ms)
/// and 0 (1,000 ms), tat 2,000. At 100 ms (now_s 200): cand 3,000 − ceiling 2,200 → retry
/// ⌈800/2⌉ = 400, three times in shadow, then under enforcement. At 500 ms (now_s 1,000):
/// cand 3,000 = ceiling → allowed, 0 left, 1,000 ms (it would be denied had the shadow
/// denials consumed); then cand 4,000 − 3,000 → retry 500, in shadow too. A second subject,
/// only ever checked by the shadow policy, takes the same steps: the shadow policy itself is
/// allowed again at 500 ms (0 left, 1,000 ms).
pub async fn shadow_exhaustion_consumes_nothing_and_shares_the_counter<
    B: QuotaBackend<Policy = GcraPolicy>,
>(
    backend: &mut B,
) {
    let enforced = gcra("gcra.shadow", 2, 1_000, 2);
    let shadow = enforced.clone().with_quota_mode(QuotaMode::Shadow);
    let shadow_key = check(&shadow, subject(1));
    let enforced_key = check(&enforced, subject(1));
    let shadow_only = check(&shadow, subject(2));
    assert_eq!(allowed(&decide(backend, &shadow_key).await), (1, 500));
    assert_eq!(allowed(&decide(backend, &shadow_key).await), (0, 1_000));
    assert_eq!(allowed(&decide(backend, &shadow_only).await), (1, 500));
    assert_eq!(allowed(&decide(backend, &shadow_only).await), (0, 1_000));
    backend.advance(100).await;
    for _ in 0..3 {
        assert_eq!(shadow_denied(&decide(backend, &shadow_key).await), (2, 400));
        assert_eq!(shadow_denied(&decide(backend, &shadow_only).await), (2, 400));
    }
    assert_eq!(quota_denied(&decide(backend, &enforced_key).await), (2, 400));
    backend.advance(400).await;
    assert_eq!(allowed(&decide(backend, &enforced_key).await), (0, 1_000));
    assert_eq!(shadow_denied(&decide(backend, &shadow_key).await), (2, 500));
    assert_eq!(allowed(&decide(backend, &shadow_only).await), (0, 1_000));
}

/// The policy identifier, scope, quota, period and burst capacity are all fingerprinted into
/// the storage key, while quota mode is not: with the base policy exhausted for a subject, a
/// policy differing in any one parameter is fresh for that subject, and the base policy's
/// shadow twin still sees the exhausted counter.
///
/// Base Q = 1 per 60,000 ms, B = 1, exhausted at 0; checked at 100 ms. Fresh first checks:
/// same shape (other id, other scope) 0 left, 60,000 ms; Q = 2 (T = 30,000) 0 left, 30,000;
/// P = 30,000 0 left, 30,000; B = 2: 1 left, 60,000. Base: cand 120,000 − ceiling 60,100 →
/// retry 59,900.
pub async fn every_parameter_starts_an_independent_counter<B: QuotaBackend<Policy = GcraPolicy>>(
    backend: &mut B,
) {
    let base = gcra_in("gcra.param", "a", 1, 60_000, 1);
    let shadow_base = base.clone().with_quota_mode(QuotaMode::Shadow);
    let variants = [
        (gcra_in("gcra.param2", "a", 1, 60_000, 1), (0, 60_000)),
        (gcra_in("gcra.param", "b", 1, 60_000, 1), (0, 60_000)),
        (gcra_in("gcra.param", "a", 2, 60_000, 1), (0, 30_000)),
        (gcra_in("gcra.param", "a", 1, 30_000, 1), (0, 30_000)),
        (gcra_in("gcra.param", "a", 1, 60_000, 2), (1, 60_000)),
    ];
    let key = subject(1);
    assert_eq!(allowed(&decide(backend, &check(&base, key)).await), (0, 60_000));
    backend.advance(100).await;
    for (policy, expected) in &variants {
        assert_eq!(allowed(&decide(backend, &check(policy, key)).await), *expected, "{policy:?}");
    }
    assert_eq!(quota_denied(&decide(backend, &check(&base, key)).await), (1, 59_900));
    assert_eq!(shadow_denied(&decide(backend, &check(&shadow_base, key)).await), (1, 59_900));
    assert_eq!(allowed(&decide(backend, &check(&base, subject(2))).await), (0, 60_000));
}

/// Policies at the portable bounds (quota and burst [`MAX_LIMIT`] = L, period
/// [`MAX_WINDOW`](runlimit_core::MAX_WINDOW) = W ms) evaluate exactly, without overflow.
///
/// - slow, Q = 1, P = W, B = 1: at 0, 0 left, replenish W; at 1,000 ms cand 2W − ceiling
///   (1,000 + W) → retry W − 1,000.
/// - fast, Q = L, P = W, B = L (T = W/L < 1 ms): at 0, cand W → ⌊(L·W − W)/W⌋ = L − 1 left,
///   replenish ⌈W/L⌉ = 1 ms; then cand 2W → L − 2 left, ⌈2W/L⌉ = 1 (2W < L). At 1,000 ms
///   (now_s = 1,000·L > 2W) it is rested: L − 1 left, 1 ms.
/// - fine, Q = L, P = W, B = 1: at 0, 0 left, 1 ms; again at 0 cand 2W − ceiling W → retry
///   ⌈W/L⌉ = 1; at 1 ms (now_s = L > W) cand L + W = ceiling → allowed, 0 left, 1 ms.
pub async fn extreme_parameters_work_with_exact_values<B: QuotaBackend<Policy = GcraPolicy>>(
    backend: &mut B,
) {
    let w = MAX_WINDOW_MILLIS;
    let slow = gcra("gcra.max.slow", 1, w, 1);
    let fast = gcra("gcra.max.fast", MAX_LIMIT, w, MAX_LIMIT);
    let fine = gcra("gcra.max.fine", MAX_LIMIT, w, 1);
    let (slow, fast, fine) = (check(&slow, subject(1)), check(&fast, subject(2)), check(&fine, subject(3)));
    assert_eq!(allowed_with_capacity(&decide(backend, &slow).await), (1, 0, w));
    assert_eq!(allowed_with_capacity(&decide(backend, &fast).await), (MAX_LIMIT, MAX_LIMIT - 1, 1));
    assert_eq!(allowed(&decide(backend, &fast).await), (MAX_LIMIT - 2, 1));
    assert_eq!(allowed(&decide(backend, &fine).await), (0, 1));
    assert_eq!(quota_denied(&decide(backend, &fine).await), (1, 1));
    backend.advance(1).await;
    assert_eq!(allowed(&decide(backend, &fine).await), (0, 1));
    backend.advance(999).await;
    assert_eq!(quota_denied(&decide(backend, &slow).await), (1, w - 1_000));
    assert_eq!(allowed(&decide(backend, &fast).await), (MAX_LIMIT - 1, 1));
}

/// An allowed GCRA batch consumes every check together and answers in input order.
///
/// fast: Q = 10 per 1,000 ms, B = 20 (scaled P = 1,000, B·P = 20,000); slow: Q = 1 per
/// 60,000 ms, B = 1. At 0 the batch leaves fast 19 (100 ms) and slow 0 (60,000). At 50 ms
/// (now_s 500): fast alone cand 2,000 → ⌊18,500/1,000⌋ = 18 left, ⌈1,500/10⌉ = 150 ms; the
/// batch (new slow key, fast) leaves 0 (60,000) and, cand 3,000, 17 left, 250 ms. The first
/// slow key is exhausted: cand 120,000 − ceiling 60,050 → retry 59,950.
pub async fn allowed_batch_consumes_every_check_in_input_order<B: QuotaBackend<Policy = GcraPolicy>>(
    backend: &mut B,
) {
    let fast = gcra("gcra.batch.fast", 10, 1_000, 20);
    let slow = gcra("gcra.batch.slow", 1, 60_000, 1);
    let a = check(&fast, subject(1));
    let b = check(&slow, subject(2));
    let b2 = check(&slow, subject(3));
    assert_eq!(batch_allowed(&decide_all(backend, &[a, b]).await), [(19, 100), (0, 60_000)]);
    backend.advance(50).await;
    assert_eq!(allowed(&decide(backend, &a).await), (18, 150));
    assert_eq!(batch_allowed(&decide_all(backend, &[b2, a]).await), [(0, 60_000), (17, 250)]);
    assert_eq!(quota_denied(&decide(backend, &b).await), (1, 59_950));
}

/// A denied GCRA batch names the first denied index (with that check's own retry) and the
/// batch size, and consumes nothing.
///
/// fast: Q = 10 per 1,000 ms, B = 20; slow: Q = 1 per 60,000 ms, B = 1. At 0 `a` (fast) hits
/// twice (tat 2,000 scaled) and `b1` (slow) once; at 10 ms `b2` (slow) once. At 100 ms:
/// `b1` retries after 60,000 − 100 = 59,900, `b2` after 60,010 − 100 = 59,910. Alone at
/// 100 ms (now_s 1,000) `a` has cand 3,000 → 18 left, ⌈2,000/10⌉ = 200 ms (it would be 17 and
/// 300 ms had the batch consumed it); the new key `e` is fresh: 19 left, 100 ms.
pub async fn denied_batch_names_the_first_denied_index_and_consumes_nothing<
    B: QuotaBackend<Policy = GcraPolicy>,
>(
    backend: &mut B,
) {
    let fast = gcra("gcra.denied.fast", 10, 1_000, 20);
    let slow = gcra("gcra.denied.slow", 1, 60_000, 1);
    let a = check(&fast, subject(1));
    let b1 = check(&slow, subject(2));
    let b2 = check(&slow, subject(3));
    let e = check(&fast, subject(4));
    assert_eq!(allowed(&decide(backend, &a).await), (19, 100));
    assert_eq!(allowed(&decide(backend, &a).await), (18, 200));
    assert_eq!(allowed(&decide(backend, &b1).await), (0, 60_000));
    backend.advance(10).await;
    assert_eq!(allowed(&decide(backend, &b2).await), (0, 60_000));
    backend.advance(90).await; // 100 ms
    assert_eq!(batch_denied(&decide_all(backend, &[e, b1, a, b2]).await), (1, 4, quota_denial(1, 59_900)));
    assert_eq!(batch_denied(&decide_all(backend, &[e, b2, b1]).await), (1, 3, quota_denial(1, 59_910)));
    assert_eq!(allowed(&decide(backend, &a).await), (18, 200), "a was not consumed by the batches");
    assert_eq!(allowed(&decide(backend, &e).await), (19, 100), "e was not consumed by the batches");
}

/// A shadow GCRA batch with an exhausted check is shadow-denied at that index, admits, and
/// consumes nothing.
///
/// Shadow fast: Q = 10 per 1,000 ms, B = 20; shadow slow: Q = 1 per 60,000 ms, B = 1. At 0 the
/// allowed batch leaves 19 (100 ms) and 0 (60,000); repeated, slow is exhausted with retry
/// 60,000 whatever its index; `a` alone then has cand 2,000 → 18 left, 200 ms (17 and 300 ms
/// had a shadow-denied batch consumed it).
pub async fn shadow_denied_batch_admits_and_consumes_nothing<B: QuotaBackend<Policy = GcraPolicy>>(
    backend: &mut B,
) {
    let fast = gcra("gcra.shadow.fast", 10, 1_000, 20).with_quota_mode(QuotaMode::Shadow);
    let slow = gcra("gcra.shadow.slow", 1, 60_000, 1).with_quota_mode(QuotaMode::Shadow);
    let a = check(&fast, subject(1));
    let b = check(&slow, subject(1));
    assert_eq!(batch_allowed(&decide_all(backend, &[a, b]).await), [(19, 100), (0, 60_000)]);
    assert_eq!(batch_shadow_denied(&decide_all(backend, &[a, b]).await), (1, 2, 1, 60_000));
    assert_eq!(batch_shadow_denied(&decide_all(backend, &[b, a]).await), (0, 2, 1, 60_000));
    assert_eq!(allowed(&decide(backend, &a).await), (18, 200));
}

/// GCRA batches are validated structurally before any work, with the same rules and order
/// as fixed windows: empty, more than `MAX_BATCH_SIZE` checks, mixed quota modes, duplicate
/// storage key. Afterwards every member is fresh: Q = 1 per 1,000 ms, B = 2, so a first check
/// 100 ms later leaves 1 unit and replenishes after 1,000 ms.
pub async fn structural_batch_rejections_happen_before_any_work<B: QuotaBackend<Policy = GcraPolicy>>(
    backend: &mut B,
) {
    use runlimit_core::BatchError;
    let policy = gcra("gcra.structural", 1, 1_000, 2);
    let shadow = gcra("gcra.structural.shadow", 1, 1_000, 2).with_quota_mode(QuotaMode::Shadow);
    let size = B::MAX_BATCH_SIZE + 1;
    let keys: Vec<_> = (0..).take(size).map(|n| check(&policy, subject(n))).collect();
    let s = check(&shadow, subject(0));
    assert_eq!(rejected_batch(backend, &[]).await, BatchError::EmptyBatch);
    assert_eq!(
        rejected_batch(backend, &keys).await,
        BatchError::TooManyChecks { batch_size: size, maximum: B::MAX_BATCH_SIZE }
    );
    assert_eq!(
        rejected_batch(backend, &[keys[0], s]).await,
        BatchError::MixedQuotaModes { index: 1, mode: QuotaMode::Shadow }
    );
    assert_eq!(
        rejected_batch(backend, &[keys[0], keys[1], keys[0]]).await,
        BatchError::DuplicateCounterKey { first_index: 0, duplicate_index: 2 }
    );
    backend.advance(100).await;
    for (index, key) in keys.iter().enumerate() {
        assert_eq!(allowed(&decide(backend, key).await), (1, 1_000), "member {index} was not consumed");
    }
    assert_eq!(allowed(&decide(backend, &s).await), (1, 1_000));
}

/// Batch denial precedence between quota and storage, for GCRA: under enforcement the
/// earliest denial wins whatever its reason; in shadow mode a storage denial wins over shadow
/// quota denials; nothing is consumed either way.
///
/// Shard of 2 keys; Q = 1 per 1,000 ms, B = 2 (ms = scaled units). `a` hits twice at 0 (tat
/// 2,000: exhausted), `b` once at 300 (tat 1,300). At 400 the earliest expiry is `b`'s
/// (1,300): 900 ms away; `a` retries after cand 3,000 − ceiling 2,400 = 600. Afterwards `b`
/// alone has cand 2,300 → 0 left, 1,900 ms, moving its expiry to 2,300, so the earliest expiry
/// becomes `a`'s 2,000: 1,600 ms away.
pub async fn batch_denial_precedence_between_quota_and_storage<B: QuotaBackend<Policy = GcraPolicy>>(
    backend: &mut B,
) {
    backend.bounded(2).await;
    let enforced = gcra("gcra.precedence", 1, 1_000, 2);
    let shadow = enforced.clone().with_quota_mode(QuotaMode::Shadow);
    let keys = backend.subjects_in_one_shard(3);
    let (a, b, c) = (check(&enforced, keys[0]), check(&enforced, keys[1]), check(&enforced, keys[2]));
    let (a_s, b_s, c_s) = (check(&shadow, keys[0]), check(&shadow, keys[1]), check(&shadow, keys[2]));
    assert_eq!(allowed(&decide(backend, &a).await), (1, 1_000));
    assert_eq!(allowed(&decide(backend, &a).await), (0, 2_000));
    backend.advance(300).await;
    assert_eq!(allowed(&decide(backend, &b).await), (1, 1_000));
    backend.advance(100).await; // 400 ms
    assert_eq!(batch_denied(&decide_all(backend, &[c, a]).await), (0, 2, storage_denial::<B>(900)));
    assert_eq!(batch_denied(&decide_all(backend, &[a, c]).await), (0, 2, quota_denial(2, 600)));
    assert_eq!(batch_denied(&decide_all(backend, &[b, c]).await), (1, 2, storage_denial::<B>(900)));
    assert_eq!(batch_denied(&decide_all(backend, &[a_s, c_s]).await), (1, 2, storage_denial::<B>(900)));
    assert_eq!(batch_shadow_denied(&decide_all(backend, &[b_s, a_s]).await), (1, 2, 2, 600));
    assert_eq!(allowed(&decide(backend, &b).await), (0, 1_900), "b was not consumed by the batches");
    assert_eq!(storage_denied(&decide(backend, &c).await), storage_retry::<B>(1_600), "c was not stored");
}

/// A full shard denies a new GCRA key with `Denial::StorageCapacity` (the exact time until
/// the shard's earliest expiry, when reported, which moves as live keys spend) and never
/// evicts a live key.
///
/// Shard of 2 keys; Q = 1 per 1,000 ms, B = 2 (ms = scaled units). `a` at 0 (tat and expiry
/// 1,000), `b` at 200 (1,200). At 300: the new key waits 700 ms. `a` then has cand 2,000 ≤
/// ceiling 2,300: 0 left, 1,700 ms; `b` cand 2,200: 0 left, 1,900 ms; the earliest expiry is
/// now `a`'s 2,000, 1,700 ms away; `a` again: cand 3,000 − 2,300 → retry 700.
pub async fn full_shard_denies_a_new_key_and_keeps_live_keys<B: QuotaBackend<Policy = GcraPolicy>>(
    backend: &mut B,
) {
    backend.bounded(2).await;
    let policy = gcra("gcra.full", 1, 1_000, 2);
    let keys = backend.subjects_in_one_shard(3);
    let (a, b, c) = (check(&policy, keys[0]), check(&policy, keys[1]), check(&policy, keys[2]));
    assert_eq!(allowed(&decide(backend, &a).await), (1, 1_000));
    backend.advance(200).await;
    assert_eq!(allowed(&decide(backend, &b).await), (1, 1_000));
    backend.advance(100).await; // 300 ms
    assert_eq!(storage_denied(&decide(backend, &c).await), storage_retry::<B>(700));
    assert_eq!(allowed(&decide(backend, &a).await), (0, 1_700), "a keeps its state");
    assert_eq!(allowed(&decide(backend, &b).await), (0, 1_900), "b keeps its state");
    assert_eq!(storage_denied(&decide(backend, &c).await), storage_retry::<B>(1_700));
    assert_eq!(quota_denied(&decide(backend, &a).await), (2, 700));
}

/// Storage capacity is enforced in shadow mode too: a new GCRA key on a full shard is denied
/// (`permits_request` false), not shadow-denied, for the shadow policy and its enforced twin,
/// while the live key is still served.
///
/// Shard of 1 key; shadow Q = 1 per 1,000 ms, B = 1. `a` at 0 (expiry 1,000); at 100 ms the
/// new key waits 900 ms, and `a` is shadow-denied with retry cand 2,000 − ceiling 1,100 = 900.
pub async fn full_shard_denies_a_new_key_in_shadow_mode<B: QuotaBackend<Policy = GcraPolicy>>(
    backend: &mut B,
) {
    backend.bounded(1).await;
    let enforced = gcra("gcra.full.shadow", 1, 1_000, 1);
    let shadow = enforced.clone().with_quota_mode(QuotaMode::Shadow);
    let keys = backend.subjects_in_one_shard(2);
    let (a, b) = (check(&shadow, keys[0]), check(&shadow, keys[1]));
    assert_eq!(allowed(&decide(backend, &a).await), (0, 1_000));
    backend.advance(100).await;
    assert_eq!(storage_denied(&decide(backend, &b).await), storage_retry::<B>(900));
    assert_eq!(storage_denied(&decide(backend, &check(&enforced, keys[1])).await), storage_retry::<B>(900));
    assert_eq!(shadow_denied(&decide(backend, &a).await), (1, 900), "a is still stored and exhausted");
}

/// A GCRA key's state expires once it is fully rested (at ⌈tat / Q⌉ ms); after reclaiming
/// expired storage its slot takes a new key.
///
/// Shard of 2 keys; Q = 3 per 1,000 ms, B = 2 (V2). `a` hits twice at 0: tat 2,000, expiry
/// ⌈2,000/3⌉ = 667. `b` at 500 (now_s 1,500): cand 2,500 → 1 left, ⌈1,000/3⌉ = 334 ms, expiry
/// 834. At 666 the new key `c` waits 1 ms. At 667: `c` is admitted (1 left, 334 ms: expiry
/// 1,001); `b` has cand 3,500 ≤ 4,001 → 0 left, ⌈1,499/3⌉ = 500 ms (expiry 1,167); `a`, a new
/// key again, waits for `c`'s expiry, 334 ms away. At 1,001 `a` is admitted, rested.
pub async fn expired_keys_are_reclaimed_and_free_their_slots<B: QuotaBackend<Policy = GcraPolicy>>(
    backend: &mut B,
) {
    backend.bounded(2).await;
    let policy = gcra("gcra.reclaim", 3, 1_000, 2);
    let keys = backend.subjects_in_one_shard(3);
    let (a, b, c) = (check(&policy, keys[0]), check(&policy, keys[1]), check(&policy, keys[2]));
    assert_eq!(allowed(&decide(backend, &a).await), (1, 334));
    assert_eq!(allowed(&decide(backend, &a).await), (0, 667));
    backend.advance(500).await;
    assert_eq!(allowed(&decide(backend, &b).await), (1, 334));
    backend.advance(166).await; // 666 ms
    assert_eq!(storage_denied(&decide(backend, &c).await), storage_retry::<B>(1));
    backend.advance(1).await; // 667 ms: a is fully rested
    backend.reclaim_expired().await;
    assert_eq!(allowed(&decide(backend, &c).await), (1, 334));
    assert_eq!(allowed(&decide(backend, &b).await), (0, 500), "b keeps its state");
    assert_eq!(storage_denied(&decide(backend, &a).await), storage_retry::<B>(334));
    backend.advance(334).await; // 1,001 ms: c is fully rested
    backend.reclaim_expired().await;
    assert_eq!(allowed(&decide(backend, &a).await), (1, 334));
}

/// A check of cost 3 on Q = 10 per 1,000 ms, B = 5 (T = 100 ms): the exact sequence of
/// allowed and denied checks, each retry being the earliest whole millisecond at which the
/// same cost fits.
///
/// Scaled by Q = 10: P = 1,000, B·P = 5,000, c·P = 3,000.
///
/// | at ms | cost | now_s  | ceiling | cand   | answer                                       |
/// |------:|-----:|-------:|--------:|-------:|----------------------------------------------|
/// | 0     | 3    | 0      | 5,000   | 3,000  | allowed: ⌊2,000/1,000⌋ = 2 left, ⌈3,000/10⌉ = 300 ms |
/// | 0     | 3    | 0      | 5,000   | 6,000  | denied: retry ⌈1,000/10⌉ = 100               |
/// | 100   | 3    | 1,000  | 6,000   | 6,000  | allowed: 0 left, ⌈5,000/10⌉ = 500 ms         |
/// | 100   | 3    | 1,000  | 6,000   | 9,000  | denied: retry 300                            |
/// | 250   | 3    | 2,500  | 7,500   | 9,000  | denied: retry 150                            |
/// | 399   | 3    | 3,990  | 8,990   | 9,000  | denied: retry 1                              |
/// | 400   | 3    | 4,000  | 9,000   | 9,000  | allowed: 0 left, 500 ms                      |
/// | 400   | 1    | 4,000  | 9,000   | 10,000 | denied: retry 100 (a smaller cost fits sooner) |
/// | 500   | 1    | 5,000  | 10,000  | 10,000 | allowed: 0 left, 500 ms                      |
/// | 2,000 | 3    | 20,000 | 25,000  | 23,000 | allowed (rested): 2 left, 300 ms             |
/// | 2,000 | 5    | 20,000 | 25,000  | 28,000 | denied: retry 300                            |
/// | 2,000 | 2    | 20,000 | 25,000  | 25,000 | allowed: 0 left, 500 ms                      |
///
/// A cost of B = 5 on a rested key takes the whole burst: cand 5,000 → 0 left, 500 ms.
pub async fn cost_three_on_ten_per_second_burst_five_exact_sequence<B: QuotaBackend<Policy = GcraPolicy>>(
    backend: &mut B,
) {
    let policy = gcra("gcra.cost", 10, 1_000, 5);
    let (one, two, three, five) = (
        check(&policy, subject(1)),
        costly(&policy, subject(1), 2),
        costly(&policy, subject(1), 3),
        costly(&policy, subject(1), 5),
    );
    assert_eq!(allowed_with_capacity(&decide(backend, &three).await), (5, 2, 300));
    assert_eq!(quota_denied(&decide(backend, &three).await), (5, 100));
    backend.advance(100).await;
    assert_eq!(allowed(&decide(backend, &three).await), (0, 500));
    assert_eq!(quota_denied(&decide(backend, &three).await), (5, 300));
    backend.advance(150).await; // 250 ms
    assert_eq!(quota_denied(&decide(backend, &three).await), (5, 150));
    backend.advance(149).await; // 399 ms
    assert_eq!(quota_denied(&decide(backend, &three).await), (5, 1));
    backend.advance(1).await; // 400 ms
    assert_eq!(allowed(&decide(backend, &three).await), (0, 500));
    assert_eq!(quota_denied(&decide(backend, &one).await), (5, 100));
    backend.advance(100).await; // 500 ms
    assert_eq!(allowed(&decide(backend, &one).await), (0, 500));
    backend.advance(1_500).await; // 2,000 ms
    assert_eq!(allowed(&decide(backend, &three).await), (2, 300));
    assert_eq!(quota_denied(&decide(backend, &five).await), (5, 300));
    assert_eq!(allowed(&decide(backend, &two).await), (0, 500));
    assert_eq!(allowed(&decide(backend, &costly(&policy, subject(2), 5)).await), (0, 500));
}

/// A cost of zero, or above the burst capacity (which no wait could make fit), is a typed
/// error when the check is built; the rejected checks never reach the backend, whose rested
/// key then grants the whole burst.
///
/// Q = 10 per 1,000 ms, B = 5: a cost of 5 leaves 0, replenished after 500 ms.
pub async fn costs_outside_one_to_the_burst_are_rejected_when_the_check_is_built<
    B: QuotaBackend<Policy = GcraPolicy>,
>(
    backend: &mut B,
) {
    let policy = gcra("gcra.cost.range", 10, 1_000, 5);
    let capacity = policy.capacity();
    assert_eq!(capacity, policy.burst_capacity());
    assert_eq!(Check::new(subject(1).bind(&policy)).with_cost(0).unwrap_err(), CostError::Zero);
    assert_eq!(
        Check::new(subject(1).bind(&policy)).with_cost(6).unwrap_err(),
        CostError::ExceedsCapacity { cost: 6, capacity }
    );
    assert_eq!(allowed(&decide(backend, &costly(&policy, subject(1), 5)).await), (0, 500));
}

/// Each batch member carries its own cost, all-or-nothing: when the second member's cost
/// does not fit, the batch is denied at index 1 and the first member's cost is not taken.
///
/// Q = 10 per 1,000 ms, B = 5 (scaled P = 1,000, B·P = 5,000). The second key spent 3 at 0 ms
/// (tat 3,000). At 0 the batch [first key × 4, second key × 3] is denied at index 1: cand
/// 6,000 − ceiling 5,000 → retry 100. The first key is still rested: a cost of 5 leaves 0,
/// 500 ms; the second still has 2 left: a cost of 2 fits (cand 5,000), 0 left, 500 ms.
pub async fn batch_member_whose_cost_does_not_fit_consumes_nothing_from_the_others<
    B: QuotaBackend<Policy = GcraPolicy>,
>(
    backend: &mut B,
) {
    let policy = gcra("gcra.cost.batch", 10, 1_000, 5);
    assert_eq!(allowed(&decide(backend, &costly(&policy, subject(2), 3)).await), (2, 300));
    let batch = [costly(&policy, subject(1), 4), costly(&policy, subject(2), 3)];
    assert_eq!(batch_denied(&decide_all(backend, &batch).await), (1, 2, quota_denial(5, 100)));
    let fits = [costly(&policy, subject(1), 5), costly(&policy, subject(2), 2)];
    assert_eq!(batch_allowed(&decide_all(backend, &fits).await), [(0, 500), (0, 500)]);
}

/// A cost of [`MAX_LIMIT`] = L on Q = L per W = [`MAX_WINDOW_MILLIS`] ms with B = L never
/// overflows (the scaled values pass 2⁶⁴ and are computed in 128 bits).
///
/// At 0: cand L·W = ceiling → allowed, 0 left, replenish ⌈L·W / L⌉ = W ms. Cost 1 at 0: cand
/// L·W + W − ceiling L·W → retry ⌈W / L⌉ = 1 ms. At 1 ms (now_s = L, ceiling L + L·W): cost 1
/// → cand L·W + W, ⌊(L − W) / W⌋ = 1,023,999 left, replenish ⌈(L·W + W − L) / L⌉ = W ms.
pub async fn cost_of_max_limit_on_a_max_limit_policy<B: QuotaBackend<Policy = GcraPolicy>>(backend: &mut B) {
    let w = MAX_WINDOW_MILLIS;
    let policy = gcra("gcra.cost.max", MAX_LIMIT, w, MAX_LIMIT);
    let all = costly(&policy, subject(1), MAX_LIMIT);
    assert_eq!(allowed_with_capacity(&decide(backend, &all).await), (MAX_LIMIT, 0, w));
    assert_eq!(quota_denied(&decide(backend, &check(&policy, subject(1))).await), (MAX_LIMIT, 1));
    backend.advance(1).await;
    assert_eq!(allowed(&decide(backend, &check(&policy, subject(1))).await), (1_023_999, w));
}

/// A peek reports the exact GCRA state (the units spendable now, the time until one more is
/// and until fully rested) and consumes nothing; for an empty quota its next unit is a cost-1
/// check's retry.
///
/// Q = 10 per 1,000 ms, B = 5 (scaled P = 1,000, B·P = 5,000), state after a cost of 3 at
/// 0 ms: tat 3,000. At 0: ahead 3,000, room 2,000 → (2, ⌈1,000/10⌉ = 100, 300). At 25 ms:
/// ahead 2,750, room 2,250 → (2, ⌈750/10⌉ = 75, 275); a cost of 2 would be allowed, 3 not. The
/// check of cost 2 is then allowed (cand 5,000 ≤ ceiling 5,250 → 0 left, ⌈4,750/10⌉ = 475 ms),
/// and a peek reads (0, ⌈(1,000 − 250)/10⌉ = 75, 475). At 500 ms it is rested: (5, none, 0).
pub async fn peek_reports_the_exact_state_without_consuming_anything<B: QuotaBackend<Policy = GcraPolicy>>(
    backend: &mut B,
) {
    let policy = gcra("gcra.peek", 10, 1_000, 5);
    let key = subject(1);
    let subject = key.bind(&policy);
    assert_eq!(snapshot(&peek(backend, subject).await), (5, None, 0));
    assert_eq!(allowed(&decide(backend, &costly(&policy, key, 3)).await), (2, 300));
    assert_eq!(snapshot(&peek(backend, subject).await), (2, Some(100), 300));
    backend.advance(25).await;
    for _ in 0..3 {
        let read = peek(backend, subject).await;
        assert_eq!(snapshot(&read), (2, Some(75), 275));
        assert_eq!((read.would_allow(2), read.would_allow(3)), (true, false));
    }
    assert_eq!(allowed(&decide(backend, &costly(&policy, key, 2)).await), (0, 475));
    assert_eq!(snapshot(&peek(backend, subject).await), (0, Some(75), 475));
    assert_eq!(quota_denied(&decide(backend, &check(&policy, key)).await), (5, 75));
    backend.advance(475).await; // 500 ms
    assert_eq!(snapshot(&peek(backend, subject).await), (5, None, 0));
}

/// A peek of a subject without state creates none and takes no slot: on a shard of one key,
/// peeking `a` leaves room for `b`; `a` then still reads as rested and its check is a storage
/// denial.
///
/// Shard of 1 key; Q = 1 per 1,000 ms, B = 2: `b`'s first check leaves 1, rested after 1,000.
pub async fn peek_never_creates_state_or_takes_a_slot<B: QuotaBackend<Policy = GcraPolicy>>(backend: &mut B) {
    backend.bounded(1).await;
    let policy = gcra("gcra.peek.slot", 1, 1_000, 2);
    let keys = backend.subjects_in_one_shard(2);
    let (a, b) = (keys[0].bind(&policy), keys[1].bind(&policy));
    assert_eq!(snapshot(&peek(backend, a).await), (2, None, 0));
    assert_eq!(allowed(&decide(backend, &check(&policy, keys[1])).await), (1, 1_000));
    assert_eq!(snapshot(&peek(backend, a).await), (2, None, 0));
    assert_eq!(snapshot(&peek(backend, b).await), (1, Some(1_000), 1_000));
    assert_eq!(storage_denied(&decide(backend, &check(&policy, keys[0])).await), storage_retry::<B>(1_000));
}

/// A reset removes the subject's arrival time and says whether it was live: the next check
/// sees a rested subject, and the freed slot admits a new key on a full shard.
///
/// Shard of 1 key; Q = 1 per 1,000 ms, B = 2. `a` spends 2 at 0 ms (rested at 2,000); `b` is
/// refused. At 500 ms `a` is reset (true, then false); `b` is admitted (1 left, 1,000 ms) and
/// `a` refused; `b` reset; `a` is rested again: 1 left, 1,000 ms. At 2,000 ms `a`'s state has
/// expired: its reset finds no live state.
pub async fn reset_clears_the_state_and_frees_the_slot<B: QuotaBackend<Policy = GcraPolicy>>(
    backend: &mut B,
) {
    backend.bounded(1).await;
    let policy = gcra("gcra.reset", 1, 1_000, 2);
    let keys = backend.subjects_in_one_shard(2);
    let (a, b) = (keys[0].bind(&policy), keys[1].bind(&policy));
    assert_eq!(allowed(&decide(backend, &costly(&policy, keys[0], 2)).await), (0, 2_000));
    assert_eq!(storage_denied(&decide(backend, &check(&policy, keys[1])).await), storage_retry::<B>(2_000));
    backend.advance(500).await;
    assert!(reset(backend, a).await, "a held live state");
    assert!(!reset(backend, a).await, "nothing left to reset");
    assert_eq!(snapshot(&peek(backend, a).await), (2, None, 0));
    assert_eq!(allowed(&decide(backend, &check(&policy, keys[1])).await), (1, 1_000));
    assert_eq!(storage_denied(&decide(backend, &check(&policy, keys[0])).await), storage_retry::<B>(1_000));
    assert!(reset(backend, b).await);
    assert_eq!(allowed(&decide(backend, &check(&policy, keys[0])).await), (1, 1_000));
    backend.advance(1_500).await; // 2,000 ms: a (rested at 1,500) has expired
    assert!(!reset(backend, a).await, "an expired state is no live state");
    assert_eq!(allowed(&decide(backend, &check(&policy, keys[1])).await), (1, 1_000), "the slot is free");
}

/// An observer that panics with a payload whose own `Drop` panics changes no result: every
/// check, batch and reset returns exactly what it would without an observer, nothing unwinds
/// into the caller, and the observer received one observation per operation.
///
/// Q = 1 per 1,000 ms, B = 2, all at 0 ms: `a` has 1 left (1,000 ms to rested), then 0
/// (2,000 ms), then is denied with 1,000 ms; a batch of `a` and a fresh `b` is denied at index
/// 0 and consumes nothing (`b` then has 1 left); a reset of `a` finds state, after which `a` is
/// rested.
pub async fn a_hostile_observer_changes_no_result<B: QuotaBackend<Policy = GcraPolicy>>(backend: &mut B) {
    let observer = Arc::new(HostileObserver::default());
    backend.observed(observer.clone()).await;
    let policy = gcra("gcra.hostile", 1, 1_000, 2);
    assert_eq!(allowed(&decide(backend, &check(&policy, subject(1))).await), (1, 1_000));
    assert_eq!(allowed(&decide(backend, &check(&policy, subject(1))).await), (0, 2_000));
    assert_eq!(quota_denied(&decide(backend, &check(&policy, subject(1))).await), (2, 1_000));
    let batch = [check(&policy, subject(1)), check(&policy, subject(2))];
    assert_eq!(batch_denied(&decide_all(backend, &batch).await), (0, 2, quota_denial(2, 1_000)));
    assert_eq!(allowed(&decide(backend, &check(&policy, subject(2))).await), (1, 1_000));
    assert!(reset(backend, subject(1).bind(&policy)).await);
    assert_eq!(allowed(&decide(backend, &check(&policy, subject(1))).await), (1, 1_000));
    assert_eq!(observer.calls(), 7, "one observation per check, batch and reset");
}
