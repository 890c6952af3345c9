//! Connection tracking: from CM MADs to connections (REQ … DREP), in constant memory.
//!
//! A connection is identified by its two ends, each a (CA GUID, Communication ID) pair
//! (docs/protocol.md §4.6): the REQ gives the active end (`local_ca_guid`, `local_comm_id`),
//! the REP the passive end and, through its Remote Comm ID, the link to the REQ. Later
//! messages carry both comm IDs but no GUID, so they are matched by the comm-ID pair in either
//! order (which also tells who sent them). Before the REP is seen, an MRA or REJ from the
//! passive side is matched by its Remote Comm ID and the active side's address (a REJ from
//! REQ_RCVD has Local Comm ID 0); a REJ with reason 4 (timeout) carries the rejecting CA's GUID
//! in its ARI and is matched by (that GUID, its Local Comm ID). SIDR_REQ / SIDR_REP pairs are
//! tracked as connections of kind [`ConnKind::Sidr`], keyed by the requester and Request ID.
//!
//! A retransmission is a repeat: same attribute, same TID and same comm IDs as a message seen
//! before on the same connection, in a new QP1 packet (another BTH PSN). The same packet with
//! the same BTH PSN is a duplicate capture (a merge of both hosts' captures sees every packet
//! twice): counted in [`Conn::duplicates`], marked in [`Note::dup`], and otherwise ignored.
//!
//! # Memory bound
//! The tracker holds at most [`TrackerConfig::max_live`] connections (default 65,536). A
//! connection is finished and handed back (through [`Tracker::observe`]'s output vector) when
//! * it ended (DREP, REJ or SIDR_REP seen) and [`TrackerConfig::grace`] of capture time passed
//!   without another message for it (late retransmissions still find it),
//! * it saw no message for [`TrackerConfig::idle`] of capture time, unless it is established
//!   and not closing (an established connection may stay quiet for hours before its DREQ), or
//! * the table is full: then the least recently active eighth of the table is finished.
//!
//! Each connection keeps at most [`TrackerConfig::max_events`] ladder entries (only when
//! [`TrackerConfig::record_events`] is set), so its size is bounded too: about 700 bytes, plus
//! 40 bytes per recorded event, plus about 600 bytes of data-path counters (boxed, only when
//! [`TrackerConfig::data`] is set).
//!
//! # Inside
//! * `record`: the connection record ([`Conn`], its ends, kind, ladder entries, [`Outcome`]);
//!   `outcome`: its timeouts and how its outcome is settled.
//! * `index`: the keys into the slot index, generation-checked look-ups, prefetch hints.
//! * `matching`: which connection a MAD belongs to, and retransmission detection.
//! * `lifetime`: slot allocation, grace period, idle sweep, eviction, finishing.
//! * Here: the [`Tracker`] itself, its settings, and [`Tracker::observe`], which applies one
//!   message to its connection.

mod data;
mod evicted;
mod index;
mod lifetime;
mod matching;
mod outcome;
mod record;
mod sa;

use std::time::Duration;

/// Ends (in MAD bytes) of the REQ fields the tracker takes, for REQs cut by the snaplen:
/// Service ID and Local CA GUID; Local QPN; the transport fields (byte 75); the primary path's
/// GIDs; its Local ACK Timeout (byte 119, the last of the timeouts).
const REQ_CA_GUID_END: usize = 48;
const REQ_QPN_END: usize = 59;
const REQ_TRANSPORT_END: u16 = 76;
const REQ_PATH_GIDS_END: usize = 112;
const REQ_TIMEOUTS_END: usize = 120;
/// Where the REP's private data starts (MAD byte).
const REP_PRIVATE_DATA: usize = 60;

use ibcm_mad::{CmMessage, CommId, Gid, ReqTransport, ServiceId, SidrStatus};

use crate::hash::{FastMap, SlotIndex};
use crate::trace::{CmEvent, Icrc, RcPacket, WireAddr};

pub(crate) use data::{DataStats, Verdict, FAMILIES, NAK_CODES};
use matching::{Repeat, Sig};
pub(crate) use record::{Conn, ConnKind, Detail, End, LadderEntry, Outcome, Phase, Side};
pub(crate) use sa::{Exchange, SaAnswer, SaCounts, SaLink, SaLinks, SaNote, SaQuery};

