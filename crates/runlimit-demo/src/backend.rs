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
use runlimit_redis::{PrepareError, RedisGcraLimiter, RedisLimiter, RedisStore};
use serde::Serialize;
use sqlx::PgPool;
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
    /// Shared by every replica using the Redis server and key prefix (`--redis-url`, which
    /// takes precedence over `--database-url` for this gate), prepared at start.
    Redis(RedisLimiter<DemoObserver>),
}

impl IdentityLimiter {
    /// The backend's label, as in logs, metrics and `/healthz`: `"memory"`, `"postgres"` or
    /// `"redis"`.
    #[must_use]
    pub fn label(&self) -> &'static str {
        match self {
            Self::Memory(_) => "memory",
            Self::Postgres(_) => "postgres",
            Self::Redis(_) => "redis",
        }
    }
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
    /// Redis failed; see [`runlimit_redis::CheckError::consumption`] for whether quota may
    /// have been consumed (never retried automatically).
    #[error("redis identity store unavailable")]
    Redis {
        /// The backend's error.
        #[source]
        source: runlimit_redis::CheckError,
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
    /// Redis rejected or failed the batch.
    #[error("redis identity store rejected the batch")]
    Redis {
        /// The backend's error.
        #[source]
        source: runlimit_redis::BatchCheckError,
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
            Self::Redis(limiter) => {
                limiter.check(check).await.map_err(|source| IdentityCheckError::Redis { source })
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
            Self::Redis(limiter) => {
                limiter.check_all(checks).await.map_err(|source| IdentityBatchError::Redis { source })
            }
        }
    }
}

impl fmt::Debug for IdentityLimiter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Memory(_) => f.write_str("IdentityLimiter::Memory"),
            Self::Postgres(_) => f.write_str("IdentityLimiter::Postgres"),
            Self::Redis(_) => f.write_str("IdentityLimiter::Redis"),
        }
    }
}

/// The backend of the `items` GCRA gate.
///
/// Runtime selection between the process-local [`GcraStore`] and the shared
/// [`PostgresGcraLimiter`] or [`RedisGcraLimiter`], all `Limiter<Policy =
/// GcraPolicy>` and fed the same policy-bound checks.
pub enum ItemsLimiter {
    /// Process-local GCRA (no `--database-url`): each replica has its own burst.
    Memory(GcraStore<SystemClock, DemoObserver>),
    /// Shared by every replica using the database (`--database-url`), migrated at start.
    Postgres(PostgresGcraLimiter<DemoObserver>),
    /// Shared by every replica using the Redis server and key prefix (`--redis-url`, which
    /// takes precedence over `--database-url` for this gate), prepared at start.
    Redis(RedisGcraLimiter<DemoObserver>),
}

impl ItemsLimiter {
    /// The backend's label, as in logs, metrics and `/healthz`: `"memory"`, `"postgres"` or
    /// `"redis"`.
    #[must_use]
    pub fn label(&self) -> &'static str {
        match self {
            Self::Memory(_) => "memory",
            Self::Postgres(_) => "postgres",
            Self::Redis(_) => "redis",
        }
    }
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
    /// Redis failed; see [`runlimit_redis::CheckError::consumption`] for whether quota may
    /// have been consumed (never retried automatically).
    #[error("redis gcra store unavailable")]
    Redis {
        /// The backend's error.
        #[source]
        source: runlimit_redis::CheckError,
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
    /// Redis rejected or failed the batch.
    #[error("redis gcra store rejected the batch")]
    Redis {
        /// The backend's error.
        #[source]
        source: runlimit_redis::BatchCheckError,
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
            Self::Redis(limiter) => {
                limiter.check(check).await.map_err(|source| ItemsCheckError::Redis { source })
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
            Self::Redis(limiter) => {
                limiter.check_all(checks).await.map_err(|source| ItemsBatchError::Redis { source })
            }
        }
    }
}

