//! Each TGT QP ownership policy played out on the software model, as a timeline.
//!
//! ```text
//! cargo run -p ibcm-xrc --example xrc_policies
//! ```
//!
//! The setting: a target node T runs P = 3 processes (t1, t2, t3) of one job. Each has its own
//! XRC SRQ in the job's domain. Q = 2 remote nodes (A, B) each run an initiator process with one
//! INI QP, and each initiator opens one logical connection to every target process. All
//! connections from one remote node land on **one TGT QP** (REQ mode "any": the first REQ
//! creates it, the others attach), so T holds 2 TGT QPs instead of 6. A keeper process on T
//! holds the handles and enforces the policy; the CM side is simulated (the lines marked `CM`
//! are what the ibcm CM does with the registry's answers).
//!
//! Then, per policy, the events of the crate-doc matrix happen and the timeline shows what
//! the policy does: who gets a DREQ, which QPN is quarantined, what a reconnect is answered.

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use ibcm_mad::{Guid, Qpn};
use ibcm_xrc::sim::{SimConfig, SimKernel, SimVerbs};
use ibcm_xrc::wire::ReqMode;
use ibcm_xrc::{
    ConnEvent, DomainId, DomainSpec, IncomingReq, IniPeer, IniQp, IniQpCaps, OwnershipPolicy,
    PolicyAction, ProcessId, RegistryConfig, SrqAttr, SrqNum, TargetGone, TgtRegistry, Verbs,
    Verdict, XrcReqData, XrcSrq,
};

const DOMAIN_FILE: &str = "/tmp/job42.xrcd";
const TIMEWAIT: Duration = Duration::from_millis(800);

/// A target-node process: its simulated verbs context and its XRC SRQ.
struct TargetProc {
    name: &'static str,
    verbs: Option<SimVerbs>,
    pid: ProcessId,
    srqn: SrqNum,
}

/// A remote node's initiator: its INI QP (on its own simulated device).
struct Initiator {
    node: &'static str,
    guid: Guid,
    ini_qpn: Qpn,
    _verbs: SimVerbs,
}

struct Demo {
    t0: Instant,
    now: Instant,
    target: SimKernel,
    reg: Option<TgtRegistry<String>>,
    dom: DomainId,
    procs: Vec<TargetProc>,
    inis: Vec<Initiator>,
    out: String,
}

impl Demo {
    fn new(policy: OwnershipPolicy) -> Result<Self, Box<dyn std::error::Error>> {
        let t0 = Instant::now();
        let target = SimKernel::new(SimConfig::mlx5());
        let keeper = target.spawn();
        let mut cfg = RegistryConfig {
            default_policy: policy,
            ..RegistryConfig::default()
        };
        // Quarantine for the connections' TimeWait (the default floor is 4.3 s).
        cfg.policy.default_timewait = TIMEWAIT;
        let mut reg = TgtRegistry::new(Box::new(keeper), cfg);
        let dom = reg.open_domain("job42", DomainSpec::file(DOMAIN_FILE))?;
        let mut procs = Vec::new();
        for name in ["t1", "t2", "t3"] {
            let mut v = target.spawn();
            let x = v.open_xrcd(&DomainSpec::existing(DOMAIN_FILE))?;
            let srq = XrcSrq::create(&mut v, x, &SrqAttr::default())?;
            procs.push(TargetProc {
                name,
                pid: v.process(),
                verbs: Some(v),
                srqn: srq.srqn(),
            });
        }
        let mut inis = Vec::new();
        for (node, guid) in [("A", 0xa0a0), ("B", 0xb0b0)] {
            let remote = SimKernel::new(SimConfig {
                first_qpn: if node == "A" { 0x1a0 } else { 0x1b0 },
                ..SimConfig::mlx5()
            });
            let mut v = remote.spawn();
            let ini = IniQp::create(&mut v, &IniQpCaps::default())?;
            inis.push(Initiator {
                node,
                guid: Guid(guid),
                ini_qpn: ini.qpn(),
                _verbs: v,
            });
        }
        Ok(Self {
            t0,
            now: t0,
            target,
            reg: Some(reg),
            dom,
            procs,
            inis,
            out: String::new(),
        })
    }

    fn reg(&mut self) -> &mut TgtRegistry<String> {
        // Present until `keeper_crash`, the last step of a scenario.
        self.reg.get_or_insert_with(unreachable_registry)
    }

