//! Teardown: the `disconnect` command and the DREQ and DREP handlers.

use std::time::Instant;

use ibcm_mad::{
    CmMessage, CommId, Drep, Dreq, Guid, PrivateData, Qpn, RejReason, ReqTransport, Tid, TimeoutExp,
};

use super::io::timeout_rej;
use super::Endpoint;
use crate::proto::conn::{Conn, Micros};
use crate::proto::ids::form_tid;
use crate::proto::util::check_len;
use crate::proto::{
    CallError, ConnId, ConnectionError, DropReason, LapState, PeerAddr, Side, StaleConnection,
    State,
};

impl Endpoint {
    /// Closes a connection in whatever way its state calls for:
    /// * ESTABLISHED: sends a DREQ (retransmitted until the DREP; then TimeWait);
    /// * REQ_SENT / MRA_REQ_RCVD: gives up the attempt with REJ 4 "timeout" (ARI = our CA GUID),
    ///   as Linux does when such an ID is destroyed;
    /// * REQ_RCVD / MRA_REQ_SENT, REP_*: rejects with REJ 28;
    /// * already closing (DREQ_SENT, TIMEWAIT): nothing to do.
    ///
    /// # Errors
    /// [`CallError`] for an unknown connection or private data over 220 bytes.
    pub fn disconnect(
        &mut self,
        now: Instant,
        conn: ConnId,
        private_data: &[u8],
    ) -> Result<(), CallError> {
        check_len("DREQ private data", private_data, Dreq::PRIVATE_DATA_LEN)?;
        let guid = self.cfg.local_ca_guid;
        let (c, io) = self.conn_mut(conn)?;
        match c.state {
            State::Established => {
                io.cancel_request(conn);
                let dreq = Dreq {
                    local_comm_id: conn,
                    remote_comm_id: c.remote_id,
                    remote_qpn_eecn: c.remote_qpn,
                    private_data: PrivateData::from_slice(private_data).unwrap_or_default(),
                };
                io.set_state(conn, c, State::DreqSent);
                c.lap = LapState::Uninit;
                let budget = c.request_budget();
                io.send_request(now, conn, c, CmMessage::Dreq(dreq), budget);
                Ok(())
            }
            State::ReqSent | State::MraReqRcvd => {
                io.send_conn(c, timeout_rej(conn, c.remote_id, guid));
                io.cancel_request(conn);
                io.close(conn, c, ConnectionError::LocallyClosed);
                self.remove(conn);
                Ok(())
            }
            State::ReqRcvd
            | State::MraReqSent
            | State::RepRcvd
            | State::MraRepSent
            | State::RepSent
            | State::MraRepRcvd => self.reject(now, conn, RejReason::ConsumerReject, &[], &[]),
            State::DreqSent | State::DreqRcvd | State::Timewait | State::Idle => Ok(()),
        }
    }

    /// Ends a connection of an earlier life of this node at its peer ([`StaleConnection`]):
    /// the connection enters the table under its old comm ID in DREQ_SENT and its DREQ goes
    /// out; the DREQ timer retransmits it (`s.timeout`, `s.max_retries`) until the DREP,
    /// which closes it (`Closed(Disconnected { by_peer: false })`), or until the retries are
    /// over (`Closed(DisconnectTimedOut)`); then TimeWait, as any DREQ_SENT connection.
    ///
    /// The record knows no local QPN (it holds none, quarantines none) and no remote CA GUID
    /// (it is in neither the duplicate-REQ nor the stale-QPN index); a DREQ from the peer
    /// crossing ours names a QPN it does not have and is dropped (`QpnMismatch`): the peer
    /// answers ours anyway.
    ///
    /// # Errors
    /// [`CallError::WrongState`] if the comm ID is in use here (a connection, in `state`, or an
    /// incoming or outgoing SIDR request, `IDLE`); [`CallError::TooLong`] for private data
    /// over 220 bytes.
    pub fn end_stale(&mut self, now: Instant, s: StaleConnection) -> Result<ConnId, CallError> {
        check_len("DREQ private data", &s.private_data, Dreq::PRIVATE_DATA_LEN)?;
        let id = s.local_comm_id;
        if self.id_taken(id) {
            return Err(CallError::WrongState {
                op: "end_stale",
                state: self.conns.get(&id).map_or(State::Idle, |c| c.state),
            });
        }
        let mut conn = Conn {
            id,
            state: State::Idle,
            lap: LapState::Uninit,
            side: Side::Active,
            transport: ReqTransport::Rc,
            closed: false,
            auto_rtu: false,
            holds_qpn: false,
            remote_id: s.remote_comm_id,
            local_qpn: Qpn::default(),
            remote_qpn: s.remote_qpn,
            remote_ca_guid: Guid(0),
            peer: self.io.peers.intern(s.peer),
            tid: form_tid(self.cfg.hi_tid, id),
            request_timeout: Micros::from_duration(s.timeout),
            max_retries: s.max_retries,
            packet_life_time: TimeoutExp::masked(18),
            timewait: Micros::from_duration(s.timeout),
        };
        // Counted as connected until TimeWait, as a DREQ_SENT connection is.
        self.io.set_state(id, &mut conn, State::DreqSent);
        let dreq = Dreq {
            local_comm_id: id,
            remote_comm_id: s.remote_comm_id,
            remote_qpn_eecn: s.remote_qpn,
            private_data: PrivateData::from_slice(&s.private_data).unwrap_or_default(),
        };
        let budget = conn.request_budget();
        self.io
            .send_request(now, id, &conn, CmMessage::Dreq(dreq), budget);
        self.conns.insert(id, conn);
        Ok(id)
    }

