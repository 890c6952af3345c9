//! Unit tests of the kernel model.

use super::*;
use crate::verbs::qp::AccessFlags;

fn mlx5() -> KernelModel {
    KernelModel::new(ModelConfig::mlx5())
}

#[test]
fn private_domains_are_not_shared() {
    let k = mlx5();
    let mut a = k.spawn();
    a.open_xrcd(&DomainSpec::Private).unwrap();
    a.open_xrcd(&DomainSpec::Private).unwrap();
    assert_eq!(k.snapshot().domains, 2);
}

#[test]
fn o_creat_o_excl_semantics() {
    let k = mlx5();
    let mut a = k.spawn();
    let mut b = k.spawn();
    assert!(matches!(
        a.open_xrcd(&DomainSpec::existing("/d")),
        Err(VerbsError::DomainNotFound { .. })
    ));
    a.open_xrcd(&DomainSpec::exclusive("/d")).unwrap();
    assert!(matches!(
        b.open_xrcd(&DomainSpec::exclusive("/d")),
        Err(VerbsError::DomainExists { .. })
    ));
    b.open_xrcd(&DomainSpec::existing("/d")).unwrap();
    b.open_xrcd(&DomainSpec::file("/d")).unwrap();
    assert_eq!(k.domain_usecnt("/d"), Some(3));
    assert_eq!(k.snapshot().domains, 1);
}

#[test]
fn creator_has_no_special_power() {
    let k = mlx5();
    let mut a = k.spawn();
    let mut b = k.spawn();
    let xa = a.open_xrcd(&DomainSpec::file("/d")).unwrap();
    let xb = b.open_xrcd(&DomainSpec::file("/d")).unwrap();
    let t = a.create_tgt_qp(xa).unwrap();
    let qpn = a.qp_num(t).unwrap();
    let tb = b.open_tgt_qp(xb, qpn).unwrap();
    a.destroy_qp(t).unwrap();
    assert!(k.tgt_qp_exists(qpn), "b's handle keeps it");
    b.destroy_qp(tb).unwrap();
    assert!(!k.tgt_qp_exists(qpn));
}

#[test]
fn creator_exit_destroys_unshared_qp() {
    let k = mlx5();
    let mut a = k.spawn();
    let xa = a.open_xrcd(&DomainSpec::file("/d")).unwrap();
    let t = a.create_tgt_qp(xa).unwrap();
    let qpn = a.qp_num(t).unwrap();
    let pid = a.process();
    assert!(k.kill(pid));
    assert!(!k.tgt_qp_exists(qpn));
    assert_eq!(
        k.domain_usecnt("/d"),
        None,
        "the domain went with its last user"
    );
    assert!(matches!(a.qp_num(t), Err(VerbsError::ProcessExited { .. })));
    assert!(!k.kill(pid));
}

#[test]
fn holding_only_the_domain_does_not_keep_a_qp() {
    // docs/xrc.md §0.1: a keeper needs an ibv_open_qp handle, not just the XRCD.
    let k = mlx5();
    let mut keeper = k.spawn();
    keeper.open_xrcd(&DomainSpec::file("/d")).unwrap();
    let mut a = k.spawn();
    let xa = a.open_xrcd(&DomainSpec::file("/d")).unwrap();
    let qpn = {
        let t = a.create_tgt_qp(xa).unwrap();
        a.qp_num(t).unwrap()
    };
    drop(a);
    assert!(!k.tgt_qp_exists(qpn));
    assert_eq!(k.domain_usecnt("/d"), Some(1));
}

#[test]
fn close_xrcd_busy_while_qps_or_srqs() {
    let k = mlx5();
    let mut a = k.spawn();
    let x = a.open_xrcd(&DomainSpec::file("/d")).unwrap();
    let t = a.create_tgt_qp(x).unwrap();
    let s = a.create_xrc_srq(x, &SrqAttr::default()).unwrap();
    assert_eq!(
        a.close_xrcd(x),
        Err(VerbsError::Busy {
            what: "XRCD",
            users: 2
        })
    );
    a.destroy_qp(t).unwrap();
    a.destroy_srq(s).unwrap();
    a.close_xrcd(x).unwrap();
    assert_eq!(k.snapshot().domains, 0);
}

#[test]
fn tgt_qps_and_srqs_pin_the_domain_usecnt() {
    let k = mlx5();
    let mut a = k.spawn();
    let x = a.open_xrcd(&DomainSpec::file("/d")).unwrap();
    let _t = a.create_tgt_qp(x).unwrap();
    let _s = a.create_xrc_srq(x, &SrqAttr::default()).unwrap();
    assert_eq!(k.domain_usecnt("/d"), Some(3));
}

#[test]
fn open_by_number_needs_the_same_domain() {
    let k = mlx5();
    let mut a = k.spawn();
    let mut b = k.spawn();
    let xa = a.open_xrcd(&DomainSpec::file("/d1")).unwrap();
    let xb = b.open_xrcd(&DomainSpec::file("/d2")).unwrap();
    let t = a.create_tgt_qp(xa).unwrap();
    let qpn = a.qp_num(t).unwrap();
    assert_eq!(b.open_tgt_qp(xb, qpn), Err(VerbsError::UnknownQpn { qpn }));
    let xb1 = b.open_xrcd(&DomainSpec::existing("/d1")).unwrap();
    assert!(b.open_tgt_qp(xb1, qpn).is_ok());
    assert_eq!(k.qp_holders(qpn), vec![a.process(), b.process()]);
}

