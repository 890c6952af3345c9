//! Finding 2 of issue 12: the listener cannot be used as a reflector. Until a peer has proved
//! that it receives (an RTU, or any message echoing our comm ID from its address), the bytes
//! sent towards it stay at most 3 × what it sent.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

mod sec_common;

use std::time::Duration;

use ibcm::proto::*;
use ibcm_mad::*;
use sec_common::*;

/// Finding 2: a spoofed REQ (Local CM Response Timeout 0, 15 retries) made the listener send
/// 16 REPs and a REJ to the spoofed source within milliseconds: 17 × the attacker's bytes.
/// Now at most 3 × (the REP, one retransmission and the REJ; the other retransmissions are
/// withheld).
#[test]
fn spoofed_req_yields_at_most_three_times_its_bytes() {
    let mut p = Pair::new(EndpointConfig::default());
    let victim = addr("198.51.100.7:4791");
    let req = hostile_req(0x2222, 0x77, 0x77, 0, 15);
    p.l.handle_datagram(p.now, victim, &req);
    p.pump();
    p.advance(Duration::from_secs(3600));
    let sent: usize = p
        .sent_elsewhere
        .iter()
        .filter(|(a, _)| *a == victim)
        .map(|(_, n)| n)
        .sum();
    assert!(sent > 0);
    assert!(
        sent <= 3 * req.len(),
        "{sent} bytes reflected for a {}-byte REQ",
        req.len()
    );
    assert!(p.l.stats().amplification_limited > 0);
    assert_eq!(p.l.len(), 0, "the entry is gone after its schedule");
}

/// Finding 2: duplicates of a REQ sent from another address than the REQ's made the
/// listener send an MRA to the REQ's (spoofed) source for each.
#[test]
fn duplicates_from_elsewhere_do_not_feed_the_reflector() {
    let mut p = Pair::new(EndpointConfig::default());
    let victim = addr("198.51.100.7:4791");
    let me = addr("203.0.113.66:4791");
    let req = hostile_req(0x2222, 0x77, 0x77, 20, 15);
    p.l.handle_datagram(p.now, victim, &req);
    // The application has not answered yet (REQ_RCVD): each duplicate draws an MRA.
    let mut to_victim = 0;
    for _ in 0..100 {
        p.l.handle_datagram(p.now, me, &req);
        while let Some(t) = p.l.poll_transmit() {
            assert_eq!(t.to, victim);
            to_victim += t.mad.len();
        }
    }
    assert!(
        to_victim <= 3 * req.len(),
        "{to_victim} bytes to the victim"
    );
}

/// The limit does not hurt a real peer: REPs lost on the way are made up for once the
/// client repeats its REQ (which widens the budget), and the connection is established.
#[test]
fn lost_reps_to_a_real_client_still_connect() {
    let mut p = Pair::new(EndpointConfig::default());
    let mut cp = ConnectParams::new(l_addr(), SID, Qpn::masked(0x11));
    cp.remote_cm_response_timeout = TimeoutExp::masked(14);
    cp.local_cm_response_timeout = TimeoutExp::masked(14);
    cp.packet_life_time = TimeoutExp::masked(10);
    let ca = p.a.connect(p.now, cp).unwrap();
    let mut reps_dropped = 0;
    for _ in 0..10_000 {
        // Deliver everything except the first five REPs.
        while let Some(ev) = p.l.poll_event() {
            if let EventKind::ReqReceived(_) = ev.kind {
                p.l.accept(p.now, ev.conn, AcceptParams::new(Qpn::masked(0x22)))
                    .unwrap();
            }
        }
        while let Some(t) = p.l.poll_transmit() {
            if matches!(parse(&t.mad), CmMessage::Rep(_)) && reps_dropped < 5 {
                reps_dropped += 1;
                continue;
            }
            p.a.handle_datagram(p.now, l_addr(), &t.mad);
        }
        while let Some(t) = p.a.poll_transmit() {
            p.l.handle_datagram(p.now, a_addr(), &t.mad);
        }
        if p.a.state(ca) == Some(State::Established) {
            break;
        }
        let next = [p.l.poll_timeout(), p.a.poll_timeout()]
            .into_iter()
            .flatten()
            .min()
            .unwrap();
        p.now = next;
        p.l.handle_timeout(p.now);
        p.a.handle_timeout(p.now);
    }
    assert_eq!(reps_dropped, 5);
    assert_eq!(p.a.state(ca), Some(State::Established));
    let cl = p.a.remote_comm_id(ca).unwrap();
    while let Some(t) = p.a.poll_transmit() {
        p.l.handle_datagram(p.now, a_addr(), &t.mad);
    }
    assert_eq!(p.l.state(cl), Some(State::Established));
}

/// The application's MRAs count too: to a peer that has not proved it receives, an MRA goes
/// only while room remains for the REP and the REJ that may end the attempt; one more is
/// refused (`CallError::AmplificationLimited`), and the total stays within 3 × the REQ.
#[test]
fn application_mras_stay_within_the_budget() {
    let mut p = Pair::new(EndpointConfig::default());
    let victim = addr("198.51.100.7:4791");
    let req = hostile_req(0x2222, 0x77, 0x77, 0, 15);
    p.l.handle_datagram(p.now, victim, &req);
    let mut conn = None;
    while let Some(ev) = p.l.poll_event() {
        if let EventKind::ReqReceived(_) = ev.kind {
            conn = Some(ev.conn);
        }
    }
    let conn = conn.unwrap();
    let t = TimeoutExp::masked(20);
    p.l.mra(p.now, conn, t, &[]).unwrap();
    assert_eq!(
        p.l.mra(p.now, conn, t, &[]),
        Err(CallError::AmplificationLimited(conn))
    );
    p.l.accept(p.now, conn, AcceptParams::new(Qpn::masked(0x22)))
        .unwrap();
    p.advance(Duration::from_secs(3600));
    let mut sent = 0;
    while let Some(t) = p.l.poll_transmit() {
        assert_eq!(t.to, victim);
        sent += t.mad.len();
    }
    sent += p
        .sent_elsewhere
        .iter()
        .filter(|(a, _)| *a == victim)
        .map(|(_, n)| n)
        .sum::<usize>();
    assert!(
        sent <= 3 * req.len(),
        "{sent} bytes for a {}-byte REQ",
        req.len()
    );
    assert!(p.l.stats().amplification_limited > 0);
}
