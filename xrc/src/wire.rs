//! What ibcm puts in CM private data and REJ ARI for XRC: three small, versioned formats.
//!
//! All multi-byte fields are **big-endian** (network order), like every CM field. Every
//! format starts with an ASCII marker so a parser can tell it from foreign private data, and a
//! version byte (1) so a later layout can be told apart. Parsers accept any trailing bytes
//! (the CM areas are fixed-size and zero-padded) and never panic.
//!
//! # REQ private data: [`XrcReqData`] (8 bytes, then the application's bytes)
//!
//! | Off | Len | Field |
//! |---:|---:|---|
//! | 0 | 2 | marker `"XQ"` = `58 51` |
//! | 2 | 1 | version = `01` |
//! | 3 | 1 | mode: `00` any (target picks: reuse the TGT QP it keeps for this INI, else create), `01` create a new TGT QP, `02` attach to the TGT QP named below |
//! | 4 | 3 | TGT QPN, 24-bit big-endian (mode `02`; zero otherwise) |
//! | 7 | 1 | requested ownership policy: `00` target's default, `01` Explicit, `02` DomainBound, `03` ProcessBound, `04` Shared |
//! | 8 | … | application private data |
//!
//! It fits the REQ's 92-byte area, and the 56 bytes rdma_cm leaves after its 36-byte header.
//!
//! # REP private data: [`XrcRepData`] (12 + 4·(N−1) bytes, then the application's bytes)
//!
//! | Off | Len | Field |
//! |---:|---:|---|
//! | 0 | 4 | SRQN\[0\], as a 32-bit big-endian value (top byte zero) — **exactly what `rdma_xserver` sends**, so a stock `rdma_xclient` reads the right SRQN |
//! | 4 | 2 | marker `"XP"` = `58 50` |
//! | 6 | 1 | version = `01` |
//! | 7 | 1 | N = number of SRQNs, 1..=47 |
//! | 8 | 3 | TGT QPN, 24-bit big-endian (the same value as the REP's Local EECN; spec/cm-wire.md §3.2) |
//! | 11 | 1 | bits 0–3: ownership policy (`01`..`04` as above); bit 4: the TGT QP was created for this REQ (0: an existing one was attached); bits 5–7: zero |
//! | 12 | 4·(N−1) | SRQN\[1..N\], each 32-bit big-endian, top byte zero |
//! | 12+4·(N−1) | … | application private data |
//!
//! The SRQNs are the accepting process's XRC SRQs (one per receive-buffer class, as Open MPI
//! used them); the initiator puts one of them in each XRC work request. The REP area is 196
//! bytes, so at most 47 SRQNs fit.
//!
//! # "Target gone": REJ reason 1 + [`TargetGone`] in ARI and private data (12 bytes)
//!
//! A REQ (or a reconnect) that names a TGT QP which no longer exists is rejected with
//! **REJ reason 1, "No QP available"** ([`RejReason::NoQp`]), Reject Info Length 12, and these
//! 12 bytes both as the ARI and at the start of the REJ private data (rdma_cm users see only
//! the reason and the private data, not the ARI):
//!
//! | Off | Len | Field |
//! |---:|---:|---|
//! | 0 | 3 | marker `"XRC"` = `58 52 43` |
//! | 3 | 1 | version = `01` |
//! | 4 | 1 | kind: `01` target gone, `02` attach refused (the TGT QP serves another initiator), `03` no TGT QP could be created |
//! | 5 | 1 | cause, for kind `01` ([`GoneCause`]): `01` owner destroyed it, `02` domain closed, `03` creator exited, `04` last registration dropped, `05` keeper lost, `06` last connection-scoped registration left (peer DREQ/timeout), `07` never existed or forgotten; `00` otherwise |
//! | 6 | 2 | zero |
//! | 8 | 3 | the TGT QPN the REQ named, 24-bit big-endian (zero if none) |
//! | 11 | 1 | zero |
//!
//! When a TGT QP goes away under an **established** connection, the target's DREQ carries
//! the same 12 bytes (kind `01`, the cause, the QPN) as its private data, so the initiator
//! learns why it was disconnected (`cm::IniOutcome::TargetGone`); a peer that does not know
//! the format sees an ordinary DREQ.
//!
//! Why reason 1 and not 28: rdma_cm answers every application refusal with 28 (consumer
//! defined), so 28 cannot carry "gone" without a private-data convention every peer must
//! know; "No QP available" already means "no QP here to accept you". An ibcm initiator checks
//! the marker and treats kind `01` as "the TGT QP is gone, drop the cached TGT QPN and connect
//! anew (mode `00`/`01`)", anything else as a refusal. Kind `02` uses reason 28, kind `03`
//! reason 3 ("No resources").
//!
//! ```
//! use ibcm_xrc::wire::{GoneCause, RejectKind, TargetGone};
//! use ibcm_mad::{Qpn, RejReason};
//!
//! let gone = TargetGone::gone(GoneCause::CreatorExited, Qpn::new(0x00_04a1).unwrap());
//! assert_eq!(gone.reason(), RejReason::NoQp);
//! assert_eq!(
//!     gone.to_bytes(),
//!     [0x58, 0x52, 0x43, 0x01, 0x01, 0x03, 0, 0, 0x00, 0x04, 0xa1, 0]
//! );
//! assert_eq!(TargetGone::parse(&gone.to_bytes()), Some(gone));
//! ```

