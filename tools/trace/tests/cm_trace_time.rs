//! `-t`: the time column of the per-MAD views against tshark's `_ws.col.Time` with the same
//! letter (skipped, loudly, without tshark), and the JSON time keys.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::path::Path;
use std::process::Command;

mod common;
use common::{cap, cm_trace, stdout};

fn tshark_available() -> bool {
    match Command::new("tshark").arg("--version").output() {
        Ok(o) if o.status.success() => true,
        _ => {
            assert!(
                std::env::var_os("IBCM_REQUIRE_TSHARK").is_none(),
                "IBCM_REQUIRE_TSHARK is set but tshark cannot be run"
            );
            let _ = std::io::Write::write_fmt(
                &mut std::io::stderr(),
                format_args!(
                    "\n!!! SKIPPED: `tshark` not found: the -t parity test needs it \
                     (DEBIAN_FRONTEND=noninteractive apt-get install -y tshark). !!!\n"
                ),
            );
            false
        }
    }
}

/// (frame, time column) of the CM frames as tshark shows them with `-t letter`.
fn tshark_times(file: &Path, letter: &str) -> Vec<(u64, String)> {
    let out = Command::new("tshark")
        .env("TZ", "UTC")
        .arg("-n")
        .arg("-r")
        .arg(file)
        .args(["-t", letter])
        .args(["-Y", "infiniband.mad.mgmtclass == 0x07"])
        .args(["-T", "fields", "-e", "frame.number", "-e", "_ws.col.Time"])
        .output()
        .unwrap();
    assert!(out.status.success(), "tshark failed on {file:?}");
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| {
            let (f, t) = l.split_once('\t').unwrap();
            (f.parse().unwrap(), t.to_string())
        })
        .collect()
}

/// tshark's time cut to microseconds (cm-trace shows 6 decimals; tshark as many as the
/// capture has).
fn to_micros(t: &str) -> String {
    match t.split_once('.') {
        Some((a, b)) => format!("{a}.{}", b.get(..6).unwrap_or(b)),
        None => t.to_string(),
    }
}

/// (frame, time column) of cm-trace's text view.
fn our_times(file: &Path, letter: &str) -> Vec<(u64, String)> {
    let o = cm_trace(&["-t", letter, file.to_str().unwrap()]);
    assert!(o.status.success());
    stdout(&o)
        .lines()
        .filter(|l| !l.starts_with("--"))
        .map(|l| {
            let mut w = l.split_whitespace();
            let frame = w.next().unwrap().parse().unwrap();
            let mut t = w.next().unwrap().to_string();
            if letter == "ud" {
                t = format!("{t} {}", w.next().unwrap());
            }
            (frame, t)
        })
        .collect()
}

#[test]
fn time_formats_agree_with_tshark() {
    if !tshark_available() {
        return;
    }
    // Not the ERF-linktype captures: tshark takes their time from the ERF header (in
    // nanoseconds), cm-trace from the pcap record header (in microseconds).
    for file in [
        "real/rocev2_mlx_nvme-discover.pcap",
        "kernel/rping_3.pcap",
        "kernel/cmtime_first_20_connections.pcap",
    ] {
        let path = cap(file);
        // tshark's `u`/`ud` are UTC (cm-trace's `a`/`ad` too); `d` counts from the previous
        // captured frame, `dd` from the previous frame shown (here: the CM frames).
        for (ours, theirs) in [
            ("r", "r"),
            ("ud", "ud"),
            ("u", "u"),
            ("d", "d"),
            ("dd", "dd"),
            ("e", "e"),
        ] {
            let t: Vec<(u64, String)> = tshark_times(&path, theirs)
                .into_iter()
                .map(|(f, t)| (f, to_micros(&t)))
                .collect();
            let o = our_times(&path, ours);
            assert!(!o.is_empty(), "{file}");
            assert_eq!(o, t, "{file} -t {ours}");
        }
    }
}

#[test]
fn ad_is_utc_date_and_time_and_a_is_the_time_of_day() {
    let f = cap("real/ib_erf_infiniband.pcap");
    let ad = stdout(&cm_trace(&["-t", "ad", f.to_str().unwrap()]));
    assert!(
        ad.lines()
            .next()
            .unwrap()
            .contains(" 2008-05-14 19:48:08.680009  LID 4 → LID 1  REQ"),
        "{ad}"
    );
    let a = stdout(&cm_trace(&["-t", "a", f.to_str().unwrap()]));
    assert!(
        a.lines()
            .next()
            .unwrap()
            .contains(" 19:48:08.680009  LID 4"),
        "{a}"
    );
    let v = stdout(&cm_trace(&["-t", "ad", "-V", f.to_str().unwrap()]));
    assert!(
        v.lines()
            .next()
            .unwrap()
            .starts_with("Frame 7  2008-05-14 19:48:08.680009 UTC  IB LNH=2"),
        "{v}"
    );
}

#[test]
fn json_gets_the_asked_time_key_next_to_time() {
    let f = cap("real/rocev2_mlx_nvme-discover.pcap");
    let lines = |t: Option<&str>| -> Vec<serde_json::Value> {
        let mut args = vec!["--json"];
        if let Some(t) = t {
            args.extend(["-t", t]);
        }
        args.push(f.to_str().unwrap());
        stdout(&cm_trace(&args))
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    };
    let plain = lines(None);
    assert!(plain.iter().all(|v| v.get("time_rel").is_none()));
    // Relative to the file's first frame (not CM here: the first REQ is frame 5).
    let rel = lines(Some("r"));
    assert_eq!(rel[0]["frame"], 5);
    assert_eq!(rel[0]["time_rel"].as_f64(), Some(187.6957));
    for w in rel.windows(2) {
        let want = w[1]["time"].as_f64().unwrap() - w[0]["time"].as_f64().unwrap();
        let got = w[1]["time_rel"].as_f64().unwrap() - w[0]["time_rel"].as_f64().unwrap();
        assert!((got - want).abs() < 1e-6, "{}", w[1]);
    }
    let dd = lines(Some("dd"));
    assert_eq!(dd[0]["time_delta_displayed"].as_f64(), Some(0.0));
    for w in dd.windows(2) {
        let want = w[1]["time"].as_f64().unwrap() - w[0]["time"].as_f64().unwrap();
        let got = w[1]["time_delta_displayed"].as_f64().unwrap();
        assert!((got - want).abs() < 1e-6, "{}", w[1]);
    }
    let ad = lines(Some("ad"));
    assert_eq!(ad[0]["time_utc"].as_str().unwrap().len(), 26);
    // -l: the JSON view on one thread gives the same lines.
    let mut args = vec!["--json", "-l", "-t", "dd", f.to_str().unwrap()];
    let one = stdout(&cm_trace(&args));
    args.remove(1);
    assert_eq!(one, stdout(&cm_trace(&args)));
}

#[test]
fn bad_time_format_is_a_usage_error() {
    let o = cm_trace(&[
        "-t",
        "x",
        cap("real/ib_erf_infiniband.pcap").to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("r, a, ad"));
}
