//! Backend-measured durations.

use std::{fmt, time::Duration};

/// A duration measured by a backend: a quota denial's retry-after, an allowance's time to
/// replenishment, or a storage-capacity denial's earliest expiry.
///
/// [`Delay::duration`] keeps the exact backend measurement. [`Delay::seconds`] rounds it up
/// to the whole seconds an HTTP `Retry-After` (RFC 9110 §10.2.3) or draft-11 `RateLimit`
/// `t` value needs, so a client waiting that long never retries early.
/// [`Delay::millis`] rounds up to whole milliseconds.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use runlimit_core::Delay;
///
/// let delay = Delay::from_duration(Duration::from_millis(1_001));
/// assert_eq!(delay.seconds(), 2);
/// assert_eq!(delay.millis(), 1_001);
/// assert_eq!(delay.duration(), Duration::from_millis(1_001));
/// assert_eq!(Delay::from_duration(Duration::from_secs(3)).seconds(), 3);
/// assert_eq!(Delay::from_duration(Duration::from_nanos(1)).millis(), 1);
/// ```
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Delay(Duration);

impl Delay {
    /// The zero delay.
    pub const ZERO: Self = Self(Duration::ZERO);

    /// Wraps an exact backend measurement.
    #[must_use]
    pub const fn from_duration(duration: Duration) -> Self {
        Self(duration)
    }

    /// A delay of whole milliseconds.
    #[must_use]
    pub const fn from_millis(millis: u64) -> Self {
        Self(Duration::from_millis(millis))
    }

    /// The exact measurement.
    #[must_use]
    pub const fn duration(self) -> Duration {
        self.0
    }

    /// Whole seconds, rounded up: 0 only for a zero delay; 1.001 s becomes 2.
    #[must_use]
    pub const fn seconds(self) -> u64 {
        let secs = self.0.as_secs();
        if self.0.subsec_nanos() > 0 { secs.saturating_add(1) } else { secs }
    }

    /// Whole milliseconds, rounded up.
    #[must_use]
    pub const fn millis(self) -> u128 {
        let millis = self.0.as_millis();
        if !self.0.subsec_nanos().is_multiple_of(1_000_000) { millis + 1 } else { millis }
    }
}

impl fmt::Debug for Delay {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Delay({:?})", self.0)
    }
}

impl From<Duration> for Delay {
    fn from(duration: Duration) -> Self {
        Self(duration)
    }
}

#[cfg(feature = "serde")]
impl serde::Serialize for Delay {
    /// As a `Duration`: exact seconds and nanoseconds.
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(serializer)
    }
}

#[cfg(feature = "serde")]
impl<'de> serde::Deserialize<'de> for Delay {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Duration::deserialize(deserializer).map(Self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounding() {
        assert_eq!(Delay::ZERO.seconds(), 0);
        assert_eq!(Delay::from_millis(1).seconds(), 1);
        assert_eq!(Delay::from_millis(999).seconds(), 1);
        assert_eq!(Delay::from_millis(1000).seconds(), 1);
        assert_eq!(Delay::from_millis(59_999).seconds(), 60);
        assert_eq!(Delay::from_duration(Duration::MAX).seconds(), u64::MAX);
        assert_eq!(Delay::from_duration(Duration::from_micros(1_500)).millis(), 2);
        assert_eq!(Delay::from_millis(7).millis(), 7);
    }
}
