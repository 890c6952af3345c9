//! [`PcapFileWriter`]: a small classic pcap writer (tests, labs, cm-trace-gen).

use std::error::Error as StdError;
use std::fmt;
use std::io::Write;
use std::time::Duration;

use pcap_file::pcap::{PcapHeader, PcapPacket, PcapTsResolution, PcapWriter};
use pcap_file::{DataLink, Endianness};

use super::{chain, CaptureError, TsResolution};

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
