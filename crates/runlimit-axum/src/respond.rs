//! Ready-made responses, for applications that take the standard formats: the
//! [`ProblemRejections`] mapper and the [`AdmissionFieldsLayer`].

use std::{
    fmt,
    future::Future,
    marker::PhantomData,
    pin::Pin,
    task::{Context, Poll, ready},
};

use http::{
    HeaderValue, Request, Response, StatusCode,
    header::{CONTENT_TYPE, RETRY_AFTER},
};
use pin_project_lite::pin_project;
use runlimit_core::{Delay, Denial, RateLimitPolicy};
use runlimit_http::draft_11::{PolicyName, QuotaState, RATELIMIT, RATELIMIT_POLICY, RateLimitFields};
use serde::Serialize;
use tower_layer::Layer;
use tower_service::Service;

use crate::{admission::Admissions, rejection::MapRejection, rejection::RateLimitRejection};

/// The media type of every body [`ProblemRejections`] writes (RFC 9457 §3).
pub const PROBLEM_JSON: &str = "application/problem+json";

/// The `type` of a quota denial's problem body (draft-ietf-httpapi-ratelimit-headers-11 §5,
/// registered in IANA's HTTP Problem Types registry).
pub const QUOTA_EXCEEDED: &str = "https://iana.org/assignments/http-problem-types#quota-exceeded";

/// The `type` of a storage-capacity denial's problem body
/// (draft-ietf-httpapi-ratelimit-headers-11 §5).
pub const TEMPORARY_REDUCED_CAPACITY: &str =
    "https://iana.org/assignments/http-problem-types#temporary-reduced-capacity";

/// Names a policy in `RateLimit-Policy` / `RateLimit` items and in `violated-policies`:
/// `None` leaves the policy undisclosed.
///
/// [`policy_id_name`] is the default of both [`ProblemRejections`] and
/// [`AdmissionFieldsLayer`].
pub type NamePolicy = fn(&dyn RateLimitPolicy) -> Option<PolicyName>;

/// The default [`NamePolicy`]: the policy's [`PolicyId`](runlimit_core::PolicyId), always
/// a valid [`PolicyName`]. Two gates that share an identifier (and differ by scope) then share
/// a name: give them distinct identifiers, or a [`NamePolicy`] of your own.
#[must_use]
pub fn policy_id_name(policy: &dyn RateLimitPolicy) -> Option<PolicyName> {
    Some(PolicyName::from(policy.id()))
}

