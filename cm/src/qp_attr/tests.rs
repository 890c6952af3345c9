//! Field-by-field tests of [`qp_attr`] against REQ/REPs the Linux kernel made (the captures in
//! `fixtures/captures/kernel/`, rxe over RoCEv2) and against REQs formatted the way the
//! kernel's `cm_format_req` does for native IB (LIDs, alternate path).

use super::*;
use crate::mad::cm::{CmMessage, Mad};
use crate::mad::codes::Rate;
use crate::mad::frame;
use crate::mad::types::{CommId, TimeoutExp, U3, U4};

/// The REQ/REP pairs of a classic pcap file (24-byte file header, 16-byte record headers),
/// matched by the REQ's Local Communication ID.
fn req_reps(pcap: &[u8]) -> Vec<(Req, Rep)> {
    let magic = u32::from_le_bytes(pcap[0..4].try_into().unwrap());
    let le = match magic {
        0xa1b2_c3d4 | 0xa1b2_3c4d => true,
        0xd4c3_b2a1 | 0x4d3c_b2a1 => false,
        other => panic!("not a pcap file: magic {other:#x}"),
    };
    let u32_at = |b: &[u8], at: usize| {
        let bytes: [u8; 4] = b[at..at + 4].try_into().unwrap();
        if le {
            u32::from_le_bytes(bytes)
        } else {
            u32::from_be_bytes(bytes)
        }
    };
    let link_type = u32_at(pcap, 20);
    let mut at = 24;
    let mut reqs = Vec::new();
    let mut reps = Vec::new();
    while at + 16 <= pcap.len() {
        let incl = u32_at(pcap, at + 8) as usize;
        let data = &pcap[at + 16..at + 16 + incl];
        at += 16 + incl;
        let Some(Ok(mad)) = frame::decode(link_type, data).unwrap().mad() else {
            continue;
        };
        match Mad::parse(mad).unwrap().msg {
            CmMessage::Req(req) => reqs.push(req),
            CmMessage::Rep(rep) => reps.push(rep),
            _ => {}
        }
    }
    let mut pairs = Vec::new();
    for req in reqs {
        if pairs
            .iter()
            .any(|(r, _): &(Req, Rep)| r.local_comm_id == req.local_comm_id)
        {
            continue; // a retransmitted REQ
        }
        if let Some(rep) = reps
            .iter()
            .find(|rep| rep.remote_comm_id == req.local_comm_id)
        {
            pairs.push((req, *rep));
        }
    }
    pairs
}

fn one_pair(pcap: &[u8]) -> (Req, Rep) {
    let pairs = req_reps(pcap);
    assert_eq!(pairs.len(), 1);
    pairs[0]
}

fn rping() -> (Req, Rep) {
    one_pair(include_bytes!(
        "../../../fixtures/captures/kernel/rping_3.pcap"
    ))
}

fn xrc() -> (Req, Rep) {
    one_pair(include_bytes!(
        "../../../fixtures/captures/kernel/xrc_handshake_no_qp.pcap"
    ))
}

/// An IPv4-mapped GID, as RoCEv2 over IPv4 uses.
fn v4(a: [u8; 4]) -> Gid {
    let mut g = [0u8; 16];
    g[10] = 0xff;
    g[11] = 0xff;
    g[12..].copy_from_slice(&a);
    Gid(g)
}

const PORT: LocalPort = LocalPort {
    port_num: 1,
    pkey_index: 0,
    sgid_index: 3,
    lmc: 0,
};

fn roce<'a>(req: &'a Req, rep: &'a Rep, side: Side) -> Connection<'a> {
    Connection::new(req, rep, side, LinkLayer::Ethernet, PORT)
}

fn attr(conn: &Connection<'_>, state: QpState) -> (QpAttr, QpAttrMask) {
    qp_attr(conn, state).unwrap()
}

use QpAttrMask as M;

