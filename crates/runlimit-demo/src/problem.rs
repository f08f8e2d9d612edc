//! RFC 9457 problem-details responses, with `Retry-After` and the draft-11 `RateLimit` fields.

use std::fmt;

use axum::{
    body::Body,
    response::{IntoResponse, Response},
};
use http::{
    HeaderValue, StatusCode,
    header::{CONTENT_TYPE, RETRY_AFTER},
};
use runlimit_core::{Capacity, Delay, QuotaDenial, attempts::AttemptDenial};
use runlimit_http::draft_11::{PolicyName, RATELIMIT, RateLimitFields, ServiceLimit, service_limits};
use serde::Serialize;

/// The media type of every problem body (RFC 9457 §3).
pub(crate) const PROBLEM_JSON: &str = "application/problem+json";

/// The problem types the demo answers with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProblemType {
    /// draft-ietf-httpapi-ratelimit-headers-11 §5's `quota-exceeded` (status 429):
    /// `https://iana.org/assignments/http-problem-types#quota-exceeded`.
    QuotaExceeded,
    /// draft-11 §5's `temporary-reduced-capacity` (status 503):
    /// `https://iana.org/assignments/http-problem-types#temporary-reduced-capacity`. Used when a
    /// rate-limit store is full and cannot hold a new key.
    TemporaryReducedCapacity,
    /// RFC 9457 §4.2.1's `about:blank`: the problem is just the status code, and the title
    /// is its reason phrase. Used for backend failures, bad bodies and wrong passwords.
    AboutBlank,
}

impl ProblemType {
    /// The `type` member.
    #[must_use]
    pub const fn uri(self) -> &'static str {
        match self {
            Self::QuotaExceeded => "https://iana.org/assignments/http-problem-types#quota-exceeded",
            Self::TemporaryReducedCapacity => {
                "https://iana.org/assignments/http-problem-types#temporary-reduced-capacity"
            }
            Self::AboutBlank => "about:blank",
        }
    }

    /// The `title` member: the draft's registered title, or the status's reason phrase for
    /// `about:blank`.
    #[must_use]
    pub fn title(self, status: StatusCode) -> &'static str {
        match self {
            Self::QuotaExceeded => "Request cannot be satisfied as assigned quota has been exceeded",
            Self::TemporaryReducedCapacity => {
                "Request cannot be satisfied due to temporary server capacity constraints"
            }
            Self::AboutBlank => status.canonical_reason().unwrap_or("Error"),
        }
    }
}

/// An RFC 9457 problem-details response (`application/problem+json`).
///
/// Body members, in this order: `type`, `title`, `status`, `detail`, and for the draft's
/// problem types `violated-policies` (the `RateLimit-Policy` names of the refusing gates).
/// Headers: `Retry-After` in whole seconds when set, and the `RateLimit-Policy` / `RateLimit`
/// fields added with [`with_fields`](Self::with_fields).
///
/// A 429 from the `login-identity` gate looks like:
///
/// ```text
/// HTTP/1.1 429 Too Many Requests
/// content-type: application/problem+json
/// retry-after: 600
/// ratelimit-policy: "login-client";q=40;w=60, "login-identity";q=8;w=600
/// ratelimit: "login-client";r=30;t=42, "login-identity";r=0;t=600
///
/// {"type":"https://iana.org/assignments/http-problem-types#quota-exceeded",
///  "title":"Request cannot be satisfied as assigned quota has been exceeded","status":429,
///  "detail":"quota of policy \"login-identity\" is exhausted; retry after 600 seconds",
///  "violated-policies":["login-identity"]}
/// ```
#[must_use]
pub struct Problem {
    status: StatusCode,
    kind: ProblemType,
    detail: String,
    violated_policies: Vec<PolicyName>,
    retry_after: Option<u64>,
    fields: RateLimitFields,
    /// The exhausted attempt policy's `RateLimit` item, appended after the quota items.
    attempt_limit: Option<ServiceLimit>,
}

#[derive(Serialize)]
struct ProblemBody<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    title: &'static str,
    status: u16,
    detail: &'a str,
    #[serde(rename = "violated-policies", skip_serializing_if = "Vec::is_empty")]
    violated_policies: Vec<&'a str>,
}

