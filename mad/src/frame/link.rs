//! Capture link headers that come before Ethernet / IP / LRH: Linux cooked v1 (LINKTYPE 113)
//! and v2 (276), and the ERF record header (LINKTYPE 197) (docs/framing.md §3.1).

use core::fmt;

use super::eth::EtherType;

/// Linux cooked-capture packet type (`sll_pkttype`).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct PacketType(pub u16);

impl PacketType {
    /// Addressed to this host.
    pub const HOST: PacketType = PacketType(0);
    /// Broadcast.
    pub const BROADCAST: PacketType = PacketType(1);
    /// Multicast.
    pub const MULTICAST: PacketType = PacketType(2);
    /// To another host (promiscuous).
    pub const OTHER_HOST: PacketType = PacketType(3);
    /// Sent by this host.
    pub const OUTGOING: PacketType = PacketType(4);

    /// A short name ("in", "out", …).
    pub const fn name(self) -> &'static str {
        match self.0 {
            0 => "in",
            1 => "broadcast",
            2 => "multicast",
            3 => "other-host",
            4 => "out",
            _ => "unknown",
        }
    }
}

impl fmt::Debug for PacketType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PacketType({} {})", self.0, self.name())
    }
}

/// Linux cooked capture v1 (LINKTYPE_LINUX_SLL, 113): 16-byte header.
pub mod sll {
    use super::{EtherType, PacketType};
    use crate::frame::wire::{array_at, need, set_bytes, set_u16, u16_at};
    use crate::frame::FrameError;

    /// Field offsets.
    pub mod field {
        use core::ops::Range;

        /// Packet type.
        pub const PKTTYPE: Range<usize> = 0..2;
        /// ARPHRD_ type of the device.
        pub const ARPHRD: Range<usize> = 2..4;
        /// Link-layer address length.
        pub const ADDR_LEN: Range<usize> = 4..6;
        /// Link-layer address (first 8 bytes).
        pub const ADDR: Range<usize> = 6..14;
        /// Protocol (EtherType).
        pub const PROTOCOL: Range<usize> = 14..16;
    }

    /// Length of the header.
    pub const HEADER_LEN: usize = field::PROTOCOL.end;

    view!(
        /// A view of a Linux cooked v1 header.
    );

    impl<T: AsRef<[u8]>> Packet<T> {
        /// Checks that the buffer holds the 16-byte header.
        ///
        /// # Errors
        /// [`FrameError::Truncated`].
        pub fn check_len(&self) -> Result<(), FrameError> {
            need("Linux SLL", HEADER_LEN, self.buffer.as_ref().len())
        }

        /// Packet type.
        pub fn pkttype(&self) -> PacketType {
            PacketType(u16_at(self.buffer.as_ref(), field::PKTTYPE.start))
        }

        /// ARPHRD_ type.
        pub fn arphrd(&self) -> u16 {
            u16_at(self.buffer.as_ref(), field::ARPHRD.start)
        }

        /// Address length.
        pub fn addr_len(&self) -> u16 {
            u16_at(self.buffer.as_ref(), field::ADDR_LEN.start)
        }

        /// Address bytes (8; only the first `addr_len` are meaningful).
        pub fn addr(&self) -> [u8; 8] {
            array_at(self.buffer.as_ref(), field::ADDR.start)
        }

        /// Protocol.
        pub fn protocol(&self) -> EtherType {
            EtherType(u16_at(self.buffer.as_ref(), field::PROTOCOL.start))
        }

        /// Everything after the header.
        pub fn payload(&self) -> &[u8] {
            self.buffer.as_ref().get(HEADER_LEN..).unwrap_or(&[])
        }
    }

    /// A Linux cooked v1 header.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
    pub struct SllRepr {
        /// Packet type (direction).
        pub pkttype: PacketType,
        /// ARPHRD_ type (1 = Ethernet).
        pub arphrd: u16,
        /// Address length.
        pub addr_len: u16,
        /// Address (first 8 bytes).
        pub addr: [u8; 8],
        /// Protocol (EtherType).
        pub protocol: EtherType,
    }

    impl SllRepr {
        /// Parses the header.
        ///
        /// # Errors
        /// [`FrameError::Truncated`].
        pub fn parse<T: AsRef<[u8]>>(packet: &Packet<T>) -> Result<Self, FrameError> {
            packet.check_len()?;
            // Read the fixed header once into an array: no bounds checks in the accessors.
            let packet = &Packet::new_unchecked(array_at::<HEADER_LEN>(packet.buffer.as_ref(), 0));
            Ok(SllRepr {
                pkttype: packet.pkttype(),
                arphrd: packet.arphrd(),
                addr_len: packet.addr_len(),
                addr: packet.addr(),
                protocol: packet.protocol(),
            })
        }

