//! Admission logs through Runlimit's observer seam.

use runlimit_core::{
    AdmissionOperation, AdmissionOutcome, CleanupOutcome, Observation, Observer,
    attempts::{AttemptEvent, AttemptObservation, AttemptObserver},
};
use runlimit_metrics::{MetricsObserver, labels};

/// The demo's observer: every observation is logged ([`TracingObserver`]) and recorded as
/// metrics ([`MetricsObserver`], served on `GET /metrics`), under the same `backend` label;
/// the shard gauges also carry the store's name.
#[derive(Clone, Debug)]
pub struct DemoObserver {
    tracing: TracingObserver,
    metrics: MetricsObserver,
}

impl DemoObserver {
    /// An observer labelling its events and metrics with `backend`, and its shard gauges
    /// with `store` (the gate the store serves: `login-client`, `login-identity`, `items`,
    /// `login-attempts`).
    #[must_use]
    pub fn new(backend: &'static str, store: &'static str) -> Self {
        Self {
            tracing: TracingObserver::new(backend),
            metrics: MetricsObserver::new(backend).with_store(store),
        }
    }
}

impl Observer for DemoObserver {
    fn observe(&self, observation: &Observation<'_>) {
        self.tracing.observe(observation);
        self.metrics.observe(observation);
    }
}

impl AttemptObserver for DemoObserver {
    fn observe_attempt(&self, observation: &AttemptObservation<'_>) {
        self.tracing.observe_attempt(observation);
        self.metrics.observe_attempt(observation);
    }
}

/// A Runlimit [`Observer`] that emits one `tracing` event per admission.
///
/// Target `runlimit_demo::admission`, fields `backend` (`"memory"`, `"postgres"` or `"redis"`),
/// `policy`, `scope`, `outcome` (`allowed`, `shadow_denied`, `quota_exceeded`,
/// `storage_capacity`, `invalid_batch`, `failed`), `consumption` (`consumed`,
/// `not_consumed`, `may_have_been_consumed`) and `elapsed_us`. Failures are `WARN`, every
/// other admission `INFO`; cleanup passes are `DEBUG` under `runlimit_demo::cleanup`.
///
/// As an [`AttemptObserver`] it emits one event per attempt admission or completion, target
/// `runlimit_demo::attempt`, fields `backend`, `policy`, `scope`, `operation` (`admission`,
/// `complete_success`, `complete_failure`, `complete_abandoned`, `reset`), `event` (`admitted`,
/// `denied_in_progress`, `denied_backoff`, `denied_storage_capacity`, `completed_success`,
/// `completed_failure`, `completed_abandoned`, `stale`, `reset`, `reset_nothing_live`,
/// `uncertain_commit`, `failed`) and `elapsed_us`; `failed` and `uncertain_commit` are `WARN`,
/// the rest `INFO`. The values are the metric label values of [`runlimit_metrics::labels`].
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
                let outcome = labels::outcome(admission.outcome());
                let consumption = labels::consumption(admission.consumption());
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
                let outcome = labels::cleanup_outcome(cleanup.outcome());
                let removed = match cleanup.outcome() {
                    CleanupOutcome::Removed { count } => count,
                    CleanupOutcome::NoEffect | CleanupOutcome::Unknown => 0,
                };
                tracing::debug!(
                    target: "runlimit_demo::cleanup",
                    backend = self.backend, outcome, removed, maximum = cleanup.maximum(),
                    "cleanup"
                );
            }
            Observation::Reset(reset) => {
                let outcome = labels::reset_outcome(reset.outcome());
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

impl AttemptObserver for TracingObserver {
    fn observe_attempt(&self, observation: &AttemptObservation<'_>) {
        let policy = observation.policy().id().as_str();
        let scope = observation.policy().scope().as_str();
        let operation = labels::attempt_operation(observation.operation());
        let event = labels::attempt_event(observation.event());
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