/// `1 second`, `N seconds`: a whole number of seconds in a detail message.
fn whole_seconds(seconds: u64) -> String {
    if seconds == 1 { "1 second".to_owned() } else { format!("{seconds} seconds") }
}

impl Problem {
    /// 429 `quota-exceeded` for the gate `name`: `Retry-After` is the denial's
    /// [`Delay::seconds`] (rounded up), the same value as that gate's `RateLimit` `t`.
    pub fn quota_exceeded(name: &PolicyName, denial: &QuotaDenial) -> Self {
        let seconds = denial.retry_after().seconds();
        Self {
            status: StatusCode::TOO_MANY_REQUESTS,
            kind: ProblemType::QuotaExceeded,
            detail: format!(
                "quota of policy \"{}\" is exhausted; retry after {}",
                name.as_str(),
                whole_seconds(seconds)
            ),
            violated_policies: vec![name.clone()],
            retry_after: Some(seconds),
            fields: RateLimitFields::new(),
            attempt_limit: None,
        }
    }

    /// The refusal of a password-check attempt by the attempt limiter `name`
    /// (`runlimit_core::attempts`), shaped like [`quota_exceeded`](Self::quota_exceeded):
    ///
    /// - [`AttemptDenial::Backoff`]: 429 `quota-exceeded`, `Retry-After` the remaining backoff
    ///   in whole seconds rounded up ([`Delay::seconds`]), detail
    ///   `password checks of policy "NAME" are backing off after a failed attempt; retry after
    ///   N seconds`;
    /// - [`AttemptDenial::InProgress`]: 429 `quota-exceeded`, `Retry-After` the time to the
    ///   active lease's deadline rounded up (0 when the backend does not know it), detail
    ///   `another password check of policy "NAME" is in progress; retry after N seconds` (`1 second` for one);
    /// - [`AttemptDenial::StorageCapacity`]: 503, as
    ///   [`reduced_capacity`](Self::reduced_capacity), with `Retry-After` only when the store
    ///   knows its earliest expiry.
    ///
    /// `violated-policies` names `name`. For a backoff or a check in progress, the `RateLimit`
    /// field ends with `"NAME";r=0;t=N` (`N` the `Retry-After` value), so the headers name the
    /// policy that refused; `RateLimit-Policy` gets no item for it, since an attempt policy is
    /// not a quota (it has no `q`/`w` to advertise).
    pub fn attempt_denied(name: &PolicyName, denial: &AttemptDenial) -> Self {
        let (retry_after, detail) = match *denial {
            AttemptDenial::Backoff { retry_after, .. } => {
                let seconds = retry_after.seconds();
                let detail = format!(
                    "password checks of policy \"{}\" are backing off after a failed attempt; retry after {}",
                    name.as_str(),
                    whole_seconds(seconds)
                );
                (retry_after, detail)
            }
            AttemptDenial::InProgress { retry_after } => {
                let seconds = retry_after.seconds();
                let detail = format!(
                    "another password check of policy \"{}\" is in progress; retry after {}",
                    name.as_str(),
                    whole_seconds(seconds)
                );
                (retry_after, detail)
            }
            AttemptDenial::StorageCapacity { retry_after } => {
                return Self::reduced_capacity(name, retry_after);
            }
        };
        let seconds = retry_after.seconds();
        // One attempt at a time, none left until the delay ends: r=0, t the same rounded-up
        // seconds as Retry-After. Cannot fail (1 is a valid capacity, delays stay within
        // MAX_WINDOW); if it ever did, the item is left out rather than failing the response.
        let attempt_limit = Capacity::new(1)
            .ok()
            .and_then(|one| ServiceLimit::new(name.clone(), QuotaDenial::new(one, retry_after)).ok());
        Self {
            status: StatusCode::TOO_MANY_REQUESTS,
            kind: ProblemType::QuotaExceeded,
            detail,
            violated_policies: vec![name.clone()],
            retry_after: Some(seconds),
            fields: RateLimitFields::new(),
            attempt_limit,
        }
    }

