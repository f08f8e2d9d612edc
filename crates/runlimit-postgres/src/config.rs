//! Validated PostgreSQL backend configuration.

use std::time::Duration;

/// The largest `maximum_rows_per_shard` [`PostgresConfig`] accepts: 65,536 rows, the
/// ceiling the `bound_runlimit_fixed_window_cardinality` migration's ledger trigger enforces
/// in the database for every writer.
pub const MAX_ROWS_PER_SHARD: u32 = 65_536;

/// The number of persistent capacity shards: 256, one per value of byte 32 of the 64-byte
/// counter key (the first byte of the HMAC subject key).
pub const CAPACITY_SHARDS: usize = 256;

/// The longest timeout [`PostgresConfig`] accepts: 2,147,483,647 ms (`i32::MAX`, about 24.8
/// days), PostgreSQL's maximum for `statement_timeout` and `lock_timeout`.
pub const MAX_TIMEOUT: Duration = Duration::from_millis(MAX_TIMEOUT_MILLIS);

/// [`MAX_TIMEOUT`] in milliseconds.
pub const MAX_TIMEOUT_MILLIS: u64 = 2_147_483_647;

/// Why a [`PostgresConfig`] setter (or deserialization) rejected a value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// A timeout was zero.
    #[error("{parameter} must be at least 1 millisecond")]
    ZeroTimeout {
        /// `"pool_acquire_timeout"` or `"operation_timeout"`.
        parameter: &'static str,
    },
    /// A timeout had a sub-millisecond part. PostgreSQL's timeouts are whole milliseconds and
    /// Runlimit never rounds a configured budget.
    #[error("{parameter} is not a whole number of milliseconds")]
    NotWholeMilliseconds {
        /// `"pool_acquire_timeout"` or `"operation_timeout"`.
        parameter: &'static str,
    },
    /// A timeout exceeded [`MAX_TIMEOUT`].
    #[error("{parameter} exceeds the maximum of {maximum_millis} milliseconds")]
    TimeoutTooLong {
        /// `"pool_acquire_timeout"` or `"operation_timeout"`.
        parameter: &'static str,
        /// [`MAX_TIMEOUT_MILLIS`].
        maximum_millis: u64,
    },
    /// `maximum_rows_per_shard` was 0 or above [`MAX_ROWS_PER_SHARD`].
    #[error("maximum rows per shard is {value}, outside 1 to {maximum}")]
    MaximumRowsPerShardOutOfRange {
        /// The rejected value.
        value: u64,
        /// [`MAX_ROWS_PER_SHARD`].
        maximum: u32,
    },
}

/// Timeouts and the operational cardinality bound of a
/// [`PostgresLimiter`](crate::PostgresLimiter).
///
/// | setting | default | accepted |
/// |---|---|---|
/// | [`pool_acquire_timeout`](Self::pool_acquire_timeout) | 1 s | 1 ms ..= [`MAX_TIMEOUT`], whole ms |
/// | [`operation_timeout`](Self::operation_timeout) | 2 s | 1 ms ..= [`MAX_TIMEOUT`], whole ms |
/// | [`maximum_rows_per_shard`](Self::maximum_rows_per_shard) | 4,096 | 1 ..= [`MAX_ROWS_PER_SHARD`] |
///
/// Every setter validates its value and returns a [`ConfigError`]; there is no panicking
/// spelling. With the `serde` feature the config serializes its three fields (durations as
/// exact seconds and nanoseconds), and deserialization rejects unknown fields, fills missing
/// fields with the defaults above and runs the same validation.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use runlimit_postgres::PostgresConfig;
///
/// let config = PostgresConfig::default()
///     .with_pool_acquire_timeout(Duration::from_millis(250))?
///     .with_operation_timeout(Duration::from_millis(500))?
///     .with_maximum_rows_per_shard(16_384)?;
/// assert_eq!(config.maximum_rows_per_shard(), 16_384);
/// assert!(PostgresConfig::default().with_maximum_rows_per_shard(65_537).is_err());
/// assert!(PostgresConfig::default().with_operation_timeout(Duration::from_micros(1_500)).is_err());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PostgresConfig {
    pool_acquire_timeout: Duration,
    operation_timeout: Duration,
    maximum_rows_per_shard: u32,
    protocol: Protocol,
}

