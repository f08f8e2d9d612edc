//! The demo's fixed user table.

use std::fmt;

use sha2::{Digest as _, Sha256};

/// The demo users: a fixed in-memory table of normalized identities and SHA-256 password
/// digests.
///
/// | identity | password |
/// |---|---|
/// | `alice@example.test` | `correct horse battery staple` |
/// | `bob@example.test` | `hunter2hunter2` |
///
/// A demo stand-in for an account store: a real service stores a slow password hash
/// (Argon2id, scrypt) and keeps durable lockouts of its own. Unknown identities hash the
/// password too, so they take the same path as a wrong password and both answer 401.
#[derive(Clone)]
pub struct DemoUsers {
    users: Vec<(String, [u8; 32])>,
}

impl Default for DemoUsers {
    fn default() -> Self {
        Self::new(&[
            ("alice@example.test", "correct horse battery staple"),
            ("bob@example.test", "hunter2hunter2"),
        ])
    }
}

impl DemoUsers {
    /// A table of `(normalized identity, password)` pairs.
    #[must_use]
    pub fn new(users: &[(&str, &str)]) -> Self {
        Self {
            users: users
                .iter()
                .map(|(identity, password)| ((*identity).to_owned(), digest(password)))
                .collect(),
        }
    }

    /// True when `identity` (already normalized) exists and `password` matches.
    #[must_use]
    pub fn verify(&self, identity: &str, password: &str) -> bool {
        let presented = digest(password);
        self.users.iter().any(|(known, stored)| known == identity && *stored == presented)
    }
}

fn digest(password: &str) -> [u8; 32] {
    Sha256::digest(password.as_bytes()).into()
}

impl fmt::Debug for DemoUsers {
    /// The number of users only.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DemoUsers").field("users", &self.users.len()).finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verifies_known_users_only() {
        let users = DemoUsers::default();
        assert!(users.verify("alice@example.test", "correct horse battery staple"));
        assert!(!users.verify("alice@example.test", "correct horse battery stapl"));
        assert!(!users.verify("Alice@example.test", "correct horse battery staple"));
        assert!(users.verify("bob@example.test", "hunter2hunter2"));
        assert!(!users.verify("carol@example.test", "hunter2hunter2"));
        assert_eq!(format!("{users:?}"), "DemoUsers { users: 2, .. }");
    }
}