#[test]
fn mask_and_flag_bits_are_the_verbs_values() {
    // rdma-core verbs.h: enum ibv_qp_attr_mask, enum ibv_access_flags.
    let bits = [
        (M::STATE, 1),
        (M::CUR_STATE, 2),
        (M::EN_SQD_ASYNC_NOTIFY, 4),
        (M::ACCESS_FLAGS, 8),
        (M::PKEY_INDEX, 16),
        (M::PORT, 32),
        (M::QKEY, 64),
        (M::AV, 128),
        (M::PATH_MTU, 256),
        (M::TIMEOUT, 512),
        (M::RETRY_CNT, 1024),
        (M::RNR_RETRY, 2048),
        (M::RQ_PSN, 4096),
        (M::MAX_QP_RD_ATOMIC, 8192),
        (M::ALT_PATH, 16384),
        (M::MIN_RNR_TIMER, 32768),
        (M::SQ_PSN, 65536),
        (M::MAX_DEST_RD_ATOMIC, 131072),
        (M::PATH_MIG_STATE, 262144),
        (M::CAP, 524288),
        (M::DEST_QPN, 1048576),
    ];
    for (flag, value) in bits {
        assert_eq!(flag.bits(), value, "{flag:?}");
    }
    assert_eq!(AccessFlags::LOCAL_WRITE.bits(), 1);
    assert_eq!(AccessFlags::REMOTE_WRITE.bits(), 2);
    assert_eq!(AccessFlags::REMOTE_READ.bits(), 4);
    assert_eq!(AccessFlags::REMOTE_ATOMIC.bits(), 8);
    assert_eq!(
        [QpState::Reset, QpState::Init, QpState::Rtr, QpState::Rts].map(QpState::ibv),
        [0, 1, 2, 3]
    );
    assert_eq!(MigState::Rearm.ibv(), 1);
    assert_eq!(
        format!("{:?}", M::STATE | M::SQ_PSN),
        "QpAttrMask(STATE | SQ_PSN)"
    );
    let m = M::STATE | M::AV;
    assert!(m.contains(M::AV) && !m.contains(M::AV | M::PORT));
    assert!(M::empty().is_empty());
}

#[test]
fn the_fixtures_are_what_the_tests_expect() {
    let (req, rep) = rping();
    assert_eq!(req.transport(), ReqTransport::Rc);
    assert_eq!(req.local_qpn.get(), 0x18);
    assert_eq!(req.starting_psn.get(), 0x647bbb);
    assert_eq!(rep.local_qpn.get(), 0x15);
    assert_eq!(rep.starting_psn.get(), 0x0fd2ad);
    assert_eq!(req.primary_path.local_ack_timeout.get(), 19);
    assert_eq!(rep.target_ack_delay.get(), 15);
    let (req, rep) = xrc();
    assert!(req.is_xrc());
    assert_eq!(rep.xrc_tgt_qpn().get(), 0xc0ffe0);
    assert_eq!(rep.local_qpn.get(), 0);
}

#[test]
fn rc_passive_init() {
    let (req, rep) = rping();
    let (a, m) = attr(&roce(&req, &rep, Side::Passive), QpState::Init);
    assert_eq!(m, M::STATE | M::ACCESS_FLAGS | M::PKEY_INDEX | M::PORT);
    assert_eq!(a.qp_state, QpState::Init);
    // REP Responder Resources 1: read and atomic on top of write.
    assert_eq!(
        a.qp_access_flags,
        AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_ATOMIC
    );
    assert_eq!(a.pkey_index, 0);
    assert_eq!(a.port_num, 1);
}

#[test]
fn rc_passive_rtr() {
    let (req, rep) = rping();
    let (a, m) = attr(&roce(&req, &rep, Side::Passive), QpState::Rtr);
    assert_eq!(
        m,
        M::STATE
            | M::AV
            | M::PATH_MTU
            | M::DEST_QPN
            | M::RQ_PSN
            | M::MAX_DEST_RD_ATOMIC
            | M::MIN_RNR_TIMER
    );
    assert_eq!(a.qp_state, QpState::Rtr);
    assert_eq!(a.dest_qp_num.get(), 0x18, "REQ Local QPN");
    assert_eq!(a.rq_psn.get(), 0x0fd2ad, "REP Starting PSN");
    assert_eq!(a.path_mtu, Mtu::Mtu1024);
    assert_eq!(a.max_dest_rd_atomic, 1, "REP Responder Resources");
    assert_eq!(a.min_rnr_timer, 0);
    let grh = a.ah_attr.grh.unwrap();
    assert_eq!(grh.dgid, v4([10, 77, 0, 2]), "the REQ's Local Port GID");
    assert_eq!(grh.flow_label.get(), 0x380a0);
    assert_eq!(grh.hop_limit, 64);
    assert_eq!(grh.traffic_class, 0);
    assert_eq!(grh.sgid_index, 3);
    assert_eq!(a.ah_attr.dlid, Lid(0), "no LIDs on RoCE");
    assert_eq!(a.ah_attr.src_path_bits, 0);
    assert_eq!(a.ah_attr.sl, 0);
    assert_eq!(a.ah_attr.static_rate, 0);
    assert_eq!(a.ah_attr.port_num, 1);
}

