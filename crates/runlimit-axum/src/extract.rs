//! Synchronous subject-key and cost extraction.

use http::request::Parts;
use runlimit_core::SubjectKey;

/// Derives the opaque subject key a [`RateLimitLayer`](crate::RateLimitLayer) checks, from the
/// request head and the layer's policy.
///
/// Extraction is synchronous and sees only [`Parts`](https://docs.rs/http/1/http/request/struct.Parts.html) (method, URI, headers, extensions),
/// never the body, so an enforced denial is decided before the body is read. The extractor
/// chooses *which subject* is counted; it cannot choose *the policy*: it returns an unbound
/// [`SubjectKey`] and the layer binds it to its own configured policy with
/// [`SubjectKey::bind`].
///
/// The application owns trust and normalization. The layer itself never reads
/// `Forwarded`, `X-Forwarded-For`, `ConnectInfo` or cookies; an extractor may, when the
/// application knows which peers are trusted to supply them (the ready-made [`HeaderKey`]
/// reads one named header, and `PeerAddressKey`, with the `axum` feature, the socket peer).
///
/// Implemented for every `Fn(&Parts, &P) -> Result<SubjectKey, E>`. A closure needs its
/// argument types written out, because they are not inferred through this trait.
///
/// # Weighted requests
///
/// Each request costs one unit unless the extractor overrides
/// [`extract_cost`](Self::extract_cost) (closures always cost one). The cost is chosen from
/// the same request head, never from the body, which is not read before admission: a
/// declared size (`Content-Length`), a route, or a header naming how many credits or tokens
/// the request reserves. The layer validates it against its policy with
/// [`Check::with_cost`](runlimit_core::Check::with_cost); a cost of zero or above the
/// policy's capacity reaches the mapper as
/// [`RateLimitRejection::InvalidCost`](crate::RateLimitRejection::InvalidCost), and no limiter
/// is consulted.
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
/// A weighted extractor charges a bulk endpoint by the number of items a header declares:
///
/// ```
/// use http::request::Parts;
/// use runlimit_axum::ExtractSubjectKey;
/// use runlimit_core::{FixedWindowPolicy, KeyHasher, SubjectKey};
///
/// struct BulkItems {
///     hasher: KeyHasher,
/// }
///
/// #[derive(Debug)]
/// enum BadRequest {
///     MissingAccount,
///     MalformedItemCount,
/// }
///
/// impl ExtractSubjectKey<FixedWindowPolicy> for BulkItems {
///     type Error = BadRequest;
///
///     fn extract_subject_key(&self, parts: &Parts, policy: &FixedWindowPolicy) -> Result<SubjectKey, BadRequest> {
///         let account = parts.headers.get("x-account").ok_or(BadRequest::MissingAccount)?;
///         Ok(self.hasher.hash_for(policy, account.as_bytes()).into_unbound_subject_key())
///     }
///
///     /// One unit per item; a request without the header counts as one item.
///     fn extract_cost(&self, parts: &Parts, _: &FixedWindowPolicy) -> Result<u64, BadRequest> {
///         match parts.headers.get("x-item-count") {
///             None => Ok(1),
///             Some(value) => value
///                 .to_str()
///                 .ok()
///                 .and_then(|text| text.parse().ok())
///                 .ok_or(BadRequest::MalformedItemCount),
///         }
///     }
/// }
/// # let _ = BulkItems { hasher: KeyHasher::new(&[1; 32])? };
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

    /// The units this request costs under `policy`, from the request head: 1 unless
    /// overridden. Called after [`extract_subject_key`](Self::extract_subject_key) succeeded.
    ///
    /// The layer rejects a cost of 0 or above the policy's
    /// [`capacity`](runlimit_core::RateLimitPolicy::capacity) as
    /// [`RateLimitRejection::InvalidCost`](crate::RateLimitRejection::InvalidCost), without
    /// consulting the limiter.
    ///
    /// # Errors
    ///
    /// [`Self::Error`] when the head does not say what the request costs (a malformed
    /// header); the layer passes it to the mapper as
    /// [`RateLimitRejection::Extraction`](crate::RateLimitRejection::Extraction).
    fn extract_cost(&self, parts: &Parts, policy: &P) -> Result<u64, Self::Error> {
        let _ = (parts, policy);
        Ok(1)
    }
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

/// A ready-made [`ExtractSubjectKey`]: the subject is the value of one request header (an API
/// key, a tenant identifier), as bytes, hashed with the application's
/// [`KeyHasher`](runlimit_core::KeyHasher) under the layer's policy, so the raw value is never
/// stored. Case-sensitive: normalize in an extractor of your own when your keys are not.
///
/// A request without the header, or whose value is empty, is refused with [`MissingHeader`]
/// (the mapper's [`RateLimitRejection::Extraction`](crate::RateLimitRejection::Extraction);
/// [`ProblemRejections`](crate::ProblemRejections) answers 400): an empty value is no key, and
/// counting it would put every such request in one shared bucket. A header sent more than once
/// is keyed by its first value. Every request costs one unit.
///
/// # Examples
///
/// ```
/// use http::header::HeaderName;
/// use runlimit_axum::{ExtractSubjectKey, HeaderKey};
/// use runlimit_core::{FixedWindowPolicy, KeyHasher};
///
/// let api_key = HeaderKey::new(HeaderName::from_static("x-api-key"), KeyHasher::new(&[7; 32])?);
/// # fn is_extractor<K: ExtractSubjectKey<FixedWindowPolicy>>(_: &K) {}
/// # is_extractor(&api_key);
/// assert_eq!(format!("{api_key:?}"), "HeaderKey { name: \"x-api-key\", .. }");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct HeaderKey {
    name: http::HeaderName,
    hasher: runlimit_core::KeyHasher,
}

impl HeaderKey {
    /// Keys requests by the header `name`, hashed with `hasher`.
    #[must_use]
    pub fn new(name: http::HeaderName, hasher: runlimit_core::KeyHasher) -> Self {
        Self { name, hasher }
    }

    /// The header read.
    #[must_use]
    pub fn name(&self) -> &http::HeaderName {
        &self.name
    }
}

impl std::fmt::Debug for HeaderKey {
    /// The header's name only (never the hasher's secret).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HeaderKey").field("name", &self.name.as_str()).finish_non_exhaustive()
    }
}

impl<P: runlimit_core::RateLimitPolicy> ExtractSubjectKey<P> for HeaderKey {
    type Error = MissingHeader;

    fn extract_subject_key(&self, parts: &Parts, policy: &P) -> Result<SubjectKey, MissingHeader> {
        let value = parts
            .headers
            .get(&self.name)
            .filter(|value| !value.is_empty())
            .ok_or_else(|| MissingHeader { name: self.name.clone() })?;
        Ok(self.hasher.hash_for(policy, value.as_bytes()).into_unbound_subject_key())
    }
}

/// Why a [`HeaderKey`] named no subject: the request lacked the header, or its value was
/// empty. Its message names the header, never a value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MissingHeader {
    name: http::HeaderName,
}

impl MissingHeader {
    /// The header that was missing or empty.
    #[must_use]
    pub fn name(&self) -> &http::HeaderName {
        &self.name
    }
}

impl std::fmt::Display for MissingHeader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "the request has no non-empty {} header", self.name)
    }
}

impl std::error::Error for MissingHeader {}
