//! Admission results turned into decisions and reported to the observer.

use std::time::Instant;

use runlimit_core::{
    AdmissionOperation, AdmissionOutcome, AdmissionPolicy, BatchDecision, Check, ConsumptionStatus, Decision,
    Observer, QuotaMode, RateLimitPolicy,
    backend::{
        admission_outcome, batch, batch_admission_outcome, observe_admission, observe_cleanup, observe_reset,
    },
};

use crate::{
    error::{BatchCheckError, CheckError, MaintenanceError},
    store::{Admission, Evaluated},
};

fn malformed(written: bool) -> CheckError {
    CheckError::MalformedReply {
        reason: "decision does not fit the checks",
        consumption: if written {
            ConsumptionStatus::MayHaveBeenConsumed
        } else {
            ConsumptionStatus::NotConsumed
        },
    }
}

/// A single check's decision, observed.
pub(crate) fn finish_check<O: Observer, P: RateLimitPolicy>(
    observer: &O,
    policy: &P,
    result: Result<Admission, CheckError>,
    started: Instant,
) -> Result<Decision, CheckError> {
    let mut headroom = None;
    let result = result.and_then(|admission| {
        headroom = admission.headroom;
        match admission.evaluated {
            Evaluated::Allowed(mut allowances) => allowances
                .pop()
                .filter(|_| allowances.is_empty())
                .map(Decision::allowed)
                .ok_or_else(|| malformed(true)),
            Evaluated::Denied { denial, storage_retry_after } => {
                Ok(denial.into_check_decision(storage_retry_after))
            }
        }
    });
    let operation = AdmissionOperation::Check { policy: AdmissionPolicy::of(policy) };
    let outcome = result.as_ref().map(admission_outcome).map_err(CheckError::consumption);
    observe_admission(observer, operation, outcome, started.elapsed(), headroom);
    result
}

/// Validates a batch's structure with the core rule, observing a rejection.
pub(crate) fn validate<O: Observer, P: RateLimitPolicy>(
    observer: &O,
    checks: &[Check<'_, P>],
    maximum_batch_size: usize,
    started: Instant,
) -> Result<QuotaMode, BatchCheckError> {
    batch::validate(checks, maximum_batch_size).map_err(|error| {
        structural(observer, checks.len(), started);
        BatchCheckError::InvalidBatch(error)
    })
}

/// Observes a batch rejected before any I/O.
pub(crate) fn structural<O: Observer>(observer: &O, size: usize, started: Instant) {
    observe_admission(
        observer,
        AdmissionOperation::Batch { size, policy: None },
        Ok(AdmissionOutcome::InvalidBatch),
        started.elapsed(),
        None,
    );
}

/// A batch's decision, observed.
pub(crate) fn finish_batch<O: Observer, P: RateLimitPolicy>(
    observer: &O,
    checks: &[Check<'_, P>],
    result: Result<Admission, CheckError>,
    started: Instant,
) -> Result<BatchDecision, BatchCheckError> {
    let batch_size = checks.len();
    let mut headroom = None;
    let result = result.map_err(BatchCheckError::Check).and_then(|admission| {
        headroom = admission.headroom;
        match admission.evaluated {
            Evaluated::Allowed(allowances) if allowances.len() == batch_size => batch::allowed(allowances)
                .map(|decision| (decision, None))
                .map_err(|_| BatchCheckError::Check(malformed(true))),
            Evaluated::Allowed(_) => Err(BatchCheckError::Check(malformed(true))),
            Evaluated::Denied { denial, storage_retry_after } => denial
                .into_decision(batch_size, storage_retry_after)
                .map(|decision| (decision, Some(denial.index())))
                .map_err(|_| BatchCheckError::Check(malformed(false))),
        }
    });
    let (policy, outcome) = match &result {
        Ok((decision, index)) => (
            index.and_then(|index| checks.get(index)).map(|check| AdmissionPolicy::of(check.policy())),
            Ok(batch_admission_outcome(decision)),
        ),
        Err(error) => (None, Err(error.consumption())),
    };
    let operation = AdmissionOperation::Batch { size: batch_size, policy };
    observe_admission(observer, operation, outcome, started.elapsed(), headroom);
    result.map(|(decision, _)| decision)
}

/// Observes a reset (`true`: live state removed).
pub(crate) fn finish_reset<O: Observer, P: RateLimitPolicy>(
    observer: &O,
    policy: &P,
    result: &Result<bool, MaintenanceError>,
    started: Instant,
) {
    let result = result.as_ref().copied().map_err(MaintenanceError::may_have_removed_entries);
    observe_reset(observer, policy, result, started.elapsed());
}

/// Observes a cleanup pass.
pub(crate) fn finish_cleanup<O: Observer>(
    observer: &O,
    maximum: u32,
    result: Result<u64, MaintenanceError>,
    started: Instant,
) -> Result<u64, MaintenanceError> {
    let outcome = result.as_ref().copied().map_err(MaintenanceError::may_have_removed_entries);
    observe_cleanup(observer, u64::from(maximum), outcome, started.elapsed());
    result
}