#[test]
fn rc_passive_rts() {
    let (req, rep) = rping();
    let (a, m) = attr(&roce(&req, &rep, Side::Passive), QpState::Rts);
    assert_eq!(
        m,
        M::STATE | M::SQ_PSN | M::RETRY_CNT | M::RNR_RETRY | M::MAX_QP_RD_ATOMIC | M::TIMEOUT
    );
    assert_eq!(a.sq_psn.get(), 0x647bbb, "REQ Starting PSN");
    assert_eq!(a.retry_cnt, 7, "REQ Retry Count");
    assert_eq!(a.rnr_retry, 7, "REQ RNR Retry Count");
    assert_eq!(a.max_rd_atomic, 1, "REP Initiator Depth");
    // Local ACK Timeout 19: packet life time 18, timeout 18 + 1.
    assert_eq!(a.timeout, 19);
    assert_eq!(a.path_mig_state, MigState::Migrated);
}

#[test]
fn rc_active_init_rtr_rts() {
    let (req, rep) = rping();
    let conn = roce(&req, &rep, Side::Active);
    let (a, m) = attr(&conn, QpState::Init);
    assert_eq!(m, M::STATE | M::ACCESS_FLAGS | M::PKEY_INDEX | M::PORT);
    // REP Initiator Depth 1 = our responder resources.
    assert_eq!(
        a.qp_access_flags,
        AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_ATOMIC
    );

    let (a, m) = attr(&conn, QpState::Rtr);
    assert!(m.contains(M::MAX_DEST_RD_ATOMIC | M::MIN_RNR_TIMER | M::AV | M::DEST_QPN));
    assert!(!m.contains(M::ALT_PATH));
    assert_eq!(a.dest_qp_num.get(), 0x15, "REP Local QPN");
    assert_eq!(a.rq_psn.get(), 0x647bbb, "REQ Starting PSN");
    assert_eq!(a.max_dest_rd_atomic, 1, "REP Initiator Depth");
    assert_eq!(a.path_mtu, Mtu::Mtu1024);
    let grh = a.ah_attr.grh.unwrap();
    assert_eq!(grh.dgid, v4([10, 77, 0, 1]), "the REQ's Remote Port GID");
    assert_eq!(grh.flow_label.get(), 0x380a0);
    assert_eq!(grh.hop_limit, 64);

    let (a, m) = attr(&conn, QpState::Rts);
    assert_eq!(
        m,
        M::STATE | M::SQ_PSN | M::RETRY_CNT | M::RNR_RETRY | M::MAX_QP_RD_ATOMIC | M::TIMEOUT
    );
    assert_eq!(a.sq_psn.get(), 0x0fd2ad, "REP Starting PSN");
    assert_eq!(a.retry_cnt, 7);
    assert_eq!(a.rnr_retry, 7, "REP RNR Retry Count");
    assert_eq!(a.max_rd_atomic, 1, "REP Responder Resources");
    // cm_ack_timeout(Target ACK Delay 15, life time 18) = 19.
    assert_eq!(a.timeout, 19);
}

