//! The passive (TGT) side: [`XrcTarget`] (module docs of [`crate::cm`]).
//!
//! * this file: [`XrcTarget`] (its services, its registry, its outputs and timers),
//!   [`XrcService`], [`XrcTargetConfig`], [`TargetEvent`], [`TargetStats`];
//! * `accept.rs`: an XRC REQ in, a REP or REJ out ([`TgtAnswer`]), the TGT QP brought to RTR;
//! * `teardown.rs`: a TGT QP went away — [`Teardown`] of each connection on it (DREQ or REJ),
//!   the registry's other actions, a keeper crash;
//! * `endpoint.rs`: the glue to an ibcm `Endpoint` — its events in, [`ibcm::App`],
//!   [`passive_timewait`], [`conn_event_of`].

use std::collections::{BTreeMap, VecDeque};
use std::fmt;
use std::time::Instant;

use ibcm::proto::{CallError, ConnId, Endpoint, ListenOptions};
use ibcm_mad::{Psn, Qpn, ReqTransport, ServiceId};

use crate::policy::{OwnershipPolicy, PolicyAction, Verdict};
use crate::registry::{ConnEvent, DomainId, IniPeer, TgtRegistry, TraceEntry};
use crate::types::{ProcessId, SrqNum};
use crate::verbs::qp::AccessFlags;
#[cfg(doc)]
use crate::{cm::IniOutcome, XrcRepData};
use ibcm_mad::xrc::{GoneCause, TargetGone};

mod accept;
mod endpoint;
mod teardown;
#[cfg(test)]
mod tests;

pub use accept::TgtAnswer;
pub use endpoint::{conn_event_of, passive_timewait};
pub use teardown::{Teardown, TeardownKind};

/// Who answers the XRC REQs of one service ID.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct XrcService {
    /// The XRC domain the TGT QPs are created in (or must belong to, for an attach).
    pub domain: DomainId,
    /// The accepting process: creator (and, except for `Shared`, owner) of TGT QPs created
    /// for its REQs.
    pub process: ProcessId,
    /// The process's XRC SRQ numbers, sent in the REP ([`XrcRepData`]); 1..=47.
    pub srqns: Vec<SrqNum>,
    /// Application bytes after the [`XrcRepData`] in the REP (dropped if they do not fit).
    pub rep_app_data: Vec<u8>,
    /// The policy of every TGT QP this service creates, whatever the REQ asks (the target
    /// chooses); `None`: the REQ's, else the registry's default.
    pub policy: Option<OwnershipPolicy>,
    /// The TGT QP that answers the REQs in mode `any` (as if they attached to it): a
    /// service of one QP held elsewhere (a keeper's, registered on by other processes).
    /// `None`: the registry's rule (the QP kept for the initiator, else a new one).
    pub tgt_qpn: Option<Qpn>,
    /// Whether the connections this service accepts register on `Shared` QPs; `None`: the
    /// registry's [`RegistryConfig::connection_registrations`](crate::RegistryConfig).
    pub conn_registrations: Option<bool>,
}

impl XrcService {
    /// A service of `process` in `domain` announcing `srqns`.
    pub fn new(domain: DomainId, process: ProcessId, srqns: Vec<SrqNum>) -> Self {
        Self {
            domain,
            process,
            srqns,
            rep_app_data: Vec::new(),
            policy: None,
            tgt_qpn: None,
            conn_registrations: None,
        }
    }
}

/// Settings of an [`XrcTarget`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct XrcTargetConfig {
    /// Bring a TGT QP found in RESET to RTR (INIT, then RTR towards the REQ's INI QP, its
    /// path, MTU and the PSN the REP announces) before the REP goes out. Default `true`.
    pub bring_up: bool,
    /// Port for the INIT transition. Default 1.
    pub port: u8,
    /// Access flags for the INIT transition. Default remote write, read and atomic.
    pub access: AccessFlags,
    /// Minimal RNR NAK timer for RTR. Default 12.
    pub min_rnr_timer: u8,
    /// Put the [`TargetGone`] block in the private data of the DREQs the target sends when a
    /// TGT QP goes away, so the initiator learns why ([`IniOutcome::TargetGone`]). Default
    /// `true`.
    pub dreq_reason: bool,
}

