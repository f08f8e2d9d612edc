//! The `ShouldRateLimit` call: a request in, one atomic Runlimit admission, a response out.

mod evaluate;
mod request;
mod response;
mod rpc;

use std::{
    collections::HashMap,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Instant, SystemTime},
};

use arc_swap::ArcSwap;

use envoy_types::pb::envoy::service::ratelimit::v3::{
    RateLimitRequest, RateLimitResponse, rate_limit_response::Code,
    rate_limit_service_server::RateLimitService,
};
use runlimit_core::{ConsumptionStatus, FixedWindowPolicy, GcraPolicy, KeyHasher, QuotaMode};
use runlimit_http::draft_11::PolicyName;
use tonic::{Request, Response, Status};

pub(crate) use self::evaluate::Exhaustion;
pub use self::request::{MAX_DESCRIPTORS, MAX_DOMAIN_LEN, MAX_ENTRIES, MAX_KEY_LEN, MAX_VALUE_LEN};
pub use self::response::HeaderFormat;
pub use self::rpc::RateLimitServer;
use self::{
    evaluate::{BackendFailure, Charge, Verdict, evaluate},
    response::Outcome,
};
use crate::{
    backend::{Backend, Limiters},
    config::{Algorithm, Domain, Quota, Rule, RuleTable, build_policy, policy_id},
    matcher::match_entries,
    metrics::{self, Decision, DomainSeries, RuleKey},
};

/// What the service answers when its backend fails (`--on-backend-error`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum BackendErrorMode {
    /// gRPC `UNAVAILABLE`, so Envoy's `failure_mode_deny` decides: `false` (Envoy's default)
    /// lets the request through, `true` answers it with an error. The default.
    #[default]
    Unavailable,
    /// `OVER_LIMIT` for the whole request (fail closed whatever Envoy is configured to do).
    OverLimit,
    /// `OK` for the whole request (fail open whatever Envoy is configured to do).
    Ok,
}

/// How the service answers, beyond what the rules say.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ServiceOptions {
    /// Global shadow mode (`--shadow-mode`): every rule is in shadow mode. Over-limit
    /// descriptors are reported (`OVER_LIMIT` in their status) and counted, but the overall
    /// code is `OK` and nothing is consumed by a request that would have been denied. Storage
    /// bounds are not shadowed: a new key for a full store is still denied (`OVER_LIMIT`).
    pub shadow_mode: bool,
    /// The response headers to add, if any (`--response-headers`).
    pub response_headers: Option<HeaderFormat>,
    /// The answer when the backend fails (`--on-backend-error`).
    pub on_backend_error: BackendErrorMode,
}

/// The rate limit service: Envoy's `envoy.service.ratelimit.v3.RateLimitService` over a rule
/// table and a Runlimit backend.
///
/// Cloning is cheap (the state is shared). Serve it with [`RateLimitServer::new`] (a request
/// that cannot be decoded is answered `INVALID_ARGUMENT`), or call
/// [`should_rate_limit`](Self::should_rate_limit) directly. It also implements envoy-types'
/// generated `RateLimitService` trait, whose `RateLimitServiceServer` answers such a request
/// `INTERNAL`.
///
/// # Reloading
///
/// [`reload`](Self::reload) swaps the rule table atomically: a call evaluates entirely
/// against the table it started with, old or new, never a mix. Counters belong to the backend,
/// not to the table, so every rule the new table keeps unchanged keeps its counters exactly.
#[derive(Clone)]
pub struct Service {
    state: Arc<State>,
}

struct State {
    /// Backend failures are logged at most once per [`FAILURE_LOG_INTERVAL`] (an outage fails
    /// every call); each is counted in the metrics.
    failure_log: ThrottledLog,
    /// The rules in force and their limiters, replaced whole by [`Service::reload`].
    engine: ArcSwap<Engine>,
    backend: Backend,
    hasher: KeyHasher,
    options: ServiceOptions,
    /// False while a server prepares the backend: calls are then refused `UNAVAILABLE`.
    ready: AtomicBool,
}

/// A rule table with what serving it needs: its limiters and metric series.
pub(crate) struct Engine {
    pub(crate) table: Arc<RuleTable>,
    pub(crate) limiters: Limiters,
    metrics: metrics::EngineMetrics,
    pub(crate) loaded_at: SystemTime,
}

impl Engine {
    fn new(table: RuleTable, backend: &Backend, options: &ServiceOptions) -> Self {
        let table = if options.shadow_mode { table.into_shadow() } else { table };
        let limiters = backend.limiters(&table);
        let metrics = metrics::EngineMetrics::new(&table);
        Self { table: Arc::new(table), limiters, metrics, loaded_at: SystemTime::now() }
    }
}

