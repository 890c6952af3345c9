//! [`XrcRepData`]: the XRC part of a REP's private data (module docs of `xrc` for the bytes).

use super::{
    put_be24, write_parts, OwnershipPolicy, SrqNum, XrcDataError, MAX_REP_SRQNS,
    REP_PRIVATE_DATA_LEN, VERSION,
};
use crate::types::Qpn;

/// The XRC part of a REP's private data (module docs of `xrc` for the bytes).
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

const MARKER: [u8; 2] = [0x58, 0x50];
/// Bit 4 of the flags byte: the TGT QP was created for this REQ.
const CREATED: u8 = 0x10;

fn srqn_count(n: usize) -> XrcDataError {
    XrcDataError::InvalidField {
        field: "srqn count",
        value: u32::try_from(n).unwrap_or(u32::MAX),
    }
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

    /// The flags byte (offset 11): policy code, bit 4 = created.
    pub fn flags(&self) -> u8 {
        self.policy.code() | if self.created { CREATED } else { 0 }
    }

    /// Writes the encoding followed by `app` at the start of `out`; the length written.
    ///
    /// # Errors
    /// [`XrcDataError::InvalidField`] for zero or more than 47 SRQNs;
    /// [`XrcDataError::TooLong`] if `out` is too short.
    pub fn write(&self, app: &[u8], out: &mut [u8]) -> Result<usize, XrcDataError> {
        let n = self.srqns.len();
        let Some((first, rest)) = self.srqns.split_first() else {
            return Err(srqn_count(0));
        };
        if n > MAX_REP_SRQNS {
            return Err(srqn_count(n));
        }
        let [m0, m1] = MARKER;
        let [q0, q1, q2] = put_be24(self.tgt_qpn.get());
        // n <= 47 was checked above.
        let count = u8::try_from(n).unwrap_or(0);
        let head = [m0, m1, VERSION, count, q0, q1, q2, self.flags()];
        let mut more = [0u8; 4 * (MAX_REP_SRQNS - 1)];
        for (slot, s) in more.chunks_exact_mut(4).zip(rest) {
            slot.copy_from_slice(&s.get().to_be_bytes());
        }
        let more = more.get(..4 * rest.len()).unwrap_or(&[]);
        write_parts(out, &[&first.get().to_be_bytes(), &head, more, app])
    }

    /// The encoding followed by `app`.
    ///
    /// # Errors
    /// [`XrcDataError::InvalidField`] for zero or more than 47 SRQNs;
    /// [`XrcDataError::TooLong`] if the result exceeds the 196-byte REP area.
    pub fn emit(&self, app: &[u8]) -> Result<Vec<u8>, XrcDataError> {
        let n = self.srqns.len();
        if n == 0 || n > MAX_REP_SRQNS {
            return Err(srqn_count(n));
        }
        let len = self.len().saturating_add(app.len());
        if len > REP_PRIVATE_DATA_LEN {
            return Err(XrcDataError::TooLong {
                len,
                max: REP_PRIVATE_DATA_LEN,
            });
        }
        let mut v = vec![0u8; len];
        self.write(app, &mut v)?;
        Ok(v)
    }

    /// Parses the encoding; returns it and the application bytes after it.
    ///
    /// # Errors
    /// [`XrcDataError`]; never panics.
    pub fn parse(b: &[u8]) -> Result<(Self, &[u8]), XrcDataError> {
        let Some((head, tail)) = b.split_first_chunk::<12>() else {
            return Err(XrcDataError::Truncated {
                need: 12,
                have: b.len(),
            });
        };
        let [s0, s1, s2, s3, m0, m1, ver, n, q0, q1, q2, flags] = *head;
        if [m0, m1] != MARKER {
            return Err(XrcDataError::NotXrc);
        }
        if ver != VERSION {
            return Err(XrcDataError::UnsupportedVersion(ver));
        }
        let n = usize::from(n);
        if n == 0 || n > MAX_REP_SRQNS {
            return Err(srqn_count(n));
        }
        let srqn = |bytes: [u8; 4]| {
            let v = u32::from_be_bytes(bytes);
            SrqNum::new(v).ok_or(XrcDataError::InvalidField {
                field: "srqn",
                value: v,
            })
        };
        let mut srqns = Vec::with_capacity(n);
        srqns.push(srqn([s0, s1, s2, s3])?);
        let more = 4usize.saturating_mul(n.saturating_sub(1));
        let (list, app) = tail.split_at_checked(more).ok_or(XrcDataError::Truncated {
            need: 12usize.saturating_add(more),
            have: b.len(),
        })?;
        for c in list.chunks_exact(4) {
            if let [a, b2, c2, d] = *c {
                srqns.push(srqn([a, b2, c2, d])?);
            }
        }
        if flags & 0xe0 != 0 {
            return Err(XrcDataError::InvalidField {
                field: "flags",
                value: flags.into(),
            });
        }
        let policy =
            OwnershipPolicy::from_code(flags & 0x0f).ok_or(XrcDataError::InvalidField {
                field: "policy",
                value: (flags & 0x0f).into(),
            })?;
        let tgt_qpn = Qpn::masked(u32::from_be_bytes([0, q0, q1, q2]));
        Ok((
            Self {
                tgt_qpn,
                policy,
                created: flags & CREATED != 0,
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
