use super::*;

use ibcm_mad::sa::comp;
use ibcm_mad::{FlowLabel, Gid, Lid, Mtu, PathInfo, Pkey, Qkey, Qpn, Rate, TimeoutExp, U4};

use crate::style::Palette;
use crate::timefmt::{TimeFormat, TimeRef};
use crate::trace::{Icrc, Wire, WireAddr};

/// OpenSM's PathRecord GetResp from the native-IB lab (fixtures/sa/README.md).
pub(crate) const OPENSM: &[u8; 256] = include_bytes!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../fixtures/sa/opensm_pathrecord_getresp.bin"
));

fn wire() -> Wire {
    Wire {
        pkey: Pkey::DEFAULT,
        psn: ibcm_mad::Psn::masked(1),
        dest_qp: Qpn::masked(1),
        src_qp: Some(Qpn::masked(1)),
        qkey: Some(Qkey::GSI),
        udp_src_port: None,
        lids: Some((Lid(1), Lid(3))),
        hop_limit: None,
        traffic_class: None,
        icrc_value: None,
    }
}

/// An event for the MAD `bytes` (sent from LID 1 to LID 3 at `us` µs).
pub(crate) fn event(bytes: &[u8], frame: u64, us: u64) -> SaEvent {
    SaEvent {
        frame,
        time: Duration::from_micros(us),
        encap: Encap::IbLocal,
        src: WireAddr::Lid(Lid(1)),
        dst: WireAddr::Lid(Lid(3)),
        mad: SaMad::parse(bytes).unwrap(),
        icrc: Icrc::Ok,
        wire: wire(),
    }
}

fn gid(host: u8) -> Gid {
    let mut g = [0u8; 16];
    g[0] = 0xfe;
    g[1] = 0x80;
    g[13] = 0x10;
    g[15] = host;
    Gid(g)
}

#[test]
fn opensm_answer_decodes_field_by_field() {
    let ev = event(OPENSM, 2, 45);
    assert!(ev.is_path() && ev.is_answer() && ev.is_response() && !ev.is_query());
    assert!(!ev.rmpp_active());
    assert_eq!(ev.mad.header.tid.0, 0x0001_0000_0000_51b9);
    assert_eq!(ev.mad.comp_mask, comp::SLID | comp::DLID);
    let recs = ev.records();
    assert_eq!(recs.len(), 1, "a GetResp carries one record");
    let r = recs[0];
    assert_eq!((r.slid, r.dlid), (Lid(3), Lid(4)));
    assert_eq!((r.sgid, r.dgid), (gid(3), gid(5)));
    assert_eq!(r.sl.get(), 0);
    assert_eq!(r.mtu, Mtu::Mtu2048);
    assert_eq!(r.rate, Rate::G10);
    assert_eq!(r.packet_life_time, 18);
    assert_eq!(r.pkey, Pkey(0xffff));
    assert_eq!(r.hop_limit, 0);
    assert!(r.reversible);
    assert_eq!(status_name(ev.mad.header.status), "success");
    assert_eq!(method_name(ev.mad.header.method), "GetResp");
    assert_eq!(attr_name(ev.mad.header.attr_id), "PathRecord");
    // A failed answer has no records.
    let mut failed = *OPENSM;
    failed[4..6].copy_from_slice(&0x0300u16.to_be_bytes());
    let ev = event(&failed, 2, 45);
    assert!(ev.records().is_empty());
    assert_eq!(status_name(ev.mad.header.status), "ERR_NO_RECORDS");
}

#[test]
fn status_names() {
    assert_eq!(status_name(0x0400), "ERR_TOO_MANY_RECORDS");
    assert_eq!(status_name(0x0600), "ERR_REQ_INSUFFICIENT_COMPONENTS");
    assert_eq!(status_name(0x0008), "method not supported");
    assert_eq!(status_name(0x001c), "invalid attribute or modifier value");
    assert_eq!(status_name(0x0001), "busy");
    assert_eq!(status_name(0x7f00), "class-specific error");
}

