//! Finding 4 of issue 12: messages about a connection count only from the connection's peer.
//! Each test gives the attacker every identifier it needs (comm IDs, QPN, CA GUID), sends
//! from another address, and checks that the connection is untouched and the drop is counted
//! as `DropReason::WrongPeer`; then the same message from the real peer still works.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

mod sec_common;

use ibcm::proto::*;
use ibcm_mad::*;
use sec_common::*;

fn attacker() -> PeerAddr {
    addr("203.0.113.66:4791")
}

fn mad(msg: CmMessage) -> Vec<u8> {
    Mad::new(Tid(0x99), msg).to_bytes().to_vec()
}

/// An established connection: (client's ID, listener's ID, listener's QPN).
fn established() -> (Pair, CommId, CommId, Qpn) {
    let mut p = Pair::new(EndpointConfig::default());
    let ca = p.connect(0x11);
    assert_eq!(p.a.state(ca), Some(State::Established));
    let cl = p.a.remote_comm_id(ca).unwrap();
    assert_eq!(p.l.state(cl), Some(State::Established));
    let l_qpn = p.a.remote_qpn(ca).unwrap();
    (p, ca, cl, l_qpn)
}

fn wrong_peer(ep: &Endpoint) -> u64 {
    ep.stats().dropped(DropReason::WrongPeer)
}

/// Finding 4: a DREQ with the right IDs and QPN from another address tore the connection
/// down (and drew a DREP to that address).
#[test]
fn dreq_from_another_address_is_dropped() {
    let (mut p, ca, cl, l_qpn) = established();
    let dreq = mad(CmMessage::Dreq(Dreq {
        local_comm_id: ca,
        remote_comm_id: cl,
        remote_qpn_eecn: l_qpn,
        private_data: PrivateData::zeroed(),
    }));
    p.l.handle_datagram(p.now, attacker(), &dreq);
    assert_eq!(p.l.state(cl), Some(State::Established));
    assert_eq!(wrong_peer(&p.l), 1);
    assert!(p.l_step().is_empty(), "answered a spoofed DREQ");
    p.l.handle_datagram(p.now, a_addr(), &dreq);
    assert_eq!(p.l.state(cl), Some(State::Timewait));
}

/// Finding 4: a REJ 28 naming both IDs from another address tore the connection down.
#[test]
fn rej_from_another_address_is_dropped() {
    let (mut p, ca, cl, _) = established();
    let mut r = Rej {
        local_comm_id: ca,
        remote_comm_id: cl,
        message_rejected: MsgKind::Other,
        reason: RejReason::ConsumerReject,
        ..Rej::default()
    };
    r.set_ari(&[]);
    p.l.handle_datagram(p.now, attacker(), &mad(CmMessage::Rej(r)));
    assert_eq!(p.l.state(cl), Some(State::Established));
    assert_eq!(wrong_peer(&p.l), 1);
}

/// Finding 4: a REJ 4 needs only the victim's comm ID and CA GUID (matched by ARI); from
/// another address it must not end the connection.
#[test]
fn rej_timeout_by_guid_from_another_address_is_dropped() {
    let (mut p, ca, cl, _) = established();
    let mut r = Rej {
        local_comm_id: ca,
        remote_comm_id: CommId(0),
        message_rejected: MsgKind::Other,
        reason: RejReason::Timeout,
        ..Rej::default()
    };
    r.set_ari(&A_GUID.0.to_be_bytes());
    let r = mad(CmMessage::Rej(r));
    p.l.handle_datagram(p.now, attacker(), &r);
    assert_eq!(p.l.state(cl), Some(State::Established));
    assert_eq!(wrong_peer(&p.l), 1);
    p.l.handle_datagram(p.now, a_addr(), &r);
    assert_eq!(p.l.state(cl), Some(State::Timewait));
}

/// Finding 4: a "stale connection" REQ naming the victim's (QPN, CA GUID) – even to a
/// service nobody listens on – tore the live connection down from any address. It is now
/// refused with REJ 10 and the old connection stays.
#[test]
fn stale_req_from_another_address_does_not_tear_down() {
    let (mut p, ca, cl, _) = established();
    let mut req = Req {
        local_comm_id: CommId(0x5151),
        service_id: ServiceId(0xdead),
        local_ca_guid: A_GUID,
        local_qpn: Qpn::masked(0x11),
        ..Req::default()
    };
    req.set_transport(ReqTransport::Rc);
    p.l.handle_datagram(p.now, attacker(), &mad(CmMessage::Req(req)));
    assert_eq!(p.l.state(cl), Some(State::Established));
    assert_eq!(p.a.state(ca), Some(State::Established));
    assert_eq!(wrong_peer(&p.l), 1);
    let out = p.l_step();
    assert_eq!(out.len(), 1);
    assert!(matches!(parse(&out[0].mad), CmMessage::Rej(r) if r.reason == RejReason::StaleConn));
    assert_eq!(p.l.stats().stale, 0);
    // From the real peer the stale check still works.
    p.l.handle_datagram(p.now, a_addr(), &mad(CmMessage::Req(req)));
    assert_eq!(p.l.state(cl), Some(State::DreqSent));
}

