//! Where a check's state lives: shard, bucket, member name and the Redis key names.
//!
//! A limiter's state is grouped into [`SHARDS`] shards by the first byte of the subject key
//! (as PostgreSQL's capacity shards are), and each shard's expiry index into [`BUCKETS`]
//! buckets by the low six bits of its second byte. Per shard:
//!
//! | key | type | holds |
//! |---|---|---|
//! | `<base>s` | hash | member → state, and the fields `w` (the shard's time watermark, ms), `n` (the entries it holds) and `e` (a lower bound of its earliest expiry, ms) |
//! | `<base>i` | sorted set | each non-empty bucket, scored by a lower bound of its earliest expiry (ms) |
//! | `<base>x<bucket>` | sorted set | member, scored by the state's expiry (ms) |
//!
//! where `<base>` is `{<prefix>}:<algorithm>1:<shard as two hex digits>:` under
//! [`Placement::SingleSlot`] and `{<prefix>:<algorithm>1:<shard>}:` under
//! [`Placement::PerShard`] (`<algorithm>` is `fw` or `gcra`, `1` the layout version). A member
//! name is 24 opaque bytes: the first 8 bytes of the policy fingerprint and the first 16 of the
//! HMAC subject key, as the memory stores keep 16-byte prefixes of both (so never one of the
//! one-letter field names). One hash per shard lets an admission read a check's state and its
//! shard's fields in one `HMGET` and write them in one `HSET`; small expiry buckets (below the
//! server's `zset-max-listpack-entries`, 128 by default) are stored compactly by Redis.

use runlimit_core::{Check, RateLimitPolicy};

use crate::{
    client::slot_of,
    config::{Placement, RedisConfig, SHARDS},
};

/// Buckets per shard.
pub(crate) const BUCKETS: u8 = 64;

/// Length of a member name in bytes.
pub(crate) const MEMBER_LEN: usize = 24;

/// A check's place: its shard, its bucket in the shard, and its member name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Place {
    pub(crate) shard: u8,
    pub(crate) bucket: u8,
    pub(crate) member: [u8; MEMBER_LEN],
}

impl Place {
    /// The place of `check`'s counter key.
    pub(crate) fn of<P: RateLimitPolicy>(check: &Check<'_, P>) -> Self {
        let subject = check.subject();
        let subject = subject.as_bytes();
        let fingerprint = check.policy().fingerprint().as_bytes();
        let mut member = [0u8; MEMBER_LEN];
        member[..8].copy_from_slice(&fingerprint[..8]);
        member[8..].copy_from_slice(&subject[..16]);
        Self { shard: subject[0], bucket: subject[1] % BUCKETS, member }
    }
}

/// The key-name bases, hash and index names and hash slots of one limiter's 256 shards,
/// computed once.
#[derive(Clone, Debug)]
pub(crate) struct Layout {
    bases: Vec<String>,
    hashes: Vec<String>,
    indexes: Vec<String>,
    slots: Vec<u16>,
}

impl Layout {
    /// The layout of `algorithm` (`fw` or `gcra`) under `config`'s prefix and placement.
    pub(crate) fn new(config: &RedisConfig, algorithm: &str) -> Self {
        let prefix = config.key_prefix().as_str();
        let tag = |shard: usize| match config.placement() {
            Placement::SingleSlot => prefix.to_owned(),
            Placement::PerShard => format!("{prefix}:{algorithm}1:{shard:02x}"),
        };
        let bases: Vec<String> = (0..SHARDS)
            .map(|shard| match config.placement() {
                Placement::SingleSlot => format!("{{{}}}:{algorithm}1:{shard:02x}:", tag(shard)),
                Placement::PerShard => format!("{{{}}}:", tag(shard)),
            })
            .collect();
        let hashes = bases.iter().map(|base| format!("{base}s")).collect();
        let indexes = bases.iter().map(|base| format!("{base}i")).collect();
        let slots = (0..SHARDS).map(|shard| slot_of(&tag(shard))).collect();
        Self { bases, hashes, indexes, slots }
    }

    /// The Redis Cluster hash slot of every key of `shard`.
    pub(crate) fn slot(&self, shard: u8) -> u16 {
        self.slots.get(usize::from(shard)).copied().unwrap_or(0)
    }

    /// The key-name base of `shard`.
    pub(crate) fn base(&self, shard: u8) -> &str {
        self.bases.get(usize::from(shard)).map_or("", String::as_str)
    }

    /// The hash of `shard`: its entries and its fields `w`, `n` and `e` (`<base>s`: the
    /// scripts derive a shard's base from its hash's name).
    pub(crate) fn hash(&self, shard: u8) -> &str {
        self.hashes.get(usize::from(shard)).map_or("", String::as_str)
    }

    /// The bucket index of `shard`.
    pub(crate) fn index(&self, shard: u8) -> &str {
        self.indexes.get(usize::from(shard)).map_or("", String::as_str)
    }

    /// The expiry sorted set of `bucket` in `shard`.
    #[cfg(test)]
    pub(crate) fn expiries(&self, shard: u8, bucket: u8) -> String {
        format!("{}x{bucket}", self.base(shard))
    }

    /// Appends the name of `bucket`'s expiry sorted set in `shard` to `command` as one
    /// argument, without an intermediate allocation.
    pub(crate) fn write_expiries(&self, command: &mut redis::Cmd, shard: u8, bucket: u8) {
        use redis::RedisWrite;
        use std::io::Write;
        let mut digits = [b'x', b'0', b'0'];
        let written = if bucket >= 10 {
            digits[1] += bucket / 10;
            digits[2] += bucket % 10;
            3
        } else {
            digits[1] += bucket;
            2
        };
        let mut arg = command.writer_for_next_arg();
        // Writing to the command's own buffer cannot fail.
        let _ = arg.write_all(self.base(shard).as_bytes());
        let _ = arg.write_all(digits.get(..written).unwrap_or_default());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::KeyPrefix;

    #[test]
    fn key_names_carry_the_placement_hash_tag() {
        let config = RedisConfig::default().with_key_prefix(KeyPrefix::new("api").unwrap());
        let layout = Layout::new(&config, "fw");
        assert_eq!(layout.hash(0x3a), "{api}:fw1:3a:s");
        assert_eq!(layout.index(0), "{api}:fw1:00:i");
        assert_eq!(layout.expiries(0xff, 63), "{api}:fw1:ff:x63");
        for bucket in [0, 7, 10, 63] {
            let mut command = redis::Cmd::new();
            layout.write_expiries(&mut command, 0xff, bucket);
            let mut expected = redis::Cmd::new();
            expected.arg(layout.expiries(0xff, bucket));
            assert_eq!(command.get_packed_command(), expected.get_packed_command());
        }
        let layout = Layout::new(&config.with_placement(Placement::PerShard), "gcra");
        assert_eq!(layout.expiries(0x3a, 7), "{api:gcra1:3a}:x7");
        assert_eq!(layout.slot(0x3a), slot_of("api:gcra1:3a"));
        // The examples of Redis' CLUSTER KEYSLOT documentation: `somekey` and `foo{hash_tag}`.
        assert_eq!(slot_of("somekey"), 11_058);
        assert_eq!(slot_of("hash_tag"), 2_515);
    }
}
