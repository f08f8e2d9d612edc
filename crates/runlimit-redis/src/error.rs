//! One error type per operation, each classifying whether quota (or stored state) may have
//! changed.

use std::time::Duration;

use redis::RedisError;
use runlimit_core::{BatchError, ConsumptionStatus};

use crate::client::Failure;

/// Why a single check (or a [`peek`](crate::RedisStore::peek)) could not be evaluated. Treat
/// every variant as an admission failure (fail closed).
///
/// [`consumption`](Self::consumption) says whether quota may have been consumed:
/// [`Timeout`](Self::Timeout) and [`Connection`](Self::Connection) (the request had been handed
/// to the connection) report [`ConsumptionStatus::MayHaveBeenConsumed`], as does a
/// [`MalformedReply`](Self::MalformedReply) that does not say nothing was written; every other
/// variant reports [`ConsumptionStatus::NotConsumed`]. Runlimit never retries an admission
/// (except resending a script the server answered `NOSCRIPT` to, which did not run); never
/// replay one whose consumption is unknown.
///
/// `Display` of [`Server`](Self::Server) shows only the reply's code; the messages of
/// [`Connect`](Self::Connect) and [`NoPrimary`](Self::NoPrimary) include their cause (which
/// may quote a server's reply); none shows a password.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CheckError {
    /// No connection to the server at `address` could be obtained within
    /// [`connect_timeout`](crate::RedisConfig::connect_timeout) (a reconnect in progress, a
    /// slow TCP connect, TLS or protocol handshake). Nothing was sent.
    #[error("timed out after {timeout:?} connecting to Redis at {address}")]
    ConnectTimeout {
        /// The server tried: `host:port` or `unix:<path>` (never credentials).
        address: String,
        /// The configured connect timeout.
        timeout: Duration,
    },
    /// Opening a connection to the server at `address` failed: refused, unreachable, a TLS
    /// failure (an untrusted certificate, one issued for another host name, a client
    /// certificate the server refused), or an authentication or handshake failure. Nothing
    /// was sent. The message gives the cause (`cause`'s message).
    #[error("could not connect to Redis at {address}: {cause}")]
    Connect {
        /// The server tried: `host:port` or `unix:<path>` (never credentials).
        address: String,
        /// redis-rs' error (TLS failures are its I/O errors, carrying rustls' error). Not
        /// reported as [`source`](std::error::Error::source): the message already says it.
        cause: RedisError,
    },
    /// The [eviction watch](crate::RedisConnector#the-eviction-watch) (or the last
    /// [`prepare`](crate::RedisStore::prepare)) found the server at `address` with the
    /// evicting `maxmemory-policy` `policy`: every operation fails closed, before anything is
    /// sent, until a reading of `noeviction`.
    #[error(
        "Redis at {address} has maxmemory-policy {policy}, which would evict quota state: refusing every \
         operation until it is noeviction"
    )]
    EvictingServer {
        /// The server: `host:port` or `unix:<path>`.
        address: String,
        /// The policy read, such as `allkeys-lru`.
        policy: String,
    },
    /// With [Redis Sentinel](crate::RedisSentinel): no Sentinel named a primary that answers
    /// as one (every Sentinel unreachable, none monitoring the service, or a failover in
    /// progress). Nothing was sent.
    #[error("no Sentinel of {sentinels} named a reachable primary for service {service}: {cause}")]
    NoPrimary {
        /// The monitored service's name.
        service: String,
        /// The Sentinels asked, `host:port` separated by `, `.
        sentinels: String,
        /// Why, in one of these forms:
        /// - `<address>: <why>`: every Sentinel answered within the connect timeout and none
        ///   named a usable primary; the reason of the last Sentinel in configured order (the
        ///   Sentinels are asked concurrently; which one answered last does not matter);
        /// - `names <primary>, whose maxmemory-policy could not be read: <why>`: a Sentinel
        ///   named a new primary whose eviction policy could not be read;
        /// - `no Sentinel named a usable primary within <connect timeout>`: the connect timeout
        ///   elapsed before every Sentinel had answered (a silent Sentinel).
        cause: String,
    },
    /// The server answered with an error reply: the script was refused before it ran
    /// (`NOSCRIPT` after a reload, `OOM` over `maxmemory`, `BUSY`, `READONLY` on a replica,
    /// `LOADING`, a cluster redirection such as `MOVED`, `ASK`, `TRYAGAIN` or `CROSSSLOT`) or
    /// stopped before its first write (`RUNLIMIT ...`: a malformed stored value). Nothing was
    /// written.
    #[error("Redis refused the operation with {code}")]
    Server {
        /// The reply's error code, such as `OOM`, `BUSY`, `MOVED` or `RUNLIMIT`.
        code: String,
        /// redis-rs' error (its detail is the server's message).
        #[source]
        source: RedisError,
    },
    /// The [`operation_timeout`](crate::RedisConfig::operation_timeout) elapsed after the
    /// request was handed to the connection: the script may have run. The connection is
    /// replaced.
    #[error("timed out after {timeout:?} waiting for Redis after the request was sent")]
    Timeout {
        /// The configured operation timeout.
        timeout: Duration,
    },
    /// The connection failed after the request was handed to it (an I/O error, the connection
    /// closed): the script may have run. The connection is replaced.
    #[error("the Redis connection failed after the request was sent")]
    Connection {
        /// redis-rs' error.
        #[source]
        source: RedisError,
    },
    /// The script's reply did not have the expected shape, or did not agree with the decision
    /// `runlimit_core`'s rules compute from the state it read (a defect or a foreign writer).
    #[error("malformed Redis reply: {reason}")]
    MalformedReply {
        /// What was wrong, as a fixed description.
        reason: &'static str,
        /// Whether the script may have written: `NotConsumed` when its reply said it wrote
        /// nothing.
        consumption: ConsumptionStatus,
    },
}

