//! The gate's own cost per request, in process (no network, no load client): an axum `Router`
//! called with `oneshot` on a current-thread Tokio runtime, for five routes answering the same
//! 5-byte body.
//!
//! ```text
//! cargo bench -p runlimit-axum --bench gate_in_process
//! ```
//!
//! The routes are those of `benches/common/mod.rs`:
//!
//! - `fields`: the handler writes the two draft-11 fields a gated response carries, as static
//!   values (the response bytes of a gated request, no gate);
//! - `gate`: the handler behind the GCRA gate keyed by `x-api-key` (one HMAC-SHA-256 per
//!   request), every request admitted;
//! - `ungated`: the handler alone;
//! - `gate_and_fields` (`/gated`): the same gate with `AdmissionFieldsLayer`, which serializes
//!   the fields from the admission, in one `route_layer`: the crate's ten-line gate;
//! - `two_layers`: the same layers added with two `route_layer` calls.
//!
//! It first prints the size of the futures the gate and the fields layer add to a `/gated`
//! request.
//!
//! Each iteration builds the request (`GET` with one header), calls the router and drops the
//! response, as in the `gate` bench's server. criterion reports each; the differences are the
//! gate's and the fields layer's costs, which the wrk bench (`--bench gate`) measures together
//! with hyper, the kernel and the load client.

use std::hint::black_box;

use axum::body::Body;
use criterion::{Criterion, criterion_group, criterion_main};
use http::Request;
use tower::ServiceExt as _;

mod common;

/// Prints the size of the futures the layers add to each request of `/gated`: the gate's over
/// the fields layer's, which holds the route's.
fn future_sizes() {
    use std::{convert::Infallible, mem::size_of};
    type Fields = runlimit_axum::AdmissionFieldsFuture<axum::routing::future::RouteFuture<Infallible>>;
    type Gate = runlimit_axum::ResponseFuture<runlimit_axum::AdmissionFields<axum::routing::Route>, Body>;
    println!(
        "per request of /gated: the gate's future {} bytes (it holds the fields layer's service and the \
         request while the check runs, then the fields layer's future), the fields layer's {} bytes \
         (axum's route future {} bytes and the two field values)",
        size_of::<Gate>(),
        size_of::<Fields>(),
        size_of::<axum::routing::future::RouteFuture<Infallible>>(),
    );
}

fn per_request(c: &mut Criterion) {
    future_sizes();
    let runtime = tokio::runtime::Builder::new_current_thread().build().expect("a Tokio runtime");
    let app = common::router().expect("the bench router");
    let mut group = c.benchmark_group("per_request");
    for (route, path) in [
        ("ungated", "/ungated"),
        ("fields", "/fields"),
        ("gate", "/gate"),
        ("gate_and_fields", "/gated"),
        ("two_layers", "/two_layers"),
    ] {
        group.bench_function(route, |b| {
            b.iter(|| {
                let request = Request::get(path)
                    .header(common::API_KEY.0, common::API_KEY.1)
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
