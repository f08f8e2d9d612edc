//! runlimit-axum: `Router::oneshot` and `ServiceBuilder` tests, and real HTTP over loopback.

mod contracts;
mod cors;
mod memory;
#[cfg(feature = "axum")]
mod peer;
mod ready_made;
mod real_http;
mod router;
mod service;
mod support;
