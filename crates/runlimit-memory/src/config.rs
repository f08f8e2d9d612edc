//! Validated configuration shared by [`MemoryStore`](crate::MemoryStore) and
//! [`GcraStore`](crate::GcraStore).

/// The largest total capacity a store accepts: 4,294,967,295 keys (`u32::MAX`).
///
/// Each shard addresses its entries with 32-bit slot numbers, which keeps the per-key index
/// overhead at 4 bytes.
pub const MAX_KEYS: usize = 4_294_967_295;

/// The most shards a store accepts: 4,096.
pub const MAX_SHARD_COUNT: usize = 4_096;

/// The largest bound on expired entries removed per check: 1,024.
pub const MAX_EXPIRED_REMOVALS_PER_CHECK: usize = 1_024;

/// The largest atomic batch a store can be configured to accept: 1,024 checks.
pub const MAX_BATCH_SIZE: usize = 1_024;

/// The default number of shards: one, so the whole `max_keys` is available to any key.
pub const DEFAULT_SHARD_COUNT: usize = 1;

/// The default bound on expired entries removed per check: 16 (the bound PostgreSQL admission
/// uses for its own reclamation).
pub const DEFAULT_EXPIRED_REMOVALS_PER_CHECK: usize = 16;

/// The default maximum number of checks in one atomic batch: 64.
pub const DEFAULT_MAXIMUM_BATCH_SIZE: usize = 64;

/// Why a [`MemoryStoreConfig`] constructor or setter rejected a value: it was outside the
/// parameter's documented range.
///
/// Every configuration operation can fail in exactly this one way, so the error is a struct
/// rather than an enum.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{parameter} is {value}, outside the accepted range {minimum}..={maximum}")]
pub struct MemoryStoreConfigError {
    /// The parameter's name: `"max_keys"`, `"shard_count"`, `"expired_removals_per_check"` or
    /// `"maximum_batch_size"`.
    pub parameter: &'static str,
    /// The rejected value.
    pub value: usize,
    /// The smallest accepted value.
    pub minimum: usize,
    /// The largest accepted value (for `shard_count`, the smaller of [`MAX_SHARD_COUNT`] and
    /// `max_keys`).
    pub maximum: usize,
}

fn in_range(
    parameter: &'static str,
    value: usize,
    minimum: usize,
    maximum: usize,
) -> Result<usize, MemoryStoreConfigError> {
    if (minimum..=maximum).contains(&value) {
        Ok(value)
    } else {
        Err(MemoryStoreConfigError { parameter, value, minimum, maximum })
    }
}

/// The hard bounds of a memory store: total key capacity, shard count, cleanup work per check
/// and batch size.
///
/// `max_keys` is the total number of entries the store will ever hold. It is divided into
/// fixed per-shard capacities: shard `i` of `n` holds `max_keys / n` entries, plus one for
/// the first `max_keys % n` shards, so the capacities add up to exactly `max_keys`. A key's
/// shard is fixed by its (uniform, secret-keyed) subject digest, so with several shards an
/// uneven key distribution can fill one shard and deny a new key while others still have
/// room. The default of one shard makes all of `max_keys` available to any key; more shards
/// reduce lock contention.
///
/// Every setter validates its value and returns a [`MemoryStoreConfigError`] naming the
/// parameter; a configuration that exists is always valid.
///
/// | parameter | range | default |
/// |---|---|---|
/// | `max_keys` | 1 ..= [`MAX_KEYS`] | (required) |
/// | `shard_count` | 1 ..= min([`MAX_SHARD_COUNT`], `max_keys`) | [`DEFAULT_SHARD_COUNT`] (1) |
/// | `expired_removals_per_check` | 1 ..= [`MAX_EXPIRED_REMOVALS_PER_CHECK`] | [`DEFAULT_EXPIRED_REMOVALS_PER_CHECK`] (16) |
/// | `maximum_batch_size` | 1 ..= [`MAX_BATCH_SIZE`] | [`DEFAULT_MAXIMUM_BATCH_SIZE`] (64) |
///
/// With the `serde` feature the configuration serializes as
/// `{"max_keys": 50000, "shard_count": 64, "expired_removals_per_check": 16,
/// "maximum_batch_size": 64}`. Deserializing re-runs every validation, rejects unknown fields,
/// and fills absent optional fields with their defaults.
///
/// # Examples
///
/// ```
/// use runlimit_memory::MemoryStoreConfig;
///
/// let config = MemoryStoreConfig::new(50_000)?.with_shard_count(64)?;
/// assert_eq!(config.shard_capacity(0), Some(782)); // 50_000 = 16 × 782 + 48 × 781
/// assert_eq!(config.shard_capacity(63), Some(781));
/// assert_eq!(config.shard_capacity(64), None);
///
/// let error = MemoryStoreConfig::new(10)?.with_shard_count(11).unwrap_err();
/// assert_eq!(error.to_string(), "shard_count is 11, outside the accepted range 1..=10");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MemoryStoreConfig {
    max_keys: usize,
    shard_count: usize,
    expired_removals_per_check: usize,
    maximum_batch_size: usize,
}

