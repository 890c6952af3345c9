//! SIDR and counters through the node service: a client's [`Cm::sidr`](crate::rt::Cm::sidr)
//! asked by the daemon's endpoint ([`Op::Sidr`], answered when the SIDR_REP arrives), a
//! SIDR_REQ for a client's service delivered to it ([`DaemonMsg::IncomingSidr`]) and its
//! answer ([`Op::SidrReply`]), and [`Cm::stats`](crate::rt::Cm::stats) ([`Op::Stats`]: the
//! daemon endpoint's counters).

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use ibcm_mad::{Pkey, Qkey, Qpn, SidrStatus};
use serde::{Deserialize, Serialize};

use super::proto::{sid, DaemonMsg, Op, WireConnectError, WirePeer, WireResult};
use super::server::{NodeServer, Session};
use crate::proto::{
    ConnId, DropReason, PeerAddr, SidrRepParams, SidrReqInfo, SidrReqParams, Stats,
};
use crate::rt::command::Command;
use crate::rt::stats::{CmStats, TransportStats};
use crate::rt::types::{CmError, SidrAnswer};

/// How long a SIDR_REQ delivered to a client is kept for its answer (the endpoint forgets
/// an unanswered one itself; this bounds the session's table with it).
pub(super) const SIDR_IN_KEEP: Duration = Duration::from_secs(60);

/// The shortest time a client's SIDR_REQ waits for its SIDR_REP before a retransmission, in
/// ms: a shorter [`WireSidrReq::timeout_ms`] is raised to it.
pub const SIDR_TIMEOUT_MIN_MS: u64 = 100;

/// The longest such time, in ms (a longer one is lowered to it).
pub const SIDR_TIMEOUT_MAX_MS: u64 = 60_000;

/// The most retransmissions of a client's SIDR_REQ (rdma_cm's `CMA_MAX_CM_RETRIES`): more
/// [`WireSidrReq::max_retries`] are lowered to it.
pub const SIDR_MAX_RETRIES: u8 = 15;

/// SIDR datagrams the daemon may send toward one address for a client (and for its user)
/// beyond [`SIDR_BUDGET_PER_REQUEST`] per request naming it: one request of the most
/// retries.
pub const SIDR_BUDGET_ALLOWANCE: u64 = 1 + SIDR_MAX_RETRIES as u64;

/// SIDR datagrams each request naming an address adds to the budget toward it (the wire
/// side's anti-amplification factor): toward any one address the daemon sends at most
/// `SIDR_BUDGET_ALLOWANCE + 3 ×` the requests of the client (and of its user) naming it.
pub const SIDR_BUDGET_PER_REQUEST: u64 = 3;

/// Addresses a session's (and a user's) SIDR budget follows at once: a request naming one
/// more is refused.
pub const SIDR_BUDGET_ADDRESSES: usize = 4096;

/// Where a SIDR_REQ goes, for the budget: the IP (any port), or the LID and GID.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Dest {
    Ip(std::net::IpAddr),
    Ib(u16, Option<[u8; 16]>),
}

impl Dest {
    fn of(p: &PeerAddr) -> Self {
        match p {
            PeerAddr::Udp(a) => Dest::Ip(a.ip()),
            PeerAddr::Ib(a) => Dest::Ib(a.lid.0, a.gid.map(|g| g.0)),
        }
    }
}

/// Datagrams toward one address: requests naming it, datagrams sent (or reserved), requests
/// in flight.
#[derive(Debug, Default, Clone, Copy)]
struct Credit {
    asked: u64,
    spent: u64,
    in_flight: u32,
}

impl Credit {
    fn room(self) -> u64 {
        (SIDR_BUDGET_ALLOWANCE + SIDR_BUDGET_PER_REQUEST.saturating_mul(self.asked))
            .saturating_sub(self.spent)
    }
}

