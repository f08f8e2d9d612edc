//! The 32-byte key a shard stores, its table hash and its shard.
//!
//! # Layout
//!
//! A [`CounterKey`](runlimit_core::CounterKey) is 64 bytes: a 32-byte
//! [`PolicyFingerprint`](runlimit_core::PolicyFingerprint) (SHA-256) and a 32-byte
//! [`SubjectKey`](runlimit_core::SubjectKey) (HMAC-SHA-256). The store keeps the first 16 bytes
//! of each. Both halves are uniform digest outputs, so two distinct counter keys share a stored
//! key only if both 128-bit prefixes collide: among `n` stored keys the probability is at most
//! `n² / 2¹²⁹` (about 2⁻⁶⁹ for a billion keys). Nobody can aim for a collision without the HMAC
//! secret. Were one to happen, two subjects would share one counter, which makes the limit
//! stricter for both, never looser.
//!
//! Keeping 32 instead of 64 key bytes makes a slot 48 bytes, which matters because hot-key
//! lookups are bound by cache misses on slots.
//!
//! # Hashing
//!
//! The shard tables do not run SipHash (or any hash function) over keys. The table hash is
//! the first 8 subject-key bytes XORed with the first 8 fingerprint bytes, and the shard is
//! chosen from subject-key bytes 8..16. This is safe because a subject key is an
//! HMAC-SHA-256 output under the application's secret ([`KeyHasher`](runlimit_core::KeyHasher)):
//! its bytes are uniform, and an attacker who does not hold the secret can neither choose nor
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

/// Fingerprint bytes 0..16 (2 words) then subject-key bytes 0..16 (2 words), little-endian.
#[derive(Clone, Copy, Debug)]
pub(crate) struct StoredKey([u64; 4]);

impl PartialEq for StoredKey {
    /// Branch-free word comparison (array equality can compile to a `memcmp` call, which
    /// showed up in profiles of table lookups).
    #[inline]
    fn eq(&self, other: &Self) -> bool {
        let [a0, a1, a2, a3] = self.0;
        let [b0, b1, b2, b3] = other.0;
        ((a0 ^ b0) | (a1 ^ b1) | (a2 ^ b2) | (a3 ^ b3)) == 0
    }
}

impl Eq for StoredKey {}

/// Little-endian word `index` (0..2) of a 32-byte digest.
#[inline(always)]
fn word(bytes: &[u8; 32], index: usize) -> u64 {
    let mut word = [0u8; 8];
    if let Some(source) = bytes.get(index * 8..index * 8 + 8) {
        word.copy_from_slice(source);
    }
    u64::from_le_bytes(word)
}

impl StoredKey {
    /// All zeros: a placeholder for scratch arrays, overwritten before use.
    pub(crate) const ZERO: Self = Self([0; 4]);

    #[inline]
    pub(crate) fn of<P: RateLimitPolicy>(check: &Check<'_, P>) -> Self {
        let fingerprint = check.policy().fingerprint().as_bytes();
        let subject = check.subject();
        let subject = subject.as_bytes();
        Self([word(fingerprint, 0), word(fingerprint, 1), word(subject, 0), word(subject, 1)])
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
    fn keeps_16_byte_prefixes_of_fingerprint_and_subject() {
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
        assert_eq!(key.0[3], 0x0f0e_0d0c_0b0a_0908);
        assert_eq!(key.hash(), key.0[2] ^ key.0[0]);
        let mut other = digest;
        other[15] ^= 1;
        assert_ne!(key, StoredKey::of(&Check::new(SubjectKey::from_digest(other).bind(&policy))));
        // Bytes past the 16-byte prefix are not stored.
        let mut same = digest;
        same[31] ^= 1;
        assert_eq!(key, StoredKey::of(&Check::new(SubjectKey::from_digest(same).bind(&policy))));
    }

    #[test]
    fn shard_selection_is_in_range_and_uses_the_high_bits() {
        let mut key = StoredKey([0; 4]);
        assert_eq!(key.shard(64), 0);
        key.0[3] = u64::MAX;
        assert_eq!(key.shard(64), 63);
        key.0[3] = 1 << 63;
        assert_eq!(key.shard(3), 1);
        assert_eq!(key.shard(1), 0);
    }
}
