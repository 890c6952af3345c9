//! A small, fast, seeded hasher for the connection tables.
//!
//! The tables are looked up several times per CM packet, so SipHash (std's default) would be a
//! measurable share of the per-packet cost. Keys are short fixed-size integers; this is an
//! FxHash-style multiply-rotate hasher whose seed comes from std's random state once per table,
//! so a crafted capture cannot aim at one fixed hash function.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};

const K: u64 = 0x517c_c1b7_2722_0a95;

/// The hasher state.
#[derive(Debug, Clone, Copy)]
pub struct FastHasher(u64);

impl FastHasher {
    #[inline]
    fn add(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(K);
    }
}

impl Hasher for FastHasher {
    #[inline]
    fn finish(&self) -> u64 {
        // A final avalanche so that the low bits (used for bucket selection) depend on all
        // input bits.
        let mut h = self.0;
        h ^= h >> 33;
        h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
        h ^= h >> 33;
        h
    }

    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            let mut w = [0u8; 8];
            w.copy_from_slice(c);
            self.add(u64::from_le_bytes(w));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut w = [0u8; 8];
            if let Some(dst) = w.get_mut(..rest.len()) {
                dst.copy_from_slice(rest);
            }
            self.add(u64::from_le_bytes(w));
        }
    }

    #[inline]
    fn write_u8(&mut self, i: u8) {
        self.add(u64::from(i));
    }

    #[inline]
    fn write_u16(&mut self, i: u16) {
        self.add(u64::from(i));
    }

    #[inline]
    fn write_u32(&mut self, i: u32) {
        self.add(u64::from(i));
    }

    #[inline]
    fn write_u64(&mut self, i: u64) {
        self.add(i);
    }

    #[inline]
    fn write_usize(&mut self, i: usize) {
        self.add(i as u64);
    }
}

/// Builds [`FastHasher`]s with a per-table random seed.
#[derive(Debug, Clone, Copy)]
pub struct FastState(u64);

impl Default for FastState {
    fn default() -> Self {
        FastState(RandomState::new().hash_one(0x1bcu64))
    }
}

impl BuildHasher for FastState {
    type Hasher = FastHasher;

    #[inline]
    fn build_hasher(&self) -> FastHasher {
        FastHasher(self.0)
    }
}

/// A `HashMap` with [`FastState`].
pub(crate) type FastMap<K, V> = std::collections::HashMap<K, V, FastState>;

/// A key of a [`SlotIndex`]: three words (the caller packs its fields and a kind tag).
pub(crate) type Key = [u64; 3];

/// One entry: a key, the slot it names and the generation the slot had then.
#[derive(Debug, Clone, Copy, Default)]
struct Entry {
    key: Key,
    slot: u32,
    gen: u32,
}

/// An open-addressing (linear probing) index from [`Key`]s to slots of a table whose slots
/// carry generations, with lazy deletion.
///
/// An entry is *live* while its slot still has the generation it was inserted with; the owner
/// invalidates every entry of a slot at once by changing the slot's generation, so removing
/// a connection costs no look-ups here. Dead entries stay until the table is rebuilt (when
/// live and dead entries together fill 7/8 of it), so memory stays proportional to the live
/// entries.
///
/// Beside the entries, one control byte per position (0 = empty, else 0x80 | 7 bits of the
/// hash) is probed first, SwissTable-style: a look-up for an absent key, the common case for a
/// new connection, reads only the dense control bytes, which stay in the cache, and not the
/// entries, which mostly do not.
#[derive(Debug, Clone)]
pub(crate) struct SlotIndex {
    ctrl: Vec<u8>,
    entries: Vec<Entry>,
    mask: usize,
    /// Non-empty positions (live or dead entries).
    used: usize,
    seed: [u64; 3],
    /// [`SlotIndex::rebuild`]'s buffer of live entries.
    scratch: Vec<Entry>,
}

const MIN_INDEX: usize = 1024;

#[inline]
fn fold(a: u64, b: u64) -> u64 {
    let p = u128::from(a).wrapping_mul(u128::from(b));
    (p as u64) ^ ((p >> 64) as u64)
}

impl Default for SlotIndex {
    fn default() -> Self {
        let s = RandomState::new();
        SlotIndex {
            ctrl: vec![0; MIN_INDEX],
            entries: vec![Entry::default(); MIN_INDEX],
            mask: MIN_INDEX - 1,
            used: 0,
            scratch: Vec::new(),
            seed: [
                s.hash_one(1u64) | 1,
                s.hash_one(2u64) | 1,
                s.hash_one(3u64) | 1,
            ],
        }
    }
}

