//! The real and derived captures through cm-trace's decoder: golden identifiers from
//! fixtures/MANIFEST.md, ICRC verdicts, link-type variants, truncation.

use std::path::PathBuf;

use ibcm_mad::{AttrId, CmMessage, CommId, Qpn, ServiceId, Tid};
use ibcm_tests::{all_captures, classify_file, fixtures_dir};
use ibcm_trace::{CmEvent, Icrc, Item};

fn cap(rel: &str) -> PathBuf {
    fixtures_dir().join("captures").join(rel)
}

fn cm_events(rel: &str) -> Vec<CmEvent> {
    classify_file(&cap(rel))
        .into_iter()
        .filter_map(|i| match i {
            Item::Cm(e) => Some(e),
            _ => None,
        })
        .collect()
}

#[test]
fn every_capture_decodes() {
    let caps = all_captures();
    assert!(caps.len() >= 20, "fixtures missing: {caps:?}");
    for c in caps {
        let name = c.file_name().unwrap().to_string_lossy().to_string();
        let items = classify_file(&c);
        assert!(!items.is_empty(), "{name}: no records");
        let malformed: Vec<_> = items
            .iter()
            .filter_map(|i| match i {
                Item::Malformed { frame, reason } => Some((*frame, reason.clone())),
                _ => None,
            })
            .collect();
        assert!(
            malformed.is_empty(),
            "{name}: malformed frames: {malformed:?}"
        );
        if name == "cm_eth_snap128.pcap" {
            // Cut by the snaplen: decoded as far as captured (66 MAD bytes), no ICRC verdict.
            for i in &items {
                let Item::Cm(e) = i else {
                    panic!("{name}: not a CM event: {i:?}");
                };
                assert_eq!(e.captured, Some(66), "{name} frame {}", e.frame);
                assert_eq!(e.icrc, Icrc::NotCaptured, "{name} frame {}", e.frame);
            }
        }
    }
}

/// (file, REQ local comm ID, service ID, REQ QPN, REP local comm ID, REP QPN, REQ TID): the
/// table "CM identifiers in the real CM captures" of fixtures/MANIFEST.md (tshark 4.0.17).
const GOLDEN: [(&str, u32, u64, u32, u32, u32, u64); 6] = [
    (
        "real/rocev2_mlx_nvme-discover.pcap",
        0x3eb0_bde5,
        0x0000_0000_0106_1144,
        0x0000dc,
        0xe8ac_7105,
        0x00008d,
        0x0000_0002_e5bd_b03e,
    ),
    (
        "real/rocev2_mlx_nvme-discover2.pcap",
        0x73ad_c2cc,
        0x0000_0000_0106_1144,
        0x000106,
        0xdcc7_1046,
        0x0008ca,
        0x0000_0002_ccc2_ad73,
    ),
    (
        "real/rocev2_ibdump_write.pcap",
        0x71ef_7529,
        0x0000_0000_0106_00ac,
        0x000137,
        0xc25b_8b76,
        0x000167,
        0x0000_000b_2975_ef71,
    ),
    (
        "real/rocev2_ibdump_read2.pcap",
        0x73ef_7529,
        0x0000_0000_0106_3039,
        0x000139,
        0xd65b_8b76,
        0x000169,
        0x0000_000b_2975_ef73,
    ),
    (
        "real/rocev2_ibdump_send.pcap",
        0x72ef_7529,
        0x0000_0000_0106_3039,
        0x00013a,
        0xd05b_8b76,
        0x00016a,
        0x0000_000b_2975_ef72,
    ),
    (
        "real/ib_erf_rdma_ping.pcap",
        0x30ab_0075,
        0x0000_0000_0106_1c06,
        0x000029,
        0x18db_9f3c,
        0x000029,
        0x0000_000e_7500_ab30,
    ),
];

