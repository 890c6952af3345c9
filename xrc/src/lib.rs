//! `ibcm-xrc`: XRC domains and target QPs whose lifetime is a policy the application chooses,
//! kept consistent with the CM connections on them.
//!
//! Modern kernels give one fixed answer to "how long does an XRC TGT QP live" — as long as
//! any process holds a handle (spec/xrc.md §0.1) — and the kernel CM drops a TGT-side
//! connection without a DREQ (§3.2). This crate makes the lifetime an [`OwnershipPolicy`]
//! chosen when the QP is created, and turns every end of a TGT QP into DREQs for the
//! connections on it, a QPN quarantine for the CM TimeWait, and a well-defined REJ for
//! anyone who later asks for the QP.
//!
//! # Contents
//!
//! * [`qp`]: QP states, attributes and the per-type modify rules (spec/xrc.md §1.6).
//! * [`Verbs`]: the object-safe backend trait; [`sim::ModelVerbs`] models the modern kernel
//!   (per-process handles, domains pinned by TGT QPs and SRQs, process exit, open by
//!   number); `RdmaVerbs` (feature `rdma`) drives libibverbs through a C shim.
//! * [`objects`]: [`XrcSrq`] and [`IniQp`] helpers on top of a backend.
//! * [`policy`]: the pure engine, `decide(facts, event) → actions`.
//! * [`TgtRegistry`]: domains, TGT QPs, registrations and CM connections; executes the
//!   engine's decisions and is the **coupling point with the CM** (see its module docs for
//!   the exact calls).
//! * [`wire`]: the REQ/REP private-data formats (SRQ numbers travel in the REP) and the
//!   "target gone" REJ (reason 1 + a 12-byte ARI).
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
//! leaves the QP to its policy (the table below, "peer DREQ"). The exact event-by-event
//! mapping is in [`registry`] ("Coupling with the CM") and [`cm`].
//!
//! # Contract
//!
//! * Deterministic: the engine and the software model read no clock and no randomness; time
//!   is an argument (`now: Instant`), QPNs come from seeded counters.
//! * No input makes it panic: wire parsers return errors; lookups of unknown handles, QPNs or
//!   connections return errors or are ignored.
//! * `unsafe` only in the `ffi` module (feature `rdma`), each block with a `SAFETY` comment.
//!
//! # The policy × event matrix
//!
//! What happens to a **live** TGT QP. "Released" means: every *other* connection on the QP gets
//! a DREQ ([`PolicyAction::EndConnection`]; REJ reason 1 if it is still being set up), registered
//! processes are notified, the QP goes to ERR and its number is quarantined until the longest
//! CM TimeWait of its connections has passed (the QP object is held until then, so the device
//! cannot reuse the number); afterwards a REQ naming it gets REJ reason 1 "No QP available"
//! with the [`TargetGone`] ARI carrying the cause. "Kept" means the QP and its other
//! connections are untouched.
//!
//! | policy \ event | owner destroy | domain close | creator exit | last unregister | peer DREQ | peer timeout | keeper crash |
//! |---|---|---|---|---|---|---|---|
//! | **Explicit** | released (`owner destroyed`) | kept; it **pins** the domain, which closes after the QP is destroyed | kept as an **orphan** (any process may adopt or destroy it; listed by `leaks` when idle) | kept (registrations do not own it) | kept; connection forgotten | kept; connection forgotten | released (`keeper lost`) |
//! | **DomainBound** | released (`owner destroyed`) | released (`domain closed`) | kept (that is the point) | kept | kept; connection forgotten | kept; connection forgotten | released (`keeper lost`) |
//! | **ProcessBound** | released (`owner destroyed`) | released (`domain closed`) | released (`creator exited`) | kept | kept while the creator lives; connection forgotten | kept while the creator lives; connection forgotten | released (`keeper lost`) |
//! | **Shared** | the caller's registration is dropped; released (`last registration dropped`) if it was the last, else kept | released (`domain closed`) | the creator's registration is dropped; released (`creator exited`) if it was the last, else kept | released (`last registration dropped`) | the connection's own registration is dropped; released (`last connection left`) if it was the last, else kept | as peer DREQ | released (`keeper lost`) |
//!
//! Notes:
//! * "Owner destroy" is refused ([`RegistryError::NotOwner`]) for anyone but the owner while
//!   the owner lives; an orphan may be destroyed by anyone.
//! * Registrations on non-`Shared` QPs are non-owning users (OFED's `reg_xrc_rcv_qp` on a QP
//!   someone else owns); they are notified when the QP goes.
//! * Keeper crash: the kernel drops the keeper's handles, so every QP the keeper held is gone
//!   unless some other process happens to hold its own handle — and then no policy can be
//!   enforced any more. Clients are told "all keeper-held QPs are gone", never silently.
//! * After release, every event is ignored (nothing is torn down twice) except a REQ naming
//!   the QP (REJ as above) and a crossing peer DREQ (connection forgotten).
//! * One test per cell, three times: `policy::tests` (the engine), `tests/matrix.rs` (the
//!   same cells through [`TgtRegistry`] on the software model) and `tests/cm_matrix.rs` (the
//!   same cells through real CM traffic on ibcm's simulator: the DREQs the target sends and
//!   the initiator receives, REJ reason 1 + ARI on reconnect, the QPN quarantine against the
//!   CM TimeWait, a kept QP taking new connections).
//! * Peer timeout through the CM: the initiator never completes the handshake (the target's
//!   REP retries run out) or rejects after the REP; an established connection has no CM
//!   keep-alive, so only a DREQ ends it.
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
#![cfg_attr(
    test,
    allow(
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::panic,
        clippy::indexing_slicing
    )
)]

#[cfg(feature = "cm")]
pub mod cm;
#[cfg(feature = "keeper")]
pub mod keeper;
mod policy;
mod registry;
mod types;
pub mod verbs;

pub use ibcm_mad::xrc::{
    GoneCause, RejectKind, ReqMode, TargetGone, XrcDataError, XrcRepData, XrcReqData,
};
pub use policy::{
    decide, ConnOnQp, Decision, OwnershipPolicy, PolicyAction, PolicyConfig, PolicyEvent, QpFacts,
    Verdict,
};
pub use registry::{
    ConnEvent, DomainId, DomainState, IniPeer, Leak, QpLife, QpnStatus, Registrant, RegistryConfig,
    RegistryError, TgtQp, TgtRegistry, TgtRequest, XrcAccept, XrcDomain,
};
pub use types::{DomainSpec, ProcessId, QpHandle, Qpn, SrqHandle, SrqNum, XrcdHandle};
pub use verbs::qp::{QpAttr, QpState, QpType};
#[cfg(feature = "rdma")]
pub use verbs::RdmaVerbs;
pub use verbs::{DeviceInfo, IniQp, IniQpCaps, QpInfo, SrqAttr, Verbs, VerbsError, XrcSrq};
