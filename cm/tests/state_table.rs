//! One test per row of the transition table in docs/protocol.md §4.7, named
//! `<state>_<input>_<result>`. Each drives one endpoint through its public API and plays the
//! peer by hand with MADs built by `ibcm_mad`, so every message on the wire is checked too.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::time::{Duration, Instant};

use ibcm::proto::*;
use ibcm_mad::*;

const PEER_GUID: Guid = Guid(0x00aa_bbcc_ddee_ff00);
const OUR_GUID: Guid = Guid(0x0011_2233_4455_6677);
const SID: ServiceId = ServiceId(0x0000_0000_0106_1c06);

struct H {
    ep: Endpoint,
    now: Instant,
    peer: PeerAddr,
}

impl H {
    fn new() -> Self {
        let ep = Endpoint::new(EndpointConfig {
            local_ca_guid: OUR_GUID,
            local_gid: Gid::from_ip("10.0.0.1".parse().unwrap()),
            rng_seed: Some(42),
            ..Default::default()
        });
        H {
            ep,
            #[allow(clippy::disallowed_methods)]
            now: Instant::now(),
            peer: PeerAddr::Udp("10.0.0.2:4791".parse().unwrap()),
        }
    }

    /// Everything sent, parsed.
    fn tx(&mut self) -> Vec<Mad> {
        let mut v = Vec::new();
        while let Some(t) = self.ep.poll_transmit() {
            assert_eq!(t.to, self.peer);
            assert_eq!(t.mad.len(), 256);
            v.push(Mad::parse(&t.mad).expect("we send valid MADs"));
        }
        v
    }

    fn tx1(&mut self) -> Mad {
        let v = self.tx();
        assert_eq!(v.len(), 1, "expected one MAD, got {v:#?}");
        v.into_iter().next().unwrap()
    }

    fn events(&mut self) -> Vec<EventKind> {
        let mut v = Vec::new();
        while let Some(e) = self.ep.poll_event() {
            v.push(e.kind);
        }
        v
    }

    fn rx(&mut self, tid: Tid, msg: CmMessage) {
        let b = Mad::new(tid, msg).to_bytes();
        self.ep.handle_datagram(self.now, self.peer, &b);
    }

    fn advance(&mut self, d: Duration) {
        self.now += d;
        self.ep.handle_timeout(self.now);
    }

    /// Runs timers until none is left or `max` passes.
    fn run_timers(&mut self, max: Duration) {
        let end = self.now + max;
        while let Some(t) = self.ep.poll_timeout() {
            if t > end {
                break;
            }
            self.now = t;
            self.ep.handle_timeout(t);
        }
    }

    fn connect_params(&self) -> ConnectParams {
        let mut p = ConnectParams::new(self.peer, SID, Qpn::new(0x11).unwrap());
        p.remote_cm_response_timeout = TimeoutExp::new(14).unwrap();
        p.packet_life_time = TimeoutExp::new(12).unwrap();
        p.max_cm_retries = U4::new(3).unwrap();
        p
    }

    /// Active: REQ sent.
    fn req_sent(&mut self) -> (ConnId, Mad) {
        let p = self.connect_params();
        let c = self.ep.connect(self.now, p).unwrap();
        let req = self.tx1();
        assert_eq!(self.ep.state(c), Some(State::ReqSent));
        (c, req)
    }

    /// Active: REQ_SENT with auto_rtu off, then REP received → REP_RCVD.
    fn rep_rcvd(&mut self) -> (ConnId, Mad, CommId) {
        let mut p = self.connect_params();
        p.auto_rtu = false;
        let c = self.ep.connect(self.now, p).unwrap();
        let req = self.tx1();
        let their = CommId(0x7777_0001);
        self.rx(req.header.tid, CmMessage::Rep(rep_for(&req, their)));
        assert_eq!(self.ep.state(c), Some(State::RepRcvd));
        (c, req, their)
    }

    /// Active side established; returns (conn, their comm ID, tid).
    fn established_active(&mut self) -> (ConnId, CommId, Tid) {
        let (c, req) = self.req_sent();
        let their = CommId(0x7777_0001);
        self.rx(req.header.tid, CmMessage::Rep(rep_for(&req, their)));
        let rtu = self.tx1();
        assert!(matches!(rtu.msg, CmMessage::Rtu(_)));
        assert_eq!(self.ep.state(c), Some(State::Established));
        self.events();
        (c, their, req.header.tid)
    }

    /// Passive: a REQ from the peer arrives at our listener.
    fn req_rcvd(&mut self) -> (ConnId, Req, Tid) {
        self.ep.listen(SID, ListenOptions::default());
        let req = peer_req(CommId(0x5555_0001), Qpn::new(0x99).unwrap());
        let tid = Tid(0x0000_0002_0100_5555);
        self.rx(tid, CmMessage::Req(req));
        let ev = self.ep.poll_event().expect("REQ event");
        assert!(matches!(ev.kind, EventKind::ReqReceived(_)));
        assert_eq!(self.ep.state(ev.conn), Some(State::ReqRcvd));
        (ev.conn, req, tid)
    }

    /// Passive: REP sent.
    fn rep_sent(&mut self) -> (ConnId, Req, Tid, Mad) {
        let (c, req, tid) = self.req_rcvd();
        self.ep
            .accept(self.now, c, AcceptParams::new(Qpn::new(0x22).unwrap()))
            .unwrap();
        let rep = self.tx1();
        assert_eq!(self.ep.state(c), Some(State::RepSent));
        (c, req, tid, rep)
    }

    /// Passive side established.
    fn established_passive(&mut self) -> (ConnId, Req, Tid) {
        let (c, req, tid, _) = self.rep_sent();
        self.rx(tid, rtu(req.local_comm_id, c));
        assert_eq!(self.ep.state(c), Some(State::Established));
        self.events();
        (c, req, tid)
    }
}

fn peer_req(id: CommId, qpn: Qpn) -> Req {
    let mut req = Req {
        local_comm_id: id,
        service_id: SID,
        local_ca_guid: PEER_GUID,
        local_qpn: qpn,
        remote_cm_response_timeout: TimeoutExp::new(14).unwrap(),
        local_cm_response_timeout: TimeoutExp::new(14).unwrap(),
        max_cm_retries: U4::new(2).unwrap(),
        ..Req::default()
    };
    req.primary_path.local_ack_timeout = TimeoutExp::new(10).unwrap();
    req
}

fn rep_for(req: &Mad, their: CommId) -> Rep {
    let CmMessage::Req(r) = req.msg else {
        panic!("not a REQ")
    };
    Rep {
        local_comm_id: their,
        remote_comm_id: r.local_comm_id,
        local_qpn: Qpn::new(0x33).unwrap(),
        local_ca_guid: PEER_GUID,
        target_ack_delay: TimeoutExp::new(10).unwrap(),
        ..Rep::default()
    }
}

fn rtu(their: CommId, ours: CommId) -> CmMessage {
    CmMessage::Rtu(Rtu {
        local_comm_id: their,
        remote_comm_id: ours,
        ..Rtu::default()
    })
}

fn rej_msg(local: CommId, remote: CommId, kind: MsgKind, reason: RejReason) -> CmMessage {
    CmMessage::Rej(Rej {
        local_comm_id: local,
        remote_comm_id: remote,
        message_rejected: kind,
        reason,
        ..Rej::default()
    })
}

fn mra_msg(local: CommId, remote: CommId, kind: MsgKind) -> CmMessage {
    CmMessage::Mra(Mra {
        local_comm_id: local,
        remote_comm_id: remote,
        message_mraed: kind,
        service_timeout: TimeoutExp::new(20).unwrap(),
        ..Mra::default()
    })
}

