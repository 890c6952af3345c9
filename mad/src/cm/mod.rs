//! CM messages: one struct per attribute, the [`CmMessage`] sum type and the whole [`Mad`].
//!
//! Every CM MAD is exactly 256 bytes: the 24-byte common header ([`MadHeader`]) and a 232-byte
//! attribute. Parsers walk the fixed 232 bytes with a fixed-offset cursor (`wire.rs`; why not nom:
//! docs/framing.md §5.2); the length is checked once up front, so no parser below can fail
//! half-way. Emitters write exactly 232 bytes with
//! [`bytes::BufMut`], zeroing reserved bits.

use core::fmt;

use bytes::{BufMut, Bytes};

use crate::codes::{AttrId, Method, MgmtClass};
use crate::error::{EmitError, ParseError};
use crate::header::{MadHeader, CM_CLASS_VERSION};
use crate::types::{CommId, Tid};

mod apr;
mod cpi;
mod lap;
mod mra;
mod path;
mod rej;
mod rep;
mod req;
mod sidr;
mod simple;
pub(crate) mod wire;

pub use apr::Apr;
pub use cpi::ClassPortInfo;
pub use lap::Lap;
pub use mra::Mra;
pub use path::PathInfo;
pub use rej::Rej;
pub use rep::Rep;
pub use req::{Req, ReqTransport};
pub use sidr::{SidrRep, SidrReq};
pub use simple::{Drep, Dreq, Rtu};

/// Size of a MAD (`IB_MGMT_MAD_SIZE`).
pub const MAD_LEN: usize = 256;
/// Size of the attribute data after the common header (`IB_MGMT_MAD_DATA`).
pub const MAD_DATA_LEN: usize = 232;

/// A CM attribute payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CmMessage {
    /// ClassPortInfo (0x0001).
    ClassPortInfo(ClassPortInfo),
    /// REQ (0x0010).
    Req(Req),
    /// MRA (0x0011).
    Mra(Mra),
    /// REJ (0x0012).
    Rej(Rej),
    /// REP (0x0013).
    Rep(Rep),
    /// RTU (0x0014).
    Rtu(Rtu),
    /// DREQ (0x0015).
    Dreq(Dreq),
    /// DREP (0x0016).
    Drep(Drep),
    /// SIDR_REQ (0x0017).
    SidrReq(SidrReq),
    /// SIDR_REP (0x0018).
    SidrRep(SidrRep),
    /// LAP (0x0019).
    Lap(Lap),
    /// APR (0x001A).
    Apr(Apr),
    /// An attribute ID this crate does not know; the raw data is kept.
    Unknown {
        /// The attribute ID.
        attr: u16,
        /// The 232 attribute bytes.
        raw: [u8; MAD_DATA_LEN],
    },
}

impl CmMessage {
    /// The attribute ID of this message.
    pub fn attr_id(&self) -> AttrId {
        match self {
            CmMessage::ClassPortInfo(_) => AttrId::ClassPortInfo,
            CmMessage::Req(_) => AttrId::Req,
            CmMessage::Mra(_) => AttrId::Mra,
            CmMessage::Rej(_) => AttrId::Rej,
            CmMessage::Rep(_) => AttrId::Rep,
            CmMessage::Rtu(_) => AttrId::Rtu,
            CmMessage::Dreq(_) => AttrId::Dreq,
            CmMessage::Drep(_) => AttrId::Drep,
            CmMessage::SidrReq(_) => AttrId::SidrReq,
            CmMessage::SidrRep(_) => AttrId::SidrRep,
            CmMessage::Lap(_) => AttrId::Lap,
            CmMessage::Apr(_) => AttrId::Apr,
            CmMessage::Unknown { attr, .. } => AttrId::from_raw(*attr),
        }
    }

