//! Command-line options.

use std::{
    fmt,
    net::{IpAddr, SocketAddr},
};

use runlimit_redis::{ConfigError, KeyPrefix, MAX_KEYS_PER_SHARD};

/// The demo's command-line options (`runlimit-demo --help`).
///
/// Every window and period is in whole seconds, which is what `RateLimit-Policy`'s `w`
/// needs. Limits are validated when the policies are built ([`Gates::new`](crate::Gates::new)):
/// counts must be between 1 and 999,999,999,999,999 (the RFC 9651 integer range the
/// `RateLimit` fields can carry), windows between 1 s and Runlimit's `MAX_WINDOW`.
///
/// The HMAC key secret is deliberately not an option (command lines are visible to other
/// local users); it comes from the `RUNLIMIT_KEY_SECRET` environment variable.
#[derive(Clone, PartialEq, Eq, clap::Parser)]
#[command(
    name = "runlimit-demo",
    version,
    about = "Runlimit demo service: a login endpoint behind a per-client and a per-identity gate, \
             and a GCRA-limited read endpoint",
    long_about = "Runlimit demo service.\n\n\
        POST /login {\"identity\": \"...\", \"password\": \"...\"} passes a per-client gate \
        (memory, before the body is read) and a per-identity gate (normalized identity: trimmed, \
        lowercased); the password check itself is an attempt per identity: one at a time, and \
        after each consecutive failure a backoff doubling from --attempt-initial-delay-secs up \
        to --attempt-delay-cap-secs (429 with Retry-After), reset by a success. \
        GET /items is GCRA-limited per client. \
        GET /healthz reports readiness; GET /metrics serves Prometheus metrics.\n\n\
        With no options everything is in memory. With --database-url (or DATABASE_URL) the \
        identity gate, the attempt limiter and the GCRA gate of /items move to PostgreSQL \
        (migrations applied at start) so replicas share them; the per-client gate stays in memory \
        per process.\n\n\
        With --redis-url (or REDIS_URL) the identity gate and the GCRA gate of /items move to \
        Redis 7 or newer (RedisLimiter, RedisGcraLimiter; the server is checked at start: \
        maxmemory-policy noeviction, not cluster mode) under --redis-key-prefix, so replicas \
        using the same server, prefix and secret share them; the attempt limiter stays in memory, \
        or in PostgreSQL when --database-url is given too (then identity and items use Redis, \
        attempts PostgreSQL). GET /healthz then probes Redis as well.\n\n\
        The HMAC key secret comes from RUNLIMIT_KEY_SECRET (at least 32 bytes); without it an \
        ephemeral secret is generated and counters are not shared across replicas or restarts.\n\n\
        Logs go to stderr (RUST_LOG, default info, PostgreSQL notices from warn); stdout gets one \
        line once the server is bound: 'runlimit-demo listening on http://ADDR'."
)]
pub struct Args {
    /// Address to listen on; port 0 picks a free port (printed on stdout).
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:3000")]
    pub listen: SocketAddr,

    /// PostgreSQL URL for the shared attempt limiter, and for the identity and items gates unless
    /// --redis-url moves them to Redis; without either everything is in memory.
    #[arg(long, value_name = "URL", env = "DATABASE_URL", hide_env_values = true)]
    pub database_url: Option<String>,

    /// Redis URL, redis://USER:PASSWORD@HOST:PORT/DB (all but the host optional), for the shared
    /// identity and items gates; the attempt limiter stays in memory (or PostgreSQL with
    /// --database-url).
    #[arg(long, value_name = "URL", env = "REDIS_URL", hide_env_values = true)]
    pub redis_url: Option<String>,

    /// The namespace of every Redis key (with --redis-url): replicas sharing quotas use the same
    /// prefix. 1 to 64 ASCII letters, digits, '.', '_', '-' or ':'.
    #[arg(long, value_name = "PREFIX", default_value = "runlimit-demo", value_parser = redis_key_prefix)]
    pub redis_key_prefix: KeyPrefix,

