//! Attempt limiting: one active attempt per subject, exponential backoff after failures,
//! lease expiry as a failure, quiet expiry and storage bounds.
//!
//! Every scenario is generic over an [`AttemptBackend`], starts at 0 ms on a fresh backend and
//! asserts exact values. Subjects are derived with
//! [`KeyHasher::hash_attempt_for`](runlimit_core::KeyHasher::hash_attempt_for) from
//! [`hasher`]. Unless a scenario says otherwise, the policy
//! is [`standard_policy`]: initial delay 100 ms, cap 1,000 ms, quiet period 5,000 ms, lease
//! 50 ms, so the retry delay after `f` failures is 100 · 2^(f−1) ms capped at 1,000
//! (100, 200, 400, 800, 1,000, ...), measured from the failure.
//!
//! The state machine is [`runlimit_core::backend::attempts`]: a lease whose deadline has
//! passed is a failure at its deadline; failure state without a lease expires `quiet` after
//! the latest failure, leased state `quiet` after the lease deadline.

use runlimit_core::attempts::{AttemptCompletionResult, AttemptOutcome, AttemptPolicy};

use crate::{
    AttemptBackend,
    support::{
        HostileObserver, admit, attempt_policy, attempt_storage_denial, backoff, deny, failure_recorded,
        hasher, in_progress,
    },
};

/// The scenario list: one name per `pub async fn` of this module (a unit test checks it).
#[doc(hidden)]
#[macro_export]
macro_rules! __attempt_scenario_names {
    ($($args:tt)*) => {
        $crate::__scenarios! { $($args)* [
            backoff_doubles_from_the_initial_delay_up_to_the_cap
            one_active_attempt_per_subject
            abandoned_counts_like_a_failure
            expired_lease_is_a_failure_at_its_deadline
            late_completion_after_lease_expiry_is_stale_and_records_nothing
            stale_receipt_cannot_complete_a_newer_reservation
            success_resets_the_backoff
            quiet_expiry_forgets_failure_state
            quiet_expiry_never_erases_an_active_lease
            subjects_and_policies_are_independent
            full_shard_denies_a_new_subject_and_never_evicts_live_state
            reset_forgets_failures_and_frees_the_slot
            reset_keeps_a_live_lease_and_its_receipt_completes_normally
            reset_without_live_state_reports_none
            a_hostile_observer_changes_no_result
        ] }
    };
}

crate::__attempt_scenario_names! { @names }

/// The policy most scenarios use: `auth.password` / `identity`, initial delay 100 ms, cap
/// 1,000 ms, quiet period 5,000 ms, lease 50 ms.
#[must_use]
pub fn standard_policy() -> AttemptPolicy {
    attempt_policy("auth.password", "identity", 100, 1_000, 5_000, 50)
}

/// The retry delay doubles from the initial delay with every consecutive failure and stops
/// at the cap: 100, 200, 400, 800, then 1,000 ms (three times). Each failure reports its count
/// and delay; the subject is denied with `Backoff` until exactly that delay after the failure
/// (1 ms before: 1 ms left), then admitted.
pub async fn backoff_doubles_from_the_initial_delay_up_to_the_cap<B: AttemptBackend>(backend: &mut B) {
    let policy = standard_policy();
    let subject = hasher().hash_attempt_for(&policy, b"user@example.test");
    for (failures, delay) in (1..).zip([100, 200, 400, 800, 1_000, 1_000, 1_000]) {
        let receipt = admit(backend, &subject).await;
        backend.advance(10).await;
        assert_eq!(
            backend.complete(receipt, AttemptOutcome::Failure).await,
            failure_recorded(failures, delay),
            "failure {failures}"
        );
        assert_eq!(deny(backend, &subject).await, backoff(failures, delay), "failure {failures}");
        backend.advance(delay - 1).await;
        assert_eq!(deny(backend, &subject).await, backoff(failures, 1), "failure {failures}, 1 ms early");
        backend.advance(1).await;
    }
    let receipt = admit(backend, &subject).await;
    assert_eq!(backend.complete(receipt, AttemptOutcome::Failure).await, failure_recorded(8, 1_000));
}

