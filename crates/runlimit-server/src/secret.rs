//! The HMAC key secret: a file, an environment variable, or a random one for this process.

use std::{
    ffi::OsString,
    path::{Path, PathBuf},
};

use runlimit_core::{KeyHasher, KeyHasherError, MIN_SECRET_LEN};
use zeroize::Zeroize as _;

/// The environment variable that may hold the key secret itself: its raw bytes (not hex or
/// base64), at least [`MIN_SECRET_LEN`] (32) of them.
pub const KEY_SECRET_ENV: &str = "RUNLIMIT_KEY_SECRET";

/// Where the key secret came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeySecretSource {
    /// `--key-secret-file`.
    File,
    /// [`KEY_SECRET_ENV`].
    Environment,
    /// Neither was given: 32 random bytes for this process only, so counters are not shared
    /// with other replicas and do not survive a restart.
    Ephemeral,
}

/// Why no key hasher could be built.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KeySecretError {
    /// Both `--key-secret-file` and [`KEY_SECRET_ENV`] are set.
    #[error("both --key-secret-file and RUNLIMIT_KEY_SECRET are set; give the secret one way only")]
    Ambiguous,
    /// The secret file could not be read.
    #[error("cannot read the key secret file {}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
    /// The secret is shorter than [`MIN_SECRET_LEN`] bytes.
    #[error("the key secret ({origin}) is {length} bytes long, below the minimum of {minimum}")]
    TooShort {
        /// `--key-secret-file PATH` or `RUNLIMIT_KEY_SECRET`.
        origin: String,
        /// Its length in bytes (never its content).
        length: usize,
        /// [`MIN_SECRET_LEN`].
        minimum: usize,
    },
    /// The operating system's random number generator failed.
    #[error("failed to generate an ephemeral key secret")]
    Random {
        /// The generator's error.
        #[source]
        source: getrandom::Error,
    },
}

/// Builds the subject-key hasher from `file` (its bytes, less one trailing `\n` or `\r\n`, so
/// a file written by `echo` works) or from `environment` (the value of [`KEY_SECRET_ENV`], its
/// bytes as they are), or from 32 random bytes when neither is given, which the caller must
/// announce. Every copy of the secret is zeroized once the hasher holds its keyed state.
///
/// # Errors
///
/// [`KeySecretError::Ambiguous`] when both are given; [`KeySecretError::Read`] for an
/// unreadable file; [`KeySecretError::TooShort`] below [`MIN_SECRET_LEN`] bytes;
/// [`KeySecretError::Random`] when the random number generator fails.
pub fn key_hasher(
    file: Option<&Path>,
    environment: Option<OsString>,
) -> Result<(KeyHasher, KeySecretSource), KeySecretError> {
    let (mut secret, source, origin) = match (file, environment) {
        (Some(_), Some(_)) => return Err(KeySecretError::Ambiguous),
        (Some(path), None) => {
            let mut bytes = std::fs::read(path)
                .map_err(|source| KeySecretError::Read { path: path.to_owned(), source })?;
            if bytes.ends_with(b"\r\n") {
                bytes.truncate(bytes.len() - 2);
            } else if bytes.ends_with(b"\n") {
                bytes.truncate(bytes.len() - 1);
            }
            (bytes, KeySecretSource::File, format!("--key-secret-file {}", path.display()))
        }
        (None, Some(value)) => {
            (value.into_encoded_bytes(), KeySecretSource::Environment, KEY_SECRET_ENV.to_owned())
        }
        (None, None) => {
            let mut bytes = vec![0u8; MIN_SECRET_LEN];
            getrandom::fill(&mut bytes).map_err(|source| KeySecretError::Random { source })?;
            (bytes, KeySecretSource::Ephemeral, "generated".to_owned())
        }
    };
    let hasher = KeyHasher::new(&secret);
    let length = secret.len();
    secret.zeroize();
    match hasher {
        Ok(hasher) => Ok((hasher, source)),
        Err(KeyHasherError::SecretTooShort { minimum, .. }) => {
            Err(KeySecretError::TooShort { origin, length, minimum })
        }
        // `KeyHasherError` is non-exhaustive; every variant today is a length problem.
        Err(_) => Err(KeySecretError::TooShort { origin, length, minimum: MIN_SECRET_LEN }),
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write as _;

    use runlimit_core::{FixedWindowPolicy, PolicyId, ScopeId};

    use super::*;

    fn subject(hasher: &KeyHasher) -> runlimit_core::SubjectKey {
        let policy = FixedWindowPolicy::new(
            PolicyId::new("p").unwrap(),
            ScopeId::new("s").unwrap(),
            1,
            std::time::Duration::from_secs(1),
        )
        .unwrap();
        hasher.hash_for(&policy, b"x").into_unbound_subject_key()
    }

    #[test]
    fn a_file_secret_loses_one_trailing_newline() {
        let secret = "0123456789abcdef0123456789abcdef";
        let mut file = tempfile::NamedTempFile::new().unwrap();
        writeln!(file, "{secret}").unwrap();
        let (hasher, source) = key_hasher(Some(file.path()), None).unwrap();
        assert_eq!(source, KeySecretSource::File);
        assert_eq!(subject(&hasher), subject(&KeyHasher::new(secret.as_bytes()).unwrap()));
    }

    #[test]
    fn the_environment_secret_is_used_as_bytes() {
        let secret = "0123456789abcdef0123456789abcdef\n";
        let (hasher, source) = key_hasher(None, Some(secret.into())).unwrap();
        assert_eq!(source, KeySecretSource::Environment);
        assert_eq!(subject(&hasher), subject(&KeyHasher::new(secret.as_bytes()).unwrap()));
    }

    #[test]
    fn short_ambiguous_and_missing_secrets() {
        let error = key_hasher(None, Some("short".into())).unwrap_err();
        assert_eq!(
            error.to_string(),
            "the key secret (RUNLIMIT_KEY_SECRET) is 5 bytes long, below the minimum of 32"
        );
        let file = tempfile::NamedTempFile::new().unwrap();
        assert!(matches!(key_hasher(Some(file.path()), Some("x".into())), Err(KeySecretError::Ambiguous)));
        let error = key_hasher(Some(Path::new("/nonexistent/secret")), None).unwrap_err();
        assert_eq!(error.to_string(), "cannot read the key secret file /nonexistent/secret");
        let (first, source) = key_hasher(None, None).unwrap();
        let (second, _) = key_hasher(None, None).unwrap();
        assert_eq!(source, KeySecretSource::Ephemeral);
        assert_ne!(subject(&first), subject(&second));
    }
}
