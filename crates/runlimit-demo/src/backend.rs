//! Runtime backend selection: application enums implementing [`Limiter`].
//!
//! `Limiter` is not object-safe (its methods return `impl Future`), so runtime selection is
//! an application-owned enum whose `Limiter` implementation dispatches to the chosen
//! backend, as the Runlimit documentation recommends. Each enum has its own error types
//! listing every backend's failure as a named variant.

use std::{fmt, sync::Arc, time::Duration};

use runlimit_core::{
    AttemptSubject, BatchDecision, Check, ConsumptionStatus, Decision, FixedWindowPolicy, GcraPolicy,
    Limiter,
    attempts::{AttemptCompletionResult, AttemptDecision, AttemptOutcome},
};
use runlimit_memory::{
    GcraBatchError, GcraCheckError, GcraStore, MemoryAttemptLimiter, MemoryAttemptReceipt, MemoryBatchError,
    MemoryStore, MemoryStoreStats, PoisonedShardError, SystemClock,
};
use runlimit_postgres::{
    BatchCheckError, CheckError, PostgresGcraLimiter, PostgresLimiter,
    attempts::{PostgresAttemptLimiter, PostgresAttemptReceipt},
};
use serde::Serialize;
use tokio::task::JoinHandle;

use crate::observe::{DemoObserver, ErrorChain};

/// The store of the per-client `login-client` gate: always process-local and hard-bounded.
pub type ClientStore = MemoryStore<SystemClock, DemoObserver>;

/// The backend of the `login-identity` gate.
pub enum IdentityLimiter {
    /// Process-local (no `--database-url`): each replica counts on its own.
    Memory(MemoryStore<SystemClock, DemoObserver>),
    /// Shared by every replica using the database (`--database-url`).
    Postgres(PostgresLimiter<DemoObserver>),
}

/// Why the identity gate could not evaluate a check. The request is refused (503).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum IdentityCheckError {
    /// A memory shard is poisoned.
    #[error("memory identity store unavailable")]
    Memory {
        /// The store's error.
        #[source]
        source: PoisonedShardError,
    },
    /// PostgreSQL failed; see [`CheckError::consumption`] for whether quota may have been
    /// consumed (never retried automatically).
    #[error("postgresql identity store unavailable")]
    Postgres {
        /// The backend's error.
        #[source]
        source: CheckError,
    },
}

/// Why the identity gate could not evaluate a batch (the demo only sends single checks; the
/// batch path exists because [`Limiter`] requires it).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum IdentityBatchError {
    /// The memory store rejected the batch.
    #[error("memory identity store rejected the batch")]
    Memory {
        /// The store's error.
        #[source]
        source: MemoryBatchError,
    },
    /// PostgreSQL rejected or failed the batch.
    #[error("postgresql identity store rejected the batch")]
    Postgres {
        /// The backend's error.
        #[source]
        source: BatchCheckError,
    },
}

impl Limiter for IdentityLimiter {
    type Policy = FixedWindowPolicy;
    type CheckError = IdentityCheckError;
    type CheckAllError = IdentityBatchError;

    async fn check(&self, check: &Check<'_, FixedWindowPolicy>) -> Result<Decision, IdentityCheckError> {
        match self {
            Self::Memory(store) => store.check(check).map_err(|source| IdentityCheckError::Memory { source }),
            Self::Postgres(limiter) => {
                limiter.check(check).await.map_err(|source| IdentityCheckError::Postgres { source })
            }
        }
    }

    async fn check_all(
        &self,
        checks: &[Check<'_, FixedWindowPolicy>],
    ) -> Result<BatchDecision, IdentityBatchError> {
        match self {
            Self::Memory(store) => {
                store.check_all(checks).map_err(|source| IdentityBatchError::Memory { source })
            }
            Self::Postgres(limiter) => {
                limiter.check_all(checks).await.map_err(|source| IdentityBatchError::Postgres { source })
            }
        }
    }
}

impl fmt::Debug for IdentityLimiter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Memory(_) => f.write_str("IdentityLimiter::Memory"),
            Self::Postgres(_) => f.write_str("IdentityLimiter::Postgres"),
        }
    }
}

