//! The coupling with ibcm (feature `cm`, default): [`XrcTarget`] answers XRC REQs from a
//! [`TgtRegistry`] and turns every end of a TGT QP into DREQs; [`XrcInitiator`] and
//! [`IniOutcome`] are the initiator's side.
//!
//! # Passive (TGT) side: [`XrcTarget`]
//!
//! [`XrcTarget`] owns a [`TgtRegistry<ConnId>`](TgtRegistry) and is driven **next to** an
//! `ibcm::proto::Endpoint`, sans-IO like both of them. It is an application of the endpoint:
//! it sees the endpoint's events and calls its commands.
//!
//! | endpoint event / registry output | what `XrcTarget` does |
//! |---|---|
//! | `ReqReceived` for a service registered with [`XrcTarget::serve`], transport XRC | [`XrcReqData`] from the private data (absent or foreign → mode "any", the registry's default policy); [`TgtRegistry::handle_req`]; a QP found in RESET is brought to RTR towards the REQ's INI QP; then `Endpoint::accept` with [`AcceptParams::xrc_tgt`] (the TGT QPN in the REP's Local EECN, SRQ = 1, initiator depth and flow control 0) and [`XrcRepData`] (the SRQNs) as private data — or `Endpoint::reject` with reason 1 "No QP available" and the [`TargetGone`] block as ARI and private data |
//! | `Established` | [`ConnEvent::Established`] |
//! | `Closed(Disconnected { by_peer: true })` | [`ConnEvent::PeerDreq`]: the QP is left to its policy |
//! | `Closed(TimedOut \| Rejected \| Stale)` | [`ConnEvent::PeerTimeout`] |
//! | any other `Closed` | [`ConnEvent::LocalClosed`] |
//! | `Closed` of a connection in TimeWait | also [`TgtRegistry::note_timewait`] with the endpoint's quarantine end for the TGT QPN (`Endpoint::qpn_quarantined`), so no new TGT QP gets that number before the CM's TimeWait is over |
//! | [`PolicyAction::EndConnection`] | a [`Teardown`]: `Endpoint::disconnect` (a DREQ whose private data is the [`TargetGone`] block) when established, `Endpoint::reject` (reason 1 + the block) while the REP is still unanswered |
//! | [`PolicyAction::NotifyHolders`], [`PolicyAction::ReportOrphan`] | a [`TargetEvent`] for the application or keeper |
//! | registry quarantine timers | merged into [`XrcTarget::poll_timeout_with`] |
//!
//! A REQ attaching to a **live** TGT QP is accepted with
//! [`AcceptParams::xrc_tgt_live`](ibcm::proto::AcceptParams::xrc_tgt_live): a connection of the
//! same QP in TimeWait does not block it (the QP is shared, not reused). The numbers of *gone*
//! TGT QPs are kept out of use by the registry's quarantine instead, which is at least as long
//! as the CM's TimeWait (the quarantine covers the longest TimeWait of the QP's connections,
//! and every TimeWait the endpoint reports afterwards is noted). A newly created QP is
//! accepted without the flag, so the endpoint's own quarantine (e.g. of an RC connection on
//! the same device) still applies to it.
//!
//! Driving it by hand:
//!
//! ```
//! use std::time::Instant;
//! use ibcm::proto::{ConnectParams, Endpoint, EndpointConfig, EventKind};
//! use ibcm_mad::{Guid, Qpn, ServiceId};
//! use ibcm_xrc::cm::{IniOutcome, XrcInitiator, XrcService, XrcTarget, XrcTargetConfig};
//! use ibcm_xrc::verbs::model::{ModelConfig, KernelModel};
//! use ibcm_xrc::{DomainSpec, OwnershipPolicy, RegistryConfig, SrqNum, TgtRegistry, Verbs, XrcReqData};
//!
//! let kernel = KernelModel::new(ModelConfig::mlx5());
//! let mut reg = TgtRegistry::new(Box::new(kernel.spawn()), RegistryConfig::default());
//! let dom = reg.open_domain("job", DomainSpec::Private).unwrap();
//! let worker = kernel.spawn().process();
//! let mut target = XrcTarget::new(reg, XrcTargetConfig::default());
//! let (mut t_ep, mut i_ep) = (
//!     Endpoint::new(EndpointConfig { local_ca_guid: Guid(2), ..EndpointConfig::default() }),
//!     Endpoint::new(EndpointConfig::default()),
//! );
//! let sid = ServiceId(0x1000);
//! let srqn = SrqNum::new(0x10).unwrap();
//! target.listen(&mut t_ep, sid, XrcService::new(dom, worker, vec![srqn]));
//!
//! let (t_addr, i_addr) = ("127.0.0.2:4791".parse::<std::net::SocketAddr>().unwrap().into(),
//!                         "127.0.0.1:4791".parse::<std::net::SocketAddr>().unwrap().into());
//! let now = Instant::now();
//! let mut ini = XrcInitiator::new();
//! let data = XrcReqData::create(Some(OwnershipPolicy::ProcessBound));
//! let conn = ini.connect(&mut i_ep, now, t_addr, sid, Qpn::new(0x99).unwrap(), &data, &[]).unwrap();
//! // A toy network: deliver everything, hand every event to its application.
//! for _ in 0..4 {
//!     while let Some(t) = i_ep.poll_transmit() { t_ep.handle_datagram(now, i_addr, &t.mad); }
//!     while let Some(ev) = t_ep.poll_event() { target.handle_event(&mut t_ep, now, &ev); }
//!     while let Some(t) = t_ep.poll_transmit() { i_ep.handle_datagram(now, t_addr, &t.mad); }
//!     while let Some(ev) = i_ep.poll_event() { ini.handle_event(&mut i_ep, now, &ev); }
//! }
//! let rep = ini.rep(conn).unwrap();
//! assert_eq!(rep.srqns(), vec![srqn]);
//! // The worker exits: its ProcessBound QP goes, the connection gets a DREQ.
//! target.registry_mut().process_exit(now, worker);
//! assert_eq!(target.flush(&mut t_ep, now), 1);
//! while let Some(t) = t_ep.poll_transmit() { i_ep.handle_datagram(now, t_addr, &t.mad); }
//! while let Some(ev) = i_ep.poll_event() { ini.handle_event(&mut i_ep, now, &ev); }
//! assert!(matches!(ini.outcome(conn), Some(IniOutcome::TargetGone { .. })));
//! ```
//!
//! With ibcm's simulator use [`sim::SimTarget`]; with ibcm's tokio runtime
//! ([`ibcm::rt::Cm`]) use [`rt::XrcServer`], an XRC-aware accept loop on an
//! [`ibcm::rt::Listener`].
//!
//! # Initiator side
//!
//! [`xrc_connect_params`] builds an XRC REQ carrying [`XrcReqData`] (and `auto_rtu` off, so
//! the REP's SRQNs can be read: [`IniRep::from_rep_info`]). [`IniOutcome::from_close`] sorts
//! how a connection ended: **target gone** (REJ reason 1 whose ARI — or private data — is the
//! [`TargetGone`] block of kind 01, or a DREQ carrying that block: drop the cached TGT QPN and
//! connect anew), **refused** (any other REJ), or a plain disconnect or failure.
//! [`XrcInitiator`] does all of that for the connections of one endpoint.

