//! SA PathRecords next to the CM exchanges they served: the generated native-IB capture
//! `derived/sa_pathrecord_ib.pcap` (`cm-trace-gen --scenario sa-pathrecord`, OpenSM's real
//! answer; fixtures/MANIFEST.md) and the real 2008 capture `real/ib_erf_infiniband.pcap`
//! (an IPoIB-CM REQ after a PathRecord Get / GetResp), through every view; the PathRecord
//! fields against tshark's; damaged SA MADs through every view without a panic.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::path::{Path, PathBuf};
use std::process::Command;

use ibcm_trace::{run, CaptureReader, Filter, Options, PcapFileWriter, TsResolution, View};
use serde_json::Value;

mod common;
use common::{cap, cm_trace, stdout};

const FIXTURE: &str = "derived/sa_pathrecord_ib.pcap";
const REAL: &str = "real/ib_erf_infiniband.pcap";

fn lines(args: &[&str]) -> Vec<Value> {
    let o = cm_trace(args);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    stdout(&o)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn path(rel: &str) -> String {
    cap(rel).to_str().unwrap().to_string()
}

fn temp_dir(what: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("cm-trace-sa-{what}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The fixture is what the generator writes today, byte for byte.
#[test]
fn sa_fixture_is_reproducible() {
    let dir = temp_dir("gen");
    let out = dir.join("sa.pcap");
    let o = Command::new(env!("CARGO_BIN_EXE_cm-trace-gen"))
        .args(["--scenario", "sa-pathrecord", "-o"])
        .arg(&out)
        .output()
        .unwrap();
    assert!(o.status.success(), "{o:?}");
    let made = std::fs::read(&out).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(made, std::fs::read(cap(FIXTURE)).unwrap());
}

/// The answers in the fixture are OpenSM's bytes (only the TID of the second and third made
/// to match their queries).
#[test]
fn the_fixture_carries_opensm_answer_unchanged() {
    let opensm = std::fs::read(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../fixtures/sa/opensm_pathrecord_getresp.bin"),
    )
    .unwrap();
    let mut r = CaptureReader::open(cap(FIXTURE)).unwrap();
    let mut answers = 0;
    while let Some(rec) = r.next_record() {
        let rec = rec.unwrap();
        // LRH 8 + BTH 12 + DETH 8, then the MAD.
        let mad = &rec.data[28..28 + 256];
        if mad[1] == 0x03 && mad[3] == 0x81 {
            assert_eq!(&mad[..8], &opensm[..8]);
            assert_eq!(&mad[16..], &opensm[16..]);
            assert_eq!(
                &mad[8..12],
                &opensm[8..12],
                "TID bits 63-32 as ibsim wrote them"
            );
            answers += 1;
        }
    }
    assert_eq!(answers, 3);
}

#[test]
fn sa_mads_decode_in_the_json_view() {
    let v = lines(&["--json", &path(FIXTURE)]);
    let sa: Vec<&Value> = v.iter().filter(|l| l["msg"] == "SA").collect();
    assert_eq!(sa.len(), 7);
    let q = sa[0];
    assert_eq!(
        (
            q["frame"].as_u64(),
            q["method"].as_str(),
            q["attr"].as_str()
        ),
        (Some(1), Some("Get"), Some("PathRecord"))
    );
    assert_eq!(q["tid"], "0x00010000000051b9");
    assert_eq!(q["comp_mask"], "0x0000000000000030");
    assert_eq!(q["components"], serde_json::json!(["dlid", "slid"]));
    assert_eq!(q["template"], serde_json::json!({"dlid": 4, "slid": 3}));
    let a = sa[1];
    assert_eq!(
        (a["method"].as_str(), a["status"].as_u64()),
        (Some("GetResp"), Some(0))
    );
    assert_eq!(a["tid"], q["tid"]);
    assert_eq!(a["attr_offset"], 8);
    let r = &a["records"][0];
    assert_eq!(a["records"].as_array().unwrap().len(), 1);
    for (k, want) in [
        ("slid", serde_json::json!(3)),
        ("dlid", serde_json::json!(4)),
        ("sgid", serde_json::json!("fe80::10:3")),
        ("dgid", serde_json::json!("fe80::10:5")),
        ("sl", serde_json::json!(0)),
        ("mtu", serde_json::json!(2048)),
        ("mtu_selector", serde_json::json!(2)),
        ("rate", serde_json::json!(3)),
        ("rate_name", serde_json::json!("10 Gb/s")),
        ("packet_life_time", serde_json::json!(18)),
        ("pkey", serde_json::json!(0xffff)),
        ("hop_limit", serde_json::json!(0)),
        ("reversible", serde_json::json!(true)),
    ] {
        assert_eq!(r[k], want, "{k}");
    }
    assert_eq!(a["src"], "LID 1");
    assert_eq!(a["dst"], "LID 3");
    assert_eq!(a["encap"], "IB LNH=2");
    assert_eq!(a["icrc"], "ok");
    // The REQs say which answer their path follows, and where they disagree with it.
    let req = |frame: u64| v.iter().find(|l| l["frame"] == frame).unwrap().clone();
    assert_eq!(
        req(3)["sa_path"],
        serde_json::json!({"frame": 2, "differs": []})
    );
    assert!(req(8).get("sa_path").is_none(), "the reverse path");
    assert_eq!(
        req(15)["sa_path"],
        serde_json::json!({"frame": 14, "differs": ["sl", "local_ack_timeout"]})
    );
    // Not on the other messages of the connection.
    assert!(req(4).get("sa_path").is_none());
}

#[test]
fn path_records_go_to_the_connections_that_followed_them() {
    let v = lines(&["--ladder", "--json", &path(FIXTURE)]);
    assert_eq!(v.len(), 5, "3 connections, 2 exchanges that served none");
    let (c1, c2, c3) = (&v[0], &v[1], &v[2]);
    assert_eq!(
        (c1["conn"].as_u64(), c3["conn"].as_u64()),
        (Some(1), Some(3))
    );
    let p = &c1["sa"]["primary"];
    assert_eq!(p["exchange"], 1);
    assert_eq!(p["tid_match"], "full");
    assert_eq!(p["query"]["frame"], 1);
    assert_eq!(p["answer"]["frame"], 2);
    assert_eq!(p["answer"]["t"], -0.000155);
    assert_eq!(p["record"]["slid"], 3);
    assert_eq!(p["differs"], serde_json::json!([]));
    assert!(c1["sa"].get("alternate").is_none());
    assert!(c2.get("sa").is_none(), "{c2}");
    // The newest answer before its REQ, not the first one with the same record.
    let p = &c3["sa"]["primary"];
    assert_eq!(p["exchange"], 2);
    assert_eq!(p["answer"]["frame"], 14);
    assert_eq!(
        p["differs"],
        serde_json::json!([
            {"field": "sl", "req": 3, "record": 0},
            {"field": "local_ack_timeout", "req": 14, "record_packet_life_time": 18, "min": 19}
        ])
    );
    let (x3, x4) = (&v[3], &v[4]);
    assert!(x3.get("conn").is_none());
    assert_eq!(
        (x3["sa_exchange"].as_u64(), x3["outcome"].as_str()),
        (Some(3), Some("served_none"))
    );
    assert_eq!(x3["answer"]["frame"], 21);
    assert_eq!(x3["records"][0]["dlid"], 4);
    assert_eq!(
        (x4["sa_exchange"].as_u64(), x4["outcome"].as_str()),
        (Some(4), Some("unanswered"))
    );
    assert_eq!(x4["query"]["template"]["dlid"], 7);
    assert!(x4.get("answer").is_none());
}

#[test]
fn the_ladder_shows_the_exchange_at_the_head_and_flags_the_disagreement() {
    let l = stdout(&cm_trace(&["--ladder", &path(FIXTURE)]));
    let head = "    -0.000200       1  SA Get PathRecord dlid 4 slid 3\n    \
                -0.000155       2  SA GetResp 1 record: slid 3 dlid 4 sl 0 mtu 2048 rate 10 Gb/s \
                pkt_life 18 pkey 0xffff reversible\n    +0.000000       3  ─── REQ ─";
    assert!(l.contains(head), "{l}");
    assert!(
        l.contains(
            "  path differs from SA record: sl 3 (record 0), local ACK timeout 14 (record \
             pkt_life 18: at least 19)"
        ),
        "{l}"
    );
    assert!(
        l.contains("REQ disagrees with its SA PathRecord (sl, local_ack_timeout)"),
        "{l}"
    );
    assert_eq!(l.matches("path differs").count(), 1, "{l}");
    assert!(
        l.contains("SA exchange 3  PathRecord  tid 0x00010000000051bb"),
        "{l}"
    );
    assert!(
        l.contains("result: unanswered: no answer in the capture"),
        "{l}"
    );
    assert!(l.contains(
        "-- SA: 7 MAD(s), 4 PathRecord exchange(s): 2 served a connection, 1 served none, 1 \
         unanswered, 1 REQ(s) disagree with their PathRecord"
    ));
    // The text and -V views mark the REQs.
    let t = stdout(&cm_trace(&[&path(FIXTURE)]));
    assert!(t.contains("RC [path: SA frame 2]  icrc=ok  conn=1"), "{t}");
    assert!(
        t.contains("RC [path differs from SA frame 14: sl, local_ack_timeout]"),
        "{t}"
    );
    let vv = stdout(&cm_trace(&["-V", &path(FIXTURE)]));
    assert!(
        vv.contains(
            "  Path from the SA: the primary path follows the PathRecord answered in frame 14; \
             the REQ disagrees with it in sl, local_ack_timeout"
        ),
        "{vv}"
    );
    assert!(
        vv.contains("  * SLID                               3"),
        "{vv}"
    );
}

#[test]
fn stats_count_the_exchanges_and_list_those_that_served_none() {
    let v = lines(&["--stats", "--json", &path(FIXTURE)]);
    let sa = &v[0]["sa"];
    for (k, n) in [
        ("mads", 7),
        ("exchanges", 4),
        ("queries", 4),
        ("unanswered", 1),
        ("failed", 0),
        ("records", 3),
        ("served", 2),
        ("served_none", 1),
        ("reqs_following", 2),
        ("reqs_differing", 1),
        ("tid_low32", 0),
    ] {
        assert_eq!(sa[k], n, "{k}: {sa}");
    }
    let listed = sa["served_no_connection"].as_array().unwrap();
    assert_eq!(
        listed
            .iter()
            .map(|x| x["sa_exchange"].as_u64().unwrap())
            .collect::<Vec<_>>(),
        vec![3, 4]
    );
    let s = stdout(&cm_trace(&["--stats", &path(FIXTURE)]));
    assert!(s.contains("Subnet Administration (PathRecords)"), "{s}");
    assert!(
        s.contains("    exchange 4: frame 22 Get PathRecord dlid 7 slid 3 → no answer"),
        "{s}"
    );
    // A capture without SA MADs has no "sa" key and no such section.
    let plain = lines(&["--stats", "--json", &path("kernel/rping_3.pcap")]);
    assert!(plain[0].get("sa").is_none());
}

/// The real capture: a 2008 Linux IPoIB-CM asks the SA by GIDs (ComponentMask 0x340c) and
/// sends its REQ 141 µs after the answer; its REQ rate is 0 ("port current"), which is not a
/// disagreement, and the other two connections follow no PathRecord of the capture.
#[test]
fn the_real_capture_pairs_its_pathrecord_with_the_third_connection() {
    let v = lines(&["--ladder", "--json", &path(REAL)]);
    assert_eq!(v.len(), 3);
    assert!(v[0].get("sa").is_none() && v[1].get("sa").is_none());
    let p = &v[2]["sa"]["primary"];
    assert_eq!(
        (p["query"]["frame"].as_u64(), p["answer"]["frame"].as_u64()),
        (Some(32), Some(33))
    );
    assert_eq!(p["query"]["comp_mask"], "0x000000000000340c");
    assert_eq!(
        p["query"]["components"],
        serde_json::json!(["dgid", "sgid", "traffic_class", "numb_path", "pkey"])
    );
    assert_eq!(p["tid"], "0x0000000bb9647f9e");
    assert_eq!(p["record"]["slid"], 4);
    assert_eq!(p["record"]["dlid"], 2);
    assert_eq!(p["differs"], serde_json::json!([]));
    let l = stdout(&cm_trace(&["--ladder", &path(REAL)]));
    assert!(l.contains(
        "    -0.000141      33  SA GetResp 1 record: slid 4 dlid 2 sl 0 mtu 2048 rate 10 Gb/s \
         pkt_life 18 pkey 0xffff reversible"
    ));
}

/// Filters: SA MADs have none of the CM's message fields; `--addr` matches their LIDs and
/// GIDs; `--problems` keeps the connection whose REQ disagrees and the unanswered exchange.
#[test]
fn filters_apply_to_the_sa_mads_and_exchanges() {
    let f = path(FIXTURE);
    let t = stdout(&cm_trace(&["-m", "REQ", &f]));
    assert!(!t.contains("  SA Get"), "{t}");
    assert_eq!(t.matches(" REQ ").count(), 3);
    let t = stdout(&cm_trace(&["-a", "lid:7", &f]));
    let shown: Vec<&str> = t.lines().filter(|l| !l.starts_with("--")).collect();
    assert_eq!(shown.len(), 1, "{t}");
    assert!(shown[0].contains("SA Get PathRecord tid=0x00010000000051bc"));
    let t = stdout(&cm_trace(&["-a", "fe80::10:5", &f]));
    assert!(t.contains("SA GetResp"), "{t}");
    let l = stdout(&cm_trace(&["--ladder", "-p", &f]));
    assert!(
        l.contains("conn 3 ") && !l.contains("conn 1 ") && !l.contains("conn 2 "),
        "{l}"
    );
    assert!(
        l.contains("SA exchange 4") && !l.contains("SA exchange 3"),
        "{l}"
    );
    let l = stdout(&cm_trace(&["--ladder", "-m", "REQ", &f]));
    assert!(!l.contains("SA exchange"), "{l}");
}

/// Every view of the fixture with the SA MADs damaged byte by byte (a deterministic
/// generator; the ICRCs then fail, the MADs are still decoded): no panic, and the JSON views
/// write JSON.
#[test]
fn damaged_sa_mads_never_panic() {
    let dir = temp_dir("fuzz");
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let mut records: Vec<(std::time::Duration, Vec<u8>)> = Vec::new();
    let mut r = CaptureReader::open(cap(FIXTURE)).unwrap();
    while let Some(rec) = r.next_record() {
        let rec = rec.unwrap();
        records.push((rec.timestamp, rec.data.to_vec()));
    }
    for round in 0..40 {
        let mut recs = records.clone();
        for (_, data) in recs.iter_mut() {
            if data[28 + 1] != 0x03 {
                continue;
            }
            // Damage the SA part (RMPP header, SA header, records); sometimes the method.
            for _ in 0..1 + next() % 24 {
                let at = 28 + 24 + (next() % 232) as usize;
                data[at] = next() as u8;
            }
            if round % 4 == 0 {
                data[28 + 3] = [0x01, 0x12, 0x81, 0x92][(next() % 4) as usize];
                data[28 + 24] = 1;
                data[28 + 26] |= 1;
            }
            if round % 7 == 0 {
                // Cut the packet inside the MAD.
                data.truncate(28 + (next() % 256) as usize);
            }
        }
        let file = dir.join(format!("damaged_{round}.pcap"));
        let mut w = PcapFileWriter::new(
            std::fs::File::create(&file).unwrap(),
            247,
            TsResolution::Micro,
        )
        .unwrap();
        for (t, d) in &recs {
            w.write(*t, d).unwrap();
        }
        w.into_inner().unwrap();
        let name = file.to_str().unwrap().to_string();
        for view in [
            View::Text,
            View::Verbose,
            View::Json,
            View::Ladder,
            View::LadderJson,
            View::Stats,
            View::StatsJson,
        ] {
            for problems in [false, true] {
                let opts = Options {
                    view,
                    filter: Filter {
                        problems,
                        ..Filter::default()
                    },
                    ..Options::default()
                };
                let mut out = Vec::new();
                let mut err = Vec::new();
                run(&opts, std::slice::from_ref(&name), &mut out, &mut err).unwrap();
                if matches!(view, View::Json | View::LadderJson | View::StatsJson) {
                    for l in String::from_utf8(out).unwrap().lines() {
                        let _: Value = serde_json::from_str(l).unwrap();
                    }
                }
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

fn tshark_available() -> bool {
    match Command::new("tshark").arg("--version").output() {
        Ok(o) if o.status.success() => true,
        _ => {
            assert!(
                std::env::var_os("IBCM_REQUIRE_TSHARK").is_none(),
                "IBCM_REQUIRE_TSHARK is set but tshark cannot be run"
            );
            eprintln!("\n!!! SKIPPED: `tshark` not found: the SA field parity test needs it. !!!");
            false
        }
    }
}

/// The PathRecord fields tshark decodes, against ours (query templates: the fields the
/// ComponentMask selects; answers: every field).
const PATH_FIELDS: [(&str, &str); 16] = [
    ("infiniband.pathrecord.dgid", "dgid"),
    ("infiniband.pathrecord.sgid", "sgid"),
    ("infiniband.pathrecord.dlid", "dlid"),
    ("infiniband.pathrecord.slid", "slid"),
    ("infiniband.pathrecord.flowlabel", "flow_label"),
    ("infiniband.pathrecord.hoplimit", "hop_limit"),
    ("infiniband.pathrecord.tclass", "traffic_class"),
    ("infiniband.pathrecord.reversible", "reversible"),
    ("infiniband.pathrecord.numbpath", "numb_path"),
    ("infiniband.pathrecord.p_key", "pkey"),
    ("infiniband.pathrecord.sl", "sl"),
    ("infiniband.pathrecord.mtuselector", "mtu_selector"),
    ("infiniband.pathrecord.mtu", "mtu"),
    ("infiniband.pathrecord.rate", "rate"),
    ("infiniband.pathrecord.packetlifetime", "packet_life_time"),
    ("infiniband.pathrecord.preference", "preference"),
];

fn tshark_num(s: &str) -> u64 {
    match s.strip_prefix("0x") {
        Some(h) => u64::from_str_radix(h, 16).unwrap(),
        None => s.parse().unwrap(),
    }
}

/// The fixture wrapped in ERF records (type 21, InfiniBand), which tshark 4.0 reads (it does
/// not read LINKTYPE_INFINIBAND).
fn as_erf(src: &Path, dst: &Path) {
    use ibcm_mad::frame::link::erf;
    use ibcm_mad::frame::ErfRepr;
    let mut r = CaptureReader::open(src).unwrap();
    let mut w = PcapFileWriter::new(
        std::fs::File::create(dst).unwrap(),
        197,
        TsResolution::Micro,
    )
    .unwrap();
    while let Some(rec) = r.next_record() {
        let rec = rec.unwrap();
        let t = rec.timestamp;
        let mut out = vec![0u8; 16];
        let e = ErfRepr {
            timestamp: (t.as_secs() << 32) | ((u64::from(t.subsec_nanos()) << 32) / 1_000_000_000),
            erf_type: erf::TYPE_INFINIBAND,
            flags: 4,
            rlen: u16::try_from(16 + rec.data.len()).unwrap(),
            lctr: 0,
            wlen: u16::try_from(rec.data.len()).unwrap(),
            ext_headers: 0,
        };
        e.emit(&mut erf::Packet::new_unchecked(&mut out[..]));
        out.extend_from_slice(rec.data);
        w.write(t, &out).unwrap();
    }
    w.into_inner().unwrap();
}

#[test]
fn path_record_fields_agree_with_tshark() {
    if !tshark_available() {
        return;
    }
    let dir = temp_dir("tshark");
    let erf = dir.join("sa.pcap");
    as_erf(&cap(FIXTURE), &erf);
    let mut compared = 0;
    for (file, ours) in [(erf.clone(), erf.clone()), (cap(REAL), cap(REAL))] {
        // Our decode of the same file (the ERF copy decodes as the fixture does).
        let mine: Vec<Value> = lines(&["--json", ours.to_str().unwrap()])
            .into_iter()
            .filter(|v| v["msg"] == "SA")
            .collect();
        assert!(!mine.is_empty(), "{}", file.display());
        let mut cmd = Command::new("tshark");
        cmd.arg("-n")
            .arg("-r")
            .arg(&file)
            .args(["-Y", "infiniband.mad.mgmtclass == 0x03"])
            .args(["-T", "fields", "-E", "separator=\t"])
            .args(["-e", "frame.number", "-e", "infiniband.mad.transactionid"])
            .args([
                "-e",
                "infiniband.mad.method",
                "-e",
                "infiniband.sa.componentmask",
            ]);
        for (f, _) in PATH_FIELDS {
            cmd.args(["-e", f]);
        }
        let out = cmd.output().unwrap();
        let text = String::from_utf8(out.stdout).unwrap();
        let rows: Vec<Vec<&str>> = text.lines().map(|l| l.split('\t').collect()).collect();
        assert_eq!(rows.len(), mine.len(), "{}: {text}", file.display());
        for (row, v) in rows.iter().zip(&mine) {
            let what = format!("{} frame {}", file.display(), row[0]);
            assert_eq!(v["frame"].as_u64(), Some(tshark_num(row[0])), "{what}");
            assert_eq!(
                v["tid"]
                    .as_str()
                    .map(|t| u64::from_str_radix(&t[2..], 16).unwrap()),
                Some(tshark_num(row[1])),
                "{what}"
            );
            assert_eq!(v["method_id"].as_u64(), Some(tshark_num(row[2])), "{what}");
            assert_eq!(
                v["comp_mask"]
                    .as_str()
                    .map(|t| u64::from_str_radix(&t[2..], 16).unwrap()),
                Some(tshark_num(row[3])),
                "{what}"
            );
            let (rec, all) = match v["method"].as_str() {
                Some("GetResp") => (&v["records"][0], true),
                _ => (&v["template"], false),
            };
            for ((tfield, key), t) in PATH_FIELDS.iter().zip(&row[4..]) {
                let o = &rec[*key];
                if !all && o.is_null() {
                    continue;
                }
                let w = format!("{what} {tfield}");
                match *key {
                    "dgid" | "sgid" => assert_eq!(o.as_str(), Some(*t), "{w}"),
                    "reversible" => assert_eq!(o.as_bool(), Some(tshark_num(t) == 1), "{w}"),
                    "mtu" => assert_eq!(o.as_u64(), Some(128 << tshark_num(t)), "{w}"),
                    _ => assert_eq!(o.as_u64(), Some(tshark_num(t)), "{w}"),
                }
                compared += 1;
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    assert!(compared >= 50, "only {compared} values compared");
}

/// The `--json` view on one thread (`-l`, as for a pipe) writes the same lines as on three.
#[test]
fn json_lines_are_the_same_on_one_thread() {
    for f in [FIXTURE, REAL] {
        let a = stdout(&cm_trace(&["--json", &path(f)]));
        let b = stdout(&cm_trace(&["--json", "-l", &path(f)]));
        assert_eq!(a, b, "{f}");
        assert!(a.contains("\"msg\":\"SA\""));
    }
}
