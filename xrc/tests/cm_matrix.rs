//! The policy × event matrix of the crate docs through **real CM traffic**: one test per cell,
//! an XRC initiator node and a target node on ibcm's deterministic simulator, the target
//! answering with [`XrcTarget`]. Each cell checks what crosses the wire — DREQs from the
//! target when the TGT QP goes away (counted; the initiator sees
//! `Closed(Disconnected { by_peer: true })` carrying the "target gone" block), REJ reason 1
//! with the defined ARI for a reconnect naming a gone QP (decoded as
//! [`IniOutcome::TargetGone`]), the QPN kept out of use until the CM TimeWait has passed, and
//! for "kept" cells: no DREQ, the other connections untouched, a new connection attaching to
//! the same TGT QP (while an earlier one is still in TimeWait on the target).
#![cfg(feature = "cm")]
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::time::Duration;

use ibcm::proto::{ConnId, ConnectionError, EndpointConfig, EventKind, PeerAddr};
use ibcm::sim::SimNet;
use ibcm_mad::{AttrId, Qpn, RejReason, ServiceId, TimeoutExp, U4};
use ibcm_xrc::cm::sim::{SimInitiator, SimTarget};
use ibcm_xrc::cm::{
    xrc_connect_params, GoneSignal, IniOutcome, TargetEvent, XrcService, XrcTarget, XrcTargetConfig,
};
use ibcm_xrc::verbs::model::{KernelModel, ModelConfig};
use ibcm_xrc::RejectKind;
use ibcm_xrc::{
    ConnEvent, DomainId, DomainSpec, GoneCause, OwnershipPolicy as P, ProcessId, QpState,
    QpnStatus, Registrant, RegistryConfig, SrqNum, TargetGone, TgtRegistry, Verbs, Verdict,
    XrcReqData,
};

/// The target's CM TimeWait (and so the TGT QPN quarantine).
const T_TW: Duration = Duration::from_secs(2);
/// The initiator's CM TimeWait: shorter, so the INI QP can connect again while the target
/// still has the old connection in TimeWait.
const I_TW: Duration = Duration::from_millis(200);
const SID: ServiceId = ServiceId(0x1000);
const DOMAIN: &str = "/tmp/ibcm-xrc-cm-matrix.xrcd";

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn srqn() -> SrqNum {
    SrqNum::new(0x10).unwrap()
}

/// One INI QP.
fn ini_qp() -> Qpn {
    Qpn::new(0x99).unwrap()
}

struct Cell {
    net: SimNet,
    kernel: KernelModel,
    target: SimTarget,
    ini: SimInitiator,
    t: usize,
    i: usize,
    dom: DomainId,
    creator: ProcessId,
    other: ProcessId,
    qpn: Qpn,
    peer: PeerAddr,
    /// Initiator-side connection IDs, in setup order.
    conns: Vec<ConnId>,
    next_ini: u32,
}

fn registry(kernel: &KernelModel, connection_registrations: bool) -> TgtRegistry<ConnId> {
    let mut cfg = RegistryConfig {
        connection_registrations,
        ..RegistryConfig::default()
    };
    // The connections' TimeWait decides the quarantine.
    cfg.policy.default_timewait = ms(100);
    TgtRegistry::new(Box::new(kernel.spawn()), cfg)
}

/// A TGT QP of `policy` created by `creator`, and connections to it through the CM:
/// `established` of them established, then `stalled` whose RTU the initiator holds back.
fn cell(policy: P, connection_registrations: bool, established: usize, stalled: usize) -> Cell {
    cell_on(
        KernelModel::new(ModelConfig::mlx5()),
        policy,
        connection_registrations,
        established,
        stalled,
    )
}

