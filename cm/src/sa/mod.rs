//! A Subnet Administration client (management class 0x03 on QP1), sans-IO like the endpoint.
//!
//! [`SaClient`] turns PathRecord queries into SA MADs addressed to the SM's LID, matches the
//! answers by transaction ID, reassembles RMPP answers (a GetTable whose records do not fit one
//! MAD), retransmits on its own timers and keeps a [`PathCache`] of the answers. It does no
//! I/O and reads no clock: the caller gives it the time with every call, sends what
//! [`SaClient::poll_transmit`] returns to [`SaDest`] (QP1, Q_Key 0x8001_0000, the SM's LID and
//! SL), feeds every received class-0x03 MAD to [`SaClient::handle_mad`], calls
//! [`SaClient::handle_timeout`] at [`SaClient::poll_timeout`] and takes the results from
//! [`SaClient::poll_event`].
//!
//! # Retries and timeouts
//! Each attempt waits [`SaConfig::timeout`] for the answer, then the same MAD (same TID) is
//! sent again, at most [`SaConfig::retries`] more times: the model of a MAD agent's send with
//! `timeout_ms` and `retries` (`struct ib_mad_send_buf` in `include/rdma/ib_mad.h`), which
//! is how `ib_sa` (`drivers/infiniband/core/sa_query.c`) waits for its answers. An RMPP
//! transfer in progress restarts the wait with every segment received.
//!
//! # RMPP (IBTA Vol 1 §13.6)
//! Only the receiving side: the answer's DATA segments are taken in order, each in-order
//! segment is acknowledged (ACK: RMPPType 2, SegmentNumber = the last in-order segment,
//! NewWindowLast = that + [`SaConfig::rmpp_window`]), a duplicate is acknowledged again, a
//! segment past a gap is dropped (the sender resends from the last acknowledged one), and the
//! segment with the Last flag completes the transfer. The SA data is the concatenation of
//! every segment's 200 data bytes, cut to the length the last segment's PayloadLength gives
//! (`get_mad_len` in `drivers/infiniband/core/mad_rmpp.c` does the same). A STOP or ABORT
//! from the sender ends the query with [`SaError::RmppAborted`].

mod cache;
mod req;
mod target;

pub use cache::{CacheKey, PathCache};
pub use req::{alternate_path, cm_peer, connect_params, req_mtu, req_path, DEFAULT_CA_ACK_DELAY};
pub use target::{PathTarget, PathTargetError};

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use ibcm_mad::sa::{
    attr, comp, method, rmpp_flags, rmpp_type, PathRecord, RmppHeader, SaMad, SaStatus, Selector,
    SA_DATA_LEN, SA_MAD_LEN,
};
use ibcm_mad::{Gid, Lid, Method, Mtu, Pkey, Qkey, Rate, Tid, U4};

/// Where SA MADs go: the SM's port, QP1.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SaDest {
    /// The SM's LID (PortInfo:MasterSMLID; sysfs `ports/N/sm_lid`).
    pub lid: Lid,
    /// The SL to reach it (PortInfo:MasterSMSL; sysfs `ports/N/sm_sl`).
    pub sl: U4,
    /// The P_Key index to send with (the default partition's, normally 0).
    pub pkey_index: u16,
    /// Q_Key: always [`Qkey::GSI`].
    pub qkey: Qkey,
}

/// The client's settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SaConfig {
    /// The local port number (part of the cache key).
    pub port: u8,
    /// Where the SA is.
    pub dest: SaDest,
    /// How long one attempt waits for its answer.
    pub timeout: Duration,
    /// How many times a request is sent again after its first attempt timed out.
    pub retries: u8,
    /// How long a cached PathRecord stays valid.
    pub cache_ttl: Duration,
    /// How many segments past the last acknowledged one an RMPP ACK lets the sender send.
    pub rmpp_window: u32,
    /// At most this many queries at once; more are refused ([`SaError::TooManyQueries`]).
    pub max_queries: usize,
}

