//! A TGT QP went away: each connection on it is torn down ([`Teardown`]: DREQ when
//! established, REJ during setup), the registry's other actions become [`TargetEvent`]s
//! ([`XrcTarget::flush`]); a keeper crash hands everything to a restarted registry.

use std::time::Instant;

use ibcm::proto::{CallError, ConnId, Endpoint, State};
use ibcm_mad::{Qpn, RejReason};

use super::{TargetEvent, XrcTarget};
use crate::policy::PolicyAction;
#[cfg(doc)]
use crate::registry::DomainId;
use crate::registry::TgtRegistry;
use ibcm_mad::xrc::{GoneCause, TargetGone};

/// A connection the target must tear down because its TGT QP went away.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Teardown {
    /// The connection.
    pub conn: ConnId,
    /// Its TGT QP.
    pub qpn: Qpn,
    /// Why the QP went away.
    pub cause: GoneCause,
}

/// What [`Teardown::execute`] put on the wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TeardownKind {
    /// A DREQ (the connection was established).
    Dreq,
    /// A REJ reason 1 with the [`TargetGone`] block (the REP was not answered yet).
    Rej,
    /// Nothing: the connection was already closing or gone.
    Nothing,
}

impl Teardown {
    /// The "target gone" block for this connection.
    pub fn info(&self) -> TargetGone {
        TargetGone::gone(self.cause, self.qpn)
    }

    /// Executes it on `ep` according to the connection's state: DREQ when established (with
    /// the [`TargetGone`] block as private data if `dreq_reason`), REJ reason 1 + the block
    /// during setup, nothing when it is already closing.
    ///
    /// # Errors
    /// The endpoint's [`CallError`] (not expected: the state was checked).
    pub fn execute(
        &self,
        ep: &mut Endpoint,
        now: Instant,
        dreq_reason: bool,
    ) -> Result<TeardownKind, CallError> {
        let block = self.info().to_bytes();
        match ep.state(self.conn) {
            Some(State::Established) => {
                let pd: &[u8] = if dreq_reason { &block } else { &[] };
                ep.disconnect(now, self.conn, pd)?;
                Ok(TeardownKind::Dreq)
            }
            Some(State::ReqRcvd | State::MraReqSent | State::RepSent | State::MraRepRcvd) => {
                ep.reject(now, self.conn, RejReason::NoQp, &block, &block)?;
                Ok(TeardownKind::Rej)
            }
            _ => Ok(TeardownKind::Nothing),
        }
    }
}

impl XrcTarget {
    /// Tears `conn` down on `ep` (its TGT QP went away): a DREQ when established, else a
    /// REJ; counted by what actually went out (a connection already closing — the peer's
    /// DREQ that released the QP, say — counts as neither), and reported as a
    /// [`TargetEvent::Teardown`]. Returns what went out.
    fn teardown(
        &mut self,
        ep: &mut Endpoint,
        now: Instant,
        conn: ConnId,
        qpn: Qpn,
        cause: GoneCause,
    ) -> TeardownKind {
        let kind = Teardown { conn, qpn, cause }
            .execute(ep, now, self.cfg.dreq_reason)
            .unwrap_or(TeardownKind::Nothing);
        match kind {
            TeardownKind::Dreq => self.stats.dreqs = self.stats.dreqs.saturating_add(1),
            TeardownKind::Rej => self.stats.rejs = self.stats.rejs.saturating_add(1),
            TeardownKind::Nothing => return kind,
        }
        self.events.push_back(TargetEvent::Teardown {
            conn,
            qpn,
            cause,
            established: kind == TeardownKind::Dreq,
        });
        kind
    }

    /// Executes what the registry asked for since the last call, in order, on `ep`: a
    /// [`Teardown`] for each connection whose TGT QP went away, a [`TargetEvent`] for the
    /// rest; then hands the events to the observer, if set. Returns how many DREQs or REJs
    /// went out. (The simulator and the driver call it after every input: `App::poll`.)
    pub fn flush(&mut self, ep: &mut Endpoint, now: Instant) -> usize {
        let mut n = 0usize;
        while let Some(a) = self.pending.pop_front().or_else(|| self.reg.poll_action()) {
            match a {
                PolicyAction::EndConnection { conn, qpn, cause } => {
                    if matches!(
                        self.teardown(ep, now, conn, qpn, cause),
                        TeardownKind::Dreq | TeardownKind::Rej
                    ) {
                        n = n.saturating_add(1);
                    }
                }
                PolicyAction::NotifyHolders { qpn, cause } => {
                    self.events
                        .push_back(TargetEvent::HoldersNotified { qpn, cause });
                }
                PolicyAction::ReportOrphan { qpn } => {
                    self.events.push_back(TargetEvent::Orphaned { qpn });
                }
                _ => {}
            }
        }
        if let Some(f) = self.observer.as_mut() {
            while let Some(e) = self.events.pop_front() {
                f(now, e);
            }
        }
        if let Some(f) = self.trace_observer.as_mut() {
            while let Some(t) = self.reg.poll_trace() {
                f(t);
            }
        }
        n
    }

    /// The keeper holding the registry's handles died ([`TgtRegistry::crash`]): every
    /// connection on its QPs is torn down (DREQ, [`GoneCause::KeeperLost`]) and `restarted`
    /// — the registry of the restarted keeper — takes over, with the lost QPNs quarantined
    /// (a REQ naming one is rejected as "keeper lost"). Services keep their [`DomainId`]s:
    /// open the domains in `restarted` in the same order (ids are assigned sequentially) or
    /// [`XrcTarget::serve`] them again.
    pub fn keeper_crash(&mut self, now: Instant, restarted: TgtRegistry<ConnId>) {
        let mut old = std::mem::replace(&mut self.reg, restarted);
        while let Some(a) = old.poll_action() {
            self.pending.push_back(a);
        }
        for a in old.crash(now) {
            match a {
                PolicyAction::QuarantineQpn { qpn, until } => {
                    self.reg.note_gone(qpn, GoneCause::KeeperLost, until);
                }
                a @ (PolicyAction::EndConnection { .. } | PolicyAction::NotifyHolders { .. }) => {
                    self.pending.push_back(a);
                }
                _ => {}
            }
        }
        self.psns.clear();
    }
}
