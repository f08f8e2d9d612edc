//! The observer seam: exhaustive, low-cardinality admission and cleanup telemetry.

use std::{
    panic::{AssertUnwindSafe, catch_unwind},
    sync::Arc,
    time::Duration,
};

use crate::{
    backend::ShardHeadroom,
    decision::{BatchDecision, BatchDecisionView, Decision, DecisionView, Denial},
    id::{PolicyId, ScopeId},
    policy::{PolicyFingerprint, RateLimitPolicy},
};

/// Receives observations from a backend.
///
/// Callbacks run synchronously after memory locks are released or database transactions are
/// finalized. Keep them fast and hand export work to another thread. An observer cannot change
/// a decision: backends call it through [`backend::notify`](crate::backend::notify), which
/// catches panics.
/// The default method ignores every observation; `()` is the no-op observer.
pub trait Observer: Send + Sync {
    /// Called once per admission, cleanup or reset operation.
    fn observe(&self, observation: &Observation<'_>) {
        let _ = observation;
    }
}

impl Observer for () {}

impl<O: Observer + ?Sized> Observer for Arc<O> {
    fn observe(&self, observation: &Observation<'_>) {
        (**self).observe(observation);
    }
}

impl<O: Observer + ?Sized> Observer for Box<O> {
    fn observe(&self, observation: &Observation<'_>) {
        (**self).observe(observation);
    }
}

impl<O: Observer + ?Sized> Observer for &O {
    fn observe(&self, observation: &Observation<'_>) {
        (**self).observe(observation);
    }
}

/// Delivers `observation` to `observer`, catching a panic so telemetry can never change an
/// admission result. Returns `false` when the observer panicked.
///
/// Isolation is total: the panic's payload is disposed of without unwinding into the caller,
/// even when the payload's own `Drop` panics. A caught payload is dropped inside a second
/// `catch_unwind`; if that drop panics too, the second payload is leaked with
/// [`std::mem::forget`] (one small leak per such observation) rather than dropped.
pub fn notify<O: Observer + ?Sized>(observer: &O, observation: &Observation<'_>) -> bool {
    isolate(|| observer.observe(observation))
}

/// Runs `callback`, catching any panic and disposing of its payload without letting anything
/// unwind into the caller. Returns `false` when `callback` panicked.
///
/// A caught payload is dropped inside a second `catch_unwind`, since a payload may be a value
/// whose `Drop` panics; the payload of that second panic is leaked with
/// [`std::mem::forget`] rather than dropped, so a hostile chain of payloads costs one small
/// leak per observation and can neither unwind into a backend nor loop.
pub(crate) fn isolate(callback: impl FnOnce()) -> bool {
    match catch_unwind(AssertUnwindSafe(callback)) {
        Ok(()) => true,
        Err(payload) => {
            if let Err(second) = catch_unwind(AssertUnwindSafe(move || drop(payload))) {
                std::mem::forget(second);
            }
            false
        }
    }
}

/// Reports an admission to `observer` through [`notify`]: `result` is the admission's
/// outcome, or the [`ConsumptionStatus`] of its failure (observed as
/// [`AdmissionOutcome::Failed`]). An outcome's consumption follows from it: `Consumed` for
/// [`AdmissionOutcome::Allowed`], `NotConsumed` for every other outcome. `headroom` is the
/// occupancy of the touched shard with the least headroom, when the backend knows it.
pub fn observe_admission<O: Observer + ?Sized>(
    observer: &O,
    operation: AdmissionOperation<'_>,
    result: Result<AdmissionOutcome, ConsumptionStatus>,
    elapsed: Duration,
    headroom: Option<ShardHeadroom>,
) {
    let (outcome, consumption) = match result {
        Ok(AdmissionOutcome::Allowed) => (AdmissionOutcome::Allowed, ConsumptionStatus::Consumed),
        Ok(outcome) => (outcome, ConsumptionStatus::NotConsumed),
        Err(consumption) => (AdmissionOutcome::Failed, consumption),
    };
    let mut observation = AdmissionObservation::new(operation, outcome, consumption, elapsed);
    if let Some(headroom) = headroom {
        observation = observation.with_shard_headroom(headroom);
    }
    notify(observer, &Observation::Admission(observation));
}

/// Reports an operator's reset of `policy`'s subject through [`notify`]: `result` is whether
/// live state was removed, or, for a failure, whether state may have been removed anyway.
pub fn observe_reset<O: Observer + ?Sized, P: RateLimitPolicy + ?Sized>(
    observer: &O,
    policy: &P,
    result: Result<bool, bool>,
    elapsed: Duration,
) {
    let outcome = match result {
        Ok(true) => ResetOutcome::Removed,
        Ok(false) => ResetOutcome::NothingStored,
        Err(true) => ResetOutcome::Unknown,
        Err(false) => ResetOutcome::NoEffect,
    };
    notify(
        observer,
        &Observation::Reset(ResetObservation::new(AdmissionPolicy::of(policy), outcome, elapsed)),
    );
}