impl SaConfig {
    /// Settings for a port with the SM at `sm_lid`: SL 0, P_Key index 0, 1 s per attempt,
    /// 3 retries, a 5-minute cache, an RMPP window of 16 segments, 1024 queries at once.
    pub fn new(port: u8, sm_lid: Lid) -> Self {
        SaConfig {
            port,
            dest: SaDest {
                lid: sm_lid,
                sl: U4::masked(0),
                pkey_index: 0,
                qkey: Qkey::GSI,
            },
            timeout: Duration::from_millis(1000),
            retries: 3,
            cache_ttl: Duration::from_secs(300),
            rmpp_window: 16,
            max_queries: 1024,
        }
    }
}

/// A PathRecord query: the template's fields and the ComponentMask bits that select them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PathQuery {
    /// GetTable (all matching paths) instead of Get (exactly one).
    pub table: bool,
    /// SGID to match.
    pub sgid: Option<Gid>,
    /// DGID to match.
    pub dgid: Option<Gid>,
    /// SLID to match.
    pub slid: Option<Lid>,
    /// DLID to match.
    pub dlid: Option<Lid>,
    /// P_Key to match.
    pub pkey: Option<Pkey>,
    /// SL to match.
    pub sl: Option<U4>,
    /// ServiceID to match.
    pub service_id: Option<u64>,
    /// Ask for reversible paths only.
    pub reversible: bool,
    /// NumbPath: the most paths wanted (0: not given).
    pub numb_path: u8,
    /// MTU selector and value.
    pub mtu: Option<(Selector, Mtu)>,
    /// Rate selector and value.
    pub rate: Option<(Selector, Rate)>,
}

impl PathQuery {
    /// A Get of the path from `sgid` to `dgid` in partition `pkey`: reversible, one path (SGID,
    /// DGID, P_Key, NumbPath and Reversible in the mask). rdma_cm's route query
    /// (`cma_query_ib_route` in `drivers/infiniband/core/cma.c`) asks the same and adds its
    /// ServiceID and a QoSClass or TClass.
    pub fn by_gids(sgid: Gid, dgid: Gid, pkey: Pkey) -> Self {
        PathQuery {
            sgid: Some(sgid),
            dgid: Some(dgid),
            pkey: Some(pkey),
            reversible: true,
            numb_path: 1,
            ..PathQuery::default()
        }
    }

    /// A Get of the path from `slid` to `dlid` (what `saquery -p SLID DLID` asks).
    pub fn by_lids(slid: Lid, dlid: Lid) -> Self {
        PathQuery {
            slid: Some(slid),
            dlid: Some(dlid),
            ..PathQuery::default()
        }
    }

    /// The ComponentMask of this query.
    pub fn comp_mask(&self) -> u64 {
        let mut m = 0;
        let mut set = |on: bool, bits: u64| {
            if on {
                m |= bits;
            }
        };
        set(self.service_id.is_some(), comp::SERVICE_ID);
        set(self.dgid.is_some(), comp::DGID);
        set(self.sgid.is_some(), comp::SGID);
        set(self.dlid.is_some(), comp::DLID);
        set(self.slid.is_some(), comp::SLID);
        set(self.reversible, comp::REVERSIBLE);
        set(self.numb_path != 0, comp::NUMB_PATH);
        set(self.pkey.is_some(), comp::PKEY);
        set(self.sl.is_some(), comp::SL);
        set(self.mtu.is_some(), comp::MTU_SELECTOR | comp::MTU);
        set(self.rate.is_some(), comp::RATE_SELECTOR | comp::RATE);
        m
    }

    /// The template record of this query (fields not in the mask are zero).
    pub fn template(&self) -> PathRecord {
        let (mtu_selector, mtu) = self.mtu.unwrap_or_default();
        let (rate_selector, rate) = self.rate.unwrap_or_default();
        PathRecord {
            service_id: self.service_id.unwrap_or(0),
            dgid: self.dgid.unwrap_or(Gid::ZERO),
            sgid: self.sgid.unwrap_or(Gid::ZERO),
            dlid: self.dlid.unwrap_or_default(),
            slid: self.slid.unwrap_or_default(),
            reversible: self.reversible,
            numb_path: self.numb_path & 0x7f,
            pkey: self.pkey.unwrap_or_default(),
            sl: self.sl.unwrap_or_default(),
            mtu_selector,
            mtu,
            rate_selector,
            rate,
            ..PathRecord::default()
        }
    }

