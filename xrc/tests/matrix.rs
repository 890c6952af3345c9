//! The policy × event matrix of the crate docs, one test per cell, through [`TgtRegistry`] on
//! the software model: every cell checks the verdict, the DREQs the CM is asked to send, what
//! the kernel model holds after the quarantine, and the REJ a reconnect gets.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::time::{Duration, Instant};

use ibcm_mad::{Guid, Qpn, RejReason};
use ibcm_xrc::verbs::model::{KernelModel, ModelConfig};
use ibcm_xrc::{
    ConnEvent, DomainId, DomainSpec, DomainState, GoneCause, IniPeer, OwnershipPolicy as P,
    PolicyAction, ProcessId, QpLife, Registrant, RegistryConfig, SrqNum, TgtRegistry, TgtRequest,
    Verbs, Verdict, XrcReqData,
};
use ibcm_xrc::{RejectKind, ReqMode};

const LATER: Duration = Duration::from_secs(60);

struct Env {
    kernel: KernelModel,
    reg: TgtRegistry<&'static str>,
    now: Instant,
    dom: DomainId,
    creator: ProcessId,
    other: ProcessId,
    qpn: Qpn,
}

fn peer() -> IniPeer {
    IniPeer {
        ca_guid: Guid(0xa),
        ini_qpn: Qpn::new(0x99).unwrap(),
    }
}

fn req(
    conn: &'static str,
    dom: DomainId,
    by: ProcessId,
    mode: ReqMode,
) -> TgtRequest<&'static str> {
    TgtRequest {
        conn,
        domain: dom,
        process: by,
        peer: peer(),
        data: XrcReqData { mode, policy: None },
        timewait: Duration::from_millis(500),
        srqns: vec![SrqNum::new(0x10).unwrap()],
    }
}

/// A QP of `policy` created by `creator`, with connections c1 and c2 established on it.
fn env(policy: P, connection_registrations: bool) -> Env {
    let kernel = KernelModel::new(ModelConfig::mlx5());
    let keeper = kernel.spawn();
    // Two more simulated processes: their PIDs name the creator and another user.
    let creator = kernel.spawn().process();
    let other = kernel.spawn().process();
    let cfg = RegistryConfig {
        connection_registrations,
        ..RegistryConfig::default()
    };
    let mut reg = TgtRegistry::new(Box::new(keeper), cfg);
    let now = Instant::now();
    let dom = reg
        .open_domain("job", DomainSpec::file("/tmp/job.xrcd"))
        .unwrap();
    let qpn = reg.create_tgt_qp(now, dom, policy, creator).unwrap();
    bring_up(&mut reg, qpn);
    for c in ["c1", "c2"] {
        let acc = reg
            .handle_req(now, &req(c, dom, other, ReqMode::Attach(qpn)))
            .unwrap();
        assert_eq!(acc.tgt_qpn, qpn);
        assert!(!acc.created);
        reg.handle_conn_event(now, &c, ConnEvent::Established);
    }
    Env {
        kernel,
        reg,
        now,
        dom,
        creator,
        other,
        qpn,
    }
}

/// RESET → INIT → RTR, as the CM does after the first REQ.
fn bring_up(reg: &mut TgtRegistry<&'static str>, qpn: Qpn) {
    use ibcm_mad::Psn;
    use ibcm_xrc::verbs::qp::{AccessFlags, AddressVector, PathMtu, QpAttr};
    reg.modify(qpn, &QpAttr::to_init(0, 1, AccessFlags::default()))
        .unwrap();
    let rtr = QpAttr::tgt_to_rtr(
        AddressVector::default(),
        PathMtu::Mtu1024,
        peer().ini_qpn,
        Psn::new(1).unwrap(),
        1,
        12,
    );
    reg.modify(qpn, &rtr).unwrap();
}

