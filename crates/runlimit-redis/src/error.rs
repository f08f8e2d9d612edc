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
/// `Debug` and `Display` never show a server error's detail text.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CheckError {
    /// No connection could be obtained within
    /// [`connect_timeout`](crate::RedisConfig::connect_timeout) (a reconnect in progress, a
    /// slow TCP connect or handshake). Nothing was sent.
    #[error("timed out after {timeout:?} obtaining a Redis connection")]
    ConnectTimeout {
        /// The configured connect timeout.
        timeout: Duration,
    },
    /// Opening a connection failed (refused, unreachable, authentication or handshake
    /// failure). Nothing was sent.
    #[error("failed to open a Redis connection")]
    Connect {
        /// redis-rs' error.
        #[source]
        source: RedisError,
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
            Self::ConnectTimeout { .. } | Self::Connect { .. } | Self::Server { .. } => {
                ConsumptionStatus::NotConsumed
            }
            Self::Timeout { .. } | Self::Connection { .. } => ConsumptionStatus::MayHaveBeenConsumed,
            Self::MalformedReply { consumption, .. } => *consumption,
        }
    }
}

impl From<Failure> for CheckError {
    fn from(failure: Failure) -> Self {
        match failure {
            Failure::ConnectTimeout(timeout) => Self::ConnectTimeout { timeout },
            Failure::Connect(source) => Self::Connect { source },
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
    /// The server could not be reached or answered with an error.
    #[error("could not prepare the Redis server")]
    Unreachable(#[source] CheckError),
    /// The server is older than Redis 7.0, whose scripts replicate their effects (so `TIME`
    /// inside a script is safe) and accept flags (so an out-of-memory server refuses them
    /// before they run).
    #[error("Redis {version} is too old: Runlimit needs Redis 7.0 or newer")]
    ServerTooOld {
        /// The `redis_version` the server reported.
        version: String,
    },
    /// The server's `maxmemory-policy` is not `noeviction`: eviction would silently delete
    /// quota state and reset limits.
    #[error("maxmemory-policy is {policy}: Runlimit needs noeviction, so no quota state is ever evicted")]
    EvictionPolicy {
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

/// Why a Redis URL was refused by [`RedisStore::new`](crate::RedisStore::new).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum UrlError {
    /// The URL is not a Redis URL redis-rs can parse.
    #[error("invalid Redis URL")]
    Invalid(#[source] RedisError),
    /// The URL names a transport this crate does not open (a Unix socket): only
    /// `redis://host[:port][/db]` with optional credentials. (A TLS `rediss://` URL is
    /// [`Invalid`](Self::Invalid): this build has no TLS support, and redis-rs refuses it while
    /// parsing.)
    #[error("unsupported Redis URL: only redis://host[:port][/db] is supported")]
    UnsupportedScheme,
}
