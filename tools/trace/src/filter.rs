//! Filters: message types, Service ID, comm ID, address, XRC only, problems only.
//!
//! Every given criterion must match (and within one criterion, any of its values). For the
//! per-MAD views a message matches through its connection too: `--service-id` also selects
//! the REP, RTU, DREQ … of a connection whose REQ had that Service ID, `--comm-id` matches
//! either end's comm ID, `--addr` every message of a connection with that address at either end
//! or as one of its REQ's primary path GIDs (native IB packets carry only LIDs), `--xrc` every
//! message of an XRC connection. For the connection views
//! (`--ladder`, `--stats`, `--timeline`) a connection matches on its own attributes, and
//! `--msg` keeps the connections that have at least one such message.
//!
//! `--problems` selects rejects, timeouts, retransmissions and bad ICRCs. In the per-MAD
//! views a timeout is only known at the end of the capture, so it shows up there (in the
//! summary of timed-out connections), while REJs, repeats and bad-ICRC MADs (and later
//! messages of a connection that already had one) are printed as they come.

use std::str::FromStr;

use ibcm_mad::{AttrId, CmMessage, CommId, ServiceId};

use std::time::Duration;

use ibcm_mad::sa::PathRecord;

use crate::conn::{Conn, Exchange, Note};
use crate::expr::FilterExpr;
use crate::operand::{parse_u64, AddrMatch};
use crate::sa::SaEvent;
use crate::trace::{CmEvent, Icrc};

/// Parses a message name (`REQ`, `rep`, `SIDR_REQ`, `CPI`, …) or a `0x` attribute ID.
pub fn parse_msg(s: &str) -> Result<AttrId, String> {
    let up = s.trim().to_ascii_uppercase().replace('-', "_");
    let named = [
        AttrId::ClassPortInfo,
        AttrId::Req,
        AttrId::Mra,
        AttrId::Rej,
        AttrId::Rep,
        AttrId::Rtu,
        AttrId::Dreq,
        AttrId::Drep,
        AttrId::SidrReq,
        AttrId::SidrRep,
        AttrId::Lap,
        AttrId::Apr,
    ];
    if let Some(a) = named.iter().find(|a| a.name() == up) {
        return Ok(*a);
    }
    if up == "CLASSPORTINFO" {
        return Ok(AttrId::ClassPortInfo);
    }
    if up.starts_with("0X") {
        if let Some(v) = parse_u64(s).and_then(|v| u16::try_from(v).ok()) {
            return Ok(AttrId::from_raw(v));
        }
    }
    Err(format!(
        "unknown message type {s:?} (REQ MRA REJ REP RTU DREQ DREP SIDR_REQ SIDR_REP LAP APR CPI, \
         or a 0x attribute ID)"
    ))
}

/// A bound of the time window (`--from` / `--to`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimeBound {
    /// A time since the Unix epoch (`1487678249.98`, or UTC `2017-02-21 11:57:29.98`).
    Epoch(Duration),
    /// Seconds since the first frame of each file (`+12.5`).
    SinceStart(Duration),
}

impl FromStr for TimeBound {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let secs = |t: &str| {
            t.parse::<f64>()
                .ok()
                .filter(|v| v.is_finite() && *v >= 0.0 && *v < 1e12)
                .map(Duration::from_secs_f64)
        };
        if let Some(rel) = s.strip_prefix('+') {
            return secs(rel)
                .map(TimeBound::SinceStart)
                .ok_or_else(|| format!("bad time {s:?}: +SECONDS since the first frame"));
        }
        secs(s)
            .or_else(|| crate::timefmt::parse_utc(s))
            .map(TimeBound::Epoch)
            .ok_or_else(|| {
                format!(
                    "bad time {s:?}: epoch seconds, UTC \"YYYY-MM-DD HH:MM:SS[.frac]\", or \
                     +SECONDS since the first frame"
                )
            })
    }
}

impl TimeBound {
    fn at(self, t0: Duration) -> Duration {
        match self {
            TimeBound::Epoch(t) => t,
            TimeBound::SinceStart(d) => t0.saturating_add(d),
        }
    }
}

/// The filter set.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Filter {
    /// Message types.
    pub msgs: Vec<AttrId>,
    /// Service IDs.
    pub service_ids: Vec<ServiceId>,
    /// Comm IDs (either end).
    pub comm_ids: Vec<CommId>,
    /// Addresses (either end).
    pub addrs: Vec<AddrMatch>,
    /// XRC connections only.
    pub xrc: bool,
    /// Problems only.
    pub problems: bool,
    /// rdma_cm ports (of the message's or its connection's Service ID; `--port`).
    pub ports: Vec<u16>,
    /// Only messages at or after this time (`--from`; connection views: connections that
    /// last until then).
    pub from: Option<TimeBound>,
    /// Only messages at or before this time (`--to`; connection views: connections that
    /// start by then).
    pub to: Option<TimeBound>,
    /// The `-Y` expression.
    pub expr: Option<FilterExpr>,
}

