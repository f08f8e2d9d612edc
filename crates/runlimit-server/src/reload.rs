//! Reloading the rule files while serving: on a file-system event, on every poll, on SIGHUP.
//!
//! Each trigger reads the files and compares a SHA-256 fingerprint of their names and texts
//! with the one in force; only a change (or SIGHUP, which always reloads) compiles them. A
//! valid table replaces the old one atomically ([`Service::reload`]); an invalid one never
//! does: the old table keeps serving, and the problems are logged, counted and shown by
//! `GET /healthcheck` and `GET /rlconfig` until a valid table arrives (or the files are back
//! to the ones in force).
//!
//! Events come from `notify` on the directory that holds the rules (the directory itself, or
//! a rule file's parent: editors and Kubernetes ConfigMap updates replace files by renaming,
//! which a watch on the file would miss). Polling covers file systems that send no events
//! (network mounts, some container overlays) and a watcher that could not start.

use std::{
    path::{Path, PathBuf},
    time::{Duration, SystemTime},
};

use notify::Watcher as _;
use sha2::{Digest as _, Sha256};
use tokio::sync::{mpsc, watch};

use crate::{
    config::{ConfigErrors, RuleTable, read_sources},
    health::{ConfigProblem, Health},
    metrics,
    service::Service,
};

/// How long the rules' directories must be quiet after a file-system event before the files
/// are read, so a burst of events (an editor's save, a ConfigMap's symlink swap, a file
/// written in pieces) is one reload of the finished files.
const SETTLE: Duration = Duration::from_millis(200);

/// The longest a burst of events can delay the reading: past it, the files are read even if
/// events still arrive.
const MAX_SETTLE: Duration = Duration::from_secs(2);

/// What started a reload attempt, for the log.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Trigger {
    Event,
    Poll,
    Signal,
}

impl Trigger {
    fn name(self) -> &'static str {
        match self {
            Self::Event => "file event",
            Self::Poll => "poll",
            Self::Signal => "SIGHUP",
        }
    }
}

/// What one reload attempt did, for the log.
#[derive(Debug)]
pub(crate) enum Report {
    /// Nothing to do: the files are those in force, or the refusal already reported.
    Unchanged,
    /// The files are back to those in force: a refused reload no longer applies.
    Cleared,
    /// A new table is in force.
    Reloaded { domains: usize, rules: usize, restarted: Vec<String> },
    /// Refused: the rules in force keep serving.
    Refused { problems: usize, text: String },
}

/// Reloads one service's rules from one path.
pub(crate) struct Reloader {
    path: PathBuf,
    service: Service,
    health: Health,
    /// The fingerprint of the files in force (`None`: unknown, any read reloads).
    fingerprint: Option<[u8; 32]>,
    /// The fingerprint of the files last refused, or the text of the last read failure: the
    /// same problem is reported (logged, counted) once, not on every poll.
    refused: Option<Refused>,
}

#[derive(PartialEq, Eq)]
enum Refused {
    Files([u8; 32]),
    Read(String),
}

/// The fingerprint of rule files: SHA-256 over their names and texts, each length-prefixed.
pub(crate) fn fingerprint(sources: &[(PathBuf, String)]) -> [u8; 32] {
    let mut hash = Sha256::new();
    for (file, text) in sources {
        for bytes in [file.as_os_str().as_encoded_bytes(), text.as_bytes()] {
            hash.update((bytes.len() as u64).to_be_bytes());
            hash.update(bytes);
        }
    }
    hash.finalize().into()
}

impl Reloader {
    /// A reloader for the rules at `path`, which `service` serves now.
    ///
    /// `fingerprint` is that of the files the table in force was compiled from, taken when
    /// they were read (`None`: unknown; the first read then reloads): files changed since,
    /// even before the reloader starts, are reloaded at its first poll.
    pub(crate) fn new(
        path: PathBuf,
        service: Service,
        health: Health,
        fingerprint: Option<[u8; 32]>,
    ) -> Self {
        Self { path, service, health, fingerprint, refused: None }
    }

    /// One attempt: reads the files and, when they changed (always, for SIGHUP), compiles them
    /// and puts them in force. Updates the health and the metrics; returns what to log (see
    /// [`log`](Self::log)), so the caller logs on its own thread.
    pub(crate) fn reload(&mut self, trigger: Trigger) -> Report {
        let forced = trigger == Trigger::Signal;
        let sources = match read_sources(&self.path) {
            Ok(sources) => sources,
            Err(errors) => return self.refuse(&errors, Refused::Read(errors.to_string()), forced),
        };
        let print = fingerprint(&sources);
        if !forced && self.fingerprint == Some(print) {
            // The files in force again (an invalid edit undone, a vanished file back as it
            // was): nothing to load, and the refusal no longer holds.
            if self.refused.take().is_some() {
                self.health.set_config_problem(None);
                return Report::Cleared;
            }
            return Report::Unchanged;
        }
        if !forced && self.refused == Some(Refused::Files(print)) {
            return Report::Unchanged;
        }
        match RuleTable::from_sources(sources) {
            Ok(table) => {
                let (domains, rules) = (table.domain_count(), table.rule_count());
                let restarted = self.service.reload(table);
                self.fingerprint = Some(print);
                self.refused = None;
                self.health.set_config_problem(None);
                metrics::config_reloaded(true);
                Report::Reloaded { domains, rules, restarted }
            }
            Err(errors) => self.refuse(&errors, Refused::Files(print), forced),
        }
    }

