//! Base Transport Header, 12 bytes (IBTA Vol 1 §9.2; docs/framing.md §1.2), and opcodes.

use core::fmt;

use super::wire::{array_at, need, set_bits, set_u16, set_u24, set_u8, u16_at, u24_at, u8_at};
use super::FrameError;
use crate::types::{Pkey, Psn, Qpn, U2, U4};

/// Field offsets and masks.
pub mod field {
    use core::ops::Range;

    /// OpCode.
    pub const OPCODE: usize = 0;
    /// SE, M, PadCnt, TVer.
    pub const FLAGS: usize = 1;
    /// Solicited event bit in [`FLAGS`].
    pub const SE_MASK: u8 = 0x80;
    /// MigReq bit in [`FLAGS`].
    pub const MIG_MASK: u8 = 0x40;
    /// PadCnt bits in [`FLAGS`].
    pub const PAD_MASK: u8 = 0x30;
    /// TVer bits in [`FLAGS`].
    pub const TVER_MASK: u8 = 0x0f;
    /// P_Key.
    pub const PKEY: Range<usize> = 2..4;
    /// resv8a (IBA 1.2.1) / FECN, BECN, resv6a (later revisions). Masked in the ICRC.
    pub const RESV8A: usize = 4;
    /// FECN bit in [`RESV8A`].
    pub const FECN_MASK: u8 = 0x80;
    /// BECN bit in [`RESV8A`].
    pub const BECN_MASK: u8 = 0x40;
    /// Destination QP.
    pub const DEST_QP: Range<usize> = 5..8;
    /// AckReq bit (bit 7) and resv7.
    pub const ACK_REQ: usize = 8;
    /// AckReq bit in [`ACK_REQ`].
    pub const ACK_MASK: u8 = 0x80;
    /// Packet sequence number.
    pub const PSN: Range<usize> = 9..12;
}

/// Length of the header.
pub const HEADER_LEN: usize = field::PSN.end;

const LAYER: &str = "BTH";

/// A BTH opcode: 3-bit transport prefix + 5-bit operation. Any value is valid; the constants
/// name the ones this crate uses.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Opcode(pub u8);

/// The transport service of an opcode (its top three bits).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Transport {
    /// Reliable connection (0x00-0x1F).
    Rc,
    /// Unreliable connection (0x20-0x3F).
    Uc,
    /// Reliable datagram (0x40-0x5F; Wireshark 4.0 decodes these as Mellanox DC).
    Rd,
    /// Unreliable datagram (0x60-0x7F).
    Ud,
    /// Congestion notification (0x80-0x9F; RoCEv2 CNP is 0x81).
    Cnp,
    /// Extended reliable connection (0xA0-0xBF).
    Xrc,
    /// Manufacturer-specific (0xC0-0xFF).
    Vendor,
}

impl Opcode {
    /// UD SEND Only: what every MAD travels in.
    pub const UD_SEND_ONLY: Opcode = Opcode(0x64);
    /// UD SEND Only with Immediate (a 4-byte ImmDt follows the DETH).
    pub const UD_SEND_ONLY_IMM: Opcode = Opcode(0x65);
    /// XRC SEND Only (an XRCETH follows the BTH).
    pub const XRC_SEND_ONLY: Opcode = Opcode(0xa4);
    /// RoCEv2 congestion notification packet.
    pub const CNP: Opcode = Opcode(0x81);

    /// The transport service.
    pub const fn transport(self) -> Transport {
        match self.0 >> 5 {
            0 => Transport::Rc,
            1 => Transport::Uc,
            2 => Transport::Rd,
            3 => Transport::Ud,
            4 => Transport::Cnp,
            5 => Transport::Xrc,
            _ => Transport::Vendor,
        }
    }

    /// Whether a DETH follows the BTH (UD SEND Only, with or without immediate).
    pub const fn has_deth(self) -> bool {
        matches!(self.0, 0x64 | 0x65)
    }