fn cell_on(
    kernel: KernelModel,
    policy: P,
    connection_registrations: bool,
    established: usize,
    stalled: usize,
) -> Cell {
    let creator = kernel.spawn().process();
    let other = kernel.spawn().process();
    let mut reg = registry(&kernel, connection_registrations);
    let mut net = SimNet::new(0x5eed);
    let now = net.now();
    let dom = reg.open_domain("job", DomainSpec::file(DOMAIN)).unwrap();
    let qpn = reg.create_tgt_qp(now, dom, policy, creator).unwrap();
    let t = net.add_node(EndpointConfig {
        timewait: Some(T_TW),
        ..EndpointConfig::default()
    });
    let i = net.add_node(EndpointConfig {
        timewait: Some(I_TW),
        mra_on_duplicate_rep: None,
        ..EndpointConfig::default()
    });
    let target = SimTarget::install(&mut net, t, XrcTarget::new(reg, XrcTargetConfig::default()));
    target.with(&mut net, |x, ep, _| {
        x.listen(ep, SID, XrcService::new(dom, other, vec![srqn()]));
    });
    let ini = SimInitiator::install(&mut net, i);
    let peer = net.addr(t);
    let mut c = Cell {
        net,
        kernel,
        target,
        ini,
        t,
        i,
        dom,
        creator,
        other,
        qpn,
        peer,
        conns: Vec::new(),
        next_ini: 0x9a,
    };
    for _ in 0..established {
        let conn = c.connect(ini_qp(), XrcReqData::attach(qpn), false);
        c.conns.push(conn);
    }
    for _ in 0..stalled {
        let conn = c.connect(ini_qp(), XrcReqData::attach(qpn), true);
        c.conns.push(conn);
    }
    c.run(ms(20));
    for (n, &conn) in c.conns.iter().enumerate() {
        let rep = c.ini.with(|x| x.rep(conn).cloned()).expect("REP");
        assert_eq!(rep.tgt_qpn, qpn, "the REP's EECN is the TGT QPN");
        assert_eq!(rep.srqns(), vec![srqn()], "the REP carries the SRQNs");
        if n < established {
            assert!(c.ini.with(|x| x.is_established(conn)));
        }
    }
    if established + stalled > 0 {
        assert_eq!(
            c.kernel.qp_state(qpn),
            Some(QpState::Rtr),
            "brought up by the target"
        );
    }
    c.events();
    c.net.take_events(c.i);
    c
}

impl Cell {
    fn run(&mut self, d: Duration) {
        let at = self.net.now() + d;
        self.net.run_until_time(at);
    }

    /// Connects from `ini_qpn`; `stall` holds the RTU back (with short REP timeouts, so the
    /// target gives up quickly).
    fn connect(&mut self, ini_qpn: Qpn, data: XrcReqData, stall: bool) -> ConnId {
        let mut p = xrc_connect_params(self.peer, SID, ini_qpn, &data, &[]).unwrap();
        if stall {
            p.local_cm_response_timeout = TimeoutExp::masked(14);
            p.max_cm_retries = U4::masked(2);
        }
        let conn = self.ini.connect_with(&mut self.net, p).unwrap();
        if stall {
            self.ini.with(|x| x.hold_rtu(conn));
        }
        conn
    }

    /// Connects from a fresh INI QP and waits for the outcome.
    fn reconnect(&mut self, data: XrcReqData) -> (ConnId, Option<IniOutcome>) {
        let q = Qpn::new(self.next_ini).unwrap();
        self.next_ini += 1;
        let conn = self.connect(q, data, false);
        self.run(ms(20));
        (conn, self.ini.with(|x| x.outcome(conn).cloned()))
    }

    fn dreqs(&self) -> u64 {
        self.net.sent_count(self.t, AttrId::Dreq)
    }

    fn rejs(&self) -> u64 {
        self.net.sent_count(self.t, AttrId::Rej)
    }

    fn events(&mut self) -> Vec<TargetEvent> {
        let mut t = self.target.target_mut();
        std::iter::from_fn(|| t.poll_event()).collect()
    }

    fn act<R>(&mut self, f: impl FnOnce(&mut TgtRegistry<ConnId>, std::time::Instant) -> R) -> R {
        self.target
            .with(&mut self.net, |x, _, now| f(x.registry_mut(), now))
    }

    fn ini_disconnect(&mut self, conn: ConnId) {
        self.ini
            .with_ep(&mut self.net, |_, ep, now| ep.disconnect(now, conn, &[]))
            .unwrap();
    }

    fn established(&self, conn: ConnId) -> bool {
        self.ini.with(|x| x.is_established(conn))
    }
}