/// At most one attempt per subject is active: while a lease is live, another acquire is
/// denied with `InProgress` and the exact time to the lease deadline; completing the lease
/// (here, a success 1 ms before its deadline) lets the next attempt in immediately.
///
/// Lease 50 ms, admitted at 0: 30 ms left at 20 ms, 1 ms left at 49 ms.
pub async fn one_active_attempt_per_subject<B: AttemptBackend>(backend: &mut B) {
    let policy = standard_policy();
    let subject = hasher().hash_attempt_for(&policy, b"user@example.test");
    let receipt = admit(backend, &subject).await;
    backend.advance(20).await;
    assert_eq!(deny(backend, &subject).await, in_progress(30));
    backend.advance(29).await;
    assert_eq!(deny(backend, &subject).await, in_progress(1));
    assert_eq!(backend.complete(receipt, AttemptOutcome::Success).await, AttemptCompletionResult::Reset);
    let receipt = admit(backend, &subject).await;
    assert_eq!(deny(backend, &subject).await, in_progress(50));
    assert_eq!(backend.complete(receipt, AttemptOutcome::Success).await, AttemptCompletionResult::Reset);
}

/// Abandoning an attempt counts exactly like a failure: it increments the same consecutive
/// count and starts the same backoff, so abandoning never refunds an admission.
///
/// Abandoned at 0 (1, 100 ms), abandoned at 100 (2, 200 ms), failed at 300 (3, 400 ms).
pub async fn abandoned_counts_like_a_failure<B: AttemptBackend>(backend: &mut B) {
    let policy = standard_policy();
    let subject = hasher().hash_attempt_for(&policy, b"user@example.test");
    let receipt = admit(backend, &subject).await;
    assert_eq!(backend.complete(receipt, AttemptOutcome::Abandoned).await, failure_recorded(1, 100));
    assert_eq!(deny(backend, &subject).await, backoff(1, 100));
    backend.advance(100).await;
    let receipt = admit(backend, &subject).await;
    assert_eq!(backend.complete(receipt, AttemptOutcome::Abandoned).await, failure_recorded(2, 200));
    assert_eq!(deny(backend, &subject).await, backoff(2, 200));
    backend.advance(200).await;
    let receipt = admit(backend, &subject).await;
    assert_eq!(backend.complete(receipt, AttemptOutcome::Failure).await, failure_recorded(3, 400));
}

/// Dropping a receipt is no refund: its lease expires as a failure at the lease deadline, and
/// the backoff it causes is measured from the deadline, not from when the subject is next
/// seen.
///
/// Admitted at 1,000 and dropped (deadline 1,050): in progress at 1,049 (1 ms left); at
/// 1,060 failure 1 at 1,050 → backoff until 1,150 (90 ms left). Admitted at 1,150 and dropped
/// (deadline 1,200): in progress at 1,199; at exactly 1,200 failure 2 → 200 ms of backoff,
/// 1 ms left at 1,399; admitted at 1,400, and a failure then is the third (400 ms).
pub async fn expired_lease_is_a_failure_at_its_deadline<B: AttemptBackend>(backend: &mut B) {
    let policy = standard_policy();
    let subject = hasher().hash_attempt_for(&policy, b"user@example.test");
    backend.advance(1_000).await;
    drop(admit(backend, &subject).await);
    backend.advance(49).await; // 1,049
    assert_eq!(deny(backend, &subject).await, in_progress(1));
    backend.advance(11).await; // 1,060
    assert_eq!(deny(backend, &subject).await, backoff(1, 90));
    backend.advance(90).await; // 1,150
    drop(admit(backend, &subject).await);
    backend.advance(49).await; // 1,199
    assert_eq!(deny(backend, &subject).await, in_progress(1));
    backend.advance(1).await; // 1,200: the deadline
    assert_eq!(deny(backend, &subject).await, backoff(2, 200));
    backend.advance(199).await; // 1,399
    assert_eq!(deny(backend, &subject).await, backoff(2, 1));
    backend.advance(1).await; // 1,400
    let receipt = admit(backend, &subject).await;
    assert_eq!(backend.complete(receipt, AttemptOutcome::Failure).await, failure_recorded(3, 400));
}

