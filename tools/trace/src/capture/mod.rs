//! Capture files: streaming pcap / pcapng reading, raw ERF record files, and a small pcap
//! writer (docs/framing.md §3.3, §5.1).
//!
//! [`CaptureReader`] detects the format from the magic number (pcap with µs or ns timestamps
//! in either byte order; pcapng with any number of sections, per-interface link types,
//! `if_tsresol` and `if_tsoffset`; unknown block types are skipped). It reads through its own
//! bounded buffer, so memory stays constant on multi-GB files and stdin, and
//! [`CaptureReader::next_record`] returns records that borrow that buffer: no allocation per
//! packet.
//!
//! A damaged record header or block in the middle of the file is skipped: the reader scans
//! on for the next plausible record header (`resync`) and `next_record` returns one
//! [`CaptureError::Skipped`] naming the damaged record, its offset and the bytes skipped, then
//! the records after it. After any other error (a truncated last record, an I/O error) it
//! returns that error once, then `None`.
//!
//! Frame data is handed over as captured; use [`ibcm_mad::frame::decode`] with
//! [`Record::link_type`] to get to the packet (the link-layer decoding is codec work and lives
//! in `ibcm-mad`; this module only reads files and streams).
//!
//! Who parses what:
//! * `reader`: the pcap file header (pcap-file), then each 16-byte pcap record header at fixed
//!   offsets: this is the per-packet hot path that the cm-trace vs tshark benchmark measures.
//! * `pcapng`: with nom, the block framing, section headers, interface descriptions and their
//!   options (`if_tsresol`, `if_tsoffset`), and the packet blocks (EPB, obsolete PB, SPB).
//! * `erf`: raw ERF record files; the record header with nom.
//! * `writer`: classic pcap output (pcap-file).

use std::error::Error as StdError;
use std::fmt;
use std::io;
use std::time::Duration;

mod buffer;
pub(crate) mod erf;
mod pcapng;
mod reader;
mod resync;
mod step;
mod writer;

#[cfg(test)]
mod tests;

pub use reader::CaptureReader;
pub use writer::PcapFileWriter;

/// Largest record (pcap record or pcapng block) accepted.
pub const MAX_RECORD_LEN: usize = 64 << 20;

/// Timestamp resolution of a classic pcap file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TsResolution {
    /// Microseconds (magic 0xA1B2C3D4).
    Micro,
    /// Nanoseconds (magic 0xA1B23C4D).
    Nano,
}

/// The format of a capture file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CaptureFormat {
    /// Classic pcap.
    Pcap {
        /// Timestamp resolution.
        resolution: TsResolution,
        /// Whether the file is big-endian.
        big_endian: bool,
    },
    /// pcapng (resolution and link type are per interface).
    PcapNg,
}

/// An error reading the next record of a capture (a file's or a live one's): it ends the
/// input unless `resumes`.
#[derive(Debug)]
pub(crate) struct RecordError {
    /// What happened, with the record number and byte offset.
    pub(crate) msg: String,
    /// The file is damaged before its end (an impossible record header, an I/O error), so
    /// the bytes up to the next plausible record header (or the rest of it) were skipped;
    /// `false` for a last record cut short (a capture copied while being written), which loses
    /// nothing else.
    pub(crate) damaged: bool,
    /// Reading goes on after it (a plausible record header was found after the damage).
    pub(crate) resumes: bool,
    /// Bytes skipped over the damage.
    pub(crate) skipped: u64,
}

/// One captured packet, borrowing the reader's buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Record<'a> {
    /// Frame number, 1-based (as Wireshark counts; pcapng non-packet blocks are not counted).
    pub number: u64,
    /// Capture time since the Unix epoch (pcapng: per-interface resolution and offset
    /// applied; Simple Packet Blocks carry none and get zero).
    pub timestamp: Duration,
    /// Link type as stored (classic pcap: the whole header field, FCS bits included —
    /// [`ibcm_mad::frame::decode`] masks them; pcapng: the interface's link type).
    pub link_type: u32,
    /// pcapng interface ID (0 for classic pcap).
    pub interface: u32,
    /// Length of the packet on the wire.
    pub orig_len: u32,
    /// The captured bytes (shorter than `orig_len` when the snaplen cut the packet).
    pub data: &'a [u8],
}

