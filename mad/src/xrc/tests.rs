//! Tests of the XRC formats: fixed vectors, limits, garbage, and proptest round trips.

use proptest::prelude::*;

use super::*;
use crate::cm::CmMessage;
use crate::codes::RejReason;
use crate::types::Qpn;

fn qpn(v: u32) -> Qpn {
    Qpn::new(v).unwrap()
}
fn srqn(v: u32) -> SrqNum {
    SrqNum::new(v).unwrap()
}

#[test]
fn req_bytes() {
    let r = XrcReqData {
        mode: ReqMode::Attach(qpn(0x12_3456)),
        policy: Some(OwnershipPolicy::Shared),
    };
    assert_eq!(r.to_bytes(), [0x58, 0x51, 1, 2, 0x12, 0x34, 0x56, 4]);
    let b = r.emit(b"app", REQ_PRIVATE_DATA_LEN).unwrap();
    let (back, app) = XrcReqData::parse(&b).unwrap();
    assert_eq!((back, app), (r, &b"app"[..]));
    let any = XrcReqData {
        mode: ReqMode::Any,
        policy: None,
    };
    assert_eq!(any.to_bytes(), [0x58, 0x51, 1, 0, 0, 0, 0, 0]);
    assert_eq!(XrcReqData::parse(&[0u8; 92]), Err(XrcDataError::NotXrc));
    assert_eq!(
        any.emit(&[0; 49], 56),
        Err(XrcDataError::TooLong { len: 57, max: 56 })
    );
}

#[test]
fn req_bad_fields() {
    let mut b = XrcReqData {
        mode: ReqMode::Create,
        policy: None,
    }
    .to_bytes();
    b[3] = 9;
    assert!(matches!(
        XrcReqData::parse(&b),
        Err(XrcDataError::InvalidField { field: "mode", .. })
    ));
    b[3] = 1;
    b[7] = 5;
    assert!(matches!(
        XrcReqData::parse(&b),
        Err(XrcDataError::InvalidField {
            field: "policy",
            ..
        })
    ));
    b[7] = 0;
    b[2] = 2;
    assert_eq!(
        XrcReqData::parse(&b),
        Err(XrcDataError::UnsupportedVersion(2))
    );
}

#[test]
fn rep_bytes_and_rdma_xclient_compat() {
    let r = XrcRepData {
        tgt_qpn: qpn(0x00_0a0b),
        policy: OwnershipPolicy::DomainBound,
        created: true,
        srqns: vec![srqn(0x00_1234), srqn(0x00_5678)],
    };
    let b = r.emit(b"hi").unwrap();
    assert_eq!(
        b,
        [
            0x00, 0x00, 0x12, 0x34, 0x58, 0x50, 1, 2, 0x00, 0x0a, 0x0b, 0x12, 0x00, 0x00, 0x56,
            0x78, b'h', b'i'
        ]
    );
    assert_eq!(XrcRepData::first_srqn_compat(&b), Some(srqn(0x1234)));
    let mut area = [0u8; REP_PRIVATE_DATA_LEN];
    area[..b.len()].copy_from_slice(&b);
    let (back, app) = XrcRepData::parse(&area).unwrap();
    assert_eq!(back, r);
    assert_eq!(&app[..2], b"hi");
}

#[test]
fn rep_limits() {
    let mut r = XrcRepData {
        tgt_qpn: qpn(1),
        policy: OwnershipPolicy::Shared,
        created: false,
        srqns: vec![],
    };
    assert!(r.emit(&[]).is_err());
    r.srqns = (0..47).map(srqn).collect();
    let b = r.emit(&[]).unwrap();
    assert_eq!(b.len(), 196);
    assert_eq!(XrcRepData::parse(&b).unwrap().0.srqns.len(), 47);
    assert!(matches!(r.emit(b"x"), Err(XrcDataError::TooLong { .. })));
    r.srqns.push(srqn(99));
    assert!(r.emit(&[]).is_err());
}

