//! `ibcm-xrc`: XRC domains and target QPs whose lifetime is a policy the application chooses,
//! kept consistent with the CM connections on them.
//!
//! Modern kernels give one fixed answer to "how long does an XRC TGT QP live" — as long as
//! any process holds a handle (docs/xrc.md §0.1) — and the kernel CM drops a TGT-side
//! connection without a DREQ (§3.2). This crate makes the lifetime an [`OwnershipPolicy`]
//! chosen when the QP is created, and turns every end of a TGT QP into DREQs for the
//! connections on it, a QPN quarantine for the CM TimeWait, and a well-defined REJ for
//! anyone who later asks for the QP.
//!
//! # Contents
//!
//! * [`verbs`]: the verbs layer — the object-safe backend trait [`Verbs`];
//!   [`verbs::model`], a software model of the modern kernel (per-process handles, domains
//!   pinned by TGT QPs and SRQs, process exit, open by number); `RdmaVerbs` (feature `rdma`),
//!   libibverbs through a C shim; [`verbs::qp`], QP states, attributes and the per-type
//!   modify rules (docs/xrc.md §1.6); [`XrcSrq`] and [`IniQp`] helpers on top of a backend.
//! * The policy engine: [`OwnershipPolicy`], [`decide`]`(facts, event) → actions`, and the
//!   [`POLICY_MATRIX`] it reads.
//! * [`TgtRegistry`]: domains, TGT QPs, registrations and CM connections; executes the
//!   engine's decisions and is the **coupling point with the CM** (its docs list the exact
//!   calls).
//! * The REQ/REP private-data formats ([`XrcReqData`], [`XrcRepData`]: SRQ numbers travel
//!   in the REP) and the "target gone" block ([`TargetGone`]: REJ reason 1 + a 12-byte ARI)
//!   are `ibcm_mad::xrc`'s, re-exported here.
//! * `cm` (feature `cm`, default): the coupling with ibcm — [`cm::XrcTarget`] next to an
//!   `ibcm::proto::Endpoint`, [`cm::XrcInitiator`] / [`cm::IniOutcome`] on the initiator,
//!   [`cm::sim`] on ibcm's simulator, [`cm::rt::XrcServer`] on ibcm's tokio runtime.
//! * `keeper` (feature `keeper`, default): the xrcd-keeper daemon and its client.
//!
//! # Coupling with the CM
//!
//! The TGT side of an XRC connection is an [`cm::XrcTarget`] driven next to the node's ibcm
//! endpoint (sans-IO, like the endpoint): an XRC REQ for a served service ID goes to
//! [`TgtRegistry::handle_req`], which creates or opens the TGT QP per policy; the REP carries
//! the TGT QPN in the Local EECN with SRQ = 1 and the accepting process's SRQNs in the
//! private data ([`XrcRepData`]). When the QP goes away — owner destroy, domain close, creator
//! exit, last unregister, last connection left, keeper crash — every connection on it gets a
//! DREQ (REJ reason 1 while still being set up) carrying the [`TargetGone`] block, and the
//! QPN stays quarantined until the CM TimeWait of every such connection has passed. A REQ
//! naming a gone QP gets REJ reason 1 with the [`TargetGone`] ARI, so the initiator tells
//! "target gone" ([`cm::IniOutcome::TargetGone`]) from "refused". A DREQ from the initiator
//! leaves the QP to its policy ([`POLICY_MATRIX`], "peer DREQ"). The calls a CM makes are
//! listed on [`TgtRegistry`]; the event-by-event table for ibcm's endpoint is in [`cm`].
//!
//! # Contract
//!
//! * Deterministic: the engine and the software model read no clock and no randomness; time
//!   is an argument (`now: Instant`), QPNs come from seeded counters.
//! * No input makes it panic: wire parsers return errors; lookups of unknown handles, QPNs or
//!   connections return errors or are ignored.
//! * `unsafe` only in the verbs layer's `ffi` and `rc::sys` modules (feature `rdma`), each
//!   block with a `SAFETY` comment.
//!
//! # The policy × event matrix
//!
//! What each event does to a live TGT QP under each policy is one constant,
//! [`POLICY_MATRIX`] (its docs carry the table and the notes); [`decide`] reads it, and the
//! registry and the CM coupling only execute what `decide` returns.
//!
//! # Example
//!
//! ```
//! use std::time::{Duration, Instant};
//! use ibcm_xrc::verbs::model::{ModelConfig, KernelModel};
//! use ibcm_xrc::{DomainSpec, OwnershipPolicy, PolicyAction, RegistryConfig, TgtRegistry, Verbs};
//!
//! let kernel = KernelModel::new(ModelConfig::mlx5());
//! let keeper = kernel.spawn();
//! let worker = kernel.spawn();
//! let mut reg: TgtRegistry<u32> = TgtRegistry::new(Box::new(keeper), RegistryConfig::default());
//! let now = Instant::now();
//! let dom = reg.open_domain("job42", DomainSpec::file("/tmp/job42.xrcd")).unwrap();
//! let qpn = reg
//!     .create_tgt_qp(now, dom, OwnershipPolicy::ProcessBound, worker.process())
//!     .unwrap();
//! // The worker exits: its ProcessBound QP goes, the QPN is quarantined.
//! reg.process_exit(now, worker.process());
//! assert!(reg.poll_timeout().is_some());
//! reg.handle_timeout(now + Duration::from_secs(5));
//! assert!(!kernel.tgt_qp_exists(qpn));
//! # let _ = PolicyAction::<u32>::ReportOrphan { qpn };
//! ```
#![deny(unsafe_code)]
#![cfg_attr(not(fuzzing), warn(missing_docs))]

#[cfg(feature = "cm")]
pub mod cm;
#[cfg(feature = "keeper")]
pub mod keeper;
mod policy;
mod registry;
mod types;
pub mod verbs;

pub use ibcm_mad::xrc::{
    GoneCause, RejectKind, ReqMode, ServiceFault, TargetGone, XrcDataError, XrcRepData, XrcReqData,
};
pub use policy::{
    decide, rule, ConnOnQp, Decision, MatrixEvent, OwnershipPolicy, PolicyAction, PolicyConfig,
    PolicyEvent, QpFacts, Rule, Verdict, POLICY_MATRIX,
};
pub use registry::{
    ConnEvent, DomainId, DomainState, IniPeer, Leak, QpLife, QpnStatus, Registrant, RegistryConfig,
    RegistryError, TgtQp, TgtRegistry, TgtRequest, TraceEntry, XrcAccept, XrcDomain,
};
pub use types::{DomainSpec, ProcessId, QpHandle, Qpn, SrqHandle, SrqNum, XrcdHandle};
pub use verbs::qp::{QpAttr, QpState, QpType};
#[cfg(feature = "rdma")]
pub use verbs::RdmaVerbs;
pub use verbs::{DeviceInfo, IniQp, IniQpCaps, QpInfo, SrqAttr, Verbs, VerbsError, XrcSrq};
