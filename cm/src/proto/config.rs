//! Long-lived configuration ([`EndpointConfig`]) and per-call parameters (`*Params`).

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use ibcm_mad::cma::{CmaHeader, PortSpace};
use ibcm_mad::{
    FailoverAccepted, Gid, Guid, Lid, Mtu, PathInfo, Pkey, Psn, Qkey, Qpn, Rep, Req, ReqTransport,
    ServiceId, SidrStatus, TimeoutExp, U3, U4,
};

use super::PeerAddr;

/// Settings of an [`Endpoint`](super::Endpoint).
#[derive(Debug, Clone)]
pub struct EndpointConfig {
    /// This CA's GUID: sent as Local CA GUID, and (with the remote QPN) the peer's
    /// stale-connection key.
    pub local_ca_guid: Guid,
    /// This port's GID, used as Local Port GID of the primary path when a connect call gives
    /// no explicit path.
    pub local_gid: Gid,
    /// Seed of the endpoint's RNG (comm-ID operand, PSNs). `None` draws it from the OS.
    pub rng_seed: Option<u64>,
    /// High 32 bits of the TIDs this endpoint makes (Linux: the MAD agent's `hi_tid`).
    pub hi_tid: u32,
    /// Cap on passive connections not yet established (REQ received … RTU), so a REQ flood
    /// cannot grow memory without bound. A REQ that finds it reached evicts the oldest
    /// half-open entry (docs/protocol.md §5.2). Default 4096.
    pub max_half_open: usize,
    /// Sub-cap per source (IP address or GID, any port): a REQ from a source holding this
    /// many half-open entries is answered with REJ 3 "no resources" (it cannot evict others'
    /// entries). Default 1024: a host opening a thousand connections at once still gets in,
    /// four flooding hosts cannot fill `max_half_open` alone.
    pub max_half_open_per_source: usize,
    /// Sub-cap per service ID: a REQ for a service holding this many half-open entries evicts
    /// that service's oldest entry. Default 3072 (three quarters of `max_half_open`), so a
    /// flood of one service leaves room for the others.
    pub max_half_open_per_service: usize,
    /// The longest a half-open entry lives, from its REQ until established, whatever the REQ's
    /// timeouts and retries ask for; then it is given up as if its retries ran out (REJ 4).
    /// Default 90 s: the whole REP schedule Linux rdma_cm asks for (16 × 4.3 s ≈ 69 s, CM
    /// response timeout 20, 15 retries) plus 20 s for the application to decide.
    pub max_half_open_lifetime: Duration,
    /// Floor of the Local CM Response Timeout honoured from a REQ (our REP retransmission
    /// interval). Default 8 (≈ 1 ms, the least Linux waits: `cm_convert_to_ms`).
    pub min_peer_cm_response_timeout: TimeoutExp,
    /// Ceiling of the Local CM Response Timeout honoured from a REQ. Default 22 (≈ 17 s); Linux
    /// rdma_cm sends 20 (`CMA_CM_RESPONSE_TIMEOUT`).
    pub max_peer_cm_response_timeout: TimeoutExp,
    /// Floor of the Max CM Retries honoured from a REQ (REP retransmissions). Default 0.
    pub min_peer_cm_retries: u8,
    /// Ceiling of the Max CM Retries honoured from a REQ. Default 15 (the field's maximum;
    /// Linux rdma_cm sends 15, `CMA_MAX_CM_RETRIES`); `max_half_open_lifetime` bounds the
    /// total.
    pub max_peer_cm_retries: u8,
    /// Ceiling of a TimeWait derived from the peer's path values (ACK timeout; not applied to
    /// an explicit [`timewait`](Self::timewait)). Default 60 s; Linux's usual TimeWait
    /// (ACK timeout 19) is ≈ 2 s, but a REQ may ask for up to 2.4 h.
    pub max_timewait: Duration,
    /// Cap on connections from ESTABLISHED until TimeWait plus half-open ones; a REQ beyond
    /// it is answered with REJ 3 "no resources". Default 2²⁰ (1 048 576).
    pub max_established: usize,
    /// The same per source (IP address or GID, any port). Default 65 536.
    pub max_established_per_peer: usize,
    /// When a REQ is received again while the application still decides, answer with an MRA
    /// of this service timeout (Linux rdma_cm does the same with 24). `None` ignores the
    /// duplicate.
    pub mra_on_duplicate_req: Option<TimeoutExp>,
    /// When a REP is received again before the application sent its RTU, answer with an MRA
    /// of this service timeout. `None` ignores the duplicate.
    pub mra_on_duplicate_rep: Option<TimeoutExp>,
    /// Overrides the TimeWait duration (by default: the connection's local ACK timeout, as in
    /// Linux; docs/protocol.md §4.4).
    pub timewait: Option<Duration>,
    /// Added to every TimeWait, so that a late retransmission of the peer still finds the
    /// connection (default 0).
    pub timewait_slack: Duration,
    /// How long an incoming SIDR_REQ waits for [`Endpoint::sidr_reply`](super::Endpoint::sidr_reply)
    /// before it is forgotten ([`EventKind::SidrReqExpired`](super::EventKind::SidrReqExpired)).
    /// Default 65.536 s: rdma_cm's whole SIDR schedule (16 attempts of 4096 ms), after which
    /// the requester has given up anyway.
    pub sidr_in_lifetime: Duration,
    /// Cap on incoming SIDR_REQs waiting for the application. A new one beyond it evicts the
    /// oldest (which expires at once). Default 1024.
    pub max_sidr_in: usize,
    /// Half-open pressure at which the stateless mode starts (docs/protocol.md §5.12): a REQ
    /// for a listener with a [`StatelessAccept`](super::StatelessAccept) template
    /// ([`Endpoint::set_stateless`](super::Endpoint::set_stateless)) that finds this many
    /// half-open entries or more is answered with a cookie REP and creates none. Default 1024
    /// (a quarter of `max_half_open`: a burst of legitimate connects stays stateful, a flood
    /// switches long before eviction starts).
    pub stateless_threshold: usize,
    /// Answer every REQ of a listener with a stateless template statelessly, whatever the
    /// pressure (tests, or a listener that wants it always). Default `false`.
    pub stateless_always: bool,
    /// Slots of the table of REQs answered statelessly (rounded up to a power of two; each
    /// holds one REQ as received, 288 bytes, so 65 536 slots are ~19 MB, allocated when
    /// the first stateless REP goes out), in sets of 8: a REQ whose set is full of unanswered
    /// REQs in time replaces the oldest, whose RTU then finds nothing (docs/protocol.md
    /// §5.12). Default 65 536.
    pub stateless_slots: usize,
    /// Length of a cookie time slot: a cookie is valid in the slot it was made in and the
    /// next one (between one and two periods), then its RTU is dropped as expired. Default
    /// 8 s (longer than the kernel's REQ retry interval with rdma_cm's values, ≈ 6.4 s, so a
    /// REQ repeated after a lost REP still gets the same REP).
    pub stateless_period: Duration,
    /// A stateless answer's one REP retransmission, this long after the REP if no RTU came
    /// (`None`: none). It recovers a lost REP before the peer repeats its REQ, and a lost RTU,
    /// which nothing else would: a peer already ESTABLISHED answers the repeated REP with its
    /// RTU again. Two REPs per REQ at most (2×, within the 3× of anti-amplification).
    /// Default 500 ms (docs/protocol.md §5.12).
    pub stateless_resend: Option<Duration>,
    /// Give the connection table's large allocations (4 MiB and more: the records' from 65 537
    /// connections on, the indexes' from a few hundred thousand) mappings of their own backed
    /// by transparent huge pages (`madvise(MADV_HUGEPAGE)`), which cuts the TLB misses of the
    /// lookups in a large table. Default `true`. Linux honours it when THP is `always` or
    /// `madvise` (its default). With the kernel's default `defrag` setting a page fault in
    /// such a table may compact memory to find a huge page, so `false` suits an application
    /// for which a rare stall of that kind is worse than slower lookups (docs/protocol.md
    /// §5.13).
    pub huge_pages: bool,
}