/// A ready-made [`MapRejection`]: the standard HTTP answers, with RFC 9457 problem bodies.
///
/// Opt-in: the layer has no default mapper, and an application that wants other formats
/// writes its own (see [`MapRejection`]). The responses, each with
/// `content-type: application/problem+json`:
///
/// | rejection | status | headers | problem `type` |
/// |---|---|---|---|
/// | [`Denied`](RateLimitRejection::Denied) with [`Denial::QuotaExceeded`] | 429 | `Retry-After`, `RateLimit-Policy`, `RateLimit` | [`QUOTA_EXCEEDED`] |
/// | [`Denied`](RateLimitRejection::Denied) with [`Denial::StorageCapacity`] | 503 | `Retry-After` when the store knows its earliest expiry | [`TEMPORARY_REDUCED_CAPACITY`] |
/// | [`Backend`](RateLimitRejection::Backend) | 503 | none | `about:blank` |
/// | [`Extraction`](RateLimitRejection::Extraction) | 400 | none | `about:blank` |
/// | [`InvalidCost`](RateLimitRejection::InvalidCost) | 400 | none | `about:blank` |
///
/// - `Retry-After` is the denial's delay in **whole seconds, rounded up**
///   ([`Delay::seconds`]), equal to the `t` of the gate's `RateLimit` item, as
///   draft-ietf-httpapi-ratelimit-headers-11 §6 asks.
/// - The 429's fields describe the denying gate only, `"NAME";q=Q;w=W` and `"NAME";r=0;t=T`
///   (see `runlimit_http::draft_11`); they are omitted when the policy cannot be described
///   (a window that is not whole seconds, a quota above RFC 9651's integer range). Fields of
///   the other gates a request passed are not added.
/// - Body members, in this order: `type`, `title` (the registered title, or the status's
///   reason phrase for `about:blank`), `status`, `detail`, and for the two registered types
///   `violated-policies` (the gate's name). A detail is a fixed sentence with the gate's name
///   and, for a quota denial, the wait: `quota of policy "api" is exhausted; retry after 60
///   seconds` (`1 second` for one). The extractor's and the backend's errors are never
///   written into a response: log them with a mapper of your own if needed.
/// - `NAME` comes from a [`NamePolicy`], [`policy_id_name`] unless set with
///   [`named`](Self::named) or [`with_names`](Self::with_names); an undisclosed policy gets
///   no fields and an empty `violated-policies`.
///
/// `B` is the response body type; it must be the inner service's (`axum::body::Body` in a
/// router, inferred there). Any body built `From<String>` works.
///
/// # Examples
///
/// ```
/// use std::convert::Infallible;
/// use std::time::Duration;
/// use runlimit_axum::{MapRejection, ProblemRejections, RateLimitRejection};
/// use runlimit_core::{Capacity, Delay, Denial, FixedWindowPolicy, PolicyId, QuotaDenial, ScopeId};
///
/// let policy = FixedWindowPolicy::new(PolicyId::new("api")?, ScopeId::new("api-key")?, 100, Duration::from_secs(60))?;
/// let denial = QuotaDenial::new(Capacity::new(100)?, Delay::from_millis(41_500));
/// let mapper = ProblemRejections::<String>::new();
/// let response = MapRejection::<_, &str, Infallible>::map_rejection(
///     &mapper,
///     RateLimitRejection::Denied { policy: policy.into(), denial: Denial::QuotaExceeded(denial) },
/// );
/// assert_eq!(response.status(), 429);
/// assert_eq!(response.headers()["retry-after"], "42");
/// assert_eq!(response.headers()["ratelimit-policy"], r#""api";q=100;w=60"#);
/// assert_eq!(response.headers()["ratelimit"], r#""api";r=0;t=42"#);
/// assert_eq!(
///     response.body(),
///     r#"{"type":"https://iana.org/assignments/http-problem-types#quota-exceeded","title":"Request cannot be satisfied as assigned quota has been exceeded","status":429,"detail":"quota of policy \"api\" is exhausted; retry after 42 seconds","violated-policies":["api"]}"#,
/// );
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct ProblemRejections<B> {
    names: Names,
    body: PhantomData<fn() -> B>,
}

#[derive(Clone)]
enum Names {
    Fixed(PolicyName),
    Derived(NamePolicy),
}

impl Names {
    fn name(&self, policy: &dyn RateLimitPolicy) -> Option<PolicyName> {
        match self {
            Self::Fixed(name) => Some(name.clone()),
            Self::Derived(name) => name(policy),
        }
    }
}

impl<B> ProblemRejections<B> {
    /// The mapper, naming each gate by its policy identifier ([`policy_id_name`]).
    #[must_use]
    pub fn new() -> Self {
        Self { names: Names::Derived(policy_id_name), body: PhantomData }
    }

    /// The mapper of one gate, disclosed as `name` whatever its policy.
    #[must_use]
    pub fn named(name: PolicyName) -> Self {
        Self { names: Names::Fixed(name), body: PhantomData }
    }

    /// The mapper, naming each gate with `names` (`None`: no fields, no `violated-policies`).
    #[must_use]
    pub fn with_names(names: NamePolicy) -> Self {
        Self { names: Names::Derived(names), body: PhantomData }
    }
}

impl<B> Default for ProblemRejections<B> {
    fn default() -> Self {
        Self::new()
    }
}

impl<B> Clone for ProblemRejections<B> {
    fn clone(&self) -> Self {
        Self { names: self.names.clone(), body: PhantomData }
    }
}

impl<B> fmt::Debug for ProblemRejections<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut debug = f.debug_struct("ProblemRejections");
        match &self.names {
            Names::Fixed(name) => debug.field("name", name),
            Names::Derived(_) => debug.field("names", &"derived"),
        };
        debug.finish()
    }
}