/// The QP is released for `cause`: the target sends a DREQ to each of `torn` (and to no one
/// else), the initiator sees them closed by the peer with the "target gone" block, the QP
/// is held in ERR for the quarantine (unless `held` is false: a keeper crash), its number is
/// quarantined at least as long as the target CM's TimeWait, a reconnect naming it gets REJ
/// reason 1 with the ARI; after the quarantine the QP is destroyed and the number unknown.
fn released(c: &mut Cell, dreqs_before: u64, cause: GoneCause, torn: &[ConnId], held: bool) {
    c.run(ms(50));
    assert_eq!(
        c.dreqs() - dreqs_before,
        torn.len() as u64,
        "one DREQ per connection on the QP\n{}",
        c.net.dump_trace()
    );
    let evs = c.net.take_events(c.i);
    for conn in torn {
        let closed = evs
            .iter()
            .find_map(|(_, e)| match &e.kind {
                EventKind::Closed(err) if e.conn == *conn => Some(err.clone()),
                _ => None,
            })
            .expect("closed");
        assert!(
            matches!(closed, ConnectionError::Disconnected { by_peer: true, .. }),
            "{closed:?}"
        );
        assert_eq!(
            c.ini.with(|x| x.outcome(*conn).cloned()),
            Some(IniOutcome::TargetGone {
                cause,
                qpn: Some(c.qpn),
                by: GoneSignal::Dreq
            })
        );
    }
    if held {
        assert!(c.kernel.tgt_qp_exists(c.qpn), "held during the quarantine");
        assert_eq!(c.kernel.qp_state(c.qpn), Some(QpState::Err));
    } else {
        assert!(!c.kernel.tgt_qp_exists(c.qpn));
    }
    let now = c.net.now();
    let until = match c.target.target().registry().qpn_status(c.qpn, now) {
        QpnStatus::Quarantined { cause: got, until } => {
            assert_eq!(got, cause);
            until
        }
        other => panic!("{other:?}"),
    };
    if let Some(cm_until) = c.net.endpoint_ref(c.t).qpn_quarantined(c.qpn, now) {
        assert!(until >= cm_until, "the quarantine covers the CM TimeWait");
    }
    // A reconnect naming the QP: REJ 1 + the ARI.
    let rejs = c.rejs();
    let (conn, out) = c.reconnect(XrcReqData::attach(c.qpn));
    assert_eq!(c.rejs() - rejs, 1);
    assert_eq!(
        out,
        Some(IniOutcome::TargetGone {
            cause,
            qpn: Some(c.qpn),
            by: GoneSignal::Rej
        })
    );
    let raw = c
        .net
        .take_events(c.i)
        .into_iter()
        .find_map(|(_, e)| match e.kind {
            EventKind::Closed(ConnectionError::Rejected { reason, ari, .. }) if e.conn == conn => {
                Some((reason, ari))
            }
            _ => None,
        })
        .unwrap();
    assert_eq!(raw.0, RejReason::NoQp);
    assert_eq!(raw.1, TargetGone::gone(cause, c.qpn).to_bytes());
    // After the quarantine: destroyed, the number forgotten.
    c.run(T_TW + ms(500));
    assert!(!c.kernel.tgt_qp_exists(c.qpn));
    let now = c.net.now();
    assert_eq!(
        c.target.target().registry().qpn_status(c.qpn, now),
        QpnStatus::Unknown
    );
    assert!(c
        .net
        .endpoint_ref(c.t)
        .qpn_quarantined(c.qpn, now)
        .is_none());
    let (_, out) = c.reconnect(XrcReqData::attach(c.qpn));
    assert!(
        matches!(
            out,
            Some(IniOutcome::TargetGone {
                cause: GoneCause::Unknown,
                ..
            })
        ),
        "{out:?}"
    );
}

/// The QP is kept: no DREQ from the target, `up` still established, the QP alive through
/// the quarantine period, and (if `attach_ok`) a new connection from the same INI QP
/// attaches to it — while the target still holds an earlier connection in TimeWait.
fn kept(c: &mut Cell, dreqs_before: u64, up: &[ConnId], attach_ok: bool) {
    c.run(ms(50));
    assert_eq!(c.dreqs(), dreqs_before, "no DREQ\n{}", c.net.dump_trace());
    for conn in up {
        assert!(c.established(*conn), "connection untouched");
    }
    let now = c.net.now();
    assert_eq!(
        c.target.target().registry().qpn_status(c.qpn, now),
        QpnStatus::Live
    );
    // Past the initiator's TimeWait (its INI QPN is free again), inside the target's.
    c.run(I_TW + ms(50));
    let conn = c.connect(ini_qp(), XrcReqData::attach(c.qpn), false);
    c.run(ms(20));
    if attach_ok {
        assert!(c.established(conn), "{}", c.net.dump_trace());
        assert_eq!(c.ini.with(|x| x.rep(conn).map(|r| r.tgt_qpn)), Some(c.qpn));
    } else {
        let out = c.ini.with(|x| x.outcome(conn).cloned());
        assert!(
            matches!(out, Some(IniOutcome::TargetGone { .. })),
            "{out:?}"
        );
    }
    c.run(T_TW + ms(500));
    assert!(c.kernel.tgt_qp_exists(c.qpn));
    assert_eq!(c.dreqs(), dreqs_before, "still no DREQ");
}

// --- owner destroy ------------------------------------------------------------------------

fn owner_destroy(policy: P) {
    let mut c = cell(policy, false, 2, 0);
    let d = c.dreqs();
    let (qpn, creator) = (c.qpn, c.creator);
    let v = c.act(|r, now| r.destroy(now, qpn, creator)).unwrap();
    assert_eq!(v, Verdict::Released(GoneCause::OwnerDestroyed));
    let torn = c.conns.clone();
    released(&mut c, d, GoneCause::OwnerDestroyed, &torn, true);
}

