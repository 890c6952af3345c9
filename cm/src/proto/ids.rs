//! Local communication IDs (docs/wire.md §4.5), SIDR request IDs and TIDs.

use ibcm_mad::{CommId, RequestId, Tid};

/// Allocates local comm IDs the way Linux does: a cyclic cursor over the 32-bit space, XORed
/// with a random operand, so IDs look random on the wire but repeat only after 2³² allocations.
/// The caller skips IDs still in use (a connection in TimeWait keeps its ID).
#[derive(Debug, Clone)]
pub(crate) struct IdAllocator {
    next: u32,
    operand: u32,
}

impl IdAllocator {
    pub(crate) fn new(operand: u32) -> Self {
        IdAllocator { next: 0, operand }
    }

    /// The next ID for which `in_use` is false (never 0).
    pub(crate) fn alloc(&mut self, mut in_use: impl FnMut(CommId) -> bool) -> CommId {
        loop {
            let id = self.next ^ self.operand;
            self.next = self.next.wrapping_add(1);
            if id != 0 && !in_use(CommId(id)) {
                return CommId(id);
            }
        }
    }
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
        let mut a = IdAllocator::new(0);
        assert_eq!(a.alloc(|_| false), CommId(1));
        let mut b = IdAllocator::new(0xdead_beef);
        let first = b.alloc(|_| false);
        assert_eq!(first, CommId(0xdead_beef));
        let second = b.alloc(|id| id == CommId(0xdead_beee));
        assert_ne!(second, CommId(0xdead_beee));
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