fn dreq_msg(local: CommId, remote: CommId, qpn: Qpn) -> CmMessage {
    CmMessage::Dreq(Dreq {
        local_comm_id: local,
        remote_comm_id: remote,
        remote_qpn_eecn: qpn,
        ..Dreq::default()
    })
}

fn closed(ev: &[EventKind]) -> Option<&ConnectionError> {
    ev.iter().find_map(|e| match e {
        EventKind::Closed(err) => Some(err),
        _ => None,
    })
}

// ------------------------------------------------------------------------------------------
// IDLE / LISTEN

#[test]
fn idle_listen_listen() {
    let mut h = H::new();
    assert!(h.ep.listen(SID, ListenOptions::default()));
    assert!(
        !h.ep.listen(SID, ListenOptions::default()),
        "second listen replaces"
    );
    let req = peer_req(CommId(9), Qpn::new(1).unwrap());
    h.rx(Tid(1), CmMessage::Req(req));
    assert!(matches!(h.events()[0], EventKind::ReqReceived(_)));
    assert!(h.ep.unlisten(SID));
    // Nobody listening any more: REJ 8 with local comm ID 0, the REQ's TID.
    h.rx(
        Tid(2),
        CmMessage::Req(peer_req(CommId(10), Qpn::new(2).unwrap())),
    );
    let rej = h.tx1();
    assert_eq!(rej.header.tid, Tid(2));
    let CmMessage::Rej(r) = rej.msg else { panic!() };
    assert_eq!(r.reason, RejReason::InvalidServiceId);
    assert_eq!(r.local_comm_id, CommId(0));
    assert_eq!(r.remote_comm_id, CommId(10));
    assert_eq!(r.message_rejected, MsgKind::Req);
}

#[test]
fn idle_send_req_req_sent() {
    let mut h = H::new();
    let (c, req) = h.req_sent();
    let CmMessage::Req(r) = req.msg else { panic!() };
    assert_eq!(r.local_comm_id, c);
    assert_eq!(r.service_id, SID);
    assert_eq!(r.local_ca_guid, OUR_GUID);
    assert_eq!(r.local_qpn, Qpn::new(0x11).unwrap());
    assert_eq!(r.primary_path.local_gid.to_string(), "::ffff:10.0.0.1");
    assert_eq!(r.primary_path.remote_gid.to_string(), "::ffff:10.0.0.2");
    // TID as Linux forms it: hi_tid, then the comm ID byte-swapped.
    assert_eq!(req.header.tid.0 as u32, c.0.swap_bytes());
    assert!(h.ep.poll_timeout().is_some());
}

// ------------------------------------------------------------------------------------------
// REQ_SENT / MRA_REQ_RCVD

#[test]
fn req_sent_mra_rx_mra_req_rcvd() {
    let mut h = H::new();
    let (c, req) = h.req_sent();
    let before = h.ep.poll_timeout().unwrap();
    h.rx(
        req.header.tid,
        mra_msg(CommId(0x7777_0001), c, MsgKind::Req),
    );
    assert_eq!(h.ep.state(c), Some(State::MraReqRcvd));
    assert!(matches!(h.events()[..], [EventKind::MraReceived { .. }]));
    // The wait is now service timeout (20: 4.3 s) + packet life time.
    let after = h.ep.poll_timeout().unwrap();
    assert!(after > before + Duration::from_secs(4));
    // No retransmission before then.
    h.advance(Duration::from_secs(4));
    assert!(h.tx().is_empty());
}

#[test]
fn req_sent_rep_rx_rep_rcvd() {
    // From REQ_SENT…
    let mut h = H::new();
    let (c, _req, _their) = h.rep_rcvd();
    assert!(matches!(h.events()[..], [EventKind::RepReceived(_)]));
    assert!(h.tx().is_empty(), "no RTU before the application says so");
    assert_eq!(h.ep.remote_qpn(c), Some(Qpn::new(0x33).unwrap()));
    // The REQ is no longer retransmitted.
    h.advance(Duration::from_secs(60));
    assert!(h.tx().is_empty());
    // …and from MRA_REQ_RCVD.
    let mut h = H::new();
    let (c, req) = h.req_sent();
    h.rx(
        req.header.tid,
        mra_msg(CommId(0x7777_0001), c, MsgKind::Req),
    );
    h.rx(
        req.header.tid,
        CmMessage::Rep(rep_for(&req, CommId(0x7777_0001))),
    );
    assert_eq!(h.ep.state(c), Some(State::Established), "auto RTU");
}

#[test]
fn req_sent_rej_rx_idle() {
    let mut h = H::new();
    let (c, req) = h.req_sent();
    let mut rej = Rej {
        local_comm_id: CommId(0),
        remote_comm_id: c,
        message_rejected: MsgKind::Req,
        reason: RejReason::ConsumerReject,
        private_data: PrivateData::from_slice(b"go away").unwrap(),
        ..Rej::default()
    };
    rej.set_ari(&[1, 2, 3]);
    h.rx(req.header.tid, CmMessage::Rej(rej));
    assert_eq!(h.ep.state(c), None, "IDLE: gone without TimeWait");
    let ev = h.events();
    assert_eq!(
        closed(&ev),
        Some(&ConnectionError::Rejected {
            reason: RejReason::ConsumerReject,
            ari: vec![1, 2, 3],
            private_data: b"go away".to_vec()
        })
    );
    // Reason 10 (stale) leads to TimeWait instead.
    let mut h = H::new();
    let (c, req) = h.req_sent();
    h.rx(
        req.header.tid,
        rej_msg(CommId(0), c, MsgKind::Req, RejReason::StaleConn),
    );
    assert_eq!(h.ep.state(c), Some(State::Timewait));
    assert_eq!(closed(&h.events()), Some(&ConnectionError::Stale));
}

#[test]
fn req_sent_retries_exhausted_idle() {
    let mut h = H::new();
    let (c, req) = h.req_sent();
    h.run_timers(Duration::from_secs(600));
    let sent = h.tx();
    // max_cm_retries = 3: three retransmissions of the identical REQ, then REJ 4.
    assert_eq!(sent.len(), 4, "{sent:#?}");
    for s in &sent[..3] {
        assert_eq!(s, &req, "retransmissions are identical");
    }
    let CmMessage::Rej(r) = sent[3].msg else {
        panic!()
    };
    assert_eq!(r.reason, RejReason::Timeout);
    assert_eq!(r.ari_bytes(), &OUR_GUID.0.to_be_bytes());
    assert_eq!(h.ep.state(c), None);
    assert_eq!(closed(&h.events()), Some(&ConnectionError::TimedOut));
    assert_eq!(h.ep.stats().retransmits, 3);
}

#[test]
fn req_sent_destroy_idle() {
    let mut h = H::new();
    let (c, _req) = h.req_sent();
    h.ep.disconnect(h.now, c, &[]).unwrap();
    let CmMessage::Rej(r) = h.tx1().msg else {
        panic!()
    };
    assert_eq!(r.reason, RejReason::Timeout);
    assert_eq!(r.timeout_ca_guid(), Some(OUR_GUID));
    assert_eq!(h.ep.state(c), None);
    assert_eq!(closed(&h.events()), Some(&ConnectionError::LocallyClosed));
}

// ------------------------------------------------------------------------------------------
// LISTEN / REQ_RCVD / MRA_REQ_SENT

