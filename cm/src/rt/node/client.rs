//! The client side: [`Cm::attach`] and [`attach`] give a [`Cm`] whose commands a task forwards
//! to the node service over its Unix socket, and whose connection slots and listeners that
//! task feeds from the service's messages. The handles ([`Connection`](crate::rt::Connection),
//! [`Listener`](crate::rt::Listener), [`Incoming`](crate::rt::Incoming),
//! [`PendingConnection`](crate::rt::PendingConnection)) are the in-process ones, unchanged.
//!
//! This task *forwards* each [`Command`] as an [`Op`]; the daemon turns it back into the same
//! `Command` for its own driver (`rt/driver/commands.rs`), which *executes* it. So the rules
//! live once, in the daemon's driver: one listener per service ID and its tokens, REJ 28 for a
//! refused accept or reject, the SIDR "rejected" answer, `PendingDropped`'s REJ 4 / 28. What
//! is here and only here is what forwarding needs: a listener's channel registered before the
//! daemon's answer (a REQ may follow right behind it) and removed if it refuses, a second
//! listen on a service ID refused at once ([`CmError::AlreadyListening`], as in-process), the
//! wire encoding checked before sending (a refusal is [`CmError::Refused`]), SIDR requests
//! known by this session's sequence numbers (no cancel: the daemon frees them with the
//! session), and the daemon's node-wide counters for `Stats`. The slots are opened,
//! established and closed by the registry's helpers that the driver uses too.

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::Arc;

use ibcm_mad::{Psn, ServiceId};

use crate::rt::CmError;
use tokio::net::unix::OwnedWriteHalf;
use tokio::net::UnixStream;
use tokio::sync::{mpsc, oneshot, Mutex};
use tokio::task::JoinHandle;
use tracing::warn;

use super::proto::{
    encode_frame, read_frame, write_frame, ClientMsg, DaemonMsg, Op, WireAccept, WireConnect,
    WireResult, WireStateless, WireStatus, VERSION,
};
use crate::proto::{CallError, ConnId};
use crate::rt::command::{Command, Reply};
use crate::rt::handle::Cm;
use crate::rt::slot::{Registry, SlotRef};
use crate::rt::types::{ConnStatus, IncomingKind};

/// Why a node-service request failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NodeError {
    /// The service refused it (ownership, quota, unknown policy, …).
    #[error("refused by the node service: {0}")]
    Refused(String),
    /// The connection to the service is gone.
    #[error("the node service connection is closed")]
    Gone,
}

/// The node-service operations that have no in-process counterpart on [`Cm`] (XRC target
/// services hosted by the daemon), and the daemon's reports about them.
#[derive(Debug, Clone)]
pub struct Node {
    tx: mpsc::UnboundedSender<(Op, oneshot::Sender<WireResult>)>,
    events: Arc<Mutex<mpsc::UnboundedReceiver<String>>>,
    keeper_events: Arc<Mutex<mpsc::UnboundedReceiver<serde_json::Value>>>,
    /// The daemon's CM address, as its hello reply gave it.
    daemon_addr: Option<std::net::IpAddr>,
    /// The LAP exchanges of a session the daemon serves at once (its hello's `apm`; 0: it
    /// does not serve path migration).
    apm: u32,
}

impl Node {
    /// The IP address of the daemon's CM (`ibcmd --addr`), as the daemon told it at hello:
    /// a peer of the other address family cannot be reached through it (libibcm's
    /// `ibcm_connect` refuses one at once). `None` when the daemon did not say (one that
    /// predates the `hello` answer, or a server not told its address).
    pub fn daemon_addr(&self) -> Option<std::net::IpAddr> {
        self.daemon_addr
    }

    /// Whether the daemon serves path migration to this client (its hello said so): LAPs
    /// sent and answered through it ([`Connection::load_alt_path`](crate::rt::Connection::load_alt_path),
    /// [`Cm::set_lap_policy`], [`Connection::notify_path_migrated`](crate::rt::Connection::notify_path_migrated))
    /// and alternate paths ([`Cm::resolve_path_with_alternate`]). `false` for an `ibcmd`
    /// that predates it (those calls fail at once, nothing is sent).
    pub fn serves_path_migration(&self) -> bool {
        self.apm > 0
    }

    /// Sends `op`; its answer, `pick`ed (`None`: an answer of another kind). A refusal is
    /// [`NodeError::Refused`] with the daemon's reason.
    async fn ask<T>(
        &self,
        op: Op,
        pick: impl FnOnce(WireResult) -> Result<T, WireResult>,
    ) -> Result<T, NodeError> {
        let (tx, rx) = oneshot::channel();
        self.tx.send((op, tx)).map_err(|_| NodeError::Gone)?;
        match pick(rx.await.map_err(|_| NodeError::Gone)?) {
            Ok(v) => Ok(v),
            Err(WireResult::Refused { why }) => Err(NodeError::Refused(why)),
            Err(other) => Err(NodeError::Refused(format!("unexpected answer {other:?}"))),
        }
    }