        /// Length of the header (16).
        pub const fn buffer_len(&self) -> usize {
            HEADER_LEN
        }

        /// Writes the header.
        pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) {
            let b = packet.buffer.as_mut();
            set_u16(b, field::PKTTYPE.start, self.pkttype.0);
            set_u16(b, field::ARPHRD.start, self.arphrd);
            set_u16(b, field::ADDR_LEN.start, self.addr_len);
            set_bytes(b, field::ADDR.start, &self.addr);
            set_u16(b, field::PROTOCOL.start, self.protocol.0);
        }
    }
}

/// Linux cooked capture v2 (LINKTYPE_LINUX_SLL2, 276): 20-byte header.
pub mod sll2 {
    use super::{EtherType, PacketType};
    use crate::frame::wire::{
        array_at, need, set_bytes, set_u16, set_u32, set_u8, u16_at, u32_at, u8_at,
    };
    use crate::frame::FrameError;

    /// Field offsets.
    pub mod field {
        use core::ops::Range;

        /// Protocol (EtherType).
        pub const PROTOCOL: Range<usize> = 0..2;
        /// Reserved (MBZ).
        pub const RESERVED: Range<usize> = 2..4;
        /// Interface index.
        pub const IFINDEX: Range<usize> = 4..8;
        /// ARPHRD_ type.
        pub const ARPHRD: Range<usize> = 8..10;
        /// Packet type.
        pub const PKTTYPE: usize = 10;
        /// Link-layer address length.
        pub const ADDR_LEN: usize = 11;
        /// Link-layer address (first 8 bytes).
        pub const ADDR: Range<usize> = 12..20;
    }

    /// Length of the header.
    pub const HEADER_LEN: usize = field::ADDR.end;

    view!(
        /// A view of a Linux cooked v2 header.
    );

    impl<T: AsRef<[u8]>> Packet<T> {
        /// Checks that the buffer holds the 20-byte header.
        ///
        /// # Errors
        /// [`FrameError::Truncated`].
        pub fn check_len(&self) -> Result<(), FrameError> {
            need("Linux SLL2", HEADER_LEN, self.buffer.as_ref().len())
        }

        /// Protocol.
        pub fn protocol(&self) -> EtherType {
            EtherType(u16_at(self.buffer.as_ref(), field::PROTOCOL.start))
        }

        /// Interface index.
        pub fn ifindex(&self) -> u32 {
            u32_at(self.buffer.as_ref(), field::IFINDEX.start)
        }

        /// ARPHRD_ type.
        pub fn arphrd(&self) -> u16 {
            u16_at(self.buffer.as_ref(), field::ARPHRD.start)
        }

        /// Packet type.
        pub fn pkttype(&self) -> PacketType {
            PacketType(u16::from(u8_at(self.buffer.as_ref(), field::PKTTYPE)))
        }

        /// Address length.
        pub fn addr_len(&self) -> u8 {
            u8_at(self.buffer.as_ref(), field::ADDR_LEN)
        }

        /// Address bytes (8).
        pub fn addr(&self) -> [u8; 8] {
            array_at(self.buffer.as_ref(), field::ADDR.start)
        }

        /// Everything after the header.
        pub fn payload(&self) -> &[u8] {
            self.buffer.as_ref().get(HEADER_LEN..).unwrap_or(&[])
        }
    }

    /// A Linux cooked v2 header. The reserved field is ignored on parse and zeroed on emit.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
    pub struct Sll2Repr {
        /// Protocol (EtherType).
        pub protocol: EtherType,
        /// Interface index (tells the two sides of a veth pair apart under `-i any`).
        pub ifindex: u32,
        /// ARPHRD_ type.
        pub arphrd: u16,
        /// Packet type (direction; 8 bits on the wire).
        pub pkttype: PacketType,
        /// Address length.
        pub addr_len: u8,
        /// Address (first 8 bytes).
        pub addr: [u8; 8],
    }

