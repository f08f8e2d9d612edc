//! Policies, application state, routes, handlers and the rejection mapper.

use std::{fmt, net::IpAddr, sync::Arc, time::Duration};

use axum::{
    Extension, Json, Router,
    extract::{DefaultBodyLimit, State, rejection::JsonRejection},
    response::{IntoResponse, Response},
    routing::{get, post},
};
use http::{HeaderMap, StatusCode, header};
use metrics_exporter_prometheus::PrometheusHandle;
use runlimit_axum::{Admissions, MapRejection, RateLimitLayer, RateLimitRejection};
use runlimit_core::{
    Check, ConsumptionStatus, Denial, FixedWindowPolicy, GcraPolicy, IdentifierError, KeyHasher, Limiter,
    PolicyError, PolicyId, RateLimitPolicy, ScopeId,
    attempts::{AttemptCompletionResult, AttemptDecision, AttemptOutcome, AttemptPolicy},
};
use runlimit_http::draft_11::{
    MAX_INTEGER, PolicyName, PolicyNameError, QuotaPolicy, QuotaPolicyError, QuotaState, RateLimitFields,
};
use serde::Deserialize;

use crate::{
    backend::Backends,
    cli::Args,
    client::{ClientAddressError, ClientKey},
    identity::normalize_identity,
    observe::ErrorChain,
    problem::Problem,
    users::DemoUsers,
};

/// The largest `POST /login` body accepted, in bytes: 4,096. Larger bodies get 413 (after the
/// client gate, which runs before the body is read).
pub const LOGIN_BODY_LIMIT: usize = 4_096;

/// How long `GET /healthz` waits for the database.
const HEALTH_TIMEOUT: Duration = Duration::from_secs(1);

/// Why the policies could not be built from the options.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GatesError {
    /// A policy or scope identifier was rejected (the demo's identifiers are fixed literals,
    /// so this indicates a bug).
    #[error("invalid {gate} policy identifier")]
    Identifier {
        /// The gate's `RateLimit-Policy` name.
        gate: &'static str,
        /// Runlimit's reason.
        #[source]
        source: IdentifierError,
    },
    /// A `RateLimit-Policy` name was rejected (fixed literals; a bug).
    #[error("invalid {gate} policy name")]
    Name {
        /// The rejected name.
        gate: &'static str,
        /// The encoder's reason.
        #[source]
        source: PolicyNameError,
    },
    /// Runlimit rejected a policy parameter (zero, too large, window too long).
    #[error("invalid {gate} policy")]
    Policy {
        /// The gate's `RateLimit-Policy` name.
        gate: &'static str,
        /// Runlimit's reason.
        #[source]
        source: PolicyError,
    },
    /// The policy cannot be advertised in `RateLimit-Policy` (quota above the RFC 9651
    /// integer range).
    #[error("{gate} policy cannot be advertised in RateLimit-Policy")]
    Header {
        /// The gate's name.
        gate: &'static str,
        /// The encoder's reason.
        #[source]
        source: QuotaPolicyError,
    },
    /// A GCRA burst capacity above the RFC 9651 integer range, which `RateLimit`'s `r` could
    /// not carry.
    #[error("{gate} burst capacity {burst} is above the structured field integer maximum of {maximum}")]
    BurstOutOfRange {
        /// The gate's name.
        gate: &'static str,
        /// The rejected burst capacity.
        burst: u64,
        /// `MAX_INTEGER`.
        maximum: u64,
    },
}

/// The gates' policies and the names they are disclosed under.
///
/// | field | name | policy id / scope |
/// |---|---|---|
/// | [`login_client`](Self::login_client) | `login-client` | `demo.login` / `client` |
/// | [`login_identity`](Self::login_identity) | `login-identity` | `demo.login` / `identity` |
/// | [`login_attempts`](Self::login_attempts) | `login-attempts` | `demo.login` / `attempt` |
/// | [`items`](Self::items) | `items` | `demo.items` / `client` |
///
/// `login-attempts` is an attempt policy, not a quota: it is named in `violated-policies` of
/// its 429 problem bodies and ends their `RateLimit` field (`r=0`, `t` the retry-after), but is
/// never advertised in `RateLimit-Policy`.
#[derive(Clone, Debug)]
pub struct Gates {
    /// The per-client login gate (anchored fixed window).
    pub login_client: Arc<FixedWindowPolicy>,
    /// The per-identity login gate (anchored fixed window).
    pub login_identity: Arc<FixedWindowPolicy>,
    /// The per-identity password-check attempt policy (one check at a time, exponential
    /// backoff after failures).
    pub login_attempts: Arc<AttemptPolicy>,
    /// The per-client GCRA gate of `GET /items`.
    pub items: Arc<GcraPolicy>,
    login_client_name: PolicyName,
    login_identity_name: PolicyName,
    login_attempts_name: PolicyName,
    items_name: PolicyName,
}

