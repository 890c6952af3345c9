//! One attachment to `ibcmd` ([`Context`]): the library's tokio runtime, the [`Cm`] and
//! [`Node`] handles of `ibcm::rt::node::attach`, the connection handles the C side names by
//! number, and the tasks that turn what happens to them into events. Safe code; the FFI layer
//! (`crate::ffi`) calls it.
//!
//! A connection handle lives from its `CONNECT_REQUEST` event or `ibcm_connect` until its
//! final event is queued (`REJECTED`, `UNREACHABLE`, `CONNECT_ERROR`, `DISCONNECTED`): every
//! handle gets exactly one final event, whoever ends it.
//!
//! Here: the context, its handles' entries and the calls on connections; `events`: what
//! happens to the handles, as events (the final ones, a listener's requests, the tasks that
//! follow a connection); `sidr`: SIDR both ways and the counters; `xrc`: the XRC services and
//! the keeper's requests.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::net::IpAddr;
use std::os::fd::RawFd;
use std::path::Path;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use ibcm::proto::{AcceptParams, ConnectParams, ListenOptions, ReqInfo};
use ibcm::qp_attr::{qp_attr, Connection as QpConn, QpState, Side};
use ibcm::rt::node::{attach, Node};
use ibcm::rt::{Cm, Connection, Incoming, PendingConnection};
use ibcm_mad::{RejReason, Rep, Req, ReqTransport, ServiceId};
use tokio::runtime::Runtime;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::error::{Error, Result};
use crate::event::{Channel, Event};
use crate::ffi::types::ibcm_event_type::*;
use crate::ffi::types::ibcm_status::*;
use crate::ffi::types::{ibcm_port, ibcm_qp_attr};
use crate::params;

mod apm;
mod data;
mod events;
mod sidr;
mod xrc;

pub(crate) use apm::Answer;
use events::{pump, rejected_locally};
use sidr::sidr_rejected;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A connection handle's state.
enum Entry {
    /// `ibcm_connect` waiting for the REP, or `ibcm_sidr_query` for the SIDR_REP; `cancel`
    /// until ibcm_disconnect used it.
    Connecting { cancel: Option<oneshot::Sender<()>> },
    /// A REQ waiting for ibcm_accept / ibcm_reject.
    Incoming {
        inc: Box<Incoming>,
        req: Box<ReqInfo>,
    },
    /// `IBCM_CONNECT_MANUAL_RTU`: the REP is here, waiting for ibcm_establish / ibcm_reject.
    Pending(Box<PendingConnection>, Active),
    /// Accepted or established: the messages for the QP attributes.
    Open(Box<Open>),
    /// A SIDR_REQ waiting for ibcm_sidr_reply (or ibcm_reject); acknowledging its event
    /// unanswered rejects it.
    SidrIn(Box<Incoming>),
    /// A call on it (or, with auto RTU, the RTU) is in progress. `disconnect`: an
    /// `ibcm_disconnect` came meanwhile; it is carried out (with this DREQ private data)
    /// when the call is done.
    Busy { disconnect: Option<Vec<u8>> },
    /// Its final event is queued and not yet acknowledged: calls find it ended
    /// (`IBCM_ECLOSED`), the QP attributes of an accepted or established connection are
    /// still given (an application handling an earlier event may still need them). The
    /// handle is forgotten when the final event is acknowledged.
    Ended(Option<Box<Open>>),
}

struct Open {
    conn: Connection,
    req: Req,
    rep: Rep,
    side: Side,
    /// The active side's facts the REQ does not carry.
    active: Option<Active>,
    /// XRC SENDs sent on it (`ibcm_xrc_send`, the `sim` backend): the next one's PSN is the
    /// INI QP's `sq_psn` plus this.
    sent: u32,
    /// Its primary and alternate paths (`apm`).
    paths: apm::Paths,
    /// A LAP of the peer waiting for this side's answer (`IBCM_EVENT_LAP`).
    lap: apm::LapSlot,
    /// A LAP of this side waiting for its APR (`ibcm_load_alt_path`).
    lap_sent: bool,
}

