//! The service's own metrics, recorded through the `metrics` facade (the binary installs a
//! Prometheus recorder and serves it on `GET /metrics`; an embedder installs its own).
//!
//! Beside these, every limiter records runlimit-metrics' metrics (`runlimit_admissions_total`,
//! `runlimit_admission_duration_seconds`, the shard gauges, the cleanup metrics) with a
//! `backend` label of `memory`, `redis` or `postgres` (see `crate::backend`).
//!
//! | name | type | labels |
//! |---|---|---|
//! | `runlimit_server_requests_total` | counter | `domain`, `code` |
//! | `runlimit_server_request_duration_seconds` | histogram | `domain` |
//! | `runlimit_server_rule_decisions_total` | counter | `domain`, `rule`, `decision` |
//! | `runlimit_server_detailed_series_dropped_total` | counter | `domain` |
//! | `runlimit_server_shadow_denials_total` | counter | `domain`, `rule`, `reason` |
//! | `runlimit_server_storage_full_total` | counter | `domain` |
//! | `runlimit_server_backend_failures_total` | counter | `domain`, `consumption` |
//! | `runlimit_server_config_reloads_total` | counter | `result` |
//! | `runlimit_server_config_age_seconds` | gauge | none |
//!
//! Labels come from the rule files only, never from a request: `domain` is a configured domain
//! (requests for an unknown domain are counted under `domain=""`), `rule` a rule's `name` or
//! path (`domain.key_value.key`, as written in the files; a limit override's is
//! `DOMAIN.(override)`). The one exception is a rule with `detailed_metric: true`: its `rule`
//! label in `runlimit_server_rule_decisions_total` is the descriptor's values
//! ([`detailed_label`]), for at most [`MAX_DETAILED_RULE_VALUES`] distinct values per process,
//! each at most [`MAX_DETAILED_LABEL_LEN`] bytes long; beyond either bound the rule's own label
//! followed by [`OTHER_VALUES`] is used, and `runlimit_server_detailed_series_dropped_total`
//! counts it. The crate README's "Metrics" section documents each metric for operators.
//!
//! Every series a request can touch is resolved once (when the table is put in force, or on
//! its first use) and its handle kept: the hot path increments atomics and never looks a
//! metric up by its labels (that lookup cost a fifth of the service's own time).

use std::{
    collections::HashMap,
    sync::{Mutex, OnceLock, PoisonError},
    time::Duration,
};

use metrics::{Counter, Histogram, counter};
use runlimit_core::ConsumptionStatus;

use envoy_types::pb::envoy::{
    extensions::common::ratelimit::v3::RateLimitDescriptor, service::ratelimit::v3::rate_limit_response::Code,
};

use crate::{
    config::{Domain, Quota, Rule, RuleTable},
    service::Exhaustion,
};

/// `runlimit_server_requests_total{domain, code}`: answered `ShouldRateLimit` calls by overall
/// code (`ok`, `over_limit`); malformed requests and backend errors answered with a gRPC error
/// are not counted here.
pub(crate) const REQUESTS: &str = "runlimit_server_requests_total";
/// `runlimit_server_request_duration_seconds{domain}`: the time `ShouldRateLimit` took, from
/// the start of the call to its answer (a response, or `UNAVAILABLE` after a backend failure);
/// calls refused before evaluation (malformed, not ready) are not timed.
pub(crate) const REQUEST_DURATION: &str = "runlimit_server_request_duration_seconds";
/// `runlimit_server_rule_decisions_total{domain, rule, decision}`: request descriptors that
/// matched a limited rule, by what the rule decided (see [`Decision`]).
pub(crate) const RULE_DECISIONS: &str = "runlimit_server_rule_decisions_total";
/// `runlimit_server_detailed_series_dropped_total{domain}`: decisions of `detailed_metric`
/// rules counted under the rule's own label and [`OTHER_VALUES`], because the process already
/// has [`MAX_DETAILED_RULE_VALUES`] detailed values or the label would be longer than
/// [`MAX_DETAILED_LABEL_LEN`].
pub(crate) const DETAILED_SERIES_DROPPED: &str = "runlimit_server_detailed_series_dropped_total";
/// `runlimit_server_shadow_denials_total{domain, rule, reason}`: descriptors a shadow-mode rule
/// would have denied (`reason`: `quota`; `never` for a limit of 0 or hits above it;
/// `storage_capacity` for a full store after the request's enforced rules were charged). The
/// `rule` label is the rule's `name`, else its path (never a value); a limit override's is
/// `DOMAIN.(override)`.
pub(crate) const SHADOW_DENIALS: &str = "runlimit_server_shadow_denials_total";
/// `runlimit_server_config_reloads_total{result}`: reloads of the rule files that put a new
/// table in force (`result="success"`) or were refused (`result="failure"`; the same refused
/// files are counted once, not on every poll).
pub(crate) const CONFIG_RELOADS: &str = "runlimit_server_config_reloads_total";
/// `runlimit_server_config_age_seconds`: seconds since the rules in force were loaded, as of
/// the scrape.
pub(crate) const CONFIG_AGE: &str = "runlimit_server_config_age_seconds";
/// `runlimit_server_storage_full_total{domain}`: descriptors denied (or, in a shadow-mode
/// batch after the enforced rules were charged, reported) because their store was full: a new
/// key found its shard at its bound.
pub(crate) const STORAGE_FULL: &str = "runlimit_server_storage_full_total";
/// `runlimit_server_backend_failures_total{domain, consumption}`: calls whose backend failed,
/// by whether quota may have been consumed (`not_consumed`, `may_have_been_consumed`,
/// `consumed`).
pub(crate) const BACKEND_FAILURES: &str = "runlimit_server_backend_failures_total";

