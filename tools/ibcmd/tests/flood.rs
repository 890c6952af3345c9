//! A REQ flood at a listener served through the daemon (issue 25, fault 6): the flood costs
//! the listening client nothing but REJs "no resources" for the REQs beyond its backlog; its
//! session stays, and legitimate connects afterwards are served; a stateless listener
//! (`Cm::listen_stateless`) through the daemon serves legitimate connects during the flood.
//! Addresses 127.0.27.x.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

mod common;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ibcm::proto::{
    AcceptParams, ConnectParams, ConnectionError, Endpoint, EndpointConfig, ListenOptions,
    PeerAddr, StatelessAccept,
};
use ibcm::rt::node::proto::{
    encode_frame, read_frame, ClientMsg, DaemonMsg, Op, WireAccept, WireResult, WireStatus, VERSION,
};
use ibcm::rt::{Arrival, Cm, CmError, DatagramTransport, UdpTransport};
use ibcm_mad::{Guid, Qpn, ServiceId};
use tokio::io::AsyncWriteExt;
use tokio::net::UnixStream;

use common::{daemon_with, scratch};

/// REQs in the flood: more than a session's out queue holds (8,192 messages).
const FLOOD: u32 = 12_000;
/// Source addresses of the flood (127.0.27.10 on).
const SOURCES: u32 = 12;
/// Legitimate connects after the flood.
const LEGIT: u32 = 500;

async fn send(s: &mut UnixStream, seq: u64, op: Op) {
    s.write_all(&encode_frame(&ClientMsg { seq, op }).unwrap())
        .await
        .unwrap();
}

/// A raw session: hello answered.
async fn raw(sock: &std::path::Path) -> UnixStream {
    let mut s = UnixStream::connect(sock).await.unwrap();
    send(
        &mut s,
        0,
        Op::Hello {
            version: VERSION,
            addr: false,
        },
    )
    .await;
    match read_frame::<DaemonMsg, _>(&mut s).await.unwrap() {
        DaemonMsg::Reply {
            result: WireResult::Ok,
            ..
        } => {}
        other => panic!("{other:?}"),
    }
    s
}

/// The daemon endpoint's `rx` counter (datagrams it received), through a session of its own.
async fn rx(s: &mut UnixStream, seq: u64) -> u64 {
    send(s, seq, Op::Stats).await;
    loop {
        if let DaemonMsg::Reply {
            seq: r,
            result: WireResult::Stats(st),
        } = read_frame::<DaemonMsg, _>(s).await.unwrap()
        {
            if r == seq {
                return st.transport_rx;
            }
        }
    }
}

/// The next frame, or `None` if nothing comes within `quiet`. A closed session panics with
/// what it delivered before.
async fn next(s: &mut UnixStream, quiet: Duration, incoming: usize) -> Option<DaemonMsg> {
    match tokio::time::timeout(quiet, read_frame::<DaemonMsg, _>(s)).await {
        Err(_) => None,
        Ok(Ok(m)) => Some(m),
        Ok(Err(e)) => panic!(
            "the listener's session was closed by the daemon after {incoming} incoming REQs: {e}"
        ),
    }
}

/// The flood's sender: an endpoint in this process that sends REQs for `sid` to the daemon
/// (a fresh comm ID and QPN each) from SOURCES addresses `127.0.27.BASE+k` round-robin, and
/// never reads an answer.
struct Flooder {
    srcs: Vec<UdpTransport>,
    ep: Endpoint,
    to: SocketAddr,
    sid: ServiceId,
}

impl Flooder {
    async fn new(base: u32, guid: Guid, to: SocketAddr, sid: ServiceId) -> Self {
        let mut srcs = Vec::new();
        for k in 0..SOURCES {
            let ip = format!("127.0.27.{}", base + k);
            srcs.push(UdpTransport::bind(ip.parse().unwrap()).await.unwrap());
        }
        let ep = Endpoint::new(EndpointConfig {
            local_ca_guid: guid,
            ..EndpointConfig::default()
        });
        Flooder { srcs, ep, to, sid }
    }

