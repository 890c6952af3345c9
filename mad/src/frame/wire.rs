//! Panic-free big-endian field access shared by the header views.
//!
//! Every reader returns 0 (and every writer does nothing) when the field lies outside the
//! buffer. The views only call them after `check_len`, so that fallback is never observable
//! through a checked view; it exists so that an unchecked view cannot panic either.

use core::ops::Range;

/// Byte at `at`, or 0.
#[inline]
pub(crate) fn u8_at(b: &[u8], at: usize) -> u8 {
    b.get(at).copied().unwrap_or(0)
}

/// Fixed-size array at `at`, or all zeros.
#[inline]
pub(crate) fn array_at<const N: usize>(b: &[u8], at: usize) -> [u8; N] {
    b.get(at..)
        .and_then(<[u8]>::first_chunk::<N>)
        .copied()
        .unwrap_or([0; N])
}

/// Big-endian u16 at `at`.
#[inline]
pub(crate) fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes(array_at(b, at))
}

/// Big-endian 24-bit value at `at`.
#[inline]
pub(crate) fn u24_at(b: &[u8], at: usize) -> u32 {
    let [x, y, z] = array_at::<3>(b, at);
    u32::from_be_bytes([0, x, y, z])
}

/// Big-endian u32 at `at`.
#[inline]
pub(crate) fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes(array_at(b, at))
}

/// Writes `v` at `at`.
#[inline]
pub(crate) fn set_u8(b: &mut [u8], at: usize, v: u8) {
    if let Some(x) = b.get_mut(at) {
        *x = v;
    }
}

/// Copies `src` to `at`.
#[inline]
pub(crate) fn set_bytes(b: &mut [u8], at: usize, src: &[u8]) {
    let Some(end) = at.checked_add(src.len()) else {
        return;
    };
    if let Some(dst) = b.get_mut(at..end) {
        dst.copy_from_slice(src);
    }
}

/// Writes a big-endian u16 at `at`.
#[inline]
pub(crate) fn set_u16(b: &mut [u8], at: usize, v: u16) {
    set_bytes(b, at, &v.to_be_bytes());
}

/// Writes the low 24 bits of `v`, big-endian, at `at`.
#[inline]
pub(crate) fn set_u24(b: &mut [u8], at: usize, v: u32) {
    let [_, x, y, z] = v.to_be_bytes();
    set_bytes(b, at, &[x, y, z]);
}

/// Writes a big-endian u32 at `at`.
#[inline]
pub(crate) fn set_u32(b: &mut [u8], at: usize, v: u32) {
    set_bytes(b, at, &v.to_be_bytes());
}

/// Fills `r` with `v`.
#[inline]
pub(crate) fn fill(b: &mut [u8], r: Range<usize>, v: u8) {
    if let Some(dst) = b.get_mut(r) {
        dst.fill(v);
    }
}

/// Read-modify-write of the bits of `mask` in the byte at `at`.
#[inline]
pub(crate) fn set_bits(b: &mut [u8], at: usize, mask: u8, value: u8) {
    if let Some(x) = b.get_mut(at) {
        *x = (*x & !mask) | (value & mask);
    }
}

/// The Internet checksum (RFC 1071) of `data`: one's-complement of the one's-complement sum.
pub(crate) fn internet_checksum(data: &[u8]) -> u16 {
    let mut sum: u32 = 0;
    let mut chunks = data.chunks_exact(2);
    for c in &mut chunks {
        if let Some(a) = c.first_chunk::<2>() {
            sum += u32::from(u16::from_be_bytes(*a));
        }
    }
    if let Some(&last) = chunks.remainder().first() {
        sum += u32::from(last) << 8;
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    // The loop leaves `sum` <= 0xffff.
    !(u16::try_from(sum).unwrap_or(0xffff))
}

/// Checks that `have` bytes are at least `need`; the error names `layer`, offset 0.
#[inline]
pub(crate) fn need(layer: &'static str, need: usize, have: usize) -> Result<(), super::FrameError> {
    if have < need {
        Err(super::FrameError::Truncated {
            layer,
            offset: 0,
            need,
            have,
        })
    } else {
        Ok(())
    }
}
