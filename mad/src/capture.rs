//! Capture files: streaming pcap / pcapng reading and a small pcap writer (spec/framing.md
//! §3.3, §5.1), on top of `pcap-file` 3.0.0-rc.3.
//!
//! [`CaptureReader`] detects the format from the magic number (pcap with µs or ns timestamps
//! in either byte order; pcapng with any number of sections, per-interface link types,
//! `if_tsresol` and `if_tsoffset`; unknown block types are skipped). It reads through its own
//! bounded buffer, so memory stays constant on multi-GB files and stdin, and
//! [`CaptureReader::next_record`] returns records that borrow that buffer: no allocation per
//! packet. pcap-file's slice parsers do the format work.
//!
//! After an unrecoverable error (a truncated last record, a corrupt block) `next_record`
//! returns that error once, then `None`: every good record before the error is delivered.
//!
//! Frame data is handed over as captured; use [`crate::frame::decode`] with
//! [`Record::link_type`] to get to the packet.

use std::error::Error as StdError;
use std::fmt;
use std::fs::File;
use std::io::{self, Read, Write};
use std::path::Path;
use std::time::Duration;

use pcap_file::pcap::{
    PcapHeader, PcapPacket, PcapParseError, PcapParser, PcapTsResolution, PcapWriter,
};
use pcap_file::pcapng::{PcapNgParseError, PcapNgParser, PcapNgState};
use pcap_file::{DataLink, Endianness};

/// Initial size of the read buffer.
const INITIAL_BUFFER: usize = 1 << 20;
/// Largest record (pcap record or pcapng block) accepted.
pub const MAX_RECORD_LEN: usize = 64 << 20;

/// pcapng block types handled here.
const PCAPNG_PB: u32 = 0x0000_0002;
const PCAPNG_SPB: u32 = 0x0000_0003;
const PCAPNG_EPB: u32 = 0x0000_0006;
/// Offset of the body in a pcapng block (type + length).
const BLOCK_BODY: usize = 8;
/// Length of a classic pcap record header.
const PCAP_RECORD_HEADER: usize = 16;

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

/// One captured packet, borrowing the reader's buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Record<'a> {
    /// Frame number, 1-based (as Wireshark counts; pcapng non-packet blocks are not counted).
    pub number: u64,
    /// Capture time since the Unix epoch (pcapng: per-interface resolution and offset
    /// applied; Simple Packet Blocks carry none and get zero).
    pub timestamp: Duration,
    /// Link type as stored (classic pcap: the whole header field, FCS bits included —
    /// [`crate::frame::decode`] masks them; pcapng: the interface's link type).
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
    /// A record or block claims more than [`MAX_RECORD_LEN`] bytes.
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

/// Result of [`Input::fill`].
enum Fill {
    /// Bytes were added.
    Data,
    /// End of input, nothing added.
    Eof,
}

/// A growable read buffer over `R`. `buf[start..end]` holds unparsed bytes; `consumed` is the
/// file offset of `buf[start]`.
struct Input<R> {
    reader: R,
    buf: Vec<u8>,
    start: usize,
    end: usize,
    consumed: u64,
}

impl<R: Read> Input<R> {
    fn new(reader: R) -> Self {
        Input {
            reader,
            buf: vec![0; INITIAL_BUFFER],
            start: 0,
            end: 0,
            consumed: 0,
        }
    }

    fn avail(&self) -> &[u8] {
        self.buf.get(self.start..self.end).unwrap_or(&[])
    }

    fn consume(&mut self, n: usize) {
        let n = n.min(self.end - self.start);
        self.start += n;
        self.consumed += n as u64;
    }

