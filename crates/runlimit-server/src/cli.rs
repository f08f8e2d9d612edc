//! The command line (`runlimit-server --help`).

use std::{fmt, net::SocketAddr, path::PathBuf};

use clap::{Parser, Subcommand, ValueEnum};

use crate::service::{BackendErrorMode, HeaderFormat};

/// `runlimit-server`'s command line. Every option can also come from the environment variable
/// named in `--help`; an option on the command line wins over its variable.
#[derive(Clone, PartialEq, Eq, Parser)]
#[command(
    name = "runlimit-server",
    version,
    about = "A rate limit service for Envoy (RLS v3 gRPC) reading envoyproxy/ratelimit's YAML rule files, \
             with one atomic Runlimit batch per request",
    long_about = "A rate limit service for Envoy and everything built on it (Istio, Envoy Gateway, Gloo, \
        Contour), answering envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit over gRPC, \
        with the grpc.health.v1 health service beside it.\n\n\
        Rules are envoyproxy/ratelimit's YAML files, unchanged: --config names one file or a \
        directory whose *.yaml and *.yml files are read. Each request is one atomic batch: either \
        every matched rule is charged its hits, or, when any is over its limit, none is.\n\n\
        Counters live in memory (the default; per process), in Redis (--redis-url) or in PostgreSQL \
        (--database-url), the last two shared by every replica using the same server and key secret.\n\n\
        Descriptor values are stored only as HMAC-SHA-256 keys. The secret comes from \
        --key-secret-file (or RUNLIMIT_KEY_SECRET_FILE), or from RUNLIMIT_KEY_SECRET itself (its raw \
        bytes, at least 32); without either, a random secret is generated and counters are neither \
        shared nor kept across restarts.\n\n\
        Once serving, two lines go to stdout: 'grpc listening on HOST:PORT' and 'http listening on \
        HOST:PORT' (port 0 picks a free port). Logs go to stderr (RUST_LOG, default info, \
        PostgreSQL notices from warn).\n\n\
        'runlimit-server check-config PATH' validates rule files and exits 0, or 1 with every \
        problem, one per line.",
    args_conflicts_with_subcommands = true,
    subcommand_negates_reqs = true
)]
pub struct Args {
    /// A subcommand instead of serving.
    #[command(subcommand)]
    pub command: Option<Command>,

    /// The rule file, or a directory of *.yaml / *.yml rule files (envoyproxy/ratelimit's format).
    #[arg(long, value_name = "PATH", env = "RUNLIMIT_CONFIG", required = true)]
    pub config: Option<PathBuf>,

    /// The gRPC address (RateLimitService and grpc.health.v1); port 0 picks a free port.
    #[arg(long, value_name = "ADDR", env = "RUNLIMIT_GRPC_ADDR", default_value = "127.0.0.1:8081")]
    pub grpc_addr: SocketAddr,

    /// The HTTP address (GET /healthcheck, GET /metrics); port 0 picks a free port.
    #[arg(long, value_name = "ADDR", env = "RUNLIMIT_HTTP_ADDR", default_value = "127.0.0.1:8080")]
    pub http_addr: SocketAddr,