    /// Hard bound on keys per Redis shard, for each of the two Redis limiters (256 shards each;
    /// a new key for a full shard is refused with 503, nothing is evicted).
    #[arg(
        long,
        value_name = "N",
        default_value_t = 4_096,
        value_parser = clap::value_parser!(u32).range(1..=i64::from(MAX_KEYS_PER_SHARD))
    )]
    pub redis_max_keys_per_shard: u32,

    /// A proxy whose X-Forwarded-For is trusted: when the socket peer is this address, the
    /// client is the rightmost X-Forwarded-For entry. Repeatable. Without it forwarding headers
    /// are never read.
    #[arg(long = "trusted-proxy", value_name = "IP")]
    pub trusted_proxies: Vec<IpAddr>,

    /// Login attempts allowed per client (IPv4 address or IPv6 /64) per client window.
    #[arg(long, value_name = "N", default_value_t = 40)]
    pub client_limit: u64,

    /// The per-client login window, in whole seconds.
    #[arg(long, value_name = "SECONDS", default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..))]
    pub client_window_secs: u64,

    /// Login attempts allowed per normalized identity per identity window.
    #[arg(long, value_name = "N", default_value_t = 8)]
    pub identity_limit: u64,

    /// The per-identity login window, in whole seconds.
    #[arg(long, value_name = "SECONDS", default_value_t = 600, value_parser = clap::value_parser!(u64).range(1..))]
    pub identity_window_secs: u64,

    /// GET /items: units replenished per client per items period (GCRA quota, at least 1).
    #[arg(long, value_name = "N", default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..))]
    pub items_quota: u64,

    /// GET /items: the GCRA period, in whole seconds.
    #[arg(long, value_name = "SECONDS", default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
    pub items_period_secs: u64,

    /// GET /items: the most requests a rested client may send at once (GCRA burst capacity,
    /// at least 1).
    #[arg(long, value_name = "N", default_value_t = 20, value_parser = clap::value_parser!(u64).range(1..))]
    pub items_burst: u64,

    /// Password-check attempts per normalized identity (`login-attempts`): the backoff after
    /// the first consecutive failure, in whole seconds. Each further failure doubles it, up to
    /// --attempt-delay-cap-secs; a successful login resets it.
    #[arg(long, value_name = "SECONDS", default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
    pub attempt_initial_delay_secs: u64,

    /// The longest backoff between password-check attempts for one identity, in whole seconds
    /// (at least --attempt-initial-delay-secs).
    #[arg(long, value_name = "SECONDS", default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..))]
    pub attempt_delay_cap_secs: u64,

    /// Failure history of an identity is forgotten after this many whole seconds without a
    /// failure (at least --attempt-delay-cap-secs).
    #[arg(long, value_name = "SECONDS", default_value_t = 900, value_parser = clap::value_parser!(u64).range(1..))]
    pub attempt_quiet_period_secs: u64,

    /// How long one admitted password check may take, in whole seconds; meanwhile other
    /// checks of the same identity are refused, and an attempt never completed counts as a
    /// failure at this deadline.
    #[arg(long, value_name = "SECONDS", default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..))]
    pub attempt_lease_secs: u64,

    /// Hard bound on keys held by each memory store (client, items, and the in-memory
    /// identity gate and attempt limiter each get their own store of this size).
    #[arg(long, value_name = "N", default_value_t = 100_000)]
    pub memory_max_keys: usize,

    /// Shards per memory store (more shards, less lock contention; capacity is split evenly).
    #[arg(long, value_name = "N", default_value_t = 16)]
    pub memory_shards: usize,

    /// Most pooled PostgreSQL connections (with --database-url).
    #[arg(long, value_name = "N", default_value_t = 16)]
    pub database_max_connections: u32,

    /// Seconds between bounded cleanups of expired fixed-window and GCRA state in PostgreSQL
    /// (with --database-url) and Redis (with --redis-url).
    #[arg(long, value_name = "SECONDS", default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..))]
    pub cleanup_interval_secs: u64,
}

/// Parses `--redis-key-prefix`.
fn redis_key_prefix(prefix: &str) -> Result<KeyPrefix, ConfigError> {
    KeyPrefix::new(prefix)
}