    /// 503 `temporary-reduced-capacity`: the store of gate `name` is full and cannot hold a
    /// new key. `Retry-After` is set when the store knows its earliest expiry.
    pub fn reduced_capacity(name: &PolicyName, retry_after: Option<Delay>) -> Self {
        Self {
            status: StatusCode::SERVICE_UNAVAILABLE,
            kind: ProblemType::TemporaryReducedCapacity,
            detail: format!("rate-limit storage of policy \"{}\" is full; retry later", name.as_str()),
            violated_policies: vec![name.clone()],
            retry_after: retry_after.map(Delay::seconds),
            fields: RateLimitFields::new(),
            attempt_limit: None,
        }
    }

    /// 503 `about:blank`: the rate-limit backend could not evaluate the request, which is
    /// therefore refused (fail closed).
    pub fn backend_unavailable() -> Self {
        Self::about_blank(
            StatusCode::SERVICE_UNAVAILABLE,
            "rate-limit backend unavailable; the request was not admitted",
        )
    }

    /// An `about:blank` problem with `status` and a fixed `detail` (never echo request data).
    pub fn about_blank(status: StatusCode, detail: impl Into<String>) -> Self {
        Self {
            status,
            kind: ProblemType::AboutBlank,
            detail: detail.into(),
            violated_policies: Vec::new(),
            retry_after: None,
            fields: RateLimitFields::new(),
            attempt_limit: None,
        }
    }

    /// Adds the `RateLimit-Policy` and `RateLimit` fields (nothing when `fields` is empty).
    pub fn with_fields(mut self, fields: RateLimitFields) -> Self {
        self.fields = fields;
        self
    }

    /// The status code.
    #[must_use]
    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// The JSON body.
    #[must_use]
    pub fn body(&self) -> Vec<u8> {
        let body = ProblemBody {
            kind: self.kind.uri(),
            title: self.kind.title(self.status),
            status: self.status.as_u16(),
            detail: &self.detail,
            violated_policies: self.violated_policies.iter().map(PolicyName::as_str).collect(),
        };
        // Serializing strings and integers into a Vec cannot fail; fall back to a minimal
        // valid body rather than panic in a response path.
        serde_json::to_vec(&body).unwrap_or_else(|_| br#"{"type":"about:blank"}"#.to_vec())
    }
}

impl fmt::Debug for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Problem")
            .field("status", &self.status)
            .field("type", &self.kind)
            .field("detail", &self.detail)
            .field("violated_policies", &self.violated_policies)
            .field("retry_after", &self.retry_after)
            .finish_non_exhaustive()
    }
}

