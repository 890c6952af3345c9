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
//! A retransmission is an identical repeat: same attribute, same TID and same comm IDs as a
//! message seen before on the same connection.
//!
//! # Memory bound
//! The tracker holds at most [`TrackerConfig::max_live`] connections (default 65,536). A
//! connection is finished and handed back (through [`Tracker::observe`]'s output vector) when
//! * it ended (DREP, REJ or SIDR_REP seen) and [`TrackerConfig::grace`] of capture time passed
//!   without another message for it (late retransmissions still find it),
//! * it saw no message for [`TrackerConfig::idle`] of capture time, or
//! * the table is full: then the least recently active eighth of the table is finished.
//!
//! Each connection keeps at most [`TrackerConfig::max_events`] ladder entries (only when
//! [`TrackerConfig::record_events`] is set), so its size is bounded too: about 300 bytes, plus
//! 40 bytes per recorded event.

use std::time::Duration;

use ibcm_mad::{
    AttrId, CmMessage, CommId, Guid, MsgKind, Qpn, RejReason, ReqTransport, ServiceId, SidrStatus,
    TimeoutExp,
};

use crate::hash::{Key, SlotIndex};
use crate::trace::{CmEvent, Icrc, WireAddr};

/// Which end of a connection sent a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Side {
    /// The side that sent the REQ (or SIDR_REQ).
    Active,
    /// The side that answered it.
    Passive,
}

impl Side {
    /// `"active"` or `"passive"`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Side::Active => "active",
            Side::Passive => "passive",
        }
    }
}

/// The kind of connection, from its REQ.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ConnKind {
    /// RC.
    Rc,
    /// UC.
    Uc,
    /// XRC (REQ Transport Service Type 3, Extended Transport Type 1).
    Xrc,
    /// Another transport type in the REQ (RD, unknown extended type).
    Other,
    /// The REQ is not in the capture.
    Unknown,
    /// A SIDR_REQ / SIDR_REP exchange.
    Sidr,
}

impl ConnKind {
    /// `"RC"`, `"UC"`, `"XRC"`, `"other"`, `"unknown"` or `"SIDR"`.
    pub const fn as_str(self) -> &'static str {
        match self {
            ConnKind::Rc => "RC",
            ConnKind::Uc => "UC",
            ConnKind::Xrc => "XRC",
            ConnKind::Other => "other",
            ConnKind::Unknown => "unknown",
            ConnKind::Sidr => "SIDR",
        }
    }
}

/// One end of a connection, as far as the capture shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct End {
    /// Address (IP, GID or LID) this end sends from.
    pub addr: Option<WireAddr>,
    /// CA GUID (REQ / REP `local_ca_guid`).
    pub ca_guid: Option<Guid>,
    /// Communication ID.
    pub comm_id: Option<CommId>,
    /// QPN (REQ / REP Local QPN; for an XRC target the TGT QPN from the REP's Local EECN).
    pub qpn: Option<Qpn>,
}

/// The phase in which a connection waited for an answer that never came.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Phase {
    /// REQ sent, no REP or REJ.
    Req,
    /// REP sent, no RTU or REJ.
    Rep,
    /// DREQ sent, no DREP.
    Dreq,
    /// SIDR_REQ sent, no SIDR_REP.
    SidrReq,
}

impl Phase {
    /// The message that went unanswered.
    pub const fn request(self) -> &'static str {
        match self {
            Phase::Req => "REQ",
            Phase::Rep => "REP",
            Phase::Dreq => "DREQ",
            Phase::SidrReq => "SIDR_REQ",
        }
    }

    /// The answer that never came.
    pub const fn answer(self) -> &'static str {
        match self {
            Phase::Req => "REP",
            Phase::Rep => "RTU",
            Phase::Dreq => "DREP",
            Phase::SidrReq => "SIDR_REP",
        }
    }
}

