//! The application of one node: its processes start their operations with a window each,
//! accept what others start, and record when every connection end is complete.

use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::rc::Rc;
use std::time::{Duration, Instant};

use ibcm::proto::{
    AcceptParams, CallError, ConnId, ConnectError, ConnectParams, Endpoint, Event, EventKind,
    PeerAddr, SidrRepParams, SidrReqParams,
};
use ibcm::App;
use ibcm_mad::xrc::{OwnershipPolicy, ReqMode, XrcReqData};
use ibcm_mad::{Qkey, Qpn, RejReason, ReqTransport, ServiceId};

use super::plan::{Cursor, Mode, Op, Shape};

/// The service every node listens on.
pub(crate) const SERVICE: ServiceId = ServiceId(0x1_0000_0777);

/// The first QPN a node hands out (below: the special QPs and the verbs' own).
pub(crate) const FIRST_QPN: u32 = 0x100;
/// QPNs given up kept for reuse while fresh numbers remain.
const FREE_KEEP: usize = 1 << 16;
/// QPNs tried for one connect before the operation waits for one.
const CONNECT_TRIES: usize = 8;
/// How long an operation waits for a QPN before it is tried again.
const QPN_WAIT: Duration = Duration::from_millis(10);

/// What all applications of one run share.
#[derive(Debug, Default)]
pub(crate) struct Shared {
    /// Operations the modelled peers start now, mirrored from node 0's (per-node model).
    pub mirror: Vec<(u32, Op)>,
    /// Tracked nodes whose connection ends are not all complete.
    pub incomplete: u64,
    /// Connections or SIDR exchanges that failed and were started again.
    pub restarts: u64,
    /// Operations the endpoint refused to start (e.g. a QPN still in use: this application
    /// numbers QPs from a 24-bit counter without reuse); they are not retried, so the mesh
    /// stays incomplete.
    pub refused: u64,
    /// QPNs the endpoint refused (still in TimeWait or in use) that were replaced by another.
    pub qpn_retries: u64,
    /// Operations that had to wait for a QPN (every one tried was refused).
    pub qpn_waits: u64,
    /// Half-dead connections: (node that started it, its QPN). The passive side gave up on
    /// it after its REP retries and the REJ saying so may have been lost; the runtime that
    /// started it notices at its first use of the QP ([`DETECT`] later).
    pub dead: Vec<(u32, Qpn)>,
}

/// When a runtime notices that the QP of a connection it believes established has no peer:
/// its first send exhausts the transport retries (7 × 4.096 µs × 2¹⁵ ≈ 0.94 s).
pub(crate) const DETECT: Duration = Duration::from_micros(939_524);

/// A connection this node accepted.
#[derive(Debug, Clone, Copy)]
enum Passive {
    /// RC, for local process `q`.
    Rc { q: u32 },
    /// XRC TGT for a process's INI.
    Tgt,
    /// The TGT of a physical connection from `node` (xrc-sidr).
    Phys { node: u32 },
}

/// A connection this node accepted: what it is for, and who started it with which QP.
#[derive(Debug, Clone, Copy)]
struct Accepted {
    kind: Passive,
    from: u32,
    qpn: Qpn,
    /// This node's QP for it.
    local: Qpn,
}

#[derive(Debug, Default)]
struct Worker {
    cursor: Cursor,
    outstanding: u32,
    again: Vec<Op>,
}

/// Node-wide addressing of the run.
#[derive(Debug)]
pub(crate) struct Fabric {
    pub shape: Shape,
    pub addrs: Vec<PeerAddr>,
    pub index: HashMap<PeerAddr, u32>,
    pub policy: OwnershipPolicy,
    pub window: u32,
    pub epoch: Instant,
    /// The first QPN each node hands out ([`FIRST_QPN`]; tests start near the top of the
    /// 24-bit space).
    pub first_qpn: u32,
}

