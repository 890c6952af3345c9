//! Path migration through the async API: [`Connection::load_alt_path`] (a LAP sent, resolved
//! by its APR), [`Connection::next_lap`] and [`LapRequest`] (a LAP received, answered by the
//! application), [`Connection::notify_path_migrated`] and [`Cm::set_lap_policy`].
//!
//! A LAP (Load Alternate Path) proposes an alternate path for an established connection; the
//! peer answers with an APR (Alternate Path Response) whose status says whether it loaded it
//! into its QP. The QP attributes of the alternate path, on either side, are
//! [`qp_attr::alt_path_attr`](crate::qp_attr::alt_path_attr).
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! use ibcm::mad::{Guid, Lid, PathInfo, Qpn, ServiceId};
//! use ibcm::proto::{AcceptParams, ConnectParams, EndpointConfig, ListenOptions};
//! use ibcm::rt::{Cm, LapPolicy, MemNetwork};
//!
//! let net = MemNetwork::new();
//! let a_addr = "127.0.0.1:4791".parse::<std::net::SocketAddr>().unwrap().into();
//! let b_addr = "127.0.0.2:4791".parse::<std::net::SocketAddr>().unwrap().into();
//! let (a, _) = Cm::bind(net.transport(a_addr), EndpointConfig::default());
//! let (b, _) = Cm::bind(
//!     net.transport(b_addr),
//!     EndpointConfig { local_ca_guid: Guid(2), ..Default::default() },
//! );
//! // The passive side answers LAPs itself (the default answers "unsupported").
//! b.set_lap_policy(LapPolicy::Application).await.unwrap();
//!
//! let mut listener = b.listen(ServiceId(0x42), ListenOptions::default()).await.unwrap();
//! let server = tokio::spawn(async move {
//!     let incoming = listener.next().await.unwrap();
//!     let conn = incoming.accept(AcceptParams::new(Qpn::new(0x22).unwrap())).await.unwrap();
//!     let lap = conn.next_lap().await.unwrap();
//!     // Here: load `lap.path()` into the QP (qp_attr::alt_path_attr, LapRole::Receiver).
//!     let path = *lap.path();
//!     lap.accept(b"loaded").await.unwrap();
//!     path
//! });
//! let conn = a
//!     .connect(ConnectParams::new(b_addr, ServiceId(0x42), Qpn::new(0x11).unwrap()))
//!     .await
//!     .unwrap();
//! let alt = PathInfo { local_lid: Lid(5), remote_lid: Lid(6), ..PathInfo::default() };
//! let apr = conn.load_alt_path(alt, b"try this").await.unwrap();
//! assert_eq!(apr.private_data, b"loaded");
//! // Here: load `alt` into the QP (qp_attr::alt_path_attr, LapRole::Sender).
//! assert_eq!(server.await.unwrap(), alt);
//! # }
//! ```

use ibcm_mad::{AprStatus, PathInfo, TimeoutExp};
use tokio::sync::oneshot;

use super::command::Command;
use super::handle::{Cm, Connection};
use super::types::{AprAnswer, CmError, LapArrived, LapPolicy};
use crate::proto::ConnId;

/// Why the LAP calls fail through a node service ([`Cm::attach`]) that does not serve path
/// migration.
pub(crate) const NOT_SERVED: &str =
    "path migration (LAP/APR) is not served by this node service (an ibcmd that predates it, or one serving no LAP exchange): its endpoint answers every LAP \"unsupported\"";

