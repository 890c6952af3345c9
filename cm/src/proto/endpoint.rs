//! The CM endpoint: the connection table and every transition of spec/cm-wire.md §4.7.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::{Duration, Instant};

use bytes::Bytes;
use ibcm_mad::cma::CmaHeader;
use ibcm_mad::{
    Apr, AprStatus, CmMessage, CommId, Drep, Dreq, Guid, Lap, Mad, Mra, MsgKind, PathInfo,
    PrivateData, Qpn, Rej, RejReason, Rep, Req, ReqTransport, RequestId, Rtu, ServiceId, SidrRep,
    SidrReq, SidrStatus, Tid, TimeoutExp, VendorId,
};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tracing::{debug, trace};

use super::ids::{cm_ack_timeout, form_tid, IdAllocator};
use super::{
    roce_path, AcceptParams, CallError, ConnId, ConnectError, ConnectParams, ConnectionError,
    DropReason, EndpointConfig, Event, EventKind, IncomingRequest, IncomingSidr, LapState,
    ListenOptions, PeerAddr, RepInfo, Side, SidrRepParams, SidrReqParams, State, Stats, Transmit,
};

/// The hash maps of the endpoint: foldhash (several times faster than SipHash on these small
/// keys), seeded from the endpoint's RNG, so that lookups are fast, runs are reproducible under
/// a fixed `rng_seed`, and a peer cannot predict the hash of the comm IDs and QPNs it sends.
type HashMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::SeedableRandomState>;
type HashSet<K> = std::collections::HashSet<K, foldhash::fast::SeedableRandomState>;

fn map<K, V>(seed: u64) -> HashMap<K, V> {
    HashMap::with_hasher(foldhash::fast::SeedableRandomState::with_seed(
        seed,
        foldhash::SharedSeed::global_fixed(),
    ))
}

/// Timers a connection (or SIDR request) can have armed; at most one at a time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum TimerKind {
    /// Retransmit the pending request (REQ, REP, DREQ, LAP).
    Resend,
    /// Leave TimeWait.
    Timewait,
    /// Retransmit a SIDR_REQ (keyed by request ID).
    Sidr,
}

/// A request waiting for its answer, retransmitted unchanged.
#[derive(Debug)]
struct Pending {
    mad: Bytes,
    retries_left: u8,
    timeout: Duration,
}

/// Rarely needed per-connection data, boxed to keep [`Conn`] small.
#[derive(Debug, Default)]
struct Extra {
    /// Private data of our RTU (to rebuild it for a duplicate REP).
    rtu_private_data: Option<Box<[u8]>>,
    /// The last MRA we sent (re-sent on a duplicate of the message it acknowledged).
    mra: Option<Bytes>,
    /// The last APR we sent (re-sent on a duplicate LAP).
    apr: Option<Bytes>,
}

/// One connection.
#[derive(Debug)]
struct Conn {
    state: State,
    lap: LapState,
    side: Side,
    transport: ReqTransport,
    /// Closed event already emitted.
    closed: bool,
    /// Send the RTU as soon as the REP arrives.
    auto_rtu: bool,
    /// The connection counts its local QPN as in use.
    holds_qpn: bool,
    remote_id: CommId,
    local_qpn: Qpn,
    remote_qpn: Qpn,
    remote_ca_guid: Guid,
    /// The peer, interned in [`Io::peers`] (connections to one node share one entry).
    peer: PeerId,
    tid: Tid,
    /// Timeout of our requests on this connection (REQ/REP, then DREQ/LAP), in µs.
    request_timeout: Micros,
    max_retries: u8,
    /// Packet life time (for the MRA wait).
    packet_life_time: TimeoutExp,
    /// TimeWait duration, in µs.
    timewait: Micros,
    timer: Option<(Instant, TimerKind)>,
    pending: Option<Box<Pending>>,
    extra: Option<Box<Extra>>,
}

impl Conn {
    fn extra(&mut self) -> &mut Extra {
        self.extra.get_or_insert_with(Box::default)
    }
}

/// A duration in microseconds, saturating at ~71 minutes (CM timeouts above that are clamped;
/// keeping them in 4 bytes halves the per-connection record).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Micros(u32);

impl Micros {
    fn from_duration(d: Duration) -> Self {
        Micros(u32::try_from(d.as_micros()).unwrap_or(u32::MAX).max(1))
    }

    fn get(self) -> Duration {
        Duration::from_micros(u64::from(self.0))
    }
}

/// Index of an interned peer address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct PeerId(u32);

/// Peer addresses shared by the connections that use them, with reference counts.
#[derive(Debug)]
struct Peers {
    addrs: Vec<PeerAddr>,
    refs: Vec<u32>,
    index: HashMap<PeerAddr, u32>,
    free: Vec<u32>,
}

impl Default for Peers {
    fn default() -> Self {
        Peers {
            addrs: Vec::new(),
            refs: Vec::new(),
            index: map(0),
            free: Vec::new(),
        }
    }
}

impl Peers {
    fn intern(&mut self, addr: PeerAddr) -> PeerId {
        if let Some(&i) = self.index.get(&addr) {
            if let Some(r) = self.refs.get_mut(i as usize) {
                *r += 1;
            }
            return PeerId(i);
        }
        let i = match self.free.pop() {
            Some(i) => {
                if let (Some(a), Some(r)) = (
                    self.addrs.get_mut(i as usize),
                    self.refs.get_mut(i as usize),
                ) {
                    *a = addr;
                    *r = 1;
                }
                i
            }
            None => {
                self.addrs.push(addr);
                self.refs.push(1);
                (self.addrs.len() - 1) as u32
            }
        };
        self.index.insert(addr, i);
        PeerId(i)
    }

    fn release(&mut self, id: PeerId) {
        let Some(r) = self.refs.get_mut(id.0 as usize) else {
            return;
        };
        *r = r.saturating_sub(1);
        if *r == 0 {
            if let Some(a) = self.addrs.get(id.0 as usize) {
                self.index.remove(a);
            }
            self.free.push(id.0);
        }
    }

    fn addr(&self, id: PeerId) -> PeerAddr {
        self.addrs
            .get(id.0 as usize)
            .copied()
            .unwrap_or(PeerAddr::Udp(std::net::SocketAddr::from(([0, 0, 0, 0], 0))))
    }
}

/// An outgoing SIDR_REQ.
#[derive(Debug)]
struct SidrOut {
    pending: Pending,
    timer: Option<Instant>,
}

/// An incoming SIDR_REQ waiting for the application.
#[derive(Debug)]
struct SidrIn {
    peer: PeerAddr,
    request_id: RequestId,
    service_id: ServiceId,
    tid: Tid,
}

/// Output queues and counters, kept apart from the connection table so that a handler can
/// hold a connection and queue output at the same time.
#[derive(Debug)]
struct Io {
    peers: Peers,
    outbox: VecDeque<Transmit>,
    events: VecDeque<Event>,
    timers: BTreeSet<(Instant, u32, TimerKind)>,
    stats: Stats,
    half_open: usize,
}

impl Io {
    fn send(&mut self, to: PeerAddr, tid: Tid, msg: CmMessage) -> Bytes {
        let mad = Mad::new(tid, msg).to_bytes();
        trace!(%to, msg = %msg, "send");
        self.stats.tx += 1;
        match msg {
            CmMessage::Rej(_) => self.stats.rej_sent += 1,
            CmMessage::Mra(_) => self.stats.mra_sent += 1,
            _ => {}
        }
        self.outbox.push_back(Transmit {
            to,
            mad: mad.clone(),
        });
        mad
    }

    /// Sends on a connection, to its peer, with its TID.
    fn send_conn(&mut self, c: &Conn, msg: CmMessage) -> Bytes {
        let to = self.peers.addr(c.peer);
        self.send(to, c.tid, msg)
    }

    fn resend_conn(&mut self, c: &Conn, mad: Bytes) {
        let to = self.peers.addr(c.peer);
        self.resend(to, mad);
    }

    fn resend(&mut self, to: PeerAddr, mad: Bytes) {
        self.stats.tx += 1;
        self.outbox.push_back(Transmit { to, mad });
    }

    fn event(&mut self, conn: ConnId, kind: EventKind) {
        self.events.push_back(Event { conn, kind });
    }

