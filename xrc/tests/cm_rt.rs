//! [`XrcServer`]: the XRC target as the app of ibcm's tokio driver (in-memory network, paused
//! clock).
#![cfg(feature = "cm")]
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::time::Duration;

use ibcm::proto::{AcceptParams, ConnectParams, EndpointConfig, ListenOptions, PeerAddr, State};
use ibcm::rt::{Cm, CmError, Connection, MemNetwork};
use ibcm_mad::xrc::RejectKind;
use ibcm_mad::{Guid, Qpn, RejReason, ServiceId};
use ibcm_xrc::cm::rt::XrcServer;
use ibcm_xrc::cm::{
    xrc_connect_params, GoneSignal, IniOutcome, TargetEvent, XrcInitiator, XrcService, XrcTarget,
    XrcTargetConfig,
};
use ibcm_xrc::verbs::model::{KernelModel, ModelConfig};
use ibcm_xrc::{
    ConnEvent, DomainSpec, GoneCause, OwnershipPolicy, ProcessId, RegistryConfig, SrqNum,
    TgtRegistry, Verbs, Verdict, XrcReqData,
};

const SID: ServiceId = ServiceId(0x1000);
const TW: Duration = Duration::from_millis(500);

fn addr(s: &str) -> PeerAddr {
    s.parse::<std::net::SocketAddr>().unwrap().into()
}

async fn connect(cm: &Cm, to: PeerAddr, ini: u32, data: XrcReqData) -> Result<Connection, CmError> {
    let p = xrc_connect_params(to, SID, Qpn::new(ini).unwrap(), &data, &[]).unwrap();
    cm.connect(p).await
}

async fn events(server: &XrcServer) -> Vec<TargetEvent> {
    let mut v = Vec::new();
    while let Some(e) = server.poll_event().await.unwrap() {
        v.push(e);
    }
    v
}

