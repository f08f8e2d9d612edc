//! A rate limit service for Envoy: `envoy.service.ratelimit.v3.RateLimitService` over gRPC,
//! reading envoyproxy/ratelimit's YAML rule files, with one atomic Runlimit batch per request.
//!
//! This crate is the `runlimit-server` binary and the library it is made of, so tests and
//! embedders can start it in-process. The crate README is the operator's guide (the Envoy
//! configuration, every flag, the differences from envoyproxy/ratelimit); this page is the
//! library's.
//!
//! # The pieces
//!
//! - [`RuleTable`]: rule files in, a validated table out (or [`ConfigErrors`], each naming
//!   the file, the document path and the cause). Pure apart from [`RuleTable::load`].
//! - [`Service`]: the `ShouldRateLimit` call. It matches each request descriptor against the
//!   table, admits the matched rules as one atomic batch of a [`Backend`] (process memory,
//!   Redis or PostgreSQL) and builds the response. Every rule it applies lives in
//!   `runlimit_core`; the service only adapts. [`RateLimitServer`] is its gRPC service (a
//!   request that cannot be decoded is answered `INVALID_ARGUMENT`).
//! - [`Server`]: binds the gRPC and HTTP listeners and serves until shut down; [`run`] is the
//!   binary's whole life.
//!
//! # Example
//!
//! ```
//! use envoy_types::pb::envoy::{
//!     extensions::common::ratelimit::v3::{RateLimitDescriptor, rate_limit_descriptor::Entry},
//!     service::ratelimit::v3::{RateLimitRequest, rate_limit_response::Code},
//! };
//! use runlimit_core::KeyHasher;
//! use runlimit_memory::MemoryStoreConfig;
//! use runlimit_server::{Backend, RuleTable, Service, ServiceOptions};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let rules = RuleTable::from_sources([(
//!     "ratelimit.yaml",
//!     "domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limit:\n      unit: minute\n      requests_per_unit: 2\n",
//! )])?;
//! let backend = Backend::memory(MemoryStoreConfig::new(10_000)?);
//! let hasher = KeyHasher::new(b"an example secret of at least 32 bytes")?;
//! let service = Service::new(rules, &backend, hasher, ServiceOptions::default());
//!
//! let request = RateLimitRequest {
//!     domain: "edge".into(),
//!     descriptors: vec![RateLimitDescriptor {
//!         entries: vec![Entry { key: "remote_address".into(), value: "192.0.2.4".into() }],
//!         ..Default::default()
//!     }],
//!     hits_addend: 0,
//! };
//! let first = service.should_rate_limit(&request).await?;
//! assert_eq!(first.overall_code, i32::from(Code::Ok));
//! assert_eq!(first.statuses[0].limit_remaining, 1);
//! service.should_rate_limit(&request).await?;
//! let third = service.should_rate_limit(&request).await?;
//! assert_eq!(third.overall_code, i32::from(Code::OverLimit));
//! # Ok(())
//! # }
//! ```

#![cfg_attr(docsrs, feature(doc_cfg))]
#![doc(test(attr(deny(warnings))))]
#![cfg_attr(not(test), warn(clippy::unwrap_used, clippy::expect_used, clippy::panic))]

mod backend;
mod cli;
mod config;
mod escape;
mod grpc;
mod health;
mod http;
mod json;
mod matcher;
mod metrics;
mod reload;
mod secret;
mod server;
mod service;

use std::{path::Path, process::ExitCode};

pub use crate::backend::{Backend, BackendError, MAX_REDIS_KEY_PREFIX_LEN};
pub use crate::cli::{Args, BackendErrorArg, Command, HeaderFormatArg, LogFormat};
pub use crate::config::{
    Algorithm, ConfigError, ConfigErrorKind, ConfigErrors, MAX_RULE_FILE_BYTES, RuleTable, Unit,
};
pub use crate::grpc::{
    MAX_GRPC_CONNECTIONS, MAX_PENDING_REQUEST_BYTES, PREFACE_TIMEOUT, REQUEST_READ_TIMEOUT,
};
pub use crate::http::{BODY_READ_TIMEOUT, HEADER_READ_TIMEOUT, MAX_HTTP_CONNECTIONS, MAX_JSON_BODY};
pub use crate::secret::{KEY_SECRET_ENV, KeySecretError, KeySecretSource, key_hasher};
pub use crate::server::{
    GRPC_LISTENING_PREFIX, HTTP_LISTENING_PREFIX, MAX_CONCURRENT_STREAMS, RunError, SHUTDOWN_GRACE, Server,
    announce, install_metrics, shutdown_signal,
};
pub use crate::service::{
    BackendErrorMode, HeaderFormat, MAX_DESCRIPTORS, MAX_DOMAIN_LEN, MAX_ENTRIES, MAX_KEY_LEN, MAX_VALUE_LEN,
    RateLimitServer, Service, ServiceOptions,
};

