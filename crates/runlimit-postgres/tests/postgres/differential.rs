//! Differential test: the same sequence of checks against `MemoryStore` and `PostgresLimiter`
//! gives the same decisions. Windows are an hour long, so the two clocks cannot disagree about
//! expiry; delays are compared by range (both within the window), everything else exactly.

use std::time::Duration;

use runlimit_core::{BatchDecision, BatchDecisionView, Check, Delay, Denial, FixedWindowPolicy, QuotaMode};
use runlimit_memory::{MemoryStore, MemoryStoreConfig};
use runlimit_postgres::BatchCheckError;

use crate::support::*;

/// A decision with its backend-measured delays reduced to "within the window".
#[derive(Debug, PartialEq, Eq)]
enum Normalized {
    Allowed(Vec<(u64, u64)>),
    Denied { index: usize, batch_size: usize, reason: &'static str, capacity: Option<u64> },
    ShadowDenied { index: usize, batch_size: usize, capacity: u64 },
    Invalid(String),
}

fn within(delay: Delay, window: Duration) {
    assert!(delay.duration() > Duration::ZERO && delay.duration() <= window, "{delay:?} outside {window:?}");
}

fn normalize(decision: &BatchDecision, window: Duration) -> Normalized {
    match decision.view() {
        BatchDecisionView::Allowed { allowances } => Normalized::Allowed(
            allowances
                .iter()
                .map(|allowance| {
                    within(allowance.replenishes_after(), window);
                    (allowance.capacity().get(), allowance.available())
                })
                .collect(),
        ),
        BatchDecisionView::Denied { index, batch_size, denial: Denial::QuotaExceeded(quota) } => {
            within(quota.retry_after(), window);
            Normalized::Denied { index, batch_size, reason: "quota", capacity: Some(quota.capacity().get()) }
        }
        BatchDecisionView::Denied { index, batch_size, denial: Denial::StorageCapacity { .. } } => {
            Normalized::Denied { index, batch_size, reason: "storage", capacity: None }
        }
        BatchDecisionView::ShadowDenied { index, batch_size, denial } => {
            within(denial.retry_after(), window);
            Normalized::ShadowDenied { index, batch_size, capacity: denial.capacity().get() }
        }
    }
}

struct Xorshift(u64);

impl Xorshift {
    fn below(&mut self, bound: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % bound
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs RUNLIMIT_POSTGRES_TEST_DATABASE_URL"]
async fn postgres_decides_like_the_memory_store() {
    let db = TestDatabase::create("differential").await;
    let postgres = db.limiter(2).await;
    let memory = MemoryStore::new(MemoryStoreConfig::new(10_000).unwrap());
    let window = Duration::from_secs(3_600);
    let enforced: Vec<FixedWindowPolicy> =
        (1..=4).map(|limit| policy(&format!("differential.{limit}"), limit, window)).collect();
    let shadowed: Vec<FixedWindowPolicy> =
        enforced.iter().map(|policy| policy.clone().with_quota_mode(QuotaMode::Shadow)).collect();
    let mut random = Xorshift(0x2545_F491_4F6C_DD1D);
    let mut compared = (0, 0, 0);

    for step in 0..400 {
        let policies = if random.below(5) == 0 { &shadowed } else { &enforced };
        let size = 1 + usize::try_from(random.below(3)).unwrap();
        let checks: Vec<Check<'_, FixedWindowPolicy>> = (0..size)
            .map(|_| {
                let policy = &policies[usize::try_from(random.below(4)).unwrap()];
                check(policy, subject(u8::try_from(random.below(3)).unwrap(), random.below(5)))
            })
            .collect();
        let (memory_decision, postgres_decision) = if size == 1 && random.below(2) == 0 {
            // Single checks through the single-check API of both backends.
            let memory_decision = memory.check(&checks[0]).unwrap();
            let postgres_decision = postgres.check(&checks[0]).await.unwrap();
            let to_batch = |decision: runlimit_core::Decision| {
                match decision.view() {
                    runlimit_core::DecisionView::Allowed { allowance } => {
                        BatchDecision::allowed(vec![*allowance])
                    }
                    runlimit_core::DecisionView::Denied { denial } => BatchDecision::denied(0, 1, *denial),
                    runlimit_core::DecisionView::ShadowDenied { denial } => {
                        BatchDecision::shadow_denied(0, 1, *denial)
                    }
                }
                .unwrap()
            };
            (
                Normalized::from(to_batch(memory_decision), window),
                Normalized::from(to_batch(postgres_decision), window),
            )
        } else {
            let memory_decision = match memory.check_all(&checks) {
                Ok(decision) => normalize(&decision, window),
                Err(runlimit_memory::MemoryBatchError::InvalidBatch { source }) => {
                    Normalized::Invalid(source.to_string())
                }
                Err(error) => panic!("step {step}: {error:?}"),
            };
            let postgres_decision = match postgres.check_all(&checks).await {
                Ok(decision) => normalize(&decision, window),
                Err(BatchCheckError::InvalidBatch(error)) => Normalized::Invalid(error.to_string()),
                Err(error) => panic!("step {step}: {error:?}"),
            };
            (memory_decision, postgres_decision)
        };
        match &memory_decision {
            Normalized::Allowed(_) => compared.0 += 1,
            Normalized::Invalid(_) => {}
            _ => compared.1 += 1,
        }
        compared.2 += 1;
        assert_eq!(postgres_decision, memory_decision, "step {step}");
    }
    assert!(compared.0 > 50 && compared.1 > 50, "too few allowed/denied outcomes: {compared:?}");
    db.finish().await;
}

impl Normalized {
    fn from(decision: BatchDecision, window: Duration) -> Self {
        normalize(&decision, window)
    }
}
