//! Small helpers of the endpoint that know nothing of it: the seeded hash maps, the blocked
//! hash that keeps neighbouring keys in neighbouring buckets ([`blocked`]), private data for
//! events, the length check of command fields.

use super::CallError;

/// The hash maps of the endpoint: foldhash (several times faster than SipHash on these small
/// keys), seeded from the endpoint's RNG, so that lookups are fast, runs are reproducible under
/// a fixed `rng_seed`, and a peer cannot predict the hash of the comm IDs and QPNs it sends.
pub(super) type HashMap<K, V> =
    std::collections::HashMap<K, V, foldhash::fast::SeedableRandomState>;
pub(super) type HashSet<K> = std::collections::HashSet<K, foldhash::fast::SeedableRandomState>;

/// A map keyed by local QPNs. The application chooses them (they never come from the wire), so
/// their hash needs no seed ([`QpnHasher`]); it keeps the (near-)sequential QPNs of an HCA in
/// neighbouring buckets of a large table, 64 to a block (as the connection table's indexes do,
/// `proto/table.rs`).
pub(super) type LocalQpnMap<V> = hashbrown::HashMap<
    ibcm_mad::Qpn,
    V,
    std::hash::BuildHasherDefault<QpnHasher>,
    super::sys::TableAlloc,
>;

/// The hash of [`LocalQpnMap`]: the value written (a QPN's `u32`) in 64-bucket blocks placed
/// by a mix of its high bits, with a mixed tag in its top 7 bits (what hashbrown compares
/// before the key).
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct QpnHasher(u64);

impl std::hash::Hasher for QpnHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }

    fn write_u32(&mut self, n: u32) {
        self.0 = self.0.rotate_left(32) ^ u64::from(n);
    }

    fn finish(&self) -> u64 {
        let mut block = (self.0 >> 6).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        block ^= block >> 31;
        blocked(block, self.0)
    }
}

/// hashbrown's tag: the top 7 bits.
const TAG: u64 = 0x7f << 57;

/// Keys per block of neighbouring buckets (log2).
pub(super) const BLOCK_BITS: u32 = 6;

/// The hash of a key whose low [`BLOCK_BITS`] are `n`'s and whose block is placed by
/// `block` (a hash of the rest of the key): the bucket is the block's position plus `n`'s low
/// bits; the tag is mixed from both.
pub(super) fn blocked(block: u64, n: u64) -> u64 {
    let low_mask = (1u64 << BLOCK_BITS) - 1;
    let low = n & low_mask;
    let tag = (block ^ low).wrapping_mul(0x9e37_79b9_7f4a_7c15) & TAG;
    (block & !low_mask & !TAG) | low | tag
}

pub(super) fn map<K, V>(seed: u64) -> HashMap<K, V> {
    HashMap::with_hasher(foldhash::fast::SeedableRandomState::with_seed(
        seed,
        foldhash::SharedSeed::global_fixed(),
    ))
}

/// Checks that a command's field fits its wire size.
pub(super) fn check_len(what: &'static str, data: &[u8], max: usize) -> Result<(), CallError> {
    if data.len() > max {
        return Err(CallError::TooLong {
            what,
            len: data.len(),
            max,
        });
    }
    Ok(())
}
