//! The generic store behind [`MemoryStore`](crate::MemoryStore) and
//! [`GcraStore`](crate::GcraStore): engine, clock and observer dispatch.

use std::marker::PhantomData;

use quanta::Instant;

use runlimit_core::{
    AdmissionObservation, AdmissionOperation, AdmissionOutcome, AdmissionPolicy, BatchDecision,
    BatchDecisionView, Check, CleanupObservation, CleanupOutcome, ConsumptionStatus, Decision, DecisionView,
    Denial, Observation, Observer, notify,
};

use crate::{
    clock::{self, Clock},
    config::MemoryStoreConfig,
    engine::{Algorithm, Engine, Report},
    error::{CheckFailure, Failure, ObservedFailure},
    stats::MemoryStoreStats,
};

/// What a builder collects before the store exists.
pub(crate) struct Parts<C, O> {
    pub(crate) config: MemoryStoreConfig,
    pub(crate) clock: C,
    pub(crate) observer: Option<O>,
}

impl<C, O> Parts<C, O> {
    pub(crate) fn with_clock<C2>(self, clock: C2) -> Parts<C2, O> {
        Parts { config: self.config, clock, observer: self.observer }
    }

    pub(crate) fn with_observer<O2>(self, observer: O2) -> Parts<C, O2> {
        Parts { config: self.config, clock: self.clock, observer: Some(observer) }
    }
}

pub(crate) struct Store<A, C, O> {
    engine: Engine,
    clock: C,
    /// `None` unless a builder attached one: then no observation is built and no elapsed
    /// time is measured on the hot path.
    observer: Option<O>,
    algorithm: PhantomData<fn() -> A>,
}

fn decision_outcome(decision: &Decision) -> AdmissionOutcome {
    match decision.view() {
        DecisionView::Allowed { .. } => AdmissionOutcome::Allowed,
        DecisionView::ShadowDenied { .. } => AdmissionOutcome::ShadowDenied,
        DecisionView::Denied { denial } => denial_outcome(denial),
    }
}

fn batch_outcome(decision: &BatchDecision) -> AdmissionOutcome {
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

fn saturating_u64(value: usize) -> u64 {
    u64::try_from(value).unwrap_or(u64::MAX)
}

/// Reports one finished operation. Runs after every shard lock is released; [`notify`]
/// catches observer panics, so an observer cannot change the result.
fn observe<'p, D, F: ObservedFailure, O: Observer>(
    observer: &O,
    started: Instant,
    operation: impl FnOnce(Option<usize>) -> AdmissionOperation<'p>,
    result: &Result<Report<D>, F>,
    outcome: fn(&D) -> AdmissionOutcome,
) {
    let elapsed = started.elapsed();
    let observation = match result {
        Ok(report) => {
            if report.cleanup.removed > 0 {
                let cleanup = CleanupObservation::new(
                    CleanupOutcome::Removed { count: saturating_u64(report.cleanup.removed) },
                    saturating_u64(report.cleanup.maximum),
                    report.cleanup.elapsed,
                );
                notify(observer, &Observation::Cleanup(cleanup));
            }
            let consumption =
                if report.consumed { ConsumptionStatus::Consumed } else { ConsumptionStatus::NotConsumed };
            AdmissionObservation::new(
                operation(report.singled_out),
                outcome(&report.decision),
                consumption,
                elapsed,
            )
            .with_shard_headroom(report.headroom)
        }
        Err(failure) => {
            let outcome = if failure.is_invalid_batch() {
                AdmissionOutcome::InvalidBatch
            } else {
                AdmissionOutcome::Failed
            };
            AdmissionObservation::new(
                operation(failure.singled_out()),
                outcome,
                ConsumptionStatus::NotConsumed,
                elapsed,
            )
        }
    };
    notify(observer, &Observation::Admission(observation));
}

impl<A: Algorithm, C: Clock, O: Observer> Store<A, C, O> {
    pub(crate) fn new(parts: Parts<C, O>) -> Self {
        Self {
            engine: Engine::new(parts.config),
            clock: parts.clock,
            observer: parts.observer,
            algorithm: PhantomData,
        }
    }

    pub(crate) fn config(&self) -> &MemoryStoreConfig {
        self.engine.config()
    }

    pub(crate) fn check(&self, check: &Check<'_, A::Policy>) -> Result<Decision, CheckFailure<A::Error>> {
        let started = self.observer.as_ref().map(|_| Instant::now());
        let result = self.engine.check::<A>(check, clock::millis(&self.clock), started.is_some());
        if let (Some(observer), Some(started)) = (&self.observer, started) {
            let operation = |_| AdmissionOperation::Check { policy: AdmissionPolicy::of(check.policy()) };
            observe(observer, started, operation, &result, decision_outcome);
        }
        result.map(|report| report.decision)
    }

    pub(crate) fn check_all(
        &self,
        checks: &[Check<'_, A::Policy>],
    ) -> Result<BatchDecision, Failure<A::Error>> {
        let started = self.observer.as_ref().map(|_| Instant::now());
        let result = self.engine.check_all::<A>(checks, clock::millis(&self.clock), started.is_some());
        if let (Some(observer), Some(started)) = (&self.observer, started) {
            let operation = |index: Option<usize>| AdmissionOperation::Batch {
                size: checks.len(),
                policy: index
                    .and_then(|index| checks.get(index))
                    .map(|check| AdmissionPolicy::of(check.policy())),
            };
            observe(observer, started, operation, &result, batch_outcome);
        }
        result.map(|report| report.decision)
    }

    pub(crate) fn recover_poisoned(&self) -> usize {
        self.engine.recover_poisoned()
    }

    pub(crate) fn stats(&self) -> MemoryStoreStats {
        self.engine.stats()
    }

    #[cfg(test)]
    pub(crate) fn engine(&self) -> &Engine {
        &self.engine
    }
}
