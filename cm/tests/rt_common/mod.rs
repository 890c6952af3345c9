//! Helpers shared by the tokio-driver tests (`driver.rs`, `driver_turns.rs`, `rtu_order.rs`):
//! two `Cm`s on an in-memory network, seeded, with a short TimeWait.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::time::Duration;

use ibcm::proto::{EndpointConfig, PeerAddr};
use ibcm::rt::{Cm, MemNetwork};
use ibcm_mad::Guid;

/// A socket address as a [`PeerAddr`].
pub(crate) fn addr(s: &str) -> PeerAddr {
    s.parse::<SocketAddr>().unwrap().into()
}

/// Endpoints `a` (127.0.0.1) and `b` (127.0.0.2, CA GUID 2) on `net`; returns b's address.
pub(crate) fn pair(net: &MemNetwork) -> (Cm, Cm, PeerAddr) {
    let a_addr = addr("127.0.0.1:4791");
    let b_addr = addr("127.0.0.2:4791");
    let (a, _) = Cm::bind(
        net.transport(a_addr),
        EndpointConfig {
            rng_seed: Some(1),
            timewait: Some(Duration::from_millis(100)),
            ..Default::default()
        },
    );
    let (b, _) = Cm::bind(
        net.transport(b_addr),
        EndpointConfig {
            rng_seed: Some(2),
            local_ca_guid: Guid(2),
            timewait: Some(Duration::from_millis(100)),
            ..Default::default()
        },
    );
    (a, b, b_addr)
}
