//! cm-trace end to end: the binary on the fixtures (README main job, stdin, raw ERF, errors and
//! exit status, colour, filters, timeline), captures built here to exercise timeouts, bad
//! ICRCs and the memory bound, and the small-size benchmark smoke run (generator → cm-trace
//! --json, and tshark on the same file when it is installed).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use ibcm_trace::{CaptureReader, PcapFileWriter, TsResolution};

const BIN: &str = env!("CARGO_BIN_EXE_cm-trace");

fn cap(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures/captures")
        .join(rel)
}

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("cm-trace-cli-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d.join(name)
}

fn cm_trace(args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .env_remove("NO_COLOR")
        .output()
        .unwrap()
}

fn stdout(o: &Output) -> String {
    String::from_utf8(o.stdout.clone()).unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8(o.stderr.clone()).unwrap()
}

fn p(path: &Path) -> &str {
    path.to_str().unwrap()
}

/// Every record of a capture: (timestamp, link type, bytes).
fn records(path: &Path) -> Vec<(Duration, u32, Vec<u8>)> {
    let mut r = CaptureReader::open(path).unwrap();
    let mut v = Vec::new();
    while let Some(rec) = r.next_record() {
        let rec = rec.unwrap();
        v.push((rec.timestamp, rec.link_type, rec.data.to_vec()));
    }
    v
}

fn write_pcap(path: &Path, link_type: u32, recs: &[(Duration, Vec<u8>)]) {
    let f = std::fs::File::create(path).unwrap();
    let mut w = PcapFileWriter::new(f, link_type, TsResolution::Micro).unwrap();
    for (t, d) in recs {
        w.write(*t, d).unwrap();
    }
    w.into_inner().unwrap();
}

#[test]
fn readme_main_job() {
    let o = cm_trace(&[p(&cap("real/rocev2_mlx_nvme-discover.pcap"))]);
    assert!(o.status.success());
    let s = stdout(&o);
    assert!(s.contains("     5   187.695700  2.2.2.1 → 2.2.2.3  REQ lcid=0x3eb0bde5 sid=0x0000000001061144 (TCP:4420) qpn=0x0000dc psn=0x017c2d RC [NVMe-oF qid=0 hrqsize=32 hsqsize=31]  icrc=ok  conn=1"), "{s}");
    assert!(
        s.contains("-- 65 frames: 5 CM, 60 non-CM, 0 malformed\n"),
        "{s}"
    );
    assert!(
        s.contains("-- non-CM: 25 RoCEv2/IPv4 RC Acknowledge"),
        "{s}"
    );
    assert!(
        s.contains("-- connections: 1 attempted, 1 established, 0 rejected"),
        "{s}"
    );
    assert_eq!(s.lines().filter(|l| l.contains("icrc=")).count(), 5);
}

#[test]
fn unreadable_inputs_fail_but_others_are_decoded() {
    let text = tmp("not-a-capture.txt");
    std::fs::write(&text, "hello, this is not a capture\n").unwrap();
    let empty = tmp("empty.pcap");
    std::fs::write(&empty, b"").unwrap();
    let good = cap("kernel/rej8_no_listener.pcap");
    let o = cm_trace(&["/nonexistent/x.pcap", p(&text), p(&empty), p(&good)]);
    assert_eq!(o.status.code(), Some(1));
    let e = stderr(&o);
    assert!(
        e.contains("cm-trace: /nonexistent/x.pcap: cannot read: No such file or directory"),
        "{e}"
    );
    assert!(
        e.contains("not-a-capture.txt: not a pcap, pcapng or ERF capture"),
        "{e}"
    );
    assert!(e.contains("empty.pcap: empty file"), "{e}");
    let s = stdout(&o);
    assert!(
        s.contains("REJ lcid=0x00000000 rcid=0xe17631d4 reason=8"),
        "{s}"
    );
    // A directory is not a capture either.
    let o = cm_trace(&[p(&cap("kernel"))]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("is a directory"));
}

