//! PathRecord exchanges: SA queries paired with their answers, and handed to the REQs they
//! served.
//!
//! # Pairing by TID
//! A PathRecord Get / GetTable opens an exchange under its TID; the GetResp / GetTableResp
//! with the same whole 64-bit TID answers it. The kernel's MAD layer puts its agent number in
//! TID bits 63–32 of what it sends (`ib_umad` does for user-space senders; simulators such as
//! ibsim rewrite them too), so both packets on the wire carry the same TID and the whole TID
//! is matched first. Only when no open query has it is an answer paired with the newest
//! unanswered query that has the same TID bits 31–0 and was sent from the address the answer
//! goes to (a capture merged from a host's user-space log and the wire, or a stack that
//! rewrites the upper bits on one direction only); such a pairing is marked
//! ([`SaLink::tid_low`], `"tid_match":"low32"` in JSON). An answer whose query is not in the
//! capture is an exchange of its own. A query sent again with its TID before the answer is a
//! retransmission ([`SaQuery::sends`]); a second answer is a duplicate, counted and ignored.
//!
//! An RMPP answer (a GetTableResp in several MADs) is put together from its DATA segments by
//! segment number (at most [`MAX_SEGMENTS`]; later ones are counted, their records not
//! read) and is complete with its Last segment; its records end where the Last segment's
//! PayloadLength says. RMPP ACKs are only counted; a STOP or ABORT ends the answer with what
//! came.
//!
//! # The REQ an answer served
//! When a connection's first REQ comes, its primary path (and its alternate path, when
//! present) is looked up among the answered exchanges: the newest whose answer (status 0)
//! came at or before the REQ and holds a record with the REQ path's GIDs (SGID = local,
//! DGID = remote) and LIDs (SLID = local, DLID = remote; not compared when the REQ has the
//! permissive LID 0xFFFF in both, a path across routers) served it. The connection gets a
//! copy of the exchange and the record ([`SaLink`]), with the fields in which the REQ
//! disagrees with the record (`crate::sa::path_differs`). One answer may serve several
//! connections (a path cache).
//!
//! # Memory bound
//! At most [`MAX_EXCHANGES`] exchanges are kept; the oldest is then finished (handed over by
//! [`Tracker::drain_sa`] like a finished connection), and so is every exchange at the end of
//! the file: the views list those that served no connection.

use std::collections::VecDeque;
use std::time::Duration;

use ibcm_mad::sa::{rmpp_type, PathRecord};
use ibcm_mad::{Gid, Method, PathInfo, Req};

use super::Tracker;
use crate::hash::FastMap;
use crate::sa::{
    last_segment_data, path_differs, path_matches, table_records, ReqWide, SaEvent, DATA_LEN,
    MAX_SEGMENTS,
};
use crate::trace::WireAddr;

/// Most exchanges kept at once.
pub(crate) const MAX_EXCHANGES: usize = 4096;
/// Most exchanges remembered per pair of GIDs for the REQ look-up (the newest).
const PER_PATH: usize = 8;

/// A PathRecord query.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SaQuery {
    /// Frame of its first transmission.
    pub(crate) frame: u64,
    /// Capture time of its first transmission.
    pub(crate) time: Duration,
    /// Get or GetTable.
    pub(crate) method: Method,
    /// Which template fields it matches on.
    pub(crate) comp_mask: u64,
    /// The template record.
    pub(crate) template: PathRecord,
    /// Who asked.
    pub(crate) src: WireAddr,
    /// The SA's address.
    pub(crate) dst: WireAddr,
    /// Transmissions (more than 1: retransmitted with the same TID).
    pub(crate) sends: u32,
}

/// What an answer was, without its records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SaAnswer {
    /// Frame of its (last) MAD.
    pub(crate) frame: u64,
    /// Capture time of its (last) MAD.
    pub(crate) time: Duration,
    /// GetResp or GetTableResp.
    pub(crate) method: Method,
    /// MAD status (0: success).
    pub(crate) status: u16,
    /// PathRecords in it.
    pub(crate) records: u32,
    /// RMPP DATA segments (0: not an RMPP transfer).
    pub(crate) segments: u32,
    /// Segments beyond [`MAX_SEGMENTS`], or an RMPP transfer that ended by STOP/ABORT or
    /// never saw its Last segment: the records are those that came.
    pub(crate) partial: bool,
}

