//! The ownership-policy engine: a pure function from (policy, event, facts) to actions.
//!
//! [`decide`] holds every lifetime rule of the crate; [`TgtRegistry`](crate::TgtRegistry)
//! only keeps the facts up to date and executes what `decide` returns. The function reads no
//! clock (time comes in as `now`) and has no state, so each cell of [`POLICY_MATRIX`] is one
//! unit test. How a decision is made: see [`decide`].

use std::time::{Duration, Instant};

use ibcm_mad::xrc::GoneCause;
pub use ibcm_mad::xrc::OwnershipPolicy;
use ibcm_mad::Qpn;

#[cfg(doc)]
use ibcm_mad::xrc::TargetGone;

/// Something that happened to a TGT QP (or to a REQ aimed at one). `K` is the CM's
/// connection key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PolicyEvent<K> {
    /// The owner (for `Shared`: any registered process) asked to destroy the QP.
    OwnerDestroy,
    /// The QP's domain is being closed.
    DomainClose,
    /// The process that created (or owns) the QP exited.
    CreatorExit,
    /// The registration count dropped to zero.
    LastUnregister,
    /// The initiator disconnected this connection (DREQ received).
    PeerDreq {
        /// The connection.
        conn: K,
    },
    /// This connection failed without a DREQ (DREQ/REP retries exhausted, REJ received).
    PeerTimeout {
        /// The connection.
        conn: K,
    },
    /// The keeper holding the QP died or restarted: the kernel dropped its handles.
    KeeperCrash,
    /// A REQ (or reconnect) named this QP.
    ReqReceived {
        /// The new connection.
        conn: K,
    },
    /// The QPN's quarantine has ended.
    QuarantineExpired,
}

impl<K> PolicyEvent<K> {
    /// Short name for tables and logs.
    pub fn name(&self) -> &'static str {
        match self {
            Self::OwnerDestroy => "owner destroy",
            Self::DomainClose => "domain close",
            Self::CreatorExit => "creator exit",
            Self::LastUnregister => "last unregister",
            Self::PeerDreq { .. } => "peer DREQ",
            Self::PeerTimeout { .. } => "peer timeout",
            Self::KeeperCrash => "keeper crash",
            Self::ReqReceived { .. } => "REQ",
            Self::QuarantineExpired => "quarantine expired",
        }
    }

    fn conn(&self) -> Option<&K> {
        match self {
            Self::PeerDreq { conn } | Self::PeerTimeout { conn } | Self::ReqReceived { conn } => {
                Some(conn)
            }
            _ => None,
        }
    }
}

/// A connection sitting on a TGT QP.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConnOnQp<K> {
    /// The CM's key for it.
    pub conn: K,
    /// Its CM TimeWait (spec/cm-wire.md §4.4): how long after it ends a stale packet may
    /// still arrive.
    pub timewait: Duration,
}

/// What the engine needs to know about a QP, **after** the event's bookkeeping.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QpFacts<K> {
    /// The QP.
    pub qpn: Qpn,
    /// Its policy.
    pub policy: OwnershipPolicy,
    /// Whether its owner (creator, or whoever adopted it) is alive and still owns it.
    pub owner_alive: bool,
    /// Live registrations (processes and connections). Decides the life of a `Shared` QP;
    /// for the other policies they are non-owning users who get notified.
    pub registrations: usize,
    /// Whether its domain is open.
    pub domain_open: bool,
    /// Whether the deciding party holds a kernel handle on it (false once a keeper crashed:
    /// the kernel dropped the handle).
    pub held: bool,
    /// The connections on it, including the one the event is about.
    pub conns: Vec<ConnOnQp<K>>,
    /// `Some` once it is gone (logically destroyed, maybe still held in quarantine).
    pub gone: Option<GoneCause>,
}

