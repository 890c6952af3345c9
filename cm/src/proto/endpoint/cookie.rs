//! The stateless mode under pressure (docs/protocol.md §5.12), in the spirit of TCP SYN
//! cookies: a REQ for a listener with a [`StatelessAccept`] template, arriving while the
//! half-open table is under pressure, is answered at once with a REP whose local comm ID is
//! an authenticated cookie, and creates no connection, timer, event, peer entry or half-open
//! slot. The connection is made when the RTU comes back naming the cookie.
//!
//! What the RTU cannot carry. An RTU echoes only the two comm IDs (and the active side's own
//! private data): the connection also needs the peer's QPN, start PSN, CA GUID, path values,
//! timeouts and the REQ's private data — 112 bits and more that a Linux peer sends only in its
//! REQ. So, unlike a TCP SYN cookie, ibcm's cookie cannot hold everything: the REQ itself is
//! kept in a fixed, preallocated table (`Cookies`): 8-way sets chosen by a keyed hash of (peer
//! address, peer's comm ID), a new REQ taking a free, used or expired way, else the oldest of
//! its set (with 8 ways a legitimate REQ is lost only if 8 newer REQs land in its set before
//! its RTU comes back, instead of any one with a single way). The cookie is a keyed MAC (SipHash-2-4, key from the
//! endpoint's RNG: OS randomness, or the fixed seed in tests) over the time slot, the peer
//! address and the REQ's comm ID, CA GUID, QPN, start PSN, service ID and transport; the REP's
//! start PSN and local QPN are derived from the same MAC. An RTU is accepted only if its slot
//! holds the REQ it answers, from the RTU's source, with exactly that cookie, in time, and not
//! used before.
//!
//! The file holds the table and the handlers: `stateless_req` (answer, or re-answer a
//! repeated REQ with the same REP), `stateless_resend_due` (the one REP retransmission, from
//! a bounded queue) and `stateless_rtu` (verify, recreate, report
//! [`EventKind::StatelessEstablished`]).

use std::collections::{BTreeMap, VecDeque};
use std::hash::{Hash, Hasher};
use std::time::{Duration, Instant};

use ibcm_mad::cma::CmaHeader;
use ibcm_mad::{
    CmMessage, CommId, MsgKind, PrivateData, Psn, Qpn, RejReason, Rep, Req, ReqTransport, Rtu,
    ServiceId, Tid,
};
use rand::Rng;
use rand_chacha::ChaCha8Rng;
use siphasher::sip::SipHasher24;
use siphasher::sip128::{Hasher128, SipHasher24 as Sip128};

use super::io::rej;
use super::limits::source_of;
use super::Endpoint;
use crate::proto::util::check_len;
use crate::proto::{
    CallError, DropReason, EventKind, PeerAddr, ReqInfo, State, StatelessAccept, StatelessInfo,
};

/// The ChaCha stream the cookie keys are drawn from: the endpoint's seed, another stream, so
/// that drawing them changes nothing else the seed decides (comm IDs, PSNs, hash seeds).
const KEY_STREAM: u64 = 0x636f_6f6b_6965;

/// One REQ answered statelessly: what the RTU cannot carry.
#[derive(Debug, Clone)]
struct Digest {
    /// The REQ as received.
    req: Req,
    /// Keyed hash of the address it came from.
    peer_fp: u64,
    /// Its TID (the connection's, as in the stateful path).
    tid: Tid,
    /// The time slot its cookie was made in.
    slot: u32,
    /// Its RTU was taken (or refused) already: another one is a replay.
    used: bool,
    /// Insertion order (the oldest way of a full set is replaced).
    seq: u64,
}

/// Ways per set of the table.
const WAYS: usize = 8;

/// The stateless mode's keys, templates and REQ table (its `Debug` leaves the keys out).
pub(super) struct Cookies {
    mac_key: (u64, u64),
    index_key: (u64, u64),
    /// Sets of [`WAYS`] slots, one set per keyed hash of (peer, peer's comm ID); empty until
    /// the first stateless REP.
    table: Vec<Option<Digest>>,
    /// Insertions so far.
    seq: u64,
    /// The one REP retransmission of each stateless answer, in due order: (due, slot, its
    /// insertion number, where to), at most one per slot. The endpoint's timer queue
    /// (`proto/timer.rs`) does not hold them: they belong to no connection or ID, and this
    /// bounded FIFO keeps the mode's memory fixed.
    resend: VecDeque<(Instant, u32, u64, PeerAddr)>,
    /// The instant time slots count from (the first stateless REP's).
    epoch: Option<Instant>,
    templates: BTreeMap<ServiceId, StatelessAccept>,
}

