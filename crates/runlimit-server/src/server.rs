//! Startup, the listening announcements, serving gRPC and HTTP, and graceful shutdown.

use std::{
    future::Future,
    io::{self, Write as _},
    net::SocketAddr,
    path::PathBuf,
    time::Duration,
};

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use runlimit_memory::{MemoryStoreConfig, MemoryStoreConfigError};
use runlimit_postgres::PostgresConfig;
use runlimit_redis::{KeyPrefix, PrepareError, RedisConfig};
use sqlx::{
    Connection as _,
    postgres::{PgConnectOptions, PgConnection, PgPoolOptions},
};
use tokio::net::TcpListener;

use crate::{
    backend::{Backend, BackendError},
    cli::Args,
    config::{ConfigErrors, RuleTable, read_sources},
    health::Health,
    http, metrics,
    secret::{KEY_SECRET_ENV, KeySecretError, KeySecretSource, key_hasher},
    service::{RateLimitServer, Service, ServiceOptions},
};

/// The start of the line printed on stdout once the gRPC listener is bound, followed by the
/// bound address: `grpc listening on 127.0.0.1:8081`.
pub const GRPC_LISTENING_PREFIX: &str = "grpc listening on ";
/// The start of the line printed on stdout once the HTTP listener is bound, followed by the
/// bound address: `http listening on 127.0.0.1:8080`.
pub const HTTP_LISTENING_PREFIX: &str = "http listening on ";

/// The most concurrent calls (HTTP/2 streams) one gRPC connection may carry: 1,024.
pub const MAX_CONCURRENT_STREAMS: u32 = 1_024;

/// How long startup waits for the first PostgreSQL connection.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// The most expired entries one cleanup pass removes per limiter.
const CLEANUP_BATCH: u32 = 1_000;

/// How long, after the shutdown signal, in-flight calls and open connections get to finish
/// before [`Server::serve`] returns anyway: a peer that stops reading (a frozen or partitioned
/// client never acknowledges HTTP/2's shutdown `PING`) must not keep the process alive.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// Why the server could not start, or stopped with an error. Each message names what failed,
/// where, and what to do.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RunError {
    /// The rule files are invalid; every problem is listed, one per line.
    #[error("invalid rule files (--config):\n{errors}")]
    Config {
        /// Every problem.
        errors: ConfigErrors,
    },
    /// No usable key secret.
    #[error("no usable key secret")]
    KeySecret {
        /// Why.
        #[source]
        source: KeySecretError,
    },
    /// `--memory-max-keys` or `--memory-shards` was rejected.
    #[error("invalid memory store options (--memory-max-keys, --memory-shards)")]
    MemoryConfig {
        /// Why.
        #[source]
        source: MemoryStoreConfigError,
    },
    /// A Redis option was rejected.
    #[error("invalid Redis options (--redis-key-prefix, --redis-max-keys-per-shard)")]
    RedisConfig {
        /// Why.
        #[source]
        source: runlimit_redis::ConfigError,
    },
    /// `--redis-url` is not a Redis URL runlimit-redis can use.
    #[error(
        "--redis-url is not a usable Redis URL; expected redis://[USER:PASSWORD@]HOST[:PORT][/DB], \
         rediss://[USER:PASSWORD@]HOST[:PORT][/DB] (TLS) or redis+unix:///PATH"
    )]
    RedisUrl {
        /// runlimit-redis' reason.
        #[source]
        source: runlimit_redis::UrlError,
    },
    /// `--database-url` is not a PostgreSQL URL.
    #[error(
        "--database-url is not a PostgreSQL URL; expected postgres://USER[:PASSWORD]@HOST[:PORT]/DATABASE"
    )]
    DatabaseUrl {
        /// SQLx's parse error.
        #[source]
        source: sqlx::Error,
    },
    /// The first PostgreSQL connection failed.
    #[error(
        "cannot connect to PostgreSQL at {address} (--database-url); check that the server runs there, \
         accepts TCP connections, and that the user, password and database are right"
    )]
    DatabaseConnect {
        /// `host:port/database` (never the password).
        address: String,
        /// SQLx's error.
        #[source]
        source: sqlx::Error,
    },
    /// The first PostgreSQL connection did not complete in time.
    #[error(
        "no answer from PostgreSQL at {address} (--database-url) within {} s; check the host, port and \
         firewall", timeout.as_secs()
    )]
    DatabaseTimeout {
        /// `host:port/database`.
        address: String,
        /// How long startup waited.
        timeout: Duration,
    },
    /// Redis could not be reached.
    #[error(
        "cannot reach Redis at {address} (--redis-url); check that the server runs there, accepts TCP \
         connections, and that the URL's credentials and database are right"
    )]
    RedisConnect {
        /// `host:port`.
        address: String,
        /// Why.
        #[source]
        source: PrepareError,
    },
    /// The Redis server cannot hold limits.
    #[error(
        "Redis at {address} (--redis-url) cannot hold limits; use Redis 7.0 or newer with \
         maxmemory-policy noeviction (CONFIG SET maxmemory-policy noeviction)"
    )]
    RedisUnsuitable {
        /// `host:port`.
        address: String,
        /// Why.
        #[source]
        source: PrepareError,
    },
    /// The backend could not be built or prepared (other than the cases above).
    #[error("the {backend} backend could not be prepared")]
    Backend {
        /// `redis` or `postgres`.
        backend: &'static str,
        /// Why.
        #[source]
        source: BackendError,
    },
    /// A listening socket could not be bound.
    #[error(
        "cannot listen on {address} ({option}); is another process using the port? choose another with {option}"
    )]
    Bind {
        /// `--grpc-addr` or `--http-addr`.
        option: &'static str,
        /// The address.
        address: SocketAddr,
        /// The operating system's error.
        #[source]
        source: io::Error,
    },
    /// The listening lines could not be written to stdout.
    #[error("cannot announce the listening addresses on stdout")]
    Announce {
        /// The write error.
        #[source]
        source: io::Error,
    },
    /// The gRPC server failed.
    #[error("the gRPC server failed")]
    Grpc {
        /// tonic's error.
        #[source]
        source: tonic::transport::Error,
    },
    /// The HTTP server failed.
    #[error("the HTTP server failed")]
    Http {
        /// The I/O error.
        #[source]
        source: io::Error,
    },
}