#[test]
fn golden_req_rep_rtu_dreq_drep() {
    for (file, req_id, sid, req_qpn, rep_id, rep_qpn, tid) in GOLDEN {
        let ev = cm_events(file);
        let kinds: Vec<AttrId> = ev.iter().map(|e| e.mad.msg.attr_id()).collect();
        assert_eq!(
            kinds,
            [
                AttrId::Req,
                AttrId::Rep,
                AttrId::Rtu,
                AttrId::Dreq,
                AttrId::Drep
            ],
            "{file}"
        );
        let CmMessage::Req(req) = ev[0].mad.msg else {
            panic!()
        };
        assert_eq!(req.local_comm_id, CommId(req_id), "{file}");
        assert_eq!(req.service_id, ServiceId(sid), "{file}");
        assert_eq!(req.local_qpn, Qpn::new(req_qpn).unwrap(), "{file}");
        assert_eq!(ev[0].mad.header.tid, Tid(tid), "{file}");
        // Linux puts the local comm ID, byte-swapped, in the low TID half.
        assert_eq!((tid as u32).swap_bytes(), req_id, "{file}");
        let CmMessage::Rep(rep) = ev[1].mad.msg else {
            panic!()
        };
        assert_eq!(rep.local_comm_id, CommId(rep_id), "{file}");
        assert_eq!(rep.remote_comm_id, CommId(req_id), "{file}");
        assert_eq!(rep.local_qpn, Qpn::new(rep_qpn).unwrap(), "{file}");
        assert_eq!(
            ev[1].mad.header.tid,
            Tid(tid),
            "{file}: REP reuses the REQ TID"
        );
        let CmMessage::Rtu(rtu) = ev[2].mad.msg else {
            panic!()
        };
        assert_eq!(
            (rtu.local_comm_id, rtu.remote_comm_id),
            (CommId(req_id), CommId(rep_id))
        );
        // DREQ from either side; the DREP answers it with the IDs swapped.
        let CmMessage::Dreq(dreq) = ev[3].mad.msg else {
            panic!()
        };
        let CmMessage::Drep(drep) = ev[4].mad.msg else {
            panic!()
        };
        assert_eq!(drep.local_comm_id, dreq.remote_comm_id, "{file}");
        assert_eq!(drep.remote_comm_id, dreq.local_comm_id, "{file}");
        let ids = [CommId(req_id), CommId(rep_id)];
        assert!(ids.contains(&dreq.local_comm_id) && ids.contains(&dreq.remote_comm_id));
        // Remote QPN in the DREQ is the other side's QPN.
        let expect_qpn = if dreq.local_comm_id == CommId(req_id) {
            rep_qpn
        } else {
            req_qpn
        };
        assert_eq!(
            dreq.remote_qpn_eecn,
            Qpn::new(expect_qpn).unwrap(),
            "{file}"
        );
        assert_eq!(ev[4].mad.header.tid, ev[3].mad.header.tid, "{file}");
        for e in &ev {
            assert_eq!(e.icrc, Icrc::Ok, "{file} frame {}", e.frame);
        }
    }
}

#[test]
fn ipoib_cm_sample() {
    let ev = cm_events("real/ib_erf_infiniband.pcap");
    assert_eq!(ev.len(), 9);
    let frames: Vec<u64> = ev.iter().map(|e| e.frame).collect();
    assert_eq!(frames, [7, 8, 9, 27, 28, 29, 34, 35, 37]);
    let CmMessage::Req(req) = ev[0].mad.msg else {
        panic!()
    };
    assert_eq!(req.local_comm_id, CommId(0xe948_8627));
    assert_eq!(req.service_id, ServiceId(0x1000_0000_0000_0404));
    assert_eq!(req.local_qpn, Qpn::new(0x87_0408).unwrap());
    assert_eq!(ev[0].mad.header.tid, Tid(0x0000_0010_2786_48e9));
    let CmMessage::Rep(rep) = ev[1].mad.msg else {
        panic!()
    };
    assert_eq!(rep.local_comm_id, CommId(0xf902_4539));
    assert_eq!(rep.local_qpn, Qpn::new(0xfc_0407).unwrap());
}

fn same_messages(a: &[CmEvent], b: &[CmEvent]) -> bool {
    a.len() == b.len()
        && a.iter()
            .zip(b)
            .all(|(x, y)| x.mad == y.mad && x.frame == y.frame && x.icrc == y.icrc)
}

