//! Caller-controlled Axum/Tower admission middleware for Runlimit limiters.
//!
//! [`RateLimitLayer`] checks each request against one Runlimit policy *before* the handler,
//! its extractors or the request body run. The application supplies every decision Runlimit
//! cannot make for it:
//!
//! - a synchronous key extractor ([`ExtractSubjectKey`], or a closure
//!   `Fn(&Parts, &Policy) -> Result<SubjectKey, E>`) that names the opaque subject;
//!   and, optionally, what the request costs
//!   ([`ExtractSubjectKey::extract_cost`], one unit unless overridden), from the head alone;
//! - a rejection mapper ([`MapRejection`], or a closure) that owns the status, body and
//!   headers for an extraction error, an impossible cost, an enforced denial, and a backend
//!   error, all variants of the exhaustive [`RateLimitRejection`].
//!
//! The layer binds the extracted key to its own configured policy, so an extractor picks the
//! subject but can never swap the policy that is evaluated and recorded. Works with any
//! [`Limiter`](runlimit_core::Limiter) backend (`runlimit-memory`, `runlimit-postgres`, an
//! application enum), shared by `Arc`.
//!
//! # A gate in ten lines
//!
//! With the ready-made responses, which the application opts into ([`ProblemRejections`] for
//! rejections, [`AdmissionFieldsLayer`] for the draft-11 fields of admitted responses), a
//! complete gate keyed by an API-key header is:
//!
//! ```
//! use std::{sync::Arc, time::Duration};
//! use axum::{Router, routing::get};
//! use http::header::HeaderName;
//! use runlimit_axum::{AdmissionFieldsLayer, HeaderKey, ProblemRejections, RateLimitLayer};
//! use runlimit_core::{FixedWindowPolicy, KeyHasher, PolicyId, ScopeId};
//! use runlimit_memory::{MemoryStore, MemoryStoreConfig};
//!
//! fn app(secret: &[u8]) -> Result<Router, Box<dyn std::error::Error>> {
//!     let store = Arc::new(MemoryStore::new(MemoryStoreConfig::new(10_000)?));
//!     let policy = FixedWindowPolicy::new(PolicyId::new("api")?, ScopeId::new("api-key")?, 100, Duration::from_secs(60))?;
//!     // Keyed by the x-api-key header (hashed; a missing or empty header is refused with 400).
//!     let api_key = HeaderKey::new(HeaderName::from_static("x-api-key"), KeyHasher::new(secret)?);
//!     let gate = RateLimitLayer::new(store, policy, api_key, ProblemRejections::new());
//!     // One route layer: the gate first (outermost), then the fields of its admission.
//!     Ok(Router::new().route("/items", get(|| async { "items" }).route_layer((gate, AdmissionFieldsLayer::new()))))
//! }
//! # app(&[7; 32]).map(drop).unwrap();
//! ```
//!
//! Each admitted response carries `RateLimit-Policy: "api";q=100;w=60` and, for example,
//! `RateLimit: "api";r=99;t=60`. The 101st request of a key within the window gets `429`,
//! `Retry-After` (whole seconds, rounded up), the same two fields with `r=0`, and an RFC 9457
//! body of type `quota-exceeded`; a request without the header gets a `400` problem. The
//! crate's `tests/layer/ready_made.rs` sends these requests over real HTTP and checks every
//! byte. `cargo run -p runlimit-axum --example api_key` serves this route and calls it.
//!
//! The API key is hashed with the application's secret ([`KeyHasher`](runlimit_core::KeyHasher)),
//! so neither the store nor a log ever holds it. Whether an unknown key may spend quota at
//! all (or should be refused before the gate) is the application's decision.
//!
//! # Key extraction recipes
//!
//! The layer reads nothing from the request itself; the extractor decides what a subject is.
//! Two recipes cover most gates; copy and adapt them.
//!
//! ## An API-key header
//!
//! [A gate in ten lines](#a-gate-in-ten-lines) uses the ready-made [`HeaderKey`]: it reads the
//! header, refuses the request (400, through the mapper) when it is absent or empty (an empty
//! value would otherwise be one bucket shared by every such request), and hashes its bytes
//! with the application's [`KeyHasher`](runlimit_core::KeyHasher) so the raw key is never
//! stored. Keys are case-sensitive bytes; if your keys are not, write the extractor yourself
//! (the closure form of [`ExtractSubjectKey`] shows one) and normalize before hashing. To keep
//! strangers from spending quota under made-up keys, authenticate first (an outer layer that
//! rejects unknown keys) or key unauthenticated requests by peer instead.
//!
//! ## The peer address (`ConnectInfo`)
//!
//! With the `axum` feature, [`PeerAddressKey`] is the ready-made extractor: it keys by the
//! socket peer's IPv4 address or IPv6 /64 network (hashed), from axum's
//! `ConnectInfo<SocketAddr>`, and its example is a complete per-client gate. Serve the router
//! with `into_make_service_with_connect_info::<SocketAddr>()`: without it there is no peer
//! address, and every request is refused with [`MissingPeerAddress`], whose message names that
//! call. It reads only the socket peer; behind a reverse proxy, every request would share the
//! proxy's quota.
//!
//! Written by hand instead (to key by something derived from the address, or by the client a
//! trusted proxy names), a per-client gate with a hand-written mapper that answers 429 with
//! `Retry-After` is:
//!
//! ```
//! use std::{net::SocketAddr, sync::Arc, time::Duration};
//! use axum::{
//!     extract::ConnectInfo, response::{IntoResponse, Response}, routing::post, Extension, Router,
//! };
//! use http::{header::RETRY_AFTER, request::Parts, StatusCode};
//! use runlimit_axum::{Admissions, RateLimitLayer, RateLimitRejection};
//! use runlimit_core::{Denial, FixedWindowPolicy, KeyHasher, Limiter, PolicyId, ScopeId, SubjectKey};
//!
//! fn router<L>(limiter: Arc<L>, hasher: KeyHasher) -> Result<Router, Box<dyn std::error::Error>>
//! where
//!     L: Limiter<Policy = FixedWindowPolicy> + 'static,
//! {
//!     let client = FixedWindowPolicy::new(
//!         PolicyId::new("auth.login")?, ScopeId::new("client")?, 40, Duration::from_secs(60))?;
//!
//!     let client_key = move |parts: &Parts, policy: &FixedWindowPolicy| -> Result<SubjectKey, &'static str> {
//!         let ConnectInfo(peer) = parts.extensions.get::<ConnectInfo<SocketAddr>>()
//!             .ok_or("no ConnectInfo<SocketAddr>: serve with into_make_service_with_connect_info")?;
//!         let subject = format!("client-ip:{}", peer.ip());
//!         Ok(hasher.hash_for(policy, subject.as_bytes()).into_unbound_subject_key())
//!     };
//!
//!     let reject = |rejection: RateLimitRejection<FixedWindowPolicy, &'static str, L::CheckError>| -> Response {
//!         match rejection {
//!             RateLimitRejection::Denied { denial: Denial::QuotaExceeded(quota), .. } => {
//!                 let seconds = quota.retry_after().seconds().to_string();
//!                 (StatusCode::TOO_MANY_REQUESTS, [(RETRY_AFTER, seconds)], "slow down").into_response()
//!             }
//!             RateLimitRejection::Extraction { .. } | RateLimitRejection::InvalidCost { .. } => {
//!                 StatusCode::BAD_REQUEST.into_response()
//!             }
//!             RateLimitRejection::Denied { denial: Denial::StorageCapacity { .. }, .. }
//!             | RateLimitRejection::Backend { .. } => StatusCode::SERVICE_UNAVAILABLE.into_response(),
//!         }
//!     };
//!
//!     Ok(Router::new()
//!         .route("/login", post(login).route_layer(RateLimitLayer::new(limiter, client, client_key, reject))))
//! }
//!
//! async fn login(Extension(admissions): Extension<Admissions>) -> String {
//!     format!("admitted by {} gate(s)", admissions.len())
//! }
//! # let _ = router::<runlimit_core_test_limiter::Never>;
//! # mod runlimit_core_test_limiter {
//! #     use runlimit_core::{BatchDecision, Check, Decision, FixedWindowPolicy, Limiter};
//! #     pub struct Never;
//! #     impl Limiter for Never {
//! #         type Policy = FixedWindowPolicy;
//! #         type CheckError = std::io::Error;
//! #         type CheckAllError = std::io::Error;
//! #         async fn check(&self, _: &Check<'_, FixedWindowPolicy>) -> Result<Decision, std::io::Error> {
//! #             Err(std::io::Error::other("unused"))
//! #         }
//! #         async fn check_all(&self, _: &[Check<'_, FixedWindowPolicy>]) -> Result<BatchDecision, std::io::Error> {
//! #             Err(std::io::Error::other("unused"))
//! #         }
//! #     }
//! # }
//! ```
//!
//! Serve such a router with `into_make_service_with_connect_info::<SocketAddr>()` so that
//! `ConnectInfo` is present; without it, every request is an extraction error, refused with no
//! quota spent (log the extraction error in the mapper, so the message that names the missing
//! call reaches the developer rather than the client). Deriving the client from forwarding headers is only correct behind a proxy the
//! application trusts, and is the application's decision. IPv6 clients usually control a
//! whole /64: key by the network prefix rather than the full address when that matters.
//!
//! # Ordering
//!
//! Each layer is one gate with one policy; stack layers for several gates. In axum, the
//! layer added *last* runs *first* (`.layer(a).layer(b)` runs `b`, then `a`); in a
//! `tower::ServiceBuilder`, the layer added *first* runs first, and in a tuple of layers
//! (`.route_layer((a, b))`) the *first* element runs first. Put the cheap,
//! hard-bounded per-client memory gate outermost, so it protects body parsing and database
//! capacity, and the shared per-identity gate inside it. An outer gate that denies stops the
//! request before any inner gate is checked or consumes anything.
//!
//! # Which requests a gate sees
//!
//! Put a per-route gate on the **method router**: `.route("/login",
//! post(login).route_layer(gate))`. Then only a request the route serves reaches the gate:
//! unmatched paths (404), unmatched methods (405) and CORS preflights (`OPTIONS`) consume no
//! quota. Two tempting alternatives do consume it:
//!
//! - `Router::new().route("/login", post(login)).route_layer(gate)` wraps the whole method
//!   router, including the 405 it answers for other methods: with a limit of 2, two `GET
//!   /login` (or `OPTIONS` requests, when no CORS layer answers them) exhaust the login quota
//!   and the real `POST`s then get 429.
//! - `Router::layer(gate)` also gates the router's fallback, so 404s consume quota too.
//!
//! For a browser-facing route, add `tower_http::cors::CorsLayer` **outside** the gates, with
//! `Router::layer` after the routes: it answers preflights itself, before any gate, and it adds
//! the CORS headers to every response coming back through it, a gate's 429 included. Expose the
//! rate-limit fields, which are not CORS-safelisted response headers, so that the page can
//! read them, and allow the request headers the route needs (`content-type` for JSON):
//!
//! ```
//! use axum::{Router, routing::post};
//! use http::{HeaderName, Method, header};
//! use tower_http::cors::CorsLayer;
//!
//! fn browser_facing<L: tower_layer::Layer<axum::routing::Route> + Clone + Send + Sync + 'static>(gate: L) -> Router
//! where
//!     L::Service: tower_service::Service<axum::extract::Request, Response = axum::response::Response, Error = std::convert::Infallible>
//!         + Clone + Send + Sync + 'static,
//!     <L::Service as tower_service::Service<axum::extract::Request>>::Future: Send + 'static,
//! {
//!     let cors = CorsLayer::new()
//!         .allow_origin(http::HeaderValue::from_static("https://app.example"))
//!         .allow_methods([Method::POST])
//!         .allow_headers([header::CONTENT_TYPE])
//!         .expose_headers([
//!             header::RETRY_AFTER,
//!             HeaderName::from_static("ratelimit"),
//!             HeaderName::from_static("ratelimit-policy"),
//!         ]);
//!     Router::new().route("/login", post(login).route_layer(gate)).layer(cors)
//! }
//!
//! async fn login() -> &'static str {
//!     "welcome"
//! }
//! # let _ = browser_facing::<tower_layer::Identity>;
//! ```
//!
//! # Tower contracts
//!
//! The layer works in any Tower stack, not only Axum. Every clone of the service (servers
//! make one per connection) shares the layer's limiter, policy, extractor and mapper through
//! one `Arc`, so quota is counted once across connections. `poll_ready` only forwards the
//! inner service's readiness: quota is checked in the response future, after the inner
//! service is ready, and never awaited as back-pressure. Dropping a response future (a client
//! that disconnects, a timeout layer) never leaves the limiter inconsistent: while the check
//! runs, dropping it cancels the check as the backend documents (a memory check is atomic; a
//! PostgreSQL check dropped before its commit rolls back, and one dropped during the commit
//! may have consumed quota, as its cancel-safety section says); once the check has admitted
//! the request, the admission stands, whether or not the inner service finished.
//!
//! # gRPC (tonic)
//!
//! The layer wraps a tonic service as it wraps an Axum route; the mapper's response type is
//! then `http::Response<tonic::body::Body>`, which `tonic::Status::into_http` builds.
//!
//! Gate one service, not the server: with the `tonic` feature, `RateLimit` keeps the wrapped
//! service's gRPC name, so `Server::builder().add_service(ServiceBuilder::new().layer(gate)
//! .service(ItemsServer::new(items)))` gates the `Items` calls only. `Server::builder()
//! .layer(gate)` instead gates every call the server receives, including health checks and
//! calls to methods that do not exist (answered `UNIMPLEMENTED`, after consuming quota): the
//! gRPC counterpart of a 404 behind a router-wide gate.
//!
//! gRPC has its own conventions, and the mapping stays the application's:
//!
//! - key from request metadata (HTTP/2 headers, in `Parts::headers`), never from the
//!   message: the layer runs before tonic decodes it;
//! - a quota denial as `RESOURCE_EXHAUSTED` (code 8) with a `google.rpc.RetryInfo` detail
//!   whose `retry_delay` is the denial's `retry_after` (`tonic_types::ErrorDetails::with_retry_info`),
//!   and the draft-11 fields as response metadata. An HTTP 429 reaches gRPC clients as
//!   `UNAVAILABLE`, a transient failure that a client with a retry policy retries on its own
//!   backoff, without the server's delay;
//! - storage-capacity denials and backend errors as `UNAVAILABLE` (failing closed), a missing
//!   key as `UNAUTHENTICATED`.
//!
//! ```
//! use runlimit_axum::RateLimitRejection;
//! use runlimit_core::{Denial, FixedWindowPolicy};
//! use tonic::{Code, Status};
//! use tonic_types::{ErrorDetails, StatusExt};
//!
//! fn reject<C>(rejection: RateLimitRejection<FixedWindowPolicy, &'static str, C>) -> http::Response<tonic::body::Body> {
//!     let status = match rejection {
//!         RateLimitRejection::Denied { denial: Denial::QuotaExceeded(quota), .. } => Status::with_error_details(
//!             Code::ResourceExhausted,
//!             "quota exhausted",
//!             ErrorDetails::with_retry_info(Some(quota.retry_after().duration())),
//!         ),
//!         RateLimitRejection::Denied { denial: Denial::StorageCapacity { retry_after }, .. } => {
//!             Status::with_error_details(
//!                 Code::Unavailable,
//!                 "rate-limit storage is full",
//!                 ErrorDetails::with_retry_info(retry_after.map(|delay| delay.duration())),
//!             )
//!         }
//!         RateLimitRejection::Backend { .. } => Status::unavailable("rate limiting unavailable"),
//!         RateLimitRejection::Extraction { error, .. } => Status::unauthenticated(error),
//!         RateLimitRejection::InvalidCost { error, .. } => Status::invalid_argument(error.to_string()),
//!     };
//!     status.into_http()
//! }
//! # let _ = reject::<std::io::Error>;
//! ```
//!
//! # Passing admissions to handlers
//!
//! Every layer that admits a request (allowed or shadow-denied) appends an [`Admission`] —
//! its policy and the [`Admitted`](runlimit_core::Admitted) outcome — to the request's
//! [`Admissions`] extension, in the order the layers ran. A handler reads it with
//! `Extension<Admissions>` and looks up a gate with
//! [`admissions.get(&policy)`](Admissions::get), for example to emit `RateLimit` fields:
//!
//! ```
//! use axum::{http::HeaderMap, Extension};
//! use runlimit_axum::Admissions;
//! use runlimit_http::draft_11::{PolicyName, RateLimitFields};
//!
//! async fn handler(Extension(admissions): Extension<Admissions>) -> (HeaderMap, &'static str) {
//!     let mut fields = RateLimitFields::new();
//!     for admission in &admissions {
//!         let name = PolicyName::from(admission.policy().id());
//!         // A policy whose window is not whole seconds is simply not disclosed.
//!         let _ = fields.push(name, admission.policy(), admission.decision());
//!     }
//!     let mut headers = HeaderMap::new();
//!     fields.insert_into(&mut headers);
//!     (headers, "ok")
//! }
//! # let _ = handler;
//! ```
//!
//! A rejected request never reaches the handler; its mapper receives the policy in every
//! [`RateLimitRejection`] variant instead.
//!
//! # What the adapter never does
//!
//! It does not read `Forwarded`, `X-Forwarded-For`, cookies or identities, nor `ConnectInfo`
//! unless the application picks [`PeerAddressKey`]; only the application's extractor sees the
//! request head. It does not choose a status,
//! body or header for any rejection unless the application picks [`ProblemRejections`] as its
//! mapper, adds no header to an admitted response unless the application adds
//! [`AdmissionFieldsLayer`], does not wait for quota in `poll_ready` (a denial is a
//! response, not back-pressure), and never reads the request body before admission.
//!
//! # Cost
//!
//! Per admitted request, the gate allocates twice: the limiter's future (an unnameable
//! `impl Future` that borrows the layer's policy, so it is boxed with the layer state it
//! borrows) and the request extension holding [`Admissions`] (one box; up to two admissions
//! are kept inline). A request that had no extension yet also gets the extension map itself
//! (two more: its box and its table); under axum's router it already has one. The record adds a
//! third allocation when the map's table must grow: with axum's default features
//! (`matched-path`, `original-uri`) a routed request already carries three extensions, so the
//! gate allocates three times there. Rejections by the extractor, and of an impossible cost,
//! allocate nothing before the mapper runs. [`AdmissionFieldsLayer`] adds three: the gate's
//! name and the two field values. The crate's `tests/allocations.rs` counts these exactly.
//!
//! In axum, each `route_layer` call costs allocations of axum's own per request (boxed
//! services and futures: in the crate's bench router, two calls take six more per request than
//! one): give a gate and its fields layer to one call as a tuple,
//! `route_layer((gate, AdmissionFieldsLayer::new()))`, as the ten-line gate above does.
//!
//! # Feature flags
//!
//! | Feature | Default | What it enables |
//! |---|---|---|
//! | `axum` | no | [`PeerAddressKey`], the ready-made extractor keyed by the peer address axum's `ConnectInfo<SocketAddr>` gives (see [The peer address](#the-peer-address-connectinfo)). |
//! | `tonic` | no | [`RateLimit`] implements `tonic::server::NamedService` for a named inner service, so one gRPC service can be gated on its own (see [gRPC](#grpc-tonic)). |
//!
//! Without features the crate depends on `tower-layer`, `tower-service`, `http`,
//! `runlimit-http` and `serde_json` (for the ready-made responses), not on `axum` or `tonic`
//! itself; `axum` adds axum with only its `tokio` feature, the one that defines `ConnectInfo`.
//!
// Without the `axum` feature the peer-address items do not exist: their names link to the
// feature table instead, so a plain `cargo doc` renders every link.
#![cfg_attr(feature = "axum", doc = "[`PeerAddressKey`]: crate::PeerAddressKey")]
#![cfg_attr(feature = "axum", doc = "[`MissingPeerAddress`]: crate::MissingPeerAddress")]
#![cfg_attr(not(feature = "axum"), doc = "[`PeerAddressKey`]: #feature-flags")]
#![cfg_attr(not(feature = "axum"), doc = "[`MissingPeerAddress`]: #feature-flags")]
#![cfg_attr(docsrs, feature(doc_cfg))]
#![doc(test(attr(deny(warnings))))]
#![cfg_attr(not(test), warn(clippy::unwrap_used, clippy::expect_used, clippy::panic))]

mod admission;
mod extract;
mod future;
mod layer;
#[cfg(feature = "axum")]
mod peer;
mod rejection;
mod respond;
mod service;

pub use crate::admission::{Admission, Admissions};
pub use crate::extract::{ExtractSubjectKey, HeaderKey, MissingHeader};
pub use crate::future::ResponseFuture;
pub use crate::layer::RateLimitLayer;
#[cfg(feature = "axum")]
#[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
pub use crate::peer::{DEFAULT_IPV6_PREFIX_LEN, InvalidIpv6PrefixLen, MissingPeerAddress, PeerAddressKey};
pub use crate::rejection::{MapRejection, RateLimitRejection};
pub use crate::respond::{
    AdmissionFields, AdmissionFieldsFuture, AdmissionFieldsLayer, NamePolicy, PROBLEM_JSON,
    ProblemRejections, QUOTA_EXCEEDED, TEMPORARY_REDUCED_CAPACITY, policy_id_name,
};
pub use crate::service::RateLimit;

/// This crate's README (what crates.io shows), compiled and run as doctests so it stays true.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct CrateReadmeDoctests;
