//! Runs the `xrc_policies` example's scenarios (its `demo.rs`) so CI proves the
//! demonstration works: every policy over ibcm's simulator and over RoCEv2/UDP on loopback,
//! with the same wire outcome on both.
#![cfg(feature = "cm")]
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

#[allow(dead_code, unreachable_pub)]
#[path = "../examples/xrc_policies/demo.rs"]
mod demo;

use ibcm_xrc::OwnershipPolicy as P;

/// (policy, established, closed by a target DREQ, REJ 1 + target gone, initiator DREQs).
const EXPECTED: [(P, u32, u32, u32, u32); 4] = [
    (P::Explicit, 7, 2, 1, 1),
    (P::DomainBound, 6, 5, 1, 1),
    (P::ProcessBound, 7, 5, 1, 1),
    (P::Shared, 7, 3, 2, 3),
];

fn check(p: &demo::Played) {
    let (_, est, dreq, rej, ini) = EXPECTED.iter().find(|e| e.0 == p.policy).unwrap();
    let c = p.counts;
    assert_eq!(
        (
            c.established,
            c.gone_by_dreq,
            c.gone_by_rej,
            c.ini_disconnects
        ),
        (*est, *dreq, *rej, *ini),
        "{} [{}]\n{}",
        p.policy,
        p.transport,
        p.text
    );
    assert!(
        p.text
            .contains("REJ 1 (no QP available) ARI 58 52 43 01 01"),
        "{}",
        p.text
    );
    assert!(p.text.contains("target gone"), "{}", p.text);
}

#[test]
fn every_policy_on_the_simulator() {
    let all = demo::run(demo::Transports::Sim, |_| {}).unwrap();
    assert_eq!(all.len(), 4);
    for p in &all {
        check(p);
    }
    // Deterministic: a second run prints the same timeline.
    let again = demo::play(P::ProcessBound, false).unwrap();
    assert_eq!(again.text, all[2].text);
    // The timeline names who did what.
    let t = &all[0].text;
    assert!(
        t.contains("creates TGT QP 0x000048 [explicit], creator t1"),
        "{t}"
    );
    assert!(
        t.contains("DREQ A→t1 (TGT QP 0x000048: owner destroyed it)"),
        "{t}"
    );
    assert!(t.contains("TGT QP 0x000048: quarantine over"), "{t}");
}

#[test]
fn every_policy_over_udp_matches_the_simulator() {
    for (policy, _) in demo::POLICIES {
        let udp = demo::play(policy, true).unwrap();
        check(&udp);
        let sim = demo::play(policy, false).unwrap();
        assert_eq!(udp.counts, sim.counts, "{policy}");
    }
}
