//! Unit tests of the matcher.
