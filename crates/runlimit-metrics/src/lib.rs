//! Metrics for Runlimit, recorded through the [`metrics`](https://docs.rs/metrics/0.24) facade.
//!
//! [`MetricsObserver`] is an [`Observer`] and an [`AttemptObserver`]: give it to a store's
//! `with_observer` (memory, PostgreSQL, or any other Runlimit backend) and every admission,
//! cleanup, reset and attempt operation becomes counters, gauges and histograms on whatever
//! recorder the application installed, such as `metrics-exporter-prometheus`.
//!
//! ```
//! use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
//! use runlimit_memory::{GcraStore, MemoryStore, MemoryStoreConfig};
//! use runlimit_metrics::MetricsObserver;
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // 1. Install the recorder first: an observer keeps the handles of the recorder it first
//! //    records into. Buckets turn the `*_seconds` samples into histograms.
//! let prometheus = PrometheusBuilder::new()
//!     .set_buckets_for_metric(Matcher::Suffix("_seconds".to_owned()), &[1e-5, 1e-4, 1e-3, 1e-2, 0.1, 1.0])?
//!     .install_recorder()?;
//! // 2. Describe the metrics to it (units and help texts), once.
//! MetricsObserver::describe();
//! // 3. One observer per store; name each memory store so its shard gauges are its own.
//! let config = MemoryStoreConfig::new(10_000)?;
//! let logins = MemoryStore::builder(config).with_observer(MetricsObserver::new("memory").with_store("logins")).build();
//! let reads = GcraStore::builder(config).with_observer(MetricsObserver::new("memory").with_store("reads")).build();
//! # let _ = (logins, reads);
//! // 4. Serve `prometheus.render()` (Prometheus text) on the application's `/metrics` route,
//! //    and call `prometheus.run_upkeep()` every few seconds from a background task.
//! let text: String = prometheus.render();
//! # let _ = text;
//! # Ok(())
//! # }
//! ```
//!
//! # The `metrics` version
//!
//! This crate records through `metrics` **0.24** (tested with 0.24.6). The facade is pre-1.0:
//! an application whose recorder is built on another minor version (0.23, 0.25) installs it in
//! a different global slot, and every observation is silently dropped. Check with `cargo tree
//! -i metrics` that one 0.24 version is in the graph. Histograms are recorded as raw samples;
//! choose buckets in the exporter (for `metrics-exporter-prometheus`,
//! `PrometheusBuilder::set_buckets_for_metric` with `Matcher::Suffix("_seconds")`), or it
//! renders summaries.
//!
//! # The metrics
//!
//! Names are Prometheus names (counters end in `_total`, durations are `_seconds`); the
//! OpenTelemetry name and unit to use when bridging are given beside each (see
//! [OpenTelemetry](#opentelemetry)). Every name is also a constant in [`names`].
//!
//! | Prometheus name | type | labels | OpenTelemetry name (unit) |
//! |---|---|---|---|
//! | `runlimit_admissions_total` | counter | `backend`, `policy`, `scope`, `operation`, `outcome`, `consumption` | `runlimit.admissions` (`{admission}`) |
//! | `runlimit_batch_checks_total` | counter | `backend`, `outcome`, `consumption` | `runlimit.batch.checks` (`{check}`) |
//! | `runlimit_admission_duration_seconds` | histogram | `backend`, `policy`, `scope`, `operation`, `outcome` | `runlimit.admission.duration` (`s`) |
//! | `runlimit_shard_entries` | gauge | `backend`, `store`, `shard` | `runlimit.shard.entries` (`{entry}`) |
//! | `runlimit_shard_capacity_entries` | gauge | `backend`, `store`, `shard` | `runlimit.shard.capacity` (`{entry}`) |
//! | `runlimit_cleanups_total` | counter | `backend`, `outcome` | `runlimit.cleanups` (`{cleanup}`) |
//! | `runlimit_cleanup_removed_entries_total` | counter | `backend` | `runlimit.cleanup.removed` (`{entry}`) |
//! | `runlimit_cleanup_duration_seconds` | histogram | `backend`, `outcome` | `runlimit.cleanup.duration` (`s`) |
//! | `runlimit_resets_total` | counter | `backend`, `policy`, `scope`, `outcome` | `runlimit.resets` (`{reset}`) |
//! | `runlimit_reset_duration_seconds` | histogram | `backend`, `policy`, `scope`, `outcome` | `runlimit.reset.duration` (`s`) |
//! | `runlimit_attempts_total` | counter | `backend`, `policy`, `scope`, `operation`, `event` | `runlimit.attempts` (`{operation}`) |
//! | `runlimit_attempt_duration_seconds` | histogram | `backend`, `policy`, `scope`, `operation`, `event` | `runlimit.attempt.duration` (`s`) |
//!
//! What one observation counts:
//!
//! - **One admission is one count**, whatever its size: a single check adds 1 to
//!   `runlimit_admissions_total` with `operation="check"`; an atomic batch of any size adds 1
//!   with `operation="batch"` (it was admitted or refused as one). A batch's `policy` and
//!   `scope` are those of the one member its outcome singles out (the denied or shadow-denied
//!   check), and empty (`""`, which Prometheus treats as an absent label) when the
//!   observation singles out no member (an allowed batch, and invalid or failed batches that
//!   name none). `runlimit_batch_checks_total` adds the batch's number of checks, for the
//!   members, except for a batch rejected as invalid (its size is whatever the caller sent,
//!   and none of its checks was evaluated).
//! - `consumption` is the backend's [`ConsumptionStatus`], not inferred from the outcome: a
//!   shadow denial is admitted but `not_consumed`, and a failed PostgreSQL commit is
//!   `may_have_been_consumed`, never `consumed`.
//! - Durations are the backend's exact elapsed time, in seconds as `f64` (not rounded to the
//!   whole seconds of the HTTP fields).
//! - The shard gauges are set from the headroom a bounded memory store reports with each
//!   admission (the touched shard; a batch's fullest shard): entries stored (live or expired
//!   and not yet removed) and the shard's fixed capacity. `shard` is the shard's index, so
//!   these series number at most the store's shard count. They are a sample, not an exact
//!   count: observations run after the shard lock is released, so two concurrent admissions
//!   on a shard may set the gauge out of order, and resets and cleanups do not set it; the
//!   next admission on the shard corrects it. **Name each memory store** with
//!   [`MetricsObserver::with_store`] when there are several: stores observed under the same
//!   `backend` and `store` share their shard series.
//! - A cleanup pass adds 1 to `runlimit_cleanups_total` and, when it confirmed a count, that
//!   count to `runlimit_cleanup_removed_entries_total`. Memory stores have no separate cleanup
//!   pass: each admission removes expired entries of its shard, and reports that work as a
//!   cleanup observation only when it removed at least one entry.
//! - Each attempt admission, completion or reset adds 1 to `runlimit_attempts_total`.
//!
//! # Label values
//!
//! Labels come only from exhaustive enums and from configured identifiers, so the number of
//! series does not grow with traffic: `backend` is the `&'static str` given to
//! [`MetricsObserver::new`] and `store` the one given to [`MetricsObserver::with_store`], `policy` and `scope` are the policy's validated
//! [`PolicyId`](runlimit_core::PolicyId) and [`ScopeId`](runlimit_core::ScopeId), and every
//! other value is one of the names in [`labels`]. No subject, key, digest, address or error text
//! is ever a label value: observations do not carry them.
//!
//! # OpenTelemetry
//!
//! There is no OpenTelemetry adapter in this crate. Bridge either way: let the OpenTelemetry
//! Collector scrape the Prometheus endpoint (its `prometheus` receiver), or install a `metrics`
//! recorder that forwards to an OpenTelemetry `Meter`; the table above gives the names and
//! units to map to.
//!
//! # Cost
//!
//! Looking a metric up in a recorder (building its key, hashing it, finding it in the
//! registry) costs far more than a memory-store check, so an observer resolves each label set
//! once and keeps the handles: an observation hashes one small key (the policy fingerprint and
//! the enum values), then updates atomics. Clones of an observer share its handles. At most
//! [`MAX_CACHED_LABEL_SETS`] label sets per kind of metric are kept; observations beyond that
//! are recorded without a cache. One policy has at most 36 admission label sets (2 operations ×
//! 6 outcomes × 3 consumption statuses), and changing a policy's parameters changes its
//! fingerprint, so a process reaches the bound only with about a hundred policies or
//! configurations or more. Handles are keyed by the policy's fingerprint, which
//! [`PolicyFingerprint::derive`] computes over the policy's identifier and scope, so one
//! fingerprint always stands for one `policy` and `scope` label pair. The crate's
//! `cargo bench` measures the cost on a memory-store check, with a Prometheus recorder
//! installed versus no observer.
//!
//! Because handles are kept, do not let the exporter delete idle series (for
//! `metrics-exporter-prometheus`, leave `idle_timeout` unset): a deleted series' handles no
//! longer reach the registry, and it would not reappear.

