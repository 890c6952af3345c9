//! The CM endpoint: the connection table, input dispatch, outputs and TimeWait; every
//! transition of docs/protocol.md §3, split by feature.
//!
//! This module holds the [`Endpoint`] struct and its tables, the `poll_*` outputs, the input
//! dispatch ([`Endpoint::handle_datagram`] routes each message to its handler,
//! [`Endpoint::handle_timeout`] routes each expired timer), the retransmission of pending
//! requests, and TimeWait with its QPN quarantine. Each feature's file holds both its
//! application commands and its message handlers. The table below is the handler map, the only
//! one (docs/protocol.md §1.1 and docs/README.md point here); what each handler does with each
//! message in each state is docs/protocol.md §3.6, which `cm/tests/state_table.rs` checks pair by
//! pair:
//!
//! | message / command | file | handler |
//! |---|---|---|
//! | `connect` (→ REQ) | `setup.rs` | [`Endpoint::connect`] |
//! | REQ | `setup.rs` | `on_req` (duplicates, stale QPN, listener checks; refusals via `reject_req` in `io.rs`) |
//! | REQ under pressure, stateless (cookie REP) | `cookie.rs` | `stateless_req` |
//! | RTU naming a cookie (→ ESTABLISHED, recreated) | `cookie.rs` | `stateless_rtu` |
//! | stateless REP retransmission (once, `stateless_resend`) | `cookie.rs` | `stateless_resend_due` |
//! | REQ admission (caps, eviction of the oldest half-open entry, → REJ 3) | `admission.rs` | `admit` (`evict`) |
//! | `accept` (→ REP) | `setup.rs` | [`Endpoint::accept`] |
//! | REP | `setup.rs` | `on_rep`, duplicate REP: `on_dup_rep` |
//! | `establish` (→ RTU) | `setup.rs` | [`Endpoint::establish`] (`send_rtu`) |
//! | RTU | `setup.rs` | `on_rtu` |
//! | `notify_established` (COMM_EST) | `setup.rs` | [`Endpoint::notify_established`] |
//! | `mra` (→ MRA, for REQ, REP or LAP) | `setup.rs` | [`Endpoint::mra`] (`send_mra`) |
//! | MRA (for REQ, REP or LAP) | `setup.rs` | `on_mra` |
//! | `reject` (→ REJ) | `setup.rs` | [`Endpoint::reject`] |
//! | REJ (any state) | `setup.rs` | `on_rej` |
//! | REQ / REP retries exhausted (→ REJ 4) | `setup.rs` | `on_setup_timeout` |
//! | stale connection found by a REQ or REP | `setup.rs` | `stale_old` |
//! | half-open lifetime over, REQ unanswered (→ REJ 4) | `admission.rs` | `on_half_open_expired` |
//! | `disconnect` (→ DREQ, or REJ during setup) | `teardown.rs` | [`Endpoint::disconnect`] |
//! | DREQ | `teardown.rs` | `on_dreq` |
//! | DREP | `teardown.rs` | `on_drep` |
//! | DREQ retries exhausted | `teardown.rs` | `on_dreq_timeout` |
//! | `sidr_request` (→ SIDR_REQ) | `sidr.rs` | [`Endpoint::sidr_request`] |
//! | SIDR_REQ | `sidr.rs` | `on_sidr_req` |
//! | `sidr_reply` (→ SIDR_REP) | `sidr.rs` | [`Endpoint::sidr_reply`] |
//! | SIDR_REP | `sidr.rs` | `on_sidr_rep` |
//! | SIDR_REQ timer (retransmit or give up) | `sidr.rs` | `on_sidr_timer` |
//! | incoming SIDR_REQ unanswered too long (or evicted) | `sidr.rs` | `on_sidr_in_timer` |
//! | `load_alternate_path` (→ LAP) | `lap.rs` | [`Endpoint::load_alternate_path`] |
//! | LAP | `lap.rs` | `on_lap` |
//! | `apr` (→ APR) | `lap.rs` | [`Endpoint::apr`] |
//! | APR | `lap.rs` | `on_apr` |
//! | `notify_path_migrated` (PATH_MIG) | `lap.rs` | [`Endpoint::notify_path_migrated`] |
//! | LAP retries exhausted | `lap.rs` | `on_lap_timeout` |
//! | resend timer (retransmit, then route the give-up above) | `mod.rs` | `on_resend_timer` |
//! | the connection a message names: comm IDs, then the source (a miss counted, or said) | `mod.rs` | `lookup`, `find`; `sent_by_peer` |
//! | enter / leave TimeWait, QPN quarantine | `mod.rs` | `enter_timewait`, `on_timewait_exit` |
//!
//! Elsewhere, below this file (none of them knows the endpoint; this file and the feature files
//! import from them, never the other way round): the connection and SIDR request records are
//! in `proto/conn.rs`, the timer kinds and queue in `proto/timer.rs`, peer interning in
//! `proto/peers.rs`, the seeded hash maps and small helpers (`check_len`, `trimmed`) in
//! `proto/util.rs`, the admission and anti-amplification bookkeeping with the half-open and
//! established counts (`Limits`) in `endpoint/limits.rs`, output queues, counters and the REJ builders (`rej`, `timeout_rej`,
//! `reject_req`) in `endpoint/io.rs`. The feature files (`setup.rs`, `teardown.rs`,
//! `sidr.rs`, `lap.rs`, `admission.rs`, `cookie.rs`) add methods to [`Endpoint`] and never import from each
//! other.

