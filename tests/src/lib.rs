//! Shared helpers for the cross-crate tests in `tests/tests/`, and the bodies of the fuzz
//! targets (so that the cargo-fuzz harnesses in `fuzz/` and the stable replay test run the same
//! code).
#![forbid(unsafe_code)]

pub mod fuzz;

use std::path::{Path, PathBuf};

/// The workspace's `fixtures/` folder.
pub fn fixtures_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures")
}

/// Every capture file (`*.pcap`, `*.pcapng`) under `fixtures/captures/`, sorted.
pub fn all_captures() -> Vec<PathBuf> {
    let mut out = Vec::new();
    let root = fixtures_dir().join("captures");
    let mut stack = vec![root];
    while let Some(dir) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if matches!(
                p.extension().and_then(|x| x.to_str()),
                Some("pcap" | "pcapng")
            ) {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

/// Reads every record of a capture and classifies it (cm-trace's view).
pub fn classify_file(path: &Path) -> Vec<ibcm_trace::Item> {
    let mut r =
        ibcm_trace::CaptureReader::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut items = Vec::new();
    while let Some(rec) = r.next_record() {
        let rec = rec.unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        items.push(ibcm_trace::classify(&rec));
    }
    items
}

/// Whether tshark is required (CI sets `IBCM_REQUIRE_TSHARK=1`): then a missing tshark fails
/// the test instead of skipping it.
pub fn tshark_required() -> bool {
    std::env::var_os("IBCM_REQUIRE_TSHARK").is_some_and(|v| v != "0")
}

/// Whether tshark can be run. When it cannot, this says so loudly on stderr (and panics if
/// [`tshark_required`]).
pub fn have_tshark(test: &str) -> bool {
    let ok = std::process::Command::new("tshark")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        if tshark_required() {
            panic!("{test}: tshark is required (IBCM_REQUIRE_TSHARK=1) but cannot be run");
        }
        // Written to the process's stderr directly: libtest captures `eprintln!` of a
        // passing test, and a skip must be seen.
        let _ = std::io::Write::write_fmt(
            &mut std::io::stderr(),
            format_args!(
                "\n*** {test}: SKIPPED: the `tshark` binary was not found. Install it with \
             `DEBIAN_FRONTEND=noninteractive apt-get install -y tshark` to run this oracle test.\n"
            ),
        );
    }
    ok
}