    fn at(&mut self, ms: u64) {
        self.now = self.t0 + Duration::from_millis(ms);
    }

    fn line(&mut self, who: &str, text: &str) {
        let d = self.now.saturating_duration_since(self.t0);
        let _ = writeln!(
            self.out,
            "  +{}.{:03}s  {who:<6} {text}",
            d.as_secs(),
            d.subsec_millis()
        );
    }

    fn proc_index(&self, name: &str) -> usize {
        self.procs.iter().position(|p| p.name == name).unwrap_or(0)
    }

    /// Initiator `node` connects to target process `to`.
    fn connect(&mut self, node: usize, to: &str, mode: ReqMode) -> Option<Qpn> {
        let (ini_node, guid, ini_qpn) = match self.inis.get(node) {
            Some(i) => (i.node, i.guid, i.ini_qpn),
            None => return None,
        };
        let p = self.proc_index(to);
        let (pid, srqn) = match self.procs.get(p) {
            Some(t) => (t.pid, t.srqn),
            None => return None,
        };
        let conn = format!("{ini_node}→{to}");
        let mode_text = match mode {
            ReqMode::Any => "any".to_owned(),
            ReqMode::Create => "create".to_owned(),
            ReqMode::Attach(q) => format!("attach {q}"),
        };
        self.line(
            ini_node,
            &format!("REQ {conn} from INI {ini_qpn} (XRC, mode {mode_text})"),
        );
        let req = IncomingReq {
            conn: conn.clone(),
            domain: self.dom,
            process: pid,
            peer: IniPeer {
                ca_guid: guid,
                ini_qpn,
            },
            data: XrcReqData { mode, policy: None },
            timewait: TIMEWAIT,
            srqns: vec![srqn],
        };
        let now = self.now;
        match self.reg().handle_req(now, &req) {
            Ok(acc) => {
                let how = if acc.created {
                    format!(
                        "created TGT QP {} [{}], creator {to}",
                        acc.tgt_qpn, acc.policy
                    )
                } else {
                    format!("attached to TGT QP {}", acc.tgt_qpn)
                };
                self.line(
                    "T",
                    &format!("{how}; REP: EECN={} SRQ=1, SRQN {srqn}", acc.tgt_qpn),
                );
                self.reg()
                    .handle_conn_event(now, &conn, ConnEvent::Established);
                self.line(
                    ini_node,
                    &format!("RTU {conn}: established, sends to SRQN {srqn}"),
                );
                self.drain();
                Some(acc.tgt_qpn)
            }
            Err(rej) => {
                self.drain();
                self.reject(ini_node, &rej);
                None
            }
        }
    }

    fn reject(&mut self, node: &str, rej: &TargetGone) {
        let ari: Vec<String> = rej.to_bytes().iter().map(|b| format!("{b:02x}")).collect();
        self.line(
            "T CM",
            &format!(
                "REJ reason {} ({}) ARI {}",
                rej.reason().raw(),
                rej.reason().name(),
                ari.join(" ")
            ),
        );
        let meaning = if rej.is_gone() {
            "target gone: forget the TGT QPN, reconnect with mode any"
        } else {
            "refused"
        };
        self.line(node, &format!("{rej} → {meaning}"));
    }

    /// Prints what the registry decided and asks the CM to do.
    fn drain(&mut self) {
        let mut lines = Vec::new();
        if let Some(reg) = self.reg.as_mut() {
            while let Some(t) = reg.poll_trace() {
                if let Some(v) = t.verdict {
                    let verdict = match v {
                        Verdict::Kept => "kept".to_owned(),
                        Verdict::Released(c) => format!("RELEASED ({c})"),
                        Verdict::AlreadyGone(c) => format!("already gone ({c})"),
                    };
                    lines.push((
                        "policy",
                        format!("TGT QP {}: {} → {verdict}", t.qpn, t.what),
                    ));
                }
            }
            while let Some(a) = reg.poll_action() {
                let l = match a {
                    PolicyAction::SendDreq { conn, qpn, cause } => (
                        "T CM",
                        format!("DREQ {conn} (TGT QP {qpn}: {cause}); the initiator answers DREP"),
                    ),
                    PolicyAction::ReportOrphan { qpn } => (
                        "policy",
                        format!("TGT QP {qpn} is an orphan: any process may adopt or destroy it"),
                    ),
                    PolicyAction::NotifyHolders { qpn, cause } => (
                        "keeper",
                        format!("tells the holders of {qpn}: gone ({cause})"),
                    ),
                    other => ("policy", format!("{other:?}")),
                };
                lines.push(l);
            }
        }
        for (who, l) in lines {
            self.line(who, &l);
        }
    }

