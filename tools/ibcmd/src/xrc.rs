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
//! QPs: released, "domain closed"; Explicit QPs are kept as orphans and pin it). When the
//! daemon stops, every QP still live is released as "keeper lost".

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use ibcm::proto::ConnId;
use ibcm::rt::node::proto::WirePeer;
use ibcm::rt::node::{EventSink, HookFuture, JournalEntry, JournalTx, NodeHooks, SessionInfo};
use ibcm_mad::ServiceId;
use ibcm_xrc::cm::rt::XrcServer;
use ibcm_xrc::cm::{TargetEvent, XrcService};
use ibcm_xrc::verbs::model::KernelModel;
use ibcm_xrc::{
    DomainId, DomainSpec, OwnershipPolicy, ProcessId, RegistryConfig, SrqNum, TgtRegistry,
    Verbs as _,
};
use tokio::sync::mpsc;
use tracing::{info, warn};

/// A client's XRC side.
#[derive(Debug)]
struct Holder {
    process: ProcessId,
    /// Its private domain, once a non-shared service asked for one.
    domain: Option<DomainId>,
    /// Its services (their REPs name its SRQs).
    services: Vec<ServiceId>,
}

/// The name of the daemon's domain for `Shared` services.
const SHARED_DOMAIN: &str = "ibcmd-shared";

/// Where the target's events go: the session sink of each service, and each connection's
/// service.
#[derive(Default)]
struct Routes {
    sinks: HashMap<ServiceId, EventSink>,
    conns: HashMap<ConnId, ServiceId>,
}

/// [`NodeHooks`] over an [`XrcServer`].
pub(crate) struct XrcHooks {
    server: XrcServer,
    kernel: Option<KernelModel>,
    holders: Mutex<BTreeMap<u64, Holder>>,
    routes: Arc<Mutex<Routes>>,
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
        journal: Option<JournalTx>,
    ) -> Arc<Self> {
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
                other => {
                    info!(event = ?other, "XRC target");
                    return;
                }
            };
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
        Arc::new(XrcHooks {
            server,
            kernel,
            holders: Mutex::new(BTreeMap::new()),
            routes,
        })
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

    fn process_for(&self, session: &SessionInfo) -> ProcessId {
        match &self.kernel {
            Some(k) => k.spawn().process(),
            None => ProcessId(session.pid.and_then(|p| u32::try_from(p).ok()).unwrap_or(0)),
        }
    }
}

