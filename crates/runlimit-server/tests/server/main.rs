//! runlimit-server's integration tests, one binary: the RLS service over real gRPC on loopback
//! (memory, Redis and PostgreSQL backends), the binary as a process, configuration checks and
//! envoyproxy/ratelimit's README examples. The tests that read the process's global metrics
//! recorder (`metrics`, `metrics_redis`, `dashboard`, `bounds`) are binaries of their own, each
//! the only recorder of its process.

#[path = "../backends/mod.rs"]
mod backends;
#[path = "../support/mod.rs"]
mod support;

mod atomic;
mod check_config;
mod gcra;
mod grpc_bounds;
mod headers;
mod health;
mod operations;
mod operations_processes;
mod processes;
mod readme_examples;
mod requests;
mod shadow;
mod shared_backends;
