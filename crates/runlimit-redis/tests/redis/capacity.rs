//! Hard bounds without eviction: a flood of new keys beyond the configured bound is denied
//! with `StorageCapacity`, no live key loses its count, the server's memory stays bounded, and
//! cleanup frees slots once entries expire.

use crate::support;

use std::time::Duration;

use redis::aio::MultiplexedConnection;
use runlimit_core::{Check, DecisionView, Delay, Denial, FixedWindowPolicy, PolicyId, ScopeId, SubjectKey};
use runlimit_redis::{KeyPrefix, Placement, RedisConfig, RedisLimiter};

/// Keys per shard of the bounded limiter.
const BOUND: u32 = 8;
/// Distinct new keys per shard the flood tries: four times the bound.
const FLOOD_PER_SHARD: u64 = 32;

async fn used_memory(connection: &mut MultiplexedConnection) -> u64 {
    let info: String = redis::cmd("INFO").arg("memory").query_async(connection).await.expect("INFO memory");
    info.lines()
        .find_map(|line| line.strip_prefix("used_memory:"))
        .and_then(|value| value.trim().parse().ok())
        .expect("used_memory")
}

/// Subject `n` of `shard`, its second byte (the bucket) spread too.
fn key(shard: u8, n: u64) -> SubjectKey {
    support::subject_in(shard, n)
}

#[test]
#[ignore = "needs RUNLIMIT_REDIS_TEST_URL"]
fn a_flood_of_new_keys_is_denied_and_no_live_key_loses_its_count() {
    support::runtime().block_on(async {
        // A server of the test's own, so used_memory measures this limiter alone.
        let server = support::own_server(&[]).await;
        let mut direct = support::connect(&server.url()).await;
        let prefix = "capacity";
        let now = support::server_millis(&mut direct).await + 1_000_000;
        support::pin(&mut direct, prefix, "fw", Placement::SingleSlot, now).await;
        let config = RedisConfig::default()
            .with_key_prefix(KeyPrefix::new(prefix).unwrap())
            .with_maximum_keys_per_shard(BOUND)
            .unwrap();
        let limiter = RedisLimiter::new(&server.url()).unwrap().with_config(config);
        limiter.prepare().await.unwrap();
        let policy = FixedWindowPolicy::new(
            PolicyId::new("capacity").unwrap(),
            ScopeId::new("flood").unwrap(),
            5,
            Duration::from_secs(60),
        )
        .unwrap();

        // Fill every shard to its bound: every key allowed once.
        for shard in 0..=u8::MAX {
            for n in 0..u64::from(BOUND) {
                let decision = limiter.check(&Check::new(key(shard, n).bind(&policy))).await.unwrap();
                assert!(decision.permits_request(), "shard {shard} key {n}: {decision:?}");
            }
        }
        let full = used_memory(&mut direct).await;

        // The flood: three times as many new keys again, in every shard. Each is denied for
        // storage with the time until the shard's earliest expiry (the whole window: nothing
        // has expired), and the live keys keep counting.
        for shard in 0..=u8::MAX {
            for n in u64::from(BOUND)..FLOOD_PER_SHARD {
                let decision = limiter.check(&Check::new(key(shard, n).bind(&policy))).await.unwrap();
                assert_eq!(
                    decision.view(),
                    DecisionView::Denied {
                        denial: &Denial::StorageCapacity { retry_after: Some(Delay::from_millis(60_000)) }
                    },
                    "shard {shard} key {n}"
                );
            }
        }
        let flooded = used_memory(&mut direct).await;
        assert!(
            flooded.saturating_sub(full) < 64 * 1024,
            "denied keys took memory: {full} bytes full, {flooded} after the flood"
        );
        for shard in 0..=u8::MAX {
            for n in 0..u64::from(BOUND) {
                let snapshot = limiter.peek(key(shard, n).bind(&policy)).await.unwrap();
                assert_eq!(snapshot.available(), 4, "shard {shard} key {n} kept its count");
            }
            let entries: u32 = redis::cmd("HGET")
                .arg(support::shard_hash(prefix, "fw", shard))
                .arg("n")
                .query_async(&mut direct)
                .await
                .unwrap();
            assert_eq!(entries, BOUND, "shard {shard}");
        }
        let live = 256 * u64::from(BOUND);
        println!(
            "{live} live keys at a bound of {BOUND} per shard: used_memory {full} bytes, +{} after {} denied keys",
            flooded.saturating_sub(full),
            256 * (FLOOD_PER_SHARD - u64::from(BOUND))
        );

        // Once the window has passed, cleanup frees every slot and a new key fits.
        support::pin(&mut direct, prefix, "fw", Placement::SingleSlot, now + 60_000).await;
        assert_eq!(limiter.cleanup_expired(u32::MAX).await.unwrap(), live);
        let fresh = Check::new(key(0x17, FLOOD_PER_SHARD).bind(&policy));
        assert!(limiter.check(&fresh).await.unwrap().permits_request());
        assert_eq!(limiter.cleanup_expired(u32::MAX).await.unwrap(), 0);
    });
}

