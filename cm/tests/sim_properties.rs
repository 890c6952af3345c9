//! Simulator properties over 200 seeds × loss {0, 5 %, 20 %, 50 %}, with duplication and
//! reordering on:
//! * both ends agree: both established, or both failed with matching reasons;
//! * no more than 1 + max_retries copies of any request (REQ, REP, DREQ);
//! * the tables are empty after TimeWait;
//! * no QPN or comm ID is reused inside TimeWait.
//!
//! Node A opens connections on a small pool of QPNs, disconnects each once established and
//! reconnects on the same QPN as soon as its TimeWait ends (trying once before, which must be
//! refused). Node B accepts everything.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    // Inserting into a set inside a match guard would hide the side effect.
    clippy::collapsible_match
)]
#![cfg(feature = "sim")]

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::rc::Rc;
use std::time::Duration;

use ibcm::proto::*;
use ibcm::sim::{auto_accept, Link, SimNet};
use ibcm_mad::*;

const SID: ServiceId = ServiceId(0x0000_0000_0106_0001);
const RETRIES: u8 = 15;
const QPNS: [u32; 3] = [0x100, 0x101, 0x102];
const ROUNDS: u32 = 2;

#[derive(Debug, Default)]
struct Log {
    /// Per connection: ever established, how it closed.
    established: BTreeSet<ConnId>,
    closed: BTreeMap<ConnId, ConnectionError>,
    /// Connections that exist now (incl. TimeWait): for the reuse checks.
    live: BTreeSet<ConnId>,
    /// Local QPN per live connection of A.
    qpn_of: BTreeMap<ConnId, Qpn>,
    /// Times a reconnect on a QPN still in TimeWait was refused, as it must be.
    quarantine_refusals: u32,
    violations: Vec<String>,
}

fn params(peer: PeerAddr, qpn: u32) -> ConnectParams {
    let mut p = ConnectParams::new(peer, SID, Qpn::new(qpn).unwrap());
    p.remote_cm_response_timeout = TimeoutExp::new(12).unwrap(); // 16.8 ms
    p.local_cm_response_timeout = TimeoutExp::new(12).unwrap();
    p.packet_life_time = TimeoutExp::new(8).unwrap();
    p.max_cm_retries = U4::new(RETRIES).unwrap();
    p
}

/// Node A's application.
fn initiator(log: Rc<RefCell<Log>>, peer: PeerAddr) -> ibcm::sim::AppFn {
    let mut rounds: BTreeMap<u32, u32> = QPNS.iter().map(|&q| (q, 1)).collect();
    Box::new(move |ep, now, ev| {
        let mut l = log.borrow_mut();
        match &ev.kind {
            EventKind::Established => {
                l.established.insert(ev.conn);
                let _ = ep.disconnect(now, ev.conn, &[]);
            }
            EventKind::Closed(err) => {
                if l.closed.insert(ev.conn, err.clone()).is_some() {
                    l.violations.push(format!("A: {} closed twice", ev.conn));
                }
                // Reconnecting on the QPN now must fail while the connection is in TimeWait.
                if let Some(&qpn) = l.qpn_of.get(&ev.conn) {
                    if ep.state(ev.conn) == Some(State::Timewait) {
                        match ep.connect(now, params(peer, qpn.get())) {
                            Err(ConnectError::QpnInQuarantine { .. }) => l.quarantine_refusals += 1,
                            other => l
                                .violations
                                .push(format!("A: reuse of {qpn} in TimeWait gave {other:?}")),
                        }
                    } else if ep.state(ev.conn).is_none() {
                        // Gone without TimeWait: reconnect at once.
                        reconnect(&mut l, ep, now, peer, qpn.get(), &mut rounds, ev.conn);
                    }
                }
            }
            EventKind::TimewaitExit { local_qpn } => {
                if let Some(q) = l.qpn_of.get(&ev.conn).copied() {
                    if q != *local_qpn {
                        l.violations
                            .push(format!("A: TimewaitExit QPN {local_qpn} != {q}"));
                    }
                }
                reconnect(&mut l, ep, now, peer, local_qpn.get(), &mut rounds, ev.conn);
            }
            _ => {}
        }
    })
}

