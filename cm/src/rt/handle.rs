//! The async API: [`Cm`] (the endpoint handle), [`Connection`], [`Listener`], [`Incoming`].

use std::sync::Arc;
use std::time::{Duration, Instant};

use ibcm_mad::{RejReason, ServiceId, TimeoutExp};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tracing::warn;

use super::command::{AppCall, Command};
use super::driver::{BoxApp, Driver, SHUTDOWN_LINGER};
use super::sa::{PathError, PathResolver};
use super::slot::{Registry, SlotRef};
use super::stats::CmStats;
use super::types::{CmError, ConnStatus, IncomingKind, SidrAnswer};
use super::DatagramTransport;
use crate::app::App;
use crate::proto::{
    AcceptParams, ConnId, ConnectParams, ConnectionError, Endpoint, EndpointConfig, ListenOptions,
    PeerAddr, ReqInfo, SidrRepParams, SidrReqParams, StatelessInfo,
};
use crate::sa::PathTarget;
use ibcm_mad::sa::PathRecord;

/// A cloneable handle to a CM endpoint running in a tokio task.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// use ibcm::rt::{Cm, MemNetwork};
/// use ibcm::proto::{AcceptParams, ConnectParams, EndpointConfig, ListenOptions};
/// use ibcm_mad::{Guid, Qpn, ServiceId};
///
/// let net = MemNetwork::new();
/// let a_addr = "127.0.0.1:4791".parse::<std::net::SocketAddr>().unwrap().into();
/// let b_addr = "127.0.0.2:4791".parse::<std::net::SocketAddr>().unwrap().into();
/// let (a, _) = Cm::bind(net.transport(a_addr), EndpointConfig::default());
/// let (b, _) = Cm::bind(
///     net.transport(b_addr),
///     EndpointConfig { local_ca_guid: Guid(2), ..Default::default() },
/// );
///
/// let mut listener = b.listen(ServiceId(0x42), ListenOptions::default()).await.unwrap();
/// let server = tokio::spawn(async move {
///     let incoming = listener.next().await.unwrap();
///     incoming.accept(AcceptParams::new(Qpn::new(0x22).unwrap())).await.unwrap()
/// });
/// let conn = a
///     .connect(ConnectParams::new(b_addr, ServiceId(0x42), Qpn::new(0x11).unwrap()))
///     .await
///     .unwrap();
/// let passive = server.await.unwrap();
/// passive.established().await.unwrap();
/// let why = conn.disconnect(&[]).await;
/// assert!(matches!(why, ibcm::proto::ConnectionError::Disconnected { by_peer: false, .. }));
/// assert!(matches!(
///     passive.closed().await,
///     ibcm::proto::ConnectionError::Disconnected { by_peer: true, .. }
/// ));
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct Cm {
    // One pointer: every `Connection` handle holds a `Cm`.
    shared: Arc<Shared>,
}

/// What the handles of one endpoint share.
#[derive(Debug)]
struct Shared {
    tx: mpsc::UnboundedSender<Command>,
    registry: Registry,
    /// Whether the commands go to the node service's client task ([`Cm::attach`]) rather
    /// than to a driver of this process.
    attached: bool,
    /// In-process: the SA client [`Cm::resolve_path`] asks ([`Cm::set_path_resolver`]).
    paths: std::sync::OnceLock<PathResolver>,
    /// Attached: the node service, which [`Cm::resolve_path`] asks.
    node_paths: Option<super::node::NodePaths>,
}

impl Cm {
    /// Starts an endpoint on `transport` in a new tokio task. Returns the handle and the
    /// task, which ends when every handle is dropped, on [`Cm::shutdown`], or when the
    /// transport fails (its error is the task's output).
    /// No application runs next to the endpoint: every event goes to the handles (see
    /// [`Cm::bind_with_app`]).
    pub fn bind<T: DatagramTransport>(
        transport: T,
        config: EndpointConfig,
    ) -> (Cm, JoinHandle<std::io::Result<()>>) {
        Self::spawn(transport, config, None)
    }