    /// The request MAD of this query with transaction ID `tid`.
    pub fn to_mad(&self, tid: Tid) -> SaMad {
        let m = if self.table {
            method::GET_TABLE
        } else {
            method::GET
        };
        let mut mad = SaMad::request(m, tid, attr::PATH_RECORD, self.comp_mask());
        mad.data
            .get_mut(..PathRecord::LEN)
            .into_iter()
            .for_each(|d| d.copy_from_slice(&self.template().to_bytes()));
        mad
    }
}

/// A query's handle, given back in its [`SaEvent`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct QueryId(pub u64);

/// Why a query failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SaError {
    /// The SA answered with a non-zero status (the MAD status word and its SA code).
    #[error("SA status {sa:?} (MAD status {mad_status:#06x})")]
    Status {
        /// The SA's code (bits 14–8).
        sa: SaStatus,
        /// The whole MAD status word.
        mad_status: u16,
    },
    /// No answer after every attempt.
    #[error("no answer from the SA after {attempts} attempts")]
    Timeout {
        /// How many times the request was sent.
        attempts: u32,
    },
    /// The sender stopped or aborted the RMPP transfer of the answer.
    #[error("RMPP transfer aborted by the SA (type {rmpp_type}, status {status})")]
    RmppAborted {
        /// RMPPType (3 STOP, 4 ABORT).
        rmpp_type: u8,
        /// RMPPStatus.
        status: u8,
    },
    /// [`SaConfig::max_queries`] queries are already in flight.
    #[error("too many SA queries in flight")]
    TooManyQueries,
    /// The query was cancelled.
    #[error("cancelled")]
    Cancelled,
}

/// What the client reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SaEvent {
    /// A PathRecord query ended.
    PathRecords {
        /// The query.
        id: QueryId,
        /// The records (one for a Get; any number for a GetTable, maybe none), or why not.
        result: Result<Vec<PathRecord>, SaError>,
    },
}

/// A MAD to send to [`SaDest`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SaTransmit {
    /// Where.
    pub dest: SaDest,
    /// The 256 bytes.
    pub mad: [u8; SA_MAD_LEN],
}

/// Counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SaStats {
    /// Requests sent, retransmissions included.
    pub sent: u64,
    /// Retransmissions.
    pub resent: u64,
    /// Answers that completed a query.
    pub answered: u64,
    /// Queries that timed out.
    pub timeouts: u64,
    /// Received MADs that matched no query or could not be parsed.
    pub stray: u64,
    /// RMPP segments received (first included).
    pub rmpp_segments: u64,
    /// RMPP ACKs sent.
    pub rmpp_acks: u64,
    /// Cache hits of [`SaClient::resolve`].
    pub cache_hits: u64,
    /// Cache misses of [`SaClient::resolve`].
    pub cache_misses: u64,
    /// SM changes and port events that flushed the cache ([`SaClient::port_changed`]).
    pub port_changes: u64,
}

/// The reassembly state of an RMPP answer.
#[derive(Debug)]
struct Reassembly {
    /// The last in-order segment received.
    last: u32,
    /// The data so far.
    data: Vec<u8>,
    /// The answer's AttributeOffset (from the first segment).
    attr_offset: u16,
}

#[derive(Debug)]
struct Query {
    id: QueryId,
    mad: [u8; SA_MAD_LEN],
    attempts: u32,
    deadline: Instant,
    rmpp: Option<Reassembly>,
    /// Cache key to fill and waiters to answer (queries started by [`SaClient::resolve`]).
    key: Option<CacheKey>,
}

/// What [`SaClient::resolve`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resolve {
    /// A cached path, still valid.
    Cached(PathRecord),
    /// Not cached: a query is on its way (started now, or an earlier one for the same key);
    /// its [`SaEvent`] carries this ID.
    Pending(QueryId),
}