/// How a connection ended (as far as the capture shows).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Established and disconnected (DREQ, DREP).
    Closed {
        /// Who sent the DREQ (`None`: only the DREP was seen).
        by: Option<Side>,
    },
    /// Established and still open when the capture (or tracking) ended.
    Established,
    /// Rejected.
    Rejected {
        /// REJ reason.
        reason: RejReason,
        /// Who sent the REJ.
        by: Side,
    },
    /// A request went unanswered for longer than the sender's advertised timeout.
    TimedOut {
        /// What went unanswered.
        phase: Phase,
        /// How many times the request was sent.
        sends: u32,
    },
    /// The capture ended while a request was still within its timeout.
    Waiting {
        /// What was pending.
        phase: Phase,
    },
    /// A SIDR exchange that got its SIDR_REP.
    Resolved {
        /// SIDR_REP status.
        status: SidrStatus,
    },
    /// Messages of a connection whose REQ is not in the capture, with no end seen.
    Partial,
}

impl Outcome {
    /// A short machine-friendly name: `closed`, `established`, `rejected`, `timed_out`,
    /// `waiting`, `resolved`, `partial`.
    pub const fn as_str(&self) -> &'static str {
        match self {
            Outcome::Closed { .. } => "closed",
            Outcome::Established => "established",
            Outcome::Rejected { .. } => "rejected",
            Outcome::TimedOut { .. } => "timed_out",
            Outcome::Waiting { .. } => "waiting",
            Outcome::Resolved { .. } => "resolved",
            Outcome::Partial => "partial",
        }
    }
}

/// Extra detail of a ladder entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Detail {
    /// Nothing to add.
    None,
    /// REJ: reason and which message was rejected.
    Rej(RejReason, MsgKind),
    /// MRA: which message, and the service timeout.
    Mra(MsgKind, TimeoutExp),
    /// SIDR_REP status.
    Sidr(SidrStatus),
}

/// One message in a connection's ladder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LadderEntry {
    /// Frame number.
    pub frame: u64,
    /// Capture time.
    pub time: Duration,
    /// Who sent it.
    pub from: Side,
    /// Which message.
    pub attr: AttrId,
    /// Extra detail.
    pub detail: Detail,
    /// An identical repeat of an earlier message.
    pub retrans: bool,
    /// ICRC verdict.
    pub icrc: Icrc,
}

/// Signature of a message for retransmission detection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
struct Sig {
    attr: u16,
    tid: u64,
    local: u32,
    remote: u32,
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

const SIGS: usize = 8;

/// A tracked connection.
// `repr(C)` keeps `id` first, so that [`prefetch_conn`] can name every cache line of it.
#[derive(Debug, Clone)]
#[repr(C)]
pub struct Conn {
    /// Connection number: 1, 2, … in order of first appearance in the file.
    pub id: u64,
    /// Kind.
    pub kind: ConnKind,
    /// The side that sent the REQ.
    pub active: End,
    /// The side that answered.
    pub passive: End,
    /// Service ID (REQ, SIDR_REQ).
    pub service_id: Option<ServiceId>,
    /// SIDR Request ID.
    pub request_id: Option<u32>,
    /// Time of the first message.
    pub first: Duration,
    /// Time of the last message.
    pub last: Duration,
    /// First frame number.
    pub first_frame: u64,
    /// First REQ (or SIDR_REQ) time.
    pub req: Option<Duration>,
    /// Last REQ time.
    req_last: Option<Duration>,
    /// REQ transmissions.
    pub req_sends: u32,
    /// First REP time.
    pub rep: Option<Duration>,
    rep_last: Option<Duration>,
    /// REP transmissions.
    pub rep_sends: u32,
    /// First RTU time.
    pub rtu: Option<Duration>,
    /// First DREQ: time and sender.
    pub dreq: Option<(Duration, Side)>,
    dreq_last: Option<Duration>,
    /// DREQ transmissions.
    pub dreq_sends: u32,
    /// First DREP time.
    pub drep: Option<Duration>,
    /// First REJ: time, sender, reason.
    pub rej: Option<(Duration, Side, RejReason)>,
    /// SIDR_REP: time and status.
    pub sidr_rep: Option<(Duration, SidrStatus)>,
    /// MRAs (not counting retransmitted ones).
    pub mras: u32,
    /// Last MRA: time and service timeout.
    mra_last: Option<(Duration, TimeoutExp)>,
    /// LAP and APR messages.
    pub lap_apr: u32,
    /// Identical repeats.
    pub retransmissions: u32,
    /// Messages with a bad ICRC.
    pub bad_icrc: u32,
    /// All messages, repeats included.
    pub messages: u32,
    /// REQ timeouts: Remote CM Response Timeout, Local CM Response Timeout, primary path Local
    /// ACK Timeout, Max CM Retries.
    req_timeouts: Option<(TimeoutExp, TimeoutExp, TimeoutExp, u8)>,
    /// Recorded ladder entries (empty unless [`TrackerConfig::record_events`]).
    pub events: Vec<LadderEntry>,
    /// Entries not recorded because of [`TrackerConfig::max_events`].
    pub events_dropped: u32,
    sigs: [u64; SIGS],
    sig_next: usize,
    /// Finished at: when set, the connection ended and waits out the grace period.
    ended: Option<Duration>,
    /// Why tracking stopped early ("evicted").
    pub evicted: bool,
    /// Outcome, set when finished.
    pub outcome: Outcome,
}

impl Conn {
    fn new(id: u64, ev: &CmEvent, kind: ConnKind) -> Self {
        Conn {
            id,
            kind,
            active: End::default(),
            passive: End::default(),
            service_id: None,
            request_id: None,
            first: ev.time,
            last: ev.time,
            first_frame: ev.frame,
            req: None,
            req_last: None,
            req_sends: 0,
            rep: None,
            rep_last: None,
            rep_sends: 0,
            rtu: None,
            dreq: None,
            dreq_last: None,
            dreq_sends: 0,
            drep: None,
            rej: None,
            sidr_rep: None,
            mras: 0,
            mra_last: None,
            lap_apr: 0,
            retransmissions: 0,
            bad_icrc: 0,
            messages: 0,
            req_timeouts: None,
            events: Vec::new(),
            events_dropped: 0,
            sigs: [0; SIGS],
            sig_next: 0,
            ended: None,
            evicted: false,
            outcome: Outcome::Partial,
        }
    }

