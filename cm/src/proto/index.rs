//! An index of 4-byte slot numbers in which every probe reads one 64-byte cache line: 12 tags
//! and 12 slot numbers side by side, and a count of the entries that probed past the line.
//!
//! The connection table keeps its `by_remote` index here (`proto/table.rs`). Remote comm IDs
//! have no order, so with a million connections every REQ and every REP probes a random place
//! of that index. In hashbrown's layout (a control byte array and a separate slot array) such
//! a probe misses the cache and the TLB twice, once in each array; here once. The tags are 8
//! bits (hashbrown's 7), so a probe compares a record against the key half as often.
//!
//! Probing is linear, line by line. A lookup stops at the first line whose overflow count is
//! 0: no entry whose probe started at or before it went past it. An insert takes the first
//! empty place along its probe and counts itself in every full line it passed; a removal
//! counts itself out of them again, so no tombstones are left. A count that reaches 255
//! stays there (lookups then probe on past it, which is correct, only slower) until the
//! index grows. The load stays at most 10 entries per 12 places.

use allocator_api2::vec::Vec;

use super::sys::TableAlloc;

/// Places per line.
const WIDTH: usize = 12;
/// The tag of an empty place.
const EMPTY: u8 = 0;
/// Most entries per line on average before the index grows.
const MAX_LOAD: usize = 10;

/// One cache line: the tags, the overflow count and the slot numbers.
#[derive(Debug, Clone, Copy)]
#[repr(C, align(64))]
struct Line {
    tags: [u8; WIDTH],
    /// Entries stored past this line whose probe passed through it (saturating at 255).
    overflow: u8,
    _pad: [u8; 3],
    slots: [u32; WIDTH],
}

const EMPTY_LINE: Line = Line {
    tags: [EMPTY; WIDTH],
    overflow: 0,
    _pad: [0; 3],
    slots: [0; WIDTH],
};

/// The index (see the module docs).
#[derive(Debug)]
pub(super) struct LineIndex {
    /// A power of two of them, or none.
    lines: Vec<Line, TableAlloc>,
    len: usize,
}

/// A hash's tag: its top 8 bits, 0 made 1 (0 marks an empty place).
fn tag(hash: u64) -> u8 {
    ((hash >> 56) as u8).max(1)
}

impl LineIndex {
    /// An empty index whose lines come from `alloc`.
    pub(super) fn new(alloc: TableAlloc) -> Self {
        LineIndex {
            lines: Vec::new_in(alloc),
            len: 0,
        }
    }

    /// The line a hash's probe starts at.
    fn home(&self, hash: u64) -> usize {
        (hash as usize) & self.lines.len().wrapping_sub(1)
    }

    fn next(&self, i: usize) -> usize {
        (i + 1) & self.lines.len().wrapping_sub(1)
    }

    /// Where (line, place) the entry with `hash` for which `eq` holds is.
    fn position(&self, hash: u64, mut eq: impl FnMut(u32) -> bool) -> Option<(usize, usize)> {
        let t = tag(hash);
        let mut i = self.home(hash);
        for _ in 0..self.lines.len() {
            let line = self.lines.get(i)?;
            for (k, (&lt, &s)) in line.tags.iter().zip(line.slots.iter()).enumerate() {
                if lt == t && eq(s) {
                    return Some((i, k));
                }
            }
            if line.overflow == 0 {
                return None;
            }
            i = self.next(i);
        }
        None
    }

    /// The entry with `hash` for which `eq` holds.
    pub(super) fn find(&self, hash: u64, eq: impl FnMut(u32) -> bool) -> Option<u32> {
        let (i, k) = self.position(hash, eq)?;
        self.lines.get(i)?.slots.get(k).copied()
    }

    /// The entry with `hash` for which `eq` holds, to change its slot number.
    pub(super) fn find_mut(&mut self, hash: u64, eq: impl FnMut(u32) -> bool) -> Option<&mut u32> {
        let (i, k) = self.position(hash, eq)?;
        self.lines.get_mut(i)?.slots.get_mut(k)
    }

    /// Adds `slot` under `hash` (the caller knows no entry for `slot`'s key is there).
    /// `rehash` gives the hash of any entry, for growing.
    pub(super) fn insert_unique(&mut self, hash: u64, slot: u32, rehash: impl Fn(u32) -> u64) {
        if self.len >= self.lines.len() * MAX_LOAD {
            self.grow(&rehash);
        }
        self.place(hash, slot);
        self.len += 1;
    }

    /// Stores `slot` at the first empty place of its probe, counting it in the full lines it
    /// passes. The caller has made room (the load is below [`MAX_LOAD`], so some line has an
    /// empty place).
    fn place(&mut self, hash: u64, slot: u32) {
        let t = tag(hash);
        let mut i = self.home(hash);
        for _ in 0..self.lines.len() {
            let Some(line) = self.lines.get_mut(i) else {
                return;
            };
            if let Some(k) = line.tags.iter().position(|&x| x == EMPTY) {
                if let (Some(lt), Some(s)) = (line.tags.get_mut(k), line.slots.get_mut(k)) {
                    *lt = t;
                    *s = slot;
                }
                return;
            }
            line.overflow = line.overflow.saturating_add(1);
            i = self.next(i);
        }
    }

