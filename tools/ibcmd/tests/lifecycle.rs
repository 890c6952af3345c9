//! The daemon's own life: SIGKILL and restart (the journal's DREQs), SIGTERM (DREQs for every
//! client connection, socket removed), a client's SIGKILL (its RC connections disconnected),
//! the socket's mode and a non-socket file at its path.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

mod common;

use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};

use common::{cm_ping_bin, daemon, daemon_with, ibcmd_bin, scratch, Proc};

/// An RC listener with an endpoint of its own (not a daemon client) on `ip`.
fn plain_listener(ip: &str) -> Proc {
    let mut l = Proc::spawn("listener", &cm_ping_bin(), &["--listen", ip]);
    l.wait_out(|s| s.starts_with("listening"), "'listening'");
    l
}

/// `n` RC connections from a client of the daemon at `sock` (on `daemon_ip`) to `peer`,
/// held with --stay; waits until the listener has them all.
fn stay_client(sock: &str, daemon_ip: &str, peer: &str, n: u32, listener: &mut Proc) -> Proc {
    let count = n.to_string();
    let mut c = Proc::spawn(
        "connector",
        &cm_ping_bin(),
        &[
            "--connect",
            peer,
            "--bind",
            daemon_ip,
            "--daemon",
            sock,
            "--count",
            &count,
            "--stay",
        ],
    );
    for i in 0..n {
        c.wait_out(
            |l| l.starts_with("established"),
            &format!("established #{i}"),
        );
        listener.wait_out(
            |l| l.starts_with("established conn="),
            &format!("listener #{i}"),
        );
    }
    c
}

fn wait_peer_disconnects(listener: &mut Proc, n: u32) {
    for i in 0..n {
        listener.wait_out(
            |l| l.starts_with("disconnected conn=") && l.contains("by the peer"),
            &format!("peer disconnect #{i}"),
        );
    }
}

#[test]
fn a_restarted_daemon_ends_the_connections_of_its_previous_life() {
    let dir = scratch("restart");
    let (mut d, sock) = daemon(&dir, "a", "127.0.0.61");
    let s = sock.to_str().unwrap().to_string();
    let mut listener = plain_listener("127.0.0.62");
    let mut client = stay_client(&s, "127.0.0.61", "127.0.0.62", 3, &mut listener);

    // The daemon dies without a word: the peer still believes in three connections.
    d.signal("KILL");
    let _ = d.wait();
    // The client hears its daemon is gone (its connections end here, not by the peer).
    let rest = client.rest_of_out();
    assert_eq!(
        rest.iter().filter(|l| l.contains("ended here")).count(),
        3,
        "{rest:#?}"
    );
    assert_eq!(
        rest.last().map(String::as_str),
        Some("cm-ping: 3 established, 0 rejected, 0 timed out, 0 disconnected, 0 closed by peer")
    );

    // Restarted on the same socket path (a dead daemon's socket is replaced) and journal.
    let (mut d2, _) = daemon(&dir, "a", "127.0.0.61");
    let journaled = d2
        .seen_err
        .iter()
        .filter(|l| l.contains("DREQ for a connection of the previous run"))
        .count();
    assert_eq!(journaled, 3, "{:#?}", d2.seen_err);
    wait_peer_disconnects(&mut listener, 3);

    // SIGTERM with two live client connections: DREQs, socket removed, exit 0. The journal
    // of the first life is not replayed.
    let mut client2 = stay_client(&s, "127.0.0.61", "127.0.0.62", 2, &mut listener);
    d2.signal("TERM");
    assert!(d2.wait().success());
    wait_peer_disconnects(&mut listener, 2);
    assert!(!sock.exists(), "socket left behind");
    let _ = client2.rest_of_out();
    let (mut d3, _) = daemon(&dir, "a", "127.0.0.61");
    let replayed = d3
        .seen_err
        .iter()
        .filter(|l| l.contains("DREQ for a connection of the previous run"))
        .count();
    assert_eq!(replayed, 0, "a clean stop leaves an empty journal");
    d3.signal("TERM");
    assert!(d3.wait().success());
}

#[test]
fn a_killed_client_s_connections_get_dreqs() {
    let dir = scratch("client-kill");
    let (_d, sock) = daemon(&dir, "a", "127.0.0.63");
    let mut listener = plain_listener("127.0.0.64");
    let client = stay_client(
        sock.to_str().unwrap(),
        "127.0.0.63",
        "127.0.0.64",
        4,
        &mut listener,
    );
    client.signal("KILL");
    wait_peer_disconnects(&mut listener, 4);
}

#[test]
fn the_socket_has_its_mode_and_never_replaces_a_file() {
    let dir = scratch("mode");
    let (mut d, sock) = daemon(&dir, "a", "127.0.0.65");
    let m = std::fs::metadata(&sock).unwrap();
    assert!(m.file_type().is_socket());
    assert_eq!(m.permissions().mode() & 0o777, 0o660);
    // A second daemon on a served socket is refused.
    let mut second = Proc::spawn(
        "second",
        &ibcmd_bin(),
        &["--addr", "127.0.0.66", "--socket", sock.to_str().unwrap()],
    );
    second.wait_err(|l| l.contains("served by a running daemon"), "'served'");
    assert!(!second.wait().success());
    d.signal("TERM");
    assert!(d.wait().success());

    let file = dir.join("precious");
    std::fs::write(&file, b"data").unwrap();
    let mut p = Proc::spawn(
        "on-a-file",
        &ibcmd_bin(),
        &["--addr", "127.0.0.66", "--socket", file.to_str().unwrap()],
    );
    p.wait_err(|l| l.contains("is not a socket"), "'not a socket'");
    assert!(!p.wait().success());
    assert_eq!(std::fs::read(&file).unwrap(), b"data");
}