    /// Whether the connection reached ESTABLISHED (RTU seen, or a DREQ/DREP after a REP).
    pub fn established(&self) -> bool {
        self.rtu.is_some() || (self.dreq.is_some() || self.drep.is_some())
    }

    /// REQ → RTU (first REQ to first RTU).
    pub fn setup_latency(&self) -> Option<Duration> {
        let (req, rtu) = (self.req?, self.rtu?);
        rtu.checked_sub(req)
    }

    /// DREQ → DREP (first DREQ to first DREP).
    pub fn teardown_latency(&self) -> Option<Duration> {
        let ((dreq, _), drep) = (self.dreq?, self.drep?);
        drep.checked_sub(dreq)
    }

    /// Whether the connection is XRC.
    pub fn is_xrc(&self) -> bool {
        self.kind == ConnKind::Xrc
    }

    /// Whether something went wrong: rejected, timed out, retransmissions or a bad ICRC.
    pub fn has_problem(&self) -> bool {
        self.rej.is_some()
            || self.retransmissions > 0
            || self.bad_icrc > 0
            || matches!(self.outcome, Outcome::TimedOut { .. })
    }

    /// The end of `side`.
    pub fn end(&self, side: Side) -> &End {
        match side {
            Side::Active => &self.active,
            Side::Passive => &self.passive,
        }
    }

    /// Milliseconds the active side waits for an answer to one REQ (Linux: 2 × packet life
    /// time + Remote CM Response Timeout; the packet life time is taken as the REQ's Local ACK
    /// Timeout − 1, docs/wire.md §4.2, docs/protocol.md §4.3).
    fn req_try_ms(&self) -> u64 {
        match self.req_timeouts {
            Some((remote, _, ack, _)) => {
                let plt = TimeoutExp::masked(ack.get().saturating_sub(1));
                remote.linux_ms() + 2 * plt.linux_ms()
            }
            None => 4096 + 2 * 1024,
        }
    }

    /// Milliseconds the passive side waits for an RTU (Linux: the REQ's Local CM Response
    /// Timeout).
    fn rep_try_ms(&self) -> u64 {
        match self.req_timeouts {
            Some((_, local, _, _)) => local.linux_ms(),
            None => 4096,
        }
    }

