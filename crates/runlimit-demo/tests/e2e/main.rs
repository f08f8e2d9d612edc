//! runlimit-demo end to end, one binary: the built server started as a process and called over
//! HTTP in memory, PostgreSQL and Redis modes, and its startup errors.

#[path = "../support/mod.rs"]
mod support;

mod admin;
mod memory;
mod postgres;
mod redis;
mod startup_errors;
