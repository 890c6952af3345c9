//! Connection setup: the `connect`, `accept`, `reject`, `mra`, `establish` and
//! `notify_established` commands and the REQ, REP, RTU, MRA and REJ handlers (the MRA and REJ
//! handlers serve every state: an MRA may acknowledge a LAP, a REJ may end an established
//! connection).

use std::time::Instant;

use ibcm_mad::cma::CmaHeader;
use ibcm_mad::{
    CmMessage, CommId, Dreq, Guid, Mra, MsgKind, PrivateData, Qpn, Rej, RejReason, Rep, Req,
    ReqTransport, Rtu, Tid, TimeoutExp,
};
use tracing::debug;

use super::io::{rej, reject_req, timeout_rej, Io};
use super::limits::{source_of, MAD_BYTES};
use super::Endpoint;
use crate::proto::conn::{Conn, Micros};
use crate::proto::ids::{cm_ack_timeout, form_tid};
use crate::proto::timer::ConnTimer;
use crate::proto::util::check_len;
use crate::proto::{
    roce_path, AcceptParams, CallError, ConnId, ConnectError, ConnectParams, ConnectionError,
    DropReason, EventKind, LapState, PeerAddr, RepInfo, ReqInfo, Side, State,
};

impl Endpoint {
    // ---------------------------------------------------------------------------------------
    // Active side: commands

    /// Sends a REQ. The connection reports [`EventKind::Established`] (or
    /// [`EventKind::RepReceived`] without `auto_rtu`) or [`EventKind::Closed`]. Without a
    /// [`ConnectParams::starting_psn`] the start PSN is drawn from the endpoint's RNG
    /// ([`Endpoint::random_psn`]; seeded by [`EndpointConfig::rng_seed`](super::EndpointConfig::rng_seed)).
    ///
    /// # Errors
    /// [`ConnectError`] for private data that does not fit, a QPN in TimeWait quarantine or in
    /// use, or a missing path.
    pub fn connect(&mut self, now: Instant, p: ConnectParams) -> Result<ConnId, ConnectError> {
        self.connect_sent(now, p).map(|(id, _)| id)
    }

    /// [`connect`](Self::connect), returning the REQ as sent too: its start PSN, QPN, paths,
    /// timeouts… which, with the REP, is what
    /// [`qp_attr::Connection::new`](crate::qp_attr::Connection::new) takes on the active side.
    ///
    /// # Errors
    /// As [`connect`](Self::connect).
    pub fn connect_sent(
        &mut self,
        now: Instant,
        p: ConnectParams,
    ) -> Result<(ConnId, Box<Req>), ConnectError> {
        let max = p.max_private_data();
        if p.private_data.len() > max {
            return Err(ConnectError::PrivateDataTooLong {
                len: p.private_data.len(),
                max,
            });
        }
        self.check_qpn(p.local_qpn, now, p.allow_shared_qpn)?;
        let primary_path = match p.primary_path {
            Some(path) => path,
            None => {
                let remote = p.peer.gid().ok_or(ConnectError::NoPath)?;
                let ack = TimeoutExp::masked(p.packet_life_time.get().saturating_add(1).min(31));
                roce_path(self.cfg.local_gid, remote, ack)
            }
        };
        let mut pd = [0u8; 92];
        let user_off = match &p.cma_header {
            Some(h) => {
                // The buffer is 92 bytes, more than the header's 36.
                let _ = h.emit(&mut pd);
                CmaHeader::LEN
            }
            None => 0,
        };
        if let Some(dst) = pd.get_mut(user_off..user_off + p.private_data.len()) {
            dst.copy_from_slice(&p.private_data);
        }
        let id = self.alloc_id();
        let tid = form_tid(self.cfg.hi_tid, id);
        let req = Req {
            local_comm_id: id,
            local_ca_guid: self.cfg.local_ca_guid,
            starting_psn: match p.starting_psn {
                Some(psn) => psn,
                None => self.random_psn(),
            },
            primary_path,
            private_data: PrivateData(pd),
            ..p.req_fields()
        };
        let request_timeout =
            p.packet_life_time.to_duration() * 2 + p.remote_cm_response_timeout.to_duration();
        let conn = Conn {
            id,
            state: State::ReqSent,
            lap: LapState::Uninit,
            side: Side::Active,
            transport: p.transport,
            closed: false,
            auto_rtu: p.auto_rtu,
            holds_qpn: true,
            remote_id: CommId(0),
            local_qpn: p.local_qpn,
            remote_qpn: Qpn::default(),
            remote_ca_guid: Guid(0),
            peer: self.io.peers.intern(p.peer),
            tid,
            request_timeout: Micros::from_duration(request_timeout),
            max_retries: p.max_cm_retries.get(),
            packet_life_time: p.packet_life_time,
            timewait: Micros::from_duration(primary_path.local_ack_timeout.to_duration()),
        };
        debug!(conn = %id, peer = %p.peer, sid = %p.service_id, "connect");
        let budget = (request_timeout, p.max_cm_retries.get());
        let sent = Box::new(req);
        self.io
            .send_request(now, id, &conn, CmMessage::Req(req), budget);
        if let Some(limit) = p.connect_timeout {
            let at = now + limit;
            if let Some(pending) = self.io.pending.get_mut(&id) {
                pending.deadline = Some(at);
            }
            if self.io.timers.conn(id).is_some_and(|(t, _)| at < t) {
                self.io.arm(id, at, ConnTimer::Resend);
            }
        }
        self.use_qpn(p.local_qpn);
        self.conns.insert(id, conn);
        Ok((id, sent))
    }

