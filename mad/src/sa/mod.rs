//! Subnet Administration (management class 0x03, class version 2) on the wire: the SA MAD
//! with its RMPP and SA headers, and the PathRecord attribute (IBTA Vol 1 §13.6 for RMPP,
//! §15.2 for the SA MAD format, §15.2.5.16 for PathRecord).
//!
//! | Off | Size | Field |
//! |----:|-----:|-------|
//! | 0 | 24 | MAD common header ([`MadHeader`]; class 0x03, class version 2) |
//! | 24 | 1 | RMPPVersion (1 when RMPP is used, else 0) |
//! | 25 | 1 | RMPPType (1 DATA, 2 ACK, 3 STOP, 4 ABORT) |
//! | 26 | 1 | RRespTime (bits 7–3) and RMPPFlags (bits 2–0: Active, First, Last) |
//! | 27 | 1 | RMPPStatus |
//! | 28 | 4 | Data1 (SegmentNumber of a DATA or ACK packet) |
//! | 32 | 4 | Data2 (PayloadLength of a DATA packet, NewWindowLast of an ACK) |
//! | 36 | 8 | SM_Key |
//! | 44 | 2 | AttributeOffset (in 8-byte words: the spacing of records in a table answer) |
//! | 46 | 2 | reserved |
//! | 48 | 8 | ComponentMask |
//! | 56 | 200 | SA data (one attribute, or several records at AttributeOffset spacing) |
//!
//! The kernel packs the same layout from `struct ib_sa_mad` (`include/rdma/ib_sa.h`) and
//! `struct ib_rmpp_hdr` (`include/rdma/ib_mad.h`); OpenSM's is `ib_sa_mad_t`
//! (`include/iba/ib_types.h`).
//!
//! Like the CM messages, parsing never panics: the SA header needs 56 bytes and is otherwise
//! total; the data is copied as it came (shorter input is zero-padded, and the length seen is
//! kept in [`SaMad::data_len`]).

pub mod path;

pub use path::{comp, PathRecord, Selector};

use bytes::BufMut;

use crate::cm::wire::Rd;
use crate::codes::{AttrId, Method, MgmtClass};
use crate::error::ParseError;
use crate::header::{MadHeader, BASE_VERSION};
use crate::types::Tid;

/// SA class version (`IB_SA_CLASS_VERSION`).
pub const SA_CLASS_VERSION: u8 = 2;
/// Bytes of a MAD before the SA data: common header, RMPP header and SA header
/// (`IB_MGMT_SA_HDR`).
pub const SA_HDR_LEN: usize = 56;
/// Bytes of SA data in one MAD (`IB_MGMT_SA_DATA`).
pub const SA_DATA_LEN: usize = 200;
/// Bytes of one MAD.
pub const SA_MAD_LEN: usize = SA_HDR_LEN + SA_DATA_LEN;
/// Bytes an RMPP DATA packet counts in PayloadLength per segment: the SA header's 20 bytes
/// plus the SA data (`IB_MGMT_RMPP_DATA`, 220).
pub const RMPP_SEG_PAYLOAD: usize = 20 + SA_DATA_LEN;

/// Offsets of the RMPP and SA header fields from the start of the MAD.
pub mod off {
    /// RMPPVersion.
    pub const RMPP_VERSION: usize = 24;
    /// RMPPType.
    pub const RMPP_TYPE: usize = 25;
    /// RRespTime (bits 7–3) and RMPPFlags (bits 2–0).
    pub const RMPP_FLAGS: usize = 26;
    /// RMPPStatus.
    pub const RMPP_STATUS: usize = 27;
    /// Data1: SegmentNumber.
    pub const RMPP_DATA1: usize = 28;
    /// Data2: PayloadLength or NewWindowLast.
    pub const RMPP_DATA2: usize = 32;
    /// SM_Key.
    pub const SM_KEY: usize = 36;
    /// AttributeOffset.
    pub const ATTR_OFFSET: usize = 44;
    /// ComponentMask.
    pub const COMP_MASK: usize = 48;
    /// First byte of the SA data.
    pub const DATA: usize = 56;
}

/// SA attribute IDs (IBTA Vol 1 Table 201) this module knows.
pub mod attr {
    use crate::codes::AttrId;
    /// ClassPortInfo.
    pub const CLASS_PORT_INFO: AttrId = AttrId::from_raw(0x0001);
    /// NodeRecord.
    pub const NODE_RECORD: AttrId = AttrId::from_raw(0x0011);
    /// PortInfoRecord.
    pub const PORT_INFO_RECORD: AttrId = AttrId::from_raw(0x0012);
    /// PathRecord.
    pub const PATH_RECORD: AttrId = AttrId::from_raw(0x0035);
    /// MultiPathRecord.
    pub const MULTI_PATH_RECORD: AttrId = AttrId::from_raw(0x003a);
}