/// The SA client of one port (see the module docs).
#[derive(Debug)]
pub struct SaClient {
    cfg: SaConfig,
    next_tid: u32,
    next_id: u64,
    queries: HashMap<u32, Query>,
    out: VecDeque<SaTransmit>,
    events: VecDeque<SaEvent>,
    cache: PathCache,
    stats: SaStats,
}

impl SaClient {
    /// A client with these settings; TIDs start at `tid_seed` (low 32 bits: umad and ibsim
    /// rewrite the high 32 bits of a request's TID, so answers are matched on the low 32).
    pub fn new(cfg: SaConfig, tid_seed: u32) -> Self {
        SaClient {
            cfg,
            next_tid: tid_seed,
            next_id: 1,
            queries: HashMap::new(),
            out: VecDeque::new(),
            events: VecDeque::new(),
            cache: PathCache::new(cfg.cache_ttl),
            stats: SaStats::default(),
        }
    }

    /// The settings.
    pub fn config(&self) -> &SaConfig {
        &self.cfg
    }

    /// Where the SA is now (after an SM change, the caller says so with [`Self::set_dest`]).
    pub fn set_dest(&mut self, dest: SaDest) {
        self.cfg.dest = dest;
    }

    /// The port's SM or addresses changed (a new master SM, the SM's client reregistration, a
    /// LID, P_Key or port-state change: the events on which the kernel's `ib_sa` updates its
    /// SM address and `ibacm` drops its cached paths): forgets every cached path of this
    /// client's port and sends every request from now on, the retransmissions of queries in
    /// flight included, to `dest`. Counted in [`SaStats::port_changes`].
    pub fn port_changed(&mut self, dest: SaDest) {
        self.cache.clear_port(self.cfg.port);
        self.cfg.dest = dest;
        self.stats.port_changes += 1;
    }

    /// The counters.
    pub fn stats(&self) -> SaStats {
        self.stats
    }

    /// The path cache.
    pub fn cache(&self) -> &PathCache {
        &self.cache
    }

    /// The path cache, to flush it (e.g. on an SM change or a port event).
    pub fn cache_mut(&mut self) -> &mut PathCache {
        &mut self.cache
    }

    /// How many queries are in flight.
    pub fn in_flight(&self) -> usize {
        self.queries.len()
    }

    /// Starts a PathRecord query; its result comes as an [`SaEvent::PathRecords`] with the
    /// returned ID (at once, with [`SaError::TooManyQueries`], when too many are in flight).
    pub fn query(&mut self, q: &PathQuery, now: Instant) -> QueryId {
        self.start(q, now, None)
    }

    /// The path to `dgid` in partition `pkey` with service level `sl` from this port's `sgid`:
    /// from the cache when it holds one that has not expired, else by a Get (one reversible
    /// path, SGID, DGID, P_Key and SL in the mask) whose answer fills the cache. A second call
    /// for the same key while that Get is in flight returns the same ID.
    pub fn resolve(&mut self, sgid: Gid, dgid: Gid, pkey: Pkey, sl: U4, now: Instant) -> Resolve {
        let key = CacheKey {
            port: self.cfg.port,
            dgid,
            pkey,
            sl,
        };
        if let Some(p) = self.cache.get(&key, now) {
            self.stats.cache_hits += 1;
            return Resolve::Cached(p);
        }
        self.stats.cache_misses += 1;
        if let Some(q) = self.queries.values().find(|q| q.key == Some(key)) {
            return Resolve::Pending(q.id);
        }
        let q = PathQuery {
            sl: Some(sl),
            ..PathQuery::by_gids(sgid, dgid, pkey)
        };
        Resolve::Pending(self.start(&q, now, Some(key)))
    }

