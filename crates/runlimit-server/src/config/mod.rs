//! Rule files: envoyproxy/ratelimit's YAML in, a validated [`RuleTable`] (or every problem,
//! each with its file and document path) out.
//!
//! Pure apart from [`RuleTable::load`], which reads the files: [`RuleTable::from_sources`]
//! takes the texts. See the crate documentation's "Configuration" section for the format and
//! every way it differs from envoyproxy/ratelimit.

mod error;
mod glob;
mod merge;
mod nesting;
mod range;
mod yaml;

use std::{
    collections::{HashMap, HashSet},
    fmt::Write as _,
    path::{Path, PathBuf},
    time::Duration,
};

use runlimit_core::{FixedWindowPolicy, GcraPolicy, PolicyId, QuotaMode, ScopeId};
use runlimit_http::draft_11::PolicyName;
use sha2::{Digest as _, Sha256};

pub use self::error::{ConfigError, ConfigErrorKind, ConfigErrors};
pub(crate) use self::glob::Glob;
use self::yaml::{FileDoc, RateLimitDoc, RuleDoc};
use crate::escape::escape_line;

/// A rule's time unit: the length of its window (or GCRA period).
///
/// Lengths are fixed: a month is 30 days and a year 365 days, as in envoyproxy/ratelimit.
/// Windows are anchored at a key's first admission, so no unit follows the calendar.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Unit {
    /// 1 second.
    Second,
    /// 60 seconds.
    Minute,
    /// 3,600 seconds.
    Hour,
    /// 86,400 seconds.
    Day,
    /// 604,800 seconds (7 days).
    Week,
    /// 2,592,000 seconds (30 days).
    Month,
    /// 31,536,000 seconds (365 days).
    Year,
}

impl Unit {
    /// Every unit, shortest first.
    pub const ALL: [Self; 7] =
        [Self::Second, Self::Minute, Self::Hour, Self::Day, Self::Week, Self::Month, Self::Year];

    /// The unit's length in whole seconds.
    #[must_use]
    pub const fn seconds(self) -> u64 {
        match self {
            Self::Second => 1,
            Self::Minute => 60,
            Self::Hour => 3_600,
            Self::Day => 86_400,
            Self::Week => 604_800,
            Self::Month => 2_592_000,
            Self::Year => 31_536_000,
        }
    }

    /// The unit's length.
    #[must_use]
    pub const fn duration(self) -> Duration {
        Duration::from_secs(self.seconds())
    }

    /// The lowercase name the rule files use (`second` ... `year`).
    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            Self::Second => "second",
            Self::Minute => "minute",
            Self::Hour => "hour",
            Self::Day => "day",
            Self::Week => "week",
            Self::Month => "month",
            Self::Year => "year",
        }
    }

    /// The unit named `name` in any letter case, as envoyproxy/ratelimit reads it.
    #[must_use]
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|unit| unit.name().eq_ignore_ascii_case(name))
    }
}

/// The algorithm of a domain's rules.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Algorithm {
    /// Runlimit's anchored fixed windows: `requests_per_unit` per window of one unit, the window
    /// starting at a key's first admission (the default).
    FixedWindow,
    /// Runlimit's exact GCRA (extension `algorithm: gcra`): `requests_per_unit` replenished
    /// evenly over each unit, at most `burst` at once.
    Gcra,
}

impl Algorithm {
    /// The name the rule files use: `fixed_window` or `gcra`.
    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            Self::FixedWindow => "fixed_window",
            Self::Gcra => "gcra",
        }
    }
}

/// The Runlimit policy of a limited rule.
#[derive(Clone, Debug)]
pub(crate) enum RulePolicy {
    FixedWindow(FixedWindowPolicy),
    Gcra(GcraPolicy),
}

impl RulePolicy {
    pub(crate) fn with_quota_mode(self, mode: QuotaMode) -> Self {
        match self {
            Self::FixedWindow(policy) => Self::FixedWindow(policy.with_quota_mode(mode)),
            Self::Gcra(policy) => Self::Gcra(policy.with_quota_mode(mode)),
        }
    }
}

/// What a rule does to the descriptors it matches.
#[derive(Clone, Debug)]
pub(crate) enum Quota {
    /// `unlimited: true`: answered `OK` without touching storage.
    Unlimited,
    /// A limit of `requests_per_unit` per `unit`; `policy` is `None` exactly when
    /// `requests_per_unit` is 0 (every request denied, nothing stored).
    Limited { requests_per_unit: u32, unit: Unit, policy: Option<RulePolicy> },
}

/// One rule with a `rate_limit` block.
#[derive(Clone, Debug)]
pub(crate) struct Rule {
    /// `domain.key_value.key...`, envoyproxy/ratelimit's name for the rule (its stats key).
    pub(crate) path: Box<str>,
    /// `rate_limit.name`.
    pub(crate) name: Option<Box<str>>,
    /// `rate_limit.replaces[].name`.
    pub(crate) replaces: Box<[Box<str>]>,
    pub(crate) quota: Quota,
    /// `shadow_mode: true` on the rule, or the server's global shadow mode.
    pub(crate) shadow: bool,
    /// The name of the rule in `RateLimit-Policy` / `RateLimit` fields: `name`, else the
    /// path, else (a path outside printable ASCII) the policy identifier.
    pub(crate) header_name: PolicyName,
    /// The rule's identity: its domain and descriptor path, as keys and values (two rules
    /// whose `path` texts are equal, key `a_b` and key `a` with value `b`, differ here).
    pub(crate) identity: PolicyId,
    /// The `share_threshold` patterns along the rule's path, in order (empty: none); they
    /// decide which values share a counter.
    pub(crate) shared: Box<str>,
    /// `detailed_metric: true`: the per-rule metrics name this rule by the request's values
    /// (capped, see the `metrics` module), not by its `name` or path.
    pub(crate) detailed_metric: bool,
}