    /// Reads more input, compacting and (up to [`MAX_RECORD_LEN`] + a block header) growing
    /// the buffer.
    fn fill(&mut self) -> io::Result<Fill> {
        if self.start > 0 {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        if self.end == self.buf.len() {
            let grown = (self.buf.len() * 2).min(MAX_RECORD_LEN + 64);
            if grown <= self.buf.len() {
                return Err(io::Error::other("record larger than the read buffer"));
            }
            self.buf.resize(grown, 0);
        }
        loop {
            let space = self.buf.get_mut(self.end..).unwrap_or(&mut []);
            match self.reader.read(space) {
                Ok(0) => return Ok(Fill::Eof),
                Ok(n) => {
                    self.end += n.min(space_len(&self.buf, self.end));
                    return Ok(Fill::Data);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
        }
    }
}

/// Bytes of `buf` from `end` on.
fn space_len(buf: &[u8], end: usize) -> usize {
    buf.len().saturating_sub(end)
}

/// A packet found by a parser step: where its data is and what describes it.
#[derive(Clone, Copy)]
struct Meta {
    /// Offset of the data from the start of the record/block.
    data_off: usize,
    caplen: usize,
    orig_len: u32,
    timestamp: Duration,
    link_type: u32,
    interface: u32,
}

/// Outcome of one parser step on the buffered bytes.
enum Step {
    /// A packet record/block of `len` bytes.
    Packet { len: usize, meta: Meta },
    /// A non-packet block of `len` bytes.
    Skip(usize),
    /// More bytes are needed; the record claims `need` bytes.
    Incomplete(usize),
    /// Unrecoverable.
    Fatal(String),
}

enum Kind {
    Pcap {
        parser: PcapParser,
        nanos: bool,
        link_type: u32,
    },
    PcapNg(Box<PcapNgParser>),
}

/// A streaming pcap / pcapng reader. See the [module docs](self).
pub struct CaptureReader<R> {
    input: Input<R>,
    kind: Kind,
    format: CaptureFormat,
    number: u64,
    done: bool,
}

impl<R> fmt::Debug for CaptureReader<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CaptureReader")
            .field("format", &self.format)
            .field("records", &self.number)
            .field("done", &self.done)
            .finish_non_exhaustive()
    }
}

impl CaptureReader<File> {
    /// Opens a capture file.
    ///
    /// # Errors
    /// [`CaptureError::Io`] if the file cannot be opened; those of [`CaptureReader::new`].
    pub fn open(path: impl AsRef<Path>) -> Result<Self, CaptureError> {
        let file = File::open(path).map_err(|source| CaptureError::Io { offset: 0, source })?;
        CaptureReader::new(file)
    }
}

impl<R: Read> CaptureReader<R> {
    /// Reads the file header from `reader` (a file, stdin, a byte slice…) and detects the
    /// format from its magic number. Reading is buffered internally; no `BufReader` is needed.
    ///
    /// # Errors
    /// [`CaptureError::UnknownFormat`], [`CaptureError::Truncated`] (number 0) for a file
    /// shorter than its header, [`CaptureError::Malformed`], [`CaptureError::Io`].
    pub fn new(reader: R) -> Result<Self, CaptureError> {
        let mut input = Input::new(reader);
        while input.avail().len() < 4 {
            match input.fill() {
                Ok(Fill::Data) => {}
                Ok(Fill::Eof) => {
                    return Err(CaptureError::Truncated {
                        number: 0,
                        offset: 0,
                        have: input.avail().len(),
                    })
                }
                Err(source) => return Err(CaptureError::Io { offset: 0, source }),
            }
        }
        let magic = input
            .avail()
            .first_chunk::<4>()
            .map_or(0, |m| u32::from_be_bytes(*m));
        let (kind, format) = match magic {
            0x0a0d_0d0a => {
                let parser = header(&mut input, |b| {
                    PcapNgParser::new(b).map_err(|e| match e {
                        PcapNgParseError::IncompleteBuffer(..) => None,
                        e => Some(chain(&e)),
                    })
                })?;
                (Kind::PcapNg(Box::new(parser)), CaptureFormat::PcapNg)
            }
            0xa1b2_c3d4 | 0xd4c3_b2a1 | 0xa1b2_3c4d | 0x4d3c_b2a1 => {
                let parser = header(&mut input, |b| {
                    PcapParser::new(b).map_err(|e| match e {
                        PcapParseError::IncompleteBuffer(..) => None,
                        e => Some(chain(&e)),
                    })
                })?;
                let h: PcapHeader = parser.header();
                let nanos = h.ts_resolution == PcapTsResolution::NanoSecond;
                let format = CaptureFormat::Pcap {
                    resolution: if nanos {
                        TsResolution::Nano
                    } else {
                        TsResolution::Micro
                    },
                    big_endian: h.endianness == Endianness::Big,
                };
                let kind = Kind::Pcap {
                    link_type: u32::from(h.datalink),
                    parser,
                    nanos,
                };
                (kind, format)
            }
            magic => return Err(CaptureError::UnknownFormat { magic }),
        };
        Ok(CaptureReader {
            input,
            kind,
            format,
            number: 0,
            done: false,
        })
    }

    /// The file format.
    pub fn format(&self) -> CaptureFormat {
        self.format
    }

    /// The file's link type for classic pcap (as stored, FCS bits included); `None` for
    /// pcapng, where each interface has its own.
    pub fn link_type(&self) -> Option<u32> {
        match &self.kind {
            Kind::Pcap { link_type, .. } => Some(*link_type),
            Kind::PcapNg(_) => None,
        }
    }

