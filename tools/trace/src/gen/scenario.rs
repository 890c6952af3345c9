//! A generated capture of the data paths no public capture shows: XRC traffic attributed by
//! the SRQ numbers the REPs announced, and UD traffic on the QP a SIDR exchange resolved
//! (`cm-trace-gen --scenario xrc-srq-sidr-ud`).
//!
//! The XRC CM exchanges replay the kernel-made `kernel/xrc_handshake_no_qp.pcap` (REQ, REP,
//! RTU, DREQ, DREP between 10.77.0.2 and 10.77.0.1) twice, as two INI QPs of the same host
//! (QPNs 0x000101 and 0x000102) attached to one TGT QP (0x000200): the first REP announces
//! SRQs 0x000300 and 0x000301 in ibcm's XRC REP private data, the second SRQ 0x000310. The
//! TGT QPN cannot tell the two connections' traffic apart, the SRQ numbers can:
//! * INI 0x101: two XRC SENDs to SRQ 0x301, each ACKed;
//! * INI 0x102: RDMA WRITEs to SRQ 0x310 with PSNs 5000, 5002 (a gap), a NAK (PSN sequence
//!   error, PSN 5001), the resent 5001 and 5002, an ACK.
//!
//! Then a SIDR exchange (SIDR_REQ from 10.77.0.2, SIDR_REP with status 0, QPN 0x000400,
//! Q_Key 0x11112222) and UD SENDs: three from QP 0x000500 to QP 0x400 under that Q_Key, one
//! under Q_Key 0xdeadbeef (which the receiving QP drops), two replies from QP 0x400 to QP
//! 0x500. All frames are RoCEv2/IPv4 with valid IP checksums and ICRCs.

use std::io::Write;
use std::net::{IpAddr, Ipv4Addr};
use std::path::Path;
use std::time::Duration;

use super::{instance_mad, load_template, GenConfig, GenSummary, ETHERNET};
use crate::capture::{PcapFileWriter, TsResolution};
use ibcm_mad::frame::{
    self, bth, icrc, udp, BthRepr, DethRepr, Encap, EthernetRepr, IpRepr, Opcode, RoceV2UdRepr,
    UdpRepr, ROCEV2_UDP_PORT,
};
use ibcm_mad::xrc::{OwnershipPolicy, SrqNum, XrcRepData};
use ibcm_mad::{
    CmMessage, Mad, PrivateData, Psn, Qkey, Qpn, RequestId, ServiceId, SidrRep, SidrReq,
    SidrStatus, Tid, U2,
};

/// The scenario's name on the command line.
pub const NAME: &str = "xrc-srq-sidr-ud";

/// The TGT QP both XRC connections attach to.
const TGT_QPN: u32 = 0x200;
/// The SIDR-resolved UD QP, its Q_Key, and the requester's UD QP.
const UD_QPN: u32 = 0x400;
const UD_QKEY: u32 = 0x1111_2222;
const CLIENT_QPN: u32 = 0x500;

/// One frame to write.
type Out = (Duration, Vec<u8>);

fn qpn(v: u32) -> Qpn {
    Qpn::masked(v)
}

/// Ends of the scenario: the INI host (the XRC active side and SIDR requester) and the target.
struct Hosts {
    /// Ethernet header from the INI host to the target (and the reverse).
    to_tgt: EthernetRepr,
    to_ini: EthernetRepr,
    ini: Ipv4Addr,
    tgt: Ipv4Addr,
}

impl Hosts {
    fn eth(&self, to_tgt: bool) -> &EthernetRepr {
        if to_tgt {
            &self.to_tgt
        } else {
            &self.to_ini
        }
    }

    fn ips(&self, to_tgt: bool) -> (Ipv4Addr, Ipv4Addr) {
        if to_tgt {
            (self.ini, self.tgt)
        } else {
            (self.tgt, self.ini)
        }
    }
}

