//! The `ibcm::rt::Cm` API through a real `ibcmd` process (`Cm::attach`), against a peer
//! endpoint in this process (SIDR and the counters too); a client acting on another client's objects; a client that
//! stops reading.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

mod common;

use std::net::SocketAddr;

use ibcm::proto::{
    AcceptParams, ConnectParams, ConnectionError, EndpointConfig, ListenOptions, SidrRepParams,
    SidrReqParams,
};
use ibcm::rt::node::proto::{
    encode_frame, read_frame, ClientMsg, DaemonMsg, Op, WireCallError, WireResult, VERSION,
};
use ibcm::rt::{Cm, ConnStatus, IncomingKind, UdpTransport};
use ibcm_mad::{Guid, Qkey, Qpn, RejReason, ServiceId, SidrStatus};
use tokio::io::AsyncWriteExt;
use tokio::net::UnixStream;

use common::{daemon, scratch};

fn qpn(n: u32) -> Qpn {
    Qpn::new(n).unwrap()
}

async fn peer(ip: &str) -> (Cm, SocketAddr) {
    let t = UdpTransport::bind(ip.parse().unwrap()).await.unwrap();
    let cfg = EndpointConfig {
        local_ca_guid: Guid(0x77),
        ..EndpointConfig::default()
    };
    (
        Cm::bind(t, cfg).0,
        SocketAddr::new(ip.parse().unwrap(), 4791),
    )
}

/// A raw session: hello, then requests whose replies this test reads itself.
async fn raw(sock: &std::path::Path) -> UnixStream {
    let mut s = UnixStream::connect(sock).await.unwrap();
    let hello = ClientMsg {
        seq: 0,
        op: Op::Hello {
            version: VERSION,
            addr: false,
        },
    };
    s.write_all(&encode_frame(&hello).unwrap()).await.unwrap();
    match read_frame::<DaemonMsg, _>(&mut s).await.unwrap() {
        DaemonMsg::Reply {
            result: WireResult::Ok,
            ..
        } => {}
        other => panic!("{other:?}"),
    }
    s
}

