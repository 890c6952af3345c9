//! IPv6 fixed header (RFC 8200), as RoCEv2 uses it: next header 17 (UDP), no extension
//! headers (docs/framing.md §3.4).

use core::net::Ipv6Addr;

use super::wire::{array_at, need, set_bytes, set_u16, set_u32, set_u8, u16_at, u32_at, u8_at};
use super::FrameError;
use crate::types::FlowLabel;

/// Field offsets.
pub mod field {
    use core::ops::Range;

    /// Version (4 bits), traffic class (8), flow label (20). All but the version are masked
    /// in the ICRC.
    pub const VER_TC_FLOW: Range<usize> = 0..4;
    /// Payload length (bytes after the fixed header).
    pub const PAYLOAD_LEN: Range<usize> = 4..6;
    /// Next header (17 = UDP).
    pub const NEXT_HEADER: usize = 6;
    /// Hop limit. Masked in the ICRC.
    pub const HOP_LIMIT: usize = 7;
    /// Source address.
    pub const SRC_ADDR: Range<usize> = 8..24;
    /// Destination address.
    pub const DST_ADDR: Range<usize> = 24..40;
}

/// Length of the fixed header.
pub const HEADER_LEN: usize = field::DST_ADDR.end;

const LAYER: &str = "IPv6";

view!(
    /// A view of an IPv6 fixed header (and the bytes after it).
);

impl<T: AsRef<[u8]>> Packet<T> {
    /// Checks that the buffer holds the 40-byte fixed header. The payload may be cut short
    /// (snaplen): compare [`Self::payload_len`] with the buffer when the payload matters.
    ///
    /// # Errors
    /// [`FrameError::Truncated`].
    pub fn check_len(&self) -> Result<(), FrameError> {
        need(LAYER, HEADER_LEN, self.buffer.as_ref().len())
    }

    fn word0(&self) -> u32 {
        u32_at(self.buffer.as_ref(), field::VER_TC_FLOW.start)
    }

    /// Version (6).
    pub fn version(&self) -> u8 {
        u8_at(self.buffer.as_ref(), 0) >> 4
    }

    /// Traffic class (DSCP << 2 | ECN).
    pub fn traffic_class(&self) -> u8 {
        ((self.word0() >> 20) & 0xff) as u8
    }

    /// Flow label.
    pub fn flow_label(&self) -> FlowLabel {
        FlowLabel::masked(self.word0())
    }

    /// Payload length.
    pub fn payload_len(&self) -> u16 {
        u16_at(self.buffer.as_ref(), field::PAYLOAD_LEN.start)
    }

    /// Next header.
    pub fn next_header(&self) -> u8 {
        u8_at(self.buffer.as_ref(), field::NEXT_HEADER)
    }

    /// Hop limit.
    pub fn hop_limit(&self) -> u8 {
        u8_at(self.buffer.as_ref(), field::HOP_LIMIT)
    }

    /// Source address.
    pub fn src_addr(&self) -> Ipv6Addr {
        Ipv6Addr::from(array_at::<16>(self.buffer.as_ref(), field::SRC_ADDR.start))
    }

    /// Destination address.
    pub fn dst_addr(&self) -> Ipv6Addr {
        Ipv6Addr::from(array_at::<16>(self.buffer.as_ref(), field::DST_ADDR.start))
    }