impl std::fmt::Debug for Cookies {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cookies")
            .field("slots", &self.table.len())
            .field("inserted", &self.seq)
            .field("resend", &self.resend.len())
            .field("epoch", &self.epoch)
            .field("templates", &self.templates)
            .finish_non_exhaustive()
    }
}

impl Cookies {
    /// Keys from `rng`'s seed on a stream of their own (`rng` itself is not advanced).
    pub(super) fn new(rng: &ChaCha8Rng) -> Self {
        let mut k = rng.clone();
        k.set_stream(KEY_STREAM);
        k.set_word_pos(0);
        Cookies {
            mac_key: (k.random(), k.random()),
            index_key: (k.random(), k.random()),
            table: Vec::new(),
            seq: 0,
            resend: VecDeque::new(),
            epoch: None,
            templates: BTreeMap::new(),
        }
    }

    /// Whether stateless REPs have gone out (the table exists).
    pub(super) fn in_use(&self) -> bool {
        !self.table.is_empty()
    }

    /// When the next REP retransmission is due.
    pub(super) fn next_resend(&self) -> Option<Instant> {
        self.resend.front().map(|r| r.0)
    }

    /// Forgets a service's template (its listener is gone).
    pub(super) fn forget(&mut self, service_id: ServiceId) {
        self.templates.remove(&service_id);
    }

    fn slot(&mut self, now: Instant, period: Duration) -> u32 {
        let epoch = *self.epoch.get_or_insert(now);
        let n = now.saturating_duration_since(epoch).as_nanos() / period.as_nanos().max(1);
        u32::try_from(n).unwrap_or(u32::MAX)
    }

    /// The first slot of the set of (peer, their comm ID).
    fn set_of(&self, peer: PeerAddr, theirs: CommId) -> usize {
        let mut h = SipHasher24::new_with_keys(self.index_key.0, self.index_key.1);
        peer.hash(&mut h);
        h.write_u32(theirs.0);
        let sets = self.table.len() / WAYS;
        ((h.finish() as usize) & sets.saturating_sub(1)) * WAYS
    }

    /// The slot holding a REQ from the peer with fingerprint `fp` and comm ID `theirs`.
    fn find(&self, set: usize, fp: u64, theirs: CommId) -> Option<usize> {
        (set..set + WAYS).find(|&i| {
            self.table
                .get(i)
                .and_then(Option::as_ref)
                .is_some_and(|d| d.peer_fp == fp && d.req.local_comm_id == theirs)
        })
    }

    /// Where a new REQ goes in its set: its own earlier slot, else a free one, else a used or
    /// expired one, else the oldest. `true` with it when an unanswered REQ in time is lost.
    fn victim(&self, set: usize, fp: u64, theirs: CommId, current: u32) -> (usize, bool) {
        if let Some(i) = self.find(set, fp, theirs) {
            return (i, false);
        }
        let mut oldest = (u64::MAX, set);
        for i in set..set + WAYS {
            match self.table.get(i).and_then(Option::as_ref) {
                None => return (i, false),
                Some(d) if d.used || current.saturating_sub(d.slot) > 1 => return (i, false),
                Some(d) if d.seq < oldest.0 => oldest = (d.seq, i),
                Some(_) => {}
            }
        }
        (oldest.1, true)
    }

    fn fingerprint(&self, peer: PeerAddr) -> u64 {
        let mut h = SipHasher24::new_with_keys(self.index_key.1, self.index_key.0);
        peer.hash(&mut h);
        h.finish()
    }

    /// The cookie (our comm ID, never 0), the REP's start PSN and the QPN hash of a REQ from
    /// `peer` answered in time slot `slot`: one keyed 128-bit MAC over all of them.
    fn mac(&self, slot: u32, peer: PeerAddr, req: &Req) -> (CommId, Psn, u64) {
        let mut h = Sip128::new_with_keys(self.mac_key.0, self.mac_key.1);
        h.write_u32(slot);
        peer.hash(&mut h);
        h.write_u32(req.local_comm_id.0);
        h.write_u64(req.local_ca_guid.0);
        h.write_u32(req.local_qpn.get());
        h.write_u32(req.starting_psn.get());
        h.write_u64(req.service_id.0);
        h.write_u8(req.transport() as u8);
        let m = h.finish128();
        let cookie = (m.h1 as u32).max(1);
        (CommId(cookie), Psn::masked((m.h1 >> 32) as u32), m.h2)
    }

