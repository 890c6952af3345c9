//! Path migration through in-process daemons on Unix sockets of a scratch directory, their
//! endpoints and the peers on a [`MemNetwork`](crate::rt::MemNetwork).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use ibcm_mad::{AprStatus, Guid, Lid, PathInfo, Qpn, ServiceId, TimeoutExp, U4};
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};

use super::super::hooks::{EventSink, HookFuture, NodeHooks, SessionInfo, XrcListenReq};
use super::super::proto::{
    encode_frame, read_frame, write_frame, ClientMsg, DaemonMsg, Op, WireAccept, WireResult,
    VERSION,
};
use super::super::{NodeServer, ServerConfig};
use super::parse_lap_body;
use crate::proto::{AcceptParams, CallError, ConnectParams, EndpointConfig, ListenOptions};
use crate::rt::{Cm, CmError, Connection, LapPolicy, MemNetwork};

struct NoXrc;

impl NodeHooks for NoXrc {
    fn xrc_listen<'a>(
        &'a self,
        _: SessionInfo,
        _: ServiceId,
        _: XrcListenReq<'a>,
        _: EventSink,
    ) -> HookFuture<'a, Result<(), String>> {
        Box::pin(async { Err("no XRC here".to_owned()) })
    }
    fn xrc_destroy(&self, _: SessionInfo) -> HookFuture<'_, Result<u64, String>> {
        Box::pin(async { Ok(0) })
    }
    fn xrc_unlisten(&self, _: SessionInfo, _: ServiceId) -> HookFuture<'_, ()> {
        Box::pin(async {})
    }
    fn session_ended(&self, _: SessionInfo) -> HookFuture<'_, ()> {
        Box::pin(async {})
    }
}