    /// Length of the extension headers between the BTH and the payload (DETH, ImmDt, RETH,
    /// AETH, AtomicETH, AtomicAckETH, IETH, XRCETH), per IBTA Vol 1 Table 38.
    ///
    /// RD opcodes (which Wireshark decodes as Mellanox DC) and opcodes not listed there count
    /// as 0: the whole rest of the packet is payload.
    pub const fn ext_headers_len(self) -> usize {
        let op = self.0 & 0x1f;
        match self.transport() {
            Transport::Rc | Transport::Uc => rc_ext_len(op),
            Transport::Ud => match self.0 {
                0x64 => 8,
                0x65 => 12,
                _ => 0,
            },
            // XRCETH on requests; responses (READ response, ACK, atomic ACK) carry none.
            Transport::Xrc => match op {
                0x0d..=0x12 => rc_ext_len(op),
                _ => 4 + rc_ext_len(op),
            },
            Transport::Rd | Transport::Cnp | Transport::Vendor => 0,
        }
    }

    /// The opcode's name, e.g. "UD SEND Only" (or "unknown").
    pub const fn name(self) -> &'static str {
        let op = self.0 & 0x1f;
        match self.transport() {
            Transport::Rc | Transport::Uc | Transport::Xrc => match op {
                0x00 => "SEND First",
                0x01 => "SEND Middle",
                0x02 => "SEND Last",
                0x03 => "SEND Last with Immediate",
                0x04 => "SEND Only",
                0x05 => "SEND Only with Immediate",
                0x06 => "RDMA WRITE First",
                0x07 => "RDMA WRITE Middle",
                0x08 => "RDMA WRITE Last",
                0x09 => "RDMA WRITE Last with Immediate",
                0x0a => "RDMA WRITE Only",
                0x0b => "RDMA WRITE Only with Immediate",
                0x0c => "RDMA READ Request",
                0x0d => "RDMA READ Response First",
                0x0e => "RDMA READ Response Middle",
                0x0f => "RDMA READ Response Last",
                0x10 => "RDMA READ Response Only",
                0x11 => "Acknowledge",
                0x12 => "ATOMIC Acknowledge",
                0x13 => "CmpSwap",
                0x14 => "FetchAdd",
                0x16 => "SEND Last with Invalidate",
                0x17 => "SEND Only with Invalidate",
                _ => "unknown",
            },
            Transport::Ud => match self.0 {
                0x64 => "UD SEND Only",
                0x65 => "UD SEND Only with Immediate",
                _ => "unknown",
            },
            Transport::Cnp => match self.0 {
                0x81 => "CNP",
                _ => "unknown",
            },
            Transport::Rd | Transport::Vendor => "unknown",
        }
    }
}

/// Extension-header length of an RC/UC operation (low five opcode bits).
const fn rc_ext_len(op: u8) -> usize {
    match op {
        // ImmDt or IETH
        0x03 | 0x05 | 0x09 | 0x16 | 0x17 => 4,
        // RETH
        0x06 | 0x0a | 0x0c => 16,
        // RETH + ImmDt
        0x0b => 20,
        // AETH
        0x0d | 0x0f | 0x10 | 0x11 => 4,
        // AETH + AtomicAckETH
        0x12 => 12,
        // AtomicETH
        0x13 | 0x14 => 28,
        _ => 0,
    }
}

impl fmt::Debug for Opcode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Opcode({:#04x} {})", self.0, self.name())
    }
}

impl fmt::Display for Opcode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#04x}", self.0)
    }
}

view!(
    /// A view of a BTH (and the bytes after it).
);

impl<T: AsRef<[u8]>> Packet<T> {
    /// Checks that the buffer holds the 12-byte header.
    ///
    /// # Errors
    /// [`FrameError::Truncated`].
    pub fn check_len(&self) -> Result<(), FrameError> {
        need(LAYER, HEADER_LEN, self.buffer.as_ref().len())
    }

    fn flags(&self) -> u8 {
        u8_at(self.buffer.as_ref(), field::FLAGS)
    }

    /// OpCode.
    pub fn opcode(&self) -> Opcode {
        Opcode(u8_at(self.buffer.as_ref(), field::OPCODE))
    }

    /// Solicited event.
    pub fn solicited(&self) -> bool {
        self.flags() & field::SE_MASK != 0
    }

    /// MigReq.
    pub fn mig_req(&self) -> bool {
        self.flags() & field::MIG_MASK != 0
    }

    /// Pad count (bytes of padding before the ICRC).
    pub fn pad_count(&self) -> U2 {
        U2::masked((self.flags() & field::PAD_MASK) >> 4)
    }

