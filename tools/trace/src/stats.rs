//! `cm-trace --stats`: connection and message counts, latency percentiles, per Service ID.
//!
//! Connections are counted by comm-ID pair (one [`Conn`] each), not by packet. Latencies are
//! kept exactly up to [`EXACT_SAMPLES`] samples, then in a log-linear histogram with 64
//! sub-buckets per power of two (relative error below 1.6 %), so memory stays bounded on any
//! capture. Per-Service-ID rows are kept for at most [`MAX_SERVICES`] Service IDs; later ones
//! are summed in an "other" row.

use std::collections::BTreeMap;
use std::time::Duration;

use ibcm_mad::{AttrId, RejReason};

use crate::conn::{Conn, ConnKind, Outcome, Verdict};
use crate::hash::FastMap;
use crate::trace::NonCm;

/// Samples kept exactly before switching to the histogram.
pub(crate) const EXACT_SAMPLES: usize = 4096;
/// Largest number of Service IDs with their own row.
pub(crate) const MAX_SERVICES: usize = 1024;

const SUB_BITS: u32 = 6;
const SUB: usize = 1 << SUB_BITS;
const GROUPS: usize = 64 - SUB_BITS as usize + 1;

/// Latency samples (nanoseconds) with percentiles.
#[derive(Debug, Clone, Default)]
pub struct Latency {
    exact: Vec<u64>,
    hist: Option<Box<[u64]>>,
    count: u64,
    max: u64,
    sum: u128,
}

fn bucket(v: u64) -> usize {
    if v < SUB as u64 {
        return v as usize;
    }
    let msb = 63 - v.leading_zeros();
    let shift = msb - SUB_BITS;
    let group = (shift + 1) as usize;
    let sub = ((v >> shift) as usize) & (SUB - 1);
    group * SUB + sub
}

/// The upper bound of a histogram bucket (the value reported for it).
fn bucket_value(b: usize) -> u64 {
    let group = b / SUB;
    let sub = (b % SUB) as u64;
    if group == 0 {
        return sub;
    }
    let shift = (group - 1) as u32;
    ((SUB as u64 + sub) << shift).saturating_add((1u64 << shift).saturating_sub(1))
}

impl Latency {
    /// Adds a sample.
    pub fn add(&mut self, d: Duration) {
        let ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        self.count += 1;
        self.max = self.max.max(ns);
        self.sum += u128::from(ns);
        if let Some(h) = &mut self.hist {
            if let Some(c) = h.get_mut(bucket(ns)) {
                *c += 1;
            }
            return;
        }
        self.exact.push(ns);
        if self.exact.len() > EXACT_SAMPLES {
            let mut h = vec![0u64; GROUPS * SUB].into_boxed_slice();
            for &v in &self.exact {
                if let Some(c) = h.get_mut(bucket(v)) {
                    *c += 1;
                }
            }
            self.exact = Vec::new();
            self.hist = Some(h);
        }
    }

    /// Merges another set of samples.
    pub fn merge(&mut self, other: &Latency) {
        match &other.hist {
            None => {
                for &v in &other.exact {
                    self.add(Duration::from_nanos(v));
                }
            }
            Some(oh) => {
                // Force our own histogram, then add bucket counts.
                if self.hist.is_none() {
                    let mut h = vec![0u64; GROUPS * SUB].into_boxed_slice();
                    for &v in &self.exact {
                        if let Some(c) = h.get_mut(bucket(v)) {
                            *c += 1;
                        }
                    }
                    self.exact = Vec::new();
                    self.hist = Some(h);
                }
                if let Some(h) = &mut self.hist {
                    for (a, b) in h.iter_mut().zip(oh.iter()) {
                        *a += b;
                    }
                }
                self.count += other.count;
                self.max = self.max.max(other.max);
                self.sum += other.sum;
            }
        }
    }

    /// Number of samples.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// Largest sample.
    pub fn max(&self) -> Option<Duration> {
        (self.count > 0).then(|| Duration::from_nanos(self.max))
    }

