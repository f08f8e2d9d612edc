//! Operations guide for the PostgreSQL fixed-window backend (documentation only).
//!
#![doc = include_str!("operations.md")]