/// The most distinct `detailed_metric` label values one process records: 1,000 (each with at
/// most four series, one per [`Decision`]). Beyond, a decision is counted under the rule's own
/// label followed by [`OTHER_VALUES`]. The bound is per process, not per table: series are
/// never deleted, so a reload does not give it back.
pub(crate) const MAX_DETAILED_RULE_VALUES: usize = 1_000;

/// The longest `detailed_metric` label value recorded, in bytes: 1,024. A longer one (a
/// descriptor value is up to 64 KiB) is counted under the rule's own label followed by
/// [`OTHER_VALUES`], so the detailed series hold at most about 1 MiB of label text.
pub(crate) const MAX_DETAILED_LABEL_LEN: usize = 1_024;

/// Appended to a `detailed_metric` rule's own label for the decisions not counted under a
/// detailed value.
pub(crate) const OTHER_VALUES: &str = " (other values)";

/// The Prometheus buckets of every `*_seconds` histogram, in seconds: 10 µs to 5 s (a memory
/// call takes tens of microseconds, a Redis or PostgreSQL one up to milliseconds; Envoy's
/// default timeout for the call is 20 ms).
pub(crate) const DURATION_BUCKETS: &[f64] =
    &[1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2e-2, 5e-2, 0.1, 0.25, 1.0, 5.0];

/// How often the Prometheus recorder's upkeep runs: histogram samples are drained into their
/// buckets between scrapes, so the recorder's memory stays bounded without a scraper.
pub(crate) const UPKEEP_INTERVAL: Duration = Duration::from_secs(5);

/// What a limited rule decided for one request descriptor: the `decision` label.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Decision {
    /// `ok`: allowed (charged), or checked without charging (`hits_addend: 0`) with quota left.
    Ok,
    /// `over_limit`: over its limit, enforced (a full store is enforced in shadow mode too).
    OverLimit,
    /// `shadow_over_limit`: over its limit, in shadow mode: reported, not enforced.
    ShadowOverLimit,
    /// `not_evaluated`: another descriptor denied the request first; nothing was measured or
    /// charged for this one.
    NotEvaluated,
}

impl Decision {
    const ALL: [Self; 4] = [Self::Ok, Self::OverLimit, Self::ShadowOverLimit, Self::NotEvaluated];

    /// The label value.
    pub(crate) const fn label(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::OverLimit => "over_limit",
            Self::ShadowOverLimit => "shadow_over_limit",
            Self::NotEvaluated => "not_evaluated",
        }
    }

    const fn index(self) -> usize {
        match self {
            Self::Ok => 0,
            Self::OverLimit => 1,
            Self::ShadowOverLimit => 2,
            Self::NotEvaluated => 3,
        }
    }
}

/// Which rule a request descriptor matched, for its metric series.
#[derive(Debug)]
pub(crate) struct RuleKey {
    /// The rule's index in its domain; `None` for a limit override.
    pub(crate) index: Option<usize>,
    /// The [`detailed_label`] of a `detailed_metric` rule.
    pub(crate) detailed: Option<String>,
}

