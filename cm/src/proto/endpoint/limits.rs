//! The admission and limits bookkeeping of the endpoint ([`Limits`]): the half-open entries by
//! arrival order, service ID and source, the established-connection counts, and the
//! anti-amplification budget of each half-open connection. The decisions made with it (admit,
//! evict, give up) are in `admission.rs`.
//!
//! The half-open entries are the endpoint's one count of half-open connections
//! ([`Limits::half_open`]: `Endpoint::half_open`, the stateless-mode threshold): an entry is
//! made when a REQ is admitted (REQ_RCVD) and removed when its connection leaves the passive
//! setup states (`State::is_half_open_passive`: REQ_RCVD, MRA_REQ_SENT, REP_SENT,
//! MRA_REP_RCVD) by `Io::set_state`, or when it is evicted. A connection made from a
//! stateless cookie is ESTABLISHED from the start and never has one.

use std::collections::BTreeSet;
use std::time::Instant;

use ibcm_mad::{CommId, ServiceId};

use crate::proto::util::{map, HashMap};
use crate::proto::{EndpointConfig, PeerAddr};

/// How many times what an unvalidated peer sent may be sent back to it.
pub(super) const AMPLIFICATION_FACTOR: u64 = 3;

/// The size of every CM MAD on the wire (what the amplification budget counts).
pub(super) const MAD_BYTES: u64 = 256;

/// The source of a datagram for per-source accounting: the address without its port.
pub(super) fn source_of(p: PeerAddr) -> PeerAddr {
    match p {
        PeerAddr::Udp(sa) => PeerAddr::Udp(std::net::SocketAddr::new(sa.ip(), 0)),
        PeerAddr::Ib(mut ib) => {
            if ib.gid.is_some() {
                ib.lid = ibcm_mad::Lid::PERMISSIVE;
            }
            ib.sl = 0;
            ib.pkey_index = 0;
            PeerAddr::Ib(ib)
        }
    }
}

/// One half-open passive connection.
#[derive(Debug, Clone, Copy)]
pub(super) struct Half {
    seq: u64,
    service: ServiceId,
    source: PeerAddr,
    /// When the entry is given up at the latest.
    pub(super) deadline: Instant,
    /// Bytes received from the peer for this connection (REQ and its duplicates).
    rx: u64,
    /// Bytes sent to it for this connection.
    tx: u64,
    /// The peer echoed our comm ID from its address: no amplification limit any more.
    validated: bool,
}

/// The admission decision for a new REQ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Admit {
    /// Room for it.
    Yes,
    /// Evict this (oldest) entry first, then ask again.
    Evict(CommId),
    /// Refuse it: its source holds its share of half-open entries.
    SourceFull,
    /// Refuse it: the established-connection limit of the endpoint or of its source.
    EstablishedFull,
}

/// The endpoint's admission and limits bookkeeping.
#[derive(Debug)]
pub(super) struct Limits {
    seq: u64,
    half: HashMap<CommId, Half>,
    order: BTreeSet<(u64, CommId)>,
    by_service: HashMap<ServiceId, BTreeSet<(u64, CommId)>>,
    half_by_source: HashMap<PeerAddr, u32>,
    /// Connections from ESTABLISHED until TimeWait, overall and per source.
    established: usize,
    established_by_source: HashMap<PeerAddr, u32>,
}

impl Limits {
    pub(super) fn new(seed: u64) -> Self {
        Limits {
            seq: 0,
            half: map(seed),
            order: BTreeSet::new(),
            by_service: map(seed),
            half_by_source: map(seed),
            established: 0,
            established_by_source: map(seed),
        }
    }

    /// Whether a REQ for `service` from `source` may create a half-open entry now (what
    /// `Endpoint::admit` acts on).
    pub(super) fn check(
        &self,
        cfg: &EndpointConfig,
        source: PeerAddr,
        service: ServiceId,
    ) -> Admit {
        let half_src = self.half_by_source.get(&source).copied().unwrap_or(0) as usize;
        if !self.established_room(cfg, source) {
            return Admit::EstablishedFull;
        }
        if half_src >= cfg.max_half_open_per_source {
            return Admit::SourceFull;
        }
        if let Some(set) = self.by_service.get(&service) {
            if set.len() >= cfg.max_half_open_per_service {
                if let Some(&(_, id)) = set.first() {
                    return Admit::Evict(id);
                }
            }
        }
        if self.half.len() >= cfg.max_half_open {
            if let Some(&(_, id)) = self.order.first() {
                return Admit::Evict(id);
            }
        }
        Admit::Yes
    }

