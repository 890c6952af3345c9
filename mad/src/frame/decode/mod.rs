//! The whole-packet decoder: capture record → link layer → network → BTH/DETH → payload,
//! with ICRC/VCRC checks (docs/framing.md §3.4).

use super::eth::{self, EtherType, EthernetRepr, VlanTag, VlanTags};
use super::link::{erf, sll, sll2, ErfRepr, Sll2Repr, SllRepr};
use super::wire::{array_at, u16_at, u32_at};
use super::{
    bth, deth, grh, icrc, ipv4, ipv6, lrh, udp, vcrc, BthRepr, DethRepr, Encap, FrameError,
    GrhRepr, IcrcStatus, Ipv4Repr, Ipv6Repr, Lnh, LrhRepr, UdpRepr, VcrcStatus, ROCEV2_UDP_PORT,
};

mod packet;
#[cfg(test)]
mod tests;

pub use packet::{Decoded, IbPacket, IpRepr, LinkInfo, L2};

/// Size of a MAD (IBTA base MAD).
pub const MAD_LEN: usize = 256;

/// Link-type bits that carry the link type proper; the bits above (26-31) may carry an FCS
/// length flag in classic pcap headers and are masked off.
const LINKTYPE_MASK: u32 = 0x03ff_ffff;

/// LINKTYPE_ETHERNET.
const LINKTYPE_ETHERNET: u32 = 1;
/// LINKTYPE_RAW (IP version from the first nibble).
const LINKTYPE_RAW: u32 = 101;
/// LINKTYPE_LINUX_SLL.
const LINKTYPE_LINUX_SLL: u32 = 113;
/// LINKTYPE_ERF.
const LINKTYPE_ERF: u32 = 197;
/// LINKTYPE_IPV4.
const LINKTYPE_IPV4: u32 = 228;
/// LINKTYPE_IPV6.
const LINKTYPE_IPV6: u32 = 229;
/// LINKTYPE_INFINIBAND (starts with the LRH).
const LINKTYPE_INFINIBAND: u32 = 247;
/// LINKTYPE_LINUX_SLL2.
const LINKTYPE_LINUX_SLL2: u32 = 276;

/// Decoder settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DecodeConfig {
    /// UDP destination port that marks RoCEv2 (default 4791, as Wireshark's
    /// `infiniband.rroce.port`).
    pub rocev2_udp_port: u16,
    /// Compute and compare the ICRC and VCRC (default true). When false both statuses are
    /// [`CrcStatus::NotChecked`](super::CrcStatus::NotChecked).
    pub verify_crc: bool,
    /// Whether packets carry their 4-byte ICRC (default true: tcpdump on RoCE netdevs and
    /// ibdump keep it). Set false for capture paths that strip it; the payload then runs to
    /// the end of the UDP / GRH / LRH length and the ICRC status is
    /// [`CrcStatus::Absent`](super::CrcStatus::Absent).
    pub icrc_present: bool,
}

impl DecodeConfig {
    /// The defaults: port 4791, CRCs checked, ICRC present.
    pub const DEFAULT: DecodeConfig = DecodeConfig {
        rocev2_udp_port: ROCEV2_UDP_PORT,
        verify_crc: true,
        icrc_present: true,
    };
}

impl Default for DecodeConfig {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// Decodes one capture record with the default [`DecodeConfig`].
///
/// `link_type` is the pcap / pcapng link type (bits 26-31 are masked off): 1 Ethernet (any
/// number of VLAN tags), 101 raw IP, 228 IPv4, 229 IPv6, 113 Linux cooked v1, 276 Linux cooked
/// v2, 247 InfiniBand (LRH first), 197 ERF (types 21 InfiniBand, 2/11/16/20 Ethernet, 22/23
/// IPv4/IPv6).
///
/// # Errors
/// [`FrameError::UnsupportedLinkType`]; [`FrameError::Truncated`] when the record ends
/// before the packet does (small snaplen); other variants for impossible lengths or versions.
/// A packet that is simply not IB/RoCE is `Ok(Decoded::NotIb { .. })`.
pub fn decode(link_type: u32, data: &[u8]) -> Result<Decoded<'_>, FrameError> {
    decode_with(&DecodeConfig::DEFAULT, link_type, data)
}