impl std::fmt::Debug for Service {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Service")
            .field("table", &self.state.engine.load().table)
            .field("options", &self.state.options)
            .finish_non_exhaustive()
    }
}

impl Service {
    /// A service answering from `table`, keeping its counters in `backend` under subject keys
    /// derived by `hasher` (every replica sharing a backend needs the same secret).
    ///
    /// With [`ServiceOptions::shadow_mode`], every rule of `table` is put in shadow mode.
    ///
    /// The service's metrics (see the crate README) go to the `metrics` recorder installed
    /// when it is built: install one first (the binary installs a Prometheus recorder,
    /// [`install_metrics`](crate::install_metrics)).
    #[must_use]
    pub fn new(table: RuleTable, backend: &Backend, hasher: KeyHasher, options: ServiceOptions) -> Self {
        let engine = ArcSwap::from_pointee(Engine::new(table, backend, &options));
        let failure_log = ThrottledLog::new(FAILURE_LOG_INTERVAL);
        Self {
            state: Arc::new(State {
                failure_log,
                engine,
                backend: backend.clone(),
                hasher,
                options,
                ready: AtomicBool::new(true),
            }),
        }
    }

    /// The rule table in force now.
    #[must_use]
    pub fn table(&self) -> Arc<RuleTable> {
        Arc::clone(&self.state.engine.load().table)
    }

    /// When the table in force was loaded.
    #[must_use]
    pub fn loaded_at(&self) -> SystemTime {
        self.state.engine.load().loaded_at
    }

    /// The table in force and when it was loaded, read together (a reload in between cannot
    /// pair one table with another's time).
    #[must_use]
    pub fn snapshot(&self) -> (Arc<RuleTable>, SystemTime) {
        let engine = self.state.engine.load();
        (Arc::clone(&engine.table), engine.loaded_at)
    }

    /// Puts `table` in force for every call that starts from now on (calls in flight finish
    /// against the table they started with), with [`ServiceOptions::shadow_mode`] applied as
    /// at construction. Returns the rules whose counters the change starts afresh, as
    /// [`RuleTable::restarted_counters`] lists them.
    pub fn reload(&self, table: RuleTable) -> Vec<String> {
        let previous = self.state.engine.load_full();
        let restarted = table.restarted_counters(&previous.table);
        self.state.engine.store(Arc::new(Engine::new(table, &self.state.backend, &self.state.options)));
        restarted
    }

    /// The backend.
    #[must_use]
    pub fn backend(&self) -> &Backend {
        &self.state.backend
    }

    /// The limiters of the table in force now.
    pub(crate) fn limiters(&self) -> Limiters {
        self.state.engine.load().limiters.clone()
    }

    /// Whether calls are answered (a server clears it while it prepares the backend).
    pub(crate) fn set_ready(&self, ready: bool) {
        self.state.ready.store(ready, Ordering::Release);
    }

    /// Answers one `ShouldRateLimit` call; see the crate documentation for the semantics.
    ///
    /// # Errors
    ///
    /// - `INVALID_ARGUMENT` for a malformed request (the message names the field); nothing
    ///   is charged;
    /// - `UNAVAILABLE` when the backend fails (unless [`ServiceOptions::on_backend_error`] says
    ///   otherwise); the message says whether quota may have been consumed;
    /// - `INTERNAL` if the server is inconsistent with itself (never expected).
    pub async fn should_rate_limit(&self, request: &RateLimitRequest) -> Result<RateLimitResponse, Status> {
        let started = Instant::now();
        request::validate(request)?;
        let state = &*self.state;
        if !state.ready.load(Ordering::Acquire) {
            return Err(Status::unavailable(
                "not ready: the rate limit backend is being prepared (no quota was consumed)",
            ));
        }
        let engine = state.engine.load_full();
        let domain = engine.table.domain(&request.domain);
        let series = engine.metrics.domain(domain);
        let answer = match domain {
            Some(domain) => self.answer(&engine, domain, series, request).await,
            None => {
                series.request(Code::Ok);
                Ok(RateLimitResponse {
                    overall_code: Code::Ok.into(),
                    statuses: vec![response::status(&Outcome::NoLimit, false); request.descriptors.len()],
                    ..RateLimitResponse::default()
                })
            }
        };
        series.duration(started.elapsed());
        answer
    }

