//! [`ibcm::App`] in its two hosts: the simulator and the tokio driver. An application that
//! answers REQs on its own timer (so its deadline must be folded into the host's), consumes
//! the events of its connections, and lets the others through.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]
#![cfg(any(feature = "rt", feature = "sim"))]

use std::time::{Duration, Instant};

use ibcm::proto::{AcceptParams, ConnId, Endpoint, Event, EventKind};
use ibcm::App;
use ibcm_mad::{Qpn, ServiceId};

const SID: ServiceId = ServiceId(0x42);
const DELAY: Duration = Duration::from_millis(7);

/// Accepts the REQs of [`SID`] `DELAY` after they arrived, on its own timer.
#[derive(Debug, Default)]
struct LateAcceptor {
    pending: Vec<ConnId>,
    deadline: Option<Instant>,
    /// (deadline, when the timer fired).
    fired: Vec<(Instant, Instant)>,
    mine: Vec<ConnId>,
    established: Vec<ConnId>,
    polls: u64,
}

impl App for LateAcceptor {
    fn handle_event(&mut self, _ep: &mut Endpoint, now: Instant, ev: &Event) -> bool {
        match &ev.kind {
            EventKind::ReqReceived(req) if req.service_id() == SID => {
                self.pending.push(ev.conn);
                self.mine.push(ev.conn);
                self.deadline.get_or_insert(now + DELAY);
                true
            }
            EventKind::Established if self.mine.contains(&ev.conn) => {
                self.established.push(ev.conn);
                true
            }
            _ => self.mine.contains(&ev.conn),
        }
    }

    fn poll(&mut self, _ep: &mut Endpoint, _now: Instant) {
        self.polls += 1;
    }

    fn poll_timeout(&self) -> Option<Instant> {
        self.deadline
    }

    fn handle_timeout(&mut self, ep: &mut Endpoint, now: Instant) {
        let Some(d) = self.deadline.take() else {
            return;
        };
        self.fired.push((d, now));
        for (i, c) in self.pending.drain(..).enumerate() {
            let qpn = Qpn::new(0x300 + i as u32).unwrap();
            ep.accept(now, c, AcceptParams::new(qpn)).unwrap();
        }
    }
}

/// Another application type.
#[cfg_attr(not(feature = "rt"), allow(dead_code))]
struct Other;

impl App for Other {
    fn handle_event(&mut self, _: &mut Endpoint, _: Instant, _: &Event) -> bool {
        false
    }
}

#[cfg(feature = "sim")]
#[test]
fn sim_fires_app_timers_at_their_deadline() {
    use ibcm::proto::{ConnectParams, EndpointConfig, ListenOptions, State};
    use ibcm::sim::{AppFn, SimNet};

    let mut net = SimNet::new(3);
    let a = net.add_node(EndpointConfig::default());
    let b = net.add_node(EndpointConfig::default());
    net.set_app(b, LateAcceptor::default());
    net.endpoint(b).listen(SID, ListenOptions::default());
    let (peer, now) = (net.addr(b), net.now());
    let c = net
        .endpoint(a)
        .connect(now, ConnectParams::new(peer, SID, Qpn::new(7).unwrap()))
        .unwrap();
    assert!(net.run_until(
        |n| n.endpoint_ref(a).state(c) == Some(State::Established)
            && n.app::<LateAcceptor>(b)
                .is_some_and(|x| !x.established.is_empty()),
        1000
    ));
    let app = net.app::<LateAcceptor>(b).unwrap();
    assert_eq!(app.fired.len(), 1);
    let (deadline, fired) = app.fired[0];
    assert_eq!(fired, deadline, "fired at its exact deadline");
    assert_eq!(app.established, app.mine);
    assert!(app.polls > 0);
    // Every event is still recorded, consumed or not.
    assert!(net
        .take_events(b)
        .iter()
        .any(|(_, e)| matches!(e.kind, EventKind::ReqReceived(_))));
    // The app by its type, with the endpoint; another type is no app.
    let state = net.with_app(b, |x: &mut LateAcceptor, ep, _| ep.state(x.mine[0]));
    assert_eq!(state, Some(Some(State::Established)));
    assert!(net.with_app(b, |_: &mut AppFn, _, _| ()).is_none());
}