impl Open {
    /// An accepted (passive) or established (active) connection with its REQ and REP.
    fn new(conn: Connection, req: Req, rep: Rep, side: Side, active: Option<Active>) -> Self {
        let paths = apm::Paths::of(&req, side, active.and_then(|a| a.alt_packet_life_time));
        Open {
            conn,
            req,
            rep,
            side,
            active,
            sent: 0,
            paths,
            lap: apm::LapSlot::None,
            lap_sent: false,
        }
    }
}

/// What the active side's QP attributes need beyond the REQ: the retry count asked for (an
/// XRC INI's REQ carries 0) and the path's packet life time; and where the peer is (for
/// the `sim` backend's XRC SENDs).
#[derive(Debug, Clone, Copy)]
struct Active {
    retry_count: u8,
    packet_life_time: u8,
    /// The packet life time of the alternate path's record (`IBCM_CONNECT_ALT_PATH`).
    alt_packet_life_time: Option<u8>,
    peer: ibcm::proto::PeerAddr,
}

impl Active {
    fn of(p: &ConnectParams) -> Self {
        Active {
            retry_count: p.retry_count.get(),
            packet_life_time: p.packet_life_time.get(),
            alt_packet_life_time: None,
            peer: p.peer,
        }
    }
}

/// Why every call fails once the node service connection is gone.
fn gone() -> Error {
    Error::new(IBCM_EGONE, "the node service connection is gone")
}

/// The next connection handle: handles are unique in the process, whatever the context
/// (a runtime with several contexts may key one table by handle).
static NEXT_HANDLE: AtomicU64 = AtomicU64::new(1);

/// What the runtime's tasks and the calls share.
pub(crate) struct Shared {
    pub(crate) events: Channel,
    conns: Mutex<HashMap<u64, Entry>>,
    /// The application's context pointer of each handle that has one (`ibcm_conn_param`'s
    /// `context`, the listener's, `ibcm_set_context`), copied into each of its events.
    /// Locked after `conns` when both are.
    user: Mutex<HashMap<u64, usize>>,
    /// Whether this context answers its LAPs (ibcm_lap_policy): the connections' tasks take
    /// their LAPs while it is `true`.
    lap_policy: tokio::sync::watch::Sender<bool>,
    /// The LAPs delivered so far (each LAP event's number).
    laps: AtomicU64,
}

struct ListenerTask {
    stop: oneshot::Sender<()>,
    task: JoinHandle<()>,
}

/// One attachment (`struct ibcm_ctx`).
pub(crate) struct Context {
    rt: Option<Runtime>,
    pub(crate) shared: Arc<Shared>,
    cm: Cm,
    node: Node,
    listeners: Mutex<HashMap<u64, ListenerTask>>,
    /// The XRC services `ibcm_xrc_listen` set up (for `ibcm_xrc_unlisten`'s `IBCM_ENOENT`).
    xrc_services: Mutex<HashSet<u64>>,
    /// The process that opened it: in a `fork()` child the context is the parent's.
    pid: u32,
    /// The socket to the daemon (closed in a `fork()` child by `crate::ffi::fork`).
    socket_fd: RawFd,
    /// The `sim` backend's data path: the socket XRC SENDs leave by, once one was sent;
    /// its lock orders the SENDs (one PSN sequence per connection).
    data_sock: Mutex<Option<Arc<ibcm::rt::UdpTransport>>>,
}

fn transport_code(t: ReqTransport) -> u32 {
    match t {
        ReqTransport::Rc => 0,
        ReqTransport::Uc => 1,
        ReqTransport::Xrc => 2,
        ReqTransport::Other => 3,
    }
}

/// Which entry a call found.
enum Taken {
    Incoming(Box<Incoming>, Box<ReqInfo>),
    Pending(Box<PendingConnection>, Active),
    SidrIn(Box<Incoming>),
}