#[test]
fn listen_req_rx_req_rcvd() {
    let mut h = H::new();
    h.ep.listen(SID, ListenOptions::default());
    let mut req = peer_req(CommId(0x5555_0001), Qpn::new(0x99).unwrap());
    let hdr = ibcm_mad::cma::CmaHeader::new(
        "10.0.0.2:49152".parse().unwrap(),
        "10.0.0.1".parse().unwrap(),
    );
    let mut pd = [0u8; 92];
    hdr.emit(&mut pd).unwrap();
    pd[36..41].copy_from_slice(b"hello");
    req.private_data = PrivateData(pd);
    h.rx(Tid(7), CmMessage::Req(req));
    let ev = h.ep.poll_event().unwrap();
    let EventKind::ReqReceived(inc) = ev.kind else {
        panic!()
    };
    assert_eq!(h.ep.state(ev.conn), Some(State::ReqRcvd));
    assert_eq!(inc.cma_header, Some(hdr));
    assert_eq!(&inc.user_private_data()[..5], b"hello");
    assert_eq!(inc.user_private_data().len(), 56);
    assert_eq!(inc.remote_qpn(), Qpn::new(0x99).unwrap());
    assert_eq!(h.ep.half_open(), 1);
    assert!(h.tx().is_empty());
}

#[test]
fn req_rcvd_send_mra_mra_req_sent() {
    let mut h = H::new();
    let (c, req, tid) = h.req_rcvd();
    h.ep.mra(h.now, c, TimeoutExp::new(24).unwrap(), b"wait")
        .unwrap();
    let mra = h.tx1();
    assert_eq!(mra.header.tid, tid);
    let CmMessage::Mra(m) = mra.msg else { panic!() };
    assert_eq!(m.message_mraed, MsgKind::Req);
    assert_eq!(m.remote_comm_id, req.local_comm_id);
    assert_eq!(m.service_timeout.get(), 24);
    assert_eq!(h.ep.state(c), Some(State::MraReqSent));
    // A duplicate REQ gets the same MRA again.
    h.rx(tid, CmMessage::Req(req));
    assert_eq!(h.tx1(), mra);
    // Linux-like: a duplicate REQ in REQ_RCVD triggers the MRA by itself.
    let mut h = H::new();
    let (c, req, tid) = h.req_rcvd();
    h.rx(tid, CmMessage::Req(req));
    assert!(matches!(h.tx1().msg, CmMessage::Mra(_)));
    assert_eq!(h.ep.state(c), Some(State::MraReqSent));
}

#[test]
fn req_rcvd_send_rep_rep_sent() {
    let mut h = H::new();
    let (c, req, tid, rep) = h.rep_sent();
    assert_eq!(rep.header.tid, tid, "the REP reuses the REQ's TID");
    let CmMessage::Rep(r) = rep.msg else { panic!() };
    assert_eq!(r.local_comm_id, c);
    assert_eq!(r.remote_comm_id, req.local_comm_id);
    assert_eq!(r.local_qpn, Qpn::new(0x22).unwrap());
    assert_eq!(r.local_ca_guid, OUR_GUID);
    // From MRA_REQ_SENT too, and an XRC target answers with its TGT QPN in the EECN.
    let mut h = H::new();
    h.ep.listen(SID, ListenOptions::default());
    let mut xreq = peer_req(CommId(0x5555_0002), Qpn::new(0x98).unwrap());
    xreq.set_transport(ReqTransport::Xrc);
    h.rx(Tid(3), CmMessage::Req(xreq));
    let ev = h.ep.poll_event().unwrap();
    h.ep.mra(h.now, ev.conn, TimeoutExp::new(20).unwrap(), &[])
        .unwrap();
    h.tx();
    h.ep.accept(
        h.now,
        ev.conn,
        AcceptParams::xrc_tgt(Qpn::new(0xabc).unwrap()),
    )
    .unwrap();
    let CmMessage::Rep(r) = h.tx1().msg else {
        panic!()
    };
    assert_eq!(r.xrc_tgt_qpn(), Qpn::new(0xabc).unwrap());
    assert_eq!(r.local_qpn, Qpn::default());
    assert!(r.srq);
    assert_eq!(h.ep.state(ev.conn), Some(State::RepSent));
}

#[test]
fn req_rcvd_send_rej_idle() {
    let mut h = H::new();
    let (c, req, tid) = h.req_rcvd();
    h.ep.reject(h.now, c, RejReason::ConsumerReject, &[], b"nope")
        .unwrap();
    let rej = h.tx1();
    assert_eq!(rej.header.tid, tid);
    let CmMessage::Rej(r) = rej.msg else { panic!() };
    assert_eq!(
        r.local_comm_id,
        CommId(0),
        "Linux: local ID 0 from REQ_RCVD"
    );
    assert_eq!(r.remote_comm_id, req.local_comm_id);
    assert_eq!(r.reason, RejReason::ConsumerReject);
    assert_eq!(&r.private_data.as_bytes()[..4], b"nope");
    assert_eq!(h.ep.state(c), None);
    assert_eq!(h.ep.half_open(), 0);
    // From MRA_REQ_SENT the REJ carries the real local ID.
    let mut h = H::new();
    let (c, _req, _tid) = h.req_rcvd();
    h.ep.mra(h.now, c, TimeoutExp::new(20).unwrap(), &[])
        .unwrap();
    h.tx();
    h.ep.disconnect(h.now, c, &[]).unwrap();
    let CmMessage::Rej(r) = h.tx1().msg else {
        panic!()
    };
    assert_eq!(r.local_comm_id, c);
    assert_eq!(h.ep.state(c), None);
}

#[test]
fn req_rcvd_rej_rx_idle() {
    let mut h = H::new();
    let (c, req, tid) = h.req_rcvd();
    // The initiator gives up (REJ 4 with its GUID as ARI).
    let mut rej = Rej {
        local_comm_id: req.local_comm_id,
        remote_comm_id: CommId(0),
        message_rejected: MsgKind::Other,
        reason: RejReason::Timeout,
        ..Rej::default()
    };
    rej.set_ari(&PEER_GUID.0.to_be_bytes());
    h.rx(tid, CmMessage::Rej(rej));
    assert_eq!(h.ep.state(c), None);
    assert!(matches!(
        closed(&h.events()),
        Some(ConnectionError::Rejected {
            reason: RejReason::Timeout,
            ..
        })
    ));
    assert_eq!(h.ep.half_open(), 0);
}

// ------------------------------------------------------------------------------------------
// REP_SENT / MRA_REP_RCVD

#[test]
fn rep_sent_mra_rx_mra_rep_rcvd() {
    let mut h = H::new();
    let (c, req, tid, _rep) = h.rep_sent();
    h.rx(tid, mra_msg(req.local_comm_id, c, MsgKind::Rep));
    assert_eq!(h.ep.state(c), Some(State::MraRepRcvd));
    assert!(matches!(h.events()[..], [EventKind::MraReceived { .. }]));
}

#[test]
fn rep_sent_rtu_rx_established() {
    let mut h = H::new();
    let (c, req, tid, _rep) = h.rep_sent();
    // An RTU with a wrong remote comm ID is dropped.
    h.rx(tid, rtu(CommId(0xbad), c));
    assert_eq!(h.ep.state(c), Some(State::RepSent));
    assert_eq!(h.ep.stats().dropped(DropReason::MismatchedCommId), 1);
    h.rx(tid, rtu(req.local_comm_id, c));
    assert_eq!(h.ep.state(c), Some(State::Established));
    assert_eq!(h.events(), vec![EventKind::Established]);
    assert_eq!(h.ep.half_open(), 0);
    h.advance(Duration::from_secs(600));
    assert!(h.tx().is_empty(), "REP no longer retransmitted");
}

