//! The whole-packet decoder: capture record → link layer → network → BTH/DETH → payload,
//! with ICRC/VCRC checks (docs/framing.md §3.4).

use core::net::IpAddr;

use super::eth::{self, EtherType, EthernetRepr, MacAddr, VlanTag, VlanTags};
use super::link::{erf, sll, sll2, ErfRepr, PacketType, Sll2Repr, SllRepr};
use super::wire::{array_at, u16_at, u32_at};
use super::{
    bth, deth, grh, icrc, ipv4, ipv6, lrh, udp, vcrc, BthRepr, DethRepr, Encap, FrameError,
    GrhRepr, IcrcStatus, Ipv4Repr, Ipv6Repr, Lnh, LrhRepr, UdpRepr, VcrcStatus, ROCEV2_UDP_PORT,
};

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

/// The layer-2 header of a decoded packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum L2 {
    /// No layer-2 header (raw IP link types, native IB).
    None,
    /// Ethernet II (with its VLAN tags).
    Ethernet(EthernetRepr),
    /// Linux cooked v1, and VLAN tags found after it.
    Sll {
        /// The cooked header.
        header: SllRepr,
        /// VLAN tags between the cooked header and the network header.
        vlan: VlanTags,
    },
    /// Linux cooked v2, and VLAN tags found after it.
    Sll2 {
        /// The cooked header.
        header: Sll2Repr,
        /// VLAN tags between the cooked header and the network header.
        vlan: VlanTags,
    },
}

/// Link-level information of a decoded packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LinkInfo {
    /// The capture link type (FCS bits masked off).
    pub link_type: u32,
    /// The ERF record header (link type 197).
    pub erf: Option<ErfRepr>,
    /// The layer-2 header.
    pub l2: L2,
}

impl LinkInfo {
    /// VLAN tags, outermost first (empty when none or no layer 2).
    pub fn vlan(&self) -> &[VlanTag] {
        match &self.l2 {
            L2::None => &[],
            L2::Ethernet(e) => e.vlan.as_slice(),
            L2::Sll { vlan, .. } | L2::Sll2 { vlan, .. } => vlan.as_slice(),
        }
    }

    /// Source MAC address (Ethernet only).
    pub fn src_mac(&self) -> Option<MacAddr> {
        match &self.l2 {
            L2::Ethernet(e) => Some(e.src_addr),
            _ => None,
        }
    }

    /// Destination MAC address (Ethernet only).
    pub fn dst_mac(&self) -> Option<MacAddr> {
        match &self.l2 {
            L2::Ethernet(e) => Some(e.dst_addr),
            _ => None,
        }
    }

    /// Linux cooked-capture packet type (direction), when present.
    pub fn pkttype(&self) -> Option<PacketType> {
        match &self.l2 {
            L2::Sll { header, .. } => Some(header.pkttype),
            L2::Sll2 { header, .. } => Some(header.pkttype),
            _ => None,
        }
    }

    /// Interface index (Linux cooked v2 only).
    pub fn ifindex(&self) -> Option<u32> {
        match &self.l2 {
            L2::Sll2 { header, .. } => Some(header.ifindex),
            _ => None,
        }
    }
}

/// An IPv4 or IPv6 header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IpRepr {
    /// IPv4.
    V4(Ipv4Repr),
    /// IPv6.
    V6(Ipv6Repr),
}

impl IpRepr {
    /// Source address.
    pub fn src_addr(&self) -> IpAddr {
        match self {
            IpRepr::V4(r) => IpAddr::V4(r.src_addr),
            IpRepr::V6(r) => IpAddr::V6(r.src_addr),
        }
    }

    /// Destination address.
    pub fn dst_addr(&self) -> IpAddr {
        match self {
            IpRepr::V4(r) => IpAddr::V4(r.dst_addr),
            IpRepr::V6(r) => IpAddr::V6(r.dst_addr),
        }
    }

    /// IPv4 TOS / IPv6 traffic class.
    pub fn traffic_class(&self) -> u8 {
        match self {
            IpRepr::V4(r) => r.tos,
            IpRepr::V6(r) => r.traffic_class,
        }
    }

