//! Resynchronising after a damaged record header: what a plausible record header looks like
//! in a classic pcap file (the pcapng test is [`super::pcapng::PcapNg::probe`]), and the scan
//! for the next one.
//!
//! A classic pcap record header is plausible when its fraction of a second is below one
//! second, its captured length is between 1 and [`MAX_PCAP_CAPLEN`] and at most its original
//! length, its original length at most [`MAX_PCAP_ORIG_LEN`], its time within a day before and
//! a year after the last good record's, and the record it describes is followed either by the
//! exact end of the file or by another header passing the same tests. Random bytes pass all
//! that by chance about once in 2^60 positions.

use std::io::{self, Read};

use super::buffer::{Fill, Input};

/// Largest captured length of a classic pcap record (Wireshark's
/// `WTAP_MAX_PACKET_SIZE_STANDARD`); a larger one is a damaged header.
pub(super) const MAX_PCAP_CAPLEN: u32 = 262_144;
/// Largest original length taken as plausible while resynchronising.
const MAX_PCAP_ORIG_LEN: u32 = 1 << 20;
/// Plausible times around the last good record's: a day before, a year after.
const BEFORE_SECS: u32 = 86_400;
const AFTER_SECS: u32 = 366 * 86_400;

/// Whether the bytes at a position start a plausible record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Probe {
    /// Yes.
    Yes,
    /// No.
    No,
    /// Cannot tell without more bytes.
    NeedMore,
}

/// What the classic pcap probe needs to know about the file.
#[derive(Debug, Clone, Copy)]
pub(super) struct PcapShape {
    pub(super) big_endian: bool,
    pub(super) nanos: bool,
    /// Seconds of the last good record.
    pub(super) last_sec: Option<u32>,
}

impl PcapShape {
    fn word(self, b: &[u8], i: usize) -> Option<u32> {
        let w = *b.get(i * 4..i * 4 + 4)?.first_chunk::<4>()?;
        Some(if self.big_endian {
            u32::from_be_bytes(w)
        } else {
            u32::from_le_bytes(w)
        })
    }

    /// The header at the start of `b` on its own: `Some(captured length, seconds)` when
    /// plausible against `near` (a time in seconds).
    fn header(self, b: &[u8], near: Option<u32>) -> Option<(usize, u32)> {
        let (sec, frac, incl, orig) = (
            self.word(b, 0)?,
            self.word(b, 1)?,
            self.word(b, 2)?,
            self.word(b, 3)?,
        );
        let frac_max = if self.nanos { 1_000_000_000 } else { 1_000_000 };
        let time_ok = near.is_none_or(|t| {
            sec >= t.saturating_sub(BEFORE_SECS) && sec <= t.saturating_add(AFTER_SECS)
        });
        let ok = frac < frac_max
            && (1..=MAX_PCAP_CAPLEN).contains(&incl)
            && incl <= orig
            && orig <= MAX_PCAP_ORIG_LEN
            && time_ok;
        ok.then_some((incl as usize, sec))
    }

    /// Whether `b` starts with a plausible record (see the module docs); `eof`: `b` runs to
    /// the end of the file.
    pub(super) fn probe(self, b: &[u8], eof: bool) -> Probe {
        const HDR: usize = 16;
        if b.len() < HDR {
            return if eof { Probe::No } else { Probe::NeedMore };
        }
        let Some((incl, sec)) = self.header(b, self.last_sec) else {
            return Probe::No;
        };
        let next = HDR + incl;
        match b.get(next..) {
            Some([]) if eof => Probe::Yes,
            Some(rest) if rest.len() >= HDR => match self.header(rest, Some(sec)) {
                Some(_) => Probe::Yes,
                None => Probe::No,
            },
            _ if eof => Probe::No,
            _ => Probe::NeedMore,
        }
    }
}

/// Scans `input` for the first position where `probe` says yes, reading more as needed, and
/// consumes the bytes before it. Returns whether one was found (otherwise everything up to
/// the end of the input is consumed).
pub(super) fn scan<R: Read>(
    input: &mut Input<R>,
    mut probe: impl FnMut(&[u8], bool) -> Probe,
) -> io::Result<bool> {
    loop {
        let eof = input.eof;
        let avail = input.avail();
        let mut at = None;
        let mut more_at = None;
        for i in 0..avail.len() {
            match probe(avail.get(i..).unwrap_or(&[]), eof) {
                Probe::Yes => {
                    at = Some(i);
                    break;
                }
                Probe::NeedMore => {
                    more_at = Some(i);
                    break;
                }
                Probe::No => {}
            }
        }
        let len = avail.len();
        if let Some(i) = at {
            input.consume(i);
            return Ok(true);
        }
        input.consume(more_at.unwrap_or(len));
        if eof {
            return Ok(false);
        }
        if let Fill::Eof = input.fill()? {
            // Probed again with `eof` set.
        }
    }
}