/// Issue 26 §1.3: the passive side hears the RTU's private data (trailing zeros trimmed)
/// just before `Established`; the retransmitted RTU after that is a duplicate.
#[test]
fn rep_sent_rtu_with_private_data_reports_it() {
    let mut h = H::new();
    let (c, req, tid, _rep) = h.rep_sent();
    let mut pd = [0u8; 224];
    pd[..5].copy_from_slice(b"ready");
    let with_pd = CmMessage::Rtu(Rtu {
        local_comm_id: req.local_comm_id,
        remote_comm_id: c,
        private_data: PrivateData::from_slice(&pd).unwrap(),
    });
    h.rx(tid, with_pd);
    assert_eq!(h.ep.state(c), Some(State::Established));
    assert_eq!(
        h.events(),
        vec![
            EventKind::RtuReceived {
                private_data: b"ready".to_vec()
            },
            EventKind::Established
        ]
    );
    h.rx(tid, with_pd);
    assert!(h.events().is_empty(), "a repeated RTU reports nothing");
}

#[test]
fn rep_sent_comm_est_established() {
    let mut h = H::new();
    let (c, req, tid, _rep) = h.rep_sent();
    h.rx(tid, mra_msg(req.local_comm_id, c, MsgKind::Rep));
    h.events();
    h.ep.notify_established(h.now, c).unwrap();
    assert_eq!(h.ep.state(c), Some(State::Established));
    assert_eq!(h.events(), vec![EventKind::Established]);
    // A late RTU is a harmless duplicate.
    h.rx(tid, rtu(req.local_comm_id, c));
    assert_eq!(h.ep.stats().dropped(DropReason::Duplicate), 1);
}

#[test]
fn rep_sent_retries_exhausted_idle() {
    let mut h = H::new();
    let (c, req, tid, rep) = h.rep_sent();
    // The peer repeats its REQ once (as a Linux active side does when no REP arrives): it is
    // answered with the REP at once, and it widens the anti-amplification budget. Without
    // it only one retransmission would go out (REP + retransmission + REJ = 3 × one REQ: the
    // limit of issue 12, docs/protocol.md §5.8).
    h.rx(tid, CmMessage::Req(req));
    assert_eq!(h.tx1(), rep);
    h.run_timers(Duration::from_secs(600));
    let sent = h.tx();
    // The REQ asked for 2 retries.
    assert_eq!(sent.len(), 3, "{sent:#?}");
    assert_eq!(sent[0], rep);
    assert_eq!(sent[1], rep);
    assert!(matches!(
        sent[2].msg,
        CmMessage::Rej(Rej {
            reason: RejReason::Timeout,
            ..
        })
    ));
    assert_eq!(h.ep.state(c), None);
    assert_eq!(closed(&h.events()), Some(&ConnectionError::TimedOut));
    assert_eq!(h.ep.half_open(), 0);
}

#[test]
fn rep_sent_rej_rx_idle() {
    let mut h = H::new();
    let (c, req, tid, _rep) = h.rep_sent();
    h.rx(
        tid,
        rej_msg(
            req.local_comm_id,
            c,
            MsgKind::Rep,
            RejReason::ConsumerReject,
        ),
    );
    assert_eq!(h.ep.state(c), None);
    // With reason 10: TimeWait.
    let mut h = H::new();
    let (c, req, tid, _rep) = h.rep_sent();
    h.rx(
        tid,
        rej_msg(req.local_comm_id, c, MsgKind::Rep, RejReason::StaleConn),
    );
    assert_eq!(h.ep.state(c), Some(State::Timewait));
}

#[test]
fn rep_sent_send_rej_timewait() {
    let mut h = H::new();
    let (c, _req, _tid, _rep) = h.rep_sent();
    h.ep.reject(h.now, c, RejReason::ConsumerReject, &[], &[])
        .unwrap();
    let CmMessage::Rej(r) = h.tx1().msg else {
        panic!()
    };
    assert_eq!(r.message_rejected, MsgKind::Other);
    assert_eq!(h.ep.state(c), Some(State::Timewait));
    assert_eq!(
        closed(&h.events()),
        Some(&ConnectionError::LocallyRejected {
            reason: RejReason::ConsumerReject
        })
    );
}

#[test]
fn rep_sent_dreq_rx_dreq_rcvd() {
    let mut h = H::new();
    let (c, req, tid, _rep) = h.rep_sent();
    h.rx(tid, dreq_msg(req.local_comm_id, c, Qpn::new(0x22).unwrap()));
    // DREQ_RCVD is left at once: the DREP goes out and TimeWait starts.
    let CmMessage::Drep(d) = h.tx1().msg else {
        panic!()
    };
    assert_eq!((d.local_comm_id, d.remote_comm_id), (c, req.local_comm_id));
    assert_eq!(h.ep.state(c), Some(State::Timewait));
    assert!(matches!(
        closed(&h.events()),
        Some(ConnectionError::Disconnected { by_peer: true, .. })
    ));
}

// ------------------------------------------------------------------------------------------
// REP_RCVD / MRA_REP_SENT

#[test]
fn rep_rcvd_send_mra_mra_rep_sent() {
    let mut h = H::new();
    let (c, req, their) = h.rep_rcvd();
    h.ep.mra(h.now, c, TimeoutExp::new(18).unwrap(), &[])
        .unwrap();
    let CmMessage::Mra(m) = h.tx1().msg else {
        panic!()
    };
    assert_eq!(m.message_mraed, MsgKind::Rep);
    assert_eq!(h.ep.state(c), Some(State::MraRepSent));
    // A duplicate REP gets the MRA again.
    h.rx(req.header.tid, CmMessage::Rep(rep_for(&req, their)));
    assert!(matches!(h.tx1().msg, CmMessage::Mra(_)));
}

#[test]
fn rep_rcvd_send_rtu_established() {
    let mut h = H::new();
    let (c, _req, their) = h.rep_rcvd();
    h.events();
    h.ep.establish(h.now, c, b"ready").unwrap();
    let CmMessage::Rtu(r) = h.tx1().msg else {
        panic!()
    };
    assert_eq!((r.local_comm_id, r.remote_comm_id), (c, their));
    assert_eq!(&r.private_data.as_bytes()[..5], b"ready");
    assert_eq!(h.ep.state(c), Some(State::Established));
    assert_eq!(h.events(), vec![EventKind::Established]);
}

/// The DREQ of issue 28's newcomer (§3.6, MRA_REP_SENT × DREQ): before our RTU it is dropped,
/// as Linux's `cm_dreq_handler` drops it; the peer's DREQ timer sends it again and, once we are
/// established, it is answered.
#[test]
fn mra_rep_sent_dreq_rx_dropped_until_established() {
    let mut h = H::new();
    let (c, _req, their) = h.rep_rcvd();
    h.ep.mra(h.now, c, TimeoutExp::new(20).unwrap(), &[])
        .unwrap();
    h.tx1();
    h.events();
    let dreq = dreq_msg(their, c, Qpn::new(0x11).unwrap());
    h.rx(Tid(7), dreq);
    assert!(h.tx().is_empty());
    assert!(h.events().is_empty());
    assert_eq!(h.ep.state(c), Some(State::MraRepSent));
    assert_eq!(h.ep.stats().dropped(DropReason::WrongState), 1);
    h.ep.establish(h.now, c, &[]).unwrap();
    assert!(matches!(h.tx1().msg, CmMessage::Rtu(_)));
    h.events();
    h.rx(Tid(7), dreq);
    assert!(matches!(h.tx1().msg, CmMessage::Drep(_)));
    assert_eq!(h.ep.state(c), Some(State::Timewait));
}