use core::fmt;

use ibcm_mad::{Qpn, RejReason};

use crate::policy::OwnershipPolicy;
use crate::types::SrqNum;

/// Errors building or parsing the formats above.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WireError {
    /// The bytes do not start with this format's marker (foreign private data).
    #[error("not ibcm XRC private data")]
    NotXrc,
    /// A version this code does not know.
    #[error("unsupported XRC private-data version {0}")]
    UnsupportedVersion(u8),
    /// Too short for the header or the announced SRQN count.
    #[error("XRC private data truncated: need {need} bytes, have {have}")]
    Truncated {
        /// Bytes needed.
        need: usize,
        /// Bytes present.
        have: usize,
    },
    /// A field holds a value outside its range.
    #[error("invalid {field} {value:#x} in XRC private data")]
    InvalidField {
        /// Field name.
        field: &'static str,
        /// The value.
        value: u32,
    },
    /// The result does not fit the message's private-data area.
    #[error("XRC private data of {len} bytes exceeds the {max}-byte area")]
    TooLong {
        /// Bytes needed.
        len: usize,
        /// Area size.
        max: usize,
    },
}

/// Version byte of every format in this module.
pub const VERSION: u8 = 1;

/// Size of the REQ private-data area (spec/cm-wire.md §2.1).
pub const REQ_PRIVATE_DATA_LEN: usize = 92;
/// Size of the REP private-data area.
pub const REP_PRIVATE_DATA_LEN: usize = 196;
/// Size of the REJ ARI area.
pub const REJ_ARI_LEN: usize = 72;
/// Maximum number of SRQNs in a REP (196 − 12) / 4 + 1.
pub const MAX_REP_SRQNS: usize = 47;

fn be24(b: &[u8]) -> Option<u32> {
    match b {
        [a, b, c, ..] => Some(u32::from_be_bytes([0, *a, *b, *c])),
        _ => None,
    }
}

fn put_be24(v: u32) -> [u8; 3] {
    let [_, a, b, c] = v.to_be_bytes();
    [a, b, c]
}

fn policy_code(p: Option<OwnershipPolicy>) -> u8 {
    p.map_or(0, OwnershipPolicy::code)
}

fn policy_from(code: u8) -> Result<Option<OwnershipPolicy>, WireError> {
    if code == 0 {
        return Ok(None);
    }
    OwnershipPolicy::from_code(code)
        .map(Some)
        .ok_or(WireError::InvalidField {
            field: "policy",
            value: code.into(),
        })
}

