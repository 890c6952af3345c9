//! The daemon's XRC target: [`XrcHooks`] serves clients' XRC services from one
//! [`XrcServer`] (the endpoint's app) and ends their holdings per policy when they go.
//!
//! Each client that serves XRC is a process of the verbs backend (the creator of the TGT
//! QPs its services create). Its services of the explicit, domain-bound and process-bound
//! policies create their QPs in a private XRC domain of the client's; its `Shared` services
//! in the daemon's shared domain, which no client's exit closes (a shared QP lives as long
//! as someone holds a registration on it: the OFED persistent server). When a client goes,
//! the registry hears "process exit" (ProcessBound QPs: released, "creator exited"; Shared:
//! the creator's registration dropped) and then its private domain is closed (DomainBound
//! QPs: released, "domain closed"). Its `Explicit` services create their QPs in a domain of
//! their own per user and service ID, which stays open when the client goes: its QPs are
//! kept there as orphans, which the next listener of that service of the same user adopts
//! (the same initiator's REQs attach to them again, the REPs naming the new client's SRQs),
//! or which the user (or root) reclaims ([`Op::XrcReclaim`]). When the daemon stops, every QP
//! still live is released as "keeper lost".
//!
//! The keeper: a client's [`Op::Keeper`] requests are served by a [`NodeKeeper`] on the same
//! registry, as the same process of the registry as its services (docs/xrc.md §8.5). Its
//! services may serve a keeper domain (`xrc-listen` with `domain`), and answer with one TGT
//! QP that processes registered on (`tgt_qpn`): their connections hold no registration and
//! outlive the serving client while the QP lives.
//!
//! Quotas: the connections the target accepts for a client's services count against the
//! client's and its user's connection quotas, the QPs they create (orphans included) against
//! the user's TGT QP quota; a REQ over one is rejected with REJ 3 "no resources"
//! ([`ServerConfig`]); `admission` decides that. `journal` journals the target's
//! connections as the daemon's others, for a restart.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};
use std::time::Instant;

use ibcm::proto::ConnId;
use ibcm::rt::node::proto::WireTgtQp;
#[cfg(doc)]
use ibcm::rt::node::{proto::Op, ServerConfig};
use ibcm::rt::node::{
    EventSink, HookFuture, JournalTx, NodeHooks, NodeServer, SessionInfo, XrcListenReq,
};
use ibcm_mad::ServiceId;
use ibcm_xrc::cm::rt::XrcServer;
use ibcm_xrc::cm::{TargetEvent, XrcService};
use ibcm_xrc::keeper::node::{EventFor, KeeperSession, NodeKeeper};
use ibcm_xrc::keeper::proto::{KeeperEvent, Request};
use ibcm_xrc::verbs::model::KernelModel;
use ibcm_xrc::{
    DomainId, DomainSpec, OwnershipPolicy, ProcessId, RegistryConfig, RegistryError, SrqNum,
    TgtRegistry, Verbs as _, VerbsError,
};
use tokio::sync::mpsc;
use tracing::{debug, info, warn};

mod admission;
mod data;
mod journal;

use admission::admission;
use data::SimData;
pub(crate) use data::QUEUE as DATA_QUEUE;
use journal::{journal_xrc, JournalNote};

/// A registry failure as a refusal's text: a device without XRC (or one whose provider does
/// not implement the verb) says so as the keeper does, "no-xrc: …", so that a client can tell
/// it from a refusal by rule (libibcm: `IBCM_EUNSUPPORTED`).
fn refusal(e: &RegistryError) -> String {
    match e {
        RegistryError::Verbs(VerbsError::NoXrc { .. } | VerbsError::NotSupported { .. }) => {
            format!("no-xrc: {e}")
        }
        _ => e.to_string(),
    }
}

/// A client's XRC side.
#[derive(Debug)]
struct Holder {
    process: ProcessId,
    /// Its private domain, once a non-shared service asked for one.
    domain: Option<DomainId>,
    /// Its services (their REPs name its SRQs).
    services: Vec<ServiceId>,
    /// The domains of its `Explicit` services (one per user and service ID).
    explicit: Vec<DomainId>,
    /// Its session of the keeper ([`Op::Keeper`]), once it used one: the same process.
    keeper: Option<KeeperSession>,
    /// Its services that answer with one TGT QP held by registrations (`tgt_qpn`): their
    /// connections belong to that QP, and stay while it lives.
    held: Vec<ServiceId>,
}

