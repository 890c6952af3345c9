//! `xrcd-keeper` end to end: the real binary, real Unix sockets, real SIGKILLs.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use ibcm_xrc::keeper::client::{ClientError, KeeperClient};
use ibcm_xrc::keeper::proto::{ModifyAttr, Request};

const BIN: &str = env!("CARGO_BIN_EXE_xrcd-keeper");
const WAIT: Duration = Duration::from_secs(15);

fn socket_path(tag: &str) -> PathBuf {
    static N: AtomicU32 = AtomicU32::new(0);
    let n = N.fetch_add(1, Ordering::SeqCst);
    std::env::temp_dir().join(format!(
        "xrcd-keeper-test-{}-{tag}-{n}.sock",
        std::process::id()
    ))
}

/// A child process killed (SIGKILL) and reaped on drop.
struct Proc {
    child: Child,
}

impl Proc {
    fn kill(&mut self) {
        let _ = self.child.kill(); // SIGKILL on Unix
        let _ = self.child.wait();
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

struct Keeper {
    proc: Proc,
    socket: PathBuf,
    epoch: String,
}

impl Drop for Keeper {
    fn drop(&mut self) {
        self.proc.kill();
        let _ = std::fs::remove_file(&self.socket);
    }
}

fn start_keeper(socket: &Path) -> Keeper {
    let mut child = Command::new(BIN)
        .args(["serve", "--socket"])
        .arg(socket)
        .args(["--backend", "sim", "--quarantine-ms", "200"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert!(line.starts_with("ready "), "keeper said {line:?}");
    let epoch = line
        .split_whitespace()
        .find_map(|w| w.strip_prefix("epoch="))
        .unwrap()
        .to_owned();
    Keeper {
        proc: Proc { child },
        socket: socket.to_owned(),
        epoch,
    }
}

struct Holder {
    proc: Proc,
    qpn: Option<String>,
}

fn spawn_hold(socket: &Path, domain: &str) -> (Proc, ChildStdout) {
    let mut child = Command::new(BIN)
        .args(["hold", "--socket"])
        .arg(socket)
        .args(["--domain", domain, "--shared-qp"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let out = child.stdout.take().unwrap();
    (Proc { child }, out)
}

/// A `hold` that has printed its QPN.
fn hold(socket: &Path, domain: &str) -> Holder {
    let (proc, out) = spawn_hold(socket, domain);
    let mut line = String::new();
    BufReader::new(out).read_line(&mut line).unwrap();
    let qpn = line.trim().to_owned();
    assert!(qpn.starts_with("0x"), "hold printed {line:?}");
    Holder {
        proc,
        qpn: Some(qpn),
    }
}

fn run(args: &[&str], socket: &Path) -> (bool, String, String) {
    let out = Command::new(BIN)
        .args(args)
        .arg("--socket")
        .arg(socket)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn status(socket: &Path) -> String {
    let (ok, out, err) = run(&["status"], socket);
    assert!(ok, "status failed: {err}");
    out
}

/// The `holders=` PIDs of the status line of `qpn` (empty if the QP is not listed or gone).
fn holders(status: &str, qpn: &str) -> BTreeSet<u32> {
    status
        .lines()
        .filter(|l| l.starts_with(&format!("qp {qpn} ")) && l.contains(" life=live "))
        .flat_map(|l| l.split_whitespace())
        .filter_map(|w| w.strip_prefix("holders="))
        .flat_map(|h| h.split(','))
        .filter_map(|p| p.split('x').next().and_then(|p| p.parse().ok()))
        .collect()
}

fn wait_for(socket: &Path, what: &str, mut pred: impl FnMut(&str) -> bool) -> String {
    let t0 = Instant::now();
    loop {
        let s = status(socket);
        if pred(&s) {
            return s;
        }
        assert!(
            t0.elapsed() < WAIT,
            "timed out waiting for {what}; last status:\n{s}"
        );
        thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn sigkilled_holders_release_exactly_their_reference() {
    let sock = socket_path("release");
    let keeper = start_keeper(&sock);
    let mut hs: Vec<Holder> = (0..3).map(|_| hold(&sock, "job")).collect();
    let qpn = hs[0].qpn.clone().unwrap();
    assert!(
        hs.iter().all(|h| h.qpn.as_deref() == Some(&qpn)),
        "one shared QP"
    );
    let pids: BTreeSet<u32> = hs.iter().map(|h| h.proc.pid()).collect();
    let s = wait_for(&sock, "3 holders", |s| holders(s, &qpn) == pids);
    assert!(s.contains("policy=shared"), "{s}");

    let victim = hs.remove(1);
    let vpid = victim.proc.pid();
    drop(victim); // SIGKILL
    let left: BTreeSet<u32> = pids.iter().copied().filter(|p| *p != vpid).collect();
    wait_for(&sock, "the victim's reference gone", |s| {
        holders(s, &qpn) == left
    });

    hs.remove(0);
    wait_for(&sock, "one holder", |s| holders(s, &qpn).len() == 1);
    // The last holder dies: the QP goes (quarantined, then forgotten).
    hs.clear();
    wait_for(&sock, "the QP gone", |s| {
        s.contains(&format!(
            "qp {qpn} domain=job policy=shared life=gone:creator-exited"
        )) || s.contains(&format!(
            "qp {qpn} domain=job policy=shared life=gone:last-registration-dropped"
        ))
    });
    wait_for(&sock, "the QPN forgotten after the quarantine", |s| {
        !s.contains(&format!("qp {qpn} "))
    });
    drop(keeper);
}

#[test]
fn holders_killed_mid_operation_leave_consistent_counts() {
    let sock = socket_path("midop");
    let _keeper = start_keeper(&sock);
    // An anchor keeps the QP alive while the others come and go.
    let anchor = hold(&sock, "job");
    let qpn = anchor.qpn.clone().unwrap();
    let mut survivors = vec![anchor];
    for i in 0..10u64 {
        let (mut p, out) = spawn_hold(&sock, "job");
        if i % 3 == 0 {
            // Keep this one: wait until it holds.
            let mut line = String::new();
            BufReader::new(out).read_line(&mut line).unwrap();
            assert_eq!(line.trim(), qpn);
            survivors.push(Holder {
                proc: p,
                qpn: Some(qpn.clone()),
            });
        } else {
            // SIGKILL at some point during connect / hello / open / register.
            thread::sleep(Duration::from_millis(i * 3));
            p.kill();
            drop(out);
        }
    }
    let live: BTreeSet<u32> = survivors.iter().map(|h| h.proc.pid()).collect();
    let s = wait_for(&sock, "exactly the survivors", |s| holders(s, &qpn) == live);
    assert_eq!(
        s.lines()
            .filter(|l| l.starts_with("session ") && l.ends_with("name=hold"))
            .count(),
        survivors.len(),
        "{s}"
    );
}

#[test]
fn ofed_style_operations_by_number_from_another_process() {
    let sock = socket_path("ofed");
    let _keeper = start_keeper(&sock);
    let h = hold(&sock, "job");
    let qpn = u32::from_str_radix(h.qpn.as_deref().unwrap().trim_start_matches("0x"), 16).unwrap();
    // This test process is "another process": register, modify and query by number.
    let mut c = KeeperClient::connect(&sock, "test").unwrap();
    c.call(Request::Register { qpn }).unwrap();
    let m = c
        .call(Request::Modify {
            qpn,
            attr: ModifyAttr {
                state: Some("INIT".into()),
                pkey_index: Some(0),
                port: Some(1),
                access_flags: Some(0),
                ..ModifyAttr::default()
            },
        })
        .unwrap();
    assert_eq!(m["state"], "INIT");
    let q = c.call(Request::Query { qpn }).unwrap();
    assert_eq!(q["state"], "INIT");
    assert_eq!(q["holders"].as_array().unwrap().len(), 2);
    // A wrong transition is refused with a typed error.
    let e = c
        .call(Request::Modify {
            qpn,
            attr: ModifyAttr {
                state: Some("RTS".into()),
                ..ModifyAttr::default()
            },
        })
        .unwrap_err();
    assert!(
        matches!(e, ClientError::Keeper { ref kind, .. } if kind == "bad-modify"),
        "{e}"
    );
    // Unregister ours; the holder's registration keeps the QP.
    c.call(Request::Unregister { qpn }).unwrap();
    assert_eq!(c.call(Request::Query { qpn }).unwrap()["life"], "live");
    drop(h);
    // The holder died: the QP is gone, and registering again fails like OFED's reg on a dead QPN.
    let t0 = Instant::now();
    loop {
        match c.call(Request::Register { qpn }) {
            Err(ClientError::Keeper { kind, .. }) if kind == "gone" || kind == "unknown-qpn" => {
                break
            }
            Ok(_) => {
                c.call(Request::Unregister { qpn }).unwrap();
            }
            Err(e) => panic!("{e}"),
        }
        assert!(t0.elapsed() < WAIT);
        thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn leaks_lists_owner_less_idle_qps() {
    let sock = socket_path("leaks");
    let _keeper = start_keeper(&sock);
    let (qe, qd) = {
        let mut c = KeeperClient::connect(&sock, "creator").unwrap();
        c.call(Request::OpenDomain {
            domain: "d".into(),
            path: None,
            create: true,
            exclusive: false,
        })
        .unwrap();
        let mut mk = |p: &str| {
            c.call(Request::Create {
                domain: "d".into(),
                policy: p.into(),
            })
            .unwrap()["qpn"]
                .as_u64()
                .unwrap()
        };
        let qe = mk("explicit");
        let qd = mk("domain-bound");
        let _qp = mk("process-bound");
        let (ok, out, _) = run(&["leaks"], &sock);
        assert!(ok);
        assert_eq!(out.trim(), "no leaks", "owned QPs are not leaks");
        (qe, qd)
        // The creator disconnects here (its socket closes).
    };
    let t0 = Instant::now();
    loop {
        let (ok, out, _) = run(&["leaks"], &sock);
        assert!(ok);
        let lines: Vec<&str> = out.lines().collect();
        if lines.len() == 2 {
            assert!(
                lines[0].starts_with(&format!("leak qp {qe:#08x} domain=d policy=explicit")),
                "{out}"
            );
            assert!(
                lines[1].starts_with(&format!("leak qp {qd:#08x} domain=d policy=domain-bound")),
                "{out}"
            );
            break;
        }
        assert!(t0.elapsed() < WAIT, "{out}");
        thread::sleep(Duration::from_millis(20));
    }
    // The process-bound QP went with its creator.
    let s = status(&sock);
    assert!(
        !s.lines()
            .any(|l| l.contains("policy=process-bound life=live")),
        "{s}"
    );
    // Adopting the orphan takes it off the list.
    let mut c = KeeperClient::connect(&sock, "adopter").unwrap();
    c.call(Request::Adopt { qpn: qe as u32 }).unwrap();
    let (_, out, _) = run(&["leaks"], &sock);
    assert_eq!(out.lines().count(), 1, "{out}");
}

fn hold_exit(mut p: Proc) -> (Option<i32>, String) {
    let t0 = Instant::now();
    loop {
        if let Some(st) = p.child.try_wait().unwrap() {
            let mut err = String::new();
            p.child
                .stderr
                .take()
                .unwrap()
                .read_to_string(&mut err)
                .unwrap();
            return (st.code(), err);
        }
        assert!(t0.elapsed() < WAIT, "hold did not exit");
        thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn keeper_restart_is_reported_never_silent() {
    let sock = socket_path("restart");
    let mut keeper = start_keeper(&sock);
    let h = hold(&sock, "job");
    let old = keeper.epoch.clone();
    keeper.proc.kill(); // SIGKILL: the kernel would drop every handle it held
    let keeper2 = start_keeper(&keeper.socket);
    assert_ne!(keeper2.epoch, old);
    let (code, err) = hold_exit(h.proc);
    assert_eq!(code, Some(3), "{err}");
    assert!(err.contains("restarted"), "{err}");
    assert!(err.contains(&old) && err.contains(&keeper2.epoch), "{err}");
    assert!(err.contains("all keeper-held QPs are gone"), "{err}");
    // The new keeper knows nothing of the old QPs.
    let s = status(&sock);
    assert!(!s.lines().any(|l| l.starts_with("qp ")), "{s}");
}

#[test]
fn keeper_death_is_reported_never_silent() {
    let sock = socket_path("death");
    let mut keeper = start_keeper(&sock);
    let h = hold(&sock, "job");
    keeper.proc.kill();
    let (code, err) = hold_exit(h.proc);
    assert_eq!(code, Some(3), "{err}");
    assert!(
        err.contains("went away: all keeper-held QPs are gone"),
        "{err}"
    );
}

#[test]
fn client_detects_a_new_epoch_on_reconnect() {
    let sock = socket_path("epoch");
    let mut keeper = start_keeper(&sock);
    let mut c = KeeperClient::connect(&sock, "t").unwrap();
    assert_eq!(c.epoch(), keeper.epoch);
    keeper.proc.kill();
    assert!(matches!(
        c.call(Request::Ping),
        Err(ClientError::KeeperGone)
    ));
    let k2 = start_keeper(&sock);
    match c.reconnect(Duration::from_secs(5)) {
        Err(ClientError::KeeperRestarted { old, new }) => {
            assert_eq!(old, keeper.epoch);
            assert_eq!(new, k2.epoch);
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_second_keeper_refuses_a_live_socket_and_status_needs_a_keeper() {
    let sock = socket_path("twice");
    let _keeper = start_keeper(&sock);
    let out = Command::new(BIN)
        .args(["serve", "--socket"])
        .arg(&sock)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("already serving"));
    let nowhere = socket_path("nowhere");
    let (ok, _, err) = run(&["status"], &nowhere);
    assert!(!ok);
    assert!(err.contains("cannot reach a keeper"), "{err}");
}

#[test]
fn verbs_backend_without_a_device_fails_with_a_clear_error() {
    let sock = socket_path("verbs");
    let out = Command::new(BIN)
        .args(["serve", "--backend", "verbs", "--socket"])
        .arg(&sock)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    // Without the `rdma` feature: "built without"; with it on a host without RDMA: "no RDMA
    // device"; on rxe: "has no XRC".
    assert!(
        err.contains("built without the `rdma` feature")
            || err.contains("no RDMA device")
            || err.contains("has no XRC"),
        "{err}"
    );
}

#[test]
fn garbage_lines_get_errors_and_do_not_kill_the_keeper() {
    use std::io::Write;
    use std::os::unix::net::UnixStream;
    let sock = socket_path("garbage");
    let _keeper = start_keeper(&sock);
    let mut s = UnixStream::connect(&sock).unwrap();
    s.write_all(b"{not json\n{\"op\":\"frobnicate\"}\n\xff\xfe\n")
        .unwrap();
    let mut r = BufReader::new(s.try_clone().unwrap());
    for _ in 0..2 {
        let mut line = String::new();
        r.read_line(&mut line).unwrap();
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(v["ok"], false);
        assert_eq!(v["error"]["kind"], "bad-request");
    }
    // A line longer than the limit closes that connection only.
    let mut s2 = UnixStream::connect(&sock).unwrap();
    let big = vec![b'a'; 70 * 1024];
    let _ = s2.write_all(&big);
    drop(s2);
    assert!(status(&sock).starts_with("keeper "));
}