/// An admission of a stored key never rewrites its recorded expiry (it only ever grows), so
/// cleanup reads the state behind a passed score: a live entry is re-scored at its real expiry,
/// never removed, and removed once that expiry has passed.
#[test]
#[ignore = "needs RUNLIMIT_REDIS_TEST_URL"]
fn cleanup_rescores_live_entries_whose_recorded_expiry_has_passed() {
    support::runtime().block_on(async {
        let url = support::server_url();
        let mut direct = support::connect(&url).await;
        let prefix = support::unique_prefix("capacity-rescore");
        let start = support::server_millis(&mut direct).await + 1_000_000;
        support::pin(&mut direct, &prefix, "gcra", Placement::SingleSlot, start).await;
        let config = RedisConfig::default().with_key_prefix(KeyPrefix::new(&prefix).unwrap());
        let limiter = runlimit_redis::RedisGcraLimiter::new(&url).unwrap().with_config(config);
        limiter.prepare().await.unwrap();
        // One unit per second, burst 2.
        let policy = runlimit_core::GcraPolicy::new(
            PolicyId::new("capacity.rescore").unwrap(),
            ScopeId::new("gcra").unwrap(),
            1,
            Duration::from_secs(1),
            2,
        )
        .unwrap();
        let subject = key(0x33, 1);
        let check = Check::new(subject.bind(&policy));
        assert!(limiter.check(&check).await.unwrap().permits_request()); // expires at start + 1,000
        support::pin(&mut direct, &prefix, "gcra", Placement::SingleSlot, start + 500).await;
        assert!(limiter.check(&check).await.unwrap().permits_request()); // now at start + 2,000
        let (state, score) = support::stored_entry(&mut direct, &prefix, "gcra", &policy, &subject).await;
        assert_eq!((state, score), (Some(format!("{}:0", start + 2_000)), Some((start + 1_000) as f64)));

        // Past the recorded expiry, before the real one: nothing removed, the score corrected.
        support::pin(&mut direct, &prefix, "gcra", Placement::SingleSlot, start + 1_500).await;
        assert_eq!(limiter.cleanup_expired(100).await.unwrap(), 0);
        let (state, score) = support::stored_entry(&mut direct, &prefix, "gcra", &policy, &subject).await;
        assert_eq!((state, score), (Some(format!("{}:0", start + 2_000)), Some((start + 2_000) as f64)));
        assert_eq!(limiter.peek(subject.bind(&policy)).await.unwrap().available(), 1);

        // At the real expiry it goes, and its slot with it.
        support::pin(&mut direct, &prefix, "gcra", Placement::SingleSlot, start + 2_000).await;
        assert_eq!(limiter.cleanup_expired(100).await.unwrap(), 1);
        assert_eq!(
            support::stored_entry(&mut direct, &prefix, "gcra", &policy, &subject).await,
            (None, None)
        );
        let entries: Option<u64> = redis::cmd("HGET")
            .arg(support::shard_hash(&prefix, "gcra", 0x33))
            .arg("n")
            .query_async(&mut direct)
            .await
            .unwrap();
        assert_eq!(entries, Some(0));
        support::delete_prefix(&mut direct, &prefix).await;
    });
}