#[tokio::test(start_paused = true)]
async fn policy_plays_out_over_the_async_api() {
    let net = MemNetwork::new();
    let (t_addr, i_addr) = (addr("127.0.0.2:4791"), addr("127.0.0.1:4791"));
    let t_cfg = EndpointConfig {
        local_ca_guid: Guid(2),
        timewait: Some(TW),
        ..EndpointConfig::default()
    };
    let (i_cm, _) = Cm::bind(
        net.transport(i_addr),
        EndpointConfig {
            timewait: Some(Duration::from_millis(100)),
            ..EndpointConfig::default()
        },
    );
    let kernel = KernelModel::new(ModelConfig::mlx5());
    let mut cfg = RegistryConfig::default();
    cfg.policy.default_timewait = Duration::from_millis(50);
    let mut reg = TgtRegistry::new(Box::new(kernel.spawn()), cfg);
    let dom = reg.open_domain("job", DomainSpec::Private).unwrap();
    let worker = kernel.spawn().process();
    let (server, _) = XrcServer::bind(
        net.transport(t_addr),
        t_cfg,
        XrcTarget::new(reg, XrcTargetConfig::default()),
    );
    server
        .listen(
            SID,
            XrcService::new(dom, worker, vec![SrqNum::new(0x10).unwrap()]),
        )
        .await
        .unwrap();

    // Two connections over one INI QP share one TGT QP.
    let data = XrcReqData::any(Some(OwnershipPolicy::ProcessBound));
    let c1 = connect(&i_cm, t_addr, 0x99, data).await.unwrap();
    let c2 = connect(&i_cm, t_addr, 0x99, data).await.unwrap();
    tokio::time::sleep(Duration::from_millis(10)).await;
    let accepted: Vec<_> = events(&server)
        .await
        .into_iter()
        .filter_map(|e| match e {
            TargetEvent::Accepted {
                conn, qpn, created, ..
            } => Some((conn, qpn, created)),
            _ => None,
        })
        .collect();
    assert_eq!(accepted.len(), 2);
    let qpn = accepted[0].1;
    assert_eq!(accepted[1].1, qpn);
    assert!(accepted[0].2 && !accepted[1].2);
    assert_ne!(accepted[0].0, accepted[1].0, "the connections' own IDs");
    let second = accepted[1].0;
    assert_eq!(
        server
            .with_target(move |t, _| t.conn_qpn(second))
            .await
            .unwrap(),
        Some(qpn)
    );

    // The initiator disconnects c1: kept. A new connection attaches while the target still
    // has c1 in TimeWait.
    c1.disconnect(&[]).await;
    tokio::time::sleep(Duration::from_millis(150)).await;
    let closed: Vec<_> = events(&server)
        .await
        .into_iter()
        .filter_map(|e| match e {
            TargetEvent::Closed { event, verdict, .. } => Some((event, verdict)),
            _ => None,
        })
        .collect();
    assert_eq!(closed, vec![(ConnEvent::PeerDreq, Some(Verdict::Kept))]);
    let c3 = connect(&i_cm, t_addr, 0x99, XrcReqData::attach(qpn))
        .await
        .unwrap();

    // The worker exits: c2 and c3 get DREQs saying why.
    server
        .with_target(move |t, now| {
            t.registry_mut().process_exit(now, worker);
        })
        .await
        .unwrap();
    for c in [&c2, &c3] {
        let why = IniOutcome::from_close(&c.closed().await);
        assert_eq!(
            why,
            IniOutcome::TargetGone {
                cause: GoneCause::CreatorExited,
                qpn: Some(qpn),
                by: GoneSignal::Dreq
            }
        );
    }
    // A reconnect naming the QP: REJ 1 + the block.
    let Err(CmError::Connection(e)) = connect(&i_cm, t_addr, 0x9a, XrcReqData::attach(qpn)).await
    else {
        panic!("accepted")
    };
    assert!(matches!(
        IniOutcome::from_close(&e),
        IniOutcome::TargetGone {
            cause: GoneCause::CreatorExited,
            by: GoneSignal::Rej,
            ..
        }
    ));
    assert!(kernel.tgt_qp_exists(qpn), "held during the quarantine");
    // The driver's timer ends the quarantine after the TimeWait.
    tokio::time::sleep(TW * 3).await;
    assert!(!kernel.tgt_qp_exists(qpn));
    let Err(CmError::Connection(e)) = connect(&i_cm, t_addr, 0x9b, XrcReqData::attach(qpn)).await
    else {
        panic!("accepted")
    };
    assert!(matches!(
        IniOutcome::from_close(&e),
        IniOutcome::TargetGone {
            cause: GoneCause::Unknown,
            ..
        }
    ));
    let st = server.with_target(|t, _| t.stats()).await.unwrap();
    assert_eq!(
        (st.created, st.attached, st.dreqs, st.rejected),
        (1, 2, 2, 2)
    );
}

/// A target node with one XRC service and an initiator node whose driver runs an
/// [`XrcInitiator`] (so a test can hold an RTU back).
struct Pair {
    server: XrcServer,
    ini: Cm,
    kernel: KernelModel,
    worker: ProcessId,
    t_addr: PeerAddr,
    i_addr: PeerAddr,
}

fn pair() -> Pair {
    pair_with(RegistryConfig::default())
}

fn pair_with(reg_cfg: RegistryConfig) -> Pair {
    let net = MemNetwork::new();
    let (t_addr, i_addr) = (addr("127.0.0.2:4791"), addr("127.0.0.1:4791"));
    let kernel = KernelModel::new(ModelConfig::mlx5());
    let mut reg = TgtRegistry::new(Box::new(kernel.spawn()), reg_cfg);
    let dom = reg.open_domain("job", DomainSpec::Private).unwrap();
    let worker = kernel.spawn().process();
    let mut target = XrcTarget::new(reg, XrcTargetConfig::default());
    target.serve(
        SID,
        XrcService::new(dom, worker, vec![SrqNum::new(0x10).unwrap()]),
    );
    let t_cfg = EndpointConfig {
        local_ca_guid: Guid(2),
        timewait: Some(TW),
        ..EndpointConfig::default()
    };
    let (server, _) = XrcServer::bind(net.transport(t_addr), t_cfg, target);
    let (ini, _) = Cm::bind_with_app(
        net.transport(i_addr),
        EndpointConfig::default(),
        XrcInitiator::new(),
    );
    Pair {
        server,
        ini,
        kernel,
        worker,
        t_addr,
        i_addr,
    }
}