/// [`decode`] with explicit settings (RoCEv2 UDP port, CRC checking).
///
/// # Errors
/// As [`decode`].
pub fn decode_with<'a>(
    config: &DecodeConfig,
    link_type: u32,
    data: &'a [u8],
) -> Result<Decoded<'a>, FrameError> {
    let lt = link_type & LINKTYPE_MASK;
    let mut d = Decoder {
        cfg: config,
        pkt: IbPacket::blank(lt),
    };
    let found = match lt {
        LINKTYPE_ETHERNET => d.ethernet(data, 0),
        LINKTYPE_RAW => d.raw_ip(data, 0, None),
        LINKTYPE_IPV4 => d.raw_ip(data, 0, Some(4)),
        LINKTYPE_IPV6 => d.raw_ip(data, 0, Some(6)),
        LINKTYPE_LINUX_SLL => d.sll(data),
        LINKTYPE_LINUX_SLL2 => d.sll2(data),
        LINKTYPE_INFINIBAND => d.infiniband(data, 0),
        LINKTYPE_ERF => d.erf(data),
        _ => Err(FrameError::UnsupportedLinkType(link_type)),
    }?;
    match found {
        Found::NotIb(what) => Ok(Decoded::NotIb { what }),
        Found::Transport(t) => {
            d.transport(t)?;
            Ok(Decoded::Ib(d.pkt))
        }
    }
}

/// Where the transport packet was found. The layers fill in `Decoder::pkt` as they go (no
/// large values are passed between them) and return where the transport packet is.
enum Found<'a> {
    NotIb(&'static str),
    Transport(Located<'a>),
}

/// A located transport packet.
struct Located<'a> {
    encap: Encap,
    /// From the first network header (IP / GRH / LRH) through the ICRC.
    packet: &'a [u8],
    /// Offset of `packet` in the decoded buffer.
    base: usize,
    /// Offset of the BTH in `packet`.
    hdr_len: usize,
    /// Native IB: the bytes after `packet` (the VCRC, unless cut off).
    after: Option<&'a [u8]>,
}

type Out<'a> = Result<Found<'a>, FrameError>;

struct Decoder<'c, 'a> {
    cfg: &'c DecodeConfig,
    /// The packet being decoded, filled in layer by layer.
    pkt: IbPacket<'a>,
}

fn not_ib<'a>(what: &'static str) -> Out<'a> {
    Ok(Found::NotIb(what))
}

/// Returns a closure that shifts an error's offset by `base`.
fn at(base: usize) -> impl Fn(FrameError) -> FrameError {
    move |e| e.shifted(base)
}

/// The bytes of `data` from `from` on (empty if beyond).
fn tail(data: &[u8], from: usize) -> &[u8] {
    data.get(from..).unwrap_or(&[])
}

fn describe_ipv6_next_header(nh: u8) -> &'static str {
    match nh {
        0 | 43 | 44 | 60 | 51 | 50 | 135 => "IPv6 with extension headers",
        other => ipv4::describe_protocol(other),
    }
}

