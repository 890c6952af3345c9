//! RoCEv2 emitters: a UD datagram (BTH + DETH + payload + pad + ICRC) as a UDP payload, as an
//! IP packet, or as a whole Ethernet frame (docs/framing.md §1.1, §2); and the native
//! InfiniBand UD packet (LRH, optional GRH, BTH, DETH, payload, ICRC, VCRC) of an IB capture.

use core::net::IpAddr;

use super::decode::IpRepr;
use super::wire::{fill, set_bytes};
use super::{
    bth, deth, eth, grh, icrc, ipv4, ipv6, lrh, udp, vcrc, xrceth, BthRepr, DethRepr, Encap,
    EtherType, EthernetRepr, FrameError, GrhRepr, Ipv4Repr, Ipv6Repr, Lnh, LrhRepr, Opcode,
    UdpRepr, XrcethRepr, ROCEV2_UDP_PORT,
};
use crate::types::{FlowLabel, Lid, Pkey, Psn, Qpn, U2, U4};
use crate::xrc::SrqNum;

/// Headers of a RoCEv2 UD SEND Only datagram.
///
/// The emitters fill in everything derived from the payload: IP total/payload length, IP
/// protocol / next header (17), IPv4 header checksum, UDP length, UDP checksum (0), BTH
/// PadCnt (and zeroed pad bytes), and the ICRC (little-endian). The fields the ICRC covers
/// and the caller chooses are the IP addresses, IPv4 identification and flags, UDP ports,
/// P_Key, PSN, destination QP, source QP and Q_Key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RoceV2UdRepr {
    /// IP header (lengths and protocol are overwritten).
    pub ip: IpRepr,
    /// UDP ports (the length is overwritten).
    pub udp: UdpRepr,
    /// BTH; the opcode must be UD SEND Only (0x64); PadCnt is overwritten.
    pub bth: BthRepr,
    /// DETH.
    pub deth: DethRepr,
}

/// Length of BTH + DETH.
const TRANSPORT_HEADERS: usize = bth::HEADER_LEN + deth::HEADER_LEN;

/// Largest IP + UDP header emitted (IPv6).
const MAX_IP_UDP: usize = ipv6::HEADER_LEN + udp::HEADER_LEN;

impl RoceV2UdRepr {
    /// Headers for a GSI (QP1) MAD in the way Linux rxe sends one: IPv4 TOS 0, TTL 64, DF,
    /// IP ID `ident`; or IPv6 traffic class 0, flow label 0, hop limit 64; UDP destination
    /// port 4791; BTH opcode 0x64, P_Key 0xFFFF, destination QP 1; DETH Q_Key 0x8001_0000,
    /// source QP 1. Adjust fields afterwards as needed.
    ///
    /// # Errors
    /// [`FrameError::FieldOutOfRange`] if `src` and `dst` are not of the same family.
    pub fn gsi(
        src: IpAddr,
        dst: IpAddr,
        ident: u16,
        src_port: u16,
        psn: Psn,
    ) -> Result<Self, FrameError> {
        let ip = match (src, dst) {
            (IpAddr::V4(src_addr), IpAddr::V4(dst_addr)) => IpRepr::V4(Ipv4Repr {
                src_addr,
                dst_addr,
                protocol: ipv4::PROTOCOL_UDP,
                tos: 0,
                ttl: 64,
                ident,
                dont_frag: true,
                more_frags: false,
                frag_offset: 0,
                payload_len: 0,
            }),
            (IpAddr::V6(src_addr), IpAddr::V6(dst_addr)) => IpRepr::V6(Ipv6Repr {
                src_addr,
                dst_addr,
                next_header: ipv4::PROTOCOL_UDP,
                hop_limit: 64,
                traffic_class: 0,
                flow_label: FlowLabel::masked(0),
                payload_len: 0,
            }),
            _ => {
                return Err(FrameError::FieldOutOfRange {
                    layer: "IP",
                    field: "address family",
                    value: 0,
                })
            }
        };
        Ok(RoceV2UdRepr {
            ip,
            udp: UdpRepr {
                src_port,
                dst_port: ROCEV2_UDP_PORT,
                payload_len: 0,
            },
            bth: BthRepr {
                opcode: Opcode::UD_SEND_ONLY,
                solicited: false,
                mig_req: false,
                pad_count: U2::masked(0),
                tver: U4::masked(0),
                pkey: Pkey::DEFAULT,
                fecn: false,
                becn: false,
                dest_qp: Qpn::masked(1),
                ack_req: false,
                psn,
            },
            deth: DethRepr::GSI,
        })
    }

