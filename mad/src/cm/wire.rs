//! The reader the message parsers use, and bit-field packing helpers for the emitters.
//!
//! Message bodies are parsed from a fixed 232-byte array. [`Rd`] walks it field by field with
//! `from_be_bytes` reads; because the array length is known and every message reads at most
//! 232 bytes, the compiler removes the bounds checks and builds the message struct directly in
//! its final place.
//!
//! Why not nom's `number::complete::be_u32` chains here: measured 2–3× slower for this fixed
//! layout (figures and the workspace's rule for where nom is used: docs/framing.md §5.2).

/// A cursor over attribute data that cannot fail: reading past the end yields zeros (which the
/// fixed layouts never do; the length is checked once before parsing starts).
pub(crate) struct Rd<'a>(&'a [u8]);

macro_rules! read_num {
    ($name:ident, $ty:ty) => {
        #[inline(always)]
        pub(crate) fn $name(&mut self) -> $ty {
            const N: usize = core::mem::size_of::<$ty>();
            match self.0.split_first_chunk::<N>() {
                Some((a, rest)) => {
                    self.0 = rest;
                    <$ty>::from_be_bytes(*a)
                }
                None => 0,
            }
        }
    };
}

impl<'a> Rd<'a> {
    #[inline(always)]
    pub(crate) fn new(data: &'a [u8]) -> Self {
        Rd(data)
    }

    read_num!(u8, u8);
    read_num!(u16, u16);
    #[inline(always)]
    pub(crate) fn u24(&mut self) -> u32 {
        match self.0.split_first_chunk::<3>() {
            Some((&[a, b, c], rest)) => {
                self.0 = rest;
                u32::from_be_bytes([0, a, b, c])
            }
            None => 0,
        }
    }
    read_num!(u32, u32);
    read_num!(u64, u64);

    /// `N` bytes as an array.
    #[inline(always)]
    pub(crate) fn array<const N: usize>(&mut self) -> [u8; N] {
        match self.0.split_first_chunk::<N>() {
            Some((a, rest)) => {
                self.0 = rest;
                *a
            }
            None => [0; N],
        }
    }

    /// Skips `n` reserved bytes.
    #[inline(always)]
    pub(crate) fn skip(&mut self, n: usize) {
        self.0 = self.0.get(n..).unwrap_or(&[]);
    }
}

/// Writes a 24-bit value big-endian.
#[inline]
pub(crate) fn put_u24<B: bytes::BufMut>(buf: &mut B, v: u32) {
    let [_, a, b, c] = v.to_be_bytes();
    buf.put_slice(&[a, b, c]);
}
