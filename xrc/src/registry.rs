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

use std::collections::{BTreeMap, VecDeque};
use std::fmt;
use std::time::{Duration, Instant};

use ibcm_mad::Guid;

use crate::policy::{
    decide, ConnOnQp, OwnershipPolicy, PolicyAction, PolicyConfig, PolicyEvent, QpFacts, Verdict,
};
use crate::types::{DomainSpec, ProcessId, QpHandle, Qpn, SrqNum, XrcdHandle};
use crate::verbs::qp::{QpAttr, QpState};
use crate::verbs::{Verbs, VerbsError};
use ibcm_mad::xrc::{
    GoneCause, RejectKind, ReqMode, TargetGone, XrcDataError, XrcRepData, XrcReqData,
};

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

/// What [`TgtRegistry::qpn_status`] says about a number.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QpnStatus {
    /// A live TGT QP of this registry.
    Live,
    /// Gone and quarantined.
    Quarantined {
        /// Why it went (`Unknown` for numbers reported by [`TgtRegistry::note_timewait`], the
        /// noted cause for [`TgtRegistry::note_gone`]).
        cause: GoneCause,
        /// End of the quarantine.
        until: Instant,
    },
    /// Not known.
    Unknown,
}

/// Registry errors.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RegistryError {
    /// No such domain in this registry.
    #[error("unknown domain {0}")]
    UnknownDomain(DomainId),
    /// The domain is closing and takes no new QPs.
    #[error("domain {0} is closing")]
    DomainClosing(DomainId),
    /// A domain with this name is already open here and `O_EXCL` was asked.
    #[error("domain {0} is already open")]
    DomainExists(String),
    /// No such TGT QP.
    #[error("no TGT QP {0}")]
    UnknownQpn(Qpn),
    /// The TGT QP is gone.
    #[error("TGT QP {qpn} is gone: {cause}")]
    Gone {
        /// The QP.
        qpn: Qpn,
        /// Why.
        cause: GoneCause,
    },
    /// Only the owner may do this.
    #[error("TGT QP {qpn} is owned by {owner:?}")]
    NotOwner {
        /// The QP.
        qpn: Qpn,
        /// Its owner.
        owner: Option<ProcessId>,
    },
    /// The registrant holds no registration on the QP.
    #[error("{who} is not registered on TGT QP {qpn}")]
    NotRegistered {
        /// The QP.
        qpn: Qpn,
        /// Who asked (display form).
        who: String,
    },
    /// Every new QP got a quarantined number.
    #[error("only quarantined QPNs available after {attempts} attempts")]
    QpnsExhausted {
        /// How many QPs were tried.
        attempts: usize,
    },
    /// Building the REP private data failed (e.g. more than 47 SRQNs).
    #[error("REP private data: {0}")]
    Wire(#[from] XrcDataError),
    /// The verbs backend failed.
    #[error(transparent)]
    Verbs(#[from] VerbsError),
}

/// A REQ for an XRC TGT, as the CM hands it to [`TgtRegistry::handle_req`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TgtRequest<K> {
    /// The CM's key for the new connection.
    pub conn: K,
    /// The domain the listener serves.
    pub domain: DomainId,
    /// The accepting process (the creator of a new TGT QP).
    pub process: ProcessId,
    /// The initiator.
    pub peer: IniPeer,
    /// The XRC part of the REQ's private data.
    pub data: XrcReqData,
    /// The connection's CM TimeWait.
    pub timewait: Duration,
    /// The accepting process's XRC SRQ numbers, for the REP.
    pub srqns: Vec<SrqNum>,
}

/// How to answer an accepted XRC REQ.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct XrcAccept {
    /// The TGT QPN: the REP's Local EECN.
    pub tgt_qpn: Qpn,
    /// Whether the QP was created for this REQ (it is in RESET: bring it to RTR).
    pub created: bool,
    /// Its policy.
    pub policy: OwnershipPolicy,
    /// The REP's XRC private data (the application's bytes may follow).
    pub rep: XrcRepData,
}

impl XrcAccept {
    /// The REP private data: [`XrcRepData`] followed by `app`.
    ///
    /// # Errors
    /// [`XrcDataError::TooLong`] when it does not fit 196 bytes.
    pub fn rep_private_data(&self, app: &[u8]) -> Result<Vec<u8>, XrcDataError> {
        self.rep.emit(app)
    }
}