#[test]
fn link_type_variants_match_cm_eth() {
    let base = cm_events("derived/cm_eth.pcap");
    assert_eq!(base.len(), 5);
    for v in [
        "cm_eth.pcapng",
        "cm_eth_ns.pcap",
        "cm_vlan.pcap",
        "cm_qinq.pcap",
        "cm_raw101.pcap",
        "cm_ipv4_228.pcap",
        "cm_sll113.pcap",
        "cm_sll2_276.pcap",
    ] {
        let ev = cm_events(&format!("derived/{v}"));
        assert!(same_messages(&base, &ev), "{v}: {ev:?}");
        for (x, y) in base.iter().zip(&ev) {
            assert_eq!(x.time, y.time, "{v}: timestamps");
            assert_eq!((x.src, x.dst), (y.src, y.dst), "{v}: addresses");
        }
    }
    // And they are the first five CM frames of the real capture they were cut from.
    let real = cm_events("real/rocev2_mlx_nvme-discover.pcap");
    for (x, y) in base.iter().zip(&real) {
        assert_eq!(x.mad, y.mad);
    }
}

#[test]
fn ib_erf_and_linktype_247_agree() {
    let erf = cm_events("real/ib_erf_infiniband.pcap");
    let raw = cm_events("derived/ib_linktype247_from_erf.pcap");
    assert!(same_messages(&erf, &raw));
}

#[test]
fn icrc_verdicts() {
    // The bad-ICRC capture has no CM: check every IB packet of every real capture here.
    for c in all_captures() {
        let name = c.file_name().unwrap().to_string_lossy().to_string();
        if !c.to_string_lossy().contains("/real/") {
            continue;
        }
        let mut r = ibcm_trace::CaptureReader::open(&c).unwrap();
        let (mut ok, mut bad) = (0, 0);
        while let Some(rec) = r.next_record() {
            let rec = rec.unwrap();
            if let Ok(ibcm_mad::frame::Decoded::Ib(p)) =
                ibcm_mad::frame::decode(rec.link_type, rec.data)
            {
                if p.icrc.is_ok() {
                    ok += 1;
                } else if p.icrc.is_bad() {
                    bad += 1;
                }
            }
        }
        if name == "rocev2_nocm_bad_icrc_rc-small.pcap" {
            assert_eq!((ok, bad), (0, 21), "{name}");
        } else {
            assert_eq!(bad, 0, "{name}");
            assert!(ok > 0, "{name}");
        }
    }
}

#[test]
fn synthetic_messages_and_ipv6() {
    let ev = cm_events("derived/synth_attrs.pcap");
    let names: Vec<&str> = ev.iter().map(|e| e.mad.msg.name()).collect();
    assert_eq!(
        names,
        ["MRA", "REJ", "SIDR_REQ", "SIDR_REP", "LAP", "APR", "CPI", "unknown"]
    );
    let CmMessage::Rej(rej) = ev[1].mad.msg else {
        panic!()
    };
    assert_eq!(rej.reason, ibcm_mad::RejReason::ConsumerReject);
    assert_eq!(rej.ari_bytes(), &[1, 2, 3, 4, 5, 6, 7, 8]);
    assert_eq!(rej.message_rejected, ibcm_mad::MsgKind::Rep);

    let v6 = cm_events("derived/synth_req_ipv6.pcap");
    assert_eq!(v6.len(), 1);
    assert_eq!(v6[0].icrc, Icrc::Ok);
    assert_eq!(v6[0].src.to_string(), "fe80::1");

    let fl = cm_events("derived/synth_req_flowlabel.pcap");
    let CmMessage::Req(req) = fl[0].mad.msg else {
        panic!()
    };
    assert_eq!(req.primary_path.flow_label.get(), 0xa_bcde);
    assert_eq!(req.primary_path.packet_rate.raw(), 0x2a);
    assert_eq!(req.primary_path.traffic_class, 0x5a);
    assert_eq!(req.primary_path.sl.get(), 5);
    assert!(req.primary_path.subnet_local);
    assert_eq!(req.alternate_path.flow_label.get(), 0x1_2345);
    assert_eq!(req.alternate_path.packet_rate.raw(), 0x15);
}
