//! UDP header (RFC 768). RoCEv2 uses destination port 4791 ([`super::ROCEV2_UDP_PORT`]) and
//! sends checksum 0 (docs/framing.md §1.1, §1.5).

use super::wire::{array_at, need, set_u16, u16_at};
use super::FrameError;

/// Field offsets.
pub mod field {
    use core::ops::Range;

    /// Source port (an entropy field on RoCEv2; rxe's QP1 uses 0xD872).
    pub const SRC_PORT: Range<usize> = 0..2;
    /// Destination port (4791 on RoCEv2).
    pub const DST_PORT: Range<usize> = 2..4;
    /// Length of header + payload.
    pub const LENGTH: Range<usize> = 4..6;
    /// Checksum (0 = none). Masked in the ICRC.
    pub const CHECKSUM: Range<usize> = 6..8;
}

/// Length of the header.
pub const HEADER_LEN: usize = field::CHECKSUM.end;

const LAYER: &str = "UDP";

view!(
    /// A view of a UDP header (and the bytes after it).
);

impl<T: AsRef<[u8]>> Packet<T> {
    /// Checks that the buffer holds the 8-byte header.
    ///
    /// # Errors
    /// [`FrameError::Truncated`].
    pub fn check_len(&self) -> Result<(), FrameError> {
        need(LAYER, HEADER_LEN, self.buffer.as_ref().len())
    }

    /// Source port.
    pub fn src_port(&self) -> u16 {
        u16_at(self.buffer.as_ref(), field::SRC_PORT.start)
    }

    /// Destination port.
    pub fn dst_port(&self) -> u16 {
        u16_at(self.buffer.as_ref(), field::DST_PORT.start)
    }

    /// Length field (header + payload).
    pub fn len(&self) -> u16 {
        u16_at(self.buffer.as_ref(), field::LENGTH.start)
    }

    /// Whether the length field is 0 (never valid).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Checksum field.
    pub fn checksum(&self) -> u16 {
        u16_at(self.buffer.as_ref(), field::CHECKSUM.start)
    }

    /// The payload: up to the length field, clipped to the buffer.
    pub fn payload(&self) -> &[u8] {
        let buf = self.buffer.as_ref();
        let end = usize::from(self.len()).min(buf.len());
        buf.get(HEADER_LEN..end).unwrap_or(&[])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets the source port.
    pub fn set_src_port(&mut self, v: u16) {
        set_u16(self.buffer.as_mut(), field::SRC_PORT.start, v);
    }

    /// Sets the destination port.
    pub fn set_dst_port(&mut self, v: u16) {
        set_u16(self.buffer.as_mut(), field::DST_PORT.start, v);
    }

    /// Sets the length field.
    pub fn set_len(&mut self, v: u16) {
        set_u16(self.buffer.as_mut(), field::LENGTH.start, v);
    }

    /// Sets the checksum field.
    pub fn set_checksum(&mut self, v: u16) {
        set_u16(self.buffer.as_mut(), field::CHECKSUM.start, v);
    }
}

/// A UDP header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct UdpRepr {
    /// Source port.
    pub src_port: u16,
    /// Destination port.
    pub dst_port: u16,
    /// Payload length (length field − 8).
    pub payload_len: usize,
}

impl UdpRepr {
    /// Parses the header. The checksum is not verified (RoCEv2 senders send 0).
    ///
    /// # Errors
    /// [`FrameError::Truncated`]; [`FrameError::BadLength`] if the length field is below 8.
    pub fn parse<T: AsRef<[u8]>>(packet: &Packet<T>) -> Result<Self, FrameError> {
        packet.check_len()?;
        // Read the fixed header once into an array: the accessors then need no bounds checks.
        let packet = &Packet::new_unchecked(array_at::<HEADER_LEN>(packet.buffer.as_ref(), 0));
        let len = usize::from(packet.len());
        if len < HEADER_LEN {
            return Err(FrameError::BadLength {
                layer: LAYER,
                offset: field::LENGTH.start,
                value: len,
            });
        }
        Ok(UdpRepr {
            src_port: packet.src_port(),
            dst_port: packet.dst_port(),
            payload_len: len - HEADER_LEN,
        })
    }

    /// Length of the header (8).
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes the header with checksum 0 (as rxe and Mellanox do). A payload length above
    /// 65527 is saturated (the RoCEv2 emitters refuse such payloads first).
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) {
        packet.set_src_port(self.src_port);
        packet.set_dst_port(self.dst_port);
        let len = self.payload_len.saturating_add(HEADER_LEN);
        packet.set_len(u16::try_from(len).unwrap_or(u16::MAX));
        packet.set_checksum(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HDR: [u8; 8] = [0xc0, 0x00, 0x12, 0xb7, 0x01, 0x20, 0x00, 0x00];

    fn repr() -> UdpRepr {
        UdpRepr {
            src_port: 49152,
            dst_port: 4791,
            payload_len: 280,
        }
    }

    #[test]
    fn deconstruct() {
        let p = Packet::new_checked(&HDR[..]).unwrap();
        assert_eq!(p.len(), 288);
        assert_eq!(p.checksum(), 0);
        assert!(p.payload().is_empty());
        assert_eq!(UdpRepr::parse(&p).unwrap(), repr());
    }

    #[test]
    fn construct() {
        let mut buf = [0xa5u8; 8];
        repr().emit(&mut Packet::new_unchecked(&mut buf[..]));
        assert_eq!(buf, HDR);
    }

    #[test]
    fn bad() {
        for n in 0..8 {
            assert!(UdpRepr::parse(&Packet::new_unchecked(&HDR[..n])).is_err());
        }
        let b = [0, 1, 0, 2, 0, 7, 0, 0];
        assert!(matches!(
            UdpRepr::parse(&Packet::new_unchecked(&b[..])),
            Err(FrameError::BadLength { value: 7, .. })
        ));
    }
}
