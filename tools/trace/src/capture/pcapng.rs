//! pcapng: one block per step. pcap-file's `PcapNgParser` frames the blocks and keeps the
//! section state (byte order, interfaces, `if_tsresol` / `if_tsoffset`); the bodies of the
//! packet blocks (EPB, the obsolete PB, SPB) are parsed here with nom.

use std::time::Duration;

use nom::bytes::complete::take;
use nom::number::complete::u32 as ng_u32;
use nom::number::Endianness as NomEndianness;
use nom::IResult;
use nom::Parser;
use pcap_file::pcapng::{PcapNgParseError, PcapNgParser, PcapNgState};
use pcap_file::Endianness;

use super::chain;
use super::reader::{Meta, Step};

/// pcapng block types handled here.
const PCAPNG_PB: u32 = 0x0000_0002;
const PCAPNG_SPB: u32 = 0x0000_0003;
const PCAPNG_EPB: u32 = 0x0000_0006;
/// Offset of the body in a pcapng block (type + length).
const BLOCK_BODY: usize = 8;
/// Fixed part of an (Enhanced) Packet Block body: interface, timestamp (2 words), captured
/// and original length.
const EPB_FIXED: usize = 20;

/// One step of the pcapng reader on the buffered bytes `avail`.
pub(super) fn pcapng_step(parser: &mut PcapNgParser, avail: &[u8]) -> Step {
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

/// The section's byte order, for nom.
fn order(state: &PcapNgState) -> NomEndianness {
    match state.endianness() {
        Endianness::Big => NomEndianness::Big,
        Endianness::Little => NomEndianness::Little,
    }
}

/// The link type of interface `id`.
fn interface_link_type(state: &PcapNgState, id: u32) -> Result<u32, String> {
    usize::try_from(id)
        .ok()
        .and_then(|i| state.interfaces().get(i))
        .map(|idb| u32::from(idb.linktype))
        .ok_or_else(|| format!("interface {id} has no Interface Description Block"))
}

/// The fixed words of an (Enhanced) Packet Block body, then its captured data (the padding and
/// the options that follow are not needed).
struct PacketBlock<'a> {
    word0: u32,
    ts_hi: u32,
    ts_lo: u32,
    orig_len: u32,
    data: &'a [u8],
}

/// Parses an (Enhanced) Packet Block body. `Err(None)`: the fixed part is missing;
/// `Err(Some(caplen))`: the captured length runs past the body.
fn packet_block(body: &[u8], endian: NomEndianness) -> Result<PacketBlock<'_>, Option<usize>> {
    let fixed: IResult<&[u8], _> = (
        ng_u32(endian),
        ng_u32(endian),
        ng_u32(endian),
        ng_u32(endian),
        ng_u32(endian),
    )
        .parse(body);
    let (rest, (word0, ts_hi, ts_lo, caplen, orig_len)) = fixed.map_err(|_| None)?;
    let caplen = usize::try_from(caplen).unwrap_or(usize::MAX);
    let data: IResult<&[u8], &[u8]> = take(caplen).parse(rest);
    let (_, data) = data.map_err(|_| Some(caplen))?;
    Ok(PacketBlock {
        word0,
        ts_hi,
        ts_lo,
        orig_len,
        data,
    })
}

/// Enhanced Packet Block, or (`obsolete`) the old Packet Block, whose first word holds a
/// 16-bit interface ID and a drop count.
fn epb(state: &PcapNgState, body: &[u8], obsolete: bool) -> Result<Meta, String> {
    let pb = packet_block(body, order(state)).map_err(|e| match e {
        None => format!("packet block body of {} bytes is too short", body.len()),
        Some(caplen) => format!(
            "captured length {caplen} exceeds the block body ({} bytes)",
            body.len()
        ),
    })?;
    let interface = if obsolete {
        match state.endianness() {
            Endianness::Big => pb.word0 >> 16,
            Endianness::Little => pb.word0 & 0xffff,
        }
    } else {
        pb.word0
    };
    let link_type = interface_link_type(state, interface)?;
    let timestamp = state
        .decode_timestamp(interface, pb.ts_hi, pb.ts_lo)
        .map_err(|e| chain(&e))?;
    Ok(Meta {
        data_off: BLOCK_BODY + EPB_FIXED,
        caplen: pb.data.len(),
        orig_len: pb.orig_len,
        timestamp,
        link_type,
        interface,
    })
}

/// Simple Packet Block: original length, then data (captured length = min(original length,
/// interface 0 snaplen, body)). No timestamp.
fn spb(state: &PcapNgState, body: &[u8]) -> Result<Meta, String> {
    let parsed: IResult<&[u8], u32> = ng_u32(order(state)).parse(body);
    let (data, orig_len) =
        parsed.map_err(|_| format!("simple packet block body of {} bytes", body.len()))?;
    let link_type = interface_link_type(state, 0)?;
    let snaplen = state
        .interfaces()
        .first()
        .map_or(0, |idb| usize::try_from(idb.snaplen).unwrap_or(usize::MAX));
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
        link_type,
        interface: 0,
    })
}
