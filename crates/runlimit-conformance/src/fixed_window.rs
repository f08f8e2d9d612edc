//! Anchored fixed windows, their atomic batches and their storage bounds.
//!
//! Every scenario is generic over a [`QuotaBackend`] whose policy is [`FixedWindowPolicy`],
//! starts at 0 ms on a fresh backend and asserts exact values. The rule
//! ([`runlimit_core::backend::fixed_window`]), for a policy of limit `L` and window `W`: the
//! first allowed check of a key anchors a window `[now, now + W)`; inside it, a check of cost
//! `c` (1 unless a scenario says otherwise) is allowed while `u + c ≤ L`, leaving `L − u − c`
//! available and `deadline − now` to replenishment; otherwise it is denied with `retry_after =
//! deadline − now`, consuming nothing; from the deadline on the window is over and the next
//! allowed check anchors a new one at its own time.
//!
//! Scenarios that need bounded storage call [`QuotaBackend::bounded`] first and take every
//! key they store from [`QuotaBackend::subjects_in_one_shard`], so they fill exactly one
//! shard whatever the backend's shard layout.

use std::sync::Arc;

use runlimit_core::{
    Check, CostError, FixedWindowPolicy, MAX_LIMIT, MAX_WINDOW, MAX_WINDOW_MILLIS, QuotaMode, RateLimitPolicy,
};

use crate::{
    QuotaBackend,
    support::{
        HostileObserver, allowed, allowed_with_capacity, batch_allowed, batch_denied, batch_shadow_denied,
        check, costly, decide, decide_all, fixed_window, fixed_window_in, peek, quota_denial, quota_denied,
        rejected_batch, reset, shadow_denied, snapshot, storage_denial, storage_denied, storage_retry,
        subject,
    },
};

/// The scenario list: one name per `pub async fn` of this module (a unit test checks it).
#[doc(hidden)]
#[macro_export]
macro_rules! __fixed_window_scenario_names {
    ($($args:tt)*) => {
        $crate::__scenarios! { $($args)* [
            first_allowed_check_anchors_the_window_and_counts_down
            window_reanchors_exactly_at_the_deadline_not_a_millisecond_before
            late_check_after_idle_anchors_at_its_own_time
            denied_checks_consume_nothing_and_keep_the_anchor
            shadow_denied_checks_admit_consume_nothing_and_share_counters
            every_policy_parameter_starts_an_independent_counter
            max_limit_and_max_window_work_with_exact_values
            allowed_batch_consumes_every_check_in_input_order
            denied_batch_names_the_first_denied_index_and_consumes_nothing
            shadow_denied_batch_admits_and_consumes_nothing
            empty_batch_is_rejected
            oversized_batch_is_rejected_before_any_work
            mixed_mode_batch_is_rejected_before_any_work
            duplicate_key_batch_is_rejected_before_any_work
            enforced_batch_reports_the_earliest_denial_whatever_its_reason
            shadow_batch_storage_denial_wins_over_shadow_quota_denials
            full_shard_denies_a_new_key_and_keeps_live_keys
            full_shard_denies_a_new_key_in_shadow_mode
            expired_keys_are_reclaimed_and_free_their_slots
            cost_of_the_whole_limit_fits_a_fresh_window_then_one_unit_is_denied
            costs_outside_one_to_the_limit_are_rejected_when_the_check_is_built
            batch_member_whose_cost_does_not_fit_consumes_nothing_from_the_others
            shadow_cost_that_does_not_fit_admits_and_consumes_nothing
            cost_of_max_limit_on_a_max_limit_policy
            peek_reports_the_window_without_consuming_anything
            peek_never_creates_state_or_takes_a_slot
            reset_clears_the_state_and_frees_the_slot
            reset_through_a_shadow_policy_clears_the_shared_counter
            a_hostile_observer_changes_no_result
        ] }
    };
}

crate::__fixed_window_scenario_names! { @names }

/// The first allowed check anchors the window at its own time (5,000 ms, not a multiple of
/// the window) and later checks count down from the limit with the exact time left to the
/// deadline; once exhausted, checks are denied until the deadline.
///
/// L = 3, W = 1,000 ms, anchored at 5,000 ms (deadline 6,000 ms).
pub async fn first_allowed_check_anchors_the_window_and_counts_down<
    B: QuotaBackend<Policy = FixedWindowPolicy>,
>(
    backend: &mut B,
) {
    let policy = fixed_window("fw.anchor", 3, 1_000);
    let key = check(&policy, subject(1));
    backend.advance(5_000).await;
    assert_eq!(allowed_with_capacity(&decide(backend, &key).await), (3, 2, 1_000));
    backend.advance(100).await;
    assert_eq!(allowed(&decide(backend, &key).await), (1, 900));
    backend.advance(100).await;
    assert_eq!(allowed(&decide(backend, &key).await), (0, 800));
    backend.advance(100).await;
    assert_eq!(quota_denied(&decide(backend, &key).await), (3, 700));
    backend.advance(699).await; // 5,999 ms
    assert_eq!(quota_denied(&decide(backend, &key).await), (3, 1));
}

/// A window is over exactly at its deadline, not a millisecond before: the check at
/// `deadline − 1` is denied with 1 ms left, the check at the deadline anchors a new window
/// whose full length remains.
///
/// L = 1, W = 60,000 ms, anchored at 250 ms (deadline 60,250), re-anchored at 60,250
/// (deadline 120,250).
pub async fn window_reanchors_exactly_at_the_deadline_not_a_millisecond_before<
    B: QuotaBackend<Policy = FixedWindowPolicy>,
>(
    backend: &mut B,
) {
    let policy = fixed_window("fw.reanchor", 1, 60_000);
    let key = check(&policy, subject(1));
    backend.advance(250).await;
    assert_eq!(allowed(&decide(backend, &key).await), (0, 60_000));
    backend.advance(59_999).await; // 60,249 ms
    assert_eq!(quota_denied(&decide(backend, &key).await), (1, 1));
    backend.advance(1).await; // 60,250 ms: the deadline
    assert_eq!(allowed(&decide(backend, &key).await), (0, 60_000));
    backend.advance(30_000).await; // 90,250 ms
    assert_eq!(quota_denied(&decide(backend, &key).await), (1, 30_000));
}