    impl Sll2Repr {
        /// Parses the header.
        ///
        /// # Errors
        /// [`FrameError::Truncated`].
        pub fn parse<T: AsRef<[u8]>>(packet: &Packet<T>) -> Result<Self, FrameError> {
            packet.check_len()?;
            // Read the fixed header once into an array: no bounds checks in the accessors.
            let packet = &Packet::new_unchecked(array_at::<HEADER_LEN>(packet.buffer.as_ref(), 0));
            Ok(Sll2Repr {
                protocol: packet.protocol(),
                ifindex: packet.ifindex(),
                arphrd: packet.arphrd(),
                pkttype: packet.pkttype(),
                addr_len: packet.addr_len(),
                addr: packet.addr(),
            })
        }

        /// Length of the header (20).
        pub const fn buffer_len(&self) -> usize {
            HEADER_LEN
        }

        /// Writes the header (a packet type above 255 is truncated to its low byte).
        pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) {
            let b = packet.buffer.as_mut();
            set_u16(b, field::PROTOCOL.start, self.protocol.0);
            set_u16(b, field::RESERVED.start, 0);
            set_u32(b, field::IFINDEX.start, self.ifindex);
            set_u16(b, field::ARPHRD.start, self.arphrd);
            set_u8(b, field::PKTTYPE, self.pkttype.0.to_be_bytes()[1]);
            set_u8(b, field::ADDR_LEN, self.addr_len);
            set_bytes(b, field::ADDR.start, &self.addr);
        }
    }
}

/// ERF record header (LINKTYPE_ERF, 197): 16 bytes + 8 per extension header.
///
/// Layout [docs/framing.md §3.1]: timestamp u64 little-endian (high 32 bits seconds, low 32
/// bits a binary fraction), type u8 (bit 7: an extension header follows), flags u8, rlen u16
/// BE (record length incl. padding), lctr u16 BE, wlen u16 BE (wire length). Each extension
/// header is 8 bytes whose first byte's bit 7 says whether another one follows. Ethernet
/// record types put 2 bytes (offset, pad) before the frame.
pub mod erf {
    use core::time::Duration;

    use crate::frame::wire::{need, set_bytes, set_u16, set_u8, u16_at, u8_at};
    use crate::frame::FrameError;

    /// Field offsets.
    pub mod field {
        use core::ops::Range;

        /// Timestamp (little-endian 32.32 fixed point seconds).
        pub const TIMESTAMP: Range<usize> = 0..8;
        /// Record type (bit 7: extension header present).
        pub const TYPE: usize = 8;
        /// Flags (bits 0-1 interface, bit 2 varlen, …).
        pub const FLAGS: usize = 9;
        /// Record length including this header and padding.
        pub const RLEN: Range<usize> = 10..12;
        /// Loss counter / colour.
        pub const LCTR: Range<usize> = 12..14;
        /// Wire length of the packet.
        pub const WLEN: Range<usize> = 14..16;
    }

    /// Length of the base header.
    pub const HEADER_LEN: usize = field::WLEN.end;
    /// Length of one extension header.
    pub const EXT_HEADER_LEN: usize = 8;
    /// Most extension headers accepted.
    pub const MAX_EXT_HEADERS: usize = 16;

    /// Ethernet record.
    pub const TYPE_ETH: u8 = 2;
    /// Coloured Ethernet record.
    pub const TYPE_COLOR_ETH: u8 = 11;
    /// DSM-coloured Ethernet record.
    pub const TYPE_DSM_COLOR_ETH: u8 = 16;
    /// Colour-hash Ethernet record.
    pub const TYPE_COLOR_HASH_ETH: u8 = 20;
    /// InfiniBand record: LRH..VCRC (what ibdump writes).
    pub const TYPE_INFINIBAND: u8 = 21;
    /// Raw IPv4 record.
    pub const TYPE_IPV4: u8 = 22;
    /// Raw IPv6 record.
    pub const TYPE_IPV6: u8 = 23;
    /// InfiniBand link-layer record (flow control, no transport).
    pub const TYPE_INFINIBAND_LINK: u8 = 25;

    const LAYER: &str = "ERF";

    view!(
        /// A view of an ERF record header.
    );

    impl<T: AsRef<[u8]>> Packet<T> {
        /// Checks that the buffer holds the 16-byte base header (extension headers are
        /// checked by [`ErfRepr::parse`]).
        ///
        /// # Errors
        /// [`FrameError::Truncated`].
        pub fn check_len(&self) -> Result<(), FrameError> {
            need(LAYER, HEADER_LEN, self.buffer.as_ref().len())
        }

        /// Raw timestamp (32.32 fixed point seconds since the Unix epoch).
        pub fn timestamp(&self) -> u64 {
            u64::from_le_bytes(crate::frame::wire::array_at(
                self.buffer.as_ref(),
                field::TIMESTAMP.start,
            ))
        }

