//! The reader's growable input buffer.

use std::io::{self, Read};
use std::sync::Arc;

use super::MAX_RECORD_LEN;

/// The bytes the reader parses: its own growable buffer, or a whole file mapped into memory
/// (then all of it is there from the start, and nothing is copied).
pub(super) enum Buf {
    /// Filled from the reader.
    Owned(Vec<u8>),
    /// A file mapped read-only (`crate::sys::map_file`).
    Mapped(Arc<memmap2::Mmap>),
}

impl Buf {
    pub(super) fn bytes(&self) -> &[u8] {
        match self {
            Buf::Owned(v) => v,
            Buf::Mapped(m) => m,
        }
    }
}

/// Initial size of the read buffer.
const INITIAL_BUFFER: usize = 1 << 20;

/// Result of [`Input::fill`].
pub(super) enum Fill {
    /// Bytes were added.
    Data,
    /// End of input, nothing added.
    Eof,
}

/// A growable read buffer over `R` (or a mapped file). `buf[start..end]` holds unparsed
/// bytes; `consumed` is the file offset of `buf[start]`.
pub(super) struct Input<R> {
    reader: R,
    pub(super) buf: Buf,
    pub(super) start: usize,
    end: usize,
    pub(super) consumed: u64,
    /// The reader has returned end of input.
    pub(super) eof: bool,
}

impl<R: Read> Input<R> {
    pub(super) fn new(reader: R) -> Self {
        Input {
            reader,
            buf: Buf::Owned(vec![0; INITIAL_BUFFER]),
            start: 0,
            end: 0,
            consumed: 0,
            eof: false,
        }
    }

    /// The whole of a mapped file, at its end of input from the start (`reader` is never
    /// read).
    pub(super) fn mapped(reader: R, map: Arc<memmap2::Mmap>) -> Self {
        Input {
            reader,
            end: map.len(),
            buf: Buf::Mapped(map),
            start: 0,
            consumed: 0,
            eof: true,
        }
    }

    pub(super) fn avail(&self) -> &[u8] {
        self.buf.bytes().get(self.start..self.end).unwrap_or(&[])
    }

    pub(super) fn consume(&mut self, n: usize) {
        let n = n.min(self.end - self.start);
        self.start += n;
        self.consumed += n as u64;
    }

    /// Reads more input, compacting and (up to [`MAX_RECORD_LEN`] + a block header) growing
    /// the buffer.
    pub(super) fn fill(&mut self) -> io::Result<Fill> {
        let Buf::Owned(buf) = &mut self.buf else {
            self.eof = true;
            return Ok(Fill::Eof);
        };
        if self.start > 0 {
            buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        if self.end == buf.len() {
            let grown = (buf.len() * 2).min(MAX_RECORD_LEN + 64);
            if grown <= buf.len() {
                return Err(io::Error::other("record larger than the read buffer"));
            }
            buf.resize(grown, 0);
        }
        loop {
            let space = buf.get_mut(self.end..).unwrap_or(&mut []);
            match self.reader.read(space) {
                Ok(0) => {
                    self.eof = true;
                    return Ok(Fill::Eof);
                }
                Ok(n) => {
                    self.end += n.min(space_len(buf, self.end));
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
