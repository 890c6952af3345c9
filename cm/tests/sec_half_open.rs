//! Finding 1 of issue 12: half-open state an attacker cannot pin.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

mod sec_common;

use std::time::Duration;

use ibcm::proto::*;
use sec_common::*;

/// Finding 1: ~4,200 REQs with Local CM Response Timeout 31 and Max CM Retries 15 from a few
/// sources (the listener's application accepts them all, so each holds a REP_SENT slot)
/// locked legitimate connects out for hours: the 4,096 slots were shared and never evicted,
/// and each lived 16 × 2.4 h. Now the per-source and per-service sub-caps and eviction of
/// the oldest entry let a client from another source connect at once, and no hostile entry
/// outlives `max_half_open_lifetime`.
#[test]
fn flood_of_pinning_reqs_does_not_lock_out() {
    let mut p = Pair::new(EndpointConfig::default());
    for i in 0..4_200u32 {
        let src = addr(&format!("192.0.2.{}:4791", 1 + i % 5));
        let req = hostile_req(0x1000_0000 + i, 0xbad0 + u64::from(i % 5), 0x10 + i, 31, 15);
        p.l.handle_datagram(p.now, src, &req);
        p.pump();
    }
    assert!(p.l.half_open() <= 4096);
    // Legitimate connects from another source succeed, several in a row.
    for k in 0..50u32 {
        p.connect(0x50_0000 + k);
    }
    assert_eq!(p.a_established, 50, "legitimate connects locked out");
    assert_eq!(p.a_closed, 0);
    // And the hostile entries are gone within the lifetime bound (not after ~19 h).
    p.advance(EndpointConfig::default().max_half_open_lifetime + Duration::from_secs(1));
    assert_eq!(
        p.l.half_open(),
        0,
        "half-open entries pinned past their lifetime"
    );
    assert!(p.l.stats().half_open_expired > 0);
}

/// Finding 1: the Local CM Response Timeout and Max CM Retries honoured from a REQ are
/// clamped to `[min, max]_peer_cm_response_timeout` / `_retries`, with defaults that admit
/// Linux rdma_cm's 20 / 15 unchanged.
#[test]
fn req_timeout_and_retries_are_clamped() {
    let src = addr("192.0.2.1:4791");
    for (asked, want) in [(0u8, 8u8), (31, 22), (20, 20)] {
        let mut p = Pair::new(EndpointConfig::default());
        p.l.handle_datagram(p.now, src, &hostile_req(0x4242, 0xbad, 0x99, asked, 15));
        p.pump();
        let first = p.l.poll_timeout().unwrap() - p.now;
        let exp = ibcm_mad::TimeoutExp::masked(want).to_duration();
        let diff = first.as_micros().abs_diff(exp.as_micros());
        assert!(
            diff <= 1,
            "REQ timeout {asked} → REP retransmit after {first:?}"
        );
    }
    let mut p = Pair::new(EndpointConfig {
        max_peer_cm_retries: 2,
        ..Default::default()
    });
    let req = hostile_req(0x4242, 0xbad, 0x99, 20, 15);
    p.l.handle_datagram(p.now, src, &req);
    p.pump();
    // Duplicates widen the anti-amplification budget, so only the ceiling limits the REPs.
    for _ in 0..8 {
        p.l.handle_datagram(p.now, src, &req);
    }
    p.advance(Duration::from_secs(3600));
    let reps = p.l.stats().retransmits;
    assert_eq!(reps, 2, "Max CM Retries 15 honoured beyond the ceiling 2");
}

/// Finding 1: one service ID's flood evicts that service's oldest entries, and a source that
/// holds its share is refused (REJ 3) instead of evicting others.
#[test]
fn per_source_cap_refuses_and_eviction_is_oldest_first() {
    let mut p = Pair::new(EndpointConfig {
        max_half_open: 64,
        max_half_open_per_source: 16,
        ..Default::default()
    });
    let one = addr("192.0.2.1:4791");
    for i in 0..20u32 {
        p.l.handle_datagram(p.now, one, &hostile_req(0x100 + i, 0xbad, 0x10 + i, 20, 15));
        p.pump();
    }
    assert_eq!(p.l.half_open(), 16);
    assert_eq!(p.l.stats().half_open_limit, 4);
    // Many sources: the cap holds and the oldest go first.
    for i in 0..200u32 {
        let src = addr(&format!("198.51.100.{}:4791", 1 + i % 100));
        p.l.handle_datagram(
            p.now,
            src,
            &hostile_req(0x9000 + i, 0xbee0 + u64::from(i % 100), 0x400 + i, 20, 15),
        );
        p.pump();
    }
    assert_eq!(p.l.half_open(), 64);
    assert!(p.l.stats().half_open_evicted >= 200 + 16 - 64);
    p.connect(0x77_0000);
    assert_eq!(p.a_established, 1);
}
