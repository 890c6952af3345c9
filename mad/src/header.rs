//! The 24-byte MAD common header (docs/wire.md §1; IBTA Vol 1 §13.4.2).
//!
//! | Off | Size | Field |
//! |----:|-----:|-------|
//! | 0 | 1 | BaseVersion (1) |
//! | 1 | 1 | MgmtClass (0x07 for CM) |
//! | 2 | 1 | ClassVersion (2 for CM) |
//! | 3 | 1 | R bit (0x80) + Method |
//! | 4 | 2 | Status |
//! | 6 | 2 | ClassSpecific |
//! | 8 | 8 | TransactionID |
//! | 16 | 2 | AttributeID |
//! | 18 | 2 | reserved |
//! | 20 | 4 | AttributeModifier (ECE in REQ/REP/SIDR_REP on Linux ≥ 5.8) |

use bytes::BufMut;

use crate::cm::wire::Rd;
use crate::codes::{AttrId, Method, MgmtClass};
use crate::error::ParseError;
use crate::types::Tid;

/// MAD base version (`IB_MGMT_BASE_VERSION`).
pub const BASE_VERSION: u8 = 1;
/// CM class version (`IB_CM_CLASS_VERSION`, "IB spec 1.2").
pub const CM_CLASS_VERSION: u8 = 2;

/// The MAD common header.
///
/// Parsing the header alone ([`MadHeader::parse`]) accepts any management class, so that
/// capture tools can name non-CM MADs; [`crate::Mad::parse`] adds the CM checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MadHeader {
    /// Off 0: BaseVersion; 1 for every MAD this crate accepts.
    pub base_version: u8,
    /// Off 1: management class.
    pub mgmt_class: MgmtClass,
    /// Off 2: class version (2 for CM).
    pub class_version: u8,
    /// Off 3: method including the response bit 0x80.
    pub method: Method,
    /// Off 4: status.
    pub status: u16,
    /// Off 6: class-specific field.
    pub class_specific: u16,
    /// Off 8: transaction ID.
    pub tid: Tid,
    /// Off 16: attribute ID.
    pub attr_id: AttrId,
    /// Off 20: attribute modifier.
    pub attr_mod: u32,
}

impl MadHeader {
    /// Size on the wire.
    pub const LEN: usize = 24;

    /// A CM header: base version 1, class 0x07, class version 2, method Send, status 0.
    pub const fn cm(tid: Tid, attr_id: AttrId) -> Self {
        MadHeader {
            base_version: BASE_VERSION,
            mgmt_class: MgmtClass::Cm,
            class_version: CM_CLASS_VERSION,
            method: Method::Send,
            status: 0,
            class_specific: 0,
            tid,
            attr_id,
            attr_mod: 0,
        }
    }

    /// The attribute ID of a MAD (bytes 16..18) without parsing the rest of its header; `None`
    /// when fewer than 18 bytes are given. For the quick looks a driver takes at a received
    /// MAD before the endpoint parses it (which kind, to prefetch or to queue it).
    pub fn peek_attr_id(bytes: &[u8]) -> Option<AttrId> {
        let b = bytes.get(16..18)?.first_chunk::<2>()?;
        Some(AttrId::from_raw(u16::from_be_bytes(*b)))
    }

    /// Parses the common header of any MAD class.
    ///
    /// # Errors
    /// [`ParseError::Truncated`] if fewer than 24 bytes are given, and
    /// [`ParseError::BadBaseVersion`] if BaseVersion is not 1.
    pub fn parse(bytes: &[u8]) -> Result<Self, ParseError> {
        let hdr = bytes
            .first_chunk::<{ Self::LEN }>()
            .ok_or(ParseError::Truncated {
                offset: 0,
                need: Self::LEN,
                have: bytes.len(),
            })?;
        let hdr = Self::parse_fixed(hdr);
        if hdr.base_version != BASE_VERSION {
            return Err(ParseError::BadBaseVersion {
                offset: 0,
                value: hdr.base_version,
            });
        }
        Ok(hdr)
    }

