//! `cm-bench flood` smoke run: a small REQ flood from spoofed loopback sources during
//! legitimate connects, then blind RTUs and spoofed teardowns. Asserts the protocol
//! properties, not the rate: every legitimate connect succeeds during the flood, the listener
//! sends the spoofed sources at most 3× what they sent, and no blind RTU or spoofed teardown
//! succeeds.

use std::process::Command;

/// The numbers of the last line:
/// `flood: success R (OK/N); amplification X; blind-rtu S/N; teardown S/N; reqs C at R/s`.
fn figures(line: &str) -> Vec<f64> {
    line.split(|c: char| !(c.is_ascii_digit() || c == '.'))
        .filter_map(|t| t.trim_end_matches('.').parse().ok())
        .collect()
}

#[test]
fn flood_smoke_keeps_the_protocol_properties() {
    let out = Command::new(env!("CARGO_BIN_EXE_cm-bench"))
        .args(["flood", "--legit", "20", "--attacks", "3", "--sources", "4"])
        .args(["--secs", "60", "--max-reqs", "100000", "--settle", "1"])
        .args(["--port", "4797"])
        .output()
        .expect("run cm-bench flood");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let last = text.lines().last().expect("output");
    assert!(last.starts_with("flood: success "), "{text}");
    let f = figures(last);
    // success, ok, n, amplification, blind ok, blind n, teardown ok, teardown n, reqs, rate
    assert_eq!(f.len(), 10, "{last}");
    assert_eq!((f[1], f[2]), (20.0, 20.0), "legitimate connects: {last}");
    assert!(f[3] <= 3.0, "amplification: {last}");
    assert_eq!((f[4], f[5]), (0.0, 3.0), "blind RTU: {last}");
    assert_eq!((f[6], f[7]), (0.0, 12.0), "spoofed teardown: {last}");
    assert!(f[8] > 0.0, "no flood: {last}");
}
