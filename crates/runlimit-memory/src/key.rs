//! The 16-byte key a shard stores, its table hash and its shard.
//!
//! # Layout
//!
//! A [`CounterKey`](runlimit_core::CounterKey) is 64 bytes: a 32-byte
//! [`PolicyFingerprint`](runlimit_core::PolicyFingerprint) (SHA-256) and a 32-byte
//! [`SubjectKey`](runlimit_core::SubjectKey) (HMAC-SHA-256). The store keeps one 16-byte value:
//! the first 16 subject-key bytes XORed with the first 16 fingerprint bytes.
//!
//! Two distinct counter keys `(f, s)` and `(f', s')` share a stored key only when
//! `s[..16] ⊕ s'[..16] = f[..16] ⊕ f'[..16]`:
//!
//! - under one policy (`f = f'`), when the two subject keys' 128-bit prefixes collide;
//! - under two policies with independent subject keys (what
//!   [`KeyHasher::hash_for`](runlimit_core::KeyHasher::hash_for) derives), when one uniform
//!   128-bit value (`s ⊕ s'`) equals a fixed one;
//! - under two policies with one subject key bound to both
//!   ([`SubjectKey::bind`](runlimit_core::SubjectKey::bind)), when the two policies'
//!   fingerprints share their 128-bit prefix.
//!
//! Subject keys are uniform HMAC outputs and fingerprints SHA-256 outputs, so each case has
//! probability 2⁻¹²⁸ per pair: among `n` stored keys of `p` policies at most
//! `(n² + p²) / 2¹²⁹` (about 2⁻⁶⁹ for a billion keys). Nobody can aim for a collision without
//! the HMAC secret. Were one to happen, two subjects would share one counter, which makes the
//! limit stricter for both, never looser. This is the same bound the store had when it kept
//! both 16-byte prefixes side by side (32 bytes).
//!
//! Keeping 16 instead of 64 key bytes makes a slot 32 bytes (two per cache line), which
//! matters because hot-key lookups are bound by cache misses on slots, and because the slot is
//! most of a key's resident memory.
//!
//! # Hashing
//!
//! The shard tables do not run SipHash (or any hash function) over keys. The table hash is
//! the stored key's first 8 bytes (subject-key bytes 0..8 XORed with fingerprint bytes 0..8),
//! and the shard is chosen from subject-key bytes 8..16 alone, so one subject key bound to
//! several policies lands on one shard. This is safe because a subject key is an
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

/// Subject-key bytes 0..16 XOR fingerprint bytes 0..16, as two little-endian words.
#[derive(Clone, Copy, Debug)]
pub(crate) struct StoredKey([u64; 2]);

impl PartialEq for StoredKey {
    /// Branch-free word comparison (array equality compiles to more instructions, which
    /// showed up in profiles of table lookups and batch validation).
    #[inline]
    fn eq(&self, other: &Self) -> bool {
        let [a0, a1] = self.0;
        let [b0, b1] = other.0;
        ((a0 ^ b0) | (a1 ^ b1)) == 0
    }
}

impl Eq for StoredKey {}

/// Little-endian word `index` (0..4) of a 32-byte digest.
#[inline(always)]
fn word(bytes: &[u8; 32], index: usize) -> u64 {
    let mut word = [0u8; 8];
    if let Some(source) = bytes.get(index * 8..index * 8 + 8) {
        word.copy_from_slice(source);
    }
    u64::from_le_bytes(word)
}

/// A check's stored key and the word its shard is chosen from.
#[derive(Clone, Copy, Debug)]
pub(crate) struct KeyOf {
    pub(crate) key: StoredKey,
    /// Subject-key bytes 8..16 (little-endian).
    shard_word: u64,
}

