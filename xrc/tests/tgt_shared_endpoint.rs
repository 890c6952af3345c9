//! An XRC target shares its CM endpoint with other connections (ibcmd: the RC connections its
//! clients make through it). Their TimeWaits quarantine QPNs in the endpoint that the
//! registry never hears of; a new TGT QP the device numbers like one of them must not be
//! offered in a REP (the endpoint would refuse the accept, and the REQ would get REJ 3 "no
//! resources"). The deterministic reproduction of `cm-bench node-kill` failing in a later
//! round's XRC phase.
#![cfg(feature = "cm")]
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::time::Duration;

use ibcm::proto::{ConnectParams, EndpointConfig, ListenOptions};
use ibcm::sim::{auto_accept, SimNet};
use ibcm_mad::{Guid, Qpn, ServiceId};
use ibcm_xrc::cm::sim::{SimInitiator, SimTarget};
use ibcm_xrc::cm::{TargetEvent, XrcService, XrcTarget, XrcTargetConfig};
use ibcm_xrc::verbs::model::{KernelModel, ModelConfig};
use ibcm_xrc::{DomainSpec, QpnStatus, RegistryConfig, SrqNum, TgtRegistry, Verbs, XrcReqData};

const XRC_SID: ServiceId = ServiceId(0x2000_0000);
const RC_SID: ServiceId = ServiceId(0x1000_0000);

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// An RC connection on the target's endpoint ends and its local QPN — the number the device
/// hands out next for a TGT QP — is in the endpoint's TimeWait quarantine. The next XRC REQ
/// must still be accepted, on another TGT QP; the quarantined number is kept out of use
/// (parked) until the endpoint's quarantine ends, then released.
#[test]
fn a_new_tgt_qp_skips_a_number_another_connection_of_the_endpoint_quarantines() {
    let model = ModelConfig::mlx5();
    // The number the device gives the first TGT QP.
    let next_tgt_qpn = Qpn::new(model.first_qpn).unwrap();
    let kernel = KernelModel::new(model);
    let mut reg = TgtRegistry::new(Box::new(kernel.spawn()), RegistryConfig::default());
    let dom = reg.open_domain("job", DomainSpec::Private).unwrap();
    let worker = kernel.spawn().process();

    let mut net = SimNet::new(7);
    let t = net.add_node(EndpointConfig {
        local_ca_guid: Guid(2),
        ..EndpointConfig::default()
    });
    let i = net.add_node(EndpointConfig::default());
    // REQs the target does not serve (RC) are accepted on QPNs counting up from the number
    // the device will give the first TGT QP (in ibcmd: a client's own QPN).
    let target = SimTarget::install_with(
        &mut net,
        t,
        XrcTarget::new(reg, XrcTargetConfig::default()),
        auto_accept(next_tgt_qpn.get()),
    );
    target.with(&mut net, |x, ep, _| {
        x.listen(
            ep,
            XRC_SID,
            XrcService::new(dom, worker, vec![SrqNum::new(0x10).unwrap()]),
        );
        ep.listen(RC_SID, ListenOptions::default());
    });
    let ini = SimInitiator::install(&mut net, i);
    let t_addr = net.addr(t);

    // The RC connection: up, then ended by the peer; the target's side enters TimeWait.
    let rc = ini.with_ep(&mut net, |_, ep, now| {
        ep.connect(
            now,
            ConnectParams::new(t_addr, RC_SID, Qpn::new(0x500).unwrap()),
        )
        .unwrap()
    });
    net.run_until_time(net.now() + ms(10));
    ini.with_ep(&mut net, |_, ep, now| ep.disconnect(now, rc, &[]).unwrap());
    net.run_until_time(net.now() + ms(10));
    let cm_until = net
        .endpoint_ref(t)
        .qpn_quarantined(next_tgt_qpn, net.now())
        .expect("the RC connection's QPN is in the target endpoint's TimeWait quarantine");
    assert_eq!(
        target
            .target()
            .registry()
            .qpn_status(next_tgt_qpn, net.now()),
        QpnStatus::Unknown,
        "the registry never heard of that number"
    );

    // The XRC REQ: a new TGT QP is created for it.
    let data = XrcReqData::any(None);
    let c = ini
        .connect(&mut net, t_addr, XRC_SID, Qpn::new(0x99).unwrap(), &data)
        .unwrap();
    net.run_until_time(net.now() + ms(10));
    let events: Vec<TargetEvent> =
        std::iter::from_fn(|| target.target_mut().poll_event()).collect();
    let failed: Vec<&TargetEvent> = events
        .iter()
        .filter(|e| {
            matches!(
                e,
                TargetEvent::AcceptFailed { .. } | TargetEvent::Rejected { .. }
            )
        })
        .collect();
    assert!(failed.is_empty(), "the REQ was refused: {failed:?}");
    let outcome = ini.with(|x| x.outcome(c).cloned());
    assert!(outcome.is_none(), "the connection ended: {outcome:?}");
    let tgt_qpn = ini
        .with(|x| x.rep(c).map(|r| r.tgt_qpn))
        .expect("the REQ was accepted");
    assert_ne!(tgt_qpn, next_tgt_qpn, "not the quarantined number");
    assert!(kernel.tgt_qp_exists(tgt_qpn));

    // The quarantined number stays taken (its QP parked) as long as the endpoint's quarantine.
    let now = net.now();
    match target.target().registry().qpn_status(next_tgt_qpn, now) {
        QpnStatus::Quarantined { until, .. } => {
            assert!(
                until >= cm_until,
                "parked until the endpoint's quarantine ends"
            );
        }
        other => panic!("the quarantined number is not parked: {other:?}"),
    }
    assert!(
        kernel.tgt_qp_exists(next_tgt_qpn),
        "the parked QP holds the number"
    );

    // After the quarantine the parked QP is destroyed; the connection is untouched.
    net.run_until_time(cm_until + ms(10));
    assert!(
        !kernel.tgt_qp_exists(next_tgt_qpn),
        "the parked QP is destroyed"
    );
    assert_eq!(
        target
            .target()
            .registry()
            .qpn_status(next_tgt_qpn, net.now()),
        QpnStatus::Unknown
    );
    assert!(ini.with(|x| x.is_established(c)));
}