impl Record<'_> {
    /// Whether the capture cut the packet short (`data.len() < orig_len`).
    pub fn is_truncated(&self) -> bool {
        u64::try_from(self.data.len()).is_ok_and(|n| n < u64::from(self.orig_len))
    }
}

/// Names the file header (record 0) or a record in error messages.
struct Which(u64);

impl fmt::Display for Which {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            0 => f.write_str("file header"),
            n => write!(f, "record {n}"),
        }
    }
}

/// The end of a [`CaptureError::Skipped`] message.
struct Resync(u64, u64, bool);

impl fmt::Display for Resync {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Resync(skipped, offset, resumed) = *self;
        if resumed {
            write!(
                f,
                "skipped {skipped} bytes to the next plausible record header, at byte {}",
                offset + skipped
            )
        } else {
            write!(
                f,
                "skipped the last {skipped} bytes: no plausible record header after it"
            )
        }
    }
}

/// Why a capture could not be read or written.
///
/// `number` is the 1-based number the failing record would have had (0 = the file header);
/// `offset` is the byte offset in the file where it starts.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CaptureError {
    /// Reading or opening failed.
    #[error("I/O error at byte {offset}: {source}")]
    Io {
        /// Byte offset reached.
        offset: u64,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
    /// The file starts with neither a pcap nor a pcapng magic number.
    #[error("not a pcap or pcapng file (magic {magic:#010x})")]
    UnknownFormat {
        /// The first four bytes, big-endian.
        magic: u32,
    },
    /// The file ends inside a record (or inside the file header).
    #[error("{} at byte {offset} is truncated: the file ends {have} bytes into it", Which(*number))]
    Truncated {
        /// Record number (0 = file header).
        number: u64,
        /// Offset of the record.
        offset: u64,
        /// Bytes present.
        have: usize,
    },
    /// A record or block is malformed.
    #[error("{} at byte {offset} is malformed: {reason}", Which(*number))]
    Malformed {
        /// Record number (0 = file header).
        number: u64,
        /// Offset of the record or block.
        offset: u64,
        /// What is wrong.
        reason: String,
    },
    /// A record or block claims more than [`MAX_RECORD_LEN`] bytes. (The reader now reports
    /// such a record as [`CaptureError::Skipped`] and reads on; kept for compatibility.)
    #[error("{} at byte {offset} claims {len} bytes (more than {max})", Which(*number))]
    TooLarge {
        /// Record number.
        number: u64,
        /// Offset of the record or block.
        offset: u64,
        /// Claimed length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// A damaged record header (or block) in the middle of the file: the reader skipped
    /// `skipped` bytes from `offset` to the next plausible record header (`resumed`) and
    /// reads on from there, or to the end of the file (no plausible header after it). The
    /// damaged record keeps its number and the records found after it are numbered on from
    /// `number + 1` (how many records the skipped bytes held is unknown).
    #[error("{} at byte {offset} is damaged ({reason}): {}", Which(*number), Resync(*skipped, *offset, *resumed))]
    Skipped {
        /// Number the damaged record would have had.
        number: u64,
        /// Offset of the damaged record or block.
        offset: u64,
        /// Bytes skipped.
        skipped: u64,
        /// What was wrong with it.
        reason: String,
        /// Whether a plausible record header was found (reading goes on from it).
        resumed: bool,
    },
    /// Writing a capture failed.
    #[error("writing the capture failed: {reason}")]
    Write {
        /// What went wrong.
        reason: String,
    },
}

/// An error and its sources, joined with ": ".
fn chain(e: &dyn StdError) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}