impl Default for EndpointConfig {
    fn default() -> Self {
        EndpointConfig {
            local_ca_guid: Guid(0x0002_c903_0000_0001),
            local_gid: Gid::ZERO,
            rng_seed: None,
            hi_tid: 1,
            max_half_open: 4096,
            max_half_open_per_source: 1024,
            max_half_open_per_service: 3072,
            max_half_open_lifetime: Duration::from_secs(90),
            min_peer_cm_response_timeout: TimeoutExp::masked(8),
            max_peer_cm_response_timeout: TimeoutExp::masked(22),
            min_peer_cm_retries: 0,
            max_peer_cm_retries: 15,
            max_timewait: Duration::from_secs(60),
            max_established: 1 << 20,
            max_established_per_peer: 65_536,
            mra_on_duplicate_req: TimeoutExp::new(20),
            mra_on_duplicate_rep: TimeoutExp::new(20),
            timewait: None,
            timewait_slack: Duration::ZERO,
            sidr_in_lifetime: Duration::from_millis(65_536),
            max_sidr_in: 1024,
            stateless_threshold: 1024,
            stateless_always: false,
            stateless_slots: 65_536,
            stateless_period: Duration::from_secs(8),
            stateless_resend: Some(Duration::from_millis(500)),
            huge_pages: true,
        }
    }
}