/// A node of a domain's rule tree: a matched rule entry, its rule (if it has a `rate_limit`)
/// and its children.
#[derive(Debug, Default)]
pub(crate) struct Node {
    pub(crate) rule: Option<usize>,
    /// With `share_threshold: true`: the rule's wildcard pattern (`key_value*`), which takes
    /// the place of the matched entry in the subject, so every match shares one counter.
    pub(crate) share: Option<Box<str>>,
    pub(crate) children: Level,
}

/// The rules of one `descriptors` list.
#[derive(Debug, Default)]
pub(crate) struct Level {
    /// By key: the rules with a plain value, and the key-only rule.
    pub(crate) keys: HashMap<Box<str>, KeyRules>,
    /// The rules whose `key_value` holds a `*`, in file order (the first match wins).
    pub(crate) wildcards: Vec<(Glob, Node)>,
}

impl Level {
    pub(crate) fn is_empty(&self) -> bool {
        self.keys.is_empty() && self.wildcards.is_empty()
    }
}

/// The plain rules of one key within a list.
#[derive(Debug, Default)]
pub(crate) struct KeyRules {
    pub(crate) values: HashMap<Box<str>, Node>,
    pub(crate) default: Option<Node>,
}

/// One domain's rules.
#[derive(Debug)]
pub(crate) struct Domain {
    pub(crate) name: Box<str>,
    pub(crate) algorithm: Algorithm,
    pub(crate) root: Level,
    pub(crate) rules: Vec<Rule>,
}

/// A validated set of rule files: every domain, its rule tree and each rule's Runlimit policy.
///
/// Built by [`load`](Self::load) from a file or a directory, or by
/// [`from_sources`](Self::from_sources) from texts. Immutable; the service evaluates every
/// request against one table.
///
/// # Counter identity
///
/// A limited rule's Runlimit policy is identified by its domain and its descriptor path
/// (the keys and values from the top-level list down to the rule), and Runlimit fingerprints
/// the policy's limit, window (or GCRA period and burst) and algorithm into every storage
/// key. So, across restarts or replicas sharing a backend:
///
/// - editing anything else (comments, other rules, `name`, `replaces`, `shadow_mode`, the file
///   name or the order of rules) keeps the rule's counters;
/// - changing its `requests_per_unit`, `unit`, `algorithm` or `burst`, or its path, starts it
///   afresh: every client gets the new limit's full quota at once. This is Runlimit's rule
///   (a counter is never reinterpreted under another limit); `runlimit-server check-config
///   --previous OLD NEW` lists the rules a change restarts.
pub struct RuleTable {
    domains: HashMap<Box<str>, Domain>,
    files: Vec<PathBuf>,
}

impl std::fmt::Debug for RuleTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RuleTable")
            .field("domains", &self.domains.len())
            .field("rules", &self.rule_count())
            .field("files", &self.files)
            .finish()
    }
}

impl RuleTable {
    /// Reads the rule file at `path`, or every `*.yaml` and `*.yml` file directly in the
    /// directory at `path` (in file-name order; names starting with `.` and subdirectories
    /// are skipped, symbolic links are followed, as in a Kubernetes ConfigMap mount; a rule
    /// file's link that leads nowhere readable is a read error, not skipped).
    ///
    /// # Errors
    ///
    /// Every problem found ([`ConfigErrors`]): an unreadable path or file
    /// ([`ConfigErrorKind::Read`]), a directory without rule files
    /// ([`ConfigErrorKind::NoRuleFiles`]), a directory entry that is not a regular file
    /// ([`ConfigErrorKind::NotAFile`]), rule files of more than [`MAX_RULE_FILE_BYTES`]
    /// together ([`ConfigErrorKind::TooLarge`], naming the file that passes the bound; the files
    /// after it are not read), and every problem [`from_sources`](Self::from_sources) reports.
    pub fn load(path: &Path) -> Result<Self, ConfigErrors> {
        Self::from_sources(read_sources(path)?)
    }

