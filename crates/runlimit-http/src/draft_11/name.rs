//! Validated quota policy names.

use std::fmt;

use runlimit_core::PolicyId;

/// Why [`PolicyName::new`] rejected a name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PolicyNameError {
    /// The name was the empty string.
    #[error("policy name is empty")]
    Empty,
    /// The name is longer than [`PolicyName::MAX_LEN`] bytes.
    #[error("policy name is {length} bytes long, above the maximum of {maximum}")]
    TooLong {
        /// The rejected length in bytes.
        length: usize,
        /// [`PolicyName::MAX_LEN`].
        maximum: usize,
    },
    /// The name contains a byte outside %x20–%x7E: a control character (tab, CR, LF, ...),
    /// DEL, or any non-ASCII character.
    #[error("policy name has a character outside printable ASCII at byte {index}")]
    InvalidCharacter {
        /// Byte offset of the first rejected byte (the first byte of a non-ASCII character).
        index: usize,
    },
}

/// The name of a quota policy as it appears in both fields: the sf-string that links a
/// `RateLimit` item to its `RateLimit-Policy` item (D11 §3, §4.1).
///
/// The application chooses which policies it discloses and under which names; nothing is
/// derived implicitly. `PolicyName::from(&policy_id)` reuses a Runlimit [`PolicyId`], which
/// is always a valid name. Two policies that share an
/// identifier (the same id with different scopes, such as a client gate and an identity
/// gate) need distinct names chosen with [`PolicyName::new`].
///
/// # Examples
///
/// ```
/// use runlimit_core::PolicyId;
/// use runlimit_http::draft_11::{PolicyName, PolicyNameError};
///
/// assert_eq!(PolicyName::new("burst")?.as_str(), "burst");
/// assert_eq!(PolicyName::from(&PolicyId::new("auth.login")?).as_str(), "auth.login");
/// assert_eq!(PolicyName::new("caf\u{e9}"), Err(PolicyNameError::InvalidCharacter { index: 3 }));
/// assert_eq!(PolicyName::new("a\tb"), Err(PolicyNameError::InvalidCharacter { index: 1 }));
/// assert_eq!(PolicyName::new(""), Err(PolicyNameError::Empty));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PolicyName(std::sync::Arc<str>);

impl PolicyName {
    /// The longest name accepted, in bytes: 1,024, the longest String every RFC 9651 parser
    /// must accept (RFC 9651 §3.3.3).
    pub const MAX_LEN: usize = 1024;

    /// Validates a policy name.
    ///
    /// Accepted: 1 to [`MAX_LEN`](Self::MAX_LEN) characters in %x20–%x7E, the characters an
    /// RFC 9651 String may hold (§3.3.3), which D11 §3 requires for the item value. `"` and
    /// `\` are allowed and escaped when serialized. Empty names are Runlimit's own
    /// restriction: RFC 9651 allows an empty String, but an empty name cannot link a
    /// `RateLimit` item to its policy.
    ///
    /// # Errors
    ///
    /// - [`PolicyNameError::Empty`] for `""`;
    /// - [`PolicyNameError::TooLong`] above [`MAX_LEN`](Self::MAX_LEN) bytes;
    /// - [`PolicyNameError::InvalidCharacter`] naming the first byte outside %x20–%x7E
    ///   (control characters, DEL, non-ASCII).
    pub fn new(name: &str) -> Result<Self, PolicyNameError> {
        if name.is_empty() {
            return Err(PolicyNameError::Empty);
        }
        if name.len() > Self::MAX_LEN {
            return Err(PolicyNameError::TooLong { length: name.len(), maximum: Self::MAX_LEN });
        }
        if let Some(index) = name.bytes().position(|byte| !(0x20..=0x7e).contains(&byte)) {
            return Err(PolicyNameError::InvalidCharacter { index });
        }
        Ok(Self(name.into()))
    }

    /// The name, unescaped.
    #[must_use]
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl From<&PolicyId> for PolicyName {
    /// Uses the policy identifier as the name. Infallible: a [`PolicyId`] holds 1 to 64
    /// bytes of ASCII letters, digits, `.`, `_`, `-` and `:`, all valid sf-string characters.
    fn from(id: &PolicyId) -> Self {
        Self(id.as_str().into())
    }
}

impl TryFrom<&str> for PolicyName {
    type Error = PolicyNameError;

    /// [`PolicyName::new`].
    fn try_from(name: &str) -> Result<Self, Self::Error> {
        Self::new(name)
    }
}

impl std::str::FromStr for PolicyName {
    type Err = PolicyNameError;

    /// [`PolicyName::new`].
    fn from_str(name: &str) -> Result<Self, Self::Err> {
        Self::new(name)
    }
}

impl AsRef<str> for PolicyName {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for PolicyName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("PolicyName").field(&&*self.0).finish()
    }
}

impl fmt::Display for PolicyName {
    /// The unescaped name.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}
