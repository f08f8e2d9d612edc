//! Test-only pieces: a tiny in-test limiter, counting bodies and services, policies, a key
//! extractor and a rejection mapper that uses `runlimit-http`.

use std::{
    collections::HashMap,
    convert::Infallible,
    fmt,
    net::SocketAddr,
    pin::Pin,
    sync::{
        Arc, Mutex,
        atomic::{AtomicUsize, Ordering},
    },
    task::{Context, Poll},
    time::Duration,
};

use axum::{
    Extension,
    body::Body,
    extract::{ConnectInfo, State},
    response::{IntoResponse, Response},
};
use bytes::Bytes;
use http::{
    HeaderMap, HeaderValue, StatusCode,
    header::{CONTENT_TYPE, RETRY_AFTER},
    request::Parts,
};
use http_body::Frame;
use runlimit_axum::{Admissions, ExtractSubjectKey, RateLimitRejection};
use runlimit_core::{
    Admitted, Allowance, BatchDecision, Check, CounterKey, Decision, Delay, Denial, FixedWindowPolicy,
    KeyHasher, Limiter, PolicyId, QuotaDenial, QuotaMode, RateLimitPolicy, ScopeId, SubjectKey,
};
use runlimit_http::draft_11::{PolicyName, RateLimitFields};

// ---------------------------------------------------------------------------------------------
// A tiny limiter: counts per counter key forever (no window expiry), reports the whole window
// as the delay, so every value a test asserts is exact.

/// What the next checks of a [`TestLimiter`] do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    /// Count against the policy.
    Normal,
    /// Fail every check with [`BackendDown`].
    Fail,
    /// Deny every check with `Denial::StorageCapacity { retry_after: Some(7 s) }`.
    Full,
}

#[derive(Debug)]
pub(crate) struct TestLimiter {
    counts: Mutex<HashMap<CounterKey, u64>>,
    mode: Mutex<Mode>,
    checks: AtomicUsize,
}

/// The test limiter's only error.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct BackendDown;

impl fmt::Display for BackendDown {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("backend down")
    }
}

impl std::error::Error for BackendDown {}

impl TestLimiter {
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(Self::owned())
    }

    /// A limiter to move into a layer by value (not shared through an `Arc` of the test's).
    pub(crate) fn owned() -> Self {
        Self { counts: Mutex::default(), mode: Mutex::new(Mode::Normal), checks: AtomicUsize::new(0) }
    }

    pub(crate) fn set_mode(&self, mode: Mode) {
        *self.mode.lock().unwrap() = mode;
    }

    /// How many checks were evaluated (first polls of check futures).
    pub(crate) fn checks(&self) -> usize {
        self.checks.load(Ordering::SeqCst)
    }

    fn evaluate(&self, check: &Check<'_, FixedWindowPolicy>) -> Result<Decision, BackendDown> {
        self.checks.fetch_add(1, Ordering::SeqCst);
        match *self.mode.lock().unwrap() {
            Mode::Normal => {}
            Mode::Fail => return Err(BackendDown),
            Mode::Full => {
                return Ok(Decision::denied(Denial::StorageCapacity {
                    retry_after: Some(Delay::from_millis(7_000)),
                }));
            }
        }
        let policy = check.policy();
        let limit = policy.limit();
        let window = Delay::from_duration(policy.window().duration());
        let mut counts = self.counts.lock().unwrap();
        let used = counts.entry(check.counter_key()).or_insert(0);
        if *used < limit.get() {
            *used += 1;
            Ok(Decision::allowed(Allowance::new(limit, limit.get() - *used, window).unwrap()))
        } else {
            Ok(Decision::quota_exceeded(QuotaDenial::new(limit, window), policy.quota_mode()))
        }
    }
}

impl Limiter for TestLimiter {
    type Policy = FixedWindowPolicy;
    type CheckError = BackendDown;
    type CheckAllError = BackendDown;

