//! `-Y` field expressions, `--port` and the `--from` / `--to` time window, end to end: the
//! messages an expression selects are the ones the same predicate selects from the unfiltered
//! JSON, errors give the column and exit 2, the connection views keep the connections with a
//! matching message.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use serde_json::Value;

mod common;
use common::{cap, cm_trace};

fn json(args: &[&str]) -> Vec<Value> {
    let mut a = vec!["--json"];
    a.extend_from_slice(args);
    let o = cm_trace(&a);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8(o.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn frames(v: &[Value]) -> Vec<(String, u64)> {
    v.iter()
        .map(|v| {
            (
                v["file"].as_str().unwrap_or("").to_string(),
                v["frame"].as_u64().unwrap(),
            )
        })
        .collect()
}

fn all_captures() -> Vec<String> {
    let mut v = Vec::new();
    for dir in ["real", "kernel", "derived"] {
        for e in std::fs::read_dir(cap(dir)).unwrap() {
            let p = e.unwrap().path();
            if p.extension().is_some_and(|x| x == "pcap") {
                v.push(p.to_str().unwrap().to_string());
            }
        }
    }
    v.sort();
    v
}

/// Each expression against the same predicate written over the unfiltered JSON lines.
#[test]
fn expressions_select_what_the_predicate_selects() {
    let files = all_captures();
    let files: Vec<&str> = files.iter().map(String::as_str).collect();
    // `-Y` fields are CM fields: the SA MADs (`"msg":"SA"`) are never selected.
    let all: Vec<Value> = json(&files)
        .into_iter()
        .filter(|v| v["msg"] != "SA")
        .collect();
    assert!(all.len() > 250, "{}", all.len());
    type Pred = fn(&Value) -> bool;
    let cases: &[(&str, Pred)] = &[
        ("msg == REJ", |v| v["msg"] == "REJ"),
        ("rej.reason == 28", |v| v["rej_reason"] == 28),
        ("msg == rep && !(psn < 0x800000)", |v| {
            v["msg"] == "REP" && v["psn"].as_u64().is_some_and(|p| p >= 0x80_0000)
        }),
        (
            "msg == REQ && (sid.port == 4420 || sid.port == 7471)",
            |v| v["msg"] == "REQ" && (v["port"] == 4420 || v["port"] == 7471),
        ),
        ("retrans or dup", |v| {
            v["retrans"] == true || v["dup"] == true
        }),
        ("mtu >= 2048 && msg == REQ", |v| {
            v["mtu"].as_u64().is_some_and(|m| m >= 2048)
        }),
        ("from == passive && conn > 2", |v| {
            v["from"] == "passive" && v["conn"].as_u64().is_some_and(|c| c > 2)
        }),
        ("icrc != ok", |v| v["icrc"] != "ok"),
        ("truncated", |v| v.get("captured").is_some()),
        ("xrc", |v| v["xrc"] == true),
        ("src == 10.77.0.1", |v| v["src"] == "10.77.0.1"),
        ("transport == \"XRC\"", |v| v["transport"] == "XRC"),
        ("encap == \"IB LNH=2\"", |v| v["encap"] == "IB LNH=2"),
        ("qpn", |v| v.get("local_qpn").is_some()),
    ];
    for (expr, pred) in cases {
        let mut args = vec!["-Y", expr];
        args.extend_from_slice(&files);
        let got = frames(&json(&args));
        let want: Vec<Value> = all.iter().filter(|v| pred(v)).cloned().collect();
        let want = frames(&want);
        assert_eq!(got, want, "-Y {expr}");
    }
    // A connection's messages carry its REQ's Service ID.
    let mut ports = std::collections::HashMap::new();
    for v in &all {
        if let (Some(c), Some(p)) = (v["conn"].as_u64(), v["port"].as_u64()) {
            ports.insert((v["file"].clone(), c), p);
        }
    }
    let mut args = vec!["-Y", "sid.port == 4420 || sid.port == 7471"];
    args.extend_from_slice(&files);
    let got = frames(&json(&args));
    let want: Vec<Value> = all
        .iter()
        .filter(|v| {
            let p = v["port"].as_u64().or_else(|| {
                v["conn"]
                    .as_u64()
                    .and_then(|c| ports.get(&(v["file"].clone(), c)).copied())
            });
            p == Some(4420) || p == Some(7471)
        })
        .cloned()
        .collect();
    assert!(want.len() > 50, "{}", want.len());
    assert_eq!(got, frames(&want));
    // Non-trivial: the two first cases select something, but not everything.
    let rej = json(&["-Y", "msg == REJ", files[0], files[1]]);
    assert!(rej.len() < all.len());
}

#[test]
fn the_example_of_the_docs_selects_the_nvme_reject() {
    let f = cap("kernel/rej28_consumer_private_data.pcap");
    let v = json(&[
        "-Y",
        "rej.reason == 28 && sid.port == 7003",
        f.to_str().unwrap(),
    ]);
    assert_eq!(v.len(), 1);
    assert_eq!(v[0]["msg"], "REJ");
    assert!(json(&[
        "-Y",
        "rej.reason == 28 && sid.port == 4420",
        f.to_str().unwrap()
    ])
    .is_empty());
}

#[test]
fn errors_give_the_column_and_exit_2() {
    let f = cap("kernel/rej28_consumer_private_data.pcap");
    let o = cm_trace(&[
        "-Y",
        "rej.reason == 26 && sid.prot == 4420",
        f.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(o.stdout.is_empty());
    let err = String::from_utf8(o.stderr).unwrap();
    assert_eq!(
        err,
        "cm-trace: -Y: column 21: unknown field `sid.prot` (the fields: cm-trace --help-fields)\
         \n  rej.reason == 26 && sid.prot == 4420\n                      ^\n"
    );
    for bad in [
        "(msg == REQ",
        "msg == REQ ||",
        "msg = REQ",
        "mtu > big",
        "src == 1.2.3",
    ] {
        let o = cm_trace(&["-Y", bad, f.to_str().unwrap()]);
        assert_eq!(o.status.code(), Some(2), "{bad}");
        assert!(
            String::from_utf8_lossy(&o.stderr).contains("column "),
            "{bad}"
        );
    }
}

#[test]
fn connection_views_keep_connections_with_a_matching_message() {
    let f = cap("kernel/cmtime_first_20_connections.pcap");
    let f = f.to_str().unwrap();
    let conns = json(&[
        "--ladder",
        "-Y",
        "msg == DREQ && (conn == 3 || conn == 7)",
        f,
    ]);
    let ids: Vec<u64> = conns.iter().map(|c| c["conn"].as_u64().unwrap()).collect();
    assert_eq!(ids, [3, 7]);
    let o = cm_trace(&["--stats", "-Y", "conn <= 5", f]);
    let s = String::from_utf8(o.stdout).unwrap();
    assert!(s.contains("\n  attempted               5\n"), "{s}");
}

#[test]
fn port_filter_uses_the_connections_service_id() {
    let files = [
        cap("real/rocev2_mlx_nvme-discover.pcap"),
        cap("kernel/rej28_consumer_private_data.pcap"),
    ];
    let f: Vec<&str> = files.iter().map(|p| p.to_str().unwrap()).collect();
    let v = json(&["--port", "4420", f[0], f[1]]);
    // REQ, REP, RTU, DREQ, DREP of the NVMe connection: the REP … DREP through it.
    let msgs: Vec<&str> = v.iter().map(|v| v["msg"].as_str().unwrap()).collect();
    assert_eq!(msgs, ["REQ", "REP", "RTU", "DREQ", "DREP"]);
    assert!(v
        .iter()
        .all(|v| v["file"].as_str().unwrap().contains("nvme")));
    let v = json(&["--port", "7003", "--port", "4420", f[0], f[1]]);
    assert_eq!(v.len(), 7);
}

#[test]
fn time_window_in_three_notations() {
    let f = cap("real/rocev2_mlx_nvme-discover.pcap");
    let f = f.to_str().unwrap();
    let all = json(&[f]);
    let t = |i: usize| all[i]["time"].as_f64().unwrap();
    // REP and RTU only, written relative, as epoch seconds and as UTC.
    let rel = json(&["--from", "+187.70", "--to", "+187.7017", f]);
    let epoch_from = format!("{:.6}", t(1) - 0.000001);
    let epoch_to = format!("{:.6}", t(2) + 0.000001);
    let epoch = json(&["--from", &epoch_from, "--to", &epoch_to, f]);
    let utc = json(&[
        "--from",
        "2017-02-21 11:57:29.991",
        "--to",
        "2017-02-21T11:57:29.9920",
        f,
    ]);
    for v in [&rel, &epoch, &utc] {
        let m: Vec<&str> = v.iter().map(|v| v["msg"].as_str().unwrap()).collect();
        assert_eq!(m, ["REP", "RTU"]);
    }
    // The ladder keeps the connection that overlaps the window.
    assert_eq!(
        json(&["--ladder", "--from", "+187.70", "--to", "+187.7017", f]).len(),
        1
    );
    assert!(json(&["--ladder", "--from", "+900", f]).is_empty());
    let o = cm_trace(&["--from", "tomorrow", f]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("bad time \"tomorrow\""));
}

#[test]
fn help_fields_lists_every_field() {
    let o = cm_trace(&["--help-fields"]);
    assert!(o.status.success());
    let s = String::from_utf8(o.stdout).unwrap();
    for f in [
        "rej.reason",
        "sid.port",
        "nvme.qid",
        "cma.src",
        "mtu",
        "addr",
    ] {
        assert!(s.contains(&format!("  {f} ")), "{f}: {s}");
    }
}