#[test]
fn handles_are_per_process() {
    let k = mlx5();
    let mut a = k.spawn();
    let mut b = k.spawn();
    let xa = a.open_xrcd(&DomainSpec::Private).unwrap();
    let t = a.create_tgt_qp(xa).unwrap();
    // b has no handles at all: any number is invalid there.
    assert!(matches!(b.destroy_qp(t), Err(VerbsError::BadHandle { .. })));
    assert!(matches!(
        b.create_tgt_qp(xa),
        Err(VerbsError::BadHandle { .. })
    ));
}

#[test]
fn rxe_has_no_xrc() {
    let k = KernelModel::new(ModelConfig::rxe());
    let mut a = k.spawn();
    let e = a.open_xrcd(&DomainSpec::Private).unwrap_err();
    assert!(matches!(e, VerbsError::NoXrc { .. }));
    assert!(e.to_string().contains("has no XRC"));
    // the provider's own answer, as rdma-core gives it on rxe
    assert!(
        e.to_string()
            .ends_with("and ibv_open_xrcd fails: Operation not supported (errno 95)"),
        "{e}"
    );
    assert!(!a.device().xrc);
}

#[test]
fn qedr_has_no_open_qp() {
    let k = KernelModel::new(ModelConfig::qedr());
    let mut a = k.spawn();
    let x = a.open_xrcd(&DomainSpec::file("/d")).unwrap();
    let t = a.create_tgt_qp(x).unwrap();
    let qpn = a.qp_num(t).unwrap();
    assert!(matches!(
        a.open_tgt_qp(x, qpn),
        Err(VerbsError::NotSupported {
            op: "ibv_open_qp",
            ..
        })
    ));
}

#[test]
fn qpn_allocation_is_deterministic_and_lifo_reuse_works() {
    let k = KernelModel::new(ModelConfig::mlx5().with_lifo_qpn_reuse());
    let mut a = k.spawn();
    let x = a.open_xrcd(&DomainSpec::Private).unwrap();
    let t1 = a.create_tgt_qp(x).unwrap();
    let t2 = a.create_tgt_qp(x).unwrap();
    let q1 = a.qp_num(t1).unwrap();
    assert_eq!(q1.get(), 0x48);
    assert_eq!(a.qp_num(t2).unwrap().get(), 0x49);
    a.destroy_qp(t1).unwrap();
    let t3 = a.create_tgt_qp(x).unwrap();
    assert_eq!(
        a.qp_num(t3).unwrap(),
        q1,
        "LIFO reuse hands the freed QPN out again"
    );

    let k2 = mlx5();
    let mut b = k2.spawn();
    let x = b.open_xrcd(&DomainSpec::Private).unwrap();
    let t = b.create_tgt_qp(x).unwrap();
    let q = b.qp_num(t).unwrap();
    b.destroy_qp(t).unwrap();
    let t = b.create_tgt_qp(x).unwrap();
    assert_ne!(b.qp_num(t).unwrap(), q);
}

#[test]
fn max_qps_limit() {
    let mut cfg = ModelConfig::mlx5();
    cfg.max_qps = 1;
    let k = KernelModel::new(cfg);
    let mut a = k.spawn();
    let x = a.open_xrcd(&DomainSpec::Private).unwrap();
    a.create_tgt_qp(x).unwrap();
    assert_eq!(
        a.create_tgt_qp(x),
        Err(VerbsError::NoResources { what: "QP" })
    );
}

#[test]
fn modify_follows_the_rules_and_every_holder_may_modify() {
    let k = mlx5();
    let mut a = k.spawn();
    let mut b = k.spawn();
    let xa = a.open_xrcd(&DomainSpec::file("/d")).unwrap();
    let xb = b.open_xrcd(&DomainSpec::file("/d")).unwrap();
    let t = a.create_tgt_qp(xa).unwrap();
    let qpn = a.qp_num(t).unwrap();
    let tb = b.open_tgt_qp(xb, qpn).unwrap();
    assert!(matches!(
        a.modify_qp(t, &QpAttr::to_state(QpState::Rtr)),
        Err(VerbsError::Modify(_))
    ));
    b.modify_qp(tb, &QpAttr::to_init(0, 1, AccessFlags::default()))
        .unwrap();
    assert_eq!(a.query_qp(t).unwrap().state, QpState::Init);
    a.modify_qp(t, &QpAttr::to_state(QpState::Err)).unwrap();
    assert_eq!(k.qp_state(qpn), Some(QpState::Err));
}

