//! The shared conformance suite (`runlimit-conformance`) on both Redis limiters, one binary.
//!
//! Each generated test runs one scenario under key prefixes of its own on the server named by
//! `RUNLIMIT_REDIS_TEST_URL`, with time pinned through the shard watermarks: every shard's
//! watermark is set far ahead of the server's clock, so the scripts' `max(TIME, watermark)`
//! is the pinned instant, which only the scenario's `advance` moves. The scenario's keys are
//! deleted when it passes and kept for inspection when it fails. The tests are `#[ignore]`d so
//! a plain `cargo test` needs no server. Run them with
//!
//! ```text
//! RUNLIMIT_REDIS_TEST_URL=redis://127.0.0.1:6379 \
//!     cargo test -p runlimit-redis --test conformance -- --include-ignored
//! ```

#[path = "redis/support.rs"]
mod support;

use std::sync::Arc;

use redis::aio::MultiplexedConnection;
use runlimit_conformance::QuotaBackend;
use runlimit_core::{FixedWindowPolicy, GcraPolicy, Observer, SubjectKey};
use runlimit_redis::{KeyPrefix, Placement, RedisAlgorithm, RedisConfig, RedisStore};

/// How far ahead of the server's clock a scenario's time starts: about 11.6 days, far more
/// than any scenario advances.
const AHEAD_MILLIS: u64 = 1_000_000_000;
/// The shard of every key [`QuotaBackend::subjects_in_one_shard`] hands out.
const SHARED_SHARD: u8 = 0xC3;
/// Keys per shard of an unbounded scenario.
const ROOMY: u32 = 100_000;

/// The key tag of an algorithm.
trait Tag: RedisAlgorithm {
    const KEY_TAG: &'static str;
}
impl Tag for FixedWindowPolicy {
    const KEY_TAG: &'static str = "fw";
}
impl Tag for GcraPolicy {
    const KEY_TAG: &'static str = "gcra";
}

/// A Redis limiter under the suite, with its direct connection, pinned time and the prefixes
/// of every limiter it built.
pub(crate) struct RedisQuota<P> {
    name: &'static str,
    connection: MultiplexedConnection,
    now: u64,
    prefixes: Vec<String>,
    limiter: RedisStore<P, Arc<dyn Observer>>,
}

pub(crate) type RedisFixedWindow = RedisQuota<FixedWindowPolicy>;
pub(crate) type RedisGcra = RedisQuota<GcraPolicy>;

impl<P: Tag> RedisQuota<P> {
    /// A fresh limiter under a new prefix, its time pinned at the scenario's time.
    async fn fresh(&mut self, keys_per_shard: u32, observer: Arc<dyn Observer>) {
        self.limiter = build::<P>(
            self.name,
            &mut self.connection,
            &mut self.prefixes,
            self.now,
            keys_per_shard,
            observer,
        )
        .await;
    }
}

async fn build<P: Tag>(
    name: &str,
    connection: &mut MultiplexedConnection,
    prefixes: &mut Vec<String>,
    now: u64,
    keys_per_shard: u32,
    observer: Arc<dyn Observer>,
) -> RedisStore<P, Arc<dyn Observer>> {
    let prefix = support::unique_prefix(name);
    support::pin(connection, &prefix, P::KEY_TAG, Placement::SingleSlot, now).await;
    let config = RedisConfig::default()
        .with_key_prefix(KeyPrefix::new(&prefix).expect("a valid prefix"))
        .with_maximum_keys_per_shard(keys_per_shard)
        .expect("a valid bound");
    prefixes.push(prefix);
    let limiter = RedisStore::<P>::new(&support::server_url()).expect("a valid URL").with_config(config);
    limiter.prepare().await.expect("prepare the test server");
    limiter.with_observer(observer)
}

impl<P: Tag> QuotaBackend for RedisQuota<P> {
    type Policy = P;
    type Limiter = RedisStore<P, Arc<dyn Observer>>;

    const MAX_BATCH_SIZE: usize = RedisStore::<P>::MAX_BATCH_SIZE;
    const REPORTS_STORAGE_RETRY: bool = true;

    fn run<F>(name: &'static str, scenario: F)
    where
        F: AsyncFnOnce(&mut Self),
    {
        support::runtime().block_on(async {
            let mut connection = support::connect(&support::server_url()).await;
            let now = support::server_millis(&mut connection).await + AHEAD_MILLIS;
            let mut prefixes = Vec::new();
            let limiter = build::<P>(name, &mut connection, &mut prefixes, now, ROOMY, Arc::new(())).await;
            let mut backend = Self { name, connection, now, prefixes, limiter };
            scenario(&mut backend).await;
            for prefix in std::mem::take(&mut backend.prefixes) {
                support::delete_prefix(&mut backend.connection, &prefix).await;
            }
        });
    }

    fn limiter(&self) -> &Self::Limiter {
        &self.limiter
    }

    async fn bounded(&mut self, keys_per_shard: usize) {
        let keys = u32::try_from(keys_per_shard).expect("keys per shard fits u32");
        self.fresh(keys, Arc::new(())).await;
    }

    async fn observed(&mut self, observer: Arc<dyn Observer>) {
        self.fresh(ROOMY, observer).await;
    }

    fn subjects_in_one_shard(&self, count: usize) -> Vec<SubjectKey> {
        (0..u64::try_from(count).expect("count fits u64"))
            .map(|n| support::subject_in(SHARED_SHARD, n))
            .collect()
    }

    async fn advance(&mut self, millis: u64) {
        self.now += millis;
        for prefix in &self.prefixes {
            support::pin(&mut self.connection, prefix, P::KEY_TAG, Placement::SingleSlot, self.now).await;
        }
    }

    async fn reclaim_expired(&mut self) {
        self.limiter.cleanup_expired(u32::MAX).await.expect("cleanup_expired");
    }
}

mod conformance {
    use super::*;

    runlimit_conformance::fixed_window_scenarios!(RedisFixedWindow, #[ignore = "needs RUNLIMIT_REDIS_TEST_URL"]);
    runlimit_conformance::gcra_scenarios!(RedisGcra, #[ignore = "needs RUNLIMIT_REDIS_TEST_URL"]);
}