    async fn call(&self, op: Op) -> Result<(), NodeError> {
        self.ask(op, |r| match r {
            WireResult::Ok => Ok(()),
            other => Err(other),
        })
        .await
    }

    /// Has the daemon answer the XRC REQs for `service_id` as an XRC target owned by this
    /// client: TGT QPs it creates get `policy` (`explicit`, `domain`, `process`, `shared`)
    /// and this client as their creating process, the REPs announce `srqns`. When this client
    /// goes (socket closed, process killed), the QPs end as their policy says.
    ///
    /// # Errors
    /// [`NodeError`].
    pub async fn xrc_listen(
        &self,
        service_id: ServiceId,
        policy: &str,
        srqns: &[u32],
    ) -> Result<(), NodeError> {
        self.xrc_listen_op(service_id, policy, srqns, None, None)
            .await
    }

    /// [`Node::xrc_listen`] from a keeper domain ([`Node::keeper`]: one this client opened,
    /// or was admitted to by the keeper's rules): QPs it creates are that domain's; with
    /// `tgt_qpn`, REQs in mode `any` are answered with that TGT QP (one the client may
    /// register on), which its connections do not hold (its registered processes do).
    ///
    /// # Errors
    /// [`NodeError`].
    pub async fn xrc_listen_in(
        &self,
        service_id: ServiceId,
        policy: &str,
        srqns: &[u32],
        domain: &str,
        tgt_qpn: Option<u32>,
    ) -> Result<(), NodeError> {
        self.xrc_listen_op(service_id, policy, srqns, Some(domain), tgt_qpn)
            .await
    }

    async fn xrc_listen_op(
        &self,
        service_id: ServiceId,
        policy: &str,
        srqns: &[u32],
        domain: Option<&str>,
        tgt_qpn: Option<u32>,
    ) -> Result<(), NodeError> {
        self.call(Op::XrcListen {
            service_id: service_id.0,
            policy: policy.to_owned(),
            srqns: srqns.to_vec(),
            domain: domain.map(str::to_owned),
            tgt_qpn,
        })
        .await
    }

    /// One request of the XRC keeper's protocol served by the daemon ([`Op::Keeper`]; the
    /// request and the reply are the keeper's JSON objects, `ibcm_xrc::keeper::proto`).
    ///
    /// # Errors
    /// [`NodeError`]: the daemon refused it (a daemon without a keeper, a request too
    /// long); a refusal by the keeper's rules is a reply with `ok: false`.
    pub async fn keeper(&self, req: serde_json::Value) -> Result<serde_json::Value, NodeError> {
        self.ask(Op::Keeper { req }, |r| match r {
            WireResult::Keeper { reply } => Ok(reply),
            other => Err(other),
        })
        .await
    }

    /// The next event of the keeper's protocol for this client (a TGT QP gone, orphaned);
    /// `None` once the connection to the daemon is gone.
    pub async fn keeper_event(&self) -> Option<serde_json::Value> {
        self.keeper_events.lock().await.recv().await
    }

    /// Stops serving XRC REQs for `service_id`.
    ///
    /// # Errors
    /// [`NodeError`].
    pub async fn xrc_unlisten(&self, service_id: ServiceId) -> Result<(), NodeError> {
        self.call(Op::XrcUnlisten {
            service_id: service_id.0,
        })
        .await
    }

    /// Destroys every TGT QP this client owns, as their owner ([`Op::XrcDestroy`]); returns
    /// how many.
    ///
    /// # Errors
    /// [`NodeError`].
    pub async fn xrc_destroy(&self) -> Result<u64, NodeError> {
        self.ask(Op::XrcDestroy, |r| match r {
            WireResult::Value { value } => Ok(value),
            other => Err(other),
        })
        .await
    }

    /// The daemon's TGT QPs without a living owner (orphans) and those nobody uses (leaks),
    /// every user's ([`Op::XrcOrphans`]; what `ibcmd leaks` prints).
    ///
    /// # Errors
    /// [`NodeError`].
    pub async fn xrc_orphans(&self) -> Result<Vec<super::proto::WireTgtQp>, NodeError> {
        self.ask(Op::XrcOrphans, |r| match r {
            WireResult::XrcQps { qps } => Ok(qps),
            other => Err(other),
        })
        .await
    }