use std::{
    collections::HashMap,
    hash::Hash,
    sync::{Arc, PoisonError, RwLock},
    time::Duration,
};

use metrics::{Counter, Gauge, Histogram, Label, SharedString, Unit};
use runlimit_core::{
    AdmissionObservation, AdmissionOperation, AdmissionOutcome, AdmissionPolicy, CleanupObservation,
    CleanupOutcome, ConsumptionStatus, Observation, Observer, PolicyFingerprint, ResetObservation,
    ResetOutcome,
    attempts::{AttemptEvent, AttemptObservation, AttemptObserver, AttemptOperation},
};

pub mod labels;
pub mod names;

/// The most label sets an observer keeps resolved handles for, per kind of metric (admissions,
/// shards, cleanups, resets, attempts).
pub const MAX_CACHED_LABEL_SETS: usize = 4_096;

/// An [`Observer`] and [`AttemptObserver`] that records every observation through the
/// [`metrics`](https://docs.rs/metrics/0.24) facade (see the [crate docs](crate) for the metric set and what each counts).
///
/// The recorder is the one the `metrics` facade resolves (the global recorder, or the
/// thread's local one) when a label set is first observed; its handles are kept from then on
/// (see [Cost](crate#cost)), so install the recorder before the first observation. Clones
/// share the kept handles.
#[derive(Clone, Debug)]
pub struct MetricsObserver {
    backend: &'static str,
    store: &'static str,
    handles: Arc<Handles>,
}