impl fmt::Debug for ItemsLimiter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Memory(_) => f.write_str("ItemsLimiter::Memory"),
            Self::Postgres(_) => f.write_str("ItemsLimiter::Postgres"),
            Self::Redis(_) => f.write_str("ItemsLimiter::Redis"),
        }
    }
}

/// The backend of the `login-attempts` password-check attempt limiter: at most one
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

impl LoginAttempts {
    /// The backend's label, as in logs, metrics and `/healthz`: `"memory"` or `"postgres"`
    /// (attempts never use Redis).
    #[must_use]
    pub fn label(&self) -> &'static str {
        match self {
            Self::Memory(_) => "memory",
            Self::Postgres(_) => "postgres",
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
    /// The pool every PostgreSQL-backed limiter uses (`--database-url`), probed by
    /// [`readiness`](Self::readiness); `None` without a database.
    pub postgres: Option<PgPool>,
}

/// What `GET /healthz` answers, as JSON (200 when ready, 503 otherwise).
///
/// When the shared gates use one backend, memory, PostgreSQL or Redis:
///
/// ```text
/// {"status":"ready","backend":"redis"}
/// {"status":"unavailable","backend":"redis","reason":"redis probe failed"}
/// ```
///
/// With both `--redis-url` and `--database-url` (identity and items on Redis, attempts on
/// PostgreSQL) `backend` is `"redis+postgres"`, and `backends` lists every backend a login
/// needs, in the order a request meets them, with the gates each serves and its own status;
/// the top-level `reason` is the first unavailable backend's:
///
/// ```text
/// {"status":"unavailable","backend":"redis+postgres","reason":"database query failed","backends":[
///   {"backend":"memory","gates":["login-client"],"status":"ready"},
///   {"backend":"redis","gates":["login-identity","items"],"status":"ready"},
///   {"backend":"postgres","gates":["login-attempts"],"status":"unavailable","reason":"database query failed"}]}
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Readiness {
    /// `"ready"` or `"unavailable"`.
    pub status: &'static str,
    /// The backend of the shared gates ([`Backends::label`]): `"memory"`, `"postgres"`,
    /// `"redis"` or `"redis+postgres"`.
    pub backend: &'static str,
    /// Why the service is unavailable (the first unavailable backend's reason); absent when
    /// ready.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Each backend with the gates it serves, only when the shared gates use two backends
    /// (Redis and PostgreSQL); empty and not serialized otherwise.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub backends: Vec<BackendReadiness>,
}

/// One backend's readiness in [`Readiness::backends`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct BackendReadiness {
    /// `"memory"`, `"redis"` or `"postgres"`.
    pub backend: &'static str,
    /// The names of the gates it serves (`login-client`, `login-identity`, `items`,
    /// `login-attempts`).
    pub gates: Vec<&'static str>,
    /// `"ready"` or `"unavailable"`.
    pub status: &'static str,
    /// Why it is unavailable; absent when ready.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

impl Readiness {
    /// True when every backend on the fail-closed path is usable.
    #[must_use]
    pub fn is_ready(&self) -> bool {
        self.reason.is_none()
    }
}

fn status(result: &Result<(), String>) -> &'static str {
    if result.is_ok() { "ready" } else { "unavailable" }
}

fn poisoned(stats: &MemoryStoreStats) -> usize {
    stats.poisoned_shards()
}

