//! The stateless mode under pressure (issue 12, docs/protocol.md §5.12): a listener with a
//! `StatelessAccept` template answers REQs with a cookie REP and keeps no connection; the RTU
//! recreates it. Forged, expired and replayed cookies are dropped and counted by reason; a REQ
//! repeated after a lost REP gets the same REP; a stateful entry for the same REQ gives way.
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

const BASE: u32 = 0x40_0000;
const COUNT: u32 = 0x10_0000;

fn template() -> StatelessAccept {
    let mut rep = AcceptParams::new(Qpn::masked(0));
    rep.private_data = b"stateless".to_vec();
    StatelessAccept::new(rep, Qpn::masked(BASE), COUNT)
}

fn cfg(always: bool) -> EndpointConfig {
    EndpointConfig {
        stateless_always: always,
        ..Default::default()
    }
}

/// A pair whose listener has the stateless template.
fn pair(c: EndpointConfig) -> Pair {
    let mut p = Pair::new(c);
    p.l.set_stateless(SID, Some(template())).unwrap();
    p
}

fn drain(ep: &mut Endpoint) -> Vec<Transmit> {
    std::iter::from_fn(|| ep.poll_transmit()).collect()
}

fn events(ep: &mut Endpoint) -> Vec<Event> {
    std::iter::from_fn(|| ep.poll_event()).collect()
}

/// The client takes `m`, a MAD of the listener; returns what it sent in answer.
fn client_takes(p: &mut Pair, m: &Transmit) -> Vec<Transmit> {
    p.a.handle_datagram(p.now, l_addr(), &m.mad);
    drain(&mut p.a)
}

/// A pair whose listener's template has one QPN, `BASE`: the first connection to complete
/// takes it.
fn pair_with_one_qpn() -> Pair {
    let mut p = Pair::new(cfg(true));
    p.l.set_stateless(
        SID,
        Some(StatelessAccept::new(
            AcceptParams::new(Qpn::masked(0)),
            Qpn::masked(BASE),
            1,
        )),
    )
    .unwrap();
    p
}

fn rep_of(t: &Transmit) -> Rep {
    match parse(&t.mad) {
        CmMessage::Rep(r) => r,
        m => panic!("not a REP: {m}"),
    }
}

/// The client's REQ (QPN 0x11, start PSN 0x123, private data) reaches the listener; returns
/// the client's connection and what the listener sent.
fn send_req(p: &mut Pair) -> (ConnId, Vec<Transmit>) {
    let mut cp = ConnectParams::new(l_addr(), SID, Qpn::masked(0x11));
    cp.starting_psn = Some(Psn::masked(0x123));
    cp.private_data = b"hello".to_vec();
    let ca = p.a.connect(p.now, cp).unwrap();
    let req = drain(&mut p.a);
    assert_eq!(req.len(), 1);
    p.l.handle_datagram(p.now, a_addr(), &req[0].mad);
    (ca, drain(&mut p.l))
}

