//! Path migration (LAP/APR) through the async API, on tokio's paused clock and the in-memory
//! network: `Connection::load_alt_path` on the sending side, `LapPolicy`,
//! `Connection::next_lap` and `LapRequest` on the receiving side, the alternate path's QP
//! attributes on both, and the REQ's alternate path of `Cm::connect`. Each transport is
//! tapped: the tests assert the messages that went over the wire and their statuses.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]
#![cfg(feature = "rt")]

use std::io;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use ibcm::proto::{
    AcceptParams, CallError, ConnectParams, ConnectionError, EndpointConfig, ListenOptions,
    PeerAddr, ReqInfo, State,
};
use ibcm::qp_attr::{
    alt_path_attr, Connection as QpConn, LapRole, LinkLayer, LocalPort, MigState, QpAttrMask,
    QpState, Side,
};
use ibcm::rt::{
    AprAnswer, Cm, CmError, ConnStatus, Connection, DatagramTransport, LapPolicy, MemNetwork,
    MemTransport,
};
use ibcm_mad::{
    AprStatus, AttrId, CmMessage, FlowLabel, Gid, Guid, Lid, Mad, PathInfo, Qpn, Rate, Req,
    ServiceId, TimeoutExp, U4,
};
use tokio::task::JoinHandle;

mod rt_common;
use rt_common::addr;

/// How long a step may take on the paused clock before the test fails.
const WAIT: Duration = Duration::from_secs(120);

/// `f`, or a panic once it has waited two minutes (paused clock: at once when stuck).
async fn within<F: std::future::Future>(f: F) -> F::Output {
    tokio::time::timeout(WAIT, f).await.expect("timed out")
}

/// Which way a MAD went through a [`Tap`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Dir {
    Sent,
    Received,
    /// Received and dropped before the endpoint saw it ([`Tap::drop_rx`]).
    Dropped,
}

/// What went through a [`Tap`].
type Log = Arc<Mutex<Vec<(Dir, CmMessage)>>>;

/// A memory transport that logs every CM MAD it moves, and drops the received ones of one
/// attribute (a peer that never sees them).
struct Tap {
    inner: MemTransport,
    log: Log,
    drop_rx: Option<AttrId>,
}

impl Tap {
    fn record(&self, dir: Dir, mad: &[u8]) -> Option<AttrId> {
        let m = Mad::parse(mad).ok()?;
        let attr = m.msg.attr_id();
        self.log.lock().unwrap().push((dir, m.msg));
        Some(attr)
    }
}

impl DatagramTransport for Tap {
    async fn send(&mut self, to: PeerAddr, mad: &[u8]) -> io::Result<()> {
        self.record(Dir::Sent, mad);
        self.inner.send(to, mad).await
    }

    async fn recv(&mut self) -> io::Result<(PeerAddr, Bytes)> {
        loop {
            let (from, mad) = self.inner.recv().await?;
            let attr = Mad::parse(&mad).ok().map(|m| m.msg.attr_id());
            if attr.is_some() && attr == self.drop_rx {
                self.record(Dir::Dropped, &mad);
                continue;
            }
            self.record(Dir::Received, &mad);
            return Ok((from, mad));
        }
    }

    fn local_addr(&self) -> PeerAddr {
        self.inner.local_addr()
    }
}

/// The LAPs in `log` that went `dir`.
fn laps(log: &Log, dir: Dir) -> Vec<ibcm_mad::Lap> {
    log.lock()
        .unwrap()
        .iter()
        .filter_map(|(d, m)| match m {
            CmMessage::Lap(l) if *d == dir => Some(*l),
            _ => None,
        })
        .collect()
}

/// The APRs in `log` that went `dir`.
fn aprs(log: &Log, dir: Dir) -> Vec<ibcm_mad::Apr> {
    log.lock()
        .unwrap()
        .iter()
        .filter_map(|(d, m)| match m {
            CmMessage::Apr(a) if *d == dir => Some(*a),
            _ => None,
        })
        .collect()
}

