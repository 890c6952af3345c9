//! The data path (issue 13 §2): each connection's RC traffic on the QPNs its CM exchange
//! announced, in `--ladder`, `--ladder --json` and `--stats --json`; and a parity test against
//! tshark's per-packet BTH / AETH fields on the bundled RoCE captures (skipped, loudly, without
//! tshark).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

mod common;
use common::{cap, cm_trace, stdout};

fn conns(file: &Path) -> Vec<serde_json::Value> {
    let o = cm_trace(&["--ladder", "--json", file.to_str().unwrap()]);
    assert!(o.status.success());
    stdout(&o)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// A WRITE NAKed (PSN sequence error) and resent: established but broken, in every view; an
/// established connection with no packet beside other RC traffic: no data; a capture of the
/// CM alone: no verdict.
#[test]
fn data_path_counts_and_verdicts() {
    let broken = cap("derived/data/write_nak_resend.pcap");
    let c = conns(&broken);
    assert_eq!(c.len(), 1);
    let d = &c[0]["data"];
    assert_eq!(d["packets"], 13, "{d}");
    assert_eq!(d["bytes"], 4122, "{d}");
    assert_eq!(d["send"], 4, "{d}");
    assert_eq!(d["write"], 3, "{d}");
    assert_eq!(d["ack"], 6, "{d}");
    assert_eq!(d["acks"], 5, "{d}");
    assert_eq!(d["naks"], 1, "{d}");
    assert_eq!(d["psn_sequence_error"], 1, "{d}");
    assert_eq!(d["retransmissions"], 1, "{d}");
    assert_eq!(d["psn_gaps"], 0, "{d}");
    assert_eq!(d["verdict"], "broken", "{d}");
    let l = stdout(&cm_trace(&["--ladder", broken.to_str().unwrap()]));
    assert!(
        l.contains("1 NAK(s) (PSN sequence error 1), 1 retransmission(s)"),
        "{l}"
    );
    assert!(l.contains("  verdict: established but broken"), "{l}");

    let none = cap("derived/data/no_data_beside_rc_traffic.pcap");
    let c = conns(&none);
    assert_eq!(c.len(), 1);
    assert_eq!(c[0]["data"]["packets"], 0);
    assert_eq!(c[0]["data"]["verdict"], "no_data");

    let cm_only = cap("kernel/mra_slow_accept.pcap");
    let c = conns(&cm_only);
    assert!(c[0]["data"]["verdict"].is_null(), "{}", c[0]);
    let l = stdout(&cm_trace(&["--ladder", cm_only.to_str().unwrap()]));
    assert!(!l.contains("verdict:"), "{l}");

    // Merged captures of both hosts: every data packet twice, counted once.
    let merged = conns(&cap("derived/merged_both_hosts_write.pcap"));
    let d = &merged[0]["data"];
    assert_eq!(d["packets"], 12, "{d}");
    assert_eq!(d["duplicates"], 12, "{d}");
    assert_eq!(d["retransmissions"], 0, "{d}");
    assert_eq!(d["verdict"], "ok", "{d}");

    let s: serde_json::Value = serde_json::from_str(
        stdout(&cm_trace(&[
            "--stats",
            "--json",
            broken.to_str().unwrap(),
            none.to_str().unwrap(),
            cm_only.to_str().unwrap(),
        ]))
        .trim(),
    )
    .unwrap();
    let d = &s["data"];
    assert_eq!(d["packets"], 13, "{d}");
    assert_eq!(d["broken"], 1, "{d}");
    assert_eq!(d["no_data"], 1, "{d}");
    assert_eq!(d["ok"], 0, "{d}");
    assert_eq!(d["naks"], 1, "{d}");
    assert_eq!(d["retransmissions"], 1, "{d}");
    let text = stdout(&cm_trace(&["--stats", broken.to_str().unwrap()]));
    assert!(text.contains("1 established but broken"), "{text}");
}

fn tshark_available() -> bool {
    match Command::new("tshark").arg("--version").output() {
        Ok(o) if o.status.success() => true,
        _ => {
            let _ = std::io::Write::write_fmt(
                &mut std::io::stderr(),
                format_args!(
                    "\n!!! SKIPPED: `tshark` not found: the data-path parity test needs it \
                     (DEBIAN_FRONTEND=noninteractive apt-get install -y tshark). !!!\n"
                ),
            );
            false
        }
    }
}

/// One packet as tshark shows it.
#[derive(Debug, Clone)]
struct Row {
    time_ns: u128,
    len: u64,
    dst: String,
    opcode: u8,
    dest_qp: u32,
    psn: u32,
    syndrome: Option<u8>,
}

fn tshark_rows(file: &Path) -> Vec<Row> {
    let out = Command::new("tshark")
        .arg("-r")
        .arg(file)
        .args(["-T", "fields", "-E", "separator=|", "-E", "occurrence=f"])
        .args(["-e", "frame.time_epoch", "-e", "frame.len", "-e", "ip.dst"])
        .args(["-e", "infiniband.bth.opcode", "-e", "infiniband.bth.destqp"])
        .args(["-e", "infiniband.bth.psn", "-e", "infiniband.aeth.syndrome"])
        .output()
        .unwrap();
    assert!(out.status.success(), "tshark failed on {file:?}");
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split('|').collect();
            let opcode: u8 = f[3].parse().ok()?;
            let (secs, frac) = f[0].split_once('.').unwrap();
            let frac = format!("{frac:0<9}");
            Some(Row {
                time_ns: secs.parse::<u128>().unwrap() * 1_000_000_000
                    + frac[..9].parse::<u128>().unwrap(),
                len: f[1].parse().unwrap(),
                dst: f[2].to_string(),
                opcode,
                dest_qp: u32::from_str_radix(f[4].trim_start_matches("0x"), 16).unwrap(),
                psn: f[5].parse().unwrap(),
                syndrome: f[6].parse().ok(),
            })
        })
        .collect()
}