#[test]
fn rep_parse_rejects_garbage_without_panicking() {
    for len in 0..40 {
        let v = vec![0xffu8; len];
        let _ = XrcRepData::parse(&v);
        let _ = XrcReqData::parse(&v);
        let _ = TargetGone::parse(&v);
    }
    // Count says 3 SRQNs but only one more is present.
    let mut b = XrcRepData {
        tgt_qpn: qpn(1),
        policy: OwnershipPolicy::Shared,
        created: false,
        srqns: vec![srqn(1), srqn(2)],
    }
    .emit(&[])
    .unwrap();
    b[7] = 3;
    assert!(matches!(
        XrcRepData::parse(&b),
        Err(XrcDataError::Truncated { need: 20, have: 16 })
    ));
    // SRQN with a non-zero top byte.
    b[7] = 2;
    b[12] = 1;
    assert!(matches!(
        XrcRepData::parse(&b),
        Err(XrcDataError::InvalidField { field: "srqn", .. })
    ));
}

#[test]
fn random_bytes_never_panic() {
    // Deterministic xorshift; includes the markers so the deeper paths are reached.
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    for i in 0..20_000u64 {
        let len = (next() % 200) as usize;
        let mut b: Vec<u8> = (0..len).map(|_| next() as u8).collect();
        match i % 4 {
            1 if b.len() >= 8 => b[..3].copy_from_slice(&[0x58, 0x51, 1]),
            2 if b.len() >= 12 => b[4..7].copy_from_slice(&[0x58, 0x50, 1]),
            3 if b.len() >= 12 => b[..4].copy_from_slice(&[0x58, 0x52, 0x43, 1]),
            _ => {}
        }
        let _ = XrcReqData::parse(&b);
        let _ = XrcRepData::parse(&b);
        let _ = TargetGone::parse(&b);
        let _ = XrcRepData::first_srqn_compat(&b);
    }
}

/// A block whose trailing zeros were trimmed (a DREQ's private data as `ConnectionError`
/// reports it: 11 bytes with a TGT QPN, 6 without) parses as the block sent (issue 26 §1.5).
#[test]
fn trimmed_target_gone_blocks_parse() {
    let g = TargetGone::gone(GoneCause::CreatorExited, qpn(0x48));
    let b = g.to_bytes();
    assert_eq!(TargetGone::parse(&b[..11]), Some(g));
    let n = TargetGone {
        kind: RejectKind::Gone(GoneCause::DomainClosed),
        qpn: None,
    };
    assert_eq!(TargetGone::parse(&n.to_bytes()[..6]), Some(n));
    // The marker and the version must be there.
    assert_eq!(TargetGone::parse(&b[..3]), None);
    assert_eq!(TargetGone::parse(&[]), None);
}

#[test]
fn target_gone_kinds() {
    for cause in 1..=7 {
        let c = GoneCause::from_code(cause).unwrap();
        let g = TargetGone::gone(c, qpn(0x77));
        assert_eq!(TargetGone::parse(&g.to_bytes()), Some(g));
        assert!(g.is_gone());
    }
    let r = TargetGone {
        kind: RejectKind::AttachRefused,
        qpn: Some(qpn(5)),
    };
    assert_eq!(r.reason(), RejReason::ConsumerReject);
    assert!(!r.is_gone());
    assert_eq!(TargetGone::parse(&r.to_bytes()), Some(r));
    let n = TargetGone {
        kind: RejectKind::NoResources,
        qpn: None,
    };
    assert_eq!(n.reason(), RejReason::NoResources);
    assert_eq!(TargetGone::parse(&n.to_bytes()), Some(n));
    assert_eq!(TargetGone::parse(&[0u8; 72]), None);
    assert_eq!(
        TargetGone::gone(GoneCause::KeeperLost, qpn(0x10)).to_string(),
        "target gone (keeper lost) qpn 0x000010"
    );
}

#[test]
fn srq_num_is_24_bits() {
    assert_eq!(SrqNum::new(0xff_ffff).map(SrqNum::get), Some(0xff_ffff));
    assert!(SrqNum::new(0x100_0000).is_none());
    assert_eq!(format!("{}", SrqNum::new(0x42).unwrap()), "0x000042");
}

