//! Validated rate-limit policies, HMAC-derived subject keys, checks and exhaustive decisions.
//!
//! `runlimit-core` is the storage-neutral half of Runlimit. It owns the vocabulary every
//! backend shares:
//!
//! - policies: [`FixedWindowPolicy`] (anchored fixed windows) and [`GcraPolicy`]
//!   (continuously replenished quotas), built once from validated [`PolicyId`], [`ScopeId`],
//!   [`Capacity`] and [`QuotaPeriod`] values and fingerprinted into every storage key;
//! - keys: [`KeyHasher`] derives opaque [`SubjectKey`]s with HMAC-SHA-256, bound to their
//!   policy as a [`PolicySubject`], the only input [`Check::new`] accepts;
//! - outcomes: [`Decision`] / [`DecisionView`] / [`Denial`] / [`Admitted`] for one check,
//!   [`BatchDecision`] / [`BatchDecisionView`] for an atomic batch, with durations as
//!   [`Delay`]s;
//! - the static-dispatch async [`Limiter`] trait, the [`Observer`] seam and
//!   [`attempts::AttemptPolicy`].
//!
//! Backends live in `runlimit-memory` (process-local, hard-bounded) and `runlimit-postgres`
//! (shared across replicas). The rules they apply (the fixed-window rule, the exact GCRA
//! evaluator, batch precedence, the attempt state machine) are written once, in the
//! [`backend`] module, which is all a storage backend needs beyond this root and all an
//! application can ignore.
//!
//! # Example
//!
//! ```
//! use runlimit_core::{Decision, DecisionView, Denial};
//!
//! fn describe(decision: &Decision) -> String {
//!     match decision.view() {
//!         DecisionView::Allowed { allowance } => format!(
//!             "admitted; {} of {} left",
//!             allowance.available(),
//!             allowance.capacity(),
//!         ),
//!         DecisionView::ShadowDenied { denial } => format!(
//!             "admitted; quota of {} would have denied for {}s",
//!             denial.capacity(),
//!             denial.retry_after().seconds(),
//!         ),
//!         DecisionView::Denied {
//!             denial: Denial::QuotaExceeded(quota),
//!         } => format!("rejected; retry after {}s", quota.retry_after().seconds()),
//!         DecisionView::Denied {
//!             denial: Denial::StorageCapacity { retry_after },
//!         } => match retry_after {
//!             Some(retry_after) => format!("rejected; backend full for {}s", retry_after.seconds()),
//!             None => "rejected; backend full".to_owned(),
//!         },
//!     }
//! }
//! # let _ = describe;
//! ```
//!
//! # Feature flags
//!
//! | Feature | Default | What it enables |
//! |---|---|---|
//! | `serde` | no | `Serialize`/`Deserialize` for identifiers (as strings), policies (without fingerprints), [`QuotaMode`], [`Capacity`], [`QuotaPeriod`], [`Delay`], [`Allowance`], [`QuotaDenial`], and tagged [`Decision`], [`Denial`] and [`BatchDecision`]. Deserialization rejects unknown fields and re-runs every constructor check. [`SubjectKey`], [`CounterKey`], [`PolicyFingerprint`] and [`KeyHasher`] never implement serde traits. |
//!
//! # Identifier rules
//!
//! [`PolicyId`] and [`ScopeId`] accept 1 to 64 bytes of ASCII letters, digits, `.`, `_`, `-`
//! and `:`, starting with a letter or digit.

#![cfg_attr(docsrs, feature(doc_cfg))]
#![doc(test(attr(deny(warnings))))]
#![cfg_attr(not(test), warn(clippy::unwrap_used, clippy::expect_used, clippy::panic))]

pub mod attempts;
pub mod backend;
mod batch;
mod check;
mod decision;
mod delay;
mod id;
mod key;
mod limiter;
mod observe;
mod policy;
mod snapshot;

pub use crate::batch::BatchError;
pub use crate::check::{Check, CostError};
pub use crate::decision::{
    Admitted, Allowance, AllowanceError, BatchDecision, BatchDecisionError, BatchDecisionView, Decision,
    DecisionView, Denial, QuotaDenial,
};
pub use crate::delay::Delay;
pub use crate::id::{IdentifierError, MAX_IDENTIFIER_LEN, PolicyId, ScopeId};
pub use crate::key::{
    AttemptSubject, CounterKey, KeyHasher, KeyHasherError, MIN_SECRET_LEN, PolicySubject, SubjectKey,
};
pub use crate::limiter::{Limiter, QuotaControl};
pub use crate::observe::{
    AdmissionObservation, AdmissionOperation, AdmissionOutcome, AdmissionPolicy, CleanupObservation,
    CleanupOutcome, ConsumptionStatus, Observation, Observer, ResetObservation, ResetOutcome,
};
pub use crate::policy::{
    Capacity, FixedWindowPolicy, GcraPolicy, MAX_LIMIT, MAX_WINDOW, MAX_WINDOW_MILLIS, PolicyError,
    PolicyFingerprint, QuotaMode, QuotaPeriod, RateLimitPolicy,
};
pub use crate::snapshot::{QuotaSnapshot, SnapshotError};

/// This crate's README (what crates.io shows), compiled and run as doctests so it stays true.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct CrateReadmeDoctests;