    /// [`Cm::bind`] with an [`App`] run inside the driver task, next to the endpoint, in the
    /// order the [`crate::App`] docs give; the driver's one timer also fires the app's
    /// deadlines. Every event goes to the app first; the events it consumes
    /// ([`App::handle_event`] returns `true`) are not delivered to handles (a REQ the app
    /// consumed reaches no [`Listener`] and gets no [`Connection`] handle), the others are, as
    /// with [`Cm::bind`]. Reach the app from async code with [`Cm::with_app`].
    pub fn bind_with_app<T: DatagramTransport, A: App + Send + 'static>(
        transport: T,
        config: EndpointConfig,
        app: A,
    ) -> (Cm, JoinHandle<std::io::Result<()>>) {
        Self::spawn(transport, config, Some(Box::new(app)))
    }

    fn spawn<T: DatagramTransport>(
        transport: T,
        config: EndpointConfig,
        app: Option<BoxApp>,
    ) -> (Cm, JoinHandle<std::io::Result<()>>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let registry = Registry::default();
        let driver = Driver::new(transport, config, rx, registry.clone(), app);
        let task = tokio::spawn(driver.run());
        (
            Cm {
                shared: Arc::new(Shared {
                    tx,
                    registry,
                    attached: false,
                    paths: std::sync::OnceLock::new(),
                    node_paths: None,
                }),
            },
            task,
        )
    }

    /// A handle whose commands go to `tx` and whose slots are in `registry` (the node
    /// service's client task, [`Cm::attach`], serves them instead of a driver), and whose
    /// paths the node service resolves.
    pub(super) fn from_channel(
        tx: mpsc::UnboundedSender<Command>,
        registry: Registry,
        paths: super::node::NodePaths,
    ) -> Cm {
        Cm {
            shared: Arc::new(Shared {
                tx,
                registry,
                attached: true,
                paths: std::sync::OnceLock::new(),
                node_paths: Some(paths),
            }),
        }
    }

    /// Gives this in-process endpoint an SA client, for [`Cm::resolve_path`] (an endpoint on
    /// an InfiniBand port: [`PathResolver::open`] on its umad device). Every clone of this
    /// handle shares it.
    ///
    /// # Errors
    /// `r` back when the endpoint has one already, or is attached to the node service
    /// ([`Cm::attach`]: the daemon resolves the paths).
    pub fn set_path_resolver(&self, r: PathResolver) -> Result<(), PathResolver> {
        if self.shared.attached {
            return Err(r);
        }
        self.shared.paths.set(r)
    }

    /// The path to `to` (`lid:N` or `gid:G`, [`PathTarget`]) from the endpoint's InfiniBand
    /// port: a PathRecord Get to the SA by SLID/DLID, or by SGID/DGID in the port's P_Key 0.
    /// In-process, the endpoint's [`PathResolver`] asks ([`Cm::set_path_resolver`]);
    /// attached ([`Cm::attach`]), the daemon asks its own (`ibcmd --umad DEV` on an
    /// InfiniBand port). The record gives the REQ's fields:
    /// [`connect_params`](crate::sa::connect_params)`(&rec, ca_ack_delay, 0, service_id,
    /// qpn)` (the P_Key index is 0: the path is in the port's P_Key 0).
    ///
    /// # Errors
    /// [`CmError::Path`]: no SA ([`PathError::NoSa`]: RoCE, UDP, or no resolver given), an
    /// older daemon ([`PathError::NotServed`]), no SM, the SA's error, a path in another
    /// partition; [`CmError::Refused`]: the daemon's quota of path queries in flight;
    /// [`CmError::DriverGone`]: the node service connection is gone.
    pub async fn resolve_path(&self, to: PathTarget) -> Result<PathRecord, CmError> {
        if let Some(n) = &self.shared.node_paths {
            return n.resolve(to, false).await.map(|(rec, _)| rec);
        }
        match self.shared.paths.get() {
            Some(r) => Ok(r.resolve(to).await?),
            None => Err(PathError::NoSa.into()),
        }
    }

    /// [`Cm::resolve_path`], and an alternate path for Automatic Path Migration when the SA
    /// has one: another SLID and DLID between the same two ports (a fabric whose SM gives
    /// ports more than one LID, LMC > 0), asked with a GetTable by SGID/DGID
    /// ([`PathResolver::resolve_with_alternate`]; the daemon's, attached). The alternate
    /// record gives the REQ's `alternate_path` as the primary one gives its primary path:
    /// [`req_path`](crate::sa::req_path)`(&alt, ca_ack_delay)`.
    ///
    /// # Errors
    /// As [`Cm::resolve_path`]; attached to a daemon that predates path migration,
    /// [`PathError::AlternateNotServed`].
    pub async fn resolve_path_with_alternate(
        &self,
        to: PathTarget,
    ) -> Result<(PathRecord, Option<PathRecord>), CmError> {
        if let Some(n) = &self.shared.node_paths {
            return n.resolve(to, true).await;
        }
        match self.shared.paths.get() {
            Some(r) => Ok(r.resolve_with_alternate(to).await?),
            None => Err(PathError::NoSa.into()),
        }
    }

    /// Runs `f` inside the driver task on its app (of type `A`, installed with
    /// [`Cm::bind_with_app`]) and the endpoint, at the driver's current time. What follows —
    /// events, the app's [`App::poll`], transmissions, the re-armed timer — is handled as after
    /// any input.
    ///
    /// # Errors
    /// [`CmError::NoApp`] if the endpoint runs no `A`; [`CmError::Refused`] through the node
    /// service ([`Cm::attach`]: the daemon's endpoint runs the daemon's app, not this
    /// process's); [`CmError::DriverGone`].
    pub async fn with_app<A, R, F>(&self, f: F) -> Result<R, CmError>
    where
        A: App + 'static,
        R: Send + 'static,
        F: FnOnce(&mut A, &mut Endpoint, Instant) -> R + Send + 'static,
    {
        if self.shared.attached {
            return Err(CmError::Refused(
                "with_app is not served through the node service: the endpoint and its app run in the daemon"
                    .into(),
            ));
        }
        let r = self
            .call(|reply| {
                Command::WithApp(AppCall(Box::new(move |app, ep, now| {
                    let r = app
                        .and_then(|a| a.downcast_mut::<A>())
                        .map(|a| f(a, ep, now));
                    let _ = reply.send(r);
                })))
            })
            .await?;
        r.ok_or(CmError::NoApp)
    }

    pub(crate) async fn call<R>(
        &self,
        f: impl FnOnce(oneshot::Sender<R>) -> Command,
    ) -> Result<R, CmError> {
        self.queue(f)?.await.map_err(|_| CmError::DriverGone)
    }

    /// Queues a command for the driver; its answer comes on the receiver. Once queued, the
    /// driver acts on it even if the caller stops waiting.
    pub(crate) fn queue<R>(
        &self,
        f: impl FnOnce(oneshot::Sender<R>) -> Command,
    ) -> Result<oneshot::Receiver<R>, CmError> {
        let (tx, rx) = oneshot::channel();
        self.shared
            .tx
            .send(f(tx))
            .map_err(|_| CmError::DriverGone)?;
        Ok(rx)
    }

    /// Whether this handle is attached to a node service that does not serve path migration
    /// (an `ibcmd` that predates it, or one told to serve no LAP exchange).
    pub(super) fn laps_not_served(&self) -> bool {
        self.shared.node_paths.as_ref().is_some_and(|n| !n.apm())
    }

    pub(super) fn slot(&self, id: ConnId) -> Option<SlotRef> {
        self.shared.registry.get(id)
    }

    /// Connects; resolves when the connection is established.
    ///
    /// The RTU goes out as soon as the REP arrives, without waiting for the application: this
    /// is for callers that bring their QP up before connecting (the REP's QPN and PSN known
    /// in advance, or not needed) or use none. An application that moves its QP to RTR and
    /// RTS with what the REP says (as the kernel CM's users do) uses
    /// [`Cm::connect_manual`] instead, which sends the RTU only when it is told to.
    ///
    /// # Errors
    /// [`CmError::Connect`] for refused parameters, [`CmError::Connection`] when the peer
    /// rejects or never answers, [`CmError::Refused`] when the node service refuses it
    /// ([`Cm::attach`]: a quota), [`CmError::DriverGone`].
    pub async fn connect(&self, params: ConnectParams) -> Result<Connection, CmError> {
        let conn = self.start_connect(params).await?;
        conn.established().await?;
        Ok(conn)
    }

    /// Sends the REQ and returns the connection at once (still connecting); await
    /// [`Connection::established`] to know how it went. Like [`Cm::connect`], the RTU is
    /// sent as soon as the REP arrives.
    ///
    /// # Errors
    /// [`CmError::Connect`], [`CmError::Refused`] (node service), [`CmError::DriverGone`].
    pub async fn start_connect(&self, mut params: ConnectParams) -> Result<Connection, CmError> {
        // The async API always sends the RTU itself.
        params.auto_rtu = true;
        let (_id, slot, _req) = self
            .call(|reply| Command::Connect { params, reply })
            .await??;
        Ok(Connection {
            cm: self.clone(),
            slot,
        })
    }

    /// Starts listening on `service_id`. Incoming requests arrive on the returned
    /// [`Listener`]; dropping it stops listening (that listener's registration only).
    ///
    /// One listener per service ID and endpoint: a second `listen` on a service ID that is
    /// listened on (by a live [`Listener`] or by the endpoint's app) fails with
    /// [`CmError::AlreadyListening`] and leaves the first one as it was.
    ///
    /// # Errors
    /// [`CmError::AlreadyListening`], [`CmError::DriverGone`].
    pub async fn listen(
        &self,
        service_id: ServiceId,
        options: ListenOptions,
    ) -> Result<Listener, CmError> {
        let (tx, rx) = mpsc::unbounded_channel();
        let token = self
            .call(|reply| Command::Listen {
                service_id,
                options,
                tx,
                reply,
            })
            .await??;
        Ok(Listener {
            rx,
            cm: self.clone(),
            service_id,
            token,
            stateless: None,
        })
    }

    /// Resolves `params.service_id` with SIDR.
    ///
    /// # Errors
    /// [`CmError::SidrTimedOut`], [`CmError::Connect`] (private data too long),
    /// [`CmError::DriverGone`]. A non-success status is an `Ok` answer.
    pub async fn sidr(&self, params: SidrReqParams) -> Result<SidrAnswer, CmError> {
        let (id, rx) = self.call(|reply| Command::Sidr { params, reply }).await??;
        // Dropped before its answer (the caller gave up): the endpoint forgets the request.
        struct Cancel<'a>(&'a Cm, Option<ConnId>);
        impl Drop for Cancel<'_> {
            fn drop(&mut self) {
                if let Some(id) = self.1.take() {
                    self.0.send(Command::SidrCancel { id });
                }
            }
        }
        let mut guard = Cancel(self, Some(id));
        let r = rx.await;
        guard.1 = None;
        r.map_err(|_| CmError::DriverGone)?
    }

    /// Counters of the endpoint ([`CmStats::endpoint`]), of the transport (its drops: bad
    /// ICRC, not a MAD, …) and of the driver: every dropped MAD by reason
    /// ([`CmStats::dropped`]); [`CmStats::to_json`] formats them as one JSON line.
    ///
    /// # Errors
    /// [`CmError::DriverGone`].
    pub async fn stats(&self) -> Result<CmStats, CmError> {
        self.call(|reply| Command::Stats { reply }).await
    }

    /// A random 24-bit start PSN from the endpoint's RNG ([`Endpoint::random_psn`]: seeded
    /// from the OS unless [`EndpointConfig::rng_seed`] is set), for
    /// [`AcceptParams::starting_psn`] (its constructor leaves it at 0) when the application
    /// has no PSN of its own to program into its QP. [`ConnectParams::starting_psn`] needs
    /// none: left `None`, the endpoint draws one itself
    /// ([`PendingConnection::req`](super::PendingConnection::req) tells which). The runtime
    /// never changes a PSN the application passes.
    ///
    /// # Errors
    /// [`CmError::DriverGone`].
    pub async fn random_psn(&self) -> Result<ibcm_mad::Psn, CmError> {
        self.call(|reply| Command::RandomPsn { reply }).await
    }

    /// Connections in the endpoint's table (all states, TimeWait included).
    ///
    /// # Errors
    /// [`CmError::DriverGone`].
    pub async fn connection_count(&self) -> Result<usize, CmError> {
        self.call(|reply| Command::Len { reply }).await
    }

    /// Stops the endpoint, after ending every connection the way
    /// [`Connection::disconnect`] does: a DREQ for each established one, a REJ for each one
    /// still being set up. The driver keeps answering and retransmitting until every DREQ
    /// has its DREP, or for [`SHUTDOWN_LINGER`] (2 s) at most; then its task ends (await the
    /// [`JoinHandle`] [`Cm::bind`] returned to know when). Dropping the last handle of a
    /// `Cm` (every `Cm`, [`Connection`] and [`Listener`]) does the same. Calls made after
    /// this wait until the task has ended and get [`CmError::DriverGone`]. The DREQs need
    /// the tokio runtime: a runtime shut down first (say, `main` returning right after)
    /// cancels the task before they go out, so await the `JoinHandle` before leaving.
    pub fn shutdown(&self) {
        self.shutdown_with_linger(SHUTDOWN_LINGER);
    }

    /// [`Cm::shutdown`], waiting up to `linger` for the DREPs (`Duration::ZERO`: send the
    /// DREQs and REJs once and stop).
    pub fn shutdown_with_linger(&self, linger: Duration) {
        let _ = self.shared.tx.send(Command::Shutdown { linger });
    }

    pub(crate) fn send(&self, cmd: Command) {
        let _ = self.shared.tx.send(cmd);
    }
}