impl Conn {
    /// Whether the connection's data-path keys can be made (both ends' addresses and its
    /// QPNs known; for SIDR, the responder's address and the QPN and Q_Key of a SIDR_REP with
    /// status 0) and are not made yet; if so it is marked keyed and its counters are
    /// allocated.
    fn keyable(&mut self) -> bool {
        if self.data_keyed || self.passive.addr.is_none() || self.passive.qpn.is_none() {
            return false;
        }
        let ready = if self.kind == ConnKind::Sidr {
            // Only a SIDR_REP with status 0 resolves a QPN and Q_Key.
            self.data.as_deref().is_some_and(|d| d.ud_qkey.is_some())
        } else {
            self.active.addr.is_some() && self.active.qpn.is_some()
        };
        if !ready {
            return false;
        }
        self.data_keyed = true;
        self.data.get_or_insert_with(Box::default);
        true
    }
}

/// What the tracker says about one message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Note {
    /// The connection's number (none for ClassPortInfo and unknown attributes).
    pub conn: Option<u64>,
    /// Who sent it.
    pub from: Option<Side>,
    /// A repeat of an earlier message in a new packet (new BTH PSN): a retransmission.
    pub retrans: bool,
    /// The same packet as an earlier one (same BTH PSN), captured twice: a duplicate capture
    /// (e.g. a merge of both hosts' captures), not a retransmission.
    pub dup: bool,
    /// The connection is XRC.
    pub xrc: bool,
    /// The connection's Service ID.
    pub service_id: Option<ServiceId>,
    /// The connection had a problem so far (REJ, retransmission, bad ICRC).
    pub problem: bool,
    /// The connection's comm IDs (active, passive), for filtering.
    pub comm_ids: (Option<CommId>, Option<CommId>),
    /// The connection's REQ primary path GIDs (local, remote), for filtering by address.
    pub path_gids: Option<(Gid, Gid)>,
    /// For the messages of a connection whose REQ's paths follow PathRecords the capture
    /// shows the SA answering: which answers, and where the REQ disagrees with them.
    pub(crate) sa: SaNote,
}

/// Tracker settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TrackerConfig {
    /// Largest number of connections tracked at once.
    pub max_live: usize,
    /// How long an ended connection is kept for late retransmissions (capture time).
    pub grace: Duration,
    /// How long a connection without messages is kept (capture time); established connections
    /// that are not closing are kept however long they stay quiet.
    pub idle: Duration,
    /// Whether to record ladder entries.
    pub record_events: bool,
    /// Largest number of ladder entries per connection.
    pub max_events: usize,
    /// Whether to count the RC traffic on each connection's QPNs (the data path: `--ladder` and
    /// `--stats` set it).
    pub data: bool,
}

impl Default for TrackerConfig {
    fn default() -> Self {
        TrackerConfig {
            max_live: 65_536,
            grace: Duration::from_secs(10),
            idle: Duration::from_secs(600),
            record_events: false,
            max_events: 64,
            data: false,
        }
    }
}

/// Tracker counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct TrackerStats {
    /// Connections finished because the table was full.
    pub evicted: u64,
    /// Largest number of connections tracked at once.
    pub peak_live: u64,
}

/// The connection table of one capture file.
#[derive(Debug)]
pub(crate) struct Tracker {
    cfg: TrackerConfig,
    /// Connections (live where `gens` is non-zero).
    slots: Vec<Conn>,
    free: Vec<usize>,
    /// Finished connections not yet handed over (their slots are not free yet).
    finished: Vec<usize>,
    live: usize,
    next_id: u64,
    /// Generation of each slot (0 = free): index entries of an older generation are dead.
    gens: Vec<u32>,
    next_gen: u32,
    /// (CA GUID, comm ID), (comm ID pair), (active address, comm ID), (SIDR requester,
    /// Request ID) → slot.
    index: SlotIndex,
    /// Ended connections in order of ending: (ended-at, slot, conn id).
    ended: std::collections::VecDeque<(Duration, usize, u64)>,
    /// Comm IDs of evicted connections, so that their later messages are not new connections.
    evicted: evicted::Evicted,
    /// Set by `locate` when a message belongs to an evicted connection (its number).
    evicted_hit: Option<u64>,
    /// (receiving end's address, its QPN) → (slot, generation, the end is the active one):
    /// where the data-path packets of live connections are counted.
    data_index: FastMap<(WireAddr, u32), (usize, u32, bool)>,
    /// (active end's address, passive end's address, XRC SRQ number the REP announced) →
    /// (slot, generation).
    srq_index: FastMap<(WireAddr, WireAddr, u32), (usize, u32)>,
    /// (SIDR responder's address, the QPN its SIDR_REP announced) → (slot, generation): the
    /// UD SENDs from that QP.
    ud_src_index: FastMap<(WireAddr, u32), (usize, u32)>,
    /// The PathRecord exchanges of the file (SA queries and answers).
    sa: sa::SaTable,
    /// An RC / XRC packet or CNP was seen in this file.
    rc_seen: bool,
    /// A UD SEND (not to QP0/QP1) was seen in this file.
    ud_seen: bool,
    /// When the next idle sweep is due.
    next_sweep: Duration,
    now: Duration,
    /// Counters.
    pub stats: TrackerStats,
}