/// Reports a bounded cleanup pass of at most `maximum` entries through [`notify`]: `result` is
/// the number removed, or, for a failure, whether entries may have been removed anyway.
pub fn observe_cleanup<O: Observer + ?Sized>(
    observer: &O,
    maximum: u64,
    result: Result<u64, bool>,
    elapsed: Duration,
) {
    let outcome = match result {
        Ok(count) => CleanupOutcome::Removed { count },
        Err(true) => CleanupOutcome::Unknown,
        Err(false) => CleanupOutcome::NoEffect,
    };
    notify(observer, &Observation::Cleanup(CleanupObservation::new(outcome, maximum, elapsed)));
}

/// The [`AdmissionOutcome`] of a single check's decision.
#[must_use]
pub fn admission_outcome(decision: &Decision) -> AdmissionOutcome {
    match decision.view() {
        DecisionView::Allowed { .. } => AdmissionOutcome::Allowed,
        DecisionView::ShadowDenied { .. } => AdmissionOutcome::ShadowDenied,
        DecisionView::Denied { denial } => denial_outcome(denial),
    }
}

/// The [`AdmissionOutcome`] of a batch decision.
#[must_use]
pub fn batch_admission_outcome(decision: &BatchDecision) -> AdmissionOutcome {
    match decision.view() {
        BatchDecisionView::Allowed { .. } => AdmissionOutcome::Allowed,
        BatchDecisionView::ShadowDenied { .. } => AdmissionOutcome::ShadowDenied,
        BatchDecisionView::Denied { denial, .. } => denial_outcome(denial),
    }
}

fn denial_outcome(denial: &Denial) -> AdmissionOutcome {
    match denial {
        Denial::QuotaExceeded(_) => AdmissionOutcome::QuotaExceeded,
        Denial::StorageCapacity { .. } => AdmissionOutcome::StorageCapacity,
    }
}

/// One observation. Exhaustive: an observer that maps outcomes to metrics names every
/// variant, so a new kind of observation is a compile error rather than an unmetered arm.
/// Observations never include subject keys, backend error text or other sensitive,
/// high-cardinality values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Observation<'a> {
    /// A check or batch was evaluated (or failed).
    Admission(AdmissionObservation<'a>),
    /// A bounded cleanup pass ran.
    Cleanup(CleanupObservation),
    /// An operator reset one subject's state (see
    /// [`QuotaControl::reset`](crate::QuotaControl::reset)). Never part of an admission.
    Reset(ResetObservation<'a>),
}

/// The policy of an admission: identifier, scope and fingerprint together.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AdmissionPolicy<'a> {
    id: &'a PolicyId,
    scope: &'a ScopeId,
    fingerprint: &'a PolicyFingerprint,
}

impl<'a> AdmissionPolicy<'a> {
    /// Borrows the identity of `policy`.
    #[must_use]
    pub fn of<P: RateLimitPolicy + ?Sized>(policy: &'a P) -> Self {
        Self { id: policy.id(), scope: policy.scope(), fingerprint: policy.fingerprint() }
    }

    /// The policy identifier.
    #[must_use]
    pub fn id(&self) -> &'a PolicyId {
        self.id
    }

    /// The scope.
    #[must_use]
    pub fn scope(&self) -> &'a ScopeId {
        self.scope
    }

    /// The fingerprint.
    #[must_use]
    pub fn fingerprint(&self) -> &'a PolicyFingerprint {
        self.fingerprint
    }
}

/// What was evaluated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AdmissionOperation<'a> {
    /// A single check.
    Check {
        /// Its policy.
        policy: AdmissionPolicy<'a>,
    },
    /// An atomic batch.
    Batch {
        /// Number of checks.
        size: usize,
        /// The policy of the one check the outcome singles out (the denied or shadow-denied
        /// check), when there is one.
        policy: Option<AdmissionPolicy<'a>>,
    },
}

/// How an admission ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AdmissionOutcome {
    /// Allowed.
    Allowed,
    /// Quota exhausted under shadow mode; admitted.
    ShadowDenied,
    /// Quota exhausted under enforcement.
    QuotaExceeded,
    /// Denied because the backend's storage is full.
    StorageCapacity,
    /// A structurally invalid batch, rejected before backend work.
    InvalidBatch,
    /// The backend failed to evaluate.
    Failed,
}

/// Whether an operation consumed quota. Exhaustive.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ConsumptionStatus {
    /// Quota was consumed and the consumption is confirmed (committed).
    Consumed,
    /// Quota was definitely not consumed.
    NotConsumed,
    /// The operation may have consumed quota: its commit outcome is unknown. Never replay it
    /// automatically.
    MayHaveBeenConsumed,
}

/// One admission's telemetry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AdmissionObservation<'a> {
    operation: AdmissionOperation<'a>,
    outcome: AdmissionOutcome,
    consumption: ConsumptionStatus,
    elapsed: Duration,
    shard_headroom: Option<ShardHeadroom>,
}