    /// Length of the UDP payload: BTH + DETH + payload + pad + ICRC.
    pub const fn udp_payload_len(&self, payload_len: usize) -> usize {
        TRANSPORT_HEADERS + payload_len + pad_len(payload_len) + icrc::ICRC_LEN
    }

    /// Length of the IP packet (IP header + UDP header + UDP payload).
    pub fn ip_packet_len(&self, payload_len: usize) -> usize {
        self.ip.buffer_len() + udp::HEADER_LEN + self.udp_payload_len(payload_len)
    }

    /// Length of the Ethernet frame (no FCS).
    pub fn frame_len(&self, eth: &EthernetRepr, payload_len: usize) -> usize {
        eth.buffer_len() + self.ip_packet_len(payload_len)
    }

    /// The IP and UDP headers for a payload of `payload_len` bytes, in a stack buffer.
    fn ip_udp(&self, payload_len: usize) -> Result<([u8; MAX_IP_UDP], usize), FrameError> {
        if self.bth.opcode != Opcode::UD_SEND_ONLY {
            return Err(FrameError::FieldOutOfRange {
                layer: "BTH",
                field: "opcode",
                value: u64::from(self.bth.opcode.0),
            });
        }
        ip_udp_headers(&self.ip, &self.udp, self.udp_payload_len(payload_len))
    }

    /// Writes BTH, DETH, payload, pad and ICRC into `out`; `ip_udp` are the headers the ICRC
    /// covers.
    fn emit_transport(
        &self,
        ip_udp: &[u8],
        payload: &[u8],
        out: &mut [u8],
    ) -> Result<usize, FrameError> {
        let mut deth = [0u8; deth::HEADER_LEN];
        self.deth
            .emit(&mut deth::Packet::new_unchecked(&mut deth[..]));
        emit_transport("RoCEv2 UD datagram", ip_udp, &self.bth, &deth, payload, out)
    }

    /// Emits the UDP payload (BTH + DETH + `payload` + pad + ICRC) into `out`, as handed to a
    /// UDP socket bound to the RoCEv2 port. The ICRC covers the IP and UDP headers the kernel
    /// will build, so `self.ip` and `self.udp` must match them (addresses, IPv4 ID and
    /// flags, ports).
    ///
    /// Returns the number of bytes written ([`Self::udp_payload_len`]).
    ///
    /// # Errors
    /// [`FrameError::BufferTooSmall`]; [`FrameError::FieldOutOfRange`] for an opcode other
    /// than 0x64 or a payload too long for the UDP/IP length fields.
    pub fn emit_udp_payload(&self, payload: &[u8], out: &mut [u8]) -> Result<usize, FrameError> {
        let (hdr, hdr_len) = self.ip_udp(payload.len())?;
        self.emit_transport(hdr.get(..hdr_len).unwrap_or(&[]), payload, out)
    }

    /// Emits the IP packet (IP header, UDP header, UDP payload) into `out`. Returns the
    /// number of bytes written ([`Self::ip_packet_len`]).
    ///
    /// # Errors
    /// As [`Self::emit_udp_payload`].
    pub fn emit_ip_packet(&self, payload: &[u8], out: &mut [u8]) -> Result<usize, FrameError> {
        let need = self.ip_packet_len(payload.len());
        if out.len() < need {
            return Err(FrameError::BufferTooSmall {
                layer: "RoCEv2 IP packet",
                need,
                have: out.len(),
            });
        }
        let (hdr, hdr_len) = self.ip_udp(payload.len())?;
        let hdr = hdr.get(..hdr_len).unwrap_or(&[]);
        set_bytes(out, 0, hdr);
        let rest = out.get_mut(hdr_len..).unwrap_or(&mut []);
        Ok(hdr_len + self.emit_transport(hdr, payload, rest)?)
    }

