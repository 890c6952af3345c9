//! Bounds and expiries of per-peer state (issue 12): nothing a peer makes the endpoint keep
//! stays forever, and no table grows past its cap.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::time::{Duration, Instant};

use ibcm::proto::*;
use ibcm_mad::*;

const SID: ServiceId = ServiceId(0x77);

fn addr(s: &str) -> PeerAddr {
    PeerAddr::Udp(s.parse().unwrap())
}

fn listener(cfg: EndpointConfig) -> Endpoint {
    let mut ep = Endpoint::new(EndpointConfig {
        rng_seed: Some(7),
        local_ca_guid: Guid(2),
        ..cfg
    });
    ep.listen(SID, ListenOptions::default());
    ep
}

fn sidr_req(request_id: u32) -> Vec<u8> {
    let m = SidrReq {
        request_id: RequestId(request_id),
        partition_key: Pkey::DEFAULT,
        service_id: SID,
        private_data: PrivateData::zeroed(),
    };
    Mad::new(Tid(u64::from(request_id)), CmMessage::SidrReq(m))
        .to_bytes()
        .to_vec()
}

/// Finding 7 (the `cm_endpoint` fuzz input of issue 12): an incoming SIDR_REQ that the
/// application never answers stayed in `sidr_in` forever, so the endpoint was not
/// `is_empty()` after the harness's 600 s wind-down. Now it expires after
/// `sidr_in_lifetime` with `EventKind::SidrReqExpired`, and a late answer is refused.
#[test]
fn unanswered_sidr_req_expires() {
    #[allow(clippy::disallowed_methods)]
    let t0 = Instant::now();
    let peer = addr("127.0.0.1:4791");
    let mut ep = listener(EndpointConfig::default());
    ep.handle_datagram(t0, peer, &sidr_req(1));
    let ev = ep.poll_event().unwrap();
    assert!(matches!(ev.kind, EventKind::SidrReqReceived(_)));
    assert!(!ep.is_empty());
    // The application never answers; the harness jumps 600 s and fires the timers.
    let later = t0 + Duration::from_secs(600);
    ep.handle_timeout(later);
    assert!(ep.is_empty(), "unanswered SIDR_REQ still held after 600 s");
    assert_eq!(ep.poll_event().unwrap().kind, EventKind::SidrReqExpired);
    assert_eq!(ep.stats().sidr_in_expired, 1);
    let late = ep.sidr_reply(
        later,
        ev.conn,
        SidrRepParams::success(Qpn::masked(5), Qkey(1)),
    );
    assert!(matches!(late, Err(CallError::UnknownConnection(_))));
    assert!(ep.poll_transmit().is_none());
}

/// Finding 7: incoming SIDR_REQs are capped (`max_sidr_in`); a flood evicts the oldest
/// instead of growing the table.
#[test]
fn sidr_in_is_capped_oldest_evicted() {
    #[allow(clippy::disallowed_methods)]
    let t0 = Instant::now();
    let peer = addr("127.0.0.1:4791");
    let mut ep = listener(EndpointConfig {
        max_sidr_in: 16,
        ..Default::default()
    });
    let mut first = None;
    for i in 0..1000u32 {
        ep.handle_datagram(
            t0 + Duration::from_micros(u64::from(i)),
            peer,
            &sidr_req(i + 1),
        );
        while let Some(ev) = ep.poll_event() {
            if first.is_none() {
                first = Some(ev.conn);
            }
        }
    }
    assert_eq!(ep.stats().sidr_in_expired, 1000 - 16);
    let r = ep.sidr_reply(
        t0,
        first.unwrap(),
        SidrRepParams::success(Qpn::masked(5), Qkey(1)),
    );
    assert!(r.is_err(), "the oldest request was evicted");
    ep.handle_timeout(t0 + Duration::from_secs(600));
    assert!(ep.is_empty());
}

/// A late duplicate of a REQ whose connection is already in TimeWait used to miss the
/// duplicate index and create a second (half-open) connection, which then held the peer's
/// (QPN, CA GUID) and refused its next REQ as stale. The duplicate index now keeps
/// connections until they leave TimeWait (as Linux's remote-ID table does).
#[test]
fn late_duplicate_req_in_timewait_creates_nothing() {
    #[allow(clippy::disallowed_methods)]
    let t0 = Instant::now();
    let peer = addr("127.0.0.1:4791");
    let mut ep = listener(EndpointConfig::default());
    let mut req = Req {
        local_comm_id: CommId(0x1234),
        service_id: SID,
        local_ca_guid: Guid(0xaa),
        local_qpn: Qpn::masked(0x100),
        ..Req::default()
    };
    req.set_transport(ReqTransport::Rc);
    let req = Mad::new(Tid(1), CmMessage::Req(req)).to_bytes();
    ep.handle_datagram(t0, peer, &req);
    let c = ep.poll_event().unwrap().conn;
    ep.accept(t0, c, AcceptParams::new(Qpn::masked(0x22)))
        .unwrap();
    let rtu = Rtu {
        local_comm_id: CommId(0x1234),
        remote_comm_id: c,
        private_data: PrivateData::zeroed(),
    };
    ep.handle_datagram(t0, peer, &Mad::new(Tid(1), CmMessage::Rtu(rtu)).to_bytes());
    ep.disconnect(t0, c, &[]).unwrap();
    let drep = Drep {
        local_comm_id: CommId(0x1234),
        remote_comm_id: c,
        private_data: PrivateData::zeroed(),
    };
    ep.handle_datagram(
        t0,
        peer,
        &Mad::new(Tid(1), CmMessage::Drep(drep)).to_bytes(),
    );
    assert_eq!(ep.state(c), Some(State::Timewait));
    while ep.poll_event().is_some() {}
    ep.handle_datagram(t0, peer, &req);
    assert_eq!(ep.len(), 1, "a late duplicate REQ created a connection");
    assert!(ep.poll_event().is_none());
    assert_eq!(ep.half_open(), 0);
}
