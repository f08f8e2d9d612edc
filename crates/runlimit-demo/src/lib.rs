//! The Runlimit demo service: an Axum server protecting a login endpoint and a read endpoint
//! with Runlimit, in memory or (for the shared gates) on PostgreSQL and/or Redis.
//!
//! Run it with no setup:
//!
//! ```text
//! cargo run --release -p runlimit-demo
//! ```
//!
//! It prints one machine-readable line on stdout once bound,
//! `runlimit-demo listening on http://127.0.0.1:3000`, logs to stderr, and stops gracefully on
//! SIGINT or SIGTERM. `runlimit-demo --help` lists every option.
//!
//! # Routes
//!
//! | route | gates, in the order they run | answers |
//! |---|---|---|
//! | `POST /login` | `login-client` ([`RateLimitLayer`](runlimit_axum::RateLimitLayer), memory, before the body is read), then `login-identity` (in the handler, after the JSON body is parsed), then the `login-attempts` attempt limiter around the password check | 200, 401, 400/413/415/422 for a bad body, 429, 503 |
//! | `GET /items` | `items` (GCRA, [`RateLimitLayer`](runlimit_axum::RateLimitLayer) per client) | 200, 429, 503 |
//! | `GET /healthz` | none | 200 ready / 503 unavailable, as JSON |
//! | `GET /metrics` | none | Prometheus text: every Runlimit metric of the process (see [Metrics](#metrics)) |
//!
//! `POST /login` takes `{"identity": "...", "password": "..."}` (at most
//! [`LOGIN_BODY_LIMIT`] bytes). The demo users are a fixed in-memory table ([`DemoUsers`]),
//! for example `alice@example.test` / `correct horse battery staple`.
//!
//! # The gates
//!
//! | name | policy id / scope | algorithm | subject | storage |
//! |---|---|---|---|---|
//! | `login-client` | `demo.login` / `client` | anchored fixed window | client network ([`ClientKey`]) | hard-bounded `MemoryStore`, always per process |
//! | `login-identity` | `demo.login` / `identity` | anchored fixed window | normalized identity ([`normalize_identity`]) | `MemoryStore`; `PostgresLimiter` with `--database-url`; `RedisLimiter` with `--redis-url` |
//! | `items` | `demo.items` / `client` | GCRA | client network ([`ClientKey`]) | `GcraStore`; `PostgresGcraLimiter` with `--database-url`; `RedisGcraLimiter` with `--redis-url` |
//!
//! The per-client `login-client` gate is the coarse, hard-bounded memory gate the Runlimit
//! documentation recommends in front of body parsing and database acquisition: a flood from
//! one client is refused before its body is read and before a pooled connection is taken.
//! The `login-identity` gate counts the account named in the body. A `RateLimitLayer`'s
//! extractor only sees the request head ([`http::request::Parts`](https://docs.rs/http/1/http/request/struct.Parts.html)), never the body, so a
//! body-borne identity cannot be checked by a layer: the handler parses the body and checks
//! the identity limiter directly, with the same policy-bound [`Check`](runlimit_core::Check).
//!
//! Every request counts against the identity quota, successful or not: this is a rate
//! limit, not a lockout (durable lockouts are the application's business).
//!
//! ## Password-check attempts (`login-attempts`)
//!
//! After both gates admit a request, the password check itself is an attempt of the
//! identity's subject under an [`AttemptPolicy`](runlimit_core::attempts::AttemptPolicy)
//! (`demo.login` / `attempt`, subject
//! [`KeyHasher::hash_attempt_for`](runlimit_core::KeyHasher::hash_attempt_for) of the
//! normalized identity), through [`LoginAttempts`]: `MemoryAttemptLimiter` in memory and
//! Redis-only mode, `PostgresAttemptLimiter` with `--database-url`.
//!
//! 1. `acquire`: at most one check per identity in flight, and none while the identity backs
//!    off after a failure. A denial is `429` with `Retry-After` (the remaining delay in whole
//!    seconds, rounded up) and a `quota-exceeded` problem body naming `login-attempts`; a
//!    full attempt store is `503` `temporary-reduced-capacity`.
//! 2. The password is verified with no transaction open (a PostgreSQL admission has
//!    committed before `acquire` returns).
//! 3. `complete(receipt, Success | Failure)`: a failure doubles the backoff
//!    (`--attempt-initial-delay-secs`, 1 s by default, then 2 s, 4 s ... up to
//!    `--attempt-delay-cap-secs`, 60 s); a success resets it; the failure history is forgotten
//!    after `--attempt-quiet-period-secs` (900 s) without failures. A `Stale` completion (the
//!    check outlived its `--attempt-lease-secs` lease, 30 s, and already counted as a failure)
//!    answers 401 whatever the password said. A request abandoned mid-check drops its receipt,
//!    which counts as a failure at the lease deadline.
//!
//! Limiter errors refuse the request with `503` and are never retried, in particular not
//! one whose outcome is uncertain (`MayHaveBeenConsumed`).
//!
//! ## Storage modes
//!
//! - No options: everything in memory, per process.
//! - `--database-url` (or `DATABASE_URL`): the `login-identity` gate moves to
//!   `runlimit_postgres::PostgresLimiter`, the `items` GCRA gate to
//!   `runlimit_postgres::PostgresGcraLimiter` and the attempt limiter to
//!   `runlimit_postgres::attempts::PostgresAttemptLimiter` (all migrated at start), so every
//!   replica pointing at the database shares the identity quota, the items burst and each
//!   identity's attempt backoff. `login-client`
//!   stays in memory (per process) by design. [`IdentityLimiter`] and [`ItemsLimiter`] are
//!   application enums implementing [`Limiter`](runlimit_core::Limiter) that dispatch to the
//!   chosen backend.
//!
//! - `--redis-url` (or `REDIS_URL`): the `login-identity` gate moves to
//!   `runlimit_redis::RedisLimiter` and the `items` GCRA gate to
//!   `runlimit_redis::RedisGcraLimiter`, under `--redis-key-prefix` (default
//!   `runlimit-demo`), each with `--redis-max-keys-per-shard` keys per shard (4,096). At start
//!   both are prepared (`RedisStore::prepare`: Redis 7.0 or newer, `maxmemory-policy
//!   noeviction`, not cluster mode, scripts loaded); a failure stops the demo with the address,
//!   the cause and the fix. The attempt limiter stays in memory: attempts do not use Redis.
//! - Both: identity and items on Redis, the attempt limiter on PostgreSQL.
//!
//! All replicas sharing a database or a Redis server (and key prefix) must use the same
//! policies, normalization rules and HMAC secret.
//!
//! `GET /healthz` probes every backend a request needs: memory shards, Redis
//! (`RedisStore::prepare` on each Redis limiter) and PostgreSQL (`SELECT 1`), each within 1 s;
//! see [`Readiness`] for the JSON, including the `backends` list when Redis and PostgreSQL are
//! both in use. With a PostgreSQL or Redis gate, expired fixed-window and GCRA state is cleaned
//! up every `--cleanup-interval-secs` ([`Backends::spawn_maintenance`]).
//!
//! # Client addresses
//!
//! The client is the socket peer address from axum's `ConnectInfo`, read by the
//! application's own [`ClientKey`] extractor (the Runlimit adapter never reads it). IPv4
//! addresses count individually; IPv6 addresses are aggregated to their /64 prefix, since one
//! host typically controls a whole /64. Forwarding headers are **never** read, unless
//! `--trusted-proxy <IP>` is given and the peer is that proxy: then the client is the
//! rightmost `X-Forwarded-For` entry, the one the trusted proxy appended. See
//! [`client_network`].
//!
//! # Responses
//!
//! - Every response of a gated route carries `RateLimit-Policy` and `RateLimit`
//!   (draft-ietf-httpapi-ratelimit-headers-11, through `runlimit_http::draft_11`) for the gates
//!   the request passed, plus the gate that refused it. For `login-identity` with a limit of
//!   8 per 600 s: `RateLimit-Policy: "login-client";q=40;w=60, "login-identity";q=8;w=600`.
//! - A quota denial is `429 Too Many Requests` with `Retry-After` (whole seconds, rounded
//!   up from the backend's exact delay, equal to the refused gate's `t`) and an RFC 9457
//!   `application/problem+json` body of the draft's `quota-exceeded` type naming the
//!   `violated-policies`. See [`Problem`].
//! - A full rate-limit store is `503` with the draft's `temporary-reduced-capacity` type; a
//!   backend failure is `503` with an `about:blank` problem. Both fail closed.
//!
//! # Logs
//!
//! `tracing` events on stderr, filtered by `RUST_LOG` (default `info`, PostgreSQL notices
//! from `warn`). Every admission
//! (every limiter check) produces one `runlimit_demo::admission` event with the backend,
//! policy id, scope, outcome, consumption and elapsed microseconds, from a Runlimit
//! [`Observer`](runlimit_core::Observer) ([`TracingObserver`]). No event contains a raw
//! identity, password, client address or subject key.
//!
//! # Metrics
//!
//! `GET /metrics` (ungated) serves every `runlimit_metrics` series of the process in the
//! Prometheus text format: admissions by policy, outcome and consumption, durations in
//! seconds (histograms with buckets from 10 µs to 2.5 s), memory shard occupancy, cleanups,
//! resets and attempt events. The same observation feeds the logs and the metrics
//! ([`DemoObserver`]), with `backend` `"memory"`, `"postgres"` or `"redis"`.
//!
//! # Key secret
//!
//! Subject keys are HMAC-SHA-256 digests under the secret in `RUNLIMIT_KEY_SECRET` (its
//! bytes, at least 32). Without it the demo generates an ephemeral random secret and logs a
//! warning: counters are then not shared across replicas or restarts. See
//! [`key_hasher_from_env`].

