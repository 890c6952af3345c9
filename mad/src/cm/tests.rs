//! Cross-message tests: real fixtures, spec layout masks, property tests.

use proptest::prelude::*;

use super::*;
use crate::codes::*;
use crate::types::*;

macro_rules! fixture {
    ($name:literal) => {
        include_bytes!(concat!("../../../fixtures/mads/", $name))
    };
}

/// Which bits of the 232-byte attribute data are fields (1) rather than reserved (0), written
/// independently of the parsers from the tables in docs/wire.md §2.
fn field_mask(attr: AttrId) -> [u8; MAD_DATA_LEN] {
    let mut m = [0u8; MAD_DATA_LEN];
    let mut set = |off: usize, len: usize| {
        for b in &mut m[off..off + len] {
            *b = 0xff;
        }
    };
    match attr {
        AttrId::Req => {
            set(0, 4);
            set(5, 3);
            set(8, 8);
            set(16, 8);
            set(28, 4);
            set(32, 48 - 32);
            set(48, 2);
            set(50, 2);
            set(52, 140 - 52);
            set(140, 92);
        }
        AttrId::Mra => {
            set(0, 8);
            set(10, 222);
        }
        AttrId::Rej => {
            set(0, 8);
            set(10, 222);
        }
        AttrId::Rep => set(0, 232),
        AttrId::Rtu | AttrId::Drep => set(0, 232),
        AttrId::Dreq => {
            set(0, 11);
            set(12, 220);
        }
        AttrId::SidrReq => {
            set(0, 6);
            set(8, 224);
        }
        AttrId::SidrRep => set(0, 232),
        AttrId::Lap => {
            set(0, 8);
            set(12, 4);
            set(20, 212);
        }
        AttrId::Apr => {
            set(0, 10);
            set(12, 220);
        }
        AttrId::ClassPortInfo => set(0, 72),
        AttrId::Unknown(_) => set(0, 232),
    }
    // Sub-byte reserved bits.
    match attr {
        AttrId::Req => {
            m[90] &= 0xf0; // flow label is the top 20 bits of Off 88; 6 reserved bits follow
            m[91] &= 0x3f;
            m[94] &= 0xf8;
            m[95] &= 0xf8;
            m[134] &= 0xf0;
            m[135] &= 0x3f;
            m[138] &= 0xf8;
            m[139] &= 0xfc; // 0x04 = SAP Supported
        }
        AttrId::Mra => {
            m[8] = 0xc0;
            m[9] = 0xf8;
        }
        AttrId::Rej => {
            m[8] = 0xc0;
            m[9] = 0xfe;
        }
        AttrId::Rep => {
            m[27] = 0xf0;
        }
        AttrId::Lap => {
            m[15] = 0xf8;
            m[58] &= 0xf0;
            m[61] = 0x3f;
            m[62] = 0xf8;
            m[63] = 0xf8;
        }
        AttrId::ClassPortInfo => {
            m[32] = 0; // RedirectQP: top 8 bits reserved
        }
        _ => {}
    }
    m
}

const ALL_ATTRS: [AttrId; 12] = [
    AttrId::ClassPortInfo,
    AttrId::Req,
    AttrId::Mra,
    AttrId::Rej,
    AttrId::Rep,
    AttrId::Rtu,
    AttrId::Dreq,
    AttrId::Drep,
    AttrId::SidrReq,
    AttrId::SidrRep,
    AttrId::Lap,
    AttrId::Apr,
];

fn mad_bytes(attr: AttrId, data: &[u8; MAD_DATA_LEN]) -> [u8; MAD_LEN] {
    let mut header = MadHeader::cm(Tid(0x0102_0304_0506_0708), attr);
    if attr == AttrId::ClassPortInfo {
        header.method = Method::Get;
    }
    let mut out = [0u8; MAD_LEN];
    header.emit(&mut &mut out[..]);
    out[24..].copy_from_slice(data);
    out
}