    /// Destroys orphaned TGT QPs of this client's user (root: of any user), all of them or
    /// `qpn` ([`Op::XrcReclaim`]); returns how many.
    ///
    /// # Errors
    /// [`NodeError`]; `Refused` for a `qpn` that is not such an orphan.
    pub async fn xrc_reclaim(&self, qpn: Option<u32>) -> Result<u64, NodeError> {
        self.ask(Op::XrcReclaim { qpn }, |r| match r {
            WireResult::Value { value } => Ok(value),
            other => Err(other),
        })
        .await
    }

    /// The next line the daemon reported about this client's XRC services (a REQ accepted, a
    /// connection closed, a teardown…); `None` once the connection to the daemon is gone.
    pub async fn xrc_event(&self) -> Option<String> {
        self.events.lock().await.recv().await
    }
}

/// What [`attach`] returns.
#[derive(Debug)]
pub struct Attached {
    /// The CM handle, as [`Cm::bind`] gives.
    pub cm: Cm,
    /// The node-service operations.
    pub node: Node,
    /// The task that talks to the daemon; it ends when every handle is gone, on
    /// [`Cm::shutdown`], or when the daemon closes the socket (then with an error).
    pub task: JoinHandle<io::Result<()>>,
    /// The descriptor of the socket to the daemon (owned by the task; for a `fork()` child
    /// handler that closes the child's copy, so that the session ends with the parent).
    pub socket_fd: RawFd,
}

impl Cm {
    /// Attaches to the node's CM service (`ibcmd`) on the Unix socket at `path`, instead of
    /// running an endpoint in this process: the returned handle works as one from
    /// [`Cm::bind`] (connect, listen, accept, reject, disconnect, connect_manual…), with the
    /// daemon's endpoint behind it. Dropping every handle, or this process dying, closes the
    /// socket; the daemon then disconnects this client's connections, rejects its pending
    /// requests and drops its listeners.
    ///
    /// [`Cm::sidr`] is sent by the daemon's endpoint, a SIDR_REQ for one of this client's
    /// services reaches its [`Listener`](crate::rt::Listener), and [`Cm::stats`] gives the
    /// daemon endpoint's counters (node-wide), [`Cm::resolve_path`] is asked of the
    /// daemon's SA client (`ibcmd --umad DEV` on an InfiniBand port). Path migration is
    /// served by an `ibcmd` that says so ([`Node::serves_path_migration`]): this client's
    /// LAPs go out through the daemon's endpoint, and with [`Cm::set_lap_policy`] the LAPs
    /// of its connections come to it (the other clients' policies are their own). Not
    /// served through a daemon:
    /// [`Cm::with_app`] (the app runs in the daemon) fails with
    /// [`CmError::Refused`]. [`Cm::connection_count`]
    /// counts this client's connections.
    ///
    /// # Errors
    /// The socket cannot be reached, the daemon runs as another user than this process's
    /// (and not as root), or it refuses the protocol version.
    pub async fn attach(path: impl AsRef<Path>) -> io::Result<(Cm, JoinHandle<io::Result<()>>)> {
        let a = attach(path).await?;
        Ok((a.cm, a.task))
    }
}

