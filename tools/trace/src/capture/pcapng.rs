//! pcapng, parsed with nom: block framing (type, length, body, trailing length), the Section
//! Header Block (byte order), Interface Description Blocks (link type, snaplen, the options
//! `if_tsresol` and `if_tsoffset`), and the packet blocks (Enhanced Packet Block, the obsolete
//! Packet Block, Simple Packet Block). Other blocks are skipped whole.
//!
//! The checks are those of pcap-file 3.0.0-rc.3's parser, which this replaced: block lengths
//! are multiples of 4, at least 12 and equal at both ends; a section starts with a known
//! byte-order magic; an interface's reserved field is zero; options are well framed and
//! `if_tsresol` / `if_tsoffset` have their sizes and `if_tsresol` a resolution of at most
//! 10^-9 s (decimal) or 2^-29 s (binary). Unlike pcap-file, the contents of the options this
//! reader does not use (names, addresses, filters…) are not checked.

use std::time::Duration;

use nom::bytes::complete::take;
use nom::number::complete::{be_u32, i64 as ng_i64, u16 as ng_u16, u32 as ng_u32, u8 as ng_u8};
use nom::number::Endianness;
use nom::{IResult, Parser};

use super::resync::Probe;
use super::step::{Meta, Step};

/// Block types handled here.
const SHB: u32 = 0x0A0D_0D0A;
const IDB: u32 = 0x0000_0001;
const PB: u32 = 0x0000_0002;
const SPB: u32 = 0x0000_0003;
const EPB: u32 = 0x0000_0006;
/// Section Header Block byte-order magic, read big-endian.
const MAGIC_BE: u32 = 0x1A2B_3C4D;
const MAGIC_LE: u32 = 0x4D3C_2B1A;
/// Option codes.
const OPT_ENDOFOPT: u16 = 0;
const IF_TSRESOL: u16 = 9;
const IF_TSOFFSET: u16 = 14;
/// Type, length and trailing length around a block body.
const MIN_BLOCK: usize = 12;
/// Offset of the body in a block (type + length).
const BLOCK_BODY: usize = 8;
/// Fixed part of an (Enhanced) Packet Block body: interface, timestamp (2 words), captured
/// and original length.
const EPB_FIXED: usize = 20;
/// Fixed part of a Section Header Block body: magic, versions, section length.
const SHB_FIXED: usize = 16;
/// Fixed part of an Interface Description Block body: link type, reserved, snaplen.
const IDB_FIXED: usize = 8;
const NANOS_PER_SEC: u128 = 1_000_000_000;

/// Why a step stopped short of a block.
enum Stop {
    /// More bytes are needed; the block claims this many.
    Incomplete(usize),
    /// Unrecoverable.
    Fatal(String),
}

/// nom's parsers over byte slices, with no error detail (the callers say what was missing).
type Res<'a, T> = IResult<&'a [u8], T, ()>;

/// One block, framing checked.
struct RawBlock<'a> {
    ty: u32,
    /// Total length (header and trailer included).
    len: usize,
    body: &'a [u8],
    /// For a Section Header Block: the section's byte order.
    section_order: Option<Endianness>,
}

/// Frames the block at the start of `avail`; `order` is the current section's byte order.
fn raw_block(avail: &[u8], order: Endianness) -> Result<RawBlock<'_>, Stop> {
    // Every block has at least a type, a length and a trailing length; a Section Header
    // Block's first body word is its byte-order magic, which says how to read its length.
    let head: Res<'_, (u32, u32, u32)> = (be_u32, be_u32, be_u32).parse(avail);
    let Ok((_, (ty_be, _, magic))) = head else {
        return Err(Stop::Incomplete(MIN_BLOCK));
    };
    let section_order = if ty_be == SHB {
        match magic {
            MAGIC_BE => Some(Endianness::Big),
            MAGIC_LE => Some(Endianness::Little),
            m => return Err(Stop::Fatal(format!("invalid byte-order magic {m:#010x}"))),
        }
    } else {
        None
    };
    let order = section_order.unwrap_or(order);
    let head: Res<'_, (u32, u32)> = (ng_u32(order), ng_u32(order)).parse(avail);
    let Ok((rest, (ty, len))) = head else {
        return Err(Stop::Incomplete(MIN_BLOCK));
    };
    if len % 4 != 0 {
        return Err(Stop::Fatal(format!(
            "block length {len} is not a multiple of 4"
        )));
    }
    let len = usize::try_from(len).unwrap_or(usize::MAX);
    if len < MIN_BLOCK {
        return Err(Stop::Fatal(format!(
            "block length {len} is shorter than {MIN_BLOCK} bytes"
        )));
    }
    let tail: Res<'_, (&[u8], u32)> = (take(len - MIN_BLOCK), ng_u32(order)).parse(rest);
    let Ok((_, (body, trailer))) = tail else {
        return Err(Stop::Incomplete(len));
    };
    if usize::try_from(trailer).ok() != Some(len) {
        return Err(Stop::Fatal(format!(
            "block length fields differ: {len} at the start, {trailer} at the end"
        )));
    }
    Ok(RawBlock {
        ty,
        len,
        body,
        section_order,
    })
}

