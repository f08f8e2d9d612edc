//! The HMAC key secret: `RUNLIMIT_KEY_SECRET`, or an ephemeral random one.

use std::ffi::OsString;

use runlimit_core::{KeyHasher, KeyHasherError, MIN_SECRET_LEN};
use zeroize::Zeroize as _;

/// The environment variable holding the HMAC key secret: its raw bytes (not hex or base64),
/// at least [`MIN_SECRET_LEN`] (32) of them.
pub const KEY_SECRET_ENV: &str = "RUNLIMIT_KEY_SECRET";

/// Where the key secret came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeySecretSource {
    /// [`KEY_SECRET_ENV`] was set and long enough.
    Environment,
    /// [`KEY_SECRET_ENV`] was absent; 32 random bytes were generated for this process only, so
    /// counters are not shared with other replicas and do not survive a restart.
    Ephemeral,
}

/// Why no key hasher could be built.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KeySecretError {
    /// [`KEY_SECRET_ENV`] is set but shorter than [`MIN_SECRET_LEN`] bytes (an empty value
    /// counts as set).
    #[error("RUNLIMIT_KEY_SECRET is {length} bytes long, below the minimum of {minimum}")]
    TooShort {
        /// The value's length in bytes (never its content).
        length: usize,
        /// [`MIN_SECRET_LEN`].
        minimum: usize,
    },
    /// The operating system's random number generator failed while generating an ephemeral
    /// secret.
    #[error("failed to generate an ephemeral key secret")]
    Random {
        /// The generator's error.
        #[source]
        source: getrandom::Error,
    },
}

/// Builds the subject-key hasher from the value of [`KEY_SECRET_ENV`] (pass
/// `std::env::var_os(KEY_SECRET_ENV)`).
///
/// `Some(value)` uses the value's bytes as the secret (on Unix, exactly the bytes of the
/// environment entry). `None` generates 32 random bytes with `getrandom` and reports
/// [`KeySecretSource::Ephemeral`], which the caller must announce: quotas are then per
/// process and reset on restart. The secret buffer is zeroized once the hasher has
/// precomputed its keyed state.
///
/// # Errors
///
/// - [`KeySecretError::TooShort`] when the value has fewer than [`MIN_SECRET_LEN`] bytes;
/// - [`KeySecretError::Random`] when the random number generator fails.
pub fn key_hasher_from_env(value: Option<OsString>) -> Result<(KeyHasher, KeySecretSource), KeySecretError> {
    let (mut secret, source) = match value {
        Some(value) => (value.into_encoded_bytes(), KeySecretSource::Environment),
        None => {
            let mut bytes = vec![0u8; MIN_SECRET_LEN];
            getrandom::fill(&mut bytes).map_err(|source| KeySecretError::Random { source })?;
            (bytes, KeySecretSource::Ephemeral)
        }
    };
    let hasher = KeyHasher::new(&secret);
    secret.zeroize();
    match hasher {
        Ok(hasher) => Ok((hasher, source)),
        Err(KeyHasherError::SecretTooShort { length, minimum }) => {
            Err(KeySecretError::TooShort { length, minimum })
        }
        // `KeyHasherError` is non-exhaustive; every variant today is a length problem.
        Err(_) => Err(KeySecretError::TooShort { length: 0, minimum: MIN_SECRET_LEN }),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use runlimit_core::{FixedWindowPolicy, PolicyId, ScopeId};

    use super::*;

    fn policy() -> FixedWindowPolicy {
        FixedWindowPolicy::new(
            PolicyId::new("demo.login").unwrap(),
            ScopeId::new("identity").unwrap(),
            1,
            Duration::from_secs(1),
        )
        .unwrap()
    }

    #[test]
    fn environment_secret_is_used_as_bytes() {
        let secret = "0123456789abcdef0123456789abcdef";
        let (hasher, source) = key_hasher_from_env(Some(secret.into())).unwrap();
        assert_eq!(source, KeySecretSource::Environment);
        let expected = KeyHasher::new(secret.as_bytes()).unwrap();
        let policy = policy();
        assert_eq!(
            hasher.hash_for(&policy, b"x").into_unbound_subject_key(),
            expected.hash_for(&policy, b"x").into_unbound_subject_key()
        );
    }

    #[test]
    fn short_secrets_are_rejected_with_their_length() {
        let error = key_hasher_from_env(Some("short".into())).unwrap_err();
        assert_eq!(error.to_string(), "RUNLIMIT_KEY_SECRET is 5 bytes long, below the minimum of 32");
        assert!(matches!(
            key_hasher_from_env(Some("".into())),
            Err(KeySecretError::TooShort { length: 0, minimum: 32 })
        ));
        assert!(matches!(
            key_hasher_from_env(Some("x".repeat(31).into())),
            Err(KeySecretError::TooShort { length: 31, minimum: 32 })
        ));
    }

    #[test]
    fn absent_secret_is_ephemeral_and_random() {
        let (first, source) = key_hasher_from_env(None).unwrap();
        let (second, _) = key_hasher_from_env(None).unwrap();
        assert_eq!(source, KeySecretSource::Ephemeral);
        let policy = policy();
        assert_ne!(
            first.hash_for(&policy, b"x").into_unbound_subject_key(),
            second.hash_for(&policy, b"x").into_unbound_subject_key()
        );
    }
}