impl Holder {
    fn new(process: ProcessId) -> Self {
        Holder {
            process,
            domain: None,
            services: Vec::new(),
            explicit: Vec::new(),
            keeper: None,
            held: Vec::new(),
        }
    }
}

/// The name of the daemon's domain for `Shared` services.
const SHARED_DOMAIN: &str = "ibcmd-shared";

/// The prefix of the daemon's own domain names, which keeper clients may not open.
const OWN_DOMAINS: &str = "ibcmd-";

/// Where the target's events go: the session sink of each service, and each connection's
/// service; and what the quotas count.
#[derive(Default)]
struct Routes {
    sinks: HashMap<ServiceId, EventSink>,
    conns: HashMap<ConnId, ServiceId>,
    /// The session serving each service.
    owners: HashMap<ServiceId, SessionInfo>,
    /// The session each accepted connection counts for, until it closes.
    accepted: HashMap<ConnId, SessionInfo>,
    /// Accepted connections per session, and per uid.
    by_session: HashMap<u64, usize>,
    by_uid: HashMap<u32, usize>,
    /// The user of each client process (creators of TGT QPs; kept after the client goes,
    /// for its orphans).
    uids: HashMap<ProcessId, u32>,
    /// Where each keeper session's events go.
    keeper_sinks: BTreeMap<KeeperSession, EventSink>,
}

impl Routes {
    /// Hands the keeper's events to their sessions.
    fn keeper_events(&self, events: Vec<(EventFor, KeeperEvent)>) {
        for (to, ev) in events {
            let Ok(v) = serde_json::to_value(&ev) else {
                continue;
            };
            match to {
                EventFor::Session(s) => {
                    if let Some(sink) = self.keeper_sinks.get(&s) {
                        sink.keeper_event(v);
                    }
                }
                EventFor::All => {
                    for sink in self.keeper_sinks.values() {
                        sink.keeper_event(v.clone());
                    }
                }
            }
        }
    }
}

impl Routes {
    fn count(&mut self, conn: ConnId, info: SessionInfo) {
        if self.accepted.insert(conn, info).is_none() {
            *self.by_session.entry(info.id).or_insert(0) += 1;
            *self.by_uid.entry(info.uid).or_insert(0) += 1;
        }
    }

    fn uncount(&mut self, conn: ConnId) {
        let Some(info) = self.accepted.remove(&conn) else {
            return;
        };
        if let Some(n) = self.by_session.get_mut(&info.id) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.by_session.remove(&info.id);
            }
        }
        if let Some(n) = self.by_uid.get_mut(&info.uid) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.by_uid.remove(&info.uid);
            }
        }
    }
}

