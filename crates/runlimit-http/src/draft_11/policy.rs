//! `RateLimit-Policy` items: `"name";q=N;w=S`.

use http::HeaderValue;
use runlimit_core::RateLimitPolicy;

use super::{
    name::PolicyName,
    sf::{self, Key, MAX_INTEGER, SfInteger},
};

/// Why [`QuotaPolicy::from_policy`] rejected a policy.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum QuotaPolicyError {
    /// The policy's quota is above RFC 9651's largest Integer, [`MAX_INTEGER`]
    /// (RFC 9651 §3.3.1).
    #[error("quota {quota} is above the structured field integer maximum of {maximum}")]
    QuotaOutOfRange {
        /// The rejected quota.
        quota: u64,
        /// [`MAX_INTEGER`].
        maximum: u64,
    },
    /// The policy's period is not an exact whole number of seconds; `w` has no sub-second
    /// form (D11 §3.1.3) and Runlimit never rounds an advertised window.
    #[error("window of {millis} milliseconds is not a whole number of seconds")]
    WindowNotWholeSeconds {
        /// The period in milliseconds.
        millis: u64,
    },
}

/// One validated `RateLimit-Policy` item, `"name";q=N;w=S` (D11 §3.1).
///
/// `q` is the policy's [`quota`](RateLimitPolicy::quota) (the fixed-window limit, or the
/// GCRA quota replenished per period) and `w` its [`period`](RateLimitPolicy::period) in
/// exact whole seconds. Build it once at start-up; the value is meant to stay stable across
/// responses (D11 §3).
///
/// # Examples
///
/// The draft's example `RateLimit-Policy: "burst";q=100;w=60,"daily";q=1000;w=86400`
/// (D11 §3.2), serialized with RFC 9651's `", "` separator:
///
/// ```
/// use std::time::Duration;
/// use runlimit_core::{FixedWindowPolicy, PolicyId, ScopeId};
/// use runlimit_http::draft_11::{quota_policies, PolicyName, QuotaPolicy};
///
/// let burst = FixedWindowPolicy::new(
///     PolicyId::new("api")?, ScopeId::new("burst")?, 100, Duration::from_secs(60))?;
/// let daily = FixedWindowPolicy::new(
///     PolicyId::new("api")?, ScopeId::new("daily")?, 1000, Duration::from_secs(86_400))?;
/// let items = [
///     QuotaPolicy::from_policy(PolicyName::new("burst")?, &burst)?,
///     QuotaPolicy::from_policy(PolicyName::new("daily")?, &daily)?,
/// ];
/// let value = quota_policies(&items).ok_or("no items")?;
/// assert_eq!(value, r#""burst";q=100;w=60, "daily";q=1000;w=86400"#);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct QuotaPolicy {
    name: PolicyName,
    quota: SfInteger,
    window_seconds: SfInteger,
}

impl QuotaPolicy {
    /// Describes `policy` under `name`: `q` = its quota, `w` = its period in whole seconds.
    ///
    /// `P` may be unsized, so a `&dyn RateLimitPolicy` (such as an admission record's
    /// policy) works.
    ///
    /// # Errors
    ///
    /// - [`QuotaPolicyError::QuotaOutOfRange`] when the quota exceeds [`MAX_INTEGER`];
    /// - [`QuotaPolicyError::WindowNotWholeSeconds`] when the period has a millisecond
    ///   remainder (1,500 ms, say). Every whole-second period of a valid policy is in range
    ///   and non-zero, as `w` requires.
    pub fn from_policy<P: RateLimitPolicy + ?Sized>(
        name: PolicyName,
        policy: &P,
    ) -> Result<Self, QuotaPolicyError> {
        let quota = policy.quota().get();
        let quota =
            SfInteger::new(quota).ok_or(QuotaPolicyError::QuotaOutOfRange { quota, maximum: MAX_INTEGER })?;
        let period = policy.period();
        let window_seconds = period
            .as_whole_seconds()
            .and_then(SfInteger::new)
            .ok_or(QuotaPolicyError::WindowNotWholeSeconds { millis: period.as_millis() })?;
        Ok(Self { name, quota, window_seconds })
    }

    /// The policy name.
    #[must_use]
    pub fn name(&self) -> &PolicyName {
        &self.name
    }

    /// `q`: the quota, at most [`MAX_INTEGER`].
    #[must_use]
    pub fn quota(&self) -> u64 {
        self.quota.get()
    }

    /// `w`: the window in whole seconds, at least 1.
    #[must_use]
    pub fn window_seconds(&self) -> u64 {
        self.window_seconds.get()
    }

    fn write(&self, out: &mut sf::Buffer) {
        sf::write_item(
            out,
            self.name.as_str(),
            [(Key::Quota, self.quota), (Key::Window, self.window_seconds)],
        );
    }
}

/// The `RateLimit-Policy` value for one item: `"name";q=N;w=S`.
///
/// Infallible: the item was validated by [`QuotaPolicy::from_policy`].
#[must_use]
pub fn quota_policy(item: &QuotaPolicy) -> HeaderValue {
    let mut out = sf::Buffer::new();
    item.write(&mut out);
    sf::header_value(&out)
}

/// The `RateLimit-Policy` value for several items, in order, joined by `", "`
/// (RFC 9651 §4.1.1).
///
/// Returns `None` when `items` is empty: an empty List is not serialized (RFC 9651 §4.1) and
/// D11 §3 requires a non-empty field, so the application sends no field at all.
#[must_use]
pub fn quota_policies<'a>(items: impl IntoIterator<Item = &'a QuotaPolicy>) -> Option<HeaderValue> {
    sf::list(items, |out, item: &QuotaPolicy| item.write(out))
}
