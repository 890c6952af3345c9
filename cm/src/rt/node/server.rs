//! The daemon side: [`NodeServer`] serves clients on a Unix socket and feeds their requests
//! into one endpoint's driver ([`Cm`]), per session.
//!
//! Ownership: a session's objects are the connections it started, the requests that reached
//! its listeners (and the connections they became), and its listeners; they live in the
//! session's own tables, so a request naming anything else finds nothing ("no connection").
//! A service ID is listened on by one session at a time. Replies and events go through a
//! bounded queue per session, written by that session's own task: a client that stops
//! reading fills only its own queue and is then dropped, as if it had exited.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use ibcm_mad::{Qpn, RejReason, ServiceId, SidrStatus};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{mpsc, oneshot};
use tracing::{debug, info, warn};

use super::client::transport_of;
use super::journal::{JournalEntry, JournalTx};
use super::proto::{
    encode_frame, read_frame, sid, texp, ClientMsg, DaemonMsg, FrameError, Op, WireCallError,
    WireConnectError, WirePeer, WireRep, WireReq, WireResult, WireStatus, VERSION,
};
use crate::proto::{ConnId, ListenOptions, PeerAddr, SidrRepParams};
use crate::rt::command::Command;
use crate::rt::handle::Cm;
use crate::rt::slot::Slot;
use crate::rt::types::{ConnStatus, IncomingKind};

/// Who a session is: its number and its peer's credentials (`SO_PEERCRED`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionInfo {
    /// The session's number (unique in this daemon's life).
    pub id: u64,
    /// The client's user.
    pub uid: u32,
    /// The client's process, if the kernel said.
    pub pid: Option<i32>,
}

/// A boxed future, for [`NodeHooks`].
pub type HookFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Where a hook reports events about a session's XRC services ([`DaemonMsg::XrcEvent`]).
#[derive(Debug, Clone)]
pub struct EventSink {
    out: Outbox,
}

impl EventSink {
    /// Sends one line about `service_id` to the session's client (dropped if its queue is
    /// full: the session is then closed).
    pub fn xrc_event(&self, service_id: ServiceId, text: String) {
        self.out.push(&DaemonMsg::XrcEvent {
            service_id: service_id.0,
            text,
        });
    }
}

/// What the daemon adds around the CM: XRC target services and the end of a session's
/// holdings. Implemented by `ibcmd` with the `ibcm-xrc` registry.
pub trait NodeHooks: Send + Sync + 'static {
    /// [`Op::XrcListen`]: serve XRC REQs for `service_id` as `session`'s target.
    fn xrc_listen<'a>(
        &'a self,
        session: SessionInfo,
        service_id: ServiceId,
        policy: &'a str,
        srqns: &'a [u32],
        events: EventSink,
    ) -> HookFuture<'a, Result<(), String>>;

    /// [`Op::XrcDestroy`]: destroy the TGT QPs `session` owns; how many.
    fn xrc_destroy(&self, session: SessionInfo) -> HookFuture<'_, Result<u64, String>>;

    /// [`Op::XrcUnlisten`].
    fn xrc_unlisten(&self, session: SessionInfo, service_id: ServiceId) -> HookFuture<'_, ()>;

    /// The session ended (its client exited or closed the socket): end its XRC holdings per
    /// their policies. Called after its connections were disconnected.
    fn session_ended(&self, session: SessionInfo) -> HookFuture<'_, ()>;
}

/// Limits per session.
#[derive(Debug, Clone, Copy)]
pub struct ServerConfig {
    /// Connections (live, TimeWait excluded) a session may hold.
    pub max_connections: usize,
    /// Listeners (CM and XRC) a session may hold.
    pub max_listeners: usize,
    /// Messages queued towards a client before it counts as stuck and is dropped.
    pub queue: usize,
    /// [`NodeServer::shutdown`]: how long to wait for the peers' answers to the DREQs (the
    /// connections still unanswered then stay in the journal, for the next start).
    pub shutdown_grace: std::time::Duration,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            max_connections: 65_536,
            max_listeners: 1024,
            queue: 8192,
            shutdown_grace: std::time::Duration::from_secs(2),
        }
    }
}

/// A session's outbound queue (bounded); full means the client is stuck.
#[derive(Debug, Clone)]
struct Outbox {
    tx: mpsc::Sender<Vec<u8>>,
    stuck: Arc<tokio::sync::Notify>,
}

