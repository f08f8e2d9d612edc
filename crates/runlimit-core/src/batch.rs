//! Why a batch is rejected before any backend work.

use crate::policy::QuotaMode;

/// Why a batch was rejected before any backend work: a caller error, never a quota denial.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BatchError {
    /// The batch held no checks. Rejected rather than vacuously allowed, so a caller that
    /// filtered every check out fails closed instead of admitting an unevaluated request.
    #[error("empty batch")]
    EmptyBatch,
    /// The batch held more checks than the backend accepts in one atomic operation.
    #[error("batch of {batch_size} checks exceeds the maximum of {maximum}")]
    TooManyChecks {
        /// Number of checks given.
        batch_size: usize,
        /// The backend's configured maximum.
        maximum: usize,
    },
    /// Checks in the batch use different [`QuotaMode`]s. A batch is all-or-nothing, so a
    /// shadow policy cannot share one with enforced policies; check it separately.
    #[error("check {index} uses quota mode {mode:?}, unlike check 0")]
    MixedQuotaModes {
        /// Index of the first check whose mode differs from check 0's.
        index: usize,
        /// That check's mode.
        mode: QuotaMode,
    },
    /// Two checks share one storage key (same policy fingerprint and subject key).
    #[error("check {duplicate_index} repeats the storage key of check {first_index}")]
    DuplicateCounterKey {
        /// The earlier check.
        first_index: usize,
        /// The later check with the same key.
        duplicate_index: usize,
    },
}
