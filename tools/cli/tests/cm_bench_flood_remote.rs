//! `cm-bench flood --target` against a `cm-ping --listen --stateless` process on loopback, as
//! the conformance lab's hostile cells run it over rxe: the attacker's own figures and the
//! listener's report (`--peer-counts`, the JSON counters) together must show every legitimate
//! connection on both sides, no blind connection, no spoofed teardown, amplification ≤ 3 and
//! the hostile messages counted as drops by reason. Addresses of their own (127.0.8.x,
//! 127.0.9.x, UDP 4791): no clash with the other loopback tests.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::io::{BufRead, BufReader, Read};
use std::process::{Command, Stdio};

struct Kill(std::process::Child);

impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The numbers of the attacker's figures line, in order.
fn numbers(line: &str) -> Vec<f64> {
    line.split(|c: char| !(c.is_ascii_digit() || c == '.'))
        .filter_map(|t| t.parse().ok())
        .collect()
}

#[test]
fn remote_flood_against_a_stateless_cm_ping() {
    let hold = std::env::temp_dir().join(format!("cm-bench-hold-{}", std::process::id()));
    let _ = std::fs::remove_file(&hold);
    let mut l = Kill(
        Command::new(env!("CARGO_BIN_EXE_cm-ping"))
            .args(["--listen", "127.0.8.1", "--port", "7600", "--stateless"])
            .args(["--stateless-threshold", "16", "--peer-counts", "--quiet"])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut lout = BufReader::new(l.0.stdout.take().unwrap());
    let mut first = String::new();
    lout.read_line(&mut first).unwrap();
    assert!(first.starts_with("listening on"), "{first}");
    let mut a = Kill(
        Command::new(env!("CARGO_BIN_EXE_cm-bench"))
            .args(["flood", "--target", "127.0.8.1", "--rdma-port", "7600"])
            .args(["--client", "127.0.8.2", "--sources-from", "127.0.9.1"])
            .args(["--sources", "4", "--legit", "30", "--attacks", "3"])
            .args(["--rate", "5000", "--max-reqs", "50000", "--settle", "1"])
            .arg("--hold-until")
            .arg(&hold)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    // The figures come before the hold: then the listener is stopped with the connections up.
    let mut aout = BufReader::new(a.0.stdout.take().unwrap()).lines();
    let mut text = String::new();
    let figures = loop {
        let line = aout
            .next()
            .unwrap_or_else(|| panic!("attacker ended: {text}"))
            .unwrap();
        text.push_str(&line);
        text.push('\n');
        if line.starts_with("flood-remote: legit ") {
            break line;
        }
    };
    let pid = l.0.id().to_string();
    assert!(Command::new("kill")
        .args(["-INT", &pid])
        .status()
        .unwrap()
        .success());
    assert!(l.0.wait().unwrap().success());
    let mut ltext = String::new();
    lout.read_to_string(&mut ltext).unwrap();
    std::fs::write(&hold, b"").unwrap();
    for line in aout {
        text.push_str(&line.unwrap());
        text.push('\n');
    }
    assert!(a.0.wait().unwrap().success(), "{text}");
    let _ = std::fs::remove_file(&hold);

    // legit R (OK/N) …; p50 A p99 B; amplification X (OUT/IN bytes); blind-rtu sent S;
    // teardown T/U client side; held H legit + V victims; reqs C at R/s
    let n = numbers(&figures);
    let (ok, legit, amp, blind) = (n[1], n[2], n[7], n[10]);
    let (torn, spoofed, held, victims, reqs) = (n[11], n[12], n[13], n[14], n[15]);
    assert_eq!((ok, legit, held), (30.0, 30.0, 30.0), "{text}");
    assert!(amp <= 3.0, "amplification: {text}");
    assert_eq!(
        (blind, torn, spoofed, victims),
        (3.0, 0.0, 12.0, 3.0),
        "{text}"
    );
    assert!(reqs > 0.0, "{text}");
    assert!(
        text.contains("hold ended (the file appeared); 33 of 33 connections still established"),
        "{text}"
    );
    // The listener's side: all 30 legitimate connections and the 3 victims, nothing for a
    // spoofed source; the hostile messages counted by reason.
    assert!(
        ltext.contains("cm-ping: established now by peer: 127.0.8.2:4791=30 127.0.9.6:4791=3\n"),
        "{ltext}"
    );
    let j: serde_json::Value = serde_json::from_str(ltext.lines().last().unwrap()).unwrap();
    let d = &j["dropped"];
    let rtus = d["bad_cookie"].as_u64().unwrap() + d["unknown_comm_id"].as_u64().unwrap();
    assert!(rtus >= 3 * 32, "{ltext}");
    assert!(d["wrong_peer"].as_u64().unwrap() >= 12, "{ltext}");
    assert!(j["stateless_replies"].as_u64().unwrap() > 0, "{ltext}");
}