#[test]
fn table_records_stop_at_the_payload_or_skip_zero_padding() {
    let rec = |slid: u16| {
        PathRecord {
            slid: Lid(slid),
            dlid: Lid(9),
            ..PathRecord::default()
        }
        .to_bytes()
    };
    let mut data = vec![0u8; 400];
    data[..64].copy_from_slice(&rec(1));
    data[64..128].copy_from_slice(&rec(2));
    data[128..192].copy_from_slice(&rec(3));
    // Without a payload length: the zero records are padding.
    let all = table_records(&data, 8, None);
    assert_eq!(
        all.iter().map(|r| r.slid.0).collect::<Vec<_>>(),
        vec![1, 2, 3]
    );
    // With one: exactly that many bytes (a trailing piece shorter than a record is none).
    assert_eq!(table_records(&data, 8, Some(128 + 10)).len(), 2);
    // A length beyond the data is not believed.
    assert_eq!(table_records(&data, 8, Some(9999)).len(), 3);
    // A wider AttributeOffset spaces the records.
    let mut wide = vec![0u8; 400];
    wide[..64].copy_from_slice(&rec(7));
    wide[80..144].copy_from_slice(&rec(8));
    let w = table_records(&wide, 10, None);
    assert_eq!(w.iter().map(|r| r.slid.0).collect::<Vec<_>>(), vec![7, 8]);
    // A zero offset reads records 64 bytes apart; nothing at all is no record.
    assert_eq!(table_records(&data, 0, None).len(), 3);
    assert!(table_records(&[], 8, None).is_empty());
    assert!(table_records(&[1, 2, 3], 0, None).is_empty());
    assert_eq!(last_segment_data(20 + 64), 64);
    assert_eq!(last_segment_data(5), DATA_LEN);
    assert_eq!(last_segment_data(u32::MAX), DATA_LEN);
}

#[test]
fn ack_timeout_is_the_kernel_rule_and_its_least_value() {
    // The cases of the CM crate's own test (`cm/src/qp_attr/tests.rs`).
    let cases = [
        ((15, 18), 19),
        ((15, 16), 17),
        ((15, 14), 16),
        ((15, 13), 16),
        ((15, 12), 15),
        ((15, 0), 15),
        ((0, 0), 2),
        ((16, 16), 18),
        ((16, 17), 18),
        ((31, 31), 31),
        ((0, 40), 31),
    ];
    for ((delay, life), want) in cases {
        assert_eq!(cm_ack_timeout(delay, life), want, "({delay}, {life})");
    }
    for plt in 0..=63u8 {
        let min = min_ack_timeout(plt);
        let want = if plt == 0 { 2 } else { (plt + 1).min(31) };
        assert_eq!(min, want, "plt {plt}");
        // Every timeout from there to 31 is what some CA ACK delay gives.
        for t in min..=31 {
            assert!(
                (0..=31).any(|d| cm_ack_timeout(d, plt) == t),
                "plt {plt}: {t} unreachable"
            );
        }
    }
}

fn record() -> PathRecord {
    PathRecord::parse(&OPENSM[56..]).unwrap()
}

/// The primary path `cm_format_req` makes of the record (CA ACK delay 15).
fn faithful() -> PathInfo {
    let r = record();
    PathInfo {
        local_lid: r.slid,
        remote_lid: r.dlid,
        local_gid: r.sgid,
        remote_gid: r.dgid,
        flow_label: r.flow_label,
        packet_rate: r.rate,
        traffic_class: r.traffic_class,
        hop_limit: r.hop_limit,
        sl: r.sl,
        subnet_local: true,
        local_ack_timeout: TimeoutExp::masked(cm_ack_timeout(15, r.packet_life_time)),
    }
}

