//! Scripted faults of the simulator ([`SimNet::drop_next`], [`SimNet::partition`],
//! [`SimNet::corrupt_next`]) against the protocol: each fault must be survived (or reported)
//! the way the CM's retransmission rules say.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]
#![cfg(feature = "sim")]

use std::time::Duration;

use ibcm::proto::*;
use ibcm::sim::{auto_accept, SimNet};
use ibcm_mad::*;

const SID: ServiceId = ServiceId(0x0000_0000_0106_0002);
const RETRIES: u8 = 3;
const QPN: u32 = 0x4711;

/// Node A (0) connects, node B (1) listens and accepts everything.
fn pair(seed: u64) -> (SimNet, usize, usize) {
    let mut net = SimNet::new(seed);
    let a = net.add_node(EndpointConfig::default());
    let b = net.add_node(EndpointConfig::default());
    net.set_app(b, auto_accept(0x900));
    net.endpoint(b).listen(SID, ListenOptions::default());
    (net, a, b)
}

/// Short timeouts: REQ timeout 2 × 1.05 ms + 16.8 ms, REP timeout 16.8 ms, 3 retries.
fn params(peer: PeerAddr) -> ConnectParams {
    let mut p = ConnectParams::new(peer, SID, Qpn::new(QPN).unwrap());
    p.remote_cm_response_timeout = TimeoutExp::new(12).unwrap();
    p.local_cm_response_timeout = TimeoutExp::new(12).unwrap();
    p.packet_life_time = TimeoutExp::new(8).unwrap();
    p.max_cm_retries = U4::new(RETRIES).unwrap();
    p
}

/// The active side's wait for an answer to its REQ.
fn req_timeout() -> Duration {
    TimeoutExp::new(8).unwrap().to_duration() * 2 + TimeoutExp::new(12).unwrap().to_duration()
}

fn connect(net: &mut SimNet, a: usize, b: usize) -> ConnId {
    let peer = net.addr(b);
    let now = net.now();
    net.endpoint(a).connect(now, params(peer)).unwrap()
}

/// B's only connection.
fn only_conn(net: &SimNet, n: usize) -> ConnId {
    let ids = net.endpoint_ref(n).conn_ids();
    assert_eq!(ids.len(), 1, "node {n}: {ids:?}\n{}", net.dump_trace());
    ids[0]
}

fn established(net: &SimNet, n: usize, c: ConnId) -> bool {
    net.endpoint_ref(n).state(c) == Some(State::Established)
}

/// Events of one kind-predicate, with their times.
fn events_where(
    net: &mut SimNet,
    n: usize,
    pred: impl Fn(&EventKind) -> bool,
) -> Vec<(Duration, Event)> {
    net.take_events(n)
        .into_iter()
        .filter(|(_, e)| pred(&e.kind))
        .collect()
}

#[test]
fn dropped_rtu_is_recovered_by_the_rep_retransmission() {
    let (mut net, a, b) = pair(1);
    net.drop_next(a, b, AttrId::Rtu);
    let ca = connect(&mut net, a, b);
    assert!(net.run_until(|n| established(n, a, ca), 1_000));
    // A is established at once (auto RTU), but B never saw the RTU.
    let cb = only_conn(&net, b);
    assert_eq!(net.endpoint_ref(b).state(cb), Some(State::RepSent));
    assert!(
        net.run_until(|n| established(n, b, cb), 1_000),
        "{}",
        net.dump_trace()
    );
    // B re-sent its REP once; A answered the duplicate REP with a rebuilt RTU.
    assert_eq!(net.sent_count(b, AttrId::Rep), 2);
    assert_eq!(net.sent_count(a, AttrId::Rtu), 2);
    assert_eq!(net.endpoint_ref(b).stats().retransmits, 1);
    assert_eq!(net.endpoint_ref(a).stats().duplicate_replies, 1);
    assert_eq!(net.endpoint_ref(a).stats().retransmits, 0);
    assert_eq!(net.sent_count(a, AttrId::Req), 1);
    // Each side reports Established exactly once; B only after its REP timeout.
    let ev_a = events_where(&mut net, a, |k| *k == EventKind::Established);
    let ev_b = events_where(&mut net, b, |k| *k == EventKind::Established);
    assert_eq!(ev_a.len(), 1);
    assert_eq!(ev_b.len(), 1);
    let rep_timeout = TimeoutExp::new(12).unwrap().to_duration();
    assert!(ev_b[0].0 >= rep_timeout, "{:?}", ev_b[0].0);
    assert_eq!(net.endpoint_ref(a).stats().established, 1);
    assert_eq!(net.endpoint_ref(b).stats().established, 1);
}