    /// Validates rule files given as `(name, YAML text)` pairs; the name is what errors show.
    ///
    /// # Errors
    ///
    /// Every problem found, in source order ([`ConfigErrors`]; each is a [`ConfigError`]
    /// naming the file, the document path and one of the [`ConfigErrorKind`]s).
    pub fn from_sources<N: Into<PathBuf>, T: AsRef<str>>(
        sources: impl IntoIterator<Item = (N, T)>,
    ) -> Result<Self, ConfigErrors> {
        let mut domains: HashMap<Box<str>, Domain> = HashMap::new();
        let mut defined_in: HashMap<Box<str>, PathBuf> = HashMap::new();
        let mut files = Vec::new();
        let mut errors = Vec::new();
        for (name, text) in sources {
            let file: PathBuf = name.into();
            files.push(file.clone());
            let before = errors.len();
            let Some(doc) = parse(&file, text.as_ref(), &mut errors) else { continue };
            let domain_name = doc.domain.as_deref().unwrap_or("");
            if domain_name.is_empty() {
                errors.push(ConfigError::new(&file, "domain", ConfigErrorKind::EmptyDomain));
                continue;
            }
            // A second definition is still compiled, so its own problems are reported too.
            if let Some(other) = defined_in.get(domain_name) {
                errors.push(ConfigError::new(
                    &file,
                    "domain",
                    ConfigErrorKind::DuplicateDomain {
                        domain: domain_name.to_owned(),
                        other: other.display().to_string(),
                    },
                ));
            } else {
                defined_in.insert(domain_name.into(), file.clone());
            }
            let domain =
                compile_domain(&file, domain_name, doc.descriptors.as_deref().unwrap_or(&[]), &mut errors);
            if errors.len() == before {
                domains.insert(domain_name.into(), domain);
            }
        }
        if errors.is_empty() { Ok(Self { domains, files }) } else { Err(ConfigErrors::new(errors)) }
    }

    /// The files the table was read from, in load order.
    #[must_use]
    pub fn files(&self) -> &[PathBuf] {
        &self.files
    }

    /// The number of domains.
    #[must_use]
    pub fn domain_count(&self) -> usize {
        self.domains.len()
    }

    /// The number of rules with a `rate_limit` block, in every domain.
    #[must_use]
    pub fn rule_count(&self) -> usize {
        self.domains.values().map(|domain| domain.rules.len()).sum()
    }

    /// Every limited rule (`domain.key_value...` path) with its limit, as
    /// `path: N per UNIT (ALGORITHM)` lines sorted by path; `unlimited` rules read
    /// `path: unlimited`. Shadow-mode rules end in ` [shadow]`. Control and bidirectional
    /// formatting characters of the keys and values are escaped (`\n`, `\u{1b}`, `\u{202e}`), so
    /// each line is one line.
    #[must_use]
    pub fn describe(&self) -> Vec<String> {
        let mut lines: Vec<String> = self
            .domains
            .values()
            .flat_map(|domain| domain.rules.iter().map(move |rule| escape_line(describe_rule(domain, rule))))
            .collect();
        lines.sort();
        lines
    }

    /// Every rule with a `rate_limit`, one line each, sorted, in envoyproxy/ratelimit's
    /// `/rlconfig` form: `PATH: unit=MINUTE requests_per_unit=5, shadow_mode: false`, with
    /// `, algorithm: gcra, burst: B` for a GCRA rule and `PATH: unlimited, shadow_mode: false`
    /// for an unlimited one. `shadow_mode` is true under the server's global shadow mode too.
    /// Control and bidirectional formatting characters of the keys and values are escaped
    /// (`\n`, `\u{1b}`, `\u{202e}`).
    #[must_use]
    pub fn dump(&self) -> Vec<String> {
        let mut lines: Vec<String> = self
            .domains
            .values()
            .flat_map(|domain| domain.rules.iter())
            .map(|rule| {
                let mut line = format!("{}: ", rule.path);
                match &rule.quota {
                    Quota::Unlimited => line.push_str("unlimited"),
                    Quota::Limited { requests_per_unit, unit, policy } => {
                        let _ = write!(
                            line,
                            "unit={} requests_per_unit={requests_per_unit}",
                            unit.name().to_ascii_uppercase()
                        );
                        if let Some(RulePolicy::Gcra(gcra)) = policy {
                            let _ = write!(line, ", algorithm: gcra, burst: {}", gcra.burst_capacity());
                        }
                    }
                }
                let _ = write!(line, ", shadow_mode: {}", rule.shadow);
                escape_line(line)
            })
            .collect();
        lines.sort();
        lines
    }

    /// The rules whose counters a change from `previous` to `self` starts afresh: every rule
    /// present in both (same domain and descriptor path, compared as keys and values) whose
    /// limit, unit, algorithm or burst differs, or whose `share_threshold` patterns along the
    /// path differ (which values share a counter), as `path: OLD -> NEW` lines sorted by path,
    /// control and bidirectional formatting characters escaped (`\n`, `\u{1b}`, `\u{202e}`).
    /// Rules only in one of the tables are not listed (a new rule starts fresh, a removed one
    /// is gone).
    #[must_use]
    pub fn restarted_counters(&self, previous: &Self) -> Vec<String> {
        let mut lines = Vec::new();
        for (name, domain) in &self.domains {
            let Some(old_domain) = previous.domains.get(name) else { continue };
            let old_rules: HashMap<&PolicyId, &Rule> =
                old_domain.rules.iter().map(|rule| (&rule.identity, rule)).collect();
            for rule in &domain.rules {
                let Some(old) = old_rules.get(&rule.identity) else { continue };
                let (old_text, new_text) = (counter_text(old_domain, old), counter_text(domain, rule));
                if old_text != new_text {
                    lines.push(escape_line(format!("{}: {old_text} -> {new_text}", rule.path)));
                }
            }
        }
        lines.sort();
        lines
    }

    /// The domain named `name`.
    pub(crate) fn domain(&self, name: &str) -> Option<&Domain> {
        self.domains.get(name)
    }

