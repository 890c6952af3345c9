//! Path migration (LAP/APR) through real `ibcmd` processes: two daemons on UDP loopback, a
//! client attached to each (`Cm::attach`), the LAPs of one answered by the other; a client
//! that does not answer its LAPs, one that goes with a LAP held.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use ibcm::proto::{AcceptParams, ConnectParams, ListenOptions};
use ibcm::rt::{Cm, CmError, LapPolicy};
use ibcm_mad::{AprStatus, Lid, PathInfo, Qpn, ServiceId, TimeoutExp, U4};

use common::{daemon, scratch};

fn path(l: u16, r: u16) -> PathInfo {
    PathInfo {
        local_lid: Lid(l),
        remote_lid: Lid(r),
        sl: U4::masked(3),
        local_ack_timeout: TimeoutExp::masked(18),
        ..PathInfo::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn laps_go_between_clients_of_two_daemons() {
    let dir = scratch("laps");
    let (_da, a_sock) = daemon(&dir, "a", "127.0.33.1");
    let (_db, b_sock) = daemon(&dir, "b", "127.0.33.2");
    let (a, ta) = Cm::attach(&a_sock).await.unwrap();
    let (b, _tb) = Cm::attach(&b_sock).await.unwrap();
    // b answers its LAPs; a does not (its daemon answers them "unsupported").
    b.set_lap_policy(LapPolicy::Application).await.unwrap();
    let mut l = b
        .listen(ServiceId(0x3301), ListenOptions::default())
        .await
        .unwrap();
    let server = tokio::spawn(async move {
        let inc = l.next().await.unwrap();
        let conn = inc
            .accept(AcceptParams::new(Qpn::masked(0x22)))
            .await
            .unwrap();
        conn.established().await.unwrap();
        let lap = conn.next_lap().await.unwrap();
        assert_eq!(
            (*lap.path(), lap.private_data()),
            (path(3, 7), &b"a->b"[..])
        );
        lap.accept(b"loaded").await.unwrap();
        (l, conn)
    });
    let peer: SocketAddr = "127.0.33.2:4791".parse().unwrap();
    let p = ConnectParams::new(peer, ServiceId(0x3301), Qpn::masked(0x11));
    let conn = a.connect(p).await.unwrap();
    let apr = conn.load_alt_path(path(3, 7), b"a->b").await.unwrap();
    assert_eq!(
        (apr.status, apr.private_data),
        (AprStatus::Success, b"loaded".to_vec())
    );
    conn.notify_path_migrated().await.unwrap();
    let (_l, passive) = server.await.unwrap();
    // The other way: a's daemon answers for it.
    let e = passive.load_alt_path(path(7, 3), &[]).await.unwrap_err();
    assert!(
        matches!(&e, CmError::LapRejected(x) if x.status == AprStatus::Unsupported),
        "{e:?}"
    );
    // a asks for its LAPs, takes one and goes without answering: its daemon answers
    // "rejected" at once (the LAP's own timeout would be about a minute), then the DREQ.
    a.set_lap_policy(LapPolicy::Application).await.unwrap();
    let taken = {
        let conn = conn.clone();
        tokio::spawn(async move { conn.next_lap().await.unwrap() })
    };
    let sent = {
        let passive = passive.clone();
        tokio::spawn(async move {
            let t0 = tokio::time::Instant::now();
            (passive.load_alt_path(path(7, 3), &[]).await, t0)
        })
    };
    let lap = taken.await.unwrap();
    assert_eq!(*lap.path(), path(7, 3));
    // As if a's process died: its socket closes with the LAP unanswered (the task that owns
    // the socket ends first; the request dropped then reaches no one).
    ta.abort();
    let _ = ta.await;
    drop((lap, conn, a));
    let (r, t0) = sent.await.unwrap();
    assert!(
        matches!(&r, Err(CmError::LapRejected(x)) if x.status == AprStatus::Rejected),
        "{r:?}"
    );
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
    let why = passive.closed().await;
    assert!(
        matches!(
            why,
            ibcm::proto::ConnectionError::Disconnected { by_peer: true, .. }
        ),
        "{why:?}"
    );
}
