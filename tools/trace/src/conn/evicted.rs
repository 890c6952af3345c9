//! Connections finished early because the table was full (eviction): their comm IDs, so that
//! their later messages (a REQ retransmission, the REP, RTU, DREQ, DREP) are attributed to
//! them instead of starting new, partial connections that would be counted twice.
//!
//! Bounded: the oldest entries are forgotten first.

use std::collections::hash_map::DefaultHasher;
use std::collections::{HashMap, VecDeque};
use std::hash::{Hash, Hasher};

use crate::trace::WireAddr;

/// Comm ID (with the two addresses, in either order) → number of the evicted connection.
#[derive(Debug, Default)]
pub(super) struct Evicted {
    ids: HashMap<u64, u64>,
    order: VecDeque<u64>,
    cap: usize,
}

fn addr_hash(a: &WireAddr) -> u64 {
    let mut h = DefaultHasher::new();
    a.hash(&mut h);
    h.finish()
}

/// The key of a comm ID between two addresses (the same in both directions).
fn key(comm_id: u32, a: &WireAddr, b: &WireAddr) -> u64 {
    let (x, y) = (addr_hash(a), addr_hash(b));
    let mut h = DefaultHasher::new();
    (comm_id, x.min(y), x.max(y)).hash(&mut h);
    h.finish()
}

impl Evicted {
    /// Remembers at most `cap` comm IDs.
    pub(super) fn new(cap: usize) -> Self {
        Evicted {
            ids: HashMap::new(),
            order: VecDeque::new(),
            cap: cap.max(1),
        }
    }

    /// Remembers that `comm_id`, between `a` and `b`, belonged to connection `conn`.
    pub(super) fn insert(&mut self, comm_id: u32, a: &WireAddr, b: &WireAddr, conn: u64) {
        if comm_id == 0 {
            return;
        }
        let k = key(comm_id, a, b);
        if self.ids.insert(k, conn).is_none() {
            self.order.push_back(k);
        }
        while self.order.len() > self.cap {
            if let Some(old) = self.order.pop_front() {
                self.ids.remove(&old);
            }
        }
    }

    /// The evicted connection that had one of `comm_ids` between `a` and `b`.
    pub(super) fn find(&self, comm_ids: &[u32], a: &WireAddr, b: &WireAddr) -> Option<u64> {
        if self.ids.is_empty() {
            return None;
        }
        comm_ids
            .iter()
            .filter(|c| **c != 0)
            .find_map(|c| self.ids.get(&key(*c, a, b)).copied())
    }
}