impl Default for XrcTargetConfig {
    fn default() -> Self {
        Self {
            bring_up: true,
            port: 1,
            access: AccessFlags::REMOTE_WRITE
                | AccessFlags::REMOTE_READ
                | AccessFlags::REMOTE_ATOMIC,
            min_rnr_timer: 12,
            dreq_reason: true,
        }
    }
}

/// What an [`XrcTarget`] did, for the application, a keeper, logs and timelines.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum TargetEvent {
    /// An XRC REQ was accepted (the REP goes out).
    Accepted {
        /// The connection.
        conn: ConnId,
        /// The service it asked for.
        service: ServiceId,
        /// The initiator.
        peer: IniPeer,
        /// The TGT QP it sits on.
        qpn: Qpn,
        /// Whether the QP was created for it (else attached).
        created: bool,
        /// The QP's policy.
        policy: OwnershipPolicy,
    },
    /// An XRC REQ was rejected.
    Rejected {
        /// The connection being set up.
        conn: ConnId,
        /// The service it asked for.
        service: ServiceId,
        /// The initiator.
        peer: IniPeer,
        /// What the REJ says.
        info: TargetGone,
    },
    /// The endpoint refused the accept (e.g. a new QP's number is in the endpoint's own
    /// TimeWait quarantine, after an [`XrcTarget::on_request`] by hand, which does not ask the
    /// endpoint); the REQ was rejected with reason 3 instead.
    AcceptFailed {
        /// The connection.
        conn: ConnId,
        /// The TGT QP it would have used.
        qpn: Qpn,
        /// The endpoint's error.
        error: CallError,
    },
    /// A connection on a TGT QP is established.
    Established {
        /// The connection.
        conn: ConnId,
        /// Its TGT QP.
        qpn: Qpn,
    },
    /// A connection on a TGT QP ended.
    Closed {
        /// The connection.
        conn: ConnId,
        /// Its TGT QP.
        qpn: Qpn,
        /// How the registry was told.
        event: ConnEvent,
        /// The registry's verdict on the QP (`None`: the registry no longer knew the
        /// connection, e.g. it had asked for the teardown itself).
        verdict: Option<Verdict>,
    },
    /// A TGT QP went away with this connection on it: DREQ (established) or REJ (setup).
    Teardown {
        /// The connection.
        conn: ConnId,
        /// Its TGT QP.
        qpn: Qpn,
        /// Why the QP went away.
        cause: GoneCause,
        /// Whether the connection was established (DREQ) or not (REJ).
        established: bool,
    },
    /// The processes registered on a TGT QP must be told it is gone.
    HoldersNotified {
        /// The QP.
        qpn: Qpn,
        /// Why.
        cause: GoneCause,
    },
    /// A TGT QP is kept but has no owner any more.
    Orphaned {
        /// The QP.
        qpn: Qpn,
    },
}

/// Counters of an [`XrcTarget`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TargetStats {
    /// REQs accepted onto a newly created TGT QP.
    pub created: u64,
    /// REQs accepted onto an existing TGT QP.
    pub attached: u64,
    /// REQs rejected with a [`TargetGone`] block.
    pub rejected: u64,
    /// Teardowns of established connections (DREQs).
    pub dreqs: u64,
    /// Teardowns of connections still being set up (REJs).
    pub rejs: u64,
}

/// Called with each [`TargetEvent`] as it happens.
pub type TargetObserver = Box<dyn FnMut(Instant, TargetEvent) + Send>;