    /// Mean.
    pub fn mean(&self) -> Option<Duration> {
        let n = u128::from(self.count);
        (n > 0).then(|| Duration::from_nanos(u64::try_from(self.sum / n).unwrap_or(u64::MAX)))
    }

    /// The `p`-th percentile (nearest rank; `p` in 0..=100).
    pub fn percentile(&self, p: f64) -> Option<Duration> {
        if self.count == 0 {
            return None;
        }
        let rank = ((p / 100.0) * self.count as f64).ceil().max(1.0) as u64;
        let rank = rank.min(self.count);
        match &self.hist {
            None => {
                let mut v = self.exact.clone();
                v.sort_unstable();
                let idx = usize::try_from(rank - 1).unwrap_or(0);
                v.get(idx).map(|&ns| Duration::from_nanos(ns))
            }
            Some(h) => {
                let mut seen = 0u64;
                for (b, &c) in h.iter().enumerate() {
                    seen += c;
                    if seen >= rank {
                        return Some(Duration::from_nanos(bucket_value(b).min(self.max)));
                    }
                }
                self.max()
            }
        }
    }
}

/// Connection counts and latencies (the whole capture, or one Service ID).
///
/// Established, rejected, timed out, waiting and closed count only attempted connections
/// (REQ in the capture), so none exceeds `attempted`; connections without their REQ are only
/// counted in `partial` (their retransmissions, duplicates and MRAs still count). A
/// connection evicted from a full table is counted once, and not as waiting.
#[derive(Debug, Clone, Default)]
pub struct ConnStats {
    /// Connections whose REQ is in the capture.
    pub attempted: u64,
    /// Connections that reached ESTABLISHED.
    pub established: u64,
    /// Rejected connections by REJ reason.
    pub rejected: BTreeMap<u16, u64>,
    /// Connections whose request timed out (REQ, REP or DREQ unanswered).
    pub timed_out: u64,
    /// Connections still waiting for an answer when the capture ended.
    pub waiting: u64,
    /// Connections whose REQ is not in the capture.
    pub partial: u64,
    /// Connections closed by DREQ/DREP.
    pub closed: u64,
    /// XRC connections.
    pub xrc: u64,
    /// Retransmitted messages (repeats in a new packet: new BTH PSN).
    pub retransmissions: u64,
    /// The same packet captured twice (same BTH PSN): merged captures, not retransmissions.
    pub duplicates: u64,
    /// MRAs.
    pub mras: u64,
    /// REQ → RTU.
    pub setup: Latency,
    /// DREQ → DREP.
    pub teardown: Latency,
    /// Setups (REQ → RTU) slower than [`SLOW`].
    pub slow_setups: u64,
    /// Teardowns (DREQ → DREP) slower than [`SLOW`].
    pub slow_teardowns: u64,
}

/// A setup or teardown slower than this is flagged (`--ladder`, `--stats`): the kernel CM
/// answers in microseconds to milliseconds; seconds mean retries, an MRA'd slow consumer, or
/// a peer that is gone.
pub(crate) const SLOW: Duration = Duration::from_secs(1);

