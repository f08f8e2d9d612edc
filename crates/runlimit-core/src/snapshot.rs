//! Non-consuming reads of one subject's quota: [`QuotaSnapshot`].

use crate::{delay::Delay, policy::Capacity};

/// Why [`QuotaSnapshot::new`] rejected its values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SnapshotError {
    /// More units available than the capacity.
    #[error("available units ({available}) exceed the capacity ({capacity})")]
    AvailableExceedsCapacity {
        /// The rejected available count.
        available: u64,
        /// The capacity it exceeded.
        capacity: u64,
    },
    /// A full quota (available = capacity) with a time until the next unit, or one that is
    /// not full without it.
    #[error("the next unit's delay must be given exactly when the quota is not full")]
    NextUnitMismatch,
    /// The next unit arrives after full replenishment, or a full quota has a nonzero
    /// replenishment delay.
    #[error("the next unit cannot arrive after full replenishment")]
    NextUnitAfterReplenishment,
}

/// A subject's quota under one policy as a backend read it at one instant, without consuming,
/// creating or changing anything: from a `peek`, never from an admission.
///
/// It is its own type on purpose. It is no [`Decision`](crate::Decision) and no
/// [`Admitted`](crate::Admitted), so it cannot be passed where an admission is expected, and
/// a request must never be admitted on it: it is a snapshot that a concurrent check may change
/// at once. Admit with a check.
///
/// For a fixed window (capacity `L`): with a live window of `u` units used that ends at `d`,
/// `available = L − u` (0 if another writer stored more), and both the next unit and full
/// replenishment come at `d − now`, when the window ends; without a live window the quota is
/// full. For GCRA (burst capacity `B`): `available` is the units spendable now, rounded down,
/// `next_unit_after` the time until one more is spendable and `replenishes_after` the time
/// until the subject is fully rested, both rounded up to whole milliseconds. Every duration is
/// measured by the backend's clock.
///
/// ```
/// use runlimit_core::{Capacity, Delay, QuotaSnapshot};
///
/// let snapshot = QuotaSnapshot::new(
///     Capacity::new(10)?, 3, Some(Delay::from_millis(100)), Delay::from_millis(700))?;
/// assert!(snapshot.would_allow(3));
/// assert!(!snapshot.would_allow(4));
/// assert!(!snapshot.is_full());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[must_use = "a snapshot only describes the quota; admit requests with a check"]
pub struct QuotaSnapshot {
    capacity: Capacity,
    available: u64,
    next_unit_after: Option<Delay>,
    replenishes_after: Delay,
}

impl QuotaSnapshot {
    /// A snapshot of `available` of `capacity` units, with the time until one more unit is
    /// available (`None` exactly when the quota is full) and until it is full again
    /// ([`Delay::ZERO`] when full).
    ///
    /// # Errors
    ///
    /// [`SnapshotError::AvailableExceedsCapacity`] when `available > capacity`;
    /// [`SnapshotError::NextUnitMismatch`] when `next_unit_after` is `None` for a quota that
    /// is not full or `Some` for a full one; [`SnapshotError::NextUnitAfterReplenishment`]
    /// when the next unit comes after full replenishment, or a full quota has a nonzero
    /// `replenishes_after`.
    pub fn new(
        capacity: Capacity,
        available: u64,
        next_unit_after: Option<Delay>,
        replenishes_after: Delay,
    ) -> Result<Self, SnapshotError> {
        if available > capacity.get() {
            return Err(SnapshotError::AvailableExceedsCapacity { available, capacity: capacity.get() });
        }
        let full = available == capacity.get();
        match next_unit_after {
            None if !full => return Err(SnapshotError::NextUnitMismatch),
            Some(_) if full => return Err(SnapshotError::NextUnitMismatch),
            Some(next) if next > replenishes_after => return Err(SnapshotError::NextUnitAfterReplenishment),
            None if replenishes_after != Delay::ZERO => {
                return Err(SnapshotError::NextUnitAfterReplenishment);
            }
            _ => {}
        }
        Ok(Self { capacity, available, next_unit_after, replenishes_after })
    }

