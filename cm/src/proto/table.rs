//! The connection table: every connection's record ([`Conn`]) in one dense vector (a slab: a
//! freed slot is reused by the next connection), found by local comm ID, by (remote comm ID,
//! remote CA GUID) and by (remote QPN, remote CA GUID) through three hash indexes that hold
//! nothing but a 4-byte slot number per entry. A lookup hashes the key and compares it with
//! the record the candidate slots point to, so no key is stored twice. Per connection this
//! costs the record plus 5 bytes per index bucket (the slot number and hashbrown's control
//! byte), at a load between 7/16 and 7/8.
//!
//! The hashes keep neighbours together where the keys allow it, so that a table of a million
//! connections is not one cache and TLB miss per lookup ([`blocked`]): keys that differ only
//! in their low 6 bits take neighbouring buckets of one 64-bucket block, and each block is
//! placed by a seeded hash of the rest of the key. Blocks, not whole runs: a table filled by
//! one long sequence of keys would otherwise be one dense run, through which a lookup that
//! misses (an ID a peer made up) probes to the run's end.
//! * local comm IDs by the allocator counter they were made from (`IdAllocator::counter_of`):
//!   IDs allocated one after the other share blocks. Only our own IDs are inserted; an ID a
//!   peer makes up maps to an unpredictable counter value.
//! * (remote QPN, CA GUID) by the QPN, the block from the GUID and the QPN's high bits: the
//!   (near-)sequential QPNs of one node's HCA share blocks, placed where a peer cannot
//!   predict.
//! * (remote comm ID, CA GUID) by a seeded hash alone: remote IDs have no order to keep.
//!
//! Each hash's top 7 bits (hashbrown's tag, compared before any record is read) are mixed.
//!
//! Invariant: every index entry points to an occupied slot whose record has the entry's key
//! (checked by the lookups, kept by [`ConnTable::remove`], which unindexes the record it
//! takes out).

use std::hash::BuildHasher;

use allocator_api2::vec::Vec;
use foldhash::fast::SeedableRandomState;
use hashbrown::HashTable;
use ibcm_mad::{CommId, Guid, Qpn};

use super::conn::Conn;
use super::ids::IdAllocator;
use super::index::LineIndex;
use super::memory::table_bytes;
use super::sys::TableAlloc;
use super::util::{blocked, BLOCK_BITS};

/// The records and their indexes.
#[derive(Debug)]
pub(super) struct ConnTable {
    slots: Vec<Option<Conn>, TableAlloc>,
    /// Free slots, the most recently freed last (reused first: its memory is warm).
    free: Vec<u32>,
    len: usize,
    /// Local comm ID → slot.
    by_id: HashTable<u32, TableAlloc>,
    /// (remote comm ID, remote CA GUID) → slot: duplicate detection. Its keys have no order,
    /// so each of its probes goes to a random place: one cache line each ([`LineIndex`]).
    by_remote: LineIndex,
    /// (remote QPN, remote CA GUID) → slot: stale-connection detection.
    by_qpn: HashTable<u32, TableAlloc>,
    hasher: Hasher,
    /// The last (local comm ID, slot) found or inserted through `&mut self`: a handler looks
    /// its connection up several times, and the comm ID's hash runs the ID permutation
    /// backwards. Checked against the slot's record before use.
    last: Option<(CommId, u32)>,
}

/// The hash functions of the indexes.
#[derive(Debug)]
struct Hasher {
    seeded: SeedableRandomState,
    /// The endpoint's comm ID allocator (for its permutation's inverse only).
    ids: IdAllocator,
}

/// Which key of a record an index hashes.
#[derive(Clone, Copy)]
enum Key {
    Id,
    Remote,
    Qpn,
}

impl Key {
    fn hash(self, h: &Hasher, c: &Conn) -> u64 {
        match self {
            Key::Id => hash_id(h, c.id),
            Key::Remote => hash_remote(h, c.remote_id, c.remote_ca_guid),
            Key::Qpn => hash_qpn(h, c.remote_qpn, c.remote_ca_guid),
        }
    }
}

fn hash_id(h: &Hasher, id: CommId) -> u64 {
    let n = u64::from(h.ids.counter_of(id));
    blocked(h.seeded.hash_one(n >> BLOCK_BITS), n)
}