impl MemoryStoreConfig {
    /// A configuration holding at most `max_keys` entries, with one shard and the default
    /// cleanup bound and batch size.
    ///
    /// # Errors
    ///
    /// [`MemoryStoreConfigError`] naming `"max_keys"` when `max_keys` is 0 or above
    /// [`MAX_KEYS`].
    pub fn new(max_keys: usize) -> Result<Self, MemoryStoreConfigError> {
        Ok(Self {
            max_keys: in_range("max_keys", max_keys, 1, MAX_KEYS)?,
            shard_count: DEFAULT_SHARD_COUNT,
            expired_removals_per_check: DEFAULT_EXPIRED_REMOVALS_PER_CHECK,
            maximum_batch_size: DEFAULT_MAXIMUM_BATCH_SIZE,
        })
    }

    /// Divides `max_keys` into `shard_count` fixed per-shard capacities.
    ///
    /// # Errors
    ///
    /// [`MemoryStoreConfigError`] naming `"shard_count"` when `shard_count` is 0, above
    /// [`MAX_SHARD_COUNT`], or above `max_keys` (every shard must hold at least one key).
    pub fn with_shard_count(self, shard_count: usize) -> Result<Self, MemoryStoreConfigError> {
        let maximum = MAX_SHARD_COUNT.min(self.max_keys);
        Ok(Self { shard_count: in_range("shard_count", shard_count, 1, maximum)?, ..self })
    }

    /// Bounds the expired entries one check removes from its shard (an atomic batch gets this
    /// allowance once for each of its checks on a shard). The same number bounds the stale
    /// expiry-index positions a check refreshes, so each check does at most
    /// `2 × expired_removals_per_check` index operations of `O(log n)` cleanup work.
    ///
    /// # Errors
    ///
    /// [`MemoryStoreConfigError`] naming `"expired_removals_per_check"` when the value is 0 or
    /// above [`MAX_EXPIRED_REMOVALS_PER_CHECK`]. Zero is rejected because a full shard could
    /// then never reclaim an expired entry.
    pub fn with_expired_removals_per_check(self, removals: usize) -> Result<Self, MemoryStoreConfigError> {
        Ok(Self {
            expired_removals_per_check: in_range(
                "expired_removals_per_check",
                removals,
                1,
                MAX_EXPIRED_REMOVALS_PER_CHECK,
            )?,
            ..self
        })
    }

    /// Bounds the number of checks one atomic batch may hold; larger batches are rejected with
    /// [`BatchError::TooManyChecks`](runlimit_core::BatchError::TooManyChecks) before any
    /// storage work.
    ///
    /// # Errors
    ///
    /// [`MemoryStoreConfigError`] naming `"maximum_batch_size"` when the value is 0 or above
    /// [`MAX_BATCH_SIZE`].
    pub fn with_maximum_batch_size(self, maximum: usize) -> Result<Self, MemoryStoreConfigError> {
        Ok(Self { maximum_batch_size: in_range("maximum_batch_size", maximum, 1, MAX_BATCH_SIZE)?, ..self })
    }

    /// The total capacity in entries, across all shards.
    #[must_use]
    pub const fn max_keys(&self) -> usize {
        self.max_keys
    }

    /// The number of shards.
    #[must_use]
    pub const fn shard_count(&self) -> usize {
        self.shard_count
    }

    /// The most expired entries one check removes from its shard.
    #[must_use]
    pub const fn expired_removals_per_check(&self) -> usize {
        self.expired_removals_per_check
    }

