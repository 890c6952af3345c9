//! What the cm-trace integration tests share: the binary, the bundled captures, running it.
#![allow(dead_code, clippy::unwrap_used)]

use std::io::{BufRead, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output};

/// The cm-trace binary under test.
pub(crate) const BIN: &str = env!("CARGO_BIN_EXE_cm-trace");

/// A capture under `fixtures/captures/`.
pub(crate) fn cap(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures/captures")
        .join(rel)
}

/// Runs cm-trace with `args`, colour off.
pub(crate) fn cm_trace(args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .env("NO_COLOR", "1")
        .output()
        .unwrap()
}

/// Its standard output.
pub(crate) fn stdout(o: &Output) -> String {
    String::from_utf8(o.stdout.clone()).unwrap()
}

/// Its standard error.
pub(crate) fn stderr(o: &Output) -> String {
    String::from_utf8(o.stderr.clone()).unwrap()
}

/// Reads lines from `r` until one satisfies `done`; all lines read (with their newlines).
pub(crate) fn read_until(r: &mut impl BufRead, done: impl Fn(&str) -> bool) -> Vec<String> {
    let mut lines = Vec::new();
    loop {
        let mut l = String::new();
        let n = r.read_line(&mut l).unwrap();
        assert!(
            n > 0,
            "output ended before the expected line; read: {lines:#?}"
        );
        let hit = done(&l);
        lines.push(l);
        if hit {
            return lines;
        }
    }
}

/// Kills a child (by its process ID) unless dropped within two minutes: a cm-trace that
/// never prints the expected line then ends its output, and the test fails instead of
/// hanging.
pub(crate) struct Watchdog(Option<std::sync::mpsc::Sender<()>>);

impl Watchdog {
    pub(crate) fn new(child: &Child) -> Self {
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let pid = child.id().to_string();
        std::thread::spawn(move || {
            if let Err(std::sync::mpsc::RecvTimeoutError::Timeout) =
                rx.recv_timeout(std::time::Duration::from_secs(120))
            {
                let _ = Command::new("kill").args(["-9", &pid]).status();
            }
        });
        Watchdog(Some(tx))
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        if let Some(tx) = self.0.take() {
            let _ = tx.send(());
        }
    }
}

/// Sends SIGINT (Ctrl-C) to a child.
pub(crate) fn sigint(child: &Child) {
    let ok = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap()
        .success();
    assert!(ok, "kill -INT failed");
}

/// Ctrl-C to a child whose standard output is piped and whose standard error is `err`: its
/// exit status, standard output, and the rest of standard error ([`finish`]).
pub(crate) fn interrupt(child: &mut Child, err: &mut impl Read) -> (ExitStatus, String, String) {
    sigint(child);
    finish(child, err)
}

/// Waits for a child whose standard output is piped and whose standard error is `err` to
/// end: its exit status, standard output, and the rest of standard error.
pub(crate) fn finish(child: &mut Child, err: &mut impl Read) -> (ExitStatus, String, String) {
    let mut out = String::new();
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .unwrap();
    let mut rest = String::new();
    err.read_to_string(&mut rest).unwrap();
    let status = child.wait().unwrap();
    (status, out, rest)
}