/// The connection slots' first allocation: room for every live connection up to 65,536
/// (address space only: pages are touched as slots are used), advised huge pages. Growing it
/// by doubling instead would copy the slots into fresh memory at each step.
fn initial_slots(max_live: usize) -> Vec<Conn> {
    let mut slots = Vec::with_capacity(max_live.clamp(8, 1 << 16));
    crate::sys::huge_pages(&mut slots);
    slots
}

impl Tracker {
    /// An empty table.
    pub(crate) fn new(cfg: TrackerConfig) -> Self {
        Tracker {
            cfg: TrackerConfig {
                max_live: cfg.max_live.max(8),
                ..cfg
            },
            slots: initial_slots(cfg.max_live),
            free: Vec::new(),
            finished: Vec::new(),
            live: 0,
            next_id: 1,
            gens: Vec::new(),
            next_gen: 1,
            index: SlotIndex::default(),
            ended: std::collections::VecDeque::new(),
            evicted: evicted::Evicted::new(cfg.max_live.max(8).saturating_mul(8).max(4096)),
            evicted_hit: None,
            data_index: FastMap::default(),
            srq_index: FastMap::default(),
            ud_src_index: FastMap::default(),
            sa: sa::SaTable::default(),
            rc_seen: false,
            ud_seen: false,
            next_sweep: Duration::ZERO,
            now: Duration::ZERO,
            stats: TrackerStats::default(),
        }
    }

