//! What [`Cm::stats`](super::Cm::stats) returns: the endpoint's counters, the transport's, and
//! the driver's; and the rate limit of the driver's log lines.

use std::fmt::Write as _;

use crate::proto::{DropReason, Stats};

/// Counters of a [`DatagramTransport`](super::DatagramTransport): datagrams it dropped before
/// the endpoint saw them, by reason, and others it keeps.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TransportStats {
    /// Datagrams received (including the dropped ones).
    pub rx: u64,
    /// Datagrams sent.
    pub tx: u64,
    /// Dropped datagrams by reason (`snake_case` names, distinct from the core's
    /// [`DropReason`] names), e.g. `("bad_icrc", 3)`.
    pub dropped: Vec<(&'static str, u64)>,
    /// Other counters (not drops), e.g. `("icrc_unverified", 5)`; the UDP transport's
    /// `recv_calls` and `send_calls` count its system calls that moved datagrams (`rx` and
    /// `tx` divided by them: datagrams per call).
    pub other: Vec<(&'static str, u64)>,
}

impl TransportStats {
    /// Every counter name the transports of this crate use ([`UdpTransport`](super::UdpTransport),
    /// [`UmadTransport`](super::UmadTransport)), and the two the driver adds to
    /// [`Cm::stats`](super::Cm::stats): `req_backlog_full`, requests (REQ, SIDR_REQ) it dropped
    /// before the endpoint saw them because its backlog of requests was full (a flood), and
    /// `send_error`, MADs whose send call failed (not handed to the network; `send_failed`
    /// counts those the umad kernel module took and then reported failed).
    pub const NAMES: [&'static str; 15] = [
        "bad_icrc",
        "not_mad",
        "icrc_unverified",
        "short_record",
        "neigh_unresolved",
        "held_send_error",
        "send_failed",
        "neigh_held",
        "write_stalls",
        "recv_calls",
        "send_calls",
        "req_backlog_full",
        "send_error",
        "data",
        "data_dropped",
    ];

    /// `name` as one of [`TransportStats::NAMES`].
    pub fn static_name(name: &str) -> Option<&'static str> {
        Self::NAMES.iter().copied().find(|n| *n == name)
    }
}

/// The counters of an endpoint run by [`Cm`](super::Cm): every drop, in the core or in the
/// transport, by reason.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CmStats {
    /// The sans-IO endpoint's counters (its drops by [`DropReason`]).
    pub endpoint: Stats,
    /// The transport's counters (its drops: bad ICRC, not a MAD, …).
    pub transport: TransportStats,
    /// Connections closed (each connection once, whatever ended it).
    pub closed: u64,
    /// Log lines of the driver suppressed by its rate limit (the core's are in
    /// [`Stats::log_suppressed`]).
    pub log_suppressed: u64,
    /// Connections in the endpoint's table now (all states).
    pub connections: usize,
    /// Passive connections not yet established, now.
    pub half_open: usize,
    /// Established connections (counted against the limits), now.
    pub established_now: usize,
}