/// One side of a test: its handle and what its transport moved.
struct End {
    cm: Cm,
    log: Log,
}

/// Endpoints `a` (127.0.0.1) and `b` (127.0.0.2, CA GUID 2), tapped; `b` drops the received
/// MADs of `b_drops`. Returns b's address.
fn pair(b_drops: Option<AttrId>) -> (End, End, PeerAddr) {
    let net = MemNetwork::new();
    let a_addr = addr("127.0.0.1:4791");
    let b_addr = addr("127.0.0.2:4791");
    let bind = |at: PeerAddr, seed: u64, guid: u64, drop_rx: Option<AttrId>| {
        let log = Log::default();
        let tap = Tap {
            inner: net.transport(at),
            log: log.clone(),
            drop_rx,
        };
        let (cm, _) = Cm::bind(
            tap,
            EndpointConfig {
                rng_seed: Some(seed),
                local_ca_guid: Guid(guid),
                timewait: Some(Duration::from_millis(100)),
                ..Default::default()
            },
        );
        End { cm, log }
    };
    let a = bind(a_addr, 1, 1, None);
    let b = bind(b_addr, 2, 2, b_drops);
    (a, b, b_addr)
}

fn params(to: PeerAddr) -> ConnectParams {
    let mut p = ConnectParams::new(to, ServiceId(0x42), Qpn::new(0x11).unwrap());
    p.remote_cm_response_timeout = TimeoutExp::new(16).unwrap();
    p.local_cm_response_timeout = TimeoutExp::new(16).unwrap();
    p.packet_life_time = TimeoutExp::new(10).unwrap();
    p.max_cm_retries = U4::new(3).unwrap();
    p
}

/// An InfiniBand alternate path with every field set, written from the active side's (the
/// LAP sender's) view: its port is LID 5, the peer's LID 6.
fn alt_path() -> PathInfo {
    PathInfo {
        local_lid: Lid(5),
        remote_lid: Lid(6),
        local_gid: Gid([0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 5]),
        remote_gid: Gid([0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 6]),
        flow_label: FlowLabel::masked(0x12345),
        packet_rate: Rate::G40,
        traffic_class: 0x20,
        hop_limit: 1,
        sl: U4::masked(3),
        subnet_local: true,
        local_ack_timeout: TimeoutExp::masked(14),
    }
}

/// Everything a side keeps of an established connection: the handle, the REQ and the REP
/// (what `qp_attr` reads).
struct Established {
    conn: Connection,
    req: Req,
    rep: ibcm_mad::Rep,
}

/// Connects `a` to `b` (the kernel's order: `connect_manual`, then `establish`); returns the
/// active and the passive side.
async fn connect(a: &Cm, b: &Cm, b_addr: PeerAddr) -> (Established, Established) {
    let mut l = b
        .listen(ServiceId(0x42), ListenOptions::default())
        .await
        .unwrap();
    let server: JoinHandle<(ReqInfo, ibcm_mad::Rep, Connection)> = tokio::spawn(async move {
        let inc = l.next().await.unwrap();
        let req = inc.request().unwrap().clone();
        let p = AcceptParams::new(Qpn::new(0x22).unwrap());
        let rep = p.rep_fields();
        let conn = inc.accept(p).await.unwrap();
        (req, rep, conn)
    });
    let p = within(a.connect_manual(params(b_addr))).await.unwrap();
    let (req, rep) = (*p.req(), p.rep().rep);
    let active = within(p.establish(&[])).await.unwrap();
    let (b_req, b_rep, passive) = within(server).await.unwrap();
    within(passive.established()).await.unwrap();
    (
        Established {
            conn: active,
            req,
            rep,
        },
        Established {
            conn: passive,
            req: b_req.req,
            rep: b_rep,
        },
    )
}