/// What a REQ asks for: everything an active side chooses.
///
/// Construct with [`ConnectParams::new`] (IB CM service ID) or [`ConnectParams::rdma_cm`] (a
/// Linux rdma_cm listener's IP address and port), then adjust the public fields.
#[derive(Debug, Clone)]
pub struct ConnectParams {
    /// Where the peer's CM is.
    pub peer: PeerAddr,
    /// Service ID to connect to.
    pub service_id: ServiceId,
    /// RC, UC or XRC (this side is then an XRC INI).
    pub transport: ReqTransport,
    /// The local QP (for XRC: the INI QP).
    pub local_qpn: Qpn,
    /// The PSN the local QP expects to receive first. `None` (the default): the endpoint
    /// draws a random one from its RNG, as rdma_cm does (`get_random_u32`), so that an
    /// off-path peer cannot guess where the sequence starts; the REQ as sent
    /// ([`Endpoint::connect_sent`](super::Endpoint::connect_sent),
    /// `PendingConnection::req` in the runtime) tells the application which, for its QP.
    pub starting_psn: Option<Psn>,
    /// rdma_cm IP header to put in front of the private data (see [`ConnectParams::rdma_cm`]).
    pub cma_header: Option<CmaHeader>,
    /// Private data: at most 92 bytes, or 56 after a CMA header.
    pub private_data: Vec<u8>,
    /// Primary path; `None` derives a RoCE path from the endpoint's GID and the peer address.
    pub primary_path: Option<PathInfo>,
    /// Alternate path, sent in the REQ (`None`: none, an all-zero path on the wire). Written
    /// like the primary path, from this side's view; both QPs load it at RTR
    /// ([`qp_attr`](crate::qp_attr), native IB). One can also be loaded later, on the
    /// established connection, with a LAP.
    pub alternate_path: Option<PathInfo>,
    /// P_Key.
    pub pkey: Pkey,
    /// Path MTU.
    pub path_mtu: Mtu,
    /// RDMA read/atomic responder resources offered.
    pub responder_resources: u8,
    /// RDMA read/atomic initiator depth wanted.
    pub initiator_depth: u8,
    /// How long the peer may take to answer (REQ Remote CM Response Timeout).
    pub remote_cm_response_timeout: TimeoutExp,
    /// How long this side may take to answer the REP (REQ Local CM Response Timeout).
    pub local_cm_response_timeout: TimeoutExp,
    /// Retransmissions of the REQ (and the peer's REP) before giving up.
    pub max_cm_retries: U4,
    /// Transport retry count.
    pub retry_count: U3,
    /// RNR retry count (7 = infinite).
    pub rnr_retry_count: U3,
    /// End-to-end flow control.
    pub flow_control: bool,
    /// The local QP uses an SRQ.
    pub srq: bool,
    /// Packet life time of the path: the REQ timeout is 2 × this + the remote CM response
    /// timeout (docs/protocol.md §4.3).
    pub packet_life_time: TimeoutExp,
    /// Send the RTU as soon as the REP arrives (default). When `false` the application gets
    /// [`EventKind::RepReceived`](super::EventKind::RepReceived) and calls
    /// [`Endpoint::establish`](super::Endpoint::establish) itself, after moving its QP to
    /// RTR/RTS.
    pub auto_rtu: bool,
    /// Allow a local QPN that another live connection of this endpoint already uses (an XRC
    /// INI QP shared by several connections). The peer sees (QPN, CA GUID) as the
    /// stale-connection key, so it will reject the second one with REJ 10 unless it is this
    /// CM (docs/interop.md §7.4).
    pub allow_shared_qpn: bool,
    /// How long to wait for the peer's first answer (REP, MRA or REJ) before giving up with
    /// `ConnectionError::TimedOut` (and a REJ 4 "timeout" to the peer, as when the retries
    /// run out). `None`: only the retries bound the wait. Default
    /// [`DEFAULT_CONNECT_TIMEOUT`] (10 s).
    ///
    /// Without it the REQ schedule alone decides: the REQ timeout is 2 × packet life time +
    /// the remote CM response timeout, and it is sent `max_cm_retries` + 1 times (the
    /// kernel's `ib_cm` schedule, `drivers/infiniband/core/cm.c`). With rdma_cm's values
    /// (`drivers/infiniband/core/cma.c`: `CMA_CM_RESPONSE_TIMEOUT` 20, `CMA_MAX_CM_RETRIES`
    /// 15; on RoCE `CMA_IBOE_PACKET_LIFETIME` 16, 18 before Linux 5.10), which these
    /// parameters copy, a peer that never answers is given up after 16 × (4.3 s + 2 × 1.07 s)
    /// ≈ 103 s with packet life time 18, ≈ 77 s with 16. That is what `rdma_connect` does
    /// (its users add their own timer); ibcm bounds it by default instead, because a node
    /// that is down should not hold a caller for minutes. A peer that answers with an MRA
    /// has asked for its time: from then on the MRA's service timeout governs, not this.
    pub connect_timeout: Option<Duration>,
}

