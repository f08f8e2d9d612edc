//! The anchored fixed-window rule shared by every fixed-window backend.
//!
//! A pure function of the policy's limit `L` and window `W` (whole milliseconds), the
//! subject's stored [`Window`] (its deadline `d` and the units `u` used in it, or none), the
//! check's cost `c` (between 1 and `L`) and the time `now` in whole milliseconds:
//!
//! ```text
//! live    ⇔ a window is stored and now < d            (d = u64::MAX never passes)
//! live, u + c ≤ L:  allowed;  store (d, u + c)
//!                   available = L − u − c              units left after this check
//!                   replenishes_after = d − now        ms until the window ends
//! live, u + c > L:  exhausted; store nothing
//!                   retry_after = d − now              ms until the window ends, when a
//!                                                      fresh window admits the cost c ≤ L
//! not live:         allowed, anchoring a new window at now; store (now + W, c)
//!                   available = L − c,  replenishes_after = W
//! ```
//!
//! The first allowed check of a subject anchors its window; windows are not aligned to
//! wall-clock boundaries. At the deadline, not a millisecond before, the window is over and
//! the next allowed check anchors a new one at its own time. A denied check never moves the
//! anchor and consumes nothing. Every duration is exact: times are whole milliseconds, so no
//! rounding happens here (a backend whose clock is finer truncates its reading and rounds a
//! stored sub-millisecond deadline up; see [the backend module](super#time)). A deadline that
//! would pass `u64::MAX` saturates there and never passes.
//!
//! # Examples
//!
//! ```
//! use std::time::Duration;
//! use runlimit_core::{FixedWindowPolicy, PolicyId, ScopeId};
//! use runlimit_core::backend::fixed_window::{evaluate, FixedWindowOutcome, FixedWindowParameters, Window};
//!
//! let policy = FixedWindowPolicy::new(
//!     PolicyId::new("auth.login")?, ScopeId::new("client")?, 2, Duration::from_secs(60))?;
//! let parameters = FixedWindowParameters::of(&policy);
//! // The first check anchors a window at 5,000 ms that ends at 65,000 ms.
//! let FixedWindowOutcome::Allowed { allowance, window, anchored: true } =
//!     evaluate(&parameters, None, 5_000, 1) else { panic!() };
//! assert_eq!((allowance.available(), allowance.replenishes_after().millis()), (1, 60_000));
//! assert_eq!(window, Window::new(65_000, 1)?);
//! // 15 s later: the last unit of the window, which ends in 45 s.
//! let FixedWindowOutcome::Allowed { allowance, window, anchored: false } =
//!     evaluate(&parameters, Some(window), 20_000, 1) else { panic!() };
//! assert_eq!((allowance.available(), allowance.replenishes_after().millis()), (0, 45_000));
//! // Exhausted until the deadline; a new window from it on.
//! let FixedWindowOutcome::Exhausted(denial) = evaluate(&parameters, Some(window), 64_999, 1) else { panic!() };
//! assert_eq!(denial.retry_after().millis(), 1);
//! assert!(matches!(evaluate(&parameters, Some(window), 65_000, 1), FixedWindowOutcome::Allowed { anchored: true, .. }));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use crate::{
    backend::is_expired,
    decision::{Allowance, QuotaDenial},
    delay::Delay,
    policy::{Capacity, FixedWindowPolicy, QuotaPeriod},
    snapshot::QuotaSnapshot,
};

/// The numbers the rule needs from a [`FixedWindowPolicy`]: its limit `L` and window `W`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FixedWindowParameters {
    limit: Capacity,
    window: QuotaPeriod,
}

impl FixedWindowParameters {
    /// The parameters of `policy`.
    #[inline]
    #[must_use]
    pub fn of(policy: &FixedWindowPolicy) -> Self {
        Self { limit: policy.limit(), window: policy.window() }
    }

    /// `L`: allowed units per window.
    #[must_use]
    pub const fn limit(&self) -> Capacity {
        self.limit
    }

    /// `W`: the window length in whole milliseconds.
    #[must_use]
    pub const fn window(&self) -> QuotaPeriod {
        self.window
    }
}

/// A subject's stored window: the first millisecond at which it is over (its deadline) and
/// the units used in it (at least 1: a window exists only once a check was allowed in it).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Window {
    deadline_ms: u64,
    used: u64,
}

/// Why [`Window::new`] rejected stored values: a window holds at least one used unit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("a stored window must have used at least 1 unit")]
pub struct WindowError;