impl<P, E, C, B> MapRejection<P, E, C> for ProblemRejections<B>
where
    P: RateLimitPolicy + 'static,
    B: From<String>,
{
    type Response = Response<B>;

    fn map_rejection(&self, rejection: RateLimitRejection<P, E, C>) -> Response<B> {
        let policy = rejection.policy().clone();
        let name = self.names.name(&*policy);
        let gate =
            name.as_ref().map_or_else(|| "this rate limit".to_owned(), |name| format!("policy \"{name}\""));
        match rejection {
            RateLimitRejection::Denied { denial: Denial::QuotaExceeded(denial), .. } => {
                let seconds = denial.retry_after().seconds();
                let detail = format!("quota of {gate} is exhausted; retry after {}", whole_seconds(seconds));
                let mut fields = RateLimitFields::new();
                if let Some(name) = &name {
                    // Undescribable policies are left undisclosed, as documented.
                    let _ = fields.push(name.clone(), &*policy, QuotaState::from(denial));
                }
                let mut response =
                    problem(StatusCode::TOO_MANY_REQUESTS, Kind::QuotaExceeded, &detail, name.as_ref());
                response.headers_mut().insert(RETRY_AFTER, HeaderValue::from(seconds));
                fields.insert_into(response.headers_mut());
                response
            }
            RateLimitRejection::Denied { denial: Denial::StorageCapacity { retry_after }, .. } => {
                let detail = format!("rate-limit storage of {gate} is full; retry later");
                let mut response = problem(
                    StatusCode::SERVICE_UNAVAILABLE,
                    Kind::TemporaryReducedCapacity,
                    &detail,
                    name.as_ref(),
                );
                if let Some(delay) = retry_after {
                    response.headers_mut().insert(RETRY_AFTER, HeaderValue::from(Delay::seconds(delay)));
                }
                response
            }
            RateLimitRejection::Backend { .. } => problem(
                StatusCode::SERVICE_UNAVAILABLE,
                Kind::AboutBlank,
                &format!("the rate-limit backend of {gate} is unavailable; the request was not admitted"),
                None,
            ),
            RateLimitRejection::Extraction { .. } => problem(
                StatusCode::BAD_REQUEST,
                Kind::AboutBlank,
                &format!("the request does not name the subject that {gate} counts"),
                None,
            ),
            RateLimitRejection::InvalidCost { error, .. } => {
                problem(StatusCode::BAD_REQUEST, Kind::AboutBlank, &format!("{gate}: {error}"), None)
            }
        }
    }
}

/// `1 second`, `N seconds`.
fn whole_seconds(seconds: u64) -> String {
    if seconds == 1 { "1 second".to_owned() } else { format!("{seconds} seconds") }
}

#[derive(Clone, Copy)]
enum Kind {
    QuotaExceeded,
    TemporaryReducedCapacity,
    AboutBlank,
}

/// Builds the problem response. The body is serialized with `serde_json` (strings and
/// integers only, so it cannot fail; a minimal `about:blank` body stands in if it ever did).
fn problem<B: From<String>>(
    status: StatusCode,
    kind: Kind,
    detail: &str,
    name: Option<&PolicyName>,
) -> Response<B> {
    let (uri, title) = match kind {
        Kind::QuotaExceeded => {
            (QUOTA_EXCEEDED, "Request cannot be satisfied as assigned quota has been exceeded")
        }
        Kind::TemporaryReducedCapacity => (
            TEMPORARY_REDUCED_CAPACITY,
            "Request cannot be satisfied due to temporary server capacity constraints",
        ),
        Kind::AboutBlank => ("about:blank", status.canonical_reason().unwrap_or("Error")),
    };
    let violated_policies = match kind {
        Kind::AboutBlank => None,
        Kind::QuotaExceeded | Kind::TemporaryReducedCapacity => {
            Some(name.map_or([].as_slice(), |name| std::slice::from_ref(name)))
        }
    };
    let body = ProblemBodyOwned { uri, title, status: status.as_u16(), detail, violated_policies };
    let text = serde_json::to_string(&body).unwrap_or_else(|_| r#"{"type":"about:blank"}"#.to_owned());
    let mut response = Response::new(B::from(text));
    *response.status_mut() = status;
    response.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
    response
}

#[derive(Serialize)]
struct ProblemBodyOwned<'a> {
    #[serde(rename = "type")]
    uri: &'static str,
    title: &'static str,
    status: u16,
    detail: &'a str,
    #[serde(rename = "violated-policies", skip_serializing_if = "Option::is_none", serialize_with = "names")]
    violated_policies: Option<&'a [PolicyName]>,
}

fn names<S: serde::Serializer>(names: &Option<&[PolicyName]>, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.collect_seq(names.unwrap_or_default().iter().map(PolicyName::as_str))
}