    // The URL patterns' brackets would be intra-doc links to rustdoc, and backticks would show
    // in --help: so the doc comments quote them and `help` spells the text --help shows.
    /// Keep counters in Redis 7 or newer (`redis://[USER:PASSWORD@]HOST[:PORT][/DB]`; standalone
    /// or Cluster, maxmemory-policy noeviction), shared by every replica with the same URL, prefix
    /// and key secret.
    #[arg(
        help = "Keep counters in Redis 7 or newer (redis://[USER:PASSWORD@]HOST[:PORT][/DB]; standalone or Cluster, \
                maxmemory-policy noeviction), shared by every replica with the same URL, prefix and key secret",
        long,
        value_name = "URL",
        env = "RUNLIMIT_REDIS_URL",
        hide_env_values = true,
        conflicts_with = "database_url"
    )]
    pub redis_url: Option<String>,

    /// Keep counters in PostgreSQL (`postgres://USER[:PASSWORD]@HOST[:PORT]/DATABASE`), shared
    /// by every replica with the same database and key secret; migrations are applied at start.
    #[arg(
        help = "Keep counters in PostgreSQL (postgres://USER[:PASSWORD]@HOST[:PORT]/DATABASE), shared by every replica \
                with the same database and key secret; migrations are applied at start",
        long,
        value_name = "URL",
        env = "RUNLIMIT_DATABASE_URL",
        hide_env_values = true
    )]
    pub database_url: Option<String>,

    /// A file holding the HMAC key secret: its bytes (at least 32), less one trailing newline.
    /// Instead, RUNLIMIT_KEY_SECRET may hold the secret itself.
    #[arg(long, value_name = "FILE", env = "RUNLIMIT_KEY_SECRET_FILE")]
    pub key_secret_file: Option<PathBuf>,

    /// Global shadow mode: every rule is evaluated and over-limit descriptors are reported and
    /// counted, but requests are answered OK and a request that would have been denied consumes
    /// nothing (a full store still denies: storage bounds are enforced in every mode). The
    /// variable accepts true/false, yes/no, on/off or 1/0.
    #[arg(
        long,
        env = "RUNLIMIT_SHADOW_MODE",
        action = clap::ArgAction::SetTrue,
        value_parser = clap::builder::BoolishValueParser::new()
    )]
    pub shadow_mode: bool,

    /// Add rate limit response headers: draft-11 (RateLimit-Policy, RateLimit, and Retry-After
    /// when over the limit) or envoy-ratelimit (RateLimit-Limit, RateLimit-Remaining,
    /// RateLimit-Reset, as envoyproxy/ratelimit adds them). None by default.
    #[arg(long, value_name = "FORMAT", env = "RUNLIMIT_RESPONSE_HEADERS")]
    pub response_headers: Option<HeaderFormatArg>,

    /// The answer when the backend fails: unavailable (gRPC UNAVAILABLE, so Envoy's
    /// failure_mode_deny decides), over-limit (fail closed) or ok (fail open).
    #[arg(long, value_name = "ANSWER", env = "RUNLIMIT_ON_BACKEND_ERROR", default_value = "unavailable")]
    pub on_backend_error: BackendErrorArg,

    /// The base of every Redis key (with --redis-url): replicas sharing quotas use the same one.
    /// 1 to 47 ASCII letters, digits, '.', '_', '-' or ':'.
    #[arg(long, value_name = "PREFIX", env = "RUNLIMIT_REDIS_KEY_PREFIX", default_value = "runlimit-server")]
    pub redis_key_prefix: String,

    /// Hard bound on keys per Redis shard, per domain and algorithm (256 shards each; a new key
    /// for a full shard is denied OVER_LIMIT, nothing is evicted).
    #[arg(long, value_name = "N", env = "RUNLIMIT_REDIS_MAX_KEYS_PER_SHARD", default_value_t = 4_096)]
    pub redis_max_keys_per_shard: u32,

    /// Hard bound on keys held in memory, per algorithm (a new key for a full shard is denied
    /// OVER_LIMIT; live counters are never evicted).
    #[arg(long, value_name = "N", env = "RUNLIMIT_MEMORY_MAX_KEYS", default_value_t = 1_000_000)]
    pub memory_max_keys: usize,

    /// Shards of each memory store (more shards, less lock contention; the bound is split
    /// evenly between them).
    #[arg(long, value_name = "N", env = "RUNLIMIT_MEMORY_SHARDS", default_value_t = 16)]
    pub memory_shards: usize,

    /// Most pooled PostgreSQL connections (with --database-url); at least 1.
    #[arg(
        long,
        value_name = "N",
        env = "RUNLIMIT_DATABASE_MAX_CONNECTIONS",
        default_value_t = 16,
        value_parser = clap::value_parser!(u32).range(1..)
    )]
    pub database_max_connections: u32,

    /// Seconds between bounded cleanups of expired counters in Redis or PostgreSQL.
    #[arg(
        long,
        value_name = "SECONDS",
        env = "RUNLIMIT_CLEANUP_INTERVAL_SECS",
        default_value_t = 60,
        value_parser = clap::value_parser!(u64).range(1..)
    )]
    pub cleanup_interval_secs: u64,

    /// Seconds between reads of the rule files, which are reloaded when they changed (besides
    /// file-system events and SIGHUP; polling finds changes on file systems that send no
    /// events).
    #[arg(
        long,
        value_name = "SECONDS",
        env = "RUNLIMIT_CONFIG_POLL_INTERVAL_SECS",
        default_value_t = 10,
        value_parser = clap::value_parser!(u64).range(1..=86_400)
    )]
    pub config_poll_interval_secs: u64,

    /// Seconds between readiness probes of the backend (Redis: reachable, Redis 7, still
    /// maxmemory-policy noeviction; PostgreSQL: answers), reported by GET /healthcheck and the
    /// gRPC health service.
    #[arg(
        long,
        value_name = "SECONDS",
        env = "RUNLIMIT_PROBE_INTERVAL_SECS",
        default_value_t = 5,
        value_parser = clap::value_parser!(u64).range(1..=3_600)
    )]
    pub probe_interval_secs: u64,

    /// Log format on stderr: text (one human-readable line per event) or json (one JSON
    /// object per line). The level comes from RUST_LOG (default info, PostgreSQL notices from
    /// warn).
    #[arg(long, value_name = "FORMAT", env = "RUNLIMIT_LOG_FORMAT", default_value = "text")]
    pub log_format: LogFormat,
}

