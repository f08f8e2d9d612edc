//! Where the counters live: process memory, Redis or PostgreSQL.

use std::{
    collections::{BTreeSet, HashMap},
    fmt::Write as _,
    sync::{Arc, Mutex, PoisonError},
};

use runlimit_memory::{Clock, GcraStore, MemoryStore, MemoryStoreConfig, SystemClock};
use runlimit_metrics::MetricsObserver;
use runlimit_postgres::{MigrationError, PostgresConfig, PostgresGcraLimiter, PostgresLimiter};
use runlimit_redis::{KeyPrefix, PrepareError, RedisConfig, RedisConnector, RedisGcraLimiter, RedisLimiter};
use sha2::{Digest as _, Sha256};

use crate::config::{Algorithm, RuleTable};

/// The longest `--redis-key-prefix` accepted: 47 bytes. Each domain's keys live under the
/// prefix, `:` and 16 hex digits of a hash of the domain name (64 bytes at most, the longest
/// prefix runlimit-redis accepts).
pub const MAX_REDIS_KEY_PREFIX_LEN: usize = 47;

/// The counters' storage, shared by every domain of the rule table.
///
/// | backend | shared by replicas | set-up |
/// |---|---|---|
/// | [`memory`](Self::memory) | no: each process counts on its own | none |
/// | [`redis`](Self::redis) | yes, with the same server, key prefix and key secret | Redis 7 or newer, `maxmemory-policy noeviction` |
/// | [`postgres`](Self::postgres) | yes, with the same database and key secret | the runlimit-postgres migrations (applied by [`prepare`](Self::prepare)) |
///
/// Each algorithm has its own limiter: fixed-window rules use `MemoryStore`, `RedisLimiter`
/// or `PostgresLimiter`, GCRA rules `GcraStore`, `RedisGcraLimiter` or `PostgresGcraLimiter`.
/// In memory, every domain has stores of its own, each with the whole bound: one domain's keys
/// (a flood of distinct client-controlled values) cannot fill another domain's store. On
/// Redis, every domain has a limiter of its own (sharing the connection), whose keys carry
/// the hash tag `{PREFIX:DOMAIN-HASH}`: in a Redis Cluster a domain's counters live in one hash
/// slot, so every request (which names one domain) is one atomic script on one node, and each
/// domain has its own 256 bounded shards. On PostgreSQL every domain shares the tables and
/// their bound.
///
/// Every limiter records runlimit-metrics' metrics (`runlimit_metrics::MetricsObserver`) into
/// the `metrics` recorder installed when it first admits, with the `backend` label of
/// [`name`](Self::name). The shard gauges of a domain's memory or Redis store carry the
/// `store` label `DOMAIN/fixed_window` or `DOMAIN/gcra`, so each store's shards are series of
/// their own.
#[derive(Clone, Debug)]
pub struct Backend {
    kind: Kind,
}

#[derive(Clone, Debug)]
enum Kind {
    Memory(Arc<MemoryBackend>),
    Redis { fixed: RedisLimiter<MetricsObserver>, gcra: RedisGcraLimiter<MetricsObserver>, prefix: String },
    Postgres(Arc<PostgresLimiters>),
}

/// The memory stores' clock: the system's, or one the embedder (a test) controls.
pub(crate) type SharedClock = Arc<dyn Clock>;

/// The `store` label of `domain`'s store of `algorithm`: `DOMAIN/fixed_window` or
/// `DOMAIN/gcra`.
///
/// `MetricsObserver::with_store` takes a `&'static str`, so each name is leaked; each distinct
/// name is leaked once and memoized for the life of the process, so a reload (which names the
/// stores of every domain again: the Redis limiters are rebuilt) never leaks it again. Names
/// come from the rule files only, so the memory leaked is bounded by the domains the process
/// ever served (two short names each), never by requests.
fn store_name(domain: &str, algorithm: Algorithm) -> &'static str {
    static NAMES: Mutex<BTreeSet<&'static str>> = Mutex::new(BTreeSet::new());
    let name = format!("{domain}/{}", algorithm.name());
    // A panic while holding this lock leaves nothing half-updated (one insert).
    let mut names = NAMES.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(known) = names.get(name.as_str()) {
        return known;
    }
    let leaked: &'static str = Box::leak(name.into_boxed_str());
    names.insert(leaked);
    leaked
}

/// The observer of a store of `backend` (`memory`, `redis`, `postgres`); with a domain and
/// algorithm, its shard gauges carry their [`store_name`].
fn observer(backend: &'static str, store: Option<(&str, Algorithm)>) -> MetricsObserver {
    let observer = MetricsObserver::new(backend);
    match store {
        Some((domain, algorithm)) => observer.with_store(store_name(domain, algorithm)),
        None => observer,
    }
}

