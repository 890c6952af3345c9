//! Local Route Header, 8 bytes (IBTA Vol 1 §7.7; docs/framing.md §1.7).

use super::wire::{array_at, need, set_u16, set_u8, u16_at, u8_at};
use super::FrameError;
use crate::types::{Lid, U4};

/// Field offsets and masks.
pub mod field {
    use core::ops::Range;

    /// VL (high nibble; masked in the ICRC) and LVer (low nibble).
    pub const VL_LVER: usize = 0;
    /// SL (high nibble), reserved (2 bits), LNH (low 2 bits).
    pub const SL_LNH: usize = 1;
    /// DLID.
    pub const DLID: Range<usize> = 2..4;
    /// Reserved (5 bits) and PktLen (11 bits, 4-byte words, LRH..ICRC).
    pub const PKT_LEN: Range<usize> = 4..6;
    /// Mask of PktLen in [`PKT_LEN`].
    pub const PKT_LEN_MASK: u16 = 0x07ff;
    /// SLID.
    pub const SLID: Range<usize> = 6..8;
}

/// Length of the header.
pub const HEADER_LEN: usize = field::SLID.end;

const LAYER: &str = "LRH";

/// Link Next Header: what follows the LRH.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Lnh {
    /// 0: raw packet (raw header / RWH).
    Raw,
    /// 1: IPv6 non-IBA packet.
    Ipv6,
    /// 2: IBA local: BTH follows.
    IbaLocal,
    /// 3: IBA global: GRH follows.
    IbaGlobal,
}

impl Lnh {
    /// From the 2-bit field.
    pub const fn from_bits(v: u8) -> Self {
        match v & 0x3 {
            0 => Lnh::Raw,
            1 => Lnh::Ipv6,
            2 => Lnh::IbaLocal,
            _ => Lnh::IbaGlobal,
        }
    }

    /// The 2-bit field.
    pub const fn bits(self) -> u8 {
        match self {
            Lnh::Raw => 0,
            Lnh::Ipv6 => 1,
            Lnh::IbaLocal => 2,
            Lnh::IbaGlobal => 3,
        }
    }
}

view!(
    /// A view of an LRH (and the bytes after it).
);

impl<T: AsRef<[u8]>> Packet<T> {
    /// Checks that the buffer holds the 8-byte header.
    ///
    /// # Errors
    /// [`FrameError::Truncated`].
    pub fn check_len(&self) -> Result<(), FrameError> {
        need(LAYER, HEADER_LEN, self.buffer.as_ref().len())
    }

    /// Virtual lane (15 = management, SMPs).
    pub fn vl(&self) -> U4 {
        U4::masked(u8_at(self.buffer.as_ref(), field::VL_LVER) >> 4)
    }

    /// Link version.
    pub fn lver(&self) -> U4 {
        U4::masked(u8_at(self.buffer.as_ref(), field::VL_LVER))
    }

    /// Service level.
    pub fn sl(&self) -> U4 {
        U4::masked(u8_at(self.buffer.as_ref(), field::SL_LNH) >> 4)
    }

    /// Link next header.
    pub fn lnh(&self) -> Lnh {
        Lnh::from_bits(u8_at(self.buffer.as_ref(), field::SL_LNH))
    }

    /// Destination LID.
    pub fn dlid(&self) -> Lid {
        Lid(u16_at(self.buffer.as_ref(), field::DLID.start))
    }

    /// Packet length in 4-byte words (LRH up to and including the ICRC; VCRC excluded).
    pub fn pkt_len(&self) -> u16 {
        u16_at(self.buffer.as_ref(), field::PKT_LEN.start) & field::PKT_LEN_MASK
    }

