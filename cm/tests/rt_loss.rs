//! The tokio driver over a lossy in-memory network ([`MemTransport::with_loss`]), on tokio's
//! paused clock: the passive side loses a quarter of what it sends (REPs), and the CM's
//! retransmissions carry every connection through: the active side resends its REQ, and the
//! duplicate REQ has the passive side resend its REP at once (docs/protocol.md §3, REP_SENT ×
//! REQ). (Losing the active side's RTUs instead is not always survived: the passive side
//! resends its REP only within its anti-amplification budget, §5.8, and then gives up.)
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]
#![cfg(feature = "rt")]

use std::net::SocketAddr;
use std::time::Duration;

use ibcm::proto::{AcceptParams, ConnectParams, EndpointConfig, ListenOptions, PeerAddr};
use ibcm::rt::{Cm, MemNetwork};
use ibcm_mad::{Guid, Qpn, ServiceId, TimeoutExp, U4};

fn addr(s: &str) -> PeerAddr {
    s.parse::<SocketAddr>().unwrap().into()
}

const CONNS: u32 = 40;

#[tokio::test(start_paused = true)]
async fn every_connection_is_established_through_a_lossy_network() {
    let net = MemNetwork::new();
    let (a_addr, b_addr) = (addr("127.0.0.1:4791"), addr("127.0.0.2:4791"));
    let cfg = |seed, guid| EndpointConfig {
        rng_seed: Some(seed),
        local_ca_guid: Guid(guid),
        timewait: Some(Duration::from_millis(100)),
        ..EndpointConfig::default()
    };
    // A quarter of what the passive side sends is lost (seeded: the same losses every run).
    let (a, _) = Cm::bind(net.transport(a_addr), cfg(1, 1));
    let (b, _) = Cm::bind(net.transport(b_addr).with_loss(0.25, 8), cfg(2, 2));
    let sid = ServiceId(0x77);
    let mut l = b.listen(sid, ListenOptions::default()).await.unwrap();
    let server = tokio::spawn(async move {
        let mut conns = Vec::new();
        while conns.len() < CONNS as usize {
            let inc = l.next().await.unwrap();
            let qpn = Qpn::new(0x1000 + conns.len() as u32).unwrap();
            match inc.accept(AcceptParams::new(qpn)).await {
                Ok(c) => conns.push(c),
                Err(e) => panic!("accept #{}: {e:?}", conns.len()),
            }
        }
        let mut bad = Vec::new();
        for (i, c) in conns.iter().enumerate() {
            if let Err(e) = c.established().await {
                bad.push((i, e));
            }
        }
        assert!(bad.is_empty(), "{bad:?}");
        conns
    });
    let mut active = Vec::new();
    for i in 0..CONNS {
        let mut p = ConnectParams::new(b_addr, sid, Qpn::new(0x100 + i).unwrap());
        p.remote_cm_response_timeout = TimeoutExp::new(14).unwrap();
        p.local_cm_response_timeout = TimeoutExp::new(14).unwrap();
        p.packet_life_time = TimeoutExp::new(10).unwrap();
        p.max_cm_retries = U4::new(15).unwrap();
        let c = tokio::time::timeout(Duration::from_secs(120), a.connect(p))
            .await
            .expect("connect stuck")
            .expect("connect failed");
        active.push(c);
    }
    let passive = tokio::time::timeout(Duration::from_secs(120), server)
        .await
        .expect("the passive side is stuck")
        .unwrap();
    assert_eq!(passive.len(), CONNS as usize);
    // The losses cost REQ retransmissions and REPs sent again, which made up for them.
    let (sa, sb) = (a.stats().await.unwrap(), b.stats().await.unwrap());
    assert!(sa.endpoint.retransmits > 0, "no REQ resent: {sa:?}");
    assert!(sb.endpoint.duplicate_replies > 0, "no REP resent: {sb:?}");
    assert!(sa.endpoint.established >= u64::from(CONNS));
    assert!(sb.endpoint.established >= u64::from(CONNS));
}
