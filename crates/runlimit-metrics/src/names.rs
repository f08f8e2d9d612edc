//! The metric names [`MetricsObserver`](crate::MetricsObserver) records, as Prometheus names.
//!
//! A Prometheus exporter renders a histogram `h` as the series `h_bucket`, `h_sum` and
//! `h_count` (or, without configured buckets, a summary: `h`, `h_sum`, `h_count`).

/// Counter: admissions, one per single check or atomic batch.
pub const ADMISSIONS_TOTAL: &str = "runlimit_admissions_total";
/// Counter: the checks of observed atomic batches (a batch of `n` adds `n`).
pub const BATCH_CHECKS_TOTAL: &str = "runlimit_batch_checks_total";
/// Histogram: backend time per admission, in seconds.
pub const ADMISSION_DURATION_SECONDS: &str = "runlimit_admission_duration_seconds";
/// Gauge: entries stored in a memory shard (live, or expired and not yet removed).
pub const SHARD_ENTRIES: &str = "runlimit_shard_entries";
/// Gauge: the fixed capacity of a memory shard, in entries.
pub const SHARD_CAPACITY_ENTRIES: &str = "runlimit_shard_capacity_entries";
/// Counter: bounded cleanup passes.
pub const CLEANUPS_TOTAL: &str = "runlimit_cleanups_total";
/// Counter: expired entries removed by cleanup passes that confirmed their count.
pub const CLEANUP_REMOVED_ENTRIES_TOTAL: &str = "runlimit_cleanup_removed_entries_total";
/// Histogram: time per cleanup pass, in seconds.
pub const CLEANUP_DURATION_SECONDS: &str = "runlimit_cleanup_duration_seconds";
/// Counter: operator resets of one subject's state.
pub const RESETS_TOTAL: &str = "runlimit_resets_total";
/// Histogram: time per reset, in seconds.
pub const RESET_DURATION_SECONDS: &str = "runlimit_reset_duration_seconds";
/// Counter: attempt admissions, completions and resets.
pub const ATTEMPTS_TOTAL: &str = "runlimit_attempts_total";
/// Histogram: time per attempt operation, in seconds.
pub const ATTEMPT_DURATION_SECONDS: &str = "runlimit_attempt_duration_seconds";

/// Every counter and gauge name.
pub const SCALARS: &[&str] = &[
    ADMISSIONS_TOTAL,
    BATCH_CHECKS_TOTAL,
    SHARD_ENTRIES,
    SHARD_CAPACITY_ENTRIES,
    CLEANUPS_TOTAL,
    CLEANUP_REMOVED_ENTRIES_TOTAL,
    RESETS_TOTAL,
    ATTEMPTS_TOTAL,
];

/// Every histogram name.
pub const HISTOGRAMS: &[&str] =
    &[ADMISSION_DURATION_SECONDS, CLEANUP_DURATION_SECONDS, RESET_DURATION_SECONDS, ATTEMPT_DURATION_SECONDS];

/// The label keys of each metric, in the order they are recorded.
pub const LABELS: &[(&str, &[&str])] = &[
    (ADMISSIONS_TOTAL, &["backend", "policy", "scope", "operation", "outcome", "consumption"]),
    (BATCH_CHECKS_TOTAL, &["backend", "outcome", "consumption"]),
    (ADMISSION_DURATION_SECONDS, &["backend", "policy", "scope", "operation", "outcome"]),
    (SHARD_ENTRIES, &["backend", "store", "shard"]),
    (SHARD_CAPACITY_ENTRIES, &["backend", "store", "shard"]),
    (CLEANUPS_TOTAL, &["backend", "outcome"]),
    (CLEANUP_REMOVED_ENTRIES_TOTAL, &["backend"]),
    (CLEANUP_DURATION_SECONDS, &["backend", "outcome"]),
    (RESETS_TOTAL, &["backend", "policy", "scope", "outcome"]),
    (RESET_DURATION_SECONDS, &["backend", "policy", "scope", "outcome"]),
    (ATTEMPTS_TOTAL, &["backend", "policy", "scope", "operation", "event"]),
    (ATTEMPT_DURATION_SECONDS, &["backend", "policy", "scope", "operation", "event"]),
];

/// The label keys of `metric` (a name of this module), or `None` for any other name.
#[must_use]
pub fn labels_of(metric: &str) -> Option<&'static [&'static str]> {
    LABELS.iter().find(|(name, _)| *name == metric).map(|(_, labels)| *labels)
}

/// Whether `series` is a Prometheus series name this crate's metrics render as: a counter or
/// gauge name, or a histogram name, alone or followed by `_bucket`, `_sum` or `_count`.
#[must_use]
pub fn is_exported_series(series: &str) -> bool {
    SCALARS.contains(&series)
        || HISTOGRAMS.iter().any(|histogram| {
            series
                .strip_prefix(histogram)
                .is_some_and(|rest| matches!(rest, "" | "_bucket" | "_sum" | "_count"))
        })
}