/// A completion after the receipt's lease expired is `Stale` and records nothing: a late
/// success does not reset the failure the expired lease became, and a late failure is not
/// counted a second time.
///
/// Admitted at 0 (deadline 50); success at 60 → stale; failure 1 at 50 → 90 ms left at 60.
/// Admitted at 150 (deadline 200); failure at 210 → stale; failure 2 at 200 → backoff until
/// 400, 190 ms left at 210 (a recorded late failure would have made it the third).
pub async fn late_completion_after_lease_expiry_is_stale_and_records_nothing<B: AttemptBackend>(
    backend: &mut B,
) {
    let policy = standard_policy();
    let subject = hasher().hash_attempt_for(&policy, b"user@example.test");
    let receipt = admit(backend, &subject).await;
    backend.advance(60).await;
    assert_eq!(backend.complete(receipt, AttemptOutcome::Success).await, AttemptCompletionResult::Stale);
    assert_eq!(deny(backend, &subject).await, backoff(1, 90));
    backend.advance(90).await; // 150
    let receipt = admit(backend, &subject).await;
    backend.advance(60).await; // 210
    assert_eq!(backend.complete(receipt, AttemptOutcome::Failure).await, AttemptCompletionResult::Stale);
    assert_eq!(deny(backend, &subject).await, backoff(2, 190));
}

/// A receipt whose lease expired cannot complete a newer reservation of the same subject:
/// its success is `Stale`, the newer lease stays active, and the expired lease's failure
/// still counts.
///
/// Old lease at 0 (deadline 50, failure 1 at 50, backoff until 150); newer lease at 150
/// (deadline 200): the old success is stale, the subject is in progress for 50 ms, and the
/// newer failure is the second (200 ms). A lease completed exactly at its deadline has
/// expired too: admitted at 350 (deadline 400), its success at 400 is stale, and the lease is
/// the third failure, at 400 (400 ms of backoff left).
pub async fn stale_receipt_cannot_complete_a_newer_reservation<B: AttemptBackend>(backend: &mut B) {
    let policy = standard_policy();
    let subject = hasher().hash_attempt_for(&policy, b"user@example.test");
    let old = admit(backend, &subject).await;
    backend.advance(150).await;
    let newer = admit(backend, &subject).await;
    assert_eq!(backend.complete(old, AttemptOutcome::Success).await, AttemptCompletionResult::Stale);
    assert_eq!(deny(backend, &subject).await, in_progress(50));
    assert_eq!(backend.complete(newer, AttemptOutcome::Failure).await, failure_recorded(2, 200));
    assert_eq!(deny(backend, &subject).await, backoff(2, 200));
    backend.advance(200).await; // 350
    let late = admit(backend, &subject).await;
    backend.advance(50).await; // 400: the lease deadline
    assert_eq!(backend.complete(late, AttemptOutcome::Success).await, AttemptCompletionResult::Stale);
    assert_eq!(deny(backend, &subject).await, backoff(3, 400));
}

