//! SA MAD and PathRecord byte vectors, laid out by hand from IBTA Vol 1 Tables 199 (RMPP
//! header), 200 (SA header) and 227 (PathRecord).

use super::*;
use crate::codes::{Mtu, Rate};
use crate::types::{FlowLabel, Gid, Lid, Pkey, U4};

fn gid(tail: u8) -> Gid {
    let mut g = [0u8; 16];
    g[0] = 0xfe;
    g[1] = 0x80;
    g[8..].copy_from_slice(&[0, 2, 0xc9, 0, 1, 2, 3, tail]);
    Gid(g)
}

/// A PathRecord with every field distinct, and its bytes written field by field.
fn sample() -> (PathRecord, [u8; 64]) {
    let p = PathRecord {
        service_id: 0x0106_0000_0000_4242,
        dgid: gid(0x0d),
        sgid: gid(0x05),
        dlid: Lid(0x0004),
        slid: Lid(0x0003),
        raw_traffic: false,
        flow_label: FlowLabel::masked(0x12345),
        hop_limit: 0x40,
        traffic_class: 0x2a,
        reversible: true,
        numb_path: 1,
        pkey: Pkey(0xffff),
        qos_class: 0xabc,
        sl: U4::masked(7),
        mtu_selector: Selector::Exactly,
        mtu: Mtu::Mtu2048,
        rate_selector: Selector::Exactly,
        rate: Rate::G10,
        packet_life_time_selector: Selector::Exactly,
        packet_life_time: 0x12,
        preference: 3,
    };
    let mut b = [0u8; 64];
    b[0..8].copy_from_slice(&[0x01, 0x06, 0, 0, 0, 0, 0x42, 0x42]);
    b[8..24].copy_from_slice(&gid(0x0d).0);
    b[24..40].copy_from_slice(&gid(0x05).0);
    b[40..44].copy_from_slice(&[0x00, 0x04, 0x00, 0x03]);
    // RawTraffic 0, 3 reserved bits, FlowLabel 0x12345 (bits 27..8), HopLimit 0x40
    b[44..48].copy_from_slice(&[0x01, 0x23, 0x45, 0x40]);
    // TClass, Reversible|NumbPath, P_Key
    b[48..52].copy_from_slice(&[0x2a, 0x81, 0xff, 0xff]);
    // QoSClass 0xabc | SL 7, MTUSelector 2 | MTU 4, RateSelector 2 | Rate 3
    b[52..56].copy_from_slice(&[0xab, 0xc7, 0x84, 0x83]);
    // PacketLifeTimeSelector 2 | PacketLifeTime 0x12, Preference 3, 6 reserved bytes
    b[56..58].copy_from_slice(&[0x92, 0x03]);
    (p, b)
}

#[test]
fn path_record_layout() {
    let (p, b) = sample();
    assert_eq!(p.to_bytes(), b);
    assert_eq!(PathRecord::parse(&b).unwrap(), p);
    assert_eq!(b[path::off::DLID], 0x00);
    assert_eq!(b[path::off::DLID + 1], 0x04);
    assert_eq!(b[path::off::PKEY], 0xff);
    assert_eq!(b[path::off::MTU] & 0x3f, 4);
    assert_eq!(b[path::off::PREFERENCE], 3);
}

#[test]
fn path_record_reserved_bits_ignored_and_raw_traffic() {
    let (p, mut b) = sample();
    b[44] |= 0x70; // the 3 reserved bits after RawTraffic
    b[60] = 0xee; // reserved tail
    assert_eq!(PathRecord::parse(&b).unwrap(), p);
    b[44] |= 0x80;
    assert!(PathRecord::parse(&b).unwrap().raw_traffic);
}

#[test]
fn path_record_short_input_is_an_error() {
    let (_, b) = sample();
    for n in 0..64 {
        assert!(matches!(
            PathRecord::parse(&b[..n]),
            Err(ParseError::Truncated { need: 64, .. })
        ));
    }
}

