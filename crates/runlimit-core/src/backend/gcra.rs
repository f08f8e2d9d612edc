//! The exact GCRA evaluator shared by every GCRA backend.
//!
//! A pure function of the policy, the stored theoretical arrival time (TAT) and the current
//! time in whole milliseconds. No floats: every instant is scaled by the quota Q, so the
//! emission interval `T = P / Q` becomes exactly `P` scaled units and all state is an integer
//! (the derivation: with `T = P / Q`, the classic test "allowed iff `now ≥ TAT − τ`" for a
//! delay tolerance `τ = (B − 1)·T` becomes, for a cost `c`, `max(TAT, now) + c·T − now ≤ B·T`;
//! multiplying by Q makes every term an integer).
//!
//! For a request of cost `c` at `now` (scaled `now_s = now_ms × Q`):
//!
//! ```text
//! base    = max(tat_s, now_s)
//! cand    = base + c × P
//! ceiling = now_s + B × P
//! allowed ⇔ cand ≤ ceiling           (store tat_s := cand; on denial store nothing)
//! allowed: remaining      = ⌊(ceiling − cand) / P⌋            units, rounded down
//!          replenish      = ⌈(cand − now_s) / Q⌉              ms, rounded up
//!          next unit      = ⌈(cand − now_s − (B − r − 1)·P) / Q⌉  ms, rounded up
//! denied:  retry_after    = ⌈(cand − ceiling) / Q⌉            ms, rounded up
//!          available      = ⌊(ceiling − base) / P⌋            units, rounded down
//! expiry:  ⌈tat_s / Q⌉ ms — state is equivalent to no state from then on
//! ```
//!
//! Durations round up, so retrying at `now + retry_after` is guaranteed to succeed and is the
//! earliest whole millisecond that does; unit counts round down, so no unit is promised that
//! is not there.
//!
//! # Reference vectors
//!
//! The unit tests of this module, and the conformance scenarios every GCRA backend runs,
//! replay five reference vectors with exact allow/deny values and delays:
//!
//! | vector | quota Q per period P | burst B | what it pins |
//! |---|---|---|---|
//! | V1 | 10 per 1,000 ms | 20 | a rested key spends its whole burst, then one unit per 100 ms, without drift |
//! | V2 | 3 per 1,000 ms | 2 | an emission interval of 333⅓ ms, which is not a whole millisecond |
//! | V3 | 1 per 60,000 ms | 1 | one unit per minute and its exact retry |
//! | V4 | 5 per 1,000 ms | 5 | weighted costs |
//! | V5 | 2 per 1,000 ms | 4 | a burst of four, then the steady rate |
//!
//! # Overflow
//!
//! With Q, B ≤ [`MAX_LIMIT`](crate::MAX_LIMIT), P ≤ [`MAX_WINDOW`](crate::MAX_WINDOW) and
//! `now_ms ≤ u64::MAX`, the largest intermediate `now_s + 2·B·P` is below 2¹²⁸, so evaluation
//! of a state the evaluator produced cannot overflow. A state read from corrupted storage can;
//! every operation is checked and reports [`GcraError::StateOutOfRange`] instead of wrapping.
//!
//! # Examples
//!
//! Q = 3 per 1000 ms, burst 2 (T = 333⅓ ms, not an integer: the reason for scaling).
//!
//! ```
//! use std::time::Duration;
//! use runlimit_core::{GcraPolicy, PolicyId, ScopeId};
//! use runlimit_core::backend::gcra::{evaluate, GcraOutcome, GcraParameters};
//!
//! let policy = GcraPolicy::new(
//!     PolicyId::new("api")?, ScopeId::new("client")?, 3, Duration::from_secs(1), 2)?;
//! let parameters = *GcraParameters::of(&policy);
//! let GcraOutcome::Allowed { tat, remaining, replenish_after_millis, .. } =
//!     evaluate(&parameters, None, 0, 1)? else { panic!() };
//! assert_eq!((remaining, replenish_after_millis), (1, 334));
//! let GcraOutcome::Allowed { tat, .. } = evaluate(&parameters, Some(tat), 0, 1)? else { panic!() };
//! assert_eq!(tat.expires_at_millis(&parameters), 667);
//! let GcraOutcome::Denied { retry_after_millis, .. } =
//!     evaluate(&parameters, Some(tat), 333, 1)? else { panic!() };
//! assert_eq!(retry_after_millis, 1);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use fastdivide::DividerU64;

use crate::{
    decision::{Allowance, QuotaDenial},
    delay::Delay,
    policy::{Capacity, GcraPolicy, MAX_WINDOW_MILLIS, PolicyError, QuotaPeriod},
    snapshot::QuotaSnapshot,
};

/// The validated numbers the evaluator needs: quota Q, period P (ms) and burst capacity B.
///
/// It also holds Q and P as strength-reduced divisors, computed once when the parameters are
/// built (a [`GcraPolicy`] builds them with itself), so the 64-bit evaluation divides by
/// multiplying: a 64-bit division costs tens of cycles, and a check divides twice. (The
/// `fastdivide` crate, a port of libdivide, computes them: the high half of one 64×64-bit
/// product by a precomputed reciprocal, then a shift. It replaced `strength_reduce`, whose
/// 128-bit reciprocal takes two products: an allowed `GcraStore` check 31.7 → 30.5 ns.) It
/// also holds B·P and the clock below which
/// [`evaluate_allowed_rounded`] may compute in 64 bits without checking each step. Equality,
/// hashing and `Debug` see only Q, P and B.
#[derive(Clone, Copy)]
pub struct GcraParameters {
    quota: Capacity,
    period: QuotaPeriod,
    burst: Capacity,
    quota_divisor: DividerU64,
    period_divisor: DividerU64,
    /// B·P in scaled units when it fits 64 bits, else 0 (the shortcut is then off).
    capacity_scaled: u64,
    /// ⌊(2⁶⁴ − 1 − B·P) / Q⌋: clocks and stored expiries below it take the 64-bit shortcut of
    /// [`evaluate_allowed_rounded`]; 0 when B·P does not fit 64 bits.
    shortcut_limit_millis: u64,
}

impl PartialEq for GcraParameters {
    fn eq(&self, other: &Self) -> bool {
        (self.quota, self.period, self.burst) == (other.quota, other.period, other.burst)
    }
}

impl Eq for GcraParameters {}

impl std::hash::Hash for GcraParameters {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        (self.quota, self.period, self.burst).hash(state);
    }
}