/// What the reloader needs: the rules' path, the poll interval, and the fingerprint of the
/// files the table in force was compiled from.
#[derive(Debug)]
struct Reload {
    path: PathBuf,
    poll: Duration,
    fingerprint: Option<[u8; 32]>,
    /// The SIGHUP stream, installed when the server is built: SIGHUP's default action ends
    /// the process, also during startup.
    hangup: crate::reload::Hangup,
}

/// A server with its rules loaded, its backend built and both listeners bound, ready to
/// [`serve`](Self::serve).
#[derive(Debug)]
pub struct Server {
    service: Service,
    grpc: TcpListener,
    http: TcpListener,
    metrics: Option<PrometheusHandle>,
    cleanup_interval: Duration,
    probe_interval: Duration,
    /// The rule files to reload, and how often to poll them.
    reload: Option<Reload>,
    health: Health,
}

impl Server {
    /// Loads the rules of `args.config`, builds the key hasher and the backend (checking that
    /// PostgreSQL answers), and binds `args.grpc_addr` and `args.http_addr`. The backend is
    /// prepared (Redis checked, PostgreSQL migrated) by [`serve`](Self::serve), which reports
    /// not-ready until then.
    ///
    /// `metrics` renders `GET /metrics`; without it that route answers 404.
    ///
    /// # Errors
    ///
    /// Every [`RunError`] variant but `Announce`, `Grpc`, `Http`, `RedisConnect`,
    /// `RedisUnsuitable` and `Backend` for PostgreSQL's migrations (which `serve` returns),
    /// each at the step its documentation names.
    pub async fn bind(args: &Args, metrics: Option<PrometheusHandle>) -> Result<Self, RunError> {
        // First: SIGHUP's default action would end the process during the steps below.
        let hangup = crate::reload::hangup_signal();
        let config = args.config.clone().unwrap_or_else(|| PathBuf::from("."));
        // The files' fingerprint is taken from the very texts compiled, so a change made while
        // the server starts is reloaded at the reloader's first poll.
        let sources = read_sources(&config).map_err(|errors| RunError::Config { errors })?;
        let fingerprint = crate::reload::fingerprint(&sources);
        let table = RuleTable::from_sources(sources).map_err(|errors| RunError::Config { errors })?;
        let (hasher, source) = key_hasher(args.key_secret_file.as_deref(), std::env::var_os(KEY_SECRET_ENV))
            .map_err(|source| RunError::KeySecret { source })?;
        if source == KeySecretSource::Ephemeral {
            tracing::warn!(
                "no key secret given (--key-secret-file, {KEY_SECRET_ENV}): generated a random one; counters are \
                 not shared with other replicas and are lost on restart"
            );
        }
        let backend = backend(args).await?;
        let options = ServiceOptions {
            shadow_mode: args.shadow_mode,
            response_headers: args.response_headers.map(Into::into),
            on_backend_error: args.on_backend_error.into(),
        };
        let (domains, rules) = (table.domain_count(), table.rule_count());
        let service = Service::new(table, &backend, hasher, options);
        // Calls wait for the backend: `serve` prepares it, then marks the service ready.
        service.set_ready(false);
        tracing::info!(
            config = %config.display(),
            domains,
            rules,
            backend = backend.name(),
            shadow_mode = args.shadow_mode,
            "rules loaded"
        );
        let server = Self::with_service(service, args.grpc_addr, args.http_addr).await?;
        Ok(Self {
            metrics,
            cleanup_interval: Duration::from_secs(args.cleanup_interval_secs.max(1)),
            probe_interval: Duration::from_secs(args.probe_interval_secs.max(1)),
            reload: Some(Reload {
                path: config,
                poll: Duration::from_secs(args.config_poll_interval_secs.max(1)),
                fingerprint: Some(fingerprint),
                hangup,
            }),
            ..server
        })
    }

