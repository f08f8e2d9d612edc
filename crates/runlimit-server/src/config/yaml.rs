//! The YAML documents, as serde reads them: envoyproxy/ratelimit's rule file format plus
//! Runlimit's marked extensions (`algorithm`, `burst`).
//!
//! Every struct denies unknown fields, so a misspelled key is an error naming the path and the
//! keys allowed there. Optional fields are `Option`s even where the format requires them, so a
//! missing one is reported by [`RuleTable::from_sources`](super::RuleTable::from_sources) with the path and a sentence, not as
//! serde's bare "missing field".

use serde::Deserialize;

/// One rule file: a domain and its rules.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct FileDoc {
    pub(crate) domain: Option<String>,
    pub(crate) descriptors: Option<Vec<RuleDoc>>,
}

/// One entry of a `descriptors` list.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RuleDoc {
    pub(crate) key: Option<String>,
    pub(crate) value: Option<String>,
    pub(crate) rate_limit: Option<RateLimitDoc>,
    pub(crate) descriptors: Option<Vec<Self>>,
    pub(crate) shadow_mode: Option<bool>,
    pub(crate) quota_mode: Option<bool>,
    /// The matched rule's `rule` label in the per-rule metrics is the descriptor's values
    /// (`domain.key1_value1.key2_value2`, as envoyproxy/ratelimit names its detailed stats),
    /// capped per process (see the `metrics` module).
    pub(crate) detailed_metric: Option<bool>,
    /// Accepted; it shapes envoyproxy/ratelimit's statistics names, and this service's
    /// metrics carry no descriptor value unless `detailed_metric` says so.
    #[allow(dead_code, reason = "read only to accept the key")]
    pub(crate) value_to_metric: Option<bool>,
    pub(crate) share_threshold: Option<bool>,
    /// Accepted for compatibility and ignored: envoyproxy/ratelimit copies it into a
    /// response's dynamic metadata, which this service does not send.
    #[allow(dead_code, reason = "read only to accept the key")]
    pub(crate) metadata: Option<serde_norway::Value>,
}

/// A `rate_limit` block.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RateLimitDoc {
    pub(crate) unit: Option<String>,
    pub(crate) requests_per_unit: Option<u32>,
    pub(crate) unlimited: Option<bool>,
    pub(crate) name: Option<String>,
    pub(crate) replaces: Option<Vec<ReplacesDoc>>,
    /// Extension: `fixed_window` (the default) or `gcra`.
    pub(crate) algorithm: Option<String>,
    /// Extension: the GCRA burst capacity (with `algorithm: gcra` only).
    pub(crate) burst: Option<u64>,
}

/// An entry of `replaces`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ReplacesDoc {
    pub(crate) name: Option<String>,
}
