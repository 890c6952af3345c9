//! The scenarios of the `xrc_policies` example, run through ibcm over two transports: the
//! deterministic simulator (virtual time) and RoCEv2 over UDP on loopback (real time, scaled
//! down ten times). Shared with `tests/example.rs`, which runs them in CI.
//!
//! The setting: a target node T runs P = 3 processes (t1, t2, t3) of one job, each with its
//! own XRC SRQ in the job's domain and its own CM service ID. Q = 2 remote nodes (A, B) each
//! run an initiator with one INI QP, which opens one XRC connection to every target process.
//! All connections from one remote node land on **one TGT QP** (REQ mode "any": the first REQ
//! creates it, the others attach), so T holds 2 TGT QPs instead of 6. A keeper on T holds the
//! handles and enforces the QP's ownership policy ([`XrcTarget`] next to T's CM endpoint).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use ibcm::proto::{ConnId, EndpointConfig, PeerAddr};
use ibcm::rt::{Cm, CmError, Connection, UdpTransport};
use ibcm::sim::SimNet;
use ibcm_mad::{Guid, Qpn, ServiceId};
use ibcm_xrc::cm::rt::XrcServer;
use ibcm_xrc::cm::sim::{SimInitiator, SimTarget};
use ibcm_xrc::cm::{
    xrc_connect_params, IniEvent, IniOutcome, TargetEvent, XrcService, XrcTarget, XrcTargetConfig,
};
use ibcm_xrc::verbs::model::{KernelModel, ModelConfig, ModelVerbs};
use ibcm_xrc::{
    DomainId, DomainSpec, OwnershipPolicy, ProcessId, RegistryConfig, SrqAttr, SrqNum, TgtRegistry,
    Verbs, Verdict, XrcReqData, XrcSrq,
};

/// Any error of the demo.
pub(crate) type Error = Box<dyn std::error::Error + Send + Sync>;

const DOMAIN_FILE: &str = "/tmp/ibcm-xrc-demo-job42.xrcd";
/// The target processes.
const PROCS: [&str; 3] = ["t1", "t2", "t3"];
/// The remote nodes: name, CA GUID, first INI QPN.
const NODES: [(&str, u64, u32); 2] = [("A", 0xa0a0, 0x1a0), ("B", 0xb0b0, 0x1b0)];
/// The CM TimeWait in the simulator (and the quarantine floor).
const SIM_TIMEWAIT: Duration = Duration::from_millis(800);
/// Real time runs this many times faster than scenario time over UDP.
const UDP_SCALE: u32 = 10;

fn service(p: usize) -> ServiceId {
    ServiceId(0x1001 + p as u64)
}

/// What crossed the wire in one scenario, as the initiators saw it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Counts {
    /// Connections established.
    pub(crate) established: u32,
    /// Connections the target tore down with a DREQ carrying the "target gone" block.
    pub(crate) gone_by_dreq: u32,
    /// REQs answered with REJ reason 1 + the "target gone" ARI.
    pub(crate) gone_by_rej: u32,
    /// Initiator-side disconnects.
    pub(crate) ini_disconnects: u32,
}

/// One scenario's result on one transport.
#[derive(Clone, Debug)]
pub(crate) struct Played {
    /// The policy.
    pub(crate) policy: OwnershipPolicy,
    /// "simulator" or "UDP".
    pub(crate) transport: &'static str,
    /// The timeline.
    pub(crate) text: String,
    /// What crossed the wire.
    pub(crate) counts: Counts,
}

// --- the timeline ------------------------------------------------------------------------

struct Line {
    at: Duration,
    /// Among lines of the same instant: actions (0), policy verdicts (1), the target's CM
    /// and keeper (2), the kernel (3), the initiators' conclusions (4).
    prio: u8,
    seq: usize,
    who: String,
    text: String,
}

#[derive(Default)]
struct RecInner {
    t0: Option<Instant>,
    lines: Vec<Line>,
    /// Target connection → "A→t1".
    tconn: BTreeMap<ConnId, String>,
    /// (node, process) → the name of the latest connection between them.
    latest: BTreeMap<(String, String), String>,
    counts: Counts,
}

/// The timeline recorder, shared by the observers (thread-safe for the UDP tasks).
#[derive(Clone, Default)]
struct Rec(Arc<Mutex<RecInner>>);

fn node_name(guid: Guid) -> String {
    NODES
        .iter()
        .find(|n| n.1 == guid.0)
        .map_or_else(|| format!("{guid}"), |n| n.0.to_owned())
}

fn proc_name(sid: ServiceId) -> String {
    PROCS
        .iter()
        .enumerate()
        .find(|(i, _)| service(*i) == sid)
        .map_or_else(|| format!("{sid}"), |(_, p)| (*p).to_owned())
}

