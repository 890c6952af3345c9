//! cm-trace on messy real-world captures (issue 13 §1): each test runs the binary on a capture
//! under `fixtures/captures/derived/` (provenance in `fixtures/MANIFEST.md`) or written here.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const BIN: &str = env!("CARGO_BIN_EXE_cm-trace");

fn cap(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures/captures")
        .join(rel)
}

fn cm_trace(args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .env("NO_COLOR", "1")
        .output()
        .unwrap()
}

fn stdout(o: &Output) -> String {
    String::from_utf8(o.stdout.clone()).unwrap()
}

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
    assert!(!text.contains("retransmission(s)"), "{text}");
    assert!(text.contains("5 duplicate capture(s)"), "{text}");
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