/// Called with each entry of the registry's trace ([`TgtRegistry::poll_trace`]) at every
/// [`XrcTarget::flush`].
pub type TraceObserver = Box<dyn FnMut(TraceEntry<ConnId>) + Send>;

/// What an [`XrcTarget`] asks its admission hook ([`XrcTarget::set_admission`]) before it
/// decides an XRC REQ for a service it serves.
#[derive(Debug)]
pub struct AdmissionQuery<'a> {
    /// The service the REQ asks for.
    pub service_id: ServiceId,
    /// Who serves it.
    pub service: &'a XrcService,
    /// Whether the REQ would create a TGT QP ([`TgtRegistry::would_create`]); else it
    /// attaches to a live one.
    pub creates: bool,
    /// The registry, to count what the service's process or user holds.
    pub registry: &'a TgtRegistry<ConnId>,
}

/// Decides whether a REQ may be served (quotas on connections and TGT QPs): `Err(why)`
/// refuses it with REJ 3 "no resources" (the [`TargetGone`] block of kind `NoResources`).
pub type TargetAdmission = Box<dyn FnMut(&AdmissionQuery<'_>) -> Result<(), String> + Send>;

/// The passive side of XRC over ibcm: a [`TgtRegistry`] coupled to a CM endpoint (module
/// docs).
pub struct XrcTarget {
    reg: TgtRegistry<ConnId>,
    cfg: XrcTargetConfig,
    services: BTreeMap<ServiceId, XrcService>,
    /// The TGT QPN of each connection this target answered with a QP, from its decision until
    /// the connection closes. Not a copy of [`Endpoint::local_qpn`]: it is made before
    /// `ep.accept`, which may fail (`accept_failed` still needs the QPN to unbind it); it
    /// outlives the endpoint's record (a REJ received in REP_SENT removes the connection
    /// before its `Closed` reaches the target, which must still release the QP's binding); and
    /// it tells this target's connections from the endpoint's others ([`XrcTarget::conn_qpn`],
    /// [`XrcTarget::conns_on`] need no endpoint). While both have it, they agree. Everything
    /// else — established or not, its TimeWait — is asked of the endpoint.
    tgt_qpns: BTreeMap<ConnId, Qpn>,
    psns: BTreeMap<Qpn, Psn>,
    /// Registry actions not yet executed on the endpoint (see [`XrcTarget::flush`]).
    pending: VecDeque<PolicyAction<ConnId>>,
    events: VecDeque<TargetEvent>,
    observer: Option<TargetObserver>,
    trace_observer: Option<TraceObserver>,
    admission: Option<TargetAdmission>,
    stats: TargetStats,
}

impl fmt::Debug for XrcTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("XrcTarget")
            .field("registry", &self.reg)
            .field("services", &self.services.len())
            .field("conns", &self.tgt_qpns.len())
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

impl XrcTarget {
    /// A target deciding through `registry`.
    pub fn new(registry: TgtRegistry<ConnId>, cfg: XrcTargetConfig) -> Self {
        Self {
            reg: registry,
            cfg,
            services: BTreeMap::new(),
            tgt_qpns: BTreeMap::new(),
            psns: BTreeMap::new(),
            pending: VecDeque::new(),
            events: VecDeque::new(),
            observer: None,
            trace_observer: None,
            admission: None,
            stats: TargetStats::default(),
        }
    }

    /// The registry.
    pub fn registry(&self) -> &TgtRegistry<ConnId> {
        &self.reg
    }

    /// The registry, to destroy, unregister, report process exits, close domains… The
    /// actions this causes are executed by the next [`XrcTarget::flush`] (which the simulator
    /// and the driver call after every input, `App::poll`).
    pub fn registry_mut(&mut self) -> &mut TgtRegistry<ConnId> {
        &mut self.reg
    }

    /// The configuration.
    pub fn config(&self) -> &XrcTargetConfig {
        &self.cfg
    }

    /// Counters.
    pub fn stats(&self) -> TargetStats {
        self.stats
    }

    /// Answers XRC REQs for `service_id` as `service`. Returns the previous service.
    pub fn serve(&mut self, service_id: ServiceId, service: XrcService) -> Option<XrcService> {
        self.services.insert(service_id, service)
    }

    /// Stops answering `service_id`.
    pub fn unserve(&mut self, service_id: ServiceId) -> Option<XrcService> {
        self.services.remove(&service_id)
    }

    /// The service for `service_id`.
    pub fn service(&self, service_id: ServiceId) -> Option<&XrcService> {
        self.services.get(&service_id)
    }

    /// [`XrcTarget::serve`] plus `ep.listen` for XRC REQs only (other transports get REJ 28
    /// from the endpoint).
    pub fn listen(&mut self, ep: &mut Endpoint, service_id: ServiceId, service: XrcService) {
        ep.listen(
            service_id,
            ListenOptions {
                transports: vec![ReqTransport::Xrc],
            },
        );
        self.serve(service_id, service);
    }

    /// [`TgtRegistry::leaks_with`] against `ep`: live TGT QPs with no owner, no
    /// registration and no connection that `ep` and this target still know. A QP held only
    /// by a binding the endpoint has forgotten (a phantom connection) is reported.
    pub fn leaks(&self, ep: &Endpoint) -> Vec<crate::registry::Leak> {
        self.reg.leaks_with(|c| self.conn_known(ep, *c))
    }

    /// Registry bindings that `ep` and this target no longer know (always empty unless a
    /// close was lost): [`TgtRegistry::stale_conns`].
    pub fn stale_conns(&self, ep: &Endpoint) -> Vec<(ConnId, Qpn)> {
        self.reg.stale_conns(|c| self.conn_known(ep, *c))
    }

    fn conn_known(&self, ep: &Endpoint, c: ConnId) -> bool {
        self.tgt_qpns.contains_key(&c) && ep.state(c).is_some()
    }

    /// The TGT QP of a connection this target accepted (until it closes).
    pub fn conn_qpn(&self, conn: ConnId) -> Option<Qpn> {
        self.tgt_qpns.get(&conn).copied()
    }

    /// The open connections on `qpn`, as this target knows them.
    pub fn conns_on(&self, qpn: Qpn) -> Vec<ConnId> {
        self.tgt_qpns
            .iter()
            .filter(|(_, q)| **q == qpn)
            .map(|(&k, _)| k)
            .collect()
    }

    /// Hands every [`TargetEvent`] to `f` as it happens (at the end of each
    /// [`XrcTarget::flush`]), instead of leaving them for [`XrcTarget::poll_event`].
    pub fn set_observer(&mut self, f: TargetObserver) {
        self.observer = Some(f);
    }

    /// Hands the registry's trace to `f` at the end of each [`XrcTarget::flush`] (everything
    /// the registry did since, releases with their verdicts included), instead of leaving it
    /// in the registry for [`TgtRegistry::poll_trace`].
    pub fn set_trace_observer(&mut self, f: TraceObserver) {
        self.trace_observer = Some(f);
    }

    /// Asks `f` before deciding each XRC REQ for a served service (quotas); a refusal is
    /// answered with REJ 3 "no resources" and reported as [`TargetEvent::Rejected`].
    pub fn set_admission(&mut self, f: TargetAdmission) {
        self.admission = Some(f);
    }

    /// The next [`TargetEvent`] (those of the last [`XrcTarget::flush`] and before; none
    /// when an observer is set).
    pub fn poll_event(&mut self) -> Option<TargetEvent> {
        self.events.pop_front()
    }

    /// When [`XrcTarget::handle_timeout`] must next be called (quarantines ending).
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.reg.poll_timeout()
    }

    /// Ends the quarantines due at `now`.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.reg.handle_timeout(now);
        let reg = &self.reg;
        self.psns.retain(|q, _| reg.query(*q).is_ok());
    }
}