/// Whether a connection closed with `e` counts as established by
/// [`Connection::established`]: a disconnect after the status was `Established`, or a DREQ
/// from the peer (which a peer sends only once established; the core ends REP_SENT and
/// MRA_REP_RCVD with it, docs/protocol.md §3.2). Not every `Disconnected` follows
/// `Established`: [`Cm::end_stale`]'s connections end with one and never were.
fn was_established(slot: &SlotRef, e: &ConnectionError) -> bool {
    match e {
        ConnectionError::Disconnected { by_peer: true, .. } => true,
        ConnectionError::Disconnected { .. } | ConnectionError::DisconnectTimedOut => {
            slot.was_established()
        }
        _ => false,
    }
}

/// A connection (either side).
#[derive(Debug, Clone)]
pub struct Connection {
    // Two pointers: an application may hold a million of these. The ID is in the slot.
    pub(super) cm: Cm,
    pub(super) slot: SlotRef,
}

impl Connection {
    /// The local communication ID.
    pub fn id(&self) -> ConnId {
        self.slot.id()
    }

    /// The REP this (active) connection received: the peer's QPN, starting PSN and private
    /// data, and for XRC the TGT QPN from the EECN field. `None` before the REP, on the
    /// passive side, and once the connection has left the table.
    pub fn rep(&self) -> Option<crate::proto::RepInfo> {
        self.slot.rep()
    }