    /// The same table with every limited rule in shadow mode (the server's global shadow
    /// mode): quota exhaustion is reported and counted, never enforced.
    #[must_use]
    pub(crate) fn into_shadow(mut self) -> Self {
        for domain in self.domains.values_mut() {
            for rule in &mut domain.rules {
                rule.shadow = true;
                if let Quota::Limited { policy, .. } = &mut rule.quota {
                    *policy = policy.take().map(|policy| policy.with_quota_mode(QuotaMode::Shadow));
                }
            }
        }
        self
    }

    /// Every domain.
    pub(crate) fn domains(&self) -> impl Iterator<Item = &Domain> {
        self.domains.values()
    }
}

fn limit_text(domain: &Domain, rule: &Rule) -> String {
    match &rule.quota {
        Quota::Unlimited => "unlimited".to_owned(),
        Quota::Limited { requests_per_unit, unit, policy } => {
            let mut text = format!("{requests_per_unit} per {}", unit.name());
            match policy {
                Some(RulePolicy::Gcra(gcra)) => {
                    let _ = write!(text, " (gcra, burst {})", gcra.burst_capacity());
                }
                _ => {
                    let _ = write!(text, " ({})", domain.algorithm.name());
                }
            }
            text
        }
    }
}

/// [`limit_text`], and which `share_threshold` patterns make values share its counters.
fn counter_text(domain: &Domain, rule: &Rule) -> String {
    let mut text = limit_text(domain, rule);
    if !rule.shared.is_empty() {
        let _ = write!(text, ", shared by {}", rule.shared);
    }
    text
}

fn describe_rule(domain: &Domain, rule: &Rule) -> String {
    let mut line = format!("{}: {}", rule.path, limit_text(domain, rule));
    if rule.shadow && matches!(rule.quota, Quota::Limited { .. }) {
        line.push_str(" [shadow]");
    }
    line
}

/// The most bytes one load reads from its rule files together: 64 MiB (67,108,864 bytes).
///
/// A load refuses the file that would take it past this bound
/// ([`ConfigErrorKind::TooLarge`]): a regular file by its size, before reading it; anything
/// else (a device such as `/dev/zero` given as the path) after reading one byte more than is
/// left. The files after it are not read. So a path that is not the rule files it should be, or
/// a generated file grown without end, is refused, and a reload keeps the rules in force,
/// instead of exhausting the process's memory. A file that cannot be read does not count.
/// Reading YAML takes many times a file's size in memory (a 26 MB rule set of 300,000 rules
/// takes about 1 GB to load), so the bound leaves room for rule sets several times the largest
/// known.
pub const MAX_RULE_FILE_BYTES: u64 = 64 * 1024 * 1024;

/// The rule files of `path` (see [`RuleTable::load`]) and their texts, in load order.
pub(crate) fn read_sources(path: &Path) -> Result<Vec<(PathBuf, String)>, ConfigErrors> {
    read_sources_within(path, MAX_RULE_FILE_BYTES)
}

/// [`read_sources`] with `maximum` bytes in place of [`MAX_RULE_FILE_BYTES`].
fn read_sources_within(path: &Path, maximum: u64) -> Result<Vec<(PathBuf, String)>, ConfigErrors> {
    let (files, listed) = rule_files(path).map_err(|error| ConfigErrors::new(vec![error]))?;
    let mut sources = Vec::with_capacity(files.len());
    let mut errors = Vec::new();
    let mut before = 0u64;
    for file in files {
        let kind = match read_within(&file, maximum.saturating_sub(before), listed) {
            // A UTF-8 byte order mark is not part of the document (envoyproxy/ratelimit's YAML
            // reader skips it too).
            Ok(Read::Text(mut text)) => {
                before = before.saturating_add(text.len() as u64);
                if text.starts_with('\u{feff}') {
                    text.drain(..'\u{feff}'.len_utf8());
                }
                sources.push((file, text));
                continue;
            }
            Ok(Read::TooLarge) => {
                errors.push(ConfigError::new(file, "", ConfigErrorKind::TooLarge { maximum, before }));
                // The files after it are not read: nothing more fits.
                break;
            }
            Ok(Read::NotAFile) => ConfigErrorKind::NotAFile,
            Err(source) => ConfigErrorKind::Read { source },
        };
        errors.push(ConfigError::new(file, "", kind));
    }
    if errors.is_empty() { Ok(sources) } else { Err(ConfigErrors::new(errors)) }
}

/// What [`read_within`] found.
enum Read {
    /// The file's text.
    Text(String),
    /// More bytes than the limit.
    TooLarge,
    /// Not a regular file, in a listed directory.
    NotAFile,
}