fn actions(reg: &mut TgtRegistry<&'static str>) -> Vec<PolicyAction<&'static str>> {
    std::iter::from_fn(|| reg.poll_action()).collect()
}

fn dreqs(acts: &[PolicyAction<&'static str>]) -> Vec<(&'static str, GoneCause)> {
    acts.iter()
        .filter_map(|a| match a {
            PolicyAction::EndConnection { conn, cause, .. } => Some((*conn, *cause)),
            _ => None,
        })
        .collect()
}

/// Released: DREQs to `conns`, the QP in ERR but held until the quarantine ends, then
/// destroyed; a reconnect gets REJ reason 1 with `cause` meanwhile.
fn assert_released(e: &mut Env, v: Verdict, cause: GoneCause, conns: &[&'static str]) {
    assert_eq!(v, Verdict::Released(cause));
    let acts = actions(&mut e.reg);
    let want: Vec<_> = conns.iter().map(|c| (*c, cause)).collect();
    assert_eq!(dreqs(&acts), want);
    assert!(e.kernel.tgt_qp_exists(e.qpn), "held during quarantine");
    assert_eq!(e.kernel.qp_state(e.qpn), Some(ibcm_xrc::QpState::Err));
    let rej = e
        .reg
        .handle_req(e.now, &req("c9", e.dom, e.other, ReqMode::Attach(e.qpn)))
        .unwrap_err();
    assert_eq!(rej.reason(), RejReason::NoQp);
    assert_eq!(rej.kind, RejectKind::Gone(cause));
    assert_eq!(rej.qpn, Some(e.qpn));
    assert!(e.reg.poll_timeout().is_some());
    e.reg.handle_timeout(e.now + LATER);
    assert!(
        !e.kernel.tgt_qp_exists(e.qpn),
        "destroyed after the quarantine"
    );
    // After the quarantine the number is forgotten: "no such TGT QP".
    let rej = e
        .reg
        .handle_req(
            e.now + LATER,
            &req("c9", e.dom, e.other, ReqMode::Attach(e.qpn)),
        )
        .unwrap_err();
    assert_eq!(rej.kind, RejectKind::Gone(GoneCause::Unknown));
}

fn assert_kept(e: &mut Env, v: Verdict, conns_left: &[&'static str]) {
    assert_eq!(v, Verdict::Kept);
    assert!(dreqs(&actions(&mut e.reg)).is_empty());
    let q = e.reg.query(e.qpn).unwrap();
    assert_eq!(q.life, QpLife::Live);
    assert_eq!(q.conns, conns_left);
    e.reg.handle_timeout(e.now + LATER);
    assert!(e.kernel.tgt_qp_exists(e.qpn));
}

// --- owner destroy ------------------------------------------------------------------------

#[test]
fn explicit_x_owner_destroy() {
    let mut e = env(P::Explicit, false);
    let v = e.reg.destroy(e.now, e.qpn, e.creator).unwrap();
    assert_released(&mut e, v, GoneCause::OwnerDestroyed, &["c1", "c2"]);
}

#[test]
fn domain_bound_x_owner_destroy() {
    let mut e = env(P::DomainBound, false);
    assert!(
        e.reg.destroy(e.now, e.qpn, e.other).is_err(),
        "only the owner"
    );
    let v = e.reg.destroy(e.now, e.qpn, e.creator).unwrap();
    assert_released(&mut e, v, GoneCause::OwnerDestroyed, &["c1", "c2"]);
}

#[test]
fn process_bound_x_owner_destroy() {
    let mut e = env(P::ProcessBound, false);
    let v = e.reg.destroy(e.now, e.qpn, e.creator).unwrap();
    assert_released(&mut e, v, GoneCause::OwnerDestroyed, &["c1", "c2"]);
}

#[test]
fn shared_x_owner_destroy() {
    let mut e = env(P::Shared, false);
    e.reg
        .register(e.now, e.qpn, Registrant::Process(e.other))
        .unwrap();
    // The creator's "destroy" only drops its registration while another remains.
    assert_eq!(
        e.reg.destroy(e.now, e.qpn, e.creator).unwrap(),
        Verdict::Kept
    );
    assert!(dreqs(&actions(&mut e.reg)).is_empty());
    let v = e.reg.destroy(e.now, e.qpn, e.other).unwrap();
    assert_released(&mut e, v, GoneCause::LastUnregistered, &["c1", "c2"]);
}

// --- domain close -------------------------------------------------------------------------

#[test]
fn explicit_x_domain_close() {
    let mut e = env(P::Explicit, false);
    let st = e.reg.close_domain(e.now, e.dom).unwrap();
    assert_eq!(
        st,
        DomainState::Closing {
            pinned_by: vec![e.qpn]
        }
    );
    assert_kept(&mut e, Verdict::Kept, &["c1", "c2"]);
    // The domain closes once the owner destroys the QP and its quarantine ends.
    e.reg.destroy(e.now, e.qpn, e.creator).unwrap();
    e.reg.handle_timeout(e.now + LATER * 2);
    assert!(e.reg.domain(e.dom).is_none());
    assert_eq!(e.kernel.domain_usecnt("/tmp/job.xrcd"), None);
}

#[test]
fn domain_bound_x_domain_close() {
    let mut e = env(P::DomainBound, false);
    e.reg.close_domain(e.now, e.dom).unwrap();
    let v = e.reg.query(e.qpn).map(|q| q.life).unwrap();
    assert!(matches!(
        v,
        QpLife::Gone {
            cause: GoneCause::DomainClosed,
            ..
        }
    ));
    // close_domain returns the domain state; the verdict is in the trace.
    let verdict = std::iter::from_fn(|| e.reg.poll_trace())
        .find_map(|t| t.verdict)
        .unwrap();
    assert_released(&mut e, verdict, GoneCause::DomainClosed, &["c1", "c2"]);
    assert!(
        e.reg.domain(e.dom).is_none(),
        "closed once the QP is destroyed"
    );
}

#[test]
fn process_bound_x_domain_close() {
    let mut e = env(P::ProcessBound, false);
    e.reg.close_domain(e.now, e.dom).unwrap();
    let verdict = std::iter::from_fn(|| e.reg.poll_trace())
        .find_map(|t| t.verdict)
        .unwrap();
    assert_released(&mut e, verdict, GoneCause::DomainClosed, &["c1", "c2"]);
}

#[test]
fn shared_x_domain_close() {
    let mut e = env(P::Shared, false);
    e.reg.close_domain(e.now, e.dom).unwrap();
    let verdict = std::iter::from_fn(|| e.reg.poll_trace())
        .find_map(|t| t.verdict)
        .unwrap();
    assert_released(&mut e, verdict, GoneCause::DomainClosed, &["c1", "c2"]);
}

// --- creator exit -------------------------------------------------------------------------

#[test]
fn explicit_x_creator_exit() {
    let mut e = env(P::Explicit, false);
    let out = e.reg.process_exit(e.now, e.creator);
    assert_eq!(out, vec![(e.qpn, Verdict::Kept)]);
    assert!(e
        .reg
        .poll_action()
        .is_some_and(|a| matches!(a, PolicyAction::ReportOrphan { qpn } if qpn == e.qpn)));
    assert_kept(&mut e, Verdict::Kept, &["c1", "c2"]);
    // An orphan with no connection is a leak; adoption makes it owned again.
    for c in ["c1", "c2"] {
        e.reg.handle_conn_event(e.now, &c, ConnEvent::PeerDreq);
    }
    assert_eq!(e.reg.leaks().len(), 1);
    e.reg.adopt(e.now, e.qpn, e.other).unwrap();
    assert!(e.reg.leaks().is_empty());
}

#[test]
fn domain_bound_x_creator_exit() {
    let mut e = env(P::DomainBound, false);
    let out = e.reg.process_exit(e.now, e.creator);
    assert_eq!(out, vec![(e.qpn, Verdict::Kept)]);
    assert_kept(&mut e, Verdict::Kept, &["c1", "c2"]);
}

#[test]
fn process_bound_x_creator_exit() {
    let mut e = env(P::ProcessBound, false);
    let out = e.reg.process_exit(e.now, e.creator);
    let (_, v) = out[0];
    assert_released(&mut e, v, GoneCause::CreatorExited, &["c1", "c2"]);
}

#[test]
fn shared_x_creator_exit() {
    let mut e = env(P::Shared, false);
    let out = e.reg.process_exit(e.now, e.creator);
    let (_, v) = out[0];
    assert_released(&mut e, v, GoneCause::CreatorExited, &["c1", "c2"]);
}

// --- last unregister ----------------------------------------------------------------------

fn register_then_unregister_other(e: &mut Env) -> Verdict {
    e.reg
        .register(e.now, e.qpn, Registrant::Process(e.other))
        .unwrap();
    e.reg
        .unregister(e.now, e.qpn, &Registrant::Process(e.other))
        .unwrap()
}

#[test]
fn explicit_x_last_unregister() {
    let mut e = env(P::Explicit, false);
    let v = register_then_unregister_other(&mut e);
    assert_kept(&mut e, v, &["c1", "c2"]);
}

#[test]
fn domain_bound_x_last_unregister() {
    let mut e = env(P::DomainBound, false);
    let v = register_then_unregister_other(&mut e);
    assert_kept(&mut e, v, &["c1", "c2"]);
}

#[test]
fn process_bound_x_last_unregister() {
    let mut e = env(P::ProcessBound, false);
    let v = register_then_unregister_other(&mut e);
    assert_kept(&mut e, v, &["c1", "c2"]);
}

#[test]
fn shared_x_last_unregister() {
    let mut e = env(P::Shared, false);
    assert_eq!(register_then_unregister_other(&mut e), Verdict::Kept);
    let v = e
        .reg
        .unregister(e.now, e.qpn, &Registrant::Process(e.creator))
        .unwrap();
    assert_released(&mut e, v, GoneCause::LastUnregistered, &["c1", "c2"]);
    assert!(e
        .reg
        .register(e.now, e.qpn, Registrant::Process(e.other))
        .is_err());
}

// --- peer DREQ / peer timeout -------------------------------------------------------------

fn peer_leaves(policy: P, ev: ConnEvent) {
    let mut e = env(policy, false);
    let v = e.reg.handle_conn_event(e.now, &"c1", ev).unwrap();
    assert_kept(&mut e, v, &["c2"]);
}

/// Shared with connection-scoped registrations: the creator unregisters, then each
/// connection's end drops its own registration; the last one releases the QP.
fn shared_peer_leaves(ev: ConnEvent) {
    let mut e = env(P::Shared, true);
    assert_eq!(
        e.reg
            .unregister(e.now, e.qpn, &Registrant::Process(e.creator))
            .unwrap(),
        Verdict::Kept
    );
    let v = e.reg.handle_conn_event(e.now, &"c1", ev).unwrap();
    assert_eq!(v, Verdict::Kept);
    assert!(dreqs(&actions(&mut e.reg)).is_empty());
    let v = e.reg.handle_conn_event(e.now, &"c2", ev).unwrap();
    // Nobody else to DREQ: c2 is the one that left.
    assert_released(&mut e, v, GoneCause::PeerLeft, &[]);
}

#[test]
fn explicit_x_peer_dreq() {
    peer_leaves(P::Explicit, ConnEvent::PeerDreq);
}

#[test]
fn domain_bound_x_peer_dreq() {
    peer_leaves(P::DomainBound, ConnEvent::PeerDreq);
}

#[test]
fn process_bound_x_peer_dreq() {
    peer_leaves(P::ProcessBound, ConnEvent::PeerDreq);
}

#[test]
fn shared_x_peer_dreq() {
    shared_peer_leaves(ConnEvent::PeerDreq);
}

#[test]
fn explicit_x_peer_timeout() {
    peer_leaves(P::Explicit, ConnEvent::PeerTimeout);
}

#[test]
fn domain_bound_x_peer_timeout() {
    peer_leaves(P::DomainBound, ConnEvent::PeerTimeout);
}

#[test]
fn process_bound_x_peer_timeout() {
    peer_leaves(P::ProcessBound, ConnEvent::PeerTimeout);
}

#[test]
fn shared_x_peer_timeout() {
    shared_peer_leaves(ConnEvent::PeerTimeout);
}

// --- keeper crash -------------------------------------------------------------------------

fn keeper_crash(policy: P) {
    let e = env(policy, false);
    let (kernel, qpn, now) = (e.kernel.clone(), e.qpn, e.now);
    let acts = e.reg.crash(now);
    assert_eq!(
        dreqs(&acts),
        vec![("c1", GoneCause::KeeperLost), ("c2", GoneCause::KeeperLost)]
    );
    assert!(acts
        .iter()
        .any(|a| matches!(a, PolicyAction::QuarantineQpn { qpn: q, .. } if *q == qpn)));
    assert!(!acts
        .iter()
        .any(|a| matches!(a, PolicyAction::DestroyQp { .. })));
    // The kernel dropped the keeper's handle, and nobody else held one.
    assert!(!kernel.tgt_qp_exists(qpn));
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
fn req_any_creates_once_then_attaches_and_rep_carries_the_tgt_qpn() {
    let kernel = KernelModel::new(ModelConfig::mlx5());
    let mut reg: TgtRegistry<&str> =
        TgtRegistry::new(Box::new(kernel.spawn()), RegistryConfig::default());
    let p = kernel.spawn().process();
    let now = Instant::now();
    let dom = reg.open_domain("d", DomainSpec::Private).unwrap();
    let a1 = reg
        .handle_req(now, &req("c1", dom, p, ReqMode::Any))
        .unwrap();
    let a2 = reg
        .handle_req(now, &req("c2", dom, p, ReqMode::Any))
        .unwrap();
    assert!(a1.created && !a2.created);
    assert_eq!(a1.tgt_qpn, a2.tgt_qpn);
    assert_eq!(a1.policy, P::ProcessBound, "the registry default");
    let pd = a1.rep_private_data(b"app").unwrap();
    let (rep, app) = ibcm_xrc::XrcRepData::parse(&pd).unwrap();
    assert_eq!(rep.tgt_qpn, a1.tgt_qpn);
    assert!(rep.created);
    assert_eq!(app, b"app");
    // A duplicate REQ gets the same answer.
    let again = reg
        .handle_req(now, &req("c1", dom, p, ReqMode::Any))
        .unwrap();
    assert_eq!(again.tgt_qpn, a1.tgt_qpn);
    // Attaching from another initiator is refused, not "gone".
    let mut other = req("c3", dom, p, ReqMode::Attach(a1.tgt_qpn));
    other.peer.ini_qpn = Qpn::new(0x77).unwrap();
    let rej = reg.handle_req(now, &other).unwrap_err();
    assert_eq!(rej.kind, RejectKind::AttachRefused);
    assert_eq!(rej.reason(), RejReason::ConsumerReject);
    // Create always makes a new one, with the asked-for policy.
    let mut c = req("c4", dom, p, ReqMode::Create);
    c.data.policy = Some(P::Shared);
    let a4 = reg.handle_req(now, &c).unwrap();
    assert!(a4.created);
    assert_ne!(a4.tgt_qpn, a1.tgt_qpn);
    assert_eq!(a4.policy, P::Shared);
}

#[test]
fn created_qp_is_brought_up_through_the_registry() {
    use ibcm_mad::Psn;
    use ibcm_xrc::verbs::qp::{AccessFlags, AddressVector, PathMtu, QpAttr};
    let kernel = KernelModel::new(ModelConfig::mlx5());
    let mut reg: TgtRegistry<&str> =
        TgtRegistry::new(Box::new(kernel.spawn()), RegistryConfig::default());
    let p = kernel.spawn().process();
    let now = Instant::now();
    let dom = reg.open_domain("d", DomainSpec::Private).unwrap();
    let a = reg
        .handle_req(now, &req("c1", dom, p, ReqMode::Any))
        .unwrap();
    reg.modify(a.tgt_qpn, &QpAttr::to_init(0, 1, AccessFlags::default()))
        .unwrap();
    // The INI's RTR mask is wrong for a TGT: refused before reaching the device.
    let ini_style = QpAttr::ini_to_rtr(
        AddressVector::default(),
        PathMtu::Mtu1024,
        peer().ini_qpn,
        Psn::new(1).unwrap(),
    );
    assert!(reg.modify(a.tgt_qpn, &ini_style).is_err());
    let rtr = QpAttr::tgt_to_rtr(
        AddressVector::default(),
        PathMtu::Mtu1024,
        peer().ini_qpn,
        Psn::new(1).unwrap(),
        1,
        12,
    );
    assert_eq!(reg.modify(a.tgt_qpn, &rtr).unwrap(), ibcm_xrc::QpState::Rtr);
    assert_eq!(kernel.qp_state(a.tgt_qpn), Some(ibcm_xrc::QpState::Rtr));
}

#[test]
fn a_reused_qpn_is_parked_until_its_quarantine_ends() {
    // Destroy-now mode on a device that hands freed QPNs out again at once.
    let kernel = KernelModel::new(ModelConfig::mlx5().with_lifo_qpn_reuse());
    let mut cfg = RegistryConfig::default();
    cfg.policy.hold_qp_during_quarantine = false;
    let mut reg: TgtRegistry<&str> = TgtRegistry::new(Box::new(kernel.spawn()), cfg);
    let p = kernel.spawn().process();
    let now = Instant::now();
    let dom = reg.open_domain("d", DomainSpec::Private).unwrap();
    let q1 = reg.create_tgt_qp(now, dom, P::Explicit, p).unwrap();
    reg.destroy(now, q1, p).unwrap();
    assert!(!kernel.tgt_qp_exists(q1), "destroyed at once in this mode");
    let q2 = reg.create_tgt_qp(now, dom, P::Explicit, p).unwrap();
    assert_ne!(q2, q1, "the reused number was parked");
    assert!(
        kernel.tgt_qp_exists(q1),
        "the parked QP keeps the number taken"
    );
    reg.handle_timeout(now + LATER);
    assert!(!kernel.tgt_qp_exists(q1));
    assert!(kernel.tgt_qp_exists(q2));
}

#[test]
fn cm_reported_timewait_blocks_a_qpn() {
    let kernel = KernelModel::new(ModelConfig::mlx5());
    let mut reg: TgtRegistry<&str> =
        TgtRegistry::new(Box::new(kernel.spawn()), RegistryConfig::default());
    let now = Instant::now();
    let q = Qpn::new(0x48).unwrap(); // the model's first QPN
    reg.note_timewait(q, now + Duration::from_secs(1));
    let dom = reg.open_domain("d", DomainSpec::Private).unwrap();
    let p = kernel.spawn().process();
    let got = reg.create_tgt_qp(now, dom, P::Explicit, p).unwrap();
    assert_ne!(got, q);
    let rej = reg
        .handle_req(now, &req("c", dom, p, ReqMode::Attach(q)))
        .unwrap_err();
    assert_eq!(rej.kind, RejectKind::Gone(GoneCause::Unknown));
}

#[test]
fn req_to_a_closing_domain_is_rejected() {
    let mut e = env(P::Explicit, false);
    e.reg.close_domain(e.now, e.dom).unwrap();
    let rej = e
        .reg
        .handle_req(e.now, &req("c5", e.dom, e.other, ReqMode::Any))
        .unwrap_err();
    assert_eq!(rej.kind, RejectKind::Gone(GoneCause::DomainClosed));
    assert!(e
        .reg
        .create_tgt_qp(e.now, e.dom, P::Explicit, e.other)
        .is_err());
}

#[test]
fn rxe_backend_gives_no_xrc_through_the_registry() {
    let kernel = KernelModel::new(ModelConfig::rxe());
    let mut reg: TgtRegistry<&str> =
        TgtRegistry::new(Box::new(kernel.spawn()), RegistryConfig::default());
    let err = reg.open_domain("d", DomainSpec::Private).unwrap_err();
    assert!(err.to_string().contains("has no XRC"), "{err}");
}

#[test]
fn rekey_moves_the_connection_and_its_registration() {
    let mut e = env(P::Shared, true);
    assert!(e.reg.rekey_conn(&"c1", "c7"));
    assert!(!e.reg.rekey_conn(&"c1", "c8"), "c1 is gone");
    let q = e.reg.query(e.qpn).unwrap();
    assert_eq!(q.conns, vec!["c2", "c7"]);
    assert!(q
        .registrations
        .iter()
        .any(|(r, _)| *r == Registrant::Conn("c7")));
    // Events now name the new key.
    e.reg
        .unregister(e.now, e.qpn, &Registrant::Process(e.creator))
        .unwrap();
    assert_eq!(
        e.reg
            .handle_conn_event(e.now, &"c7", ConnEvent::PeerDreq)
            .unwrap(),
        Verdict::Kept
    );
    assert_eq!(
        e.reg.handle_conn_event(e.now, &"c1", ConnEvent::PeerDreq),
        None
    );
}

#[test]
fn note_gone_quarantines_a_foreign_qpn_with_its_cause() {
    let kernel = KernelModel::new(ModelConfig::mlx5());
    let mut reg: TgtRegistry<&str> =
        TgtRegistry::new(Box::new(kernel.spawn()), RegistryConfig::default());
    let now = Instant::now();
    let dom = reg.open_domain("d", DomainSpec::Private).unwrap();
    let p = kernel.spawn().process();
    let lost = Qpn::new(0x48).unwrap(); // the model's first QPN
    reg.note_gone(lost, GoneCause::KeeperLost, now + Duration::from_secs(1));
    let rej = reg
        .handle_req(now, &req("c", dom, p, ReqMode::Attach(lost)))
        .unwrap_err();
    assert_eq!(rej.kind, RejectKind::Gone(GoneCause::KeeperLost));
    assert_ne!(reg.create_tgt_qp(now, dom, P::Explicit, p).unwrap(), lost);
    reg.handle_timeout(now + Duration::from_secs(1));
    let rej = reg
        .handle_req(
            now + Duration::from_secs(1),
            &req("c", dom, p, ReqMode::Attach(lost)),
        )
        .unwrap_err();
    assert_eq!(rej.kind, RejectKind::Gone(GoneCause::Unknown));
}

#[test]
fn a_noted_timewait_extends_the_quarantine() {
    // A connection that left the QP earlier is still in TimeWait when the QP goes: the QP is
    // held (and its number quarantined) until that TimeWait ends too.
    let mut e = env(P::Explicit, false);
    let late = e.now + LATER;
    e.reg.handle_conn_event(e.now, &"c1", ConnEvent::PeerDreq);
    e.reg.note_timewait(e.qpn, late);
    e.reg.destroy(e.now, e.qpn, e.creator).unwrap();
    assert!(matches!(
        e.reg.qpn_status(e.qpn, e.now),
        ibcm_xrc::QpnStatus::Quarantined { until, .. } if until == late
    ));
    e.reg.handle_timeout(e.now + Duration::from_secs(5));
    assert!(e.kernel.tgt_qp_exists(e.qpn), "still held");
    // And a TimeWait reported after the release extends it as well.
    e.reg.note_timewait(e.qpn, late + LATER);
    e.reg.handle_timeout(late);
    assert!(e.kernel.tgt_qp_exists(e.qpn));
    e.reg.handle_timeout(late + LATER);
    assert!(!e.kernel.tgt_qp_exists(e.qpn));
}