impl Backends {
    /// The label of the shared gates' backends (identity, items, attempts): `"memory"` when
    /// all are in memory, otherwise the others: `"postgres"`, `"redis"` or `"redis+postgres"`.
    #[must_use]
    pub fn label(&self) -> &'static str {
        let labels = [self.identity.label(), self.items.label(), self.attempts.label()];
        match (labels.contains(&"redis"), labels.contains(&"postgres")) {
            (false, false) => "memory",
            (false, true) => "postgres",
            (true, false) => "redis",
            (true, true) => "redis+postgres",
        }
    }

    /// Each backend in use with the names of the gates it serves: memory first (the
    /// `login-client` gate is always there), then Redis, then PostgreSQL.
    fn gates_by_backend(&self) -> Vec<(&'static str, Vec<&'static str>)> {
        let gates = [
            ("login-client", "memory"),
            ("login-identity", self.identity.label()),
            ("items", self.items.label()),
            ("login-attempts", self.attempts.label()),
        ];
        ["memory", "redis", "postgres"]
            .into_iter()
            .map(|backend| {
                let served =
                    gates.iter().filter(|(_, used)| *used == backend).map(|(gate, _)| *gate).collect();
                (backend, served)
            })
            .filter(|(_, served): &(_, Vec<_>)| !served.is_empty())
            .collect()
    }

    /// Readiness of every backend a request may need, each probed within `timeout` (Redis and
    /// PostgreSQL concurrently):
    ///
    /// - memory: no store may have a poisoned shard (every admission touching one fails
    ///   closed). A poisoned shard of the in-memory attempt limiter is not seen here:
    ///   `MemoryAttemptLimiter` exposes no shard statistics (its admissions still fail closed
    ///   with 503).
    /// - Redis: [`RedisStore::prepare`] on each Redis limiter (each has its own connection):
    ///   the server answers, is Redis 7 or newer with `maxmemory-policy noeviction`, not in
    ///   cluster mode, and has the scripts loaded.
    /// - PostgreSQL: the pool answers `SELECT 1`.
    pub async fn readiness(&self, timeout: Duration) -> Readiness {
        let label = self.label();
        // Both Redis limiters at once (each has its own connection), so the probe takes at most
        // `timeout`; the identity limiter's reason first.
        let redis = async {
            let identity = async {
                match &*self.identity {
                    IdentityLimiter::Redis(limiter) => prepare(limiter, timeout).await,
                    _ => Ok(()),
                }
            };
            let items = async {
                match &*self.items {
                    ItemsLimiter::Redis(limiter) => prepare(limiter, timeout).await,
                    _ => Ok(()),
                }
            };
            let (identity, items) = tokio::join!(identity, items);
            identity.and(items)
        };
        let postgres = async {
            match &self.postgres {
                Some(pool) => probe(pool, timeout).await,
                None => Ok(()),
            }
        };
        let (redis, postgres) = tokio::join!(redis, postgres);
        let mut poisoned_shards = poisoned(&self.client.stats());
        if let IdentityLimiter::Memory(store) = &*self.identity {
            poisoned_shards += poisoned(&store.stats());
        }
        if let ItemsLimiter::Memory(store) = &*self.items {
            poisoned_shards += poisoned(&store.stats());
        }
        let memory = if poisoned_shards > 0 {
            Err(format!("{poisoned_shards} memory store shard(s) poisoned"))
        } else {
            Ok(())
        };

        let entries: Vec<BackendReadiness> = self
            .gates_by_backend()
            .into_iter()
            .map(|(backend, gates)| {
                let result = match backend {
                    "redis" => &redis,
                    "postgres" => &postgres,
                    _ => &memory,
                };
                BackendReadiness { backend, gates, status: status(result), reason: result.clone().err() }
            })
            .collect();
        // The shared backends' reasons first (a database that is down explains more than a
        // poisoned shard), then memory's.
        let reason = [&redis, &postgres, &memory].into_iter().find_map(|result| result.clone().err());
        let status = if reason.is_some() { "unavailable" } else { "ready" };
        let backends = if label == "redis+postgres" { entries } else { Vec::new() };
        Readiness { status, backend: label, reason, backends }
    }
}

