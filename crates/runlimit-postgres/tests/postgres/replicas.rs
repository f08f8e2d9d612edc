//! Four pools standing in for four replicas, running concurrent batches on overlapping keys.

use std::{collections::HashMap, sync::Arc, time::Duration};

use runlimit_core::{BatchDecisionView, Check, Denial, FixedWindowPolicy};
use runlimit_postgres::PostgresLimiter;

use crate::support::*;

const REPLICAS: usize = 4;
const TASKS_PER_REPLICA: usize = 4;
const BATCHES_PER_TASK: usize = 40;
const KEYS: u64 = 6;
const LIMIT: u64 = 25;

/// A small deterministic generator (xorshift) so the key choices are reproducible.
struct Xorshift(u64);

impl Xorshift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs RUNLIMIT_POSTGRES_TEST_DATABASE_URL"]
async fn four_replicas_never_exceed_the_limit_nor_half_commit() {
    let db = TestDatabase::create("replicas").await;
    db.limiter(1).await;
    let config = config().with_operation_timeout(Duration::from_secs(20)).unwrap();
    let mut replicas = Vec::new();
    for _ in 0..REPLICAS {
        replicas.push(Arc::new(PostgresLimiter::new(db.pool(3).await).with_config(config)));
    }
    // Two policies over the same subjects; keys spread over two capacity shards, all new at the
    // start, so the reserve path races as well as the update path.
    let policies = Arc::new([
        policy("replicas.a", LIMIT, Duration::from_secs(600)),
        policy("replicas.b", LIMIT, Duration::from_secs(600)),
    ]);
    let mut handles = Vec::new();
    for (replica, limiter) in replicas.iter().enumerate() {
        for task in 0..TASKS_PER_REPLICA {
            let limiter = Arc::clone(limiter);
            let policies = Arc::clone(&policies);
            handles.push(tokio::spawn(async move {
                let mut random =
                    Xorshift(0x9E37_79B9_7F4A_7C15 ^ u64::try_from(replica * 31 + task + 1).unwrap());
                let mut admitted: HashMap<(usize, u64), u64> = HashMap::new();
                let mut outcomes = (0u64, 0u64);
                for _ in 0..BATCHES_PER_TASK {
                    // 1 to 3 distinct (policy, subject) pairs, in varying order.
                    let size = 1 + usize::try_from(random.next() % 3).unwrap();
                    let mut members: Vec<(usize, u64)> = Vec::new();
                    while members.len() < size {
                        let member = (usize::try_from(random.next() % 2).unwrap(), random.next() % KEYS);
                        if !members.contains(&member) {
                            members.push(member);
                        }
                    }
                    let checks: Vec<Check<'_, FixedWindowPolicy>> = members
                        .iter()
                        .map(|&(p, n)| check(&policies[p], subject(u8::try_from(20 + n % 2).unwrap(), n)))
                        .collect();
                    let decision = limiter.check_all(&checks).await.expect("no errors, no deadlocks");
                    match decision.view() {
                        BatchDecisionView::Allowed { allowances } => {
                            assert_eq!(allowances.len(), members.len());
                            for member in &members {
                                *admitted.entry(*member).or_default() += 1;
                            }
                            outcomes.0 += 1;
                        }
                        BatchDecisionView::Denied { denial: Denial::QuotaExceeded(_), .. } => outcomes.1 += 1,
                        other => panic!("unexpected {other:?}"),
                    }
                }
                (admitted, outcomes)
            }));
        }
    }
    let mut admitted: HashMap<(usize, u64), u64> = HashMap::new();
    let (mut allowed, mut denied) = (0, 0);
    for handle in handles {
        let (counts, outcomes) = handle.await.unwrap();
        for (member, count) in counts {
            *admitted.entry(member).or_default() += count;
        }
        allowed += outcomes.0;
        denied += outcomes.1;
    }
    assert_eq!(allowed + denied, u64::try_from(REPLICAS * TASKS_PER_REPLICA * BATCHES_PER_TASK).unwrap());
    assert!(denied > 0, "the limit was never reached; the test would prove nothing");

    // Never over the limit, and the stored counters equal exactly what allowed batches
    // admitted: every allowed batch committed all of its members, no denied batch any.
    let mut connection = db.connection().await;
    for p in 0..2 {
        for n in 0..KEYS {
            let check = check(&policies[p], subject(u8::try_from(20 + n % 2).unwrap(), n));
            let count = admitted.get(&(p, n)).copied().unwrap_or(0);
            assert!(count <= LIMIT, "policy {p} key {n} admitted {count}");
            let stored =
                stored_used(&mut connection, &check).await.map_or(0, |used| u64::try_from(used).unwrap());
            assert_eq!(stored, count, "policy {p} key {n}");
        }
    }
    let total_rows: i64 = sqlx::query_scalar("SELECT count(*) FROM public.runlimit_fixed_windows")
        .fetch_one(&mut connection)
        .await
        .unwrap();
    assert_eq!(
        i64::from(ledger_count(&mut connection, 20).await + ledger_count(&mut connection, 21).await),
        total_rows
    );
    db.finish().await;
}
