//! The stateless mode through the async API, over RoCEv2/UDP on loopback
//! (`Cm::listen_stateless`, `Listener::next_arrival`): connections answered with cookies
//! arrive established, with the REQ they answered; without pressure the same listener hands
//! out requests as usual.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use ibcm::proto::{
    AcceptParams, ConnectParams, ConnectionError, EndpointConfig, ListenOptions, StatelessAccept,
};
use ibcm::rt::{Arrival, Cm, ConnStatus, DatagramTransport, UdpTransport};
use ibcm_mad::{Guid, Qpn, ServiceId};

const SID: ServiceId = ServiceId(0x5eed);

async fn endpoints(cfg: EndpointConfig) -> (Cm, Cm, ibcm::proto::PeerAddr) {
    let lt = UdpTransport::bind_port("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let l_addr = lt.local_addr();
    let ct = UdpTransport::bind_port("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let (l, _) = Cm::bind(
        lt,
        EndpointConfig {
            local_ca_guid: Guid(0x51),
            ..cfg
        },
    );
    let (c, _) = Cm::bind(
        ct,
        EndpointConfig {
            local_ca_guid: Guid(0xc1),
            ..Default::default()
        },
    );
    (l, c, l_addr)
}

fn template() -> StatelessAccept {
    StatelessAccept::new(
        AcceptParams::new(Qpn::masked(0)),
        Qpn::masked(0x80_0000),
        0x10_0000,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stateless_connections_through_the_async_api() {
    let (l, c, l_addr) = endpoints(EndpointConfig {
        stateless_always: true,
        ..Default::default()
    })
    .await;
    let mut listener = l
        .listen_stateless(SID, ListenOptions::default(), template())
        .await
        .unwrap();
    let mut clients = Vec::new();
    for i in 0..20u32 {
        let p = ConnectParams::new(l_addr, SID, Qpn::masked(0x100 + i));
        clients.push(c.start_connect(p).await.unwrap());
    }
    let mut passive = Vec::new();
    for _ in 0..20 {
        match listener.next_arrival().await.unwrap() {
            Arrival::Stateless(conn, info) => {
                assert_eq!(conn.status(), ConnStatus::Established);
                assert_eq!(info.rep.local_comm_id, conn.id());
                passive.push((conn, info));
            }
            Arrival::Request(_) => panic!("a stateful request under stateless_always"),
        }
    }
    for cl in &clients {
        cl.established().await.unwrap();
        let rep = cl.rep().unwrap();
        let (srv, info) = passive
            .iter()
            .find(|(s, _)| s.id() == rep.rep.local_comm_id)
            .expect("the client's REP names a passive connection");
        assert_eq!(info.req.req.local_comm_id, cl.id());
        assert_eq!(info.req.remote_qpn(), info.req.req.local_qpn);
        assert_eq!(rep.remote_qpn, info.local_qpn());
        assert_eq!(srv.status(), ConnStatus::Established);
    }
    let st = l.stats().await.unwrap();
    assert_eq!(st.endpoint.stateless_established, 20);
    assert_eq!(st.half_open, 0);
    // They end like any other connection.
    for cl in &clients {
        let why = cl.disconnect(&[]).await;
        assert!(matches!(
            why,
            ConnectionError::Disconnected { by_peer: false, .. }
        ));
    }
    for (srv, _) in &passive {
        assert!(matches!(
            srv.closed().await,
            ConnectionError::Disconnected { by_peer: true, .. }
        ));
    }
    l.shutdown();
    c.shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_listener_switches_at_the_threshold() {
    let (l, c, l_addr) = endpoints(EndpointConfig {
        stateless_threshold: 1,
        ..Default::default()
    })
    .await;
    let mut listener = l
        .listen_stateless(SID, ListenOptions::default(), template())
        .await
        .unwrap();
    // No pressure: the first REQ is a request for the application, held unanswered.
    let first = c
        .start_connect(ConnectParams::new(l_addr, SID, Qpn::masked(0x201)))
        .await
        .unwrap();
    let Some(Arrival::Request(held)) = listener.next_arrival().await else {
        panic!("expected a request");
    };
    // One half-open entry now: the next one is answered statelessly.
    let second = c
        .start_connect(ConnectParams::new(l_addr, SID, Qpn::masked(0x202)))
        .await
        .unwrap();
    let Some(Arrival::Stateless(conn, _)) = listener.next_arrival().await else {
        panic!("expected a stateless connection");
    };
    second.established().await.unwrap();
    assert_eq!(second.rep().unwrap().rep.local_comm_id, conn.id());
    // The held request is still the application's to answer.
    let srv = held
        .accept(AcceptParams::new(Qpn::masked(0x301)))
        .await
        .unwrap();
    first.established().await.unwrap();
    srv.established().await.unwrap();
    l.shutdown();
    c.shutdown();
}
