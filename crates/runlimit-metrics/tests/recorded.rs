//! Exact metrics recorded by `MetricsObserver`, read back from `metrics-util`'s debugging
//! recorder installed as the test thread's local recorder.

use std::{
    collections::{BTreeMap, BTreeSet},
    time::Duration,
};

use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use runlimit_core::{
    AdmissionObservation, AdmissionOperation, AdmissionOutcome, AdmissionPolicy, Check, CleanupObservation,
    CleanupOutcome, ConsumptionStatus, FixedWindowPolicy, KeyHasher, Observation, Observer, PolicyId,
    QuotaMode, ResetObservation, ResetOutcome, ScopeId, SubjectKey,
    attempts::{
        AttemptDenialReason, AttemptEvent, AttemptObservation, AttemptObserver, AttemptOperation,
        AttemptOutcome, AttemptPolicy,
    },
    backend::ShardHeadroom,
};
use runlimit_memory::{ManualClock, MemoryStore, MemoryStoreConfig};
use runlimit_metrics::{MetricsObserver, names};

/// One recorded series: its name and its labels, sorted by key.
type Series = (String, Vec<(String, String)>);

/// What a series holds: a counter's value, a gauge's value or a histogram's samples.
#[derive(Clone, Debug, PartialEq)]
enum Value {
    Counter(u64),
    Gauge(f64),
    Histogram(Vec<f64>),
}

/// Runs `f` with a fresh debugging recorder as this thread's recorder and returns every
/// series it recorded.
fn recorded(f: impl FnOnce()) -> BTreeMap<Series, Value> {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::with_local_recorder(&recorder, f);
    snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .map(|(key, _, _, value)| {
            let mut labels: Vec<(String, String)> =
                key.key().labels().map(|label| (label.key().to_owned(), label.value().to_owned())).collect();
            labels.sort();
            let value = match value {
                DebugValue::Counter(value) => Value::Counter(value),
                DebugValue::Gauge(value) => Value::Gauge(value.into_inner()),
                DebugValue::Histogram(samples) => {
                    Value::Histogram(samples.into_iter().map(|sample| sample.into_inner()).collect())
                }
            };
            ((key.key().name().to_owned(), labels), value)
        })
        .collect()
}

fn series(name: &str, labels: &[(&str, &str)]) -> Series {
    let mut labels: Vec<(String, String)> =
        labels.iter().map(|(key, value)| ((*key).to_owned(), (*value).to_owned())).collect();
    labels.sort();
    (name.to_owned(), labels)
}

fn policy() -> FixedWindowPolicy {
    FixedWindowPolicy::new(
        PolicyId::new("login").unwrap(),
        ScopeId::new("identity").unwrap(),
        5,
        Duration::from_secs(60),
    )
    .unwrap()
}

fn admission<'a>(
    operation: AdmissionOperation<'a>,
    outcome: AdmissionOutcome,
    consumption: ConsumptionStatus,
    micros: u64,
) -> Observation<'a> {
    Observation::Admission(AdmissionObservation::new(
        operation,
        outcome,
        consumption,
        Duration::from_micros(micros),
    ))
}

/// A fresh observer (its kept handles belong to the recorder it first records into).
fn observer() -> MetricsObserver {
    MetricsObserver::new("memory")
}

/// The labels of an admission of the `login`/`identity` policy.
fn login(operation: &'static str, outcome: &'static str) -> Vec<(&'static str, &'static str)> {
    vec![
        ("backend", "memory"),
        ("policy", "login"),
        ("scope", "identity"),
        ("operation", operation),
        ("outcome", outcome),
    ]
}

fn with(
    mut labels: Vec<(&'static str, &'static str)>,
    more: (&'static str, &'static str),
) -> Vec<(&'static str, &'static str)> {
    labels.push(more);
    labels
}