fn reconnect(
    l: &mut Log,
    ep: &mut Endpoint,
    now: std::time::Instant,
    peer: PeerAddr,
    qpn: u32,
    rounds: &mut BTreeMap<u32, u32>,
    old: ConnId,
) {
    l.live.remove(&old);
    l.qpn_of.remove(&old);
    let r = rounds.entry(qpn).or_default();
    if *r >= ROUNDS {
        return;
    }
    *r += 1;
    match ep.connect(now, params(peer, qpn)) {
        Ok(c) => {
            if !l.live.insert(c) {
                l.violations
                    .push(format!("A: comm ID {c} reused while live/TimeWait"));
            }
            l.qpn_of.insert(c, Qpn::new(qpn).unwrap());
        }
        Err(e) => l.violations.push(format!("A: reconnect on {qpn}: {e}")),
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Class {
    Established,
    Timeout,
    Rejected(RejReason),
}

fn class_of(established: bool, err: Option<&ConnectionError>) -> Class {
    // A DREQ in REP_SENT (the RTU overtaken or lost) closes a connection the peer had
    // established: it counts as established (docs/protocol.md §4.7, REP_SENT + DREQ rx).
    if established || matches!(err, Some(ConnectionError::Disconnected { .. })) {
        return Class::Established;
    }
    match err {
        None | Some(ConnectionError::TimedOut) => Class::Timeout,
        Some(ConnectionError::Rejected {
            reason: RejReason::Timeout,
            ..
        }) => Class::Timeout,
        Some(ConnectionError::Rejected { reason, .. }) => Class::Rejected(*reason),
        Some(ConnectionError::LocallyRejected { reason }) => Class::Rejected(*reason),
        Some(ConnectionError::Stale) => Class::Rejected(RejReason::StaleConn),
        Some(e) => panic!("unexpected setup failure {e:?}"),
    }
}

fn run(seed: u64, loss: f64) -> Result<(usize, u64, u32), String> {
    let mut net = SimNet::new(seed);
    let r = run_on(&mut net, loss);
    // On failure, the end of the wire trace goes with the message.
    r.map_err(|e| {
        let t = net.trace();
        let tail = t
            .get(t.len().saturating_sub(40)..)
            .unwrap_or(&[])
            .join("\n");
        format!(
            "{e}\n--- last {} trace lines ---\n{tail}",
            tail.lines().count()
        )
    })
}

fn run_on(net: &mut SimNet, loss: f64) -> Result<(usize, u64, u32), String> {
    net.set_trace(true);
    let a = net.add_node(EndpointConfig {
        timewait: Some(Duration::from_millis(50)),
        ..Default::default()
    });
    let b = net.add_node(EndpointConfig {
        timewait: Some(Duration::from_millis(50)),
        ..Default::default()
    });
    net.set_all_links(Link {
        latency: Duration::from_micros(200),
        jitter: Duration::from_micros(300),
        loss,
        duplicate: 0.05,
        reorder: 0.1,
        corrupt: 0.0,
    });
    let log = Rc::new(RefCell::new(Log::default()));
    let peer = net.addr(b);
    net.set_app(a, initiator(log.clone(), peer));
    // B: accept, and record.
    let blog = Rc::new(RefCell::new(Log::default()));
    {
        let blog = blog.clone();
        let mut accept = auto_accept(0x1000);
        net.set_app::<ibcm::sim::AppFn>(
            b,
            Box::new(move |ep, now, ev| {
                let mut l = blog.borrow_mut();
                match &ev.kind {
                    EventKind::ReqReceived(_) => {
                        if !l.live.insert(ev.conn) {
                            l.violations.push(format!("B: comm ID {} reused", ev.conn));
                        }
                    }
                    EventKind::Established => {
                        l.established.insert(ev.conn);
                    }
                    EventKind::Closed(e) => {
                        if l.closed.insert(ev.conn, e.clone()).is_some() {
                            l.violations.push(format!("B: {} closed twice", ev.conn));
                        }
                    }
                    EventKind::TimewaitExit { .. } => {
                        l.live.remove(&ev.conn);
                    }
                    _ => {}
                }
                drop(l);
                accept(ep, now, ev);
            }),
        );
    }
    net.endpoint(b).listen(SID, ListenOptions::default());
    let now = net.now();
    for q in QPNS {
        let c = net.endpoint(a).connect(now, params(peer, q)).unwrap();
        let mut l = log.borrow_mut();
        l.live.insert(c);
        l.qpn_of.insert(c, Qpn::new(q).unwrap());
    }
    if !net.run_to_idle(2_000_000) {
        return Err("did not go idle".into());
    }
    // Tables empty after TimeWait.
    for (n, name) in [(a, "A"), (b, "B")] {
        let ep = net.endpoint_ref(n);
        if !ep.is_empty() || ep.half_open() != 0 {
            return Err(format!("{name}: table not empty: {:?}", ep.conn_ids()));
        }
    }
    // Retransmission bound.
    for (n, attr) in [(a, AttrId::Req), (b, AttrId::Rep), (a, AttrId::Dreq)] {
        if let Some((copies, id)) = net.max_copies(n, attr) {
            if copies > 1 + u64::from(RETRIES) {
                return Err(format!("{attr:?} {id:#x} sent {copies} times"));
            }
        }
    }
    let la = log.borrow();
    let lb = blog.borrow();
    if let Some(v) = la.violations.first().or(lb.violations.first()) {
        return Err(v.clone());
    }
    // Pair connections by comm IDs through B's view: B's conn → A's conn (its remote ID) is
    // not visible after the fact, so pair by the trace-free route: every A connection that
    // established must have a B connection that established, and counts must agree.
    let a_est = la.established.len();
    let b_est = lb
        .closed
        .iter()
        .filter(|(c, e)| class_of(lb.established.contains(c), Some(e)) == Class::Established)
        .count();
    if a_est != b_est {
        return Err(format!("A established {a_est}, B established {b_est}"));
    }
    for (c, e) in &la.closed {
        let class = class_of(la.established.contains(c), Some(e));
        match class {
            Class::Established => {
                if !matches!(
                    e,
                    ConnectionError::Disconnected { by_peer: false, .. }
                        | ConnectionError::DisconnectTimedOut
                ) {
                    return Err(format!("A {c}: established, then {e:?}"));
                }
            }
            Class::Timeout => {}
            Class::Rejected(r) => return Err(format!("A {c}: rejected {r:?} without cause")),
        }
    }
    for (c, e) in &lb.closed {
        match class_of(lb.established.contains(c), Some(e)) {
            Class::Established => {
                if !matches!(e, ConnectionError::Disconnected { by_peer: true, .. }) {
                    return Err(format!("B {c}: established, then {e:?}"));
                }
            }
            Class::Timeout => {}
            Class::Rejected(r) => return Err(format!("B {c}: rejected {r:?}")),
        }
    }
    // Every connection B saw established was closed by A's DREQ.
    if lb.closed.len() < lb.established.len() {
        return Err("B has established connections that never closed".into());
    }
    // Every round happened: QPNS × ROUNDS attempts, each ended.
    let attempts = la.closed.len();
    if attempts != QPNS.len() * ROUNDS as usize {
        return Err(format!(
            "A: {attempts} attempts ended, expected {}",
            QPNS.len() * 2
        ));
    }
    if la.quarantine_refusals == 0 && a_est > 0 {
        return Err("no reconnect was tried inside TimeWait".into());
    }
    let retransmits =
        net.endpoint_ref(a).stats().retransmits + net.endpoint_ref(b).stats().retransmits;
    Ok((a_est, retransmits, la.quarantine_refusals))
}

fn sweep(loss: f64) {
    let mut failures = Vec::new();
    let (mut est, mut retx, mut refusals) = (0, 0, 0);
    for seed in 0..200u64 {
        match run(seed, loss) {
            Ok((e, r, q)) => {
                est += e;
                retx += r;
                refusals += q;
            }
            Err(e) => failures.push(format!("seed {seed}: {e}")),
        }
    }
    eprintln!(
        "loss {loss}: {est} connections established, {retx} retransmissions, {refusals} \
         reconnects refused inside TimeWait"
    );
    // The runs must exercise what they claim to.
    assert!(est > 200 * QPNS.len() / 2, "too few established: {est}");
    assert!(refusals > 0);
    if loss > 0.1 {
        assert!(retx > 200, "too few retransmissions: {retx}");
    }
    assert!(
        failures.is_empty(),
        "loss {loss}: {} of 200 seeds failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn loss_0() {
    sweep(0.0);
}

#[test]
fn loss_5_percent() {
    sweep(0.05);
}

#[test]
fn loss_20_percent() {
    sweep(0.2);
}

#[test]
fn loss_50_percent() {
    sweep(0.5);
}

/// A failing seed's trace, for debugging: `SEED=17 LOSS=0.5 cargo test -p ibcm --features sim
/// --test sim_properties trace_one -- --nocapture --ignored`.
#[test]
#[ignore]
fn trace_one() {
    let seed = std::env::var("SEED").map_or(0, |s| s.parse().unwrap());
    let loss = std::env::var("LOSS").map_or(0.5, |s| s.parse().unwrap());
    println!("{:?}", run(seed, loss));
}
