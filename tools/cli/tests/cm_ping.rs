//! cm-ping end to end: two OS processes over RoCEv2/UDP on loopback (127.0.0.1 and
//! 127.0.0.2, port 4791 each).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::process::{Command, Stdio};
use std::time::Duration;

/// The tests share 127.0.0.1:4791 and 127.0.0.2:4791: one at a time.
static PORTS: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn cm_ping() -> Command {
    Command::new(env!("CARGO_BIN_EXE_cm-ping"))
}

struct Kill(std::process::Child);

impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn listener(args: &[&str]) -> Kill {
    let child = cm_ping()
        .args(["--listen", "127.0.0.2", "--quiet"])
        .args(args)
        .stdout(Stdio::piped())
        .spawn()
        .expect("start cm-ping --listen");
    let l = Kill(child);
    wait_bound("127.0.0.2:4791");
    l
}

/// Waits until some process has bound the UDP address, read from /proc/net/udp (a passive
/// check: binding a probe socket ourselves could take the port from the listener), instead of
/// sleeping for a guessed start-up time. Gives up after 20 s.
fn wait_bound(addr: &str) {
    let a: std::net::SocketAddrV4 = addr.parse().unwrap();
    // /proc/net/udp prints the IPv4 address as the host-order u32 of its network bytes.
    let want = format!(
        "{:08X}:{:04X}",
        u32::from_ne_bytes(a.ip().octets()),
        a.port()
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while std::time::Instant::now() < deadline {
        let table = std::fs::read_to_string("/proc/net/udp").unwrap_or_default();
        if table
            .lines()
            .skip(1)
            .any(|l| l.split_whitespace().nth(1) == Some(want.as_str()))
        {
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("nothing bound {addr} ({want} in /proc/net/udp) within 20 s");
}

fn stop(mut l: Kill) -> String {
    // SIGINT makes the listener print its summary line.
    let pid = l.0.id().to_string();
    let _ = Command::new("kill").args(["-INT", &pid]).status();
    l.0.wait_with_output_ref()
}

trait WaitRef {
    fn wait_with_output_ref(&mut self) -> String;
}

impl WaitRef for std::process::Child {
    fn wait_with_output_ref(&mut self) -> String {
        use std::io::Read;
        let _ = self.wait();
        let mut s = String::new();
        if let Some(mut o) = self.stdout.take() {
            let _ = o.read_to_string(&mut s);
        }
        s
    }
}

/// The last line cm-ping prints, as numbers.
fn summary(out: &str) -> (u64, u64, u64, u64) {
    let line = out
        .lines()
        .rev()
        .find(|l| l.starts_with("cm-ping: "))
        .unwrap_or_else(|| panic!("no summary line in {out:?}"));
    let n: Vec<u64> = line
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|t| t.parse().ok())
        .collect();
    (n[0], n[1], n[2], n[3])
}

#[test]
fn two_processes_ten_thousand_connections() {
    let _ports = PORTS.lock().unwrap_or_else(|e| e.into_inner());
    let l = listener(&[]);
    let out = cm_ping()
        .args(["--connect", "127.0.0.2", "--bind", "127.0.0.1"])
        .args(["--count", "10000", "--parallel", "64", "--quiet"])
        .output()
        .expect("run cm-ping --connect");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(summary(&text), (10_000, 0, 0, 10_000));
    assert!(
        text.contains(", 10000 disconnected, 0 disconnect timed out\n"),
        "{text}"
    );
    let ltext = stop(l);
    assert_eq!(summary(&ltext), (10_000, 0, 0, 10_000), "listener: {ltext}");
    assert!(
        ltext.contains(", 0 disconnect timed out\n"),
        "listener: {ltext}"
    );
}

#[test]
fn reject_xrc_private_data_and_passive_disconnect() {
    let _ports = PORTS.lock().unwrap_or_else(|e| e.into_inner());
    let l = listener(&["--reject", "28", "--reject-data", "6e6f"]);
    let out = cm_ping()
        .args([
            "--connect",
            "127.0.0.2",
            "--bind",
            "127.0.0.1",
            "--count",
            "3",
        ])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert_eq!(summary(&text), (0, 3, 0, 0), "{text}");
    assert!(text.contains("consumer defined"), "{text}");
    stop(l);
    // XRC with private data, DREQ from the passive side.
    let l = listener(&[]);
    let out = cm_ping()
        .args([
            "--connect",
            "127.0.0.2",
            "--bind",
            "127.0.0.1",
            "--count",
            "5",
            "--parallel",
            "5",
        ])
        .args([
            "--xrc",
            "--private-data",
            "0102030405",
            "--disconnect-from",
            "passive",
        ])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert_eq!(summary(&text), (5, 0, 0, 5), "{text}");
    assert_eq!(summary(&stop(l)), (5, 0, 0, 5));
}

#[test]
fn nobody_listening_is_rej_8_or_timeout() {
    let _ports = PORTS.lock().unwrap_or_else(|e| e.into_inner());
    // Nothing bound on 127.0.0.3: the REQs are lost (UDP), so the attempt times out.
    let out = cm_ping()
        .args(["--connect", "127.0.0.3", "--bind", "127.0.0.1"])
        .args(["--timeout-exp", "8", "--retries", "2"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert_eq!(summary(&text), (0, 0, 1, 0), "{text}");
    assert!(!out.status.success());
}

/// Sends SIGINT to `child` (the listener prints its summary, then its counters).
fn sigint(child: &std::process::Child) {
    let pid = libc::pid_t::try_from(child.id()).unwrap();
    // SAFETY: kill(2) with a pid of our own child process and a valid signal number.
    let r = unsafe { libc::kill(pid, libc::SIGINT) };
    assert_eq!(r, 0, "kill -INT {pid}");
}

/// The listener's last line is one JSON object with its counters, every drop by reason (the
/// transport's too); a SIDR_REQ is answered (refused) without a log line.
#[test]
fn listener_prints_its_counters_as_json_on_sigint() {
    use ibcm::proto::{ConnectParams, EndpointConfig, PeerAddr, SidrReqParams};
    use ibcm::rt::{Cm, UdpTransport};
    use ibcm_mad::frame::RoceV2UdRepr;
    use ibcm_mad::{Guid, Psn, Qpn, ServiceId, SidrStatus};

    let _ports = PORTS.lock().unwrap_or_else(|e| e.into_inner());
    let child = cm_ping()
        .args(["--listen", "127.0.0.2", "--service-id", "0x77"])
        .env("CM_PING_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start cm-ping --listen");
    let mut l = Kill(child);
    wait_bound("127.0.0.2:4791");
    let to: std::net::SocketAddr = "127.0.0.2:4791".parse().unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let t = UdpTransport::bind("127.0.0.1".parse().unwrap())
            .await
            .unwrap();
        let cfg = EndpointConfig {
            local_ca_guid: Guid(0x1234),
            ..Default::default()
        };
        let (cm, _) = Cm::bind(t, cfg);
        for i in 0..3u32 {
            let p = ConnectParams::new(
                PeerAddr::Udp(to),
                ServiceId(0x77),
                Qpn::new(0x100 + i).unwrap(),
            );
            let c = cm.connect(p).await.unwrap();
            c.disconnect(&[]).await;
        }
        // 5 datagrams that are no RoCEv2 MAD, 2 with a wrong ICRC; the SIDR round trips after
        // them (one socket, read in order) prove the listener has counted them.
        let raw = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        for _ in 0..5 {
            raw.send_to(b"not a MAD", to).unwrap();
        }
        let src = raw.local_addr().unwrap();
        let mut repr = RoceV2UdRepr::gsi(src.ip(), to.ip(), 0, src.port(), Psn::default()).unwrap();
        repr.udp.dst_port = 4791;
        let mut out = [0u8; 512];
        let n = repr.emit_udp_payload(&[0u8; 256], &mut out).unwrap();
        out[n - 1] ^= 0xff;
        for _ in 0..2 {
            raw.send_to(&out[..n], to).unwrap();
        }
        for _ in 0..4 {
            // No retransmission, however loaded the machine: a late repeat could reach the
            // listener as it exits and be dropped unanswered (a WARN this test forbids).
            let p = SidrReqParams {
                timeout: std::time::Duration::from_secs(60),
                ..SidrReqParams::new(PeerAddr::Udp(to), ServiceId(0x77))
            };
            let a = cm.sidr(p).await.unwrap();
            assert_eq!(a.status, SidrStatus::Rejected);
        }
        cm.shutdown();
    });
    sigint(&l.0);
    let status = l.0.wait().unwrap();
    assert!(status.success(), "{status}");
    let text = l.0.wait_with_output_ref();
    let mut err = String::new();
    use std::io::Read;
    l.0.stderr.take().unwrap().read_to_string(&mut err).unwrap();
    let last = text.lines().last().unwrap_or_else(|| panic!("no output"));
    let j: serde_json::Value =
        serde_json::from_str(last).unwrap_or_else(|e| panic!("{e}: last line {last:?}"));
    assert_eq!(j["established"], 3, "{last}");
    assert_eq!(j["closed"], 3, "{last}");
    assert_eq!(j["rejected"], 0, "{last}");
    let dropped = j["dropped"].as_object().unwrap();
    assert_eq!(dropped["not_mad"], 5, "{last}");
    assert_eq!(dropped["bad_icrc"], 2, "{last}");
    for reason in ibcm::proto::DropReason::ALL {
        assert!(
            dropped.contains_key(reason.name()),
            "{reason:?} missing: {last}"
        );
    }
    // The summary line is still there, just before.
    assert_eq!(summary(&text), (3, 0, 0, 3), "{text}");
    // No warning for the SIDR_REQs (nor anything else).
    assert!(!err.contains("WARN"), "stderr: {err}");
}

/// Runs `cm-ping --connect 127.0.0.2:7174 --bind 127.0.0.1 ARGS`: (exit code, stdout).
fn connect(args: &[&str]) -> (Option<i32>, String) {
    let out = cm_ping()
        .args(["--connect", "127.0.0.2:7174", "--bind", "127.0.0.1"])
        .args(args)
        .output()
        .expect("run cm-ping --connect");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).to_string(),
    )
}

