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

/// How long after a file-system event the files are read, so a burst of events (an editor's
/// save, a ConfigMap's symlink swap) is one reload.
const SETTLE: Duration = Duration::from_millis(200);

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
    /// and puts them in force. Returns whether a new table was put in force.
    pub(crate) fn reload(&mut self, trigger: Trigger) -> bool {
        let forced = trigger == Trigger::Signal;
        let sources = match read_sources(&self.path) {
            Ok(sources) => sources,
            Err(errors) => {
                self.refuse(trigger, &errors, Refused::Read(errors.to_string()), forced);
                return false;
            }
        };
        let print = fingerprint(&sources);
        if !forced && self.fingerprint == Some(print) {
            // The files in force again (an invalid edit undone, a vanished file back as it
            // was): nothing to load, and the refusal no longer holds.
            if self.refused.take().is_some() {
                self.health.set_config_problem(None);
                tracing::info!(
                    trigger = trigger.name(),
                    config = %self.path.display(),
                    "the rule files are back to the rules in force: the refused reload no longer applies"
                );
            }
            return false;
        }
        if !forced && self.refused == Some(Refused::Files(print)) {
            return false;
        }
        match RuleTable::from_sources(sources) {
            Ok(table) => {
                let (domains, rules) = (table.domain_count(), table.rule_count());
                let restarted = self.service.reload(table);
                self.fingerprint = Some(print);
                self.refused = None;
                self.health.set_config_problem(None);
                metrics::config_reloaded(true);
                tracing::info!(
                    trigger = trigger.name(),
                    config = %self.path.display(),
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
                true
            }
            Err(errors) => {
                self.refuse(trigger, &errors, Refused::Files(print), forced);
                false
            }
        }
    }

    /// Reports a refused reload, unless it is the problem last reported and not `forced`.
    fn refuse(&mut self, trigger: Trigger, errors: &ConfigErrors, refused: Refused, forced: bool) {
        if !forced && self.refused.as_ref() == Some(&refused) {
            return;
        }
        self.refused = Some(refused);
        let text = errors.to_string();
        metrics::config_reloaded(false);
        tracing::error!(
            trigger = trigger.name(),
            config = %self.path.display(),
            problems = errors.errors().len(),
            "reload refused: the rules in force keep serving"
        );
        for line in text.lines() {
            tracing::error!(problem = line, "invalid rule files");
        }
        self.health.set_config_problem(Some(ConfigProblem { at: SystemTime::now(), errors: text }));
    }

    /// Watches, polls every `poll` and listens for SIGHUP on `hangup` (from
    /// [`hangup_signal`], installed early by the caller) until `stop` turns true.
    pub(crate) async fn run(mut self, poll: Duration, mut hangup: Hangup, mut stop: watch::Receiver<bool>) {
        let (events, mut received) = mpsc::channel::<()>(1);
        let _watcher = watch_directory(&self.path, events);
        let mut ticks = tokio::time::interval(poll);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // The first tick is at once: a change made between `new` and the watcher's start,
        // which no event reports, is found now rather than at the next poll.
        loop {
            let trigger = tokio::select! {
                () = stopped(&mut stop) => return,
                Some(()) = received.recv() => {
                    tokio::time::sleep(SETTLE).await;
                    while received.try_recv().is_ok() {}
                    Trigger::Event
                }
                _ = ticks.tick() => Trigger::Poll,
                Some(()) = recv_signal(&mut hangup) => Trigger::Signal,
            };
            self.reload(trigger);
        }
    }
}

/// Resolves once `stop` turns true (the guard `wait_for` returns is not `Send`, so it is
/// dropped here rather than held by the caller's `select!`).
async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|stop| *stop).await;
}

/// The directory to watch for `path`: itself, or a file's parent.
fn watched_directory(path: &Path) -> PathBuf {
    if path.is_dir() {
        return path.to_owned();
    }
    match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent.to_owned(),
        _ => PathBuf::from("."),
    }
}

/// Whether an event of `kind` may have changed a file: anything but an access, except a
/// file closed after writing. (`notify` reports every opening of a file: the reload's own
/// reading of the rules would trigger the next reload, every [`SETTLE`], for ever.)
fn is_change(kind: notify::EventKind) -> bool {
    use notify::event::{AccessKind, AccessMode, EventKind};
    match kind {
        EventKind::Access(AccessKind::Close(AccessMode::Write)) => true,
        EventKind::Access(_) => false,
        _ => true,
    }
}

/// A `notify` watcher sending a trigger on every event under `path`'s directory; `None`
/// (logged) when the platform's watcher cannot start, and polling alone finds changes.
fn watch_directory(path: &Path, events: mpsc::Sender<()>) -> Option<notify::RecommendedWatcher> {
    let directory = watched_directory(path);
    let handler = move |event: notify::Result<notify::Event>| {
        if event.is_ok_and(|event| is_change(event.kind)) {
            // Full: a trigger is already pending, which reads the files anyway.
            let _ = events.try_send(());
        }
    };
    let watcher = notify::recommended_watcher(handler).and_then(|mut watcher| {
        watcher.watch(&directory, notify::RecursiveMode::NonRecursive)?;
        Ok(watcher)
    });
    match watcher {
        Ok(watcher) => Some(watcher),
        Err(error) => {
            tracing::warn!(
                directory = %directory.display(),
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
