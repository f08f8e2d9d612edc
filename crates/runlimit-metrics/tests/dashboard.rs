//! The Grafana dashboard shipped in `dashboards/runlimit.json` queries only metrics this crate
//! exports, and shows every one of them.

use std::collections::BTreeSet;

use runlimit_core::{
    AdmissionOutcome, CleanupOutcome, ConsumptionStatus, ResetOutcome,
    attempts::{AttemptDenialReason, AttemptEvent, AttemptOperation, AttemptOutcome},
};
use runlimit_metrics::{labels, names};

/// Every value the enum-valued labels can take, from the crate's own name functions.
fn enum_values(key: &str) -> Option<BTreeSet<&'static str>> {
    let outcomes = [AttemptOutcome::Success, AttemptOutcome::Failure, AttemptOutcome::Abandoned];
    let values: Vec<&'static str> = match key {
        "outcome" => [
            AdmissionOutcome::Allowed,
            AdmissionOutcome::ShadowDenied,
            AdmissionOutcome::QuotaExceeded,
            AdmissionOutcome::StorageCapacity,
            AdmissionOutcome::InvalidBatch,
            AdmissionOutcome::Failed,
        ]
        .into_iter()
        .map(labels::outcome)
        .chain(
            [CleanupOutcome::Removed { count: 0 }, CleanupOutcome::NoEffect, CleanupOutcome::Unknown]
                .into_iter()
                .map(labels::cleanup_outcome),
        )
        .chain(
            [
                ResetOutcome::Removed,
                ResetOutcome::NothingStored,
                ResetOutcome::NoEffect,
                ResetOutcome::Unknown,
            ]
            .into_iter()
            .map(labels::reset_outcome),
        )
        .collect(),
        "consumption" => [
            ConsumptionStatus::Consumed,
            ConsumptionStatus::NotConsumed,
            ConsumptionStatus::MayHaveBeenConsumed,
        ]
        .into_iter()
        .map(labels::consumption)
        .collect(),
        "operation" => [labels::CHECK, labels::BATCH]
            .into_iter()
            .chain(
                [AttemptOperation::Admission, AttemptOperation::Reset]
                    .into_iter()
                    .chain(outcomes.map(AttemptOperation::Completion))
                    .map(labels::attempt_operation),
            )
            .collect(),
        "event" => [
            AttemptEvent::Admitted,
            AttemptEvent::Denied(AttemptDenialReason::InProgress),
            AttemptEvent::Denied(AttemptDenialReason::Backoff),
            AttemptEvent::Denied(AttemptDenialReason::StorageCapacity),
            AttemptEvent::Stale,
            AttemptEvent::Reset { had_live_state: true },
            AttemptEvent::Reset { had_live_state: false },
            AttemptEvent::UncertainCommit,
            AttemptEvent::Failed,
        ]
        .into_iter()
        .chain(outcomes.map(AttemptEvent::Completed))
        .map(labels::attempt_event)
        .collect(),
        _ => return None,
    };
    Some(values.into_iter().collect())
}

/// The label keys a series name carries: its metric's, plus `le` for a histogram's buckets.
fn series_labels(series: &str) -> BTreeSet<&'static str> {
    let metric = ["_bucket", "_sum", "_count"]
        .iter()
        .find_map(|suffix| series.strip_suffix(suffix).filter(|base| names::HISTOGRAMS.contains(base)))
        .unwrap_or(series);
    let mut keys: BTreeSet<&'static str> =
        names::labels_of(metric).unwrap_or_else(|| panic!("{metric} has labels")).iter().copied().collect();
    if series.ends_with("_bucket") {
        keys.insert("le");
    }
    keys
}

