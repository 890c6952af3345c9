//! cm-trace on messy real-world input (issue 13 §1.6-§1.10): captures cut by the snaplen,
//! live pipes, corrupt record headers, compressed captures. Each test runs the binary on a
//! capture under `fixtures/captures/derived/` (provenance in `fixtures/MANIFEST.md`) or built
//! here from one.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::path::Path;
use std::process::{Command, Output};

mod common;
use common::{cap, cm_trace, stderr, stdout, BIN};

fn json_lines(o: &Output) -> Vec<serde_json::Value> {
    stdout(o)
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// `editcap -s 256` / `-s 128` of a real capture: the five CM messages are decoded as far as
/// captured (the identifying fields are there), marked truncated, without an ICRC verdict;
/// the cut RC data frames are a count in the summary, not a line each; the connection is
/// tracked to the same end as in the whole capture.
#[test]
fn snaplen_cut_frames_decode_as_far_as_captured() {
    for (file, captured) in [
        ("derived/nvme_discover_snap256.pcap", 194),
        ("derived/nvme_discover_snap128.pcap", 66),
    ] {
        let f = cap(file);
        let f = f.to_str().unwrap();
        let o = cm_trace(&[f]);
        assert!(o.status.success(), "{file}: {}", stderr(&o));
        let text = stdout(&o);
        assert!(!text.contains("malformed:"), "{file}: {text}");
        let cm: Vec<&str> = text.lines().filter(|l| !l.starts_with("--")).collect();
        assert_eq!(cm.len(), 5, "{file}: one line per CM message only: {text}");
        let mark = format!("[truncated: {captured} of 256 MAD bytes]");
        for (line, msg) in cm.iter().zip(["REQ", "REP", "RTU", "DREQ", "DREP"]) {
            assert!(line.contains(&format!(" {msg} ")), "{line}");
            assert!(line.contains(&mark), "{line}");
            assert!(line.contains("icrc=not-captured"), "{line}");
            assert!(line.contains("conn=1"), "{line}");
        }
        // The identifying REQ fields.
        assert!(cm[0].contains("lcid=0x3eb0bde5"), "{}", cm[0]);
        assert!(cm[0].contains("sid=0x0000000001061144"), "{}", cm[0]);
        assert!(cm[0].contains("qpn=0x0000dc"), "{}", cm[0]);
        // The starting PSN ends at MAD byte 71, the transport fields at 75: shown when
        // captured, `?` (never a made-up 0) when not.
        if captured >= 76 {
            assert!(cm[0].contains("psn=0x017c2d RC "), "{}", cm[0]);
        } else {
            assert!(cm[0].contains("psn=? ["), "{}", cm[0]);
        }
        assert!(
            text.contains("0 malformed, 12 cut by the snaplen (5 CM decoded"),
            "{file}: {text}"
        );

        let v = json_lines(&cm_trace(&["--json", f]));
        assert_eq!(v.len(), 5);
        assert!(v.iter().all(|o| o["captured"] == captured));
        assert!(v.iter().all(|o| o["icrc"] == "not-captured"));
        assert_eq!(v[0]["ca_guid"], "0x248a0703002fdf02");
        // Fields beyond the cut are left out, not made up from zeros: the REQ's starting PSN
        // (byte 71), its rdma_cm header in the private data (bytes 164-199).
        assert_eq!(v[0].get("psn").is_some(), captured >= 71, "{}", v[0]);
        assert!(v[0].get("cma_dst").is_none(), "{}", v[0]);

        let s: serde_json::Value =
            serde_json::from_str(stdout(&cm_trace(&["--stats", "--json", f])).trim()).unwrap();
        assert_eq!(s["cut"], 12, "{s}");
        assert_eq!(s["cm_cut"], 5, "{s}");
        assert_eq!(s["malformed"], 0, "{s}");
        assert_eq!(s["attempted"], 1, "{s}");
        assert_eq!(s["established"], 1, "{s}");
        assert_eq!(s["timed_out"], 0, "{s}");

        let l = stdout(&cm_trace(&["--ladder", f]));
        assert!(l.contains("result: established, then closed"), "{l}");

        let verbose = stdout(&cm_trace(&["-V", f]));
        assert!(
            verbose.contains(&format!(
                "the snaplen kept {captured} of the MAD's 256 bytes"
            )),
            "{verbose}"
        );
    }
}

/// The classic pcap file header and the records of a capture, as separate byte strings.
fn pcap_records(file: &Path) -> (Vec<u8>, Vec<Vec<u8>>) {
    let bytes = std::fs::read(file).unwrap();
    let (header, mut rest) = bytes.split_at(24);
    assert_eq!(
        &header[..4],
        &[0xd4, 0xc3, 0xb2, 0xa1],
        "little-endian µs pcap"
    );
    let mut recs = Vec::new();
    while !rest.is_empty() {
        let incl = u32::from_le_bytes(rest[8..12].try_into().unwrap()) as usize;
        let (rec, tail) = rest.split_at(16 + incl);
        recs.push(rec.to_vec());
        rest = tail;
    }
    (header.to_vec(), recs)
}

/// Kills `pid` (a cm-trace this test started) unless `done` is signalled first, so that a
/// cm-trace that holds its output back makes the test fail instead of hang.
fn watchdog(pid: u32) -> std::sync::mpsc::Sender<()> {
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    std::thread::spawn(move || {
        if rx
            .recv_timeout(std::time::Duration::from_secs(120))
            .is_err()
        {
            let _ = Command::new("kill").arg(pid.to_string()).status();
        }
    });
    tx
}

/// `tcpdump -U -w - | cm-trace -`: with standard input a pipe, each CM message's line is
/// written while the writer is still sending (here: after the first record, with the pipe held
/// open), in the text and the JSON view.
#[test]
fn pipe_input_is_a_live_view() {
    use std::io::{BufRead, BufReader, Write};
    use std::process::Stdio;
    let (header, recs) = pcap_records(&cap("kernel/establish_dreq_active.pcap"));
    assert_eq!(recs.len(), 5);
    for (view, first) in [(None, " REQ "), (Some("--json"), "\"msg\":\"REQ\"")] {
        let mut args = vec!["-"];
        args.extend(view);
        let mut child = Command::new(BIN)
            .args(&args)
            .env("NO_COLOR", "1")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let done = watchdog(child.id());
        let mut stdin = child.stdin.take().unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap());
        stdin.write_all(&header).unwrap();
        stdin.write_all(&recs[0]).unwrap();
        stdin.flush().unwrap();
        // The writer is still open: the REQ's line must come now.
        let mut line = String::new();
        lines.read_line(&mut line).unwrap();
        assert!(line.contains(first), "{view:?}: first line {line:?}");
        // Then the next record, and its line, one at a time.
        stdin.write_all(&recs[1]).unwrap();
        stdin.flush().unwrap();
        line.clear();
        lines.read_line(&mut line).unwrap();
        assert!(line.contains("REP"), "{view:?}: second line {line:?}");
        for r in &recs[2..] {
            stdin.write_all(r).unwrap();
        }
        drop(stdin);
        let mut rest = String::new();
        std::io::Read::read_to_string(&mut lines, &mut rest).unwrap();
        let status = child.wait().unwrap();
        let _ = done.send(());
        assert!(status.success(), "{view:?}");
        assert_eq!(
            rest.lines().filter(|l| !l.starts_with("--")).count(),
            3,
            "{view:?}: {rest}"
        );
    }
}