impl std::fmt::Debug for GcraParameters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GcraParameters")
            .field("quota", &self.quota)
            .field("period", &self.period)
            .field("burst", &self.burst)
            .finish()
    }
}

impl GcraParameters {
    /// Validates the parameters: full replenishment ⌈B·P/Q⌉ ms must not exceed
    /// [`MAX_WINDOW`](crate::MAX_WINDOW).
    ///
    /// # Errors
    ///
    /// [`PolicyError::ReplenishmentTooLong`].
    pub fn new(quota: Capacity, period: QuotaPeriod, burst: Capacity) -> Result<Self, PolicyError> {
        let full = u128::from(burst.get()) * u128::from(period.as_millis());
        let millis = full.div_ceil(u128::from(quota.get()));
        if millis > u128::from(MAX_WINDOW_MILLIS) {
            return Err(PolicyError::ReplenishmentTooLong { millis, maximum_millis: MAX_WINDOW_MILLIS });
        }
        // Both are at least 1, validated by `Capacity` and `QuotaPeriod`: `new` cannot panic.
        let quota_divisor = DividerU64::divide_by(quota.get());
        let period_divisor = DividerU64::divide_by(period.as_millis());
        let (capacity_scaled, shortcut_limit_millis) = match u64::try_from(full) {
            Ok(capacity_scaled) => (capacity_scaled, (u64::MAX - capacity_scaled) / quota.get()),
            Err(_) => (0, 0),
        };
        Ok(Self {
            quota,
            period,
            burst,
            quota_divisor,
            period_divisor,
            capacity_scaled,
            shortcut_limit_millis,
        })
    }

    /// The parameters of `policy` (validated and derived when the policy was built), borrowed:
    /// a backend evaluates through the policy's own copy.
    #[inline]
    #[must_use]
    pub fn of(policy: &GcraPolicy) -> &Self {
        policy.parameters()
    }

    /// Q: units replenished per period.
    #[must_use]
    pub const fn quota(&self) -> Capacity {
        self.quota
    }
    /// P: the period in milliseconds.
    #[must_use]
    pub const fn period(&self) -> QuotaPeriod {
        self.period
    }
    /// B: the burst capacity.
    #[must_use]
    pub const fn burst_capacity(&self) -> Capacity {
        self.burst
    }
}

/// A theoretical arrival time in scaled units (milliseconds × Q): the instant at which the
/// subject would be fully rested. Only meaningful with the [`GcraParameters`] it was computed
/// under.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TheoreticalArrivalTime(u128);

impl TheoreticalArrivalTime {
    /// Wraps a stored scaled value (milliseconds × Q).
    #[must_use]
    pub const fn from_scaled(scaled: u128) -> Self {
        Self(scaled)
    }

    /// Rebuilds a scaled value from its exact `bigint`-sized parts,
    /// `millis × Q + remainder`. `None` if `remainder ≥ Q` or the value overflows.
    #[must_use]
    pub fn from_parts(millis: u64, remainder: u64, parameters: &GcraParameters) -> Option<Self> {
        let quota = parameters.quota.get();
        if remainder >= quota {
            return None;
        }
        u128::from(millis).checked_mul(u128::from(quota))?.checked_add(u128::from(remainder)).map(Self)
    }

    /// The scaled value.
    #[must_use]
    pub const fn scaled(self) -> u128 {
        self.0
    }

    /// The exact parts `(⌊tat / Q⌋ ms, tat mod Q)`. The remainder is below Q ≤
    /// [`MAX_LIMIT`](crate::MAX_LIMIT) and the millisecond part is at most `now_ms` plus the
    /// full replenishment time, so both fit PostgreSQL `bigint` for any state the evaluator
    /// produced with `now_ms ≤ i64::MAX − MAX_WINDOW_MILLIS`. `None` if the millisecond part
    /// exceeds `u64`.
    #[must_use]
    pub fn to_parts(self, parameters: &GcraParameters) -> Option<(u64, u64)> {
        let quota = u128::from(parameters.quota.get());
        let millis = u64::try_from(self.0 / quota).ok()?;
        let remainder = u64::try_from(self.0 % quota).ok()?;
        Some((millis, remainder))
    }

    /// The first whole millisecond at which the state is equivalent to no state and may be
    /// deleted: ⌈tat / Q⌉. Saturates at `u64::MAX`.
    #[must_use]
    pub fn expires_at_millis(self, parameters: &GcraParameters) -> u64 {
        u64::try_from(self.0.div_ceil(u128::from(parameters.quota.get()))).unwrap_or(u64::MAX)
    }
}

/// The evaluator's answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GcraOutcome {
    /// Allowed: store `tat`.
    Allowed {
        /// The new theoretical arrival time to store.
        tat: TheoreticalArrivalTime,
        /// Units spendable immediately after this request, rounded down; below B.
        remaining: u64,
        /// Milliseconds until fully rested, rounded up.
        replenish_after_millis: u64,
        /// Milliseconds until one more unit becomes available, rounded up.
        next_unit_after_millis: u64,
    },
    /// Denied: store nothing.
    Denied {
        /// Milliseconds until the same request fits, rounded up; at least 1.
        retry_after_millis: u64,
        /// Units spendable now, rounded down (0 for a unit-cost request).
        available: u64,
    },
}

impl GcraOutcome {
    /// The allowance of an allowed outcome, with the burst capacity as its capacity.
    #[must_use]
    pub fn allowance(&self, parameters: &GcraParameters) -> Option<Allowance> {
        match *self {
            Self::Allowed { remaining, replenish_after_millis, .. } => {
                Allowance::new(parameters.burst, remaining, Delay::from_millis(replenish_after_millis)).ok()
            }
            Self::Denied { .. } => None,
        }
    }

    /// The quota denial of a denied outcome, with the burst capacity as its capacity.
    #[must_use]
    pub fn quota_denial(&self, parameters: &GcraParameters) -> Option<QuotaDenial> {
        match *self {
            Self::Denied { retry_after_millis, .. } => {
                Some(QuotaDenial::new(parameters.burst, Delay::from_millis(retry_after_millis)))
            }
            Self::Allowed { .. } => None,
        }
    }
}

/// Why the evaluator refused to decide.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum GcraError {
    /// A request must cost at least one unit.
    #[error("request cost must be at least 1")]
    ZeroCost,
    /// A request costing more than the burst capacity can never be allowed; a caller or
    /// configuration error, not a quota denial.
    #[error("request cost {cost} exceeds the burst capacity {burst_capacity}")]
    CostExceedsBurst {
        /// The requested cost.
        cost: u64,
        /// The policy's burst capacity.
        burst_capacity: u64,
    },
    /// The stored state is outside every range the evaluator can produce (corrupted storage).
    #[error("stored theoretical arrival time is out of range")]
    StateOutOfRange,
}