/// Resolved handles, per label set.
#[derive(Debug, Default)]
struct Handles {
    admissions: Cache<AdmissionKey, AdmissionHandles>,
    /// `runlimit_shard_entries` and `runlimit_shard_capacity_entries`, per shard.
    shards: Cache<usize, [Gauge; 2]>,
    cleanups: Cache<&'static str, [Counter; 2]>,
    cleanup_durations: Cache<&'static str, Histogram>,
    resets: Cache<(PolicyFingerprint, ResetOutcome), (Counter, Histogram)>,
    attempts: Cache<(PolicyFingerprint, AttemptOperation, AttemptEvent), (Counter, Histogram)>,
}

/// What an admission's series depend on: its policy, operation, outcome and consumption.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct AdmissionKey {
    policy: Option<PolicyFingerprint>,
    batch: bool,
    outcome: AdmissionOutcome,
    consumption: ConsumptionStatus,
}

#[derive(Debug)]
struct AdmissionHandles {
    admissions: Counter,
    duration: Histogram,
    /// `runlimit_batch_checks_total`, for batches.
    batch_checks: Option<Counter>,
}

/// Handles kept per label set, up to [`MAX_CACHED_LABEL_SETS`].
///
/// A poisoned lock is used as is: nothing that can panic runs under the write lock, and the map
/// only ever holds complete entries.
///
/// Keys are hashed with `foldhash` (hashbrown's default hasher, randomly seeded per cache):
/// they are a policy fingerprint and enum values, so the flood resistance of the standard
/// library's SipHash buys nothing here, and it cost a tenth of an observation.
#[derive(Debug)]
struct Cache<K, V> {
    map: RwLock<HashMap<K, V, foldhash::fast::RandomState>>,
}

impl<K, V> Default for Cache<K, V> {
    fn default() -> Self {
        Self { map: RwLock::new(HashMap::default()) }
    }
}

impl<K: Hash + Eq, V> Cache<K, V> {
    /// Runs `record` on the handles of `key`, resolving them with `resolve` on first use.
    fn with(&self, key: K, resolve: impl FnOnce() -> V, record: impl FnOnce(&V)) {
        {
            let map = self.map.read().unwrap_or_else(PoisonError::into_inner);
            if let Some(handles) = map.get(&key) {
                record(handles);
                return;
            }
        }
        let handles = resolve();
        record(&handles);
        let mut map = self.map.write().unwrap_or_else(PoisonError::into_inner);
        if map.len() < MAX_CACHED_LABEL_SETS {
            map.entry(key).or_insert(handles);
        }
    }
}

impl MetricsObserver {
    /// An observer whose metrics carry `backend` as their `backend` label (for example
    /// `"memory"`, `"postgres"`): a name the application chooses from its configuration,
    /// never from request data (hence `&'static str`).
    #[must_use]
    pub fn new(backend: &'static str) -> Self {
        Self { backend, store: "", handles: Arc::default() }
    }

    /// The same observer with `store` as the `store` label of its shard gauges, for an
    /// application with several memory stores: each store's shards are then series of their
    /// own (`store="login-client"`, `store="items"`), where stores observed without distinct
    /// names would share them. Empty (`""`, an absent label) unless set. Handles kept so far
    /// are not shared with the returned observer.
    #[must_use]
    pub fn with_store(self, store: &'static str) -> Self {
        Self { backend: self.backend, store, handles: Arc::default() }
    }