impl Pair {
    async fn listen(&self) {
        let (svc, sid) = (
            self.server
                .with_target(|t, _| t.service(SID).cloned())
                .await
                .unwrap()
                .unwrap(),
            SID,
        );
        self.server.listen(sid, svc).await.unwrap();
    }

    /// An XRC REQ from the initiator's app; `hold` keeps the RTU back.
    async fn connect(&self, ini_qpn: u32, data: XrcReqData, hold: bool) -> ibcm::proto::ConnId {
        let p =
            xrc_connect_params(self.t_addr, SID, Qpn::new(ini_qpn).unwrap(), &data, &[]).unwrap();
        self.ini
            .with_app(move |x: &mut XrcInitiator, ep, now| {
                let c = x.connect_with(ep, now, p).unwrap();
                if hold {
                    x.hold_rtu(c);
                }
                c
            })
            .await
            .unwrap()
    }

    async fn ini<R: Send + 'static>(
        &self,
        f: impl FnOnce(&mut XrcInitiator) -> R + Send + 'static,
    ) -> R {
        self.ini
            .with_app(move |x: &mut XrcInitiator, _, _| f(x))
            .await
            .unwrap()
    }
}

/// The TGT QP goes away after the REP, before the RTU: the target rejects the REQ at once
/// (REJ 1 + the block), instead of waiting for the connection to be established to send a
/// DREQ.
#[tokio::test(start_paused = true)]
async fn tgt_qp_gone_before_the_rtu_gets_the_req_rejected() {
    let p = pair();
    p.listen().await;
    let data = XrcReqData::any(Some(OwnershipPolicy::Explicit));
    let c = p.connect(0x99, data, true).await;
    tokio::time::sleep(Duration::from_millis(5)).await;
    let qpn = p
        .ini(move |x| x.rep(c).map(|r| r.tgt_qpn))
        .await
        .expect("REP");
    let conn = events(&p.server)
        .await
        .into_iter()
        .find_map(|e| match e {
            TargetEvent::Accepted { conn, .. } => Some(conn),
            _ => None,
        })
        .unwrap();
    let state = p.server.with(move |_, ep, _| ep.state(conn)).await.unwrap();
    assert_eq!(state, Some(State::RepSent), "the RTU is held back");

    let worker = p.worker;
    p.server
        .with_target(move |t, now| {
            t.registry_mut().destroy(now, qpn, worker).unwrap();
        })
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(5)).await;
    assert_eq!(
        p.ini(move |x| x.outcome(c).cloned()).await,
        Some(IniOutcome::TargetGone {
            cause: GoneCause::OwnerDestroyed,
            qpn: Some(qpn),
            by: GoneSignal::Rej
        })
    );
    let ev = events(&p.server).await;
    assert!(
        ev.contains(&TargetEvent::Teardown {
            conn,
            qpn,
            cause: GoneCause::OwnerDestroyed,
            established: false
        }),
        "{ev:?}"
    );
    let st = p.server.with_target(|t, _| t.stats()).await.unwrap();
    assert_eq!((st.rejs, st.dreqs), (1, 0));
    assert!(p.kernel.tgt_qp_exists(qpn), "held during the quarantine");
}

