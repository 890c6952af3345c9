//! Finding 5 of issue 12: established connections are limited per endpoint and per peer,
//! and a REQ beyond a limit is refused with REJ 3 "no resources".
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

/// Establishes one connection from `from` (REQ, the listener accepts, RTU); returns the
/// listener's answer to the REQ.
fn establish_from(p: &mut Pair, from: PeerAddr, n: u32) -> CmMessage {
    p.l.handle_datagram(
        p.now,
        from,
        &hostile_req(0x100 + n, 0xbee + u64::from(n), 0x10 + n, 20, 15),
    );
    let out = p.l_step();
    let answer = parse(&out[0].mad);
    if let CmMessage::Rep(r) = answer {
        p.l.handle_datagram(p.now, from, &rtu(0x100 + n, r.local_comm_id.0));
    }
    answer
}

fn is_rej3(m: &CmMessage) -> bool {
    matches!(m, CmMessage::Rej(r) if r.reason == RejReason::NoResources)
}

/// Finding 5: one peer could hold any number of established connections. With
/// `max_established_per_peer` = 3 its fourth REQ gets REJ 3, another peer still connects,
/// and a slot frees when a connection closes.
#[test]
fn per_peer_limit() {
    let mut p = Pair::new(EndpointConfig {
        max_established_per_peer: 3,
        ..Default::default()
    });
    let one = addr("192.0.2.1:4791");
    for n in 0..3 {
        assert!(matches!(establish_from(&mut p, one, n), CmMessage::Rep(_)));
    }
    assert_eq!(p.l.established(), 3);
    // Another port of the same host is the same peer.
    assert!(is_rej3(&establish_from(&mut p, addr("192.0.2.1:5000"), 3)));
    assert_eq!(p.l.stats().established_limit, 1);
    assert!(matches!(
        establish_from(&mut p, addr("192.0.2.2:4791"), 4),
        CmMessage::Rep(_)
    ));
    assert_eq!(p.l.established(), 4);
    // The client of the pair is another peer too, and connects through the public API.
    p.connect(0x99);
    assert_eq!(p.a_established, 1);
}

/// Finding 5: with `max_established` = 4 the endpoint as a whole refuses the fifth.
#[test]
fn endpoint_limit() {
    let mut p = Pair::new(EndpointConfig {
        max_established: 4,
        ..Default::default()
    });
    for n in 0..4 {
        let from = addr(&format!("192.0.2.{}:4791", n + 1));
        assert!(matches!(establish_from(&mut p, from, n), CmMessage::Rep(_)));
    }
    assert_eq!(p.l.established(), 4);
    assert!(is_rej3(&establish_from(&mut p, addr("192.0.2.9:4791"), 9)));
    let c = p.l.conn_ids()[0];
    p.l.disconnect(p.now, c, &[]).unwrap();
    assert_eq!(p.l.established(), 4, "DREQ_SENT still counts");
    let _ = p.l_step();
    let remote = p.l.remote_comm_id(c).unwrap();
    let drep = Drep {
        local_comm_id: remote,
        remote_comm_id: c,
        private_data: PrivateData::zeroed(),
    };
    let from = p.l.peer(c).unwrap();
    p.l.handle_datagram(
        p.now,
        from,
        &Mad::new(Tid(1), CmMessage::Drep(drep)).to_bytes(),
    );
    assert_eq!(p.l.state(c), Some(State::Timewait));
    assert_eq!(p.l.established(), 3);
    assert!(matches!(
        establish_from(&mut p, addr("192.0.2.10:4791"), 10),
        CmMessage::Rep(_)
    ));
}