    /// The most checks one atomic batch may hold.
    #[must_use]
    pub const fn maximum_batch_size(&self) -> usize {
        self.maximum_batch_size
    }

    /// The fixed capacity of shard `shard_index`, or `None` when there is no such shard:
    /// `max_keys / shard_count`, plus one for the first `max_keys % shard_count` shards.
    #[must_use]
    pub const fn shard_capacity(&self, shard_index: usize) -> Option<usize> {
        if shard_index >= self.shard_count {
            return None;
        }
        let base = self.max_keys / self.shard_count;
        let extra = self.max_keys % self.shard_count;
        Some(if shard_index < extra { base + 1 } else { base })
    }
}

#[cfg(feature = "serde")]
mod serde_impls {
    use super::*;
    use serde::{Deserialize, Serialize};

    const fn default_shard_count() -> usize {
        DEFAULT_SHARD_COUNT
    }
    const fn default_removals() -> usize {
        DEFAULT_EXPIRED_REMOVALS_PER_CHECK
    }
    const fn default_batch() -> usize {
        DEFAULT_MAXIMUM_BATCH_SIZE
    }

    #[derive(Serialize, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct ConfigRepr {
        max_keys: usize,
        #[serde(default = "default_shard_count")]
        shard_count: usize,
        #[serde(default = "default_removals")]
        expired_removals_per_check: usize,
        #[serde(default = "default_batch")]
        maximum_batch_size: usize,
    }

    impl Serialize for MemoryStoreConfig {
        fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
            ConfigRepr {
                max_keys: self.max_keys,
                shard_count: self.shard_count,
                expired_removals_per_check: self.expired_removals_per_check,
                maximum_batch_size: self.maximum_batch_size,
            }
            .serialize(serializer)
        }
    }

    impl<'de> Deserialize<'de> for MemoryStoreConfig {
        /// Re-runs [`MemoryStoreConfig::new`] and every setter.
        fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
            let repr = ConfigRepr::deserialize(deserializer)?;
            Self::new(repr.max_keys)
                .and_then(|config| config.with_shard_count(repr.shard_count))
                .and_then(|config| config.with_expired_removals_per_check(repr.expired_removals_per_check))
                .and_then(|config| config.with_maximum_batch_size(repr.maximum_batch_size))
                .map_err(serde::de::Error::custom)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_setter_validates() {
        assert_eq!(
            MemoryStoreConfig::new(0),
            Err(MemoryStoreConfigError { parameter: "max_keys", value: 0, minimum: 1, maximum: MAX_KEYS })
        );
        let config = MemoryStoreConfig::new(100).unwrap();
        assert_eq!(config.shard_count(), 1);
        assert_eq!(config.expired_removals_per_check(), 16);
        assert_eq!(config.maximum_batch_size(), 64);
        assert_eq!(
            config.with_shard_count(0),
            Err(MemoryStoreConfigError { parameter: "shard_count", value: 0, minimum: 1, maximum: 100 })
        );
        assert_eq!(
            MemoryStoreConfig::new(10_000).unwrap().with_shard_count(4_097),
            Err(MemoryStoreConfigError {
                parameter: "shard_count",
                value: 4_097,
                minimum: 1,
                maximum: 4_096
            })
        );
        assert_eq!(
            config.with_expired_removals_per_check(0).unwrap_err().to_string(),
            "expired_removals_per_check is 0, outside the accepted range 1..=1024"
        );
        assert_eq!(
            config.with_maximum_batch_size(1_025).unwrap_err().to_string(),
            "maximum_batch_size is 1025, outside the accepted range 1..=1024"
        );
        let tuned = config
            .with_shard_count(7)
            .and_then(|c| c.with_expired_removals_per_check(3))
            .and_then(|c| c.with_maximum_batch_size(2))
            .unwrap();
        assert_eq!(
            (tuned.shard_count(), tuned.expired_removals_per_check(), tuned.maximum_batch_size()),
            (7, 3, 2)
        );
        let capacities: Vec<_> = (0..7).map(|i| tuned.shard_capacity(i).unwrap()).collect();
        assert_eq!(capacities, [15, 15, 14, 14, 14, 14, 14]);
        assert_eq!(capacities.iter().sum::<usize>(), 100);
    }
}