    /// Source LID.
    pub fn slid(&self) -> Lid {
        Lid(u16_at(self.buffer.as_ref(), field::SLID.start))
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets VL and LVer.
    pub fn set_vl_lver(&mut self, vl: U4, lver: U4) {
        set_u8(
            self.buffer.as_mut(),
            field::VL_LVER,
            (vl.get() << 4) | lver.get(),
        );
    }

    /// Sets SL and LNH (the reserved bits are cleared).
    pub fn set_sl_lnh(&mut self, sl: U4, lnh: Lnh) {
        set_u8(
            self.buffer.as_mut(),
            field::SL_LNH,
            (sl.get() << 4) | lnh.bits(),
        );
    }

    /// Sets the DLID.
    pub fn set_dlid(&mut self, v: Lid) {
        set_u16(self.buffer.as_mut(), field::DLID.start, v.0);
    }

    /// Sets PktLen (words; masked to 11 bits, reserved bits cleared).
    pub fn set_pkt_len(&mut self, words: u16) {
        set_u16(
            self.buffer.as_mut(),
            field::PKT_LEN.start,
            words & field::PKT_LEN_MASK,
        );
    }

    /// Sets the SLID.
    pub fn set_slid(&mut self, v: Lid) {
        set_u16(self.buffer.as_mut(), field::SLID.start, v.0);
    }
}

/// An LRH. Reserved bits are ignored on parse and zeroed on emit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LrhRepr {
    /// Virtual lane.
    pub vl: U4,
    /// Link version (0).
    pub lver: U4,
    /// Service level.
    pub sl: U4,
    /// Link next header.
    pub lnh: Lnh,
    /// Destination LID.
    pub dlid: Lid,
    /// Packet length in 4-byte words, LRH..ICRC (11 bits).
    pub pkt_len: u16,
    /// Source LID.
    pub slid: Lid,
}

impl LrhRepr {
    /// Parses the header.
    ///
    /// # Errors
    /// [`FrameError::Truncated`].
    pub fn parse<T: AsRef<[u8]>>(packet: &Packet<T>) -> Result<Self, FrameError> {
        packet.check_len()?;
        // Read the fixed header once into an array: the accessors then need no bounds checks.
        let packet = &Packet::new_unchecked(array_at::<HEADER_LEN>(packet.buffer.as_ref(), 0));
        Ok(LrhRepr {
            vl: packet.vl(),
            lver: packet.lver(),
            sl: packet.sl(),
            lnh: packet.lnh(),
            dlid: packet.dlid(),
            pkt_len: packet.pkt_len(),
            slid: packet.slid(),
        })
    }

    /// The packet length in bytes (PktLen × 4): LRH up to and including the ICRC.
    pub const fn packet_bytes(&self) -> usize {
        self.pkt_len as usize * 4
    }

    /// Length of the header (8).
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes the header.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) {
        packet.set_vl_lver(self.vl, self.lver);
        packet.set_sl_lnh(self.sl, self.lnh);
        packet.set_dlid(self.dlid);
        packet.set_pkt_len(self.pkt_len);
        packet.set_slid(self.slid);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// LRH of captures/real/ib_erf_infiniband.pcap frame 7 (vector 4).
    const HDR: [u8; 8] = [0x00, 0x02, 0x00, 0x01, 0x00, 0x48, 0x00, 0x04];

    #[test]
    fn deconstruct_construct() {
        let p = Packet::new_checked(&HDR[..]).unwrap();
        let r = LrhRepr::parse(&p).unwrap();
        assert_eq!(r.lnh, Lnh::IbaLocal);
        assert_eq!((r.dlid.0, r.slid.0, r.pkt_len), (1, 4, 72));
        assert_eq!(r.packet_bytes(), 288);
        let mut buf = [0xa5u8; 8];
        r.emit(&mut Packet::new_unchecked(&mut buf[..]));
        assert_eq!(buf, HDR);
        let b = [0xf3, 0x53, 0xff, 0xff, 0xf8, 0x2b, 0x00, 0x05];
        let r = LrhRepr::parse(&Packet::new_unchecked(&b[..])).unwrap();
        assert_eq!((r.vl.get(), r.lver.get(), r.sl.get()), (15, 3, 5));
        assert_eq!((r.lnh, r.pkt_len), (Lnh::IbaGlobal, 0x2b));
        for n in 0..8 {
            assert!(LrhRepr::parse(&Packet::new_unchecked(&HDR[..n])).is_err());
        }
    }
}
