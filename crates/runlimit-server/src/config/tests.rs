//! Unit tests of the rule file compiler.