impl Filter {
    /// Whether no criterion is set.
    pub fn is_empty(&self) -> bool {
        self == &Filter::default()
    }

    /// Whether `[first, last]` (capture times) overlaps the time window, with `t0` the file's
    /// first frame (for `+SECONDS` bounds). A message is the span `[t, t]`.
    pub fn in_window(&self, first: Duration, last: Duration, t0: Duration) -> bool {
        self.from.is_none_or(|b| last >= b.at(t0)) && self.to.is_none_or(|b| first <= b.at(t0))
    }

    /// Whether the per-MAD views show this message (all but the time window: see
    /// [`Filter::in_window`]).
    pub fn matches_event(&self, ev: &CmEvent, note: &Note) -> bool {
        if let Some(e) = &self.expr {
            if !e.matches(ev, note) {
                return false;
            }
        }
        if !self.ports.is_empty() {
            let sid = match &ev.mad.msg {
                CmMessage::Req(r) => Some(r.service_id),
                CmMessage::SidrReq(s) => Some(s.service_id),
                CmMessage::SidrRep(s) => Some(s.service_id),
                _ => note.service_id,
            };
            let port = sid.and_then(|s| s.rdma_cm_port()).map(|p| p.1);
            if !port.is_some_and(|p| self.ports.contains(&p)) {
                return false;
            }
        }
        if !self.msgs.is_empty() && !self.msgs.contains(&ev.mad.msg.attr_id()) {
            return false;
        }
        if !self.service_ids.is_empty() {
            let sid = match &ev.mad.msg {
                CmMessage::Req(r) => Some(r.service_id),
                CmMessage::SidrReq(s) => Some(s.service_id),
                CmMessage::SidrRep(s) => Some(s.service_id),
                _ => note.service_id,
            };
            if !sid.is_some_and(|s| self.service_ids.contains(&s)) {
                return false;
            }
        }
        if !self.comm_ids.is_empty() {
            let msg = &ev.mad.msg;
            let ids = [
                msg.local_comm_id(),
                msg.remote_comm_id(),
                note.comm_ids.0,
                note.comm_ids.1,
            ];
            if !ids
                .iter()
                .flatten()
                .any(|id| id.0 != 0 && self.comm_ids.contains(id))
            {
                return false;
            }
        }
        if !self.addrs.is_empty()
            && !self.addrs.iter().any(|a| {
                addr_in_event(*a, ev)
                    || a.gid()
                        .is_some_and(|g| note.path_gids.is_some_and(|(l, r)| l == g || r == g))
            })
        {
            return false;
        }
        if self.xrc && !(note.xrc || ev.mad.msg.is_xrc()) {
            return false;
        }
        if self.problems {
            let p = note.retrans
                || note.problem
                || ev.icrc == Icrc::Bad
                || matches!(ev.mad.msg, CmMessage::Rej(_));
            if !p {
                return false;
            }
        }
        true
    }

    /// Whether the connection views show this connection (`msgs`: the attribute IDs it had,
    /// as recorded by the caller). The time window and the `-Y` expression are checked by the
    /// run loop (they need the file's first frame and the connection's messages).
    pub fn matches_conn(&self, c: &Conn, has_msg: impl Fn(AttrId) -> bool) -> bool {
        if !self.ports.is_empty() {
            let port = c.service_id.and_then(|s| s.rdma_cm_port()).map(|p| p.1);
            if !port.is_some_and(|p| self.ports.contains(&p)) {
                return false;
            }
        }
        if !self.msgs.is_empty() && !self.msgs.iter().any(|a| has_msg(*a)) {
            return false;
        }
        if !self.service_ids.is_empty()
            && !c.service_id.is_some_and(|s| self.service_ids.contains(&s))
        {
            return false;
        }
        if !self.comm_ids.is_empty() && !self.comm_ids.iter().any(|id| c.has_comm_id(*id)) {
            return false;
        }
        if !self.addrs.is_empty() {
            let ends = [c.active.addr, c.passive.addr];
            if !self.addrs.iter().any(|a| {
                ends.iter().flatten().any(|e| a.matches(e))
                    || a.gid().is_some_and(|g| c.has_path_gid(g))
            }) {
                return false;
            }
        }
        if self.xrc && !c.is_xrc() {
            return false;
        }
        if self.problems && !c.has_problem() {
            return false;
        }
        true
    }
}

