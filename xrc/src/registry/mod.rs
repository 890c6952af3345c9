//! [`TgtRegistry`]: domains and TGT QPs with ownership policies, the connections on them, and
//! the coupling to the CM.
//!
//! The registry is the party that **holds a kernel handle on every TGT QP it manages** (the
//! keeper process, or the process embedding it) and enforces each QP's policy by deciding
//! when to drop that handle. It keeps the facts the policy engine needs (owner alive,
//! registrations, connections, domain open) and executes the engine's verbs-side actions
//! itself; CM-side actions are queued for [`TgtRegistry::poll_action`].
//!
//! The coupling with the CM is described on [`TgtRegistry`].
//!
//! Where things are (one file per concern, all of them `impl TgtRegistry` blocks next to the
//! types they hand out):
//!
//! * this file: the [`TgtRegistry`] struct and its CM contract, [`RegistryConfig`], the
//!   records it keeps per domain and per TGT QP, the vocabulary shared by the other files
//!   ([`DomainId`], [`Registrant`], [`IniPeer`], [`QpLife`]) and its outputs
//!   ([`TgtRegistry::poll_action`], [`TgtRegistry::poll_trace`]);
//! * `domains.rs`: opening, looking up and closing XRC domains;
//! * `qps.rs`: creating TGT QPs, registrations, owner destroy and adopt, modify, snapshots;
//! * `conn.rs`: the CM side — [`TgtRequest`] in, [`XrcAccept`] or a `TargetGone` out,
//!   connection events, rekeying a provisional connection key;
//! * `exit.rs`: a holder dies — process exit, keeper crash;
//! * `quarantine.rs`: QPN quarantine (CM TimeWait, noted numbers) and its timer;
//! * `execute.rs`: running the policy engine on one QP and executing its verbs-side actions;
//! * `leaks.rs`: the leak report;
//! * `error.rs`: [`RegistryError`].

use std::collections::{BTreeMap, VecDeque};
use std::fmt;
use std::time::{Duration, Instant};

use ibcm_mad::Guid;

use crate::policy::{ConnOnQp, OwnershipPolicy, PolicyAction, PolicyConfig, QpFacts, Verdict};
use crate::types::{DomainSpec, ProcessId, QpHandle, Qpn, XrcdHandle};
#[cfg(doc)]
use crate::verbs::qp::QpAttr;
use crate::verbs::qp::QpState;
use crate::verbs::Verbs;
use ibcm_mad::xrc::GoneCause;
#[cfg(doc)]
use ibcm_mad::xrc::{TargetGone, XrcRepData, XrcReqData};

mod conn;
mod domains;
mod error;
mod execute;
mod exit;
mod leaks;
mod qps;
mod quarantine;

pub use conn::{ConnEvent, TgtRequest, XrcAccept};
pub use domains::{DomainState, XrcDomain};
pub use error::RegistryError;
pub use leaks::Leak;
pub use qps::TgtQp;
pub use quarantine::QpnStatus;

/// Registry-wide settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RegistryConfig {
    /// Engine tunables (default TimeWait, hold during quarantine).
    pub policy: PolicyConfig,
    /// Policy for TGT QPs created by a REQ that does not ask for one.
    pub default_policy: OwnershipPolicy,
    /// For `Shared` QPs created or attached by [`TgtRegistry::handle_req`]: give each
    /// connection a registration of its own, dropped when the connection ends. Default `true`
    /// (how OFED MPIs used registrations: one per endpoint).
    pub connection_registrations: bool,
    /// How many QPs to create (parking the quarantined ones) before giving up on finding an
    /// unquarantined QPN.
    pub max_create_attempts: usize,
}

impl Default for RegistryConfig {
    fn default() -> Self {
        Self {
            policy: PolicyConfig::default(),
            default_policy: OwnershipPolicy::ProcessBound,
            connection_registrations: true,
            max_create_attempts: 8,
        }
    }
}

/// A domain's identifier inside one registry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DomainId(pub u32);

impl fmt::Display for DomainId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "d{}", self.0)
    }
}

/// Who holds a registration on a TGT QP.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Registrant<K> {
    /// A process; dropped by unregister or when the process exits.
    Process(ProcessId),
    /// A connection; dropped when it ends.
    Conn(K),
}

impl<K: fmt::Debug> fmt::Display for Registrant<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Process(p) => write!(f, "pid {p}"),
            Self::Conn(k) => write!(f, "conn {k:?}"),
        }
    }
}

/// The initiator a TGT QP is connected to (from the REQ).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct IniPeer {
    /// The initiator's CA GUID (REQ Local CA GUID).
    pub ca_guid: Guid,
    /// The INI QPN (REQ Local QPN).
    pub ini_qpn: Qpn,
}