#[test]
fn single_check_outcomes_count_once_each_with_exact_labels_and_seconds() {
    let policy = policy();
    let check = AdmissionOperation::Check { policy: AdmissionPolicy::of(&policy) };
    let cases = [
        (AdmissionOutcome::Allowed, ConsumptionStatus::Consumed, "allowed", "consumed", 1_500),
        (
            AdmissionOutcome::QuotaExceeded,
            ConsumptionStatus::NotConsumed,
            "quota_exceeded",
            "not_consumed",
            250,
        ),
        (AdmissionOutcome::ShadowDenied, ConsumptionStatus::NotConsumed, "shadow_denied", "not_consumed", 2),
        (
            AdmissionOutcome::StorageCapacity,
            ConsumptionStatus::NotConsumed,
            "storage_capacity",
            "not_consumed",
            1,
        ),
        (AdmissionOutcome::Failed, ConsumptionStatus::NotConsumed, "failed", "not_consumed", 3_000_000),
        (
            AdmissionOutcome::Failed,
            ConsumptionStatus::MayHaveBeenConsumed,
            "failed",
            "may_have_been_consumed",
            7,
        ),
        (AdmissionOutcome::Failed, ConsumptionStatus::Consumed, "failed", "consumed", 8),
    ];
    for (outcome, consumption, outcome_name, consumption_name, micros) in cases {
        let got = recorded(|| observer().observe(&admission(check, outcome, consumption, micros)));
        let labels = login("check", outcome_name);
        let expected = BTreeMap::from([
            (
                series(names::ADMISSIONS_TOTAL, &with(labels.clone(), ("consumption", consumption_name))),
                Value::Counter(1),
            ),
            (
                series(names::ADMISSION_DURATION_SECONDS, &labels),
                #[allow(clippy::cast_precision_loss, reason = "exact for these small values")]
                Value::Histogram(vec![micros as f64 / 1e6]),
            ),
        ]);
        assert_eq!(got, expected, "{outcome:?} / {consumption:?}");
    }
    // The samples are seconds, not milliseconds or microseconds.
    let got = recorded(|| {
        let observer = observer();
        observer.observe(&admission(check, AdmissionOutcome::Allowed, ConsumptionStatus::Consumed, 1_500));
    });
    assert_eq!(
        got[&series(names::ADMISSION_DURATION_SECONDS, &login("check", "allowed"))],
        Value::Histogram(vec![0.0015])
    );
}

#[test]
fn a_batch_counts_once_with_its_singled_out_policy_and_adds_its_members() {
    let policy = policy();
    let denied = AdmissionOperation::Batch { size: 3, policy: Some(AdmissionPolicy::of(&policy)) };
    let allowed = AdmissionOperation::Batch { size: 2, policy: None };
    let invalid = AdmissionOperation::Batch { size: 9, policy: None };
    let got = recorded(|| {
        let observer = observer();
        observer.observe(&admission(
            denied,
            AdmissionOutcome::QuotaExceeded,
            ConsumptionStatus::NotConsumed,
            10,
        ));
        observer.observe(&admission(allowed, AdmissionOutcome::Allowed, ConsumptionStatus::Consumed, 20));
        observer.observe(&admission(allowed, AdmissionOutcome::Allowed, ConsumptionStatus::Consumed, 30));
        observer.observe(&admission(
            invalid,
            AdmissionOutcome::InvalidBatch,
            ConsumptionStatus::NotConsumed,
            40,
        ));
    });
    let none = |outcome| {
        vec![
            ("backend", "memory"),
            ("policy", ""),
            ("scope", ""),
            ("operation", "batch"),
            ("outcome", outcome),
        ]
    };
    let members = |outcome, consumption| {
        vec![("backend", "memory"), ("outcome", outcome), ("consumption", consumption)]
    };
    let expected = BTreeMap::from([
        (
            series(
                names::ADMISSIONS_TOTAL,
                &with(login("batch", "quota_exceeded"), ("consumption", "not_consumed")),
            ),
            Value::Counter(1),
        ),
        (
            series(names::ADMISSION_DURATION_SECONDS, &login("batch", "quota_exceeded")),
            Value::Histogram(vec![0.00001]),
        ),
        (series(names::BATCH_CHECKS_TOTAL, &members("quota_exceeded", "not_consumed")), Value::Counter(3)),
        (
            series(names::ADMISSIONS_TOTAL, &with(none("allowed"), ("consumption", "consumed"))),
            Value::Counter(2),
        ),
        (
            series(names::ADMISSION_DURATION_SECONDS, &none("allowed")),
            Value::Histogram(vec![0.00002, 0.00003]),
        ),
        (series(names::BATCH_CHECKS_TOTAL, &members("allowed", "consumed")), Value::Counter(4)),
        (
            series(names::ADMISSIONS_TOTAL, &with(none("invalid_batch"), ("consumption", "not_consumed"))),
            Value::Counter(1),
        ),
        (series(names::ADMISSION_DURATION_SECONDS, &none("invalid_batch")), Value::Histogram(vec![0.00004])),
    ]);
    assert_eq!(got, expected);
}