pub mod rt;
pub mod sim;

use std::collections::{BTreeMap, VecDeque};
use std::fmt;
use std::time::{Duration, Instant};

use ibcm::proto::{
    AcceptParams, CallError, ConnId, ConnectError, ConnectParams, ConnectionError, Endpoint,
    EndpointConfig, Event, EventKind, IncomingRequest, ListenOptions, PeerAddr, RepInfo, State,
};
use ibcm_mad::{Psn, Qpn, RejReason, ReqTransport, ServiceId};

use crate::policy::{OwnershipPolicy, PolicyAction, Verdict};
use crate::registry::{ConnEvent, DomainId, IniPeer, TgtRegistry, TgtRequest};
use crate::types::{ProcessId, SrqNum};
use crate::verbs::qp::{AccessFlags, AddressVector, GlobalRoute, PathMtu, QpAttr, QpState};
use ibcm_mad::xrc::{
    GoneCause, RejectKind, ReqMode, TargetGone, XrcDataError, XrcRepData, XrcReqData,
};

// --- passive side --------------------------------------------------------------------------

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

impl TargetEvent {
    fn conn_mut(&mut self) -> Option<&mut ConnId> {
        match self {
            Self::Accepted { conn, .. }
            | Self::Rejected { conn, .. }
            | Self::AcceptFailed { conn, .. }
            | Self::Established { conn, .. }
            | Self::Closed { conn, .. }
            | Self::Teardown { conn, .. } => Some(conn),
            Self::HoldersNotified { .. } | Self::Orphaned { .. } => None,
        }
    }
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

#[derive(Clone, Copy, Debug)]
struct TgtConn {
    qpn: Qpn,
    established: bool,
    timewait: Duration,
}

/// The passive side of XRC over ibcm: a [`TgtRegistry`] coupled to a CM endpoint (module
/// docs).
pub struct XrcTarget {
    reg: TgtRegistry<ConnId>,
    cfg: XrcTargetConfig,
    services: BTreeMap<ServiceId, XrcService>,
    conns: BTreeMap<ConnId, TgtConn>,
    psns: BTreeMap<Qpn, Psn>,
    teardowns: VecDeque<Teardown>,
    events: VecDeque<TargetEvent>,
    stats: TargetStats,
}

impl fmt::Debug for XrcTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("XrcTarget")
            .field("registry", &self.reg)
            .field("services", &self.services.len())
            .field("conns", &self.conns.len())
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
            conns: BTreeMap::new(),
            psns: BTreeMap::new(),
            teardowns: VecDeque::new(),
            events: VecDeque::new(),
            stats: TargetStats::default(),
        }
    }

    /// The registry.
    pub fn registry(&self) -> &TgtRegistry<ConnId> {
        &self.reg
    }

    /// The registry, to destroy, unregister, report process exits, close domains… The
    /// actions this causes are picked up by the next [`XrcTarget::poll_teardown`] /
    /// [`XrcTarget::flush`] / [`XrcTarget::poll_event`].
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
        self.conns.get(&conn).map(|c| c.qpn)
    }

    /// Whether the target saw the connection established.
    pub fn is_established(&self, conn: ConnId) -> bool {
        self.conns.get(&conn).is_some_and(|c| c.established)
    }

    /// The open connections on `qpn`, as this target knows them.
    pub fn conns_on(&self, qpn: Qpn) -> Vec<ConnId> {
        self.conns
            .iter()
            .filter(|(_, c)| c.qpn == qpn)
            .map(|(&k, _)| k)
            .collect()
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
        self.conns.insert(
            conn,
            TgtConn {
                qpn,
                established: false,
                timewait,
            },
        );
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
    pub fn accept_failed(&mut self, now: Instant, conn: ConnId, error: CallError) {
        if let Some(c) = self.conns.remove(&conn) {
            self.reg
                .handle_conn_event(now, &conn, ConnEvent::LocalClosed);
            self.events.push_back(TargetEvent::AcceptFailed {
                conn,
                qpn: c.qpn,
                error,
            });
        }
    }

    /// The CM reports `conn` established.
    pub fn on_established(&mut self, now: Instant, conn: ConnId) {
        if let Some(c) = self.conns.get_mut(&conn) {
            c.established = true;
            let qpn = c.qpn;
            self.reg
                .handle_conn_event(now, &conn, ConnEvent::Established);
            self.events
                .push_back(TargetEvent::Established { conn, qpn });
        }
    }

    /// The CM reports `conn` closed with `error`. `timewait_until`: when the CM's TimeWait
    /// quarantine of the TGT QPN ends (`Endpoint::qpn_quarantined`), if the connection
    /// entered TimeWait; it is noted in the registry ([`TgtRegistry::note_timewait`]).
    pub fn on_closed(
        &mut self,
        now: Instant,
        conn: ConnId,
        error: &ConnectionError,
        timewait_until: Option<Instant>,
    ) {
        let Some(c) = self.conns.remove(&conn) else {
            return;
        };
        let event = conn_event_of(error);
        let verdict = self.reg.handle_conn_event(now, &conn, event);
        if let Some(until) = timewait_until {
            self.reg.note_timewait(c.qpn, until);
        }
        self.events.push_back(TargetEvent::Closed {
            conn,
            qpn: c.qpn,
            event,
            verdict,
        });
    }

    /// The TimeWait a connection was accepted with (for callers that cannot ask the endpoint
    /// when its quarantine ends).
    pub fn timewait_of(&self, conn: ConnId) -> Option<Duration> {
        self.conns.get(&conn).map(|c| c.timewait)
    }

    /// Renames a connection (see [`TgtRegistry::rekey_conn`]): for a CM that gives the
    /// connection its ID only after the REP was sent.
    pub fn rekey(&mut self, old: ConnId, new: ConnId) {
        if let Some(c) = self.conns.remove(&old) {
            self.conns.insert(new, c);
        }
        self.reg.rekey_conn(&old, new);
        for t in &mut self.teardowns {
            if t.conn == old {
                t.conn = new;
            }
        }
        for e in &mut self.events {
            if let Some(c) = e.conn_mut() {
                if *c == old {
                    *c = new;
                }
            }
        }
    }

    /// Queues the teardown of `conn` (its TGT QP went away): a DREQ once established, else a
    /// REJ, counted, and reported as a [`TargetEvent::Teardown`].
    fn teardown(&mut self, conn: ConnId, qpn: Qpn, cause: GoneCause) {
        let established = self.is_established(conn);
        if established {
            self.stats.dreqs = self.stats.dreqs.saturating_add(1);
        } else {
            self.stats.rejs = self.stats.rejs.saturating_add(1);
        }
        self.teardowns.push_back(Teardown { conn, qpn, cause });
        self.events.push_back(TargetEvent::Teardown {
            conn,
            qpn,
            cause,
            established,
        });
    }

    fn pump(&mut self) {
        while let Some(a) = self.reg.poll_action() {
            match a {
                PolicyAction::EndConnection { conn, qpn, cause } => self.teardown(conn, qpn, cause),
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
    }

    /// The next connection to tear down (a TGT QP went away under it).
    pub fn poll_teardown(&mut self) -> Option<Teardown> {
        self.pump();
        self.teardowns.pop_front()
    }

    /// The next [`TargetEvent`].
    pub fn poll_event(&mut self) -> Option<TargetEvent> {
        self.pump();
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
        self.pump();
        let old = std::mem::replace(&mut self.reg, restarted);
        for a in old.crash(now) {
            match a {
                PolicyAction::QuarantineQpn { qpn, until } => {
                    self.reg.note_gone(qpn, GoneCause::KeeperLost, until);
                }
                PolicyAction::EndConnection { conn, qpn, cause } => self.teardown(conn, qpn, cause),
                PolicyAction::NotifyHolders { qpn, cause } => {
                    self.events
                        .push_back(TargetEvent::HoldersNotified { qpn, cause });
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
                let known = self.conns.contains_key(&conn);
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

    /// Executes every pending [`Teardown`] on `ep`; returns how many DREQs or REJs went out.
    pub fn flush(&mut self, ep: &mut Endpoint, now: Instant) -> usize {
        let mut n = 0usize;
        while let Some(t) = self.poll_teardown() {
            if matches!(
                t.execute(ep, now, self.cfg.dreq_reason),
                Ok(TeardownKind::Dreq | TeardownKind::Rej)
            ) {
                n = n.saturating_add(1);
            }
        }
        n
    }

    /// The earlier of the endpoint's and the registry's next deadline.
    pub fn poll_timeout_with(&self, ep: &Endpoint) -> Option<Instant> {
        [ep.poll_timeout(), self.poll_timeout()]
            .into_iter()
            .flatten()
            .min()
    }

    /// Fires the endpoint's and the registry's timers due at `now` and executes the
    /// teardowns that follow. The endpoint's events are left for the caller, who passes each
    /// to [`XrcTarget::handle_event`].
    pub fn handle_timeout_with(&mut self, ep: &mut Endpoint, now: Instant) {
        ep.handle_timeout(now);
        self.handle_timeout(now);
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

// --- initiator side ------------------------------------------------------------------------

/// Parameters for an XRC REQ from INI QP `ini_qpn`: transport XRC, [`XrcReqData`] followed by
/// `app` as private data, the INI QP shareable by several connections
/// (`allow_shared_qpn`), responder resources 0 and `auto_rtu` off (handle
/// `EventKind::RepReceived` — [`IniRep::from_rep_info`] — then `Endpoint::establish`).
///
/// # Errors
/// [`XrcDataError::TooLong`] when `app` does not fit.
pub fn xrc_connect_params(
    peer: impl Into<PeerAddr>,
    service_id: ServiceId,
    ini_qpn: Qpn,
    data: &XrcReqData,
    app: &[u8],
) -> Result<ConnectParams, XrcDataError> {
    let mut p = ConnectParams::new(peer, service_id, ini_qpn).xrc();
    p.private_data = data.emit(app, p.max_private_data())?;
    p.allow_shared_qpn = true;
    p.responder_resources = 0;
    p.auto_rtu = false;
    Ok(p)
}

/// What an initiator reads from an XRC REP.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IniRep {
    /// The TGT QPN (the REP's Local EECN).
    pub tgt_qpn: Qpn,
    /// The ibcm XRC private data, if the target sent it.
    pub data: Option<XrcRepData>,
    /// The SRQN `rdma_xserver` style (the first 4 bytes), when `data` is absent.
    pub compat_srqn: Option<SrqNum>,
}

impl IniRep {
    /// Reads a REP as delivered with `EventKind::RepReceived`.
    pub fn from_rep_info(rep: &RepInfo) -> Self {
        let pd = rep.rep.private_data.as_bytes();
        Self {
            tgt_qpn: rep.remote_qpn,
            data: XrcRepData::parse(pd).ok().map(|(d, _)| d),
            compat_srqn: XrcRepData::first_srqn_compat(pd),
        }
    }

    /// The SRQNs to send to.
    pub fn srqns(&self) -> Vec<SrqNum> {
        match &self.data {
            Some(d) => d.srqns.clone(),
            None => self.compat_srqn.into_iter().collect(),
        }
    }
}

/// How the initiator learned that its TGT QP is gone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GoneSignal {
    /// A REJ reason 1 with the block (a REQ named a gone QP, or the QP went during setup).
    Rej,
    /// A DREQ from the target with the block in its private data.
    Dreq,
}

/// How an XRC connection ended, as the initiator sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum IniOutcome {
    /// The TGT QP is gone: drop the cached TGT QPN and connect anew (mode any/create).
    TargetGone {
        /// Why it went.
        cause: GoneCause,
        /// The QP named.
        qpn: Option<Qpn>,
        /// REJ or DREQ.
        by: GoneSignal,
    },
    /// Any other REJ: the target refused.
    Refused {
        /// The REJ reason.
        reason: RejReason,
        /// The XRC block, if the REJ carried one (attach refused, no resources).
        info: Option<TargetGone>,
    },
    /// Disconnected without target-gone information.
    Disconnected {
        /// Whether the target sent the DREQ.
        by_peer: bool,
    },
    /// Anything else (timeouts, stale, local aborts).
    Failed(ConnectionError),
}

/// [`TargetGone::parse`] tolerant of the CM's trimming of trailing zero bytes.
fn block_of(b: &[u8]) -> Option<TargetGone> {
    let mut buf = [0u8; TargetGone::LEN];
    let n = b.len().min(TargetGone::LEN);
    buf.get_mut(..n)?.copy_from_slice(b.get(..n)?);
    TargetGone::parse(&buf)
}

impl IniOutcome {
    /// Sorts a REJ: reason 1 whose ARI (or, for rdma_cm peers, private data) is a
    /// [`TargetGone`] block of kind 01 is "target gone"; everything else is "refused".
    pub fn from_rej(reason: RejReason, ari: &[u8], private_data: &[u8]) -> Self {
        let info = block_of(ari).or_else(|| block_of(private_data));
        match info {
            Some(TargetGone {
                kind: RejectKind::Gone(cause),
                qpn,
            }) if reason == RejReason::NoQp => Self::TargetGone {
                cause,
                qpn,
                by: GoneSignal::Rej,
            },
            info => Self::Refused { reason, info },
        }
    }

    /// Sorts any close.
    pub fn from_close(error: &ConnectionError) -> Self {
        match error {
            ConnectionError::Rejected {
                reason,
                ari,
                private_data,
            } => Self::from_rej(*reason, ari, private_data),
            ConnectionError::Disconnected {
                by_peer,
                private_data,
            } => match block_of(private_data) {
                Some(TargetGone {
                    kind: RejectKind::Gone(cause),
                    qpn,
                }) if *by_peer => Self::TargetGone {
                    cause,
                    qpn,
                    by: GoneSignal::Dreq,
                },
                _ => Self::Disconnected { by_peer: *by_peer },
            },
            other => Self::Failed(other.clone()),
        }
    }

    /// Whether the TGT QP is gone.
    pub fn is_target_gone(&self) -> bool {
        matches!(self, Self::TargetGone { .. })
    }
}

impl fmt::Display for IniOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::TargetGone { cause, qpn, by } => {
                let by = match by {
                    GoneSignal::Rej => "REJ",
                    GoneSignal::Dreq => "DREQ",
                };
                write!(f, "target gone ({cause})")?;
                if let Some(q) = qpn {
                    write!(f, " qpn {q}")?;
                }
                write!(f, " [{by}]")
            }
            Self::Refused { reason, info } => {
                write!(f, "refused: REJ {} ({reason})", reason.raw())?;
                if let Some(i) = info {
                    write!(f, ", {i}")?;
                }
                Ok(())
            }
            Self::Disconnected { by_peer: true } => f.write_str("disconnected by the target"),
            Self::Disconnected { by_peer: false } => f.write_str("disconnected"),
            Self::Failed(e) => write!(f, "failed: {e}"),
        }
    }
}

/// The state of one initiator connection in an [`XrcInitiator`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum IniState {
    /// REQ sent.
    Connecting,
    /// Established on this TGT QP.
    Established(IniRep),
    /// Closed.
    Closed {
        /// The REP, if one arrived.
        rep: Option<IniRep>,
        /// How it ended.
        outcome: IniOutcome,
    },
}

/// Something an [`XrcInitiator`] saw.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum IniEvent {
    /// The REP arrived (the RTU went out unless held).
    Rep {
        /// The connection.
        conn: ConnId,
        /// What it said.
        rep: IniRep,
    },
    /// Established.
    Established {
        /// The connection.
        conn: ConnId,
    },
    /// Closed.
    Closed {
        /// The connection.
        conn: ConnId,
        /// How.
        outcome: IniOutcome,
    },
}