    /// How many times a request is sent at most (1 + the REQ's Max CM Retries).
    pub fn max_sends(&self) -> u32 {
        match self.req_timeouts {
            Some((_, _, _, retries)) => 1 + u32::from(retries),
            None => 16,
        }
    }

    /// The deadline of a pending request, after which it counts as timed out.
    fn deadline(&self, phase: Phase) -> Option<Duration> {
        let (last, try_ms) = match phase {
            Phase::Req => (self.req_last?, self.req_try_ms()),
            Phase::Rep => (self.rep_last?, self.rep_try_ms()),
            Phase::Dreq => {
                let ms = match self.dreq.map(|d| d.1) {
                    Some(Side::Passive) => self.rep_try_ms(),
                    _ => self.req_try_ms(),
                };
                (self.dreq_last?, ms)
            }
            // rdma_cm: 4096 ms per try.
            Phase::SidrReq => (self.req_last?, 4096),
        };
        let mut deadline = last + Duration::from_millis(try_ms);
        // An MRA after the last send extends the wait by its service timeout.
        if let Some((t, st)) = self.mra_last {
            if t >= last && matches!(phase, Phase::Req | Phase::Rep) {
                deadline = deadline.max(t + Duration::from_millis(st.linux_ms() + try_ms));
            }
        }
        Some(deadline)
    }

    /// The phase the connection is waiting in, if any.
    fn pending(&self) -> Option<Phase> {
        if self.kind == ConnKind::Sidr {
            return (self.sidr_rep.is_none() && self.req.is_some()).then_some(Phase::SidrReq);
        }
        if self.rej.is_some() {
            return None;
        }
        if self.dreq.is_some() {
            return self.drep.is_none().then_some(Phase::Dreq);
        }
        if self.drep.is_some() || self.rtu.is_some() {
            return None;
        }
        if self.rep.is_some() {
            return Some(Phase::Rep);
        }
        if self.req.is_some() {
            return Some(Phase::Req);
        }
        None
    }

    fn sends(&self, phase: Phase) -> u32 {
        match phase {
            Phase::Req | Phase::SidrReq => self.req_sends,
            Phase::Rep => self.rep_sends,
            Phase::Dreq => self.dreq_sends,
        }
    }

    /// Computes the outcome as of capture time `now`.
    fn settle(&mut self, now: Duration) {
        self.outcome = if let Some((_, status)) = self.sidr_rep {
            Outcome::Resolved { status }
        } else if let Some((_, by, reason)) = self.rej.filter(|_| !self.established()) {
            Outcome::Rejected { reason, by }
        } else if let Some(phase) = self.pending() {
            let sends = self.sends(phase);
            let expired = self.deadline(phase).is_some_and(|d| now > d);
            if expired {
                Outcome::TimedOut { phase, sends }
            } else {
                Outcome::Waiting { phase }
            }
        } else if self.drep.is_some() || self.dreq.is_some() {
            Outcome::Closed {
                by: self.dreq.map(|d| d.1),
            }
        } else if self.established() {
            Outcome::Established
        } else if self.rej.is_some() {
            // Rejected after establishment: closed by the REJ.
            Outcome::Closed {
                by: self.rej.map(|r| r.1),
            }
        } else {
            Outcome::Partial
        };
    }

    /// Records `sig`; returns whether it was seen before.
    fn repeat(&mut self, sig: Sig) -> bool {
        let d = sig.digest();
        if self.sigs.contains(&d) {
            return true;
        }
        if let Some(s) = self.sigs.get_mut(self.sig_next) {
            *s = d;
        }
        self.sig_next = (self.sig_next + 1) % SIGS;
        false
    }
}

/// What the tracker says about one message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Note {
    /// The connection's number (none for ClassPortInfo and unknown attributes).
    pub conn: Option<u64>,
    /// Who sent it.
    pub from: Option<Side>,
    /// An identical repeat of an earlier message.
    pub retrans: bool,
    /// The connection is XRC.
    pub xrc: bool,
    /// The connection's Service ID.
    pub service_id: Option<ServiceId>,
    /// The connection had a problem so far (REJ, retransmission, bad ICRC).
    pub problem: bool,
    /// The connection's comm IDs (active, passive), for filtering.
    pub comm_ids: (Option<CommId>, Option<CommId>),
}