        /// Record type (low 7 bits).
        pub fn erf_type(&self) -> u8 {
            u8_at(self.buffer.as_ref(), field::TYPE) & 0x7f
        }

        /// Whether an extension header follows the base header.
        pub fn has_ext(&self) -> bool {
            u8_at(self.buffer.as_ref(), field::TYPE) & 0x80 != 0
        }

        /// Flags.
        pub fn flags(&self) -> u8 {
            u8_at(self.buffer.as_ref(), field::FLAGS)
        }

        /// Record length.
        pub fn rlen(&self) -> u16 {
            u16_at(self.buffer.as_ref(), field::RLEN.start)
        }

        /// Loss counter.
        pub fn lctr(&self) -> u16 {
            u16_at(self.buffer.as_ref(), field::LCTR.start)
        }

        /// Wire length.
        pub fn wlen(&self) -> u16 {
            u16_at(self.buffer.as_ref(), field::WLEN.start)
        }
    }

    /// An ERF record header.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
    pub struct ErfRepr {
        /// Raw timestamp (32.32 fixed point seconds since the Unix epoch).
        pub timestamp: u64,
        /// Record type (low 7 bits; 21 = InfiniBand).
        pub erf_type: u8,
        /// Flags (ibdump writes 4, or 5 in decap mode).
        pub flags: u8,
        /// Record length (may exceed the captured length: padding).
        pub rlen: u16,
        /// Loss counter.
        pub lctr: u16,
        /// Wire length of the packet (for InfiniBand: LRH..VCRC).
        pub wlen: u16,
        /// Number of extension headers (their contents are skipped).
        pub ext_headers: u8,
    }

    impl ErfRepr {
        /// Parses the header and walks the extension headers.
        ///
        /// # Errors
        /// [`FrameError::Truncated`]; [`FrameError::BadLength`] for more than
        /// [`MAX_EXT_HEADERS`] extension headers.
        pub fn parse<T: AsRef<[u8]>>(packet: &Packet<T>) -> Result<Self, FrameError> {
            packet.check_len()?;
            let buf = packet.buffer.as_ref();
            let mut more = packet.has_ext();
            let mut count = 0usize;
            while more {
                let at = HEADER_LEN + count * EXT_HEADER_LEN;
                if count == MAX_EXT_HEADERS {
                    return Err(FrameError::BadLength {
                        layer: "ERF extension header",
                        offset: at,
                        value: count + 1,
                    });
                }
                if buf.len() < at + EXT_HEADER_LEN {
                    return Err(FrameError::Truncated {
                        layer: "ERF extension header",
                        offset: at,
                        need: EXT_HEADER_LEN,
                        have: buf.len().saturating_sub(at),
                    });
                }
                more = u8_at(buf, at) & 0x80 != 0;
                count += 1;
            }
            Ok(ErfRepr {
                timestamp: packet.timestamp(),
                erf_type: packet.erf_type(),
                flags: packet.flags(),
                rlen: packet.rlen(),
                lctr: packet.lctr(),
                wlen: packet.wlen(),
                ext_headers: u8::try_from(count).unwrap_or(u8::MAX),
            })
        }

        /// Whether the record type carries an Ethernet frame (after 2 bytes of offset/pad).
        pub const fn is_ethernet(&self) -> bool {
            matches!(
                self.erf_type,
                TYPE_ETH | TYPE_COLOR_ETH | TYPE_DSM_COLOR_ETH | TYPE_COLOR_HASH_ETH
            )
        }

        /// Header length: 16 + 8 × extension headers.
        pub const fn buffer_len(&self) -> usize {
            HEADER_LEN + self.ext_headers as usize * EXT_HEADER_LEN
        }

        /// Offset of the packet in the record: [`Self::buffer_len`], plus 2 for Ethernet types.
        pub const fn payload_offset(&self) -> usize {
            self.buffer_len() + if self.is_ethernet() { 2 } else { 0 }
        }

        /// The timestamp as time since the Unix epoch (the 32-bit binary fraction rounded
        /// down to nanoseconds).
        pub fn timestamp_duration(&self) -> Duration {
            let secs = self.timestamp >> 32;
            let frac = self.timestamp & 0xffff_ffff;
            let nanos = (frac * 1_000_000_000) >> 32;
            Duration::from_secs(secs).saturating_add(Duration::from_nanos(nanos))
        }