    /// A server for `service`, with both listeners bound: what [`bind`](Self::bind) does once
    /// the service is built, for embedders and tests that build their own. `GET /metrics`
    /// answers 404, the rule files are not reloaded, the backend's readiness is probed every
    /// 5 s and shared storage is cleaned every 60 s.
    ///
    /// # Errors
    ///
    /// [`RunError::Bind`] when an address cannot be bound.
    pub async fn with_service(
        service: Service,
        grpc_addr: SocketAddr,
        http_addr: SocketAddr,
    ) -> Result<Self, RunError> {
        let grpc = bind("--grpc-addr", grpc_addr).await?;
        let http = bind("--http-addr", http_addr).await?;
        Ok(Self {
            service,
            grpc,
            http,
            metrics: None,
            cleanup_interval: Duration::from_secs(60),
            probe_interval: Duration::from_secs(5),
            reload: None,
            health: Health::default(),
        })
    }

    /// The same server rendering `handle` on `GET /metrics` (see [`install_metrics`]).
    #[must_use]
    pub fn with_metrics(self, handle: PrometheusHandle) -> Self {
        Self { metrics: Some(handle), ..self }
    }

    /// The same server reloading the rules from `path` (a file or a directory, as
    /// [`RuleTable::load`] reads it) on file-system events, every `poll` and on SIGHUP.
    #[must_use]
    pub fn with_reload(self, path: PathBuf, poll: Duration) -> Self {
        // The files as they are now are taken to be the service's table.
        let fingerprint = read_sources(&path).ok().map(|sources| crate::reload::fingerprint(&sources));
        let hangup = crate::reload::hangup_signal();
        Self { reload: Some(Reload { path, poll, fingerprint, hangup }), ..self }
    }

    /// The same server probing the backend's readiness every `interval` (at least 1 ms).
    #[must_use]
    pub fn with_probe_interval(self, interval: Duration) -> Self {
        Self { probe_interval: interval.max(Duration::from_millis(1)), ..self }
    }

    /// The bound gRPC address.
    ///
    /// # Errors
    ///
    /// The operating system's error, if it cannot tell.
    pub fn grpc_addr(&self) -> io::Result<SocketAddr> {
        self.grpc.local_addr()
    }

    /// The bound HTTP address.
    ///
    /// # Errors
    ///
    /// The operating system's error, if it cannot tell.
    pub fn http_addr(&self) -> io::Result<SocketAddr> {
        self.http.local_addr()
    }

    /// The service.
    #[must_use]
    pub fn service(&self) -> &Service {
        &self.service
    }

    /// [`serve_with`](Self::serve_with) with nothing to do once ready.
    ///
    /// # Errors
    ///
    /// As [`serve_with`](Self::serve_with).
    pub async fn serve(self, shutdown: impl Future<Output = ()> + Send + 'static) -> Result<(), RunError> {
        self.serve_with(shutdown, || Ok(())).await
    }