    /// Allocates the table on first use: `slots` rounded up to a power of two, one set at
    /// least.
    fn allocate(&mut self, slots: usize) {
        if self.table.is_empty() {
            let n = slots.clamp(WAYS, 1 << 24).next_power_of_two();
            self.table = vec![None; n];
        }
    }
}

/// The REP's local QPN for a template and a MAC's QPN hash.
fn qpn_of(t: &StatelessAccept, h: u64) -> Qpn {
    let off = (h % u64::from(t.qpn_count.max(1))) as u32;
    Qpn::masked(t.qpn_base.get().wrapping_add(off))
}

/// The REP answering `req` with template `t`, cookie, PSN and QPN.
fn build_rep(
    t: &StatelessAccept,
    guid: ibcm_mad::Guid,
    req: &Req,
    cookie: CommId,
    psn: Psn,
    qpn: Qpn,
) -> Rep {
    Rep {
        local_comm_id: cookie,
        remote_comm_id: req.local_comm_id,
        local_ca_guid: guid,
        local_qpn: qpn,
        starting_psn: psn,
        private_data: PrivateData::from_slice(&t.rep.private_data).unwrap_or_default(),
        ..t.rep.rep_fields()
    }
}

impl Endpoint {
    /// Sets (`Some`) or removes (`None`) the stateless template of a listened service ID:
    /// under pressure ([`EndpointConfig::stateless_threshold`], or always with
    /// [`EndpointConfig::stateless_always`]) its REQs are answered statelessly from it
    /// (docs/protocol.md §5.12). Unlistening removes it.
    ///
    /// [`EndpointConfig::stateless_threshold`]: crate::proto::EndpointConfig::stateless_threshold
    /// [`EndpointConfig::stateless_always`]: crate::proto::EndpointConfig::stateless_always
    ///
    /// # Errors
    /// [`CallError::TooLong`] for REP private data over 196 bytes.
    pub fn set_stateless(
        &mut self,
        service_id: ServiceId,
        template: Option<StatelessAccept>,
    ) -> Result<(), CallError> {
        match template {
            Some(t) => {
                check_len(
                    "REP private data",
                    &t.rep.private_data,
                    Rep::PRIVATE_DATA_LEN,
                )?;
                self.cookies.templates.insert(service_id, t);
            }
            None => self.cookies.forget(service_id),
        }
        Ok(())
    }

    /// Whether a REQ that passed the duplicate, stale and listener checks is answered
    /// statelessly: its listener has a template, it is no XRC REQ, and the endpoint is under
    /// pressure (or always), or this very REQ was answered statelessly already (a repeat after
    /// a lost REP gets the same answer, whatever the pressure now).
    pub(super) fn stateless_wanted(&mut self, now: Instant, from: PeerAddr, req: &Req) -> bool {
        if req.transport() == ReqTransport::Xrc
            || !self.cookies.templates.contains_key(&req.service_id)
        {
            return false;
        }
        if self.cfg.stateless_always || self.half_open() >= self.cfg.stateless_threshold {
            return true;
        }
        self.repeat_of(now, from, req).is_some()
    }

    /// The table slot holding this REQ from `from`, answered in this or the previous time
    /// slot and not used yet.
    fn repeat_of(&mut self, now: Instant, from: PeerAddr, req: &Req) -> Option<usize> {
        if self.cookies.table.is_empty() {
            return None;
        }
        let current = self.cookies.slot(now, self.cfg.stateless_period);
        let set = self.cookies.set_of(from, req.local_comm_id);
        let fp = self.cookies.fingerprint(from);
        let i = self.cookies.find(set, fp, req.local_comm_id)?;
        let d = self.cookies.table.get(i)?.as_ref()?;
        (d.req == *req && !d.used && current.saturating_sub(d.slot) <= 1).then_some(i)
    }