/// The application of one node.
pub(crate) struct WireupApp {
    fab: Rc<Fabric>,
    shared: Rc<RefCell<Shared>>,
    node: u32,
    /// Starts its own lists (otherwise only what it is told: a modelled peer).
    drive: bool,
    started: bool,
    /// Counts its completion in `Shared::incomplete`.
    tracked: bool,
    /// Node 0 of the per-node model: mirrors each operation it starts onto a peer.
    mirroring: bool,
    workers: Vec<Worker>,
    active: HashMap<ConnId, Op>,
    passive: HashMap<ConnId, Accepted>,
    /// Established connections this node started, with their QPN: if one is closed (the
    /// peer gave up on it), it is set up again.
    up: HashMap<ConnId, (Op, Qpn)>,
    /// QPN → connection, for `up`.
    up_qpn: HashMap<Qpn, ConnId>,
    /// Half-dead connections noticed at these times (ascending).
    notices: std::collections::VecDeque<(Instant, Qpn)>,
    /// QPN of each connection being started.
    qpn_of: HashMap<ConnId, Qpn>,
    /// Connections started again after an established one was closed: their completion
    /// was counted already.
    redo: HashSet<ConnId>,
    next_qpn: u32,
    /// QPNs of QPs given up (failed attempts, connections the peer closed), for reuse once
    /// the 24-bit space is used up, as a runtime reuses the QPs of failed attempts.
    free_qpns: std::collections::VecDeque<Qpn>,
    /// Operations waiting for a free QPN (every one tried was still in TimeWait or in use):
    /// when to try again, and whether it is a restart of an established one (`redo`).
    later: std::collections::VecDeque<(Instant, Op, bool)>,
    /// QPs this node created (INI, TGT, RC).
    pub qps: u64,
    proc_left: Vec<u64>,
    /// Per process: when all it waits for was complete.
    pub proc_done: Vec<Option<Duration>>,
    ends_left: u64,
    /// When the last connection end of this node was complete.
    pub last: Option<Duration>,
    phys_out: Vec<bool>,
    phys_in: Vec<bool>,
    waiting: HashMap<u32, Vec<u32>>,
    /// SIDR exchanges answered, as (remote node, remote process, local process): a
    /// retransmitted SIDR_REQ is answered again but counted once.
    answered: HashSet<(u32, u32, u32)>,
}

impl WireupApp {
    pub(crate) fn new(
        fab: Rc<Fabric>,
        shared: Rc<RefCell<Shared>>,
        node: u32,
        drive: bool,
        tracked: bool,
        mirroring: bool,
    ) -> Self {
        let s = fab.shape;
        let nodes = s.nodes as usize;
        if tracked {
            shared.borrow_mut().incomplete += 1;
        }
        WireupApp {
            node,
            drive,
            started: false,
            tracked,
            mirroring,
            workers: (0..s.workers()).map(|_| Worker::default()).collect(),
            active: HashMap::new(),
            passive: HashMap::new(),
            up: HashMap::new(),
            up_qpn: HashMap::new(),
            notices: std::collections::VecDeque::new(),
            qpn_of: HashMap::new(),
            redo: HashSet::new(),
            next_qpn: fab.first_qpn,
            free_qpns: std::collections::VecDeque::new(),
            later: std::collections::VecDeque::new(),
            qps: 0,
            proc_left: vec![s.per_process(); s.ppn as usize],
            proc_done: vec![None; s.ppn as usize],
            ends_left: s.ends_per_node(),
            last: None,
            phys_out: vec![false; if s.mode == Mode::XrcSidr { nodes } else { 0 }],
            phys_in: vec![false; if s.mode == Mode::XrcSidr { nodes } else { 0 }],
            waiting: HashMap::new(),
            answered: HashSet::new(),
            fab,
            shared,
        }
    }

    /// A QPN for a new QP: a fresh one while the 24-bit space lasts, then one given up
    /// (oldest first; the endpoint refuses one still in TimeWait and the caller takes another).
    fn qpn(&mut self) -> Qpn {
        if self.next_qpn <= Qpn::MAX {
            let q = Qpn::masked(self.next_qpn);
            self.next_qpn += 1;
            return q;
        }
        match self.free_qpns.pop_front() {
            Some(q) => q,
            // Every QPN is held by a live QP: the endpoint refuses the duplicate.
            None => Qpn::masked(self.fab.first_qpn),
        }
    }

