//! Synchronous subject-key extraction.

use http::request::Parts;
use runlimit_core::SubjectKey;

/// Derives the opaque subject key a [`RateLimitLayer`](crate::RateLimitLayer) checks, from the
/// request head and the layer's policy.
///
/// Extraction is synchronous and sees only [`Parts`] (method, URI, headers, extensions),
/// never the body, so an enforced denial is decided before the body is read. The extractor
/// chooses *which subject* is counted; it cannot choose *the policy*: it returns an unbound
/// [`SubjectKey`] and the layer binds it to its own configured policy with
/// [`SubjectKey::bind`].
///
/// The application owns trust and normalization. The adapter itself never reads
/// `Forwarded`, `X-Forwarded-For`, `ConnectInfo` or cookies; an extractor may, when the
/// application knows which peers are trusted to supply them.
///
/// Implemented for every `Fn(&Parts, &P) -> Result<SubjectKey, E>`. A closure needs its
/// argument types written out, because they are not inferred through this trait.
///
/// # Errors
///
/// `Err(Self::Error)` when the request lacks the trusted metadata needed to name a subject
/// (no peer address, a missing or malformed identity). The layer passes it to the rejection
/// mapper as [`RateLimitRejection::Extraction`](crate::RateLimitRejection::Extraction); no
/// limiter is consulted.
///
/// # Examples
///
/// A named extractor hashes a normalized identity with [`KeyHasher::hash_for`] and converts
/// the bound result explicitly:
///
/// ```
/// use http::request::Parts;
/// use runlimit_axum::ExtractSubjectKey;
/// use runlimit_core::{FixedWindowPolicy, KeyHasher, SubjectKey};
///
/// /// Counts per normalized `x-account` header value.
/// struct AccountKey {
///     hasher: KeyHasher,
/// }
///
/// #[derive(Debug)]
/// struct MissingAccount;
///
/// impl ExtractSubjectKey<FixedWindowPolicy> for AccountKey {
///     type Error = MissingAccount;
///
///     fn extract_subject_key(
///         &self,
///         parts: &Parts,
///         policy: &FixedWindowPolicy,
///     ) -> Result<SubjectKey, MissingAccount> {
///         let account = parts.headers.get("x-account").ok_or(MissingAccount)?;
///         let normalized = account.as_bytes().to_ascii_lowercase();
///         Ok(self.hasher.hash_for(policy, &normalized).into_unbound_subject_key())
///     }
/// }
/// # let _ = AccountKey { hasher: KeyHasher::new(&[1; 32])? };
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// The same as a closure:
///
/// ```
/// use http::request::Parts;
/// use runlimit_core::{FixedWindowPolicy, KeyHasher, SubjectKey};
///
/// let hasher = KeyHasher::new(&[1; 32])?;
/// let extractor = move |parts: &Parts, policy: &FixedWindowPolicy| -> Result<SubjectKey, &'static str> {
///     let account = parts.headers.get("x-account").ok_or("missing x-account")?;
///     let normalized = account.as_bytes().to_ascii_lowercase();
///     Ok(hasher.hash_for(policy, &normalized).into_unbound_subject_key())
/// };
/// # fn is_extractor<K: runlimit_axum::ExtractSubjectKey<FixedWindowPolicy>>(_: &K) {}
/// # is_extractor(&extractor);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// [`KeyHasher::hash_for`]: runlimit_core::KeyHasher::hash_for
pub trait ExtractSubjectKey<P: ?Sized> {
    /// Why no subject could be named.
    type Error;

    /// Names the subject of `parts` under `policy` as an opaque key.
    ///
    /// # Errors
    ///
    /// [`Self::Error`] when the request lacks the metadata needed to name a subject.
    fn extract_subject_key(&self, parts: &Parts, policy: &P) -> Result<SubjectKey, Self::Error>;
}

impl<F, P, E> ExtractSubjectKey<P> for F
where
    F: Fn(&Parts, &P) -> Result<SubjectKey, E>,
    P: ?Sized,
{
    type Error = E;

    fn extract_subject_key(&self, parts: &Parts, policy: &P) -> Result<SubjectKey, E> {
        self(parts, policy)
    }
}