    /// Number of records returned so far.
    pub fn records_read(&self) -> u64 {
        self.number
    }

    /// The next record, an error, or `None` at the end. After an error the reader is
    /// finished: every later call returns `None`.
    pub fn next_record(&mut self) -> Option<Result<Record<'_>, CaptureError>> {
        if self.done {
            return None;
        }
        let number = self.number + 1;
        loop {
            let offset = self.input.consumed;
            let avail = self.input.avail();
            let have = avail.len();
            let step = if have == 0 {
                Step::Incomplete(0)
            } else {
                match &mut self.kind {
                    Kind::Pcap {
                        parser,
                        nanos,
                        link_type,
                    } => pcap_step(parser, *nanos, *link_type, avail),
                    Kind::PcapNg(parser) => pcapng_step(parser, avail),
                }
            };
            match step {
                Step::Packet { len, meta } => {
                    let from = self.input.start + meta.data_off;
                    self.input.consume(len);
                    self.number = number;
                    let to = from.saturating_add(meta.caplen);
                    if to > self.input.buf.len() {
                        return self.fail(CaptureError::Malformed {
                            number,
                            offset,
                            reason: "packet data outside its record".into(),
                        });
                    }
                    // In bounds: checked just above.
                    let data = self.input.buf.get(from..to).unwrap_or(&[]);
                    return Some(Ok(Record {
                        number,
                        timestamp: meta.timestamp,
                        link_type: meta.link_type,
                        interface: meta.interface,
                        orig_len: meta.orig_len,
                        data,
                    }));
                }
                Step::Skip(len) => self.input.consume(len),
                Step::Incomplete(need) if need > MAX_RECORD_LEN => {
                    return self.fail(CaptureError::TooLarge {
                        number,
                        offset,
                        len: need,
                        max: MAX_RECORD_LEN,
                    })
                }
                Step::Incomplete(_) => match self.input.fill() {
                    Ok(Fill::Data) => {}
                    Ok(Fill::Eof) if have == 0 => {
                        self.done = true;
                        return None;
                    }
                    Ok(Fill::Eof) => {
                        return self.fail(CaptureError::Truncated {
                            number,
                            offset,
                            have,
                        })
                    }
                    Err(source) => return self.fail(CaptureError::Io { offset, source }),
                },
                Step::Fatal(reason) => {
                    return self.fail(CaptureError::Malformed {
                        number,
                        offset,
                        reason,
                    })
                }
            }
        }
    }

    fn fail<'s>(&mut self, e: CaptureError) -> Option<Result<Record<'s>, CaptureError>> {
        self.done = true;
        Some(Err(e))
    }
}

/// Parses a file header, reading more input as needed. `parse` returns `Err(None)` when it
/// needs more bytes.
fn header<R: Read, P>(
    input: &mut Input<R>,
    parse: impl Fn(&[u8]) -> Result<(&[u8], P), Option<String>>,
) -> Result<P, CaptureError> {
    loop {
        let avail = input.avail();
        let have = avail.len();
        match parse(avail) {
            Ok((rem, p)) => {
                let used = have - rem.len();
                input.consume(used);
                return Ok(p);
            }
            Err(Some(reason)) => {
                return Err(CaptureError::Malformed {
                    number: 0,
                    offset: 0,
                    reason,
                })
            }
            Err(None) => match input.fill() {
                Ok(Fill::Data) => {}
                Ok(Fill::Eof) => {
                    return Err(CaptureError::Truncated {
                        number: 0,
                        offset: 0,
                        have,
                    })
                }
                Err(source) => return Err(CaptureError::Io { offset: 0, source }),
            },
        }
    }
}