fn hash_remote(h: &Hasher, id: CommId, guid: Guid) -> u64 {
    h.seeded.hash_one((id.0, guid.0))
}

fn hash_qpn(h: &Hasher, qpn: Qpn, guid: Guid) -> u64 {
    let q = u64::from(qpn.get());
    blocked(h.seeded.hash_one((guid.0, q >> BLOCK_BITS)), q)
}

/// The record in slot `s`.
fn at(slots: &[Option<Conn>], s: u32) -> Option<&Conn> {
    slots.get(s as usize).and_then(Option::as_ref)
}

/// Rehashes an entry of the index over `key` (hashbrown calls it when the index grows). Every
/// entry points to a record (the invariant above); 0 would do no harm otherwise.
fn rehash<'a>(slots: &'a [Option<Conn>], h: &'a Hasher, key: Key) -> impl Fn(&u32) -> u64 + 'a {
    move |&s| at(slots, s).map_or(0, |c| key.hash(h, c))
}

impl ConnTable {
    /// An empty table; `ids` is the endpoint's comm ID allocator, `alloc` the allocator of
    /// the records and indexes.
    pub(super) fn new(seed: u64, ids: IdAllocator, alloc: TableAlloc) -> Self {
        ConnTable {
            slots: Vec::new_in(alloc),
            free: Vec::new(),
            len: 0,
            by_id: HashTable::new_in(alloc),
            by_remote: LineIndex::new(alloc),
            by_qpn: HashTable::new_in(alloc),
            hasher: Hasher {
                seeded: SeedableRandomState::with_seed(seed, foldhash::SharedSeed::global_fixed()),
                ids,
            },
            last: None,
        }
    }

    /// Connections in the table.
    pub(super) fn len(&self) -> usize {
        self.len
    }

    pub(super) fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn slot_of(&self, id: CommId) -> Option<u32> {
        let slots = &self.slots;
        if let Some((last, s)) = self.last {
            if last == id && at(slots, s).is_some_and(|c| c.id == id) {
                return Some(s);
            }
        }
        self.by_id
            .find(hash_id(&self.hasher, id), |&s| {
                at(slots, s).is_some_and(|c| c.id == id)
            })
            .copied()
    }

    pub(super) fn contains_key(&self, id: &CommId) -> bool {
        self.slot_of(*id).is_some()
    }

    pub(super) fn get(&self, id: &CommId) -> Option<&Conn> {
        let s = self.slot_of(*id)?;
        at(&self.slots, s)
    }

    pub(super) fn get_mut(&mut self, id: &CommId) -> Option<&mut Conn> {
        let s = self.slot_of(*id)?;
        self.last = Some((*id, s));
        self.slots.get_mut(s as usize).and_then(Option::as_mut)
    }

    /// Adds a connection under `id` (its `id` field is set to it), replacing one already
    /// there.
    pub(super) fn insert(&mut self, id: CommId, mut conn: Conn) {
        conn.id = id;
        let hash = hash_id(&self.hasher, id);
        let slots = &self.slots;
        let old = self
            .by_id
            .find(hash, |&s| at(slots, s).is_some_and(|c| c.id == id))
            .copied();
        if let Some(s) = old {
            self.unindex(Key::Remote, s);
            self.unindex(Key::Qpn, s);
            if let Some(slot) = self.slots.get_mut(s as usize) {
                *slot = Some(conn);
            }
            self.last = Some((id, s));
            return;
        }
        let s = match self.free.pop() {
            Some(s) => {
                if let Some(slot) = self.slots.get_mut(s as usize) {
                    *slot = Some(conn);
                }
                s
            }
            None => {
                self.slots.push(Some(conn));
                // A slot number is 32 bits: 2³² connections is no limit an endpoint meets
                // (comm IDs are 32 bits too).
                (self.slots.len() - 1) as u32
            }
        };
        self.len += 1;
        let h = &self.hasher;
        self.by_id
            .insert_unique(hash, s, rehash(&self.slots, h, Key::Id));
        self.last = Some((id, s));
    }