/// An option's code and value; `None` for `opt_endofopt`.
type PcapNgOption<'a> = Option<(u16, &'a [u8])>;

/// One option (its padding consumed) and the bytes after it.
fn option(input: &[u8], order: Endianness) -> Result<(&[u8], PcapNgOption<'_>), String> {
    let head: Res<'_, (u16, u16)> = (ng_u16(order), ng_u16(order)).parse(input);
    let Ok((rest, (code, len))) = head else {
        return Err(format!(
            "option header cut short ({} bytes left)",
            input.len()
        ));
    };
    if code == OPT_ENDOFOPT {
        return Ok((rest, None));
    }
    let len = usize::from(len);
    let padded = len + (4 - len % 4) % 4;
    let value: Res<'_, (&[u8], &[u8])> = (take(len), take(padded - len)).parse(rest);
    let Ok((rest, (value, _))) = value else {
        return Err(format!(
            "option {code} claims {padded} bytes, {} are left",
            rest.len()
        ));
    };
    Ok((rest, Some((code, value))))
}

/// Calls `each` on every option of `input` up to `opt_endofopt` or the end of the block.
fn for_each_option(
    mut input: &[u8],
    order: Endianness,
    mut each: impl FnMut(u16, &[u8]) -> Result<(), String>,
) -> Result<(), String> {
    while !input.is_empty() {
        let (rest, opt) = option(input, order)?;
        let Some((code, value)) = opt else {
            return Ok(());
        };
        each(code, value)?;
        input = rest;
    }
    Ok(())
}

/// Timestamp units of an interface (`if_tsresol`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TsUnit {
    /// 10^-n s.
    Decimal(u8),
    /// 2^-n s.
    Binary(u8),
}

impl TsUnit {
    /// Microseconds, the default.
    const DEFAULT: TsUnit = TsUnit::Decimal(6);

    /// The `if_tsresol` value: bit 7 set = binary exponent.
    fn from_option(raw: u8) -> Result<TsUnit, String> {
        let n = raw & 0x7f;
        match raw & 0x80 {
            0 if n <= 9 => Ok(TsUnit::Decimal(n)),
            0x80 if n <= 29 => Ok(TsUnit::Binary(n)),
            _ => Err(format!("if_tsresol {raw:#04x} is finer than a nanosecond")),
        }
    }

    /// Nanoseconds of `raw` units.
    fn nanos(self, raw: u64) -> u128 {
        match self {
            TsUnit::Decimal(n) => u128::from(raw) * 10u128.pow(9 - u32::from(n.min(9))),
            TsUnit::Binary(n) => (u128::from(raw) * NANOS_PER_SEC) >> n,
        }
    }
}

/// What an Interface Description Block says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Interface {
    link_type: u32,
    snaplen: u32,
    unit: TsUnit,
    /// `if_tsoffset`: seconds added to every timestamp.
    offset: i64,
}