/// The SIDR datagram budget of one session or one user, by address. An address whose
/// budget is at least the allowance again is forgotten (a new entry starts there).
#[derive(Debug, Default)]
pub(super) struct SidrBudget {
    by_dest: std::collections::HashMap<Dest, Credit>,
}

impl SidrBudget {
    /// One more request naming `d`; false if the table is full and `d` is not in it.
    fn ask(&mut self, d: Dest) -> bool {
        if !self.by_dest.contains_key(&d) && self.by_dest.len() >= SIDR_BUDGET_ADDRESSES {
            return false;
        }
        let c = self.by_dest.entry(d).or_default();
        c.asked = c.asked.saturating_add(1);
        true
    }

    fn room(&self, d: Dest) -> u64 {
        self.by_dest.get(&d).copied().unwrap_or_default().room()
    }

    /// A request reserves `n` datagrams.
    fn spend(&mut self, d: Dest, n: u64) {
        let c = self.by_dest.entry(d).or_default();
        c.spent = c.spent.saturating_add(n);
        c.in_flight = c.in_flight.saturating_add(1);
    }

    /// A request ended; `n` of the datagrams it reserved were not sent.
    fn refund(&mut self, d: Dest, n: u64) {
        if let Some(c) = self.by_dest.get_mut(&d) {
            c.spent = c.spent.saturating_sub(n);
            c.in_flight = c.in_flight.saturating_sub(1);
            if c.in_flight == 0 && c.room() >= SIDR_BUDGET_ALLOWANCE {
                self.by_dest.remove(&d);
            }
        }
    }

    /// Whether nothing is followed.
    pub(super) fn is_empty(&self) -> bool {
        self.by_dest.is_empty()
    }
}

/// The SIDR budgets of the sessions and of the users (one lock for both).
#[derive(Debug, Default)]
pub(super) struct SidrBudgets {
    pub(super) by_session: std::collections::HashMap<u64, SidrBudget>,
    pub(super) by_uid: std::collections::HashMap<u32, SidrBudget>,
}

/// [`SidrReqParams`] on the wire ([`Op::Sidr`]). Through the daemon, `timeout_ms` is clamped
/// to [`SIDR_TIMEOUT_MIN_MS`]..=[`SIDR_TIMEOUT_MAX_MS`] and `max_retries` to at most
/// [`SIDR_MAX_RETRIES`], and the datagrams toward one address are budgeted
/// ([`SIDR_BUDGET_PER_REQUEST`]).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WireSidrReq {
    /// The peer's CM.
    pub peer: WirePeer,
    /// The service ID to resolve.
    pub service_id: u64,
    /// P_Key.
    pub pkey: u16,
    /// Private data (at most 216 bytes).
    pub private_data: Vec<u8>,
    /// Time to wait for the SIDR_REP per attempt, in ms (served as
    /// [`SIDR_TIMEOUT_MIN_MS`]..=[`SIDR_TIMEOUT_MAX_MS`]).
    pub timeout_ms: u64,
    /// Retransmissions before giving up (served as at most [`SIDR_MAX_RETRIES`]).
    pub max_retries: u8,
}

impl WireSidrReq {
    /// From the parameters.
    pub fn from_params(p: &SidrReqParams) -> Self {
        WireSidrReq {
            peer: WirePeer::from_peer(&p.peer),
            service_id: p.service_id.0,
            pkey: p.pkey.0,
            private_data: p.private_data.clone(),
            timeout_ms: u64::try_from(p.timeout.as_millis()).unwrap_or(u64::MAX),
            max_retries: p.max_retries,
        }
    }

    /// Back to parameters, with the timeout and the retries clamped as the daemon serves
    /// them ([`SIDR_TIMEOUT_MIN_MS`], [`SIDR_TIMEOUT_MAX_MS`], [`SIDR_MAX_RETRIES`]).
    pub fn to_clamped_params(&self) -> SidrReqParams {
        let mut p = self.to_params();
        p.timeout = Duration::from_millis(
            self.timeout_ms
                .clamp(SIDR_TIMEOUT_MIN_MS, SIDR_TIMEOUT_MAX_MS),
        );
        p.max_retries = self.max_retries.min(SIDR_MAX_RETRIES);
        p
    }

