//! Running the policy engine ([`decide`]) on one TGT QP and executing its verbs-side
//! actions; CM-side actions go to the outbox ([`TgtRegistry::poll_action`]).

use std::fmt;
use std::time::Instant;

use super::{QpLife, Registrant, TgtRegistry};
use crate::policy::{decide, PolicyAction, PolicyEvent, Verdict};
use crate::types::Qpn;
use crate::verbs::qp::{QpAttr, QpState};
use ibcm_mad::xrc::GoneCause;

impl<K: Clone + Ord + fmt::Debug> TgtRegistry<K> {
    /// Runs the engine for `event` on `qpn` and executes the result.
    pub(super) fn apply(&mut self, now: Instant, qpn: Qpn, event: PolicyEvent<K>) -> Verdict {
        let Some(q) = self.qps.get(&qpn) else {
            return Verdict::AlreadyGone(GoneCause::Unknown);
        };
        let domain_open = self.domains.get(&q.domain).is_some_and(|d| !d.closing);
        let facts = q.facts(qpn, domain_open);
        let d = decide(&facts, &event, now, &self.cfg.policy);
        self.log(
            now,
            qpn,
            event.name().into(),
            Some(d.verdict),
            d.actions.clone(),
        );
        let mut cause_for_gone = match d.verdict {
            Verdict::Released(c) => Some(c),
            _ => None,
        };
        for a in d.actions {
            match a {
                PolicyAction::ModifyToError { qpn } => {
                    // RESET→ERR is not a valid transition, and a QP in RESET (or already in
                    // ERR) delivers nothing anyway.
                    let h = self
                        .qps
                        .get(&qpn)
                        .filter(|q| !matches!(q.state, QpState::Reset | QpState::Err))
                        .and_then(|q| q.handle);
                    if let Some(h) = h {
                        if self
                            .verbs
                            .modify_qp(h, &QpAttr::to_state(QpState::Err))
                            .is_ok()
                        {
                            if let Some(q) = self.qps.get_mut(&qpn) {
                                q.state = QpState::Err;
                            }
                        }
                    }
                }
                PolicyAction::DestroyQp { qpn } => {
                    let dom = self
                        .qps
                        .get_mut(&qpn)
                        .and_then(|q| q.handle.take().map(|h| (h, q.domain)));
                    if let Some((h, dom)) = dom {
                        let _ = self.verbs.destroy_qp(h);
                        self.try_finish_close(dom);
                    }
                }
                PolicyAction::QuarantineQpn { qpn, until } => {
                    // A TimeWait the CM reported for this number while the QP lived (a
                    // connection that left earlier) may end later than the engine's.
                    let noted = match self.extra_quarantine.get(&qpn) {
                        Some(&(u, None, _)) => Some(u),
                        _ => None,
                    };
                    let until = noted.map_or(until, |u| u.max(until));
                    if let (Some(q), Some(cause)) = (self.qps.get_mut(&qpn), cause_for_gone.take())
                    {
                        if noted.is_some() {
                            self.extra_quarantine.remove(&qpn);
                        }
                        q.life = QpLife::Gone { cause, until };
                        q.owner = None;
                        q.registrations.clear();
                        let conns: Vec<K> = std::mem::take(&mut q.conns).into_keys().collect();
                        for c in conns {
                            self.conns.remove(&c);
                        }
                    }
                }
                PolicyAction::ReleaseQpn { qpn } => {
                    let dom = self.qps.remove(&qpn).map(|q| q.domain);
                    if let Some(dom) = dom {
                        self.try_finish_close(dom);
                    }
                }
                PolicyAction::ForgetConn { conn } => {
                    self.conns.remove(&conn);
                    if let Some(q) = self.qps.get_mut(&qpn) {
                        q.conns.remove(&conn);
                        q.registrations.remove(&Registrant::Conn(conn));
                    }
                }
                PolicyAction::PinDomain { .. } | PolicyAction::RejectReq { .. } => {}
                a @ (PolicyAction::EndConnection { .. }
                | PolicyAction::NotifyHolders { .. }
                | PolicyAction::ReportOrphan { .. }) => self.outbox.push_back(a),
            }
        }
        d.verdict
    }
}