#[test]
fn every_fixture_round_trips_byte_exact() {
    for (name, bytes) in [
        ("nvme_f5_req", fixture!("nvme_f5_req.bin")),
        ("nvme_f6_rep", fixture!("nvme_f6_rep.bin")),
        ("nvme_f7_rtu", fixture!("nvme_f7_rtu.bin")),
        ("nvme_f64_dreq", fixture!("nvme_f64_dreq.bin")),
        ("nvme_f65_drep", fixture!("nvme_f65_drep.bin")),
        ("nvme2_f1_req", fixture!("nvme2_f1_req.bin")),
        ("nvme2_f2_rep", fixture!("nvme2_f2_rep.bin")),
        ("nvme2_f28_dreq", fixture!("nvme2_f28_dreq.bin")),
        ("ibping_f3_req", fixture!("ibping_f3_req.bin")),
        ("ibping_f4_rep", fixture!("ibping_f4_rep.bin")),
        ("ipoibcm_f7_req", fixture!("ipoibcm_f7_req.bin")),
        ("ipoibcm_f8_rep", fixture!("ipoibcm_f8_rep.bin")),
    ] {
        let mad = Mad::parse(bytes).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(&mad.to_bytes()[..], &bytes[..], "{name}");
    }
}

#[test]
fn rep_dreq_drep_fields() {
    let rep = Mad::parse(fixture!("nvme_f6_rep.bin")).unwrap();
    let CmMessage::Rep(r) = rep.msg else { panic!() };
    assert_eq!(r.local_comm_id, CommId(0xe8ac_7105));
    assert_eq!(r.remote_comm_id, CommId(0x3eb0_bde5));
    assert_eq!(r.local_qpn, Qpn::masked(0x8d));
    assert_eq!(rep.header.tid, Tid(0x0000_0002_e5bd_b03e));

    let rtu = Mad::parse(fixture!("nvme_f7_rtu.bin")).unwrap();
    assert_eq!(rtu.msg.local_comm_id(), Some(CommId(0x3eb0_bde5)));
    assert_eq!(rtu.msg.remote_comm_id(), Some(CommId(0xe8ac_7105)));

    let dreq = Mad::parse(fixture!("nvme2_f28_dreq.bin")).unwrap();
    assert_eq!(dreq.header.tid, Tid(0x0000_0004_4610_c7dc));
    let CmMessage::Dreq(d) = dreq.msg else {
        panic!()
    };
    assert_eq!(d.local_comm_id, CommId(0xdcc7_1046));
    assert_eq!(d.remote_comm_id, CommId(0x73ad_c2cc));
    assert_eq!(d.remote_qpn_eecn, Qpn::masked(0x106));

    let ib = Mad::parse(fixture!("ipoibcm_f7_req.bin")).unwrap();
    let CmMessage::Req(q) = ib.msg else { panic!() };
    assert_eq!(q.service_id, ServiceId(0x1000_0000_0000_0404));
    assert_eq!(q.local_qpn, Qpn::masked(0x87_0408));
}

#[test]
fn header_validation() {
    let good = *fixture!("nvme_f7_rtu.bin");
    let mut b = good;
    b[1] = 0x04;
    assert_eq!(
        Mad::parse(&b),
        Err(ParseError::NotCmClass {
            offset: 1,
            value: 4
        })
    );
    let mut b = good;
    b[2] = 1;
    assert!(matches!(
        Mad::parse(&b),
        Err(ParseError::UnsupportedClassVersion { value: 1, .. })
    ));
    let mut b = good;
    b[3] = 0x01; // Get on an RTU
    assert!(matches!(
        Mad::parse(&b),
        Err(ParseError::InvalidField {
            field: "method",
            offset: 3,
            ..
        })
    ));
    let mut b = good;
    b[16] = 0;
    b[17] = 0xb0; // unknown attribute: kept raw
    let m = Mad::parse(&b).unwrap();
    assert!(matches!(m.msg, CmMessage::Unknown { attr: 0xb0, .. }));
    assert_eq!(&m.to_bytes()[..], &b[..]);
}

