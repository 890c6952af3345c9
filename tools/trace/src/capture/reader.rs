//! [`CaptureReader`]: the streaming pcap / pcapng reader, and the pcap records.

use std::fmt;
use std::fs::File;
use std::io::Read;
use std::path::Path;
use std::time::Duration;

use pcap_file::pcap::{PcapHeader, PcapParseError, PcapParser, PcapTsResolution};
use pcap_file::Endianness;

use super::buffer::{Fill, Input};
use super::pcapng::PcapNg;
use super::resync::{scan, PcapShape, MAX_PCAP_CAPLEN};
use super::step::{Meta, Step};
use super::{chain, CaptureError, CaptureFormat, Record, TsResolution, MAX_RECORD_LEN};

/// Length of a classic pcap record header.
const PCAP_RECORD_HEADER: usize = 16;

enum Kind {
    Pcap {
        parser: PcapParser,
        nanos: bool,
        link_type: u32,
        /// Seconds of the last good record (for resynchronising).
        last_sec: Option<u32>,
    },
    PcapNg(PcapNg),
}

/// A streaming pcap / pcapng reader.
///
/// The format comes from the magic number: pcap with µs or ns timestamps in either byte
/// order, or pcapng with any number of sections, per-interface link types, `if_tsresol` and
/// `if_tsoffset` (unknown block types are skipped). Reading goes through a bounded buffer of
/// its own, so memory stays constant on multi-GB files and stdin, and
/// [`CaptureReader::next_record`] returns records that borrow that buffer: no allocation per
/// packet. A damaged record header or block in the middle of the file is skipped to the next
/// plausible record header ([`CaptureError::Skipped`], then the records after it); after any
/// other error (a last record cut short, an I/O error) it returns that error once, then
/// `None`: every good record before the error is delivered.
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
                let parser = header(&mut input, PcapNg::new)?;
                (Kind::PcapNg(parser), CaptureFormat::PcapNg)
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
                    last_sec: None,
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

    /// Bytes read from the input and not parsed yet (a record, or the start of one).
    pub fn buffered(&self) -> usize {
        self.input.avail().len()
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
                        ..
                    } => pcap_step(parser, *nanos, *link_type, avail),
                    Kind::PcapNg(parser) => parser.step(avail),
                }
            };
            match step {
                Step::Packet { len, meta } => {
                    if let Kind::Pcap { last_sec, .. } = &mut self.kind {
                        *last_sec = u32::try_from(meta.timestamp.as_secs()).ok();
                    }
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
                    let reason = format!("it claims {need} bytes, more than {MAX_RECORD_LEN}");
                    return self.skip_damaged(number, offset, reason, None);
                }
                Step::Incomplete(_) => match self.input.fill() {
                    Ok(Fill::Data) => {}
                    Ok(Fill::Eof) if have == 0 => {
                        self.done = true;
                        return None;
                    }
                    Ok(Fill::Eof) => {
                        // A last record cut short, or a damaged length that runs past the
                        // end: damage when a plausible record header follows.
                        let truncated = CaptureError::Truncated {
                            number,
                            offset,
                            have,
                        };
                        let reason = format!("it runs past the end of the file, {have} bytes left");
                        return self.skip_damaged(number, offset, reason, Some(truncated));
                    }
                    Err(source) => return self.fail(CaptureError::Io { offset, source }),
                },
                Step::Fatal(reason) => return self.skip_damaged(number, offset, reason, None),
            }
        }
    }

    /// The record at `offset` is damaged: scans on for the next plausible record header and
    /// returns [`CaptureError::Skipped`]. With `otherwise`, that error is returned instead when
    /// no plausible header follows (a last record cut short is not damage).
    fn skip_damaged<'s>(
        &mut self,
        number: u64,
        offset: u64,
        reason: String,
        otherwise: Option<CaptureError>,
    ) -> Option<Result<Record<'s>, CaptureError>> {
        // From the byte after the damaged record's first.
        self.input.consume(1);
        let found = match &self.kind {
            Kind::Pcap {
                parser,
                nanos,
                last_sec,
                ..
            } => {
                let shape = PcapShape {
                    big_endian: parser.header().endianness == Endianness::Big,
                    nanos: *nanos,
                    last_sec: *last_sec,
                };
                scan(&mut self.input, |b, eof| shape.probe(b, eof))
            }
            Kind::PcapNg(ng) => scan(&mut self.input, |b, eof| ng.probe(b, eof)),
        };
        let found = match found {
            Ok(f) => f,
            Err(source) => {
                let offset = self.input.consumed;
                return self.fail(CaptureError::Io { offset, source });
            }
        };
        if !found {
            if let Some(e) = otherwise {
                return self.fail(e);
            }
            self.done = true;
        }
        // The damaged record keeps its number.
        self.number = number;
        Some(Err(CaptureError::Skipped {
            number,
            offset,
            skipped: self.input.consumed - offset,
            reason,
            resumed: found,
        }))
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
    if incl_len > MAX_PCAP_CAPLEN {
        return Step::Fatal(format!(
            "it claims {incl_len} captured bytes, more than {MAX_PCAP_CAPLEN}"
        ));
    }
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
