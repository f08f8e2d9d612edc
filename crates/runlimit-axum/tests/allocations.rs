//! Heap allocations per admitted request, counted by dhat's global allocator: what the gate
//! (`RateLimitLayer`) and the fields layer (`AdmissionFieldsLayer`) add to a handler's own.
//!
//! Its own test binary (one global allocator, one profiler at a time) and one test, so the count
//! is never shared with another test's thread. The services are plain Tower stacks over a
//! `service_fn` handler (no router, no server), each request built before counting starts;
//! the counts are exact, so a change that adds an allocation to either layer's path fails here.

use std::{convert::Infallible, sync::Arc, time::Duration};

use http::{
    HeaderValue, Request, Response,
    header::{CONTENT_TYPE, HeaderName},
};
use runlimit_axum::{AdmissionFieldsLayer, HeaderKey, ProblemRejections, RateLimitLayer};
use runlimit_core::{GcraPolicy, KeyHasher, PolicyId, ScopeId};
use runlimit_memory::{GcraStore, MemoryStoreConfig};
use tower::{Layer, Service, ServiceExt as _, service_fn};

#[global_allocator]
static ALLOCATOR: dhat::Alloc = dhat::Alloc;

/// Requests per measurement; every count below is per request, exactly.
const REQUESTS: u64 = 64;

/// The handler: an empty body (no allocation) and one header, as a framework's would have (`content-type`), so
/// the map the fields are inserted into exists, with room for them.
async fn handler(_request: Request<()>) -> Result<Response<String>, Infallible> {
    let mut response = Response::new(String::new());
    response.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("text/plain"));
    Ok(response)
}

fn request() -> Request<()> {
    Request::get("/items").header("x-api-key", "client-1").body(()).unwrap()
}

/// Extensions a router puts on a request before the gate: axum without its default features
/// adds one (the path parameters); with them (`matched-path`, `original-uri`), three.
#[derive(Clone)]
struct PathParameters;
#[derive(Clone)]
struct MatchedPath;
#[derive(Clone)]
struct OriginalUri;

fn routed_request() -> Request<()> {
    let mut request = request();
    request.extensions_mut().insert(PathParameters);
    request
}

fn request_with_three_extensions() -> Request<()> {
    let mut request = routed_request();
    request.extensions_mut().insert(MatchedPath);
    request.extensions_mut().insert(OriginalUri);
    request
}

/// Heap blocks allocated per request by `service` (each request built beforehand), after one
/// warm-up request; also checks every response carried `fields` (`RateLimit` present or not).
fn allocations_per_request<S>(
    runtime: &tokio::runtime::Runtime,
    mut service: S,
    request: fn() -> Request<()>,
    fields: bool,
) -> u64
where
    S: Service<Request<()>, Response = Response<String>, Error = Infallible>,
{
    let mut run = |requests: Vec<Request<()>>| {
        for request in requests {
            let response = runtime.block_on(async { service.ready().await?.call(request).await }).unwrap();
            assert_eq!(response.headers().contains_key("ratelimit"), fields);
        }
    };
    run(vec![request()]);
    let requests = (0..REQUESTS).map(|_| request()).collect();
    let before = dhat::HeapStats::get().total_blocks;
    run(requests);
    let blocks = dhat::HeapStats::get().total_blocks - before;
    assert_eq!(blocks % REQUESTS, 0, "{blocks} blocks over {REQUESTS} requests");
    blocks / REQUESTS
}

#[test]
fn a_gate_adds_two_allocations_to_a_routed_request_four_to_a_fresh_one_and_its_fields_three() {
    let _profiler = dhat::Profiler::builder().testing().build();
    let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
    let store = Arc::new(GcraStore::new(MemoryStoreConfig::new(1_000).unwrap()));
    // 1,000 an hour with a burst of 1,000: each request moves the key's arrival time 3.6 s
    // ahead, so the key never rests (and its entry is never reclaimed, which allocates) while
    // the test runs, however the machine stalls it; the 260 requests on one key all fit the
    // burst.
    let policy = GcraPolicy::new(
        PolicyId::new("items").unwrap(),
        ScopeId::new("api-key").unwrap(),
        1_000,
        Duration::from_secs(3_600),
        1_000,
    )
    .unwrap();
    let api_key = HeaderKey::new(HeaderName::from_static("x-api-key"), KeyHasher::new(&[7; 32]).unwrap());
    let gate = RateLimitLayer::new(store, policy, api_key, ProblemRejections::new());

    let fresh = request;
    let alone = allocations_per_request(&runtime, service_fn(handler), fresh, false);
    let gated = allocations_per_request(&runtime, gate.layer(service_fn(handler)), fresh, false);
    let with_fields = allocations_per_request(
        &runtime,
        (gate.clone(), AdmissionFieldsLayer::new()).layer(service_fn(handler)),
        fresh,
        true,
    );
    let routed_alone = allocations_per_request(&runtime, service_fn(handler), routed_request, false);
    let routed_gated =
        allocations_per_request(&runtime, gate.layer(service_fn(handler)), routed_request, false);
    let three_alone =
        allocations_per_request(&runtime, service_fn(handler), request_with_three_extensions, false);
    let three_gated = allocations_per_request(
        &runtime,
        gate.layer(service_fn(handler)),
        request_with_three_extensions,
        false,
    );
    // The handler's own: its response's header map.
    assert_eq!(alone, 2);
    // The gate: the boxed check future, and the request's extensions (a fresh request has
    // none: the map's box and its table) holding the `Admissions` record (one box, the record
    // inline).
    assert_eq!(gated - alone, 4);
    // Under a router that already put an extension on the request: the future and the record.
    assert_eq!(routed_gated - routed_alone, 2);
    // With three extensions already there (axum's default features), the record is the fourth
    // and the map's table grows (hashbrown's first table holds three entries): three.
    assert_eq!(three_gated - three_alone, 3);
    // The fields layer: the policy's name (`policy_id_name` copies the identifier: a private
    // allocation rather than a reference count every worker thread would share) and the two
    // field values, nothing else (the items are kept inline).
    assert_eq!(with_fields - gated, 3);
}
