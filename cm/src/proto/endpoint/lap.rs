//! Alternate paths: the `load_alternate_path`, `apr` and `notify_path_migrated` commands and
//! the LAP and APR handlers. (An MRA for a LAP goes through `Endpoint::mra` and `on_mra` in
//! `setup.rs`.)

use std::time::Instant;

use ibcm_mad::{Apr, AprStatus, CmMessage, CommId, Lap, PathInfo, PrivateData, TimeoutExp};

use super::Endpoint;
use crate::proto::util::check_len;
use crate::proto::{CallError, ConnId, DropReason, EventKind, LapState, PeerAddr, State};

impl Endpoint {
    /// Proposes an alternate path on an established connection (LAP); the answer is
    /// [`EventKind::AprReceived`] or [`EventKind::LapTimedOut`].
    ///
    /// # Errors
    /// [`CallError`] for an unknown connection, a state other than ESTABLISHED with no LAP in
    /// progress, or private data over 168 bytes.
    pub fn load_alternate_path(
        &mut self,
        now: Instant,
        conn: ConnId,
        path: PathInfo,
        private_data: &[u8],
    ) -> Result<(), CallError> {
        check_len("LAP private data", private_data, Lap::PRIVATE_DATA_LEN)?;
        let (c, io) = self.conn_mut(conn)?;
        if c.state != State::Established || !matches!(c.lap, LapState::Uninit | LapState::Idle) {
            return Err(CallError::WrongState {
                op: "load_alternate_path",
                state: c.state,
            });
        }
        let lap = Lap {
            local_comm_id: conn,
            remote_comm_id: c.remote_id,
            remote_qpn_eecn: c.remote_qpn,
            remote_cm_response_timeout: TimeoutExp::from_duration_ceil(c.request_timeout.get()),
            alternate_path: path,
            private_data: PrivateData::from_slice(private_data).unwrap_or_default(),
        };
        c.lap = LapState::LapSent;
        let budget = c.request_budget();
        io.send_request(now, conn, c, CmMessage::Lap(lap), budget);
        Ok(())
    }

    /// Reports that the QP migrated to its alternate path (`IB_EVENT_PATH_MIG`): the
    /// alternate path becomes primary and a new LAP may be exchanged.
    ///
    /// # Errors
    /// [`CallError`] for an unknown connection or a connection that is not established with
    /// no LAP in progress.
    pub fn notify_path_migrated(&mut self, _now: Instant, conn: ConnId) -> Result<(), CallError> {
        let (c, _) = self.conn_mut(conn)?;
        if c.state != State::Established || !matches!(c.lap, LapState::Uninit | LapState::Idle) {
            return Err(CallError::WrongState {
                op: "notify_path_migrated",
                state: c.state,
            });
        }
        c.lap = LapState::Idle;
        Ok(())
    }

    /// Answers a LAP reported by [`EventKind::LapReceived`] with an APR.
    ///
    /// # Errors
    /// [`CallError`] for an unknown connection, no LAP to answer, or fields that do not fit.
    pub fn apr(
        &mut self,
        _now: Instant,
        conn: ConnId,
        status: AprStatus,
        additional_info: &[u8],
        private_data: &[u8],
    ) -> Result<(), CallError> {
        check_len("APR additional info", additional_info, 72)?;
        check_len("APR private data", private_data, Apr::PRIVATE_DATA_LEN)?;
        let (c, io) = self.conn_mut(conn)?;
        if !matches!(c.lap, LapState::LapRcvd | LapState::MraLapSent) {
            return Err(CallError::WrongState {
                op: "apr",
                state: c.state,
            });
        }
        let mut add = [0u8; 72];
        if let Some(dst) = add.get_mut(..additional_info.len()) {
            dst.copy_from_slice(additional_info);
        }
        let apr = Apr {
            local_comm_id: conn,
            remote_comm_id: c.remote_id,
            additional_info_length: additional_info.len() as u8,
            ap_status: status,
            additional_info: add,
            private_data: PrivateData::from_slice(private_data).unwrap_or_default(),
        };
        let bytes = io.send_conn(c, CmMessage::Apr(apr));
        io.saved_mut(conn).apr = Some(bytes);
        c.lap = LapState::Idle;
        Ok(())
    }

    pub(super) fn on_lap(&mut self, from: PeerAddr, m: Lap) {
        let Some((c, io)) = self.lookup(from, m.remote_comm_id, m.local_comm_id, false) else {
            return;
        };
        let id = m.remote_comm_id;
        if c.state != State::Established {
            io.stats.drop(DropReason::WrongState);
            return;
        }
        match c.lap {
            LapState::Uninit | LapState::Idle => {
                c.lap = LapState::LapRcvd;
                io.event(
                    id,
                    EventKind::LapReceived {
                        path: m.alternate_path,
                        private_data: m.private_data.trimmed().to_vec(),
                    },
                );
            }
            LapState::MraLapSent => io.resend_mra(c),
            _ => io.stats.drop(DropReason::Duplicate),
        }
    }

    pub(super) fn on_apr(&mut self, from: PeerAddr, m: Apr) {
        let Some((c, io)) = self.lookup(from, m.remote_comm_id, m.local_comm_id, false) else {
            return;
        };
        let id = m.remote_comm_id;
        if !matches!(c.lap, LapState::LapSent | LapState::MraLapRcvd) {
            io.stats.drop(DropReason::WrongState);
            return;
        }
        io.cancel_request(id);
        c.lap = LapState::Idle;
        io.event(
            id,
            EventKind::AprReceived {
                status: m.ap_status,
                additional_info: m.additional_info_bytes().to_vec(),
                private_data: m.private_data.trimmed().to_vec(),
            },
        );
    }

    /// Our LAP ran out of retries: the LAP exchange ends, the connection stays.
    pub(super) fn on_lap_timeout(&mut self, id: CommId) {
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        c.lap = LapState::Idle;
        self.io.event(id, EventKind::LapTimedOut);
    }
}