/// The default [`ConnectParams::connect_timeout`]: 10 s, two REQ retransmissions at the
/// default timeout of 4.3 s + 2 × 1.07 s (enough for a lost REQ and a lost REP).
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

impl ConnectParams {
    /// The REQ fields these parameters set, one place for the mapping: everything but the
    /// comm ID, CA GUID, start PSN, primary path and private data, which the endpoint (or
    /// whoever sends the REQ) fills in.
    pub(crate) fn req_fields(&self) -> Req {
        let mut req = Req {
            service_id: self.service_id,
            local_qpn: self.local_qpn,
            responder_resources: self.responder_resources,
            initiator_depth: self.initiator_depth,
            remote_cm_response_timeout: self.remote_cm_response_timeout,
            end_to_end_flow_control: self.flow_control,
            local_cm_response_timeout: self.local_cm_response_timeout,
            retry_count: self.retry_count,
            partition_key: self.pkey,
            path_mtu: self.path_mtu,
            rnr_retry_count: self.rnr_retry_count,
            max_cm_retries: self.max_cm_retries,
            srq: self.srq,
            alternate_path: self.alternate_path.unwrap_or_default(),
            ..Req::default()
        };
        req.set_transport(self.transport);
        req
    }

    /// Parameters for an IB CM connection to `service_id` at `peer`, with defaults close to
    /// Linux rdma_cm's (CM response timeouts 20, 15 retries, packet life time 18, RC, MTU
    /// 1024, retry counts 7).
    pub fn new(peer: impl Into<PeerAddr>, service_id: ServiceId, local_qpn: Qpn) -> Self {
        ConnectParams {
            peer: peer.into(),
            service_id,
            transport: ReqTransport::Rc,
            local_qpn,
            starting_psn: None,
            cma_header: None,
            private_data: Vec::new(),
            primary_path: None,
            alternate_path: None,
            pkey: Pkey::DEFAULT,
            path_mtu: Mtu::Mtu1024,
            responder_resources: 16,
            initiator_depth: 16,
            remote_cm_response_timeout: TimeoutExp::masked(20),
            local_cm_response_timeout: TimeoutExp::masked(20),
            max_cm_retries: U4::masked(15),
            retry_count: U3::masked(7),
            rnr_retry_count: U3::masked(7),
            flow_control: true,
            srq: false,
            packet_life_time: TimeoutExp::masked(18),
            auto_rtu: true,
            allow_shared_qpn: false,
            connect_timeout: Some(DEFAULT_CONNECT_TIMEOUT),
        }
    }

