//! Global Route Header, 40 bytes (IBTA Vol 1 §8.3; docs/framing.md §1.7). Used by RoCEv1
//! (after ethertype 0x8915) and by native IB packets with LNH = 3.

use super::wire::{array_at, need, set_bytes, set_u16, set_u32, set_u8, u16_at, u32_at, u8_at};
use super::FrameError;
use crate::types::{FlowLabel, Gid};

/// Field offsets.
pub mod field {
    use core::ops::Range;

    /// IPVer (4 bits, = 6), TClass (8), FlowLabel (20). TClass and FlowLabel are masked in
    /// the ICRC.
    pub const VER_TC_FLOW: Range<usize> = 0..4;
    /// PayLen: bytes after the GRH up to and including the ICRC.
    pub const PAYLOAD_LEN: Range<usize> = 4..6;
    /// NxtHdr (0x1B = IBA transport).
    pub const NEXT_HEADER: usize = 6;
    /// HopLmt. Masked in the ICRC.
    pub const HOP_LIMIT: usize = 7;
    /// Source GID.
    pub const SGID: Range<usize> = 8..24;
    /// Destination GID.
    pub const DGID: Range<usize> = 24..40;
}

/// Length of the header.
pub const HEADER_LEN: usize = field::DGID.end;

/// NxtHdr value for an IBA transport header (BTH) after the GRH.
pub const NEXT_HEADER_IBA: u8 = 0x1b;

const LAYER: &str = "GRH";

view!(
    /// A view of a GRH (and the bytes after it).
);

impl<T: AsRef<[u8]>> Packet<T> {
    /// Checks that the buffer holds the 40-byte header.
    ///
    /// # Errors
    /// [`FrameError::Truncated`].
    pub fn check_len(&self) -> Result<(), FrameError> {
        need(LAYER, HEADER_LEN, self.buffer.as_ref().len())
    }

    fn word0(&self) -> u32 {
        u32_at(self.buffer.as_ref(), field::VER_TC_FLOW.start)
    }

    /// IPVer (6).
    pub fn ip_version(&self) -> u8 {
        u8_at(self.buffer.as_ref(), 0) >> 4
    }

    /// TClass.
    pub fn traffic_class(&self) -> u8 {
        ((self.word0() >> 20) & 0xff) as u8
    }

    /// FlowLabel.
    pub fn flow_label(&self) -> FlowLabel {
        FlowLabel::masked(self.word0())
    }

    /// PayLen.
    pub fn payload_len(&self) -> u16 {
        u16_at(self.buffer.as_ref(), field::PAYLOAD_LEN.start)
    }

    /// NxtHdr.
    pub fn next_header(&self) -> u8 {
        u8_at(self.buffer.as_ref(), field::NEXT_HEADER)
    }

    /// HopLmt.
    pub fn hop_limit(&self) -> u8 {
        u8_at(self.buffer.as_ref(), field::HOP_LIMIT)
    }

    /// SGID.
    pub fn sgid(&self) -> Gid {
        Gid(array_at(self.buffer.as_ref(), field::SGID.start))
    }

    /// DGID.
    pub fn dgid(&self) -> Gid {
        Gid(array_at(self.buffer.as_ref(), field::DGID.start))
    }

