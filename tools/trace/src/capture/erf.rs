//! Raw ERF record files (what Endace/DAG tools and Wireshark's "ERF" format write: ERF records
//! back to back, no file header). The record header is parsed with nom; the record (header,
//! extension headers, packet) is handed over whole with link type [`LINKTYPE_ERF`], and
//! `ibcm_mad::frame::decode` takes it apart from there.

use std::fmt;
use std::io::{self, Read};
use std::time::Duration;

use nom::number::complete::{be_u16, le_u64, u8 as byte};
use nom::{IResult, Parser};

use super::Record;

/// LINKTYPE_ERF: an ERF record header precedes the packet.
pub(crate) const LINKTYPE_ERF: u32 = 197;

/// Length of the ERF record header.
const ERF_HEADER: usize = 16;
/// Largest raw ERF record accepted (the rlen field is 16 bits).
const ERF_MAX: usize = 1 << 16;

/// The fixed 16-byte ERF record header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ErfHeader {
    /// Timestamp: seconds in the high 32 bits, a binary fraction in the low 32.
    ts: u64,
    /// Record type (bit 7: an extension header follows).
    ty: u8,
    /// Flags (bits 0-1: interface).
    flags: u8,
    /// Record length, header included.
    rlen: u16,
    /// Wire length of the packet.
    wlen: u16,
}

impl ErfHeader {
    /// Parses the header (the loss / colour counter is skipped).
    fn parse(input: &[u8]) -> IResult<&[u8], ErfHeader> {
        let (rest, (ts, ty, flags, rlen, _lctr, wlen)) =
            (le_u64, byte, byte, be_u16, be_u16, be_u16).parse(input)?;
        Ok((
            rest,
            ErfHeader {
                ts,
                ty,
                flags,
                rlen,
                wlen,
            },
        ))
    }

    /// The capture time since the Unix epoch.
    fn timestamp(&self) -> Duration {
        let secs = self.ts >> 32;
        let nanos = ((self.ts & 0xffff_ffff) * 1_000_000_000) >> 32;
        Duration::new(secs, u32::try_from(nanos).unwrap_or(0))
    }
}

/// Whether 16 bytes look like an ERF record header: a known record type, a record length
/// that covers the header, a wire length that is not absurd.
pub(crate) fn looks_like_erf(h: &[u8]) -> bool {
    ErfHeader::parse(h)
        .is_ok_and(|(_, h)| (1..=48).contains(&(h.ty & 0x7f)) && usize::from(h.rlen) >= ERF_HEADER)
}

/// A raw ERF file reader.
pub(crate) struct ErfReader<R> {
    inner: R,
    buf: Vec<u8>,
    number: u64,
    offset: u64,
    done: bool,
}

/// Why a raw ERF file could not be read further.
#[derive(Debug)]
pub(crate) enum ErfError {
    /// I/O error.
    Io(io::Error),
    /// A record header is impossible.
    Bad {
        /// Record number.
        number: u64,
        /// File offset.
        offset: u64,
        /// What is wrong.
        reason: String,
    },
}

impl fmt::Display for ErfError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ErfError::Io(e) => write!(f, "I/O error: {e}"),
            ErfError::Bad {
                number,
                offset,
                reason,
            } => write!(f, "ERF record {number} at byte {offset}: {reason}"),
        }
    }
}

