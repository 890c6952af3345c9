//! The `sim` backend's XRC data path from the wire (issue 26 §2): an XRC SEND Only on UDP
//! 4791 reaches the model's TGT QP and lands in a client's own SRQ only when the QP is
//! ready, the PSN the next one it expects, the SRQ of the QP's domain and not full; every
//! other packet is counted by reason (`data-counters`) and lands nowhere. A client's SRQs
//! are its own and go with it. Address 127.0.31.1 (the sender: 127.0.31.2).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

mod common;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Instant;

use ibcm::rt::node::{attach, Node};
use ibcm::rt::UdpTransport;
use ibcm_mad::frame::{Opcode, RoceV2XrcSendRepr};
use ibcm_mad::xrc::SrqNum;
use ibcm_mad::{Psn, Qpn};
use serde_json::{json, Value};

use common::{daemon, scratch, DEADLINE};

/// The result of a keeper request that must succeed.
async fn ok(node: &Node, req: Value) -> Value {
    let r = node.keeper(req.clone()).await.unwrap();
    assert_eq!(r["ok"], true, "{req} -> {r}");
    r["result"].clone()
}

/// The error kind of a keeper request that must fail.
async fn refused(node: &Node, req: Value) -> String {
    let r = node.keeper(req.clone()).await.unwrap();
    assert_eq!(r["ok"], false, "{req} -> {r}");
    r["error"]["kind"].as_str().unwrap().to_owned()
}

/// One XRC SEND Only (or, with `opcode`, another opcode with the same headers) from `from`.
async fn send(
    from: &UdpTransport,
    opcode: Option<Opcode>,
    qpn: u32,
    psn: u32,
    srqn: u32,
    payload: &[u8],
) {
    let to: SocketAddr = "127.0.31.1:4791".parse().unwrap();
    let src = from.socket_addr();
    let mut r = RoceV2XrcSendRepr::send_only(
        src.ip(),
        to.ip(),
        src.port(),
        Qpn::masked(qpn),
        Psn::masked(psn),
        SrqNum::masked(srqn),
    )
    .unwrap();
    if let Some(op) = opcode {
        r.bth.opcode = op;
    }
    let mut buf = vec![0u8; r.udp_payload_len(payload.len())];
    let n = r.emit_udp_payload(payload, &mut buf).unwrap();
    from.send_datagram(to, &buf[..n]).await.unwrap();
}

