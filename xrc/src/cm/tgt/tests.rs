//! Unit tests of the target's glue.

use ibcm::proto::ConnectionError;

use super::*;

#[test]
fn closes_map_to_registry_events() {
    let by_peer = ConnectionError::Disconnected {
        by_peer: true,
        private_data: vec![],
    };
    assert_eq!(conn_event_of(&by_peer), ConnEvent::PeerDreq);
    assert_eq!(
        conn_event_of(&ConnectionError::TimedOut),
        ConnEvent::PeerTimeout
    );
    assert_eq!(
        conn_event_of(&ConnectionError::Stale),
        ConnEvent::PeerTimeout
    );
    assert_eq!(
        conn_event_of(&ConnectionError::DisconnectTimedOut),
        ConnEvent::LocalClosed
    );
}

#[test]
fn a_service_s_policy_overrides_the_req_s() {
    use crate::cm::{XrcInitiator, XrcService, XrcTarget, XrcTargetConfig};
    use crate::verbs::model::{KernelModel, ModelConfig};
    use crate::{DomainSpec, RegistryConfig, SrqNum, TgtRegistry, Verbs, XrcReqData};
    use ibcm::proto::EndpointConfig;
    use ibcm_mad::Guid;

    let kernel = KernelModel::new(ModelConfig::mlx5());
    let mut reg = TgtRegistry::new(Box::new(kernel.spawn()), RegistryConfig::default());
    let dom = reg.open_domain("job", DomainSpec::Private).unwrap();
    let worker = kernel.spawn().process();
    let mut target = XrcTarget::new(reg, XrcTargetConfig::default());
    let mut t_ep = Endpoint::new(EndpointConfig {
        local_ca_guid: Guid(2),
        ..EndpointConfig::default()
    });
    let mut i_ep = Endpoint::new(EndpointConfig::default());
    let sid = ServiceId(0x1000);
    let mut svc = XrcService::new(dom, worker, vec![SrqNum::new(0x10).unwrap()]);
    svc.policy = Some(OwnershipPolicy::Explicit);
    target.listen(&mut t_ep, sid, svc);
    let t_addr: ibcm::proto::PeerAddr = "127.0.0.2:4791"
        .parse::<std::net::SocketAddr>()
        .unwrap()
        .into();
    let i_addr: ibcm::proto::PeerAddr = "127.0.0.1:4791"
        .parse::<std::net::SocketAddr>()
        .unwrap()
        .into();
    let now = Instant::now();
    let mut ini = XrcInitiator::new();
    // The initiator asks for ProcessBound; the target's service says Explicit.
    let data = XrcReqData::create(Some(OwnershipPolicy::ProcessBound));
    ini.connect(
        &mut i_ep,
        now,
        t_addr,
        sid,
        Qpn::new(0x99).unwrap(),
        &data,
        &[],
    )
    .unwrap();
    while let Some(t) = i_ep.poll_transmit() {
        t_ep.handle_datagram(now, i_addr, &t.mad);
    }
    while let Some(ev) = t_ep.poll_event() {
        ibcm::App::handle_event(&mut target, &mut t_ep, now, &ev);
    }
    let accepted = std::iter::from_fn(|| target.poll_event()).find_map(|e| match e {
        TargetEvent::Accepted {
            conn, policy, qpn, ..
        } => Some((conn, policy, qpn)),
        _ => None,
    });
    let (conn, policy, qpn) = accepted.expect("the REQ was accepted");
    // The target's record of the TGT QP and the endpoint's local QPN agree.
    assert_eq!(target.conn_qpn(conn), Some(qpn));
    assert_eq!(t_ep.local_qpn(conn), Some(qpn));
    assert_eq!(policy, OwnershipPolicy::Explicit);
    assert_eq!(
        target.registry().query(qpn).unwrap().policy,
        OwnershipPolicy::Explicit
    );
    // brought up to receive: RTR
    assert_eq!(kernel.qp_state(qpn), Some(crate::QpState::Rtr));
}

#[test]
fn the_admission_hook_refuses_with_no_resources_and_creates_nothing() {
    use crate::cm::{XrcInitiator, XrcService, XrcTarget, XrcTargetConfig};
    use crate::verbs::model::{KernelModel, ModelConfig};
    use crate::{DomainSpec, RegistryConfig, SrqNum, TgtRegistry, Verbs, XrcReqData};
    use ibcm::proto::EndpointConfig;
    use ibcm_mad::xrc::RejectKind;
    use ibcm_mad::Guid;
    use std::sync::{Arc, Mutex};

    let kernel = KernelModel::new(ModelConfig::mlx5());
    let mut reg = TgtRegistry::new(Box::new(kernel.spawn()), RegistryConfig::default());
    let dom = reg.open_domain("job", DomainSpec::Private).unwrap();
    let worker = kernel.spawn().process();
    let mut target = XrcTarget::new(reg, XrcTargetConfig::default());
    // At most one TGT QP created by the worker; what the hook was asked, for the test.
    let asked = Arc::new(Mutex::new(Vec::new()));
    let log = asked.clone();
    target.set_admission(Box::new(move |q: &AdmissionQuery<'_>| {
        let held = q.registry.live_created_by(|p| p == q.service.process);
        log.lock().unwrap().push((q.creates, held));
        if q.creates && held >= 1 {
            return Err("quota: 1 TGT QP".into());
        }
        Ok(())
    }));
    let mut t_ep = Endpoint::new(EndpointConfig {
        local_ca_guid: Guid(2),
        ..EndpointConfig::default()
    });
    let mut i_ep = Endpoint::new(EndpointConfig::default());
    let sid = ServiceId(0x1000);
    target.listen(
        &mut t_ep,
        sid,
        XrcService::new(dom, worker, vec![SrqNum::new(0x10).unwrap()]),
    );
    let t_addr: ibcm::proto::PeerAddr = "127.0.0.2:4791"
        .parse::<std::net::SocketAddr>()
        .unwrap()
        .into();
    let i_addr: ibcm::proto::PeerAddr = "127.0.0.1:4791"
        .parse::<std::net::SocketAddr>()
        .unwrap()
        .into();
    let now = Instant::now();
    let mut ini = XrcInitiator::new();
    let mut answers = Vec::new();
    // Two INI QPs, each asking for a QP of its own; then the first INI QP again (attach).
    for (n, data) in [
        (0x99, XrcReqData::any(None)),
        (0x9a, XrcReqData::any(None)),
        (0x99, XrcReqData::any(None)),
    ] {
        ini.connect(
            &mut i_ep,
            now,
            t_addr,
            sid,
            Qpn::new(n).unwrap(),
            &data,
            &[],
        )
        .unwrap();
        while let Some(t) = i_ep.poll_transmit() {
            t_ep.handle_datagram(now, i_addr, &t.mad);
        }
        while let Some(ev) = t_ep.poll_event() {
            ibcm::App::handle_event(&mut target, &mut t_ep, now, &ev);
        }
        answers.extend(
            std::iter::from_fn(|| target.poll_event()).filter_map(|e| match e {
                TargetEvent::Accepted { created, .. } => Some(Ok(created)),
                TargetEvent::Rejected { info, .. } => Some(Err(info.kind)),
                _ => None,
            }),
        );
    }
    assert_eq!(
        answers,
        vec![Ok(true), Err(RejectKind::NoResources), Ok(false)]
    );
    assert_eq!(
        *asked.lock().unwrap(),
        vec![(true, 0), (true, 1), (false, 1)]
    );
    assert_eq!(target.registry().live_created_by(|p| p == worker), 1);
}
