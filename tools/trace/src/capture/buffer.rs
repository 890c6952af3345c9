//! The reader's growable input buffer.

use std::io::{self, Read};

use super::MAX_RECORD_LEN;

/// Initial size of the read buffer.
const INITIAL_BUFFER: usize = 1 << 20;

/// Result of [`Input::fill`].
pub(super) enum Fill {
    /// Bytes were added.
    Data,
    /// End of input, nothing added.
    Eof,
}

/// A growable read buffer over `R`. `buf[start..end]` holds unparsed bytes; `consumed` is the
/// file offset of `buf[start]`.
pub(super) struct Input<R> {
    reader: R,
    pub(super) buf: Vec<u8>,
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
            buf: vec![0; INITIAL_BUFFER],
            start: 0,
            end: 0,
            consumed: 0,
            eof: false,
        }
    }

    pub(super) fn avail(&self) -> &[u8] {
        self.buf.get(self.start..self.end).unwrap_or(&[])
    }

    pub(super) fn consume(&mut self, n: usize) {
        let n = n.min(self.end - self.start);
        self.start += n;
        self.consumed += n as u64;
    }

    /// Reads more input, compacting and (up to [`MAX_RECORD_LEN`] + a block header) growing
    /// the buffer.
    pub(super) fn fill(&mut self) -> io::Result<Fill> {
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
                Ok(0) => {
                    self.eof = true;
                    return Ok(Fill::Eof);
                }
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
