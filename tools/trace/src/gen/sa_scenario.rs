//! A generated native-InfiniBand capture of SA PathRecord exchanges next to the CM exchanges
//! they served (`cm-trace-gen --scenario sa-pathrecord`): no public capture has the SA answer
//! of a current OpenSM in front of a REQ.
//!
//! What is real: the SA answers are the 256 bytes of the PathRecord GetResp OpenSM 3.3.23 sent
//! in the native-IB lab (`fixtures/sa/opensm_pathrecord_getresp.bin`: SLID 3 → DLID 4, SGID
//! fe80::10:3, DGID fe80::10:5, SL 0, MTU 2048, 10 Gb/s, PacketLifeTime 18, P_Key 0xFFFF,
//! reversible), unchanged but for the TID of the second and third answers, made to match
//! their queries. What is made up: everything else (the Get queries, the CM messages, the
//! timing, the CA GUIDs and comm IDs, the LRH/BTH/DETH framing, built with
//! [`IbUdRepr`]; ICRCs and VCRCs computed). Hosts: LID 3 (the active side, GID
//! fe80::10:3), LID 4 (GID fe80::10:5), the SM at LID 1.
//!
//! 1. Exchange 1: Get PathRecord SLID 3 / DLID 4 (ComponentMask 0x30) with the answer's own
//!    TID `0x00010000000051b9`, the OpenSM GetResp; then connection 1 (REQ, REP, RTU, DREQ,
//!    DREP from LID 3 to LID 4) whose REQ primary path is what the kernel's
//!    `cm_format_req` makes of the record (local ACK timeout 19 = `cm_ack_timeout(15, 18)`,
//!    Path MTU 2048, P_Key 0xFFFF).
//! 2. Connection 2, from LID 4 back to LID 3: the reverse path, which the record does not
//!    describe (no SA rows).
//! 3. Exchange 2 (TID …51ba), then connection 3 from LID 3 to LID 4 whose REQ disagrees
//!    with the record: SL 3 and a local ACK timeout of 14 (below PacketLifeTime 18 + 1).
//! 4. Exchange 3 (TID …51bb): answered, and no REQ follows it (it serves no connection).
//! 5. Exchange 4 (TID …51bc): a Get for DLID 7 that goes unanswered.

use std::io::Write;
use std::path::Path;
use std::time::Duration;

use super::{GenConfig, GenSummary};
use crate::capture::{PcapFileWriter, TsResolution};
use ibcm_mad::frame::IbUdRepr;
use ibcm_mad::sa::{comp, method, PathRecord, SaMad};
use ibcm_mad::{
    CmMessage, CommId, Drep, Dreq, Gid, Guid, Lid, Mad, Mtu, PathInfo, Pkey, Psn, Qkey, Qpn, Rate,
    Rep, Req, ReqTransport, Rtu, ServiceId, Tid, TimeoutExp, U3, U4,
};

/// The scenario's name on the command line.
pub const NAME: &str = "sa-pathrecord";

/// LINKTYPE_INFINIBAND.
const INFINIBAND: u32 = 247;

/// The SM's LID and the two hosts'.
const SM: u16 = 1;
const HOST_A: u16 = 3;
const HOST_B: u16 = 4;

/// The TID OpenSM's answer carries (bits 63–32 ibsim's rewrite, 31–0 the asker's PID).
const TID: u64 = 0x0001_0000_0000_51b9;

/// The path of OpenSM's GetResp, relative to the `fixtures/captures` folder.
const OPENSM_GETRESP: &str = "../sa/opensm_pathrecord_getresp.bin";

/// The lab's port GID `fe80::10:<host>`.
fn gid(host: u8) -> Gid {
    Gid([0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x10, 0, host])
}

/// A GSI MAD in a native IB packet (UD SEND Only, QP1 to QP1) from `slid` to `dlid`.
fn ib_frame(slid: u16, dlid: u16, psn: u32, mad: &[u8]) -> Result<Vec<u8>, String> {
    let r = IbUdRepr::gsi(Lid(slid), Lid(dlid), Psn::masked(psn));
    let mut f = vec![0u8; r.packet_len(mad.len())];
    let n = r.emit(mad, &mut f).map_err(|e| e.to_string())?;
    f.truncate(n);
    Ok(f)
}

