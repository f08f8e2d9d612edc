//! Label keys and the value each enum variant records as.
//!
//! Every value is a fixed `snake_case` name of an exhaustive enum variant: adding a variant to
//! Runlimit's observation enums is a compile error here until it has a name.

use runlimit_core::{
    AdmissionOutcome, CleanupOutcome, ConsumptionStatus, ResetOutcome,
    attempts::{AttemptDenialReason, AttemptEvent, AttemptOperation, AttemptOutcome},
};

/// The `backend` label: the name given to [`MetricsObserver::new`](crate::MetricsObserver::new).
pub const BACKEND: &str = "backend";
/// The `policy` label: the policy identifier.
pub const POLICY: &str = "policy";
/// The `scope` label: the policy's scope identifier.
pub const SCOPE: &str = "scope";
/// The `operation` label.
pub const OPERATION: &str = "operation";
/// The `outcome` label.
pub const OUTCOME: &str = "outcome";
/// The `consumption` label.
pub const CONSUMPTION: &str = "consumption";
/// The `event` label (attempt operations).
pub const EVENT: &str = "event";
/// The `store` label of the shard gauges: the name given to
/// [`MetricsObserver::with_store`](crate::MetricsObserver::with_store).
pub const STORE: &str = "store";
/// The `shard` label: a memory shard's index, in decimal.
pub const SHARD: &str = "shard";

/// `operation` of a single check.
pub const CHECK: &str = "check";
/// `operation` of an atomic batch.
pub const BATCH: &str = "batch";

/// The `outcome` value of an admission: `allowed`, `shadow_denied`, `quota_exceeded`,
/// `storage_capacity`, `invalid_batch` or `failed`.
#[must_use]
pub const fn outcome(outcome: AdmissionOutcome) -> &'static str {
    match outcome {
        AdmissionOutcome::Allowed => "allowed",
        AdmissionOutcome::ShadowDenied => "shadow_denied",
        AdmissionOutcome::QuotaExceeded => "quota_exceeded",
        AdmissionOutcome::StorageCapacity => "storage_capacity",
        AdmissionOutcome::InvalidBatch => "invalid_batch",
        AdmissionOutcome::Failed => "failed",
    }
}

/// The `consumption` value: `consumed`, `not_consumed` or `may_have_been_consumed`.
#[must_use]
pub const fn consumption(consumption: ConsumptionStatus) -> &'static str {
    match consumption {
        ConsumptionStatus::Consumed => "consumed",
        ConsumptionStatus::NotConsumed => "not_consumed",
        ConsumptionStatus::MayHaveBeenConsumed => "may_have_been_consumed",
    }
}

/// The `outcome` value of a cleanup pass: `removed` (with any count, including 0),
/// `no_effect` or `unknown`.
#[must_use]
pub const fn cleanup_outcome(outcome: CleanupOutcome) -> &'static str {
    match outcome {
        CleanupOutcome::Removed { .. } => "removed",
        CleanupOutcome::NoEffect => "no_effect",
        CleanupOutcome::Unknown => "unknown",
    }
}

/// The `outcome` value of a reset: `removed`, `nothing_stored`, `no_effect` or `unknown`.
#[must_use]
pub const fn reset_outcome(outcome: ResetOutcome) -> &'static str {
    match outcome {
        ResetOutcome::Removed => "removed",
        ResetOutcome::NothingStored => "nothing_stored",
        ResetOutcome::NoEffect => "no_effect",
        ResetOutcome::Unknown => "unknown",
    }
}

/// The `operation` value of an attempt operation: `admission`, `complete_success`,
/// `complete_failure`, `complete_abandoned` or `reset`.
#[must_use]
pub const fn attempt_operation(operation: AttemptOperation) -> &'static str {
    match operation {
        AttemptOperation::Admission => "admission",
        AttemptOperation::Completion(AttemptOutcome::Success) => "complete_success",
        AttemptOperation::Completion(AttemptOutcome::Failure) => "complete_failure",
        AttemptOperation::Completion(AttemptOutcome::Abandoned) => "complete_abandoned",
        AttemptOperation::Reset => "reset",
    }
}

/// The `event` value of an attempt operation: `admitted`, `denied_in_progress`,
/// `denied_backoff`, `denied_storage_capacity`, `completed_success`, `completed_failure`,
/// `completed_abandoned`, `stale`, `reset`, `reset_nothing_live`, `uncertain_commit` or
/// `failed`.
#[must_use]
pub const fn attempt_event(event: AttemptEvent) -> &'static str {
    match event {
        AttemptEvent::Admitted => "admitted",
        AttemptEvent::Denied(AttemptDenialReason::InProgress) => "denied_in_progress",
        AttemptEvent::Denied(AttemptDenialReason::Backoff) => "denied_backoff",
        AttemptEvent::Denied(AttemptDenialReason::StorageCapacity) => "denied_storage_capacity",
        AttemptEvent::Completed(AttemptOutcome::Success) => "completed_success",
        AttemptEvent::Completed(AttemptOutcome::Failure) => "completed_failure",
        AttemptEvent::Completed(AttemptOutcome::Abandoned) => "completed_abandoned",
        AttemptEvent::Stale => "stale",
        AttemptEvent::Reset { had_live_state: true } => "reset",
        AttemptEvent::Reset { had_live_state: false } => "reset_nothing_live",
        AttemptEvent::UncertainCommit => "uncertain_commit",
        AttemptEvent::Failed => "failed",
    }
}