    /// Whether one more connection from `source` fits `max_established` and
    /// `max_established_per_peer` (half-open entries count).
    pub(super) fn established_room(&self, cfg: &EndpointConfig, source: PeerAddr) -> bool {
        let est_src = self
            .established_by_source
            .get(&source)
            .copied()
            .unwrap_or(0) as usize;
        let half_src = self.half_by_source.get(&source).copied().unwrap_or(0) as usize;
        self.established.saturating_add(self.half.len()) < cfg.max_established
            && est_src.saturating_add(half_src) < cfg.max_established_per_peer
    }

    /// Records a new half-open entry.
    pub(super) fn enter(
        &mut self,
        id: CommId,
        source: PeerAddr,
        service: ServiceId,
        deadline: Instant,
        rx: u64,
    ) {
        self.seq += 1;
        let seq = self.seq;
        self.order.insert((seq, id));
        self.by_service
            .entry(service)
            .or_default()
            .insert((seq, id));
        *self.half_by_source.entry(source).or_default() += 1;
        self.half.insert(
            id,
            Half {
                seq,
                service,
                source,
                deadline,
                rx,
                tx: 0,
                validated: false,
            },
        );
    }

    /// Forgets a half-open entry (it was established, closed or evicted).
    pub(super) fn leave(&mut self, id: CommId) {
        let Some(h) = self.half.remove(&id) else {
            return;
        };
        self.order.remove(&(h.seq, id));
        if let Some(set) = self.by_service.get_mut(&h.service) {
            set.remove(&(h.seq, id));
            if set.is_empty() {
                self.by_service.remove(&h.service);
            }
        }
        dec(&mut self.half_by_source, h.source);
    }

    /// Half-open passive connections: one entry each (module docs).
    pub(super) fn half_open(&self) -> usize {
        self.half.len()
    }

    /// The half-open entry of a connection.
    pub(super) fn half(&self, id: CommId) -> Option<&Half> {
        self.half.get(&id)
    }

    /// A connection became established (or left the connected states: `up == false`).
    pub(super) fn connected(&mut self, source: PeerAddr, up: bool) {
        if up {
            self.established += 1;
            *self.established_by_source.entry(source).or_default() += 1;
        } else {
            self.established = self.established.saturating_sub(1);
            dec(&mut self.established_by_source, source);
        }
    }

    /// Connections from ESTABLISHED until TimeWait.
    pub(super) fn established(&self) -> usize {
        self.established
    }

    /// The peer of half-open `id` sent `bytes` more for it.
    pub(super) fn received(&mut self, id: CommId, bytes: u64) {
        if let Some(h) = self.half.get_mut(&id) {
            h.rx = h.rx.saturating_add(bytes);
        }
    }

    /// The peer of half-open `id` echoed our comm ID from its own address.
    pub(super) fn validate(&mut self, id: CommId) {
        if let Some(h) = self.half.get_mut(&id) {
            h.validated = true;
        }
    }

    /// Counts `bytes` sent to the peer of half-open `id` that had to go out regardless (the
    /// REP answering the REQ).
    pub(super) fn sent(&mut self, id: CommId, bytes: u64) {
        if let Some(h) = self.half.get_mut(&id) {
            h.tx = h.tx.saturating_add(bytes);
        }
    }

    /// Whether `bytes` more may be sent to the peer of `id`, leaving room for `reserved` more
    /// (and counts them if so). Always true for connections that are not half-open or whose
    /// peer is validated.
    pub(super) fn may_send(&mut self, id: CommId, bytes: u64, reserved: u64) -> bool {
        let Some(h) = self.half.get_mut(&id) else {
            return true;
        };
        if h.validated {
            return true;
        }
        let tx = h.tx.saturating_add(bytes);
        if tx.saturating_add(reserved) > h.rx.saturating_mul(AMPLIFICATION_FACTOR) {
            return false;
        }
        h.tx = tx;
        true
    }
}

fn dec(m: &mut HashMap<PeerAddr, u32>, k: PeerAddr) {
    if let Some(n) = m.get_mut(&k) {
        *n = n.saturating_sub(1);
        if *n == 0 {
            m.remove(&k);
        }
    }
}
