//! The endpoint's timers: a closed set of kinds, one deadline per armed timer, one queue.
//!
//! A connection has at most one timer armed at a time; its deadline and kind are kept here, by
//! comm ID, only while it is armed (an established connection with nothing outstanding has
//! none and pays nothing for it). An outgoing SIDR_REQ has its own deadline
//! (`SidrOut::timer`). [`Timers`] orders every armed deadline so that `poll_timeout` is its
//! first entry. Entries are never updated in place: re-arming removes the old entry and
//! inserts a new one, and an entry that fires but no longer matches its owner's deadline is
//! stale and ignored.

use std::collections::BTreeSet;
use std::time::Instant;

use ibcm_mad::CommId;

use super::ids::SidrReqId;
use super::util::{map, HashMap};

/// What a timer does when it fires.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum TimerKind {
    /// Retransmit the connection's pending request (REQ, REP, DREQ, LAP), or give up.
    Resend,
    /// Leave TimeWait.
    Timewait,
    /// Retransmit a SIDR_REQ, or give up (keyed by request ID).
    Sidr,
    /// An incoming SIDR_REQ the application has not answered expires (keyed by the ID the
    /// application knows it by).
    SidrIn,
    /// A passive connection waiting for the application (REQ_RCVD / MRA_REQ_SENT) reached the
    /// end of its half-open lifetime.
    Lifetime,
}

/// A timer that fired, with the deadline it was armed for (to tell stale entries apart).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Expired {
    /// A connection's timer ([`TimerKind::Resend`] or [`TimerKind::Timewait`]).
    Conn {
        id: CommId,
        at: Instant,
        kind: TimerKind,
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
    queue: BTreeSet<(Instant, u32, TimerKind)>,
    conns: HashMap<CommId, (Instant, TimerKind)>,
}

impl Timers {
    pub(crate) fn new(seed: u64) -> Self {
        Timers {
            queue: BTreeSet::new(),
            conns: map(seed),
        }
    }

    /// Arms connection `id`'s timer (`kind` is `Resend`, `Timewait` or `Lifetime`), replacing
    /// the one armed before.
    pub(crate) fn arm_conn(&mut self, id: CommId, at: Instant, kind: TimerKind) {
        if let Some((t, k)) = self.conns.insert(id, (at, kind)) {
            self.queue.remove(&(t, id.0, k));
        }
        self.queue.insert((at, id.0, kind));
    }

    /// Disarms connection `id`'s timer, if one is armed.
    pub(crate) fn disarm_conn(&mut self, id: CommId) {
        if let Some((t, k)) = self.conns.remove(&id) {
            self.queue.remove(&(t, id.0, k));
        }
    }

    /// Connection `id`'s armed timer.
    pub(crate) fn conn(&self, id: CommId) -> Option<(Instant, TimerKind)> {
        self.conns.get(&id).copied()
    }

    /// Arms a SIDR_REQ timer.
    pub(crate) fn insert_sidr(&mut self, at: Instant, id: SidrReqId) {
        self.queue.insert((at, id.raw(), TimerKind::Sidr));
    }

    /// Removes a SIDR_REQ timer entry.
    pub(crate) fn remove_sidr(&mut self, at: Instant, id: SidrReqId) {
        self.queue.remove(&(at, id.raw(), TimerKind::Sidr));
    }

    /// Arms the expiry of an incoming SIDR_REQ.
    pub(crate) fn insert_sidr_in(&mut self, at: Instant, id: CommId) {
        self.queue.insert((at, id.0, TimerKind::SidrIn));
    }

    /// Removes the expiry of an incoming SIDR_REQ.
    pub(crate) fn remove_sidr_in(&mut self, at: Instant, id: CommId) {
        self.queue.remove(&(at, id.0, TimerKind::SidrIn));
    }

    /// Heap bytes: the per-connection map from its capacity, the queue at its entries' size.
    pub(crate) fn heap_bytes(&self) -> usize {
        let conn = core::mem::size_of::<(CommId, (Instant, TimerKind))>();
        super::memory::table_bytes(self.conns.capacity(), conn)
            + self.queue.len() * core::mem::size_of::<(Instant, u32, TimerKind)>()
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
        let (at, raw, kind) = loop {
            let &(at, raw, kind) = self.queue.first()?;
            if at > now {
                return None;
            }
            self.queue.remove(&(at, raw, kind));
            if matches!(kind, TimerKind::Sidr | TimerKind::SidrIn) {
                break (at, raw, kind);
            }
            let id = CommId(raw);
            if self.conns.get(&id) == Some(&(at, kind)) {
                self.conns.remove(&id);
                break (at, raw, kind);
            }
            // A connection entry that is not its armed timer: stale, skipped.
        };
        Some(match kind {
            TimerKind::Sidr => Expired::Sidr {
                id: SidrReqId::from_raw(raw),
                at,
            },
            TimerKind::SidrIn => Expired::SidrIn {
                id: CommId(raw),
                at,
            },
            TimerKind::Resend | TimerKind::Timewait | TimerKind::Lifetime => Expired::Conn {
                id: CommId(raw),
                at,
                kind,
            },
        })
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
        t.arm_conn(CommId(1), t0 + Duration::from_millis(2), TimerKind::Resend);
        t.insert_sidr(t0 + Duration::from_millis(1), SidrReqId::from_raw(9));
        t.arm_conn(
            CommId(3),
            t0 + Duration::from_millis(1),
            TimerKind::Timewait,
        );
        assert_eq!(t.next_deadline(), Some(t0 + Duration::from_millis(1)));
        assert_eq!(t.pop_due(t0), None);
        let due = t0 + Duration::from_millis(1);
        assert_eq!(
            t.pop_due(due),
            Some(Expired::Conn {
                id: CommId(3),
                at: due,
                kind: TimerKind::Timewait
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
            Some((t0 + Duration::from_millis(2), TimerKind::Resend))
        );
        assert_eq!(t.conn(CommId(3)), None);
        t.disarm_conn(CommId(1));
        assert!(t.is_empty());
    }
}