/// A full success resets the subject: after three failures, a success is `Reset`, the next
/// attempt is admitted at once, and the next failure is the first again (100 ms).
///
/// Failures at 0 (100 ms), 100 (200 ms) and 300 (400 ms); success at 700.
pub async fn success_resets_the_backoff<B: AttemptBackend>(backend: &mut B) {
    let policy = standard_policy();
    let subject = hasher().hash_attempt_for(&policy, b"user@example.test");
    for (failures, delay) in [(1, 100), (2, 200), (3, 400)] {
        let receipt = admit(backend, &subject).await;
        assert_eq!(
            backend.complete(receipt, AttemptOutcome::Failure).await,
            failure_recorded(failures, delay)
        );
        backend.advance(delay).await;
    }
    let receipt = admit(backend, &subject).await;
    assert_eq!(backend.complete(receipt, AttemptOutcome::Success).await, AttemptCompletionResult::Reset);
    let receipt = admit(backend, &subject).await;
    assert_eq!(backend.complete(receipt, AttemptOutcome::Failure).await, failure_recorded(1, 100));
    assert_eq!(deny(backend, &subject).await, backoff(1, 100));
}

/// Failure state without a lease is forgotten exactly one quiet period (5,000 ms) after the
/// latest failure, not a millisecond before.
///
/// Failures at 0, 100 and 300 (the third at 300: quiet expiry at 5,300). At 5,299 the count
/// is still 3: the next failure is the fourth (800 ms), at 5,299, so the state now expires at
/// 10,299. At exactly 10,299 it is forgotten: the next failure is the first again (100 ms).
pub async fn quiet_expiry_forgets_failure_state<B: AttemptBackend>(backend: &mut B) {
    let policy = standard_policy();
    let subject = hasher().hash_attempt_for(&policy, b"user@example.test");
    for (failures, delay) in [(1, 100), (2, 200), (3, 400)] {
        let receipt = admit(backend, &subject).await;
        assert_eq!(
            backend.complete(receipt, AttemptOutcome::Failure).await,
            failure_recorded(failures, delay)
        );
        backend.advance(delay).await;
    }
    backend.advance(4_599).await; // 5,299
    let receipt = admit(backend, &subject).await;
    assert_eq!(backend.complete(receipt, AttemptOutcome::Failure).await, failure_recorded(4, 800));
    backend.advance(5_000).await; // 10,299
    let receipt = admit(backend, &subject).await;
    assert_eq!(backend.complete(receipt, AttemptOutcome::Failure).await, failure_recorded(1, 100));
}

/// Quiet expiry never erases an active lease, even a lease much longer than the quiet
/// period: the leased state lives until the lease deadline plus the quiet period, keeps its
/// failure count and its storage slot.
///
/// Policy: initial 100 ms, cap 100 ms, quiet 200 ms, lease 10,000 ms, on a shard of 1
/// subject. `a` fails at 0 (1, 100 ms) and is admitted at 100 (deadline 10,100; state expiry
/// 10,300). At 5,000 `a` is in progress for 5,100 ms and the new subject `b` is refused with
/// 5,300 ms to the shard's earliest expiry. At 10,099 `a` fails: its second failure (the
/// count survived), state expiry 10,299, 200 ms away for `b`; at 10,299 `b` is admitted. After
/// `b`'s success, `b` is admitted again (deadline 20,299): in progress 1 ms before the deadline,
/// and its failure then is its first.
pub async fn quiet_expiry_never_erases_an_active_lease<B: AttemptBackend>(backend: &mut B) {
    backend.bounded(1).await;
    let policy = attempt_policy("auth.password", "long-lease", 100, 100, 200, 10_000);
    let hasher = hasher();
    let subjects = backend.subjects_in_one_shard(&hasher, &policy, 2);
    let a = hasher.hash_attempt_for(&policy, &subjects[0]);
    let b = hasher.hash_attempt_for(&policy, &subjects[1]);
    let receipt = admit(backend, &a).await;
    assert_eq!(backend.complete(receipt, AttemptOutcome::Failure).await, failure_recorded(1, 100));
    backend.advance(100).await;
    let receipt = admit(backend, &a).await;
    backend.advance(4_900).await; // 5,000
    assert_eq!(deny(backend, &a).await, in_progress(5_100));
    assert_eq!(deny(backend, &b).await, attempt_storage_denial(5_300));
    backend.advance(5_099).await; // 10,099
    assert_eq!(deny(backend, &a).await, in_progress(1));
    assert_eq!(backend.complete(receipt, AttemptOutcome::Failure).await, failure_recorded(2, 100));
    assert_eq!(deny(backend, &b).await, attempt_storage_denial(200));
    backend.advance(200).await; // 10,299
    let receipt = admit(backend, &b).await;
    assert_eq!(backend.complete(receipt, AttemptOutcome::Success).await, AttemptCompletionResult::Reset);
    let receipt = admit(backend, &b).await;
    backend.advance(9_999).await; // 20,298
    assert_eq!(deny(backend, &b).await, in_progress(1));
    assert_eq!(backend.complete(receipt, AttemptOutcome::Failure).await, failure_recorded(1, 100));
}

