//! What the decoder gives: the [`Decoded`] record, the [`IbPacket`] with every header found,
//! and its [`LinkInfo`] and [`IpRepr`].

use core::net::IpAddr;

use super::MAD_LEN;
use crate::frame::eth::{EthernetRepr, MacAddr, VlanTag, VlanTags};
use crate::frame::link::{ErfRepr, PacketType, Sll2Repr, SllRepr};
use crate::frame::{
    icrc, ipv4, ipv6, BthRepr, DethRepr, Encap, FrameError, GrhRepr, IcrcStatus, Ipv4Repr,
    Ipv6Repr, LrhRepr, Opcode, UdpRepr, VcrcStatus,
};

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
    /// VCRC check result (native IB;
    /// [`CrcStatus::Absent`](crate::frame::CrcStatus::Absent) for RoCE).
    pub vcrc: VcrcStatus,
}

impl<'a> IbPacket<'a> {
    /// An empty packet for the decoder to fill in.
    pub(super) fn blank(link_type: u32) -> Self {
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
                opcode: Opcode(0),
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

    /// Recomputes and checks the ICRC (whatever
    /// [`DecodeConfig::verify_crc`](super::DecodeConfig::verify_crc) said). Assumes the packet
    /// carries an ICRC.
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
