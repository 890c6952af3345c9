//! [`XrcReqData`]: the XRC part of a REQ's private data (module docs of `xrc` for the bytes).

use core::fmt;

use super::values::{policy_code, policy_from};
use super::{put_be24, write_parts, OwnershipPolicy, XrcDataError, VERSION};
use crate::types::Qpn;

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

impl ReqMode {
    /// The mode byte.
    pub const fn code(self) -> u8 {
        match self {
            Self::Any => 0,
            Self::Create => 1,
            Self::Attach(_) => 2,
        }
    }
}

impl fmt::Display for ReqMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Any => f.write_str("any"),
            Self::Create => f.write_str("create"),
            Self::Attach(q) => write!(f, "attach {q}"),
        }
    }
}

/// The XRC part of a REQ's private data (module docs of `xrc` for the bytes).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct XrcReqData {
    /// What the initiator asks for.
    pub mode: ReqMode,
    /// The ownership policy it would like for a new TGT QP (`None`: the target's default).
    pub policy: Option<OwnershipPolicy>,
}

const MARKER: [u8; 2] = [0x58, 0x51];

impl XrcReqData {
    /// Header length.
    pub const LEN: usize = 8;

    /// The 8 header bytes.
    pub fn to_bytes(&self) -> [u8; 8] {
        let qpn = match self.mode {
            ReqMode::Attach(q) => q.get(),
            ReqMode::Any | ReqMode::Create => 0,
        };
        let [m0, m1] = MARKER;
        let [q0, q1, q2] = put_be24(qpn);
        [
            m0,
            m1,
            VERSION,
            self.mode.code(),
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

    /// Writes the header followed by `app` at the start of `out`; the length written.
    ///
    /// # Errors
    /// [`XrcDataError::TooLong`] if `out` is too short.
    pub fn write(&self, app: &[u8], out: &mut [u8]) -> Result<usize, XrcDataError> {
        write_parts(out, &[&self.to_bytes(), app])
    }

    /// Header followed by `app` (the application's own private data).
    ///
    /// # Errors
    /// [`XrcDataError::TooLong`] if the result exceeds `max` bytes (92 for a raw REQ, 56
    /// after an rdma_cm header).
    pub fn emit(&self, app: &[u8], max: usize) -> Result<Vec<u8>, XrcDataError> {
        let len = Self::LEN.saturating_add(app.len());
        if len > max {
            return Err(XrcDataError::TooLong { len, max });
        }
        let mut v = vec![0u8; len];
        self.write(app, &mut v)?;
        Ok(v)
    }

    /// Parses the header; returns it and the application bytes after it.
    ///
    /// # Errors
    /// [`XrcDataError`]; never panics.
    pub fn parse(b: &[u8]) -> Result<(Self, &[u8]), XrcDataError> {
        let Some((head, app)) = b.split_first_chunk::<{ Self::LEN }>() else {
            return Err(XrcDataError::Truncated {
                need: Self::LEN,
                have: b.len(),
            });
        };
        let [m0, m1, ver, mode, q0, q1, q2, pol] = *head;
        if [m0, m1] != MARKER {
            return Err(XrcDataError::NotXrc);
        }
        if ver != VERSION {
            return Err(XrcDataError::UnsupportedVersion(ver));
        }
        let qpn = u32::from_be_bytes([0, q0, q1, q2]);
        let mode = match mode {
            0 => ReqMode::Any,
            1 => ReqMode::Create,
            2 => ReqMode::Attach(Qpn::masked(qpn)),
            other => {
                return Err(XrcDataError::InvalidField {
                    field: "mode",
                    value: other.into(),
                })
            }
        };
        let policy = policy_from(pol)?;
        Ok((Self { mode, policy }, app))
    }
}