fn hex(b: &[u8]) -> String {
    b.iter()
        .map(|x| format!("{x:02x}"))
        .collect::<Vec<_>>()
        .join(" ")
}

impl Rec {
    fn inner(&self) -> std::sync::MutexGuard<'_, RecInner> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn start(&self, t0: Instant) {
        *self.inner() = RecInner {
            t0: Some(t0),
            ..RecInner::default()
        };
    }

    fn line(&self, at: Instant, who: &str, text: String) {
        let prio = match who {
            "policy" => 1,
            "T" | "T CM" | "keeper" => 2,
            "kernel" => 3,
            _ => 0,
        };
        self.line_prio(at, prio, who, text);
    }

    fn line_prio(&self, at: Instant, prio: u8, who: &str, text: String) {
        let mut r = self.inner();
        let t0 = r.t0.unwrap_or(at);
        let seq = r.lines.len();
        r.lines.push(Line {
            at: at.saturating_duration_since(t0),
            prio,
            seq,
            who: who.to_owned(),
            text,
        });
    }

    fn named(&self, node: &str, proc_: &str, name: &str) {
        self.inner()
            .latest
            .insert((node.to_owned(), proc_.to_owned()), name.to_owned());
    }

    fn count(&self, f: impl FnOnce(&mut Counts)) {
        f(&mut self.inner().counts);
    }

    fn tconn(&self, conn: ConnId) -> String {
        self.inner()
            .tconn
            .get(&conn)
            .cloned()
            .unwrap_or_else(|| format!("conn {conn}"))
    }

    /// A target event as timeline lines.
    fn target_event(&self, at: Instant, e: TargetEvent) {
        match e {
            TargetEvent::Accepted {
                conn,
                service,
                peer,
                qpn,
                created,
                policy,
            } => {
                let (n, p) = (node_name(peer.ca_guid), proc_name(service));
                let name = {
                    let mut r = self.inner();
                    let name = r
                        .latest
                        .get(&(n.clone(), p.clone()))
                        .cloned()
                        .unwrap_or_else(|| format!("{n}→{p}"));
                    r.tconn.insert(conn, name.clone());
                    name
                };
                let how = if created {
                    format!("creates TGT QP {qpn} [{policy}], creator {p}")
                } else {
                    format!("attaches {name} to TGT QP {qpn}")
                };
                self.line(
                    at,
                    "T",
                    format!("{how}; REP EECN={qpn} SRQ=1 + SRQN of {p}"),
                );
            }
            TargetEvent::Rejected { info, .. } => self.line(
                at,
                "T CM",
                format!(
                    "REJ {} ({}) ARI {} — {info}",
                    info.reason().raw(),
                    info.reason().name(),
                    hex(&info.to_bytes())
                ),
            ),
            TargetEvent::Teardown {
                conn,
                qpn,
                cause,
                established,
            } => {
                let what = if established { "DREQ" } else { "REJ 1" };
                self.line(
                    at,
                    "T CM",
                    format!("{what} {} (TGT QP {qpn}: {cause})", self.tconn(conn)),
                );
            }
            TargetEvent::AcceptFailed { conn, error, .. } => {
                self.line(
                    at,
                    "T CM",
                    format!("accept of {} failed: {error}", self.tconn(conn)),
                );
            }
            TargetEvent::HoldersNotified { qpn, cause } => self.line(
                at,
                "keeper",
                format!("tells the processes registered on {qpn}: gone ({cause})"),
            ),
            TargetEvent::Orphaned { qpn } => self.line(
                at,
                "policy",
                format!("TGT QP {qpn} is an orphan: any process may adopt or destroy it"),
            ),
            _ => {}
        }
    }

    /// A registry trace entry (policy verdicts).
    fn trace(&self, at: Instant, qpn: Qpn, what: &str, verdict: Option<Verdict>) {
        let Some(v) = verdict else {
            return;
        };
        let verdict = match v {
            Verdict::Kept => "kept".to_owned(),
            Verdict::Released(c) => format!("RELEASED ({c})"),
            Verdict::AlreadyGone(c) => format!("already gone ({c})"),
        };
        let text = if what == "quarantine expired" {
            format!("TGT QP {qpn}: quarantine over → destroyed, number free again")
        } else {
            format!("TGT QP {qpn}: {what} → {verdict}")
        };
        self.line(at, "policy", text);
    }

    fn ini_outcome(&self, at: Instant, node: &str, name: &str, out: &IniOutcome) {
        match out {
            IniOutcome::TargetGone { .. } => {
                if matches!(
                    out,
                    IniOutcome::TargetGone {
                        by: ibcm_xrc::cm::GoneSignal::Dreq,
                        ..
                    }
                ) {
                    self.count(|c| c.gone_by_dreq += 1);
                } else {
                    self.count(|c| c.gone_by_rej += 1);
                }
                self.line_prio(
                    at,
                    4,
                    node,
                    format!("{name}: {out} → drop the TGT QPN, connect anew"),
                );
            }
            IniOutcome::Disconnected { by_peer: false } => {}
            other => self.line_prio(at, 4, node, format!("{name}: {other}")),
        }
    }

    fn render(&self) -> (String, Counts) {
        let mut r = self.inner();
        r.lines.sort_by_key(|l| (l.at, l.prio, l.seq));
        let mut out = String::new();
        for l in &r.lines {
            let _ = writeln!(
                out,
                "  +{}.{:03}s  {:<6} {}",
                l.at.as_secs(),
                l.at.subsec_millis(),
                l.who,
                l.text
            );
        }
        (out, r.counts)
    }
}

