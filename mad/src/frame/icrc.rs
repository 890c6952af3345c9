//! Invariant CRC (docs/framing.md §2): CRC-32/ISO-HDLC (= `zlib.crc32`, computed with
//! crc32fast) over the packet with its variant fields set to all ones, stored little-endian.
//!
//! | encapsulation | covered bytes (masked fields → 0xFF) |
//! |---|---|
//! | RoCEv2 / IPv4 | 8 × 0xFF, IPv4 header (TOS, TTL, checksum), UDP header (checksum), BTH (byte 4), rest |
//! | RoCEv2 / IPv6 | 8 × 0xFF, IPv6 header (TC + flow label, hop limit), UDP (checksum), BTH (byte 4), rest |
//! | RoCEv1 | 8 × 0xFF, GRH (TC + flow label, hop limit), BTH (byte 4), rest |
//! | IB, LNH = 2 | LRH (VL nibble), BTH (byte 4), rest |
//! | IB, LNH = 3 | 8 × 0xFF in place of the LRH, GRH, BTH (byte 4), rest |
//!
//! "rest" runs from the end of the BTH through the pad bytes; the ICRC itself (and the VCRC)
//! are excluded. The headers are masked in a small stack copy and the rest is streamed into
//! the hasher: no allocation.
//!
//! IPv4 options (IHL > 5) are covered like the rest of the header. rxe never sends options, so
//! this case is untested against a real implementation.

use super::wire::set_bytes;
use super::{bth, grh, ipv4, ipv6, lrh, udp, Encap, FrameError, IcrcStatus};

/// Length of the ICRC.
pub const ICRC_LEN: usize = 4;

/// The "LRH" stand-in for RoCE and for LNH = 3.
const LRH_ONES: [u8; 8] = [0xff; 8];

/// Size of the stack copy of the masked headers: 8 × 0xFF, IPv4 with options (60), UDP (8) and
/// BTH (12). Everything after the BTH is streamed into the hasher from the packet itself.
///
/// Copying the whole packet to hash it in one update was measured no faster: the fresh copy
/// defeats store-to-load forwarding.
const SCRATCH: usize = 8 + 60 + udp::HEADER_LEN + bth::HEADER_LEN;

/// Where things are in a staged copy: `buf[..len]` holds prefix, network headers, BTH and the
/// first `taken` bytes of `bth_on`; the BTH starts at `bth_at`.
struct Staged {
    len: usize,
    bth_at: usize,
    taken: usize,
}

/// Hashes the staged bytes (with BTH byte 4 masked) followed by the rest of `bth_on`.
#[inline]
fn finish(buf: &mut [u8; SCRATCH], st: &Staged, bth_on: &[u8]) -> u32 {
    if let Some(b) = buf.get_mut(st.bth_at + bth::field::RESV8A) {
        *b = 0xff;
    }
    let mut h = crc32fast::Hasher::new();
    h.update(buf.get(..st.len).unwrap_or(&[]));
    if let Some(rest) = bth_on.get(st.taken..).filter(|r| !r.is_empty()) {
        h.update(rest);
    }
    h.finalize()
}

/// Copies `prefix`, `net` and the start of `bth_on` (at least its BTH) into `buf`.
#[inline]
fn stage(
    buf: &mut [u8; SCRATCH],
    prefix: &[u8],
    net: &[u8],
    bth_on: &[u8],
) -> Result<Staged, FrameError> {
    if bth_on.len() < bth::HEADER_LEN {
        return Err(FrameError::Truncated {
            layer: "BTH",
            offset: 0,
            need: bth::HEADER_LEN,
            have: bth_on.len(),
        });
    }
    let bth_at = prefix.len() + net.len();
    if bth_at + bth::HEADER_LEN > SCRATCH {
        return Err(FrameError::BadLength {
            layer: "ICRC headers",
            offset: 0,
            value: net.len(),
        });
    }
    let taken = bth::HEADER_LEN;
    set_bytes(buf, 0, prefix);
    set_bytes(buf, prefix.len(), net);
    set_bytes(buf, bth_at, bth_on.get(..taken).unwrap_or(&[]));
    Ok(Staged {
        len: bth_at + taken,
        bth_at,
        taken,
    })
}