/// What an initiator asks for in a REQ.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReqMode {
    /// `00`: the target picks (reuse its TGT QP for this INI, else create one).
    Any,
    /// `01`: create a new TGT QP.
    Create,
    /// `02`: attach to this TGT QP (a reconnect, or another logical connection over the same
    /// INI→TGT pair).
    Attach(Qpn),
}

/// The XRC part of a REQ's private data (module docs for the bytes).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct XrcReqData {
    /// What the initiator asks for.
    pub mode: ReqMode,
    /// The ownership policy it would like for a new TGT QP (`None`: the target's default).
    pub policy: Option<OwnershipPolicy>,
}

impl XrcReqData {
    /// Header length.
    pub const LEN: usize = 8;

    /// The 8 header bytes.
    pub fn to_bytes(&self) -> [u8; 8] {
        let (mode, qpn) = match self.mode {
            ReqMode::Any => (0, 0),
            ReqMode::Create => (1, 0),
            ReqMode::Attach(q) => (2, q.get()),
        };
        let [q0, q1, q2] = put_be24(qpn);
        [
            0x58,
            0x51,
            VERSION,
            mode,
            q0,
            q1,
            q2,
            policy_code(self.policy),
        ]
    }

    /// Mode "any" (the target reuses its TGT QP for this INI or creates one), asking for
    /// `policy` if a QP is created.
    pub const fn any(policy: Option<OwnershipPolicy>) -> Self {
        Self {
            mode: ReqMode::Any,
            policy,
        }
    }

    /// Mode "create", asking for `policy` (`None`: the target's default).
    pub const fn create(policy: Option<OwnershipPolicy>) -> Self {
        Self {
            mode: ReqMode::Create,
            policy,
        }
    }

    /// Mode "attach to `qpn`" (a reconnect, or another connection over the same INI QP).
    pub const fn attach(qpn: Qpn) -> Self {
        Self {
            mode: ReqMode::Attach(qpn),
            policy: None,
        }
    }

    /// Header followed by `app` (the application's own private data).
    ///
    /// # Errors
    /// [`WireError::TooLong`] if the result exceeds `max` bytes (92 for a raw REQ, 56 after
    /// an rdma_cm header).
    pub fn emit(&self, app: &[u8], max: usize) -> Result<Vec<u8>, WireError> {
        let len = Self::LEN.saturating_add(app.len());
        if len > max {
            return Err(WireError::TooLong { len, max });
        }
        let mut v = Vec::with_capacity(len);
        v.extend_from_slice(&self.to_bytes());
        v.extend_from_slice(app);
        Ok(v)
    }

    /// Parses the header; returns it and the application bytes after it.
    ///
    /// # Errors
    /// [`WireError`]; never panics.
    pub fn parse(b: &[u8]) -> Result<(Self, &[u8]), WireError> {
        let (head, app) = b.split_at_checked(Self::LEN).ok_or(WireError::Truncated {
            need: Self::LEN,
            have: b.len(),
        })?;
        let [m0, m1, ver, mode, q0, q1, q2, pol] = *head else {
            return Err(WireError::Truncated {
                need: Self::LEN,
                have: b.len(),
            });
        };
        if [m0, m1] != [0x58, 0x51] {
            return Err(WireError::NotXrc);
        }
        if ver != VERSION {
            return Err(WireError::UnsupportedVersion(ver));
        }
        let qpn = u32::from_be_bytes([0, q0, q1, q2]);
        let mode = match mode {
            0 => ReqMode::Any,
            1 => ReqMode::Create,
            2 => ReqMode::Attach(Qpn::masked(qpn)),
            other => {
                return Err(WireError::InvalidField {
                    field: "mode",
                    value: other.into(),
                })
            }
        };
        let policy = policy_from(pol)?;
        Ok((Self { mode, policy }, app))
    }
}