    /// Tracks one CM message. Connections finished meanwhile wait for
    /// [`Tracker::drain_finished`].
    pub(crate) fn observe(&mut self, ev: &CmEvent) -> Note {
        if ev.time > self.now {
            self.now = ev.time;
        }
        self.prefetch_next_to_finish();
        self.expire();
        let Some((slot, from)) = self.locate(ev) else {
            // Either not a connection's message, or one of a connection evicted earlier:
            // tracking it stopped (it is not counted again), but its number is known.
            return Note {
                conn: self.evicted_hit.take(),
                ..Note::default()
            };
        };
        // The first REQ of a connection: the PathRecord answers it follows, if the capture
        // has any.
        let sa_links = match &ev.mad.msg {
            CmMessage::Req(r)
                if self.sa.has_answers()
                    && ev.captured.is_none()
                    && self
                        .slots
                        .get(slot)
                        .is_some_and(|c| c.req.is_none() && c.sa.is_none()) =>
            {
                self.sa.serve(r, ev.time)
            }
            _ => None,
        };
        let record = self.cfg.record_events;
        let max_events = self.cfg.max_events;
        // Data-path keys only once the file has shown RC or UD traffic: a CM-only capture
        // pays nothing for them.
        let data = self.cfg.data && (self.rc_seen || self.ud_seen);
        let counting = self.cfg.data;
        let now = self.now;
        let Some(c) = self.conn_mut(slot) else {
            return Note::default();
        };
        let msg = &ev.mad.msg;
        let sig = Sig {
            attr: msg.attr_id().raw(),
            tid: ev.mad.header.tid.0,
            local: match msg {
                CmMessage::SidrReq(s) => s.request_id.0,
                CmMessage::SidrRep(s) => s.request_id.0,
                m => m.local_comm_id().map_or(0, |c| c.0),
            },
            remote: msg.remote_comm_id().map_or(0, |c| c.0),
        };
        if sa_links.is_some() {
            c.sa = sa_links;
        }
        let repeat = c.repeat(sig, ev.wire.psn.get());
        c.last = c.last.max(ev.time);
        if repeat == Repeat::Duplicate {
            // The same packet seen twice: not a message of its own.
            c.duplicates += 1;
            if record {
                if c.events.len() < max_events {
                    c.events.push(LadderEntry {
                        frame: ev.frame,
                        time: ev.time,
                        from,
                        attr: msg.attr_id(),
                        detail: Detail::None,
                        retrans: false,
                        dup: true,
                        icrc: ev.icrc,
                    });
                } else {
                    c.events_dropped += 1;
                }
            }
            return Note {
                conn: Some(c.id),
                from: Some(from),
                retrans: false,
                dup: true,
                xrc: c.kind == ConnKind::Xrc,
                service_id: c.service_id,
                problem: c.has_message_problem(),
                comm_ids: (c.active.comm_id, c.passive.comm_id),
                path_gids: c.path_gids,
                sa: c.sa.as_deref().map(SaLinks::note).unwrap_or_default(),
            };
        }
        let retrans = repeat == Repeat::Retrans;
        c.messages += 1;
        if ev.icrc == Icrc::Bad {
            c.bad_icrc += 1;
        }
        if retrans {
            c.retransmissions += 1;
        }
        let t = ev.time;
        let mut detail = Detail::None;
        let mut ended = false;
        match msg {
            CmMessage::Req(r) => {
                c.req_sends += 1;
                c.req.get_or_insert(t);
                c.req_last = Some(t);
                if c.kind == ConnKind::Unknown && ev.captured.is_none_or(|n| n >= REQ_TRANSPORT_END)
                {
                    c.kind = match r.transport() {
                        ReqTransport::Rc => ConnKind::Rc,
                        ReqTransport::Uc => ConnKind::Uc,
                        ReqTransport::Xrc => ConnKind::Xrc,
                        ReqTransport::Other => ConnKind::Other,
                    };
                }
                // A REQ cut by the snaplen: only the fields captured are taken (the rest
                // read as 0, and a zero timeout would time the connection out at once).
                let have = ev.captured.map_or(usize::MAX, usize::from);
                c.active.comm_id = Some(r.local_comm_id);
                if have >= REQ_CA_GUID_END {
                    c.service_id = Some(r.service_id);
                    c.active.ca_guid = Some(r.local_ca_guid);
                }
                if have >= REQ_QPN_END {
                    c.active.qpn = Some(r.local_qpn);
                }
                if have >= REQ_PATH_GIDS_END {
                    c.path_gids = Some((r.primary_path.local_gid, r.primary_path.remote_gid));
                }
                if have >= REQ_TIMEOUTS_END {
                    c.req_timeouts = Some((
                        r.remote_cm_response_timeout,
                        r.local_cm_response_timeout,
                        r.primary_path.local_ack_timeout,
                        r.max_cm_retries.get(),
                    ));
                }
            }
            CmMessage::Rep(r) => {
                c.rep_sends += 1;
                c.rep.get_or_insert(t);
                c.rep_last = Some(t);
                c.passive.addr = Some(ev.src);
                c.passive.comm_id = Some(r.local_comm_id);
                // A REP cut by the snaplen: its Local CA GUID ends at MAD byte 60, its QPN
                // and EECN at 43.
                let have = ev.captured.map_or(usize::MAX, usize::from);
                if have >= 60 {
                    c.passive.ca_guid = Some(r.local_ca_guid);
                }
                if have >= 43 {
                    c.passive.qpn = Some(if c.kind == ConnKind::Xrc || r.local_qpn.get() == 0 {
                        r.xrc_tgt_qpn()
                    } else {
                        r.local_qpn
                    });
                }
                if r.local_qpn.get() == 0 && r.local_eecn.get() != 0 && c.kind == ConnKind::Unknown
                {
                    c.kind = ConnKind::Xrc;
                }
                // The XRC SRQ numbers announced in the private data (MAD byte 60 on).
                if counting && c.kind == ConnKind::Xrc && have >= REP_PRIVATE_DATA + 4 {
                    let n = have.saturating_sub(REP_PRIVATE_DATA);
                    let private = r.private_data.0.get(..n).unwrap_or(&r.private_data.0);
                    c.data.get_or_insert_with(Box::default).set_srqns(private);
                }
            }
            CmMessage::Rtu(_) => {
                c.rtu.get_or_insert(t);
            }
            CmMessage::Dreq(_) => {
                c.dreq_sends += 1;
                c.dreq.get_or_insert((t, from));
                c.dreq_last = Some(t);
            }
            CmMessage::Drep(_) => {
                c.drep.get_or_insert(t);
                ended = true;
            }
            CmMessage::Rej(r) => {
                c.rej.get_or_insert((t, from, r.reason));
                detail = Detail::Rej(r.reason, r.message_rejected);
                ended = true;
            }
            CmMessage::Mra(m) => {
                if !retrans {
                    c.mras += 1;
                }
                c.mra_last = Some((t, m.service_timeout));
                detail = Detail::Mra(m.message_mraed, m.service_timeout);
            }
            CmMessage::Lap(_) | CmMessage::Apr(_) => c.lap_apr += 1,
            CmMessage::SidrReq(_) => {
                c.req_sends += 1;
                c.req.get_or_insert(t);
                c.req_last = Some(t);
            }
            CmMessage::SidrRep(s) => {
                c.sidr_rep.get_or_insert((t, s.status));
                c.passive.qpn = Some(s.qpn);
                // The QPN and Q_Key are valid with status 0 only; its UD traffic is counted.
                if counting && s.status == SidrStatus::Success && ev.captured.is_none() {
                    c.data.get_or_insert_with(Box::default).ud_qkey = Some(s.qkey.0);
                }
                detail = Detail::Sidr(s.status);
                ended = true;
            }
            CmMessage::ClassPortInfo(_) | CmMessage::Unknown { .. } => {}
        }
        let (from_end, other_end) = match from {
            Side::Active => (&mut c.active, &mut c.passive),
            Side::Passive => (&mut c.passive, &mut c.active),
        };
        from_end.addr.get_or_insert(ev.src);
        other_end.addr.get_or_insert(ev.dst);
        if record {
            if c.events.len() < max_events {
                c.events.push(LadderEntry {
                    frame: ev.frame,
                    time: t,
                    from,
                    attr: msg.attr_id(),
                    detail,
                    retrans,
                    dup: false,
                    icrc: ev.icrc,
                });
            } else {
                c.events_dropped += 1;
            }
        }
        // Both ends' addresses and QPNs known: the connection's data path can be found.
        let data_keys = data && c.keyable();
        let note = Note {
            conn: Some(c.id),
            from: Some(from),
            retrans,
            dup: false,
            xrc: c.kind == ConnKind::Xrc,
            service_id: c.service_id,
            problem: c.has_message_problem(),
            comm_ids: (c.active.comm_id, c.passive.comm_id),
            path_gids: c.path_gids,
            sa: c.sa.as_deref().map(SaLinks::note).unwrap_or_default(),
        };
        let id = c.id;
        let newly_ended = ended && c.ended.is_none();
        if newly_ended {
            c.ended = Some(now);
            self.ended.push_back((now, slot, id));
        }
        if data_keys {
            self.key_data(slot);
        }
        note
    }