pub(crate) struct MemoryLimiters {
    pub(crate) fixed: MemoryStore<SharedClock, MetricsObserver>,
    pub(crate) gcra: GcraStore<SharedClock, MetricsObserver>,
}

impl std::fmt::Debug for MemoryLimiters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryLimiters").finish_non_exhaustive()
    }
}

/// The memory backend: the stores of every domain it has served, kept by domain name so a
/// table that names the domain again (a reload) keeps its counters.
struct MemoryBackend {
    config: MemoryStoreConfig,
    clock: SharedClock,
    domains: Mutex<HashMap<Box<str>, Arc<MemoryLimiters>>>,
}

impl std::fmt::Debug for MemoryBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryBackend").field("config", &self.config).finish_non_exhaustive()
    }
}

impl MemoryBackend {
    /// The stores of `domain`, created empty the first time.
    fn stores(&self, domain: &str) -> Arc<MemoryLimiters> {
        // A panic while holding this lock leaves nothing half-updated (one insert), so a
        // poisoned lock is used as it is.
        let mut domains = self.domains.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        Arc::clone(domains.entry(domain.into()).or_insert_with(|| {
            Arc::new(MemoryLimiters {
                fixed: MemoryStore::builder(self.config)
                    .with_clock(Arc::clone(&self.clock))
                    .with_observer(observer("memory", Some((domain, Algorithm::FixedWindow))))
                    .build(),
                gcra: GcraStore::builder(self.config)
                    .with_clock(Arc::clone(&self.clock))
                    .with_observer(observer("memory", Some((domain, Algorithm::Gcra))))
                    .build(),
            })
        }))
    }
}

#[derive(Debug)]
pub(crate) struct PostgresLimiters {
    pub(crate) fixed: PostgresLimiter<MetricsObserver>,
    pub(crate) gcra: PostgresGcraLimiter<MetricsObserver>,
}

#[derive(Clone, Debug)]
pub(crate) struct RedisDomainLimiters {
    pub(crate) fixed: RedisLimiter<MetricsObserver>,
    pub(crate) gcra: RedisGcraLimiter<MetricsObserver>,
    /// The domain's algorithm: the only limiter cleanup has to visit.
    algorithm: Algorithm,
}

/// The limiters of one rule table, by domain (PostgreSQL: the same for every domain).
#[derive(Clone, Debug)]
pub(crate) enum Limiters {
    Memory(Arc<HashMap<Box<str>, Arc<MemoryLimiters>>>),
    Redis(Arc<HashMap<Box<str>, RedisDomainLimiters>>),
    Postgres(Arc<PostgresLimiters>),
}

/// Why a backend could not be built or prepared.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BackendError {
    /// The Redis URL is not one runlimit-redis can use.
    #[error("not a usable Redis URL")]
    RedisUrl {
        /// runlimit-redis' reason.
        #[source]
        source: runlimit_redis::UrlError,
    },
    /// The Redis key prefix is empty, longer than [`MAX_REDIS_KEY_PREFIX_LEN`] bytes or holds
    /// a character runlimit-redis refuses.
    #[error(
        "invalid Redis key prefix `{prefix}`: 1 to {MAX_REDIS_KEY_PREFIX_LEN} ASCII letters, digits, '.', '_', \
         '-' or ':'"
    )]
    RedisKeyPrefix {
        /// The prefix.
        prefix: String,
    },
    /// Redis could not be reached, or cannot hold limits (older than 7.0, evicting).
    #[error("Redis at {address} cannot be used")]
    RedisPrepare {
        /// `host:port`.
        address: String,
        /// runlimit-redis' reason.
        #[source]
        source: PrepareError,
    },
    /// The runlimit-postgres migrations could not be applied.
    #[error("the runlimit-postgres migrations could not be applied")]
    Migrate {
        /// Why.
        #[source]
        source: MigrationError,
    },
}

impl Backend {
    /// Hard-bounded process memory: each domain's two stores (fixed window, GCRA) hold at most
    /// `config.max_keys()` keys each and never evict a live one; a new key for a full shard is
    /// denied (`OVER_LIMIT`). Stores are created when a table first names their domain.
    #[must_use]
    pub fn memory(config: MemoryStoreConfig) -> Self {
        Self::memory_with_clock(config, Arc::new(SystemClock::new()))
    }