/// After an idle gap, the next check anchors its window at its own time, not at a boundary
/// aligned to the window: at 3,700 ms a new 1,000 ms window starts (an aligned window would
/// have 300 ms left), and it ends at 4,700 ms.
///
/// L = 2, W = 1,000 ms.
pub async fn late_check_after_idle_anchors_at_its_own_time<B: QuotaBackend<Policy = FixedWindowPolicy>>(
    backend: &mut B,
) {
    let policy = fixed_window("fw.late", 2, 1_000);
    let key = check(&policy, subject(1));
    assert_eq!(allowed(&decide(backend, &key).await), (1, 1_000));
    backend.advance(3_700).await;
    assert_eq!(allowed(&decide(backend, &key).await), (1, 1_000));
    backend.advance(999).await; // 4,699 ms
    assert_eq!(allowed(&decide(backend, &key).await), (0, 1));
    backend.advance(1).await; // 4,700 ms: the new window's deadline
    assert_eq!(allowed(&decide(backend, &key).await), (1, 1_000));
}

/// Denied checks consume nothing and never move the anchor: denials at 100, 500 and 999 ms
/// report the time left to the original deadline (1,000 ms), and at that deadline a fresh
/// window with the full limit starts.
///
/// L = 2, W = 1,000 ms, anchored at 0 ms.
pub async fn denied_checks_consume_nothing_and_keep_the_anchor<
    B: QuotaBackend<Policy = FixedWindowPolicy>,
>(
    backend: &mut B,
) {
    let policy = fixed_window("fw.denied", 2, 1_000);
    let key = check(&policy, subject(1));
    assert_eq!(allowed(&decide(backend, &key).await), (1, 1_000));
    assert_eq!(allowed(&decide(backend, &key).await), (0, 1_000));
    backend.advance(100).await;
    assert_eq!(quota_denied(&decide(backend, &key).await), (2, 900));
    assert_eq!(quota_denied(&decide(backend, &key).await), (2, 900));
    backend.advance(400).await;
    assert_eq!(quota_denied(&decide(backend, &key).await), (2, 500));
    backend.advance(499).await;
    assert_eq!(quota_denied(&decide(backend, &key).await), (2, 1));
    backend.advance(1).await; // 1,000 ms
    assert_eq!(allowed(&decide(backend, &key).await), (1, 1_000));
    assert_eq!(allowed(&decide(backend, &key).await), (0, 1_000));
}

/// A shadow policy consumes like an enforced one while it has quota; exhausted, it admits
/// (shadow-denied, `permits_request`) with the denial enforcement would give and consumes
/// nothing. Quota mode is not in the fingerprint: the enforced policy reads and continues the
/// same counter, in both directions.
///
/// L = 2, W = 1,000 ms, anchored at 0 ms by the shadow policy.
pub async fn shadow_denied_checks_admit_consume_nothing_and_share_counters<
    B: QuotaBackend<Policy = FixedWindowPolicy>,
>(
    backend: &mut B,
) {
    let enforced = fixed_window("fw.shadow", 2, 1_000);
    let shadow = enforced.clone().with_quota_mode(QuotaMode::Shadow);
    let shadow_key = check(&shadow, subject(7));
    let enforced_key = check(&enforced, subject(7));
    assert_eq!(allowed(&decide(backend, &shadow_key).await), (1, 1_000));
    assert_eq!(allowed(&decide(backend, &shadow_key).await), (0, 1_000));
    backend.advance(400).await;
    for _ in 0..3 {
        assert_eq!(shadow_denied(&decide(backend, &shadow_key).await), (2, 600));
    }
    // Same counter under enforcement: exhausted, with the same anchor.
    assert_eq!(quota_denied(&decide(backend, &enforced_key).await), (2, 600));
    backend.advance(600).await; // 1,000 ms: the shadow denials consumed nothing
    assert_eq!(allowed(&decide(backend, &enforced_key).await), (1, 1_000));
    // ... and the shadow policy sees what enforcement consumed.
    assert_eq!(allowed(&decide(backend, &shadow_key).await), (0, 1_000));
    assert_eq!(quota_denied(&decide(backend, &enforced_key).await), (2, 1_000));
}

/// The policy identifier, scope, limit and window are all fingerprinted into the storage
/// key: with the base policy exhausted for a subject, a policy differing in any one of them
/// starts a fresh counter for the same subject (first check: `L − 1` available, `W` to
/// replenish), and none of them touches the base counter. Another subject under the base
/// policy is independent too.
///
/// Base L = 1, W = 1,000 ms; then a roomier base, L = 3, W = 60,000 ms, exhausted at 100 ms,
/// whose variants each report their own capacity (3, or 4 for the other limit), leave
/// `L − 1` and replenish after their own window (60,000 ms, or 61,000 for the other window).
pub async fn every_policy_parameter_starts_an_independent_counter<
    B: QuotaBackend<Policy = FixedWindowPolicy>,
>(
    backend: &mut B,
) {
    let base = fixed_window_in("fw.param", "a", 1, 1_000);
    let variants = [
        (fixed_window_in("fw.param2", "a", 1, 1_000), 0, 1_000),
        (fixed_window_in("fw.param", "b", 1, 1_000), 0, 1_000),
        (fixed_window_in("fw.param", "a", 2, 1_000), 1, 1_000),
        (fixed_window_in("fw.param", "a", 1, 2_000), 0, 2_000),
    ];
    let key = subject(1);
    assert_eq!(allowed(&decide(backend, &check(&base, key)).await), (0, 1_000));
    assert_eq!(quota_denied(&decide(backend, &check(&base, key)).await), (1, 1_000));
    backend.advance(100).await;
    for (policy, available, window) in &variants {
        let decision = decide(backend, &check(policy, key)).await;
        assert_eq!(allowed(&decision), (*available, *window), "{policy:?}");
    }
    assert_eq!(allowed(&decide(backend, &check(&base, subject(2))).await), (0, 1_000));
    assert_eq!(quota_denied(&decide(backend, &check(&base, key)).await), (1, 900));

    let roomy = fixed_window_in("fw.param.roomy", "a", 3, 60_000);
    let roomy_variants = [
        (fixed_window_in("fw.param.roomy2", "a", 3, 60_000), 3, 60_000),
        (fixed_window_in("fw.param.roomy", "b", 3, 60_000), 3, 60_000),
        (fixed_window_in("fw.param.roomy", "a", 4, 60_000), 4, 60_000),
        (fixed_window_in("fw.param.roomy", "a", 3, 61_000), 3, 61_000),
    ];
    for available in [2, 1, 0] {
        assert_eq!(allowed(&decide(backend, &check(&roomy, key)).await), (available, 60_000));
    }
    assert_eq!(quota_denied(&decide(backend, &check(&roomy, key)).await), (3, 60_000));
    for (policy, limit, window) in &roomy_variants {
        let decision = decide(backend, &check(policy, key)).await;
        assert_eq!(allowed_with_capacity(&decision), (*limit, *limit - 1, *window), "{policy:?}");
    }
}