/// Describes every metric to the installed recorder.
pub(crate) fn describe() {
    metrics::describe_counter!(REQUESTS, "ShouldRateLimit calls answered, by domain and overall code");
    metrics::describe_histogram!(
        REQUEST_DURATION,
        metrics::Unit::Seconds,
        "Time to answer a ShouldRateLimit call, by domain"
    );
    metrics::describe_counter!(
        RULE_DECISIONS,
        "Request descriptors that matched a limited rule, by domain, rule and decision"
    );
    metrics::describe_counter!(
        DETAILED_SERIES_DROPPED,
        "Decisions of detailed_metric rules counted under the rule's own label (series cap or label length)"
    );
    metrics::describe_counter!(
        SHADOW_DENIALS,
        "Descriptors a shadow-mode rule would have denied, by domain, rule and reason"
    );
    metrics::describe_counter!(
        BACKEND_FAILURES,
        "Calls whose backend failed, by domain and consumption certainty"
    );
    metrics::describe_counter!(
        STORAGE_FULL,
        "Descriptors whose new key found its storage shard full, by domain"
    );
    metrics::describe_counter!(CONFIG_RELOADS, "Reloads of the rule files, by result (success, failure)");
    metrics::describe_gauge!(
        CONFIG_AGE,
        metrics::Unit::Seconds,
        "Seconds since the rules in force were loaded"
    );
}

/// The label a rule's series carry: its `name`, else its path.
fn rule_label(rule: &Rule) -> &str {
    rule.name.as_deref().unwrap_or(&rule.path)
}

/// envoyproxy/ratelimit's detailed stats key of a descriptor: the domain, then `.key_value`
/// for each entry, in order (an entry matched by a `share_threshold` rule contributes the
/// rule's pattern, `key_value*`, since its values share one counter).
pub(crate) fn detailed_label(
    domain: &Domain,
    descriptor: &RateLimitDescriptor,
    shared: &[(usize, &str)],
) -> String {
    let mut label = String::from(&*domain.name);
    for (index, entry) in descriptor.entries.iter().enumerate() {
        label.push('.');
        match shared.iter().find(|(at, _)| *at == index) {
            Some((_, pattern)) => label.push_str(pattern),
            None => {
                label.push_str(&entry.key);
                label.push('_');
                label.push_str(&entry.value);
            }
        }
    }
    label
}

/// The series of one rule label, each resolved on first use (or up front, see
/// [`EngineMetrics::new`]).
#[derive(Default)]
struct RuleSeries {
    /// By [`Decision::index`].
    decisions: [OnceLock<Counter>; 4],
    /// `runlimit_server_shadow_denials_total`, by [`reason_index`].
    shadow: [OnceLock<Counter>; 3],
}

impl RuleSeries {
    fn decision(&self, domain: &str, label: impl FnOnce() -> String, decision: Decision) -> &Counter {
        self.decisions[decision.index()].get_or_init(|| {
            counter!(RULE_DECISIONS, "domain" => domain.to_owned(), "rule" => label(), "decision" => decision.label())
        })
    }
}

/// A domain's series (for the unknown domain `""`, only `requests` and `duration` are used),
/// looked up once per request.
pub(crate) struct DomainSeries {
    name: Box<str>,
    /// `ok`, `over_limit`.
    requests: [Counter; 2],
    duration: Histogram,
    /// By rule index; a `detailed_metric` rule's decisions here are its [`OTHER_VALUES`] series.
    rules: Vec<RuleSeries>,
    /// The limit overrides' (`DOMAIN.(override)`).
    overrides: RuleSeries,
    storage_full: OnceLock<Counter>,
    /// By [`consumption_index`].
    backend_failures: [OnceLock<Counter>; 3],
    detailed_dropped: OnceLock<Counter>,
}

impl DomainSeries {
    fn new(name: &str, rules: usize) -> Self {
        Self {
            name: name.into(),
            requests: ["ok", "over_limit"]
                .map(|code| counter!(REQUESTS, "domain" => name.to_owned(), "code" => code)),
            duration: metrics::histogram!(REQUEST_DURATION, "domain" => name.to_owned()),
            rules: std::iter::repeat_with(RuleSeries::default).take(rules).collect(),
            overrides: RuleSeries::default(),
            storage_full: OnceLock::new(),
            backend_failures: Default::default(),
            detailed_dropped: OnceLock::new(),
        }
    }
}

/// The series of one rule table, built with it (the engine is rebuilt on every reload): every
/// domain's request counters and latency histogram, and every limited rule's decision
/// counters, registered with the recorder installed when they are built, so they exist from
/// the start at 0. The rarer series (shadow denials, full stores, backend failures, limit
/// overrides, the [`OTHER_VALUES`] of detailed rules) are resolved on first use and kept.
/// Without a recorder the handles do nothing.
pub(crate) struct EngineMetrics {
    domains: HashMap<Box<str>, DomainSeries>,
    unknown: DomainSeries,
}