    /// Serves gRPC (`RateLimitService` and `grpc.health.v1.Health`) and HTTP
    /// (`GET /healthcheck`, `POST /json`, `GET /metrics`, `GET /rlconfig`) until `shutdown`
    /// completes.
    ///
    /// Both listeners serve at once, reporting not-ready (`503`, `NOT_SERVING`, calls refused
    /// `UNAVAILABLE`) while the backend is prepared; then the service is ready and `ready`
    /// runs (the binary prints its listening lines there). Meanwhile: the backend's readiness
    /// probe, the periodic cleanup of shared storage and, when configured, the reloading of
    /// the rule files. On `shutdown`: `NOT_SERVING`, no new connections, in-flight calls
    /// finish (for at most [`SHUTDOWN_GRACE`]), and it returns.
    ///
    /// # Errors
    ///
    /// The backend's preparation failure ([`RunError::RedisConnect`],
    /// [`RunError::RedisUnsuitable`], [`RunError::Backend`]), `ready`'s error, or
    /// [`RunError::Grpc`] / [`RunError::Http`] when a server fails.
    pub async fn serve_with(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
        ready: impl FnOnce() -> Result<(), RunError> + Send,
    ) -> Result<(), RunError> {
        let Self { service, grpc, http, metrics, cleanup_interval, probe_interval, reload, health } = self;
        let (reporter, health_service) = tonic_health::server::health_reporter();
        // Calls wait for the backend's preparation, whoever built the service.
        service.set_ready(false);
        report(&reporter, false).await;
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let grpc = tonic::transport::Server::builder()
            // Bounds what one connection can hold at once (tonic's default is unbounded): Envoy
            // opens more connections rather than queue when a connection is at its limit.
            .max_concurrent_streams(Some(MAX_CONCURRENT_STREAMS))
            // Pings on quiet connections: a peer that crashed or was partitioned away is closed
            // and gives its place among the MAX_GRPC_CONNECTIONS back.
            .http2_keepalive_interval(Some(crate::grpc::HTTP2_KEEPALIVE.0))
            .http2_keepalive_timeout(Some(crate::grpc::HTTP2_KEEPALIVE.1))
            // Every call's request: a read deadline and a byte budget shared by all calls.
            .layer(crate::grpc::RequestBounds::new())
            .add_service(health_service)
            .add_service(RateLimitServer::new(service.clone()))
            // At most MAX_GRPC_CONNECTIONS connections, with TCP_NODELAY.
            .serve_with_incoming_shutdown(crate::grpc::incoming(grpc), wait(stopped.clone()));
        let app = http::AppState { service: service.clone(), health: health.clone(), metrics };
        let http = http::serve(http, http::router(app), stopped.clone());
        let servers = tokio::spawn(async move { tokio::join!(grpc, http) });

        // A shutdown signal during the preparation stops the server there.
        let mut shutdown = std::pin::pin!(shutdown);
        let prepared = tokio::select! {
            prepared = service.backend().prepare() => prepared,
            () = &mut shutdown => {
                tracing::info!("shut down while the backend was prepared");
                health.set_shutting_down();
                let _ = stop.send(true);
                let _ = tokio::time::timeout(SHUTDOWN_GRACE, servers).await;
                return Ok(());
            }
        };
        let started = match prepared {
            Ok(()) => {
                health.set_prepared();
                service.set_ready(true);
                report(&reporter, true).await;
                tracing::info!(backend = service.backend().name(), "backend prepared: serving");
                ready()
            }
            Err(error) => Err(prepare_error(service.backend(), error)),
        };
        if let Err(error) = started {
            health.set_shutting_down();
            let _ = stop.send(true);
            let _ = tokio::time::timeout(SHUTDOWN_GRACE, servers).await;
            return Err(error);
        }

        let mut tasks = vec![
            tokio::spawn(probe(service.clone(), health.clone(), reporter.clone(), probe_interval)),
            tokio::spawn(cleanup(service.clone(), cleanup_interval)),
        ];
        if let Some(Reload { path, poll, fingerprint, hangup }) = reload {
            let reloader = crate::reload::Reloader::new(path, service.clone(), health.clone(), fingerprint);
            tasks.push(tokio::spawn(reloader.run(poll, hangup, stopped.clone())));
        }
        shutdown.await;
        tracing::info!("shutting down: no new connections, finishing in-flight calls");
        // The probe, cleanup and reloader stop first: a probe seeing the backend again must not
        // report SERVING during the drain.
        for task in tasks {
            task.abort();
        }
        health.set_shutting_down();
        // Health checks on connections still open now see the service going away.
        report(&reporter, false).await;
        let _ = stop.send(true);
        let finished = tokio::time::timeout(SHUTDOWN_GRACE, servers).await;
        let Ok(finished) = finished else {
            tracing::warn!(
                grace_secs = SHUTDOWN_GRACE.as_secs(),
                "stopped with connections still open after the shutdown grace period"
            );
            return Ok(());
        };
        // A server task that panicked is reported as the failure of its server.
        let (grpc, http) = finished.map_err(|error| RunError::Http { source: io::Error::other(error) })?;
        grpc.map_err(|source| RunError::Grpc { source })?;
        http.map_err(|source| RunError::Http { source })?;
        tracing::info!("stopped");
        Ok(())
    }
}