#[test]
fn cookie_rep_then_rtu_establishes_with_the_req_fields() {
    let mut p = pair(cfg(true));
    let (ca, out) = send_req(&mut p);
    // A REP at once, and no connection kept: no connection, no half-open entry, no event;
    // the one deadline is the REP's retransmission.
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].to, a_addr());
    let rep = rep_of(&out[0]);
    assert_eq!(p.l.len(), 0);
    assert_eq!(p.l.half_open(), 0);
    assert_eq!(
        p.l.poll_timeout(),
        Some(p.now + EndpointConfig::default().stateless_resend.unwrap())
    );
    assert!(events(&mut p.l).is_empty());
    assert_eq!(p.l.stats().stateless_replies, 1);
    let qpn = rep.local_qpn.get();
    assert!((BASE..BASE + COUNT).contains(&qpn), "{qpn:#x}");
    assert_eq!(rep.remote_comm_id, ca);
    assert_eq!(rep.local_ca_guid, L_GUID);
    assert_eq!(&rep.private_data.as_bytes()[..9], b"stateless");

    // The client takes the REP and sends its RTU; the listener recreates the connection.
    let rtu = client_takes(&mut p, &out[0]);
    assert_eq!(p.a.state(ca), Some(State::Established));
    p.l.handle_datagram(p.now, a_addr(), &rtu[0].mad);
    let cookie = rep.local_comm_id;
    assert_eq!(p.l.state(cookie), Some(State::Established));
    assert_eq!(p.l.side(cookie), Some(Side::Passive));
    assert_eq!(p.l.remote_qpn(cookie), Some(Qpn::masked(0x11)));
    assert_eq!(p.l.remote_comm_id(cookie), Some(ca));
    assert_eq!(p.l.peer(cookie), Some(a_addr()));
    assert_eq!(p.l.established(), 1);
    assert_eq!(p.l.stats().stateless_established, 1);
    assert_eq!(p.l.stats().established, 1);
    let ev = events(&mut p.l);
    assert_eq!(ev.len(), 1, "{ev:?}");
    let EventKind::StatelessEstablished(info) = &ev[0].kind else {
        panic!("{ev:?}");
    };
    assert_eq!(ev[0].conn, cookie);
    assert_eq!(info.req.peer, a_addr());
    assert_eq!(info.req.remote_qpn(), Qpn::masked(0x11));
    assert_eq!(info.req.remote_starting_psn(), Psn::masked(0x123));
    assert_eq!(info.req.remote_ca_guid(), A_GUID);
    assert_eq!(&info.req.user_private_data()[..5], b"hello");
    assert_eq!(info.rep, rep);
    assert_eq!(info.local_qpn(), rep.local_qpn);

    // The connection works like any other: the listener's DREQ names the client's QPN.
    p.l.disconnect(p.now, cookie, &[]).unwrap();
    let dreq = drain(&mut p.l);
    let CmMessage::Dreq(d) = parse(&dreq[0].mad) else {
        panic!()
    };
    assert_eq!(d.remote_qpn_eecn, Qpn::masked(0x11));
    let drep = client_takes(&mut p, &dreq[0]);
    assert_eq!(p.a.state(ca), Some(State::Timewait));
    p.l.handle_datagram(p.now, a_addr(), &drep[0].mad);
    assert_eq!(p.l.state(cookie), Some(State::Timewait));
}

#[test]
fn cookies_are_deterministic_under_a_seed_and_keyed() {
    let rep_with = |seed: u64| {
        let mut p = pair(EndpointConfig {
            rng_seed: Some(seed),
            ..cfg(true)
        });
        let (_, out) = send_req(&mut p);
        rep_of(&out[0])
    };
    let (a, b, c) = (rep_with(5), rep_with(5), rep_with(6));
    assert_eq!(a, b);
    assert_ne!(a.local_comm_id, c.local_comm_id);
    assert_ne!(a.starting_psn, c.starting_psn);
}

#[test]
fn forged_cookie_rtus_are_dropped_as_bad_cookie() {
    let mut p = pair(cfg(true));
    // A spoofed REQ in the name of the client: the REP goes to the client, not the attacker.
    p.l.handle_datagram(p.now, a_addr(), &hostile_req(0x5151, 0xbad, 0x77, 20, 15));
    let rep = rep_of(&drain(&mut p.l)[0]);
    // 1000 guesses of the cookie, from the spoofed source: none is the cookie.
    let mut guesses = 0;
    for g in 1..=1000u32 {
        let guess = rep
            .local_comm_id
            .0
            .wrapping_add(g.wrapping_mul(0x9e37_79b9));
        if guess == rep.local_comm_id.0 || guess == 0 {
            continue;
        }
        guesses += 1;
        p.l.handle_datagram(p.now, a_addr(), &rtu(0x5151, guess));
    }
    assert_eq!(p.l.stats().dropped(DropReason::BadCookie), guesses);
    assert_eq!(p.l.len(), 0);
    // The right cookie from another address finds no REQ of that source.
    let unknown = p.l.stats().dropped(DropReason::UnknownCommId);
    p.l.handle_datagram(
        p.now,
        addr("203.0.113.9:4791"),
        &rtu(0x5151, rep.local_comm_id.0),
    );
    assert_eq!(p.l.stats().dropped(DropReason::UnknownCommId), unknown + 1);
    assert_eq!(p.l.len(), 0);
    assert!(drain(&mut p.l).is_empty(), "answered a forged RTU");
}