/// A scratch directory, removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Self {
        let d = std::env::temp_dir().join(format!("ibcm-node-lap-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        Scratch(d)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

const DAEMON: &str = "127.0.0.1:4791";
const PEER: &str = "127.0.0.2:4791";

fn addr(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

/// A daemon serving `dir/daemon.sock`, its endpoint at [`DAEMON`] of `net`.
fn daemon(dir: &Scratch, net: &MemNetwork, cfg: ServerConfig) -> PathBuf {
    let (cm, _) = Cm::bind(
        net.transport(addr(DAEMON).into()),
        EndpointConfig::default(),
    );
    let sock = dir.0.join("daemon.sock");
    let l = tokio::net::UnixListener::bind(&sock).unwrap();
    let server = NodeServer::new(cm, std::sync::Arc::new(NoXrc), cfg, None);
    tokio::spawn(server.serve(l));
    sock
}

/// The in-process peer at [`PEER`], answering its LAPs itself.
async fn peer(net: &MemNetwork) -> Cm {
    let cfg = EndpointConfig {
        local_ca_guid: Guid(2),
        ..EndpointConfig::default()
    };
    let (cm, _) = Cm::bind(net.transport(addr(PEER).into()), cfg);
    cm.set_lap_policy(LapPolicy::Application).await.unwrap();
    cm
}

/// A connect to `to` for `sid` from QP `qpn`, its LAPs retransmitted every ~25 ms, 2
/// retries.
fn params(to: &str, sid: u64, qpn: u32) -> ConnectParams {
    let mut p = ConnectParams::new(addr(to), ServiceId(sid), Qpn::masked(qpn));
    p.packet_life_time = TimeoutExp::masked(10);
    p.remote_cm_response_timeout = TimeoutExp::masked(12);
    p.max_cm_retries = U4::masked(2);
    p
}

/// A path with LIDs `l` → `r`.
fn path(l: u16, r: u16) -> PathInfo {
    PathInfo {
        local_lid: Lid(l),
        remote_lid: Lid(r),
        sl: U4::masked(1),
        local_ack_timeout: TimeoutExp::masked(18),
        ..PathInfo::default()
    }
}

/// Accepts the next REQ of `l` with QP `qpn` and waits for the RTU.
async fn accept(l: &mut crate::rt::Listener, qpn: u32) -> Connection {
    let inc = l.next().await.unwrap();
    let c = inc
        .accept(AcceptParams::new(Qpn::masked(qpn)))
        .await
        .unwrap();
    c.established().await.unwrap();
    c
}

/// A LAP sent by an attached client is answered by the peer's APR, whatever its status;
/// an MRA makes the client wait; the client reports a migration; what cannot be sent is
/// refused at once with the endpoint's own error.
#[tokio::test]
async fn a_client_loads_alternate_paths_through_the_daemon() {
    let dir = Scratch::new("send");
    let net = MemNetwork::new();
    let sock = daemon(&dir, &net, ServerConfig::default());
    let b = peer(&net).await;
    let mut l = b
        .listen(ServiceId(0x42), ListenOptions::default())
        .await
        .unwrap();
    let server = tokio::spawn(async move {
        let conn = accept(&mut l, 0x22).await;
        let lap = conn.next_lap().await.unwrap();
        assert_eq!((*lap.path(), lap.private_data()), (path(3, 7), &b"try"[..]));
        lap.accept(b"loaded").await.unwrap();
        let lap = conn.next_lap().await.unwrap();
        lap.reject(AprStatus::InvalidLid, b"i", b"no")
            .await
            .unwrap();
        let lap = conn.next_lap().await.unwrap();
        lap.mra(TimeoutExp::masked(16)).await.unwrap();
        tokio::time::sleep(Duration::from_millis(150)).await;
        lap.accept(&[]).await.unwrap();
        conn
    });
    let (a, _t) = Cm::attach(&sock).await.unwrap();
    let conn = a.connect(params(PEER, 0x42, 0x11)).await.unwrap();
    let apr = conn.load_alt_path(path(3, 7), b"try").await.unwrap();
    assert_eq!(
        (apr.status, apr.private_data),
        (AprStatus::Success, b"loaded".to_vec())
    );
    let e = conn.load_alt_path(path(4, 8), &[]).await.unwrap_err();
    let CmError::LapRejected(apr) = e else {
        panic!("{e:?}");
    };
    assert_eq!(
        (apr.status, apr.additional_info, apr.private_data),
        (AprStatus::InvalidLid, b"i".to_vec(), b"no".to_vec())
    );
    // Answered after 150 ms, within the MRA's 268 ms: without it the LAP's three tries
    // of ~25 ms would have run out.
    let apr = conn.load_alt_path(path(5, 9), &[]).await.unwrap();
    assert_eq!(apr.status, AprStatus::Success);
    conn.notify_path_migrated().await.unwrap();
    let e = conn.load_alt_path(path(3, 7), &[0; 169]).await.unwrap_err();
    assert!(
        matches!(
            e,
            CmError::Call(CallError::TooLong {
                what: "LAP private data",
                len: 169,
                max: 168
            })
        ),
        "{e:?}"
    );
    let passive = server.await.unwrap();
    conn.disconnect(&[]).await;
    passive.closed().await;
    // A connection that has ended: the endpoint's error, through the daemon.
    let e = conn.load_alt_path(path(3, 7), &[]).await.unwrap_err();
    assert!(matches!(e, CmError::Call(_)), "{e:?}");
}

/// A LAP nobody answers times out at the client (the connection stays); while it is
/// under way, a second LAP and a migration are refused with the endpoint's `WrongState`.
#[tokio::test]
async fn a_lap_nobody_answers_times_out() {
    let dir = Scratch::new("timeout");
    let net = MemNetwork::new();
    let sock = daemon(&dir, &net, ServerConfig::default());
    let b = peer(&net).await;
    let mut l = b
        .listen(ServiceId(0x42), ListenOptions::default())
        .await
        .unwrap();
    let server = tokio::spawn(async move { accept(&mut l, 0x22).await });
    let (a, _t) = Cm::attach(&sock).await.unwrap();
    let conn = a.connect(params(PEER, 0x42, 0x11)).await.unwrap();
    let _passive = server.await.unwrap();
    let first = {
        let conn = conn.clone();
        tokio::spawn(async move { conn.load_alt_path(path(3, 7), &[]).await })
    };
    tokio::time::sleep(Duration::from_millis(5)).await;
    let busy =
        |r: Result<(), CmError>| matches!(r, Err(CmError::Call(CallError::WrongState { .. })));
    assert!(busy(conn.load_alt_path(path(4, 8), &[]).await.map(drop)));
    assert!(busy(conn.notify_path_migrated().await));
    let t0 = tokio::time::Instant::now();
    let r = first.await.unwrap();
    assert!(matches!(r, Err(CmError::LapTimedOut)), "{r:?}");
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
    // The exchange is over, the connection stays.
    conn.notify_path_migrated().await.unwrap();
    assert!(matches!(a.connection_count().await, Ok(1)));
}

/// A client that asks for its LAPs gets those of its own connections (passive and
/// active) and answers them: accept, reject, an MRA first, a `LapRequest` dropped
/// ("rejected"); another client's connections are answered "unsupported" by the
/// daemon; going back to "unsupported" ends the waiting `next_lap`s.
#[tokio::test]
async fn a_client_answers_its_own_laps_when_it_asks() {
    let dir = Scratch::new("answer");
    let net = MemNetwork::new();
    let sock = daemon(&dir, &net, ServerConfig::default());
    let b = peer(&net).await;
    let (c1, _t1) = Cm::attach(&sock).await.unwrap();
    let (c2, _t2) = Cm::attach(&sock).await.unwrap();
    c1.set_lap_policy(LapPolicy::Application).await.unwrap();
    let mut l1 = c1
        .listen(ServiceId(0x51), ListenOptions::default())
        .await
        .unwrap();
    let mut l2 = c2
        .listen(ServiceId(0x52), ListenOptions::default())
        .await
        .unwrap();
    let s1 = tokio::spawn(async move { accept(&mut l1, 0x31).await });
    let s2 = tokio::spawn(async move { accept(&mut l2, 0x32).await });
    let b1 = b.connect(params(DAEMON, 0x51, 0x41)).await.unwrap();
    let b2 = b.connect(params(DAEMON, 0x52, 0x42)).await.unwrap();
    let (p1, p2) = (s1.await.unwrap(), s2.await.unwrap());
    // c2 did not ask: the daemon answers as before.
    let e = b2.load_alt_path(path(3, 7), &[]).await.unwrap_err();
    assert!(
        matches!(&e, CmError::LapRejected(a) if a.status == AprStatus::Unsupported),
        "{e:?}"
    );
    assert!(matches!(
        p2.next_lap().await,
        Err(CmError::LapsNotDelegated)
    ));
    // c1 answers its own.
    let answer = tokio::spawn(async move {
        let lap = p1.next_lap().await.unwrap();
        assert_eq!((*lap.path(), lap.private_data()), (path(3, 7), &b"one"[..]));
        lap.accept(b"ok").await.unwrap();
        let lap = p1.next_lap().await.unwrap();
        lap.reject(AprStatus::InvalidGid, &[], b"no").await.unwrap();
        let lap = p1.next_lap().await.unwrap();
        lap.mra(TimeoutExp::masked(16)).await.unwrap();
        tokio::time::sleep(Duration::from_millis(150)).await;
        lap.accept(&[]).await.unwrap();
        // Dropped unanswered: "rejected".
        drop(p1.next_lap().await.unwrap());
        p1
    });
    let apr = b1.load_alt_path(path(3, 7), b"one").await.unwrap();
    assert_eq!(apr.private_data, b"ok");
    let e = b1.load_alt_path(path(3, 7), &[]).await.unwrap_err();
    assert!(
        matches!(&e, CmError::LapRejected(a) if a.status == AprStatus::InvalidGid && a.private_data == b"no"),
        "{e:?}"
    );
    assert!(
        b1.load_alt_path(path(3, 7), &[]).await.is_ok(),
        "after an MRA"
    );
    let e = b1.load_alt_path(path(3, 7), &[]).await.unwrap_err();
    assert!(
        matches!(&e, CmError::LapRejected(a) if a.status == AprStatus::Rejected),
        "{e:?}"
    );
    let p1 = answer.await.unwrap();
    // c1's active connection: delegated from its connect on.
    let mut lb = b
        .listen(ServiceId(0x53), ListenOptions::default())
        .await
        .unwrap();
    let sb = tokio::spawn(async move { accept(&mut lb, 0x33).await });
    let a1 = c1.connect(params(PEER, 0x53, 0x34)).await.unwrap();
    let pb = sb.await.unwrap();
    let answer = tokio::spawn(async move {
        let lap = a1.next_lap().await.unwrap();
        lap.accept(&[]).await.unwrap();
        a1
    });
    assert!(pb.load_alt_path(path(6, 9), &[]).await.is_ok());
    let a1 = answer.await.unwrap();
    // Back to "unsupported": a waiting next_lap ends, the daemon answers again.
    let waiting = tokio::spawn(async move { p1.next_lap().await.map(drop) });
    tokio::time::sleep(Duration::from_millis(20)).await;
    c1.set_lap_policy(LapPolicy::Unsupported).await.unwrap();
    let r = waiting.await.unwrap();
    assert!(matches!(r, Err(CmError::LapsNotDelegated)), "{r:?}");
    let e = pb.load_alt_path(path(6, 9), &[]).await.unwrap_err();
    assert!(
        matches!(&e, CmError::LapRejected(a) if a.status == AprStatus::Unsupported),
        "{e:?}"
    );
    assert!(matches!(
        a1.next_lap().await,
        Err(CmError::LapsNotDelegated)
    ));
    drop(b1);
}

/// A raw session: hello said; its reader and writer.
async fn raw(sock: &Path) -> (OwnedReadHalf, OwnedWriteHalf) {
    let s = tokio::net::UnixStream::connect(sock).await.unwrap();
    let (mut rd, mut wr) = s.into_split();
    send(
        &mut wr,
        0,
        Op::Hello {
            version: VERSION,
            addr: true,
        },
    )
    .await;
    match read_frame::<DaemonMsg, _>(&mut rd).await.unwrap() {
        DaemonMsg::Reply {
            result: WireResult::Hello { apm, .. },
            ..
        } => assert_eq!(apm, 1024, "the hello says how many"),
        other => panic!("{other:?}"),
    }
    (rd, wr)
}

/// The next message (10 s at most).
async fn next(rd: &mut OwnedReadHalf) -> DaemonMsg {
    tokio::time::timeout(Duration::from_secs(10), read_frame::<DaemonMsg, _>(rd))
        .await
        .expect("a message within 10 s")
        .unwrap()
}

async fn send(wr: &mut OwnedWriteHalf, seq: u64, op: Op) {
    let f = encode_frame(&ClientMsg { seq, op }).unwrap();
    write_frame(wr, &f).await.unwrap();
}

/// A raw client that answers its LAPs gets each after the connection's `established`
/// status; when it goes with the LAP unanswered, the daemon answers it "rejected" at
/// once (the peer does not wait for its LAP's timeout, about a minute here), then the
/// connection's DREQ follows.
#[tokio::test]
async fn a_session_that_goes_has_its_held_laps_rejected() {
    let dir = Scratch::new("gone");
    let net = MemNetwork::new();
    let sock = daemon(&dir, &net, ServerConfig::default());
    let b = peer(&net).await;
    let (mut rd, mut wr) = raw(&sock).await;
    send(&mut wr, 1, Op::LapPolicy { application: true }).await;
    let listen = Op::Listen {
        service_id: 0x61,
        transports: Vec::new(),
    };
    send(&mut wr, 2, listen).await;
    for seq in [1, 2] {
        match next(&mut rd).await {
            DaemonMsg::Reply {
                seq: s,
                result: WireResult::Ok,
            } if s == seq => {}
            other => panic!("{other:?}"),
        }
    }
    // Default timeouts: the LAP would wait 15 retries of ~4 s.
    let p = ConnectParams::new(addr(DAEMON), ServiceId(0x61), Qpn::masked(0x71));
    let active = tokio::spawn(async move {
        let conn = b.connect(p).await.unwrap();
        let t0 = tokio::time::Instant::now();
        let r = conn.load_alt_path(path(3, 7), b"held").await;
        let why = conn.closed().await;
        (r, t0.elapsed(), why)
    });
    let mut seen = Vec::new();
    let lap = loop {
        match next(&mut rd).await {
            DaemonMsg::Incoming { conn, .. } => {
                let params = WireAccept::from_params(&AcceptParams::new(Qpn::masked(0x72)));
                send(&mut wr, 3, Op::Accept { conn, params }).await;
            }
            DaemonMsg::Status { status, .. } => seen.push(format!("{status:?}")),
            DaemonMsg::Lap { lap, .. } => break lap,
            DaemonMsg::Reply { result, .. } => {
                assert!(matches!(result, WireResult::Ok), "{result:?}")
            }
            other => panic!("{other:?}"),
        }
    };
    assert_eq!(seen, ["Established"], "the LAP comes after the status");
    assert_eq!(parse_lap_body(&lap), Ok((path(3, 7), b"held".to_vec())));
    drop((rd, wr));
    let (r, took, why) = active.await.unwrap();
    assert!(
        matches!(&r, Err(CmError::LapRejected(a)) if a.status == AprStatus::Rejected),
        "{r:?}"
    );
    assert!(took < Duration::from_secs(2), "{took:?}");
    assert!(
        matches!(
            why,
            crate::proto::ConnectionError::Disconnected { by_peer: true, .. }
        ),
        "{why:?}"
    );
}

/// At most `max_laps` LAP exchanges per session and `max_laps_per_user` per user: a LAP
/// over either is answered "rejected" by the daemon, a LAP to send is refused; a place is
/// given back with the answer.
#[tokio::test]
async fn lap_exchanges_are_bounded_per_session_and_user() {
    let dir = Scratch::new("quota");
    let net = MemNetwork::new();
    let cfg = ServerConfig {
        max_laps: 1,
        max_laps_per_user: 2,
        ..ServerConfig::default()
    };
    let sock = daemon(&dir, &net, cfg);
    let b = peer(&net).await;
    let mut clients = Vec::new();
    for (i, sid) in [0x81u64, 0x82, 0x83].into_iter().enumerate() {
        let (c, t) = Cm::attach(&sock).await.unwrap();
        c.set_lap_policy(LapPolicy::Application).await.unwrap();
        let mut l = c
            .listen(ServiceId(sid), ListenOptions::default())
            .await
            .unwrap();
        let n = u32::try_from(i).unwrap();
        let s = tokio::spawn(async move {
            let x = accept(&mut l, 0x90 + 2 * n).await;
            let y = accept(&mut l, 0x91 + 2 * n).await;
            (l, x, y)
        });
        let bx = b.connect(params(DAEMON, sid, 0xa0 + 2 * n)).await.unwrap();
        let by = b.connect(params(DAEMON, sid, 0xa1 + 2 * n)).await.unwrap();
        let (_l, x, y) = s.await.unwrap();
        clients.push((c, t, bx, by, x, y));
    }
    let rejected = |r: Result<crate::rt::AprAnswer, CmError>| matches!(&r, Err(CmError::LapRejected(a)) if a.status == AprStatus::Rejected);
    // Session 0 holds one LAP: its second connection's is over its quota.
    let (_, _, b0x, b0y, x0, y0) = &clients[0];
    let held0 = {
        let b0x = b0x.clone();
        tokio::spawn(async move { b0x.load_alt_path(path(3, 7), &[]).await })
    };
    let lap0 = x0.next_lap().await.unwrap();
    assert!(rejected(b0y.load_alt_path(path(3, 7), &[]).await));
    // ... and it may not send one either.
    let e = y0.load_alt_path(path(4, 8), &[]).await.unwrap_err();
    assert!(
        matches!(&e, CmError::Refused(w) if w == "quota: 1 LAP exchanges"),
        "{e:?}"
    );
    // Session 1 holds one: the user's two. Session 2's is over the user's quota.
    let (_, _, b1x, ..) = &clients[1];
    let held1 = {
        let b1x = b1x.clone();
        tokio::spawn(async move { b1x.load_alt_path(path(3, 7), &[]).await })
    };
    let lap1 = clients[1].4.next_lap().await.unwrap();
    let (_, _, b2x, _, x2, _) = &clients[2];
    assert!(rejected(b2x.load_alt_path(path(3, 7), &[]).await));
    let uid = {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata("/proc/self").unwrap().uid()
    };
    let e = x2.load_alt_path(path(4, 8), &[]).await.unwrap_err();
    assert!(
        matches!(&e, CmError::Refused(w) if *w == format!("quota: 2 LAP exchanges of uid {uid}")),
        "{e:?}"
    );
    // Answered: the places are given back.
    lap0.accept(&[]).await.unwrap();
    lap1.accept(&[]).await.unwrap();
    assert!(held0.await.unwrap().is_ok());
    assert!(held1.await.unwrap().is_ok());
    let answer = {
        let x2 = x2.clone();
        tokio::spawn(async move { x2.next_lap().await.unwrap().accept(&[]).await })
    };
    assert!(b2x.load_alt_path(path(3, 7), &[]).await.is_ok());
    answer.await.unwrap().unwrap();
    // A LAP sent counts too, until its APR: the peer answers it.
    let peer_side = {
        let b0y = b0y.clone();
        tokio::spawn(async move { b0y.next_lap().await.unwrap().accept(&[]).await })
    };
    assert!(y0.load_alt_path(path(4, 8), &[]).await.is_ok());
    peer_side.await.unwrap().unwrap();
}