    /// Sends the RTU for a connection in REP_RCVD / MRA_REP_SENT (when `auto_rtu` was off).
    ///
    /// # Errors
    /// [`CallError`] for an unknown connection, a wrong state or private data over 224 bytes.
    pub fn establish(
        &mut self,
        _now: Instant,
        conn: ConnId,
        private_data: &[u8],
    ) -> Result<(), CallError> {
        check_len("RTU private data", private_data, Rtu::PRIVATE_DATA_LEN)?;
        let (c, io) = self.conn_mut(conn)?;
        if !matches!(c.state, State::RepRcvd | State::MraRepSent) {
            return Err(CallError::WrongState {
                op: "establish",
                state: c.state,
            });
        }
        send_rtu(io, conn, c, private_data);
        Ok(())
    }

    // ---------------------------------------------------------------------------------------
    // Passive side: commands

    /// The record of a passive connection from `req` (state IDLE, no local QPN yet): the
    /// peer's IDs, QPN and timing, its retry count kept within the configured bounds. The one
    /// place both the stateful REQ path and the stateless RTU path (cookie.rs) make it.
    pub(super) fn passive_conn(&mut self, id: CommId, req: &Req, from: PeerAddr, tid: Tid) -> Conn {
        Conn {
            id,
            state: State::Idle,
            lap: LapState::Uninit,
            side: Side::Passive,
            transport: req.transport(),
            closed: false,
            auto_rtu: false,
            holds_qpn: false,
            remote_id: req.local_comm_id,
            local_qpn: Qpn::default(),
            remote_qpn: req.local_qpn,
            remote_ca_guid: req.local_ca_guid,
            peer: self.io.peers.intern(from),
            tid,
            request_timeout: Micros::from_duration(self.peer_response_timeout(req)),
            max_retries: req
                .max_cm_retries
                .get()
                .max(self.cfg.min_peer_cm_retries)
                .min(self.cfg.max_peer_cm_retries),
            packet_life_time: TimeoutExp::masked(
                req.primary_path.local_ack_timeout.get().saturating_sub(1),
            ),
            timewait: Micros::from_duration(req.primary_path.local_ack_timeout.to_duration()),
        }
    }