// --- the target node's model -------------------------------------------------------------

/// The target node's processes, device and registry, common to both transports.
struct TargetNode {
    kernel: KernelModel,
    procs: Vec<(ProcessId, SrqNum, ModelVerbs)>,
    dom: DomainId,
}

fn target_node(
    policy: OwnershipPolicy,
    timewait: Duration,
) -> Result<(TargetNode, XrcTarget), Error> {
    let kernel = KernelModel::new(ModelConfig::mlx5());
    let mut cfg = RegistryConfig {
        default_policy: policy,
        ..RegistryConfig::default()
    };
    cfg.policy.default_timewait = timewait;
    let mut reg = TgtRegistry::new(Box::new(kernel.spawn()), cfg);
    let dom = reg.open_domain("job42", DomainSpec::file(DOMAIN_FILE))?;
    let mut procs = Vec::new();
    for _ in PROCS {
        let mut v = kernel.spawn();
        let x = v.open_xrcd(&DomainSpec::existing(DOMAIN_FILE))?;
        let srq = XrcSrq::create(&mut v, x, &SrqAttr::default())?;
        procs.push((v.process(), srq.srqn(), v));
    }
    let mut target = XrcTarget::new(reg, XrcTargetConfig::default());
    for (i, (pid, srqn, _)) in procs.iter().enumerate() {
        target.serve(service(i), XrcService::new(dom, *pid, vec![*srqn]));
    }
    Ok((TargetNode { kernel, procs, dom }, target))
}

fn restarted_keeper(
    node: &TargetNode,
    policy: OwnershipPolicy,
    timewait: Duration,
) -> Result<TgtRegistry<ConnId>, Error> {
    let mut cfg = RegistryConfig {
        default_policy: policy,
        ..RegistryConfig::default()
    };
    cfg.policy.default_timewait = timewait;
    let mut reg = TgtRegistry::new(Box::new(node.kernel.spawn()), cfg);
    reg.open_domain("job42", DomainSpec::file(DOMAIN_FILE))?;
    Ok(reg)
}

// --- the transports ----------------------------------------------------------------------

/// What a scenario needs from a transport.
trait Fabric {
    fn rec(&self) -> &Rec;
    fn now(&self) -> Instant;
    /// Advances to `ms` of scenario time.
    fn at(&mut self, ms: u64) -> Result<(), Error>;
    /// Lets the messages in flight cross (a few ms).
    fn settle(&mut self) -> Result<(), Error>;
    /// Node `node` connects to process `p` as connection `name`, from a fresh INI QP if
    /// `fresh_qp` (a reconnect after the old QP went to error).
    fn connect(
        &mut self,
        node: usize,
        p: usize,
        data: XrcReqData,
        name: &str,
        fresh_qp: bool,
    ) -> Result<(), Error>;
    /// The initiator disconnects `name`.
    fn disconnect(&mut self, name: &str) -> Result<(), Error>;
    /// Acts on the target (the registry) and sends what follows.
    fn target(&mut self, f: TargetFn) -> Result<(), Error>;
    /// The TGT QPN node `node` was last given.
    fn tgt_qpn(&self, node: usize) -> Option<Qpn>;
}

/// An action on the target (run inside the tokio driver for the UDP fabric: `Send`).
type TargetFn = Box<dyn FnOnce(&mut XrcTarget, Instant) + Send>;

fn drain_trace(t: &mut XrcTarget, rec: &Rec) {
    while let Some(e) = t.registry_mut().poll_trace() {
        rec.trace(e.at, e.qpn, &e.what, e.verdict);
    }
}

/// ibcm's deterministic simulator.
struct SimFabric {
    net: SimNet,
    target: SimTarget,
    inis: Vec<SimInitiator>,
    qpns: Vec<u32>,
    names: Arc<Mutex<BTreeMap<(usize, ConnId), String>>>,
    conns: BTreeMap<String, (usize, ConnId)>,
    last_qpn: Arc<Mutex<BTreeMap<usize, Qpn>>>,
    t0: Instant,
    rec: Rec,
}