/// A RoCEv2/IPv4 frame: `bth` (its PadCnt set here), then `body` (extension headers and
/// payload), pad bytes and the ICRC.
fn data_frame(h: &Hosts, to_tgt: bool, bth_repr: BthRepr, body: &[u8]) -> Result<Vec<u8>, String> {
    let pad = (4 - body.len() % 4) % 4;
    let udp_payload = bth::HEADER_LEN + body.len() + pad + icrc::ICRC_LEN;
    let (src, dst) = h.ips(to_tgt);
    let gsi = RoceV2UdRepr::gsi(IpAddr::V4(src), IpAddr::V4(dst), 0, 49152, Psn::masked(0))
        .map_err(|e| e.to_string())?;
    let ip = match gsi.ip {
        IpRepr::V4(r) => IpRepr::V4(frame::Ipv4Repr {
            payload_len: udp::HEADER_LEN + udp_payload,
            ..r
        }),
        v6 => v6,
    };
    let eth = EthernetRepr {
        ethertype: frame::EtherType::IPV4,
        ..*h.eth(to_tgt)
    };
    let el = eth.buffer_len();
    let il = ip.buffer_len();
    let mut f = vec![0u8; el + il + udp::HEADER_LEN + udp_payload];
    eth.emit(&mut frame::eth::Packet::new_unchecked(&mut f[..]));
    let rest = f.get_mut(el..).ok_or("frame")?;
    ip.emit(rest);
    let u = UdpRepr {
        src_port: 49152,
        dst_port: ROCEV2_UDP_PORT,
        payload_len: udp_payload,
    };
    let rest = f.get_mut(el + il..).ok_or("frame")?;
    u.emit(&mut udp::Packet::new_unchecked(rest));
    let t = el + il + udp::HEADER_LEN;
    let b = BthRepr {
        pad_count: U2::masked(u8::try_from(pad).unwrap_or(0)),
        ..bth_repr
    };
    let rest = f.get_mut(t..).ok_or("frame")?;
    b.emit(&mut bth::Packet::new_unchecked(rest));
    f.get_mut(t + bth::HEADER_LEN..t + bth::HEADER_LEN + body.len())
        .ok_or("frame")?
        .copy_from_slice(body);
    let packet = f.get_mut(el..).ok_or("frame")?;
    icrc::fill(Encap::RoceV2Ipv4, packet).map_err(|e| e.to_string())?;
    Ok(f)
}

fn bth_for(opcode: u8, dest: u32, psn: u32) -> BthRepr {
    BthRepr {
        opcode: Opcode(opcode),
        solicited: false,
        mig_req: false,
        pad_count: U2::masked(0),
        tver: ibcm_mad::U4::masked(0),
        pkey: ibcm_mad::Pkey::DEFAULT,
        fecn: false,
        becn: false,
        dest_qp: qpn(dest),
        ack_req: opcode & 0x1f != 0x11,
        psn: Psn::masked(psn),
    }
}

/// An XRC request: XRCETH (the SRQ number), then `ext` (RETH, …) and `payload` bytes.
fn xrc_request(
    h: &Hosts,
    opcode: u8,
    psn: u32,
    srqn: u32,
    ext: &[u8],
    payload: usize,
) -> Result<Vec<u8>, String> {
    let mut body = srqn.to_be_bytes().to_vec();
    body.extend_from_slice(ext);
    body.resize(body.len() + payload, 0x5a);
    data_frame(h, true, bth_for(opcode, TGT_QPN, psn), &body)
}

/// An XRC ACK (or NAK) from the TGT QP back to INI QP `ini`.
fn xrc_ack(h: &Hosts, ini: u32, psn: u32, syndrome: u8) -> Result<Vec<u8>, String> {
    let aeth = [syndrome, 0, 0, 1];
    data_frame(h, false, bth_for(0xb1, ini, psn), &aeth)
}

/// A UD SEND Only with a 64-byte payload.
fn ud_send(
    h: &Hosts,
    to_tgt: bool,
    (src_qp, dest_qp): (u32, u32),
    qkey: u32,
    psn: u32,
) -> Result<Vec<u8>, String> {
    let deth = DethRepr {
        qkey: Qkey(qkey),
        src_qp: qpn(src_qp),
    };
    let mut body = [0u8; 8 + 64];
    deth.emit(&mut frame::deth::Packet::new_unchecked(&mut body[..]));
    data_frame(h, to_tgt, bth_for(0x64, dest_qp, psn), &body)
}

