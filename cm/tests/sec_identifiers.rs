//! Finding 3 of issue 12: identifiers an off-path peer cannot guess.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

mod sec_common;

use std::collections::HashSet;

use ibcm::proto::*;
use ibcm_mad::*;
use sec_common::*;

/// The listener's comm IDs for `n` REQs in a row, in allocation order.
fn listener_ids(seed: u64, n: u32) -> Vec<u32> {
    let mut p = Pair::new(EndpointConfig {
        rng_seed: Some(seed),
        ..Default::default()
    });
    let mut ids = Vec::new();
    for i in 0..n {
        let src = addr(&format!("192.0.2.{}:4791", 1 + i % 200));
        p.l.handle_datagram(p.now, src, &hostile_req(0x100 + i, 0xbad, 0x10 + i, 20, 15));
        while let Some(ev) = p.l.poll_event() {
            ids.push(ev.conn.0);
        }
    }
    ids
}

/// Finding 3: consecutive local comm IDs differed by `2^k − 1` (a counter XOR a fixed
/// operand), so one observed ID gave the next within 32 guesses. Now they come from a keyed
/// permutation: neither their XOR nor their difference repeats, and they are still unique.
#[test]
fn consecutive_comm_ids_show_no_pattern() {
    let ids = listener_ids(5, 1000);
    assert_eq!(ids.len(), 1000);
    let unique: HashSet<u32> = ids.iter().copied().collect();
    assert_eq!(unique.len(), ids.len(), "IDs repeat");
    let xors: HashSet<u32> = ids.windows(2).map(|w| w[0] ^ w[1]).collect();
    let diffs: HashSet<u32> = ids.windows(2).map(|w| w[1].wrapping_sub(w[0])).collect();
    assert!(
        xors.len() > 990,
        "only {} distinct XORs of consecutive IDs",
        xors.len()
    );
    assert!(
        diffs.len() > 990,
        "only {} distinct differences",
        diffs.len()
    );
    // No XOR of the form 2^k − 1 dominates.
    let low_masks = ids
        .windows(2)
        .filter(|w| (w[0] ^ w[1]).wrapping_add(1).is_power_of_two())
        .count();
    assert!(
        low_masks < 5,
        "{low_masks} consecutive pairs differ by 2^k − 1"
    );
    // Deterministic under a fixed seed, different under another.
    assert_eq!(listener_ids(5, 50), ids[..50].to_vec());
    assert_ne!(listener_ids(6, 50), ids[..50].to_vec());
}

/// Finding 3: an attacker learns one of the listener's comm IDs from a connection of its
/// own, then spoofs a REQ from a victim's address and sends the RTUs that the old allocator
/// made likely (the observed ID XOR `2^k − 1`, ± 1..32), both from the victim's (spoofed)
/// address and from its own. None may establish the spoofed connection.
#[test]
fn spoofed_req_with_guessed_rtus_cannot_establish() {
    let mut p = Pair::new(EndpointConfig::default());
    let me = addr("203.0.113.66:4791");
    let victim = addr("198.51.100.7:4791");
    // Our own connection: the REP reveals one listener comm ID.
    p.l.handle_datagram(p.now, me, &hostile_req(0x1111, 0x66, 0x66, 20, 15));
    let out = p.l_step();
    let seen = out
        .iter()
        .find_map(|t| match parse(&t.mad) {
            CmMessage::Rep(r) if t.to == me => Some(r.local_comm_id.0),
            _ => None,
        })
        .unwrap();
    // The spoofed REQ; its REP goes to the victim, the attacker never sees it.
    p.l.handle_datagram(p.now, victim, &hostile_req(0x2222, 0x77, 0x77, 20, 15));
    let _ = p.l_step();
    let mut guesses: Vec<u32> = (1..=32).map(|k| seen ^ ((1u64 << k) - 1) as u32).collect();
    guesses.extend((1..=32u32).map(|d| seen.wrapping_add(d)));
    guesses.extend((1..=32u32).map(|d| seen.wrapping_sub(d)));
    for from in [victim, me] {
        for &g in &guesses {
            p.l.handle_datagram(p.now, from, &rtu(0x2222, g));
        }
    }
    let _ = p.l_step();
    assert_eq!(
        p.l.stats().established,
        0,
        "a blind RTU established a connection"
    );
}

/// Finding 3: `random_psn` gives 24-bit PSNs that differ call to call and are reproducible
/// under a fixed seed.
#[test]
fn random_psns() {
    let mk = || {
        Endpoint::new(EndpointConfig {
            rng_seed: Some(3),
            ..Default::default()
        })
    };
    let (mut a, mut b) = (mk(), mk());
    let pa: Vec<Psn> = (0..64).map(|_| a.random_psn()).collect();
    let pb: Vec<Psn> = (0..64).map(|_| b.random_psn()).collect();
    assert_eq!(pa, pb);
    let distinct: HashSet<u32> = pa.iter().map(|p| p.get()).collect();
    assert!(distinct.len() > 60);
    assert!(pa.iter().all(|p| p.get() < 1 << 24));
}