#[test]
fn rc_responder_resources_cross_over() {
    let (mut req, mut rep) = rping();
    rep.responder_resources = 4;
    rep.initiator_depth = 0;
    req.retry_count = U3::masked(5);
    req.rnr_retry_count = U3::masked(3);
    rep.rnr_retry_count = U3::masked(6);
    let passive = roce(&req, &rep, Side::Passive);
    let active = roce(&req, &rep, Side::Active);
    assert_eq!(attr(&passive, QpState::Rtr).0.max_dest_rd_atomic, 4);
    assert_eq!(attr(&passive, QpState::Rts).0.max_rd_atomic, 0);
    assert_eq!(attr(&active, QpState::Rtr).0.max_dest_rd_atomic, 0);
    assert_eq!(attr(&active, QpState::Rts).0.max_rd_atomic, 4);
    // No responder resources on the active side: write only.
    assert_eq!(
        attr(&active, QpState::Init).0.qp_access_flags,
        AccessFlags::REMOTE_WRITE
    );
    let (p, a) = (
        attr(&passive, QpState::Rts).0,
        attr(&active, QpState::Rts).0,
    );
    assert_eq!((p.retry_cnt, a.retry_cnt), (5, 5), "both from the REQ");
    assert_eq!(
        (p.rnr_retry, a.rnr_retry),
        (3, 6),
        "REQ for passive, REP for active"
    );
}

#[test]
fn xrc_ini_active() {
    let (req, rep) = xrc();
    let conn = roce(&req, &rep, Side::Active);
    assert_eq!(conn.qp_type(), Some(QpType::XrcIni));
    let (a, _) = attr(&conn, QpState::Init);
    // REP Initiator Depth 0 (a TGT never initiates): no read/atomic.
    assert_eq!(a.qp_access_flags, AccessFlags::REMOTE_WRITE);

    let (a, m) = attr(&conn, QpState::Rtr);
    assert_eq!(m, M::STATE | M::AV | M::PATH_MTU | M::DEST_QPN | M::RQ_PSN);
    assert_eq!(
        a.dest_qp_num.get(),
        0xc0ffe0,
        "the TGT QPN from the REP's Local EECN"
    );
    assert_eq!(a.rq_psn.get(), 0x35a3a1);
    assert_eq!(a.ah_attr.grh.unwrap().dgid, v4([10, 77, 0, 1]));

    let (a, m) = attr(&conn, QpState::Rts);
    assert_eq!(
        m,
        M::STATE | M::SQ_PSN | M::RETRY_CNT | M::RNR_RETRY | M::MAX_QP_RD_ATOMIC | M::TIMEOUT
    );
    assert_eq!(a.sq_psn.get(), 0x754b30);
    assert_eq!(a.retry_cnt, 0, "the XRC REQ carries no Retry Count");
    assert_eq!(a.rnr_retry, 7, "REP RNR Retry Count");
    assert_eq!(a.max_rd_atomic, 1, "REP Responder Resources");
    assert_eq!(a.timeout, 19);

    let with_retry = Connection {
        retry_count: Some(6),
        ..conn
    };
    assert_eq!(attr(&with_retry, QpState::Rts).0.retry_cnt, 6);
}

#[test]
fn xrc_tgt_passive() {
    let (req, rep) = xrc();
    let conn = roce(&req, &rep, Side::Passive);
    assert_eq!(conn.qp_type(), Some(QpType::XrcTgt));
    let (a, _) = attr(&conn, QpState::Init);
    assert_eq!(
        a.qp_access_flags,
        AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_ATOMIC
    );

    let (a, m) = attr(&conn, QpState::Rtr);
    assert_eq!(
        m,
        M::STATE
            | M::AV
            | M::PATH_MTU
            | M::DEST_QPN
            | M::RQ_PSN
            | M::MAX_DEST_RD_ATOMIC
            | M::MIN_RNR_TIMER
    );
    assert_eq!(a.dest_qp_num.get(), 0xc0ffe0, "the INI QPN from the REQ");
    assert_eq!(a.rq_psn.get(), 0x754b30);
    assert_eq!(a.max_dest_rd_atomic, 1);
    assert_eq!(a.ah_attr.grh.unwrap().dgid, v4([10, 77, 0, 2]));

    // A TGT only receives: SQ PSN and timeout, no retries, no initiator depth.
    let (a, m) = attr(&conn, QpState::Rts);
    assert_eq!(m, M::STATE | M::SQ_PSN | M::TIMEOUT);
    assert_eq!(a.sq_psn.get(), 0x35a3a1);
    assert_eq!(a.timeout, 19);
}