#[test]
fn explicit_x_owner_destroy() {
    owner_destroy(P::Explicit);
}

#[test]
fn domain_bound_x_owner_destroy() {
    let mut c = cell(P::DomainBound, false, 2, 0);
    let (qpn, other) = (c.qpn, c.other);
    assert!(
        c.act(|r, now| r.destroy(now, qpn, other)).is_err(),
        "only the owner"
    );
    drop(c);
    owner_destroy(P::DomainBound);
}

#[test]
fn process_bound_x_owner_destroy() {
    owner_destroy(P::ProcessBound);
}

#[test]
fn shared_x_owner_destroy() {
    let mut c = cell(P::Shared, false, 2, 0);
    let d = c.dreqs();
    let (qpn, creator, other) = (c.qpn, c.creator, c.other);
    c.act(|r, now| r.register(now, qpn, Registrant::Process(other)))
        .unwrap();
    // The creator's "destroy" drops its registration; another one remains.
    assert_eq!(
        c.act(|r, now| r.destroy(now, qpn, creator)).unwrap(),
        Verdict::Kept
    );
    c.run(ms(50));
    assert_eq!(c.dreqs(), d);
    let v = c.act(|r, now| r.destroy(now, qpn, other)).unwrap();
    assert_eq!(v, Verdict::Released(GoneCause::LastUnregistered));
    let torn = c.conns.clone();
    released(&mut c, d, GoneCause::LastUnregistered, &torn, true);
}

// --- domain close -------------------------------------------------------------------------

#[test]
fn explicit_x_domain_close() {
    let mut c = cell(P::Explicit, false, 2, 0);
    let d = c.dreqs();
    let dom = c.dom;
    c.act(|r, now| r.close_domain(now, dom)).unwrap();
    let up = c.conns.clone();
    // Kept, pinning the closing domain; the closing domain takes no new connection.
    kept(&mut c, d, &up, false);
    // The owner destroys it: DREQs now, and the domain closes after the quarantine.
    let (qpn, creator) = (c.qpn, c.creator);
    c.act(|r, now| r.destroy(now, qpn, creator)).unwrap();
    c.run(ms(50));
    assert_eq!(c.dreqs() - d, 2);
    c.run(T_TW + ms(500));
    assert!(c.target.target().registry().domain(dom).is_none());
    assert_eq!(c.kernel.domain_usecnt(DOMAIN), None);
}

fn domain_close_releases(policy: P) {
    let mut c = cell(policy, false, 2, 0);
    let d = c.dreqs();
    let dom = c.dom;
    c.act(|r, now| r.close_domain(now, dom)).unwrap();
    let torn = c.conns.clone();
    released(&mut c, d, GoneCause::DomainClosed, &torn, true);
    assert!(c.target.target().registry().domain(dom).is_none());
}

#[test]
fn domain_bound_x_domain_close() {
    domain_close_releases(P::DomainBound);
}

#[test]
fn process_bound_x_domain_close() {
    domain_close_releases(P::ProcessBound);
}

#[test]
fn shared_x_domain_close() {
    domain_close_releases(P::Shared);
}

// --- creator exit -------------------------------------------------------------------------

#[test]
fn explicit_x_creator_exit() {
    let mut c = cell(P::Explicit, false, 2, 0);
    let d = c.dreqs();
    let creator = c.creator;
    let out = c.act(|r, now| r.process_exit(now, creator));
    assert_eq!(out, vec![(c.qpn, Verdict::Kept)]);
    assert!(c.events().contains(&TargetEvent::Orphaned { qpn: c.qpn }));
    let up = c.conns.clone();
    kept(&mut c, d, &up, true);
}

#[test]
fn domain_bound_x_creator_exit() {
    let mut c = cell(P::DomainBound, false, 2, 0);
    let d = c.dreqs();
    let creator = c.creator;
    let out = c.act(|r, now| r.process_exit(now, creator));
    assert_eq!(out, vec![(c.qpn, Verdict::Kept)]);
    let up = c.conns.clone();
    kept(&mut c, d, &up, true);
}

#[test]
fn process_bound_x_creator_exit() {
    let mut c = cell(P::ProcessBound, false, 2, 0);
    let d = c.dreqs();
    let creator = c.creator;
    let out = c.act(|r, now| r.process_exit(now, creator));
    assert_eq!(
        out,
        vec![(c.qpn, Verdict::Released(GoneCause::CreatorExited))]
    );
    let torn = c.conns.clone();
    released(&mut c, d, GoneCause::CreatorExited, &torn, true);
}

