//! QP numbers for tools that have no real QPs: unique and unpredictable.
//!
//! A counter goes through a keyed 24-bit permutation (a balanced Feistel network on two 12-bit
//! halves, keyed from the process's random SipHash keys), so the numbers are distinct for
//! 2^24 − 2 allocations and an off-path peer cannot derive the next one from the last.
//! 0 and 1 (QP0, QP1) and 0xFF_FFFF (multicast) are skipped.

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU32, Ordering};

use ibcm_mad::Qpn;

/// A source of unique, random-looking QP numbers.
#[derive(Debug)]
pub(crate) struct QpnAlloc {
    keys: [u16; ROUNDS],
    next: AtomicU32,
}

const ROUNDS: usize = 4;
const HALF: u32 = 12;
const MASK: u32 = (1 << HALF) - 1;

impl QpnAlloc {
    /// An allocator keyed from the OS (through std's random hasher keys).
    pub(crate) fn new() -> Self {
        let s = RandomState::new();
        let mut keys = [0u16; ROUNDS];
        for (i, k) in keys.iter_mut().enumerate() {
            *k = (s.hash_one(i) & 0xffff) as u16;
        }
        QpnAlloc {
            keys,
            next: AtomicU32::new(0),
        }
    }

    /// The keyed permutation of the 24-bit `x`.
    fn permute(&self, x: u32) -> u32 {
        let (mut l, mut r) = ((x >> HALF) & MASK, x & MASK);
        for &k in &self.keys {
            let f = (r.wrapping_mul(0x9e37) ^ u32::from(k)).wrapping_mul(0x85eb) >> 7;
            (l, r) = (r, (l ^ f) & MASK);
        }
        (l << HALF) | r
    }

    /// The next QPN.
    pub(crate) fn next(&self) -> Qpn {
        loop {
            let i = self.next.fetch_add(1, Ordering::Relaxed) & 0xff_ffff;
            let q = self.permute(i);
            if q > 1 && q != 0xff_ffff {
                return Qpn::masked(q);
            }
        }
    }
}

impl Default for QpnAlloc {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unique_and_not_sequential() {
        let a = QpnAlloc::new();
        let v: Vec<u32> = (0..100_000).map(|_| a.next().get()).collect();
        let set: std::collections::HashSet<u32> = v.iter().copied().collect();
        assert_eq!(set.len(), v.len(), "unique");
        let sequential = v.windows(2).filter(|w| w[1] == w[0] + 1).count();
        assert!(sequential < 10, "{sequential} consecutive pairs");
        assert!(v.iter().all(|&q| q > 1 && q < 0xff_ffff));
        // Spread over the 24-bit space, not a narrow band.
        assert!(v.iter().any(|&q| q >= 0x80_0000) && v.iter().any(|&q| q < 0x10_0000));
    }

    #[test]
    fn permutation_is_a_bijection_on_a_sample() {
        let a = QpnAlloc::new();
        let set: std::collections::HashSet<u32> =
            (0..1 << 24).step_by(61).map(|x| a.permute(x)).collect();
        assert_eq!(set.len(), (1usize << 24).div_ceil(61));
    }
}