/// A policy at the portable bounds, limit [`MAX_LIMIT`] and window [`MAX_WINDOW`], works with
/// exact values: the first check leaves `MAX_LIMIT − 1` and replenishes after exactly
/// `MAX_WINDOW`; 1,000 ms later the next leaves `MAX_LIMIT − 2` with `MAX_WINDOW − 1,000 ms`
/// left; a batch at the bounds counts both keys exactly.
pub async fn max_limit_and_max_window_work_with_exact_values<B: QuotaBackend<Policy = FixedWindowPolicy>>(
    backend: &mut B,
) {
    let window_ms = u64::try_from(MAX_WINDOW.as_millis()).expect("MAX_WINDOW fits u64 ms");
    assert_eq!(window_ms, MAX_WINDOW_MILLIS);
    let policy = fixed_window("fw.max", MAX_LIMIT, window_ms);
    assert_eq!(policy.capacity().get(), MAX_LIMIT);
    let first = check(&policy, subject(1));
    let second = check(&policy, subject(2));
    assert_eq!(allowed_with_capacity(&decide(backend, &first).await), (MAX_LIMIT, MAX_LIMIT - 1, window_ms));
    backend.advance(1_000).await;
    assert_eq!(allowed(&decide(backend, &first).await), (MAX_LIMIT - 2, window_ms - 1_000));
    assert_eq!(
        batch_allowed(&decide_all(backend, &[first, second]).await),
        [(MAX_LIMIT - 3, window_ms - 1_000), (MAX_LIMIT - 1, window_ms)]
    );
    backend.advance(1_000).await;
    assert_eq!(allowed(&decide(backend, &second).await), (MAX_LIMIT - 2, window_ms - 1_000));
}

/// An allowed batch consumes every check together and returns one allowance per check, in
/// input order (whatever that order is); each member's counter then continues from there.
///
/// client: L = 40, W = 60,000 ms; identity: L = 8, W = 30,000 ms; both anchored at 0 ms.
pub async fn allowed_batch_consumes_every_check_in_input_order<
    B: QuotaBackend<Policy = FixedWindowPolicy>,
>(
    backend: &mut B,
) {
    let client = fixed_window("fw.batch.client", 40, 60_000);
    let identity = fixed_window("fw.batch.identity", 8, 30_000);
    let c = check(&client, subject(1));
    let i = check(&identity, subject(2));
    assert_eq!(batch_allowed(&decide_all(backend, &[c, i]).await), [(39, 60_000), (7, 30_000)]);
    backend.advance(1_000).await;
    assert_eq!(batch_allowed(&decide_all(backend, &[i, c]).await), [(6, 29_000), (38, 59_000)]);
    assert_eq!(allowed(&decide(backend, &c).await), (37, 59_000));
    assert_eq!(allowed(&decide(backend, &i).await), (5, 29_000));
}

/// A denied batch names the first denied index in input order (with that check's own
/// retry: 750 ms, not the later check's 850 ms) and the batch size, and consumes nothing:
/// afterwards the new keys anchor their own windows and the existing key has its count.
///
/// roomy: L = 5, W = 1,000 ms; tight: L = 1, W = 1,000 ms. At 0 ms `d` (roomy) is checked
/// once and `b1` (tight) exhausted; at 100 ms `b2` (tight) exhausted; the batch runs at
/// 250 ms, the members alone at 300 ms.
pub async fn denied_batch_names_the_first_denied_index_and_consumes_nothing<
    B: QuotaBackend<Policy = FixedWindowPolicy>,
>(
    backend: &mut B,
) {
    let roomy = fixed_window("fw.denied.roomy", 5, 1_000);
    let tight = fixed_window("fw.denied.tight", 1, 1_000);
    let a = check(&roomy, subject(1));
    let b1 = check(&tight, subject(2));
    let c = check(&roomy, subject(3));
    let b2 = check(&tight, subject(4));
    let d = check(&roomy, subject(5));
    assert_eq!(allowed(&decide(backend, &d).await), (4, 1_000));
    assert_eq!(allowed(&decide(backend, &b1).await), (0, 1_000));
    backend.advance(100).await;
    assert_eq!(allowed(&decide(backend, &b2).await), (0, 1_000));
    backend.advance(150).await; // 250 ms
    assert_eq!(batch_denied(&decide_all(backend, &[a, b1, c, b2, d]).await), (1, 5, quota_denial(1, 750)));
    assert_eq!(batch_denied(&decide_all(backend, &[a, b2, b1]).await), (1, 3, quota_denial(1, 850)));
    backend.advance(50).await; // 300 ms
    assert_eq!(allowed(&decide(backend, &a).await), (4, 1_000), "a was not anchored by the batch");
    assert_eq!(allowed(&decide(backend, &c).await), (4, 1_000), "c was not anchored by the batch");
    assert_eq!(allowed(&decide(backend, &d).await), (3, 700), "d was not consumed by the batch");
}

