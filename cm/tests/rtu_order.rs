//! The kernel's QP ordering through the async API, on tokio's paused clock: with
//! `Cm::connect_manual` no RTU goes out before the application calls `establish` (the passive
//! side stays in REP_SENT, not established), `reject` and a dropped `PendingConnection` send a
//! REJ of the REP, and the pending REQ and REP give `qp_attr` both QPNs and PSNs.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]
#![cfg(feature = "rt")]

use std::time::Duration;

use ibcm::proto::{AcceptParams, ConnectParams, ConnectionError, ListenOptions, PeerAddr, ReqInfo};
use ibcm::qp_attr::{qp_attr, Connection as QpConn, LinkLayer, LocalPort, QpState, Side};
use ibcm::rt::{Cm, CmError, ConnStatus, Connection, MemNetwork, PendingConnection};
use ibcm_mad::{Psn, Qpn, RejReason, ServiceId, TimeoutExp, U4};
use tokio::task::JoinHandle;

mod rt_common;
use rt_common::pair;

/// How long a step may take on the paused clock before the test fails.
const WAIT: std::time::Duration = std::time::Duration::from_secs(120);

/// `f`, or a panic once it has waited two minutes (paused clock: at once when stuck).
async fn within<F: std::future::Future>(f: F) -> F::Output {
    tokio::time::timeout(WAIT, f).await.expect("timed out")
}

const A_PSN: u32 = 0x123456;
const B_PSN: u32 = 0xabcdef;

fn params(to: PeerAddr) -> ConnectParams {
    let mut p = ConnectParams::new(to, ServiceId(0x42), Qpn::new(0x11).unwrap());
    p.remote_cm_response_timeout = TimeoutExp::new(16).unwrap();
    p.local_cm_response_timeout = TimeoutExp::new(16).unwrap();
    p.packet_life_time = TimeoutExp::new(10).unwrap();
    p.max_cm_retries = U4::new(3).unwrap();
    p.starting_psn = Some(Psn::masked(A_PSN));
    p
}

/// A listener on `b` that accepts one REQ (QPN 0x22, PSN `B_PSN`) and hands back the REQ as
/// received and the passive connection.
async fn serve_one(b: &Cm) -> JoinHandle<(ReqInfo, Connection)> {
    let mut l = b
        .listen(ServiceId(0x42), ListenOptions::default())
        .await
        .unwrap();
    tokio::spawn(async move {
        let inc = l.next().await.unwrap();
        let req = inc.request().unwrap().clone();
        let mut p = AcceptParams::new(Qpn::new(0x22).unwrap());
        p.starting_psn = Psn::masked(B_PSN);
        let conn = inc.accept(p).await.unwrap();
        (req, conn)
    })
}

/// Connects manually; returns the pending connection, the REQ as the peer got it and the
/// passive connection.
async fn pending() -> (Cm, Cm, PendingConnection, ReqInfo, Connection) {
    let net = MemNetwork::new();
    let (a, b, b_addr) = pair(&net);
    let server = serve_one(&b).await;
    let p = within(a.connect_manual(params(b_addr))).await.unwrap();
    let (req, s) = within(server).await.unwrap();
    (a, b, p, req, s)
}

