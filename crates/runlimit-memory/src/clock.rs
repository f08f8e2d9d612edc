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

    /// [`now`](Self::now) in whole milliseconds, truncated, saturating at `u64::MAX`: the
    /// reading a store uses. A clock overrides it only to compute the same value faster; it
    /// must equal `now().as_millis()` (saturated) for the same instant.
    #[inline]
    fn now_millis(&self) -> u64 {
        u64::try_from(self.now().as_millis()).unwrap_or(u64::MAX)
    }
}

impl<C: Clock + ?Sized> Clock for Arc<C> {
    fn now(&self) -> Duration {
        (**self).now()
    }

    #[inline]
    fn now_millis(&self) -> u64 {
        (**self).now_millis()
    }
}

impl<C: Clock + ?Sized> Clock for &C {
    fn now(&self) -> Duration {
        (**self).now()
    }

    #[inline]
    fn now_millis(&self) -> u64 {
        (**self).now_millis()
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
    /// The raw counter reading at the origin ([`quanta::Clock::raw`]).
    origin: u64,
}

impl SystemClock {
    /// A clock whose origin is now. The first clock in a process calibrates the counter,
    /// which takes a few milliseconds.
    #[must_use]
    pub fn new() -> Self {
        let clock = quanta::Clock::new();
        let origin = clock.raw();
        Self { clock, origin }
    }
}

impl Default for SystemClock {
    fn default() -> Self {
        Self::new()
    }
}

impl SystemClock {
    /// Nanoseconds since the origin: the raw counter's difference, scaled once (zero if the
    /// counter reads earlier than the origin).
    #[inline]
    fn nanos(&self) -> u64 {
        self.clock.delta_as_nanos(self.origin, self.clock.raw())
    }
}

impl Clock for SystemClock {
    #[inline]
    fn now(&self) -> Duration {
        Duration::from_nanos(self.nanos())
    }

    /// The same reading as [`now`](Clock::now) in whole milliseconds, without building a
    /// `Duration`: one division by a constant.
    #[inline]
    fn now_millis(&self) -> u64 {
        self.nanos() / 1_000_000
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
#[inline]
pub(crate) fn millis<C: Clock + ?Sized>(clock: &C) -> u64 {
    clock.now_millis()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_millisecond_reading_truncates_and_saturates() {
        let clock = ManualClock::new();
        clock.set(Duration::from_nanos(1_999_999));
        assert_eq!(clock.now_millis(), 1);
        assert_eq!(millis(&Arc::new(clock.clone())), 1);
        clock.set(Duration::from_millis(2));
        assert_eq!(Clock::now_millis(&&clock), 2);
        // u64::MAX nanoseconds is about 584 years: far below u64::MAX milliseconds.
        clock.set(Duration::MAX);
        assert_eq!(clock.now_millis(), u64::MAX / 1_000_000);
        struct Far;
        impl Clock for Far {
            fn now(&self) -> Duration {
                Duration::MAX
            }
        }
        assert_eq!(Far.now_millis(), u64::MAX);
    }

    #[test]
    fn the_system_clock_reads_the_same_time_in_both_units() {
        let clock = SystemClock::new();
        for _ in 0..1_000 {
            let before = clock.now_millis();
            let between = clock.now();
            let after = clock.now_millis();
            let between = u64::try_from(between.as_millis()).unwrap();
            assert!(before <= between && between <= after, "{before} {between} {after}");
        }
        std::thread::sleep(Duration::from_millis(5));
        assert!(clock.now_millis() >= 5);
        assert!(clock.now() >= Duration::from_millis(5));
    }
}
