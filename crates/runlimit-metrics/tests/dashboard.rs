//! The Grafana dashboard shipped in `dashboards/runlimit.json` queries only metrics this crate
//! exports, and shows every one of them.

use std::collections::BTreeSet;

use runlimit_metrics::names;

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
fn the_series_check_rejects_what_is_not_exported() {
    assert!(names::is_exported_series("runlimit_admissions_total"));
    assert!(names::is_exported_series("runlimit_admission_duration_seconds_bucket"));
    assert!(!names::is_exported_series("runlimit_admissions"));
    assert!(!names::is_exported_series("runlimit_admissions_total_bucket"));
    assert!(!names::is_exported_series("runlimit_admission_duration_seconds_max"));
}
