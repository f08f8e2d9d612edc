//! Startup, the listening announcement, serving and graceful shutdown.

use std::{
    io::{self, Write as _},
    net::SocketAddr,
    sync::Arc,
    time::Duration,
};

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use runlimit_memory::{
    GcraStore, MemoryAttemptLimiter, MemoryStore, MemoryStoreConfig, MemoryStoreConfigError,
};
use runlimit_metrics::MetricsObserver;
use runlimit_postgres::{
    MigrationError, PostgresGcraLimiter, PostgresLimiter, attempts::PostgresAttemptLimiter,
};
use runlimit_redis::{PrepareError, RedisConfig, RedisConnector, RedisGcraLimiter, RedisLimiter, RedisStore};
use sqlx::{
    Connection as _,
    postgres::{PgConnectOptions, PgConnection, PgPoolOptions},
};
use tokio::net::TcpListener;
use tracing_subscriber::EnvFilter;

use crate::{
    app::{App, Gates, GatesError, router},
    backend::{Backends, IdentityLimiter, ItemsLimiter, LoginAttempts},
    cli::Args,
    observe::DemoObserver,
    secret::{KEY_SECRET_ENV, KeySecretError, KeySecretSource, key_hasher_from_env},
    users::DemoUsers,
};

/// The start of the one line printed on stdout once the server is bound, followed by the
/// bound address and a newline: `runlimit-demo listening on http://127.0.0.1:3000`.
pub const LISTENING_PREFIX: &str = "runlimit-demo listening on http://";

/// Why the demo could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RunError {
    /// `RUNLIMIT_KEY_SECRET` is too short, or no ephemeral secret could be generated.
    #[error("no usable key secret")]
    KeySecret {
        /// Why.
        #[source]
        source: KeySecretError,
    },
    /// A limit or window option was rejected.
    #[error("invalid rate-limit options")]
    Gates {
        /// Why.
        #[source]
        source: GatesError,
    },
    /// `--memory-max-keys` or `--memory-shards` was rejected.
    #[error("invalid memory store options")]
    MemoryConfig {
        /// Why.
        #[source]
        source: MemoryStoreConfigError,
    },
    /// `--database-url` (or `DATABASE_URL`) is not a PostgreSQL connection URL.
    #[error("--database-url is not a PostgreSQL URL; expected postgres://USER@HOST:PORT/DATABASE")]
    DatabaseUrl {
        /// SQLx's parse error.
        #[source]
        source: sqlx::Error,
    },
    /// The first connection to the `--database-url` server failed.
    #[error(
        "cannot connect to PostgreSQL at {address} (--database-url); check that the server runs \
         there, accepts TCP connections and has the database"
    )]
    Connect {
        /// `host:port/database` of the URL (never its password).
        address: String,
        /// SQLx's error.
        #[source]
        source: sqlx::Error,
    },
    /// The `--database-url` server answered the first connection with an error: a database that
    /// does not exist, a user or password it refuses.
    #[error("PostgreSQL at {address} (--database-url) refused the connection: {message}; {fix}")]
    DatabaseRefused {
        /// `host:port/database` of the URL (never its password).
        address: String,
        /// The server's message (without SQLx's source-line suffix).
        message: String,
        /// What to do about it.
        fix: String,
    },
    /// The first connection to the `--database-url` server did not complete in time.
    #[error(
        "no answer from PostgreSQL at {address} (--database-url) within {} s; check the host, \
         port and firewall", timeout.as_secs()
    )]
    ConnectTimeout {
        /// `host:port/database` of the URL (never its password).
        address: String,
        /// How long startup waited.
        timeout: Duration,
    },
    /// `--redis-url` (or `REDIS_URL`) is not a Redis URL the demo can use.
    #[error(
        "--redis-url is not a usable Redis URL; expected redis://[USER:PASSWORD@]HOST[:PORT][/DB], \
         rediss://[USER:PASSWORD@]HOST[:PORT][/DB] (TLS) or redis+unix:///PATH"
    )]
    RedisUrl {
        /// runlimit-redis' reason.
        #[source]
        source: runlimit_redis::UrlError,
    },
    /// A Redis limiter setting was rejected (`--redis-max-keys-per-shard`).
    #[error("invalid Redis limiter options (--redis-max-keys-per-shard)")]
    RedisConfig {
        /// runlimit-redis' reason.
        #[source]
        source: runlimit_redis::ConfigError,
    },
    /// The `--redis-url` server could not be reached, or refused the startup checks' commands
    /// (`INFO`, `SCRIPT LOAD`).
    #[error(
        "cannot use Redis at {address} (--redis-url); check that the server runs there, accepts TCP \
         connections, and that the URL's credentials and database are right"
    )]
    RedisConnect {
        /// `host:port` of the URL (never its password).
        address: String,
        /// Why ([`PrepareError::Unreachable`]).
        #[source]
        source: PrepareError,
    },
    /// The `--redis-url` server of a `rediss://` URL could not be reached over TLS, or refused
    /// the startup checks' commands.
    #[error(
        "cannot use Redis at {address} over TLS (--redis-url rediss://...); check that the server listens for \
         TLS on that port (a server without TLS needs redis://), that a CA this system trusts issued its \
         certificate for that host, and that the URL's credentials and database are right"
    )]
    RedisTlsConnect {
        /// `host:port` of the URL (never its password).
        address: String,
        /// Why ([`PrepareError::Unreachable`]).
        #[source]
        source: PrepareError,
    },
    /// The `--redis-url` server cannot keep the limits: older than Redis 7.0, a
    /// `maxmemory-policy` other than `noeviction`, or cluster mode.
    #[error(
        "Redis at {address} (--redis-url) cannot hold the demo's limits; use a standalone Redis 7.0 or \
         newer with maxmemory-policy noeviction (CONFIG SET maxmemory-policy noeviction)"
    )]
    RedisUnsuitable {
        /// `host:port` of the URL (never its password).
        address: String,
        /// Why.
        #[source]
        source: PrepareError,
    },
    /// The runlimit-postgres migrations could not be applied.
    #[error("failed to apply the runlimit-postgres migrations")]
    Migrate {
        /// Why.
        #[source]
        source: MigrationError,
    },
    /// The Prometheus recorder behind `GET /metrics` could not be installed (another `metrics`
    /// recorder is already installed in this process).
    #[error("failed to install the Prometheus metrics recorder")]
    Metrics {
        /// The exporter's error.
        #[source]
        source: metrics_exporter_prometheus::BuildError,
    },
    /// The listening socket could not be bound.
    #[error("failed to listen on {address}")]
    Bind {
        /// The `--listen` address.
        address: SocketAddr,
        /// The operating system's error.
        #[source]
        source: io::Error,
    },
    /// The listening line could not be written to stdout.
    #[error("failed to announce the listening address on stdout")]
    Announce {
        /// The write error.
        #[source]
        source: io::Error,
    },
    /// The server's accept loop failed.
    #[error("server failed")]
    Serve {
        /// The I/O error.
        #[source]
        source: io::Error,
    },
}