impl ConnStats {
    fn add(&mut self, c: &Conn) {
        if c.req.is_some() {
            self.attempted += 1;
        } else {
            // Its REQ is not in the capture (or it is the rest of a connection whose tracking
            // stopped): counted apart, so that established, rejected, timed out and closed
            // never exceed attempted.
            self.partial += 1;
            self.retransmissions += u64::from(c.retransmissions);
            self.duplicates += u64::from(c.duplicates);
            self.mras += u64::from(c.mras);
            if let Some(d) = c.teardown_latency() {
                self.teardown.add(d);
                self.slow_teardowns += u64::from(d > SLOW);
            }
            return;
        }
        if c.established() {
            self.established += 1;
        }
        if c.is_xrc() {
            self.xrc += 1;
        }
        match c.outcome {
            Outcome::Rejected { reason, .. } => {
                *self.rejected.entry(reason.raw()).or_default() += 1;
            }
            Outcome::TimedOut { .. } => self.timed_out += 1,
            // An evicted connection is not waiting: its tracking stopped early.
            Outcome::Waiting { .. } if c.evicted => {}
            Outcome::Waiting { .. } => self.waiting += 1,
            Outcome::Closed { .. } => self.closed += 1,
            Outcome::Established | Outcome::Resolved { .. } | Outcome::Partial => {}
        }
        self.retransmissions += u64::from(c.retransmissions);
        self.duplicates += u64::from(c.duplicates);
        self.mras += u64::from(c.mras);
        if let Some(d) = c.setup_latency() {
            self.setup.add(d);
            self.slow_setups += u64::from(d > SLOW);
        }
        if let Some(d) = c.teardown_latency() {
            self.teardown.add(d);
            self.slow_teardowns += u64::from(d > SLOW);
        }
    }

    /// Rejected connections, all reasons.
    pub fn rejected_total(&self) -> u64 {
        self.rejected.values().sum()
    }

    fn merge(&mut self, o: &ConnStats) {
        self.slow_setups += o.slow_setups;
        self.slow_teardowns += o.slow_teardowns;
        self.attempted += o.attempted;
        self.established += o.established;
        for (k, v) in &o.rejected {
            *self.rejected.entry(*k).or_default() += v;
        }
        self.timed_out += o.timed_out;
        self.waiting += o.waiting;
        self.partial += o.partial;
        self.closed += o.closed;
        self.xrc += o.xrc;
        self.retransmissions += o.retransmissions;
        self.duplicates += o.duplicates;
        self.mras += o.mras;
        self.setup.merge(&o.setup);
        self.teardown.merge(&o.teardown);
    }
}

/// SIDR exchange counts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SidrStats {
    /// SIDR_REQ exchanges.
    pub requests: u64,
    /// Answered with status 0.
    pub resolved: u64,
    /// Answered with another status.
    pub failed: u64,
    /// Unanswered.
    pub unanswered: u64,
}

/// Most PathRecord exchanges that served no connection listed by `--stats` (the others are
/// counted).
pub(crate) const MAX_SA_LISTED: usize = 32;

/// Subnet Administration traffic: SA MADs, PathRecord exchanges and the REQs they served.
#[derive(Debug, Clone, Default)]
pub struct SaStats {
    /// SA MADs (any attribute).
    pub mads: u64,
    /// PathRecord exchanges (a query, its answer, or both).
    pub exchanges: u64,
    /// Exchanges whose query is in the capture.
    pub queries: u64,
    /// Queries sent again with the same TID before their answer.
    pub query_resends: u64,
    /// Exchanges without an answer.
    pub unanswered: u64,
    /// Answers with a non-zero status.
    pub failed: u64,
    /// PathRecords in the answers.
    pub records: u64,
    /// Answers paired with their query by TID bits 31–0 only.
    pub tid_low32: u64,
    /// Answers seen again (same TID).
    pub repeats: u64,
    /// RMPP ACK / STOP / ABORT MADs.
    pub rmpp_control: u64,
    /// Answered exchanges that served at least one connection.
    pub served: u64,
    /// Answered exchanges (status 0) that served none.
    pub served_none: u64,
    /// Connections whose REQ follows an SA PathRecord (primary or alternate path).
    pub reqs_following: u64,
    /// Among them, those whose REQ disagrees with the record.
    pub reqs_differing: u64,
    /// The exchanges that served no connection (unanswered, failed, or answered and unused),
    /// at most [`MAX_SA_LISTED`]: a one-line description and the JSON object of each.
    pub(crate) listed: Vec<(String, String)>,
    /// Such exchanges beyond [`MAX_SA_LISTED`].
    pub not_listed: u64,
}