impl Interface {
    fn parse(body: &[u8], order: Endianness) -> Result<Interface, String> {
        let fixed: Res<'_, (u16, u16, u32)> =
            (ng_u16(order), ng_u16(order), ng_u32(order)).parse(body);
        let Ok((options, (link_type, reserved, snaplen))) = fixed else {
            return Err(format!(
                "interface description block body of {} bytes (at least {IDB_FIXED})",
                body.len()
            ));
        };
        if reserved != 0 {
            return Err(format!(
                "interface description block reserved field is {reserved:#06x}"
            ));
        }
        let mut unit = None;
        let mut offset = None;
        for_each_option(options, order, |code, value| {
            match code {
                IF_TSRESOL => {
                    let one: Res<'_, u8> = ng_u8(value);
                    let raw = match one {
                        Ok(([], raw)) => raw,
                        _ => return Err(format!("if_tsresol of {} bytes", value.len())),
                    };
                    let u = TsUnit::from_option(raw)?;
                    unit.get_or_insert(u);
                }
                IF_TSOFFSET => {
                    let eight: Res<'_, i64> = ng_i64(order).parse(value);
                    let secs = match eight {
                        Ok(([], secs)) => secs,
                        _ => return Err(format!("if_tsoffset of {} bytes", value.len())),
                    };
                    offset.get_or_insert(secs);
                }
                _ => {}
            }
            Ok(())
        })?;
        Ok(Interface {
            link_type: u32::from(link_type),
            snaplen,
            unit: unit.unwrap_or(TsUnit::DEFAULT),
            offset: offset.unwrap_or(0),
        })
    }

    /// The capture time of a packet stamped `hi`:`lo` on this interface.
    fn timestamp(&self, hi: u32, lo: u32) -> Result<Duration, String> {
        let raw = (u64::from(hi) << 32) | u64::from(lo);
        let ns = self.unit.nanos(raw);
        let nanos = u32::try_from(ns % NANOS_PER_SEC).unwrap_or(0);
        let at = u64::try_from(ns / NANOS_PER_SEC)
            .ok()
            .map(|secs| Duration::new(secs, nanos));
        let shift = Duration::from_secs(self.offset.unsigned_abs());
        at.and_then(|t| {
            if self.offset >= 0 {
                t.checked_add(shift)
            } else {
                t.checked_sub(shift)
            }
        })
        .ok_or_else(|| {
            format!(
                "timestamp {raw:#x} ({:?}, offset {} s) is out of range",
                self.unit, self.offset
            )
        })
    }
}

/// The pcapng reader's state: the current section's byte order and interfaces.
#[derive(Debug)]
pub(super) struct PcapNg {
    order: Endianness,
    interfaces: Vec<Interface>,
}

impl PcapNg {
    /// Reads the first Section Header Block. Returns the bytes left after it;
    /// `Err(None)` when more bytes are needed.
    pub(super) fn new(avail: &[u8]) -> Result<(&[u8], PcapNg), Option<String>> {
        let mut ng = PcapNg {
            order: Endianness::Big,
            interfaces: Vec::new(),
        };
        let block = match raw_block(avail, ng.order) {
            Ok(b) => b,
            Err(Stop::Incomplete(_)) => return Err(None),
            Err(Stop::Fatal(reason)) => return Err(Some(reason)),
        };
        if block.ty != SHB {
            return Err(Some("the file does not start with a section header".into()));
        }
        ng.section(&block).map_err(Some)?;
        Ok((avail.get(block.len..).unwrap_or(&[]), ng))
    }

    /// A new section: its byte order; no interfaces yet.
    fn section(&mut self, block: &RawBlock<'_>) -> Result<(), String> {
        let order = block.section_order.unwrap_or(self.order);
        let fixed: Res<'_, (u32, u16, u16, i64)> =
            (be_u32, ng_u16(order), ng_u16(order), ng_i64(order)).parse(block.body);
        let Ok((options, _)) = fixed else {
            return Err(format!(
                "section header block body of {} bytes (at least {SHB_FIXED})",
                block.body.len()
            ));
        };
        for_each_option(options, order, |_, _| Ok(()))?;
        self.order = order;
        self.interfaces.clear();
        Ok(())
    }

    /// Whether `b` starts with a plausible block (resynchronising after a damaged one): a
    /// known block type, framed right (a length that is a multiple of 4, at least 12, at most
    /// [`MAX_RECORD_LEN`](super::MAX_RECORD_LEN), and repeated at the block's end); an EPB
    /// must name a known interface. `eof`: `b` runs to the end of the file.
    pub(super) fn probe(&self, b: &[u8], eof: bool) -> Probe {
        match raw_block(b, self.order) {
            Ok(block) => {
                let known = matches!(
                    block.ty,
                    SHB | IDB | PB | SPB | EPB | 4 | 5 | 0x0A | 0x0BAD | 0x4000_0BAD
                );
                let iface_ok = block.ty != EPB
                    || ng_u32::<_, ()>(self.order)(block.body)
                        .is_ok_and(|(_, i)| (i as usize) < self.interfaces.len());
                if known && iface_ok {
                    Probe::Yes
                } else {
                    Probe::No
                }
            }
            Err(Stop::Incomplete(need)) if !eof && need <= super::MAX_RECORD_LEN => Probe::NeedMore,
            Err(_) => Probe::No,
        }
    }