    /// The payload: the payload length's worth of bytes after the header, clipped to the
    /// buffer.
    pub fn payload(&self) -> &[u8] {
        let buf = self.buffer.as_ref();
        let end = (HEADER_LEN + usize::from(self.payload_len())).min(buf.len());
        buf.get(HEADER_LEN..end).unwrap_or(&[])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets version 6, the traffic class and the flow label.
    pub fn set_version_tc_flow(&mut self, traffic_class: u8, flow_label: FlowLabel) {
        let w = (6u32 << 28) | (u32::from(traffic_class) << 20) | flow_label.get();
        set_u32(self.buffer.as_mut(), field::VER_TC_FLOW.start, w);
    }

    /// Sets the payload length.
    pub fn set_payload_len(&mut self, v: u16) {
        set_u16(self.buffer.as_mut(), field::PAYLOAD_LEN.start, v);
    }

    /// Sets the next header.
    pub fn set_next_header(&mut self, v: u8) {
        set_u8(self.buffer.as_mut(), field::NEXT_HEADER, v);
    }

    /// Sets the hop limit.
    pub fn set_hop_limit(&mut self, v: u8) {
        set_u8(self.buffer.as_mut(), field::HOP_LIMIT, v);
    }

    /// Sets the source address.
    pub fn set_src_addr(&mut self, v: Ipv6Addr) {
        set_bytes(self.buffer.as_mut(), field::SRC_ADDR.start, &v.octets());
    }

    /// Sets the destination address.
    pub fn set_dst_addr(&mut self, v: Ipv6Addr) {
        set_bytes(self.buffer.as_mut(), field::DST_ADDR.start, &v.octets());
    }
}

/// The fields of an IPv6 fixed header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Ipv6Repr {
    /// Source address.
    pub src_addr: Ipv6Addr,
    /// Destination address.
    pub dst_addr: Ipv6Addr,
    /// Next header (17 for RoCEv2).
    pub next_header: u8,
    /// Hop limit.
    pub hop_limit: u8,
    /// Traffic class.
    pub traffic_class: u8,
    /// Flow label (rxe sends 0).
    pub flow_label: FlowLabel,
    /// Payload length as stated by the header.
    pub payload_len: usize,
}

impl Ipv6Repr {
    /// Parses the fixed header.
    ///
    /// # Errors
    /// [`FrameError::Truncated`]; [`FrameError::BadVersion`] if the version is not 6.
    pub fn parse<T: AsRef<[u8]>>(packet: &Packet<T>) -> Result<Self, FrameError> {
        packet.check_len()?;
        // Read the fixed header once into an array: the accessors then need no bounds checks.
        let packet = &Packet::new_unchecked(array_at::<HEADER_LEN>(packet.buffer.as_ref(), 0));
        if packet.version() != 6 {
            return Err(FrameError::BadVersion {
                layer: LAYER,
                offset: 0,
                value: packet.version(),
            });
        }
        Ok(Ipv6Repr {
            src_addr: packet.src_addr(),
            dst_addr: packet.dst_addr(),
            next_header: packet.next_header(),
            hop_limit: packet.hop_limit(),
            traffic_class: packet.traffic_class(),
            flow_label: packet.flow_label(),
            payload_len: usize::from(packet.payload_len()),
        })
    }

    /// Length of the emitted header (40).
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes the fixed header. A `payload_len` above 65535 is saturated (the RoCEv2
    /// emitters refuse such payloads first).
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) {
        packet.set_version_tc_flow(self.traffic_class, self.flow_label);
        packet.set_payload_len(u16::try_from(self.payload_len).unwrap_or(u16::MAX));
        packet.set_next_header(self.next_header);
        packet.set_hop_limit(self.hop_limit);
        packet.set_src_addr(self.src_addr);
        packet.set_dst_addr(self.dst_addr);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[rustfmt::skip]
    const HDR: [u8; 40] = [
        0x61, 0x2a, 0xbc, 0xde, 0x01, 0x20, 0x11, 0x40,
        0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x01,
        0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x02,
    ];

    fn repr() -> Ipv6Repr {
        Ipv6Repr {
            src_addr: "fe80::1".parse().unwrap(),
            dst_addr: "fe80::2".parse().unwrap(),
            next_header: 17,
            hop_limit: 64,
            traffic_class: 0x12,
            flow_label: FlowLabel::new(0xabcde).unwrap(),
            payload_len: 288,
        }
    }

    #[test]
    fn deconstruct() {
        let p = Packet::new_checked(&HDR[..]).unwrap();
        assert_eq!(p.traffic_class(), 0x12);
        assert_eq!(p.flow_label().get(), 0xabcde);
        assert_eq!(Ipv6Repr::parse(&p).unwrap(), repr());
    }

    #[test]
    fn construct() {
        let mut buf = [0xa5u8; 40];
        repr().emit(&mut Packet::new_unchecked(&mut buf[..]));
        assert_eq!(buf, HDR);
    }

    #[test]
    fn truncated_and_version() {
        for n in 0..40 {
            assert!(Ipv6Repr::parse(&Packet::new_unchecked(&HDR[..n])).is_err());
        }
        let mut b = HDR;
        b[0] = 0x41;
        assert!(matches!(
            Ipv6Repr::parse(&Packet::new_unchecked(&b[..])),
            Err(FrameError::BadVersion { value: 4, .. })
        ));
    }
}