#[test]
fn damaged_file_reports_and_exits_zero() {
    let src = std::fs::read(cap("kernel/mra_slow_accept.pcap")).unwrap();
    let cut = tmp("cut.pcap");
    // Cut inside the fourth record.
    std::fs::write(&cut, &src[..24 + 3 * (16 + 322) + 100]).unwrap();
    let o = cm_trace(&[p(&cut)]);
    assert!(o.status.success(), "{}", stderr(&o));
    let s = stdout(&o);
    assert_eq!(
        s.lines().filter(|l| l.contains("icrc=ok")).count(),
        3,
        "{s}"
    );
    assert!(s.contains("!! malformed: record 4"), "{s}");
    assert!(s.contains("truncated"), "{s}");
    // JSON view: the report goes to stderr.
    let o = cm_trace(&["--json", p(&cut)]);
    assert!(o.status.success());
    assert!(stderr(&o).contains("malformed: record 4"), "{}", stderr(&o));
    // MADs cut by the snaplen (128) are decoded as far as captured and marked, not malformed.
    let o = cm_trace(&[p(&cap("derived/cm_eth_snap128.pcap"))]);
    assert!(o.status.success());
    assert!(
        stdout(&o).contains("[truncated: 66 of 256 MAD bytes]"),
        "{}",
        stdout(&o)
    );
    assert!(!stdout(&o).contains("malformed: frame"), "{}", stdout(&o));
}