impl SaStats {
    /// Counts one finished exchange.
    pub(crate) fn add_exchange(&mut self, x: &crate::conn::Exchange) {
        self.exchanges += 1;
        self.queries += u64::from(x.query.is_some());
        self.tid_low32 += u64::from(x.tid_low);
        match x.answer {
            None => self.unanswered += 1,
            Some(a) if a.status != 0 => self.failed += 1,
            Some(a) => {
                self.records += u64::from(a.records);
                if x.served > 0 {
                    self.served += 1;
                } else {
                    self.served_none += 1;
                }
            }
        }
        if x.served == 0 {
            if self.listed.len() < MAX_SA_LISTED {
                let mut json = Vec::new();
                let mut o = crate::render::Obj::new(&mut json);
                crate::sa::view::exchange_members(&mut o, x);
                o.close();
                self.listed.push((
                    crate::sa::view::exchange_brief(x),
                    String::from_utf8_lossy(&json).into_owned(),
                ));
            } else {
                self.not_listed += 1;
            }
        }
    }

    /// Counts the tracker's MAD counters of one file.
    pub(crate) fn add_counts(&mut self, c: &crate::conn::SaCounts) {
        self.mads += c.mads;
        self.query_resends += c.query_resends;
        self.repeats += c.repeats;
        self.rmpp_control += c.rmpp_control;
    }

    fn add_conn(&mut self, c: &Conn) {
        if c.sa.is_some() {
            self.reqs_following += 1;
            self.reqs_differing += u64::from(c.sa_differs());
        }
    }

    fn merge(&mut self, o: &SaStats) {
        self.mads += o.mads;
        self.exchanges += o.exchanges;
        self.queries += o.queries;
        self.query_resends += o.query_resends;
        self.unanswered += o.unanswered;
        self.failed += o.failed;
        self.records += o.records;
        self.tid_low32 += o.tid_low32;
        self.repeats += o.repeats;
        self.rmpp_control += o.rmpp_control;
        self.served += o.served;
        self.served_none += o.served_none;
        self.reqs_following += o.reqs_following;
        self.reqs_differing += o.reqs_differing;
        for l in &o.listed {
            if self.listed.len() < MAX_SA_LISTED {
                self.listed.push(l.clone());
            } else {
                self.not_listed += 1;
            }
        }
        self.not_listed += o.not_listed;
    }
}

/// The data path over all connections (RC traffic on their QPNs).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DataTotals {
    /// The capture had RC traffic (on any QP).
    pub capture_has_rc: bool,
    /// Connections with at least one packet.
    pub connections: u64,
    /// Packets.
    pub packets: u64,
    /// Bytes on the wire.
    pub bytes: u64,
    /// NAKs (RNR NAKs included).
    pub naks: u64,
    /// RNR NAKs.
    pub rnr_naks: u64,
    /// Request packets resent.
    pub retransmissions: u64,
    /// PSN gaps.
    pub psn_gaps: u64,
    /// CNPs.
    pub cnps: u64,
    /// ECN Congestion Experienced marks.
    pub ecn_ce: u64,
    /// Established connections by verdict: data flowed.
    pub ok: u64,
    /// Established but broken (NAKs or retransmissions).
    pub broken: u64,
    /// Established, no data.
    pub no_data: u64,
    /// XRC requests counted by their XRC SRQ number.
    pub srq_packets: u64,
    /// SIDR: the capture had UD traffic (not to QP0/QP1).
    pub capture_has_ud: bool,
    /// SIDR: UD packets to and from the QPs SIDR exchanges resolved.
    pub ud_packets: u64,
    /// SIDR: their bytes.
    pub ud_bytes: u64,
    /// SIDR: UD SENDs to a resolved QP under another Q_Key.
    pub qkey_mismatches: u64,
}

