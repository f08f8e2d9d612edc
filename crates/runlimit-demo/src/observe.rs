//! Admission logs through Runlimit's observer seam.

use runlimit_core::{
    AdmissionOperation, AdmissionOutcome, CleanupOutcome, ConsumptionStatus, Observation, Observer,
};

/// A Runlimit [`Observer`] that emits one `tracing` event per admission.
///
/// Target `runlimit_demo::admission`, fields `backend` (`"memory"` or `"postgres"`),
/// `policy`, `scope`, `outcome` (`allowed`, `shadow_denied`, `quota_exceeded`,
/// `storage_capacity`, `invalid_batch`, `failed`), `consumption` (`consumed`,
/// `not_consumed`, `may_have_been_consumed`) and `elapsed_us`. Failures are `WARN`, every
/// other admission `INFO`; cleanup passes are `DEBUG` under `runlimit_demo::cleanup`.
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
