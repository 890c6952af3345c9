//! `cm-ping --listen --stateless`: the endpoint's stateless mode under pressure
//! (docs/protocol.md §5.12, [`ibcm::rt::Cm::listen_stateless`]), and `--peer-counts`, the
//! listener's established connections per peer, printed when it stops.
//!
//! Under pressure (`--stateless-threshold` half-open entries, default the endpoint's 1024, or
//! always with `--stateless-always`) a REQ is answered from a template at once, with no
//! connection entry: the REP's local QPN comes from the cookie, inside `--stateless-qpns
//! BASE:COUNT` (default [`DEFAULT_QPNS`]: the upper half of the 24-bit space), and its private
//! data is `--accept-data`. The connection reaches cm-ping only once the peer's RTU has
//! established it (`established conn=… stateless`). Below the threshold the listener answers
//! as usual, with QPNs drawn outside that range. XRC REQs are always answered with state.
//!
//! With `--daemon` the node service's endpoint answers statelessly, at its own threshold
//! (so `--stateless-threshold` and `--stateless-always` are refused there).
//!
//! What needs the application before the REP cannot be stateless, so `--stateless` refuses
//! `--reject` and `--accept-delay`, and `--verbs`: a device allocates its QPNs itself, while the cookie chooses the REP's QPN
//! from the range, and cm-ping keeps no pool of QPs covering it.

use std::collections::HashMap;
use std::sync::Mutex;

use anyhow::{bail, Result};
use clap::Args;
use ibcm::proto::{AcceptParams, EndpointConfig, PeerAddr, StatelessAccept};
use ibcm_mad::Qpn;

use crate::qpn::QpnAlloc;

/// The default `--stateless-qpns`: `0x800000:0x7fff00`, the upper half of the QPN space
/// (below the multicast QPN 0xFFFFFF).
pub(crate) const DEFAULT_QPNS: &str = "0x800000:0x7fff00";

/// The `--stateless` options.
#[derive(Debug, Clone, Args)]
pub(crate) struct StatelessArgs {
    /// Listener: answer REQs statelessly while the endpoint is under half-open pressure
    /// (cookie REPs, docs/protocol.md §5.12); the connections arrive once their RTU came.
    #[arg(long, requires = "listen")]
    pub(crate) stateless: bool,
    /// --stateless: the half-open entries at which the stateless answers start (default
    /// the endpoint's, 1024).
    #[arg(long, requires = "stateless")]
    pub(crate) stateless_threshold: Option<usize>,
    /// --stateless: answer every REQ statelessly, pressure or not.
    #[arg(long, requires = "stateless")]
    pub(crate) stateless_always: bool,
    /// --stateless: the QPN range BASE:COUNT the stateless REPs' QPNs come from (hex with 0x
    /// or decimal); the stateful answers draw their QPNs outside it.
    #[arg(long, requires = "stateless", default_value = DEFAULT_QPNS, value_parser = parse_range)]
    pub(crate) stateless_qpns: QpnRange,
    /// Listener: when it stops, print its established connections per peer
    /// (`cm-ping: established now by peer: ADDR=N …`), before the summary line.
    #[arg(long, requires = "listen", conflicts_with = "verbs")]
    pub(crate) peer_counts: bool,
}

/// A range of QPNs, `base .. base + count`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct QpnRange {
    pub(crate) base: u32,
    pub(crate) count: u32,
}

impl QpnRange {
    fn contains(self, q: u32) -> bool {
        q >= self.base && q - self.base < self.count
    }
}

fn num(s: &str) -> Result<u32, String> {
    match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(h) => u32::from_str_radix(h, 16).map_err(|e| e.to_string()),
        None => s
            .parse()
            .map_err(|e: std::num::ParseIntError| e.to_string()),
    }
}

/// `BASE:COUNT`, inside the 24-bit space, clear of QP0, QP1 and the multicast QPN.
fn parse_range(s: &str) -> Result<QpnRange, String> {
    let (b, c) = s.split_once(':').ok_or("expected BASE:COUNT")?;
    let (base, count) = (num(b)?, num(c)?);
    if base < 2 || count == 0 || u64::from(base) + u64::from(count) > 0xff_ffff {
        return Err(format!(
            "{s}: the range must be non-empty, start at 2 or above and end below 0xffffff"
        ));
    }
    Ok(QpnRange { base, count })
}

/// What `--stateless` cannot be combined with (clap cannot name `--verbs`, which lives in
/// another group): a clear error instead of a listener that would not do what was asked.
pub(crate) fn check(
    a: &StatelessArgs,
    verbs: bool,
    reject: bool,
    delay: bool,
    daemon: bool,
) -> Result<()> {
    if !a.stateless {
        return Ok(());
    }
    if verbs {
        bail!(
            "--stateless with --verbs: the stateless REP's QPN is chosen by the cookie from \
             --stateless-qpns, but the device allocates its QPNs itself, and cm-ping keeps no \
             pool of QPs covering that range"
        );
    }
    if reject || delay {
        bail!(
            "--stateless answers a REQ before the application sees it: no --reject or \
             --accept-delay"
        );
    }
    if daemon && (a.stateless_threshold.is_some() || a.stateless_always) {
        bail!(
            "--stateless with --daemon: the threshold is the daemon's endpoint's setting; no \
             --stateless-threshold or --stateless-always"
        );
    }
    Ok(())
}

