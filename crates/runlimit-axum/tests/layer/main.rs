//! runlimit-axum: `Router::oneshot` and `ServiceBuilder` tests, and real HTTP over loopback.

mod memory;
mod real_http;
mod router;
mod service;
mod support;