#[test]
fn sidr_reply_rejected_rep_and_delayed_rtu() {
    let _ports = PORTS.lock().unwrap_or_else(|e| e.into_inner());
    // rdma_cm's RDMA_PS_UDP on port 7174 is served too once --sidr-qpn is given.
    let l = listener(&["--port", "7174", "--sidr-qpn", "0x5a1d40"]);
    let (code, text) = connect(&["--sidr"]);
    assert_eq!(code, Some(0), "{text}");
    assert!(
        text.contains("sidr reply status=Success qpn=0x5a1d40 qkey=0x01234567"),
        "{text}"
    );
    // A consumer reject of the REP: the listener's accepted connection fails with reason 28.
    let (code, text) = connect(&["--reject-rep", "28", "--reject-data", "6e6f"]);
    assert_eq!(code, Some(2), "{text}");
    assert!(text.contains("rejected the REP"), "{text}");
    assert_eq!(summary(&text), (0, 1, 0, 0), "{text}");
    // The RTU held back (the application's QP work): established all the same.
    let (code, text) = connect(&["--rtu-delay", "200"]);
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("rtu in 200 ms"), "{text}");
    assert_eq!(summary(&text), (1, 0, 0, 1), "{text}");
    let ltext = stop(l);
    assert_eq!(summary(&ltext), (1, 1, 0, 1), "listener: {ltext}");
}

