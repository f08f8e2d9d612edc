//! One shard: a fixed-capacity table of entries and a lazily maintained expiry index.
//!
//! # Layout (about 58 to 61 bytes per key)
//!
//! - `slots`: a slab of 32-byte slots (16-byte [`StoredKey`] + 16-byte [`Entry`]), grown by
//!   doubling but never beyond the shard's capacity. Freed slots are reused through `free`.
//! - `table`: a [`hashbrown::HashTable`] of 4-byte slot numbers, hashed by
//!   [`StoredKey::hash`]. Lookups compare the full stored key in the slot.
//! - `index`: a binary min-heap of `(expiry lower bound, slot)` pairs, exactly one per stored
//!   entry.
//!
//! # Bounded cleanup with a lazy expiry index
//!
//! Both algorithms push an entry's expiry forward on allowed checks (a GCRA arrival time on
//! every allowed check, a fixed window when it re-anchors). Re-positioning the heap element on
//! every check would cost `O(log n)` on the hot path, so the index is lazy: an element's key is
//! the entry's expiry *when the element was last positioned*, a lower bound of its real
//! expiry. Cleanup pops elements whose bound has passed and, for each, either removes the
//! entry (really expired) or re-positions the element at the entry's real expiry (a
//! "refresh"). A check may do at most `budget` removals and `budget` refreshes, each
//! `O(log n)`, so cleanup work per check is bounded no matter how many entries are stale.
//!
//! Every element belongs to a live slot: an entry is removed only by popping its own element,
//! by an operator's reset (which removes its element from the heap in `O(n)`, see
//! [`Shard::remove`]) or by emptying the whole shard, so the heap never holds a dangling slot
//! number.
//!
//! The same lower bounds answer "when is the earliest expiry?" for a storage-capacity denial:
//! once the heap top is fresh (its bound equals its entry's real expiry) it is the exact
//! minimum, because every other entry's real expiry is at least its own bound, which is at
//! least the top's.

use std::{
    cmp::Reverse,
    collections::{BinaryHeap, binary_heap::PeekMut},
};

use hashbrown::HashTable;
use runlimit_core::backend::{ShardHeadroom, is_expired};

use crate::key::StoredKey;

/// A stored entry: the first whole millisecond (store clock) at which it is expired, and one
/// algorithm-specific word (fixed window: checks used in the window; GCRA: the arrival-time
/// deficit, see `algorithm.rs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Entry {
    pub(crate) expires_at: u64,
    pub(crate) value: u64,
}

impl Entry {
    /// The entry if it is still live at `now`, else `None` (expired entries are equivalent to
    /// no entry for both algorithms; [`is_expired`] is the rule's expiry predicate, under which
    /// a saturated `u64::MAX` never passes).
    #[inline]
    pub(crate) fn live_at(self, now: u64) -> Option<Self> {
        (!is_expired(self.expires_at, now)).then_some(self)
    }
}

#[derive(Clone, Copy)]
struct Slot {
    key: StoredKey,
    entry: Entry,
}

// Most of a key's resident memory is its slot (see the module docs).
const _: () = assert!(size_of::<Slot>() == 32);

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
struct Expiry {
    at: u64,
    slot: u32,
}

/// Cleanup allowance of one operation on one shard.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Budget {
    removals: usize,
    refreshes: usize,
}

impl Budget {
    pub(crate) fn new(per_check: usize, checks: usize) -> Self {
        let total = per_check.saturating_mul(checks);
        Self { removals: total, refreshes: total }
    }
}

pub(crate) struct Shard {
    table: HashTable<u32>,
    slots: Vec<Slot>,
    free: Vec<u32>,
    index: BinaryHeap<Reverse<Expiry>>,
    /// The bound at the top of `index` (the smallest), or `u64::MAX` when it is empty. Kept in
    /// step with every change to `index`, so an operation finds that nothing is due for cleanup
    /// from the shard itself, without reading the heap's buffer (one cache miss fewer per
    /// shard per check on a store much larger than the CPU caches).
    earliest_bound: u64,
    capacity: usize,
    /// The latest clock reading an operation on this shard has used (backwards-clock clamp).
    watermark: u64,
}