/// The endpoint settings of `--stateless-threshold` / `--stateless-always`.
pub(crate) fn configure(a: &StatelessArgs, cfg: &mut EndpointConfig) {
    if let Some(n) = a.stateless_threshold {
        cfg.stateless_threshold = n;
    }
    cfg.stateless_always = a.stateless_always;
}

/// The template: `--accept-data` as the REP's private data, QPNs from `--stateless-qpns`.
pub(crate) fn template(a: &StatelessArgs, accept_data: Option<&[u8]>) -> StatelessAccept {
    let mut p = AcceptParams::new(Qpn::masked(0));
    if let Some(d) = accept_data {
        p.private_data = d.to_vec();
    }
    StatelessAccept::new(
        p,
        Qpn::masked(a.stateless_qpns.base),
        a.stateless_qpns.count,
    )
}

/// The QPN of a stateful accept: from `alloc`, outside the stateless range when there is one.
pub(crate) fn stateful_qpn(a: &StatelessArgs, alloc: &QpnAlloc) -> Qpn {
    loop {
        let q = alloc.next();
        // The range is at most the space minus QP0/QP1/multicast: this ends (the allocator
        // is a permutation of the whole space).
        if !a.stateless || !a.stateless_qpns.contains(q.get()) {
            return q;
        }
    }
}

/// The listener's established connections per peer (`--peer-counts`).
#[derive(Debug, Default)]
pub(crate) struct PeerCounts(Mutex<HashMap<PeerAddr, u64>>);

impl PeerCounts {
    /// A connection with `peer` is established.
    pub(crate) fn up(&self, peer: PeerAddr) {
        if let Ok(mut m) = self.0.lock() {
            *m.entry(peer).or_default() += 1;
        }
    }

    /// A connection with `peer` ended.
    pub(crate) fn down(&self, peer: PeerAddr) {
        if let Ok(mut m) = self.0.lock() {
            if let Some(n) = m.get_mut(&peer) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    m.remove(&peer);
                }
            }
        }
    }

    /// `cm-ping: established now by peer: ADDR=N …` (sorted), or `… by peer: none`.
    pub(crate) fn line(&self) -> String {
        let mut v: Vec<(PeerAddr, u64)> = self
            .0
            .lock()
            .map(|m| m.iter().map(|(p, n)| (*p, *n)).collect())
            .unwrap_or_default();
        v.sort();
        if v.is_empty() {
            return "cm-ping: established now by peer: none".into();
        }
        let parts: Vec<String> = v.iter().map(|(p, n)| format!("{p}={n}")).collect();
        format!("cm-ping: established now by peer: {}", parts.join(" "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_parse_and_are_bounded() {
        assert_eq!(
            parse_range(DEFAULT_QPNS),
            Ok(QpnRange {
                base: 0x80_0000,
                count: 0x7f_ff00
            })
        );
        assert_eq!(
            parse_range("4096:256"),
            Ok(QpnRange {
                base: 4096,
                count: 256
            })
        );
        assert!(parse_range("1:10").is_err());
        assert!(parse_range("0x10:0").is_err());
        assert!(parse_range("0xff0000:0x10000").is_err());
        assert!(parse_range("0x10").is_err());
    }

    #[test]
    fn stateful_qpns_avoid_the_stateless_range() {
        let a = StatelessArgs {
            stateless: true,
            stateless_threshold: None,
            stateless_always: false,
            stateless_qpns: parse_range(DEFAULT_QPNS).unwrap_or(QpnRange { base: 2, count: 1 }),
            peer_counts: false,
        };
        let alloc = QpnAlloc::new();
        // Outside 0x800000 .. 0xffff00: below it, or in the 254 QPNs above it.
        for _ in 0..100_000 {
            let q = stateful_qpn(&a, &alloc).get();
            assert!(
                q < 0x80_0000 || (0xff_ff00..0xff_ffff).contains(&q),
                "{q:#x}"
            );
        }
    }

    #[test]
    fn peer_counts_follow_ups_and_downs() {
        let c = PeerCounts::default();
        assert_eq!(c.line(), "cm-ping: established now by peer: none");
        let a = PeerAddr::Udp("10.0.0.1:4791".parse().unwrap_or(([0, 0, 0, 0], 0).into()));
        let b = PeerAddr::Udp("10.0.0.2:4791".parse().unwrap_or(([0, 0, 0, 0], 0).into()));
        c.up(b);
        c.up(a);
        c.up(a);
        c.down(b);
        assert_eq!(
            c.line(),
            "cm-ping: established now by peer: 10.0.0.1:4791=2"
        );
    }
}
