//! The two ways of running a wire-up over the simulator: every node in full, or node 0 in
//! full against modelled peers (the per-node model).

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::time::{Duration, Instant};

use ibcm::proto::{EndpointConfig, ListenOptions};
use ibcm::sim::{CmCost, Link, SimNet};
use ibcm_mad::xrc::OwnershipPolicy;

use super::app::{Fabric, Shared, WireupApp, SERVICE};
use super::plan::Shape;

/// Which method produced a figure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Method {
    /// Every node and every connection simulated.
    Full,
    /// Node 0 simulated in full against modelled peers.
    Model,
}

impl Method {
    pub(crate) fn tag(self) -> &'static str {
        match self {
            Method::Full => "full simulation",
            Method::Model => "per-node model",
        }
    }
}

/// Settings of one run.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Setup {
    pub shape: Shape,
    pub loss: f64,
    pub seed: u64,
    pub window: u32,
    /// MADs (received plus sent) one node's CM handles per second.
    pub cm_rate: f64,
    pub latency: Duration,
    pub policy: OwnershipPolicy,
    /// Longest simulated time before giving up.
    pub max_time: Duration,
    /// The first QPN of each node (`app::FIRST_QPN`).
    pub first_qpn: u32,
}

/// What a run measured.
#[derive(Debug, Clone)]
pub(crate) struct Outcome {
    pub method: Method,
    /// MADs put on the wire by the whole fabric (first sends and retransmissions).
    pub mads: u64,
    /// Retransmissions among them.
    pub retransmits: u64,
    /// QPs per node (node 0; in a full run the largest of all nodes).
    pub qps: u64,
    /// Connections in node 0's CM table at the end.
    pub conns: u64,
    /// Per process: when it could reach every other process (all processes in a full run,
    /// node 0's in the model).
    pub proc_done: Vec<Duration>,
    /// When the last connection end of the fabric (full) or of node 0 (model) was complete.
    pub last: Duration,
    /// Whether every tracked node completed.
    pub complete: bool,
    /// Operations that failed and were started again.
    pub restarts: u64,
    /// Operations the endpoint refused to start.
    pub refused: u64,
    /// QPNs the endpoint refused that were replaced by another.
    pub qpn_retries: u64,
    /// Operations that waited for a QPN.
    pub qpn_waits: u64,
    /// Simulator steps.
    pub steps: u64,
}

fn config() -> EndpointConfig {
    EndpointConfig {
        max_half_open: 1 << 24,
        max_half_open_per_source: 1 << 24,
        max_half_open_per_service: 1 << 24,
        max_established: 1 << 30,
        max_established_per_peer: 1 << 30,
        max_sidr_in: 1 << 24,
        ..EndpointConfig::default()
    }
}

struct Net {
    net: SimNet,
    shared: Rc<RefCell<Shared>>,
    epoch: Instant,
}

fn build(s: &Setup, model: bool) -> Net {
    let n = s.shape.nodes;
    let mut net = SimNet::new(s.seed);
    net.set_trace(false);
    net.set_copy_counting(false);
    net.set_event_log(false);
    let cost = CmCost::per_sec(s.cm_rate);
    for i in 0..n {
        let id = net.add_node(config());
        let c = if model && i > 0 {
            CmCost {
                mirror: Some(0),
                ..cost
            }
        } else {
            cost
        };
        net.set_cm_cost(id, c);
        net.endpoint(id).listen(SERVICE, ListenOptions::default());
    }
    net.set_all_links(Link {
        latency: s.latency,
        loss: s.loss,
        ..Link::default()
    });
    let addrs: Vec<_> = (0..n as usize).map(|i| net.addr(i)).collect();
    let index: HashMap<_, _> = addrs
        .iter()
        .enumerate()
        .map(|(i, a)| (*a, i as u32))
        .collect();
    let epoch = net.now();
    let fab = Rc::new(Fabric {
        shape: s.shape,
        addrs,
        index,
        policy: s.policy,
        window: s.window,
        epoch,
        first_qpn: s.first_qpn,
    });
    let shared = Rc::new(RefCell::new(Shared::default()));
    for i in 0..n {
        let app = if model {
            let zero = i == 0;
            WireupApp::new(fab.clone(), shared.clone(), i, zero, zero, zero)
        } else {
            WireupApp::new(fab.clone(), shared.clone(), i, true, true, false)
        };
        net.set_app(i as usize, app);
    }
    Net { net, shared, epoch }
}

