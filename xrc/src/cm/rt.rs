//! [`XrcServer`]: the XRC target on ibcm's tokio runtime — an XRC-aware accept loop on an
//! [`ibcm::rt::Listener`].
//!
//! The async API hides the endpoint, so the server drives the same [`XrcTarget`] through
//! the handles instead, with three differences from the sans-IO coupling:
//!
//! * `Incoming` reveals the connection's ID only once accepted, so the registry binds the
//!   REQ under a provisional key and is re-keyed after the accept ([`XrcTarget::rekey`]);
//!   requests are therefore answered one at a time.
//! * A connection whose TGT QP goes away before its RTU arrived cannot be rejected through
//!   the async API (a `Connection` only disconnects, which sends REJ 28); the server waits
//!   for it to be established and then sends the DREQ with the [`TargetGone`]
//!   block. If the RTU never comes, the REP times out as usual.
//! * The endpoint's quarantine end is not visible: a closed connection's TGT QPN is noted
//!   in TimeWait for the TimeWait it was accepted with (at least as long as the endpoint's).
//! * If the endpoint refuses the accept (a newly created QP's number in its own TimeWait
//!   quarantine), the REQ cannot be rejected any more through the consumed `Incoming`; the
//!   initiator's REQ times out.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! use ibcm::proto::EndpointConfig;
//! use ibcm::rt::{Cm, CmError, MemNetwork};
//! use ibcm_mad::{Guid, Qpn, ServiceId};
//! use ibcm_xrc::cm::rt::XrcServer;
//! use ibcm_xrc::cm::{xrc_connect_params, IniOutcome, XrcService, XrcTarget, XrcTargetConfig};
//! use ibcm_xrc::verbs::model::{ModelConfig, KernelModel};
//! use ibcm_xrc::{DomainSpec, RegistryConfig, SrqNum, TgtRegistry, Verbs, XrcReqData};
//!
//! let net = MemNetwork::new();
//! let t_addr = "127.0.0.2:4791".parse::<std::net::SocketAddr>().unwrap().into();
//! let i_addr = "127.0.0.1:4791".parse::<std::net::SocketAddr>().unwrap().into();
//! let cfg = EndpointConfig { local_ca_guid: Guid(2), ..EndpointConfig::default() };
//! let (t_cm, _) = Cm::bind(net.transport(t_addr), cfg.clone());
//! let (i_cm, _) = Cm::bind(net.transport(i_addr), EndpointConfig::default());
//!
//! let kernel = KernelModel::new(ModelConfig::mlx5());
//! let mut reg = TgtRegistry::new(Box::new(kernel.spawn()), RegistryConfig::default());
//! let dom = reg.open_domain("job", DomainSpec::Private).unwrap();
//! let worker = kernel.spawn().process();
//! let server = XrcServer::new(t_cm, &cfg, XrcTarget::new(reg, XrcTargetConfig::default())).unwrap();
//! let sid = ServiceId(0x1000);
//! server
//!     .spawn_listener(sid, XrcService::new(dom, worker, vec![SrqNum::new(0x10).unwrap()]))
//!     .await
//!     .unwrap();
//!
//! let p = xrc_connect_params(t_addr, sid, Qpn::new(0x99).unwrap(), &XrcReqData::any(None), &[]).unwrap();
//! let conn = i_cm.connect(p).await.unwrap();
//! // The worker exits: its TGT QP (ProcessBound, the default) goes; the DREQ says why.
//! server.with_target(|t, now| t.registry_mut().process_exit(now, worker));
//! let why = IniOutcome::from_close(&conn.closed().await);
//! assert!(why.is_target_gone(), "{why}");
//! // A reconnect naming the gone QP gets REJ 1 "target gone".
//! let qpn = match why { IniOutcome::TargetGone { qpn, .. } => qpn.unwrap(), _ => unreachable!() };
//! let p = xrc_connect_params(t_addr, sid, Qpn::new(0x9a).unwrap(), &XrcReqData::attach(qpn), &[]).unwrap();
//! match i_cm.connect(p).await {
//!     Err(CmError::Connection(e)) => assert!(IniOutcome::from_close(&e).is_target_gone()),
//!     other => panic!("{other:?}"),
//! }
//! # }
//! ```

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::Instant;

use ibcm::proto::{CallError, ConnId, EndpointConfig, ListenOptions};
use ibcm::rt::{Cm, CmError, Connection, Incoming, Listener};
use ibcm_mad::{ReqTransport, ServiceId};
use tokio::runtime::{Handle, TryCurrentError};
use tokio::sync::Notify;
use tokio::task::JoinHandle;

use super::{passive_timewait, Teardown, TgtAnswer, XrcService, XrcTarget};
use ibcm_mad::xrc::TargetGone;