/// How admissions talk to PostgreSQL.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub(crate) enum Protocol {
    /// Statements prepared per connection and calls to the admission functions the latest
    /// migrations install, whose plans PostgreSQL keeps per connection.
    #[default]
    Prepared,
    /// The simple-query statements of earlier releases, rendered and planned per admission.
    Statements,
    /// [`Prepared`](Self::Prepared) as the previous release ran it: one-check GCRA admissions
    /// through the statements of a batch of one (settings, ledger lock, read; write), without
    /// the provisional update.
    PreviousPrepared,
    /// [`Prepared`](Self::Prepared) as the release before the GCRA row-lock protocol ran it:
    /// GCRA admissions, peeks, resets and cleanup always lock the ledger-lock protocol's ledger
    /// and never learn of a switch.
    LedgerLockPrepared,
}

impl Default for PostgresConfig {
    /// 1 s pool acquisition, 2 s per operation, 4,096 rows per shard.
    fn default() -> Self {
        Self {
            pool_acquire_timeout: Duration::from_secs(1),
            operation_timeout: Duration::from_secs(2),
            maximum_rows_per_shard: 4_096,
            protocol: Protocol::Prepared,
        }
    }
}

fn validate_timeout(parameter: &'static str, timeout: Duration) -> Result<Duration, ConfigError> {
    if timeout.is_zero() {
        return Err(ConfigError::ZeroTimeout { parameter });
    }
    if !timeout.subsec_nanos().is_multiple_of(1_000_000) {
        return Err(ConfigError::NotWholeMilliseconds { parameter });
    }
    if timeout > MAX_TIMEOUT {
        return Err(ConfigError::TimeoutTooLong { parameter, maximum_millis: MAX_TIMEOUT_MILLIS });
    }
    Ok(timeout)
}

fn validate_rows(value: u64) -> Result<u32, ConfigError> {
    match u32::try_from(value) {
        Ok(rows) if (1..=MAX_ROWS_PER_SHARD).contains(&rows) => Ok(rows),
        _ => Err(ConfigError::MaximumRowsPerShardOutOfRange { value, maximum: MAX_ROWS_PER_SHARD }),
    }
}

impl PostgresConfig {
    /// The default configuration (see the table on the type).
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets how long a check or cleanup waits for a pooled connection before failing with
    /// `PoolTimeout`. Independent of (and normally shorter than) SQLx's own
    /// `PgPoolOptions::acquire_timeout`, whichever elapses first wins.
    ///
    /// # Errors
    ///
    /// [`ConfigError::ZeroTimeout`], [`ConfigError::NotWholeMilliseconds`] or
    /// [`ConfigError::TimeoutTooLong`], naming `"pool_acquire_timeout"`.
    pub fn with_pool_acquire_timeout(mut self, timeout: Duration) -> Result<Self, ConfigError> {
        self.pool_acquire_timeout = validate_timeout("pool_acquire_timeout", timeout)?;
        Ok(self)
    }

    /// Sets the budget every check or cleanup receives once it holds a connection: one
    /// deadline covering `BEGIN`, every statement, lock waits, rollback and commit, measured by
    /// the client. PostgreSQL also receives it, less a margin of a tenth (at most 100 ms), as
    /// the transaction-local `statement_timeout` and `lock_timeout` in milliseconds, so the
    /// server abandons a lock wait by itself and reports which statement waited.
    ///
    /// # Errors
    ///
    /// [`ConfigError::ZeroTimeout`], [`ConfigError::NotWholeMilliseconds`] or
    /// [`ConfigError::TimeoutTooLong`], naming `"operation_timeout"`.
    pub fn with_operation_timeout(mut self, timeout: Duration) -> Result<Self, ConfigError> {
        self.operation_timeout = validate_timeout("operation_timeout", timeout)?;
        Ok(self)
    }

    /// Sets the operational bound on counter rows per capacity shard, checked by admission
    /// under the shard's ledger lock. A shard at the bound denies new keys with
    /// [`Denial::StorageCapacity`](runlimit_core::Denial::StorageCapacity); existing keys
    /// keep working. The database itself refuses any row past [`MAX_ROWS_PER_SHARD`].
    ///
    /// # Errors
    ///
    /// [`ConfigError::MaximumRowsPerShardOutOfRange`] for 0 or a value above
    /// [`MAX_ROWS_PER_SHARD`].
    pub fn with_maximum_rows_per_shard(mut self, rows: u32) -> Result<Self, ConfigError> {
        self.maximum_rows_per_shard = validate_rows(u64::from(rows))?;
        Ok(self)
    }

