//! cm-trace on messy real-world captures (issue 13 §1): each test runs the binary on a capture
//! under `fixtures/captures/derived/` (provenance in `fixtures/MANIFEST.md`) or written here.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::process::{Command, Output};

mod common;
use common::{cap, cm_trace, stdout, BIN};

fn json_lines(o: &Output) -> Vec<serde_json::Value> {
    stdout(o)
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// `mergecap` of two hosts' captures: every CM packet twice, same bytes and BTH PSN. They are
/// duplicate captures, in every view; a real retransmission (new PSN) still is one.
#[test]
fn merged_captures_are_duplicates_not_retransmissions() {
    let merged = cap("derived/merged_both_hosts_write.pcap");
    let m = merged.to_str().unwrap();

    // Per-MAD text: every second copy marked as a duplicate, none as a retransmission.
    let o = cm_trace(&[m]);
    assert!(o.status.success());
    let text = stdout(&o);
    assert!(!text.contains("[retransmission]"), "{text}");
    assert_eq!(text.matches("[duplicate capture]").count(), 5, "{text}");
    assert!(text.contains(" 0 retransmissions"), "{text}");
    assert!(text.contains("5 duplicate captures"), "{text}");

    // Per-MAD JSON.
    let v = json_lines(&cm_trace(&["--json", m]));
    assert_eq!(v.len(), 10);
    assert!(v.iter().all(|o| o["retrans"] == false));
    assert_eq!(v.iter().filter(|o| o["dup"] == true).count(), 5);

    // Ladder (text and JSON).
    let o = cm_trace(&["--ladder", m]);
    let text = stdout(&o);
    assert!(!text.contains("retransmission #"), "{text}");
    let result = text.lines().find(|l| l.contains("result:")).unwrap();
    assert!(!result.contains("retransmission(s)"), "{text}");
    assert!(result.contains("5 duplicate capture(s)"), "{text}");
    let v = json_lines(&cm_trace(&["--ladder", "--json", m]));
    assert_eq!(v.len(), 1);
    assert_eq!(v[0]["retransmissions"], 0);
    assert_eq!(v[0]["duplicates"], 5);
    assert_eq!(v[0]["messages"], 5);

    // Stats (JSON).
    let v = json_lines(&cm_trace(&["--stats", "--json", m]));
    let all = &v[0];
    assert_eq!(all["retransmissions"], 0, "{all}");
    assert_eq!(all["duplicates"], 5, "{all}");
    assert_eq!(all["attempted"], 1);
    assert_eq!(all["established"], 1);

    // A real retransmission (the REQ sent again, new PSN) is still one.
    let r = cap("kernel/req_retransmission_after_drop.pcap");
    let v = json_lines(&cm_trace(&["--json", r.to_str().unwrap()]));
    assert_eq!(v.iter().filter(|o| o["retrans"] == true).count(), 1);
    assert!(v.iter().all(|o| o.get("dup").is_none()));
}

fn stats_json(args: &[&str]) -> serde_json::Value {
    let o = cm_trace(args);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_str(stdout(&o).trim()).unwrap()
}

/// Counts that can never be: more established, rejected, timed out or closed than attempted.
fn assert_possible(v: &serde_json::Value) {
    let n = |k: &str| v[k].as_u64().unwrap();
    let attempted = n("attempted");
    for k in [
        "established",
        "rejected_total",
        "timed_out",
        "waiting",
        "closed",
    ] {
        assert!(n(k) <= attempted, "{k} > attempted: {v}");
    }
    assert!(n("closed") <= n("established"), "{v}");
}

/// A small table (`--max-conns`) finishes connections early but never counts one twice: the
/// later messages of an evicted connection are not a new connection.
#[test]
fn max_conns_eviction_does_not_double_count() {
    let g = cap("derived/gen/gen_200_cm_packets.pcap");
    let g = g.to_str().unwrap();
    let full = stats_json(&["--stats", "--json", g]);
    assert_eq!(full["attempted"], 42, "the generator's 42 connections");
    assert_eq!(full["evicted"], 0);
    assert_possible(&full);
    for n in ["8", "16"] {
        let v = stats_json(&["--stats", "--json", "--max-conns", n, g]);
        assert!(v["evicted"].as_u64().unwrap() > 0, "{v}");
        assert_eq!(v["attempted"], 42, "--max-conns {n}: {v}");
        assert_eq!(v["partial"], 0, "--max-conns {n}: {v}");
        assert_possible(&v);
        // The per-MAD view still numbers every message with its connection.
        let o = cm_trace(&["--json", "--max-conns", n, g]);
        let lines = json_lines(&o);
        assert!(lines.iter().all(|l| l["conn"].as_u64().is_some()));
        let max = lines
            .iter()
            .map(|l| l["conn"].as_u64().unwrap())
            .max()
            .unwrap();
        assert_eq!(max, 42, "--max-conns {n}");
    }
}

/// `--max-conns 0` would track nothing: refused by the command line.
#[test]
fn max_conns_zero_is_refused() {
    let f = cap("derived/cm_eth.pcap");
    let o = cm_trace(&["--max-conns", "0", f.to_str().unwrap()]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("--max-conns"), "{err}");
    assert!(o.stdout.is_empty());
}

/// A REJ whose REQ is not in the capture: a partial connection, not "0 attempted, 1 rejected".
#[test]
fn partial_connection_counts_are_possible() {
    let f = cap("derived/rej8_without_req.pcap");
    let f = f.to_str().unwrap();
    let v = stats_json(&["--stats", "--json", f]);
    assert_eq!(v["attempted"], 0);
    assert_eq!(v["partial"], 1);
    assert_possible(&v);
    let text = stdout(&cm_trace(&[f]));
    assert!(
        text.contains("-- connections: 0 attempted, 0 established, 0 rejected"),
        "{text}"
    );
}

/// An established connection idle for 11 minutes before its DREQ is still one connection.
#[test]
fn idle_established_connection_is_not_split() {
    let f = cap("derived/idle_11min_before_dreq.pcap");
    let f = f.to_str().unwrap();
    let v = json_lines(&cm_trace(&["--ladder", "--json", f]));
    assert_eq!(v.len(), 1, "{v:?}");
    assert_eq!(v[0]["outcome"], "closed", "{}", v[0]);
    assert_eq!(v[0]["messages"], 5);
    let v = stats_json(&["--stats", "--json", f]);
    assert_eq!(v["attempted"], 1);
    assert_eq!(v["established"], 1);
    assert_eq!(v["closed"], 1);
    assert_eq!(v["partial"], 0);
    let lines = json_lines(&cm_trace(&["--json", f]));
    assert!(lines.iter().all(|l| l["conn"] == 1), "{lines:?}");
}

/// `"0x"` + 16 hex digits → the value.
fn hex64(v: &serde_json::Value) -> u64 {
    let s = v.as_str().unwrap_or_else(|| panic!("not a string: {v}"));
    assert_eq!(s.len(), 18, "{s}");
    u64::from_str_radix(s.strip_prefix("0x").unwrap(), 16).unwrap()
}

/// 64-bit values (TID, Service ID, CA GUID) are `"0x…"` strings in JSON schema 3 (as JSON
/// numbers, JavaScript and jq round them to doubles: neighbouring values merge).
#[test]
fn json_64_bit_values_are_hex_strings() {
    let f = cap("derived/merged_both_hosts_write.pcap");
    let f = f.to_str().unwrap();
    let v = json_lines(&cm_trace(&["--json", f]));
    let req = &v[0];
    assert_eq!(req["v"], 3);
    assert_eq!(req["msg"], "REQ");
    assert_eq!(hex64(&req["service_id"]), 0x0000_0000_0106_00ac);
    assert_eq!(hex64(&req["ca_guid"]), 0x08c0_eb03_00da_e2e6);
    assert_eq!(hex64(&v[2]["ca_guid"]), 0x08c0_eb03_00da_e2ca);
    for l in &v {
        assert_eq!(l["v"], 3);
        hex64(&l["tid"]);
    }
    // The two CA GUIDs differ in their low bits; as doubles they would be one value.
    assert_eq!(
        0x08c0_eb03_00da_e2e6_u64 as f64,
        0x08c0_eb03_00da_e2e5_u64 as f64
    );

    let l = json_lines(&cm_trace(&["--ladder", "--json", f]));
    assert_eq!(l[0]["v"], 3);
    assert_eq!(hex64(&l[0]["service_id"]), 0x0106_00ac);
    assert_eq!(hex64(&l[0]["active"]["ca_guid"]), 0x08c0_eb03_00da_e2e6);
    assert_eq!(hex64(&l[0]["passive"]["ca_guid"]), 0x08c0_eb03_00da_e2ca);

    let s = stats_json(&["--stats", "--json", f]);
    assert_eq!(s["v"], 3);
    assert_eq!(hex64(&s["by_service"][0]["service_id"]), 0x0106_00ac);
}

/// `-a GID` on native IB (packets addressed by LID, the GIDs only in the REQ's path): like
/// `-s`, it selects the whole connection in every view.
#[test]
fn addr_gid_matches_the_whole_connection() {
    let f = cap("derived/ib_cm_lid_only.pcap");
    let f = f.to_str().unwrap();
    // Connection 1 (REQ/REP/RTU, frames 1-3) has this GID as its primary remote GID.
    let g = "fe80::2:c902:20:b4dd";
    let v = json_lines(&cm_trace(&["--json", "-a", g, f]));
    let frames: Vec<u64> = v.iter().map(|l| l["frame"].as_u64().unwrap()).collect();
    assert_eq!(frames, [1, 2, 3], "{v:?}");
    let v = json_lines(&cm_trace(&["--ladder", "--json", "-a", g, f]));
    assert_eq!(v.len(), 1, "{v:?}");
    assert_eq!(v[0]["conn"], 1);
    let s = stats_json(&["--stats", "--json", "-a", g, f]);
    assert_eq!(s["attempted"], 1, "{s}");
    assert_eq!(s["established"], 1, "{s}");
    // This one is in connections 2 and 3.
    let g = "fe80::2:c903:0:1895";
    let v = json_lines(&cm_trace(&["--json", "-a", g, f]));
    assert_eq!(v.len(), 6, "{v:?}");
    let v = json_lines(&cm_trace(&["--ladder", "--json", "-a", g, f]));
    assert_eq!(v.len(), 2, "{v:?}");
    let s = stats_json(&["--stats", "--json", "-a", g, f]);
    assert_eq!(s["attempted"], 2, "{s}");
    // A LID still matches by the packets' addresses.
    let s = stats_json(&["--stats", "--json", "-a", "lid:1", f]);
    assert_eq!(s["attempted"], 1, "{s}");
}

/// Runs cm-trace on standard input that stays open (nothing is ever written): it must exit by
/// itself, i.e. fail before reading its input. Returns its output, or `None` if it was still
/// reading after 10 s (then killed).
fn run_before_input(args: &[&str]) -> Option<Output> {
    use std::process::Stdio;
    let mut child = Command::new(BIN)
        .args(args)
        .arg("-")
        .env("NO_COLOR", "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stdin = child.stdin.take();
    let start = std::time::Instant::now();
    while start.elapsed() < std::time::Duration::from_secs(10) {
        if child.try_wait().unwrap().is_some() {
            drop(stdin);
            return Some(child.wait_with_output().unwrap());
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let _ = child.kill();
    drop(stdin);
    let _ = child.wait();
    None
}

/// `--timeline out.png` is refused (only SVG or HTML is written), and a timeline path that
/// cannot be created fails before the input is read, with the path in the message.
#[test]
fn timeline_bad_name_or_path_fails_first() {
    let dir = std::env::temp_dir().join(format!("cm-trace-bugs-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let png = dir.join("out.png");
    let f = cap("derived/cm_eth.pcap");
    let o = cm_trace(&["--timeline", png.to_str().unwrap(), f.to_str().unwrap()]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains(png.to_str().unwrap()), "{err}");
    assert!(!png.exists(), "nothing written into {}", png.display());

    let o = run_before_input(&["--timeline", png.to_str().unwrap()])
        .expect("a .png timeline is refused before reading the input");
    assert!(!o.status.success());

    let bad = "/nonexistent-dir-cm-trace/x.svg";
    let o = run_before_input(&["--timeline", bad])
        .expect("an uncreatable timeline path fails before reading the input");
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains(bad), "{err}");
    assert!(o.stdout.is_empty());

    // A good name still works.
    let svg = dir.join("ok.svg");
    let o = cm_trace(&["--timeline", svg.to_str().unwrap(), f.to_str().unwrap()]);
    assert!(o.status.success());
    assert!(std::fs::read_to_string(&svg).unwrap().starts_with("<svg"));
}

/// A SIDR_REP with status 232 (not 0 = valid) failed, in `--ladder` as in `--stats`.
#[test]
fn sidr_rep_nonzero_status_is_failed_in_every_view() {
    let f = cap("derived/sidr_rep_status232.pcap");
    let f = f.to_str().unwrap();
    let text = stdout(&cm_trace(&["--ladder", f]));
    assert!(text.contains("SIDR failed: status 232"), "{text}");
    assert!(!text.contains("resolved"), "{text}");
    let v = json_lines(&cm_trace(&["--ladder", "--json", f]));
    assert_eq!(v[0]["outcome"], "failed", "{}", v[0]);
    assert_eq!(v[0]["sidr_status"], 232);
    let s = stats_json(&["--stats", "--json", f]);
    assert_eq!(s["sidr"]["failed"], 1, "{s}");
    assert_eq!(s["sidr"]["resolved"], 0, "{s}");
}

/// An XRC REQ line names its transport once ("XRC", not "XRC XRC").
#[test]
fn xrc_req_line_says_xrc_once() {
    let f = cap("derived/xrc_req_only.pcap");
    let text = stdout(&cm_trace(&[f.to_str().unwrap()]));
    let req = text.lines().find(|l| l.contains(" REQ ")).unwrap();
    assert_eq!(req.matches("XRC").count(), 1, "{req}");
}

/// ClassPortInfo in `-V`: one field per line with IBTA names, no Rust debug struct.
#[test]
fn class_port_info_verbose_is_fields() {
    let f = cap("derived/cpi_only.pcap");
    let text = stdout(&cm_trace(&["-V", f.to_str().unwrap()]));
    assert!(!text.contains("ClassPortInfo {"), "{text}");
    assert!(!text.contains("U27("), "{text}");
    assert!(text.contains("CapabilityMask2"), "{text}");
    assert!(text.contains("RespTimeValue"), "{text}");
    assert!(text.contains("TrapQ_Key"), "{text}");
}

/// A nanosecond capture: a 500 ns setup is "500 ns", not "0 µs".
#[test]
fn nanosecond_durations_are_not_rounded() {
    let f = cap("derived/setup_500ns.pcap");
    let f = f.to_str().unwrap();
    let text = stdout(&cm_trace(&["--ladder", f]));
    assert!(text.contains("REQ → RTU 500 ns"), "{text}");
    let v = json_lines(&cm_trace(&["--ladder", "--json", f]));
    assert_eq!(v[0]["setup_ms"], 0.0005, "{}", v[0]);
}

/// Ladder columns stay aligned when a connection lasts more than 10 s.
#[test]
fn ladder_columns_align_past_10_s() {
    let f = cap("derived/dreq_after_12s.pcap");
    let text = stdout(&cm_trace(&["--ladder", f.to_str().unwrap()]));
    let rows: Vec<&str> = text.lines().filter(|l| l.starts_with("    +")).collect();
    assert_eq!(rows.len(), 5, "{text}");
    // Column (in characters) where a pattern starts.
    let col = |l: &str, pat: &str| l.find(pat).map(|b| l[..b].chars().count());
    // Every row's frame number ends where the header's "frame" ends.
    let header = text.lines().find(|l| l.contains("+time")).unwrap();
    let frame_end = col(header, "frame").unwrap() + 5;
    for r in &rows {
        let arrow = col(r, "  ─").or_else(|| col(r, "  ◀")).unwrap();
        assert_eq!(arrow, frame_end, "{text}");
        // The time column ends one space before the frame column (7 wide).
        assert_eq!(col(header, "+time").unwrap() + 5, frame_end - 8, "{text}");
        // The time's last digit is right before that.
        let chars: Vec<char> = r.chars().collect();
        assert!(chars[frame_end - 9].is_ascii_digit(), "{text}");
        assert_eq!(chars[frame_end - 8], ' ', "{text}");
    }
}

/// `-V` shows the ICRC as its wire bytes, like Wireshark (`infiniband.invariant.crc`).
#[test]
fn verbose_icrc_matches_wireshark_byte_order() {
    let f = cap("derived/cpi_only.pcap");
    let text = stdout(&cm_trace(&["-V", f.to_str().unwrap()]));
    // tshark -r derived/cpi_only.pcap -T fields -e infiniband.invariant.crc → 0x3f5b9bb2
    assert!(text.contains("ICRC 0x3f5b9bb2 ok"), "{text}");
}

/// When the timeline leaves connections out (`--timeline-max`, 500 by default), it says so.
#[test]
fn timeline_says_when_connections_are_left_out() {
    let dir = std::env::temp_dir().join(format!("cm-trace-bugs-tl-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let svg = dir.join("t.svg");
    let g = cap("derived/gen/gen_200_cm_packets.pcap");
    let o = cm_trace(&[
        "--stats",
        "--timeline",
        svg.to_str().unwrap(),
        "--timeline-max",
        "5",
        g.to_str().unwrap(),
    ]);
    assert!(o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("37 more connection(s) not drawn"), "{err}");
    assert!(err.contains("--timeline-max"), "{err}");
}

/// A corrupt record header in the middle of a file: the error names the record and its byte
/// offset, the reader skips to the next plausible record header (saying how many bytes) and
/// decodes the rest, and the exit status is non-zero (records were lost). Resynchronisation
/// is tested further in cm_trace_input.rs.
#[test]
fn corrupt_record_header_is_not_silent() {
    let f = cap("derived/damaged/corrupt_record3_header.pcap.corrupt");
    let f = f.to_str().unwrap();
    for view in [&[][..], &["--json"][..], &["--stats"][..]] {
        let mut args = view.to_vec();
        args.push(f);
        let o = cm_trace(&args);
        assert!(!o.status.success(), "{args:?}");
        let all = format!("{}{}", stdout(&o), String::from_utf8_lossy(&o.stderr));
        assert!(all.contains("record 3 at byte 700 is damaged"), "{all}");
        assert!(
            all.contains("skipped 338 bytes to the next plausible record header, at byte 1038"),
            "{all}"
        );
        assert!(all.contains("exit status 1"), "{all}");
    }
    let v = json_lines(&cm_trace(&["--json", f]));
    let frames: Vec<u64> = v.iter().map(|o| o["frame"].as_u64().unwrap()).collect();
    assert_eq!(frames, [1, 2, 4, 5, 6, 7], "all but the damaged record 3");
}