    /// Emits a whole Ethernet frame (no FCS) into `out`: `eth` (its EtherType is replaced by
    /// IPv4/IPv6), then [`Self::emit_ip_packet`]. Returns the number of bytes written
    /// ([`Self::frame_len`]).
    ///
    /// # Errors
    /// As [`Self::emit_udp_payload`].
    pub fn emit_frame(
        &self,
        eth: &EthernetRepr,
        payload: &[u8],
        out: &mut [u8],
    ) -> Result<usize, FrameError> {
        let need = self.frame_len(eth, payload.len());
        if out.len() < need {
            return Err(FrameError::BufferTooSmall {
                layer: "RoCEv2 Ethernet frame",
                need,
                have: out.len(),
            });
        }
        let eth = EthernetRepr {
            ethertype: match self.ip {
                IpRepr::V4(_) => EtherType::IPV4,
                IpRepr::V6(_) => EtherType::IPV6,
            },
            ..*eth
        };
        eth.emit(&mut eth::Packet::new_unchecked(&mut *out));
        let hl = eth.buffer_len();
        let rest = out.get_mut(hl..).unwrap_or(&mut []);
        Ok(hl + self.emit_ip_packet(payload, rest)?)
    }
}

/// The IP and UDP headers of a RoCEv2 packet whose UDP payload is `udp_payload` bytes, in a
/// stack buffer (lengths, protocol and the IPv4 checksum filled in), and their length.
fn ip_udp_headers(
    ip: &IpRepr,
    udp: &UdpRepr,
    udp_payload: usize,
) -> Result<([u8; MAX_IP_UDP], usize), FrameError> {
    let hl = ip.buffer_len();
    let max = usize::from(u16::MAX) - udp::HEADER_LEN - if hl == ipv4::HEADER_LEN { hl } else { 0 };
    if udp_payload > max {
        return Err(FrameError::FieldOutOfRange {
            layer: "UDP",
            field: "length",
            value: u64::try_from(udp_payload + udp::HEADER_LEN).unwrap_or(u64::MAX),
        });
    }
    let ip = match *ip {
        IpRepr::V4(r) => IpRepr::V4(Ipv4Repr {
            protocol: ipv4::PROTOCOL_UDP,
            payload_len: udp::HEADER_LEN + udp_payload,
            ..r
        }),
        IpRepr::V6(r) => IpRepr::V6(Ipv6Repr {
            next_header: ipv4::PROTOCOL_UDP,
            payload_len: udp::HEADER_LEN + udp_payload,
            ..r
        }),
    };
    let udp = UdpRepr {
        payload_len: udp_payload,
        ..*udp
    };
    let mut buf = [0u8; MAX_IP_UDP];
    ip.emit(&mut buf);
    if let Some(u) = buf.get_mut(hl..) {
        udp.emit(&mut udp::Packet::new_unchecked(u));
    }
    Ok((buf, hl + udp::HEADER_LEN))
}

/// Pad bytes for a payload of `payload_len` bytes.
const fn pad_len(payload_len: usize) -> usize {
    (4 - payload_len % 4) % 4
}

/// Writes `bth` (its PadCnt set), the extension header bytes `ext`, `payload`, pad and the
/// ICRC into `out`; `ip_udp` are the headers the ICRC covers. Returns the length written.
fn emit_transport(
    layer: &'static str,
    ip_udp: &[u8],
    bth: &BthRepr,
    ext: &[u8],
    payload: &[u8],
    out: &mut [u8],
) -> Result<usize, FrameError> {
    let pad = pad_len(payload.len());
    let headers = bth::HEADER_LEN + ext.len();
    let n = headers + payload.len() + pad + icrc::ICRC_LEN;
    let have = out.len();
    let out = out.get_mut(..n).ok_or(FrameError::BufferTooSmall {
        layer,
        need: n,
        have,
    })?;
    let bth = BthRepr {
        pad_count: U2::masked(u8::try_from(pad).unwrap_or(0)),
        ..*bth
    };
    bth.emit(&mut bth::Packet::new_unchecked(&mut *out));
    set_bytes(out, bth::HEADER_LEN, ext);
    set_bytes(out, headers, payload);
    let pad_at = headers + payload.len();
    fill(out, pad_at..pad_at + pad, 0);
    let icrc_at = n - icrc::ICRC_LEN;
    let crc = icrc::icrc_rocev2(ip_udp, out.get(..icrc_at).unwrap_or(&[]))?;
    set_bytes(out, icrc_at, &crc.to_le_bytes());
    Ok(n)
}