    /// Parameters to reach a Linux rdma_cm listener bound to `dst` from `src` (docs/wire.md
    /// §5.4): service ID `0x0106 << 16 | port` (`RDMA_PS_TCP`; `RDMA_PS_IB` for XRC) and the
    /// 36-byte CMA IP header in front of the private data. The CM's peer address is the
    /// destination IP with UDP port 4791.
    ///
    /// ```
    /// use ibcm::proto::ConnectParams;
    /// use ibcm_mad::{Qpn, ServiceId};
    /// let p = ConnectParams::rdma_cm(
    ///     "10.0.0.2:49152".parse().unwrap(),
    ///     "10.0.0.1:7174".parse().unwrap(),
    ///     Qpn::new(0x11).unwrap(),
    /// );
    /// assert_eq!(p.service_id, ServiceId(0x0106_1c06));
    /// assert!(p.cma_header.is_some());
    /// ```
    pub fn rdma_cm(src: SocketAddr, dst: SocketAddr, local_qpn: Qpn) -> Self {
        let peer = SocketAddr::new(dst.ip(), ibcm_mad::frame::ROCEV2_UDP_PORT);
        let mut p = Self::new(
            peer,
            ServiceId::rdma_cm(PortSpace::Tcp, dst.port()),
            local_qpn,
        );
        p.cma_header = Some(CmaHeader::new(src, dst.ip()));
        p
    }

    /// Makes this an XRC INI connection (transport fields as Linux's `cm_req_set_qp_type`).
    /// For an rdma_cm service ID the port space becomes `RDMA_PS_IB`, which XRC requires.
    pub fn xrc(mut self) -> Self {
        self.transport = ReqTransport::Xrc;
        if let Some((PortSpace::Tcp, port)) = self.service_id.rdma_cm_port() {
            self.service_id = ServiceId::rdma_cm(PortSpace::Ib, port);
        }
        self
    }

    /// The maximum private data length with the chosen header.
    pub fn max_private_data(&self) -> usize {
        if self.cma_header.is_some() {
            CmaHeader::REQ_USER_LEN
        } else {
            ibcm_mad::Req::PRIVATE_DATA_LEN
        }
    }
}

/// A RoCE primary path between two GIDs, as a Linux active side fills it in (docs/wire.md
/// §6.1): permissive LIDs, hop limit 64, flow label 0, rate "port current".
pub fn roce_path(local: Gid, remote: Gid, local_ack_timeout: TimeoutExp) -> PathInfo {
    PathInfo {
        local_lid: Lid::PERMISSIVE,
        remote_lid: Lid::PERMISSIVE,
        local_gid: local,
        remote_gid: remote,
        hop_limit: 64,
        local_ack_timeout,
        ..PathInfo::default()
    }
}