    /// The spec acronym: `REQ`, `MRA`, …, `CPI` for ClassPortInfo, `unknown` otherwise.
    pub fn name(&self) -> &'static str {
        self.attr_id().name()
    }

    /// The sender's Local Communication ID, for the messages that carry one.
    pub fn local_comm_id(&self) -> Option<CommId> {
        match self {
            CmMessage::Req(m) => Some(m.local_comm_id),
            CmMessage::Mra(m) => Some(m.local_comm_id),
            CmMessage::Rej(m) => Some(m.local_comm_id),
            CmMessage::Rep(m) => Some(m.local_comm_id),
            CmMessage::Rtu(m) => Some(m.local_comm_id),
            CmMessage::Dreq(m) => Some(m.local_comm_id),
            CmMessage::Drep(m) => Some(m.local_comm_id),
            CmMessage::Lap(m) => Some(m.local_comm_id),
            CmMessage::Apr(m) => Some(m.local_comm_id),
            CmMessage::ClassPortInfo(_)
            | CmMessage::SidrReq(_)
            | CmMessage::SidrRep(_)
            | CmMessage::Unknown { .. } => None,
        }
    }

    /// The Remote Communication ID, for the messages that carry one (all but REQ, SIDR and
    /// ClassPortInfo).
    pub fn remote_comm_id(&self) -> Option<CommId> {
        match self {
            CmMessage::Mra(m) => Some(m.remote_comm_id),
            CmMessage::Rej(m) => Some(m.remote_comm_id),
            CmMessage::Rep(m) => Some(m.remote_comm_id),
            CmMessage::Rtu(m) => Some(m.remote_comm_id),
            CmMessage::Dreq(m) => Some(m.remote_comm_id),
            CmMessage::Drep(m) => Some(m.remote_comm_id),
            CmMessage::Lap(m) => Some(m.remote_comm_id),
            CmMessage::Apr(m) => Some(m.remote_comm_id),
            CmMessage::ClassPortInfo(_)
            | CmMessage::Req(_)
            | CmMessage::SidrReq(_)
            | CmMessage::SidrRep(_)
            | CmMessage::Unknown { .. } => None,
        }
    }

    /// Whether the message belongs to an XRC connection setup (an XRC REQ).
    pub fn is_xrc(&self) -> bool {
        matches!(self, CmMessage::Req(r) if r.is_xrc())
    }

    /// Parses the 232-byte attribute data for attribute `attr`.
    ///
    /// # Errors
    /// [`ParseError::Truncated`] (offsets relative to the attribute data) when `data` is
    /// shorter than 232 bytes.
    pub fn parse(attr: AttrId, data: &[u8]) -> Result<Self, ParseError> {
        let data = data
            .first_chunk::<MAD_DATA_LEN>()
            .ok_or(ParseError::Truncated {
                offset: 0,
                need: MAD_DATA_LEN,
                have: data.len(),
            })?;
        Ok(Self::parse_fixed(attr, data))
    }

    /// Parses exactly 232 bytes of attribute data; cannot fail.
    #[inline(always)]
    pub fn parse_fixed(attr: AttrId, data: &[u8; MAD_DATA_LEN]) -> Self {
        match attr {
            AttrId::ClassPortInfo => Self::ClassPortInfo(ClassPortInfo::parse_body(data)),
            AttrId::Req => Self::Req(Req::parse_body(data)),
            AttrId::Mra => Self::Mra(Mra::parse_body(data)),
            AttrId::Rej => Self::Rej(Rej::parse_body(data)),
            AttrId::Rep => Self::Rep(Rep::parse_body(data)),
            AttrId::Rtu => Self::Rtu(Rtu::parse_body(data)),
            AttrId::Dreq => Self::Dreq(Dreq::parse_body(data)),
            AttrId::Drep => Self::Drep(Drep::parse_body(data)),
            AttrId::SidrReq => Self::SidrReq(SidrReq::parse_body(data)),
            AttrId::SidrRep => Self::SidrRep(SidrRep::parse_body(data)),
            AttrId::Lap => Self::Lap(Lap::parse_body(data)),
            AttrId::Apr => Self::Apr(Apr::parse_body(data)),
            AttrId::Unknown(attr) => Self::Unknown { attr, raw: *data },
        }
    }

    /// Writes the 232-byte attribute data.
    pub fn emit_body<B: BufMut>(&self, buf: &mut B) {
        match self {
            CmMessage::ClassPortInfo(m) => m.emit_body(buf),
            CmMessage::Req(m) => m.emit_body(buf),
            CmMessage::Mra(m) => m.emit_body(buf),
            CmMessage::Rej(m) => m.emit_body(buf),
            CmMessage::Rep(m) => m.emit_body(buf),
            CmMessage::Rtu(m) => m.emit_body(buf),
            CmMessage::Dreq(m) => m.emit_body(buf),
            CmMessage::Drep(m) => m.emit_body(buf),
            CmMessage::SidrReq(m) => m.emit_body(buf),
            CmMessage::SidrRep(m) => m.emit_body(buf),
            CmMessage::Lap(m) => m.emit_body(buf),
            CmMessage::Apr(m) => m.emit_body(buf),
            CmMessage::Unknown { raw, .. } => buf.put_slice(raw),
        }
    }
}

/// A whole CM MAD: common header plus attribute.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Mad {
    /// The common header.
    pub header: MadHeader,
    /// The attribute.
    pub msg: CmMessage,
}

impl Mad {
    /// Size on the wire.
    pub const LEN: usize = MAD_LEN;

    /// A CM MAD (class 0x07, version 2, method Send) carrying `msg` with transaction ID `tid`.
    /// ClassPortInfo gets method Get.
    pub fn new(tid: Tid, msg: CmMessage) -> Self {
        let mut header = MadHeader::cm(tid, msg.attr_id());
        if matches!(msg, CmMessage::ClassPortInfo(_)) {
            header.method = Method::Get;
        }
        Mad { header, msg }
    }