    /// Records a refused reload, unless it is the problem last reported and not `forced`.
    fn refuse(&mut self, errors: &ConfigErrors, refused: Refused, forced: bool) -> Report {
        if !forced && self.refused.as_ref() == Some(&refused) {
            return Report::Unchanged;
        }
        self.refused = Some(refused);
        let text = errors.to_string();
        metrics::config_reloaded(false);
        self.health.set_config_problem(Some(ConfigProblem { at: SystemTime::now(), errors: text.clone() }));
        Report::Refused { problems: errors.errors().len(), text }
    }

    /// Logs what [`reload`](Self::reload) reported: one line per reload, a warning per
    /// restarted rule, an error per problem of a refused reload.
    pub(crate) fn log(&self, trigger: Trigger, report: &Report) {
        let config = self.path.display();
        match report {
            Report::Unchanged => {}
            Report::Cleared => tracing::info!(
                trigger = trigger.name(),
                %config,
                "the rule files are back to the rules in force: the refused reload no longer applies"
            ),
            Report::Reloaded { domains, rules, restarted } => {
                tracing::info!(
                    trigger = trigger.name(),
                    %config,
                    domains,
                    rules,
                    restarted_counters = restarted.len(),
                    "rules reloaded"
                );
                for line in restarted {
                    tracing::warn!(
                        rule = %line,
                        "reload restarts this rule's counters (changed limit, unit, algorithm, burst or \
                         share_threshold): every client gets the new limit's whole quota at once"
                    );
                }
            }
            Report::Refused { problems, text } => {
                tracing::error!(
                    trigger = trigger.name(),
                    %config,
                    problems,
                    "reload refused: the rules in force keep serving"
                );
                for line in text.lines() {
                    tracing::error!(problem = line, "invalid rule files");
                }
            }
        }
    }

    /// Watches, polls every `poll` and listens for SIGHUP on `hangup` (from
    /// [`hangup_signal`], installed early by the caller) until `stop` turns true.
    ///
    /// Each attempt (reading, compiling, comparing and building the new limiters) runs on
    /// Tokio's blocking pool, so a large rule set or a slow file system never holds up calls.
    pub(crate) async fn run(mut self, poll: Duration, mut hangup: Hangup, mut stop: watch::Receiver<bool>) {
        let (events, mut received) = mpsc::channel::<()>(1);
        let mut watching = Watching::start(&self.path, events.clone());
        let mut ticks = tokio::time::interval(poll);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // The first tick is at once: a change made between `new` and the watcher's start,
        // which no event reports, is found now rather than at the next poll.
        loop {
            let trigger = tokio::select! {
                () = stopped(&mut stop) => return,
                Some(()) = received.recv() => {
                    settle(&mut received).await;
                    Trigger::Event
                }
                _ = ticks.tick() => Trigger::Poll,
                Some(()) = recv_signal(&mut hangup) => Trigger::Signal,
            };
            let attempt = tokio::task::spawn_blocking(move || {
                let report = self.reload(trigger);
                (self, report)
            });
            self = match attempt.await {
                Ok((reloader, report)) => {
                    // Logged here, on the task's own thread, not the blocking pool's.
                    reloader.log(trigger, &report);
                    reloader
                }
                Err(error) => {
                    tracing::error!(%error, "the reloader stopped: rule files are no longer reloaded");
                    return;
                }
            };
            // A replaced directory, or a symbolic link pointed elsewhere, is watched anew.
            watching.refresh(&self.path, &events);
        }
    }
}

/// Waits until no event has arrived for [`SETTLE`], or [`MAX_SETTLE`] has passed.
async fn settle(received: &mut mpsc::Receiver<()>) {
    let started = tokio::time::Instant::now();
    loop {
        tokio::time::sleep(SETTLE).await;
        let mut more = false;
        while received.try_recv().is_ok() {
            more = true;
        }
        if !more || started.elapsed() >= MAX_SETTLE {
            return;
        }
    }
}

/// Resolves once `stop` turns true (the guard `wait_for` returns is not `Send`, so it is
/// dropped here rather than held by the caller's `select!`).
async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|stop| *stop).await;
}

/// The directories to watch for `path`, resolved: the rules' directory (itself, or a file's
/// parent), the directory holding it (where it is replaced, or its symbolic link swapped), and,
/// when `path` is a symbolic link, the same of its target.
fn watched_directories(path: &Path) -> Vec<PathBuf> {
    fn parent(path: &Path) -> PathBuf {
        match path.parent() {
            Some(parent) if !parent.as_os_str().is_empty() => parent.to_owned(),
            _ => PathBuf::from("."),
        }
    }
    let mut directories = Vec::new();
    let mut add = |directory: PathBuf| {
        let directory = std::fs::canonicalize(&directory).unwrap_or(directory);
        if !directories.contains(&directory) {
            directories.push(directory);
        }
    };
    if path.is_dir() {
        add(path.to_owned());
    }
    add(parent(path));
    if let Ok(target) = std::fs::canonicalize(path) {
        if target.is_dir() {
            add(target.clone());
        }
        add(parent(&target));
    }
    directories
}