    pub(super) fn on_dreq(&mut self, now: Instant, from: PeerAddr, tid: Tid, m: Dreq) {
        let id = m.remote_comm_id;
        // Found as every message is (`find`: comm IDs, then the source); a DREQ naming no
        // connection of ours is answered anyway.
        let (c, io) = match self.find(from, id, m.local_comm_id, false, false) {
            Ok(found) => found,
            Err(DropReason::UnknownCommId | DropReason::MismatchedCommId) => {
                // Unknown: answer anyway (orphan DREP, IDs swapped, same TID).
                self.io.stats.orphan_dreps += 1;
                let drep = Drep {
                    local_comm_id: m.remote_comm_id,
                    remote_comm_id: m.local_comm_id,
                    private_data: PrivateData::zeroed(),
                };
                self.io.send(from, tid, CmMessage::Drep(drep));
                return;
            }
            // Right IDs from the wrong address: no teardown, and no DREP to a spoofed source.
            Err(why) => {
                self.io.stats.drop(why);
                return;
            }
        };
        if c.state != State::Timewait && m.remote_qpn_eecn != c.local_qpn {
            io.stats.drop(DropReason::QpnMismatch);
            return;
        }
        let drep = CmMessage::Drep(Drep {
            local_comm_id: id,
            remote_comm_id: c.remote_id,
            private_data: PrivateData::zeroed(),
        });
        match c.state {
            State::Established | State::RepSent | State::MraRepRcvd | State::DreqSent => {
                io.cancel_request(id);
                io.set_state(id, c, State::DreqRcvd);
                io.close(
                    id,
                    c,
                    ConnectionError::Disconnected {
                        by_peer: true,
                        private_data: m.private_data.trimmed().to_vec(),
                    },
                );
                // Reply with the DREQ's TID.
                let to = io.peers.addr(c.peer);
                io.send(to, tid, drep);
                self.enter_timewait(now, id);
            }
            State::Timewait => {
                io.stats.duplicate_replies += 1;
                io.send(from, tid, drep);
            }
            _ => io.stats.drop(DropReason::WrongState),
        }
    }

    pub(super) fn on_drep(&mut self, now: Instant, from: PeerAddr, m: Drep) {
        let Some((c, io)) = self.lookup(from, m.remote_comm_id, m.local_comm_id, false) else {
            return;
        };
        let id = m.remote_comm_id;
        if !matches!(c.state, State::DreqSent | State::DreqRcvd) {
            io.stats.drop(DropReason::WrongState);
            return;
        }
        io.cancel_request(id);
        let err = ConnectionError::Disconnected {
            by_peer: false,
            private_data: Vec::new(),
        };
        io.close(id, c, err);
        self.enter_timewait(now, id);
    }

    /// Our DREQ ran out of retries: the connection is down anyway and enters TimeWait.
    pub(super) fn on_dreq_timeout(&mut self, now: Instant, id: CommId) {
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        self.io.close(id, c, ConnectionError::DisconnectTimedOut);
        self.enter_timewait(now, id);
    }
}