/// The key a REQ is bound under until the accept reveals its connection ID (never a real
/// local comm ID: ibcm does not allocate 0).
const PROVISIONAL: ConnId = ibcm_mad::CommId(0);

fn now() -> Instant {
    tokio::time::Instant::now().into_std()
}

/// Called with each [`TargetEvent`](super::TargetEvent) as it happens.
pub type ServerObserver = Box<dyn FnMut(Instant, super::TargetEvent) + Send>;

struct State {
    target: XrcTarget,
    observer: Option<ServerObserver>,
    /// Teardowns waiting for their connection to be established (then: DREQ).
    doomed: BTreeMap<ConnId, Teardown>,
}

struct Shared {
    cm: Cm,
    config: EndpointConfig,
    dreq_reason: bool,
    state: Mutex<State>,
    accept_lock: tokio::sync::Mutex<()>,
    wake: Arc<Notify>,
    handle: Handle,
    timer: Mutex<Option<JoinHandle<()>>>,
}

impl Drop for Shared {
    fn drop(&mut self) {
        let t = self
            .timer
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(t) = t {
            t.abort();
        }
    }
}

/// How [`XrcServer::handle`] dealt with a request.
#[derive(Debug)]
pub enum Handled {
    /// Accepted (the REP went out): the connection, still waiting for the RTU.
    Accepted(Connection),
    /// Rejected with this block.
    Rejected(TargetGone),
    /// Not an XRC REQ for a served service: the caller answers it.
    NotXrc(Incoming),
    /// The endpoint refused the answer (the REQ is gone, …).
    Failed(CmError),
}

/// An [`XrcTarget`] serving XRC REQs that arrive on ibcm's async API (module docs).
/// Cloning shares it.
#[derive(Clone)]
pub struct XrcServer {
    shared: Arc<Shared>,
}

impl fmt::Debug for XrcServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("XrcServer").finish_non_exhaustive()
    }
}