/// The XRC part of a REP's private data (module docs for the bytes).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct XrcRepData {
    /// The TGT QPN (also in the REP's Local EECN field).
    pub tgt_qpn: Qpn,
    /// The TGT QP's ownership policy.
    pub policy: OwnershipPolicy,
    /// Whether the TGT QP was created for this REQ (`false`: an existing one was attached).
    pub created: bool,
    /// The accepting process's XRC SRQ numbers; at least one, at most [`MAX_REP_SRQNS`].
    pub srqns: Vec<SrqNum>,
}

impl XrcRepData {
    /// Length of the encoding without application data.
    pub fn len(&self) -> usize {
        12usize.saturating_add(4usize.saturating_mul(self.srqns.len().saturating_sub(1)))
    }

    /// Always `false` (an encoding has at least 12 bytes); present for clippy's `len` rule.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The encoding followed by `app`.
    ///
    /// # Errors
    /// [`WireError::InvalidField`] for zero or more than 47 SRQNs; [`WireError::TooLong`] if
    /// the result exceeds the 196-byte REP area.
    pub fn emit(&self, app: &[u8]) -> Result<Vec<u8>, WireError> {
        let n = self.srqns.len();
        let Some((first, rest)) = self.srqns.split_first() else {
            return Err(WireError::InvalidField {
                field: "srqn count",
                value: 0,
            });
        };
        if n > MAX_REP_SRQNS {
            return Err(WireError::InvalidField {
                field: "srqn count",
                value: u32::try_from(n).unwrap_or(u32::MAX),
            });
        }
        let len = self.len().saturating_add(app.len());
        if len > REP_PRIVATE_DATA_LEN {
            return Err(WireError::TooLong {
                len,
                max: REP_PRIVATE_DATA_LEN,
            });
        }
        let mut v = Vec::with_capacity(len);
        v.extend_from_slice(&first.get().to_be_bytes());
        v.extend_from_slice(&[0x58, 0x50, VERSION]);
        // n <= 47 was checked above.
        v.push(u8::try_from(n).unwrap_or(0));
        v.extend_from_slice(&put_be24(self.tgt_qpn.get()));
        v.push(self.policy.code() | if self.created { 0x10 } else { 0 });
        for s in rest {
            v.extend_from_slice(&s.get().to_be_bytes());
        }
        v.extend_from_slice(app);
        Ok(v)
    }

    /// Parses the encoding; returns it and the application bytes after it.
    ///
    /// # Errors
    /// [`WireError`]; never panics.
    pub fn parse(b: &[u8]) -> Result<(Self, &[u8]), WireError> {
        let (head, tail) = b.split_at_checked(12).ok_or(WireError::Truncated {
            need: 12,
            have: b.len(),
        })?;
        let [s0, s1, s2, s3, m0, m1, ver, n, q0, q1, q2, flags] = *head else {
            return Err(WireError::Truncated {
                need: 12,
                have: b.len(),
            });
        };
        if [m0, m1] != [0x58, 0x50] {
            return Err(WireError::NotXrc);
        }
        if ver != VERSION {
            return Err(WireError::UnsupportedVersion(ver));
        }
        let n = usize::from(n);
        if n == 0 || n > MAX_REP_SRQNS {
            return Err(WireError::InvalidField {
                field: "srqn count",
                value: u32::try_from(n).unwrap_or(u32::MAX),
            });
        }
        let srqn = |bytes: [u8; 4]| {
            let v = u32::from_be_bytes(bytes);
            SrqNum::new(v).ok_or(WireError::InvalidField {
                field: "srqn",
                value: v,
            })
        };
        let mut srqns = Vec::with_capacity(n);
        srqns.push(srqn([s0, s1, s2, s3])?);
        let more = 4usize.saturating_mul(n.saturating_sub(1));
        let (list, app) = tail.split_at_checked(more).ok_or(WireError::Truncated {
            need: 12usize.saturating_add(more),
            have: b.len(),
        })?;
        for c in list.chunks_exact(4) {
            if let [a, b2, c2, d] = *c {
                srqns.push(srqn([a, b2, c2, d])?);
            }
        }
        if flags & 0xe0 != 0 {
            return Err(WireError::InvalidField {
                field: "flags",
                value: flags.into(),
            });
        }
        let policy = OwnershipPolicy::from_code(flags & 0x0f).ok_or(WireError::InvalidField {
            field: "policy",
            value: (flags & 0x0f).into(),
        })?;
        let tgt_qpn = Qpn::masked(u32::from_be_bytes([0, q0, q1, q2]));
        Ok((
            Self {
                tgt_qpn,
                policy,
                created: flags & 0x10 != 0,
                srqns,
            },
            app,
        ))
    }

