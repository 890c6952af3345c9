//! `AcceptParams::xrc_tgt_live`: a live XRC TGT QP may be attached again while an earlier
//! connection on it is in TimeWait; without the flag the TimeWait quarantine refuses it.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::net::SocketAddr;
use std::time::Instant;

use ibcm::proto::{
    AcceptParams, CallError, ConnId, ConnectParams, Endpoint, EndpointConfig, EventKind,
    ListenOptions, PeerAddr, State,
};
use ibcm_mad::{CmMessage, Guid, Mad, Qpn, ServiceId};

const SID: ServiceId = ServiceId(0x7);

fn addr(s: &str) -> PeerAddr {
    s.parse::<SocketAddr>().unwrap().into()
}

/// Delivers everything queued between the two endpoints until both are quiet; returns the
/// messages in order.
fn pump(a: &mut Endpoint, b: &mut Endpoint, now: Instant) -> Vec<CmMessage> {
    let (aa, ba) = (addr("127.0.0.1:4791"), addr("127.0.0.2:4791"));
    let mut seen = Vec::new();
    loop {
        let mut moved = false;
        while let Some(t) = a.poll_transmit() {
            seen.push(Mad::parse(&t.mad).unwrap().msg);
            b.handle_datagram(now, aa, &t.mad);
            moved = true;
        }
        while let Some(t) = b.poll_transmit() {
            seen.push(Mad::parse(&t.mad).unwrap().msg);
            a.handle_datagram(now, ba, &t.mad);
            moved = true;
        }
        if !moved {
            return seen;
        }
    }
}

fn req_event(b: &mut Endpoint) -> ConnId {
    loop {
        let ev = b.poll_event().unwrap();
        if matches!(ev.kind, EventKind::ReqReceived(_)) {
            return ev.conn;
        }
    }
}

#[test]
fn live_tgt_qp_is_attached_again_during_timewait() {
    #[allow(clippy::disallowed_methods)] // a test's only clock read: the epoch
    let now = Instant::now();
    let mut a = Endpoint::new(EndpointConfig {
        rng_seed: Some(1),
        ..EndpointConfig::default()
    });
    let mut b = Endpoint::new(EndpointConfig {
        rng_seed: Some(2),
        local_ca_guid: Guid(2),
        ..EndpointConfig::default()
    });
    b.listen(SID, ListenOptions::default());
    let tgt = Qpn::new(0x48).unwrap();
    let connect = |a: &mut Endpoint, ini: u32| {
        let mut p = ConnectParams::new(addr("127.0.0.2:4791"), SID, Qpn::new(ini).unwrap()).xrc();
        p.allow_shared_qpn = true;
        a.connect(now, p).unwrap()
    };
    // First connection on TGT QP 0x48, then the initiator disconnects: TimeWait on B.
    let c1 = connect(&mut a, 0x11);
    pump(&mut a, &mut b, now);
    let t1 = req_event(&mut b);
    b.accept(now, t1, AcceptParams::xrc_tgt(tgt)).unwrap();
    pump(&mut a, &mut b, now);
    assert_eq!(a.state(c1), Some(State::Established));
    a.disconnect(now, c1, &[]).unwrap();
    pump(&mut a, &mut b, now);
    assert_eq!(b.state(t1), Some(State::Timewait));
    assert!(b.qpn_quarantined(tgt, now).is_some());

    // Second connection to the same (still live) TGT QP.
    let c2 = connect(&mut a, 0x12);
    pump(&mut a, &mut b, now);
    let t2 = req_event(&mut b);
    // Without the flag the quarantine refuses it …
    assert_eq!(
        b.accept(now, t2, AcceptParams::xrc_tgt(tgt)),
        Err(CallError::QpnInQuarantine { qpn: tgt })
    );
    // … with it, the REP carries the same TGT QPN.
    let p = AcceptParams {
        xrc_tgt_live: true,
        ..AcceptParams::xrc_tgt(tgt)
    };
    b.accept(now, t2, p).unwrap();
    let msgs = pump(&mut a, &mut b, now);
    let rep = msgs
        .iter()
        .find_map(|m| match m {
            CmMessage::Rep(r) => Some(*r),
            _ => None,
        })
        .unwrap();
    assert_eq!(rep.xrc_tgt_qpn(), tgt);
    assert_eq!(a.state(c2), Some(State::Established));
    assert_eq!(b.state(t2), Some(State::Established));
}