    /// Takes a connection out of the table and out of every index.
    pub(super) fn remove(&mut self, id: &CommId) -> Option<Conn> {
        let slots = &self.slots;
        let entry = self
            .by_id
            .find_entry(hash_id(&self.hasher, *id), |&s| {
                at(slots, s).is_some_and(|c| c.id == *id)
            })
            .ok()?;
        let (s, _) = entry.remove();
        self.last = None;
        self.unindex(Key::Remote, s);
        self.unindex(Key::Qpn, s);
        let conn = self.slots.get_mut(s as usize).and_then(Option::take)?;
        self.free.push(s);
        self.len -= 1;
        Some(conn)
    }

    /// The local IDs of all connections (in no particular order).
    pub(super) fn keys(&self) -> impl Iterator<Item = CommId> + '_ {
        self.slots.iter().flatten().map(|c| c.id)
    }

    /// The hashbrown index of `key` (`by_remote` is a [`LineIndex`]).
    fn index(&self, key: Key) -> Option<&HashTable<u32, TableAlloc>> {
        match key {
            Key::Id => Some(&self.by_id),
            Key::Remote => None,
            Key::Qpn => Some(&self.by_qpn),
        }
    }

    /// Indexes connection `id` under its current (remote ID or QPN, CA GUID), replacing the
    /// connection indexed under that key before, if any.
    fn index_by(&mut self, key: Key, id: CommId) {
        let Some(s) = self.slot_of(id) else {
            return;
        };
        self.last = Some((id, s));
        let Some(c) = at(&self.slots, s) else {
            return;
        };
        let h = &self.hasher;
        let hash = key.hash(h, c);
        let slots = &self.slots;
        let same = |&e: &u32| at(slots, e).is_some_and(|o| same_key(key, o, c));
        let index = match key {
            Key::Id => &mut self.by_id,
            Key::Remote => {
                let by_remote = &mut self.by_remote;
                match by_remote.find_mut(hash, |e| same(&e)) {
                    Some(e) => *e = s,
                    None => {
                        let re = rehash(slots, h, key);
                        by_remote.insert_unique(hash, s, |e| re(&e));
                    }
                }
                return;
            }
            Key::Qpn => &mut self.by_qpn,
        };
        match index.find_mut(hash, same) {
            Some(e) => *e = s,
            None => {
                index.insert_unique(hash, s, rehash(slots, h, key));
            }
        }
    }

    /// Removes the entry of slot `s` from an index, if it has one.
    fn unindex(&mut self, key: Key, s: u32) {
        let Some(c) = at(&self.slots, s) else {
            return;
        };
        let hash = key.hash(&self.hasher, c);
        let index = match key {
            Key::Id => &mut self.by_id,
            Key::Remote => {
                self.by_remote.remove(hash, |e| e == s);
                return;
            }
            Key::Qpn => &mut self.by_qpn,
        };
        if let Ok(e) = index.find_entry(hash, |&e| e == s) {
            e.remove();
        }
    }

    fn find_by(&self, key: Key, hash: u64, eq: impl Fn(&Conn) -> bool) -> Option<CommId> {
        let slots = &self.slots;
        let s = match self.index(key) {
            Some(index) => *index.find(hash, |&s| at(slots, s).is_some_and(&eq))?,
            None => self
                .by_remote
                .find(hash, |s| at(slots, s).is_some_and(&eq))?,
        };
        at(slots, s).map(|c| c.id)
    }

    /// The connection indexed under (remote comm ID, remote CA GUID).
    pub(super) fn by_remote(&self, remote: CommId, guid: Guid) -> Option<CommId> {
        let hash = hash_remote(&self.hasher, remote, guid);
        self.find_by(Key::Remote, hash, |c| {
            c.remote_id == remote && c.remote_ca_guid == guid
        })
    }

    /// Starts loading the place of (remote comm ID, remote CA GUID) in its index into the
    /// cache (a hint: [`LineIndex::prefetch`]).
    pub(super) fn prefetch_remote(&self, remote: CommId, guid: Guid) {
        self.by_remote
            .prefetch(hash_remote(&self.hasher, remote, guid));
    }

    /// Indexes connection `id` under its (remote comm ID, remote CA GUID).
    pub(super) fn index_remote(&mut self, id: CommId) {
        self.index_by(Key::Remote, id);
    }

    /// The connection indexed under (remote QPN, remote CA GUID).
    pub(super) fn by_qpn(&self, qpn: Qpn, guid: Guid) -> Option<CommId> {
        let hash = hash_qpn(&self.hasher, qpn, guid);
        self.find_by(Key::Qpn, hash, |c| {
            c.remote_qpn == qpn && c.remote_ca_guid == guid
        })
    }

    /// Indexes connection `id` under its (remote QPN, remote CA GUID).
    pub(super) fn index_qpn(&mut self, id: CommId) {
        self.index_by(Key::Qpn, id);
    }

    /// Removes connection `id` from the stale-connection index (if it is the one indexed
    /// there).
    pub(super) fn unindex_qpn(&mut self, id: CommId) {
        if let Some(s) = self.slot_of(id) {
            self.unindex(Key::Qpn, s);
        }
    }
}