/// The text of `file` when it holds at most `limit` bytes. A regular file larger than `limit`
/// is refused by its size, unread; anything else by reading `limit` + 1 bytes of it, whatever
/// its size. With `listed` (the file is an entry of the directory given as the path), only a
/// regular file (after following symbolic links) is opened: a named pipe would block the load
/// until a writer came, a device or socket is no rule file. Fails as
/// `std::fs::read_to_string` does: the operating system's error, or `InvalidData` ("stream did
/// not contain valid UTF-8").
fn read_within(file: &Path, limit: u64, listed: bool) -> std::io::Result<Read> {
    use std::io::Read as _;
    let metadata = std::fs::metadata(file)?;
    if metadata.is_file() && metadata.len() > limit {
        return Ok(Read::TooLarge);
    }
    if listed && !metadata.is_file() {
        return Ok(Read::NotAFile);
    }
    let file = std::fs::File::open(file)?;
    // Sized once for a regular file, as `read_to_string` does; anything else reports 0 and grows.
    let expected = if metadata.is_file() { metadata.len() } else { 0 };
    let mut bytes = Vec::with_capacity(usize::try_from(expected).unwrap_or(0));
    // A file that grows while it is read is bounded all the same.
    file.take(limit.saturating_add(1)).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > limit {
        return Ok(Read::TooLarge);
    }
    String::from_utf8(bytes).map(Read::Text).map_err(|_| {
        std::io::Error::new(std::io::ErrorKind::InvalidData, "stream did not contain valid UTF-8")
    })
}

/// The rule files of `path`: itself, or the `*.yaml` / `*.yml` files directly in it; and
/// whether they were listed from a directory.
fn rule_files(path: &Path) -> Result<(Vec<PathBuf>, bool), ConfigError> {
    let read = |source| ConfigError::new(path, "", ConfigErrorKind::Read { source });
    let metadata = std::fs::metadata(path).map_err(read)?;
    if !metadata.is_dir() {
        return Ok((vec![path.to_owned()], false));
    }
    let mut files = Vec::new();
    for entry in std::fs::read_dir(path).map_err(read)? {
        let entry = entry.map_err(read)?;
        let name = entry.file_name();
        let name = name.to_string_lossy();
        let is_rule_file = !name.starts_with('.') && (name.ends_with(".yaml") || name.ends_with(".yml"));
        if !is_rule_file {
            continue;
        }
        // `metadata` follows symbolic links (ConfigMap mounts link every file). A directory
        // named like a rule file is skipped as every subdirectory is; a name whose link leads
        // nowhere readable (dangling, a loop, a directory without permission), or to something
        // that is not a regular file, is kept, so that reading it reports why, with every other
        // file's problems: skipping it would drop its domain's limits, while a refused reload
        // keeps the rules in force.
        if !std::fs::metadata(entry.path()).is_ok_and(|metadata| metadata.is_dir()) {
            files.push(entry.path());
        }
    }
    if files.is_empty() {
        return Err(ConfigError::new(path, "", ConfigErrorKind::NoRuleFiles));
    }
    files.sort();
    Ok((files, true))
}

/// Parses one file: its nesting depth first (see the `nesting` module), then as a generic
/// YAML value (syntax, non-string keys, non-map list items, each reported with its path), then
/// into the typed document (unknown keys and wrong types, reported by the YAML reader with
/// path, line and column).
///
/// YAML merge keys (`<<: *defaults`) are applied to the value (see the `merge` module); a
/// file that uses them is read from the merged value, so its type errors carry the path but
/// no line.
fn parse(file: &Path, text: &str, errors: &mut Vec<ConfigError>) -> Option<FileDoc> {
    let yaml_error = |message: String| ConfigError::new(file, "", ConfigErrorKind::Yaml { message });
    if let Some((line, column)) = nesting::too_deep(text) {
        errors.push(ConfigError::new(file, "", ConfigErrorKind::TooDeep { line, column }));
        return None;
    }
    let mut value: serde_norway::Value = match serde_norway::from_str(text) {
        Ok(value) => value,
        Err(error) => {
            // An integer beyond 64 bits fails here whatever its field: said so, with its range.
            let message = range::integer_out_of_range(text, &error).unwrap_or_else(|| error.to_string());
            errors.push(yaml_error(message));
            return None;
        }
    };
    let merged = merge::has_merge_key(&value);
    if merged && let Err((path, message)) = merge::apply(&mut value, &mut String::new()) {
        errors.push(ConfigError::new(file, path, ConfigErrorKind::Yaml { message }));
        return None;
    }
    match &value {
        serde_norway::Value::Null => return Some(FileDoc::default()),
        serde_norway::Value::Mapping(_) => {}
        other => {
            errors.push(ConfigError::new(
                file,
                "",
                ConfigErrorKind::NotAMap { found: describe_value(other) },
            ));
            return None;
        }
    }
    let before = errors.len();
    check_shape(file, &value, &mut String::new(), errors);
    if errors.len() > before {
        return None;
    }
    let read = if merged {
        // The value's own errors carry no path: serde_path_to_error's is prefixed.
        serde_path_to_error::deserialize::<_, FileDoc>(value).map_err(|error| {
            match error.path().to_string() {
                path if path == "." => error.into_inner().to_string(),
                path => format!("{path}: {}", error.into_inner()),
            }
        })
    } else {
        let deserializer = serde_norway::Deserializer::from_str(text);
        serde_path_to_error::deserialize::<_, FileDoc>(deserializer)
            .map_err(|error| error.into_inner().to_string())
    };
    read.map_err(|message| errors.push(yaml_error(message))).ok()
}

