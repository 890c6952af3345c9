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
    /// `04`: the target's service is set up wrong; no initiator can connect to it until its
    /// owner fixes it (REJ reason 28). The cause byte says what is wrong.
    Misconfigured(ServiceFault),
}

/// The cause byte of a [`RejectKind::Misconfigured`] block: what is wrong with the target's
/// service.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ServiceFault {
    /// `01`: the service names an XRC domain the target never opened.
    UnknownDomain,
    /// `02`: the service announces no XRC SRQ number (the REP needs 1..=47).
    NoSrqns,
    /// `03`: the service announces more than 47 XRC SRQ numbers (the REP's 196 bytes hold 47).
    TooManySrqns,
}

impl ServiceFault {
    /// Every fault, in code order.
    pub const ALL: [Self; 3] = [Self::UnknownDomain, Self::NoSrqns, Self::TooManySrqns];

    /// The cause byte.
    pub const fn code(self) -> u8 {
        match self {
            Self::UnknownDomain => 1,
            Self::NoSrqns => 2,
            Self::TooManySrqns => 3,
        }
    }

    /// From the cause byte; `None` for an unknown code.
    pub const fn from_code(c: u8) -> Option<Self> {
        match c {
            1 => Some(Self::UnknownDomain),
            2 => Some(Self::NoSrqns),
            3 => Some(Self::TooManySrqns),
            _ => None,
        }
    }
}

impl fmt::Display for ServiceFault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::UnknownDomain => "unknown XRC domain",
            Self::NoSrqns => "no XRC SRQ number",
            Self::TooManySrqns => "too many XRC SRQ numbers (more than 47)",
        })
    }
}

impl RejectKind {
    /// The kind byte (offset 4).
    pub const fn code(self) -> u8 {
        match self {
            Self::Gone(_) => 1,
            Self::AttachRefused => 2,
            Self::NoResources => 3,
            Self::Misconfigured(_) => 4,
        }
    }

    /// The cause byte (offset 5): the [`GoneCause`] code for kind `01`, the [`ServiceFault`]
    /// code for kind `04`, else zero.
    pub const fn cause_code(self) -> u8 {
        match self {
            Self::Gone(c) => c.code(),
            Self::Misconfigured(f) => f.code(),
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
            Self::Misconfigured(c) => write!(f, "target service misconfigured ({c})"),
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
            RejectKind::Misconfigured(_) => RejReason::ConsumerReject,
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

    /// Parses the block from an ARI or from the start of REJ or DREQ private data; `None` if
    /// the bytes are not this format. Never panics.
    ///
    /// Fewer than 12 bytes are read as if the missing ones were zeros, so a block whose
    /// trailing zeros were trimmed (as `ibcm`'s `ConnectionError` trims private data: a
    /// block with a TGT QPN ends in one zero byte, one without in seven) parses as the block
    /// sent. At least the marker and the version (4 bytes) must be there.
    ///
    /// ```
    /// use ibcm_mad::xrc::{GoneCause, TargetGone};
    /// use ibcm_mad::Qpn;
    ///
    /// let g = TargetGone::gone(GoneCause::CreatorExited, Qpn::masked(0x48));
    /// let b = g.to_bytes();
    /// assert_eq!(TargetGone::parse(&b[..11]), Some(g));
    /// ```
    pub fn parse(b: &[u8]) -> Option<Self> {
        let mut head = [0u8; Self::LEN];
        let n = b.len().min(Self::LEN);
        if n < 4 {
            return None;
        }
        head.get_mut(..n)?.copy_from_slice(b.get(..n)?);
        let [m0, m1, m2, VERSION, kind, cause, _, _, q0, q1, q2, _] = head else {
            return None;
        };
        if [m0, m1, m2] != MARKER {
            return None;
        }
        let kind = match kind {
            1 => RejectKind::Gone(GoneCause::from_code(cause)?),
            2 => RejectKind::AttachRefused,
            3 => RejectKind::NoResources,
            4 => RejectKind::Misconfigured(ServiceFault::from_code(cause)?),
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