/// The backend of the `items` GCRA gate.
///
/// Runtime selection between the process-local [`GcraStore`] and the shared
/// [`PostgresGcraLimiter`] (issue 5), both `Limiter<Policy = GcraPolicy>` and fed the same
/// policy-bound checks.
pub enum ItemsLimiter {
    /// Process-local GCRA (no `--database-url`): each replica has its own burst.
    Memory(GcraStore<SystemClock, DemoObserver>),
    /// Shared by every replica using the database (`--database-url`), migrated at start.
    Postgres(PostgresGcraLimiter<DemoObserver>),
}

/// Why the items gate could not evaluate a check. The request is refused (503).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ItemsCheckError {
    /// The memory GCRA store failed.
    #[error("memory gcra store unavailable")]
    Memory {
        /// The store's error.
        #[source]
        source: GcraCheckError,
    },
    /// PostgreSQL failed; see [`CheckError::consumption`] for whether quota may have been
    /// consumed (never retried automatically).
    #[error("postgresql gcra store unavailable")]
    Postgres {
        /// The backend's error.
        #[source]
        source: CheckError,
    },
}

/// Why the items gate could not evaluate a batch.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ItemsBatchError {
    /// The memory GCRA store rejected the batch.
    #[error("memory gcra store rejected the batch")]
    Memory {
        /// The store's error.
        #[source]
        source: GcraBatchError,
    },
    /// PostgreSQL rejected or failed the batch.
    #[error("postgresql gcra store rejected the batch")]
    Postgres {
        /// The backend's error.
        #[source]
        source: BatchCheckError,
    },
}

impl Limiter for ItemsLimiter {
    type Policy = GcraPolicy;
    type CheckError = ItemsCheckError;
    type CheckAllError = ItemsBatchError;

    async fn check(&self, check: &Check<'_, GcraPolicy>) -> Result<Decision, ItemsCheckError> {
        match self {
            Self::Memory(store) => store.check(check).map_err(|source| ItemsCheckError::Memory { source }),
            Self::Postgres(limiter) => {
                limiter.check(check).await.map_err(|source| ItemsCheckError::Postgres { source })
            }
        }
    }

    async fn check_all(&self, checks: &[Check<'_, GcraPolicy>]) -> Result<BatchDecision, ItemsBatchError> {
        match self {
            Self::Memory(store) => {
                store.check_all(checks).map_err(|source| ItemsBatchError::Memory { source })
            }
            Self::Postgres(limiter) => {
                limiter.check_all(checks).await.map_err(|source| ItemsBatchError::Postgres { source })
            }
        }
    }
}

impl fmt::Debug for ItemsLimiter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Memory(_) => f.write_str("ItemsLimiter::Memory"),
            Self::Postgres(_) => f.write_str("ItemsLimiter::Postgres"),
        }
    }
}

/// The backend of the `login-attempts` password-check attempt limiter (issue 7): at most one
/// password check in flight per normalized identity, and after each failure an exponential
/// backoff (`runlimit_core::attempts::AttemptPolicy`).
///
/// Not a [`Limiter`]: an attempt is admitted with a receipt and later completed with its
/// outcome, so the enum has its own [`acquire`](Self::acquire) and
/// [`complete`](Self::complete).
pub enum LoginAttempts {
    /// Process-local (no `--database-url`): each replica keeps its own backoff state.
    Memory(MemoryAttemptLimiter<SystemClock, DemoObserver>),
    /// Shared by every replica using the database (`--database-url`), migrated at start.
    Postgres(PostgresAttemptLimiter<DemoObserver>),
}

/// The receipt of an admitted password-check attempt, from [`LoginAttempts::acquire`];
/// complete it with [`LoginAttempts::complete`]. Dropping it is no refund: the lease expires
/// as a failure at its deadline.
#[must_use = "complete the receipt; dropping it counts as a failure at the lease deadline"]
#[derive(Debug)]
pub enum LoginAttemptReceipt {
    /// From [`LoginAttempts::Memory`].
    Memory(MemoryAttemptReceipt),
    /// From [`LoginAttempts::Postgres`].
    Postgres(PostgresAttemptReceipt),
}