#[test]
fn codes_round_trip() {
    for p in OwnershipPolicy::ALL {
        assert_eq!(OwnershipPolicy::from_code(p.code()), Some(p));
        assert_eq!(OwnershipPolicy::from_name(p.name()), Some(p));
    }
    assert_eq!(
        OwnershipPolicy::from_name("DomainBound"),
        Some(OwnershipPolicy::DomainBound)
    );
    assert_eq!(
        OwnershipPolicy::from_name("process_bound"),
        Some(OwnershipPolicy::ProcessBound)
    );
    assert_eq!(OwnershipPolicy::from_name("nope"), None);
    assert_eq!(OwnershipPolicy::from_code(0), None);
    assert_eq!(OwnershipPolicy::from_code(5), None);
    for c in GoneCause::ALL {
        assert_eq!(GoneCause::from_code(c.code()), Some(c));
    }
    assert_eq!(GoneCause::from_code(0), None);
    assert_eq!(GoneCause::from_code(8), None);
}

#[test]
fn write_into_short_buffers_fails_cleanly() {
    let r = XrcReqData::create(None);
    assert!(matches!(
        r.write(b"abc", &mut [0u8; 10]),
        Err(XrcDataError::TooLong { len: 11, max: 10 })
    ));
    let mut out = [0u8; 11];
    assert_eq!(r.write(b"abc", &mut out), Ok(11));
    assert_eq!(XrcReqData::parse(&out), Ok((r, &b"abc"[..])));
    let g = TargetGone::gone(GoneCause::DomainClosed, qpn(9));
    assert!(g.write(&mut [0u8; 11]).is_err());
    let rep = XrcRepData {
        tgt_qpn: qpn(3),
        policy: OwnershipPolicy::Explicit,
        created: false,
        srqns: vec![srqn(1), srqn(2)],
    };
    assert!(rep.write(&[], &mut [0u8; 15]).is_err());
    let mut out = [0u8; 16];
    assert_eq!(rep.write(&[], &mut out), Ok(16));
    assert_eq!(out.to_vec(), rep.emit(&[]).unwrap());
}

#[test]
fn blocks_found_in_messages_with_their_fields() {
    use crate::cm::{Dreq, Rej, Rep, Req};
    use crate::types::PrivateData;

    let data = XrcRepData {
        tgt_qpn: qpn(0x0a0b),
        policy: OwnershipPolicy::Shared,
        created: true,
        srqns: vec![srqn(0x11), srqn(0x22)],
    };
    let rep = Rep {
        private_data: PrivateData::from_slice(&data.emit(&[]).unwrap()).unwrap(),
        ..Rep::default()
    };
    let b = XrcBlock::find(&CmMessage::Rep(rep)).unwrap().unwrap();
    assert_eq!(b, XrcBlock::Rep(data));
    let f = b.fields();
    let names: Vec<_> = f.iter().map(|f| f.name).collect();
    assert_eq!(
        names,
        [
            "SRQN[0]",
            "marker",
            "version",
            "SRQN count",
            "TGT QPN",
            "flags",
            "SRQN"
        ]
    );
    assert_eq!(f[5].value, "0x14 policy shared, created");
    assert_eq!(f[6].offset, 12);
    assert_eq!(b.len(), 16);

    let mut rej = Rej::default();
    let g = TargetGone::gone(GoneCause::KeeperLost, qpn(0x10));
    rej.set_ari(&g.to_bytes());
    let b = XrcBlock::find(&CmMessage::Rej(rej)).unwrap().unwrap();
    assert_eq!(b, XrcBlock::Gone(g));
    assert_eq!(b.fields()[3].value, "05 keeper lost");
    assert_eq!(b.to_string(), "XRC: target gone (keeper lost) qpn 0x000010");

    let dreq = Dreq {
        private_data: PrivateData::from_slice(&g.to_bytes()).unwrap(),
        ..Dreq::default()
    };
    assert_eq!(
        XrcBlock::find(&CmMessage::Dreq(dreq)),
        Some(Ok(XrcBlock::Gone(g)))
    );
    assert_eq!(XrcBlock::find(&CmMessage::Dreq(Dreq::default())), None);

    let mut req = Req::default();
    req.set_transport(crate::cm::ReqTransport::Xrc);
    let d = XrcReqData::attach(qpn(0x77));
    req.private_data = PrivateData::from_slice(&d.to_bytes()).unwrap();
    let b = XrcBlock::find(&CmMessage::Req(req)).unwrap().unwrap();
    assert_eq!(b, XrcBlock::Req(d));
    assert_eq!(b.fields()[2].value, "02 attach 0x000077");
    // Foreign private data is not an error; a bad block with the marker is.
    req.private_data = PrivateData::from_slice(b"hello").unwrap();
    assert_eq!(XrcBlock::find(&CmMessage::Req(req)), None);
    req.private_data = PrivateData::from_slice(&[0x58, 0x51, 1, 9, 0, 0, 0, 0]).unwrap();
    assert!(matches!(
        XrcBlock::find(&CmMessage::Req(req)),
        Some(Err(XrcDataError::InvalidField { field: "mode", .. }))
    ));
}