/// Connection events the CM reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConnEvent {
    /// RTU received (or COMM_EST): the connection is up.
    Established,
    /// DREQ received from the initiator.
    PeerDreq,
    /// The connection failed without a DREQ (retries exhausted, REJ received).
    PeerTimeout,
    /// The CM closed it for another reason (local disconnect).
    LocalClosed,
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
///    TGT QP and rejects REQs naming it.
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

    // --- domains ---------------------------------------------------------------------------

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

    fn try_finish_close(&mut self, id: DomainId) {
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

    // --- TGT QPs ---------------------------------------------------------------------------

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
        let qpn = self.create_inner(now, domain, policy, creator, None)?;
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

    fn create_inner(
        &mut self,
        now: Instant,
        domain: DomainId,
        policy: OwnershipPolicy,
        creator: ProcessId,
        peer: Option<IniPeer>,
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
            if let QpnStatus::Quarantined { until, cause } = self.qpn_status(qpn, now) {
                // The device reused a number still in TimeWait: keep that QP (so the number
                // stays taken) until the quarantine ends, and try again. A CM-reported
                // TimeWait of the same number may last longer than the QP's own quarantine.
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

    /// A process exited (or a keeper client disconnected): its registrations are dropped,
    /// and every QP it owned gets [`PolicyEvent::CreatorExit`]. Returns the QPs affected with
    /// their verdicts.
    pub fn process_exit(&mut self, now: Instant, pid: ProcessId) -> Vec<(Qpn, Verdict)> {
        let mut out = Vec::new();
        let live: Vec<Qpn> = self
            .qps
            .iter()
            .filter(|(_, q)| q.life == QpLife::Live)
            .map(|(&n, _)| n)
            .collect();
        for qpn in live {
            let Some(q) = self.qps.get_mut(&qpn) else {
                continue;
            };
            let had_reg = q.registrations.remove(&Registrant::Process(pid)).is_some();
            let owned = q.owner == Some(pid);
            let created_shared = q.policy == OwnershipPolicy::Shared && q.creator == pid;
            if owned {
                q.owner = None;
            }
            let now_empty = q.registrations.is_empty();
            let event = if owned || (created_shared && had_reg) {
                Some(PolicyEvent::CreatorExit)
            } else if had_reg && now_empty {
                Some(PolicyEvent::LastUnregister)
            } else {
                None
            };
            if let Some(e) = event {
                out.push((qpn, self.apply(now, qpn, e)));
            } else if had_reg {
                self.log(
                    now,
                    qpn,
                    format!("pid {pid} exited: registration dropped"),
                    None,
                    vec![],
                );
                out.push((qpn, Verdict::Kept));
            }
        }
        out
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

    /// Whether a QPN is live, quarantined or unknown here.
    pub fn qpn_status(&self, qpn: Qpn, now: Instant) -> QpnStatus {
        if let Some(q) = self.qps.get(&qpn) {
            return match q.life {
                QpLife::Live => QpnStatus::Live,
                QpLife::Gone { cause, until } => QpnStatus::Quarantined { cause, until },
            };
        }
        match self.extra_quarantine.get(&qpn) {
            Some(&(until, _, cause)) if until > now => QpnStatus::Quarantined { cause, until },
            _ => QpnStatus::Unknown,
        }
    }

    /// Records that `qpn` is in CM TimeWait until `until` (a connection on it ended, or the
    /// CM knows about connections the registry never saw). Such a number is not handed out
    /// for a new TGT QP; a gone QP of that number is held until then; a live one, if
    /// released later, is quarantined at least until then.
    pub fn note_timewait(&mut self, qpn: Qpn, until: Instant) {
        // A gone QP is held (and its number quarantined) until the longest TimeWait.
        if let Some(q) = self.qps.get_mut(&qpn) {
            if let QpLife::Gone { cause, until: u } = q.life {
                if u < until {
                    q.life = QpLife::Gone { cause, until };
                }
                return;
            }
        }
        let e = self
            .extra_quarantine
            .entry(qpn)
            .or_insert((until, None, GoneCause::Unknown));
        if e.0 < until {
            e.0 = until;
        }
    }

    /// Records that the TGT QP `qpn` went away outside this registry — typically one a
    /// crashed keeper held (see [`TgtRegistry::crash`]; the restarted registry learns the
    /// numbers from the crash's [`PolicyAction::QuarantineQpn`] actions) — for `cause`, and
    /// that its number stays quarantined until `until`. Until then a REQ naming it is
    /// rejected with this cause (instead of [`GoneCause::Unknown`]) and no new TGT QP gets
    /// the number. Ignored for a QPN this registry manages itself.
    pub fn note_gone(&mut self, qpn: Qpn, cause: GoneCause, until: Instant) {
        if self.qps.contains_key(&qpn) {
            return;
        }
        let e = self
            .extra_quarantine
            .entry(qpn)
            .or_insert((until, None, cause));
        e.2 = cause;
        if e.0 < until {
            e.0 = until;
        }
    }

    // --- CM coupling -------------------------------------------------------------------------

    /// Decides on an XRC REQ (type docs, step 1).
    ///
    /// # Errors
    /// A [`TargetGone`] block to send in a REJ.
    pub fn handle_req(
        &mut self,
        now: Instant,
        req: &TgtRequest<K>,
    ) -> Result<XrcAccept, TargetGone> {
        let refuse = |kind, qpn| TargetGone { kind, qpn };
        // A duplicate of a REQ already accepted: answer the same way.
        if let Some(&qpn) = self.conns.get(&req.conn) {
            if let Some(q) = self.qps.get(&qpn) {
                if q.life == QpLife::Live {
                    return self.accept(qpn, false, &req.srqns);
                }
            }
        }
        let domain_open = self.domains.get(&req.domain).is_some_and(|d| !d.closing);
        let closed = refuse(RejectKind::Gone(GoneCause::DomainClosed), None);
        let (qpn, created) = match req.data.mode {
            ReqMode::Attach(qpn) => {
                let decided = self.qps.get(&qpn).map(|q| {
                    let f = q.facts(qpn, true);
                    (q.life, q.domain, q.peer, f)
                });
                match decided {
                    Some((QpLife::Live, _, _, _)) if !domain_open => {
                        return Err(refuse(RejectKind::Gone(GoneCause::DomainClosed), Some(qpn)));
                    }
                    Some((QpLife::Live, dom, peer, _)) => {
                        if dom != req.domain || peer.is_some_and(|p| p != req.peer) {
                            return Err(refuse(RejectKind::AttachRefused, Some(qpn)));
                        }
                        (qpn, false)
                    }
                    Some((QpLife::Gone { .. }, _, _, facts)) => {
                        let ev = PolicyEvent::ReqReceived {
                            conn: req.conn.clone(),
                        };
                        let d = decide(&facts, &ev, now, &self.cfg.policy);
                        self.log(
                            now,
                            qpn,
                            "REQ for a gone QP".into(),
                            Some(d.verdict),
                            d.actions.clone(),
                        );
                        let info = d.actions.iter().find_map(|a| match a {
                            PolicyAction::RejectReq { qpn, cause, .. } => {
                                Some(TargetGone::gone(*cause, *qpn))
                            }
                            _ => None,
                        });
                        return Err(info.unwrap_or(TargetGone::gone(GoneCause::Unknown, qpn)));
                    }
                    None => {
                        let cause = match self.qpn_status(qpn, now) {
                            QpnStatus::Quarantined { cause, .. } => cause,
                            _ => GoneCause::Unknown,
                        };
                        return Err(TargetGone::gone(cause, qpn));
                    }
                }
            }
            ReqMode::Any | ReqMode::Create if !domain_open => return Err(closed),
            ReqMode::Any => {
                let existing = self.qps.iter().find(|(_, q)| {
                    q.life == QpLife::Live && q.domain == req.domain && q.peer == Some(req.peer)
                });
                match existing {
                    Some((&qpn, _)) => (qpn, false),
                    None => (self.create_for_req(now, req)?, true),
                }
            }
            ReqMode::Create => (self.create_for_req(now, req)?, true),
        };
        // Bind the connection.
        let conn_regs = self.cfg.connection_registrations;
        if let Some(q) = self.qps.get_mut(&qpn) {
            q.peer.get_or_insert(req.peer);
            q.conns.insert(req.conn.clone(), req.timewait);
            if q.policy == OwnershipPolicy::Shared && conn_regs {
                q.registrations
                    .insert(Registrant::Conn(req.conn.clone()), 1);
            }
        }
        self.conns.insert(req.conn.clone(), qpn);
        self.log(
            now,
            qpn,
            format!(
                "REQ {:?} from INI {} {}",
                req.conn,
                req.peer.ini_qpn,
                if created {
                    "created the QP"
                } else {
                    "attached"
                }
            ),
            None,
            vec![],
        );
        self.accept(qpn, created, &req.srqns)
    }

    fn create_for_req(&mut self, now: Instant, req: &TgtRequest<K>) -> Result<Qpn, TargetGone> {
        let policy = req.data.policy.unwrap_or(self.cfg.default_policy);
        self.create_inner(now, req.domain, policy, req.process, Some(req.peer))
            .map_err(|_| TargetGone {
                kind: RejectKind::NoResources,
                qpn: None,
            })
    }

    fn accept(&self, qpn: Qpn, created: bool, srqns: &[SrqNum]) -> Result<XrcAccept, TargetGone> {
        let policy = self
            .qps
            .get(&qpn)
            .map_or(self.cfg.default_policy, |q| q.policy);
        let rep = XrcRepData {
            tgt_qpn: qpn,
            policy,
            created,
            srqns: srqns.to_vec(),
        };
        // Validate now so the CM never fails to build the REP.
        if rep.emit(&[]).is_err() {
            return Err(TargetGone {
                kind: RejectKind::NoResources,
                qpn: Some(qpn),
            });
        }
        Ok(XrcAccept {
            tgt_qpn: qpn,
            created,
            policy,
            rep,
        })
    }

    /// A connection event from the CM (type docs, step 2). Unknown connections are
    /// ignored (e.g. the DREQ crossing ours after the QP was released).
    pub fn handle_conn_event(&mut self, now: Instant, conn: &K, ev: ConnEvent) -> Option<Verdict> {
        let &qpn = self.conns.get(conn)?;
        if ev == ConnEvent::Established {
            self.log(now, qpn, format!("conn {conn:?} established"), None, vec![]);
            return None;
        }
        self.conns.remove(conn);
        let q = self.qps.get_mut(&qpn)?;
        q.registrations.remove(&Registrant::Conn(conn.clone()));
        let event = match ev {
            ConnEvent::PeerTimeout => PolicyEvent::PeerTimeout { conn: conn.clone() },
            _ => PolicyEvent::PeerDreq { conn: conn.clone() },
        };
        Some(self.apply(now, qpn, event))
    }

    /// Renames a connection key everywhere (the connection map, the QP's connection list, a
    /// connection-scoped registration, queued actions). For a CM that learns its own
    /// connection ID only after the REP went out — ibcm's async `Incoming::accept` — and so
    /// calls [`TgtRegistry::handle_req`] with a provisional key. Returns whether `old` was
    /// known; an existing `new` is overwritten.
    pub fn rekey_conn(&mut self, old: &K, new: K) -> bool {
        let Some(qpn) = self.conns.remove(old) else {
            return false;
        };
        self.conns.insert(new.clone(), qpn);
        if let Some(q) = self.qps.get_mut(&qpn) {
            if let Some(tw) = q.conns.remove(old) {
                q.conns.insert(new.clone(), tw);
            }
            if let Some(c) = q.registrations.remove(&Registrant::Conn(old.clone())) {
                q.registrations.insert(Registrant::Conn(new.clone()), c);
            }
        }
        for a in &mut self.outbox {
            if let PolicyAction::EndConnection { conn, .. } = a {
                if conn == old {
                    *conn = new.clone();
                }
            }
        }
        true
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

    /// When [`TgtRegistry::handle_timeout`] must next be called.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let gone = self.qps.values().filter_map(|q| match q.life {
            QpLife::Gone { until, .. } => Some(until),
            QpLife::Live => None,
        });
        let extra = self.extra_quarantine.values().map(|(u, _, _)| *u);
        gone.chain(extra).min()
    }

    /// Ends every quarantine due at `now`: held QPs are destroyed, numbers released, closing
    /// domains finished. A spurious call does nothing.
    pub fn handle_timeout(&mut self, now: Instant) {
        let due: Vec<Qpn> = self
            .qps
            .iter()
            .filter(|(_, q)| matches!(q.life, QpLife::Gone { until, .. } if until <= now))
            .map(|(&n, _)| n)
            .collect();
        for qpn in due {
            self.apply(now, qpn, PolicyEvent::QuarantineExpired);
        }
        let extra: Vec<Qpn> = self
            .extra_quarantine
            .iter()
            .filter(|(_, (until, _, _))| *until <= now)
            .map(|(&n, _)| n)
            .collect();
        for qpn in extra {
            if let Some((_, Some((h, dom)), _)) = self.extra_quarantine.remove(&qpn) {
                let _ = self.verbs.destroy_qp(h);
                self.log(now, qpn, "parked QP destroyed".into(), None, vec![]);
                self.try_finish_close(dom);
            }
        }
    }

    /// Simulates the death of the process holding this registry (a keeper crash): the kernel
    /// drops every handle, and the returned actions are what the rest of the world must do
    /// — DREQs for every connection, notifications, quarantines — per
    /// [`PolicyEvent::KeeperCrash`].
    pub fn crash(mut self, now: Instant) -> Vec<PolicyAction<K>> {
        let mut out = Vec::new();
        let live: Vec<Qpn> = self
            .qps
            .iter()
            .filter(|(_, q)| q.life == QpLife::Live)
            .map(|(&n, _)| n)
            .collect();
        for qpn in live {
            if let Some(q) = self.qps.get_mut(&qpn) {
                q.handle = None;
                let f = q.facts(qpn, true);
                let d = decide(&f, &PolicyEvent::KeeperCrash, now, &self.cfg.policy);
                out.extend(d.actions);
            }
        }
        // Dropping `self` drops the verbs context: for the software model that is the
        // process exit that destroys the handles.
        out
    }

    // --- internals ---------------------------------------------------------------------------

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

    /// Runs the engine for `event` on `qpn` and executes the result.
    fn apply(&mut self, now: Instant, qpn: Qpn, event: PolicyEvent<K>) -> Verdict {
        let Some(q) = self.qps.get(&qpn) else {
            return Verdict::AlreadyGone(GoneCause::Unknown);
        };
        let domain_open = self.domains.get(&q.domain).is_some_and(|d| !d.closing);
        let facts = q.facts(qpn, domain_open);
        let d = decide(&facts, &event, now, &self.cfg.policy);
        self.log(
            now,
            qpn,
            event.name().into(),
            Some(d.verdict),
            d.actions.clone(),
        );
        let mut cause_for_gone = match d.verdict {
            Verdict::Released(c) => Some(c),
            _ => None,
        };
        for a in d.actions {
            match a {
                PolicyAction::ModifyToError { qpn } => {
                    // RESET→ERR is not a valid transition, and a QP in RESET (or already in
                    // ERR) delivers nothing anyway.
                    let h = self
                        .qps
                        .get(&qpn)
                        .filter(|q| !matches!(q.state, QpState::Reset | QpState::Err))
                        .and_then(|q| q.handle);
                    if let Some(h) = h {
                        if self
                            .verbs
                            .modify_qp(h, &QpAttr::to_state(QpState::Err))
                            .is_ok()
                        {
                            if let Some(q) = self.qps.get_mut(&qpn) {
                                q.state = QpState::Err;
                            }
                        }
                    }
                }
                PolicyAction::DestroyQp { qpn } => {
                    let dom = self
                        .qps
                        .get_mut(&qpn)
                        .and_then(|q| q.handle.take().map(|h| (h, q.domain)));
                    if let Some((h, dom)) = dom {
                        let _ = self.verbs.destroy_qp(h);
                        self.try_finish_close(dom);
                    }
                }
                PolicyAction::QuarantineQpn { qpn, until } => {
                    // A TimeWait the CM reported for this number while the QP lived (a
                    // connection that left earlier) may end later than the engine's.
                    let noted = match self.extra_quarantine.get(&qpn) {
                        Some(&(u, None, _)) => Some(u),
                        _ => None,
                    };
                    let until = noted.map_or(until, |u| u.max(until));
                    if let (Some(q), Some(cause)) = (self.qps.get_mut(&qpn), cause_for_gone.take())
                    {
                        if noted.is_some() {
                            self.extra_quarantine.remove(&qpn);
                        }
                        q.life = QpLife::Gone { cause, until };
                        q.owner = None;
                        q.registrations.clear();
                        let conns: Vec<K> = std::mem::take(&mut q.conns).into_keys().collect();
                        for c in conns {
                            self.conns.remove(&c);
                        }
                    }
                }
                PolicyAction::ReleaseQpn { qpn } => {
                    let dom = self.qps.remove(&qpn).map(|q| q.domain);
                    if let Some(dom) = dom {
                        self.try_finish_close(dom);
                    }
                }
                PolicyAction::ForgetConn { conn } => {
                    self.conns.remove(&conn);
                    if let Some(q) = self.qps.get_mut(&qpn) {
                        q.conns.remove(&conn);
                        q.registrations.remove(&Registrant::Conn(conn));
                    }
                }
                PolicyAction::PinDomain { .. } | PolicyAction::RejectReq { .. } => {}
                a @ (PolicyAction::EndConnection { .. }
                | PolicyAction::NotifyHolders { .. }
                | PolicyAction::ReportOrphan { .. }) => self.outbox.push_back(a),
            }
        }
        d.verdict
    }
}
