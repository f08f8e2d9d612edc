//! Validated policies and the value types they are built from.

use std::{fmt, time::Duration};

use sha2::{Digest, Sha256};

use crate::id::{PolicyId, ScopeId};

/// The largest quota, limit or burst capacity any policy accepts: `i64::MAX`
/// (9,223,372,036,854,775,807) units.
///
/// Chosen so every core-valid count fits PostgreSQL's `bigint` and the scaled GCRA
/// arithmetic of [`backend::gcra`](crate::backend::gcra) fits `u128` for every `u64`
/// millisecond clock reading (the largest intermediate, `now × Q + 2·B·P`, stays below 2¹²⁸).
/// Backends rely on it instead of re-checking.
pub const MAX_LIMIT: u64 = 9_223_372_036_854_775_807;

/// The longest window or period any policy accepts: ⌊2⁵³ / 1000⌋ = 9,007,199,254,740
/// whole milliseconds (about 285 years).
///
/// Every valid period is an exact whole number of milliseconds no longer than this, so its
/// microsecond count is exactly representable in an `f64` and its millisecond count in a
/// PostgreSQL `bigint`.
pub const MAX_WINDOW: Duration = Duration::from_millis(MAX_WINDOW_MILLIS);

/// [`MAX_WINDOW`] in milliseconds.
pub const MAX_WINDOW_MILLIS: u64 = 9_007_199_254_740;

/// Why a policy parameter was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PolicyError {
    /// A count (limit, quota, burst capacity) was zero.
    #[error("{parameter} must be at least 1")]
    Zero {
        /// The parameter's name, such as `"limit"` or `"burst capacity"`.
        parameter: &'static str,
    },
    /// A count exceeded [`MAX_LIMIT`].
    #[error("{parameter} is {value}, above the maximum of {maximum}")]
    TooLarge {
        /// The parameter's name.
        parameter: &'static str,
        /// The rejected value.
        value: u64,
        /// [`MAX_LIMIT`].
        maximum: u64,
    },
    /// A duration was zero.
    #[error("{parameter} must be at least 1 millisecond")]
    ZeroDuration {
        /// The parameter's name, such as `"window"` or `"period"`.
        parameter: &'static str,
    },
    /// A duration had a sub-millisecond part. Runlimit never truncates a period.
    #[error("{parameter} is not a whole number of milliseconds")]
    NotWholeMilliseconds {
        /// The parameter's name.
        parameter: &'static str,
    },
    /// A duration exceeded [`MAX_WINDOW`].
    #[error("{parameter} exceeds the maximum of {maximum_millis} milliseconds")]
    DurationTooLong {
        /// The parameter's name.
        parameter: &'static str,
        /// [`MAX_WINDOW_MILLIS`].
        maximum_millis: u64,
    },
    /// A GCRA policy's full replenishment time, ⌈burst × period / quota⌉ milliseconds,
    /// exceeded [`MAX_WINDOW`], so its delays could not be reported.
    #[error("full replenishment takes {millis} milliseconds, above the maximum of {maximum_millis}")]
    ReplenishmentTooLong {
        /// The rejected full replenishment time in milliseconds.
        millis: u128,
        /// [`MAX_WINDOW_MILLIS`].
        maximum_millis: u64,
    },
    /// Two durations of an [`AttemptPolicy`](crate::attempts::AttemptPolicy) were in the
    /// wrong order.
    #[error("{larger} must be at least {smaller}")]
    DurationOrder {
        /// The parameter that must be the larger one.
        larger: &'static str,
        /// The parameter it must not be shorter than.
        smaller: &'static str,
    },
}

/// A validated quota, limit or burst capacity: between 1 and [`MAX_LIMIT`] units.
///
/// Built once by a policy constructor and trusted downstream, so a backend or an HTTP
/// encoder never sees a zero or oversized count.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Capacity(u64);