impl IntoResponse for Problem {
    fn into_response(self) -> Response {
        let mut response = Response::new(Body::from(self.body()));
        *response.status_mut() = self.status;
        let headers = response.headers_mut();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
        if let Some(seconds) = self.retry_after {
            headers.insert(RETRY_AFTER, HeaderValue::from(seconds));
        }
        self.fields.insert_into(headers);
        if let Some(attempt) = &self.attempt_limit {
            let items = self.fields.service_limits().iter().chain(std::iter::once(attempt));
            if let Some(value) = service_limits(items) {
                headers.insert(RATELIMIT, value);
            }
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use runlimit_core::{Capacity, FixedWindowPolicy, PolicyId, ScopeId};

    use super::*;

    #[tokio::test]
    async fn quota_exceeded_response() {
        let name = PolicyName::new("login-identity").unwrap();
        let policy = FixedWindowPolicy::new(
            PolicyId::new("demo.login").unwrap(),
            ScopeId::new("identity").unwrap(),
            8,
            Duration::from_secs(600),
        )
        .unwrap();
        let denial = QuotaDenial::new(Capacity::new(8).unwrap(), Delay::from_millis(599_001));
        let mut fields = RateLimitFields::new();
        fields.push(name.clone(), &policy, denial).unwrap();
        let response = Problem::quota_exceeded(&name, &denial).with_fields(fields).into_response();
        assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
        let headers = response.headers();
        assert_eq!(headers["content-type"], "application/problem+json");
        assert_eq!(headers["retry-after"], "600");
        assert_eq!(headers["ratelimit-policy"], r#""login-identity";q=8;w=600"#);
        assert_eq!(headers["ratelimit"], r#""login-identity";r=0;t=600"#);
        let body = axum::body::to_bytes(response.into_body(), 4096).await.unwrap();
        assert_eq!(
            std::str::from_utf8(&body).unwrap(),
            r#"{"type":"https://iana.org/assignments/http-problem-types#quota-exceeded","title":"Request cannot be satisfied as assigned quota has been exceeded","status":429,"detail":"quota of policy \"login-identity\" is exhausted; retry after 600 seconds","violated-policies":["login-identity"]}"#
        );
    }

    #[tokio::test]
    async fn attempt_denials() {
        let name = PolicyName::new("login-attempts").unwrap();
        let backoff =
            AttemptDenial::Backoff { retry_after: Delay::from_millis(1_001), consecutive_failures: 2 };
        let response = Problem::attempt_denied(&name, &backoff).into_response();
        assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(response.headers()["retry-after"], "2");
        assert_eq!(response.headers()["ratelimit"], r#""login-attempts";r=0;t=2"#);
        assert!(response.headers().get("ratelimit-policy").is_none());
        let body = axum::body::to_bytes(response.into_body(), 4096).await.unwrap();
        assert_eq!(
            std::str::from_utf8(&body).unwrap(),
            r#"{"type":"https://iana.org/assignments/http-problem-types#quota-exceeded","title":"Request cannot be satisfied as assigned quota has been exceeded","status":429,"detail":"password checks of policy \"login-attempts\" are backing off after a failed attempt; retry after 2 seconds","violated-policies":["login-attempts"]}"#
        );

        let busy = AttemptDenial::InProgress { retry_after: Delay::from_millis(0) };
        let response = Problem::attempt_denied(&name, &busy).into_response();
        assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(response.headers()["retry-after"], "0");
        assert_eq!(response.headers()["ratelimit"], r#""login-attempts";r=0;t=0"#);
        let body = axum::body::to_bytes(response.into_body(), 4096).await.unwrap();
        assert_eq!(
            std::str::from_utf8(&body).unwrap(),
            r#"{"type":"https://iana.org/assignments/http-problem-types#quota-exceeded","title":"Request cannot be satisfied as assigned quota has been exceeded","status":429,"detail":"another password check of policy \"login-attempts\" is in progress; retry after 0 seconds","violated-policies":["login-attempts"]}"#
        );

        let full = AttemptDenial::StorageCapacity { retry_after: None };
        let response = Problem::attempt_denied(&name, &full).into_response();
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert!(response.headers().get("retry-after").is_none());
    }

    #[tokio::test]
    async fn capacity_and_backend_responses() {
        let name = PolicyName::new("items").unwrap();
        let full = Problem::reduced_capacity(&name, Some(Delay::from_millis(1_500))).into_response();
        assert_eq!(full.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(full.headers()["retry-after"], "2");
        assert!(full.headers().get("ratelimit").is_none());
        let body = axum::body::to_bytes(full.into_body(), 4096).await.unwrap();
        assert_eq!(
            std::str::from_utf8(&body).unwrap(),
            r#"{"type":"https://iana.org/assignments/http-problem-types#temporary-reduced-capacity","title":"Request cannot be satisfied due to temporary server capacity constraints","status":503,"detail":"rate-limit storage of policy \"items\" is full; retry later","violated-policies":["items"]}"#
        );

        let unknown = Problem::reduced_capacity(&name, None).into_response();
        assert!(unknown.headers().get("retry-after").is_none());

        let backend = Problem::backend_unavailable().into_response();
        assert_eq!(backend.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert!(backend.headers().get("retry-after").is_none());
        let body = axum::body::to_bytes(backend.into_body(), 4096).await.unwrap();
        assert_eq!(
            std::str::from_utf8(&body).unwrap(),
            r#"{"type":"about:blank","title":"Service Unavailable","status":503,"detail":"rate-limit backend unavailable; the request was not admitted"}"#
        );
    }
}