    /// Reads only the first SRQN the way `rdma_xclient` does (4 bytes, big-endian), whether
    /// or not the rest is ibcm's format.
    pub fn first_srqn_compat(b: &[u8]) -> Option<SrqNum> {
        match b {
            [a, b1, c, d, ..] => SrqNum::new(u32::from_be_bytes([*a, *b1, *c, *d])),
            _ => None,
        }
    }
}

/// Why a TGT QP went away (the `cause` byte of [`TargetGone`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum GoneCause {
    /// `01`: its owner destroyed it.
    OwnerDestroyed,
    /// `02`: its domain was closed.
    DomainClosed,
    /// `03`: the process that created it exited.
    CreatorExited,
    /// `04`: the last registered process unregistered (or died).
    LastUnregistered,
    /// `05`: the keeper that held it was lost (crash or restart).
    KeeperLost,
    /// `06`: the last connection that held a registration on it left (peer DREQ or timeout).
    PeerLeft,
    /// `07`: no such TGT QP is known (never existed, or forgotten after quarantine).
    Unknown,
}

impl GoneCause {
    /// The wire code.
    pub const fn code(self) -> u8 {
        match self {
            Self::OwnerDestroyed => 1,
            Self::DomainClosed => 2,
            Self::CreatorExited => 3,
            Self::LastUnregistered => 4,
            Self::KeeperLost => 5,
            Self::PeerLeft => 6,
            Self::Unknown => 7,
        }
    }

    /// The cause for a wire code.
    pub const fn from_code(c: u8) -> Option<Self> {
        Some(match c {
            1 => Self::OwnerDestroyed,
            2 => Self::DomainClosed,
            3 => Self::CreatorExited,
            4 => Self::LastUnregistered,
            5 => Self::KeeperLost,
            6 => Self::PeerLeft,
            7 => Self::Unknown,
            _ => return None,
        })
    }

    /// Human-readable text.
    pub const fn text(self) -> &'static str {
        match self {
            Self::OwnerDestroyed => "owner destroyed it",
            Self::DomainClosed => "domain closed",
            Self::CreatorExited => "creator exited",
            Self::LastUnregistered => "last registration dropped",
            Self::KeeperLost => "keeper lost",
            Self::PeerLeft => "last connection left",
            Self::Unknown => "no such TGT QP",
        }
    }
}

impl fmt::Display for GoneCause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.text())
    }
}

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

