//! QPN quarantine: numbers of gone QPs, CM TimeWaits the CM reports, numbers a crashed
//! keeper lost; and the timer that ends quarantines.

use std::fmt;
use std::time::Instant;

use super::{QpLife, TgtRegistry};
#[cfg(doc)]
use crate::policy::PolicyAction;
use crate::policy::PolicyEvent;
use crate::types::Qpn;
use ibcm_mad::xrc::GoneCause;

/// What [`TgtRegistry::qpn_status`] says about a number.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QpnStatus {
    /// A live TGT QP of this registry.
    Live,
    /// Gone and quarantined.
    Quarantined {
        /// Why it went (`Unknown` for numbers reported by [`TgtRegistry::note_timewait`], the
        /// noted cause for [`TgtRegistry::note_gone`]).
        cause: GoneCause,
        /// End of the quarantine.
        until: Instant,
    },
    /// Not known.
    Unknown,
}

impl<K: Clone + Ord + fmt::Debug> TgtRegistry<K> {
    /// Whether a QPN is live, quarantined or unknown here.
    pub fn qpn_status(&self, qpn: Qpn, now: Instant) -> QpnStatus {
        if let Some(q) = self.qps.get(&qpn) {
            return match q.life {
                QpLife::Live => QpnStatus::Live,
                QpLife::Gone { cause, until } => QpnStatus::Quarantined { cause, until },
            };
        }
        match self.extra_quarantine.get(&qpn) {
            Some(&(until, _, cause)) if until > now => QpnStatus::Quarantined { cause, until },
            _ => QpnStatus::Unknown,
        }
    }

    /// Records that `qpn` is in CM TimeWait until `until` (a connection on it ended, or the
    /// CM knows about connections the registry never saw). Such a number is not handed out
    /// for a new TGT QP; a gone QP of that number is held until then; a live one, if
    /// released later, is quarantined at least until then.
    pub fn note_timewait(&mut self, qpn: Qpn, until: Instant) {
        // A gone QP is held (and its number quarantined) until the longest TimeWait.
        if let Some(q) = self.qps.get_mut(&qpn) {
            if let QpLife::Gone { cause, until: u } = q.life {
                if u < until {
                    q.life = QpLife::Gone { cause, until };
                }
                return;
            }
        }
        let e = self
            .extra_quarantine
            .entry(qpn)
            .or_insert((until, None, GoneCause::Unknown));
        if e.0 < until {
            e.0 = until;
        }
    }

    /// Records that the TGT QP `qpn` went away outside this registry — typically one a
    /// crashed keeper held (see [`TgtRegistry::crash`]; the restarted registry learns the
    /// numbers from the crash's [`PolicyAction::QuarantineQpn`] actions) — for `cause`, and
    /// that its number stays quarantined until `until`. Until then a REQ naming it is
    /// rejected with this cause (instead of [`GoneCause::Unknown`]) and no new TGT QP gets
    /// the number. Ignored for a QPN this registry manages itself.
    pub fn note_gone(&mut self, qpn: Qpn, cause: GoneCause, until: Instant) {
        if self.qps.contains_key(&qpn) {
            return;
        }
        let e = self
            .extra_quarantine
            .entry(qpn)
            .or_insert((until, None, cause));
        e.2 = cause;
        if e.0 < until {
            e.0 = until;
        }
    }

    /// When [`TgtRegistry::handle_timeout`] must next be called.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let gone = self.qps.values().filter_map(|q| match q.life {
            QpLife::Gone { until, .. } => Some(until),
            QpLife::Live => None,
        });
        let extra = self.extra_quarantine.values().map(|(u, _, _)| *u);
        gone.chain(extra).min()
    }

    /// Ends every quarantine due at `now`: held QPs are destroyed, numbers released, closing
    /// domains finished. A spurious call does nothing.
    pub fn handle_timeout(&mut self, now: Instant) {
        let due: Vec<Qpn> = self
            .qps
            .iter()
            .filter(|(_, q)| matches!(q.life, QpLife::Gone { until, .. } if until <= now))
            .map(|(&n, _)| n)
            .collect();
        for qpn in due {
            self.apply(now, qpn, PolicyEvent::QuarantineExpired);
        }
        let extra: Vec<Qpn> = self
            .extra_quarantine
            .iter()
            .filter(|(_, (until, _, _))| *until <= now)
            .map(|(&n, _)| n)
            .collect();
        for qpn in extra {
            if let Some((_, Some((h, dom)), _)) = self.extra_quarantine.remove(&qpn) {
                let _ = self.verbs.destroy_qp(h);
                self.log(now, qpn, "parked QP destroyed".into(), None, vec![]);
                self.try_finish_close(dom);
            }
        }
    }
}
