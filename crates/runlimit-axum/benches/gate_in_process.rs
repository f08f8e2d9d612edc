//! The gate's own cost per request, in process (no network, no load client): an axum `Router`
//! called with `oneshot` on a current-thread Tokio runtime, for three routes answering the same
//! 5-byte body.
//!
//! ```text
//! cargo bench -p runlimit-axum --bench gate_in_process
//! ```
//!
//! - `fields`: the handler writes the two draft-11 fields a gated response carries, as static
//!   values (the response bytes of a gated request, no gate);
//! - `gate`: the handler behind a `RateLimitLayer` over a `runlimit_memory::GcraStore`, keyed by
//!   the `x-api-key` header with `HeaderKey` (one HMAC-SHA-256 per request), every request
//!   admitted;
//! - `gate_and_fields`: the same gate with `AdmissionFieldsLayer`, which serializes the fields
//!   from the admission: the crate's ten-line gate.
//!
//! Each iteration builds the request (`GET` with one header), calls the router and drops the
//! response, as in the `gate` bench's server. criterion reports each; the differences are the
//! gate's and the fields layer's costs, which the wrk bench (`--bench gate`) measures together
//! with hyper, the kernel and the load client.

use std::{hint::black_box, sync::Arc, time::Duration};

use axum::{Router, body::Body, routing::get};
use criterion::{Criterion, criterion_group, criterion_main};
use http::{Request, header::HeaderName};
use runlimit_axum::{AdmissionFieldsLayer, HeaderKey, ProblemRejections, RateLimitLayer};
use runlimit_core::{GcraPolicy, KeyHasher, PolicyId, ScopeId};
use runlimit_memory::{GcraStore, MemoryStoreConfig};
use tower::ServiceExt as _;

fn router() -> Router {
    let store = Arc::new(GcraStore::new(MemoryStoreConfig::new(10_000).expect("a valid store size")));
    let policy = GcraPolicy::new(
        PolicyId::new("items").expect("a valid id"),
        ScopeId::new("api-key").expect("a valid scope"),
        1_000_000_000,
        Duration::from_secs(3_600),
        1_000_000_000,
    )
    .expect("a valid policy");
    let hasher = KeyHasher::new(&[7; 32]).expect("a 32-byte secret");
    let gate = RateLimitLayer::new(
        store,
        policy,
        HeaderKey::new(HeaderName::from_static("x-api-key"), hasher),
        ProblemRejections::new(),
    );
    let fields =
        [("ratelimit-policy", r#""items";q=1000000000;w=3600"#), ("ratelimit", r#""items";r=999999999;t=1"#)];
    Router::new()
        .route("/fields", get(move || async move { (fields, "items") }))
        .route("/gate", get(|| async { "items" }).route_layer(gate.clone()))
        .route(
            "/gate_and_fields",
            get(|| async { "items" }).route_layer(AdmissionFieldsLayer::new()).route_layer(gate),
        )
}

fn per_request(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread().build().expect("a Tokio runtime");
    let app = router();
    let mut group = c.benchmark_group("per_request");
    for route in ["fields", "gate", "gate_and_fields"] {
        let path = format!("/{route}");
        group.bench_function(route, |b| {
            b.iter(|| {
                let request = Request::get(path.as_str())
                    .header("x-api-key", "bench-client")
                    .body(Body::empty())
                    .expect("a valid request");
                let response = runtime.block_on(app.clone().oneshot(request)).expect("infallible");
                assert_eq!(response.status(), 200);
                black_box(response)
            });
        });
    }
    group.finish();
}

criterion_group!(benches, per_request);
criterion_main!(benches);