/// Installs the stderr `tracing` subscriber: `RUST_LOG` filter directives, or when it is unset
/// or invalid `info,sqlx::postgres::notice=warn` (`info`, but PostgreSQL's notices, which SQLx
/// relays at `info`, only from `warn`: every start would log the migrations' `relation
/// "_sqlx_migrations" already exists, skipping`), no ANSI colors. Does nothing if a global
/// subscriber is already installed.
pub fn init_tracing() {
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new("info,sqlx::postgres::notice=warn"));
    let _ = tracing_subscriber::fmt().with_env_filter(filter).with_writer(io::stderr).try_init();
}

fn memory_config(args: &Args) -> Result<MemoryStoreConfig, RunError> {
    MemoryStoreConfig::new(args.memory_max_keys)
        .and_then(|config| config.with_shard_count(args.memory_shards))
        .map_err(|source| RunError::MemoryConfig { source })
}

/// Histogram buckets of every `*_seconds` metric, in seconds: 10 µs to 2.5 s.
const DURATION_BUCKETS: &[f64] =
    &[1e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 0.1, 0.5, 2.5];

/// How often the Prometheus recorder's upkeep runs (draining histogram samples into buckets
/// between scrapes, so memory stays bounded without a scrape).
const METRICS_UPKEEP: Duration = Duration::from_secs(5);

/// Installs the process's `metrics` recorder (Prometheus, rendered by `GET /metrics`) and
/// describes Runlimit's metrics to it. Before any backend is built, so every observation is
/// recorded.
fn install_metrics() -> Result<PrometheusHandle, RunError> {
    let handle = PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Suffix("_seconds".to_owned()), DURATION_BUCKETS)
        .and_then(PrometheusBuilder::install_recorder)
        .map_err(|source| RunError::Metrics { source })?;
    MetricsObserver::describe();
    Ok(handle)
}