#[test]
fn shared_x_creator_exit() {
    let mut c = cell(P::Shared, false, 2, 0);
    let d = c.dreqs();
    let creator = c.creator;
    let out = c.act(|r, now| r.process_exit(now, creator));
    assert_eq!(
        out,
        vec![(c.qpn, Verdict::Released(GoneCause::CreatorExited))]
    );
    let torn = c.conns.clone();
    released(&mut c, d, GoneCause::CreatorExited, &torn, true);
}

// --- last unregister ----------------------------------------------------------------------

fn last_unregister_kept(policy: P) {
    let mut c = cell(policy, false, 2, 0);
    let d = c.dreqs();
    let (qpn, other) = (c.qpn, c.other);
    c.act(|r, now| r.register(now, qpn, Registrant::Process(other)))
        .unwrap();
    let v = c
        .act(|r, now| r.unregister(now, qpn, &Registrant::Process(other)))
        .unwrap();
    assert_eq!(v, Verdict::Kept);
    let up = c.conns.clone();
    kept(&mut c, d, &up, true);
}

#[test]
fn explicit_x_last_unregister() {
    last_unregister_kept(P::Explicit);
}

#[test]
fn domain_bound_x_last_unregister() {
    last_unregister_kept(P::DomainBound);
}

#[test]
fn process_bound_x_last_unregister() {
    last_unregister_kept(P::ProcessBound);
}

#[test]
fn shared_x_last_unregister() {
    let mut c = cell(P::Shared, false, 2, 0);
    let d = c.dreqs();
    let (qpn, creator, other) = (c.qpn, c.creator, c.other);
    c.act(|r, now| r.register(now, qpn, Registrant::Process(other)))
        .unwrap();
    assert_eq!(
        c.act(|r, now| r.unregister(now, qpn, &Registrant::Process(other)))
            .unwrap(),
        Verdict::Kept
    );
    let v = c
        .act(|r, now| r.unregister(now, qpn, &Registrant::Process(creator)))
        .unwrap();
    assert_eq!(v, Verdict::Released(GoneCause::LastUnregistered));
    let torn = c.conns.clone();
    released(&mut c, d, GoneCause::LastUnregistered, &torn, true);
}

// --- peer DREQ ----------------------------------------------------------------------------

fn peer_dreq_kept(policy: P) {
    let mut c = cell(policy, false, 2, 0);
    let d = c.dreqs();
    let (c1, c2) = (c.conns[0], c.conns[1]);
    c.ini_disconnect(c1);
    c.run(ms(20));
    assert_eq!(
        c.ini.with(|x| x.outcome(c1).cloned()),
        Some(IniOutcome::Disconnected { by_peer: false })
    );
    let closed: Vec<_> = c
        .events()
        .into_iter()
        .filter_map(|e| match e {
            TargetEvent::Closed { event, verdict, .. } => Some((event, verdict)),
            _ => None,
        })
        .collect();
    assert_eq!(closed, vec![(ConnEvent::PeerDreq, Some(Verdict::Kept))]);
    // The target holds its side of c1 in TimeWait: the TGT QPN is in the CM's quarantine,
    // yet the live QP takes the next connection (AcceptParams::xrc_tgt_live).
    let now = c.net.now();
    assert!(c
        .net
        .endpoint_ref(c.t)
        .qpn_quarantined(c.qpn, now)
        .is_some());
    kept(&mut c, d, &[c2], true);
}

#[test]
fn explicit_x_peer_dreq() {
    peer_dreq_kept(P::Explicit);
}

#[test]
fn domain_bound_x_peer_dreq() {
    peer_dreq_kept(P::DomainBound);
}

#[test]
fn process_bound_x_peer_dreq() {
    peer_dreq_kept(P::ProcessBound);
}

#[test]
fn shared_x_peer_dreq() {
    // Connection-scoped registrations: the creator unregisters, then each connection's end
    // drops its own registration; the last one releases the QP (nobody left to DREQ).
    let mut c = cell(P::Shared, true, 2, 0);
    let d = c.dreqs();
    let (qpn, creator) = (c.qpn, c.creator);
    assert_eq!(
        c.act(|r, now| r.unregister(now, qpn, &Registrant::Process(creator)))
            .unwrap(),
        Verdict::Kept
    );
    let (c1, c2) = (c.conns[0], c.conns[1]);
    c.ini_disconnect(c1);
    c.run(ms(20));
    assert!(c.established(c2));
    assert_eq!(c.dreqs(), d);
    c.ini_disconnect(c2);
    c.run(ms(20));
    let verdicts: Vec<_> = c
        .events()
        .into_iter()
        .filter_map(|e| match e {
            TargetEvent::Closed { verdict, .. } => verdict,
            _ => None,
        })
        .collect();
    assert_eq!(
        verdicts,
        vec![Verdict::Kept, Verdict::Released(GoneCause::PeerLeft)]
    );
    released(&mut c, d, GoneCause::PeerLeft, &[], true);
}