    /// A full quota: `capacity` units available, nothing to replenish.
    pub const fn full(capacity: Capacity) -> Self {
        Self { capacity, available: capacity.get(), next_unit_after: None, replenishes_after: Delay::ZERO }
    }

    /// The policy's capacity (fixed-window limit or GCRA burst capacity).
    #[must_use]
    pub const fn capacity(&self) -> Capacity {
        self.capacity
    }

    /// Units a check could spend now, at most [`capacity`](Self::capacity).
    #[must_use]
    pub const fn available(&self) -> u64 {
        self.available
    }

    /// Whether nothing is used: [`available`](Self::available) equals the capacity.
    #[must_use]
    pub const fn is_full(&self) -> bool {
        self.next_unit_after.is_none()
    }

    /// Time until one more unit is available; `None` when the quota is full. A fixed window
    /// returns every unit at once when it ends; GCRA returns one unit per emission interval.
    #[must_use]
    pub const fn next_unit_after(&self) -> Option<Delay> {
        self.next_unit_after
    }

    /// Time until the quota is full again; [`Delay::ZERO`] when it is.
    #[must_use]
    pub const fn replenishes_after(&self) -> Delay {
        self.replenishes_after
    }

    /// Whether a check costing `cost` units would be allowed at the snapshot's instant: `1 ≤
    /// cost ≤ available`. Both rules admit exactly then (a fixed window iff `used + cost ≤ L`,
    /// GCRA iff the cost fits the units spendable now), so this is the check's answer had it
    /// run instead of the peek, and no promise about the next check, which may come after
    /// other writers. Storage capacity is not part of a snapshot: a check of a subject without
    /// state may still be denied by a full shard.
    #[must_use]
    pub const fn would_allow(&self, cost: u64) -> bool {
        cost >= 1 && cost <= self.available
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn capacity(n: u64) -> Capacity {
        Capacity::new(n).unwrap()
    }

    #[test]
    fn validates_every_combination() {
        let ms = Delay::from_millis;
        assert_eq!(
            QuotaSnapshot::new(capacity(3), 4, None, Delay::ZERO),
            Err(SnapshotError::AvailableExceedsCapacity { available: 4, capacity: 3 })
        );
        assert_eq!(QuotaSnapshot::new(capacity(3), 2, None, ms(5)), Err(SnapshotError::NextUnitMismatch));
        assert_eq!(
            QuotaSnapshot::new(capacity(3), 3, Some(ms(1)), ms(1)),
            Err(SnapshotError::NextUnitMismatch)
        );
        assert_eq!(
            QuotaSnapshot::new(capacity(3), 1, Some(ms(6)), ms(5)),
            Err(SnapshotError::NextUnitAfterReplenishment)
        );
        assert_eq!(
            QuotaSnapshot::new(capacity(3), 3, None, ms(5)),
            Err(SnapshotError::NextUnitAfterReplenishment)
        );
        assert_eq!(
            QuotaSnapshot::new(capacity(3), 3, None, Delay::ZERO),
            Ok(QuotaSnapshot::full(capacity(3)))
        );
        let partial = QuotaSnapshot::new(capacity(3), 0, Some(ms(5)), ms(5)).unwrap();
        assert_eq!(
            (partial.available(), partial.is_full(), partial.next_unit_after()),
            (0, false, Some(ms(5)))
        );
    }

    #[test]
    fn would_allow_is_one_to_available() {
        let snapshot =
            QuotaSnapshot::new(capacity(5), 2, Some(Delay::from_millis(1)), Delay::from_millis(9)).unwrap();
        assert_eq!([0, 1, 2, 3].map(|cost| snapshot.would_allow(cost)), [false, true, true, false]);
        assert!(QuotaSnapshot::full(capacity(5)).would_allow(5));
        assert!(!QuotaSnapshot::full(capacity(5)).would_allow(6));
    }
}