impl SimFabric {
    fn new(target: XrcTarget, rec: Rec) -> Self {
        let mut net = SimNet::new(42);
        net.set_all_links(ibcm::sim::Link {
            latency: Duration::from_millis(1),
            ..ibcm::sim::Link::default()
        });
        let cfg = EndpointConfig {
            timewait: Some(SIM_TIMEWAIT),
            ..EndpointConfig::default()
        };
        let t = net.add_node(EndpointConfig {
            local_ca_guid: Guid(0x7),
            ..cfg.clone()
        });
        let target = SimTarget::install(&mut net, t, target);
        target.with(&mut net, |x, ep, _| {
            for i in 0..PROCS.len() {
                if let Some(svc) = x.service(service(i)).cloned() {
                    x.listen(ep, service(i), svc);
                }
            }
        });
        let r = rec.clone();
        target.set_observer(Box::new(move |at, e| r.target_event(at, e)));
        let names: Arc<Mutex<BTreeMap<(usize, ConnId), String>>> = Arc::default();
        let last_qpn: Arc<Mutex<BTreeMap<usize, Qpn>>> = Arc::default();
        let mut inis = Vec::new();
        for (k, (node, guid, _)) in NODES.iter().enumerate() {
            let n = net.add_node(EndpointConfig {
                local_ca_guid: Guid(*guid),
                ..cfg.clone()
            });
            let ini = SimInitiator::install(&mut net, n);
            let (r, names, last) = (rec.clone(), names.clone(), last_qpn.clone());
            let node = (*node).to_owned();
            ini.set_observer(Box::new(move |at, e| {
                let name_of = |c: ConnId| {
                    names
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .get(&(k, c))
                        .cloned()
                        .unwrap_or_default()
                };
                match e {
                    IniEvent::Rep { conn, rep } => {
                        last.lock()
                            .unwrap_or_else(PoisonError::into_inner)
                            .insert(k, rep.tgt_qpn);
                        let srqns: Vec<String> =
                            rep.srqns().iter().map(|s| s.to_string()).collect();
                        r.count(|c| c.established += 1);
                        r.line(
                            at,
                            &node,
                            format!(
                                "REP {}: TGT QP {} (EECN), SRQN {} → RTU, established",
                                name_of(conn),
                                rep.tgt_qpn,
                                srqns.join(",")
                            ),
                        );
                    }
                    IniEvent::Closed { conn, outcome } => {
                        r.ini_outcome(at, &node, &name_of(conn), &outcome);
                    }
                    IniEvent::Established { .. } => {}
                }
            }));
            inis.push(ini);
        }
        let t0 = net.now();
        rec.start(t0);
        Self {
            net,
            target,
            inis,
            qpns: NODES.iter().map(|n| n.2).collect(),
            names,
            conns: BTreeMap::new(),
            last_qpn,
            t0,
            rec,
        }
    }

    fn trace(&mut self) {
        let rec = self.rec.clone();
        self.target
            .with(&mut self.net, |x, _, _| drain_trace(x, &rec));
    }
}

impl Fabric for SimFabric {
    fn rec(&self) -> &Rec {
        &self.rec
    }

    fn now(&self) -> Instant {
        self.net.now()
    }

    fn at(&mut self, ms: u64) -> Result<(), Error> {
        let at = self.t0 + Duration::from_millis(ms);
        self.net.run_until_time(at);
        self.trace();
        Ok(())
    }

    fn settle(&mut self) -> Result<(), Error> {
        let at = self.net.now() + Duration::from_millis(5);
        self.net.run_until_time(at);
        self.trace();
        Ok(())
    }

    fn connect(
        &mut self,
        node: usize,
        p: usize,
        data: XrcReqData,
        name: &str,
        fresh_qp: bool,
    ) -> Result<(), Error> {
        let (Some(ini), Some(q)) = (self.inis.get(node).cloned(), self.qpns.get_mut(node)) else {
            return Err("no such node".into());
        };
        if fresh_qp {
            *q += 1;
        }
        let ini_qpn = Qpn::new(*q).ok_or("bad INI QPN")?;
        let peer = self.net.addr(0);
        let conn = ini.connect(&mut self.net, peer, service(p), ini_qpn, &data)?;
        self.names
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert((node, conn), name.to_owned());
        self.conns.insert(name.to_owned(), (node, conn));
        self.settle()
    }

    fn disconnect(&mut self, name: &str) -> Result<(), Error> {
        let &(node, conn) = self.conns.get(name).ok_or("no such connection")?;
        let ini = self.inis.get(node).cloned().ok_or("no such node")?;
        ini.with_ep(&mut self.net, |_, ep, now| ep.disconnect(now, conn, &[]))?;
        self.rec.count(|c| c.ini_disconnects += 1);
        self.settle()
    }

