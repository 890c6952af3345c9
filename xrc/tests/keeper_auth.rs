//! `xrcd-keeper` and other users: the real binary, a client run as uid 65534 (`nobody`,
//! through `setpriv`; root only), impostor sockets, a client that never reads, thousands of
//! sessions.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use ibcm_xrc::keeper::client::{ClientError, KeeperClient};
use ibcm_xrc::keeper::proto::{ModifyAttr, Request};

const BIN: &str = env!("CARGO_BIN_EXE_xrcd-keeper");
const NOBODY: &str = "65534";

fn socket_path(tag: &str) -> PathBuf {
    static N: AtomicU32 = AtomicU32::new(0);
    let n = N.fetch_add(1, Ordering::SeqCst);
    std::env::temp_dir().join(format!(
        "xrcd-keeper-auth-{}-{tag}-{n}.sock",
        std::process::id()
    ))
}

/// Killed (SIGKILL) and reaped on drop.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

struct Keeper {
    _proc: Proc,
    socket: PathBuf,
}

impl Drop for Keeper {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.socket);
    }
}

/// A keeper run by `as_nobody` or by this process's user, its socket `chmod 0777` (as in
/// the issue: every user may connect; the keeper's own rules must hold).
fn start_keeper(socket: &Path, as_nobody: bool) -> Keeper {
    start_keeper_with(socket, as_nobody, &[])
}

fn start_keeper_with(socket: &Path, as_nobody: bool, extra: &[&str]) -> Keeper {
    let mut cmd = if as_nobody {
        let mut c = Command::new("setpriv");
        c.args(nobody_args()).arg(BIN);
        c
    } else {
        Command::new(BIN)
    };
    let mut child = cmd
        .args(["serve", "--socket"])
        .arg(socket)
        .args(["--backend", "sim", "--quarantine-ms", "200"])
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert!(line.starts_with("ready "), "keeper said {line:?}");
    std::fs::set_permissions(socket, std::fs::Permissions::from_mode(0o777)).unwrap();
    Keeper {
        _proc: Proc(child),
        socket: socket.to_owned(),
    }
}

fn nobody_args() -> [String; 3] {
    [
        format!("--reuid={NOBODY}"),
        format!("--regid={NOBODY}"),
        "--clear-groups".into(),
    ]
}

/// Whether this test can run clients as another user; says why not when it cannot.
fn root_or_say_why(test: &str) -> bool {
    let root = effective_uid() == 0;
    if !root {
        println!(
            "SKIPPED {test}: not root, so no client can be run as uid {NOBODY} (setpriv --reuid \
             needs CAP_SETUID); run the tests as root to check the uid rules end to end (the \
             keeper core's unit tests check them without)"
        );
    }
    root
}

/// This process's effective uid (from `/proc/self/status`).
fn effective_uid() -> u32 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|v| v.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap()
}

/// `xrcd-keeper request` as uid 65534.
fn request_as_nobody(socket: &Path, reqs: &[String]) -> Output {
    Command::new("setpriv")
        .args(nobody_args())
        .arg(BIN)
        .args(["request", "--socket"])
        .arg(socket)
        .args(reqs)
        .output()
        .unwrap()
}

fn json(r: &Request) -> String {
    serde_json::to_string(r).unwrap()
}

