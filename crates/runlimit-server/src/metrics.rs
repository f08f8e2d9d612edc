//! The service's own metrics, recorded through the `metrics` facade (the binary installs a
//! Prometheus recorder and serves it on `GET /metrics`; an embedder installs its own).
//!
//! Labels come from the rule files only, never from a request: `domain` is a configured domain
//! (requests for an unknown domain are counted under `domain=""`), `rule` a rule's path
//! (`domain.key_value.key`, as written in the files). No descriptor value is ever a label.

use std::collections::HashMap;

use metrics::{Counter, counter};
use runlimit_core::ConsumptionStatus;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;

use crate::{
    config::{Domain, Rule, RuleTable},
    service::Exhaustion,
};

/// `runlimit_server_requests_total{domain, code}`: answered `ShouldRateLimit` calls by overall
/// code (`ok`, `over_limit`); malformed requests and backend errors answered with a gRPC error
/// are not counted here.
pub(crate) const REQUESTS: &str = "runlimit_server_requests_total";
/// `runlimit_server_shadow_denials_total{domain, rule, reason}`: descriptors a shadow-mode rule
/// would have denied (`reason`: `quota`; `never` for a limit of 0 or hits above it;
/// `storage_capacity` for a full store after the request's enforced rules were charged). A
/// limit override's `rule` is `DOMAIN.(override)`.
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

/// Describes every metric to the installed recorder.
pub(crate) fn describe() {
    metrics::describe_counter!(REQUESTS, "ShouldRateLimit calls answered, by domain and overall code");
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

/// The request counters of every domain of a table, registered once with the recorder
/// installed when they are built (the process's hot path then only increments a handle;
/// looking a counter up by its labels on every request cost a fifth of the service's own
/// time). Without a recorder the handles do nothing.
pub(crate) struct RequestCounters {
    domains: HashMap<Box<str>, [Counter; 2]>,
    unknown: [Counter; 2],
}

impl RequestCounters {
    pub(crate) fn new(table: &RuleTable) -> Self {
        let counters = |domain: &str| {
            ["ok", "over_limit"].map(|code| counter!(REQUESTS, "domain" => domain.to_owned(), "code" => code))
        };
        Self {
            domains: table.domains().map(|domain| (domain.name.clone(), counters(&domain.name))).collect(),
            unknown: counters(""),
        }
    }

    /// Counts one answered request of `domain` (`None`: a domain the table does not have).
    pub(crate) fn count(&self, domain: Option<&Domain>, code: Code) {
        let counters = domain.and_then(|domain| self.domains.get(&domain.name)).unwrap_or(&self.unknown);
        counters[usize::from(code == Code::OverLimit)].increment(1);
    }
}

pub(crate) fn shadow_denial(domain: &Domain, rule: &Rule, reason: Exhaustion) {
    counter!(
        SHADOW_DENIALS,
        "domain" => domain.name.to_string(),
        "rule" => rule.path.to_string(),
        "reason" => reason_label(reason),
    )
    .increment(1);
}

pub(crate) fn config_reloaded(success: bool) {
    counter!(CONFIG_RELOADS, "result" => if success { "success" } else { "failure" }).increment(1);
}

/// Sets the config age gauge to the time since `loaded_at` (called when rendering a scrape).
pub(crate) fn set_config_age(loaded_at: std::time::SystemTime) {
    let age = std::time::SystemTime::now().duration_since(loaded_at).unwrap_or_default();
    metrics::gauge!(CONFIG_AGE).set(age.as_secs_f64());
}

pub(crate) fn storage_full(domain: &Domain) {
    counter!(STORAGE_FULL, "domain" => domain.name.to_string()).increment(1);
}

pub(crate) fn backend_failure(domain: &Domain, consumption: ConsumptionStatus) {
    let consumption = match consumption {
        ConsumptionStatus::Consumed => "consumed",
        ConsumptionStatus::NotConsumed => "not_consumed",
        ConsumptionStatus::MayHaveBeenConsumed => "may_have_been_consumed",
    };
    counter!(BACKEND_FAILURES, "domain" => domain.name.to_string(), "consumption" => consumption)
        .increment(1);
}

pub(crate) fn reason_label(reason: Exhaustion) -> &'static str {
    match reason {
        Exhaustion::Quota { .. } => "quota",
        Exhaustion::Never => "never",
        Exhaustion::StorageCapacity { .. } => "storage_capacity",
    }
}
