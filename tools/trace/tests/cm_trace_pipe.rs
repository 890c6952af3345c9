//! A pipe as the input (`tcpdump -U -w - | cm-trace -`), its writer kept open: `--stats`
//! shows the statistics so far on standard error as packets arrive (`--refresh`), and Ctrl-C
//! (SIGINT) ends the read with the normal final summary and exit status 0. The test is the
//! writer; it learns cm-trace's state from its output lines, never from waiting.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::io::{BufReader, Read, Write};
use std::process::{Child, ChildStderr, ChildStdin, Command, Stdio};

mod common;
use common::{cap, interrupt, read_until, sigint, Watchdog, BIN};

/// The pcap file header and its records (header + data each), in order.
fn split_pcap(bytes: &[u8]) -> (Vec<u8>, Vec<Vec<u8>>) {
    let mut off = 24;
    let mut recs = Vec::new();
    while off < bytes.len() {
        let cap = u32::from_le_bytes(bytes[off + 8..off + 12].try_into().unwrap()) as usize;
        recs.push(bytes[off..off + 16 + cap].to_vec());
        off += 16 + cap;
    }
    (bytes[..24].to_vec(), recs)
}

fn spawn(args: &[&str]) -> (Child, ChildStdin) {
    let mut child = Command::new(BIN)
        .args(args)
        .env("NO_COLOR", "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stdin = child.stdin.take().unwrap();
    (child, stdin)
}

/// Per-MAD lines while the writer stays open; SIGINT: the summary of the 5 frames, exit 0.
#[test]
fn sigint_ends_a_pipe_read_with_the_summary() {
    let bytes = std::fs::read(cap("kernel/establish_dreq_active.pcap")).unwrap();
    let (mut child, mut stdin) = spawn(&["-"]);
    stdin.write_all(&bytes).unwrap();
    stdin.flush().unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    // The five MAD lines (flushed one by one: the input is a pipe).
    let lines = read_until(&mut out, |l| l.contains(" DREP "));
    assert_eq!(lines.len(), 5, "{lines:#?}");
    sigint(&child);
    let mut rest = String::new();
    out.read_to_string(&mut rest).unwrap();
    let status = child.wait().unwrap();
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert!(status.success(), "{status:?}; stderr: {err}");
    assert!(
        rest.contains("-- 5 frames: 5 CM, 0 non-CM, 0 malformed"),
        "{rest}"
    );
    assert!(
        rest.contains("-- connections: 1 attempted, 1 established"),
        "{rest}"
    );
    assert!(
        err.contains("cm-trace: -: interrupted: the input ends here"),
        "{err}"
    );
    drop(stdin);
}

/// `cm-trace --stats --refresh SECS -` reading a pipe this test writes a capture into (kept
/// open), its standard error read line by line, under a [`Watchdog`].
struct StatsPipe {
    child: Child,
    stdin: ChildStdin,
    err: BufReader<ChildStderr>,
    watchdog: Watchdog,
}

impl StatsPipe {
    /// Starts cm-trace; also returns the pcap file header and the 5 records of
    /// `kernel/establish_dreq_active.pcap` (REQ, REP, RTU, DREQ, DREP) to write.
    fn start(refresh: &str) -> (Self, Vec<u8>, Vec<Vec<u8>>) {
        let bytes = std::fs::read(cap("kernel/establish_dreq_active.pcap")).unwrap();
        let (head, recs) = split_pcap(&bytes);
        assert_eq!(recs.len(), 5);
        let (mut child, stdin) = spawn(&["--stats", "--refresh", refresh, "-"]);
        let watchdog = Watchdog::new(&child);
        let err = BufReader::new(child.stderr.take().unwrap());
        let s = StatsPipe {
            child,
            stdin,
            err,
            watchdog,
        };
        (s, head, recs)
    }

    /// Writes `chunks` (one write each) and flushes.
    fn write<'a>(&mut self, chunks: impl IntoIterator<Item = &'a [u8]>) {
        for c in chunks {
            self.stdin.write_all(c).unwrap();
        }
        self.stdin.flush().unwrap();
    }

    /// Standard error's lines up to the first that satisfies `done`.
    fn err_until(&mut self, done: impl Fn(&str) -> bool) -> Vec<String> {
        read_until(&mut self.err, done)
    }

    /// Ctrl-C, with the writer still open: the exit status, standard output, and the rest of
    /// standard error.
    fn interrupt(mut self) -> (std::process::ExitStatus, String, String) {
        let r = interrupt(&mut self.child, &mut self.err);
        drop(self.watchdog);
        drop(self.stdin);
        r
    }
}

