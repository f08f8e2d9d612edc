//! HMAC-derived opaque subject keys and the keys backends store.

use std::{fmt, hash::Hash};

use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

use crate::{
    attempts::AttemptPolicy,
    policy::{PolicyFingerprint, RateLimitPolicy, put_field},
};

/// The shortest secret [`KeyHasher::new`] accepts, in bytes.
pub const MIN_SECRET_LEN: usize = 32;

/// Why [`KeyHasher::new`] rejected a secret.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KeyHasherError {
    /// The secret is shorter than [`MIN_SECRET_LEN`] bytes.
    #[error("key secret is {length} bytes long, below the minimum of {minimum}")]
    SecretTooShort {
        /// The rejected secret's length in bytes (never its content).
        length: usize,
        /// [`MIN_SECRET_LEN`].
        minimum: usize,
    },
}

/// Derives opaque [`SubjectKey`]s from normalized subjects with HMAC-SHA-256 (RFC 2104,
/// FIPS 180-4), domain-separated by the policy the key will be checked against.
///
/// The hasher precomputes the keyed inner and outer SHA-256 states once in
/// [`KeyHasher::new`] (the `hmac` crate's key schedule) and clones them for every subject, so
/// neither the raw secret nor a per-subject key schedule is kept. Treat a live hasher and its
/// clones as secret material: `Debug` prints no state, and the SHA-256 states and buffered
/// input are zeroized when dropped (`hmac`/`sha2` with their `zeroize` feature).
///
/// # Derivation layout
///
/// `HMAC-SHA-256(secret, message)` where `message` is the concatenation of length-prefixed
/// fields, each an unsigned 64-bit big-endian byte length followed by the bytes:
///
/// | field | value |
/// |---|---|
/// | 1 | domain tag: `runlimit/subject/v1` ([`hash_for`](Self::hash_for)) or `runlimit/attempt-subject/v1` ([`hash_attempt_for`](Self::hash_attempt_for)) |
/// | 2 | policy id ([`PolicyId::as_str`](crate::PolicyId::as_str)) |
/// | 3 | scope id |
/// | 4 | the normalized subject bytes |
///
/// Length prefixes make the encoding injective, so no choice of subject bytes can collide with
/// another policy's namespace. The policy's counts and periods are not part of the
/// derivation; they are in the [`PolicyFingerprint`] half of the [`CounterKey`].
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use runlimit_core::{Check, FixedWindowPolicy, KeyHasher, PolicyId, ScopeId};
///
/// let policy = FixedWindowPolicy::new(
///     PolicyId::new("auth.login")?, ScopeId::new("identity")?, 8, Duration::from_secs(60))?;
/// let hasher = KeyHasher::new(&[7u8; 32])?;
/// let subject = hasher.hash_for(&policy, b"user@example.test");
/// let check = Check::new(subject);
/// assert_eq!(check.policy(), &policy);
/// assert!(KeyHasher::new(b"too short").is_err());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct KeyHasher {
    keyed: Hmac<Sha256>,
}

impl KeyHasher {
    /// Precomputes the keyed state for `secret`.
    ///
    /// Load one stable, random secret of at least 32 bytes from secret storage and share it
    /// across every replica sharing a backend; rotating it starts fresh counters.
    ///
    /// # Errors
    ///
    /// [`KeyHasherError::SecretTooShort`] when `secret` has fewer than [`MIN_SECRET_LEN`]
    /// bytes.
    pub fn new(secret: &[u8]) -> Result<Self, KeyHasherError> {
        if secret.len() < MIN_SECRET_LEN {
            return Err(KeyHasherError::SecretTooShort { length: secret.len(), minimum: MIN_SECRET_LEN });
        }
        // HMAC accepts keys of any length, so this cannot fail; map defensively anyway.
        let keyed = <Hmac<Sha256> as KeyInit>::new_from_slice(secret)
            .map_err(|_| KeyHasherError::SecretTooShort { length: secret.len(), minimum: MIN_SECRET_LEN })?;
        Ok(Self { keyed })
    }

    fn derive(&self, tag: &[u8], id: &str, scope: &str, subject: &[u8]) -> SubjectKey {
        let mut mac = self.keyed.clone();
        put_field(&mut mac, tag);
        put_field(&mut mac, id.as_bytes());
        put_field(&mut mac, scope.as_bytes());
        put_field(&mut mac, subject);
        SubjectKey(mac.finalize().into_bytes().into())
    }

    /// Derives the opaque key of a normalized subject for `policy`, bound to that policy.
    ///
    /// The application normalizes the subject first (case-folded email, aggregated network
    /// prefix, ...). The result goes straight into [`Check::new`](crate::Check::new).
    #[must_use]
    pub fn hash_for<'p, P: RateLimitPolicy>(&self, policy: &'p P, subject: &[u8]) -> PolicySubject<'p, P> {
        let key = self.derive(b"runlimit/subject/v1", policy.id().as_str(), policy.scope().as_str(), subject);
        PolicySubject { policy, key }
    }

    /// Derives the opaque key of a normalized subject for an attempt policy, in its own
    /// domain (`runlimit/attempt-subject/v1`), so it never equals a quota subject key.
    #[must_use]
    pub fn hash_attempt_for<'p>(&self, policy: &'p AttemptPolicy, subject: &[u8]) -> AttemptSubject<'p> {
        let key = self.derive(
            b"runlimit/attempt-subject/v1",
            policy.id().as_str(),
            policy.scope().as_str(),
            subject,
        );
        AttemptSubject { policy, key }
    }
}

