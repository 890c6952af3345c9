//! A deterministic network simulator for CM endpoints (feature `sim`).
//!
//! N [`Endpoint`]s exchange MADs over per-direction [`Link`]s with latency, jitter, loss,
//! duplication, reordering and corruption drawn from one seeded RNG, plus scripted faults
//! ([`SimNet::drop_next`], [`SimNet::partition`], [`SimNet::corrupt_next`]). Time is virtual:
//! [`SimNet::step`] jumps to the next arrival or timer — the endpoints' and their
//! applications'. Each node may have an *application*, an [`App`] (any closure over its
//! events is one, e.g. [`auto_accept`]), run in the order the [`crate::App`] docs give, with
//! its timers fired at their exact deadlines. Everything that happens is recorded in a trace
//! ([`SimNet::trace`]) that tests print on failure. A node may be given a CM processing cost
//! ([`SimNet::set_cm_cost`], [`CmCost`]): its MADs then queue for its CM as for one server.
//! A node's application is polled ([`App::poll`]) after its node had input: a MAD, a timer, a
//! call through [`SimNet::endpoint`], [`SimNet::with_app`] or [`SimNet::set_app`], or a
//! [`SimNet::run_until_time`]; the simulator's work per step does not grow with the number of
//! idle nodes.
//!
//! ```
//! use ibcm::proto::*;
//! use ibcm::sim::{Link, SimNet};
//! use ibcm_mad::{Qpn, ServiceId};
//!
//! let mut net = SimNet::new(7);
//! let a = net.add_node(EndpointConfig::default());
//! let b = net.add_node(EndpointConfig::default());
//! net.set_all_links(Link { loss: 0.2, ..Link::default() });
//! net.set_app(b, ibcm::sim::auto_accept(0x100));
//! net.endpoint(b).listen(ServiceId(1), ListenOptions::default());
//! let peer = net.addr(b);
//! let now = net.now();
//! let c = net.endpoint(a).connect(now, ConnectParams::new(peer, ServiceId(1), Qpn::new(7).unwrap())).unwrap();
//! assert!(net.run_until(|n| n.endpoint_ref(a).state(c) == Some(State::Established), 10_000));
//! ```

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::fmt::Write as _;
use std::net::{Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use bytes::Bytes;
use ibcm_mad::{AttrId, Guid, Mad, Qpn};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::app::{earliest, fire_timers, App, DynApp};
use crate::proto::{AcceptParams, Endpoint, EndpointConfig, Event, EventKind, PeerAddr};

mod cost;
pub use cost::CmCost;
use cost::Servers;

/// One direction of a link.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Link {
    /// One-way latency.
    pub latency: Duration,
    /// Extra random latency, uniform in `0..=jitter`.
    pub jitter: Duration,
    /// Probability that a MAD is lost.
    pub loss: f64,
    /// Probability that a MAD is delivered twice.
    pub duplicate: f64,
    /// Probability that a MAD is held back by up to 3 × latency (so later ones overtake it).
    pub reorder: f64,
    /// Probability that one random byte of a MAD is changed.
    pub corrupt: f64,
}

impl Default for Link {
    fn default() -> Self {
        Link {
            latency: Duration::from_micros(50),
            jitter: Duration::ZERO,
            loss: 0.0,
            duplicate: 0.0,
            reorder: 0.0,
            corrupt: 0.0,
        }
    }
}

/// A boxed closure application (an [`App`]): called for every event of its endpoint.
pub type AppFn = Box<dyn FnMut(&mut Endpoint, Instant, &Event)>;

/// An application that accepts every REQ, on QPNs counting up from `first_qpn` (XRC REQs are
/// accepted as XRC targets), and answers SIDR_REQs with success.
pub fn auto_accept(first_qpn: u32) -> AppFn {
    let mut next = first_qpn;
    Box::new(move |ep, now, ev| match &ev.kind {
        EventKind::ReqReceived(req) => {
            let qpn = Qpn::masked(next);
            next = next.wrapping_add(1);
            let p = if req.transport() == ibcm_mad::ReqTransport::Xrc {
                AcceptParams::xrc_tgt(qpn)
            } else {
                AcceptParams::new(qpn)
            };
            let _ = ep.accept(now, ev.conn, p);
        }
        EventKind::SidrReqReceived(_) => {
            let qpn = Qpn::masked(next);
            next = next.wrapping_add(1);
            let _ = ep.sidr_reply(
                now,
                ev.conn,
                crate::proto::SidrRepParams::success(qpn, ibcm_mad::Qkey(0x1111_1111)),
            );
        }
        _ => {}
    })
}

