//! The conformance suite every Runlimit backend runs.
//!
//! Every rule the specification states for all backends is a scenario here, written once as an
//! `async fn` generic over a small harness trait ([`QuotaBackend`] for fixed windows and GCRA,
//! [`AttemptBackend`] for attempt limiters), asserting exact values. A backend's test crate
//! implements the harness and instantiates the whole suite with one macro per family, so a
//! scenario added here runs on every backend under the same test name:
//!
//! ```ignore
//! // tests/conformance.rs of a backend crate
//! mod conformance {
//!     use super::*; // the harness types
//!     runlimit_conformance::fixed_window_scenarios!(MyFixedWindowBackend);
//!     runlimit_conformance::gcra_scenarios!(MyGcraBackend);
//!     runlimit_conformance::attempt_scenarios!(MyAttemptBackend);
//! }
//! ```
//!
//! which yields tests named `conformance::fixed_window::<scenario>`,
//! `conformance::gcra::<scenario>` and `conformance::attempts::<scenario>`. Attributes given
//! after the harness type (for example `#[ignore = "needs a database"]`) are put on every
//! generated test. (rustls' provider test suite, one source instantiated per provider, is the
//! model.)
//!
//! Time is whole milliseconds from the backend's origin (0 ms when a scenario starts), moved
//! only by the harness's `advance`: no scenario sleeps.

mod harness;
pub mod support;

pub mod attempts;
pub mod fixed_window;
pub mod gcra;

pub use crate::harness::{AttemptBackend, QuotaBackend};
