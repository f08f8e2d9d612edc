//! The ready-made responses over real HTTP: a complete rate-limited route in about ten lines
//! (store, policy, key extractor, `ProblemRejections`, `AdmissionFieldsLayer`), and every
//! rejection the mapper answers.

use std::{net::SocketAddr, sync::Arc, time::Duration};

use axum::{Router, routing::get};
use http::header::HeaderName;
use http::{Request, Response, StatusCode, request::Parts};
use http_body_util::{BodyExt as _, Full};
use hyper::body::Incoming;
use runlimit_axum::{
    AdmissionFieldsLayer, ExtractSubjectKey, HeaderKey, MissingHeader, ProblemRejections, RateLimitLayer,
};
use runlimit_core::{FixedWindowPolicy, GcraPolicy, KeyHasher, PolicyId, ScopeId, SubjectKey};
use runlimit_memory::{GcraStore, MemoryStore, MemoryStoreConfig};
use tokio::net::TcpListener;

use crate::{
    real_http::{client, header_names},
    support::{Mode, TestLimiter},
};

/// Serves `app` on 127.0.0.1:0 until the test ends.
async fn serve(app: Router) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    address
}

/// `GET url` with an optional `x-api-key`; the response head and its body as text.
async fn get_text(url: &str, api_key: Option<&str>) -> (Response<()>, String) {
    let mut request = Request::get(url);
    if let Some(api_key) = api_key {
        request = request.header("x-api-key", api_key);
    }
    let response: Response<Incoming> =
        client().request(request.body(Full::default()).unwrap()).await.unwrap();
    let (parts, body) = response.into_parts();
    let bytes = body.collect().await.unwrap().to_bytes();
    (Response::from_parts(parts, ()), String::from_utf8(bytes.to_vec()).unwrap())
}