// --- peer timeout -------------------------------------------------------------------------

/// A third connection's initiator never sends its RTU: the target's REP retries run out.
fn peer_timeout_kept(policy: P) {
    let mut c = cell(policy, false, 2, 1);
    let d = c.dreqs();
    let c3 = c.conns[2];
    c.run(ms(1000));
    let closed: Vec<_> = c
        .events()
        .into_iter()
        .filter_map(|e| match e {
            TargetEvent::Closed { event, verdict, .. } => Some((event, verdict)),
            _ => None,
        })
        .collect();
    assert_eq!(closed, vec![(ConnEvent::PeerTimeout, Some(Verdict::Kept))]);
    // The initiator hears the target give up (REJ "timeout"), not "target gone".
    let out = c.ini.with(|x| x.outcome(c3).cloned());
    assert!(
        matches!(
            out,
            Some(IniOutcome::Refused {
                reason: RejReason::Timeout,
                ..
            })
        ),
        "{out:?}"
    );
    let up = c.conns[..2].to_vec();
    kept(&mut c, d, &up, true);
}

#[test]
fn explicit_x_peer_timeout() {
    peer_timeout_kept(P::Explicit);
}

#[test]
fn domain_bound_x_peer_timeout() {
    peer_timeout_kept(P::DomainBound);
}

#[test]
fn process_bound_x_peer_timeout() {
    peer_timeout_kept(P::ProcessBound);
}

#[test]
fn shared_x_peer_timeout() {
    // Two connections that never complete, each holding a registration: the first one's
    // timeout keeps the QP, the second one's releases it.
    let mut c = cell(P::Shared, true, 0, 2);
    let d = c.dreqs();
    let (qpn, creator) = (c.qpn, c.creator);
    c.act(|r, now| r.unregister(now, qpn, &Registrant::Process(creator)))
        .unwrap();
    c.run(ms(1000));
    let closed: Vec<_> = c
        .events()
        .into_iter()
        .filter_map(|e| match e {
            TargetEvent::Closed { event, verdict, .. } => Some((event, verdict)),
            _ => None,
        })
        .collect();
    assert_eq!(
        closed,
        vec![
            (ConnEvent::PeerTimeout, Some(Verdict::Kept)),
            (
                ConnEvent::PeerTimeout,
                Some(Verdict::Released(GoneCause::PeerLeft))
            )
        ]
    );
    released(&mut c, d, GoneCause::PeerLeft, &[], true);
}

// --- keeper crash -------------------------------------------------------------------------

fn keeper_crash(policy: P) {
    let mut c = cell(policy, false, 2, 0);
    let d = c.dreqs();
    // The keeper restarts: a new process with a new registry over the same domain.
    let mut restarted = registry(&c.kernel, false);
    let dom = restarted
        .open_domain("job", DomainSpec::file(DOMAIN))
        .unwrap();
    assert_eq!(dom, c.dom, "same id: the services keep working");
    c.target
        .with(&mut c.net, |x, _, now| x.keeper_crash(now, restarted));
    let torn = c.conns.clone();
    // The kernel dropped the keeper's handle, and nobody else held one: gone at once.
    released(&mut c, d, GoneCause::KeeperLost, &torn, false);
    // The restarted keeper serves new connections.
    let (conn, out) = c.reconnect(XrcReqData::any(None));
    assert_eq!(out, None, "still up");
    assert!(c.established(conn));
}

#[test]
fn explicit_x_keeper_crash() {
    keeper_crash(P::Explicit);
}

#[test]
fn domain_bound_x_keeper_crash() {
    keeper_crash(P::DomainBound);
}

#[test]
fn process_bound_x_keeper_crash() {
    keeper_crash(P::ProcessBound);
}

#[test]
fn shared_x_keeper_crash() {
    keeper_crash(P::Shared);
}

// --- beyond the matrix --------------------------------------------------------------------