    /// Accepts a REQ: sends the REP.
    ///
    /// # Errors
    /// [`CallError`] for an unknown connection, a state other than REQ_RCVD / MRA_REQ_SENT,
    /// private data over 196 bytes, or a QPN in quarantine (not checked for a live XRC TGT
    /// QP: [`AcceptParams::xrc_tgt_live`]) or already in use.
    pub fn accept(&mut self, now: Instant, conn: ConnId, p: AcceptParams) -> Result<(), CallError> {
        check_len("REP private data", &p.private_data, Rep::PRIVATE_DATA_LEN)?;
        let state = self
            .conns
            .get(&conn)
            .ok_or(CallError::UnknownConnection(conn))?
            .state;
        if !matches!(state, State::ReqRcvd | State::MraReqSent) {
            return Err(CallError::WrongState {
                op: "accept",
                state,
            });
        }
        let qpn = p.xrc_tgt_qpn.unwrap_or(p.local_qpn);
        let shared = p.xrc_tgt_qpn.is_some();
        // A live shared TGT QP attached again is no reuse of its number (AcceptParams docs).
        let live_tgt = shared && p.xrc_tgt_live;
        match self.check_qpn(qpn, now, shared) {
            Err(ConnectError::QpnInQuarantine { qpn, .. }) if !live_tgt => {
                return Err(CallError::QpnInQuarantine { qpn })
            }
            Err(ConnectError::QpnInUse { qpn }) => return Err(CallError::QpnInUse { qpn }),
            _ => {}
        }
        self.use_qpn(qpn);
        let guid = self.cfg.local_ca_guid;
        let (c, io) = self.conn_mut(conn)?;
        let mut rep = Rep {
            local_comm_id: conn,
            remote_comm_id: c.remote_id,
            local_ca_guid: guid,
            private_data: PrivateData::from_slice(&p.private_data).unwrap_or_default(),
            ..p.rep_fields()
        };
        if let Some(tgt) = p.xrc_tgt_qpn {
            rep.set_xrc_tgt_qpn(tgt);
        }
        c.local_qpn = qpn;
        c.holds_qpn = true;
        io.drop_mra(conn);
        io.set_state(conn, c, State::RepSent);
        // The REP answers the REQ: it always goes out, and counts against the budget.
        io.limits.sent(conn, MAD_BYTES);
        let budget = c.request_budget();
        io.send_request(now, conn, c, CmMessage::Rep(rep), budget);
        self.cap_timer(conn);
        Ok(())
    }

    /// Rejects a connection: from REQ_RCVD / MRA_REQ_SENT (the REQ), REP_RCVD /
    /// MRA_REP_SENT (the REP) or REP_SENT / MRA_REP_RCVD (after our REP).
    ///
    /// # Errors
    /// [`CallError`] for an unknown connection, another state, or ARI over 72 / private data
    /// over 148 bytes.
    pub fn reject(
        &mut self,
        now: Instant,
        conn: ConnId,
        reason: RejReason,
        ari: &[u8],
        private_data: &[u8],
    ) -> Result<(), CallError> {
        check_len("ARI", ari, Rej::ARI_LEN)?;
        check_len("REJ private data", private_data, Rej::PRIVATE_DATA_LEN)?;
        let (c, io) = self.conn_mut(conn)?;
        let (local, kind, timewait) = match c.state {
            // Linux sends local comm ID 0 when rejecting from REQ_RCVD.
            State::ReqRcvd => (CommId(0), MsgKind::Req, false),
            State::MraReqSent => (conn, MsgKind::Req, false),
            State::RepRcvd | State::MraRepSent => (conn, MsgKind::Rep, false),
            State::RepSent | State::MraRepRcvd => (conn, MsgKind::Other, true),
            state => {
                return Err(CallError::WrongState {
                    op: "reject",
                    state,
                })
            }
        };
        let msg = rej(local, c.remote_id, kind, reason, ari, private_data);
        if io.gate(conn, false) {
            io.send_conn(c, msg);
        }
        io.cancel_request(conn);
        io.close(conn, c, ConnectionError::LocallyRejected { reason });
        if timewait {
            self.enter_timewait(now, conn);
        } else {
            self.remove(conn);
        }
        Ok(())
    }