/// The initiator side of XRC over ibcm: XRC REQs with [`XrcReqData`], REPs read for the TGT
/// QPN and SRQNs, closes sorted into [`IniOutcome`]. Sans-IO; an application of one
/// endpoint (feed it every event with [`XrcInitiator::handle_event`]).
#[derive(Debug, Default)]
pub struct XrcInitiator {
    conns: BTreeMap<ConnId, IniState>,
    hold_rtu: BTreeMap<ConnId, bool>,
    events: VecDeque<IniEvent>,
}

impl XrcInitiator {
    /// An initiator with no connections.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sends an XRC REQ ([`xrc_connect_params`]).
    ///
    /// # Errors
    /// The endpoint's [`ConnectError`]; private data that does not fit is reported as
    /// [`ConnectError::PrivateDataTooLong`].
    #[allow(clippy::too_many_arguments)]
    pub fn connect(
        &mut self,
        ep: &mut Endpoint,
        now: Instant,
        peer: impl Into<PeerAddr>,
        service_id: ServiceId,
        ini_qpn: Qpn,
        data: &XrcReqData,
        app: &[u8],
    ) -> Result<ConnId, ConnectError> {
        let p = xrc_connect_params(peer, service_id, ini_qpn, data, app).map_err(|_| {
            ConnectError::PrivateDataTooLong {
                len: XrcReqData::LEN.saturating_add(app.len()),
                max: ibcm_mad::Req::PRIVATE_DATA_LEN,
            }
        })?;
        self.connect_with(ep, now, p)
    }

