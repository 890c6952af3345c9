//! The endpoint's timers: a closed set of kinds, one deadline per armed timer, one queue.
//!
//! A connection has at most one timer armed at a time; its deadline and kind live in the
//! connection (`Conn::timer`). An outgoing SIDR_REQ has its own deadline (`SidrOut::timer`).
//! [`Timers`] orders every armed deadline so that `poll_timeout` is its first entry. Entries
//! are never updated in place: re-arming removes the old entry and inserts a new one, and an
//! entry that fires but no longer matches its owner's deadline is stale and ignored.

use std::collections::BTreeSet;
use std::time::Instant;

use ibcm_mad::CommId;

use super::ids::SidrReqId;

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
/// fire in ID order.
#[derive(Debug, Default)]
pub(crate) struct Timers(BTreeSet<(Instant, u32, TimerKind)>);

impl Timers {
    /// Arms a connection timer (`kind` is `Resend`, `Timewait` or `Lifetime`).
    pub(crate) fn insert_conn(&mut self, at: Instant, id: CommId, kind: TimerKind) {
        self.0.insert((at, id.0, kind));
    }

    /// Removes a connection timer entry.
    pub(crate) fn remove_conn(&mut self, at: Instant, id: CommId, kind: TimerKind) {
        self.0.remove(&(at, id.0, kind));
    }

    /// Arms a SIDR_REQ timer.
    pub(crate) fn insert_sidr(&mut self, at: Instant, id: SidrReqId) {
        self.0.insert((at, id.raw(), TimerKind::Sidr));
    }

    /// Removes a SIDR_REQ timer entry.
    pub(crate) fn remove_sidr(&mut self, at: Instant, id: SidrReqId) {
        self.0.remove(&(at, id.raw(), TimerKind::Sidr));
    }

    /// Arms the expiry of an incoming SIDR_REQ.
    pub(crate) fn insert_sidr_in(&mut self, at: Instant, id: CommId) {
        self.0.insert((at, id.0, TimerKind::SidrIn));
    }

    /// Removes the expiry of an incoming SIDR_REQ.
    pub(crate) fn remove_sidr_in(&mut self, at: Instant, id: CommId) {
        self.0.remove(&(at, id.0, TimerKind::SidrIn));
    }

    /// The earliest deadline.
    pub(crate) fn next_deadline(&self) -> Option<Instant> {
        self.0.first().map(|(t, _, _)| *t)
    }

    /// Whether no timer is armed.
    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Takes the earliest entry if it is due at `now`.
    pub(crate) fn pop_due(&mut self, now: Instant) -> Option<Expired> {
        let &(at, raw, kind) = self.0.first()?;
        if at > now {
            return None;
        }
        self.0.remove(&(at, raw, kind));
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
        let mut t = Timers::default();
        t.insert_conn(t0 + Duration::from_millis(2), CommId(1), TimerKind::Resend);
        t.insert_sidr(t0 + Duration::from_millis(1), SidrReqId::from_raw(9));
        t.insert_conn(
            t0 + Duration::from_millis(1),
            CommId(3),
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
        t.remove_conn(t0 + Duration::from_millis(2), CommId(1), TimerKind::Resend);
        assert!(t.is_empty());
    }
}
