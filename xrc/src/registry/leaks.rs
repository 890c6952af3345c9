//! The leak report: live TGT QPs nobody uses.

use std::fmt;

use super::{DomainId, QpLife, TgtRegistry};
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
        self.qps
            .iter()
            .filter(|(_, q)| {
                q.life == QpLife::Live
                    && q.conns.is_empty()
                    && q.owner.is_none()
                    && q.registrations.is_empty()
            })
            .map(|(&qpn, q)| Leak {
                qpn,
                domain: q.domain,
                policy: q.policy,
                creator: q.creator,
            })
            .collect()
    }
}
