//! Admission logs through Runlimit's observer seam.

use runlimit_core::{
    AdmissionOperation, AdmissionOutcome, CleanupOutcome, ConsumptionStatus, Observation, Observer,
    ResetOutcome,
    attempts::{
        AttemptDenialReason, AttemptEvent, AttemptObservation, AttemptObserver, AttemptOperation,
        AttemptOutcome,
    },
};

/// A Runlimit [`Observer`] that emits one `tracing` event per admission.
///
/// Target `runlimit_demo::admission`, fields `backend` (`"memory"` or `"postgres"`),
/// `policy`, `scope`, `outcome` (`allowed`, `shadow_denied`, `quota_exceeded`,
/// `storage_capacity`, `invalid_batch`, `failed`), `consumption` (`consumed`,
/// `not_consumed`, `may_have_been_consumed`) and `elapsed_us`. Failures are `WARN`, every
/// other admission `INFO`; cleanup passes are `DEBUG` under `runlimit_demo::cleanup`.
///
/// As an [`AttemptObserver`] it emits one event per attempt admission or completion, target
/// `runlimit_demo::attempt`, fields `backend`, `policy`, `scope`, `operation` (`admission`,
/// `complete_success`, `complete_failure`, `complete_abandoned`), `event` (`admitted`,
/// `denied_in_progress`, `denied_backoff`, `denied_storage_capacity`, `completed_success`,
/// `completed_failure`, `completed_abandoned`, `stale`, `uncertain_commit`, `failed`) and
/// `elapsed_us`; `failed` and `uncertain_commit` are `WARN`, the rest `INFO`.
///
/// Observations carry no subject keys, and this observer adds nothing: no identity,
/// password, client address or key ever reaches a log line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TracingObserver {
    backend: &'static str,
}

impl TracingObserver {
    /// An observer labelling its events with `backend`.
    #[must_use]
    pub const fn new(backend: &'static str) -> Self {
        Self { backend }
    }
}

fn outcome_name(outcome: AdmissionOutcome) -> &'static str {
    match outcome {
        AdmissionOutcome::Allowed => "allowed",
        AdmissionOutcome::ShadowDenied => "shadow_denied",
        AdmissionOutcome::QuotaExceeded => "quota_exceeded",
        AdmissionOutcome::StorageCapacity => "storage_capacity",
        AdmissionOutcome::InvalidBatch => "invalid_batch",
        AdmissionOutcome::Failed => "failed",
    }
}

fn consumption_name(consumption: ConsumptionStatus) -> &'static str {
    match consumption {
        ConsumptionStatus::Consumed => "consumed",
        ConsumptionStatus::NotConsumed => "not_consumed",
        ConsumptionStatus::MayHaveBeenConsumed => "may_have_been_consumed",
    }
}

impl Observer for TracingObserver {
    fn observe(&self, observation: &Observation<'_>) {
        match observation {
            Observation::Admission(admission) => {
                let policy = match admission.operation() {
                    AdmissionOperation::Check { policy } => Some(policy),
                    AdmissionOperation::Batch { policy, .. } => policy,
                };
                let (policy, scope) =
                    policy.map_or(("-", "-"), |policy| (policy.id().as_str(), policy.scope().as_str()));
                let outcome = outcome_name(admission.outcome());
                let consumption = consumption_name(admission.consumption());
                let elapsed_us = u64::try_from(admission.elapsed().as_micros()).unwrap_or(u64::MAX);
                if admission.outcome() == AdmissionOutcome::Failed {
                    tracing::warn!(
                        target: "runlimit_demo::admission",
                        backend = self.backend, policy, scope, outcome, consumption, elapsed_us,
                        "admission failed"
                    );
                } else {
                    tracing::info!(
                        target: "runlimit_demo::admission",
                        backend = self.backend, policy, scope, outcome, consumption, elapsed_us,
                        "admission"
                    );
                }
            }
            Observation::Cleanup(cleanup) => {
                let (outcome, removed) = match cleanup.outcome() {
                    CleanupOutcome::Removed { count } => ("removed", count),
                    CleanupOutcome::NoEffect => ("no_effect", 0),
                    CleanupOutcome::Unknown => ("unknown", 0),
                };
                tracing::debug!(
                    target: "runlimit_demo::cleanup",
                    backend = self.backend, outcome, removed, maximum = cleanup.maximum(),
                    "cleanup"
                );
            }
            Observation::Reset(reset) => {
                let outcome = match reset.outcome() {
                    ResetOutcome::Removed => "removed",
                    ResetOutcome::NothingStored => "nothing_stored",
                    ResetOutcome::NoEffect => "no_effect",
                    ResetOutcome::Unknown => "unknown",
                };
                let policy = reset.policy();
                tracing::info!(
                    target: "runlimit_demo::reset",
                    backend = self.backend, policy = policy.id().as_str(), scope = policy.scope().as_str(), outcome,
                    "reset"
                );
            }
        }
    }
}