fn ids(id: &str, scope: &str, gate: &'static str) -> Result<(PolicyId, ScopeId), GatesError> {
    let invalid = |source| GatesError::Identifier { gate, source };
    Ok((PolicyId::new(id).map_err(invalid)?, ScopeId::new(scope).map_err(invalid)?))
}

fn advertised<P: RateLimitPolicy>(gate: &'static str, policy: P) -> Result<(Arc<P>, PolicyName), GatesError> {
    let name = PolicyName::new(gate).map_err(|source| GatesError::Name { gate, source })?;
    QuotaPolicy::from_policy(name.clone(), &policy).map_err(|source| GatesError::Header { gate, source })?;
    Ok((Arc::new(policy), name))
}

impl Gates {
    /// Builds the policies from the options' limits, windows and attempt durations.
    ///
    /// # Errors
    ///
    /// - [`GatesError::Policy`] when Runlimit rejects a count or window (0, above
    ///   `MAX_LIMIT`, a window above `MAX_WINDOW`, a GCRA replenishment too long) or an
    ///   attempt duration (0, too long, cap below the initial delay, quiet period below the
    ///   cap; `AttemptPolicy::new`);
    /// - [`GatesError::Header`] when a quota is above the RFC 9651 integer maximum
    ///   (999,999,999,999,999), so `RateLimit-Policy` could not carry it;
    /// - [`GatesError::BurstOutOfRange`] for such a GCRA burst capacity.
    pub fn new(args: &Args) -> Result<Self, GatesError> {
        const CLIENT: &str = "login-client";
        const IDENTITY: &str = "login-identity";
        const ITEMS: &str = "items";
        const ATTEMPTS: &str = "login-attempts";

        let (id, scope) = ids("demo.login", "client", CLIENT)?;
        let login_client = FixedWindowPolicy::new(
            id,
            scope,
            args.client_limit,
            Duration::from_secs(args.client_window_secs),
        )
        .map_err(|source| GatesError::Policy { gate: CLIENT, source })?;
        let (id, scope) = ids("demo.login", "identity", IDENTITY)?;
        let login_identity = FixedWindowPolicy::new(
            id,
            scope,
            args.identity_limit,
            Duration::from_secs(args.identity_window_secs),
        )
        .map_err(|source| GatesError::Policy { gate: IDENTITY, source })?;
        let (id, scope) = ids("demo.items", "client", ITEMS)?;
        let items = GcraPolicy::new(
            id,
            scope,
            args.items_quota,
            Duration::from_secs(args.items_period_secs),
            args.items_burst,
        )
        .map_err(|source| GatesError::Policy { gate: ITEMS, source })?;
        if items.burst_capacity().get() > MAX_INTEGER {
            return Err(GatesError::BurstOutOfRange {
                gate: ITEMS,
                burst: items.burst_capacity().get(),
                maximum: MAX_INTEGER,
            });
        }
        let (id, scope) = ids("demo.login", "attempt", ATTEMPTS)?;
        let login_attempts = AttemptPolicy::new(
            id,
            scope,
            Duration::from_secs(args.attempt_initial_delay_secs),
            Duration::from_secs(args.attempt_delay_cap_secs),
            Duration::from_secs(args.attempt_quiet_period_secs),
            Duration::from_secs(args.attempt_lease_secs),
        )
        .map_err(|source| GatesError::Policy { gate: ATTEMPTS, source })?;
        let login_attempts_name =
            PolicyName::new(ATTEMPTS).map_err(|source| GatesError::Name { gate: ATTEMPTS, source })?;
        let (login_client, login_client_name) = advertised(CLIENT, login_client)?;
        let (login_identity, login_identity_name) = advertised(IDENTITY, login_identity)?;
        let (items, items_name) = advertised(ITEMS, items)?;
        Ok(Self {
            login_client,
            login_identity,
            login_attempts: Arc::new(login_attempts),
            items,
            login_client_name,
            login_identity_name,
            login_attempts_name,
            items_name,
        })
    }
}

