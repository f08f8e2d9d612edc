//! Occupancy snapshots for telemetry.

/// A snapshot of a store's occupancy, one [`ShardStats`] per shard, from
/// [`MemoryStore::stats`](crate::MemoryStore::stats) or
/// [`GcraStore::stats`](crate::GcraStore::stats).
///
/// Shards are read one after another, so the snapshot is not atomic across shards. With the
/// `serde` feature it serializes (for telemetry) as
/// `{"shards": [{"shard_index": 0, "entries": 3, "capacity": 10, "headroom": 7,
/// "poisoned": false}]}`; it carries no keys.
///
/// # Examples
///
/// ```
/// use runlimit_memory::{MemoryStore, MemoryStoreConfig};
///
/// let store = MemoryStore::new(MemoryStoreConfig::new(1_000)?.with_shard_count(4)?);
/// let stats = store.stats();
/// assert_eq!(stats.shards.len(), 4);
/// assert_eq!(stats.capacity(), 1_000);
/// assert_eq!((stats.entries(), stats.headroom()), (0, 1_000));
/// assert_eq!(stats.poisoned_shards(), 0);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct MemoryStoreStats {
    /// Per-shard occupancy, in shard order.
    pub shards: Vec<ShardStats>,
}

impl MemoryStoreStats {
    /// Stored entries across all shards.
    #[must_use]
    pub fn entries(&self) -> usize {
        self.shards.iter().map(|shard| shard.entries).sum()
    }

    /// Total capacity: the configured `max_keys`.
    #[must_use]
    pub fn capacity(&self) -> usize {
        self.shards.iter().map(|shard| shard.capacity).sum()
    }

    /// Free slots across all shards. A new key only fits in its own shard, so watch
    /// [`ShardStats::headroom`] of the fullest shard too.
    #[must_use]
    pub fn headroom(&self) -> usize {
        self.shards.iter().map(ShardStats::headroom).sum()
    }

    /// The shard with the least headroom.
    #[must_use]
    pub fn fullest_shard(&self) -> Option<&ShardStats> {
        self.shards.iter().min_by_key(|shard| shard.headroom())
    }

    /// How many shards are poisoned.
    #[must_use]
    pub fn poisoned_shards(&self) -> usize {
        self.shards.iter().filter(|shard| shard.poisoned).count()
    }
}

/// One shard's occupancy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct ShardStats {
    /// The shard's index.
    pub shard_index: usize,
    /// Stored entries: live ones, plus expired ones that bounded cleanup has not removed yet
    /// (an expired entry is still reused by its own key and reclaimed before a new key is
    /// refused).
    pub entries: usize,
    /// The shard's fixed capacity.
    pub capacity: usize,
    /// Free slots, `capacity - entries`: how many new keys the shard can take right now
    /// (more once cleanup removes expired entries).
    pub headroom: usize,
    /// Whether the shard is poisoned (its operations fail until
    /// [`recover_poisoned`](crate::MemoryStore::recover_poisoned)).
    pub poisoned: bool,
}

impl ShardStats {
    /// Free slots: `capacity - entries` (the [`headroom`](Self::headroom) field).
    #[must_use]
    pub fn headroom(&self) -> usize {
        self.headroom
    }
}
