//! Feature `serde`: round trips of every serializable type with pinned JSON, a rejection test
//! for every invalid value (each constructor rule and decision invariant, unknown fields at
//! every level), and proof that the opaque key types and `KeyHasher` implement no serde
//! traits.
#![cfg(feature = "serde")]

use std::{fmt::Debug, marker::PhantomData, time::Duration};

use runlimit_core::{
    Admitted, Allowance, BatchDecision, Capacity, Check, CounterKey, Decision, DecisionView, Delay, Denial,
    FixedWindowPolicy, GcraPolicy, KeyHasher, MAX_LIMIT, MAX_WINDOW, PolicyFingerprint, PolicyId,
    PolicySubject, QuotaDenial, QuotaMode, QuotaPeriod, ScopeId, SubjectKey,
    attempts::AttemptPolicy,
    backend::gcra::{GcraOutcome, GcraParameters, TheoreticalArrivalTime},
};
use serde::{Serialize, de::DeserializeOwned};

// --- helpers --------------------------------------------------------------------------------

/// Serializes `value`, checks the exact JSON when `pinned` is given, and checks that both the
/// text and the `serde_json::Value` paths deserialize back to an equal value.
fn round_trip<T>(value: &T, pinned: Option<&str>)
where
    T: Serialize + DeserializeOwned + PartialEq + Debug,
{
    let text = serde_json::to_string(value).unwrap();
    if let Some(pinned) = pinned {
        assert_eq!(text, pinned);
    }
    let back: T = serde_json::from_str(&text).unwrap();
    assert_eq!(&back, value, "text round trip of {text}");
    let tree = serde_json::to_value(value).unwrap();
    let back: T = serde_json::from_value(tree).unwrap();
    assert_eq!(&back, value, "value round trip of {text}");
}

/// Deserializes `json` text as `T`, expecting an error with exactly `message` (serde_json's
/// " at line L column C" suffix stripped).
#[track_caller]
fn reject_text<T: DeserializeOwned + Debug>(json: &str, message: &str) {
    let error = serde_json::from_str::<T>(json).expect_err(json).to_string();
    let without_position = error.rfind(" at line ").map_or(error.as_str(), |at| &error[..at]);
    assert_eq!(without_position, message, "text path of {json}");
}

/// [`reject_text`], and the same exact error through a parsed `serde_json::Value`.
#[track_caller]
fn reject<T: DeserializeOwned + Debug>(json: &str, message: &str) {
    reject_text::<T>(json, message);
    if let Ok(tree) = serde_json::from_str::<serde_json::Value>(json) {
        let error = serde_json::from_value::<T>(tree).expect_err(json).to_string();
        assert_eq!(error, message, "value path of {json}");
    }
}

fn id(text: &str) -> PolicyId {
    PolicyId::new(text).unwrap()
}

fn scope(text: &str) -> ScopeId {
    ScopeId::new(text).unwrap()
}

fn capacity(units: u64) -> Capacity {
    Capacity::new(units).unwrap()
}

fn allowance(capacity_units: u64, available: u64, millis: u64) -> Allowance {
    Allowance::new(capacity(capacity_units), available, Delay::from_millis(millis)).unwrap()
}

const MAX_LIMIT_TEXT: &str = "9223372036854775807";
const MAX_WINDOW_MILLIS_TEXT: &str = "9007199254740";

// --- round trips ----------------------------------------------------------------------------