#[test]
fn shard_headroom_sets_the_shard_gauges() {
    let policy = policy();
    let check = AdmissionOperation::Check { policy: AdmissionPolicy::of(&policy) };
    let got = recorded(|| {
        let observer = observer();
        for entries in [3, 7] {
            let observation = AdmissionObservation::new(
                check,
                AdmissionOutcome::Allowed,
                ConsumptionStatus::Consumed,
                Duration::ZERO,
            )
            .with_shard_headroom(ShardHeadroom { shard_index: 12, entries, capacity: 10 });
            observer.observe(&Observation::Admission(observation));
        }
    });
    let shard = [("backend", "memory"), ("store", ""), ("shard", "12")];
    assert_eq!(got[&series(names::SHARD_ENTRIES, &shard)], Value::Gauge(7.0));
    assert_eq!(got[&series(names::SHARD_CAPACITY_ENTRIES, &shard)], Value::Gauge(10.0));
    assert_eq!(got.len(), 4);
}

#[test]
fn named_stores_keep_their_shard_gauges_apart() {
    let policy = policy();
    let check = AdmissionOperation::Check { policy: AdmissionPolicy::of(&policy) };
    let got = recorded(|| {
        for (store, entries, capacity) in [("client", 3, 10), ("items", 5, 20)] {
            let observation = AdmissionObservation::new(
                check,
                AdmissionOutcome::Allowed,
                ConsumptionStatus::Consumed,
                Duration::ZERO,
            )
            .with_shard_headroom(ShardHeadroom { shard_index: 0, entries, capacity });
            observer().with_store(store).observe(&Observation::Admission(observation));
        }
    });
    for (store, entries, capacity) in [("client", 3.0, 10.0), ("items", 5.0, 20.0)] {
        let shard = [("backend", "memory"), ("store", store), ("shard", "0")];
        assert_eq!(got[&series(names::SHARD_ENTRIES, &shard)], Value::Gauge(entries), "{store}");
        assert_eq!(got[&series(names::SHARD_CAPACITY_ENTRIES, &shard)], Value::Gauge(capacity), "{store}");
    }
}