    /// Removes the entry with `hash` for which `eq` holds; returns its slot number.
    pub(super) fn remove(&mut self, hash: u64, eq: impl FnMut(u32) -> bool) -> Option<u32> {
        let (j, k) = self.position(hash, eq)?;
        let line = self.lines.get_mut(j)?;
        let slot = *line.slots.get(k)?;
        *line.tags.get_mut(k)? = EMPTY;
        self.len -= 1;
        // Count it out of the full lines its probe passed.
        let mut i = self.home(hash);
        while i != j {
            if let Some(l) = self.lines.get_mut(i) {
                if l.overflow != u8::MAX {
                    l.overflow = l.overflow.saturating_sub(1);
                }
            }
            i = self.next(i);
        }
        Some(slot)
    }

    /// Twice the lines (one to begin with), every entry placed again.
    fn grow(&mut self, rehash: &impl Fn(u32) -> u64) {
        let n = (self.lines.len() * 2).max(1);
        let mut lines = Vec::with_capacity_in(n, *self.lines.allocator());
        lines.resize(n, EMPTY_LINE);
        let old = std::mem::replace(&mut self.lines, lines);
        for line in &old {
            for (&t, &s) in line.tags.iter().zip(line.slots.iter()) {
                if t != EMPTY {
                    self.place(rehash(s), s);
                }
            }
        }
    }

    /// Starts loading the line a lookup of `hash` begins at into the cache, without waiting
    /// for it (a hint the CPU may drop).
    pub(super) fn prefetch(&self, hash: u64) {
        // Out of range (an empty index) prefetches nothing: the crate reads no memory, the CPU
        // drops a hint it cannot use.
        if self.home(hash) < self.lines.len() {
            prefetch_index::prefetch_index(&self.lines, self.home(hash));
        }
    }

    /// Heap bytes.
    pub(super) fn heap_bytes(&self) -> usize {
        self.lines.capacity() * core::mem::size_of::<Line>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A hash that sends every key to line 0 unless `spread`.
    fn h(key: u32, spread: bool) -> u64 {
        let mixed = u64::from(key).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        if spread {
            mixed
        } else {
            mixed & !0xffff_ffff
        }
    }

    #[test]
    fn a_line_is_a_cache_line() {
        assert_eq!(core::mem::size_of::<Line>(), 64);
        assert_eq!(core::mem::align_of::<Line>(), 64);
    }

    #[test]
    fn finds_what_it_holds_and_nothing_else() {
        for spread in [true, false] {
            // Slot number = key, so the hash of an entry is known from it.
            let mut ix = LineIndex::new(TableAlloc::default());
            for k in 0..5_000u32 {
                ix.insert_unique(h(k, spread), k, |s| h(s, spread));
            }
            assert_eq!(ix.len, 5_000);
            assert!(ix.len <= ix.lines.len() * MAX_LOAD);
            for k in 0..5_000u32 {
                assert_eq!(ix.find(h(k, spread), |s| s == k), Some(k));
            }
            assert_eq!(ix.find(h(9_999, spread), |s| s == 9_999), None);
            // Remove every other one: the rest are still found (no probe is cut short).
            for k in (0..5_000u32).step_by(2) {
                assert_eq!(ix.remove(h(k, spread), |s| s == k), Some(k));
                assert_eq!(ix.remove(h(k, spread), |s| s == k), None);
            }
            for k in 0..5_000u32 {
                let want = (k % 2 == 1).then_some(k);
                assert_eq!(ix.find(h(k, spread), |s| s == k), want);
            }
            // Changing an entry's slot number in place.
            if let Some(s) = ix.find_mut(h(1, spread), |s| s == 1) {
                *s = 77_777;
            }
            assert_eq!(ix.find(h(1, spread), |s| s == 77_777), Some(77_777));
            if !spread {
                continue;
            }
            // With every entry gone the overflow counts are back to 0.
            for k in (1..5_000u32).step_by(2) {
                let key = if k == 1 { 77_777 } else { k };
                assert!(ix.remove(h(k, spread), |s| s == key).is_some());
            }
            assert_eq!(ix.len, 0);
            assert!(ix.lines.iter().all(|l| l.overflow == 0));
        }
    }

    #[test]
    fn empty_index_finds_nothing() {
        let mut ix = LineIndex::new(TableAlloc::default());
        assert_eq!(ix.find(5, |_| true), None);
        assert_eq!(ix.remove(5, |_| true), None);
        assert_eq!(ix.heap_bytes(), 0);
    }
}