/// The unsigned integer widths the evaluator computes in: `u64` first (every realistic policy
/// and clock fits it, and its multiplications and divisions are single instructions), `u128`
/// when an intermediate does not fit 64 bits (a `u128` division is a library call). One set of
/// formulas, [`compute`], instantiated for both, so the two widths cannot disagree.
trait Width: Copy + Ord + std::ops::Sub<Output = Self> {
    fn of(value: u64) -> Self;
    fn of_scaled(value: u128) -> Option<Self>;
    fn scaled(self) -> u128;
    fn to_u64(self) -> Option<u64>;
    fn checked_add(self, other: Self) -> Option<Self>;
    fn checked_mul(self, other: Self) -> Option<Self>;
    fn saturating_sub(self, other: Self) -> Self;
    /// `self / divisor` (a divisor of at least 1: no division-by-zero path).
    fn over(self, divisor: Divisor) -> Self;
    /// `⌈self / divisor⌉`.
    fn over_ceil(self, divisor: Divisor) -> Self;
}

/// `value` as a `NonZeroU64`; every Q and P is at least 1 (validated), so 1 is never used.
#[inline(always)]
fn non_zero(value: u64) -> std::num::NonZeroU64 {
    std::num::NonZeroU64::new(value).unwrap_or(std::num::NonZeroU64::MIN)
}

/// A divisor of the evaluation, Q or P: its value and its strength-reduced form.
#[derive(Clone, Copy)]
struct Divisor {
    value: std::num::NonZeroU64,
    reduced: DividerU64,
}

impl GcraParameters {
    /// Q as a divisor.
    #[inline(always)]
    fn quota_divisor(&self) -> Divisor {
        Divisor { value: non_zero(self.quota.get()), reduced: self.quota_divisor }
    }

    /// P as a divisor.
    #[inline(always)]
    fn period_divisor(&self) -> Divisor {
        Divisor { value: non_zero(self.period.as_millis()), reduced: self.period_divisor }
    }
}

/// One body for both widths' conversions, through `From`/`TryFrom` (identities where the types
/// agree); `$over` and `$over_ceil` divide.
macro_rules! width {
    ($width:ty, |$x:ident, $d:ident| $over:expr, $over_ceil:expr) => {
        impl Width for $width {
            #[inline(always)]
            fn of(value: u64) -> Self {
                Self::from(value)
            }
            #[inline(always)]
            fn of_scaled(value: u128) -> Option<Self> {
                Self::try_from(value).ok()
            }
            #[inline(always)]
            fn scaled(self) -> u128 {
                u128::from(self)
            }
            #[inline(always)]
            fn to_u64(self) -> Option<u64> {
                u64::try_from(self).ok()
            }
            #[inline(always)]
            fn checked_add(self, other: Self) -> Option<Self> {
                self.checked_add(other)
            }
            #[inline(always)]
            fn checked_mul(self, other: Self) -> Option<Self> {
                self.checked_mul(other)
            }
            #[inline(always)]
            fn saturating_sub(self, other: Self) -> Self {
                self.saturating_sub(other)
            }
            #[inline(always)]
            fn over(self, divisor: Divisor) -> Self {
                let ($x, $d) = (self, divisor);
                $over
            }
            #[inline(always)]
            fn over_ceil(self, divisor: Divisor) -> Self {
                let ($x, $d) = (self, divisor);
                $over_ceil
            }
        }
    };
}

// 64 bits: by the strength-reduced divisor.
width!(u64, |x, d| d.reduced.divide(x), {
    let quotient = d.reduced.divide(x);
    // quotient × d ≤ x: no overflow.
    quotient + u64::from(x - quotient * d.value.get() != 0)
});
// 128 bits: by the plain divisor (a library call; only for values beyond 64 bits).
width!(u128, |x, d| x / std::num::NonZeroU128::from(d.value), x.div_ceil(u128::from(d.value.get())));

/// The formulas of the [module documentation](self) in width `W`, for a validated cost
/// (`1 ≤ cost ≤ B`). `None` when an intermediate or a reported value does not fit `W` (or a
/// reported duration does not fit `u64`): the caller retries wider, or reports
/// [`GcraError::StateOutOfRange`] from `u128`.
#[inline(always)]
fn compute<W: Width>(
    parameters: &GcraParameters,
    tat: Option<TheoreticalArrivalTime>,
    now_millis: u64,
    cost: u64,
) -> Option<GcraOutcome> {
    let quota = W::of(parameters.quota.get());
    let period = W::of(parameters.period.as_millis());
    let burst = W::of(parameters.burst.get());
    let now_s = W::of(now_millis).checked_mul(quota)?;
    let ceiling = now_s.checked_add(burst.checked_mul(period)?)?;
    let base = match tat {
        Some(tat) => W::of_scaled(tat.0)?.max(now_s),
        None => now_s,
    };
    let cand = base.checked_add(W::of(cost).checked_mul(period)?)?;
    if cand <= ceiling {
        // remaining < B because cand − now_s ≥ cost·P ≥ P, so nothing below can underflow.
        let remaining = (ceiling - cand).over(parameters.period_divisor());
        let ahead = cand - now_s;
        let replenish = ahead.over_ceil(parameters.quota_divisor()).to_u64()?;
        let untouched = (burst - remaining).saturating_sub(W::of(1)).checked_mul(period).unwrap_or(ahead);
        // next unit ≤ replenish, so it fits whenever replenish does.
        let next_unit = ahead
            .saturating_sub(untouched)
            .over_ceil(parameters.quota_divisor())
            .to_u64()
            .unwrap_or(replenish);
        Some(GcraOutcome::Allowed {
            tat: TheoreticalArrivalTime(cand.scaled()),
            remaining: remaining.to_u64()?,
            replenish_after_millis: replenish,
            next_unit_after_millis: next_unit,
        })
    } else {
        let retry_after = (cand - ceiling).over_ceil(parameters.quota_divisor()).to_u64()?;
        let available = ceiling.saturating_sub(base).over(parameters.period_divisor()).to_u64()?;
        Some(GcraOutcome::Denied { retry_after_millis: retry_after, available })
    }
}

