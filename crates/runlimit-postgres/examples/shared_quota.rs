//! One quota shared by two replicas through PostgreSQL:
//! `DATABASE_URL=postgres://postgres@127.0.0.1:5432/runlimit_example cargo run -p runlimit-postgres --example shared_quota`
//! (after `psql -h 127.0.0.1 -U postgres -c 'CREATE DATABASE runlimit_example'`: the example
//! leaves the tables of the migrations it applies, and a counter row, in that database).
//!
//! Two limiters with their own connection pools stand for two replicas of a service. They
//! take turns checking one API key against 4 exports per minute: the quota is counted once,
//! in the database, so the fifth check is refused whichever replica makes it. The example
//! applies Runlimit's migrations to the database first (they are additive and idempotent) and
//! uses a fresh key on every run.

use std::time::{Duration, SystemTime};

use runlimit_core::{Check, DecisionView, Denial, FixedWindowPolicy, KeyHasher, PolicyId, ScopeId};
use runlimit_postgres::PostgresLimiter;
use sqlx::postgres::PgPoolOptions;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Unset and empty alike: an empty URL would only say `RelativeUrlWithoutBase`.
    let url = std::env::var("DATABASE_URL").ok().filter(|url| !url.is_empty()).ok_or(
        "set DATABASE_URL to a PostgreSQL database this example may add tables to, for example \
         DATABASE_URL=postgres://postgres@127.0.0.1:5432/runlimit_example (after CREATE DATABASE \
         runlimit_example)",
    )?;
    let mut replicas = Vec::new();
    for _ in 0..2 {
        let pool = PgPoolOptions::new().max_connections(2).connect(&url).await?;
        replicas.push(PostgresLimiter::new(pool));
    }
    for replica in &replicas {
        replica.migrate().await?; // before serving traffic; a no-op once applied
    }

    let policy = FixedWindowPolicy::new(
        PolicyId::new("api.export")?,
        ScopeId::new("api-key")?,
        4,
        Duration::from_secs(60),
    )?;
    // Every replica must use the same secret, or they would count different keys.
    let hasher = KeyHasher::new(b"example secret: 32 bytes or more, never this one")?;
    let run = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH)?.as_nanos();
    let api_key = format!("api-key:example-{run}");

    for request in 0..6 {
        let replica = request % 2;
        let decision =
            replicas[replica].check(&Check::new(hasher.hash_for(&policy, api_key.as_bytes()))).await?;
        let outcome = match decision.view() {
            DecisionView::Allowed { allowance } => format!("admitted, {} left", allowance.available()),
            DecisionView::ShadowDenied { .. } => "admitted (shadow denial)".to_owned(),
            DecisionView::Denied { denial: Denial::QuotaExceeded(quota) } => {
                format!("refused, retry after {} s", quota.retry_after().seconds())
            }
            DecisionView::Denied { denial: Denial::StorageCapacity { .. } } => {
                "refused: storage full".to_owned()
            }
        };
        println!("export {} through replica {}: {outcome}", request + 1, replica + 1);
    }
    Ok(())
}
