//! The whole-packet decoder: capture record → link layer → network → BTH/DETH → payload,
//! with ICRC/VCRC checks (spec/framing.md §3.4).

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
        link: LinkInfo {
            link_type: lt,
            erf: None,
            l2: L2::None,
        },
    };
    match lt {
        LINKTYPE_ETHERNET => d.ethernet(data, 0),
        LINKTYPE_RAW => d.raw_ip(data, 0, None),
        LINKTYPE_IPV4 => d.raw_ip(data, 0, Some(4)),
        LINKTYPE_IPV6 => d.raw_ip(data, 0, Some(6)),
        LINKTYPE_LINUX_SLL => d.sll(data),
        LINKTYPE_LINUX_SLL2 => d.sll2(data),
        LINKTYPE_INFINIBAND => d.infiniband(data, 0),
        LINKTYPE_ERF => d.erf(data),
        _ => Err(FrameError::UnsupportedLinkType(link_type)),
    }
}

type Out<'a> = Result<Decoded<'a>, FrameError>;

/// Network-layer headers found before the BTH.
#[derive(Default)]
struct Net {
    ip: Option<IpRepr>,
    udp: Option<UdpRepr>,
    lrh: Option<LrhRepr>,
    grh: Option<GrhRepr>,
}

struct Decoder<'c> {
    cfg: &'c DecodeConfig,
    link: LinkInfo,
}

fn not_ib<'a>(what: &'static str) -> Out<'a> {
    Ok(Decoded::NotIb { what })
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

impl Decoder<'_> {
    fn ethernet<'a>(&mut self, data: &'a [u8], base: usize) -> Out<'a> {
        let pkt = eth::Packet::new_checked(data).map_err(at(base))?;
        let repr = EthernetRepr::parse(&pkt).map_err(at(base))?;
        let hl = repr.buffer_len();
        self.link.l2 = L2::Ethernet(repr);
        self.by_ethertype(repr.ethertype, tail(data, hl), base + hl)
    }

    fn by_ethertype<'a>(&mut self, et: EtherType, data: &'a [u8], base: usize) -> Out<'a> {
        match et {
            EtherType::IPV4 => self.ipv4(data, base),
            EtherType::IPV6 => self.ipv6(data, base),
            EtherType::ROCE => self.rocev1(data, base),
            other => not_ib(other.describe()),
        }
    }

    /// Walks VLAN tags after a cooked header whose protocol is a TPID (each tag: TCI + the
    /// next protocol). Returns the tags, the inner protocol and the bytes consumed.
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

    fn sll<'a>(&mut self, data: &'a [u8]) -> Out<'a> {
        let header = SllRepr::parse(&sll::Packet::new_unchecked(data))?;
        let hl = sll::HEADER_LEN;
        let (vlan, et, n) = Self::cooked_tags(header.protocol, tail(data, hl), hl)?;
        self.link.l2 = L2::Sll { header, vlan };
        self.by_ethertype(et, tail(data, hl + n), hl + n)
    }

    fn sll2<'a>(&mut self, data: &'a [u8]) -> Out<'a> {
        let header = Sll2Repr::parse(&sll2::Packet::new_unchecked(data))?;
        let hl = sll2::HEADER_LEN;
        let (vlan, et, n) = Self::cooked_tags(header.protocol, tail(data, hl), hl)?;
        self.link.l2 = L2::Sll2 { header, vlan };
        self.by_ethertype(et, tail(data, hl + n), hl + n)
    }

    fn erf<'a>(&mut self, data: &'a [u8]) -> Out<'a> {
        let header = ErfRepr::parse(&erf::Packet::new_unchecked(data))?;
        self.link.erf = Some(header);
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

    fn raw_ip<'a>(&mut self, data: &'a [u8], base: usize, want: Option<u8>) -> Out<'a> {
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

    fn ipv4<'a>(&mut self, data: &'a [u8], base: usize) -> Out<'a> {
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

    fn ipv6<'a>(&mut self, data: &'a [u8], base: usize) -> Out<'a> {
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
    fn udp<'a>(
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
        let packet = data.get(..udp_end).unwrap_or(data);
        let net = Net {
            ip: Some(ip),
            udp: Some(udp),
            ..Net::default()
        };
        self.transport(encap, net, packet, base, hl + udp::HEADER_LEN)
    }

    fn rocev1<'a>(&mut self, data: &'a [u8], base: usize) -> Out<'a> {
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
        let net = Net {
            grh: Some(grh),
            ..Net::default()
        };
        self.transport(Encap::RoceV1, net, packet, base, grh::HEADER_LEN)
    }

    fn infiniband<'a>(&mut self, data: &'a [u8], base: usize) -> Out<'a> {
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
        let mut net = Net {
            lrh: Some(lrh),
            ..Net::default()
        };
        if encap == Encap::IbGlobal {
            let grh = GrhRepr::parse(&grh::Packet::new_unchecked(tail(packet, lrh::HEADER_LEN)))
                .map_err(at(base + lrh::HEADER_LEN))?;
            if grh.next_header != grh::NEXT_HEADER_IBA {
                return not_ib("InfiniBand GRH with a non-IBA next header");
            }
            net.grh = Some(grh);
        }
        let mut decoded = self.transport(encap, net, packet, base, hdr_len)?;
        if let Decoded::Ib(p) = &mut decoded {
            p.vcrc = match data.get(plen..plen + vcrc::VCRC_LEN) {
                None => VcrcStatus::Absent,
                Some(_) if !self.cfg.verify_crc => VcrcStatus::NotChecked,
                Some(v) => {
                    VcrcStatus::compare(vcrc::compute(packet), u16::from_le_bytes(array_at(v, 0)))
                }
            };
        }
        Ok(decoded)
    }

    /// BTH onwards. `packet` runs from the first network header (IP / GRH / LRH) through the
    /// ICRC, starting at `base`; the BTH is at `hdr_len`.
    fn transport<'a>(
        &self,
        encap: Encap,
        net: Net,
        packet: &'a [u8],
        base: usize,
        hdr_len: usize,
    ) -> Out<'a> {
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
        Ok(Decoded::Ib(IbPacket {
            encap,
            link: self.link,
            ip: net.ip,
            udp: net.udp,
            lrh: net.lrh,
            grh: net.grh,
            bth,
            deth,
            imm,
            ext_headers,
            payload,
            payload_offset: t_base + bth::HEADER_LEN + ext_len,
            packet,
            packet_offset: base,
            icrc,
            vcrc: VcrcStatus::Absent,
        }))
    }
}