#[test]
fn cleanups_count_their_outcome_and_removed_entries() {
    let got = recorded(|| {
        let observer = observer();
        for (outcome, millis) in [
            (CleanupOutcome::Removed { count: 40 }, 2),
            (CleanupOutcome::Removed { count: 0 }, 1),
            (CleanupOutcome::NoEffect, 4),
            (CleanupOutcome::Unknown, 8),
        ] {
            observer.observe(&Observation::Cleanup(CleanupObservation::new(
                outcome,
                1_000,
                Duration::from_millis(millis),
            )));
        }
    });
    let backend = [("backend", "memory")];
    let outcome = |outcome| [("backend", "memory"), ("outcome", outcome)];
    let expected = BTreeMap::from([
        (series(names::CLEANUPS_TOTAL, &outcome("removed")), Value::Counter(2)),
        (series(names::CLEANUPS_TOTAL, &outcome("no_effect")), Value::Counter(1)),
        (series(names::CLEANUPS_TOTAL, &outcome("unknown")), Value::Counter(1)),
        (series(names::CLEANUP_REMOVED_ENTRIES_TOTAL, &backend), Value::Counter(40)),
        (series(names::CLEANUP_DURATION_SECONDS, &outcome("removed")), Value::Histogram(vec![0.002, 0.001])),
        (series(names::CLEANUP_DURATION_SECONDS, &outcome("no_effect")), Value::Histogram(vec![0.004])),
        (series(names::CLEANUP_DURATION_SECONDS, &outcome("unknown")), Value::Histogram(vec![0.008])),
    ]);
    assert_eq!(got, expected);
}

#[test]
fn resets_count_each_outcome() {
    let policy = policy();
    let got = recorded(|| {
        let observer = observer();
        for outcome in [
            ResetOutcome::Removed,
            ResetOutcome::NothingStored,
            ResetOutcome::NoEffect,
            ResetOutcome::Unknown,
        ] {
            observer.observe(&Observation::Reset(ResetObservation::new(
                AdmissionPolicy::of(&policy),
                outcome,
                Duration::from_millis(1),
            )));
        }
    });
    for outcome in ["removed", "nothing_stored", "no_effect", "unknown"] {
        let labels =
            [("backend", "memory"), ("policy", "login"), ("scope", "identity"), ("outcome", outcome)];
        assert_eq!(got[&series(names::RESETS_TOTAL, &labels)], Value::Counter(1), "{outcome}");
        assert_eq!(
            got[&series(names::RESET_DURATION_SECONDS, &labels)],
            Value::Histogram(vec![0.001]),
            "{outcome}"
        );
    }
    assert_eq!(got.len(), 8);
}

#[test]
fn every_attempt_event_counts_under_its_own_name() {
    let policy = AttemptPolicy::new(
        PolicyId::new("auth.password").unwrap(),
        ScopeId::new("identity").unwrap(),
        Duration::from_millis(100),
        Duration::from_secs(1),
        Duration::from_secs(5),
        Duration::from_millis(50),
    )
    .unwrap();
    let admission = AttemptOperation::Admission;
    let failure = AttemptOperation::Completion(AttemptOutcome::Failure);
    let cases = [
        (admission, AttemptEvent::Admitted, "admission", "admitted"),
        (admission, AttemptEvent::Denied(AttemptDenialReason::InProgress), "admission", "denied_in_progress"),
        (admission, AttemptEvent::Denied(AttemptDenialReason::Backoff), "admission", "denied_backoff"),
        (
            admission,
            AttemptEvent::Denied(AttemptDenialReason::StorageCapacity),
            "admission",
            "denied_storage_capacity",
        ),
        (
            AttemptOperation::Completion(AttemptOutcome::Success),
            AttemptEvent::Completed(AttemptOutcome::Success),
            "complete_success",
            "completed_success",
        ),
        (failure, AttemptEvent::Completed(AttemptOutcome::Failure), "complete_failure", "completed_failure"),
        (
            AttemptOperation::Completion(AttemptOutcome::Abandoned),
            AttemptEvent::Completed(AttemptOutcome::Abandoned),
            "complete_abandoned",
            "completed_abandoned",
        ),
        (failure, AttemptEvent::Stale, "complete_failure", "stale"),
        (AttemptOperation::Reset, AttemptEvent::Reset { had_live_state: true }, "reset", "reset"),
        (
            AttemptOperation::Reset,
            AttemptEvent::Reset { had_live_state: false },
            "reset",
            "reset_nothing_live",
        ),
        (failure, AttemptEvent::UncertainCommit, "complete_failure", "uncertain_commit"),
        (admission, AttemptEvent::Failed, "admission", "failed"),
    ];
    for (operation, event, operation_name, event_name) in cases {
        let got = recorded(|| {
            let observer = observer();
            observer.observe_attempt(&AttemptObservation::new(
                &policy,
                operation,
                event,
                Duration::from_micros(250),
            ));
        });
        let labels = [
            ("backend", "memory"),
            ("policy", "auth.password"),
            ("scope", "identity"),
            ("operation", operation_name),
            ("event", event_name),
        ];
        let expected = BTreeMap::from([
            (series(names::ATTEMPTS_TOTAL, &labels), Value::Counter(1)),
            (series(names::ATTEMPT_DURATION_SECONDS, &labels), Value::Histogram(vec![0.00025])),
        ]);
        assert_eq!(got, expected, "{event:?}");
    }
}

