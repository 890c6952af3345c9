//! The active side between the REP and the RTU: [`PendingConnection`]
//! ([`Cm::connect_manual`](super::Cm::connect_manual)).

use ibcm_mad::{RejReason, Req, TimeoutExp};

use super::command::Command;
use super::handle::{Cm, Connection};
use super::types::CmError;
use crate::proto::{ConnId, ConnectParams, RepInfo};

/// Sends [`Command::PendingDropped`] when dropped armed: the connection is abandoned
/// (REJ 4 before the REP, REJ 28 after it) instead of being left to time out.
#[derive(Debug)]
pub(super) struct AbandonGuard {
    cm: Cm,
    id: ConnId,
    armed: bool,
}

impl AbandonGuard {
    pub(super) fn new(cm: Cm, id: ConnId) -> Self {
        AbandonGuard {
            cm,
            id,
            armed: true,
        }
    }

    fn disarm(&mut self) {
        self.armed = false;
    }
}

impl Drop for AbandonGuard {
    fn drop(&mut self) {
        if self.armed {
            self.cm.send(Command::PendingDropped { id: self.id });
        }
    }
}

/// An active connection whose REP has arrived and whose RTU has not been sent: the
/// application's turn to move its QP to RTR and RTS (the kernel's order). Answer it with
/// [`establish`](PendingConnection::establish) (sends the RTU) or
/// [`reject`](PendingConnection::reject) (sends a REJ of the REP). Dropping it unanswered
/// rejects the REP (REJ 28, consumer reject) and logs a warning (rate-limited), so the peer is
/// never left waiting for an RTU.
///
/// Meanwhile the peer's REP retransmissions are answered as
/// [`EndpointConfig::mra_on_duplicate_rep`](crate::proto::EndpointConfig::mra_on_duplicate_rep)(crate::proto::EndpointConfig::mra_on_duplicate_rep)
/// says (an MRA by default), and the peer keeps its QP in RTR.
#[derive(Debug)]
pub struct PendingConnection {
    conn: Connection,
    req: Box<Req>,
    rep: RepInfo,
    guard: AbandonGuard,
}

impl PendingConnection {
    pub(super) fn new(conn: Connection, req: Box<Req>, rep: RepInfo, guard: AbandonGuard) -> Self {
        PendingConnection {
            conn,
            req,
            rep,
            guard,
        }
    }

    /// The REQ this side sent: its start PSN (drawn by the endpoint unless
    /// [`ConnectParams::starting_psn`] was given: the first PSN the local QP receives), QPN,
    /// paths, timeouts, retry counts… With [`rep`](Self::rep) it is what
    /// [`qp_attr::Connection::new`](crate::qp_attr::Connection::new) takes to compute the
    /// RTR and RTS attributes of the local QP.
    pub fn req(&self) -> &Req {
        &self.req
    }

    /// The local communication ID.
    pub fn id(&self) -> ConnId {
        self.conn.id()
    }

    /// The REP: the peer's QPN ([`RepInfo::remote_qpn`], for XRC the TGT QPN), its starting
    /// PSN (our send queue's first PSN), the responder resources and initiator depth it
    /// granted, its private data… With the REQ this side sent ([`req`](Self::req)) it is what
    /// [`qp_attr::Connection::new`](crate::qp_attr::Connection::new) takes to compute the
    /// RTR and RTS attributes of the local QP.
    pub fn rep(&self) -> &RepInfo {
        &self.rep
    }

    /// Sends an MRA for the REP: the RTU (or a reject) will take up to `service_timeout`,
    /// so the peer waits that long instead of resending its REP. The REP stays to be
    /// answered ([`establish`](Self::establish) or [`reject`](Self::reject)).
    ///
    /// # Errors
    /// [`CmError::Call`] if the connection has closed meanwhile.
    pub async fn mra(&self, service_timeout: TimeoutExp) -> Result<(), CmError> {
        let conn = self.conn.id();
        self.conn
            .cm
            .call(|reply| Command::Mra {
                conn,
                service_timeout,
                reply,
            })
            .await??;
        Ok(())
    }