#[test]
fn partition_longer_than_the_retry_budget_times_the_req_out() {
    let (mut net, a, b) = pair(2);
    let budget = req_timeout() * (u32::from(RETRIES) + 1);
    net.partition(a, b, budget * 4);
    let ca = connect(&mut net, a, b);
    assert!(net.run_until(|n| n.endpoint_ref(a).state(ca).is_none(), 1_000));
    // The REQ went out 1 + RETRIES times, then A gave up with one REJ (4, timeout).
    assert_eq!(net.sent_count(a, AttrId::Req), 1 + u64::from(RETRIES));
    assert_eq!(net.sent_count(a, AttrId::Rej), 1);
    let st = net.endpoint_ref(a).stats().clone();
    assert_eq!(st.retransmits, u64::from(RETRIES));
    assert_eq!(st.timeouts, 1);
    assert_eq!(st.rej_sent, 1);
    let rej_lines: Vec<&String> = net
        .trace()
        .iter()
        .filter(|l| l.contains("REJ lcid="))
        .collect();
    assert_eq!(rej_lines.len(), 1, "{}", net.dump_trace());
    assert!(
        rej_lines[0].contains(&format!("lcid={ca} "))
            && rej_lines[0].contains(&format!("reason={} ", RejReason::Timeout.raw())),
        "{}",
        rej_lines[0]
    );
    // The failure is reported once, after the whole retry budget.
    let closed = events_where(&mut net, a, |k| matches!(k, EventKind::Closed(_)));
    assert_eq!(closed.len(), 1);
    assert_eq!(
        closed[0].1.kind,
        EventKind::Closed(ConnectionError::TimedOut)
    );
    assert!(closed[0].0 >= budget, "{:?} < {budget:?}", closed[0].0);
    // Nothing crossed the partition: B never heard of the connection.
    assert_eq!(net.endpoint_ref(b).stats().rx, 0);
    assert!(net.endpoint_ref(b).is_empty());
    // Once the partition is over, the same QPN connects (no TimeWait after a REQ timeout).
    let end = net.now() + budget * 4;
    net.run_until_time(end);
    let ca2 = connect(&mut net, a, b);
    assert!(
        net.run_until(|n| established(n, a, ca2), 1_000),
        "{}",
        net.dump_trace()
    );
    assert_eq!(net.endpoint_ref(a).stats().retransmits, u64::from(RETRIES));
}

#[test]
fn partition_shorter_than_the_retry_budget_is_bridged_by_retransmission() {
    let (mut net, a, b) = pair(3);
    // Cut the first two REQ copies (sent at 0 and after one timeout), not the third.
    net.partition(a, b, req_timeout() + req_timeout() / 2);
    let ca = connect(&mut net, a, b);
    assert!(
        net.run_until(|n| established(n, a, ca), 1_000),
        "{}",
        net.dump_trace()
    );
    assert_eq!(net.sent_count(a, AttrId::Req), 3);
    assert_eq!(net.endpoint_ref(a).stats().retransmits, 2);
    assert_eq!(net.endpoint_ref(a).stats().timeouts, 0);
    // B saw only the copy that got through.
    assert_eq!(net.endpoint_ref(b).stats().rx, 1);
    let cb = only_conn(&net, b);
    assert!(net.run_until(|n| established(n, b, cb), 1_000));
}

