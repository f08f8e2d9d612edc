//! (scenarios to come)
