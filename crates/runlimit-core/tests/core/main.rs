//! runlimit-core's integration tests, one binary: batch validation, constructors, the GCRA
//! evaluator against a rational reference, key derivation, the `Limiter` trait's shape, the
//! README's decision model and the serde formats.

mod batch_validation;
mod constructors;
mod gcra_reference;
mod key_derivation;
mod limiter_shape;
mod readme_decision_model;
mod serde_fuzz;
mod serde_round_trip;