impl fmt::Debug for KeyHasher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyHasher").finish_non_exhaustive()
    }
}

/// An opaque 32-byte subject key: an HMAC-SHA-256 digest, never a raw identity.
///
/// Not bound to a policy. The normal path never handles one directly:
/// [`KeyHasher::hash_for`] returns a [`PolicySubject`]. The escape hatches
/// ([`PolicySubject::into_unbound_subject_key`], [`Check::subject`](crate::Check::subject),
/// [`CounterKey::subject`]) return one for adapters and backends, and [`SubjectKey::bind`]
/// rebinds it explicitly. `Debug` is redacted; no serde traits are implemented, to keep
/// storage keys out of configuration and telemetry paths.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SubjectKey([u8; 32]);

impl SubjectKey {
    /// Wraps a digest without deriving it.
    ///
    /// For tests, and for input that is already an opaque, secret-keyed 32-byte digest. Never
    /// feed it raw or padded identities: backends rely on keys being uniform and unguessable.
    #[must_use]
    pub const fn from_digest(digest: [u8; 32]) -> Self {
        Self(digest)
    }

    /// The digest bytes, for backends that store them.
    #[must_use]
    pub const fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// Binds the key to the policy it will be checked against.
    #[must_use]
    pub fn bind<P: RateLimitPolicy>(self, policy: &P) -> PolicySubject<'_, P> {
        PolicySubject { policy, key: self }
    }
}

impl fmt::Debug for SubjectKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SubjectKey").finish_non_exhaustive()
    }
}

/// A [`SubjectKey`] bound to the exact policy it was derived for.
///
/// The only input [`Check::new`](crate::Check::new) accepts, so the derivation namespace and
/// the evaluated policy cannot disagree.
pub struct PolicySubject<'p, P> {
    policy: &'p P,
    key: SubjectKey,
}

impl<'p, P> PolicySubject<'p, P> {
    /// The policy this subject is bound to.
    #[must_use]
    pub fn policy(&self) -> &'p P {
        self.policy
    }

    /// Escape hatch: drops the binding and returns the opaque key, for adapters that bind it
    /// to their own configured policy (`runlimit-axum`'s `ExtractSubjectKey`).
    #[must_use]
    pub fn into_unbound_subject_key(self) -> SubjectKey {
        self.key
    }

    pub(crate) fn key(&self) -> SubjectKey {
        self.key
    }
}

impl<P> Clone for PolicySubject<'_, P> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<P> Copy for PolicySubject<'_, P> {}

impl<P: RateLimitPolicy> fmt::Debug for PolicySubject<'_, P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PolicySubject")
            .field("policy", &self.policy.id())
            .field("scope", &self.policy.scope())
            .finish_non_exhaustive()
    }
}

/// An opaque attempt subject bound to its [`AttemptPolicy`], from
/// [`KeyHasher::hash_attempt_for`].
#[derive(Clone, Copy)]
pub struct AttemptSubject<'p> {
    policy: &'p AttemptPolicy,
    key: SubjectKey,
}

impl<'p> AttemptSubject<'p> {
    /// The attempt policy this subject is bound to.
    #[must_use]
    pub fn policy(&self) -> &'p AttemptPolicy {
        self.policy
    }

    /// The opaque key, for attempt backends.
    #[must_use]
    pub fn subject(&self) -> SubjectKey {
        self.key
    }

    /// The storage key: the policy fingerprint and the subject key.
    #[must_use]
    pub fn counter_key(&self) -> CounterKey {
        CounterKey { fingerprint: *self.policy.fingerprint(), subject: self.key }
    }
}

impl fmt::Debug for AttemptSubject<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AttemptSubject").field("policy", &self.policy.id()).finish_non_exhaustive()
    }
}

/// The key a backend stores state under: a [`PolicyFingerprint`] and a [`SubjectKey`].
///
/// Two checks collide in storage exactly when their counter keys are equal, which batches
/// reject as [`BatchError::DuplicateCounterKey`](crate::BatchError::DuplicateCounterKey).
/// `Debug` prints the fingerprint and redacts the subject.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct CounterKey {
    fingerprint: PolicyFingerprint,
    subject: SubjectKey,
}

impl CounterKey {
    /// Combines a fingerprint and a subject key.
    #[must_use]
    pub const fn new(fingerprint: PolicyFingerprint, subject: SubjectKey) -> Self {
        Self { fingerprint, subject }
    }

    /// The policy half.
    #[must_use]
    pub const fn fingerprint(&self) -> &PolicyFingerprint {
        &self.fingerprint
    }

    /// Escape hatch: the subject half, unbound.
    #[must_use]
    pub const fn subject(&self) -> SubjectKey {
        self.subject
    }

    /// The 64 storage bytes: fingerprint then subject key.
    #[must_use]
    pub fn to_bytes(&self) -> [u8; 64] {
        let mut bytes = [0u8; 64];
        bytes[..32].copy_from_slice(self.fingerprint.as_bytes());
        bytes[32..].copy_from_slice(self.subject.as_bytes());
        bytes
    }
}

impl fmt::Debug for CounterKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CounterKey").field("fingerprint", &self.fingerprint).finish_non_exhaustive()
    }
}