/// Finding 4: an LAP from another address is not reported (no LAP_RCVD).
#[test]
fn lap_from_another_address_is_dropped() {
    let (mut p, ca, cl, l_qpn) = established();
    let lap = Lap {
        local_comm_id: ca,
        remote_comm_id: cl,
        remote_qpn_eecn: l_qpn,
        ..Lap::default()
    };
    p.l.handle_datagram(p.now, attacker(), &mad(CmMessage::Lap(lap)));
    assert_eq!(p.l.lap_state(cl), Some(LapState::Uninit));
    assert_eq!(wrong_peer(&p.l), 1);
}

/// Finding 4: an APR from another address does not answer our LAP.
#[test]
fn apr_from_another_address_is_dropped() {
    let (mut p, ca, cl, _) = established();
    p.a.load_alternate_path(p.now, ca, PathInfo::default(), &[])
        .unwrap();
    let _ = p.a.poll_transmit();
    let apr = Apr {
        local_comm_id: cl,
        remote_comm_id: ca,
        ap_status: AprStatus::Success,
        ..Apr::default()
    };
    p.a.handle_datagram(p.now, attacker(), &mad(CmMessage::Apr(apr)));
    assert_eq!(p.a.lap_state(ca), Some(LapState::LapSent));
    assert_eq!(wrong_peer(&p.a), 1);
}

/// Finding 4: a DREP from another address does not complete our DREQ.
#[test]
fn drep_from_another_address_is_dropped() {
    let (mut p, ca, cl, _) = established();
    p.a.disconnect(p.now, ca, &[]).unwrap();
    let _ = p.a.poll_transmit();
    let drep = Drep {
        local_comm_id: cl,
        remote_comm_id: ca,
        private_data: PrivateData::zeroed(),
    };
    p.a.handle_datagram(p.now, attacker(), &mad(CmMessage::Drep(drep)));
    assert_eq!(p.a.state(ca), Some(State::DreqSent));
    assert_eq!(wrong_peer(&p.a), 1);
    p.a.handle_datagram(p.now, l_addr(), &mad(CmMessage::Drep(drep)));
    assert_eq!(p.a.state(ca), Some(State::Timewait));
}

/// A half-open connection (REP sent to `victim`): (listener's ID, their ID).
fn rep_sent(p: &mut Pair, victim: PeerAddr) -> (CommId, CommId) {
    p.l.handle_datagram(p.now, victim, &hostile_req(0x2222, 0x77, 0x77, 20, 15));
    let out = p.l_step();
    let rep = out
        .iter()
        .find_map(|t| match parse(&t.mad) {
            CmMessage::Rep(r) => Some(r),
            _ => None,
        })
        .unwrap();
    assert_eq!(p.l.state(rep.local_comm_id), Some(State::RepSent));
    (rep.local_comm_id, CommId(0x2222))
}

/// Finding 4 (with finding 3): an RTU with the *right* IDs – as if the attacker had read
/// the REP – from another address than the REQ's does not establish the connection.
#[test]
fn rtu_from_another_address_is_dropped() {
    let mut p = Pair::new(EndpointConfig::default());
    let victim = addr("198.51.100.7:4791");
    let (ours, theirs) = rep_sent(&mut p, victim);
    p.l.handle_datagram(p.now, attacker(), &rtu(theirs.0, ours.0));
    assert_eq!(p.l.state(ours), Some(State::RepSent));
    assert_eq!(wrong_peer(&p.l), 1);
    p.l.handle_datagram(p.now, victim, &rtu(theirs.0, ours.0));
    assert_eq!(p.l.state(ours), Some(State::Established));
}

/// Finding 4: an MRA for our REP from another address does not stretch our wait.
#[test]
fn mra_from_another_address_is_dropped() {
    let mut p = Pair::new(EndpointConfig::default());
    let victim = addr("198.51.100.7:4791");
    let (ours, theirs) = rep_sent(&mut p, victim);
    let mra = Mra {
        local_comm_id: theirs,
        remote_comm_id: ours,
        message_mraed: MsgKind::Rep,
        service_timeout: TimeoutExp::masked(31),
        private_data: PrivateData::zeroed(),
    };
    p.l.handle_datagram(p.now, attacker(), &mad(CmMessage::Mra(mra)));
    assert_eq!(p.l.state(ours), Some(State::RepSent));
    assert_eq!(wrong_peer(&p.l), 1);
}