struct Node {
    ep: Endpoint,
    addr: PeerAddr,
    app: Option<Box<dyn DynApp>>,
    events: VecDeque<(Duration, Event)>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    DropNext {
        from: usize,
        to: usize,
        attr: AttrId,
    },
    CorruptNext {
        from: usize,
        to: usize,
    },
    Partition {
        a: usize,
        b: usize,
        from: Instant,
        until: Instant,
    },
}

/// A MAD on the wire: (arrival, sequence, to, from, served by the receiver's CM server, bytes);
/// ordered by arrival, then sequence.
type InFlight = (Instant, u64, usize, usize, bool, Bytes);

/// The simulated network.
pub struct SimNet {
    epoch: Instant,
    now: Instant,
    rng: ChaCha8Rng,
    nodes: Vec<Node>,
    default_link: Link,
    links: HashMap<(usize, usize), Link>,
    /// (arrival, sequence) → (to, from, MAD).
    queue: BinaryHeap<Reverse<InFlight>>,
    seq: u64,
    faults: Vec<Fault>,
    trace: Vec<String>,
    /// Copies of every MAD put on the wire (before loss), per (from, attr).
    sent: HashMap<(usize, u16), u64>,
    /// Copies per (from, attr, local comm ID of the message).
    copies: HashMap<(usize, u16, u32), u64>,
    record_trace: bool,
    count_copies: bool,
    keep_events: bool,
    /// Address → node.
    index: HashMap<PeerAddr, usize>,
    /// Nodes that may have output, events or a new deadline, with a flag per node.
    dirty: Vec<usize>,
    is_dirty: Vec<bool>,
    /// Deadlines (endpoint or application) per node; an entry is live while it equals
    /// `armed` of its node.
    timers: BinaryHeap<Reverse<(Instant, usize)>>,
    armed: Vec<Option<Instant>>,
    servers: Servers,
}

impl SimNet {
    /// A network whose randomness (link effects) comes from `seed`.
    pub fn new(seed: u64) -> Self {
        // The simulator's single read of a clock: the epoch. Everything after is virtual.
        #[allow(clippy::disallowed_methods)]
        let epoch = Instant::now();
        SimNet {
            epoch,
            now: epoch,
            rng: ChaCha8Rng::seed_from_u64(seed),
            nodes: Vec::new(),
            default_link: Link::default(),
            links: HashMap::new(),
            queue: BinaryHeap::new(),
            seq: 0,
            faults: Vec::new(),
            trace: Vec::new(),
            sent: HashMap::new(),
            copies: HashMap::new(),
            record_trace: true,
            count_copies: true,
            keep_events: true,
            index: HashMap::new(),
            dirty: Vec::new(),
            is_dirty: Vec::new(),
            timers: BinaryHeap::new(),
            armed: Vec::new(),
            servers: Servers::default(),
        }
    }

    /// Adds a node with address `127.0.0.<n+1>:4791` (from node 255 on the count goes on into
    /// the higher bytes: 127.0.1.0, …). Unless set, its CA GUID becomes
    /// `n + 1` and its RNG seed is derived from the network's RNG.
    pub fn add_node(&mut self, mut cfg: EndpointConfig) -> usize {
        let n = self.nodes.len();
        if cfg.rng_seed.is_none() {
            cfg.rng_seed = Some(self.rng.random());
        }
        if cfg.local_ca_guid == EndpointConfig::default().local_ca_guid {
            cfg.local_ca_guid = Guid(n as u64 + 1);
        }
        let ip = Ipv4Addr::from(0x7f00_0000u32.wrapping_add(n as u32).wrapping_add(1));
        cfg.local_gid = ibcm_mad::Gid::from_ip(ip.into());
        let addr = PeerAddr::Udp(SocketAddr::new(ip.into(), 4791));
        self.nodes.push(Node {
            ep: Endpoint::new(cfg),
            addr,
            app: None,
            events: VecDeque::new(),
        });
        self.index.insert(addr, n);
        self.is_dirty.push(false);
        self.armed.push(None);
        self.mark(n);
        n
    }