/// Reads until `buf` is full or the input ends; returns the bytes read.
pub(crate) fn read_full(r: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(buf.get_mut(n..).unwrap_or(&mut [])) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

impl<R: Read> ErfReader<R> {
    /// Wraps a reader positioned at the first record.
    pub(crate) fn new(inner: R) -> Self {
        ErfReader {
            inner,
            buf: Vec::with_capacity(ERF_MAX),
            number: 0,
            offset: 0,
            done: false,
        }
    }

    /// The next record (link type [`LINKTYPE_ERF`]: the data starts with the ERF header).
    pub(crate) fn next_record(&mut self) -> Option<Result<Record<'_>, ErfError>> {
        if self.done {
            return None;
        }
        let mut raw = [0u8; ERF_HEADER];
        let n = match read_full(&mut self.inner, &mut raw) {
            Ok(n) => n,
            Err(e) => {
                self.done = true;
                return Some(Err(ErfError::Io(e)));
            }
        };
        if n == 0 {
            self.done = true;
            return None;
        }
        self.number += 1;
        let bad = |s: &mut Self, reason: String| {
            s.done = true;
            Some(Err(ErfError::Bad {
                number: s.number,
                offset: s.offset,
                reason,
            }))
        };
        let hdr = match raw.get(..n).map(ErfHeader::parse) {
            Some(Ok((_, h))) => h,
            _ => return bad(self, format!("truncated header ({n} of 16 bytes)")),
        };
        let rlen = usize::from(hdr.rlen);
        if rlen < ERF_HEADER {
            return bad(
                self,
                format!("record length {rlen} is shorter than the header"),
            );
        }
        self.buf.clear();
        self.buf.extend_from_slice(&raw);
        self.buf.resize(rlen, 0);
        let body = self.buf.get_mut(ERF_HEADER..).unwrap_or(&mut []);
        let want = body.len();
        match read_full(&mut self.inner, body) {
            Ok(k) if k == want => {}
            Ok(k) => {
                return bad(
                    self,
                    format!("truncated: the file ends {} bytes into the record", 16 + k),
                )
            }
            Err(e) => {
                self.done = true;
                return Some(Err(ErfError::Io(e)));
            }
        }
        self.offset += rlen as u64;
        Some(Ok(Record {
            number: self.number,
            timestamp: hdr.timestamp(),
            link_type: LINKTYPE_ERF,
            interface: u32::from(hdr.flags & 0x03),
            orig_len: 16 + u32::from(hdr.wlen),
            data: &self.buf,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An ERF record: type 21 (InfiniBand), interface 1, `payload` bytes.
    fn record(secs: u32, frac: u32, payload: &[u8]) -> Vec<u8> {
        let mut r = ((u64::from(secs) << 32) | u64::from(frac))
            .to_le_bytes()
            .to_vec();
        let rlen = u16::try_from(16 + payload.len()).unwrap();
        r.extend_from_slice(&[21, 0x01]);
        r.extend_from_slice(&rlen.to_be_bytes());
        r.extend_from_slice(&[0, 0]);
        r.extend_from_slice(&u16::try_from(payload.len()).unwrap().to_be_bytes());
        r.extend_from_slice(payload);
        r
    }

    #[test]
    fn header_fields() {
        let r = record(7, 1 << 31, &[1, 2, 3]);
        let (rest, h) = ErfHeader::parse(&r).unwrap();
        assert_eq!(rest, &[1, 2, 3]);
        assert_eq!((h.ty, h.flags, h.rlen, h.wlen), (21, 1, 19, 3));
        assert_eq!(h.timestamp(), Duration::new(7, 500_000_000));
        assert!(looks_like_erf(&r));
        assert!(!looks_like_erf(&r[..15]));
        let mut zero_type = r.clone();
        zero_type[8] = 0;
        assert!(!looks_like_erf(&zero_type));
        let mut short_rlen = r;
        short_rlen[10..12].copy_from_slice(&15u16.to_be_bytes());
        assert!(!looks_like_erf(&short_rlen));
    }

    #[test]
    fn records_then_truncation() {
        let mut file = record(1, 0, &[0xaa; 4]);
        file.extend(record(2, 0, &[0xbb; 2]));
        file.extend(&record(3, 0, &[0xcc; 8])[..20]);
        let mut r = ErfReader::new(&file[..]);
        let a = r.next_record().unwrap().unwrap();
        assert_eq!(
            (a.number, a.interface, a.orig_len, a.data.len()),
            (1, 1, 20, 20)
        );
        let b = r.next_record().unwrap().unwrap();
        assert_eq!((b.number, b.timestamp), (2, Duration::from_secs(2)));
        let err = r.next_record().unwrap().unwrap_err().to_string();
        assert_eq!(
            err,
            "ERF record 3 at byte 38: truncated: the file ends 20 bytes into the record"
        );
        assert!(r.next_record().is_none());
        // A header cut short.
        let mut r = ErfReader::new(&file[..10]);
        let err = r.next_record().unwrap().unwrap_err().to_string();
        assert!(err.contains("truncated header (10 of 16 bytes)"), "{err}");
    }
}
