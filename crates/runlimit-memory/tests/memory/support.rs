//! Shared helpers: policies, subjects, decision unpacking and a recording observer.

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use runlimit_core::{
    AdmissionOperation, AdmissionOutcome, BatchDecision, BatchDecisionView, CleanupOutcome,
    ConsumptionStatus, Decision, DecisionView, Denial, FixedWindowPolicy, GcraPolicy, KeyHasher, Observation,
    Observer, PolicyId, PolicySubject, RateLimitPolicy, ResetOutcome, ScopeId, backend::ShardHeadroom,
};

pub(crate) fn hasher() -> KeyHasher {
    KeyHasher::new(b"runlimit-memory integration test secret!").unwrap()
}

pub(crate) fn fixed(id: &str, limit: u64, window_ms: u64) -> FixedWindowPolicy {
    FixedWindowPolicy::new(
        PolicyId::new(id).unwrap(),
        ScopeId::new("test").unwrap(),
        limit,
        Duration::from_millis(window_ms),
    )
    .unwrap()
}

pub(crate) fn gcra(id: &str, quota: u64, period_ms: u64, burst: u64) -> GcraPolicy {
    GcraPolicy::new(
        PolicyId::new(id).unwrap(),
        ScopeId::new("test").unwrap(),
        quota,
        Duration::from_millis(period_ms),
        burst,
    )
    .unwrap()
}

/// Subject number `n` of `policy`, derived through the real `KeyHasher`.
pub(crate) fn subject<'p, P: RateLimitPolicy>(policy: &'p P, n: u64) -> PolicySubject<'p, P> {
    thread_local! {
        static HASHER: KeyHasher = hasher();
    }
    HASHER.with(|hasher| hasher.hash_for(policy, format!("subject-{n}").as_bytes()))
}

/// `(available, replenishes_after ms)` of an allowed decision.
#[track_caller]
pub(crate) fn allowed(decision: &Decision) -> (u64, u128) {
    match decision.view() {
        DecisionView::Allowed { allowance } => {
            (allowance.available(), allowance.replenishes_after().duration().as_millis())
        }
        other => panic!("expected allowed, got {other:?}"),
    }
}

/// `(capacity, retry_after ms)` of an enforced quota denial.
#[track_caller]
pub(crate) fn quota_denied(decision: &Decision) -> (u64, u128) {
    match decision.view() {
        DecisionView::Denied { denial: Denial::QuotaExceeded(quota) } => {
            (quota.capacity().get(), quota.retry_after().duration().as_millis())
        }
        other => panic!("expected a quota denial, got {other:?}"),
    }
}

/// `retry_after` ms of a storage-capacity denial.
#[track_caller]
pub(crate) fn storage_denied(decision: &Decision) -> Option<u128> {
    match decision.view() {
        DecisionView::Denied { denial: Denial::StorageCapacity { retry_after } } => {
            retry_after.map(|delay| delay.duration().as_millis())
        }
        other => panic!("expected a storage denial, got {other:?}"),
    }
}

/// `(available, replenishes_after ms)` of each allowance of an allowed batch.
#[track_caller]
pub(crate) fn batch_allowed(decision: &BatchDecision) -> Vec<(u64, u128)> {
    match decision.view() {
        BatchDecisionView::Allowed { allowances } => allowances
            .iter()
            .map(|allowance| (allowance.available(), allowance.replenishes_after().duration().as_millis()))
            .collect(),
        other => panic!("expected an allowed batch, got {other:?}"),
    }
}

/// `(index, batch_size, denial)` of a denied batch.
#[track_caller]
pub(crate) fn batch_denied(decision: &BatchDecision) -> (usize, usize, Denial) {
    match decision.view() {
        BatchDecisionView::Denied { index, batch_size, denial } => (index, batch_size, *denial),
        other => panic!("expected a denied batch, got {other:?}"),
    }
}

/// An owned copy of an observation, with the policy as `"id/scope"`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Seen {
    Check {
        policy: String,
        outcome: AdmissionOutcome,
        consumption: ConsumptionStatus,
        headroom: Option<ShardHeadroom>,
    },
    Batch {
        size: usize,
        policy: Option<String>,
        outcome: AdmissionOutcome,
        consumption: ConsumptionStatus,
        headroom: Option<ShardHeadroom>,
    },
    Cleanup {
        outcome: CleanupOutcome,
        maximum: u64,
    },
    Reset {
        policy: String,
        outcome: ResetOutcome,
    },
}

#[derive(Clone, Default)]
pub(crate) struct Recorder(pub(crate) Arc<Mutex<Vec<Seen>>>);

impl Recorder {
    pub(crate) fn take(&self) -> Vec<Seen> {
        std::mem::take(&mut *self.0.lock().unwrap())
    }
}

impl Observer for Recorder {
    fn observe(&self, observation: &Observation<'_>) {
        let seen = match observation {
            Observation::Admission(admission) => match admission.operation() {
                AdmissionOperation::Check { policy } => Seen::Check {
                    policy: format!("{}/{}", policy.id().as_str(), policy.scope().as_str()),
                    outcome: admission.outcome(),
                    consumption: admission.consumption(),
                    headroom: admission.shard_headroom(),
                },
                AdmissionOperation::Batch { size, policy } => Seen::Batch {
                    size,
                    policy: policy
                        .map(|policy| format!("{}/{}", policy.id().as_str(), policy.scope().as_str())),
                    outcome: admission.outcome(),
                    consumption: admission.consumption(),
                    headroom: admission.shard_headroom(),
                },
            },
            Observation::Cleanup(cleanup) => {
                Seen::Cleanup { outcome: cleanup.outcome(), maximum: cleanup.maximum() }
            }
            Observation::Reset(reset) => Seen::Reset {
                policy: format!("{}/{}", reset.policy().id().as_str(), reset.policy().scope().as_str()),
                outcome: reset.outcome(),
            },
        };
        self.0.lock().unwrap().push(seen);
    }
}