#[test]
fn comp_mask_bits_match_ib_sa_h() {
    // IB_SA_PATH_REC_* in include/rdma/ib_sa.h
    assert_eq!(comp::DGID, 0x4);
    assert_eq!(comp::SGID, 0x8);
    assert_eq!(comp::DLID, 0x10);
    assert_eq!(comp::SLID, 0x20);
    assert_eq!(comp::REVERSIBLE, 0x800);
    assert_eq!(comp::NUMB_PATH, 0x1000);
    assert_eq!(comp::PKEY, 0x2000);
    assert_eq!(comp::SL, 0x8000);
    assert_eq!(comp::MTU_SELECTOR | comp::MTU, 0x3_0000);
    assert_eq!(comp::RATE_SELECTOR | comp::RATE, 0xc_0000);
    assert_eq!(comp::PREFERENCE, 0x40_0000);
}

#[test]
fn sa_mad_request_layout() {
    let (p, pb) = sample();
    let mask = comp::DGID | comp::SGID | comp::NUMB_PATH | comp::REVERSIBLE | comp::PKEY;
    let mut m = SaMad::request(
        method::GET_TABLE,
        Tid(0x0102_0304_0506_0708),
        attr::PATH_RECORD,
        mask,
    );
    m.data[..64].copy_from_slice(&p.to_bytes());
    let b = m.to_bytes();
    let mut want = [0u8; 256];
    want[..24].copy_from_slice(&[
        0x01, 0x03, 0x02, 0x12, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8, 0x00, 0x35, 0, 0, 0, 0, 0, 0,
    ]);
    // RMPP header all zero (no RMPP in a request), SM_Key 0, AttributeOffset 0, reserved
    want[48..56].copy_from_slice(&mask.to_be_bytes());
    assert_eq!(&want[48..56], &[0, 0, 0, 0, 0, 0, 0x38, 0x0c]);
    want[56..120].copy_from_slice(&pb);
    assert_eq!(b, want);
    let back = SaMad::parse(&b).unwrap();
    assert_eq!(back, m);
    assert_eq!(back.header.method, method::GET_TABLE);
    assert_eq!(back.header.method.raw(), 0x12);
}

#[test]
fn sa_mad_rmpp_header_layout() {
    let mut b = [0u8; 256];
    b[..24].copy_from_slice(&[
        0x01, 0x03, 0x02, 0x92, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 9, 0x00, 0x35, 0, 0, 0, 0, 0, 0,
    ]);
    // RMPPVersion 1, DATA, RRespTime 0x1f | Active+First, status 0, segment 1, paylen 660
    b[24..36].copy_from_slice(&[1, 1, 0xfb, 0, 0, 0, 0, 1, 0, 0, 0x02, 0x94]);
    b[36..44].copy_from_slice(&0x1122_3344_5566_7788u64.to_be_bytes());
    b[44..46].copy_from_slice(&[0, 8]);
    b[46..48].copy_from_slice(&[0xaa, 0xbb]); // reserved: ignored
    b[48..56].copy_from_slice(&comp::DGID.to_be_bytes());
    let m = SaMad::parse(&b).unwrap();
    assert_eq!(m.header.method, method::GET_TABLE_RESP);
    assert_eq!(
        m.rmpp,
        RmppHeader {
            version: 1,
            rmpp_type: rmpp_type::DATA,
            resp_time: 0x1f,
            flags: rmpp_flags::ACTIVE | rmpp_flags::FIRST,
            status: 0,
            data1: 1,
            data2: 660,
        }
    );
    assert!(m.rmpp.is_active());
    assert_eq!(m.sm_key, 0x1122_3344_5566_7788);
    assert_eq!(m.attr_offset, 8);
    assert_eq!(m.comp_mask, comp::DGID);
    let mut cleared = b;
    cleared[46..48].fill(0);
    assert_eq!(m.to_bytes(), cleared);
}

#[test]
fn sa_status_codes() {
    assert_eq!(SaStatus::from_mad_status(0x0300), SaStatus::NoRecords);
    assert_eq!(SaStatus::from_mad_status(0x0000), SaStatus::Ok);
    assert_eq!(SaStatus::from_mad_status(0x0c00), SaStatus::Other(12));
    for c in 0..0x80u16 {
        assert_eq!(u16::from(SaStatus::from_mad_status(c << 8).code()), c);
    }
}