    /// The private data of the RTU this (passive) connection received, trailing zeros
    /// trimmed: what the active side passed to
    /// [`PendingConnection::establish`](crate::rt::PendingConnection::establish) (or
    /// [`Cm::connect`]'s RTU, which has none). Set before [`Connection::status`] turns
    /// [`ConnStatus::Established`]. Empty when the RTU had none (all zeros), when COMM_EST
    /// established the connection instead, on the active side (whose peer's private data
    /// is in its [`Connection::rep`]), and once the connection has left the table.
    pub fn rtu_private_data(&self) -> Vec<u8> {
        self.slot.rtu_private_data()
    }

    /// The current status.
    pub fn status(&self) -> ConnStatus {
        self.slot.status()
    }

    /// Waits until the connection is established. Returns `Ok` also when it was established
    /// and has been disconnected since (`Disconnected` or `DisconnectTimedOut` after the
    /// status was [`ConnStatus::Established`], or a DREQ from the peer, which it sends only once
    /// established: one that overtook our lost RTU ends a passive connection in REP_SENT,
    /// docs/protocol.md §3.2). A connection that ends otherwise without having been established
    /// (say one of [`Cm::end_stale`], whose DREQ is answered or times out) gets its error.
    ///
    /// On the passive side this is the RTU's arrival (or a DREQ that overtook a lost RTU): the
    /// point at which the kernel's users move their QP from RTR to RTS. On the active side it
    /// is the RTU going out ([`Cm::connect`]: on the REP; [`Cm::connect_manual`]: on
    /// [`PendingConnection::establish`](crate::rt::PendingConnection::establish)).
    ///
    /// # Errors
    /// The [`ConnectionError`] if it fails (or has failed) instead.
    pub async fn established(&self) -> Result<(), ConnectionError> {
        let slot = &self.slot;
        slot.wait(|st| match st {
            ConnStatus::Established => Some(Ok(())),
            ConnStatus::Closed(e) | ConnStatus::Gone(e) => Some(if was_established(slot, e) {
                Ok(())
            } else {
                Err(e.clone())
            }),
            ConnStatus::Connecting => None,
        })
        .await
    }

