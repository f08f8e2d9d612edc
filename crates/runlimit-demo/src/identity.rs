//! Identity normalization for the per-identity gate.

/// The longest normalized identity accepted, in bytes: 254, the longest usable email
/// address (RFC 5321 §4.5.3.1.3 path limit minus the angle brackets).
pub const MAX_IDENTITY_LEN: usize = 254;

/// Why an identity was rejected before any quota was checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum IdentityError {
    /// The identity is empty after trimming whitespace.
    #[error("identity is empty")]
    Empty,
    /// The normalized identity is longer than [`MAX_IDENTITY_LEN`] bytes.
    #[error("identity is {length} bytes long, above the maximum of {maximum}")]
    TooLong {
        /// The normalized length in bytes.
        length: usize,
        /// [`MAX_IDENTITY_LEN`].
        maximum: usize,
    },
}

/// Normalizes a login identity for the per-identity gate and the user lookup: leading and
/// trailing Unicode whitespace trimmed ([`str::trim`]), then lowercased with Unicode's
/// default case mapping ([`str::to_lowercase`]).
///
/// So `" Alice@Example.TEST "` and `"alice@example.test"` are one subject and share one
/// quota. This is the demo's rule, not a universal one: an application must apply the same
/// rule on every replica, and may choose stricter ones (NFKC, provider-specific email
/// canonicalization). Internal whitespace is kept.
///
/// # Errors
///
/// - [`IdentityError::Empty`] when nothing remains after trimming;
/// - [`IdentityError::TooLong`] above [`MAX_IDENTITY_LEN`] bytes after normalization.
///
/// # Examples
///
/// ```
/// use runlimit_demo::{normalize_identity, IdentityError};
///
/// assert_eq!(normalize_identity("  Alice@Example.TEST\n")?, "alice@example.test");
/// assert_eq!(normalize_identity(" \t"), Err(IdentityError::Empty));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn normalize_identity(identity: &str) -> Result<String, IdentityError> {
    let normalized = identity.trim().to_lowercase();
    if normalized.is_empty() {
        return Err(IdentityError::Empty);
    }
    if normalized.len() > MAX_IDENTITY_LEN {
        return Err(IdentityError::TooLong { length: normalized.len(), maximum: MAX_IDENTITY_LEN });
    }
    Ok(normalized)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trims_and_lowercases() {
        assert_eq!(normalize_identity("Alice@Example.Test").unwrap(), "alice@example.test");
        assert_eq!(normalize_identity("\u{2003}BOB@EXAMPLE.TEST\t").unwrap(), "bob@example.test");
        assert_eq!(normalize_identity("ÉLODIE@example.test").unwrap(), "élodie@example.test");
        assert_eq!(normalize_identity("a b").unwrap(), "a b");
    }

    #[test]
    fn rejects_empty_and_long() {
        assert_eq!(normalize_identity(""), Err(IdentityError::Empty));
        assert_eq!(normalize_identity("   "), Err(IdentityError::Empty));
        assert_eq!(normalize_identity(&"a".repeat(254)).map(|s| s.len()), Ok(254));
        assert_eq!(
            normalize_identity(&"a".repeat(255)),
            Err(IdentityError::TooLong { length: 255, maximum: 254 })
        );
        assert_eq!(
            IdentityError::TooLong { length: 255, maximum: 254 }.to_string(),
            "identity is 255 bytes long, above the maximum of 254"
        );
    }
}