    /// The PayLen's worth of bytes after the header, clipped to the buffer.
    pub fn payload(&self) -> &[u8] {
        let buf = self.buffer.as_ref();
        let end = (HEADER_LEN + usize::from(self.payload_len())).min(buf.len());
        buf.get(HEADER_LEN..end).unwrap_or(&[])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets IPVer 6, TClass and FlowLabel.
    pub fn set_version_tc_flow(&mut self, traffic_class: u8, flow_label: FlowLabel) {
        let w = (6u32 << 28) | (u32::from(traffic_class) << 20) | flow_label.get();
        set_u32(self.buffer.as_mut(), field::VER_TC_FLOW.start, w);
    }

    /// Sets PayLen.
    pub fn set_payload_len(&mut self, v: u16) {
        set_u16(self.buffer.as_mut(), field::PAYLOAD_LEN.start, v);
    }

    /// Sets NxtHdr.
    pub fn set_next_header(&mut self, v: u8) {
        set_u8(self.buffer.as_mut(), field::NEXT_HEADER, v);
    }

    /// Sets HopLmt.
    pub fn set_hop_limit(&mut self, v: u8) {
        set_u8(self.buffer.as_mut(), field::HOP_LIMIT, v);
    }

    /// Sets the SGID.
    pub fn set_sgid(&mut self, v: Gid) {
        set_bytes(self.buffer.as_mut(), field::SGID.start, &v.0);
    }

    /// Sets the DGID.
    pub fn set_dgid(&mut self, v: Gid) {
        set_bytes(self.buffer.as_mut(), field::DGID.start, &v.0);
    }
}

/// A GRH (IPVer is always 6: anything else fails to parse).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GrhRepr {
    /// TClass.
    pub traffic_class: u8,
    /// FlowLabel.
    pub flow_label: FlowLabel,
    /// PayLen: bytes after the GRH up to and including the ICRC.
    pub payload_len: u16,
    /// NxtHdr (0x1B for IBA).
    pub next_header: u8,
    /// HopLmt.
    pub hop_limit: u8,
    /// Source GID.
    pub sgid: Gid,
    /// Destination GID.
    pub dgid: Gid,
}

impl GrhRepr {
    /// Parses the header.
    ///
    /// # Errors
    /// [`FrameError::Truncated`]; [`FrameError::BadVersion`] if IPVer is not 6.
    pub fn parse<T: AsRef<[u8]>>(packet: &Packet<T>) -> Result<Self, FrameError> {
        packet.check_len()?;
        // Read the fixed header once into an array: the accessors then need no bounds checks.
        let packet = &Packet::new_unchecked(array_at::<HEADER_LEN>(packet.buffer.as_ref(), 0));
        if packet.ip_version() != 6 {
            return Err(FrameError::BadVersion {
                layer: LAYER,
                offset: 0,
                value: packet.ip_version(),
            });
        }
        Ok(GrhRepr {
            traffic_class: packet.traffic_class(),
            flow_label: packet.flow_label(),
            payload_len: packet.payload_len(),
            next_header: packet.next_header(),
            hop_limit: packet.hop_limit(),
            sgid: packet.sgid(),
            dgid: packet.dgid(),
        })
    }

    /// Length of the header (40).
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes the header.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) {
        packet.set_version_tc_flow(self.traffic_class, self.flow_label);
        packet.set_payload_len(self.payload_len);
        packet.set_next_header(self.next_header);
        packet.set_hop_limit(self.hop_limit);
        packet.set_sgid(self.sgid);
        packet.set_dgid(self.dgid);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// GRH of captures/real/rocev1_and_v2_mixed.pcap frame 1 (vector 6), GIDs shortened.
    #[rustfmt::skip]
    const HDR: [u8; 40] = [
        0x60, 0x20, 0x00, 0x00, 0x04, 0x10, 0x1b, 0x40,
        0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, 1,
        0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, 2,
    ];

    #[test]
    fn deconstruct_construct() {
        let p = Packet::new_checked(&HDR[..]).unwrap();
        let r = GrhRepr::parse(&p).unwrap();
        assert_eq!(r.traffic_class, 0x02);
        assert_eq!(r.flow_label.get(), 0);
        assert_eq!(r.payload_len, 0x410);
        assert_eq!(r.next_header, NEXT_HEADER_IBA);
        assert_eq!(r.hop_limit, 0x40);
        assert_eq!(r.sgid.to_string(), "::ffff:10.0.0.1");
        let mut buf = [0xa5u8; 40];
        r.emit(&mut Packet::new_unchecked(&mut buf[..]));
        assert_eq!(buf, HDR);
        for n in 0..40 {
            assert!(GrhRepr::parse(&Packet::new_unchecked(&HDR[..n])).is_err());
        }
        let mut b = HDR;
        b[0] = 0x40;
        assert!(matches!(
            GrhRepr::parse(&Packet::new_unchecked(&b[..])),
            Err(FrameError::BadVersion { value: 4, .. })
        ));
    }
}