#[test]
fn every_truncation_is_an_error() {
    for attr in ALL_ATTRS {
        let mad = mad_bytes(attr, &[0x5a; MAD_DATA_LEN]);
        for n in 0..MAD_LEN {
            assert!(
                matches!(Mad::parse(&mad[..n]), Err(ParseError::Truncated { .. })),
                "{attr:?} len {n}"
            );
        }
        assert!(Mad::parse(&mad).is_ok());
    }
}

#[test]
fn reserved_bits_are_ignored_and_zeroed() {
    for attr in ALL_ATTRS {
        let mask = field_mask(attr);
        let ones = mad_bytes(attr, &[0xff; MAD_DATA_LEN]);
        let mad = Mad::parse(&ones).unwrap();
        let out = mad.to_bytes();
        for (i, (&o, &m)) in out[24..].iter().zip(mask.iter()).enumerate() {
            assert_eq!(
                o, m,
                "{attr:?}: attribute byte {i}: got {o:#04x}, mask {m:#04x}"
            );
        }
        // Reserved bits set alone parse to the same message as all-zero input.
        let reserved: Vec<u8> = mask.iter().map(|m| !m).collect();
        let mut data = [0u8; MAD_DATA_LEN];
        data.copy_from_slice(&reserved);
        let zero = Mad::parse(&mad_bytes(attr, &[0; MAD_DATA_LEN])).unwrap();
        let res = Mad::parse(&mad_bytes(attr, &data)).unwrap();
        assert_eq!(zero, res, "{attr:?}");
    }
}

#[test]
fn emit_checks_buffer_size() {
    let mad = Mad::new(Tid(1), CmMessage::Rtu(Rtu::default()));
    let mut small = [0u8; 255];
    assert_eq!(
        mad.emit_into(&mut small),
        Err(EmitError::BufferTooSmall {
            need: 256,
            have: 255
        })
    );
    let mut v: &mut [u8] = &mut small[..];
    assert!(mad.emit(&mut v).is_err());
}