    fn arm(&mut self, id: CommId, conn: &mut Conn, at: Instant, kind: TimerKind) {
        self.disarm(id, conn);
        conn.timer = Some((at, kind));
        self.timers.insert((at, id.0, kind));
    }

    fn disarm(&mut self, id: CommId, conn: &mut Conn) {
        if let Some((t, k)) = conn.timer.take() {
            self.timers.remove(&(t, id.0, k));
        }
    }

    fn set_state(&mut self, conn: &mut Conn, new: State) {
        if conn.state.is_half_open_passive() {
            self.half_open = self.half_open.saturating_sub(1);
        }
        if new.is_half_open_passive() {
            self.half_open += 1;
        }
        if new == State::Established && conn.state != State::Established {
            self.stats.established += 1;
        }
        conn.state = new;
    }

    fn close(&mut self, id: CommId, conn: &mut Conn, err: ConnectionError) {
        if !conn.closed {
            conn.closed = true;
            debug!(conn = %id, error = %err, "closed");
            self.event(id, EventKind::Closed(err));
        }
    }

    /// Starts a request that waits for an answer: sends it and arms the resend timer.
    #[allow(clippy::too_many_arguments)]
    fn send_request(
        &mut self,
        now: Instant,
        id: CommId,
        conn: &mut Conn,
        msg: CmMessage,
        timeout: Duration,
        retries: u8,
    ) {
        let mad = self.send_conn(conn, msg);
        conn.pending = Some(Box::new(Pending {
            mad,
            retries_left: retries,
            timeout,
        }));
        self.arm(id, conn, now + timeout, TimerKind::Resend);
    }

    fn cancel_request(&mut self, id: CommId, conn: &mut Conn) {
        conn.pending = None;
        if matches!(conn.timer, Some((_, TimerKind::Resend))) {
            self.disarm(id, conn);
        }
    }
}

fn rej(
    local: CommId,
    remote: CommId,
    kind: MsgKind,
    reason: RejReason,
    ari: &[u8],
    pd: &[u8],
) -> CmMessage {
    let mut r = Rej {
        local_comm_id: local,
        remote_comm_id: remote,
        message_rejected: kind,
        reason,
        private_data: PrivateData::from_slice(pd).unwrap_or_default(),
        ..Rej::default()
    };
    r.set_ari(ari);
    CmMessage::Rej(r)
}

fn trimmed(b: &[u8]) -> Vec<u8> {
    let end = b.iter().rposition(|&x| x != 0).map_or(0, |p| p + 1);
    b.get(..end).unwrap_or(&[]).to_vec()
}

fn check_len(what: &'static str, data: &[u8], max: usize) -> Result<(), CallError> {
    if data.len() > max {
        return Err(CallError::TooLong {
            what,
            len: data.len(),
            max,
        });
    }
    Ok(())
}

/// The sans-IO IB CM endpoint.
///
/// # Method families
/// * inputs: [`handle_datagram`](Self::handle_datagram) (a received MAD),
///   [`handle_timeout`](Self::handle_timeout) (time passed);
/// * commands: [`listen`](Self::listen), [`connect`](Self::connect), [`accept`](Self::accept),
///   [`reject`](Self::reject), [`mra`](Self::mra), [`establish`](Self::establish),
///   [`notify_established`](Self::notify_established), [`disconnect`](Self::disconnect),
///   [`sidr_request`](Self::sidr_request), [`sidr_reply`](Self::sidr_reply),
///   [`load_alternate_path`](Self::load_alternate_path), [`apr`](Self::apr);
/// * outputs: [`poll_transmit`](Self::poll_transmit), [`poll_timeout`](Self::poll_timeout),
///   [`poll_event`](Self::poll_event);
/// * getters: [`stats`](Self::stats), [`state`](Self::state), [`len`](Self::len), ….
///
/// After every input or command, drain in the order transmit → timeout → events. Every input
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
    rng: ChaCha8Rng,
    ids: IdAllocator,
    conns: HashMap<CommId, Conn>,
    /// (remote comm ID, remote CA GUID) → connection: duplicate detection.
    by_remote: HashMap<(CommId, Guid), CommId>,
    /// (remote QPN, remote CA GUID) → connection: stale-connection detection.
    by_qpn: HashMap<(Qpn, Guid), CommId>,
    /// Live connections per local QPN.
    local_qpns: HashMap<Qpn, u32>,
    /// QPNs of connections in TimeWait, with the time they become free.
    quarantine: HashMap<Qpn, Instant>,
    listeners: BTreeMap<ServiceId, ListenOptions>,
    sidr_out: HashMap<RequestId, SidrOut>,
    sidr_out_peer: HashMap<RequestId, PeerAddr>,
    sidr_in: HashMap<CommId, SidrIn>,
    sidr_in_keys: HashSet<(RequestId, PeerAddr)>,
    io: Io,
}