impl KeyOf {
    #[inline]
    pub(crate) fn of<P: RateLimitPolicy>(check: &Check<'_, P>) -> Self {
        let fingerprint = check.policy().fingerprint().as_bytes();
        let subject = check.subject();
        let subject = subject.as_bytes();
        let shard_word = word(subject, 1);
        Self {
            key: StoredKey([word(subject, 0) ^ word(fingerprint, 0), shard_word ^ word(fingerprint, 1)]),
            shard_word,
        }
    }

    /// The shard: subject bytes 8..16 mapped onto `0..shard_count` by a 64×64→128-bit
    /// multiply-high (Lemire's fast range reduction; no division, negligible bias).
    #[inline]
    pub(crate) fn shard(&self, shard_count: usize) -> usize {
        let count = u128::try_from(shard_count).unwrap_or(u128::MAX);
        let wide = (u128::from(self.shard_word) * count) >> 64;
        usize::try_from(wide).unwrap_or(0)
    }
}

impl StoredKey {
    /// All zeros: a placeholder for scratch arrays, overwritten before use.
    pub(crate) const ZERO: Self = Self([0; 2]);

    /// The table hash: subject bytes 0..8 XOR fingerprint bytes 0..8.
    #[inline]
    pub(crate) fn hash(&self) -> u64 {
        self.0[0]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use runlimit_core::{FixedWindowPolicy, PolicyId, ScopeId, SubjectKey};
    use std::time::Duration;

    fn policy(id: &str) -> FixedWindowPolicy {
        FixedWindowPolicy::new(
            PolicyId::new(id).unwrap(),
            ScopeId::new("s").unwrap(),
            1,
            Duration::from_secs(1),
        )
        .unwrap()
    }

    #[test]
    fn folds_the_16_byte_prefixes_of_subject_and_fingerprint() {
        let policy = policy("p");
        let digest: [u8; 32] = std::array::from_fn(|i| u8::try_from(i).unwrap());
        let subject = SubjectKey::from_digest(digest);
        let of = KeyOf::of(&Check::new(subject.bind(&policy)));
        let fingerprint = policy.fingerprint().as_bytes();
        let fingerprint_word =
            |i: usize| u64::from_le_bytes(fingerprint[i * 8..i * 8 + 8].try_into().unwrap());
        assert_eq!(of.key.0[0], 0x0706_0504_0302_0100 ^ fingerprint_word(0));
        assert_eq!(of.key.0[1], 0x0f0e_0d0c_0b0a_0908 ^ fingerprint_word(1));
        assert_eq!(of.shard_word, 0x0f0e_0d0c_0b0a_0908);
        assert_eq!(of.key.hash(), of.key.0[0]);
        let mut other = digest;
        other[15] ^= 1;
        assert_ne!(of.key, KeyOf::of(&Check::new(SubjectKey::from_digest(other).bind(&policy))).key);
        // Bytes past the 16-byte prefix are not stored.
        let mut same = digest;
        same[31] ^= 1;
        assert_eq!(of.key, KeyOf::of(&Check::new(SubjectKey::from_digest(same).bind(&policy))).key);
    }

    #[test]
    fn one_subject_under_two_policies_is_two_keys_on_one_shard() {
        let subject = SubjectKey::from_digest([7; 32]);
        let (first, second) = (policy("a"), policy("b"));
        let a = KeyOf::of(&Check::new(subject.bind(&first)));
        let b = KeyOf::of(&Check::new(subject.bind(&second)));
        assert_ne!(a.key, b.key);
        assert_ne!(a.key.hash(), b.key.hash());
        assert_eq!(a.shard(64), b.shard(64));
    }

    #[test]
    fn shard_selection_is_in_range_and_uses_the_high_bits() {
        let mut of = KeyOf { key: StoredKey::ZERO, shard_word: 0 };
        assert_eq!(of.shard(64), 0);
        of.shard_word = u64::MAX;
        assert_eq!(of.shard(64), 63);
        of.shard_word = 1 << 63;
        assert_eq!(of.shard(3), 1);
        assert_eq!(of.shard(1), 0);
    }
}