/// SA methods (IBTA Vol 1 Table 200) beyond the common ones in [`Method`].
pub mod method {
    use crate::codes::Method;
    /// Get.
    pub const GET: Method = Method::Get;
    /// GetResp.
    pub const GET_RESP: Method = Method::GetResp;
    /// GetTable.
    pub const GET_TABLE: Method = Method::from_raw(0x12);
    /// GetTableResp.
    pub const GET_TABLE_RESP: Method = Method::from_raw(0x92);
    /// GetMulti.
    pub const GET_MULTI: Method = Method::from_raw(0x14);
    /// GetMultiResp.
    pub const GET_MULTI_RESP: Method = Method::from_raw(0x94);
}

/// SA status codes: bits 14–8 of the MAD status (IBTA Vol 1 Table 202).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SaStatus {
    /// 0: success.
    Ok,
    /// 1: ERR_NO_RESOURCES.
    NoResources,
    /// 2: ERR_REQ_INVALID.
    ReqInvalid,
    /// 3: ERR_NO_RECORDS (a Get matched no record).
    NoRecords,
    /// 4: ERR_TOO_MANY_RECORDS (a Get matched more than one).
    TooManyRecords,
    /// 5: ERR_REQ_INVALID_GID.
    InvalidGid,
    /// 6: ERR_REQ_INSUFFICIENT_COMPONENTS.
    InsufficientComponents,
    /// 7: ERR_REQ_DENIED.
    Denied,
    /// Any other class-specific code.
    Other(u8),
}

impl SaStatus {
    /// The SA status of a MAD status field (bits 14–8).
    pub const fn from_mad_status(status: u16) -> Self {
        match (status >> 8) & 0x7f {
            0 => SaStatus::Ok,
            1 => SaStatus::NoResources,
            2 => SaStatus::ReqInvalid,
            3 => SaStatus::NoRecords,
            4 => SaStatus::TooManyRecords,
            5 => SaStatus::InvalidGid,
            6 => SaStatus::InsufficientComponents,
            7 => SaStatus::Denied,
            n => SaStatus::Other(n as u8),
        }
    }

    /// The code (bits 14–8 of the MAD status, shifted down).
    pub const fn code(self) -> u8 {
        match self {
            SaStatus::Ok => 0,
            SaStatus::NoResources => 1,
            SaStatus::ReqInvalid => 2,
            SaStatus::NoRecords => 3,
            SaStatus::TooManyRecords => 4,
            SaStatus::InvalidGid => 5,
            SaStatus::InsufficientComponents => 6,
            SaStatus::Denied => 7,
            SaStatus::Other(n) => n,
        }
    }
}

/// RMPPType values.
pub mod rmpp_type {
    /// DATA.
    pub const DATA: u8 = 1;
    /// ACK.
    pub const ACK: u8 = 2;
    /// STOP.
    pub const STOP: u8 = 3;
    /// ABORT.
    pub const ABORT: u8 = 4;
}

/// RMPPFlags bits (byte 26, bits 2–0).
pub mod rmpp_flags {
    /// Active: this MAD is part of an RMPP transfer.
    pub const ACTIVE: u8 = 0x01;
    /// First segment.
    pub const FIRST: u8 = 0x02;
    /// Last segment.
    pub const LAST: u8 = 0x04;
}

/// The 12-byte RMPP header (IBTA Vol 1 §13.6.2.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct RmppHeader {
    /// RMPPVersion (1 when RMPP is used; 0 in a MAD that does not use it).
    pub version: u8,
    /// RMPPType ([`rmpp_type`]).
    pub rmpp_type: u8,
    /// RRespTime: 5 bits (0x1f: no time given).
    pub resp_time: u8,
    /// RMPPFlags: 3 bits ([`rmpp_flags`]).
    pub flags: u8,
    /// RMPPStatus.
    pub status: u8,
    /// Data1: SegmentNumber (DATA, ACK).
    pub data1: u32,
    /// Data2: PayloadLength (DATA), NewWindowLast (ACK).
    pub data2: u32,
}

impl RmppHeader {
    /// Size on the wire.
    pub const LEN: usize = 12;

    /// Whether the Active flag is set (the MAD is a segment of an RMPP transfer).
    pub const fn is_active(&self) -> bool {
        self.flags & rmpp_flags::ACTIVE != 0
    }

    fn parse_fixed(b: &[u8; Self::LEN]) -> Self {
        let mut r = Rd::new(b);
        let version = r.u8();
        let rmpp_type = r.u8();
        let tf = r.u8();
        let status = r.u8();
        RmppHeader {
            version,
            rmpp_type,
            resp_time: tf >> 3,
            flags: tf & 0x07,
            status,
            data1: r.u32(),
            data2: r.u32(),
        }
    }