    /// Sends an MRA for the REQ (REQ_RCVD), the REP (REP_RCVD) or the LAP (LAP_RCVD) of a
    /// connection: "the answer will take up to `service_timeout`". The MRA is re-sent when a
    /// duplicate of the acknowledged message arrives.
    ///
    /// # Errors
    /// [`CallError`] for an unknown connection, another state or private data over 222 bytes;
    /// [`CallError::AmplificationLimited`] when the MRA would leave no room for the REP and the
    /// REJ within the peer's anti-amplification budget (`docs/protocol.md` §5.8).
    pub fn mra(
        &mut self,
        _now: Instant,
        conn: ConnId,
        service_timeout: TimeoutExp,
        private_data: &[u8],
    ) -> Result<(), CallError> {
        check_len("MRA private data", private_data, Mra::PRIVATE_DATA_LEN)?;
        let (c, io) = self.conn_mut(conn)?;
        let kind = match (c.state, c.lap) {
            (State::ReqRcvd | State::MraReqSent, _) => MsgKind::Req,
            (State::RepRcvd | State::MraRepSent, _) => MsgKind::Rep,
            (State::Established, LapState::LapRcvd | LapState::MraLapSent) => MsgKind::Other,
            (state, _) => return Err(CallError::WrongState { op: "mra", state }),
        };
        // The application's MRA counts against the amplification budget, keeping room for the
        // REP and the REJ that may end the attempt: to an unproven peer it goes only within it.
        if !io.limits.may_send(conn, MAD_BYTES, 2 * MAD_BYTES) {
            io.stats.amplification_limited += 1;
            return Err(CallError::AmplificationLimited(conn));
        }
        send_mra(io, conn, c, kind, service_timeout, private_data);
        Ok(())
    }

    /// Reports that the QP saw traffic (`IB_EVENT_COMM_EST`) although no RTU arrived: a
    /// connection in REP_SENT / MRA_REP_RCVD becomes established.
    ///
    /// # Errors
    /// [`CallError`] for an unknown connection or another state.
    pub fn notify_established(&mut self, _now: Instant, conn: ConnId) -> Result<(), CallError> {
        let (c, io) = self.conn_mut(conn)?;
        if !matches!(c.state, State::RepSent | State::MraRepRcvd) {
            return Err(CallError::WrongState {
                op: "notify_established",
                state: c.state,
            });
        }
        io.cancel_request(conn);
        io.set_state(conn, c, State::Established);
        io.event(conn, EventKind::Established);
        Ok(())
    }

    // ---------------------------------------------------------------------------------------
    // REQ

