//! The fixed-window rules on the real database clock, checked against the stored rows. The rules
//! every backend shares, on a pinned clock, are scenarios of the conformance suite
//! (`tests/conformance.rs`).

use std::time::Duration;

use runlimit_core::{
    Allowance, BatchDecisionView, BatchError, Capacity, Check, DecisionView, Delay, Denial, Limiter,
    QuotaMode,
};
use runlimit_postgres::{BatchCheckError, PostgresLimiter};

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
    // A new window is anchored at the decision's clock sample: exactly the window remains.
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
    // retry_after is the stored window end minus the clock sample: the stored window is exactly
    // 60 s long and started before the denial's sample.
    let window_ms: f64 = sqlx::query_scalar(
        "SELECT (EXTRACT(EPOCH FROM window_expires_at - window_started_at) * 1000)::float8 \
         FROM public.runlimit_fixed_windows WHERE counter_key = $1",
    )
    .bind(check.counter_key().to_bytes().as_slice())
    .fetch_one(&mut connection)
    .await
    .unwrap();
    assert_eq!(window_ms, 60_000.0);
    db.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs RUNLIMIT_POSTGRES_TEST_DATABASE_URL"]
async fn window_re_anchors_after_expiry() {
    let db = TestDatabase::create("re_anchor").await;
    let limiter = db.limiter(4).await;
    let window = Duration::from_millis(800);
    let policy = policy("rules.reanchor", 1, window);
    let check = check(&policy, subject(2, 1));

    let first = limiter.check(&check).await.unwrap();
    assert_eq!(
        first.view(),
        DecisionView::Allowed {
            allowance: &Allowance::new(Capacity::new(1).unwrap(), 0, Delay::from_duration(window)).unwrap()
        }
    );
    let denied = limiter.check(&check).await.unwrap();
    let DecisionView::Denied { denial: Denial::QuotaExceeded(quota) } = denied.view() else {
        panic!("{denied:?}")
    };
    assert!(quota.retry_after().duration() <= window);
    let mut connection = db.connection().await;
    let first_start: f64 = started_at(&mut connection, &check).await;

    tokio::time::sleep(quota.retry_after().duration() + Duration::from_millis(50)).await;
    let renewed = limiter.check(&check).await.unwrap();
    // The new window is anchored at this check, not at a wall-clock boundary: exactly the full
    // window remains and the counter restarts at 1.
    assert_eq!(
        renewed.view(),
        DecisionView::Allowed {
            allowance: &Allowance::new(Capacity::new(1).unwrap(), 0, Delay::from_duration(window)).unwrap()
        }
    );
    assert_eq!(stored_used(&mut connection, &check).await, Some(1));
    let second_start = started_at(&mut connection, &check).await;
    assert!(second_start - first_start >= 0.8, "{first_start} -> {second_start}");
    db.finish().await;
}

