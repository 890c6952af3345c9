//! The endpoint's admission limits are options of `ibcmd` (issue 26 §1.7): with
//! `--max-half-open-per-peer 2`, a third REQ from one host while two are unanswered is
//! rejected with REJ 3 "no resources", and the client's error says which limits refuse it.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use ibcm::proto::{ConnectParams, ConnectionError, EndpointConfig, ListenOptions};
use ibcm::rt::{Cm, CmError, UdpTransport};
use ibcm_mad::{Guid, Qpn, RejReason, ServiceId};

use common::{daemon_with, scratch, DEADLINE};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_half_open_per_peer_is_an_option() {
    let dir = scratch("limits");
    let (_d, sock) = daemon_with(
        &dir,
        "srv",
        "127.0.29.11",
        &["--max-half-open-per-peer", "2"],
    );
    // The server: a client of the daemon that listens and never answers.
    let (srv, _task) = Cm::attach(&sock).await.unwrap();
    let mut l = srv
        .listen(ServiceId(0x29), ListenOptions::default())
        .await
        .unwrap();
    // One peer host: an endpoint in this process.
    let t = UdpTransport::bind("127.0.29.12".parse().unwrap())
        .await
        .unwrap();
    let cfg = EndpointConfig {
        local_ca_guid: Guid(0x2912),
        ..EndpointConfig::default()
    };
    let (cm, _drv) = Cm::bind(t, cfg);
    let to: SocketAddr = "127.0.29.11:4791".parse().unwrap();
    let connect = |q: u32| {
        let cm = cm.clone();
        tokio::spawn(async move {
            let mut p = ConnectParams::new(to, ServiceId(0x29), Qpn::new(q).unwrap());
            p.connect_timeout = Some(Duration::from_secs(20));
            cm.connect_manual(p).await.map(|_| ())
        })
    };
    let first = [connect(0x2901), connect(0x2902)];
    let mut held = Vec::new();
    for _ in 0..2 {
        let inc = tokio::time::timeout(DEADLINE, l.next()).await.unwrap();
        held.push(inc.unwrap());
    }
    let third = tokio::time::timeout(DEADLINE, connect(0x2903))
        .await
        .unwrap()
        .unwrap();
    match third {
        Err(CmError::Connection(ConnectionError::Rejected { reason, .. })) => {
            assert_eq!(reason, RejReason::NoResources);
        }
        other => panic!("the third REQ from one host: {other:?}"),
    }
    // The two first are still waiting for their answers.
    assert!(first.iter().all(|t| !t.is_finished()));
    drop(held);
}

#[test]
fn the_admission_limits_are_listed_with_their_defaults() {
    let out = std::process::Command::new(common::ibcmd_bin())
        .arg("--help")
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    for (opt, default) in [
        ("--max-half-open <", "4096"),
        ("--max-half-open-per-peer", "1024"),
        ("--max-half-open-per-service", "3072"),
        ("--max-half-open-secs", "90"),
        ("--max-established <", "1048576"),
        ("--max-established-per-peer", "65536"),
    ] {
        let at = help
            .find(opt)
            .unwrap_or_else(|| panic!("{opt} missing:\n{help}"));
        let rest = &help[at..];
        let end = rest.find("[default: ").unwrap();
        assert!(
            rest[end..].starts_with(&format!("[default: {default}]")),
            "{opt}: {}",
            &rest[..end + 30]
        );
    }
}