    /// One block from the buffered bytes `avail`.
    pub(super) fn step(&mut self, avail: &[u8]) -> Step {
        let block = match raw_block(avail, self.order) {
            Ok(b) => b,
            Err(Stop::Incomplete(need)) => return Step::Incomplete(need),
            Err(Stop::Fatal(reason)) => return Step::Fatal(reason),
        };
        let len = block.len;
        let done = match block.ty {
            SHB => self.section(&block),
            IDB => Interface::parse(block.body, self.order).map(|i| self.interfaces.push(i)),
            EPB | PB => {
                return match self.epb(block.body, block.ty == PB) {
                    Ok(meta) => Step::Packet { len, meta },
                    Err(reason) => Step::Fatal(reason),
                }
            }
            SPB => {
                return match self.spb(block.body) {
                    Ok(meta) => Step::Packet { len, meta },
                    Err(reason) => Step::Fatal(reason),
                }
            }
            _ => Ok(()),
        };
        match done {
            Ok(()) => Step::Skip(len),
            Err(reason) => Step::Fatal(reason),
        }
    }

    /// Interface `id`.
    fn interface(&self, id: u32) -> Result<&Interface, String> {
        usize::try_from(id)
            .ok()
            .and_then(|i| self.interfaces.get(i))
            .ok_or_else(|| format!("interface {id} has no Interface Description Block"))
    }