        /// Writes the base header and `ext_headers` zeroed extension headers (their
        /// continuation bits set); the payload starts at [`Self::buffer_len`].
        pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) {
            let b = packet.buffer.as_mut();
            set_bytes(b, field::TIMESTAMP.start, &self.timestamp.to_le_bytes());
            let ext = if self.ext_headers > 0 { 0x80 } else { 0 };
            set_u8(b, field::TYPE, (self.erf_type & 0x7f) | ext);
            set_u8(b, field::FLAGS, self.flags);
            set_u16(b, field::RLEN.start, self.rlen);
            set_u16(b, field::LCTR.start, self.lctr);
            set_u16(b, field::WLEN.start, self.wlen);
            for i in 0..usize::from(self.ext_headers) {
                let at = HEADER_LEN + i * EXT_HEADER_LEN;
                let more = if i + 1 < usize::from(self.ext_headers) {
                    0x80
                } else {
                    0
                };
                set_bytes(b, at, &[more, 0, 0, 0, 0, 0, 0, 0]);
            }
        }
    }
}

pub use erf::ErfRepr;
pub use sll::SllRepr;
pub use sll2::Sll2Repr;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sll_roundtrip() {
        let b: [u8; 16] = [
            0, 4, 0, 1, 0, 6, 0x24, 0x8a, 0x07, 1, 2, 3, 0, 0, 0x08, 0x00,
        ];
        let r = SllRepr::parse(&sll::Packet::new_checked(&b[..]).unwrap()).unwrap();
        assert_eq!(r.pkttype, PacketType::OUTGOING);
        assert_eq!(r.protocol, EtherType::IPV4);
        let mut out = [0xa5u8; 16];
        r.emit(&mut sll::Packet::new_unchecked(&mut out[..]));
        assert_eq!(out, b);
        for n in 0..16 {
            assert!(SllRepr::parse(&sll::Packet::new_unchecked(&b[..n])).is_err());
        }
    }

    #[test]
    fn sll2_roundtrip() {
        let b: [u8; 20] = [
            0x08, 0x00, 0, 0, 0, 0, 0, 7, 0, 1, 0, 6, 0x24, 0x8a, 0x07, 1, 2, 3, 0, 0,
        ];
        let r = Sll2Repr::parse(&sll2::Packet::new_checked(&b[..]).unwrap()).unwrap();
        assert_eq!((r.ifindex, r.pkttype, r.addr_len), (7, PacketType::HOST, 6));
        let mut out = [0xa5u8; 20];
        r.emit(&mut sll2::Packet::new_unchecked(&mut out[..]));
        assert_eq!(out, b);
        for n in 0..20 {
            assert!(Sll2Repr::parse(&sll2::Packet::new_unchecked(&b[..n])).is_err());
        }
    }

    #[test]
    fn erf_header() {
        // ib_erf_infiniband.pcap record 3: ts, type 21, flags 4, rlen 192, lctr 0, wlen 174.
        let ts: u64 = (1_210_794_482u64 << 32) | 0xe875_0000;
        let mut b = [0u8; 16];
        b[..8].copy_from_slice(&ts.to_le_bytes());
        b[8..].copy_from_slice(&[21, 4, 0, 192, 0, 0, 0, 174]);
        let r = ErfRepr::parse(&erf::Packet::new_checked(&b[..]).unwrap()).unwrap();
        assert_eq!((r.erf_type, r.flags, r.rlen, r.wlen), (21, 4, 192, 174));
        assert_eq!(r.payload_offset(), 16);
        assert_eq!(r.timestamp_duration().as_secs(), 1_210_794_482);
        let mut out = [0xa5u8; 16];
        r.emit(&mut erf::Packet::new_unchecked(&mut out[..]));
        assert_eq!(out, b);

        // Two extension headers, then an Ethernet record.
        let mut e = b.to_vec();
        e[8] = 0x80 | erf::TYPE_ETH;
        e.extend_from_slice(&[0x80, 0, 0, 0, 0, 0, 0, 0, 0x01, 0, 0, 0, 0, 0, 0, 0]);
        let r = ErfRepr::parse(&erf::Packet::new_unchecked(&e[..])).unwrap();
        assert_eq!((r.ext_headers, r.payload_offset()), (2, 34));
        let mut out = [0xa5u8; 32];
        r.emit(&mut erf::Packet::new_unchecked(&mut out[..]));
        assert_eq!(
            ErfRepr::parse(&erf::Packet::new_unchecked(&out[..])).unwrap(),
            r
        );
        for n in 0..32 {
            assert!(ErfRepr::parse(&erf::Packet::new_unchecked(&e[..n])).is_err());
        }
    }
}