/// Every act of uid 65534 on root's objects is refused with `permission-denied`; they stay
/// as they were.
#[test]
fn nobody_cannot_act_on_roots_objects() {
    if !root_or_say_why("nobody_cannot_act_on_roots_objects") {
        return;
    }
    let k = start_keeper(&socket_path("acts"), false);
    let mut root = KeeperClient::connect(&k.socket, "root").unwrap();
    root.call(Request::OpenDomain {
        domain: "rootdom".into(),
        path: None,
        create: true,
        exclusive: false,
    })
    .unwrap();
    let qpn = |v: serde_json::Value| v["qpn"].as_u64().unwrap() as u32;
    let explicit = qpn(root
        .call(Request::Create {
            domain: "rootdom".into(),
            policy: "explicit".into(),
        })
        .unwrap());
    let shared = qpn(root
        .call(Request::CreateOrRegister {
            domain: "rootdom".into(),
            key: "default".into(),
        })
        .unwrap());
    let to_init = ModifyAttr {
        state: Some("init".into()),
        port: Some(1),
        pkey_index: Some(0),
        access_flags: Some(0),
        ..ModifyAttr::default()
    };
    let attempts = [
        Request::Modify {
            qpn: explicit,
            attr: to_init.clone(),
        },
        Request::Modify {
            qpn: shared,
            attr: to_init,
        },
        Request::Register { qpn: shared },
        Request::Adopt { qpn: explicit },
        Request::CloseDomain {
            domain: "rootdom".into(),
        },
        Request::Create {
            domain: "rootdom".into(),
            policy: "shared".into(),
        },
    ];
    for a in &attempts {
        let out = request_as_nobody(&k.socket, &[json(a)]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{a:?} was accepted");
        assert!(err.contains("permission-denied"), "{a:?}: {err}");
    }
    // A positive control: nobody's own domain works.
    let out = request_as_nobody(
        &k.socket,
        &[
            json(&Request::OpenDomain {
                domain: "mine".into(),
                path: None,
                create: true,
                exclusive: false,
            }),
            json(&Request::Create {
                domain: "mine".into(),
                policy: "explicit".into(),
            }),
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let st = root.call(Request::Status).unwrap().to_string();
    assert!(st.contains("\"rootdom\""), "{st}");
    assert!(!st.contains("\"INIT\""), "a QP moved: {st}");
}

/// uid 65534 holds the domain name "job"; root's `hold --domain job --path FILE` fails and
/// says who holds the name, instead of getting that domain.
#[test]
fn squatted_name_fails_roots_hold_clearly() {
    if !root_or_say_why("squatted_name_fails_roots_hold_clearly") {
        return;
    }
    let k = start_keeper(&socket_path("squat"), false);
    let mut squatter = Command::new("setpriv")
        .args(nobody_args())
        .arg(BIN)
        .args(["hold", "--socket"])
        .arg(&k.socket)
        .args(["--domain", "job", "--shared-qp"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(squatter.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let _squatter = Proc(squatter);
    assert!(line.starts_with("0x"), "squatter's hold printed {line:?}");
    let out = Command::new(BIN)
        .args(["hold", "--socket"])
        .arg(&k.socket)
        .args([
            "--domain",
            "job",
            "--path",
            "/tmp/ibcm-root-job.xrcd",
            "--shared-qp",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "root's hold got a QP: {err}");
    assert!(out.stdout.is_empty(), "no QPN printed");
    assert!(err.contains("permission-denied"), "{err}");
    assert!(err.contains("held by uid 65534"), "{err}");
}

/// An impostor socket planted by uid 65534 (here, a keeper it runs) is not talked to by
/// root's clients.
#[test]
fn impostor_socket_is_refused() {
    if !root_or_say_why("impostor_socket_is_refused") {
        return;
    }
    let k = start_keeper(&socket_path("impostor"), true);
    match KeeperClient::connect(&k.socket, "root") {
        Err(ClientError::UntrustedDaemon { uid, me, .. }) => {
            assert_eq!((uid, me), (65534, 0));
        }
        other => panic!("{other:?}"),
    }
    let out = Command::new(BIN)
        .args(["status", "--socket"])
        .arg(&k.socket)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("not trusted"), "{err}");
}

/// `serve --socket` on a regular file refuses and leaves the file as it was.
#[test]
fn serve_refuses_a_regular_file() {
    let path = socket_path("regular");
    std::fs::write(&path, b"precious").unwrap();
    let out = Command::new(BIN)
        .args(["serve", "--socket"])
        .arg(&path)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("not a socket"), "{err}");
    assert_eq!(std::fs::read(&path).unwrap(), b"precious");
    std::fs::remove_file(&path).unwrap();
}

/// A client that sends requests and never reads its replies is cut off when its queue is
/// full; meanwhile another client's requests are all answered (the replies are not written
/// under the keeper's lock). The guard on the other client's reads is a failure bound, far
/// above a reply's time: the old keeper held its lock up to 2 s per blocked write.
#[test]
fn a_client_not_reading_freezes_nobody() {
    let k = start_keeper(&socket_path("noread"), false);
    let mut other = KeeperClient::connect(&k.socket, "other").unwrap();
    other.call(Request::Ping).unwrap();
    let mut flooder = UnixStream::connect(&k.socket).unwrap();
    // Big replies: a status with a few domains, many times.
    for i in 0..20 {
        other
            .call(Request::OpenDomain {
                domain: format!("d{i}-{}", "x".repeat(200)),
                path: None,
                create: true,
                exclusive: false,
            })
            .unwrap();
    }
    let line = format!("{}\n", json(&Request::Status));
    let flood = std::thread::spawn(move || {
        for _ in 0..20_000 {
            if flooder.write_all(line.as_bytes()).is_err() {
                break;
            }
        }
        flooder
    });
    let probe = UnixStream::connect(&k.socket).unwrap();
    probe
        .set_read_timeout(Some(Duration::from_secs(1)))
        .unwrap();
    let mut probe_w = probe.try_clone().unwrap();
    let mut probe_r = BufReader::new(probe);
    for i in 0..200 {
        writeln!(probe_w, "{{\"id\":{i},\"op\":\"ping\"}}").unwrap();
        let mut reply = String::new();
        probe_r
            .read_line(&mut reply)
            .unwrap_or_else(|e| panic!("ping {i} unanswered while a client does not read: {e}"));
        assert!(reply.contains("\"ok\":true"), "{reply}");
    }
    // The flooder was cut off: it reads what was queued, then EOF.
    let mut flooder = flood.join().unwrap();
    flooder
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut sink = Vec::new();
    if let Err(e) = flooder.read_to_end(&mut sink) {
        assert!(
            !matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ),
            "the flooder's connection was never closed: {e}"
        );
    }
}

/// `status` with 3,000 connected clients: one reply of ≈ 150 kB, read and printed.
#[test]
fn status_with_3000_sessions() {
    // More sessions than one user may have by default.
    let k = start_keeper_with(
        &socket_path("many"),
        false,
        &["--max-clients-per-user", "4000"],
    );
    let clients: Vec<UnixStream> = (0..3000)
        .map(|i| {
            let mut s = UnixStream::connect(&k.socket).unwrap();
            writeln!(s, "{{\"op\":\"hello\",\"name\":\"client-{i:04}\"}}").unwrap();
            s
        })
        .collect();
    // Wait until every hello is answered (each client's first line).
    for c in &clients {
        let mut r = BufReader::new(c.try_clone().unwrap());
        let mut line = String::new();
        r.read_line(&mut line).unwrap();
        assert!(line.contains("\"ok\":true"), "{line}");
    }
    let out = Command::new(BIN)
        .args(["status", "--socket"])
        .arg(&k.socket)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("sessions=3001"),
        "{}",
        &text[..200.min(text.len())]
    );
    assert!(text.contains("name=client-2999"));
    drop(clients);
}

/// A user over its session quota is told so in one line and its socket is closed; its other
/// sessions keep working.
#[test]
fn sessions_over_the_user_quota_are_refused() {
    let k = start_keeper_with(
        &socket_path("quota"),
        false,
        &["--max-clients-per-user", "2"],
    );
    let hello = |s: &mut UnixStream| {
        // A refused session may be closed before the hello is written: its refusal is
        // read all the same.
        let _ = writeln!(s, "{{\"op\":\"hello\"}}");
        let mut line = String::new();
        BufReader::new(s.try_clone().unwrap())
            .read_line(&mut line)
            .unwrap();
        line
    };
    let mut a = UnixStream::connect(&k.socket).unwrap();
    let mut b = UnixStream::connect(&k.socket).unwrap();
    assert!(hello(&mut a).contains("\"ok\":true"));
    assert!(hello(&mut b).contains("\"ok\":true"));
    let c = UnixStream::connect(&k.socket).unwrap();
    let mut r = BufReader::new(c);
    let mut line = String::new();
    r.read_line(&mut line).unwrap();
    assert!(line.contains("\"kind\":\"quota-exceeded\""), "{line}");
    assert!(line.contains("2 sessions open"), "{line}");
    line.clear();
    assert_eq!(
        r.read_line(&mut line).unwrap(),
        0,
        "closed after the refusal"
    );
    assert!(hello(&mut a).contains("\"ok\":true"));
    // One session gone: a new one is served.
    drop(b);
    loop {
        let mut d = UnixStream::connect(&k.socket).unwrap();
        let l = hello(&mut d);
        if l.contains("\"ok\":true") {
            break;
        }
        // The keeper has not seen the close yet.
        assert!(l.contains("quota-exceeded"), "{l}");
    }
}
