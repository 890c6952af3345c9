//! IPv4 header (RFC 791), as RoCEv2 uses it (docs/framing.md §1.1, §3.4).
//!
//! Options (IHL > 5) are accepted on parse; [`Ipv4Repr::emit`] writes a 20-byte header.

use core::net::Ipv4Addr;

use super::wire::{array_at, internet_checksum, need, set_bytes, set_u16, set_u8, u16_at, u8_at};
use super::FrameError;

/// Field offsets.
pub mod field {
    use core::ops::Range;

    /// Version (high nibble) and IHL (low nibble, in 4-byte words).
    pub const VER_IHL: usize = 0;
    /// Type of service: DSCP (6 bits) + ECN (2 bits). Masked in the ICRC.
    pub const TOS: usize = 1;
    /// Total length (header + payload), bytes.
    pub const LENGTH: Range<usize> = 2..4;
    /// Identification.
    pub const IDENT: Range<usize> = 4..6;
    /// Flags (3 bits: reserved, DF, MF) and fragment offset (13 bits, 8-byte units).
    pub const FLG_OFF: Range<usize> = 6..8;
    /// Time to live. Masked in the ICRC.
    pub const TTL: usize = 8;
    /// Protocol (17 = UDP).
    pub const PROTOCOL: usize = 9;
    /// Header checksum. Masked in the ICRC.
    pub const CHECKSUM: Range<usize> = 10..12;
    /// Source address.
    pub const SRC_ADDR: Range<usize> = 12..16;
    /// Destination address.
    pub const DST_ADDR: Range<usize> = 16..20;
}

/// Length of a header without options.
pub const HEADER_LEN: usize = field::DST_ADDR.end;

/// IP protocol number of UDP.
pub const PROTOCOL_UDP: u8 = 17;

/// "Don't fragment" flag in the flags/offset word.
const DF: u16 = 0x4000;
/// "More fragments" flag.
const MF: u16 = 0x2000;
/// Fragment offset mask (8-byte units).
const OFFSET_MASK: u16 = 0x1fff;

const LAYER: &str = "IPv4";

/// A short description of an IP protocol number, for "not RoCE" classifications.
pub const fn describe_protocol(protocol: u8) -> &'static str {
    match protocol {
        1 => "ICMP",
        2 => "IGMP",
        6 => "TCP",
        17 => "UDP",
        41 => "IPv6-in-IP",
        47 => "GRE",
        50 => "ESP",
        51 => "AH",
        58 => "ICMPv6",
        89 => "OSPF",
        103 => "PIM",
        112 => "VRRP",
        132 => "SCTP",
        _ => "other IP protocol",
    }
}

view!(
    /// A view of an IPv4 header (and the bytes after it).
);

impl<T: AsRef<[u8]>> Packet<T> {
    /// Checks that the buffer holds the whole header (IHL × 4 bytes, at least 20) and that the
    /// total length is not smaller than the header. The payload may be cut short (snaplen):
    /// compare [`Self::total_len`] with the buffer length when the payload matters.
    ///
    /// # Errors
    /// [`FrameError::Truncated`]; [`FrameError::BadLength`] for IHL < 5 or total length <
    /// header length.
    pub fn check_len(&self) -> Result<(), FrameError> {
        let len = self.buffer.as_ref().len();
        need(LAYER, HEADER_LEN, len)?;
        let hl = self.header_len();
        if hl < HEADER_LEN {
            return Err(FrameError::BadLength {
                layer: LAYER,
                offset: field::VER_IHL,
                value: hl,
            });
        }
        need(LAYER, hl, len)?;
        if usize::from(self.total_len()) < hl {
            return Err(FrameError::BadLength {
                layer: LAYER,
                offset: field::LENGTH.start,
                value: usize::from(self.total_len()),
            });
        }
        Ok(())
    }

    /// Version nibble (4).
    pub fn version(&self) -> u8 {
        u8_at(self.buffer.as_ref(), field::VER_IHL) >> 4
    }

    /// Header length in bytes (IHL × 4).
    pub fn header_len(&self) -> usize {
        usize::from(u8_at(self.buffer.as_ref(), field::VER_IHL) & 0x0f) * 4
    }

    /// The TOS byte (DSCP << 2 | ECN).
    pub fn tos(&self) -> u8 {
        u8_at(self.buffer.as_ref(), field::TOS)
    }

    /// Total length (header + payload) in bytes.
    pub fn total_len(&self) -> u16 {
        u16_at(self.buffer.as_ref(), field::LENGTH.start)
    }

    /// Identification.
    pub fn ident(&self) -> u16 {
        u16_at(self.buffer.as_ref(), field::IDENT.start)
    }

    /// The DF flag.
    pub fn dont_frag(&self) -> bool {
        u16_at(self.buffer.as_ref(), field::FLG_OFF.start) & DF != 0
    }

    /// The MF flag.
    pub fn more_frags(&self) -> bool {
        u16_at(self.buffer.as_ref(), field::FLG_OFF.start) & MF != 0
    }