impl Filter {
    /// Whether a filter other than the address and the time window is set: SA MADs and
    /// PathRecord exchanges have no message type, Service ID, comm ID, XRC or `-Y` field of
    /// the CM, so such a filter hides them (`--problems` keeps the failed ones).
    fn hides_sa(&self) -> bool {
        !self.msgs.is_empty()
            || !self.service_ids.is_empty()
            || !self.comm_ids.is_empty()
            || self.xrc
            || !self.ports.is_empty()
            || self.expr.is_some()
    }

    /// Whether the per-MAD views show this SA MAD (all but the time window): no criterion
    /// but `--addr` (its packet's addresses, or a GID or LID of its PathRecords or query
    /// template) and `--problems` (an answer with a non-zero status).
    pub(crate) fn matches_sa(&self, ev: &SaEvent) -> bool {
        if self.hides_sa() {
            return false;
        }
        if self.problems && !(ev.is_response() && ev.mad.header.status != 0) {
            return false;
        }
        if self.addrs.is_empty() {
            return true;
        }
        let mut recs = ev.records();
        if ev.is_query() && ev.is_path() {
            recs.push(ev.template());
        }
        self.addrs.iter().any(|a| {
            a.matches(&ev.src) || a.matches(&ev.dst) || recs.iter().any(|r| addr_in_record(*a, r))
        })
    }

    /// Whether the connection views list this PathRecord exchange (one that served no
    /// connection): as [`Filter::matches_sa`], `--problems` keeping the unanswered and
    /// failed ones, and the time window over its query and answer.
    pub(crate) fn shows_exchange(&self, x: &Exchange, t0: Duration) -> bool {
        if self.hides_sa() {
            return false;
        }
        if self.problems && x.answer.is_some_and(|a| a.status == 0) {
            return false;
        }
        let first = x.first_time();
        let last = x.answer.map_or(first, |a| a.time.max(first));
        if !self.in_window(first, last, t0) {
            return false;
        }
        if self.addrs.is_empty() {
            return true;
        }
        self.addrs.iter().any(|a| {
            x.query.is_some_and(|q| {
                a.matches(&q.src) || a.matches(&q.dst) || addr_in_record(*a, &q.template)
            }) || x.records.iter().any(|r| addr_in_record(*a, r))
        })
    }
}

/// An address matches a PathRecord when it is one of its GIDs or LIDs.
fn addr_in_record(a: AddrMatch, r: &PathRecord) -> bool {
    a.gid().is_some_and(|g| g == r.sgid || g == r.dgid)
        || [r.slid, r.dlid]
            .iter()
            .any(|l| a.matches(&crate::trace::WireAddr::Lid(*l)))
}

/// An address matches a MAD when it is the packet's source or destination, one of a REQ's
/// primary/alternate path GIDs, or an address in the rdma_cm IP header of a REQ.
fn addr_in_event(a: AddrMatch, ev: &CmEvent) -> bool {
    if a.matches(&ev.src) || a.matches(&ev.dst) {
        return true;
    }
    if let CmMessage::Req(r) = &ev.mad.msg {
        if let Some(g) = a.gid() {
            let p = &r.primary_path;
            let alt = &r.alternate_path;
            if [p.local_gid, p.remote_gid, alt.local_gid, alt.remote_gid].contains(&g) {
                return true;
            }
        }
        if r.service_id.rdma_cm_port().is_some() {
            if let (Ok(h), AddrMatch::Ip(ip)) = (
                ibcm_mad::cma::CmaHeader::parse(r.private_data.as_bytes()),
                a,
            ) {
                return h.src == ip || h.dst == ip;
            }
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use ibcm_mad::Lid;

    use super::*;

    #[test]
    fn parses() {
        assert_eq!(parse_msg("req"), Ok(AttrId::Req));
        assert_eq!(parse_msg("sidr-rep"), Ok(AttrId::SidrRep));
        assert_eq!(parse_msg("0xb0"), Ok(AttrId::from_raw(0xb0)));
        assert!(parse_msg("bogus").is_err());
        assert_eq!(parse_u64("0x0106_1144"), Some(0x0106_1144));
        assert_eq!(parse_u64("42"), Some(42));
        assert_eq!("lid:5".parse::<AddrMatch>(), Ok(AddrMatch::Lid(Lid(5))));
        assert!("10.0.0.1".parse::<AddrMatch>().is_ok());
        assert!("nope".parse::<AddrMatch>().is_err());
    }
}
