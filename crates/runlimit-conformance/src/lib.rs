//! The conformance suite every Runlimit backend runs.
//!
//! Every rule the specification states for all backends is a scenario here, written once as an
//! `async fn` generic over a small harness trait ([`QuotaBackend`] for fixed windows and GCRA,
//! [`AttemptBackend`] for attempt limiters), asserting exact values. A backend's test crate
//! implements the harness and instantiates, with one macro per family, the families of every
//! limiter it offers (a backend without an attempt limiter, such as Redis, leaves out
//! `attempt_scenarios!`), so a scenario added here runs on every backend of its family under
//! the same test name:
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

//!
//! Every family also exports its scenario names ([`fixed_window::SCENARIOS`],
//! [`gcra::SCENARIOS`], [`attempts::SCENARIOS`]); the macro of a family and its name list are
//! generated from one list, which a unit test of this crate compares with the family's
//! `pub async fn`s, so a scenario written once runs on every backend of its family.

mod harness;
pub mod support;

pub mod attempts;
pub mod fixed_window;
pub mod gcra;

pub use crate::harness::{AttemptBackend, QuotaBackend};

/// Expands a family's scenario list (the trailing `[name ...]`, appended by the family's
/// hidden list macro): `@names` into the family's `SCENARIOS` constant, `@tests` into one
/// `#[test]` per scenario. Not part of the API.
#[doc(hidden)]
#[macro_export]
macro_rules! __scenarios {
    (@names [$($name:ident)*]) => {
        /// The name of every scenario of this family, in declaration order: the tests the
        /// family's instantiation macro generates.
        pub const SCENARIOS: &[&str] = &[$(stringify!($name)),*];
    };
    (@tests $family:ident $harness:ident ($backend:ty) [$(#[$attr:meta])*] []) => {};
    (@tests $family:ident $harness:ident ($backend:ty) [$(#[$attr:meta])*] [$name:ident $($rest:ident)*]) => {
        $(#[$attr])*
        #[test]
        fn $name() {
            <$backend as $crate::$harness>::run(
                concat!(stringify!($family), "::", stringify!($name)),
                async |backend: &mut $backend| $crate::$family::$name(backend).await,
            )
        }
        $crate::__scenarios! { @tests $family $harness ($backend) [$(#[$attr])*] [$($rest)*] }
    };
}

/// Instantiates every fixed-window scenario for `$backend`, a
/// [`QuotaBackend<Policy = FixedWindowPolicy>`](QuotaBackend), as `pub mod fixed_window` with
/// one `#[test]` per scenario, named after it. Attributes given after the type (such as
/// `#[ignore = "needs a database"]`) are put on every test.
///
/// The module starts with `use super::*;`, so the harness type may be named as in the
/// enclosing module.
#[macro_export]
macro_rules! fixed_window_scenarios {
    ($backend:ty $(, #[$attr:meta])* $(,)?) => {
        /// The fixed-window conformance scenarios on this backend.
        #[allow(unreachable_pub, reason = "generated test module; its visibility is the suite's convention")]
        pub mod fixed_window {
            #[allow(unused_imports, reason = "the harness type may be named through the parent module")]
            use super::*;
            $crate::__fixed_window_scenario_names! {
                @tests fixed_window QuotaBackend ($backend) [$(#[$attr])*]
            }
        }
    };
}

/// Instantiates every GCRA scenario for `$backend`, a
/// [`QuotaBackend<Policy = GcraPolicy>`](QuotaBackend), as `pub mod gcra`; see
/// [`fixed_window_scenarios!`].
#[macro_export]
macro_rules! gcra_scenarios {
    ($backend:ty $(, #[$attr:meta])* $(,)?) => {
        /// The GCRA conformance scenarios on this backend.
        #[allow(unreachable_pub, reason = "generated test module; its visibility is the suite's convention")]
        pub mod gcra {
            #[allow(unused_imports, reason = "the harness type may be named through the parent module")]
            use super::*;
            $crate::__gcra_scenario_names! { @tests gcra QuotaBackend ($backend) [$(#[$attr])*] }
        }
    };
}

/// Instantiates every attempt scenario for `$backend`, an [`AttemptBackend`], as
/// `pub mod attempts`; see [`fixed_window_scenarios!`].
#[macro_export]
macro_rules! attempt_scenarios {
    ($backend:ty $(, #[$attr:meta])* $(,)?) => {
        /// The attempt-limiting conformance scenarios on this backend.
        #[allow(unreachable_pub, reason = "generated test module; its visibility is the suite's convention")]
        pub mod attempts {
            #[allow(unused_imports, reason = "the harness type may be named through the parent module")]
            use super::*;
            $crate::__attempt_scenario_names! { @tests attempts AttemptBackend ($backend) [$(#[$attr])*] }
        }
    };
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    /// The names of the `pub async fn`s of a family's source: its scenarios.
    fn scenario_fns(source: &str) -> Vec<&str> {
        source
            .lines()
            .filter_map(|line| line.trim_start().strip_prefix("pub async fn "))
            .map(|rest| {
                let end = rest.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(rest.len());
                &rest[..end]
            })
            .collect()
    }

    fn assert_listed(family: &str, source: &str, listed: &[&str]) {
        let fns = scenario_fns(source);
        assert!(!fns.is_empty(), "{family}: no scenario found in the source");
        let fn_set: BTreeSet<&str> = fns.iter().copied().collect();
        let listed_set: BTreeSet<&str> = listed.iter().copied().collect();
        assert_eq!(fn_set.len(), fns.len(), "{family}: a scenario name is defined twice");
        assert_eq!(listed_set.len(), listed.len(), "{family}: a scenario is listed twice");
        let missing: Vec<_> = fn_set.difference(&listed_set).collect();
        assert!(missing.is_empty(), "{family}: scenarios missing from the family's macro list: {missing:?}");
        let unknown: Vec<_> = listed_set.difference(&fn_set).collect();
        assert!(unknown.is_empty(), "{family}: listed names without a `pub async fn`: {unknown:?}");
        assert_eq!(fns, listed, "{family}: list the scenarios in declaration order");
    }

    #[test]
    fn every_scenario_is_in_its_family_macro() {
        assert_listed("fixed_window", include_str!("fixed_window.rs"), crate::fixed_window::SCENARIOS);
        assert_listed("gcra", include_str!("gcra.rs"), crate::gcra::SCENARIOS);
        assert_listed("attempts", include_str!("attempts.rs"), crate::attempts::SCENARIOS);
    }

    #[test]
    fn no_scenario_lives_outside_a_family() {
        for (file, source) in [
            ("lib.rs", include_str!("lib.rs")),
            ("support.rs", include_str!("support.rs")),
            ("harness.rs", include_str!("harness.rs")),
        ] {
            // Only helpers here: a `pub async fn` would be a scenario no macro runs.
            let helpers = ["decide", "decide_all", "rejected_batch", "admit", "deny", "peek", "reset"];
            let stray: Vec<_> =
                scenario_fns(source).into_iter().filter(|name| !helpers.contains(name)).collect();
            assert!(
                stray.is_empty(),
                "{file} defines `pub async fn`s outside a family, which no macro runs: {stray:?} \
                 (move a scenario into its family, or add a new helper to this test's list)"
            );
        }
    }
}