    async fn check(&self, check: &Check<'_, FixedWindowPolicy>) -> Result<Decision, BackendDown> {
        self.evaluate(check)
    }

    async fn check_all(
        &self,
        _checks: &[Check<'_, FixedWindowPolicy>],
    ) -> Result<BatchDecision, BackendDown> {
        Err(BackendDown)
    }
}

// ---------------------------------------------------------------------------------------------
// Policies, extractors, mapper

pub(crate) fn policy(scope: &str, limit: u64) -> FixedWindowPolicy {
    FixedWindowPolicy::new(
        PolicyId::new("auth.login").unwrap(),
        ScopeId::new(scope).unwrap(),
        limit,
        Duration::from_secs(60),
    )
    .unwrap()
}

pub(crate) fn shadow(scope: &str, limit: u64) -> FixedWindowPolicy {
    policy(scope, limit).with_quota_mode(QuotaMode::Shadow)
}

pub(crate) fn hasher() -> KeyHasher {
    KeyHasher::new(b"runlimit-axum test secret, 32+ bytes long").unwrap()
}

/// Why a test extractor could not name a subject.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct MissingHeader(pub(crate) &'static str);

/// Keys by the `x-client` header (a test stand-in for an application's trusted address).
pub(crate) fn client_header(parts: &Parts, policy: &FixedWindowPolicy) -> Result<SubjectKey, MissingHeader> {
    let value = parts.headers.get("x-client").ok_or(MissingHeader("x-client"))?;
    Ok(hasher().hash_for(policy, value.as_bytes()).into_unbound_subject_key())
}

/// Keys by the lowercased `x-identity` header.
pub(crate) fn identity_header(
    parts: &Parts,
    policy: &FixedWindowPolicy,
) -> Result<SubjectKey, MissingHeader> {
    let value = parts.headers.get("x-identity").ok_or(MissingHeader("x-identity"))?;
    Ok(hasher().hash_for(policy, &value.as_bytes().to_ascii_lowercase()).into_unbound_subject_key())
}

/// The socket peer address from `ConnectInfo`, which these tests' application chose to trust
/// (no forwarding headers).
pub(crate) fn peer<P: RateLimitPolicy>(parts: &Parts, policy: &P) -> Result<SubjectKey, MissingHeader> {
    let ConnectInfo(address) =
        parts.extensions.get::<ConnectInfo<SocketAddr>>().ok_or(MissingHeader("peer address"))?;
    let subject = format!("client-ip:{}", address.ip());
    Ok(hasher().hash_for(policy, subject.as_bytes()).into_unbound_subject_key())
}

/// Keys by the lowercased `x-identity` header and charges the units the `x-cost` header
/// declares (1 without it; a value that is not a number is an extraction error).
pub(crate) struct WeightedIdentity;

impl ExtractSubjectKey<FixedWindowPolicy> for WeightedIdentity {
    type Error = MissingHeader;

    fn extract_subject_key(
        &self,
        parts: &Parts,
        policy: &FixedWindowPolicy,
    ) -> Result<SubjectKey, MissingHeader> {
        identity_header(parts, policy)
    }