impl EngineMetrics {
    pub(crate) fn new(table: &RuleTable) -> Self {
        let domains = table
            .domains()
            .map(|domain| {
                let series = DomainSeries::new(&domain.name, domain.rules.len());
                for (rule, rule_series) in domain.rules.iter().zip(&series.rules) {
                    if matches!(rule.quota, Quota::Limited { .. }) && !rule.detailed_metric {
                        for decision in Decision::ALL {
                            rule_series.decision(&domain.name, || rule_label(rule).to_owned(), decision);
                        }
                    }
                }
                (domain.name.clone(), series)
            })
            .collect();
        Self { domains, unknown: DomainSeries::new("", 0) }
    }

    /// The series of `domain` (`None`: a domain the table does not have, `domain=""`).
    pub(crate) fn domain(&self, domain: Option<&Domain>) -> &DomainSeries {
        domain.and_then(|domain| self.domains.get(&domain.name)).unwrap_or(&self.unknown)
    }
}

impl DomainSeries {
    /// Counts one answered request.
    pub(crate) fn request(&self, code: Code) {
        self.requests[usize::from(code == Code::OverLimit)].increment(1);
    }

    /// Records the time one call took.
    pub(crate) fn duration(&self, elapsed: Duration) {
        self.duration.record(elapsed.as_secs_f64());
    }

    /// Counts one decision of `rule` (the rule `key` names in this domain) for one descriptor.
    pub(crate) fn decision(&self, rule: &Rule, key: &RuleKey, decision: Decision) {
        if let Some(label) = &key.detailed {
            if detailed(&self.name, label, decision) {
                return;
            }
            self.detailed_dropped
                .get_or_init(|| counter!(DETAILED_SERIES_DROPPED, "domain" => self.name.to_string()))
                .increment(1);
        }
        let Some(rule_series) = self.rule_series(key) else { return };
        let label = || match key.detailed {
            Some(_) => format!("{}{OTHER_VALUES}", rule_label(rule)),
            None => rule_label(rule).to_owned(),
        };
        rule_series.decision(&self.name, label, decision).increment(1);
    }

    fn rule_series(&self, key: &RuleKey) -> Option<&RuleSeries> {
        match key.index {
            Some(index) => self.rules.get(index),
            None => Some(&self.overrides),
        }
    }

    /// Counts a descriptor `rule` would have denied, were it not in shadow mode.
    pub(crate) fn shadow_denial(&self, rule: &Rule, key: &RuleKey, reason: Exhaustion) {
        let Some(rule_series) = self.rule_series(key) else { return };
        rule_series.shadow[reason_index(reason)]
            .get_or_init(|| {
                counter!(
                    SHADOW_DENIALS,
                    "domain" => self.name.to_string(),
                    "rule" => rule_label(rule).to_owned(),
                    "reason" => reason_label(reason),
                )
            })
            .increment(1);
    }

    /// Counts a descriptor whose new key found its store full.
    pub(crate) fn storage_full(&self) {
        self.storage_full
            .get_or_init(|| counter!(STORAGE_FULL, "domain" => self.name.to_string()))
            .increment(1);
    }

    /// Counts a call whose backend failed.
    pub(crate) fn backend_failure(&self, consumption: ConsumptionStatus) {
        let label = match consumption {
            ConsumptionStatus::Consumed => "consumed",
            ConsumptionStatus::NotConsumed => "not_consumed",
            ConsumptionStatus::MayHaveBeenConsumed => "may_have_been_consumed",
        };
        self.backend_failures[consumption_index(consumption)]
            .get_or_init(
                || counter!(BACKEND_FAILURES, "domain" => self.name.to_string(), "consumption" => label),
            )
            .increment(1);
    }
}

/// The `detailed_metric` series of the process, by domain and detailed label (at most
/// [`MAX_DETAILED_RULE_VALUES`] labels in all), each decision's counter resolved on first use.
struct DetailedSeries {
    domains: HashMap<Box<str>, HashMap<Box<str>, DecisionCounters>>,
    values: usize,
}

/// One label's counters, by [`Decision::index`].
type DecisionCounters = [Option<Counter>; 4];

static DETAILED: Mutex<Option<DetailedSeries>> = Mutex::new(None);