/// Tracker settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TrackerConfig {
    /// Largest number of connections tracked at once.
    pub max_live: usize,
    /// How long an ended connection is kept for late retransmissions (capture time).
    pub grace: Duration,
    /// How long a connection without messages is kept (capture time).
    pub idle: Duration,
    /// Whether to record ladder entries.
    pub record_events: bool,
    /// Largest number of ladder entries per connection.
    pub max_events: usize,
}

impl Default for TrackerConfig {
    fn default() -> Self {
        TrackerConfig {
            max_live: 65_536,
            grace: Duration::from_secs(10),
            idle: Duration::from_secs(600),
            record_events: false,
            max_events: 64,
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
const KIND_ACTIVE: u64 = 3;
const KIND_SIDR: u64 = 4;

/// Index key of one end: (CA GUID, comm ID).
#[inline]
fn end_key(guid: u64, id: u32) -> Key {
    [guid, u64::from(id), KIND_END << 56]
}

/// Index key of a comm-ID pair (active, passive).
#[inline]
fn pair_key(a: u32, p: u32) -> Key {
    [u64::from(a) << 32 | u64::from(p), 0, KIND_PAIR << 56]
}

/// Index key of (address, 32-bit ID) of kind `kind`.
#[inline]
fn addr_key(kind: u64, e: &WireAddr, id: u32) -> Key {
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
    /// When the next idle sweep is due.
    next_sweep: Duration,
    now: Duration,
    /// Counters.
    pub stats: TrackerStats,
}

impl Tracker {
    /// An empty table.
    pub(crate) fn new(cfg: TrackerConfig) -> Self {
        Tracker {
            cfg: TrackerConfig {
                max_live: cfg.max_live.max(8),
                ..cfg
            },
            slots: Vec::new(),
            free: Vec::new(),
            finished: Vec::new(),
            live: 0,
            next_id: 1,
            gens: Vec::new(),
            next_gen: 1,
            index: SlotIndex::default(),
            ended: std::collections::VecDeque::new(),
            next_sweep: Duration::ZERO,
            now: Duration::ZERO,
            stats: TrackerStats::default(),
        }
    }

    #[inline]
    fn find(&self, key: &Key) -> Option<usize> {
        let gens = &self.gens;
        self.index
            .get(key, |s| gens.get(s as usize).copied().unwrap_or(0))
    }

    #[inline]
    fn put(&mut self, key: Key, slot: usize) {
        let gens = &self.gens;
        let g = gens.get(slot).copied().unwrap_or(0);
        if g == 0 {
            return;
        }
        self.index
            .insert(key, slot, g, |s| gens.get(s as usize).copied().unwrap_or(0));
    }

    #[inline]
    fn is_live(&self, slot: usize) -> bool {
        self.gens.get(slot).is_some_and(|&g| g != 0)
    }

    #[inline]
    fn conn(&self, slot: usize) -> Option<&Conn> {
        if self.is_live(slot) {
            self.slots.get(slot)
        } else {
            None
        }
    }

    #[inline]
    fn conn_mut(&mut self, slot: usize) -> Option<&mut Conn> {
        if self.is_live(slot) {
            self.slots.get_mut(slot)
        } else {
            None
        }
    }

    fn alloc(&mut self, ev: &CmEvent, kind: ConnKind) -> usize {
        if self.live >= self.cfg.max_live {
            self.evict();
        }
        let id = self.next_id;
        self.next_id += 1;
        self.live += 1;
        self.stats.peak_live = self.stats.peak_live.max(self.live as u64);
        let gen = self.next_gen;
        self.next_gen = self.next_gen.checked_add(1).unwrap_or(1);
        match self.free.pop() {
            Some(slot) => {
                if let Some(s) = self.slots.get_mut(slot) {
                    // Reuse the slot (and its ladder's allocation) in place.
                    let mut events = std::mem::take(&mut s.events);
                    events.clear();
                    *s = Conn::new(id, ev, kind);
                    s.events = events;
                }
                if let Some(g) = self.gens.get_mut(slot) {
                    *g = gen;
                }
                slot
            }
            None => {
                self.slots.push(Conn::new(id, ev, kind));
                self.gens.push(gen);
                self.slots.len() - 1
            }
        }
    }

    /// Stops tracking a connection (its index entries die with its generation), settles its
    /// outcome and queues it for [`Tracker::drain_finished`].
    fn finish(&mut self, slot: usize) {
        let now = self.now;
        let Some(g) = self.gens.get_mut(slot).filter(|g| **g != 0) else {
            return;
        };
        *g = 0;
        self.live -= 1;
        if let Some(c) = self.slots.get_mut(slot) {
            c.settle(now);
        }
        self.finished.push(slot);
    }

    /// Whether connections finished since the last [`Tracker::drain_finished`].
    #[inline]
    pub(crate) fn has_finished(&self) -> bool {
        !self.finished.is_empty()
    }

    /// Hands every connection finished so far to `f`, in order of finishing, and frees their
    /// places. Stops at the first error (the connections not handed over are dropped).
    ///
    /// # Errors
    /// The first error of `f`.
    pub(crate) fn drain_finished<E>(
        &mut self,
        mut f: impl FnMut(&Conn) -> Result<(), E>,
    ) -> Result<(), E> {
        let mut result = Ok(());
        for &slot in &self.finished {
            if result.is_ok() {
                if let Some(c) = self.slots.get(slot) {
                    result = f(c);
                }
            }
            self.free.push(slot);
        }
        self.finished.clear();
        result
    }

    /// Finishes the least recently active eighth of the table.
    fn evict(&mut self) {
        let mut order: Vec<(Duration, u64, usize)> = self
            .slots
            .iter()
            .enumerate()
            .filter(|(i, _)| self.is_live(*i))
            .map(|(i, c)| (c.last, c.id, i))
            .collect();
        order.sort_unstable();
        let n = (self.cfg.max_live / 8).max(1);
        for &(_, _, slot) in order.iter().take(n) {
            if let Some(c) = self.conn_mut(slot) {
                c.evicted = true;
            }
            self.finish(slot);
            self.stats.evicted += 1;
        }
    }

    /// Asks the cache for the connection a few places from the front of the queue of ended
    /// connections: it is finished soon, and finishing reads most of it.
    #[inline]
    fn prefetch_next_to_finish(&self) {
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

    /// Finishes connections whose grace period or idle time has passed.
    fn expire(&mut self) {
        while let Some(&(t, slot, id)) = self.ended.front() {
            if self.now < t + self.cfg.grace {
                break;
            }
            self.ended.pop_front();
            let finish = self.conn(slot).is_some_and(|c| {
                // Still the same connection, and no message since it ended.
                c.id == id && c.ended.is_some_and(|e| c.last <= e)
            });
            if finish {
                self.finish(slot);
            } else if let Some(c) = self.conn(slot).filter(|c| c.id == id) {
                // A message arrived after the end: wait again from that message.
                let again = c.last;
                self.ended.push_back((again, slot, id));
                if let Some(c) = self.conn_mut(slot) {
                    c.ended = Some(again);
                }
            }
        }
        if self.now >= self.next_sweep {
            self.next_sweep = self.now + self.cfg.idle / 4;
            let idle: Vec<usize> = self
                .slots
                .iter()
                .enumerate()
                .filter(|(i, c)| self.is_live(*i) && c.last + self.cfg.idle < self.now)
                .map(|(i, _)| i)
                .collect();
            for slot in idle {
                self.finish(slot);
            }
        }
    }

    /// Finishes every connection (end of file), in order of first appearance; then
    /// [`Tracker::drain_finished`] hands them over.
    pub(crate) fn finish_all(&mut self) {
        let mut slots: Vec<(u64, usize)> = self
            .slots
            .iter()
            .enumerate()
            .filter(|(i, _)| self.is_live(*i))
            .map(|(i, c)| (c.id, i))
            .collect();
        slots.sort_unstable();
        for (_, slot) in slots {
            self.finish(slot);
        }
        self.ended.clear();
    }

    /// Looks up the connection of a message carrying (local, remote) comm IDs; returns the
    /// slot and the sender's side.
    fn by_ids(&self, local: CommId, remote: CommId) -> Option<(usize, Side)> {
        if let Some(s) = self.find(&pair_key(local.0, remote.0)) {
            return Some((s, Side::Active));
        }
        if let Some(s) = self.find(&pair_key(remote.0, local.0)) {
            return Some((s, Side::Passive));
        }
        None
    }

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

    /// Finds (or creates) the connection of a message and the sender's side.
    fn locate(&mut self, ev: &CmEvent) -> Option<(usize, Side)> {
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
                        None => self.partial(ev, r.local_comm_id, r.remote_comm_id, Side::Passive),
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

    /// Tracks one CM message. Connections finished meanwhile wait for
    /// [`Tracker::drain_finished`].
    pub(crate) fn observe(&mut self, ev: &CmEvent) -> Note {
        if ev.time > self.now {
            self.now = ev.time;
        }
        self.prefetch_next_to_finish();
        self.expire();
        let Some((slot, from)) = self.locate(ev) else {
            return Note::default();
        };
        let record = self.cfg.record_events;
        let max_events = self.cfg.max_events;
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
        let retrans = c.repeat(sig);
        c.messages += 1;
        c.last = c.last.max(ev.time);
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
                if c.kind == ConnKind::Unknown {
                    c.kind = match r.transport() {
                        ReqTransport::Rc => ConnKind::Rc,
                        ReqTransport::Uc => ConnKind::Uc,
                        ReqTransport::Xrc => ConnKind::Xrc,
                        ReqTransport::Other => ConnKind::Other,
                    };
                }
                c.service_id = Some(r.service_id);
                c.active.ca_guid = Some(r.local_ca_guid);
                c.active.comm_id = Some(r.local_comm_id);
                c.active.qpn = Some(r.local_qpn);
                c.req_timeouts = Some((
                    r.remote_cm_response_timeout,
                    r.local_cm_response_timeout,
                    r.primary_path.local_ack_timeout,
                    r.max_cm_retries.get(),
                ));
            }
            CmMessage::Rep(r) => {
                c.rep_sends += 1;
                c.rep.get_or_insert(t);
                c.rep_last = Some(t);
                c.passive.addr = Some(ev.src);
                c.passive.ca_guid = Some(r.local_ca_guid);
                c.passive.comm_id = Some(r.local_comm_id);
                c.passive.qpn = Some(if c.kind == ConnKind::Xrc || r.local_qpn.get() == 0 {
                    r.xrc_tgt_qpn()
                } else {
                    r.local_qpn
                });
                if r.local_qpn.get() == 0 && r.local_eecn.get() != 0 && c.kind == ConnKind::Unknown
                {
                    c.kind = ConnKind::Xrc;
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
                    icrc: ev.icrc,
                });
            } else {
                c.events_dropped += 1;
            }
        }
        let note = Note {
            conn: Some(c.id),
            from: Some(from),
            retrans,
            xrc: c.kind == ConnKind::Xrc,
            service_id: c.service_id,
            problem: c.rej.is_some() || c.retransmissions > 0 || c.bad_icrc > 0,
            comm_ids: (c.active.comm_id, c.passive.comm_id),
        };
        let id = c.id;
        let newly_ended = ended && c.ended.is_none();
        if newly_ended {
            c.ended = Some(now);
            self.ended.push_back((now, slot, id));
        }
        note
    }
}

impl Conn {
    /// Whether `side`'s end is known to have `id` as comm ID.
    pub fn has_comm_id(&self, id: CommId) -> bool {
        self.active.comm_id == Some(id) || self.passive.comm_id == Some(id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outcome_names() {
        assert_eq!(Outcome::Partial.as_str(), "partial");
        assert_eq!(
            Outcome::TimedOut {
                phase: Phase::Req,
                sends: 3
            }
            .as_str(),
            "timed_out"
        );
    }
}