impl Window {
    /// A stored window ending at `deadline_ms` with `used` units used.
    ///
    /// # Errors
    ///
    /// [`WindowError`] when `used` is 0 (no evaluation stores that; corrupted storage).
    pub const fn new(deadline_ms: u64, used: u64) -> Result<Self, WindowError> {
        if used == 0 { Err(WindowError) } else { Ok(Self { deadline_ms, used }) }
    }

    /// The first whole millisecond at which the window is over, and the stored state is
    /// equivalent to none.
    #[must_use]
    pub const fn deadline_ms(&self) -> u64 {
        self.deadline_ms
    }

    /// Units used in the window, at least 1. May exceed the limit when another writer stored
    /// more; such a window is exhausted.
    #[must_use]
    pub const fn used(&self) -> u64 {
        self.used
    }
}

/// The rule's answer for one check.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FixedWindowOutcome {
    /// Allowed: store `window`.
    Allowed {
        /// Capacity `L`, available `L − used` after this check, and the time until the
        /// window ends.
        allowance: Allowance,
        /// The window to store.
        window: Window,
        /// Whether this check anchored a new window at `now` (no live window was stored);
        /// `false` for an increment inside the stored window.
        anchored: bool,
    },
    /// The window's limit is used up: store nothing. Capacity `L`, retry after the time until
    /// the window ends.
    Exhausted(QuotaDenial),
}

/// Evaluates one check costing `cost` units at `now_ms` against the subject's `stored`
/// window (`None`: no state). An expired stored window (`now_ms ≥ deadline`) counts as none.
///
/// Pure and exact; see the [module documentation](self) for the rule. `cost` must be between
/// 1 and the limit, as a [`Check`](crate::Check) guarantees; out of that range (a backend's
/// bug) the check is exhausted, failing closed: a cost of 0 or above the limit is never
/// allowed.
#[inline]
#[must_use]
pub fn evaluate(
    parameters: &FixedWindowParameters,
    stored: Option<Window>,
    now_ms: u64,
    cost: u64,
) -> FixedWindowOutcome {
    let limit = parameters.limit;
    let fits = |used: u64| used.checked_add(cost).filter(|total| cost >= 1 && *total <= limit.get());
    match stored.filter(|window| !is_expired(window.deadline_ms, now_ms)) {
        Some(Window { deadline_ms, used }) => {
            // `deadline > now`, or the never-passing u64::MAX.
            let rest_of_window = Delay::from_millis(deadline_ms.saturating_sub(now_ms));
            match fits(used) {
                Some(used) => FixedWindowOutcome::Allowed {
                    allowance: Allowance::exact(limit, limit.get() - used, rest_of_window),
                    window: Window { deadline_ms, used },
                    anchored: false,
                },
                None => FixedWindowOutcome::Exhausted(QuotaDenial::new(limit, rest_of_window)),
            }
        }
        None => {
            let deadline_ms = now_ms.saturating_add(parameters.window.as_millis());
            let window = Delay::from_millis(deadline_ms - now_ms);
            match fits(0) {
                Some(used) => FixedWindowOutcome::Allowed {
                    allowance: Allowance::exact(limit, limit.get() - used, window),
                    window: Window { deadline_ms, used },
                    anchored: true,
                },
                None => FixedWindowOutcome::Exhausted(QuotaDenial::new(limit, window)),
            }
        }
    }
}

