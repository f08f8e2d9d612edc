//! Verdicts in, a `RateLimitResponse` out: one status per descriptor, the overall code and the
//! optional response headers.

use envoy_types::pb::{
    envoy::{
        config::core::v3::HeaderValue,
        service::ratelimit::v3::rate_limit_response::{
            Code, DescriptorStatus, RateLimit, rate_limit::Unit as RlsUnit,
        },
    },
    google::protobuf::Duration as PbDuration,
};
use runlimit_core::{Allowance, Delay, FixedWindowPolicy, GcraPolicy, QuotaDenial};
use runlimit_http::draft_11::{QuotaState, RateLimitFields};

use super::evaluate::{Exhaustion, Verdict};
use crate::config::{Quota, Rule, RulePolicy, Unit};

/// The response headers the service can add (`--response-headers`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum HeaderFormat {
    /// The IETF draft-11 fields (draft-ietf-httpapi-ratelimit-headers-11): `RateLimit-Policy`
    /// and `RateLimit` with an item per evaluated rule (named by its `name`, else its path; a
    /// limit override by its domain, entry keys and limit, as in `api.path.method (override
    /// 3/hour)`), and `Retry-After` (whole seconds, rounded up) when the request is over its
    /// limit.
    Draft11,
    /// The fields envoyproxy/ratelimit adds: `RateLimit-Limit`, `RateLimit-Remaining` and
    /// `RateLimit-Reset` (whole seconds, rounded up) of the most constrained descriptor (the
    /// last one over its limit, else the one with the fewest remaining).
    EnvoyRatelimit,
}

/// What the response says about one request descriptor.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Outcome<'a> {
    /// No rule matched, or the matched rule was replaced by another (`replaces`).
    NoLimit,
    /// The matched rule is `unlimited`.
    Unlimited,
    /// A limited rule matched.
    Limited { rule: &'a Rule, verdict: Verdict },
}

/// The status of one descriptor. `global_shadow`: a shadow-mode over-limit descriptor reads
/// `OVER_LIMIT` (the overall code stays `OK`) under the server's global shadow mode, as in
/// envoyproxy/ratelimit, and `OK` for a rule's own `shadow_mode`.
pub(crate) fn status(outcome: &Outcome<'_>, global_shadow: bool) -> DescriptorStatus {
    match outcome {
        Outcome::NoLimit | Outcome::Limited { verdict: Verdict::Unevaluated, .. } => {
            DescriptorStatus { code: Code::Ok.into(), ..DescriptorStatus::default() }
        }
        Outcome::Unlimited => DescriptorStatus {
            code: Code::Ok.into(),
            limit_remaining: u32::MAX,
            ..DescriptorStatus::default()
        },
        Outcome::Limited { rule, verdict } => {
            let (code, remaining, reset) = match verdict {
                Verdict::Unevaluated => (Code::Ok, 0, None),
                Verdict::Allowed(allowance) => {
                    (Code::Ok, allowance.available(), Some(allowance.replenishes_after()))
                }
                Verdict::Available(snapshot) => {
                    (Code::Ok, snapshot.available(), Some(snapshot.replenishes_after()))
                }
                Verdict::Exhausted { enforced, reason } => {
                    let code = if *enforced || global_shadow { Code::OverLimit } else { Code::Ok };
                    (code, 0, reason.retry_after())
                }
            };
            DescriptorStatus {
                code: code.into(),
                current_limit: Some(current_limit(rule)),
                limit_remaining: u32::try_from(remaining).unwrap_or(u32::MAX),
                duration_until_reset: reset.map(duration),
                ..DescriptorStatus::default()
            }
        }
    }
}

fn current_limit(rule: &Rule) -> RateLimit {
    let (requests_per_unit, unit) = match &rule.quota {
        Quota::Limited { requests_per_unit, unit, .. } => (*requests_per_unit, rls_unit(*unit)),
        Quota::Unlimited => (0, RlsUnit::Unknown),
    };
    RateLimit {
        name: rule.name.as_deref().unwrap_or_default().to_owned(),
        requests_per_unit,
        unit: unit.into(),
    }
}

pub(crate) fn rls_unit(unit: Unit) -> RlsUnit {
    match unit {
        Unit::Second => RlsUnit::Second,
        Unit::Minute => RlsUnit::Minute,
        Unit::Hour => RlsUnit::Hour,
        Unit::Day => RlsUnit::Day,
        Unit::Week => RlsUnit::Week,
        Unit::Month => RlsUnit::Month,
        Unit::Year => RlsUnit::Year,
    }
}

/// A backend delay as a protobuf `Duration`: exact (whole milliseconds), not rounded.
pub(crate) fn duration(delay: Delay) -> PbDuration {
    let exact = delay.duration();
    PbDuration {
        seconds: i64::try_from(exact.as_secs()).unwrap_or(i64::MAX),
        nanos: i32::try_from(exact.subsec_nanos()).unwrap_or(0),
    }
}