/// [`NodeHooks`] over an [`XrcServer`].
pub(crate) struct XrcHooks {
    server: XrcServer,
    kernel: Option<KernelModel>,
    /// The `sim` backend's data path: clients' SRQs, what the TGT QPs receive.
    data: Option<Arc<SimData>>,
    /// The keeper's state over the target's registry. Every call that needs the registry
    /// runs inside the driver ([`XrcServer::with`] closures), so it is ordered with the
    /// CM's; outside, it is only locked briefly (a session opened, its log taken), never
    /// across an await.
    keeper: Arc<Mutex<NodeKeeper>>,
    holders: Mutex<BTreeMap<u64, Holder>>,
    routes: Arc<Mutex<Routes>>,
    /// The client service, for the quotas ([`XrcHooks::set_node`]).
    node: Arc<OnceLock<Weak<NodeServer>>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The policy named on the command line / in the protocol.
pub(crate) fn policy_of(s: &str) -> Option<OwnershipPolicy> {
    match s {
        "explicit" => Some(OwnershipPolicy::Explicit),
        "domain" => Some(OwnershipPolicy::DomainBound),
        "process" => Some(OwnershipPolicy::ProcessBound),
        "shared" => Some(OwnershipPolicy::Shared),
        other => OwnershipPolicy::from_name(other),
    }
}

impl XrcHooks {
    /// Hooks on `server`; `kernel` gives each client a process of the software model (the
    /// `sim` backend); without it clients get process numbers of their own.
    /// With `journal`, connections on TGT QPs are journaled while established (their DREQ
    /// after a restart carries "target gone (keeper lost)").
    pub(crate) async fn new(
        server: XrcServer,
        kernel: Option<KernelModel>,
        data_rx: Option<mpsc::Receiver<ibcm::rt::DataPacket>>,
        journal: Option<JournalTx>,
        keeper: NodeKeeper,
    ) -> Arc<Self> {
        let data = kernel.clone().map(|k| SimData::new(k, data_rx));
        let routes: Arc<Mutex<Routes>> = Arc::default();
        let r = routes.clone();
        // Established (true) or ended (false), for the journal: what the peer knows of a
        // connection is asked of the endpoint, outside the observer; the client's report of
        // an established connection follows its journal entry.
        let (jtx, jrx) = mpsc::unbounded_channel::<JournalNote>();
        let journaling = journal.is_some();
        if let Some(j) = journal {
            tokio::spawn(journal_xrc(server.clone(), j, jrx));
        }
        let observer = Box::new(move |_now: Instant, ev: TargetEvent| {
            if let TargetEvent::Closed { conn, .. } | TargetEvent::Teardown { conn, .. } = &ev {
                let _ = jtx.send((*conn, false, None));
            }
            let mut r = lock(&r);
            let (conn, line) = match &ev {
                TargetEvent::Accepted {
                    conn,
                    service,
                    qpn,
                    created,
                    policy,
                    ..
                } => {
                    r.conns.insert(*conn, *service);
                    if let Some(&info) = r.owners.get(service) {
                        r.count(*conn, info);
                    }
                    let how = if *created { "created" } else { "attached" };
                    (
                        *conn,
                        format!("accepted conn={conn} tgt_qpn={qpn} ({how}, {policy})"),
                    )
                }
                TargetEvent::Rejected { conn, info, .. } => {
                    (*conn, format!("rejected conn={conn}: {info}"))
                }
                TargetEvent::Established { conn, qpn } => {
                    (*conn, format!("established conn={conn} tgt_qpn={qpn}"))
                }
                TargetEvent::Teardown {
                    conn,
                    qpn,
                    cause,
                    established,
                } => {
                    let what = if *established { "DREQ" } else { "REJ" };
                    (
                        *conn,
                        format!(
                            "teardown conn={conn} tgt_qpn={qpn}: {what}, target gone ({cause})"
                        ),
                    )
                }
                TargetEvent::Closed {
                    conn, qpn, event, ..
                } => (
                    *conn,
                    format!("closed conn={conn} tgt_qpn={qpn} ({event:?})"),
                ),
                TargetEvent::AcceptFailed { conn, .. } => {
                    r.uncount(*conn);
                    info!(event = ?ev, "XRC target");
                    return;
                }
                TargetEvent::Orphaned { qpn } => {
                    info!(event = ?ev, "XRC target");
                    r.keeper_events(vec![(
                        EventFor::All,
                        KeeperEvent::QpOrphaned { qpn: qpn.get() },
                    )]);
                    return;
                }
                other => {
                    info!(event = ?other, "XRC target");
                    return;
                }
            };
            if matches!(
                ev,
                TargetEvent::Closed { .. } | TargetEvent::Rejected { .. }
            ) {
                r.uncount(conn);
            }
            let sid = if matches!(
                ev,
                TargetEvent::Closed { .. } | TargetEvent::Rejected { .. }
            ) {
                r.conns.remove(&conn)
            } else {
                r.conns.get(&conn).copied()
            };
            let Some(sid) = sid else {
                return;
            };
            let report = r.sinks.get(&sid).map(|sink| (sink.clone(), sid, line));
            if let (TargetEvent::Established { conn, .. }, true) = (&ev, journaling) {
                let _ = jtx.send((*conn, true, report));
            } else if let Some((sink, sid, line)) = report {
                sink.xrc_event(sid, line);
            }
        });
        if server.set_observer(observer).await.is_err() {
            warn!("the endpoint stopped before the XRC target was set up");
        }
        // The registry's trace: drained at every flush (so it does not grow); a release tells
        // every keeper session (`qp-gone`, as the keeper does). Releases a keeper request
        // caused were drained, and told, by the keeper itself.
        let r = routes.clone();
        let tracer = Box::new(move |t: ibcm_xrc::TraceEntry<ConnId>| {
            debug!(qpn = %t.qpn, what = %t.what, verdict = ?t.verdict, "XRC registry");
            if let Some(ibcm_xrc::Verdict::Released(cause)) = t.verdict {
                lock(&r).keeper_events(vec![(
                    EventFor::All,
                    KeeperEvent::QpGone {
                        qpn: t.qpn.get(),
                        cause: cause.text().into(),
                    },
                )]);
            }
        });
        if server
            .with_target(move |t, _| t.set_trace_observer(tracer))
            .await
            .is_err()
        {
            warn!("the endpoint stopped before the XRC target was set up");
        }
        let node: Arc<OnceLock<Weak<NodeServer>>> = Arc::default();
        let admission = admission(routes.clone(), node.clone());
        if server
            .with_target(move |t, _| t.set_admission(admission))
            .await
            .is_err()
        {
            warn!("the endpoint stopped before the XRC target was set up");
        }
        Arc::new(XrcHooks {
            server,
            kernel,
            data,
            keeper: Arc::new(Mutex::new(keeper)),
            holders: Mutex::new(BTreeMap::new()),
            routes,
            node,
        })
    }

