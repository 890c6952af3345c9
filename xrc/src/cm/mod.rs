//! The coupling with ibcm (feature `cm`, default): [`XrcTarget`] answers XRC REQs from a
//! [`TgtRegistry`] and turns every end of a TGT QP into DREQs; [`XrcInitiator`] and
//! [`IniOutcome`] are the initiator's side.
//!
//! # Passive (TGT) side: [`XrcTarget`]
//!
//! [`XrcTarget`] owns a [`TgtRegistry<ConnId>`](TgtRegistry) and is driven **next to** an
//! `ibcm::proto::Endpoint`, sans-IO like both of them. It is an application of the endpoint —
//! an [`ibcm::App`]: it sees the endpoint's events, calls its commands, and has its own timers
//! (the registry's quarantines). The simulator ([`sim::SimTarget`]) and the tokio driver
//! ([`rt::XrcServer`]) run it as the endpoint's app, so both answer every REQ with the
//! connection's real ID, reject a REQ whose TGT QP went away before the RTU, and fire the
//! quarantine timers at their deadlines.
//!
//! | endpoint event / registry output | what `XrcTarget` does |
//! |---|---|
//! | `ReqReceived` for a service registered with [`XrcTarget::serve`], transport XRC | [`XrcReqData`] from the private data (absent or foreign → mode "any", the registry's default policy); [`TgtRegistry::handle_req_with`] with the endpoint's QPN quarantine (`Endpoint::qpn_quarantined`), so a new TGT QP numbered like a connection of the endpoint still in TimeWait is parked and another created; a QP found in RESET is brought to RTR towards the REQ's INI QP; then `Endpoint::accept` with [`AcceptParams::xrc_tgt`] (the TGT QPN in the REP's Local EECN, SRQ = 1, initiator depth and flow control 0) and [`XrcRepData`] (the SRQNs) as private data — or `Endpoint::reject` with reason 1 "No QP available" and the [`TargetGone`] block as ARI and private data |
//! | `Established` | [`ConnEvent::Established`] |
//! | `Closed(Disconnected { by_peer: true })` | [`ConnEvent::PeerDreq`]: the QP is left to its policy |
//! | `Closed(TimedOut \| Rejected \| Stale)` | [`ConnEvent::PeerTimeout`] |
//! | any other `Closed` | [`ConnEvent::LocalClosed`] |
//! | `Closed` of a connection in TimeWait | also [`TgtRegistry::note_timewait`] with the endpoint's quarantine end for the TGT QPN (`Endpoint::qpn_quarantined`), so no new TGT QP gets that number before the CM's TimeWait is over |
//! | [`PolicyAction::EndConnection`] | a [`Teardown`] at the next [`XrcTarget::flush`] (`App::poll`): `Endpoint::disconnect` (a DREQ whose private data is the [`TargetGone`] block) when established, `Endpoint::reject` (reason 1 + the block) while the REP is still unanswered |
//! | [`PolicyAction::NotifyHolders`], [`PolicyAction::ReportOrphan`] | a [`TargetEvent`] for the application or keeper |
//! | registry quarantine timers | `App::poll_timeout` / `App::handle_timeout` |
//!
//! A REQ attaching to a **live** TGT QP is accepted with
//! [`AcceptParams::xrc_tgt_live`](ibcm::proto::AcceptParams::xrc_tgt_live): a connection of the
//! same QP in TimeWait does not block it (the QP is shared, not reused). The numbers of *gone*
//! TGT QPs are kept out of use by the registry's quarantine instead, which is at least as long
//! as the CM's TimeWait (the quarantine covers the longest TimeWait of the QP's connections,
//! and every TimeWait the endpoint reports afterwards is noted). A newly created QP is
//! accepted without the flag, so the endpoint's own quarantine (e.g. of an RC connection on
//! the same device) still applies to it — and the registry never creates one with a number
//! that quarantine holds (the first row).
//!
//! Driving it by hand:
//!
//! ```
//! use std::time::Instant;
//! use ibcm::proto::{ConnectParams, Endpoint, EndpointConfig, EventKind};
//! use ibcm_mad::{Guid, Qpn, ServiceId};
//! use ibcm_xrc::cm::{IniOutcome, XrcInitiator, XrcService, XrcTarget, XrcTargetConfig};
//! use ibcm_xrc::verbs::model::{KernelModel, ModelConfig};
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
//! // The initiator keeps a closed connection's REP and outcome until told to forget them
//! // (a long-running initiator calls this after reading the outcomes it needs).
//! ini.forget_closed();
//! assert!(ini.outcome(conn).is_none() && ini.rep(conn).is_none());
//! ```
//!
//! With ibcm's simulator use [`sim::SimTarget`]; with ibcm's tokio runtime use
//! [`rt::XrcServer`] (an [`ibcm::rt::Cm`] running the target as its app).
//!
//! # Initiator side
//!
//! [`xrc_connect_params`] builds an XRC REQ carrying [`XrcReqData`] (and `auto_rtu` off, so
//! the REP's SRQNs can be read: [`IniRep::from_rep_info`]). [`IniOutcome::from_close`] sorts
//! how a connection ended: **target gone** (REJ reason 1 whose ARI — or private data — is the
//! [`TargetGone`] block of kind 01, or a DREQ carrying that block: drop the cached TGT QPN and
//! connect anew), **refused** (any other REJ), or a plain disconnect or failure.
//! [`XrcInitiator`] does all of that for the connections of one endpoint.

#[cfg(doc)]
use crate::{
    policy::PolicyAction,
    registry::{ConnEvent, TgtRegistry},
    TargetGone, XrcRepData, XrcReqData,
};
#[cfg(doc)]
use ibcm::proto::AcceptParams;

mod initiator;
pub mod rt;
pub mod sim;
mod tgt;

pub use initiator::{
    xrc_connect_params, GoneSignal, IniEvent, IniObserver, IniOutcome, IniRep, IniState,
    XrcInitiator,
};
pub use tgt::{
    conn_event_of, passive_timewait, AdmissionQuery, TargetAdmission, TargetEvent, TargetObserver,
    TargetStats, Teardown, TeardownKind, TgtAnswer, TraceObserver, XrcService, XrcTarget,
    XrcTargetConfig,
};
