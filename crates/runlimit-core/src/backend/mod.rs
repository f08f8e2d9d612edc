//! The backend side of Runlimit: every rule a storage backend applies, written once, and the
//! few helpers a backend needs. Applications never need this module.
//!
//! An application builds policies, derives keys, checks and reads decisions through the
//! crate root. A storage backend (`runlimit-memory`, `runlimit-postgres`, or one of your own)
//! also needs the rules themselves, as pure functions of stored state and time, so that every
//! backend decides exactly alike:
//!
//! | module | rule |
//! |---|---|
//! | [`fixed_window`] | anchored fixed windows: anchoring, re-anchoring at the deadline, allowance and retry arithmetic |
//! | [`gcra`] | the exact scaled-integer GCRA evaluator |
//! | [`batch`] | atomic batches: structural validation, denial precedence, allowances in input order |
//! | [`attempts`] | the attempt state machine: admission, lease expiry as a failure, backoff, quiet expiry, completion |
//!
//! # Time
//!
//! Every rule takes time as whole milliseconds of one clock, as a `u64` (`now_ms`), and
//! stores instants on that clock. A backend converts at its edge: a process-local store reads
//! a monotonic clock truncated to whole milliseconds; a database backend truncates its
//! server-clock sample to whole milliseconds (rounding a stored sub-millisecond expiry up,
//! so it never ends early). A stored instant saturated at `u64::MAX` never passes, so a clock
//! that reaches the end of its range fails closed instead of re-opening state
//! ([`is_expired`]).
//!
//! # Helpers
//!
//! - [`notify`] and [`notify_attempt`] deliver observations while isolating observer panics,
//!   so telemetry can never change a result;
//! - [`admission_outcome`] and [`batch_admission_outcome`] classify a decision for its
//!   observation;
//! - [`ShardHeadroom`] is the per-shard occupancy a bounded store reports to observers.

pub mod attempts;
pub mod batch;
pub mod fixed_window;
pub mod gcra;

use crate::attempts::{AttemptObservation, AttemptObserver};

pub use crate::observe::{
    admission_outcome, batch_admission_outcome, notify, observe_admission, observe_cleanup, observe_reset,
};

/// Delivers an attempt `observation` to `observer`, catching a panic so telemetry can never
/// change an attempt result. Returns `false` when the observer panicked.
///
/// Isolation is total, as for [`notify`]: the panic's payload is disposed of without unwinding
/// into the caller, even when the payload's own `Drop` panics.
pub fn notify_attempt<O: AttemptObserver + ?Sized>(
    observer: &O,
    observation: &AttemptObservation<'_>,
) -> bool {
    crate::observe::isolate(|| observer.observe_attempt(observation))
}

/// Whether an instant stored as `expires_at_ms` has passed at `now_ms`: from that instant on,
/// except that `u64::MAX` (a saturated instant) never passes.
///
/// The one expiry predicate of every rule: a fixed window is over at its deadline, an attempt
/// lease expires at its deadline, and stored state may be removed once its expiry has passed.
///
/// # Examples
///
/// ```
/// use runlimit_core::backend::is_expired;
///
/// assert!(!is_expired(1_000, 999));
/// assert!(is_expired(1_000, 1_000));
/// assert!(!is_expired(u64::MAX, u64::MAX));
/// ```
#[inline]
#[must_use]
pub const fn is_expired(expires_at_ms: u64, now_ms: u64) -> bool {
    expires_at_ms <= now_ms && expires_at_ms != u64::MAX
}

/// A bounded store's shard occupancy after an operation, as reported to observers
/// ([`AdmissionObservation::shard_headroom`](crate::AdmissionObservation::shard_headroom)).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ShardHeadroom {
    /// The shard's index.
    pub shard_index: usize,
    /// Entries stored in the shard, live or expired-but-not-yet-removed.
    pub entries: usize,
    /// The shard's fixed capacity.
    pub capacity: usize,
}

impl ShardHeadroom {
    /// Free slots: `capacity - entries` (0 when over).
    #[must_use]
    pub fn headroom(&self) -> usize {
        self.capacity.saturating_sub(self.entries)
    }
}