impl XrcServer {
    /// A server answering through `cm` (whose endpoint runs with `config`: its TimeWait
    /// settings are used), deciding with `target`. Starts the task that fires the registry's
    /// quarantine timers; it ends when the last clone is dropped.
    ///
    /// # Errors
    /// When not called inside a tokio runtime.
    pub fn new(
        cm: Cm,
        config: &EndpointConfig,
        target: XrcTarget,
    ) -> Result<Self, TryCurrentError> {
        let handle = Handle::try_current()?;
        let wake = Arc::new(Notify::new());
        let shared = Arc::new(Shared {
            cm,
            config: config.clone(),
            dreq_reason: target.config().dreq_reason,
            state: Mutex::new(State {
                target,
                observer: None,
                doomed: BTreeMap::new(),
            }),
            accept_lock: tokio::sync::Mutex::new(()),
            wake: wake.clone(),
            handle: handle.clone(),
            timer: Mutex::new(None),
        });
        let task = handle.spawn(timer(Arc::downgrade(&shared), wake));
        *shared.timer.lock().unwrap_or_else(PoisonError::into_inner) = Some(task);
        Ok(Self { shared })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.shared
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Runs `f` on the target at the current time (destroy a QP, report a process exit,
    /// close a domain, read events…), then sends the DREQs that follow and re-arms the
    /// quarantine timer.
    pub fn with_target<R>(&self, f: impl FnOnce(&mut XrcTarget, Instant) -> R) -> R {
        let mut st = self.lock();
        let r = f(&mut st.target, now());
        self.flush(&mut st);
        r
    }

    /// The next [`TargetEvent`](super::TargetEvent).
    pub fn poll_event(&self) -> Option<super::TargetEvent> {
        self.with_target(|t, _| t.poll_event())
    }

    /// The keeper holding the registry's handles died; see [`XrcTarget::keeper_crash`].
    pub fn keeper_crash(&self, restarted: crate::TgtRegistry<ConnId>) {
        self.with_target(|t, now| t.keeper_crash(now, restarted));
    }

    /// Hands every [`TargetEvent`](super::TargetEvent) to `f` as it happens (instead of
    /// leaving them for [`XrcServer::poll_event`]).
    pub fn set_observer(&self, f: ServerObserver) {
        self.lock().observer = Some(f);
    }

    fn flush(&self, st: &mut State) {
        while let Some(t) = st.target.poll_teardown() {
            if st.target.is_established(t.conn) {
                self.spawn_dreq(t);
            } else if st.target.conn_qpn(t.conn).is_some() {
                st.doomed.insert(t.conn, t);
            }
        }
        if let Some(f) = st.observer.as_mut() {
            let now = now();
            while let Some(e) = st.target.poll_event() {
                f(now, e);
            }
        }
        self.shared.wake.notify_one();
    }

    fn spawn_dreq(&self, t: Teardown) {
        if let Some(conn) = self.shared.cm.connection(t.conn) {
            let reason = if self.shared.dreq_reason {
                t.info().to_bytes().to_vec()
            } else {
                Vec::new()
            };
            self.shared.handle.spawn(async move {
                conn.disconnect(&reason).await;
            });
        }
    }

    /// Listens on `service_id` for XRC REQs and answers them as `service` in a new task.
    ///
    /// # Errors
    /// [`CmError::DriverGone`].
    pub async fn spawn_listener(
        &self,
        service_id: ServiceId,
        service: XrcService,
    ) -> Result<JoinHandle<()>, CmError> {
        let listener = self
            .shared
            .cm
            .listen(
                service_id,
                ListenOptions {
                    transports: vec![ReqTransport::Xrc],
                },
            )
            .await?;
        self.with_target(|t, _| t.serve(service_id, service));
        let me = self.clone();
        Ok(self
            .shared
            .handle
            .spawn(async move { me.serve(listener).await }))
    }

    /// Answers every request of `listener` until it ends; requests that are not XRC REQs for
    /// a served service are rejected (dropped).
    pub async fn serve(&self, mut listener: Listener) {
        while let Some(incoming) = listener.next().await {
            if let Handled::NotXrc(inc) = self.handle(incoming).await {
                drop(inc);
            }
        }
    }

    /// Answers one request (module docs).
    pub async fn handle(&self, incoming: Incoming) -> Handled {
        let _one_at_a_time = self.shared.accept_lock.lock().await;
        let answer = match incoming.request() {
            Some(req) => {
                let tw = passive_timewait(&self.shared.config, req);
                let mut st = self.lock();
                st.target.on_request(now(), PROVISIONAL, req, tw)
            }
            None => None,
        };
        let Some(answer) = answer else {
            return Handled::NotXrc(incoming);
        };
        match answer {
            TgtAnswer::Reject { reason, info } => {
                let b = info.to_bytes();
                self.with_target(|_, _| ());
                match incoming.reject(reason, &b, &b).await {
                    Ok(()) => Handled::Rejected(info),
                    Err(e) => Handled::Failed(e),
                }
            }
            TgtAnswer::Accept { params, .. } => match incoming.accept(params).await {
                Ok(conn) => {
                    let id = conn.id();
                    {
                        let mut st = self.lock();
                        st.target.rekey(PROVISIONAL, id);
                        if let Some(mut t) = st.doomed.remove(&PROVISIONAL) {
                            t.conn = id;
                            st.doomed.insert(id, t);
                        }
                        self.flush(&mut st);
                    }
                    self.watch(conn.clone());
                    Handled::Accepted(conn)
                }
                Err(e) => {
                    let err = match &e {
                        CmError::Call(c) => c.clone(),
                        _ => CallError::UnknownConnection(PROVISIONAL),
                    };
                    self.with_target(|t, now| t.accept_failed(now, PROVISIONAL, err));
                    self.lock().doomed.remove(&PROVISIONAL);
                    Handled::Failed(e)
                }
            },
        }
    }

    /// Follows an accepted connection: established, closed.
    fn watch(&self, conn: Connection) {
        let weak = Arc::downgrade(&self.shared);
        self.shared.handle.spawn(async move {
            let id = conn.id();
            if conn.established().await.is_ok() {
                let Some(shared) = weak.upgrade() else {
                    return;
                };
                let me = XrcServer { shared };
                let doomed = {
                    let mut st = me.lock();
                    st.target.on_established(now(), id);
                    let d = st.doomed.remove(&id);
                    me.flush(&mut st);
                    d
                };
                if let Some(t) = doomed {
                    me.spawn_dreq(t);
                }
            }
            let err = conn.closed().await;
            let Some(shared) = weak.upgrade() else {
                return;
            };
            let me = XrcServer { shared };
            me.with_target(|t, now| {
                let until = t.timewait_of(id).and_then(|tw| now.checked_add(tw));
                t.on_closed(now, id, &err, until);
            });
            me.lock().doomed.remove(&id);
        });
    }
}

async fn timer(weak: Weak<Shared>, wake: Arc<Notify>) {
    loop {
        let next = match weak.upgrade() {
            Some(shared) => XrcServer { shared }.lock().target.poll_timeout(),
            None => return,
        };
        match next {
            Some(at) => {
                tokio::select! {
                    () = tokio::time::sleep_until(tokio::time::Instant::from_std(at)) => {
                        if let Some(shared) = weak.upgrade() {
                            XrcServer { shared }.with_target(|t, now| t.handle_timeout(now));
                        }
                    }
                    () = wake.notified() => {}
                }
            }
            None => wake.notified().await,
        }
    }
}