/// Is a TGT QP alive?
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QpLife {
    /// Alive.
    Live,
    /// Logically destroyed; its number is quarantined until `until`.
    Gone {
        /// Why.
        cause: GoneCause,
        /// End of the quarantine.
        until: Instant,
    },
}

/// One entry of the registry's trace: everything it did, for timelines and debugging.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceEntry<K> {
    /// When.
    pub at: Instant,
    /// The QP concerned.
    pub qpn: Qpn,
    /// What happened (an event name or "create"/"register"/…).
    pub what: String,
    /// The verdict, if a policy decision was made.
    pub verdict: Option<Verdict>,
    /// The actions that followed.
    pub actions: Vec<PolicyAction<K>>,
}

#[derive(Debug)]
struct DomainEntry {
    name: String,
    spec: DomainSpec,
    xrcd: XrcdHandle,
    closing: bool,
}

#[derive(Debug)]
struct QpEntry<K> {
    domain: DomainId,
    policy: OwnershipPolicy,
    handle: Option<QpHandle>,
    creator: ProcessId,
    owner: Option<ProcessId>,
    registrations: BTreeMap<Registrant<K>, u32>,
    conns: BTreeMap<K, Duration>,
    peer: Option<IniPeer>,
    state: QpState,
    life: QpLife,
}

impl<K: Clone + Ord> QpEntry<K> {
    fn reg_total(&self) -> usize {
        self.registrations
            .values()
            .map(|&c| usize::try_from(c).unwrap_or(usize::MAX))
            .fold(0usize, usize::saturating_add)
    }

    fn facts(&self, qpn: Qpn, domain_open: bool) -> QpFacts<K> {
        QpFacts {
            qpn,
            policy: self.policy,
            owner_alive: self.owner.is_some(),
            registrations: self.reg_total(),
            domain_open,
            held: self.handle.is_some(),
            conns: self
                .conns
                .iter()
                .map(|(k, tw)| ConnOnQp {
                    conn: k.clone(),
                    timewait: *tw,
                })
                .collect(),
            gone: match self.life {
                QpLife::Live => None,
                QpLife::Gone { cause, .. } => Some(cause),
            },
        }
    }
}

/// A quarantined number without a QP entry: (end, the parked QP holding the number, why).
type ExtraQuarantine = (Instant, Option<(QpHandle, DomainId)>, GoneCause);