/// A CM MAD between the hosts (GSI QP1 to QP1).
fn cm_frame(h: &Hosts, to_tgt: bool, mad: &Mad, psn: u32) -> Result<Vec<u8>, String> {
    let (src, dst) = h.ips(to_tgt);
    let roce = RoceV2UdRepr::gsi(IpAddr::V4(src), IpAddr::V4(dst), 0, 49153, Psn::masked(psn))
        .map_err(|e| e.to_string())?;
    let bytes = mad.to_bytes();
    let eth = h.eth(to_tgt);
    let mut f = vec![0u8; roce.frame_len(eth, bytes.len())];
    let n = roce
        .emit_frame(eth, &bytes, &mut f)
        .map_err(|e| e.to_string())?;
    f.truncate(n);
    Ok(f)
}

/// The two XRC connections' CM frames (from the template) and their data.
fn xrc_part(fixtures: &Path, t0: Duration, out: &mut Vec<Out>) -> Result<Hosts, String> {
    let tp = load_template(&fixtures.join("kernel/xrc_handshake_no_qp.pcap"))?;
    let ms = |n: u64| t0 + Duration::from_micros(n * 1000);
    let mut hosts: Option<Hosts> = None;
    // (instance, INI QPN, SRQ numbers announced, whether the TGT QP was created).
    let conns: [(u64, u32, &[u32], bool); 2] = [
        (0, 0x101, &[0x300, 0x301], true),
        (1, 0x102, &[0x310], false),
    ];
    for (inst, ini, srqns, created) in conns {
        for k in 0..tp.len() {
            let Some((f, mut mad)) = instance_mad(&tp, inst, k) else {
                continue;
            };
            let to_tgt = matches!(
                mad.msg,
                CmMessage::Req(_) | CmMessage::Rtu(_) | CmMessage::Dreq(_)
            );
            let when = match &mut mad.msg {
                CmMessage::Req(r) => {
                    r.local_qpn = qpn(ini);
                    ms(inst * 3)
                }
                CmMessage::Rep(r) => {
                    r.set_xrc_tgt_qpn(qpn(TGT_QPN));
                    let x = XrcRepData {
                        tgt_qpn: qpn(TGT_QPN),
                        policy: OwnershipPolicy::Shared,
                        created,
                        srqns: srqns.iter().filter_map(|&s| SrqNum::new(s)).collect(),
                    };
                    let mut pd = [0u8; 196];
                    x.write(&[], &mut pd).map_err(|e| e.to_string())?;
                    r.private_data = PrivateData(pd);
                    ms(inst * 3 + 1)
                }
                CmMessage::Rtu(_) => ms(inst * 3 + 2),
                CmMessage::Dreq(_) => ms(50 + inst * 2),
                _ => ms(51 + inst * 2),
            };
            if hosts.is_none() {
                let (IpAddr::V4(a), IpAddr::V4(b)) = (f.roce.ip.src_addr(), f.roce.ip.dst_addr())
                else {
                    return Err("the XRC template is not IPv4".to_string());
                };
                // The template's first frame is the REQ, from the INI host.
                let rev = EthernetRepr {
                    src_addr: f.eth.dst_addr,
                    dst_addr: f.eth.src_addr,
                    ..f.eth
                };
                hosts = Some(Hosts {
                    to_tgt: f.eth,
                    to_ini: rev,
                    ini: a,
                    tgt: b,
                });
            }
            let h = hosts.as_ref().ok_or("no frames")?;
            let psn = u32::try_from(inst * 16 + k as u64).unwrap_or(0);
            out.push((when, cm_frame(h, to_tgt, &mad, psn)?));
        }
    }
    let h = hosts.ok_or("the XRC template has no frames")?;
    let us = |n: u64| t0 + Duration::from_micros(10_000 + n * 100);
    // INI 0x101: two SENDs to SRQ 0x301, each ACKed.
    out.push((us(0), xrc_request(&h, 0xa4, 1000, 0x301, &[], 100)?));
    out.push((us(1), xrc_ack(&h, 0x101, 1000, 0x00)?));
    out.push((us(2), xrc_request(&h, 0xa4, 1001, 0x301, &[], 100)?));
    out.push((us(3), xrc_ack(&h, 0x101, 1001, 0x00)?));
    // INI 0x102: WRITE Only (RETH: VA, R_Key, length 256) to SRQ 0x310, a gap, a NAK, resends.
    let mut reth = [0u8; 16];
    reth[12..].copy_from_slice(&256u32.to_be_bytes());
    out.push((us(4), xrc_request(&h, 0xaa, 5000, 0x310, &reth, 256)?));
    out.push((us(5), xrc_request(&h, 0xaa, 5002, 0x310, &reth, 256)?));
    out.push((us(6), xrc_ack(&h, 0x102, 5001, 0x60)?));
    out.push((us(7), xrc_request(&h, 0xaa, 5001, 0x310, &reth, 256)?));
    out.push((us(8), xrc_request(&h, 0xaa, 5002, 0x310, &reth, 256)?));
    out.push((us(9), xrc_ack(&h, 0x102, 5002, 0x00)?));
    Ok(h)
}