    /// Sends a REQ with parameters made by [`xrc_connect_params`] (and adjusted).
    ///
    /// # Errors
    /// The endpoint's [`ConnectError`].
    pub fn connect_with(
        &mut self,
        ep: &mut Endpoint,
        now: Instant,
        mut params: ConnectParams,
    ) -> Result<ConnId, ConnectError> {
        params.auto_rtu = false;
        let id = ep.connect(now, params)?;
        self.conns.insert(id, IniState::Connecting);
        Ok(id)
    }

    /// Do not send the RTU for `conn` when its REP arrives (tests: a peer that never
    /// completes the handshake).
    pub fn hold_rtu(&mut self, conn: ConnId) {
        self.hold_rtu.insert(conn, true);
    }

    /// Feeds one event of the endpoint; returns whether it concerned a connection of this
    /// initiator.
    pub fn handle_event(&mut self, ep: &mut Endpoint, now: Instant, ev: &Event) -> bool {
        let conn = ev.conn;
        let Some(state) = self.conns.get_mut(&conn) else {
            return false;
        };
        match &ev.kind {
            EventKind::RepReceived(info) => {
                let rep = IniRep::from_rep_info(info);
                *state = IniState::Established(rep.clone());
                self.events.push_back(IniEvent::Rep { conn, rep });
                if !self.hold_rtu.contains_key(&conn) {
                    let _ = ep.establish(now, conn, &[]);
                }
            }
            EventKind::Established => {
                if let IniState::Connecting = state {
                    let rep = IniRep {
                        tgt_qpn: ep.remote_qpn(conn).unwrap_or_default(),
                        data: None,
                        compat_srqn: None,
                    };
                    *state = IniState::Established(rep);
                }
                self.events.push_back(IniEvent::Established { conn });
            }
            EventKind::Closed(e) => {
                let outcome = IniOutcome::from_close(e);
                let rep = match std::mem::replace(state, IniState::Connecting) {
                    IniState::Established(r) => Some(r),
                    IniState::Closed { rep, .. } => rep,
                    IniState::Connecting => None,
                };
                *state = IniState::Closed {
                    rep,
                    outcome: outcome.clone(),
                };
                self.hold_rtu.remove(&conn);
                self.events.push_back(IniEvent::Closed { conn, outcome });
            }
            _ => {}
        }
        true
    }