/// Reports non-string keys and non-map list items, the two shapes serde would describe only
/// vaguely. The format's lists, `descriptors` and `replaces`, are lists of maps; a list
/// anywhere else (`domain: [a]`) is left to serde, which says what the field expects. The
/// contents of `metadata`, which is arbitrary YAML, are not checked (as envoyproxy/ratelimit
/// does not).
fn check_shape(file: &Path, value: &serde_norway::Value, path: &mut String, errors: &mut Vec<ConfigError>) {
    match value {
        serde_norway::Value::Mapping(mapping) => {
            for (key, child) in mapping {
                let Some(key) = key.as_str() else {
                    errors.push(ConfigError::new(
                        file,
                        path.clone(),
                        ConfigErrorKind::NonStringKey { key: yaml_text(key) },
                    ));
                    continue;
                };
                let is_list_of_maps = key == "descriptors" || key == "replaces";
                if key == "metadata" || (child.is_sequence() && !is_list_of_maps) {
                    continue;
                }
                let len = path.len();
                push_key(path, key);
                check_shape(file, child, path, errors);
                path.truncate(len);
            }
        }
        serde_norway::Value::Sequence(items) => {
            for (index, item) in items.iter().enumerate() {
                let len = path.len();
                let _ = write!(path, "[{index}]");
                if item.is_mapping() {
                    check_shape(file, item, path, errors);
                } else {
                    errors.push(ConfigError::new(
                        file,
                        path.clone(),
                        ConfigErrorKind::NonMapListItem { found: describe_value(item) },
                    ));
                }
                path.truncate(len);
            }
        }
        serde_norway::Value::Tagged(tagged) => check_shape(file, &tagged.value, path, errors),
        _ => {}
    }
}

/// Appends `key` to a document path (`descriptors[0]` + `rate_limit`).
fn push_key(path: &mut String, key: &str) {
    if !path.is_empty() {
        path.push('.');
    }
    path.push_str(key);
}

fn yaml_text(value: &serde_norway::Value) -> String {
    serde_norway::to_string(value).map(|text| text.trim_end().to_owned()).unwrap_or_else(|_| "?".to_owned())
}

fn describe_value(value: &serde_norway::Value) -> String {
    match value {
        serde_norway::Value::Null => "empty".to_owned(),
        serde_norway::Value::Bool(_) => format!("the boolean {}", yaml_text(value)),
        serde_norway::Value::Number(_) => format!("the number {}", yaml_text(value)),
        serde_norway::Value::String(text) => format!("the string {text:?}"),
        serde_norway::Value::Sequence(_) => "a list".to_owned(),
        serde_norway::Value::Mapping(_) => "a map".to_owned(),
        serde_norway::Value::Tagged(tagged) => describe_value(&tagged.value),
    }
}

/// Collects a domain's rules and tree; problems go to `errors`.
struct DomainBuilder<'a> {
    file: &'a Path,
    domain: &'a str,
    rules: Vec<Rule>,
    /// The first limited rule's algorithm and document path.
    algorithm: Option<(Algorithm, String)>,
    /// Each named rule's name, and each `replaces` name with its document path and the
    /// position in `errors` its problem, if any, takes (so problems stay in document order).
    names: HashSet<Box<str>>,
    replaces: Vec<(String, String, usize)>,
    errors: &'a mut Vec<ConfigError>,
}

fn compile_domain(file: &Path, name: &str, docs: &[RuleDoc], errors: &mut Vec<ConfigError>) -> Domain {
    let mut builder = DomainBuilder {
        file,
        domain: name,
        rules: Vec::new(),
        algorithm: None,
        names: HashSet::new(),
        replaces: Vec::new(),
        errors,
    };
    let root = builder.level(docs, "", &[], &[]);
    // Names can be used before they are defined, so these are checked last, and each problem
    // is put where it was found. The positions never decrease; `inserted` shifts the later ones.
    let mut inserted = 0;
    for (replaced, location, at) in std::mem::take(&mut builder.replaces) {
        if !builder.names.contains(replaced.as_str()) {
            let kind = ConfigErrorKind::ReplacesUnknown { name: replaced, domain: name.to_owned() };
            builder.errors.insert(at + inserted, ConfigError::new(file, location, kind));
            inserted += 1;
        }
    }
    let algorithm = builder.algorithm.map_or(Algorithm::FixedWindow, |(algorithm, _)| algorithm);
    Domain { name: name.into(), algorithm, root, rules: builder.rules }
}

/// One entry of a rule's descriptor path: its key and value (`None` for a key-only rule).
type PathEntry<'a> = (&'a str, Option<&'a str>);

