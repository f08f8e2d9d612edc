//! What a rule file can get wrong.

use std::{
    fmt::{self, Write as _},
    io,
    path::PathBuf,
};

use crate::escape::{EscapeControls, Escaped};

/// One problem in the rule files: the file, where in its document, and what is wrong.
///
/// Displayed as `FILE: PATH: MESSAGE`, for example
/// `ratelimit.yaml: descriptors[2].rate_limit.unit: unknown unit `minutes`; expected one of
/// second, minute, hour, day, week, month, year (any letter case)`. The path is the
/// document path of the offending value (`descriptors[2]` is the third entry of the top-level
/// list); it is left out for problems of the file as a whole. YAML syntax and type errors
/// carry the YAML reader's own path and its line and column instead.
///
/// The display is one line: every control character of the file name, the path and the
/// message (a key or value of the file holding a line feed or a terminal escape), and every
/// bidirectional formatting character, is escaped as `char::escape_debug` writes it (`\n`,
/// `\u{1b}`, `\u{202e}`). The accessors return the text as found.
#[derive(Debug)]
pub struct ConfigError {
    file: PathBuf,
    location: String,
    kind: ConfigErrorKind,
}

impl ConfigError {
    pub(crate) fn new(file: impl Into<PathBuf>, location: impl Into<String>, kind: ConfigErrorKind) -> Self {
        Self { file: file.into(), location: location.into(), kind }
    }

    /// The file the problem is in (the directory, for [`ConfigErrorKind::NoRuleFiles`]).
    #[must_use]
    pub fn file(&self) -> &std::path::Path {
        &self.file
    }

    /// The document path of the offending value (`descriptors[2].rate_limit.unit`), or `""`
    /// for the file as a whole and for YAML errors, whose message carries its own path.
    #[must_use]
    pub fn location(&self) -> &str {
        &self.location
    }

    /// What is wrong.
    #[must_use]
    pub fn kind(&self) -> &ConfigErrorKind {
        &self.kind
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut out = EscapeControls(f);
        write!(out, "{}: ", self.file.display())?;
        if !self.location.is_empty() {
            write!(out, "{}: ", self.location)?;
        }
        write!(out, "{}", self.kind)
    }
}

impl std::error::Error for ConfigError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match &self.kind {
            ConfigErrorKind::Read { source } => Some(source),
            _ => None,
        }
    }
}

/// Every problem found in a set of rule files, in file order and, within a file, in
/// document order. Never empty.
///
/// Displayed one problem per line, each followed by its causes (`: ` and the operating
/// system's error, for [`ConfigErrorKind::Read`]), since this list is the whole report.
/// Control characters are escaped (see [`ConfigError`]), so each problem is exactly one line.
#[derive(Debug)]
pub struct ConfigErrors {
    errors: Vec<ConfigError>,
}

impl ConfigErrors {
    pub(crate) fn new(errors: Vec<ConfigError>) -> Self {
        debug_assert!(!errors.is_empty());
        Self { errors }
    }

    /// The problems, at least one.
    #[must_use]
    pub fn errors(&self) -> &[ConfigError] {
        &self.errors
    }
}

impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (index, error) in self.errors.iter().enumerate() {
            if index > 0 {
                writeln!(f)?;
            }
            write!(f, "{error}")?;
            let mut source = std::error::Error::source(error);
            while let Some(cause) = source {
                write!(EscapeControls(&mut *f), ": {cause}")?;
                source = cause.source();
            }
        }
        Ok(())
    }
}

impl std::error::Error for ConfigErrors {}

/// The message of [`ConfigErrorKind::TooLarge`].
fn too_large(maximum: u64, before: u64) -> String {
    if before == 0 {
        format!("is larger than {maximum} bytes, the most one load reads from its rule files")
    } else {
        format!(
            "is larger than the {} bytes left of the {maximum} one load reads from its rule files \
             (the files before it hold {before})",
            maximum.saturating_sub(before)
        )
    }
}

