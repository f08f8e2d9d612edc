//! Validated Redis backend configuration.

use std::{fmt, time::Duration};

/// The number of capacity shards: 256, one per value of the first byte of the subject key.
pub const SHARDS: usize = 256;

/// The largest `maximum_keys_per_shard` [`RedisConfig`] accepts: 1,048,576 keys (so at most
/// 268,435,456 keys per limiter).
pub const MAX_KEYS_PER_SHARD: u32 = 1 << 20;

/// The largest `expired_removals_per_check` [`RedisConfig`] accepts: 64.
pub const MAX_EXPIRED_REMOVALS_PER_CHECK: u32 = 64;

/// The longest timeout [`RedisConfig`] accepts: one hour.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(3_600);

/// The longest key prefix [`KeyPrefix::new`] accepts, in bytes: 64.
pub const MAX_KEY_PREFIX_LEN: usize = 64;

/// Why a [`RedisConfig`] setter or [`KeyPrefix::new`] rejected a value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// A timeout was zero.
    #[error("{parameter} must be at least 1 millisecond")]
    ZeroTimeout {
        /// `"operation_timeout"` or `"connect_timeout"`.
        parameter: &'static str,
    },
    /// A timeout exceeded [`MAX_TIMEOUT`].
    #[error("{parameter} exceeds the maximum of {maximum:?}")]
    TimeoutTooLong {
        /// `"operation_timeout"` or `"connect_timeout"`.
        parameter: &'static str,
        /// [`MAX_TIMEOUT`].
        maximum: Duration,
    },
    /// `maximum_keys_per_shard` was 0 or above [`MAX_KEYS_PER_SHARD`].
    #[error("maximum keys per shard is {value}, outside 1 to {maximum}")]
    MaximumKeysPerShardOutOfRange {
        /// The rejected value.
        value: u64,
        /// [`MAX_KEYS_PER_SHARD`].
        maximum: u32,
    },
    /// `expired_removals_per_check` was above [`MAX_EXPIRED_REMOVALS_PER_CHECK`].
    #[error("expired removals per check is {value}, above the maximum of {maximum}")]
    ExpiredRemovalsOutOfRange {
        /// The rejected value.
        value: u64,
        /// [`MAX_EXPIRED_REMOVALS_PER_CHECK`].
        maximum: u32,
    },
    /// A key prefix was empty, longer than [`MAX_KEY_PREFIX_LEN`], or held a byte other than
    /// an ASCII letter, digit, `.`, `_`, `-` or `:` (braces would change the hash slot).
    #[error("key prefix must be 1 to {MAX_KEY_PREFIX_LEN} ASCII letters, digits, '.', '_', '-' or ':'")]
    InvalidKeyPrefix,
    /// An eviction watch interval was outside
    /// [`MIN_EVICTION_WATCH_INTERVAL`](crate::MIN_EVICTION_WATCH_INTERVAL) to
    /// [`MAX_EVICTION_WATCH_INTERVAL`](crate::MAX_EVICTION_WATCH_INTERVAL).
    #[error("eviction watch interval {interval:?} is outside 10 ms to 1 hour")]
    EvictionWatchIntervalOutOfRange {
        /// The rejected interval.
        interval: Duration,
    },
}

/// The namespace every Redis key of a limiter starts with: 1 to [`MAX_KEY_PREFIX_LEN`] ASCII
/// letters, digits, `.`, `_`, `-` and `:`.
///
/// Limiters sharing a server need distinct prefixes only when they should count separately:
/// the policy fingerprint is already part of every stored entry, and fixed windows and GCRA
/// keep their state under distinct names. Every replica that shares a quota must use the same
/// prefix (and [`Placement`]).
///
/// # Examples
///
/// ```
/// use runlimit_redis::KeyPrefix;
///
/// assert_eq!(KeyPrefix::new("runlimit")?.as_str(), "runlimit");
/// assert!(KeyPrefix::new("a{b}").is_err());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct KeyPrefix(String);

