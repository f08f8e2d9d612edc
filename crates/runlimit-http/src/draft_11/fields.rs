//! Both fields at once, for one or several policies.

use http::{HeaderMap, HeaderValue};
use runlimit_core::RateLimitPolicy;
use smallvec::SmallVec;

use super::{
    RATELIMIT, RATELIMIT_POLICY,
    name::PolicyName,
    policy::{QuotaPolicy, QuotaPolicyError, quota_policies},
    service_limit::{QuotaState, ServiceLimit, ServiceLimitError, service_limits},
};

/// Why [`RateLimitFields::push`] rejected a policy and its state. Nothing was added.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RateLimitFieldsError {
    /// The `RateLimit-Policy` item could not be built.
    #[error("policy cannot be described in RateLimit-Policy")]
    Policy {
        /// Why.
        #[source]
        source: QuotaPolicyError,
    },
    /// The `RateLimit` item could not be built.
    #[error("quota state cannot be described in RateLimit")]
    ServiceLimit {
        /// Why.
        #[source]
        source: ServiceLimitError,
    },
}

impl From<QuotaPolicyError> for RateLimitFieldsError {
    fn from(source: QuotaPolicyError) -> Self {
        Self::Policy { source }
    }
}

impl From<ServiceLimitError> for RateLimitFieldsError {
    fn from(source: ServiceLimitError) -> Self {
        Self::ServiceLimit { source }
    }
}

/// Collects one `RateLimit-Policy` item and one `RateLimit` item per disclosed policy and
/// writes both fields.
///
/// The application picks the policies to disclose and their names; items keep the order of
/// the [`push`](Self::push) calls. Typical use: a handler pushes each admission it reads
/// from its request (policy and admitted decision), and a rejection mapper pushes the
/// denied policy with the [`QuotaDenial`](runlimit_core::QuotaDenial) from its
/// `Denial::QuotaExceeded` arm.
///
/// # Examples
///
/// Two gates; the identity gate is shadow-denied, so it reports what enforcement would have
/// answered:
///
/// ```
/// use std::time::Duration;
/// use http::HeaderMap;
/// use runlimit_core::{
///     Admitted, Allowance, Capacity, Delay, FixedWindowPolicy, PolicyId, QuotaDenial, ScopeId,
/// };
/// use runlimit_http::draft_11::{PolicyName, RateLimitFields, RATELIMIT, RATELIMIT_POLICY};
///
/// let client = FixedWindowPolicy::new(
///     PolicyId::new("auth.login")?, ScopeId::new("client")?, 40, Duration::from_secs(60))?;
/// let identity = FixedWindowPolicy::new(
///     PolicyId::new("auth.login")?, ScopeId::new("identity")?, 8, Duration::from_secs(600))?;
/// let client_state = Admitted::Allowed(Allowance::new(Capacity::new(40)?, 39, Delay::from_millis(60_000))?);
/// let identity_state = Admitted::ShadowDenied(QuotaDenial::new(Capacity::new(8)?, Delay::from_millis(12_345)));
///
/// let mut fields = RateLimitFields::new();
/// fields
///     .push(PolicyName::new("login-client")?, &client, client_state)?
///     .push(PolicyName::new("login-identity")?, &identity, identity_state)?;
/// let mut headers = HeaderMap::new();
/// fields.insert_into(&mut headers);
/// assert_eq!(
///     headers[RATELIMIT_POLICY],
///     r#""login-client";q=40;w=60, "login-identity";q=8;w=600"#,
/// );
/// assert_eq!(headers[RATELIMIT], r#""login-client";r=39;t=60, "login-identity";r=0;t=13"#);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RateLimitFields {
    // Inline up to two items each (a gate and perhaps a second one): no allocation per request
    // for the common stacks.
    policies: SmallVec<[QuotaPolicy; 2]>,
    limits: SmallVec<[ServiceLimit; 2]>,
}

impl RateLimitFields {
    /// No items.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `policy` (as a `RateLimit-Policy` item) and `state` (as a `RateLimit` item),
    /// both under `name`. Either both items are added or neither is.
    ///
    /// `state` is an [`Allowance`](runlimit_core::Allowance), a
    /// [`QuotaDenial`](runlimit_core::QuotaDenial) or an [`Admitted`](runlimit_core::Admitted);
    /// see [`QuotaState`]. `P` may be unsized (`&dyn RateLimitPolicy`).
    ///
    /// # Errors
    ///
    /// - [`RateLimitFieldsError::Policy`] wrapping [`QuotaPolicyError`] (quota above
    ///   [`MAX_INTEGER`](super::MAX_INTEGER), period not whole seconds);
    /// - [`RateLimitFieldsError::ServiceLimit`] wrapping [`ServiceLimitError`] (`r` or `t`
    ///   above [`MAX_INTEGER`](super::MAX_INTEGER)).
    pub fn push<P: RateLimitPolicy + ?Sized>(
        &mut self,
        name: PolicyName,
        policy: &P,
        state: impl Into<QuotaState>,
    ) -> Result<&mut Self, RateLimitFieldsError> {
        let limit = ServiceLimit::new(name.clone(), state)?;
        let quota_policy = QuotaPolicy::from_policy(name, policy)?;
        self.policies.push(quota_policy);
        self.limits.push(limit);
        Ok(self)
    }

    /// True when nothing was pushed.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.policies.is_empty()
    }

    /// The `RateLimit-Policy` items pushed so far, in order.
    #[must_use]
    pub fn quota_policies(&self) -> &[QuotaPolicy] {
        &self.policies
    }

    /// The `RateLimit` items pushed so far, in order.
    #[must_use]
    pub fn service_limits(&self) -> &[ServiceLimit] {
        &self.limits
    }

    /// The `RateLimit-Policy` value, `None` when empty.
    #[must_use]
    pub fn policy_value(&self) -> Option<HeaderValue> {
        quota_policies(&self.policies)
    }

    /// The `RateLimit` value, `None` when empty.
    #[must_use]
    pub fn service_limit_value(&self) -> Option<HeaderValue> {
        service_limits(&self.limits)
    }

    /// Both values, `RateLimit-Policy` first: `Some` of both or, when nothing was pushed,
    /// `None` (an empty list is not a field).
    #[must_use]
    pub fn values(&self) -> Option<(HeaderValue, HeaderValue)> {
        self.policy_value().zip(self.service_limit_value())
    }

    /// Inserts [`RATELIMIT_POLICY`] and [`RATELIMIT`] into `headers`, replacing any
    /// existing lines of those fields. Does nothing when empty (an empty list is not a
    /// field). Touches no other header: `Retry-After`, status and body stay the
    /// application's.
    pub fn insert_into(&self, headers: &mut HeaderMap) {
        if let Some((policy, limit)) = self.values() {
            headers.insert(RATELIMIT_POLICY, policy);
            headers.insert(RATELIMIT, limit);
        }
    }
}