#[test]
fn rep_rcvd_send_rej_idle() {
    let mut h = H::new();
    let (c, _req, their) = h.rep_rcvd();
    h.ep.reject(h.now, c, RejReason::ConsumerReject, &[], &[])
        .unwrap();
    let CmMessage::Rej(r) = h.tx1().msg else {
        panic!()
    };
    assert_eq!(r.message_rejected, MsgKind::Rep);
    assert_eq!((r.local_comm_id, r.remote_comm_id), (c, their));
    assert_eq!(h.ep.state(c), None);
}

#[test]
fn rep_rcvd_rej_rx_timewait() {
    let mut h = H::new();
    let (c, req, their) = h.rep_rcvd();
    h.rx(
        req.header.tid,
        rej_msg(their, c, MsgKind::Other, RejReason::ConsumerReject),
    );
    assert_eq!(h.ep.state(c), Some(State::Timewait));
}

// ------------------------------------------------------------------------------------------
// ESTABLISHED

#[test]
fn established_send_dreq_dreq_sent() {
    let mut h = H::new();
    let (c, their, _tid) = h.established_active();
    h.ep.disconnect(h.now, c, b"bye").unwrap();
    let CmMessage::Dreq(d) = h.tx1().msg else {
        panic!()
    };
    assert_eq!((d.local_comm_id, d.remote_comm_id), (c, their));
    assert_eq!(d.remote_qpn_eecn, Qpn::new(0x33).unwrap());
    assert_eq!(&d.private_data.as_bytes()[..3], b"bye");
    assert_eq!(h.ep.state(c), Some(State::DreqSent));
}

#[test]
fn established_dreq_rx_dreq_rcvd() {
    let mut h = H::new();
    let (c, req, tid) = h.established_passive();
    // A DREQ naming another QPN is ignored.
    h.rx(tid, dreq_msg(req.local_comm_id, c, Qpn::new(0x23).unwrap()));
    assert!(h.tx().is_empty());
    assert_eq!(h.ep.stats().dropped(DropReason::QpnMismatch), 1);
    let dreq_tid = Tid(0x0000_0004_1234_5678);
    h.rx(
        dreq_tid,
        dreq_msg(req.local_comm_id, c, Qpn::new(0x22).unwrap()),
    );
    let drep = h.tx1();
    assert_eq!(drep.header.tid, dreq_tid, "DREP reuses the DREQ's TID");
    assert_eq!(h.ep.state(c), Some(State::Timewait));
    // A duplicate DREQ in TimeWait gets a fresh DREP.
    h.rx(
        dreq_tid,
        dreq_msg(req.local_comm_id, c, Qpn::new(0x22).unwrap()),
    );
    assert!(matches!(h.tx1().msg, CmMessage::Drep(_)));
}

#[test]
fn established_rej_rx_timewait() {
    let mut h = H::new();
    let (c, their, tid) = h.established_active();
    h.rx(
        tid,
        rej_msg(their, c, MsgKind::Other, RejReason::ConsumerReject),
    );
    assert_eq!(h.ep.state(c), Some(State::Timewait));
    assert!(matches!(
        closed(&h.events()),
        Some(ConnectionError::Rejected { .. })
    ));
}

// ------------------------------------------------------------------------------------------
// DREQ_SENT / DREQ_RCVD

#[test]
fn dreq_sent_drep_rx_timewait() {
    let mut h = H::new();
    let (c, their, tid) = h.established_active();
    h.ep.disconnect(h.now, c, &[]).unwrap();
    h.tx();
    h.rx(
        tid,
        CmMessage::Drep(Drep {
            local_comm_id: their,
            remote_comm_id: c,
            ..Drep::default()
        }),
    );
    assert_eq!(h.ep.state(c), Some(State::Timewait));
    assert!(matches!(
        closed(&h.events()),
        Some(ConnectionError::Disconnected { by_peer: false, .. })
    ));
}

#[test]
fn dreq_sent_dreq_rx_dreq_rcvd() {
    let mut h = H::new();
    let (c, their, tid) = h.established_active();
    h.ep.disconnect(h.now, c, &[]).unwrap();
    h.tx();
    // Both sides disconnect at once: their DREQ crosses ours.
    h.rx(tid, dreq_msg(their, c, Qpn::new(0x11).unwrap()));
    assert!(matches!(h.tx1().msg, CmMessage::Drep(_)));
    assert_eq!(h.ep.state(c), Some(State::Timewait));
    h.advance(Duration::from_secs(600));
    assert!(
        h.tx().iter().all(|m| !matches!(m.msg, CmMessage::Dreq(_))),
        "our DREQ is no longer retransmitted"
    );
}

#[test]
fn dreq_sent_rej_rx_timewait() {
    let mut h = H::new();
    let (c, their, tid) = h.established_active();
    h.ep.disconnect(h.now, c, &[]).unwrap();
    h.tx();
    h.rx(
        tid,
        rej_msg(their, c, MsgKind::Other, RejReason::ConsumerReject),
    );
    assert_eq!(h.ep.state(c), Some(State::Timewait));
}

#[test]
fn dreq_sent_retries_exhausted_timewait() {
    let mut h = H::new();
    let (c, _their, _tid) = h.established_active();
    h.ep.disconnect(h.now, c, &[]).unwrap();
    let dreq = h.tx1();
    // Retransmissions until retries run out, then TimeWait (and after it, gone).
    let mut n = 1;
    while h.ep.state(c) == Some(State::DreqSent) {
        let t = h.ep.poll_timeout().unwrap();
        h.now = t;
        h.ep.handle_timeout(t);
        for m in h.tx() {
            assert_eq!(m, dreq);
            n += 1;
        }
    }
    assert_eq!(n, 4, "1 + max_cm_retries DREQs");
    assert_eq!(h.ep.state(c), Some(State::Timewait));
    assert_eq!(
        closed(&h.events()),
        Some(&ConnectionError::DisconnectTimedOut)
    );
}

#[test]
fn dreq_sent_destroy_timewait() {
    let mut h = H::new();
    let (c, _their, _tid) = h.established_active();
    h.ep.disconnect(h.now, c, &[]).unwrap();
    h.tx();
    // Closing again while the DREQ is out changes nothing; the connection reaches IDLE
    // through TimeWait.
    h.ep.disconnect(h.now, c, &[]).unwrap();
    assert!(h.tx().is_empty());
    h.run_timers(Duration::from_secs(3600));
    assert_eq!(h.ep.state(c), None);
    assert!(h.ep.is_empty());
}

#[test]
fn dreq_rcvd_send_drep_timewait() {
    let mut h = H::new();
    let (c, their, tid) = h.established_active();
    h.rx(tid, dreq_msg(their, c, Qpn::new(0x11).unwrap()));
    // The DREP is sent exactly once, by the core itself.
    let sent = h.tx();
    assert_eq!(sent.len(), 1);
    assert!(matches!(sent[0].msg, CmMessage::Drep(_)));
    assert_eq!(h.ep.state(c), Some(State::Timewait));
    assert!(matches!(
        closed(&h.events()),
        Some(ConnectionError::Disconnected { by_peer: true, .. })
    ));
}

