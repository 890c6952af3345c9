//! Matching a MAD to its connection: by the end that sent it (CA GUID, comm ID), by the comm-ID
//! pair, by the active side's address and comm ID before the passive ID is known, by the
//! SIDR requester and Request ID; and retransmission detection (an identical repeat of a
//! message already seen on the connection).

use ibcm_mad::{CmMessage, CommId, MsgKind};

use super::index::{addr_key, end_key, pair_key, KIND_ACTIVE, KIND_SIDR};
use super::record::{Conn, ConnKind, End, Side, SIGS};
use super::Tracker;
use crate::trace::CmEvent;

/// Signature of a message for retransmission detection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(super) struct Sig {
    pub(super) attr: u16,
    pub(super) tid: u64,
    pub(super) local: u32,
    pub(super) remote: u32,
}

impl Sig {
    /// A 64-bit digest (0 is never produced, so a zeroed slot never matches).
    fn digest(self) -> u64 {
        let mut h = (u64::from(self.attr) << 48) ^ self.tid.rotate_left(17);
        h = (h ^ (u64::from(self.local) << 32 | u64::from(self.remote)))
            .wrapping_mul(0x9e37_79b9_7f4a_7c15);
        h ^= h >> 29;
        h | 1
    }
}

/// Whether a message was seen before on its connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Repeat {
    /// First time.
    New,
    /// The same message in a new QP1 packet (new BTH PSN): the sender sent it again.
    Retrans,
    /// The same packet (same BTH PSN) captured twice, e.g. in a merge of both hosts' captures.
    Duplicate,
}

impl Conn {
    /// Records `sig`, carried in a packet with BTH PSN `psn`; says whether it was seen before,
    /// and if so whether in the same packet (a duplicate capture) or in a new one.
    pub(super) fn repeat(&mut self, sig: Sig, psn: u32) -> Repeat {
        let d = sig.digest();
        let mut seen = false;
        for (s, p) in self.sigs.iter().zip(self.sig_psns.iter()) {
            if *s == d {
                if *p == psn {
                    return Repeat::Duplicate;
                }
                seen = true;
            }
        }
        if let (Some(s), Some(p)) = (
            self.sigs.get_mut(self.sig_next),
            self.sig_psns.get_mut(self.sig_next),
        ) {
            *s = d;
            *p = psn;
        }
        self.sig_next = (self.sig_next + 1) % SIGS;
        if seen {
            Repeat::Retrans
        } else {
            Repeat::New
        }
    }
}

impl Tracker {
    /// Sets the passive comm ID once known (from an MRA or REJ before the REP) and indexes
    /// the pair.
    fn learn_passive_id(&mut self, slot: usize, id: CommId) {
        if id.0 == 0 {
            return;
        }
        let Some(c) = self.conn_mut(slot) else {
            return;
        };
        if c.passive.comm_id.is_some() {
            return;
        }
        c.passive.comm_id = Some(id);
        if let Some(a) = c.active.comm_id {
            self.put(pair_key(a.0, id.0), slot);
        }
    }

    /// Creates a connection for messages whose REQ was not seen; the sender of the first
    /// message is taken as `from`.
    fn partial(&mut self, ev: &CmEvent, local: CommId, remote: CommId, from: Side) -> usize {
        let slot = self.alloc(ev, ConnKind::Unknown);
        let (a, p) = match from {
            Side::Active => (local, remote),
            Side::Passive => (remote, local),
        };
        let (a_addr, p_addr) = match from {
            Side::Active => (ev.src, ev.dst),
            Side::Passive => (ev.dst, ev.src),
        };
        if let Some(c) = self.conn_mut(slot) {
            c.active.addr = Some(a_addr);
            c.passive.addr = Some(p_addr);
            if a.0 != 0 {
                c.active.comm_id = Some(a);
            }
            if p.0 != 0 {
                c.passive.comm_id = Some(p);
            }
        }
        if a.0 != 0 && p.0 != 0 {
            self.put(pair_key(a.0, p.0), slot);
        }
        if a.0 != 0 {
            self.put(addr_key(KIND_ACTIVE, &a_addr, a.0), slot);
        }
        slot
    }

    /// Whether a message that matches no tracked connection belongs to one evicted earlier
    /// (by one of `comm_ids` between its two addresses); if so, notes that connection's number
    /// for [`Tracker::observe`].
    fn of_evicted(&mut self, ev: &CmEvent, comm_ids: &[u32]) -> bool {
        self.evicted_hit = self.evicted.find(comm_ids, &ev.src, &ev.dst);
        self.evicted_hit.is_some()
    }

