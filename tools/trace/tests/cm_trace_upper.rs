//! Upper layers in private data (NVMe-oF against tshark's nvme-rdma dissector, IPoIB-CM),
//! the rdma_cm event a failed connection gives the application, and slow setups / teardowns.
//! Captures that need a reject, a timeout or a slow teardown are built here from the
//! bundled ones (frame bytes edited; their ICRC is then wrong, which does not matter here).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use ibcm_trace::{CaptureReader, PcapFileWriter, TsResolution};
use serde_json::Value;

mod common;
use common::{cap, cm_trace, stdout};

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("cm-trace-upper-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d.join(name)
}

fn json(args: &[&str]) -> Vec<Value> {
    stdout(&cm_trace(args))
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

type Rec = (Duration, u32, Vec<u8>);

fn records(path: &Path) -> Vec<Rec> {
    let mut r = CaptureReader::open(path).unwrap();
    let mut v = Vec::new();
    while let Some(rec) = r.next_record() {
        let rec = rec.unwrap();
        v.push((rec.timestamp, rec.link_type, rec.data.to_vec()));
    }
    v
}

fn write(path: &Path, recs: &[Rec]) {
    let mut w = PcapFileWriter::new(
        std::fs::File::create(path).unwrap(),
        recs[0].1,
        TsResolution::Micro,
    )
    .unwrap();
    for (t, _, d) in recs {
        w.write(*t, d).unwrap();
    }
    w.into_inner().unwrap();
}

/// Frame offset of MAD byte 0 in the RoCEv2/IPv4 frames used here (Ethernet 14, IPv4 20,
/// UDP 8, BTH 12, DETH 8).
const MAD: usize = 62;

#[test]
fn nvme_fields_agree_with_tshark_and_the_bytes() {
    let f = cap("real/rocev2_mlx_nvme-discover2.pcap");
    let v = json(&["--json", f.to_str().unwrap()]);
    let req = &v[0];
    assert_eq!(req["ulp"], "NVMe-oF");
    assert_eq!(req["upper"]["protocol"], "NVMe-oF");
    // The REQ user data after the 36-byte rdma_cm header: 00 00 | 00 00 | 20 00 | 1f 00.
    let recs = records(&f);
    let user = &recs[0].2[MAD + 164 + 36..];
    assert_eq!(&user[..8], &[0, 0, 0, 0, 0x20, 0, 0x1f, 0]);
    assert_eq!(req["upper"]["qid"], 0);
    assert_eq!(req["upper"]["hrqsize"], 32);
    assert_eq!(req["upper"]["hsqsize"], 31);
    // REP: tshark's nvme-rdma dissector.
    for file in [
        "real/rocev2_mlx_nvme-discover.pcap",
        "real/rocev2_mlx_nvme-discover2.pcap",
    ] {
        let f = cap(file);
        let Ok(o) = Command::new("tshark")
            .arg("-r")
            .arg(&f)
            .args(["-Y", "nvme-rdma.cm.rsp.crqsize", "-T", "fields"])
            .args(["-e", "frame.number", "-e", "nvme-rdma.cm.rsp.crqsize"])
            .output()
        else {
            let _ = std::io::Write::write_fmt(
                &mut std::io::stderr(),
                format_args!("\n!!! SKIPPED the tshark half: `tshark` not found !!!\n"),
            );
            assert!(std::env::var_os("IBCM_REQUIRE_TSHARK").is_none());
            return;
        };
        let theirs: Vec<(u64, u64)> = String::from_utf8(o.stdout)
            .unwrap()
            .lines()
            .map(|l| {
                let (a, b) = l.split_once('\t').unwrap();
                (a.parse().unwrap(), b.parse().unwrap())
            })
            .collect();
        let ours: Vec<(u64, u64)> = json(&["--json", "-Y", "msg == REP", f.to_str().unwrap()])
            .iter()
            .map(|v| {
                (
                    v["frame"].as_u64().unwrap(),
                    v["upper"]["crqsize"].as_u64().unwrap(),
                )
            })
            .collect();
        assert!(!theirs.is_empty());
        assert_eq!(ours, theirs, "{file}");
    }
    // The text view and -Y.
    let t = stdout(&cm_trace(&["-Y", "nvme.qsize == 33", f.to_str().unwrap()]));
    assert!(
        t.contains("REP ") && t.contains("[NVMe-oF crqsize=33]"),
        "{t}"
    );
}

#[test]
fn ipoib_cm_service_id_and_private_data() {
    let f = cap("real/ib_erf_infiniband.pcap");
    let v = json(&["--json", f.to_str().unwrap()]);
    let req = &v[0];
    assert_eq!(req["service_id"], "0x1000000000000404");
    assert_eq!(req["ulp"], "IPoIB-CM");
    assert_eq!(req["upper"]["qpn"], 0x405);
    assert_eq!(req["upper"]["mtu"], 65524);
    let verbose = stdout(&cm_trace(&["-V", f.to_str().unwrap()]));
    assert!(
        verbose.contains("Upper layer (Service ID): IPoIB-CM"),
        "{verbose}"
    );
    assert!(verbose.contains("Upper layer (private data): IPoIB-CM qpn=0x000405 mtu=65524"));
}

/// The NVMe REQ of nvme-discover2 and an NVMe reject (REJ 28, NVMe status 6: no resources)
/// made from the kernel's REJ 28 frame with its comm IDs pointed at that REQ.
fn nvme_reject_capture() -> PathBuf {
    let req = records(&cap("real/rocev2_mlx_nvme-discover2.pcap")).remove(0);
    let mut rej = records(&cap("kernel/rej28_consumer_private_data.pcap")).remove(1);
    let d = &mut rej.2;
    assert_eq!(d[MAD + 1], 0x07, "a CM MAD");
    // REJ: Local Comm ID at MAD 24, Remote Comm ID at 28 (= the REQ's Local Comm ID).
    let req_lcid = req.2[MAD + 24..MAD + 28].to_vec();
    d[MAD + 28..MAD + 32].copy_from_slice(&req_lcid);
    // Private data at MAD 108: RECFMT 0, STS 6 (little-endian), the rest zero.
    d[MAD + 108..MAD + 256].fill(0);
    d[MAD + 108..MAD + 112].copy_from_slice(&[0, 0, 6, 0]);
    // Same addresses as the REQ, the other way round.
    d[..MAD].copy_from_slice(&req.2[..MAD]);
    d[6..12].copy_from_slice(&req.2[..6]);
    d[..6].copy_from_slice(&req.2[6..12]);
    d[26..30].copy_from_slice(&req.2[30..34]);
    d[30..34].copy_from_slice(&req.2[26..30]);
    let path = tmp("nvme_reject.pcap");
    let t = req.0;
    write(
        &path,
        &[
            req.clone(),
            (t + Duration::from_millis(3), req.1, rej.2.clone()),
        ],
    );
    path
}

#[test]
fn nvme_reject_status_and_rdma_cm_event() {
    let path = nvme_reject_capture();
    let v = json(&["--json", path.to_str().unwrap()]);
    let rej = &v[1];
    assert_eq!(rej["msg"], "REJ");
    assert_eq!(rej["conn"], 1, "{rej}");
    assert_eq!(rej["upper"]["status"], 6, "{rej}");
    assert_eq!(rej["upper"]["status_name"], "no resources");
    let t = stdout(&cm_trace(&[
        "-Y",
        "nvme.status == 6",
        path.to_str().unwrap(),
    ]));
    assert!(t.contains("[NVMe-oF status=6 (no resources)]"), "{t}");
    let l = json(&["--ladder", "--json", path.to_str().unwrap()]);
    assert_eq!(l[0]["rdma_cm_event"]["event"], "RDMA_CM_EVENT_REJECTED");
    assert_eq!(l[0]["rdma_cm_event"]["side"], "active");
    assert_eq!(l[0]["rdma_cm_event"]["status"], 28);
}

#[test]
fn rejects_map_to_rejected_with_the_reason() {
    for (file, reason) in [
        ("kernel/rej28_consumer_private_data.pcap", 28),
        ("kernel/rej8_no_listener.pcap", 8),
    ] {
        let f = cap(file);
        let l = json(&["--ladder", "--json", f.to_str().unwrap()]);
        assert_eq!(
            l[0]["rdma_cm_event"]["event"], "RDMA_CM_EVENT_REJECTED",
            "{file}"
        );
        assert_eq!(l[0]["rdma_cm_event"]["status"], reason, "{file}");
        let t = stdout(&cm_trace(&["--ladder", f.to_str().unwrap()]));
        assert!(
            t.contains(&format!(
                "rdma_cm: the active side's application gets RDMA_CM_EVENT_REJECTED (status {reason})"
            )),
            "{t}"
        );
    }
    // Established connections get no such line.
    let t = stdout(&cm_trace(&[
        "--ladder",
        cap("kernel/rping_3.pcap").to_str().unwrap(),
    ]));
    assert!(!t.contains("rdma_cm:"), "{t}");
}

#[test]
fn unanswered_req_is_unreachable_etimedout() {
    let req = records(&cap("real/rocev2_mlx_nvme-discover2.pcap")).remove(0);
    // The REQ, then another connection's REQ 1000 s later: far past the first one's timeouts
    // (the tracker's clock is the CM messages').
    let later = records(&cap("kernel/rej8_no_listener.pcap")).remove(0);
    let path = tmp("req_unanswered.pcap");
    write(
        &path,
        &[
            req.clone(),
            (req.0 + Duration::from_secs(1000), later.1, later.2),
        ],
    );
    let l = json(&["--ladder", "--json", path.to_str().unwrap()]);
    assert_eq!(l[0]["outcome"], "timed_out", "{}", l[0]);
    assert_eq!(l[0]["rdma_cm_event"]["event"], "RDMA_CM_EVENT_UNREACHABLE");
    assert_eq!(l[0]["rdma_cm_event"]["side"], "active");
    assert_eq!(l[0]["rdma_cm_event"]["status"], -110);
}

#[test]
fn slow_setups_and_teardowns_are_flagged() {
    // mra_slow_accept: REQ → RTU over 4 s behind an MRA.
    let f = cap("kernel/mra_slow_accept.pcap");
    let s: Value = serde_json::from_str(&stdout(&cm_trace(&[
        "--stats",
        "--json",
        f.to_str().unwrap(),
    ])))
    .unwrap();
    assert_eq!(s["slow_setups"], 1);
    assert_eq!(s["slow_teardowns"], 0);
    let t = stdout(&cm_trace(&["--ladder", f.to_str().unwrap()]));
    assert!(t.contains("SLOW SETUP (over 1.000 s)"), "{t}");
    // nvme-discover with its DREP moved 10 s after the DREQ.
    let mut recs = records(&cap("real/rocev2_mlx_nvme-discover.pcap"));
    let drep = recs
        .iter()
        .position(|r| r.2.len() >= MAD + 256 && r.2[MAD + 1] == 0x07 && r.2[MAD + 17] == 0x16)
        .unwrap();
    let dreq_t = recs
        .iter()
        .find(|r| r.2.len() >= MAD + 256 && r.2[MAD + 1] == 0x07 && r.2[MAD + 17] == 0x15)
        .unwrap()
        .0;
    let mut moved = recs.remove(drep);
    moved.0 = dreq_t + Duration::from_secs(10);
    recs.retain(|r| r.0 <= moved.0);
    recs.push(moved);
    let path = tmp("slow_teardown.pcap");
    write(&path, &recs);
    let l = json(&["--ladder", "--json", path.to_str().unwrap()]);
    assert_eq!(l[0]["outcome"], "closed", "{}", l[0]);
    assert_eq!(l[0]["slow_teardown"], true, "{}", l[0]);
    assert!(l[0].get("slow_setup").is_none());
    let s: Value = serde_json::from_str(&stdout(&cm_trace(&[
        "--stats",
        "--json",
        path.to_str().unwrap(),
    ])))
    .unwrap();
    assert_eq!(s["slow_teardowns"], 1);
    let t = stdout(&cm_trace(&["--stats", path.to_str().unwrap()]));
    assert!(
        t.contains("slow teardowns         1  (over 1.000 s)"),
        "{t}"
    );
}