    fn target(&mut self, f: TargetFn) -> Result<(), Error> {
        self.target.with(&mut self.net, |x, _, now| f(x, now));
        self.settle()
    }

    fn tgt_qpn(&self, node: usize) -> Option<Qpn> {
        self.last_qpn
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&node)
            .copied()
    }
}

/// RoCEv2 over UDP on loopback: the target is an [`XrcServer`] on ibcm's tokio runtime, the
/// initiators are `ibcm::rt::Cm` endpoints.
struct UdpFabric {
    rt: tokio::runtime::Runtime,
    server: XrcServer,
    target_addr: PeerAddr,
    inis: Vec<Cm>,
    qpns: Vec<u32>,
    conns: BTreeMap<String, Connection>,
    /// The TGT QPN each node was given. The async API shows an initiator no REP, so the
    /// demo reads it from the target's accept events.
    last_qpn: Arc<Mutex<BTreeMap<Guid, Qpn>>>,
    t0: Instant,
    rec: Rec,
}

/// Loopback addresses for the three endpoints: 127.0.10.x (Linux routes all of 127/8 to lo),
/// else 127.0.0.1; ephemeral ports, so nothing else on the machine is disturbed.
async fn bind3() -> Result<Vec<UdpTransport>, Error> {
    let mut first_err = None;
    for ips in [
        [[127, 0, 10, 1], [127, 0, 10, 2], [127, 0, 10, 3]],
        [[127, 0, 0, 1]; 3],
    ] {
        let mut got = Vec::new();
        for ip in ips {
            let addr = SocketAddr::new(IpAddr::V4(Ipv4Addr::from(ip)), 0);
            match UdpTransport::bind_port(addr).await {
                Ok(t) => got.push(t),
                Err(e) => {
                    first_err.get_or_insert(format!("{addr}: {e}"));
                    break;
                }
            }
        }
        if got.len() == 3 {
            return Ok(got);
        }
    }
    Err(format!(
        "cannot bind UDP sockets on loopback (127.0.10.x or 127.0.0.1): {}",
        first_err.unwrap_or_default()
    )
    .into())
}

impl UdpFabric {
    fn new(target: XrcTarget, rec: Rec, timewait: Duration) -> Result<Self, Error> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let (server, target_addr, inis, last_qpn) = rt.block_on(async {
            let mut socks = bind3().await?.into_iter();
            let (Some(ts), Some(a), Some(b)) = (socks.next(), socks.next(), socks.next()) else {
                return Err::<_, Error>("sockets".into());
            };
            let target_addr = PeerAddr::Udp(ts.socket_addr());
            let cfg = EndpointConfig {
                timewait: Some(timewait),
                local_ca_guid: Guid(0x7),
                ..EndpointConfig::default()
            };
            let last_qpn: Arc<Mutex<BTreeMap<Guid, Qpn>>> = Arc::default();
            let (r, last) = (rec.clone(), last_qpn.clone());
            let mut target = target;
            target.set_observer(Box::new(move |at, e| {
                if let TargetEvent::Accepted { peer, qpn, .. } = &e {
                    last.lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .insert(peer.ca_guid, *qpn);
                }
                r.target_event(at, e);
            }));
            let services: Vec<_> = (0..PROCS.len())
                .map(|i| (service(i), target.service(service(i)).cloned()))
                .collect();
            let (server, _) = XrcServer::bind(ts, cfg, target);
            for (sid, svc) in services {
                server.listen(sid, svc.ok_or("service")?).await?;
            }
            let mut inis = Vec::new();
            for (t, (_, guid, _)) in [a, b].into_iter().zip(NODES) {
                let (cm, _) = Cm::bind(
                    t,
                    EndpointConfig {
                        timewait: Some(timewait),
                        local_ca_guid: Guid(guid),
                        ..EndpointConfig::default()
                    },
                );
                inis.push(cm);
            }
            Ok((server, target_addr, inis, last_qpn))
        })?;
        let t0 = Instant::now();
        rec.start(t0);
        Ok(Self {
            rt,
            server,
            target_addr,
            inis,
            qpns: NODES.iter().map(|n| n.2).collect(),
            conns: BTreeMap::new(),
            last_qpn,
            t0,
            rec,
        })
    }

    fn trace(&mut self) {
        let rec = self.rec.clone();
        let _ = self
            .rt
            .block_on(self.server.with_target(move |x, _| drain_trace(x, &rec)));
    }

    fn sleep_until(&mut self, at: Instant) {
        self.rt.block_on(async move {
            tokio::time::sleep_until(tokio::time::Instant::from_std(at)).await;
        });
        self.trace();
    }
}

impl Drop for UdpFabric {
    fn drop(&mut self) {
        for cm in &self.inis {
            cm.shutdown();
        }
    }
}

impl Fabric for UdpFabric {
    fn rec(&self) -> &Rec {
        &self.rec
    }

