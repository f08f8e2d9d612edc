//! `RateLimit-Policy` and `RateLimit` as defined by draft-ietf-httpapi-ratelimit-headers-11
//! ("D11").
//!
//! Both fields are RFC 9651 Structured Field **Lists** of Items whose bare value is an
//! sf-string naming a quota policy (D11 §3, §4):
//!
//! | field | item | built from |
//! |---|---|---|
//! | [`RATELIMIT_POLICY`] | `"name";q=N;w=S` | [`QuotaPolicy::from_policy`] |
//! | [`RATELIMIT`] | `"name";r=N;t=S` | [`ServiceLimit::new`] / [`service_limit`] with a [`QuotaState`] |
//!
//! [`RateLimitFields`] collects one item of each per policy and writes both fields at once.
//!
//! # What is emitted
//!
//! - `q` is the policy's [`quota`](RateLimitPolicy::quota): the fixed-window limit, or the
//!   GCRA quota Q replenished per period. `w` is its [`period`](RateLimitPolicy::period) in
//!   seconds and must be an exact whole number of seconds (D11 §3.1.3 allows no sub-second
//!   windows); a policy whose period has a millisecond remainder is rejected with
//!   [`QuotaPolicyError::WindowNotWholeSeconds`], never rounded.
//! - `r` is the available quota and `t` the effective window in seconds (D11 §4.1.1,
//!   §4.1.2); see [`QuotaState`] for both and [the `t` choice](#the-t-parameter). Durations
//!   measured by a backend are [`Delay`](runlimit_core::Delay)s, rounded **up** to whole
//!   seconds with [`Delay::seconds`](runlimit_core::Delay::seconds) (1.001 s becomes `t=2`).
//! - Every Integer must lie in RFC 9651's range, at most [`MAX_INTEGER`]
//!   (999,999,999,999,999; RFC 9651 §3.3.1). Runlimit capacities reach `i64::MAX`, so `q` and
//!   `r` can be out of range: such a value is rejected with a typed error
//!   ([`QuotaPolicyError::QuotaOutOfRange`], [`ServiceLimitError::AvailableOutOfRange`],
//!   [`ServiceLimitError::WindowOutOfRange`]), never clamped.
//! - Names are validated once by [`PolicyName::new`]: sf-string characters only (D11 §3
//!   requires the item to be an sf-string; RFC 9651 §3.3.3 allows %x20–%x7E), escaped on
//!   output (`a"b\c` becomes `"a\"b\\c"`).
//! - No `qu` (the default unit, requests, is what a Runlimit check counts; D11 §3.1.2's name
//!   and its IANA table disagree, so it is omitted), no `pk` (partition keys are never
//!   exposed), no vendor parameters (a GCRA burst capacity has no D11 parameter).
//! - Lists are joined with `", "`, as RFC 9651 §4.1.1 serializes them; an empty list is not a
//!   field (RFC 9651 §4.1), so the list functions return `None` for no items.
//!
//! Nothing here chooses a status, a body, `Retry-After` or a partition key.
//!
//! # The `t` parameter
//!
//! D11 §4.1.2 calls `t` the *effective window*: the seconds within which the client can use
//! no more than `r`. Runlimit emits:
//!
//! | state | `r` | `t` |
//! |---|---|---|
//! | [`Allowance`](runlimit_core::Allowance) | [`available`](runlimit_core::Allowance::available) | ⌈[`replenishes_after`](runlimit_core::Allowance::replenishes_after)⌉ s |
//! | [`QuotaDenial`](runlimit_core::QuotaDenial) (enforced, or shadow through [`Admitted::ShadowDenied`](runlimit_core::Admitted::ShadowDenied)) | `0` | ⌈[`retry_after`](runlimit_core::QuotaDenial::retry_after)⌉ s |
//!
//! - **Fixed window.** `replenishes_after` is the time until the anchored window ends, so
//!   `t` is exactly D11's effective window: within `t` seconds the client can use no more
//!   than `r`.
//! - **Denials (both algorithms).** `r=0` and `t` is the earliest time the same request can
//!   succeed, so "no more than 0 within `t`" holds exactly, and an application's
//!   `Retry-After` computed from the same [`QuotaDenial`](runlimit_core::QuotaDenial)
//!   equals `t`, satisfying D11 §6 (`Retry-After` SHOULD NOT point before the end of the
//!   effective window).
//! - **GCRA allowances: `t` is the time to full replenishment** (the "reset" meaning of
//!   drafts -08/-09), not the time to the next unit. Both readings are defensible for a
//!   continuously replenished quota; this is the documented choice:
//!   - The strict "no more than `r` within `t`" reading cannot be honoured in whole seconds
//!     anyway whenever the emission interval is below a second: the time to the next unit
//!     rounds up to `t=1` while several more units arrive within that second.
//!   - The full-replenishment `t` is an honest promise in the direction a client cares
//!     about: spending at most `r` units over the next `t` seconds is never denied (the `r`
//!     units are available now and availability only grows), and a client that sends nothing
//!     for `t` seconds is fully rested again. D11 §4.1.2 warns clients not to assume the
//!     quota is fully restored after `t`; with this meaning it is, when unused.
//!   - It is what an [`Allowance`](runlimit_core::Allowance) carries, for every backend,
//!     with the same rounding as `Retry-After`; a next-unit time would need the policy's
//!     algorithm, which [`RateLimitPolicy`] does not reveal.
//!   - Because GCRA units accrue continuously, `r` can reach the burst capacity, which may
//!     exceed `q` (the per-period quota).
//!
//! # Why a hand-written serializer
//!
//! A maintained RFC 9651 implementation is preferable where one fits. `sfv` is correct
//! and strict, but for these two fields it buys little: the items use only Strings and
//! non-negative Integers with four fixed lowercase keys. The encoder here is a few lines
//! (validate %x20–%x7E once in [`PolicyName::new`], escape `"` and `\`, check the integer
//! range once in each item constructor), so that serialization itself cannot fail and each
//! operation reports its own precise error. It also avoids a runtime dependency whose
//! current release (0.16) requires Rust 1.95, above the workspace MSRV of 1.94. `sfv` 0.15
//! is a dev-dependency: every test and proptest output is parsed back with its RFC 9651
//! parser and compared member by member.

mod fields;
mod name;
mod policy;
mod service_limit;
mod sf;

pub use self::fields::{RateLimitFields, RateLimitFieldsError};
pub use self::name::{PolicyName, PolicyNameError};
pub use self::policy::{QuotaPolicy, QuotaPolicyError, quota_policies, quota_policy};
pub use self::service_limit::{QuotaState, ServiceLimit, ServiceLimitError, service_limit, service_limits};
pub use self::sf::MAX_INTEGER;

use http::HeaderName;
#[cfg(doc)]
use runlimit_core::RateLimitPolicy;

/// The `RateLimit-Policy` response field (D11 §3): a list of quota policy items,
/// `"name";q=N;w=S`.
///
/// Lowercase, as HTTP/2 and HTTP/3 require and [`HeaderName::from_static`](https://docs.rs/http/1/http/header/struct.HeaderName.html#method.from_static) expects.
/// Clients may ignore it; it should stay stable across responses and must not be sent in a
/// trailer (D11 §3).
pub const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");

/// The `RateLimit` response field (D11 §4): a list of service limit items,
/// `"name";r=N;t=S`.
///
/// Lowercase, as HTTP/2 and HTTP/3 require and [`HeaderName::from_static`](https://docs.rs/http/1/http/header/struct.HeaderName.html#method.from_static) expects. May be
/// sent on any status, including 429; it must not be sent in a trailer (D11 §4, §6).
pub const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