/// The new TGT QP's number is in the endpoint's own TimeWait quarantine (from an RC
/// connection of the same endpoint) and the registry may create no other (one attempt): the
/// QP is parked, never offered in a REP, and the initiator gets REJ 3 "no resources" at once
/// instead of waiting for its REQ to time out.
#[tokio::test(start_paused = true)]
async fn req_without_a_free_tgt_qpn_answers_the_initiator_with_a_rej() {
    let p = pair_with(RegistryConfig {
        max_create_attempts: 1,
        ..RegistryConfig::default()
    });
    p.listen().await;
    // An RC connection of the target's own endpoint on QPN 0x48 (the kernel's first QPN),
    // through the handles (the app does not consume its events), into TimeWait.
    let mut l = p
        .ini
        .listen(ServiceId(0x42), ListenOptions::default())
        .await
        .unwrap();
    let passive = tokio::spawn(async move {
        let inc = l.next().await.unwrap();
        inc.accept(AcceptParams::new(Qpn::new(0x500).unwrap()))
            .await
            .unwrap()
    });
    let rc = p
        .server
        .cm()
        .connect(ConnectParams::new(
            p.i_addr,
            ServiceId(0x42),
            Qpn::new(0x48).unwrap(),
        ))
        .await
        .unwrap();
    passive.await.unwrap();
    rc.disconnect(&[]).await;

    let start = tokio::time::Instant::now();
    let c = p.connect(0x99, XrcReqData::create(None), false).await;
    let mut out = None;
    for _ in 0..100 {
        tokio::time::sleep(Duration::from_millis(1)).await;
        out = p.ini(move |x| x.outcome(c).cloned()).await;
        if out.is_some() {
            break;
        }
    }
    assert!(
        start.elapsed() < Duration::from_millis(50),
        "answered, not timed out"
    );
    match out {
        Some(IniOutcome::Refused {
            reason: RejReason::NoResources,
            info: Some(info),
        }) => assert_eq!(info.kind, RejectKind::NoResources),
        other => panic!("{other:?}"),
    }
    let evs = events(&p.server).await;
    assert!(
        evs.iter()
            .all(|e| !matches!(e, TargetEvent::AcceptFailed { .. })),
        "no REP offered the quarantined number: {evs:?}"
    );
    assert!(
        evs.iter().any(|e| matches!(
            e,
            TargetEvent::Rejected { info, .. } if info.kind == RejectKind::NoResources
        )),
        "{evs:?}"
    );
    let status = p
        .server
        .with_target(|t, now| t.registry().qpn_status(Qpn::new(0x48).unwrap(), now))
        .await
        .unwrap();
    assert!(
        matches!(status, ibcm_xrc::QpnStatus::Quarantined { .. }),
        "parked: {status:?}"
    );
    assert!(p.kernel.tgt_qp_exists(Qpn::new(0x48).unwrap()));
}

/// Two XRC REQs in flight at once are both answered with their own connection IDs; the
/// first one's RTU is held back while the second one completes.
#[tokio::test(start_paused = true)]
async fn two_xrc_reqs_are_handled_concurrently() {
    let p = pair();
    p.listen().await;
    let data = XrcReqData::any(Some(OwnershipPolicy::DomainBound));
    let (a, b) = tokio::join!(p.connect(0x99, data, true), p.connect(0x9a, data, false));
    tokio::time::sleep(Duration::from_millis(5)).await;
    let accepted: Vec<_> = events(&p.server)
        .await
        .into_iter()
        .filter_map(|e| match e {
            TargetEvent::Accepted { conn, peer, .. } => Some((conn, peer.ini_qpn.get())),
            _ => None,
        })
        .collect();
    assert_eq!(accepted.len(), 2, "{accepted:?}");
    assert_ne!(accepted[0].0, accepted[1].0);
    let ids: Vec<_> = accepted.iter().map(|(c, _)| *c).collect();
    let states = p
        .server
        .with(move |t, ep, _| {
            ids.iter()
                .map(|&c| (ep.state(c), t.conn_qpn(c).is_some()))
                .collect::<Vec<_>>()
        })
        .await
        .unwrap();
    let by_ini = |q: u32| {
        accepted
            .iter()
            .position(|(_, i)| *i == q)
            .and_then(|k| states.get(k).copied())
            .unwrap()
    };
    assert_eq!(by_ini(0x99), (Some(State::RepSent), true));
    assert_eq!(by_ini(0x9a), (Some(State::Established), true));
    assert!(p.ini(move |x| x.is_established(b)).await);
    assert!(p.ini(move |x| x.rep(a).is_some()).await);
}