    /// IPv4 TTL / IPv6 hop limit.
    pub fn hop_limit(&self) -> u8 {
        match self {
            IpRepr::V4(r) => r.ttl,
            IpRepr::V6(r) => r.hop_limit,
        }
    }

    /// IPv4 identification (None for IPv6).
    pub fn ident(&self) -> Option<u16> {
        match self {
            IpRepr::V4(r) => Some(r.ident),
            IpRepr::V6(_) => None,
        }
    }

    /// Payload length as stated by the header.
    pub fn payload_len(&self) -> usize {
        match self {
            IpRepr::V4(r) => r.payload_len,
            IpRepr::V6(r) => r.payload_len,
        }
    }

    /// Length of the emitted header (20 or 40).
    pub fn buffer_len(&self) -> usize {
        match self {
            IpRepr::V4(r) => r.buffer_len(),
            IpRepr::V6(r) => r.buffer_len(),
        }
    }

    /// Writes the header at the start of `buf` (IPv4 with its checksum).
    pub fn emit(&self, buf: &mut [u8]) {
        match self {
            IpRepr::V4(r) => r.emit(&mut ipv4::Packet::new_unchecked(buf)),
            IpRepr::V6(r) => r.emit(&mut ipv6::Packet::new_unchecked(buf)),
        }
    }
}

/// A decoded InfiniBand or RoCE packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IbPacket<'a> {
    /// How the transport packet is carried.
    pub encap: Encap,
    /// Capture link type, ERF header, MACs, VLAN tags, cooked-capture direction.
    pub link: LinkInfo,
    /// IP header (RoCEv2).
    pub ip: Option<IpRepr>,
    /// UDP header (RoCEv2).
    pub udp: Option<UdpRepr>,
    /// LRH (native IB).
    pub lrh: Option<LrhRepr>,
    /// GRH (RoCEv1; native IB with LNH = 3).
    pub grh: Option<GrhRepr>,
    /// Base transport header.
    pub bth: BthRepr,
    /// DETH (UD SEND Only opcodes 0x64/0x65).
    pub deth: Option<DethRepr>,
    /// Immediate data (opcode 0x65).
    pub imm: Option<u32>,
    /// Raw extension headers between the BTH and the payload (DETH, ImmDt, RETH, AETH, …).
    pub ext_headers: &'a [u8],
    /// Payload after the transport headers, without pad bytes and ICRC.
    pub payload: &'a [u8],
    /// Offset of [`Self::payload`] in the decoded buffer.
    pub payload_offset: usize,
    /// The packet the ICRC covers: from the IP header (RoCEv2), GRH (RoCEv1) or LRH (native
    /// IB) through the ICRC; VCRC and link padding excluded.
    pub packet: &'a [u8],
    /// Offset of [`Self::packet`] in the decoded buffer.
    pub packet_offset: usize,
    /// ICRC check result.
    pub icrc: IcrcStatus,
    /// VCRC check result (native IB; [`CrcStatus::Absent`](super::CrcStatus::Absent) for
    /// RoCE).
    pub vcrc: VcrcStatus,
}

impl<'a> IbPacket<'a> {
    /// An empty packet for the decoder to fill in.
    fn blank(link_type: u32) -> Self {
        IbPacket {
            encap: Encap::RoceV2Ipv4,
            link: LinkInfo {
                link_type,
                erf: None,
                l2: L2::None,
            },
            ip: None,
            udp: None,
            lrh: None,
            grh: None,
            bth: BthRepr {
                opcode: super::Opcode(0),
                solicited: false,
                mig_req: false,
                pad_count: crate::types::U2::masked(0),
                tver: crate::types::U4::masked(0),
                pkey: crate::types::Pkey(0),
                fecn: false,
                becn: false,
                dest_qp: crate::types::Qpn::masked(0),
                ack_req: false,
                psn: crate::types::Psn::masked(0),
            },
            deth: None,
            imm: None,
            ext_headers: &[],
            payload: &[],
            payload_offset: 0,
            packet: &[],
            packet_offset: 0,
            icrc: IcrcStatus::Absent,
            vcrc: VcrcStatus::Absent,
        }
    }