    fn start(&mut self, q: &PathQuery, now: Instant, key: Option<CacheKey>) -> QueryId {
        let id = QueryId(self.next_id);
        self.next_id += 1;
        if self.queries.len() >= self.cfg.max_queries {
            self.events.push_back(SaEvent::PathRecords {
                id,
                result: Err(SaError::TooManyQueries),
            });
            return id;
        }
        let mut tid = self.next_tid;
        while self.queries.contains_key(&tid) {
            tid = tid.wrapping_add(1);
        }
        self.next_tid = tid.wrapping_add(1);
        let mad = q.to_mad(Tid(u64::from(tid))).to_bytes();
        self.queries.insert(
            tid,
            Query {
                id,
                mad,
                attempts: 1,
                deadline: now + self.cfg.timeout,
                rmpp: None,
                key,
            },
        );
        self.stats.sent += 1;
        self.out.push_back(SaTransmit {
            dest: self.cfg.dest,
            mad,
        });
        id
    }

    /// Ends a query without a result event other than [`SaError::Cancelled`].
    pub fn cancel(&mut self, id: QueryId) {
        self.queries.retain(|_, q| {
            if q.id == id {
                self.events.push_back(SaEvent::PathRecords {
                    id,
                    result: Err(SaError::Cancelled),
                });
                false
            } else {
                true
            }
        });
    }

    /// The next MAD to send.
    pub fn poll_transmit(&mut self) -> Option<SaTransmit> {
        self.out.pop_front()
    }

    /// The next result.
    pub fn poll_event(&mut self) -> Option<SaEvent> {
        self.events.pop_front()
    }