/// Tunables of the engine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PolicyConfig {
    /// Quarantine used when no connection tells a longer TimeWait. Default 4.3 s: the
    /// TimeWait of a connection with local ACK timeout exponent 20 (4.096 µs·2²⁰).
    pub default_timewait: Duration,
    /// Keep the QP object (in ERR) until its quarantine ends instead of destroying it at
    /// once, so the device cannot reuse the number. Default `true`.
    pub hold_qp_during_quarantine: bool,
}

impl Default for PolicyConfig {
    fn default() -> Self {
        Self {
            default_timewait: Duration::from_micros(4_294_967),
            hold_qp_during_quarantine: true,
        }
    }
}

/// What to do. The registry executes `ModifyToError`, `DestroyQp`, `QuarantineQpn`,
/// `ReleaseQpn`, `ForgetConn` and `PinDomain` itself; `EndConnection`, `RejectReq`,
/// `NotifyHolders` and `ReportOrphan` are for the CM or the keeper.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PolicyAction<K> {
    /// End this connection because its TGT QP went away: a **DREQ** if it is established
    /// (the kernel CM would send nothing for an XRC TGT), a **REJ** reason 1 if it is still
    /// being set up; either carries [`TargetGone::gone`]`(cause, qpn)` (built by the CM
    /// coupling).
    EndConnection {
        /// The connection.
        conn: K,
        /// The TGT QP it sat on.
        qpn: Qpn,
        /// Why the QP went away.
        cause: GoneCause,
    },
    /// Reject a REQ aimed at a gone QP. The CM coupling builds the bytes from the cause:
    /// REJ reason 1 "No QP available" with [`TargetGone::gone`]`(cause, qpn)` as ARI and as
    /// the start of the private data.
    RejectReq {
        /// The connection being set up.
        conn: K,
        /// The TGT QP the REQ named.
        qpn: Qpn,
        /// Why it is gone.
        cause: GoneCause,
    },
    /// Move the QP to ERR now, so nothing more is delivered through it.
    ModifyToError {
        /// The QP.
        qpn: Qpn,
    },
    /// Destroy the deciding party's handle on the QP.
    DestroyQp {
        /// The QP.
        qpn: Qpn,
    },
    /// Keep the QPN out of use (and reject REQs naming it) until `until`.
    QuarantineQpn {
        /// The QP number.
        qpn: Qpn,
        /// End of the quarantine: now + the longest TimeWait of its connections.
        until: Instant,
    },
    /// The quarantine is over: forget the QPN.
    ReleaseQpn {
        /// The QP number.
        qpn: Qpn,
    },
    /// The connection is no longer on the QP (it left by itself; no DREQ needed).
    ForgetConn {
        /// The connection.
        conn: K,
    },
    /// Tell the registered processes that the QP is gone, so they drop their own handles.
    NotifyHolders {
        /// The QP.
        qpn: Qpn,
        /// Why.
        cause: GoneCause,
    },
    /// The QP is kept but nobody owns it any more (any process may adopt or destroy it).
    ReportOrphan {
        /// The QP.
        qpn: Qpn,
    },
    /// The domain is closing but this QP keeps it open until it is destroyed.
    PinDomain {
        /// The QP.
        qpn: Qpn,
    },
}

/// The outcome of one decision.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The QP lives on.
    Kept,
    /// The QP is released now, for this cause.
    Released(GoneCause),
    /// The QP was already gone; the event was answered (REJ) or ignored.
    AlreadyGone(GoneCause),
}

/// [`Verdict`] plus the actions, in execution order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision<K> {
    /// Kept or released.
    pub verdict: Verdict,
    /// What to do, in order.
    pub actions: Vec<PolicyAction<K>>,
}

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

