//! What a memory store counts: anchored fixed windows or GCRA, each through its rule in
//! [`runlimit_core::backend`].

use std::convert::Infallible;

use runlimit_core::{
    FixedWindowPolicy, GcraPolicy, QuotaSnapshot, RateLimitPolicy,
    backend::{
        fixed_window::{self, FixedWindowOutcome, FixedWindowParameters, Window},
        gcra::{self, GcraError, GcraOutcome, GcraParameters, RoundedArrivalTime, TheoreticalArrivalTime},
    },
};

use crate::{
    engine::Verdict,
    error::{CheckFailure, Failure, GcraBatchError, GcraCheckError, MemoryBatchError, PoisonedShardError},
    shard::Entry,
};

/// A policy type a [`ShardedStore`](crate::ShardedStore) can count:
/// [`FixedWindowPolicy`] ([`MemoryStore`](crate::MemoryStore)) or [`GcraPolicy`]
/// ([`GcraStore`](crate::GcraStore)).
///
/// Sealed: only this crate implements it, so a store only ever evaluates the rules of
/// [`runlimit_core::backend`]. The associated types name each operation's error.
pub trait MemoryAlgorithm: RateLimitPolicy + Sized + sealed::Algorithm {
    /// Every way a single check can fail: [`PoisonedShardError`] for fixed windows,
    /// [`GcraCheckError`] for GCRA.
    type CheckError: std::error::Error + Send + Sync + 'static;
    /// Every way an atomic batch can fail: [`MemoryBatchError`] for fixed windows,
    /// [`GcraBatchError`] for GCRA.
    type BatchError: std::error::Error + Send + Sync + 'static;
}

impl MemoryAlgorithm for FixedWindowPolicy {
    type CheckError = PoisonedShardError;
    type BatchError = MemoryBatchError;
}

impl MemoryAlgorithm for GcraPolicy {
    type CheckError = GcraCheckError;
    type BatchError = GcraBatchError;
}

#[expect(
    private_interfaces,
    unnameable_types,
    reason = "the sealed half of `MemoryAlgorithm`: only this crate implements and calls it"
)]
pub(crate) mod sealed {
    use super::*;

    /// How one check changes one stored entry, and how the engine's failures narrow to the
    /// policy's public error types.
    pub trait Algorithm: RateLimitPolicy + Sized {
        /// The names the store and its builder show in their `Debug` output.
        const NAMES: (&'static str, &'static str);

        /// Why the rule may refuse to decide.
        type Error;

        /// Evaluates one check of `cost` units (validated by its `Check`: between 1 and the
        /// policy's capacity) at `now` (store milliseconds) against the key's live entry
        /// (`None`: no entry, or an expired one).
        fn evaluate(&self, live: Option<Entry>, now: u64, cost: u64) -> Result<Verdict, Self::Error>;

        /// The key's quota at `now` from its live entry, changing nothing.
        fn peek(&self, live: Option<Entry>, now: u64) -> Result<QuotaSnapshot, Self::Error>;

        /// The public error of a failed single check.
        fn check_error(failure: CheckFailure<Self::Error>) -> <Self as MemoryAlgorithm>::CheckError
        where
            Self: MemoryAlgorithm;

        /// The public error of a failed batch.
        fn batch_error(failure: Failure<Self::Error>) -> <Self as MemoryAlgorithm>::BatchError
        where
            Self: MemoryAlgorithm;
    }

    /// Anchored fixed windows: an entry is `(window deadline, units used)`, decided by
    /// [`fixed_window::evaluate`].
    impl Algorithm for FixedWindowPolicy {
        const NAMES: (&'static str, &'static str) = ("MemoryStore", "MemoryStoreBuilder");
        type Error = Infallible;

        #[inline]
        fn evaluate(&self, live: Option<Entry>, now: u64, cost: u64) -> Result<Verdict, Infallible> {
            // A stored entry always holds at least one used unit; an entry that somehow held
            // none would count as no window.
            let stored = live.and_then(|entry| Window::new(entry.expires_at, entry.value).ok());
            Ok(match fixed_window::evaluate(&FixedWindowParameters::of(self), stored, now, cost) {
                FixedWindowOutcome::Allowed { allowance, window, .. } => Verdict::Allowed {
                    allowance,
                    next: Entry { expires_at: window.deadline_ms(), value: window.used() },
                },
                FixedWindowOutcome::Exhausted(denial) => Verdict::Exhausted(denial),
            })
        }

        fn peek(&self, live: Option<Entry>, now: u64) -> Result<QuotaSnapshot, Infallible> {
            let stored = live.and_then(|entry| Window::new(entry.expires_at, entry.value).ok());
            Ok(fixed_window::peek(&FixedWindowParameters::of(self), stored, now))
        }

        fn check_error(failure: CheckFailure<Infallible>) -> PoisonedShardError {
            match failure {
                CheckFailure::Poisoned(error) => error,
                CheckFailure::Evaluation(never) => match never {},
            }
        }