/// [`Cm::attach`], also returning the [`Node`] operations.
///
/// # Errors
/// As [`Cm::attach`].
pub async fn attach(path: impl AsRef<Path>) -> io::Result<Attached> {
    let stream = UnixStream::connect(path.as_ref()).await?;
    // The daemon must be root or this user: a socket in a shared directory could be anyone's.
    let cred = stream.peer_cred()?;
    let me = std::fs::metadata("/proc/self")?.uid();
    if cred.uid() != 0 && cred.uid() != me {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "{} is served by uid {}, neither root nor this user ({me})",
                path.as_ref().display(),
                cred.uid()
            ),
        ));
    }
    let socket_fd = stream.as_raw_fd();
    let (mut rd, mut wr) = stream.into_split();
    let hello = encode_frame(&ClientMsg {
        seq: 0,
        op: Op::Hello {
            version: VERSION,
            addr: true,
        },
    })
    .map_err(io::Error::other)?;
    // A daemon that refuses this client at once says why and closes: the hello may find the
    // socket closed, the refusal is read all the same.
    let sent = write_frame(&mut wr, &hello).await;
    // A daemon that predates the `hello` answer says `ok`, without its address; one that
    // predates path queries does not say `paths` (how many it serves at once), one that
    // predates path migration does not say `apm`.
    let (daemon_addr, paths, apm) = match read_frame::<DaemonMsg, _>(&mut rd).await {
        Ok(DaemonMsg::Reply {
            result: WireResult::Ok,
            ..
        }) => {
            sent?;
            (None, 0, 0)
        }
        Ok(DaemonMsg::Reply {
            result: WireResult::Hello { addr, paths, apm },
            ..
        }) => {
            sent?;
            (addr, paths, apm)
        }
        Ok(other) => {
            return Err(io::Error::new(
                io::ErrorKind::ConnectionRefused,
                format!("the node service refused this client: {other:?}"),
            ))
        }
        Err(e) => return Err(sent.err().unwrap_or_else(|| io::Error::other(e))),
    };
    let (tx, rx) = mpsc::unbounded_channel();
    let registry = Registry::default();
    let (node_tx, node_rx) = mpsc::unbounded_channel();
    let node_paths = super::paths::NodePaths::new(node_tx.clone(), paths, apm > 0);
    let cm = Cm::from_channel(tx, registry.clone(), node_paths);
    let (ev_tx, ev_rx) = mpsc::unbounded_channel();
    let (kev_tx, kev_rx) = mpsc::unbounded_channel();
    // Reading frames is not cancel-safe: one task reads, the client task selects on it.
    let (msg_tx, msg_rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        loop {
            match read_frame::<DaemonMsg, _>(&mut rd).await {
                Ok(m) => {
                    if msg_tx.send(Ok(m)).is_err() {
                        return;
                    }
                }
                Err(e) => {
                    let _ = msg_tx.send(Err(e));
                    return;
                }
            }
        }
    });
    let client = Client {
        wr,
        registry,
        seq: 1,
        waiters: HashMap::new(),
        listeners: HashMap::new(),
        stateless: HashMap::new(),
        events: ev_tx,
        keeper_events: kev_tx,
        unsupported_logged: false,
        laps: super::lap::ClientLaps::default(),
        unanswered_laps: crate::log_limit::LogLimit::default(),
    };
    let task = tokio::spawn(client.run(rx, node_rx, msg_rx));
    Ok(Attached {
        cm,
        node: Node {
            tx: node_tx,
            events: Arc::new(Mutex::new(ev_rx)),
            keeper_events: Arc::new(Mutex::new(kev_rx)),
            daemon_addr,
            apm,
        },
        task,
        socket_fd,
    })
}

/// Who waits for the reply to a request.
enum Waiter {
    Connect(
        Reply<Result<super::super::command::Connected, CmError>>,
        Box<ibcm_mad::Req>,
    ),
    Listen(u64, Reply<Result<u64, CmError>>),
    Accept(ConnId, Reply<Result<SlotRef, CallError>>),
    Call(ConnId, Reply<Result<(), CallError>>),
    Psn(Reply<Psn>),
    Sidr(oneshot::Sender<Result<crate::rt::types::SidrAnswer, CmError>>),
    SidrReply(ConnId, Reply<Result<(), CallError>>),
    Stats(Reply<crate::rt::CmStats>),
    Len(Reply<usize>),
    Node(oneshot::Sender<WireResult>),
    /// `load_alt_path`: the APR (or the LAP's timeout).
    Lap(Reply<Result<crate::rt::AprAnswer, CmError>>),
    /// A request whose caller waits for it to be done (`set_lap_policy`).
    Done(Reply<()>),
}

type Listeners = HashMap<u64, mpsc::UnboundedSender<(ConnId, IncomingKind)>>;

struct Client {
    wr: OwnedWriteHalf,
    registry: Registry,
    seq: u64,
    waiters: HashMap<u64, Waiter>,
    listeners: Listeners,
    /// The stateless listeners' channels of established connections.
    stateless: StatelessListeners,
    events: mpsc::UnboundedSender<String>,
    keeper_events: mpsc::UnboundedSender<serde_json::Value>,
    unsupported_logged: bool,
    /// The LAPs the daemon delivered, for `next_lap`.
    laps: super::lap::ClientLaps,
    /// The rate limit of the warnings about `LapRequest`s dropped unanswered.
    unanswered_laps: crate::log_limit::LogLimit,
}

type StatelessListeners =
    HashMap<u64, mpsc::UnboundedSender<(ConnId, Box<crate::proto::StatelessInfo>)>>;

type MsgRx = mpsc::UnboundedReceiver<Result<DaemonMsg, super::proto::FrameError>>;