    fn peer_leaves(&mut self, conn: &str, ev: ConnEvent) {
        let what = if ev == ConnEvent::PeerDreq {
            "DREQ (disconnect)"
        } else {
            "stops answering: DREQ retries exhausted"
        };
        let node = conn.split('→').next().unwrap_or("?").to_owned();
        self.line(&node, &format!("{conn}: {what}"));
        let now = self.now;
        self.reg().handle_conn_event(now, &conn.to_owned(), ev);
        self.drain();
    }

    fn exit(&mut self, name: &str) {
        let p = self.proc_index(name);
        let pid = self.procs.get(p).map(|t| t.pid);
        if let (Some(t), Some(pid)) = (self.procs.get_mut(p), pid) {
            t.verbs = None; // the process exits: its handles (SRQ, XRCD) go
            self.line(name, "exits (its CM connections stay with the node's CM)");
            let now = self.now;
            self.reg().process_exit(now, pid);
            self.drain();
        }
    }

    fn kernel_view(&mut self) {
        let snap = self.target.snapshot();
        let keeper = self.reg.as_ref().map(|r| r.verbs().process());
        let qps: Vec<String> = snap
            .tgt_qps
            .iter()
            .map(|(q, holders)| {
                let who: Vec<String> = holders
                    .iter()
                    .map(|h| {
                        if Some(*h) == keeper {
                            "keeper".to_owned()
                        } else {
                            h.to_string()
                        }
                    })
                    .collect();
                format!("{q} held by {}", who.join(","))
            })
            .collect();
        self.line(
            "kernel",
            &format!(
                "TGT QPs: {}",
                if qps.is_empty() {
                    "none".to_owned()
                } else {
                    qps.join("; ")
                }
            ),
        );
    }

    fn quarantine_ends(&mut self, ms: u64) {
        self.at(ms);
        let now = self.now;
        self.reg().handle_timeout(now);
        self.line(
            "T",
            "quarantine over: held QPs destroyed, numbers free again",
        );
        self.drain();
        self.kernel_view();
    }

    /// The opening common to every policy: both remote nodes connect to t1, t2, t3.
    fn setup(&mut self) -> (Qpn, Qpn) {
        let mut qa = None;
        let mut qb = None;
        for (i, ms) in [(0usize, 0u64), (1, 100)] {
            for (j, t) in ["t1", "t2", "t3"].into_iter().enumerate() {
                self.at(ms + 10 * j as u64);
                let q = self.connect(i, t, ReqMode::Any);
                if i == 0 {
                    qa = qa.or(q);
                } else {
                    qb = qb.or(q);
                }
            }
        }
        self.kernel_view();
        let fallback = Qpn::masked(0);
        (qa.unwrap_or(fallback), qb.unwrap_or(fallback))
    }

    fn keeper_crash(&mut self) {
        let now = self.now;
        if let Some(reg) = self.reg.take() {
            self.line(
                "keeper",
                "is SIGKILLed: the kernel drops every handle it held",
            );
            let acts = reg.crash(now);
            for a in acts {
                if let PolicyAction::SendDreq { conn, qpn, cause } = a {
                    self.line("T CM", &format!("DREQ {conn} (TGT QP {qpn}: {cause})"));
                }
            }
            self.line(
                "client",
                "a restarted keeper has another epoch: all keeper-held QPs are gone",
            );
            self.kernel_view();
        }
    }
}

fn unreachable_registry() -> TgtRegistry<String> {
    // Only reached if a scenario used the registry after `keeper_crash`; a fresh, empty one
    // keeps the example total.
    let k = SimKernel::new(SimConfig::mlx5());
    TgtRegistry::new(Box::new(k.spawn()), RegistryConfig::default())
}