mod admission;
mod cookie;
mod io;
mod lap;
mod limits;
mod setup;
mod sidr;
mod teardown;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

use ibcm_mad::{CmMessage, CommId, Mad, Qpn, RequestId, ServiceId};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tracing::{debug, trace};

use super::conn::{Conn, SidrIn, SidrOut};
use super::ids::{IdAllocator, SidrReqId};
use super::memory::table_bytes;
use super::sys::TableAlloc;
use super::table::ConnTable;
use super::timer::{ConnTimer, Expired};
use super::util::{map, HashMap, HashSet, LocalQpnMap};
use super::{
    CallError, ConnId, ConnectError, DropReason, EndpointConfig, Event, EventKind, LapState,
    ListenOptions, MemoryUse, PeerAddr, Side, State, Stats, Transmit,
};
use io::Io;

/// The sans-IO IB CM endpoint.
///
/// # Method families
/// * inputs: [`handle_datagram`](Self::handle_datagram) (a received MAD),
///   [`handle_timeout`](Self::handle_timeout) (time passed);
/// * commands: [`listen`](Self::listen), [`connect`](Self::connect), [`accept`](Self::accept),
///   [`reject`](Self::reject), [`mra`](Self::mra), [`establish`](Self::establish),
///   [`notify_established`](Self::notify_established), [`disconnect`](Self::disconnect),
///   [`sidr_request`](Self::sidr_request), [`sidr_reply`](Self::sidr_reply),
///   [`load_alternate_path`](Self::load_alternate_path), [`apr`](Self::apr),
///   [`set_stateless`](Self::set_stateless) (the stateless mode under pressure);
/// * outputs: [`poll_transmit`](Self::poll_transmit), [`poll_timeout`](Self::poll_timeout),
///   [`poll_event`](Self::poll_event);
/// * getters: [`stats`](Self::stats), [`state`](Self::state), [`len`](Self::len), ….
///
/// After every input or command, drain the three outputs. Their queues are independent: the
/// endpoint's state does not depend on the order in which they are drained. A host whose
/// application acts on events drains the events first, then the transmissions (so that what the
/// application's calls queued goes out in the same turn), and reads `poll_timeout` last: the
/// order the tokio driver and the simulator follow ([`App`](crate::App): call order). Every input
/// takes `now`; the endpoint never reads a clock, does no I/O and draws randomness only from
/// its seeded RNG ([`EndpointConfig::rng_seed`]), so a run is reproducible.
///
/// # Example: two endpoints wired by hand
/// ```
/// use std::time::Instant;
/// use ibcm::proto::*;
/// use ibcm_mad::{Qpn, ServiceId, Guid};
///
/// let now = Instant::now();
/// let a_addr: PeerAddr = "127.0.0.1:4791".parse::<std::net::SocketAddr>().unwrap().into();
/// let b_addr: PeerAddr = "127.0.0.2:4791".parse::<std::net::SocketAddr>().unwrap().into();
/// let mut a = Endpoint::new(EndpointConfig { rng_seed: Some(1), ..Default::default() });
/// let mut b = Endpoint::new(EndpointConfig {
///     rng_seed: Some(2),
///     local_ca_guid: Guid(2),
///     ..Default::default()
/// });
/// b.listen(ServiceId(0x1234), ListenOptions::default());
/// let conn = a.connect(now, ConnectParams::new(b_addr, ServiceId(0x1234), Qpn::new(0x11).unwrap())).unwrap();
///
/// // REQ a → b; b's application accepts.
/// let req = a.poll_transmit().unwrap();
/// b.handle_datagram(now, a_addr, &req.mad);
/// let ev = b.poll_event().unwrap();
/// b.accept(now, ev.conn, AcceptParams::new(Qpn::new(0x22).unwrap())).unwrap();
/// // REP b → a; a reports the REP, sends the RTU (auto_rtu) and is established.
/// a.handle_datagram(now, b_addr, &b.poll_transmit().unwrap().mad);
/// assert!(matches!(a.poll_event().unwrap().kind, EventKind::RepReceived(_)));
/// assert_eq!(a.poll_event().unwrap().kind, EventKind::Established);
/// b.handle_datagram(now, a_addr, &a.poll_transmit().unwrap().mad);
/// assert_eq!(b.poll_event().unwrap().kind, EventKind::Established);
/// assert_eq!(a.state(conn), Some(State::Established));
/// ```
#[derive(Debug)]
pub struct Endpoint {
    cfg: EndpointConfig,
    ids: IdAllocator,
    /// The endpoint's RNG (seeded by `rng_seed` or the OS), after the comm-ID keys and the
    /// hash seed were drawn from it: [`Endpoint::random_psn`].
    rng: ChaCha8Rng,
    /// The connections, by local comm ID, (remote comm ID, remote CA GUID) (duplicate
    /// detection) and (remote QPN, remote CA GUID) (stale-connection detection).
    conns: ConnTable,
    /// Live connections per local QPN.
    local_qpns: LocalQpnMap<u32>,
    /// QPNs of connections in TimeWait, with the time they become free.
    quarantine: HashMap<Qpn, Instant>,
    listeners: BTreeMap<ServiceId, ListenOptions>,
    /// Our SIDR_REQs waiting for their SIDR_REP.
    sidr_out: HashMap<SidrReqId, SidrOut>,
    sidr_out_peer: HashMap<SidrReqId, PeerAddr>,
    /// Their SIDR_REQs waiting for the application, by the ID the application knows them by.
    sidr_in: HashMap<CommId, SidrIn>,
    sidr_in_keys: HashSet<(RequestId, PeerAddr)>,
    /// `sidr_in` by expiry, oldest first (for eviction under pressure).
    sidr_in_order: BTreeSet<(Instant, CommId)>,
    /// The stateless mode's keys, templates and REQ table (`cookie.rs`).
    cookies: cookie::Cookies,
    io: Io,
}