/// Drives a real `MemoryStore` (8 shards) with `subjects` distinct subjects, one check each
/// and a second, denied check for the first, and returns what was recorded.
fn through_a_store(subjects: u64) -> (BTreeMap<Series, Value>, Vec<SubjectKey>) {
    let policy = FixedWindowPolicy::new(
        PolicyId::new("api").unwrap(),
        ScopeId::new("client").unwrap(),
        1,
        Duration::from_secs(60),
    )
    .unwrap();
    let hasher = KeyHasher::new(&[7; 32]).unwrap();
    let keys: Vec<SubjectKey> = (0..subjects)
        .map(|n| {
            hasher
                .hash_for(&policy, format!("subject-{n}@example.test").as_bytes())
                .into_unbound_subject_key()
        })
        .collect();
    let config = MemoryStoreConfig::new(100_000).unwrap().with_shard_count(8).unwrap();
    let store = MemoryStore::builder(config).with_clock(ManualClock::new()).with_observer(observer()).build();
    let got = recorded(|| {
        for key in &keys {
            assert!(store.check(&Check::new(key.bind(&policy))).unwrap().permits_request());
        }
        assert!(!store.check(&Check::new(keys[0].bind(&policy))).unwrap().permits_request());
    });
    (got, keys)
}

#[test]
fn a_real_store_records_its_admissions_exactly() {
    let (got, _) = through_a_store(3);
    let labels = |outcome| {
        vec![
            ("backend", "memory"),
            ("policy", "api"),
            ("scope", "client"),
            ("operation", "check"),
            ("outcome", outcome),
        ]
    };
    assert_eq!(
        got[&series(names::ADMISSIONS_TOTAL, &with(labels("allowed"), ("consumption", "consumed")))],
        Value::Counter(3)
    );
    assert_eq!(
        got[&series(
            names::ADMISSIONS_TOTAL,
            &with(labels("quota_exceeded"), ("consumption", "not_consumed"))
        )],
        Value::Counter(1)
    );
    let Value::Histogram(samples) = &got[&series(names::ADMISSION_DURATION_SECONDS, &labels("allowed"))]
    else {
        panic!("a histogram")
    };
    assert_eq!(samples.len(), 3);
    assert!(samples.iter().all(|seconds| (0.0..1.0).contains(seconds)), "{samples:?} are seconds");
    let shards: u64 = (0..8)
        .filter_map(|shard| {
            let labels = [("backend", "memory"), ("store", ""), ("shard", &shard.to_string())];
            got.get(&series(names::SHARD_ENTRIES, &labels))
        })
        .map(|value| match value {
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss, reason = "small exact counts")]
            Value::Gauge(entries) => *entries as u64,
            other => panic!("a gauge, got {other:?}"),
        })
        .sum();
    assert_eq!(shards, 3, "one entry per subject across the shards");
}