impl Outbox {
    fn push(&self, m: &DaemonMsg) {
        let Ok(frame) = encode_frame(m) else {
            return;
        };
        if let Err(mpsc::error::TrySendError::Full(_)) = self.tx.try_send(frame) {
            self.stuck.notify_one();
        }
    }
}

/// One connection of a session.
#[derive(Debug)]
struct ConnEntry {
    /// A REQ delivered to the client and not yet answered.
    unanswered: bool,
    /// For the journal: the peer's comm ID and QPN when known (passive side: from the REQ).
    remote: Option<(u32, u32)>,
    peer: Option<PeerAddr>,
}

#[derive(Debug, Default)]
struct SessionState {
    conns: BTreeMap<u32, ConnEntry>,
    listens: BTreeSet<u64>,
    xrc: BTreeSet<u64>,
    closed: bool,
}

struct Session {
    info: SessionInfo,
    state: Mutex<SessionState>,
    out: Outbox,
}

impl Session {
    fn lock(&self) -> MutexGuard<'_, SessionState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The daemon's client service (module docs).
pub struct NodeServer {
    cm: Cm,
    hooks: Arc<dyn NodeHooks>,
    cfg: ServerConfig,
    /// Service ID → the session listening on it (CM or XRC).
    services: Mutex<HashMap<u64, u64>>,
    sessions: Mutex<BTreeMap<u64, Arc<Session>>>,
    next_session: AtomicU64,
    journal: Option<JournalTx>,
}

impl std::fmt::Debug for NodeServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeServer").finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl NodeServer {
    /// A server feeding `cm`'s driver, with `hooks` for XRC and session ends, and, if given,
    /// a journal of live connections ([`super::journal::Journal`]).
    pub fn new(
        cm: Cm,
        hooks: Arc<dyn NodeHooks>,
        cfg: ServerConfig,
        journal: Option<JournalTx>,
    ) -> Arc<Self> {
        Arc::new(NodeServer {
            cm,
            hooks,
            cfg,
            services: Mutex::new(HashMap::new()),
            sessions: Mutex::new(BTreeMap::new()),
            next_session: AtomicU64::new(1),
            journal,
        })
    }

    /// Accepts clients on `listener` until the task is dropped.
    pub async fn serve(self: Arc<Self>, listener: UnixListener) {
        loop {
            match listener.accept().await {
                Ok((stream, _)) => {
                    let me = self.clone();
                    tokio::spawn(async move { me.session(stream).await });
                }
                Err(e) => {
                    warn!(error = %e, "accept on the client socket failed");
                    // Out of descriptors and the like: let the others finish something.
                    tokio::task::yield_now().await;
                }
            }
        }
    }

    /// Ends every session as if its client had exited (DREQs, REJs, listeners removed, XRC
    /// holdings per policy), and returns once the driver has put the DREQs on the wire and
    /// the peers have answered them (DREP), or [`ServerConfig::shutdown_grace`] has passed.
    pub async fn shutdown(&self) {
        let all: Vec<Arc<Session>> = lock(&self.sessions).values().cloned().collect();
        for s in all {
            self.end_session(&s).await;
        }
        self.sync_driver().await;
        if let Some(j) = &self.journal {
            if tokio::time::timeout(self.cfg.shutdown_grace, j.drained())
                .await
                .is_err()
            {
                warn!(
                    unanswered = j.len(),
                    "DREQs unanswered: their connections stay in the journal for the next start"
                );
            }
        }
    }

    /// A round trip through the driver: everything sent before has been handled and flushed.
    async fn sync_driver(&self) {
        let _ = self.cm.call(|reply| Command::Len { reply }).await;
    }

