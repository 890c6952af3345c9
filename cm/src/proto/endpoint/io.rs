//! The endpoint's output side: queued transmissions and events, the timer queue, counters,
//! and the peer addresses connections share (`proto/peers.rs`). Kept apart from the connection
//! table so that a handler can hold a connection and queue output at the same time. Also the
//! free functions that build REJs (`rej`, `timeout_rej`) and send one for a REQ that created no
//! connection (`reject_req`), shared by the feature files.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use bytes::Bytes;
use ibcm_mad::{CmMessage, CommId, Mad, MsgKind, PrivateData, Rej, RejReason, Req, Tid};
use tracing::{debug, trace};

use super::limits::{source_of, Limits, MAD_BYTES};
use crate::log_limit::LogLimit;
#[cfg(doc)]
use crate::log_limit::LOG_BURST;
use crate::proto::conn::{Conn, Pending, SavedReplies};
use crate::proto::memory::table_bytes;
use crate::proto::peers::Peers;
use crate::proto::timer::{ConnTimer, Timers};
use crate::proto::util::{map, HashMap};
use crate::proto::{ConnId, ConnectionError, Event, EventKind, PeerAddr, State, Stats, Transmit};

/// Output queues, timers and counters.
#[derive(Debug)]
pub(super) struct Io {
    pub(super) peers: Peers,
    pub(super) outbox: VecDeque<Transmit>,
    pub(super) events: VecDeque<Event>,
    pub(super) timers: Timers,
    /// The request each connection waits an answer for, while it waits.
    pub(super) pending: HashMap<CommId, Pending>,
    /// What the connections that have any saved to answer duplicates.
    pub(super) saved: HashMap<CommId, SavedReplies>,
    pub(super) stats: Stats,
    /// Admission, limits and anti-amplification (`limits.rs`), with the half-open and
    /// established counts (kept by [`Io::set_state`]).
    pub(super) limits: Limits,
    /// The time of the input being handled (for the log rate limit).
    pub(super) now: Option<Instant>,
    log: LogLimit,
}

impl Io {
    pub(super) fn new(seed: u64) -> Self {
        Io {
            peers: Peers::new(seed),
            outbox: VecDeque::new(),
            events: VecDeque::new(),
            timers: Timers::new(seed),
            pending: map(seed),
            saved: map(seed),
            stats: Stats::default(),
            limits: Limits::new(seed),
            now: None,
            log: LogLimit::default(),
        }
    }

    /// Heap bytes of the side tables (pending requests, saved replies, armed timers).
    pub(super) fn heap_bytes(&self) -> usize {
        let pending = core::mem::size_of::<(CommId, Pending)>();
        let saved = core::mem::size_of::<(CommId, SavedReplies)>();
        table_bytes(self.pending.capacity(), pending)
            + table_bytes(self.saved.capacity(), saved)
            + self.timers.heap_bytes()
    }

    /// Anti-amplification: whether one more MAD may go to the peer of connection `id` (always,
    /// unless it is a half-open passive connection whose peer has not proved that it
    /// receives). With `reserve`, room for one more MAD must remain afterwards: REP
    /// retransmissions leave room for the REJ that ends the attempt, so that a real peer
    /// which stays silent still learns that we gave up. A refusal is counted in
    /// `Stats::amplification_limited`.
    pub(super) fn gate(&mut self, id: CommId, reserve: bool) -> bool {
        let reserved = if reserve { MAD_BYTES } else { 0 };
        if self.limits.may_send(id, MAD_BYTES, reserved) {
            true
        } else {
            self.stats.amplification_limited += 1;
            false
        }
    }

    /// Whether a debug line may be logged now: [`LOG_BURST`] per second of endpoint time
    /// (`trace` level stays a packet trace, one line per MAD, off unless asked for); the rest
    /// are counted in `Stats::log_suppressed`.
    pub(super) fn log_ok(&mut self) -> bool {
        let Some(now) = self.now else {
            return true;
        };
        if self.log.ok(now) {
            true
        } else {
            self.stats.log_suppressed += 1;
            false
        }
    }

    pub(super) fn send(&mut self, to: PeerAddr, tid: Tid, msg: CmMessage) -> Bytes {
        let mad = Mad::new(tid, msg).to_bytes();
        trace!(%to, msg = %msg, "send");
        self.stats.tx += 1;
        match msg {
            CmMessage::Rej(_) => self.stats.rej_sent += 1,
            CmMessage::Mra(_) => self.stats.mra_sent += 1,
            _ => {}
        }
        self.outbox.push_back(Transmit {
            to,
            mad: mad.clone(),
        });
        mad
    }

    /// Sends on a connection, to its peer, with its TID.
    pub(super) fn send_conn(&mut self, c: &Conn, msg: CmMessage) -> Bytes {
        let to = self.peers.addr(c.peer);
        self.send(to, c.tid, msg)
    }

    pub(super) fn resend_conn(&mut self, c: &Conn, mad: Bytes) {
        let to = self.peers.addr(c.peer);
        self.resend(to, mad);
    }

    pub(super) fn resend(&mut self, to: PeerAddr, mad: Bytes) {
        self.stats.tx += 1;
        self.outbox.push_back(Transmit { to, mad });
    }