/// Different subjects, and the same subject under policies differing in any parameter (id,
/// scope, initial delay, cap, quiet period, lease: all fingerprinted), are independent: each
/// is admitted while `alice` under the standard policy is in progress or backing off, and its
/// first failure is its own first (its own initial delay).
pub async fn subjects_and_policies_are_independent<B: AttemptBackend>(backend: &mut B) {
    let policy = standard_policy();
    let hasher = hasher();
    let alice = hasher.hash_attempt_for(&policy, b"alice");
    let bob = hasher.hash_attempt_for(&policy, b"bob");
    let variants = [
        (attempt_policy("auth.password2", "identity", 100, 1_000, 5_000, 50), 100),
        (attempt_policy("auth.password", "client", 100, 1_000, 5_000, 50), 100),
        (attempt_policy("auth.password", "identity", 200, 1_000, 5_000, 50), 200),
        (attempt_policy("auth.password", "identity", 100, 2_000, 5_000, 50), 100),
        (attempt_policy("auth.password", "identity", 100, 1_000, 6_000, 50), 100),
        (attempt_policy("auth.password", "identity", 100, 1_000, 5_000, 60), 100),
    ];
    let held = admit(backend, &alice).await;
    let bobs = admit(backend, &bob).await;
    assert_eq!(deny(backend, &alice).await, in_progress(50));
    for (variant, initial) in &variants {
        let subject = hasher.hash_attempt_for(variant, b"alice");
        let receipt = admit(backend, &subject).await;
        assert_eq!(
            backend.complete(receipt, AttemptOutcome::Failure).await,
            failure_recorded(1, *initial),
            "{variant:?}"
        );
    }
    assert_eq!(backend.complete(held, AttemptOutcome::Failure).await, failure_recorded(1, 100));
    assert_eq!(backend.complete(bobs, AttemptOutcome::Success).await, AttemptCompletionResult::Reset);
    assert_eq!(deny(backend, &alice).await, backoff(1, 100));
    let receipt = admit(backend, &bob).await;
    assert_eq!(backend.complete(receipt, AttemptOutcome::Failure).await, failure_recorded(1, 100));
    for (variant, initial) in &variants {
        let subject = hasher.hash_attempt_for(variant, b"alice");
        assert_eq!(deny(backend, &subject).await, backoff(1, *initial), "{variant:?}");
    }
}