/// A shadow batch whose check is exhausted is shadow-denied at that index: it admits
/// (`permits_request`), reports what enforcement would have answered, and consumes nothing,
/// not even the checks that had quota.
///
/// first: L = 3, second: L = 1, both W = 1,000 ms, anchored at 0 ms by an allowed batch. The
/// pair `c`, `d` is shadow-denied at the instant of its allowed batch (retry: the whole
/// window), and `c` alone then still has its count.
pub async fn shadow_denied_batch_admits_and_consumes_nothing<B: QuotaBackend<Policy = FixedWindowPolicy>>(
    backend: &mut B,
) {
    let first = fixed_window("fw.shadow.first", 3, 1_000).with_quota_mode(QuotaMode::Shadow);
    let second = fixed_window("fw.shadow.second", 1, 1_000).with_quota_mode(QuotaMode::Shadow);
    let a = check(&first, subject(1));
    let b = check(&second, subject(1));
    let (c, d) = (check(&first, subject(2)), check(&second, subject(2)));
    assert_eq!(batch_allowed(&decide_all(backend, &[c, d]).await), [(2, 1_000), (0, 1_000)]);
    assert_eq!(batch_shadow_denied(&decide_all(backend, &[c, d]).await), (1, 2, 1, 1_000));
    assert_eq!(allowed(&decide(backend, &c).await), (1, 1_000), "the shadow-denied batch consumed nothing");
    assert_eq!(batch_allowed(&decide_all(backend, &[a, b]).await), [(2, 1_000), (0, 1_000)]);
    backend.advance(100).await;
    assert_eq!(batch_shadow_denied(&decide_all(backend, &[a, b]).await), (1, 2, 1, 900));
    assert_eq!(batch_shadow_denied(&decide_all(backend, &[b, a]).await), (0, 2, 1, 900));
    assert_eq!(allowed(&decide(backend, &a).await), (1, 900), "the shadow-denied batches consumed nothing");
}

/// An empty batch is rejected with [`BatchError::EmptyBatch`](runlimit_core::BatchError)
/// rather than vacuously allowed.
pub async fn empty_batch_is_rejected<B: QuotaBackend<Policy = FixedWindowPolicy>>(backend: &mut B) {
    assert_eq!(rejected_batch(backend, &[]).await, runlimit_core::BatchError::EmptyBatch);
}

/// A batch of `MAX_BATCH_SIZE + 1` checks is rejected with `TooManyChecks` naming its size
/// and the backend's maximum, before any work: 100 ms later every member's first check
/// anchors a fresh window. A batch of exactly `MAX_BATCH_SIZE` checks is allowed.
///
/// L = 2, W = 1,000 ms.
pub async fn oversized_batch_is_rejected_before_any_work<B: QuotaBackend<Policy = FixedWindowPolicy>>(
    backend: &mut B,
) {
    let policy = fixed_window("fw.oversized", 2, 1_000);
    let size = B::MAX_BATCH_SIZE + 1;
    let keys: Vec<_> = (0..).take(size).map(|n| check(&policy, subject(n))).collect();
    assert_eq!(
        rejected_batch(backend, &keys).await,
        runlimit_core::BatchError::TooManyChecks { batch_size: size, maximum: B::MAX_BATCH_SIZE }
    );
    backend.advance(100).await;
    for (index, key) in keys.iter().enumerate() {
        assert_eq!(allowed(&decide(backend, key).await), (1, 1_000), "member {index} was not consumed");
    }
    let full = decide_all(backend, &keys[1..]).await;
    assert_eq!(batch_allowed(&full), vec![(0, 1_000); B::MAX_BATCH_SIZE]);
}

/// A batch mixing enforced and shadow checks is rejected with `MixedQuotaModes`, naming the
/// first check whose mode differs from check 0's and its mode, before any work (and before the
/// duplicate-key rule: the same key in both modes is a mode mismatch). Afterwards every member
/// is fresh.
///
/// Both policies: L = 2, W = 1,000 ms; the members are checked alone 100 ms later.
pub async fn mixed_mode_batch_is_rejected_before_any_work<B: QuotaBackend<Policy = FixedWindowPolicy>>(
    backend: &mut B,
) {
    use runlimit_core::BatchError::MixedQuotaModes;
    let enforced = fixed_window("fw.mixed.enforced", 2, 1_000);
    let shadow = fixed_window("fw.mixed.shadow", 2, 1_000).with_quota_mode(QuotaMode::Shadow);
    let enforced_as_shadow = enforced.clone().with_quota_mode(QuotaMode::Shadow);
    let a = check(&enforced, subject(1));
    let b = check(&enforced, subject(2));
    let s = check(&shadow, subject(1));
    let a_shadow = check(&enforced_as_shadow, subject(1));
    assert_eq!(rejected_batch(backend, &[a, s]).await, MixedQuotaModes { index: 1, mode: QuotaMode::Shadow });
    assert_eq!(
        rejected_batch(backend, &[s, a]).await,
        MixedQuotaModes { index: 1, mode: QuotaMode::Enforce }
    );
    assert_eq!(
        rejected_batch(backend, &[a, b, s, s]).await,
        MixedQuotaModes { index: 2, mode: QuotaMode::Shadow }
    );
    assert_eq!(
        rejected_batch(backend, &[a, a_shadow]).await,
        MixedQuotaModes { index: 1, mode: QuotaMode::Shadow }
    );
    backend.advance(100).await;
    assert_eq!(allowed(&decide(backend, &a).await), (1, 1_000));
    assert_eq!(allowed(&decide(backend, &b).await), (1, 1_000));
    assert_eq!(allowed(&decide(backend, &s).await), (1, 1_000));
}

/// A batch repeating a storage key (same policy fingerprint and subject, even through another
/// copy of the policy) is rejected with `DuplicateCounterKey`, naming the pair with the
/// smallest later index, before any work. Afterwards every member is fresh.
///
/// L = 2, W = 1,000 ms; the members are checked alone 100 ms later.
pub async fn duplicate_key_batch_is_rejected_before_any_work<B: QuotaBackend<Policy = FixedWindowPolicy>>(
    backend: &mut B,
) {
    use runlimit_core::BatchError::DuplicateCounterKey;
    let policy = fixed_window("fw.duplicate", 2, 1_000);
    let copy = policy.clone();
    let a = check(&policy, subject(1));
    let b = check(&policy, subject(2));
    let a_again = check(&copy, subject(1));
    assert_eq!(
        rejected_batch(backend, &[a, b, a]).await,
        DuplicateCounterKey { first_index: 0, duplicate_index: 2 }
    );
    assert_eq!(
        rejected_batch(backend, &[a, b, a_again]).await,
        DuplicateCounterKey { first_index: 0, duplicate_index: 2 }
    );
    assert_eq!(
        rejected_batch(backend, &[a, b, b, a]).await,
        DuplicateCounterKey { first_index: 1, duplicate_index: 2 }
    );
    backend.advance(100).await;
    assert_eq!(allowed(&decide(backend, &a).await), (1, 1_000));
    assert_eq!(allowed(&decide(backend, &b).await), (1, 1_000));
}