    /// `q`'s QP was given up: its number may be used again.
    fn release(&mut self, q: Qpn) {
        if self.next_qpn > Qpn::MAX {
            self.free_qpns.push_back(q);
        } else if self.free_qpns.len() < FREE_KEEP {
            // Kept for later, bounded while fresh numbers remain.
            self.free_qpns.push_back(q);
        }
    }

    fn addr(&self, node: u32) -> Option<PeerAddr> {
        self.fab.addrs.get(node as usize).copied()
    }

    fn since(&self, now: Instant) -> Duration {
        now.saturating_duration_since(self.fab.epoch)
    }

    fn worker_of(&self, op: Op) -> usize {
        match op {
            Op::Rc { p, .. } | Op::Xrc { p, .. } | Op::Sidr { p, .. } => p as usize,
            Op::Phys { .. } => self.fab.shape.ppn as usize,
        }
    }

    /// The passive side gave up on the connection of QP `qpn`: noticed [`DETECT`] from now.
    pub(crate) fn notice(&mut self, now: Instant, qpn: Qpn) {
        self.notices.push_back((now + DETECT, qpn));
    }

    /// Starts `op` now.
    pub(crate) fn issue(&mut self, ep: &mut Endpoint, now: Instant, op: Op) -> bool {
        // Waiting for a QPN counts as started.
        !matches!(self.start(ep, now, op, self.mirroring, false), Err(false))
    }

    /// Starts `op` again after its established connection was closed (not mirrored: the
    /// mirrored peer's own connection was not closed).
    fn again(&mut self, ep: &mut Endpoint, now: Instant, op: Op) {
        self.shared.borrow_mut().restarts += 1;
        if let Ok(id) = self.start(ep, now, op, false, true) {
            self.redo.insert(id);
        }
    }

    /// Starts `op`: its connection, or `Err(true)` when it waits for a free QPN (tried again
    /// after [`QPN_WAIT`]), `Err(false)` when the endpoint refused it.
    fn start(
        &mut self,
        ep: &mut Endpoint,
        now: Instant,
        op: Op,
        mirror: bool,
        redo: bool,
    ) -> Result<ConnId, bool> {
        let s = self.fab.shape;
        let target = match op {
            Op::Rc { node, .. }
            | Op::Xrc { node, .. }
            | Op::Phys { node }
            | Op::Sidr { node, .. } => node,
        };
        let peer = self.addr(target).ok_or(false)?;
        let mut used = None;
        let started = match op {
            Op::Rc { q, .. } => self.connect(ep, now, &mut used, |qpn| {
                let mut p = ConnectParams::new(peer, SERVICE, qpn);
                p.private_data = q.to_be_bytes().to_vec();
                p
            }),
            Op::Xrc { .. } | Op::Phys { .. } => {
                let pd = XrcReqData {
                    mode: ReqMode::Create,
                    policy: Some(self.fab.policy),
                }
                .to_bytes()
                .to_vec();
                self.connect(ep, now, &mut used, |qpn| {
                    let mut p = ConnectParams::new(peer, SERVICE, qpn).xrc();
                    p.private_data = pd.clone();
                    p
                })
            }
            Op::Sidr { p: from, q, .. } => {
                let mut p = SidrReqParams::new(peer, SERVICE);
                p.private_data = [q.to_be_bytes(), from.to_be_bytes()].concat();
                ep.sidr_request(now, p).map_err(|_| false)
            }
        };
        match started {
            Ok(id) => {
                if !matches!(op, Op::Sidr { .. }) {
                    self.qps += 1;
                }
                self.active.insert(id, op);
                if let Some(q) = used {
                    self.qpn_of.insert(id, q);
                }
            }
            Err(true) => {
                self.shared.borrow_mut().qpn_waits += 1;
                self.later.push_back((now + QPN_WAIT, op, redo));
            }
            Err(false) => self.shared.borrow_mut().refused += 1,
        }
        if mirror {
            // By symmetry, when node 0 starts `op` towards node d, node N−d starts the same
            // operation towards node 0 (unless the pair is node 0's to start).
            let peer_node = (s.nodes - target) % s.nodes;
            let mirrored = match op {
                Op::Rc { p, q, .. } => {
                    s.initiates(peer_node, p, 0, q)
                        .then_some(Op::Rc { p, node: 0, q })
                }
                Op::Sidr { p, q, .. } => {
                    s.initiates(peer_node, p, 0, q)
                        .then_some(Op::Sidr { p, node: 0, q })
                }
                Op::Xrc { p, .. } => Some(Op::Xrc { p, node: 0 }),
                Op::Phys { .. } => Some(Op::Phys { node: 0 }),
            };
            if let Some(m) = mirrored {
                self.shared.borrow_mut().mirror.push((peer_node, m));
            }
        }
        started
    }

