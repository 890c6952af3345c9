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

mod matrix;
#[cfg(test)]
mod tests;

pub(crate) use matrix::survives;
pub use matrix::{rule, MatrixEvent, Rule, POLICY_MATRIX};

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
    /// Its CM TimeWait (docs/protocol.md §4.4): how long after it ends a stale packet may
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
///    [`PolicyAction::EndConnection`] (the kernel CM sends none for an XRC TGT; docs/xrc.md §3.2),
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