    pub(super) fn on_req(&mut self, now: Instant, from: PeerAddr, tid: Tid, req: Req) {
        // Duplicate?
        if let Some(id) = self.conns.by_remote(req.local_comm_id, req.local_ca_guid) {
            let mra_dup = self.cfg.mra_on_duplicate_req;
            let Some(c) = self.conns.get_mut(&id) else {
                return;
            };
            // A duplicate from the peer widens its anti-amplification budget; one from
            // elsewhere does not (the answer goes to the peer).
            let from_peer = self.io.peers.addr(c.peer) == from;
            if from_peer {
                self.io.limits.received(id, MAD_BYTES);
            }
            match c.state {
                // Answers to duplicates before the accept keep room for the REP, which
                // always goes out: MRAs alone must not use up the 3x budget.
                State::ReqRcvd | State::MraReqSent if !self.io.gate(id, true) => {}
                // The peer repeats its REQ: our REP was lost (or withheld by the
                // anti-amplification limit, which the repeat widens). Linux ignores it and
                // waits for its REP timer; answering at once within the budget makes up for
                // the REPs the limit withheld.
                State::RepSent if from_peer => {
                    let rep = self.io.pending.get(&id).map(|p| p.mad.clone());
                    match rep {
                        Some(rep) if self.io.gate(id, true) => {
                            self.io.stats.duplicate_replies += 1;
                            self.io.resend_conn(c, rep);
                        }
                        _ => self.io.stats.drop(DropReason::Duplicate),
                    }
                }
                State::ReqRcvd => match mra_dup {
                    Some(st) => {
                        self.io.stats.duplicate_replies += 1;
                        send_mra(&mut self.io, id, c, MsgKind::Req, st, &[]);
                    }
                    None => self.io.stats.drop(DropReason::Duplicate),
                },
                State::MraReqSent => self.io.resend_mra(c),
                _ => self.io.stats.drop(DropReason::Duplicate),
            }
            return;
        }
        // Stale: the remote QPN already belongs to a live connection from that CA. XRC is
        // exempt: INI and TGT QPs are shared by design, so (QPN, CA GUID) is no connection
        // key there (Linux applies the check anyway; docs/interop.md §7.4).
        let xrc = req.transport() == ReqTransport::Xrc;
        let stale = if xrc {
            None
        } else {
            self.conns.by_qpn(req.local_qpn, req.local_ca_guid)
        };
        if let Some(old) = stale {
            // Only the old connection's own peer may supersede it: a REQ from elsewhere
            // naming its (QPN, CA GUID) is refused and the old connection stays.
            if !self.sent_by_peer(old, from) {
                reject_req(&mut self.io, from, tid, &req, RejReason::StaleConn);
                return;
            }
            self.io.stats.stale += 1;
            reject_req(&mut self.io, from, tid, &req, RejReason::StaleConn);
            self.stale_old(now, old);
            return;
        }
        let Some(opts) = self.listeners.get(&req.service_id) else {
            if self.io.log_ok() {
                debug!(sid = %req.service_id, "REQ for a service nobody listens on: REJ 8");
            }
            reject_req(&mut self.io, from, tid, &req, RejReason::InvalidServiceId);
            return;
        };
        if !opts.transports.is_empty() && !opts.transports.contains(&req.transport()) {
            reject_req(&mut self.io, from, tid, &req, RejReason::ConsumerReject);
            return;
        }
        // Under pressure, a listener with a stateless template answers from it (cookie.rs).
        if self.stateless_wanted(now, from, &req) && self.stateless_req(now, from, tid, req) {
            return;
        }
        if !self.admit(now, from, tid, &req) {
            return;
        }
        let id = self.alloc_id();
        let mut conn = self.passive_conn(id, &req, from, tid);
        self.io.set_state(id, &mut conn, State::ReqRcvd);
        let deadline = now + self.cfg.max_half_open_lifetime;
        let source = source_of(from);
        self.io
            .limits
            .enter(id, source, req.service_id, deadline, MAD_BYTES);
        self.io.arm(id, deadline, ConnTimer::Lifetime);
        self.conns.insert(id, conn);
        self.conns.index_remote(id);
        if !xrc {
            self.conns.index_qpn(id);
        }
        let cma_header = req
            .service_id
            .rdma_cm_port()
            .and_then(|_| CmaHeader::parse(req.private_data.as_bytes()).ok());
        if self.io.log_ok() {
            debug!(conn = %id, %from, sid = %req.service_id, "REQ received");
        }
        self.io.event(
            id,
            EventKind::ReqReceived(Box::new(ReqInfo {
                peer: from,
                req,
                cma_header,
            })),
        );
    }

