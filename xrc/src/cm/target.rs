//! The passive (TGT) side: [`XrcTarget`] (module docs of [`crate::cm`]).

use std::collections::{BTreeMap, VecDeque};
use std::fmt;
use std::time::{Duration, Instant};

use ibcm::proto::{
    AcceptParams, CallError, ConnId, ConnectionError, Endpoint, EndpointConfig, Event, EventKind,
    IncomingRequest, ListenOptions, State,
};
use ibcm_mad::{Psn, Qpn, RejReason, ReqTransport, ServiceId};

use crate::policy::{OwnershipPolicy, PolicyAction, Verdict};
use crate::registry::{ConnEvent, DomainId, IniPeer, TgtRegistry, TgtRequest};
use crate::types::{ProcessId, SrqNum};
use crate::verbs::qp::{AccessFlags, AddressVector, GlobalRoute, PathMtu, QpAttr, QpState};
#[cfg(doc)]
use crate::{cm::IniOutcome, XrcRepData};
use ibcm_mad::xrc::{GoneCause, RejectKind, ReqMode, TargetGone, XrcReqData};

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
}

impl XrcService {
    /// A service of `process` in `domain` announcing `srqns`.
    pub fn new(domain: DomainId, process: ProcessId, srqns: Vec<SrqNum>) -> Self {
        Self {
            domain,
            process,
            srqns,
            rep_app_data: Vec::new(),
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

/// How [`XrcTarget::on_request`] answers an XRC REQ.
#[derive(Clone, Debug)]
pub enum TgtAnswer {
    /// Send a REP with these parameters.
    Accept {
        /// `AcceptParams::xrc_tgt(qpn)` with the REP private data and the starting PSN.
        params: AcceptParams,
        /// The TGT QPN (the REP's Local EECN).
        qpn: Qpn,
        /// Whether the QP was created for this REQ.
        created: bool,
        /// Its policy.
        policy: OwnershipPolicy,
    },
    /// Send a REJ: `reason`, with `info` as ARI and private data.
    Reject {
        /// The REJ reason ([`TargetGone::reason`]).
        reason: RejReason,
        /// The 12-byte block.
        info: TargetGone,
    },
}

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
    /// TimeWait quarantine); the REQ was rejected with reason 3 instead.
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

/// The passive side of XRC over ibcm: a [`TgtRegistry`] coupled to a CM endpoint (module
/// docs).
pub struct XrcTarget {
    reg: TgtRegistry<ConnId>,
    cfg: XrcTargetConfig,
    services: BTreeMap<ServiceId, XrcService>,
    /// The TGT QPN of each accepted connection until it closes (the endpoint knows it as the
    /// connection's local QPN but does not tell). Everything else — established or not, its
    /// TimeWait — is asked of the endpoint.
    tgt_qpns: BTreeMap<ConnId, Qpn>,
    psns: BTreeMap<Qpn, Psn>,
    /// Registry actions not yet executed on the endpoint (see [`XrcTarget::flush`]).
    pending: VecDeque<PolicyAction<ConnId>>,
    events: VecDeque<TargetEvent>,
    observer: Option<TargetObserver>,
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

/// The passive side's TimeWait for a connection set up by `req`, as `Endpoint` computes it
/// (the REQ's primary local ACK timeout, or the configured override, plus the slack).
pub fn passive_timewait(cfg: &EndpointConfig, req: &IncomingRequest) -> Duration {
    cfg.timewait
        .unwrap_or_else(|| req.req.primary_path.local_ack_timeout.to_duration())
        .saturating_add(cfg.timewait_slack)
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

    // --- sans-IO inputs ----------------------------------------------------------------------

    /// Decides on a REQ. `None` if it is not XRC or asks for a service this target does not
    /// serve (the application answers it); else the answer to send — also recorded as a
    /// [`TargetEvent`]. `timewait` is the connection's CM TimeWait ([`passive_timewait`]).
    pub fn on_request(
        &mut self,
        now: Instant,
        conn: ConnId,
        req: &IncomingRequest,
        timewait: Duration,
    ) -> Option<TgtAnswer> {
        if req.transport() != ReqTransport::Xrc {
            return None;
        }
        let service = req.service_id();
        let svc = self.services.get(&service)?.clone();
        let data = XrcReqData::parse(req.user_private_data())
            .map(|(d, _)| d)
            .unwrap_or(XrcReqData {
                mode: ReqMode::Any,
                policy: None,
            });
        let peer = IniPeer {
            ca_guid: req.remote_ca_guid(),
            ini_qpn: req.remote_qpn(),
        };
        let ireq = TgtRequest {
            conn,
            domain: svc.domain,
            process: svc.process,
            peer,
            data,
            timewait,
            srqns: svc.srqns.clone(),
        };
        let acc = match self.reg.handle_req(now, &ireq) {
            Ok(acc) => acc,
            Err(info) => return Some(self.rejected(conn, service, peer, info)),
        };
        let qpn = acc.tgt_qpn;
        let psn = self.bring_up(qpn, conn, req);
        let psn = match psn {
            Ok(psn) => psn,
            Err(()) => {
                // The QP could not be brought up: unbind the connection, refuse the REQ.
                self.reg
                    .handle_conn_event(now, &conn, ConnEvent::LocalClosed);
                let info = TargetGone {
                    kind: RejectKind::NoResources,
                    qpn: Some(qpn),
                };
                return Some(self.rejected(conn, service, peer, info));
            }
        };
        let private_data = acc
            .rep_private_data(&svc.rep_app_data)
            .or_else(|_| acc.rep_private_data(&[]))
            .unwrap_or_default();
        let params = AcceptParams {
            private_data,
            starting_psn: psn,
            initiator_depth: 0,
            flow_control: false,
            xrc_tgt_live: !acc.created,
            ..AcceptParams::xrc_tgt(qpn)
        };
        self.tgt_qpns.insert(conn, qpn);
        if acc.created {
            self.stats.created = self.stats.created.saturating_add(1);
        } else {
            self.stats.attached = self.stats.attached.saturating_add(1);
        }
        self.events.push_back(TargetEvent::Accepted {
            conn,
            service,
            peer,
            qpn,
            created: acc.created,
            policy: acc.policy,
        });
        Some(TgtAnswer::Accept {
            params,
            qpn,
            created: acc.created,
            policy: acc.policy,
        })
    }

    fn rejected(
        &mut self,
        conn: ConnId,
        service: ServiceId,
        peer: IniPeer,
        info: TargetGone,
    ) -> TgtAnswer {
        self.stats.rejected = self.stats.rejected.saturating_add(1);
        self.events.push_back(TargetEvent::Rejected {
            conn,
            service,
            peer,
            info,
        });
        TgtAnswer::Reject {
            reason: info.reason(),
            info,
        }
    }

    /// Brings a QP in RESET to RTR; returns the PSN the REP announces (= the QP's RQ PSN).
    fn bring_up(&mut self, qpn: Qpn, conn: ConnId, req: &IncomingRequest) -> Result<Psn, ()> {
        let psn = *self
            .psns
            .entry(qpn)
            .or_insert_with(|| Psn::masked(conn.0.rotate_left(7)));
        if !self.cfg.bring_up {
            return Ok(psn);
        }
        let state = self.reg.query(qpn).map(|q| q.state).map_err(|_| ())?;
        if state != QpState::Reset {
            return Ok(psn);
        }
        let path = &req.req.primary_path;
        let av = AddressVector {
            dlid: path.local_lid.get(),
            sl: path.sl.get(),
            port: self.cfg.port,
            grh: Some(GlobalRoute {
                dgid: path.local_gid.0,
                flow_label: path.flow_label.get(),
                hop_limit: path.hop_limit,
                traffic_class: path.traffic_class,
                ..GlobalRoute::default()
            }),
            ..AddressVector::default()
        };
        let mtu = PathMtu::from_raw(u32::from(req.req.path_mtu.raw())).unwrap_or(PathMtu::Mtu1024);
        let init = QpAttr::to_init(0, self.cfg.port, self.cfg.access);
        let rtr = QpAttr::tgt_to_rtr(
            av,
            mtu,
            req.remote_qpn(),
            psn,
            req.req.initiator_depth.clamp(1, 16),
            self.cfg.min_rnr_timer,
        );
        self.reg.modify(qpn, &init).map_err(|_| ())?;
        self.reg.modify(qpn, &rtr).map_err(|_| ())?;
        Ok(psn)
    }

    /// The endpoint refused the accept of `conn`: the connection is unbound from its QP.
    fn accept_failed(&mut self, now: Instant, conn: ConnId, error: CallError) {
        if let Some(qpn) = self.tgt_qpns.remove(&conn) {
            self.reg
                .handle_conn_event(now, &conn, ConnEvent::LocalClosed);
            self.events
                .push_back(TargetEvent::AcceptFailed { conn, qpn, error });
        }
    }

    /// The CM reports `conn` established.
    fn on_established(&mut self, now: Instant, conn: ConnId) {
        if let Some(&qpn) = self.tgt_qpns.get(&conn) {
            self.reg
                .handle_conn_event(now, &conn, ConnEvent::Established);
            self.events
                .push_back(TargetEvent::Established { conn, qpn });
        }
    }

    /// The CM reports `conn` closed with `error`. `timewait_until`: when the CM's TimeWait
    /// quarantine of the TGT QPN ends (`Endpoint::qpn_quarantined`), if the connection
    /// entered TimeWait; it is noted in the registry ([`TgtRegistry::note_timewait`]).
    fn on_closed(
        &mut self,
        now: Instant,
        conn: ConnId,
        error: &ConnectionError,
        timewait_until: Option<Instant>,
    ) {
        let Some(qpn) = self.tgt_qpns.remove(&conn) else {
            return;
        };
        let event = conn_event_of(error);
        let verdict = self.reg.handle_conn_event(now, &conn, event);
        if let Some(until) = timewait_until {
            self.reg.note_timewait(qpn, until);
        }
        self.events.push_back(TargetEvent::Closed {
            conn,
            qpn,
            event,
            verdict,
        });
    }

    /// Tears `conn` down on `ep` (its TGT QP went away): a DREQ when established, else a
    /// REJ; counted, and reported as a [`TargetEvent::Teardown`]. Returns what went out.
    fn teardown(
        &mut self,
        ep: &mut Endpoint,
        now: Instant,
        conn: ConnId,
        qpn: Qpn,
        cause: GoneCause,
    ) -> TeardownKind {
        let established = ep.state(conn) == Some(State::Established);
        if established {
            self.stats.dreqs = self.stats.dreqs.saturating_add(1);
        } else {
            self.stats.rejs = self.stats.rejs.saturating_add(1);
        }
        self.events.push_back(TargetEvent::Teardown {
            conn,
            qpn,
            cause,
            established,
        });
        Teardown { conn, qpn, cause }
            .execute(ep, now, self.cfg.dreq_reason)
            .unwrap_or(TeardownKind::Nothing)
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

    // --- endpoint glue -----------------------------------------------------------------------

    /// Feeds one event of `ep` (module docs) and executes what follows on `ep`. Returns
    /// whether the event concerned this target (an XRC REQ for a served service, or a
    /// connection it accepted); other events are the application's.
    pub fn handle_event(&mut self, ep: &mut Endpoint, now: Instant, ev: &Event) -> bool {
        let conn = ev.conn;
        let handled = match &ev.kind {
            EventKind::ReqReceived(req) => {
                let tw = passive_timewait(ep.config(), req);
                match self.on_request(now, conn, req, tw) {
                    Some(answer) => {
                        self.answer(ep, now, conn, answer);
                        true
                    }
                    None => false,
                }
            }
            EventKind::Established => {
                let known = self.tgt_qpns.contains_key(&conn);
                self.on_established(now, conn);
                known
            }
            EventKind::Closed(e) => match self.conn_qpn(conn) {
                Some(qpn) => {
                    let until = ep
                        .state(conn)
                        .filter(|s| *s == State::Timewait)
                        .and_then(|_| ep.qpn_quarantined(qpn, now));
                    self.on_closed(now, conn, e, until);
                    true
                }
                None => false,
            },
            _ => false,
        };
        self.flush(ep, now);
        handled
    }

    /// Sends `answer` for `conn` on `ep` (REP or REJ).
    pub fn answer(&mut self, ep: &mut Endpoint, now: Instant, conn: ConnId, answer: TgtAnswer) {
        match answer {
            TgtAnswer::Accept { params, qpn, .. } => {
                if let Err(e) = ep.accept(now, conn, params) {
                    self.accept_failed(now, conn, e);
                    let info = TargetGone {
                        kind: RejectKind::NoResources,
                        qpn: Some(qpn),
                    };
                    let b = info.to_bytes();
                    let _ = ep.reject(now, conn, info.reason(), &b, &b);
                }
            }
            TgtAnswer::Reject { reason, info } => {
                let b = info.to_bytes();
                let _ = ep.reject(now, conn, reason, &b, &b);
            }
        }
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
        n
    }
}

/// The target as the endpoint's application: events through [`XrcTarget::handle_event`],
/// the registry's actions through [`XrcTarget::flush`], its quarantine timers.
impl ibcm::App for XrcTarget {
    fn handle_event(&mut self, ep: &mut Endpoint, now: Instant, event: &Event) -> bool {
        XrcTarget::handle_event(self, ep, now, event)
    }

    fn poll(&mut self, ep: &mut Endpoint, now: Instant) {
        self.flush(ep, now);
    }

    fn poll_timeout(&self) -> Option<Instant> {
        XrcTarget::poll_timeout(self)
    }

    fn handle_timeout(&mut self, ep: &mut Endpoint, now: Instant) {
        XrcTarget::handle_timeout(self, now);
        self.flush(ep, now);
    }
}

/// How a CM close reads for the registry (module docs).
pub fn conn_event_of(error: &ConnectionError) -> ConnEvent {
    match error {
        ConnectionError::Disconnected { by_peer: true, .. } => ConnEvent::PeerDreq,
        ConnectionError::TimedOut | ConnectionError::Rejected { .. } | ConnectionError::Stale => {
            ConnEvent::PeerTimeout
        }
        _ => ConnEvent::LocalClosed,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn closes_map_to_registry_events() {
        let by_peer = ConnectionError::Disconnected {
            by_peer: true,
            private_data: vec![],
        };
        assert_eq!(conn_event_of(&by_peer), ConnEvent::PeerDreq);
        assert_eq!(
            conn_event_of(&ConnectionError::TimedOut),
            ConnEvent::PeerTimeout
        );
        assert_eq!(
            conn_event_of(&ConnectionError::Stale),
            ConnEvent::PeerTimeout
        );
        assert_eq!(
            conn_event_of(&ConnectionError::DisconnectTimedOut),
            ConnEvent::LocalClosed
        );
    }
}