#[test]
fn same_qpn_is_a_stale_connection_for_the_peer() {
    let _ports = PORTS.lock().unwrap_or_else(|e| e.into_inner());
    let l = listener(&["--port", "7174"]);
    // Test only: connection 1 announces connection 0's QPN while 0 is held. The listener finds
    // it stale: REJ 10 to connection 1 and a DREQ to connection 0.
    let (code, text) = connect(&["--same-qpn", "--count", "2", "--hold"]);
    assert_eq!(code, Some(2), "{text}");
    assert!(text.contains("connection 1: stale connection"), "{text}");
    assert!(text.contains("(disconnected (by the peer))"), "{text}");
    assert_eq!(summary(&text), (1, 1, 0, 1), "{text}");
    let ltext = stop(l);
    assert!(ltext.contains("\"stale\":1"), "listener: {ltext}");
}

/// The QPNs the REPs named (`remote_qpn=0x…` of the connector's `established` lines).
fn rep_qpns(text: &str) -> Vec<u32> {
    text.lines()
        .filter(|l| l.starts_with("established "))
        .filter_map(|l| {
            l.split_whitespace()
                .find_map(|w| w.strip_prefix("remote_qpn="))
        })
        .map(|q| u32::from_str_radix(q.trim_start_matches("0x"), 16).unwrap())
        .collect()
}