/// Whether an event of `kind` may have changed a file: anything but an access, except a
/// file closed after writing. (`notify` reports every opening of a file: the reload's own
/// reading of the rules would trigger the next reload, every [`SETTLE`], for ever.) On Linux,
/// where a file closed after writing is reported, writes themselves are not: a file written
/// in pieces is read once it is closed, not half-written.
fn is_change(kind: notify::EventKind) -> bool {
    use notify::event::{AccessKind, AccessMode, EventKind, ModifyKind};
    match kind {
        EventKind::Access(AccessKind::Close(AccessMode::Write)) => true,
        EventKind::Access(_) => false,
        EventKind::Modify(ModifyKind::Data(_)) => !cfg!(target_os = "linux"),
        _ => true,
    }
}

/// The `notify` watcher of the rules' directories and which directories it watches.
struct Watching {
    directories: Vec<PathBuf>,
    _watcher: Option<notify::RecommendedWatcher>,
}

impl Watching {
    fn start(path: &Path, events: mpsc::Sender<()>) -> Self {
        let directories = watched_directories(path);
        let watcher = watch(&directories, events);
        Self { directories, _watcher: watcher }
    }

    /// Starts a new watcher when the directories to watch changed (a directory replaced, a
    /// symbolic link pointed elsewhere).
    fn refresh(&mut self, path: &Path, events: &mpsc::Sender<()>) {
        if watched_directories(path) != self.directories {
            *self = Self::start(path, events.clone());
        }
    }
}

/// A `notify` watcher sending a trigger on every change in `directories` (not recursive);
/// `None` (logged) when the platform's watcher cannot start, and polling alone finds changes.
fn watch(directories: &[PathBuf], events: mpsc::Sender<()>) -> Option<notify::RecommendedWatcher> {
    let handler = move |event: notify::Result<notify::Event>| {
        if event.is_ok_and(|event| is_change(event.kind)) {
            // Full: a trigger is already pending, which reads the files anyway.
            let _ = events.try_send(());
        }
    };
    let watcher = notify::recommended_watcher(handler).and_then(|mut watcher| {
        for directory in directories {
            watcher.watch(directory, notify::RecursiveMode::NonRecursive)?;
        }
        Ok(watcher)
    });
    match watcher {
        Ok(watcher) => Some(watcher),
        Err(error) => {
            tracing::warn!(
                directories = ?directories,
                %error,
                "cannot watch the rule files for changes; polling only"
            );
            None
        }
    }
}

/// The SIGHUP stream, if it could be installed.
#[cfg(unix)]
pub(crate) type Hangup = Option<tokio::signal::unix::Signal>;
/// No SIGHUP outside Unix.
#[cfg(not(unix))]
pub(crate) type Hangup = Option<()>;

/// The SIGHUP stream (installing it replaces the default action, which ends the process).
pub(crate) fn hangup_signal() -> Hangup {
    #[cfg(unix)]
    {
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok()
    }
    #[cfg(not(unix))]
    {
        None
    }
}

async fn recv_signal(hangup: &mut Hangup) -> Option<()> {
    #[cfg(unix)]
    {
        match hangup {
            Some(signal) => signal.recv().await,
            None => std::future::pending().await,
        }
    }
    #[cfg(not(unix))]
    {
        let _ = hangup;
        std::future::pending().await
    }
}

#[cfg(test)]
mod tests {
    use notify::event::{AccessKind, AccessMode, CreateKind, EventKind, ModifyKind, RemoveKind, RenameMode};

    use super::is_change;

    #[test]
    fn only_changes_trigger_a_reload_not_readings() {
        for kind in [
            EventKind::Access(AccessKind::Open(AccessMode::Any)),
            EventKind::Access(AccessKind::Read),
            EventKind::Access(AccessKind::Close(AccessMode::Read)),
            EventKind::Access(AccessKind::Any),
        ] {
            assert!(!is_change(kind), "{kind:?}");
        }
        // A write: on Linux the closing after it is the change (a file written in pieces is
        // not read half-written); elsewhere the write is.
        let write = EventKind::Modify(ModifyKind::Data(notify::event::DataChange::Any));
        assert_eq!(is_change(write), !cfg!(target_os = "linux"));
        for kind in [
            EventKind::Access(AccessKind::Close(AccessMode::Write)),
            EventKind::Create(CreateKind::File),
            EventKind::Modify(ModifyKind::Any),
            EventKind::Modify(ModifyKind::Name(RenameMode::To)),
            EventKind::Remove(RemoveKind::File),
            EventKind::Any,
            EventKind::Other,
        ] {
            assert!(is_change(kind), "{kind:?}");
        }
    }
}