/// `-l` flushes after every packet on any input; the output is the same as without it.
#[test]
fn line_buffered_flag_keeps_the_output() {
    let f = cap("kernel/mra_slow_accept.pcap");
    let f = f.to_str().unwrap();
    for view in [&[][..], &["--json"][..], &["--ladder"][..]] {
        let mut a = view.to_vec();
        a.push(f);
        let plain = cm_trace(&a);
        a.insert(0, "-l");
        let live = cm_trace(&a);
        assert!(live.status.success());
        assert_eq!(stdout(&live), stdout(&plain), "{view:?}");
        assert_eq!(stderr(&live), stderr(&plain), "{view:?}");
    }
}

/// The same damage in a pcapng file (editcap's pcapng of the same capture, the third Enhanced
/// Packet Block's length corrupted): skipped to the next block, the rest decoded, exit 1; the
/// statistics count the skipped bytes.
#[test]
fn corrupt_pcapng_block_is_skipped() {
    let f = cap("derived/damaged/corrupt_block3_length.pcapng.corrupt");
    let f = f.to_str().unwrap();
    let o = cm_trace(&[f]);
    assert_eq!(o.status.code(), Some(1));
    let text = stdout(&o);
    assert!(
        text.contains(
            "!! malformed: record 3 at byte 840 is damaged (block length fields differ: 256 at \
             the start, 0 at the end): skipped 356 bytes to the next plausible record header, \
             at byte 1196"
        ),
        "{text}"
    );
    assert!(
        text.contains("356 bytes skipped over damaged record headers"),
        "{text}"
    );
    assert!(stderr(&o).contains("exit status 1"), "{}", stderr(&o));
    let v = json_lines(&cm_trace(&["--json", f]));
    let frames: Vec<u64> = v.iter().map(|o| o["frame"].as_u64().unwrap()).collect();
    assert_eq!(frames, [1, 2, 4, 5, 6, 7]);
    let s: serde_json::Value =
        serde_json::from_str(stdout(&cm_trace(&["--stats", "--json", f])).trim()).unwrap();
    assert_eq!(s["skipped_bytes"], 356);
    assert_eq!(s["established"], 1);
    let l = stdout(&cm_trace(&["--ladder", f]));
    assert!(l.contains("result: established, then closed"), "{l}");
}

