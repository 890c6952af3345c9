//! Tests of the engine: one test per cell of the policy × event matrix ([`POLICY_MATRIX`]),
//! on "typical" facts: the owner alive, two connections c1 and c2 on the QP, the domain
//! open, the QP held, and for `Shared` one registration that the event may have removed.
//! Then the conditional variants, and the matrix docs against the constant.

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
fn assert_released_all(d: &Decision<&'static str>, now: Instant, cause: GoneCause, notify: bool) {
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
    let src = include_str!("matrix.rs");
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