    /// Fragment offset in bytes.
    pub fn frag_offset(&self) -> u16 {
        (u16_at(self.buffer.as_ref(), field::FLG_OFF.start) & OFFSET_MASK) << 3
    }

    /// Time to live.
    pub fn ttl(&self) -> u8 {
        u8_at(self.buffer.as_ref(), field::TTL)
    }

    /// Protocol number.
    pub fn protocol(&self) -> u8 {
        u8_at(self.buffer.as_ref(), field::PROTOCOL)
    }

    /// Header checksum as stored.
    pub fn checksum(&self) -> u16 {
        u16_at(self.buffer.as_ref(), field::CHECKSUM.start)
    }

    /// Source address.
    pub fn src_addr(&self) -> Ipv4Addr {
        Ipv4Addr::from(array_at::<4>(self.buffer.as_ref(), field::SRC_ADDR.start))
    }

    /// Destination address.
    pub fn dst_addr(&self) -> Ipv4Addr {
        Ipv4Addr::from(array_at::<4>(self.buffer.as_ref(), field::DST_ADDR.start))
    }

    /// Whether the header checksum verifies.
    pub fn verify_checksum(&self) -> bool {
        let hl = self.header_len();
        self.buffer
            .as_ref()
            .get(..hl)
            .is_some_and(|h| internet_checksum(h) == 0)
    }

    /// The payload: from the end of the header to the total length, clipped to the buffer.
    pub fn payload(&self) -> &[u8] {
        let buf = self.buffer.as_ref();
        let end = usize::from(self.total_len()).min(buf.len());
        buf.get(self.header_len()..end).unwrap_or(&[])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets version 4 and the header length (bytes, multiple of 4, 20..=60).
    pub fn set_version_header_len(&mut self, header_len: usize) {
        let ihl = u8::try_from(header_len / 4).unwrap_or(5) & 0x0f;
        set_u8(self.buffer.as_mut(), field::VER_IHL, 0x40 | ihl);
    }

    /// Sets the TOS byte.
    pub fn set_tos(&mut self, v: u8) {
        set_u8(self.buffer.as_mut(), field::TOS, v);
    }

    /// Sets the total length.
    pub fn set_total_len(&mut self, v: u16) {
        set_u16(self.buffer.as_mut(), field::LENGTH.start, v);
    }

    /// Sets the identification.
    pub fn set_ident(&mut self, v: u16) {
        set_u16(self.buffer.as_mut(), field::IDENT.start, v);
    }

    /// Sets the flags (DF, MF; reserved bit cleared) and the fragment offset (bytes; the low
    /// 3 bits are dropped).
    pub fn set_flags_frag_offset(&mut self, dont_frag: bool, more_frags: bool, offset: u16) {
        let mut v = (offset >> 3) & OFFSET_MASK;
        if dont_frag {
            v |= DF;
        }
        if more_frags {
            v |= MF;
        }
        set_u16(self.buffer.as_mut(), field::FLG_OFF.start, v);
    }

    /// Sets the TTL.
    pub fn set_ttl(&mut self, v: u8) {
        set_u8(self.buffer.as_mut(), field::TTL, v);
    }

    /// Sets the protocol.
    pub fn set_protocol(&mut self, v: u8) {
        set_u8(self.buffer.as_mut(), field::PROTOCOL, v);
    }

    /// Sets the checksum field.
    pub fn set_checksum(&mut self, v: u16) {
        set_u16(self.buffer.as_mut(), field::CHECKSUM.start, v);
    }

    /// Sets the source address.
    pub fn set_src_addr(&mut self, v: Ipv4Addr) {
        set_bytes(self.buffer.as_mut(), field::SRC_ADDR.start, &v.octets());
    }

    /// Sets the destination address.
    pub fn set_dst_addr(&mut self, v: Ipv4Addr) {
        set_bytes(self.buffer.as_mut(), field::DST_ADDR.start, &v.octets());
    }

    /// Computes and stores the header checksum.
    pub fn fill_checksum(&mut self) {
        self.set_checksum(0);
        let hl = self.header_len();
        let sum = self.buffer.as_ref().get(..hl).map_or(0, internet_checksum);
        self.set_checksum(sum);
    }
}

/// The fields of an IPv4 header that RoCEv2 uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Ipv4Repr {
    /// Source address.
    pub src_addr: Ipv4Addr,
    /// Destination address.
    pub dst_addr: Ipv4Addr,
    /// Protocol number (17 for RoCEv2).
    pub protocol: u8,
    /// TOS byte (DSCP << 2 | ECN); rxe copies the AV traffic class here.
    pub tos: u8,
    /// Time to live.
    pub ttl: u8,
    /// Identification.
    pub ident: u16,
    /// DF flag (rxe and Mellanox set it).
    pub dont_frag: bool,
    /// MF flag.
    pub more_frags: bool,
    /// Fragment offset in bytes.
    pub frag_offset: u16,
    /// Payload length (total length − header length) as stated by the header.
    pub payload_len: usize,
}