/// Masks an IPv6 header or GRH at `at`: TC + flow label (version nibble kept) and hop limit.
#[inline]
fn mask_v6(buf: &mut [u8], at: usize) {
    if let Some(b) = buf.get_mut(at) {
        *b |= 0x0f;
    }
    for i in [at + 1, at + 2, at + 3, at + ipv6::field::HOP_LIMIT] {
        if let Some(b) = buf.get_mut(i) {
            *b = 0xff;
        }
    }
}

/// ICRC of a RoCEv2 packet.
///
/// `ip_udp` is the IPv4 (any IHL) or IPv6 header followed by the UDP header, exactly;
/// `bth_on` runs from the BTH to the end of the pad bytes (ICRC excluded).
///
/// # Errors
/// [`FrameError::BadLength`] if `ip_udp` is not one IP header + 8 bytes;
/// [`FrameError::BadVersion`] for an IP version other than 4 or 6;
/// [`FrameError::Truncated`] if `bth_on` is shorter than a BTH.
pub fn icrc_rocev2(ip_udp: &[u8], bth_on: &[u8]) -> Result<u32, FrameError> {
    let version = ip_udp.first().map_or(0, |b| b >> 4);
    let ip_len = match version {
        4 => usize::from(ip_udp.first().map_or(0, |b| b & 0x0f)) * 4,
        6 => ipv6::HEADER_LEN,
        v => {
            return Err(FrameError::BadVersion {
                layer: "IP",
                offset: 0,
                value: v,
            })
        }
    };
    if ip_len < ipv4::HEADER_LEN || ip_udp.len() != ip_len + udp::HEADER_LEN {
        return Err(FrameError::BadLength {
            layer: "ICRC IP+UDP headers",
            offset: 0,
            value: ip_udp.len(),
        });
    }
    let mut scratch = [0u8; SCRATCH];
    let st = stage(&mut scratch, &LRH_ONES, ip_udp, bth_on)?;
    let buf = &mut scratch;
    let ip = LRH_ONES.len();
    if version == 4 {
        for i in [
            ip + ipv4::field::TOS,
            ip + ipv4::field::TTL,
            ip + ipv4::field::CHECKSUM.start,
            ip + ipv4::field::CHECKSUM.start + 1,
        ] {
            if let Some(b) = buf.get_mut(i) {
                *b = 0xff;
            }
        }
    } else {
        mask_v6(buf, ip);
    }
    let csum = ip + ip_len + udp::field::CHECKSUM.start;
    for i in [csum, csum + 1] {
        if let Some(b) = buf.get_mut(i) {
            *b = 0xff;
        }
    }
    Ok(finish(buf, &st, bth_on))
}

/// ICRC of a packet whose transport follows a GRH without an LRH in the CRC: RoCEv1, and
/// native IB with LNH = 3 (whose LRH is replaced by 8 × 0xFF).
///
/// `grh` is the 40-byte GRH; `bth_on` runs from the BTH to the end of the pad bytes.
///
/// # Errors
/// [`FrameError::BadLength`] if `grh` is not 40 bytes; [`FrameError::Truncated`] if
/// `bth_on` is shorter than a BTH.
pub fn icrc_grh(grh: &[u8], bth_on: &[u8]) -> Result<u32, FrameError> {
    if grh.len() != grh::HEADER_LEN {
        return Err(FrameError::BadLength {
            layer: "GRH",
            offset: 0,
            value: grh.len(),
        });
    }
    let mut scratch = [0u8; SCRATCH];
    let st = stage(&mut scratch, &LRH_ONES, grh, bth_on)?;
    mask_v6(&mut scratch, LRH_ONES.len());
    Ok(finish(&mut scratch, &st, bth_on))
}

/// ICRC of a native IB packet with LNH = 2: the LRH with its VL nibble masked.
///
/// `lrh` is the 8-byte LRH; `bth_on` runs from the BTH to the end of the pad bytes.
///
/// # Errors
/// [`FrameError::BadLength`] if `lrh` is not 8 bytes; [`FrameError::Truncated`] if
/// `bth_on` is shorter than a BTH.
pub fn icrc_lrh(lrh: &[u8], bth_on: &[u8]) -> Result<u32, FrameError> {
    if lrh.len() != lrh::HEADER_LEN {
        return Err(FrameError::BadLength {
            layer: "LRH",
            offset: 0,
            value: lrh.len(),
        });
    }
    let mut scratch = [0u8; SCRATCH];
    let st = stage(&mut scratch, &[], lrh, bth_on)?;
    if let Some(b) = scratch.get_mut(lrh::field::VL_LVER) {
        *b |= 0xf0;
    }
    Ok(finish(&mut scratch, &st, bth_on))
}

