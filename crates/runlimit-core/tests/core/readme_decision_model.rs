//! The decision-model example ("Decision::view() returns an exhaustive DecisionView"), also in
//! the crate docs, copied verbatim, with the exact string
//! it produces for each of the four outcomes.

use std::time::Duration;

use runlimit_core::{
    Allowance, Capacity, Decision, Delay, Denial, GcraPolicy, PolicyId, QuotaDenial, QuotaMode, ScopeId,
    backend::gcra::{GcraOutcome, GcraParameters, evaluate},
};

// ---- verbatim from the spec ----
use runlimit_core::DecisionView;

#[rustfmt::skip]
fn describe(decision: &Decision) -> String {
    match decision.view() {
        DecisionView::Allowed { allowance } => format!(
            "admitted; {} of {} left",
            allowance.available(),
            allowance.capacity(),
        ),
        DecisionView::ShadowDenied { denial } => format!(
            "admitted; quota of {} would have denied for {}s",
            denial.capacity(),
            denial.retry_after().seconds(),
        ),
        DecisionView::Denied {
            denial: Denial::QuotaExceeded(quota),
        } => format!("rejected; retry after {}s", quota.retry_after().seconds()),
        DecisionView::Denied {
            denial: Denial::StorageCapacity { retry_after },
        } => match retry_after {
            Some(retry_after) => format!("rejected; backend full for {}s", retry_after.seconds()),
            None => "rejected; backend full".to_owned(),
        },
    }
}
// ---- end of the spec's example ----

fn capacity(units: u64) -> Capacity {
    Capacity::new(units).unwrap()
}

#[test]
fn allowed() {
    let decision = Decision::allowed(Allowance::new(capacity(5), 4, Delay::from_millis(60_000)).unwrap());
    assert_eq!(describe(&decision), "admitted; 4 of 5 left");
    let exhausted = Decision::allowed(Allowance::new(capacity(5), 0, Delay::from_millis(1)).unwrap());
    assert_eq!(describe(&exhausted), "admitted; 0 of 5 left");
    assert!(decision.permits_request());
}

#[test]
fn shadow_denied() {
    let denial = QuotaDenial::new(capacity(5), Delay::from_millis(1_500));
    let decision = Decision::quota_exceeded(denial, QuotaMode::Shadow);
    // 1.5 s rounds up to 2 whole seconds.
    assert_eq!(describe(&decision), "admitted; quota of 5 would have denied for 2s");
    assert!(decision.permits_request());
}

#[test]
fn quota_exceeded() {
    let denial = QuotaDenial::new(capacity(5), Delay::from_millis(1_001));
    let decision = Decision::quota_exceeded(denial, QuotaMode::Enforce);
    assert_eq!(describe(&decision), "rejected; retry after 2s");
    let exact =
        Decision::denied(Denial::QuotaExceeded(QuotaDenial::new(capacity(5), Delay::from_millis(3_000))));
    assert_eq!(describe(&exact), "rejected; retry after 3s");
    assert!(!decision.permits_request());
}

#[test]
fn storage_capacity() {
    let with_expiry = Decision::denied(Denial::StorageCapacity {
        retry_after: Some(Delay::from_duration(Duration::from_nanos(1))),
    });
    assert_eq!(describe(&with_expiry), "rejected; backend full for 1s");
    let unknown = Decision::denied(Denial::StorageCapacity { retry_after: None });
    assert_eq!(describe(&unknown), "rejected; backend full");
    assert!(!with_expiry.permits_request());
    assert!(!unknown.permits_request());
}

#[test]
fn from_real_gcra_outcomes() {
    // reference vector V2 (runlimit_core::backend::gcra): Q = 3 per 1000 ms, burst 2.
    let policy = GcraPolicy::new(
        PolicyId::new("api").unwrap(),
        ScopeId::new("client").unwrap(),
        3,
        Duration::from_secs(1),
        2,
    )
    .unwrap();
    let parameters = *GcraParameters::of(&policy);
    let first = evaluate(&parameters, None, 0, 1).unwrap();
    let decision = Decision::allowed(first.allowance(&parameters).unwrap());
    assert_eq!(describe(&decision), "admitted; 1 of 2 left");

    let GcraOutcome::Allowed { tat, .. } = first else { panic!("first request is allowed") };
    let GcraOutcome::Allowed { tat, .. } = evaluate(&parameters, Some(tat), 0, 1).unwrap() else {
        panic!("second request is allowed")
    };
    let denied = evaluate(&parameters, Some(tat), 0, 1).unwrap();
    let quota = denied.quota_denial(&parameters).unwrap();
    assert_eq!(quota.retry_after(), Delay::from_millis(334));
    assert_eq!(describe(&Decision::quota_exceeded(quota, QuotaMode::Enforce)), "rejected; retry after 1s");
    assert_eq!(
        describe(&Decision::quota_exceeded(quota, QuotaMode::Shadow)),
        "admitted; quota of 2 would have denied for 1s"
    );
}
