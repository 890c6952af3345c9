//! The daemon side: [`NodeServer`] serves clients on a Unix socket and feeds their requests
//! into one endpoint's driver ([`Cm`]), per session.
//!
//! Ownership: a session's objects are the connections it started, the requests that reached
//! its listeners (and the connections they became), and its listeners; they live in the
//! session's own tables, so a request naming anything else finds nothing ("no connection").
//! A service ID is listened on by one session at a time. Replies and events go through a
//! queue per session, bounded in messages and in bytes (and the bytes of all a user's
//! sessions), written by that session's own task: a client that stops reading fills only its
//! own queue and is then dropped, as if it had exited.
//!
//! Hostile clients: a session counts against its user's quota from its accept; one that has
//! not said hello within [`ServerConfig::hello_timeout`] is closed, and nothing but a hello
//! runs before it; other users' sessions are refused before the daemon's last
//! [`ServerConfig::reserved_fds`] descriptors, so root can always attach; a failed accept
//! is retried after a growing pause; the log lines clients cause are rate-limited. A
//! session's SIDRs in flight end with it, and its SIDR datagrams are budgeted (`sidr`).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{mpsc, oneshot};
use tracing::{debug, info, warn};

use super::config::ServerConfig;
use super::errors::WireConnError;
use super::hooks::{NodeHooks, SessionInfo};
use super::journal::{JournalEntry, JournalTx};
use super::proto::{
    encode_frame, read_frame, sid, ClientMsg, DaemonMsg, FrameError, Op, WirePeer, WireRep,
    WireResult, WireStatus, VERSION,
};
use crate::log_limit::LogLimit;
use crate::proto::{ConnectionError, PeerAddr};
use crate::rt::command::Command;
use crate::rt::handle::Cm;
use crate::rt::slot::SlotRef;
use crate::rt::types::ConnStatus;

/// Why a session's client is stuck, once it is.
#[derive(Debug, Default)]
struct Stuck {
    notify: tokio::sync::Notify,
    why: std::sync::OnceLock<String>,
}

impl Stuck {
    fn set(&self, why: impl FnOnce() -> String) {
        let _ = self.why.get_or_init(why);
        self.notify.notify_one();
    }
}

/// A frame in a session's queue; its bytes count against the session's and its user's
/// bounds until it is written or dropped.
#[derive(Debug)]
struct Queued {
    frame: Vec<u8>,
    bytes: Arc<AtomicUsize>,
    user_bytes: Arc<AtomicUsize>,
}

impl Drop for Queued {
    fn drop(&mut self) {
        let n = self.frame.len();
        self.bytes.fetch_sub(n, Ordering::Relaxed);
        self.user_bytes.fetch_sub(n, Ordering::Relaxed);
    }
}

/// A session's outbound queue, bounded in messages and in bytes (the session's and its
/// user's); over a bound, the client is stuck.
#[derive(Debug, Clone)]
pub(super) struct Outbox {
    tx: mpsc::Sender<Queued>,
    stuck: Arc<Stuck>,
    bytes: Arc<AtomicUsize>,
    user_bytes: Arc<AtomicUsize>,
    /// `ServerConfig::queue`, `queue_bytes`, `queue_bytes_per_user`, and the user.
    limits: (usize, usize, usize, u32),
}

impl Outbox {
    pub(super) fn push(&self, m: &DaemonMsg) {
        let Ok(frame) = encode_frame(m) else {
            return;
        };
        let n = frame.len();
        let (count, max, max_user, uid) = self.limits;
        let mine = self.bytes.fetch_add(n, Ordering::Relaxed).saturating_add(n);
        let user = self
            .user_bytes
            .fetch_add(n, Ordering::Relaxed)
            .saturating_add(n);
        let q = Queued {
            frame,
            bytes: self.bytes.clone(),
            user_bytes: self.user_bytes.clone(),
        };
        if mine > max {
            drop(q);
            self.stuck
                .set(|| format!("stuck: its queue is full ({max} bytes)"));
        } else if user > max_user {
            drop(q);
            self.stuck
                .set(|| format!("stuck: its queue is full ({max_user} bytes of uid {uid})"));
        } else if let Err(mpsc::error::TrySendError::Full(_)) = self.tx.try_send(q) {
            self.stuck
                .set(|| format!("stuck: its queue is full ({count} messages)"));
        }
    }
}