    /// A new connection reused the QPN of `old`: `old` is stale. Linux sends it a DREQ when
    /// it was established (docs/protocol.md §4.6).
    fn stale_old(&mut self, now: Instant, old: CommId) {
        let Some(c) = self.conns.get_mut(&old) else {
            return;
        };
        match c.state {
            State::Established => {
                let dreq = Dreq {
                    local_comm_id: old,
                    remote_comm_id: c.remote_id,
                    remote_qpn_eecn: c.remote_qpn,
                    private_data: PrivateData::zeroed(),
                };
                self.io.close(old, c, ConnectionError::Stale);
                self.io.set_state(old, c, State::DreqSent);
                let budget = c.request_budget();
                self.io
                    .send_request(now, old, c, CmMessage::Dreq(dreq), budget);
                // The old connection must not match the new REQ's QPN any more.
                self.conns.unindex_qpn(old);
            }
            s if s.is_setup() => {
                self.io.close(old, c, ConnectionError::Stale);
                self.enter_timewait(now, old);
            }
            _ => {}
        }
    }

    // ---------------------------------------------------------------------------------------
    // MRA, REJ

    pub(super) fn on_mra(&mut self, now: Instant, from: PeerAddr, m: Mra) {
        let allow_unset = m.message_mraed == MsgKind::Req;
        let Some((c, io)) = self.lookup(from, m.remote_comm_id, m.local_comm_id, allow_unset)
        else {
            return;
        };
        let id = m.remote_comm_id;
        let next = match (m.message_mraed, c.state, c.lap) {
            (MsgKind::Req, State::ReqSent, _) => Some(State::MraReqRcvd),
            (MsgKind::Rep, State::RepSent, _) => Some(State::MraRepRcvd),
            (MsgKind::Other, State::Established, LapState::LapSent) => None,
            _ => {
                io.stats.drop(DropReason::WrongState);
                return;
            }
        };
        io.stats.mra_received += 1;
        match next {
            Some(s) => io.set_state(id, c, s),
            None => c.lap = LapState::MraLapRcvd,
        }
        let wait = m.service_timeout.to_duration() + c.packet_life_time.to_duration();
        if io.pending.contains_key(&id) {
            io.arm(id, now + wait, ConnTimer::Resend);
        }
        io.event(
            id,
            EventKind::MraReceived {
                service_timeout: m.service_timeout,
            },
        );
        self.cap_timer(id);
    }

    pub(super) fn on_rej(&mut self, now: Instant, from: PeerAddr, m: Rej) {
        // A REJ 4 "timeout" is matched by (ARI = the rejecting CA's GUID, their comm ID).
        let by_ari = if m.reason == RejReason::Timeout {
            m.timeout_ca_guid()
                .and_then(|g| self.conns.by_remote(m.local_comm_id, g))
        } else {
            None
        };
        if let Some(id) = by_ari {
            if !self.sent_by_peer(id, from) {
                return;
            }
        }
        let (id, c, io) = match by_ari {
            Some(id) => match self.conns.get_mut(&id) {
                Some(c) => (id, c, &mut self.io),
                None => return,
            },
            None => {
                let allow_unset =
                    m.reason == RejReason::Timeout || m.message_rejected == MsgKind::Req;
                match self.lookup(from, m.remote_comm_id, m.local_comm_id, allow_unset) {
                    Some((c, io)) => (m.remote_comm_id, c, io),
                    None => return,
                }
            }
        };
        let stale = m.reason == RejReason::StaleConn;
        let err = if stale {
            io.stats.stale += 1;
            ConnectionError::Stale
        } else {
            ConnectionError::Rejected {
                reason: m.reason,
                ari: m.ari_bytes().to_vec(),
                private_data: m.private_data.trimmed().to_vec(),
            }
        };
        let timewait = match c.state {
            State::ReqSent | State::MraReqRcvd => stale,
            State::RepSent | State::MraRepRcvd => stale,
            State::ReqRcvd | State::MraReqSent => stale,
            State::RepRcvd | State::MraRepSent => true,
            State::Established => true,
            State::DreqSent | State::DreqRcvd => true,
            State::Timewait | State::Idle => {
                io.stats.drop(DropReason::WrongState);
                return;
            }
        };
        io.stats.rej_received += 1;
        io.cancel_request(id);
        io.close(id, c, err);
        if timewait {
            self.enter_timewait(now, id);
        } else {
            self.remove(id);
        }
    }