#[test]
fn uc_both_sides() {
    let (mut req, rep) = rping();
    req.set_transport(ReqTransport::Uc);
    for side in [Side::Active, Side::Passive] {
        let conn = roce(&req, &rep, side);
        assert_eq!(conn.qp_type(), Some(QpType::Uc));
        let (_, m) = attr(&conn, QpState::Init);
        assert_eq!(m, M::STATE | M::ACCESS_FLAGS | M::PKEY_INDEX | M::PORT);
        let (a, m) = attr(&conn, QpState::Rtr);
        assert_eq!(m, M::STATE | M::AV | M::PATH_MTU | M::DEST_QPN | M::RQ_PSN);
        assert_eq!(a.max_dest_rd_atomic, 0);
        let (a, m) = attr(&conn, QpState::Rts);
        assert_eq!(m, M::STATE | M::SQ_PSN, "{side:?}");
        assert_eq!(a.timeout, 0);
    }
}

#[test]
fn unsupported_transport_and_state() {
    let (mut req, rep) = rping();
    assert_eq!(
        qp_attr(&roce(&req, &rep, Side::Passive), QpState::Reset),
        Err(QpAttrError::UnsupportedState)
    );
    req.transport_service_type = crate::mad::codes::TransportType::Rd;
    assert_eq!(
        qp_attr(&roce(&req, &rep, Side::Passive), QpState::Rtr),
        Err(QpAttrError::UnsupportedTransport(ReqTransport::Other))
    );
}

/// A native-IB REQ the way `cm_format_req` builds it from path records: hop limit ≤ 1, so
/// real LIDs and Subnet Local; the active side is LID 0x11, the passive side LID 0x22.
fn ib_req(with_alt: bool) -> (Req, Rep) {
    let (mut req, mut rep) = rping();
    let path = |slid, dlid, sl| PathInfo {
        local_lid: Lid(slid),
        remote_lid: Lid(dlid),
        local_gid: Gid([0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x11]),
        remote_gid: Gid([0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x22]),
        flow_label: FlowLabel::masked(0),
        packet_rate: Rate::from_raw(7),
        traffic_class: 0,
        hop_limit: 0,
        sl: U4::masked(sl),
        subnet_local: true,
        // cm_ack_timeout(ack delay 16, packet life time 16) = 18.
        local_ack_timeout: TimeoutExp::masked(18),
    };
    req.primary_path = path(0x11, 0x22, 2);
    if with_alt {
        req.alternate_path = path(0x13, 0x25, 3);
        req.alternate_path.local_ack_timeout = TimeoutExp::masked(20);
    }
    rep.target_ack_delay = TimeoutExp::masked(16);
    (req, rep)
}

#[test]
fn ib_lids_no_grh_no_alt() {
    let (req, rep) = ib_req(false);
    let port = LocalPort { lmc: 1, ..PORT };
    for (side, dlid, bits) in [(Side::Passive, 0x11, 0), (Side::Active, 0x22, 1)] {
        let conn = Connection::new(&req, &rep, side, LinkLayer::InfiniBand, port);
        let (a, m) = attr(&conn, QpState::Rtr);
        assert!(!m.contains(M::ALT_PATH));
        assert_eq!(a.ah_attr.grh, None, "hop limit 0: no GRH");
        assert_eq!(a.ah_attr.dlid, Lid(dlid), "{side:?}");
        // LMC 1: the low bit of our own LID (0x22 passive, 0x11 active).
        assert_eq!(a.ah_attr.src_path_bits, bits, "{side:?}");
        assert_eq!(a.ah_attr.sl, 2);
        assert_eq!(a.ah_attr.static_rate, 7);
        let (a, m) = attr(&conn, QpState::Rts);
        assert!(!m.contains(M::PATH_MIG_STATE));
        // Passive: 18 − 1 + 1; active: cm_ack_timeout(16, 17) = 18.
        assert_eq!(a.timeout, 18, "{side:?}");
    }
}

