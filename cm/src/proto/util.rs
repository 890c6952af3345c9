//! Small helpers of the endpoint that know nothing of it: the seeded hash maps, private data
//! for events, the length check of command fields.

use super::CallError;

/// The hash maps of the endpoint: foldhash (several times faster than SipHash on these small
/// keys), seeded from the endpoint's RNG, so that lookups are fast, runs are reproducible under
/// a fixed `rng_seed`, and a peer cannot predict the hash of the comm IDs and QPNs it sends.
pub(super) type HashMap<K, V> =
    std::collections::HashMap<K, V, foldhash::fast::SeedableRandomState>;
pub(super) type HashSet<K> = std::collections::HashSet<K, foldhash::fast::SeedableRandomState>;

pub(super) fn map<K, V>(seed: u64) -> HashMap<K, V> {
    HashMap::with_hasher(foldhash::fast::SeedableRandomState::with_seed(
        seed,
        foldhash::SharedSeed::global_fixed(),
    ))
}

/// Private data with its trailing zeros removed (for events).
pub(super) fn trimmed(b: &[u8]) -> Vec<u8> {
    let end = b.iter().rposition(|&x| x != 0).map_or(0, |p| p + 1);
    b.get(..end).unwrap_or(&[]).to_vec()
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
