//! The time source of a memory store: monotonic offsets from a clock-defined origin.

use std::{
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

/// A monotonic time source for a memory store.
///
/// [`now`](Self::now) returns the time elapsed since an origin the clock chooses (its
/// construction, typically). Only differences between readings matter: a store anchors
/// windows and stores GCRA arrival times in that coordinate system, which is why a built
/// store cannot replace its clock.
///
/// Readings should never decrease. A store still protects itself against a clock that does:
/// each shard keeps the latest reading it has used and evaluates with the later of the two,
/// so a backwards step never replenishes quota early or makes an entry expire sooner.
///
/// Stores read the clock once per operation, before taking any shard lock, and truncate the
/// reading to whole milliseconds (readings beyond `u64::MAX` milliseconds saturate).
///
/// # Examples
///
/// A clock backed by a shared counter, for a simulation:
///
/// ```
/// use std::{sync::{Arc, atomic::{AtomicU64, Ordering}}, time::Duration};
/// use runlimit_memory::Clock;
///
/// struct Ticks(Arc<AtomicU64>);
///
/// impl Clock for Ticks {
///     fn now(&self) -> Duration {
///         Duration::from_millis(self.0.load(Ordering::Relaxed))
///     }
/// }
/// # let _ = Ticks(Arc::default()).now();
/// ```
pub trait Clock: Send + Sync {
    /// Time elapsed since this clock's origin. Must not decrease between calls.
    fn now(&self) -> Duration;
}

impl<C: Clock + ?Sized> Clock for Arc<C> {
    fn now(&self) -> Duration {
        (**self).now()
    }
}

impl<C: Clock + ?Sized> Clock for &C {
    fn now(&self) -> Duration {
        (**self).now()
    }
}

/// The default clock: monotonic offsets from the moment the clock was created, read through
/// the `quanta` crate.
///
/// quanta reads the CPU's time-stamp counter when it is invariant and calibrated against the
/// operating system's monotonic clock (once per process), and otherwise falls back to that
/// monotonic clock itself, the source of [`std::time::Instant`]. Either way readings are
/// immune to wall-clock adjustments. It is used instead of `Instant` for speed: in the
/// benchmark environment `Instant::now()` cost about 45 ns, more than the rest of a check,
/// while a counter read costs a few nanoseconds. (It is also the clock governor uses.)
/// Should counters on different cores ever disagree slightly, the per-shard clamp of
/// backwards readings (see [`Clock`]) keeps every decision conservative.
#[derive(Clone, Debug)]
pub struct SystemClock {
    clock: quanta::Clock,
    origin: quanta::Instant,
}

impl SystemClock {
    /// A clock whose origin is now. The first clock in a process calibrates the counter,
    /// which takes a few milliseconds.
    #[must_use]
    pub fn new() -> Self {
        let clock = quanta::Clock::new();
        let origin = clock.now();
        Self { clock, origin }
    }
}

impl Default for SystemClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for SystemClock {
    #[inline]
    fn now(&self) -> Duration {
        self.clock.now().saturating_duration_since(self.origin)
    }
}

/// A clock that only moves when told to, for deterministic tests.
///
/// Clones share one reading, so a test keeps a clone after handing the clock to a store
/// builder. It starts at zero; readings are kept in whole nanoseconds and saturate at
/// `u64::MAX` nanoseconds (about 584 years).
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use runlimit_memory::{Clock, ManualClock};
///
/// let clock = ManualClock::new();
/// let handle = clock.clone();
/// handle.advance(Duration::from_millis(1_500));
/// assert_eq!(clock.now(), Duration::from_millis(1_500));
/// handle.set(Duration::from_secs(10));
/// assert_eq!(clock.now(), Duration::from_secs(10));
/// ```
#[derive(Clone, Debug, Default)]
pub struct ManualClock {
    nanos: Arc<AtomicU64>,
}

fn saturating_nanos(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)
}

impl ManualClock {
    /// A clock reading zero.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Moves the clock forward by `by` (saturating).
    pub fn advance(&self, by: Duration) {
        let by = saturating_nanos(by);
        // fetch_update with a closure that always returns Some cannot fail.
        let _ = self
            .nanos
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |nanos| Some(nanos.saturating_add(by)));
    }

    /// Moves the clock forward by `millis` milliseconds (saturating).
    pub fn advance_millis(&self, millis: u64) {
        self.advance(Duration::from_millis(millis));
    }

    /// Sets the reading to `to`. Setting it backwards is allowed, to test how a store treats a
    /// misbehaving clock.
    pub fn set(&self, to: Duration) {
        self.nanos.store(saturating_nanos(to), Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Duration {
        Duration::from_nanos(self.nanos.load(Ordering::SeqCst))
    }
}

/// A clock reading in whole milliseconds, truncated, saturating at `u64::MAX`.
pub(crate) fn millis<C: Clock + ?Sized>(clock: &C) -> u64 {
    u64::try_from(clock.now().as_millis()).unwrap_or(u64::MAX)
}
