//! The daemon's state directory and its journal (issue 25, faults 1 and 7): private files in a
//! directory the daemon owns, never a file planted by someone else; restart DREQs retried
//! until answered, the journal entry kept until then; a connection that cannot be journaled
//! is refused, never reported established.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

mod common;

use std::collections::{BTreeSet, HashMap};
use std::net::{IpAddr, UdpSocket};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

use common::{cm_ping_bin, daemon_with, ibcmd_bin, scratch, Proc, DEADLINE};

/// The journal inside a state directory.
fn journal_of(state: &Path) -> PathBuf {
    state.join("journal")
}

/// The comm IDs a journal file holds live (its `add` lines less its `del` lines).
fn live_in(journal: &Path) -> BTreeSet<u32> {
    let text = std::fs::read(journal).unwrap_or_default();
    let mut live = BTreeSet::new();
    for l in String::from_utf8_lossy(&text).lines() {
        let num = |key: &str| {
            let at = l.find(key)? + key.len();
            let digits: String = l[at..].chars().take_while(char::is_ascii_digit).collect();
            digits.parse::<u32>().ok()
        };
        if l.starts_with("{\"add\"") {
            live.extend(num("\"comm_id\":"));
        } else if l.starts_with("{\"del\"") {
            if let Some(id) = num("\"del\":") {
                live.remove(&id);
            }
        }
    }
    live
}

fn is_root() -> bool {
    std::fs::metadata("/proc/self").unwrap().uid() == 0
}

/// `n` RC connections from a daemon client (`cm-ping --daemon --stay`) to `peer` on
/// `service_id`.
fn stay_client(sock: &Path, bind: &str, peer: &str, service_id: &str, n: u32) -> Proc {
    let count = n.to_string();
    Proc::spawn(
        "connector",
        &cm_ping_bin(),
        &[
            "--connect",
            peer,
            "--bind",
            bind,
            "--daemon",
            sock.to_str().unwrap(),
            "--service-id",
            service_id,
            "--count",
            &count,
            "--stay",
        ],
    )
}

#[test]
fn the_state_directory_and_the_journal_are_private() {
    let dir = scratch("private");
    let state = dir.join("state");
    let st = state.to_str().unwrap();
    let (mut d, sock) = daemon_with(&dir, "a", "127.0.25.11", &["--state", st]);
    let mut listener = Proc::spawn(
        "listener",
        &cm_ping_bin(),
        &["--listen", "127.0.25.12", "--service-id", "0x2511"],
    );
    listener.wait_out(|l| l.starts_with("listening"), "'listening'");
    let mut c = stay_client(&sock, "127.0.25.11", "127.0.25.12", "0x2511", 1);
    c.wait_out(|l| l.starts_with("established"), "established");
    let m = std::fs::symlink_metadata(&state).unwrap();
    assert!(m.is_dir(), "--state is a directory");
    assert_eq!(
        m.mode() & 0o777,
        0o700,
        "state directory mode {:o}",
        m.mode()
    );
    let j = std::fs::symlink_metadata(journal_of(&state)).unwrap();
    assert!(j.is_file());
    assert_eq!(j.mode() & 0o777, 0o600, "journal mode {:o}", j.mode());
    assert_eq!(live_in(&journal_of(&state)).len(), 1);
    d.signal("TERM");
    assert!(d.wait().success());
}