/// Single-field probes: one field set, emitted into a 0xA5-filled buffer; exactly the spec's
/// bytes change.
#[test]
fn construct_probes() {
    fn emit(msg: CmMessage) -> [u8; MAD_LEN] {
        let mut buf = [0xa5u8; MAD_LEN];
        Mad::new(Tid(0), msg).emit_into(&mut buf).unwrap();
        buf
    }
    fn check(msg: CmMessage, expect: &[(usize, u8)]) {
        let base = emit(match msg {
            CmMessage::Mra(_) => CmMessage::Mra(Mra::default()),
            CmMessage::Rej(_) => CmMessage::Rej(Rej {
                reason: RejReason::Unknown(0),
                ..Rej::default()
            }),
            CmMessage::SidrReq(_) => CmMessage::SidrReq(SidrReq::default()),
            CmMessage::SidrRep(_) => CmMessage::SidrRep(SidrRep::default()),
            CmMessage::Lap(_) => CmMessage::Lap(Lap::default()),
            CmMessage::Apr(_) => CmMessage::Apr(Apr::default()),
            CmMessage::Rep(_) => CmMessage::Rep(Rep::default()),
            CmMessage::ClassPortInfo(_) => CmMessage::ClassPortInfo(ClassPortInfo::default()),
            _ => unreachable!(),
        });
        let got = emit(msg);
        let mut want = base;
        for &(off, v) in expect {
            want[off] = v;
        }
        assert_eq!(&got[24..], &want[24..], "{msg:?}");
        assert!(
            !got.contains(&0xa5),
            "a byte was left unwritten: {got:02x?}"
        );
    }
    check(
        CmMessage::Mra(Mra {
            message_mraed: MsgKind::Other,
            service_timeout: TimeoutExp::masked(24),
            local_comm_id: CommId(0x0102_0304),
            ..Mra::default()
        }),
        &[
            (24, 1),
            (25, 2),
            (26, 3),
            (27, 4),
            (32, 0x80),
            (33, 24 << 3),
        ],
    );
    let mut rej = Rej {
        reason: RejReason::ConsumerReject,
        message_rejected: MsgKind::Rep,
        ..Rej::default()
    };
    rej.set_ari(&[0xaa, 0xbb]);
    rej.private_data = PrivateData::from_slice(b"no").unwrap();
    check(
        CmMessage::Rej(rej),
        &[
            (32, 0x40),
            (33, 2 << 1),
            (35, 28),
            (36, 0xaa),
            (37, 0xbb),
            (108, b'n'),
            (109, b'o'),
        ],
    );
    check(
        CmMessage::Rep(Rep {
            local_qpn: Qpn::masked(0x12_3456),
            ece_vendor_id: VendorId::masked(0xab_cdef),
            starting_psn: Psn::masked(0x65_4321),
            target_ack_delay: TimeoutExp::masked(17),
            failover_accepted: FailoverAccepted::Unsupported,
            end_to_end_flow_control: true,
            rnr_retry_count: U3::masked(6),
            srq: true,
            local_ca_guid: Guid(0x1122_3344_5566_7788),
            ..Rep::default()
        }),
        &[
            (36, 0x12),
            (37, 0x34),
            (38, 0x56),
            (39, 0xab),
            (43, 0xcd),
            (44, 0x65),
            (45, 0x43),
            (46, 0x21),
            (47, 0xef),
            (50, (17 << 3) | (2 << 1) | 1),
            (51, (6 << 5) | 0x10),
            (52, 0x11),
            (53, 0x22),
            (54, 0x33),
            (55, 0x44),
            (56, 0x55),
            (57, 0x66),
            (58, 0x77),
            (59, 0x88),
        ],
    );
    let mut xrc = Rep::default();
    xrc.set_xrc_tgt_qpn(Qpn::masked(0x00_0abc));
    assert_eq!(xrc.xrc_tgt_qpn(), Qpn::masked(0xabc));
    assert_eq!(xrc.remote_qpn_for(true), Qpn::masked(0xabc));
    assert_eq!(xrc.remote_qpn_for(false), Qpn::default());
    check(CmMessage::Rep(xrc), &[(41, 0x0a), (42, 0xbc), (51, 0x10)]);
    check(
        CmMessage::SidrReq(SidrReq {
            request_id: RequestId(0x0a0b_0c0d),
            partition_key: Pkey(0xffff),
            service_id: ServiceId(0x0000_0000_0111_1234),
            ..SidrReq::default()
        }),
        &[
            (24, 0x0a),
            (25, 0x0b),
            (26, 0x0c),
            (27, 0x0d),
            (28, 0xff),
            (29, 0xff),
            (36, 0x01),
            (37, 0x11),
            (38, 0x12),
            (39, 0x34),
        ],
    );
    check(
        CmMessage::SidrRep(SidrRep {
            status: SidrStatus::NoQp,
            additional_info_length: 4,
            ece_vendor_id: VendorId::masked(0x12_3456),
            qpn: Qpn::masked(0xab_cdef),
            qkey: Qkey(0x8001_0000),
            ..SidrRep::default()
        }),
        &[
            (28, 3),
            (29, 4),
            (30, 0x12),
            (31, 0x34),
            (32, 0xab),
            (33, 0xcd),
            (34, 0xef),
            (35, 0x56),
            (44, 0x80),
            (45, 0x01),
        ],
    );
    check(
        CmMessage::Lap(Lap {
            remote_qpn_eecn: Qpn::masked(0x01_0203),
            remote_cm_response_timeout: TimeoutExp::masked(20),
            alternate_path: PathInfo {
                local_lid: Lid(0x0102),
                flow_label: FlowLabel::masked(0xa_bcde),
                traffic_class: 0x5a,
                hop_limit: 0x40,
                packet_rate: Rate::G100,
                sl: U4::masked(5),
                subnet_local: true,
                local_ack_timeout: TimeoutExp::masked(19),
                ..PathInfo::default()
            },
            ..Lap::default()
        }),
        &[
            (36, 0x01),
            (37, 0x02),
            (38, 0x03),
            (39, 20 << 3),
            (44, 0x01),
            (45, 0x02),
            (80, 0xab),
            (81, 0xcd),
            (82, 0xe0),
            (83, 0x5a),
            (84, 0x40),
            (85, 16),
            (86, 0x58),
            (87, 19 << 3),
        ],
    );
    check(
        CmMessage::Apr(Apr {
            additional_info_length: 2,
            ap_status: AprStatus::InvalidGid,
            additional_info: {
                let mut a = [0; 72];
                a[0] = 0xfe;
                a
            },
            ..Apr::default()
        }),
        &[(32, 2), (33, 8), (36, 0xfe)],
    );
    check(
        CmMessage::ClassPortInfo(ClassPortInfo {
            base_version: 1,
            class_version: 2,
            capability_mask: 0x0102,
            capability_mask2: U27::masked(1),
            resp_time_value: TimeoutExp::masked(18),
            redirect_qp: Qpn::masked(0x0a_0b0c),
            trap_hl: 0xff,
            ..ClassPortInfo::default()
        }),
        &[
            (24, 1),
            (25, 2),
            (26, 0x01),
            (27, 0x02),
            (31, 0x20 | 18),
            (57, 0x0a),
            (58, 0x0b),
            (59, 0x0c),
            (88, 0xff),
        ],
    );
}