/// Probes the backend every `interval`; on every change, logs one line and updates the
/// health reports.
async fn probe(
    service: Service,
    health: Health,
    reporter: tonic_health::server::HealthReporter,
    interval: Duration,
) {
    let mut ticks = tokio::time::interval(interval);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticks.tick().await;
    loop {
        ticks.tick().await;
        let problem = service.backend().probe().await.err();
        let failing = problem.clone();
        if health.set_backend(problem) {
            match failing {
                Some(reason) => {
                    tracing::error!(backend = service.backend().name(), %reason, "backend not ready");
                    report(&reporter, false).await;
                }
                None => {
                    tracing::info!(backend = service.backend().name(), "backend ready again");
                    report(&reporter, true).await;
                }
            }
        }
    }
}

/// Cleans expired counters of the rules in force every `interval`.
async fn cleanup(service: Service, interval: Duration) {
    let mut ticks = tokio::time::interval(interval);
    ticks.tick().await;
    loop {
        ticks.tick().await;
        let removed = service.limiters().cleanup_expired(CLEANUP_BATCH).await;
        tracing::debug!(removed, "cleanup of expired counters");
    }
}

/// Sets the gRPC health of the whole server (service `""`, which Envoy's gRPC health checks
/// ask by default) and of `envoy.service.ratelimit.v3.RateLimitService`.
async fn report(reporter: &tonic_health::server::HealthReporter, serving: bool) {
    let status =
        if serving { tonic_health::ServingStatus::Serving } else { tonic_health::ServingStatus::NotServing };
    reporter.set_service_status("", status).await;
    if serving {
        reporter.set_serving::<RateLimitServer>().await;
    } else {
        reporter.set_not_serving::<RateLimitServer>().await;
    }
}

async fn wait(mut stopped: tokio::sync::watch::Receiver<bool>) {
    let _ = stopped.wait_for(|stop| *stop).await;
}

/// The error a failed preparation of `backend` is reported as.
fn prepare_error(backend: &Backend, error: BackendError) -> RunError {
    match error {
        BackendError::RedisPrepare { address, source: source @ PrepareError::Unreachable(_) } => {
            RunError::RedisConnect { address, source }
        }
        BackendError::RedisPrepare { address, source } => RunError::RedisUnsuitable { address, source },
        source => RunError::Backend { backend: backend.name(), source },
    }
}

async fn bind(option: &'static str, address: SocketAddr) -> Result<TcpListener, RunError> {
    TcpListener::bind(address).await.map_err(|source| RunError::Bind { option, address, source })
}