fn pcap_step(parser: &PcapParser, nanos: bool, link_type: u32, avail: &[u8]) -> Step {
    // The record header, read here: the same checks and results as pcap-file's
    // `next_raw_packet` (16 header bytes, then `incl_len` data bytes), without its per-record
    // overhead.
    let Some((hdr, rest)) = avail.split_first_chunk::<PCAP_RECORD_HEADER>() else {
        return Step::Incomplete(PCAP_RECORD_HEADER);
    };
    let big = parser.header().endianness == Endianness::Big;
    let word = |i: usize| {
        let b = hdr
            .get(i * 4..i * 4 + 4)
            .and_then(|b| b.first_chunk::<4>())
            .copied()
            .unwrap_or_default();
        if big {
            u32::from_be_bytes(b)
        } else {
            u32::from_le_bytes(b)
        }
    };
    let (ts_sec, ts_frac, incl_len, orig_len) = (word(0), word(1), word(2), word(3));
    let caplen = usize::try_from(incl_len).unwrap_or(usize::MAX);
    if rest.len() < caplen {
        return Step::Incomplete(caplen);
    }
    let frac_ns = if nanos {
        u64::from(ts_frac)
    } else {
        u64::from(ts_frac) * 1000
    };
    // A fraction of a second ≥ 1 s (invalid, seen in broken writers) carries over.
    let timestamp =
        Duration::from_secs(u64::from(ts_sec)).saturating_add(Duration::from_nanos(frac_ns));
    Step::Packet {
        len: PCAP_RECORD_HEADER + caplen,
        meta: Meta {
            data_off: PCAP_RECORD_HEADER,
            caplen,
            orig_len,
            timestamp,
            link_type,
            interface: 0,
        },
    }
}

fn pcapng_step(parser: &mut PcapNgParser, avail: &[u8]) -> Step {
    match parser.next_raw_block(avail) {
        Ok((rem, raw)) => {
            let len = avail.len() - rem.len();
            let body: &[u8] = &raw.body;
            let state = parser.state();
            let meta = match raw.type_ {
                PCAPNG_EPB => epb(state, body, false),
                PCAPNG_PB => epb(state, body, true),
                PCAPNG_SPB => spb(state, body),
                _ => return Step::Skip(len),
            };
            match meta {
                Ok(meta) => Step::Packet { len, meta },
                Err(reason) => Step::Fatal(reason),
            }
        }
        Err(PcapNgParseError::IncompleteBuffer(need, _)) => Step::Incomplete(need),
        Err(e) => Step::Fatal(chain(&e)),
    }
}

/// A u32 at `at` in the section's byte order.
fn ng_u32(state: &PcapNgState, b: &[u8], at: usize) -> Option<u32> {
    let a = *b.get(at..)?.first_chunk::<4>()?;
    Some(match state.endianness() {
        Endianness::Big => u32::from_be_bytes(a),
        Endianness::Little => u32::from_le_bytes(a),
    })
}

/// The link type of interface `id`.
fn interface_link_type(state: &PcapNgState, id: u32) -> Result<u32, String> {
    usize::try_from(id)
        .ok()
        .and_then(|i| state.interfaces().get(i))
        .map(|idb| u32::from(idb.linktype))
        .ok_or_else(|| format!("interface {id} has no Interface Description Block"))
}

/// Enhanced Packet Block, or (`obsolete`) the old Packet Block, whose first word holds a
/// 16-bit interface ID and a drop count.
fn epb(state: &PcapNgState, body: &[u8], obsolete: bool) -> Result<Meta, String> {
    const FIXED: usize = 20;
    let short = || format!("packet block body of {} bytes is too short", body.len());
    let word0 = ng_u32(state, body, 0).ok_or_else(short)?;
    let interface = if obsolete {
        match state.endianness() {
            Endianness::Big => word0 >> 16,
            Endianness::Little => word0 & 0xffff,
        }
    } else {
        word0
    };
    let ts_hi = ng_u32(state, body, 4).ok_or_else(short)?;
    let ts_lo = ng_u32(state, body, 8).ok_or_else(short)?;
    let caplen = ng_u32(state, body, 12).ok_or_else(short)?;
    let orig_len = ng_u32(state, body, 16).ok_or_else(short)?;
    let caplen = usize::try_from(caplen).unwrap_or(usize::MAX);
    if caplen > body.len().saturating_sub(FIXED) {
        return Err(format!(
            "captured length {caplen} exceeds the block body ({} bytes)",
            body.len()
        ));
    }
    let link_type = interface_link_type(state, interface)?;
    let timestamp = state
        .decode_timestamp(interface, ts_hi, ts_lo)
        .map_err(|e| chain(&e))?;
    Ok(Meta {
        data_off: BLOCK_BODY + FIXED,
        caplen,
        orig_len,
        timestamp,
        link_type,
        interface,
    })
}

/// Simple Packet Block: original length, then data (captured length = min(original length,
/// interface 0 snaplen, body)). No timestamp.
fn spb(state: &PcapNgState, body: &[u8]) -> Result<Meta, String> {
    let orig_len = ng_u32(state, body, 0)
        .ok_or_else(|| format!("simple packet block body of {} bytes", body.len()))?;
    let link_type = interface_link_type(state, 0)?;
    let snaplen = state
        .interfaces()
        .first()
        .map_or(0, |idb| usize::try_from(idb.snaplen).unwrap_or(usize::MAX));
    let mut caplen = usize::try_from(orig_len)
        .unwrap_or(usize::MAX)
        .min(body.len().saturating_sub(4));
    if snaplen > 0 {
        caplen = caplen.min(snaplen);
    }
    Ok(Meta {
        data_off: BLOCK_BODY + 4,
        caplen,
        orig_len,
        timestamp: Duration::ZERO,
        link_type,
        interface: 0,
    })
}