impl KeyPrefix {
    /// Validates a prefix.
    ///
    /// # Errors
    ///
    /// [`ConfigError::InvalidKeyPrefix`] when `prefix` is empty, longer than
    /// [`MAX_KEY_PREFIX_LEN`] bytes or holds another byte than those listed on the type.
    pub fn new(prefix: &str) -> Result<Self, ConfigError> {
        let valid = !prefix.is_empty()
            && prefix.len() <= MAX_KEY_PREFIX_LEN
            && prefix.bytes().all(|byte| byte.is_ascii_alphanumeric() || b"._-:".contains(&byte));
        if valid { Ok(Self(prefix.to_owned())) } else { Err(ConfigError::InvalidKeyPrefix) }
    }

    /// The prefix.
    #[must_use]
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for KeyPrefix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

impl fmt::Display for KeyPrefix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Where a limiter's keys live in a Redis Cluster: which hash tag (`{...}`) their names carry,
/// and so which batches can be atomic. See the [crate docs](crate#redis-cluster).
///
/// A standalone server (or a primary with replicas) has no hash slots; both placements work
/// there alike, and a batch the placement cannot co-locate is refused on every server, so a
/// batch that works in development works on a cluster.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Placement {
    /// Every key of the limiter carries the hash tag `{<prefix>}`: the whole limiter lives in
    /// one hash slot (one cluster node), and any batch is atomic. Spread a cluster's load by
    /// giving groups of policies their own limiter, each with its own prefix.
    #[default]
    SingleSlot,
    /// Each of the 256 shards carries its own hash tag `{<prefix>:<algorithm>:<shard>}`: single
    /// checks spread over up to 256 slots, and a batch is atomic only when all its checks are
    /// in one shard (their subject keys share their first byte, as one subject key bound to
    /// several policies does); any other batch is refused with
    /// [`BatchCheckError::SpansShards`](crate::BatchCheckError::SpansShards) before any I/O.
    PerShard,
}

/// Namespace, cluster placement, storage bounds and timeouts of a
/// [`RedisLimiter`](crate::RedisLimiter) or [`RedisGcraLimiter`](crate::RedisGcraLimiter).
///
/// | setting | default | accepted |
/// |---|---|---|
/// | [`key_prefix`](Self::key_prefix) | `runlimit` | see [`KeyPrefix`] |
/// | [`placement`](Self::placement) | [`Placement::SingleSlot`] | either |
/// | [`maximum_keys_per_shard`](Self::maximum_keys_per_shard) | 4,096 (1,048,576 keys in all) | 1 to [`MAX_KEYS_PER_SHARD`] |
/// | [`expired_removals_per_check`](Self::expired_removals_per_check) | 16 | 0 to [`MAX_EXPIRED_REMOVALS_PER_CHECK`] |
/// | [`operation_timeout`](Self::operation_timeout) | 1 s | 1 ms to [`MAX_TIMEOUT`] |
/// | [`connect_timeout`](Self::connect_timeout) | 1 s | 1 ms to [`MAX_TIMEOUT`] |
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use runlimit_redis::{KeyPrefix, Placement, RedisConfig};
///
/// let config = RedisConfig::default()
///     .with_key_prefix(KeyPrefix::new("api")?)
///     .with_placement(Placement::PerShard)
///     .with_maximum_keys_per_shard(10_000)?
///     .with_operation_timeout(Duration::from_millis(250))?;
/// assert_eq!(config.maximum_keys_per_shard(), 10_000);
/// assert!(RedisConfig::default().with_maximum_keys_per_shard(0).is_err());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct RedisConfig {
    key_prefix: KeyPrefix,
    placement: Placement,
    maximum_keys_per_shard: u32,
    expired_removals_per_check: u32,
    operation_timeout: Duration,
    connect_timeout: Duration,
}

impl Default for RedisConfig {
    fn default() -> Self {
        Self {
            key_prefix: KeyPrefix("runlimit".to_owned()),
            placement: Placement::SingleSlot,
            maximum_keys_per_shard: 4_096,
            expired_removals_per_check: 16,
            operation_timeout: Duration::from_secs(1),
            connect_timeout: Duration::from_secs(1),
        }
    }
}

fn timeout(parameter: &'static str, value: Duration) -> Result<Duration, ConfigError> {
    if value.is_zero() {
        Err(ConfigError::ZeroTimeout { parameter })
    } else if value > MAX_TIMEOUT {
        Err(ConfigError::TimeoutTooLong { parameter, maximum: MAX_TIMEOUT })
    } else {
        Ok(value)
    }
}

