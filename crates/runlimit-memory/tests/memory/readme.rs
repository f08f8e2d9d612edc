//! The product description's examples, compiled against this crate as an external consumer
//! would write them (`?` into `Box<dyn Error>`).

use std::{error::Error, time::Duration};

use runlimit_core::{
    BatchDecisionView, Check, Denial, FixedWindowPolicy, GcraPolicy, KeyHasher, PolicyId, ScopeId,
};
use runlimit_memory::{GcraStore, MemoryStore, MemoryStoreConfig};

#[test]
fn fixed_window_batch_example() -> Result<(), Box<dyn Error>> {
    let client_policy = FixedWindowPolicy::new(
        PolicyId::new("auth.login")?,
        ScopeId::new("client")?,
        40,
        Duration::from_secs(60),
    )?;
    let identity_policy = FixedWindowPolicy::new(
        PolicyId::new("auth.login")?,
        ScopeId::new("identity")?,
        8,
        Duration::from_secs(60),
    )?;
    let secret = "0123456789abcdef0123456789abcdef-test";
    let key_hasher = KeyHasher::new(secret.as_bytes())?;
    let client = key_hasher.hash_for(&client_policy, b"client-network:192.0.2.4");
    let identity = key_hasher.hash_for(&identity_policy, b"user@example.test");
    let config = MemoryStoreConfig::new(50_000)?.with_shard_count(64)?;
    let limiter = MemoryStore::new(config);
    let checks = [Check::new(client), Check::new(identity)];
    let decision = limiter.check_all(&checks)?;
    let admitted = match decision.view() {
        BatchDecisionView::Allowed { allowances } => {
            assert_eq!(allowances.len(), checks.len());
            true
        }
        BatchDecisionView::Denied { denial: Denial::QuotaExceeded(quota), .. } => {
            quota.retry_after().seconds() == 0
        }
        BatchDecisionView::Denied { denial: Denial::StorageCapacity { .. }, .. } => false,
        BatchDecisionView::ShadowDenied { .. } => true,
    };
    assert!(admitted);
    for _ in 0..7 {
        assert!(limiter.check_all(&checks)?.permits_request());
    }
    let BatchDecisionView::Denied { index: 1, batch_size: 2, .. } = limiter.check_all(&checks)?.view() else {
        panic!("the identity quota of 8 is exhausted")
    };
    Ok(())
}

#[test]
fn gcra_example() -> Result<(), Box<dyn Error>> {
    let policy = GcraPolicy::new(
        PolicyId::new("api.read")?,
        ScopeId::new("client")?,
        10,                     // units replenished
        Duration::from_secs(1), // during this period
        20,                     // maximum immediate burst
    )?;
    let key_hasher = KeyHasher::new(b"0123456789abcdef0123456789abcdef-test")?;
    let limiter = GcraStore::new(MemoryStoreConfig::new(50_000)?);
    let decision = limiter.check(&Check::new(key_hasher.hash_for(&policy, b"client-network:192.0.2.4")))?;
    assert!(decision.permits_request());
    Ok(())
}