    /// [`memory`](Self::memory) on `clock` instead of the system's monotonic clock: a
    /// `runlimit_memory::ManualClock` makes every window and delay a test observes exact.
    #[must_use]
    pub fn memory_with_clock(config: MemoryStoreConfig, clock: Arc<dyn Clock>) -> Self {
        let memory = MemoryBackend { config, clock, domains: Mutex::new(HashMap::new()) };
        Self { kind: Kind::Memory(Arc::new(memory)) }
    }

    /// Redis at `url` (`redis://[USER:PASSWORD@]HOST[:PORT][/DB]`, `rediss://` for TLS with the
    /// system's trusted roots, or `redis+unix:///PATH`): one connection (per cluster primary)
    /// shared by both algorithms and every domain, opened by [`prepare`](Self::prepare). `config`'s key prefix is the base of
    /// every domain's prefix (at most [`MAX_REDIS_KEY_PREFIX_LEN`] bytes); its placement is
    /// ignored (each domain is one hash slot, see the type's docs).
    ///
    /// # Errors
    ///
    /// [`BackendError::RedisUrl`] for an unusable URL; [`BackendError::RedisKeyPrefix`] for a
    /// prefix too long to carry a domain.
    pub fn redis(url: &str, config: &RedisConfig) -> Result<Self, BackendError> {
        let prefix = config.key_prefix().as_str().to_owned();
        if prefix.len() > MAX_REDIS_KEY_PREFIX_LEN {
            return Err(BackendError::RedisKeyPrefix { prefix });
        }
        let connector = RedisConnector::new(url).map_err(|source| BackendError::RedisUrl { source })?;
        let fixed = RedisLimiter::from_connector(&connector);
        let gcra = RedisGcraLimiter::from_connector(&connector);
        Ok(Self {
            kind: Kind::Redis {
                fixed: fixed.with_config(config.clone()).with_observer(observer("redis", None)),
                gcra: gcra.with_config(config.clone()).with_observer(observer("redis", None)),
                prefix,
            },
        })
    }

    /// PostgreSQL through `pool`, with `config`'s bounds and timeouts; [`prepare`](Self::prepare)
    /// applies the migrations.
    #[must_use]
    pub fn postgres(pool: sqlx::PgPool, config: PostgresConfig) -> Self {
        let limiters = PostgresLimiters {
            fixed: PostgresLimiter::new(pool.clone())
                .with_config(config)
                .with_observer(observer("postgres", None)),
            gcra: PostgresGcraLimiter::new(pool)
                .with_config(config)
                .with_observer(observer("postgres", None)),
        };
        Self { kind: Kind::Postgres(Arc::new(limiters)) }
    }

    /// Readies the backend for traffic: on Redis, connects, checks the server (Redis 7 or
    /// newer, `maxmemory-policy noeviction`) and loads the scripts; on PostgreSQL, applies
    /// the runlimit-postgres fixed-window and GCRA migrations. Nothing to do in memory.
    ///
    /// # Errors
    ///
    /// [`BackendError::RedisPrepare`] or [`BackendError::Migrate`].
    pub async fn prepare(&self) -> Result<(), BackendError> {
        match &self.kind {
            Kind::Memory(_) => Ok(()),
            Kind::Redis { fixed, gcra, .. } => {
                let prepare = |source| BackendError::RedisPrepare { address: fixed.address(), source };
                fixed.prepare().await.map_err(prepare)?;
                gcra.prepare().await.map_err(prepare)
            }
            Kind::Postgres(limiters) => {
                limiters.fixed.migrate().await.map_err(|source| BackendError::Migrate { source })?;
                limiters.gcra.migrate().await.map_err(|source| BackendError::Migrate { source })
            }
        }
    }

    /// The readiness probe: whether the backend can admit now, and why not. In memory,
    /// always. On Redis, [`prepare`](Self::prepare) again (the server answers, is Redis 7 or
    /// newer, still has `maxmemory-policy noeviction`, since a server switched to an evicting
    /// policy would silently reset limits, and holds the scripts), then one admission; on
    /// PostgreSQL, one admission. The admission is a check of the probe policy
    /// (`runlimit-server.readiness`, a limit no probe reaches, a constant subject key): a
    /// write, so a read-only replica or standby, a server out of memory or a full disk is not
    /// ready. On a Redis Cluster it reaches the node of the base key prefix's slot only.
    ///
    /// # Errors
    ///
    /// The reason, as one line of text.
    pub async fn probe(&self) -> Result<(), String> {
        match &self.kind {
            Kind::Memory(_) => Ok(()),
            Kind::Redis { fixed, .. } => {
                self.prepare().await.map_err(|error| crate::error_chain(&error))?;
                write_probe(fixed).await.map_err(|error| format!("Redis refuses admissions: {error}"))
            }
            Kind::Postgres(limiters) => write_probe(&limiters.fixed)
                .await
                .map_err(|error| format!("PostgreSQL refuses admissions: {error}")),
        }
    }