    /// Whether the packet carries a MAD: a UD packet (with DETH) whose destination QP or
    /// source QP is 0 or 1 (Wireshark's rule).
    pub fn is_mad(&self) -> bool {
        self.deth
            .is_some_and(|d| self.bth.dest_qp.get() <= 1 || d.src_qp.get() <= 1)
    }

    /// The 256-byte MAD, when the packet carries one ([`Self::is_mad`]).
    ///
    /// # Errors
    /// (inside the `Some`) [`FrameError::Truncated`] (layer "MAD") when the payload is shorter
    /// than 256 bytes.
    pub fn mad(&self) -> Option<Result<&'a [u8; MAD_LEN], FrameError>> {
        if !self.is_mad() {
            return None;
        }
        Some(
            self.payload
                .first_chunk::<MAD_LEN>()
                .ok_or(FrameError::Truncated {
                    layer: "MAD",
                    offset: self.payload_offset,
                    need: MAD_LEN,
                    have: self.payload.len(),
                }),
        )
    }

    /// Source QP (from the DETH).
    pub fn src_qp(&self) -> Option<crate::types::Qpn> {
        self.deth.map(|d| d.src_qp)
    }

    /// Recomputes and checks the ICRC (whatever [`DecodeConfig::verify_crc`] said). Assumes
    /// the packet carries an ICRC.
    ///
    /// # Errors
    /// [`FrameError::BadIcrc`].
    pub fn verify_icrc(&self) -> Result<(), FrameError> {
        icrc::verify(self.encap, self.packet)
    }
}

/// What a capture record turned out to be.
// The IB variant is large, but boxing it would allocate per packet.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decoded<'a> {
    /// Not an IB/RoCE transport packet (ARP, TCP, UDP to another port, an IPv4 fragment, an
    /// ERF record of another type, …). Not an error.
    NotIb {
        /// A short description of what it was.
        what: &'static str,
    },
    /// An IB or RoCE transport packet.
    Ib(IbPacket<'a>),
}