    // ---------------------------------------------------------------------------------------
    // REP, RTU

    pub(super) fn on_rep(&mut self, now: Instant, from: PeerAddr, m: Rep) {
        let id = m.remote_comm_id;
        let Some(c) = self.conns.get(&id) else {
            self.io.stats.drop(DropReason::UnknownCommId);
            return;
        };
        // A duplicate of the REP we already took.
        if c.remote_id == m.local_comm_id && c.remote_id != CommId(0) {
            self.on_dup_rep(id);
            return;
        }
        if c.remote_id != CommId(0) || !matches!(c.state, State::ReqSent | State::MraReqRcvd) {
            self.io.stats.drop(DropReason::MismatchedCommId);
            return;
        }
        if self.io.peers.addr(c.peer) != from {
            self.io.stats.drop(DropReason::WrongPeer);
            return;
        }
        if self
            .conns
            .by_remote(m.local_comm_id, m.local_ca_guid)
            .is_some()
        {
            self.io.stats.drop(DropReason::Duplicate);
            return;
        }
        let xrc = c.transport == ReqTransport::Xrc;
        let remote_qpn = m.remote_qpn_for(xrc);
        let stale = if xrc {
            None // shared TGT QPs: see on_req
        } else {
            self.conns.by_qpn(remote_qpn, m.local_ca_guid)
        };
        if let Some(old) = stale {
            // Their QPN belongs to another live connection: REJ 10 and drop the old one.
            self.io.stats.stale += 1;
            let msg = rej(
                id,
                m.local_comm_id,
                MsgKind::Rep,
                RejReason::StaleConn,
                &[],
                &[],
            );
            self.io.send_conn(c, msg);
            self.stale_old(now, old);
            if let Some(c) = self.conns.get_mut(&id) {
                self.io.cancel_request(id);
                self.io.close(id, c, ConnectionError::Stale);
            }
            self.enter_timewait(now, id);
            return;
        }
        self.io.cancel_request(id);
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        c.remote_id = m.local_comm_id;
        c.remote_ca_guid = m.local_ca_guid;
        c.remote_qpn = remote_qpn;
        let ack = cm_ack_timeout(m.target_ack_delay.get(), c.packet_life_time.get());
        c.timewait = Micros::from_duration(TimeoutExp::masked(ack).to_duration());
        self.io.set_state(id, c, State::RepRcvd);
        let auto_rtu = c.auto_rtu;
        self.conns.index_remote(id);
        if !xrc {
            self.conns.index_qpn(id);
        }
        self.io.event(
            id,
            EventKind::RepReceived(Box::new(RepInfo { rep: m, remote_qpn })),
        );
        if auto_rtu {
            if let Some(c) = self.conns.get_mut(&id) {
                send_rtu(&mut self.io, id, c, &[]);
            }
        }
    }

    fn on_dup_rep(&mut self, id: CommId) {
        let mra_dup = self.cfg.mra_on_duplicate_rep;
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        match c.state {
            State::Established => {
                // Our RTU was lost: build it again.
                let pd = self
                    .io
                    .saved
                    .get(&id)
                    .and_then(|x| x.rtu_private_data.clone())
                    .unwrap_or_default();
                let rtu = Rtu {
                    local_comm_id: id,
                    remote_comm_id: c.remote_id,
                    private_data: PrivateData::from_slice(&pd).unwrap_or_default(),
                };
                self.io.stats.duplicate_replies += 1;
                self.io.send_conn(c, CmMessage::Rtu(rtu));
            }
            State::MraRepSent => self.io.resend_mra(c),
            State::RepRcvd => match mra_dup {
                Some(st) => {
                    self.io.stats.duplicate_replies += 1;
                    send_mra(&mut self.io, id, c, MsgKind::Rep, st, &[]);
                }
                None => self.io.stats.drop(DropReason::Duplicate),
            },
            _ => self.io.stats.drop(DropReason::Duplicate),
        }
    }

