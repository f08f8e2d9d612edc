//! Integration tests for runlimit-memory, one binary (see the modules for each rule).

mod batches;
mod capacity;
mod concurrency;
mod fixed_window;
mod gcra;
mod limiter;
mod model;
mod observer;
#[cfg(feature = "serde")]
mod serde;
mod support;