impl Cm {
    /// Sets who answers the LAPs that arrive on this endpoint's connections: the driver, with
    /// APR "unsupported" ([`LapPolicy::Unsupported`], the default), or the application through
    /// [`Connection::next_lap`] ([`LapPolicy::Application`]). It applies to the LAPs that
    /// arrive once it is set: set it before connections are established. Back to
    /// `Unsupported`, the LAPs held for `next_lap` are answered "unsupported" and the waiting
    /// `next_lap` calls fail with [`CmError::LapsNotDelegated`]; the [`LapRequest`]s handed
    /// out already remain the application's to answer.
    ///
    /// Through the node service ([`Cm::attach`]) the policy is this client's own: its
    /// connections' LAPs come to it, the other clients' are not affected. There, going back
    /// to `Unsupported` has the daemon answer "unsupported" every LAP delivered and not
    /// answered yet, the [`LapRequest`]s handed out included (their answers then fail with
    /// [`CmError::Call`]).
    ///
    /// # Errors
    /// [`CmError::Refused`] for [`LapPolicy::Application`] through a node service that does
    /// not serve path migration (an older `ibcmd`, whose endpoint answers every LAP
    /// "unsupported", which `Unsupported` asks for, so that is `Ok`);
    /// [`CmError::DriverGone`].
    pub async fn set_lap_policy(&self, policy: LapPolicy) -> Result<(), CmError> {
        if self.laps_not_served() {
            return match policy {
                LapPolicy::Unsupported => Ok(()),
                LapPolicy::Application => Err(CmError::Refused(NOT_SERVED.into())),
            };
        }
        self.call(|reply| Command::SetLapPolicy { policy, reply })
            .await
    }
}

impl Connection {
    /// Proposes `path` as the connection's alternate path: sends a LAP (with `private_data`,
    /// up to 168 bytes) and resolves when the peer's APR arrives. `path` is written from this
    /// side's view: `local_*` this side's port, `remote_*` the peer's (as in a REQ), and its
    /// Local ACK Timeout is what the peer's QP gets. The LAP is retransmitted with the
    /// connection's request timeout and retries (an MRA from the peer extends the wait).
    ///
    /// On `Ok` the peer has loaded the path (APR status [`AprStatus::Success`]); load it into
    /// the local QP now ([`qp_attr::alt_path_attr`](crate::qp_attr::alt_path_attr) with
    /// [`LapRole::Sender`](crate::qp_attr::LapRole::Sender)). Dropping the future does not
    /// withdraw the LAP: the exchange goes on, its outcome unseen, and this connection's next
    /// LAP waits for its end.
    ///
    /// # Errors
    /// * [`CmError::LapRejected`]: the APR's status is another (the APR in it); the connection
    ///   stays on the paths it had.
    /// * [`CmError::LapTimedOut`]: no APR after the last retry; the connection stays.
    /// * [`CmError::Call`]: refused at once, with the endpoint's
    ///   [`CallError`](crate::proto::CallError): `WrongState` when the connection is not
    ///   established, or when a LAP exchange is under way on it (this side's or the peer's:
    ///   `WrongState` then names state ESTABLISHED), `TooLong` for the private data,
    ///   `UnknownConnection` once it has left the table.
    /// * [`CmError::Connection`]: the connection ended before the APR.
    /// * [`CmError::Refused`] through a node service ([`Cm::attach`]) that does not serve
    ///   path migration, or over its quota of LAP exchanges; [`CmError::DriverGone`].
    ///
    /// With an [`App`](crate::App) ([`Cm::bind_with_app`]) that consumes the APR event, this
    /// call waits until the connection ends.
    pub async fn load_alt_path(
        &self,
        path: PathInfo,
        private_data: &[u8],
    ) -> Result<AprAnswer, CmError> {
        if self.cm.laps_not_served() {
            return Err(CmError::Refused(NOT_SERVED.into()));
        }
        let conn = self.id();
        let private_data = private_data.to_vec();
        self.cm
            .call(|reply| Command::LoadAltPath {
                conn,
                path,
                private_data,
                reply,
            })
            .await?
    }