    /// When [`Self::handle_timeout`] must be called next.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.queries.values().map(|q| q.deadline).min()
    }

    /// Retransmits the requests whose attempt timed out, and ends those out of retries.
    pub fn handle_timeout(&mut self, now: Instant) {
        let max = 1 + u32::from(self.cfg.retries);
        let mut done = Vec::new();
        for (tid, q) in self.queries.iter_mut() {
            if q.deadline > now {
                continue;
            }
            if q.attempts >= max {
                done.push(*tid);
                continue;
            }
            q.attempts += 1;
            q.deadline = now + self.cfg.timeout;
            // A transfer cut off half-way starts again from the request.
            q.rmpp = None;
            self.stats.sent += 1;
            self.stats.resent += 1;
            self.out.push_back(SaTransmit {
                dest: self.cfg.dest,
                mad: q.mad,
            });
        }
        for tid in done {
            if let Some(q) = self.queries.remove(&tid) {
                self.stats.timeouts += 1;
                self.events.push_back(SaEvent::PathRecords {
                    id: q.id,
                    result: Err(SaError::Timeout {
                        attempts: q.attempts,
                    }),
                });
            }
        }
    }

    /// Takes a received MAD of class 0x03 (the 256 bytes after the umad header). Answers that
    /// match no query, and bytes that are no SA MAD, are counted as stray and dropped.
    pub fn handle_mad(&mut self, bytes: &[u8], now: Instant) {
        let Ok(mad) = SaMad::parse(bytes) else {
            self.stats.stray += 1;
            return;
        };
        let tid = (mad.header.tid.0 & 0xffff_ffff) as u32;
        let is_answer = mad.header.is_response() && mad.header.attr_id == attr::PATH_RECORD;
        let Some(q) = self.queries.get_mut(&tid).filter(|_| is_answer) else {
            self.stats.stray += 1;
            return;
        };
        if mad.header.status != 0 {
            self.finish(
                tid,
                Err(SaError::Status {
                    sa: mad.sa_status(),
                    mad_status: mad.header.status,
                }),
                now,
            );
            return;
        }
        if !(mad.rmpp.version != 0 && mad.rmpp.is_active()) {
            let data = mad.data.get(..mad.data_len).unwrap_or(&[]);
            let recs = if mad.header.method == method::GET_TABLE_RESP {
                // A table in one MAD without RMPP has no length: the records end at the first
                // all-zero one (no path has DLID and SLID 0).
                let mut recs = PathRecord::table(data, mad.attr_offset);
                let n = recs
                    .iter()
                    .position(|r| *r == PathRecord::default())
                    .unwrap_or(recs.len());
                recs.truncate(n);
                recs
            } else {
                PathRecord::table(data, 0)
            };
            self.finish(tid, Ok(recs), now);
            return;
        }
        match mad.rmpp.rmpp_type {
            rmpp_type::DATA => {}
            rmpp_type::STOP | rmpp_type::ABORT => {
                let e = SaError::RmppAborted {
                    rmpp_type: mad.rmpp.rmpp_type,
                    status: mad.rmpp.status,
                };
                self.finish(tid, Err(e), now);
                return;
            }
            _ => {
                self.stats.stray += 1;
                return;
            }
        }
        self.stats.rmpp_segments += 1;
        let seg = mad.rmpp.data1;
        let first = mad.rmpp.flags & rmpp_flags::FIRST != 0 || seg == 1;
        let r = match (&mut q.rmpp, first) {
            (None, true) if seg == 1 => q.rmpp.insert(Reassembly {
                last: 0,
                data: Vec::new(),
                attr_offset: mad.attr_offset,
            }),
            (Some(r), _) => r,
            // Not the first segment, nothing started: wait for the sender to go back.
            (None, _) => return,
        };
        q.deadline = now + self.cfg.timeout;
        if seg == r.last + 1 {
            r.last = seg;
            r.data.extend_from_slice(&mad.data);
        } else if seg > r.last + 1 {
            // A gap: drop it; the sender times out and resends from the last ACK.
            return;
        }
        // In order or a duplicate: acknowledge the last in-order segment.
        let last_seg = r.last;
        let done = mad.rmpp.flags & rmpp_flags::LAST != 0 && seg == last_seg;
        let ack = ack_for(&mad, last_seg, last_seg + self.cfg.rmpp_window);
        self.stats.rmpp_acks += 1;
        self.out.push_back(SaTransmit {
            dest: self.cfg.dest,
            mad: ack,
        });
        if done {
            // PayloadLength of the last segment: its SA header (20) + data bytes used.
            let pad = (ibcm_mad::sa::RMPP_SEG_PAYLOAD as u32).saturating_sub(mad.rmpp.data2);
            let pad = if pad as usize > SA_DATA_LEN {
                0
            } else {
                pad as usize
            };
            let len = r.data.len().saturating_sub(pad);
            r.data.truncate(len);
            let recs = PathRecord::table(&r.data, r.attr_offset);
            self.finish(tid, Ok(recs), now);
        }
    }

    fn finish(&mut self, tid: u32, result: Result<Vec<PathRecord>, SaError>, now: Instant) {
        let Some(q) = self.queries.remove(&tid) else {
            return;
        };
        if let Ok(recs) = &result {
            self.stats.answered += 1;
            for r in recs {
                let key = CacheKey {
                    port: self.cfg.port,
                    dgid: r.dgid,
                    pkey: r.pkey,
                    sl: r.sl,
                };
                self.cache.insert(key, *r, now);
            }
            if let Some(k) = q.key {
                // A path the SA gave under another SL or P_Key than asked still answers the
                // key it was asked for.
                if let Some(r) = recs.first() {
                    self.cache.insert(k, *r, now);
                }
            }
        }
        self.events
            .push_back(SaEvent::PathRecords { id: q.id, result });
    }
}

/// The ACK of an RMPP DATA segment: the segment's headers with the response bit cleared,
/// RMPPType ACK, Active flag, SegmentNumber `last`, NewWindowLast `new_window_last`, no data
/// (the kernel's `format_ack` in `drivers/infiniband/core/mad_rmpp.c` builds it the same way).
fn ack_for(data: &SaMad, last: u32, new_window_last: u32) -> [u8; SA_MAD_LEN] {
    let mut ack = SaMad {
        rmpp: RmppHeader {
            version: 1,
            rmpp_type: rmpp_type::ACK,
            resp_time: 0,
            flags: rmpp_flags::ACTIVE,
            status: 0,
            data1: last,
            data2: new_window_last,
        },
        data: [0; SA_DATA_LEN],
        ..data.clone()
    };
    ack.header.method = Method::from_raw(data.header.method.raw() & !0x80);
    ack.header.status = 0;
    ack.to_bytes()
}

#[cfg(test)]
mod tests;
