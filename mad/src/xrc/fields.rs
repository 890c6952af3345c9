//! Decoding for display: which XRC block a CM message carries, and its fields in wire order.

use super::{GoneCause, ReqMode, TargetGone, XrcDataError, XrcRepData, XrcReqData, MAX_REP_SRQNS};
use crate::cm::CmMessage;
use crate::cm::ReqTransport;
use crate::cma::CmaHeader;

/// One of the three XRC blocks, as found in a CM message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum XrcBlock {
    /// REQ private data.
    Req(XrcReqData),
    /// REP private data.
    Rep(XrcRepData),
    /// REJ ARI / private data, or DREQ private data.
    Gone(TargetGone),
}

/// One field of an XRC block, for a field-by-field printout.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct XrcField {
    /// Offset from the start of the block.
    pub offset: usize,
    /// Length in bytes.
    pub len: usize,
    /// The field's name, as in the module docs' tables.
    pub name: &'static str,
    /// The decoded value.
    pub value: String,
}

fn field(offset: usize, len: usize, name: &'static str, value: String) -> XrcField {
    XrcField {
        offset,
        len,
        name,
        value,
    }
}

impl XrcBlock {
    /// The XRC block `msg` carries, if any:
    /// * an XRC REQ ([`ReqTransport::Xrc`]): [`XrcReqData`] at the start of the private data,
    ///   after the CMA header when the Service ID is an rdma_cm one;
    /// * a REP: [`XrcRepData`] at the start of the private data;
    /// * a REJ: [`TargetGone`] in the ARI, else at the start of the private data;
    /// * a DREQ: [`TargetGone`] at the start of the private data.
    ///
    /// `None` when the message kind carries none or the bytes are foreign (no marker);
    /// `Some(Err)` for a block with the marker that does not parse. Never panics.
    pub fn find(msg: &CmMessage) -> Option<Result<Self, XrcDataError>> {
        let foreign = |r: Result<Self, XrcDataError>| match r {
            Err(XrcDataError::NotXrc) => None,
            other => Some(other),
        };
        match msg {
            CmMessage::Req(r) if r.transport() == ReqTransport::Xrc => {
                let pd = r.private_data.as_bytes();
                let user = if r.service_id.rdma_cm_port().is_some() {
                    CmaHeader::user_data(pd)
                } else {
                    pd
                };
                foreign(XrcReqData::parse(user).map(|(d, _)| Self::Req(d)))
            }
            CmMessage::Rep(r) => {
                foreign(XrcRepData::parse(r.private_data.as_bytes()).map(|(d, _)| Self::Rep(d)))
            }
            CmMessage::Rej(r) => TargetGone::parse(r.ari_bytes())
                .or_else(|| TargetGone::parse(r.private_data.as_bytes()))
                .map(|g| Ok(Self::Gone(g))),
            CmMessage::Dreq(d) => {
                TargetGone::parse(d.private_data.as_bytes()).map(|g| Ok(Self::Gone(g)))
            }
            _ => None,
        }
    }

    /// Short name of the block.
    pub const fn name(&self) -> &'static str {
        match self {
            Self::Req(_) => "XRC REQ data",
            Self::Rep(_) => "XRC REP data",
            Self::Gone(_) => "XRC target-gone block",
        }
    }

    /// Length of the block on the wire (without application bytes).
    pub fn len(&self) -> usize {
        match self {
            Self::Req(_) => XrcReqData::LEN,
            Self::Rep(r) => r.len(),
            Self::Gone(_) => TargetGone::LEN,
        }
    }

    /// Always `false` (every block has at least 8 bytes); present for clippy's `len` rule.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The block's fields in wire order (markers and version included, zero padding left
    /// out).
    pub fn fields(&self) -> Vec<XrcField> {
        let policy = |p: Option<super::OwnershipPolicy>| match p {
            Some(p) => format!("{:02x} {p}", p.code()),
            None => "00 target's default".to_owned(),
        };
        match self {
            Self::Req(r) => {
                let qpn = match r.mode {
                    ReqMode::Attach(q) => q.to_string(),
                    ReqMode::Any | ReqMode::Create => "none".to_owned(),
                };
                vec![
                    field(0, 2, "marker", "\"XQ\"".to_owned()),
                    field(2, 1, "version", super::VERSION.to_string()),
                    field(3, 1, "mode", format!("{:02x} {}", r.mode.code(), r.mode)),
                    field(4, 3, "TGT QPN", qpn),
                    field(7, 1, "ownership policy", policy(r.policy)),
                ]
            }
            Self::Rep(r) => {
                let n = r.srqns.len().min(MAX_REP_SRQNS);
                let mut v = Vec::with_capacity(6usize.saturating_add(n));
                if let Some(first) = r.srqns.first() {
                    v.push(field(0, 4, "SRQN[0]", first.to_string()));
                }
                v.push(field(4, 2, "marker", "\"XP\"".to_owned()));
                v.push(field(6, 1, "version", super::VERSION.to_string()));
                v.push(field(7, 1, "SRQN count", n.to_string()));
                v.push(field(8, 3, "TGT QPN", r.tgt_qpn.to_string()));
                v.push(field(
                    11,
                    1,
                    "flags",
                    format!(
                        "{:#04x} policy {}, {}",
                        r.flags(),
                        r.policy,
                        if r.created { "created" } else { "attached" }
                    ),
                ));
                for (i, s) in r.srqns.iter().enumerate().skip(1).take(MAX_REP_SRQNS) {
                    v.push(field(
                        12usize.saturating_add(4usize.saturating_mul(i.saturating_sub(1))),
                        4,
                        "SRQN",
                        format!("[{i}] {s}"),
                    ));
                }
                v
            }
            Self::Gone(g) => {
                let cause = match g.kind {
                    super::RejectKind::Gone(c) => format!("{:02x} {c}", c.code()),
                    super::RejectKind::Misconfigured(c) => format!("{:02x} {c}", c.code()),
                    _ => "00".to_owned(),
                };
                vec![
                    field(0, 3, "marker", "\"XRC\"".to_owned()),
                    field(3, 1, "version", super::VERSION.to_string()),
                    field(4, 1, "kind", format!("{:02x} {}", g.kind.code(), g.kind)),
                    field(5, 1, "cause", cause),
                    field(
                        8,
                        3,
                        "TGT QPN",
                        g.qpn.map_or_else(|| "none".to_owned(), |q| q.to_string()),
                    ),
                ]
            }
        }
    }
}

impl core::fmt::Display for XrcBlock {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Self::Req(r) => {
                write!(f, "XRC REQ: mode {}", r.mode)?;
                match r.policy {
                    Some(p) => write!(f, ", policy {p}"),
                    None => f.write_str(", target's default policy"),
                }
            }
            Self::Rep(r) => write!(
                f,
                "XRC REP: TGT QPN {}, policy {}, {}, {} SRQN(s)",
                r.tgt_qpn,
                r.policy,
                if r.created { "created" } else { "attached" },
                r.srqns.len()
            ),
            Self::Gone(g) => write!(f, "XRC: {g}"),
        }
    }
}

/// A `GoneCause` is what a target-gone block of kind `01` carries; handy for matching.
impl TargetGone {
    /// The cause, for kind `01` (target gone).
    pub const fn cause(&self) -> Option<GoneCause> {
        match self.kind {
            super::RejectKind::Gone(c) => Some(c),
            _ => None,
        }
    }
}
