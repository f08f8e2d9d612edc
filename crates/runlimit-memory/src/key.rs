//! The 48-byte key a shard stores, its table hash and its shard.
//!
//! # Layout
//!
//! A [`CounterKey`] is 64 bytes: a 32-byte [`PolicyFingerprint`](runlimit_core::PolicyFingerprint)
//! and a 32-byte [`SubjectKey`](runlimit_core::SubjectKey). The store keeps the whole subject
//! key and the first 16 bytes (128 bits) of the fingerprint. Two distinct counter keys share a
//! stored key only if they have the same subject key and two of the application's policies
//! agree on 128 bits of SHA-256; the fingerprint is not influenced by request data, and the
//! chance that any two of `p` policies collide is at most `p² / 2¹²⁹`. Subjects are compared
//! in full, so no choice of subject can make two subjects share a counter.
//!
//! # Hashing
//!
//! The shard tables do not run SipHash (or any hash function) over keys. The table hash is
//! the first 8 subject-key bytes XORed with the first 8 fingerprint bytes, and the shard is
//! chosen from subject-key bytes 8..16. This is safe because a subject key is an
//! HMAC-SHA-256 output under the application's secret ([`KeyHasher`](runlimit_core::KeyHasher)):
//! its bytes are uniform and an attacker who does not hold the secret cannot choose or
//! predict them, so they cannot aim keys at one bucket or one shard (the HashDoS attack
//! SipHash defends against). XORing a fixed per-policy value keeps the hash uniform while
//! separating the same subject under policies that differ only in their limits. Shard and
//! bucket positions come from different bytes, so keys within one shard still spread over
//! all of its buckets.
//!
//! The argument relies on the documented contract of
//! [`SubjectKey::from_digest`](runlimit_core::SubjectKey::from_digest): digests must already be
//! opaque and secret-keyed. Raw or padded identities fed through it would hash poorly and
//! could share a counter with each other.

use runlimit_core::{Check, RateLimitPolicy};

/// Fingerprint prefix (2 words) then the full subject key (4 words), little-endian words.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) struct StoredKey([u64; 6]);

fn word(bytes: &[u8], at: usize) -> u64 {
    let mut word = [0u8; 8];
    if let Some(source) = bytes.get(at..at + 8) {
        word.copy_from_slice(source);
    }
    u64::from_le_bytes(word)
}

impl StoredKey {
    pub(crate) fn of<P: RateLimitPolicy>(check: &Check<'_, P>) -> Self {
        let fingerprint = check.policy().fingerprint().as_bytes();
        let subject = check.subject();
        let subject = subject.as_bytes();
        Self([
            word(fingerprint, 0),
            word(fingerprint, 8),
            word(subject, 0),
            word(subject, 8),
            word(subject, 16),
            word(subject, 24),
        ])
    }

    /// The table hash: subject bytes 0..8 XOR fingerprint bytes 0..8.
    #[inline]
    pub(crate) fn hash(&self) -> u64 {
        self.0[2] ^ self.0[0]
    }

    /// The shard: subject bytes 8..16 mapped onto `0..shard_count` by a 64×64→128-bit
    /// multiply-high (Lemire's fast range reduction; no division, negligible bias).
    #[inline]
    pub(crate) fn shard(&self, shard_count: usize) -> usize {
        let count = u128::try_from(shard_count).unwrap_or(u128::MAX);
        let wide = (u128::from(self.0[3]) * count) >> 64;
        usize::try_from(wide).unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use runlimit_core::{FixedWindowPolicy, PolicyId, ScopeId, SubjectKey};
    use std::time::Duration;

    #[test]
    fn keeps_the_whole_subject_and_a_fingerprint_prefix() {
        let policy = FixedWindowPolicy::new(
            PolicyId::new("p").unwrap(),
            ScopeId::new("s").unwrap(),
            1,
            Duration::from_secs(1),
        )
        .unwrap();
        let digest: [u8; 32] = std::array::from_fn(|i| u8::try_from(i).unwrap());
        let subject = SubjectKey::from_digest(digest);
        let key = StoredKey::of(&Check::new(subject.bind(&policy)));
        let fingerprint = policy.fingerprint().as_bytes();
        assert_eq!(key.0[0], u64::from_le_bytes(fingerprint[..8].try_into().unwrap()));
        assert_eq!(key.0[2], 0x0706_0504_0302_0100);
        assert_eq!(key.0[5], 0x1f1e_1d1c_1b1a_1918);
        assert_eq!(key.hash(), key.0[2] ^ key.0[0]);
        let mut other = digest;
        other[31] ^= 1;
        assert_ne!(key, StoredKey::of(&Check::new(SubjectKey::from_digest(other).bind(&policy))));
    }

    #[test]
    fn shard_selection_is_in_range_and_uses_the_high_bits() {
        let mut key = StoredKey([0; 6]);
        assert_eq!(key.shard(64), 0);
        key.0[3] = u64::MAX;
        assert_eq!(key.shard(64), 63);
        key.0[3] = 1 << 63;
        assert_eq!(key.shard(3), 1);
        assert_eq!(key.shard(1), 0);
    }
}
