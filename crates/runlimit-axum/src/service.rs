//! [`RateLimit`]: the middleware service.

use std::{
    fmt,
    sync::Arc,
    task::{Context, Poll},
};

use http::Request;
use runlimit_core::Limiter;
use tower_service::Service;

use crate::{
    admission::Admissions, extract::ExtractSubjectKey, future::ResponseFuture, layer::Shared,
    rejection::MapRejection,
};

/// The admission middleware built by [`RateLimitLayer`](crate::RateLimitLayer).
///
/// `poll_ready` only forwards the inner service's readiness: quota is never waited for (a
/// denial is a response, not back-pressure). `call` extracts the subject key synchronously,
/// then returns a [`ResponseFuture`] that checks the limiter and either calls the inner
/// service (with an [`Admissions`] extension) or resolves to the mapper's response.
///
/// # Cancel safety
///
/// The limiter check starts when the [`ResponseFuture`] is first polled: a future created
/// and dropped unpolled consumes nothing. A future dropped during the check may or may not
/// have consumed quota, as documented by the backend's [`Limiter`].
pub struct RateLimit<S, L: Limiter, K, M> {
    inner: S,
    shared: Arc<Shared<L, K, M>>,
}

impl<S, L: Limiter, K, M> RateLimit<S, L, K, M> {
    pub(crate) fn new(inner: S, shared: Arc<Shared<L, K, M>>) -> Self {
        Self { inner, shared }
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// Unwraps the inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S: Clone, L: Limiter, K, M> Clone for RateLimit<S, L, K, M> {
    fn clone(&self) -> Self {
        Self { inner: self.inner.clone(), shared: Arc::clone(&self.shared) }
    }
}

impl<S: fmt::Debug, L: Limiter, K, M> fmt::Debug for RateLimit<S, L, K, M> {
    /// The inner service and the policy; the limiter, extractor and mapper are not
    /// `Debug`-bound.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut debug = f.debug_struct("RateLimit");
        debug.field("inner", &self.inner);
        self.shared.fmt_fields(&mut debug).finish_non_exhaustive()
    }
}

impl<S, L, K, M, ReqBody> Service<Request<ReqBody>> for RateLimit<S, L, K, M>
where
    S: Service<Request<ReqBody>, Response = M::Response> + Clone,
    L: Limiter + 'static,
    L::Policy: 'static,
    K: ExtractSubjectKey<L::Policy> + Send + Sync + 'static,
    M: MapRejection<L::Policy, K::Error, L::CheckError> + Send + Sync + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = ResponseFuture<S, ReqBody>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        // `self.inner` is the clone that `poll_ready` drove to readiness; keep that one for
        // this request and leave a fresh clone behind. See tower's "Be careful when cloning
        // inner services" (tower::Service docs) and tower-http's async authorization layer.
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);

        let (parts, body) = request.into_parts();
        let (key, cost) = match self.shared.extract(&parts) {
            Ok(extracted) => extracted,
            Err(response) => return ResponseFuture::rejected(response),
        };
        let check = Box::pin(Arc::clone(&self.shared).check(key, cost));
        ResponseFuture::checking(check, inner, Request::from_parts(parts, body))
    }
}

/// With the `tonic` feature: a gated gRPC service keeps the wrapped service's name, so it can
/// be added to a tonic server on its own (`Server::builder().add_service(gated)`), leaving the
/// server's other services (health checks, reflection) ungated.
#[cfg(feature = "tonic")]
#[cfg_attr(docsrs, doc(cfg(feature = "tonic")))]
impl<S: tonic::server::NamedService, L: Limiter, K, M> tonic::server::NamedService for RateLimit<S, L, K, M> {
    const NAME: &'static str = S::NAME;
}

/// Appends `admission` to the request's [`Admissions`], creating the extension if absent.
pub(crate) fn record<B>(request: &mut Request<B>, admission: crate::Admission) {
    match request.extensions_mut().get_mut::<Admissions>() {
        Some(admissions) => admissions.push(admission),
        None => {
            let mut admissions = Admissions::default();
            admissions.push(admission);
            request.extensions_mut().insert(admissions);
        }
    }
}
