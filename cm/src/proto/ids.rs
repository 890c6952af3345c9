//! Local communication IDs (docs/wire.md §4.5), SIDR request IDs and TIDs.

use ibcm_mad::{CommId, RequestId, Tid};

/// Allocates local comm IDs: a counter (from a random start) through a keyed permutation of
/// the 32-bit space, an 8-round Feistel network over 16-bit halves with 64-bit round keys
/// drawn from the endpoint's RNG. Being a permutation, it repeats an ID only after 2³²
/// allocations; being keyed, consecutive IDs show no pattern (Linux's cursor XOR a fixed
/// operand makes consecutive IDs differ by 2^k − 1, so one observed ID predicts the next
/// within 32 guesses). The caller skips IDs still in use (a connection in TimeWait keeps its
/// ID). Not a vetted cipher: it keeps an off-path peer from guessing, it is no secret store.
#[derive(Debug, Clone)]
pub(crate) struct IdAllocator {
    next: u32,
    keys: [u64; 8],
}

impl IdAllocator {
    /// An allocator with the given round keys, counting from `start`.
    pub(crate) fn new(start: u32, keys: [u64; 8]) -> Self {
        IdAllocator { next: start, keys }
    }

    /// The permutation applied to the counter.
    fn permute(&self, x: u32) -> u32 {
        let (mut l, mut r) = ((x >> 16) as u16, x as u16);
        for &k in &self.keys {
            let f = round(r, k);
            (l, r) = (r, l ^ f);
        }
        (u32::from(l) << 16) | u32::from(r)
    }

    /// The counter value `id` is the image of (the permutation run backwards). Consecutive
    /// allocations give consecutive values: the connection table hashes local IDs by it, so
    /// that connections made one after the other sit together in its index.
    pub(crate) fn counter_of(&self, id: CommId) -> u32 {
        let (mut l, mut r) = ((id.0 >> 16) as u16, id.0 as u16);
        for &k in self.keys.iter().rev() {
            (l, r) = (r ^ round(l, k), l);
        }
        (u32::from(l) << 16) | u32::from(r)
    }

    /// The next ID for which `in_use` is false (never 0).
    pub(crate) fn alloc(&mut self, mut in_use: impl FnMut(CommId) -> bool) -> CommId {
        loop {
            let id = self.permute(self.next);
            self.next = self.next.wrapping_add(1);
            if id != 0 && !in_use(CommId(id)) {
                return CommId(id);
            }
        }
    }
}

/// The Feistel round function: a keyed 64-bit mix of the half block.
fn round(r: u16, k: u64) -> u16 {
    let mut x = (u64::from(r) | (u64::from(r) << 32)) ^ k;
    x = x.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    x ^= x >> 29;
    x = x.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x ^= x >> 32;
    (x >> 16) as u16
}

/// The request ID of a SIDR_REQ this endpoint sent. It comes from the local comm ID allocator
/// (so it never collides with a connection's ID, and the application knows the request by it:
/// the `conn` of its SIDR events), but it is no comm ID: on the wire it is the SIDR Request ID
/// that the SIDR_REP echoes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct SidrReqId(u32);

impl SidrReqId {
    /// The request ID for an ID freshly drawn from [`IdAllocator`].
    pub(crate) fn allocated(id: CommId) -> Self {
        SidrReqId(id.0)
    }

    /// The request a SIDR_REP answers.
    pub(crate) fn from_wire(id: RequestId) -> Self {
        SidrReqId(id.0)
    }

    /// From a timer queue key.
    pub(crate) fn from_raw(raw: u32) -> Self {
        SidrReqId(raw)
    }

    /// The Request ID field of our SIDR_REQ.
    pub(crate) fn wire(self) -> RequestId {
        RequestId(self.0)
    }

    /// The ID the application knows the request by (the `conn` of its SIDR events).
    pub(crate) fn handle(self) -> CommId {
        CommId(self.0)
    }