impl Capacity {
    /// Validates a count of units.
    ///
    /// # Errors
    ///
    /// [`PolicyError::Zero`] for 0 and [`PolicyError::TooLarge`] above [`MAX_LIMIT`], both
    /// naming the parameter `"capacity"`.
    pub const fn new(units: u64) -> Result<Self, PolicyError> {
        Self::named("capacity", units)
    }

    pub(crate) const fn named(parameter: &'static str, units: u64) -> Result<Self, PolicyError> {
        if units == 0 {
            Err(PolicyError::Zero { parameter })
        } else if units > MAX_LIMIT {
            Err(PolicyError::TooLarge { parameter, value: units, maximum: MAX_LIMIT })
        } else {
            Ok(Self(units))
        }
    }

    /// The number of units, between 1 and [`MAX_LIMIT`].
    #[must_use]
    pub const fn get(self) -> u64 {
        self.0
    }
}

impl fmt::Display for Capacity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

/// A validated window or period: a whole number of milliseconds between 1 ms and
/// [`MAX_WINDOW`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct QuotaPeriod(u64);

impl QuotaPeriod {
    /// Validates a period.
    ///
    /// # Errors
    ///
    /// [`PolicyError::ZeroDuration`], [`PolicyError::NotWholeMilliseconds`] or
    /// [`PolicyError::DurationTooLong`], naming the parameter `"period"`.
    pub fn new(period: Duration) -> Result<Self, PolicyError> {
        Self::named("period", period)
    }

    pub(crate) fn named(parameter: &'static str, period: Duration) -> Result<Self, PolicyError> {
        if period.is_zero() {
            return Err(PolicyError::ZeroDuration { parameter });
        }
        if !period.subsec_nanos().is_multiple_of(1_000_000) {
            return Err(PolicyError::NotWholeMilliseconds { parameter });
        }
        if period > MAX_WINDOW {
            return Err(PolicyError::DurationTooLong { parameter, maximum_millis: MAX_WINDOW_MILLIS });
        }
        let millis = u64::try_from(period.as_millis())
            .map_err(|_| PolicyError::DurationTooLong { parameter, maximum_millis: MAX_WINDOW_MILLIS })?;
        Ok(Self(millis))
    }

    /// The period in whole milliseconds, between 1 and [`MAX_WINDOW_MILLIS`].
    #[must_use]
    pub const fn as_millis(self) -> u64 {
        self.0
    }

    /// The period as an exact [`Duration`].
    #[must_use]
    pub const fn duration(self) -> Duration {
        Duration::from_millis(self.0)
    }

    /// The period in whole seconds when it is an exact number of seconds, else `None`.
    ///
    /// The draft-11 `RateLimit-Policy` `w` parameter needs exact whole seconds.
    #[must_use]
    pub const fn as_whole_seconds(self) -> Option<u64> {
        if self.0.is_multiple_of(1000) { Some(self.0 / 1000) } else { None }
    }
}

/// Whether quota exhaustion is enforced or only observed.
///
/// Quota mode is deliberately excluded from the [`PolicyFingerprint`], so switching a warmed
/// shadow policy to enforcement keeps its counters. Storage-capacity denials and backend
/// errors stay fail-closed in both modes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
pub enum QuotaMode {
    /// Quota exhaustion denies the request ([`DecisionView::Denied`](crate::DecisionView::Denied)).
    #[default]
    Enforce,
    /// Quota exhaustion admits the request as
    /// [`DecisionView::ShadowDenied`](crate::DecisionView::ShadowDenied) and consumes nothing.
    Shadow,
}

/// A SHA-256 digest of every semantic parameter of a policy (its kind, identifier, scope,
/// counts and periods; never its [`QuotaMode`]).
///
/// Combined with a [`SubjectKey`](crate::SubjectKey) into a [`CounterKey`](crate::CounterKey),
/// so changing any parameter starts an independent counter instead of reinterpreting state.
///
/// # Layout
///
/// SHA-256 over the concatenation of length-prefixed fields, each an unsigned 64-bit
/// big-endian byte length followed by the bytes:
/// `"runlimit/policy-fingerprint/v1"`, the kind (`"fixed-window"`, `"gcra"` or `"attempt"`),
/// the policy id, the scope id, then every parameter as an 8-byte big-endian integer
/// (fixed window: limit, window ms; GCRA: quota, period ms, burst capacity; attempt policy:
/// initial delay, delay cap, quiet period and lease, all ms).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PolicyFingerprint([u8; 32]);