#[test]
fn ib_alternate_path() {
    let (req, rep) = ib_req(true);
    let alt_port = LocalPort {
        port_num: 2,
        pkey_index: 5,
        sgid_index: 0,
        lmc: 0,
    };
    for (side, dlid) in [(Side::Passive, 0x13), (Side::Active, 0x25)] {
        let conn = Connection {
            alt_port: Some(alt_port),
            ..Connection::new(&req, &rep, side, LinkLayer::InfiniBand, PORT)
        };
        let (a, m) = attr(&conn, QpState::Rtr);
        assert!(m.contains(M::ALT_PATH), "{side:?}");
        assert_eq!(a.alt_ah_attr.dlid, Lid(dlid), "{side:?}");
        assert_eq!(a.alt_ah_attr.sl, 3);
        assert_eq!(a.alt_ah_attr.port_num, 2);
        assert_eq!(a.alt_port_num, 2);
        assert_eq!(a.alt_pkey_index, 5);
        // Passive: 20 − 1 + 1; active: cm_ack_timeout(16, 19) = 20.
        assert_eq!(a.alt_timeout, 20, "{side:?}");
        let (a, m) = attr(&conn, QpState::Rts);
        assert!(m.contains(M::PATH_MIG_STATE));
        assert_eq!(a.path_mig_state, MigState::Rearm);
    }
    // Without an alternate port the primary port serves.
    let conn = Connection::new(&req, &rep, Side::Active, LinkLayer::InfiniBand, PORT);
    assert_eq!(attr(&conn, QpState::Rtr).0.alt_port_num, 1);
    // RoCE: the alternate address vector has no DLID, so the kernel never loads it.
    let conn = Connection::new(&req, &rep, Side::Active, LinkLayer::Ethernet, PORT);
    assert!(!attr(&conn, QpState::Rtr).1.contains(M::ALT_PATH));
    assert!(!attr(&conn, QpState::Rts).1.contains(M::PATH_MIG_STATE));
}

/// A LAP's alternate path from its sender's view: the sender's port is LID `slid`, the
/// receiver's `dlid`; Local ACK Timeout 20 (packet life time 19).
fn lap_path(slid: u16, dlid: u16) -> PathInfo {
    PathInfo {
        local_lid: Lid(slid),
        remote_lid: Lid(dlid),
        local_gid: Gid([
            0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, slid as u8,
        ]),
        remote_gid: Gid([
            0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, dlid as u8,
        ]),
        flow_label: FlowLabel::masked(0x54321),
        packet_rate: Rate::from_raw(7),
        traffic_class: 0x40,
        hop_limit: 0,
        sl: U4::masked(4),
        subnet_local: true,
        local_ack_timeout: TimeoutExp::masked(20),
    }
}