/// The RMPP segments of an answer being put together.
#[derive(Debug, Clone, Default)]
struct Reassembly {
    /// SA data by segment (segment n at `(n - 1) * 200`).
    data: Vec<u8>,
    /// Segments seen (by number, up to [`MAX_SEGMENTS`]).
    seen: u32,
    /// Segments received, all numbers.
    count: u32,
    /// Segments with a number beyond [`MAX_SEGMENTS`].
    beyond: bool,
    /// The Last segment's number and data bytes.
    last: Option<(u32, usize)>,
    /// The AttributeOffset the segments give (the spacing of the records).
    attr_offset: u16,
}

/// One PathRecord exchange.
#[derive(Debug, Clone)]
pub(crate) struct Exchange {
    /// 1, 2, … in order of first appearance in the file.
    pub(crate) id: u64,
    /// The TID (the answer's when it came).
    pub(crate) tid: u64,
    /// The answer was paired by TID bits 31–0 only (module docs).
    pub(crate) tid_low: bool,
    /// The query, when it is in the capture.
    pub(crate) query: Option<SaQuery>,
    /// The answer, once complete.
    pub(crate) answer: Option<SaAnswer>,
    /// The answer's records.
    pub(crate) records: Vec<PathRecord>,
    /// Connections whose REQ followed one of its records.
    pub(crate) served: u32,
    /// Answers seen again after the first (same TID).
    pub(crate) repeats: u32,
    /// An RMPP answer in progress.
    rmpp: Option<Box<Reassembly>>,
    /// Method, status, first frame and time of an RMPP answer in progress.
    pending: Option<SaAnswer>,
}

impl Exchange {
    /// The time the views order it by: its query's, else its answer's.
    pub(crate) fn first_time(&self) -> Duration {
        self.query
            .map(|q| q.time)
            .or(self.answer.map(|a| a.time))
            .or(self.pending.map(|a| a.time))
            .unwrap_or_default()
    }
}

/// The PathRecord exchange that gave a REQ one of its paths.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SaLink {
    /// The exchange's number.
    pub(crate) exchange: u64,
    /// Its TID.
    pub(crate) tid: u64,
    /// Paired by TID bits 31–0 only.
    pub(crate) tid_low: bool,
    /// The query, when in the capture.
    pub(crate) query: Option<SaQuery>,
    /// The answer.
    pub(crate) answer: SaAnswer,
    /// The record the REQ path follows, and its index in the answer.
    pub(crate) record: PathRecord,
    /// Index of `record` in the answer (0-based).
    pub(crate) index: u32,
    /// The REQ path.
    pub(crate) path: PathInfo,
    /// For the primary path: the REQ's Path MTU and P_Key.
    pub(crate) wide: Option<ReqWide>,
    /// Where the REQ path disagrees with the record (`crate::sa::path_differs`).
    pub(crate) differs: u16,
}

/// The exchanges that served a connection's REQ.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct SaLinks {
    /// The primary path's.
    pub(crate) primary: Option<SaLink>,
    /// The alternate path's.
    pub(crate) alternate: Option<SaLink>,
}

impl SaLinks {
    /// Whether the REQ disagrees with a record it follows.
    pub(crate) fn differs(&self) -> bool {
        [self.primary, self.alternate]
            .iter()
            .flatten()
            .any(|l| l.differs != 0)
    }
}

/// What the per-MAD views say about a REQ whose paths came from the SA (kept small: every
/// message's note carries one; frame 0, which no record has, is "none").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct SaNote {
    primary_frame: u64,
    alternate_frame: u64,
    primary_differs: u16,
    alternate_differs: u16,
}

impl SaNote {
    /// Frame of the answer the primary path follows, and where the REQ disagrees with it.
    pub(crate) fn primary(&self) -> Option<(u64, u16)> {
        (self.primary_frame != 0).then_some((self.primary_frame, self.primary_differs))
    }

    /// The same for the alternate path.
    pub(crate) fn alternate(&self) -> Option<(u64, u16)> {
        (self.alternate_frame != 0).then_some((self.alternate_frame, self.alternate_differs))
    }

    /// Whether the note says nothing (the message's connection follows no SA answer).
    pub(crate) fn is_empty(&self) -> bool {
        self.primary_frame == 0 && self.alternate_frame == 0
    }
}

impl SaLinks {
    /// The per-MAD note.
    pub(crate) fn note(&self) -> SaNote {
        SaNote {
            primary_frame: self.primary.map_or(0, |l| l.answer.frame),
            alternate_frame: self.alternate.map_or(0, |l| l.answer.frame),
            primary_differs: self.primary.map_or(0, |l| l.differs),
            alternate_differs: self.alternate.map_or(0, |l| l.differs),
        }
    }
}