#[tokio::test(start_paused = true)]
async fn no_rtu_before_establish() {
    let (a, b, p, _req, s) = pending().await;
    assert_eq!(p.rep().remote_qpn, Qpn::new(0x22).unwrap());
    assert_eq!(p.rep().rep.starting_psn, Psn::masked(B_PSN));
    // The application takes its time (its QP work); the passive side retransmits its REP and
    // gets MRAs, but no RTU.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(s.status(), ConnStatus::Connecting);
    let sb = b.stats().await.unwrap().endpoint;
    assert_eq!(sb.established, 0);
    assert!(sb.retransmits >= 1, "{sb:?}");
    assert_eq!(
        sb.mra_received,
        sb.rx - 1,
        "only the REQ and MRAs arrived: {sb:?}"
    );
    let sa = a.stats().await.unwrap().endpoint;
    assert_eq!(sa.established, 0);
    assert_eq!(
        sa.tx,
        1 + sa.mra_sent,
        "only the REQ and MRAs went out: {sa:?}"
    );

    let rx_before = sb.rx;
    let c = within(p.establish(b"rtu")).await.unwrap();
    assert_eq!(c.status(), ConnStatus::Established);
    assert_eq!(c.rep().unwrap().remote_qpn, Qpn::new(0x22).unwrap());
    within(s.established()).await.unwrap();
    assert_eq!(s.status(), ConnStatus::Established);
    // The passive side has the RTU's private data (issue 26 §1.3); the active side's
    // connection has its peer's, the REP's, and no RTU's.
    assert_eq!(s.rtu_private_data(), b"rtu");
    assert!(c.rtu_private_data().is_empty());
    let sb = b.stats().await.unwrap().endpoint;
    assert_eq!(sb.rx, rx_before + 1, "the RTU");
    assert_eq!(sb.established, 1);
    assert!(matches!(
        within(c.disconnect(&[])).await,
        ConnectionError::Disconnected { by_peer: false, .. }
    ));
    assert!(matches!(
        within(s.closed()).await,
        ConnectionError::Disconnected { by_peer: true, .. }
    ));
    let _ = a;
}

#[tokio::test(start_paused = true)]
async fn establish_at_once_connects_both_sides() {
    let (_a, _b, p, _req, s) = pending().await;
    assert_eq!(s.status(), ConnStatus::Connecting);
    let c = within(p.establish(&[])).await.unwrap();
    within(c.established()).await.unwrap();
    within(s.established()).await.unwrap();
    // An RTU without private data: none on the passive side.
    assert!(s.rtu_private_data().is_empty());
}

#[tokio::test(start_paused = true)]
async fn reject_after_rep_reaches_the_peer() {
    let (a, _b, p, _req, s) = pending().await;
    let id = p.id();
    p.reject(RejReason::NoQp, b"ari", b"no QP for you")
        .await
        .unwrap();
    match within(s.closed()).await {
        ConnectionError::Rejected {
            reason,
            ari,
            private_data,
        } => {
            assert_eq!(reason, RejReason::NoQp);
            assert_eq!(ari, b"ari");
            assert_eq!(private_data, b"no QP for you");
        }
        other => panic!("{other:?}"),
    }
    // No TimeWait on the rejecting side.
    let c = a.connection(id);
    assert!(c.is_none(), "the rejected connection left the table");
    assert_eq!(a.connection_count().await.unwrap(), 0);
}