#[test]
fn lap_alternate_path_from_either_end() {
    let (req, rep) = ib_req(false);
    let alt_port = LocalPort {
        port_num: 2,
        pkey_index: 5,
        sgid_index: 1,
        lmc: 2,
    };
    // The active side sends the LAP (its alternate port LID 0x13, the peer's 0x25); then the
    // passive side sends one (its port LID 0x26, the peer's 0x14). Each end loads the path
    // towards the other; the sender's timeout is cm_ack_timeout(peer's ACK delay, 19): 20
    // with the REP's 16 on the active side, 20 with 0 on the passive side (it has none); the
    // receiver's 20 − 1 + 1.
    for (path, sender, receiver) in [
        (lap_path(0x13, 0x25), Side::Active, Side::Passive),
        (lap_path(0x26, 0x14), Side::Passive, Side::Active),
    ] {
        for (side, role, dlid, slid) in [
            (sender, LapRole::Sender, path.remote_lid, path.local_lid),
            (receiver, LapRole::Receiver, path.local_lid, path.remote_lid),
        ] {
            let conn = Connection {
                alt_port: Some(alt_port),
                ..Connection::new(&req, &rep, side, LinkLayer::InfiniBand, PORT)
            };
            let (a, m) = alt_path_attr(&conn, &path, role).unwrap();
            assert_eq!(m, M::ALT_PATH | M::PATH_MIG_STATE, "{side:?} {role:?}");
            assert!(!m.contains(M::STATE), "a modify in RTS, as the kernel's");
            assert_eq!(a.qp_state, QpState::Rts);
            assert_eq!(a.path_mig_state, MigState::Rearm);
            assert_eq!(a.alt_ah_attr.dlid, dlid, "{side:?} {role:?}");
            assert_eq!(a.alt_ah_attr.src_path_bits, (slid.0 & 3) as u8);
            assert_eq!(a.alt_ah_attr.grh, None, "hop limit 0: no GRH");
            assert_eq!(a.alt_ah_attr.sl, 4);
            assert_eq!(a.alt_ah_attr.static_rate, 7);
            assert_eq!(a.alt_ah_attr.port_num, 2);
            assert_eq!((a.alt_port_num, a.alt_pkey_index), (2, 5));
            assert_eq!(a.alt_timeout, 20, "{side:?} {role:?}");
            // Nothing of the primary path.
            assert_eq!(a.ah_attr, AhAttr::default());
            assert_eq!(a.timeout, 0);
        }
    }
    // A GRH (hop limit > 0) goes to the other end's GID, from either view.
    let mut path = lap_path(0x13, 0x25);
    path.hop_limit = 2;
    let conn = Connection::new(&req, &rep, Side::Active, LinkLayer::InfiniBand, PORT);
    let grh = alt_path_attr(&conn, &path, LapRole::Sender)
        .unwrap()
        .0
        .alt_ah_attr
        .grh
        .unwrap();
    assert_eq!(grh.dgid, path.remote_gid);
    assert_eq!((grh.hop_limit, grh.traffic_class), (2, 0x40));
    assert_eq!(grh.flow_label, FlowLabel::masked(0x54321));
    assert_eq!(
        grh.sgid_index, 3,
        "the primary port: no alternate port given"
    );
    let conn = Connection::new(&req, &rep, Side::Passive, LinkLayer::InfiniBand, PORT);
    let (a, _) = alt_path_attr(&conn, &path, LapRole::Receiver).unwrap();
    assert_eq!(a.alt_ah_attr.grh.unwrap().dgid, path.local_gid);
    assert_eq!(a.alt_port_num, 1);
    // The sender's path record's life time, when given, instead of the path's timeout − 1:
    // cm_ack_timeout(16, 0) = 16.
    let conn = Connection {
        alt_packet_life_time: Some(0),
        ..Connection::new(&req, &rep, Side::Active, LinkLayer::InfiniBand, PORT)
    };
    let (a, _) = alt_path_attr(&conn, &lap_path(0x13, 0x25), LapRole::Sender).unwrap();
    assert_eq!(a.alt_timeout, 16);
    // The passive side sends with no peer ACK delay: cm_ack_timeout(0, 0) = 2.
    let conn = Connection {
        alt_packet_life_time: Some(0),
        ..Connection::new(&req, &rep, Side::Passive, LinkLayer::InfiniBand, PORT)
    };
    let (a, _) = alt_path_attr(&conn, &lap_path(0x26, 0x14), LapRole::Sender).unwrap();
    assert_eq!(a.alt_timeout, 2);
    // The receiver ignores it: the LAP's timeout is all it has.
    let (a, _) = alt_path_attr(&conn, &lap_path(0x13, 0x25), LapRole::Receiver).unwrap();
    assert_eq!(a.alt_timeout, 20);
}

#[test]
fn lap_alternate_path_refused_without_one_to_load() {
    let (mut req, rep) = ib_req(false);
    let path = lap_path(0x13, 0x25);
    // RoCE: the kernel loads no alternate path (and drops LAPs).
    let conn = Connection::new(&req, &rep, Side::Active, LinkLayer::Ethernet, PORT);
    assert_eq!(
        alt_path_attr(&conn, &path, LapRole::Sender),
        Err(QpAttrError::NoAlternatePath)
    );
    // No destination LID for this end.
    let ib = Connection::new(&req, &rep, Side::Active, LinkLayer::InfiniBand, PORT);
    let mut no_dlid = path;
    no_dlid.remote_lid = Lid(0);
    assert_eq!(
        alt_path_attr(&ib, &no_dlid, LapRole::Sender),
        Err(QpAttrError::NoAlternatePath)
    );
    assert!(alt_path_attr(&ib, &no_dlid, LapRole::Receiver).is_ok());
    assert_eq!(
        alt_path_attr(&ib, &PathInfo::default(), LapRole::Receiver),
        Err(QpAttrError::NoAlternatePath)
    );
    // A transport without a connected QP.
    req.transport_service_type = crate::mad::codes::TransportType::Rd;
    let ib = Connection::new(&req, &rep, Side::Passive, LinkLayer::InfiniBand, PORT);
    assert_eq!(
        alt_path_attr(&ib, &path, LapRole::Receiver),
        Err(QpAttrError::UnsupportedTransport(ReqTransport::Other))
    );
}