async fn ask(s: &mut UnixStream, seq: u64, op: Op) -> WireResult {
    s.write_all(&encode_frame(&ClientMsg { seq, op }).unwrap())
        .await
        .unwrap();
    loop {
        if let DaemonMsg::Reply { seq: r, result } = read_frame::<DaemonMsg, _>(s).await.unwrap() {
            if r == seq {
                return result;
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cm_api_works_through_the_daemon() {
    let dir = scratch("api");
    let (_d, sock) = daemon(&dir, "a", "127.0.0.71");
    let (p, p_addr) = peer("127.0.0.72").await;
    let d_addr: SocketAddr = "127.0.0.71:4791".parse().unwrap();
    let (cm, _task) = Cm::attach(&sock).await.unwrap();

    // Active side through the daemon, passive in this process.
    let mut pl = p
        .listen(ServiceId(0x10), ListenOptions::default())
        .await
        .unwrap();
    let server = tokio::spawn(async move {
        let mut v = Vec::new();
        for q in [0x501, 0x502, 0x503] {
            let inc = pl.next().await.unwrap();
            v.push(inc.accept(AcceptParams::new(qpn(q))).await.unwrap());
        }
        v
    });
    let c1 = cm
        .connect(ConnectParams::new(p_addr, ServiceId(0x10), qpn(0x101)))
        .await
        .unwrap();
    assert_eq!(c1.status(), ConnStatus::Established);
    assert_eq!(c1.rep().unwrap().remote_qpn, qpn(0x501));
    // connect_manual: the REP first, the RTU when told.
    let pending = cm
        .connect_manual(ConnectParams::new(p_addr, ServiceId(0x10), qpn(0x102)))
        .await
        .unwrap();
    assert_eq!(pending.rep().remote_qpn, qpn(0x502));
    let c2 = pending.establish(b"rtu").await.unwrap();
    // A pending connection dropped: its REP is rejected.
    let dropped = cm
        .connect_manual(ConnectParams::new(p_addr, ServiceId(0x10), qpn(0x103)))
        .await
        .unwrap();
    // This client's connections (the daemon's endpoint may hold others).
    assert_eq!(cm.connection_count().await.unwrap(), 3);
    drop(dropped);
    let passive = server.await.unwrap();
    passive[0].established().await.unwrap();
    passive[1].established().await.unwrap();
    // The RTU's private data reaches the passive side; the automatic RTU has none.
    assert_eq!(passive[1].rtu_private_data(), b"rtu");
    assert!(passive[0].rtu_private_data().is_empty());
    assert!(
        c2.rtu_private_data().is_empty(),
        "the active side's is in its REP"
    );
    assert!(matches!(
        passive[2].closed().await,
        ConnectionError::Rejected { reason, .. } if reason == RejReason::ConsumerReject
    ));
    // Our DREQ; then the peer's.
    assert!(matches!(
        c1.disconnect(b"bye").await,
        ConnectionError::Disconnected { by_peer: false, .. }
    ));
    assert!(matches!(
        passive[0].closed().await,
        ConnectionError::Disconnected { by_peer: true, ref private_data } if private_data == b"bye"
    ));
    passive[1].disconnect(&[]).await;
    assert!(matches!(
        c2.closed().await,
        ConnectionError::Disconnected { by_peer: true, .. }
    ));

    // Passive side through the daemon.
    let mut l = cm
        .listen(ServiceId(0x20), ListenOptions::default())
        .await
        .unwrap();
    let acceptor = tokio::spawn(async move {
        let inc = l.next().await.unwrap();
        assert_eq!(inc.request().unwrap().remote_qpn(), qpn(0x601));
        let c = inc.accept(AcceptParams::new(qpn(0x201))).await.unwrap();
        c.established().await.unwrap();
        // The RTU's private data, forwarded by the daemon with the established status.
        let rtu = c.rtu_private_data();
        let second = l.next().await.unwrap();
        // Dropped unanswered: REJ 28.
        drop(second);
        (rtu, c.closed().await)
    });
    let pc = p
        .connect_manual(ConnectParams::new(d_addr, ServiceId(0x20), qpn(0x601)))
        .await
        .unwrap()
        .establish(b"rtu to the daemon's client")
        .await
        .unwrap();
    let refused = p
        .connect(ConnectParams::new(d_addr, ServiceId(0x20), qpn(0x602)))
        .await;
    assert!(matches!(
        refused,
        Err(ibcm::rt::CmError::Connection(ConnectionError::Rejected { reason, .. }))
            if reason == RejReason::ConsumerReject
    ));
    pc.disconnect(&[]).await;
    let (rtu, end) = acceptor.await.unwrap();
    assert_eq!(rtu, b"rtu to the daemon's client");
    assert!(matches!(
        end,
        ConnectionError::Disconnected { by_peer: true, .. }
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sidr_and_stats_work_through_the_daemon() {
    let dir = scratch("sidr");
    let (_d, sock) = daemon(&dir, "a", "127.0.0.77");
    let (p, p_addr) = peer("127.0.0.78").await;
    let d_addr: SocketAddr = "127.0.0.77:4791".parse().unwrap();
    let (cm, _task) = Cm::attach(&sock).await.unwrap();

    // A client's SIDR_REQ, answered by the peer in this process.
    let mut pl = p
        .listen(ServiceId(0x30), ListenOptions::default())
        .await
        .unwrap();
    let answerer = tokio::spawn(async move {
        let inc = pl.next().await.unwrap();
        let IncomingKind::Sidr(req) = inc.kind() else {
            panic!("not a SIDR_REQ")
        };
        assert_eq!(&req.private_data[..3], b"who");
        let mut rep = SidrRepParams::success(qpn(0x701), Qkey(0x1234));
        rep.private_data = b"me".to_vec();
        inc.sidr_reply(rep).await.unwrap();
    });
    let mut params = SidrReqParams::new(p_addr, ServiceId(0x30));
    params.private_data = b"who".to_vec();
    let a = cm.sidr(params).await.unwrap();
    answerer.await.unwrap();
    assert_eq!(
        (a.status, a.qpn, a.qkey),
        (SidrStatus::Success, qpn(0x701), Qkey(0x1234))
    );
    assert_eq!(&a.private_data[..], b"me");
    // Nobody listens on 0x31: the peer answers "no such service".
    let a = cm
        .sidr(SidrReqParams::new(p_addr, ServiceId(0x31)))
        .await
        .unwrap();
    assert_eq!(a.status, SidrStatus::UnsupportedServiceId);

    // A SIDR_REQ for the client's service reaches its listener; one it drops is answered
    // "rejected".
    let mut l = cm
        .listen(ServiceId(0x40), ListenOptions::default())
        .await
        .unwrap();
    let served = tokio::spawn(async move {
        let inc = l.next().await.unwrap();
        assert!(matches!(inc.kind(), IncomingKind::Sidr(r) if r.service_id == ServiceId(0x40)));
        inc.sidr_reply(SidrRepParams::success(qpn(0x801), Qkey(7)))
            .await
            .unwrap();
        drop(l.next().await.unwrap());
    });
    let a = p
        .sidr(SidrReqParams::new(d_addr, ServiceId(0x40)))
        .await
        .unwrap();
    assert_eq!(
        (a.status, a.qpn, a.qkey),
        (SidrStatus::Success, qpn(0x801), Qkey(7))
    );
    let a = p
        .sidr(SidrReqParams::new(d_addr, ServiceId(0x40)))
        .await
        .unwrap();
    assert_eq!(a.status, SidrStatus::Rejected);
    served.await.unwrap();

    // The daemon endpoint's counters: what it sent and received for this test at least.
    let st = cm.stats().await.unwrap();
    assert!(st.endpoint.rx >= 4 && st.endpoint.tx >= 4, "{st:?}");
    assert!(st.to_json().contains("\"dropped\":{"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quotas_hold_per_client_and_per_user() {
    let dir = scratch("quota");
    let extra = [
        "--max-conns-per-client",
        "2",
        "--max-conns-per-user",
        "3",
        "--max-clients-per-user",
        "2",
    ];
    let (_d, sock) = common::daemon_with(&dir, "a", "127.0.0.79", &extra);
    let (p, p_addr) = peer("127.0.0.80").await;
    let mut pl = p
        .listen(ServiceId(0x50), ListenOptions::default())
        .await
        .unwrap();
    tokio::spawn(async move {
        let mut held = Vec::new();
        let mut q = 0x900;
        while let Some(inc) = pl.next().await {
            q += 1;
            held.push(inc.accept(AcceptParams::new(qpn(q))).await.unwrap());
        }
    });
    let (a, _ta) = Cm::attach(&sock).await.unwrap();
    let (b, _tb) = Cm::attach(&sock).await.unwrap();
    // A third client of the same user is refused at its hello.
    let third = Cm::attach(&sock).await.unwrap_err();
    assert!(
        third.to_string().contains("quota: 2 sessions of uid"),
        "{third}"
    );
    let go = |cm: &Cm, q: u32| {
        let cm = cm.clone();
        async move {
            cm.connect(ConnectParams::new(p_addr, ServiceId(0x50), qpn(q)))
                .await
        }
    };
    let _a1 = go(&a, 0x101).await.unwrap();
    let _a2 = go(&a, 0x102).await.unwrap();
    // The client's own quota.
    match go(&a, 0x103).await {
        Err(ibcm::rt::CmError::Refused(why)) => assert_eq!(why, "quota: 2 connections"),
        other => panic!("{other:?}"),
    }
    let _b1 = go(&b, 0x201).await.unwrap();
    // The user's, over both clients.
    match go(&b, 0x202).await {
        Err(ibcm::rt::CmError::Refused(why)) => {
            assert!(why.starts_with("quota: 3 connections of uid"), "{why}")
        }
        other => panic!("{other:?}"),
    }
    // A client gone frees its share: a new client of the user is served.
    drop((_a1, _a2, a));
    let (c, _tc) = loop {
        // The daemon ends the session when it sees the socket close.
        match Cm::attach(&sock).await {
            Ok(c) => break c,
            Err(e) if e.to_string().contains("quota") => tokio::task::yield_now().await,
            Err(e) => panic!("{e}"),
        }
    };
    let _c1 = go(&c, 0x301).await.unwrap();
}

/// A reserved service ID range belongs to its user: another user's listen there is refused
/// (tests/users.rs runs the other user); the owner listens, CM and XRC.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reserved_service_id_is_its_user_s() {
    let dir = scratch("reserve");
    let me = std::fs::metadata("/proc/self").map(|m| {
        use std::os::unix::fs::MetadataExt;
        m.uid()
    });
    let me = me.unwrap();
    let other = me.wrapping_add(1);
    let r1 = format!("0x60-0x6f={other}");
    let r2 = format!("0x70={me}");
    let extra = ["--reserve", &r1, "--reserve", &r2];
    let (_d, sock) = common::daemon_with(&dir, "a", "127.0.0.86", &extra);
    let (cm, _task) = Cm::attach(&sock).await.unwrap();
    match cm.listen(ServiceId(0x65), ListenOptions::default()).await {
        Err(ibcm::rt::CmError::Refused(why)) => {
            assert!(why.contains(&format!("reserved for uid {other}")), "{why}")
        }
        other => panic!("{other:?}"),
    }
    let mut s = raw(&sock).await;
    let xrc = Op::XrcListen {
        service_id: 0x6f,
        policy: "explicit".into(),
        srqns: vec![1],
        domain: None,
        tgt_qpn: None,
    };
    assert!(matches!(
        ask(&mut s, 1, xrc).await,
        WireResult::Refused { .. }
    ));
    // Outside the range, and the range reserved for this user: served.
    let _l1 = cm
        .listen(ServiceId(0x5f), ListenOptions::default())
        .await
        .unwrap();
    let _l2 = cm
        .listen(ServiceId(0x70), ListenOptions::default())
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_acts_only_on_its_own_objects() {
    let dir = scratch("owner");
    let (_d, sock) = daemon(&dir, "a", "127.0.0.73");
    let (p, p_addr) = peer("127.0.0.74").await;
    let mut pl = p
        .listen(ServiceId(0x10), ListenOptions::default())
        .await
        .unwrap();
    tokio::spawn(async move {
        while let Some(inc) = pl.next().await {
            let _c = inc.accept(AcceptParams::new(qpn(0x701))).await;
            std::future::pending::<()>().await;
        }
    });
    let (cm, _task) = Cm::attach(&sock).await.unwrap();
    let conn = cm
        .connect(ConnectParams::new(p_addr, ServiceId(0x10), qpn(0x301)))
        .await
        .unwrap();
    let _l = cm
        .listen(ServiceId(0x30), ListenOptions::default())
        .await
        .unwrap();

    let mut other = raw(&sock).await;
    let id = conn.id().0;
    for (seq, op) in [
        (
            1,
            Op::Disconnect {
                conn: id,
                private_data: vec![],
            },
        ),
        (
            2,
            Op::Reject {
                conn: id,
                reason: 28,
                ari: vec![],
                private_data: vec![],
            },
        ),
        (
            3,
            Op::Establish {
                conn: id,
                private_data: vec![],
            },
        ),
        (
            4,
            Op::Mra {
                conn: id,
                service_timeout: 20,
            },
        ),
    ] {
        match ask(&mut other, seq, op).await {
            WireResult::CallError(WireCallError::UnknownConnection { conn }) => {
                assert_eq!(conn, id)
            }
            r => panic!("another client's connection: {r:?}"),
        }
    }
    match ask(
        &mut other,
        5,
        Op::Listen {
            service_id: 0x30,
            transports: vec![],
        },
    )
    .await
    {
        WireResult::Refused { why } => assert!(why.contains("another client"), "{why}"),
        r => panic!("another client's service ID: {r:?}"),
    }
    match ask(&mut other, 6, Op::Len).await {
        WireResult::Value { value } => assert_eq!(value, 0),
        r => panic!("{r:?}"),
    }
    assert_eq!(conn.status(), ConnStatus::Established);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_stops_reading_is_dropped_alone() {
    let dir = scratch("stuck");
    let (mut d, sock) = daemon(&dir, "a", "127.0.0.75");
    let (cm, _task) = Cm::attach(&sock).await.unwrap();
    let mut stuck = raw(&sock).await;
    // Requests without reading a reply, until the daemon gives up on this client.
    let frame = encode_frame(&ClientMsg {
        seq: 9,
        op: Op::RandomPsn,
    })
    .unwrap();
    let flood = tokio::spawn(async move {
        let burst: Vec<u8> = frame
            .iter()
            .copied()
            .cycle()
            .take(frame.len() * 1000)
            .collect();
        for _ in 0..1000 {
            if stuck.write_all(&burst).await.is_err() {
                return true;
            }
        }
        false
    });
    // Meanwhile the other client is served.
    for _ in 0..100 {
        cm.random_psn().await.unwrap();
    }
    // (The daemon's handle comes back: dropping it would stop the daemon.)
    let (line, _d) = tokio::task::spawn_blocking(move || {
        let l = d.wait_err(|l| l.contains("stuck: its queue is full"), "'stuck'");
        (l, d)
    })
    .await
    .unwrap();
    assert!(line.contains("client gone"), "{line}");
    assert!(
        flood.await.unwrap(),
        "the stuck client's socket stayed open"
    );
    cm.random_psn().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_must_say_hello_first() {
    let dir = scratch("hello");
    let (_d, sock) = daemon(&dir, "a", "127.0.0.76");
    let mut s = UnixStream::connect(&sock).await.unwrap();
    let m = ClientMsg {
        seq: 1,
        op: Op::Hello {
            version: 99,
            addr: false,
        },
    };
    s.write_all(&encode_frame(&m).unwrap()).await.unwrap();
    match read_frame::<DaemonMsg, _>(&mut s).await.unwrap() {
        DaemonMsg::Reply {
            seq: 1,
            result: WireResult::Refused { why },
        } => assert!(why.contains("version 99"), "{why}"),
        other => panic!("{other:?}"),
    }
    // Then the daemon closes the session.
    assert!(read_frame::<DaemonMsg, _>(&mut s).await.is_err());
    let mut s = UnixStream::connect(&sock).await.unwrap();
    let m = ClientMsg {
        seq: 2,
        op: Op::Len,
    };
    s.write_all(&encode_frame(&m).unwrap()).await.unwrap();
    assert!(matches!(
        read_frame::<DaemonMsg, _>(&mut s).await.unwrap(),
        DaemonMsg::Reply { seq: 2, .. }
    ));
    assert!(read_frame::<DaemonMsg, _>(&mut s).await.is_err());
}

/// Issue 26 §1.6: a client that asks at hello learns the daemon's CM address (its peers'
/// address family); one that does not gets the plain `ok` it always got, and so does an
/// older daemon's client (`Node::daemon_addr` is then `None`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hello_tells_the_daemons_address_when_asked() {
    let dir = scratch("hello-addr");
    let (_d, sock) = daemon(&dir, "a", "127.0.0.79");
    let a = ibcm::rt::node::attach(&sock).await.unwrap();
    assert_eq!(
        a.node.daemon_addr(),
        Some("127.0.0.79".parse().unwrap()),
        "attach asks"
    );
    // The daemon's endpoint runs the daemon's app: `with_app` is refused at once, with why.
    type AnyApp = fn(&mut ibcm::proto::Endpoint, std::time::Instant, &ibcm::proto::Event);
    match a.cm.with_app::<AnyApp, _, _>(|_, _, _| ()).await {
        Err(ibcm::rt::CmError::Refused(why)) => assert!(why.contains("node service"), "{why}"),
        other => panic!("with_app through the daemon: {other:?}"),
    }
    let mut s = UnixStream::connect(&sock).await.unwrap();
    let hello = |addr| {
        encode_frame(&ClientMsg {
            seq: 0,
            op: Op::Hello {
                version: VERSION,
                addr,
            },
        })
        .unwrap()
    };
    s.write_all(&hello(true)).await.unwrap();
    match read_frame::<DaemonMsg, _>(&mut s).await.unwrap() {
        DaemonMsg::Reply {
            result: WireResult::Hello { addr, paths, apm },
            ..
        } => {
            assert_eq!(addr, Some("127.0.0.79".parse().unwrap()));
            // This daemon answers path queries (its UDP port's answer says "no SA").
            assert_eq!(paths, 64);
            // ... and serves path migration, 1,024 LAP exchanges of a session at once.
            assert_eq!(apm, 1024);
        }
        other => panic!("{other:?}"),
    }
    // A hello without the field (as before it existed) is answered `ok`.
    let mut s = UnixStream::connect(&sock).await.unwrap();
    let old = br#"{"seq":0,"op":{"op":"hello","version":2}}"#;
    let mut frame = (old.len() as u32).to_be_bytes().to_vec();
    frame.extend_from_slice(old);
    s.write_all(&frame).await.unwrap();
    assert!(matches!(
        read_frame::<DaemonMsg, _>(&mut s).await.unwrap(),
        DaemonMsg::Reply {
            result: WireResult::Ok,
            ..
        }
    ));
    drop(a);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_listen_is_refused_and_leaves_the_first() {
    let dir = scratch("relisten");
    let (_d, sock) = daemon(&dir, "a", "127.0.0.95");
    let (p, _) = peer("127.0.0.96").await;
    let d_addr: SocketAddr = "127.0.0.95:4791".parse().unwrap();
    let (cm, _task) = Cm::attach(&sock).await.unwrap();
    let mut first = cm
        .listen(ServiceId(0x80), ListenOptions::default())
        .await
        .unwrap();
    // As in-process: AlreadyListening, and the first listener keeps its REQs (the client
    // used to replace its channel, then drop it on the daemon's refusal: REJ 28 for all).
    match cm.listen(ServiceId(0x80), ListenOptions::default()).await {
        Err(ibcm::rt::CmError::AlreadyListening(ServiceId(0x80))) => {}
        other => panic!("{other:?}"),
    }
    let server = tokio::spawn(async move {
        let inc = first.next().await.unwrap();
        inc.accept(AcceptParams::new(qpn(0x801))).await.unwrap()
    });
    let c = p
        .connect(ConnectParams::new(d_addr, ServiceId(0x80), qpn(0x802)))
        .await
        .unwrap();
    assert_eq!(c.status(), ConnStatus::Established);
    server.await.unwrap().established().await.unwrap();
}