    pub(super) fn on_rtu(&mut self, from: PeerAddr, m: Rtu) {
        if self.cookies.in_use() && !self.conns.contains_key(&m.remote_comm_id) {
            self.stateless_rtu(from, m);
            return;
        }
        let Some((c, io)) = self.lookup(from, m.remote_comm_id, m.local_comm_id, false) else {
            return;
        };
        let id = m.remote_comm_id;
        if !matches!(c.state, State::RepSent | State::MraRepRcvd) {
            io.stats.drop(DropReason::Duplicate);
            return;
        }
        io.cancel_request(id);
        io.set_state(id, c, State::Established);
        let private_data = m.private_data.trimmed();
        if !private_data.is_empty() {
            io.event(
                id,
                EventKind::RtuReceived {
                    private_data: private_data.to_vec(),
                },
            );
        }
        io.event(id, EventKind::Established);
    }

    // ---------------------------------------------------------------------------------------
    // Timeout

    /// The REQ (REQ_SENT / MRA_REQ_RCVD) or REP (REP_SENT / MRA_REP_RCVD) ran out of
    /// retries: REJ 4 "timeout" and the connection is gone.
    pub(super) fn on_setup_timeout(&mut self, id: CommId) {
        let guid = self.cfg.local_ca_guid;
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        self.io.stats.timeouts += 1;
        if self.io.gate(id, false) {
            self.io.send_conn(c, timeout_rej(id, c.remote_id, guid));
        }
        self.io.close(id, c, ConnectionError::TimedOut);
        self.remove(id);
    }
}

/// Sends the RTU: the connection is established.
fn send_rtu(io: &mut Io, id: CommId, c: &mut Conn, private_data: &[u8]) {
    let rtu = Rtu {
        local_comm_id: id,
        remote_comm_id: c.remote_id,
        private_data: PrivateData::from_slice(private_data).unwrap_or_default(),
    };
    io.send_conn(c, CmMessage::Rtu(rtu));
    if private_data.iter().any(|&b| b != 0) {
        io.saved_mut(id).rtu_private_data = Some(private_data.into());
    } else if let Some(x) = io.saved.get_mut(&id) {
        x.rtu_private_data = None;
        x.mra = None;
    }
    if io
        .saved
        .get(&id)
        .is_some_and(|x| x.rtu_private_data.is_none() && x.mra.is_none() && x.apr.is_none())
    {
        io.saved.remove(&id);
    }
    io.set_state(id, c, State::Established);
    c.lap = LapState::Uninit;
    io.event(id, EventKind::Established);
}

/// Sends an MRA for the REQ, the REP or (`MsgKind::Other`) the LAP, and keeps it for
/// duplicates.
fn send_mra(
    io: &mut Io,
    id: CommId,
    c: &mut Conn,
    kind: MsgKind,
    service_timeout: TimeoutExp,
    private_data: &[u8],
) {
    let mra = Mra {
        local_comm_id: id,
        remote_comm_id: c.remote_id,
        message_mraed: kind,
        service_timeout,
        private_data: PrivateData::from_slice(private_data).unwrap_or_default(),
    };
    let bytes = io.send_conn(c, CmMessage::Mra(mra));
    io.saved_mut(id).mra = Some(bytes);
    match kind {
        MsgKind::Req => io.set_state(id, c, State::MraReqSent),
        MsgKind::Rep => io.set_state(id, c, State::MraRepSent),
        _ => c.lap = LapState::MraLapSent,
    }
}