/// What one Unix user holds: its sessions (from their accept, hello or not) and the bytes
/// queued towards them.
#[derive(Debug, Default)]
struct UserSlot {
    sessions: usize,
    queue_bytes: Arc<AtomicUsize>,
}

/// The sessions by user, counted from accept.
#[derive(Debug, Default)]
struct Admission {
    users: HashMap<u32, UserSlot>,
    /// Sessions of users other than root.
    not_root: usize,
    /// The most sessions of users other than root ([`ServerConfig::reserved_fds`]).
    not_root_cap: usize,
}

/// A session's place in [`Admission`], given back when dropped.
struct Admitted {
    server: Arc<NodeServer>,
    uid: u32,
    queue_bytes: Arc<AtomicUsize>,
}

impl Drop for Admitted {
    fn drop(&mut self) {
        let mut a = lock(&self.server.admission);
        if self.uid != 0 {
            a.not_root = a.not_root.saturating_sub(1);
        }
        if let Some(u) = a.users.get_mut(&self.uid) {
            u.sessions = u.sessions.saturating_sub(1);
            if u.sessions == 0 {
                a.users.remove(&self.uid);
            }
        }
    }
}

/// Log lines about what clients make the daemon do (sessions refused or closed before
/// their hello, failed accepts): at most `LOG_BURST` a second; each line logged says how
/// many were suppressed before it.
#[derive(Debug, Default)]
pub(super) struct Limited {
    limit: LogLimit,
    reported: u64,
}

impl Limited {
    /// `Some(lines suppressed since the last one logged)` if a line may be logged now.
    pub(super) fn ok(&mut self) -> Option<u64> {
        if !self.limit.ok(tokio::time::Instant::now().into_std()) {
            return None;
        }
        Some(self.unreported())
    }

    /// Lines suppressed since the last one logged (or the last call), now reported.
    pub(super) fn unreported(&mut self) -> u64 {
        let n = self.limit.suppressed - self.reported;
        self.reported = self.limit.suppressed;
        n
    }
}

/// One connection of a session.
#[derive(Debug)]
pub(super) struct ConnEntry {
    /// A REQ delivered to the client and not yet answered.
    pub(super) unanswered: bool,
    /// For the journal: the peer's comm ID and QPN when known (passive side: from the REQ).
    pub(super) remote: Option<(u32, u32)>,
    /// For the journal: the peer's CM.
    pub(super) peer: Option<PeerAddr>,
    /// The service ID of the listener whose REQ it was (passive side).
    pub(super) service: Option<u64>,
    /// The client has been told it is established (a LAP that arrives before waits for
    /// that status: `lap`'s `Stashed`).
    pub(super) established: bool,
    /// A LAP held for the client (a session that answers its LAPs, `lap.rs`).
    pub(super) lap: super::lap::HeldLap,
}

impl ConnEntry {
    /// A connection of the session: `unanswered` (a REQ delivered), the peer's comm ID and
    /// QPN and its CM when known, the listener's service ID on the passive side.
    pub(super) fn new(
        unanswered: bool,
        remote: Option<(u32, u32)>,
        peer: Option<PeerAddr>,
        service: Option<u64>,
    ) -> Self {
        ConnEntry {
            unanswered,
            remote,
            peer,
            service,
            established: false,
            lap: super::lap::HeldLap::None,
        }
    }
}