    /// The timer queue key.
    pub(crate) fn raw(self) -> u32 {
        self.0
    }
}

/// A TID as Linux's `cm_form_tid` builds it: the agent's `hi_tid` in the high half, the local
/// comm ID (in the byte order Linux stores it) in the low half.
pub(crate) fn form_tid(hi_tid: u32, local: CommId) -> Tid {
    Tid((u64::from(hi_tid) << 32) | u64::from(local.0.swap_bytes()))
}

/// Linux's `cm_ack_timeout`: the ACK timeout exponent from a CA ACK delay and a packet life
/// time (docs/wire.md §4.2).
pub(crate) fn cm_ack_timeout(ca_ack_delay: u8, packet_life_time: u8) -> u8 {
    let mut t = u16::from(packet_life_time) + 1;
    let ack = u16::from(ca_ack_delay);
    if t >= ack {
        if ack + 1 >= t {
            t += 1;
        }
    } else if t + 1 >= ack {
        t = ack + 1;
    } else {
        t = ack;
    }
    t.min(31) as u8
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_skip_zero_and_used() {
        let keys = [1, 2, 3, 4, 5, 6, 7, 8];
        let mut a = IdAllocator::new(0, keys);
        // The counter value whose image is 0 (the Feistel network run backwards) is skipped.
        let (mut l, mut r) = (0u16, 0u16);
        for &k in keys.iter().rev() {
            (l, r) = (r ^ round(l, k), l);
        }
        let zero_at = (u32::from(l) << 16) | u32::from(r);
        assert_eq!(a.permute(zero_at), 0);
        a.next = zero_at;
        assert_ne!(a.alloc(|_| false), CommId(0));
        let mut b = IdAllocator::new(7, keys);
        let first = b.permute(7);
        let second = b.permute(8);
        assert_eq!(b.alloc(|id| id == CommId(first)), CommId(second));
    }

    #[test]
    fn counter_of_inverts() {
        let a = IdAllocator::new(0, [3, 1, 4, 1, 5, 9, 2, 6]);
        for x in [0, 1, 2, 0xffff, 0x1_0000, 0xdead_beef, u32::MAX] {
            assert_eq!(a.counter_of(CommId(a.permute(x))), x);
        }
    }

    #[test]
    fn ids_are_a_permutation() {
        let a = IdAllocator::new(0, [9, 8, 7, 6, 5, 4, 3, 2]);
        let mut seen = std::collections::HashSet::new();
        for x in 0..200_000u32 {
            assert!(seen.insert(a.permute(x)), "collision at {x}");
        }
    }

    #[test]
    fn sidr_req_id_round_trips() {
        let id = SidrReqId::allocated(CommId(0x1234_5678));
        assert_eq!(id.wire(), RequestId(0x1234_5678));
        assert_eq!(SidrReqId::from_wire(id.wire()), id);
        assert_eq!(SidrReqId::from_raw(id.raw()), id);
        assert_eq!(id.handle(), CommId(0x1234_5678));
    }

    #[test]
    fn tid_like_linux() {
        // rocev2_mlx_nvme-discover: LCID 0x3eb0bde5, TID 0x00000002e5bdb03e.
        assert_eq!(form_tid(2, CommId(0x3eb0_bde5)), Tid(0x0000_0002_e5bd_b03e));
    }

    #[test]
    fn ack_timeout() {
        assert_eq!(cm_ack_timeout(0, 18), 19);
        assert_eq!(cm_ack_timeout(15, 18), 19);
        assert_eq!(cm_ack_timeout(18, 18), 20);
        assert_eq!(cm_ack_timeout(19, 18), 20);
        assert_eq!(cm_ack_timeout(25, 18), 25);
        assert_eq!(cm_ack_timeout(20, 18), 21);
        assert_eq!(cm_ack_timeout(31, 31), 31);
    }
}