/// How long startup waits for the first PostgreSQL connection.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Connects the `--database-url` pool: one connection first, so that a failure names its
/// cause (a pool would retry until its acquire timeout and report only that).
async fn postgres_pool(args: &Args, url: &str) -> Result<sqlx::PgPool, RunError> {
    // Refuses other schemes, which SQLx would otherwise read as PostgreSQL URLs.
    let options: PgConnectOptions = runlimit_postgres::connect_options_from_url(url)
        .map_err(|source| RunError::DatabaseUrl { source })?;
    let address = format!(
        "{}:{}/{}",
        options.get_host(),
        options.get_port(),
        options.get_database().unwrap_or(options.get_username())
    );
    match tokio::time::timeout(CONNECT_TIMEOUT, PgConnection::connect_with(&options)).await {
        Err(_) => return Err(RunError::ConnectTimeout { address, timeout: CONNECT_TIMEOUT }),
        Ok(Err(sqlx::Error::Database(error))) => {
            let fix = match error.code().as_deref() {
                // invalid_catalog_name
                Some("3D000") => format!(
                    "create it (createdb -h {} -p {} -U {} {}) or name one that exists",
                    options.get_host(),
                    options.get_port(),
                    options.get_username(),
                    options.get_database().unwrap_or(options.get_username())
                ),
                // invalid_authorization_specification, invalid_password
                Some("28000" | "28P01") => {
                    "check the user and password in the URL, and the server's pg_hba.conf".to_owned()
                }
                Some(code) => format!("SQLSTATE {code}"),
                None => "see the server's log".to_owned(),
            };
            return Err(RunError::DatabaseRefused { address, message: error.message().to_owned(), fix });
        }
        Ok(Err(source)) => return Err(RunError::Connect { address, source }),
        Ok(Ok(connection)) => {
            let _ = connection.close().await;
        }
    }
    Ok(PgPoolOptions::new()
        .max_connections(args.database_max_connections)
        .acquire_timeout(CONNECT_TIMEOUT)
        .connect_lazy_with(options))
}

/// The two Redis limiters of `--redis-url` (sharing one connection), prepared: the server
/// checked (Redis 7 or newer, `noeviction`) and the scripts loaded.
async fn redis_limiters(
    args: &Args,
    url: &str,
) -> Result<(RedisLimiter<DemoObserver>, RedisGcraLimiter<DemoObserver>), RunError> {
    let config = RedisConfig::default()
        .with_key_prefix(args.redis_key_prefix.clone())
        .with_maximum_keys_per_shard(args.redis_max_keys_per_shard)
        .map_err(|source| RunError::RedisConfig { source })?;
    let redis = |store| DemoObserver::new("redis", store);
    let connector = RedisConnector::new(url).map_err(|source| RunError::RedisUrl { source })?;
    let identity = RedisLimiter::from_connector(&connector)
        .with_config(config.clone())
        .with_observer(redis("login-identity"));
    let items =
        RedisGcraLimiter::from_connector(&connector).with_config(config).with_observer(redis("items"));
    prepare_redis(&identity).await?;
    prepare_redis(&items).await?;
    tracing::info!(
        address = %identity.address(),
        key_prefix = args.redis_key_prefix.as_str(),
        "runlimit-redis server checked and scripts loaded"
    );
    Ok((identity, items))
}

async fn prepare_redis<P: runlimit_redis::RedisAlgorithm>(
    limiter: &RedisStore<P, DemoObserver>,
) -> Result<(), RunError> {
    // Bounded by the limiter's connect and operation timeouts (1 s each).
    limiter.prepare().await.map_err(|source| {
        let address = limiter.address();
        match source {
            PrepareError::Unreachable(_) if limiter.connector().uses_tls() => {
                RunError::RedisTlsConnect { address, source }
            }
            PrepareError::Unreachable(_) => RunError::RedisConnect { address, source },
            _ => RunError::RedisUnsuitable { address, source },
        }
    })
}

/// The limiters: `login-client` always in memory; `login-identity` and `items` on Redis with
/// `--redis-url`, else on PostgreSQL with `--database-url`, else in memory; `login-attempts`
/// on PostgreSQL with `--database-url`, else in memory. Every shared backend is checked
/// (PostgreSQL connected and migrated, Redis prepared) before the server starts.
async fn backends(args: &Args) -> Result<Backends, RunError> {
    let config = memory_config(args)?;
    let memory = |store| DemoObserver::new("memory", store);
    let postgres = |store| DemoObserver::new("postgres", store);
    let client = Arc::new(MemoryStore::builder(config).with_observer(memory("login-client")).build());
    let pool = match &args.database_url {
        Some(url) => Some(postgres_pool(args, url).await?),
        None => None,
    };
    let redis = match &args.redis_url {
        Some(url) => Some(redis_limiters(args, url).await?),
        None => None,
    };
    let (identity, items) = match (redis, &pool) {
        (Some((identity, items)), _) => (IdentityLimiter::Redis(identity), ItemsLimiter::Redis(items)),
        (None, Some(pool)) => {
            let identity = PostgresLimiter::new(pool.clone()).with_observer(postgres("login-identity"));
            identity.migrate().await.map_err(|source| RunError::Migrate { source })?;
            let items = PostgresGcraLimiter::new(pool.clone()).with_observer(postgres("items"));
            items.migrate().await.map_err(|source| RunError::Migrate { source })?;
            (IdentityLimiter::Postgres(identity), ItemsLimiter::Postgres(items))
        }
        (None, None) => (
            IdentityLimiter::Memory(
                MemoryStore::builder(config).with_observer(memory("login-identity")).build(),
            ),
            ItemsLimiter::Memory(GcraStore::builder(config).with_observer(memory("items")).build()),
        ),
    };
    let attempts = match &pool {
        Some(pool) => {
            let attempts =
                PostgresAttemptLimiter::new(pool.clone()).with_observer(postgres("login-attempts"));
            attempts.migrate().await.map_err(|source| RunError::Migrate { source })?;
            tracing::info!("runlimit-postgres migrations applied");
            LoginAttempts::Postgres(attempts)
        }
        None => LoginAttempts::Memory(
            MemoryAttemptLimiter::builder(config).with_observer(memory("login-attempts")).build(),
        ),
    };
    Ok(Backends {
        client,
        identity: Arc::new(identity),
        items: Arc::new(items),
        attempts: Arc::new(attempts),
        postgres: pool,
    })
}