    /// Answers a valid request of a configured `domain`, counted in its `series`.
    async fn answer(
        &self,
        engine: &Engine,
        domain: &Domain,
        series: &DomainSeries,
        request: &RateLimitRequest,
    ) -> Result<RateLimitResponse, Status> {
        // Limit overrides carried by the request become rules of this request only.
        let overrides = override_rules(domain, request, self.state.options.shadow_mode);
        let mut scratch = String::new();
        let mut matched: Vec<Option<(&Rule, Vec<u8>, RuleKey)>> =
            Vec::with_capacity(request.descriptors.len());
        for (index, descriptor) in request.descriptors.iter().enumerate() {
            if let Some(rule) = overrides.get(&index) {
                let key = RuleKey { index: None, detailed: None };
                matched.push(Some((rule, request::subject(descriptor, &[]), key)));
                continue;
            }
            let entries = descriptor.entries.iter().map(|entry| (entry.key.as_str(), entry.value.as_str()));
            let found = match_entries(domain, entries, &mut scratch).and_then(|matched| {
                let rule = matched.rule(domain)?;
                let detailed = rule
                    .detailed_metric
                    .then(|| metrics::detailed_label(domain, descriptor, &matched.shared));
                let key = RuleKey { index: Some(matched.rule), detailed };
                Some((rule, request::subject(descriptor, &matched.shared), key))
            });
            matched.push(found);
        }

        // `replaces`: a matched rule named by another matched rule's `replaces` is dropped.
        let replaced: Vec<&str> = matched
            .iter()
            .flatten()
            .flat_map(|(rule, _, _)| rule.replaces.iter().map(|name| &**name))
            .collect();
        let mut outcomes: Vec<Outcome<'_>> = Vec::with_capacity(matched.len());
        let mut keys: Vec<Option<RuleKey>> = Vec::with_capacity(matched.len());
        let mut charges: Vec<Charge<'_>> = Vec::new();
        let mut charge_of: Vec<Option<usize>> = Vec::with_capacity(matched.len());
        for (descriptor, found) in request.descriptors.iter().zip(matched) {
            let mut charge = None;
            let mut rule_key = None;
            let outcome = match found {
                None => Outcome::NoLimit,
                Some((rule, _, _)) if rule.name.as_deref().is_some_and(|name| replaced.contains(&name)) => {
                    Outcome::NoLimit
                }
                Some((rule, _, _)) if matches!(rule.quota, Quota::Unlimited) => Outcome::Unlimited,
                Some((rule, subject, key)) => {
                    charge = Some(charges.len());
                    rule_key = Some(key);
                    charges.push(Charge { rule, subject, hits: request::hits(request, descriptor) });
                    Outcome::Limited { rule, verdict: Verdict::Unevaluated }
                }
            };
            outcomes.push(outcome);
            keys.push(rule_key);
            charge_of.push(charge);
        }

        let verdicts = if charges.is_empty() {
            Ok(Vec::new())
        } else {
            self.evaluate(&engine.limiters, domain, &charges).await
        };
        let verdicts = match verdicts {
            Ok(verdicts) => verdicts,
            Err(failure) => return self.backend_failure(domain, series, &outcomes, failure),
        };
        for (outcome, charge) in outcomes.iter_mut().zip(&charge_of) {
            if let (Outcome::Limited { verdict, .. }, Some(charge)) = (outcome, charge)
                && let Some(found) = verdicts.get(*charge)
            {
                *verdict = *found;
            }
        }
        Ok(self.respond(series, &outcomes, &keys))
    }