#[tokio::test(start_paused = true)]
async fn lap_accepted_end_to_end_loads_the_path_on_both_sides() {
    let (a, b, b_addr) = pair(None);
    within(b.cm.set_lap_policy(LapPolicy::Application))
        .await
        .unwrap();
    let (act, pas) = connect(&a.cm, &b.cm, b_addr).await;
    let b_conn = pas.conn.clone();
    let server = tokio::spawn(async move {
        let lap = b_conn.next_lap().await.unwrap();
        assert_eq!(lap.id(), b_conn.id());
        let got = (*lap.path(), lap.private_data().to_vec());
        lap.accept(b"loaded").await.unwrap();
        got
    });
    let apr = within(act.conn.load_alt_path(alt_path(), b"lap pd"))
        .await
        .unwrap();
    assert_eq!(
        apr,
        AprAnswer {
            status: AprStatus::Success,
            additional_info: vec![],
            private_data: b"loaded".to_vec(),
        }
    );
    // The passive side got the path as sent, every field intact.
    let (path, pd) = within(server).await.unwrap();
    assert_eq!(path, alt_path());
    assert_eq!(pd, b"lap pd");

    // On the wire: one LAP from a carrying the path, one APR "success" from b.
    let sent = laps(&a.log, Dir::Sent);
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].alternate_path, alt_path());
    assert_eq!(sent[0].remote_comm_id, pas.conn.id());
    assert_eq!(laps(&b.log, Dir::Received).len(), 1);
    let answered = aprs(&b.log, Dir::Sent);
    assert_eq!(answered.len(), 1);
    assert_eq!(answered[0].ap_status, AprStatus::Success);
    assert_eq!(answered[0].private_data.trimmed(), b"loaded");

    // Both sides derive the alternate path's QP attributes, each towards the other.
    let port = LocalPort::default();
    let active = QpConn::new(
        &act.req,
        &act.rep,
        Side::Active,
        LinkLayer::InfiniBand,
        port,
    );
    let (attr, mask) = alt_path_attr(&active, &alt_path(), LapRole::Sender).unwrap();
    assert_eq!(mask, QpAttrMask::ALT_PATH | QpAttrMask::PATH_MIG_STATE);
    assert_eq!(attr.alt_ah_attr.dlid, Lid(6), "the peer's LID");
    assert_eq!(attr.alt_ah_attr.grh.unwrap().dgid, alt_path().remote_gid);
    assert_eq!(attr.alt_ah_attr.sl, 3);
    assert_eq!(attr.path_mig_state, MigState::Rearm);
    assert_eq!(attr.qp_state, QpState::Rts);
    let passive = QpConn::new(
        &pas.req,
        &pas.rep,
        Side::Passive,
        LinkLayer::InfiniBand,
        port,
    );
    let (pattr, pmask) = alt_path_attr(&passive, &path, LapRole::Receiver).unwrap();
    assert_eq!(pmask, mask);
    assert_eq!(pattr.alt_ah_attr.dlid, Lid(5), "the LAP sender's LID");
    assert_eq!(pattr.alt_ah_attr.grh.unwrap().dgid, alt_path().local_gid);
    assert_eq!(pattr.alt_timeout, 14, "the LAP's ACK timeout - 1 + 1");

    // The QP migrated: both sides report it, and a new exchange may start (either way).
    within(act.conn.notify_path_migrated()).await.unwrap();
    within(pas.conn.notify_path_migrated()).await.unwrap();
    assert_eq!(act.conn.status(), ConnStatus::Established);
    assert_eq!(pas.conn.status(), ConnStatus::Established);
}