    /// The data-path keys of the connection in `slot`: (address, QPN) of its active and
    /// passive ends (SIDR: of the responder), its XRC SRQ keys, its SIDR UD source key.
    fn data_keys(&self, slot: usize) -> Vec<DataKey> {
        let mut keys = Vec::new();
        let Some(c) = self.slots.get(slot) else {
            return keys;
        };
        let end = |e: &End| Some((e.addr?, e.qpn?.get()));
        if c.kind == ConnKind::Sidr {
            if let (Some(p), true) = (end(&c.passive), c.data_keyed) {
                keys.push(DataKey::Dst(p, false));
                keys.push(DataKey::UdSrc(p));
            }
            return keys;
        }
        if let (Some(a), Some(p), true) = (end(&c.active), end(&c.passive), c.data_keyed) {
            keys.push(DataKey::Dst(a, true));
            keys.push(DataKey::Dst(p, false));
            if let Some(d) = c.data.as_deref() {
                for &srqn in d.srqns() {
                    keys.push(DataKey::Srq((a.0, p.0, srqn)));
                }
            }
        }
        keys
    }

    /// Puts a connection's data-path keys into the indexes.
    fn key_data(&mut self, slot: usize) {
        let g = self.gens.get(slot).copied().unwrap_or(0);
        for k in self.data_keys(slot) {
            match k {
                DataKey::Dst(key, active) => {
                    self.data_index.insert(key, (slot, g, active));
                }
                DataKey::Srq(key) => {
                    self.srq_index.insert(key, (slot, g));
                }
                DataKey::UdSrc(key) => {
                    self.ud_src_index.insert(key, (slot, g));
                }
            }
        }
    }

    /// The live connection behind an index entry.
    fn keyed_conn(&mut self, (slot, g): (usize, u32)) -> Option<&mut Conn> {
        if self.gens.get(slot) != Some(&g) {
            return None;
        }
        self.slots.get_mut(slot)
    }

