//! Domains: opening, looking up and closing XRC domains. A closing domain's handle is closed
//! once no QP pins it any more ([`TgtRegistry::close_domain`]).

use std::fmt;
use std::time::Instant;

use super::{DomainEntry, DomainId, QpLife, RegistryError, TgtRegistry};
use crate::policy::PolicyEvent;
use crate::types::{DomainSpec, Qpn};

/// Whether a domain is usable.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DomainState {
    /// Open.
    Open,
    /// Closed by its user, still held open by these QPs (`Explicit` ones, or QPs kept in
    /// quarantine).
    Closing {
        /// The QPs keeping it open.
        pinned_by: Vec<Qpn>,
    },
}

/// An XRC domain as the registry sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct XrcDomain {
    /// Its id in this registry.
    pub id: DomainId,
    /// The name it was opened under.
    pub name: String,
    /// How it was opened.
    pub spec: DomainSpec,
    /// Open or closing.
    pub state: DomainState,
    /// Its live TGT QPs.
    pub qps: Vec<Qpn>,
}

impl<K: Clone + Ord + fmt::Debug> TgtRegistry<K> {
    /// Opens a domain under `name`. If a domain of that name is already open here, returns
    /// it (unless `spec` asks for `O_EXCL`).
    ///
    /// # Errors
    /// [`RegistryError::DomainExists`], [`RegistryError::DomainClosing`], or the verbs error
    /// (`DomainNotFound`, `DomainExists` from another process, `NoXrc`, …).
    pub fn open_domain(&mut self, name: &str, spec: DomainSpec) -> Result<DomainId, RegistryError> {
        if let Some((&id, d)) = self.domains.iter().find(|(_, d)| d.name == name) {
            if d.closing {
                return Err(RegistryError::DomainClosing(id));
            }
            if matches!(
                spec,
                DomainSpec::File {
                    exclusive: true,
                    ..
                }
            ) {
                return Err(RegistryError::DomainExists(name.to_owned()));
            }
            return Ok(id);
        }
        let xrcd = self.verbs.open_xrcd(&spec)?;
        let id = DomainId(self.next_domain);
        self.next_domain = self.next_domain.wrapping_add(1);
        self.domains.insert(
            id,
            DomainEntry {
                name: name.to_owned(),
                spec,
                xrcd,
                closing: false,
            },
        );
        Ok(id)
    }

    /// Whether `id` was ever handed out by [`TgtRegistry::open_domain`] (it may be closed
    /// since). An id never handed out is a configuration error, not a closed domain.
    pub fn domain_ever_opened(&self, id: DomainId) -> bool {
        self.domains.contains_key(&id) || (id.0 >= 1 && id.0 < self.next_domain)
    }

    /// The domain opened under `name`.
    pub fn domain_by_name(&self, name: &str) -> Option<DomainId> {
        self.domains
            .iter()
            .find(|(_, d)| d.name == name)
            .map(|(&id, _)| id)
    }

    /// A snapshot of one domain.
    pub fn domain(&self, id: DomainId) -> Option<XrcDomain> {
        let d = self.domains.get(&id)?;
        let qps: Vec<Qpn> = self
            .qps
            .iter()
            .filter(|(_, q)| q.domain == id && q.life == QpLife::Live)
            .map(|(&n, _)| n)
            .collect();
        let state = if d.closing {
            DomainState::Closing {
                pinned_by: self
                    .qps
                    .iter()
                    .filter(|(_, q)| q.domain == id && q.handle.is_some())
                    .map(|(&n, _)| n)
                    .collect(),
            }
        } else {
            DomainState::Open
        };
        Some(XrcDomain {
            id,
            name: d.name.clone(),
            spec: d.spec.clone(),
            state,
            qps,
        })
    }

    /// Snapshots of every domain.
    pub fn domains(&self) -> Vec<XrcDomain> {
        self.domains
            .keys()
            .filter_map(|&id| self.domain(id))
            .collect()
    }

    /// Closes a domain: every live TGT QP in it gets [`PolicyEvent::DomainClose`]. The
    /// domain's handle is closed once no QP (Explicit ones, or ones held in quarantine) keeps
    /// it open; until then it is [`DomainState::Closing`].
    ///
    /// # Errors
    /// [`RegistryError::UnknownDomain`].
    pub fn close_domain(
        &mut self,
        now: Instant,
        id: DomainId,
    ) -> Result<DomainState, RegistryError> {
        let d = self
            .domains
            .get_mut(&id)
            .ok_or(RegistryError::UnknownDomain(id))?;
        d.closing = true;
        let live: Vec<Qpn> = self
            .qps
            .iter()
            .filter(|(_, q)| q.domain == id && q.life == QpLife::Live)
            .map(|(&n, _)| n)
            .collect();
        for qpn in live {
            self.apply(now, qpn, PolicyEvent::DomainClose);
        }
        self.try_finish_close(id);
        Ok(self
            .domain(id)
            .map_or(DomainState::Closing { pinned_by: vec![] }, |d| d.state))
    }

    pub(super) fn try_finish_close(&mut self, id: DomainId) {
        let Some(d) = self.domains.get(&id) else {
            return;
        };
        if !d.closing {
            return;
        }
        let pinned = self
            .qps
            .values()
            .any(|q| q.domain == id && q.handle.is_some())
            || self
                .extra_quarantine
                .values()
                .any(|(_, h, _)| matches!(h, Some((_, dom)) if *dom == id));
        if pinned {
            return;
        }
        let xrcd = d.xrcd;
        if self.verbs.close_xrcd(xrcd).is_ok() {
            self.domains.remove(&id);
        }
    }
}
