//! TGT QPs: creation (skipping quarantined numbers), registrations, owner destroy and
//! adopt, modify through the registry's handle, and snapshots.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Instant;

use super::quarantine::QpnStatus;
use super::{DomainId, IniPeer, QpEntry, QpLife, Registrant, RegistryError, TgtRegistry};
use crate::policy::{OwnershipPolicy, PolicyEvent, Verdict};
use crate::types::{ProcessId, Qpn};
use crate::verbs::qp::{QpAttr, QpState};
#[cfg(doc)]
use crate::verbs::VerbsError;
use ibcm_mad::xrc::GoneCause;

/// A snapshot of one TGT QP.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TgtQp<K> {
    /// QP number.
    pub qpn: Qpn,
    /// Its domain.
    pub domain: DomainId,
    /// Its policy.
    pub policy: OwnershipPolicy,
    /// The process that created it.
    pub creator: ProcessId,
    /// Its owner (`None` for `Shared`, and for orphans).
    pub owner: Option<ProcessId>,
    /// Registrations and their counts.
    pub registrations: Vec<(Registrant<K>, u32)>,
    /// Connections on it.
    pub conns: Vec<K>,
    /// Its initiator, once a REQ bound one.
    pub peer: Option<IniPeer>,
    /// QP state (as last set through the registry).
    pub state: QpState,
    /// Alive or gone.
    pub life: QpLife,
}

impl<K: Clone + Ord + fmt::Debug> TgtRegistry<K> {
    /// Creates a TGT QP in `domain` with `policy`, created by (and, except for `Shared`,
    /// owned by) `creator`. A `Shared` QP starts with one registration of `creator`.
    ///
    /// # Errors
    /// [`RegistryError::UnknownDomain`], [`RegistryError::DomainClosing`],
    /// [`RegistryError::QpnsExhausted`], or the verbs error.
    pub fn create_tgt_qp(
        &mut self,
        now: Instant,
        domain: DomainId,
        policy: OwnershipPolicy,
        creator: ProcessId,
    ) -> Result<Qpn, RegistryError> {
        let qpn = self.create_inner(now, domain, policy, creator, None, &|_| None)?;
        if policy == OwnershipPolicy::Shared {
            if let Some(q) = self.qps.get_mut(&qpn) {
                q.registrations.insert(Registrant::Process(creator), 1);
            }
        }
        self.log(
            now,
            qpn,
            format!("create {policy} by pid {creator}"),
            None,
            vec![],
        );
        Ok(qpn)
    }

    /// Creates a TGT QP whose number is in neither this registry's quarantine nor the CM's
    /// (`cm_quarantined`: until when the CM endpoint keeps a number out of use, for the
    /// TimeWaits of connections this registry never saw); a QP numbered like that is parked
    /// until the later of the two ends, and another one is created.
    pub(super) fn create_inner(
        &mut self,
        now: Instant,
        domain: DomainId,
        policy: OwnershipPolicy,
        creator: ProcessId,
        peer: Option<IniPeer>,
        cm_quarantined: &dyn Fn(Qpn) -> Option<Instant>,
    ) -> Result<Qpn, RegistryError> {
        let d = self
            .domains
            .get(&domain)
            .ok_or(RegistryError::UnknownDomain(domain))?;
        if d.closing {
            return Err(RegistryError::DomainClosing(domain));
        }
        let xrcd = d.xrcd;
        let attempts = self.cfg.max_create_attempts.max(1);
        for _ in 0..attempts {
            let h = self.verbs.create_tgt_qp(xrcd)?;
            let qpn = match self.verbs.qp_num(h) {
                Ok(q) => q,
                Err(e) => {
                    let _ = self.verbs.destroy_qp(h);
                    return Err(e.into());
                }
            };
            let ours = match self.qpn_status(qpn, now) {
                QpnStatus::Quarantined { until, cause } => Some((until, cause)),
                QpnStatus::Live | QpnStatus::Unknown => None,
            };
            let cm = cm_quarantined(qpn).filter(|&u| u > now);
            let parked = match (ours, cm) {
                (Some((until, cause)), cm) => Some((cm.map_or(until, |u| u.max(until)), cause)),
                (None, Some(until)) => Some((until, GoneCause::Unknown)),
                (None, None) => None,
            };
            if let Some((until, cause)) = parked {
                // The device gave a number still in TimeWait (ours, or the CM's for a
                // connection we never saw): keep that QP (so the number stays taken) until
                // the quarantine ends, and try again. A CM-reported TimeWait of the same
                // number may last longer than the QP's own quarantine.
                let until = self
                    .extra_quarantine
                    .get(&qpn)
                    .map_or(until, |e| e.0.max(until));
                self.extra_quarantine
                    .insert(qpn, (until, Some((h, domain)), cause));
                self.log(
                    now,
                    qpn,
                    "parked: number still quarantined".into(),
                    None,
                    vec![],
                );
                continue;
            }
            let owner = (policy != OwnershipPolicy::Shared).then_some(creator);
            self.qps.insert(
                qpn,
                QpEntry {
                    domain,
                    policy,
                    handle: Some(h),
                    creator,
                    owner,
                    registrations: BTreeMap::new(),
                    conns: BTreeMap::new(),
                    peer,
                    state: QpState::Reset,
                    life: QpLife::Live,
                },
            );
            return Ok(qpn);
        }
        Err(RegistryError::QpnsExhausted { attempts })
    }