/// Under enforcement the earliest denial in input order decides the batch, whatever its
/// reason: a new key on a full shard before an exhausted key is a storage denial at index 0,
/// the other order a quota denial at index 0; an allowed live key before a new key is not
/// consumed by the storage-denied batch.
///
/// Shard of 2 keys; L = 2, W = 1,000 ms. `a` exhausted at 0 ms (deadline 1,000), `b` checked
/// once at 300 ms (deadline 1,300); the batches run at 400 ms, when the earliest expiry is
/// 600 ms away.
pub async fn enforced_batch_reports_the_earliest_denial_whatever_its_reason<
    B: QuotaBackend<Policy = FixedWindowPolicy>,
>(
    backend: &mut B,
) {
    backend.bounded(2).await;
    let policy = fixed_window("fw.precedence", 2, 1_000);
    let keys = backend.subjects_in_one_shard(3);
    let (a, b, c) = (check(&policy, keys[0]), check(&policy, keys[1]), check(&policy, keys[2]));
    assert_eq!(allowed(&decide(backend, &a).await), (1, 1_000));
    assert_eq!(allowed(&decide(backend, &a).await), (0, 1_000));
    backend.advance(300).await;
    assert_eq!(allowed(&decide(backend, &b).await), (1, 1_000));
    backend.advance(100).await; // 400 ms
    assert_eq!(batch_denied(&decide_all(backend, &[c, a]).await), (0, 2, storage_denial::<B>(600)));
    assert_eq!(batch_denied(&decide_all(backend, &[a, c]).await), (0, 2, quota_denial(2, 600)));
    assert_eq!(batch_denied(&decide_all(backend, &[b, c]).await), (1, 2, storage_denial::<B>(600)));
    assert_eq!(allowed(&decide(backend, &b).await), (0, 900), "b was not consumed by the denied batches");
    assert_eq!(storage_denied(&decide(backend, &c).await), storage_retry::<B>(600), "c was not stored");
}

/// In shadow mode a storage-capacity denial wins over every shadow quota denial, before or
/// after it: the batch is denied (fail-closed) at the storage index even when an earlier check
/// is only shadow-exhausted. (Batches here hold at most as many keys as the shard, so no
/// backend may reject them structurally.) Without a storage denial, the first quota denial shadow-denies the
/// batch. Neither consumes anything.
///
/// Shard of 2 keys; shadow L = 2, W = 1,000 ms. `a` exhausted at 0 ms, `b` checked once at
/// 300 ms; the batches run at 400 ms, when the earliest expiry (`a`'s) is 600 ms away.
pub async fn shadow_batch_storage_denial_wins_over_shadow_quota_denials<
    B: QuotaBackend<Policy = FixedWindowPolicy>,
>(
    backend: &mut B,
) {
    backend.bounded(2).await;
    let policy = fixed_window("fw.shadow.precedence", 2, 1_000).with_quota_mode(QuotaMode::Shadow);
    let keys = backend.subjects_in_one_shard(3);
    let (a, b, c) = (check(&policy, keys[0]), check(&policy, keys[1]), check(&policy, keys[2]));
    assert_eq!(allowed(&decide(backend, &a).await), (1, 1_000));
    assert_eq!(allowed(&decide(backend, &a).await), (0, 1_000));
    backend.advance(300).await;
    assert_eq!(allowed(&decide(backend, &b).await), (1, 1_000));
    backend.advance(100).await; // 400 ms
    assert_eq!(batch_denied(&decide_all(backend, &[a, c]).await), (1, 2, storage_denial::<B>(600)));
    assert_eq!(batch_denied(&decide_all(backend, &[c, a]).await), (0, 2, storage_denial::<B>(600)));
    assert_eq!(batch_shadow_denied(&decide_all(backend, &[b, a]).await), (1, 2, 2, 600));
    assert_eq!(allowed(&decide(backend, &b).await), (0, 900), "b was not consumed by the batches");
    assert_eq!(storage_denied(&decide(backend, &c).await), storage_retry::<B>(600), "c was not stored");
}

/// A full shard denies a new key with `Denial::StorageCapacity` (`retry_after`: the exact
/// time until the shard's earliest expiry when the backend reports it) and never evicts a
/// live key: both stored keys keep their exact counts and deadlines.
///
/// Shard of 2 keys; L = 3, W = 1,000 ms. `a` anchored at 0 ms (deadline 1,000), `b` at
/// 200 ms (deadline 1,200); the new key `c` is refused at 300 and 999 ms.
pub async fn full_shard_denies_a_new_key_and_keeps_live_keys<B: QuotaBackend<Policy = FixedWindowPolicy>>(
    backend: &mut B,
) {
    backend.bounded(2).await;
    let policy = fixed_window("fw.full", 3, 1_000);
    let keys = backend.subjects_in_one_shard(3);
    let (a, b, c) = (check(&policy, keys[0]), check(&policy, keys[1]), check(&policy, keys[2]));
    assert_eq!(allowed(&decide(backend, &a).await), (2, 1_000));
    backend.advance(200).await;
    assert_eq!(allowed(&decide(backend, &b).await), (2, 1_000));
    backend.advance(100).await; // 300 ms
    assert_eq!(storage_denied(&decide(backend, &c).await), storage_retry::<B>(700));
    assert_eq!(allowed(&decide(backend, &a).await), (1, 700), "a keeps its count");
    assert_eq!(allowed(&decide(backend, &b).await), (1, 900), "b keeps its count");
    assert_eq!(allowed(&decide(backend, &a).await), (0, 700));
    assert_eq!(quota_denied(&decide(backend, &a).await), (3, 700));
    backend.advance(699).await; // 999 ms
    assert_eq!(storage_denied(&decide(backend, &c).await), storage_retry::<B>(1));
    assert_eq!(allowed(&decide(backend, &b).await), (0, 201));
}