/// How many elements to reserve so one more fits into a buffer of `len` elements and
/// `allocated` capacity: doubling (at least 8), but never past the shard's `capacity`, so a
/// full shard holds no growth slack. `None` when one more already fits.
fn growth(len: usize, allocated: usize, capacity: usize) -> Option<usize> {
    (len == allocated)
        .then(|| allocated.saturating_mul(2).max(8).min(capacity.max(1)).saturating_sub(len).max(1))
}

impl Shard {
    pub(crate) fn new(capacity: usize) -> Self {
        Self {
            table: HashTable::new(),
            slots: Vec::new(),
            free: Vec::new(),
            index: BinaryHeap::new(),
            earliest_bound: u64::MAX,
            capacity,
            watermark: 0,
        }
    }

    /// Stored entries, live or expired-but-not-yet-removed.
    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.table.len()
    }

    pub(crate) fn capacity(&self) -> usize {
        self.capacity
    }

    /// Free slots.
    #[inline]
    pub(crate) fn free(&self) -> usize {
        self.capacity.saturating_sub(self.len())
    }

    pub(crate) fn headroom(&self, shard_index: usize) -> ShardHeadroom {
        ShardHeadroom { shard_index, entries: self.len(), capacity: self.capacity }
    }

    pub(crate) fn watermark(&self) -> u64 {
        self.watermark
    }

    /// Raises the watermark to `now` (it never decreases).
    #[inline]
    pub(crate) fn advance_watermark(&mut self, now: u64) {
        self.watermark = self.watermark.max(now);
    }

    /// The slot holding `key`, if stored.
    #[inline]
    pub(crate) fn find(&self, key: &StoredKey, hash: u64) -> Option<u32> {
        let slots = &self.slots;
        self.table
            .find(hash, |&slot| slots.get(slot as usize).is_some_and(|stored| stored.key == *key))
            .copied()
    }

    #[inline]
    pub(crate) fn entry(&self, slot: u32) -> Option<Entry> {
        self.slots.get(slot as usize).map(|stored| stored.entry)
    }

    #[inline]
    pub(crate) fn set_entry(&mut self, slot: u32, entry: Entry) {
        if let Some(stored) = self.slots.get_mut(slot as usize) {
            stored.entry = entry;
        }
    }

    /// Stores a new key. The caller has checked [`free`](Self::free) `> 0`; a full shard is
    /// left unchanged. Slot numbers fit `u32` because capacities are at most
    /// [`MAX_KEYS`](crate::MAX_KEYS) `= u32::MAX`.
    pub(crate) fn insert(&mut self, key: StoredKey, hash: u64, entry: Entry) {
        if self.free() == 0 {
            debug_assert!(false, "insert into a full shard");
            return;
        }
        let slot = if let Some(slot) = self.free.pop() {
            if let Some(stored) = self.slots.get_mut(slot as usize) {
                *stored = Slot { key, entry };
            }
            slot
        } else {
            let Ok(slot) = u32::try_from(self.slots.len()) else {
                debug_assert!(false, "slot number beyond u32");
                return;
            };
            if let Some(additional) = growth(self.slots.len(), self.slots.capacity(), self.capacity) {
                self.slots.reserve_exact(additional);
            }
            self.slots.push(Slot { key, entry });
            slot
        };
        let slots = &self.slots;
        self.table.insert_unique(hash, slot, |&other| slots.get(other as usize).map_or(0, |s| s.key.hash()));
        if let Some(additional) = growth(self.index.len(), self.index.capacity(), self.capacity) {
            self.index.reserve_exact(additional);
        }
        self.index.push(Reverse(Expiry { at: entry.expires_at, slot }));
        self.earliest_bound = self.earliest_bound.min(entry.expires_at);
    }

    /// Removes expired entries whose index bound has passed, within `budget`. Returns the
    /// number removed.
    #[inline]
    pub(crate) fn remove_expired(&mut self, now: u64, budget: &mut Budget) -> usize {
        debug_assert_eq!(self.earliest_bound, self.top_bound(), "the cached bound tracks the index");
        if !is_expired(self.earliest_bound, now) {
            return 0;
        }
        self.remove_expired_slow(now, budget)
    }

    #[cold]
    #[inline(never)]
    fn remove_expired_slow(&mut self, now: u64, budget: &mut Budget) -> usize {
        let removed = self.remove_expired_from_index(now, budget);
        self.earliest_bound = self.top_bound();
        removed
    }

    /// The bound at the top of the index, or `u64::MAX` when it is empty.
    fn top_bound(&self) -> u64 {
        self.index.peek().map_or(u64::MAX, |Reverse(expiry)| expiry.at)
    }

    fn remove_expired_from_index(&mut self, now: u64, budget: &mut Budget) -> usize {
        let mut removed = 0;
        loop {
            let Some(mut top) = self.index.peek_mut() else { break };
            let Reverse(Expiry { at, slot }) = *top;
            if !is_expired(at, now) {
                break;
            }
            let Some(stored) = self.slots.get(slot as usize) else {
                // Unreachable: every element names a live slot. Drop it rather than loop.
                PeekMut::pop(top);
                continue;
            };
            let actual = stored.entry.expires_at;
            if is_expired(actual, now) {
                if budget.removals == 0 {
                    break;
                }
                budget.removals -= 1;
                PeekMut::pop(top);
                let hash = stored.key.hash();
                if let Ok(found) = self.table.find_entry(hash, |&candidate| candidate == slot) {
                    found.remove();
                }
                self.free.push(slot);
                removed += 1;
            } else {
                if budget.refreshes == 0 {
                    break;
                }
                budget.refreshes -= 1;
                *top = Reverse(Expiry { at: actual, slot });
            }
        }
        removed
    }

    /// The exact earliest expiry among stored entries, refreshing stale index positions within
    /// `budget`; `None` when the shard is empty or the budget runs out first.
    pub(crate) fn earliest_expiry(&mut self, budget: &mut Budget) -> Option<u64> {
        let earliest = self.refresh_top(budget);
        self.earliest_bound = self.top_bound();
        earliest
    }

    fn refresh_top(&mut self, budget: &mut Budget) -> Option<u64> {
        loop {
            let mut top = self.index.peek_mut()?;
            let Reverse(Expiry { at, slot }) = *top;
            let actual = self.slots.get(slot as usize)?.entry.expires_at;
            if actual == at {
                return Some(at);
            }
            if budget.refreshes == 0 {
                return None;
            }
            budget.refreshes -= 1;
            *top = Reverse(Expiry { at: actual, slot });
        }
    }

    /// Removes the entry in `slot` (found by [`find`](Self::find) under `hash`) and its index
    /// element, freeing the slot at once.
    ///
    /// `O(n)` in the shard's entries: the heap has no handle to one element, so it is rebuilt
    /// without it. Only an operator's reset removes an entry this way; admissions and cleanup
    /// never do, so the hot path keeps its `O(log n)` bounds.
    pub(crate) fn remove(&mut self, slot: u32, hash: u64) {
        let Ok(found) = self.table.find_entry(hash, |&candidate| candidate == slot) else { return };
        found.remove();
        self.index.retain(|Reverse(expiry)| expiry.slot != slot);
        self.earliest_bound = self.top_bound();
        self.free.push(slot);
    }

    /// Empties the shard, releasing its memory; keeps capacity and watermark.
    pub(crate) fn clear(&mut self) {
        *self = Self { watermark: self.watermark, ..Self::new(self.capacity) };
    }
}