#[tokio::test(start_paused = true)]
async fn dropping_the_pending_connection_rejects_the_rep() {
    let (a, _b, p, _req, s) = pending().await;
    drop(p);
    match within(s.closed()).await {
        ConnectionError::Rejected { reason, .. } => {
            assert_eq!(reason, RejReason::ConsumerReject);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(a.stats().await.unwrap().endpoint.rej_sent, 1);
    assert_eq!(a.connection_count().await.unwrap(), 0);
}

#[tokio::test(start_paused = true)]
async fn dropping_connect_manual_before_the_rep_gives_up() {
    let net = MemNetwork::new();
    let (a, b, b_addr) = pair(&net);
    let mut l = b
        .listen(ServiceId(0x42), ListenOptions::default())
        .await
        .unwrap();
    let a2 = a.clone();
    let connecting = tokio::spawn(async move { a2.connect_manual(params(b_addr)).await });
    // The REQ arrives; nobody answers it yet.
    let inc = l.next().await.unwrap();
    connecting.abort();
    assert!(connecting.await.unwrap_err().is_cancelled());
    tokio::time::sleep(Duration::from_millis(10)).await;
    // The active side gave up the attempt (REJ 4, timeout): the accept now finds no REQ.
    assert_eq!(a.connection_count().await.unwrap(), 0);
    assert_eq!(a.stats().await.unwrap().endpoint.rej_sent, 1);
    assert!(inc
        .accept(AcceptParams::new(Qpn::new(0x22).unwrap()))
        .await
        .is_err());
}

#[tokio::test(start_paused = true)]
async fn connect_manual_reports_a_rejected_req() {
    let net = MemNetwork::new();
    let (a, b, b_addr) = pair(&net);
    let mut l = b
        .listen(ServiceId(0x42), ListenOptions::default())
        .await
        .unwrap();
    tokio::spawn(async move {
        let inc = l.next().await.unwrap();
        inc.reject(RejReason::NoResources, &[], &[]).await.unwrap();
    });
    match within(a.connect_manual(params(b_addr))).await {
        Err(CmError::Connection(ConnectionError::Rejected { reason, .. })) => {
            assert_eq!(reason, RejReason::NoResources);
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn qp_attr_from_the_pending_req_and_rep() {
    let (_a, _b, p, req, s) = pending().await;
    // The REQ this side sent is the one the passive side received.
    assert_eq!(*p.req(), req.req);
    assert_eq!(p.req().starting_psn, Psn::masked(A_PSN));
    let rep = &p.rep().rep;
    let conn = QpConn::new(
        p.req(),
        rep,
        Side::Active,
        LinkLayer::Ethernet,
        LocalPort::default(),
    );
    let (rtr, _) = qp_attr(&conn, QpState::Rtr).unwrap();
    assert_eq!(rtr.dest_qp_num, Qpn::new(0x22).unwrap(), "the peer's QPN");
    assert_eq!(rtr.rq_psn, Psn::masked(A_PSN), "our REQ's PSN");
    assert_eq!(rtr.max_dest_rd_atomic, rep.initiator_depth);
    let (rts, _) = qp_attr(&conn, QpState::Rts).unwrap();
    assert_eq!(rts.sq_psn, Psn::masked(B_PSN), "the peer's starting PSN");
    assert_eq!(rts.max_rd_atomic, rep.responder_resources);
    // The peer's view is the mirror image.
    let peer = QpConn::new(
        &req.req,
        rep,
        Side::Passive,
        LinkLayer::Ethernet,
        LocalPort::default(),
    );
    let (peer_rtr, _) = qp_attr(&peer, QpState::Rtr).unwrap();
    assert_eq!(peer_rtr.dest_qp_num, Qpn::new(0x11).unwrap());
    assert_eq!(peer_rtr.rq_psn, rts.sq_psn);
    within(p.establish(&[])).await.unwrap();
    within(s.established()).await.unwrap();
}

/// Two endpoints with the same seeds connect (default start PSN) and return the REQ each sent.
async fn default_psn_req() -> (ibcm_mad::Req, ReqInfo) {
    let net = MemNetwork::new();
    let (a, b, b_addr) = pair(&net);
    let server = serve_one(&b).await;
    let mut params = params(b_addr);
    params.starting_psn = None;
    let p = within(a.connect_manual(params)).await.unwrap();
    let (req, s) = within(server).await.unwrap();
    let sent = *p.req();
    within(p.establish(&[])).await.unwrap();
    within(s.established()).await.unwrap();
    (sent, req)
}

#[tokio::test(start_paused = true)]
async fn the_default_start_psn_is_drawn_from_the_seeded_rng() {
    let (sent, received) = default_psn_req().await;
    // The endpoint picked the PSN, and the REQ says so: the active side learns it from
    // `PendingConnection::req` to program its QP.
    assert_eq!(sent, received.req);
    // Drawn from the endpoint's RNG, not 0 (PSN 0 on every connection would be guessable).
    assert_ne!(sent.starting_psn, Psn::default());
    // The same seed draws the same PSN (simulations replay); the next draw is another one.
    let (again, _) = default_psn_req().await;
    assert_eq!(again.starting_psn, sent.starting_psn);
    let net = MemNetwork::new();
    let (a, _b, _) = pair(&net);
    let first = a.random_psn().await.unwrap();
    assert_eq!(first, sent.starting_psn, "connect drew the RNG's first PSN");
}