/// Counts `decision` under the detailed `label` of `domain`; `false` when the label is not
/// recorded (too long, or the process has its [`MAX_DETAILED_RULE_VALUES`] already).
fn detailed(domain: &str, label: &str, decision: Decision) -> bool {
    if label.len() > MAX_DETAILED_LABEL_LEN {
        return false;
    }
    // Nothing that can panic runs under this lock but the recorder's registration; the map
    // only ever holds complete entries, so a poisoned lock is used as it is.
    let mut guard = DETAILED.lock().unwrap_or_else(PoisonError::into_inner);
    let state = guard.get_or_insert_with(|| DetailedSeries { domains: HashMap::new(), values: 0 });
    let full = state.values >= MAX_DETAILED_RULE_VALUES;
    if !state.domains.contains_key(domain) {
        if full {
            return false;
        }
        state.domains.insert(domain.into(), HashMap::new());
    }
    let Some(labels) = state.domains.get_mut(domain) else { return false };
    let counters = match labels.get_mut(label) {
        Some(counters) => counters,
        None if full => return false,
        None => {
            state.values += 1;
            labels.entry(label.into()).or_default()
        }
    };
    counters[decision.index()]
        .get_or_insert_with(|| {
            counter!(
                RULE_DECISIONS,
                "domain" => domain.to_owned(),
                "rule" => label.to_owned(),
                "decision" => decision.label(),
            )
        })
        .increment(1);
    true
}

pub(crate) fn config_reloaded(success: bool) {
    counter!(CONFIG_RELOADS, "result" => if success { "success" } else { "failure" }).increment(1);
}

/// Sets the config age gauge to the time since `loaded_at` (called when rendering a scrape).
pub(crate) fn set_config_age(loaded_at: std::time::SystemTime) {
    let age = std::time::SystemTime::now().duration_since(loaded_at).unwrap_or_default();
    metrics::gauge!(CONFIG_AGE).set(age.as_secs_f64());
}

pub(crate) fn reason_label(reason: Exhaustion) -> &'static str {
    match reason {
        Exhaustion::Quota { .. } => "quota",
        Exhaustion::Never => "never",
        Exhaustion::StorageCapacity { .. } => "storage_capacity",
    }
}

const fn reason_index(reason: Exhaustion) -> usize {
    match reason {
        Exhaustion::Quota { .. } => 0,
        Exhaustion::Never => 1,
        Exhaustion::StorageCapacity { .. } => 2,
    }
}

const fn consumption_index(consumption: ConsumptionStatus) -> usize {
    match consumption {
        ConsumptionStatus::Consumed => 0,
        ConsumptionStatus::NotConsumed => 1,
        ConsumptionStatus::MayHaveBeenConsumed => 2,
    }
}

#[cfg(test)]
mod tests {
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::{
        RateLimitDescriptor, rate_limit_descriptor::Entry,
    };

    use super::detailed_label;
    use crate::{config::RuleTable, matcher::match_entries};

    /// The detailed label of `entries` in domain `d` of `yaml`, as the service computes it.
    fn label(yaml: &str, entries: &[(&str, &str)]) -> String {
        let table = RuleTable::from_sources([("test.yaml", yaml)]).expect("valid rules");
        let domain = table.domain("d").expect("domain d");
        let descriptor = RateLimitDescriptor {
            entries: entries
                .iter()
                .map(|(key, value)| Entry { key: (*key).to_owned(), value: (*value).to_owned() })
                .collect(),
            ..RateLimitDescriptor::default()
        };
        let pairs = entries.iter().copied();
        let matched = match_entries(domain, pairs, &mut String::new()).expect("a matched rule");
        assert!(matched.rule(domain).expect("the rule").detailed_metric);
        detailed_label(domain, &descriptor, &matched.shared)
    }

    #[test]
    fn a_detailed_label_is_the_domain_and_every_entry_as_envoyproxy_ratelimit_writes_it() {
        let yaml = "domain: d
descriptors:
  - key: tenant
    value: acme
    descriptors:
      - key: user
        detailed_metric: true
        rate_limit: { unit: hour, requests_per_unit: 1 }
";
        assert_eq!(label(yaml, &[("tenant", "acme"), ("user", "u1")]), "d.tenant_acme.user_u1");
    }

    #[test]
    fn an_entry_matched_by_a_share_threshold_rule_shows_its_pattern_not_its_value() {
        let yaml = "domain: d
descriptors:
  - key: path
    value: /api/*
    share_threshold: true
    descriptors:
      - key: user
        detailed_metric: true
        rate_limit: { unit: hour, requests_per_unit: 1 }
";
        assert_eq!(label(yaml, &[("path", "/api/export"), ("user", "u1")]), "d.path_/api/*.user_u1");
    }
}