#[test]
fn expired_cookie_rtu_is_dropped() {
    let mut p = pair(cfg(true));
    let (_, out) = send_req(&mut p);
    let rtu = client_takes(&mut p, &out[0]);
    // Valid in its slot and the next (8–16 s); two periods later it is expired.
    p.now += Duration::from_secs(16);
    p.l.handle_datagram(p.now, a_addr(), &rtu[0].mad);
    assert_eq!(p.l.stats().dropped(DropReason::ExpiredCookie), 1);
    assert_eq!(p.l.len(), 0);
}

#[test]
fn late_but_valid_cookie_rtu_is_taken() {
    let mut p = pair(cfg(true));
    let (_, out) = send_req(&mut p);
    let rtu = client_takes(&mut p, &out[0]);
    p.now += Duration::from_millis(15_900);
    p.l.handle_datagram(p.now, a_addr(), &rtu[0].mad);
    assert_eq!(p.l.stats().stateless_established, 1);
}

#[test]
fn replayed_cookie_rtu_is_dropped() {
    let mut p = pair(cfg(true));
    let (ca, out) = send_req(&mut p);
    let cookie = rep_of(&out[0]).local_comm_id;
    let rtu = client_takes(&mut p, &out[0]);
    p.l.handle_datagram(p.now, a_addr(), &rtu[0].mad);
    assert_eq!(p.l.state(cookie), Some(State::Established));
    // While the connection lives, a replay is a duplicate RTU.
    p.l.handle_datagram(p.now, a_addr(), &rtu[0].mad);
    assert_eq!(p.l.stats().dropped(DropReason::Duplicate), 1);
    // Once it has left the table, a replay does not bring it back.
    p.a.disconnect(p.now, ca, &[]).unwrap();
    p.pump();
    p.advance(Duration::from_secs(5));
    assert_eq!(p.l.state(cookie), None);
    p.l.handle_datagram(p.now, a_addr(), &rtu[0].mad);
    assert_eq!(p.l.stats().dropped(DropReason::ReplayedCookie), 1);
    assert_eq!(p.l.len(), 0);
    assert_eq!(p.l.stats().stateless_established, 1);
}

/// The kernel's way: its REQ is retransmitted when the REP is lost; the cookie mode answers
/// the repeat with the same REP (byte for byte, also across a time-slot boundary), keeps one
/// table entry, and the RTU to that REP establishes.
#[test]
fn repeated_req_after_a_lost_rep_gets_the_same_rep() {
    let mut p = pair(cfg(true));
    // Start the time slots with another REQ, then send the client's REQ just before the
    // boundary (slot 0 ends at 8 s), so that the retransmission comes in slot 1.
    p.l.handle_datagram(p.now, addr("10.0.0.9:4791"), &hostile_req(9, 9, 9, 20, 15));
    drain(&mut p.l);
    p.now += Duration::from_millis(7_900);
    let (ca, first) = send_req(&mut p);
    // The REP is lost; the client's REQ timer fires (2 × 1.07 s + 4.3 s) and it repeats.
    let t = p.a.poll_timeout().unwrap();
    p.now = t;
    p.a.handle_timeout(p.now);
    let again = drain(&mut p.a);
    assert!(matches!(parse(&again[0].mad), CmMessage::Req(_)));
    p.l.handle_datagram(p.now, a_addr(), &again[0].mad);
    let second = drain(&mut p.l);
    assert_eq!(second.len(), 1);
    assert_eq!(second[0].mad, first[0].mad, "the repeat got another REP");
    assert_eq!(p.l.stats().stateless_replies, 3);
    assert_eq!(p.l.stats().stateless_overwritten, 0);
    let rtu = client_takes(&mut p, &second[0]);
    p.l.handle_datagram(p.now, a_addr(), &rtu[0].mad);
    assert_eq!(p.a.state(ca), Some(State::Established));
    assert_eq!(
        p.l.state(rep_of(&second[0]).local_comm_id),
        Some(State::Established)
    );
}