/// Domains, TGT QPs with ownership policies, and their CM connections.
///
/// The registry is the party that **holds a kernel handle on every TGT QP it manages** (the
/// keeper process, or the process embedding it) and enforces each QP's policy by deciding
/// when to drop that handle. It keeps the facts the policy engine needs (owner alive,
/// registrations, connections, domain open) and executes the engine's verbs-side actions
/// itself; CM-side actions are queued for [`TgtRegistry::poll_action`].
///
/// # Coupling with the CM (passive/TGT side)
///
/// The registry is sans-IO and generic over the CM's connection key `K` (any `Clone + Ord`
/// type, e.g. the CM's local Comm ID or connection handle). The CM drives it like this:
///
/// 1. **XRC REQ received** (Transport Service Type 3, Extended Transport Type 1): parse the
///    private data with [`XrcReqData::parse`] (absent or foreign → `Any`/default policy) and
///    call [`TgtRegistry::handle_req`].
///    * `Ok(XrcAccept)`: if [`XrcAccept::created`], bring the QP up with
///      [`TgtRegistry::modify`] (RESET→INIT→RTR, [`QpAttr::tgt_to_rtr`] with the REQ's INI
///      QPN as `dest_qpn`); send the REP with **Local EECN = [`XrcAccept::tgt_qpn`]**,
///      Local QPN 0, SRQ = 1, Initiator Depth and End-to-End Flow Control 0, and private data
///      [`XrcAccept::rep_private_data`] (docs/wire.md §3.2).
///    * `Err(TargetGone)`: send REJ with reason [`TargetGone::reason`], Reject Info Length
///      12, ARI = [`TargetGone::to_bytes`], and the same 12 bytes at the start of the private
///      data.
/// 2. **Connection events**: call [`TgtRegistry::handle_conn_event`] with
///    [`ConnEvent::Established`] (RTU received), [`ConnEvent::PeerDreq`] (DREQ received;
///    the CM answers DREP and enters TimeWait as usual), [`ConnEvent::PeerTimeout`] (DREQ or
///    REP retries exhausted, REJ received after REP), [`ConnEvent::LocalClosed`] (the CM
///    finished a disconnect the registry did not ask for).
/// 3. **After every call**, drain [`TgtRegistry::poll_action`]: execute
///    [`PolicyAction::EndConnection`] (DREQ carrying the TGT QPN in Remote QPN/EECN; if the
///    connection is not established yet, REJ reason 1 + [`TargetGone`] instead) and forward
///    [`PolicyAction::NotifyHolders`] / [`PolicyAction::ReportOrphan`] to whoever cares.
///    Then re-arm the timer from [`TgtRegistry::poll_timeout`] and call
///    [`TgtRegistry::handle_timeout`] when it fires (quarantines ending).
/// 4. **QPN reuse**: the CM may report QPNs it knows to be in TimeWait with
///    [`TgtRegistry::note_timewait`]; the registry will not hand such a number out for a new
///    TGT QP and rejects REQs naming it. A CM whose quarantine also holds numbers of
///    connections the registry never sees (other applications' on the same endpoint) passes
///    it to [`TgtRegistry::handle_req_with`] instead of calling `handle_req`.
///
/// The CM must never move a shared TGT QP to ERR on disconnect (what `rdma_disconnect` does):
/// the registry owns the QP's state. A DREQ on one connection says nothing about the others.
///
/// ## With the `ibcm` crate's sans-IO `Endpoint`
///
/// `cm::XrcTarget` (feature `cm`, default) implements this contract with `K` =
/// `ibcm::proto::ConnId`; the event-by-event table (endpoint event → registry call, policy
/// action → endpoint command) is written once, in the `cm` module docs, next to the code
/// that follows it. The passive side's TimeWait is the REQ's primary Local ACK Timeout
/// (docs/protocol.md §4.4), or the endpoint's configured override, plus its slack.
///
/// `AcceptParams::xrc_tgt_live` lets a REQ attach to a **live** TGT QP while an earlier
/// connection on it is still in TimeWait (the endpoint would otherwise refuse the number as
/// quarantined); the numbers of gone QPs are kept out of use by this registry's quarantine.
/// A CM that learns the connection ID only after the REP went out (ibcm's async
/// `Incoming::accept`) binds the REQ under a provisional key and calls
/// [`TgtRegistry::rekey_conn`]. After a keeper crash ([`TgtRegistry::crash`]) the restarted
/// registry learns the lost numbers with [`TgtRegistry::note_gone`].
///
/// On the initiator side nothing is needed from the registry: put [`XrcReqData`] in the REQ,
/// read [`XrcRepData`] from the REP (the TGT QPN also arrives in the EECN field), and on a REJ
/// check [`TargetGone::parse`] on the ARI (or the private data) — or on a DREQ's private
/// data — to tell "target gone" from "refused" (`cm::IniOutcome` does this).
pub struct TgtRegistry<K> {
    verbs: Box<dyn Verbs>,
    cfg: RegistryConfig,
    domains: BTreeMap<DomainId, DomainEntry>,
    next_domain: u32,
    qps: BTreeMap<Qpn, QpEntry<K>>,
    conns: BTreeMap<K, Qpn>,
    /// Numbers quarantined without a QP entry: parked QPs and CM-reported TimeWaits.
    extra_quarantine: BTreeMap<Qpn, ExtraQuarantine>,
    outbox: VecDeque<PolicyAction<K>>,
    trace: VecDeque<TraceEntry<K>>,
}

impl<K> fmt::Debug for TgtRegistry<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TgtRegistry")
            .field("process", &self.verbs.process())
            .field("domains", &self.domains.len())
            .field("qps", &self.qps.len())
            .finish_non_exhaustive()
    }
}

impl<K: Clone + Ord + fmt::Debug> TgtRegistry<K> {
    /// A registry acting through `verbs` (the process that will hold the handles).
    pub fn new(verbs: Box<dyn Verbs>, cfg: RegistryConfig) -> Self {
        Self {
            verbs,
            cfg,
            domains: BTreeMap::new(),
            next_domain: 1,
            qps: BTreeMap::new(),
            conns: BTreeMap::new(),
            extra_quarantine: BTreeMap::new(),
            outbox: VecDeque::new(),
            trace: VecDeque::new(),
        }
    }

    /// The verbs context the registry acts through.
    pub fn verbs(&self) -> &dyn Verbs {
        &*self.verbs
    }

    /// The configuration.
    pub fn config(&self) -> &RegistryConfig {
        &self.cfg
    }

    /// The next action for the CM or keeper: [`PolicyAction::EndConnection`],
    /// [`PolicyAction::NotifyHolders`] or [`PolicyAction::ReportOrphan`].
    pub fn poll_action(&mut self) -> Option<PolicyAction<K>> {
        self.outbox.pop_front()
    }

    /// The next trace entry (everything the registry did, in order).
    pub fn poll_trace(&mut self) -> Option<TraceEntry<K>> {
        self.trace.pop_front()
    }

    fn log(
        &mut self,
        at: Instant,
        qpn: Qpn,
        what: String,
        verdict: Option<Verdict>,
        actions: Vec<PolicyAction<K>>,
    ) {
        self.trace.push_back(TraceEntry {
            at,
            qpn,
            what,
            verdict,
            actions,
        });
    }
}