    /// Waits until the connection is closed, and says why.
    pub async fn closed(&self) -> ConnectionError {
        self.slot
            .wait(|st| match st {
                ConnStatus::Closed(e) | ConnStatus::Gone(e) => Some(e.clone()),
                _ => None,
            })
            .await
    }

    /// Disconnects (DREQ when established; REJ during setup) and waits until the connection
    /// is closed. Returns why it closed (normally `Disconnected { by_peer: false }`).
    pub async fn disconnect(&self, private_data: &[u8]) -> ConnectionError {
        let (reply, rx) = oneshot::channel();
        self.cm.send(Command::Disconnect {
            conn: self.id(),
            private_data: private_data.to_vec(),
            reply,
        });
        if let Ok(Err(e)) = rx.await {
            warn!(conn = %self.id(), error = %e, "disconnect refused");
        }
        self.closed().await
    }

    /// Waits until the connection has also left TimeWait (its QPN may be reused).
    pub async fn gone(&self) {
        self.slot
            .wait(|st| matches!(st, ConnStatus::Gone(_)).then_some(()))
            .await;
    }
}

/// A request that must be answered: [`accept`](Incoming::accept),
/// [`reject`](Incoming::reject) or (for a REQ) [`mra`](Incoming::mra). Dropping it unanswered
/// rejects it (REJ 28 / SIDR status 2) and logs a warning (rate-limited).
#[derive(Debug)]
pub struct Incoming {
    id: ConnId,
    cm: Cm,
    kind: IncomingKind,
    answered: bool,
}