    fn live_mut(&mut self, qpn: Qpn) -> Result<&mut QpEntry<K>, RegistryError> {
        match self.qps.get_mut(&qpn) {
            None => Err(RegistryError::UnknownQpn(qpn)),
            Some(q) => match q.life {
                QpLife::Live => Ok(q),
                QpLife::Gone { cause, .. } => Err(RegistryError::Gone { qpn, cause }),
            },
        }
    }

    /// Adds a registration (OFED `ibv_reg_xrc_rcv_qp`). Fails if the QP is gone.
    ///
    /// # Errors
    /// [`RegistryError::UnknownQpn`], [`RegistryError::Gone`].
    pub fn register(
        &mut self,
        now: Instant,
        qpn: Qpn,
        who: Registrant<K>,
    ) -> Result<u32, RegistryError> {
        let q = self.live_mut(qpn)?;
        let c = q.registrations.entry(who.clone()).or_insert(0);
        *c = c.saturating_add(1);
        let n = *c;
        self.log(now, qpn, format!("register {who}"), None, vec![]);
        Ok(n)
    }

    /// Drops one registration (OFED `ibv_unreg_xrc_rcv_qp`); at the last one the QP gets
    /// [`PolicyEvent::LastUnregister`].
    ///
    /// # Errors
    /// [`RegistryError::NotRegistered`], [`RegistryError::UnknownQpn`], [`RegistryError::Gone`].
    pub fn unregister(
        &mut self,
        now: Instant,
        qpn: Qpn,
        who: &Registrant<K>,
    ) -> Result<Verdict, RegistryError> {
        let q = self.live_mut(qpn)?;
        match q.registrations.get_mut(who) {
            Some(c) if *c > 1 => *c -= 1,
            Some(_) => {
                q.registrations.remove(who);
            }
            None => {
                return Err(RegistryError::NotRegistered {
                    qpn,
                    who: who.to_string(),
                })
            }
        }
        let last = q.registrations.is_empty();
        self.log(now, qpn, format!("unregister {who}"), None, vec![]);
        if last {
            Ok(self.apply(now, qpn, PolicyEvent::LastUnregister))
        } else {
            Ok(Verdict::Kept)
        }
    }