    fn refill(&mut self, ep: &mut Endpoint, now: Instant, w: usize) {
        if !self.drive {
            return;
        }
        let s = self.fab.shape;
        loop {
            let Some(worker) = self.workers.get_mut(w) else {
                return;
            };
            if worker.outstanding >= self.fab.window {
                return;
            }
            // A restart after a failure is not mirrored again: the mirrored peer's own
            // operation is independent and restarts itself when it fails.
            let (op, fresh) = match worker.again.pop() {
                Some(op) => (op, false),
                None => match s.next_op(self.node, w as u32, &mut worker.cursor) {
                    Some(op) => (op, true),
                    None => return,
                },
            };
            worker.outstanding += 1;
            let mirror = self.mirroring && fresh;
            if matches!(self.start(ep, now, op, mirror, false), Err(false)) {
                if let Some(worker) = self.workers.get_mut(w) {
                    worker.outstanding = worker.outstanding.saturating_sub(1);
                }
            }
        }
    }

    fn node_end(&mut self, now: Instant) {
        self.last = Some(self.since(now));
        self.ends_left = self.ends_left.saturating_sub(1);
        if self.ends_left == 0 && self.tracked {
            let mut sh = self.shared.borrow_mut();
            sh.incomplete = sh.incomplete.saturating_sub(1);
        }
    }

    fn proc_end(&mut self, now: Instant, p: u32) {
        let at = self.since(now);
        if let Some(left) = self.proc_left.get_mut(p as usize) {
            *left = left.saturating_sub(1);
            if *left == 0 {
                if let Some(d) = self.proc_done.get_mut(p as usize) {
                    *d = Some(at);
                }
            }
        }
        self.node_end(now);
    }

    fn logical(&mut self, now: Instant, p: u32, node: u32) {
        let i = node as usize;
        if self.phys_out.get(i) == Some(&true) && self.phys_in.get(i) == Some(&true) {
            self.proc_end(now, p);
        } else {
            self.waiting.entry(node).or_default().push(p);
        }
    }

    fn phys_up(&mut self, now: Instant, node: u32, out: bool) {
        let v = if out {
            &mut self.phys_out
        } else {
            &mut self.phys_in
        };
        if let Some(b) = v.get_mut(node as usize) {
            *b = true;
        }
        self.node_end(now);
        let i = node as usize;
        if self.phys_out.get(i) == Some(&true) && self.phys_in.get(i) == Some(&true) {
            for p in self.waiting.remove(&node).unwrap_or_default() {
                self.proc_end(now, p);
            }
        }
    }

    /// Connects with a new QP; a QPN the endpoint refuses (still in TimeWait, or in use) goes
    /// back to the pool and another is tried, a few times: `Err(true)` when none would do
    /// (wait for one), `Err(false)` when the endpoint refused the connect for another reason.
    fn connect(
        &mut self,
        ep: &mut Endpoint,
        now: Instant,
        used: &mut Option<Qpn>,
        params: impl Fn(Qpn) -> ConnectParams,
    ) -> Result<ConnId, bool> {
        let taken = |e: ConnectError| {
            matches!(
                e,
                ConnectError::QpnInQuarantine { .. } | ConnectError::QpnInUse { .. }
            )
        };
        let (qpn, id) = self.with_qpn(|qpn| ep.connect(now, params(qpn)).map_err(taken))?;
        *used = Some(qpn);
        Ok(id)
    }