/// ICRC of a whole packet: `packet` starts at the IP header (RoCEv2), GRH (RoCEv1) or LRH
/// (native IB) and ends before the ICRC. For RoCEv2 the IP header length is taken from the
/// packet (IPv4 IHL; IPv6 fixed 40 bytes).
///
/// # Errors
/// [`FrameError::Truncated`] if the packet is shorter than its headers; those of the
/// per-encapsulation functions.
pub fn compute(encap: Encap, packet: &[u8]) -> Result<u32, FrameError> {
    let split = |at: usize, layer: &'static str| {
        packet.split_at_checked(at).ok_or(FrameError::Truncated {
            layer,
            offset: 0,
            need: at,
            have: packet.len(),
        })
    };
    match encap {
        Encap::RoceV2Ipv4 => {
            let ihl = usize::from(packet.first().map_or(0, |b| b & 0x0f)) * 4;
            let (net, rest) = split(ihl + udp::HEADER_LEN, "IPv4")?;
            icrc_rocev2(net, rest)
        }
        Encap::RoceV2Ipv6 => {
            let (net, rest) = split(ipv6::HEADER_LEN + udp::HEADER_LEN, "IPv6")?;
            icrc_rocev2(net, rest)
        }
        Encap::RoceV1 => {
            let (net, rest) = split(grh::HEADER_LEN, "GRH")?;
            icrc_grh(net, rest)
        }
        Encap::IbLocal => {
            let (net, rest) = split(lrh::HEADER_LEN, "LRH")?;
            icrc_lrh(net, rest)
        }
        Encap::IbGlobal => {
            let (_, after_lrh) = split(lrh::HEADER_LEN, "LRH")?;
            let (net, rest) =
                after_lrh
                    .split_at_checked(grh::HEADER_LEN)
                    .ok_or(FrameError::Truncated {
                        layer: "GRH",
                        offset: lrh::HEADER_LEN,
                        need: grh::HEADER_LEN,
                        have: after_lrh.len(),
                    })?;
            icrc_grh(net, rest)
        }
    }
}

/// Splits a packet into what the ICRC covers and the 4 ICRC bytes at its end.
fn split_icrc(packet: &[u8]) -> Result<(&[u8], [u8; ICRC_LEN]), FrameError> {
    let at = packet
        .len()
        .checked_sub(ICRC_LEN)
        .ok_or(FrameError::Truncated {
            layer: "ICRC",
            offset: 0,
            need: ICRC_LEN,
            have: packet.len(),
        })?;
    let (covered, tail) = packet.split_at_checked(at).unwrap_or((packet, &[]));
    let wire = tail.first_chunk::<ICRC_LEN>().copied().unwrap_or_default();
    Ok((covered, wire))
}

/// Checks the ICRC of `packet`, which runs from the IP header / GRH / LRH through the ICRC
/// (VCRC excluded). Under `cfg(fuzzing)` the check always passes.
///
/// # Errors
/// [`FrameError::BadIcrc`] on a mismatch; those of [`compute`].
pub fn verify(encap: Encap, packet: &[u8]) -> Result<(), FrameError> {
    let (covered, wire) = split_icrc(packet)?;
    let expected = compute(encap, covered)?;
    match IcrcStatus::compare(expected, u32::from_le_bytes(wire)) {
        IcrcStatus::Bad { expected, found } => Err(FrameError::BadIcrc { expected, found }),
        _ => Ok(()),
    }
}

/// Computes the ICRC of `packet` (IP header / GRH / LRH through the pad bytes, ICRC slot
/// included) and writes it little-endian into the last 4 bytes.
///
/// # Errors
/// Those of [`compute`].
pub fn fill(encap: Encap, packet: &mut [u8]) -> Result<(), FrameError> {
    let (covered, _) = split_icrc(packet)?;
    let crc = compute(encap, covered)?;
    let at = packet.len().saturating_sub(ICRC_LEN);
    set_bytes(packet, at, &crc.to_le_bytes());
    Ok(())
}