    /// Transport header version.
    pub fn tver(&self) -> U4 {
        U4::masked(self.flags() & field::TVER_MASK)
    }

    /// P_Key.
    pub fn pkey(&self) -> Pkey {
        Pkey(u16_at(self.buffer.as_ref(), field::PKEY.start))
    }

    /// FECN.
    pub fn fecn(&self) -> bool {
        u8_at(self.buffer.as_ref(), field::RESV8A) & field::FECN_MASK != 0
    }

    /// BECN.
    pub fn becn(&self) -> bool {
        u8_at(self.buffer.as_ref(), field::RESV8A) & field::BECN_MASK != 0
    }

    /// Destination QP.
    pub fn dest_qp(&self) -> Qpn {
        Qpn::masked(u24_at(self.buffer.as_ref(), field::DEST_QP.start))
    }

    /// AckReq.
    pub fn ack_req(&self) -> bool {
        u8_at(self.buffer.as_ref(), field::ACK_REQ) & field::ACK_MASK != 0
    }

    /// PSN.
    pub fn psn(&self) -> Psn {
        Psn::masked(u24_at(self.buffer.as_ref(), field::PSN.start))
    }

    /// Everything after the BTH.
    pub fn payload(&self) -> &[u8] {
        self.buffer.as_ref().get(HEADER_LEN..).unwrap_or(&[])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets the opcode.
    pub fn set_opcode(&mut self, v: Opcode) {
        set_u8(self.buffer.as_mut(), field::OPCODE, v.0);
    }

    /// Sets SE, M, PadCnt and TVer.
    pub fn set_flags(&mut self, solicited: bool, mig_req: bool, pad_count: U2, tver: U4) {
        let mut v = (pad_count.get() << 4) | tver.get();
        if solicited {
            v |= field::SE_MASK;
        }
        if mig_req {
            v |= field::MIG_MASK;
        }
        set_u8(self.buffer.as_mut(), field::FLAGS, v);
    }

    /// Sets the pad count only.
    pub fn set_pad_count(&mut self, v: U2) {
        set_bits(
            self.buffer.as_mut(),
            field::FLAGS,
            field::PAD_MASK,
            v.get() << 4,
        );
    }

    /// Sets the P_Key.
    pub fn set_pkey(&mut self, v: Pkey) {
        set_u16(self.buffer.as_mut(), field::PKEY.start, v.0);
    }

    /// Sets FECN and BECN (the reserved bits of the byte are cleared).
    pub fn set_fecn_becn(&mut self, fecn: bool, becn: bool) {
        let mut v = 0;
        if fecn {
            v |= field::FECN_MASK;
        }
        if becn {
            v |= field::BECN_MASK;
        }
        set_u8(self.buffer.as_mut(), field::RESV8A, v);
    }

    /// Sets the destination QP.
    pub fn set_dest_qp(&mut self, v: Qpn) {
        set_u24(self.buffer.as_mut(), field::DEST_QP.start, v.get());
    }

    /// Sets AckReq (resv7 is cleared).
    pub fn set_ack_req(&mut self, v: bool) {
        set_u8(
            self.buffer.as_mut(),
            field::ACK_REQ,
            if v { field::ACK_MASK } else { 0 },
        );
    }

    /// Sets the PSN.
    pub fn set_psn(&mut self, v: Psn) {
        set_u24(self.buffer.as_mut(), field::PSN.start, v.get());
    }
}

/// A BTH. Reserved bits (resv6a, resv7) are ignored on parse and zeroed on emit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BthRepr {
    /// OpCode (0x64 for MADs).
    pub opcode: Opcode,
    /// Solicited event.
    pub solicited: bool,
    /// MigReq (rxe 0; Mellanox hardware sets it).
    pub mig_req: bool,
    /// Pad count: bytes of zero padding before the ICRC.
    pub pad_count: U2,
    /// Transport header version (0; rxe drops anything else).
    pub tver: U4,
    /// P_Key (0xFFFF default).
    pub pkey: Pkey,
    /// FECN.
    pub fecn: bool,
    /// BECN.
    pub becn: bool,
    /// Destination QP (1 = GSI for CM MADs).
    pub dest_qp: Qpn,
    /// AckReq.
    pub ack_req: bool,
    /// Packet sequence number.
    pub psn: Psn,
}