    /// Parses and validates a CM MAD. Bytes after the first 256 are ignored.
    ///
    /// Validation (docs/wire.md §1): BaseVersion 1, class 0x07, ClassVersion 2, and method
    /// Send for every connection message (Get, Set, GetResp or Send for ClassPortInfo). An unknown
    /// attribute ID is not an error: it yields [`CmMessage::Unknown`].
    ///
    /// # Errors
    /// A [`ParseError`] naming the byte offset of the problem.
    pub fn parse(bytes: &[u8]) -> Result<Self, ParseError> {
        let mad = bytes
            .first_chunk::<MAD_LEN>()
            .ok_or(ParseError::Truncated {
                offset: 0,
                need: MAD_LEN,
                have: bytes.len(),
            })?;
        Self::parse_fixed(mad)
    }

    /// [`Mad::parse`] on exactly 256 bytes.
    ///
    /// # Errors
    /// As [`Mad::parse`], minus truncation.
    #[inline]
    pub fn parse_fixed(mad: &[u8; MAD_LEN]) -> Result<Self, ParseError> {
        let (hdr, data) =
            mad.split_first_chunk::<{ MadHeader::LEN }>()
                .ok_or(ParseError::Truncated {
                    offset: 0,
                    need: MAD_LEN,
                    have: MAD_LEN,
                })?;
        let header = MadHeader::parse_fixed(hdr);
        validate_cm_header(&header)?;
        let data = data
            .first_chunk::<MAD_DATA_LEN>()
            .ok_or(ParseError::Truncated {
                offset: MadHeader::LEN,
                need: MAD_DATA_LEN,
                have: data.len(),
            })?;
        // One out-of-line builder per message: each writes its message straight into the
        // result. (Inlined into one function, LLVM merged the arms' stores into one shared
        // store sequence fed through stack slots, whose store-forwarding stalls cost ~40 %.)
        let data: &Body = data;
        match header.attr_id {
            AttrId::ClassPortInfo => build::cpi(header, data),
            AttrId::Req => build::req(header, data),
            AttrId::Mra => build::mra(header, data),
            AttrId::Rej => build::rej(header, data),
            AttrId::Rep => build::rep(header, data),
            AttrId::Rtu => build::rtu(header, data),
            AttrId::Dreq => build::dreq(header, data),
            AttrId::Drep => build::drep(header, data),
            AttrId::SidrReq => build::sidr_req(header, data),
            AttrId::SidrRep => build::sidr_rep(header, data),
            AttrId::Lap => build::lap(header, data),
            AttrId::Apr => build::apr(header, data),
            AttrId::Unknown(attr) => Ok(Mad {
                header,
                msg: CmMessage::Unknown { attr, raw: *data },
            }),
        }
    }

    /// Writes the 256 bytes.
    ///
    /// # Errors
    /// [`EmitError::BufferTooSmall`] when `buf` has less than 256 bytes of room.
    pub fn emit<B: BufMut>(&self, buf: &mut B) -> Result<(), EmitError> {
        if buf.remaining_mut() < MAD_LEN {
            return Err(EmitError::BufferTooSmall {
                need: MAD_LEN,
                have: buf.remaining_mut(),
            });
        }
        self.header.emit(buf);
        self.msg.emit_body(buf);
        Ok(())
    }

    /// Writes the 256 bytes at the start of `out` and returns 256.
    ///
    /// # Errors
    /// [`EmitError::BufferTooSmall`] when `out` is shorter than 256 bytes.
    pub fn emit_into(&self, out: &mut [u8]) -> Result<usize, EmitError> {
        let have = out.len();
        let mut dst = out.get_mut(..MAD_LEN).ok_or(EmitError::BufferTooSmall {
            need: MAD_LEN,
            have,
        })?;
        self.header.emit(&mut dst);
        self.msg.emit_body(&mut dst);
        Ok(MAD_LEN)
    }

    /// The 256 bytes as [`Bytes`]: one allocation that holds them and their reference count,
    /// so that a clone (a retransmission buffer's copy) allocates nothing.
    pub fn to_bytes(&self) -> Bytes {
        let mut mad = [0u8; MAD_LEN];
        // Cannot fail: the buffer is `MAD_LEN` bytes.
        let _ = self.emit_into(&mut mad);
        Bytes::from_owner(mad)
    }
}

