//! Bookkeeping shared by the fixed-window and GCRA limiters: observing an admission or a
//! cleanup, and turning what an admission transaction produced into its decision.

use std::time::Instant;

use runlimit_core::{
    AdmissionObservation, AdmissionOperation, AdmissionOutcome, AdmissionPolicy, Allowance, BatchDecision,
    Check, CleanupObservation, CleanupOutcome, ConsumptionStatus, Decision, Denial, Observation, Observer,
    QuotaDenial, QuotaMode, RateLimitPolicy,
    backend::{batch::validate as validate_batch, notify},
};

use crate::error::{BatchCheckError, CheckError, CheckPhase, MaintenanceError};

/// What an admission transaction produced, before observation.
pub(crate) enum Evaluated {
    Allowed(Vec<Allowance>),
    Denied { index: usize, denial: Denial },
    ShadowDenied { index: usize, denial: QuotaDenial },
}

impl Evaluated {
    pub(crate) fn outcome(&self) -> (AdmissionOutcome, ConsumptionStatus, Option<usize>) {
        match self {
            Self::Allowed(_) => (AdmissionOutcome::Allowed, ConsumptionStatus::Consumed, None),
            Self::Denied { index, denial: Denial::QuotaExceeded(_) } => {
                (AdmissionOutcome::QuotaExceeded, ConsumptionStatus::NotConsumed, Some(*index))
            }
            Self::Denied { index, denial: Denial::StorageCapacity { .. } } => {
                (AdmissionOutcome::StorageCapacity, ConsumptionStatus::NotConsumed, Some(*index))
            }
            Self::ShadowDenied { index, .. } => {
                (AdmissionOutcome::ShadowDenied, ConsumptionStatus::NotConsumed, Some(*index))
            }
        }
    }
}

fn observe_admission<O: Observer>(
    observer: &O,
    operation: AdmissionOperation<'_>,
    outcome: AdmissionOutcome,
    consumption: ConsumptionStatus,
    started: Instant,
) {
    let observation = AdmissionObservation::new(operation, outcome, consumption, started.elapsed());
    notify(observer, &Observation::Admission(observation));
}

/// Observes a single check's result and turns it into its decision.
pub(crate) fn finish_check<O: Observer, P: RateLimitPolicy>(
    observer: &O,
    policy: &P,
    result: Result<Evaluated, CheckError>,
    started: Instant,
) -> Result<Decision, CheckError> {
    let operation = AdmissionOperation::Check { policy: AdmissionPolicy::of(policy) };
    let (outcome, consumption) = match &result {
        Ok(evaluated) => {
            let (outcome, consumption, _) = evaluated.outcome();
            (outcome, consumption)
        }
        Err(error) => (AdmissionOutcome::Failed, error.consumption()),
    };
    observe_admission(observer, operation, outcome, consumption, started);
    result.and_then(|evaluated| match evaluated {
        Evaluated::Allowed(mut allowances) => allowances
            .pop()
            .map(Decision::allowed)
            .ok_or(CheckError::MalformedResponse { phase: CheckPhase::Preflight, reason: "no allowance" }),
        Evaluated::Denied { denial, .. } => Ok(Decision::denied(denial)),
        Evaluated::ShadowDenied { denial, .. } => Ok(Decision::shadow_denied(denial)),
    })
}

/// Validates a batch with [`validate_batch`], observing a structural rejection.
pub(crate) fn validate<O: Observer, P: RateLimitPolicy>(
    observer: &O,
    checks: &[Check<'_, P>],
    maximum_batch_size: usize,
    started: Instant,
) -> Result<QuotaMode, BatchCheckError> {
    validate_batch(checks, maximum_batch_size).map_err(|error| {
        observe_admission(
            observer,
            AdmissionOperation::Batch { size: checks.len(), policy: None },
            AdmissionOutcome::InvalidBatch,
            ConsumptionStatus::NotConsumed,
            started,
        );
        BatchCheckError::InvalidBatch(error)
    })
}

/// Observes a batch's result and turns it into its decision.
pub(crate) fn finish_batch<O: Observer, P: RateLimitPolicy>(
    observer: &O,
    checks: &[Check<'_, P>],
    result: Result<Evaluated, CheckError>,
    started: Instant,
) -> Result<BatchDecision, BatchCheckError> {
    let batch_size = checks.len();
    let policy_at = |index: Option<usize>| {
        index.and_then(|index| checks.get(index)).map(|check| AdmissionPolicy::of(check.policy()))
    };
    let (operation, outcome, consumption) = match &result {
        Ok(evaluated) => {
            let (outcome, consumption, index) = evaluated.outcome();
            (AdmissionOperation::Batch { size: batch_size, policy: policy_at(index) }, outcome, consumption)
        }
        Err(error) => (
            AdmissionOperation::Batch { size: batch_size, policy: None },
            AdmissionOutcome::Failed,
            error.consumption(),
        ),
    };
    observe_admission(observer, operation, outcome, consumption, started);
    let malformed = |_| {
        BatchCheckError::Check(CheckError::MalformedResponse {
            phase: CheckPhase::Preflight,
            reason: "decision does not fit the batch",
        })
    };
    match result? {
        Evaluated::Allowed(allowances) => BatchDecision::allowed(allowances).map_err(malformed),
        Evaluated::Denied { index, denial } => {
            BatchDecision::denied(index, batch_size, denial).map_err(malformed)
        }
        Evaluated::ShadowDenied { index, denial } => {
            BatchDecision::shadow_denied(index, batch_size, denial).map_err(malformed)
        }
    }
}

/// Observes a cleanup pass's result.
pub(crate) fn finish_cleanup<O: Observer>(
    observer: &O,
    maximum_rows: u32,
    result: Result<u64, MaintenanceError>,
    started: Instant,
) -> Result<u64, MaintenanceError> {
    let outcome = match &result {
        Ok(count) => CleanupOutcome::Removed { count: *count },
        Err(error) if error.may_have_removed_rows() => CleanupOutcome::Unknown,
        Err(_) => CleanupOutcome::NoEffect,
    };
    let observation = CleanupObservation::new(outcome, u64::from(maximum_rows), started.elapsed());
    notify(observer, &Observation::Cleanup(observation));
    result
}