#[test]
fn rep_carries_eecn_srq_and_srqns() {
    let mut c = cell(P::Explicit, false, 0, 0);
    let qpn = c.qpn;
    let conn = c.connect(ini_qp(), XrcReqData::attach(qpn), false);
    let at = c.net.now() + ms(20);
    c.net.run_until_time(at);
    let rep = c
        .net
        .take_events(c.i)
        .into_iter()
        .find_map(|(_, e)| match e.kind {
            EventKind::RepReceived(r) if e.conn == conn => Some(r),
            _ => None,
        })
        .unwrap();
    assert_eq!(rep.rep.xrc_tgt_qpn(), c.qpn, "Local EECN = TGT QPN");
    assert_eq!(rep.remote_qpn, c.qpn);
    assert_eq!(rep.rep.local_qpn, Qpn::default(), "Local QPN 0");
    assert!(rep.rep.srq, "SRQ = 1");
    assert_eq!(rep.rep.initiator_depth, 0);
    assert!(!rep.rep.end_to_end_flow_control);
    let (data, _) = ibcm_xrc::XrcRepData::parse(rep.rep.private_data.as_bytes()).unwrap();
    assert_eq!(data.tgt_qpn, c.qpn);
    assert_eq!(data.srqns, vec![srqn()]);
    assert_eq!(data.policy, P::Explicit);
    assert!(!data.created, "attached to the existing QP");
    assert_eq!(
        c.kernel.qp_state(qpn),
        Some(QpState::Rtr),
        "brought up by the target"
    );
}

#[test]
fn qp_gone_before_the_rtu_is_a_rej_with_the_block() {
    let mut c = cell(P::Explicit, false, 0, 1);
    let conn = c.conns[0];
    let (d, r) = (c.dreqs(), c.rejs());
    let (qpn, creator) = (c.qpn, c.creator);
    c.act(|reg, now| reg.destroy(now, qpn, creator)).unwrap();
    c.run(ms(20));
    assert_eq!(c.dreqs(), d, "not established: no DREQ");
    assert_eq!(c.rejs() - r, 1);
    assert_eq!(
        c.ini.with(|x| x.outcome(conn).cloned()),
        Some(IniOutcome::TargetGone {
            cause: GoneCause::OwnerDestroyed,
            qpn: Some(qpn),
            by: GoneSignal::Rej
        })
    );
}

#[test]
fn attach_from_another_initiator_is_refused_not_gone() {
    let mut c = cell(P::Explicit, false, 1, 0);
    let (_, out) = c.reconnect(XrcReqData::attach(c.qpn));
    let Some(IniOutcome::Refused { reason, info }) = out else {
        panic!("{out:?}")
    };
    assert_eq!(reason, RejReason::ConsumerReject);
    assert_eq!(info.map(|i| i.kind), Some(RejectKind::AttachRefused));
}

/// The QPN quarantine is what keeps a new TGT QP off the number: on a device that hands a
/// freed number out again at once (and with the QP destroyed at once, not held), a REQ inside
/// the TimeWait gets another number; after it, the number comes back.
#[test]
fn qpn_not_reused_inside_timewait() {
    let kernel = KernelModel::new(ModelConfig::mlx5().with_lifo_qpn_reuse());
    let creator = kernel.spawn().process();
    let other = kernel.spawn().process();
    let mut cfg = RegistryConfig::default();
    cfg.policy.default_timewait = ms(100);
    cfg.policy.hold_qp_during_quarantine = false;
    let mut reg = TgtRegistry::new(Box::new(kernel.spawn()), cfg);
    let mut net = SimNet::new(3);
    let dom = reg.open_domain("job", DomainSpec::Private).unwrap();
    let t = net.add_node(EndpointConfig {
        timewait: Some(T_TW),
        ..EndpointConfig::default()
    });
    let i = net.add_node(EndpointConfig {
        timewait: Some(I_TW),
        ..EndpointConfig::default()
    });
    let target = SimTarget::install(&mut net, t, XrcTarget::new(reg, XrcTargetConfig::default()));
    target.with(&mut net, |x, ep, _| {
        x.listen(ep, SID, XrcService::new(dom, creator, vec![srqn()]));
    });
    let ini = SimInitiator::install(&mut net, i);
    let peer = net.addr(t);
    let step = |net: &mut SimNet| {
        let at = net.now() + ms(20);
        net.run_until_time(at);
    };
    let data = XrcReqData::any(Some(P::ProcessBound));
    let c1 = ini
        .connect(&mut net, peer, SID, Qpn::new(0x91).unwrap(), &data)
        .unwrap();
    step(&mut net);
    let old = ini.with(|x| x.rep(c1).unwrap().tgt_qpn);
    // The creator exits: released, destroyed at once, number quarantined.
    target.with(&mut net, |x, _, now| {
        x.registry_mut().process_exit(now, creator)
    });
    step(&mut net);
    assert!(ini.with(|x| x.outcome(c1).unwrap().is_target_gone()));
    assert!(!kernel.tgt_qp_exists(old));
    // Inside the TimeWait: the device offers the old number again; it is parked.
    let c2 = ini
        .connect(&mut net, peer, SID, Qpn::new(0x92).unwrap(), &data)
        .unwrap();
    step(&mut net);
    let second = ini.with(|x| x.rep(c2).unwrap().tgt_qpn);
    assert_ne!(second, old, "not reused inside the TimeWait");
    assert!(kernel.tgt_qp_exists(old), "parked: the number stays taken");
    let now = net.now();
    assert!(net.endpoint_ref(t).qpn_quarantined(old, now).is_some());
    // After every quarantine (the registry's and the CM's): the number is free again.
    net.run_until_time(now + T_TW + ms(500));
    assert!(net
        .endpoint_ref(t)
        .qpn_quarantined(old, net.now())
        .is_none());
    assert!(!kernel.tgt_qp_exists(old));
    let c3 = ini
        .connect(&mut net, peer, SID, Qpn::new(0x93).unwrap(), &data)
        .unwrap();
    step(&mut net);
    assert_eq!(
        ini.with(|x| x.rep(c3).unwrap().tgt_qpn),
        old,
        "reused after it"
    );
    let _ = other;
}