/// Storage capacity is enforced in shadow mode too: a new key on a full shard is denied
/// (`permits_request` false), not shadow-denied, for the shadow policy and its enforced twin;
/// the live key is still served (shadow-denied when exhausted).
///
/// Shard of 1 key; shadow L = 1, W = 1,000 ms; `a` anchored at 0 ms, `b` refused at 0 ms (the
/// whole window to `a`'s expiry) and at 100 ms.
pub async fn full_shard_denies_a_new_key_in_shadow_mode<B: QuotaBackend<Policy = FixedWindowPolicy>>(
    backend: &mut B,
) {
    backend.bounded(1).await;
    let enforced = fixed_window("fw.full.shadow", 1, 1_000);
    let shadow = enforced.clone().with_quota_mode(QuotaMode::Shadow);
    let keys = backend.subjects_in_one_shard(2);
    let (a, b) = (check(&shadow, keys[0]), check(&shadow, keys[1]));
    assert_eq!(allowed(&decide(backend, &a).await), (0, 1_000));
    assert_eq!(storage_denied(&decide(backend, &b).await), storage_retry::<B>(1_000));
    backend.advance(100).await;
    assert_eq!(storage_denied(&decide(backend, &b).await), storage_retry::<B>(900));
    assert_eq!(storage_denied(&decide(backend, &check(&enforced, keys[1])).await), storage_retry::<B>(900));
    assert_eq!(shadow_denied(&decide(backend, &a).await), (1, 900), "a is still stored and exhausted");
}

/// Once stored keys expire, reclaiming expired storage frees their slots for new keys
/// (memory reclaims during checks, PostgreSQL in cleanup): at 1,000 ms `a`'s window is over,
/// a new key `c` is admitted while `b` keeps its count; `a`, now a new key itself, waits for
/// `b`'s expiry at 1,200 ms.
///
/// Shard of 2 keys; L = 3, W = 1,000 ms. `a` anchored at 0 ms, `b` at 200 ms.
pub async fn expired_keys_are_reclaimed_and_free_their_slots<B: QuotaBackend<Policy = FixedWindowPolicy>>(
    backend: &mut B,
) {
    backend.bounded(2).await;
    let policy = fixed_window("fw.reclaim", 3, 1_000);
    let keys = backend.subjects_in_one_shard(3);
    let (a, b, c) = (check(&policy, keys[0]), check(&policy, keys[1]), check(&policy, keys[2]));
    assert_eq!(allowed(&decide(backend, &a).await), (2, 1_000));
    backend.advance(200).await;
    assert_eq!(allowed(&decide(backend, &b).await), (2, 1_000));
    backend.advance(800).await; // 1,000 ms: a's deadline
    backend.reclaim_expired().await;
    assert_eq!(allowed(&decide(backend, &c).await), (2, 1_000));
    assert_eq!(allowed(&decide(backend, &b).await), (1, 200), "b keeps its count");
    assert_eq!(storage_denied(&decide(backend, &a).await), storage_retry::<B>(200));
    backend.advance(200).await; // 1,200 ms: b's deadline
    backend.reclaim_expired().await;
    assert_eq!(allowed(&decide(backend, &a).await), (2, 1_000));
    assert_eq!(allowed(&decide(backend, &c).await), (1, 800));
}

/// A check costs its units: a cost of the whole limit fits a fresh window and leaves nothing,
/// so a check of cost 1 is then denied with the exact time to the window's end. A denied cost
/// consumes nothing: a cost that does not fit what is left is denied while a smaller one that
/// fits is allowed, and each allowed cost takes exactly its units.
///
/// L = 5, W = 1,000 ms. Anchored at 200 ms by a cost of 5 (deadline 1,200): at 500 ms a cost
/// of 1 is denied, retry 1,200 − 500 = 700. At 1,200 a cost of 3 anchors a new window (5 − 3 =
/// 2 left, deadline 2,200); at 1,300 a cost of 3 does not fit (3 + 3 > 5): denied, retry 900;
/// a cost of 2 fits exactly (3 + 2 = 5): 0 left, 900 ms to replenishment.
pub async fn cost_of_the_whole_limit_fits_a_fresh_window_then_one_unit_is_denied<
    B: QuotaBackend<Policy = FixedWindowPolicy>,
>(
    backend: &mut B,
) {
    let policy = fixed_window("fw.cost", 5, 1_000);
    let (one, two, three, five) = (
        check(&policy, subject(1)),
        costly(&policy, subject(1), 2),
        costly(&policy, subject(1), 3),
        costly(&policy, subject(1), 5),
    );
    assert_eq!((one.cost(), five.cost()), (1, 5));
    backend.advance(200).await;
    assert_eq!(allowed_with_capacity(&decide(backend, &five).await), (5, 0, 1_000));
    backend.advance(300).await; // 500 ms
    assert_eq!(quota_denied(&decide(backend, &one).await), (5, 700));
    backend.advance(700).await; // 1,200 ms: the deadline
    assert_eq!(allowed(&decide(backend, &three).await), (2, 1_000));
    backend.advance(100).await; // 1,300 ms
    assert_eq!(quota_denied(&decide(backend, &three).await), (5, 900));
    assert_eq!(allowed(&decide(backend, &two).await), (0, 900));
    assert_eq!(quota_denied(&decide(backend, &one).await), (5, 900));
}

/// A cost of zero, or above the limit (which no wait could make fit), is a typed error when
/// the check is built, never a denial telling the client to retry; the rejected checks never
/// reach the backend, which still grants the whole limit afterwards.
///
/// L = 4, W = 1,000 ms.
pub async fn costs_outside_one_to_the_limit_are_rejected_when_the_check_is_built<
    B: QuotaBackend<Policy = FixedWindowPolicy>,
>(
    backend: &mut B,
) {
    let policy = fixed_window("fw.cost.range", 4, 1_000);
    let capacity = policy.capacity();
    assert_eq!(Check::new(subject(1).bind(&policy)).with_cost(0).unwrap_err(), CostError::Zero);
    assert_eq!(
        Check::new(subject(1).bind(&policy)).with_cost(5).unwrap_err(),
        CostError::ExceedsCapacity { cost: 5, capacity }
    );
    assert_eq!(
        Check::new(subject(1).bind(&policy)).with_cost(u64::MAX).unwrap_err(),
        CostError::ExceedsCapacity { cost: u64::MAX, capacity }
    );
    assert_eq!(allowed(&decide(backend, &costly(&policy, subject(1), 4)).await), (0, 1_000));
}

/// Each member of a batch carries its own cost, and the batch is all-or-nothing: when the
/// second member's cost does not fit, the batch is denied at index 1 and the first member's
/// cost is not taken.
///
/// first: L = 10, second: L = 3, W = 1,000 ms. The second key has 2 used (anchored at 0 ms).
/// At 100 ms the batch [first × 6, second × 2] is denied at index 1 (2 + 2 > 3), retry 900;
/// then a cost of 10 on the first key fits a fresh window, and [first × 1 on another key,
/// second × 1] is allowed: 9 and 0 left.
pub async fn batch_member_whose_cost_does_not_fit_consumes_nothing_from_the_others<
    B: QuotaBackend<Policy = FixedWindowPolicy>,