/// The 12-byte ARI / private-data block of an XRC REJ (module docs for the bytes).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TargetGone {
    /// What happened.
    pub kind: RejectKind,
    /// The TGT QPN the REQ named (`None` if it named none).
    pub qpn: Option<Qpn>,
}

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
        let (kind, cause) = match self.kind {
            RejectKind::Gone(c) => (1, c.code()),
            RejectKind::AttachRefused => (2, 0),
            RejectKind::NoResources => (3, 0),
        };
        let [q0, q1, q2] = put_be24(self.qpn.map_or(0, Qpn::get));
        [0x58, 0x52, 0x43, VERSION, kind, cause, 0, 0, q0, q1, q2, 0]
    }

    /// Parses the block from an ARI or from the start of REJ private data; `None` if the
    /// bytes are not this format. Never panics.
    pub fn parse(b: &[u8]) -> Option<Self> {
        let head = b.get(..Self::LEN)?;
        let [0x58, 0x52, 0x43, VERSION, kind, cause, _, _, q0, q1, q2, _] = *head else {
            return None;
        };
        let kind = match kind {
            1 => RejectKind::Gone(GoneCause::from_code(cause)?),
            2 => RejectKind::AttachRefused,
            3 => RejectKind::NoResources,
            _ => return None,
        };
        let q = be24(&[q0, q1, q2]).unwrap_or(0);
        Some(Self {
            kind,
            qpn: (q != 0).then(|| Qpn::masked(q)),
        })
    }
}

