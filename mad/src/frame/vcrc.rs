//! Variant CRC of native InfiniBand packets (docs/framing.md §1.7).
//!
//! CRC-16 with polynomial 0x100B (x¹⁶ + x¹² + x³ + x + 1), reflected input and output (so the
//! reflected polynomial 0xD008 is used with a right-shifting register), initial value 0xFFFF,
//! final XOR 0xFFFF, over LRH..ICRC inclusive, stored little-endian after the ICRC.
//!
//! No crate in the workspace offers this CRC (the `crc` catalogue has no 0x100B entry), so it
//! is a byte-wise table implementation here; the table is built at compile time.

use super::{FrameError, VcrcStatus};

/// Length of the VCRC.
pub const VCRC_LEN: usize = 2;

/// Reflected polynomial.
const POLY_REFLECTED: u16 = 0xd008;

/// `TABLE[b]`: the register after shifting byte `b` through a zero register.
const TABLE: [u16; 256] = make_table();

// Indexing is bounded by the loop condition and evaluated at compile time (an out-of-bounds
// index would be a compile error, not a run-time panic).
#[allow(clippy::indexing_slicing)]
const fn make_table() -> [u16; 256] {
    let mut table = [0u16; 256];
    let mut i = 0;
    while i < 256 {
        let mut crc = i as u16;
        let mut bit = 0;
        while bit < 8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ POLY_REFLECTED
            } else {
                crc >> 1
            };
            bit += 1;
        }
        table[i] = crc;
        i += 1;
    }
    table
}

/// The VCRC of `data` (LRH through ICRC).
pub fn compute(data: &[u8]) -> u16 {
    let mut crc: u16 = 0xffff;
    for &b in data {
        let idx = usize::from((crc as u8) ^ b);
        crc = (crc >> 8) ^ TABLE.get(idx).copied().unwrap_or(0);
    }
    crc ^ 0xffff
}

/// Checks a native IB packet `packet` = LRH..ICRC followed by the 2-byte VCRC. Under
/// `cfg(fuzzing)` the check always passes.
///
/// # Errors
/// [`FrameError::Truncated`] if `packet` is shorter than 2 bytes; [`FrameError::BadVcrc`].
pub fn verify(packet: &[u8]) -> Result<(), FrameError> {
    let at = packet
        .len()
        .checked_sub(VCRC_LEN)
        .ok_or(FrameError::Truncated {
            layer: "VCRC",
            offset: 0,
            need: VCRC_LEN,
            have: packet.len(),
        })?;
    let (covered, tail) = packet.split_at_checked(at).unwrap_or((packet, &[]));
    let found = u16::from_le_bytes(tail.first_chunk().copied().unwrap_or_default());
    match VcrcStatus::compare(compute(covered), found) {
        VcrcStatus::Bad { expected, found } => Err(FrameError::BadVcrc { expected, found }),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The bit-at-a-time definition, for cross-checking the table.
    fn bitwise(data: &[u8]) -> u16 {
        let mut crc: u16 = 0xffff;
        for &b in data {
            crc ^= u16::from(b);
            for _ in 0..8 {
                crc = if crc & 1 != 0 {
                    (crc >> 1) ^ POLY_REFLECTED
                } else {
                    crc >> 1
                };
            }
        }
        crc ^ 0xffff
    }

    #[test]
    fn table_matches_bitwise() {
        let data: Vec<u8> = (0..=255u8).chain((0..=255u8).rev()).collect();
        for n in [0, 1, 2, 7, 100, 512] {
            assert_eq!(compute(&data[..n]), bitwise(&data[..n]));
        }
    }
}