/// ICRC of a whole captured Ethernet frame carrying RoCEv2 (or RoCEv1): the packet is found
/// as [`super::decode()`] finds it (VLAN tags walked, ICRC located from the IP/UDP lengths, any
/// Ethernet padding or FCS ignored) and its ICRC computed; the ICRC on the wire is not read.
///
/// Returns `None` if the frame does not decode to an IB/RoCE packet.
pub fn rocev2_frame_icrc(frame: &[u8]) -> Option<u32> {
    let config = super::DecodeConfig {
        verify_crc: false,
        ..super::DecodeConfig::DEFAULT
    };
    let p = super::decode_with(&config, 1, frame).ok()?.into_ib()?;
    let covered = p.packet.get(..p.packet.len().saturating_sub(ICRC_LEN))?;
    compute(p.encap, covered).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    /// Vector 1: the IBTA sample packet (native IB, LNH = 2), with its ICRC appended.
    #[test]
    fn vector_1_ibta_sample() {
        let pkt = hex(
            "f012375c000e17d20a202487ff87b1b3000dec2a01710a1c015d400238f27a05\
             0000000ebb884d85fd5cfba4728bc0690ed40000",
        );
        assert_eq!(pkt.len(), 52);
        // Already masked: a plain CRC-32 gives the same value.
        assert_eq!(crc32fast::hash(&pkt), 0x5ab7_2596);
        assert_eq!(compute(Encap::IbLocal, &pkt).unwrap(), 0x5ab7_2596);
        let mut with = pkt.clone();
        with.extend_from_slice(&[0x96, 0x25, 0xb7, 0x5a]);
        verify(Encap::IbLocal, &with).unwrap();
    }

    /// Vector 2: RoCEv2 CNP from a ConnectX-4 Lx (scapy's roce.uts).
    #[test]
    fn vector_2_cnp() {
        let frame = hex(
            "e41d2dab2bc27cfe90643b32080045c2003c718c4000401191610a0011010a00\
             1201000012b7002800008100ffff400001180000000000000000000000000000\
             000000000000",
        );
        assert_eq!(frame.len(), 70);
        let ip = &frame[14..];
        assert_eq!(
            compute(Encap::RoceV2Ipv4, ip).unwrap().to_le_bytes(),
            [0x82, 0xfd, 0x00, 0x2a]
        );
        let mut whole = frame.clone();
        whole.extend_from_slice(&[0x82, 0xfd, 0x00, 0x2a]);
        assert_eq!(
            rocev2_frame_icrc(&whole).unwrap().to_le_bytes(),
            [0x82, 0xfd, 0x00, 0x2a]
        );
        whole[23] = 6;
        assert_eq!(rocev2_frame_icrc(&whole), None);
    }

    #[test]
    fn masked_fields_do_not_matter() {
        let frame = hex(
            "45c2003c718c4000401191610a0011010a001201000012b7002800008100ffff\
             400001180000000000000000000000000000000000000000",
        );
        let base = compute(Encap::RoceV2Ipv4, &frame).unwrap();
        for i in [1, 8, 10, 11, 20 + 6, 20 + 7, 28 + 4] {
            let mut f = frame.clone();
            f[i] ^= 0x5a;
            assert_eq!(compute(Encap::RoceV2Ipv4, &f).unwrap(), base, "byte {i}");
        }
        for i in [2, 4, 6, 9, 12, 20, 22, 28, 29, 33, 40] {
            let mut f = frame.clone();
            f[i] ^= 0x01;
            assert_ne!(compute(Encap::RoceV2Ipv4, &f).unwrap(), base, "byte {i}");
        }
    }

    #[test]
    fn short_inputs_are_errors() {
        let frame = [0x45u8; 64];
        for n in 0..40 {
            assert!(compute(Encap::RoceV2Ipv4, &frame[..n]).is_err());
            assert!(compute(Encap::RoceV2Ipv6, &frame[..n]).is_err());
            assert!(compute(Encap::RoceV1, &frame[..n]).is_err());
            assert!(compute(Encap::IbGlobal, &frame[..n]).is_err());
            assert!(verify(Encap::IbLocal, &frame[..n.min(3)]).is_err());
        }
        for n in 0..20 {
            assert!(compute(Encap::IbLocal, &frame[..n]).is_err());
        }
        assert!(matches!(
            icrc_rocev2(&[0x55; 28], &[0; 12]),
            Err(FrameError::BadVersion { value: 5, .. })
        ));
    }
}
