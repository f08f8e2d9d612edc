//! Observations for every admission and cleanup, after the transaction is finalized.

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use runlimit_core::{
    AdmissionOperation, AdmissionOutcome, AdmissionPolicy, CleanupOutcome, ConsumptionStatus, Observation,
    Observer, ResetOutcome,
};
use runlimit_postgres::PostgresLimiter;
use sqlx::postgres::PgPoolOptions;

use crate::support::*;

/// What an observation said, without borrowed data.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Seen {
    Check { policy: String, outcome: AdmissionOutcome, consumption: ConsumptionStatus },
    Batch { size: usize, policy: Option<String>, outcome: AdmissionOutcome, consumption: ConsumptionStatus },
    Cleanup { outcome: CleanupOutcome, maximum: u64 },
    Reset { policy: String, outcome: ResetOutcome },
}

#[derive(Clone, Default)]
struct Recorder(Arc<Mutex<Vec<Seen>>>);

impl Recorder {
    fn take(&self) -> Vec<Seen> {
        std::mem::take(&mut *self.0.lock().unwrap())
    }
}

fn name(policy: AdmissionPolicy<'_>) -> String {
    format!("{}/{}", policy.id(), policy.scope())
}

impl Observer for Recorder {
    fn observe(&self, observation: &Observation<'_>) {
        let seen = match observation {
            Observation::Admission(admission) => match admission.operation() {
                AdmissionOperation::Check { policy } => Seen::Check {
                    policy: name(policy),
                    outcome: admission.outcome(),
                    consumption: admission.consumption(),
                },
                AdmissionOperation::Batch { size, policy } => Seen::Batch {
                    size,
                    policy: policy.map(name),
                    outcome: admission.outcome(),
                    consumption: admission.consumption(),
                },
            },
            Observation::Cleanup(cleanup) => {
                Seen::Cleanup { outcome: cleanup.outcome(), maximum: cleanup.maximum() }
            }
            Observation::Reset(reset) => {
                Seen::Reset { policy: name(reset.policy()), outcome: reset.outcome() }
            }
        };
        self.0.lock().unwrap().push(seen);
    }
}

struct Panics;

impl Observer for Panics {
    fn observe(&self, _: &Observation<'_>) {
        panic!("observer bug");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs RUNLIMIT_POSTGRES_TEST_DATABASE_URL"]
async fn every_admission_and_cleanup_is_observed() {
    let db = TestDatabase::create("observations").await;
    let recorder = Recorder::default();
    let limiter = db.limiter(2).await.with_observer(recorder.clone());
    let one = policy("observer.one", 1, Duration::from_millis(300));
    let two = policy("observer.two", 5, Duration::from_secs(60));
    let a = check(&one, subject(1, 1));
    let b = check(&two, subject(1, 2));
    let check_seen = |policy: &str, outcome, consumption| Seen::Check {
        policy: format!("{policy}/subject"),
        outcome,
        consumption,
    };

    limiter.check(&a).await.unwrap();
    limiter.check(&a).await.unwrap();
    limiter.check_all(&[b, a]).await.unwrap();
    let _ = limiter.check_all(&[b, b]).await.unwrap_err();
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(limiter.cleanup_expired(7).await.unwrap(), 1);
    limiter.check_all(&[b, a]).await.unwrap();
    assert_eq!(
        recorder.take(),
        [
            check_seen("observer.one", AdmissionOutcome::Allowed, ConsumptionStatus::Consumed),
            check_seen("observer.one", AdmissionOutcome::QuotaExceeded, ConsumptionStatus::NotConsumed),
            Seen::Batch {
                size: 2,
                policy: Some("observer.one/subject".to_owned()),
                outcome: AdmissionOutcome::QuotaExceeded,
                consumption: ConsumptionStatus::NotConsumed,
            },
            Seen::Batch {
                size: 2,
                policy: None,
                outcome: AdmissionOutcome::InvalidBatch,
                consumption: ConsumptionStatus::NotConsumed,
            },
            Seen::Cleanup { outcome: CleanupOutcome::Removed { count: 1 }, maximum: 7 },
            Seen::Batch {
                size: 2,
                policy: None,
                outcome: AdmissionOutcome::Allowed,
                consumption: ConsumptionStatus::Consumed,
            },
        ]
    );

    // Failures: definite non-consumption for a pool timeout, NoEffect for a failed cleanup.
    let held = limiter.pool().acquire().await.unwrap();
    let held_too = limiter.pool().acquire().await.unwrap();
    let limiter = limiter.with_config(config().with_pool_acquire_timeout(Duration::from_millis(50)).unwrap());
    let _ = limiter.check(&b).await.unwrap_err();
    let _ = limiter.cleanup_expired(3).await.unwrap_err();
    drop((held, held_too));
    assert_eq!(
        recorder.take(),
        [
            check_seen("observer.two", AdmissionOutcome::Failed, ConsumptionStatus::NotConsumed),
            Seen::Cleanup { outcome: CleanupOutcome::NoEffect, maximum: 3 },
        ]
    );
    db.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs RUNLIMIT_POSTGRES_TEST_DATABASE_URL"]
async fn an_unknown_commit_is_observed_as_may_have_been_consumed() {
    let db = TestDatabase::create("observe_unknown_commit").await;
    db.limiter(1).await;
    let proxy = Proxy::start(&db.options).await;
    let pool = db.pool_with(PgPoolOptions::new().max_connections(1), proxy.options(&db.options)).await;
    let recorder = Recorder::default();
    let limiter = PostgresLimiter::new(pool).with_observer(recorder.clone());
    let policy = policy("observer.commit", 5, Duration::from_secs(60));
    proxy.arm(Cut::AfterForwarding(b"COMMIT;"));
    let _ = limiter.check(&check(&policy, subject(2, 1))).await.unwrap_err();
    assert_eq!(
        recorder.take(),
        [Seen::Check {
            policy: "observer.commit/subject".to_owned(),
            outcome: AdmissionOutcome::Failed,
            consumption: ConsumptionStatus::MayHaveBeenConsumed,
        }]
    );
    db.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs RUNLIMIT_POSTGRES_TEST_DATABASE_URL"]
async fn a_panicking_observer_cannot_change_a_decision() {
    let db = TestDatabase::create("observer_panics").await;
    let limiter = db.limiter(2).await.with_observer(Panics);
    let policy = policy("observer.panics", 1, Duration::from_secs(60));
    let check = check(&policy, subject(3, 1));
    assert!(limiter.check(&check).await.unwrap().permits_request());
    assert!(!limiter.check(&check).await.unwrap().permits_request());
    assert_eq!(limiter.cleanup_expired(5).await.unwrap(), 0);
    db.finish().await;
}
