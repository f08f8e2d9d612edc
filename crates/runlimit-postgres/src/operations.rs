//! Operations guide (placeholder).
