//! The driver's turns: the inputs ready together are handled together and what they queued
//! goes out together, in order, also when the turn ends with a shutdown.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]
#![cfg(feature = "rt")]

use std::future::Future;
use std::pin::pin;
use std::task::{Context, Waker};

use ibcm::proto::*;
use ibcm::rt::{Cm, DatagramTransport, MemNetwork, MemTransport};
use ibcm_mad::*;

mod rt_common;
use rt_common::addr;
mod sec_common;

/// Queues a Connect command (the first poll of `start_connect` sends it; its reply has not
/// come, since the driver has not run yet).
fn queue_connect(a: &Cm, to: PeerAddr, qpn: u32) {
    let p = ConnectParams::new(to, ServiceId(0x42), Qpn::new(qpn).unwrap());
    let fut = pin!(a.start_connect(p));
    let mut cx = Context::from_waker(Waker::noop());
    assert!(fut.poll(&mut cx).is_pending());
}

#[tokio::test(start_paused = true)]
async fn a_turns_requests_go_out_in_order_even_when_it_ends_in_shutdown() {
    let net = MemNetwork::new();
    let b_addr = addr("127.0.0.2:4791");
    let mut b = net.transport(b_addr);
    let (a, task) = Cm::bind(
        net.transport(addr("127.0.0.1:4791")),
        EndpointConfig {
            rng_seed: Some(1),
            ..Default::default()
        },
    );
    // Three connects and a shutdown, all queued before the driver task first runs: one turn.
    for qpn in [0x11, 0x12, 0x13] {
        queue_connect(&a, b_addr, qpn);
    }
    a.shutdown();
    task.await.unwrap().unwrap();
    let mut got = Vec::new();
    b.try_recv_batch(&mut got).unwrap();
    let mut reqs = Vec::new();
    let mut rejs = 0;
    for (from, mad) in &got {
        assert_eq!(*from, addr("127.0.0.1:4791"));
        match ibcm_mad::cm::Mad::parse(mad).unwrap().msg {
            ibcm_mad::cm::CmMessage::Req(r) => {
                assert_eq!(rejs, 0, "a REQ after the shutdown's REJs");
                reqs.push(r.local_qpn);
            }
            // The shutdown ends each connection still in setup with a REJ, after its REQ.
            ibcm_mad::cm::CmMessage::Rej(_) => rejs += 1,
            other => panic!("expected a REQ or REJ, got {other:?}"),
        }
    }
    assert_eq!(
        reqs,
        [0x11, 0x12, 0x13].map(|q| Qpn::new(q).unwrap()),
        "every REQ of the turn went out, in order, before the driver stopped"
    );
    assert_eq!(
        rejs, 3,
        "the shutdown rejected the three connections in setup"
    );
}

const L_ADDR: &str = "127.0.0.2:4791";

/// An endpoint on [`L_ADDR`] (no listener) and a peer that has sent it `n` REQs, all queued
/// before the endpoint's driver first runs.
async fn flooded(n: u32) -> (Cm, MemTransport) {
    let net = MemNetwork::new();
    let (l, _task) = Cm::bind(
        net.transport(addr(L_ADDR)),
        EndpointConfig {
            rng_seed: Some(1),
            ..Default::default()
        },
    );
    let mut peer = net.transport(addr("127.0.0.9:4791"));
    for i in 0..n {
        let req = sec_common::hostile_req(0x1000 + i, 0x99, 0x2000 + i, 20, 15);
        peer.send(addr(L_ADDR), &req).await.unwrap();
    }
    (l, peer)
}

/// A burst of REQs beyond the driver's backlog of requests (2,048): the oldest excess is
/// dropped before the core sees it and counted as `req_backlog_full`; every other REQ reaches
/// the core. (Before the backlog every REQ reached the core in arrival order, however many
/// waited: under a flood the kernel dropped the excess blindly and an RTU waited behind them.)
#[tokio::test(start_paused = true)]
async fn requests_beyond_the_backlog_are_dropped_and_counted() {
    const N: u32 = 5000;
    let (l, _flooder) = flooded(N).await;
    // The clock moves only once the driver is idle: every REQ was handled or dropped by then.
    tokio::time::sleep(std::time::Duration::from_millis(1)).await;
    let st = l.stats().await.unwrap();
    let dropped = st
        .transport
        .dropped
        .iter()
        .find(|(k, _)| *k == "req_backlog_full")
        .map(|&(_, n)| n)
        .unwrap();
    assert!(dropped > 0, "5,000 REQs at once overflow the backlog");
    assert_eq!(
        st.endpoint.rx + dropped,
        u64::from(N),
        "each REQ reached the core or was counted as dropped"
    );
    assert!(st
        .to_json()
        .contains(&format!("\"req_backlog_full\":{dropped}")));
}

/// Under overload the driver answers the newest requests first: a REQ that comes while
/// thousands of older ones wait in the backlog is answered within a turn or two, before most
/// of them. (First come first served made it wait for the whole backlog: on a slow host
/// longer than its peer waits, so that during a flood no connection would complete.)
#[tokio::test(start_paused = true)]
async fn a_request_that_comes_during_a_backlog_is_answered_before_it() {
    // One peer for the flood and the late REQ, so that the order of the answers it receives
    // is the order in which the listener handled the REQs. No listener: each REQ is answered
    // with a REJ whose remote comm ID is the REQ's.
    const N: u32 = 3000;
    let (_l, mut peer) = flooded(N).await;
    let l_addr = addr(L_ADDR);
    // Let the driver read them (its first turns), then the late REQ.
    tokio::task::yield_now().await;
    const LATE: u32 = 0x9999;
    let req = sec_common::hostile_req(LATE, 0x99, 0x2000 + N, 20, 15);
    peer.send(l_addr, &req).await.unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(1)).await;
    let mut got = Vec::new();
    loop {
        let before = got.len();
        peer.try_recv_batch(&mut got).unwrap();
        if got.len() == before {
            break;
        }
    }
    let answered: Vec<u32> = got
        .iter()
        .filter_map(
            |(_, mad)| match ibcm_mad::cm::Mad::parse(mad).unwrap().msg {
                ibcm_mad::cm::CmMessage::Rej(r) => Some(r.remote_comm_id.0),
                _ => None,
            },
        )
        .collect();
    let late = answered
        .iter()
        .position(|&id| id == LATE)
        .expect("the late REQ was answered");
    let after = answered.len() - 1 - late;
    assert!(
        after >= 1000,
        "the late REQ was answered before the backlog: {after} of {} answers came after it",
        answered.len()
    );
}

/// A MAD the transport cannot send (here a REQ to an IPv6 address from an IPv4 socket) is
/// counted as `send_error` among the drops, not only logged.
#[tokio::test]
async fn a_mad_the_transport_cannot_send_is_counted() {
    let t = ibcm::rt::UdpTransport::bind_port("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let (a, _task) = Cm::bind(
        t,
        EndpointConfig {
            rng_seed: Some(1),
            ..Default::default()
        },
    );
    let to = PeerAddr::Udp("[::1]:4791".parse().unwrap());
    let p = ConnectParams::new(to, ServiceId(0x42), Qpn::new(0x11).unwrap());
    let _conn = a.start_connect(p).await.unwrap();
    let st = a.stats().await.unwrap();
    let n = |k: &str| {
        st.dropped()
            .iter()
            .find(|(name, _)| *name == k)
            .map(|&(_, n)| n)
    };
    assert_eq!(n("send_error"), Some(1), "the REQ that could not go");
    assert_eq!(st.transport.tx, 0);
    assert!(st.to_json().contains("\"send_error\":1"));
}