/// A Tower layer that adds the draft-11 `RateLimit-Policy` and `RateLimit` fields of every
/// admission a request collected to the inner service's response, so handlers need no header
/// code.
///
/// Opt-in, and placed **inside** the gates, next to the handler: it reads the request's
/// [`Admissions`] extension, which the gates fill before it runs. In axum, give the gate and
/// this layer to one route layer as a tuple, the gate first:
/// `post(handler).route_layer((gate, AdmissionFieldsLayer::new()))` (a tuple of layers applies
/// its first element outermost). Two route layers also work, this one added before the gate
/// (`post(handler).route_layer(AdmissionFieldsLayer::new()).route_layer(gate)`: the layer added
/// last runs first), but each route layer costs axum allocations of its own per request.
/// Outside the gates it finds no admissions and adds nothing.
///
/// - One item per admission, outermost gate first, named by a [`NamePolicy`]
///   ([`policy_id_name`] unless set with [`with_names`](Self::with_names)). An allowed
///   admission reports what remains (`r`) and the time to its replenishment (`t`, whole
///   seconds rounded up); a shadow-denied one reports what enforcement would have answered
///   (`r=0`, `t` its retry-after), as `runlimit_http::draft_11` describes.
/// - A policy that cannot be described (a window that is not whole seconds, a quota above
///   RFC 9651's integer range) or that the [`NamePolicy`] leaves unnamed is not disclosed.
/// - A response that already carries either field is left as the handler made it.
/// - Rejected requests never reach this layer: their fields are the mapper's (the
///   [`ProblemRejections`] 429 carries the denying gate's).
///
/// The [crate documentation](crate#a-gate-in-ten-lines) shows it with a gate and
/// [`ProblemRejections`].
#[derive(Clone, Copy, Debug)]
#[must_use]
pub struct AdmissionFieldsLayer {
    names: NamePolicy,
}

impl AdmissionFieldsLayer {
    /// The layer, naming each gate by its policy identifier ([`policy_id_name`]).
    pub fn new() -> Self {
        Self { names: policy_id_name }
    }

    /// The layer, naming each gate with `names` (`None`: not disclosed).
    pub fn with_names(names: NamePolicy) -> Self {
        Self { names }
    }
}

impl Default for AdmissionFieldsLayer {
    fn default() -> Self {
        Self::new()
    }
}

impl<S> Layer<S> for AdmissionFieldsLayer {
    type Service = AdmissionFields<S>;

    fn layer(&self, inner: S) -> AdmissionFields<S> {
        AdmissionFields { inner, names: self.names }
    }
}

/// The service of [`AdmissionFieldsLayer`].
#[derive(Clone, Copy, Debug)]
pub struct AdmissionFields<S> {
    inner: S,
    names: NamePolicy,
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for AdmissionFields<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
{
    type Response = Response<ResBody>;
    type Error = S::Error;
    type Future = AdmissionFieldsFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        let mut fields = RateLimitFields::new();
        if let Some(admissions) = request.extensions().get::<Admissions>() {
            for admission in admissions {
                if let Some(name) = (self.names)(&**admission.policy()) {
                    // Undescribable policies are left undisclosed, as documented.
                    let _ = fields.push(name, admission.policy(), admission.decision());
                }
            }
        }
        // Serialized now, so the future holds the two values, not the items.
        let values = fields.values();
        AdmissionFieldsFuture { inner: self.inner.call(request), values }
    }
}

pin_project! {
    /// The response future of [`AdmissionFields`]: the inner future, then the fields.
    pub struct AdmissionFieldsFuture<F> {
        #[pin]
        inner: F,
        // `RateLimit-Policy` and `RateLimit`; `None` when no admission was disclosed.
        values: Option<(HeaderValue, HeaderValue)>,
    }
}

impl<F, ResBody, Error> Future for AdmissionFieldsFuture<F>
where
    F: Future<Output = Result<Response<ResBody>, Error>>,
{
    type Output = Result<Response<ResBody>, Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let mut response = ready!(this.inner.poll(cx))?;
        let headers = response.headers_mut();
        if let Some((policy, limit)) = this.values.take()
            && !headers.contains_key(RATELIMIT)
            && !headers.contains_key(RATELIMIT_POLICY)
        {
            headers.insert(RATELIMIT_POLICY, policy);
            headers.insert(RATELIMIT, limit);
        }
        Poll::Ready(Ok(response))
    }
}

impl<F> fmt::Debug for AdmissionFieldsFuture<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AdmissionFieldsFuture").field("values", &self.values).finish_non_exhaustive()
    }
}
