//! The endpoint's timers: the connections' and the SIDR requests', in one deadline queue.
//!
//! * **Connection timers** ([`ConnTimer`]: `Resend`, `Timewait`, `Lifetime`): a connection
//!   has at most one armed at a time ([`Timers::arm_conn`] replaces the one before); its
//!   deadline and kind are kept here, by comm ID, only while it is armed (an established
//!   connection with nothing outstanding has none and pays nothing for it).
//! * **SIDR timers**, the endpoint's, keyed by their own IDs: an outgoing SIDR_REQ's
//!   retransmission ([`Timers::insert_sidr`], by [`SidrReqId`]; its deadline is kept in
//!   `SidrOut::timer`) and an incoming SIDR_REQ's expiry ([`Timers::insert_sidr_in`], by the
//!   ID the application knows it by; its deadline is `SidrIn::expires`). Their owners keep the
//!   deadline, to remove the entry and to tell a stale one apart.
//!
//! [`Timers`] orders every armed deadline so that its first entry is the next one
//! (`Endpoint::poll_timeout`). Entries are never updated in place: re-arming removes the old
//! entry and inserts a new one, and an entry that fires but no longer matches its owner's
//! deadline is stale and ignored.
//!
//! Not here: the stateless mode's REP retransmissions (`Cookies::resend` in
//! `endpoint/cookie.rs`). They belong to no connection and no ID (a cookie REP creates no
//! state but its slot in the fixed REQ table), so they are a FIFO bounded by that table (all
//! have the same delay, `stateless_resend`, so arrival order is deadline order), and they fire
//! before this queue's entries in `Endpoint::handle_timeout`; `Endpoint::poll_timeout` takes
//! the earlier of the two.

use std::collections::BTreeSet;
use std::time::Instant;

use ibcm_mad::CommId;

use super::ids::SidrReqId;
use super::util::{map, HashMap};

/// What a connection's timer does when it fires.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ConnTimer {
    /// Retransmit the connection's pending request (REQ, REP, DREQ, LAP), or give up.
    Resend,
    /// Leave TimeWait.
    Timewait,
    /// A passive connection waiting for the application (REQ_RCVD / MRA_REQ_SENT) reached the
    /// end of its half-open lifetime.
    Lifetime,
}

/// The kind of a queue entry, which says whose ID its key holds. Its order breaks ties
/// between entries due at the same instant with the same raw ID.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum EntryKind {
    /// [`ConnTimer::Resend`], keyed by comm ID.
    Resend,
    /// [`ConnTimer::Timewait`], keyed by comm ID.
    Timewait,
    /// An outgoing SIDR_REQ's retransmission, keyed by [`SidrReqId`].
    Sidr,
    /// An incoming SIDR_REQ's expiry, keyed by the ID the application knows it by.
    SidrIn,
    /// [`ConnTimer::Lifetime`], keyed by comm ID.
    Lifetime,
}

impl From<ConnTimer> for EntryKind {
    fn from(k: ConnTimer) -> Self {
        match k {
            ConnTimer::Resend => EntryKind::Resend,
            ConnTimer::Timewait => EntryKind::Timewait,
            ConnTimer::Lifetime => EntryKind::Lifetime,
        }
    }
}

/// A timer that fired, with the deadline it was armed for (to tell stale entries apart).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Expired {
    /// A connection's timer.
    Conn {
        id: CommId,
        at: Instant,
        kind: ConnTimer,
    },
    /// An outgoing SIDR_REQ's timer.
    Sidr { id: SidrReqId, at: Instant },
    /// An incoming SIDR_REQ's expiry.
    SidrIn { id: CommId, at: Instant },
}

/// Every armed deadline, ordered by (time, owner ID, kind): owners due at the same instant
/// fire in ID order; and each connection's armed timer.
#[derive(Debug)]
pub(crate) struct Timers {
    queue: BTreeSet<(Instant, u32, EntryKind)>,
    conns: HashMap<CommId, (Instant, ConnTimer)>,
}

impl Timers {
    pub(crate) fn new(seed: u64) -> Self {
        Timers {
            queue: BTreeSet::new(),
            conns: map(seed),
        }
    }

    /// Arms connection `id`'s timer, replacing the one armed before.
    pub(crate) fn arm_conn(&mut self, id: CommId, at: Instant, kind: ConnTimer) {
        if let Some((t, k)) = self.conns.insert(id, (at, kind)) {
            self.queue.remove(&(t, id.0, k.into()));
        }
        self.queue.insert((at, id.0, kind.into()));
    }