/// The CM checks on a parsed header.
fn validate_cm_header(h: &MadHeader) -> Result<(), ParseError> {
    if h.base_version != crate::header::BASE_VERSION {
        return Err(ParseError::BadBaseVersion {
            offset: 0,
            value: h.base_version,
        });
    }
    if h.mgmt_class != MgmtClass::Cm {
        return Err(ParseError::NotCmClass {
            offset: 1,
            value: h.mgmt_class.raw(),
        });
    }
    if h.class_version != CM_CLASS_VERSION {
        return Err(ParseError::UnsupportedClassVersion {
            offset: 2,
            value: h.class_version,
        });
    }
    let method_ok = match h.attr_id {
        AttrId::ClassPortInfo => matches!(
            h.method,
            Method::Get | Method::Set | Method::GetResp | Method::Send
        ),
        AttrId::Unknown(_) => true,
        _ => h.method == Method::Send,
    };
    if !method_ok {
        return Err(ParseError::InvalidField {
            field: "method",
            value: u64::from(h.method.raw()),
            offset: 3,
        });
    }
    Ok(())
}

impl fmt::Display for CmMessage {
    /// A one-line summary: the acronym and the identifying fields.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CmMessage::Req(m) => write!(
                f,
                "REQ lcid={} sid={} qpn={} psn={} {:?}",
                m.local_comm_id,
                m.service_id,
                m.local_qpn,
                m.starting_psn,
                m.transport()
            ),
            CmMessage::Rep(m) => {
                write!(
                    f,
                    "REP lcid={} rcid={} qpn={} psn={}",
                    m.local_comm_id, m.remote_comm_id, m.local_qpn, m.starting_psn
                )?;
                if m.local_eecn.get() != 0 {
                    write!(f, " eecn={}", m.local_eecn)?;
                }
                Ok(())
            }
            CmMessage::Rej(m) => write!(
                f,
                "REJ lcid={} rcid={} reason={} ({}) rejected={}",
                m.local_comm_id,
                m.remote_comm_id,
                m.reason.raw(),
                m.reason,
                m.message_rejected
            ),
            CmMessage::Mra(m) => write!(
                f,
                "MRA lcid={} rcid={} mraed={} service_timeout={}",
                m.local_comm_id,
                m.remote_comm_id,
                m.message_mraed,
                m.service_timeout.get()
            ),
            CmMessage::Rtu(m) => {
                write!(f, "RTU lcid={} rcid={}", m.local_comm_id, m.remote_comm_id)
            }
            CmMessage::Dreq(m) => write!(
                f,
                "DREQ lcid={} rcid={} remote_qpn={}",
                m.local_comm_id, m.remote_comm_id, m.remote_qpn_eecn
            ),
            CmMessage::Drep(m) => {
                write!(f, "DREP lcid={} rcid={}", m.local_comm_id, m.remote_comm_id)
            }
            CmMessage::SidrReq(m) => write!(
                f,
                "SIDR_REQ request_id={} sid={}",
                m.request_id, m.service_id
            ),
            CmMessage::SidrRep(m) => write!(
                f,
                "SIDR_REP request_id={} status={} qpn={} qkey={}",
                m.request_id, m.status, m.qpn, m.qkey
            ),
            CmMessage::Lap(m) => write!(
                f,
                "LAP lcid={} rcid={} remote_qpn={}",
                m.local_comm_id, m.remote_comm_id, m.remote_qpn_eecn
            ),
            CmMessage::Apr(m) => write!(
                f,
                "APR lcid={} rcid={} status={}",
                m.local_comm_id, m.remote_comm_id, m.ap_status
            ),
            CmMessage::ClassPortInfo(m) => write!(
                f,
                "CPI base_version={} class_version={} cap={:#06x}",
                m.base_version, m.class_version, m.capability_mask
            ),
            CmMessage::Unknown { attr, .. } => write!(f, "unknown attribute {attr:#06x}"),
        }
    }
}

#[cfg(test)]
mod tests;

type Body = [u8; MAD_DATA_LEN];

/// The per-message builders of [`Mad::parse_fixed`], kept out of line on purpose.
mod build {
    use super::*;

    macro_rules! builders {
        ($($name:ident => $variant:ident($ty:ty)),* $(,)?) => {$(
            #[inline(never)]
            pub(super) fn $name(header: MadHeader, data: &Body) -> Result<Mad, ParseError> {
                Ok(Mad {
                    header,
                    msg: CmMessage::$variant(<$ty>::parse_body(data)),
                })
            }
        )*};
    }

    builders! {
        cpi => ClassPortInfo(ClassPortInfo),
        req => Req(Req),
        mra => Mra(Mra),
        rej => Rej(Rej),
        rep => Rep(Rep),
        rtu => Rtu(Rtu),
        dreq => Dreq(Dreq),
        drep => Drep(Drep),
        sidr_req => SidrReq(SidrReq),
        sidr_rep => SidrRep(SidrRep),
        lap => Lap(Lap),
        apr => Apr(Apr),
    }
}