impl fmt::Display for TargetGone {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.kind {
            RejectKind::Gone(c) => write!(f, "target gone ({c})")?,
            RejectKind::AttachRefused => f.write_str("attach refused")?,
            RejectKind::NoResources => f.write_str("no TGT QP available")?,
        }
        if let Some(q) = self.qpn {
            write!(f, " qpn {q}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn qpn(v: u32) -> Qpn {
        Qpn::new(v).unwrap()
    }
    fn srqn(v: u32) -> SrqNum {
        SrqNum::new(v).unwrap()
    }

    #[test]
    fn req_bytes() {
        let r = XrcReqData {
            mode: ReqMode::Attach(qpn(0x12_3456)),
            policy: Some(OwnershipPolicy::Shared),
        };
        assert_eq!(r.to_bytes(), [0x58, 0x51, 1, 2, 0x12, 0x34, 0x56, 4]);
        let b = r.emit(b"app", REQ_PRIVATE_DATA_LEN).unwrap();
        let (back, app) = XrcReqData::parse(&b).unwrap();
        assert_eq!((back, app), (r, &b"app"[..]));
        let any = XrcReqData {
            mode: ReqMode::Any,
            policy: None,
        };
        assert_eq!(any.to_bytes(), [0x58, 0x51, 1, 0, 0, 0, 0, 0]);
        assert_eq!(XrcReqData::parse(&[0u8; 92]), Err(WireError::NotXrc));
        assert_eq!(
            any.emit(&[0; 49], 56),
            Err(WireError::TooLong { len: 57, max: 56 })
        );
    }

    #[test]
    fn req_bad_fields() {
        let mut b = XrcReqData {
            mode: ReqMode::Create,
            policy: None,
        }
        .to_bytes();
        b[3] = 9;
        assert!(matches!(
            XrcReqData::parse(&b),
            Err(WireError::InvalidField { field: "mode", .. })
        ));
        b[3] = 1;
        b[7] = 5;
        assert!(matches!(
            XrcReqData::parse(&b),
            Err(WireError::InvalidField {
                field: "policy",
                ..
            })
        ));
        b[7] = 0;
        b[2] = 2;
        assert_eq!(XrcReqData::parse(&b), Err(WireError::UnsupportedVersion(2)));
    }

    #[test]
    fn rep_bytes_and_rdma_xclient_compat() {
        let r = XrcRepData {
            tgt_qpn: qpn(0x00_0a0b),
            policy: OwnershipPolicy::DomainBound,
            created: true,
            srqns: vec![srqn(0x00_1234), srqn(0x00_5678)],
        };
        let b = r.emit(b"hi").unwrap();
        assert_eq!(
            b,
            [
                0x00, 0x00, 0x12, 0x34, 0x58, 0x50, 1, 2, 0x00, 0x0a, 0x0b, 0x12, 0x00, 0x00, 0x56,
                0x78, b'h', b'i'
            ]
        );
        assert_eq!(XrcRepData::first_srqn_compat(&b), Some(srqn(0x1234)));
        let mut area = [0u8; REP_PRIVATE_DATA_LEN];
        area[..b.len()].copy_from_slice(&b);
        let (back, app) = XrcRepData::parse(&area).unwrap();
        assert_eq!(back, r);
        assert_eq!(&app[..2], b"hi");
    }

    #[test]
    fn rep_limits() {
        let mut r = XrcRepData {
            tgt_qpn: qpn(1),
            policy: OwnershipPolicy::Shared,
            created: false,
            srqns: vec![],
        };
        assert!(r.emit(&[]).is_err());
        r.srqns = (0..47).map(srqn).collect();
        let b = r.emit(&[]).unwrap();
        assert_eq!(b.len(), 196);
        assert_eq!(XrcRepData::parse(&b).unwrap().0.srqns.len(), 47);
        assert!(matches!(r.emit(b"x"), Err(WireError::TooLong { .. })));
        r.srqns.push(srqn(99));
        assert!(r.emit(&[]).is_err());
    }

    #[test]
    fn rep_parse_rejects_garbage_without_panicking() {
        for len in 0..40 {
            let v = vec![0xffu8; len];
            let _ = XrcRepData::parse(&v);
            let _ = XrcReqData::parse(&v);
            let _ = TargetGone::parse(&v);
        }
        // Count says 3 SRQNs but only one more is present.
        let mut b = XrcRepData {
            tgt_qpn: qpn(1),
            policy: OwnershipPolicy::Shared,
            created: false,
            srqns: vec![srqn(1), srqn(2)],
        }
        .emit(&[])
        .unwrap();
        b[7] = 3;
        assert!(matches!(
            XrcRepData::parse(&b),
            Err(WireError::Truncated { need: 20, have: 16 })
        ));
        // SRQN with a non-zero top byte.
        b[7] = 2;
        b[12] = 1;
        assert!(matches!(
            XrcRepData::parse(&b),
            Err(WireError::InvalidField { field: "srqn", .. })
        ));
    }

    #[test]
    fn random_bytes_never_panic() {
        // Deterministic xorshift; includes the markers so the deeper paths are reached.
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for i in 0..20_000u64 {
            let len = (next() % 200) as usize;
            let mut b: Vec<u8> = (0..len).map(|_| next() as u8).collect();
            match i % 4 {
                1 if b.len() >= 8 => b[..3].copy_from_slice(&[0x58, 0x51, 1]),
                2 if b.len() >= 12 => b[4..7].copy_from_slice(&[0x58, 0x50, 1]),
                3 if b.len() >= 12 => b[..4].copy_from_slice(&[0x58, 0x52, 0x43, 1]),
                _ => {}
            }
            let _ = XrcReqData::parse(&b);
            let _ = XrcRepData::parse(&b);
            let _ = TargetGone::parse(&b);
            let _ = XrcRepData::first_srqn_compat(&b);
        }
    }

    #[test]
    fn target_gone_kinds() {
        for cause in 1..=7 {
            let c = GoneCause::from_code(cause).unwrap();
            let g = TargetGone::gone(c, qpn(0x77));
            assert_eq!(TargetGone::parse(&g.to_bytes()), Some(g));
            assert!(g.is_gone());
        }
        let r = TargetGone {
            kind: RejectKind::AttachRefused,
            qpn: Some(qpn(5)),
        };
        assert_eq!(r.reason(), RejReason::ConsumerReject);
        assert!(!r.is_gone());
        assert_eq!(TargetGone::parse(&r.to_bytes()), Some(r));
        let n = TargetGone {
            kind: RejectKind::NoResources,
            qpn: None,
        };
        assert_eq!(n.reason(), RejReason::NoResources);
        assert_eq!(TargetGone::parse(&n.to_bytes()), Some(n));
        assert_eq!(TargetGone::parse(&[0u8; 72]), None);
        assert_eq!(
            TargetGone::gone(GoneCause::KeeperLost, qpn(0x10)).to_string(),
            "target gone (keeper lost) qpn 0x000010"
        );
    }
}
