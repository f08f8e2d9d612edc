//! The fixed-window rules, with exact values.

use std::time::Duration;

use runlimit_core::{DecisionView, Denial};

use crate::support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs RUNLIMIT_POSTGRES_TEST_DATABASE_URL"]
async fn limit_reached_denies_within_the_remaining_window() {
    let db = TestDatabase::create("limit_reached").await;
    let limiter = db.limiter(4).await;
    let policy = policy("rules.limit", 2, Duration::from_secs(60));
    let check = check(&policy, subject(1, 1));

    let first = limiter.check(&check).await.unwrap();
    let DecisionView::Allowed { allowance } = first.view() else { panic!("{first:?}") };
    assert_eq!(allowance.capacity().get(), 2);
    assert_eq!(allowance.available(), 1);
    assert_eq!(allowance.replenishes_after().duration(), Duration::from_secs(60));

    let second = limiter.check(&check).await.unwrap();
    let DecisionView::Allowed { allowance: second_allowance } = second.view() else { panic!("{second:?}") };
    assert_eq!(second_allowance.available(), 0);
    assert!(second_allowance.replenishes_after().duration() < Duration::from_secs(60));

    let third = limiter.check(&check).await.unwrap();
    let DecisionView::Denied { denial: Denial::QuotaExceeded(quota) } = third.view() else {
        panic!("{third:?}")
    };
    assert_eq!(quota.capacity().get(), 2);
    assert!(quota.retry_after().duration() > Duration::ZERO);
    assert!(quota.retry_after() <= second_allowance.replenishes_after());
    assert_eq!(quota.retry_after().seconds(), 60);

    let mut connection = db.connection().await;
    assert_eq!(stored_used(&mut connection, &check).await, Some(2));
    db.finish().await;
}