/// Why an attempt could not be admitted or denied. Nothing was admitted, except after a
/// PostgreSQL error whose [`consumption`](Self::consumption) is `MayHaveBeenConsumed` (then a
/// lease may exist whose receipt is lost; it expires as a failure). Never retried
/// automatically; the request is refused (503).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AttemptAcquireError {
    /// A memory shard is poisoned.
    #[error("memory attempt limiter unavailable")]
    Memory {
        /// The limiter's error.
        #[source]
        source: PoisonedShardError,
    },
    /// PostgreSQL failed.
    #[error("postgresql attempt limiter unavailable")]
    Postgres {
        /// The backend's error.
        #[source]
        source: CheckError,
    },
}

/// Why an attempt's outcome could not be recorded. Unless [`consumption`](Self::consumption)
/// is `MayHaveBeenConsumed`, nothing was recorded and the lease expires as a failure at its
/// deadline. Never retried automatically; the request is refused (503).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AttemptCompleteError {
    /// A memory shard is poisoned.
    #[error("memory attempt limiter unavailable")]
    Memory {
        /// The limiter's error.
        #[source]
        source: PoisonedShardError,
    },
    /// PostgreSQL failed.
    #[error("postgresql attempt limiter unavailable")]
    Postgres {
        /// The backend's error.
        #[source]
        source: CheckError,
    },
}

impl AttemptAcquireError {
    /// Whether the failed admission may have leased an attempt: `MayHaveBeenConsumed` only for
    /// a PostgreSQL commit with an unknown outcome, `NotConsumed` otherwise.
    #[must_use]
    pub fn consumption(&self) -> ConsumptionStatus {
        match self {
            Self::Memory { .. } => ConsumptionStatus::NotConsumed,
            Self::Postgres { source } => source.consumption(),
        }
    }
}

impl AttemptCompleteError {
    /// Whether the failed completion may have been recorded: `MayHaveBeenConsumed` only for a
    /// PostgreSQL commit with an unknown outcome, `NotConsumed` otherwise.
    #[must_use]
    pub fn consumption(&self) -> ConsumptionStatus {
        match self {
            Self::Memory { .. } => ConsumptionStatus::NotConsumed,
            Self::Postgres { source } => source.consumption(),
        }
    }
}

impl LoginAttempts {
    /// Admits a password-check attempt for `subject` (from
    /// [`KeyHasher::hash_attempt_for`](runlimit_core::KeyHasher::hash_attempt_for)) or says
    /// why not: [`AttemptDecision::Admitted`] with a receipt holding a lease, or
    /// [`AttemptDecision::Denied`] (`InProgress`, `Backoff` or `StorageCapacity`, delays in
    /// whole milliseconds of the backend's clock). In PostgreSQL mode this is one committed
    /// transaction, finished before it returns.
    ///
    /// # Errors
    ///
    /// [`AttemptAcquireError::Memory`] for a poisoned shard, [`AttemptAcquireError::Postgres`]
    /// for any database failure.
    pub async fn acquire(
        &self,
        subject: &AttemptSubject<'_>,
    ) -> Result<AttemptDecision<LoginAttemptReceipt>, AttemptAcquireError> {
        match self {
            Self::Memory(limiter) => match limiter.acquire(subject) {
                Ok(AttemptDecision::Admitted(receipt)) => {
                    Ok(AttemptDecision::Admitted(LoginAttemptReceipt::Memory(receipt)))
                }
                Ok(AttemptDecision::Denied(denial)) => Ok(AttemptDecision::Denied(denial)),
                Err(source) => Err(AttemptAcquireError::Memory { source }),
            },
            Self::Postgres(limiter) => match limiter.acquire(subject).await {
                Ok(AttemptDecision::Admitted(receipt)) => {
                    Ok(AttemptDecision::Admitted(LoginAttemptReceipt::Postgres(receipt)))
                }
                Ok(AttemptDecision::Denied(denial)) => Ok(AttemptDecision::Denied(denial)),
                Err(source) => Err(AttemptAcquireError::Postgres { source }),
            },
        }
    }