>(
    backend: &mut B,
) {
    let first = fixed_window("fw.cost.batch.first", 10, 1_000);
    let second = fixed_window("fw.cost.batch.second", 3, 1_000);
    assert_eq!(allowed(&decide(backend, &costly(&second, subject(2), 2)).await), (1, 1_000));
    backend.advance(100).await;
    let batch = [costly(&first, subject(1), 6), costly(&second, subject(2), 2)];
    assert_eq!(batch_denied(&decide_all(backend, &batch).await), (1, 2, quota_denial(3, 900)));
    assert_eq!(allowed(&decide(backend, &costly(&first, subject(1), 10)).await), (0, 1_000));
    let fits = [check(&first, subject(3)), check(&second, subject(2))];
    assert_eq!(batch_allowed(&decide_all(backend, &fits).await), [(9, 1_000), (0, 900)]);
}

/// In shadow mode a cost that does not fit is shadow-denied: the request is permitted, the
/// denial is what enforcement would answer, and nothing is consumed, so a cost that fits what
/// is left is still allowed afterwards, alone or in a batch.
///
/// L = 5, W = 1,000 ms, 3 used at 0 ms. At 250 ms a cost of 3 is shadow-denied (retry 750), a
/// shadow batch [other key × 1, this key × 3] too (at index 1, consuming neither), then a cost
/// of 2 is allowed with 0 left.
pub async fn shadow_cost_that_does_not_fit_admits_and_consumes_nothing<
    B: QuotaBackend<Policy = FixedWindowPolicy>,
>(
    backend: &mut B,
) {
    let policy = fixed_window("fw.cost.shadow", 5, 1_000).with_quota_mode(QuotaMode::Shadow);
    assert_eq!(allowed(&decide(backend, &costly(&policy, subject(1), 3)).await), (2, 1_000));
    backend.advance(250).await;
    assert_eq!(shadow_denied(&decide(backend, &costly(&policy, subject(1), 3)).await), (5, 750));
    let batch = [check(&policy, subject(2)), costly(&policy, subject(1), 3)];
    assert_eq!(batch_shadow_denied(&decide_all(backend, &batch).await), (1, 2, 5, 750));
    assert_eq!(allowed(&decide(backend, &costly(&policy, subject(1), 2)).await), (0, 750));
    assert_eq!(allowed(&decide(backend, &check(&policy, subject(2))).await), (4, 1_000));
}

/// A cost of [`MAX_LIMIT`] on a policy of limit `MAX_LIMIT` and window
/// [`MAX_WINDOW`]` = W` ms never overflows: it takes the whole window at once, and a check of
/// cost 1 is then denied until the deadline. A cost of `MAX_LIMIT − 1` leaves exactly 1.
///
/// At 0 ms: cost L → 0 left, W to replenish. At 1,000 ms: cost 1 → denied, retry W − 1,000.
/// Another key, anchored at 1,000 ms: cost L − 1 → 1 left; cost 1 → 0 left; cost L → denied,
/// retry W.
pub async fn cost_of_max_limit_on_a_max_limit_policy<B: QuotaBackend<Policy = FixedWindowPolicy>>(
    backend: &mut B,
) {
    let w = MAX_WINDOW_MILLIS;
    let policy = fixed_window("fw.cost.max", MAX_LIMIT, w);
    assert_eq!(policy.window().duration(), MAX_WINDOW);
    assert_eq!(
        allowed_with_capacity(&decide(backend, &costly(&policy, subject(1), MAX_LIMIT)).await),
        (MAX_LIMIT, 0, w)
    );
    backend.advance(1_000).await;
    assert_eq!(quota_denied(&decide(backend, &check(&policy, subject(1))).await), (MAX_LIMIT, w - 1_000));
    assert_eq!(allowed(&decide(backend, &costly(&policy, subject(2), MAX_LIMIT - 1)).await), (1, w));
    assert_eq!(allowed(&decide(backend, &check(&policy, subject(2))).await), (0, w));
    assert_eq!(quota_denied(&decide(backend, &costly(&policy, subject(2), MAX_LIMIT)).await), (MAX_LIMIT, w));
}

/// A peek reports the window exactly (available `L − u`, the next unit and full
/// replenishment both at the window's end, `None` for the next unit of a full quota), answers
/// whether a cost would be allowed, and consumes nothing however often it runs.
///
/// L = 5, W = 1,000 ms. Fresh: (5, none, 0). A cost of 2 anchors at 100 ms (deadline 1,100);
/// at 300 ms three peeks read (3, 800, 800): a cost of 3 would be allowed, 4 not. The check of
/// cost 3 is then allowed with 0 left (the peeks took nothing); a peek reads (0, 800, 800). At
/// 1,100 ms the window is over: full again.
pub async fn peek_reports_the_window_without_consuming_anything<
    B: QuotaBackend<Policy = FixedWindowPolicy>,
>(
    backend: &mut B,
) {
    let policy = fixed_window("fw.peek", 5, 1_000);
    let key = subject(1);
    let subject = key.bind(&policy);
    let fresh = peek(backend, subject).await;
    assert_eq!((snapshot(&fresh), fresh.capacity().get(), fresh.is_full()), ((5, None, 0), 5, true));
    backend.advance(100).await;
    assert_eq!(allowed(&decide(backend, &costly(&policy, key, 2)).await), (3, 1_000));
    backend.advance(200).await; // 300 ms
    for _ in 0..3 {
        let read = peek(backend, subject).await;
        assert_eq!(snapshot(&read), (3, Some(800), 800));
        assert_eq!((read.would_allow(3), read.would_allow(4), read.would_allow(0)), (true, false, false));
    }
    assert_eq!(allowed(&decide(backend, &costly(&policy, key, 3)).await), (0, 800));
    assert_eq!(snapshot(&peek(backend, subject).await), (0, Some(800), 800));
    backend.advance(800).await; // 1,100 ms: the deadline
    assert_eq!(snapshot(&peek(backend, subject).await), (5, None, 0));
}