impl CmStats {
    /// Every drop by reason: the core's ([`DropReason::name`]) then the transport's, zeros
    /// included.
    pub fn dropped(&self) -> Vec<(&'static str, u64)> {
        let mut v: Vec<(&'static str, u64)> = DropReason::ALL
            .iter()
            .map(|&r| (r.name(), self.endpoint.dropped(r)))
            .collect();
        v.extend(self.transport.dropped.iter().copied());
        v
    }

    /// All drops.
    pub fn dropped_total(&self) -> u64 {
        self.dropped().iter().map(|(_, n)| n).sum()
    }

    /// Every counter as `(name, value)`, in [`to_json`](Self::to_json)'s order: `established`,
    /// `closed`, `rejected` (the REJs this endpoint sent), then every drop by reason as
    /// `dropped.<reason>` ([`dropped`](Self::dropped)), then `rej_received`, `timeouts`, the
    /// other [`Stats::counters`] names in their order (`log_suppressed` the core's and the
    /// driver's together), the gauges `connections`, `half_open`, `established_now`,
    /// `transport_rx`/`transport_tx` and the transport's other counters.
    pub fn counters(&self) -> Vec<(String, u64)> {
        let e = &self.endpoint;
        let head = [
            ("established", e.established),
            ("closed", self.closed),
            ("rejected", e.rej_sent),
        ];
        let after_drops = [("rej_received", e.rej_received), ("timeouts", e.timeouts)];
        // Every other counter of the core, in its order (`rej_sent` is `rejected`).
        let rest = e
            .counters()
            .into_iter()
            .filter(|(k, _)| {
                !matches!(*k, "established" | "rej_sent" | "rej_received" | "timeouts")
            })
            .map(|(k, v)| match k {
                "log_suppressed" => (k, v + self.log_suppressed),
                _ => (k, v),
            });
        let gauges = [
            ("connections", self.connections as u64),
            ("half_open", self.half_open as u64),
            ("established_now", self.established_now as u64),
            ("transport_rx", self.transport.rx),
            ("transport_tx", self.transport.tx),
        ];
        let named = |(k, v): (&str, u64)| (k.to_string(), v);
        head.into_iter()
            .map(named)
            .chain(
                self.dropped()
                    .into_iter()
                    .map(|(k, v)| (format!("{DROPPED}{k}"), v)),
            )
            .chain(after_drops.into_iter().chain(rest).chain(gauges).map(named))
            .chain(self.transport.other.iter().copied().map(named))
            .collect()
    }

    /// The counters as one line of JSON:
    /// `{"established":…,"closed":…,"rejected":…,"dropped":{"<reason>":n,…},…}`: the
    /// [`counters`](Self::counters), the `dropped.` ones as one object.
    pub fn to_json(&self) -> String {
        let mut s = String::from("{");
        let mut in_drops = false;
        for (i, (k, v)) in self.counters().into_iter().enumerate() {
            let drop = k.strip_prefix(DROPPED);
            let sep = match (in_drops, drop.is_some()) {
                (false, true) => "\"dropped\":{",
                (true, false) => "}",
                _ => "",
            };
            if i > 0 && !(in_drops && drop.is_none()) {
                s.push(',');
            }
            s.push_str(sep);
            if in_drops && drop.is_none() {
                s.push(',');
            }
            in_drops = drop.is_some();
            let _ = write!(s, "\"{}\":{v}", drop.unwrap_or(&k));
        }
        if in_drops {
            s.push('}');
        }
        s.push('}');
        s
    }
}

/// The prefix of the drop counters' names in [`CmStats::counters`].
const DROPPED: &str = "dropped.";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_has_the_keys_in_order_and_every_drop_reason() {
        let mut st = CmStats::default();
        st.endpoint.established = 3;
        st.endpoint.rej_sent = 2;
        st.closed = 1;
        st.endpoint.dropped[DropReason::WrongPeer as usize] = 7;
        st.transport.dropped = vec![("bad_icrc", 4), ("not_mad", 5)];
        st.transport.other = vec![("icrc_unverified", 6)];
        let j = st.to_json();
        assert!(
            j.starts_with("{\"established\":3,\"closed\":1,\"rejected\":2,\"dropped\":{"),
            "{j}"
        );
        assert!(j.contains("\"wrong_peer\":7"), "{j}");
        assert!(j.contains("\"bad_icrc\":4,\"not_mad\":5}"), "{j}");
        assert!(j.contains("\"icrc_unverified\":6}"), "{j}");
        assert_eq!(st.dropped_total(), 16);
        assert_eq!(st.dropped().len(), DropReason::ALL.len() + 2);
    }

    /// Every counter of the core is in the line once (`rej_sent` as `rejected`): a counter
    /// added to the table needs no edit here.
    #[test]
    fn json_names_every_core_counter_once() {
        let st = CmStats::default();
        let j = st.to_json();
        for (k, _) in st.endpoint.counters() {
            let key = if k == "rej_sent" { "rejected" } else { k };
            assert_eq!(j.matches(&format!("\"{key}\":")).count(), 1, "{key}: {j}");
        }
    }
}