impl Endpoint {
    /// A new endpoint.
    pub fn new(cfg: EndpointConfig) -> Self {
        let mut rng = match cfg.rng_seed {
            Some(seed) => ChaCha8Rng::seed_from_u64(seed),
            None => ChaCha8Rng::from_os_rng(),
        };
        let operand: u32 = rng.random();
        let seed: u64 = rng.random();
        Endpoint {
            cfg,
            rng,
            ids: IdAllocator::new(operand),
            conns: map(seed),
            by_remote: map(seed),
            by_qpn: map(seed),
            local_qpns: map(seed),
            quarantine: map(seed),
            listeners: BTreeMap::new(),
            sidr_out: map(seed),
            sidr_out_peer: map(seed),
            sidr_in: map(seed),
            sidr_in_keys: HashSet::with_hasher(foldhash::fast::SeedableRandomState::with_seed(
                seed,
                foldhash::SharedSeed::global_fixed(),
            )),
            io: Io {
                peers: Peers {
                    index: map(seed),
                    ..Peers::default()
                },
                outbox: VecDeque::new(),
                events: VecDeque::new(),
                timers: BTreeSet::new(),
                stats: Stats::default(),
                half_open: 0,
            },
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

    /// Whether the table is empty (no connection, no pending SIDR, no timer).
    pub fn is_empty(&self) -> bool {
        self.conns.is_empty()
            && self.sidr_out.is_empty()
            && self.sidr_in.is_empty()
            && self.io.timers.is_empty()
    }

    /// Passive connections not yet established.
    pub fn half_open(&self) -> usize {
        self.io.half_open
    }

    /// The IDs of all connections, sorted.
    pub fn conn_ids(&self) -> Vec<ConnId> {
        let mut v: Vec<ConnId> = self.conns.keys().copied().collect();
        v.sort();
        v
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
        self.io.timers.first().map(|(t, _, _)| *t)
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

    /// Stops listening. Returns whether there was a listener.
    pub fn unlisten(&mut self, service_id: ServiceId) -> bool {
        self.listeners.remove(&service_id).is_some()
    }

    // ---------------------------------------------------------------------------------------
    // Active side

    fn alloc_id(&mut self) -> CommId {
        let conns = &self.conns;
        let sidr_in = &self.sidr_in;
        let sidr_out = &self.sidr_out;
        self.ids.alloc(|id| {
            conns.contains_key(&id)
                || sidr_in.contains_key(&id)
                || sidr_out.contains_key(&RequestId(id.0))
        })
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

    /// Sends a REQ. The connection reports [`EventKind::Established`] (or
    /// [`EventKind::RepReceived`] without `auto_rtu`) or [`EventKind::Closed`].
    ///
    /// # Errors
    /// [`ConnectError`] for private data that does not fit, a QPN in TimeWait quarantine or in
    /// use, or a missing path.
    pub fn connect(&mut self, now: Instant, p: ConnectParams) -> Result<ConnId, ConnectError> {
        let max = p.max_private_data();
        if p.private_data.len() > max {
            return Err(ConnectError::PrivateDataTooLong {
                len: p.private_data.len(),
                max,
            });
        }
        self.check_qpn(p.local_qpn, now, p.allow_shared_qpn)?;
        let primary_path = match p.primary_path {
            Some(path) => path,
            None => {
                let remote = p.peer.gid().ok_or(ConnectError::NoPath)?;
                let ack = TimeoutExp::masked(p.packet_life_time.get().saturating_add(1).min(31));
                roce_path(self.cfg.local_gid, remote, ack)
            }
        };
        let mut pd = [0u8; 92];
        let user_off = match &p.cma_header {
            Some(h) => {
                // The buffer is 92 bytes, more than the header's 36.
                let _ = h.emit(&mut pd);
                CmaHeader::LEN
            }
            None => 0,
        };
        if let Some(dst) = pd.get_mut(user_off..user_off + p.private_data.len()) {
            dst.copy_from_slice(&p.private_data);
        }
        let id = self.alloc_id();
        let tid = form_tid(self.cfg.hi_tid, id);
        let mut req = Req {
            local_comm_id: id,
            service_id: p.service_id,
            local_ca_guid: self.cfg.local_ca_guid,
            local_qpn: p.local_qpn,
            responder_resources: p.responder_resources,
            initiator_depth: p.initiator_depth,
            remote_cm_response_timeout: p.remote_cm_response_timeout,
            end_to_end_flow_control: p.flow_control,
            starting_psn: p.starting_psn,
            local_cm_response_timeout: p.local_cm_response_timeout,
            retry_count: p.retry_count,
            partition_key: p.pkey,
            path_mtu: p.path_mtu,
            rnr_retry_count: p.rnr_retry_count,
            max_cm_retries: p.max_cm_retries,
            srq: p.srq,
            primary_path,
            alternate_path: p.alternate_path.unwrap_or_default(),
            private_data: PrivateData(pd),
            ..Req::default()
        };
        req.set_transport(p.transport);
        let request_timeout =
            p.packet_life_time.to_duration() * 2 + p.remote_cm_response_timeout.to_duration();
        let mut conn = Conn {
            state: State::ReqSent,
            lap: LapState::Uninit,
            side: Side::Active,
            transport: p.transport,
            closed: false,
            auto_rtu: p.auto_rtu,
            holds_qpn: true,
            remote_id: CommId(0),
            local_qpn: p.local_qpn,
            remote_qpn: Qpn::default(),
            remote_ca_guid: Guid(0),
            peer: self.io.peers.intern(p.peer),
            tid,
            request_timeout: Micros::from_duration(request_timeout),
            max_retries: p.max_cm_retries.get(),
            packet_life_time: p.packet_life_time,
            timewait: Micros::from_duration(primary_path.local_ack_timeout.to_duration()),
            timer: None,
            pending: None,
            extra: None,
        };
        debug!(conn = %id, peer = %p.peer, sid = %p.service_id, "connect");
        self.io.send_request(
            now,
            id,
            &mut conn,
            CmMessage::Req(req),
            request_timeout,
            p.max_cm_retries.get(),
        );
        self.use_qpn(p.local_qpn);
        self.conns.insert(id, conn);
        Ok(id)
    }

    /// Sends the RTU for a connection in REP_RCVD / MRA_REP_SENT (when `auto_rtu` was off).
    ///
    /// # Errors
    /// [`CallError`] for an unknown connection, a wrong state or private data over 224 bytes.
    pub fn establish(
        &mut self,
        _now: Instant,
        conn: ConnId,
        private_data: &[u8],
    ) -> Result<(), CallError> {
        check_len("RTU private data", private_data, Rtu::PRIVATE_DATA_LEN)?;
        let c = self
            .conns
            .get_mut(&conn)
            .ok_or(CallError::UnknownConnection(conn))?;
        if !matches!(c.state, State::RepRcvd | State::MraRepSent) {
            return Err(CallError::WrongState {
                op: "establish",
                state: c.state,
            });
        }
        Self::send_rtu(&mut self.io, conn, c, private_data);
        Ok(())
    }

    fn send_rtu(io: &mut Io, id: CommId, c: &mut Conn, private_data: &[u8]) {
        let rtu = Rtu {
            local_comm_id: id,
            remote_comm_id: c.remote_id,
            private_data: PrivateData::from_slice(private_data).unwrap_or_default(),
        };
        io.send_conn(c, CmMessage::Rtu(rtu));
        if private_data.iter().any(|&b| b != 0) {
            c.extra().rtu_private_data = Some(private_data.into());
        } else if let Some(x) = c.extra.as_mut() {
            x.rtu_private_data = None;
            x.mra = None;
        }
        if c.extra
            .as_ref()
            .is_some_and(|x| x.rtu_private_data.is_none() && x.mra.is_none() && x.apr.is_none())
        {
            c.extra = None;
        }
        io.set_state(c, State::Established);
        c.lap = LapState::Uninit;
        io.event(id, EventKind::Established);
    }

    // ---------------------------------------------------------------------------------------
    // Passive side

    /// Accepts a REQ: sends the REP.
    ///
    /// # Errors
    /// [`CallError`] for an unknown connection, a state other than REQ_RCVD / MRA_REQ_SENT,
    /// private data over 196 bytes, or a QPN in quarantine (not checked for a live XRC TGT
    /// QP: [`AcceptParams::xrc_tgt_live`]) or already in use.
    pub fn accept(&mut self, now: Instant, conn: ConnId, p: AcceptParams) -> Result<(), CallError> {
        check_len("REP private data", &p.private_data, Rep::PRIVATE_DATA_LEN)?;
        let state = self
            .conns
            .get(&conn)
            .ok_or(CallError::UnknownConnection(conn))?
            .state;
        if !matches!(state, State::ReqRcvd | State::MraReqSent) {
            return Err(CallError::WrongState {
                op: "accept",
                state,
            });
        }
        let qpn = p.xrc_tgt_qpn.unwrap_or(p.local_qpn);
        let shared = p.xrc_tgt_qpn.is_some();
        // A live shared TGT QP attached again is no reuse of its number (AcceptParams docs).
        let live_tgt = shared && p.xrc_tgt_live;
        match self.check_qpn(qpn, now, shared) {
            Err(ConnectError::QpnInQuarantine { qpn, .. }) if !live_tgt => {
                return Err(CallError::QpnInQuarantine { qpn })
            }
            Err(ConnectError::QpnInUse { qpn }) => return Err(CallError::QpnInUse { qpn }),
            _ => {}
        }
        self.use_qpn(qpn);
        let guid = self.cfg.local_ca_guid;
        let Some(c) = self.conns.get_mut(&conn) else {
            return Err(CallError::UnknownConnection(conn));
        };
        let mut rep = Rep {
            local_comm_id: conn,
            remote_comm_id: c.remote_id,
            local_qpn: p.local_qpn,
            starting_psn: p.starting_psn,
            responder_resources: p.responder_resources,
            initiator_depth: p.initiator_depth,
            target_ack_delay: p.target_ack_delay,
            failover_accepted: p.failover_accepted,
            end_to_end_flow_control: p.flow_control,
            rnr_retry_count: p.rnr_retry_count,
            srq: p.srq,
            local_ca_guid: guid,
            private_data: PrivateData::from_slice(&p.private_data).unwrap_or_default(),
            ..Rep::default()
        };
        if let Some(tgt) = p.xrc_tgt_qpn {
            rep.set_xrc_tgt_qpn(tgt);
        }
        c.local_qpn = qpn;
        c.holds_qpn = true;
        if let Some(x) = c.extra.as_mut() {
            x.mra = None;
        }
        self.io.set_state(c, State::RepSent);
        let (timeout, retries) = (c.request_timeout.get(), c.max_retries);
        self.io
            .send_request(now, conn, c, CmMessage::Rep(rep), timeout, retries);
        Ok(())
    }

    /// Rejects a connection: from REQ_RCVD / MRA_REQ_SENT (the REQ), REP_RCVD /
    /// MRA_REP_SENT (the REP) or REP_SENT / MRA_REP_RCVD (after our REP).
    ///
    /// # Errors
    /// [`CallError`] for an unknown connection, another state, or ARI over 72 / private data
    /// over 148 bytes.
    pub fn reject(
        &mut self,
        now: Instant,
        conn: ConnId,
        reason: RejReason,
        ari: &[u8],
        private_data: &[u8],
    ) -> Result<(), CallError> {
        check_len("ARI", ari, Rej::ARI_LEN)?;
        check_len("REJ private data", private_data, Rej::PRIVATE_DATA_LEN)?;
        let c = self
            .conns
            .get_mut(&conn)
            .ok_or(CallError::UnknownConnection(conn))?;
        let (local, kind, timewait) = match c.state {
            // Linux sends local comm ID 0 when rejecting from REQ_RCVD.
            State::ReqRcvd => (CommId(0), MsgKind::Req, false),
            State::MraReqSent => (conn, MsgKind::Req, false),
            State::RepRcvd | State::MraRepSent => (conn, MsgKind::Rep, false),
            State::RepSent | State::MraRepRcvd => (conn, MsgKind::Other, true),
            state => {
                return Err(CallError::WrongState {
                    op: "reject",
                    state,
                })
            }
        };
        let msg = rej(local, c.remote_id, kind, reason, ari, private_data);
        self.io.send_conn(c, msg);
        self.io.cancel_request(conn, c);
        self.io
            .close(conn, c, ConnectionError::LocallyRejected { reason });
        if timewait {
            self.enter_timewait(now, conn);
        } else {
            self.remove(conn);
        }
        Ok(())
    }

    /// Sends an MRA for the REQ (REQ_RCVD), the REP (REP_RCVD) or the LAP (LAP_RCVD) of a
    /// connection: "the answer will take up to `service_timeout`". The MRA is re-sent when a
    /// duplicate of the acknowledged message arrives.
    ///
    /// # Errors
    /// [`CallError`] for an unknown connection, another state or private data over 222 bytes.
    pub fn mra(
        &mut self,
        _now: Instant,
        conn: ConnId,
        service_timeout: TimeoutExp,
        private_data: &[u8],
    ) -> Result<(), CallError> {
        check_len("MRA private data", private_data, Mra::PRIVATE_DATA_LEN)?;
        let c = self
            .conns
            .get_mut(&conn)
            .ok_or(CallError::UnknownConnection(conn))?;
        let kind = match (c.state, c.lap) {
            (State::ReqRcvd | State::MraReqSent, _) => MsgKind::Req,
            (State::RepRcvd | State::MraRepSent, _) => MsgKind::Rep,
            (State::Established, LapState::LapRcvd | LapState::MraLapSent) => MsgKind::Other,
            (state, _) => return Err(CallError::WrongState { op: "mra", state }),
        };
        Self::send_mra(&mut self.io, conn, c, kind, service_timeout, private_data);
        Ok(())
    }

    fn send_mra(
        io: &mut Io,
        id: CommId,
        c: &mut Conn,
        kind: MsgKind,
        service_timeout: TimeoutExp,
        private_data: &[u8],
    ) {
        let mra = Mra {
            local_comm_id: id,
            remote_comm_id: c.remote_id,
            message_mraed: kind,
            service_timeout,
            private_data: PrivateData::from_slice(private_data).unwrap_or_default(),
        };
        let bytes = io.send_conn(c, CmMessage::Mra(mra));
        c.extra().mra = Some(bytes);
        match kind {
            MsgKind::Req => io.set_state(c, State::MraReqSent),
            MsgKind::Rep => io.set_state(c, State::MraRepSent),
            _ => c.lap = LapState::MraLapSent,
        }
    }

    /// Reports that the QP saw traffic (`IB_EVENT_COMM_EST`) although no RTU arrived: a
    /// connection in REP_SENT / MRA_REP_RCVD becomes established.
    ///
    /// # Errors
    /// [`CallError`] for an unknown connection or another state.
    pub fn notify_established(&mut self, _now: Instant, conn: ConnId) -> Result<(), CallError> {
        let c = self
            .conns
            .get_mut(&conn)
            .ok_or(CallError::UnknownConnection(conn))?;
        if !matches!(c.state, State::RepSent | State::MraRepRcvd) {
            return Err(CallError::WrongState {
                op: "notify_established",
                state: c.state,
            });
        }
        self.io.cancel_request(conn, c);
        self.io.set_state(c, State::Established);
        self.io.event(conn, EventKind::Established);
        Ok(())
    }

    // ---------------------------------------------------------------------------------------
    // Teardown

    /// Closes a connection in whatever way its state calls for:
    /// * ESTABLISHED: sends a DREQ (retransmitted until the DREP; then TimeWait);
    /// * REQ_SENT / MRA_REQ_RCVD: gives up the attempt with REJ 4 "timeout" (ARI = our CA GUID),
    ///   as Linux does when such an ID is destroyed;
    /// * REQ_RCVD / MRA_REQ_SENT, REP_*: rejects with REJ 28;
    /// * already closing (DREQ_SENT, TIMEWAIT): nothing to do.
    ///
    /// # Errors
    /// [`CallError`] for an unknown connection or private data over 220 bytes.
    pub fn disconnect(
        &mut self,
        now: Instant,
        conn: ConnId,
        private_data: &[u8],
    ) -> Result<(), CallError> {
        check_len("DREQ private data", private_data, Dreq::PRIVATE_DATA_LEN)?;
        let guid = self.cfg.local_ca_guid;
        let c = self
            .conns
            .get_mut(&conn)
            .ok_or(CallError::UnknownConnection(conn))?;
        match c.state {
            State::Established => {
                self.io.cancel_request(conn, c);
                let dreq = Dreq {
                    local_comm_id: conn,
                    remote_comm_id: c.remote_id,
                    remote_qpn_eecn: c.remote_qpn,
                    private_data: PrivateData::from_slice(private_data).unwrap_or_default(),
                };
                self.io.set_state(c, State::DreqSent);
                c.lap = LapState::Uninit;
                let (timeout, retries) = (c.request_timeout.get(), c.max_retries);
                self.io
                    .send_request(now, conn, c, CmMessage::Dreq(dreq), timeout, retries);
                Ok(())
            }
            State::ReqSent | State::MraReqRcvd => {
                let msg = rej(
                    conn,
                    c.remote_id,
                    MsgKind::Other,
                    RejReason::Timeout,
                    &guid.0.to_be_bytes(),
                    &[],
                );
                self.io.send_conn(c, msg);
                self.io.cancel_request(conn, c);
                self.io.close(conn, c, ConnectionError::LocallyClosed);
                self.remove(conn);
                Ok(())
            }
            State::ReqRcvd
            | State::MraReqSent
            | State::RepRcvd
            | State::MraRepSent
            | State::RepSent
            | State::MraRepRcvd => self.reject(now, conn, RejReason::ConsumerReject, &[], &[]),
            State::DreqSent | State::DreqRcvd | State::Timewait | State::Idle => Ok(()),
        }
    }

    // ---------------------------------------------------------------------------------------
    // SIDR

    /// Sends a SIDR_REQ; the answer comes as [`EventKind::SidrReply`] or
    /// [`EventKind::SidrTimedOut`] with the returned ID as `conn`.
    ///
    /// # Errors
    /// [`ConnectError::PrivateDataTooLong`] over 216 bytes.
    pub fn sidr_request(&mut self, now: Instant, p: SidrReqParams) -> Result<ConnId, ConnectError> {
        if p.private_data.len() > SidrReq::PRIVATE_DATA_LEN {
            return Err(ConnectError::PrivateDataTooLong {
                len: p.private_data.len(),
                max: SidrReq::PRIVATE_DATA_LEN,
            });
        }
        let id = self.alloc_id();
        let req = SidrReq {
            request_id: RequestId(id.0),
            partition_key: p.pkey,
            service_id: p.service_id,
            private_data: PrivateData::from_slice(&p.private_data).unwrap_or_default(),
        };
        let mad = self.io.send(
            p.peer,
            form_tid(self.cfg.hi_tid, id),
            CmMessage::SidrReq(req),
        );
        let at = now + p.timeout;
        self.io.timers.insert((at, id.0, TimerKind::Sidr));
        self.sidr_out.insert(
            RequestId(id.0),
            SidrOut {
                pending: Pending {
                    mad,
                    retries_left: p.max_retries,
                    timeout: p.timeout,
                },
                timer: Some(at),
            },
        );
        self.sidr_out_peer.insert(RequestId(id.0), p.peer);
        Ok(id)
    }

    /// Answers a SIDR_REQ reported by [`EventKind::SidrReqReceived`].
    ///
    /// # Errors
    /// [`CallError`] for an unknown request or fields that do not fit.
    pub fn sidr_reply(
        &mut self,
        _now: Instant,
        id: ConnId,
        p: SidrRepParams,
    ) -> Result<(), CallError> {
        check_len(
            "SIDR_REP private data",
            &p.private_data,
            SidrRep::PRIVATE_DATA_LEN,
        )?;
        check_len("SIDR_REP additional info", &p.additional_info, 72)?;
        let s = self
            .sidr_in
            .remove(&id)
            .ok_or(CallError::UnknownConnection(id))?;
        self.sidr_in_keys.remove(&(s.request_id, s.peer));
        let mut add = [0u8; 72];
        if let Some(dst) = add.get_mut(..p.additional_info.len()) {
            dst.copy_from_slice(&p.additional_info);
        }
        let rep = SidrRep {
            request_id: s.request_id,
            status: p.status,
            additional_info_length: p.additional_info.len() as u8,
            ece_vendor_id: VendorId::default(),
            qpn: p.qpn,
            service_id: s.service_id,
            qkey: p.qkey,
            additional_info: add,
            private_data: PrivateData::from_slice(&p.private_data).unwrap_or_default(),
        };
        self.io.send(s.peer, s.tid, CmMessage::SidrRep(rep));
        Ok(())
    }

    // ---------------------------------------------------------------------------------------
    // LAP / APR

    /// Proposes an alternate path on an established connection (LAP); the answer is
    /// [`EventKind::AprReceived`] or [`EventKind::LapTimedOut`].
    ///
    /// # Errors
    /// [`CallError`] for an unknown connection, a state other than ESTABLISHED with no LAP in
    /// progress, or private data over 168 bytes.
    pub fn load_alternate_path(
        &mut self,
        now: Instant,
        conn: ConnId,
        path: PathInfo,
        private_data: &[u8],
    ) -> Result<(), CallError> {
        check_len("LAP private data", private_data, Lap::PRIVATE_DATA_LEN)?;
        let c = self
            .conns
            .get_mut(&conn)
            .ok_or(CallError::UnknownConnection(conn))?;
        if c.state != State::Established || !matches!(c.lap, LapState::Uninit | LapState::Idle) {
            return Err(CallError::WrongState {
                op: "load_alternate_path",
                state: c.state,
            });
        }
        let lap = Lap {
            local_comm_id: conn,
            remote_comm_id: c.remote_id,
            remote_qpn_eecn: c.remote_qpn,
            remote_cm_response_timeout: TimeoutExp::from_duration_ceil(c.request_timeout.get()),
            alternate_path: path,
            private_data: PrivateData::from_slice(private_data).unwrap_or_default(),
        };
        c.lap = LapState::LapSent;
        let (timeout, retries) = (c.request_timeout.get(), c.max_retries);
        self.io
            .send_request(now, conn, c, CmMessage::Lap(lap), timeout, retries);
        Ok(())
    }

    /// Reports that the QP migrated to its alternate path (`IB_EVENT_PATH_MIG`): the
    /// alternate path becomes primary and a new LAP may be exchanged.
    ///
    /// # Errors
    /// [`CallError`] for an unknown connection or a connection that is not established with
    /// no LAP in progress.
    pub fn notify_path_migrated(&mut self, _now: Instant, conn: ConnId) -> Result<(), CallError> {
        let c = self
            .conns
            .get_mut(&conn)
            .ok_or(CallError::UnknownConnection(conn))?;
        if c.state != State::Established || !matches!(c.lap, LapState::Uninit | LapState::Idle) {
            return Err(CallError::WrongState {
                op: "notify_path_migrated",
                state: c.state,
            });
        }
        c.lap = LapState::Idle;
        Ok(())
    }

    /// Answers a LAP reported by [`EventKind::LapReceived`] with an APR.
    ///
    /// # Errors
    /// [`CallError`] for an unknown connection, no LAP to answer, or fields that do not fit.
    pub fn apr(
        &mut self,
        _now: Instant,
        conn: ConnId,
        status: AprStatus,
        additional_info: &[u8],
        private_data: &[u8],
    ) -> Result<(), CallError> {
        check_len("APR additional info", additional_info, 72)?;
        check_len("APR private data", private_data, Apr::PRIVATE_DATA_LEN)?;
        let c = self
            .conns
            .get_mut(&conn)
            .ok_or(CallError::UnknownConnection(conn))?;
        if !matches!(c.lap, LapState::LapRcvd | LapState::MraLapSent) {
            return Err(CallError::WrongState {
                op: "apr",
                state: c.state,
            });
        }
        let mut add = [0u8; 72];
        if let Some(dst) = add.get_mut(..additional_info.len()) {
            dst.copy_from_slice(additional_info);
        }
        let apr = Apr {
            local_comm_id: conn,
            remote_comm_id: c.remote_id,
            additional_info_length: additional_info.len() as u8,
            ap_status: status,
            additional_info: add,
            private_data: PrivateData::from_slice(private_data).unwrap_or_default(),
        };
        let bytes = self.io.send_conn(c, CmMessage::Apr(apr));
        c.extra().apr = Some(bytes);
        c.lap = LapState::Idle;
        Ok(())
    }

    // ---------------------------------------------------------------------------------------
    // Table maintenance

    /// Removes a connection from every index (it goes to IDLE without TimeWait).
    fn remove(&mut self, id: CommId) {
        let Some(mut c) = self.conns.remove(&id) else {
            return;
        };
        self.io.disarm(id, &mut c);
        self.io.set_state(&mut c, State::Idle);
        self.unindex(id, &c);
        self.release_qpn_of(&mut c);
        self.io.peers.release(c.peer);
    }

    fn release_qpn_of(&mut self, c: &mut Conn) {
        if c.holds_qpn {
            c.holds_qpn = false;
            self.release_qpn(c.local_qpn);
        }
    }

    fn unindex(&mut self, id: CommId, c: &Conn) {
        let key = (c.remote_id, c.remote_ca_guid);
        if self.by_remote.get(&key) == Some(&id) {
            self.by_remote.remove(&key);
        }
        let key = (c.remote_qpn, c.remote_ca_guid);
        if self.by_qpn.get(&key) == Some(&id) {
            self.by_qpn.remove(&key);
        }
    }

    /// Moves a connection to TimeWait: out of the lookup indexes, QPN quarantined, timer
    /// armed.
    fn enter_timewait(&mut self, now: Instant, id: CommId) {
        let Some(mut c) = self.conns.remove(&id) else {
            return;
        };
        if c.state == State::Timewait {
            self.conns.insert(id, c);
            return;
        }
        self.unindex(id, &c);
        self.io.set_state(&mut c, State::Timewait);
        c.pending = None;
        c.extra = None;
        let dur = self.cfg.timewait.unwrap_or(c.timewait.get()) + self.cfg.timewait_slack;
        let until = now + dur;
        if c.holds_qpn {
            let q = self.quarantine.entry(c.local_qpn).or_insert(until);
            if *q < until {
                *q = until;
            }
            self.release_qpn_of(&mut c);
        }
        self.io.arm(id, &mut c, until, TimerKind::Timewait);
        self.conns.insert(id, c);
    }

    // ---------------------------------------------------------------------------------------
    // Time

    /// Fires every timer due at `now`: retransmissions, give-ups and TimeWait exits. A call
    /// with nothing due is a no-op.
    pub fn handle_timeout(&mut self, now: Instant) {
        while let Some(&(t, raw, kind)) = self.io.timers.first() {
            if t > now {
                break;
            }
            self.io.timers.remove(&(t, raw, kind));
            let id = CommId(raw);
            match kind {
                TimerKind::Sidr => self.on_sidr_timer(now, RequestId(raw), t),
                TimerKind::Resend | TimerKind::Timewait => {
                    let Some(c) = self.conns.get_mut(&id) else {
                        continue;
                    };
                    if c.timer != Some((t, kind)) {
                        continue; // stale entry
                    }
                    c.timer = None;
                    if kind == TimerKind::Timewait {
                        self.on_timewait_exit(now, id);
                    } else {
                        self.on_resend_timer(now, id);
                    }
                }
            }
        }
    }

    fn on_timewait_exit(&mut self, now: Instant, id: CommId) {
        let Some(c) = self.conns.remove(&id) else {
            return;
        };
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

    fn on_resend_timer(&mut self, now: Instant, id: CommId) {
        let guid = self.cfg.local_ca_guid;
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        if let Some(p) = c.pending.as_mut() {
            if p.retries_left > 0 {
                p.retries_left -= 1;
                let (mad, timeout) = (p.mad.clone(), p.timeout);
                self.io.stats.retransmits += 1;
                self.io.resend_conn(c, mad);
                self.io.arm(id, c, now + timeout, TimerKind::Resend);
                return;
            }
        }
        c.pending = None;
        // Retries exhausted.
        match c.state {
            State::ReqSent | State::MraReqRcvd => {
                self.io.stats.timeouts += 1;
                let msg = rej(
                    id,
                    c.remote_id,
                    MsgKind::Other,
                    RejReason::Timeout,
                    &guid.0.to_be_bytes(),
                    &[],
                );
                self.io.send_conn(c, msg);
                self.io.close(id, c, ConnectionError::TimedOut);
                self.remove(id);
            }
            State::RepSent | State::MraRepRcvd => {
                self.io.stats.timeouts += 1;
                let msg = rej(
                    id,
                    c.remote_id,
                    MsgKind::Other,
                    RejReason::Timeout,
                    &guid.0.to_be_bytes(),
                    &[],
                );
                self.io.send_conn(c, msg);
                self.io.close(id, c, ConnectionError::TimedOut);
                self.remove(id);
            }
            State::DreqSent => {
                self.io.close(id, c, ConnectionError::DisconnectTimedOut);
                self.enter_timewait(now, id);
            }
            State::Established if matches!(c.lap, LapState::LapSent | LapState::MraLapRcvd) => {
                c.lap = LapState::Idle;
                self.io.event(id, EventKind::LapTimedOut);
            }
            _ => {}
        }
    }

    fn on_sidr_timer(&mut self, now: Instant, rid: RequestId, t: Instant) {
        let Some(s) = self.sidr_out.get_mut(&rid) else {
            return;
        };
        if s.timer != Some(t) {
            return;
        }
        let Some(&peer) = self.sidr_out_peer.get(&rid) else {
            return;
        };
        if s.pending.retries_left > 0 {
            s.pending.retries_left -= 1;
            let at = now + s.pending.timeout;
            s.timer = Some(at);
            let mad = s.pending.mad.clone();
            self.io.stats.retransmits += 1;
            self.io.resend(peer, mad);
            self.io.timers.insert((at, rid.0, TimerKind::Sidr));
        } else {
            self.sidr_out.remove(&rid);
            self.sidr_out_peer.remove(&rid);
            self.io.stats.timeouts += 1;
            self.io.event(CommId(rid.0), EventKind::SidrTimedOut);
        }
    }

    // ---------------------------------------------------------------------------------------
    // Input

    /// Handles one received MAD (256 bytes; the transport removed BTH/DETH/ICRC). Never fails:
    /// malformed, unexpected and spoofed MADs are counted in [`Stats`] and dropped, or
    /// answered as spec/cm-wire.md §4.6 says.
    pub fn handle_datagram(&mut self, now: Instant, from: PeerAddr, data: &[u8]) {
        self.io.stats.rx += 1;
        let mad = match Mad::parse(data) {
            Ok(m) => m,
            Err(e) => {
                debug!(%from, error = %e, "malformed MAD dropped");
                self.io.stats.drop(DropReason::Malformed);
                return;
            }
        };
        trace!(%from, msg = %mad.msg, "recv");
        let tid = mad.header.tid;
        match mad.msg {
            CmMessage::Req(m) => self.on_req(now, from, tid, m),
            CmMessage::Mra(m) => self.on_mra(now, m),
            CmMessage::Rej(m) => self.on_rej(now, m),
            CmMessage::Rep(m) => self.on_rep(now, from, m),
            CmMessage::Rtu(m) => self.on_rtu(m),
            CmMessage::Dreq(m) => self.on_dreq(now, from, tid, m),
            CmMessage::Drep(m) => self.on_drep(now, m),
            CmMessage::SidrReq(m) => self.on_sidr_req(from, tid, m),
            CmMessage::SidrRep(m) => self.on_sidr_rep(m),
            CmMessage::Lap(m) => self.on_lap(m),
            CmMessage::Apr(m) => self.on_apr(m),
            CmMessage::ClassPortInfo(_) | CmMessage::Unknown { .. } => {
                self.io.stats.drop(DropReason::Unsupported);
            }
        }
    }

    /// Finds the connection a reply is for: our local ID in `remote_comm_id`, and their ID
    /// either matching or (for answers to a REQ) not known yet.
    fn lookup(&mut self, ours: CommId, theirs: CommId, allow_unset: bool) -> Option<CommId> {
        let Some(c) = self.conns.get(&ours) else {
            self.io.stats.drop(DropReason::UnknownCommId);
            return None;
        };
        if c.remote_id == theirs || (allow_unset && c.remote_id == CommId(0)) {
            Some(ours)
        } else {
            self.io.stats.drop(DropReason::MismatchedCommId);
            None
        }
    }

    fn on_req(&mut self, now: Instant, from: PeerAddr, tid: Tid, req: Req) {
        // Duplicate?
        if let Some(&id) = self.by_remote.get(&(req.local_comm_id, req.local_ca_guid)) {
            let mra_dup = self.cfg.mra_on_duplicate_req;
            let Some(c) = self.conns.get_mut(&id) else {
                return;
            };
            match c.state {
                State::ReqRcvd => match mra_dup {
                    Some(st) => {
                        self.io.stats.duplicate_replies += 1;
                        Self::send_mra(&mut self.io, id, c, MsgKind::Req, st, &[]);
                    }
                    None => self.io.stats.drop(DropReason::Duplicate),
                },
                State::MraReqSent => {
                    if let Some(mra) = c.extra.as_ref().and_then(|x| x.mra.clone()) {
                        self.io.stats.duplicate_replies += 1;
                        self.io.resend_conn(c, mra);
                    }
                }
                _ => self.io.stats.drop(DropReason::Duplicate),
            }
            return;
        }
        // Stale: the remote QPN already belongs to a live connection from that CA. XRC is
        // exempt: INI and TGT QPs are shared by design, so (QPN, CA GUID) is no connection
        // key there (Linux applies the check anyway; spec/cm-wire.md §7.4).
        let xrc = req.transport() == ReqTransport::Xrc;
        let stale = if xrc {
            None
        } else {
            self.by_qpn
                .get(&(req.local_qpn, req.local_ca_guid))
                .copied()
        };
        if let Some(old) = stale {
            self.io.stats.stale += 1;
            let msg = rej(
                CommId(0),
                req.local_comm_id,
                MsgKind::Req,
                RejReason::StaleConn,
                &[],
                &[],
            );
            self.io.send(from, tid, msg);
            self.stale_old(now, old);
            return;
        }
        let Some(opts) = self.listeners.get(&req.service_id) else {
            debug!(sid = %req.service_id, "REQ for a service nobody listens on: REJ 8");
            let msg = rej(
                CommId(0),
                req.local_comm_id,
                MsgKind::Req,
                RejReason::InvalidServiceId,
                &[],
                &[],
            );
            self.io.send(from, tid, msg);
            return;
        };
        if !opts.transports.is_empty() && !opts.transports.contains(&req.transport()) {
            let msg = rej(
                CommId(0),
                req.local_comm_id,
                MsgKind::Req,
                RejReason::ConsumerReject,
                &[],
                &[],
            );
            self.io.send(from, tid, msg);
            return;
        }
        if self.io.half_open >= self.cfg.max_half_open {
            self.io.stats.half_open_limit += 1;
            let msg = rej(
                CommId(0),
                req.local_comm_id,
                MsgKind::Req,
                RejReason::NoResources,
                &[],
                &[],
            );
            self.io.send(from, tid, msg);
            return;
        }
        let id = self.alloc_id();
        let mut conn = Conn {
            state: State::Idle,
            lap: LapState::Uninit,
            side: Side::Passive,
            transport: req.transport(),
            closed: false,
            auto_rtu: false,
            holds_qpn: false,
            remote_id: req.local_comm_id,
            local_qpn: Qpn::default(),
            remote_qpn: req.local_qpn,
            remote_ca_guid: req.local_ca_guid,
            peer: self.io.peers.intern(from),
            tid,
            request_timeout: Micros::from_duration(req.local_cm_response_timeout.to_duration()),
            max_retries: req.max_cm_retries.get(),
            packet_life_time: TimeoutExp::masked(
                req.primary_path.local_ack_timeout.get().saturating_sub(1),
            ),
            timewait: Micros::from_duration(req.primary_path.local_ack_timeout.to_duration()),
            timer: None,
            pending: None,
            extra: None,
        };
        self.io.set_state(&mut conn, State::ReqRcvd);
        self.by_remote
            .insert((req.local_comm_id, req.local_ca_guid), id);
        if !xrc {
            self.by_qpn.insert((req.local_qpn, req.local_ca_guid), id);
        }
        self.conns.insert(id, conn);
        let cma_header = req
            .service_id
            .rdma_cm_port()
            .and_then(|_| CmaHeader::parse(req.private_data.as_bytes()).ok());
        debug!(conn = %id, %from, sid = %req.service_id, "REQ received");
        self.io.event(
            id,
            EventKind::ReqReceived(Box::new(IncomingRequest {
                peer: from,
                req,
                cma_header,
            })),
        );
    }

    /// A new connection reused the QPN of `old`: `old` is stale. Linux sends it a DREQ when
    /// it was established (spec/cm-wire.md §4.6).
    fn stale_old(&mut self, now: Instant, old: CommId) {
        let Some(c) = self.conns.get_mut(&old) else {
            return;
        };
        match c.state {
            State::Established => {
                let dreq = Dreq {
                    local_comm_id: old,
                    remote_comm_id: c.remote_id,
                    remote_qpn_eecn: c.remote_qpn,
                    private_data: PrivateData::zeroed(),
                };
                self.io.close(old, c, ConnectionError::Stale);
                self.io.set_state(c, State::DreqSent);
                let (timeout, retries) = (c.request_timeout.get(), c.max_retries);
                self.io
                    .send_request(now, old, c, CmMessage::Dreq(dreq), timeout, retries);
                // The old connection must not match the new REQ's QPN any more.
                let key = (c.remote_qpn, c.remote_ca_guid);
                if self.by_qpn.get(&key) == Some(&old) {
                    self.by_qpn.remove(&key);
                }
            }
            s if s.is_setup() => {
                self.io.close(old, c, ConnectionError::Stale);
                self.enter_timewait(now, old);
            }
            _ => {}
        }
    }

    fn on_mra(&mut self, now: Instant, m: Mra) {
        let allow_unset = m.message_mraed == MsgKind::Req;
        let Some(id) = self.lookup(m.remote_comm_id, m.local_comm_id, allow_unset) else {
            return;
        };
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        let next = match (m.message_mraed, c.state, c.lap) {
            (MsgKind::Req, State::ReqSent, _) => Some(State::MraReqRcvd),
            (MsgKind::Rep, State::RepSent, _) => Some(State::MraRepRcvd),
            (MsgKind::Other, State::Established, LapState::LapSent) => None,
            _ => {
                self.io.stats.drop(DropReason::WrongState);
                return;
            }
        };
        self.io.stats.mra_received += 1;
        match next {
            Some(s) => self.io.set_state(c, s),
            None => c.lap = LapState::MraLapRcvd,
        }
        let wait = m.service_timeout.to_duration() + c.packet_life_time.to_duration();
        if c.pending.is_some() {
            self.io.arm(id, c, now + wait, TimerKind::Resend);
        }
        self.io.event(
            id,
            EventKind::MraReceived {
                service_timeout: m.service_timeout,
            },
        );
    }

    fn on_rej(&mut self, now: Instant, m: Rej) {
        let id = if m.reason == RejReason::Timeout {
            // Matched by (ARI = the rejecting CA's GUID, their comm ID).
            match m
                .timeout_ca_guid()
                .and_then(|g| self.by_remote.get(&(m.local_comm_id, g)).copied())
            {
                Some(id) => id,
                None => match self.lookup(m.remote_comm_id, m.local_comm_id, true) {
                    Some(id) => id,
                    None => return,
                },
            }
        } else {
            let allow_unset = m.message_rejected == MsgKind::Req;
            match self.lookup(m.remote_comm_id, m.local_comm_id, allow_unset) {
                Some(id) => id,
                None => return,
            }
        };
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        let err = if m.reason == RejReason::StaleConn {
            self.io.stats.stale += 1;
            ConnectionError::Stale
        } else {
            ConnectionError::Rejected {
                reason: m.reason,
                ari: m.ari_bytes().to_vec(),
                private_data: trimmed(m.private_data.as_bytes()),
            }
        };
        let stale = m.reason == RejReason::StaleConn;
        let timewait = match c.state {
            State::ReqSent | State::MraReqRcvd => stale,
            State::RepSent | State::MraRepRcvd => stale,
            State::ReqRcvd | State::MraReqSent => stale,
            State::RepRcvd | State::MraRepSent => true,
            State::Established => true,
            State::DreqSent | State::DreqRcvd => true,
            State::Timewait | State::Idle => {
                self.io.stats.drop(DropReason::WrongState);
                return;
            }
        };
        self.io.stats.rej_received += 1;
        self.io.cancel_request(id, c);
        self.io.close(id, c, err);
        if timewait {
            self.enter_timewait(now, id);
        } else {
            self.remove(id);
        }
    }

    fn on_rep(&mut self, now: Instant, from: PeerAddr, m: Rep) {
        let Some(c) = self.conns.get(&m.remote_comm_id) else {
            self.io.stats.drop(DropReason::UnknownCommId);
            return;
        };
        let id = m.remote_comm_id;
        // A duplicate of the REP we already took.
        if c.remote_id == m.local_comm_id && c.remote_id != CommId(0) {
            self.on_dup_rep(id);
            return;
        }
        if c.remote_id != CommId(0) || !matches!(c.state, State::ReqSent | State::MraReqRcvd) {
            self.io.stats.drop(DropReason::MismatchedCommId);
            return;
        }
        if self.io.peers.addr(c.peer) != from {
            self.io.stats.drop(DropReason::WrongPeer);
            return;
        }
        if self
            .by_remote
            .contains_key(&(m.local_comm_id, m.local_ca_guid))
        {
            self.io.stats.drop(DropReason::Duplicate);
            return;
        }
        let xrc = c.transport == ReqTransport::Xrc;
        let remote_qpn = m.remote_qpn_for(xrc);
        let stale = if xrc {
            None // shared TGT QPs: see on_req
        } else {
            self.by_qpn.get(&(remote_qpn, m.local_ca_guid)).copied()
        };
        if let Some(old) = stale {
            // Their QPN belongs to another live connection: REJ 10 and drop the old one.
            self.io.stats.stale += 1;
            let msg = rej(
                id,
                m.local_comm_id,
                MsgKind::Rep,
                RejReason::StaleConn,
                &[],
                &[],
            );
            let (peer, tid) = (self.io.peers.addr(c.peer), c.tid);
            self.io.send(peer, tid, msg);
            self.stale_old(now, old);
            if let Some(c) = self.conns.get_mut(&id) {
                self.io.cancel_request(id, c);
                self.io.close(id, c, ConnectionError::Stale);
            }
            self.enter_timewait(now, id);
            return;
        }
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        self.io.cancel_request(id, c);
        c.remote_id = m.local_comm_id;
        c.remote_ca_guid = m.local_ca_guid;
        c.remote_qpn = remote_qpn;
        let ack = cm_ack_timeout(m.target_ack_delay.get(), c.packet_life_time.get());
        c.timewait = Micros::from_duration(TimeoutExp::masked(ack).to_duration());
        self.io.set_state(c, State::RepRcvd);
        let manual = !c.auto_rtu;
        self.by_remote
            .insert((m.local_comm_id, m.local_ca_guid), id);
        if !xrc {
            self.by_qpn.insert((remote_qpn, m.local_ca_guid), id);
        }
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        self.io.event(
            id,
            EventKind::RepReceived(Box::new(RepInfo { rep: m, remote_qpn })),
        );
        if !manual {
            Self::send_rtu(&mut self.io, id, c, &[]);
        }
    }

    fn on_dup_rep(&mut self, id: CommId) {
        let mra_dup = self.cfg.mra_on_duplicate_rep;
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        match c.state {
            State::Established => {
                // Our RTU was lost: build it again.
                let pd = c
                    .extra
                    .as_ref()
                    .and_then(|x| x.rtu_private_data.clone())
                    .unwrap_or_default();
                let rtu = Rtu {
                    local_comm_id: id,
                    remote_comm_id: c.remote_id,
                    private_data: PrivateData::from_slice(&pd).unwrap_or_default(),
                };
                self.io.stats.duplicate_replies += 1;
                self.io.send_conn(c, CmMessage::Rtu(rtu));
            }
            State::MraRepSent => {
                if let Some(mra) = c.extra.as_ref().and_then(|x| x.mra.clone()) {
                    self.io.stats.duplicate_replies += 1;
                    self.io.resend_conn(c, mra);
                }
            }
            State::RepRcvd => match mra_dup {
                Some(st) => {
                    self.io.stats.duplicate_replies += 1;
                    Self::send_mra(&mut self.io, id, c, MsgKind::Rep, st, &[]);
                }
                None => self.io.stats.drop(DropReason::Duplicate),
            },
            _ => self.io.stats.drop(DropReason::Duplicate),
        }
    }

    fn on_rtu(&mut self, m: Rtu) {
        let Some(id) = self.lookup(m.remote_comm_id, m.local_comm_id, false) else {
            return;
        };
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        if !matches!(c.state, State::RepSent | State::MraRepRcvd) {
            self.io.stats.drop(DropReason::Duplicate);
            return;
        }
        self.io.cancel_request(id, c);
        self.io.set_state(c, State::Established);
        self.io.event(id, EventKind::Established);
    }

    fn on_dreq(&mut self, now: Instant, from: PeerAddr, tid: Tid, m: Dreq) {
        let found = self
            .conns
            .get(&m.remote_comm_id)
            .filter(|c| c.remote_id == m.local_comm_id)
            .map(|c| (c.state, c.local_qpn));
        let Some((state, local_qpn)) = found else {
            // Unknown: answer anyway (orphan DREP, IDs swapped, same TID).
            self.io.stats.orphan_dreps += 1;
            let drep = Drep {
                local_comm_id: m.remote_comm_id,
                remote_comm_id: m.local_comm_id,
                private_data: PrivateData::zeroed(),
            };
            self.io.send(from, tid, CmMessage::Drep(drep));
            return;
        };
        let id = m.remote_comm_id;
        if state != State::Timewait && m.remote_qpn_eecn != local_qpn {
            self.io.stats.drop(DropReason::QpnMismatch);
            return;
        }
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        let drep = CmMessage::Drep(Drep {
            local_comm_id: id,
            remote_comm_id: c.remote_id,
            private_data: PrivateData::zeroed(),
        });
        match c.state {
            State::Established | State::RepSent | State::MraRepRcvd | State::DreqSent => {
                self.io.cancel_request(id, c);
                self.io.set_state(c, State::DreqRcvd);
                self.io.close(
                    id,
                    c,
                    ConnectionError::Disconnected {
                        by_peer: true,
                        private_data: trimmed(m.private_data.as_bytes()),
                    },
                );
                // Reply with the DREQ's TID.
                let to = self.io.peers.addr(c.peer);
                self.io.send(to, tid, drep);
                self.enter_timewait(now, id);
            }
            State::Timewait => {
                self.io.stats.duplicate_replies += 1;
                self.io.send(from, tid, drep);
            }
            _ => self.io.stats.drop(DropReason::WrongState),
        }
    }

    fn on_drep(&mut self, now: Instant, m: Drep) {
        let Some(id) = self.lookup(m.remote_comm_id, m.local_comm_id, false) else {
            return;
        };
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        if !matches!(c.state, State::DreqSent | State::DreqRcvd) {
            self.io.stats.drop(DropReason::WrongState);
            return;
        }
        self.io.cancel_request(id, c);
        let err = ConnectionError::Disconnected {
            by_peer: false,
            private_data: Vec::new(),
        };
        self.io.close(id, c, err);
        self.enter_timewait(now, id);
    }

    fn on_sidr_req(&mut self, from: PeerAddr, tid: Tid, m: SidrReq) {
        if self.sidr_in_keys.contains(&(m.request_id, from)) {
            self.io.stats.drop(DropReason::Duplicate);
            return;
        }
        if !self.listeners.contains_key(&m.service_id) {
            let rep = SidrRep {
                request_id: m.request_id,
                status: SidrStatus::UnsupportedServiceId,
                service_id: m.service_id,
                ..SidrRep::default()
            };
            self.io.send(from, tid, CmMessage::SidrRep(rep));
            return;
        }
        let id = self.alloc_id();
        self.sidr_in.insert(
            id,
            SidrIn {
                peer: from,
                request_id: m.request_id,
                service_id: m.service_id,
                tid,
            },
        );
        self.sidr_in_keys.insert((m.request_id, from));
        self.io.event(
            id,
            EventKind::SidrReqReceived(Box::new(IncomingSidr {
                peer: from,
                request_id: m.request_id,
                service_id: m.service_id,
                private_data: m.private_data.as_bytes().to_vec(),
            })),
        );
    }

    fn on_sidr_rep(&mut self, m: SidrRep) {
        let Some(s) = self.sidr_out.remove(&m.request_id) else {
            self.io.stats.drop(DropReason::UnknownSidr);
            return;
        };
        if let Some(t) = s.timer {
            self.io.timers.remove(&(t, m.request_id.0, TimerKind::Sidr));
        }
        self.sidr_out_peer.remove(&m.request_id);
        self.io.event(
            CommId(m.request_id.0),
            EventKind::SidrReply {
                status: m.status,
                qpn: m.qpn,
                qkey: m.qkey,
                private_data: trimmed(m.private_data.as_bytes()),
            },
        );
    }

    fn on_lap(&mut self, m: Lap) {
        let Some(id) = self.lookup(m.remote_comm_id, m.local_comm_id, false) else {
            return;
        };
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        if c.state != State::Established {
            self.io.stats.drop(DropReason::WrongState);
            return;
        }
        match c.lap {
            LapState::Uninit | LapState::Idle => {
                c.lap = LapState::LapRcvd;
                self.io.event(
                    id,
                    EventKind::LapReceived {
                        path: m.alternate_path,
                        private_data: trimmed(m.private_data.as_bytes()),
                    },
                );
            }
            LapState::MraLapSent => {
                if let Some(mra) = c.extra.as_ref().and_then(|x| x.mra.clone()) {
                    self.io.stats.duplicate_replies += 1;
                    self.io.resend_conn(c, mra);
                }
            }
            _ => self.io.stats.drop(DropReason::Duplicate),
        }
    }

    fn on_apr(&mut self, m: Apr) {
        let Some(id) = self.lookup(m.remote_comm_id, m.local_comm_id, false) else {
            return;
        };
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        if !matches!(c.lap, LapState::LapSent | LapState::MraLapRcvd) {
            self.io.stats.drop(DropReason::WrongState);
            return;
        }
        self.io.cancel_request(id, c);
        c.lap = LapState::Idle;
        self.io.event(
            id,
            EventKind::AprReceived {
                status: m.ap_status,
                additional_info: m.additional_info_bytes().to_vec(),
                private_data: trimmed(m.private_data.as_bytes()),
            },
        );
    }

    /// Draws a random 24-bit PSN from the endpoint's RNG (for callers that want Linux-like
    /// random starting PSNs).
    pub fn random_psn(&mut self) -> ibcm_mad::Psn {
        ibcm_mad::Psn::masked(self.rng.random::<u32>())
    }
}

#[cfg(test)]
mod size_tests {
    use super::*;

    /// The per-connection record is what `cm-bench scale` pays for a million connections
    /// (≤ 512 B per connection including the indexes); keep it from growing unnoticed.
    #[test]
    fn conn_is_small() {
        assert!(
            core::mem::size_of::<Conn>() <= 152,
            "{}",
            core::mem::size_of::<Conn>()
        );
    }
}