/// Runs until every tracked node completed, nothing is left to do, or `max_time`.
fn drive(n: &mut Net, s: &Setup) -> (bool, u64) {
    let deadline = n.epoch + s.max_time;
    let mut steps = 0u64;
    loop {
        if n.shared.borrow().incomplete == 0 {
            return (true, steps);
        }
        if n.net.now() > deadline || !n.net.step() {
            return (false, steps);
        }
        steps += 1;
        let dead = std::mem::take(&mut n.shared.borrow_mut().dead);
        for (node, qpn) in dead {
            n.net
                .with_app::<WireupApp, _>(node as usize, |app, _, now| app.notice(now, qpn));
        }
        let mirror = std::mem::take(&mut n.shared.borrow_mut().mirror);
        for (peer, op) in mirror {
            n.net
                .with_app::<WireupApp, _>(peer as usize, |app, ep, now| app.issue(ep, now, op));
        }
    }
}

fn collect(mut n: Net, s: &Setup, method: Method, complete: bool, steps: u64) -> Outcome {
    let nodes = s.shape.nodes as usize;
    let (mut tx, mut retx) = (0u64, 0u64);
    for i in 0..nodes {
        let st = n.net.endpoint_ref(i).stats();
        tx += st.tx;
        retx += st.retransmits;
    }
    let (mads, retransmits) = match method {
        Method::Full => (tx, retx),
        Method::Model => {
            // Node 0 and its peers exchanged exactly node 0's MADs in both directions; every
            // node of the fabric sends, by symmetry, the mean of the two directions.
            let scale = |total: u64| (total as f64 * nodes as f64 / 2.0).round() as u64;
            (scale(tx), scale(retx))
        }
    };
    let tracked = match method {
        Method::Full => nodes,
        Method::Model => 1,
    };
    let mut qps = 0;
    let mut proc_done = Vec::new();
    let mut last = Duration::ZERO;
    for i in 0..tracked {
        if let Some(app) = n.net.app::<WireupApp>(i) {
            qps = qps.max(app.qps);
            proc_done.extend(app.proc_done.iter().flatten());
            last = last.max(app.last.unwrap_or_default());
        }
    }
    let conns = n.net.endpoint(0).len() as u64;
    let (restarts, refused, qpn_retries, qpn_waits) = {
        let sh = n.shared.borrow();
        (sh.restarts, sh.refused, sh.qpn_retries, sh.qpn_waits)
    };
    Outcome {
        method,
        mads,
        retransmits,
        qps,
        conns,
        proc_done,
        last,
        complete,
        restarts,
        refused,
        qpn_retries,
        qpn_waits,
        steps,
    }
}

/// Every node and every connection.
pub(crate) fn run_full(s: &Setup) -> Outcome {
    let mut n = build(s, false);
    let (complete, steps) = drive(&mut n, s);
    collect(n, s, Method::Full, complete, steps)
}

/// Node 0 in full detail; each peer holds only its connections with node 0 and its CM
/// queues behind node 0's backlog (all nodes are alike in an all-to-all wire-up); each
/// operation node 0 starts towards node d is started at the same instant by node N−d
/// towards node 0.
pub(crate) fn run_model(s: &Setup) -> Outcome {
    let mut n = build(s, true);
    let (complete, steps) = drive(&mut n, s);
    collect(n, s, Method::Model, complete, steps)
}