/// A spoofed REQ costs its REP and one retransmission, nothing else: no REJ, no MRA, no
/// timer left (2×, whatever the REQ's timeouts and retries ask for).
#[test]
fn stateless_answers_amplify_at_most_twice() {
    let mut p = pair(cfg(true));
    let victim = addr("192.0.2.7:4791");
    for i in 0..100u32 {
        p.l.handle_datagram(
            p.now,
            victim,
            &hostile_req(0x100 + i, 0xbad, 0x200 + i, 0, 15),
        );
    }
    let first = drain(&mut p.l);
    assert_eq!(first.len(), 100);
    p.now += Duration::from_secs(1);
    p.l.handle_timeout(p.now);
    let again = drain(&mut p.l);
    assert_eq!(again.len(), 100);
    assert!(again.iter().zip(&first).all(|(a, b)| a == b));
    p.now += Duration::from_secs(120);
    p.l.handle_timeout(p.now);
    assert!(drain(&mut p.l).is_empty());
    assert!(p.l.is_empty());
    assert_eq!(p.l.stats().stateless_replies, 200);
}

/// A lost RTU: the client is ESTABLISHED, the listener has nothing. The REP's one
/// retransmission makes the client send its RTU again (a duplicate REP in ESTABLISHED), which
/// establishes the listener's side. Once the RTU is in, nothing is retransmitted.
#[test]
fn lost_rtu_is_recovered_by_the_rep_retransmission() {
    let mut p = pair(cfg(true));
    let (ca, out) = send_req(&mut p);
    let lost = client_takes(&mut p, &out[0]);
    assert_eq!(p.a.state(ca), Some(State::Established));
    assert!(matches!(parse(&lost[0].mad), CmMessage::Rtu(_)));
    let due = p.l.poll_timeout().unwrap();
    p.now = due;
    p.l.handle_timeout(p.now);
    let again = drain(&mut p.l);
    assert_eq!(again.len(), 1);
    assert_eq!(again[0].mad, out[0].mad);
    let rtu = client_takes(&mut p, &again[0]);
    assert!(matches!(parse(&rtu[0].mad), CmMessage::Rtu(_)));
    p.l.handle_datagram(p.now, a_addr(), &rtu[0].mad);
    let cookie = rep_of(&out[0]).local_comm_id;
    assert_eq!(p.l.state(cookie), Some(State::Established));
    // Taken: the retransmission was the only one.
    p.now += Duration::from_secs(10);
    p.l.handle_timeout(p.now);
    assert!(drain(&mut p.l).is_empty());
}

/// Below the threshold REQs take the stateful path (the application decides); at it they are
/// answered statelessly; an XRC REQ never is.
#[test]
fn threshold_switches_to_stateless() {
    let mut p = pair(EndpointConfig {
        stateless_threshold: 2,
        ..Default::default()
    });
    for i in 0..2u32 {
        p.l.handle_datagram(
            p.now,
            a_addr(),
            &hostile_req(0x10 + i, 0xa, 0x20 + i, 20, 15),
        );
    }
    assert_eq!(p.l.half_open(), 2);
    assert_eq!(events(&mut p.l).len(), 2);
    drain(&mut p.l);
    p.l.handle_datagram(p.now, a_addr(), &hostile_req(0x30, 0xa, 0x40, 20, 15));
    assert_eq!(p.l.half_open(), 2);
    assert!(events(&mut p.l).is_empty());
    assert!(matches!(parse(&drain(&mut p.l)[0].mad), CmMessage::Rep(_)));
    assert_eq!(p.l.stats().stateless_replies, 1);
    // XRC: stateful whatever the pressure.
    let mut xrc = Mad::parse(&hostile_req(0x50, 0xa, 0x60, 20, 15)).unwrap();
    if let CmMessage::Req(r) = &mut xrc.msg {
        r.set_transport(ReqTransport::Xrc);
    }
    p.l.handle_datagram(p.now, a_addr(), &xrc.to_bytes());
    assert_eq!(p.l.half_open(), 3);
    assert_eq!(p.l.stats().stateless_replies, 1);
    // Without a template: stateful too.
    p.l.set_stateless(SID, None).unwrap();
    p.l.handle_datagram(p.now, a_addr(), &hostile_req(0x70, 0xa, 0x80, 20, 15));
    assert_eq!(p.l.half_open(), 4);
}