    /// Sends admissions (checks and batches) as the statements earlier releases send instead
    /// of prepared statements and calls to the admission functions, for testing that replicas
    /// of both releases interoperate on one database. Not part of the supported API: it may change or go away
    /// in any release, and it is not serialized.
    #[doc(hidden)]
    #[must_use]
    pub fn with_previous_admission_protocol(mut self) -> Self {
        self.protocol = Protocol::Statements;
        self
    }

    /// Sends one-check GCRA admissions as the previous release does (through the statements
    /// of a batch of one), for testing that replicas of both releases interoperate on one
    /// database. Not part of the supported API: it may change or go away in any release, and it
    /// is not serialized.
    #[doc(hidden)]
    #[must_use]
    pub fn with_previous_prepared_protocol(mut self) -> Self {
        self.protocol = Protocol::PreviousPrepared;
        self
    }

    /// Runs GCRA operations as the release before the row-lock protocol did (on the ledger-lock
    /// protocol's ledger, never switching), for testing that replicas of both releases
    /// interoperate on one database through the switch. Not part of the supported API: it may
    /// change or go away in any release, and it is not serialized.
    #[doc(hidden)]
    #[must_use]
    pub fn with_ledger_lock_protocol(mut self) -> Self {
        self.protocol = Protocol::LedgerLockPrepared;
        self
    }

    /// How admissions talk to PostgreSQL.
    pub(crate) const fn protocol(&self) -> Protocol {
        self.protocol
    }

    /// How long to wait for a pooled connection.
    #[must_use]
    pub const fn pool_acquire_timeout(&self) -> Duration {
        self.pool_acquire_timeout
    }

    /// The per-operation budget after a connection is acquired.
    #[must_use]
    pub const fn operation_timeout(&self) -> Duration {
        self.operation_timeout
    }

    /// The operational bound on rows per capacity shard.
    #[must_use]
    pub const fn maximum_rows_per_shard(&self) -> u32 {
        self.maximum_rows_per_shard
    }

    /// The transaction-local `statement_timeout` and `lock_timeout` sent to PostgreSQL, in whole
    /// milliseconds: the operation timeout less a margin of a tenth of it, at most 100 ms, and
    /// at least 1 ms. The server then abandons a wait, and names the statement that waited,
    /// shortly before the client's own deadline would interrupt the round trip.
    pub(crate) fn server_timeout_millis(&self) -> u128 {
        let budget = self.operation_timeout.as_millis();
        budget.saturating_sub((budget / 10).min(100)).max(1)
    }
}

#[cfg(feature = "serde")]
mod serde_impls {
    use super::*;
    use serde::{Deserialize, Serialize, de::Error as _};

    #[derive(Serialize, Deserialize)]
    #[serde(deny_unknown_fields, default)]
    struct Repr {
        pool_acquire_timeout: Duration,
        operation_timeout: Duration,
        maximum_rows_per_shard: u64,
    }

    impl Default for Repr {
        fn default() -> Self {
            let config = PostgresConfig::default();
            Self {
                pool_acquire_timeout: config.pool_acquire_timeout,
                operation_timeout: config.operation_timeout,
                maximum_rows_per_shard: u64::from(config.maximum_rows_per_shard),
            }
        }
    }