    async fn evaluate(
        &self,
        limiters: &Limiters,
        domain: &Domain,
        charges: &[Charge<'_>],
    ) -> Result<Vec<Verdict>, BackendFailure> {
        let hasher = &self.state.hasher;
        match (limiters, domain.algorithm) {
            (Limiters::Memory(memory), algorithm) => {
                let Some(stores) = memory.get(&*domain.name) else { return Err(no_limiter(domain)) };
                match algorithm {
                    Algorithm::FixedWindow => {
                        evaluate::<FixedWindowPolicy, _>(&stores.fixed, hasher, charges).await
                    }
                    Algorithm::Gcra => evaluate::<GcraPolicy, _>(&stores.gcra, hasher, charges).await,
                }
            }
            (Limiters::Redis(redis), algorithm) => {
                let Some(limiters) = redis.get(&*domain.name) else { return Err(no_limiter(domain)) };
                match algorithm {
                    Algorithm::FixedWindow => {
                        evaluate::<FixedWindowPolicy, _>(&limiters.fixed, hasher, charges).await
                    }
                    Algorithm::Gcra => evaluate::<GcraPolicy, _>(&limiters.gcra, hasher, charges).await,
                }
            }
            (Limiters::Postgres(postgres), Algorithm::FixedWindow) => {
                evaluate::<FixedWindowPolicy, _>(&postgres.fixed, hasher, charges).await
            }
            (Limiters::Postgres(postgres), Algorithm::Gcra) => {
                evaluate::<GcraPolicy, _>(&postgres.gcra, hasher, charges).await
            }
        }
    }

    /// The response to `outcomes` (`keys`: each descriptor's metric series, for the matched
    /// limited rules), counted in the metrics.
    fn respond(
        &self,
        series: &DomainSeries,
        outcomes: &[Outcome<'_>],
        keys: &[Option<RuleKey>],
    ) -> RateLimitResponse {
        let options = &self.state.options;
        let over_limit = outcomes.iter().any(|outcome| {
            matches!(outcome, Outcome::Limited { verdict: Verdict::Exhausted { enforced: true, .. }, .. })
        });
        for (outcome, key) in outcomes.iter().zip(keys) {
            let (Outcome::Limited { rule, verdict }, Some(key)) = (outcome, key) else { continue };
            let decision = match verdict {
                Verdict::Unevaluated => Decision::NotEvaluated,
                Verdict::Allowed(_) | Verdict::Available(_) => Decision::Ok,
                Verdict::Exhausted { enforced: true, .. } => Decision::OverLimit,
                Verdict::Exhausted { enforced: false, .. } => Decision::ShadowOverLimit,
            };
            series.decision(rule, key, decision);
            if let Verdict::Exhausted { enforced, reason } = verdict {
                if !enforced {
                    series.shadow_denial(rule, key, *reason);
                }
                if matches!(reason, Exhaustion::StorageCapacity { .. }) {
                    series.storage_full();
                }
            }
        }
        let code = if over_limit { Code::OverLimit } else { Code::Ok };
        series.request(code);
        RateLimitResponse {
            overall_code: code.into(),
            statuses: outcomes.iter().map(|outcome| response::status(outcome, options.shadow_mode)).collect(),
            response_headers_to_add: options
                .response_headers
                .map(|format| response::headers(format, outcomes, over_limit))
                .unwrap_or_default(),
            ..RateLimitResponse::default()
        }
    }

    fn backend_failure(
        &self,
        domain: &Domain,
        series: &DomainSeries,
        outcomes: &[Outcome<'_>],
        failure: BackendFailure,
    ) -> Result<RateLimitResponse, Status> {
        series.backend_failure(failure.consumption);
        let consumption = match failure.consumption {
            ConsumptionStatus::NotConsumed => "no quota was consumed",
            ConsumptionStatus::MayHaveBeenConsumed => "quota may have been consumed",
            ConsumptionStatus::Consumed => "quota was consumed (the enforced rules were charged)",
        };
        if let Some(suppressed) = self.state.failure_log.due() {
            tracing::warn!(
                domain = &*domain.name,
                consumption,
                error = %failure.message,
                similar_failures_not_logged = suppressed,
                "backend failure"
            );
        }
        let code = match self.state.options.on_backend_error {
            BackendErrorMode::Unavailable => {
                return Err(Status::unavailable(format!(
                    "rate limit backend failed ({consumption}): {}",
                    failure.message
                )));
            }
            BackendErrorMode::OverLimit => Code::OverLimit,
            BackendErrorMode::Ok => Code::Ok,
        };
        series.request(code);
        // Failing closed, every limited descriptor reads over its limit (with its rule, and no
        // time to wait: nothing was measured); failing open, nothing was measured either.
        let statuses = outcomes
            .iter()
            .map(|outcome| match outcome {
                Outcome::Limited { rule, .. } if code == Code::OverLimit => response::status(
                    &Outcome::Limited {
                        rule,
                        verdict: Verdict::Exhausted { enforced: true, reason: Exhaustion::Never },
                    },
                    false,
                ),
                outcome => response::status(outcome, false),
            })
            .collect();
        Ok(RateLimitResponse { overall_code: code.into(), statuses, ..RateLimitResponse::default() })
    }
}

/// How often a backend failure is logged at most.
const FAILURE_LOG_INTERVAL: std::time::Duration = std::time::Duration::from_secs(10);

/// Lets an event through at most once per interval and counts the ones held back.
///
/// Written here rather than taken from a log-throttling crate: it is one mutex around an
/// instant and a count, and `tracing` has no rate limit of its own.
struct ThrottledLog {
    interval: std::time::Duration,
    state: std::sync::Mutex<(Option<std::time::Instant>, u64)>,
}

impl ThrottledLog {
    fn new(interval: std::time::Duration) -> Self {
        Self { interval, state: std::sync::Mutex::new((None, 0)) }
    }

    /// `Some(events held back since the last one let through)` when this event is due.
    fn due(&self) -> Option<u64> {
        let mut state = self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let now = std::time::Instant::now();
        match state.0 {
            Some(last) if now.duration_since(last) < self.interval => {
                state.1 += 1;
                None
            }
            _ => {
                let held_back = state.1;
                *state = (Some(now), 0);
                Some(held_back)
            }
        }
    }
}

/// A domain of the table without limiters: never expected (the limiters are built from the
/// same table), reported as a failure that consumed nothing.
fn no_limiter(domain: &Domain) -> BackendFailure {
    BackendFailure {
        consumption: ConsumptionStatus::NotConsumed,
        message: format!("no limiter for domain {}", domain.name),
    }
}

/// The rules of the request's limit overrides, by descriptor index: `requests_per_unit` per
/// `unit` of the domain's algorithm (GCRA with a burst of `requests_per_unit`), counted per
/// domain, entry keys and limit, and per entry values.
fn override_rules(domain: &Domain, request: &RateLimitRequest, shadow: bool) -> HashMap<usize, Rule> {
    let mut rules = HashMap::new();
    for (index, descriptor) in request.descriptors.iter().enumerate() {
        let Some(limit) = &descriptor.limit else { continue };
        // `validate` refused unknown units.
        let Some(unit) = request::override_unit(limit.unit) else { continue };
        // One policy identifier per domain: the limiters' own metrics label series by it, so
        // it must not depend on anything a request chooses. The counters stay apart anyway: the
        // subject holds every entry's key and value, and the fingerprint the limit and unit.
        let id = policy_id("override", &domain.name, []);
        // The header name lists the entry keys and the limit (`domain.key1.key2 (override
        // 3/hour)`), so two overrides of other keys or another limit, which count apart, are
        // two draft-11 items. When that text cannot be a draft-11 name (a character outside
        // %x20-%x7E in the domain or a key, or more than 1,024 bytes with the limit), an
        // identifier of the domain and keys (`rls.` and 24 hexadecimal digits of their SHA-256
        // digest) stands for them, still followed by the limit. Overrides of the same keys and
        // limit with other values share the name, as a rule matched twice does (the first
        // exhausted one is described). The rule's path, which metrics and logs show, is one
        // fixed text per domain, so no request can add a metric series.
        let limit_text = format!(" (override {}/{})", limit.requests_per_unit, unit.name());
        let mut keys_path = domain.name.to_string();
        for entry in &descriptor.entries {
            keys_path.push('.');
            keys_path.push_str(&entry.key);
        }
        keys_path.push_str(&limit_text);
        let path = format!("{}.(override)", domain.name);
        let policy = if limit.requests_per_unit == 0 {
            None
        } else {
            build_policy(id.clone(), domain.algorithm, limit.requests_per_unit, unit, None)
                .ok()
                .map(|policy| if shadow { policy.with_quota_mode(QuotaMode::Shadow) } else { policy })
        };
        let header_name = PolicyName::new(&keys_path).or_else(|_| {
            let keys = policy_id(
                "override",
                &domain.name,
                descriptor.entries.iter().map(|entry| (entry.key.as_str(), None)),
            );
            PolicyName::new(&format!("{}{limit_text}", keys.as_str()))
        });
        // An identifier and a limit always make a name; the identifier alone is the last resort.
        let header_name = header_name.unwrap_or_else(|_| PolicyName::from(&id));
        rules.insert(
            index,
            Rule {
                path: path.into(),
                name: None,
                replaces: Box::new([]),
                quota: Quota::Limited { requests_per_unit: limit.requests_per_unit, unit, policy },
                shadow,
                header_name,
                identity: id,
                shared: "".into(),
                detailed_metric: false,
            },
        );
    }
    rules
}

#[tonic::async_trait]
impl RateLimitService for Service {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        Self::should_rate_limit(self, request.get_ref()).await.map(Response::new)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::ThrottledLog;

    #[test]
    fn a_throttled_log_lets_one_event_through_per_interval_and_counts_the_rest() {
        let log = ThrottledLog::new(Duration::from_millis(200));
        assert_eq!(log.due(), Some(0));
        assert_eq!(log.due(), None);
        assert_eq!(log.due(), None);
        std::thread::sleep(Duration::from_millis(250));
        assert_eq!(log.due(), Some(2));
        assert_eq!(log.due(), None);
    }
}