    /// Gives node `n` a CM processing cost (see [`CmCost`]); its server is idle from now.
    pub fn set_cm_cost(&mut self, n: usize, cost: CmCost) {
        self.servers.set(n, cost, self.now);
    }

    /// Counts the copies of every message for [`SimNet::max_copies`] (default) or not (long
    /// runs: the count keeps one entry per message).
    pub fn set_copy_counting(&mut self, on: bool) {
        self.count_copies = on;
    }

    /// Keeps every node's events for [`SimNet::take_events`] (default) or not (long runs
    /// whose applications see the events anyway).
    pub fn set_event_log(&mut self, on: bool) {
        self.keep_events = on;
    }

    fn mark(&mut self, n: usize) {
        if let Some(d) = self.is_dirty.get_mut(n) {
            if !*d {
                *d = true;
                self.dirty.push(n);
            }
        }
    }

    /// Keeps the trace (default) or not (long runs).
    pub fn set_trace(&mut self, on: bool) {
        self.record_trace = on;
    }

    /// Current virtual time.
    pub fn now(&self) -> Instant {
        self.now
    }

    /// Time since the start.
    pub fn elapsed(&self) -> Duration {
        self.now - self.epoch
    }

    /// A node's endpoint.
    ///
    /// # Panics
    /// If `n` is not a node (a test bug).
    #[allow(clippy::indexing_slicing)]
    pub fn endpoint(&mut self, n: usize) -> &mut Endpoint {
        self.mark(n);
        &mut self.nodes[n].ep
    }

    /// A node's endpoint, shared.
    ///
    /// # Panics
    /// If `n` is not a node.
    #[allow(clippy::indexing_slicing)]
    pub fn endpoint_ref(&self, n: usize) -> &Endpoint {
        &self.nodes[n].ep
    }

    /// A node's address.
    ///
    /// # Panics
    /// If `n` is not a node.
    #[allow(clippy::indexing_slicing)]
    pub fn addr(&self, n: usize) -> PeerAddr {
        self.nodes[n].addr
    }