#[test]
fn dreq_rcvd_drep_rx_timewait() {
    let mut h = H::new();
    let (c, their, tid) = h.established_active();
    h.ep.disconnect(h.now, c, &[]).unwrap();
    h.tx();
    h.rx(tid, dreq_msg(their, c, Qpn::new(0x11).unwrap()));
    h.tx();
    // Their DREP for our crossed DREQ arrives while we are already in TimeWait: harmless.
    h.rx(
        tid,
        CmMessage::Drep(Drep {
            local_comm_id: their,
            remote_comm_id: c,
            ..Drep::default()
        }),
    );
    assert_eq!(h.ep.state(c), Some(State::Timewait));
    assert!(h.tx().is_empty());
}

#[test]
fn timewait_timer_idle() {
    let mut h = H::new();
    let (c, their, tid) = h.established_active();
    h.rx(tid, dreq_msg(their, c, Qpn::new(0x11).unwrap()));
    h.tx();
    h.events();
    assert_eq!(h.ep.state(c), Some(State::Timewait));
    // The QPN is quarantined while the connection is in TimeWait.
    let mut p = h.connect_params();
    p.local_qpn = Qpn::new(0x11).unwrap();
    assert!(matches!(
        h.ep.connect(h.now, p.clone()),
        Err(ConnectError::QpnInQuarantine { .. })
    ));
    h.run_timers(Duration::from_secs(3600));
    assert_eq!(h.ep.state(c), None);
    assert_eq!(
        h.events(),
        vec![EventKind::TimewaitExit {
            local_qpn: Qpn::new(0x11).unwrap()
        }]
    );
    assert!(h.ep.is_empty());
    assert!(h.ep.connect(h.now, p).is_ok());
}

// ------------------------------------------------------------------------------------------
// SIDR

#[test]
fn idle_send_sidr_req_sidr_req_sent() {
    let mut h = H::new();
    let mut p = SidrReqParams::new(h.peer, ServiceId(0x0111_1234));
    p.private_data = b"who".to_vec();
    let id = h.ep.sidr_request(h.now, p).unwrap();
    let m = h.tx1();
    let CmMessage::SidrReq(r) = m.msg else {
        panic!()
    };
    assert_eq!(r.request_id.0, id.0);
    assert_eq!(r.service_id, ServiceId(0x0111_1234));
    assert!(h.ep.poll_timeout().is_some());
}

#[test]
fn sidr_req_sent_sidr_rep_rx_idle() {
    let mut h = H::new();
    let id =
        h.ep.sidr_request(h.now, SidrReqParams::new(h.peer, ServiceId(5)))
            .unwrap();
    let req = h.tx1();
    h.rx(
        req.header.tid,
        CmMessage::SidrRep(SidrRep {
            request_id: RequestId(id.0),
            status: SidrStatus::Success,
            qpn: Qpn::new(0x44).unwrap(),
            qkey: Qkey(0x1234),
            ..SidrRep::default()
        }),
    );
    assert_eq!(
        h.events(),
        vec![EventKind::SidrReply {
            status: SidrStatus::Success,
            qpn: Qpn::new(0x44).unwrap(),
            qkey: Qkey(0x1234),
            private_data: vec![]
        }]
    );
    assert!(h.ep.is_empty());
    // Retries exhausted: SidrTimedOut.
    let mut p = SidrReqParams::new(h.peer, ServiceId(5));
    p.max_retries = 2;
    p.timeout = Duration::from_millis(100);
    h.ep.sidr_request(h.now, p).unwrap();
    h.run_timers(Duration::from_secs(10));
    assert_eq!(h.tx().len(), 3);
    assert_eq!(h.events(), vec![EventKind::SidrTimedOut]);
    assert!(h.ep.is_empty());
}

/// A SIDR_REQ whose requester is gone (`sidr_cancel`): no retransmission, no event, nothing
/// left; its late SIDR_REP is dropped as unknown.
#[test]
fn sidr_req_sent_cancel_idle() {
    let mut h = H::new();
    let mut p = SidrReqParams::new(h.peer, ServiceId(5));
    p.timeout = Duration::from_millis(100);
    let id = h.ep.sidr_request(h.now, p).unwrap();
    let req = h.tx1();
    assert!(h.ep.sidr_cancel(id));
    assert!(!h.ep.sidr_cancel(id));
    h.run_timers(Duration::from_secs(10));
    assert!(h.tx().is_empty());
    assert!(h.events().is_empty());
    assert!(h.ep.is_empty());
    h.rx(
        req.header.tid,
        CmMessage::SidrRep(SidrRep {
            request_id: RequestId(id.0),
            ..SidrRep::default()
        }),
    );
    assert!(h.events().is_empty());
    assert_eq!(h.ep.stats().dropped(DropReason::UnknownSidr), 1);
}

#[test]
fn listen_sidr_req_rx_sidr_req_rcvd() {
    let mut h = H::new();
    h.ep.listen(ServiceId(5), ListenOptions::default());
    let req = SidrReq {
        request_id: RequestId(77),
        service_id: ServiceId(5),
        ..SidrReq::default()
    };
    h.rx(Tid(9), CmMessage::SidrReq(req));
    let ev = h.events();
    assert!(matches!(&ev[..], [EventKind::SidrReqReceived(s)] if s.request_id == RequestId(77)));
    // The duplicate is dropped while the application decides.
    h.rx(Tid(9), CmMessage::SidrReq(req));
    assert!(h.events().is_empty());
    // No listener: SIDR_REP status 1.
    h.rx(
        Tid(10),
        CmMessage::SidrReq(SidrReq {
            request_id: RequestId(78),
            service_id: ServiceId(6),
            ..SidrReq::default()
        }),
    );
    let CmMessage::SidrRep(r) = h.tx1().msg else {
        panic!()
    };
    assert_eq!(r.status, SidrStatus::UnsupportedServiceId);
}

#[test]
fn sidr_req_rcvd_send_sidr_rep_idle() {
    let mut h = H::new();
    h.ep.listen(ServiceId(5), ListenOptions::default());
    h.rx(
        Tid(9),
        CmMessage::SidrReq(SidrReq {
            request_id: RequestId(77),
            service_id: ServiceId(5),
            ..SidrReq::default()
        }),
    );
    let ev = h.ep.poll_event().unwrap();
    h.ep.sidr_reply(
        h.now,
        ev.conn,
        SidrRepParams::success(Qpn::new(0x55).unwrap(), Qkey(1)),
    )
    .unwrap();
    let rep = h.tx1();
    assert_eq!(rep.header.tid, Tid(9));
    let CmMessage::SidrRep(r) = rep.msg else {
        panic!()
    };
    assert_eq!(r.request_id, RequestId(77));
    assert_eq!(r.qpn, Qpn::new(0x55).unwrap());
    assert!(h.ep.is_empty());
    assert!(h
        .ep
        .sidr_reply(
            h.now,
            ev.conn,
            SidrRepParams::success(Qpn::default(), Qkey(1))
        )
        .is_err());
}

// ------------------------------------------------------------------------------------------
// LAP / APR

fn alt_path() -> PathInfo {
    PathInfo {
        local_lid: Lid(5),
        remote_lid: Lid(6),
        hop_limit: 1,
        ..PathInfo::default()
    }
}

#[test]
fn established_lap_rx_lap_rcvd() {
    let mut h = H::new();
    let (c, req, tid) = h.established_passive();
    h.rx(
        tid,
        CmMessage::Lap(Lap {
            local_comm_id: req.local_comm_id,
            remote_comm_id: c,
            remote_qpn_eecn: Qpn::new(0x22).unwrap(),
            alternate_path: alt_path(),
            ..Lap::default()
        }),
    );
    assert!(matches!(
        &h.events()[..],
        [EventKind::LapReceived { path, .. }] if *path == alt_path()
    ));
    h.ep.apr(h.now, c, AprStatus::Success, &[], &[]).unwrap();
    let CmMessage::Apr(a) = h.tx1().msg else {
        panic!()
    };
    assert_eq!(a.ap_status, AprStatus::Success);
    assert_eq!(h.ep.state(c), Some(State::Established));
}

