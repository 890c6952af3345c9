//! The leak report: live TGT QPs nobody uses.

use std::fmt;

use super::{DomainId, QpLife, Registrant, TgtRegistry};
use crate::policy::OwnershipPolicy;
use crate::types::{ProcessId, Qpn};

/// A TGT QP nobody uses: no live connection, no owner and no registration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Leak {
    /// QP number.
    pub qpn: Qpn,
    /// Domain.
    pub domain: DomainId,
    /// Policy.
    pub policy: OwnershipPolicy,
    /// The creator (no longer running, or no longer owning it).
    pub creator: ProcessId,
}

impl<K: Clone + Ord + fmt::Debug> TgtRegistry<K> {
    /// Live TGT QPs nobody uses: no connection, no owner, no registration.
    pub fn leaks(&self) -> Vec<Leak> {
        self.leaks_with(|_| true)
    }

    /// [`TgtRegistry::leaks`] counting only the connections `is_live` confirms: a QP held
    /// only by bindings its CM no longer knows (a connection that ended without a
    /// [`ConnEvent`](super::ConnEvent)), and without owner or other registration, is a leak
    /// too; its phantom connections are in [`TgtRegistry::stale_conns`].
    pub fn leaks_with(&self, is_live: impl Fn(&K) -> bool) -> Vec<Leak> {
        self.qps
            .iter()
            .filter(|(_, q)| {
                q.life == QpLife::Live
                    && !q.conns.keys().any(&is_live)
                    && q.owner.is_none()
                    && q.registrations.keys().all(|r| match r {
                        Registrant::Conn(k) => !is_live(k),
                        Registrant::Process(_) => false,
                    })
            })
            .map(|(&qpn, q)| Leak {
                qpn,
                domain: q.domain,
                policy: q.policy,
                creator: q.creator,
            })
            .collect()
    }

    /// The bindings `is_live` does not confirm: connections the registry holds on a TGT QP
    /// that its CM no longer knows.
    pub fn stale_conns(&self, is_live: impl Fn(&K) -> bool) -> Vec<(K, Qpn)> {
        self.conns
            .iter()
            .filter(|(k, _)| !is_live(k))
            .map(|(k, &q)| (k.clone(), q))
            .collect()
    }
}