    /// The next LAP the peer sends on this connection (or the one that arrived already and
    /// waits), as a [`LapRequest`] to answer. Needs [`LapPolicy::Application`]
    /// ([`Cm::set_lap_policy`]); under the default policy the driver answers every LAP itself.
    ///
    /// Cancel-safe: a LAP handed over to a `next_lap` future dropped before it resolved is held
    /// for the next call. A connection has one LAP exchange at a time, so the next LAP comes
    /// only once this one is answered.
    ///
    /// # Errors
    /// [`CmError::LapsNotDelegated`] under [`LapPolicy::Unsupported`] (also when the policy
    /// changes back while this waits); [`CmError::Connection`] when the connection has ended
    /// (or ends while this waits); [`CmError::Call`] (`UnknownConnection`) for a connection
    /// that has left the table; [`CmError::Refused`] through a node service ([`Cm::attach`])
    /// that does not serve path migration; [`CmError::DriverGone`].
    pub async fn next_lap(&self) -> Result<LapRequest, CmError> {
        if self.cm.laps_not_served() {
            return Err(CmError::Refused(NOT_SERVED.into()));
        }
        let conn = self.id();
        let rx = self.cm.queue(|reply| Command::NextLap { conn, reply })?;
        let mut taking = Taking {
            cm: &self.cm,
            conn,
            rx,
            done: false,
        };
        let r = (&mut taking.rx).await;
        taking.done = true;
        let lap = r.map_err(|_| CmError::DriverGone)??;
        Ok(LapRequest {
            cm: self.cm.clone(),
            conn,
            path: lap.path,
            private_data: lap.private_data,
            answered: false,
        })
    }

    /// Reports that the QP has migrated to its alternate path (the verbs' `IB_EVENT_PATH_MIG`,
    /// `IBV_EVENT_PATH_MIG`): the alternate path is now the primary one, and a new LAP
    /// exchange (either way) may load the next alternate path.
    ///
    /// # Errors
    /// [`CmError::Call`] (`WrongState`) when the connection is not established or a LAP
    /// exchange is under way on it; `UnknownConnection` once it has left the table;
    /// [`CmError::Refused`] through a node service ([`Cm::attach`]) that does not serve path
    /// migration; [`CmError::DriverGone`].
    pub async fn notify_path_migrated(&self) -> Result<(), CmError> {
        if self.cm.laps_not_served() {
            return Err(CmError::Refused(NOT_SERVED.into()));
        }
        let conn = self.id();
        self.cm
            .call(|reply| Command::PathMigrated { conn, reply })
            .await??;
        Ok(())
    }
}

/// A `next_lap` waiting for its LAP: dropped before it took it, it gives the LAP (if one was
/// handed over meanwhile) back to the driver, which holds it for the next call.
struct Taking<'a> {
    cm: &'a Cm,
    conn: ConnId,
    rx: oneshot::Receiver<Result<LapArrived, CmError>>,
    done: bool,
}

impl Drop for Taking<'_> {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        self.rx.close();
        if let Ok(Ok(lap)) = self.rx.try_recv() {
            self.cm.send(Command::LapRequeue {
                conn: self.conn,
                lap,
            });
        }
    }
}

/// A LAP from the peer that must be answered ([`Connection::next_lap`]): it proposes
/// [`path`](LapRequest::path) as the connection's alternate path. Load it into the QP
/// ([`qp_attr::alt_path_attr`](crate::qp_attr::alt_path_attr) with
/// [`LapRole::Receiver`](crate::qp_attr::LapRole::Receiver): the kernel's order, the QP
/// first) and [`accept`](LapRequest::accept) (APR status 0, "path loaded"), or
/// [`reject`](LapRequest::reject) with a status of your choice; [`mra`](LapRequest::mra) asks
/// the peer for more time.
///
/// Dropping it unanswered answers APR status 3, [`AprStatus::Rejected`], with no data, and logs
/// a warning (rate-limited), so that the peer never waits for its LAP to time out.
#[derive(Debug)]
pub struct LapRequest {
    cm: Cm,
    conn: ConnId,
    path: PathInfo,
    private_data: Vec<u8>,
    answered: bool,
}

impl LapRequest {
    /// The connection's local communication ID.
    pub fn id(&self) -> ConnId {
        self.conn
    }

    /// The proposed alternate path, as the LAP carries it: written from the sender's view
    /// (`local_*` is the peer's port, `remote_*` this side's), as a received REQ's paths are.
    pub fn path(&self) -> &PathInfo {
        &self.path
    }

    /// The LAP's private data (168 bytes on the wire; trailing zeros trimmed).
    pub fn private_data(&self) -> &[u8] {
        &self.private_data
    }