#[test]
fn req_paths_are_checked_against_their_record() {
    let r = record();
    let wide = Some(ReqWide {
        mtu: Mtu::Mtu2048,
        pkey: Pkey(0xffff),
    });
    let p = faithful();
    assert!(path_matches(&p, &r));
    assert_eq!(path_differs(&p, &r, wide), 0);
    let bit = |f: Field| f.bit();
    let cases: [(PathInfo, Option<ReqWide>, u16); 9] = [
        (
            PathInfo {
                sl: U4::masked(3),
                ..p
            },
            wide,
            bit(Field::Sl),
        ),
        (
            p,
            Some(ReqWide {
                mtu: Mtu::Mtu1024,
                pkey: Pkey(0xffff),
            }),
            bit(Field::Mtu),
        ),
        (
            p,
            Some(ReqWide {
                mtu: Mtu::Mtu2048,
                pkey: Pkey(0x8001),
            }),
            bit(Field::Pkey),
        ),
        (
            PathInfo {
                local_ack_timeout: TimeoutExp::masked(18),
                ..p
            },
            wide,
            bit(Field::AckTimeout),
        ),
        (
            PathInfo {
                packet_rate: Rate::from_raw(7),
                ..p
            },
            wide,
            bit(Field::Rate),
        ),
        (
            PathInfo {
                flow_label: FlowLabel::masked(1),
                ..p
            },
            wide,
            bit(Field::FlowLabel),
        ),
        (
            PathInfo {
                traffic_class: 4,
                ..p
            },
            wide,
            bit(Field::TrafficClass),
        ),
        (PathInfo { hop_limit: 2, ..p }, wide, bit(Field::HopLimit)),
        // Rate 0 ("port current", what a 2008 stack sent) is not compared; a longer ACK
        // timeout is a larger CA ACK delay, not a disagreement; no REQ-wide fields for an
        // alternate path.
        (
            PathInfo {
                packet_rate: Rate::PortCurrent,
                local_ack_timeout: TimeoutExp::masked(31),
                ..p
            },
            None,
            0,
        ),
    ];
    for (path, w, want) in cases {
        assert_eq!(path_differs(&path, &r, w), want, "{path:?}");
    }
    let names: Vec<&str> = differs_names(bit(Field::Sl) | bit(Field::AckTimeout)).collect();
    assert_eq!(names, ["sl", "local_ack_timeout"]);
    // Another LID, or the reverse direction, is another path; permissive LIDs (a routed
    // path) are matched by the GIDs.
    assert!(!path_matches(
        &PathInfo {
            remote_lid: Lid(5),
            ..p
        },
        &r
    ));
    assert!(!path_matches(
        &PathInfo {
            local_gid: p.remote_gid,
            remote_gid: p.local_gid,
            ..p
        },
        &r
    ));
    assert!(path_matches(
        &PathInfo {
            local_lid: Lid(0xffff),
            remote_lid: Lid(0xffff),
            ..p
        },
        &r
    ));
}

/// A small deterministic generator.
pub(crate) struct Rng(pub(crate) u64);

impl Rng {
    pub(crate) fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// SA MADs with random contents (a valid common header, so that they parse) go through every
/// per-MAD view without a panic, and their JSON is JSON.
#[test]
fn random_sa_mads_never_panic_in_the_views() {
    let mut rng = Rng(0x5a5a_1234_dead_beef);
    let methods = [0x01u8, 0x12, 0x81, 0x92, 0x06, 0x14, 0x95, 0x33];
    let attrs = [0x0035u16, 0x0038, 0x003a, 0x0001, 0x7777];
    for i in 0..3000u64 {
        let mut m = [0u8; 256];
        for b in m.iter_mut() {
            *b = rng.next() as u8;
        }
        if i % 2 == 0 {
            // Start from OpenSM's answer and damage a few bytes.
            m = *OPENSM;
            for _ in 0..4 {
                let at = (rng.next() % 256) as usize;
                m[at] = rng.next() as u8;
            }
        }
        m[0] = 1;
        m[1] = 0x03;
        m[2] = 2;
        m[3] = methods[(rng.next() % methods.len() as u64) as usize];
        m[16..18].copy_from_slice(&attrs[(rng.next() % attrs.len() as u64) as usize].to_be_bytes());
        if i % 3 == 0 {
            // RMPP active, any type and flags.
            m[24] = 1;
            m[26] |= 1;
        }
        let ev = event(&m, i + 1, i);
        let _ = ev.records();
        let _ = ev.template();
        let mut out = Vec::new();
        let pal = Palette { on: i % 5 == 0 };
        view::text_line(
            &mut out,
            &ev,
            (TimeFormat::Relative, TimeRef::default()),
            &pal,
        );
        view::verbose(
            &mut out,
            &ev,
            (TimeFormat::Relative, TimeRef::default()),
            &pal,
        );
        out.clear();
        view::json_line(&mut out, &ev, Some("f\"x"), (None, TimeRef::default()));
        let line = String::from_utf8(out).unwrap();
        let v: serde_json::Value = serde_json::from_str(line.trim_end()).unwrap();
        assert_eq!(v["msg"], "SA");
    }
}
