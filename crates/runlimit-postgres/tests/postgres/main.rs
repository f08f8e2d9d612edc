//! PostgreSQL integration tests for `runlimit-postgres`, one binary.
//!
//! Every test needs `RUNLIMIT_POSTGRES_TEST_DATABASE_URL` and runs in its own fresh database
//! (see `support.rs`). They are `#[ignore]`d so a plain `cargo test` passes without a server;
//! run them with
//!
//! ```text
//! RUNLIMIT_POSTGRES_TEST_DATABASE_URL=postgres://postgres@127.0.0.1:5432/test \
//!     cargo test -p runlimit-postgres --all-features -- --include-ignored
//! ```

mod support;

mod rules;