/// [`RedisStore::prepare`] within `timeout`; the `Err` is the readiness reason (fixed texts:
/// the cause is logged, never shown).
async fn prepare<P, O>(limiter: &RedisStore<P, O>, timeout: Duration) -> Result<(), String>
where
    P: runlimit_redis::RedisAlgorithm,
    O: runlimit_core::Observer,
{
    match tokio::time::timeout(timeout, limiter.prepare()).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(error)) => {
            tracing::warn!(address = %limiter.address(), error = %ErrorChain(&error), "redis readiness probe failed");
            Err(match error {
                PrepareError::Unreachable(_) => "redis probe failed".to_owned(),
                _ => "redis server unsuitable".to_owned(),
            })
        }
        Err(_) => Err(format!("redis did not answer within {} ms", timeout.as_millis())),
    }
}

/// `SELECT 1` on `pool` within `timeout`; the `Err` is the readiness reason.
async fn probe(pool: &PgPool, timeout: Duration) -> Result<(), String> {
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
    /// With a PostgreSQL or Redis gate, spawns the periodic bounded cleanup of expired state:
    /// every `interval`, `cleanup_expired(1_000)` on the identity limiter (fixed windows), then
    /// on the items limiter (GCRA), whichever of them is in PostgreSQL or Redis (expiry alone
    /// does not free a PostgreSQL capacity-ledger slot or a Redis shard slot that no admission
    /// touches). Failures are logged and retried at the next tick, never immediately. `None`
    /// when both are in memory, whose stores clean up on every check. The attempt limiter
    /// needs no task: its admissions reclaim expired state of their shard.
    #[must_use]
    pub fn spawn_maintenance(&self, interval: Duration) -> Option<JoinHandle<()>> {
        /// Entries removed per cleanup pass and limiter at most.
        const CLEANUP_BATCH: u32 = 1_000;

        let shared = !matches!(*self.identity, IdentityLimiter::Memory(_))
            || !matches!(*self.items, ItemsLimiter::Memory(_));
        if !shared {
            return None;
        }
        let identity = Arc::clone(&self.identity);
        let items = Arc::clone(&self.items);
        Some(tokio::spawn(async move {
            let mut ticks = tokio::time::interval(interval);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                ticks.tick().await;
                match &*identity {
                    IdentityLimiter::Memory(_) => {}
                    IdentityLimiter::Postgres(limiter) => log_cleanup(
                        "postgres",
                        "fixed_window",
                        limiter.cleanup_expired(CLEANUP_BATCH).await,
                        runlimit_postgres::MaintenanceError::may_have_removed_rows,
                    ),
                    IdentityLimiter::Redis(limiter) => log_cleanup(
                        "redis",
                        "fixed_window",
                        limiter.cleanup_expired(CLEANUP_BATCH).await,
                        runlimit_redis::MaintenanceError::may_have_removed_entries,
                    ),
                }
                match &*items {
                    ItemsLimiter::Memory(_) => {}
                    ItemsLimiter::Postgres(limiter) => log_cleanup(
                        "postgres",
                        "gcra",
                        limiter.cleanup_expired(CLEANUP_BATCH).await,
                        runlimit_postgres::MaintenanceError::may_have_removed_rows,
                    ),
                    ItemsLimiter::Redis(limiter) => log_cleanup(
                        "redis",
                        "gcra",
                        limiter.cleanup_expired(CLEANUP_BATCH).await,
                        runlimit_redis::MaintenanceError::may_have_removed_entries,
                    ),
                }
            }
        }))
    }
}

fn log_cleanup<E: std::error::Error + 'static>(
    backend: &'static str,
    algorithm: &'static str,
    result: Result<u64, E>,
    may_have_removed: impl FnOnce(&E) -> bool,
) {
    match result {
        Ok(removed) => tracing::debug!(backend, algorithm, removed, "expired entries removed"),
        Err(error) => tracing::warn!(
            backend,
            algorithm,
            error = %ErrorChain(&error),
            may_have_removed_entries = may_have_removed(&error),
            "cleanup of expired entries failed"
        ),
    }
}