    /// Answers a REQ statelessly: the cookie REP goes out at once and the REQ is kept in its
    /// table slot (a repeat gets the same REP from the slot it already holds). Returns `false`
    /// (nothing sent) when the cookie is the ID of a live connection or its QPN is in use or
    /// quarantined (`Stats::stateless_qpn_in_use`): the caller then takes the stateful path.
    pub(super) fn stateless_req(
        &mut self,
        now: Instant,
        from: PeerAddr,
        tid: Tid,
        req: Req,
    ) -> bool {
        let repeat = self.repeat_of(now, from, &req);
        let current = self.cookies.slot(now, self.cfg.stateless_period);
        let slot = match repeat.and_then(|i| self.cookies.table.get(i)?.as_ref()) {
            Some(d) => d.slot,
            None => current,
        };
        let (cookie, psn, qh) = self.cookies.mac(slot, from, &req);
        // Any ID in use (a connection, an incoming or an outgoing SIDR request) takes the
        // stateful path: the recreated connection must not share its ID.
        if self.id_taken(cookie) {
            return false;
        }
        let Some(t) = self.cookies.templates.get(&req.service_id) else {
            return false;
        };
        let qpn = qpn_of(t, qh);
        // A REP naming a QPN that a live connection of ours uses (or TimeWait holds) would
        // make a Linux peer holding that connection find it stale (`cm_rep_handler`: REJ 10
        // and a DREQ for its live connection): a collision in the template's range must not
        // tear down a connection, so this REQ takes the stateful path. A repeat keeps the REP
        // it got (the RTU check refuses that QPN with REJ 3 if it is still taken).
        if repeat.is_none() && self.check_qpn(qpn, now, false).is_err() {
            self.io.stats.stateless_qpn_in_use += 1;
            return false;
        }
        let rep = build_rep(t, self.cfg.local_ca_guid, &req, cookie, psn, qpn);
        self.io.stats.stateless_replies += 1;
        self.io.send(from, tid, CmMessage::Rep(rep));
        if repeat.is_some() {
            self.io.stats.duplicate_replies += 1;
            return true;
        }
        self.cookies.allocate(self.cfg.stateless_slots);
        let set = self.cookies.set_of(from, req.local_comm_id);
        let fp = self.cookies.fingerprint(from);
        let (i, lost) = self.cookies.victim(set, fp, req.local_comm_id, current);
        if lost {
            self.io.stats.stateless_overwritten += 1;
        }
        self.cookies.seq += 1;
        let seq = self.cookies.seq;
        if let Some(cell) = self.cookies.table.get_mut(i) {
            *cell = Some(Digest {
                req,
                peer_fp: fp,
                tid,
                slot: current,
                used: false,
                seq,
            });
        }
        if let Some(d) = self.cfg.stateless_resend {
            let q = &mut self.cookies.resend;
            if q.len() >= self.cookies.table.len() {
                q.pop_front();
            }
            q.push_back((now + d, i as u32, seq, from));
        }
        true
    }

    /// The REP retransmissions due at `now`: each stateless answer whose RTU has not come
    /// (its slot still holds it, unused and in time) gets its REP once more, the same bytes
    /// (a lost REP, or a lost RTU: a peer in ESTABLISHED answers a repeated REP with its RTU
    /// again, docs/protocol.md §5.12).
    pub(super) fn stateless_resend_due(&mut self, now: Instant) {
        let current = self.cookies.slot(now, self.cfg.stateless_period);
        while let Some(&(due, i, seq, to)) = self.cookies.resend.front() {
            if due > now {
                return;
            }
            self.cookies.resend.pop_front();
            let Some(d) = self
                .cookies
                .table
                .get(i as usize)
                .and_then(Option::as_ref)
                .filter(|d| d.seq == seq && !d.used && current.saturating_sub(d.slot) <= 1)
            else {
                continue;
            };
            let (cookie, psn, qh) = self.cookies.mac(d.slot, to, &d.req);
            let Some(t) = self.cookies.templates.get(&d.req.service_id) else {
                continue;
            };
            let rep = build_rep(
                t,
                self.cfg.local_ca_guid,
                &d.req,
                cookie,
                psn,
                qpn_of(t, qh),
            );
            let tid = d.tid;
            self.io.stats.retransmits += 1;
            self.io.stats.stateless_replies += 1;
            self.io.send(to, tid, CmMessage::Rep(rep));
        }
    }