#[test]
fn identifiers() {
    round_trip(&id("auth.login"), Some(r#""auth.login""#));
    round_trip(&scope("client"), Some(r#""client""#));
    round_trip(&id(&"x".repeat(64)), None);
    round_trip(&scope("A9.b_c-d:e"), Some(r#""A9.b_c-d:e""#));
    // Escaped JSON strings are unescaped before validation.
    assert_eq!(serde_json::from_str::<PolicyId>(r#""\u0061uth""#).unwrap(), id("auth"));
}

#[test]
fn value_types() {
    round_trip(&QuotaMode::Enforce, Some(r#""enforce""#));
    round_trip(&QuotaMode::Shadow, Some(r#""shadow""#));
    round_trip(&capacity(1), Some("1"));
    round_trip(&capacity(MAX_LIMIT), Some(MAX_LIMIT_TEXT));
    round_trip(&QuotaPeriod::new(Duration::from_millis(1)).unwrap(), Some(r#"{"secs":0,"nanos":1000000}"#));
    round_trip(&QuotaPeriod::new(MAX_WINDOW).unwrap(), Some(r#"{"secs":9007199254,"nanos":740000000}"#));
    round_trip(&Delay::ZERO, Some(r#"{"secs":0,"nanos":0}"#));
    // Delays keep their exact nanoseconds, including Duration::MAX.
    round_trip(
        &Delay::from_duration(Duration::from_nanos(1_500_000_001)),
        Some(r#"{"secs":1,"nanos":500000001}"#),
    );
    round_trip(
        &Delay::from_duration(Duration::MAX),
        Some(r#"{"secs":18446744073709551615,"nanos":999999999}"#),
    );
}

#[test]
fn policies() {
    let fixed =
        FixedWindowPolicy::new(id("auth.login"), scope("client"), 40, Duration::from_secs(60)).unwrap();
    round_trip(
        &fixed,
        Some(
            r#"{"id":"auth.login","scope":"client","limit":40,"window":{"secs":60,"nanos":0},"quota_mode":"enforce"}"#,
        ),
    );
    let shadow = fixed.clone().with_quota_mode(QuotaMode::Shadow);
    round_trip(
        &shadow,
        Some(
            r#"{"id":"auth.login","scope":"client","limit":40,"window":{"secs":60,"nanos":0},"quota_mode":"shadow"}"#,
        ),
    );
    // quota_mode defaults to enforce; the deserialized policy has the same fingerprint.
    let parsed: FixedWindowPolicy = serde_json::from_str(
        r#"{"id":"auth.login","scope":"client","limit":40,"window":{"secs":60,"nanos":0}}"#,
    )
    .unwrap();
    assert_eq!(parsed, fixed);
    assert_eq!(
        runlimit_core::RateLimitPolicy::fingerprint(&parsed),
        runlimit_core::RateLimitPolicy::fingerprint(&fixed)
    );
    round_trip(&FixedWindowPolicy::new(id("p"), scope("s"), MAX_LIMIT, MAX_WINDOW).unwrap(), None);

    let gcra = GcraPolicy::new(id("api.read"), scope("client"), 10, Duration::from_millis(1_500), 20)
        .unwrap()
        .with_quota_mode(QuotaMode::Shadow);
    round_trip(
        &gcra,
        Some(
            r#"{"id":"api.read","scope":"client","quota":10,"period":{"secs":1,"nanos":500000000},"burst_capacity":20,"quota_mode":"shadow"}"#,
        ),
    );
    round_trip(&GcraPolicy::new(id("p"), scope("s"), MAX_LIMIT, MAX_WINDOW, MAX_LIMIT).unwrap(), None);
    round_trip(&GcraPolicy::new(id("p"), scope("s"), 1, MAX_WINDOW, 1).unwrap(), None);

    let attempt = AttemptPolicy::new(
        id("auth.password"),
        scope("identity"),
        Duration::from_secs(1),
        Duration::from_secs(300),
        Duration::from_secs(3_600),
        Duration::from_millis(30_001),
    )
    .unwrap();
    round_trip(
        &attempt,
        Some(
            r#"{"id":"auth.password","scope":"identity","initial_delay":{"secs":1,"nanos":0},"delay_cap":{"secs":300,"nanos":0},"quiet_period":{"secs":3600,"nanos":0},"lease":{"secs":30,"nanos":1000000}}"#,
        ),
    );
}

#[test]
fn decisions() {
    let quota = QuotaDenial::new(capacity(5), Delay::from_millis(1_500));
    round_trip(
        &allowance(5, 4, 60_000),
        Some(r#"{"capacity":5,"available":4,"replenishes_after":{"secs":60,"nanos":0}}"#),
    );
    round_trip(&allowance(MAX_LIMIT, MAX_LIMIT, 0), None);
    round_trip(&quota, Some(r#"{"capacity":5,"retry_after":{"secs":1,"nanos":500000000}}"#));
    round_trip(
        &Denial::QuotaExceeded(quota),
        Some(r#"{"reason":"quota_exceeded","capacity":5,"retry_after":{"secs":1,"nanos":500000000}}"#),
    );
    round_trip(
        &Denial::StorageCapacity { retry_after: None },
        Some(r#"{"reason":"storage_capacity","retry_after":null}"#),
    );
    round_trip(
        &Denial::StorageCapacity { retry_after: Some(Delay::from_millis(5)) },
        Some(r#"{"reason":"storage_capacity","retry_after":{"secs":0,"nanos":5000000}}"#),
    );
    round_trip(
        &Decision::allowed(allowance(5, 4, 1_500)),
        Some(
            r#"{"outcome":"allowed","allowance":{"capacity":5,"available":4,"replenishes_after":{"secs":1,"nanos":500000000}}}"#,
        ),
    );
    round_trip(
        &Decision::shadow_denied(quota),
        Some(
            r#"{"outcome":"shadow_denied","denial":{"capacity":5,"retry_after":{"secs":1,"nanos":500000000}}}"#,
        ),
    );
    round_trip(
        &Decision::quota_exceeded(quota, QuotaMode::Enforce),
        Some(
            r#"{"outcome":"denied","denial":{"reason":"quota_exceeded","capacity":5,"retry_after":{"secs":1,"nanos":500000000}}}"#,
        ),
    );
    round_trip(
        &Decision::denied(Denial::StorageCapacity { retry_after: None }),
        Some(r#"{"outcome":"denied","denial":{"reason":"storage_capacity","retry_after":null}}"#),
    );
    // A storage-capacity denial without the optional field is read as `None`.
    assert_eq!(
        serde_json::from_str::<Denial>(r#"{"reason":"storage_capacity"}"#).unwrap(),
        Denial::StorageCapacity { retry_after: None }
    );
}

#[test]
fn batch_decisions() {
    let quota = QuotaDenial::new(capacity(3), Delay::from_millis(7));
    // The inline form of a small allowed batch serializes exactly like its `Vec` form.
    round_trip(
        &runlimit_core::backend::batch::allowed([allowance(5, 4, 1_000), allowance(2, 0, 1)]).unwrap(),
        Some(
            r#"{"outcome":"allowed","allowances":[{"capacity":5,"available":4,"replenishes_after":{"secs":1,"nanos":0}},{"capacity":2,"available":0,"replenishes_after":{"secs":0,"nanos":1000000}}]}"#,
        ),
    );
    round_trip(
        &BatchDecision::allowed(vec![allowance(5, 4, 1_000), allowance(2, 0, 1)]).unwrap(),
        Some(
            r#"{"outcome":"allowed","allowances":[{"capacity":5,"available":4,"replenishes_after":{"secs":1,"nanos":0}},{"capacity":2,"available":0,"replenishes_after":{"secs":0,"nanos":1000000}}]}"#,
        ),
    );
    round_trip(
        &BatchDecision::denied(1, 2, Denial::StorageCapacity { retry_after: Some(Delay::from_millis(5)) })
            .unwrap(),
        Some(
            r#"{"outcome":"denied","index":1,"batch_size":2,"denial":{"reason":"storage_capacity","retry_after":{"secs":0,"nanos":5000000}}}"#,
        ),
    );
    round_trip(
        &BatchDecision::quota_exceeded(0, 1, quota, QuotaMode::Shadow).unwrap(),
        Some(
            r#"{"outcome":"shadow_denied","index":0,"batch_size":1,"denial":{"capacity":3,"retry_after":{"secs":0,"nanos":7000000}}}"#,
        ),
    );
    round_trip(
        &BatchDecision::quota_exceeded(usize::MAX - 1, usize::MAX, quota, QuotaMode::Enforce).unwrap(),
        None,
    );
}

// --- rejections -----------------------------------------------------------------------------

#[test]
fn invalid_identifiers() {
    reject::<PolicyId>(r#""""#, "policy id is empty");
    reject::<ScopeId>(r#""""#, "scope id is empty");
    let long = format!("\"{}\"", "a".repeat(65));
    reject::<PolicyId>(&long, "policy id is 65 bytes long, above the maximum of 64");
    reject::<ScopeId>(&long, "scope id is 65 bytes long, above the maximum of 64");
    reject::<PolicyId>(r#""a b""#, "policy id has a disallowed character at byte 1");
    reject::<ScopeId>(r#"".a""#, "scope id has a disallowed character at byte 0");
    reject::<ScopeId>(r#""caf\u00e9""#, "scope id has a disallowed character at byte 3");
    reject::<PolicyId>(r#""a\u0000""#, "policy id has a disallowed character at byte 1");
    reject::<PolicyId>("5", "invalid type: integer `5`, expected a string");
    reject::<PolicyId>("null", "invalid type: null, expected a string");
}

#[test]
fn invalid_value_types() {
    reject::<Capacity>("0", "capacity must be at least 1");
    reject::<Capacity>(
        "9223372036854775808",
        "capacity is 9223372036854775808, above the maximum of 9223372036854775807",
    );
    reject::<Capacity>("-1", "invalid value: integer `-1`, expected u64");
    reject::<Capacity>("1.5", "invalid type: floating point `1.5`, expected u64");
    reject::<QuotaPeriod>(r#"{"secs":0,"nanos":0}"#, "period must be at least 1 millisecond");
    reject::<QuotaPeriod>(r#"{"secs":0,"nanos":1}"#, "period is not a whole number of milliseconds");
    reject::<QuotaPeriod>(
        r#"{"secs":9007199254,"nanos":741000000}"#,
        "period exceeds the maximum of 9007199254740 milliseconds",
    );
    reject::<QuotaPeriod>(
        r#"{"secs":1,"nanos":0,"millis":0}"#,
        "unknown field `millis`, expected `secs` or `nanos`",
    );
    reject::<QuotaPeriod>(r#"{"secs":1}"#, "missing field `nanos`");
    reject::<Delay>(r#"{"secs":1,"nanos":0,"extra":0}"#, "unknown field `extra`, expected `secs` or `nanos`");
    reject::<Delay>(r#"{"secs":18446744073709551615,"nanos":1000000000}"#, "overflow deserializing Duration");
    reject::<QuotaMode>(r#""Shadow""#, "unknown variant `Shadow`, expected `enforce` or `shadow`");
    reject::<QuotaMode>(r#""""#, "unknown variant ``, expected `enforce` or `shadow`");
}

const FIXED_FIELDS: &str = "expected one of `id`, `scope`, `limit`, `window`, `quota_mode`";

#[test]
fn invalid_fixed_window_policies() {
    let fixed = |id: &str, scope: &str, limit: &str, window: &str| {
        format!(r#"{{"id":{id},"scope":{scope},"limit":{limit},"window":{window}}}"#)
    };
    let second = r#"{"secs":1,"nanos":0}"#;
    reject::<FixedWindowPolicy>(&fixed(r#""p""#, r#""s""#, "0", second), "limit must be at least 1");
    reject::<FixedWindowPolicy>(
        &fixed(r#""p""#, r#""s""#, "9223372036854775808", second),
        "limit is 9223372036854775808, above the maximum of 9223372036854775807",
    );
    reject::<FixedWindowPolicy>(
        &fixed(r#""p""#, r#""s""#, "1", r#"{"secs":0,"nanos":0}"#),
        "window must be at least 1 millisecond",
    );
    reject::<FixedWindowPolicy>(
        &fixed(r#""p""#, r#""s""#, "1", r#"{"secs":1,"nanos":500}"#),
        "window is not a whole number of milliseconds",
    );
    reject::<FixedWindowPolicy>(
        &fixed(r#""p""#, r#""s""#, "1", r#"{"secs":9007199255,"nanos":0}"#),
        &format!("window exceeds the maximum of {MAX_WINDOW_MILLIS_TEXT} milliseconds"),
    );
    let long = format!("\"{}\"", "p".repeat(65));
    reject::<FixedWindowPolicy>(
        &fixed(&long, r#""s""#, "1", second),
        "policy id is 65 bytes long, above the maximum of 64",
    );
    reject::<FixedWindowPolicy>(
        &fixed(r#""p""#, &long, "1", second),
        "scope id is 65 bytes long, above the maximum of 64",
    );
    reject::<FixedWindowPolicy>(
        &fixed(r#""p/q""#, r#""s""#, "1", second),
        "policy id has a disallowed character at byte 1",
    );
    reject::<FixedWindowPolicy>(
        &fixed(r#""p""#, r#""-s""#, "1", second),
        "scope id has a disallowed character at byte 0",
    );
    // Unknown fields at the policy level (a fingerprint is never accepted) and the window level.
    reject::<FixedWindowPolicy>(
        r#"{"id":"p","scope":"s","limit":1,"window":{"secs":1,"nanos":0},"fingerprint":"00"}"#,
        &format!("unknown field `fingerprint`, {FIXED_FIELDS}"),
    );
    reject::<FixedWindowPolicy>(
        &fixed(r#""p""#, r#""s""#, "1", r#"{"secs":1,"nanos":0,"ms":1}"#),
        "unknown field `ms`, expected `secs` or `nanos`",
    );
    reject::<FixedWindowPolicy>(
        r#"{"id":"p","scope":"s","limit":1,"window":{"secs":1,"nanos":0},"quota_mode":"warn"}"#,
        "unknown variant `warn`, expected `enforce` or `shadow`",
    );
    reject::<FixedWindowPolicy>(r#"{"id":"p","scope":"s","limit":1}"#, "missing field `window`");
    // Text only: a `serde_json::Value` keeps just the last of two equal keys.
    reject_text::<FixedWindowPolicy>(
        r#"{"id":"p","id":"q","scope":"s","limit":1,"window":{"secs":1,"nanos":0}}"#,
        "duplicate field `id`",
    );
}

const GCRA_FIELDS: &str = "expected one of `id`, `scope`, `quota`, `period`, `burst_capacity`, `quota_mode`";

#[test]
fn invalid_gcra_policies() {
    let gcra = |quota: &str, period: &str, burst: &str| {
        format!(r#"{{"id":"p","scope":"s","quota":{quota},"period":{period},"burst_capacity":{burst}}}"#)
    };
    let second = r#"{"secs":1,"nanos":0}"#;
    reject::<GcraPolicy>(&gcra("0", second, "1"), "quota must be at least 1");
    reject::<GcraPolicy>(&gcra("1", second, "0"), "burst capacity must be at least 1");
    reject::<GcraPolicy>(
        &gcra("18446744073709551615", second, "1"),
        "quota is 18446744073709551615, above the maximum of 9223372036854775807",
    );
    reject::<GcraPolicy>(
        &gcra("1", second, "9223372036854775808"),
        "burst capacity is 9223372036854775808, above the maximum of 9223372036854775807",
    );
    reject::<GcraPolicy>(&gcra("1", r#"{"secs":0,"nanos":0}"#, "1"), "period must be at least 1 millisecond");
    reject::<GcraPolicy>(
        &gcra("1", r#"{"secs":0,"nanos":999999}"#, "1"),
        "period is not a whole number of milliseconds",
    );
    reject::<GcraPolicy>(
        &gcra("1", r#"{"secs":18446744073709551615,"nanos":0}"#, "1"),
        &format!("period exceeds the maximum of {MAX_WINDOW_MILLIS_TEXT} milliseconds"),
    );
    // Full replenishment ⌈B·P/Q⌉ above MAX_WINDOW: 2 × MAX_WINDOW, and one millisecond over.
    reject::<GcraPolicy>(
        &gcra("1", r#"{"secs":9007199254,"nanos":740000000}"#, "2"),
        "full replenishment takes 18014398509480 milliseconds, above the maximum of 9007199254740",
    );
    reject::<GcraPolicy>(
        &gcra("2", r#"{"secs":9007199254,"nanos":740000000}"#, "3"),
        "full replenishment takes 13510798882110 milliseconds, above the maximum of 9007199254740",
    );
    // One millisecond over: Q = MAX_LIMIT − 1, B = MAX_LIMIT, P = MAX_WINDOW.
    reject::<GcraPolicy>(
        &gcra("9223372036854775806", r#"{"secs":9007199254,"nanos":740000000}"#, MAX_LIMIT_TEXT),
        "full replenishment takes 9007199254741 milliseconds, above the maximum of 9007199254740",
    );
    // Exactly MAX_WINDOW is accepted.
    assert!(
        serde_json::from_str::<GcraPolicy>(&gcra(
            MAX_LIMIT_TEXT,
            r#"{"secs":9007199254,"nanos":740000000}"#,
            MAX_LIMIT_TEXT
        ))
        .is_ok()
    );
    reject::<GcraPolicy>(
        r#"{"id":"p","scope":"s","quota":1,"period":{"secs":1,"nanos":0},"burst_capacity":1,"burst":1}"#,
        &format!("unknown field `burst`, {GCRA_FIELDS}"),
    );
    reject::<GcraPolicy>(
        &gcra("1", r#"{"secs":1,"nanos":0,"x":null}"#, "1"),
        "unknown field `x`, expected `secs` or `nanos`",
    );
    reject::<GcraPolicy>(
        r#"{"id":"","scope":"s","quota":1,"period":{"secs":1,"nanos":0},"burst_capacity":1}"#,
        "policy id is empty",
    );
}

const ATTEMPT_FIELDS: &str =
    "expected one of `id`, `scope`, `initial_delay`, `delay_cap`, `quiet_period`, `lease`";

#[test]
fn invalid_attempt_policies() {
    let ms = |millis: u64| format!(r#"{{"secs":{},"nanos":{}}}"#, millis / 1000, (millis % 1000) * 1_000_000);
    let attempt = |initial: &str, cap: &str, quiet: &str, lease: &str| {
        format!(
            r#"{{"id":"p","scope":"s","initial_delay":{initial},"delay_cap":{cap},"quiet_period":{quiet},"lease":{lease}}}"#
        )
    };
    let one = ms(1);
    let zero = ms(0);
    let sub_ms = r#"{"secs":0,"nanos":1500000}"#;
    let too_long = r#"{"secs":9007199255,"nanos":0}"#;
    reject::<AttemptPolicy>(
        &attempt(&zero, &one, &one, &one),
        "initial delay must be at least 1 millisecond",
    );
    reject::<AttemptPolicy>(&attempt(&one, &zero, &one, &one), "delay cap must be at least 1 millisecond");
    reject::<AttemptPolicy>(&attempt(&one, &one, &zero, &one), "quiet period must be at least 1 millisecond");
    reject::<AttemptPolicy>(&attempt(&one, &one, &one, &zero), "lease must be at least 1 millisecond");
    reject::<AttemptPolicy>(
        &attempt(sub_ms, &ms(5), &ms(5), &one),
        "initial delay is not a whole number of milliseconds",
    );
    reject::<AttemptPolicy>(
        &attempt(&one, &ms(5), &ms(5), sub_ms),
        "lease is not a whole number of milliseconds",
    );
    reject::<AttemptPolicy>(
        &attempt(&one, &one, too_long, &one),
        &format!("quiet period exceeds the maximum of {MAX_WINDOW_MILLIS_TEXT} milliseconds"),
    );
    // Ordering: cap ≥ initial delay, quiet period ≥ cap (equal is fine).
    reject::<AttemptPolicy>(
        &attempt(&ms(2), &ms(1), &ms(5), &one),
        "delay cap must be at least initial delay",
    );
    reject::<AttemptPolicy>(
        &attempt(&ms(1), &ms(5), &ms(4), &one),
        "quiet period must be at least delay cap",
    );
    assert!(serde_json::from_str::<AttemptPolicy>(&attempt(&ms(5), &ms(5), &ms(5), &ms(1))).is_ok());
    reject::<AttemptPolicy>(
        &attempt(&one, &one, &one, &one).replace(r#""lease""#, r#""lease_ms""#),
        &format!("unknown field `lease_ms`, {ATTEMPT_FIELDS}"),
    );
    reject::<AttemptPolicy>(
        &attempt(&one, &one, &one, r#"{"secs":0,"nanos":1000000,"q":1}"#),
        "unknown field `q`, expected `secs` or `nanos`",
    );
    reject::<AttemptPolicy>(
        &attempt(&one, &one, &one, &one).replace(r#""s""#, r#""s s""#),
        "scope id has a disallowed character at byte 1",
    );
}

const SECOND: &str = r#"{"secs":1,"nanos":0}"#;

#[test]
fn invalid_allowances_and_denials() {
    let allowance_json = |capacity: &str, available: &str| {
        format!(r#"{{"capacity":{capacity},"available":{available},"replenishes_after":{SECOND}}}"#)
    };
    reject::<Allowance>(&allowance_json("5", "6"), "available units (6) exceed the capacity (5)");
    reject::<Allowance>(
        &allowance_json(MAX_LIMIT_TEXT, "18446744073709551615"),
        "available units (18446744073709551615) exceed the capacity (9223372036854775807)",
    );
    reject::<Allowance>(&allowance_json("0", "0"), "capacity must be at least 1");
    reject::<Allowance>(
        &format!(r#"{{"capacity":5,"available":1,"replenishes_after":{SECOND},"limit":5}}"#),
        "unknown field `limit`, expected one of `capacity`, `available`, `replenishes_after`",
    );
    reject::<Allowance>(
        r#"{"capacity":5,"available":1,"replenishes_after":{"secs":1,"nanos":0,"n":0}}"#,
        "unknown field `n`, expected `secs` or `nanos`",
    );

    reject::<QuotaDenial>(
        &format!(r#"{{"capacity":0,"retry_after":{SECOND}}}"#),
        "capacity must be at least 1",
    );
    reject::<QuotaDenial>(
        &format!(r#"{{"capacity":1,"retry_after":{SECOND},"reason":"quota_exceeded"}}"#),
        "unknown field `reason`, expected `capacity` or `retry_after`",
    );

    reject::<Denial>(
        &format!(r#"{{"reason":"quota_exceeded","capacity":0,"retry_after":{SECOND}}}"#),
        "capacity must be at least 1",
    );
    reject::<Denial>(
        &format!(r#"{{"reason":"quota_exceeded","capacity":1,"retry_after":{SECOND},"index":0}}"#),
        "unknown field `index`, expected `capacity` or `retry_after`",
    );
    reject::<Denial>(
        r#"{"reason":"storage_capacity","retry_after":null,"capacity":1}"#,
        "unknown field `capacity`, expected `retry_after`",
    );
    reject::<Denial>(
        r#"{"reason":"storage_capacity","retry_after":{"secs":1,"nanos":0,"z":1}}"#,
        "unknown field `z`, expected `secs` or `nanos`",
    );
    reject::<Denial>(
        r#"{"reason":"backend_error"}"#,
        "unknown variant `backend_error`, expected `quota_exceeded` or `storage_capacity`",
    );
    reject::<Denial>(r#"{"retry_after":null}"#, "missing field `reason`");
}

#[test]
fn invalid_decisions() {
    reject::<Decision>(
        &format!(
            r#"{{"outcome":"allowed","allowance":{{"capacity":5,"available":6,"replenishes_after":{SECOND}}}}}"#
        ),
        "available units (6) exceed the capacity (5)",
    );
    reject::<Decision>(
        &format!(r#"{{"outcome":"shadow_denied","denial":{{"capacity":0,"retry_after":{SECOND}}}}}"#),
        "capacity must be at least 1",
    );
    reject::<Decision>(
        &format!(
            r#"{{"outcome":"denied","denial":{{"reason":"quota_exceeded","capacity":0,"retry_after":{SECOND}}}}}"#
        ),
        "capacity must be at least 1",
    );
    // A shadow decision holds a quota denial only: a storage-capacity denial cannot be shadowed.
    reject::<Decision>(
        r#"{"outcome":"shadow_denied","denial":{"reason":"storage_capacity","retry_after":null}}"#,
        "unknown field `reason`, expected `capacity` or `retry_after`",
    );
    // Unknown fields at every level.
    reject::<Decision>(
        &format!(
            r#"{{"outcome":"allowed","allowance":{{"capacity":5,"available":1,"replenishes_after":{SECOND}}},"permits_request":true}}"#
        ),
        "unknown field `permits_request`, expected `allowance`",
    );
    reject::<Decision>(
        &format!(
            r#"{{"outcome":"allowed","allowance":{{"capacity":5,"available":1,"replenishes_after":{SECOND},"x":1}}}}"#
        ),
        "unknown field `x`, expected one of `capacity`, `available`, `replenishes_after`",
    );
    reject::<Decision>(
        r#"{"outcome":"allowed","allowance":{"capacity":5,"available":1,"replenishes_after":{"secs":1,"nanos":0,"x":1}}}"#,
        "unknown field `x`, expected `secs` or `nanos`",
    );
    reject::<Decision>(
        &format!(
            r#"{{"outcome":"shadow_denied","denial":{{"capacity":1,"retry_after":{SECOND}}},"index":0}}"#
        ),
        "unknown field `index`, expected `denial`",
    );
    reject::<Decision>(
        r#"{"outcome":"denied","denial":{"reason":"storage_capacity","retry_after":null},"x":1}"#,
        "unknown field `x`, expected `denial`",
    );
    reject::<Decision>(
        r#"{"outcome":"denied","denial":{"reason":"storage_capacity","retry_after":null,"y":2}}"#,
        "unknown field `y`, expected `retry_after`",
    );
    reject::<Decision>(
        r#"{"outcome":"admitted"}"#,
        "unknown variant `admitted`, expected one of `allowed`, `shadow_denied`, `denied`",
    );
    reject::<Decision>(r#"{"allowance":null}"#, "missing field `outcome`");
    reject::<Decision>(r#"{"outcome":"allowed"}"#, "missing field `allowance`");
}

#[test]
fn invalid_batch_decisions() {
    let quota = format!(r#"{{"capacity":1,"retry_after":{SECOND}}}"#);
    let storage = r#"{"reason":"storage_capacity","retry_after":null}"#;
    reject::<BatchDecision>(r#"{"outcome":"allowed","allowances":[]}"#, "an allowed batch has no allowances");
    reject::<BatchDecision>(
        &format!(r#"{{"outcome":"denied","index":2,"batch_size":2,"denial":{storage}}}"#),
        "denied index 2 is not below the batch size 2",
    );
    reject::<BatchDecision>(
        &format!(r#"{{"outcome":"denied","index":0,"batch_size":0,"denial":{storage}}}"#),
        "denied index 0 is not below the batch size 0",
    );
    reject::<BatchDecision>(
        &format!(r#"{{"outcome":"shadow_denied","index":7,"batch_size":3,"denial":{quota}}}"#),
        "denied index 7 is not below the batch size 3",
    );
    reject::<BatchDecision>(
        &format!(r#"{{"outcome":"denied","index":-1,"batch_size":3,"denial":{storage}}}"#),
        "invalid value: integer `-1`, expected usize",
    );
    reject::<BatchDecision>(
        &format!(
            r#"{{"outcome":"allowed","allowances":[{{"capacity":5,"available":1,"replenishes_after":{SECOND}}},{{"capacity":5,"available":9,"replenishes_after":{SECOND}}}]}}"#
        ),
        "available units (9) exceed the capacity (5)",
    );
    // Unknown fields at every level.
    reject::<BatchDecision>(
        r#"{"outcome":"allowed","allowances":[],"batch_size":0}"#,
        "unknown field `batch_size`, expected `allowances`",
    );
    reject::<BatchDecision>(
        &format!(
            r#"{{"outcome":"allowed","allowances":[{{"capacity":5,"available":1,"replenishes_after":{SECOND},"index":0}}]}}"#
        ),
        "unknown field `index`, expected one of `capacity`, `available`, `replenishes_after`",
    );
    reject::<BatchDecision>(
        &format!(r#"{{"outcome":"denied","index":0,"batch_size":1,"denial":{storage},"checks":[]}}"#),
        "unknown field `checks`, expected one of `index`, `batch_size`, `denial`",
    );
    reject::<BatchDecision>(
        r#"{"outcome":"denied","index":0,"batch_size":1,"denial":{"reason":"storage_capacity","retry_after":null,"k":0}}"#,
        "unknown field `k`, expected `retry_after`",
    );
    reject::<BatchDecision>(
        &format!(
            r#"{{"outcome":"shadow_denied","index":0,"batch_size":1,"denial":{quota},"mode":"shadow"}}"#
        ),
        "unknown field `mode`, expected one of `index`, `batch_size`, `denial`",
    );
    reject::<BatchDecision>(
        r#"{"outcome":"shadow_denied","index":0,"batch_size":1,"denial":{"capacity":1,"retry_after":{"secs":1,"nanos":0},"w":0}}"#,
        "unknown field `w`, expected `capacity` or `retry_after`",
    );
    reject::<BatchDecision>(
        r#"{"outcome":"denied","index":0,"batch_size":1,"denial":{"reason":"storage_capacity","retry_after":{"secs":0,"nanos":0,"v":0}}}"#,
        "unknown field `v`, expected `secs` or `nanos`",
    );
}

// --- which types implement serde ------------------------------------------------------------

/// Compile-time proof that a type implements none of the listed traits, by the ambiguity
/// trick `static_assertions::assert_not_impl_any!` uses (kept local rather than adding a
/// dependency for four lines): if `$ty` implemented a listed trait, `AmbiguousIfImpl<_>`
/// would have two candidate impls and the `let` would not compile.
macro_rules! assert_not_impl_any {
    ($ty:ty: $($trait_:path),+ $(,)?) => {
        const _: fn() = || {
            trait AmbiguousIfImpl<A> {
                fn some_item() {}
            }
            impl<T: ?Sized> AmbiguousIfImpl<()> for T {}
            $({
                #[allow(dead_code)]
                struct Invalid;
                impl<T: ?Sized + $trait_> AmbiguousIfImpl<Invalid> for T {}
            })+
            let _ = <$ty as AmbiguousIfImpl<_>>::some_item;
        };
    };
}

assert_not_impl_any!(SubjectKey: Serialize, DeserializeOwned);
assert_not_impl_any!(CounterKey: Serialize, DeserializeOwned);
assert_not_impl_any!(PolicyFingerprint: Serialize, DeserializeOwned);
assert_not_impl_any!(KeyHasher: Serialize, DeserializeOwned);
assert_not_impl_any!(PolicySubject<'static, FixedWindowPolicy>: Serialize, DeserializeOwned);
assert_not_impl_any!(Check<'static, GcraPolicy>: Serialize, DeserializeOwned);
assert_not_impl_any!(TheoreticalArrivalTime: Serialize, DeserializeOwned);

/// Runtime probe (autoref specialization) so the test can also show the positive side: the
/// probe answers `true` for the serializable types, which makes its `false` meaningful.
struct Probe<T: ?Sized>(PhantomData<T>);

macro_rules! implements {
    ($ty:ty, $($bound:tt)+) => {{
        #[allow(dead_code)]
        trait Yes {
            fn answer(&self) -> bool {
                true
            }
        }
        impl<T: ?Sized + $($bound)+> Yes for Probe<T> {}
        #[allow(dead_code)]
        trait No {
            fn answer(&self) -> bool {
                false
            }
        }
        impl<T: ?Sized> No for &Probe<T> {}
        (&Probe::<$ty>(PhantomData)).answer()
    }};
}

macro_rules! serde_traits {
    ($ty:ty) => {
        (implements!($ty, Serialize), implements!($ty, DeserializeOwned))
    };
}

#[test]
fn exactly_the_documented_types_are_serializable() {
    let both = (true, true);
    assert_eq!(serde_traits!(PolicyId), both);
    assert_eq!(serde_traits!(ScopeId), both);
    assert_eq!(serde_traits!(FixedWindowPolicy), both);
    assert_eq!(serde_traits!(GcraPolicy), both);
    assert_eq!(serde_traits!(AttemptPolicy), both);
    assert_eq!(serde_traits!(QuotaMode), both);
    assert_eq!(serde_traits!(Capacity), both);
    assert_eq!(serde_traits!(QuotaPeriod), both);
    assert_eq!(serde_traits!(Delay), both);
    assert_eq!(serde_traits!(Allowance), both);
    assert_eq!(serde_traits!(QuotaDenial), both);
    assert_eq!(serde_traits!(Denial), both);
    assert_eq!(serde_traits!(Decision), both);
    assert_eq!(serde_traits!(BatchDecision), both);

    let neither = (false, false);
    assert_eq!(serde_traits!(SubjectKey), neither);
    assert_eq!(serde_traits!(CounterKey), neither);
    assert_eq!(serde_traits!(PolicyFingerprint), neither);
    assert_eq!(serde_traits!(KeyHasher), neither);
    assert_eq!(serde_traits!(PolicySubject<'static, FixedWindowPolicy>), neither);
    assert_eq!(serde_traits!(Check<'static, FixedWindowPolicy>), neither);
    assert_eq!(serde_traits!(TheoreticalArrivalTime), neither);
    assert_eq!(serde_traits!(GcraParameters), neither);
    assert_eq!(serde_traits!(GcraOutcome), neither);
    assert_eq!(serde_traits!(Admitted), neither);
    assert_eq!(serde_traits!(DecisionView<'static>), neither);
}