/// Everything the routes share: policies, backends, the key hasher, trusted proxies and
/// the user table. Cloning clones one `Arc`.
#[derive(Clone)]
pub struct App {
    inner: Arc<AppInner>,
}

struct AppInner {
    gates: Gates,
    backends: Backends,
    hasher: KeyHasher,
    trusted_proxies: Arc<[IpAddr]>,
    users: DemoUsers,
    metrics: PrometheusHandle,
}

impl App {
    /// The application state.
    #[must_use]
    pub fn new(
        gates: Gates,
        backends: Backends,
        hasher: KeyHasher,
        trusted_proxies: Vec<IpAddr>,
        users: DemoUsers,
        metrics: PrometheusHandle,
    ) -> Self {
        Self {
            inner: Arc::new(AppInner {
                gates,
                backends,
                hasher,
                trusted_proxies: trusted_proxies.into(),
                users,
                metrics,
            }),
        }
    }

    /// The policies.
    #[must_use]
    pub fn gates(&self) -> &Gates {
        &self.inner.gates
    }

    /// The backends.
    #[must_use]
    pub fn backends(&self) -> &Backends {
        &self.inner.backends
    }
}

impl fmt::Debug for App {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("App")
            .field("gates", &self.inner.gates)
            .field("backends", &self.inner.backends)
            .field("trusted_proxies", &self.inner.trusted_proxies)
            .finish_non_exhaustive()
    }
}

/// The `POST /login` body: `{"identity": "...", "password": "..."}`.
#[derive(Clone, Deserialize)]
pub struct LoginRequest {
    /// The identity (an email address for the demo users); normalized by
    /// [`normalize_identity`].
    pub identity: String,
    /// The password.
    pub password: String,
}

impl fmt::Debug for LoginRequest {
    /// Redacted: neither member is ever printed.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LoginRequest").finish_non_exhaustive()
    }
}

/// The rejection mapper of both client-gate layers: named after the gate it belongs to.
#[derive(Clone, Debug)]
struct GateRejection {
    name: PolicyName,
}

impl<P, C> MapRejection<P, ClientAddressError, C> for GateRejection
where
    P: RateLimitPolicy,
    C: std::error::Error + 'static,
{
    type Response = Response;

    fn map_rejection(&self, rejection: RateLimitRejection<P, ClientAddressError, C>) -> Response {
        match rejection {
            RateLimitRejection::Extraction { policy, error } => {
                tracing::warn!(
                    policy = policy.id().as_str(), scope = policy.scope().as_str(), error = %error,
                    "no client could be named; request refused"
                );
                Problem::about_blank(error.status(), error.to_string()).into_response()
            }
            // The demo's extractors charge every request one unit, which every policy grants;
            // an application that weighs requests answers an impossible cost here.
            RateLimitRejection::InvalidCost { error, .. } => {
                Problem::about_blank(StatusCode::BAD_REQUEST, error.to_string()).into_response()
            }
            RateLimitRejection::Denied { policy, denial: Denial::QuotaExceeded(quota) } => {
                let mut fields = RateLimitFields::new();
                push_fields(&mut fields, &self.name, &*policy, quota);
                Problem::quota_exceeded(&self.name, &quota).with_fields(fields).into_response()
            }
            RateLimitRejection::Denied { denial: Denial::StorageCapacity { retry_after }, .. } => {
                Problem::reduced_capacity(&self.name, retry_after).into_response()
            }
            RateLimitRejection::Backend { policy, error } => {
                tracing::error!(
                    policy = policy.id().as_str(), scope = policy.scope().as_str(), error = %ErrorChain(&error),
                    "rate-limit backend failed; request refused"
                );
                Problem::backend_unavailable().into_response()
            }
        }
    }
}

/// Adds one gate's `RateLimit-Policy` and `RateLimit` items. Every policy was checked to be
/// encodable at startup and backend delays stay within `MAX_WINDOW`, so this cannot fail; if
/// it ever did, the gate is left undisclosed rather than failing the response.
fn push_fields<P: RateLimitPolicy + ?Sized>(
    fields: &mut RateLimitFields,
    name: &PolicyName,
    policy: &P,
    state: impl Into<QuotaState>,
) {
    if let Err(error) = fields.push(name.clone(), policy, state) {
        tracing::warn!(policy = name.as_str(), error = %ErrorChain(&error), "RateLimit fields omitted");
    }
}