/// Corrupting one random byte of the REQ either leaves a MAD B still acts on (a changed field),
/// or one B must drop. In the second case B has no trace of the REQ, and A's retransmission
/// must establish the connection as if the first copy had been lost. Which byte is hit depends
/// on the seed, so run many seeds and require both outcomes, the malformed drop among them.
#[test]
fn corrupted_req_is_dropped_counted_and_recovered_by_retransmission() {
    let mut dropped_seeds = 0;
    let mut malformed_seeds = 0;
    for seed in 0..256 {
        let (mut net, a, b) = pair(seed);
        net.corrupt_next(a, b);
        let ca = connect(&mut net, a, b);
        // Until A's attempt is over: established, or failed (a changed field B acted on).
        net.run_until(
            |n| {
                !matches!(
                    n.endpoint_ref(a).state(ca),
                    Some(State::ReqSent | State::MraReqRcvd)
                )
            },
            1_000,
        );
        let bst = net.endpoint_ref(b).stats().clone();
        if bst.dropped_total() == 0 {
            continue;
        }
        dropped_seeds += 1;
        if bst.dropped(DropReason::Malformed) == 1 {
            malformed_seeds += 1;
        }
        let ctx = format!("seed {seed}\n{}", net.dump_trace());
        assert_eq!(bst.dropped_total(), 1, "{ctx}");
        assert!(established(&net, a, ca), "{ctx}");
        let cb = only_conn(&net, b);
        assert!(net.run_until(|n| established(n, b, cb), 1_000), "{ctx}");
        // The REQ was sent twice (the corrupted copy and one retransmission), once accepted.
        assert_eq!(net.sent_count(a, AttrId::Req), 2, "{ctx}");
        assert_eq!(net.endpoint_ref(a).stats().retransmits, 1, "{ctx}");
        assert_eq!(net.endpoint_ref(b).stats().dropped_total(), 1, "{ctx}");
        assert_eq!(net.endpoint_ref(b).stats().established, 1, "{ctx}");
    }
    assert!(
        dropped_seeds > 0 && malformed_seeds > 0,
        "{dropped_seeds} {malformed_seeds}"
    );
}

/// One direction of a link lost whole ([`SimNet::set_link`]): A's REQ and its retransmissions
/// reach B, B's REPs never reach A. Both sides give up on their own retry budgets (B's REP
/// timer, A's REQ timer), neither established, and nothing B sends ever arrives at A.
#[test]
fn a_one_way_link_loss_ends_both_sides_unestablished() {
    let (mut net, a, b) = pair(5);
    net.set_link(
        b,
        a,
        ibcm::sim::Link {
            loss: 1.0,
            ..ibcm::sim::Link::default()
        },
    );
    let ca = connect(&mut net, a, b);
    assert!(net.run_until(|n| !n.endpoint_ref(b).conn_ids().is_empty(), 1_000));
    let cb = only_conn(&net, b);
    assert!(net.run_until(|n| n.endpoint_ref(a).state(ca).is_none(), 10_000));
    assert!(net.run_until(|n| n.endpoint_ref(b).state(cb).is_none(), 10_000));
    assert!(net.run_to_idle(10_000));
    // A sent its REQ 1 + RETRIES times and timed out; B answered with REPs A never saw and
    // timed out too.
    assert_eq!(net.sent_count(a, AttrId::Req), 1 + u64::from(RETRIES));
    assert!(net.sent_count(b, AttrId::Rep) > u64::from(RETRIES));
    let (sa, sb) = (
        net.endpoint_ref(a).stats().clone(),
        net.endpoint_ref(b).stats().clone(),
    );
    assert_eq!(sa.timeouts, 1, "{}", net.dump_trace());
    assert_eq!(sb.timeouts, 1, "{}", net.dump_trace());
    // The link from A to B lost nothing: B received every MAD A sent. Nothing came back.
    let a_sent = net.sent_count(a, AttrId::Req) + net.sent_count(a, AttrId::Rej);
    assert_eq!(sb.rx, a_sent, "{}", net.dump_trace());
    assert_eq!(sa.rx, 0);
    assert_eq!(sa.established + sb.established, 0);
}