impl CheckError {
    /// Whether quota may have been consumed; see the [type docs](Self).
    #[must_use]
    pub fn consumption(&self) -> ConsumptionStatus {
        match self {
            Self::ConnectTimeout { .. }
            | Self::Connect { .. }
            | Self::EvictingServer { .. }
            | Self::NoPrimary { .. }
            | Self::Server { .. } => ConsumptionStatus::NotConsumed,
            Self::Timeout { .. } | Self::Connection { .. } => ConsumptionStatus::MayHaveBeenConsumed,
            Self::MalformedReply { consumption, .. } => *consumption,
        }
    }
}

impl From<Failure> for CheckError {
    fn from(failure: Failure) -> Self {
        match failure {
            Failure::ConnectTimeout(node, timeout) => {
                Self::ConnectTimeout { address: node.to_string(), timeout }
            }
            Failure::Connect(node, cause) => Self::Connect { address: node.to_string(), cause },
            Failure::Evicting(node, policy) => Self::EvictingServer { address: node.to_string(), policy },
            Failure::NoPrimary { service, sentinels, cause } => Self::NoPrimary { service, sentinels, cause },
            Failure::Server(source) => Self::Server { code: code(&source), source },
            Failure::Timeout(timeout) => Self::Timeout { timeout },
            Failure::Connection(source) => Self::Connection { source },
        }
    }
}

/// An error reply's code (`ERR` when it has none).
fn code(error: &RedisError) -> String {
    error.code().unwrap_or("ERR").to_owned()
}