    async fn session(self: Arc<Self>, stream: UnixStream) {
        let cred = match stream.peer_cred() {
            Ok(c) => c,
            Err(e) => {
                warn!(error = %e, "client without credentials refused");
                return;
            }
        };
        let info = SessionInfo {
            id: self.next_session.fetch_add(1, Ordering::Relaxed),
            uid: cred.uid(),
            pid: cred.pid(),
        };
        let (mut rd, mut wr) = stream.into_split();
        let (tx, mut rx) = mpsc::channel::<Vec<u8>>(self.cfg.queue.max(16));
        let stuck = Arc::new(tokio::sync::Notify::new());
        let session = Arc::new(Session {
            info,
            state: Mutex::new(SessionState::default()),
            out: Outbox {
                tx,
                stuck: stuck.clone(),
            },
        });
        lock(&self.sessions).insert(info.id, session.clone());
        info!(session = info.id, uid = info.uid, pid = ?info.pid, "client attached");
        let (finish, mut finished) = oneshot::channel::<()>();
        let writer = tokio::spawn(async move {
            use tokio::io::AsyncWriteExt;
            loop {
                tokio::select! {
                    f = rx.recv() => match f {
                        Some(f) => {
                            if wr.write_all(&f).await.is_err() {
                                return;
                            }
                        }
                        None => return,
                    },
                    _ = &mut finished => break,
                }
            }
            // The session is over: what is queued goes out if the client still reads (its
            // last replies, say why a hello was refused), within a bound.
            let rest = async {
                while let Ok(f) = rx.try_recv() {
                    if wr.write_all(&f).await.is_err() {
                        return;
                    }
                }
            };
            let _ = tokio::time::timeout(std::time::Duration::from_millis(100), rest).await;
        });
        let mut greeted = false;
        let why = loop {
            tokio::select! {
                m = read_frame::<ClientMsg, _>(&mut rd) => match m {
                    // The first message says which protocol the client speaks.
                    Ok(m) if !greeted => {
                        let ok = matches!(m.op, Op::Hello { version } if version == VERSION);
                        self.on_request(&session, m).await;
                        if !ok {
                            break "protocol error: no hello of this version first".to_string();
                        }
                        greeted = true;
                    }
                    Ok(m) => self.on_request(&session, m).await,
                    Err(FrameError::Io(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                        break "closed".to_string();
                    }
                    Err(e) => break format!("protocol error: {e}"),
                },
                () = stuck.notified() => break "stuck: its queue is full".to_string(),
            }
        };
        let exited = info
            .pid
            .is_some_and(|p| !std::path::Path::new(&format!("/proc/{p}")).exists());
        info!(session = info.id, pid = ?info.pid, exited, why = %why, "client gone");
        self.end_session(&session).await;
        let _ = finish.send(());
        // A stuck client's writer is blocked in a write: it is dropped after the bound.
        let mut writer = writer;
        if tokio::time::timeout(std::time::Duration::from_millis(200), &mut writer)
            .await
            .is_err()
        {
            writer.abort();
        }
    }

    /// The end of a session: its connections disconnected (REJ while being set up), its
    /// pending requests rejected, its listeners removed, then the XRC hook.
    async fn end_session(&self, s: &Arc<Session>) {
        let (conns, listens, xrc) = {
            let mut st = s.lock();
            if st.closed {
                return;
            }
            st.closed = true;
            (
                std::mem::take(&mut st.conns),
                std::mem::take(&mut st.listens),
                std::mem::take(&mut st.xrc),
            )
        };
        for (id, c) in &conns {
            let id = ibcm_mad::CommId(*id);
            if c.unanswered {
                self.cm.send(Command::Unanswered { id, sidr: false });
            } else {
                let (reply, _) = oneshot::channel();
                self.cm.send(Command::Disconnect {
                    conn: id,
                    private_data: Vec::new(),
                    reply,
                });
            }
        }
        {
            let mut svc = lock(&self.services);
            for sid in listens.iter().chain(xrc.iter()) {
                svc.remove(sid);
            }
        }
        for &service_id in &listens {
            self.cm.send(Command::Unlisten {
                service_id: sid(service_id),
            });
        }
        for &service_id in &xrc {
            self.hooks.xrc_unlisten(s.info, sid(service_id)).await;
        }
        debug!(
            session = s.info.id,
            conns = conns.len(),
            "session's connections ended"
        );
        self.hooks.session_ended(s.info).await;
        lock(&self.sessions).remove(&s.info.id);
    }

    fn reply(s: &Session, seq: u64, result: WireResult) {
        s.out.push(&DaemonMsg::Reply { seq, result });
    }

    /// Whether `conn` is the session's.
    fn owns(s: &Session, conn: u32) -> bool {
        s.lock().conns.contains_key(&conn)
    }

    async fn on_request(self: &Arc<Self>, s: &Arc<Session>, m: ClientMsg) {
        let seq = m.seq;
        let not_yours =
            |conn: u32| WireResult::CallError(WireCallError::UnknownConnection { conn });
        let r = match m.op {
            Op::Hello { version } if version == VERSION => WireResult::Ok,
            Op::Hello { version } => WireResult::Refused {
                why: format!("protocol version {version}; this daemon speaks {VERSION}"),
            },
            Op::Connect { params } => {
                let (r, watch) = self.connect(s, params).await;
                Self::reply(s, seq, r);
                if let Some((conn, slot)) = watch {
                    self.watch(s.clone(), conn, slot);
                }
                return;
            }
            Op::Listen {
                service_id,
                transports,
            } => self.listen(s, service_id, transports).await,
            Op::Unlisten { service_id } => {
                let mine = s.lock().listens.remove(&service_id);
                if mine {
                    lock(&self.services).remove(&service_id);
                    self.cm.send(Command::Unlisten {
                        service_id: sid(service_id),
                    });
                }
                WireResult::Ok
            }
            Op::Accept { conn, params } => {
                if !s.lock().conns.get(&conn).is_some_and(|c| c.unanswered) {
                    not_yours(conn)
                } else {
                    match params.to_params() {
                        Err(why) => WireResult::Refused { why },
                        Ok(params) => {
                            let r = self
                                .cm
                                .call(|reply| Command::Accept {
                                    conn: ibcm_mad::CommId(conn),
                                    params,
                                    reply,
                                })
                                .await;
                            match r {
                                // Watched since its REQ arrived.
                                Ok(Ok(_slot)) => {
                                    if let Some(c) = s.lock().conns.get_mut(&conn) {
                                        c.unanswered = false;
                                    }
                                    WireResult::Ok
                                }
                                Ok(Err(e)) => WireResult::CallError(WireCallError::from_error(&e)),
                                Err(_) => WireResult::Refused {
                                    why: "the endpoint has stopped".into(),
                                },
                            }
                        }
                    }
                }
            }
            Op::Reject {
                conn,
                reason,
                ari,
                private_data,
            } => {
                if !Self::owns(s, conn) {
                    not_yours(conn)
                } else {
                    let r = self
                        .cm
                        .call(|reply| Command::Reject {
                            conn: ibcm_mad::CommId(conn),
                            reason: RejReason::from_raw(reason),
                            ari,
                            private_data,
                            reply,
                        })
                        .await;
                    // A rejected REQ leaves the table without a status a watcher would see.
                    let mut st = s.lock();
                    if st.conns.get(&conn).is_some_and(|c| c.unanswered) {
                        st.conns.remove(&conn);
                    }
                    unit(r)
                }
            }
            Op::Establish { conn, private_data } => {
                if !Self::owns(s, conn) {
                    not_yours(conn)
                } else {
                    unit(
                        self.cm
                            .call(|reply| Command::Establish {
                                conn: ibcm_mad::CommId(conn),
                                private_data,
                                reply,
                            })
                            .await,
                    )
                }
            }
            Op::Mra {
                conn,
                service_timeout,
            } => {
                if !Self::owns(s, conn) {
                    not_yours(conn)
                } else {
                    unit(
                        self.cm
                            .call(|reply| Command::Mra {
                                conn: ibcm_mad::CommId(conn),
                                service_timeout: texp(service_timeout),
                                reply,
                            })
                            .await,
                    )
                }
            }
            Op::Disconnect { conn, private_data } => {
                if !Self::owns(s, conn) {
                    not_yours(conn)
                } else {
                    unit(
                        self.cm
                            .call(|reply| Command::Disconnect {
                                conn: ibcm_mad::CommId(conn),
                                private_data,
                                reply,
                            })
                            .await,
                    )
                }
            }
            Op::Unanswered { conn } => {
                let mine = s.lock().conns.get(&conn).is_some_and(|c| c.unanswered);
                if mine {
                    s.lock().conns.remove(&conn);
                    self.cm.send(Command::Unanswered {
                        id: ibcm_mad::CommId(conn),
                        sidr: false,
                    });
                }
                WireResult::Ok
            }
            Op::PendingDropped { conn } => {
                if Self::owns(s, conn) {
                    self.cm.send(Command::PendingDropped {
                        id: ibcm_mad::CommId(conn),
                    });
                }
                WireResult::Ok
            }
            Op::RandomPsn => match self.cm.call(|reply| Command::RandomPsn { reply }).await {
                Ok(p) => WireResult::Value {
                    value: u64::from(p.get()),
                },
                Err(_) => WireResult::Refused {
                    why: "the endpoint has stopped".into(),
                },
            },
            Op::Len => WireResult::Value {
                value: s.lock().conns.len() as u64,
            },
            Op::XrcListen {
                service_id,
                policy,
                srqns,
            } => self.xrc_listen(s, service_id, &policy, &srqns).await,
            Op::XrcDestroy => match self.hooks.xrc_destroy(s.info).await {
                Ok(value) => WireResult::Value { value },
                Err(why) => WireResult::Refused { why },
            },
            Op::XrcUnlisten { service_id } => {
                let mine = s.lock().xrc.remove(&service_id);
                if mine {
                    lock(&self.services).remove(&service_id);
                    self.hooks.xrc_unlisten(s.info, sid(service_id)).await;
                }
                WireResult::Ok
            }
        };
        Self::reply(s, seq, r);
    }

    async fn connect(
        self: &Arc<Self>,
        s: &Arc<Session>,
        params: super::proto::WireConnect,
    ) -> (WireResult, Option<(u32, Arc<Slot>)>) {
        if s.lock().conns.len() >= self.cfg.max_connections {
            let why = format!("quota: {} connections", self.cfg.max_connections);
            return (WireResult::Refused { why }, None);
        }
        let params = match params.to_params() {
            Ok(p) => p,
            Err(why) => return (WireResult::Refused { why }, None),
        };
        let peer = params.peer;
        match self
            .cm
            .call(|reply| Command::Connect { params, reply })
            .await
        {
            Ok(Ok((id, slot))) => {
                s.lock().conns.insert(
                    id.0,
                    ConnEntry {
                        unanswered: false,
                        remote: None,
                        peer: Some(peer),
                    },
                );
                // Watched once the reply is queued: the client knows the connection before
                // its first event.
                (WireResult::Conn { conn: id.0 }, Some((id.0, slot)))
            }
            Ok(Err(e)) => (
                WireResult::ConnectError(WireConnectError::from_error(&e)),
                None,
            ),
            Err(_) => (
                WireResult::Refused {
                    why: "the endpoint has stopped".into(),
                },
                None,
            ),
        }
    }

    async fn listen(
        self: &Arc<Self>,
        s: &Arc<Session>,
        service_id: u64,
        transports: Vec<u8>,
    ) -> WireResult {
        if let Some(r) = self.claim(s, service_id) {
            return r;
        }
        s.lock().listens.insert(service_id);
        let (tx, mut rx) = mpsc::unbounded_channel();
        let options = ListenOptions {
            transports: transports.into_iter().map(transport_of).collect(),
        };
        let r = self
            .cm
            .call(|reply| Command::Listen {
                service_id: sid(service_id),
                options,
                tx,
                reply,
            })
            .await;
        if r.is_err() {
            return WireResult::Refused {
                why: "the endpoint has stopped".into(),
            };
        }
        let (me, s2) = (self.clone(), s.clone());
        tokio::spawn(async move {
            while let Some((id, kind)) = rx.recv().await {
                me.incoming(&s2, service_id, id, kind);
            }
        });
        WireResult::Ok
    }

    /// Takes `service_id` for `s`, or says why not.
    fn claim(&self, s: &Session, service_id: u64) -> Option<WireResult> {
        {
            let st = s.lock();
            if st.listens.len() + st.xrc.len() >= self.cfg.max_listeners {
                return Some(WireResult::Refused {
                    why: format!("quota: {} listeners", self.cfg.max_listeners),
                });
            }
        }
        let mut svc = lock(&self.services);
        match svc.get(&service_id) {
            Some(&other) => Some(WireResult::Refused {
                why: format!(
                    "service ID {} is listened on by {}",
                    ServiceId(service_id),
                    if other == s.info.id {
                        "this client already"
                    } else {
                        "another client"
                    }
                ),
            }),
            None => {
                svc.insert(service_id, s.info.id);
                None
            }
        }
    }

    fn incoming(
        self: &Arc<Self>,
        s: &Arc<Session>,
        service_id: u64,
        id: ConnId,
        kind: IncomingKind,
    ) {
        match kind {
            IncomingKind::Connect(req) => {
                let over = {
                    let mut st = s.lock();
                    if st.closed || st.conns.len() >= self.cfg.max_connections {
                        true
                    } else {
                        st.conns.insert(
                            id.0,
                            ConnEntry {
                                unanswered: true,
                                remote: Some((req.req.local_comm_id.0, req.remote_qpn().get())),
                                peer: Some(req.peer),
                            },
                        );
                        false
                    }
                };
                if over {
                    self.cm.send(Command::Unanswered { id, sidr: false });
                    return;
                }
                match WireReq::from_info(&req) {
                    Ok(req) => {
                        s.out.push(&DaemonMsg::Incoming {
                            service_id,
                            conn: id.0,
                            req,
                        });
                        // Watched from the REQ on: a peer that gives up before the answer,
                        // or a reject, ends it at the client too.
                        if let Some(c) = self.cm.connection(id) {
                            self.watch(s.clone(), id.0, c.slot);
                        }
                    }
                    Err(_) => {
                        s.lock().conns.remove(&id.0);
                        self.cm.send(Command::Unanswered { id, sidr: false });
                    }
                }
            }
            IncomingKind::Sidr(_) => {
                // Not served through the node service: refused explicitly.
                let (reply, _) = oneshot::channel();
                self.cm.send(Command::SidrReply {
                    id,
                    params: SidrRepParams {
                        status: SidrStatus::Rejected,
                        ..SidrRepParams::success(Qpn::default(), ibcm_mad::Qkey(0))
                    },
                    reply,
                });
            }
        }
    }

    async fn xrc_listen(
        self: &Arc<Self>,
        s: &Arc<Session>,
        service_id: u64,
        policy: &str,
        srqns: &[u32],
    ) -> WireResult {
        if let Some(r) = self.claim(s, service_id) {
            return r;
        }
        let sink = EventSink { out: s.out.clone() };
        match self
            .hooks
            .xrc_listen(s.info, sid(service_id), policy, srqns, sink)
            .await
        {
            Ok(()) => {
                s.lock().xrc.insert(service_id);
                WireResult::Ok
            }
            Err(why) => {
                lock(&self.services).remove(&service_id);
                WireResult::Refused { why }
            }
        }
    }

    /// Forwards a connection's REP and statuses to its session until it is gone.
    fn watch(self: &Arc<Self>, s: Arc<Session>, conn: u32, slot: Arc<Slot>) {
        let me = self.clone();
        tokio::spawn(async move {
            if let Ok(rep) = slot.wait_rep().await {
                if let Some(c) = s.lock().conns.get_mut(&conn) {
                    c.remote = Some((rep.rep.local_comm_id.0, rep.remote_qpn.get()));
                }
                s.out.push(&DaemonMsg::Rep {
                    conn,
                    rep: WireRep::from_info(&rep),
                });
            }
            let mut last = ConnStatus::Connecting;
            loop {
                let st = slot.wait(|st| (*st != last).then(|| st.clone())).await;
                // In the journal before the client hears of it.
                me.journal_note(&s, conn, &st);
                s.out.push(&DaemonMsg::Status {
                    conn,
                    status: WireStatus::from_status(&st),
                });
                if matches!(st, ConnStatus::Gone(_)) {
                    s.lock().conns.remove(&conn);
                    return;
                }
                last = st;
            }
        });
    }

    fn journal_note(&self, s: &Session, conn: u32, st: &ConnStatus) {
        let Some(j) = &self.journal else {
            return;
        };
        match st {
            ConnStatus::Established => {
                let st = s.lock();
                let Some(c) = st.conns.get(&conn) else {
                    return;
                };
                if let (Some((remote_comm_id, remote_qpn)), Some(peer)) = (c.remote, c.peer) {
                    j.add(JournalEntry {
                        comm_id: conn,
                        remote_comm_id,
                        remote_qpn,
                        peer: WirePeer::from_peer(&peer),
                        xrc_tgt: false,
                    });
                }
            }
            ConnStatus::Closed(_) | ConnStatus::Gone(_) => j.remove(conn),
            ConnStatus::Connecting => {}
        }
    }

    /// The number of sessions now.
    pub fn sessions(&self) -> usize {
        lock(&self.sessions).len()
    }
}

fn unit<E>(r: Result<Result<(), crate::proto::CallError>, E>) -> WireResult {
    match r {
        Ok(Ok(())) => WireResult::Ok,
        Ok(Err(e)) => WireResult::CallError(WireCallError::from_error(&e)),
        Err(_) => WireResult::Refused {
            why: "the endpoint has stopped".into(),
        },
    }
}