#[test]
fn sa_mad_rejects_other_classes_and_short_input() {
    let m = SaMad::request(method::GET, Tid(1), attr::PATH_RECORD, 0);
    let mut b = m.to_bytes();
    assert!(SaMad::parse(&b[..55]).is_err());
    let short = SaMad::parse(&b[..100]).unwrap();
    assert_eq!(short.data_len, 44);
    b[1] = 0x07;
    assert!(matches!(
        SaMad::parse(&b),
        Err(ParseError::InvalidField {
            field: "mgmt_class",
            ..
        })
    ));
    b[1] = 0x03;
    b[2] = 1;
    assert!(SaMad::parse(&b).is_err());
}

#[test]
fn table_reads_records_at_attribute_offset() {
    let (p, pb) = sample();
    let mut data = vec![0u8; 200];
    data[..64].copy_from_slice(&pb);
    let mut q = p;
    q.dlid = Lid(9);
    data[64..128].copy_from_slice(&q.to_bytes());
    let t = PathRecord::table(&data[..128], 8);
    assert_eq!(t, vec![p, q]);
    // 200 bytes hold three records and 8 bytes of padding
    assert_eq!(PathRecord::table(&data, 8).len(), 3);
    assert_eq!(PathRecord::table(&data, 0), vec![p]);
}

proptest::proptest! {
    #[test]
    fn sa_mad_parse_never_panics(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..300)) {
        if let Ok(m) = SaMad::parse(&bytes) {
            let again = SaMad::parse(&m.to_bytes()).unwrap();
            proptest::prop_assert_eq!(again.header, m.header);
        }
        let _ = PathRecord::table(&bytes, (bytes.len() % 20) as u16);
    }

    #[test]
    fn path_record_roundtrip(bytes in proptest::array::uniform32(proptest::num::u8::ANY), more in proptest::array::uniform32(proptest::num::u8::ANY)) {
        let mut b = [0u8; 64];
        b[..32].copy_from_slice(&bytes);
        b[32..].copy_from_slice(&more);
        let p = PathRecord::parse(&b).unwrap();
        proptest::prop_assert_eq!(PathRecord::parse(&p.to_bytes()).unwrap(), p);
    }
}

/// A GetResp OpenSM 3.3.23 sent (fixtures/sa/README.md).
#[test]
fn opensm_getresp_fixture() {
    let b = include_bytes!(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../fixtures/sa/opensm_pathrecord_getresp.bin"
    ));
    let m = SaMad::parse(b).unwrap();
    assert_eq!(m.header.method, method::GET_RESP);
    assert_eq!(m.header.attr_id, attr::PATH_RECORD);
    assert_eq!(m.header.status, 0);
    assert_eq!(m.sa_status(), SaStatus::Ok);
    assert_eq!(m.comp_mask, comp::SLID | comp::DLID);
    assert_eq!(m.attr_offset, PathRecord::ATTR_OFFSET);
    assert!(!m.rmpp.is_active());
    let p = PathRecord::parse(&m.data).unwrap();
    let g = |t: u8| {
        let mut g = [0u8; 16];
        g[0] = 0xfe;
        g[1] = 0x80;
        g[13] = 0x10;
        g[15] = t;
        Gid(g)
    };
    assert_eq!(p.sgid, g(3));
    assert_eq!(p.dgid, g(5));
    assert_eq!((p.slid, p.dlid), (Lid(3), Lid(4)));
    assert!(p.reversible);
    assert_eq!(p.pkey, Pkey(0xffff));
    assert_eq!((p.mtu_selector, p.mtu), (Selector::Exactly, Mtu::Mtu2048));
    assert_eq!((p.rate_selector, p.rate), (Selector::Exactly, Rate::G10));
    assert_eq!(
        (p.packet_life_time_selector, p.packet_life_time),
        (Selector::Exactly, 0x12)
    );
    assert_eq!(p.hop_limit, 0);
    // emit(parse(b)) == b: nothing reserved was set
    assert_eq!(&m.to_bytes()[..], &b[..]);
}