/// What is wrong, without where. The display of each variant is the sentence
/// [`ConfigError`] shows after the path, with the control and bidirectional formatting
/// characters of the values it quotes escaped (`\n`, `\u{1b}`, `\u{202e}`); the fields hold the
/// values as found.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigErrorKind {
    /// The file or directory could not be read.
    #[error("cannot be read")]
    Read {
        /// The operating system's error.
        #[source]
        source: io::Error,
    },
    /// A directory holds no `*.yaml` or `*.yml` file.
    #[error("holds no rule file (*.yaml or *.yml)")]
    NoRuleFiles,
    /// The file would take the rule files of one load past
    /// [`MAX_RULE_FILE_BYTES`](crate::MAX_RULE_FILE_BYTES); it was not kept, and the files
    /// after it were not read.
    #[error("{}", too_large(*.maximum, *.before))]
    TooLarge {
        /// The bound, in bytes.
        maximum: u64,
        /// The bytes of the files read before this one (0 for the first, or a file given as
        /// the path).
        before: u64,
    },
    /// An entry of the rule directory, named like a rule file, is a named pipe, a socket or a
    /// device (after following symbolic links): not read, since a named pipe would block the
    /// load until something wrote to it.
    #[error(
        "is not a regular file (a named pipe, socket or device); only regular files are read as rule files"
    )]
    NotAFile,
    /// The YAML does not parse, or a value has the wrong type (a string where a number is
    /// expected, a number out of range, a misspelled key...). The message is the YAML
    /// reader's, with the document path and the line and column.
    #[error("{}", Escaped(.message))]
    Yaml {
        /// The reader's message.
        message: String,
    },
    /// A mapping key is not a string (`0.25: x`).
    #[error("key `{}` is not a string; keys are field names such as `key` or `rate_limit`", Escaped(.key))]
    NonStringKey {
        /// The key, as YAML.
        key: String,
    },
    /// A list item is not a map (`descriptors: [a, b]`).
    #[error("is {}; every item of this list is a map (such as `key: ...`)", Escaped(.found))]
    NonMapListItem {
        /// What was found instead, with its value (`the string "a"`).
        found: String,
    },
    /// The document nests maps and lists deeper than 128 levels (the document's own map
    /// included; 63 descriptor levels with their `rate_limit` maps fit). Refused before the
    /// YAML reader reads the file, which it would do in time growing with the square of the
    /// depth.
    #[error(
        "nests maps and lists more than 128 levels deep (by line {line} column {column}); a rule file \
         may nest 128, which is 63 descriptor levels"
    )]
    TooDeep {
        /// The line, from 1, at which the file was found too deep.
        line: usize,
        /// The column, from 1.
        column: usize,
    },
    /// The document is not a map.
    #[error("the document is {}; a rule file is a map with `domain` and `descriptors`", Escaped(.found))]
    NotAMap {
        /// What was found instead.
        found: String,
    },
    /// `domain` is missing or empty.
    #[error("is missing or empty; every rule file names its domain")]
    EmptyDomain,
    /// Another file already defines the domain.
    #[error("`{}` is already defined in {}; each domain's rules live in one file", Escaped(.domain), Escaped(.other))]
    DuplicateDomain {
        /// The domain.
        domain: String,
        /// The file that defined it first.
        other: String,
    },
    /// A rule's `key` is missing or empty.
    #[error("is missing or empty; every rule has a non-empty `key`")]
    EmptyKey,
    /// Two rules of one list have the same key and value.
    #[error("duplicates the rule `{}` of the same list (same key and value)", Escaped(.rule))]
    DuplicateRule {
        /// The rule's path, `domain.key_value...`.
        rule: String,
    },
    /// `unit` is missing from a limited `rate_limit`.
    #[error("is missing; expected one of second, minute, hour, day, week, month, year")]
    MissingUnit,
    /// `unit` names no unit.
    #[error(
        "unknown unit `{}`; expected one of second, minute, hour, day, week, month, year (any letter case)",
        Escaped(.unit)
    )]
    InvalidUnit {
        /// The value found.
        unit: String,
    },
    /// `requests_per_unit` is missing from a limited `rate_limit`.
    #[error("is missing; write the number of requests allowed per unit (0 denies every request)")]
    MissingRequestsPerUnit,
    /// `unlimited: true` together with a `unit`.
    #[error("must not be given with `unlimited: true`")]
    UnlimitedWithUnit,
    /// A `replaces` entry with no name.
    #[error("is empty; each entry of `replaces` names the rule it replaces")]
    EmptyReplaces,
    /// A rule replaces itself.
    #[error("`{}` is this rule's own name; a rule cannot replace itself", Escaped(.name))]
    ReplacesSelf {
        /// The name.
        name: String,
    },
    /// A `replaces` entry names no rule of the domain.
    #[error("`{}` is the name of no rule in domain `{}`", Escaped(.name), Escaped(.domain))]
    ReplacesUnknown {
        /// The name.
        name: String,
        /// The domain.
        domain: String,
    },
    /// `share_threshold: true` on a rule whose key and value hold no `*`.
    #[error("applies only to a wildcard rule, whose value holds a `*`, but the rule is `{}`", Escaped(.rule))]
    ShareThresholdWithoutWildcard {
        /// The rule's key, or `key_value`.
        rule: String,
    },
    /// `quota_mode: true` (envoyproxy/ratelimit's soft quota groups), which this service does
    /// not implement.
    #[error(
        "`quota_mode: true` is not supported: a request here is admitted only when every matched \
         rule admits it (remove the key, or set it to false)"
    )]
    QuotaModeUnsupported,
    /// `algorithm` names no algorithm.
    #[error("unknown algorithm `{}`; expected `fixed_window` (the default) or `gcra`", Escaped(.algorithm))]
    InvalidAlgorithm {
        /// The value found.
        algorithm: String,
    },
    /// `burst` without `algorithm: gcra`.
    #[error("applies only with `algorithm: gcra`")]
    BurstWithoutGcra,
    /// Two limited rules of one domain use different algorithms.
    #[error(
        "is `{algorithm}`, but rule `{}` of the same domain uses `{other}`; every rule of a domain \
         uses one algorithm, because a request is admitted as one atomic batch of one limiter",
        Escaped(.other_rule)
    )]
    MixedAlgorithms {
        /// This rule's algorithm.
        algorithm: &'static str,
        /// The first rule of the domain with another algorithm.
        other_rule: String,
        /// That rule's algorithm.
        other: &'static str,
    },
    /// Runlimit refused the quota (a GCRA burst of 0 or above `runlimit_core::MAX_LIMIT`).
    #[error("{}", Escaped(.reason))]
    Policy {
        /// Runlimit's reason.
        reason: String,
    },
}