/// Q initiators, P services (processes) on the target: mode "any" puts every connection of
/// one initiator on one TGT QP.
#[test]
fn one_tgt_qp_per_initiator() {
    let kernel = KernelModel::new(ModelConfig::mlx5());
    let procs: Vec<ProcessId> = (0..3).map(|_| kernel.spawn().process()).collect();
    let mut reg = registry(&kernel, false);
    let dom = reg.open_domain("job", DomainSpec::Private).unwrap();
    let mut net = SimNet::new(9);
    let t = net.add_node(EndpointConfig::default());
    let target = SimTarget::install(&mut net, t, XrcTarget::new(reg, XrcTargetConfig::default()));
    for (k, p) in procs.iter().enumerate() {
        let s = SrqNum::new(0x10 + k as u32).unwrap();
        target.with(&mut net, |x, ep, _| {
            x.listen(
                ep,
                ServiceId(0x1000 + k as u64),
                XrcService::new(dom, *p, vec![s]),
            );
        });
    }
    let peer = net.addr(t);
    let mut inis = Vec::new();
    for q in 0..2u32 {
        let n = net.add_node(EndpointConfig::default());
        let ini = SimInitiator::install(&mut net, n);
        let mut conns = Vec::new();
        for k in 0..3u64 {
            let c = ini
                .connect(
                    &mut net,
                    peer,
                    ServiceId(0x1000 + k),
                    Qpn::new(0x200 + q).unwrap(),
                    &XrcReqData::any(Some(P::DomainBound)),
                )
                .unwrap();
            conns.push(c);
            let at = net.now() + ms(5);
            net.run_until_time(at);
        }
        inis.push((ini, conns));
    }
    let at = net.now() + ms(20);
    net.run_until_time(at);
    let mut qpns = Vec::new();
    for (ini, conns) in &inis {
        let got: Vec<(Qpn, Vec<SrqNum>)> = conns
            .iter()
            .map(|c| ini.with(|x| x.rep(*c).map(|r| (r.tgt_qpn, r.srqns())).unwrap()))
            .collect();
        assert!(
            got.iter().all(|(q, _)| *q == got[0].0),
            "one TGT QP per INI"
        );
        let srqns: Vec<u32> = got.iter().map(|(_, s)| s[0].get()).collect();
        assert_eq!(srqns, vec![0x10, 0x11, 0x12], "each service's SRQN");
        qpns.push(got[0].0);
    }
    assert_ne!(qpns[0], qpns[1]);
    let st = target.target().stats();
    assert_eq!((st.created, st.attached), (2, 4));
}

/// The registry's quarantine timers are the target app's timers: the simulator's ordinary
/// steps end a quarantine at its exact deadline (no separate clock to advance).
#[test]
fn quarantine_ends_at_its_deadline_in_ordinary_steps() {
    let mut c = cell(P::Explicit, false, 1, 0);
    let (qpn, owner) = (c.qpn, c.creator);
    c.target
        .with(&mut c.net, |x, _, now| {
            x.registry_mut().destroy(now, qpn, owner)
        })
        .unwrap();
    // The DREQ exchange settles; the QP is held in ERR, its number quarantined.
    let (i, conn) = (c.i, c.conns[0]);
    assert!(c
        .net
        .run_until(|n| n.endpoint_ref(i).state(conn).is_none(), 10_000));
    assert!(c.kernel.tgt_qp_exists(qpn));
    let deadline = c
        .target
        .target()
        .poll_timeout()
        .expect("a quarantine timer");
    assert!(deadline > c.net.now());
    let kernel = &c.kernel;
    assert!(c.net.run_until(|_| !kernel.tgt_qp_exists(qpn), 100_000));
    assert_eq!(c.net.now(), deadline, "destroyed at the quarantine's end");
}