/// Writes a classic pcap file (little-endian, µs or ns timestamps), for tests and labs.
pub struct PcapFileWriter<W: Write> {
    inner: PcapWriter<W>,
}

impl<W: Write> fmt::Debug for PcapFileWriter<W> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PcapFileWriter")
            .field("snaplen", &self.inner.snaplen())
            .finish_non_exhaustive()
    }
}

impl<W: Write> PcapFileWriter<W> {
    /// Default snaplen written to the header.
    pub const DEFAULT_SNAPLEN: u32 = 262_144;

    /// Writes the file header (snaplen [`Self::DEFAULT_SNAPLEN`]).
    ///
    /// # Errors
    /// [`CaptureError::Write`].
    pub fn new(writer: W, link_type: u32, resolution: TsResolution) -> Result<Self, CaptureError> {
        Self::with_snaplen(writer, link_type, resolution, Self::DEFAULT_SNAPLEN)
    }

    /// Writes the file header with the given snaplen.
    ///
    /// # Errors
    /// [`CaptureError::Write`].
    pub fn with_snaplen(
        writer: W,
        link_type: u32,
        resolution: TsResolution,
        snaplen: u32,
    ) -> Result<Self, CaptureError> {
        let header = PcapHeader {
            version_major: 2,
            version_minor: 4,
            ts_correction: 0,
            ts_accuracy: 0,
            snaplen,
            datalink: DataLink::from(link_type),
            ts_resolution: match resolution {
                TsResolution::Micro => PcapTsResolution::MicroSecond,
                TsResolution::Nano => PcapTsResolution::NanoSecond,
            },
            endianness: Endianness::Little,
        };
        let inner = PcapWriter::with_header(writer, header)
            .map_err(|e| CaptureError::Write { reason: chain(&e) })?;
        Ok(PcapFileWriter { inner })
    }

    /// Writes one whole packet.
    ///
    /// # Errors
    /// [`CaptureError::Write`] (I/O, a packet longer than the snaplen, a timestamp beyond
    /// 2106).
    pub fn write(&mut self, timestamp: Duration, data: &[u8]) -> Result<(), CaptureError> {
        let orig_len = u32::try_from(data.len()).map_err(|_| CaptureError::Write {
            reason: format!("packet of {} bytes", data.len()),
        })?;
        self.write_truncated(timestamp, orig_len, data)
    }

    /// Writes a packet whose wire length `orig_len` exceeds the captured `data`.
    ///
    /// # Errors
    /// As [`Self::write`]; also `orig_len < data.len()`.
    pub fn write_truncated(
        &mut self,
        timestamp: Duration,
        orig_len: u32,
        data: &[u8],
    ) -> Result<(), CaptureError> {
        let write_err = |e: &dyn StdError| CaptureError::Write { reason: chain(e) };
        let packet = PcapPacket::new(timestamp, orig_len, data).map_err(|e| write_err(&e))?;
        self.inner
            .write_packet(&packet)
            .map_err(|e| write_err(&e))?;
        Ok(())
    }