/// The SIDR exchange and its UD traffic.
fn sidr_part(h: &Hosts, t0: Duration, out: &mut Vec<Out>) -> Result<(), String> {
    let t = |us: u64| t0 + Duration::from_micros(us);
    let service_id = ServiceId(0x0000_0000_0111_4455);
    let req = SidrReq {
        request_id: RequestId(0x5151_0001),
        partition_key: ibcm_mad::Pkey::DEFAULT,
        service_id,
        private_data: PrivateData::zeroed(),
    };
    let rep = SidrRep {
        request_id: RequestId(0x5151_0001),
        status: SidrStatus::Success,
        qpn: qpn(UD_QPN),
        service_id,
        qkey: Qkey(UD_QKEY),
        ..SidrRep::default()
    };
    let tid = Tid(0x0000_0001_5151_0001);
    out.push((
        t(20_000),
        cm_frame(h, true, &Mad::new(tid, CmMessage::SidrReq(req)), 100)?,
    ));
    out.push((
        t(20_500),
        cm_frame(h, false, &Mad::new(tid, CmMessage::SidrRep(rep)), 200)?,
    ));
    let to = (CLIENT_QPN, UD_QPN);
    let back = (UD_QPN, CLIENT_QPN);
    out.push((t(30_000), ud_send(h, true, to, UD_QKEY, 1)?));
    out.push((t(30_100), ud_send(h, false, back, UD_QKEY, 7)?));
    out.push((t(30_200), ud_send(h, true, to, UD_QKEY, 2)?));
    out.push((t(30_300), ud_send(h, true, to, 0xdead_beef, 3)?));
    out.push((t(30_400), ud_send(h, false, back, UD_QKEY, 8)?));
    out.push((t(30_500), ud_send(h, true, to, UD_QKEY, 4)?));
    Ok(())
}

/// Writes the scenario (module docs) as a pcap (Ethernet, microsecond timestamps), starting
/// at `cfg.start`; `fixtures` is the `fixtures/captures` folder with the XRC template.
///
/// # Errors
/// The template cannot be read, or writing failed.
pub fn data_scenario<W: Write>(
    fixtures: &Path,
    cfg: &GenConfig,
    out: W,
) -> Result<GenSummary, String> {
    let mut frames: Vec<Out> = Vec::new();
    let h = xrc_part(fixtures, cfg.start, &mut frames)?;
    sidr_part(&h, cfg.start, &mut frames)?;
    frames.sort_by_key(|(t, _)| *t);
    let mut w =
        PcapFileWriter::new(out, ETHERNET, TsResolution::Micro).map_err(|e| e.to_string())?;
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