pub(crate) fn put_field(hasher: &mut impl sha2::digest::Update, bytes: &[u8]) {
    let length = u64::try_from(bytes.len()).unwrap_or(u64::MAX);
    hasher.update(&length.to_be_bytes());
    hasher.update(bytes);
}

impl PolicyFingerprint {
    /// Derives the fingerprint of a policy from its kind, identity and parameters, using
    /// the layout documented on the type. Third-party [`RateLimitPolicy`] implementations
    /// call this with a kind of their own so their fingerprints never collide with
    /// Runlimit's.
    #[must_use]
    pub fn derive(kind: &str, id: &PolicyId, scope: &ScopeId, parameters: &[u64]) -> Self {
        let mut hasher = Sha256::new();
        put_field(&mut hasher, b"runlimit/policy-fingerprint/v1");
        put_field(&mut hasher, kind.as_bytes());
        put_field(&mut hasher, id.as_str().as_bytes());
        put_field(&mut hasher, scope.as_str().as_bytes());
        for parameter in parameters {
            put_field(&mut hasher, &parameter.to_be_bytes());
        }
        Self(hasher.finalize().into())
    }

    /// The 32 digest bytes.
    #[must_use]
    pub const fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }
}

impl fmt::Debug for PolicyFingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PolicyFingerprint({self})")
    }
}

impl fmt::Display for PolicyFingerprint {
    /// Lowercase hexadecimal, 64 characters.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for byte in self.0 {
            write!(f, "{byte:02x}")?;
        }
        Ok(())
    }
}

/// What every policy tells a backend, an HTTP encoder and an observer.
///
/// Implemented by [`FixedWindowPolicy`] and [`GcraPolicy`]; a backend's
/// [`Limiter::Policy`](crate::Limiter::Policy) names which one it evaluates. Every value is
/// already validated ([`Capacity`], [`QuotaPeriod`]), so a third-party implementation cannot
/// report a zero or oversized number.
pub trait RateLimitPolicy: Send + Sync {
    /// The policy identifier.
    fn id(&self) -> &PolicyId;
    /// The scope within the policy.
    fn scope(&self) -> &ScopeId;
    /// Units granted per [`period`](Self::period): the fixed-window limit, or the GCRA quota.
    fn quota(&self) -> Capacity;
    /// The fixed window, or the GCRA period over which `quota` units replenish.
    fn period(&self) -> QuotaPeriod;
    /// The most units a rested subject may spend at once: the limit for a fixed window, the
    /// burst capacity for GCRA. Allowances and quota denials report it as their capacity.
    fn capacity(&self) -> Capacity;
    /// Enforce or shadow.
    fn quota_mode(&self) -> QuotaMode;
    /// The digest of every semantic parameter: [`PolicyFingerprint::derive`] over this
    /// policy's own [`id`](Self::id), [`scope`](Self::scope) and parameters. Backends key
    /// storage on it and observers key their per-policy state on it, so two policies share a
    /// fingerprint only when they share their identifier, scope and parameters.
    fn fingerprint(&self) -> &PolicyFingerprint;
}

