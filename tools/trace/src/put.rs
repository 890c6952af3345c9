//! The byte writers of the views: integers, floats, IPv4 addresses, JSON strings and
//! durations appended to a caller's reused `Vec<u8>`. Integers and IPv4 addresses are
//! formatted by hand into a register and stored at once (no byte-wise stack buffer, no
//! `memcpy` call for a few bytes); floats go through `ryu`.

use std::io::Write;
use std::net::Ipv4Addr;
use std::time::Duration;

/// The two decimal digits of 0..=99 as a little-endian `u16` (tens digit first in memory).
// Indexing in a const initialiser cannot panic at run time (an error would fail the build).
#[allow(clippy::indexing_slicing)]
const PAIRS: [u16; 100] = {
    let mut t = [0u16; 100];
    let mut i = 0;
    while i < 100 {
        t[i] = (b'0' + (i / 10) as u8) as u16 | (((b'0' + (i % 10) as u8) as u16) << 8);
        i += 1;
    }
    t
};

/// Exactly 8 digits of `v` (< 10^8, zero-padded) in a register, first digit in the lowest
/// byte. The four pairs are computed independently (short dependency chains).
#[inline(always)]
fn digits8(v: u64) -> u64 {
    let hi = v / 10_000;
    let lo = v % 10_000;
    let p = |x: u64| u64::from(PAIRS.get(x as usize).copied().unwrap_or(0x3030));
    p(hi / 100) | p(hi % 100) << 16 | p(lo / 100) << 32 | p(lo % 100) << 48
}

/// Number of decimal digits of `v` (1..=20).
#[inline(always)]
fn dec_len(v: u64) -> usize {
    // Indexing in a const initialiser cannot panic at run time.
    #[allow(clippy::indexing_slicing)]
    const POW10: [u64; 20] = {
        let mut t = [0u64; 20];
        let mut p = 1u64;
        let mut i = 0;
        while i < 20 {
            t[i] = p;
            p = p.wrapping_mul(10);
            i += 1;
        }
        t
    };
    let bits = 64 - (v | 1).leading_zeros();
    // floor(bits · log10 2): the digit count, or one less.
    let guess = (bits * 1233) >> 12;
    let guess = guess as usize;
    guess + usize::from(POW10.get(guess).is_some_and(|&p| v >= p))
}

/// Appends `N` bytes, then keeps only the first `len` of them: a copy of a compile-time size
/// (plain stores) instead of a `memcpy` call for a short run of variable length.
#[inline(always)]
fn put_prefix<const N: usize>(out: &mut Vec<u8>, bytes: &[u8; N], len: usize) {
    let at = out.len();
    out.extend_from_slice(bytes);
    out.truncate(at + len.min(N));
}

/// Appends an unsigned integer.
#[inline]
pub(crate) fn put_u64(out: &mut Vec<u8>, v: u64) {
    const E8: u64 = 100_000_000;
    const E16: u64 = E8 * E8;
    if v < 10 {
        out.push(b'0' + v as u8);
        return;
    }
    let n = dec_len(v);
    if v < E8 {
        let d = digits8(v).wrapping_shr(((8 - n) * 8) as u32);
        put_prefix(out, &d.to_le_bytes(), n);
    } else if v < E16 {
        let d = u128::from(digits8(v / E8)) | u128::from(digits8(v % E8)) << 64;
        let d = d.wrapping_shr(((16 - n) * 8) as u32);
        put_prefix(out, &d.to_le_bytes(), n);
    } else {
        let top = n - 16;
        let t = digits8(v / E16).wrapping_shr(((8 - top) * 8) as u32);
        put_prefix(out, &t.to_le_bytes(), top);
        let r = v % E16;
        let d = u128::from(digits8(r / E8)) | u128::from(digits8(r % E8)) << 64;
        out.extend_from_slice(&d.to_le_bytes());
    }
}

/// Appends a short string (a name): byte by byte, which beats a `memcpy` call for a few
/// bytes.
#[inline]
pub(crate) fn put_short(out: &mut Vec<u8>, s: &str) {
    if s.len() > 32 {
        out.extend_from_slice(s.as_bytes());
        return;
    }
    out.reserve(32);
    for &b in s.as_bytes() {
        out.push(b);
    }
}