    /// The client service whose quotas the XRC target applies.
    pub(crate) fn set_node(&self, node: &Arc<NodeServer>) {
        let _ = self.node.set(Arc::downgrade(node));
    }

    /// Releases every TGT QP still live, as a lost keeper's ("keeper lost" DREQs), for the
    /// daemon's exit.
    pub(crate) async fn release_all(&self, fresh: TgtRegistry<ConnId>) {
        let r = self
            .server
            .with_target(move |t, now| t.keeper_crash(now, fresh))
            .await;
        if r.is_err() {
            warn!("the endpoint stopped before the TGT QPs were released");
        }
    }

    /// The process `session` acts as (its XRC services' and its keeper session's), made on
    /// first use.
    fn holder_process(&self, session: &SessionInfo) -> ProcessId {
        if let Some(p) = lock(&self.holders).get(&session.id).map(|h| h.process) {
            return p;
        }
        let p = self.process_for(session);
        lock(&self.holders)
            .entry(session.id)
            .or_insert_with(|| Holder::new(p))
            .process
    }

    /// `session`'s keeper session (opened on first use, as its process), with the process;
    /// `events` receives its keeper events.
    fn keeper_session(
        &self,
        session: &SessionInfo,
        events: Option<EventSink>,
    ) -> (ProcessId, KeeperSession) {
        let process = self.holder_process(session);
        if let Some(ks) = lock(&self.holders).get(&session.id).and_then(|h| h.keeper) {
            return (process, ks);
        }
        let pid = session.pid.and_then(|p| u32::try_from(p).ok());
        let ks = lock(&self.keeper).open_session(pid, session.uid, session.gid, process);
        let ks = {
            let mut holders = lock(&self.holders);
            let h = holders
                .entry(session.id)
                .or_insert_with(|| Holder::new(process));
            *h.keeper.get_or_insert(ks)
        };
        if let Some(sink) = events {
            lock(&self.routes).keeper_sinks.insert(ks, sink);
        }
        (process, ks)
    }

    /// [`NodeHooks::xrc_listen`] from a keeper domain: the keeper's rule for accepting REQs
    /// into a domain, and for the QP to answer with ([`NodeKeeper::serve_check`]).
    async fn xrc_listen_in(
        &self,
        session: SessionInfo,
        service_id: ServiceId,
        req: XrcListenReq<'_>,
        domain: &str,
        events: EventSink,
    ) -> Result<(), String> {
        let policy = policy_of(req.policy).ok_or_else(|| {
            format!(
                "unknown policy {:?} (explicit, domain, process, shared)",
                req.policy
            )
        })?;
        let srqns = srq_nums(req.srqns)?;
        let (process, ks) = self.keeper_session(&session, Some(events.clone()));
        let keeper = self.keeper.clone();
        let (name, tgt_qpn) = (domain.to_owned(), req.tgt_qpn);
        let qpn = self
            .server
            .with(move |t, ep, _| {
                let (dom, qpn) = lock(&keeper)
                    .serve_check(t.registry_mut(), ks, &name, tgt_qpn)
                    .map_err(|e| format!("{}: {}", e.kind.as_str(), e.message))?;
                let mut svc = XrcService::new(dom, process, srqns);
                svc.policy = Some(policy);
                svc.tgt_qpn = qpn;
                if qpn.is_some() {
                    // The processes registered on it decide its life, not its initiators.
                    svc.conn_registrations = Some(false);
                }
                t.listen(ep, service_id, svc);
                Ok::<_, String>(qpn)
            })
            .await
            .map_err(|e| e.to_string())??;
        {
            let mut holders = lock(&self.holders);
            let h = holders
                .entry(session.id)
                .or_insert_with(|| Holder::new(process));
            h.services.push(service_id);
            if qpn.is_some() {
                h.held.push(service_id);
            }
        }
        {
            let mut r = lock(&self.routes);
            r.sinks.insert(service_id, events);
            r.owners.insert(service_id, session);
        }
        info!(session = session.id, service = %service_id, %policy, domain, tgt_qpn = ?qpn.map(|q| q.get()), "XRC service in a keeper domain");
        Ok(())
    }