impl Endpoint {
    /// A new endpoint.
    pub fn new(cfg: EndpointConfig) -> Self {
        let mut rng = match cfg.rng_seed {
            Some(seed) => ChaCha8Rng::seed_from_u64(seed),
            None => ChaCha8Rng::from_os_rng(),
        };
        let keys: [u64; 8] = rng.random();
        let start: u32 = rng.random();
        let seed: u64 = rng.random();
        let cookies = cookie::Cookies::new(&rng);
        let ids = IdAllocator::new(start, keys);
        let alloc = TableAlloc {
            huge: cfg.huge_pages,
        };
        Endpoint {
            cfg,
            conns: ConnTable::new(seed, ids.clone(), alloc),
            ids,
            rng,
            local_qpns: LocalQpnMap::with_hasher_in(Default::default(), alloc),
            quarantine: map(seed),
            listeners: BTreeMap::new(),
            sidr_out: map(seed),
            sidr_out_peer: map(seed),
            sidr_in: map(seed),
            sidr_in_keys: HashSet::with_hasher(foldhash::fast::SeedableRandomState::with_seed(
                seed,
                foldhash::SharedSeed::global_fixed(),
            )),
            sidr_in_order: BTreeSet::new(),
            cookies,
            io: Io::new(seed),
        }
    }

    // ---------------------------------------------------------------------------------------
    // Getters

