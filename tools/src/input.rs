//! Capture input: pcap and pcapng (through `ibcm_mad::capture`), and raw ERF record files
//! (what Endace/DAG tools and Wireshark's "ERF" format write: ERF records back to back, no
//! file header). Reads a file or standard input (`-`) in constant memory, and counts the
//! bytes read for the progress bar.

use std::fs::File;
use std::io::{self, Read};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ibcm_mad::capture::{CaptureError, CaptureReader, Record};

/// LINKTYPE_ERF: an ERF record header precedes the packet.
pub const LINKTYPE_ERF: u32 = 197;

/// Largest raw ERF record accepted (the rlen field is 16 bits).
const ERF_MAX: usize = 1 << 16;

/// A reader that counts the bytes it delivers.
pub struct Counting<R> {
    inner: R,
    count: Arc<AtomicU64>,
}

impl<R: Read> Read for Counting<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.count.fetch_add(n as u64, Ordering::Relaxed);
        Ok(n)
    }
}

/// A reader that first replays bytes already read (the sniffed magic number).
struct Replay<R> {
    head: Vec<u8>,
    pos: usize,
    inner: R,
}

impl<R: Read> Read for Replay<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if let Some(rest) = self.head.get(self.pos..).filter(|r| !r.is_empty()) {
            let n = rest.len().min(buf.len());
            if let (Some(dst), Some(src)) = (buf.get_mut(..n), rest.get(..n)) {
                dst.copy_from_slice(src);
            }
            self.pos += n;
            return Ok(n);
        }
        self.inner.read(buf)
    }
}

type Boxed = Box<dyn Read + Send>;

/// A raw ERF file reader.
pub struct ErfReader<R> {
    inner: R,
    buf: Vec<u8>,
    number: u64,
    offset: u64,
    done: bool,
}

/// Why a raw ERF file could not be read further.
#[derive(Debug)]
pub enum ErfError {
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

impl std::fmt::Display for ErfError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
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

fn read_full(r: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
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

/// Whether 16 bytes look like an ERF record header: a known record type, a record length
/// that covers the header, a wire length that is not absurd.
pub fn looks_like_erf(h: &[u8]) -> bool {
    let Some(h) = h.first_chunk::<16>() else {
        return false;
    };
    let ty = h[8] & 0x7f;
    let rlen = u16::from_be_bytes([h[10], h[11]]);
    (1..=48).contains(&ty) && rlen >= 16
}

impl<R: Read> ErfReader<R> {
    /// Wraps a reader positioned at the first record.
    pub fn new(inner: R) -> Self {
        ErfReader {
            inner,
            buf: Vec::with_capacity(ERF_MAX),
            number: 0,
            offset: 0,
            done: false,
        }
    }

    /// The next record (link type [`LINKTYPE_ERF`]: the data starts with the ERF header).
    pub fn next_record(&mut self) -> Option<Result<Record<'_>, ErfError>> {
        if self.done {
            return None;
        }
        let mut hdr = [0u8; 16];
        let n = match read_full(&mut self.inner, &mut hdr) {
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
        if n < 16 {
            return bad(self, format!("truncated header ({n} of 16 bytes)"));
        }
        let rlen = usize::from(u16::from_be_bytes([hdr[10], hdr[11]]));
        if rlen < 16 {
            return bad(
                self,
                format!("record length {rlen} is shorter than the header"),
            );
        }
        self.buf.clear();
        self.buf.extend_from_slice(&hdr);
        self.buf.resize(rlen, 0);
        let body = self.buf.get_mut(16..).unwrap_or(&mut []);
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
        let ts = u64::from_le_bytes([
            hdr[0], hdr[1], hdr[2], hdr[3], hdr[4], hdr[5], hdr[6], hdr[7],
        ]);
        let secs = ts >> 32;
        let nanos = ((ts & 0xffff_ffff) * 1_000_000_000) >> 32;
        let wlen = u16::from_be_bytes([hdr[14], hdr[15]]);
        Some(Ok(Record {
            number: self.number,
            timestamp: Duration::new(secs, u32::try_from(nanos).unwrap_or(0)),
            link_type: LINKTYPE_ERF,
            interface: u32::from(hdr[9] & 0x03),
            orig_len: 16 + u32::from(wlen),
            data: &self.buf,
        }))
    }
}

/// An open capture.
pub enum Source {
    /// pcap or pcapng.
    Pcap(CaptureReader<Counting<Boxed>>),
    /// Raw ERF records.
    Erf(ErfReader<Counting<Boxed>>),
}

/// Why an input could not be opened.
#[derive(Debug)]
pub enum OpenError {
    /// The file could not be opened or read.
    Io(io::Error),
    /// Not a capture this tool reads.
    Format(String),
}

impl std::fmt::Display for OpenError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            OpenError::Io(e) => write!(f, "cannot read: {e}"),
            OpenError::Format(s) => f.write_str(s),
        }
    }
}

