//! What an embedder of the async API hit: a second listener on one service ID, a shutdown
//! that left the peers connected, a connect to nothing that took 103 s to fail.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]
#![cfg(feature = "rt")]

use std::time::Duration;

use ibcm::proto::*;
use ibcm::rt::{Cm, CmError, Connection, MemNetwork};
use ibcm_mad::*;

mod rt_common;
use rt_common::{addr, pair};

const SID: ServiceId = ServiceId(0x42);

/// `c`'s close, or a panic if nothing closes it within a minute of (paused) time.
async fn closed_within_a_minute(c: &Connection) -> ConnectionError {
    tokio::time::timeout(Duration::from_secs(60), c.closed())
        .await
        .expect("the connection was never closed")
}

/// A second `listen` on a listened service ID is refused and the first listener keeps its
/// REQs; dropping the refused attempt's leftovers or a stale listener never ends the live one.
#[tokio::test(start_paused = true)]
async fn second_listen_is_refused_and_drop_removes_only_itself() {
    let net = MemNetwork::new();
    let (a, b, b_addr) = pair(&net);
    let first = b.listen(SID, ListenOptions::default()).await.unwrap();
    match b.listen(SID, ListenOptions::default()).await {
        Err(CmError::AlreadyListening(sid)) => assert_eq!(sid, SID),
        other => panic!("{other:?}"),
    }
    // The first listener still gets the REQ.
    let mut first = first;
    let server = tokio::spawn(async move {
        let inc = first.next().await.unwrap();
        let c = inc
            .accept(AcceptParams::new(Qpn::new(0x22).unwrap()))
            .await
            .unwrap();
        (first, c)
    });
    a.connect(ConnectParams::new(b_addr, SID, Qpn::new(0x11).unwrap()))
        .await
        .unwrap();
    let (first, _c) = server.await.unwrap();
    // Drop it, listen anew: the new listener is the one in place; the old one's drop (sent
    // before) did not remove it.
    drop(first);
    let mut second = b.listen(SID, ListenOptions::default()).await.unwrap();
    let server = tokio::spawn(async move {
        let inc = second.next().await.unwrap();
        inc.accept(AcceptParams::new(Qpn::new(0x23).unwrap()))
            .await
            .unwrap()
    });
    a.connect(ConnectParams::new(b_addr, SID, Qpn::new(0x12).unwrap()))
        .await
        .unwrap();
    server.await.unwrap();
}

async fn established_pair(net: &MemNetwork) -> (Cm, Cm, Connection, Connection) {
    let (a, b, b_addr) = pair(net);
    let mut l = b.listen(SID, ListenOptions::default()).await.unwrap();
    let server = tokio::spawn(async move {
        let inc = l.next().await.unwrap();
        inc.accept(AcceptParams::new(Qpn::new(0x22).unwrap()))
            .await
            .unwrap()
    });
    let c = a
        .connect(ConnectParams::new(b_addr, SID, Qpn::new(0x11).unwrap()))
        .await
        .unwrap();
    let s = server.await.unwrap();
    s.established().await.unwrap();
    (a, b, c, s)
}

/// `Cm::shutdown` sends a DREQ for every established connection, and the driver task waits
/// for the DREP before it ends.
#[tokio::test(start_paused = true)]
async fn shutdown_disconnects_every_connection() {
    let net = MemNetwork::new();
    let (a, b, c, s) = established_pair(&net).await;
    b.shutdown();
    assert!(matches!(
        closed_within_a_minute(&c).await,
        ConnectionError::Disconnected { by_peer: true, .. }
    ));
    assert!(matches!(
        s.closed().await,
        ConnectionError::Disconnected { by_peer: false, .. }
    ));
    let st = a.stats().await.unwrap();
    assert_eq!(st.endpoint.orphan_dreps, 0);
}

/// Dropping every handle of a `Cm` (the `Cm`s, connections, listeners) does the same.
#[tokio::test(start_paused = true)]
async fn dropping_the_last_handle_disconnects() {
    let net = MemNetwork::new();
    let (_a, b, c, s) = established_pair(&net).await;
    drop(s);
    drop(b);
    assert!(matches!(
        closed_within_a_minute(&c).await,
        ConnectionError::Disconnected { by_peer: true, .. }
    ));
}

/// A connection still being set up when the endpoint stops is rejected, so the active side
/// does not wait for its retries to run out.
#[tokio::test(start_paused = true)]
async fn shutdown_rejects_connections_in_setup() {
    let net = MemNetwork::new();
    let (a, b, b_addr) = pair(&net);
    let mut l = b.listen(SID, ListenOptions::default()).await.unwrap();
    let c = a
        .start_connect(ConnectParams::new(b_addr, SID, Qpn::new(0x11).unwrap()))
        .await
        .unwrap();
    // The REQ arrived and is held unanswered.
    let inc = l.next().await.unwrap();
    b.shutdown();
    match closed_within_a_minute(&c).await {
        ConnectionError::Rejected { .. } => {}
        other => panic!("{other:?}"),
    }
    drop(inc);
}

fn to_nothing(timeout: Option<Duration>) -> ConnectParams {
    let mut p = ConnectParams::new(addr("127.0.0.9:4791"), SID, Qpn::new(0x11).unwrap());
    p.connect_timeout = timeout;
    p
}

/// A connect to an address nobody answers gives up at `connect_timeout` (default 10 s): one
/// retransmission at the default REQ timeout of 6.4 s, not 15.
#[tokio::test(start_paused = true)]
async fn connect_to_nothing_gives_up_at_the_connect_timeout() {
    let net = MemNetwork::new();
    let (a, _b, _) = pair(&net);
    let p = to_nothing(None);
    assert_eq!(
        ConnectParams::new(p.peer, SID, p.local_qpn).connect_timeout,
        Some(DEFAULT_CONNECT_TIMEOUT)
    );
    let p = ConnectParams::new(p.peer, SID, p.local_qpn);
    match a.connect(p).await {
        Err(CmError::Connection(ConnectionError::TimedOut)) => {}
        other => panic!("{other:?}"),
    }
    let st = a.stats().await.unwrap();
    assert_eq!(st.endpoint.retransmits, 1, "REQ sent twice in 10 s");
}

/// The setting is per connect: `None` leaves the REQ schedule alone (16 sends), a short one
/// sends the REQ once.
#[tokio::test(start_paused = true)]
async fn connect_timeout_is_per_connect() {
    let net = MemNetwork::new();
    let (a, _b, _) = pair(&net);
    match a.connect(to_nothing(Some(Duration::from_secs(1)))).await {
        Err(CmError::Connection(ConnectionError::TimedOut)) => {}
        other => panic!("{other:?}"),
    }
    assert_eq!(a.stats().await.unwrap().endpoint.retransmits, 0);
    let mut p = to_nothing(None);
    p.local_qpn = Qpn::new(0x12).unwrap();
    match a.connect(p).await {
        Err(CmError::Connection(ConnectionError::TimedOut)) => {}
        other => panic!("{other:?}"),
    }
    assert_eq!(a.stats().await.unwrap().endpoint.retransmits, 15);
}