    /// A short name: `memory`, `redis` or `postgres`.
    #[must_use]
    pub fn name(&self) -> &'static str {
        match self.kind {
            Kind::Memory(_) => "memory",
            Kind::Redis { .. } => "redis",
            Kind::Postgres(_) => "postgres",
        }
    }

    /// The limiters `table`'s domains use.
    pub(crate) fn limiters(&self, table: &RuleTable) -> Limiters {
        match &self.kind {
            Kind::Memory(memory) => Limiters::Memory(Arc::new(
                table.domains().map(|domain| (domain.name.clone(), memory.stores(&domain.name))).collect(),
            )),
            Kind::Postgres(postgres) => Limiters::Postgres(Arc::clone(postgres)),
            Kind::Redis { fixed, gcra, prefix } => {
                let mut domains = HashMap::new();
                for domain in table.domains() {
                    let Ok(key_prefix) = KeyPrefix::new(&domain_prefix(prefix, &domain.name)) else {
                        continue;
                    };
                    let config = fixed.config().clone().with_key_prefix(key_prefix);
                    let store = |algorithm| observer("redis", Some((&domain.name, algorithm)));
                    domains.insert(
                        domain.name.clone(),
                        RedisDomainLimiters {
                            fixed: fixed
                                .clone()
                                .with_config(config.clone())
                                .with_observer(store(Algorithm::FixedWindow)),
                            gcra: gcra.clone().with_config(config).with_observer(store(Algorithm::Gcra)),
                            algorithm: domain.algorithm,
                        },
                    );
                }
                Limiters::Redis(Arc::new(domains))
            }
        }
    }
}

/// One admission of the readiness probe's policy through `limiter`: its error, if any.
async fn write_probe<L: runlimit_core::Limiter<Policy = runlimit_core::FixedWindowPolicy>>(
    limiter: &L,
) -> Result<(), String> {
    let policy = probe_policy();
    let subject = runlimit_core::SubjectKey::from_digest([0; 32]).bind(&policy);
    limiter
        .check(&runlimit_core::Check::new(subject))
        .await
        .map(|_| ())
        .map_err(|error| crate::error_chain(&error))
}

/// The readiness probe's policy: `runlimit-server.readiness`, scope `probe`, the largest limit
/// Runlimit accepts per hour (never reached by a probe every second).
fn probe_policy() -> runlimit_core::FixedWindowPolicy {
    #[expect(clippy::expect_used, reason = "constant, valid identifiers and parameters")]
    runlimit_core::FixedWindowPolicy::new(
        runlimit_core::PolicyId::new("runlimit-server.readiness").expect("a valid policy id"),
        runlimit_core::ScopeId::new("probe").expect("a valid scope"),
        runlimit_core::MAX_LIMIT,
        std::time::Duration::from_secs(3_600),
    )
    .expect("a valid policy")
}

/// A domain's Redis key prefix: the base prefix, `:` and the first 16 hex digits of the
/// SHA-256 of the domain name.
pub(crate) fn domain_prefix(base: &str, domain: &str) -> String {
    let digest = Sha256::digest(domain.as_bytes());
    let mut prefix = format!("{base}:");
    for byte in &digest[..8] {
        let _ = write!(prefix, "{byte:02x}");
    }
    prefix
}

impl Limiters {
    /// One bounded cleanup pass of expired state in shared storage (at most `maximum` entries
    /// per limiter); memory stores clean up as they admit. Returns the entries removed.
    pub(crate) async fn cleanup_expired(&self, maximum: u32) -> u64 {
        let mut removed = 0;
        match self {
            Self::Memory(_) => {}
            Self::Postgres(postgres) => {
                for result in [
                    postgres.fixed.cleanup_expired(maximum).await,
                    postgres.gcra.cleanup_expired(maximum).await,
                ] {
                    match result {
                        Ok(count) => removed += count,
                        Err(error) => tracing::warn!(%error, "PostgreSQL cleanup failed"),
                    }
                }
            }
            Self::Redis(domains) => {
                for limiters in domains.values() {
                    let result = match limiters.algorithm {
                        Algorithm::FixedWindow => limiters.fixed.cleanup_expired(maximum).await,
                        Algorithm::Gcra => limiters.gcra.cleanup_expired(maximum).await,
                    };
                    match result {
                        Ok(count) => removed += count,
                        Err(error) => tracing::warn!(%error, "Redis cleanup failed"),
                    }
                }
            }
        }
        removed
    }
}
