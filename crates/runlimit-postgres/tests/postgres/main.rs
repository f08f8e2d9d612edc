//! PostgreSQL integration tests for `runlimit-postgres`, one binary.
//!
//! Every test needs `RUNLIMIT_POSTGRES_TEST_DATABASE_URL` and runs in its own fresh database
//! (see `support.rs`), dropped when the test passes and kept for debugging when it fails. The
//! tests are `#[ignore]`d so a plain `cargo test` passes without a server, and panic with a
//! clear message when the variable is missing. Run them with
//!
//! ```text
//! RUNLIMIT_POSTGRES_TEST_DATABASE_URL=postgres://postgres@127.0.0.1:5432/test \
//!     cargo test -p runlimit-postgres --all-features -- --include-ignored
//! ```

mod clock;
mod support;

mod attempts;
mod capacity;
mod clock_tests;
mod control;
mod differential;
mod faults;
mod gcra;
mod migrations;
mod observer;
mod promises;
mod protocol;
mod replicas;
mod row_locks;
mod rules;