impl ConnTable {
    /// Heap bytes of the records (free slots included) and of the three indexes, from their
    /// capacities.
    pub(super) fn heap_bytes(&self) -> (usize, usize) {
        let records = self.slots.capacity() * core::mem::size_of::<Option<Conn>>()
            + self.free.capacity() * core::mem::size_of::<u32>();
        let indexes = [&self.by_id, &self.by_qpn]
            .iter()
            .map(|t| table_bytes(t.capacity(), core::mem::size_of::<u32>()))
            .sum::<usize>()
            + self.by_remote.heap_bytes();
        (records, indexes)
    }
}

/// Whether two records have the same key for an index.
fn same_key(key: Key, a: &Conn, b: &Conn) -> bool {
    match key {
        Key::Id => a.id == b.id,
        Key::Remote => a.remote_id == b.remote_id && a.remote_ca_guid == b.remote_ca_guid,
        Key::Qpn => a.remote_qpn == b.remote_qpn && a.remote_ca_guid == b.remote_ca_guid,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::conn::Micros;
    use crate::proto::peers::Peers;
    use crate::proto::{LapState, PeerAddr, Side, State};
    use ibcm_mad::{ReqTransport, Tid, TimeoutExp};
    use std::time::Duration;

    fn conn(peers: &mut Peers, remote: u32, qpn: u32, guid: u64) -> Conn {
        Conn {
            id: CommId(0),
            state: State::Established,
            lap: LapState::Uninit,
            side: Side::Passive,
            transport: ReqTransport::Rc,
            closed: false,
            auto_rtu: false,
            holds_qpn: false,
            remote_id: CommId(remote),
            local_qpn: Qpn::masked(1),
            remote_qpn: Qpn::masked(qpn),
            remote_ca_guid: Guid(guid),
            peer: peers.intern(PeerAddr::Udp("127.0.0.1:4791".parse().unwrap())),
            tid: Tid(0),
            request_timeout: Micros::from_duration(Duration::from_millis(1)),
            max_retries: 0,
            packet_life_time: TimeoutExp::masked(0),
            timewait: Micros::from_duration(Duration::from_millis(1)),
        }
    }

    #[test]
    fn neighbours_share_a_block_and_blocks_scatter() {
        let mask = (1u64 << 20) - 1;
        let bucket = |h: u64| h & mask;
        // 64 neighbours: consecutive buckets of one block.
        let first = bucket(blocked(0xdead_beef_0000, 0x1000));
        for i in 0..64 {
            assert_eq!(bucket(blocked(0xdead_beef_0000, 0x1000 + i)), first + i);
        }
        // Every tag of a block's entries is not the same one (hashbrown filters by them).
        let tags: std::collections::HashSet<u64> = (0..64)
            .map(|i| blocked(0xdead_beef_0000, i) >> 57)
            .collect();
        assert!(tags.len() > 8);
        // The next block goes elsewhere: where its own hash says.
        let h = Hasher {
            seeded: SeedableRandomState::with_seed(3, foldhash::SharedSeed::global_fixed()),
            ids: IdAllocator::new(0, [1; 8]),
        };
        let a = bucket(hash_qpn(&h, Qpn::masked(0x40), Guid(1)));
        let b = bucket(hash_qpn(&h, Qpn::masked(0x41), Guid(1)));
        let c = bucket(hash_qpn(&h, Qpn::masked(0x80), Guid(1)));
        assert_eq!(b, a + 1);
        assert_ne!(c & !63, a & !63);
    }

    #[test]
    fn indexes_follow_the_records() {
        let mut peers = Peers::new(1);
        let mut t = ConnTable::new(
            7,
            IdAllocator::new(0, [1, 2, 3, 4, 5, 6, 7, 8]),
            TableAlloc::default(),
        );
        for i in 1..=1000u32 {
            t.insert(CommId(i * 7), conn(&mut peers, i, i, 9));
            t.index_remote(CommId(i * 7));
            t.index_qpn(CommId(i * 7));
        }
        assert_eq!(t.len(), 1000);
        assert_eq!(t.by_remote(CommId(5), Guid(9)), Some(CommId(35)));
        assert_eq!(t.by_remote(CommId(5), Guid(8)), None);
        assert_eq!(t.by_qpn(Qpn::masked(6), Guid(9)), Some(CommId(42)));
        // Leaving the table leaves every index; the slot is reused.
        let gone = t.remove(&CommId(35)).map(|c| c.remote_id);
        assert_eq!(gone, Some(CommId(5)));
        assert_eq!(t.by_remote(CommId(5), Guid(9)), None);
        assert_eq!(t.by_qpn(Qpn::masked(5), Guid(9)), None);
        assert!(!t.contains_key(&CommId(35)));
        t.insert(CommId(3), conn(&mut peers, 5, 5, 9));
        assert_eq!(t.slots.len(), 1000);
        assert_eq!(t.by_remote(CommId(5), Guid(9)), None, "not indexed yet");
        // A newer connection under the same key takes the index entry over; the older one
        // leaving does not remove it.
        t.index_qpn(CommId(3));
        t.insert(CommId(4), conn(&mut peers, 77, 5, 9));
        t.index_qpn(CommId(4));
        assert_eq!(t.by_qpn(Qpn::masked(5), Guid(9)), Some(CommId(4)));
        t.remove(&CommId(3));
        assert_eq!(t.by_qpn(Qpn::masked(5), Guid(9)), Some(CommId(4)));
        t.unindex_qpn(CommId(4));
        assert_eq!(t.by_qpn(Qpn::masked(5), Guid(9)), None);
        assert_eq!(t.get(&CommId(4)).map(|c| c.remote_id), Some(CommId(77)));
        let mut ids: Vec<u32> = t.keys().map(|c| c.0).collect();
        ids.sort_unstable();
        assert_eq!(ids.len(), t.len());
        assert_eq!(ids.first(), Some(&4));
    }

    /// With huge pages on, the slab grows from the global allocator's block into mappings of
    /// its own (at 65 537 records, 4 MiB and more), moving every record; the indexes follow.
    #[test]
    fn records_moved_into_huge_page_mappings_stay_found() {
        let mut peers = Peers::new(1);
        let mut t = ConnTable::new(
            7,
            IdAllocator::new(0, [1, 2, 3, 4, 5, 6, 7, 8]),
            TableAlloc { huge: true },
        );
        let n = 80_000u32;
        for i in 1..=n {
            t.insert(CommId(i), conn(&mut peers, i + 1_000_000, i, 9));
            t.index_remote(CommId(i));
            t.index_qpn(CommId(i));
        }
        let slab = t.slots.capacity() * core::mem::size_of::<Option<Conn>>();
        assert!(slab >= super::super::sys::HUGE_FROM, "{slab}");
        if cfg!(target_os = "linux") {
            assert_eq!(t.slots.as_ptr() as usize % (2 << 20), 0);
        }
        for i in (1..=n).step_by(7) {
            assert_eq!(
                t.get(&CommId(i)).map(|c| c.remote_id),
                Some(CommId(i + 1_000_000))
            );
            assert_eq!(t.by_remote(CommId(i + 1_000_000), Guid(9)), Some(CommId(i)));
            assert_eq!(t.by_qpn(Qpn::masked(i), Guid(9)), Some(CommId(i)));
        }
        for i in (1..=n).step_by(2) {
            assert!(t.remove(&CommId(i)).is_some());
        }
        assert_eq!(t.len(), n as usize / 2);
        assert_eq!(t.by_remote(CommId(1_000_001), Guid(9)), None);
        assert_eq!(t.by_remote(CommId(1_000_002), Guid(9)), Some(CommId(2)));
    }
}
