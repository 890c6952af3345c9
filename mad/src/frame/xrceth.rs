//! XRC Extended Transport Header, 4 bytes (IBTA Vol 1 §9.3.7 (XRC annex); docs/framing.md
//! §1.3): the SRQ an XRC request is received into, right after the BTH of every XRC request
//! opcode (0xA0–0xBF but the responses).

use super::wire::{array_at, need, set_u24, set_u8, u24_at};
use super::FrameError;
use crate::xrc::SrqNum;

/// Field offsets.
pub mod field {
    use core::ops::Range;

    /// Reserved byte.
    pub const RESERVED: usize = 0;
    /// XRC SRQ number.
    pub const XRC_SRQ: Range<usize> = 1..4;
}

/// Length of the header.
pub const HEADER_LEN: usize = field::XRC_SRQ.end;

const LAYER: &str = "XRCETH";

view!(
    /// A view of an XRCETH.
);

impl<T: AsRef<[u8]>> Packet<T> {
    /// Checks that the buffer holds the 4-byte header.
    ///
    /// # Errors
    /// [`FrameError::Truncated`].
    pub fn check_len(&self) -> Result<(), FrameError> {
        need(LAYER, HEADER_LEN, self.buffer.as_ref().len())
    }

    /// The XRC SRQ number.
    pub fn xrc_srq(&self) -> SrqNum {
        SrqNum::masked(u24_at(self.buffer.as_ref(), field::XRC_SRQ.start))
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets the XRC SRQ number (and clears the reserved byte).
    pub fn set_xrc_srq(&mut self, v: SrqNum) {
        set_u8(self.buffer.as_mut(), field::RESERVED, 0);
        set_u24(self.buffer.as_mut(), field::XRC_SRQ.start, v.get());
    }
}

/// An XRCETH. The reserved byte is ignored on parse and zeroed on emit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct XrcethRepr {
    /// The SRQ the request is received into.
    pub srqn: SrqNum,
}

impl XrcethRepr {
    /// Parses the header.
    ///
    /// # Errors
    /// [`FrameError::Truncated`].
    pub fn parse<T: AsRef<[u8]>>(packet: &Packet<T>) -> Result<Self, FrameError> {
        packet.check_len()?;
        let packet = &Packet::new_unchecked(array_at::<HEADER_LEN>(packet.buffer.as_ref(), 0));
        Ok(XrcethRepr {
            srqn: packet.xrc_srq(),
        })
    }

    /// Length of the header (4).
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes the header.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) {
        packet.set_xrc_srq(self.srqn);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HDR: [u8; 4] = [0x00, 0x12, 0x34, 0x56];

    #[test]
    fn deconstruct() {
        let p = Packet::new_checked(&HDR[..]).unwrap();
        assert_eq!(XrcethRepr::parse(&p).unwrap().srqn.get(), 0x12_3456);
        // the reserved byte is ignored
        let p = Packet::new_checked(&[0xff, 0x12, 0x34, 0x56][..]).unwrap();
        assert_eq!(XrcethRepr::parse(&p).unwrap().srqn.get(), 0x12_3456);
        for n in 0..4 {
            assert!(XrcethRepr::parse(&Packet::new_unchecked(&HDR[..n])).is_err());
        }
    }

    #[test]
    fn construct() {
        let mut buf = [0xa5u8; 4];
        XrcethRepr {
            srqn: SrqNum::masked(0x12_3456),
        }
        .emit(&mut Packet::new_unchecked(&mut buf[..]));
        assert_eq!(buf, HDR);
    }
}
