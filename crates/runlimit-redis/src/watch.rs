//! The eviction watch: a connector's periodic re-verification of `maxmemory-policy`, off the
//! admission path.
//!
//! [`RedisStore::prepare`](crate::RedisStore::prepare) refuses a server that evicts, but the
//! policy is a runtime setting (`CONFIG SET maxmemory-policy allkeys-lru`), and a failover can
//! put another server behind the same address. So once a limiter of the connector was
//! prepared, a task reads `INFO memory` from every server admissions go to at a fixed
//! interval. While the last reading of some server named an evicting policy, every admission,
//! peek, reset and cleanup through the connector fails before anything is sent
//! ([`CheckError::EvictingServer`](crate::CheckError::EvictingServer), not consumed). A reading
//! of `noeviction` from that server lifts it. An unreachable server changes nothing:
//! admissions to it fail on their own.

use std::{
    sync::{
        Arc, Mutex, PoisonError, Weak,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::Duration,
};

use crate::client::{Connector, Node};

/// The default interval of the eviction watch: one second.
pub const DEFAULT_EVICTION_WATCH_INTERVAL: Duration = Duration::from_secs(1);

/// The shortest interval the eviction watch accepts: 10 milliseconds.
pub const MIN_EVICTION_WATCH_INTERVAL: Duration = Duration::from_millis(10);

/// The longest interval the eviction watch accepts: one hour.
pub const MAX_EVICTION_WATCH_INTERVAL: Duration = Duration::from_secs(3_600);

/// A connector's eviction watch: its verdict, its schedule and whether its task runs.
#[derive(Debug)]
pub(crate) struct Watch {
    /// Set while `evicting` holds a server (read on every admission without a lock).
    flagged: AtomicBool,
    /// Each server last read with an evicting policy, and the policy.
    evicting: Mutex<Vec<(Node, String)>>,
    /// The interval in milliseconds; 0 when the watch is off.
    interval_ms: AtomicU64,
    /// The operator vouched for `noeviction`: `INFO` is neither read by `prepare` nor watched.
    vouched: AtomicBool,
    started: AtomicBool,
    /// Completed readings of every server (for health reports and tests).
    rounds: AtomicU64,
}

impl Default for Watch {
    fn default() -> Self {
        Self {
            flagged: AtomicBool::new(false),
            evicting: Mutex::new(Vec::new()),
            interval_ms: AtomicU64::new(millis(DEFAULT_EVICTION_WATCH_INTERVAL)),
            vouched: AtomicBool::new(false),
            started: AtomicBool::new(false),
            rounds: AtomicU64::new(0),
        }
    }
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

impl Watch {
    /// A server last seen with an evicting policy, and that policy.
    pub(crate) fn evicting(&self) -> Option<(Node, String)> {
        if !self.flagged.load(Ordering::Acquire) {
            return None;
        }
        self.evicting.lock().unwrap_or_else(PoisonError::into_inner).first().cloned()
    }

    /// Records a reading of `node`'s `maxmemory-policy`.
    pub(crate) fn record(&self, node: &Node, policy: &str) {
        let mut evicting = self.evicting.lock().unwrap_or_else(PoisonError::into_inner);
        evicting.retain(|(flagged, _)| flagged != node);
        if policy != "noeviction" {
            evicting.push((node.clone(), policy.to_owned()));
        }
        self.flagged.store(!evicting.is_empty(), Ordering::Release);
    }

    /// Forgets the verdicts of servers not in `servers` (no longer a primary or a cluster
    /// node admissions go to).
    pub(crate) fn retain(&self, servers: &[Node]) {
        let mut evicting = self.evicting.lock().unwrap_or_else(PoisonError::into_inner);
        evicting.retain(|(flagged, _)| servers.contains(flagged));
        self.flagged.store(!evicting.is_empty(), Ordering::Release);
    }

    pub(crate) fn set_interval(&self, interval: Option<Duration>) {
        self.interval_ms.store(interval.map_or(0, millis), Ordering::Relaxed);
    }

    pub(crate) fn interval(&self) -> Option<Duration> {
        match self.interval_ms.load(Ordering::Relaxed) {
            0 => None,
            ms => Some(Duration::from_millis(ms)),
        }
    }

    pub(crate) fn vouch(&self) {
        self.vouched.store(true, Ordering::Relaxed);
    }

    pub(crate) fn is_vouched(&self) -> bool {
        self.vouched.load(Ordering::Relaxed)
    }

    pub(crate) fn rounds(&self) -> u64 {
        self.rounds.load(Ordering::Acquire)
    }

    pub(crate) fn is_running(&self) -> bool {
        self.started.load(Ordering::Acquire)
    }
}

/// Starts `connector`'s watch task unless it runs, the watch is off or the operator vouched.
/// The task holds the connector weakly and ends once every handle is dropped; each reading
/// uses `timeouts` (connect, operation).
pub(crate) fn start(connector: &Arc<Connector>, timeouts: (Duration, Duration)) {
    let watch = &connector.watch;
    if watch.is_vouched() || watch.interval().is_none() || watch.started.swap(true, Ordering::AcqRel) {
        return;
    }
    let weak: Weak<Connector> = Arc::downgrade(connector);
    // Marks the watch stopped however the task ends: its loop ending, or its runtime shutting
    // down, even before the task first ran (the next `prepare` then starts it again). Created
    // outside the task so that dropping an unpolled task drops it too.
    let stopped = Stopped(weak.clone());
    tokio::spawn(async move {
        let _stopped = stopped;
        while let Some(interval) = weak.upgrade().and_then(|connector| connector.watch.interval()) {
            tokio::time::sleep(interval).await;
            let Some(connector) = weak.upgrade() else { break };
            let Some(_) = connector.watch.interval() else { break };
            // With Sentinel, ask where the primary is now (a failover without an error seen
            // yet); a new primary's policy is read before it is used.
            let _ = connector.refresh_primary(timeouts.0, timeouts.1).await;
            for node in connector.servers() {
                // An unreachable server fails admissions on its own; its verdict is kept.
                if let Ok(policy) = connector.read_policy(&node, timeouts.0, timeouts.1).await {
                    connector.watch.record(&node, &policy);
                }
            }
            connector.watch.retain(&connector.servers());
            connector.watch.rounds.fetch_add(1, Ordering::AcqRel);
        }
    });
}

/// Clears a connector's `started` flag when dropped.
struct Stopped(Weak<Connector>);

impl Drop for Stopped {
    fn drop(&mut self) {
        if let Some(connector) = self.0.upgrade() {
            connector.watch.started.store(false, Ordering::Release);
        }
    }
}