/// Runs the server `args` describe until SIGINT or SIGTERM: loads the rules, prepares the
/// backend, binds both listeners, prints `grpc listening on HOST:PORT` and
/// `http listening on HOST:PORT` on stdout, and serves; on a signal, stops accepting, lets
/// in-flight calls finish (for at most [`SHUTDOWN_GRACE`]) and returns `Ok`.
///
/// # Errors
///
/// Every [`RunError`] variant, each at the step its documentation names.
pub async fn run(args: &Args) -> Result<(), RunError> {
    let metrics = install_metrics();
    // Installed first: a SIGTERM during startup stops the process cleanly, not by the
    // signal's default action.
    let shutdown = shutdown_signal();
    let server = Server::bind(args, metrics).await?;
    let bind_error = |option, address, source| RunError::Bind { option, address, source };
    let grpc = server.grpc_addr().map_err(|source| bind_error("--grpc-addr", args.grpc_addr, source))?;
    let http = server.http_addr().map_err(|source| bind_error("--http-addr", args.http_addr, source))?;
    server
        .serve_with(shutdown, move || {
            announce(grpc, http)?;
            tracing::info!(%grpc, %http, "listening");
            Ok(())
        })
        .await
}

/// `runlimit-server check-config PATH [--previous OLD]`: validates the rule files at `path`.
/// Prints a one-line summary on stdout and returns success, or prints every problem on stderr
/// (one per line) and returns failure. With `previous`, a valid change also lists on stdout
/// the rules whose counters it would start afresh.
#[must_use]
pub fn check_config(path: &Path, previous: Option<&Path>) -> ExitCode {
    let table = match RuleTable::load(path) {
        Ok(table) => table,
        Err(errors) => {
            eprintln!("{errors}");
            return ExitCode::FAILURE;
        }
    };
    let count = |n: usize, noun: &str| if n == 1 { format!("1 {noun}") } else { format!("{n} {noun}s") };
    println!(
        "{}: valid ({}, {}, {})",
        path.display(),
        count(table.domain_count(), "domain"),
        count(table.rule_count(), "rule"),
        count(table.files().len(), "file")
    );
    if let Some(previous) = previous {
        match RuleTable::load(previous) {
            Ok(old) => {
                let restarted = table.restarted_counters(&old);
                if restarted.is_empty() {
                    println!("no rule's counters restart");
                } else {
                    println!("counters that restart (every client gets the new limit's full quota at once):");
                    for line in restarted {
                        println!("  {line}");
                    }
                }
            }
            Err(errors) => {
                for line in errors.to_string().lines() {
                    eprintln!("--previous {}: {line}", previous.display());
                }
                return ExitCode::FAILURE;
            }
        }
    }
    ExitCode::SUCCESS
}

/// The filter when `RUST_LOG` is unset or invalid: `info`, but PostgreSQL's notices (which SQLx
/// logs at `info` under `sqlx::postgres::notice`) only from `warn`: every start on a migrated
/// database would otherwise log `relation "_sqlx_migrations" already exists, skipping`.
const DEFAULT_LOG_FILTER: &str = "info,sqlx::postgres::notice=warn";

/// Installs the stderr `tracing` subscriber in `format`: `RUST_LOG` filter directives, or when
/// it is unset or invalid `info,sqlx::postgres::notice=warn` (see `DEFAULT_LOG_FILTER`). Does
/// nothing if a global subscriber is already installed.
pub fn init_tracing(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(DEFAULT_LOG_FILTER));
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
}

/// `error` and its chain of sources as one line, `a: b: c`, each text said once.
#[must_use]
pub fn error_chain(error: &dyn std::error::Error) -> String {
    let mut message = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let text = cause.to_string();
        if !message.ends_with(&text) {
            message.push_str(": ");
            message.push_str(&text);
        }
        source = cause.source();
    }
    message
}