#[test]
fn ini_qp_and_srq_numbers() {
    let k = mlx5();
    let mut a = k.spawn();
    let x = a.open_xrcd(&DomainSpec::Private).unwrap();
    let i = a.create_ini_qp(&IniQpCaps::default()).unwrap();
    assert_eq!(a.query_qp(i).unwrap().qp_type, QpType::XrcIni);
    let s1 = a.create_xrc_srq(x, &SrqAttr::default()).unwrap();
    let s2 = a.create_xrc_srq(x, &SrqAttr::default()).unwrap();
    assert_eq!(a.srq_num(s1).unwrap().get(), 0x10);
    assert_eq!(a.srq_num(s2).unwrap().get(), 0x11);
    let snap = k.snapshot();
    assert_eq!((snap.ini_qps, snap.srqs), (1, 2));
    drop(a);
    assert_eq!(k.snapshot(), ModelSnapshot::default());
}

fn psn(v: u32) -> ibcm_mad::Psn {
    ibcm_mad::Psn::masked(v)
}

/// A TGT QP of `x` in RTR, as the CM's accept leaves it (expecting PSN 1).
fn tgt_in_rtr(v: &mut ModelVerbs, x: XrcdHandle) -> (QpHandle, Qpn) {
    use crate::verbs::qp::{AddressVector, PathMtu};
    let t = v.create_tgt_qp(x).unwrap();
    v.modify_qp(t, &QpAttr::to_init(0, 1, AccessFlags::default()))
        .unwrap();
    v.modify_qp(
        t,
        &QpAttr::tgt_to_rtr(
            AddressVector::default(),
            PathMtu::Mtu1024,
            Qpn::masked(0x11),
            ibcm_mad::Psn::masked(1),
            1,
            12,
        ),
    )
    .unwrap();
    let qpn = v.qp_num(t).unwrap();
    (t, qpn)
}

#[test]
fn a_tgt_qp_delivers_into_another_process_srq_of_its_domain_only() {
    let k = mlx5();
    let mut daemon = k.spawn();
    let mut runtime = k.spawn();
    let xd = daemon.open_xrcd(&DomainSpec::file("/job1")).unwrap();
    let (t, qpn) = tgt_in_rtr(&mut daemon, xd);
    // the runtime opens the same file and creates its SRQ there, room for two receives
    let xr = runtime.open_xrcd(&DomainSpec::existing("/job1")).unwrap();
    let attr = SrqAttr {
        max_wr: 2,
        ..SrqAttr::default()
    };
    let srq = runtime.create_xrc_srq(xr, &attr).unwrap();
    let srqn = runtime.srq_num(srq).unwrap();
    assert_eq!(k.deliver(qpn, psn(1), srqn, b"one"), Delivery::Received);
    assert_eq!(k.deliver(qpn, psn(2), srqn, b"two"), Delivery::Received);
    assert_eq!(
        k.deliver(qpn, psn(3), srqn, b"three"),
        Delivery::ReceiverNotReady
    );
    assert_eq!(runtime.poll_srq(srq).unwrap().as_deref(), Some(&b"one"[..]));
    assert_eq!(runtime.poll_srq(srq).unwrap().as_deref(), Some(&b"two"[..]));
    assert_eq!(runtime.poll_srq(srq).unwrap(), None);
    // the daemon cannot poll the runtime's SRQ: not its handle
    assert!(matches!(
        daemon.poll_srq(srq),
        Err(VerbsError::BadHandle { what: "srq", .. })
    ));
    // an SRQ of another domain is refused, and so is a number that is no SRQ
    let mut other = k.spawn();
    let xo = other.open_xrcd(&DomainSpec::file("/job2")).unwrap();
    let srq_o = other.create_xrc_srq(xo, &SrqAttr::default()).unwrap();
    let srqn_o = other.srq_num(srq_o).unwrap();
    assert_eq!(k.deliver(qpn, psn(3), srqn_o, b"x"), Delivery::OtherDomain);
    // a PSN other than the next one expected is a sequence error: nothing received
    assert_eq!(
        k.deliver(qpn, psn(4), srqn, b"x"),
        Delivery::OutOfSequence { expected: 3 }
    );
    assert_eq!(
        k.deliver(qpn, psn(2), srqn, b"x"),
        Delivery::OutOfSequence { expected: 3 }
    );
    assert_eq!(other.poll_srq(srq_o).unwrap(), None);
    assert_eq!(
        k.deliver(qpn, psn(3), SrqNum::new(0xff_fff0).unwrap(), b"x"),
        Delivery::UnknownSrq
    );
    // a QP in ERR delivers nothing; no QP at all neither
    daemon
        .modify_qp(t, &QpAttr::to_state(QpState::Err))
        .unwrap();
    assert!(matches!(
        k.deliver(qpn, psn(3), srqn, b"x"),
        Delivery::NotReady(QpState::Err)
    ));
    assert_eq!(
        k.deliver(Qpn::masked(0x7f_0000), psn(3), srqn, b"x"),
        Delivery::UnknownQp
    );
    // the runtime exits: its SRQ goes with it
    drop(runtime);
    let (_t2, qpn2) = tgt_in_rtr(&mut daemon, xd);
    assert_eq!(k.deliver(qpn2, psn(1), srqn, b"x"), Delivery::UnknownSrq);
}