    fn extract_cost(&self, parts: &Parts, _: &FixedWindowPolicy) -> Result<u64, MissingHeader> {
        match parts.headers.get("x-cost") {
            None => Ok(1),
            Some(value) => value
                .to_str()
                .ok()
                .and_then(|text| text.parse().ok())
                .ok_or(MissingHeader("a numeric x-cost")),
        }
    }
}

pub(crate) fn name_of<P: RateLimitPolicy + ?Sized>(policy: &P) -> PolicyName {
    PolicyName::new(&format!("{}-{}", policy.id(), policy.scope())).unwrap()
}

/// The application's mapper: 400 for missing metadata, 413 naming the error for an
/// impossible cost, 429 problem details with
/// `Retry-After` and RateLimit fields for quota, 503 for storage and backend failures.
pub(crate) fn reject<P: RateLimitPolicy, C: fmt::Display>(
    rejection: RateLimitRejection<P, MissingHeader, C>,
) -> Response {
    match rejection {
        RateLimitRejection::Extraction { error: MissingHeader(header), .. } => {
            (StatusCode::BAD_REQUEST, format!("missing {header}")).into_response()
        }
        RateLimitRejection::InvalidCost { error, .. } => {
            (StatusCode::PAYLOAD_TOO_LARGE, error.to_string()).into_response()
        }
        RateLimitRejection::Denied { policy, denial: Denial::QuotaExceeded(quota) } => {
            let name = name_of(&policy);
            let mut headers = HeaderMap::new();
            let mut fields = RateLimitFields::new();
            fields.push(name.clone(), &policy, quota).unwrap();
            fields.insert_into(&mut headers);
            headers.insert(RETRY_AFTER, HeaderValue::from(quota.retry_after().seconds()));
            headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/problem+json"));
            let body = format!(
                r#"{{"type":"https://iana.org/assignments/http-problem-types#quota-exceeded","status":429,"violated-policies":["{name}"]}}"#
            );
            (StatusCode::TOO_MANY_REQUESTS, headers, body).into_response()
        }
        RateLimitRejection::Denied { denial: Denial::StorageCapacity { retry_after }, .. } => {
            let mut headers = HeaderMap::new();
            if let Some(delay) = retry_after {
                headers.insert(RETRY_AFTER, HeaderValue::from(delay.seconds()));
            }
            (StatusCode::SERVICE_UNAVAILABLE, headers, "storage full").into_response()
        }
        RateLimitRejection::Backend { policy, error } => {
            (StatusCode::SERVICE_UNAVAILABLE, format!("{} unavailable: {error}", policy.scope()))
                .into_response()
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Handlers and bodies

/// Counts handler invocations.
#[derive(Clone, Default)]
pub(crate) struct Calls(pub(crate) Arc<AtomicUsize>);

impl Calls {
    pub(crate) fn get(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }
}

/// `allowed:<available>` or `shadow:<retry seconds>`.
pub(crate) fn describe(decision: Admitted) -> String {
    match decision {
        Admitted::Allowed(allowance) => format!("allowed:{}", allowance.available()),
        Admitted::ShadowDenied(denial) => format!("shadow:{}", denial.retry_after().seconds()),
    }
}

/// Reads the body, then answers `<body>|<scope>=<decision>,...` with RateLimit fields for
/// every admission.
pub(crate) async fn handler(
    State(calls): State<Calls>,
    Extension(admissions): Extension<Admissions>,
    body: String,
) -> Response {
    calls.0.fetch_add(1, Ordering::SeqCst);
    let mut fields = RateLimitFields::new();
    let mut summary = Vec::new();
    for admission in &admissions {
        let policy = admission.policy();
        fields.push(name_of(&**policy), policy, admission.decision()).unwrap();
        summary.push(format!("{}={}", policy.scope(), describe(admission.decision())));
    }
    let mut headers = HeaderMap::new();
    fields.insert_into(&mut headers);
    (headers, format!("{body}|{}", summary.join(","))).into_response()
}

/// A body that counts how often it is polled, so a test can prove it was never read.
pub(crate) struct CountingBody {
    polls: Arc<AtomicUsize>,
    inner: Body,
}

impl CountingBody {
    pub(crate) fn wrap(inner: Body, polls: Arc<AtomicUsize>) -> Body {
        Body::new(Self { polls, inner })
    }
}

impl http_body::Body for CountingBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        self.polls.fetch_add(1, Ordering::SeqCst);
        Pin::new(&mut self.inner).poll_frame(cx)
    }
}

/// A body that panics when read: a denial must never touch it.
pub(crate) struct PanickingBody;

impl http_body::Body for PanickingBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        panic!("the request body was read")
    }
}

pub(crate) async fn text(response: Response) -> String {
    use http_body_util::BodyExt as _;
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    String::from_utf8(bytes.to_vec()).unwrap()
}