impl fmt::Debug for Args {
    /// Every option except the database and Redis URLs, which may embed a password: only
    /// whether one is set is shown.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Args")
            .field("listen", &self.listen)
            .field("database_url", &self.database_url.as_ref().map(|_| "<redacted>"))
            .field("redis_url", &self.redis_url.as_ref().map(|_| "<redacted>"))
            .field("redis_key_prefix", &self.redis_key_prefix)
            .field("redis_max_keys_per_shard", &self.redis_max_keys_per_shard)
            .field("trusted_proxies", &self.trusted_proxies)
            .field("client_limit", &self.client_limit)
            .field("client_window_secs", &self.client_window_secs)
            .field("identity_limit", &self.identity_limit)
            .field("identity_window_secs", &self.identity_window_secs)
            .field("items_quota", &self.items_quota)
            .field("items_period_secs", &self.items_period_secs)
            .field("items_burst", &self.items_burst)
            .field("attempt_initial_delay_secs", &self.attempt_initial_delay_secs)
            .field("attempt_delay_cap_secs", &self.attempt_delay_cap_secs)
            .field("attempt_quiet_period_secs", &self.attempt_quiet_period_secs)
            .field("attempt_lease_secs", &self.attempt_lease_secs)
            .field("memory_max_keys", &self.memory_max_keys)
            .field("memory_shards", &self.memory_shards)
            .field("database_max_connections", &self.database_max_connections)
            .field("cleanup_interval_secs", &self.cleanup_interval_secs)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser as _;

    use super::*;

    #[test]
    fn defaults() {
        let args = Args::try_parse_from(["runlimit-demo"]).unwrap();
        assert_eq!(args.listen, "127.0.0.1:3000".parse::<SocketAddr>().unwrap());
        assert!(args.trusted_proxies.is_empty());
        assert_eq!((args.client_limit, args.client_window_secs), (40, 60));
        assert_eq!((args.identity_limit, args.identity_window_secs), (8, 600));
        assert_eq!((args.items_quota, args.items_period_secs, args.items_burst), (10, 1, 20));
        assert_eq!(
            (
                args.attempt_initial_delay_secs,
                args.attempt_delay_cap_secs,
                args.attempt_quiet_period_secs,
                args.attempt_lease_secs
            ),
            (1, 60, 900, 30)
        );
        assert_eq!(args.redis_url, None);
        assert_eq!(args.redis_key_prefix.as_str(), "runlimit-demo");
        assert_eq!(args.redis_max_keys_per_shard, 4_096);
    }

    #[test]
    fn redis_options() {
        let args = Args::try_parse_from([
            "runlimit-demo",
            "--redis-url",
            "redis://:hunter2@127.0.0.1:6379/0",
            "--redis-key-prefix",
            "demo.e2e-1:x",
            "--redis-max-keys-per-shard",
            "1048576",
        ])
        .unwrap();
        assert_eq!(args.redis_url.as_deref(), Some("redis://:hunter2@127.0.0.1:6379/0"));
        assert_eq!(args.redis_key_prefix.as_str(), "demo.e2e-1:x");
        assert_eq!(args.redis_max_keys_per_shard, 1_048_576);
        let debug = format!("{args:?}");
        assert!(!debug.contains("hunter2"), "{debug}");
        assert!(debug.contains(r#"redis_url: Some("<redacted>")"#), "{debug}");

        let error = Args::try_parse_from(["runlimit-demo", "--redis-key-prefix", "a{b}"]).unwrap_err();
        assert_eq!(
            error.to_string().lines().next().unwrap(),
            "error: invalid value 'a{b}' for '--redis-key-prefix <PREFIX>': key prefix must be 1 to 64 \
             ASCII letters, digits, '.', '_', '-' or ':'"
        );
        let error =
            Args::try_parse_from(["runlimit-demo", "--redis-max-keys-per-shard", "1048577"]).unwrap_err();
        assert_eq!(
            error.to_string().lines().next().unwrap(),
            "error: invalid value '1048577' for '--redis-max-keys-per-shard <N>': 1048577 is not in 1..=1048576"
        );
    }

    #[test]
    fn debug_redacts_the_database_url() {
        let args = Args::try_parse_from([
            "runlimit-demo",
            "--database-url",
            "postgres://user:hunter2@db/x",
            "--trusted-proxy",
            "10.0.0.1",
            "--trusted-proxy",
            "::1",
        ])
        .unwrap();
        let debug = format!("{args:?}");
        assert!(!debug.contains("hunter2"), "{debug}");
        assert!(debug.contains(r#"database_url: Some("<redacted>")"#), "{debug}");
        assert_eq!(args.trusted_proxies, ["10.0.0.1".parse::<IpAddr>().unwrap(), "::1".parse().unwrap()]);
    }
}