impl BthRepr {
    /// Parses the header.
    ///
    /// # Errors
    /// [`FrameError::Truncated`].
    pub fn parse<T: AsRef<[u8]>>(packet: &Packet<T>) -> Result<Self, FrameError> {
        packet.check_len()?;
        // Read the fixed header once into an array: the accessors then need no bounds checks.
        let packet = &Packet::new_unchecked(array_at::<HEADER_LEN>(packet.buffer.as_ref(), 0));
        Ok(BthRepr {
            opcode: packet.opcode(),
            solicited: packet.solicited(),
            mig_req: packet.mig_req(),
            pad_count: packet.pad_count(),
            tver: packet.tver(),
            pkey: packet.pkey(),
            fecn: packet.fecn(),
            becn: packet.becn(),
            dest_qp: packet.dest_qp(),
            ack_req: packet.ack_req(),
            psn: packet.psn(),
        })
    }

    /// Length of the header (12).
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes the header.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) {
        packet.set_opcode(self.opcode);
        packet.set_flags(self.solicited, self.mig_req, self.pad_count, self.tver);
        packet.set_pkey(self.pkey);
        packet.set_fecn_becn(self.fecn, self.becn);
        packet.set_dest_qp(self.dest_qp);
        packet.set_ack_req(self.ack_req);
        packet.set_psn(self.psn);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// BTH of the CM REQ in captures/real/rocev2_mlx_nvme-discover.pcap frame 5.
    const HDR: [u8; 12] = [
        0x64, 0x40, 0xff, 0xff, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x50,
    ];

    fn repr() -> BthRepr {
        BthRepr {
            opcode: Opcode::UD_SEND_ONLY,
            solicited: false,
            mig_req: true,
            pad_count: U2::masked(0),
            tver: U4::masked(0),
            pkey: Pkey::DEFAULT,
            fecn: false,
            becn: false,
            dest_qp: Qpn::masked(1),
            ack_req: false,
            psn: Psn::masked(0x50),
        }
    }

    #[test]
    fn deconstruct() {
        let p = Packet::new_checked(&HDR[..]).unwrap();
        assert_eq!(p.opcode().name(), "UD SEND Only");
        assert_eq!(BthRepr::parse(&p).unwrap(), repr());
    }

    #[test]
    fn construct() {
        let mut buf = [0xa5u8; 12];
        repr().emit(&mut Packet::new_unchecked(&mut buf[..]));
        assert_eq!(buf, HDR);
    }

    #[test]
    fn every_field() {
        let b = [
            0x0b, 0xb5, 0x80, 0x01, 0xff, 0xab, 0xcd, 0xef, 0xff, 0x12, 0x34, 0x56,
        ];
        let r = BthRepr::parse(&Packet::new_unchecked(&b[..])).unwrap();
        assert_eq!(r.opcode.ext_headers_len(), 20);
        assert!(r.solicited && !r.mig_req && r.fecn && r.becn && r.ack_req);
        assert_eq!((r.pad_count.get(), r.tver.get()), (3, 5));
        assert_eq!(
            (r.pkey.0, r.dest_qp.get(), r.psn.get()),
            (0x8001, 0xab_cdef, 0x12_3456)
        );
        let mut out = [0xa5u8; 12];
        r.emit(&mut Packet::new_unchecked(&mut out[..]));
        // resv6a and resv7 are zeroed on emit.
        assert_eq!(out[4], 0xc0);
        assert_eq!(out[8], 0x80);
        assert_eq!(BthRepr::parse(&Packet::new_unchecked(&out[..])).unwrap(), r);
    }

    #[test]
    fn truncated() {
        for n in 0..12 {
            assert!(BthRepr::parse(&Packet::new_unchecked(&HDR[..n])).is_err());
        }
    }

    #[test]
    fn opcodes() {
        assert_eq!(Opcode(0x65).ext_headers_len(), 12);
        assert_eq!(Opcode(0x11).ext_headers_len(), 4);
        assert_eq!(Opcode(0xa4).ext_headers_len(), 4);
        assert_eq!(Opcode(0xb1).ext_headers_len(), 4);
        assert_eq!(Opcode(0x4a).ext_headers_len(), 0);
        assert_eq!(Opcode::CNP.name(), "CNP");
        assert_eq!(Opcode(0x81).transport(), Transport::Cnp);
    }
}