    /// Flushes and returns the underlying writer.
    ///
    /// # Errors
    /// [`CaptureError::Write`] if flushing fails.
    pub fn into_inner(mut self) -> Result<W, CaptureError> {
        self.inner
            .flush()
            .map_err(|e| CaptureError::Write { reason: chain(&e) })?;
        Ok(self.inner.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write_pcap(resolution: TsResolution, frames: &[(Duration, &[u8])]) -> Vec<u8> {
        let mut w = PcapFileWriter::new(Vec::new(), 1, resolution).unwrap();
        for (ts, d) in frames {
            w.write(*ts, d).unwrap();
        }
        w.into_inner().unwrap()
    }

    #[test]
    fn roundtrip_us_and_ns() {
        let frames: [(Duration, &[u8]); 2] = [
            (Duration::new(1_700_000_000, 123_456_000), &[1, 2, 3]),
            (Duration::new(1_700_000_001, 999_000), &[4; 70]),
        ];
        for res in [TsResolution::Micro, TsResolution::Nano] {
            let bytes = write_pcap(res, &frames);
            let mut r = CaptureReader::new(&bytes[..]).unwrap();
            assert_eq!(
                r.format(),
                CaptureFormat::Pcap {
                    resolution: res,
                    big_endian: false
                }
            );
            assert_eq!(r.link_type(), Some(1));
            for (i, (ts, d)) in frames.iter().enumerate() {
                let rec = r.next_record().unwrap().unwrap();
                assert_eq!(rec.number, i as u64 + 1);
                assert_eq!(rec.timestamp, *ts);
                assert_eq!(rec.data, *d);
                assert!(!rec.is_truncated());
            }
            assert!(r.next_record().is_none());
            assert!(r.next_record().is_none());
        }
    }

    #[test]
    fn truncated_last_record_then_end() {
        let bytes = write_pcap(
            TsResolution::Micro,
            &[
                (Duration::from_secs(1), &[1; 40]),
                (Duration::from_secs(2), &[2; 40]),
            ],
        );
        for cut in [bytes.len() - 1, bytes.len() - 40, bytes.len() - 50] {
            let mut r = CaptureReader::new(&bytes[..cut]).unwrap();
            assert_eq!(r.next_record().unwrap().unwrap().number, 1);
            let err = r.next_record().unwrap().unwrap_err();
            assert!(
                matches!(
                    err,
                    CaptureError::Truncated {
                        number: 2,
                        offset: 80,
                        ..
                    }
                ),
                "{err}"
            );
            assert!(r.next_record().is_none());
        }
        // Cut exactly between records: a clean end.
        let mut r = CaptureReader::new(&bytes[..80]).unwrap();
        assert!(r.next_record().unwrap().is_ok());
        assert!(r.next_record().is_none());
    }

    #[test]
    fn header_errors() {
        assert!(matches!(
            CaptureReader::new(&b"\xa1\xb2"[..]),
            Err(CaptureError::Truncated { number: 0, .. })
        ));
        assert!(matches!(
            CaptureReader::new(&b"GIF89a.........................."[..]),
            Err(CaptureError::UnknownFormat { magic: 0x4749_4638 })
        ));
        let bytes = write_pcap(TsResolution::Micro, &[]);
        for n in 4..bytes.len() {
            assert!(matches!(
                CaptureReader::new(&bytes[..n]),
                Err(CaptureError::Truncated { number: 0, .. })
            ));
        }
        let mut r = CaptureReader::new(&bytes[..]).unwrap();
        assert!(r.next_record().is_none());
    }

    #[test]
    fn huge_record_is_an_error() {
        let mut bytes = write_pcap(TsResolution::Micro, &[(Duration::from_secs(1), &[1; 4])]);
        // incl_len = orig_len = 0x7fff_ffff
        bytes[24 + 8..24 + 16].copy_from_slice(&[0xff, 0xff, 0xff, 0x7f, 0xff, 0xff, 0xff, 0x7f]);
        let mut r = CaptureReader::new(&bytes[..]).unwrap();
        assert!(matches!(
            r.next_record().unwrap(),
            Err(CaptureError::TooLarge { number: 1, .. })
        ));
        assert!(r.next_record().is_none());
    }

    /// A reader that hands out one byte at a time.
    struct Trickle<'a>(&'a [u8]);

    impl Read for Trickle<'_> {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            match (self.0.split_first(), buf.first_mut()) {
                (Some((b, rest)), Some(out)) => {
                    *out = *b;
                    self.0 = rest;
                    Ok(1)
                }
                _ => Ok(0),
            }
        }
    }

    #[test]
    fn byte_at_a_time() {
        let frames: Vec<(Duration, Vec<u8>)> = (0..50u8)
            .map(|i| {
                (
                    Duration::from_secs(u64::from(i)),
                    vec![i; usize::from(i) + 1],
                )
            })
            .collect();
        let refs: Vec<(Duration, &[u8])> = frames.iter().map(|(t, d)| (*t, &d[..])).collect();
        let bytes = write_pcap(TsResolution::Nano, &refs);
        let mut r = CaptureReader::new(Trickle(&bytes)).unwrap();
        let mut n = 0;
        while let Some(rec) = r.next_record() {
            let rec = rec.unwrap();
            assert_eq!(rec.data, &frames[n].1[..]);
            n += 1;
        }
        assert_eq!(n, 50);
    }

    /// pcapng writer for tests: blocks in either byte order.
    struct Ng {
        big: bool,
        out: Vec<u8>,
    }

    impl Ng {
        fn u16(&self, v: u16) -> [u8; 2] {
            if self.big {
                v.to_be_bytes()
            } else {
                v.to_le_bytes()
            }
        }

        fn u32(&self, v: u32) -> [u8; 4] {
            if self.big {
                v.to_be_bytes()
            } else {
                v.to_le_bytes()
            }
        }

        fn block(&mut self, ty: u32, body: &[u8]) {
            let pad = (4 - body.len() % 4) % 4;
            let len = u32::try_from(12 + body.len() + pad).unwrap();
            let (t, l) = (self.u32(ty), self.u32(len));
            self.out.extend_from_slice(&t);
            self.out.extend_from_slice(&l);
            self.out.extend_from_slice(body);
            self.out.extend(std::iter::repeat_n(0, pad));
            self.out.extend_from_slice(&l);
        }

        fn shb(&mut self, big: bool) {
            self.big = big;
            let mut b = self.u32(0x1a2b_3c4d).to_vec();
            b.extend_from_slice(&self.u16(1));
            b.extend_from_slice(&self.u16(0));
            b.extend_from_slice(&[0xff; 8]);
            self.block(0x0a0d_0d0a, &b);
        }

        fn idb(&mut self, link_type: u16, tsresol: Option<u8>, tsoffset: Option<i64>) {
            let mut b = self.u16(link_type).to_vec();
            b.extend_from_slice(&[0, 0]);
            b.extend_from_slice(&self.u32(65535));
            if let Some(r) = tsresol {
                b.extend_from_slice(&self.u16(9));
                b.extend_from_slice(&self.u16(1));
                b.extend_from_slice(&[r, 0, 0, 0]);
            }
            if let Some(o) = tsoffset {
                b.extend_from_slice(&self.u16(14));
                b.extend_from_slice(&self.u16(8));
                let o = if self.big {
                    o.to_be_bytes()
                } else {
                    o.to_le_bytes()
                };
                b.extend_from_slice(&o);
            }
            if tsresol.is_some() || tsoffset.is_some() {
                b.extend_from_slice(&[0, 0, 0, 0]);
            }
            self.block(1, &b);
        }

        fn epb(&mut self, interface: u32, ts: u64, data: &[u8], orig_len: u32) {
            let mut b = self.u32(interface).to_vec();
            b.extend_from_slice(&self.u32((ts >> 32) as u32));
            b.extend_from_slice(&self.u32(ts as u32));
            b.extend_from_slice(&self.u32(u32::try_from(data.len()).unwrap()));
            b.extend_from_slice(&self.u32(orig_len));
            b.extend_from_slice(data);
            b.extend(std::iter::repeat_n(0, (4 - data.len() % 4) % 4));
            // An epb_flags option, which must not cost anything.
            b.extend_from_slice(&self.u16(2));
            b.extend_from_slice(&self.u16(4));
            b.extend_from_slice(&self.u32(1));
            b.extend_from_slice(&[0, 0, 0, 0]);
            self.block(6, &b);
        }
    }

    fn sample_pcapng() -> Vec<u8> {
        let mut ng = Ng {
            big: false,
            out: Vec::new(),
        };
        ng.shb(false);
        ng.idb(1, None, None);
        ng.idb(276, Some(9), Some(100));
        ng.block(0x1234, &[1, 2, 3, 4, 5]); // unknown block
        ng.block(4, &[0, 0, 0, 0]); // NRB, end of records only
        ng.epb(0, 1_700_000_000_123_456, &[0xaa; 5], 5);
        ng.epb(1, 1_700_000_000_123_456_789, &[0xbb; 8], 60);
        let mut spb = ng.u32(3).to_vec();
        spb.extend_from_slice(&[0xcc, 0xcc, 0xcc, 0]);
        ng.block(3, &spb);
        ng.block(5, &{
            let mut b = ng.u32(0).to_vec();
            b.extend_from_slice(&[0; 8]);
            b
        }); // ISB
            // Second section, big-endian: binary resolution 2^-20, ERF.
        ng.shb(true);
        ng.idb(197, Some(0x80 | 20), None);
        ng.epb(0, (1_700_000_002u64 << 20) | (1 << 19), &[0xdd; 3], 3);
        // Obsolete Packet Block: interface 0 (u16), drops, timestamp, lengths.
        let mut pb = ng.u16(0).to_vec();
        pb.extend_from_slice(&ng.u16(0));
        pb.extend_from_slice(&ng.u32(0));
        pb.extend_from_slice(&ng.u32(1 << 20));
        pb.extend_from_slice(&ng.u32(2));
        pb.extend_from_slice(&ng.u32(2));
        pb.extend_from_slice(&[0xee, 0xee, 0, 0]);
        ng.block(2, &pb);
        ng.out
    }

    #[test]
    fn pcapng_sections_interfaces_resolutions() {
        let bytes = sample_pcapng();
        let mut r = CaptureReader::new(&bytes[..]).unwrap();
        assert_eq!(r.format(), CaptureFormat::PcapNg);
        assert_eq!(r.link_type(), None);
        let mut got = Vec::new();
        while let Some(rec) = r.next_record() {
            let rec = rec.unwrap();
            got.push((
                rec.number,
                rec.interface,
                rec.link_type,
                rec.timestamp,
                rec.data.to_vec(),
                rec.orig_len,
            ));
        }
        assert_eq!(
            got,
            vec![
                (
                    1,
                    0,
                    1,
                    Duration::new(1_700_000_000, 123_456_000),
                    vec![0xaa; 5],
                    5
                ),
                (
                    2,
                    1,
                    276,
                    Duration::new(1_700_000_100, 123_456_789),
                    vec![0xbb; 8],
                    60
                ),
                (3, 0, 1, Duration::ZERO, vec![0xcc; 3], 3),
                (
                    4,
                    0,
                    197,
                    Duration::new(1_700_000_002, 500_000_000),
                    vec![0xdd; 3],
                    3
                ),
                (5, 0, 197, Duration::new(1, 0), vec![0xee; 2], 2),
            ]
        );
        assert_eq!(r.records_read(), 5);
    }

    #[test]
    fn pcapng_truncated_and_corrupt() {
        let bytes = sample_pcapng();
        // Cut inside the last block: four good records, then one error, then the end.
        let mut r = CaptureReader::new(&bytes[..bytes.len() - 3]).unwrap();
        let mut ok = 0;
        let mut errs = Vec::new();
        while let Some(rec) = r.next_record() {
            match rec {
                Ok(_) => ok += 1,
                Err(e) => errs.push(e),
            }
        }
        assert_eq!(ok, 4);
        assert!(
            matches!(errs[..], [CaptureError::Truncated { number: 5, .. }]),
            "{errs:?}"
        );
        // Every cut gives some records then at most one error, never a panic or a loop.
        for cut in 0..bytes.len() {
            if let Ok(mut r) = CaptureReader::new(&bytes[..cut]) {
                let mut n = 0;
                while let Some(rec) = r.next_record() {
                    n += 1;
                    assert!(n <= 6);
                    if rec.is_err() {
                        assert!(r.next_record().is_none());
                        break;
                    }
                }
            }
        }
        // An EPB naming an interface that does not exist.
        let mut ng = Ng {
            big: false,
            out: Vec::new(),
        };
        ng.shb(false);
        ng.idb(1, None, None);
        ng.epb(3, 0, &[1], 1);
        let mut r = CaptureReader::new(&ng.out[..]).unwrap();
        let err = r.next_record().unwrap().unwrap_err();
        assert!(
            matches!(
                err,
                CaptureError::Malformed {
                    number: 1,
                    offset: 48,
                    ..
                }
            ),
            "{err}"
        );
        assert!(err.to_string().contains("interface 3"), "{err}");
        assert!(r.next_record().is_none());
    }

    #[test]
    fn big_endian_pcap() {
        let mut b = Vec::new();
        b.extend_from_slice(&0xa1b2_3c4du32.to_be_bytes());
        b.extend_from_slice(&2u16.to_be_bytes());
        b.extend_from_slice(&4u16.to_be_bytes());
        b.extend_from_slice(&[0; 8]);
        b.extend_from_slice(&65535u32.to_be_bytes());
        b.extend_from_slice(&(0x1000_0000u32 | 1).to_be_bytes());
        for v in [1_700_000_000u32, 999_999_999, 2, 4] {
            b.extend_from_slice(&v.to_be_bytes());
        }
        b.extend_from_slice(&[9, 9]);
        let mut r = CaptureReader::new(&b[..]).unwrap();
        assert_eq!(
            r.format(),
            CaptureFormat::Pcap {
                resolution: TsResolution::Nano,
                big_endian: true
            }
        );
        assert_eq!(r.link_type(), Some(0x1000_0001));
        let rec = r.next_record().unwrap().unwrap();
        assert_eq!(rec.timestamp, Duration::new(1_700_000_000, 999_999_999));
        assert_eq!(
            (rec.data, rec.orig_len, rec.is_truncated()),
            (&[9u8, 9][..], 4, true)
        );
        assert!(r.next_record().is_none());
    }
}