    /// Destroys a TGT QP at its owner's request ([`PolicyEvent::OwnerDestroy`]). For `Shared`
    /// it drops `by`'s registrations instead; an orphan (owner gone) may be destroyed by
    /// anyone.
    ///
    /// # Errors
    /// [`RegistryError::NotOwner`], [`RegistryError::NotRegistered`], …
    pub fn destroy(
        &mut self,
        now: Instant,
        qpn: Qpn,
        by: ProcessId,
    ) -> Result<Verdict, RegistryError> {
        let q = self.live_mut(qpn)?;
        if q.policy == OwnershipPolicy::Shared {
            if q.registrations.remove(&Registrant::Process(by)).is_none() {
                return Err(RegistryError::NotRegistered {
                    qpn,
                    who: Registrant::<K>::Process(by).to_string(),
                });
            }
        } else if q.owner.is_some_and(|o| o != by) {
            return Err(RegistryError::NotOwner {
                qpn,
                owner: q.owner,
            });
        }
        Ok(self.apply(now, qpn, PolicyEvent::OwnerDestroy))
    }

    /// How many live TGT QPs were created by a process for which `creator` holds (orphans
    /// included, gone ones in quarantine not): a CM's quota on the TGT QPs of a user.
    pub fn live_created_by(&self, creator: impl Fn(ProcessId) -> bool) -> usize {
        self.live_creators().filter(|&p| creator(p)).count()
    }

    /// The creator of each live QP (one item per QP), for counting several ways in one pass.
    pub fn live_creators(&self) -> impl Iterator<Item = ProcessId> + '_ {
        self.qps
            .values()
            .filter(|q| q.life == QpLife::Live)
            .map(|q| q.creator)
    }

    /// Makes `by` the owner of an orphaned (owner-less) QP: ownership transfer after the
    /// creator exited ("RDMA/core: Export ib_open_qp()": the creating process may exit).
    ///
    /// # Errors
    /// [`RegistryError::NotOwner`] if it has a live owner; not allowed on `Shared` QPs.
    pub fn adopt(&mut self, now: Instant, qpn: Qpn, by: ProcessId) -> Result<(), RegistryError> {
        let q = self.live_mut(qpn)?;
        if q.owner.is_some() || q.policy == OwnershipPolicy::Shared {
            return Err(RegistryError::NotOwner {
                qpn,
                owner: q.owner,
            });
        }
        q.owner = Some(by);
        self.log(now, qpn, format!("adopted by pid {by}"), None, vec![]);
        Ok(())
    }

    /// Modifies a TGT QP through the registry's handle (every holder may modify; OFED
    /// `ibv_modify_xrc_rcv_qp` by number).
    ///
    /// # Errors
    /// [`RegistryError::Gone`], or [`VerbsError::Modify`] for a bad transition.
    pub fn modify(&mut self, qpn: Qpn, attr: &QpAttr) -> Result<QpState, RegistryError> {
        let q = self.live_mut(qpn)?;
        let h = q.handle.ok_or(RegistryError::Gone {
            qpn,
            cause: GoneCause::KeeperLost,
        })?;
        self.verbs.modify_qp(h, attr)?;
        let st = self.verbs.query_qp(h)?.state;
        if let Ok(q) = self.live_mut(qpn) {
            q.state = st;
        }
        Ok(st)
    }

    /// A snapshot of one TGT QP (live or in quarantine).
    ///
    /// # Errors
    /// [`RegistryError::UnknownQpn`].
    pub fn query(&self, qpn: Qpn) -> Result<TgtQp<K>, RegistryError> {
        let q = self.qps.get(&qpn).ok_or(RegistryError::UnknownQpn(qpn))?;
        Ok(Self::snapshot(qpn, q))
    }

    fn snapshot(qpn: Qpn, q: &QpEntry<K>) -> TgtQp<K> {
        TgtQp {
            qpn,
            domain: q.domain,
            policy: q.policy,
            creator: q.creator,
            owner: q.owner,
            registrations: q
                .registrations
                .iter()
                .map(|(r, c)| (r.clone(), *c))
                .collect(),
            conns: q.conns.keys().cloned().collect(),
            peer: q.peer,
            state: q.state,
            life: q.life,
        }
    }

    /// Snapshots of every TGT QP, live ones and those in quarantine, by QPN.
    pub fn tgt_qps(&self) -> Vec<TgtQp<K>> {
        self.qps
            .iter()
            .map(|(&n, q)| Self::snapshot(n, q))
            .collect()
    }
}
