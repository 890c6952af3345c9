//! The lifetime of a connection in the table: a slot is allocated for it, and it is finished
//! (its outcome settled, then handed over by [`Tracker::drain_finished`]) after its grace
//! period, when idle, when the table is full (eviction), or at the end of the file.

use std::time::Duration;

use super::record::{Conn, ConnKind};
use super::Tracker;
use crate::trace::CmEvent;

impl Tracker {
    pub(super) fn alloc(&mut self, ev: &CmEvent, kind: ConnKind) -> usize {
        if self.live >= self.cfg.max_live {
            self.evict();
        }
        let id = self.next_id;
        self.next_id += 1;
        self.live += 1;
        self.stats.peak_live = self.stats.peak_live.max(self.live as u64);
        let gen = self.next_gen;
        self.next_gen = self.next_gen.checked_add(1).unwrap_or(1);
        match self.free.pop() {
            Some(slot) => {
                if let Some(s) = self.slots.get_mut(slot) {
                    // Reuse the slot (and its ladder's allocation) in place.
                    let mut events = std::mem::take(&mut s.events);
                    events.clear();
                    *s = Conn::new(id, ev, kind);
                    s.events = events;
                }
                if let Some(g) = self.gens.get_mut(slot) {
                    *g = gen;
                }
                slot
            }
            None => {
                crate::sys::reserve_huge(&mut self.slots);
                self.slots.push(Conn::new(id, ev, kind));
                self.gens.push(gen);
                self.slots.len() - 1
            }
        }
    }

    /// Stops tracking a connection (its index entries die with its generation), settles its
    /// outcome and queues it for [`Tracker::drain_finished`].
    pub(super) fn finish(&mut self, slot: usize) {
        let now = self.now;
        self.unkey_data(slot);
        let Some(g) = self.gens.get_mut(slot).filter(|g| **g != 0) else {
            return;
        };
        *g = 0;
        self.live -= 1;
        if let Some(c) = self.slots.get_mut(slot) {
            c.settle(now);
        }
        self.finished.push(slot);
    }

    /// Whether connections finished since the last [`Tracker::drain_finished`].
    #[inline]
    pub(crate) fn has_finished(&self) -> bool {
        !self.finished.is_empty()
    }

    /// Hands every connection finished so far to `f`, in order of finishing, and frees their
    /// places. Stops at the first error (the connections not handed over are dropped).
    ///
    /// # Errors
    /// The first error of `f`.
    pub(crate) fn drain_finished<E>(
        &mut self,
        mut f: impl FnMut(&Conn) -> Result<(), E>,
    ) -> Result<(), E> {
        let mut result = Ok(());
        for &slot in &self.finished {
            if result.is_ok() {
                if let Some(c) = self.slots.get(slot) {
                    result = f(c);
                }
            }
            self.free.push(slot);
        }
        self.finished.clear();
        result
    }

    /// Finishes the least recently active eighth of the table.
    fn evict(&mut self) {
        let mut order: Vec<(Duration, u64, usize)> = self
            .slots
            .iter()
            .enumerate()
            .filter(|(i, _)| self.is_live(*i))
            .map(|(i, c)| (c.last, c.id, i))
            .collect();
        order.sort_unstable();
        let n = (self.cfg.max_live / 8).max(1);
        for &(_, _, slot) in order.iter().take(n) {
            if let Some(c) = self.conn_mut(slot) {
                c.evicted = true;
            }
            if let Some(c) = self.slots.get(slot) {
                if let (Some(a), Some(b)) = (c.active.addr, c.passive.addr) {
                    for id in [c.active.comm_id, c.passive.comm_id].into_iter().flatten() {
                        self.evicted.insert(id.0, &a, &b, c.id);
                    }
                }
            }
            self.finish(slot);
            self.stats.evicted += 1;
        }
    }

    /// Finishes connections whose grace period or idle time has passed.
    pub(super) fn expire(&mut self) {
        while let Some(&(t, slot, id)) = self.ended.front() {
            if self.now < t + self.cfg.grace {
                break;
            }
            self.ended.pop_front();
            let finish = self.conn(slot).is_some_and(|c| {
                // Still the same connection, and no message since it ended.
                c.id == id && c.ended.is_some_and(|e| c.activity() <= e)
            });
            if finish {
                self.finish(slot);
            } else if let Some(c) = self.conn(slot).filter(|c| c.id == id) {
                // A message arrived after the end: wait again from that message.
                let again = c.activity();
                self.ended.push_back((again, slot, id));
                if let Some(c) = self.conn_mut(slot) {
                    c.ended = Some(again);
                }
            }
        }
        if self.now >= self.next_sweep {
            self.next_sweep = self.now + self.cfg.idle / 4;
            let idle: Vec<usize> = self
                .slots
                .iter()
                .enumerate()
                // An established connection (not closing) is quiet by nature: it waits for its
                // DREQ however long it takes, so it is never finished for idleness (only by
                // eviction when the table is full, or at the end of the file).
                .filter(|(i, c)| {
                    self.is_live(*i)
                        && c.activity() + self.cfg.idle < self.now
                        && !(c.established() && c.dreq.is_none() && c.ended.is_none())
                })
                .map(|(i, _)| i)
                .collect();
            for slot in idle {
                self.finish(slot);
            }
        }
    }

    /// Calls `f` with a copy of every live connection, in order of first appearance, its
    /// outcome settled as if the capture ended now (the live `--stats` refresh).
    pub(crate) fn each_live_settled(&self, mut f: impl FnMut(&Conn)) {
        let mut slots: Vec<(u64, usize)> = self
            .slots
            .iter()
            .enumerate()
            .filter(|(i, _)| self.is_live(*i))
            .map(|(i, c)| (c.id, i))
            .collect();
        slots.sort_unstable();
        for (_, slot) in slots {
            if let Some(c) = self.slots.get(slot) {
                let mut c = c.clone();
                c.settle(self.now);
                f(&c);
            }
        }
    }

    /// Finishes every connection (end of file), in order of first appearance, and every
    /// PathRecord exchange; then [`Tracker::drain_finished`] and [`Tracker::drain_sa`] hand
    /// them over.
    pub(crate) fn finish_all(&mut self) {
        let mut slots: Vec<(u64, usize)> = self
            .slots
            .iter()
            .enumerate()
            .filter(|(i, _)| self.is_live(*i))
            .map(|(i, c)| (c.id, i))
            .collect();
        slots.sort_unstable();
        for (_, slot) in slots {
            self.finish(slot);
        }
        self.ended.clear();
        self.sa.finish_all();
    }
}