/// The engine: what to do about `event` on the QP described by `facts`.
///
/// # How a decision is made
///
/// 1. The caller updates the QP's facts for the event (the exiting owner is no longer alive,
///    the unregistering process's registration is gone, the disconnected connection's
///    registration is gone, …) and passes the facts *after* that bookkeeping, together with
///    the event.
/// 2. [`decide`] asks whether the QP still has a reason to live under its policy
///    (the [`POLICY_MATRIX`] cell, [`rule`]). If yes, the QP is **kept** and only the event's own consequence is
///    returned (forget the connection that left, report an orphan, pin a closing domain).
/// 3. If not, the QP is **released**: every other connection on it gets
///    [`PolicyAction::EndConnection`] (the kernel CM sends none for an XRC TGT; spec/xrc.md §3.2),
///    registered processes are told ([`PolicyAction::NotifyHolders`]), traffic is stopped
///    ([`PolicyAction::ModifyToError`]) and the QPN is quarantined for the longest TimeWait of
///    its connections ([`PolicyAction::QuarantineQpn`]). With
///    [`PolicyConfig::hold_qp_during_quarantine`] (the default) the QP object itself is kept
///    in ERR until the quarantine ends, so the device cannot hand the number out again
///    (libfabric PR #5016 does the same); [`PolicyAction::DestroyQp`] then comes with
///    [`PolicyEvent::QuarantineExpired`].
/// 4. A QP that is already gone answers a new REQ aimed at it with
///    [`PolicyAction::RejectReq`] (REJ reason 1 + [`TargetGone`]) and ignores every other
///    event, so nothing is ever torn down twice.
pub fn decide<K: Clone + PartialEq>(
    facts: &QpFacts<K>,
    event: &PolicyEvent<K>,
    now: Instant,
    cfg: &PolicyConfig,
) -> Decision<K> {
    let qpn = facts.qpn;
    if let Some(cause) = facts.gone {
        let actions = match event {
            PolicyEvent::ReqReceived { conn } => vec![PolicyAction::RejectReq {
                conn: conn.clone(),
                qpn,
                cause,
            }],
            PolicyEvent::QuarantineExpired => {
                let mut a = Vec::new();
                if facts.held {
                    a.push(PolicyAction::DestroyQp { qpn });
                }
                a.push(PolicyAction::ReleaseQpn { qpn });
                a
            }
            PolicyEvent::PeerDreq { conn } | PolicyEvent::PeerTimeout { conn } => {
                // Crossing DREQs: ours and the peer's. Nothing left to tear down.
                vec![PolicyAction::ForgetConn { conn: conn.clone() }]
            }
            _ => Vec::new(),
        };
        return Decision {
            verdict: Verdict::AlreadyGone(cause),
            actions,
        };
    }

    match survives(facts.policy, event, facts) {
        Ok(()) => {
            let mut actions = Vec::new();
            match event {
                PolicyEvent::PeerDreq { conn } | PolicyEvent::PeerTimeout { conn } => {
                    actions.push(PolicyAction::ForgetConn { conn: conn.clone() });
                }
                PolicyEvent::CreatorExit
                    if facts.policy == OwnershipPolicy::Explicit && !facts.owner_alive =>
                {
                    actions.push(PolicyAction::ReportOrphan { qpn });
                }
                PolicyEvent::DomainClose => actions.push(PolicyAction::PinDomain { qpn }),
                _ => {}
            }
            Decision {
                verdict: Verdict::Kept,
                actions,
            }
        }
        Err(cause) => Decision {
            verdict: Verdict::Released(cause),
            actions: release(facts, event, cause, now, cfg),
        },
    }
}

fn release<K: Clone + PartialEq>(
    f: &QpFacts<K>,
    event: &PolicyEvent<K>,
    cause: GoneCause,
    now: Instant,
    cfg: &PolicyConfig,
) -> Vec<PolicyAction<K>> {
    let qpn = f.qpn;
    let leaving = event.conn();
    let mut a = Vec::new();
    if let Some(conn) = leaving {
        a.push(PolicyAction::ForgetConn { conn: conn.clone() });
    }
    for c in &f.conns {
        if Some(&c.conn) != leaving {
            a.push(PolicyAction::EndConnection {
                conn: c.conn.clone(),
                qpn,
                cause,
            });
        }
    }
    if f.registrations > 0 {
        a.push(PolicyAction::NotifyHolders { qpn, cause });
    }
    let timewait = f
        .conns
        .iter()
        .map(|c| c.timewait)
        .fold(cfg.default_timewait, Duration::max);
    let until = now.checked_add(timewait).unwrap_or(now);
    if f.held {
        a.push(PolicyAction::ModifyToError { qpn });
        if !cfg.hold_qp_during_quarantine {
            a.push(PolicyAction::DestroyQp { qpn });
        }
    }
    a.push(PolicyAction::QuarantineQpn { qpn, until });
    a
}