/// Headers of a RoCEv2 XRC SEND Only packet (opcode 0xA4): a message on an XRC connection,
/// from the initiator's INI QP to the target's TGT QP (the BTH's destination QP), received
/// into the SRQ its XRCETH names.
///
/// As with [`RoceV2UdRepr`], the emitter fills in the lengths, the BTH PadCnt, the pad and
/// the ICRC; the caller chooses the addresses, ports, P_Key, destination QP, PSN and SRQ.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RoceV2XrcSendRepr {
    /// IP header (lengths and protocol are overwritten).
    pub ip: IpRepr,
    /// UDP ports (the length is overwritten).
    pub udp: UdpRepr,
    /// BTH; PadCnt is overwritten.
    pub bth: BthRepr,
    /// XRCETH.
    pub xrceth: XrcethRepr,
}

impl RoceV2XrcSendRepr {
    /// Headers of an XRC SEND Only from `src` (UDP source port `src_port`) to TGT QP
    /// `tgt_qpn` at `dst` (port 4791), PSN `psn`, for SRQ `srqn`: IP as
    /// [`RoceV2UdRepr::gsi`] sets it, P_Key 0xFFFF, AckReq set.
    ///
    /// # Errors
    /// [`FrameError::FieldOutOfRange`] if `src` and `dst` are not of the same family.
    pub fn send_only(
        src: IpAddr,
        dst: IpAddr,
        src_port: u16,
        tgt_qpn: Qpn,
        psn: Psn,
        srqn: SrqNum,
    ) -> Result<Self, FrameError> {
        let ud = RoceV2UdRepr::gsi(src, dst, 0, src_port, psn)?;
        Ok(Self {
            ip: ud.ip,
            udp: ud.udp,
            bth: BthRepr {
                opcode: Opcode::XRC_SEND_ONLY,
                dest_qp: tgt_qpn,
                ack_req: true,
                ..ud.bth
            },
            xrceth: XrcethRepr { srqn },
        })
    }

    /// Length of the UDP payload: BTH + XRCETH + payload + pad + ICRC.
    pub const fn udp_payload_len(&self, payload_len: usize) -> usize {
        bth::HEADER_LEN + xrceth::HEADER_LEN + payload_len + pad_len(payload_len) + icrc::ICRC_LEN
    }

    /// Emits the UDP payload (BTH + XRCETH + `payload` + pad + ICRC) into `out`, as handed to
    /// a UDP socket; the ICRC covers the IP and UDP headers of `self`, which must match the
    /// ones the kernel builds. Returns the number of bytes written.
    ///
    /// # Errors
    /// [`FrameError::BufferTooSmall`]; [`FrameError::FieldOutOfRange`] for a payload too
    /// long for the UDP/IP length fields.
    pub fn emit_udp_payload(&self, payload: &[u8], out: &mut [u8]) -> Result<usize, FrameError> {
        let (hdr, hdr_len) =
            ip_udp_headers(&self.ip, &self.udp, self.udp_payload_len(payload.len()))?;
        let mut ext = [0u8; xrceth::HEADER_LEN];
        self.xrceth
            .emit(&mut xrceth::Packet::new_unchecked(&mut ext[..]));
        emit_transport(
            "RoCEv2 XRC SEND",
            hdr.get(..hdr_len).unwrap_or(&[]),
            &self.bth,
            &ext,
            payload,
            out,
        )
    }
}

