//! The peer addresses connections share, interned with reference counts (connections to one
//! node share one entry).

use super::util::{map, HashMap};
use super::PeerAddr;

/// Index of an interned peer address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct PeerId(u32);

/// Peer addresses shared by the connections that use them, with reference counts.
#[derive(Debug)]
pub(super) struct Peers {
    addrs: Vec<PeerAddr>,
    refs: Vec<u32>,
    index: HashMap<PeerAddr, u32>,
    free: Vec<u32>,
}

impl Peers {
    pub(super) fn new(seed: u64) -> Self {
        Peers {
            addrs: Vec::new(),
            refs: Vec::new(),
            index: map(seed),
            free: Vec::new(),
        }
    }

    pub(super) fn intern(&mut self, addr: PeerAddr) -> PeerId {
        if let Some(&i) = self.index.get(&addr) {
            if let Some(r) = self.refs.get_mut(i as usize) {
                *r += 1;
            }
            return PeerId(i);
        }
        let i = match self.free.pop() {
            Some(i) => {
                if let (Some(a), Some(r)) = (
                    self.addrs.get_mut(i as usize),
                    self.refs.get_mut(i as usize),
                ) {
                    *a = addr;
                    *r = 1;
                }
                i
            }
            None => {
                self.addrs.push(addr);
                self.refs.push(1);
                (self.addrs.len() - 1) as u32
            }
        };
        self.index.insert(addr, i);
        PeerId(i)
    }

    pub(super) fn release(&mut self, id: PeerId) {
        let Some(r) = self.refs.get_mut(id.0 as usize) else {
            return;
        };
        *r = r.saturating_sub(1);
        if *r == 0 {
            if let Some(a) = self.addrs.get(id.0 as usize) {
                self.index.remove(a);
            }
            self.free.push(id.0);
        }
    }

    /// Heap bytes, from the capacities.
    pub(super) fn heap_bytes(&self) -> usize {
        self.addrs.capacity() * core::mem::size_of::<PeerAddr>()
            + self.refs.capacity() * core::mem::size_of::<u32>()
            + self.free.capacity() * core::mem::size_of::<u32>()
            + super::memory::table_bytes(
                self.index.capacity(),
                core::mem::size_of::<(PeerAddr, u32)>(),
            )
    }

    pub(super) fn addr(&self, id: PeerId) -> PeerAddr {
        self.addrs
            .get(id.0 as usize)
            .copied()
            .unwrap_or(PeerAddr::Udp(std::net::SocketAddr::from(([0, 0, 0, 0], 0))))
    }
}