    fn now(&self) -> Instant {
        Instant::now()
    }

    fn at(&mut self, ms: u64) -> Result<(), Error> {
        let at = self.t0 + Duration::from_millis(ms) / UDP_SCALE;
        self.sleep_until(at.max(Instant::now()));
        Ok(())
    }

    fn settle(&mut self) -> Result<(), Error> {
        self.sleep_until(Instant::now() + Duration::from_millis(15));
        Ok(())
    }

    fn connect(
        &mut self,
        node: usize,
        p: usize,
        data: XrcReqData,
        name: &str,
        fresh_qp: bool,
    ) -> Result<(), Error> {
        let (Some(cm), Some(q)) = (self.inis.get(node).cloned(), self.qpns.get_mut(node)) else {
            return Err("no such node".into());
        };
        if fresh_qp {
            *q += 1;
        }
        let ini_qpn = Qpn::new(*q).ok_or("bad INI QPN")?;
        let params = xrc_connect_params(self.target_addr, service(p), ini_qpn, &data, &[])?;
        let who = NODES.get(node).map_or("?", |n| n.0);
        let rec = self.rec.clone();
        let name_s = name.to_owned();
        let got = self.rt.block_on(async move {
            let r = tokio::time::timeout(Duration::from_secs(5), cm.connect(params)).await;
            match r {
                Ok(Ok(conn)) => {
                    rec.count(|c| c.established += 1);
                    rec.line(
                        Instant::now(),
                        who,
                        format!("{name_s}: REP/RTU → established"),
                    );
                    let (rec2, n2) = (rec.clone(), name_s.clone());
                    let c2 = conn.clone();
                    tokio::spawn(async move {
                        let e = c2.closed().await;
                        rec2.ini_outcome(Instant::now(), who, &n2, &IniOutcome::from_close(&e));
                    });
                    Ok(Some(conn))
                }
                Ok(Err(CmError::Connection(e))) => {
                    rec.ini_outcome(Instant::now(), who, &name_s, &IniOutcome::from_close(&e));
                    Ok(None)
                }
                Ok(Err(e)) => Err::<_, Error>(e.into()),
                Err(_) => Err(format!("{name_s}: no answer within 5 s").into()),
            }
        })?;
        if let Some(conn) = got {
            self.conns.insert(name.to_owned(), conn);
        }
        self.settle()
    }

    fn disconnect(&mut self, name: &str) -> Result<(), Error> {
        let conn = self.conns.get(name).cloned().ok_or("no such connection")?;
        self.rec.count(|c| c.ini_disconnects += 1);
        self.rt.block_on(async move {
            tokio::time::timeout(Duration::from_secs(5), conn.disconnect(&[])).await
        })?;
        self.settle()
    }

    fn target(&mut self, f: TargetFn) -> Result<(), Error> {
        self.rt.block_on(self.server.with_target(f))?;
        self.settle()
    }

    fn tgt_qpn(&self, node: usize) -> Option<Qpn> {
        let guid = Guid(NODES.get(node)?.1);
        self.last_qpn
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&guid)
            .copied()
    }
}

// --- the scenarios -----------------------------------------------------------------------

/// The common opening: A, then B, connect to t1, t2, t3 (mode any, asking for `policy`).
fn setup(f: &mut dyn Fabric, node: &TargetNode, policy: OwnershipPolicy) -> Result<(), Error> {
    for (k, base) in [(0usize, 0u64), (1, 100)] {
        for (p, name) in PROCS.iter().enumerate() {
            f.at(base + 10 * p as u64)?;
            let n = NODES.get(k).map_or("?", |x| x.0);
            let conn = format!("{n}→{name}");
            f.rec().named(n, name, &conn);
            f.rec().line(
                f.now(),
                n,
                format!("REQ {conn} (XRC, INI QP shared by {n}'s connections, mode any, policy {policy})"),
            );
            f.connect(k, p, XrcReqData::any(Some(policy)), &conn, false)?;
        }
    }
    kernel_view(f, node);
    Ok(())
}

fn kernel_view(f: &mut dyn Fabric, node: &TargetNode) {
    let snap = node.kernel.snapshot();
    let qps: Vec<String> = snap
        .tgt_qps
        .iter()
        .map(|(q, holders)| {
            format!(
                "{q} ({} handle{})",
                holders.len(),
                if holders.len() == 1 { "" } else { "s" }
            )
        })
        .collect();
    let text = if qps.is_empty() {
        "TGT QPs: none".to_owned()
    } else {
        format!("TGT QPs: {}", qps.join(", "))
    };
    f.rec().line(f.now(), "kernel", text);
}

fn pid(node: &TargetNode, p: usize) -> Result<ProcessId, Error> {
    node.procs
        .get(p)
        .map(|x| x.0)
        .ok_or_else(|| "no such process".into())
}