    /// Back to parameters.
    pub fn to_params(&self) -> SidrReqParams {
        SidrReqParams {
            peer: self.peer.to_peer(),
            service_id: sid(self.service_id),
            pkey: Pkey(self.pkey),
            private_data: self.private_data.clone(),
            timeout: Duration::from_millis(self.timeout_ms),
            max_retries: self.max_retries,
        }
    }
}

/// [`SidrRepParams`] or [`SidrAnswer`] on the wire: the fields of a SIDR_REP.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WireSidrRep {
    /// Status (the raw `SidrStatus`).
    pub status: u8,
    /// The serving UD QP.
    pub qpn: u32,
    /// Its Q_Key.
    pub qkey: u32,
    /// Additional information (a reply's; empty in an answer).
    #[serde(default)]
    pub additional_info: Vec<u8>,
    /// Private data.
    pub private_data: Vec<u8>,
}

impl WireSidrRep {
    /// From a client's reply.
    pub fn from_params(p: &SidrRepParams) -> Self {
        WireSidrRep {
            status: p.status.raw(),
            qpn: p.qpn.get(),
            qkey: p.qkey.0,
            additional_info: p.additional_info.clone(),
            private_data: p.private_data.clone(),
        }
    }

    /// Back to a reply.
    pub fn to_params(&self) -> SidrRepParams {
        SidrRepParams {
            status: SidrStatus::from_raw(self.status),
            qpn: Qpn::masked(self.qpn),
            qkey: Qkey(self.qkey),
            additional_info: self.additional_info.clone(),
            private_data: self.private_data.clone(),
        }
    }

    /// From the answer the requester got.
    pub fn from_answer(a: &SidrAnswer) -> Self {
        WireSidrRep {
            status: a.status.raw(),
            qpn: a.qpn.get(),
            qkey: a.qkey.0,
            additional_info: Vec::new(),
            private_data: a.private_data.clone(),
        }
    }

    /// Back to an answer.
    pub fn to_answer(&self) -> SidrAnswer {
        SidrAnswer {
            status: SidrStatus::from_raw(self.status),
            qpn: Qpn::masked(self.qpn),
            qkey: Qkey(self.qkey),
            private_data: self.private_data.clone(),
        }
    }
}

/// A SIDR_REQ for a client's service ([`DaemonMsg::IncomingSidr`]).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WireSidrIn {
    /// Where it came from.
    pub peer: WirePeer,
    /// The requester's request ID.
    pub request_id: u32,
    /// Its private data.
    pub private_data: Vec<u8>,
}

impl WireSidrIn {
    /// From the request.
    pub fn from_info(i: &SidrReqInfo) -> Self {
        WireSidrIn {
            peer: WirePeer::from_peer(&i.peer),
            request_id: i.request_id.0,
            private_data: i.private_data.clone(),
        }
    }

    /// Back to the request, for `service_id`.
    pub fn to_info(&self, service_id: u64) -> SidrReqInfo {
        SidrReqInfo {
            peer: self.peer.to_peer(),
            request_id: ibcm_mad::RequestId(self.request_id),
            service_id: sid(service_id),
            private_data: self.private_data.clone(),
        }
    }
}

/// [`CmStats`] on the wire: every counter by name.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct WireStats {
    /// The endpoint's counters ([`Stats::counters`] names).
    pub endpoint: Vec<(String, u64)>,
    /// The endpoint's drops by [`DropReason::name`].
    pub dropped: Vec<(String, u64)>,
    /// Datagrams the transport received and sent.
    pub transport_rx: u64,
    /// See `transport_rx`.
    pub transport_tx: u64,
    /// The transport's drops by name.
    pub transport_dropped: Vec<(String, u64)>,
    /// The transport's other counters by name.
    pub transport_other: Vec<(String, u64)>,
    /// [`CmStats::closed`].
    pub closed: u64,
    /// [`CmStats::log_suppressed`].
    pub log_suppressed: u64,
    /// [`CmStats::connections`].
    pub connections: u64,
    /// [`CmStats::half_open`].
    pub half_open: u64,
    /// [`CmStats::established_now`].
    pub established_now: u64,
}

