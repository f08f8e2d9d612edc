//! [`RateLimitLayer`]: the shared configuration of one admission gate.

use std::{fmt, sync::Arc};

use runlimit_core::{Admitted, Check, Limiter, RateLimitPolicy, SubjectKey};
use tower_layer::Layer;

use crate::{
    admission::Admission,
    extract::ExtractSubjectKey,
    rejection::{MapRejection, RateLimitRejection},
    service::RateLimit,
};

/// A Tower [`Layer`](https://docs.rs/tower-layer/0.3/tower_layer/trait.Layer.html) that checks every request against one policy before the inner service
/// runs.
///
/// Built from a limiter (any [`Limiter`], typically an `Arc` of a shared store), the policy
/// it evaluates, a synchronous [`ExtractSubjectKey`] and a [`MapRejection`]. For each
/// request the service:
///
/// 1. runs the extractor on the request head and binds the returned key to **this layer's
///    policy** ([`SubjectKey::bind`]);
/// 2. awaits [`Limiter::check`];
/// 3. on an allowed or shadow-denied decision, appends an [`Admission`] to the request's
///    [`Admissions`](crate::Admissions) extension and calls the inner service;
/// 4. on an extractor error, an enforced [`Denial`](runlimit_core::Denial) or a backend
///    error, returns the mapper's response without calling the inner service or reading the
///    body.
///
/// Cloning the layer, or the services it builds, clones one `Arc`.
///
/// See the [crate documentation](crate) for stacking order and reading admissions.
#[must_use]
pub struct RateLimitLayer<L: Limiter, K, M> {
    shared: Arc<Shared<L, K, M>>,
}

pub(crate) struct Shared<L: Limiter, K, M> {
    limiter: L,
    policy: Arc<L::Policy>,
    extractor: K,
    mapper: M,
}

impl<L, K, M> RateLimitLayer<L, K, M>
where
    L: Limiter,
    L::Policy: 'static,
    K: ExtractSubjectKey<L::Policy>,
    M: MapRejection<L::Policy, K::Error, L::CheckError>,
{
    /// A gate evaluating `policy` on `limiter`.
    ///
    /// `policy` is owned by the layer (pass the policy or an `Arc` of it); the same `Arc`
    /// is handed to the mapper and recorded in each [`Admission`].
    pub fn new(limiter: L, policy: impl Into<Arc<L::Policy>>, extractor: K, mapper: M) -> Self {
        Self { shared: Arc::new(Shared { limiter, policy: policy.into(), extractor, mapper }) }
    }
}

impl<L: Limiter, K, M> RateLimitLayer<L, K, M> {
    /// The policy this layer evaluates.
    #[must_use]
    pub fn policy(&self) -> &Arc<L::Policy> {
        &self.shared.policy
    }

    /// The limiter this layer checks.
    #[must_use]
    pub fn limiter(&self) -> &L {
        &self.shared.limiter
    }
}

impl<L: Limiter, K, M> Clone for RateLimitLayer<L, K, M> {
    fn clone(&self) -> Self {
        Self { shared: Arc::clone(&self.shared) }
    }
}

impl<L: Limiter, K, M> fmt::Debug for RateLimitLayer<L, K, M> {
    /// Names the policy; the limiter, extractor and mapper are not `Debug`-bound.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.shared.fmt_fields(&mut f.debug_struct("RateLimitLayer")).finish_non_exhaustive()
    }
}

impl<S, L: Limiter, K, M> Layer<S> for RateLimitLayer<L, K, M> {
    type Service = RateLimit<S, L, K, M>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimit::new(inner, Arc::clone(&self.shared))
    }
}

impl<L: Limiter, K, M> Shared<L, K, M> {
    pub(crate) fn fmt_fields<'d, 'a, 'b>(
        &self,
        debug: &'d mut fmt::DebugStruct<'a, 'b>,
    ) -> &'d mut fmt::DebugStruct<'a, 'b> {
        debug
            .field("policy", self.policy.id())
            .field("scope", self.policy.scope())
            .field("quota_mode", &self.policy.quota_mode())
    }
}

impl<L, K, M> Shared<L, K, M>
where
    L: Limiter,
    L::Policy: 'static,
    K: ExtractSubjectKey<L::Policy>,
    M: MapRejection<L::Policy, K::Error, L::CheckError>,
{
    /// Step 1: the extractor, bound to nothing yet, then the request's cost validated against
    /// this layer's policy. On error, the mapper's response.
    pub(crate) fn extract(&self, parts: &http::request::Parts) -> Result<(SubjectKey, u64), M::Response> {
        let extracted = self
            .extractor
            .extract_subject_key(parts, &self.policy)
            .and_then(|key| Ok((key, self.extractor.extract_cost(parts, &self.policy)?)));
        let (key, cost) = extracted.map_err(|error| {
            self.mapper
                .map_rejection(RateLimitRejection::Extraction { policy: Arc::clone(&self.policy), error })
        })?;
        self.bind(key, cost)?;
        Ok((key, cost))
    }

    /// The check of `key` at `cost` under this layer's policy, or the mapper's response to an
    /// impossible cost.
    fn bind(&self, key: SubjectKey, cost: u64) -> Result<Check<'_, L::Policy>, M::Response> {
        Check::new(key.bind(&*self.policy)).with_cost(cost).map_err(|error| {
            self.mapper
                .map_rejection(RateLimitRejection::InvalidCost { policy: Arc::clone(&self.policy), error })
        })
    }

    /// Steps 2–4: binds `key` to this layer's policy at `cost` (validated by
    /// [`extract`](Self::extract), so binding again cannot fail), checks it, and returns the
    /// admission to record or the mapper's response.
    pub(crate) async fn check(self: Arc<Self>, key: SubjectKey, cost: u64) -> Result<Admission, M::Response> {
        let check = self.bind(key, cost)?;
        let rejection = match self.limiter.check(&check).await {
            Ok(decision) => match decision.admit() {
                Ok(admitted) => return Ok(self.admission(admitted)),
                Err(denial) => RateLimitRejection::Denied { policy: Arc::clone(&self.policy), denial },
            },
            Err(error) => RateLimitRejection::Backend { policy: Arc::clone(&self.policy), error },
        };
        Err(self.mapper.map_rejection(rejection))
    }

    fn admission(&self, admitted: Admitted) -> Admission {
        let policy: Arc<dyn RateLimitPolicy> = Arc::clone(&self.policy) as Arc<dyn RateLimitPolicy>;
        Admission::new(policy, admitted)
    }
}