#[test]
fn lap_rcvd_send_mra_mra_lap_sent() {
    let mut h = H::new();
    let (c, req, tid) = h.established_passive();
    let lap = CmMessage::Lap(Lap {
        local_comm_id: req.local_comm_id,
        remote_comm_id: c,
        alternate_path: alt_path(),
        ..Lap::default()
    });
    h.rx(tid, lap);
    h.events();
    h.ep.mra(h.now, c, TimeoutExp::new(16).unwrap(), &[])
        .unwrap();
    let CmMessage::Mra(m) = h.tx1().msg else {
        panic!()
    };
    assert_eq!(m.message_mraed, MsgKind::Other);
    // A duplicate LAP gets the MRA again.
    h.rx(tid, lap);
    assert!(matches!(h.tx1().msg, CmMessage::Mra(_)));
}

#[test]
fn lap_sent_apr_rx_lap_idle() {
    let mut h = H::new();
    let (c, their, tid) = h.established_active();
    h.ep.load_alternate_path(h.now, c, alt_path(), b"alt")
        .unwrap();
    let CmMessage::Lap(l) = h.tx1().msg else {
        panic!()
    };
    assert_eq!(l.alternate_path, alt_path());
    assert_eq!(l.remote_qpn_eecn, Qpn::new(0x33).unwrap());
    // MRA_LAP_RCVD, then the APR.
    h.rx(tid, mra_msg(their, c, MsgKind::Other));
    h.rx(
        tid,
        CmMessage::Apr(Apr {
            local_comm_id: their,
            remote_comm_id: c,
            ap_status: AprStatus::Rejected,
            ..Apr::default()
        }),
    );
    let ev = h.events();
    assert!(ev.contains(&EventKind::AprReceived {
        status: AprStatus::Rejected,
        additional_info: vec![],
        private_data: vec![]
    }));
    // LAP idle again: a new LAP may go out.
    assert!(h.ep.load_alternate_path(h.now, c, alt_path(), &[]).is_ok());
}

#[test]
fn established_path_mig_lap_idle() {
    let mut h = H::new();
    let (c, _their, _tid) = h.established_active();
    h.ep.notify_path_migrated(h.now, c).unwrap();
    assert_eq!(h.ep.lap_state(c), Some(LapState::Idle));
    assert_eq!(h.ep.state(c), Some(State::Established));
}

// ------------------------------------------------------------------------------------------
// Every message in every state: docs/protocol.md §3.6

/// The 13 connection states, in the order of §3.6 (their numbers' order).
const STATES: [State; 13] = State::ALL;

/// The 11 CM messages a connection may receive, in the order of §3.6.
const MESSAGES: [&str; 11] = [
    "REQ", "MRA", "REJ", "REP", "RTU", "DREQ", "DREP", "LAP", "APR", "SIDR_REQ", "SIDR_REP",
];

/// The handler of each message (§3.6's handler column).
fn handler(msg: &str) -> &'static str {
    match msg {
        "REQ" => "setup: `on_req`",
        "MRA" => "setup: `on_mra`",
        "REJ" => "setup: `on_rej`",
        "REP" => "setup: `on_rep`",
        "RTU" => "setup: `on_rtu`",
        "DREQ" => "teardown: `on_dreq`",
        "DREP" => "teardown: `on_drep`",
        "LAP" => "lap: `on_lap`",
        "APR" => "lap: `on_apr`",
        "SIDR_REQ" => "sidr: `on_sidr_req`",
        "SIDR_REP" => "sidr: `on_sidr_rep`",
        _ => "?",
    }
}

/// A connection brought into a state, with what its peer knows of it.
struct InState {
    h: H,
    conn: ConnId,
    /// The peer's comm ID.
    theirs: CommId,
    /// The connection's local QPN (0 before a passive connection accepts).
    qpn: Qpn,
    /// The peer's QPN.
    peer_qpn: Qpn,
}

/// Brings a connection into `state` (passive for REQ_RCVD, MRA_REQ_SENT, REP_SENT and
/// MRA_REP_RCVD; active otherwise; IDLE: it left the table after TimeWait). The endpoint
/// listens on `SID` in every case. `None` for DREQ_RCVD, in which the core never rests.
fn in_state(state: State) -> Option<InState> {
    let mut h = H::new();
    h.ep.listen(SID, ListenOptions::default());
    let active_theirs = CommId(0x7777_0001);
    let (a_qpn, p_qpn) = (Qpn::new(0x11).unwrap(), Qpn::new(0x22).unwrap());
    let (active_peer_qpn, passive_peer_qpn) = (Qpn::new(0x33).unwrap(), Qpn::new(0x99).unwrap());
    let passive = |h: H, conn: ConnId, req: Req, qpn: Qpn| InState {
        h,
        conn,
        theirs: req.local_comm_id,
        qpn,
        peer_qpn: passive_peer_qpn,
    };
    let active = |h: H, conn: ConnId| InState {
        h,
        conn,
        theirs: active_theirs,
        qpn: a_qpn,
        peer_qpn: active_peer_qpn,
    };
    let st = match state {
        State::Idle | State::Established | State::DreqSent | State::Timewait => {
            let (c, their, _) = h.established_active();
            if state != State::Established {
                h.ep.disconnect(h.now, c, &[]).unwrap();
                h.tx();
            }
            if matches!(state, State::Timewait | State::Idle) {
                h.rx(
                    Tid(9),
                    CmMessage::Drep(Drep {
                        local_comm_id: their,
                        remote_comm_id: c,
                        ..Drep::default()
                    }),
                );
            }
            if state == State::Idle {
                h.run_timers(Duration::from_secs(600));
            }
            active(h, c)
        }
        State::ReqSent | State::MraReqRcvd => {
            let (c, req) = h.req_sent();
            let CmMessage::Req(r) = req.msg else {
                panic!("not a REQ")
            };
            if state == State::MraReqRcvd {
                h.rx(
                    req.header.tid,
                    mra_msg(CommId(0), r.local_comm_id, MsgKind::Req),
                );
            }
            active(h, c)
        }
        State::RepRcvd | State::MraRepSent => {
            let (c, _, _) = h.rep_rcvd();
            if state == State::MraRepSent {
                h.ep.mra(h.now, c, TimeoutExp::new(20).unwrap(), &[])
                    .unwrap();
            }
            active(h, c)
        }
        State::ReqRcvd | State::MraReqSent => {
            let (c, req, _) = h.req_rcvd();
            if state == State::MraReqSent {
                h.ep.mra(h.now, c, TimeoutExp::new(20).unwrap(), &[])
                    .unwrap();
            }
            passive(h, c, req, Qpn::default())
        }
        State::RepSent | State::MraRepRcvd => {
            let (c, req, tid, _) = h.rep_sent();
            if state == State::MraRepRcvd {
                h.rx(tid, mra_msg(req.local_comm_id, c, MsgKind::Rep));
            }
            passive(h, c, req, p_qpn)
        }
        State::DreqRcvd => return None,
    };
    let mut st = st;
    st.h.tx();
    st.h.events();
    let now = st.h.ep.state(st.conn);
    assert_eq!(now.unwrap_or(State::Idle), state, "built {state}");
    Some(st)
}

