//! What ibcm puts in CM private data and REJ ARI for XRC: three small, versioned formats, and
//! the wire values they carry ([`OwnershipPolicy`], [`GoneCause`], [`SrqNum`]).
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
//! | 8 | 3 | TGT QPN, 24-bit big-endian (the same value as the REP's Local EECN; docs/wire.md §3.2) |
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
//! | 4 | 1 | kind: `01` target gone, `02` attach refused (the TGT QP serves another initiator), `03` no TGT QP could be created, `04` the target's service is misconfigured |
//! | 5 | 1 | cause, for kind `01` ([`GoneCause`]): `01` owner destroyed it, `02` domain closed, `03` creator exited, `04` last registration dropped, `05` keeper lost, `06` last connection-scoped registration left (peer DREQ/timeout), `07` never existed or forgotten; for kind `04` ([`ServiceFault`]): `01` unknown XRC domain, `02` no SRQ number, `03` more than 47 SRQ numbers; `00` otherwise |
//! | 6 | 2 | zero |
//! | 8 | 3 | the TGT QPN the REQ named, 24-bit big-endian (zero if none) |
//! | 11 | 1 | zero |
//!
//! When a TGT QP goes away under an **established** connection, the target's DREQ carries
//! the same 12 bytes (kind `01`, the cause, the QPN) as its private data, so the initiator
//! learns why it was disconnected; a peer that does not know the format sees an ordinary
//! DREQ.
//!
//! Why reason 1 and not 28: rdma_cm answers every application refusal with 28 (consumer
//! defined), so 28 cannot carry "gone" without a private-data convention every peer must
//! know; "No QP available" already means "no QP here to accept you". An ibcm initiator checks
//! the marker and treats kind `01` as "the TGT QP is gone, drop the cached TGT QPN and connect
//! anew (mode `00`/`01`)", anything else as a refusal. Kind `02` uses reason 28, kind `03`
//! reason 3 ("No resources"), kind `04` reason 28.
//!
//! # Decoding for display
//!
//! [`XrcBlock::find`] picks the format a message's private data (or a REJ's ARI) may carry
//! and parses it; [`XrcBlock::fields`] lists its fields in wire order (offset, length, name,
//! value) for a field-by-field printout.
//!
//! ```
//! use ibcm_mad::xrc::{GoneCause, RejectKind, TargetGone};
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

mod fields;
mod gone;
mod rep;
mod req;
#[cfg(test)]
mod tests;
mod values;

pub use fields::{XrcBlock, XrcField};
pub use gone::{RejectKind, ServiceFault, TargetGone};
pub use rep::XrcRepData;
pub use req::{ReqMode, XrcReqData};
pub use values::{GoneCause, OwnershipPolicy, SrqNum};

#[cfg(doc)]
use crate::RejReason;

/// Errors building or parsing the XRC formats.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum XrcDataError {
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
    /// The result does not fit the message's private-data area (or the output buffer).
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

/// Size of the REQ private-data area (docs/wire.md §2.1).
pub const REQ_PRIVATE_DATA_LEN: usize = 92;
/// Size of the REP private-data area.
pub const REP_PRIVATE_DATA_LEN: usize = 196;
/// Size of the REJ ARI area.
pub const REJ_ARI_LEN: usize = 72;
/// Maximum number of SRQNs in a REP (196 − 12) / 4 + 1.
pub const MAX_REP_SRQNS: usize = 47;

fn put_be24(v: u32) -> [u8; 3] {
    let [_, a, b, c] = v.to_be_bytes();
    [a, b, c]
}

/// Copies `parts` one after the other to the start of `out`; the total length.
fn write_parts(out: &mut [u8], parts: &[&[u8]]) -> Result<usize, XrcDataError> {
    let len = parts
        .iter()
        .map(|p| p.len())
        .fold(0usize, usize::saturating_add);
    let have = out.len();
    let dst = out
        .get_mut(..len)
        .ok_or(XrcDataError::TooLong { len, max: have })?;
    let mut at = 0usize;
    for p in parts {
        let end = at.saturating_add(p.len());
        if let Some(d) = dst.get_mut(at..end) {
            d.copy_from_slice(p);
        }
        at = end;
    }
    Ok(len)
}