#[test]
fn ib_grh_when_hop_limit_above_zero() {
    let (mut req, rep) = ib_req(false);
    req.primary_path.hop_limit = 4;
    let conn = Connection::new(&req, &rep, Side::Active, LinkLayer::InfiniBand, PORT);
    let grh = attr(&conn, QpState::Rtr).0.ah_attr.grh.unwrap();
    assert_eq!(grh.hop_limit, 4);
    assert_eq!(grh.dgid, req.primary_path.remote_gid);
    // The passive side takes the received GRH's hop limit when it has it.
    let conn = Connection {
        received_hop_limit: Some(0xff),
        ..Connection::new(&req, &rep, Side::Passive, LinkLayer::InfiniBand, PORT)
    };
    let grh = attr(&conn, QpState::Rtr).0.ah_attr.grh.unwrap();
    assert_eq!(grh.hop_limit, 0xff);
    assert_eq!(grh.dgid, req.primary_path.local_gid);
}

#[test]
fn active_timeout_from_the_path_record() {
    let (req, rep) = ib_req(false);
    // Life time 0 with a CA ACK delay of 16: the REQ would say 16, the QP gets
    // cm_ack_timeout(16, 0) = 16, whatever the REQ says.
    let conn = Connection {
        packet_life_time: Some(0),
        ..Connection::new(&req, &rep, Side::Active, LinkLayer::InfiniBand, PORT)
    };
    assert_eq!(attr(&conn, QpState::Rts).0.timeout, 16);
}

#[test]
fn ack_timeout_is_the_kernel_rule() {
    // (CA ACK delay, packet life time) -> exponent, worked by hand from cm_ack_timeout.
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
        assert_eq!(ack_timeout(delay, life), want, "({delay}, {life})");
    }
}

#[test]
fn negotiate_accept_caps_the_offer() {
    let (mut req, _) = rping();
    req.responder_resources = 16;
    req.initiator_depth = 2;
    assert_eq!(
        negotiate_accept(&req, 8, 4),
        RdAtomic {
            responder_resources: 2,
            initiator_depth: 4
        }
    );
    assert_eq!(
        negotiate_accept(&req, 1, 32),
        RdAtomic {
            responder_resources: 1,
            initiator_depth: 16
        }
    );
}

/// Over 20 kernel-made connections (cmtime): each side's attributes are the mirror of the
/// other's, as two QPs must be to talk.
#[test]
fn both_ends_of_kernel_connections_match() {
    let pairs = req_reps(include_bytes!(
        "../../../fixtures/captures/kernel/cmtime_first_20_connections.pcap"
    ));
    assert_eq!(pairs.len(), 20);
    let mut comm_ids: Vec<CommId> = Vec::new();
    for (req, rep) in &pairs {
        comm_ids.push(req.local_comm_id);
        let p = roce(req, rep, Side::Passive);
        let a = roce(req, rep, Side::Active);
        let (p_rtr, a_rtr) = (attr(&p, QpState::Rtr).0, attr(&a, QpState::Rtr).0);
        let (p_rts, a_rts) = (attr(&p, QpState::Rts).0, attr(&a, QpState::Rts).0);
        assert_eq!(p_rtr.dest_qp_num, req.local_qpn);
        assert_eq!(a_rtr.dest_qp_num, rep.local_qpn);
        assert_eq!(p_rtr.rq_psn, a_rts.sq_psn);
        assert_eq!(a_rtr.rq_psn, p_rts.sq_psn);
        assert_eq!(p_rtr.max_dest_rd_atomic, a_rts.max_rd_atomic);
        assert_eq!(a_rtr.max_dest_rd_atomic, p_rts.max_rd_atomic);
        assert_eq!(p_rtr.path_mtu, a_rtr.path_mtu);
        let (pg, ag) = (p_rtr.ah_attr.grh.unwrap(), a_rtr.ah_attr.grh.unwrap());
        assert_eq!(pg.dgid, req.primary_path.local_gid);
        assert_eq!(ag.dgid, req.primary_path.remote_gid);
        assert_eq!(pg.flow_label, ag.flow_label);
        // Same ACK delay on both rxe ends: both sides agree on the timeout.
        assert_eq!(p_rts.timeout, a_rts.timeout);
    }
    comm_ids.sort();
    comm_ids.dedup();
    assert_eq!(comm_ids.len(), 20);
}
