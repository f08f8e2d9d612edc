//! The `serde` feature: validated configuration round trips and telemetry snapshots.

use runlimit_core::Check;
use runlimit_memory::{ManualClock, MemoryStore, MemoryStoreConfig};

use crate::support::{fixed, subject};

#[test]
fn config_round_trips_and_fills_defaults() {
    let config = MemoryStoreConfig::new(50_000).unwrap().with_shard_count(64).unwrap();
    let json = serde_json::to_string(&config).unwrap();
    assert_eq!(
        json,
        r#"{"max_keys":50000,"shard_count":64,"expired_removals_per_check":16,"maximum_batch_size":64}"#
    );
    assert_eq!(serde_json::from_str::<MemoryStoreConfig>(&json).unwrap(), config);
    let minimal: MemoryStoreConfig = serde_json::from_str(r#"{"max_keys":10}"#).unwrap();
    assert_eq!(minimal, MemoryStoreConfig::new(10).unwrap());
}

#[test]
fn config_deserialization_revalidates_and_rejects_unknown_fields() {
    let error = |json: &str| serde_json::from_str::<MemoryStoreConfig>(json).unwrap_err().to_string();
    assert_eq!(error(r#"{"max_keys":0}"#), "max_keys is 0, outside the accepted range 1..=4294967295");
    assert_eq!(
        error(r#"{"max_keys":10,"shard_count":11}"#),
        "shard_count is 11, outside the accepted range 1..=10"
    );
    assert_eq!(
        error(r#"{"max_keys":10,"expired_removals_per_check":0}"#),
        "expired_removals_per_check is 0, outside the accepted range 1..=1024"
    );
    assert_eq!(
        error(r#"{"max_keys":10,"maximum_batch_size":2000}"#),
        "maximum_batch_size is 2000, outside the accepted range 1..=1024"
    );
    assert!(error(r#"{"max_keys":10,"evict":true}"#).starts_with("unknown field `evict`"));
    assert!(error(r#"{"shard_count":1}"#).starts_with("missing field `max_keys`"));
}

#[test]
fn stats_serialize_for_telemetry() {
    let config = MemoryStoreConfig::new(5).unwrap().with_shard_count(2).unwrap();
    let store = MemoryStore::builder(config).with_clock(ManualClock::new()).build();
    let policy = fixed("p", 1, 1_000);
    store.check(&Check::new(subject(&policy, 1))).unwrap();
    let stats = store.stats();
    let shard = stats.shards.iter().position(|shard| shard.entries == 1).unwrap();
    let entries = |index| u8::from(index == shard);
    assert_eq!(
        serde_json::to_string(&stats).unwrap(),
        format!(
            r#"{{"shards":[{{"shard_index":0,"entries":{},"capacity":3,"headroom":{},"poisoned":false}},{{"shard_index":1,"entries":{},"capacity":2,"headroom":{},"poisoned":false}}]}}"#,
            entries(0),
            3 - entries(0),
            entries(1),
            2 - entries(1)
        )
    );
}

/// Live instances and key material implement no serde trait, even with the `serde` feature on
/// (which enables `runlimit-core/serde`), while the configuration does, so the negative
/// assertions are not vacuous. Checked at compile time.
mod live_instances {
    use ::serde::{Deserialize, Serialize, de::DeserializeOwned};
    use runlimit_core::{CounterKey, KeyHasher, PolicyFingerprint, SubjectKey};
    use runlimit_memory::{
        GcraStore, GcraStoreBuilder, MemoryAttemptLimiter, MemoryAttemptLimiterBuilder, MemoryAttemptReceipt,
        MemoryStore, MemoryStoreBuilder, MemoryStoreConfig,
    };
    use static_assertions::{assert_impl_all, assert_not_impl_any};

    assert_impl_all!(MemoryStoreConfig: Serialize, DeserializeOwned);
    assert_not_impl_any!(MemoryStore: Serialize, DeserializeOwned, Deserialize<'static>);
    assert_not_impl_any!(GcraStore: Serialize, DeserializeOwned, Deserialize<'static>);
    assert_not_impl_any!(MemoryStoreBuilder: Serialize, DeserializeOwned, Deserialize<'static>);
    assert_not_impl_any!(GcraStoreBuilder: Serialize, DeserializeOwned, Deserialize<'static>);
    assert_not_impl_any!(MemoryAttemptLimiter: Serialize, DeserializeOwned, Deserialize<'static>);
    assert_not_impl_any!(MemoryAttemptLimiterBuilder: Serialize, DeserializeOwned, Deserialize<'static>);
    assert_not_impl_any!(MemoryAttemptReceipt: Serialize, DeserializeOwned, Deserialize<'static>);
    assert_not_impl_any!(SubjectKey: Serialize, DeserializeOwned, Deserialize<'static>);
    assert_not_impl_any!(CounterKey: Serialize, DeserializeOwned, Deserialize<'static>);
    assert_not_impl_any!(PolicyFingerprint: Serialize, DeserializeOwned, Deserialize<'static>);
    assert_not_impl_any!(KeyHasher: Serialize, DeserializeOwned, Deserialize<'static>);

    /// Names the compile-time assertions above in the test list; the positive side round-trips.
    #[test]
    fn live_instances_implement_no_serde_traits_but_the_config_does() {
        let config = MemoryStoreConfig::new(10).unwrap();
        let json = serde_json::to_string(&config).unwrap();
        assert_eq!(serde_json::from_str::<MemoryStoreConfig>(&json).unwrap(), config);
    }
}