impl Ipv4Repr {
    /// Parses the header. The header checksum is not verified (captures taken on the sender
    /// often carry an unfilled checksum); see [`Packet::verify_checksum`].
    ///
    /// # Errors
    /// Those of [`Packet::check_len`]; [`FrameError::BadVersion`] if the version is not 4.
    pub fn parse<T: AsRef<[u8]>>(packet: &Packet<T>) -> Result<Self, FrameError> {
        if packet.version() != 4 {
            return Err(FrameError::BadVersion {
                layer: LAYER,
                offset: field::VER_IHL,
                value: packet.version(),
            });
        }
        packet.check_len()?;
        // Read the fixed header once into an array: the accessors then need no bounds checks.
        let packet = &Packet::new_unchecked(array_at::<HEADER_LEN>(packet.buffer.as_ref(), 0));
        Ok(Ipv4Repr {
            src_addr: packet.src_addr(),
            dst_addr: packet.dst_addr(),
            protocol: packet.protocol(),
            tos: packet.tos(),
            ttl: packet.ttl(),
            ident: packet.ident(),
            dont_frag: packet.dont_frag(),
            more_frags: packet.more_frags(),
            frag_offset: packet.frag_offset(),
            payload_len: usize::from(packet.total_len()).saturating_sub(packet.header_len()),
        })
    }

    /// Whether this header belongs to a fragment (MF set or a non-zero offset).
    pub const fn is_fragment(&self) -> bool {
        self.more_frags || self.frag_offset != 0
    }

    /// Length of the emitted header (20; options are not emitted).
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes a 20-byte header with a correct checksum. A `payload_len` that does not fit
    /// the 16-bit total length is saturated (the RoCEv2 emitters refuse such payloads first).
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) {
        packet.set_version_header_len(HEADER_LEN);
        packet.set_tos(self.tos);
        let total = self.payload_len.saturating_add(HEADER_LEN);
        packet.set_total_len(u16::try_from(total).unwrap_or(u16::MAX));
        packet.set_ident(self.ident);
        packet.set_flags_frag_offset(self.dont_frag, self.more_frags, self.frag_offset);
        packet.set_ttl(self.ttl);
        packet.set_protocol(self.protocol);
        packet.set_src_addr(self.src_addr);
        packet.set_dst_addr(self.dst_addr);
        packet.fill_checksum();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// IPv4 header of captures/real/rocev2_mlx_nvme-discover.pcap frame 5 (docs/framing.md
    /// §2.4 vector 3).
    #[rustfmt::skip]
    const HDR: [u8; 20] = [
        0x45, 0x00, 0x01, 0x34, 0x5f, 0xf8, 0x40, 0x00, 0x40, 0x11, 0xd1, 0xb9,
        0x02, 0x02, 0x02, 0x01, 0x02, 0x02, 0x02, 0x03,
    ];

    fn repr() -> Ipv4Repr {
        Ipv4Repr {
            src_addr: Ipv4Addr::new(2, 2, 2, 1),
            dst_addr: Ipv4Addr::new(2, 2, 2, 3),
            protocol: 17,
            tos: 0,
            ttl: 64,
            ident: 0x5ff8,
            dont_frag: true,
            more_frags: false,
            frag_offset: 0,
            payload_len: 288,
        }
    }

    #[test]
    fn deconstruct() {
        let p = Packet::new_checked(&HDR[..]).unwrap();
        assert_eq!(p.version(), 4);
        assert_eq!(p.header_len(), 20);
        assert_eq!(p.total_len(), 0x134);
        assert_eq!(p.checksum(), 0xd1b9);
        assert!(p.verify_checksum());
        assert!(p.payload().is_empty());
        assert_eq!(Ipv4Repr::parse(&p).unwrap(), repr());
    }

    #[test]
    fn construct() {
        let mut buf = [0xa5u8; 20];
        repr().emit(&mut Packet::new_unchecked(&mut buf[..]));
        assert_eq!(buf, HDR);
    }

    #[test]
    fn bad_fields() {
        for n in 0..20 {
            assert!(Packet::new_checked(&HDR[..n]).is_err());
        }
        let mut b = HDR;
        b[0] = 0x44;
        assert!(matches!(
            Packet::new_checked(&b[..]),
            Err(FrameError::BadLength { value: 16, .. })
        ));
        b[0] = 0x46;
        assert!(matches!(
            Packet::new_checked(&b[..]),
            Err(FrameError::Truncated { need: 24, .. })
        ));
        b[0] = 0x65;
        assert!(matches!(
            Ipv4Repr::parse(&Packet::new_unchecked(&b[..])),
            Err(FrameError::BadVersion { value: 6, .. })
        ));
        let mut b = HDR;
        b[3] = 10;
        b[2] = 0;
        assert!(matches!(
            Packet::new_checked(&b[..]),
            Err(FrameError::BadLength { value: 10, .. })
        ));
    }
}