    /// Records `outcome` for the attempt of `receipt`, consuming it:
    /// [`AttemptCompletionResult::Reset`] after a success,
    /// [`AttemptCompletionResult::FailureRecorded`] after a failure, or
    /// [`AttemptCompletionResult::Stale`] when the lease had expired or was superseded
    /// (nothing recorded). A receipt from the other backend's variant (impossible in the demo,
    /// whose two limiters are never mixed) is `Stale` too, as a foreign receipt is for each
    /// backend; it is dropped and its lease expires as a failure.
    ///
    /// # Errors
    ///
    /// [`AttemptCompleteError::Memory`] for a poisoned shard, [`AttemptCompleteError::Postgres`]
    /// for any database failure (see [`AttemptCompleteError::consumption`]).
    pub async fn complete(
        &self,
        receipt: LoginAttemptReceipt,
        outcome: AttemptOutcome,
    ) -> Result<AttemptCompletionResult, AttemptCompleteError> {
        match (self, receipt) {
            (Self::Memory(limiter), LoginAttemptReceipt::Memory(receipt)) => {
                limiter.complete(receipt, outcome).map_err(|source| AttemptCompleteError::Memory { source })
            }
            (Self::Postgres(limiter), LoginAttemptReceipt::Postgres(receipt)) => limiter
                .complete(receipt, outcome)
                .await
                .map_err(|source| AttemptCompleteError::Postgres { source }),
            (Self::Memory(_), LoginAttemptReceipt::Postgres(_))
            | (Self::Postgres(_), LoginAttemptReceipt::Memory(_)) => Ok(AttemptCompletionResult::Stale),
        }
    }
}

impl fmt::Debug for LoginAttempts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Memory(_) => f.write_str("LoginAttempts::Memory"),
            Self::Postgres(_) => f.write_str("LoginAttempts::Postgres"),
        }
    }
}

/// Every limiter the demo checks, shared by the layers, the login handler and `/healthz`.
#[derive(Clone, Debug)]
pub struct Backends {
    /// The `login-client` gate's store.
    pub client: Arc<ClientStore>,
    /// The `login-identity` gate's backend.
    pub identity: Arc<IdentityLimiter>,
    /// The `items` gate's backend.
    pub items: Arc<ItemsLimiter>,
    /// The `login-attempts` password-check attempt limiter.
    pub attempts: Arc<LoginAttempts>,
}

/// What `GET /healthz` answers, as JSON: `{"status":"ready","backend":"memory"}`, or
/// `{"status":"unavailable","backend":"postgres","reason":"..."}` with 503.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Readiness {
    /// `"ready"` or `"unavailable"`.
    pub status: &'static str,
    /// The backend of the shared gates: `"memory"` or `"postgres"`.
    pub backend: &'static str,
    /// Why the service is unavailable; absent when ready.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

impl Readiness {
    /// True when every backend on the fail-closed path is usable.
    #[must_use]
    pub fn is_ready(&self) -> bool {
        self.reason.is_none()
    }

    fn ready(backend: &'static str) -> Self {
        Self { status: "ready", backend, reason: None }
    }

    fn unavailable(backend: &'static str, reason: String) -> Self {
        Self { status: "unavailable", backend, reason: Some(reason) }
    }
}

fn poisoned(stats: &MemoryStoreStats) -> usize {
    stats.poisoned_shards()
}