#[derive(Debug, Default)]
pub(super) struct SessionState {
    pub(super) conns: BTreeMap<u32, ConnEntry>,
    /// Service ID → the endpoint's listener token.
    pub(super) listens: BTreeMap<u64, u64>,
    pub(super) xrc: BTreeSet<u64>,
    /// SIDR_REQs delivered to the client and not answered yet, with their arrival.
    pub(super) sidr_in: BTreeMap<u32, tokio::time::Instant>,
    /// The client's SIDR_REQs waiting for their SIDR_REP (the endpoint's request IDs).
    pub(super) sidr_out: BTreeSet<u32>,
    /// The client's SIDR_REQs on their way to the endpoint.
    pub(super) sidr_starting: usize,
    /// Per listener (service ID): its REQs delivered and not yet answered
    /// ([`ServerConfig::listen_backlog`]).
    pub(super) backlog: BTreeMap<u64, usize>,
    /// Path queries in flight ([`ServerConfig::max_path_queries`]).
    pub(super) path_queries: usize,
    /// The client answers its connections' LAPs (`lap-policy`): where the endpoint sends
    /// them (each of its connections is delegated to it).
    pub(super) lap_sink: Option<crate::rt::command::LapSink>,
    /// LAPs held for the client (its connections' `lap`), not answered yet.
    pub(super) laps_held: usize,
    /// The client's LAPs waiting for their APR.
    pub(super) laps_sent: usize,
    pub(super) closed: bool,
}

impl SessionState {
    /// Removes a connection from the session's table (and from its listener's backlog if
    /// its REQ was still unanswered).
    pub(super) fn remove_conn(&mut self, conn: u32) -> Option<ConnEntry> {
        let c = self.conns.remove(&conn)?;
        if c.unanswered {
            self.settle(c.service);
        }
        if c.lap.is_held() {
            self.laps_held = self.laps_held.saturating_sub(1);
        }
        Some(c)
    }

    /// Its LAP exchanges: LAPs sent waiting for their APR, LAPs held for it
    /// ([`ServerConfig::max_laps`]).
    pub(super) fn laps(&self) -> usize {
        self.laps_held.saturating_add(self.laps_sent)
    }

    /// The client answered the REQ of `conn` (accepted it).
    pub(super) fn answered(&mut self, conn: u32) {
        let Some(c) = self.conns.get_mut(&conn) else {
            return;
        };
        if c.unanswered {
            c.unanswered = false;
            let service = c.service;
            self.settle(service);
        }
    }

    fn settle(&mut self, service: Option<u64>) {
        let Some(service) = service else {
            return;
        };
        if let Some(n) = self.backlog.get_mut(&service) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.backlog.remove(&service);
            }
        }
    }
}

/// One client's session.
pub(super) struct Session {
    pub(super) info: SessionInfo,
    state: Mutex<SessionState>,
    pub(super) out: Outbox,
}

impl Session {
    pub(super) fn lock(&self) -> MutexGuard<'_, SessionState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The daemon's client service (module docs).
pub struct NodeServer {
    pub(super) cm: Cm,
    pub(super) hooks: Arc<dyn NodeHooks>,
    pub(super) cfg: ServerConfig,
    /// Service ID → the session listening on it (CM or XRC).
    pub(super) services: Mutex<HashMap<u64, u64>>,
    sessions: Mutex<BTreeMap<u64, Arc<Session>>>,
    /// The SIDR datagram budgets of the sessions and the users.
    pub(super) sidr_budgets: Mutex<super::sidr::SidrBudgets>,
    /// Sessions by user, from accept.
    admission: Mutex<Admission>,
    /// The rate limit of the log lines about refused sessions and failed accepts.
    pub(super) log: Mutex<Limited>,
    next_session: AtomicU64,
    journal: Option<JournalTx>,
    /// REQs rejected because their listener's backlog was full.
    pub(super) backlog_rejects: AtomicU64,
    /// Path queries in flight by user ([`ServerConfig::max_path_queries_per_user`]).
    pub(super) path_queries: Mutex<HashMap<u32, usize>>,
}

impl std::fmt::Debug for NodeServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeServer").finish_non_exhaustive()
    }
}

pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
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
            sidr_budgets: Mutex::new(super::sidr::SidrBudgets::default()),
            admission: Mutex::new(Admission {
                not_root_cap: usize::MAX,
                ..Admission::default()
            }),
            log: Mutex::new(Limited::default()),
            next_session: AtomicU64::new(1),
            journal,
            backlog_rejects: AtomicU64::new(0),
            path_queries: Mutex::new(HashMap::new()),
        })
    }

    /// Accepts clients on `listener` until the task is dropped. Each is counted against its
    /// user's sessions from its accept (`SO_PEERCRED`); the sessions of users other than root
    /// are refused once fewer than [`ServerConfig::reserved_fds`] descriptors would be left.
    /// A failed accept (out of descriptors: `EMFILE`, `ENFILE`) is retried after a pause
    /// that doubles up to 1 s.
    pub async fn serve(self: Arc<Self>, listener: UnixListener) {
        let cap = self.not_root_cap();
        lock(&self.admission).not_root_cap = cap;
        info!(sessions_of_other_users = cap, "descriptors kept for root");
        let mut pause = Duration::ZERO;
        // Once a second: how many log lines the rate limit suppressed, if any (the next line
        // logged may be long in coming).
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let accepted = tokio::select! {
                a = listener.accept() => a,
                _ = tick.tick() => {
                    let suppressed = lock(&self.log).unreported();
                    if suppressed > 0 {
                        warn!(suppressed, "log lines about clients suppressed (rate limit)");
                    }
                    continue;
                }
            };
            match accepted {
                Ok((stream, _)) => {
                    pause = Duration::ZERO;
                    self.admit(stream);
                }
                Err(e) => {
                    pause = (pause * 2).clamp(Duration::from_millis(5), Duration::from_secs(1));
                    if let Some(suppressed) = lock(&self.log).ok() {
                        warn!(error = %e, pause_ms = pause.as_millis() as u64, suppressed,
                            "accept on the client socket failed");
                    }
                    tokio::time::sleep(pause).await;
                }
            }
        }
    }

    /// The most sessions of users other than root: the descriptors of `RLIMIT_NOFILE` not
    /// open now (before any session) and not reserved.
    fn not_root_cap(&self) -> usize {
        let Some(limit) = crate::rt::sys::nofile_limit() else {
            return usize::MAX;
        };
        let open = std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count());
        let limit = usize::try_from(limit).unwrap_or(usize::MAX);
        limit.saturating_sub(open.saturating_add(self.cfg.reserved_fds))
    }

    /// A new client: counted against its user's sessions, then served; or refused at once
    /// (the refusal answers its hello, `seq` 0) and closed.
    fn admit(self: &Arc<Self>, stream: UnixStream) {
        let cred = match stream.peer_cred() {
            Ok(c) => c,
            Err(e) => {
                if let Some(suppressed) = lock(&self.log).ok() {
                    warn!(error = %e, suppressed, "client without credentials refused");
                }
                return;
            }
        };
        let uid = cred.uid();
        let admitted = {
            let mut a = lock(&self.admission);
            let a = &mut *a;
            let slot = a.users.entry(uid).or_default();
            if slot.sessions >= self.cfg.max_sessions_per_user {
                Err(format!(
                    "quota: {} sessions of uid {uid}",
                    self.cfg.max_sessions_per_user
                ))
            } else if uid != 0 && a.not_root >= a.not_root_cap {
                Err(format!(
                    "the daemon keeps its last descriptors for root ({} sessions of other users)",
                    a.not_root_cap
                ))
            } else {
                slot.sessions += 1;
                if uid != 0 {
                    a.not_root += 1;
                }
                Ok(slot.queue_bytes.clone())
            }
        };
        if admitted.is_err() {
            let mut a = lock(&self.admission);
            if a.users.get(&uid).is_some_and(|u| u.sessions == 0) {
                a.users.remove(&uid);
            }
        }
        match admitted {
            Ok(queue_bytes) => {
                let slot = Admitted {
                    server: self.clone(),
                    uid,
                    queue_bytes,
                };
                let me = self.clone();
                tokio::spawn(async move { me.session(stream, cred, slot).await });
            }
            Err(why) => {
                // The socket is new: its buffer has room for this one frame.
                let refusal = DaemonMsg::Reply {
                    seq: 0,
                    result: WireResult::Refused { why: why.clone() },
                };
                if let Ok(f) = encode_frame(&refusal) {
                    let _ = stream.try_write(&f);
                }
                if let Some(suppressed) = lock(&self.log).ok() {
                    warn!(uid, pid = ?cred.pid(), why = %why, suppressed, "client refused");
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

    /// The sessions of `uid`.
    pub(super) fn sessions_of(&self, uid: u32) -> Vec<Arc<Session>> {
        lock(&self.sessions)
            .values()
            .filter(|s| s.info.uid == uid)
            .cloned()
            .collect()
    }

    /// Why `s`'s user may not open another connection, if it may not: the session's quota,
    /// then the user's over all its sessions.
    pub(super) fn connection_quota(&self, s: &Session) -> Option<String> {
        let own = s.lock().conns.len();
        self.quota_of(s.info, own)
    }

    /// Why a connection the XRC target would accept for a service of the session `info`
    /// (which may have ended) is over a quota, if it is: the session's, then its user's
    /// ([`ServerConfig::max_connections`], [`ServerConfig::max_connections_per_user`]),
    /// counting both RC and XRC connections.
    pub fn xrc_connection_quota(&self, info: SessionInfo) -> Option<String> {
        let s = lock(&self.sessions).get(&info.id).cloned();
        let own = s.map_or(0, |s| s.lock().conns.len());
        self.quota_of(info, own)
    }

    fn quota_of(&self, info: SessionInfo, own: usize) -> Option<String> {
        let (xrc_own, xrc_user) = self.hooks.xrc_connections(info);
        if own.saturating_add(xrc_own) >= self.cfg.max_connections {
            return Some(format!("quota: {} connections", self.cfg.max_connections));
        }
        let all: usize = self
            .sessions_of(info.uid)
            .iter()
            .map(|x| x.lock().conns.len())
            .sum();
        (all.saturating_add(xrc_user) >= self.cfg.max_connections_per_user).then(|| {
            format!(
                "quota: {} connections of uid {}",
                self.cfg.max_connections_per_user, info.uid
            )
        })
    }

    /// The limits it applies.
    pub fn config(&self) -> &ServerConfig {
        &self.cfg
    }

    /// A round trip through the driver: everything sent before has been handled and flushed.
    async fn sync_driver(&self) {
        let _ = self.cm.call(|reply| Command::Len { reply }).await;
    }

    async fn session(
        self: Arc<Self>,
        stream: UnixStream,
        cred: tokio::net::unix::UCred,
        slot: Admitted,
    ) {
        let info = SessionInfo {
            id: self.next_session.fetch_add(1, Ordering::Relaxed),
            uid: cred.uid(),
            gid: cred.gid(),
            pid: cred.pid(),
        };
        let (mut rd, mut wr) = stream.into_split();
        let (tx, mut rx) = mpsc::channel::<Queued>(self.cfg.queue.max(16));
        let stuck = Arc::new(Stuck::default());
        let session = Arc::new(Session {
            info,
            state: Mutex::new(SessionState::default()),
            out: Outbox {
                tx,
                stuck: stuck.clone(),
                bytes: Arc::new(AtomicUsize::new(0)),
                user_bytes: slot.queue_bytes.clone(),
                limits: (
                    self.cfg.queue,
                    self.cfg.queue_bytes,
                    self.cfg.queue_bytes_per_user,
                    info.uid,
                ),
            },
        });
        lock(&self.sessions).insert(info.id, session.clone());
        let (finish, mut finished) = oneshot::channel::<()>();
        let writer = tokio::spawn(async move {
            use tokio::io::AsyncWriteExt;
            loop {
                tokio::select! {
                    f = rx.recv() => match f {
                        Some(f) => {
                            if wr.write_all(&f.frame).await.is_err() {
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
                    if wr.write_all(&f.frame).await.is_err() {
                        return;
                    }
                }
            };
            let _ = tokio::time::timeout(Duration::from_millis(100), rest).await;
        });
        let hello_by = tokio::time::Instant::now() + self.cfg.hello_timeout;
        let mut greeted = false;
        let why = loop {
            tokio::select! {
                m = read_frame::<ClientMsg, _>(&mut rd) => match m {
                    // The first message says which protocol the client speaks; nothing else
                    // runs before it.
                    Ok(m) if !greeted => match m.op {
                        Op::Hello { version, .. } => {
                            self.on_request(&session, m).await;
                            if version != VERSION {
                                break "protocol error: no hello of this version first".to_string();
                            }
                            greeted = true;
                            info!(session = info.id, uid = info.uid, pid = ?info.pid, "client attached");
                        }
                        _ => {
                            let why = "protocol error: a request before hello".to_string();
                            Self::reply(&session, m.seq, WireResult::Refused { why: why.clone() });
                            break why;
                        }
                    },
                    Ok(m) => self.on_request(&session, m).await,
                    Err(FrameError::Io(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                        break "closed".to_string();
                    }
                    Err(e) => break format!("protocol error: {e}"),
                },
                () = stuck.notify.notified() => {
                    break stuck.why.get().cloned().unwrap_or_else(|| "stuck".to_string());
                }
                () = tokio::time::sleep_until(hello_by), if !greeted => {
                    let why = format!("no hello within {} ms", self.cfg.hello_timeout.as_millis());
                    Self::reply(&session, 0, WireResult::Refused { why: why.clone() });
                    break why;
                }
            }
        };
        let exited = info
            .pid
            .is_some_and(|p| !std::path::Path::new(&format!("/proc/{p}")).exists());
        // The end of a session that never said hello is logged within the rate limit.
        let suppressed = if greeted {
            Some(0)
        } else {
            lock(&self.log).ok()
        };
        if let Some(suppressed) = suppressed {
            info!(session = info.id, uid = info.uid, pid = ?info.pid, exited, why = %why,
                suppressed, "client gone");
        }
        self.end_session(&session).await;
        let _ = finish.send(());
        // A stuck client's writer is blocked in a write: it is dropped after the bound.
        let mut writer = writer;
        if tokio::time::timeout(Duration::from_millis(200), &mut writer)
            .await
            .is_err()
        {
            writer.abort();
        }
        drop(slot);
    }

    /// The end of a session: its connections disconnected (REJ while being set up), its
    /// pending requests rejected, its listeners removed, then the XRC hook.
    async fn end_session(&self, s: &Arc<Session>) {
        let (conns, listens, xrc, sidr_out) = {
            let mut st = s.lock();
            if st.closed {
                return;
            }
            st.closed = true;
            st.lap_sink = None;
            st.laps_held = 0;
            (
                std::mem::take(&mut st.conns),
                std::mem::take(&mut st.listens),
                std::mem::take(&mut st.xrc),
                std::mem::take(&mut st.sidr_out),
            )
        };
        // Its SIDR_REQs in flight: forgotten by the endpoint (no more retransmissions), their
        // tasks end.
        for &id in &sidr_out {
            self.cm.send(Command::SidrCancel {
                id: ibcm_mad::CommId(id),
            });
        }
        lock(&self.sidr_budgets).by_session.remove(&s.info.id);
        // The LAPs held for it are answered "rejected" first: the peer hears no later than
        // the DREQ.
        self.answer_held_laps(
            conns
                .iter()
                .filter(|(_, c)| c.lap.is_held())
                .map(|(id, _)| *id),
        );
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
            for sid in listens.keys().chain(xrc.iter()) {
                svc.remove(sid);
            }
        }
        for (&service_id, &token) in &listens {
            self.cm.send(Command::Unlisten {
                service_id: sid(service_id),
                token,
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

    /// Forwards a connection's REP and statuses to its session until it is gone.
    pub(super) fn watch(self: &Arc<Self>, s: Arc<Session>, conn: u32, slot: SlotRef) {
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
            // Set when the connection could not be journaled: the client heard it closed
            // with this error, and hears it gone with it.
            let mut refused: Option<ConnectionError> = None;
            loop {
                let st = slot.wait(|st| (*st != last).then(|| st.clone())).await;
                let gone = matches!(st, ConnStatus::Gone(_));
                match &refused {
                    None => {
                        // In the journal before the client hears of it; if it cannot be,
                        // the client never hears it established.
                        let status = match me.journal_note(&s, conn, &st) {
                            Ok(()) => st.clone(),
                            Err(why) => {
                                let e = ConnectionError::Refused(why);
                                let (reply, _) = oneshot::channel();
                                me.cm.send(Command::Disconnect {
                                    conn: ibcm_mad::CommId(conn),
                                    private_data: Vec::new(),
                                    reply,
                                });
                                refused = Some(e.clone());
                                ConnStatus::Closed(e)
                            }
                        };
                        let established = matches!(status, ConnStatus::Established);
                        let rtu_private_data = if established {
                            slot.rtu_private_data()
                        } else {
                            Vec::new()
                        };
                        s.out.push(&DaemonMsg::Status {
                            conn,
                            status: WireStatus::from_status(&status),
                            rtu_private_data,
                        });
                        if established {
                            me.told_established(&s, conn);
                        }
                    }
                    Some(e) if gone => s.out.push(&DaemonMsg::Status {
                        conn,
                        status: WireStatus::Gone(WireConnError::from_error(e)),
                        rtu_private_data: Vec::new(),
                    }),
                    Some(_) => {}
                }
                if gone {
                    s.lock().remove_conn(conn);
                    return;
                }
                last = st;
            }
        });
    }

    /// The client has been told `conn` is established: a LAP that arrived before is
    /// delivered now, after that status.
    fn told_established(&self, s: &Session, conn: u32) {
        let stashed = {
            let mut st = s.lock();
            let Some(c) = st.conns.get_mut(&conn) else {
                return;
            };
            c.established = true;
            match std::mem::take(&mut c.lap) {
                super::lap::HeldLap::Stashed(lap) => {
                    c.lap = super::lap::HeldLap::Delivered;
                    Some(lap)
                }
                other => {
                    c.lap = other;
                    None
                }
            }
        };
        if let Some(lap) = stashed {
            Self::deliver_lap(s, conn, &lap);
        }
    }

    /// Notes an established connection in the journal, forgets a closed one. An error says
    /// why an established connection could not be noted: it must not be reported
    /// established.
    fn journal_note(&self, s: &Session, conn: u32, st: &ConnStatus) -> Result<(), String> {
        let Some(j) = &self.journal else {
            return Ok(());
        };
        match st {
            ConnStatus::Established => {
                let entry = {
                    let st = s.lock();
                    let Some(c) = st.conns.get(&conn) else {
                        return Ok(());
                    };
                    let (Some((remote_comm_id, remote_qpn)), Some(peer)) = (c.remote, c.peer)
                    else {
                        return Ok(());
                    };
                    JournalEntry {
                        comm_id: conn,
                        remote_comm_id,
                        remote_qpn,
                        peer: WirePeer::from_peer(&peer),
                        xrc_tgt: false,
                    }
                };
                j.add(entry).map_err(|e| {
                    warn!(conn, error = %e, "connection refused: it cannot be journaled");
                    format!("the daemon's journal cannot note it ({e})")
                })
            }
            ConnStatus::Closed(_) | ConnStatus::Gone(_) => {
                j.remove(conn);
                Ok(())
            }
            ConnStatus::Connecting => Ok(()),
        }
    }

    /// The number of sessions now.
    pub fn sessions(&self) -> usize {
        lock(&self.sessions).len()
    }

    /// REQs the daemon rejected (REJ 3 "no resources") because their listener's backlog
    /// was full ([`ServerConfig::listen_backlog`]).
    pub fn backlog_rejects(&self) -> u64 {
        self.backlog_rejects.load(Ordering::Relaxed)
    }
}