#[test]
fn a_symlink_in_the_state_directory_is_never_followed() {
    let dir = scratch("symlink");
    let state = dir.join("state");
    std::fs::create_dir(&state).unwrap();
    std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o700)).unwrap();
    let victim = dir.join("victim");
    std::fs::write(&victim, b"precious\n").unwrap();
    std::fs::set_permissions(&victim, std::fs::Permissions::from_mode(0o600)).unwrap();
    // The compaction's temporary file, planted as a symlink to the victim.
    std::os::unix::fs::symlink(&victim, state.join("journal.tmp")).unwrap();
    let st = state.to_str().unwrap();
    let sock = dir.join("a.sock");
    let mut p = Proc::spawn(
        "a",
        &ibcmd_bin(),
        &[
            "--addr",
            "127.0.25.13",
            "--socket",
            sock.to_str().unwrap(),
            "--state",
            st,
        ],
    );
    // Served or refused, the victim is untouched.
    let l = p.wait_err(
        |l| l.contains("ibcmd serving") || l.starts_with("ibcmd: "),
        "serving or an error",
    );
    if l.contains("ibcmd serving") {
        p.signal("TERM");
    }
    let _ = p.wait();
    assert_eq!(std::fs::read(&victim).unwrap(), b"precious\n");
    assert!(std::fs::symlink_metadata(&victim).unwrap().mode() & 0o777 == 0o600);

    // The planted link is gone (removed, never followed).
    assert!(std::fs::symlink_metadata(state.join("journal.tmp")).is_err());
    // The journal itself a symlink: refused, never followed.
    let _ = std::fs::remove_file(journal_of(&state));
    std::os::unix::fs::symlink(&victim, journal_of(&state)).unwrap();
    let mut p = Proc::spawn(
        "a",
        &ibcmd_bin(),
        &[
            "--addr",
            "127.0.25.13",
            "--socket",
            sock.to_str().unwrap(),
            "--state",
            st,
        ],
    );
    p.wait_err(|l| l.starts_with("ibcmd: "), "an error");
    assert!(!p.wait().success());
    assert!(
        p.seen_err.iter().any(|l| l.contains("not a regular file")),
        "{:#?}",
        p.seen_err
    );
    assert_eq!(std::fs::read(&victim).unwrap(), b"precious\n");
}

#[test]
fn a_journal_or_directory_of_another_user_is_refused_never_replayed() {
    if !is_root() {
        println!("SKIPPED: needs root (chown to another uid)");
        return;
    }
    let dir = scratch("foreign");
    // Where a planted journal would send its DREQ.
    let target = UdpSocket::bind("127.0.25.16:4791").unwrap();
    target.set_nonblocking(true).unwrap();
    let state = dir.join("state");
    std::fs::create_dir(&state).unwrap();
    std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o700)).unwrap();
    let planted = concat!(
        r#"{"add":{"comm_id":305419896,"remote_comm_id":2271560481,"remote_qpn":4660,"#,
        r#""peer":{"udp":"127.0.25.16:4791"},"xrc_tgt":false}}"#,
        "\n"
    );
    let j = journal_of(&state);
    std::fs::write(&j, planted).unwrap();
    std::fs::set_permissions(&j, std::fs::Permissions::from_mode(0o600)).unwrap();
    std::os::unix::fs::chown(&j, Some(65534), Some(65534)).unwrap();
    let sock = dir.join("a.sock");
    let start = |name: &str| {
        let mut p = Proc::spawn(
            name,
            &ibcmd_bin(),
            &[
                "--addr",
                "127.0.25.15",
                "--socket",
                sock.to_str().unwrap(),
                "--state",
                state.to_str().unwrap(),
            ],
        );
        let l = p.wait_err(
            |l| l.contains("ibcmd serving") || l.starts_with("ibcmd: "),
            "serving or an error",
        );
        assert!(
            !l.contains("ibcmd serving"),
            "{name}: started: {:#?}",
            p.seen_err
        );
        assert!(!p.wait().success());
        p.seen_err.join("\n")
    };
    let err = start("foreign-journal");
    assert!(err.contains("owned by uid 65534"), "{err}");
    // Nothing went to the address the planted journal names.
    let mut buf = [0u8; 512];
    assert!(target.recv_from(&mut buf).is_err(), "a DREQ was sent");
    assert_eq!(
        std::fs::read_to_string(&j).unwrap(),
        planted,
        "the journal changed"
    );

    // The directory: another user's, then writable by others.
    std::fs::remove_file(&j).unwrap();
    std::os::unix::fs::chown(&state, Some(65534), None).unwrap();
    let err = start("foreign-dir");
    assert!(err.contains("owned by uid 65534"), "{err}");
    std::os::unix::fs::chown(&state, Some(0), None).unwrap();
    std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o1777)).unwrap();
    let err = start("open-dir");
    assert!(err.contains("writable by others"), "{err}");
    assert!(target.recv_from(&mut buf).is_err(), "a DREQ was sent");
}

/// A peer with an endpoint of its own over UDP that drops the first DREQ of every
/// connection, and accepts every REQ for `service_id`; reports each connection's
/// establishment and end, and the live comm IDs of `journal` whenever it drops a DREQ.
mod peer {
    use super::*;
    use bytes::Bytes;
    use ibcm::proto::{AcceptParams, EndpointConfig, ListenOptions, PeerAddr};
    use ibcm::rt::{Cm, DatagramTransport, UdpTransport};
    use ibcm_mad::{AttrId, Gid, MadHeader, Qpn, ServiceId};