/// An anchored fixed-window policy: at most `limit` allowed checks per subject within a
/// window that starts at the subject's first allowed check and lasts `window`.
///
/// Windows are not aligned to wall-clock boundaries. Denied checks consume nothing.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use runlimit_core::{FixedWindowPolicy, PolicyId, ScopeId};
///
/// let policy = FixedWindowPolicy::new(
///     PolicyId::new("auth.login")?,
///     ScopeId::new("client")?,
///     40,
///     Duration::from_secs(60),
/// )?;
/// assert_eq!(policy.limit().get(), 40);
/// assert_eq!(policy.window().as_millis(), 60_000);
/// assert!(FixedWindowPolicy::new(
///     PolicyId::new("auth.login")?,
///     ScopeId::new("client")?,
///     40,
///     Duration::from_micros(1_500),
/// ).is_err());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct FixedWindowPolicy {
    id: PolicyId,
    scope: ScopeId,
    limit: Capacity,
    window: QuotaPeriod,
    mode: QuotaMode,
    fingerprint: PolicyFingerprint,
}

impl FixedWindowPolicy {
    /// The fingerprint kind of fixed-window policies.
    pub const KIND: &'static str = "fixed-window";

    /// Validates a fixed-window policy in [`QuotaMode::Enforce`].
    ///
    /// `limit` is the number of allowed checks per window; `window` must be a whole number of
    /// milliseconds.
    ///
    /// # Errors
    ///
    /// [`PolicyError::Zero`] / [`PolicyError::TooLarge`] for `limit` outside
    /// 1..=[`MAX_LIMIT`]; [`PolicyError::ZeroDuration`],
    /// [`PolicyError::NotWholeMilliseconds`] or [`PolicyError::DurationTooLong`] for `window`.
    pub fn new(id: PolicyId, scope: ScopeId, limit: u64, window: Duration) -> Result<Self, PolicyError> {
        let limit = Capacity::named("limit", limit)?;
        let window = QuotaPeriod::named("window", window)?;
        let fingerprint =
            PolicyFingerprint::derive(Self::KIND, &id, &scope, &[limit.get(), window.as_millis()]);
        Ok(Self { id, scope, limit, window, mode: QuotaMode::Enforce, fingerprint })
    }

    /// Returns the policy with another quota mode; the fingerprint is unchanged.
    #[must_use]
    pub fn with_quota_mode(mut self, mode: QuotaMode) -> Self {
        self.mode = mode;
        self
    }

    /// Allowed checks per window.
    #[must_use]
    pub fn limit(&self) -> Capacity {
        self.limit
    }

    /// The window length.
    #[must_use]
    pub fn window(&self) -> QuotaPeriod {
        self.window
    }
}

impl RateLimitPolicy for FixedWindowPolicy {
    fn id(&self) -> &PolicyId {
        &self.id
    }
    fn scope(&self) -> &ScopeId {
        &self.scope
    }
    fn quota(&self) -> Capacity {
        self.limit
    }
    fn period(&self) -> QuotaPeriod {
        self.window
    }
    fn capacity(&self) -> Capacity {
        self.limit
    }
    fn quota_mode(&self) -> QuotaMode {
        self.mode
    }
    fn fingerprint(&self) -> &PolicyFingerprint {
        &self.fingerprint
    }
}

/// A GCRA (generic cell rate algorithm) policy: `quota` units replenish continuously over
/// each `period`, and a rested subject may spend up to `burst_capacity` units at once.
///
/// The emission interval is `period / quota`; it need not be a whole number of
/// milliseconds, because [`backend::gcra`](crate::backend::gcra) evaluates in exact scaled
/// integers. The full
/// replenishment time ⌈burst_capacity × period / quota⌉ ms must not exceed [`MAX_WINDOW`].
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use runlimit_core::{GcraPolicy, PolicyId, ScopeId};
///
/// let policy = GcraPolicy::new(
///     PolicyId::new("api.read")?,
///     ScopeId::new("client")?,
///     10,                     // units replenished
///     Duration::from_secs(1), // during this period
///     20,                     // maximum immediate burst
/// )?;
/// assert_eq!(policy.full_replenishment().as_millis(), 2_000);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct GcraPolicy {
    id: PolicyId,
    scope: ScopeId,
    /// Quota, period and burst capacity, with what the evaluator derives from them once.
    parameters: crate::backend::gcra::GcraParameters,
    mode: QuotaMode,
    fingerprint: PolicyFingerprint,
}