impl Client {
    async fn run(
        mut self,
        mut rx: mpsc::UnboundedReceiver<Command>,
        mut node_rx: mpsc::UnboundedReceiver<(Op, oneshot::Sender<WireResult>)>,
        mut msgs: MsgRx,
    ) -> io::Result<()> {
        let mut node_open = true;
        let r = loop {
            tokio::select! {
                cmd = rx.recv() => match cmd {
                    None | Some(Command::Shutdown { .. }) => break Ok(()),
                    Some(cmd) => if let Err(e) = self.on_command(cmd).await { break Err(e) },
                },
                op = node_rx.recv(), if node_open => match op {
                    Some((op, reply)) => {
                        if let Err(e) = self.request(op, Some(Waiter::Node(reply))).await {
                            break Err(e);
                        }
                    }
                    // Every `Node` handle dropped: only the `Cm` handles remain.
                    None => node_open = false,
                },
                m = msgs.recv() => match m {
                    Some(Ok(m)) => if let Err(e) = self.on_message(m).await { break Err(e) },
                    Some(Err(e)) => break Err(io::Error::other(e)),
                    None => break Err(io::ErrorKind::UnexpectedEof.into()),
                },
            }
        };
        if let Err(e) = &r {
            warn!(error = %e, "node service connection lost: its connections are gone");
        }
        // Nothing will update the slots any more: wake every waiter with an end.
        for slot in self.registry.drain() {
            slot.update(ConnStatus::gone);
        }
        r
    }

    async fn request(&mut self, op: Op, waiter: Option<Waiter>) -> io::Result<()> {
        let seq = self.seq;
        self.seq = self.seq.wrapping_add(1);
        let frame = encode_frame(&ClientMsg { seq, op }).map_err(io::Error::other)?;
        if let Some(w) = waiter {
            self.waiters.insert(seq, w);
        }
        write_frame(&mut self.wr, &frame).await
    }