/// Counters of SA traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct SaCounts {
    /// SA MADs (any attribute).
    pub(crate) mads: u64,
    /// RMPP ACK / STOP / ABORT MADs.
    pub(crate) rmpp_control: u64,
    /// Answers seen again (same TID).
    pub(crate) repeats: u64,
    /// Queries sent again (same TID, before the answer).
    pub(crate) query_resends: u64,
}

/// The PathRecord exchanges of one file.
#[derive(Debug, Default)]
pub(crate) struct SaTable {
    /// Live exchanges, oldest first (ids consecutive: `ring[i].id == front id + i`).
    ring: VecDeque<Exchange>,
    next_id: u64,
    /// TID → exchange id, for the exchanges waiting for (the rest of) their answer.
    open: FastMap<u64, u64>,
    /// (TID bits 31–0, asker) → exchange id, for the queries waiting for their answer (the
    /// pairing by the lower TID bits, without a scan).
    open_low: FastMap<(u32, WireAddr), u64>,
    /// TID → exchange id, for the answered exchanges (an answer seen again).
    answered: FastMap<u64, u64>,
    /// (SGID, DGID) of an answer's records → exchange ids, newest last.
    by_gids: FastMap<(Gid, Gid), Vec<u64>>,
    /// Exchanges finished and not yet handed over.
    done: Vec<Exchange>,
    /// Counters.
    pub(crate) counts: SaCounts,
}

impl SaTable {
    /// Whether an answered exchange is kept (a REQ may look for its path).
    pub(crate) fn has_answers(&self) -> bool {
        !self.by_gids.is_empty()
    }

    fn get_mut(&mut self, id: u64) -> Option<&mut Exchange> {
        let front = self.ring.front()?.id;
        let i = usize::try_from(id.checked_sub(front)?).ok()?;
        self.ring.get_mut(i)
    }

    fn get(&self, id: u64) -> Option<&Exchange> {
        let front = self.ring.front()?.id;
        let i = usize::try_from(id.checked_sub(front)?).ok()?;
        self.ring.get(i)
    }

    fn open_exchange(&mut self, tid: u64) -> u64 {
        if self.ring.len() >= MAX_EXCHANGES {
            if let Some(old) = self.ring.pop_front() {
                self.forget(&old);
                self.done.push(old);
            }
        }
        self.next_id += 1;
        let id = self.next_id;
        self.ring.push_back(Exchange {
            id,
            tid,
            tid_low: false,
            query: None,
            answer: None,
            records: Vec::new(),
            served: 0,
            repeats: 0,
            rmpp: None,
            pending: None,
        });
        id
    }

    /// Removes the index entries of an exchange that leaves the table.
    fn forget(&mut self, x: &Exchange) {
        if self.open.get(&x.tid) == Some(&x.id) {
            self.open.remove(&x.tid);
        }
        if self.answered.get(&x.tid) == Some(&x.id) {
            self.answered.remove(&x.tid);
        }
        if let Some(q) = &x.query {
            let k = (x.tid as u32, q.src);
            if self.open_low.get(&k) == Some(&x.id) {
                self.open_low.remove(&k);
            }
        }
        for r in &x.records {
            let k = (r.sgid, r.dgid);
            if let Some(ids) = self.by_gids.get_mut(&k) {
                ids.retain(|&i| i != x.id);
                if ids.is_empty() {
                    self.by_gids.remove(&k);
                }
            }
        }
    }

    /// Takes one SA MAD.
    pub(crate) fn observe(&mut self, ev: &SaEvent) {
        self.counts.mads += 1;
        if !ev.is_path() {
            return;
        }
        let tid = ev.mad.header.tid.0;
        let rmpp = ev.mad.rmpp;
        if rmpp.is_active() && rmpp.rmpp_type != rmpp_type::DATA {
            self.counts.rmpp_control += 1;
            // A STOP or ABORT ends the transfer with what came.
            if matches!(rmpp.rmpp_type, rmpp_type::STOP | rmpp_type::ABORT) {
                if let Some(id) = self.open.get(&tid).copied() {
                    self.complete(id, true);
                }
            }
            return;
        }
        if ev.is_query() {
            self.query(ev, tid);
        } else if ev.is_answer() {
            self.answer(ev, tid);
        }
    }

