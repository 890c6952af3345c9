//! What the endpoint's per-connection structures hold on the heap ([`MemoryUse`]).

/// Heap bytes held by the endpoint's per-connection structures, by structure
/// ([`Endpoint::memory`](super::Endpoint::memory)). Hash tables and vectors are counted from
/// their capacities (allocated, whether or not their pages were touched yet); the timer
/// queue at the size of its entries (a B-tree adds its node overhead to that). Not counted:
/// the allocator's own overhead, the output queues (drained by the application) and the
/// SIDR and admission tables (requests and half-open connections only).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct MemoryUse {
    /// Connection records, free slots included.
    pub records: usize,
    /// The connection table's indexes: by local comm ID, by (remote comm ID, CA GUID), by
    /// (remote QPN, CA GUID).
    pub indexes: usize,
    /// Live connections per local QPN, and the QPN quarantine.
    pub qpns: usize,
    /// State kept apart from the records while a connection has it: pending requests (in
    /// setup, DREQ_SENT, LAP), rarely needed data, armed timers.
    pub side: usize,
    /// Interned peer addresses.
    pub peers: usize,
}

impl MemoryUse {
    /// The sum.
    pub fn total(&self) -> usize {
        self.records + self.indexes + self.qpns + self.side + self.peers
    }
}

/// The heap bytes of a hashbrown table (`std`'s `HashMap` is one) of `capacity` entries of
/// `entry` bytes: its buckets (capacity 7/8 of them, a power of two) with one control byte
/// each, plus one group of control bytes.
pub(super) fn table_bytes(capacity: usize, entry: usize) -> usize {
    let buckets = match capacity {
        0 => return 0,
        c if c < 7 => (c + 1).next_power_of_two(),
        c => (c / 7 * 8).next_power_of_two(),
    };
    buckets * (entry + 1) + 16
}