#![cfg_attr(not(test), warn(clippy::unwrap_used, clippy::expect_used, clippy::panic))]

mod app;
mod backend;
mod cli;
mod client;
mod identity;
mod observe;
mod problem;
mod secret;
mod server;
mod users;

pub use crate::app::{App, Gates, GatesError, LOGIN_BODY_LIMIT, LoginRequest, router};
pub use crate::backend::{
    AttemptAcquireError, AttemptCompleteError, BackendReadiness, Backends, ClientStore, IdentityBatchError,
    IdentityCheckError, IdentityLimiter, ItemsBatchError, ItemsCheckError, ItemsLimiter, LoginAttemptReceipt,
    LoginAttempts, Readiness,
};
pub use crate::cli::Args;
pub use crate::client::{ClientAddressError, ClientKey, ClientNetwork, client_network};
pub use crate::identity::{IdentityError, MAX_IDENTITY_LEN, normalize_identity};
pub use crate::observe::{DemoObserver, TracingObserver};
pub use crate::problem::{Problem, ProblemType};
pub use crate::secret::{KEY_SECRET_ENV, KeySecretError, KeySecretSource, key_hasher_from_env};
pub use crate::server::{LISTENING_PREFIX, RunError, init_tracing, run};
pub use crate::users::DemoUsers;