/// Appends a float (shortest round-trip form; non-finite values as 0).
#[inline]
pub(crate) fn put_f64(out: &mut Vec<u8>, v: f64) {
    if v.is_finite() {
        let mut b = ryu::Buffer::new();
        put_short(out, b.format_finite(v));
    } else {
        out.push(b'0');
    }
}

/// Each byte value in decimal (first digit in the lowest byte) and its length.
// Indexing in a const initialiser cannot panic at run time.
#[allow(clippy::indexing_slicing)]
const OCTETS: [(u32, u8); 256] = {
    let mut t = [(0u32, 0u8); 256];
    let mut i = 0;
    while i < 256 {
        let v = i as u32;
        t[i] = if v >= 100 {
            (
                (0x30 + v / 100) | (0x30 + v / 10 % 10) << 8 | (0x30 + v % 10) << 16,
                3,
            )
        } else if v >= 10 {
            ((0x30 + v / 10) | (0x30 + v % 10) << 8, 2)
        } else {
            (0x30 + v, 1)
        };
        i += 1;
    }
    t
};

pub(crate) fn put_ipv4(out: &mut Vec<u8>, a: Ipv4Addr) {
    // At most 15 bytes: built in a register, stored once.
    let mut acc = 0u128;
    let mut pos = 0u32;
    for (i, o) in a.octets().into_iter().enumerate() {
        if i > 0 {
            acc |= u128::from(b'.').wrapping_shl(pos * 8);
            pos += 1;
        }
        let (d, n) = OCTETS.get(usize::from(o)).copied().unwrap_or((0x30, 1));
        acc |= u128::from(d).wrapping_shl(pos * 8);
        pos += u32::from(n);
    }
    put_prefix(out, &acc.to_le_bytes(), pos as usize);
}

/// Appends a JSON string (quoted and escaped).
pub(crate) fn put_json_str(out: &mut Vec<u8>, s: &str) {
    out.push(b'"');
    for c in s.chars() {
        match c {
            '"' => out.extend_from_slice(b"\\\""),
            '\\' => out.extend_from_slice(b"\\\\"),
            '\n' => out.extend_from_slice(b"\\n"),
            '\r' => out.extend_from_slice(b"\\r"),
            '\t' => out.extend_from_slice(b"\\t"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => {
                let mut b = [0u8; 4];
                out.extend_from_slice(c.encode_utf8(&mut b).as_bytes());
            }
        }
    }
    out.push(b'"');
}

/// Appends a duration as seconds with 6 decimals (`12.345678`), right-aligned in `width`.
pub(crate) fn put_secs(out: &mut Vec<u8>, d: Duration, width: usize) {
    let _ = write!(
        out,
        "{:>width$}.{:06}",
        d.as_secs(),
        d.subsec_micros(),
        width = width
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn put_u64_matches_display() {
        let mut vals = vec![0u64, 9, 10, 99, 100, u64::MAX, u64::MAX - 1];
        let mut p = 1u64;
        for _ in 0..20 {
            vals.extend([p.wrapping_sub(1), p, p.wrapping_add(1)]);
            p = p.wrapping_mul(10);
        }
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..100_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            vals.push(x >> (x % 64));
        }
        let mut out = Vec::new();
        for v in vals {
            out.clear();
            put_u64(&mut out, v);
            assert_eq!(String::from_utf8(out.clone()).unwrap(), v.to_string());
        }
    }

    #[test]
    fn put_ipv4_matches_display() {
        let mut out = Vec::new();
        for a in [
            [0, 0, 0, 0],
            [255, 255, 255, 255],
            [1, 22, 133, 4],
            [10, 0, 100, 9],
        ] {
            out.clear();
            put_ipv4(&mut out, Ipv4Addr::from(a));
            assert_eq!(
                String::from_utf8(out.clone()).unwrap(),
                Ipv4Addr::from(a).to_string()
            );
        }
    }
}
