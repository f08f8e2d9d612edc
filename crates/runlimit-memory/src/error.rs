//! One error type per store operation.
//!
//! Every error from a store is an admission failure: treat it as "do not admit", distinct from
//! a quota denial, which is an `Ok` [`Decision`](runlimit_core::Decision) or
//! [`BatchDecision`](runlimit_core::BatchDecision). No error ever consumed quota: each one is
//! returned before anything is committed.

use runlimit_core::{BatchError, backend::gcra::GcraError};

/// A shard is poisoned: code panicked while holding its lock.
///
/// The only way a [`MemoryStore::check`](crate::MemoryStore::check) can fail. The shard stays
/// unavailable, with its counters untouched, until
/// [`MemoryStore::recover_poisoned`](crate::MemoryStore::recover_poisoned) (or the
/// [`GcraStore`](crate::GcraStore) equivalent) empties it; with the default single shard the
/// whole store is unavailable. Fail closed and alert operators.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, thiserror::Error)]
#[error("memory store shard {shard_index} is poisoned by a panic while its lock was held")]
pub struct PoisonedShardError {
    /// The poisoned shard's index, below the configured shard count.
    pub shard_index: usize,
}

/// Why [`MemoryStore::check_all`](crate::MemoryStore::check_all) could not evaluate a batch.
///
/// Also the bounded-storage half of [`GcraBatchError`]. Nothing was consumed in any case.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum MemoryBatchError {
    /// The batch broke a structural rule checked before any storage work: empty, too many
    /// checks, mixed quota modes or a repeated storage key (see
    /// [`validate`](runlimit_core::backend::batch::validate)).
    #[error("invalid batch")]
    InvalidBatch {
        /// The rule broken.
        #[source]
        source: BatchError,
    },
    /// The batch targets more distinct keys in one shard than that shard can ever hold, so no
    /// amount of waiting for expiry can make it fit. Checked before any lock is taken.
    #[error("batch targets {key_count} keys in shard {shard_index}, which holds at most {capacity}")]
    BatchExceedsShardCapacity {
        /// The lowest-numbered shard that cannot hold its share of the batch.
        shard_index: usize,
        /// How many of the batch's keys map to that shard.
        key_count: usize,
        /// That shard's fixed capacity.
        capacity: usize,
    },
    /// A shard the batch touches is poisoned.
    #[error("memory store shard unavailable")]
    PoisonedShard {
        /// Which shard.
        #[source]
        source: PoisonedShardError,
    },
}

impl From<PoisonedShardError> for MemoryBatchError {
    fn from(source: PoisonedShardError) -> Self {
        Self::PoisonedShard { source }
    }
}

impl From<BatchError> for MemoryBatchError {
    fn from(source: BatchError) -> Self {
        Self::InvalidBatch { source }
    }
}

/// Why [`GcraStore::check`](crate::GcraStore::check) could not evaluate a check.
///
/// Nothing was consumed in any case.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum GcraCheckError {
    /// The key's shard is poisoned.
    #[error("memory store shard unavailable")]
    PoisonedShard {
        /// Which shard.
        #[source]
        source: PoisonedShardError,
    },
    /// The shared evaluator refused to decide. With states this store produced, that only
    /// happens when a clock reading is so large (hundreds of millions of years) that a
    /// theoretical arrival time no longer fits; it is reported instead of wrapping.
    #[error("gcra evaluation failed")]
    Evaluation {
        /// The evaluator's reason.
        #[source]
        source: GcraError,
    },
}

impl From<PoisonedShardError> for GcraCheckError {
    fn from(source: PoisonedShardError) -> Self {
        Self::PoisonedShard { source }
    }
}

/// Why [`GcraStore::check_all`](crate::GcraStore::check_all) could not evaluate a batch.
///
/// Nothing was consumed in any case.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum GcraBatchError {
    /// A bounded-storage failure shared with [`MemoryStore`](crate::MemoryStore): an invalid
    /// batch, a batch too large for a shard, or a poisoned shard.
    #[error("memory store rejected the batch")]
    Store {
        /// The storage failure.
        #[source]
        source: MemoryBatchError,
    },
    /// The shared evaluator refused to decide the check at `index` (see
    /// [`GcraCheckError::Evaluation`]).
    #[error("gcra evaluation failed for check {index}")]
    Evaluation {
        /// Input index of the check.
        index: usize,
        /// The evaluator's reason.
        #[source]
        source: GcraError,
    },
}

impl From<MemoryBatchError> for GcraBatchError {
    fn from(source: MemoryBatchError) -> Self {
        Self::Store { source }
    }
}

impl From<PoisonedShardError> for GcraBatchError {
    fn from(source: PoisonedShardError) -> Self {
        Self::Store { source: source.into() }
    }
}

impl From<BatchError> for GcraBatchError {
    fn from(source: BatchError) -> Self {
        Self::Store { source: source.into() }
    }
}

/// The engine's failure of a single check, before it is narrowed to a public error.
#[derive(Debug)]
pub(crate) enum CheckFailure<E> {
    Poisoned(PoisonedShardError),
    Evaluation(E),
}

/// The engine's failure of a batch, before it is narrowed to a public error.
#[derive(Debug)]
pub(crate) enum Failure<E> {
    Poisoned(PoisonedShardError),
    Invalid(BatchError),
    ExceedsShard { shard_index: usize, key_count: usize, capacity: usize },
    Evaluation { index: usize, source: E },
}

/// What an observation needs to know about a failure.
pub(crate) trait ObservedFailure {
    /// The input index the failure singles out.
    fn singled_out(&self) -> Option<usize>;
    /// Whether the failure is a structural batch rejection.
    fn is_invalid_batch(&self) -> bool;
}

impl<E> ObservedFailure for CheckFailure<E> {
    fn singled_out(&self) -> Option<usize> {
        None
    }
    fn is_invalid_batch(&self) -> bool {
        false
    }
}

impl<E> ObservedFailure for Failure<E> {
    fn singled_out(&self) -> Option<usize> {
        match self {
            Self::Evaluation { index, .. } => Some(*index),
            Self::Poisoned(_) | Self::Invalid(_) | Self::ExceedsShard { .. } => None,
        }
    }
    fn is_invalid_batch(&self) -> bool {
        matches!(self, Self::Invalid(_) | Self::ExceedsShard { .. })
    }
}

impl<E> Failure<E> {
    /// The bounded-storage failure, or the evaluation error with its index.
    pub(crate) fn into_storage(self) -> Result<MemoryBatchError, (usize, E)> {
        match self {
            Self::Poisoned(source) => Ok(source.into()),
            Self::Invalid(source) => Ok(source.into()),
            Self::ExceedsShard { shard_index, key_count, capacity } => {
                Ok(MemoryBatchError::BatchExceedsShardCapacity { shard_index, key_count, capacity })
            }
            Self::Evaluation { index, source } => Err((index, source)),
        }
    }
}