    async fn on_command(&mut self, cmd: Command) -> io::Result<()> {
        match cmd {
            Command::Connect { params, reply } => {
                let wire = WireConnect::from_params(&params).and_then(|params| {
                    let sent = super::wire::parse_req(&params.req)?;
                    Ok((params, Box::new(sent)))
                });
                match wire {
                    Ok((params, sent)) => {
                        let w = Waiter::Connect(reply, sent);
                        self.request(Op::Connect { params }, Some(w)).await
                    }
                    Err(e) => {
                        let why =
                            format!("connect parameters cannot be sent to the node service: {e}");
                        let _ = reply.send(Err(CmError::Refused(why)));
                        Ok(())
                    }
                }
            }
            Command::Listen {
                service_id,
                options,
                tx,
                reply,
            } => {
                // As in-process: a second listen on the service ID is refused here, leaving
                // the first listener (its channel and the daemon's listen) as it was.
                if self.listeners.contains_key(&service_id.0) {
                    let _ = reply.send(Err(CmError::AlreadyListening(service_id)));
                    return Ok(());
                }
                self.listeners.insert(service_id.0, tx);
                let transports = options.transports.iter().map(|t| transport_code(*t));
                let op = Op::Listen {
                    service_id: service_id.0,
                    transports: transports.collect(),
                };
                self.request(op, Some(Waiter::Listen(service_id.0, reply)))
                    .await
            }
            Command::Unlisten { service_id, .. } => {
                self.listeners.remove(&service_id.0);
                self.stateless.remove(&service_id.0);
                let op = Op::Unlisten {
                    service_id: service_id.0,
                };
                self.request(op, None).await
            }
            Command::Accept {
                conn,
                params,
                reply,
            } => {
                let op = Op::Accept {
                    conn: conn.0,
                    params: WireAccept::from_params(&params),
                };
                self.request(op, Some(Waiter::Accept(conn, reply))).await
            }
            Command::Reject {
                conn,
                reason,
                ari,
                private_data,
                reply,
            } => {
                let op = Op::Reject {
                    conn: conn.0,
                    reason: reason.raw(),
                    ari,
                    private_data,
                };
                self.request(op, Some(Waiter::Call(conn, reply))).await
            }
            Command::Establish {
                conn,
                private_data,
                reply,
            } => {
                let op = Op::Establish {
                    conn: conn.0,
                    private_data,
                };
                self.request(op, Some(Waiter::Call(conn, reply))).await
            }
            Command::Mra {
                conn,
                service_timeout,
                reply,
            } => {
                let op = Op::Mra {
                    conn: conn.0,
                    service_timeout: service_timeout.get(),
                };
                self.request(op, Some(Waiter::Call(conn, reply))).await
            }
            Command::Disconnect {
                conn,
                private_data,
                reply,
            } => {
                let op = Op::Disconnect {
                    conn: conn.0,
                    private_data,
                };
                self.request(op, Some(Waiter::Call(conn, reply))).await
            }
            Command::Unanswered { id, .. } => {
                self.request(Op::Unanswered { conn: id.0 }, None).await
            }
            Command::PendingDropped { id } => {
                self.request(Op::PendingDropped { conn: id.0 }, None).await
            }
            Command::RandomPsn { reply } => {
                self.request(Op::RandomPsn, Some(Waiter::Psn(reply))).await
            }
            Command::Len { reply } => self.request(Op::Len, Some(Waiter::Len(reply))).await,
            Command::ListenStateless {
                service_id,
                options,
                template,
                tx,
                stateless,
                reply,
            } => {
                if self.listeners.contains_key(&service_id.0) {
                    let _ = reply.send(Err(CmError::AlreadyListening(service_id)));
                    return Ok(());
                }
                self.listeners.insert(service_id.0, tx);
                self.stateless.insert(service_id.0, stateless);
                let transports = options.transports.iter().map(|t| transport_code(*t));
                let op = Op::ListenStateless {
                    service_id: service_id.0,
                    transports: transports.collect(),
                    template: WireStateless::from_template(&template),
                };
                self.request(op, Some(Waiter::Listen(service_id.0, reply)))
                    .await
            }
            Command::Sidr { params, reply } => {
                // The answer comes later, in its own reply; the caller waits on `rx`.
                let (tx, rx) = oneshot::channel();
                // The daemon knows the request by this client's `seq`; a cancel is not sent
                // (the daemon frees the session's requests when it ends).
                let _ = reply.send(Ok((ibcm_mad::CommId(0), rx)));
                let op = super::sidr::sidr_op(&params);
                self.request(op, Some(Waiter::Sidr(tx))).await
            }
            Command::SidrCancel { .. } => Ok(()),
            Command::SidrReply { id, params, reply } => {
                let op = Op::SidrReply {
                    conn: id.0,
                    rep: super::proto::WireSidrRep::from_params(&params),
                };
                self.request(op, Some(Waiter::SidrReply(id, reply))).await
            }
            Command::Stats { reply } => self.request(Op::Stats, Some(Waiter::Stats(reply))).await,
            Command::WithApp(_) => {
                // `Cm::with_app` refuses before it gets here; should one arrive anyway, the
                // reply is dropped and the caller gets `CmError::DriverGone`.
                if !self.unsupported_logged {
                    self.unsupported_logged = true;
                    warn!("with_app is not served through the node service (the app runs in the daemon)");
                }
                Ok(())
            }
            // The daemon ends its own earlier life's connections; a client has none. The
            // reply is dropped: the caller gets `CmError::DriverGone`.
            Command::EndStale { .. } | Command::Shutdown { .. } => Ok(()),
            // Path migration: a daemon that does not serve it gets none of these (the handles
            // refuse first, `CmError::Refused`).
            Command::LoadAltPath {
                conn,
                path,
                private_data,
                reply,
            } => match super::lap::load_alt_path_op(conn, &path, &private_data) {
                Ok(op) => self.request(op, Some(Waiter::Lap(reply))).await,
                Err(e) => {
                    let _ = reply.send(Err(e));
                    Ok(())
                }
            },
            Command::NextLap { conn, reply } => {
                let status = self.registry.get(conn).map(|s| s.status());
                self.laps.next(conn, reply, status);
                Ok(())
            }
            // A `next_lap` dropped after it was handed the LAP: held again if the client
            // still answers its LAPs, else answered as the daemon would.
            Command::LapRequeue { conn, lap } => {
                let live = self.registry.get(conn).is_some_and(|s| {
                    matches!(s.status(), ConnStatus::Connecting | ConnStatus::Established)
                });
                if self.laps.application && live {
                    self.laps.deliver(conn, lap);
                    return Ok(());
                }
                let op = super::lap::bare_apr(conn, ibcm_mad::AprStatus::Unsupported);
                self.request(op, None).await
            }
            Command::Apr {
                conn,
                status,
                additional_info,
                private_data,
                reply,
            } => {
                if let Some(e) = super::lap::apr_too_long(&additional_info, &private_data) {
                    // As in-process: the peer still gets an answer, "rejected".
                    let _ = reply.send(Err(e));
                    let op = super::lap::bare_apr(conn, ibcm_mad::AprStatus::Rejected);
                    return self.request(op, None).await;
                }
                let op = Op::Apr {
                    conn: conn.0,
                    apr: super::lap::WireApr {
                        status: status.raw(),
                        additional_info,
                        private_data,
                    },
                };
                self.request(op, Some(Waiter::Call(conn, reply))).await
            }
            Command::LapUnanswered { conn } => {
                if self.unanswered_laps.ok(crate::rt::now()) {
                    warn!(conn = %conn, "LAP request dropped unanswered: APR \"rejected\"");
                }
                let op = super::lap::bare_apr(conn, ibcm_mad::AprStatus::Rejected);
                self.request(op, None).await
            }
            Command::PathMigrated { conn, reply } => {
                let op = Op::PathMigrated { conn: conn.0 };
                self.request(op, Some(Waiter::Call(conn, reply))).await
            }
            Command::SetLapPolicy { policy, reply } => {
                let application = policy == crate::rt::LapPolicy::Application;
                if application {
                    self.laps.application = true;
                } else {
                    // The daemon answers the LAPs held "unsupported".
                    self.laps.stop();
                }
                let op = Op::LapPolicy { application };
                self.request(op, Some(Waiter::Done(reply))).await
            }
            // The daemon's own command (its sessions' connections): no handle sends it.
            Command::DelegateLaps { .. } => Ok(()),
        }
    }

