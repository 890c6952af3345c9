//! What an embedder of the XRC target hit: a REQ for a misconfigured service (no SRQ number,
//! more than 47, a domain never opened) must leave nothing bound and say what is wrong; the
//! target's counters count what went out.
#![cfg(feature = "cm")]
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::time::{Duration, Instant};

use ibcm::proto::EndpointConfig;
use ibcm::rt::{Cm, CmError, MemNetwork};
use ibcm_mad::xrc::{RejectKind, ServiceFault, TargetGone};
use ibcm_mad::{Guid, Qpn, RejReason, ServiceId};
use ibcm_xrc::cm::rt::XrcServer;
use ibcm_xrc::cm::{xrc_connect_params, IniOutcome, XrcService, XrcTarget, XrcTargetConfig};
use ibcm_xrc::verbs::model::{KernelModel, ModelConfig};
use ibcm_xrc::{
    DomainId, DomainSpec, GoneCause, IniPeer, OwnershipPolicy, RegistryConfig, SrqNum, TgtRegistry,
    TgtRequest, Verbs, XrcReqData,
};

fn srqns(n: u32) -> Vec<SrqNum> {
    (1..=n).map(|v| SrqNum::new(0x100 + v).unwrap()).collect()
}

fn addr(s: &str) -> ibcm::proto::PeerAddr {
    s.parse::<std::net::SocketAddr>().unwrap().into()
}

fn req(conn: u32, dom: DomainId, guid: u64, ini: u32, n: u32) -> TgtRequest<u32> {
    TgtRequest {
        conn,
        domain: dom,
        process: ibcm_xrc::ProcessId(7),
        peer: IniPeer {
            ca_guid: Guid(guid),
            ini_qpn: Qpn::new(ini).unwrap(),
        },
        data: XrcReqData::any(Some(OwnershipPolicy::DomainBound)),
        timewait: Duration::from_millis(10),
        srqns: srqns(n),
    }
}

/// A REQ whose service has 0 or 48 SRQ numbers is refused before anything is bound or
/// created; the next REQ under the same connection key, from another node, gets a TGT QP of
/// its own instead of the first node's.
#[test]
fn bad_srq_count_leaves_no_binding_for_the_next_req() {
    let kernel = KernelModel::new(ModelConfig::mlx5());
    let mut reg: TgtRegistry<u32> =
        TgtRegistry::new(Box::new(kernel.spawn()), RegistryConfig::default());
    let dom = reg.open_domain("job", DomainSpec::Private).unwrap();
    let now = Instant::now();
    for (n, fault) in [(0, ServiceFault::NoSrqns), (48, ServiceFault::TooManySrqns)] {
        let err = reg.handle_req(now, &req(1, dom, 0xa, 0x99, n)).unwrap_err();
        assert_eq!(err.kind, RejectKind::Misconfigured(fault), "{n} SRQNs");
        assert_eq!(err.reason(), RejReason::ConsumerReject);
        assert!(reg.bound_conns().is_empty(), "{n} SRQNs: nothing bound");
        assert!(reg.tgt_qps().is_empty(), "{n} SRQNs: nothing created");
    }
    assert!(reg.leaks().is_empty());
    // Another node, same key (the CM reused the comm ID).
    let acc = reg.handle_req(now, &req(1, dom, 0xb, 0x77, 1)).unwrap();
    assert!(acc.created, "a TGT QP of its own");
    let q = reg.query(acc.tgt_qpn).unwrap();
    assert_eq!(q.peer.map(|p| p.ca_guid), Some(Guid(0xb)));
}

/// The same key from another initiator while the first binding is still there is a new
/// connection (the stale binding goes), not a duplicate of the first.
#[test]
fn reused_key_from_another_node_is_not_a_duplicate() {
    let kernel = KernelModel::new(ModelConfig::mlx5());
    let mut reg: TgtRegistry<u32> =
        TgtRegistry::new(Box::new(kernel.spawn()), RegistryConfig::default());
    let dom = reg.open_domain("job", DomainSpec::Private).unwrap();
    let now = Instant::now();
    let a = reg.handle_req(now, &req(5, dom, 0xa, 0x99, 1)).unwrap();
    let b = reg.handle_req(now, &req(5, dom, 0xb, 0x77, 1)).unwrap();
    assert_ne!(a.tgt_qpn, b.tgt_qpn);
    assert!(b.created);
    assert_eq!(reg.bound_conns(), vec![(5, b.tgt_qpn)]);
}

