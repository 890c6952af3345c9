//! A second Unix user (`nobody`, through `setpriv`) against a daemon run by root, and root
//! against a daemon run by `nobody`. Needs root; as another user each test prints a SKIPPED
//! line and checks nothing.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

mod common;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use common::{cm_ping_bin, daemon_with, ibcmd_bin, scratch, Proc};

const NOBODY: &str = "65534";

fn root() -> bool {
    let r = std::fs::metadata("/proc/self").unwrap().uid() == 0;
    if !r {
        println!("SKIPPED: running a second user needs root");
    }
    r
}

/// `bin args…` as uid/gid 65534.
fn as_nobody(name: &str, bin: &Path, args: &[&str]) -> Proc {
    let mut a = vec![
        "--reuid",
        NOBODY,
        "--regid",
        NOBODY,
        "--clear-groups",
        bin.to_str().unwrap(),
    ];
    a.extend_from_slice(args);
    Proc::spawn(name, Path::new("setpriv"), &a)
}

#[test]
fn another_user_needs_the_socket_s_mode_and_cannot_take_a_service() {
    if !root() {
        return;
    }
    let dir = scratch("users");
    std::fs::set_permissions(&*dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    // Default mode 0660, root's group: nobody cannot attach.
    let (_a, sa) = daemon_with(&dir, "a", "127.0.0.81", &[]);
    let mut p = as_nobody(
        "nobody-a",
        &cm_ping_bin(),
        &["--connect", "127.0.0.82", "--daemon", sa.to_str().unwrap()],
    );
    p.wait_err(|l| l.contains("Permission denied"), "'Permission denied'");
    assert!(!p.wait().success());

    // Mode 0666: nobody attaches, but a service ID root's client listens on is not its.
    let (_b, sb) = daemon_with(&dir, "b", "127.0.0.83", &["--mode", "666"]);
    let sb = sb.to_str().unwrap();
    let mut rl = Proc::spawn(
        "root-listener",
        &cm_ping_bin(),
        &[
            "--listen",
            "127.0.0.83",
            "--daemon",
            sb,
            "--xrc",
            "--policy",
            "process",
            "--service-id",
            "0x1234",
        ],
    );
    rl.wait_out(|l| l.starts_with("listening"), "'listening'");
    let mut nl = as_nobody(
        "nobody-listener",
        &cm_ping_bin(),
        &[
            "--listen",
            "127.0.0.83",
            "--daemon",
            sb,
            "--xrc",
            "--policy",
            "process",
            "--service-id",
            "0x1234",
        ],
    );
    nl.wait_err(
        |l| l.contains("listened on by another client"),
        "'another client'",
    );
    assert!(!nl.wait().success());
    // Its own service ID it may serve.
    let mut own = as_nobody(
        "nobody-own",
        &cm_ping_bin(),
        &[
            "--listen",
            "127.0.0.83",
            "--daemon",
            sb,
            "--xrc",
            "--policy",
            "process",
            "--service-id",
            "0x1235",
        ],
    );
    own.wait_out(|l| l.starts_with("listening"), "'listening'");
}

#[test]
fn a_client_refuses_a_daemon_of_another_user() {
    if !root() {
        return;
    }
    let dir = scratch("users-daemon");
    std::fs::set_permissions(&*dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    let sock = dir.join("n.sock");
    let s = sock.to_str().unwrap();
    let state = dir.join("n.state");
    let mut d = as_nobody(
        "nobody-daemon",
        &ibcmd_bin(),
        &[
            "--addr",
            "127.0.0.84",
            "--socket",
            s,
            "--mode",
            "666",
            "--state",
            state.to_str().unwrap(),
        ],
    );
    d.wait_err(|l| l.contains("ibcmd serving"), "'ibcmd serving'");
    assert_eq!(std::fs::metadata(&sock).unwrap().uid(), 65534);
    let mut c = Proc::spawn(
        "root-client",
        &cm_ping_bin(),
        &["--connect", "127.0.0.85", "--daemon", s],
    );
    c.wait_err(
        |l| l.contains("neither root nor this user"),
        "'neither root nor this user'",
    );
    assert!(!c.wait().success());
}