    pub(super) enum Report {
        Established,
        /// A first DREQ dropped: its local comm ID (the daemon's), and what the journal held
        /// live at that moment.
        Dropped(u32, BTreeSet<u32>),
        Closed(String),
    }

    struct DropFirstDreqs {
        inner: UdpTransport,
        seen: HashMap<u32, usize>,
        journal: PathBuf,
        tx: mpsc::Sender<Report>,
    }

    impl DatagramTransport for DropFirstDreqs {
        async fn send(&mut self, to: PeerAddr, mad: &[u8]) -> std::io::Result<()> {
            self.inner.send(to, mad).await
        }

        async fn recv(&mut self) -> std::io::Result<(PeerAddr, Bytes)> {
            loop {
                let (from, m) = self.inner.recv().await?;
                if MadHeader::peek_attr_id(&m) == Some(AttrId::Dreq) {
                    let id = u32::from_be_bytes(m[24..28].try_into().unwrap());
                    let n = self.seen.entry(id).or_default();
                    *n += 1;
                    if *n == 1 {
                        let live = live_in(&self.journal);
                        let _ = self.tx.send(Report::Dropped(id, live));
                        continue;
                    }
                }
                return Ok((from, m));
            }
        }

        fn local_addr(&self) -> PeerAddr {
            self.inner.local_addr()
        }
    }

    /// Runs the peer on `ip` in a thread of its own.
    pub(super) fn spawn(ip: IpAddr, service_id: u64, journal: PathBuf) -> mpsc::Receiver<Report> {
        let (tx, rx) = mpsc::channel();
        let (ready_tx, ready_rx) = mpsc::channel();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let inner = UdpTransport::bind(ip).await.unwrap();
                let t = DropFirstDreqs {
                    inner,
                    seen: HashMap::new(),
                    journal,
                    tx: tx.clone(),
                };
                let cfg = EndpointConfig {
                    local_gid: Gid::from_ip(ip),
                    ..EndpointConfig::default()
                };
                let (cm, _driver) = Cm::bind(t, cfg);
                let mut l = cm
                    .listen(ServiceId(service_id), ListenOptions::default())
                    .await
                    .unwrap();
                ready_tx.send(()).unwrap();
                let qpn = Arc::new(Mutex::new(0x2500u32));
                while let Some(inc) = l.next().await {
                    let q = {
                        let mut q = qpn.lock().unwrap();
                        *q += 1;
                        *q
                    };
                    let tx = tx.clone();
                    tokio::spawn(async move {
                        let Ok(conn) = inc.accept(AcceptParams::new(Qpn::new(q).unwrap())).await
                        else {
                            return;
                        };
                        if conn.established().await.is_ok() {
                            let _ = tx.send(Report::Established);
                        }
                        let why = conn.closed().await;
                        let _ = tx.send(Report::Closed(why.to_string()));
                    });
                }
            });
        });
        ready_rx.recv_timeout(DEADLINE).unwrap();
        rx
    }
}