/// The well-formed message `msg` from the connection's peer, with the IDs both sides know
/// (§3.6 says which).
fn message(s: &InState, state: State, msg: &str) -> CmMessage {
    let (ours, theirs) = (s.conn, s.theirs);
    // What the peer waits an answer for: our REQ before the REP, our REP after it, else
    // (ESTABLISHED and later, or our side passive before the REP) a LAP or nothing.
    let kind = match state {
        State::ReqSent | State::MraReqRcvd => MsgKind::Req,
        State::RepSent | State::MraRepRcvd => MsgKind::Rep,
        _ => MsgKind::Other,
    };
    match msg {
        "REQ" => CmMessage::Req(peer_req(theirs, s.peer_qpn)),
        "MRA" => mra_msg(theirs, ours, kind),
        "REJ" => rej_msg(theirs, ours, kind, RejReason::ConsumerReject),
        "REP" => CmMessage::Rep(Rep {
            local_comm_id: theirs,
            remote_comm_id: ours,
            local_qpn: s.peer_qpn,
            local_ca_guid: PEER_GUID,
            target_ack_delay: TimeoutExp::new(10).unwrap(),
            ..Rep::default()
        }),
        "RTU" => rtu(theirs, ours),
        "DREQ" => dreq_msg(theirs, ours, s.qpn),
        "DREP" => CmMessage::Drep(Drep {
            local_comm_id: theirs,
            remote_comm_id: ours,
            ..Drep::default()
        }),
        "LAP" => CmMessage::Lap(Lap {
            local_comm_id: theirs,
            remote_comm_id: ours,
            remote_qpn_eecn: s.qpn,
            ..Lap::default()
        }),
        "APR" => CmMessage::Apr(Apr {
            local_comm_id: theirs,
            remote_comm_id: ours,
            ..Apr::default()
        }),
        "SIDR_REQ" => CmMessage::SidrReq(SidrReq {
            request_id: RequestId(theirs.0),
            service_id: SID,
            ..SidrReq::default()
        }),
        "SIDR_REP" => CmMessage::SidrRep(SidrRep {
            request_id: RequestId(ours.0),
            ..SidrRep::default()
        }),
        m => panic!("no message {m}"),
    }
}

/// What the endpoint does with `msg` in `state`, in §3.6's notation: `drop <DropReason>`,
/// `send <MAD>[+<MAD>]` (a REJ with its reason), `event <EventKind>[+…]` (`Closed` with its
/// `ConnectionError`), `→ <state>` (the connection's new state; IDLE: it left the table),
/// `LAP → <LapState>`, joined by `; `; `nothing` if none of them; `unreachable` for
/// DREQ_RCVD.
fn outcome(state: State, msg: &str) -> String {
    let Some(mut s) = in_state(state) else {
        return "unreachable".into();
    };
    let before = s.h.ep.stats().clone();
    let (st0, lap0) = (s.h.ep.state(s.conn), s.h.ep.lap_state(s.conn));
    let m = message(&s, state, msg);
    s.h.rx(Tid(0x0000_0002_0000_4242), m);
    let mut parts = Vec::new();
    let after = s.h.ep.stats().clone();
    for r in DropReason::ALL {
        if after.dropped(r) > before.dropped(r) {
            parts.push(format!("drop {r:?}"));
        }
    }
    let sent: Vec<String> =
        s.h.tx()
            .iter()
            .map(|m| match &m.msg {
                CmMessage::Rej(r) => format!("REJ({})", r.reason.raw()),
                m => m.name().to_string(),
            })
            .collect();
    if !sent.is_empty() {
        parts.push(format!("send {}", sent.join("+")));
    }
    let events: Vec<String> =
        s.h.events()
            .iter()
            .map(|e| match e {
                EventKind::Closed(err) => format!("Closed({})", variant(&format!("{err:?}"))),
                e => variant(&format!("{e:?}")).to_string(),
            })
            .collect();
    if !events.is_empty() {
        parts.push(format!("event {}", events.join("+")));
    }
    let (st1, lap1) = (s.h.ep.state(s.conn), s.h.ep.lap_state(s.conn));
    assert_ne!(
        st1,
        Some(State::DreqRcvd),
        "{state} × {msg} rests in DREQ_RCVD"
    );
    if st1 != st0 {
        parts.push(format!("→ {}", st1.unwrap_or(State::Idle)));
    }
    if let (Some(a), Some(b)) = (lap0, lap1) {
        if a != b {
            parts.push(format!("LAP → {b:?}"));
        }
    }
    if parts.is_empty() {
        "nothing".into()
    } else {
        parts.join("; ")
    }
}

/// The variant name at the start of a `Debug` rendering.
fn variant(debug: &str) -> &str {
    let end = debug
        .find(|c: char| !c.is_ascii_alphanumeric() && c != '_')
        .unwrap_or(debug.len());
    &debug[..end]
}

/// §3.6 of docs/protocol.md: (state, message) → (outcome, handler), from its table.
fn table_3_6() -> Vec<(String, String, String, String)> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/protocol.md");
    let doc = std::fs::read_to_string(path).expect("docs/protocol.md");
    let section = doc
        .split("\n### 3.6 ")
        .nth(1)
        .expect("protocol.md has a §3.6");
    let section = section.split("\n#").next().unwrap_or(section);
    section
        .lines()
        .filter(|l| l.starts_with("| ") && !l.starts_with("| state ") && !l.starts_with("|---"))
        .map(|l| {
            let cols: Vec<&str> = l.trim_matches('|').split(" | ").map(str::trim).collect();
            assert!(cols.len() >= 4, "§3.6 row with fewer than 4 columns: {l}");
            let unquote = |s: &str| s.trim_matches('`').to_string();
            (
                cols[0].to_string(),
                cols[1].to_string(),
                unquote(cols[2]),
                cols[3].to_string(),
            )
        })
        .collect()
}

/// Every (state, message) pair: what the endpoint does is what its row of docs/protocol.md
/// §3.6 says (the drop reason, the MADs sent, the events, the new state), and the table has
/// exactly one row per pair. `IBCM_PRINT_3_6=1` prints the rows as the endpoint behaves.
#[test]
fn every_message_in_every_state_matches_protocol_md_3_6() {
    let rows = table_3_6();
    let print = std::env::var_os("IBCM_PRINT_3_6").is_some();
    let mut wrong = Vec::new();
    let mut seen = 0;
    for state in STATES {
        for msg in MESSAGES {
            let did = outcome(state, msg);
            if print {
                println!("| {state} | {msg} | `{did}` | {} |", handler(msg));
            }
            let mine: Vec<_> = rows
                .iter()
                .filter(|r| r.0 == state.name() && r.1 == msg)
                .collect();
            match mine.as_slice() {
                [row] => {
                    seen += 1;
                    if row.2 != did {
                        wrong.push(format!(
                            "{state} × {msg}: protocol.md §3.6 says `{}`, the endpoint does `{did}`",
                            row.2
                        ));
                    }
                    if row.3 != handler(msg) {
                        wrong.push(format!(
                            "{state} × {msg}: handler column `{}`, expected `{}`",
                            row.3,
                            handler(msg)
                        ));
                    }
                }
                [] => wrong.push(format!(
                    "{state} × {msg}: no row in protocol.md §3.6 (the endpoint does `{did}`)"
                )),
                _ => wrong.push(format!(
                    "{state} × {msg}: {} rows in protocol.md §3.6",
                    mine.len()
                )),
            }
        }
    }
    if seen != rows.len() {
        wrong.push(format!(
            "protocol.md §3.6 has {} rows, {} of them for a (state, message) pair of the walk",
            rows.len(),
            seen
        ));
    }
    assert!(wrong.is_empty(), "\n{}\n", wrong.join("\n"));
}