/// A full shard denies a subject without state with `AttemptDenial::StorageCapacity`, whose
/// `retry_after` is the time until the shard's earliest expiry, and never evicts live state
/// (an active lease, failure state in backoff, failure state after its backoff).
///
/// Shard of 2 subjects, standard policy. `a` admitted at 0 (deadline 50, failure 1 at 50,
/// state expiry 5,050); `b` admitted at 0 and failed at 10 (state expiry 5,010). `c` waits
/// 5,000 ms at 10 (while `a` is in progress for 40 ms and `b` backs off for 100), 1 ms at
/// 5,009, and is admitted at 5,010 once `b` expired. `a`'s receipt is stale, and `a`'s failure
/// still counts: its next failure (at 5,010) is the second (200 ms; state expiry 10,010).
/// `b`, a new subject again, then waits for `a`'s expiry: 5,000 ms.
pub async fn full_shard_denies_a_new_subject_and_never_evicts_live_state<B: AttemptBackend>(backend: &mut B) {
    backend.bounded(2).await;
    let policy = standard_policy();
    let hasher = hasher();
    let subjects = backend.subjects_in_one_shard(&hasher, &policy, 3);
    let a = hasher.hash_attempt_for(&policy, &subjects[0]);
    let b = hasher.hash_attempt_for(&policy, &subjects[1]);
    let c = hasher.hash_attempt_for(&policy, &subjects[2]);
    let held = admit(backend, &a).await;
    let failed = admit(backend, &b).await;
    backend.advance(10).await;
    assert_eq!(backend.complete(failed, AttemptOutcome::Failure).await, failure_recorded(1, 100));
    assert_eq!(deny(backend, &c).await, attempt_storage_denial(5_000));
    assert_eq!(deny(backend, &a).await, in_progress(40), "a's lease is kept");
    assert_eq!(deny(backend, &b).await, backoff(1, 100), "b's failure is kept");
    backend.advance(4_999).await; // 5,009
    assert_eq!(deny(backend, &c).await, attempt_storage_denial(1));
    backend.advance(1).await; // 5,010
    let newcomer = admit(backend, &c).await;
    assert_eq!(backend.complete(held, AttemptOutcome::Success).await, AttemptCompletionResult::Stale);
    let receipt = admit(backend, &a).await;
    assert_eq!(backend.complete(receipt, AttemptOutcome::Failure).await, failure_recorded(2, 200));
    assert_eq!(deny(backend, &b).await, attempt_storage_denial(5_000));
    assert_eq!(backend.complete(newcomer, AttemptOutcome::Success).await, AttemptCompletionResult::Reset);
}

/// An operator's reset forgets the subject's failures and backoff (the next attempt is
/// admitted at once, and its failure counts from 1 again) and frees the subject's slot.
///
/// Shard of 1 subject, standard policy. `a` fails at 10 ms and at 120 ms (backoff 200 ms);
/// `b` is refused a slot until `a` expires at 120 + 5,000. Reset `a` at 120 ms (true, then
/// false): `b` is admitted and succeeds, then `a` is admitted at once and its failure at 130 ms
/// is the first (100 ms).
pub async fn reset_forgets_failures_and_frees_the_slot<B: AttemptBackend>(backend: &mut B) {
    backend.bounded(1).await;
    let policy = standard_policy();
    let hasher = hasher();
    let subjects = backend.subjects_in_one_shard(&hasher, &policy, 2);
    let a = hasher.hash_attempt_for(&policy, &subjects[0]);
    let b = hasher.hash_attempt_for(&policy, &subjects[1]);
    let receipt = admit(backend, &a).await;
    backend.advance(10).await;
    assert_eq!(backend.complete(receipt, AttemptOutcome::Failure).await, failure_recorded(1, 100));
    backend.advance(100).await; // 110
    let receipt = admit(backend, &a).await;
    backend.advance(10).await; // 120
    assert_eq!(backend.complete(receipt, AttemptOutcome::Failure).await, failure_recorded(2, 200));
    assert_eq!(deny(backend, &a).await, backoff(2, 200));
    assert_eq!(deny(backend, &b).await, attempt_storage_denial(5_000));
    assert!(backend.reset(&a).await, "a held failure state");
    assert!(!backend.reset(&a).await, "nothing left to reset");
    let newcomer = admit(backend, &b).await;
    assert_eq!(backend.complete(newcomer, AttemptOutcome::Success).await, AttemptCompletionResult::Reset);
    let receipt = admit(backend, &a).await;
    backend.advance(10).await; // 130
    assert_eq!(backend.complete(receipt, AttemptOutcome::Failure).await, failure_recorded(1, 100));
}