/// Checks every `{key op "value"}` matcher and every `by (...)` grouping of `expr` against
/// the labels its series carry and the values the enum labels can take.
fn check_labels(expr: &str) {
    let available: BTreeSet<&str> = runlimit_identifiers(expr).into_iter().flat_map(series_labels).collect();
    // Matchers: each `{...}` directly after a series name.
    for (index, _) in expr.match_indices('{') {
        let series = runlimit_identifiers(&expr[..index]).pop().expect("a matcher follows a series name");
        assert!(expr[..index].ends_with(series), "a matcher follows {series} directly in {expr}");
        let body = &expr[index + 1..index + expr[index..].find('}').expect("closed matcher")];
        for matcher in body.split(',').map(str::trim).filter(|matcher| !matcher.is_empty()) {
            let (key, rest) = matcher.split_at(matcher.find(['=', '!']).expect("an operator"));
            let key = key.trim();
            assert!(series_labels(series).contains(key), "{series} has no label {key} ({expr})");
            let value = rest.trim_start_matches(['=', '!', '~']).trim().trim_matches('"');
            if let Some(values) = enum_values(key) {
                for alternative in value.split('|') {
                    assert!(values.contains(alternative), "{key}={alternative:?} is never recorded ({expr})");
                }
            }
        }
    }
    // Groupings.
    for (index, _) in expr.match_indices("by (") {
        let group = &expr[index + 4..index + expr[index..].find(')').expect("closed grouping")];
        for key in group.split(',').map(str::trim) {
            assert!(available.contains(key), "grouping by {key}, which none of its series carries ({expr})");
        }
    }
}

/// Every `expr` string in the dashboard, wherever it is nested.
fn expressions(value: &serde_json::Value, found: &mut Vec<String>) {
    match value {
        serde_json::Value::Object(map) => {
            for (key, value) in map {
                match (key.as_str(), value) {
                    ("expr", serde_json::Value::String(expr)) => found.push(expr.clone()),
                    _ => expressions(value, found),
                }
            }
        }
        serde_json::Value::Array(items) => items.iter().for_each(|item| expressions(item, found)),
        _ => {}
    }
}

/// The PromQL identifiers of `expr` that start with `runlimit_` (metric names; label names and
/// functions never do).
fn runlimit_identifiers(expr: &str) -> Vec<&str> {
    expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
        .filter(|word| word.starts_with("runlimit_"))
        .collect()
}

#[test]
fn every_dashboard_query_names_an_exported_metric_and_every_metric_is_shown() {
    let source = include_str!("../dashboards/runlimit.json");
    let dashboard: serde_json::Value = serde_json::from_str(source).expect("the dashboard is JSON");
    let mut found = Vec::new();
    expressions(&dashboard, &mut found);
    assert!(found.len() >= 10, "the dashboard has its queries: {found:?}");
    let mut shown = BTreeSet::new();
    for expr in &found {
        check_labels(expr);
        let identifiers = runlimit_identifiers(expr);
        assert!(!identifiers.is_empty(), "query names no runlimit metric: {expr}");
        for identifier in identifiers {
            assert!(names::is_exported_series(identifier), "{identifier} (in {expr}) is not exported");
            let metric = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|suffix| {
                    identifier.strip_suffix(suffix).filter(|base| names::HISTOGRAMS.contains(base))
                })
                .unwrap_or(identifier);
            shown.insert(metric.to_owned());
        }
    }
    let exported: BTreeSet<String> =
        names::SCALARS.iter().chain(names::HISTOGRAMS).map(|name| (*name).to_owned()).collect();
    assert_eq!(shown, exported, "every exported metric has a panel");
}

#[test]
#[should_panic(expected = "is never recorded")]
fn a_misspelt_label_value_fails_the_check() {
    check_labels(r#"sum(rate(runlimit_admissions_total{outcome="quota_exceded"}[5m]))"#);
}

#[test]
#[should_panic(expected = "none of its series carries")]
fn grouping_by_a_missing_label_fails_the_check() {
    check_labels("sum by (policy) (rate(runlimit_batch_checks_total[5m]))");
}

#[test]
fn the_series_check_rejects_what_is_not_exported() {
    assert!(names::is_exported_series("runlimit_admissions_total"));
    assert!(names::is_exported_series("runlimit_admission_duration_seconds_bucket"));
    assert!(!names::is_exported_series("runlimit_admissions"));
    assert!(!names::is_exported_series("runlimit_admissions_total_bucket"));
    assert!(!names::is_exported_series("runlimit_admission_duration_seconds_max"));
}