/// `--log-format`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// One human-readable line per event.
    Text,
    /// One JSON object per line.
    Json,
}

/// A subcommand.
#[derive(Clone, Debug, PartialEq, Eq, Subcommand)]
pub enum Command {
    /// Validate rule files: exit 0 when valid, or 1 with every problem (file, path, cause), one
    /// per line on stderr.
    CheckConfig {
        /// The rule file or directory.
        #[arg(value_name = "PATH")]
        path: PathBuf,
        /// The rule files in service now: also list the rules whose counters the change would
        /// start afresh (changed limit, unit, algorithm or burst), on stdout.
        #[arg(long, value_name = "PATH")]
        previous: Option<PathBuf>,
    },
}

/// `--response-headers`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum HeaderFormatArg {
    /// RateLimit-Policy and RateLimit (IETF draft-11), Retry-After when over the limit.
    #[value(name = "draft-11")]
    Draft11,
    /// RateLimit-Limit, RateLimit-Remaining, RateLimit-Reset, as envoyproxy/ratelimit adds them.
    EnvoyRatelimit,
}

impl From<HeaderFormatArg> for HeaderFormat {
    fn from(format: HeaderFormatArg) -> Self {
        match format {
            HeaderFormatArg::Draft11 => Self::Draft11,
            HeaderFormatArg::EnvoyRatelimit => Self::EnvoyRatelimit,
        }
    }
}

/// `--on-backend-error`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum BackendErrorArg {
    /// gRPC UNAVAILABLE: Envoy's failure_mode_deny decides.
    Unavailable,
    /// OVER_LIMIT: fail closed.
    OverLimit,
    /// OK: fail open.
    Ok,
}

impl From<BackendErrorArg> for BackendErrorMode {
    fn from(answer: BackendErrorArg) -> Self {
        match answer {
            BackendErrorArg::Unavailable => Self::Unavailable,
            BackendErrorArg::OverLimit => Self::OverLimit,
            BackendErrorArg::Ok => Self::Ok,
        }
    }
}

impl fmt::Debug for Args {
    /// Every option except the Redis and database URLs, which may embed a password: only
    /// whether one is set is shown.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Args")
            .field("command", &self.command)
            .field("config", &self.config)
            .field("grpc_addr", &self.grpc_addr)
            .field("http_addr", &self.http_addr)
            .field("redis_url", &self.redis_url.as_ref().map(|_| "<redacted>"))
            .field("database_url", &self.database_url.as_ref().map(|_| "<redacted>"))
            .field("key_secret_file", &self.key_secret_file)
            .field("shadow_mode", &self.shadow_mode)
            .field("response_headers", &self.response_headers)
            .field("on_backend_error", &self.on_backend_error)
            .field("redis_key_prefix", &self.redis_key_prefix)
            .field("redis_max_keys_per_shard", &self.redis_max_keys_per_shard)
            .field("memory_max_keys", &self.memory_max_keys)
            .field("memory_shards", &self.memory_shards)
            .field("database_max_connections", &self.database_max_connections)
            .field("cleanup_interval_secs", &self.cleanup_interval_secs)
            .field("config_poll_interval_secs", &self.config_poll_interval_secs)
            .field("probe_interval_secs", &self.probe_interval_secs)
            .field("log_format", &self.log_format)
            .finish()
    }
}