    /// REQ number `i`, from source `i % SOURCES`; after every 250th, a 10 ms pause (at most
    /// 25,000 REQs/s).
    async fn req(&mut self, i: u32) {
        let p = ConnectParams::new(PeerAddr::Udp(self.to), self.sid, Qpn::masked(0x1000 + i));
        self.ep.connect(Instant::now(), p).unwrap();
        let t = &mut self.srcs[(i % SOURCES) as usize];
        while let Some(tx) = self.ep.poll_transmit() {
            t.send(tx.to, &tx.mad).await.unwrap();
        }
        if i % 250 == 249 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_req_flood_does_not_cost_a_listener_its_session() {
    let dir = scratch("flood");
    let (mut d, sock) = daemon_with(&dir, "a", "127.0.27.1", &[]);
    let d_addr: SocketAddr = "127.0.27.1:4791".parse().unwrap();
    let sid = ServiceId(0x2700);

    // The listener: a client that is busy (reads nothing) while the flood comes.
    let mut l = raw(&sock).await;
    send(
        &mut l,
        1,
        Op::Listen {
            service_id: sid.0,
            transports: vec![],
        },
    )
    .await;
    assert!(matches!(
        read_frame::<DaemonMsg, _>(&mut l).await.unwrap(),
        DaemonMsg::Reply {
            seq: 1,
            result: WireResult::Ok
        }
    ));
    let mut watch = raw(&sock).await;
    let rx0 = rx(&mut watch, 1).await;

    // The flood: an endpoint in this process sends REQs (fresh comm ID and QPN each) from
    // SOURCES addresses round-robin (as `cm-bench flood` does: a source may hold 1,024
    // half-open entries at the daemon's endpoint) and never reads an answer; 250 every
    // 10 ms (at most 25,000/s), FLOOD in all.
    let mut f = Flooder::new(10, Guid(0x2702), d_addr, sid).await;
    let start = Instant::now();
    for i in 0..FLOOD {
        f.req(i).await;
    }
    let secs = start.elapsed().as_secs_f64();
    // Until the daemon has read what it will read of it (its receive counter stands still).
    let mut last = rx(&mut watch, 2).await;
    for seq in 3.. {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let now = rx(&mut watch, seq).await;
        if now == last {
            break;
        }
        last = now;
    }
    let received = last - rx0;
    println!(
        "flood: {FLOOD} REQs in {secs:.2} s ({:.0}/s); the daemon received {received}",
        f64::from(FLOOD) / secs
    );
    assert!(
        received > 8192,
        "the daemon received only {received} datagrams of the flood"
    );

    // The listener reads now: the REQs it was given — never more than its backlog
    // unanswered at once (a REQ whose initiator gave up leaves it: status "gone") —, then it
    // is still served.
    let mut flood_conns = std::collections::BTreeSet::new();
    let (mut given, mut most) = (0usize, 0usize);
    while let Some(m) = next(&mut l, Duration::from_millis(500), given).await {
        match m {
            DaemonMsg::Incoming { conn, .. } => {
                given += 1;
                flood_conns.insert(conn);
                most = most.max(flood_conns.len());
            }
            DaemonMsg::Status {
                conn,
                status: WireStatus::Gone(_),
                ..
            } => {
                flood_conns.remove(&conn);
            }
            _ => {}
        }
    }
    println!("flood: the listener was given {given} REQs, at most {most} unanswered at once");
    assert!(
        given > 0 && most <= 1024,
        "{given} REQs given to the listener, {most} at once (backlog 1024)"
    );
    send(&mut l, 2, Op::Len).await;
    loop {
        match next(&mut l, Duration::from_secs(10), given).await {
            Some(DaemonMsg::Reply { seq: 2, result }) => {
                assert!(matches!(result, WireResult::Value { .. }), "{result:?}");
                break;
            }
            Some(_) => {}
            None => panic!("no answer to len"),
        }
    }
    // It answers the flood's REQs (the daemon rejects them), then accepts every REQ.
    for (seq, conn) in (10..).zip(flood_conns) {
        send(&mut l, seq, Op::Unanswered { conn }).await;
    }
    let acceptor = tokio::spawn(async move {
        let mut seq = 100_000u64;
        let mut qpn = 0x10_0000u32;
        loop {
            let m = match read_frame::<DaemonMsg, _>(&mut l).await {
                Ok(m) => m,
                Err(e) => panic!("the listener's session ended: {e}"),
            };
            if let DaemonMsg::Incoming { conn, .. } = m {
                qpn += 1;
                let params = WireAccept::from_params(&AcceptParams::new(Qpn::masked(qpn)));
                send(&mut l, seq, Op::Accept { conn, params }).await;
                seq += 1;
            }
        }
    });

    // Legitimate connects, 50 at a time.
    let c = UdpTransport::bind("127.0.27.3".parse().unwrap())
        .await
        .unwrap();
    let (client, _task) = Cm::bind(
        c,
        EndpointConfig {
            local_ca_guid: Guid(0x2703),
            ..EndpointConfig::default()
        },
    );
    let mut ok = 0u32;
    let mut failed = Vec::new();
    for batch in 0..LEGIT / 50 {
        let mut tasks = Vec::new();
        for k in 0..50 {
            let client = client.clone();
            let q = Qpn::masked(0x20_0000 + batch * 50 + k);
            tasks.push(tokio::spawn(async move {
                client.connect(ConnectParams::new(d_addr, sid, q)).await
            }));
        }
        for t in tasks {
            match t.await.unwrap() {
                Ok(_) => ok += 1,
                Err(e) => failed.push(e.to_string()),
            }
        }
    }
    println!("flood: legit connects {ok}/{LEGIT}");
    assert_eq!(ok, LEGIT, "failed: {:?}", failed.first());
    assert!(!acceptor.is_finished(), "the listener's session ended");
    acceptor.abort();
    // The REQs beyond the backlog were rejected by the daemon, and said so.
    let line = tokio::task::spawn_blocking(move || {
        d.wait_err(
            |l| l.contains("listen backlog full"),
            "'listen backlog full'",
        )
    })
    .await
    .unwrap();
    assert!(line.contains("REJ 3"), "{line}");
}

/// Most REQs of the flood at the stateless listener (it stops once the legitimate connects
/// are done): at 25,000/s at most, 16 s of flood or more.
const FLOOD_LONG: u32 = 400_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stateless_listener_through_the_daemon_serves_legit_connects_under_flood() {
    let dir = scratch("flood-stateless");
    let (_d, sock) = daemon_with(&dir, "a", "127.0.27.61", &[]);
    let d_addr: SocketAddr = "127.0.27.61:4791".parse().unwrap();
    let sid = ServiceId(0x2761);
    let legit_ip: std::net::IpAddr = "127.0.27.62".parse().unwrap();

    // The listener: a client of the daemon with a stateless template (docs/protocol.md
    // §5.12), accepting every request and keeping every connection.
    let (cm, _task) = Cm::attach(&sock).await.unwrap();
    // The QPNs of stateless REPs: the upper half of the space (cm-ping's default).
    let template = StatelessAccept::new(
        AcceptParams::new(Qpn::masked(0x80_0000)),
        Qpn::masked(0x80_0000),
        0x7f_ff00,
    );
    let mut l = cm
        .listen_stateless(sid, ListenOptions::default(), template)
        .await
        .unwrap();
    let legit_stateless = Arc::new(AtomicU32::new(0));
    let seen = legit_stateless.clone();
    let acceptor = tokio::spawn(async move {
        let mut kept = Vec::new();
        let mut q = 0x10_0000u32;
        while let Some(a) = l.next_arrival().await {
            match a {
                Arrival::Request(inc) => {
                    q += 1;
                    if let Ok(c) = inc.accept(AcceptParams::new(Qpn::masked(q))).await {
                        kept.push(c);
                    }
                }
                Arrival::Stateless(c, info) => {
                    if info.req.peer.ip() == Some(legit_ip) {
                        seen.fetch_add(1, Ordering::Relaxed);
                    }
                    kept.push(c);
                }
            }
        }
        kept.len()
    });

    // The flood, on a task of its own: REQs from SOURCES addresses, 250 every 10 ms (at
    // most 25,000/s), until the legitimate connects are done (at most FLOOD_LONG).
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let halt = stop.clone();
    let flood = tokio::spawn(async move {
        let mut f = Flooder::new(70, Guid(0x2763), d_addr, sid).await;
        let start = Instant::now();
        let mut sent = 0u32;
        for i in 0..FLOOD_LONG {
            if halt.load(Ordering::Relaxed) {
                break;
            }
            sent += 1;
            f.req(i).await;
        }
        (sent, start.elapsed())
    });

    // Legitimate connects once the flood is under way (the daemon's endpoint holds 1,024
    // half-open connections: the stateless mode's threshold), 50 in flight at a time.
    let until = Instant::now() + common::DEADLINE;
    while cm.stats().await.unwrap().half_open < 1024 {
        assert!(Instant::now() < until, "the flood never built up");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let c = UdpTransport::bind(legit_ip).await.unwrap();
    let (client, _task) = Cm::bind(
        c,
        EndpointConfig {
            local_ca_guid: Guid(0x2762),
            ..EndpointConfig::default()
        },
    );
    let mut ok = 0u32;
    let mut failed = Vec::new();
    let mut held = Vec::new();
    let mut retried = 0u32;
    for batch in 0..LEGIT / 50 {
        let mut tasks = Vec::new();
        for k in 0..50 {
            let client = client.clone();
            let q = Qpn::masked(0x20_0000 + batch * 50 + k);
            tasks.push(tokio::spawn(async move {
                let first = client.connect(ConnectParams::new(d_addr, sid, q)).await;
                // A stateless REP's QPN is drawn by its cookie: one may collide with the
                // QPN of a connection this client already has with the daemon, which the
                // CM rejects as stale (the protocol's answer, in-process too); a client
                // connects anew, and the new REQ gets another cookie.
                match first {
                    Err(CmError::Connection(ConnectionError::Stale)) => {
                        let q = Qpn::masked(q.get() | 0x1_0000);
                        (client.connect(ConnectParams::new(d_addr, sid, q)).await, 1)
                    }
                    other => (other, 0),
                }
            }));
        }
        for t in tasks {
            let (r, again) = t.await.unwrap();
            retried += again;
            match r {
                Ok(c) => {
                    ok += 1;
                    held.push(c);
                }
                Err(e) => failed.push(e.to_string()),
            }
        }
    }
    let lasted = !flood.is_finished();
    stop.store(true, Ordering::Relaxed);
    let (sent, took) = flood.await.unwrap();
    let secs = took.as_secs_f64();
    println!(
        "flood: {sent} REQs in {secs:.2} s ({:.0}/s); legit connects {ok}/{LEGIT} during it ({retried} retried after a stale REJ), {} answered statelessly",
        f64::from(sent) / secs,
        legit_stateless.load(Ordering::Relaxed)
    );
    assert!(lasted, "the flood ended before the legitimate connects");
    assert_eq!(ok, LEGIT, "failed: {:?}", failed.first());
    assert!(
        legit_stateless.load(Ordering::Relaxed) > 0,
        "no legitimate connection was established statelessly"
    );
    // The listener's session is still there.
    cm.random_psn().await.unwrap();
    assert!(!acceptor.is_finished(), "the listener ended");
    acceptor.abort();
}