#[tokio::test(start_paused = true)]
async fn lap_rejected_with_the_chosen_status() {
    let (a, b, b_addr) = pair(None);
    within(b.cm.set_lap_policy(LapPolicy::Application))
        .await
        .unwrap();
    let (act, pas) = connect(&a.cm, &b.cm, b_addr).await;
    let b_conn = pas.conn.clone();
    let server = tokio::spawn(async move {
        let lap = b_conn.next_lap().await.unwrap();
        lap.reject(AprStatus::InvalidLid, &[0, 6], b"not that LID")
            .await
            .unwrap();
    });
    let err = within(act.conn.load_alt_path(alt_path(), &[]))
        .await
        .unwrap_err();
    match err {
        CmError::LapRejected(AprAnswer {
            status,
            additional_info,
            private_data,
        }) => {
            assert_eq!(status, AprStatus::InvalidLid);
            assert_eq!(additional_info, [0, 6]);
            assert_eq!(private_data, b"not that LID");
        }
        other => panic!("{other:?}"),
    }
    within(server).await.unwrap();
    let answered = aprs(&b.log, Dir::Sent);
    assert_eq!(answered.len(), 1);
    assert_eq!(answered[0].ap_status, AprStatus::InvalidLid);
    assert_eq!(answered[0].ap_status.raw(), 7);
    // The connection stays, and the exchange is over: a new LAP may go out.
    assert_eq!(act.conn.status(), ConnStatus::Established);
    within(act.conn.notify_path_migrated()).await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn lap_times_out_against_a_peer_that_never_answers() {
    // b's transport drops every LAP: its endpoint never sees one, so no APR comes.
    let (a, b, b_addr) = pair(Some(AttrId::Lap));
    let (act, pas) = connect(&a.cm, &b.cm, b_addr).await;
    let err = within(act.conn.load_alt_path(alt_path(), b"anyone?"))
        .await
        .unwrap_err();
    assert!(matches!(err, CmError::LapTimedOut), "{err:?}");
    // The LAP and its three retries (max_cm_retries 3), all lost; no APR.
    let sent = laps(&a.log, Dir::Sent);
    assert_eq!(sent.len(), 4, "{sent:?}");
    assert!(sent.iter().all(|l| l.alternate_path == alt_path()));
    assert_eq!(laps(&b.log, Dir::Dropped).len(), 4);
    assert!(laps(&b.log, Dir::Received).is_empty());
    assert!(aprs(&a.log, Dir::Received).is_empty());
    assert!(aprs(&b.log, Dir::Sent).is_empty());
    // The connection stays established; the exchange is over (a path migration may be
    // reported, which a LAP in progress refuses).
    assert_eq!(act.conn.status(), ConnStatus::Established);
    assert_eq!(pas.conn.status(), ConnStatus::Established);
    within(act.conn.notify_path_migrated()).await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_dropped_lap_request_answers_rejected() {
    let (a, b, b_addr) = pair(None);
    within(b.cm.set_lap_policy(LapPolicy::Application))
        .await
        .unwrap();
    let (act, pas) = connect(&a.cm, &b.cm, b_addr).await;
    let b_conn = pas.conn.clone();
    let server = tokio::spawn(async move {
        // Taken and dropped without an answer.
        let _lap = b_conn.next_lap().await.unwrap();
    });
    let err = within(act.conn.load_alt_path(alt_path(), &[]))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, CmError::LapRejected(a) if a.status == AprStatus::Rejected),
        "{err:?}"
    );
    within(server).await.unwrap();
    let answered = aprs(&b.log, Dir::Sent);
    assert_eq!(answered.len(), 1);
    assert_eq!(answered[0].ap_status, AprStatus::Rejected);
    assert_eq!(answered[0].ap_status.raw(), 3);
    assert!(answered[0].private_data.trimmed().is_empty());
    assert_eq!(
        laps(&a.log, Dir::Sent).len(),
        1,
        "answered before a retransmission"
    );
}

#[tokio::test(start_paused = true)]
async fn by_default_the_driver_answers_unsupported() {
    let (a, b, b_addr) = pair(None);
    // No `set_lap_policy`: the default is `LapPolicy::Unsupported`.
    let (act, pas) = connect(&a.cm, &b.cm, b_addr).await;
    let err = within(act.conn.load_alt_path(alt_path(), b"please"))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, CmError::LapRejected(a) if a.status == AprStatus::Unsupported),
        "{err:?}"
    );
    let answered = aprs(&b.log, Dir::Sent);
    assert_eq!(answered.len(), 1);
    assert_eq!(answered[0].ap_status, AprStatus::Unsupported);
    assert_eq!(answered[0].ap_status.raw(), 2);
    // Nothing is held for the application, which cannot ask for LAPs.
    let err = within(pas.conn.next_lap()).await.unwrap_err();
    assert!(matches!(err, CmError::LapsNotDelegated), "{err:?}");
    // The same once the policy is set back explicitly.
    within(b.cm.set_lap_policy(LapPolicy::Application))
        .await
        .unwrap();
    within(b.cm.set_lap_policy(LapPolicy::Unsupported))
        .await
        .unwrap();
    within(act.conn.notify_path_migrated()).await.unwrap();
    let err = within(act.conn.load_alt_path(alt_path(), &[]))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, CmError::LapRejected(a) if a.status == AprStatus::Unsupported),
        "{err:?}"
    );
    assert_eq!(aprs(&b.log, Dir::Sent).len(), 2);
}