#[test]
fn rej_helpers() {
    let mut rej = Rej {
        reason: RejReason::Timeout,
        ..Rej::default()
    };
    rej.set_ari(&0x0011_2233_4455_6677u64.to_be_bytes());
    assert_eq!(rej.timeout_ca_guid(), Some(Guid(0x0011_2233_4455_6677)));
    assert_eq!(rej.ari_bytes().len(), 8);
    rej.set_ari(&[1; 100]);
    assert_eq!(rej.ari_bytes().len(), 72);
    rej.reason = RejReason::ConsumerReject;
    assert_eq!(rej.timeout_ca_guid(), None);
}

#[test]
fn display_summaries() {
    let req = Mad::parse(fixture!("nvme_f5_req.bin")).unwrap();
    assert_eq!(
        req.msg.to_string(),
        "REQ lcid=0x3eb0bde5 sid=0x0000000001061144 qpn=0x0000dc psn=0x017c2d Rc"
    );
}

fn any_attr() -> impl Strategy<Value = AttrId> {
    prop::sample::select(ALL_ATTRS.to_vec())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    /// emit ∘ parse is the identity on messages: parse(emit(parse(b))) == parse(b), and the
    /// emitted bytes equal the input with reserved bits cleared.
    #[test]
    fn parse_emit_parse(attr in any_attr(), data in prop::array::uniform32(any::<u8>()),
                        tail in prop::collection::vec(any::<u8>(), 200)) {
        let mut payload = [0u8; MAD_DATA_LEN];
        payload[..32].copy_from_slice(&data);
        payload[32..].copy_from_slice(&tail);
        let bytes = mad_bytes(attr, &payload);
        let m1 = Mad::parse(&bytes).unwrap();
        let out = m1.to_bytes();
        let m2 = Mad::parse(&out).unwrap();
        prop_assert_eq!(m1, m2);
        let mask = field_mask(attr);
        for i in 0..MAD_DATA_LEN {
            prop_assert_eq!(out[24 + i], payload[i] & mask[i]);
        }
    }

    /// Arbitrary bytes never panic and never parse to something that does not round-trip.
    #[test]
    fn arbitrary_bytes(bytes in prop::collection::vec(any::<u8>(), 0..300)) {
        if let Ok(m) = Mad::parse(&bytes) {
            let again = Mad::parse(&m.to_bytes()).unwrap();
            prop_assert_eq!(m, again);
        }
        let _ = MadHeader::parse(&bytes);
    }
}
