//! Driver plumbing on tokio's paused clock: commands reach the core, events reach the
//! handles, the timer fires, drop guards answer. (Protocol behaviour is tested in the sim.)
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]
#![cfg(feature = "rt")]

use std::time::Duration;

use ibcm::proto::*;
use ibcm::rt::{CmError, ConnStatus, IncomingKind, MemNetwork};
use ibcm_mad::*;

mod rt_common;
use rt_common::{addr, pair};

fn params(to: PeerAddr, qpn: u32) -> ConnectParams {
    let mut p = ConnectParams::new(to, ServiceId(0x42), Qpn::new(qpn).unwrap());
    p.remote_cm_response_timeout = TimeoutExp::new(16).unwrap();
    p.packet_life_time = TimeoutExp::new(10).unwrap();
    p.max_cm_retries = U4::new(3).unwrap();
    p
}

#[tokio::test(start_paused = true)]
async fn connect_accept_disconnect_and_timewait() {
    let net = MemNetwork::new();
    let (a, b, b_addr) = pair(&net);
    let mut l = b
        .listen(ServiceId(0x42), ListenOptions::default())
        .await
        .unwrap();
    let server = tokio::spawn(async move {
        let inc = l.next().await.unwrap();
        assert_eq!(inc.request().unwrap().remote_qpn(), Qpn::new(0x11).unwrap());
        inc.accept(AcceptParams::new(Qpn::new(0x22).unwrap()))
            .await
            .unwrap()
    });
    let c = a.connect(params(b_addr, 0x11)).await.unwrap();
    assert_eq!(c.status(), ConnStatus::Established);
    assert_eq!(c.rep().unwrap().remote_qpn, Qpn::new(0x22).unwrap());
    let s = server.await.unwrap();
    assert!(s.rep().is_none(), "the passive side has no REP");
    s.established().await.unwrap();
    assert_eq!(b.connection_count().await.unwrap(), 1);
    assert!(matches!(
        c.disconnect(b"bye").await,
        ConnectionError::Disconnected { by_peer: false, .. }
    ));
    assert!(matches!(
        s.closed().await,
        ConnectionError::Disconnected { by_peer: true, private_data } if private_data == b"bye"
    ));
    // TimeWait ends on the paused clock.
    c.gone().await;
    s.gone().await;
    assert_eq!(a.connection_count().await.unwrap(), 0);
    assert_eq!(b.connection_count().await.unwrap(), 0);
    let st = a.stats().await.unwrap().endpoint;
    assert_eq!(st.established, 1);
}

#[tokio::test(start_paused = true)]
async fn unanswered_req_times_out_in_virtual_time() {
    let net = MemNetwork::new();
    let (a, _b, _) = pair(&net);
    let start = tokio::time::Instant::now();
    // Nobody at this address: every REQ is lost.
    let err = a
        .connect(params(addr("127.0.0.9:4791"), 0x11))
        .await
        .unwrap_err();
    assert!(
        matches!(err, CmError::Connection(ConnectionError::TimedOut)),
        "{err:?}"
    );
    // 4 attempts of 2 × 4.2 ms + 268 ms each.
    let took = start.elapsed();
    assert!(
        took > Duration::from_millis(1000) && took < Duration::from_millis(1200),
        "{took:?}"
    );
    assert_eq!(a.stats().await.unwrap().endpoint.retransmits, 3);
}

