//! observer