/// A record length that is possible but wrong (it runs past the end of the file) in the
/// middle of a pcap: a plausible record header follows, so it is damage,
/// skipped like any other; a last record cut short is still just a truncated last record.
#[test]
fn wrong_length_running_past_the_end_is_skipped() {
    let src = std::fs::read(cap("kernel/mra_slow_accept.pcap")).unwrap();
    let dir = std::env::temp_dir().join(format!("cm-trace-input-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // Record 3's incl_len (at byte 24 + 2 * 338 + 8) set to 100000.
    let mut bad = src.clone();
    bad[708..712].copy_from_slice(&100_000u32.to_le_bytes());
    let f = dir.join("len100000.pcap");
    std::fs::write(&f, &bad).unwrap();
    let o = cm_trace(&["--json", f.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("record 3 at byte 700 is damaged (it runs past the end of the file"),
        "{}",
        stderr(&o)
    );
    assert_eq!(json_lines(&o).len(), 6);
    // Cut inside the last record: truncated, exit 0, nothing skipped.
    let cut = dir.join("cut.pcap");
    std::fs::write(&cut, &src[..src.len() - 100]).unwrap();
    let o = cm_trace(&[cut.to_str().unwrap()]);
    assert!(o.status.success());
    assert!(
        stdout(&o).contains("record 7 at byte 2052 is truncated"),
        "{}",
        stdout(&o)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// gzip-compressed captures (`.pcap.gz`, `.pcapng.gz`) are read as tshark reads them, from a
/// file or a pipe: the same output as the plain capture.
#[test]
fn gzip_captures_are_read() {
    use std::io::Write;
    use std::process::Stdio;
    for (gz, plain) in [
        (
            "derived/gz/mra_slow_accept.pcap.gz",
            "kernel/mra_slow_accept.pcap",
        ),
        ("derived/gz/rping_3.pcapng.gz", "kernel/rping_3.pcap"),
    ] {
        let (gz, plain) = (cap(gz), cap(plain));
        for view in [&[][..], &["--json"][..], &["--stats", "--json"][..]] {
            let mut a = view.to_vec();
            a.push(plain.to_str().unwrap());
            let want = cm_trace(&a);
            *a.last_mut().unwrap() = gz.to_str().unwrap();
            let got = cm_trace(&a);
            assert!(got.status.success(), "{gz:?}: {}", stderr(&got));
            assert_eq!(stdout(&got), stdout(&want), "{gz:?} {view:?}");
        }
        // From standard input.
        let mut child = Command::new(BIN)
            .args(["--json", "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(&std::fs::read(&gz).unwrap())
            .unwrap();
        let o = child.wait_with_output().unwrap();
        assert!(o.status.success());
        assert_eq!(
            stdout(&o),
            stdout(&cm_trace(&["--json", plain.to_str().unwrap()]))
        );
    }
    // A gzip stream cut short: the records before the cut, then a non-zero exit that says so.
    let bytes = std::fs::read(cap("derived/gz/rping_3.pcapng.gz")).unwrap();
    let dir = std::env::temp_dir().join(format!("cm-trace-gz-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cut = dir.join("cut.pcapng.gz");
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
    let o = cm_trace(&[cut.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("the rest of the input could not be read"),
        "{}",
        stderr(&o)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A connection whose teardown comes three days after its setup: the timeline's axis ticks
/// are in days and hours (not 20000 s steps), and its footer gives the start in UTC.
#[test]
fn timeline_axis_over_days() {
    let dir = std::env::temp_dir().join(format!("cm-trace-days-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let svg = dir.join("t.svg");
    let o = cm_trace(&[
        "--timeline",
        svg.to_str().unwrap(),
        cap("derived/long/dreq_after_3_days.pcap").to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let doc = std::fs::read_to_string(&svg).unwrap();
    let ticks: Vec<&str> = doc
        .split("text-anchor=\"middle\" fill=\"#555\">")
        .skip(1)
        .filter_map(|s| s.split('<').next())
        .collect();
    assert_eq!(
        ticks,
        ["0 min", "12 h", "1 d", "1 d 12 h", "2 d", "2 d 12 h", "3 d"],
        "{doc}"
    );
    assert!(doc.contains("2026-11-29 16:10:54 UTC"), "{doc}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `--help` starts with what cm-trace does (not the description of a whole crate).
#[test]
fn help_opens_with_cm_trace_description() {
    let o = cm_trace(&["--help"]);
    assert!(o.status.success());
    assert!(
        stdout(&o).starts_with(
            "Decode InfiniBand CM (MAD class 0x07) messages from capture files and show \
             connections"
        ),
        "{}",
        stdout(&o)
    );
}
