//! `Connection::established` through the async API: a connection that was established and has
//! been disconnected since is `Ok`, one that was never established is not, even when it ends
//! with `Disconnected` (issue 28 §1: the runtime does not take every `Disconnected` for a
//! connection that was established).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]
#![cfg(feature = "rt")]

use std::time::Duration;

use ibcm::proto::{AcceptParams, ConnectParams, ConnectionError, ListenOptions, StaleConnection};
use ibcm::rt::MemNetwork;
use ibcm_mad::{CommId, Qpn, ServiceId};

mod rt_common;
use rt_common::pair;

/// How long a step may take on the paused clock before the test fails.
const WAIT: std::time::Duration = std::time::Duration::from_secs(120);

/// `f`, or a panic once it has waited two minutes (paused clock: at once when stuck).
async fn within<F: std::future::Future>(f: F) -> F::Output {
    tokio::time::timeout(WAIT, f).await.expect("timed out")
}

#[tokio::test(start_paused = true)]
async fn a_stale_connection_ended_by_its_drep_was_never_established() {
    let net = MemNetwork::new();
    let (a, _b, b_addr) = pair(&net);
    let mut s = StaleConnection::new(
        CommId(0x1234),
        CommId(0x5678),
        Qpn::new(0x99).unwrap(),
        b_addr,
    );
    s.timeout = Duration::from_millis(100);
    let c = within(a.end_stale(s)).await.unwrap();
    // b knows no such connection and answers with an orphan DREP: a `Disconnected`.
    let why = within(c.closed()).await;
    assert!(
        matches!(why, ConnectionError::Disconnected { by_peer: false, .. }),
        "{why:?}"
    );
    assert_eq!(within(c.established()).await, Err(why));
}

#[tokio::test(start_paused = true)]
async fn a_connection_disconnected_after_it_was_established_is_ok() {
    let net = MemNetwork::new();
    let (a, b, b_addr) = pair(&net);
    let mut l = b
        .listen(ServiceId(0x42), ListenOptions::default())
        .await
        .unwrap();
    let server = tokio::spawn(async move {
        let inc = l.next().await.unwrap();
        inc.accept(AcceptParams::new(Qpn::new(0x22).unwrap()))
            .await
            .unwrap()
    });
    let p = ConnectParams::new(b_addr, ServiceId(0x42), Qpn::new(0x11).unwrap());
    let c = within(a.connect(p)).await.unwrap();
    let s = within(server).await.unwrap();
    within(s.established()).await.unwrap();
    assert!(matches!(
        within(c.disconnect(&[])).await,
        ConnectionError::Disconnected { by_peer: false, .. }
    ));
    // Asked after the close: both were established.
    within(c.established()).await.unwrap();
    within(s.closed()).await;
    within(s.established()).await.unwrap();
}