    impl Serialize for PostgresConfig {
        fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
            Repr {
                pool_acquire_timeout: self.pool_acquire_timeout,
                operation_timeout: self.operation_timeout,
                maximum_rows_per_shard: u64::from(self.maximum_rows_per_shard),
            }
            .serialize(serializer)
        }
    }

    impl<'de> Deserialize<'de> for PostgresConfig {
        fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
            let repr = Repr::deserialize(deserializer)?;
            Ok(Self {
                pool_acquire_timeout: validate_timeout("pool_acquire_timeout", repr.pool_acquire_timeout)
                    .map_err(D::Error::custom)?,
                operation_timeout: validate_timeout("operation_timeout", repr.operation_timeout)
                    .map_err(D::Error::custom)?,
                maximum_rows_per_shard: validate_rows(repr.maximum_rows_per_shard)
                    .map_err(D::Error::custom)?,
                protocol: Protocol::Prepared,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults() {
        let config = PostgresConfig::new();
        assert_eq!(config.pool_acquire_timeout(), Duration::from_secs(1));
        assert_eq!(config.operation_timeout(), Duration::from_secs(2));
        assert_eq!(config.maximum_rows_per_shard(), 4_096);
        assert_eq!(config.server_timeout_millis(), 1_900);
        let short =
            |ms| config.with_operation_timeout(Duration::from_millis(ms)).unwrap().server_timeout_millis();
        assert_eq!(short(300), 270);
        assert_eq!(short(9), 9);
        assert_eq!(short(1), 1);
    }

    #[test]
    fn setters_validate() {
        let config = PostgresConfig::new();
        assert_eq!(
            config.with_pool_acquire_timeout(Duration::ZERO),
            Err(ConfigError::ZeroTimeout { parameter: "pool_acquire_timeout" })
        );
        assert_eq!(
            config.with_operation_timeout(Duration::from_nanos(1_000_001)),
            Err(ConfigError::NotWholeMilliseconds { parameter: "operation_timeout" })
        );
        assert_eq!(
            config.with_operation_timeout(MAX_TIMEOUT + Duration::from_millis(1)),
            Err(ConfigError::TimeoutTooLong {
                parameter: "operation_timeout",
                maximum_millis: 2_147_483_647
            })
        );
        assert_eq!(
            config.with_operation_timeout(MAX_TIMEOUT).map(|c| c.operation_timeout()),
            Ok(MAX_TIMEOUT)
        );
        assert_eq!(
            config.with_maximum_rows_per_shard(0),
            Err(ConfigError::MaximumRowsPerShardOutOfRange { value: 0, maximum: 65_536 })
        );
        assert_eq!(
            config.with_maximum_rows_per_shard(65_537),
            Err(ConfigError::MaximumRowsPerShardOutOfRange { value: 65_537, maximum: 65_536 })
        );
        assert_eq!(
            config.with_maximum_rows_per_shard(65_536).map(|c| c.maximum_rows_per_shard()),
            Ok(65_536)
        );
        assert_eq!(config.with_maximum_rows_per_shard(1).map(|c| c.maximum_rows_per_shard()), Ok(1));
    }

    #[test]
    fn error_messages() {
        assert_eq!(
            ConfigError::ZeroTimeout { parameter: "operation_timeout" }.to_string(),
            "operation_timeout must be at least 1 millisecond"
        );
        assert_eq!(
            ConfigError::MaximumRowsPerShardOutOfRange { value: 0, maximum: 65_536 }.to_string(),
            "maximum rows per shard is 0, outside 1 to 65536"
        );
    }

    #[cfg(feature = "serde")]
    #[test]
    fn serde_round_trip_and_validation() {
        let config = PostgresConfig::new()
            .with_operation_timeout(Duration::from_millis(1_500))
            .and_then(|c| c.with_maximum_rows_per_shard(100))
            .unwrap();
        let json = serde_json::to_string(&config).unwrap();
        assert_eq!(
            json,
            r#"{"pool_acquire_timeout":{"secs":1,"nanos":0},"operation_timeout":{"secs":1,"nanos":500000000},"maximum_rows_per_shard":100}"#
        );
        assert_eq!(serde_json::from_str::<PostgresConfig>(&json).unwrap(), config);
        assert_eq!(serde_json::from_str::<PostgresConfig>("{}").unwrap(), PostgresConfig::default());

        let unknown = serde_json::from_str::<PostgresConfig>(r#"{"maximum_rows":5}"#).unwrap_err();
        assert!(unknown.to_string().starts_with("unknown field `maximum_rows`"), "{unknown}");
        let too_many =
            serde_json::from_str::<PostgresConfig>(r#"{"maximum_rows_per_shard":65537}"#).unwrap_err();
        assert!(
            too_many.to_string().starts_with("maximum rows per shard is 65537, outside 1 to 65536"),
            "{too_many}"
        );
        let huge =
            serde_json::from_str::<PostgresConfig>(r#"{"maximum_rows_per_shard":18446744073709551615}"#)
                .unwrap_err();
        assert!(huge.to_string().starts_with("maximum rows per shard is 18446744073709551615"), "{huge}");
        let sub_ms = serde_json::from_str::<PostgresConfig>(r#"{"operation_timeout":{"secs":0,"nanos":1}}"#)
            .unwrap_err();
        assert!(
            sub_ms.to_string().starts_with("operation_timeout is not a whole number of milliseconds"),
            "{sub_ms}"
        );
        let zero = serde_json::from_str::<PostgresConfig>(r#"{"pool_acquire_timeout":{"secs":0,"nanos":0}}"#)
            .unwrap_err();
        assert!(
            zero.to_string().starts_with("pool_acquire_timeout must be at least 1 millisecond"),
            "{zero}"
        );
    }
}