#[tokio::test(start_paused = true)]
async fn load_alt_path_needs_an_established_connection() {
    let (a, b, b_addr) = pair(None);
    let mut l =
        b.cm.listen(ServiceId(0x42), ListenOptions::default())
            .await
            .unwrap();
    tokio::spawn(async move {
        let inc = l.next().await.unwrap();
        let c = inc
            .accept(AcceptParams::new(Qpn::new(0x22).unwrap()))
            .await
            .unwrap();
        let _ = c.closed().await;
    });
    // REP received, no RTU sent: not established yet.
    let p = within(a.cm.connect_manual(params(b_addr))).await.unwrap();
    let conn = a.cm.connection(p.id()).unwrap();
    let err = within(conn.load_alt_path(alt_path(), &[]))
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            CmError::Call(CallError::WrongState {
                op: "load_alternate_path",
                state: State::RepRcvd | State::MraRepSent,
            })
        ),
        "{err:?}"
    );
    // Established, then disconnected: no longer.
    let conn = within(p.establish(&[])).await.unwrap();
    within(conn.disconnect(&[])).await;
    let err = within(conn.load_alt_path(alt_path(), &[]))
        .await
        .unwrap_err();
    assert!(matches!(err, CmError::Call(_)), "{err:?}");
    assert!(laps(&a.log, Dir::Sent).is_empty(), "no LAP went out");
}

#[tokio::test(start_paused = true)]
async fn a_second_lap_while_one_is_outstanding_fails() {
    let (a, b, b_addr) = pair(None);
    within(b.cm.set_lap_policy(LapPolicy::Application))
        .await
        .unwrap();
    let (act, pas) = connect(&a.cm, &b.cm, b_addr).await;
    let first = {
        let c = act.conn.clone();
        tokio::spawn(async move { c.load_alt_path(alt_path(), b"first").await })
    };
    // The first LAP has arrived and waits for b's answer.
    let lap = within(pas.conn.next_lap()).await.unwrap();
    let mut other = alt_path();
    other.remote_lid = Lid(7);
    let err = within(act.conn.load_alt_path(other, b"second"))
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            CmError::Call(CallError::WrongState {
                op: "load_alternate_path",
                state: State::Established,
            })
        ),
        "{err:?}"
    );
    // Nor may b send one while it owes the APR.
    let err = within(pas.conn.load_alt_path(other, &[]))
        .await
        .unwrap_err();
    assert!(matches!(err, CmError::Call(_)), "{err:?}");
    lap.accept(&[]).await.unwrap();
    let apr = within(first).await.unwrap().unwrap();
    assert_eq!(apr.status, AprStatus::Success);
    // Private data over 168 bytes is refused at once too, with no LAP sent.
    let err = within(act.conn.load_alt_path(other, &[0; 169]))
        .await
        .unwrap_err();
    assert!(
        matches!(err, CmError::Call(CallError::TooLong { .. })),
        "{err:?}"
    );
    // Only the first path ever went out.
    let sent = laps(&a.log, Dir::Sent);
    assert!(!sent.is_empty());
    assert!(sent.iter().all(|l| l.alternate_path == alt_path()));
    assert!(laps(&b.log, Dir::Sent).is_empty());
}

