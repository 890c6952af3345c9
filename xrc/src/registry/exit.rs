//! A holder dies: a process exits (or a keeper client disconnects), or the process holding
//! the registry itself crashes.

use std::fmt;
use std::time::Instant;

use super::{QpLife, Registrant, TgtRegistry};
use crate::policy::{decide, OwnershipPolicy, PolicyAction, PolicyEvent, Verdict};
use crate::types::{ProcessId, Qpn};

impl<K: Clone + Ord + fmt::Debug> TgtRegistry<K> {
    /// A process exited (or a keeper client disconnected): its registrations are dropped,
    /// and every QP it owned gets [`PolicyEvent::CreatorExit`]. Returns the QPs affected with
    /// their verdicts.
    pub fn process_exit(&mut self, now: Instant, pid: ProcessId) -> Vec<(Qpn, Verdict)> {
        let mut out = Vec::new();
        let live: Vec<Qpn> = self
            .qps
            .iter()
            .filter(|(_, q)| q.life == QpLife::Live)
            .map(|(&n, _)| n)
            .collect();
        for qpn in live {
            let Some(q) = self.qps.get_mut(&qpn) else {
                continue;
            };
            let had_reg = q.registrations.remove(&Registrant::Process(pid)).is_some();
            let owned = q.owner == Some(pid);
            let created_shared = q.policy == OwnershipPolicy::Shared && q.creator == pid;
            if owned {
                q.owner = None;
            }
            let now_empty = q.registrations.is_empty();
            let event = if owned || (created_shared && had_reg) {
                Some(PolicyEvent::CreatorExit)
            } else if had_reg && now_empty {
                Some(PolicyEvent::LastUnregister)
            } else {
                None
            };
            if let Some(e) = event {
                out.push((qpn, self.apply(now, qpn, e)));
            } else if had_reg {
                self.log(
                    now,
                    qpn,
                    format!("pid {pid} exited: registration dropped"),
                    None,
                    vec![],
                );
                out.push((qpn, Verdict::Kept));
            }
        }
        out
    }

    /// Simulates the death of the process holding this registry (a keeper crash): the kernel
    /// drops every handle, and the returned actions are what the rest of the world must do
    /// — DREQs for every connection, notifications, quarantines — per
    /// [`PolicyEvent::KeeperCrash`].
    pub fn crash(mut self, now: Instant) -> Vec<PolicyAction<K>> {
        let mut out = Vec::new();
        let live: Vec<Qpn> = self
            .qps
            .iter()
            .filter(|(_, q)| q.life == QpLife::Live)
            .map(|(&n, _)| n)
            .collect();
        for qpn in live {
            if let Some(q) = self.qps.get_mut(&qpn) {
                q.handle = None;
                let f = q.facts(qpn, true);
                let d = decide(&f, &PolicyEvent::KeeperCrash, now, &self.cfg.policy);
                out.extend(d.actions);
            }
        }
        // Dropping `self` drops the verbs context: for the software model that is the
        // process exit that destroys the handles.
        out
    }
}