    /// The configuration.
    pub fn config(&self) -> &EndpointConfig {
        &self.cfg
    }

    /// Counters.
    pub fn stats(&self) -> &Stats {
        &self.io.stats
    }

    /// A connection's state (`None` once it has left the table).
    pub fn state(&self, conn: ConnId) -> Option<State> {
        self.conns.get(&conn).map(|c| c.state)
    }

    /// A connection's LAP sub-state.
    pub fn lap_state(&self, conn: ConnId) -> Option<LapState> {
        self.conns.get(&conn).map(|c| c.lap)
    }

    /// Which side of a connection this endpoint is.
    pub fn side(&self, conn: ConnId) -> Option<Side> {
        self.conns.get(&conn).map(|c| c.side)
    }

    /// A connection's remote QPN (for XRC INI: the TGT QPN), once known.
    pub fn remote_qpn(&self, conn: ConnId) -> Option<Qpn> {
        self.conns.get(&conn).map(|c| c.remote_qpn)
    }

    /// A connection's local QPN (for XRC TGT: the TGT QPN; `None` once the connection has left
    /// the table). It is chosen by [`connect`](Self::connect) on the active side, by
    /// [`accept`](Self::accept) on the passive side, by the listener's template for a
    /// connection made from a stateless cookie; until then, and for a connection taken over by
    /// [`end_stale`](Self::end_stale) (whose QPN this endpoint never knew), it reads QPN 0. It
    /// stays the connection's through TimeWait, while
    /// [`qpn_quarantined`](Self::qpn_quarantined) holds it.
    ///
    /// ```
    /// use std::time::Instant;
    /// use ibcm::proto::*;
    /// use ibcm_mad::{Guid, Qpn, ServiceId};
    ///
    /// let now = Instant::now();
    /// let a_addr: PeerAddr = "127.0.0.1:4791".parse::<std::net::SocketAddr>().unwrap().into();
    /// let b_addr: PeerAddr = "127.0.0.2:4791".parse::<std::net::SocketAddr>().unwrap().into();
    /// let mut a = Endpoint::new(EndpointConfig { rng_seed: Some(1), ..Default::default() });
    /// let mut b = Endpoint::new(EndpointConfig {
    ///     rng_seed: Some(2),
    ///     local_ca_guid: Guid(2),
    ///     ..Default::default()
    /// });
    /// b.listen(ServiceId(0x1234), ListenOptions::default());
    /// let (qa, qb) = (Qpn::new(0x11).unwrap(), Qpn::new(0x22).unwrap());
    /// let conn = a.connect(now, ConnectParams::new(b_addr, ServiceId(0x1234), qa)).unwrap();
    /// assert_eq!(a.local_qpn(conn), Some(qa));
    ///
    /// b.handle_datagram(now, a_addr, &a.poll_transmit().unwrap().mad);
    /// let ev = b.poll_event().unwrap();
    /// assert_eq!(b.local_qpn(ev.conn), Some(Qpn::default()), "not accepted yet");
    /// b.accept(now, ev.conn, AcceptParams::new(qb)).unwrap();
    /// assert_eq!(b.local_qpn(ev.conn), Some(qb));
    /// ```
    pub fn local_qpn(&self, conn: ConnId) -> Option<Qpn> {
        self.conns.get(&conn).map(|c| c.local_qpn)
    }

    /// A connection's remote comm ID, once known.
    pub fn remote_comm_id(&self, conn: ConnId) -> Option<CommId> {
        self.conns.get(&conn).map(|c| c.remote_id)
    }

    /// A connection's peer address.
    pub fn peer(&self, conn: ConnId) -> Option<PeerAddr> {
        self.conns.get(&conn).map(|c| self.io.peers.addr(c.peer))
    }

    /// Connections in the table (all states, TimeWait included).
    pub fn len(&self) -> usize {
        self.conns.len()
    }

    /// Heap bytes held by the connection table and the per-connection side tables, by
    /// structure, from their capacities ([`MemoryUse`] says what is counted).
    pub fn memory(&self) -> MemoryUse {
        let (records, indexes) = self.conns.heap_bytes();
        let qpn_entry = core::mem::size_of::<(Qpn, u32)>();
        let quarantine_entry = core::mem::size_of::<(Qpn, Instant)>();
        MemoryUse {
            records,
            indexes,
            qpns: table_bytes(self.local_qpns.capacity(), qpn_entry)
                + table_bytes(self.quarantine.capacity(), quarantine_entry),
            side: self.io.heap_bytes(),
            peers: self.io.peers.heap_bytes(),
        }
    }