/// The data path's counters once they add up to `total` (each packet counted once).
async fn counters(node: &Node, total: u64) -> BTreeMap<String, u64> {
    let start = Instant::now();
    loop {
        let c: BTreeMap<String, u64> =
            serde_json::from_value(ok(node, json!({ "op": "data-counters" })).await).unwrap();
        if c.values().sum::<u64>() >= total {
            assert_eq!(c.values().sum::<u64>(), total, "{c:?}");
            return c;
        }
        assert!(start.elapsed() < DEADLINE, "only {c:?} of {total} packets");
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
}

async fn recv(node: &Node, srqn: u32) -> Option<String> {
    let r = ok(node, json!({ "op": "srq-recv", "srqn": srqn })).await;
    let b: Option<Vec<u8>> = serde_json::from_value(r["data"].clone()).unwrap();
    b.map(|b| String::from_utf8(b).unwrap())
}

#[tokio::test]
async fn xrc_sends_from_the_wire_land_in_a_clients_own_srq_or_are_counted() {
    let dir = scratch("data-path");
    let (_d, sock) = daemon(&dir, "d", "127.0.31.1");
    let a = attach(&sock).await.unwrap();
    let node = &a.node;
    let file = dir.join("job.xrcd");
    let other = dir.join("other.xrcd");
    ok(
        node,
        json!({ "op": "open-domain", "domain": "job", "path": file.to_str().unwrap() }),
    )
    .await;
    ok(
        node,
        json!({ "op": "open-domain", "domain": "other", "path": other.to_str().unwrap() }),
    )
    .await;
    ok(node, json!({ "op": "open-domain", "domain": "private" })).await;
    let qpn = ok(
        node,
        json!({ "op": "create", "domain": "job", "policy": "explicit" }),
    )
    .await["qpn"]
        .as_u64()
        .unwrap() as u32;
    // The TGT QP as a CM brings it up: INIT, then RTR expecting PSN 100.
    ok(
        node,
        json!({ "op": "modify", "qpn": qpn, "attr": {
        "state": "init", "pkey_index": 0, "port": 1, "access_flags": 7 } }),
    )
    .await;
    // Not ready yet (INIT): a SEND is dropped.
    let srqn = ok(
        node,
        json!({ "op": "srq-create", "domain": "job", "max_wr": 3 }),
    )
    .await["srqn"]
        .as_u64()
        .unwrap() as u32;
    let srqn_other = ok(node, json!({ "op": "srq-create", "domain": "other" })).await["srqn"]
        .as_u64()
        .unwrap() as u32;
    assert_eq!(
        refused(node, json!({ "op": "srq-create", "domain": "private" })).await,
        "bad-request",
        "a private domain has no file another process could open"
    );
    assert_eq!(
        refused(node, json!({ "op": "srq-create", "domain": "nope" })).await,
        "unknown-domain"
    );
    let tx = UdpTransport::bind_port("127.0.31.2:0".parse().unwrap())
        .await
        .unwrap();
    send(&tx, None, qpn, 100, srqn, b"too early").await;
    counters(node, 1).await;
    ok(
        node,
        json!({ "op": "modify", "qpn": qpn, "attr": {
        "state": "rtr", "path_mtu": 3, "dest_qpn": 0x99, "rq_psn": 100,
        "max_dest_rd_atomic": 1, "min_rnr_timer": 12, "av": { "port": 1 } } }),
    )
    .await;

    send(&tx, None, qpn, 100, srqn, b"first").await; // received
    send(&tx, None, qpn, 100, srqn, b"again").await; // a duplicate PSN
    send(&tx, None, qpn, 101, srqn_other, b"x").await; // another domain's SRQ
    send(&tx, None, qpn + 1000, 101, srqn, b"x").await; // no such QP
    send(&tx, None, qpn, 101, 0xff_fff0, b"x").await; // no such SRQ
    send(&tx, Some(Opcode(0x04)), qpn, 101, srqn, b"x").await; // an RC SEND
    send(&tx, None, qpn, 101, srqn, b"second").await; // received
    send(&tx, None, qpn, 102, srqn, b"third").await; // received: the SRQ (3 receives) is full
    send(&tx, None, qpn, 103, srqn, b"fourth").await; // RNR
    send(&tx, None, qpn, 103, srqn, &[0u8; 1025]).await; // longer than a SEND carries
    let c = counters(node, 11).await;
    let want: BTreeMap<String, u64> = [
        ("qp_not_ready", 1),
        ("received", 3),
        ("psn_out_of_sequence", 1),
        ("srq_of_another_domain", 1),
        ("unknown_qp", 1),
        ("unknown_srq", 1),
        ("unsupported_opcode", 1),
        ("receiver_not_ready", 1),
        ("too_long", 1),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    assert_eq!(c, want);
    assert_eq!(recv(node, srqn).await.as_deref(), Some("first"));
    assert_eq!(recv(node, srqn).await.as_deref(), Some("second"));
    assert_eq!(recv(node, srqn).await.as_deref(), Some("third"));
    assert_eq!(recv(node, srqn).await, None);
    assert_eq!(recv(node, srqn_other).await, None);

    // Another client can neither take from nor destroy this client's SRQs.
    let b = attach(&sock).await.unwrap();
    for op in ["srq-recv", "srq-destroy"] {
        assert_eq!(
            refused(&b.node, json!({ "op": op, "srqn": srqn })).await,
            "unknown-srq"
        );
    }
    // The client goes: its SRQs go with it (its explicit QP stays, an orphan), and a SEND
    // to one finds none.
    a.cm.shutdown();
    drop(a);
    let start = Instant::now();
    loop {
        let c: BTreeMap<String, u64> =
            serde_json::from_value(ok(&b.node, json!({ "op": "data-counters" })).await).unwrap();
        if c.get("unknown_srq") == Some(&2) {
            break;
        }
        // while the session is still ending a SEND is received: the next PSN follows
        let psn = 103 + u32::try_from(c["received"] - 3).unwrap();
        send(&tx, None, qpn, psn, srqn, b"after").await;
        assert!(start.elapsed() < DEADLINE, "{c:?}");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}