    fn emit<B: BufMut>(&self, buf: &mut B) {
        buf.put_u8(self.version);
        buf.put_u8(self.rmpp_type);
        buf.put_u8(((self.resp_time & 0x1f) << 3) | (self.flags & 0x07));
        buf.put_u8(self.status);
        buf.put_u32(self.data1);
        buf.put_u32(self.data2);
    }
}

/// One SA MAD: common header, RMPP header, SA header and the 200 data bytes.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SaMad {
    /// The common header (class 0x03, class version 2).
    pub header: MadHeader,
    /// The RMPP header.
    pub rmpp: RmppHeader,
    /// SM_Key (zero for a client that is not the SM).
    pub sm_key: u64,
    /// AttributeOffset in 8-byte words (the spacing of records in a GetTable answer; 0 in a
    /// request).
    pub attr_offset: u16,
    /// ComponentMask: which fields of the template in `data` a query matches on.
    pub comp_mask: u64,
    /// The SA data.
    pub data: [u8; SA_DATA_LEN],
    /// How many data bytes the parsed input held (200 for a full MAD; `data` is zero past it).
    pub data_len: usize,
}

impl SaMad {
    /// A request: class 0x03, class version 2, the method, TID and attribute given, no RMPP,
    /// SM_Key 0, the component mask and the template record in `data`.
    pub fn request(method: Method, tid: Tid, attr_id: AttrId, comp_mask: u64) -> Self {
        SaMad {
            header: MadHeader {
                base_version: BASE_VERSION,
                mgmt_class: MgmtClass::SubnAdm,
                class_version: SA_CLASS_VERSION,
                method,
                status: 0,
                class_specific: 0,
                tid,
                attr_id,
                attr_mod: 0,
            },
            rmpp: RmppHeader::default(),
            sm_key: 0,
            attr_offset: 0,
            comp_mask,
            data: [0; SA_DATA_LEN],
            data_len: SA_DATA_LEN,
        }
    }

    /// Parses an SA MAD.
    ///
    /// # Errors
    /// [`ParseError::Truncated`] below 56 bytes, [`ParseError::BadBaseVersion`],
    /// [`ParseError::InvalidField`] when the class is not 0x03 (`mgmt_class`) or its
    /// version not 2 (`class_version`).
    pub fn parse(bytes: &[u8]) -> Result<Self, ParseError> {
        let hdr = bytes
            .first_chunk::<SA_HDR_LEN>()
            .ok_or(ParseError::Truncated {
                offset: 0,
                need: SA_HDR_LEN,
                have: bytes.len(),
            })?;
        let header = MadHeader::parse(hdr)?;
        if header.mgmt_class != MgmtClass::SubnAdm {
            return Err(ParseError::InvalidField {
                field: "mgmt_class",
                value: u64::from(header.mgmt_class.raw()),
                offset: 1,
            });
        }
        if header.class_version != SA_CLASS_VERSION {
            return Err(ParseError::InvalidField {
                field: "class_version",
                value: u64::from(header.class_version),
                offset: 2,
            });
        }
        let mut r = Rd::new(hdr.get(off::RMPP_VERSION..).unwrap_or(&[]));
        let rmpp = RmppHeader::parse_fixed(&r.array::<{ RmppHeader::LEN }>());
        let sm_key = r.u64();
        let attr_offset = r.u16();
        r.skip(2);
        let comp_mask = r.u64();
        let rest = bytes.get(SA_HDR_LEN..).unwrap_or(&[]);
        let data_len = rest.len().min(SA_DATA_LEN);
        let mut data = [0u8; SA_DATA_LEN];
        if let (Some(dst), Some(src)) = (data.get_mut(..data_len), rest.get(..data_len)) {
            dst.copy_from_slice(src);
        }
        Ok(SaMad {
            header,
            rmpp,
            sm_key,
            attr_offset,
            comp_mask,
            data,
            data_len,
        })
    }

    /// Writes the 256 bytes (the reserved fields as zero).
    pub fn emit<B: BufMut>(&self, buf: &mut B) {
        self.header.emit(buf);
        self.rmpp.emit(buf);
        buf.put_u64(self.sm_key);
        buf.put_u16(self.attr_offset);
        buf.put_u16(0);
        buf.put_u64(self.comp_mask);
        buf.put_slice(&self.data);
    }

    /// The 256 bytes.
    pub fn to_bytes(&self) -> [u8; SA_MAD_LEN] {
        let mut out = [0u8; SA_MAD_LEN];
        self.emit(&mut &mut out[..]);
        out
    }

    /// The SA status of the MAD status field.
    pub const fn sa_status(&self) -> SaStatus {
        SaStatus::from_mad_status(self.header.status)
    }
}

#[cfg(test)]
mod tests;