#[test]
fn stdin_is_read() {
    let file = cap("kernel/xrc_handshake_no_qp.pcap");
    let direct = stdout(&cm_trace(&["--json", p(&file)]));
    let mut child = Command::new(BIN)
        .args(["--json", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(&std::fs::read(&file).unwrap())
        .unwrap();
    let o = child.wait_with_output().unwrap();
    assert!(o.status.success());
    assert_eq!(stdout(&o), direct);
    assert_eq!(direct.lines().count(), 5);
    assert!(
        direct.lines().all(|l| l.contains("\"xrc\":true")),
        "{direct}"
    );
}

/// Writes the records of an ERF-in-pcap capture as a raw ERF file (records padded to rlen).
fn raw_erf(from: &Path, to: &Path) {
    let mut out = Vec::new();
    for (_, lt, d) in records(from) {
        assert_eq!(lt, 197);
        let rlen = usize::from(u16::from_be_bytes([d[10], d[11]]));
        let mut rec = d.clone();
        rec.resize(rlen.max(d.len()), 0);
        if rec.len() > rlen {
            let n = rec.len() as u16;
            rec[10..12].copy_from_slice(&n.to_be_bytes());
        }
        out.extend_from_slice(&rec);
    }
    std::fs::write(to, out).unwrap();
}

#[test]
fn raw_erf_file_matches_erf_in_pcap() {
    for name in ["ib_erf_infiniband", "ib_erf_rdma_ping"] {
        let pcap = cap(&format!("real/{name}.pcap"));
        let erf = tmp(&format!("{name}.erf"));
        raw_erf(&pcap, &erf);
        // The pcap record times are microseconds; the ERF headers carry finer ones.
        let strip = |s: String| -> Vec<serde_json::Value> {
            s.lines()
                .map(|l| {
                    let mut v: serde_json::Value = serde_json::from_str(l).unwrap();
                    let t = v["time"].as_f64().unwrap();
                    v["time"] = serde_json::json!(((t * 1e5).round() as u64) / 10);
                    v
                })
                .collect()
        };
        let a = strip(stdout(&cm_trace(&["--json", p(&pcap)])));
        let b = strip(stdout(&cm_trace(&["--json", p(&erf)])));
        assert!(!a.is_empty());
        assert_eq!(a, b, "{name}");
        let t = stdout(&cm_trace(&[p(&erf)]));
        assert!(t.contains("IB LNH") || t.contains("LID"), "{t}");
    }
}

#[test]
fn colour_follows_flag_and_no_color() {
    let f = cap("kernel/rej28_consumer_private_data.pcap");
    let always = stdout(&cm_trace(&["--color", "always", p(&f)]));
    assert!(always.contains("\x1b["), "{always}");
    let never = stdout(&cm_trace(&["--color", "never", p(&f)]));
    assert!(!never.contains('\x1b'));
    // auto: not a terminal here, so no colour; and NO_COLOR is respected.
    let auto = stdout(&cm_trace(&[p(&f)]));
    assert!(!auto.contains('\x1b'));
    let o = Command::new(BIN)
        .args(["--ladder", p(&f)])
        .env("NO_COLOR", "1")
        .output()
        .unwrap();
    assert!(!stdout(&o).contains('\x1b'));
    // JSON is never coloured.
    let json = stdout(&cm_trace(&["--json", "--color", "always", p(&f)]));
    assert!(!json.contains('\x1b'));
    assert_eq!(never, auto);
}

fn kernel_files() -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(cap("kernel"))
        .unwrap()
        .flatten()
        .map(|e| e.path().to_string_lossy().to_string())
        .filter(|p| p.ends_with(".pcap"))
        .collect();
    v.sort();
    v
}

fn json_lines(args: &[&str]) -> Vec<serde_json::Value> {
    let mut a = vec!["--json"];
    a.extend_from_slice(args);
    let o = cm_trace(&a);
    assert!(o.status.success(), "{}", stderr(&o));
    stdout(&o)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn filters() {
    let files = kernel_files();
    let f: Vec<&str> = files.iter().map(String::as_str).collect();
    let with = |extra: &[&str]| {
        let mut a = extra.to_vec();
        a.extend_from_slice(&f);
        json_lines(&a)
    };
    // Message types.
    let rej = with(&["-m", "REJ"]);
    assert_eq!(rej.len(), 2);
    assert!(rej.iter().all(|v| v["msg"] == "REJ"));
    let two = with(&["-m", "mra,rej"]);
    assert_eq!(two.len(), 3);
    // XRC only: every message of the XRC connection, nothing else.
    let xrc = with(&["--xrc"]);
    assert_eq!(xrc.len(), 5);
    assert!(xrc.iter().all(|v| v["xrc"] == true));
    // Service ID: the REQ and, through the connection, the REJ.
    let sid = with(&["-s", "0x0000000001061b5b"]);
    let msgs: Vec<&str> = sid.iter().map(|v| v["msg"].as_str().unwrap()).collect();
    assert_eq!(msgs, ["REQ", "REJ"]);
    // Comm ID of the passive side: its REP, and everything of that connection after it (the
    // REQ went by before that ID was known); the active side's ID selects all five.
    let cid = with(&["-c", "0xf336d9f3"]);
    assert_eq!(cid.len(), 4, "{cid:?}");
    assert_eq!(with(&["-c", "0xe57631d4"]).len(), 5);
    // Address: nothing else than 10.77.0.x in these files.
    assert_eq!(with(&["-a", "10.77.0.1"]).len(), 142);
    assert_eq!(with(&["-a", "10.9.9.9"]).len(), 0);
    // Problems: the two retransmitted REQs, the MRA after one, and the two REJs.
    let prob = with(&["--problems", "-m", "REQ,REJ"]);
    assert_eq!(prob.len(), 4, "{prob:?}");
    assert_eq!(
        prob.iter().filter(|v| v["retrans"] == true).count(),
        2,
        "{prob:?}"
    );
    // Connection views filter connections.
    let o = cm_trace(&[&["--ladder", "--json", "--problems"], &f[..]].concat());
    let conns: Vec<serde_json::Value> = stdout(&o)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(conns.len(), 4);
    let o = cm_trace(&[&["--stats", "--json", "--xrc"], &f[..]].concat());
    let v: serde_json::Value = serde_json::from_str(stdout(&o).trim()).unwrap();
    assert_eq!(v["attempted"], 1);
    assert_eq!(v["xrc"], 1);
    // Bad filter values are usage errors.
    let o = cm_trace(&["-m", "BOGUS", p(&cap("kernel/rping_3.pcap"))]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("unknown message type"));
}

#[test]
fn stats_json_has_the_documented_keys() {
    let files = kernel_files();
    let mut a = vec!["--stats", "--json"];
    a.extend(files.iter().map(String::as_str));
    let o = cm_trace(&a);
    assert!(o.status.success());
    let s = stdout(&o);
    assert_eq!(s.lines().count(), 1, "one object");
    let v: serde_json::Value = serde_json::from_str(&s).unwrap();
    assert_eq!(v["attempted"], 29);
    assert_eq!(v["established"], 27);
    assert_eq!(v["rejected"]["8"], 1);
    assert_eq!(v["rejected"]["28"], 1);
    assert_eq!(v["timed_out"], 0);
    assert_eq!(v["retransmissions"], 2);
    assert_eq!(v["mras"], 1);
    for k in ["p50", "p99", "max"] {
        assert!(v["setup_ms"][k].as_f64().unwrap() > 0.0, "{k}");
    }
    assert!(v["by_service"].as_array().unwrap().len() >= 9);
}

/// A REQ that is sent three times and never answered, then other traffic a minute later: a
/// timeout. Plus a CM MAD with a corrupted byte: a bad ICRC.
/// A RoCEv2/IPv4 Ethernet frame (no VLAN) with its BTH PSN increased by `add`, ICRC recomputed.
fn with_psn(frame: &[u8], add: u32) -> Vec<u8> {
    let mut f = frame.to_vec();
    assert_eq!(&f[12..14], &[0x08, 0x00]);
    let psn = 14 + 20 + 8 + 9;
    let old = u32::from_be_bytes([0, f[psn], f[psn + 1], f[psn + 2]]);
    let new = (old + add) & 0x00ff_ffff;
    f[psn..psn + 3].copy_from_slice(&new.to_be_bytes()[1..]);
    let ip_len = usize::from(u16::from_be_bytes([f[16], f[17]]));
    let at = 14 + ip_len - 4;
    let crc = ibcm_mad::frame::icrc::rocev2_frame_icrc(&f).unwrap();
    f[at..at + 4].copy_from_slice(&crc.to_le_bytes());
    f
}

#[test]
fn timeout_and_bad_icrc() {
    let recs = records(&cap("kernel/rej28_consumer_private_data.pcap"));
    let req = recs.iter().find(|r| r.2.len() > 300).unwrap().2.clone();
    let arp = recs.iter().find(|r| r.2.len() < 100).unwrap().2.clone();
    // The DREP of another capture, with a flipped private-data bit: a valid DREP, wrong ICRC.
    let mut bad = records(&cap("kernel/rping_3.pcap")).pop().unwrap().2;
    bad[200] ^= 0x01;
    let t0 = Duration::from_secs(1_700_000_000);
    let f = tmp("timeout.pcap");
    write_pcap(
        &f,
        1,
        &[
            (t0, req.clone()),
            // Retransmissions are new QP1 packets: new BTH PSN (the same PSN would be the same
            // packet captured twice, a duplicate capture).
            (t0 + Duration::from_millis(6144), with_psn(&req, 1)),
            (t0 + Duration::from_millis(12288), with_psn(&req, 2)),
            (t0 + Duration::from_secs(60), arp),
            (t0 + Duration::from_secs(61), bad),
        ],
    );
    let o = cm_trace(&[p(&f)]);
    let s = stdout(&o);
    assert!(
        s.contains("!! timeout: conn 1: timed out: REQ sent 3 times, no REP"),
        "{s}"
    );
    assert!(s.contains("icrc=bad"), "{s}");
    assert!(s.contains("1 CM with bad ICRC"), "{s}");
    let o = cm_trace(&["--stats", "--json", p(&f)]);
    let v: serde_json::Value = serde_json::from_str(stdout(&o).trim()).unwrap();
    assert_eq!(v["timed_out"], 1);
    assert_eq!(v["partial"], 1, "the lone DREP");
    assert_eq!(v["retransmissions"], 2);
    assert_eq!(v["bad_icrc"], 1);
    let o = cm_trace(&["--ladder", p(&f)]);
    let s = stdout(&o);
    assert!(s.contains("retransmission #2"), "{s}");
    assert!(s.contains("bad ICRC"), "{s}");
    // --problems keeps the retransmissions and the bad-ICRC MAD.
    let v = json_lines(&["--problems", p(&f)]);
    assert_eq!(v.len(), 3, "{v:?}");
}

#[test]
fn timeline_is_written() {
    let svg = tmp("t.svg");
    let html = tmp("t.html");
    let f = cap("kernel/mra_slow_accept.pcap");
    for out in [&svg, &html] {
        let o = cm_trace(&["--stats", "--timeline", p(out), p(&f)]);
        assert!(o.status.success());
        assert!(stderr(&o).contains("timeline with 1 connection(s) written"));
    }
    let s = std::fs::read_to_string(&svg).unwrap();
    assert!(s.starts_with("<svg") && s.contains("retransmission") && s.contains("MRA"));
    assert!(std::fs::read_to_string(&html)
        .unwrap()
        .starts_with("<!DOCTYPE html>"));
}

fn generated(packets: u64, name: &str) -> PathBuf {
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/captures");
    let templates: Vec<_> = ibcm_trace::default_template_paths(&fixtures)
        .iter()
        .map(|p| ibcm_trace::load_template(p).unwrap())
        .collect();
    let path = tmp(name);
    let f = std::io::BufWriter::new(std::fs::File::create(&path).unwrap());
    let cfg = ibcm_trace::GenConfig {
        packets,
        ..Default::default()
    };
    let s = ibcm_trace::generate(&templates, &cfg, f).unwrap();
    assert!(s.packets >= packets);
    path
}

/// Many connections with a tiny table: connections are finished early (evicted), memory stays
/// bounded, and nothing is lost from the per-MAD view.
#[test]
fn memory_bound_evicts() {
    let f = generated(20_000, "bound.pcap");
    let o = cm_trace(&["--stats", "--json", "--max-conns", "64", p(&f)]);
    assert!(o.status.success());
    let v: serde_json::Value = serde_json::from_str(stdout(&o).trim()).unwrap();
    assert!(v["evicted"].as_u64().unwrap() > 0, "{v}");
    assert!(v["peak_live_connections"].as_u64().unwrap() <= 64, "{v}");
    assert!(v["cm_mads"].as_u64().unwrap() >= 20_000);
    let o = cm_trace(&["--stats", "--json", p(&f)]);
    let full: serde_json::Value = serde_json::from_str(stdout(&o).trim()).unwrap();
    assert_eq!(full["evicted"], 0);
    // Every template instance is one connection: the generator's connection count.
    assert!(full["attempted"].as_u64().unwrap() > 4000, "{full}");
    assert_eq!(full["timed_out"], 0, "{full}");
    assert_eq!(
        full["rejected"]["8"], full["rejected"]["28"],
        "one of each reject template per round: {full}"
    );
}

/// The benchmark's smoke variant: a small generated capture through cm-trace --json and, when
/// tshark is installed, through `tshark -T fields` with the same fields; both see every
/// packet and agree on frame, attribute, TID and comm IDs.
#[test]
fn bench_smoke_generated_capture_vs_tshark() {
    let f = generated(3_000, "smoke.pcap");
    let lines = json_lines(&[p(&f)]);
    assert!(lines.len() >= 3_000);
    let tshark_ok = Command::new("tshark")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !tshark_ok {
        if std::env::var_os("IBCM_REQUIRE_TSHARK").is_some_and(|v| v != "0") {
            panic!("tshark is required (IBCM_REQUIRE_TSHARK=1) but cannot be run");
        }
        // Written to the process's stderr directly: libtest captures `eprintln!` of a
        // passing test, and a skip must be seen.
        let _ = std::io::Write::write_fmt(
            &mut std::io::stderr(),
            format_args!(
                "\n*** bench_smoke_generated_capture_vs_tshark: tshark part SKIPPED: the `tshark` \
             binary was not found (DEBIAN_FRONTEND=noninteractive apt-get install -y tshark).\n"
            ),
        );
        return;
    }
    let o = Command::new("tshark")
        .args(["-n", "-r", p(&f), "-T", "fields", "-E", "separator=\t"])
        .args(["-e", "frame.number", "-e", "infiniband.mad.attributeid"])
        .args(["-e", "infiniband.mad.transactionid"])
        .args(["-e", "infiniband.cm.req", "-e", "infiniband.cm.rep"])
        .args(["-e", "infiniband.cm.rtu.localcommid"])
        .args(["-e", "infiniband.cm.rej.localcommid"])
        .args(["-e", "infiniband.cm.dreq.localcommid"])
        .args(["-e", "infiniband.cm.drsp.localcommid"])
        .output()
        .unwrap();
    assert!(o.status.success());
    let rows: Vec<Vec<String>> = String::from_utf8(o.stdout)
        .unwrap()
        .lines()
        .map(|l| l.split('\t').map(str::to_string).collect())
        .collect();
    assert_eq!(rows.len(), lines.len());
    let hex = |s: &str| u64::from_str_radix(s.trim_start_matches("0x"), 16).ok();
    for (row, v) in rows.iter().zip(&lines) {
        assert_eq!(row[0].parse::<u64>().unwrap(), v["frame"].as_u64().unwrap());
        assert_eq!(hex(&row[1]), v["attr_id"].as_u64());
        assert_eq!(hex(&row[2]), v["tid"].as_str().and_then(hex));
        let lcid = row[3..].iter().find(|s| !s.is_empty()).and_then(|s| hex(s));
        if let Some(l) = lcid {
            assert_eq!(Some(l), v["local_comm_id"].as_u64(), "{row:?} {v}");
        }
    }
}