#[tokio::test]
async fn a_complete_route_in_ten_lines_answers_200_with_fields_then_a_standard_429()
-> Result<(), Box<dyn std::error::Error>> {
    // ---- the application's code: ten lines -------------------------------------------------
    let store = Arc::new(MemoryStore::new(MemoryStoreConfig::new(10_000)?));
    let policy =
        FixedWindowPolicy::new(PolicyId::new("api")?, ScopeId::new("api-key")?, 2, Duration::from_secs(60))?;
    // Keyed by the x-api-key header (hashed; a missing or empty header is refused with 400).
    let hasher = KeyHasher::new(b"replace with 32+ bytes from your secret store")?;
    let api_key = HeaderKey::new(HeaderName::from_static("x-api-key"), hasher);
    let gate = RateLimitLayer::new(store, policy, api_key, ProblemRejections::new());
    // One route layer: the gate first (outermost), then the fields of its admission.
    let app = Router::new()
        .route("/items", get(|| async { "items" }).route_layer((gate, AdmissionFieldsLayer::new())));
    // -----------------------------------------------------------------------------------------
    let url = format!("http://{}/items", serve(app).await);

    // Anchored 60 s window: the remaining time, rounded up, is 60 s within its first second.
    let (first, body) = get_text(&url, Some("key-1")).await;
    assert_eq!(first.status(), StatusCode::OK);
    assert_eq!(body, "items");
    assert_eq!(first.headers()["ratelimit-policy"], r#""api";q=2;w=60"#);
    assert_eq!(first.headers()["ratelimit"], r#""api";r=1;t=60"#);

    let (second, _) = get_text(&url, Some("key-1")).await;
    assert_eq!(second.status(), StatusCode::OK);
    assert_eq!(second.headers()["ratelimit"], r#""api";r=0;t=60"#);

    let (denied, body) = get_text(&url, Some("key-1")).await;
    assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(denied.headers()["retry-after"], "60");
    assert_eq!(denied.headers()["ratelimit-policy"], r#""api";q=2;w=60"#);
    assert_eq!(denied.headers()["ratelimit"], r#""api";r=0;t=60"#);
    assert_eq!(denied.headers()["content-type"], "application/problem+json");
    assert_eq!(
        header_names(&denied),
        ["content-length", "content-type", "date", "ratelimit", "ratelimit-policy", "retry-after"]
    );
    assert_eq!(
        body,
        r#"{"type":"https://iana.org/assignments/http-problem-types#quota-exceeded","title":"Request cannot be satisfied as assigned quota has been exceeded","status":429,"detail":"quota of policy \"api\" is exhausted; retry after 60 seconds","violated-policies":["api"]}"#
    );

    // Another key has its own quota.
    let (other, _) = get_text(&url, Some("key-2")).await;
    assert_eq!(other.status(), StatusCode::OK);
    assert_eq!(other.headers()["ratelimit"], r#""api";r=1;t=60"#);

    // No key: 400 from the extractor, nothing consumed, and no extractor text in the body.
    let (missing, body) = get_text(&url, None).await;
    assert_eq!(missing.status(), StatusCode::BAD_REQUEST);
    assert_eq!(header_names(&missing), ["content-length", "content-type", "date"]);
    assert_eq!(
        body,
        r#"{"type":"about:blank","title":"Bad Request","status":400,"detail":"the request does not name the subject that policy \"api\" counts"}"#
    );
    // An empty key is no key: refused alike, never one bucket shared by every such request.
    for _ in 0..3 {
        let (empty, body) = get_text(&url, Some("")).await;
        assert_eq!(empty.status(), StatusCode::BAD_REQUEST);
        assert_eq!(
            body,
            r#"{"type":"about:blank","title":"Bad Request","status":400,"detail":"the request does not name the subject that policy \"api\" counts"}"#
        );
    }
    Ok(())
}

fn policy(limit: u64) -> FixedWindowPolicy {
    FixedWindowPolicy::new(
        PolicyId::new("api").unwrap(),
        ScopeId::new("client").unwrap(),
        limit,
        Duration::from_secs(60),
    )
    .unwrap()
}

fn everyone(_: &Parts, policy: &FixedWindowPolicy) -> Result<SubjectKey, &'static str> {
    let hasher = KeyHasher::new(&[7; 32]).unwrap();
    Ok(hasher.hash_for(policy, b"everyone").into_unbound_subject_key())
}

#[tokio::test]
async fn storage_capacity_and_backend_failures_are_503_problems() {
    let limiter = TestLimiter::new();
    let app =
        Router::new().route(
            "/items",
            get(|| async { "items" }).route_layer(AdmissionFieldsLayer::new()).route_layer(
                RateLimitLayer::new(Arc::clone(&limiter), policy(5), everyone, ProblemRejections::new()),
            ),
        );
    let url = format!("http://{}/items", serve(app).await);

    limiter.set_mode(Mode::Full);
    let (full, body) = get_text(&url, None).await;
    assert_eq!(full.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(full.headers()["retry-after"], "7");
    assert_eq!(header_names(&full), ["content-length", "content-type", "date", "retry-after"]);
    assert_eq!(
        body,
        r#"{"type":"https://iana.org/assignments/http-problem-types#temporary-reduced-capacity","title":"Request cannot be satisfied due to temporary server capacity constraints","status":503,"detail":"rate-limit storage of policy \"api\" is full; retry later","violated-policies":["api"]}"#
    );

    limiter.set_mode(Mode::Fail);
    let (down, body) = get_text(&url, None).await;
    assert_eq!(down.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(header_names(&down), ["content-length", "content-type", "date"]);
    assert_eq!(
        body,
        r#"{"type":"about:blank","title":"Service Unavailable","status":503,"detail":"the rate-limit backend of policy \"api\" is unavailable; the request was not admitted"}"#
    );
}

/// Everyone, charged the `x-api-key` header's number of units (a stand-in for a cost header).
struct WeightedEveryone;

impl ExtractSubjectKey<FixedWindowPolicy> for WeightedEveryone {
    type Error = &'static str;

    fn extract_subject_key(
        &self,
        parts: &Parts,
        policy: &FixedWindowPolicy,
    ) -> Result<SubjectKey, &'static str> {
        everyone(parts, policy)
    }

    fn extract_cost(&self, parts: &Parts, _: &FixedWindowPolicy) -> Result<u64, &'static str> {
        let header = parts.headers.get("x-api-key").ok_or("no cost")?;
        header.to_str().ok().and_then(|text| text.parse().ok()).ok_or("no cost")
    }
}

#[tokio::test]
async fn an_impossible_cost_is_a_400_problem() {
    let store = Arc::new(MemoryStore::new(MemoryStoreConfig::new(100).unwrap()));
    let app = Router::new().route(
        "/items",
        get(|| async { "items" }).route_layer(RateLimitLayer::new(
            store,
            policy(5),
            WeightedEveryone,
            ProblemRejections::new(),
        )),
    );
    let url = format!("http://{}/items", serve(app).await);
    let (response, body) = get_text(&url, Some("9")).await;
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    assert_eq!(
        body,
        r#"{"type":"about:blank","title":"Bad Request","status":400,"detail":"policy \"api\": a cost of 9 units exceeds the policy's capacity of 5"}"#
    );
}

#[tokio::test]
async fn admitted_fields_list_every_gate_outermost_first_and_respect_the_handler() {
    let store = Arc::new(MemoryStore::new(MemoryStoreConfig::new(100).unwrap()));
    let gcra = Arc::new(GcraStore::new(MemoryStoreConfig::new(100).unwrap()));
    // GCRA: 10 per 10 s (one unit per second), burst 4.
    let items = GcraPolicy::new(
        PolicyId::new("items").unwrap(),
        ScopeId::new("client").unwrap(),
        10,
        Duration::from_secs(10),
        4,
    )
    .unwrap();
    let gcra_key = |_: &Parts, policy: &GcraPolicy| -> Result<SubjectKey, &'static str> {
        Ok(KeyHasher::new(&[7; 32]).unwrap().hash_for(policy, b"everyone").into_unbound_subject_key())
    };
    let handler_with_own_fields = || async { ([("ratelimit", "\"mine\";r=1;t=1")], "own") };
    let app = Router::new()
        .route(
            "/items",
            get(|| async { "items" })
                .route_layer(AdmissionFieldsLayer::new())
                .route_layer(RateLimitLayer::new(
                    Arc::clone(&gcra),
                    items,
                    gcra_key,
                    ProblemRejections::new(),
                ))
                .route_layer(RateLimitLayer::new(
                    Arc::clone(&store),
                    policy(3),
                    everyone,
                    ProblemRejections::new(),
                )),
        )
        .route("/own", get(handler_with_own_fields).route_layer(AdmissionFieldsLayer::new()))
        .route(
            "/own_gated",
            get(handler_with_own_fields).route_layer((
                RateLimitLayer::new(Arc::clone(&store), policy(3), everyone, ProblemRejections::new()),
                AdmissionFieldsLayer::new(),
            )),
        );
    let url = serve(app).await;

    let (first, _) = get_text(&format!("http://{url}/items"), None).await;
    assert_eq!(first.headers()["ratelimit-policy"], r#""api";q=3;w=60, "items";q=10;w=10"#);
    // GCRA: burst 4, one spent; t is the time to full replenishment, one emission interval (1 s).
    assert_eq!(first.headers()["ratelimit"], r#""api";r=2;t=60, "items";r=3;t=1"#);

    // A handler that sets its own field keeps it; without gates nothing is added.
    let (own, _) = get_text(&format!("http://{url}/own"), None).await;
    assert_eq!(own.headers()["ratelimit"], "\"mine\";r=1;t=1");
    assert!(own.headers().get("ratelimit-policy").is_none());
    // Behind a gate that admitted it too: neither field is added or replaced, although the
    // handler set only one of them.
    let (own_gated, _) = get_text(&format!("http://{url}/own_gated"), None).await;
    assert_eq!(own_gated.status(), StatusCode::OK);
    assert_eq!(own_gated.headers().get_all("ratelimit").iter().collect::<Vec<_>>(), ["\"mine\";r=1;t=1"]);
    assert!(own_gated.headers().get("ratelimit-policy").is_none());
}

/// `HeaderKey` keys by the header's bytes under the layer's policy, as the closure recipe does,
/// and names the header (never a value) when it is missing or empty.
#[test]
fn header_key_hashes_the_value_and_refuses_a_missing_or_empty_one() -> Result<(), Box<dyn std::error::Error>>
{
    let hasher = KeyHasher::new(&[9; 32])?;
    let key = HeaderKey::new(HeaderName::from_static("x-api-key"), hasher.clone());
    let policy = policy(5);
    let parts = |value: Option<&str>| {
        let mut request = Request::get("/items");
        if let Some(value) = value {
            request = request.header("x-api-key", value);
        }
        request.body(()).unwrap().into_parts().0
    };
    let extracted = key.extract_subject_key(&parts(Some("k-1")), &policy)?;
    assert_eq!(extracted, hasher.hash_for(&policy, b"k-1").into_unbound_subject_key());
    assert_ne!(extracted, key.extract_subject_key(&parts(Some("K-1")), &policy)?);
    for request in [parts(None), parts(Some(""))] {
        let error: MissingHeader = key.extract_subject_key(&request, &policy).unwrap_err();
        assert_eq!(error.name(), "x-api-key");
        assert_eq!(error.to_string(), "the request has no non-empty x-api-key header");
    }
    Ok(())
}

/// One `AdmissionFields` service seeing requests admitted by different single gates: each gets
/// its own name and `RateLimit-Policy` value, shadow denials report what enforcement would have
/// sent, and a policy the names leave undisclosed gets no fields.
#[tokio::test]
async fn one_fields_service_describes_each_single_gate_exactly() {
    use runlimit_axum::{Admission, Admissions};
    use runlimit_core::{Admitted, Allowance, Capacity, Delay, QuotaDenial, RateLimitPolicy};
    use tower::{Layer as _, ServiceExt as _};

    let fixed = |id: &str, limit: u64| -> Arc<dyn RateLimitPolicy> {
        Arc::new(
            FixedWindowPolicy::new(
                PolicyId::new(id).unwrap(),
                ScopeId::new("c").unwrap(),
                limit,
                Duration::from_secs(60),
            )
            .unwrap(),
        )
    };
    let (api, admin, hidden) = (fixed("api", 100), fixed("admin", 5), fixed("hidden", 7));
    let allowed = |limit: u64, left: u64, millis: u64| {
        Admitted::Allowed(
            Allowance::new(Capacity::new(limit).unwrap(), left, Delay::from_millis(millis)).unwrap(),
        )
    };
    let names: runlimit_axum::NamePolicy =
        |policy| (policy.id().as_str() != "hidden").then(|| runlimit_axum::policy_id_name(policy)).flatten();
    let service = AdmissionFieldsLayer::with_names(names).layer(tower::service_fn(|_: Request<()>| async {
        Ok::<_, std::convert::Infallible>(Response::new(()))
    }));
    let fields = |policy: &Arc<dyn RateLimitPolicy>, decision: Admitted| {
        let mut admissions = Admissions::default();
        admissions.push(Admission::new(Arc::clone(policy), decision));
        let mut request = Request::new(());
        request.extensions_mut().insert(admissions);
        async move {
            let response = service.oneshot(request).await.unwrap();
            let header =
                |name: &str| response.headers().get(name).map(|value| value.to_str().unwrap().to_owned());
            (header("ratelimit-policy"), header("ratelimit"))
        }
    };
    let some = |policy: &str, limit: &str| (Some(policy.to_owned()), Some(limit.to_owned()));
    assert_eq!(
        fields(&api, allowed(100, 99, 60_000)).await,
        some(r#""api";q=100;w=60"#, r#""api";r=99;t=60"#)
    );
    assert_eq!(fields(&admin, allowed(5, 0, 1_500)).await, some(r#""admin";q=5;w=60"#, r#""admin";r=0;t=2"#));
    assert_eq!(
        fields(&api, allowed(100, 98, 59_001)).await,
        some(r#""api";q=100;w=60"#, r#""api";r=98;t=60"#)
    );
    let shadow =
        Admitted::ShadowDenied(QuotaDenial::new(Capacity::new(5).unwrap(), Delay::from_millis(4_200)));
    assert_eq!(fields(&admin, shadow).await, some(r#""admin";q=5;w=60"#, r#""admin";r=0;t=5"#));
    assert_eq!(fields(&hidden, allowed(7, 6, 60_000)).await, (None, None));
}