impl<'a> Decoded<'a> {
    /// The IB packet, if any.
    pub fn ib(&self) -> Option<&IbPacket<'a>> {
        match self {
            Decoded::Ib(p) => Some(p),
            Decoded::NotIb { .. } => None,
        }
    }

    /// The IB packet, if any.
    pub fn into_ib(self) -> Option<IbPacket<'a>> {
        match self {
            Decoded::Ib(p) => Some(p),
            Decoded::NotIb { .. } => None,
        }
    }

    /// The MAD, if this is an IB packet carrying one (see [`IbPacket::mad`]).
    pub fn mad(&self) -> Option<Result<&'a [u8; MAD_LEN], FrameError>> {
        self.ib().and_then(IbPacket::mad)
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::{CrcStatus, RoceV2UdRepr};
    use crate::types::Psn;

    fn eth(tags: &[VlanTag]) -> EthernetRepr {
        EthernetRepr {
            dst_addr: MacAddr([0x02, 0, 0, 0, 0, 2]),
            src_addr: MacAddr([0x02, 0, 0, 0, 0, 1]),
            vlan: VlanTags::from_slice(tags).unwrap(),
            ethertype: EtherType::IPV4,
        }
    }

    fn repr(v6: bool) -> RoceV2UdRepr {
        let (s, d) = if v6 {
            ("fd00::1", "fd00::2")
        } else {
            ("192.168.1.1", "192.168.1.2")
        };
        RoceV2UdRepr::gsi(
            s.parse().unwrap(),
            d.parse().unwrap(),
            77,
            0xd872,
            Psn::masked(9),
        )
        .unwrap()
    }

    fn mad() -> [u8; MAD_LEN] {
        let mut m = [0u8; MAD_LEN];
        for (i, b) in m.iter_mut().enumerate() {
            *b = i as u8;
        }
        m
    }

    fn frame(v6: bool, tags: &[VlanTag], payload: &[u8]) -> Vec<u8> {
        let r = repr(v6);
        let e = eth(tags);
        let mut f = vec![0xa5; r.frame_len(&e, payload.len())];
        assert_eq!(r.emit_frame(&e, payload, &mut f).unwrap(), f.len());
        f
    }

    #[test]
    fn emit_then_decode_roundtrip() {
        let tag = VlanTag {
            tpid: EtherType::VLAN,
            pcp: 3,
            dei: false,
            vid: 0,
        };
        for v6 in [false, true] {
            for tags in [&[][..], &[tag][..], &[tag, tag, tag][..]] {
                let f = frame(v6, tags, &mad());
                let p = decode(1, &f).unwrap().into_ib().unwrap();
                let r = repr(v6);
                assert_eq!(
                    p.encap,
                    if v6 {
                        Encap::RoceV2Ipv6
                    } else {
                        Encap::RoceV2Ipv4
                    }
                );
                assert_eq!(p.icrc, CrcStatus::Ok);
                assert_eq!(p.vcrc, CrcStatus::Absent);
                assert_eq!(p.link.vlan(), tags);
                assert_eq!(p.bth, r.bth);
                assert_eq!(p.deth, Some(r.deth));
                assert_eq!(
                    p.udp.map(|u| (u.src_port, u.dst_port)),
                    Some((0xd872, 4791))
                );
                assert_eq!(p.mad().unwrap().unwrap(), &mad());
                let ip = p.ip.unwrap();
                assert_eq!(
                    (ip.src_addr(), ip.dst_addr()),
                    (r.ip.src_addr(), r.ip.dst_addr())
                );
                assert_eq!(ip.payload_len(), 8 + 12 + 8 + 256 + 4);
                match ip {
                    IpRepr::V4(v4) => {
                        assert_eq!((v4.ident, v4.ttl, v4.dont_frag), (77, 64, true));
                        let hl = 14 + 4 * tags.len();
                        assert!(ipv4::Packet::new_checked(&f[hl..])
                            .unwrap()
                            .verify_checksum());
                    }
                    IpRepr::V6(v6r) => assert_eq!(v6r.hop_limit, 64),
                }
                p.verify_icrc().unwrap();
            }
        }
    }

    #[test]
    fn odd_payload_gets_padding() {
        let f = frame(false, &[], &[7u8; 13]);
        let p = decode(1, &f).unwrap().into_ib().unwrap();
        assert_eq!(p.bth.pad_count.get(), 3);
        assert_eq!(p.payload, &[7u8; 13]);
        assert!(p.icrc.is_ok());
        // A 13-byte payload to QP1 is a MAD that is too short.
        assert!(matches!(
            p.mad(),
            Some(Err(FrameError::Truncated {
                layer: "MAD",
                need: 256,
                have: 13,
                ..
            }))
        ));
        // The pad bytes are zero.
        assert_eq!(&f[f.len() - 7..f.len() - 4], &[0, 0, 0]);
    }

    #[test]
    fn every_truncation_is_an_error_without_panic() {
        for v6 in [false, true] {
            let f = frame(v6, &[], &mad());
            for n in 0..f.len() {
                assert!(decode(1, &f[..n]).is_err(), "v6={v6} n={n}");
            }
        }
    }

    #[test]
    fn padding_and_fcs_after_the_packet_are_ignored() {
        let mut f = frame(false, &[], &[1, 2, 3, 4]);
        let clean = decode(1, &f).unwrap().into_ib().unwrap().payload.to_vec();
        f.extend_from_slice(&[0xde, 0xad, 0xbe, 0xef, 0, 0, 0, 0]);
        let p = decode(1, &f).unwrap().into_ib().unwrap();
        assert!(p.icrc.is_ok());
        assert_eq!(p.payload, &clean[..]);
        // FCS flag bits of a pcap link type are masked off.
        let p = decode(0x1000_0000 | 1, &f).unwrap().into_ib().unwrap();
        assert_eq!(p.link.link_type, 1);
    }

    #[test]
    fn corrupted_icrc_is_bad_not_an_error() {
        let mut f = frame(false, &[], &mad());
        let n = f.len();
        f[n - 1] ^= 0x80;
        let p = decode(1, &f).unwrap().into_ib().unwrap();
        assert!(p.icrc.is_bad());
        assert!(matches!(p.verify_icrc(), Err(FrameError::BadIcrc { .. })));
        // The masked TTL does not matter.
        let mut f = frame(false, &[], &mad());
        f[14 + 8] = 3;
        assert!(decode(1, &f).unwrap().into_ib().unwrap().icrc.is_ok());
    }

    #[test]
    fn not_ib_classifications() {
        let f = frame(false, &[], &mad());
        let what = |lt: u32, d: &[u8]| match decode(lt, d) {
            Ok(Decoded::NotIb { what }) => what,
            other => panic!("{other:?}"),
        };
        let mut arp = f.clone();
        arp[12..14].copy_from_slice(&[0x08, 0x06]);
        assert_eq!(what(1, &arp), "ARP");
        let mut tcp = f.clone();
        tcp[14 + 9] = 6;
        assert_eq!(what(1, &tcp), "TCP");
        let mut frag = f.clone();
        frag[14 + 6] = 0x20; // MF
        assert_eq!(what(1, &frag), "IPv4 fragment");
        let mut other_port = f.clone();
        other_port[14 + 20 + 3] = 0x35;
        assert_eq!(what(1, &other_port), "UDP, not to the RoCEv2 port");
        assert_eq!(decode(42, &f), Err(FrameError::UnsupportedLinkType(42)));
        // Raw IP link types.
        assert!(decode(101, &f[14..]).unwrap().ib().is_some());
        assert!(decode(228, &f[14..]).unwrap().ib().is_some());
        assert!(matches!(
            decode(229, &f[14..]),
            Err(FrameError::BadVersion { value: 4, .. })
        ));
    }

    #[test]
    fn no_icrc_config() {
        let f = frame(false, &[], &mad());
        let cfg = DecodeConfig {
            icrc_present: false,
            ..DecodeConfig::DEFAULT
        };
        let p = decode_with(&cfg, 1, &f).unwrap().into_ib().unwrap();
        assert_eq!(p.icrc, CrcStatus::Absent);
        assert_eq!(p.payload.len(), 260);
    }

    #[test]
    fn erf_ethernet_record() {
        let f = frame(false, &[], &mad());
        let mut rec = vec![0u8; 18];
        let erf = ErfRepr {
            timestamp: 1 << 32,
            erf_type: erf::TYPE_ETH,
            flags: 4,
            rlen: u16::try_from(18 + f.len()).unwrap(),
            lctr: 0,
            wlen: u16::try_from(f.len() + 4).unwrap(),
            ext_headers: 0,
        };
        erf.emit(&mut erf::Packet::new_unchecked(&mut rec[..]));
        rec.extend_from_slice(&f);
        let p = decode(197, &rec).unwrap().into_ib().unwrap();
        assert!(p.icrc.is_ok());
        assert_eq!(p.link.erf, Some(erf));
        assert_eq!(p.packet_offset, 18 + 14);
        // Another record type is not IB.
        rec[8] = 3;
        assert!(matches!(decode(197, &rec), Ok(Decoded::NotIb { .. })));
    }

    /// Minimal native IB UD packet (LNH = 2) built by hand: LRH, BTH, DETH, MAD, ICRC, VCRC.
    fn ib_packet(lnh: Lnh) -> Vec<u8> {
        let global = lnh == Lnh::IbaGlobal;
        let words = (8 + if global { 40 } else { 0 } + 12 + 8 + 256 + 4) / 4;
        let lrh = LrhRepr {
            vl: crate::types::U4::masked(0),
            lver: crate::types::U4::masked(0),
            sl: crate::types::U4::masked(0),
            lnh,
            dlid: crate::types::Lid(1),
            pkt_len: words,
            slid: crate::types::Lid(4),
        };
        let mut p = vec![0xa5u8; usize::from(words) * 4 + 2];
        lrh.emit(&mut lrh::Packet::new_unchecked(&mut p[..]));
        let mut at = 8;
        if global {
            let grh = GrhRepr {
                traffic_class: 0,
                flow_label: crate::types::FlowLabel::masked(0),
                payload_len: 12 + 8 + 256 + 4,
                next_header: grh::NEXT_HEADER_IBA,
                hop_limit: 255,
                sgid: crate::types::Gid([1; 16]),
                dgid: crate::types::Gid([2; 16]),
            };
            grh.emit(&mut grh::Packet::new_unchecked(&mut p[at..]));
            at += 40;
        }
        let r = repr(false);
        r.bth.emit(&mut bth::Packet::new_unchecked(&mut p[at..]));
        r.deth
            .emit(&mut deth::Packet::new_unchecked(&mut p[at + 12..]));
        p[at + 20..at + 20 + 256].copy_from_slice(&mad());
        let end = usize::from(words) * 4;
        icrc::fill(
            if global {
                Encap::IbGlobal
            } else {
                Encap::IbLocal
            },
            &mut p[..end],
        )
        .unwrap();
        let v = vcrc::compute(&p[..end]);
        p[end..].copy_from_slice(&v.to_le_bytes());
        p
    }

    #[test]
    fn native_ib_packets() {
        for lnh in [Lnh::IbaLocal, Lnh::IbaGlobal] {
            let p = ib_packet(lnh);
            let d = decode(247, &p).unwrap().into_ib().unwrap();
            assert!(d.icrc.is_ok() && d.vcrc.is_ok(), "{lnh:?}");
            assert_eq!(d.grh.is_some(), lnh == Lnh::IbaGlobal);
            assert_eq!(d.mad().unwrap().unwrap(), &mad());
            vcrc::verify(&p).unwrap();
            // VCRC cut off: absent, not an error.
            let d = decode(247, &p[..p.len() - 2]).unwrap().into_ib().unwrap();
            assert_eq!(d.vcrc, CrcStatus::Absent);
            // Corrupt VCRC.
            let mut bad = p.clone();
            let n = bad.len();
            bad[n - 1] ^= 1;
            assert!(decode(247, &bad).unwrap().into_ib().unwrap().vcrc.is_bad());
            assert!(matches!(
                vcrc::verify(&bad),
                Err(FrameError::BadVcrc { .. })
            ));
            for n in 0..p.len() - 2 {
                assert!(decode(247, &p[..n]).is_err(), "{lnh:?} {n}");
            }
        }
        let mut raw = ib_packet(Lnh::IbaLocal);
        raw[1] &= 0xfc;
        assert!(matches!(decode(247, &raw), Ok(Decoded::NotIb { .. })));
    }

    #[test]
    fn rocev1_packet() {
        let ib = ib_packet(Lnh::IbaGlobal);
        let mut f = vec![0u8; 12];
        f.extend_from_slice(&[0x89, 0x15]);
        f.extend_from_slice(&ib[8..ib.len() - 2]);
        icrc::fill(Encap::RoceV1, &mut f[14..]).unwrap();
        let p = decode(1, &f).unwrap().into_ib().unwrap();
        assert_eq!(p.encap, Encap::RoceV1);
        assert!(p.icrc.is_ok());
        assert_eq!(p.grh.unwrap().sgid, crate::types::Gid([1; 16]));
        // LNH = 3 and RoCEv1 share the ICRC definition.
        assert_eq!(&f[f.len() - 4..], &ib[ib.len() - 6..ib.len() - 2]);
    }

    #[test]
    fn sll_with_vlan_tag() {
        let f = frame(false, &[], &mad());
        let mut s = vec![0, 4, 0, 1, 0, 6, 2, 0, 0, 0, 0, 1, 0, 0, 0x81, 0x00];
        s.extend_from_slice(&[0x20, 0x64, 0x08, 0x00]);
        s.extend_from_slice(&f[14..]);
        let p = decode(113, &s).unwrap().into_ib().unwrap();
        assert_eq!(p.link.vlan().len(), 1);
        assert_eq!((p.link.vlan()[0].pcp, p.link.vlan()[0].vid), (1, 100));
        assert_eq!(p.link.pkttype(), Some(PacketType::OUTGOING));
        assert!(p.icrc.is_ok());
    }

    #[test]
    fn arbitrary_bytes_never_panic() {
        use proptest::prelude::*;
        let lts = [1u32, 101, 113, 197, 228, 229, 247, 276];
        proptest!(ProptestConfig::with_cases(2000), |(lt in 0..lts.len(), data in proptest::collection::vec(any::<u8>(), 0..400))| {
            let _ = decode(lts[lt], &data);
        });
        // Mutations of a valid frame.
        let f = frame(false, &[], &mad());
        proptest!(ProptestConfig::with_cases(2000), |(i in 0..f.len(), v in any::<u8>())| {
            let mut g = f.clone();
            g[i] = v;
            let _ = decode(1, &g);
        });
    }
}