#[cfg(test)]
mod tests {
    //! One test per cell of the policy × event matrix ([`POLICY_MATRIX`]), on "typical" facts: the
    //! owner alive, two connections c1 and c2 on the QP, the domain open, the QP held, and
    //! for `Shared` one registration that the event may have removed. Then the conditional
    //! variants.
    use super::*;
    use OwnershipPolicy as P;
    use PolicyAction as A;

    const TW1: Duration = Duration::from_millis(300);
    const TW2: Duration = Duration::from_secs(2);

    fn q() -> Qpn {
        Qpn::new(0x4a).unwrap()
    }

    fn facts(policy: P) -> QpFacts<&'static str> {
        QpFacts {
            qpn: q(),
            policy,
            owner_alive: policy != P::Shared,
            registrations: usize::from(policy == P::Shared),
            domain_open: true,
            held: true,
            conns: vec![
                ConnOnQp {
                    conn: "c1",
                    timewait: TW1,
                },
                ConnOnQp {
                    conn: "c2",
                    timewait: TW2,
                },
            ],
            gone: None,
        }
    }

    fn run(
        f: &QpFacts<&'static str>,
        e: PolicyEvent<&'static str>,
    ) -> (Decision<&'static str>, Instant) {
        let now = Instant::now();
        (decide(f, &e, now, &PolicyConfig::default()), now)
    }

    /// Released with both connections DREQed, in ERR, quarantined for the longest TimeWait.
    fn assert_released_all(
        d: &Decision<&'static str>,
        now: Instant,
        cause: GoneCause,
        notify: bool,
    ) {
        assert_eq!(d.verdict, Verdict::Released(cause));
        let mut want = vec![
            A::EndConnection {
                conn: "c1",
                qpn: q(),
                cause,
            },
            A::EndConnection {
                conn: "c2",
                qpn: q(),
                cause,
            },
        ];
        if notify {
            want.push(A::NotifyHolders { qpn: q(), cause });
        }
        want.push(A::ModifyToError { qpn: q() });
        want.push(A::QuarantineQpn {
            qpn: q(),
            until: now + TW2.max(PolicyConfig::default().default_timewait),
        });
        assert_eq!(d.actions, want);
    }

    fn assert_kept(d: &Decision<&'static str>, actions: &[A<&'static str>]) {
        assert_eq!(d.verdict, Verdict::Kept);
        assert_eq!(d.actions, actions);
    }

    // --- owner destroy -------------------------------------------------------------------

    #[test]
    fn explicit_owner_destroy_releases() {
        let (d, now) = run(&facts(P::Explicit), PolicyEvent::OwnerDestroy);
        assert_released_all(&d, now, GoneCause::OwnerDestroyed, false);
    }

    #[test]
    fn domain_bound_owner_destroy_releases() {
        let (d, now) = run(&facts(P::DomainBound), PolicyEvent::OwnerDestroy);
        assert_released_all(&d, now, GoneCause::OwnerDestroyed, false);
    }

    #[test]
    fn process_bound_owner_destroy_releases() {
        let (d, now) = run(&facts(P::ProcessBound), PolicyEvent::OwnerDestroy);
        assert_released_all(&d, now, GoneCause::OwnerDestroyed, false);
    }

    #[test]
    fn shared_owner_destroy_is_an_unregister() {
        // The caller's registration was the last one: released.
        let mut f = facts(P::Shared);
        f.registrations = 0;
        let (d, now) = run(&f, PolicyEvent::OwnerDestroy);
        assert_released_all(&d, now, GoneCause::LastUnregistered, false);
        // Another process is still registered: kept.
        f.registrations = 1;
        let (d, _) = run(&f, PolicyEvent::OwnerDestroy);
        assert_kept(&d, &[]);
    }

    // --- domain close --------------------------------------------------------------------

    #[test]
    fn explicit_domain_close_pins_the_domain() {
        let (d, _) = run(&facts(P::Explicit), PolicyEvent::DomainClose);
        assert_kept(&d, &[A::PinDomain { qpn: q() }]);
    }

    #[test]
    fn domain_bound_domain_close_releases() {
        let mut f = facts(P::DomainBound);
        f.domain_open = false;
        let (d, now) = run(&f, PolicyEvent::DomainClose);
        assert_released_all(&d, now, GoneCause::DomainClosed, false);
    }

    #[test]
    fn process_bound_domain_close_releases() {
        let (d, now) = run(&facts(P::ProcessBound), PolicyEvent::DomainClose);
        assert_released_all(&d, now, GoneCause::DomainClosed, false);
    }

    #[test]
    fn shared_domain_close_releases_and_notifies_holders() {
        let (d, now) = run(&facts(P::Shared), PolicyEvent::DomainClose);
        assert_released_all(&d, now, GoneCause::DomainClosed, true);
    }

    // --- creator exit --------------------------------------------------------------------

    #[test]
    fn explicit_creator_exit_keeps_an_orphan() {
        let mut f = facts(P::Explicit);
        f.owner_alive = false;
        let (d, _) = run(&f, PolicyEvent::CreatorExit);
        assert_kept(&d, &[A::ReportOrphan { qpn: q() }]);
    }

    #[test]
    fn domain_bound_creator_exit_keeps() {
        let mut f = facts(P::DomainBound);
        f.owner_alive = false;
        let (d, _) = run(&f, PolicyEvent::CreatorExit);
        assert_kept(&d, &[]);
    }

    #[test]
    fn process_bound_creator_exit_releases() {
        let mut f = facts(P::ProcessBound);
        f.owner_alive = false;
        let (d, now) = run(&f, PolicyEvent::CreatorExit);
        assert_released_all(&d, now, GoneCause::CreatorExited, false);
    }

    #[test]
    fn shared_creator_exit_drops_its_registration() {
        let mut f = facts(P::Shared);
        f.registrations = 0; // the creator was the only registrant
        let (d, now) = run(&f, PolicyEvent::CreatorExit);
        assert_released_all(&d, now, GoneCause::CreatorExited, false);
        f.registrations = 2; // others registered too
        let (d, _) = run(&f, PolicyEvent::CreatorExit);
        assert_kept(&d, &[]);
    }

    // --- last unregister -----------------------------------------------------------------

    #[test]
    fn explicit_last_unregister_keeps() {
        let mut f = facts(P::Explicit);
        f.registrations = 0;
        let (d, _) = run(&f, PolicyEvent::LastUnregister);
        assert_kept(&d, &[]);
    }

    #[test]
    fn domain_bound_last_unregister_keeps() {
        let mut f = facts(P::DomainBound);
        f.registrations = 0;
        let (d, _) = run(&f, PolicyEvent::LastUnregister);
        assert_kept(&d, &[]);
    }

    #[test]
    fn process_bound_last_unregister_keeps() {
        let mut f = facts(P::ProcessBound);
        f.registrations = 0;
        let (d, _) = run(&f, PolicyEvent::LastUnregister);
        assert_kept(&d, &[]);
    }

    #[test]
    fn shared_last_unregister_releases() {
        let mut f = facts(P::Shared);
        f.registrations = 0;
        let (d, now) = run(&f, PolicyEvent::LastUnregister);
        assert_released_all(&d, now, GoneCause::LastUnregistered, false);
    }

    // --- peer DREQ -----------------------------------------------------------------------

    #[test]
    fn explicit_peer_dreq_keeps() {
        let (d, _) = run(&facts(P::Explicit), PolicyEvent::PeerDreq { conn: "c1" });
        assert_kept(&d, &[A::ForgetConn { conn: "c1" }]);
    }

    #[test]
    fn domain_bound_peer_dreq_keeps() {
        let (d, _) = run(&facts(P::DomainBound), PolicyEvent::PeerDreq { conn: "c1" });
        assert_kept(&d, &[A::ForgetConn { conn: "c1" }]);
    }

    #[test]
    fn process_bound_peer_dreq_keeps_while_creator_lives() {
        let (d, _) = run(
            &facts(P::ProcessBound),
            PolicyEvent::PeerDreq { conn: "c1" },
        );
        assert_kept(&d, &[A::ForgetConn { conn: "c1" }]);
    }

    #[test]
    fn shared_peer_dreq_releases_with_the_last_registration() {
        // c1 held the only (connection-scoped) registration.
        let mut f = facts(P::Shared);
        f.registrations = 0;
        let now = Instant::now();
        let d = decide(
            &f,
            &PolicyEvent::PeerDreq { conn: "c1" },
            now,
            &PolicyConfig::default(),
        );
        assert_eq!(d.verdict, Verdict::Released(GoneCause::PeerLeft));
        assert_eq!(
            d.actions,
            vec![
                A::ForgetConn { conn: "c1" },
                A::EndConnection {
                    conn: "c2",
                    qpn: q(),
                    cause: GoneCause::PeerLeft
                },
                A::ModifyToError { qpn: q() },
                A::QuarantineQpn {
                    qpn: q(),
                    until: now + PolicyConfig::default().default_timewait
                },
            ]
        );
        // Someone else is still registered: kept.
        f.registrations = 1;
        let (d, _) = run(&f, PolicyEvent::PeerDreq { conn: "c1" });
        assert_kept(&d, &[A::ForgetConn { conn: "c1" }]);
    }

    // --- peer timeout --------------------------------------------------------------------

    #[test]
    fn explicit_peer_timeout_keeps() {
        let (d, _) = run(&facts(P::Explicit), PolicyEvent::PeerTimeout { conn: "c2" });
        assert_kept(&d, &[A::ForgetConn { conn: "c2" }]);
    }

    #[test]
    fn domain_bound_peer_timeout_keeps() {
        let (d, _) = run(
            &facts(P::DomainBound),
            PolicyEvent::PeerTimeout { conn: "c2" },
        );
        assert_kept(&d, &[A::ForgetConn { conn: "c2" }]);
    }

    #[test]
    fn process_bound_peer_timeout_keeps() {
        let (d, _) = run(
            &facts(P::ProcessBound),
            PolicyEvent::PeerTimeout { conn: "c2" },
        );
        assert_kept(&d, &[A::ForgetConn { conn: "c2" }]);
    }

    #[test]
    fn shared_peer_timeout_releases_with_the_last_registration() {
        let mut f = facts(P::Shared);
        f.registrations = 0;
        let (d, _) = run(&f, PolicyEvent::PeerTimeout { conn: "c2" });
        assert_eq!(d.verdict, Verdict::Released(GoneCause::PeerLeft));
        assert_eq!(d.actions.first(), Some(&A::ForgetConn { conn: "c2" }));
        assert!(d.actions.contains(&A::EndConnection {
            conn: "c1",
            qpn: q(),
            cause: GoneCause::PeerLeft
        }));
        assert!(!d
            .actions
            .iter()
            .any(|a| matches!(a, A::EndConnection { conn: "c2", .. })));
    }

    // --- keeper crash --------------------------------------------------------------------

    fn crashed(policy: P) -> QpFacts<&'static str> {
        let mut f = facts(policy);
        f.held = false; // the kernel dropped the keeper's handle
        f
    }

    fn assert_keeper_lost(d: &Decision<&'static str>, now: Instant, notify: bool) {
        let cause = GoneCause::KeeperLost;
        assert_eq!(d.verdict, Verdict::Released(cause));
        let mut want = vec![
            A::EndConnection {
                conn: "c1",
                qpn: q(),
                cause,
            },
            A::EndConnection {
                conn: "c2",
                qpn: q(),
                cause,
            },
        ];
        if notify {
            want.push(A::NotifyHolders { qpn: q(), cause });
        }
        // No ModifyToError / DestroyQp: there is no handle left to use.
        want.push(A::QuarantineQpn {
            qpn: q(),
            until: now + TW2.max(PolicyConfig::default().default_timewait),
        });
        assert_eq!(d.actions, want);
    }

    #[test]
    fn explicit_keeper_crash_releases() {
        let (d, now) = run(&crashed(P::Explicit), PolicyEvent::KeeperCrash);
        assert_keeper_lost(&d, now, false);
    }

    #[test]
    fn domain_bound_keeper_crash_releases() {
        let (d, now) = run(&crashed(P::DomainBound), PolicyEvent::KeeperCrash);
        assert_keeper_lost(&d, now, false);
    }

    #[test]
    fn process_bound_keeper_crash_releases() {
        let (d, now) = run(&crashed(P::ProcessBound), PolicyEvent::KeeperCrash);
        assert_keeper_lost(&d, now, false);
    }

    #[test]
    fn shared_keeper_crash_releases_and_notifies() {
        let (d, now) = run(&crashed(P::Shared), PolicyEvent::KeeperCrash);
        assert_keeper_lost(&d, now, true);
    }

    // --- after the QP is gone ------------------------------------------------------------

    #[test]
    fn req_to_a_gone_qp_is_rejected_with_reason_1_and_the_cause() {
        for policy in P::ALL {
            let mut f = facts(policy);
            f.gone = Some(GoneCause::CreatorExited);
            let (d, _) = run(&f, PolicyEvent::ReqReceived { conn: "c9" });
            assert_eq!(d.verdict, Verdict::AlreadyGone(GoneCause::CreatorExited));
            assert_eq!(
                d.actions,
                vec![A::RejectReq {
                    conn: "c9",
                    qpn: q(),
                    cause: GoneCause::CreatorExited,
                }]
            );
            // What the CM coupling sends for it.
            let info = ibcm_mad::xrc::TargetGone::gone(GoneCause::CreatorExited, q());
            assert_eq!(info.reason(), ibcm_mad::RejReason::NoQp);
        }
    }

    #[test]
    fn req_to_a_live_qp_needs_no_action() {
        let (d, _) = run(&facts(P::Shared), PolicyEvent::ReqReceived { conn: "c3" });
        assert_kept(&d, &[]);
    }

    #[test]
    fn quarantine_expiry_destroys_the_held_qp() {
        let mut f = facts(P::Explicit);
        f.gone = Some(GoneCause::OwnerDestroyed);
        let (d, _) = run(&f, PolicyEvent::QuarantineExpired);
        assert_eq!(
            d.actions,
            vec![A::DestroyQp { qpn: q() }, A::ReleaseQpn { qpn: q() }]
        );
        f.held = false;
        let (d, _) = run(&f, PolicyEvent::QuarantineExpired);
        assert_eq!(d.actions, vec![A::ReleaseQpn { qpn: q() }]);
    }

    #[test]
    fn events_on_a_gone_qp_do_not_tear_down_twice() {
        let mut f = facts(P::ProcessBound);
        f.gone = Some(GoneCause::OwnerDestroyed);
        for e in [
            PolicyEvent::OwnerDestroy,
            PolicyEvent::DomainClose,
            PolicyEvent::CreatorExit,
            PolicyEvent::LastUnregister,
            PolicyEvent::KeeperCrash,
        ] {
            let (d, _) = run(&f, e);
            assert_eq!(d.actions, vec![]);
        }
        let (d, _) = run(&f, PolicyEvent::PeerDreq { conn: "c1" });
        assert_eq!(d.actions, vec![A::ForgetConn { conn: "c1" }]);
    }

    #[test]
    fn destroy_now_mode() {
        let cfg = PolicyConfig {
            hold_qp_during_quarantine: false,
            ..PolicyConfig::default()
        };
        let mut f = facts(P::Explicit);
        f.conns.clear();
        let now = Instant::now();
        let d = decide(&f, &PolicyEvent::OwnerDestroy, now, &cfg);
        assert_eq!(
            d.actions,
            vec![
                A::ModifyToError { qpn: q() },
                A::DestroyQp { qpn: q() },
                A::QuarantineQpn {
                    qpn: q(),
                    until: now + cfg.default_timewait
                }
            ]
        );
    }

    /// The table in the docs of [`POLICY_MATRIX`] says what the constant says.
    #[test]
    fn docs_table_matches_the_matrix() {
        let src = include_str!("policy.rs");
        let header = src
            .lines()
            .find(|l| l.starts_with("/// | policy \\ event |"))
            .expect("header row");
        let cols: Vec<&str> = header.split('|').map(str::trim).skip(2).collect();
        let names: Vec<&str> = MatrixEvent::ALL.iter().map(|e| e.name()).collect();
        assert_eq!(&cols[..7], &names[..]);
        let mut rows = 0;
        for p in P::ALL {
            let label = format!("/// | **{p:?}** |");
            let line = src
                .lines()
                .find(|l| l.starts_with(&label))
                .unwrap_or_else(|| panic!("no docs row for {p:?}"));
            let cells: Vec<&str> = line.split('|').map(str::trim).skip(2).collect();
            for (e, cell) in MatrixEvent::ALL.into_iter().zip(&cells) {
                let released = |c: GoneCause| cell.contains(&format!("released (`{}`)", c.text()));
                let conditional = cell.contains("if it was the last");
                match rule(p, e) {
                    Rule::Kept => assert!(
                        !cell.contains("released") && cell.contains("kept"),
                        "{p:?} × {}: {cell}",
                        e.name()
                    ),
                    Rule::Released(c) => {
                        assert!(released(c) && !conditional, "{p:?} × {}: {cell}", e.name())
                    }
                    Rule::ReleasedIfLastRegistration(c) => {
                        assert!(released(c) && conditional, "{p:?} × {}: {cell}", e.name())
                    }
                }
            }
            rows += 1;
        }
        assert_eq!(rows, 4);
    }

    /// Every event that has a column is read from the matrix; the others never end a QP.
    #[test]
    fn survives_reads_the_matrix() {
        for p in P::ALL {
            for regs in [0, 1] {
                let mut f = facts(p);
                f.registrations = regs;
                for e in [
                    PolicyEvent::OwnerDestroy,
                    PolicyEvent::DomainClose,
                    PolicyEvent::CreatorExit,
                    PolicyEvent::LastUnregister,
                    PolicyEvent::PeerDreq { conn: "c1" },
                    PolicyEvent::PeerTimeout { conn: "c1" },
                    PolicyEvent::KeeperCrash,
                    PolicyEvent::ReqReceived { conn: "c3" },
                    PolicyEvent::QuarantineExpired,
                ] {
                    let want = match e.column().map(|c| rule(p, c)) {
                        None | Some(Rule::Kept) => Ok(()),
                        Some(Rule::Released(c)) => Err(c),
                        Some(Rule::ReleasedIfLastRegistration(c)) if regs == 0 => Err(c),
                        Some(Rule::ReleasedIfLastRegistration(_)) => Ok(()),
                    };
                    assert_eq!(survives(p, &e, &f), want, "{p:?} {}", e.name());
                }
            }
        }
    }
}