impl RedisConfig {
    /// The defaults of the table above.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets the key prefix.
    #[must_use]
    pub fn with_key_prefix(mut self, prefix: KeyPrefix) -> Self {
        self.key_prefix = prefix;
        self
    }

    /// Sets the cluster placement.
    #[must_use]
    pub fn with_placement(mut self, placement: Placement) -> Self {
        self.placement = placement;
        self
    }

    /// Sets how many keys each of the [`SHARDS`] shards may hold. A new key for a full shard
    /// is denied with `Denial::StorageCapacity`; stored keys are never evicted.
    ///
    /// # Errors
    ///
    /// [`ConfigError::MaximumKeysPerShardOutOfRange`] for 0 or more than
    /// [`MAX_KEYS_PER_SHARD`].
    pub fn with_maximum_keys_per_shard(mut self, keys: u32) -> Result<Self, ConfigError> {
        if keys == 0 || keys > MAX_KEYS_PER_SHARD {
            return Err(ConfigError::MaximumKeysPerShardOutOfRange {
                value: u64::from(keys),
                maximum: MAX_KEYS_PER_SHARD,
            });
        }
        self.maximum_keys_per_shard = keys;
        Ok(self)
    }

    /// Sets how many expired entries an admission may remove from a shard that lacks room for
    /// its new keys, per check on the shard (it also re-scores at most as many live entries
    /// whose recorded expiry has passed): a bound on cleanup work per admission. An admission
    /// whose new keys fit cleans nothing. 0 leaves all cleanup to
    /// [`cleanup_expired`](crate::RedisStore::cleanup_expired).
    ///
    /// # Errors
    ///
    /// [`ConfigError::ExpiredRemovalsOutOfRange`] above [`MAX_EXPIRED_REMOVALS_PER_CHECK`].
    pub fn with_expired_removals_per_check(mut self, removals: u32) -> Result<Self, ConfigError> {
        if removals > MAX_EXPIRED_REMOVALS_PER_CHECK {
            return Err(ConfigError::ExpiredRemovalsOutOfRange {
                value: u64::from(removals),
                maximum: MAX_EXPIRED_REMOVALS_PER_CHECK,
            });
        }
        self.expired_removals_per_check = removals;
        Ok(self)
    }

    /// Sets the budget of one operation once a connection is at hand: sending the script and
    /// waiting for its reply (including the one reload after `NOSCRIPT`). Measured by the
    /// client; when it elapses after the request was written, quota may have been consumed.
    ///
    /// # Errors
    ///
    /// [`ConfigError::ZeroTimeout`] or [`ConfigError::TimeoutTooLong`].
    pub fn with_operation_timeout(mut self, value: Duration) -> Result<Self, ConfigError> {
        self.operation_timeout = timeout("operation_timeout", value)?;
        Ok(self)
    }

    /// Sets the budget for obtaining a connection: waiting for a reconnect in progress,
    /// opening the TCP connection and the protocol handshake. Nothing is sent before a
    /// connection is obtained, so this timeout never consumes quota.
    ///
    /// # Errors
    ///
    /// [`ConfigError::ZeroTimeout`] or [`ConfigError::TimeoutTooLong`].
    pub fn with_connect_timeout(mut self, value: Duration) -> Result<Self, ConfigError> {
        self.connect_timeout = timeout("connect_timeout", value)?;
        Ok(self)
    }

    /// The key prefix.
    #[must_use]
    pub fn key_prefix(&self) -> &KeyPrefix {
        &self.key_prefix
    }

    /// The cluster placement.
    #[must_use]
    pub const fn placement(&self) -> Placement {
        self.placement
    }

    /// Keys each shard may hold.
    #[must_use]
    pub const fn maximum_keys_per_shard(&self) -> u32 {
        self.maximum_keys_per_shard
    }

    /// Expired entries an admission may remove per check.
    #[must_use]
    pub const fn expired_removals_per_check(&self) -> u32 {
        self.expired_removals_per_check
    }

    /// The operation budget.
    #[must_use]
    pub const fn operation_timeout(&self) -> Duration {
        self.operation_timeout
    }

    /// The connection budget.
    #[must_use]
    pub const fn connect_timeout(&self) -> Duration {
        self.connect_timeout
    }
}