fn attempt_outcome_name(outcome: AttemptOutcome) -> (&'static str, &'static str) {
    match outcome {
        AttemptOutcome::Success => ("complete_success", "completed_success"),
        AttemptOutcome::Failure => ("complete_failure", "completed_failure"),
        AttemptOutcome::Abandoned => ("complete_abandoned", "completed_abandoned"),
    }
}

impl AttemptObserver for TracingObserver {
    fn observe_attempt(&self, observation: &AttemptObservation<'_>) {
        let policy = observation.policy().id().as_str();
        let scope = observation.policy().scope().as_str();
        let operation = match observation.operation() {
            AttemptOperation::Admission => "admission",
            AttemptOperation::Completion(outcome) => attempt_outcome_name(outcome).0,
            AttemptOperation::Reset => "reset",
        };
        let event = match observation.event() {
            AttemptEvent::Admitted => "admitted",
            AttemptEvent::Denied(AttemptDenialReason::InProgress) => "denied_in_progress",
            AttemptEvent::Denied(AttemptDenialReason::Backoff) => "denied_backoff",
            AttemptEvent::Denied(AttemptDenialReason::StorageCapacity) => "denied_storage_capacity",
            AttemptEvent::Completed(outcome) => attempt_outcome_name(outcome).1,
            AttemptEvent::Stale => "stale",
            AttemptEvent::Reset { had_live_state: true } => "reset",
            AttemptEvent::Reset { had_live_state: false } => "reset_nothing_live",
            AttemptEvent::UncertainCommit => "uncertain_commit",
            AttemptEvent::Failed => "failed",
        };
        let elapsed_us = u64::try_from(observation.elapsed().as_micros()).unwrap_or(u64::MAX);
        if matches!(observation.event(), AttemptEvent::Failed | AttemptEvent::UncertainCommit) {
            tracing::warn!(
                target: "runlimit_demo::attempt",
                backend = self.backend, policy, scope, operation, event, elapsed_us,
                "attempt operation failed"
            );
        } else {
            tracing::info!(
                target: "runlimit_demo::attempt",
                backend = self.backend, policy, scope, operation, event, elapsed_us,
                "attempt"
            );
        }
    }
}

/// Displays an error and its `source()` chain, joined by `": "`, for log fields (each
/// Runlimit error keeps its cause in `source()`, not in its message).
pub(crate) struct ErrorChain<'a>(pub(crate) &'a (dyn std::error::Error + 'static));

impl std::fmt::Display for ErrorChain<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)?;
        let mut source = self.0.source();
        while let Some(error) = source {
            write!(f, ": {error}")?;
            source = error.source();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("outer")]
    struct Outer {
        #[source]
        source: std::io::Error,
    }

    #[test]
    fn error_chain_lists_sources() {
        let error = Outer { source: std::io::Error::other("inner") };
        assert_eq!(ErrorChain(&error).to_string(), "outer: inner");
    }
}