    async fn on_message(&mut self, m: DaemonMsg) -> io::Result<()> {
        match m {
            DaemonMsg::Reply { seq, result } => {
                if let Some(w) = self.waiters.remove(&seq) {
                    self.complete(w, result);
                }
            }
            DaemonMsg::Incoming {
                service_id,
                conn,
                req,
            } => {
                let id = ibcm_mad::CommId(conn);
                let info = req.to_info();
                let delivered = match (info, self.listeners.get(&service_id)) {
                    (Ok(info), Some(tx)) => {
                        self.registry.open(id);
                        let ok = tx.send((id, IncomingKind::Connect(Box::new(info)))).is_ok();
                        if !ok {
                            self.registry.remove(id);
                        }
                        ok
                    }
                    _ => false,
                };
                if !delivered {
                    self.request(Op::Unanswered { conn }, None).await?;
                }
            }
            DaemonMsg::Stateless {
                service_id,
                conn,
                info,
            } => {
                let id = ibcm_mad::CommId(conn);
                let delivered = match (info.to_info(), self.stateless.get(&service_id)) {
                    (Ok(info), Some(tx)) => {
                        self.registry.open_established(id, &info.rtu_private_data);
                        let ok = tx.send((id, Box::new(info))).is_ok();
                        if !ok {
                            self.registry.remove(id);
                        }
                        ok
                    }
                    _ => false,
                };
                if !delivered {
                    let op = Op::Disconnect {
                        conn,
                        private_data: Vec::new(),
                    };
                    self.request(op, None).await?;
                }
            }
            DaemonMsg::IncomingSidr {
                service_id,
                conn,
                req,
            } => {
                let id = ibcm_mad::CommId(conn);
                let info = req.to_info(service_id);
                let delivered = self
                    .listeners
                    .get(&service_id)
                    .is_some_and(|tx| tx.send((id, IncomingKind::Sidr(Box::new(info)))).is_ok());
                if !delivered {
                    self.request(Op::Unanswered { conn }, None).await?;
                }
            }
            DaemonMsg::Rep { conn, rep } => {
                if let (Some(slot), Ok(rep)) =
                    (self.registry.get(ibcm_mad::CommId(conn)), rep.to_info())
                {
                    slot.set_rep(&rep);
                }
            }
            DaemonMsg::Status {
                conn,
                status,
                rtu_private_data,
            } => {
                let id = ibcm_mad::CommId(conn);
                if matches!(status, WireStatus::Gone(_) | WireStatus::Closed(_)) {
                    self.laps.closed(id, &status.to_status());
                }
                if matches!(status, WireStatus::Gone(_)) {
                    self.registry.close(id, |_| status.to_status());
                } else if let Some(slot) = self.registry.get(id) {
                    if !rtu_private_data.is_empty() {
                        // Before the status: a task woken by `Established` finds it.
                        slot.set_rtu_private_data(&rtu_private_data);
                    }
                    slot.set(status.to_status());
                }
            }
            DaemonMsg::XrcEvent { text, .. } => {
                let _ = self.events.send(text);
            }
            DaemonMsg::KeeperEvent { event } => {
                let _ = self.keeper_events.send(event);
            }
            DaemonMsg::Lap { conn, lap } => {
                let id = ibcm_mad::CommId(conn);
                let known = self.registry.get(id).is_some();
                match super::lap::parse_lap_body(&lap) {
                    Ok((path, private_data)) if self.laps.application && known => {
                        let lap = crate::rt::types::LapArrived { path, private_data };
                        self.laps.deliver(id, lap);
                    }
                    // Sent before the daemon heard this client stop answering (the daemon
                    // answers those itself), or for a connection it no longer has.
                    Ok(_) if !self.laps.application => {}
                    Ok(_) => {
                        let op = super::lap::bare_apr(id, ibcm_mad::AprStatus::Unsupported);
                        self.request(op, None).await?;
                    }
                    Err(e) => {
                        warn!(conn = %id, error = %e, "a malformed LAP from the node service: APR \"rejected\"");
                        let op = super::lap::bare_apr(id, ibcm_mad::AprStatus::Rejected);
                        self.request(op, None).await?;
                    }
                }
            }
        }
        Ok(())
    }