/// An opened input: the source, its byte counter (for progress) and its size when known.
pub type Opened = (Source, Arc<AtomicU64>, Option<u64>);

/// The kind of an error from [`Source::next_record`].
pub type RecordError = String;

impl Source {
    /// Opens `path` (`-` = standard input). Returns the source, the byte counter, and the
    /// file size when known.
    ///
    /// # Errors
    /// The file cannot be opened or read, or is not pcap, pcapng or ERF.
    pub fn open(path: &str) -> Result<Opened, OpenError> {
        let (reader, size): (Boxed, Option<u64>) = if path == "-" {
            (Box::new(io::stdin()), None)
        } else {
            let f = File::open(path).map_err(OpenError::Io)?;
            let meta = f.metadata().map_err(OpenError::Io)?;
            if meta.is_dir() {
                return Err(OpenError::Format("is a directory".to_string()));
            }
            (Box::new(f), Some(meta.len()))
        };
        Self::from_reader(reader).map(|(s, c)| (s, c, size))
    }

    /// Sniffs the format of `reader` and opens it.
    ///
    /// # Errors
    /// As [`Source::open`].
    pub fn from_reader(mut reader: Boxed) -> Result<(Source, Arc<AtomicU64>), OpenError> {
        let mut head = vec![0u8; 16];
        let n = read_full(&mut reader, &mut head).map_err(OpenError::Io)?;
        head.truncate(n);
        let count = Arc::new(AtomicU64::new(0));
        let magic = head
            .first_chunk::<4>()
            .map(|m| u32::from_be_bytes(*m))
            .unwrap_or(0);
        let known = matches!(
            magic,
            0xa1b2_c3d4 | 0xd4c3_b2a1 | 0xa1b2_3c4d | 0x4d3c_b2a1 | 0x0a0d_0d0a
        );
        let is_erf = !known && looks_like_erf(&head);
        let replay: Boxed = Box::new(Replay {
            head,
            pos: 0,
            inner: reader,
        });
        let counting = Counting {
            inner: replay,
            count: Arc::clone(&count),
        };
        if n == 0 {
            return Err(OpenError::Format("empty file".to_string()));
        }
        if is_erf {
            return Ok((Source::Erf(ErfReader::new(counting)), count));
        }
        match CaptureReader::new(counting) {
            Ok(r) => Ok((Source::Pcap(r), count)),
            Err(CaptureError::UnknownFormat { magic }) => Err(OpenError::Format(format!(
                "not a pcap, pcapng or ERF capture (starts with {magic:#010x})"
            ))),
            Err(CaptureError::Io { source, .. }) => Err(OpenError::Io(source)),
            Err(e) => Err(OpenError::Format(format!("not a readable capture: {e}"))),
        }
    }

    /// The next record; after an error, `None`.
    pub fn next_record(&mut self) -> Option<Result<Record<'_>, RecordError>> {
        match self {
            Source::Pcap(r) => r.next_record().map(|x| x.map_err(|e| e.to_string())),
            Source::Erf(r) => r.next_record().map(|x| x.map_err(|e| e.to_string())),
        }
    }
}