    /// Counts an RC / XRC packet, CNP or UD SEND on the connection whose end it goes to (by
    /// address and destination QP, or for XRC requests by the XRC SRQ number; UD: a SIDR
    /// exchange's QP, either way), if any is live.
    pub(crate) fn observe_data(&mut self, p: &RcPacket) {
        if !(self.rc_seen || self.ud_seen) {
            // The first data packet of the file: the live connections get their keys now.
            for slot in 0..self.slots.len() {
                let live = self.gens.get(slot).is_some_and(|&g| g != 0);
                if live && self.slots.get_mut(slot).is_some_and(Conn::keyable) {
                    self.key_data(slot);
                }
            }
        }
        if let Some((src_qp, _)) = p.deth {
            self.ud_seen = true;
            self.observe_ud(p, src_qp.get());
            return;
        }
        self.rc_seen = true;
        if let Some(srqn) = p.srqn {
            if let Some(&hit) = self.srq_index.get(&(p.src, p.dst, srqn)) {
                if let Some(d) = self.keyed_conn(hit).and_then(|c| c.data.as_deref_mut()) {
                    d.srq_packets += 1;
                    d.add(p, false);
                    return;
                }
            }
        }
        let Some(&(slot, g, to_active)) = self.data_index.get(&(p.dst, p.dest_qp.get())) else {
            return;
        };
        if let Some(c) = self.keyed_conn((slot, g)) {
            if c.kind == ConnKind::Sidr {
                return;
            }
            if let Some(d) = c.data.as_deref_mut() {
                d.add(p, to_active);
            }
        }
    }

    /// A UD SEND: to a SIDR exchange's QP, or from it back to the requester.
    fn observe_ud(&mut self, p: &RcPacket, src_qp: u32) {
        if let Some(&(slot, g, _)) = self.data_index.get(&(p.dst, p.dest_qp.get())) {
            if let Some(c) = self
                .keyed_conn((slot, g))
                .filter(|c| c.kind == ConnKind::Sidr)
            {
                if let Some(d) = c.data.as_deref_mut() {
                    let qkey = d.ud_qkey;
                    d.add_ud(p, false, qkey);
                }
                return;
            }
        }
        if let Some(&hit) = self.ud_src_index.get(&(p.src, src_qp)) {
            if let Some(c) = self.keyed_conn(hit) {
                if c.active.addr == Some(p.dst) {
                    if let Some(d) = c.data.as_deref_mut() {
                        d.add_ud(p, true, None);
                    }
                }
            }
        }
    }

    /// Forgets the data-path keys of the connection in `slot` (it is being finished), and
    /// notes whether the capture had RC (for SIDR: UD) traffic by then.
    fn unkey_data(&mut self, slot: usize) {
        let g = self.gens.get(slot).copied().unwrap_or(0);
        let data = self.cfg.data;
        let (rc_seen, ud_seen) = (self.rc_seen, self.ud_seen);
        let Some(c) = self.slots.get_mut(slot) else {
            return;
        };
        let seen = if c.kind == ConnKind::Sidr {
            ud_seen
        } else {
            rc_seen
        };
        if data && seen {
            c.data.get_or_insert_with(Box::default).capture_has_rc = true;
        }
        if !c.data_keyed {
            return;
        }
        for k in self.data_keys(slot) {
            match k {
                DataKey::Dst(key, _) => {
                    if self
                        .data_index
                        .get(&key)
                        .is_some_and(|&(s, gen, _)| s == slot && gen == g)
                    {
                        self.data_index.remove(&key);
                    }
                }
                DataKey::Srq(key) => {
                    if self.srq_index.get(&key) == Some(&(slot, g)) {
                        self.srq_index.remove(&key);
                    }
                }
                DataKey::UdSrc(key) => {
                    if self.ud_src_index.get(&key) == Some(&(slot, g)) {
                        self.ud_src_index.remove(&key);
                    }
                }
            }
        }
    }
}

/// One data-path index entry of a connection.
enum DataKey {
    /// (address, QPN) of a receiving end, and whether it is the active end.
    Dst((WireAddr, u32), bool),
    /// (active address, passive address, XRC SRQ number).
    Srq((WireAddr, WireAddr, u32)),
    /// (SIDR responder's address, resolved QPN): UD SENDs from it.
    UdSrc((WireAddr, u32)),
}