    /// Disarms connection `id`'s timer, if one is armed.
    pub(crate) fn disarm_conn(&mut self, id: CommId) {
        if let Some((t, k)) = self.conns.remove(&id) {
            self.queue.remove(&(t, id.0, k.into()));
        }
    }

    /// Connection `id`'s armed timer.
    pub(crate) fn conn(&self, id: CommId) -> Option<(Instant, ConnTimer)> {
        self.conns.get(&id).copied()
    }

    /// Arms an outgoing SIDR_REQ's timer for `at` (its owner keeps `at`: `SidrOut::timer`).
    pub(crate) fn insert_sidr(&mut self, at: Instant, id: SidrReqId) {
        self.queue.insert((at, id.raw(), EntryKind::Sidr));
    }

    /// Removes an outgoing SIDR_REQ's timer armed for `at`.
    pub(crate) fn remove_sidr(&mut self, at: Instant, id: SidrReqId) {
        self.queue.remove(&(at, id.raw(), EntryKind::Sidr));
    }

    /// Arms the expiry of an incoming SIDR_REQ for `at` (its owner keeps `at`:
    /// `SidrIn::expires`).
    pub(crate) fn insert_sidr_in(&mut self, at: Instant, id: CommId) {
        self.queue.insert((at, id.0, EntryKind::SidrIn));
    }

    /// Removes the expiry of an incoming SIDR_REQ armed for `at`.
    pub(crate) fn remove_sidr_in(&mut self, at: Instant, id: CommId) {
        self.queue.remove(&(at, id.0, EntryKind::SidrIn));
    }

    /// Heap bytes: the per-connection map from its capacity, the queue at its entries' size.
    pub(crate) fn heap_bytes(&self) -> usize {
        let conn = core::mem::size_of::<(CommId, (Instant, ConnTimer))>();
        super::memory::table_bytes(self.conns.capacity(), conn)
            + self.queue.len() * core::mem::size_of::<(Instant, u32, EntryKind)>()
    }

    /// The earliest deadline.
    pub(crate) fn next_deadline(&self) -> Option<Instant> {
        self.queue.first().map(|(t, _, _)| *t)
    }

    /// Whether no timer is armed.
    pub(crate) fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// Takes the earliest entry if it is due at `now` (a connection's timer is disarmed by
    /// it).
    pub(crate) fn pop_due(&mut self, now: Instant) -> Option<Expired> {
        loop {
            let &(at, raw, kind) = self.queue.first()?;
            if at > now {
                return None;
            }
            self.queue.remove(&(at, raw, kind));
            let id = CommId(raw);
            match kind {
                EntryKind::Sidr => {
                    let id = SidrReqId::from_raw(raw);
                    return Some(Expired::Sidr { id, at });
                }
                EntryKind::SidrIn => return Some(Expired::SidrIn { id, at }),
                EntryKind::Resend | EntryKind::Timewait | EntryKind::Lifetime => {}
            }
            if let Some(&(t, k)) = self.conns.get(&id) {
                if t == at && EntryKind::from(k) == kind {
                    self.conns.remove(&id);
                    return Some(Expired::Conn { id, at, kind: k });
                }
            }
            // A connection entry that is not its armed timer: stale, skipped.
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn pops_in_deadline_then_id_order() {
        // Any instant will do as the origin; the queue never reads the clock.
        #[allow(clippy::disallowed_methods)]
        let t0 = Instant::now();
        let mut t = Timers::new(1);
        t.arm_conn(CommId(1), t0 + Duration::from_millis(2), ConnTimer::Resend);
        t.insert_sidr(t0 + Duration::from_millis(1), SidrReqId::from_raw(9));
        t.arm_conn(
            CommId(3),
            t0 + Duration::from_millis(1),
            ConnTimer::Timewait,
        );
        assert_eq!(t.next_deadline(), Some(t0 + Duration::from_millis(1)));
        assert_eq!(t.pop_due(t0), None);
        let due = t0 + Duration::from_millis(1);
        assert_eq!(
            t.pop_due(due),
            Some(Expired::Conn {
                id: CommId(3),
                at: due,
                kind: ConnTimer::Timewait
            })
        );
        assert_eq!(
            t.pop_due(due),
            Some(Expired::Sidr {
                id: SidrReqId::from_raw(9),
                at: due
            })
        );
        assert_eq!(t.pop_due(due), None);
        assert_eq!(
            t.conn(CommId(1)),
            Some((t0 + Duration::from_millis(2), ConnTimer::Resend))
        );
        assert_eq!(t.conn(CommId(3)), None);
        t.disarm_conn(CommId(1));
        assert!(t.is_empty());
    }
}