impl<'a> AdmissionObservation<'a> {
    /// An observation without shard headroom.
    #[must_use]
    pub const fn new(
        operation: AdmissionOperation<'a>,
        outcome: AdmissionOutcome,
        consumption: ConsumptionStatus,
        elapsed: Duration,
    ) -> Self {
        Self { operation, outcome, consumption, elapsed, shard_headroom: None }
    }

    /// Adds the headroom of the shard the operation touched (memory backends).
    #[must_use]
    pub const fn with_shard_headroom(mut self, headroom: ShardHeadroom) -> Self {
        self.shard_headroom = Some(headroom);
        self
    }

    /// What was evaluated.
    #[must_use]
    pub const fn operation(&self) -> AdmissionOperation<'a> {
        self.operation
    }
    /// How it ended.
    #[must_use]
    pub const fn outcome(&self) -> AdmissionOutcome {
        self.outcome
    }
    /// Whether quota was consumed.
    #[must_use]
    pub const fn consumption(&self) -> ConsumptionStatus {
        self.consumption
    }
    /// Wall time the backend spent, from the start of the operation to its result.
    #[must_use]
    pub const fn elapsed(&self) -> Duration {
        self.elapsed
    }
    /// Headroom of the touched shard (the fullest one, for a batch), for memory backends.
    #[must_use]
    pub const fn shard_headroom(&self) -> Option<ShardHeadroom> {
        self.shard_headroom
    }
}

/// How a cleanup pass ended. It never borrows the quota-consumption vocabulary.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CleanupOutcome {
    /// The pass completed and removed exactly `count` expired entries (possibly 0).
    Removed {
        /// Entries removed.
        count: u64,
    },
    /// The pass failed before it could remove anything.
    NoEffect,
    /// The pass failed at a point where some entries may have been removed.
    Unknown,
}

/// One cleanup pass's telemetry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CleanupObservation {
    outcome: CleanupOutcome,
    maximum: u64,
    elapsed: Duration,
}

impl CleanupObservation {
    /// A cleanup observation: its outcome, the requested bound and the elapsed time.
    #[must_use]
    pub const fn new(outcome: CleanupOutcome, maximum: u64, elapsed: Duration) -> Self {
        Self { outcome, maximum, elapsed }
    }
    /// How it ended.
    #[must_use]
    pub const fn outcome(&self) -> CleanupOutcome {
        self.outcome
    }
    /// The most entries the pass was allowed to remove.
    #[must_use]
    pub const fn maximum(&self) -> u64 {
        self.maximum
    }
    /// Wall time spent.
    #[must_use]
    pub const fn elapsed(&self) -> Duration {
        self.elapsed
    }
}

/// How a reset ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ResetOutcome {
    /// The subject held live state, which was removed.
    Removed,
    /// The subject held no live state (any expired leftover was removed).
    NothingStored,
    /// The reset failed before it could remove anything.
    NoEffect,
    /// The reset failed at a point where the state may have been removed (a database commit
    /// whose outcome is unknown).
    Unknown,
}

/// One reset's telemetry: the policy, how it ended and the elapsed time. Never the subject.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ResetObservation<'a> {
    policy: AdmissionPolicy<'a>,
    outcome: ResetOutcome,
    elapsed: Duration,
}

impl<'a> ResetObservation<'a> {
    /// A reset observation.
    #[must_use]
    pub const fn new(policy: AdmissionPolicy<'a>, outcome: ResetOutcome, elapsed: Duration) -> Self {
        Self { policy, outcome, elapsed }
    }

    /// The policy whose state was reset.
    #[must_use]
    pub const fn policy(&self) -> AdmissionPolicy<'a> {
        self.policy
    }

    /// How it ended.
    #[must_use]
    pub const fn outcome(&self) -> ResetOutcome {
        self.outcome
    }

    /// Wall time the backend spent.
    #[must_use]
    pub const fn elapsed(&self) -> Duration {
        self.elapsed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Panics;
    impl Observer for Panics {
        fn observe(&self, _: &Observation<'_>) {
            panic!("observer bug");
        }
    }

    /// A panic payload whose own `Drop` panics.
    struct PanicsOnDrop;
    impl Drop for PanicsOnDrop {
        fn drop(&mut self) {
            panic!("payload drop");
        }
    }

    struct PanicsWithHostilePayload;
    impl Observer for PanicsWithHostilePayload {
        fn observe(&self, _: &Observation<'_>) {
            std::panic::panic_any(PanicsOnDrop);
        }
    }

    #[test]
    fn notify_disposes_of_a_payload_whose_drop_panics() {
        let observation =
            Observation::Cleanup(CleanupObservation::new(CleanupOutcome::NoEffect, 10, Duration::ZERO));
        // Without total isolation, dropping the payload would unwind out of `notify` and fail
        // this test.
        for _ in 0..3 {
            assert!(!notify(&PanicsWithHostilePayload, &observation));
        }
    }

    #[test]
    fn notify_isolates_panics() {
        let observation =
            Observation::Cleanup(CleanupObservation::new(CleanupOutcome::NoEffect, 10, Duration::ZERO));
        assert!(!notify(&Panics, &observation));
        assert!(notify(&(), &observation));
    }
}