#[test]
fn the_socket_takes_the_mode_and_group_given() {
    let dir = scratch("group");
    // Root may give the socket any group; another user its own.
    let root = std::fs::metadata("/proc/self").unwrap().uid() == 0;
    let gid = if root {
        4242
    } else {
        std::fs::metadata(&*dir).unwrap().gid()
    };
    let g = gid.to_string();
    let (mut d, sock) = daemon_with(&dir, "a", "127.0.0.67", &["--mode", "640", "--group", &g]);
    let m = std::fs::metadata(&sock).unwrap();
    assert_eq!(m.permissions().mode() & 0o777, 0o640);
    assert_eq!(m.gid(), gid);
    d.signal("TERM");
    assert!(d.wait().success());
}

#[test]
fn a_restarted_daemon_tells_xrc_initiators_their_target_is_gone() {
    let dir = scratch("restart-xrc");
    let (mut da, sa) = daemon(&dir, "a", "127.0.0.68");
    let (_db, sb) = daemon(&dir, "b", "127.0.0.69");
    let (sa_s, sb_s) = (sa.to_str().unwrap(), sb.to_str().unwrap());
    let mut listener = Proc::spawn(
        "listener",
        &cm_ping_bin(),
        &[
            "--listen",
            "127.0.0.68",
            "--daemon",
            sa_s,
            "--xrc",
            "--policy",
            "explicit",
        ],
    );
    listener.wait_out(|l| l.starts_with("listening"), "'listening'");
    let mut conn = Proc::spawn(
        "connector",
        &cm_ping_bin(),
        &[
            "--connect",
            "127.0.0.68",
            "--bind",
            "127.0.0.69",
            "--daemon",
            sb_s,
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
        listener.wait_out(|l| l.starts_with("established"), &format!("target #{i}"));
    }
    // The daemon holding the TGT QPs dies without a word; its successor tells the initiators.
    da.signal("KILL");
    let _ = da.wait();
    let (mut da2, _) = daemon(&dir, "a", "127.0.0.68");
    let journaled = da2
        .seen_err
        .iter()
        .filter(|l| l.contains("DREQ for a connection of the previous run"))
        .count();
    assert_eq!(journaled, 4, "{:#?}", da2.seen_err);
    // The connector's summary comes when the last connection is ended.
    let rest = conn.rest_of_out();
    let gone = rest
        .iter()
        .filter(|l| l.contains("closed by peer after") && l.contains("target gone (keeper lost)"))
        .count();
    assert_eq!(gone, 4, "{rest:#?}");
    assert_eq!(
        rest.last().map(String::as_str),
        Some("cm-ping: 4 established, 0 rejected, 0 timed out, 0 disconnected, 4 closed by peer")
    );
    da2.signal("TERM");
    assert!(da2.wait().success());
}

#[test]
fn cm_ping_listens_through_the_daemon() {
    let dir = scratch("listen-rc");
    let (_d, sock) = daemon(&dir, "a", "127.0.0.93");
    let mut l = Proc::spawn(
        "listener",
        &cm_ping_bin(),
        &["--listen", "127.0.0.93", "--daemon", sock.to_str().unwrap()],
    );
    l.wait_out(|s| s.starts_with("listening"), "'listening'");
    let mut c = Proc::spawn(
        "connector",
        &cm_ping_bin(),
        &[
            "--connect",
            "127.0.0.93",
            "--bind",
            "127.0.0.94",
            "--count",
            "20",
            "--parallel",
            "4",
            "--quiet",
        ],
    );
    let rest = c.rest_of_out();
    assert!(c.wait().success(), "{rest:?}");
    assert_eq!(
        rest.last().map(String::as_str),
        Some("cm-ping: 20 established, 0 rejected, 0 timed out, 20 disconnected, 0 disconnect timed out")
    );
    for i in 0..20 {
        l.wait_out(
            |s| s.starts_with("disconnected conn="),
            &format!("disconnected #{i}"),
        );
    }
    l.signal("INT");
    let rest = l.rest_of_out();
    // The endpoint's counters are the daemon's: the summary is the last line.
    assert_eq!(
        rest.last().map(String::as_str),
        Some("cm-ping: 20 established, 0 rejected, 0 timed out, 20 disconnected, 0 disconnect timed out"),
        "{rest:?}"
    );
    assert!(l.wait().success());
}

#[test]
fn ibcmd_keeper_runs_the_keeper_commands() {
    let dir = scratch("keeper");
    let sock = dir.join("keeper.sock");
    let s = sock.to_str().unwrap();
    let mut k = Proc::spawn("keeper", &ibcmd_bin(), &["keeper", "serve", "--socket", s]);
    k.wait_out(|l| l.starts_with("ready epoch="), "'ready epoch='");
    let req = r#"{"op":"open-domain","domain":"d"}"#;
    let mut c = Proc::spawn(
        "request",
        &ibcmd_bin(),
        &["keeper", "request", "--socket", s, req],
    );
    assert_eq!(c.rest_of_out(), [r#"{"domain":"d"}"#]);
    assert!(c.wait().success());
}