/// A valid cookie RTU while a stateful entry exists for the same REQ (its repeat came from
/// another port when the pressure was gone): the peer took the cookie REP, so the cookie
/// connection is made and the stateful entry is closed as stale.
#[test]
fn cookie_rtu_supersedes_a_stateful_entry_for_the_same_req() {
    let mut p = pair(EndpointConfig {
        stateless_threshold: 1,
        ..Default::default()
    });
    // Pressure: one half-open entry from elsewhere.
    p.l.handle_datagram(p.now, addr("10.0.0.9:4791"), &hostile_req(9, 9, 9, 20, 15));
    let other = events(&mut p.l)[0].conn;
    drain(&mut p.l);
    let (ca, out) = send_req(&mut p);
    let cookie = rep_of(&out[0]).local_comm_id;
    assert_eq!(p.l.len(), 1);
    // The pressure goes; the same REQ arrives again from another port of the client's host.
    p.l.reject(p.now, other, RejReason::ConsumerReject, &[], &[])
        .unwrap();
    // The client's REQ timer fires (the REP "was lost" for it).
    let t = p.a.poll_timeout().unwrap();
    p.now = t;
    p.a.handle_timeout(p.now);
    let req = drain(&mut p.a)[0].mad.clone();
    p.l.handle_datagram(p.now, addr("10.0.0.2:5000"), &req);
    let ev = events(&mut p.l);
    let stateful = ev
        .iter()
        .find(|e| matches!(e.kind, EventKind::ReqReceived(_)))
        .expect("the repeat from another port is a new REQ")
        .conn;
    p.l.accept(p.now, stateful, AcceptParams::new(Qpn::masked(0x99)))
        .unwrap();
    drain(&mut p.l);
    // The client took the cookie REP and answers it.
    let rtu = client_takes(&mut p, &out[0]);
    p.l.handle_datagram(p.now, a_addr(), &rtu[0].mad);
    assert_eq!(p.l.state(cookie), Some(State::Established));
    assert_eq!(p.l.state(stateful), None);
    let ev = events(&mut p.l);
    assert!(ev
        .iter()
        .any(|e| e.conn == stateful && e.kind == EventKind::Closed(ConnectionError::Stale)));
    assert!(ev
        .iter()
        .any(|e| e.conn == cookie && matches!(e.kind, EventKind::StatelessEstablished(_))));
    assert_eq!(p.a.state(ca), Some(State::Established));
    assert_eq!(p.l.half_open(), 0);
}

/// A full set of the table (8 ways) gives its oldest unanswered REQ up to a newer one
/// (counted); that REQ's RTU then names nothing. Seven newer REQs do not push it out.
#[test]
fn oldest_of_a_full_set_is_overwritten_and_its_rtu_finds_nothing() {
    let mut p = pair(EndpointConfig {
        stateless_slots: 8, // one set
        ..cfg(true)
    });
    let (_, out) = send_req(&mut p);
    for i in 0..7u32 {
        p.l.handle_datagram(
            p.now,
            addr("10.0.0.9:4791"),
            &hostile_req(9 + i, 9, 9 + i, 20, 15),
        );
    }
    assert_eq!(p.l.stats().stateless_overwritten, 0);
    p.l.handle_datagram(
        p.now,
        addr("10.0.0.9:4791"),
        &hostile_req(99, 9, 99, 20, 15),
    );
    drain(&mut p.l);
    assert_eq!(p.l.stats().stateless_overwritten, 1);
    let rtu = client_takes(&mut p, &out[0]);
    let unknown = p.l.stats().dropped(DropReason::UnknownCommId);
    p.l.handle_datagram(p.now, a_addr(), &rtu[0].mad);
    assert_eq!(p.l.stats().dropped(DropReason::UnknownCommId), unknown + 1);
    assert_eq!(p.l.len(), 0);
}