/// Evaluates a request of `cost` units at `now_millis` against the stored `tat`
/// (`None`: no state, fully rested).
///
/// Pure and exact; see the [module documentation](self) for the formulas and rounding.
/// Clock readings earlier than the stored state are safe: `max(tat, now)` never refills early.
/// Computed in 64-bit integers when every intermediate fits (every realistic policy and
/// clock), else in 128-bit integers: the same formulas, so the same answer.
///
/// # Errors
///
/// [`GcraError::ZeroCost`] for `cost == 0`; [`GcraError::CostExceedsBurst`] for
/// `cost > B`; [`GcraError::StateOutOfRange`] when `tat` is so far in the future that the
/// arithmetic or a reported duration would overflow.
#[inline]
pub fn evaluate(
    parameters: &GcraParameters,
    tat: Option<TheoreticalArrivalTime>,
    now_millis: u64,
    cost: u64,
) -> Result<GcraOutcome, GcraError> {
    let burst = parameters.burst.get();
    if cost == 0 {
        return Err(GcraError::ZeroCost);
    }
    if cost > burst {
        return Err(GcraError::CostExceedsBurst { cost, burst_capacity: burst });
    }
    match compute::<u64>(parameters, tat, now_millis, cost) {
        Some(outcome) => Ok(outcome),
        None => wide(parameters, tat, now_millis, cost),
    }
}

/// The subject's quota at `now_millis` without consuming anything: what a peek reports.
///
/// With every instant scaled by Q (`now_s = now × Q`), `base = max(tat, now_s)` and `ahead =
/// base − now_s` (how far the subject is from fully rested):
///
/// ```text
/// ahead = 0:  full: B available, nothing to replenish
/// otherwise:  room = max(B·P − ahead, 0)
///             available         = ⌊room / P⌋                           units spendable now
///             next_unit_after   = ⌈((available + 1)·P − room) / Q⌉ ms   one more is spendable
///                                 (ahead > B·P, a state left by a larger policy:
///                                  ⌈(ahead − B·P + P) / Q⌉ ms)
///             replenishes_after = ⌈ahead / Q⌉ ms                       fully rested
/// ```
///
/// A check of cost `c` fits exactly when `c·P ≤ room`, that is `c ≤ available`, so
/// [`would_allow(c)`](QuotaSnapshot::would_allow) is [`evaluate`]'s answer at the same instant;
/// for an empty quota, `next_unit_after` is the `retry_after` of a cost-1 check. Computed in
/// 128-bit integers (a peek is not on the admission path).
///
/// # Errors
///
/// [`GcraError::StateOutOfRange`] when `tat` is so far in the future that a duration does not
/// fit `u64` milliseconds.
pub fn peek(
    parameters: &GcraParameters,
    tat: Option<TheoreticalArrivalTime>,
    now_millis: u64,
) -> Result<QuotaSnapshot, GcraError> {
    let quota = u128::from(parameters.quota.get());
    let period = u128::from(parameters.period.as_millis());
    let burst = parameters.burst;
    // Q < 2⁶³ and now < 2⁶⁴; B < 2⁶³ and P < 2⁵⁴: both products fit u128.
    let now_s = u128::from(now_millis) * quota;
    let ahead = tat.map_or(0, |tat| tat.0.saturating_sub(now_s));
    if ahead == 0 {
        return Ok(QuotaSnapshot::full(burst));
    }
    let capacity = u128::from(burst.get()) * period;
    let room = capacity.saturating_sub(ahead);
    let available = room / period;
    let millis = |scaled: u128| u64::try_from(scaled.div_ceil(quota)).ok().map(Delay::from_millis);
    // The next unit fits once ahead + P ≤ B·P: within the burst that is (available + 1)·P − room
    // away; beyond it (a state from a larger policy), ahead − B·P + P.
    let next_unit = if ahead > capacity {
        (ahead - capacity).checked_add(period)
    } else {
        (available + 1).checked_mul(period).map(|unit| unit - room)
    }
    .and_then(millis)
    .ok_or(GcraError::StateOutOfRange)?;
    let replenishes = millis(ahead).ok_or(GcraError::StateOutOfRange)?;
    let available = u64::try_from(available).map_err(|_| GcraError::StateOutOfRange)?;
    QuotaSnapshot::new(burst, available, Some(next_unit), replenishes).map_err(|_| GcraError::StateOutOfRange)
}

/// A theoretical arrival time rounded up to whole milliseconds, with the scaled units the
/// rounding added: `tat = expires_at_millis × Q − deficit`. The form a store keeps when it
/// wants the expiry (⌈tat / Q⌉, see [`TheoreticalArrivalTime::expires_at_millis`]) at hand
/// without dividing; [`evaluate_allowed_rounded`] reads and writes it. A state the evaluator
/// produced has `deficit < Q`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RoundedArrivalTime {
    /// ⌈tat / Q⌉: the first whole millisecond at which the state is equivalent to no state.
    pub expires_at_millis: u64,
    /// `expires_at_millis × Q − tat`, in scaled units (milliseconds × Q).
    pub deficit: u64,
}

/// The common case of [`evaluate`], for a store that keeps [`RoundedArrivalTime`]s: a request
/// that is allowed, on a state and clock for which every intermediate fits 64 bits. Returns
/// the allowance (burst capacity, units remaining rounded down, milliseconds until fully
/// rested rounded up) and the arrival time to store, exactly what [`evaluate`] answers for the
/// same inputs (tested against it).
///
/// `None` when it does not decide: the request is denied, its cost is 0 or above the burst
/// capacity, `stored` does not describe a time (`deficit` above `expires_at_millis × Q`), or
/// the clock or the stored time is too large for the 64-bit shortcut: from
/// `⌊(2⁶⁴ − 1 − B·P) / Q⌋` milliseconds on, counted on the store's clock (for a quota Q of
/// 100 about 5.8 million years; of 10⁹, about 213 days; on a clock counting Unix-epoch
/// milliseconds, at once for Q above about 10⁷). The caller then calls [`evaluate`], which
/// decides every case, errors included, the same way but slower.
///
/// Why a second entry point: an allowed check is the hot path of an in-memory store, and
/// [`evaluate`] computes more than it needs (the next unit's delay, 128-bit checks of the
/// stored state) and rebuilds the arrival time through 128-bit products; this computes the
/// two divisions an allowance needs and no others.
#[inline(always)]
#[must_use]
pub fn evaluate_allowed_rounded(
    parameters: &GcraParameters,
    stored: Option<RoundedArrivalTime>,
    now_millis: u64,
    cost: u64,
) -> Option<(Allowance, RoundedArrivalTime)> {
    let quota = parameters.quota.get();
    // Below the limit, `millis × Q + B·P` fits 64 bits (see `GcraParameters::new`).
    let limit = parameters.shortcut_limit_millis;
    if now_millis >= limit || cost == 0 || cost > parameters.burst.get() {
        return None;
    }
    let now_s = now_millis * quota;
    let base = match stored {
        Some(stored) if stored.expires_at_millis < limit => {
            (stored.expires_at_millis * quota).checked_sub(stored.deficit)?.max(now_s)
        }
        Some(_) => return None,
        None => now_s,
    };
    // base ≤ 2⁶⁴ − 1 − B·P and cost·P ≤ B·P: no overflow.
    let ahead = base - now_s + cost * parameters.period.as_millis();
    let capacity = parameters.capacity_scaled;
    if ahead > capacity {
        return None;
    }
    let remaining = parameters.period_divisor.divide(capacity - ahead);
    let whole = parameters.quota_divisor.divide(ahead);
    // whole × Q ≤ ahead: no overflow.
    let rest = ahead - whole * quota;
    let replenish = whole + u64::from(rest != 0);
    // expires × Q − tat = (now + ⌈ahead / Q⌉) × Q − (now_s + ahead) = Q − rest, or 0.
    let deficit = if rest == 0 { 0 } else { quota - rest };
    let allowance = Allowance::exact(parameters.burst, remaining, Delay::from_millis(replenish));
    Some((allowance, RoundedArrivalTime { expires_at_millis: now_millis + replenish, deficit }))
}