/// Headers of a native InfiniBand UD SEND Only packet as a link-layer capture holds it
/// (`LINKTYPE_INFINIBAND`, 247): LRH, an optional GRH, BTH, DETH, the payload, pad, ICRC and
/// VCRC.
///
/// The emitter fills in everything derived from the payload and the headers present: the LRH
/// LNH (2 without a GRH, 3 with one) and PktLen, the GRH PayLen and NxtHdr (0x1B), the BTH
/// PadCnt (and zeroed pad bytes), the ICRC (little-endian, over the masked LRH/GRH as
/// [`icrc::compute`] does) and the VCRC (little-endian, over LRH through ICRC). The caller
/// chooses the VL, SL, LIDs, GIDs, P_Key, PSN, destination QP, source QP and Q_Key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct IbUdRepr {
    /// LRH (LNH and PktLen are overwritten).
    pub lrh: LrhRepr,
    /// GRH, for a packet that leaves the subnet or carries GIDs (PayLen and NxtHdr are
    /// overwritten).
    pub grh: Option<GrhRepr>,
    /// BTH; the opcode must be UD SEND Only (0x64); PadCnt is overwritten.
    pub bth: BthRepr,
    /// DETH.
    pub deth: DethRepr,
}

impl IbUdRepr {
    /// Headers for a GSI (QP1) MAD from LID `slid` to LID `dlid` inside the subnet: VL 0,
    /// SL 0, no GRH; BTH as [`RoceV2UdRepr::gsi`] sets it (P_Key 0xFFFF, destination QP 1);
    /// DETH Q_Key 0x8001_0000, source QP 1. Adjust fields afterwards as needed.
    pub fn gsi(slid: Lid, dlid: Lid, psn: Psn) -> Self {
        IbUdRepr {
            lrh: LrhRepr {
                vl: U4::masked(0),
                lver: U4::masked(0),
                sl: U4::masked(0),
                lnh: Lnh::IbaLocal,
                dlid,
                pkt_len: 0,
                slid,
            },
            grh: None,
            bth: BthRepr {
                opcode: Opcode::UD_SEND_ONLY,
                solicited: false,
                mig_req: false,
                pad_count: U2::masked(0),
                tver: U4::masked(0),
                pkey: Pkey::DEFAULT,
                fecn: false,
                becn: false,
                dest_qp: Qpn::masked(1),
                ack_req: false,
                psn,
            },
            deth: DethRepr::GSI,
        }
    }

    /// Bytes from the start of the LRH through the ICRC (what PktLen counts, in words).
    pub const fn icrc_end(&self, payload_len: usize) -> usize {
        lrh::HEADER_LEN
            + if self.grh.is_some() {
                grh::HEADER_LEN
            } else {
                0
            }
            + TRANSPORT_HEADERS
            + payload_len
            + pad_len(payload_len)
            + icrc::ICRC_LEN
    }

    /// Length of the packet as captured: LRH through VCRC.
    pub const fn packet_len(&self, payload_len: usize) -> usize {
        self.icrc_end(payload_len) + vcrc::VCRC_LEN
    }