/// The REP's QPN is taken by the time the RTU comes: REJ 3 to the peer, counted.
#[test]
fn rtu_for_a_busy_qpn_is_refused_with_rej() {
    let mut p = pair_with_one_qpn();
    // Another host's REQ is answered with the QPN while it is free ...
    let other = addr("10.0.0.3:4791");
    p.l.handle_datagram(p.now, other, &hostile_req(0x33, 0x3, 0x34, 20, 15));
    let rep = rep_of(&drain(&mut p.l)[0]);
    assert_eq!(rep.local_qpn, Qpn::masked(BASE));
    // ... a connection completes with it before that host's RTU comes.
    let first = p.connect(0x12);
    assert_eq!(p.a.state(first), Some(State::Established));
    p.l.handle_datagram(p.now, other, &rtu(0x33, rep.local_comm_id.0));
    assert_eq!(p.l.stats().stateless_refused, 1, "{}", p.l.stats());
    assert_eq!(p.l.stats().stateless_established, 1);
    let rej = drain(&mut p.l);
    assert_eq!(rej[0].to, other);
    let CmMessage::Rej(r) = parse(&rej[0].mad) else {
        panic!()
    };
    assert_eq!(r.reason, RejReason::NoResources);
    assert_eq!(
        (r.local_comm_id, r.remote_comm_id),
        (rep.local_comm_id, CommId(0x33))
    );
    // Refused once: the same RTU again is a replay.
    p.l.handle_datagram(p.now, other, &rtu(0x33, rep.local_comm_id.0));
    assert_eq!(p.l.stats().dropped(DropReason::ReplayedCookie), 1);
    assert!(drain(&mut p.l).is_empty());
}

/// A REQ whose cookie QPN a live connection uses gets no stateless REP (a Linux peer holding
/// that connection would find it stale and tear it down): it takes the stateful path.
#[test]
fn req_whose_qpn_is_busy_takes_the_stateful_path() {
    let mut p = pair_with_one_qpn();
    let first = p.connect(0x12);
    assert_eq!(p.a.state(first), Some(State::Established));
    assert_eq!(p.l.stats().stateless_qpn_in_use, 0);
    let (replies, held) = (p.l.stats().stateless_replies, p.l.len());
    p.l.handle_datagram(
        p.now,
        addr("10.0.0.3:4791"),
        &hostile_req(0x33, 0x3, 0x34, 20, 15),
    );
    let out = drain(&mut p.l);
    assert!(
        out.iter()
            .all(|o| !matches!(parse(&o.mad), CmMessage::Rep(_))),
        "no REP before the application answers"
    );
    assert_eq!(p.l.stats().stateless_replies, replies);
    assert_eq!(p.l.len(), held + 1, "a half-open entry for the application");
    assert_eq!(p.l.stats().stateless_qpn_in_use, 1, "{}", p.l.stats());
    assert!(
        p.l.stats().to_string().contains("stateless_qpn_in_use=1"),
        "{}",
        p.l.stats()
    );
    // Torn down, the QPN is quarantined through TimeWait: still no stateless REP naming it.
    p.a.disconnect(p.now, first, &[]).unwrap();
    p.pump();
    assert!(p.l.stats().stateless_established == 1 && p.l.established() == 0);
    p.l.handle_datagram(
        p.now,
        addr("10.0.0.4:4791"),
        &hostile_req(0x44, 0x4, 0x45, 20, 15),
    );
    let out = drain(&mut p.l);
    assert!(out
        .iter()
        .all(|o| !matches!(parse(&o.mad), CmMessage::Rep(_))));
    assert_eq!(p.l.stats().stateless_replies, replies);
    assert_eq!(p.l.stats().stateless_qpn_in_use, 2, "{}", p.l.stats());
}