/// [`compute`] in `u128`, out of line: only policies or states beyond 64 bits get here.
#[cold]
#[inline(never)]
fn wide(
    parameters: &GcraParameters,
    tat: Option<TheoreticalArrivalTime>,
    now_millis: u64,
    cost: u64,
) -> Result<GcraOutcome, GcraError> {
    compute::<u128>(parameters, tat, now_millis, cost).ok_or(GcraError::StateOutOfRange)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{MAX_LIMIT, MAX_WINDOW};
    use std::time::Duration;

    fn params(q: u64, p_ms: u64, b: u64) -> GcraParameters {
        GcraParameters::new(
            Capacity::new(q).unwrap(),
            QuotaPeriod::new(Duration::from_millis(p_ms)).unwrap(),
            Capacity::new(b).unwrap(),
        )
        .unwrap()
    }

    /// Steps (time, cost) → expected; `Ok((remaining, replenish))` or `Err((retry, available))`.
    type Step = (u64, u64, Result<(u64, u64), (u64, u64)>);

    fn run(p: &GcraParameters, steps: &[Step]) {
        let mut tat = None;
        for (i, &(now, cost, expected)) in steps.iter().enumerate() {
            let outcome = evaluate(p, tat, now, cost).unwrap();
            match (outcome, expected) {
                (GcraOutcome::Allowed { tat: t, remaining, replenish_after_millis, .. }, Ok(want)) => {
                    assert_eq!((remaining, replenish_after_millis), want, "step {i}");
                    tat = Some(t);
                }
                (GcraOutcome::Denied { retry_after_millis, available }, Err(want)) => {
                    assert_eq!((retry_after_millis, available), want, "step {i}");
                }
                (got, want) => panic!("step {i}: got {got:?}, want {want:?}"),
            }
        }
    }

    #[test]
    fn vector_v1() {
        let p = params(10, 1000, 20);
        let mut steps: Vec<_> = (0..20).map(|i| (0, 1, Ok((19 - i, 100 * (i + 1))))).collect();
        steps.extend([
            (0, 1, Err((100, 0))),
            (100, 1, Ok((0, 2000))),
            (150, 1, Err((50, 0))),
            (199, 1, Err((1, 0))),
            (200, 1, Ok((0, 2000))),
            (3000, 1, Ok((19, 100))),
        ]);
        run(&p, &steps);
        // After the 5th hit at t=0: remaining 15, next unit 100 ms, full in 500 ms.
        let mut tat = None;
        let mut last = None;
        for _ in 0..5 {
            let o = evaluate(&p, tat, 0, 1).unwrap();
            if let GcraOutcome::Allowed { tat: t, .. } = o {
                tat = Some(t);
            }
            last = Some(o);
        }
        assert_eq!(
            last,
            Some(GcraOutcome::Allowed {
                tat: TheoreticalArrivalTime(5000),
                remaining: 15,
                replenish_after_millis: 500,
                next_unit_after_millis: 100
            })
        );
    }

    #[test]
    fn vector_v2() {
        let p = params(3, 1000, 2);
        run(
            &p,
            &[
                (0, 1, Ok((1, 334))),
                (0, 1, Ok((0, 667))),
                (0, 1, Err((334, 0))),
                (333, 1, Err((1, 0))),
                (334, 1, Ok((0, 666))),
                (667, 1, Ok((0, 667))),
                (1000, 1, Ok((0, 667))),
                (5000, 1, Ok((1, 334))),
            ],
        );
        let t = TheoreticalArrivalTime(2000);
        assert_eq!(t.expires_at_millis(&p), 667);
        assert_eq!(t.to_parts(&p), Some((666, 2)));
        assert_eq!(TheoreticalArrivalTime::from_parts(666, 2, &p), Some(t));
        assert_eq!(TheoreticalArrivalTime::from_parts(666, 3, &p), None);
    }

    #[test]
    fn vector_v3() {
        run(
            &params(1, 60_000, 1),
            &[
                (0, 1, Ok((0, 60_000))),
                (1, 1, Err((59_999, 0))),
                (59_999, 1, Err((1, 0))),
                (60_000, 1, Ok((0, 60_000))),
                (60_000, 1, Err((60_000, 0))),
            ],
        );
    }

    #[test]
    fn vector_v4_weighted() {
        let p = params(5, 1000, 5);
        run(
            &p,
            &[(0, 3, Ok((2, 600))), (0, 3, Err((200, 2))), (199, 3, Err((1, 2))), (200, 3, Ok((0, 1000)))],
        );
        assert_eq!(
            evaluate(&p, None, 200, 6),
            Err(GcraError::CostExceedsBurst { cost: 6, burst_capacity: 5 })
        );
        assert_eq!(evaluate(&p, None, 200, 0), Err(GcraError::ZeroCost));
    }

    #[test]
    fn vector_v5() {
        run(
            &params(2, 1000, 4),
            &[
                (0, 1, Ok((3, 500))),
                (0, 1, Ok((2, 1000))),
                (0, 1, Ok((1, 1500))),
                (0, 1, Ok((0, 2000))),
                (0, 1, Err((500, 0))),
                (250, 1, Err((250, 0))),
                (499, 1, Err((1, 0))),
                (500, 1, Ok((0, 2000))),
                (1250, 1, Ok((0, 1750))),
                (2000, 1, Ok((1, 1500))),
                (2001, 1, Ok((0, 1999))),
            ],
        );
    }

    proptest::proptest! {
        /// The 64-bit fast path and the 128-bit path are the same formulas: wherever the
        /// fast path answers, the wide one answers the same.
        #[test]
        fn both_widths_agree(
            quota in proptest::prop_oneof![1u64..=5_000, 1u64..=crate::MAX_LIMIT, proptest::strategy::Just(1u64 << 40)],
            period in proptest::prop_oneof![1u64..=86_400_000, 1u64..=crate::MAX_WINDOW_MILLIS, proptest::strategy::Just(1u64 << 32)],
            burst in proptest::prop_oneof![1u64..=5_000, 1u64..=crate::MAX_LIMIT, proptest::strategy::Just(1u64)],
            now in proptest::prop_oneof![0u64..10_000_000, 0u64..=u64::MAX >> 20, proptest::strategy::Just(u64::MAX >> 12)],
            ahead in proptest::option::of(0u128..2_000_000_000_000),
            cost_fraction in 0.0f64..1.0,
        ) {
            let Ok(p) = GcraParameters::new(
                Capacity::new(quota).unwrap(),
                QuotaPeriod::new(Duration::from_millis(period)).unwrap(),
                Capacity::new(burst).unwrap(),
            ) else { return Ok(()) };
            // Truncation intended: a cost from 1 to B.
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss, clippy::cast_precision_loss)]
            let cost = 1 + ((burst - 1) as f64 * cost_fraction) as u64;
            let tat = ahead.map(|ahead| TheoreticalArrivalTime(u128::from(now) * u128::from(quota) + ahead));
            let narrow = compute::<u64>(&p, tat, now, cost);
            let wide = compute::<u128>(&p, tat, now, cost);
            // The widths differ only in their division: check the 64-bit one against `/`.
            for divisor in [p.quota_divisor(), p.period_divisor()] {
                for x in [now, now.wrapping_mul(3), u64::MAX, u64::MAX - 1, divisor.value.get(), 0] {
                    proptest::prop_assert_eq!(x.over(divisor), x / divisor.value.get());
                    proptest::prop_assert_eq!(x.over_ceil(divisor), x.div_ceil(divisor.value.get()));
                }
            }
            if let Some(narrow) = narrow {
                proptest::prop_assert_eq!(Some(narrow), wide);
            }
            proptest::prop_assert_eq!(evaluate(&p, tat, now, cost).ok(), wide);
        }
    }

    proptest::proptest! {
        /// The 64-bit divisions (by the `fastdivide` reciprocal) against the hardware's, for
        /// every divisor a policy can have and any numerator, rounding down and up.
        #[test]
        fn the_64_bit_divisions_are_exact(
            divisor in proptest::prop_oneof![
                1u64..=64,
                1u64..=crate::MAX_LIMIT,
                proptest::strategy::Strategy::prop_map(0u32..63, |shift| 1u64 << shift),
                proptest::strategy::Strategy::prop_map(1u32..63, |shift| (1u64 << shift) - 1),
                proptest::strategy::Strategy::prop_map(1u32..63, |shift| (1u64 << shift) + 1),
            ],
            numerator in proptest::prop_oneof![proptest::num::u64::ANY, 0u64..1_000_000, proptest::strategy::Just(u64::MAX)],
        ) {
            let divisor = Divisor { value: non_zero(divisor), reduced: DividerU64::divide_by(divisor) };
            let exact = numerator / divisor.value.get();
            proptest::prop_assert_eq!(numerator.over(divisor), exact);
            proptest::prop_assert_eq!(numerator.over_ceil(divisor), numerator.div_ceil(divisor.value.get()));
            for near in [exact.saturating_mul(divisor.value.get()), numerator.saturating_sub(1)] {
                proptest::prop_assert_eq!(near.over(divisor), near / divisor.value.get());
            }
        }
    }

    /// The rounded form of an arrival time, `None` beyond `u64` milliseconds.
    fn rounded(tat: TheoreticalArrivalTime, p: &GcraParameters) -> Option<RoundedArrivalTime> {
        let quota = u128::from(p.quota.get());
        let expires_at_millis = u64::try_from(tat.0.div_ceil(quota)).ok()?;
        let deficit = u64::try_from(u128::from(expires_at_millis) * quota - tat.0).ok()?;
        Some(RoundedArrivalTime { expires_at_millis, deficit })
    }

    proptest::proptest! {
        /// Wherever the shortcut answers, it answers what `evaluate` does; and it answers
        /// every allowed request of a realistic policy and clock.
        #[test]
        fn the_allowed_shortcut_agrees_with_evaluate(
            quota in proptest::prop_oneof![1u64..=5_000, 1u64..=crate::MAX_LIMIT, proptest::strategy::Just(1u64 << 40)],
            period in proptest::prop_oneof![1u64..=86_400_000, 1u64..=crate::MAX_WINDOW_MILLIS, proptest::strategy::Just(1u64 << 32)],
            burst in proptest::prop_oneof![1u64..=5_000, 1u64..=crate::MAX_LIMIT, proptest::strategy::Just(1u64)],
            now in proptest::prop_oneof![0u64..10_000_000_000_000, 0u64..=u64::MAX >> 20, proptest::strategy::Just(u64::MAX >> 12), proptest::strategy::Just(u64::MAX)],
            ahead in proptest::option::of(proptest::prop_oneof![0u128..2_000_000_000_000, 0u128..=u128::from(u64::MAX)]),
            cost in proptest::prop_oneof![proptest::strategy::Just(0u64), 1u64..=3, 1u64..=u64::MAX],
            corrupt_deficit in proptest::option::of(0u64..=u64::MAX),
            aligned in proptest::option::of((0u128..3_000, 0u128..=2)),
        ) {
            let Ok(p) = GcraParameters::new(
                Capacity::new(quota).unwrap(),
                QuotaPeriod::new(Duration::from_millis(period)).unwrap(),
                Capacity::new(burst).unwrap(),
            ) else { return Ok(()) };
            // Also states a whole number of emission intervals ahead, give or take one scaled
            // unit: where each rounding changes its answer.
            let ahead = match aligned {
                Some((units, shift)) => ahead.map(|_| (units * u128::from(period) + shift).saturating_sub(1)),
                None => ahead,
            };
            let mut tat = ahead.map(|ahead| TheoreticalArrivalTime(u128::from(now) * u128::from(quota) + ahead));
            let mut stored = match tat {
                Some(tat) => match rounded(tat, &p) {
                    Some(stored) => Some(stored),
                    None => return Ok(()),
                },
                None => None,
            };
            if let (Some(state), Some(deficit)) = (stored.as_mut(), corrupt_deficit) {
                // A state no evaluator wrote: the shortcut and `evaluate` on the same time.
                state.deficit = deficit;
                tat = (u128::from(state.expires_at_millis) * u128::from(quota))
                    .checked_sub(u128::from(deficit))
                    .map(TheoreticalArrivalTime);
                if tat.is_none() {
                    proptest::prop_assert_eq!(evaluate_allowed_rounded(&p, stored, now, cost), None);
                    return Ok(());
                }
            }
            let shortcut = evaluate_allowed_rounded(&p, stored, now, cost);
            let general = evaluate(&p, tat, now, cost);
            match (shortcut, &general) {
                (Some((allowance, next)), Ok(outcome @ GcraOutcome::Allowed { tat: written, .. })) => {
                    proptest::prop_assert_eq!(Some(allowance), outcome.allowance(&p));
                    proptest::prop_assert_eq!(Some(next), rounded(*written, &p));
                }
                (Some(answer), _) => proptest::prop_assert!(false, "shortcut {:?}, evaluate {:?}", answer, general),
                (None, Ok(GcraOutcome::Allowed { .. })) => {
                    // Only beyond the 64-bit range.
                    let in_range = u128::from(burst) * u128::from(period) <= u128::from(u64::MAX)
                        && now < p.shortcut_limit_millis
                        && stored.is_none_or(|stored| stored.expires_at_millis < p.shortcut_limit_millis);
                    proptest::prop_assert!(!in_range, "an allowed request in range was not decided");
                }
                (None, _) => {}
            }
        }
    }

    fn try_params(q: u64, p_ms: u64, b: u64) -> Option<GcraParameters> {
        GcraParameters::new(
            Capacity::new(q).ok()?,
            QuotaPeriod::new(Duration::from_millis(p_ms)).ok()?,
            Capacity::new(b).ok()?,
        )
        .ok()
    }

    fn around(values: &[u64]) -> Vec<u64> {
        let mut out = Vec::new();
        for &v in values {
            for d in [-2i64, -1, 0, 1, 2] {
                if let Some(x) = v.checked_add_signed(d) {
                    out.push(x);
                }
            }
        }
        out.sort_unstable();
        out.dedup();
        out
    }

    /// A deterministic sweep at the edges of the shortcut's 64-bit range: extreme Q, P and B;
    /// clocks and stored expiries around its limit; deficits at and beyond Q and expires × Q;
    /// costs 1 and B. Wherever the shortcut answers, `evaluate` answers the same.
    #[test]
    fn the_allowed_shortcut_agrees_with_evaluate_at_its_boundaries() {
        let qs = [1, 2, 3, 7, 1_000, 1 << 11, 1 << 20, 1 << 32, 1 << 40, 1 << 62, MAX_LIMIT];
        let ps = [1, 2, 3, 333, 1_000, 60_000, 1 << 32, MAX_WINDOW_MILLIS];
        let bs = [1, 2, 3, 20, 1 << 11, 1 << 20, 1 << 32, 1 << 52, MAX_LIMIT];
        let (mut decided, mut compared) = (0u64, 0u64);
        for q in qs {
            for p in ps {
                for b in bs {
                    let Some(par) = try_params(q, p, b) else { continue };
                    let limit = par.shortcut_limit_millis;
                    let nows = around(&[0, 1, 1_000, limit / 2, limit, u64::MAX]);
                    let costs = around(&[1, b]);
                    for &now in &nows {
                        let mut expiries = around(&[0, now, limit]);
                        let cap_ms = par.capacity_scaled / q;
                        expiries.extend(around(&[now.saturating_add(cap_ms), now.saturating_add(1)]));
                        expiries.push(u64::MAX);
                        let mut stored_options: Vec<Option<RoundedArrivalTime>> = vec![None];
                        for &e in &expiries {
                            let full = u128::from(e) * u128::from(q);
                            let mut deficits =
                                around(&[0, q, u64::try_from(full).unwrap_or(u64::MAX), u64::MAX]);
                            deficits.retain(|&d| u128::from(d) <= full + 2);
                            for d in deficits {
                                stored_options
                                    .push(Some(RoundedArrivalTime { expires_at_millis: e, deficit: d }));
                            }
                        }
                        for &stored in &stored_options {
                            let tat = match stored {
                                Some(s) => match (u128::from(s.expires_at_millis) * u128::from(q))
                                    .checked_sub(u128::from(s.deficit))
                                {
                                    Some(t) => Some(TheoreticalArrivalTime(t)),
                                    None => {
                                        for &cost in &costs {
                                            assert_eq!(
                                                evaluate_allowed_rounded(&par, stored, now, cost),
                                                None
                                            );
                                        }
                                        continue;
                                    }
                                },
                                None => None,
                            };
                            for &cost in &costs {
                                compared += 1;
                                let shortcut = evaluate_allowed_rounded(&par, stored, now, cost);
                                let general = evaluate(&par, tat, now, cost);
                                let Some((allowance, next)) = shortcut else { continue };
                                decided += 1;
                                let Ok(outcome @ GcraOutcome::Allowed { tat: written, .. }) = general else {
                                    panic!(
                                        "q {q} p {p} b {b} now {now} {stored:?} cost {cost}: shortcut {shortcut:?}, evaluate {general:?}"
                                    );
                                };
                                assert_eq!(
                                    Some(allowance),
                                    outcome.allowance(&par),
                                    "q {q} p {p} b {b} now {now} {stored:?} cost {cost}"
                                );
                                let expires = u64::try_from(written.0.div_ceil(u128::from(q))).unwrap();
                                let deficit =
                                    u64::try_from(u128::from(expires) * u128::from(q) - written.0).unwrap();
                                assert_eq!(
                                    next,
                                    RoundedArrivalTime { expires_at_millis: expires, deficit },
                                    "q {q} p {p} b {b} now {now} {stored:?} cost {cost}"
                                );
                            }
                        }
                    }
                }
            }
        }
        assert!(decided > 10_000, "{decided} of {compared}");
    }

    #[test]
    fn the_allowed_shortcut_on_reference_vector_v2() {
        // Q = 3 per 1,000 ms, B = 2: the scaled emission interval is 1,000.
        let p = params(3, 1_000, 2);
        let (allowance, first) = evaluate_allowed_rounded(&p, None, 0, 1).unwrap();
        // tat 1,000 scaled = 333⅓ ms: rounded up to 334 ms, 2 scaled units added.
        assert_eq!((allowance.available(), allowance.replenishes_after()), (1, Delay::from_millis(334)));
        assert_eq!(first, RoundedArrivalTime { expires_at_millis: 334, deficit: 2 });
        let (allowance, second) = evaluate_allowed_rounded(&p, Some(first), 0, 1).unwrap();
        assert_eq!((allowance.available(), allowance.replenishes_after()), (0, Delay::from_millis(667)));
        assert_eq!(second, RoundedArrivalTime { expires_at_millis: 667, deficit: 1 });
        // Denied at 333 ms (retry 1 ms later): the shortcut leaves it to `evaluate`.
        assert_eq!(evaluate_allowed_rounded(&p, Some(second), 333, 1), None);
        let (_, third) = evaluate_allowed_rounded(&p, Some(second), 334, 1).unwrap();
        assert_eq!(third, RoundedArrivalTime { expires_at_millis: 1_000, deficit: 0 });
        assert_eq!(evaluate_allowed_rounded(&p, None, 0, 0), None);
        assert_eq!(evaluate_allowed_rounded(&p, None, 0, 3), None);
        assert_eq!(evaluate_allowed_rounded(&p, None, u64::MAX, 1), None);
    }

    #[test]
    fn extremes_do_not_overflow() {
        let p = GcraParameters::new(
            Capacity::new(MAX_LIMIT).unwrap(),
            QuotaPeriod::new(MAX_WINDOW).unwrap(),
            Capacity::new(MAX_LIMIT).unwrap(),
        )
        .unwrap();
        let first = evaluate(&p, None, u64::MAX, MAX_LIMIT).unwrap();
        let GcraOutcome::Allowed { tat, remaining, replenish_after_millis, .. } = first else { panic!() };
        assert_eq!((remaining, replenish_after_millis), (0, crate::MAX_WINDOW_MILLIS));
        let again = evaluate(&p, Some(tat), u64::MAX, 1).unwrap();
        assert_eq!(again, GcraOutcome::Denied { retry_after_millis: 1, available: 0 });
        // V6: now_s beyond u64.
        let v6 = params(u64::try_from(i64::MAX).unwrap(), 1, u64::try_from(i64::MAX).unwrap());
        assert!(matches!(evaluate(&v6, None, 1_800_000_000_000, 1), Ok(GcraOutcome::Allowed { .. })));
        assert_eq!(
            evaluate(&p, Some(TheoreticalArrivalTime(u128::MAX)), 0, 1),
            Err(GcraError::StateOutOfRange)
        );
    }

    #[test]
    fn peek_reports_the_exact_state_and_agrees_with_evaluate() {
        // Q = 10 per 1,000 ms, B = 5: scaled P = 1,000, B·P = 5,000.
        let p = params(10, 1_000, 5);
        let burst = Capacity::new(5).unwrap();
        assert_eq!(peek(&p, None, 7), Ok(QuotaSnapshot::full(burst)));
        // tat 3,000 at 0: ahead 3,000, room 2,000 → 2 available; next unit ⌈1,000/10⌉ = 100
        // ms, rested after 300.
        let tat = TheoreticalArrivalTime(3_000);
        let ms = Delay::from_millis;
        assert_eq!(peek(&p, Some(tat), 0), Ok(QuotaSnapshot::new(burst, 2, Some(ms(100)), ms(300)).unwrap()));
        // At 25 ms: ahead 2,750, room 2,250 → 2; next ⌈750/10⌉ = 75; rested ⌈2,750/10⌉ = 275.
        assert_eq!(peek(&p, Some(tat), 25), Ok(QuotaSnapshot::new(burst, 2, Some(ms(75)), ms(275)).unwrap()));
        assert_eq!(peek(&p, Some(tat), 300), Ok(QuotaSnapshot::full(burst)));
        // A state beyond the burst (ahead 7,000 > 5,000): nothing available, and the next unit
        // is the retry of a cost-1 check: ⌈(1,000 + 2,000)/10⌉ = 300.
        let beyond = TheoreticalArrivalTime(7_000);
        assert_eq!(
            peek(&p, Some(beyond), 0),
            Ok(QuotaSnapshot::new(burst, 0, Some(ms(300)), ms(700)).unwrap())
        );
        assert_eq!(peek(&p, Some(TheoreticalArrivalTime(u128::MAX)), 0), Err(GcraError::StateOutOfRange));
        // Against the evaluator, on a grid of states, instants and costs.
        for tat in [None, Some(tat), Some(beyond), Some(TheoreticalArrivalTime(4_999))] {
            for now in [0, 1, 99, 100, 250, 299, 300, 700] {
                let snapshot = peek(&p, tat, now).unwrap();
                for cost in 1..=5 {
                    let allowed = matches!(evaluate(&p, tat, now, cost), Ok(GcraOutcome::Allowed { .. }));
                    assert_eq!(snapshot.would_allow(cost), allowed, "cost {cost}, {tat:?} at {now}");
                }
                match evaluate(&p, tat, now, 1).unwrap() {
                    GcraOutcome::Denied { retry_after_millis, available } => {
                        assert_eq!(snapshot.next_unit_after(), Some(ms(retry_after_millis)));
                        assert_eq!(snapshot.available(), available);
                    }
                    GcraOutcome::Allowed { remaining, .. } => assert_eq!(snapshot.available(), remaining + 1),
                }
            }
        }
    }

    #[test]
    fn peek_never_overflows_at_the_bounds() {
        let p = params(MAX_LIMIT, MAX_WINDOW_MILLIS, MAX_LIMIT);
        let first = evaluate(&p, None, u64::MAX, MAX_LIMIT).unwrap();
        let GcraOutcome::Allowed { tat, .. } = first else { panic!() };
        let snapshot = peek(&p, Some(tat), u64::MAX).unwrap();
        assert_eq!(snapshot.available(), 0);
        assert_eq!(snapshot.replenishes_after(), Delay::from_millis(MAX_WINDOW_MILLIS));
        assert_eq!(snapshot.next_unit_after(), Some(Delay::from_millis(1)));
    }
}
