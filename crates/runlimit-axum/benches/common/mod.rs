//! The router both gate benches measure (`gate` over HTTP with wrk, `gate_in_process` with
//! `oneshot`), every route answering the same 5-byte body:
//!
//! - `/ungated`: the handler alone;
//! - `/fields`: the handler writes the two draft-11 fields a gated response carries while the
//!   benches run (`r` counts down with as many digits), as static values: a gated response's
//!   bytes without a gate;
//! - `/gate`: the handler behind a `RateLimitLayer` over a `runlimit_memory::GcraStore` (10,000
//!   keys), keyed by the `x-api-key` header with `HeaderKey` (one HMAC-SHA-256 per request),
//!   mapped by `ProblemRejections`;
//! - `/gated`: the same gate with `AdmissionFieldsLayer`, both in one `route_layer`: the crate's
//!   ten-line gate;
//! - `/two_layers`: the same two layers added by two `route_layer` calls (fields first, then
//!   the gate), which costs axum six more allocations per request (boxed services and
//!   futures).
//!
//! The policy admits everything (1,000,000,000 per hour, a burst as large), so every response
//! is `200`.

use std::{sync::Arc, time::Duration};

use axum::{Router, routing::get};
use http::header::HeaderName;
use runlimit_axum::{AdmissionFieldsLayer, HeaderKey, ProblemRejections, RateLimitLayer};
use runlimit_core::{GcraPolicy, KeyHasher, PolicyId, ScopeId};
use runlimit_memory::{GcraStore, MemoryStoreConfig};

/// The header the gate keys by, and the value the in-process bench sends (wrk sends the same).
pub(crate) const API_KEY: (&str, &str) = ("x-api-key", "bench-client");

pub(crate) fn router() -> Result<Router, Box<dyn std::error::Error>> {
    let store = Arc::new(GcraStore::new(MemoryStoreConfig::new(10_000)?));
    let policy = GcraPolicy::new(
        PolicyId::new("items")?,
        ScopeId::new("api-key")?,
        1_000_000_000,
        Duration::from_secs(3_600),
        1_000_000_000,
    )?;
    let api_key = HeaderKey::new(HeaderName::from_static(API_KEY.0), KeyHasher::new(&[7; 32])?);
    let gate = RateLimitLayer::new(store, policy, api_key, ProblemRejections::new());
    let fields =
        [("ratelimit-policy", r#""items";q=1000000000;w=3600"#), ("ratelimit", r#""items";r=999999999;t=1"#)];
    Ok(Router::new()
        .route("/ungated", get(|| async { "items" }))
        .route("/fields", get(move || async move { (fields, "items") }))
        .route("/gate", get(|| async { "items" }).route_layer(gate.clone()))
        .route("/gated", get(|| async { "items" }).route_layer((gate.clone(), AdmissionFieldsLayer::new())))
        .route(
            "/two_layers",
            get(|| async { "items" }).route_layer(AdmissionFieldsLayer::new()).route_layer(gate),
        ))
}
