//! `cm-bench flood` smoke runs: a small REQ flood from spoofed loopback sources during
//! legitimate connects, then blind RTUs and spoofed teardowns, with the listener stateful and
//! with its stateless mode. Asserts the protocol properties, not the rate: the listener sends
//! the spoofed sources at most 3× what they sent, no blind RTU or spoofed teardown succeeds,
//! and, in the stateless mode, every legitimate connect succeeds on both sides during the
//! flood. (The stateful listener's legitimate entries are evicted by the flood's, oldest
//! first, when its application is slower than the flood: how many get through depends on the
//! machine, so that run only prints its figure.)
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::process::Command;

/// The fields of the last line, by name:
/// `flood: success R (OK/N); connect ms p50 A p99 B; amplification X; blind-rtu S/N;
/// teardown S/N; reqs C at R/s; mode M`.
struct Figures {
    ok: u64,
    n: u64,
    amplification: f64,
    blind: (u64, u64),
    teardown: (u64, u64),
    reqs: u64,
    mode: String,
}

fn ratio(s: &str) -> (u64, u64) {
    let (a, b) = s.split_once('/').expect("a/b");
    (a.parse().expect("a"), b.parse().expect("b"))
}

fn figures(line: &str) -> Figures {
    let parts: Vec<&str> = line.split("; ").collect();
    assert_eq!(parts.len(), 7, "{line}");
    let word = |i: usize, k: usize| -> &str {
        parts[i]
            .split_whitespace()
            .nth(k)
            .unwrap_or_else(|| panic!("{line}"))
    };
    let (ok, n) = ratio(word(0, 3).trim_matches(|c| c == '(' || c == ')'));
    Figures {
        ok,
        n,
        amplification: word(2, 1).parse().expect("amplification"),
        blind: ratio(word(3, 1)),
        teardown: ratio(word(4, 1)),
        reqs: word(5, 1).parse().expect("reqs"),
        mode: word(6, 1).to_string(),
    }
}

fn run(port: &str, extra: &[&str]) -> Figures {
    let out = Command::new(env!("CARGO_BIN_EXE_cm-bench"))
        .args(["flood", "--legit", "20", "--attacks", "3", "--sources", "4"])
        .args(["--secs", "60", "--max-reqs", "100000", "--settle", "1"])
        .args(["--port", port])
        .args(extra)
        .output()
        .expect("run cm-bench flood");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("{text}");
    let last = text.lines().last().expect("output");
    assert!(last.starts_with("flood: success "), "{text}");
    let f = figures(last);
    assert_eq!(f.n, 20, "legitimate connects: {text}");
    assert!(f.amplification <= 3.0, "amplification: {text}");
    assert_eq!(f.blind, (0, 3), "blind RTU: {text}");
    // Victims the listener could not establish in time are left out (and said so).
    assert_eq!(f.teardown.0, 0, "spoofed teardown: {text}");
    assert!(f.teardown.1 > 0, "no victim attacked: {text}");
    assert!(f.reqs > 0, "no flood: {text}");
    f
}

#[test]
fn flood_smoke_keeps_the_protocol_properties() {
    assert_eq!(run("4797", &[]).mode, "stateful");
}

#[test]
fn flood_smoke_stateless_keeps_the_protocol_properties() {
    // A low threshold, so that the small flood switches the listener to cookies.
    let f = run("4798", &["--stateless", "--stateless-threshold", "64"]);
    assert_eq!(f.mode, "stateless");
    assert_eq!(f.ok, 20, "legitimate connects on both sides");
}