    /// Re-sends the MRA stored for a duplicate of the message it acknowledged (nothing if
    /// there is none).
    pub(super) fn resend_mra(&mut self, c: &Conn) {
        if let Some(mra) = self.saved.get(&c.id).and_then(|x| x.mra.clone()) {
            self.stats.duplicate_replies += 1;
            self.resend_conn(c, mra);
        }
    }

    pub(super) fn event(&mut self, conn: ConnId, kind: EventKind) {
        self.events.push_back(Event { conn, kind });
    }

    /// What connection `id` saved to answer duplicates, created on first use.
    pub(super) fn saved_mut(&mut self, id: CommId) -> &mut SavedReplies {
        self.saved.entry(id).or_default()
    }

    /// Forgets the MRA saved for connection `id` (its saved replies with it, if nothing else is
    /// left).
    pub(super) fn drop_mra(&mut self, id: CommId) {
        if let Some(x) = self.saved.get_mut(&id) {
            x.mra = None;
            if x.rtu_private_data.is_none() && x.apr.is_none() {
                self.saved.remove(&id);
            }
        }
    }

    /// Arms connection `id`'s one timer (replacing the one armed before).
    pub(super) fn arm(&mut self, id: CommId, at: Instant, kind: ConnTimer) {
        self.timers.arm_conn(id, at, kind);
    }

    pub(super) fn disarm(&mut self, id: CommId) {
        self.timers.disarm_conn(id);
    }

    /// Forgets everything kept apart for connection `id` (it leaves the table, or enters
    /// TimeWait before its timer is armed again): pending request, saved replies, timer.
    pub(super) fn forget(&mut self, id: CommId) {
        self.pending.remove(&id);
        self.saved.remove(&id);
        self.disarm(id);
    }

    /// Moves a connection to state `new`, keeping the counts of [`Limits`]: a connection
    /// leaving the half-open passive states leaves its half-open entry (made at its REQ's
    /// admission, `Limits::enter`), one entering or leaving the connected states is counted.
    pub(super) fn set_state(&mut self, id: CommId, conn: &mut Conn, new: State) {
        if conn.state.is_half_open_passive() && !new.is_half_open_passive() {
            self.limits.leave(id);
        }
        if connected(conn.state) != connected(new) {
            let source = source_of(self.peers.addr(conn.peer));
            self.limits.connected(source, connected(new));
        }
        if new == State::Established && conn.state != State::Established {
            self.stats.established += 1;
        }
        conn.state = new;
    }

    pub(super) fn close(&mut self, id: CommId, conn: &mut Conn, err: ConnectionError) {
        if !conn.closed {
            conn.closed = true;
            if self.log_ok() {
                debug!(conn = %id, error = %err, "closed");
            }
            self.event(id, EventKind::Closed(err));
        }
    }

    /// Starts a request that waits for an answer: sends it and arms the resend timer.
    pub(super) fn send_request(
        &mut self,
        now: Instant,
        id: CommId,
        conn: &Conn,
        msg: CmMessage,
        (timeout, retries): (Duration, u8),
    ) {
        let mad = self.send_conn(conn, msg);
        self.pending.insert(
            id,
            Pending {
                mad,
                retries_left: retries,
                timeout,
                deadline: None,
            },
        );
        self.arm(id, now + timeout, ConnTimer::Resend);
    }

    pub(super) fn cancel_request(&mut self, id: CommId) {
        self.pending.remove(&id);
        if matches!(self.timers.conn(id), Some((_, ConnTimer::Resend))) {
            self.disarm(id);
        }
    }
}

/// States counted as established connections (`max_established`): until TimeWait.
fn connected(s: State) -> bool {
    matches!(s, State::Established | State::DreqSent | State::DreqRcvd)
}

/// A REJ.
pub(super) fn rej(
    local: CommId,
    remote: CommId,
    kind: MsgKind,
    reason: RejReason,
    ari: &[u8],
    pd: &[u8],
) -> CmMessage {
    let mut r = Rej {
        local_comm_id: local,
        remote_comm_id: remote,
        message_rejected: kind,
        reason,
        private_data: PrivateData::from_slice(pd).unwrap_or_default(),
        ..Rej::default()
    };
    r.set_ari(ari);
    CmMessage::Rej(r)
}

/// Rejects a REQ that created no connection: to its sender, with its TID and local comm ID 0
/// (as Linux does from REQ_RCVD).
pub(super) fn reject_req(io: &mut Io, from: PeerAddr, tid: Tid, req: &Req, reason: RejReason) {
    let msg = rej(CommId(0), req.local_comm_id, MsgKind::Req, reason, &[], &[]);
    io.send(from, tid, msg);
}

/// The REJ 4 "timeout" (ARI = our CA GUID) with which a connection in setup is given up, as
/// Linux sends it when its retries run out or such an ID is destroyed.
pub(super) fn timeout_rej(local: CommId, remote: CommId, ca_guid: ibcm_mad::Guid) -> CmMessage {
    rej(
        local,
        remote,
        MsgKind::Other,
        RejReason::Timeout,
        &ca_guid.0.to_be_bytes(),
        &[],
    )
}