    /// The `store` label of the shard gauges (`""` unless [`with_store`](Self::with_store)).
    #[must_use]
    pub const fn store(&self) -> &'static str {
        self.store
    }

    /// The `backend` label.
    #[must_use]
    pub const fn backend(&self) -> &'static str {
        self.backend
    }

    /// Registers each metric's unit and description with the currently installed recorder.
    /// Optional (metrics are recorded without it); call it once after installing the
    /// recorder, since descriptions given to no recorder are lost.
    pub fn describe() {
        use metrics::{describe_counter, describe_gauge, describe_histogram};
        describe_counter!(names::ADMISSIONS_TOTAL, Unit::Count, "Admissions (one per check or atomic batch)");
        describe_counter!(names::BATCH_CHECKS_TOTAL, Unit::Count, "Checks in observed atomic batches");
        describe_histogram!(names::ADMISSION_DURATION_SECONDS, Unit::Seconds, "Backend time per admission");
        describe_gauge!(names::SHARD_ENTRIES, Unit::Count, "Entries stored in a memory shard");
        describe_gauge!(names::SHARD_CAPACITY_ENTRIES, Unit::Count, "Fixed capacity of a memory shard");
        describe_counter!(names::CLEANUPS_TOTAL, Unit::Count, "Bounded cleanup passes");
        describe_counter!(
            names::CLEANUP_REMOVED_ENTRIES_TOTAL,
            Unit::Count,
            "Expired entries removed by cleanup"
        );
        describe_histogram!(names::CLEANUP_DURATION_SECONDS, Unit::Seconds, "Time per cleanup pass");
        describe_counter!(names::RESETS_TOTAL, Unit::Count, "Operator resets of one subject");
        describe_histogram!(names::RESET_DURATION_SECONDS, Unit::Seconds, "Time per reset");
        describe_counter!(names::ATTEMPTS_TOTAL, Unit::Count, "Attempt admissions, completions and resets");
        describe_histogram!(names::ATTEMPT_DURATION_SECONDS, Unit::Seconds, "Time per attempt operation");
    }

    fn label(&self) -> Label {
        Label::from_static_parts(labels::BACKEND, self.backend)
    }

    fn admission(&self, admission: &AdmissionObservation<'_>) {
        let (size, policy) = match admission.operation() {
            AdmissionOperation::Check { policy } => (None, Some(policy)),
            AdmissionOperation::Batch { size, policy } => (Some(size), policy),
        };
        let (outcome, consumption) = (admission.outcome(), admission.consumption());
        let key = AdmissionKey {
            policy: policy.map(|policy| *policy.fingerprint()),
            batch: size.is_some(),
            outcome,
            consumption,
        };
        let resolve = || {
            let operation = if size.is_some() { labels::BATCH } else { labels::CHECK };
            let [policy, scope] = policy_labels(policy);
            let outcome = Label::from_static_parts(labels::OUTCOME, labels::outcome(outcome));
            let consumption = Label::from_static_parts(labels::CONSUMPTION, labels::consumption(consumption));
            let common =
                vec![self.label(), policy, scope, Label::from_static_parts(labels::OPERATION, operation)];
            let duration = [common.clone(), vec![outcome.clone()]].concat();
            AdmissionHandles {
                admissions: metrics::counter!(
                    names::ADMISSIONS_TOTAL,
                    [common, vec![outcome.clone(), consumption.clone()]].concat()
                ),
                duration: metrics::histogram!(names::ADMISSION_DURATION_SECONDS, duration),
                batch_checks: size.filter(|_| admission.outcome() != AdmissionOutcome::InvalidBatch).map(
                    |_| {
                        metrics::counter!(names::BATCH_CHECKS_TOTAL, vec![self.label(), outcome, consumption])
                    },
                ),
            }
        };
        self.handles.admissions.with(key, resolve, |handles| {
            handles.admissions.increment(1);
            handles.duration.record(seconds(admission.elapsed()));
            if let (Some(counter), Some(size)) = (&handles.batch_checks, size) {
                counter.increment(u64::try_from(size).unwrap_or(u64::MAX));
            }
        });
        if let Some(headroom) = admission.shard_headroom() {
            let resolve = || {
                let shard = vec![
                    self.label(),
                    Label::from_static_parts(labels::STORE, self.store),
                    Label::new(labels::SHARD, headroom.shard_index.to_string()),
                ];
                [
                    metrics::gauge!(names::SHARD_ENTRIES, shard.clone()),
                    metrics::gauge!(names::SHARD_CAPACITY_ENTRIES, shard),
                ]
            };
            self.handles.shards.with(headroom.shard_index, resolve, |[entries, capacity]| {
                entries.set(count(headroom.entries));
                capacity.set(count(headroom.capacity));
            });
        }
    }

    fn cleanup(&self, cleanup: &CleanupObservation) {
        let outcome = labels::cleanup_outcome(cleanup.outcome());
        let with_outcome = || vec![self.label(), Label::from_static_parts(labels::OUTCOME, outcome)];
        let counters = || {
            [
                metrics::counter!(names::CLEANUPS_TOTAL, with_outcome()),
                metrics::counter!(names::CLEANUP_REMOVED_ENTRIES_TOTAL, vec![self.label()]),
            ]
        };
        self.handles.cleanups.with(outcome, counters, |[passes, removed]| {
            passes.increment(1);
            if let CleanupOutcome::Removed { count } = cleanup.outcome() {
                removed.increment(count);
            }
        });
        let duration = || metrics::histogram!(names::CLEANUP_DURATION_SECONDS, with_outcome());
        self.handles
            .cleanup_durations
            .with(outcome, duration, |histogram| histogram.record(seconds(cleanup.elapsed())));
    }

    fn reset(&self, reset: &ResetObservation<'_>) {
        let resolve = || {
            let [policy, scope] = policy_labels(Some(reset.policy()));
            let outcome = Label::from_static_parts(labels::OUTCOME, labels::reset_outcome(reset.outcome()));
            let labels = vec![self.label(), policy, scope, outcome];
            (
                metrics::counter!(names::RESETS_TOTAL, labels.clone()),
                metrics::histogram!(names::RESET_DURATION_SECONDS, labels),
            )
        };
        let key = (*reset.policy().fingerprint(), reset.outcome());
        self.handles.resets.with(key, resolve, |(counter, histogram)| {
            counter.increment(1);
            histogram.record(seconds(reset.elapsed()));
        });
    }
}

