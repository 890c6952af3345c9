//! The tracker's index: keys of the four kinds (end, comm-ID pair, active address, SIDR
//! requester) into the open-addressing [`SlotIndex`](crate::hash::SlotIndex), whose entries die with their slot's
//! generation; and the prefetch hints that the run loop gives ahead of [`Tracker::observe`].

use ibcm_mad::{CmMessage, CommId};

use super::record::{Conn, Side};
use super::Tracker;
use crate::hash::Key;
use crate::trace::{CmEvent, WireAddr};

/// Asks the cache for every line of `c` (a hint).
#[inline]
fn prefetch_conn(c: &Conn) {
    // `Conn` is `repr(C)` with `id` first: the lines of `c` are 64-byte steps from `c.id`.
    let first = std::slice::from_ref(&c.id);
    let lines = std::mem::size_of::<Conn>().div_ceil(64);
    for line in 0..lines {
        prefetch_index::prefetch_index(first, line * 8);
    }
}

const KIND_END: u64 = 1;
const KIND_PAIR: u64 = 2;
pub(super) const KIND_ACTIVE: u64 = 3;
pub(super) const KIND_SIDR: u64 = 4;

/// Index key of one end: (CA GUID, comm ID).
#[inline]
pub(super) fn end_key(guid: u64, id: u32) -> Key {
    [guid, u64::from(id), KIND_END << 56]
}

/// Index key of a comm-ID pair (active, passive).
#[inline]
pub(super) fn pair_key(a: u32, p: u32) -> Key {
    [u64::from(a) << 32 | u64::from(p), 0, KIND_PAIR << 56]
}

/// Index key of (address, 32-bit ID) of kind `kind`.
#[inline]
pub(super) fn addr_key(kind: u64, e: &WireAddr, id: u32) -> Key {
    let (tag, bytes): (u64, [u8; 16]) = match e {
        WireAddr::Ip(std::net::IpAddr::V4(a)) => (1, a.to_ipv6_mapped().octets()),
        WireAddr::Ip(std::net::IpAddr::V6(a)) => (2, a.octets()),
        WireAddr::Gid(g) => (3, g.0),
        WireAddr::Lid(l) => (4, u128::from(l.0).to_be_bytes()),
    };
    let w = u128::from_be_bytes(bytes);
    [
        (w >> 64) as u64,
        w as u64,
        kind << 56 | tag << 48 | u64::from(id),
    ]
}

impl Tracker {
    #[inline]
    pub(super) fn find(&self, key: &Key) -> Option<usize> {
        let gens = &self.gens;
        self.index
            .get(key, |s| gens.get(s as usize).copied().unwrap_or(0))
    }

    #[inline]
    pub(super) fn put(&mut self, key: Key, slot: usize) {
        let gens = &self.gens;
        let g = gens.get(slot).copied().unwrap_or(0);
        if g == 0 {
            return;
        }
        self.index
            .insert(key, slot, g, |s| gens.get(s as usize).copied().unwrap_or(0));
    }

    #[inline]
    pub(super) fn is_live(&self, slot: usize) -> bool {
        self.gens.get(slot).is_some_and(|&g| g != 0)
    }

    #[inline]
    pub(super) fn conn(&self, slot: usize) -> Option<&Conn> {
        if self.is_live(slot) {
            self.slots.get(slot)
        } else {
            None
        }
    }

    #[inline]
    pub(super) fn conn_mut(&mut self, slot: usize) -> Option<&mut Conn> {
        if self.is_live(slot) {
            self.slots.get_mut(slot)
        } else {
            None
        }
    }

    /// Looks up the connection of a message carrying (local, remote) comm IDs; returns the
    /// slot and the sender's side.
    pub(super) fn by_ids(&self, local: CommId, remote: CommId) -> Option<(usize, Side)> {
        if let Some(s) = self.find(&pair_key(local.0, remote.0)) {
            return Some((s, Side::Active));
        }
        if let Some(s) = self.find(&pair_key(remote.0, local.0)) {
            return Some((s, Side::Passive));
        }
        None
    }

    /// Asks the cache for the connection a few places from the front of the queue of ended
    /// connections: it is finished soon, and finishing reads most of it.
    #[inline]
    pub(super) fn prefetch_next_to_finish(&self) {
        const AHEAD: usize = 8;
        if let Some(c) = self
            .ended
            .get(AHEAD)
            .and_then(|&(_, slot, _)| self.slots.get(slot))
        {
            prefetch_conn(c);
        }
    }

    /// Asks the cache for what [`Tracker::observe`] will read first for `ev`: the index
    /// positions of its keys. A hint for an event some places ahead of the one being
    /// observed; it changes nothing.
    pub(crate) fn prefetch_keys(&self, ev: &CmEvent) {
        let ix = &self.index;
        match &ev.mad.msg {
            CmMessage::Req(r) => {
                ix.prefetch(&end_key(r.local_ca_guid.0, r.local_comm_id.0));
                ix.prefetch(&addr_key(KIND_ACTIVE, &ev.src, r.local_comm_id.0));
            }
            CmMessage::Rep(r) => {
                ix.prefetch(&end_key(r.local_ca_guid.0, r.local_comm_id.0));
                ix.prefetch(&addr_key(KIND_ACTIVE, &ev.dst, r.remote_comm_id.0));
                ix.prefetch(&pair_key(r.remote_comm_id.0, r.local_comm_id.0));
            }
            CmMessage::SidrReq(s) => ix.prefetch(&addr_key(KIND_SIDR, &ev.src, s.request_id.0)),
            CmMessage::SidrRep(s) => ix.prefetch(&addr_key(KIND_SIDR, &ev.dst, s.request_id.0)),
            m => {
                if let (Some(l), Some(r)) = (m.local_comm_id(), m.remote_comm_id()) {
                    ix.prefetch(&pair_key(l.0, r.0));
                    ix.prefetch(&pair_key(r.0, l.0));
                }
            }
        }
    }

    /// Asks the cache for the connection `ev` most likely belongs to, as the index says now
    /// (a hint, after [`Tracker::prefetch_keys`] for the same event; it changes nothing).
    pub(crate) fn prefetch_conn(&self, ev: &CmEvent) {
        let slot = match &ev.mad.msg {
            CmMessage::Req(r) => self.find(&end_key(r.local_ca_guid.0, r.local_comm_id.0)),
            CmMessage::Rep(r) => self
                .find(&end_key(r.local_ca_guid.0, r.local_comm_id.0))
                .or_else(|| self.find(&addr_key(KIND_ACTIVE, &ev.dst, r.remote_comm_id.0))),
            CmMessage::SidrReq(s) => self.find(&addr_key(KIND_SIDR, &ev.src, s.request_id.0)),
            CmMessage::SidrRep(s) => self.find(&addr_key(KIND_SIDR, &ev.dst, s.request_id.0)),
            m => match (m.local_comm_id(), m.remote_comm_id()) {
                (Some(l), Some(r)) => self.by_ids(l, r).map(|(s, _)| s),
                _ => None,
            },
        };
        if let Some(c) = slot.and_then(|s| self.slots.get(s)) {
            prefetch_conn(c);
        }
    }
}