/// The GID of an IP address on RoCE (`::ffff:a.b.c.d` for IPv4).
pub fn gid_of(ip: IpAddr) -> Gid {
    Gid::from_ip(ip)
}

/// What the passive side puts in its REP.
#[derive(Debug, Clone)]
pub struct AcceptParams {
    /// The local QP (RC/UC). For an XRC target use [`AcceptParams::xrc_tgt_qpn`] instead.
    pub local_qpn: Qpn,
    /// XRC target: the TGT QPN, sent in the Local EECN field with SRQ = 1 and Local QPN 0.
    pub xrc_tgt_qpn: Option<Qpn>,
    /// XRC target only: the TGT QP named by `xrc_tgt_qpn` is a **live QP that outlives its
    /// connections** (an XRC TGT QP is shared, and a new connection may attach to it while an
    /// earlier one is still in TimeWait). The TimeWait quarantine check is then skipped for
    /// this accept: the number is not being reused by a new QP, the same QP is attached again.
    /// The caller vouches for that and keeps the numbers of *gone* TGT QPs out of use itself
    /// (ibcm-xrc's registry does). Default `false`: the quarantine applies as for RC.
    pub xrc_tgt_live: bool,
    /// The PSN the local QP expects to receive first.
    pub starting_psn: Psn,
    /// Private data, at most 196 bytes.
    pub private_data: Vec<u8>,
    /// Responder resources.
    pub responder_resources: u8,
    /// Initiator depth.
    pub initiator_depth: u8,
    /// Target ACK delay of the local CA.
    pub target_ack_delay: TimeoutExp,
    /// Failover accepted.
    pub failover_accepted: FailoverAccepted,
    /// End-to-end flow control.
    pub flow_control: bool,
    /// RNR retry count.
    pub rnr_retry_count: U3,
    /// The local QP uses an SRQ.
    pub srq: bool,
}

impl AcceptParams {
    /// The REP fields these parameters set (everything but the comm IDs, CA GUID, private
    /// data and XRC TGT QPN): what the passive side's QP attributes
    /// ([`qp_attr`](crate::qp_attr)) read before the REP is sent.
    pub fn rep_fields(&self) -> Rep {
        Rep {
            local_qpn: self.local_qpn,
            starting_psn: self.starting_psn,
            responder_resources: self.responder_resources,
            initiator_depth: self.initiator_depth,
            target_ack_delay: self.target_ack_delay,
            failover_accepted: self.failover_accepted,
            end_to_end_flow_control: self.flow_control,
            rnr_retry_count: self.rnr_retry_count,
            srq: self.srq,
            ..Rep::default()
        }
    }

    /// Accept onto `local_qpn` with defaults (responder resources / initiator depth 16, RNR
    /// retry 7, target ACK delay 15).
    pub fn new(local_qpn: Qpn) -> Self {
        AcceptParams {
            local_qpn,
            xrc_tgt_qpn: None,
            xrc_tgt_live: false,
            starting_psn: Psn::default(),
            private_data: Vec::new(),
            responder_resources: 16,
            initiator_depth: 16,
            target_ack_delay: TimeoutExp::masked(15),
            failover_accepted: FailoverAccepted::Accepted,
            flow_control: true,
            rnr_retry_count: U3::masked(7),
            srq: false,
        }
    }

    /// Accept an XRC REQ onto the TGT QP `tgt_qpn`.
    pub fn xrc_tgt(tgt_qpn: Qpn) -> Self {
        AcceptParams {
            xrc_tgt_qpn: Some(tgt_qpn),
            srq: true,
            ..Self::new(tgt_qpn)
        }
    }
}

