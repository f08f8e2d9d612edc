//! Why a request was rejected, and the application's mapping to a response.

use std::{fmt, sync::Arc};

use runlimit_core::{CostError, Denial, RateLimitPolicy};

/// Every way a [`RateLimitLayer`](crate::RateLimitLayer) can refuse a request. Exhaustive on
/// purpose: a mapper names every arm, so a new reason would be a compile error rather than a
/// silently defaulted response.
///
/// Each variant carries the layer's policy, so a mapper can say which gate refused and emit
/// `RateLimit-Policy` / `RateLimit` fields for it (with `runlimit-http`). Allowed and
/// shadow-denied outcomes never reach the mapper: they continue to the inner service.
///
/// Type parameters: `P` the policy type, `E` the extractor's error, `C` the limiter's
/// [`CheckError`](runlimit_core::Limiter::CheckError).
pub enum RateLimitRejection<P, E, C> {
    /// The key extractor could not name a subject (missing trusted metadata). No limiter was
    /// consulted and nothing was consumed.
    Extraction {
        /// The layer's policy.
        policy: Arc<P>,
        /// The extractor's error.
        error: E,
    },
    /// The extractor's [cost](crate::ExtractSubjectKey::extract_cost) for this request is
    /// zero or above the policy's capacity, so no wait could admit it (a client error, such as
    /// an oversized request, rather than a rate limit). No limiter was consulted and nothing
    /// was consumed.
    InvalidCost {
        /// The layer's policy.
        policy: Arc<P>,
        /// Why the cost was rejected, with the cost and the policy's capacity.
        error: CostError,
    },
    /// The limiter denied the request under enforcement: quota exhausted, or storage full.
    /// Nothing was consumed. The inner service was not called and the body was not read.
    Denied {
        /// The layer's policy.
        policy: Arc<P>,
        /// Why. A [`Denial::QuotaExceeded`] carries the
        /// [`QuotaDenial`](runlimit_core::QuotaDenial) that `runlimit-http` encodes; a
        /// [`Denial::StorageCapacity`] has no quota to describe.
        denial: Denial,
    },
    /// The limiter could not evaluate the check. Treat it as an admission failure (fail
    /// closed); whether quota was consumed is backend-specific (see the backend's error).
    Backend {
        /// The layer's policy.
        policy: Arc<P>,
        /// The limiter's error.
        error: C,
    },
}

impl<P, E, C> RateLimitRejection<P, E, C> {
    /// The policy of the layer that rejected the request, whatever the reason.
    #[must_use]
    pub fn policy(&self) -> &Arc<P> {
        match self {
            Self::Extraction { policy, .. }
            | Self::InvalidCost { policy, .. }
            | Self::Denied { policy, .. }
            | Self::Backend { policy, .. } => policy,
        }
    }
}

impl<P: RateLimitPolicy, E: fmt::Debug, C: fmt::Debug> fmt::Debug for RateLimitRejection<P, E, C> {
    /// Names the policy by identifier and scope only.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Extraction { policy, error } => f
                .debug_struct("Extraction")
                .field("policy", policy.id())
                .field("scope", policy.scope())
                .field("error", error)
                .finish(),
            Self::InvalidCost { policy, error } => f
                .debug_struct("InvalidCost")
                .field("policy", policy.id())
                .field("scope", policy.scope())
                .field("error", error)
                .finish(),
            Self::Denied { policy, denial } => f
                .debug_struct("Denied")
                .field("policy", policy.id())
                .field("scope", policy.scope())
                .field("denial", denial)
                .finish(),
            Self::Backend { policy, error } => f
                .debug_struct("Backend")
                .field("policy", policy.id())
                .field("scope", policy.scope())
                .field("error", error)
                .finish(),
        }
    }
}

/// Turns a [`RateLimitRejection`] into the response sent instead of calling the inner
/// service.
///
/// The application owns the status, body and headers of every rejection, including
/// `Retry-After`, `RateLimit` fields and problem details; this crate picks none of them.
/// [`Response`](Self::Response) must be the inner service's response type
/// (`axum::response::Response` in a router).
///
/// Implemented for every `Fn(RateLimitRejection<P, E, C>) -> R`, and by the ready-made
/// [`ProblemRejections`](crate::ProblemRejections) (429/503/400 with RFC 9457 bodies). The
/// layer has no default mapper, on purpose: the application names the one it wants. A closure
/// needs its argument type written out (or use a named `fn`).
///
/// # Examples
///
/// ```
/// use std::convert::Infallible;
/// use http::{Response, StatusCode};
/// use runlimit_axum::RateLimitRejection;
/// use runlimit_core::{Denial, FixedWindowPolicy};
///
/// fn reject(rejection: RateLimitRejection<FixedWindowPolicy, &'static str, Infallible>) -> Response<String> {
///     let (status, body) = match rejection {
///         RateLimitRejection::Extraction { .. } => (StatusCode::BAD_REQUEST, "missing client"),
///         RateLimitRejection::InvalidCost { .. } => (StatusCode::PAYLOAD_TOO_LARGE, "too large"),
///         RateLimitRejection::Denied { denial: Denial::QuotaExceeded(_), .. } => {
///             (StatusCode::TOO_MANY_REQUESTS, "slow down")
///         }
///         RateLimitRejection::Denied { denial: Denial::StorageCapacity { .. }, .. }
///         | RateLimitRejection::Backend { .. } => (StatusCode::SERVICE_UNAVAILABLE, "try later"),
///     };
///     let mut response = Response::new(body.to_owned());
///     *response.status_mut() = status;
///     response
/// }
/// # fn is_mapper<M: runlimit_axum::MapRejection<FixedWindowPolicy, &'static str, Infallible>>(_: M) {}
/// # is_mapper(reject);
/// ```
pub trait MapRejection<P, E, C> {
    /// The response type, equal to the inner service's.
    type Response;

    /// Builds the response for `rejection`.
    fn map_rejection(&self, rejection: RateLimitRejection<P, E, C>) -> Self::Response;
}

impl<F, P, E, C, R> MapRejection<P, E, C> for F
where
    F: Fn(RateLimitRejection<P, E, C>) -> R,
{
    type Response = R;

    fn map_rejection(&self, rejection: RateLimitRejection<P, E, C>) -> R {
        self(rejection)
    }
}