impl GcraPolicy {
    /// The fingerprint kind of GCRA policies.
    pub const KIND: &'static str = "gcra";

    /// Validates a GCRA policy in [`QuotaMode::Enforce`].
    ///
    /// # Errors
    ///
    /// [`PolicyError::Zero`] / [`PolicyError::TooLarge`] for `quota` or `burst_capacity`
    /// outside 1..=[`MAX_LIMIT`]; [`PolicyError::ZeroDuration`],
    /// [`PolicyError::NotWholeMilliseconds`] or [`PolicyError::DurationTooLong`] for `period`;
    /// [`PolicyError::ReplenishmentTooLong`] when ⌈burst × period / quota⌉ ms exceeds
    /// [`MAX_WINDOW`].
    pub fn new(
        id: PolicyId,
        scope: ScopeId,
        quota: u64,
        period: Duration,
        burst_capacity: u64,
    ) -> Result<Self, PolicyError> {
        let quota = Capacity::named("quota", quota)?;
        let period = QuotaPeriod::named("period", period)?;
        let burst = Capacity::named("burst capacity", burst_capacity)?;
        let parameters = crate::backend::gcra::GcraParameters::new(quota, period, burst)?;
        let fingerprint = PolicyFingerprint::derive(
            Self::KIND,
            &id,
            &scope,
            &[quota.get(), period.as_millis(), burst.get()],
        );
        Ok(Self { id, scope, parameters, mode: QuotaMode::Enforce, fingerprint })
    }

    /// Returns the policy with another quota mode; the fingerprint is unchanged.
    #[must_use]
    pub fn with_quota_mode(mut self, mode: QuotaMode) -> Self {
        self.mode = mode;
        self
    }

    /// Units replenished per [`period`](RateLimitPolicy::period).
    #[must_use]
    pub fn quota(&self) -> Capacity {
        self.parameters.quota()
    }

    /// The replenishment period.
    #[must_use]
    pub fn period(&self) -> QuotaPeriod {
        self.parameters.period()
    }

    /// The most units a fully rested subject may spend at once.
    #[must_use]
    pub fn burst_capacity(&self) -> Capacity {
        self.parameters.burst_capacity()
    }

    /// The evaluator's parameters, derived once when the policy was built.
    #[inline]
    pub(crate) fn parameters(&self) -> &crate::backend::gcra::GcraParameters {
        &self.parameters
    }

    /// Time for an exhausted subject to replenish fully: ⌈burst × period / quota⌉ whole
    /// milliseconds (rounded up), at most [`MAX_WINDOW`].
    #[must_use]
    pub fn full_replenishment(&self) -> QuotaPeriod {
        let full = u128::from(self.burst_capacity().get()) * u128::from(self.period().as_millis());
        let millis = full.div_ceil(u128::from(self.quota().get()));
        // Validated at construction: 1 <= millis <= MAX_WINDOW_MILLIS.
        QuotaPeriod(u64::try_from(millis).unwrap_or(MAX_WINDOW_MILLIS))
    }
}

impl RateLimitPolicy for GcraPolicy {
    fn id(&self) -> &PolicyId {
        &self.id
    }
    fn scope(&self) -> &ScopeId {
        &self.scope
    }
    fn quota(&self) -> Capacity {
        self.parameters.quota()
    }
    fn period(&self) -> QuotaPeriod {
        self.parameters.period()
    }
    fn capacity(&self) -> Capacity {
        self.parameters.burst_capacity()
    }
    fn quota_mode(&self) -> QuotaMode {
        self.mode
    }
    fn fingerprint(&self) -> &PolicyFingerprint {
        &self.fingerprint
    }
}