    fn query(&mut self, ev: &SaEvent, tid: u64) {
        let q = SaQuery {
            frame: ev.frame,
            time: ev.time,
            method: ev.mad.header.method,
            comp_mask: ev.mad.comp_mask,
            template: ev.template(),
            src: ev.src,
            dst: ev.dst,
            sends: 1,
        };
        if let Some(id) = self.open.get(&tid).copied() {
            if let Some(x) = self.get_mut(id) {
                match x.query.as_mut() {
                    // Sent again before the answer (complete) came.
                    Some(mine) => {
                        mine.sends += 1;
                        self.counts.query_resends += 1;
                    }
                    // The answer came first (the two were captured out of order).
                    None => x.query = Some(q),
                }
                return;
            }
        }
        let id = self.open_exchange(tid);
        if let Some(x) = self.get_mut(id) {
            x.query = Some(q);
        }
        self.open.insert(tid, id);
        self.open_low.insert((tid as u32, ev.src), id);
    }

    /// The open exchange an answer with `tid` to `to` belongs to (module docs), and whether
    /// it was found by TID bits 31–0 only.
    fn pair(&self, tid: u64, to: WireAddr) -> Option<(u64, bool)> {
        if let Some(&id) = self.open.get(&tid) {
            return Some((id, false));
        }
        let id = *self.open_low.get(&(tid as u32, to))?;
        self.get(id)
            .filter(|x| {
                x.answer.is_none()
                    && x.pending.is_none()
                    && x.tid as u32 == tid as u32
                    && x.query.is_some_and(|q| q.src == to)
            })
            .map(|x| (x.id, true))
    }

    fn answer(&mut self, ev: &SaEvent, tid: u64) {
        let found = self.pair(tid, ev.dst);
        if found.is_none() {
            // An answer seen again after it was complete.
            if let Some(id) = self.answered.get(&tid).copied() {
                if let Some(x) = self.get_mut(id) {
                    x.repeats += 1;
                }
                self.counts.repeats += 1;
                return;
            }
        }
        let (id, low) = match found {
            Some(f) => f,
            None => (self.open_exchange(tid), false),
        };
        if low {
            // The answer's TID from here on (its later RMPP segments).
            if let Some(old) = self.get(id).map(|x| x.tid) {
                self.open.remove(&old);
            }
        }
        if low {
            self.open_low.remove(&(tid as u32, ev.dst));
        }
        self.open.insert(tid, id);
        let Some(x) = self.get_mut(id) else {
            return;
        };
        x.tid = tid;
        x.tid_low |= low;
        let head = x.pending.get_or_insert(SaAnswer {
            frame: ev.frame,
            time: ev.time,
            method: ev.mad.header.method,
            status: ev.mad.header.status,
            records: 0,
            segments: 0,
            partial: false,
        });
        head.frame = ev.frame;
        head.time = ev.time;
        match ev.rmpp_data() {
            None => {
                x.records = ev.records();
                self.complete(id, false);
            }
            Some((seg, _first, last)) => {
                let r = x.rmpp.get_or_insert_with(Box::default);
                r.count += 1;
                if r.attr_offset == 0 {
                    r.attr_offset = ev.mad.attr_offset;
                }
                let n = usize::try_from(seg).unwrap_or(usize::MAX);
                if (1..=MAX_SEGMENTS).contains(&n) {
                    let at = (n - 1) * DATA_LEN;
                    if r.data.len() < at + DATA_LEN {
                        r.data.resize(at + DATA_LEN, 0);
                    }
                    if let Some(dst) = r.data.get_mut(at..at + DATA_LEN) {
                        dst.copy_from_slice(&ev.mad.data);
                    }
                    r.seen |= 1 << (n - 1);
                } else {
                    r.beyond = true;
                }
                if last {
                    r.last = Some((seg, last_segment_data(ev.mad.rmpp.data2)));
                    self.complete(id, false);
                }
            }
        }
    }

    /// Completes the answer of exchange `id` (`stopped`: by an RMPP STOP or ABORT).
    fn complete(&mut self, id: u64, stopped: bool) {
        let Some(x) = self.get_mut(id) else {
            return;
        };
        let Some(mut a) = x.pending.take() else {
            return;
        };
        if let Some(r) = x.rmpp.take() {
            a.segments = r.count;
            let (valid, whole) = match r.last {
                Some((n, bytes)) => {
                    let n = usize::try_from(n).unwrap_or(usize::MAX);
                    let all = (1..=n.min(MAX_SEGMENTS)).all(|s| r.seen & (1 << (s - 1)) != 0);
                    let whole = all && n <= MAX_SEGMENTS;
                    // With a segment missing, the gap reads as zeros: no length to believe.
                    let valid = n
                        .checked_sub(1)
                        .map(|k| k * DATA_LEN + bytes)
                        .filter(|_| whole);
                    (valid, whole)
                }
                None => (None, false),
            };
            a.partial = stopped || r.beyond || !whole;
            x.records = if a.status == 0 {
                table_records(&r.data, r.attr_offset, valid)
            } else {
                Vec::new()
            };
        }
        a.records = u32::try_from(x.records.len()).unwrap_or(u32::MAX);
        x.answer = Some(a);
        let tid = x.tid;
        let asker = x.query.map(|q| (x.tid as u32, q.src));
        let keys: Vec<(Gid, Gid)> = x.records.iter().map(|r| (r.sgid, r.dgid)).collect();
        if self.open.get(&tid) == Some(&id) {
            self.open.remove(&tid);
        }
        if let Some(k) = asker {
            if self.open_low.get(&k) == Some(&id) {
                self.open_low.remove(&k);
            }
        }
        self.answered.insert(tid, id);
        if a.status != 0 {
            return;
        }
        for k in keys {
            let ids = self.by_gids.entry(k).or_default();
            if ids.last() != Some(&id) {
                ids.push(id);
            }
            if ids.len() > PER_PATH {
                ids.remove(0);
            }
        }
    }

