//! The ownership-policy engine: a pure function from (policy, event, facts) to actions.
//!
//! [`decide`] holds every lifetime rule of the crate; [`TgtRegistry`](crate::TgtRegistry)
//! only keeps the facts up to date and executes what `decide` returns. The function reads no
//! clock (time comes in as `now`) and has no state, so each cell of the matrix in the crate
//! docs is one unit test.
//!
//! # How a decision is made
//!
//! 1. The caller updates the QP's facts for the event (the exiting owner is no longer alive,
//!    the unregistering process's registration is gone, the disconnected connection's
//!    registration is gone, …) and passes the facts *after* that bookkeeping, together with
//!    the event.
//! 2. [`decide`] asks whether the QP still has a reason to live under its policy
//!    ([`survives`]). If yes, the QP is **kept** and only the event's own consequence is
//!    returned (forget the connection that left, report an orphan, pin a closing domain).
//! 3. If not, the QP is **released**: every other connection on it gets
//!    [`PolicyAction::EndConnection`] (the kernel CM sends none for an XRC TGT; spec/xrc.md §3.2),
//!    registered processes are told ([`PolicyAction::NotifyHolders`]), traffic is stopped
//!    ([`PolicyAction::ModifyToError`]) and the QPN is quarantined for the longest TimeWait of
//!    its connections ([`PolicyAction::QuarantineQpn`]). With
//!    [`PolicyConfig::hold_qp_during_quarantine`] (the default) the QP object itself is kept
//!    in ERR until the quarantine ends, so the device cannot hand the number out again
//!    (libfabric PR #5016 does the same); [`PolicyAction::DestroyQp`] then comes with
//!    [`PolicyEvent::QuarantineExpired`].
//! 4. A QP that is already gone answers a new REQ aimed at it with
//!    [`PolicyAction::RejectReq`] (REJ reason 1 + [`TargetGone`]) and ignores every other
//!    event, so nothing is ever torn down twice.

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

/// Whether a live QP keeps a reason to live after `event`, or why not.
///
/// # Errors
/// The [`GoneCause`] when the QP must be released.
pub(crate) fn survives<K>(
    policy: OwnershipPolicy,
    event: &PolicyEvent<K>,
    f: &QpFacts<K>,
) -> Result<(), GoneCause> {
    use OwnershipPolicy as P;
    let shared_empty = policy == P::Shared && f.registrations == 0;
    match event {
        PolicyEvent::OwnerDestroy => match policy {
            P::Shared if !shared_empty => Ok(()),
            P::Shared => Err(GoneCause::LastUnregistered),
            _ => Err(GoneCause::OwnerDestroyed),
        },
        PolicyEvent::DomainClose => match policy {
            P::Explicit => Ok(()),
            _ => Err(GoneCause::DomainClosed),
        },
        PolicyEvent::CreatorExit => match policy {
            P::Explicit | P::DomainBound => Ok(()),
            P::ProcessBound => Err(GoneCause::CreatorExited),
            P::Shared if shared_empty => Err(GoneCause::CreatorExited),
            P::Shared => Ok(()),
        },
        PolicyEvent::LastUnregister => {
            if shared_empty {
                Err(GoneCause::LastUnregistered)
            } else {
                Ok(())
            }
        }
        PolicyEvent::PeerDreq { .. } | PolicyEvent::PeerTimeout { .. } => {
            if shared_empty {
                Err(GoneCause::PeerLeft)
            } else {
                Ok(())
            }
        }
        PolicyEvent::KeeperCrash => Err(GoneCause::KeeperLost),
        PolicyEvent::ReqReceived { .. } | PolicyEvent::QuarantineExpired => Ok(()),
    }
}

/// The engine: what to do about `event` on the QP described by `facts` (module docs).
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
    //! One test per cell of the policy × event matrix (crate docs), on "typical" facts: the
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
}
