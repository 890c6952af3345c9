//! [`XrcServer`]: the XRC target on ibcm's tokio runtime (in-memory network, paused clock).
#![cfg(feature = "cm")]
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::time::Duration;

use ibcm::proto::{EndpointConfig, PeerAddr};
use ibcm::rt::{Cm, CmError, Connection, MemNetwork};
use ibcm_mad::{Guid, Qpn, ServiceId};
use ibcm_xrc::cm::rt::XrcServer;
use ibcm_xrc::cm::{
    xrc_connect_params, GoneSignal, IniOutcome, TargetEvent, XrcService, XrcTarget, XrcTargetConfig,
};
use ibcm_xrc::verbs::model::{KernelModel, ModelConfig};
use ibcm_xrc::{
    ConnEvent, DomainSpec, GoneCause, OwnershipPolicy, RegistryConfig, SrqNum, TgtRegistry, Verbs,
    Verdict, XrcReqData,
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

fn events(server: &XrcServer) -> Vec<TargetEvent> {
    std::iter::from_fn(|| server.poll_event()).collect()
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
    let (t_cm, _) = Cm::bind(net.transport(t_addr), t_cfg.clone());
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
    let server = XrcServer::new(
        t_cm,
        &t_cfg,
        XrcTarget::new(reg, XrcTargetConfig::default()),
    )
    .unwrap();
    server
        .spawn_listener(
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
    assert_ne!(
        accepted[0].0,
        ibcm_mad::CommId(0),
        "re-keyed to the real ID"
    );
    assert_eq!(
        server.with_target(|t, _| t.conn_qpn(accepted[1].0)),
        Some(qpn)
    );

    // The initiator disconnects c1: kept. A new connection attaches while the target still
    // has c1 in TimeWait.
    c1.disconnect(&[]).await;
    tokio::time::sleep(Duration::from_millis(150)).await;
    let closed: Vec<_> = events(&server)
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
    server.with_target(|t, now| t.registry_mut().process_exit(now, worker));
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
    // The server's timer ends the quarantine after the TimeWait.
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
    let st = server.with_target(|t, _| t.stats());
    assert_eq!(
        (st.created, st.attached, st.dreqs, st.rejected),
        (1, 2, 2, 2)
    );
}