/// The fields of the admissions recorded by the layers, for the gates in `names`.
fn admitted_fields(
    admissions: Option<&Admissions>,
    gates: &[(&PolicyName, &dyn RateLimitPolicy)],
) -> RateLimitFields {
    let mut fields = RateLimitFields::new();
    if let Some(admissions) = admissions {
        for (name, policy) in gates {
            if let Some(admission) = admissions.get(*policy) {
                push_fields(&mut fields, name, admission.policy(), admission.decision());
            }
        }
    }
    fields
}

fn with_fields(fields: &RateLimitFields, response: impl IntoResponse) -> Response {
    let mut headers = HeaderMap::new();
    fields.insert_into(&mut headers);
    (headers, response).into_response()
}

/// Builds the router: `POST /login` and `GET /items` behind their client-gate layers,
/// `GET /healthz` and `GET /metrics` ungated. Serve it with
/// `into_make_service_with_connect_info::<SocketAddr>()`: the client extractor needs
/// `ConnectInfo` and refuses requests without it (500).
///
/// The client layers are route layers, so unmatched paths and methods (404, 405) consume no
/// quota. The client gate runs before the body is read: a refused request's body is never
/// read.
pub fn router(app: App) -> Router {
    let gates = app.gates();
    let backends = app.backends();
    let client_key = ClientKey::new(app.inner.hasher.clone(), Arc::clone(&app.inner.trusted_proxies));
    let login_gate = RateLimitLayer::new(
        Arc::clone(&backends.client),
        Arc::clone(&gates.login_client),
        client_key.clone(),
        GateRejection { name: gates.login_client_name.clone() },
    );
    let items_gate = RateLimitLayer::new(
        Arc::clone(&backends.items),
        Arc::clone(&gates.items),
        client_key,
        GateRejection { name: gates.items_name.clone() },
    );
    Router::new()
        .route("/login", post(login).route_layer(login_gate))
        .route("/items", get(items).route_layer(items_gate))
        .route("/healthz", get(healthz))
        .route("/metrics", get(metrics))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(LOGIN_BODY_LIMIT))
        .with_state(app)
}

fn body_problem(rejection: &JsonRejection) -> Problem {
    let detail = match rejection {
        JsonRejection::JsonDataError(_) => {
            "body must be a JSON object with string members \"identity\" and \"password\""
        }
        JsonRejection::JsonSyntaxError(_) => "body is not valid JSON",
        JsonRejection::MissingJsonContentType(_) => "content-type must be application/json",
        JsonRejection::BytesRejection(_) => "body could not be read; at most 4096 bytes are accepted",
        _ => "body rejected",
    };
    // Fixed details only: serde's messages can quote the body, password included.
    Problem::about_blank(rejection.status(), detail)
}