    fn complete(&mut self, w: Waiter, r: WireResult) {
        match w {
            Waiter::Connect(reply, sent) => {
                let r = match r {
                    WireResult::Conn { conn, req } => {
                        let id = ibcm_mad::CommId(conn);
                        let slot = self.registry.open(id);
                        // The REQ as the daemon sent it; an older daemon's reply has none.
                        let req = super::wire::parse_req(&req).map(Box::new).unwrap_or(sent);
                        Ok((id, slot, req))
                    }
                    WireResult::ConnectError(e) => Err(CmError::Connect(e.to_error())),
                    WireResult::Refused { why } => Err(CmError::Refused(why)),
                    other => Err(CmError::Refused(format!("unexpected answer {other:?}"))),
                };
                let _ = reply.send(r);
            }
            Waiter::Listen(sid, reply) => match r {
                WireResult::Ok => {
                    // One listener per service ID and session: the token is not needed.
                    let _ = reply.send(Ok(0));
                }
                other => {
                    warn!(service_id = %ServiceId(sid), answer = ?other, "listen refused by the node service");
                    self.listeners.remove(&sid);
                    self.stateless.remove(&sid);
                    let why = match other {
                        WireResult::Refused { why } => why,
                        other => format!("unexpected answer {other:?}"),
                    };
                    let _ = reply.send(Err(CmError::Refused(why)));
                }
            },
            Waiter::Accept(id, reply) => {
                let r = call_result(id, r).and_then(|()| {
                    self.registry
                        .get(id)
                        .ok_or(CallError::UnknownConnection(id))
                });
                let _ = reply.send(r);
            }
            Waiter::Call(id, reply) => {
                let _ = reply.send(call_result(id, r));
            }
            Waiter::Psn(reply) => {
                if let WireResult::Value { value } = r {
                    let _ = reply.send(Psn::masked(u32::try_from(value & 0xff_ffff).unwrap_or(0)));
                }
            }
            Waiter::Len(reply) => {
                if let WireResult::Value { value } = r {
                    let _ = reply.send(usize::try_from(value).unwrap_or(usize::MAX));
                }
            }
            Waiter::Sidr(tx) => {
                let r = match r {
                    WireResult::Sidr(a) => Ok(a.to_answer()),
                    WireResult::SidrTimedOut => Err(CmError::SidrTimedOut),
                    WireResult::ConnectError(e) => Err(CmError::Connect(e.to_error())),
                    WireResult::Refused { why } => Err(CmError::Refused(why)),
                    other => Err(CmError::Refused(format!("unexpected answer {other:?}"))),
                };
                let _ = tx.send(r);
            }
            Waiter::SidrReply(id, reply) => {
                let _ = reply.send(call_result(id, r));
            }
            Waiter::Stats(reply) => match r {
                WireResult::Stats(w) => {
                    let (stats, unknown) = w.to_stats();
                    if !unknown.is_empty() {
                        warn!(counters = ?unknown, "the node service reported counters this client does not know; left out");
                    }
                    let _ = reply.send(stats);
                }
                // The reply is dropped: the caller gets `CmError::DriverGone`.
                other => warn!(answer = ?other, "stats refused by the node service"),
            },
            Waiter::Node(reply) => {
                let _ = reply.send(r);
            }
            Waiter::Lap(reply) => {
                let _ = reply.send(super::lap::apr_result(r));
            }
            Waiter::Done(reply) => {
                if !matches!(r, WireResult::Ok) {
                    warn!(answer = ?r, "request refused by the node service");
                }
                let _ = reply.send(());
            }
        }
    }
}

fn call_result(id: ConnId, r: WireResult) -> Result<(), CallError> {
    match r {
        WireResult::Ok => Ok(()),
        WireResult::CallError(e) => Err(e.to_error()),
        other => {
            warn!(conn = %id, answer = ?other, "call refused by the node service");
            Err(CallError::UnknownConnection(id))
        }
    }
}

/// The wire code of a transport in [`Op::Listen`].
pub(crate) fn transport_code(t: ibcm_mad::ReqTransport) -> u8 {
    match t {
        ibcm_mad::ReqTransport::Rc => 0,
        ibcm_mad::ReqTransport::Uc => 1,
        ibcm_mad::ReqTransport::Xrc => 2,
        ibcm_mad::ReqTransport::Other => 3,
    }
}

/// The transport of a wire code (see [`transport_code`]).
pub(crate) fn transport_of(c: u8) -> ibcm_mad::ReqTransport {
    match c {
        0 => ibcm_mad::ReqTransport::Rc,
        1 => ibcm_mad::ReqTransport::Uc,
        2 => ibcm_mad::ReqTransport::Xrc,
        _ => ibcm_mad::ReqTransport::Other,
    }
}