/// Runs the demo until SIGINT or SIGTERM.
///
/// Builds the key hasher from `RUNLIMIT_KEY_SECRET` (warning when ephemeral), the policies
/// and the backends, binds `args.listen`, prints `runlimit-demo listening on http://ADDR`
/// (see [`LISTENING_PREFIX`]) on stdout, and serves with `ConnectInfo<SocketAddr>`. On a
/// signal it stops accepting, lets in-flight requests finish, and returns `Ok`.
///
/// # Errors
///
/// Every [`RunError`] variant, each at the step named in its documentation.
pub async fn run(args: Args) -> Result<(), RunError> {
    let (hasher, source) = key_hasher_from_env(std::env::var_os(KEY_SECRET_ENV))
        .map_err(|source| RunError::KeySecret { source })?;
    let gates = Gates::new(&args).map_err(|source| RunError::Gates { source })?;
    let metrics = install_metrics()?;
    let backends = backends(&args).await?;
    // Warned once the demo will run: a startup error is then the only thing printed.
    if source == KeySecretSource::Ephemeral {
        tracing::warn!(
            "{KEY_SECRET_ENV} is not set: generated an ephemeral key secret; counters are not shared \
             across replicas and are lost on restart"
        );
    }
    let (identity_gate, items_gate, attempt_limiter) =
        (backends.identity.label(), backends.items.label(), backends.attempts.label());
    let upkeep = metrics.clone();
    let app = App::new(gates, backends, hasher, args.trusted_proxies.clone(), DemoUsers::default(), metrics);

    let listener = TcpListener::bind(args.listen)
        .await
        .map_err(|source| RunError::Bind { address: args.listen, source })?;
    let address = listener.local_addr().map_err(|source| RunError::Bind { address: args.listen, source })?;
    announce(address).map_err(|source| RunError::Announce { source })?;
    tracing::info!(
        port = address.port(),
        client_gate = "memory",
        identity_gate,
        items_gate,
        attempt_limiter,
        trusted_proxies = args.trusted_proxies.len(),
        "serving"
    );

    let upkeep = tokio::spawn(async move {
        let mut interval = tokio::time::interval(METRICS_UPKEEP);
        loop {
            interval.tick().await;
            upkeep.run_upkeep();
        }
    });
    let maintenance =
        app.backends().spawn_maintenance(Duration::from_secs(args.cleanup_interval_secs.max(1)));
    let served = axum::serve(listener, router(app).into_make_service_with_connect_info::<SocketAddr>())
        .with_graceful_shutdown(shutdown_signal())
        .await;
    if let Some(task) = maintenance {
        task.abort();
    }
    upkeep.abort();
    served.map_err(|source| RunError::Serve { source })?;
    tracing::info!("stopped");
    Ok(())
}

fn announce(address: SocketAddr) -> io::Result<()> {
    let mut stdout = io::stdout().lock();
    writeln!(stdout, "{LISTENING_PREFIX}{address}")?;
    stdout.flush()
}

/// Resolves on SIGINT (Ctrl-C) or, on Unix, SIGTERM. If a handler cannot be installed, that
/// signal is logged and ignored, never treated as a shutdown request.
async fn shutdown_signal() {
    let interrupt = async {
        if let Err(error) = tokio::signal::ctrl_c().await {
            tracing::error!(error = %error, "cannot listen for SIGINT");
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(error) => {
                tracing::error!(error = %error, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = interrupt => tracing::info!("SIGINT received; shutting down"),
        () = terminate => tracing::info!("SIGTERM received; shutting down"),
    }
}