/// The subject's quota at `now_ms` without consuming anything: what a peek reports.
///
/// A live stored window of `u` units used ending at `d`: `L − u` available (0 when `u ≥ L`),
/// the next unit and full replenishment both `d − now` away (the window returns every unit
/// at once). No live window: the quota is [full](QuotaSnapshot::full). So
/// [`would_allow(c)`](QuotaSnapshot::would_allow) is exactly whether [`evaluate`] at the
/// same instant would allow a cost of `c`.
pub fn peek(parameters: &FixedWindowParameters, stored: Option<Window>, now_ms: u64) -> QuotaSnapshot {
    let limit = parameters.limit;
    match stored.filter(|window| !is_expired(window.deadline_ms, now_ms)) {
        Some(Window { deadline_ms, used }) => {
            let rest_of_window = Delay::from_millis(deadline_ms.saturating_sub(now_ms));
            QuotaSnapshot::new(limit, limit.get().saturating_sub(used), Some(rest_of_window), rest_of_window)
                // `used ≥ 1`, so the window is never full: the snapshot is always valid.
                .unwrap_or(QuotaSnapshot::full(limit))
        }
        None => QuotaSnapshot::full(limit),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::{MAX_LIMIT, MAX_WINDOW, MAX_WINDOW_MILLIS, PolicyId, ScopeId};

    fn parameters(limit: u64, window_ms: u64) -> FixedWindowParameters {
        FixedWindowParameters::of(
            &FixedWindowPolicy::new(
                PolicyId::new("p").unwrap(),
                ScopeId::new("s").unwrap(),
                limit,
                Duration::from_millis(window_ms),
            )
            .unwrap(),
        )
    }

    /// `Ok((available, replenishes ms, anchored))` or `Err(retry ms)`.
    type Expected = Result<(u64, u128, bool), u128>;

    /// The outcome of one check as [`Expected`], and the state after it.
    fn step(
        parameters: &FixedWindowParameters,
        stored: Option<Window>,
        now: u64,
    ) -> (Expected, Option<Window>) {
        match evaluate(parameters, stored, now, 1) {
            FixedWindowOutcome::Allowed { allowance, window, anchored } => {
                assert_eq!(allowance.capacity(), parameters.limit());
                (Ok((allowance.available(), allowance.replenishes_after().millis(), anchored)), Some(window))
            }
            FixedWindowOutcome::Exhausted(denial) => {
                assert_eq!(denial.capacity(), parameters.limit());
                (Err(denial.retry_after().millis()), stored)
            }
        }
    }

    fn run(parameters: &FixedWindowParameters, steps: &[(u64, Expected)]) {
        let mut stored = None;
        for (i, &(now, expected)) in steps.iter().enumerate() {
            let (got, next) = step(parameters, stored, now);
            assert_eq!(got, expected, "step {i} at {now} ms");
            stored = next;
        }
    }

    #[test]
    fn anchors_counts_down_and_denies_until_the_deadline() {
        run(
            &parameters(3, 1_000),
            &[
                (5_000, Ok((2, 1_000, true))),
                (5_100, Ok((1, 900, false))),
                (5_200, Ok((0, 800, false))),
                (5_300, Err(700)),
                (5_999, Err(1)),
                // Exactly at the deadline: a new window anchored at 6,000, by this check.
                (6_000, Ok((2, 1_000, true))),
                (6_999, Ok((1, 1, false))),
            ],
        );
    }

    #[test]
    fn a_late_check_anchors_at_its_own_time_not_at_a_window_boundary() {
        run(
            &parameters(2, 1_000),
            &[
                (0, Ok((1, 1_000, true))),
                (3_700, Ok((1, 1_000, true))),
                (4_699, Ok((0, 1, false))),
                (4_700, Ok((1, 1_000, true))),
            ],
        );
    }

    #[test]
    fn denials_store_nothing() {
        let p = parameters(1, 60_000);
        let stored = Window::new(60_250, 1).unwrap();
        assert_eq!(
            evaluate(&p, Some(stored), 60_249, 1),
            FixedWindowOutcome::Exhausted(QuotaDenial::new(p.limit(), Delay::from_millis(1)))
        );
        // A window over its limit (another writer stored more) is exhausted, not an error.
        let over = Window::new(70_000, 9).unwrap();
        assert_eq!(
            evaluate(&p, Some(over), 10_000, 1),
            FixedWindowOutcome::Exhausted(QuotaDenial::new(p.limit(), Delay::from_millis(60_000)))
        );
        assert_eq!(Window::new(1, 0), Err(WindowError));
    }

    #[test]
    fn extremes_saturate_and_never_reopen() {
        // MAX_LIMIT and MAX_WINDOW at a clock near the end of its range.
        let p = parameters(MAX_LIMIT, MAX_WINDOW_MILLIS);
        assert_eq!(p.window().duration(), MAX_WINDOW);
        let (first, stored) = step(&p, None, 1_000);
        assert_eq!(first, Ok((MAX_LIMIT - 1, u128::from(MAX_WINDOW_MILLIS), true)));
        let nearly_full = Window::new(stored.unwrap().deadline_ms(), MAX_LIMIT - 1).unwrap();
        let (last, stored) = step(&p, Some(nearly_full), 1_000);
        assert_eq!(last, Ok((0, u128::from(MAX_WINDOW_MILLIS), false)));
        assert_eq!(stored.unwrap().used(), MAX_LIMIT);
        assert_eq!(step(&p, stored, 2_000).0, Err(u128::from(MAX_WINDOW_MILLIS) - 1_000));
        // A deadline that would pass u64::MAX saturates there and never passes.
        let (late, stored) = step(&parameters(1, 10), None, u64::MAX - 3);
        assert_eq!(late, Ok((0, 3, true)));
        assert_eq!(stored.unwrap().deadline_ms(), u64::MAX);
        assert_eq!(step(&parameters(1, 10), stored, u64::MAX).0, Err(0));
    }

    /// The outcome of a check of `cost` as [`Expected`] plus the stored units afterwards.
    fn costed(
        parameters: &FixedWindowParameters,
        stored: Option<Window>,
        now: u64,
        cost: u64,
    ) -> (Expected, Option<u64>) {
        match evaluate(parameters, stored, now, cost) {
            FixedWindowOutcome::Allowed { allowance, window, anchored } => (
                Ok((allowance.available(), allowance.replenishes_after().millis(), anchored)),
                Some(window.used()),
            ),
            FixedWindowOutcome::Exhausted(denial) => {
                (Err(denial.retry_after().millis()), stored.map(|w| w.used()))
            }
        }
    }

    #[test]
    fn a_cost_consumes_exactly_its_units_and_a_denial_consumes_none() {
        let p = parameters(10, 1_000);
        // Fresh: a cost of the whole limit fits, leaving 0.
        assert_eq!(costed(&p, None, 500, 10), (Ok((0, 1_000, true)), Some(10)));
        let full = Window::new(1_500, 10).unwrap();
        // Then a cost of 1 is denied until the window ends (1,500 − 600 = 900 ms).
        assert_eq!(costed(&p, Some(full), 600, 1), (Err(900), Some(10)));
        // 7 used: a cost of 3 fits exactly (7 + 3 = 10), a cost of 4 does not (7 + 4 = 11).
        let seven = Window::new(1_500, 7).unwrap();
        assert_eq!(costed(&p, Some(seven), 1_000, 3), (Ok((0, 500, false)), Some(10)));
        assert_eq!(costed(&p, Some(seven), 1_000, 4), (Err(500), Some(7)));
        // At the deadline the window is over: the cost anchors a new one.
        assert_eq!(costed(&p, Some(full), 1_500, 4), (Ok((6, 1_000, true)), Some(4)));
    }

    #[test]
    fn out_of_range_costs_fail_closed() {
        // A Check never carries these; a backend bug that passed one still never admits.
        let p = parameters(10, 1_000);
        assert_eq!(costed(&p, None, 0, 0).0, Err(1_000));
        assert_eq!(costed(&p, None, 0, 11).0, Err(1_000));
        let stored = Window::new(1_000, 5).unwrap();
        assert_eq!(costed(&p, Some(stored), 0, u64::MAX).0, Err(1_000));
        assert_eq!(costed(&p, Some(stored), 0, 0).0, Err(1_000));
    }

    #[test]
    fn a_cost_of_max_limit_never_overflows() {
        let p = parameters(MAX_LIMIT, MAX_WINDOW_MILLIS);
        let window = u128::from(MAX_WINDOW_MILLIS);
        assert_eq!(costed(&p, None, u64::MAX - 1, MAX_LIMIT), (Ok((0, 1, true)), Some(MAX_LIMIT)));
        assert_eq!(costed(&p, None, 0, MAX_LIMIT), (Ok((0, window, true)), Some(MAX_LIMIT)));
        let one_used = Window::new(MAX_WINDOW_MILLIS, 1).unwrap();
        assert_eq!(costed(&p, Some(one_used), 0, MAX_LIMIT), (Err(window), Some(1)));
        assert_eq!(costed(&p, Some(one_used), 0, MAX_LIMIT - 1), (Ok((0, window, false)), Some(MAX_LIMIT)));
    }

    #[test]
    fn peek_reports_what_a_check_would_find() {
        let p = parameters(10, 1_000);
        assert_eq!(peek(&p, None, 5), QuotaSnapshot::full(p.limit()));
        let seven = Window::new(1_500, 7).unwrap();
        let snapshot = peek(&p, Some(seven), 1_100);
        let ms = Delay::from_millis(400);
        assert_eq!(snapshot, QuotaSnapshot::new(p.limit(), 3, Some(ms), ms).unwrap());
        // Over-full (another writer stored more): nothing available, never an underflow.
        let over = Window::new(1_500, 12).unwrap();
        assert_eq!(peek(&p, Some(over), 1_100).available(), 0);
        // At the deadline the window is over.
        assert_eq!(peek(&p, Some(seven), 1_500), QuotaSnapshot::full(p.limit()));
        for cost in 0..=11 {
            for (stored, now) in [(None, 0), (Some(seven), 1_100), (Some(over), 1_100), (Some(seven), 1_500)]
            {
                let allowed = matches!(evaluate(&p, stored, now, cost), FixedWindowOutcome::Allowed { .. });
                assert_eq!(
                    peek(&p, stored, now).would_allow(cost),
                    allowed,
                    "cost {cost} on {stored:?} at {now}"
                );
            }
        }
    }
}