fn any_policy() -> impl Strategy<Value = OwnershipPolicy> {
    prop::sample::select(OwnershipPolicy::ALL.to_vec())
}

fn any_qpn() -> impl Strategy<Value = Qpn> {
    (1u32..=0xff_ffff).prop_map(Qpn::masked)
}

fn any_req() -> impl Strategy<Value = XrcReqData> {
    let mode = prop_oneof![
        Just(ReqMode::Any),
        Just(ReqMode::Create),
        any_qpn().prop_map(ReqMode::Attach),
    ];
    (mode, prop::option::of(any_policy())).prop_map(|(mode, policy)| XrcReqData { mode, policy })
}

fn any_rep() -> impl Strategy<Value = XrcRepData> {
    (
        any_qpn(),
        any_policy(),
        any::<bool>(),
        prop::collection::vec((0u32..=SrqNum::MAX).prop_map(srqn), 1..=MAX_REP_SRQNS),
    )
        .prop_map(|(tgt_qpn, policy, created, srqns)| XrcRepData {
            tgt_qpn,
            policy,
            created,
            srqns,
        })
}

fn any_gone() -> impl Strategy<Value = TargetGone> {
    let kind = prop_oneof![
        prop::sample::select(GoneCause::ALL.to_vec()).prop_map(RejectKind::Gone),
        Just(RejectKind::AttachRefused),
        Just(RejectKind::NoResources),
        prop::sample::select(ServiceFault::ALL.to_vec()).prop_map(RejectKind::Misconfigured),
    ];
    (kind, prop::option::of(any_qpn())).prop_map(|(kind, qpn)| TargetGone { kind, qpn })
}

proptest! {
    #[test]
    fn req_round_trips(r in any_req(), app in prop::collection::vec(any::<u8>(), 0..=84)) {
        let b = r.emit(&app, REQ_PRIVATE_DATA_LEN).unwrap();
        prop_assert_eq!(XrcReqData::parse(&b), Ok((r, &app[..])));
    }

    #[test]
    fn rep_round_trips(r in any_rep(), app in prop::collection::vec(any::<u8>(), 0..=16)) {
        match r.emit(&app) {
            Ok(b) => {
                let (back, rest) = XrcRepData::parse(&b).unwrap();
                prop_assert_eq!(back, r);
                prop_assert_eq!(rest, &app[..]);
            }
            Err(e) => {
                let too_long = matches!(e, XrcDataError::TooLong { .. });
                prop_assert!(too_long);
                prop_assert!(r.len() + app.len() > REP_PRIVATE_DATA_LEN);
            }
        }
    }

    #[test]
    fn gone_round_trips(g in any_gone(), pad in prop::collection::vec(any::<u8>(), 0..=60)) {
        let mut b = g.to_bytes().to_vec();
        b.extend_from_slice(&pad);
        prop_assert_eq!(TargetGone::parse(&b), Some(g));
        // Trimmed of its trailing zeros, as the runtime reports private data.
        let t = g.to_bytes();
        let keep = t.iter().rposition(|&x| x != 0).map_or(0, |i| i + 1);
        prop_assert_eq!(TargetGone::parse(&t[..keep]), Some(g));
    }

    #[test]
    fn parsers_never_panic(b in prop::collection::vec(any::<u8>(), 0..=200)) {
        let _ = XrcReqData::parse(&b);
        let _ = XrcRepData::parse(&b);
        let _ = TargetGone::parse(&b);
        let _ = XrcRepData::first_srqn_compat(&b);
    }
}