impl<'a> Decoder<'_, 'a> {
    #[inline(always)]
    fn ethernet(&mut self, data: &'a [u8], base: usize) -> Out<'a> {
        let pkt = eth::Packet::new_checked(data).map_err(at(base))?;
        let repr = EthernetRepr::parse(&pkt).map_err(at(base))?;
        let hl = repr.buffer_len();
        self.pkt.link.l2 = L2::Ethernet(repr);
        self.by_ethertype(repr.ethertype, tail(data, hl), base + hl)
    }

    #[inline(always)]
    fn by_ethertype(&mut self, et: EtherType, data: &'a [u8], base: usize) -> Out<'a> {
        match et {
            EtherType::IPV4 => self.ipv4(data, base),
            EtherType::IPV6 => self.ipv6(data, base),
            EtherType::ROCE => self.rocev1(data, base),
            other => not_ib(other.describe()),
        }
    }

    /// Walks VLAN tags after a cooked header whose protocol is a TPID (each tag: TCI + the
    /// next protocol). Returns the tags, the inner protocol and the bytes consumed.
    #[inline]
    fn cooked_tags(
        mut et: EtherType,
        data: &[u8],
        base: usize,
    ) -> Result<(VlanTags, EtherType, usize), FrameError> {
        let mut tags = VlanTags::new();
        let mut off = 0;
        while et.is_vlan_tpid() {
            if data.len() < off + 4 {
                return Err(FrameError::Truncated {
                    layer: "VLAN tag",
                    offset: base + off,
                    need: 4,
                    have: data.len().saturating_sub(off),
                });
            }
            tags.push(VlanTag::from_tci(et, u16_at(data, off)))
                .map_err(|_| FrameError::TooManyVlanTags {
                    offset: base + off,
                    max: eth::MAX_VLAN_TAGS,
                })?;
            et = EtherType(u16_at(data, off + 2));
            off += 4;
        }
        Ok((tags, et, off))
    }

    #[inline]
    fn sll(&mut self, data: &'a [u8]) -> Out<'a> {
        let header = SllRepr::parse(&sll::Packet::new_unchecked(data))?;
        let hl = sll::HEADER_LEN;
        let (vlan, et, n) = Self::cooked_tags(header.protocol, tail(data, hl), hl)?;
        self.pkt.link.l2 = L2::Sll { header, vlan };
        self.by_ethertype(et, tail(data, hl + n), hl + n)
    }

    #[inline]
    fn sll2(&mut self, data: &'a [u8]) -> Out<'a> {
        let header = Sll2Repr::parse(&sll2::Packet::new_unchecked(data))?;
        let hl = sll2::HEADER_LEN;
        let (vlan, et, n) = Self::cooked_tags(header.protocol, tail(data, hl), hl)?;
        self.pkt.link.l2 = L2::Sll2 { header, vlan };
        self.by_ethertype(et, tail(data, hl + n), hl + n)
    }

    #[inline]
    fn erf(&mut self, data: &'a [u8]) -> Out<'a> {
        let header = ErfRepr::parse(&erf::Packet::new_unchecked(data))?;
        self.pkt.link.erf = Some(header);
        let off = header.payload_offset();
        if data.len() < off {
            return Err(FrameError::Truncated {
                layer: "ERF",
                offset: 0,
                need: off,
                have: data.len(),
            });
        }
        let body = tail(data, off);
        // Records are padded (rlen ≥ captured length): the wire length bounds the packet.
        let body = body.get(..usize::from(header.wlen)).unwrap_or(body);
        match header.erf_type {
            erf::TYPE_INFINIBAND => self.infiniband(body, off),
            erf::TYPE_IPV4 => self.raw_ip(body, off, Some(4)),
            erf::TYPE_IPV6 => self.raw_ip(body, off, Some(6)),
            erf::TYPE_INFINIBAND_LINK => not_ib("ERF InfiniBand link record"),
            _ if header.is_ethernet() => self.ethernet(body, off),
            _ => not_ib("ERF record of another type"),
        }
    }

    #[inline]
    fn raw_ip(&mut self, data: &'a [u8], base: usize, want: Option<u8>) -> Out<'a> {
        let version = data.first().map(|b| b >> 4).ok_or(FrameError::Truncated {
            layer: "IP",
            offset: base,
            need: 1,
            have: 0,
        })?;
        match (version, want) {
            (4, None | Some(4)) => self.ipv4(data, base),
            (6, None | Some(6)) => self.ipv6(data, base),
            (value, _) => Err(FrameError::BadVersion {
                layer: "IP",
                offset: base,
                value,
            }),
        }
    }

    #[inline(always)]
    fn ipv4(&mut self, data: &'a [u8], base: usize) -> Out<'a> {
        let pkt = ipv4::Packet::new_unchecked(data);
        let ip = Ipv4Repr::parse(&pkt).map_err(at(base))?;
        if ip.is_fragment() {
            return not_ib("IPv4 fragment");
        }
        if ip.protocol != ipv4::PROTOCOL_UDP {
            return not_ib(ipv4::describe_protocol(ip.protocol));
        }
        let hl = pkt.header_len();
        let total = usize::from(pkt.total_len());
        self.udp(
            Encap::RoceV2Ipv4,
            IpRepr::V4(ip),
            data,
            base,
            hl,
            total,
            "IPv4",
        )
    }

    #[inline(always)]
    fn ipv6(&mut self, data: &'a [u8], base: usize) -> Out<'a> {
        let pkt = ipv6::Packet::new_unchecked(data);
        let ip = Ipv6Repr::parse(&pkt).map_err(at(base))?;
        if ip.next_header != ipv4::PROTOCOL_UDP {
            return not_ib(describe_ipv6_next_header(ip.next_header));
        }
        let total = ipv6::HEADER_LEN + ip.payload_len;
        self.udp(
            Encap::RoceV2Ipv6,
            IpRepr::V6(ip),
            data,
            base,
            ipv6::HEADER_LEN,
            total,
            "IPv6",
        )
    }

    /// UDP after an IP header of `hl` bytes; `total` is the IP packet length.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    fn udp(
        &mut self,
        encap: Encap,
        ip: IpRepr,
        data: &'a [u8],
        base: usize,
        hl: usize,
        total: usize,
        ip_layer: &'static str,
    ) -> Out<'a> {
        let udp_pkt = udp::Packet::new_checked(tail(data, hl)).map_err(at(base + hl))?;
        if udp_pkt.dst_port() != self.cfg.rocev2_udp_port {
            return not_ib("UDP, not to the RoCEv2 port");
        }
        if data.len() < total {
            return Err(FrameError::Truncated {
                layer: ip_layer,
                offset: base,
                need: total,
                have: data.len(),
            });
        }
        let udp = UdpRepr::parse(&udp_pkt).map_err(at(base + hl))?;
        let udp_end = hl + udp::HEADER_LEN + udp.payload_len;
        if udp_end > total {
            return Err(FrameError::BadLength {
                layer: "UDP",
                offset: base + hl + udp::field::LENGTH.start,
                value: udp::HEADER_LEN + udp.payload_len,
            });
        }
        self.pkt.ip = Some(ip);
        self.pkt.udp = Some(udp);
        Ok(Found::Transport(Located {
            encap,
            packet: data.get(..udp_end).unwrap_or(data),
            base,
            hdr_len: hl + udp::HEADER_LEN,
            after: None,
        }))
    }

    #[inline]
    fn rocev1(&mut self, data: &'a [u8], base: usize) -> Out<'a> {
        let grh = GrhRepr::parse(&grh::Packet::new_unchecked(data)).map_err(at(base))?;
        if grh.next_header != grh::NEXT_HEADER_IBA {
            return not_ib("RoCEv1 GRH with a non-IBA next header");
        }
        let end = grh::HEADER_LEN + usize::from(grh.payload_len);
        let packet = data.get(..end).ok_or(FrameError::Truncated {
            layer: "GRH",
            offset: base,
            need: end,
            have: data.len(),
        })?;
        self.pkt.grh = Some(grh);
        Ok(Found::Transport(Located {
            encap: Encap::RoceV1,
            packet,
            base,
            hdr_len: grh::HEADER_LEN,
            after: None,
        }))
    }

    #[inline]
    fn infiniband(&mut self, data: &'a [u8], base: usize) -> Out<'a> {
        let lrh = LrhRepr::parse(&lrh::Packet::new_unchecked(data)).map_err(at(base))?;
        let (encap, hdr_len) = match lrh.lnh {
            Lnh::Raw => return not_ib("InfiniBand raw packet (LNH 0)"),
            Lnh::Ipv6 => return not_ib("InfiniBand IPv6 packet (LNH 1)"),
            Lnh::IbaLocal => (Encap::IbLocal, lrh::HEADER_LEN),
            Lnh::IbaGlobal => (Encap::IbGlobal, lrh::HEADER_LEN + grh::HEADER_LEN),
        };
        let plen = lrh.packet_bytes();
        if plen < hdr_len {
            return Err(FrameError::BadLength {
                layer: "LRH",
                offset: base + lrh::field::PKT_LEN.start,
                value: usize::from(lrh.pkt_len),
            });
        }
        let packet = data.get(..plen).ok_or(FrameError::Truncated {
            layer: "LRH",
            offset: base,
            need: plen,
            have: data.len(),
        })?;
        self.pkt.lrh = Some(lrh);
        if encap == Encap::IbGlobal {
            let grh = GrhRepr::parse(&grh::Packet::new_unchecked(tail(packet, lrh::HEADER_LEN)))
                .map_err(at(base + lrh::HEADER_LEN))?;
            if grh.next_header != grh::NEXT_HEADER_IBA {
                return not_ib("InfiniBand GRH with a non-IBA next header");
            }
            self.pkt.grh = Some(grh);
        }
        Ok(Found::Transport(Located {
            encap,
            packet,
            base,
            hdr_len,
            after: Some(tail(data, plen)),
        }))
    }

    /// BTH onwards. `packet` runs from the first network header (IP / GRH / LRH) through the
    /// ICRC, starting at `base`; the BTH is at `hdr_len`.
    #[inline(always)]
    fn transport(&mut self, found: Located<'a>) -> Result<(), FrameError> {
        let Located {
            encap,
            packet,
            base,
            hdr_len,
            after: trailer,
        } = found;
        let t = tail(packet, hdr_len);
        let t_base = base + hdr_len;
        let icrc_len = if self.cfg.icrc_present {
            icrc::ICRC_LEN
        } else {
            0
        };
        let body_len = t
            .len()
            .checked_sub(icrc_len)
            .filter(|&n| n >= bth::HEADER_LEN)
            .ok_or(FrameError::BadLength {
                layer: "BTH",
                offset: t_base,
                value: t.len(),
            })?;
        let body = t.get(..body_len).unwrap_or(t);
        let bth = BthRepr::parse(&bth::Packet::new_unchecked(body)).map_err(at(t_base))?;
        let after = tail(body, bth::HEADER_LEN);
        let pad = usize::from(bth.pad_count.get());
        let region = after
            .len()
            .checked_sub(pad)
            .and_then(|n| after.get(..n))
            .ok_or(FrameError::BadLength {
                layer: "BTH PadCnt",
                offset: t_base + bth::field::FLAGS,
                value: pad,
            })?;
        let ext_len = bth.opcode.ext_headers_len();
        let (ext_headers, payload) =
            region
                .split_at_checked(ext_len)
                .ok_or(FrameError::BadLength {
                    layer: "BTH extension headers",
                    offset: t_base + bth::HEADER_LEN,
                    value: region.len(),
                })?;
        let deth = if bth.opcode.has_deth() {
            Some(
                DethRepr::parse(&deth::Packet::new_unchecked(ext_headers))
                    .map_err(at(t_base + bth::HEADER_LEN))?,
            )
        } else {
            None
        };
        let imm = (bth.opcode == super::Opcode::UD_SEND_ONLY_IMM)
            .then(|| u32_at(ext_headers, deth::HEADER_LEN));
        let icrc = if !self.cfg.icrc_present {
            IcrcStatus::Absent
        } else if !self.cfg.verify_crc {
            IcrcStatus::NotChecked
        } else {
            let covered_len = packet.len().saturating_sub(icrc::ICRC_LEN);
            let covered = packet.get(..covered_len).unwrap_or(packet);
            let found = u32::from_le_bytes(array_at(packet, covered_len));
            let expected = icrc::compute(encap, covered).map_err(at(base))?;
            IcrcStatus::compare(expected, found)
        };
        let vcrc = match trailer.map(<[u8]>::first_chunk::<{ vcrc::VCRC_LEN }>) {
            None | Some(None) => VcrcStatus::Absent,
            Some(Some(_)) if !self.cfg.verify_crc => VcrcStatus::NotChecked,
            Some(Some(v)) => VcrcStatus::compare(vcrc::compute(packet), u16::from_le_bytes(*v)),
        };
        let p = &mut self.pkt;
        p.encap = encap;
        p.bth = bth;
        p.deth = deth;
        p.imm = imm;
        p.ext_headers = ext_headers;
        p.payload = payload;
        p.payload_offset = t_base + bth::HEADER_LEN + ext_len;
        p.packet = packet;
        p.packet_offset = base;
        p.icrc = icrc;
        p.vcrc = vcrc;
        Ok(())
    }
}