/// The `policy` and `scope` labels: the policy's identifiers, or empty values when an
/// observation names no policy (a batch that singles out no member).
fn policy_labels(policy: Option<AdmissionPolicy<'_>>) -> [Label; 2] {
    match policy {
        Some(policy) => identity_labels(policy.id().as_str(), policy.scope().as_str()),
        None => [Label::from_static_parts(labels::POLICY, ""), Label::from_static_parts(labels::SCOPE, "")],
    }
}

/// The `policy` and `scope` labels of a policy identifier and scope.
fn identity_labels(id: &str, scope: &str) -> [Label; 2] {
    let owned = |value: &str| SharedString::from_owned(value.to_owned());
    [Label::new(labels::POLICY, owned(id)), Label::new(labels::SCOPE, owned(scope))]
}

/// A duration in seconds, exactly as `f64` represents it (nanosecond resolution up to about
/// 104 days).
fn seconds(elapsed: Duration) -> f64 {
    elapsed.as_secs_f64()
}

/// A gauge value from a count; exact up to 2⁵³ entries.
#[allow(clippy::cast_precision_loss, reason = "shard sizes are far below 2^53, where f64 is exact")]
fn count(value: usize) -> f64 {
    value as f64
}

impl Observer for MetricsObserver {
    fn observe(&self, observation: &Observation<'_>) {
        match observation {
            Observation::Admission(admission) => self.admission(admission),
            Observation::Cleanup(cleanup) => self.cleanup(cleanup),
            Observation::Reset(reset) => self.reset(reset),
        }
    }
}

impl AttemptObserver for MetricsObserver {
    fn observe_attempt(&self, observation: &AttemptObservation<'_>) {
        let policy = observation.policy();
        let resolve = || {
            let [policy_label, scope_label] = identity_labels(policy.id().as_str(), policy.scope().as_str());
            let labels = vec![
                self.label(),
                policy_label,
                scope_label,
                Label::from_static_parts(
                    labels::OPERATION,
                    labels::attempt_operation(observation.operation()),
                ),
                Label::from_static_parts(labels::EVENT, labels::attempt_event(observation.event())),
            ];
            (
                metrics::counter!(names::ATTEMPTS_TOTAL, labels.clone()),
                metrics::histogram!(names::ATTEMPT_DURATION_SECONDS, labels),
            )
        };
        let key = (*policy.fingerprint(), observation.operation(), observation.event());
        self.handles.attempts.with(key, resolve, |(counter, histogram)| {
            counter.increment(1);
            histogram.record(seconds(observation.elapsed()));
        });
    }
}

/// This crate's README (what crates.io shows), compiled and run as doctests so it stays true.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct CrateReadmeDoctests;
