//! Error types of the MAD codec. Every variant says *where* (a byte offset) and *why*.

use crate::types::PrivateDataTooLong;

pub use crate::frame::FrameError;

/// Why a MAD could not be parsed.
///
/// Offsets are from the start of the MAD (byte 0 = BaseVersion). Unknown codes (REJ reasons,
/// attribute IDs, …) are never errors; they parse to `Unknown(raw)` variants.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ParseError {
    /// The input ends before the structure does.
    #[error("truncated at byte {offset}: need {need} bytes, have {have}")]
    Truncated {
        /// Offset at which the missing bytes start.
        offset: usize,
        /// Bytes needed from `offset` on.
        need: usize,
        /// Bytes available from `offset` on.
        have: usize,
    },
    /// BaseVersion is not 1.
    #[error("bad MAD base version {value} at byte {offset} (expected 1)")]
    BadBaseVersion {
        /// Always 0.
        offset: usize,
        /// The value found.
        value: u8,
    },
    /// The management class is not CM (0x07).
    #[error("management class {value:#04x} at byte {offset} is not CM (0x07)")]
    NotCmClass {
        /// Always 1.
        offset: usize,
        /// The value found.
        value: u8,
    },
    /// The CM class version is not 2 (Linux drops such MADs silently).
    #[error("unsupported CM class version {value} at byte {offset} (expected 2)")]
    UnsupportedClassVersion {
        /// Always 2.
        offset: usize,
        /// The value found.
        value: u8,
    },
    /// A field holds a value the codec cannot accept (e.g. a method other than Send on a CM
    /// connection message).
    #[error("invalid {field} = {value:#x} at byte {offset}")]
    InvalidField {
        /// The field's name as in docs/wire.md.
        field: &'static str,
        /// The value found.
        value: u64,
        /// Offset of the field.
        offset: usize,
    },
}

impl ParseError {
    /// Byte offset of the problem.
    pub fn offset(&self) -> usize {
        match *self {
            ParseError::Truncated { offset, .. }
            | ParseError::BadBaseVersion { offset, .. }
            | ParseError::NotCmClass { offset, .. }
            | ParseError::UnsupportedClassVersion { offset, .. }
            | ParseError::InvalidField { offset, .. } => offset,
        }
    }
}

/// Why a message could not be emitted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EmitError {
    /// The output buffer is smaller than the message.
    #[error("buffer too small: need {need} bytes, have {have}")]
    BufferTooSmall {
        /// Bytes the message needs.
        need: usize,
        /// Bytes available.
        have: usize,
    },
    /// Private data longer than the message's fixed area.
    #[error(transparent)]
    PrivateDataTooLong(#[from] PrivateDataTooLong),
    /// A field value that cannot be represented on the wire.
    #[error("{field} = {value:#x} does not fit its wire field")]
    FieldOutOfRange {
        /// The field's name.
        field: &'static str,
        /// The offending value.
        value: u64,
    },
}
