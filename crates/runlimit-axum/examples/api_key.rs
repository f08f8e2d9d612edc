//! A route limited per API key, with the ready-made responses: `cargo run -p runlimit-axum
//! --example api_key`.
//!
//! Serves `GET /items` on a free loopback port, limited to 3 requests per key per minute, then
//! calls it four times with the same `x-api-key` and once without, printing each response's
//! status, rate-limit fields and body: three 200s whose `RateLimit` counts down, a 429 with
//! `Retry-After` and a `quota-exceeded` problem body, and a 400 problem.

use std::{sync::Arc, time::Duration};

use axum::{Router, routing::get};
use http::{Request, header::HeaderName};
use http_body_util::{BodyExt as _, Empty};
use hyper_util::{client::legacy::Client, rt::TokioExecutor};
use runlimit_axum::{AdmissionFieldsLayer, HeaderKey, ProblemRejections, RateLimitLayer};
use runlimit_core::{FixedWindowPolicy, KeyHasher, PolicyId, ScopeId};
use runlimit_memory::{MemoryStore, MemoryStoreConfig};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // The gate: a hard-bounded process-local store, 3 requests per API key per 60 s.
    let store = Arc::new(MemoryStore::new(MemoryStoreConfig::new(10_000)?));
    let policy =
        FixedWindowPolicy::new(PolicyId::new("api")?, ScopeId::new("api-key")?, 3, Duration::from_secs(60))?;
    // In production the secret comes from a secret store and is the same on every replica.
    let hasher = KeyHasher::new(b"example secret: 32 bytes or more, never this one")?;
    // Keyed by the x-api-key header (hashed; a missing or empty header is refused with 400).
    let api_key = HeaderKey::new(HeaderName::from_static("x-api-key"), hasher);
    let gate = RateLimitLayer::new(store, policy, api_key, ProblemRejections::new());
    // One route layer: the gate first (outermost), then the fields of its admission.
    let app = Router::new()
        .route("/items", get(|| async { "items\n" }).route_layer((gate, AdmissionFieldsLayer::new())));

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}/items", listener.local_addr()?);
    tokio::spawn(async move { axum::serve(listener, app).await });
    println!("serving GET {url}, 3 requests per x-api-key per minute\n");

    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<bytes::Bytes>>();
    for api_key in [Some("key-1"), Some("key-1"), Some("key-1"), Some("key-1"), None] {
        let mut request = Request::get(&url);
        if let Some(api_key) = api_key {
            request = request.header("x-api-key", api_key);
        }
        let response = client.request(request.body(Empty::new())?).await?;
        println!("GET /items x-api-key: {}", api_key.unwrap_or("(none)"));
        println!("  {}", response.status());
        for name in ["retry-after", "ratelimit-policy", "ratelimit", "content-type"] {
            if let Some(value) = response.headers().get(name) {
                println!("  {name}: {}", value.to_str()?);
            }
        }
        let body = response.into_body().collect().await?.to_bytes();
        println!("  {}\n", String::from_utf8_lossy(&body).trim_end());
    }
    Ok(())
}