    /// Runs `attempt` with a new QPN; one it reports taken (`Err(true)`: in TimeWait or in
    /// use) goes back to the pool and another is tried, [`CONNECT_TRIES`] times: the QPN and
    /// the result, `Err(true)` when none would do, `Err(false)` for any other refusal.
    fn with_qpn<T>(
        &mut self,
        mut attempt: impl FnMut(Qpn) -> Result<T, bool>,
    ) -> Result<(Qpn, T), bool> {
        for _ in 0..CONNECT_TRIES {
            let qpn = self.qpn();
            match attempt(qpn) {
                Ok(t) => return Ok((qpn, t)),
                Err(true) => {
                    self.shared.borrow_mut().qpn_retries += 1;
                    self.release(qpn);
                }
                Err(false) => return Err(false),
            }
        }
        Err(true)
    }

    /// An active operation ended: complete or start again.
    fn finish(&mut self, ep: &mut Endpoint, now: Instant, id: ConnId, op: Op, ok: bool) {
        let qpn = self.qpn_of.remove(&id);
        match (ok, qpn) {
            (true, Some(q)) => {
                self.up.insert(id, (op, q));
                self.up_qpn.insert(q, id);
            }
            (false, Some(q)) => self.release(q),
            _ => {}
        }
        if self.redo.remove(&id) {
            if !ok {
                self.again(ep, now, op);
            }
            return;
        }
        let w = self.worker_of(op);
        if ok {
            match op {
                Op::Rc { p, .. } | Op::Xrc { p, .. } => self.proc_end(now, p),
                Op::Phys { node } => self.phys_up(now, node, true),
                Op::Sidr { p, node, .. } => self.logical(now, p, node),
            }
            if let Some(wk) = self.workers.get_mut(w) {
                wk.outstanding = wk.outstanding.saturating_sub(1);
            }
            self.refill(ep, now, w);
        } else {
            self.shared.borrow_mut().restarts += 1;
            if self.drive {
                if let Some(wk) = self.workers.get_mut(w) {
                    wk.outstanding = wk.outstanding.saturating_sub(1);
                    wk.again.push(op);
                }
                self.refill(ep, now, w);
            } else {
                self.issue(ep, now, op);
            }
        }
    }
}

fn first_u32(b: &[u8]) -> Option<u32> {
    b.first_chunk::<4>().map(|c| u32::from_be_bytes(*c))
}