/// A PathRecord Get from LID 3 for SLID 3 / DLID `dlid`.
fn get(tid: u64, dlid: u16) -> Vec<u8> {
    let mut q = SaMad::request(
        method::GET,
        Tid(tid),
        ibcm_mad::sa::attr::PATH_RECORD,
        comp::SLID | comp::DLID,
    );
    // The fields the mask leaves out are zero, as a client sends them.
    let t = PathRecord {
        slid: Lid(HOST_A),
        dlid: Lid(dlid),
        ..PathRecord::parse_fixed(&[0; PathRecord::LEN])
    };
    if let Some(d) = q.data.get_mut(..PathRecord::LEN) {
        d.copy_from_slice(&t.to_bytes());
    }
    q.to_bytes().to_vec()
}

/// OpenSM's answer with TID `tid` (bytes 8–15).
fn answer(opensm: &[u8], tid: u64) -> Vec<u8> {
    let mut a = opensm.to_vec();
    if let Some(t) = a.get_mut(8..16) {
        t.copy_from_slice(&tid.to_be_bytes());
    }
    a
}

/// The REQ primary path `cm_format_req` makes of OpenSM's record from a port with CA ACK
/// delay 15, with `sl` and `ack` in its place.
fn path(sl: u8, ack: u8) -> PathInfo {
    PathInfo {
        local_lid: Lid(HOST_A),
        remote_lid: Lid(HOST_B),
        local_gid: gid(3),
        remote_gid: gid(5),
        packet_rate: Rate::G10,
        sl: U4::masked(sl),
        subnet_local: true,
        local_ack_timeout: TimeoutExp::masked(ack),
        ..PathInfo::default()
    }
}

/// One connection's CM messages: (time offset µs, from the active side, MAD).
fn connection(n: u32, primary: PathInfo, (active, passive): (u64, u64)) -> Vec<(u64, bool, Mad)> {
    let a = CommId(0x5a00_0000 | n);
    let p = CommId(0xa500_0000 | n);
    let tid = |k: u64| Tid(0x0000_0002_0000_0000 | (u64::from(n) << 8) | k);
    let mut req = Req {
        local_comm_id: a,
        // An OUI-based Service ID (the 0x0002c9 OUI) no dissector gives a meaning.
        service_id: ServiceId(0x0002_c903_0000_5a00 | u64::from(n)),
        local_ca_guid: Guid(active),
        local_qkey: Qkey(0),
        local_qpn: Qpn::masked(0x100 + n),
        responder_resources: 4,
        initiator_depth: 4,
        remote_cm_response_timeout: TimeoutExp::masked(20),
        starting_psn: Psn::masked(0x1000 * n),
        local_cm_response_timeout: TimeoutExp::masked(20),
        retry_count: U3::masked(7),
        partition_key: Pkey::DEFAULT,
        path_mtu: Mtu::Mtu2048,
        rnr_retry_count: U3::masked(7),
        max_cm_retries: U4::masked(15),
        primary_path: primary,
        ..Req::default()
    };
    req.set_transport(ReqTransport::Rc);
    let rep = Rep {
        local_comm_id: p,
        remote_comm_id: a,
        local_qpn: Qpn::masked(0x200 + n),
        starting_psn: Psn::masked(0x2000 * n),
        responder_resources: 4,
        initiator_depth: 4,
        target_ack_delay: TimeoutExp::masked(15),
        rnr_retry_count: U3::masked(7),
        local_ca_guid: Guid(passive),
        ..Rep::default()
    };
    vec![
        (0, true, Mad::new(tid(1), CmMessage::Req(req))),
        (200, false, Mad::new(tid(1), CmMessage::Rep(rep))),
        (
            350,
            true,
            Mad::new(
                tid(1),
                CmMessage::Rtu(Rtu {
                    local_comm_id: a,
                    remote_comm_id: p,
                    ..Rtu::default()
                }),
            ),
        ),
        (
            5_000,
            true,
            Mad::new(
                tid(2),
                CmMessage::Dreq(Dreq {
                    local_comm_id: a,
                    remote_comm_id: p,
                    remote_qpn_eecn: Qpn::masked(0x200 + n),
                    ..Dreq::default()
                }),
            ),
        ),
        (
            5_200,
            false,
            Mad::new(
                tid(2),
                CmMessage::Drep(Drep {
                    local_comm_id: p,
                    remote_comm_id: a,
                    ..Drep::default()
                }),
            ),
        ),
    ]
}

