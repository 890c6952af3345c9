//! [`TargetGone`]: the 12-byte ARI / private-data block of an XRC REJ or DREQ (module docs
//! of `xrc` for the bytes).

use core::fmt;

use super::{put_be24, write_parts, GoneCause, XrcDataError, VERSION};
use crate::codes::RejReason;
use crate::types::Qpn;

/// The `kind` byte of [`TargetGone`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RejectKind {
    /// `01`: the named TGT QP no longer exists (REJ reason 1).
    Gone(GoneCause),
    /// `02`: the named TGT QP exists but serves another initiator (REJ reason 28).
    AttachRefused,
    /// `03`: no TGT QP could be created (REJ reason 3).
    NoResources,
}

impl RejectKind {
    /// The kind byte (offset 4).
    pub const fn code(self) -> u8 {
        match self {
            Self::Gone(_) => 1,
            Self::AttachRefused => 2,
            Self::NoResources => 3,
        }
    }

    /// The cause byte (offset 5): the [`GoneCause`] code for kind `01`, else zero.
    pub const fn cause_code(self) -> u8 {
        match self {
            Self::Gone(c) => c.code(),
            Self::AttachRefused | Self::NoResources => 0,
        }
    }
}

impl fmt::Display for RejectKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Gone(c) => write!(f, "target gone ({c})"),
            Self::AttachRefused => f.write_str("attach refused"),
            Self::NoResources => f.write_str("no TGT QP available"),
        }
    }
}

/// The 12-byte ARI / private-data block of an XRC REJ (module docs of `xrc` for the bytes).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TargetGone {
    /// What happened.
    pub kind: RejectKind,
    /// The TGT QPN the REQ named (`None` if it named none).
    pub qpn: Option<Qpn>,
}

const MARKER: [u8; 3] = [0x58, 0x52, 0x43];

impl TargetGone {
    /// Length of the block (and the REJ's Reject Info Length).
    pub const LEN: usize = 12;

    /// "Target gone" for `qpn`.
    pub const fn gone(cause: GoneCause, qpn: Qpn) -> Self {
        Self {
            kind: RejectKind::Gone(cause),
            qpn: Some(qpn),
        }
    }

    /// The REJ reason to send with this block.
    pub const fn reason(&self) -> RejReason {
        match self.kind {
            RejectKind::Gone(_) => RejReason::NoQp,
            RejectKind::AttachRefused => RejReason::ConsumerReject,
            RejectKind::NoResources => RejReason::NoResources,
        }
    }

    /// Whether this says the target is gone (as opposed to a refusal).
    pub const fn is_gone(&self) -> bool {
        matches!(self.kind, RejectKind::Gone(_))
    }

    /// The 12 bytes.
    pub fn to_bytes(&self) -> [u8; 12] {
        let [m0, m1, m2] = MARKER;
        let [q0, q1, q2] = put_be24(self.qpn.map_or(0, Qpn::get));
        [
            m0,
            m1,
            m2,
            VERSION,
            self.kind.code(),
            self.kind.cause_code(),
            0,
            0,
            q0,
            q1,
            q2,
            0,
        ]
    }

    /// Writes the 12 bytes at the start of `out`; the length written (12).
    ///
    /// # Errors
    /// [`XrcDataError::TooLong`] if `out` is shorter than 12 bytes.
    pub fn write(&self, out: &mut [u8]) -> Result<usize, XrcDataError> {
        write_parts(out, &[&self.to_bytes()])
    }

    /// Parses the block from an ARI or from the start of REJ private data; `None` if the
    /// bytes are not this format. Never panics.
    pub fn parse(b: &[u8]) -> Option<Self> {
        let head = b.first_chunk::<{ Self::LEN }>()?;
        let [m0, m1, m2, VERSION, kind, cause, _, _, q0, q1, q2, _] = *head else {
            return None;
        };
        if [m0, m1, m2] != MARKER {
            return None;
        }
        let kind = match kind {
            1 => RejectKind::Gone(GoneCause::from_code(cause)?),
            2 => RejectKind::AttachRefused,
            3 => RejectKind::NoResources,
            _ => return None,
        };
        let q = u32::from_be_bytes([0, q0, q1, q2]);
        Some(Self {
            kind,
            qpn: (q != 0).then(|| Qpn::masked(q)),
        })
    }
}

impl fmt::Display for TargetGone {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.kind)?;
        if let Some(q) = self.qpn {
            write!(f, " qpn {q}")?;
        }
        Ok(())
    }
}