fn exit(f: &mut dyn Fabric, node: &TargetNode, p: usize) -> Result<(), Error> {
    let who = pid(node, p)?;
    let name = PROCS.get(p).copied().unwrap_or("?");
    f.rec().line(
        f.now(),
        name,
        "exits (its connections stay with the node's CM)".to_owned(),
    );
    f.target(Box::new(move |x, now| {
        x.registry_mut().process_exit(now, who);
    }))
}

fn disconnect(f: &mut dyn Fabric, node: &str, name: &str) -> Result<(), Error> {
    f.rec().line(
        f.now(),
        node,
        format!("{name}: DREQ (the initiator disconnects)"),
    );
    f.disconnect(name)
}

/// Node `k` reconnects to process `p` from a fresh INI QP.
fn reconnect(f: &mut dyn Fabric, k: usize, p: usize, data: XrcReqData) -> Result<(), Error> {
    let n = NODES.get(k).map_or("?", |x| x.0);
    let proc_ = PROCS.get(p).copied().unwrap_or("?");
    let name = format!("{n}→{proc_}'");
    f.rec().named(n, proc_, &name);
    let mode = match data.mode {
        ibcm_xrc::ReqMode::Attach(q) => format!("attach {q}"),
        ibcm_xrc::ReqMode::Any => "any".to_owned(),
        ibcm_xrc::ReqMode::Create => "create".to_owned(),
    };
    f.rec().line(
        f.now(),
        n,
        format!("REQ {name} from a new INI QP (mode {mode})"),
    );
    f.connect(k, p, data, &name, true)
}

fn explicit(f: &mut dyn Fabric, node: &TargetNode) -> Result<(), Error> {
    let policy = OwnershipPolicy::Explicit;
    setup(f, node, policy)?;
    let qa = f.tgt_qpn(0).ok_or("A has no TGT QP")?;
    f.at(1000)?;
    exit(f, node, 0)?;
    f.at(1200)?;
    disconnect(f, "A", "A→t3")?;
    f.at(1500)?;
    let t2 = pid(node, 1)?;
    f.rec().line(
        f.now(),
        "t2",
        format!("adopts TGT QP {qa}, then destroys it"),
    );
    f.target(Box::new(move |x, now| {
        let _ = x.registry_mut().adopt(now, qa, t2);
        let _ = x.registry_mut().destroy(now, qa, t2);
    }))?;
    f.at(1600)?;
    reconnect(f, 0, 1, XrcReqData::attach(qa))?;
    f.at(1700)?;
    reconnect(f, 0, 1, XrcReqData::any(Some(policy)))?;
    kernel_view(f, node);
    f.at(4000)?;
    kernel_view(f, node);
    Ok(())
}

fn domain_bound(f: &mut dyn Fabric, node: &TargetNode) -> Result<(), Error> {
    let policy = OwnershipPolicy::DomainBound;
    setup(f, node, policy)?;
    let qb = f.tgt_qpn(1).ok_or("B has no TGT QP")?;
    f.at(1000)?;
    exit(f, node, 0)?;
    kernel_view(f, node);
    f.at(1300)?;
    disconnect(f, "B", "B→t3")?;
    f.at(2000)?;
    f.rec().line(
        f.now(),
        "job",
        "ends: the keeper closes domain job42".to_owned(),
    );
    let dom = node.dom;
    f.target(Box::new(move |x, now| {
        let _ = x.registry_mut().close_domain(now, dom);
    }))?;
    f.at(2100)?;
    reconnect(f, 1, 1, XrcReqData::attach(qb))?;
    f.at(6500)?;
    kernel_view(f, node);
    Ok(())
}

fn process_bound(f: &mut dyn Fabric, node: &TargetNode) -> Result<(), Error> {
    let policy = OwnershipPolicy::ProcessBound;
    setup(f, node, policy)?;
    let qa = f.tgt_qpn(0).ok_or("A has no TGT QP")?;
    f.at(1000)?;
    disconnect(f, "A", "A→t3")?;
    f.at(1200)?;
    exit(f, node, 0)?;
    f.at(1300)?;
    reconnect(f, 0, 1, XrcReqData::attach(qa))?;
    f.at(1400)?;
    reconnect(f, 0, 1, XrcReqData::any(Some(policy)))?;
    kernel_view(f, node);
    f.at(6000)?;
    kernel_view(f, node);
    Ok(())
}