/// `POST /login`: the client gate already admitted the request (layer); parse the body,
/// check the identity gate, then check the password as a `login-attempts` attempt
/// (acquire, verify outside any transaction, complete with the outcome).
async fn login(
    State(app): State<App>,
    admissions: Option<Extension<Admissions>>,
    body: Result<Json<LoginRequest>, JsonRejection>,
) -> Response {
    let gates = app.gates();
    let mut fields = admitted_fields(
        admissions.as_ref().map(|Extension(admissions)| admissions),
        &[(&gates.login_client_name, &*gates.login_client)],
    );
    let request = match body {
        Ok(Json(request)) => request,
        Err(rejection) => return body_problem(&rejection).with_fields(fields).into_response(),
    };
    let identity = match normalize_identity(&request.identity) {
        Ok(identity) => identity,
        Err(error) => {
            return Problem::about_blank(StatusCode::UNPROCESSABLE_ENTITY, error.to_string())
                .with_fields(fields)
                .into_response();
        }
    };

    // A layer's extractor sees only the request head; the identity is in the body, so its
    // gate is checked here with the limiter directly.
    let policy = &*gates.login_identity;
    let name = &gates.login_identity_name;
    let check = Check::new(app.inner.hasher.hash_for(policy, identity.as_bytes()));
    let decision = match app.backends().identity.check(&check).await {
        Ok(decision) => decision,
        Err(error) => {
            tracing::error!(
                policy = policy.id().as_str(), scope = policy.scope().as_str(), error = %ErrorChain(&error),
                "identity gate backend failed; request refused"
            );
            return Problem::backend_unavailable().with_fields(fields).into_response();
        }
    };
    match decision.admit() {
        Ok(admitted) => push_fields(&mut fields, name, policy, admitted),
        Err(Denial::QuotaExceeded(quota)) => {
            push_fields(&mut fields, name, policy, quota);
            return Problem::quota_exceeded(name, &quota).with_fields(fields).into_response();
        }
        Err(Denial::StorageCapacity { retry_after }) => {
            return Problem::reduced_capacity(name, retry_after).with_fields(fields).into_response();
        }
    }

    // The password check is an attempt of the identity's `login-attempts` subject: at most
    // one in flight, and after a failure none until the backoff has passed.
    let attempts_policy = &*gates.login_attempts;
    let attempts_name = &gates.login_attempts_name;
    let attempts = &app.backends().attempts;
    let subject = app.inner.hasher.hash_attempt_for(attempts_policy, identity.as_bytes());
    let receipt = match attempts.acquire(&subject).await {
        Ok(AttemptDecision::Admitted(receipt)) => receipt,
        Ok(AttemptDecision::Denied(denial)) => {
            return Problem::attempt_denied(attempts_name, &denial).with_fields(fields).into_response();
        }
        Err(error) => {
            // Never retried: an uncertain admission may hold a lease whose receipt is lost; it
            // expires as a failure.
            tracing::error!(
                policy = attempts_policy.id().as_str(), scope = attempts_policy.scope().as_str(),
                error = %ErrorChain(&error),
                may_have_been_admitted = error.consumption() == ConsumptionStatus::MayHaveBeenConsumed,
                "attempt limiter failed; request refused"
            );
            return Problem::backend_unavailable().with_fields(fields).into_response();
        }
    };

    // No transaction is open here: a PostgreSQL admission committed before `acquire` returned.
    // If the client goes away from now on, the dropped receipt's lease expires as a failure.
    let verified = app.inner.users.verify(&identity, &request.password);
    let outcome = if verified { AttemptOutcome::Success } else { AttemptOutcome::Failure };
    let result = match attempts.complete(receipt, outcome).await {
        Ok(result) => result,
        Err(error) => {
            // Never retried: an uncertain completion may have been recorded.
            tracing::error!(
                policy = attempts_policy.id().as_str(), scope = attempts_policy.scope().as_str(),
                error = %ErrorChain(&error),
                may_have_been_recorded = error.consumption() == ConsumptionStatus::MayHaveBeenConsumed,
                "attempt completion failed; request refused"
            );
            return Problem::backend_unavailable().with_fields(fields).into_response();
        }
    };
    if result == AttemptCompletionResult::Stale {
        // The lease expired (or was superseded) before the check finished: the attempt already
        // counted as a failure, so the login fails whatever the password said.
        tracing::warn!(
            policy = attempts_policy.id().as_str(),
            scope = attempts_policy.scope().as_str(),
            "password check outlived its attempt lease; login treated as failed"
        );
    }
    if verified && result == AttemptCompletionResult::Reset {
        with_fields(&fields, Json(serde_json::json!({ "authenticated": true })))
    } else {
        Problem::about_blank(StatusCode::UNAUTHORIZED, "identity or password is wrong")
            .with_fields(fields)
            .into_response()
    }
}

/// `GET /items`: admitted by the GCRA layer.
async fn items(State(app): State<App>, admissions: Option<Extension<Admissions>>) -> Response {
    let gates = app.gates();
    let fields = admitted_fields(
        admissions.as_ref().map(|Extension(admissions)| admissions),
        &[(&gates.items_name, &*gates.items)],
    );
    with_fields(&fields, Json(serde_json::json!({ "items": ["apple", "banana", "cherry"] })))
}

/// Unknown paths: 404 as an `about:blank` problem, like every other error. Outside every
/// gate, so it consumes no quota.
async fn not_found() -> Response {
    Problem::about_blank(StatusCode::NOT_FOUND, "no such route").into_response()
}

/// A known path with another method: 405 as an `about:blank` problem (axum still adds the
/// `Allow` header). Outside every gate, so it consumes no quota.
async fn method_not_allowed() -> Response {
    Problem::about_blank(StatusCode::METHOD_NOT_ALLOWED, "method not allowed on this route").into_response()
}

/// `GET /metrics`: every Runlimit metric of this process (see `runlimit_metrics`) in the
/// Prometheus text exposition format (version 0.0.4).
async fn metrics(State(app): State<App>) -> Response {
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], app.inner.metrics.render())
        .into_response()
}

/// `GET /healthz`: 200 when ready, 503 otherwise; see [`Readiness`](crate::Readiness).
async fn healthz(State(app): State<App>) -> Response {
    let readiness = app.backends().readiness(HEALTH_TIMEOUT).await;
    let status = if readiness.is_ready() { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
    (status, Json(readiness)).into_response()
}