/// Why an atomic batch could not be evaluated.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BatchCheckError {
    /// The batch is structurally invalid (empty, larger than
    /// [`MAX_BATCH_SIZE`](crate::RedisStore::MAX_BATCH_SIZE), mixed quota modes, duplicate
    /// keys): rejected before any I/O.
    #[error("invalid batch")]
    InvalidBatch(#[source] BatchError),
    /// More distinct keys of the batch fall into one shard than the shard can ever hold:
    /// waiting cannot make the batch fit. Rejected before any I/O.
    #[error("batch puts {key_count} keys into shard {shard_index}, which holds at most {capacity}")]
    BatchExceedsShardCapacity {
        /// The shard.
        shard_index: usize,
        /// The batch's keys in that shard.
        key_count: usize,
        /// The shard's capacity.
        capacity: usize,
    },
    /// Under [`Placement::PerShard`](crate::Placement::PerShard), the batch's checks fall into
    /// more than one shard, so no single script (hash slot) can hold them: rejected before any
    /// I/O, on every server, so it never works on one and fails on a cluster.
    #[error(
        "batch spans shards {first_shard} and {other_shard}, which per-shard placement cannot make atomic"
    )]
    SpansShards {
        /// The first check's shard.
        first_shard: usize,
        /// The first other shard found, in input order.
        other_shard: usize,
    },
    /// The same failures as a single check.
    #[error(transparent)]
    Check(#[from] CheckError),
}

impl BatchCheckError {
    /// Whether quota may have been consumed: only [`Check`](Self::Check) errors may.
    #[must_use]
    pub fn consumption(&self) -> ConsumptionStatus {
        match self {
            Self::Check(error) => error.consumption(),
            _ => ConsumptionStatus::NotConsumed,
        }
    }
}

/// Why a [`reset`](crate::RedisStore::reset) or a
/// [`cleanup_expired`](crate::RedisStore::cleanup_expired) pass failed.
///
/// [`may_have_removed_entries`](Self::may_have_removed_entries) says whether stored state may
/// have been removed anyway (the failure came after the request was sent, or a cleanup pass
/// removed entries from earlier shards before failing).
#[derive(Debug, thiserror::Error)]
#[error("Redis maintenance failed")]
pub struct MaintenanceError {
    #[source]
    source: CheckError,
    removed_before: u64,
}

impl MaintenanceError {
    pub(crate) fn new(source: CheckError, removed_before: u64) -> Self {
        Self { source, removed_before }
    }

    /// The failure, classified as for a check.
    #[must_use]
    pub fn cause(&self) -> &CheckError {
        &self.source
    }

    /// Entries a cleanup pass had removed (and confirmed) from earlier shards before it failed;
    /// 0 for a reset.
    #[must_use]
    pub const fn removed_before_failure(&self) -> u64 {
        self.removed_before
    }

    /// Whether entries may have been removed: confirmed removals before the failure, or a
    /// failure of uncertain outcome.
    #[must_use]
    pub fn may_have_removed_entries(&self) -> bool {
        self.removed_before > 0 || self.source.consumption() == ConsumptionStatus::MayHaveBeenConsumed
    }
}

/// Why [`prepare`](crate::RedisStore::prepare) refused the server.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PrepareError {
    /// The server could not be reached or answered with an error; the message says which
    /// server and why.
    #[error("could not prepare the Redis server: {0}")]
    Unreachable(CheckError),
    /// The Redis user may not run `INFO` (an ACL `NOPERM` reply), which `prepare` reads to
    /// check the version and `maxmemory-policy`.
    #[error(
        "the Redis user may not run INFO at {address}, so the server's maxmemory-policy cannot be checked: grant \
         the user +info, or vouch for noeviction with RedisConnector::vouch_for_noeviction"
    )]
    InfoNotPermitted {
        /// The server: `host:port` or `unix:<path>`.
        address: String,
    },
    /// The server is older than Redis 7.0, whose scripts replicate their effects (so `TIME`
    /// inside a script is safe) and accept flags (so an out-of-memory server refuses them
    /// before they run).
    #[error("Redis {version} at {address} is too old: Runlimit needs Redis 7.0 or newer")]
    ServerTooOld {
        /// The server: `host:port` or `unix:<path>`.
        address: String,
        /// The `redis_version` the server reported.
        version: String,
    },
    /// The server's `maxmemory-policy` is not `noeviction`: eviction would silently delete
    /// quota state and reset limits. Operations through the limiter's connector fail with
    /// [`CheckError::EvictingServer`] from then on, until a reading of `noeviction`.
    #[error(
        "Redis at {address} has maxmemory-policy {policy}: Runlimit needs noeviction, so no quota state is ever \
         evicted (CONFIG SET maxmemory-policy noeviction)"
    )]
    EvictionPolicy {
        /// The server: `host:port` or `unix:<path>`.
        address: String,
        /// The policy the server reported.
        policy: String,
    },
    /// `INFO` did not report a field Runlimit reads.
    #[error("the Redis server's INFO reply lacks {field}")]
    MissingInfo {
        /// The field.
        field: &'static str,
    },
}