/// A reset never cancels a live lease: the attempt in flight keeps its reservation (another
/// acquire is still `InProgress`), and its receipt completes normally: a failure counts as
/// the first after the reset, a success removes the state.
///
/// Standard policy (lease 50 ms). `a` fails at 10 ms; at 110 ms it is admitted again (lease to
/// 160). Reset at 120 ms (true): still in progress, 40 ms left; the receipt's failure is the
/// first (100 ms). At 220 ms: admitted, reset (true), the receipt's success resets, and the
/// subject is admitted again at once.
pub async fn reset_keeps_a_live_lease_and_its_receipt_completes_normally<B: AttemptBackend>(backend: &mut B) {
    let policy = standard_policy();
    let a = hasher().hash_attempt_for(&policy, b"locked-out@example.test");
    let receipt = admit(backend, &a).await;
    backend.advance(10).await;
    assert_eq!(backend.complete(receipt, AttemptOutcome::Failure).await, failure_recorded(1, 100));
    backend.advance(100).await; // 110
    let in_flight = admit(backend, &a).await;
    backend.advance(10).await; // 120
    assert!(backend.reset(&a).await);
    assert_eq!(deny(backend, &a).await, in_progress(40), "the lease is kept");
    assert_eq!(backend.complete(in_flight, AttemptOutcome::Failure).await, failure_recorded(1, 100));
    assert_eq!(deny(backend, &a).await, backoff(1, 100));
    backend.advance(100).await; // 220
    let in_flight = admit(backend, &a).await;
    assert!(backend.reset(&a).await, "a live lease is live state");
    assert_eq!(backend.complete(in_flight, AttemptOutcome::Success).await, AttemptCompletionResult::Reset);
    let receipt = admit(backend, &a).await;
    assert_eq!(backend.complete(receipt, AttemptOutcome::Abandoned).await, failure_recorded(1, 100));
}

/// A subject that was never seen, or whose failure state outlived its quiet period, has no
/// live state to reset.
///
/// Standard policy: a failure at 10 ms expires at 5,010 ms.
pub async fn reset_without_live_state_reports_none<B: AttemptBackend>(backend: &mut B) {
    let policy = standard_policy();
    let a = hasher().hash_attempt_for(&policy, b"quiet@example.test");
    assert!(!backend.reset(&a).await, "never seen");
    let receipt = admit(backend, &a).await;
    backend.advance(10).await;
    assert_eq!(backend.complete(receipt, AttemptOutcome::Failure).await, failure_recorded(1, 100));
    backend.advance(5_000).await; // 5,010: expired
    assert!(!backend.reset(&a).await, "quiet state is no live state");
    let receipt = admit(backend, &a).await;
    backend.advance(10).await;
    assert_eq!(backend.complete(receipt, AttemptOutcome::Failure).await, failure_recorded(1, 100));
}

/// An observer that panics with a payload whose own `Drop` panics changes no result: every
/// acquire, completion and reset returns exactly what it would without an observer, nothing
/// unwinds into the caller, and the observer received one observation per operation.
///
/// Standard policy: `a` admitted at 0 ms and failed at 10 ms (first failure, 100 ms backoff),
/// denied at once with the whole 100 ms; a reset finds state; `a` is admitted again and its
/// success resets the (already clear) state.
pub async fn a_hostile_observer_changes_no_result<B: AttemptBackend>(backend: &mut B) {
    let observer = std::sync::Arc::new(HostileObserver::default());
    backend.observed(observer.clone()).await;
    let policy = standard_policy();
    let a = hasher().hash_attempt_for(&policy, b"hostile-observer@example.test");
    let receipt = admit(backend, &a).await;
    backend.advance(10).await;
    assert_eq!(backend.complete(receipt, AttemptOutcome::Failure).await, failure_recorded(1, 100));
    assert_eq!(deny(backend, &a).await, backoff(1, 100));
    assert!(backend.reset(&a).await);
    let receipt = admit(backend, &a).await;
    assert_eq!(backend.complete(receipt, AttemptOutcome::Success).await, AttemptCompletionResult::Reset);
    assert_eq!(observer.calls(), 6, "one observation per acquire, completion and reset");
}