/// A packet remembered for duplicate detection: opcode, PSN, length, syndrome, time (ns).
type Seen = (u8, u32, u64, Option<u8>, u128);

/// The data-path counters from tshark's rows, by the rules of the crate docs (`conn/data.rs`):
/// RC (0x00-0x1f), XRC (0xa0-0xbf) and CNP (0x81) packets to one end's address and QPN; a
/// packet identical to one of the last 4 in its direction within 1 ms (no NAK since) is a
/// duplicate; AETH syndrome bits 6:5 say ACK / RNR NAK / NAK; request PSNs at or before the
/// highest are retransmissions, more than one past it (after a non-READ) gaps.
fn expected(rows: &[Row], ends: [(String, u32); 2]) -> BTreeMap<&'static str, u64> {
    let mut m: BTreeMap<&'static str, u64> = BTreeMap::new();
    let mut recent: [Vec<Seen>; 2] = [Vec::new(), Vec::new()];
    let mut highest: [Option<(u32, bool)>; 2] = [None, None];
    for r in rows {
        let rc = r.opcode < 0x20 || (0xa0..0xc0).contains(&r.opcode) || r.opcode == 0x81;
        let Some(d) = ends
            .iter()
            .position(|(a, q)| *a == r.dst && *q == r.dest_qp)
        else {
            continue;
        };
        if !rc {
            continue;
        }
        let key = (r.opcode, r.psn, r.len, r.syndrome);
        if recent[d]
            .iter()
            .any(|&(o, p, l, s, t)| (o, p, l, s) == key && r.time_ns - t <= 1_000_000)
        {
            *m.entry("duplicates").or_default() += 1;
            continue;
        }
        recent[d].push((r.opcode, r.psn, r.len, r.syndrome, r.time_ns));
        if recent[d].len() > 4 {
            recent[d].remove(0);
        }
        *m.entry("packets").or_default() += 1;
        *m.entry("bytes").or_default() += r.len;
        let low = r.opcode & 0x1f;
        let fam = if r.opcode == 0x81 {
            "cnp"
        } else {
            match low {
                0x06..=0x0b => "write",
                0x0c => "read_req",
                0x0d..=0x10 => "read_resp",
                0x11 => "ack",
                0x12..=0x14 => "atomic",
                _ => "send",
            }
        };
        *m.entry(fam).or_default() += 1;
        if let Some(s) = r.syndrome {
            match (s >> 5) & 3 {
                0 => *m.entry("acks").or_default() += 1,
                1 | 3 => {
                    *m.entry("naks").or_default() += 1;
                    recent[1 - d].clear();
                }
                _ => {}
            }
        }
        if r.opcode == 0x81 || (0x0d..=0x12).contains(&low) {
            continue;
        }
        match highest[d] {
            None => highest[d] = Some((r.psn, low == 0x0c)),
            Some((h, read)) => {
                let ahead = r.psn.wrapping_sub(h) & 0xff_ffff;
                if ahead == 0 || ahead >= 1 << 23 {
                    *m.entry("retransmissions").or_default() += 1;
                } else {
                    if ahead > 1 && !read {
                        *m.entry("psn_gaps").or_default() += 1;
                    }
                    highest[d] = Some((r.psn, low == 0x0c));
                }
            }
        }
    }
    m
}

/// The data-path counters of every connection in the bundled RoCE captures with a CM
/// exchange agree with the same counts made from tshark's per-packet fields.
#[test]
fn data_path_agrees_with_tshark() {
    if !tshark_available() {
        return;
    }
    let mut files: Vec<PathBuf> = [
        "real/rocev2_mlx_nvme-discover.pcap",
        "real/rocev2_mlx_nvme-discover2.pcap",
        "real/rocev2_ibdump_write.pcap",
        "real/rocev2_ibdump_read2.pcap",
        "real/rocev2_ibdump_send.pcap",
        "derived/merged_both_hosts_write.pcap",
        "derived/data/write_nak_resend.pcap",
        "derived/data/no_data_beside_rc_traffic.pcap",
    ]
    .iter()
    .map(|f| cap(f))
    .collect();
    for e in std::fs::read_dir(cap("kernel")).unwrap() {
        files.push(e.unwrap().path());
    }
    let keys = [
        "packets",
        "bytes",
        "send",
        "write",
        "read_req",
        "read_resp",
        "ack",
        "atomic",
        "cnp",
        "acks",
        "naks",
        "retransmissions",
        "psn_gaps",
        "duplicates",
    ];
    let (mut checked, mut with_data) = (0, 0);
    for file in &files {
        let rows = tshark_rows(file);
        for c in conns(file) {
            let end = |side: &str| {
                let e = &c[side];
                Some((
                    e["addr"].as_str()?.to_string(),
                    u32::try_from(e["qpn"].as_u64()?).ok()?,
                ))
            };
            let (Some(passive), Some(active)) = (end("passive"), end("active")) else {
                continue;
            };
            if c["kind"] == "SIDR" {
                continue;
            }
            let want = expected(&rows, [passive, active]);
            let d = &c["data"];
            for k in keys {
                assert_eq!(
                    d[k].as_u64().unwrap(),
                    want.get(k).copied().unwrap_or(0),
                    "{file:?} conn {}: {k}",
                    c["conn"]
                );
            }
            checked += 1;
            with_data += usize::from(want.get("packets").copied().unwrap_or(0) > 0);
        }
    }
    // Every capture above has its connections; most carry data.
    assert!(checked >= 30, "{checked} connections checked");
    assert!(with_data >= 8, "{with_data} connections with data");
}
