//! `cm-trace -i IFACE` (feature `live`): a live capture on the loopback interface of a
//! network namespace made for the test, with RoCEv2 CM datagrams (the UDP payloads of a real
//! capture's REQ, REP and RTU) sent to UDP port 4791 and one datagram to another port that the
//! BPF filter must keep out. Needs root (network namespaces, capturing), `ip` and `python3`
//! (the sender inside the namespace); skipped, loudly, without them.
// Without the feature only the last test is built; the helpers above it are unused then.
#![cfg_attr(not(feature = "live"), allow(dead_code))]
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

#[cfg(feature = "live")]
use std::io::{BufRead, BufReader};
#[cfg(feature = "live")]
use std::path::Path;
use std::process::{Command, Stdio};

mod common;
use common::BIN;

fn skip(why: &str) {
    assert!(
        std::env::var_os("IBCM_REQUIRE_LIVE").is_none(),
        "IBCM_REQUIRE_LIVE is set but {why}"
    );
    let _ = std::io::Write::write_fmt(
        &mut std::io::stderr(),
        format_args!("\n!!! SKIPPED cm-trace live capture test: {why} !!!\n"),
    );
}

/// A network namespace, deleted on drop.
struct Netns(String);

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

fn run_ok(args: &[&str]) -> bool {
    Command::new(args[0])
        .args(&args[1..])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

const SENDER: &str = r#"
import socket, struct, sys
d = open(sys.argv[1], 'rb').read()
off, frames = 24, []
while off < len(d):
    _, _, cap, _ = struct.unpack('<IIII', d[off:off + 16])
    frames.append(d[off + 16:off + 16 + cap])
    off += 16 + cap
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.sendto(b'not RoCE', ('127.0.0.1', 4792))
# Frames 5, 6, 7: REQ, REP, RTU; the UDP payload starts after Ethernet (14), IPv4 (20), UDP (8).
for f in frames[4:7]:
    s.sendto(f[42:], ('127.0.0.1', 4791))
"#;

/// `cm-trace -i lo --stats --refresh SECS` in a namespace of its own, its standard error read
/// line by line, killed by a watchdog after two minutes (a hang ends the output and fails the
/// test instead of blocking it).
#[cfg(feature = "live")]
struct LiveStats {
    ns: Netns,
    child: std::process::Child,
    err: BufReader<std::process::ChildStderr>,
    watchdog: common::Watchdog,
}

#[cfg(feature = "live")]
impl LiveStats {
    /// Starts it, or says why not (skipped, loudly) and returns `None`.
    fn start(tag: &str, refresh: &str) -> Option<Self> {
        if !run_ok(&["ip", "-V"]) || !run_ok(&["python3", "-c", "pass"]) {
            skip("`ip` (iproute2) or `python3` not found");
            return None;
        }
        let name = format!("cmtrace-{tag}-{}", std::process::id());
        if !run_ok(&["ip", "netns", "add", &name]) {
            skip("cannot create a network namespace (not root?)");
            return None;
        }
        let ns = Netns(name);
        assert!(run_ok(&["ip", "-n", &ns.0, "link", "set", "lo", "up"]));
        // `ip netns exec` execs cm-trace: the child's PID is cm-trace's.
        let mut child = Command::new("ip")
            .args(["netns", "exec", &ns.0, BIN, "-i", "lo", "--stats"])
            .args(["--refresh", refresh])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let watchdog = common::Watchdog::new(&child);
        let err = BufReader::new(child.stderr.take().unwrap());
        Some(Self {
            ns,
            child,
            err,
            watchdog,
        })
    }

    /// Standard error up to and including the first line that contains `want`.
    fn read_until(&mut self, want: &str) -> String {
        common::read_until(&mut self.err, |l| l.contains(want)).concat()
    }

    /// Sends the REQ, REP and RTU of a real capture (and one datagram the filter keeps out).
    fn send_packets(&self) {
        let capture = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../fixtures/captures/real/rocev2_mlx_nvme-discover.pcap");
        let sent = Command::new("ip")
            .args(["netns", "exec", &self.ns.0, "python3", "-c", SENDER])
            .arg(&capture)
            .status()
            .unwrap();
        assert!(sent.success());
    }

    /// Ctrl-C (SIGINT): the exit status, standard output and the rest of standard error.
    fn interrupt(mut self) -> (std::process::ExitStatus, String, String) {
        let r = common::interrupt(&mut self.child, &mut self.err);
        drop(self.watchdog);
        r
    }
}

/// `-i lo --stats --refresh 0` without `--count`: the statistics so far on standard error as
/// the packets arrive, then Ctrl-C (SIGINT) ends the capture with the final report on
/// standard output and exit status 0.
#[cfg(feature = "live")]
#[test]
fn live_stats_refresh_then_sigint() {
    let Some(mut live) = LiveStats::start("sig", "0") else {
        return;
    };
    assert_eq!(
        live.read_until("\n"),
        "cm-trace: capturing on lo (RoCEv2 UDP 4791 and RoCEv1)\n"
    );
    live.send_packets();
    // The refresh after the third packet shows the three messages.
    let seen = live.read_until("CM messages: REQ 1 REP 1 RTU 1");
    assert!(seen.contains("cm-trace: lo: statistics so far"), "{seen}");
    let (status, out, rest) = live.interrupt();
    assert!(status.success(), "{status:?} {rest}");
    assert!(out.contains("3 frames: 3 CM MADs"), "{out}");
    assert!(out.contains("  established             1"), "{out}");
    assert!(rest.contains("cm-trace: lo: interrupted"), "{rest}");
}

/// `-i lo --stats --refresh 0.2` with no packet arriving: the statistics so far come on the
/// timer all the same (twice, with 0 frames: no packet was sent yet); then the three packets
/// are sent and a refresh shows them; Ctrl-C ends the capture.
#[cfg(feature = "live")]
#[test]
fn live_stats_refresh_on_a_timer_without_packets() {
    let Some(mut live) = LiveStats::start("timer", "0.2") else {
        return;
    };
    live.read_until("cm-trace: capturing on lo");
    live.read_until("cm-trace: lo: statistics so far (0 frames");
    live.read_until("cm-trace: lo: statistics so far (0 frames");
    live.send_packets();
    live.read_until("cm-trace: lo: statistics so far (3 frames");
    let (status, out, _) = live.interrupt();
    assert!(status.success(), "{status:?}");
    assert!(out.contains("3 frames: 3 CM MADs"), "{out}");
}

#[cfg(feature = "live")]
#[test]
fn live_capture_on_loopback_in_a_netns() {
    if !run_ok(&["ip", "-V"]) {
        return skip("`ip` (iproute2) not found");
    }
    if !run_ok(&["python3", "-c", "pass"]) {
        return skip("`python3` not found (the datagram sender)");
    }
    let name = format!("cmtrace-live-{}", std::process::id());
    if !run_ok(&["ip", "netns", "add", &name]) {
        return skip("cannot create a network namespace (not root?)");
    }
    let ns = Netns(name);
    assert!(run_ok(&["ip", "-n", &ns.0, "link", "set", "lo", "up"]));
    let mut child = Command::new("ip")
        .args([
            "netns", "exec", &ns.0, BIN, "-i", "lo", "--count", "3", "--json",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // A guard against a hang (a lost datagram would leave cm-trace waiting for its third
    // packet): the capture is ended after two minutes, and the test then fails on its output.
    let watchdog = common::Watchdog::new(&child);
    let mut err = BufReader::new(child.stderr.take().unwrap());
    // Wait until the capture is open (cm-trace says so on standard error), then send.
    let mut line = String::new();
    err.read_line(&mut line).unwrap();
    assert_eq!(
        line,
        "cm-trace: capturing on lo (RoCEv2 UDP 4791 and RoCEv1)\n"
    );
    let capture = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures/captures/real/rocev2_mlx_nvme-discover.pcap");
    let sent = Command::new("ip")
        .args(["netns", "exec", &ns.0, "python3", "-c", SENDER])
        .arg(&capture)
        .status()
        .unwrap();
    assert!(sent.success());
    // Three packets pass the filter: cm-trace stops by itself (--count 3).
    let (status, out, rest) = common::finish(&mut child, &mut err);
    drop(watchdog);
    assert!(status.success(), "{rest}");
    let v: Vec<serde_json::Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let msgs: Vec<&str> = v.iter().map(|v| v["msg"].as_str().unwrap()).collect();
    assert_eq!(msgs, ["REQ", "REP", "RTU"], "{out}");
    assert!(
        v.iter().all(|v| v["conn"] == 1 && v["src"] == "127.0.0.1"),
        "{out}"
    );
    assert_eq!(v[0]["service_id"], "0x0000000001061144");
    assert_eq!(v[0]["upper"]["hrqsize"], 32);
    // The datagram to port 4792 never reached cm-trace: 3 frames, all CM.
    assert!(
        rest.contains("lo: 3 frames: 3 CM, 0 non-CM, 0 malformed"),
        "{rest}"
    );
    assert!(rest.contains("1 attempted, 1 established"), "{rest}");
}

#[cfg(feature = "live")]
#[test]
fn missing_interface_is_reported() {
    let o = Command::new(BIN)
        .args(["-i", "no-such-iface0", "--count", "1"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(e.starts_with("cm-trace: no-such-iface0: "), "{e}");
}

#[cfg(not(feature = "live"))]
#[test]
fn without_the_feature_live_capture_says_how_to_get_it() {
    let o = Command::new(BIN).args(["-i", "lo"]).output().unwrap();
    assert_eq!(o.status.code(), Some(1));
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(
        e.contains("live capture is not built in: build cm-trace with `--features live`"),
        "{e}"
    );
}