async fn started_at(
    connection: &mut sqlx::PgConnection,
    check: &Check<'_, runlimit_core::FixedWindowPolicy>,
) -> f64 {
    sqlx::query_scalar(
        "SELECT EXTRACT(EPOCH FROM window_started_at)::float8 FROM public.runlimit_fixed_windows WHERE counter_key = $1",
    )
    .bind(check.counter_key().to_bytes().as_slice())
    .fetch_one(connection)
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs RUNLIMIT_POSTGRES_TEST_DATABASE_URL"]
async fn denied_and_shadow_denied_checks_consume_nothing() {
    let db = TestDatabase::create("no_consumption").await;
    let limiter = db.limiter(4).await;
    let enforced = policy("rules.consume", 1, Duration::from_secs(60));
    let shadow = enforced.clone().with_quota_mode(QuotaMode::Shadow);
    let key = subject(3, 1);
    let enforced_check = check(&enforced, key);
    let shadow_check = check(&shadow, key);
    let mut connection = db.connection().await;

    assert!(limiter.check(&enforced_check).await.unwrap().permits_request());
    for _ in 0..3 {
        let denied = limiter.check(&enforced_check).await.unwrap();
        assert!(matches!(denied.view(), DecisionView::Denied { denial: Denial::QuotaExceeded(_) }));
        // Quota mode is not in the fingerprint: the shadow policy shares the counter.
        let shadowed = limiter.check(&shadow_check).await.unwrap();
        let DecisionView::ShadowDenied { denial } = shadowed.view() else { panic!("{shadowed:?}") };
        assert_eq!(denial.capacity().get(), 1);
        assert!(denial.retry_after().duration() <= Duration::from_secs(60));
        assert!(shadowed.permits_request());
        assert_eq!(stored_used(&mut connection, &enforced_check).await, Some(1));
    }
    // A shadow policy that is not exhausted consumes like an enforced one.
    let fresh = check(&shadow, subject(3, 2));
    assert!(matches!(limiter.check(&fresh).await.unwrap().view(), DecisionView::Allowed { .. }));
    assert_eq!(stored_used(&mut connection, &fresh).await, Some(1));
    db.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs RUNLIMIT_POSTGRES_TEST_DATABASE_URL"]
async fn batches_are_all_or_nothing() {
    let db = TestDatabase::create("batch_all_or_nothing").await;
    let limiter = db.limiter(4).await;
    let wide = policy("rules.batch.wide", 5, Duration::from_secs(60));
    let narrow = policy("rules.batch.narrow", 1, Duration::from_secs(30));
    let a = check(&wide, subject(4, 1));
    let b = check(&narrow, subject(5, 1));
    let mut connection = db.connection().await;

    let allowed = limiter.check_all(&[a, b]).await.unwrap();
    let BatchDecisionView::Allowed { allowances } = allowed.view() else { panic!("{allowed:?}") };
    assert_eq!(
        allowances,
        [
            Allowance::new(Capacity::new(5).unwrap(), 4, Delay::from_millis(60_000)).unwrap(),
            Allowance::new(Capacity::new(1).unwrap(), 0, Delay::from_millis(30_000)).unwrap(),
        ]
    );

    // b is exhausted: the batch is denied at index 1 and a is not consumed.
    let denied = limiter.check_all(&[a, b]).await.unwrap();
    let BatchDecisionView::Denied { index: 1, batch_size: 2, denial: Denial::QuotaExceeded(quota) } =
        denied.view()
    else {
        panic!("{denied:?}")
    };
    assert_eq!(quota.capacity().get(), 1);
    assert!(quota.retry_after().duration() <= Duration::from_secs(30));
    assert_eq!(stored_used(&mut connection, &a).await, Some(1));
    assert_eq!(stored_used(&mut connection, &b).await, Some(1));

    // A denied batch with a new key inserts nothing.
    let c = check(&wide, subject(6, 1));
    assert!(!limiter.check_all(&[c, b]).await.unwrap().permits_request());
    assert_eq!(stored_used(&mut connection, &c).await, None);

    // Shadow batches: shadow-denied at the exhausted index, nothing consumed.
    let shadow_wide = wide.clone().with_quota_mode(QuotaMode::Shadow);
    let shadow_narrow = narrow.clone().with_quota_mode(QuotaMode::Shadow);
    let sa = check(&shadow_wide, subject(4, 1));
    let sb = check(&shadow_narrow, subject(5, 1));
    let shadowed = limiter.check_all(&[sb, sa]).await.unwrap();
    assert!(matches!(shadowed.view(), BatchDecisionView::ShadowDenied { index: 0, batch_size: 2, .. }));
    assert!(shadowed.permits_request());
    assert_eq!(stored_used(&mut connection, &a).await, Some(1));

    // Structural errors, before any database work.
    let empty: [Check<'_, runlimit_core::FixedWindowPolicy>; 0] = [];
    assert!(matches!(
        limiter.check_all(&empty).await,
        Err(BatchCheckError::InvalidBatch(BatchError::EmptyBatch))
    ));
    assert!(matches!(
        limiter.check_all(&[a, sb]).await,
        Err(BatchCheckError::InvalidBatch(BatchError::MixedQuotaModes { index: 1, mode: QuotaMode::Shadow }))
    ));
    assert!(matches!(
        limiter.check_all(&[a, b, a]).await,
        Err(BatchCheckError::InvalidBatch(BatchError::DuplicateCounterKey {
            first_index: 0,
            duplicate_index: 2
        }))
    ));
    let many: Vec<_> = (0..65).map(|n| check(&wide, subject(7, n))).collect();
    assert!(matches!(
        limiter.check_all(&many).await,
        Err(BatchCheckError::InvalidBatch(BatchError::TooManyChecks { batch_size: 65, maximum: 64 }))
    ));
    assert_eq!(PostgresLimiter::<()>::MAX_BATCH_SIZE, 64);

    // A full-size batch of new keys spread over shards is one transaction.
    let full: Vec<_> =
        (0..64).map(|n| check(&wide, subject(u8::try_from(n % 7).unwrap(), 100 + n))).collect();
    let decision = limiter.check_all(&full).await.unwrap();
    let BatchDecisionView::Allowed { allowances } = decision.view() else { panic!("{decision:?}") };
    assert_eq!(allowances.len(), 64);
    assert!(allowances.iter().all(|allowance| allowance.available() == 4));
    let stored: i64 = sqlx::query_scalar("SELECT count(*) FROM public.runlimit_fixed_windows")
        .fetch_one(&mut connection)
        .await
        .unwrap();
    assert_eq!(stored, 2 + 64);
    db.finish().await;
}

fn assert_send<T: Send>(_: &T) {}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs RUNLIMIT_POSTGRES_TEST_DATABASE_URL"]
async fn futures_are_send_and_consume_only_when_polled() {
    let db = TestDatabase::create("unpolled").await;
    let limiter = db.limiter(4).await;
    let policy = policy("rules.unpolled", 2, Duration::from_secs(60));
    let check = check(&policy, subject(9, 1));

    let unpolled = Limiter::check(&limiter, &check);
    assert_send(&unpolled);
    drop(unpolled);
    let batch = [check];
    let unpolled_batch = Limiter::check_all(&limiter, &batch);
    assert_send(&unpolled_batch);
    drop(unpolled_batch);
    let cleanup = limiter.cleanup_expired(10);
    assert_send(&cleanup);
    drop(cleanup);
    let mut connection = db.connection().await;
    assert_eq!(stored_used(&mut connection, &check).await, None);

    // Generic code over Limiter, through `&L` and `Arc<L>`.
    async fn admit<L: Limiter>(limiter: &L, checks: &[Check<'_, L::Policy>]) -> bool {
        limiter.check_all(checks).await.is_ok_and(|decision| decision.permits_request())
    }
    assert!(admit(&limiter, &batch).await);
    assert!(admit(&std::sync::Arc::new(limiter.clone()), &batch).await);
    assert!(!admit(&&limiter, &batch).await);
    assert_eq!(stored_used(&mut connection, &check).await, Some(2));
    db.finish().await;
}
