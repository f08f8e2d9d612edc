//! Observation bookkeeping shared by every limiter: what an admission transaction produced,
//! turned into its decision and reported to the observer.

use std::time::Instant;

use runlimit_core::{
    AdmissionOperation, AdmissionOutcome, AdmissionPolicy, BatchDecision, BatchDecisionError, Check,
    Decision, Observer, QuotaMode, RateLimitPolicy,
    backend::{
        admission_outcome, batch, batch_admission_outcome, observe_admission, observe_cleanup, observe_reset,
    },
};

use crate::error::{BatchCheckError, CheckError, CheckPhase, MaintenanceError};
pub(crate) use crate::store::sealed::Evaluated;

/// Turns a single check's result into its decision and observes it. PostgreSQL storage
/// denials carry no delay: only cleanup frees a slot.
pub(crate) fn finish_check<O: Observer, P: RateLimitPolicy>(
    observer: &O,
    policy: &P,
    result: Result<Evaluated, CheckError>,
    started: Instant,
) -> Result<Decision, CheckError> {
    // Unreachable mismatch: a decision commits only with one allowance per check (checked
    // before COMMIT), so this never reports a committed check as not consumed.
    let result = result.and_then(|evaluated| match evaluated {
        Evaluated::Allowed(mut allowances) => {
            allowances.pop().filter(|_| allowances.is_empty()).map(Decision::allowed).ok_or(
                CheckError::MalformedResponse { phase: CheckPhase::Preflight, reason: "not one allowance" },
            )
        }
        Evaluated::Denied(denial) => Ok(denial.into_check_decision(None)),
    });
    let operation = AdmissionOperation::Check { policy: AdmissionPolicy::of(policy) };
    let outcome = result.as_ref().map(admission_outcome).map_err(CheckError::consumption);
    observe_admission(observer, operation, outcome, started.elapsed(), None);
    result
}

/// Validates a batch with [`batch::validate`], observing a structural rejection.
pub(crate) fn validate<O: Observer, P: RateLimitPolicy>(
    observer: &O,
    checks: &[Check<'_, P>],
    maximum_batch_size: usize,
    started: Instant,
) -> Result<QuotaMode, BatchCheckError> {
    batch::validate(checks, maximum_batch_size).map_err(|error| {
        observe_admission(
            observer,
            AdmissionOperation::Batch { size: checks.len(), policy: None },
            Ok(AdmissionOutcome::InvalidBatch),
            started.elapsed(),
            None,
        );
        BatchCheckError::InvalidBatch(error)
    })
}

/// Turns a batch's result into its decision and observes it.
pub(crate) fn finish_batch<O: Observer, P: RateLimitPolicy>(
    observer: &O,
    checks: &[Check<'_, P>],
    result: Result<Evaluated, CheckError>,
    started: Instant,
) -> Result<BatchDecision, BatchCheckError> {
    let batch_size = checks.len();
    let malformed = |_: BatchDecisionError| {
        BatchCheckError::Check(CheckError::MalformedResponse {
            phase: CheckPhase::Preflight,
            reason: "decision does not fit the batch",
        })
    };
    // Unreachable mismatch, as for single checks: one allowance per check is checked before
    // COMMIT.
    let result = result.map_err(BatchCheckError::Check).and_then(|evaluated| match evaluated {
        Evaluated::Allowed(allowances) if allowances.len() == batch_size => {
            batch::allowed(allowances).map(|decision| (decision, None)).map_err(malformed)
        }
        Evaluated::Allowed(_) => Err(malformed(BatchDecisionError::NoAllowances)),
        Evaluated::Denied(denial) => denial
            .into_decision(batch_size, None)
            .map(|decision| (decision, Some(denial.index())))
            .map_err(malformed),
    });
    let (policy, outcome) = match &result {
        Ok((decision, index)) => (
            index.and_then(|index| checks.get(index)).map(|check| AdmissionPolicy::of(check.policy())),
            Ok(batch_admission_outcome(decision)),
        ),
        Err(error) => (None, Err(error.consumption())),
    };
    observe_admission(
        observer,
        AdmissionOperation::Batch { size: batch_size, policy },
        outcome,
        started.elapsed(),
        None,
    );
    result.map(|(decision, _)| decision)
}

/// Observes a reset's result (`true`: live state removed).
pub(crate) fn finish_reset<O: Observer, P: RateLimitPolicy>(
    observer: &O,
    policy: &P,
    result: &Result<bool, MaintenanceError>,
    started: Instant,
) {
    let result = result.as_ref().copied().map_err(MaintenanceError::may_have_removed_rows);
    observe_reset(observer, policy, result, started.elapsed());
}

/// Observes a cleanup pass's result.
pub(crate) fn finish_cleanup<O: Observer>(
    observer: &O,
    maximum_rows: u32,
    result: Result<u64, MaintenanceError>,
    started: Instant,
) -> Result<u64, MaintenanceError> {
    let outcome = result.as_ref().copied().map_err(MaintenanceError::may_have_removed_rows);
    observe_cleanup(observer, u64::from(maximum_rows), outcome, started.elapsed());
    result
}