    /// Enhanced Packet Block, or (`obsolete`) the old Packet Block, whose first word holds a
    /// 16-bit interface ID and a drop count.
    fn epb(&self, body: &[u8], obsolete: bool) -> Result<Meta, String> {
        let order = self.order;
        let fixed: Res<'_, (u32, u32, u32, u32, u32)> = (
            ng_u32(order),
            ng_u32(order),
            ng_u32(order),
            ng_u32(order),
            ng_u32(order),
        )
            .parse(body);
        let Ok((rest, (word0, ts_hi, ts_lo, caplen, orig_len))) = fixed else {
            return Err(format!(
                "packet block body of {} bytes is too short",
                body.len()
            ));
        };
        let caplen = usize::try_from(caplen).unwrap_or(usize::MAX);
        // The captured data; the padding and the options after it are not needed.
        let data: Res<'_, &[u8]> = take(caplen).parse(rest);
        if data.is_err() {
            return Err(format!(
                "captured length {caplen} exceeds the block body ({} bytes)",
                body.len()
            ));
        }
        let interface = match (obsolete, order) {
            (false, _) => word0,
            (true, Endianness::Big) => word0 >> 16,
            (true, _) => word0 & 0xffff,
        };
        let idb = self.interface(interface)?;
        Ok(Meta {
            data_off: BLOCK_BODY + EPB_FIXED,
            caplen,
            orig_len,
            timestamp: idb.timestamp(ts_hi, ts_lo)?,
            link_type: idb.link_type,
            interface,
        })
    }

    /// Simple Packet Block: original length, then data (captured length = min(original
    /// length, interface 0 snaplen, body)). No timestamp.
    fn spb(&self, body: &[u8]) -> Result<Meta, String> {
        let word: Res<'_, u32> = ng_u32(self.order).parse(body);
        let Ok((data, orig_len)) = word else {
            return Err(format!("simple packet block body of {} bytes", body.len()));
        };
        let idb = self.interface(0)?;
        let snaplen = usize::try_from(idb.snaplen).unwrap_or(usize::MAX);
        let mut caplen = usize::try_from(orig_len)
            .unwrap_or(usize::MAX)
            .min(data.len());
        if snaplen > 0 {
            caplen = caplen.min(snaplen);
        }
        Ok(Meta {
            data_off: BLOCK_BODY + 4,
            caplen,
            orig_len,
            timestamp: Duration::ZERO,
            link_type: idb.link_type,
            interface: 0,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units() {
        assert_eq!(TsUnit::from_option(6), Ok(TsUnit::Decimal(6)));
        assert_eq!(TsUnit::from_option(0x80 | 20), Ok(TsUnit::Binary(20)));
        assert!(TsUnit::from_option(10).is_err());
        assert!(TsUnit::from_option(0x80 | 30).is_err());
        assert_eq!(TsUnit::Decimal(6).nanos(1_500_000), 1_500_000_000);
        assert_eq!(TsUnit::Binary(1).nanos(3), 1_500_000_000);
        // The widest values stay in range.
        assert_eq!(
            TsUnit::Decimal(0).nanos(u64::MAX),
            u128::from(u64::MAX) * NANOS_PER_SEC
        );
    }

    #[test]
    fn timestamps_with_offsets() {
        let mut i = Interface {
            link_type: 1,
            snaplen: 0,
            unit: TsUnit::Decimal(9),
            offset: 100,
        };
        assert_eq!(i.timestamp(0, 1_000_000_001), Ok(Duration::new(101, 1)));
        i.offset = -2;
        assert!(i.timestamp(0, 1).is_err(), "before the epoch");
        i.unit = TsUnit::Decimal(0);
        i.offset = 1;
        assert!(
            i.timestamp(u32::MAX, u32::MAX).is_err(),
            "past Duration::MAX"
        );
    }

    /// A little-endian block around `body`.
    fn block(ty: u32, body: &[u8]) -> Vec<u8> {
        let len = u32::try_from(12 + body.len()).unwrap();
        let mut b = ty.to_le_bytes().to_vec();
        b.extend_from_slice(&len.to_le_bytes());
        b.extend_from_slice(body);
        b.extend_from_slice(&len.to_le_bytes());
        b
    }

    fn stop(r: Result<RawBlock<'_>, Stop>) -> String {
        match r {
            Ok(_) => "ok".into(),
            Err(Stop::Incomplete(n)) => format!("incomplete {n}"),
            Err(Stop::Fatal(s)) => s,
        }
    }

    #[test]
    fn framing_errors() {
        let le = Endianness::Little;
        let good = block(0x1234, &[1, 2, 3, 4]);
        let b = raw_block(&good, le).ok().unwrap();
        assert_eq!((b.ty, b.len, b.body), (0x1234, 16, &[1u8, 2, 3, 4][..]));
        assert_eq!(stop(raw_block(&good[..11], le)), "incomplete 12");
        assert_eq!(stop(raw_block(&good[..15], le)), "incomplete 16");
        let mut odd = good.clone();
        odd[4] = 14;
        assert!(stop(raw_block(&odd, le)).contains("multiple of 4"));
        let mut short = good.clone();
        short[4] = 8;
        assert!(stop(raw_block(&short, le)).contains("shorter than 12"));
        let mut mismatch = good;
        mismatch[12] = 20;
        assert!(stop(raw_block(&mismatch, le)).contains("differ: 16 at the start, 20"));
        let bad_magic = block(SHB, &[0; 16]);
        assert!(stop(raw_block(&bad_magic, le)).contains("byte-order magic"));
    }

    #[test]
    fn options_and_interfaces() {
        let le = Endianness::Little;
        // link type 1, snaplen 9000, if_name "eth0", if_tsresol 9, if_tsoffset 5, end.
        let mut body = vec![1, 0, 0, 0];
        body.extend_from_slice(&9000u32.to_le_bytes());
        body.extend_from_slice(&[2, 0, 4, 0, b'e', b't', b'h', b'0']);
        body.extend_from_slice(&[9, 0, 1, 0, 9, 0, 0, 0]);
        body.extend_from_slice(&[14, 0, 8, 0]);
        body.extend_from_slice(&5i64.to_le_bytes());
        body.extend_from_slice(&[0, 0, 0, 0]);
        let i = Interface::parse(&body, le).unwrap();
        assert_eq!(
            i,
            Interface {
                link_type: 1,
                snaplen: 9000,
                unit: TsUnit::Decimal(9),
                offset: 5
            }
        );
        // An option running past the block.
        let mut cut = body[..8].to_vec();
        cut.extend_from_slice(&[2, 0, 9, 0, b'e']);
        assert!(Interface::parse(&cut, le)
            .unwrap_err()
            .contains("option 2 claims 12 bytes"));
        // A bad if_tsresol size; a reserved field in use.
        let mut bad = body[..8].to_vec();
        bad.extend_from_slice(&[9, 0, 2, 0, 9, 9, 0, 0]);
        assert!(Interface::parse(&bad, le)
            .unwrap_err()
            .contains("if_tsresol of 2"));
        let mut reserved = body.clone();
        reserved[2] = 1;
        assert!(Interface::parse(&reserved, le)
            .unwrap_err()
            .contains("reserved"));
        assert!(Interface::parse(&body[..7], le).is_err());
    }
}