/// A Shared QP held only by a binding its CM forgot is a leak (`leaks_with`), and the binding is
/// listed.
#[test]
fn leaks_see_phantom_bindings() {
    let kernel = KernelModel::new(ModelConfig::mlx5());
    let mut reg: TgtRegistry<u32> =
        TgtRegistry::new(Box::new(kernel.spawn()), RegistryConfig::default());
    let dom = reg.open_domain("job", DomainSpec::Private).unwrap();
    let now = Instant::now();
    let mut r = req(3, dom, 0xa, 0x99, 1);
    r.data = XrcReqData::any(Some(OwnershipPolicy::Shared));
    let a = reg.handle_req(now, &r).unwrap();
    assert!(reg.leaks().is_empty(), "the connection is bound");
    let leaks = reg.leaks_with(|_| false);
    assert_eq!(leaks.len(), 1);
    assert_eq!(leaks[0].qpn, a.tgt_qpn);
    assert_eq!(reg.stale_conns(|_| false), vec![(3, a.tgt_qpn)]);
    assert!(reg.stale_conns(|_| true).is_empty());
}

struct Node {
    server: XrcServer,
    t_addr: ibcm::proto::PeerAddr,
    net: MemNetwork,
}

const BAD0: ServiceId = ServiceId(0x1000);
const BAD48: ServiceId = ServiceId(0x1001);
const NODOM: ServiceId = ServiceId(0x1002);
const GOOD: ServiceId = ServiceId(0x1003);
const SHARED: ServiceId = ServiceId(0x1004);

async fn node() -> Node {
    let net = MemNetwork::new();
    let t_addr = addr("127.0.0.2:4791");
    let kernel = KernelModel::new(ModelConfig::mlx5());
    let mut reg = TgtRegistry::new(Box::new(kernel.spawn()), RegistryConfig::default());
    let dom = reg.open_domain("job", DomainSpec::Private).unwrap();
    let worker = kernel.spawn().process();
    let cfg = EndpointConfig {
        local_ca_guid: Guid(2),
        timewait: Some(Duration::from_millis(50)),
        ..EndpointConfig::default()
    };
    let (server, _) = XrcServer::bind(
        net.transport(t_addr),
        cfg,
        XrcTarget::new(reg, XrcTargetConfig::default()),
    );
    for (sid, d, n) in [
        (BAD0, dom, 0),
        (BAD48, dom, 48),
        (NODOM, DomainId(99), 1),
        (GOOD, dom, 1),
        (SHARED, dom, 1),
    ] {
        server
            .listen(sid, XrcService::new(d, worker, srqns(n)))
            .await
            .unwrap();
    }
    Node {
        server,
        t_addr,
        net,
    }
}

async fn refused(cm: &Cm, to: ibcm::proto::PeerAddr, sid: ServiceId) -> (RejReason, TargetGone) {
    let p = xrc_connect_params(
        to,
        sid,
        Qpn::new(0x99).unwrap(),
        &XrcReqData::any(None),
        &[],
    )
    .unwrap();
    match cm.connect(p).await {
        Err(CmError::Connection(e)) => match IniOutcome::from_close(&e) {
            IniOutcome::Refused {
                reason,
                info: Some(info),
            } => (reason, info),
            other => panic!("{other}"),
        },
        other => panic!("{other:?}"),
    }
}

/// Over the async API: each misconfiguration reaches the initiator as what it is, the
/// target keeps no phantom binding, and another node connects normally afterwards.
#[tokio::test(start_paused = true)]
async fn misconfigured_services_say_what_is_wrong() {
    let n = node().await;
    let (i_cm, _) = Cm::bind(n.net.transport(addr("127.0.0.1:4791")), Default::default());
    let cases = [
        (BAD0, ServiceFault::NoSrqns, "no XRC SRQ number"),
        (
            BAD48,
            ServiceFault::TooManySrqns,
            "too many XRC SRQ numbers",
        ),
        (NODOM, ServiceFault::UnknownDomain, "unknown XRC domain"),
    ];
    for (sid, fault, words) in cases {
        let (reason, info) = refused(&i_cm, n.t_addr, sid).await;
        assert_eq!(reason, RejReason::ConsumerReject);
        assert_eq!(info.kind, RejectKind::Misconfigured(fault));
        let text = info.to_string();
        assert!(text.contains(words), "{text}");
        assert!(!info.is_gone(), "not 'target gone': {text}");
    }
    assert!(n.server.stale_conns().await.unwrap().is_empty());
    assert!(n.server.leaks().await.unwrap().is_empty());
    assert!(n
        .server
        .with_target(|t, _| t.registry().tgt_qps().is_empty())
        .await
        .unwrap());
    // Another node: accepted on a QP created for it.
    let (other, _) = Cm::bind(
        n.net.transport(addr("127.0.0.3:4791")),
        EndpointConfig {
            local_ca_guid: Guid(3),
            ..EndpointConfig::default()
        },
    );
    let p = xrc_connect_params(
        n.t_addr,
        GOOD,
        Qpn::new(0x77).unwrap(),
        &XrcReqData::any(None),
        &[],
    )
    .unwrap();
    let c = other.connect(p).await.unwrap();
    let rep = ibcm_xrc::cm::IniRep::from_rep_info(&c.rep().unwrap());
    assert!(rep.data.as_ref().unwrap().created, "{rep:?}");
}