#[test]
fn restart_dreqs_are_retried_and_journaled_until_answered() {
    const N: usize = 5;
    let dir = scratch("retry");
    let state = dir.join("state");
    let st = state.to_str().unwrap();
    let reports = peer::spawn("127.0.25.2".parse().unwrap(), 0x2502, journal_of(&state));
    let (mut d, sock) = daemon_with(&dir, "a", "127.0.25.1", &["--state", st]);
    let mut client = stay_client(&sock, "127.0.25.1", "127.0.25.2", "0x2502", N as u32);
    let next = || reports.recv_timeout(DEADLINE).unwrap();
    for _ in 0..N {
        assert!(matches!(next(), peer::Report::Established));
    }
    for i in 0..N {
        client.wait_out(|l| l.starts_with("established"), &format!("client #{i}"));
    }
    let before = live_in(&journal_of(&state));
    assert_eq!(before.len(), N, "journaled while established");

    // Killed without a word; restarted. The peer drops the first DREQ of each connection:
    // the entry must still be in the journal then, and the retransmission ends it.
    d.signal("KILL");
    let _ = d.wait();
    let _ = client.rest_of_out();
    let (mut d2, _) = daemon_with(&dir, "a", "127.0.25.1", &["--state", st]);
    let (mut dropped, mut closed) = (BTreeSet::new(), Vec::new());
    let end = std::time::Instant::now() + Duration::from_secs(60);
    while closed.len() < N {
        let left = end.saturating_duration_since(std::time::Instant::now());
        match reports.recv_timeout(left) {
            Ok(peer::Report::Dropped(id, live)) => {
                assert!(
                    live.contains(&id),
                    "DREQ of {id:#x} dropped, and the journal no longer holds it: {live:x?}"
                );
                dropped.insert(id);
            }
            Ok(peer::Report::Closed(why)) => closed.push(why),
            Ok(peer::Report::Established) => panic!("a new connection"),
            Err(e) => panic!(
                "{} of {N} connections ended at the peer ({e:?}); dropped DREQs of {dropped:x?}; \
                 daemon log:\n{}",
                closed.len(),
                d2.seen_err.join("\n")
            ),
        }
    }
    assert_eq!(
        dropped, before,
        "the first DREQ of each journaled connection dropped"
    );
    assert!(
        closed.iter().all(|w| w.contains("by the peer")),
        "{closed:#?}"
    );
    // Each DREP ends its entry: the journal empties.
    for _ in 0..N {
        d2.wait_err(
            |l| l.contains("previous run") && l.contains("answered"),
            "answered",
        );
    }
    assert!(live_in(&journal_of(&state)).is_empty());
    d2.signal("TERM");
    assert!(d2.wait().success());
    assert!(live_in(&journal_of(&state)).is_empty());
}

/// A small tmpfs mounted at a path, unmounted when dropped.
struct Mount(PathBuf);

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg(&self.0).status();
    }
}

/// A scratch directory whose `state` subdirectory is a 16 KiB tmpfs; dropped, the tmpfs is
/// unmounted first, then the directory removed (fields drop in order).
struct SmallState {
    _mount: Mount,
    dir: common::Scratch,
    state: PathBuf,
}

/// A [`SmallState`] named `name`; `None`, saying SKIPPED and why, when not root or when no
/// tmpfs can be mounted here.
fn small_state(name: &str) -> Option<SmallState> {
    if !is_root() {
        println!("SKIPPED: needs root (mounts a 16 KiB tmpfs)");
        return None;
    }
    let dir = scratch(name);
    let state = dir.join("state");
    std::fs::create_dir(&state).unwrap();
    let ok = std::process::Command::new("mount")
        .args([
            "-t",
            "tmpfs",
            "-o",
            "size=16k,mode=0700",
            "ibcmd-test",
            state.to_str().unwrap(),
        ])
        .status()
        .unwrap()
        .success();
    if !ok {
        println!("SKIPPED: cannot mount a tmpfs here");
        return None;
    }
    Some(SmallState {
        _mount: Mount(state.clone()),
        dir,
        state,
    })
}

#[test]
fn a_connection_that_cannot_be_journaled_is_refused() {
    let Some(small) = small_state("full") else {
        return;
    };
    let (dir, state) = (&small.dir, &small.state);
    let st = state.to_str().unwrap();
    let (mut d, sock) = daemon_with(dir, "a", "127.0.25.21", &["--state", st]);
    // The file system fills up.
    {
        use std::io::Write;
        let mut f = std::fs::File::create(state.join("filler")).unwrap();
        while f.write_all(&[0u8; 1024]).is_ok() {}
    }
    let mut listener = Proc::spawn(
        "listener",
        &cm_ping_bin(),
        &["--listen", "127.0.25.22", "--service-id", "0x2521"],
    );
    listener.wait_out(|l| l.starts_with("listening"), "'listening'");
    let mut c = stay_client(&sock, "127.0.25.21", "127.0.25.22", "0x2521", 3);
    let out = c.rest_of_out();
    assert!(
        !out.iter().any(|l| l.starts_with("established")),
        "told established without a journal entry: {out:#?}"
    );
    assert!(
        out.iter().any(|l| l.contains("journal")),
        "no clear error: {out:#?}"
    );
    // The peer heard the connection end (DREQ) rather than believing in it.
    for i in 0..3 {
        listener.wait_out(
            |l| l.starts_with("disconnected conn=") && l.contains("by the peer"),
            &format!("peer disconnect #{i}"),
        );
    }
    d.wait_err(
        |l| l.contains("journal write failed"),
        "'journal write failed'",
    );
    d.signal("TERM");
    assert!(d.wait().success());
}