    /// The newest answered exchange, at or before `time`, with a record for path `p`: its id
    /// and the record's index.
    fn find(&self, p: &PathInfo, time: Duration) -> Option<(u64, usize)> {
        let ids = self.by_gids.get(&(p.local_gid, p.remote_gid))?;
        ids.iter().rev().find_map(|&id| {
            let x = self.get(id)?;
            let a = x.answer?;
            if a.status != 0 || a.time > time {
                return None;
            }
            x.records
                .iter()
                .position(|r| path_matches(p, r))
                .map(|i| (id, i))
        })
    }

    fn link(&mut self, p: &PathInfo, wide: Option<ReqWide>, time: Duration) -> Option<SaLink> {
        let (id, i) = self.find(p, time)?;
        let x = self.get_mut(id)?;
        let record = *x.records.get(i)?;
        x.served += 1;
        Some(SaLink {
            exchange: x.id,
            tid: x.tid,
            tid_low: x.tid_low,
            query: x.query,
            answer: x.answer?,
            record,
            index: u32::try_from(i).unwrap_or(u32::MAX),
            path: *p,
            wide,
            differs: path_differs(p, &record, wide),
        })
    }

    /// The exchanges that gave the REQ `r` (sent at `time`) its paths, if any.
    pub(crate) fn serve(&mut self, r: &Req, time: Duration) -> Option<Box<SaLinks>> {
        let wide = ReqWide {
            mtu: r.path_mtu,
            pkey: r.partition_key,
        };
        let primary = self.link(&r.primary_path, Some(wide), time);
        let alternate = if r.alternate_path.is_present() {
            self.link(&r.alternate_path, None, time)
        } else {
            None
        };
        (primary.is_some() || alternate.is_some()).then(|| Box::new(SaLinks { primary, alternate }))
    }

    /// Finishes every exchange (end of file).
    pub(crate) fn finish_all(&mut self) {
        let ids: Vec<u64> = self
            .ring
            .iter()
            .filter(|x| x.pending.is_some())
            .map(|x| x.id)
            .collect();
        // An RMPP answer without its Last segment: what came.
        for id in ids {
            self.complete(id, true);
        }
        self.done.extend(self.ring.drain(..));
        self.open.clear();
        self.open_low.clear();
        self.answered.clear();
        self.by_gids.clear();
    }
}

impl Tracker {
    /// Takes one SA MAD.
    pub(crate) fn observe_sa(&mut self, ev: &SaEvent) {
        if ev.time > self.now {
            self.now = ev.time;
        }
        self.sa.observe(ev);
    }

    /// Hands every PathRecord exchange finished so far (the oldest beyond the table's bound,
    /// or all of them after [`Tracker::finish_all`]) to `f`, in order of first appearance.
    ///
    /// # Errors
    /// The first error of `f` (the exchanges not handed over are dropped).
    pub(crate) fn drain_sa<E>(
        &mut self,
        mut f: impl FnMut(&Exchange) -> Result<(), E>,
    ) -> Result<(), E> {
        let mut done = std::mem::take(&mut self.sa.done);
        done.sort_by_key(|x| x.id);
        let mut result = Ok(());
        for x in &done {
            if result.is_ok() {
                result = f(x);
            }
        }
        result
    }

    /// Whether PathRecord exchanges finished since the last [`Tracker::drain_sa`].
    pub(crate) fn has_sa_done(&self) -> bool {
        !self.sa.done.is_empty()
    }

    /// The SA counters of the file.
    pub(crate) fn sa_counts(&self) -> SaCounts {
        self.sa.counts
    }
}

#[cfg(test)]
mod tests;