impl DataTotals {
    fn add(&mut self, c: &Conn) {
        let Some(d) = c.data.as_deref() else {
            return;
        };
        if c.kind == ConnKind::Sidr {
            self.capture_has_ud |= d.capture_has_rc || d.packets > 0;
            self.ud_packets += d.packets;
            self.ud_bytes += d.bytes;
            self.qkey_mismatches += d.qkey_mismatches;
            return;
        }
        self.srq_packets += d.srq_packets;
        self.capture_has_rc |= d.capture_has_rc || d.packets > 0;
        self.connections += u64::from(d.packets > 0);
        self.packets += d.packets;
        self.bytes += d.bytes;
        self.naks += d.naks;
        self.rnr_naks += d.rnr_naks;
        self.retransmissions += d.retransmissions;
        self.psn_gaps += d.psn_gaps;
        self.cnps += d.cnps;
        self.ecn_ce += d.ecn_ce;
        match c.data_verdict() {
            Some(Verdict::Ok) => self.ok += 1,
            Some(Verdict::Broken) => self.broken += 1,
            Some(Verdict::NoData) => self.no_data += 1,
            None => {}
        }
    }

    fn merge(&mut self, o: &DataTotals) {
        self.capture_has_rc |= o.capture_has_rc;
        self.connections += o.connections;
        self.packets += o.packets;
        self.bytes += o.bytes;
        self.naks += o.naks;
        self.rnr_naks += o.rnr_naks;
        self.retransmissions += o.retransmissions;
        self.psn_gaps += o.psn_gaps;
        self.cnps += o.cnps;
        self.ecn_ce += o.ecn_ce;
        self.ok += o.ok;
        self.broken += o.broken;
        self.no_data += o.no_data;
        self.srq_packets += o.srq_packets;
        self.capture_has_ud |= o.capture_has_ud;
        self.ud_packets += o.ud_packets;
        self.ud_bytes += o.ud_bytes;
        self.qkey_mismatches += o.qkey_mismatches;
    }
}

/// Everything `--stats` reports.
#[derive(Debug, Clone, Default)]
pub struct TraceStats {
    /// Files decoded.
    pub files: u64,
    /// Records read.
    pub frames: u64,
    /// CM MADs.
    pub cm: u64,
    /// Non-CM records.
    pub non_cm: u64,
    /// Malformed records.
    pub malformed: u64,
    /// CM MADs with a bad ICRC.
    pub bad_icrc: u64,
    /// Records cut by the capture's snaplen (CM and non-CM; counted, never one line each).
    pub cut: u64,
    /// CM MADs cut by the snaplen, decoded as far as captured.
    pub cm_cut: u64,
    /// Bytes skipped over damaged record headers (to the next plausible record header).
    pub skipped_bytes: u64,
    /// CM MADs by attribute.
    pub messages: BTreeMap<u16, u64>,
    /// Non-CM records by kind.
    pub non_cm_kinds: FastMap<NonCm, u64>,
    /// All connections.
    pub all: ConnStats,
    /// Per Service ID (at most [`MAX_SERVICES`]).
    pub by_service: BTreeMap<u64, ConnStats>,
    /// Connections of Service IDs beyond [`MAX_SERVICES`].
    pub other_services: ConnStats,
    /// SIDR exchanges.
    pub sidr: SidrStats,
    /// The connections' data path.
    pub data: DataTotals,
    /// Subnet Administration (PathRecord) traffic.
    pub sa: SaStats,
    /// Connections evicted because the table was full.
    pub evicted: u64,
    /// Largest number of connections tracked at once (over all files).
    pub peak_live: u64,
    /// Capture time span covered (first to last record, summed over files).
    pub span: Duration,
}

impl TraceStats {
    /// Counts one CM message.
    pub fn count_message(&mut self, attr: AttrId) {
        *self.messages.entry(attr.raw()).or_default() += 1;
    }

    /// Counts one non-CM record.
    pub fn count_non_cm(&mut self, what: NonCm) {
        *self.non_cm_kinds.entry(what).or_default() += 1;
    }