/// A domain that was opened and closed still reads "target gone (domain closed)".
#[tokio::test(start_paused = true)]
async fn closed_domain_still_reads_domain_closed() {
    let n = node().await;
    let (i_cm, _) = Cm::bind(n.net.transport(addr("127.0.0.1:4791")), Default::default());
    n.server
        .with_target(|t, now| {
            let d = t.registry().domain_by_name("job").unwrap();
            t.registry_mut().close_domain(now, d).unwrap();
        })
        .await
        .unwrap();
    let p = xrc_connect_params(
        n.t_addr,
        GOOD,
        Qpn::new(0x99).unwrap(),
        &XrcReqData::any(None),
        &[],
    )
    .unwrap();
    match i_cm.connect(p).await {
        Err(CmError::Connection(e)) => match IniOutcome::from_close(&e) {
            IniOutcome::TargetGone { cause, .. } => assert_eq!(cause, GoneCause::DomainClosed),
            other => panic!("{other}"),
        },
        other => panic!("{other:?}"),
    }
}

/// A connection already being torn down by a DREQ when its TGT QP goes (the application
/// disconnected it, then destroyed the QP): the teardown sends nothing more, so the target
/// counts neither a DREQ nor a REJ for it (it used to count a REJ) and reports no
/// `Teardown`. The peer's own DREQ releasing a Shared QP counts nothing either.
#[tokio::test(start_paused = true)]
async fn dreq_teardown_is_not_counted_as_a_rej() {
    let n = node().await;
    let (i_cm, _) = Cm::bind(n.net.transport(addr("127.0.0.1:4791")), Default::default());
    let connect = |sid, policy, ini| {
        xrc_connect_params(
            n.t_addr,
            sid,
            Qpn::new(ini).unwrap(),
            &XrcReqData::any(Some(policy)),
            &[],
        )
        .unwrap()
    };
    let c = i_cm
        .connect(connect(GOOD, OwnershipPolicy::Explicit, 0x99))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(5)).await;
    let qpn = ibcm_xrc::cm::IniRep::from_rep_info(&c.rep().unwrap()).tgt_qpn;
    let events = n
        .server
        .with(move |t, ep, now| {
            let conn = t.conns_on(qpn)[0];
            ep.disconnect(now, conn, &[]).unwrap();
            let w = t.service(GOOD).unwrap().process;
            t.registry_mut().destroy(now, qpn, w).unwrap();
            t.flush(ep, now);
            std::iter::from_fn(|| t.poll_event()).collect::<Vec<_>>()
        })
        .await
        .unwrap();
    assert!(
        !events
            .iter()
            .any(|e| matches!(e, ibcm_xrc::cm::TargetEvent::Teardown { .. })),
        "{events:?}"
    );
    let e = c.closed().await;
    assert_eq!(
        IniOutcome::from_close(&e),
        IniOutcome::Disconnected { by_peer: true }
    );
    let st = n.server.with_target(|t, _| t.stats()).await.unwrap();
    assert_eq!((st.dreqs, st.rejs), (0, 0), "{st:?}");

    let c = i_cm
        .connect(connect(SHARED, OwnershipPolicy::Shared, 0x9a))
        .await
        .unwrap();
    c.disconnect(&[]).await;
    tokio::time::sleep(Duration::from_millis(5)).await;
    let st = n.server.with_target(|t, _| t.stats()).await.unwrap();
    assert_eq!((st.dreqs, st.rejs), (0, 0), "{st:?}");
}

/// A second XRC service on a listened service ID is refused; the first one keeps answering.
#[tokio::test(start_paused = true)]
async fn second_xrc_listen_is_refused() {
    let n = node().await;
    let svc = n
        .server
        .with_target(|t, _| t.service(GOOD).cloned())
        .await
        .unwrap()
        .unwrap();
    match n
        .server
        .listen(GOOD, XrcService::new(DomainId(99), svc.process, srqns(1)))
        .await
    {
        Err(CmError::AlreadyListening(sid)) => assert_eq!(sid, GOOD),
        other => panic!("{other:?}"),
    }
    assert_eq!(
        n.server
            .with_target(|t, _| t.service(GOOD).cloned())
            .await
            .unwrap(),
        Some(svc)
    );
    match n.server.cm().listen(GOOD, Default::default()).await {
        Err(CmError::AlreadyListening(sid)) => assert_eq!(sid, GOOD),
        other => panic!("{other:?}"),
    }
}
