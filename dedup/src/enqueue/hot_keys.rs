//! Which keys `find_or_enqueue` expects to be hits: the keys this process enqueued or
//! found recently. Only a guess, and only about speed: PostgreSQL answers a predicted
//! hit with one statement that inserts or returns the holder
//! ([`Statements::insert_or_find`](crate::dialect::Statements)), and any other call with
//! the plain insert, which is faster for a create (BENCHMARKS.md). A wrong guess costs
//! a little time either way, never a different outcome.
//!
//! A fixed table of [`SLOTS`] hashes, one slot per hash (direct-mapped): bounded, no lock,
//! and a key keeps its slot until another key's hash lands there, so it remembers the
//! keys seen most recently. A duplicate storm is many calls on a few keys in a short
//! time, which is what it catches. Keys are not told apart by database: a process that
//! uses the same key on two databases shares the guess.

use std::hash::{BuildHasher, Hash, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};

/// Slots of the table (a power of two): 32 KiB.
const SLOTS: usize = 4096;

/// 0: an empty slot.
static TABLE: [AtomicU64; SLOTS] = [const { AtomicU64::new(0) }; SLOTS];

/// A key and its window, hashed once per call.
#[derive(Clone, Copy)]
pub(crate) struct Hot(u64);

impl Hot {
    /// The key's three parts, in column order, and its window.
    pub(crate) fn of(key: [&str; 3], window_end: i64) -> Hot {
        // A fixed seed: the table only has to agree with itself, within one process.
        // foldhash rather than SipHash: a fifth of the instructions, on every enqueue.
        let mut hasher = foldhash::fast::FixedState::with_seed(0).build_hasher();
        key.hash(&mut hasher);
        window_end.hash(&mut hasher);
        Hot(hasher.finish().max(1))
    }

    fn slot(self) -> &'static AtomicU64 {
        &TABLE[self.0 as usize & (SLOTS - 1)]
    }

    /// Whether the key was seen recently.
    pub(crate) fn is_hot(self) -> bool {
        self.slot().load(Ordering::Relaxed) == self.0
    }

    /// Remembers that the key was just enqueued or found: the next call is likely a hit.
    pub(crate) fn seen(self) {
        let slot = self.slot();
        // Only a changed slot is written: a storm on one key reads its cache line and
        // never bounces it between cores.
        if slot.load(Ordering::Relaxed) != self.0 {
            slot.store(self.0, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(resource: &str) -> [&str; 3] {
        ["user-1", "hot-keys-test", resource]
    }

    #[test]
    fn a_key_is_hot_once_seen_and_per_window() {
        let hot = Hot::of(key("a"), 0);
        assert!(!hot.is_hot());
        hot.seen();
        assert!(hot.is_hot());
        assert!(Hot::of(key("a"), 0).is_hot());
        assert!(!Hot::of(key("a"), 60).is_hot());
        assert!(!Hot::of(key("b"), 0).is_hot());
    }

    #[test]
    fn the_table_is_bounded_and_keeps_the_latest_key_of_a_slot() {
        let first = Hot::of(key("first"), 0);
        first.seen();
        // Find another key for the same slot: it replaces the first.
        let rival = (0..)
            .map(|n| Hot::of(key(&format!("rival-{n}")), 0))
            .find(|h| h.0 as usize & (SLOTS - 1) == first.0 as usize & (SLOTS - 1))
            .unwrap();
        rival.seen();
        assert!(rival.is_hot());
        assert!(!first.is_hot());
    }
}