/// The response headers of `format` for these outcomes; `over_limit` is the overall code.
pub(crate) fn headers(format: HeaderFormat, outcomes: &[Outcome<'_>], over_limit: bool) -> Vec<HeaderValue> {
    match format {
        HeaderFormat::Draft11 => draft_11(outcomes, over_limit),
        HeaderFormat::EnvoyRatelimit => envoy_ratelimit(outcomes),
    }
}

fn header(key: &str, value: String) -> HeaderValue {
    HeaderValue { key: key.to_owned(), value, ..HeaderValue::default() }
}

fn draft_11(outcomes: &[Outcome<'_>], over_limit: bool) -> Vec<HeaderValue> {
    let mut fields = RateLimitFields::new();
    let mut named: Vec<&str> = Vec::new();
    let mut retry_after: Option<Delay> = None;
    // Exhausted rules first, so a rule matched twice is described by its exhausted counter.
    let exhausted = outcomes
        .iter()
        .filter(|outcome| matches!(outcome, Outcome::Limited { verdict: Verdict::Exhausted { .. }, .. }));
    let others = outcomes
        .iter()
        .filter(|outcome| !matches!(outcome, Outcome::Limited { verdict: Verdict::Exhausted { .. }, .. }));
    for outcome in exhausted.chain(others) {
        let Outcome::Limited { rule, verdict } = outcome else { continue };
        if let Verdict::Exhausted { enforced: true, reason } = verdict
            && let Some(delay) = reason.retry_after()
        {
            retry_after = Some(retry_after.map_or(delay, |known| known.max(delay)));
        }
        let Quota::Limited { policy: Some(policy), .. } = &rule.quota else { continue };
        let name = rule.header_name.as_str();
        if named.contains(&name) {
            continue;
        }
        let state: QuotaState = match verdict {
            Verdict::Unevaluated => continue,
            Verdict::Allowed(allowance) => QuotaState::from(*allowance),
            Verdict::Available(snapshot) => {
                match Allowance::new(snapshot.capacity(), snapshot.available(), snapshot.replenishes_after())
                {
                    Ok(allowance) => QuotaState::from(allowance),
                    Err(_) => continue,
                }
            }
            Verdict::Exhausted { reason: Exhaustion::Quota { retry_after }, .. } => {
                QuotaState::from(QuotaDenial::new(capacity(policy), *retry_after))
            }
            Verdict::Exhausted { .. } => continue,
        };
        let pushed = match policy {
            RulePolicy::FixedWindow(policy) => {
                fields.push::<FixedWindowPolicy>(rule.header_name.clone(), policy, state)
            }
            RulePolicy::Gcra(policy) => fields.push::<GcraPolicy>(rule.header_name.clone(), policy, state),
        };
        if pushed.is_ok() {
            named.push(name);
        }
    }
    let mut headers = Vec::new();
    if let Some((policy, limit)) = fields.values()
        && let (Ok(policy), Ok(limit)) = (policy.to_str(), limit.to_str())
    {
        headers.push(header("RateLimit-Policy", policy.to_owned()));
        headers.push(header("RateLimit", limit.to_owned()));
    }
    if over_limit && let Some(delay) = retry_after {
        headers.push(header("Retry-After", delay.seconds().to_string()));
    }
    headers
}

fn capacity(policy: &RulePolicy) -> runlimit_core::Capacity {
    match policy {
        RulePolicy::FixedWindow(policy) => runlimit_core::RateLimitPolicy::capacity(policy),
        RulePolicy::Gcra(policy) => runlimit_core::RateLimitPolicy::capacity(policy),
    }
}

fn envoy_ratelimit(outcomes: &[Outcome<'_>]) -> Vec<HeaderValue> {
    let mut chosen: Option<(u32, u64, Option<Delay>)> = None;
    let mut over: Option<(u32, Option<Delay>)> = None;
    for outcome in outcomes {
        let Outcome::Limited { rule, verdict } = outcome else { continue };
        let Quota::Limited { requests_per_unit, .. } = &rule.quota else { continue };
        let (remaining, reset) = match verdict {
            Verdict::Unevaluated => continue,
            Verdict::Allowed(allowance) => (allowance.available(), Some(allowance.replenishes_after())),
            Verdict::Available(snapshot) => (snapshot.available(), Some(snapshot.replenishes_after())),
            Verdict::Exhausted { enforced, reason } => {
                if *enforced {
                    over = Some((*requests_per_unit, reason.retry_after()));
                }
                (0, reason.retry_after())
            }
        };
        if chosen.is_none_or(|(_, fewest, _)| remaining < fewest) {
            chosen = Some((*requests_per_unit, remaining, reset));
        }
    }
    let chosen = over.map(|(limit, reset)| (limit, 0, reset)).or(chosen);
    let Some((limit, remaining, reset)) = chosen else { return Vec::new() };
    vec![
        header("RateLimit-Limit", limit.to_string()),
        header("RateLimit-Remaining", remaining.min(u64::from(u32::MAX)).to_string()),
        header("RateLimit-Reset", reset.map_or(0, Delay::seconds).to_string()),
    ]
}