#[test]
fn label_sets_do_not_grow_with_subjects_and_never_name_one() {
    let (few, _) = through_a_store(200);
    let (many, keys) = through_a_store(10_000);
    let names_of =
        |recorded: &BTreeMap<Series, Value>| recorded.keys().cloned().collect::<BTreeSet<Series>>();
    // A counter and a histogram per outcome (allowed, quota_exceeded) and 8 shards × 2
    // gauges, however many subjects.
    assert_eq!(names_of(&few), names_of(&many));
    assert_eq!(many.len(), 2 * 2 + 8 * 2);
    let allowed: BTreeSet<&str> = [
        "memory",
        "",
        "api",
        "client",
        "check",
        "allowed",
        "quota_exceeded",
        "consumed",
        "not_consumed",
        "0",
        "1",
        "2",
        "3",
        "4",
        "5",
        "6",
        "7",
    ]
    .into();
    for (_, labels) in many.keys() {
        for (_, value) in labels {
            assert!(allowed.contains(value.as_str()), "label value {value:?} is not a configured name");
        }
    }
    // And, explicitly, no subject or key material.
    for (n, key) in keys.iter().enumerate() {
        let subject = format!("subject-{n}@example.test");
        let hex: String = key.as_bytes().iter().take(4).map(|byte| format!("{byte:02x}")).collect();
        for (_, labels) in many.keys() {
            for (_, value) in labels {
                assert!(!value.contains(&subject) && !value.contains(&hex), "{value:?} names subject {n}");
            }
        }
    }
}

#[test]
fn shadow_mode_records_shadow_denials_as_not_consumed() {
    let policy = policy().with_quota_mode(QuotaMode::Shadow);
    let hasher = KeyHasher::new(&[7; 32]).unwrap();
    let key = hasher.hash_for(&policy, b"shadowed@example.test").into_unbound_subject_key();
    let config = MemoryStoreConfig::new(100).unwrap();
    let store = MemoryStore::builder(config).with_clock(ManualClock::new()).with_observer(observer()).build();
    let got = recorded(|| {
        for _ in 0..7 {
            assert!(store.check(&Check::new(key.bind(&policy))).unwrap().permits_request());
        }
    });
    let labels = |outcome| login("check", outcome);
    assert_eq!(
        got[&series(names::ADMISSIONS_TOTAL, &with(labels("allowed"), ("consumption", "consumed")))],
        Value::Counter(5)
    );
    assert_eq!(
        got[&series(
            names::ADMISSIONS_TOTAL,
            &with(labels("shadow_denied"), ("consumption", "not_consumed"))
        )],
        Value::Counter(2)
    );
}

#[test]
fn label_sets_beyond_the_cache_bound_are_still_recorded_exactly() {
    let policies: Vec<FixedWindowPolicy> = (0..runlimit_metrics::MAX_CACHED_LABEL_SETS + 5)
        .map(|n| {
            FixedWindowPolicy::new(
                PolicyId::new(&format!("p{n}")).unwrap(),
                ScopeId::new("s").unwrap(),
                1,
                Duration::from_secs(1),
            )
            .unwrap()
        })
        .collect();
    let got = recorded(|| {
        let observer = observer();
        for _ in 0..2 {
            for policy in &policies {
                let check = AdmissionOperation::Check { policy: AdmissionPolicy::of(policy) };
                observer.observe(&admission(
                    check,
                    AdmissionOutcome::Allowed,
                    ConsumptionStatus::Consumed,
                    1,
                ));
            }
        }
    });
    for n in [0, runlimit_metrics::MAX_CACHED_LABEL_SETS - 1, runlimit_metrics::MAX_CACHED_LABEL_SETS + 4] {
        let id = format!("p{n}");
        let labels = [
            ("backend", "memory"),
            ("policy", id.as_str()),
            ("scope", "s"),
            ("operation", "check"),
            ("outcome", "allowed"),
            ("consumption", "consumed"),
        ];
        assert_eq!(got[&series(names::ADMISSIONS_TOTAL, &labels)], Value::Counter(2), "{id}");
    }
}