    /// Installs a node's application (replacing the previous one): any [`App`], e.g. an
    /// [`AppFn`] or an `impl FnMut(&mut Endpoint, Instant, &Event)`.
    ///
    /// # Panics
    /// If `n` is not a node.
    #[allow(clippy::indexing_slicing)]
    pub fn set_app<A: App + 'static>(&mut self, n: usize, app: A) {
        self.mark(n);
        self.nodes[n].app = Some(Box::new(app));
    }

    /// Node `n`'s application, if it is an `A`.
    pub fn app<A: App + 'static>(&self, n: usize) -> Option<&A> {
        self.nodes.get(n)?.app.as_deref()?.as_any().downcast_ref()
    }

    /// Runs `f` on node `n`'s application (if it is an `A`) and endpoint at the current
    /// virtual time, then hands out what follows as after any input (events → app →
    /// transmit; the MADs go on the wire now). `None` if the node has no `A`.
    pub fn with_app<A: App + 'static, R>(
        &mut self,
        n: usize,
        f: impl FnOnce(&mut A, &mut Endpoint, Instant) -> R,
    ) -> Option<R> {
        let now = self.now;
        self.mark(n);
        let node = self.nodes.get_mut(n)?;
        let app = node.app.as_deref_mut()?.as_any_mut().downcast_mut::<A>()?;
        let r = f(app, &mut node.ep, now);
        self.flush();
        Some(r)
    }

    /// Takes the events a node produced so far (with their time since the start).
    ///
    /// # Panics
    /// If `n` is not a node.
    #[allow(clippy::indexing_slicing)]
    pub fn take_events(&mut self, n: usize) -> Vec<(Duration, Event)> {
        self.nodes[n].events.drain(..).collect()
    }

    /// Sets one direction of the link between two nodes.
    pub fn set_link(&mut self, from: usize, to: usize, link: Link) {
        self.links.insert((from, to), link);
    }

    /// Sets every link (existing per-pair settings are discarded).
    pub fn set_all_links(&mut self, link: Link) {
        self.links.clear();
        self.default_link = link;
    }

    /// Drops the next MAD with attribute `attr` from `from` to `to`.
    pub fn drop_next(&mut self, from: usize, to: usize, attr: AttrId) {
        self.faults.push(Fault::DropNext { from, to, attr });
    }

    /// Corrupts one byte of the next MAD from `from` to `to`.
    pub fn corrupt_next(&mut self, from: usize, to: usize) {
        self.faults.push(Fault::CorruptNext { from, to });
    }

    /// Cuts both directions between `a` and `b` for `dur` from now.
    pub fn partition(&mut self, a: usize, b: usize, dur: Duration) {
        self.faults.push(Fault::Partition {
            a,
            b,
            from: self.now,
            until: self.now + dur,
        });
    }

    /// How many MADs of `attr` node `from` put on the wire (first sends and retransmissions).
    pub fn sent_count(&self, from: usize, attr: AttrId) -> u64 {
        self.sent.get(&(from, attr.raw())).copied().unwrap_or(0)
    }

    /// The largest number of copies node `from` sent of one message `attr` (per local comm
    /// ID), with that ID: the retransmission bound the property tests check.
    pub fn max_copies(&self, from: usize, attr: AttrId) -> Option<(u64, u32)> {
        self.copies
            .iter()
            .filter(|((f, a, _), _)| *f == from && *a == attr.raw())
            .map(|((_, _, id), n)| (*n, *id))
            .max()
    }

    /// The trace so far, one line per wire event.
    pub fn trace(&self) -> &[String] {
        &self.trace
    }

    /// The trace as one string.
    pub fn dump_trace(&self) -> String {
        self.trace.join("\n")
    }

    fn log(&mut self, line: impl FnOnce(Duration) -> String) {
        if self.record_trace {
            let e = self.now - self.epoch;
            self.trace.push(line(e));
        }
    }

    fn node_of(&self, addr: PeerAddr) -> Option<usize> {
        self.index.get(&addr).copied()
    }

    /// Moves the queued transmissions of every node that had input onto the wire and runs
    /// applications on queued events, until nothing is left; then re-arms their deadlines.
    fn flush(&mut self) {
        while let Some(i) = self.dirty.pop() {
            if let Some(d) = self.is_dirty.get_mut(i) {
                *d = false;
            }
            self.flush_node(i);
            let deadline = self.nodes.get(i).and_then(|n| {
                let app = n.app.as_ref().and_then(|a| a.poll_timeout());
                earliest(n.ep.poll_timeout(), app)
            });
            if let Some(armed) = self.armed.get_mut(i) {
                if *armed != deadline {
                    *armed = deadline;
                    if let Some(t) = deadline {
                        self.timers.push(Reverse((t, i)));
                    }
                }
            }
        }
    }

    fn flush_node(&mut self, i: usize) {
        loop {
            let mut progressed = false;
            while let Some(t) = self.nodes.get_mut(i).and_then(|n| n.ep.poll_transmit()) {
                progressed = true;
                self.put_on_wire(i, t.to, t.mad);
            }
            let now = self.now;
            let elapsed = self.now - self.epoch;
            let keep = self.keep_events;
            let Some(node) = self.nodes.get_mut(i) else {
                return;
            };
            while let Some(ev) = node.ep.poll_event() {
                progressed = true;
                if let Some(app) = node.app.as_mut() {
                    app.handle_event(&mut node.ep, now, &ev);
                }
                if keep {
                    node.events.push_back((elapsed, ev));
                }
            }
            if let Some(app) = node.app.as_mut() {
                app.poll(&mut node.ep, now);
                while let Some(ev) = node.ep.poll_event() {
                    progressed = true;
                    app.handle_event(&mut node.ep, now, &ev);
                    if keep {
                        node.events.push_back((elapsed, ev));
                    }
                }
            }
            // What the application's poll sent goes out now too.
            while let Some(t) = self.nodes.get_mut(i).and_then(|n| n.ep.poll_transmit()) {
                progressed = true;
                self.put_on_wire(i, t.to, t.mad);
            }
            if !progressed {
                return;
            }
        }
    }

    fn put_on_wire(&mut self, from: usize, to_addr: PeerAddr, mad: Bytes) {
        let attr = ibcm_mad::MadHeader::peek_attr_id(&mad).map_or(0, ibcm_mad::AttrId::raw);
        *self.sent.entry((from, attr)).or_default() += 1;
        if self.count_copies {
            if let Some(id) = Mad::parse(&mad).ok().and_then(|m| m.msg.local_comm_id()) {
                *self.copies.entry((from, attr, id.0)).or_default() += 1;
            }
        }
        let Some(to) = self.node_of(to_addr) else {
            self.log(|e| format!("{e:>12?} {from}->?  to unknown address {to_addr}"));
            return;
        };
        let summary = if self.record_trace {
            summarize(&mad)
        } else {
            String::new()
        };
        // Scripted faults first.
        let now = self.now;
        let mut corrupt = false;
        let mut dropped = None;
        let mut i = 0;
        while i < self.faults.len() {
            match self.faults.get(i).copied() {
                Some(Fault::DropNext {
                    from: f,
                    to: t,
                    attr: a,
                }) if f == from && t == to && a.raw() == attr => {
                    self.faults.remove(i);
                    dropped = Some("scripted drop");
                    break;
                }
                Some(Fault::CorruptNext { from: f, to: t }) if f == from && t == to => {
                    self.faults.remove(i);
                    corrupt = true;
                    break;
                }
                Some(Fault::Partition {
                    a,
                    b,
                    from: t0,
                    until,
                }) => {
                    if now >= until {
                        self.faults.remove(i);
                        continue;
                    }
                    if now >= t0 && ((a == from && b == to) || (a == to && b == from)) {
                        dropped = Some("partition");
                        break;
                    }
                }
                _ => {}
            }
            i += 1;
        }
        if let Some(why) = dropped {
            self.log(|e| format!("{e:>12?} {from}->{to} DROP ({why}) {summary}"));
            return;
        }
        let link = self
            .links
            .get(&(from, to))
            .copied()
            .unwrap_or(self.default_link);
        if link.loss > 0.0 && self.rng.random_bool(link.loss.min(1.0)) {
            self.log(|e| format!("{e:>12?} {from}->{to} LOST {summary}"));
            return;
        }
        let mut mad = mad;
        if corrupt || (link.corrupt > 0.0 && self.rng.random_bool(link.corrupt.min(1.0))) {
            let mut v = mad.to_vec();
            let pos = self.rng.random_range(0..v.len().max(1));
            if let Some(b) = v.get_mut(pos) {
                *b ^= self.rng.random_range(1..=255u8);
            }
            mad = Bytes::from(v);
            self.log(|e| format!("{e:>12?} {from}->{to} CORRUPT byte {pos} {summary}"));
        }
        let copies = if link.duplicate > 0.0 && self.rng.random_bool(link.duplicate.min(1.0)) {
            2
        } else {
            1
        };
        // The sender's CM handles the MAD before it leaves.
        let depart = self.servers.serve(from, now);
        for _ in 0..copies {
            let mut delay = link.latency + (depart - now);
            if !link.jitter.is_zero() {
                delay +=
                    Duration::from_nanos(self.rng.random_range(0..=link.jitter.as_nanos() as u64));
            }
            if link.reorder > 0.0 && self.rng.random_bool(link.reorder.min(1.0)) {
                delay += link.latency * self.rng.random_range(1..=3u32);
            }
            self.seq += 1;
            self.queue.push(Reverse((
                now + delay,
                self.seq,
                to,
                from,
                false,
                mad.clone(),
            )));
        }
        if copies == 2 {
            self.log(|e| format!("{e:>12?} {from}->{to} DUP {summary}"));
        }
    }

    /// Runs one step: flushes output, then delivers the earliest arrival or fires the earliest
    /// timer (jumping the clock), and flushes again. Returns `false` when nothing is left to
    /// do (no packet in flight, no timer armed).
    pub fn step(&mut self) -> bool {
        self.flush();
        let next_arrival = self.queue.peek().map(|Reverse((t, ..))| *t);
        let next_timer = self.next_timer();
        let deliver = match (next_arrival, next_timer) {
            (None, None) => return false,
            (Some(_), None) => true,
            (None, Some(_)) => false,
            (Some(a), Some((t, _))) => a <= t,
        };
        if deliver {
            if let Some(Reverse((at, _, to, from, served, mad))) = self.queue.pop() {
                self.now = self.now.max(at);
                if !served && self.servers.has_cost(to) {
                    // Arrived: it waits for the receiver's CM, then reaches the endpoint.
                    let done = self.servers.serve(to, at);
                    self.seq += 1;
                    self.queue
                        .push(Reverse((done, self.seq, to, from, true, mad)));
                    return true;
                }
                self.mark(to);
                let from_addr = self.addr(from);
                self.log(|e| format!("{e:>12?} {from}->{to} {}", summarize(&mad)));
                let now = self.now;
                self.endpoint(to).handle_datagram(now, from_addr, &mad);
            }
        } else if let Some((t, i)) = next_timer {
            self.now = self.now.max(t);
            let now = self.now;
            self.timers.pop();
            if let Some(a) = self.armed.get_mut(i) {
                *a = None;
            }
            self.mark(i);
            if let Some(node) = self.nodes.get_mut(i) {
                fire_timers(&mut node.ep, node.app.as_deref_mut(), now);
            }
        }
        self.flush();
        true
    }

    /// The earliest deadline of any node (endpoint or application), with the node (stale
    /// entries are dropped on the way).
    fn next_timer(&mut self) -> Option<(Instant, usize)> {
        while let Some(Reverse((t, i))) = self.timers.peek().copied() {
            if self.armed.get(i).copied().flatten() == Some(t) {
                return Some((t, i));
            }
            self.timers.pop();
        }
        None
    }

    /// Steps until `done` holds (returns `true`) or `max_steps` steps were taken or nothing is
    /// left to do (returns `false`).
    pub fn run_until(&mut self, mut done: impl FnMut(&SimNet) -> bool, max_steps: usize) -> bool {
        self.flush();
        for _ in 0..max_steps {
            if done(self) {
                return true;
            }
            if !self.step() {
                return done(self);
            }
        }
        done(self)
    }

    /// Steps until nothing is left to do or `max_steps` were taken; returns whether it went
    /// idle.
    pub fn run_to_idle(&mut self, max_steps: usize) -> bool {
        for _ in 0..max_steps {
            if !self.step() {
                return true;
            }
        }
        false
    }

    /// Advances the clock to `at` (firing the endpoints' and applications' timers and
    /// delivering packets due before it, each at its exact time).
    pub fn run_until_time(&mut self, at: Instant) {
        loop {
            self.flush();
            let next_arrival = self.queue.peek().map(|Reverse((t, ..))| *t);
            let next_timer = self.next_timer().map(|(t, _)| t);
            let next = [next_arrival, next_timer].into_iter().flatten().min();
            match next {
                Some(t) if t <= at => {
                    self.step();
                }
                _ => break,
            }
        }
        self.now = self.now.max(at);
        // Every application sees the new time.
        for n in 0..self.nodes.len() {
            self.mark(n);
        }
        self.flush();
    }
}

/// A one-line summary of a MAD for the trace.
pub fn summarize(mad: &[u8]) -> String {
    match Mad::parse(mad) {
        Ok(m) => {
            let mut s = m.msg.to_string();
            let _ = write!(s, " tid={}", m.header.tid);
            s
        }
        Err(e) => format!("<malformed: {e}>"),
    }
}