    /// A connection's state.
    pub fn state(&self, conn: ConnId) -> Option<&IniState> {
        self.conns.get(&conn)
    }

    /// The REP of a connection (once it arrived; kept after the close).
    pub fn rep(&self, conn: ConnId) -> Option<&IniRep> {
        match self.conns.get(&conn)? {
            IniState::Established(r) => Some(r),
            IniState::Closed { rep, .. } => rep.as_ref(),
            IniState::Connecting => None,
        }
    }

    /// How a connection ended, once it did.
    pub fn outcome(&self, conn: ConnId) -> Option<&IniOutcome> {
        match self.conns.get(&conn)? {
            IniState::Closed { outcome, .. } => Some(outcome),
            _ => None,
        }
    }

    /// Whether `conn` is established.
    pub fn is_established(&self, conn: ConnId) -> bool {
        matches!(self.conns.get(&conn), Some(IniState::Established(_)))
    }

    /// Forgets closed connections.
    pub fn forget_closed(&mut self) {
        self.conns
            .retain(|_, s| !matches!(s, IniState::Closed { .. }));
    }

    /// The next event.
    pub fn poll_event(&mut self) -> Option<IniEvent> {
        self.events.pop_front()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn qpn(n: u32) -> Qpn {
        Qpn::new(n).unwrap()
    }

    #[test]
    fn rej_with_the_block_is_target_gone_even_trimmed() {
        let b = TargetGone::gone(GoneCause::DomainClosed, qpn(0x4800)).to_bytes();
        let want = IniOutcome::TargetGone {
            cause: GoneCause::DomainClosed,
            qpn: Some(qpn(0x4800)),
            by: GoneSignal::Rej,
        };
        assert_eq!(IniOutcome::from_rej(RejReason::NoQp, &b, &b), want);
        // rdma_cm peers see no ARI; the CM trims trailing zeros of the private data.
        let trimmed = b.get(..10).unwrap();
        assert_eq!(IniOutcome::from_rej(RejReason::NoQp, &[], trimmed), want);
    }

    #[test]
    fn other_rejs_are_refusals() {
        let gone = TargetGone::gone(GoneCause::OwnerDestroyed, qpn(0x48)).to_bytes();
        // The block with another reason is not "gone".
        assert!(matches!(
            IniOutcome::from_rej(RejReason::ConsumerReject, &gone, &[]),
            IniOutcome::Refused {
                reason: RejReason::ConsumerReject,
                info: Some(_)
            }
        ));
        let refused = TargetGone {
            kind: RejectKind::AttachRefused,
            qpn: Some(qpn(0x48)),
        };
        assert!(matches!(
            IniOutcome::from_rej(refused.reason(), &refused.to_bytes(), &[]),
            IniOutcome::Refused {
                info: Some(TargetGone {
                    kind: RejectKind::AttachRefused,
                    ..
                }),
                ..
            }
        ));
        // Foreign bytes, empty, garbage: never a panic, always "refused".
        for ari in [
            &[][..],
            &[0x58, 0x52][..],
            &[0xff; 72][..],
            b"XRC\x01\x01\x09",
        ] {
            assert!(!IniOutcome::from_rej(RejReason::NoQp, ari, ari).is_target_gone());
        }
    }

    #[test]
    fn dreq_with_the_block_is_target_gone() {
        let b = TargetGone::gone(GoneCause::KeeperLost, qpn(0x49)).to_bytes();
        let e = ConnectionError::Disconnected {
            by_peer: true,
            private_data: b.get(..11).unwrap().to_vec(),
        };
        assert_eq!(
            IniOutcome::from_close(&e),
            IniOutcome::TargetGone {
                cause: GoneCause::KeeperLost,
                qpn: Some(qpn(0x49)),
                by: GoneSignal::Dreq
            }
        );
        let plain = ConnectionError::Disconnected {
            by_peer: true,
            private_data: vec![],
        };
        assert_eq!(
            IniOutcome::from_close(&plain),
            IniOutcome::Disconnected { by_peer: true }
        );
        assert_eq!(
            IniOutcome::from_close(&ConnectionError::TimedOut),
            IniOutcome::Failed(ConnectionError::TimedOut)
        );
    }

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

    #[test]
    fn connect_params_are_xrc_ini() {
        let peer: PeerAddr = "127.0.0.2:4791"
            .parse::<std::net::SocketAddr>()
            .unwrap()
            .into();
        let p = xrc_connect_params(
            peer,
            ServiceId(1),
            qpn(0x99),
            &XrcReqData::attach(qpn(0x48)),
            b"app",
        )
        .unwrap();
        assert_eq!(p.transport, ReqTransport::Xrc);
        assert!(p.allow_shared_qpn && !p.auto_rtu);
        let (d, app) = XrcReqData::parse(&p.private_data).unwrap();
        assert_eq!(d.mode, ReqMode::Attach(qpn(0x48)));
        assert_eq!(app, b"app");
        assert!(xrc_connect_params(
            peer,
            ServiceId(1),
            qpn(0x99),
            &XrcReqData::any(None),
            &[0; 90]
        )
        .is_err());
    }
}
