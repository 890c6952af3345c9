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
    // Give it time to bind.
    std::thread::sleep(Duration::from_millis(500));
    Kill(child)
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