/// Writes the scenario (module docs) as a pcap (LINKTYPE_INFINIBAND, microsecond
/// timestamps), starting at `cfg.start`; `fixtures` is the `fixtures/captures` folder (OpenSM's
/// answer is read from `../sa/` next to it).
///
/// # Errors
/// OpenSM's answer cannot be read (or is not 256 bytes), or writing failed.
pub fn sa_scenario<W: Write>(
    fixtures: &Path,
    cfg: &GenConfig,
    out: W,
) -> Result<GenSummary, String> {
    let src = fixtures.join(OPENSM_GETRESP);
    let opensm = std::fs::read(&src).map_err(|e| format!("{}: {e}", src.display()))?;
    if opensm.len() != 256 {
        return Err(format!("{}: not a 256-byte MAD", src.display()));
    }
    let us = |n: u64| cfg.start + Duration::from_micros(n);
    let mut frames: Vec<(Duration, Vec<u8>)> = Vec::new();
    let mut psn = 0u32;
    let mut push = |t: Duration, slid: u16, dlid: u16, mad: &[u8]| -> Result<(), String> {
        psn += 1;
        frames.push((t, ib_frame(slid, dlid, psn, mad)?));
        Ok(())
    };
    let (guid_a, guid_b) = (0x0002_c903_0000_0103, 0x0002_c903_0000_0105);
    // 1. Exchange 1 and the connection that follows its record.
    push(us(0), HOST_A, SM, &get(TID, HOST_B))?;
    push(us(45), SM, HOST_A, &answer(&opensm, TID))?;
    let conns = [
        (1, 200, path(0, 19), (HOST_A, HOST_B), (guid_a, guid_b)),
        // 2. The reverse direction: no PathRecord of the capture describes it.
        (
            2,
            20_000,
            PathInfo {
                local_lid: Lid(HOST_B),
                remote_lid: Lid(HOST_A),
                local_gid: gid(5),
                remote_gid: gid(3),
                ..path(0, 19)
            },
            (HOST_B, HOST_A),
            (guid_b, guid_a),
        ),
        // 3. After exchange 2: SL 3 and ACK timeout 14 disagree with the record.
        (3, 50_200, path(3, 14), (HOST_A, HOST_B), (guid_a, guid_b)),
    ];
    push(us(50_000), HOST_A, SM, &get(TID + 1, HOST_B))?;
    push(us(50_045), SM, HOST_A, &answer(&opensm, TID + 1))?;
    for (n, at, primary, (a, b), guids) in conns {
        for (dt, from_active, mad) in connection(n, primary, guids) {
            let (s, d) = if from_active { (a, b) } else { (b, a) };
            push(us(at + dt), s, d, &mad.to_bytes())?;
        }
    }
    // 4. Answered, and no REQ follows; 5. unanswered.
    push(us(80_000), HOST_A, SM, &get(TID + 2, HOST_B))?;
    push(us(80_045), SM, HOST_A, &answer(&opensm, TID + 2))?;
    push(us(90_000), HOST_A, SM, &get(TID + 3, 7))?;
    frames.sort_by_key(|(t, _)| *t);
    let mut w =
        PcapFileWriter::new(out, INFINIBAND, TsResolution::Micro).map_err(|e| e.to_string())?;
    let mut sum = GenSummary {
        connections: 3,
        ..GenSummary::default()
    };
    for (t, f) in &frames {
        w.write(*t, f).map_err(|e| e.to_string())?;
        sum.packets += 1;
        sum.bytes += f.len() as u64;
    }
    w.into_inner().map_err(|e| e.to_string())?;
    Ok(sum)
}