fn explicit() -> Result<String, Box<dyn std::error::Error>> {
    let mut d = Demo::new(OwnershipPolicy::Explicit)?;
    let (qa, _qb) = d.setup();
    d.at(1000);
    d.exit("t1");
    d.kernel_view();
    d.at(1200);
    for c in ["A→t1", "A→t2", "A→t3"] {
        d.peer_leaves(c, ConnEvent::PeerDreq);
    }
    let leaks: Vec<String> = d.reg().leaks().iter().map(|l| l.qpn.to_string()).collect();
    d.line("keeper", &format!("leaks: {}", leaks.join(", ")));
    d.at(1500);
    let t2 = d.procs.get(1).map(|p| p.pid);
    if let Some(t2) = t2 {
        let now = d.now;
        d.reg().adopt(now, qa, t2)?;
        d.line("t2", &format!("adopts TGT QP {qa}, then destroys it"));
        d.reg().destroy(now, qa, t2)?;
        d.drain();
    }
    d.at(1600);
    d.connect(0, "t1", ReqMode::Attach(qa));
    d.quarantine_ends(4000);
    Ok(d.out)
}

fn domain_bound() -> Result<String, Box<dyn std::error::Error>> {
    let mut d = Demo::new(OwnershipPolicy::DomainBound)?;
    let (_qa, qb) = d.setup();
    d.at(1000);
    d.exit("t1");
    d.kernel_view();
    d.at(1300);
    d.peer_leaves("B→t3", ConnEvent::PeerTimeout);
    d.at(2000);
    d.line("job", "ends: the keeper closes domain job42");
    let (now, dom) = (d.now, d.dom);
    d.reg().close_domain(now, dom)?;
    d.drain();
    d.at(2100);
    d.connect(1, "t2", ReqMode::Attach(qb));
    d.quarantine_ends(6500);
    Ok(d.out)
}

fn process_bound() -> Result<String, Box<dyn std::error::Error>> {
    let mut d = Demo::new(OwnershipPolicy::ProcessBound)?;
    let (qa, _qb) = d.setup();
    d.at(1000);
    d.peer_leaves("A→t3", ConnEvent::PeerDreq);
    d.at(1200);
    d.exit("t1");
    d.at(1300);
    d.connect(0, "t2", ReqMode::Attach(qa));
    d.at(1400);
    d.connect(0, "t2", ReqMode::Any);
    d.kernel_view();
    d.quarantine_ends(6000);
    Ok(d.out)
}

fn shared() -> Result<String, Box<dyn std::error::Error>> {
    let mut d = Demo::new(OwnershipPolicy::Shared)?;
    let (qa, _qb) = d.setup();
    d.line(
        "note",
        "each connection holds a registration of its own (OFED-style)",
    );
    d.at(1000);
    d.exit("t1");
    d.line(
        "policy",
        "t1 held no registration of its own: both QPs are kept",
    );
    d.at(1100);
    for c in ["A→t1", "A→t2"] {
        d.peer_leaves(c, ConnEvent::PeerDreq);
    }
    d.at(1200);
    d.peer_leaves("A→t3", ConnEvent::PeerDreq);
    d.at(1300);
    d.connect(0, "t2", ReqMode::Attach(qa));
    d.kernel_view();
    d.at(2000);
    d.keeper_crash();
    Ok(d.out)
}

/// A scenario: the timeline it printed.
type Scenario = fn() -> Result<String, Box<dyn std::error::Error>>;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("XRC TGT QP ownership policies (software model of the modern kernel)");
    println!(
        "target node T: processes t1 t2 t3 in domain {DOMAIN_FILE}; remote nodes A, B: one INI QP each"
    );
    println!(
        "CM TimeWait of every connection: {} ms\n",
        TIMEWAIT.as_millis()
    );
    let scenarios: [(&str, &str, Scenario); 4] = [
        (
            "Explicit",
            "lives until its owner destroys it; survives the creator as an orphan",
            explicit,
        ),
        (
            "DomainBound",
            "survives its creator; destroyed when the domain is closed",
            domain_bound,
        ),
        (
            "ProcessBound",
            "destroyed when the creating process exits",
            process_bound,
        ),
        (
            "Shared",
            "reference-counted; destroyed at the last unregistration",
            shared,
        ),
    ];
    for (name, what, run) in scenarios {
        println!("== {name}: {what}");
        print!("{}", run()?);
        println!();
    }
    Ok(())
}