#[cfg(feature = "rt")]
#[tokio::test(start_paused = true)]
async fn driver_runs_the_app_next_to_the_endpoint() {
    use ibcm::proto::{ConnectParams, EndpointConfig, ListenOptions};
    use ibcm::rt::{Cm, CmError, MemNetwork};
    use ibcm_mad::Guid;

    let net = MemNetwork::new();
    let a_addr: ibcm::proto::PeerAddr = "127.0.0.1:4791"
        .parse::<std::net::SocketAddr>()
        .unwrap()
        .into();
    let b_addr: ibcm::proto::PeerAddr = "127.0.0.2:4791"
        .parse::<std::net::SocketAddr>()
        .unwrap()
        .into();
    let (a, _) = Cm::bind(net.transport(a_addr), EndpointConfig::default());
    let (b, _) = Cm::bind_with_app(
        net.transport(b_addr),
        EndpointConfig {
            local_ca_guid: Guid(2),
            ..EndpointConfig::default()
        },
        LateAcceptor::default(),
    );
    // A handle listens on both services; the app consumes the REQs of SID only.
    let mut l42 = b.listen(SID, ListenOptions::default()).await.unwrap();
    let mut l43 = b
        .listen(ServiceId(0x43), ListenOptions::default())
        .await
        .unwrap();

    let start = tokio::time::Instant::now();
    let conn = a
        .connect(ConnectParams::new(b_addr, SID, Qpn::new(0x11).unwrap()))
        .await
        .unwrap();
    assert!(start.elapsed() >= DELAY, "accepted on the app's timer");
    let (fired, established, polls, id) = b
        .with_app(|x: &mut LateAcceptor, _, _| {
            (x.fired.clone(), x.established.clone(), x.polls, x.mine[0])
        })
        .await
        .unwrap();
    assert_eq!(fired.len(), 1);
    assert_eq!(fired[0].1, fired[0].0, "fired at its exact deadline");
    assert_eq!(established, vec![id]);
    assert!(polls > 0);
    assert!(b.connection(id).is_none(), "consumed: no handle");
    assert!(
        tokio::time::timeout(Duration::from_millis(1), l42.next())
            .await
            .is_err(),
        "a consumed REQ reaches no listener"
    );

    // Not consumed: the listener gets it, as without an app.
    let other = tokio::spawn({
        let a = a.clone();
        async move {
            a.connect(ConnectParams::new(
                b_addr,
                ServiceId(0x43),
                Qpn::new(0x12).unwrap(),
            ))
            .await
        }
    });
    let inc = l43.next().await.unwrap();
    let passive = inc
        .accept(AcceptParams::new(Qpn::new(0x400).unwrap()))
        .await
        .unwrap();
    other.await.unwrap().unwrap();
    passive.established().await.unwrap();

    // The app by its type; another type is no app, and a plain endpoint has none.
    assert!(matches!(
        b.with_app(|_: &mut Other, _, _| ()).await,
        Err(CmError::NoApp)
    ));
    assert!(matches!(
        a.with_app(|_: &mut LateAcceptor, _, _| ()).await,
        Err(CmError::NoApp)
    ));
    // Commands from the app go out like the handles' (a DREQ for the app's connection).
    b.with_app(move |_: &mut LateAcceptor, ep, now| ep.disconnect(now, id, &[]))
        .await
        .unwrap()
        .unwrap();
    assert!(matches!(
        conn.closed().await,
        ibcm::proto::ConnectionError::Disconnected { by_peer: true, .. }
    ));
}
