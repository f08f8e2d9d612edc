//! Validated policy and scope identifiers.

use std::fmt;

/// The longest identifier accepted by [`PolicyId::new`] and [`ScopeId::new`], in bytes.
pub const MAX_IDENTIFIER_LEN: usize = 64;

/// Why a [`PolicyId`] or [`ScopeId`] was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum IdentifierError {
    /// The identifier was the empty string.
    #[error("{kind} is empty")]
    Empty {
        /// Which identifier: `"policy id"` or `"scope id"`.
        kind: &'static str,
    },
    /// The identifier is longer than [`MAX_IDENTIFIER_LEN`] bytes.
    #[error("{kind} is {length} bytes long, above the maximum of {maximum}")]
    TooLong {
        /// Which identifier: `"policy id"` or `"scope id"`.
        kind: &'static str,
        /// The rejected length in bytes.
        length: usize,
        /// [`MAX_IDENTIFIER_LEN`].
        maximum: usize,
    },
    /// The identifier contains a character outside the documented set, or does not
    /// start with an ASCII letter or digit.
    #[error("{kind} has a disallowed character at byte {index}")]
    InvalidCharacter {
        /// Which identifier: `"policy id"` or `"scope id"`.
        kind: &'static str,
        /// Byte offset of the first rejected character.
        index: usize,
    },
}

fn validate(kind: &'static str, value: &str) -> Result<(), IdentifierError> {
    if value.is_empty() {
        return Err(IdentifierError::Empty { kind });
    }
    if value.len() > MAX_IDENTIFIER_LEN {
        return Err(IdentifierError::TooLong { kind, length: value.len(), maximum: MAX_IDENTIFIER_LEN });
    }
    for (index, byte) in value.bytes().enumerate() {
        let allowed =
            byte.is_ascii_alphanumeric() || (index > 0 && matches!(byte, b'.' | b'_' | b'-' | b':'));
        if !allowed {
            return Err(IdentifierError::InvalidCharacter { kind, index });
        }
    }
    Ok(())
}

macro_rules! identifier {
    ($(#[$meta:meta])* $name:ident, $kind:literal) => {
        $(#[$meta])*
        #[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub struct $name(Box<str>);

        impl $name {
            #[doc = concat!("Validates and wraps a ", $kind, ".")]
            ///
            /// Accepted: 1 to [`MAX_IDENTIFIER_LEN`] (64) bytes of ASCII letters, digits,
            /// `.`, `_`, `-` and `:`, starting with a letter or digit. Letter case is kept
            /// and significant. The set is safe inside an RFC 9651 String, a log field and
            /// a metrics label without escaping.
            ///
            /// # Errors
            ///
            /// [`IdentifierError::Empty`], [`IdentifierError::TooLong`] or
            /// [`IdentifierError::InvalidCharacter`] naming the first offending byte.
            pub fn new(value: &str) -> Result<Self, IdentifierError> {
                validate($kind, value)?;
                Ok(Self(value.into()))
            }

            /// The validated identifier text.
            #[must_use]
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.debug_tuple(stringify!($name)).field(&&*self.0).finish()
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }

        impl std::str::FromStr for $name {
            type Err = IdentifierError;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                Self::new(s)
            }
        }

        #[cfg(feature = "serde")]
        impl serde::Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.serialize_str(&self.0)
            }
        }

        #[cfg(feature = "serde")]
        impl<'de> serde::Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                let text = <std::borrow::Cow<'de, str> as serde::Deserialize>::deserialize(deserializer)?;
                Self::new(&text).map_err(serde::de::Error::custom)
            }
        }
    };
}

identifier!(
    /// The name of a rate-limit policy, such as `auth.login` or `api.read`.
    ///
    /// Part of every policy's identity: it is fingerprinted into the storage key and
    /// domain-separates [`KeyHasher`](crate::KeyHasher) derivation.
    PolicyId,
    "policy id"
);

identifier!(
    /// The scope a policy counts within, such as `client` or `identity`.
    ///
    /// Two policies with one [`PolicyId`] and different scopes count independently, so one
    /// route can gate both the client address and the account it names.
    ScopeId,
    "scope id"
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_documented_set() {
        assert_eq!(PolicyId::new("auth.login").map(|p| p.to_string()), Ok("auth.login".into()));
        assert!(ScopeId::new("a-b_c:d.9").is_ok());
        assert!(PolicyId::new(&"x".repeat(64)).is_ok());
    }

    #[test]
    fn rejects_with_named_reason() {
        assert_eq!(PolicyId::new(""), Err(IdentifierError::Empty { kind: "policy id" }));
        assert_eq!(
            ScopeId::new(&"x".repeat(65)),
            Err(IdentifierError::TooLong { kind: "scope id", length: 65, maximum: 64 })
        );
        assert_eq!(
            PolicyId::new("a b"),
            Err(IdentifierError::InvalidCharacter { kind: "policy id", index: 1 })
        );
        assert_eq!(
            PolicyId::new(".a"),
            Err(IdentifierError::InvalidCharacter { kind: "policy id", index: 0 })
        );
        assert_eq!(
            PolicyId::new("caf\u{e9}"),
            Err(IdentifierError::InvalidCharacter { kind: "policy id", index: 3 })
        );
    }
}