#[tokio::test(start_paused = true)]
async fn no_listener_rej_8_and_dropped_incoming_rej_28() {
    let net = MemNetwork::new();
    let (a, b, b_addr) = pair(&net);
    let err = a.connect(params(b_addr, 0x11)).await.unwrap_err();
    assert!(
        matches!(
            err,
            CmError::Connection(ConnectionError::Rejected {
                reason: RejReason::InvalidServiceId,
                ..
            })
        ),
        "{err:?}"
    );
    let mut l = b
        .listen(ServiceId(0x42), ListenOptions::default())
        .await
        .unwrap();
    tokio::spawn(async move {
        // Dropped without an answer: the guard rejects it.
        let _inc = l.next().await.unwrap();
    });
    let err = a.connect(params(b_addr, 0x12)).await.unwrap_err();
    assert!(
        matches!(
            err,
            CmError::Connection(ConnectionError::Rejected {
                reason: RejReason::ConsumerReject,
                ..
            })
        ),
        "{err:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn refused_accept_or_reject_still_answers_the_peer() {
    let net = MemNetwork::new();
    let (a, b, b_addr) = pair(&net);
    let mut l = b
        .listen(ServiceId(0x42), ListenOptions::default())
        .await
        .unwrap();
    let server = tokio::spawn(async move {
        // 197 bytes of REP private data: refused, and the REQ is rejected for us.
        let inc = l.next().await.unwrap();
        let mut p = AcceptParams::new(Qpn::new(0x21).unwrap());
        p.private_data = vec![0; 197];
        let e1 = inc.accept(p).await.unwrap_err();
        // 149 bytes of REJ private data: refused, rejected plainly instead.
        let inc = l.next().await.unwrap();
        let e2 = inc
            .reject(RejReason::ConsumerReject, &[], &[0; 149])
            .await
            .unwrap_err();
        (e1, e2)
    });
    for qpn in [0x11, 0x12] {
        let err = a.connect(params(b_addr, qpn)).await.unwrap_err();
        assert!(
            matches!(
                &err,
                CmError::Connection(ConnectionError::Rejected {
                    reason: RejReason::ConsumerReject,
                    private_data,
                    ..
                }) if private_data.is_empty()
            ),
            "{err:?}"
        );
    }
    let (e1, e2) = server.await.unwrap();
    assert!(matches!(e1, CmError::Call(_)), "{e1:?}");
    assert!(matches!(e2, CmError::Call(_)), "{e2:?}");
}

/// An accept (or SIDR reply) whose future is dropped once the command is queued is still the
/// answer: the drop guard sends no REJ after it (cm-ping's tasks are cancelled this way on
/// SIGINT; the REJ used to follow the REP and tear the connection down).
#[tokio::test(start_paused = true)]
async fn an_accept_dropped_while_it_waits_is_still_the_answer() {
    use std::future::Future;
    use std::task::Poll;
    let net = MemNetwork::new();
    let (a, b, b_addr) = pair(&net);
    let mut l = b
        .listen(ServiceId(0x42), ListenOptions::default())
        .await
        .unwrap();
    let server = tokio::spawn(async move {
        let inc = l.next().await.unwrap();
        let mut fut = Box::pin(inc.accept(AcceptParams::new(Qpn::new(0x22).unwrap())));
        // Polled once: the command is queued, the reply not yet in (the driver has not run:
        // one thread). Then dropped.
        let first = std::future::poll_fn(|cx| Poll::Ready(fut.as_mut().poll(cx).is_pending()));
        assert!(first.await, "the accept resolved without the driver");
        drop(fut);
        l
    });
    let c = a.connect(params(b_addr, 0x11)).await.unwrap();
    assert_eq!(c.status(), ConnStatus::Established);
    let _l = server.await.unwrap();
    // Still established a while later: no REJ came after the REP.
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!(c.status(), ConnStatus::Established);
}

#[tokio::test(start_paused = true)]
async fn reject_with_private_data_and_mra_then_accept() {
    let net = MemNetwork::new();
    let (a, b, b_addr) = pair(&net);
    let mut l = b
        .listen(ServiceId(0x42), ListenOptions::default())
        .await
        .unwrap();
    tokio::spawn(async move {
        let inc = l.next().await.unwrap();
        inc.reject(RejReason::ConsumerReject, &[], b"not now")
            .await
            .unwrap();
        // The second one gets an MRA, then an accept after 2 s (longer than the REQ
        // timeout of ~0.28 s, so without the MRA it would have been retransmitted).
        let inc = l.next().await.unwrap();
        inc.mra(TimeoutExp::new(20).unwrap()).await.unwrap();
        tokio::time::sleep(Duration::from_secs(2)).await;
        let c = inc
            .accept(AcceptParams::new(Qpn::new(0x23).unwrap()))
            .await
            .unwrap();
        c.established().await.unwrap();
    });
    let err = a.connect(params(b_addr, 0x11)).await.unwrap_err();
    assert!(matches!(
        err,
        CmError::Connection(ConnectionError::Rejected { private_data, .. }) if private_data == b"not now"
    ));
    let c = a.connect(params(b_addr, 0x12)).await.unwrap();
    assert_eq!(c.status(), ConnStatus::Established);
    let st = a.stats().await.unwrap().endpoint;
    assert_eq!(st.mra_received, 1);
    assert_eq!(st.retransmits, 0);
}

#[tokio::test(start_paused = true)]
async fn sidr_round_trip() {
    let net = MemNetwork::new();
    let (a, b, b_addr) = pair(&net);
    let mut l = b
        .listen(ServiceId(0x0111_0001), ListenOptions::default())
        .await
        .unwrap();
    tokio::spawn(async move {
        let inc = l.next().await.unwrap();
        assert!(matches!(inc.kind(), IncomingKind::Sidr(_)));
        inc.sidr_reply(SidrRepParams::success(
            Qpn::new(0x77).unwrap(),
            Qkey(0x1234),
        ))
        .await
        .unwrap();
    });
    let ans = a
        .sidr(SidrReqParams::new(b_addr, ServiceId(0x0111_0001)))
        .await
        .unwrap();
    assert_eq!(ans.status, SidrStatus::Success);
    assert_eq!(ans.qpn, Qpn::new(0x77).unwrap());
    assert_eq!(ans.qkey, Qkey(0x1234));
    // Unknown service: status 1.
    let ans = a
        .sidr(SidrReqParams::new(b_addr, ServiceId(9)))
        .await
        .unwrap();
    assert_eq!(ans.status, SidrStatus::UnsupportedServiceId);
}

#[tokio::test(start_paused = true)]
async fn shutdown_makes_handles_fail() {
    let net = MemNetwork::new();
    let (a, _b, b_addr) = pair(&net);
    a.shutdown();
    tokio::task::yield_now().await;
    let err = a.connect(params(b_addr, 0x11)).await.unwrap_err();
    assert!(matches!(err, CmError::DriverGone));
}

#[tokio::test(start_paused = true)]
async fn api_misuse_is_a_typed_error() {
    let net = MemNetwork::new();
    let (a, _b, b_addr) = pair(&net);
    let mut p = params(b_addr, 0x11);
    p.private_data = vec![0; 93];
    assert!(matches!(
        a.start_connect(p).await,
        Err(CmError::Connect(ConnectError::PrivateDataTooLong {
            len: 93,
            max: 92
        }))
    ));
    let nowhere = addr("127.0.0.9:4791");
    let _c = a.start_connect(params(nowhere, 0x11)).await.unwrap();
    assert!(matches!(
        a.start_connect(params(nowhere, 0x11)).await,
        Err(CmError::Connect(ConnectError::QpnInUse { .. }))
    ));
}
