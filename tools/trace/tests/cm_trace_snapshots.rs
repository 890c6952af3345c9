//! Golden snapshots of every cm-trace view for every fixture capture: text, `-V`, `--json`,
//! `--ladder`, `--ladder --json`, `--stats`, `--stats --json`, and the timeline SVG for a few
//! captures. Snapshots live in `tools/trace/tests/snapshots/`; after an intended change,
//! regenerate them with `INSTA_UPDATE=always cargo test -p ibcm-trace --test cm_trace_snapshots`
//! and review the diff.
//!
//! The file names in the output are shown as `../fixtures/captures/...` (see [`shown`]): the
//! snapshots were made when this crate sat one directory higher, and a path prefix is not
//! what they check.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::path::{Path, PathBuf};

use ibcm_trace::{run, Options, View};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/captures")
}

/// The fixture directory as the snapshots show it.
const SHOWN_PREFIX: &str = "../fixtures/captures/";
/// The fixture directory relative to this crate (the working directory of its tests).
const REAL_PREFIX: &str = "../../fixtures/captures/";

/// `s` with the fixture paths shown as [`SHOWN_PREFIX`].
fn shown(s: &str) -> String {
    s.replace(REAL_PREFIX, SHOWN_PREFIX)
}

/// Every fixture capture as (snapshot name, path relative to this crate).
fn captures() -> Vec<(String, String)> {
    let mut out = Vec::new();
    for dir in ["real", "derived", "kernel"] {
        let mut names: Vec<String> = std::fs::read_dir(fixtures().join(dir))
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().to_string())
            .filter(|n| n.ends_with(".pcap") || n.ends_with(".pcapng"))
            .collect();
        names.sort();
        for n in names {
            let stem = n.replace('.', "_");
            out.push((
                format!("{dir}__{stem}"),
                format!("../../fixtures/captures/{dir}/{n}"),
            ));
        }
    }
    assert!(out.len() >= 30, "fixtures missing: {out:?}");
    out
}

fn render(view: View, file: &str) -> String {
    let opts = Options {
        view,
        timeline_max: 500,
        ..Options::default()
    };
    let mut out = Vec::new();
    let mut err = Vec::new();
    let r = run(&opts, &[file.to_string()], &mut out, &mut err).unwrap();
    assert_eq!(r.unreadable, 0, "{file}");
    let mut s = shown(&String::from_utf8(out).unwrap());
    let err = shown(&String::from_utf8(err).unwrap());
    if !err.is_empty() {
        s.push_str("--- stderr ---\n");
        s.push_str(&err);
    }
    s
}

fn snapshots(prefix: &str, view: View) {
    let mut settings = insta::Settings::clone_current();
    settings.set_prepend_module_to_snapshot(false);
    settings.set_snapshot_path("snapshots");
    settings.bind(|| {
        for (name, path) in captures() {
            insta::assert_snapshot!(format!("{prefix}__{name}"), render(view, &path));
        }
    });
}

#[test]
fn text_view() {
    snapshots("text", View::Text);
}

#[test]
fn verbose_view() {
    snapshots("verbose", View::Verbose);
}

#[test]
fn json_view() {
    snapshots("json", View::Json);
}

#[test]
fn ladder_view() {
    snapshots("ladder", View::Ladder);
}

#[test]
fn ladder_json_view() {
    snapshots("ladder_json", View::LadderJson);
}

#[test]
fn stats_view() {
    snapshots("stats", View::Stats);
}

#[test]
fn stats_json_view() {
    snapshots("stats_json", View::StatsJson);
}

/// The stats of all kernel captures together (several files, several Service IDs).
#[test]
fn stats_of_all_kernel_captures() {
    let files: Vec<String> = captures()
        .into_iter()
        .filter(|(n, _)| n.starts_with("kernel__"))
        .map(|(_, p)| p)
        .collect();
    let mut out = Vec::new();
    let mut err = Vec::new();
    for view in [View::Stats, View::StatsJson] {
        let opts = Options {
            view,
            ..Options::default()
        };
        run(&opts, &files, &mut out, &mut err).unwrap();
    }
    let mut settings = insta::Settings::clone_current();
    settings.set_prepend_module_to_snapshot(false);
    settings.set_snapshot_path("snapshots");
    settings.bind(|| {
        insta::assert_snapshot!("stats_all_kernel", String::from_utf8(out).unwrap());
    });
}

/// The timeline SVG of a few captures (one connection with MRA and a retransmission; a
/// reject; twenty interleaved connections; several files at once).
#[test]
fn timeline_svg() {
    let dir = std::env::temp_dir().join(format!("cm-trace-timeline-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cases: [(&str, &[&str]); 4] = [
        ("mra_slow_accept", &["kernel/mra_slow_accept.pcap"]),
        ("rej8_no_listener", &["kernel/rej8_no_listener.pcap"]),
        ("cmtime", &["kernel/cmtime_first_20_connections.pcap"]),
        (
            "kernel_mix",
            &[
                "kernel/req_retransmission_after_drop.pcap",
                "kernel/rej28_consumer_private_data.pcap",
                "kernel/xrc_handshake_no_qp.pcap",
            ],
        ),
    ];
    let mut settings = insta::Settings::clone_current();
    settings.set_prepend_module_to_snapshot(false);
    settings.set_snapshot_path("snapshots");
    for (name, files) in cases {
        let svg = dir.join(format!("{name}.svg"));
        let opts = Options {
            view: View::Stats,
            timeline: Some(svg.clone()),
            timeline_max: 500,
            ..Options::default()
        };
        let files: Vec<String> = files
            .iter()
            .map(|f| format!("../../fixtures/captures/{f}"))
            .collect();
        let mut out = Vec::new();
        let mut err = Vec::new();
        run(&opts, &files, &mut out, &mut err).unwrap();
        let doc = shown(&std::fs::read_to_string(&svg).unwrap());
        assert!(doc.starts_with("<svg"), "{name}");
        assert!(doc.trim_end().ends_with("</svg>"), "{name}");
        settings.bind(|| insta::assert_snapshot!(format!("timeline__{name}"), doc));
    }
    // HTML wrapper.
    let html = dir.join("t.html");
    let opts = Options {
        view: View::Stats,
        timeline: Some(html.clone()),
        timeline_max: 500,
        ..Options::default()
    };
    run(
        &opts,
        &["../../fixtures/captures/kernel/mra_slow_accept.pcap".to_string()],
        &mut Vec::new(),
        &mut Vec::new(),
    )
    .unwrap();
    let doc = std::fs::read_to_string(&html).unwrap();
    assert!(doc.starts_with("<!DOCTYPE html>") && doc.contains("<svg"));
    let _ = std::fs::remove_dir_all(&dir);
}