    /// Logs what the keeper did.
    fn keeper_log(&self) {
        let lines = lock(&self.keeper).take_log();
        for line in lines {
            info!(target: "ibcmd::keeper", "{line}");
        }
    }

    /// A request of the data path ([`data::OPS`]): served by the `sim` backend's model, a
    /// domain named as the keeper's rule allows this client; refused with the verbs backend.
    async fn data_op(
        &self,
        session: &SessionInfo,
        ks: KeeperSession,
        op: &str,
        req: &serde_json::Value,
    ) -> serde_json::Value {
        let Some(d) = &self.data else {
            return data::unsupported(op);
        };
        let file = match req.get("domain").and_then(serde_json::Value::as_str) {
            Some(name) if op == "srq-create" => {
                let keeper = self.keeper.clone();
                let name = name.to_owned();
                let r = self
                    .server
                    .with_target(move |t, _| lock(&keeper).domain_file(t.registry_mut(), ks, &name))
                    .await;
                Some(match r {
                    Ok(Ok(p)) => Ok(p),
                    Ok(Err(e)) => Err(data::refused(e.kind.as_str(), e.message)),
                    Err(e) => Err(data::refused("error", e.to_string())),
                })
            }
            _ => None,
        };
        d.handle(session.id, req, file)
    }