impl<P: RateLimitPolicy + ?Sized> RateLimitPolicy for &P {
    fn id(&self) -> &PolicyId {
        (**self).id()
    }
    fn scope(&self) -> &ScopeId {
        (**self).scope()
    }
    fn quota(&self) -> Capacity {
        (**self).quota()
    }
    fn period(&self) -> QuotaPeriod {
        (**self).period()
    }
    fn capacity(&self) -> Capacity {
        (**self).capacity()
    }
    fn quota_mode(&self) -> QuotaMode {
        (**self).quota_mode()
    }
    fn fingerprint(&self) -> &PolicyFingerprint {
        (**self).fingerprint()
    }
}

impl<P: RateLimitPolicy + ?Sized> RateLimitPolicy for std::sync::Arc<P> {
    fn id(&self) -> &PolicyId {
        (**self).id()
    }
    fn scope(&self) -> &ScopeId {
        (**self).scope()
    }
    fn quota(&self) -> Capacity {
        (**self).quota()
    }
    fn period(&self) -> QuotaPeriod {
        (**self).period()
    }
    fn capacity(&self) -> Capacity {
        (**self).capacity()
    }
    fn quota_mode(&self) -> QuotaMode {
        (**self).quota_mode()
    }
    fn fingerprint(&self) -> &PolicyFingerprint {
        (**self).fingerprint()
    }
}

#[cfg(feature = "serde")]
mod serde_impls {
    use super::*;
    use serde::{Deserialize, Serialize};