#[test]
fn a_journal_with_bad_lines_is_replayed_and_the_daemon_starts() {
    let dir = scratch("bad-lines");
    let peer = UdpSocket::bind("127.0.25.26:4791").unwrap();
    peer.set_read_timeout(Some(DEADLINE)).unwrap();
    let state = dir.join("state");
    std::fs::create_dir(&state).unwrap();
    std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o700)).unwrap();
    let good = concat!(
        r#"{"add":{"comm_id":305419896,"remote_comm_id":2271560481,"remote_qpn":4660,"#,
        r#""peer":{"udp":"127.0.25.26:4791"},"xrc_tgt":false}}"#,
        "\n"
    );
    let mut text = b"{\"add\":\xff}\n".to_vec();
    text.extend_from_slice(good.as_bytes());
    text.extend_from_slice(b"garbage\n{\"add\":{\"comm_id\":7,\"remo");
    let j = journal_of(&state);
    std::fs::write(&j, &text).unwrap();
    std::fs::set_permissions(&j, std::fs::Permissions::from_mode(0o600)).unwrap();
    let st = state.to_str().unwrap();
    let (mut d, _) = daemon_with(&dir, "a", "127.0.25.25", &["--state", st]);
    let skipped = d
        .seen_err
        .iter()
        .find(|l| l.contains("journal lines skipped"))
        .cloned()
        .unwrap_or_default();
    assert!(
        skipped.contains("replayed=1") && skipped.contains("skipped=3"),
        "{:#?}",
        d.seen_err
    );
    // The valid entry's DREQ reaches its peer (RoCEv2: BTH 12 + DETH 8, then the MAD, whose
    // attribute ID at MAD byte 16 is 0x0015, DREQ; the Local Comm ID at MAD byte 24).
    let mut buf = [0u8; 512];
    let (n, _) = peer.recv_from(&mut buf).unwrap();
    assert!(n >= 20 + 256, "{n} bytes");
    let mad = &buf[20..];
    assert_eq!(u16::from_be_bytes([mad[16], mad[17]]), 0x0015, "a DREQ");
    assert_eq!(
        u32::from_be_bytes([mad[24], mad[25], mad[26], mad[27]]),
        305_419_896
    );
    assert_eq!(live_in(&j), BTreeSet::from([305_419_896]));
    d.signal("TERM");
    assert!(d.wait().success());
}

#[test]
fn an_xrc_connection_that_cannot_be_journaled_is_refused() {
    let Some(small) = small_state("full-xrc") else {
        return;
    };
    let (dir, state) = (&small.dir, &small.state);
    let st = state.to_str().unwrap();
    let (_d, sock) = daemon_with(dir, "a", "127.0.25.51", &["--state", st]);
    {
        use std::io::Write;
        let mut f = std::fs::File::create(state.join("filler")).unwrap();
        while f.write_all(&[0u8; 1024]).is_ok() {}
    }
    let mut listener = Proc::spawn(
        "listener",
        &cm_ping_bin(),
        &[
            "--listen",
            "127.0.25.51",
            "--daemon",
            sock.to_str().unwrap(),
            "--xrc",
            "--policy",
            "explicit",
        ],
    );
    listener.wait_out(|l| l.starts_with("listening"), "'listening'");
    let mut c = Proc::spawn(
        "connector",
        &cm_ping_bin(),
        &[
            "--connect",
            "127.0.25.51",
            "--bind",
            "127.0.25.52",
            "--xrc",
            "--count",
            "2",
            "--stay",
        ],
    );
    for i in 0..2 {
        let l = listener.wait_out(
            |l| l.starts_with("refused conn=") || l.starts_with("established conn="),
            &format!("report #{i}"),
        );
        assert!(
            l.starts_with("refused conn=") && l.contains("journal"),
            "{l}"
        );
    }
    // The initiator's connections end by the target's DREQ.
    let rest = c.rest_of_out();
    assert_eq!(
        rest.last().map(String::as_str),
        Some("cm-ping: 2 established, 0 rejected, 0 timed out, 0 disconnected, 2 closed by peer"),
        "{rest:#?}"
    );
}