impl WireStats {
    /// From the daemon endpoint's counters.
    pub fn from_stats(s: &CmStats) -> Self {
        fn named(v: &[(&'static str, u64)]) -> Vec<(String, u64)> {
            v.iter().map(|(k, n)| ((*k).to_owned(), *n)).collect()
        }
        WireStats {
            endpoint: named(&s.endpoint.counters()),
            dropped: DropReason::ALL
                .iter()
                .map(|&r| (r.name().to_owned(), s.endpoint.dropped(r)))
                .collect(),
            transport_rx: s.transport.rx,
            transport_tx: s.transport.tx,
            transport_dropped: named(&s.transport.dropped),
            transport_other: named(&s.transport.other),
            closed: s.closed,
            log_suppressed: s.log_suppressed,
            connections: s.connections as u64,
            half_open: s.half_open as u64,
            established_now: s.established_now as u64,
        }
    }

    /// Back to [`CmStats`]. A counter this build does not know is left out and named in
    /// the second value (a daemon of another version).
    pub fn to_stats(&self) -> (CmStats, Vec<String>) {
        let mut unknown = Vec::new();
        let mut endpoint = Stats::default();
        for (k, v) in &self.endpoint {
            if !endpoint.set_counter(k, *v) {
                unknown.push(k.clone());
            }
        }
        for (k, v) in &self.dropped {
            match DropReason::ALL.iter().find(|r| r.name() == k) {
                Some(&r) => {
                    if let Some(c) = endpoint.dropped.get_mut(r as usize) {
                        *c = *v;
                    }
                }
                None => unknown.push(format!("dropped.{k}")),
            }
        }
        let mut known = |v: &[(String, u64)]| -> Vec<(&'static str, u64)> {
            v.iter()
                .filter_map(|(k, n)| match TransportStats::static_name(k) {
                    Some(k) => Some((k, *n)),
                    None => {
                        unknown.push(format!("transport.{k}"));
                        None
                    }
                })
                .collect()
        };
        let transport = TransportStats {
            rx: self.transport_rx,
            tx: self.transport_tx,
            dropped: known(&self.transport_dropped),
            other: known(&self.transport_other),
        };
        let size = |v: u64| usize::try_from(v).unwrap_or(usize::MAX);
        let stats = CmStats {
            endpoint,
            transport,
            closed: self.closed,
            log_suppressed: self.log_suppressed,
            connections: size(self.connections),
            half_open: size(self.half_open),
            established_now: size(self.established_now),
        };
        (stats, unknown)
    }
}

impl NodeServer {
    /// [`Op::Sidr`]: the daemon's endpoint asks; the reply to `seq` is sent when the answer
    /// (or the timeout) comes, so it may overtake the replies of later requests.
    pub(super) async fn sidr(self: &Arc<Self>, s: &Arc<Session>, seq: u64, req: WireSidrReq) {
        // Its fields were checked against their maxima with every request's (`fields::check`).
        let mut params = req.to_clamped_params();
        params.peer = match self.cfg.peer(params.peer) {
            Ok(p) => p,
            Err(why) => return Self::reply(s, seq, WireResult::Refused { why }),
        };
        let dest = Dest::of(&params.peer);
        let cost = 1 + u64::from(params.max_retries);
        {
            let mut st = s.lock();
            if st.sidr_out.len() + st.sidr_starting >= self.cfg.max_sidr {
                drop(st);
                let why = format!("quota: {} SIDR requests in flight", self.cfg.max_sidr);
                Self::reply(s, seq, WireResult::Refused { why });
                return;
            }
            st.sidr_starting += 1;
        }
        if let Err(why) = self.sidr_budget(s.info, dest, cost) {
            s.lock().sidr_starting -= 1;
            Self::reply(s, seq, WireResult::Refused { why });
            return;
        }
        let timeout = params.timeout;
        let started = Instant::now();
        let r = self.cm.call(|reply| Command::Sidr { params, reply }).await;
        let (id, rx) = match r {
            Ok(Ok(p)) => p,
            Ok(Err(e)) => {
                s.lock().sidr_starting -= 1;
                self.sidr_refund(s.info, dest, cost);
                let r = WireResult::ConnectError(WireConnectError::from_error(&e));
                Self::reply(s, seq, r);
                return;
            }
            Err(_) => {
                s.lock().sidr_starting -= 1;
                self.sidr_refund(s.info, dest, cost);
                Self::reply(s, seq, stopped());
                return;
            }
        };
        let closed = {
            let mut st = s.lock();
            st.sidr_starting -= 1;
            if !st.closed {
                st.sidr_out.insert(id.0);
            }
            st.closed
        };
        if closed {
            // The session ended meanwhile: its requests go with it.
            self.cm.send(Command::SidrCancel { id });
        }
        let (me, s) = (self.clone(), s.clone());
        tokio::spawn(async move {
            let r = match rx.await {
                Ok(Ok(a)) => WireResult::Sidr(WireSidrRep::from_answer(&a)),
                Ok(Err(CmError::SidrTimedOut)) => WireResult::SidrTimedOut,
                Ok(Err(e)) => WireResult::Refused { why: e.to_string() },
                Err(_) => stopped(),
            };
            // The datagrams not sent: one per timeout that did not pass.
            let waited = started.elapsed().as_millis() / timeout.as_millis().max(1);
            let sent = u64::try_from(waited)
                .unwrap_or(u64::MAX)
                .saturating_add(1)
                .min(cost);
            me.sidr_refund(s.info, dest, cost - sent);
            s.lock().sidr_out.remove(&id.0);
            Self::reply(&s, seq, r);
        });
    }

    /// Takes `cost` datagrams toward `d` from the budgets of `who`'s session and user, or
    /// says why not. The request counts as asked either way.
    fn sidr_budget(
        &self,
        who: super::hooks::SessionInfo,
        d: Dest,
        cost: u64,
    ) -> Result<(), String> {
        let mut b = super::server::lock(&self.sidr_budgets);
        let b = &mut *b;
        let mine = b.by_session.entry(who.id).or_default();
        let user = b.by_uid.entry(who.uid).or_default();
        if !mine.ask(d) || !user.ask(d) {
            return Err(format!(
                "budget: SIDR requests toward {SIDR_BUDGET_ADDRESSES} addresses at once"
            ));
        }
        let (room, whose) = if mine.room(d) < user.room(d) {
            (mine.room(d), "this client".to_string())
        } else {
            (user.room(d), format!("uid {}", who.uid))
        };
        if room < cost {
            return Err(format!(
                "budget: {room} SIDR datagrams left toward this address for {whose}, the \
                 request needs {cost} (at most {SIDR_BUDGET_ALLOWANCE} + \
                 {SIDR_BUDGET_PER_REQUEST} per request naming it)"
            ));
        }
        mine.spend(d, cost);
        user.spend(d, cost);
        Ok(())
    }

    /// `n` datagrams taken by [`Self::sidr_budget`] and not sent.
    fn sidr_refund(&self, who: super::hooks::SessionInfo, d: Dest, n: u64) {
        let mut b = super::server::lock(&self.sidr_budgets);
        if let Some(m) = b.by_session.get_mut(&who.id) {
            m.refund(d, n);
        }
        if let Some(u) = b.by_uid.get_mut(&who.uid) {
            u.refund(d, n);
            if u.is_empty() {
                b.by_uid.remove(&who.uid);
            }
        }
    }

    /// A SIDR_REQ for one of `s`'s services: delivered to the client, which answers with
    /// [`Op::SidrReply`] (or drops it: [`Op::Unanswered`]).
    pub(super) fn incoming_sidr(&self, s: &Session, service_id: u64, id: ConnId, i: &SidrReqInfo) {
        let now = Instant::now();
        let over = {
            let mut st = s.lock();
            // Requests the client never answered go after a while (the endpoint has
            // forgotten them by then).
            st.sidr_in
                .retain(|_, at| now.duration_since(*at) < SIDR_IN_KEEP);
            if st.closed || st.sidr_in.len() >= self.cfg.max_sidr {
                true
            } else {
                st.sidr_in.insert(id.0, now);
                false
            }
        };
        if over {
            self.cm.send(Command::Unanswered { id, sidr: true });
            return;
        }
        s.out.push(&DaemonMsg::IncomingSidr {
            service_id,
            conn: id.0,
            req: WireSidrIn::from_info(i),
        });
    }

    /// [`Op::SidrReply`].
    pub(super) async fn sidr_reply(&self, s: &Session, conn: u32, rep: &WireSidrRep) -> WireResult {
        if s.lock().sidr_in.remove(&conn).is_none() {
            return WireResult::CallError(super::proto::WireCallError::UnknownConnection { conn });
        }
        let params = rep.to_params();
        let id = ibcm_mad::CommId(conn);
        match self
            .cm
            .call(|reply| Command::SidrReply { id, params, reply })
            .await
        {
            Ok(Ok(())) => WireResult::Ok,
            Ok(Err(e)) => WireResult::CallError(super::proto::WireCallError::from_error(&e)),
            Err(_) => stopped(),
        }
    }

    /// [`Op::Unanswered`] for a SIDR_REQ: whether `conn` was one of `s`'s (then the endpoint
    /// answers "rejected").
    pub(super) fn sidr_unanswered(&self, s: &Session, conn: u32) -> bool {
        let mine = s.lock().sidr_in.remove(&conn).is_some();
        if mine {
            self.cm.send(Command::Unanswered {
                id: ibcm_mad::CommId(conn),
                sidr: true,
            });
        }
        mine
    }

    /// [`Op::Stats`]: the daemon endpoint's counters (node-wide: they name no peer).
    pub(super) async fn stats(&self) -> WireResult {
        match self.cm.call(|reply| Command::Stats { reply }).await {
            Ok(s) => WireResult::Stats(Box::new(WireStats::from_stats(&s))),
            Err(_) => stopped(),
        }
    }
}

/// A refusal that names a field too long, never its content.
pub(super) fn too_long(what: &str, len: usize, max: usize) -> String {
    format!("{what} of {len} bytes is above its maximum of {max}")
}

fn stopped() -> WireResult {
    WireResult::Refused {
        why: "the endpoint has stopped".into(),
    }
}

/// The [`Op`] for a client's [`Cm::sidr`](crate::rt::Cm::sidr).
pub(super) fn sidr_op(p: &SidrReqParams) -> Op {
    Op::Sidr {
        req: WireSidrReq::from_params(p),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_survive_the_wire_whole() {
        let mut s = CmStats::default();
        for (i, (k, _)) in Stats::default().counters().iter().enumerate() {
            assert!(s.endpoint.set_counter(k, i as u64 + 1), "{k}");
        }
        for (i, c) in s.endpoint.dropped.iter_mut().enumerate() {
            *c = 100 + i as u64;
        }
        s.transport = TransportStats {
            rx: 5,
            tx: 6,
            dropped: vec![("bad_icrc", 1), ("not_mad", 2), ("short_record", 3)],
            other: vec![("icrc_unverified", 4), ("send_failed", 7)],
        };
        (
            s.closed,
            s.log_suppressed,
            s.connections,
            s.half_open,
            s.established_now,
        ) = (8, 9, 10, 11, 12);
        let json = serde_json::to_string(&WireStats::from_stats(&s)).unwrap_or_default();
        let back: WireStats = serde_json::from_str(&json).unwrap_or_default();
        let (t, unknown) = back.to_stats();
        assert!(unknown.is_empty(), "{unknown:?}");
        assert_eq!(t, s);
        assert_eq!(t.to_json(), s.to_json());
    }

    /// Every `u64` counter of [`Stats`] is named by [`Stats::counters`] (the wire would lose
    /// one that is not).
    #[test]
    fn every_counter_has_a_name() {
        let dbg = format!("{:?}", Stats::default());
        let fields = dbg.matches(": 0").count();
        assert_eq!(Stats::default().counters().len(), fields, "{dbg}");
    }

    /// 16 + 3 per request toward one address; the unsent retries given back; an address back
    /// at its start forgotten; another address (another IP; not another port) has its own.
    #[test]
    fn the_budget_is_16_plus_3_per_request() {
        let peer = |s: &str| Dest::of(&PeerAddr::Udp(s.parse().unwrap()));
        let (a, a2, b) = (
            peer("127.0.0.1:4791"),
            peer("127.0.0.1:9"),
            peer("127.0.0.2:4791"),
        );
        assert_eq!(a, a2);
        let mut m = SidrBudget::default();
        assert!(m.ask(a));
        assert_eq!(m.room(a), 19);
        m.spend(a, 16);
        assert_eq!(m.room(a), 3);
        assert_eq!(m.room(b), 16);
        for room in [6, 9, 12, 15, 18] {
            assert!(m.ask(a));
            assert_eq!(m.room(a), room);
        }
        m.spend(a, 16);
        assert_eq!(m.room(a), 2);
        // Two in flight. One answered after one datagram: 15 back, room 17, but the other
        // still flies: kept.
        m.refund(a, 15);
        assert_eq!(m.room(a), 17);
        assert!(!m.is_empty());
        // The other timed out (all 16 sent): room 17, more than a fresh start: forgotten.
        m.refund(a, 0);
        assert!(m.is_empty());
        assert_eq!(m.room(a), 16);
        let full: Vec<Dest> = (0..SIDR_BUDGET_ADDRESSES as u32)
            .map(|i| Dest::Ip(std::net::Ipv4Addr::from(0x0a00_0000 + i).into()))
            .collect();
        for d in &full {
            assert!(m.ask(*d));
        }
        assert!(!m.ask(b));
        assert!(m.ask(full[0]));
    }

    #[test]
    fn sidr_timing_is_clamped() {
        let mut w = WireSidrReq::from_params(&SidrReqParams::new(
            "127.0.0.1:4791".parse::<std::net::SocketAddr>().unwrap(),
            ibcm_mad::ServiceId(1),
        ));
        (w.timeout_ms, w.max_retries) = (1, 255);
        let p = w.to_clamped_params();
        assert_eq!(p.timeout, Duration::from_millis(SIDR_TIMEOUT_MIN_MS));
        assert_eq!(p.max_retries, SIDR_MAX_RETRIES);
        w.timeout_ms = u64::MAX;
        assert_eq!(
            w.to_clamped_params().timeout,
            Duration::from_millis(SIDR_TIMEOUT_MAX_MS)
        );
        (w.timeout_ms, w.max_retries) = (4096, 3);
        let p = w.to_clamped_params();
        assert_eq!((p.timeout.as_millis(), p.max_retries), (4096, 3));
    }

    #[test]
    fn a_counter_this_build_does_not_know_is_named() {
        let w = WireStats {
            endpoint: vec![("rx".into(), 3), ("future".into(), 1)],
            transport_dropped: vec![("new_reason".into(), 2)],
            ..WireStats::default()
        };
        let (s, unknown) = w.to_stats();
        assert_eq!(s.endpoint.rx, 3);
        assert_eq!(unknown, ["future", "transport.new_reason"]);
    }
}
