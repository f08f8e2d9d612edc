//! [`ResponseFuture`]: check, then call the inner service or answer with the mapper's
//! response.

use std::{
    fmt,
    future::Future,
    pin::Pin,
    task::{Context, Poll, ready},
};

use http::Request;
use pin_project_lite::pin_project;
use tower_service::Service;

use crate::{admission::Admission, service::record};

/// The limiter check, boxed: its type is the backend's unnameable `impl Future`, and it
/// borrows the policy it binds the key to, so it owns its `Arc` of the layer state. One of the
/// gate's allocations per checked request (see the crate documentation's "Cost").
pub(crate) type CheckFuture<R> = Pin<Box<dyn Future<Output = Result<Admission, R>> + Send>>;

pin_project! {
    /// The response future of [`RateLimit`](crate::RateLimit).
    ///
    /// Resolves to the inner service's result for an admitted request, or to `Ok` of the
    /// rejection mapper's response otherwise. It is `Send` whenever the inner service, its
    /// future, its response and the request body are.
    ///
    /// # Panics
    ///
    /// When polled again after it completed with a rejection response, as the
    /// [`Future`] contract permits (std's `async fn` futures do the same).
    pub struct ResponseFuture<S, ReqBody>
    where
        S: Service<Request<ReqBody>>,
    {
        #[pin]
        kind: Kind<S, ReqBody>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<S, ReqBody>
    where
        S: Service<Request<ReqBody>>,
    {
        // Awaiting the limiter. `inner` (already ready) and `request` (body unread) are taken
        // exactly once, on admission.
        Checking {
            check: CheckFuture<S::Response>,
            inner: Option<S>,
            request: Option<Request<ReqBody>>,
        },
        // Admitted: the inner service's future.
        Calling {
            #[pin]
            future: S::Future,
        },
        // Rejected: the mapper's response, taken once.
        Rejected {
            response: Option<S::Response>,
        },
    }
}

impl<S, ReqBody> ResponseFuture<S, ReqBody>
where
    S: Service<Request<ReqBody>>,
{
    pub(crate) fn checking(check: CheckFuture<S::Response>, inner: S, request: Request<ReqBody>) -> Self {
        Self { kind: Kind::Checking { check, inner: Some(inner), request: Some(request) } }
    }

    pub(crate) fn rejected(response: S::Response) -> Self {
        Self { kind: Kind::Rejected { response: Some(response) } }
    }
}

impl<S, ReqBody> Future for ResponseFuture<S, ReqBody>
where
    S: Service<Request<ReqBody>>,
{
    type Output = Result<S::Response, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut kind = self.project().kind;
        loop {
            match kind.as_mut().project() {
                KindProj::Checking { check, inner, request } => {
                    let admission = match ready!(check.as_mut().poll(cx)) {
                        Ok(admission) => admission,
                        Err(response) => {
                            kind.set(Kind::Rejected { response: None });
                            return Poll::Ready(Ok(response));
                        }
                    };
                    let (Some(mut inner), Some(mut request)) = (inner.take(), request.take()) else {
                        polled_after_completion()
                    };
                    record(&mut request, admission);
                    kind.set(Kind::Calling { future: inner.call(request) });
                }
                KindProj::Calling { future } => return future.poll(cx),
                KindProj::Rejected { response } => match response.take() {
                    Some(response) => return Poll::Ready(Ok(response)),
                    None => polled_after_completion(),
                },
            }
        }
    }
}

#[cold]
#[expect(
    clippy::panic,
    reason = "re-polling a completed future breaks the Future contract, not caller input; \
              std's async fn futures panic the same way"
)]
fn polled_after_completion() -> ! {
    panic!("runlimit_axum::ResponseFuture polled after completion")
}

impl<S, ReqBody> fmt::Debug for ResponseFuture<S, ReqBody>
where
    S: Service<Request<ReqBody>>,
{
    /// The state only: `Checking`, `Calling` or `Rejected`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.kind {
            Kind::Checking { .. } => "Checking",
            Kind::Calling { .. } => "Calling",
            Kind::Rejected { .. } => "Rejected",
        };
        f.debug_struct("ResponseFuture").field("state", &state).finish_non_exhaustive()
    }
}