impl NodeHooks for XrcHooks {
    fn xrc_listen<'a>(
        &'a self,
        session: SessionInfo,
        service_id: ServiceId,
        policy: &'a str,
        srqns: &'a [u32],
        events: EventSink,
    ) -> HookFuture<'a, Result<(), String>> {
        Box::pin(async move {
            let policy = policy_of(policy).ok_or_else(|| {
                format!("unknown policy {policy:?} (explicit, domain, process, shared)")
            })?;
            let srqns = srqns
                .iter()
                .map(|&n| SrqNum::new(n).ok_or(format!("SRQ number {n} out of range")))
                .collect::<Result<Vec<_>, _>>()?;
            if srqns.is_empty() || srqns.len() > 47 {
                return Err(format!("{} SRQ numbers (1..=47)", srqns.len()));
            }
            let existing = lock(&self.holders)
                .get(&session.id)
                .map(|h| (h.process, h.domain));
            let process = match existing {
                Some((p, _)) => p,
                None => self.process_for(&session),
            };
            let private = existing.and_then(|(_, d)| d);
            let name = if policy == OwnershipPolicy::Shared {
                SHARED_DOMAIN.to_string()
            } else {
                format!("ibcmd-session-{}", session.id)
            };
            let dom = self
                .server
                .with(move |t, ep, _| {
                    let dom = match private {
                        Some(d) if policy != OwnershipPolicy::Shared => d,
                        _ => t
                            .registry_mut()
                            .open_domain(&name, DomainSpec::Private)
                            .map_err(|e| e.to_string())?,
                    };
                    let mut svc = XrcService::new(dom, process, srqns);
                    svc.policy = Some(policy);
                    t.listen(ep, service_id, svc);
                    Ok::<_, String>(dom)
                })
                .await
                .map_err(|e| e.to_string())??;
            let domain = if policy == OwnershipPolicy::Shared {
                private
            } else {
                Some(dom)
            };
            let mut holders = lock(&self.holders);
            let h = holders.entry(session.id).or_insert_with(|| Holder {
                process,
                domain: None,
                services: Vec::new(),
            });
            h.domain = domain;
            h.services.push(service_id);
            drop(holders);
            lock(&self.routes).sinks.insert(service_id, events);
            info!(session = session.id, service = %service_id, %policy, "XRC service");
            Ok(())
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
            lock(&self.routes).sinks.remove(&service_id);
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

    fn session_ended(&self, session: SessionInfo) -> HookFuture<'_, ()> {
        Box::pin(async move {
            let Some(h) = lock(&self.holders).remove(&session.id) else {
                return;
            };
            let routes = self.routes.clone();
            let r = self
                .server
                .with(move |t, ep, now| {
                    let reg = t.registry_mut();
                    let exit = reg.process_exit(now, h.process);
                    let closed = h.domain.map(|d| reg.close_domain(now, d));
                    // The connections its services accepted: their REPs named its SRQs, which
                    // are gone with it, even where the TGT QP is kept. Those on released QPs
                    // get their teardown (with the cause) from the target; the others a DREQ
                    // here.
                    let mine: Vec<ConnId> = lock(&routes)
                        .conns
                        .iter()
                        .filter(|(_, s)| h.services.contains(s))
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
                    (exit, closed, srq_dreqs)
                })
                .await;
            match r {
                Ok((exit, closed, srq_dreqs)) => info!(
                    session = session.id,
                    qps = ?exit,
                    domain = ?closed,
                    srq_dreqs,
                    "client's XRC holdings ended per policy"
                ),
                Err(e) => warn!(error = %e, "the endpoint stopped"),
            }
        })
    }
}

/// A connection on a TGT QP established (`true`, with the report for its client) or ended.
type JournalNote = (ConnId, bool, Option<(EventSink, ServiceId, String)>);

/// Keeps the journal of the connections on TGT QPs.
async fn journal_xrc(
    server: XrcServer,
    journal: JournalTx,
    mut rx: mpsc::UnboundedReceiver<JournalNote>,
) {
    while let Some((conn, up, report)) = rx.recv().await {
        if !up {
            journal.remove(conn.0);
            continue;
        }
        let known = server
            .with(move |_, ep, _| {
                Some((
                    ep.remote_comm_id(conn)?,
                    ep.remote_qpn(conn)?,
                    ep.peer(conn)?,
                ))
            })
            .await;
        if let Ok(Some((remote_comm_id, remote_qpn, peer))) = known {
            let added = journal.add(JournalEntry {
                comm_id: conn.0,
                remote_comm_id: remote_comm_id.0,
                remote_qpn: remote_qpn.get(),
                peer: WirePeer::from_peer(&peer),
                xrc_tgt: true,
            });
            if let Err(e) = added {
                // Not journaled: not reported established, and ended at the initiator.
                warn!(%conn, error = %e, "XRC connection refused: it cannot be journaled");
                let _ = server
                    .with(move |_, ep, now| ep.disconnect(now, conn, &[]))
                    .await;
                if let Some((sink, sid, _)) = report {
                    sink.xrc_event(
                        sid,
                        format!("refused conn={conn}: the daemon's journal cannot note it ({e})"),
                    );
                }
                continue;
            }
        }
        if let Some((sink, sid, line)) = report {
            sink.xrc_event(sid, line);
        }
    }
}

/// A fresh registry on the same backend, for [`XrcHooks::release_all`].
pub(crate) fn registry(verbs: Box<dyn ibcm_xrc::Verbs>) -> TgtRegistry<ConnId> {
    TgtRegistry::new(verbs, RegistryConfig::default())
}