    /// Sends the RTU (with `private_data`, up to 224 bytes) and returns the established
    /// connection. Call it once the local QP is in RTS: the peer moves its QP to RTS when the
    /// RTU arrives and may send at once.
    ///
    /// # Errors
    /// [`CmError::Call`] if the RTU cannot be sent: the connection has closed meanwhile (the
    /// peer gave up or rejected: its reason is in [`CmError::Connection`] instead when it is
    /// known) or the private data does not fit. The REP is then rejected (REJ 28) if the
    /// connection is still waiting, as when the handle is dropped.
    pub async fn establish(mut self, private_data: &[u8]) -> Result<Connection, CmError> {
        let conn = self.conn.id();
        let private_data = private_data.to_vec();
        let r = self
            .conn
            .cm
            .call(|reply| Command::Establish {
                conn,
                private_data,
                reply,
            })
            .await?;
        if let Err(e) = r {
            // Closed by the peer meanwhile: say why.
            if let super::ConnStatus::Closed(why) | super::ConnStatus::Gone(why) =
                self.conn.status()
            {
                return Err(CmError::Connection(why));
            }
            // On return the guard rejects the REP.
            return Err(CmError::Call(e));
        }
        self.guard.disarm();
        // The core reports the connection established as the RTU goes out.
        self.conn.established().await?;
        Ok(self.conn.clone())
    }

    /// Rejects the REP with `reason`, ARI (up to 72 bytes) and private data (up to 148 bytes):
    /// the peer sees a REJ for its REP ("consumer reject after REP"). The connection enters
    /// no TimeWait.
    ///
    /// # Errors
    /// [`CmError::Call`] if the connection has closed meanwhile or the data does not fit.
    /// When the data does not fit, the REP is still rejected, with reason 28 (consumer reject)
    /// and no data.
    pub async fn reject(
        mut self,
        reason: RejReason,
        ari: &[u8],
        private_data: &[u8],
    ) -> Result<(), CmError> {
        let conn = self.conn.id();
        let (ari, private_data) = (ari.to_vec(), private_data.to_vec());
        self.conn
            .cm
            .call(|reply| Command::Reject {
                conn,
                reason,
                ari,
                private_data,
                reply,
            })
            .await??;
        self.guard.disarm();
        Ok(())
    }
}

impl Cm {
    /// Connects in the kernel's order: sends the REQ and resolves when the REP arrives,
    /// without answering it. The application reads the REP ([`PendingConnection::rep`]: the
    /// peer's QPN, starting PSN, responder resources, initiator depth, …), moves its QP to RTR
    /// and RTS (the attributes: [`crate::qp_attr::qp_attr`], from the REQ it sent, [`PendingConnection::req`], and this
    /// REP), and only then calls [`PendingConnection::establish`], which sends the RTU: the
    /// peer moves its QP to RTS when the RTU arrives, so no RTU may precede a QP that is ready
    /// to receive. [`PendingConnection::reject`] rejects the REP instead (say, the QP could
    /// not be brought up); dropping the handle rejects it too (REJ 28, consumer reject), so
    /// the peer is never left waiting.
    ///
    /// While the application works, a duplicate REP (the RTU is late) is answered as
    /// [`EndpointConfig::mra_on_duplicate_rep`](crate::proto::EndpointConfig::mra_on_duplicate_rep) says. An [`App`](crate::App) that consumes the
    /// REP event ([`Cm::bind_with_app`]) keeps it from this call: the call then fails
    /// ([`ConnectionError::LocallyClosed`](crate::proto::ConnectionError::LocallyClosed) once the app has established the connection).
    ///
    /// # Errors
    /// [`CmError::Connect`] for refused parameters, [`CmError::Connection`] when the peer
    /// rejects or never answers, [`CmError::Refused`] when the node service refuses it
    /// ([`Cm::attach`]: a quota), [`CmError::DriverGone`].
    pub async fn connect_manual(
        &self,
        mut params: ConnectParams,
    ) -> Result<PendingConnection, CmError> {
        params.auto_rtu = false;
        let (id, slot, req) = self
            .call(|reply| Command::Connect { params, reply })
            .await??;
        let conn = Connection {
            cm: self.clone(),
            slot,
        };
        // Armed from here: dropping this future abandons the attempt (REJ 4 before the REP,
        // REJ 28 after it), as dropping the `PendingConnection` does.
        let guard = AbandonGuard::new(self.clone(), id);
        let rep = conn.slot.wait_rep().await?;
        Ok(PendingConnection::new(conn, req, rep, guard))
    }
}
