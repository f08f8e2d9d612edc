//! Framework-neutral encoding of the IETF draft `RateLimit-Policy` and `RateLimit` response
//! fields for Runlimit policies and decisions.
//!
//! `runlimit-http` turns caller-selected Runlimit metadata into typed [`http::HeaderName`](https://docs.rs/http/1/http/header/struct.HeaderName.html)s
//! and [`http::HeaderValue`](https://docs.rs/http/1/http/header/struct.HeaderValue.html)s. It is versioned by draft: [`draft_11`] implements
//! draft-ietf-httpapi-ratelimit-headers-11 (Polli, Martinez, Miller, 23 May 2026), whose field
//! values are RFC 9651 Structured Field lists:
//!
//! ```text
//! RateLimit-Policy: "name";q=N;w=S
//! RateLimit: "name";r=N;t=S
//! ```
//!
//! The crate never selects a response status or body, never emits `Retry-After`, never
//! exposes partition keys (`pk`) and never decides which policies an application discloses:
//! those belong to the application.
//!
//! # Example
//!
//! ```
//! use std::time::Duration;
//! use http::HeaderMap;
//! use runlimit_core::{
//!     Allowance, Capacity, Decision, Delay, FixedWindowPolicy, PolicyId, ScopeId,
//! };
//! use runlimit_http::draft_11::{self, PolicyName, RateLimitFields};
//!
//! let policy = FixedWindowPolicy::new(
//!     PolicyId::new("api.read")?, ScopeId::new("client")?, 100, Duration::from_secs(60))?;
//! // What a backend returned for this request (normally `limiter.check(..).await?`).
//! let decision = Decision::allowed(Allowance::new(Capacity::new(100)?, 50, Delay::from_millis(29_500))?);
//! let admitted = decision.admit().map_err(|_| "denied")?;
//!
//! let mut fields = RateLimitFields::new();
//! fields.push(PolicyName::new("default")?, &policy, admitted)?;
//! let mut headers = HeaderMap::new();
//! fields.insert_into(&mut headers);
//! assert_eq!(headers[draft_11::RATELIMIT_POLICY], r#""default";q=100;w=60"#);
//! assert_eq!(headers[draft_11::RATELIMIT], r#""default";r=50;t=30"#);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Feature flags
//!
//! | Feature | Default | What it enables |
//! |---|---|---|
//! | — | — | This crate has no optional features. |
//!
//! # Why a hand-written serializer
//!
//! See [`draft_11`]'s module documentation: the two fields use only RFC 9651 Strings and
//! non-negative Integers with fixed lowercase keys, so a ~40-line serializer over validated
//! types is smaller than the `sfv` dependency and keeps every encoding step infallible. `sfv`
//! 0.15 (the last release within the workspace MSRV, 1.94) parses every output in the tests.

#![cfg_attr(docsrs, feature(doc_cfg))]
#![doc(test(attr(deny(warnings))))]
#![cfg_attr(not(test), warn(clippy::unwrap_used, clippy::expect_used, clippy::panic))]

pub mod draft_11;

/// This crate's README (what crates.io shows), compiled and run as doctests so it stays true.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct CrateReadmeDoctests;