/// A connection of an earlier life of this node's CM (a killed daemon's, read from its
/// journal) to end at its peer: [`Endpoint::end_stale`](super::Endpoint::end_stale) takes it
/// into the table in DREQ_SENT, and the ordinary DREQ timer retransmits the DREQ until the
/// DREP comes or the retries are over.
#[derive(Debug, Clone)]
pub struct StaleConnection {
    /// Our comm ID in the earlier life (the DREQ's Local Comm ID; the connection's ID here).
    pub local_comm_id: ibcm_mad::CommId,
    /// The peer's comm ID.
    pub remote_comm_id: ibcm_mad::CommId,
    /// The peer's QPN (the DREQ's Remote QPN/EECN).
    pub remote_qpn: Qpn,
    /// The peer's CM.
    pub peer: PeerAddr,
    /// DREQ private data, at most 220 bytes.
    pub private_data: Vec<u8>,
    /// Time to wait for the DREP per attempt (also the TimeWait that follows).
    pub timeout: Duration,
    /// Retransmissions before giving up.
    pub max_retries: u8,
}

impl StaleConnection {
    /// A stale connection with the DREQ timing of a connection made with
    /// [`ConnectParams::new`]'s defaults: (2 × 2^18 + 2^20) × 4.096 µs ≈ 6.4 s per attempt
    /// (packet life time 18 twice, remote CM response timeout 20), 15 retries.
    pub fn new(
        local_comm_id: ibcm_mad::CommId,
        remote_comm_id: ibcm_mad::CommId,
        remote_qpn: Qpn,
        peer: impl Into<PeerAddr>,
    ) -> Self {
        StaleConnection {
            local_comm_id,
            remote_comm_id,
            remote_qpn,
            peer: peer.into(),
            private_data: Vec::new(),
            timeout: TimeoutExp::masked(18).to_duration() * 2
                + TimeoutExp::masked(20).to_duration(),
            max_retries: 15,
        }
    }
}

/// Which REQs a listener takes.
#[derive(Debug, Clone, Default)]
pub struct ListenOptions {
    /// Accepted transports; a REQ for another one is rejected with REJ 28 and no private data
    /// (what Linux rdma_cm does on a QP-type mismatch). Empty = any.
    pub transports: Vec<ReqTransport>,
}

/// A SIDR_REQ to send.
#[derive(Debug, Clone)]
pub struct SidrReqParams {
    /// Where the peer's CM is.
    pub peer: PeerAddr,
    /// Service ID to resolve.
    pub service_id: ServiceId,
    /// P_Key.
    pub pkey: Pkey,
    /// Private data, at most 216 bytes.
    pub private_data: Vec<u8>,
    /// Time to wait for the SIDR_REP per attempt.
    pub timeout: Duration,
    /// Retransmissions before giving up.
    pub max_retries: u8,
}

impl SidrReqParams {
    /// A SIDR_REQ for `service_id` with rdma_cm's timing (4096 ms, 15 retries).
    pub fn new(peer: impl Into<PeerAddr>, service_id: ServiceId) -> Self {
        SidrReqParams {
            peer: peer.into(),
            service_id,
            pkey: Pkey::DEFAULT,
            private_data: Vec::new(),
            timeout: Duration::from_millis(4096),
            max_retries: 15,
        }
    }
}

/// The answer to a SIDR_REQ.
#[derive(Debug, Clone)]
pub struct SidrRepParams {
    /// Status.
    pub status: SidrStatus,
    /// The UD QP that serves the service.
    pub qpn: Qpn,
    /// Its Q_Key.
    pub qkey: Qkey,
    /// Additional information (at most 72 bytes).
    pub additional_info: Vec<u8>,
    /// Private data, at most 136 bytes.
    pub private_data: Vec<u8>,
}

impl SidrRepParams {
    /// A successful answer.
    pub fn success(qpn: Qpn, qkey: Qkey) -> Self {
        SidrRepParams {
            status: SidrStatus::Success,
            qpn,
            qkey,
            additional_info: Vec::new(),
            private_data: Vec::new(),
        }
    }
}