    /// Adds a finished connection.
    pub fn add_conn(&mut self, c: &Conn) {
        self.sa.add_conn(c);
        if c.kind == ConnKind::Sidr {
            self.sidr.requests += u64::from(c.req.is_some());
            match c.outcome {
                Outcome::Resolved { status } if status.raw() == 0 => self.sidr.resolved += 1,
                Outcome::Resolved { .. } => self.sidr.failed += 1,
                _ => self.sidr.unanswered += u64::from(c.req.is_some()),
            }
            self.data.add(c);
            return;
        }
        self.all.add(c);
        self.data.add(c);
        if let Some(sid) = c.service_id {
            let n = self.by_service.len();
            match self.by_service.get_mut(&sid.0) {
                Some(s) => s.add(c),
                None if n < MAX_SERVICES => {
                    let mut s = ConnStats::default();
                    s.add(c);
                    self.by_service.insert(sid.0, s);
                }
                None => self.other_services.add(c),
            }
        }
    }

    /// Merges another file's statistics.
    pub fn merge(&mut self, o: &TraceStats) {
        self.files += o.files;
        self.frames += o.frames;
        self.cm += o.cm;
        self.non_cm += o.non_cm;
        self.malformed += o.malformed;
        self.bad_icrc += o.bad_icrc;
        self.cut += o.cut;
        self.cm_cut += o.cm_cut;
        self.skipped_bytes += o.skipped_bytes;
        for (k, v) in &o.messages {
            *self.messages.entry(*k).or_default() += v;
        }
        for (k, v) in &o.non_cm_kinds {
            *self.non_cm_kinds.entry(*k).or_default() += v;
        }
        self.all.merge(&o.all);
        for (sid, s) in &o.by_service {
            let n = self.by_service.len();
            match self.by_service.get_mut(sid) {
                Some(mine) => mine.merge(s),
                None if n < MAX_SERVICES => {
                    self.by_service.insert(*sid, s.clone());
                }
                None => self.other_services.merge(s),
            }
        }
        self.other_services.merge(&o.other_services);
        self.sidr.requests += o.sidr.requests;
        self.sidr.resolved += o.sidr.resolved;
        self.sidr.failed += o.sidr.failed;
        self.sidr.unanswered += o.sidr.unanswered;
        self.data.merge(&o.data);
        self.sa.merge(&o.sa);
        self.evicted += o.evicted;
        self.peak_live = self.peak_live.max(o.peak_live);
        self.span += o.span;
    }

    /// Non-CM kinds, most frequent first (ties by name).
    pub fn non_cm_sorted(&self) -> Vec<(String, u64)> {
        let mut v: Vec<(String, u64)> = self
            .non_cm_kinds
            .iter()
            .map(|(k, n)| (k.to_string(), *n))
            .collect();
        v.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        v
    }
}

/// The name of a REJ reason number.
pub(crate) fn rej_name(raw: u16) -> &'static str {
    RejReason::from_raw(raw).name()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exact_percentiles() {
        let mut l = Latency::default();
        for ms in 1..=100u64 {
            l.add(Duration::from_millis(ms));
        }
        assert_eq!(l.percentile(50.0), Some(Duration::from_millis(50)));
        assert_eq!(l.percentile(99.0), Some(Duration::from_millis(99)));
        assert_eq!(l.max(), Some(Duration::from_millis(100)));
    }

    #[test]
    fn histogram_percentiles_within_two_percent() {
        let mut l = Latency::default();
        for us in 1..=100_000u64 {
            l.add(Duration::from_micros(us));
        }
        let p50 = l.percentile(50.0).unwrap().as_micros() as f64;
        assert!((p50 - 50_000.0).abs() / 50_000.0 < 0.02, "{p50}");
        let p99 = l.percentile(99.0).unwrap().as_micros() as f64;
        assert!((p99 - 99_000.0).abs() / 99_000.0 < 0.02, "{p99}");
        assert_eq!(l.max(), Some(Duration::from_micros(100_000)));
    }

    #[test]
    fn buckets_are_monotonic() {
        let mut last = 0;
        for v in (0..1_000_000u64).step_by(997) {
            let b = bucket(v);
            assert!(b >= last);
            assert!(bucket_value(b) >= v);
            last = b;
        }
        assert!(bucket(u64::MAX) < GROUPS * SUB);
    }
}