/// Builds the backend `args` selects (not prepared yet: [`Server::serve_with`] prepares it).
async fn backend(args: &Args) -> Result<Backend, RunError> {
    if let Some(url) = &args.redis_url {
        // runlimit-redis' own refusal would quote its bound (64 bytes), not this server's (47).
        let prefix = KeyPrefix::new(&args.redis_key_prefix).map_err(|_| RunError::Backend {
            backend: "redis",
            source: BackendError::RedisKeyPrefix { prefix: args.redis_key_prefix.clone() },
        })?;
        let config = RedisConfig::default()
            .with_key_prefix(prefix)
            .with_maximum_keys_per_shard(args.redis_max_keys_per_shard)
            .map_err(|source| RunError::RedisConfig { source })?;
        return Backend::redis(url, &config).map_err(|source| match source {
            BackendError::RedisUrl { source } => RunError::RedisUrl { source },
            source => RunError::Backend { backend: "redis", source },
        });
    }
    if let Some(url) = &args.database_url {
        // Refuses other schemes, which SQLx would otherwise read as PostgreSQL URLs.
        let options: PgConnectOptions = runlimit_postgres::connect_options_from_url(url)
            .map_err(|source| RunError::DatabaseUrl { source })?;
        let address = format!(
            "{}:{}/{}",
            options.get_host(),
            options.get_port(),
            options.get_database().unwrap_or(options.get_username())
        );
        // One connection first, so that a failure names its cause (a pool would retry until
        // its acquire timeout and report only that).
        match tokio::time::timeout(CONNECT_TIMEOUT, PgConnection::connect_with(&options)).await {
            Err(_) => return Err(RunError::DatabaseTimeout { address, timeout: CONNECT_TIMEOUT }),
            Ok(Err(source)) => return Err(RunError::DatabaseConnect { address, source }),
            Ok(Ok(connection)) => {
                let _ = connection.close().await;
            }
        }
        let pool = PgPoolOptions::new()
            .max_connections(args.database_max_connections)
            .acquire_timeout(CONNECT_TIMEOUT)
            .connect_lazy_with(options);
        return Ok(Backend::postgres(pool, PostgresConfig::default()));
    }
    let config = MemoryStoreConfig::new(args.memory_max_keys)
        .and_then(|config| config.with_shard_count(args.memory_shards))
        .map_err(|source| RunError::MemoryConfig { source })?;
    Ok(Backend::memory(config))
}

/// Installs the process's Prometheus recorder (rendered by `GET /metrics`) and describes the
/// service's metrics and runlimit-metrics' (see the crate README's "Metrics"); `None` when
/// another recorder is already installed.
///
/// Every `*_seconds` histogram gets the same buckets, from 10 µs to 5 s. A thread named
/// `metrics-upkeep` drains histogram samples into their buckets every 5 s, so the recorder's
/// memory stays bounded when nothing scrapes it.
#[must_use]
pub fn install_metrics() -> Option<PrometheusHandle> {
    let handle = PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Suffix("_seconds".to_owned()), metrics::DURATION_BUCKETS)
        .ok()?
        .install_recorder()
        .ok()?;
    metrics::describe();
    runlimit_metrics::MetricsObserver::describe();
    let upkeep = handle.clone();
    // Without the thread, histograms are drained by scrapes only; nothing else depends on it.
    let _ = std::thread::Builder::new().name("metrics-upkeep".to_owned()).spawn(move || {
        loop {
            std::thread::sleep(metrics::UPKEEP_INTERVAL);
            upkeep.run_upkeep();
        }
    });
    Some(handle)
}

/// Prints the two listening lines on stdout (see [`GRPC_LISTENING_PREFIX`] and
/// [`HTTP_LISTENING_PREFIX`]).
///
/// # Errors
///
/// [`RunError::Announce`] when stdout cannot be written.
pub fn announce(grpc: SocketAddr, http: SocketAddr) -> Result<(), RunError> {
    let mut stdout = io::stdout().lock();
    writeln!(stdout, "{GRPC_LISTENING_PREFIX}{grpc}")
        .and_then(|()| writeln!(stdout, "{HTTP_LISTENING_PREFIX}{http}"))
        .and_then(|()| stdout.flush())
        .map_err(|source| RunError::Announce { source })
}

/// Resolves on SIGINT or SIGTERM.
///
/// The signal handlers are installed when this function is called, not when the future is
/// first polled: a signal that arrives in between (say, right after the listening lines are
/// announced, before serving starts) is delivered to the future instead of ending the process
/// by the signal's default action.
///
/// # Panics
///
/// Outside a Tokio runtime.
pub fn shutdown_signal() -> impl Future<Output = ()> + Send + 'static {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{Signal, SignalKind, signal};
        async fn received(signal: io::Result<Signal>) {
            match signal {
                Ok(mut signal) => {
                    signal.recv().await;
                }
                Err(_) => std::future::pending::<()>().await,
            }
        }
        let interrupt = received(signal(SignalKind::interrupt()));
        let terminate = received(signal(SignalKind::terminate()));
        async move {
            tokio::select! {
                () = interrupt => {}
                () = terminate => {}
            }
        }
    }
    #[cfg(not(unix))]
    {
        async {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