    /// Decodes the 24 bytes without validation.
    #[inline(always)]
    pub fn parse_fixed(bytes: &[u8; Self::LEN]) -> Self {
        let mut r = Rd::new(bytes);
        // The common case, a CM Send (01 07 02 03), skips the code lookups.
        let lead = r.u32();
        if lead == 0x0107_0203 {
            let status = r.u16();
            let class_specific = r.u16();
            let tid = r.u64();
            let attr_id = r.u16();
            r.skip(2);
            let attr_mod = r.u32();
            return MadHeader {
                status,
                class_specific,
                attr_mod,
                attr_id: AttrId::from_raw(attr_id),
                ..MadHeader::cm(Tid(tid), AttrId::Unknown(0))
            };
        }
        let [base_version, mgmt_class, class_version, method] = lead.to_be_bytes();
        let status = r.u16();
        let class_specific = r.u16();
        let tid = r.u64();
        let attr_id = r.u16();
        r.skip(2);
        let attr_mod = r.u32();
        MadHeader {
            base_version,
            mgmt_class: MgmtClass::from_raw_lut(mgmt_class),
            class_version,
            method: Method::from_raw_lut(method),
            status,
            class_specific,
            tid: Tid(tid),
            attr_id: AttrId::from_raw(attr_id),
            attr_mod,
        }
    }

    /// Writes the 24 bytes (the reserved field as zero).
    pub fn emit<B: BufMut>(&self, buf: &mut B) {
        buf.put_u8(self.base_version);
        buf.put_u8(self.mgmt_class.raw());
        buf.put_u8(self.class_version);
        buf.put_u8(self.method.raw());
        buf.put_u16(self.status);
        buf.put_u16(self.class_specific);
        buf.put_u64(self.tid.0);
        buf.put_u16(self.attr_id.raw());
        buf.put_u16(0);
        buf.put_u32(self.attr_mod);
    }

    /// Whether the method has the response bit (0x80) set.
    pub const fn is_response(&self) -> bool {
        self.method.raw() & 0x80 != 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // MAD header of the REQ in rocev2_mlx_nvme-discover.pcap frame 5.
    #[rustfmt::skip]
    const REQ_HDR: [u8; 24] = [
        0x01, 0x07, 0x02, 0x03, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x02, 0xe5, 0xbd, 0xb0, 0x3e,
        0x00, 0x10, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    ];

    #[test]
    fn deconstruct() {
        let h = MadHeader::parse(&REQ_HDR).unwrap();
        assert_eq!(h.base_version, 1);
        assert_eq!(h.mgmt_class, MgmtClass::Cm);
        assert_eq!(h.class_version, 2);
        assert_eq!(h.method, Method::Send);
        assert_eq!(h.tid, Tid(0x0000_0002_e5bd_b03e));
        assert_eq!(h.attr_id, AttrId::Req);
        assert_eq!(h.attr_mod, 0);
        assert!(!h.is_response());
    }

    #[test]
    fn peek_attr_id_agrees_with_parse() {
        assert_eq!(MadHeader::peek_attr_id(&REQ_HDR), Some(AttrId::Req));
        assert_eq!(
            MadHeader::peek_attr_id(&REQ_HDR),
            Some(MadHeader::parse(&REQ_HDR).unwrap().attr_id)
        );
        assert_eq!(MadHeader::peek_attr_id(&REQ_HDR[..17]), None);
    }

    #[test]
    fn construct() {
        let h = MadHeader::cm(Tid(0x0000_0002_e5bd_b03e), AttrId::Req);
        let mut buf = [0xa5u8; 24];
        h.emit(&mut &mut buf[..]);
        assert_eq!(buf, REQ_HDR);
    }

    #[test]
    fn reserved_ignored() {
        let mut b = REQ_HDR;
        b[18] = 0xff;
        b[19] = 0xff;
        let h = MadHeader::parse(&b).unwrap();
        let mut out = [0u8; 24];
        h.emit(&mut &mut out[..]);
        assert_eq!(out, REQ_HDR);
    }

    #[test]
    fn truncation_and_version() {
        for n in 0..24 {
            assert!(matches!(
                MadHeader::parse(&REQ_HDR[..n]),
                Err(ParseError::Truncated { .. })
            ));
        }
        let mut b = REQ_HDR;
        b[0] = 2;
        assert_eq!(
            MadHeader::parse(&b),
            Err(ParseError::BadBaseVersion {
                offset: 0,
                value: 2
            })
        );
    }
}