    /// An RTU naming no connection, while stateless REPs are out: verifies its cookie and
    /// recreates the connection, or drops it counted by reason (`UnknownCommId`: no REQ from
    /// that source with that comm ID in the table; `BadCookie`: the cookie is not the MAC of
    /// that REQ; `ReplayedCookie`: its RTU was taken already; `ExpiredCookie`: out of time).
    pub(super) fn stateless_rtu(&mut self, from: PeerAddr, m: Rtu) {
        let Some(now) = self.io.now else {
            self.io.stats.drop(DropReason::UnknownCommId);
            return;
        };
        let current = self.cookies.slot(now, self.cfg.stateless_period);
        let set = self.cookies.set_of(from, m.local_comm_id);
        let fp = self.cookies.fingerprint(from);
        let found = self.cookies.find(set, fp, m.local_comm_id);
        let Some((i, d)) = found.and_then(|i| Some((i, self.cookies.table.get(i)?.as_ref()?)))
        else {
            self.io.stats.drop(DropReason::UnknownCommId);
            return;
        };
        let (cookie, psn, qh) = self.cookies.mac(d.slot, from, &d.req);
        let reason = if cookie != m.remote_comm_id {
            Some(DropReason::BadCookie)
        } else if d.used {
            Some(DropReason::ReplayedCookie)
        } else if current.saturating_sub(d.slot) > 1 {
            Some(DropReason::ExpiredCookie)
        } else {
            None
        };
        if let Some(r) = reason {
            self.io.stats.drop(r);
            return;
        }
        let (req, tid) = (d.req, d.tid);
        if let Some(Some(d)) = self.cookies.table.get_mut(i) {
            d.used = true;
        }
        self.recreate(now, from, tid, req, cookie, psn, qh, &m);
    }

    /// The connection of a verified cookie RTU: checked as an accept would be, then
    /// ESTABLISHED at once.
    #[allow(clippy::too_many_arguments)]
    fn recreate(
        &mut self,
        now: Instant,
        from: PeerAddr,
        tid: Tid,
        req: Req,
        cookie: CommId,
        psn: Psn,
        qh: u64,
        m: &Rtu,
    ) {
        let theirs = req.local_comm_id;
        let refuse = |ep: &mut Endpoint, reason: RejReason| {
            ep.io.stats.stateless_refused += 1;
            let msg = rej(cookie, theirs, MsgKind::Other, reason, &[], &[]);
            ep.io.send(from, tid, msg);
        };
        let template = self
            .listeners
            .contains_key(&req.service_id)
            .then(|| self.cookies.templates.get(&req.service_id))
            .flatten();
        let Some(t) = template else {
            refuse(self, RejReason::ConsumerReject);
            return;
        };
        let qpn = qpn_of(t, qh);
        let rep = build_rep(t, self.cfg.local_ca_guid, &req, cookie, psn, qpn);
        // A stateful entry for the same REQ (a repeat that came from another address and
        // found no pressure): the peer took our cookie REP (it sent this RTU), so that entry
        // answers nothing any more.
        if let Some(old) = self.conns.by_remote(theirs, req.local_ca_guid) {
            match self.conns.get_mut(&old) {
                Some(c) if c.state.is_half_open_passive() => {
                    self.io.cancel_request(old);
                    self.io.close(old, c, crate::proto::ConnectionError::Stale);
                    self.remove(old);
                }
                _ => {
                    self.io.stats.drop(DropReason::Duplicate);
                    return;
                }
            }
        }
        if self
            .conns
            .by_qpn(req.local_qpn, req.local_ca_guid)
            .is_some()
        {
            self.io.stats.stale += 1;
            refuse(self, RejReason::StaleConn);
            return;
        }
        if !self.io.limits.established_room(&self.cfg, source_of(from)) {
            self.io.stats.established_limit += 1;
            refuse(self, RejReason::NoResources);
            return;
        }
        if self.check_qpn(qpn, now, false).is_err() {
            refuse(self, RejReason::NoResources);
            return;
        }
        let mut conn = self.passive_conn(cookie, &req, from, tid);
        conn.holds_qpn = true;
        conn.local_qpn = qpn;
        self.io.set_state(cookie, &mut conn, State::Established);
        self.use_qpn(qpn);
        self.conns.insert(cookie, conn);
        self.conns.index_remote(cookie);
        self.conns.index_qpn(cookie);
        self.io.stats.stateless_established += 1;
        let cma_header = req
            .service_id
            .rdma_cm_port()
            .and_then(|_| CmaHeader::parse(req.private_data.as_bytes()).ok());
        self.io.event(
            cookie,
            EventKind::StatelessEstablished(Box::new(StatelessInfo {
                req: ReqInfo {
                    peer: from,
                    req,
                    cma_header,
                },
                rep,
                rtu_private_data: m.private_data.trimmed().to_vec(),
            })),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A table slot: the REQ as received and what the RTU lacks, 288 bytes; the docs of
    /// `stateless_slots` (docs/protocol.md §7) quote its size.
    #[test]
    fn slot_size() {
        let n = core::mem::size_of::<Option<Digest>>();
        assert!(n <= 288, "{n}");
    }
}