/// A peek of a subject without state creates none: on a full shard it still answers (a full
/// quota), and a peek of a new key on a shard with one free slot leaves the slot free.
///
/// Shard of 1 key; L = 2, W = 1,000 ms. Peeking `a` first leaves room for `b`, which anchors at
/// 0 ms; then `a` is still a fresh subject to a peek, and its check is a storage denial.
pub async fn peek_never_creates_state_or_takes_a_slot<B: QuotaBackend<Policy = FixedWindowPolicy>>(
    backend: &mut B,
) {
    backend.bounded(1).await;
    let policy = fixed_window("fw.peek.slot", 2, 1_000);
    let keys = backend.subjects_in_one_shard(2);
    let (a, b) = (keys[0].bind(&policy), keys[1].bind(&policy));
    assert_eq!(snapshot(&peek(backend, a).await), (2, None, 0));
    assert_eq!(allowed(&decide(backend, &check(&policy, keys[1])).await), (1, 1_000));
    assert_eq!(snapshot(&peek(backend, a).await), (2, None, 0));
    assert_eq!(snapshot(&peek(backend, b).await), (1, Some(1_000), 1_000));
    assert_eq!(storage_denied(&decide(backend, &check(&policy, keys[0])).await), storage_retry::<B>(1_000));
}

/// A reset removes the subject's state and says whether there was any: the next check
/// anchors a fresh window at its own time with the whole limit, and the freed slot admits a
/// new key on a full shard. A second reset, or a reset of an expired window, finds nothing.
///
/// Shard of 1 key; L = 3, W = 1,000 ms. `a` spends 3 at 0 ms; `b` is refused a slot. At 200 ms
/// `a` is reset (true, then false); `b` now anchors (2 left, deadline 1,200) and `a` is refused.
/// Reset `b` at 300 ms (true); `a` anchors a fresh window at 300 ms: 2 left, 1,000 ms. At
/// 1,300 ms `a`'s window is over: its reset finds no live state (false).
pub async fn reset_clears_the_state_and_frees_the_slot<B: QuotaBackend<Policy = FixedWindowPolicy>>(
    backend: &mut B,
) {
    backend.bounded(1).await;
    let policy = fixed_window("fw.reset", 3, 1_000);
    let keys = backend.subjects_in_one_shard(2);
    let (a, b) = (keys[0].bind(&policy), keys[1].bind(&policy));
    assert_eq!(allowed(&decide(backend, &costly(&policy, keys[0], 3)).await), (0, 1_000));
    assert_eq!(storage_denied(&decide(backend, &check(&policy, keys[1])).await), storage_retry::<B>(1_000));
    backend.advance(200).await;
    assert!(reset(backend, a).await, "a held live state");
    assert!(!reset(backend, a).await, "nothing left to reset");
    assert_eq!(snapshot(&peek(backend, a).await), (3, None, 0));
    assert_eq!(allowed(&decide(backend, &check(&policy, keys[1])).await), (2, 1_000));
    assert_eq!(storage_denied(&decide(backend, &check(&policy, keys[0])).await), storage_retry::<B>(1_000));
    backend.advance(100).await; // 300 ms
    assert!(reset(backend, b).await);
    assert_eq!(allowed(&decide(backend, &check(&policy, keys[0])).await), (2, 1_000));
    backend.advance(1_000).await; // 1,300 ms: a's window ended
    assert!(!reset(backend, a).await, "an expired window is no live state");
    assert_eq!(allowed(&decide(backend, &check(&policy, keys[1])).await), (2, 1_000), "the slot is free");
}

/// Quota mode is not part of the storage key, so a reset through the shadow twin of a policy
/// clears the counter the enforced policy uses, and a reset of one policy leaves another
/// policy's counter for the same subject alone.
///
/// L = 1, W = 1,000 ms for both policies; both exhausted at 0 ms.
pub async fn reset_through_a_shadow_policy_clears_the_shared_counter<
    B: QuotaBackend<Policy = FixedWindowPolicy>,
>(
    backend: &mut B,
) {
    let enforced = fixed_window("fw.reset.shared", 1, 1_000);
    let shadow = enforced.clone().with_quota_mode(QuotaMode::Shadow);
    let other = fixed_window("fw.reset.other", 1, 1_000);
    assert_eq!(allowed(&decide(backend, &check(&enforced, subject(1))).await), (0, 1_000));
    assert_eq!(allowed(&decide(backend, &check(&other, subject(1))).await), (0, 1_000));
    assert!(reset(backend, subject(1).bind(&shadow)).await);
    assert_eq!(allowed(&decide(backend, &check(&enforced, subject(1))).await), (0, 1_000));
    assert_eq!(quota_denied(&decide(backend, &check(&other, subject(1))).await), (1, 1_000));
}

/// An observer that panics with a payload whose own `Drop` panics changes no result: every
/// check, batch and reset returns exactly what it would without an observer, nothing unwinds
/// into the caller, and the observer received one observation per operation.
///
/// L = 2, W = 1,000 ms. At 0 ms: 1 left; at 100 ms: 0 left (900 ms to the deadline), then
/// denied with 900 ms; a batch of `a` and a fresh key `b` is denied at index 0 and consumes
/// nothing (`b` then has 1 left); a reset of `a` finds state, after which `a` anchors anew.
pub async fn a_hostile_observer_changes_no_result<B: QuotaBackend<Policy = FixedWindowPolicy>>(
    backend: &mut B,
) {
    let observer = Arc::new(HostileObserver::default());
    backend.observed(observer.clone()).await;
    let policy = fixed_window("fw.hostile", 2, 1_000);
    assert_eq!(allowed(&decide(backend, &check(&policy, subject(1))).await), (1, 1_000));
    backend.advance(100).await;
    assert_eq!(allowed(&decide(backend, &check(&policy, subject(1))).await), (0, 900));
    assert_eq!(quota_denied(&decide(backend, &check(&policy, subject(1))).await), (2, 900));
    let batch = [check(&policy, subject(1)), check(&policy, subject(2))];
    assert_eq!(batch_denied(&decide_all(backend, &batch).await), (0, 2, quota_denial(2, 900)));
    assert_eq!(allowed(&decide(backend, &check(&policy, subject(2))).await), (1, 1_000));
    assert!(reset(backend, subject(1).bind(&policy)).await);
    assert_eq!(allowed(&decide(backend, &check(&policy, subject(1))).await), (1, 1_000));
    assert_eq!(observer.calls(), 7, "one observation per check, batch and reset");
}