    impl Serialize for Capacity {
        fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
            serializer.serialize_u64(self.0)
        }
    }
    impl<'de> Deserialize<'de> for Capacity {
        fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
            Self::new(u64::deserialize(deserializer)?).map_err(serde::de::Error::custom)
        }
    }
    impl Serialize for QuotaPeriod {
        fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
            self.duration().serialize(serializer)
        }
    }
    impl<'de> Deserialize<'de> for QuotaPeriod {
        fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
            Self::new(Duration::deserialize(deserializer)?).map_err(serde::de::Error::custom)
        }
    }

    #[derive(Serialize, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct FixedWindowRepr {
        id: PolicyId,
        scope: ScopeId,
        limit: u64,
        window: Duration,
        #[serde(default)]
        quota_mode: QuotaMode,
    }

    impl Serialize for FixedWindowPolicy {
        fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
            FixedWindowRepr {
                id: self.id.clone(),
                scope: self.scope.clone(),
                limit: self.limit.get(),
                window: self.window.duration(),
                quota_mode: self.mode,
            }
            .serialize(serializer)
        }
    }
    impl<'de> Deserialize<'de> for FixedWindowPolicy {
        fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
            let repr = FixedWindowRepr::deserialize(deserializer)?;
            Self::new(repr.id, repr.scope, repr.limit, repr.window)
                .map(|policy| policy.with_quota_mode(repr.quota_mode))
                .map_err(serde::de::Error::custom)
        }
    }

    #[derive(Serialize, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct GcraRepr {
        id: PolicyId,
        scope: ScopeId,
        quota: u64,
        period: Duration,
        burst_capacity: u64,
        #[serde(default)]
        quota_mode: QuotaMode,
    }

    impl Serialize for GcraPolicy {
        fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
            GcraRepr {
                id: self.id.clone(),
                scope: self.scope.clone(),
                quota: self.quota().get(),
                period: Self::period(self).duration(),
                burst_capacity: self.burst_capacity().get(),
                quota_mode: self.mode,
            }
            .serialize(serializer)
        }
    }
    impl<'de> Deserialize<'de> for GcraPolicy {
        fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
            let repr = GcraRepr::deserialize(deserializer)?;
            Self::new(repr.id, repr.scope, repr.quota, repr.period, repr.burst_capacity)
                .map(|policy| policy.with_quota_mode(repr.quota_mode))
                .map_err(serde::de::Error::custom)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids() -> (PolicyId, ScopeId) {
        (PolicyId::new("p").unwrap(), ScopeId::new("s").unwrap())
    }

    #[test]
    fn fixed_window_validation_names_the_parameter() {
        let (id, scope) = ids();
        let ok = |limit, window| FixedWindowPolicy::new(id.clone(), scope.clone(), limit, window);
        assert_eq!(ok(0, Duration::from_secs(1)).unwrap_err(), PolicyError::Zero { parameter: "limit" });
        assert_eq!(
            ok(MAX_LIMIT + 1, Duration::from_secs(1)).unwrap_err(),
            PolicyError::TooLarge { parameter: "limit", value: MAX_LIMIT + 1, maximum: MAX_LIMIT }
        );
        assert_eq!(ok(1, Duration::ZERO).unwrap_err(), PolicyError::ZeroDuration { parameter: "window" });
        assert_eq!(
            ok(1, Duration::from_nanos(1_000_001)).unwrap_err(),
            PolicyError::NotWholeMilliseconds { parameter: "window" }
        );
        assert_eq!(
            ok(1, MAX_WINDOW + Duration::from_millis(1)).unwrap_err(),
            PolicyError::DurationTooLong { parameter: "window", maximum_millis: MAX_WINDOW_MILLIS }
        );
        assert_eq!(
            ok(1, Duration::MAX).unwrap_err(),
            PolicyError::NotWholeMilliseconds { parameter: "window" }
        );
        assert!(ok(MAX_LIMIT, MAX_WINDOW).is_ok());
    }

    #[test]
    fn fingerprint_covers_parameters_not_mode() {
        let (id, scope) = ids();
        let base = FixedWindowPolicy::new(id.clone(), scope.clone(), 5, Duration::from_secs(60)).unwrap();
        let shadow = base.clone().with_quota_mode(QuotaMode::Shadow);
        assert_eq!(base.fingerprint(), shadow.fingerprint());
        let other_limit =
            FixedWindowPolicy::new(id.clone(), scope.clone(), 6, Duration::from_secs(60)).unwrap();
        let other_window =
            FixedWindowPolicy::new(id.clone(), scope.clone(), 5, Duration::from_secs(61)).unwrap();
        let other_scope =
            FixedWindowPolicy::new(id.clone(), ScopeId::new("t").unwrap(), 5, Duration::from_secs(60))
                .unwrap();
        let other_id =
            FixedWindowPolicy::new(PolicyId::new("q").unwrap(), scope.clone(), 5, Duration::from_secs(60))
                .unwrap();
        let gcra = GcraPolicy::new(id, scope, 5, Duration::from_secs(60), 5).unwrap();
        let all = [
            &base.fingerprint,
            &other_limit.fingerprint,
            &other_window.fingerprint,
            &other_scope.fingerprint,
            &other_id.fingerprint,
            &gcra.fingerprint,
        ];
        for (i, a) in all.iter().enumerate() {
            for b in &all[i + 1..] {
                assert_ne!(a, b);
            }
        }
    }

    #[test]
    fn gcra_validation() {
        let (id, scope) = ids();
        let new = |q, p, b| GcraPolicy::new(id.clone(), scope.clone(), q, p, b);
        assert_eq!(new(0, Duration::from_secs(1), 1).unwrap_err(), PolicyError::Zero { parameter: "quota" });
        assert_eq!(
            new(1, Duration::from_secs(1), 0).unwrap_err(),
            PolicyError::Zero { parameter: "burst capacity" }
        );
        assert_eq!(
            new(1, MAX_WINDOW, 2).unwrap_err(),
            PolicyError::ReplenishmentTooLong {
                millis: 2 * u128::from(MAX_WINDOW_MILLIS),
                maximum_millis: MAX_WINDOW_MILLIS
            }
        );
        let p = new(3, Duration::from_secs(1), 2).unwrap();
        assert_eq!(p.full_replenishment().as_millis(), 667);
        assert!(new(MAX_LIMIT, MAX_WINDOW, MAX_LIMIT).is_ok());
        assert!(new(MAX_LIMIT, Duration::from_millis(1), 1).is_ok());
    }
}