#[tokio::test(start_paused = true)]
async fn next_lap_is_cancel_safe_and_ends_with_the_connection() {
    use std::future::Future;
    use std::task::Poll;
    let (a, b, b_addr) = pair(None);
    within(b.cm.set_lap_policy(LapPolicy::Application))
        .await
        .unwrap();
    let (act, pas) = connect(&a.cm, &b.cm, b_addr).await;
    // A `next_lap` polled once (waiting in the driver), not polled again when its LAP comes,
    // then dropped: the LAP is held for the next call.
    let mut fut = Box::pin(pas.conn.next_lap());
    let first = std::future::poll_fn(|cx| Poll::Ready(fut.as_mut().poll(cx).is_pending()));
    assert!(first.await);
    let sending = {
        let c = act.conn.clone();
        tokio::spawn(async move { c.load_alt_path(alt_path(), b"held").await })
    };
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert_eq!(laps(&b.log, Dir::Received).len(), 1, "the LAP arrived");
    drop(fut);
    let lap = within(pas.conn.next_lap()).await.unwrap();
    assert_eq!(lap.private_data(), b"held");
    lap.accept(&[]).await.unwrap();
    assert_eq!(
        within(sending).await.unwrap().unwrap().status,
        AprStatus::Success
    );
    // Nothing more is held: a `next_lap` waits (and, timed out, leaves nothing behind).
    assert!(
        tokio::time::timeout(Duration::from_millis(50), pas.conn.next_lap())
            .await
            .is_err(),
        "no LAP pending"
    );
    // A waiting `next_lap` ends with the connection.
    let waiting = {
        let c = pas.conn.clone();
        tokio::spawn(async move { c.next_lap().await })
    };
    tokio::time::sleep(Duration::from_millis(1)).await;
    within(act.conn.disconnect(b"bye")).await;
    match within(waiting).await.unwrap() {
        Err(CmError::Connection(ConnectionError::Disconnected { by_peer: true, .. })) => {}
        other => panic!("{other:?}"),
    }
    // And a later one fails at once.
    let err = within(pas.conn.next_lap()).await.unwrap_err();
    assert!(matches!(err, CmError::Connection(_)), "{err:?}");
}

#[tokio::test(start_paused = true)]
async fn connect_sends_the_alternate_path_in_the_req() {
    let (a, b, b_addr) = pair(None);
    let mut l =
        b.cm.listen(ServiceId(0x42), ListenOptions::default())
            .await
            .unwrap();
    let server = tokio::spawn(async move {
        let inc = l.next().await.unwrap();
        let req = inc.request().unwrap().req;
        let c = inc
            .accept(AcceptParams::new(Qpn::new(0x22).unwrap()))
            .await
            .unwrap();
        (req, c)
    });
    let mut p = params(b_addr);
    p.alternate_path = Some(alt_path());
    let conn = within(a.cm.connect(p)).await.unwrap();
    let (req, _c) = within(server).await.unwrap();
    assert_eq!(req.alternate_path, alt_path());
    let sent: Vec<Req> = a
        .log
        .lock()
        .unwrap()
        .iter()
        .filter_map(|(d, m)| match m {
            CmMessage::Req(r) if *d == Dir::Sent => Some(*r),
            _ => None,
        })
        .collect();
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].alternate_path, alt_path());
    assert!(sent[0].alternate_path.is_present());
    // Without one the REQ carries none.
    let mut l2 =
        b.cm.listen(ServiceId(0x43), ListenOptions::default())
            .await
            .unwrap();
    let server = tokio::spawn(async move {
        let inc = l2.next().await.unwrap();
        let req = inc.request().unwrap().req;
        let c = inc
            .accept(AcceptParams::new(Qpn::new(0x24).unwrap()))
            .await
            .unwrap();
        (req, c)
    });
    let mut p = params(b_addr);
    p.service_id = ServiceId(0x43);
    p.local_qpn = Qpn::new(0x13).unwrap();
    let _conn2 = within(a.cm.connect(p)).await.unwrap();
    let (req, _c) = within(server).await.unwrap();
    assert!(!req.alternate_path.is_present());
    drop(conn);
}
