//! The client + identity login gate as one atomic batch: `cargo run -p runlimit-memory
//! --example login_batch`.
//!
//! A login is checked against two quotas at once: 5 attempts per client network and 2 per
//! identity, per minute. `check_all` admits only when both allow, and consumes from both or
//! from neither: a login refused by the identity quota spends nothing of the client's, which
//! the printed peeks show.

use std::time::Duration;

use runlimit_core::{BatchDecisionView, Check, Denial, FixedWindowPolicy, KeyHasher, PolicyId, ScopeId};
use runlimit_memory::{MemoryStore, MemoryStoreConfig};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let client = FixedWindowPolicy::new(
        PolicyId::new("auth.login")?,
        ScopeId::new("client")?,
        5,
        Duration::from_secs(60),
    )?;
    let identity = FixedWindowPolicy::new(
        PolicyId::new("auth.login")?,
        ScopeId::new("identity")?,
        2,
        Duration::from_secs(60),
    )?;
    // In production the secret comes from a secret store and is the same on every replica.
    let hasher = KeyHasher::new(b"example secret: 32 bytes or more, never this one")?;
    let store = MemoryStore::new(MemoryStoreConfig::new(10_000)?);

    // Address extraction and identity normalization are the application's.
    let network = b"client-network:192.0.2.0/24";
    for (attempt, user) in
        ["alice@example.test", "alice@example.test", "alice@example.test", "bob@example.test"]
            .into_iter()
            .enumerate()
    {
        let checks = [
            Check::new(hasher.hash_for(&client, network)),
            Check::new(hasher.hash_for(&identity, user.as_bytes())),
        ];
        let outcome = match store.check_all(&checks)?.view() {
            BatchDecisionView::Allowed { allowances } => {
                format!(
                    "admitted (client {} left, identity {} left)",
                    allowances[0].available(),
                    allowances[1].available()
                )
            }
            BatchDecisionView::Denied { index, denial: Denial::QuotaExceeded(quota), .. } => format!(
                "refused by the {} quota; retry after {} s; nothing consumed",
                if index == 0 { "client" } else { "identity" },
                quota.retry_after().seconds()
            ),
            BatchDecisionView::Denied { denial: Denial::StorageCapacity { .. }, .. } => {
                "refused: the store is full".to_owned()
            }
            BatchDecisionView::ShadowDenied { .. } => {
                "admitted (a shadow quota would have refused)".to_owned()
            }
        };
        let client_left = store.peek(hasher.hash_for(&client, network))?.available();
        println!("login {} as {user}: {outcome}; the client quota now has {client_left} left", attempt + 1);
    }
    Ok(())
}