/// `--stats --refresh 0`: the statistics so far after every packet on standard error (the
/// open connection counted as it stands); then SIGINT: the final report on standard output.
#[test]
fn stats_refresh_on_a_pipe_then_sigint() {
    let (mut s, head, recs) = StatsPipe::start("0");
    // REQ, REP, RTU: established so far.
    s.write(std::iter::once(&head[..]).chain(recs[..3].iter().map(Vec::as_slice)));
    let first = s.err_until(|l| l.contains("CM messages: REQ 1 REP 1 RTU 1"));
    assert!(
        first
            .iter()
            .any(|l| l.starts_with("cm-trace: -: statistics so far (1 frames")),
        "{first:#?}"
    );
    let block = s.err_until(|l| l.trim_start().starts_with("established"));
    assert!(
        block.last().unwrap().trim_end().ends_with(" 1"),
        "{block:#?}"
    );
    // DREQ, DREP.
    s.write(recs[3..].iter().map(Vec::as_slice));
    s.err_until(|l| l.contains("CM messages: REQ 1 REP 1 RTU 1 DREQ 1 DREP 1"));
    let (status, out, rest) = s.interrupt();
    assert!(status.success(), "{status:?}; stderr: {rest}");
    assert!(out.starts_with("Capture\n"), "{out}");
    assert!(out.contains("1 file(s), 5 frames: 5 CM MADs"), "{out}");
    assert!(out.contains("  established             1"), "{out}");
    assert!(rest.contains("interrupted"), "{rest}");
}

/// `--stats --refresh 0.2` on a pipe that stays open with no more data: the statistics so far
/// keep coming on the timer. The three packets arrive in one write, so the refresh at the
/// first packet shows 1 frame; only refreshes without any packet arriving show all 3, and
/// two of them are waited for (a refresh made only when a packet arrives shows 3 frames
/// at most once).
#[test]
fn stats_refresh_on_a_timer_while_the_pipe_is_idle() {
    let (mut s, head, recs) = StatsPipe::start("0.2");
    let mut first = head.clone();
    for r in &recs[..3] {
        first.extend_from_slice(r);
    }
    s.write([&first[..]]);
    let header = "cm-trace: -: statistics so far (3 frames";
    for _ in 0..2 {
        let lines = s.err_until(|l| l.starts_with(header));
        // The whole report follows each header, with the open connection as it stands.
        let block = s.err_until(|l| l.trim_start().starts_with("established"));
        assert!(
            block.last().unwrap().trim_end().ends_with(" 1"),
            "{lines:#?} {block:#?}"
        );
        assert!(
            block
                .iter()
                .any(|l| l.contains("CM messages: REQ 1 REP 1 RTU 1")),
            "{block:#?}"
        );
    }
    // Nothing was written meanwhile; the last two packets end the connection.
    s.write(recs[3..].iter().map(Vec::as_slice));
    s.err_until(|l| l.starts_with("cm-trace: -: statistics so far (5 frames"));
    let (status, out, _) = s.interrupt();
    assert!(status.success(), "{status:?}");
    assert!(out.contains("1 file(s), 5 frames: 5 CM MADs"), "{out}");
}