impl Context {
    /// Attaches to the daemon at `path`.
    pub(crate) fn open(path: &Path) -> Result<Context> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("ibcm")
            .enable_all()
            .build()
            .map_err(|e| Error::new(IBCM_EIO, format!("cannot start the library's thread: {e}")))?;
        let events = Channel::new()
            .map_err(|e| Error::new(IBCM_EIO, format!("cannot create the event fd: {e}")))?;
        let a = rt
            .block_on(attach(path))
            .map_err(|e| Error::new(IBCM_EATTACH, format!("{}: {e}", path.display())))?;
        let shared = Arc::new(Shared {
            events,
            conns: Mutex::new(HashMap::new()),
            user: Mutex::new(HashMap::new()),
            lap_policy: tokio::sync::watch::Sender::new(false),
            laps: AtomicU64::new(0),
        });
        let s = shared.clone();
        let task = a.task;
        rt.spawn(async move {
            let why = match task.await {
                Ok(Ok(())) => "the node service connection was closed".to_string(),
                Ok(Err(e)) => format!("the node service connection is lost: {e}"),
                Err(e) => format!("the node service client stopped: {e}"),
            };
            s.service_gone(why);
        });
        let (s, node) = (shared.clone(), a.node.clone());
        rt.spawn(async move {
            while let Some(line) = node.xrc_event().await {
                s.events.push(Event::xrc(line));
            }
        });
        // The keeper's events for this client: a TGT QP it created or registered on is gone.
        let (s, node) = (shared.clone(), a.node.clone());
        rt.spawn(async move {
            while let Some(v) = node.keeper_event().await {
                if let Some(ev) = Event::keeper(&v) {
                    s.events.push(ev);
                }
            }
        });
        Ok(Context {
            rt: Some(rt),
            shared,
            cm: a.cm,
            node: a.node,
            listeners: Mutex::new(HashMap::new()),
            xrc_services: Mutex::new(HashSet::new()),
            pid: std::process::id(),
            socket_fd: a.socket_fd,
            data_sock: Mutex::new(None),
        })
    }

    /// The descriptor of the socket to the daemon.
    pub(crate) fn socket_fd(&self) -> RawFd {
        self.socket_fd
    }

    /// Whether this process is a `fork()` child of the one that opened the context: then the
    /// context is the parent's, and nothing of it may be touched (its thread is not here; a
    /// lock may have been held at the fork).
    pub(crate) fn forked(&self) -> bool {
        std::process::id() != self.pid
    }

    /// `IBCM_EGONE` in a child that inherited this context through `fork()` (its calls must
    /// touch nothing of the parent's).
    pub(crate) fn not_forked(&self) -> Result<()> {
        if self.forked() {
            return Err(Error::new(
                IBCM_EGONE,
                "this context is the parent process's (inherited through fork): \
                 open one of this process's own",
            ));
        }
        Ok(())
    }

    /// `IBCM_EGONE` in a `fork()` child and once the node service connection is gone.
    pub(crate) fn live(&self) -> Result<()> {
        self.not_forked()?;
        if self.shared.events.is_closed() {
            return Err(gone());
        }
        Ok(())
    }

    fn block_on<F: Future>(&self, f: F) -> Result<F::Output> {
        match &self.rt {
            Some(rt) => Ok(rt.block_on(f)),
            None => Err(Error::new(IBCM_EGONE, "the context is closed")),
        }
    }

    fn spawn<F: Future<Output = ()> + Send + 'static>(&self, f: F) -> Result<()> {
        match &self.rt {
            Some(rt) => {
                rt.spawn(f);
                Ok(())
            }
            None => Err(Error::new(IBCM_EGONE, "the context is closed")),
        }
    }

    /// Listens on `sid` (RC and UC REQs, and SIDR_REQs; XRC targets are ibcm_xrc_listen's);
    /// each request's handle gets `context`.
    pub(crate) fn listen(&self, sid: u64, context: usize) -> Result<()> {
        self.live()?;
        let mut ls = lock(&self.listeners);
        if ls.contains_key(&sid) {
            return Err(Error::new(
                IBCM_EREFUSED,
                format!("this context listens on {} already", ServiceId(sid)),
            ));
        }
        let opts = ListenOptions {
            transports: vec![ReqTransport::Rc, ReqTransport::Uc],
        };
        let listener = self.block_on(self.cm.listen(ServiceId(sid), opts))??;
        let (stop, rx) = oneshot::channel();
        let Some(rt) = &self.rt else {
            return Err(Error::new(IBCM_EGONE, "the context is closed"));
        };
        let task = rt.spawn(pump(self.shared.clone(), listener, rx, context));
        ls.insert(sid, ListenerTask { stop, task });
        Ok(())
    }

    /// Stops listening on `sid`; the daemon has been told when this returns.
    pub(crate) fn unlisten(&self, sid: u64) -> Result<()> {
        self.live()?;
        let t = lock(&self.listeners).remove(&sid).ok_or_else(|| {
            Error::new(IBCM_ENOENT, format!("not listening on {}", ServiceId(sid)))
        })?;
        let _ = t.stop.send(());
        // The task drops the listener (its unlisten goes out) as it ends.
        let _ = self.block_on(t.task)?;
        Ok(())
    }

    /// The IP address of the daemon's CM, when it said (an rdma_cm CMA header's source).
    pub(crate) fn daemon_ip(&self) -> Option<IpAddr> {
        self.node.daemon_addr()
    }

    /// Starts a connection whose handle gets `context`; its events follow. A "lid:" or
    /// "gid:" peer's path is asked of the daemon first, on the library's thread: one that
    /// cannot be had ends the handle with `CONNECT_ERROR`.
    pub(crate) fn connect(&self, c: params::Connect, context: usize) -> Result<u64> {
        self.live()?;
        let params::Connect {
            mut params,
            manual,
            path,
            alternate,
        } = c;
        if alternate && !self.node.serves_path_migration() {
            return Err(Error::new(
                IBCM_EUNSUPPORTED,
                "IBCM_CONNECT_ALT_PATH: the node service does not resolve alternate paths \
                 (an ibcmd that predates path migration)",
            ));
        }
        // The daemon's CM reaches peers of its own address family only: another would
        // never answer (an IPv6 peer through an IPv4 daemon timed out silently).
        if let (Some(daemon), Some(peer), None) = (self.node.daemon_addr(), params.peer.ip(), path)
        {
            if daemon.is_ipv4() != peer.is_ipv4() {
                let family = |ip: std::net::IpAddr| if ip.is_ipv4() { "IPv4" } else { "IPv6" };
                return Err(Error::new(
                    IBCM_EINVAL,
                    format!(
                        "peer {peer} is an {} address; the node service's CM is on {daemon} \
                         ({}), which cannot reach it",
                        family(peer),
                        family(daemon)
                    ),
                ));
            }
        }
        let (cm, s) = (self.cm.clone(), self.shared.clone());
        self.start(context, move |h, mut cancelled| async move {
            let mut alt_life = None;
            if let Some(to) = path {
                let resolve = async {
                    if alternate {
                        cm.resolve_path_with_alternate(to).await
                    } else {
                        cm.resolve_path(to).await.map(|rec| (rec, None))
                    }
                };
                let rec = tokio::select! {
                    r = resolve => r,
                    Ok(()) = &mut cancelled => return s.cancelled(h),
                };
                match rec {
                    Ok((rec, alt)) => {
                        params::apply_path(&mut params, &rec);
                        if let Some(alt) = alt {
                            params::apply_alternate(&mut params, &alt);
                            alt_life = Some(alt.packet_life_time);
                        }
                    }
                    Err(e) => return s.path_failed(h, to, e),
                }
            }
            let active = Active {
                alt_packet_life_time: alt_life,
                ..Active::of(&params)
            };
            let r = tokio::select! {
                r = cm.connect_manual(params) => Some(r),
                Ok(()) = &mut cancelled => None,
            };
            s.connected(h, r, manual, active).await;
        })
    }

    /// A new handle with `context`, waiting for an answer (`Entry::Connecting`, cancelled by
    /// ibcm_disconnect through the receiver its task gets), and that task started on the
    /// library's thread; the handle is forgotten if the task cannot start.
    fn start<F: Future<Output = ()> + Send + 'static>(
        &self,
        context: usize,
        task: impl FnOnce(u64, oneshot::Receiver<()>) -> F,
    ) -> Result<u64> {
        let h = self.shared.new_handle(context);
        let (cancel, cancelled) = oneshot::channel();
        lock(&self.shared.conns).insert(
            h,
            Entry::Connecting {
                cancel: Some(cancel),
            },
        );
        if let Err(e) = self.spawn(task(h, cancelled)) {
            self.shared.forget(h);
            return Err(e);
        }
        Ok(h)
    }

    /// Sets the context pointer of handle `h`: its next events carry it.
    pub(crate) fn set_context(&self, h: u64, context: usize) -> Result<()> {
        self.not_forked()?;
        let conns = lock(&self.shared.conns);
        if !conns.contains_key(&h) {
            return Err(Self::unknown(h));
        }
        let mut user = lock(&self.shared.user);
        if context == 0 {
            user.remove(&h);
        } else {
            user.insert(h, context);
        }
        Ok(())
    }

    fn unknown(h: u64) -> Error {
        Error::new(IBCM_ENOENT, format!("no connection {h}"))
    }

    fn ended(h: u64) -> Error {
        Error::new(
            IBCM_ECLOSED,
            format!("connection {h} has ended (its final event says why)"),
        )
    }

    /// Takes the REQ or pending REP of `h`, leaving it busy.
    fn take(&self, h: u64, op: &str) -> Result<Taken> {
        self.live()?;
        let mut conns = lock(&self.shared.conns);
        let e = conns.get_mut(&h).ok_or_else(|| Self::unknown(h))?;
        match std::mem::replace(e, Entry::Busy { disconnect: None }) {
            Entry::Incoming { inc, req } => Ok(Taken::Incoming(inc, req)),
            Entry::Pending(p, a) => Ok(Taken::Pending(p, a)),
            Entry::SidrIn(inc) => Ok(Taken::SidrIn(inc)),
            busy @ Entry::Busy { .. } => {
                *e = busy;
                Err(Error::new(IBCM_EBUSY, format!("connection {h} is busy")))
            }
            ended @ Entry::Ended(_) => {
                *e = ended;
                Err(Self::ended(h))
            }
            other => {
                *e = other;
                Err(Error::new(
                    IBCM_ESTATE,
                    format!("{op}: connection {h} has no request or response to answer"),
                ))
            }
        }
    }

    /// Puts back what [`Context::take`] took; an `ibcm_disconnect` that came meanwhile
    /// rejects it now. Dropped (its REQ or REP rejected) when the handle ended meanwhile.
    fn put_back(&self, h: u64, t: Taken) {
        let mut conns = lock(&self.shared.conns);
        let Some(Entry::Busy { disconnect }) = conns.get_mut(&h) else {
            return;
        };
        if disconnect.take().is_some() {
            drop(conns);
            let _ = self.reject_later(h, t);
            return;
        }
        let e = match t {
            Taken::Incoming(inc, req) => Entry::Incoming { inc, req },
            Taken::Pending(p, a) => Entry::Pending(p, a),
            Taken::SidrIn(inc) => Entry::SidrIn(inc),
        };
        conns.insert(h, e);
    }

    /// Puts `t` back and fails with `IBCM_ESTATE`: `op` does not apply to what `h` is.
    fn wrong(&self, h: u64, t: Taken, op: &str) -> Error {
        let what = match &t {
            Taken::Incoming(..) => "a passive connection (CONNECT_REQUEST)",
            Taken::Pending(..) => "an active connection (CONNECT_RESPONSE)",
            Taken::SidrIn(_) => "a SIDR request (answer it with ibcm_sidr_reply)",
        };
        self.put_back(h, t);
        Error::new(IBCM_ESTATE, format!("{op} on {what}"))
    }

    /// Rejects (reason 28) the REQ or REP taken from `h` without waiting for the daemon's
    /// answer; the handle's final event follows.
    fn reject_later(&self, h: u64, t: Taken) -> Result<()> {
        let s = self.shared.clone();
        self.spawn(async move {
            let reason = RejReason::ConsumerReject;
            // Refused only when the REQ or REP is gone already: it ends either way.
            let _ = match t {
                Taken::Incoming(inc, _) => inc.reject(reason, &[], &[]).await,
                Taken::Pending(p, _) => p.reject(reason, &[], &[]).await,
                Taken::SidrIn(inc) => {
                    // Answered "rejected"; a SIDR handle has no final event.
                    let _ = inc.sidr_reply(sidr_rejected()).await;
                    s.forget(h);
                    return;
                }
            };
            s.finish(h, rejected_locally(h, reason));
        })
    }

    /// Accepts the REQ of `h` (sends the REP) without waiting for the daemon: `ESTABLISHED`
    /// follows on the RTU; a refusal of the daemon (a QPN in use, …) rejects the REQ and
    /// ends the handle with `CONNECT_ERROR`.
    pub(crate) fn accept(&self, h: u64, params: AcceptParams) -> Result<()> {
        let (inc, req) = match self.take(h, "ibcm_accept")? {
            Taken::Incoming(inc, req) => (inc, req),
            t => return Err(self.wrong(h, t, "ibcm_accept")),
        };
        let rep = params.rep_fields();
        let s = self.shared.clone();
        self.spawn(async move {
            match inc.accept(params).await {
                Ok(conn) => {
                    let open = Open::new(conn, req.req, rep, Side::Passive, None);
                    s.opened(h, open, false);
                }
                Err(e) => {
                    let e = Error::from(e);
                    let mut ev = Event::new(IBCM_EVENT_CONNECT_ERROR, h);
                    ev.status = e.code;
                    ev.reason = format!("accept refused (the REQ was rejected): {}", e.msg);
                    s.finish(h, ev);
                }
            }
        })
    }

    /// Rejects the REQ or the REP of `h`.
    pub(crate) fn reject(&self, h: u64, reason: u16, private_data: &[u8]) -> Result<()> {
        let reason = RejReason::from_raw(reason);
        let r = match self.take(h, "ibcm_reject")? {
            Taken::Incoming(inc, _) => self.block_on(inc.reject(reason, &[], private_data))?,
            Taken::Pending(p, _) => self.block_on(p.reject(reason, &[], private_data))?,
            Taken::SidrIn(inc) => {
                let mut rep = sidr_rejected();
                rep.private_data = private_data.to_vec();
                let r = self.block_on(inc.sidr_reply(rep))?;
                self.shared.forget(h);
                return r.map_err(Error::from);
            }
        };
        self.shared.finish(h, rejected_locally(h, reason));
        r.map_err(Error::from)
    }

    /// Sends an MRA for the REQ of `h` (passive side), its REP (active side, manual RTU) or
    /// the LAP waiting for this side's answer: the answer will take up to 4.096 µs ×
    /// 2^`timeout`. The REQ, REP or LAP stays to be answered.
    pub(crate) fn mra(&self, h: u64, timeout: u8) -> Result<()> {
        let t = ibcm_mad::TimeoutExp::new(timeout).ok_or_else(|| {
            Error::new(
                IBCM_EINVAL,
                format!("service timeout {timeout} is above 31"),
            )
        })?;
        if let Some(r) = self.lap_mra(h, t) {
            return r;
        }
        let taken = self.take(h, "ibcm_mra")?;
        let r = match &taken {
            Taken::Incoming(inc, _) => self.block_on(inc.mra(t)),
            Taken::Pending(p, _) => self.block_on(p.mra(t)),
            Taken::SidrIn(_) => return Err(self.wrong(h, taken, "ibcm_mra")),
        };
        self.put_back(h, taken);
        Ok(r??)
    }

    /// Sends the RTU of `h` (`IBCM_CONNECT_MANUAL_RTU`).
    pub(crate) fn establish(&self, h: u64, private_data: Vec<u8>) -> Result<()> {
        let (p, active) = match self.take(h, "ibcm_establish")? {
            Taken::Pending(p, a) => (p, a),
            t => return Err(self.wrong(h, t, "ibcm_establish")),
        };
        let s = self.shared.clone();
        self.block_on(async move { s.establish_pending(h, *p, active, private_data).await })?
    }

    /// Ends `h`: a DREQ when established (REJ while being set up); its final event follows.
    /// While another call (or the auto RTU) is in progress on `h`, the disconnect is queued
    /// and carried out when it is done.
    pub(crate) fn disconnect(&self, h: u64, private_data: Vec<u8>) -> Result<()> {
        self.live()?;
        let mut conns = lock(&self.shared.conns);
        match conns.get_mut(&h).ok_or_else(|| Self::unknown(h))? {
            Entry::Connecting { cancel } => {
                if let Some(c) = cancel.take() {
                    let _ = c.send(());
                }
                Ok(())
            }
            Entry::Open(o) => {
                let conn = o.conn.clone();
                drop(conns);
                self.spawn(async move {
                    conn.disconnect(&private_data).await;
                })
            }
            Entry::Busy { disconnect } => {
                if disconnect.is_none() {
                    *disconnect = Some(private_data);
                }
                Ok(())
            }
            Entry::Ended(_) => Err(Self::ended(h)),
            Entry::Incoming { .. } | Entry::Pending(..) | Entry::SidrIn(_) => {
                drop(conns);
                // A REJ (consumer reject; a SIDR_REP "rejected"), sent without waiting for
                // the daemon's answer.
                let t = self.take(h, "ibcm_disconnect")?;
                self.reject_later(h, t)
            }
        }
    }

    /// The QP attributes of `h` for `state`; a passive side before ibcm_accept gives the
    /// accept parameters it will use.
    pub(crate) fn qp_attr(
        &self,
        h: u64,
        state: u32,
        port: Option<&ibcm_port>,
        accept: Option<AcceptParams>,
    ) -> Result<(ibcm_qp_attr, i32)> {
        let state = match state {
            1 => QpState::Init,
            2 => QpState::Rtr,
            3 => QpState::Rts,
            s => {
                return Err(Error::new(
                    IBCM_EINVAL,
                    format!("QP state {s} (1 INIT, 2 RTR, 3 RTS)"),
                ))
            }
        };
        self.live()?;
        let (port, link) = params::local_port(port)?;
        let conns = lock(&self.shared.conns);
        let (req, rep, side, active) = match conns.get(&h).ok_or_else(|| Self::unknown(h))? {
            Entry::Open(o) | Entry::Ended(Some(o)) => (o.req, o.rep, o.side, o.active),
            Entry::Ended(None) => return Err(Self::ended(h)),
            Entry::Pending(p, a) => (*p.req(), p.rep().rep, Side::Active, Some(*a)),
            Entry::Incoming { req, .. } => match accept {
                Some(a) => (req.req, a.rep_fields(), Side::Passive, None),
                None => {
                    return Err(Error::new(
                        IBCM_EINVAL,
                        "before ibcm_accept the QP attributes need the accept parameters",
                    ))
                }
            },
            Entry::Connecting { .. } => {
                return Err(Error::new(
                    IBCM_ESTATE,
                    "no REP yet: wait for CONNECT_RESPONSE",
                ))
            }
            Entry::SidrIn(_) => {
                return Err(Error::new(
                    IBCM_ESTATE,
                    "a SIDR request has no connected QP",
                ))
            }
            Entry::Busy { .. } => {
                return Err(Error::new(IBCM_EBUSY, format!("connection {h} is busy")))
            }
        };
        drop(conns);
        let mut c = QpConn::new(&req, &rep, side, link, port);
        if let Some(a) = active {
            c.retry_count = Some(a.retry_count);
            c.packet_life_time = Some(a.packet_life_time);
            c.alt_packet_life_time = a.alt_packet_life_time;
        }
        let (a, m) = qp_attr(&c, state).map_err(|e| Error::new(IBCM_EINVAL, e.to_string()))?;
        let t = c
            .qp_type()
            .ok_or_else(|| Error::new(IBCM_EINVAL, "the REQ's transport has no connected QP"))?;
        Ok(params::qp_attr_c(&a, m, t))
    }

    /// The next event, waiting up to `timeout` (`Some(ZERO)`: not at all); `IBCM_EAGAIN`
    /// when none came, `IBCM_EGONE` once the node service connection is gone and its events
    /// are taken (at once, also for a wait that was blocked then).
    pub(crate) fn wait(&self, timeout: Option<Duration>) -> Result<Event> {
        self.not_forked()?;
        let r = match timeout {
            Some(Duration::ZERO) => self.shared.events.try_pop(),
            t => self.shared.events.wait(t),
        };
        match r {
            Ok(Some(ev)) => Ok(ev),
            Ok(None) => Err(Error::new(IBCM_EAGAIN, "no event queued")),
            Err(crate::event::Gone) => Err(gone()),
        }
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        // The runtime's tasks own the daemon's socket: shutting it down closes the socket,
        // and the daemon ends this client's connections (DREQ, REJ) and listeners.
        lock(&self.listeners).clear();
        lock(&self.shared.conns).clear();
        if let Some(rt) = self.rt.take() {
            rt.shutdown_timeout(Duration::from_secs(1));
        }
    }
}