#[cfg(test)]
mod tests {
    // A test's start instant: the endpoint itself never reads the clock.
    #![allow(
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::panic,
        clippy::indexing_slicing,
        clippy::disallowed_methods
    )]
    use std::time::Duration;

    use ibcm_mad::Mad;

    use super::*;
    use crate::proto::{EndpointConfig, EventKind};

    fn addr(s: &str) -> PeerAddr {
        s.parse::<std::net::SocketAddr>().unwrap().into()
    }

    fn stale(peer: PeerAddr) -> StaleConnection {
        StaleConnection {
            timeout: Duration::from_secs(1),
            max_retries: 2,
            ..StaleConnection::new(
                CommId(0x1234),
                CommId(0x5678),
                Qpn::new(0x99).unwrap(),
                peer,
            )
        }
    }

    fn endpoint(seed: u64) -> Endpoint {
        Endpoint::new(EndpointConfig {
            rng_seed: Some(seed),
            local_ca_guid: Guid(seed),
            ..EndpointConfig::default()
        })
    }

    fn dreq_of(mad: &[u8]) -> Dreq {
        match Mad::parse(mad).unwrap().msg {
            CmMessage::Dreq(d) => d,
            m => panic!("not a DREQ: {m}"),
        }
    }

    #[test]
    fn a_stale_connection_is_ended_by_the_drep_of_a_peer_that_forgot_it() {
        let now = Instant::now();
        let (a_addr, b_addr) = (addr("127.0.25.1:4791"), addr("127.0.25.2:4791"));
        let mut a = endpoint(1);
        let mut b = endpoint(2);
        let id = a.end_stale(now, stale(b_addr)).unwrap();
        assert_eq!(id, CommId(0x1234));
        assert_eq!(a.state(id), Some(State::DreqSent));
        assert_eq!(
            a.io.limits.established(),
            1,
            "counted as connected until TimeWait"
        );
        // The comm ID is taken: a second one is refused.
        assert!(matches!(
            a.end_stale(now, stale(b_addr)),
            Err(CallError::WrongState {
                state: State::DreqSent,
                ..
            })
        ));
        let t = a.poll_transmit().unwrap();
        assert_eq!(t.to, b_addr);
        let d = dreq_of(&t.mad);
        assert_eq!(
            (d.local_comm_id, d.remote_comm_id, d.remote_qpn_eecn),
            (CommId(0x1234), CommId(0x5678), Qpn::new(0x99).unwrap())
        );
        assert!(a.poll_transmit().is_none());
        // Lost: the DREQ timer sends it again, unchanged.
        a.handle_timeout(now + Duration::from_secs(1));
        let again = a.poll_transmit().unwrap();
        assert_eq!(again.mad, t.mad);
        assert_eq!(a.state(id), Some(State::DreqSent));
        // The peer knows no such connection and answers with an orphan DREP.
        b.handle_datagram(now, a_addr, &again.mad);
        let drep = b.poll_transmit().unwrap();
        assert_eq!(drep.to, a_addr);
        // From another address: not the peer's answer.
        a.handle_datagram(now, addr("127.0.25.3:4791"), &drep.mad);
        assert_eq!(a.state(id), Some(State::DreqSent));
        a.handle_datagram(now, b_addr, &drep.mad);
        let ev = a.poll_event().unwrap();
        assert_eq!(ev.conn, id);
        assert_eq!(
            ev.kind,
            EventKind::Closed(ConnectionError::Disconnected {
                by_peer: false,
                private_data: Vec::new()
            })
        );
        assert_eq!(a.state(id), Some(State::Timewait));
        assert_eq!(a.io.limits.established(), 0);
        assert!(
            a.local_qpns.is_empty() && a.quarantine.is_empty(),
            "no QPN held"
        );
        // No more DREQs; TimeWait ends and the record leaves the table.
        a.handle_timeout(now + Duration::from_secs(10));
        assert!(a.poll_transmit().is_none());
        assert!(matches!(
            a.poll_event().unwrap().kind,
            EventKind::TimewaitExit { .. }
        ));
        assert_eq!(a.state(id), None);
        assert_eq!(a.len(), 0);
        assert!(a.io.pending.is_empty());
    }

    #[test]
    fn a_stale_connection_s_dreq_gives_up_after_its_retries() {
        let now = Instant::now();
        let b_addr = addr("127.0.25.2:4791");
        let mut a = endpoint(1);
        let id = a.end_stale(now, stale(b_addr)).unwrap();
        let mut sent = 0;
        for s in 0..=3 {
            a.handle_timeout(now + Duration::from_secs(s));
            while a.poll_transmit().is_some() {
                sent += 1;
            }
        }
        assert_eq!(sent, 3, "the DREQ and its 2 retries");
        assert_eq!(
            a.poll_event().unwrap().kind,
            EventKind::Closed(ConnectionError::DisconnectTimedOut)
        );
        assert_eq!(a.state(id), Some(State::Timewait));
        assert_eq!(a.io.limits.established(), 0);
    }

    #[test]
    fn new_connections_do_not_take_a_stale_connection_s_comm_id() {
        let now = Instant::now();
        let mut a = endpoint(1);
        let id = a.end_stale(now, stale(addr("127.0.25.2:4791"))).unwrap();
        for _ in 0..1000 {
            assert_ne!(a.alloc_id(), id);
        }
    }
}