    /// Whether the table is empty (no connection, no pending SIDR, no timer).
    pub fn is_empty(&self) -> bool {
        self.conns.is_empty()
            && self.sidr_out.is_empty()
            && self.sidr_in.is_empty()
            && self.io.timers.is_empty()
            && self.cookies.next_resend().is_none()
    }

    /// Passive connections not yet established (REQ_RCVD, MRA_REQ_SENT, REP_SENT,
    /// MRA_REP_RCVD), the count [`EndpointConfig::max_half_open`] caps and
    /// [`EndpointConfig::stateless_threshold`] compares.
    pub fn half_open(&self) -> usize {
        self.io.limits.half_open()
    }

    /// Connections counted against [`EndpointConfig::max_established`]: from ESTABLISHED until
    /// TimeWait, both sides.
    pub fn established(&self) -> usize {
        self.io.limits.established()
    }

    /// The IDs of all connections, sorted.
    pub fn conn_ids(&self) -> Vec<ConnId> {
        let mut v: Vec<ConnId> = self.conns.keys().collect();
        v.sort();
        v
    }

    /// A random 24-bit PSN from the endpoint's RNG (rdma_cm draws them from
    /// `get_random_u32`), so that an off-path peer cannot guess where a QP's sequence starts.
    /// [`connect`](Self::connect) uses it when [`ConnectParams::starting_psn`] is `None` (the
    /// default). For [`AcceptParams::starting_psn`](super::AcceptParams::starting_psn) the
    /// application chooses (its QP is programmed with it before the REP goes out): the
    /// constructor defaults to 0, as Linux's `ib_cm` users must set it; draw one here.
    ///
    /// [`ConnectParams::starting_psn`]: super::ConnectParams::starting_psn
    pub fn random_psn(&mut self) -> ibcm_mad::Psn {
        ibcm_mad::Psn::masked(self.rng.random::<u32>())
    }

    /// Whether `qpn` may be used for a new connection at `now`: not quarantined by a
    /// connection in TimeWait.
    pub fn qpn_quarantined(&self, qpn: Qpn, now: Instant) -> Option<Instant> {
        self.quarantine.get(&qpn).copied().filter(|&t| t > now)
    }

    // ---------------------------------------------------------------------------------------
    // Outputs

