//! Datagram Extended Transport Header, 8 bytes (IBTA Vol 1 §9.3.3; docs/framing.md §1.3).

use super::wire::{array_at, need, set_u24, set_u32, set_u8, u24_at, u32_at};
use super::FrameError;
use crate::types::{Qkey, Qpn};

/// Field offsets.
pub mod field {
    use core::ops::Range;

    /// Q_Key (0x8001_0000 for QP1).
    pub const QKEY: Range<usize> = 0..4;
    /// Reserved byte.
    pub const RESERVED: usize = 4;
    /// Source QP.
    pub const SRC_QP: Range<usize> = 5..8;
}

/// Length of the header.
pub const HEADER_LEN: usize = field::SRC_QP.end;

const LAYER: &str = "DETH";

view!(
    /// A view of a DETH.
);

impl<T: AsRef<[u8]>> Packet<T> {
    /// Checks that the buffer holds the 8-byte header.
    ///
    /// # Errors
    /// [`FrameError::Truncated`].
    pub fn check_len(&self) -> Result<(), FrameError> {
        need(LAYER, HEADER_LEN, self.buffer.as_ref().len())
    }

    /// Q_Key.
    pub fn qkey(&self) -> Qkey {
        Qkey(u32_at(self.buffer.as_ref(), field::QKEY.start))
    }

    /// Source QP.
    pub fn src_qp(&self) -> Qpn {
        Qpn::masked(u24_at(self.buffer.as_ref(), field::SRC_QP.start))
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets the Q_Key.
    pub fn set_qkey(&mut self, v: Qkey) {
        set_u32(self.buffer.as_mut(), field::QKEY.start, v.0);
    }

    /// Sets the source QP (and clears the reserved byte).
    pub fn set_src_qp(&mut self, v: Qpn) {
        set_u8(self.buffer.as_mut(), field::RESERVED, 0);
        set_u24(self.buffer.as_mut(), field::SRC_QP.start, v.get());
    }
}

/// A DETH. The reserved byte is ignored on parse and zeroed on emit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DethRepr {
    /// Q_Key.
    pub qkey: Qkey,
    /// Source QP.
    pub src_qp: Qpn,
}

impl DethRepr {
    /// The DETH of a GSI (QP1) MAD: Q_Key 0x8001_0000, source QP 1.
    pub const GSI: DethRepr = DethRepr {
        qkey: Qkey::GSI,
        src_qp: Qpn::masked(1),
    };

    /// Parses the header.
    ///
    /// # Errors
    /// [`FrameError::Truncated`].
    pub fn parse<T: AsRef<[u8]>>(packet: &Packet<T>) -> Result<Self, FrameError> {
        packet.check_len()?;
        // Read the fixed header once into an array: the accessors then need no bounds checks.
        let packet = &Packet::new_unchecked(array_at::<HEADER_LEN>(packet.buffer.as_ref(), 0));
        Ok(DethRepr {
            qkey: packet.qkey(),
            src_qp: packet.src_qp(),
        })
    }

    /// Length of the header (8).
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes the header.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) {
        packet.set_qkey(self.qkey);
        packet.set_src_qp(self.src_qp);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HDR: [u8; 8] = [0x80, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01];

    #[test]
    fn deconstruct() {
        let p = Packet::new_checked(&HDR[..]).unwrap();
        assert_eq!(DethRepr::parse(&p).unwrap(), DethRepr::GSI);
        for n in 0..8 {
            assert!(DethRepr::parse(&Packet::new_unchecked(&HDR[..n])).is_err());
        }
    }

    #[test]
    fn construct() {
        let mut buf = [0xa5u8; 8];
        DethRepr::GSI.emit(&mut Packet::new_unchecked(&mut buf[..]));
        assert_eq!(buf, HDR);
    }
}