/// `--stateless`: with `--stateless-always` every REQ is answered from the template (the REP's
/// QPN from `--stateless-qpns`, its private data `--accept-data`), the connections reach the
/// listener once established and are counted per peer; without pressure the same listener
/// answers with state, its QPNs outside the range; combinations it cannot honour are refused.
#[test]
fn stateless_listener_answers_from_its_template() {
    use std::io::{BufRead, BufReader};
    let _ports = PORTS.lock().unwrap_or_else(|e| e.into_inner());
    // Not --quiet: its event lines tell when it has the connections.
    let mut l = Kill(
        cm_ping()
            .args(["--listen", "127.0.0.2", "--stateless", "--stateless-always"])
            .args([
                "--stateless-qpns",
                "0x100000:0x100000",
                "--accept-data",
                "6f6b",
            ])
            .arg("--peer-counts")
            .stdout(Stdio::piped())
            .spawn()
            .expect("start cm-ping --listen"),
    );
    wait_bound("127.0.0.2:4791");
    // Four connections held open (--stay) while the listener reports its peers.
    let mut c = Kill(
        cm_ping()
            .args(["--connect", "127.0.0.2", "--bind", "127.0.0.1", "--stay"])
            .args(["--count", "4", "--parallel", "4"])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut lines = BufReader::new(c.0.stdout.take().unwrap()).lines();
    let mut seen = String::new();
    while rep_qpns(&seen).len() < 4 {
        let line = lines
            .next()
            .unwrap_or_else(|| panic!("connector ended: {seen}"))
            .unwrap();
        // Four connections or a failure, never a wait for lines that cannot come.
        assert!(
            !line.contains("stale") && !line.contains("rejected") && !line.contains("closed"),
            "{seen}{line}"
        );
        seen.push_str(&line);
        seen.push('\n');
    }
    for q in rep_qpns(&seen) {
        assert!(
            (0x10_0000..0x20_0000).contains(&q),
            "{q:#x} outside the range: {seen}"
        );
    }
    assert_eq!(seen.matches(" pd=6f6b").count(), 4, "{seen}");
    // The listener has them once its lines say so (the connector's side comes first).
    let mut llines = BufReader::new(l.0.stdout.take().unwrap()).lines();
    let mut ltext = String::new();
    while ltext.matches("established conn=").count() < 4 {
        let line = llines
            .next()
            .unwrap_or_else(|| panic!("listener ended: {ltext}"))
            .unwrap();
        ltext.push_str(&line);
        ltext.push('\n');
    }
    assert_eq!(
        ltext.matches(" stateless from 127.0.0.1:4791 ").count(),
        4,
        "{ltext}"
    );
    stop(l);
    for line in llines {
        ltext.push_str(&line.unwrap());
        ltext.push('\n');
    }
    assert!(
        ltext.contains("cm-ping: established now by peer: 127.0.0.1:4791=4\n"),
        "{ltext}"
    );
    assert_eq!(summary(&ltext).0, 4, "{ltext}");
    let j: serde_json::Value = serde_json::from_str(ltext.lines().last().unwrap()).unwrap();
    assert_eq!(j["stateless_established"], 4, "{ltext}");
    assert!(j["stateless_replies"].as_u64().unwrap() >= 4, "{ltext}");
    drop(c);

    // No pressure: the stateful path, QPNs outside the (default) stateless range.
    let l = listener(&["--stateless", "--peer-counts"]);
    let (code, text) = {
        let out = cm_ping()
            .args(["--connect", "127.0.0.2", "--bind", "127.0.0.1"])
            .args(["--count", "20", "--parallel", "4"])
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).to_string(),
        )
    };
    assert_eq!(code, Some(0), "{text}");
    let qpns = rep_qpns(&text);
    assert_eq!(qpns.len(), 20, "{text}");
    // Outside the default range 0x800000 .. 0xffff00.
    assert!(
        qpns.iter().all(|&q| !(0x80_0000..0xff_ff00).contains(&q)),
        "{text}"
    );
    let ltext = stop(l);
    assert!(ltext.contains("established now by peer: none\n"), "{ltext}");
    let j: serde_json::Value = serde_json::from_str(ltext.lines().last().unwrap()).unwrap();
    assert_eq!(
        (j["established"].as_u64(), j["stateless_replies"].as_u64()),
        (Some(20), Some(0)),
        "{ltext}"
    );

    // Refused: the device would choose the QPNs (--verbs), or the application must see the REQ.
    for extra in [
        &["--verbs", "rxe0"][..],
        &["--reject", "28"],
        &["--accept-delay", "10"],
    ] {
        let out = cm_ping()
            .args(["--listen", "127.0.0.2", "--stateless"])
            .args(extra)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{extra:?}: {err}");
        assert!(err.contains("--stateless"), "{extra:?}: {err}");
    }
}