fn shared(
    f: &mut dyn Fabric,
    node: &TargetNode,
    restarted: TgtRegistry<ConnId>,
) -> Result<(), Error> {
    let policy = OwnershipPolicy::Shared;
    setup(f, node, policy)?;
    let qa = f.tgt_qpn(0).ok_or("A has no TGT QP")?;
    let qb = f.tgt_qpn(1).ok_or("B has no TGT QP")?;
    f.rec().line(
        f.now(),
        "note",
        "each connection holds a registration of its own (OFED-style)".to_owned(),
    );
    f.at(1000)?;
    exit(f, node, 0)?;
    f.rec().line(
        f.now(),
        "policy",
        "t1 held no registration of its own: both QPs are kept".to_owned(),
    );
    f.at(1100)?;
    disconnect(f, "A", "A→t1")?;
    disconnect(f, "A", "A→t2")?;
    f.at(1200)?;
    disconnect(f, "A", "A→t3")?;
    f.at(1300)?;
    reconnect(f, 0, 1, XrcReqData::attach(qa))?;
    kernel_view(f, node);
    f.at(2000)?;
    f.rec().line(
        f.now(),
        "keeper",
        "is SIGKILLed: the kernel drops every handle it held; a new keeper starts".to_owned(),
    );
    f.target(Box::new(move |x, now| x.keeper_crash(now, restarted)))?;
    kernel_view(f, node);
    f.at(2100)?;
    reconnect(f, 1, 1, XrcReqData::attach(qb))?;
    f.at(2200)?;
    reconnect(f, 1, 1, XrcReqData::any(Some(policy)))?;
    Ok(())
}

/// Which transports to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Transports {
    /// The simulator only.
    Sim,
    /// The simulator, then UDP on loopback.
    Both,
}

/// The four policies, in matrix order, with a one-line summary.
pub(crate) const POLICIES: [(OwnershipPolicy, &str); 4] = [
    (
        OwnershipPolicy::Explicit,
        "lives until its owner destroys it; survives the creator as an orphan",
    ),
    (
        OwnershipPolicy::DomainBound,
        "survives its creator; destroyed when the domain is closed",
    ),
    (
        OwnershipPolicy::ProcessBound,
        "destroyed when the creating process exits",
    ),
    (
        OwnershipPolicy::Shared,
        "reference-counted; destroyed at the last unregistration",
    ),
];

/// Plays one policy on one transport.
pub(crate) fn play(policy: OwnershipPolicy, udp: bool) -> Result<Played, Error> {
    let timewait = if udp {
        SIM_TIMEWAIT / UDP_SCALE
    } else {
        SIM_TIMEWAIT
    };
    let (node, target) = target_node(policy, timewait)?;
    let restarted = restarted_keeper(&node, policy, timewait)?;
    let rec = Rec::default();
    let mut fabric: Box<dyn Fabric> = if udp {
        Box::new(UdpFabric::new(target, rec.clone(), timewait)?)
    } else {
        Box::new(SimFabric::new(target, rec.clone()))
    };
    let f = fabric.as_mut();
    match policy {
        OwnershipPolicy::Explicit => explicit(f, &node)?,
        OwnershipPolicy::DomainBound => domain_bound(f, &node)?,
        OwnershipPolicy::ProcessBound => process_bound(f, &node)?,
        OwnershipPolicy::Shared => shared(f, &node, restarted)?,
    }
    drop(fabric);
    let (text, counts) = rec.render();
    Ok(Played {
        policy,
        transport: if udp { "UDP" } else { "simulator" },
        text,
        counts,
    })
}

/// Plays every policy on the chosen transports, calling `out` with each timeline.
pub(crate) fn run(which: Transports, mut out: impl FnMut(&Played)) -> Result<Vec<Played>, Error> {
    let mut all = Vec::new();
    for (policy, _) in POLICIES {
        let sim = play(policy, false)?;
        out(&sim);
        all.push(sim);
        if which == Transports::Both {
            let udp = play(policy, true)?;
            out(&udp);
            all.push(udp);
        }
    }
    Ok(all)
}

/// The heading of a played scenario.
pub(crate) fn heading(p: &Played) -> String {
    let what = POLICIES
        .iter()
        .find(|(q, _)| *q == p.policy)
        .map_or("", |(_, w)| *w);
    let how = if p.transport == "UDP" {
        format!(
            "RoCEv2/UDP on loopback, ibcm::rt + XrcServer, real time ÷{UDP_SCALE}, TimeWait {} ms",
            (SIM_TIMEWAIT / UDP_SCALE).as_millis()
        )
    } else {
        format!(
            "ibcm simulator, virtual time, 1 ms links, TimeWait {} ms",
            SIM_TIMEWAIT.as_millis()
        )
    };
    format!("== {} [{}]: {what}\n   ({how})", p.policy, p.transport)
}

/// The wire summary of a played scenario.
pub(crate) fn summary(p: &Played) -> String {
    let c = p.counts;
    format!(
        "   wire: {} connections established; {} closed by a target DREQ with the target-gone block; {} REQs answered REJ 1 + target-gone ARI; {} initiator DREQs",
        c.established, c.gone_by_dreq, c.gone_by_rej, c.ini_disconnects
    )
}