impl Incoming {
    pub(super) fn new(id: ConnId, cm: Cm, kind: IncomingKind) -> Self {
        Incoming {
            id,
            cm,
            kind,
            answered: false,
        }
    }

    /// What arrived.
    pub fn kind(&self) -> &IncomingKind {
        &self.kind
    }

    /// The REQ, if this is a connection request.
    pub fn request(&self) -> Option<&ReqInfo> {
        match &self.kind {
            IncomingKind::Connect(r) => Some(r),
            IncomingKind::Sidr(_) => None,
        }
    }

    /// Where it came from.
    pub fn peer(&self) -> PeerAddr {
        match &self.kind {
            IncomingKind::Connect(r) => r.peer,
            IncomingKind::Sidr(s) => s.peer,
        }
    }

    /// Accepts a REQ (sends the REP) and returns the connection, still waiting for the RTU.
    ///
    /// The kernel's order: the REP tells the peer to bring its QP up and send, so move the
    /// local QP to RTR (its attributes: [`crate::qp_attr::qp_attr`] from
    /// [`Incoming::request`]'s REQ and the REP these `params` make) *before* calling this.
    /// Then move it to RTS when the RTU arrives: [`Connection::established`] resolves (and
    /// [`Connection::status`] turns [`ConnStatus::Established`]) on the RTU (or, when the RTU
    /// was lost and the peer is already disconnecting, on its DREQ), not on this call.
    ///
    /// # Errors
    /// [`CmError::Call`] if the REQ is gone (the peer gave up) or the parameters are refused
    /// (say, a QPN in TimeWait quarantine). A refused accept does not leave the peer waiting:
    /// the request is then rejected (REJ 28, consumer reject), as when an `Incoming` is dropped
    /// unanswered.
    pub async fn accept(mut self, params: AcceptParams) -> Result<Connection, CmError> {
        let id = self.id;
        // Queued, the accept is the answer, even if this future is dropped before it
        // resolves (no REJ from the drop guard after it); on an error the driver rejects.
        let rx = self.cm.queue(|reply| Command::Accept {
            conn: id,
            params,
            reply,
        })?;
        self.answered = true;
        let slot = rx.await.map_err(|_| CmError::DriverGone)??;
        Ok(Connection {
            cm: self.cm.clone(),
            slot,
        })
    }

