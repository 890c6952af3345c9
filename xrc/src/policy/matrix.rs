//! The policy × event matrix as code: [`POLICY_MATRIX`], read by [`decide`].

use ibcm_mad::xrc::GoneCause;
#[cfg(doc)]
use ibcm_mad::xrc::TargetGone;

#[cfg(doc)]
use super::{decide, PolicyAction};
use super::{OwnershipPolicy, PolicyEvent, QpFacts};

/// A column of the [`POLICY_MATRIX`]: an event that may end a live TGT QP.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum MatrixEvent {
    /// [`PolicyEvent::OwnerDestroy`].
    OwnerDestroy,
    /// [`PolicyEvent::DomainClose`].
    DomainClose,
    /// [`PolicyEvent::CreatorExit`].
    CreatorExit,
    /// [`PolicyEvent::LastUnregister`].
    LastUnregister,
    /// [`PolicyEvent::PeerDreq`].
    PeerDreq,
    /// [`PolicyEvent::PeerTimeout`].
    PeerTimeout,
    /// [`PolicyEvent::KeeperCrash`].
    KeeperCrash,
}

impl MatrixEvent {
    /// All seven, in column order.
    pub const ALL: [Self; 7] = [
        Self::OwnerDestroy,
        Self::DomainClose,
        Self::CreatorExit,
        Self::LastUnregister,
        Self::PeerDreq,
        Self::PeerTimeout,
        Self::KeeperCrash,
    ];

    /// The column header, as [`PolicyEvent::name`] spells it.
    pub const fn name(self) -> &'static str {
        match self {
            Self::OwnerDestroy => "owner destroy",
            Self::DomainClose => "domain close",
            Self::CreatorExit => "creator exit",
            Self::LastUnregister => "last unregister",
            Self::PeerDreq => "peer DREQ",
            Self::PeerTimeout => "peer timeout",
            Self::KeeperCrash => "keeper crash",
        }
    }
}

impl<K> PolicyEvent<K> {
    /// The matrix column of this event; `None` for a REQ and a quarantine end, which never
    /// end a live QP.
    pub const fn column(&self) -> Option<MatrixEvent> {
        Some(match self {
            Self::OwnerDestroy => MatrixEvent::OwnerDestroy,
            Self::DomainClose => MatrixEvent::DomainClose,
            Self::CreatorExit => MatrixEvent::CreatorExit,
            Self::LastUnregister => MatrixEvent::LastUnregister,
            Self::PeerDreq { .. } => MatrixEvent::PeerDreq,
            Self::PeerTimeout { .. } => MatrixEvent::PeerTimeout,
            Self::KeeperCrash => MatrixEvent::KeeperCrash,
            Self::ReqReceived { .. } | Self::QuarantineExpired => return None,
        })
    }
}

/// A cell of the [`POLICY_MATRIX`]: what an event does to a **live** TGT QP.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Rule {
    /// The QP is kept (the event's own consequence still happens: the connection that left
    /// is forgotten, an orphan reported, a closing domain pinned).
    Kept,
    /// The QP is released, for this cause.
    Released(GoneCause),
    /// The event dropped a registration (`Shared`): the QP is released, for this cause, if
    /// that was the last one ([`QpFacts::registrations`] is 0 after the bookkeeping), else
    /// kept.
    ReleasedIfLastRegistration(GoneCause),
}