impl DomainBuilder<'_> {
    fn error(&mut self, location: impl Into<String>, kind: ConfigErrorKind) {
        self.errors.push(ConfigError::new(self.file, location, kind));
    }

    /// Compiles one `descriptors` list; `location` is its document path (`""` for the
    /// top-level list) and `parents` the descriptor path of the rule that holds it.
    ///
    /// `parent_shares`: the `share_threshold` patterns of the rules on the way here, in order.
    fn level(
        &mut self,
        docs: &[RuleDoc],
        location: &str,
        parents: &[PathEntry<'_>],
        parent_shares: &[String],
    ) -> Level {
        let mut level = Level::default();
        let mut seen: HashSet<(&str, Option<&str>)> = HashSet::new();
        for (index, doc) in docs.iter().enumerate() {
            let here = if location.is_empty() {
                format!("descriptors[{index}]")
            } else {
                format!("{location}.descriptors[{index}]")
            };
            let key = doc.key.as_deref().unwrap_or("");
            let value = doc.value.as_deref().filter(|value| !value.is_empty());
            let mut path: Vec<PathEntry<'_>> = parents.to_vec();
            path.push((key, value));
            // A rule without a key, or a duplicate, is still checked through (its `rate_limit`,
            // its children), so every problem is reported; it is left out of the tree.
            let mut valid = true;
            if key.is_empty() {
                self.error(format!("{here}.key"), ConfigErrorKind::EmptyKey);
                valid = false;
            } else if !seen.insert((key, value)) {
                let rule = rule_path(self.domain, &path);
                self.error(here.clone(), ConfigErrorKind::DuplicateRule { rule });
                valid = false;
            }
            let composite = composite(key, value);
            let pattern = Glob::new(&composite);
            let share = match (doc.share_threshold.unwrap_or(false), &pattern) {
                (false, _) => None,
                (true, Some(_)) => Some(composite.clone().into_boxed_str()),
                (true, None) => {
                    self.error(
                        format!("{here}.share_threshold"),
                        ConfigErrorKind::ShareThresholdWithoutWildcard { rule: composite.clone() },
                    );
                    None
                }
            };
            if doc.quota_mode == Some(true) {
                self.error(format!("{here}.quota_mode"), ConfigErrorKind::QuotaModeUnsupported);
            }
            let mut shares = parent_shares.to_vec();
            if let Some(pattern) = &share {
                shares.push(format!("`{pattern}`"));
            }
            let rule = doc.rate_limit.as_ref().and_then(|rate_limit| {
                self.rule(rate_limit, doc, &format!("{here}.rate_limit"), &path, &shares)
            });
            let children = self.level(doc.descriptors.as_deref().unwrap_or(&[]), &here, &path, &shares);
            if !valid {
                continue;
            }
            let node = Node { rule, share, children };
            match (pattern, value) {
                (Some(glob), _) => level.wildcards.push((glob, node)),
                (None, Some(value)) => {
                    level.keys.entry(key.into()).or_default().values.insert(value.into(), node);
                }
                (None, None) => level.keys.entry(key.into()).or_default().default = Some(node),
            }
        }
        level
    }

    /// Compiles a `rate_limit` block into a rule; `None` (with errors reported) when invalid.
    fn rule(
        &mut self,
        doc: &RateLimitDoc,
        descriptor: &RuleDoc,
        location: &str,
        path: &[PathEntry<'_>],
        shares: &[String],
    ) -> Option<usize> {
        let before = self.errors.len();
        let name = doc.name.as_deref().filter(|name| !name.is_empty());
        let mut replaces = Vec::new();
        for (index, entry) in doc.replaces.as_deref().unwrap_or(&[]).iter().enumerate() {
            let at = format!("{location}.replaces[{index}].name");
            match entry.name.as_deref().filter(|name| !name.is_empty()) {
                None => self.error(at, ConfigErrorKind::EmptyReplaces),
                Some(replaced) if Some(replaced) == name => {
                    self.error(at, ConfigErrorKind::ReplacesSelf { name: replaced.to_owned() });
                }
                Some(replaced) => {
                    self.replaces.push((replaced.to_owned(), at, self.errors.len()));
                    replaces.push(Box::from(replaced));
                }
            }
        }
        if let Some(name) = name {
            self.names.insert(name.into());
        }
        let algorithm = match doc.algorithm.as_deref() {
            None | Some("fixed_window") => Algorithm::FixedWindow,
            Some("gcra") => Algorithm::Gcra,
            Some(other) => {
                self.error(
                    format!("{location}.algorithm"),
                    ConfigErrorKind::InvalidAlgorithm { algorithm: other.to_owned() },
                );
                Algorithm::FixedWindow
            }
        };
        if doc.burst.is_some() && algorithm != Algorithm::Gcra {
            self.error(format!("{location}.burst"), ConfigErrorKind::BurstWithoutGcra);
        }
        let rule_path = rule_path(self.domain, path);
        let quota = if doc.unlimited == Some(true) {
            if doc.unit.is_some() {
                self.error(format!("{location}.unit"), ConfigErrorKind::UnlimitedWithUnit);
            }
            Quota::Unlimited
        } else {
            let unit = match doc.unit.as_deref() {
                None => {
                    self.error(format!("{location}.unit"), ConfigErrorKind::MissingUnit);
                    None
                }
                Some(text) => {
                    let unit = Unit::from_name(text);
                    if unit.is_none() {
                        self.error(
                            format!("{location}.unit"),
                            ConfigErrorKind::InvalidUnit { unit: text.to_owned() },
                        );
                    }
                    unit
                }
            };
            let requests_per_unit = doc.requests_per_unit;
            if requests_per_unit.is_none() {
                self.error(format!("{location}.requests_per_unit"), ConfigErrorKind::MissingRequestsPerUnit);
            }
            let (Some(unit), Some(requests_per_unit)) = (unit, requests_per_unit) else { return None };
            if let Some((first, first_location)) = &self.algorithm
                && *first != algorithm
            {
                let kind = ConfigErrorKind::MixedAlgorithms {
                    algorithm: algorithm.name(),
                    other_rule: first_location.clone(),
                    other: first.name(),
                };
                self.error(format!("{location}.algorithm"), kind);
            } else if self.algorithm.is_none() {
                self.algorithm = Some((algorithm, location.to_owned()));
            }
            let policy = if requests_per_unit == 0 {
                None
            } else {
                let id = policy_id("rule", self.domain, path.iter().map(|(key, value)| (*key, *value)));
                match build_policy(id, algorithm, requests_per_unit, unit, doc.burst) {
                    Ok(policy) => Some(policy),
                    Err(reason) => {
                        let at = if doc.burst.is_some() { "burst" } else { "requests_per_unit" };
                        self.error(format!("{location}.{at}"), ConfigErrorKind::Policy { reason });
                        None
                    }
                }
            };
            Quota::Limited { requests_per_unit, unit, policy }
        };
        if self.errors.len() > before {
            return None;
        }
        let shadow = descriptor.shadow_mode.unwrap_or(false);
        let quota = match quota {
            Quota::Limited { requests_per_unit, unit, policy } if shadow => Quota::Limited {
                requests_per_unit,
                unit,
                policy: policy.map(|policy| policy.with_quota_mode(QuotaMode::Shadow)),
            },
            quota => quota,
        };
        let header_name = header_name(name, &rule_path, &quota);
        self.rules.push(Rule {
            path: rule_path.into(),
            name: name.map(Box::from),
            replaces: replaces.into(),
            quota,
            shadow,
            header_name,
            identity: policy_id("rule", self.domain, path.iter().copied()),
            shared: shares.join(", ").into(),
            detailed_metric: descriptor.detailed_metric.unwrap_or(false),
        });
        Some(self.rules.len() - 1)
    }
}

/// `key`, or `key_value`: envoyproxy/ratelimit's name for a rule entry, and what its
/// wildcards match against.
pub(crate) fn composite(key: &str, value: Option<&str>) -> String {
    match value {
        Some(value) => format!("{key}_{value}"),
        None => key.to_owned(),
    }
}

fn rule_path(domain: &str, path: &[PathEntry<'_>]) -> String {
    let mut text = domain.to_owned();
    for (key, value) in path {
        text.push('.');
        text.push_str(&composite(key, *value));
    }
    text
}

/// A policy identifier for a rule: `rls.` and 24 hex digits of a SHA-256 over `kind`, the
/// domain and the descriptor path (each length-prefixed, so no two paths share an input).
pub(crate) fn policy_id<'a>(
    kind: &str,
    domain: &str,
    path: impl IntoIterator<Item = (&'a str, Option<&'a str>)>,
) -> PolicyId {
    let mut hash = Sha256::new();
    let mut field = |bytes: &[u8]| {
        hash.update((bytes.len() as u64).to_be_bytes());
        hash.update(bytes);
    };
    field(b"runlimit-server policy v1");
    field(kind.as_bytes());
    field(domain.as_bytes());
    for (key, value) in path {
        field(key.as_bytes());
        match value {
            Some(value) => {
                field(b"=");
                field(value.as_bytes());
            }
            None => field(b"*"),
        }
    }
    let digest = hash.finalize();
    let mut id = String::from("rls.");
    for byte in &digest[..12] {
        let _ = write!(id, "{byte:02x}");
    }
    #[expect(clippy::expect_used, reason = "28 bytes of [a-z0-9.], starting with a letter: always valid")]
    PolicyId::new(&id).expect("a valid policy identifier")
}

/// The scope every rule policy uses: `descriptor`.
pub(crate) fn rule_scope() -> ScopeId {
    #[expect(clippy::expect_used, reason = "a constant valid identifier")]
    ScopeId::new("descriptor").expect("a valid scope identifier")
}

/// Builds a rule's policy: `requests_per_unit` (at least 1) per `unit`, as a fixed window or
/// as GCRA with `burst` (default: `requests_per_unit`).
pub(crate) fn build_policy(
    id: PolicyId,
    algorithm: Algorithm,
    requests_per_unit: u32,
    unit: Unit,
    burst: Option<u64>,
) -> Result<RulePolicy, String> {
    let scope = rule_scope();
    let limit = u64::from(requests_per_unit);
    match algorithm {
        Algorithm::FixedWindow => FixedWindowPolicy::new(id, scope, limit, unit.duration())
            .map(RulePolicy::FixedWindow)
            .map_err(|error| error.to_string()),
        Algorithm::Gcra => GcraPolicy::new(id, scope, limit, unit.duration(), burst.unwrap_or(limit))
            .map(RulePolicy::Gcra)
            .map_err(|error| error.to_string()),
    }
}

fn header_name(name: Option<&str>, path: &str, quota: &Quota) -> PolicyName {
    if let Some(name) = name.and_then(|name| PolicyName::new(name).ok()) {
        return name;
    }
    if let Ok(name) = PolicyName::new(path) {
        return name;
    }
    match quota {
        Quota::Limited { policy: Some(RulePolicy::FixedWindow(policy)), .. } => {
            PolicyName::from(runlimit_core::RateLimitPolicy::id(policy))
        }
        Quota::Limited { policy: Some(RulePolicy::Gcra(policy)), .. } => {
            PolicyName::from(runlimit_core::RateLimitPolicy::id(policy))
        }
        _ => PolicyName::from(&policy_id("name", path, [])),
    }
}

#[cfg(test)]
mod tests;