impl Backends {
    /// The backend label of the shared gates, `"memory"` or `"postgres"`.
    #[must_use]
    pub fn label(&self) -> &'static str {
        match *self.identity {
            IdentityLimiter::Memory(_) => "memory",
            IdentityLimiter::Postgres(_) => "postgres",
        }
    }

    /// Readiness of every backend a request may need: no memory store may have a poisoned
    /// shard (every admission touching one fails closed), and in PostgreSQL mode the database
    /// of every PostgreSQL-backed gate must answer `SELECT 1` within `timeout` (the attempt
    /// limiter shares that pool). A poisoned shard of the in-memory attempt limiter is not
    /// seen here: `MemoryAttemptLimiter` exposes no shard statistics (its admissions still
    /// fail closed with 503).
    pub async fn readiness(&self, timeout: Duration) -> Readiness {
        let label = self.label();
        let mut poisoned_shards = poisoned(&self.client.stats());
        match &*self.identity {
            IdentityLimiter::Memory(store) => poisoned_shards += poisoned(&store.stats()),
            IdentityLimiter::Postgres(limiter) => {
                if let Err(reason) = probe(limiter.pool(), timeout).await {
                    return Readiness::unavailable(label, reason);
                }
            }
        }
        match &*self.items {
            ItemsLimiter::Memory(store) => poisoned_shards += poisoned(&store.stats()),
            ItemsLimiter::Postgres(limiter) => {
                if let Err(reason) = probe(limiter.pool(), timeout).await {
                    return Readiness::unavailable(label, reason);
                }
            }
        }
        if poisoned_shards > 0 {
            return Readiness::unavailable(
                label,
                format!("{poisoned_shards} memory store shard(s) poisoned"),
            );
        }
        Readiness::ready(label)
    }
}

/// `SELECT 1` on `pool` within `timeout`; the `Err` is the readiness reason.
async fn probe(pool: &sqlx::PgPool, timeout: Duration) -> Result<(), String> {
    match tokio::time::timeout(timeout, sqlx::query("SELECT 1").execute(pool)).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(error)) => {
            tracing::warn!(error = %ErrorChain(&error), "readiness probe failed");
            Err("database query failed".to_owned())
        }
        Err(_) => Err(format!("database did not answer within {} ms", timeout.as_millis())),
    }
}

impl Backends {
    /// In PostgreSQL mode, spawns the periodic bounded cleanup of expired rows: every
    /// `interval`, `cleanup_expired(CLEANUP_BATCH_ROWS)` on the fixed-window identity limiter,
    /// then on the GCRA items limiter (expiry alone does not free a capacity-ledger slot).
    /// Failures are logged and retried at the next tick, never immediately. `None` in memory
    /// mode, whose stores clean up on every check. The attempt limiter needs no task: its
    /// admissions reclaim expired rows of their shard.
    #[must_use]
    pub fn spawn_maintenance(&self, interval: Duration) -> Option<JoinHandle<()>> {
        /// Rows removed per cleanup pass and limiter at most.
        const CLEANUP_BATCH_ROWS: u32 = 1_000;

        let postgres = matches!(*self.identity, IdentityLimiter::Postgres(_))
            || matches!(*self.items, ItemsLimiter::Postgres(_));
        if !postgres {
            return None;
        }
        let identity = Arc::clone(&self.identity);
        let items = Arc::clone(&self.items);
        Some(tokio::spawn(async move {
            let mut ticks = tokio::time::interval(interval);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                ticks.tick().await;
                if let IdentityLimiter::Postgres(limiter) = &*identity {
                    log_cleanup("fixed_window", limiter.cleanup_expired(CLEANUP_BATCH_ROWS).await);
                }
                if let ItemsLimiter::Postgres(limiter) = &*items {
                    log_cleanup("gcra", limiter.cleanup_expired(CLEANUP_BATCH_ROWS).await);
                }
            }
        }))
    }
}

fn log_cleanup(table: &'static str, result: Result<u64, runlimit_postgres::MaintenanceError>) {
    match result {
        Ok(removed) => tracing::debug!(table, removed, "expired rows removed"),
        Err(error) => tracing::warn!(
            table,
            error = %ErrorChain(&error),
            may_have_removed_rows = error.may_have_removed_rows(),
            "cleanup of expired rows failed"
        ),
    }
}
