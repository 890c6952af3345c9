//! Real processes for the node-service tests: `ibcmd` daemons and `cm-ping` clients, their
//! output read line by line as it comes, waited on by content (never by time).

#![allow(dead_code)]
// Test support: a failure is a panic with the processes' output.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// How long a condition may take before the test fails (a deadline, not a synchronisation).
pub(crate) const DEADLINE: Duration = Duration::from_secs(30);

pub(crate) fn ibcmd_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_ibcmd"))
}

/// cm-ping, built next to ibcmd (`cargo build -p ibcm-tools`; a workspace test run builds it).
pub(crate) fn cm_ping_bin() -> PathBuf {
    let p = ibcmd_bin().with_file_name("cm-ping");
    assert!(
        p.exists(),
        "{} is missing: build it first (cargo build -p ibcm-tools --bin cm-ping)",
        p.display()
    );
    p
}

/// A scratch directory of this test, removed when dropped.
pub(crate) struct Scratch(PathBuf);

impl std::ops::Deref for Scratch {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A scratch directory of this test.
pub(crate) fn scratch(name: &str) -> Scratch {
    let d = std::env::temp_dir().join(format!("ibcmd-test-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    Scratch(d)
}

/// A child process with its output as lines.
pub(crate) struct Proc {
    pub(crate) name: String,
    pub(crate) child: Child,
    out: mpsc::Receiver<String>,
    err: mpsc::Receiver<String>,
    /// Every line seen so far (stdout, stderr).
    pub(crate) seen_out: Vec<String>,
    pub(crate) seen_err: Vec<String>,
}

fn pump(r: impl std::io::Read + Send + 'static) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for l in BufReader::new(r).lines() {
            let Ok(l) = l else { return };
            if tx.send(l).is_err() {
                return;
            }
        }
    });
    rx
}

impl Proc {
    pub(crate) fn spawn(name: &str, bin: &Path, args: &[&str]) -> Proc {
        Self::spawn_in(name, bin, args, Stdio::null())
    }

    /// [`Proc::spawn`] with its standard input a pipe ([`Proc::send`]).
    pub(crate) fn spawn_piped(name: &str, bin: &Path, args: &[&str]) -> Proc {
        Self::spawn_in(name, bin, args, Stdio::piped())
    }

    /// Writes `line` and a newline to its standard input.
    pub(crate) fn send(&mut self, line: &str) {
        use std::io::Write;
        let stdin = self.child.stdin.as_mut().expect("spawned with spawn_piped");
        writeln!(stdin, "{line}").unwrap();
        stdin.flush().unwrap();
    }

    /// Closes its standard input.
    pub(crate) fn close_stdin(&mut self) {
        drop(self.child.stdin.take());
    }

    fn spawn_in(name: &str, bin: &Path, args: &[&str], stdin: Stdio) -> Proc {
        let mut child = Command::new(bin)
            .args(args)
            .env("IBCMD_LOG", "info")
            .stdin(stdin)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {name}: {e}"));
        let out = pump(child.stdout.take().unwrap());
        let err = pump(child.stderr.take().unwrap());
        Proc {
            name: name.into(),
            child,
            out,
            err,
            seen_out: Vec::new(),
            seen_err: Vec::new(),
        }
    }

    fn wait_in(&mut self, stderr: bool, pred: impl Fn(&str) -> bool, what: &str) -> String {
        let end = Instant::now() + DEADLINE;
        loop {
            let left = end.saturating_duration_since(Instant::now());
            let (rx, seen) = if stderr {
                (&self.err, &mut self.seen_err)
            } else {
                (&self.out, &mut self.seen_out)
            };
            match rx.recv_timeout(left) {
                Ok(l) => {
                    seen.push(l.clone());
                    if pred(&l) {
                        return l;
                    }
                }
                Err(e) => panic!(
                    "{}: no line {what} ({e:?}); stdout so far:\n{}\nstderr so far:\n{}",
                    self.name,
                    self.seen_out.join("\n"),
                    self.seen_err.join("\n")
                ),
            }
        }
    }

    /// Waits for a stdout line for which `pred` holds.
    pub(crate) fn wait_out(&mut self, pred: impl Fn(&str) -> bool, what: &str) -> String {
        self.wait_in(false, pred, what)
    }

    /// Waits for a stderr line for which `pred` holds.
    pub(crate) fn wait_err(&mut self, pred: impl Fn(&str) -> bool, what: &str) -> String {
        self.wait_in(true, pred, what)
    }

    /// Every remaining stdout line, until the process closes it.
    pub(crate) fn rest_of_out(&mut self) -> Vec<String> {
        let end = Instant::now() + DEADLINE;
        let mut v = Vec::new();
        loop {
            let left = end.saturating_duration_since(Instant::now());
            match self.out.recv_timeout(left) {
                Ok(l) => {
                    self.seen_out.push(l.clone());
                    v.push(l);
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => return v,
                Err(mpsc::RecvTimeoutError::Timeout) => panic!(
                    "{}: output did not end; so far:\n{}",
                    self.name,
                    self.seen_out.join("\n")
                ),
            }
        }
    }

    /// Reads the stderr lines that came so far without keeping them; how many.
    pub(crate) fn count_err(&mut self) -> usize {
        let mut n = 0;
        while self.err.try_recv().is_ok() {
            n += 1;
        }
        n
    }

    /// Sends `sig` (`KILL`, `INT`, `TERM`) with kill(1).
    pub(crate) fn signal(&self, sig: &str) {
        let st = Command::new("kill")
            .args(["-s", sig, &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(st.success(), "kill -s {sig} {}", self.name);
    }

    pub(crate) fn wait(&mut self) -> ExitStatus {
        self.child.wait().unwrap()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Starts `ibcmd --addr ip --socket dir/name.sock` and waits until it serves.
pub(crate) fn daemon(dir: &Path, name: &str, ip: &str) -> (Proc, PathBuf) {
    daemon_with(dir, name, ip, &[])
}

/// [`daemon`] with more options. Its state directory is `dir/name.state` unless `extra`
/// gives `--state` (never the default `/run/ibcmd`, which is the node's).
pub(crate) fn daemon_with(dir: &Path, name: &str, ip: &str, extra: &[&str]) -> (Proc, PathBuf) {
    let sock = dir.join(format!("{name}.sock"));
    let s = sock.to_str().unwrap().to_string();
    let state = dir.join(format!("{name}.state"));
    let st = state.to_str().unwrap().to_string();
    let mut args = vec!["--addr", ip, "--socket", &s];
    if !extra.contains(&"--state") {
        args.extend_from_slice(&["--state", &st]);
    }
    args.extend_from_slice(extra);
    let mut p = Proc::spawn(name, &ibcmd_bin(), &args);
    p.wait_err(|l| l.contains("ibcmd serving"), "'ibcmd serving'");
    (p, sock)
}