    /// Rejects a REQ with `reason`, ARI and private data.
    ///
    /// # Errors
    /// [`CmError::Call`] if the REQ is gone or the data does not fit. When the data does not
    /// fit, the request is still rejected, with reason 28 (consumer reject) and no data.
    pub async fn reject(
        mut self,
        reason: RejReason,
        ari: &[u8],
        private_data: &[u8],
    ) -> Result<(), CmError> {
        let id = self.id;
        let (ari, private_data) = (ari.to_vec(), private_data.to_vec());
        let rx = self.cm.queue(|reply| Command::Reject {
            conn: id,
            reason,
            ari,
            private_data,
            reply,
        })?;
        self.answered = true;
        rx.await.map_err(|_| CmError::DriverGone)??;
        Ok(())
    }

    /// Sends an MRA: the answer will take up to `service_timeout`. The request stays to be
    /// answered.
    ///
    /// # Errors
    /// [`CmError::Call`] if the REQ is gone.
    pub async fn mra(&self, service_timeout: TimeoutExp) -> Result<(), CmError> {
        let id = self.id;
        self.cm
            .call(|reply| Command::Mra {
                conn: id,
                service_timeout,
                reply,
            })
            .await??;
        Ok(())
    }

    /// Answers a SIDR_REQ.
    ///
    /// # Errors
    /// [`CmError::Call`] if this is not a SIDR request or the data does not fit. When the
    /// reply is refused, the requester still gets an answer: a SIDR_REP with status
    /// "rejected".
    pub async fn sidr_reply(mut self, params: SidrRepParams) -> Result<(), CmError> {
        let id = self.id;
        let rx = self
            .cm
            .queue(|reply| Command::SidrReply { id, params, reply })?;
        self.answered = true;
        rx.await.map_err(|_| CmError::DriverGone)??;
        Ok(())
    }
}

impl Drop for Incoming {
    fn drop(&mut self) {
        if self.answered {
            return;
        }
        // The driver rejects it and logs that (rate-limited: peers decide how many arrive).
        self.cm.send(Command::Unanswered {
            id: self.id,
            sidr: matches!(self.kind, IncomingKind::Sidr(_)),
        });
    }
}

/// The stream of requests for one service ID. Dropping it stops listening (if it is still
/// the service ID's listener).
#[derive(Debug)]
pub struct Listener {
    pub(super) rx: mpsc::UnboundedReceiver<(ConnId, IncomingKind)>,
    pub(super) cm: Cm,
    pub(super) service_id: ServiceId,
    /// Names this listener's registration in the driver.
    pub(super) token: u64,
    /// The connections established statelessly ([`Cm::listen_stateless`]).
    pub(super) stateless: Option<mpsc::UnboundedReceiver<(ConnId, Box<StatelessInfo>)>>,
}

impl Listener {
    /// The next request; `None` when the endpoint stopped. Requests that are gone already
    /// (the peer gave up, or the endpoint evicted them under pressure) are skipped.
    pub async fn next(&mut self) -> Option<Incoming> {
        loop {
            let (id, kind) = self.rx.recv().await?;
            if matches!(kind, IncomingKind::Connect(_)) && !self.cm.shared.registry.contains(id) {
                continue;
            }
            return Some(Incoming::new(id, self.cm.clone(), kind));
        }
    }

    /// The service ID listened on.
    pub fn service_id(&self) -> ServiceId {
        self.service_id
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.cm.send(Command::Unlisten {
            service_id: self.service_id,
            token: self.token,
        });
    }
}

impl Cm {
    /// Ends a connection of an earlier life of this node at its peer (a killed daemon's, read
    /// from its journal): [`Endpoint::end_stale`](crate::proto::Endpoint::end_stale) sends its
    /// DREQ and retransmits it until the DREP or the last retry. The returned handle's
    /// [`Connection::closed`] says which (`Disconnected { by_peer: false }`, or
    /// `DisconnectTimedOut`).
    ///
    /// # Errors
    /// [`CmError::Call`] if the comm ID is in use here or the private data is too long;
    /// [`CmError::DriverGone`].
    pub async fn end_stale(
        &self,
        stale: crate::proto::StaleConnection,
    ) -> Result<Connection, CmError> {
        let slot = self
            .call(|reply| Command::EndStale { stale, reply })
            .await??;
        Ok(Connection {
            cm: self.clone(),
            slot,
        })
    }

    /// A handle to an existing connection by ID (e.g. one accepted elsewhere).
    pub fn connection(&self, id: ConnId) -> Option<Connection> {
        self.slot(id).map(|slot| Connection {
            cm: self.clone(),
            slot,
        })
    }
}