impl App for WireupApp {
    fn handle_event(&mut self, ep: &mut Endpoint, now: Instant, ev: &Event) -> bool {
        match &ev.kind {
            EventKind::ReqReceived(req) => {
                let Some(&from) = self.fab.index.get(&req.peer) else {
                    return false;
                };
                let xrc = req.transport() == ReqTransport::Xrc;
                let kind = if xrc {
                    match self.fab.shape.mode {
                        Mode::XrcSidr => Passive::Phys { node: from },
                        Mode::Rc | Mode::Xrc => Passive::Tgt,
                    }
                } else {
                    let Some(q) = first_u32(req.user_private_data()) else {
                        return false;
                    };
                    Passive::Rc { q }
                };
                let conn = ev.conn;
                let accepted = self
                    .with_qpn(|qpn| {
                        let params = if xrc {
                            AcceptParams::xrc_tgt(qpn)
                        } else {
                            AcceptParams::new(qpn)
                        };
                        ep.accept(now, conn, params).map_err(|e| {
                            matches!(
                                e,
                                CallError::QpnInQuarantine { .. } | CallError::QpnInUse { .. }
                            )
                        })
                    })
                    .ok()
                    .map(|(qpn, ())| qpn);
                if accepted.is_none() {
                    // No QPN free now: the starter hears "no QP" at once and tries again.
                    self.shared.borrow_mut().qpn_waits += 1;
                    let _ = ep.reject(now, ev.conn, RejReason::NoQp, &[], &[]);
                }
                if let Some(qpn) = accepted {
                    self.qps += 1;
                    let acc = Accepted {
                        kind,
                        from,
                        qpn: req.remote_qpn(),
                        local: qpn,
                    };
                    self.passive.insert(ev.conn, acc);
                }
            }
            EventKind::Established => {
                if let Some(op) = self.active.remove(&ev.conn) {
                    self.finish(ep, now, ev.conn, op, true);
                } else if let Some(acc) = self.passive.remove(&ev.conn) {
                    match acc.kind {
                        Passive::Rc { q } => self.proc_end(now, q),
                        Passive::Tgt => self.node_end(now),
                        Passive::Phys { node } => self.phys_up(now, node, false),
                    }
                }
            }
            EventKind::Closed(_) | EventKind::SidrTimedOut => {
                if let Some(op) = self.active.remove(&ev.conn) {
                    // Its QP is given up with it.
                    if !matches!(op, Op::Sidr { .. }) {
                        self.qps = self.qps.saturating_sub(1);
                    }
                    self.finish(ep, now, ev.conn, op, false);
                } else if let Some(acc) = self.passive.remove(&ev.conn) {
                    // Given up before it was established: the starter may believe it is.
                    self.qps = self.qps.saturating_sub(1);
                    self.release(acc.local);
                    self.shared.borrow_mut().dead.push((acc.from, acc.qpn));
                } else if let Some((op, q)) = self.up.remove(&ev.conn) {
                    // Established here, given up by the peer (its REP retries ran out):
                    // a runtime connects again.
                    self.up_qpn.remove(&q);
                    self.qps = self.qps.saturating_sub(1);
                    self.release(q);
                    self.again(ep, now, op);
                }
            }
            EventKind::SidrReqReceived(info) => {
                let pd = &info.private_data;
                let (Some(q), Some(from), Some(&node)) = (
                    first_u32(pd),
                    pd.get(4..).and_then(first_u32),
                    self.fab.index.get(&info.peer),
                ) else {
                    return false;
                };
                let ppn = self.fab.shape.ppn;
                if q >= ppn || from >= ppn {
                    return false;
                }
                let first = self.answered.insert((node, from, q));
                // The answer names the process's XRC SRQ.
                let srq = Qpn::masked(0x80_0000 | q);
                let rep = SidrRepParams::success(srq, Qkey(0x1111_1111));
                if ep.sidr_reply(now, ev.conn, rep).is_ok() && first {
                    self.logical(now, q, node);
                }
            }
            EventKind::SidrReply { .. } => {
                if let Some(op) = self.active.remove(&ev.conn) {
                    self.finish(ep, now, ev.conn, op, true);
                }
            }
            _ => {}
        }
        false
    }

    fn poll_timeout(&self) -> Option<Instant> {
        let a = self.notices.front().map(|(t, _)| *t);
        let b = self.later.front().map(|(t, _, _)| *t);
        a.into_iter().chain(b).min()
    }

    fn handle_timeout(&mut self, ep: &mut Endpoint, now: Instant) {
        // Operations that waited for a QPN: try again (in order; each may wait again).
        let mut due = Vec::new();
        while self.later.front().is_some_and(|(t, _, _)| *t <= now) {
            if let Some((_, op, redo)) = self.later.pop_front() {
                due.push((op, redo));
            }
        }
        for (op, redo) in due {
            match self.start(ep, now, op, false, redo) {
                Ok(id) if redo => {
                    self.redo.insert(id);
                }
                Ok(_) | Err(true) => {}
                // Refused for good: the operation is lost, as an unstarted one would be.
                Err(false) => {
                    let w = self.worker_of(op);
                    if let Some(wk) = self.workers.get_mut(w) {
                        wk.outstanding = wk.outstanding.saturating_sub(1);
                    }
                }
            }
        }
        while let Some(&(t, qpn)) = self.notices.front() {
            if t > now {
                break;
            }
            self.notices.pop_front();
            // Still believed established (no REJ came): the runtime tears the QP down and
            // connects again.
            if let Some(id) = self.up_qpn.remove(&qpn) {
                if let Some((op, _)) = self.up.remove(&id) {
                    // The QP is destroyed: its connection ends here too (DREQ), and its
                    // number is free once the endpoint's TimeWait for it is over.
                    let _ = ep.disconnect(now, id, &[]);
                    self.qps = self.qps.saturating_sub(1);
                    self.release(qpn);
                    self.again(ep, now, op);
                }
            }
        }
    }

    fn poll(&mut self, ep: &mut Endpoint, now: Instant) {
        if self.drive && !self.started {
            self.started = true;
            for w in 0..self.workers.len() {
                self.refill(ep, now, w);
            }
        }
    }
}