/// The policy × event matrix, as code: `POLICY_MATRIX[policy][event]`, rows in
/// [`OwnershipPolicy::ALL`] order, columns in [`MatrixEvent::ALL`] order. [`decide`] reads
/// it (through [`rule`]); [`TgtRegistry`](crate::TgtRegistry) executes what `decide`
/// returns and the CM coupling (`cm::XrcTarget`) turns the releases into DREQs and REJs.
///
/// What happens to a **live** TGT QP. "Released" means: every *other* connection on the QP
/// is ended ([`PolicyAction::EndConnection`]: a DREQ if established, REJ reason 1 if it is
/// still being set up), registered processes are notified, the QP goes to ERR and its number
/// is quarantined until the longest CM TimeWait of its connections has passed (the QP object
/// is held until then, so the device cannot reuse the number); afterwards a REQ naming it
/// gets REJ reason 1 "No QP available" with the [`TargetGone`] ARI carrying the cause.
/// "Kept" means the QP and its other connections are untouched.
///
/// | policy \ event | owner destroy | domain close | creator exit | last unregister | peer DREQ | peer timeout | keeper crash |
/// |---|---|---|---|---|---|---|---|
/// | **Explicit** | released (`owner destroyed it`) | kept; it **pins** the domain, which closes after the QP is destroyed | kept as an **orphan** (any process may adopt or destroy it; listed by `leaks` when idle) | kept (registrations do not own it) | kept; connection forgotten | kept; connection forgotten | released (`keeper lost`) |
/// | **DomainBound** | released (`owner destroyed it`) | released (`domain closed`) | kept (that is the point) | kept | kept; connection forgotten | kept; connection forgotten | released (`keeper lost`) |
/// | **ProcessBound** | released (`owner destroyed it`) | released (`domain closed`) | released (`creator exited`) | kept | kept while the creator lives; connection forgotten | kept while the creator lives; connection forgotten | released (`keeper lost`) |
/// | **Shared** | the caller's registration is dropped; released (`last registration dropped`) if it was the last, else kept | released (`domain closed`) | the creator's registration is dropped; released (`creator exited`) if it was the last, else kept | released (`last registration dropped`) if it was the last, else kept | the connection's own registration is dropped; released (`last connection left`) if it was the last, else kept | as peer DREQ: released (`last connection left`) if it was the last, else kept | released (`keeper lost`) |
///
/// (A test checks this table against the constant: every "released (`cause`)" is the
/// [`GoneCause`] text of a `Released` or `ReleasedIfLastRegistration` cell, "if it was the
/// last" marks the latter, and a cell without "released" is `Kept`.)
///
/// Notes:
/// * "Owner destroy" is refused ([`RegistryError::NotOwner`](crate::RegistryError::NotOwner))
///   for anyone but the owner while the owner lives; an orphan may be destroyed by anyone.
/// * Registrations on non-`Shared` QPs are non-owning users (OFED's `reg_xrc_rcv_qp` on a QP
///   someone else owns); they are notified when the QP goes.
/// * Keeper crash: the kernel drops the keeper's handles, so every QP the keeper held is gone
///   unless some other process happens to hold its own handle — and then no policy can be
///   enforced any more. Clients are told "all keeper-held QPs are gone", never silently.
/// * After release, every event is ignored (nothing is torn down twice) except a REQ naming
///   the QP (REJ as above) and a crossing peer DREQ (connection forgotten).
/// * One test per cell, three times: the engine's unit tests, `tests/matrix.rs` (the same
///   cells through [`TgtRegistry`](crate::TgtRegistry) on the software model) and
///   `tests/cm_matrix.rs` (the same cells through real CM traffic on ibcm's simulator: the
///   DREQs the target sends and the initiator receives, REJ reason 1 + ARI on reconnect, the
///   QPN quarantine against the CM TimeWait, a kept QP taking new connections).
/// * Peer timeout through the CM: the initiator never completes the handshake (the target's
///   REP retries run out) or rejects after the REP; an established connection has no CM
///   keep-alive, so only a DREQ ends it.
pub const POLICY_MATRIX: [[Rule; 7]; 4] = {
    use GoneCause as C;
    use Rule::{Kept, Released as R, ReleasedIfLastRegistration as Last};
    [
        // Explicit
        [
            R(C::OwnerDestroyed),
            Kept,
            Kept,
            Kept,
            Kept,
            Kept,
            R(C::KeeperLost),
        ],
        // DomainBound
        [
            R(C::OwnerDestroyed),
            R(C::DomainClosed),
            Kept,
            Kept,
            Kept,
            Kept,
            R(C::KeeperLost),
        ],
        // ProcessBound
        [
            R(C::OwnerDestroyed),
            R(C::DomainClosed),
            R(C::CreatorExited),
            Kept,
            Kept,
            Kept,
            R(C::KeeperLost),
        ],
        // Shared
        [
            Last(C::LastUnregistered),
            R(C::DomainClosed),
            Last(C::CreatorExited),
            Last(C::LastUnregistered),
            Last(C::PeerLeft),
            Last(C::PeerLeft),
            R(C::KeeperLost),
        ],
    ]
};

/// One cell of the [`POLICY_MATRIX`].
pub const fn rule(policy: OwnershipPolicy, event: MatrixEvent) -> Rule {
    let [explicit, domain_bound, process_bound, shared] = POLICY_MATRIX;
    let [owner_destroy, domain_close, creator_exit, last_unregister, peer_dreq, peer_timeout, keeper_crash] =
        match policy {
            OwnershipPolicy::Explicit => explicit,
            OwnershipPolicy::DomainBound => domain_bound,
            OwnershipPolicy::ProcessBound => process_bound,
            OwnershipPolicy::Shared => shared,
        };
    match event {
        MatrixEvent::OwnerDestroy => owner_destroy,
        MatrixEvent::DomainClose => domain_close,
        MatrixEvent::CreatorExit => creator_exit,
        MatrixEvent::LastUnregister => last_unregister,
        MatrixEvent::PeerDreq => peer_dreq,
        MatrixEvent::PeerTimeout => peer_timeout,
        MatrixEvent::KeeperCrash => keeper_crash,
    }
}

/// Whether a live QP keeps a reason to live after `event`, or why not: the
/// [`POLICY_MATRIX`] cell, with its registration condition applied to `f`.
///
/// # Errors
/// The [`GoneCause`] when the QP must be released.
pub(crate) fn survives<K>(
    policy: OwnershipPolicy,
    event: &PolicyEvent<K>,
    f: &QpFacts<K>,
) -> Result<(), GoneCause> {
    let Some(col) = event.column() else {
        return Ok(());
    };
    match rule(policy, col) {
        Rule::Kept => Ok(()),
        Rule::Released(cause) => Err(cause),
        Rule::ReleasedIfLastRegistration(cause) if f.registrations == 0 => Err(cause),
        Rule::ReleasedIfLastRegistration(_) => Ok(()),
    }
}
