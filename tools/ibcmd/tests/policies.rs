//! Two `ibcmd` on loopback, an XRC listener client (`cm-ping --listen --xrc --policy P`) on
//! one, `cm-ping --connect --xrc --count 4 --stay` on the other; the listener (or its
//! daemon) dies in each policy's way, and the connecting side reports four peer teardowns
//! with the target-gone cause in words.
//!
//! Each test has loopback addresses of its own (UDP 4791 on 127.0.0.5x), so they run in
//! parallel with each other and with the fixed-port tests of other crates.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

mod common;

use common::{cm_ping_bin, daemon, scratch, Proc};

/// How the target side dies.
#[derive(Clone, Copy, Debug)]
enum End {
    /// SIGKILL of the listener client.
    KillListener,
    /// SIGINT of the listener client: it destroys its QPs as their owner, then exits.
    IntListener,
    /// SIGKILL of the listener client whose QPs survive by policy: its connections still end
    /// (their REPs named its SRQs), with a plain DREQ; then SIGTERM of its daemon.
    KillListenerQpsKept,
}

/// Runs the scenario; returns the connecting side's lines after its four connections.
fn scenario(tag: &str, a_ip: &str, b_ip: &str, policy: &str, end: End) -> Vec<String> {
    let dir = scratch(tag);
    let (mut da, sa) = daemon(&dir, "a", a_ip);
    let (_db, sb) = daemon(&dir, "b", b_ip);
    let (sa, sb) = (sa.to_str().unwrap(), sb.to_str().unwrap());
    let ping = cm_ping_bin();
    let mut listener = Proc::spawn(
        "listener",
        &ping,
        &[
            "--listen", a_ip, "--daemon", sa, "--xrc", "--policy", policy,
        ],
    );
    listener.wait_out(|l| l.starts_with("listening"), "'listening'");
    let mut conn = Proc::spawn(
        "connector",
        &ping,
        &[
            "--connect",
            a_ip,
            "--bind",
            b_ip,
            "--daemon",
            sb,
            "--xrc",
            "--count",
            "4",
            "--stay",
        ],
    );
    for i in 0..4 {
        conn.wait_out(
            |l| l.starts_with("established"),
            &format!("established #{i}"),
        );
        // The target's side of it: the RTU has reached daemon A.
        listener.wait_out(
            |l| l.starts_with("established"),
            &format!("target established #{i}"),
        );
    }
    match end {
        End::KillListener => listener.signal("KILL"),
        End::IntListener => {
            listener.signal("INT");
            let rest = listener.rest_of_out();
            assert!(
                rest.iter().any(|l| l == "destroyed 4 TGT QP(s)"),
                "{rest:?}"
            );
        }
        End::KillListenerQpsKept => {
            listener.signal("KILL");
            // Daemon A has ended the client's holdings per policy: every QP kept, every
            // connection on them sent a DREQ.
            let l = da.wait_err(
                |l| l.contains("client's XRC holdings ended per policy"),
                "'holdings ended'",
            );
            assert!(!l.contains("Released"), "{l}");
            assert!(l.contains("srq_dreqs=4"), "{l}");
            da.signal("TERM");
            assert!(da.wait().success());
            assert!(!std::path::Path::new(sa).exists(), "socket left behind");
        }
    }
    let rest = conn.rest_of_out();
    assert!(conn.wait().success(), "{rest:?}");
    rest
}

fn check(rest: &[String], cause: &str) {
    let teardowns = rest
        .iter()
        .filter(|l| l.contains("closed by peer after"))
        .filter(|l| match cause {
            // A DREQ without the target-gone block.
            "DREQ" => l.ends_with(": DREQ"),
            _ => l.contains(cause),
        })
        .count();
    assert_eq!(teardowns, 4, "want four '{cause}' teardowns: {rest:#?}");
    assert_eq!(
        rest.last().map(String::as_str),
        Some("cm-ping: 4 established, 0 rejected, 0 timed out, 0 disconnected, 4 closed by peer"),
        "{rest:#?}"
    );
}

#[test]
fn process_bound_dies_with_its_creator() {
    let rest = scenario(
        "process",
        "127.0.0.51",
        "127.0.0.52",
        "process",
        End::KillListener,
    );
    check(&rest, "target gone (creator exited)");
}

#[test]
fn domain_bound_dies_with_its_domain() {
    // The client's domain is closed when the client goes.
    let rest = scenario(
        "domain",
        "127.0.0.53",
        "127.0.0.54",
        "domain",
        End::KillListener,
    );
    check(&rest, "target gone (domain closed)");
}

#[test]
fn an_owner_destroys_its_qps_on_a_clean_exit() {
    let rest = scenario(
        "owner",
        "127.0.0.55",
        "127.0.0.56",
        "process",
        End::IntListener,
    );
    check(&rest, "target gone (owner destroyed it)");
}

#[test]
fn explicit_survives_its_creator_but_its_srqs_do_not() {
    // The QP is kept as an orphan; the connections whose REPs named the dead process's SRQs
    // are ended all the same, without a target-gone block (the QP is not gone).
    let rest = scenario(
        "explicit",
        "127.0.0.57",
        "127.0.0.58",
        "explicit",
        End::KillListenerQpsKept,
    );
    check(&rest, "DREQ");
}

#[test]
fn shared_survives_its_creator_but_its_srqs_do_not() {
    // Every connection holds a registration: the creator's death drops none of them, the QP
    // stays; its connections still end, their SRQs being gone.
    let rest = scenario(
        "shared",
        "127.0.0.59",
        "127.0.0.60",
        "shared",
        End::KillListenerQpsKept,
    );
    check(&rest, "DREQ");
}