    /// The next MAD to send.
    #[must_use]
    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        self.io.outbox.pop_front()
    }

    /// When [`handle_timeout`](Self::handle_timeout) must be called next.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<Instant> {
        let t = self.io.timers.next_deadline();
        match (t, self.cookies.next_resend()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// The next event for the application.
    #[must_use]
    pub fn poll_event(&mut self) -> Option<Event> {
        self.io.events.pop_front()
    }

    // ---------------------------------------------------------------------------------------
    // Listening

    /// Starts answering REQs and SIDR_REQs for `service_id` (exact match). Returns `false` if
    /// the service ID was already listened on (the options are replaced).
    pub fn listen(&mut self, service_id: ServiceId, opts: ListenOptions) -> bool {
        self.listeners.insert(service_id, opts).is_none()
    }

    /// Whether `service_id` is listened on.
    pub fn is_listening(&self, service_id: ServiceId) -> bool {
        self.listeners.contains_key(&service_id)
    }

    /// Stops listening. Returns whether there was a listener.
    pub fn unlisten(&mut self, service_id: ServiceId) -> bool {
        self.cookies.forget(service_id);
        self.listeners.remove(&service_id).is_some()
    }

    // ---------------------------------------------------------------------------------------
    // IDs, QPNs and connection access

    /// A local ID in use by no connection and no SIDR request.
    fn alloc_id(&mut self) -> CommId {
        let (conns, sidr_in, sidr_out) = (&self.conns, &self.sidr_in, &self.sidr_out);
        self.ids.alloc(|id| id_in_use(conns, sidr_in, sidr_out, id))
    }

    /// Whether `id` names a connection or a SIDR request here (either way).
    fn id_taken(&self, id: CommId) -> bool {
        id_in_use(&self.conns, &self.sidr_in, &self.sidr_out, id)
    }

    fn check_qpn(&self, qpn: Qpn, now: Instant, shared: bool) -> Result<(), ConnectError> {
        if let Some(until) = self.qpn_quarantined(qpn, now) {
            return Err(ConnectError::QpnInQuarantine { qpn, until });
        }
        if !shared && self.local_qpns.get(&qpn).is_some_and(|&n| n > 0) {
            return Err(ConnectError::QpnInUse { qpn });
        }
        Ok(())
    }

    fn use_qpn(&mut self, qpn: Qpn) {
        *self.local_qpns.entry(qpn).or_default() += 1;
    }

    fn release_qpn(&mut self, qpn: Qpn) {
        if let Some(n) = self.local_qpns.get_mut(&qpn) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.local_qpns.remove(&qpn);
            }
        }
    }

    /// The connection an application command names, with the output side.
    fn conn_mut(&mut self, conn: ConnId) -> Result<(&mut Conn, &mut Io), CallError> {
        let c = self
            .conns
            .get_mut(&conn)
            .ok_or(CallError::UnknownConnection(conn))?;
        Ok((c, &mut self.io))
    }

    /// Finds the connection a message is for: our local ID in `remote_comm_id`, their ID
    /// either matching or (for answers to a REQ) not known yet, and sent from the
    /// connection's peer address (source validation: an off-path sender that guessed the IDs
    /// is still refused). A miss is counted. A match proves that the peer receives what we
    /// send it (it echoes our comm ID from its address), which lifts the anti-amplification
    /// limit of a half-open connection.
    fn lookup(
        &mut self,
        from: PeerAddr,
        ours: CommId,
        theirs: CommId,
        allow_unset: bool,
    ) -> Option<(&mut Conn, &mut Io)> {
        self.find(from, ours, theirs, allow_unset, true).ok()
    }

    /// [`lookup`](Self::lookup), saying why no connection was found, and counting the miss
    /// only with `count`: checked in this order for every message, `UnknownCommId` (no
    /// connection has our ID), `MismatchedCommId` (it records another remote ID), `WrongPeer`
    /// (another source). A handler that answers some misses (`on_dreq`: the orphan DREP)
    /// calls it with `count = false` and counts the others itself.
    fn find(
        &mut self,
        from: PeerAddr,
        ours: CommId,
        theirs: CommId,
        allow_unset: bool,
        count: bool,
    ) -> Result<(&mut Conn, &mut Io), DropReason> {
        let stats = &mut self.io.stats;
        let mut miss = |why: DropReason| {
            if count {
                stats.drop(why);
            }
            Err(why)
        };
        let Some(c) = self.conns.get_mut(&ours) else {
            return miss(DropReason::UnknownCommId);
        };
        if c.remote_id != theirs && !(allow_unset && c.remote_id == CommId(0)) {
            return miss(DropReason::MismatchedCommId);
        }
        if self.io.peers.addr(c.peer) != from {
            return miss(DropReason::WrongPeer);
        }
        self.io.limits.validate(ours);
        Ok((c, &mut self.io))
    }

    /// Whether a message about connection `id` came from its peer; counts `WrongPeer` if not.
    fn sent_by_peer(&mut self, id: CommId, from: PeerAddr) -> bool {
        let ok = self
            .conns
            .get(&id)
            .is_some_and(|c| self.io.peers.addr(c.peer) == from);
        if !ok {
            self.io.stats.drop(DropReason::WrongPeer);
        }
        ok
    }

    // ---------------------------------------------------------------------------------------
    // Table maintenance and TimeWait

    /// Removes a connection from every index (it goes to IDLE without TimeWait).
    fn remove(&mut self, id: CommId) {
        let Some(mut c) = self.conns.remove(&id) else {
            return;
        };
        self.io.forget(id);
        self.io.set_state(id, &mut c, State::Idle);
        self.release_qpn_of(&mut c);
        self.io.peers.release(c.peer);
    }

    fn release_qpn_of(&mut self, c: &mut Conn) {
        if c.holds_qpn {
            c.holds_qpn = false;
            self.release_qpn(c.local_qpn);
        }
    }

    /// Moves a connection to TimeWait: out of the stale-connection index, QPN quarantined,
    /// timer armed. It stays in the duplicate index (`by_remote`, as in Linux) until it leaves
    /// the table, so that a late duplicate of its REQ is recognised instead of creating a
    /// second connection.
    fn enter_timewait(&mut self, now: Instant, id: CommId) {
        let Some(c) = self.conns.get(&id) else {
            return;
        };
        if c.state == State::Timewait {
            return;
        }
        self.conns.unindex_qpn(id);
        self.io.forget(id);
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        self.io.set_state(id, c, State::Timewait);
        let derived = c.timewait.get().min(self.cfg.max_timewait);
        let dur = self.cfg.timewait.unwrap_or(derived) + self.cfg.timewait_slack;
        let until = now + dur;
        let (holds, qpn) = (c.holds_qpn, c.local_qpn);
        c.holds_qpn = false;
        if holds {
            let q = self.quarantine.entry(qpn).or_insert(until);
            if *q < until {
                *q = until;
            }
            self.release_qpn(qpn);
        }
        self.io.arm(id, until, ConnTimer::Timewait);
    }

    /// TimeWait is over: the connection leaves the table, its QPN the quarantine.
    fn on_timewait_exit(&mut self, now: Instant, id: CommId) {
        let Some(c) = self.conns.remove(&id) else {
            return;
        };
        self.io.forget(id);
        if self
            .quarantine
            .get(&c.local_qpn)
            .is_some_and(|&until| until <= now)
        {
            self.quarantine.remove(&c.local_qpn);
        }
        self.io.peers.release(c.peer);
        self.io.event(
            id,
            EventKind::TimewaitExit {
                local_qpn: c.local_qpn,
            },
        );
    }

    // ---------------------------------------------------------------------------------------
    // Input: time

    /// Fires every timer due at `now`: retransmissions, give-ups and TimeWait exits. A call
    /// with nothing due is a no-op.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.io.now = Some(now);
        self.stateless_resend_due(now);
        while let Some(expired) = self.io.timers.pop_due(now) {
            match expired {
                Expired::Sidr { id, at } => self.on_sidr_timer(now, id, at),
                Expired::SidrIn { id, at } => self.on_sidr_in_timer(id, at),
                Expired::Conn { id, kind, .. } => {
                    if !self.conns.contains_key(&id) {
                        continue;
                    }
                    match kind {
                        ConnTimer::Timewait => self.on_timewait_exit(now, id),
                        ConnTimer::Lifetime => self.on_half_open_expired(id),
                        ConnTimer::Resend => self.on_resend_timer(now, id),
                    }
                }
            }
        }
    }

    /// Retransmits the pending request, or, with its retries exhausted, gives up in the way
    /// the connection's state calls for.
    fn on_resend_timer(&mut self, now: Instant, id: CommId) {
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        // A half-open entry never outlives its deadline (`max_half_open_lifetime`), an
        // unanswered REQ its `connect_timeout`.
        let half = self.io.limits.half(id).map(|h| h.deadline);
        let pending = self.io.pending.get_mut(&id);
        let unanswered = pending
            .as_ref()
            .and_then(|p| p.deadline)
            .filter(|_| c.state == State::ReqSent);
        let deadline = match (half, unanswered) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        if let Some(p) = pending {
            if p.retries_left > 0 && deadline.is_none_or(|d| now < d) {
                p.retries_left -= 1;
                let (mad, timeout) = (p.mad.clone(), p.timeout);
                // Within the anti-amplification budget only; the retry is used up either way,
                // so the schedule ends as it would have.
                if self.io.gate(id, true) {
                    self.io.stats.retransmits += 1;
                    self.io.resend_conn(c, mad);
                }
                let at = deadline.map_or(now + timeout, |d| d.min(now + timeout));
                self.io.arm(id, at, ConnTimer::Resend);
                return;
            }
        }
        if half.is_some_and(|d| now >= d) {
            self.io.stats.half_open_expired += 1;
        }
        self.io.pending.remove(&id);
        match c.state {
            State::ReqSent | State::MraReqRcvd | State::RepSent | State::MraRepRcvd => {
                self.on_setup_timeout(id);
            }
            State::DreqSent => self.on_dreq_timeout(now, id),
            State::Established if matches!(c.lap, LapState::LapSent | LapState::MraLapRcvd) => {
                self.on_lap_timeout(id);
            }
            _ => {}
        }
    }

    // ---------------------------------------------------------------------------------------
    // Input: datagrams

    /// A hint that `data`, a received MAD, will be handed to
    /// [`handle_datagram`](Self::handle_datagram) soon. A REQ or a REP looks its sender's comm
    /// ID up in an index where, with many connections, it lands on a random cache line; this
    /// starts loading that line without waiting for it, so that the miss overlaps other work.
    /// It changes nothing else. A driver that has a batch of datagrams calls it for each of
    /// them before handling the first (`handle_datagram` calls it too).
    pub fn prefetch(&self, data: &[u8]) {
        // MAD header: the attribute ID at bytes 16..18; the CM data from byte 24, where a REQ
        // and a REP both start with the sender's comm ID, and carry its CA GUID at data
        // offset 16 (REQ) or 28 (REP).
        let be_u32 = |at: usize| {
            data.get(at..at + 4)
                .and_then(|b| b.first_chunk::<4>())
                .map(|b| u32::from_be_bytes(*b))
        };
        let be_u64 = |at: usize| {
            data.get(at..at + 8)
                .and_then(|b| b.first_chunk::<8>())
                .map(|b| u64::from_be_bytes(*b))
        };
        let guid_at = match ibcm_mad::MadHeader::peek_attr_id(data) {
            Some(ibcm_mad::AttrId::Req) => 24 + 16,
            Some(ibcm_mad::AttrId::Rep) => 24 + 28,
            _ => return,
        };
        if let (Some(id), Some(guid)) = (be_u32(24), be_u64(guid_at)) {
            self.conns.prefetch_remote(CommId(id), ibcm_mad::Guid(guid));
        }
    }

    /// Handles one received MAD (256 bytes; the transport removed BTH/DETH/ICRC). Never fails:
    /// malformed, unexpected and spoofed MADs are counted in [`Stats`] and dropped, or
    /// answered as docs/protocol.md §4.6 says.
    pub fn handle_datagram(&mut self, now: Instant, from: PeerAddr, data: &[u8]) {
        // The REQ's or REP's probe of the remote-ID index overlaps the parsing.
        self.prefetch(data);
        self.io.stats.rx += 1;
        self.io.now = Some(now);
        let mad = match Mad::parse(data) {
            Ok(m) => m,
            Err(e) => {
                if self.io.log_ok() {
                    debug!(%from, error = %e, "malformed MAD dropped");
                }
                self.io.stats.drop(DropReason::Malformed);
                return;
            }
        };
        trace!(%from, msg = %mad.msg, "recv");
        let tid = mad.header.tid;
        match mad.msg {
            CmMessage::Req(m) => self.on_req(now, from, tid, m),
            CmMessage::Mra(m) => self.on_mra(now, from, m),
            CmMessage::Rej(m) => self.on_rej(now, from, m),
            CmMessage::Rep(m) => self.on_rep(now, from, m),
            CmMessage::Rtu(m) => self.on_rtu(from, m),
            CmMessage::Dreq(m) => self.on_dreq(now, from, tid, m),
            CmMessage::Drep(m) => self.on_drep(now, from, m),
            CmMessage::SidrReq(m) => self.on_sidr_req(now, from, tid, m),
            CmMessage::SidrRep(m) => self.on_sidr_rep(m),
            CmMessage::Lap(m) => self.on_lap(from, m),
            CmMessage::Apr(m) => self.on_apr(from, m),
            CmMessage::ClassPortInfo(_) | CmMessage::Unknown { .. } => {
                self.io.stats.drop(DropReason::Unsupported);
            }
        }
    }
}

/// Whether `id` is a connection's or an incoming or outgoing SIDR request's: the one rule for
/// a local ID being taken ([`Endpoint::alloc_id`], `end_stale`).
fn id_in_use(
    conns: &ConnTable,
    sidr_in: &HashMap<CommId, SidrIn>,
    sidr_out: &HashMap<SidrReqId, SidrOut>,
    id: CommId,
) -> bool {
    conns.contains_key(&id)
        || sidr_in.contains_key(&id)
        || sidr_out.contains_key(&SidrReqId::allocated(id))
}