    fn process_for(&self, session: &SessionInfo) -> ProcessId {
        let p = match &self.kernel {
            Some(k) => k.spawn().process(),
            None => ProcessId(session.pid.and_then(|p| u32::try_from(p).ok()).unwrap_or(0)),
        };
        lock(&self.routes).uids.insert(p, session.uid);
        p
    }
}

impl NodeHooks for XrcHooks {
    fn xrc_listen<'a>(
        &'a self,
        session: SessionInfo,
        service_id: ServiceId,
        req: XrcListenReq<'a>,
        events: EventSink,
    ) -> HookFuture<'a, Result<(), String>> {
        Box::pin(async move {
            if let Some(domain) = req.domain {
                return self
                    .xrc_listen_in(session, service_id, req, domain, events)
                    .await;
            }
            let XrcListenReq {
                policy,
                srqns,
                tgt_qpn,
                ..
            } = req;
            if tgt_qpn.is_some() {
                return Err("a TGT QP to serve needs its domain (domain)".into());
            }
            let policy = policy_of(policy).ok_or_else(|| {
                format!("unknown policy {policy:?} (explicit, domain, process, shared)")
            })?;
            let srqns = srq_nums(srqns)?;
            let existing = lock(&self.holders)
                .get(&session.id)
                .map(|h| (h.process, h.domain));
            let process = match existing {
                Some((p, _)) => p,
                None => self.process_for(&session),
            };
            let private = existing.and_then(|(_, d)| d);
            let name = match policy {
                OwnershipPolicy::Shared => SHARED_DOMAIN.to_string(),
                // One per user and service: the orphans of a gone client stay there, for the
                // next listener of the service of the same user to adopt.
                OwnershipPolicy::Explicit => {
                    format!("ibcmd-explicit-uid{}-{service_id}", session.uid)
                }
                _ => format!("ibcmd-session-{}", session.id),
            };
            let (dom, adopted) = self
                .server
                .with(move |t, ep, now| {
                    let dom = match private {
                        Some(d)
                            if policy != OwnershipPolicy::Shared
                                && policy != OwnershipPolicy::Explicit =>
                        {
                            d
                        }
                        _ => t
                            .registry_mut()
                            .open_domain(&name, DomainSpec::Private)
                            .map_err(|e| refusal(&e))?,
                    };
                    // The orphans of an earlier listener of this service (same user).
                    let reg = t.registry_mut();
                    let orphans: Vec<_> = reg
                        .tgt_qps()
                        .into_iter()
                        .filter(|q| {
                            policy == OwnershipPolicy::Explicit
                                && q.domain == dom
                                && q.life == ibcm_xrc::QpLife::Live
                                && q.owner.is_none()
                                && q.policy == OwnershipPolicy::Explicit
                        })
                        .map(|q| q.qpn)
                        .collect();
                    let mut adopted = Vec::new();
                    for qpn in orphans {
                        if reg.adopt(now, qpn, process).is_ok() {
                            adopted.push(qpn);
                        }
                    }
                    let mut svc = XrcService::new(dom, process, srqns);
                    svc.policy = Some(policy);
                    t.listen(ep, service_id, svc);
                    Ok::<_, String>((dom, adopted))
                })
                .await
                .map_err(|e| e.to_string())??;
            let domain = match policy {
                OwnershipPolicy::Shared | OwnershipPolicy::Explicit => private,
                _ => Some(dom),
            };
            let mut holders = lock(&self.holders);
            let h = holders
                .entry(session.id)
                .or_insert_with(|| Holder::new(process));
            h.domain = domain;
            h.services.push(service_id);
            if policy == OwnershipPolicy::Explicit && !h.explicit.contains(&dom) {
                h.explicit.push(dom);
            }
            drop(holders);
            {
                let mut r = lock(&self.routes);
                r.sinks.insert(service_id, events.clone());
                r.owners.insert(service_id, session);
            }
            info!(session = session.id, service = %service_id, %policy, "XRC service");
            if !adopted.is_empty() {
                let list: Vec<String> = adopted.iter().map(ToString::to_string).collect();
                info!(session = session.id, service = %service_id, qps = ?list, "orphans adopted");
                events.xrc_event(
                    service_id,
                    format!("adopted orphan TGT QPs {}", list.join(" ")),
                );
            }
            Ok(())
        })
    }

    fn keeper(
        &self,
        session: SessionInfo,
        req: serde_json::Value,
        events: EventSink,
    ) -> HookFuture<'_, Result<serde_json::Value, String>> {
        Box::pin(async move {
            let (_, ks) = self.keeper_session(&session, Some(events));
            let keeper = self.keeper.clone();
            let op = req.get("op").and_then(serde_json::Value::as_str);
            if let Some(op) = op.filter(|op| data::OPS.contains(op)) {
                return Ok(self.data_op(&session, ks, op, &req).await);
            }
            let parsed = serde_json::from_value::<Request>(req)
                .map_err(|e| format!("not a keeper request: {e}"))
                .and_then(|r| match &r {
                    // The daemon's own domains are opened by name too: not through the keeper.
                    Request::OpenDomain { domain, .. } if domain.starts_with(OWN_DOMAINS) => Err(
                        format!("domain names beginning with {OWN_DOMAINS:?} are the daemon's own"),
                    ),
                    _ => Ok(r),
                });
            let (reply, ev) = self
                .server
                .with_target(move |t, now| {
                    let mut k = lock(&keeper);
                    match parsed {
                        Ok(req) => k.handle(t.registry_mut(), now, ks, None, req),
                        Err(e) => (k.bad_request(e), vec![]),
                    }
                })
                .await
                .map_err(|e| e.to_string())?;
            self.keeper_log();
            lock(&self.routes).keeper_events(ev);
            serde_json::to_value(&reply).map_err(|e| e.to_string())
        })
    }

    fn xrc_destroy(&self, session: SessionInfo) -> HookFuture<'_, Result<u64, String>> {
        Box::pin(async move {
            let Some(process) = lock(&self.holders).get(&session.id).map(|h| h.process) else {
                return Ok(0);
            };
            self.server
                .with_target(move |t, now| {
                    let reg = t.registry_mut();
                    let mine: Vec<_> = reg
                        .tgt_qps()
                        .into_iter()
                        .filter(|q| q.life == ibcm_xrc::QpLife::Live)
                        .filter(|q| {
                            q.owner == Some(process)
                                || (q.policy == OwnershipPolicy::Shared && q.creator == process)
                        })
                        .map(|q| q.qpn)
                        .collect();
                    let mut n = 0u64;
                    for qpn in mine {
                        match reg.destroy(now, qpn, process) {
                            Ok(_) => n += 1,
                            Err(e) => warn!(%qpn, error = %e, "destroy refused"),
                        }
                    }
                    n
                })
                .await
                .map_err(|e| e.to_string())
        })
    }

    fn xrc_unlisten(&self, session: SessionInfo, service_id: ServiceId) -> HookFuture<'_, ()> {
        Box::pin(async move {
            {
                let mut r = lock(&self.routes);
                r.sinks.remove(&service_id);
                r.owners.remove(&service_id);
            }
            let r = self
                .server
                .with(move |t, ep, _| {
                    t.unserve(service_id);
                    ep.unlisten(service_id);
                })
                .await;
            if r.is_err() {
                warn!(session = session.id, "the endpoint stopped");
            }
        })
    }

    fn xrc_connections(&self, session: SessionInfo) -> (usize, usize) {
        let r = lock(&self.routes);
        (
            r.by_session.get(&session.id).copied().unwrap_or(0),
            r.by_uid.get(&session.uid).copied().unwrap_or(0),
        )
    }

    fn xrc_orphans(&self, _session: SessionInfo) -> HookFuture<'_, Result<Vec<WireTgtQp>, String>> {
        Box::pin(async move {
            let uids = lock(&self.routes).uids.clone();
            self.server
                .with(move |t, ep, _| {
                    // The registry's own leak report (as `xrcd-keeper leaks`), against what
                    // the endpoint still knows.
                    let leaks: Vec<ibcm_xrc::Qpn> =
                        t.leaks(ep).into_iter().map(|l| l.qpn).collect();
                    let reg = t.registry();
                    reg.tgt_qps()
                        .into_iter()
                        .filter(|q| q.life == ibcm_xrc::QpLife::Live)
                        .filter_map(|q| {
                            let orphan = q.owner.is_none() && q.policy != OwnershipPolicy::Shared;
                            let leak = leaks.contains(&q.qpn);
                            (orphan || leak).then(|| WireTgtQp {
                                qpn: q.qpn.get(),
                                domain: reg
                                    .domain(q.domain)
                                    .map_or_else(|| q.domain.to_string(), |d| d.name),
                                policy: policy_name(q.policy).to_string(),
                                uid: uids.get(&q.creator).copied(),
                                conns: u32::try_from(q.conns.len()).unwrap_or(u32::MAX),
                                orphan,
                                leak,
                            })
                        })
                        .collect()
                })
                .await
                .map_err(|e| e.to_string())
        })
    }

    fn xrc_reclaim(
        &self,
        session: SessionInfo,
        qpn: Option<u32>,
    ) -> HookFuture<'_, Result<u64, String>> {
        Box::pin(async move {
            let uids = lock(&self.routes).uids.clone();
            let by = lock(&self.holders)
                .get(&session.id)
                .map_or(ProcessId(0), |h| h.process);
            let r = self
                .server
                .with_target(move |t, now| {
                    let reg = t.registry_mut();
                    let mine = |q: &ibcm_xrc::TgtQp<ConnId>| {
                        q.life == ibcm_xrc::QpLife::Live
                            && q.owner.is_none()
                            && q.policy != OwnershipPolicy::Shared
                            && (session.uid == 0 || uids.get(&q.creator) == Some(&session.uid))
                    };
                    let all = reg.tgt_qps();
                    let chosen: Vec<ibcm_xrc::Qpn> = match qpn {
                        Some(n) => {
                            let q = all.iter().find(|q| q.qpn.get() == n);
                            match q {
                                Some(q) if mine(q) => vec![q.qpn],
                                _ => {
                                    return Err(format!(
                                        "TGT QP {n:#08x} is not an orphan of uid {}",
                                        session.uid
                                    ))
                                }
                            }
                        }
                        None => all.iter().filter(|q| mine(q)).map(|q| q.qpn).collect(),
                    };
                    let mut n = 0u64;
                    for q in chosen {
                        match reg.destroy(now, q, by) {
                            Ok(_) => n += 1,
                            Err(e) => warn!(qpn = %q, error = %e, "reclaim refused"),
                        }
                    }
                    Ok(n)
                })
                .await
                .map_err(|e| e.to_string())?;
            if let Ok(n) = &r {
                info!(
                    session = session.id,
                    uid = session.uid,
                    qps = n,
                    "orphans reclaimed"
                );
            }
            r
        })
    }

    fn session_ended(&self, session: SessionInfo) -> HookFuture<'_, ()> {
        Box::pin(async move {
            if let Some(d) = &self.data {
                d.session_ended(session.id);
            }
            let Some(h) = lock(&self.holders).remove(&session.id) else {
                return;
            };
            let routes = self.routes.clone();
            let keeper = self.keeper.clone();
            let ks = h.keeper;
            let r = self
                .server
                .with(move |t, ep, now| {
                    // Its keeper session first: the registry hears its process exit there.
                    let kev = h
                        .keeper
                        .map(|ks| lock(&keeper).close_session(t.registry_mut(), now, ks));
                    let reg = t.registry_mut();
                    let exit = reg.process_exit(now, h.process);
                    let closed = h.domain.map(|d| reg.close_domain(now, d));
                    // Its Explicit services' domains stay open for their orphans; one without
                    // any QP (live, or gone and held in quarantine) is closed.
                    let used: Vec<DomainId> = reg.tgt_qps().into_iter().map(|q| q.domain).collect();
                    for &d in &h.explicit {
                        if !used.contains(&d) {
                            let _ = reg.close_domain(now, d);
                        }
                    }
                    // The connections its services accepted: their REPs named its SRQs, which
                    // are gone with it, even where the TGT QP is kept. Those on released QPs
                    // get their teardown (with the cause) from the target; the others a DREQ
                    // here.
                    // The connections of a service answering with a QP held by registrations
                    // are the QP's: they stay while it lives.
                    let mine: Vec<ConnId> = lock(&routes)
                        .conns
                        .iter()
                        .filter(|(_, s)| h.services.contains(s) && !h.held.contains(s))
                        .map(|(&c, _)| c)
                        .collect();
                    let mut srq_dreqs = 0usize;
                    for conn in mine {
                        let live = t.conn_qpn(conn).is_some_and(|q| {
                            t.registry()
                                .query(q)
                                .is_ok_and(|q| q.life == ibcm_xrc::QpLife::Live)
                        });
                        if live && ep.disconnect(now, conn, &[]).is_ok() {
                            srq_dreqs += 1;
                        }
                    }
                    (exit, closed, srq_dreqs, kev)
                })
                .await;
            if let Some(ks) = ks {
                lock(&self.routes).keeper_sinks.remove(&ks);
            }
            self.keeper_log();
            match r {
                Ok((exit, closed, srq_dreqs, kev)) => {
                    if let Some(ev) = kev {
                        lock(&self.routes).keeper_events(ev);
                    }
                    info!(
                    session = session.id,
                    qps = ?exit,
                    domain = ?closed,
                    srq_dreqs,
                    "client's XRC holdings ended per policy"
                    );
                }
                Err(e) => warn!(error = %e, "the endpoint stopped"),
            }
        })
    }
}

/// The name of a policy in the protocol.
fn policy_name(p: OwnershipPolicy) -> &'static str {
    match p {
        OwnershipPolicy::Explicit => "explicit",
        OwnershipPolicy::DomainBound => "domain",
        OwnershipPolicy::ProcessBound => "process",
        OwnershipPolicy::Shared => "shared",
    }
}

/// A fresh registry on the same backend, for [`XrcHooks::release_all`].
pub(crate) fn registry(verbs: Box<dyn ibcm_xrc::Verbs>) -> TgtRegistry<ConnId> {
    TgtRegistry::new(verbs, RegistryConfig::default())
}

/// SRQ numbers from the protocol (1..=47 of them, each 24 bits).
fn srq_nums(srqns: &[u32]) -> Result<Vec<SrqNum>, String> {
    let srqns = srqns
        .iter()
        .map(|&n| SrqNum::new(n).ok_or(format!("SRQ number {n} out of range")))
        .collect::<Result<Vec<_>, _>>()?;
    if srqns.is_empty() || srqns.len() > 47 {
        return Err(format!("{} SRQ numbers (1..=47)", srqns.len()));
    }
    Ok(srqns)
}