        fn batch_error(failure: Failure<Infallible>) -> MemoryBatchError {
            match failure.into_storage() {
                Ok(error) => error,
                Err((_, never)) => match never {},
            }
        }
    }

    /// GCRA through [`gcra::evaluate`].
    ///
    /// An entry stores the scaled theoretical arrival time `tat` (milliseconds × Q) exactly,
    /// as `expires_at = ⌈tat / Q⌉` (the first millisecond at which the subject is fully
    /// rested, so the entry's expiry) and `deficit = expires_at × Q − tat` (in `0..Q`). Both fit
    /// 64 bits, and neither storing nor restoring needs a division: `expires_at` is `now +
    /// replenish_after` from the evaluator (because `now × Q` is a multiple of Q), and `tat =
    /// expires_at × Q − deficit`.
    impl Algorithm for GcraPolicy {
        const NAMES: (&'static str, &'static str) = ("GcraStore", "GcraStoreBuilder");
        type Error = GcraError;

        /// An allowed check on a realistic clock takes the core's 64-bit shortcut, inlined;
        /// everything else (denials, errors, extreme values) the general evaluator, out of
        /// line. An entry is a [`RoundedArrivalTime`]: `expires_at` is its
        /// `expires_at_millis`, `value` its `deficit`.
        #[inline(always)]
        fn evaluate(&self, live: Option<Entry>, now: u64, cost: u64) -> Result<Verdict, GcraError> {
            let parameters = GcraParameters::of(self);
            let stored = live.map(|entry| RoundedArrivalTime {
                expires_at_millis: entry.expires_at,
                deficit: entry.value,
            });
            match gcra::evaluate_allowed_rounded(parameters, stored, now, cost) {
                Some((allowance, next)) => Ok(Verdict::Allowed {
                    allowance,
                    next: Entry { expires_at: next.expires_at_millis, value: next.deficit },
                }),
                None => evaluate_general(parameters, live, now, cost),
            }
        }

        fn peek(&self, live: Option<Entry>, now: u64) -> Result<QuotaSnapshot, GcraError> {
            let parameters = GcraParameters::of(self);
            gcra::peek(parameters, stored_tat(live, u128::from(parameters.quota().get()))?, now)
        }

        fn check_error(failure: CheckFailure<GcraError>) -> GcraCheckError {
            match failure {
                CheckFailure::Poisoned(source) => source.into(),
                CheckFailure::Evaluation(source) => GcraCheckError::Evaluation { source },
            }
        }

        fn batch_error(failure: Failure<GcraError>) -> GcraBatchError {
            match failure.into_storage() {
                Ok(source) => source.into(),
                Err((index, source)) => GcraBatchError::Evaluation { index, source },
            }
        }
    }
}

/// The exact arrival time a live GCRA entry stores (see the `Algorithm` impl for
/// [`GcraPolicy`]): `tat = expires_at × Q − deficit`.
#[inline]
fn stored_tat(live: Option<Entry>, quota: u128) -> Result<Option<TheoreticalArrivalTime>, GcraError> {
    match live {
        // expires_at < 2⁶⁴ and Q ≤ MAX_LIMIT < 2⁶³: the product is below 2¹²⁷.
        Some(entry) => (u128::from(entry.expires_at) * quota)
            .checked_sub(u128::from(entry.value))
            .map(|scaled| Some(TheoreticalArrivalTime::from_scaled(scaled)))
            .ok_or(GcraError::StateOutOfRange),
        None => Ok(None),
    }
}

/// A GCRA check through the general evaluator: what
/// [`gcra::evaluate_allowed_rounded`] leaves undecided. Out of line, so the shortcut stays
/// small enough to inline into the store's check.
#[inline(never)]
fn evaluate_general(
    parameters: &GcraParameters,
    live: Option<Entry>,
    now: u64,
    cost: u64,
) -> Result<Verdict, GcraError> {
    let quota = u128::from(parameters.quota().get());
    let tat = stored_tat(live, quota)?;
    let outcome = gcra::evaluate(parameters, tat, now, cost)?;
    match outcome {
        GcraOutcome::Allowed { tat, replenish_after_millis, .. } => {
            let expires_at = now.checked_add(replenish_after_millis).ok_or(GcraError::StateOutOfRange)?;
            let deficit = (u128::from(expires_at) * quota)
                .checked_sub(tat.scaled())
                .and_then(|deficit| u64::try_from(deficit).ok())
                .ok_or(GcraError::StateOutOfRange)?;
            let allowance = outcome.allowance(parameters).ok_or(GcraError::StateOutOfRange)?;
            Ok(Verdict::Allowed { allowance, next: Entry { expires_at, value: deficit } })
        }
        GcraOutcome::Denied { .. } => {
            outcome.quota_denial(parameters).map(Verdict::Exhausted).ok_or(GcraError::StateOutOfRange)
        }
    }
}