    /// Finds (or creates) the connection of a message and the sender's side; `None` for a
    /// message of no connection, or of an evicted one.
    pub(super) fn locate(&mut self, ev: &CmEvent) -> Option<(usize, Side)> {
        match &ev.mad.msg {
            CmMessage::Req(r) => {
                let key = end_key(r.local_ca_guid.0, r.local_comm_id.0);
                if let Some(slot) = self.find(&key) {
                    let same = self.conn(slot).is_some_and(|c| c.ended.is_none());
                    if same {
                        return Some((slot, Side::Active));
                    }
                    // The ID was reused after the old connection ended.
                    let retired = self.conn(slot).is_some_and(|c| c.req_sends > 0);
                    if retired {
                        self.finish(slot);
                    } else {
                        // Messages seen before this REQ (e.g. a capture that starts with a
                        // retransmitted MRA): adopt them.
                        return Some((slot, Side::Active));
                    }
                }
                if self.of_evicted(ev, &[r.local_comm_id.0]) {
                    return None;
                }
                let slot = self.alloc(ev, ConnKind::Unknown);
                if let Some(c) = self.conn_mut(slot) {
                    c.active = End {
                        addr: Some(ev.src),
                        ca_guid: Some(r.local_ca_guid),
                        comm_id: Some(r.local_comm_id),
                        qpn: Some(r.local_qpn),
                    };
                    c.passive.addr = Some(ev.dst);
                }
                self.put(key, slot);
                self.put(addr_key(KIND_ACTIVE, &ev.src, r.local_comm_id.0), slot);
                Some((slot, Side::Active))
            }
            CmMessage::Rep(r) => {
                if let Some(slot) = self.find(&end_key(r.local_ca_guid.0, r.local_comm_id.0)) {
                    return Some((slot, Side::Passive));
                }
                let slot = match self.find(&addr_key(KIND_ACTIVE, &ev.dst, r.remote_comm_id.0)) {
                    Some(s) => s,
                    None => match self.by_ids(r.local_comm_id, r.remote_comm_id) {
                        Some((s, _)) => s,
                        None => {
                            if self.of_evicted(ev, &[r.local_comm_id.0, r.remote_comm_id.0]) {
                                return None;
                            }
                            self.partial(ev, r.local_comm_id, r.remote_comm_id, Side::Passive)
                        }
                    },
                };
                self.put(end_key(r.local_ca_guid.0, r.local_comm_id.0), slot);
                self.learn_passive_id(slot, r.local_comm_id);
                Some((slot, Side::Passive))
            }
            CmMessage::SidrReq(s) => {
                let key = addr_key(KIND_SIDR, &ev.src, s.request_id.0);
                if let Some(slot) = self.find(&key) {
                    return Some((slot, Side::Active));
                }
                let slot = self.alloc(ev, ConnKind::Sidr);
                if let Some(c) = self.conn_mut(slot) {
                    c.active.addr = Some(ev.src);
                    c.passive.addr = Some(ev.dst);
                    c.request_id = Some(s.request_id.0);
                    c.service_id = Some(s.service_id);
                }
                self.put(key, slot);
                Some((slot, Side::Active))
            }
            CmMessage::SidrRep(s) => {
                let key = addr_key(KIND_SIDR, &ev.dst, s.request_id.0);
                if let Some(slot) = self.find(&key) {
                    return Some((slot, Side::Passive));
                }
                let slot = self.alloc(ev, ConnKind::Sidr);
                if let Some(c) = self.conn_mut(slot) {
                    c.active.addr = Some(ev.dst);
                    c.passive.addr = Some(ev.src);
                    c.request_id = Some(s.request_id.0);
                    c.service_id = Some(s.service_id);
                }
                self.put(key, slot);
                Some((slot, Side::Passive))
            }
            CmMessage::ClassPortInfo(_) | CmMessage::Unknown { .. } => None,
            msg => {
                let (local, remote) = (msg.local_comm_id()?, msg.remote_comm_id()?);
                if let Some(found) = self.by_ids(local, remote) {
                    return Some(found);
                }
                if let CmMessage::Rej(rej) = msg {
                    if let Some(g) = rej.timeout_ca_guid() {
                        if let Some(slot) = self.find(&end_key(g.0, local.0)) {
                            let side =
                                self.conn(slot)
                                    .map_or(Side::Active, |c| match c.active.ca_guid {
                                        Some(a) if a == g => Side::Active,
                                        _ => Side::Passive,
                                    });
                            return Some((slot, side));
                        }
                    }
                }
                // From the passive side before its REP: matched by the active side's ID.
                if remote.0 != 0 {
                    if let Some(slot) = self.find(&addr_key(KIND_ACTIVE, &ev.dst, remote.0)) {
                        self.learn_passive_id(slot, local);
                        return Some((slot, Side::Passive));
                    }
                }
                // From the active side with the passive ID still unknown (REJ of a REP seen
                // before the REP, DREQ of a half-seen connection).
                if local.0 != 0 {
                    if let Some(slot) = self.find(&addr_key(KIND_ACTIVE, &ev.src, local.0)) {
                        self.learn_passive_id(slot, remote);
                        return Some((slot, Side::Active));
                    }
                }
                if self.of_evicted(ev, &[local.0, remote.0]) {
                    return None;
                }
                // Unknown: the REQ is not in the capture. RTU comes from the active side, the
                // others are attributed to whoever is seen first.
                let from = match msg {
                    CmMessage::Mra(m) if m.message_mraed == MsgKind::Req => Side::Passive,
                    CmMessage::Rej(m) if m.message_rejected == MsgKind::Req => Side::Passive,
                    _ => Side::Active,
                };
                Some((self.partial(ev, local, remote, from), from))
            }
        }
    }
}