/// Why a Redis URL was refused by [`RedisConnector::new`](crate::RedisConnector::new),
/// [`RedisConnector::with_tls`](crate::RedisConnector::with_tls) or
/// [`RedisStore::new`](crate::RedisStore::new).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum UrlError {
    /// The URL is not a Redis URL redis-rs can parse.
    #[error("invalid Redis URL: {0}")]
    Invalid(RedisError),
    /// The URL names a transport this crate does not open: see the URL table of
    /// [`RedisConnector`](crate::RedisConnector).
    #[error(
        "unsupported Redis URL: use redis://host[:port][/db], rediss://host[:port][/db] (TLS) or \
         redis+unix:///path/to/socket"
    )]
    UnsupportedScheme,
    /// A [`RedisSentinel`](crate::RedisSentinel) was given no Sentinel or an empty service
    /// name.
    #[error("Redis Sentinel needs a service name and at least one Sentinel URL")]
    NoSentinels,
    /// TLS settings were given for a URL that is not `rediss://` (or `valkeys://`).
    #[error("TLS settings were given for a URL that is not rediss://: use rediss://host[:port]")]
    TlsNeedsRediss,
    /// The TLS settings could not be used.
    #[error("cannot set up TLS for Redis: {0}")]
    Tls(TlsError),
}

/// Why [`RedisTls`](crate::RedisTls) settings were refused.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TlsError {
    /// Not one trusted root certificate could be loaded from the operating system.
    #[error(
        "no trusted root certificate could be loaded from the system ({errors} errors): install the CA \
         certificates (Debian/Ubuntu: ca-certificates), set SSL_CERT_FILE, or give the CA with RedisTls::with_ca_file"
    )]
    NoSystemRoots {
        /// How many errors the loader reported.
        errors: usize,
    },
    /// The CA file could not be read.
    #[error("could not read the CA file {}: {source}", path.display())]
    ReadCaFile {
        /// The file.
        path: std::path::PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A PEM document was malformed, or held no item of the expected kind.
    #[error("{what} is not valid PEM: {detail}")]
    InvalidPem {
        /// `"the CA PEM"`, `"the client certificate chain"` or `"the client key"`.
        what: &'static str,
        /// The parser's message.
        detail: String,
    },
    /// A PEM document held no `CERTIFICATE` block.
    #[error("{what} holds no PEM certificate")]
    NoCertificates {
        /// `"the CA PEM"` or `"the client certificate chain"`.
        what: &'static str,
    },
    /// A certificate could not be used as a trust anchor.
    #[error("a certificate of {what} cannot be trusted as a root: {detail}")]
    InvalidCertificate {
        /// `"the CA PEM"`.
        what: &'static str,
        /// rustls' message.
        detail: String,
    },
    /// rustls refused the client certificate or its key (such as a key that does not match).
    #[error("the client certificate or key was refused: {detail}")]
    InvalidClientCertificate {
        /// rustls' message.
        detail: String,
    },
    /// rustls refused the configuration.
    #[error("the TLS configuration was refused: {detail}")]
    Configuration {
        /// rustls' message.
        detail: String,
    },
}