    /// Sends an MRA for the LAP: the answer will take up to `service_timeout`, so the peer
    /// waits that long instead of resending its LAP. The LAP stays to be answered.
    ///
    /// # Errors
    /// [`CmError::Call`] if the LAP no longer waits for an answer (the connection ended);
    /// [`CmError::DriverGone`].
    pub async fn mra(&self, service_timeout: TimeoutExp) -> Result<(), CmError> {
        let conn = self.conn;
        self.cm
            .call(|reply| Command::Mra {
                conn,
                service_timeout,
                reply,
            })
            .await??;
        Ok(())
    }

    /// Accepts the path: sends the APR with status [`AprStatus::Success`] ("path loaded") and
    /// `private_data` (up to 148 bytes). Load the path into the QP before: the peer loads it
    /// into its own when this APR arrives.
    ///
    /// # Errors
    /// [`CmError::Call`] if the connection ended meanwhile or the private data does not fit.
    /// When it does not fit, the peer still gets an answer: APR status 3 ("rejected"), no
    /// data.
    pub async fn accept(self, private_data: &[u8]) -> Result<(), CmError> {
        self.answer(AprStatus::Success, &[], private_data).await
    }

    /// Rejects the path: sends the APR with `status` (say [`AprStatus::Rejected`], or
    /// [`AprStatus::InvalidLid`] for a path this side cannot use), `additional_info` (up to 72
    /// bytes) and `private_data` (up to 148 bytes). The status is sent as given:
    /// [`AprStatus::Success`] would tell the peer the path is loaded, as
    /// [`accept`](Self::accept) does.
    ///
    /// # Errors
    /// As [`accept`](Self::accept): when the data does not fit, the peer still gets APR
    /// status 3 ("rejected") without data.
    pub async fn reject(
        self,
        status: AprStatus,
        additional_info: &[u8],
        private_data: &[u8],
    ) -> Result<(), CmError> {
        self.answer(status, additional_info, private_data).await
    }

    async fn answer(
        mut self,
        status: AprStatus,
        additional_info: &[u8],
        private_data: &[u8],
    ) -> Result<(), CmError> {
        let conn = self.conn;
        let (additional_info, private_data) = (additional_info.to_vec(), private_data.to_vec());
        // Queued, the APR is the answer, even if this future is dropped before it resolves.
        let rx = self.cm.queue(|reply| Command::Apr {
            conn,
            status,
            additional_info,
            private_data,
            reply,
        })?;
        self.answered = true;
        rx.await.map_err(|_| CmError::DriverGone)??;
        Ok(())
    }
}

impl Drop for LapRequest {
    fn drop(&mut self) {
        if !self.answered {
            // The driver answers "rejected" and logs that (rate-limited).
            self.cm.send(Command::LapUnanswered { conn: self.conn });
        }
    }
}

#[cfg(test)]
mod tests {
    use tokio::sync::mpsc;

    use super::*;
    use crate::rt::slot::{Registry, Slot};

    /// Through a node service ([`Cm::attach`]) that does not serve path migration the LAP
    /// calls are refused at once, with why, and nothing goes to the daemon; asking for its
    /// own behaviour ("unsupported") is fine.
    #[tokio::test]
    async fn through_an_older_node_service_path_migration_is_refused() {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let cm = Cm::from_channel(
            tx,
            Registry::default(),
            crate::rt::node::NodePaths::not_served(),
        );
        let conn = Connection {
            cm: cm.clone(),
            slot: Slot::new(ibcm_mad::CommId(7)),
        };
        let refusals = [
            conn.load_alt_path(PathInfo::default(), &[]).await.map(drop),
            conn.next_lap().await.map(drop),
            conn.notify_path_migrated().await,
            cm.set_lap_policy(LapPolicy::Application).await,
        ];
        for r in refusals {
            assert!(
                matches!(&r, Err(CmError::Refused(why)) if why.contains("predates")),
                "{r:?}"
            );
        }
        assert!(cm.set_lap_policy(LapPolicy::Unsupported).await.is_ok());
        assert!(
            rx.try_recv().is_err(),
            "nothing was sent to the node service"
        );
    }
}