impl SlotIndex {
    /// Home position and control byte of `k`.
    #[inline]
    fn hash(&self, k: &Key) -> (usize, u8) {
        let h = fold(k[0] ^ self.seed[0], k[1] ^ self.seed[1]);
        let h = fold(h ^ k[2], self.seed[2]);
        ((h as usize) & self.mask, (h >> 57) as u8 | 0x80)
    }

    /// Asks the cache for the control byte and the entry where a look-up of `key` starts
    /// (a hint: no effect on the result of anything).
    #[inline]
    pub(crate) fn prefetch(&self, key: &Key) {
        let (i, _) = self.hash(key);
        prefetch_index::prefetch_index(&self.ctrl, i);
        prefetch_index::prefetch_index(&self.entries, i);
    }

    /// The slot of `key`, if its entry is live (`gen(slot)` is the slot's generation now).
    #[inline]
    pub(crate) fn get(&self, key: &Key, gen: impl Fn(u32) -> u32) -> Option<usize> {
        let (mut i, tag) = self.hash(key);
        loop {
            let c = *self.ctrl.get(i)?;
            if c == 0 {
                return None;
            }
            if c == tag {
                let e = self.entries.get(i)?;
                if e.key == *key {
                    return (gen(e.slot) == e.gen).then_some(e.slot as usize);
                }
            }
            i = (i + 1) & self.mask;
        }
    }

    /// Sets `key` → (`slot`, `slot_gen`), replacing an entry for the same key. `gen` gives
    /// every slot's generation now (used to drop dead entries when the table is rebuilt).
    pub(crate) fn insert(
        &mut self,
        key: Key,
        slot: usize,
        slot_gen: u32,
        gen: impl Fn(u32) -> u32,
    ) {
        let Ok(slot) = u32::try_from(slot) else {
            return;
        };
        if (self.used + 1) * 8 > self.entries.len() * 7 {
            self.rebuild(&gen);
        }
        let new = Entry {
            key,
            slot,
            gen: slot_gen,
        };
        let (mut i, tag) = self.hash(&key);
        loop {
            let Some(&c) = self.ctrl.get(i) else {
                return;
            };
            if c == 0 {
                break;
            }
            if c == tag {
                if let Some(e) = self.entries.get_mut(i).filter(|e| e.key == key) {
                    *e = new;
                    return;
                }
            }
            i = (i + 1) & self.mask;
        }
        if let (Some(c), Some(e)) = (self.ctrl.get_mut(i), self.entries.get_mut(i)) {
            *c = tag;
            *e = new;
            self.used += 1;
        }
    }

    /// Drops dead entries; doubles the table while live entries would fill more than half.
    fn rebuild(&mut self, gen: &impl Fn(u32) -> u32) {
        // The live entries, in a buffer kept between rebuilds (no new pages each time).
        let mut live = std::mem::take(&mut self.scratch);
        live.clear();
        live.extend(
            self.ctrl
                .iter()
                .zip(&self.entries)
                .filter(|(&c, e)| c != 0 && gen(e.slot) == e.gen)
                .map(|(_, e)| *e),
        );
        let mut cap = self.entries.len();
        while (live.len() + 1) * 2 > cap {
            cap *= 2;
        }
        if cap == self.entries.len() {
            // The same size: cleared in place (no new pages to fault in and zero).
            self.ctrl.fill(0);
        } else {
            // Grown: new allocations, advised huge pages before they are written (the index
            // is looked up at random positions: with small pages most lookups would miss the
            // TLB).
            self.ctrl = Vec::with_capacity(cap);
            crate::sys::huge_pages(&mut self.ctrl);
            self.ctrl.resize(cap, 0);
            self.entries = Vec::with_capacity(cap);
            crate::sys::huge_pages(&mut self.entries);
            self.entries.resize(cap, Entry::default());
        }
        self.mask = cap - 1;
        self.used = live.len();
        for &e in &live {
            let (mut i, tag) = self.hash(&e.key);
            while let Some(c) = self.ctrl.get_mut(i) {
                if *c == 0 {
                    *c = tag;
                    if let Some(slot) = self.entries.get_mut(i) {
                        *slot = e;
                    }
                    break;
                }
                i = (i + 1) & self.mask;
            }
        }
        self.scratch = live;
    }
}