    /// Emits the packet (LRH through VCRC) into `out`. Returns the number of bytes written
    /// ([`Self::packet_len`]).
    ///
    /// # Errors
    /// [`FrameError::BufferTooSmall`]; [`FrameError::FieldOutOfRange`] for an opcode other
    /// than 0x64 or a payload too long for the LRH's 11-bit PktLen.
    pub fn emit(&self, payload: &[u8], out: &mut [u8]) -> Result<usize, FrameError> {
        if self.bth.opcode != Opcode::UD_SEND_ONLY {
            return Err(FrameError::FieldOutOfRange {
                layer: "BTH",
                field: "opcode",
                value: u64::from(self.bth.opcode.0),
            });
        }
        let end = self.icrc_end(payload.len());
        let words = u16::try_from(end / 4)
            .ok()
            .filter(|w| *w <= lrh::field::PKT_LEN_MASK)
            .ok_or(FrameError::FieldOutOfRange {
                layer: "LRH",
                field: "PktLen",
                value: u64::try_from(end / 4).unwrap_or(u64::MAX),
            })?;
        let n = end + vcrc::VCRC_LEN;
        let have = out.len();
        let out = out.get_mut(..n).ok_or(FrameError::BufferTooSmall {
            layer: "IB UD packet",
            need: n,
            have,
        })?;
        let lrh = LrhRepr {
            lnh: if self.grh.is_some() {
                Lnh::IbaGlobal
            } else {
                Lnh::IbaLocal
            },
            pkt_len: words,
            ..self.lrh
        };
        lrh.emit(&mut lrh::Packet::new_unchecked(&mut *out));
        let mut at = lrh::HEADER_LEN;
        if let Some(g) = &self.grh {
            let g = GrhRepr {
                payload_len: u16::try_from(end - at - grh::HEADER_LEN).unwrap_or(u16::MAX),
                next_header: grh::NEXT_HEADER_IBA,
                ..*g
            };
            if let Some(rest) = out.get_mut(at..) {
                g.emit(&mut grh::Packet::new_unchecked(rest));
            }
            at += grh::HEADER_LEN;
        }
        let pad = pad_len(payload.len());
        let bth = BthRepr {
            pad_count: U2::masked(u8::try_from(pad).unwrap_or(0)),
            ..self.bth
        };
        if let Some(rest) = out.get_mut(at..) {
            bth.emit(&mut bth::Packet::new_unchecked(rest));
        }
        at += bth::HEADER_LEN;
        if let Some(rest) = out.get_mut(at..) {
            self.deth.emit(&mut deth::Packet::new_unchecked(rest));
        }
        at += deth::HEADER_LEN;
        set_bytes(out, at, payload);
        at += payload.len();
        fill(out, at..at + pad, 0);
        let encap = if self.grh.is_some() {
            Encap::IbGlobal
        } else {
            Encap::IbLocal
        };
        icrc::fill(encap, out.get_mut(..end).unwrap_or(&mut []))?;
        let v = vcrc::compute(out.get(..end).unwrap_or(&[]));
        set_bytes(out, end, &v.to_le_bytes());
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::{decode, Lnh};
    use crate::types::Gid;

    #[test]
    fn native_ib_ud_packets_decode_with_good_crcs() {
        let mad: Vec<u8> = (0..=255u8).collect();
        for global in [false, true] {
            let mut r = IbUdRepr::gsi(Lid(3), Lid(1), Psn::masked(0x12345));
            r.lrh.sl = U4::masked(5);
            if global {
                r.grh = Some(GrhRepr {
                    traffic_class: 0x20,
                    flow_label: FlowLabel::masked(0xabcde),
                    payload_len: 0,
                    next_header: 0,
                    hop_limit: 3,
                    sgid: Gid([1; 16]),
                    dgid: Gid([2; 16]),
                });
            }
            let mut buf = vec![0xa5u8; r.packet_len(mad.len()) + 7];
            let n = r.emit(&mad, &mut buf).unwrap();
            assert_eq!(n, r.packet_len(mad.len()));
            assert_eq!(n, 8 + if global { 40 } else { 0 } + 20 + 256 + 4 + 2);
            let p = decode(247, &buf[..n]).unwrap().into_ib().unwrap();
            assert!(p.icrc.is_ok() && p.vcrc.is_ok(), "global {global}");
            let lrh = p.lrh.unwrap();
            assert_eq!((lrh.slid, lrh.dlid, lrh.sl.get()), (Lid(3), Lid(1), 5));
            let want = if global {
                Lnh::IbaGlobal
            } else {
                Lnh::IbaLocal
            };
            assert_eq!(lrh.lnh, want);
            assert_eq!(p.grh.is_some(), global);
            assert_eq!((p.bth.dest_qp.get(), p.bth.psn.get()), (1, 0x12345));
            assert_eq!(p.deth, Some(DethRepr::GSI));
            assert_eq!(p.mad().unwrap().unwrap(), &mad[..]);
        }
    }

    #[test]
    fn native_ib_emit_refuses_what_it_cannot_write() {
        let r = IbUdRepr::gsi(Lid(3), Lid(1), Psn::masked(0));
        let mut small = [0u8; 40];
        assert!(matches!(
            r.emit(&[0; 256], &mut small),
            Err(FrameError::BufferTooSmall { .. })
        ));
        let mut big = vec![0u8; 9000];
        assert!(matches!(
            r.emit(&[0; 8192], &mut big),
            Err(FrameError::FieldOutOfRange { layer: "LRH", .. })
        ));
        let rc = IbUdRepr {
            bth: BthRepr {
                opcode: Opcode(0x04),
                ..r.bth
            },
            ..r
        };
        assert!(rc.emit(&[0; 256], &mut big).is_err());
    }
}
