//! The node service's socket protocol: [`ClientMsg`] (client → daemon) and [`DaemonMsg`]
//! (daemon → client), each a JSON value in a frame of a 4-byte big-endian length and at most
//! [`MAX_FRAME`] bytes.
//!
//! Parameters and messages that the CM puts on the wire travel as what they become there: the
//! parameters of a connect as the 232-byte body of a REQ carrying them, those of an accept as
//! a REP body, a received REQ or REP as its body. So the protocol has no second copy of
//! every field; only what a MAD does not carry (the peer's address, the rdma_cm header,
//! flags of the runtime) has fields of its own.

use std::net::SocketAddr;

use ibcm_mad::cma::CmaHeader;
use ibcm_mad::{
    AttrId, CmMessage, Gid, Lid, Qkey, Qpn, RejReason, Rep, Req, ServiceId, TimeoutExp,
    MAD_DATA_LEN,
};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::proto::{
    AcceptParams, CallError, ConnectError, ConnectParams, ConnectionError, IbAddr, PeerAddr,
    RepInfo, ReqInfo, State,
};
use crate::rt::types::ConnStatus;

/// The largest frame either side accepts (a bigger length prefix ends the session).
pub const MAX_FRAME: usize = 64 * 1024;

/// Protocol version; the daemon refuses a client of another one.
pub const VERSION: u32 = 1;

/// A request of a client, with the number its answer ([`DaemonMsg::Reply`]) carries.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ClientMsg {
    /// Chosen by the client; echoed in the reply.
    pub seq: u64,
    /// What to do.
    pub op: Op,
}

/// What a client asks for. Every connection it names must be its own (one it connected, or
/// one whose REQ reached its listener); anything else is answered "no connection".
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "kebab-case")]
pub enum Op {
    /// First message: the protocol version.
    Hello {
        /// [`VERSION`].
        version: u32,
    },
    /// `Cm::connect`, `Cm::start_connect`, `Cm::connect_manual`.
    Connect {
        /// The parameters.
        params: WireConnect,
    },
    /// `Cm::listen`. A service ID another client listens on is refused.
    Listen {
        /// Service ID.
        service_id: u64,
        /// Accepted transports (raw `ReqTransport` numbers: 0 RC, 1 UC, 2 XRC); empty: any.
        transports: Vec<u8>,
    },
    /// A `Listener` dropped.
    Unlisten {
        /// Service ID.
        service_id: u64,
    },
    /// `Incoming::accept`.
    Accept {
        /// Connection.
        conn: u32,
        /// The parameters.
        params: WireAccept,
    },
    /// `Incoming::reject`, `PendingConnection::reject`.
    Reject {
        /// Connection.
        conn: u32,
        /// REJ reason.
        reason: u16,
        /// ARI.
        ari: Vec<u8>,
        /// Private data.
        private_data: Vec<u8>,
    },
    /// `PendingConnection::establish` (the RTU).
    Establish {
        /// Connection.
        conn: u32,
        /// RTU private data.
        private_data: Vec<u8>,
    },
    /// `Incoming::mra`.
    Mra {
        /// Connection.
        conn: u32,
        /// Service timeout exponent.
        service_timeout: u8,
    },
    /// `Connection::disconnect`.
    Disconnect {
        /// Connection.
        conn: u32,
        /// DREQ private data.
        private_data: Vec<u8>,
    },
    /// An `Incoming` dropped unanswered (REJ 28).
    Unanswered {
        /// Connection.
        conn: u32,
    },
    /// A `PendingConnection` dropped (REJ of the REP).
    PendingDropped {
        /// Connection.
        conn: u32,
    },
    /// `Cm::random_psn`.
    RandomPsn,
    /// `Cm::connection_count`: this client's connections.
    Len,
    /// Serve XRC REQs for `service_id` as an XRC target of this client: the daemon creates or
    /// attaches the TGT QPs, with `policy` for the ones it creates.
    XrcListen {
        /// Service ID.
        service_id: u64,
        /// `explicit`, `domain`, `process` or `shared`.
        policy: String,
        /// The SRQ numbers announced in the REP (1..=47).
        srqns: Vec<u32>,
    },
    /// Stop serving XRC REQs for `service_id`.
    XrcUnlisten {
        /// Service ID.
        service_id: u64,
    },
    /// Destroy every TGT QP this client owns (the owner's destroy: its connections get the
    /// "target gone (owner destroyed it)" DREQ; for `Shared` QPs the client's registration
    /// is dropped instead). The answer's value is the number of QPs.
    XrcDestroy,
}

/// What the daemon sends: replies, and events about the client's own objects.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "msg", rename_all = "kebab-case")]
pub enum DaemonMsg {
    /// The answer to request `seq`.
    Reply {
        /// The request's number.
        seq: u64,
        /// The answer.
        result: WireResult,
    },
    /// A REQ for a service the client listens on: a new connection of the client.
    Incoming {
        /// The listener's service ID.
        service_id: u64,
        /// The new connection.
        conn: u32,
        /// The REQ.
        req: WireReq,
    },
    /// The REP of an active connection of the client arrived.
    Rep {
        /// Connection.
        conn: u32,
        /// The REP.
        rep: WireRep,
    },
    /// A connection of the client changed status.
    Status {
        /// Connection.
        conn: u32,
        /// The new status.
        status: WireStatus,
    },
    /// Something the daemon's XRC target did on one of the client's XRC services.
    XrcEvent {
        /// Service ID.
        service_id: u64,
        /// One line, for logs.
        text: String,
    },
}

/// The answer to a [`ClientMsg`].
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "r", rename_all = "kebab-case")]
pub enum WireResult {
    /// Done, nothing to return.
    Ok,
    /// A new connection (connect).
    Conn {
        /// Its ID.
        conn: u32,
    },
    /// A number (random PSN, count).
    Value {
        /// The number.
        value: u64,
    },
    /// `ConnectError`.
    ConnectError(WireConnectError),
    /// `CallError`.
    CallError(WireCallError),
    /// `ConnectionError` (the connection is closed already).
    Closed(WireConnError),
    /// The daemon refused the request (ownership, quota, bad parameters, protocol).
    Refused {
        /// Why.
        why: String,
    },
}

/// [`ConnectError`] on the wire.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum WireConnectError {
    /// `PrivateDataTooLong`.
    PrivateDataTooLong {
        /// Length.
        len: usize,
        /// Limit.
        max: usize,
    },
    /// `QpnInQuarantine`.
    QpnInQuarantine {
        /// QPN.
        qpn: u32,
        /// Milliseconds until the quarantine ends (clocks are per process).
        remaining_ms: u64,
    },
    /// `QpnInUse`.
    QpnInUse {
        /// QPN.
        qpn: u32,
    },
    /// `NoPath`.
    NoPath,
}

impl WireConnectError {
    /// From the core's error.
    pub fn from_error(e: &ConnectError) -> Self {
        match e {
            ConnectError::PrivateDataTooLong { len, max } => Self::PrivateDataTooLong {
                len: *len,
                max: *max,
            },
            ConnectError::QpnInQuarantine { qpn, until } => Self::QpnInQuarantine {
                qpn: qpn.get(),
                remaining_ms: u64::try_from(
                    until
                        .saturating_duration_since(tokio::time::Instant::now().into_std())
                        .as_millis(),
                )
                .unwrap_or(u64::MAX),
            },
            ConnectError::QpnInUse { qpn } => Self::QpnInUse { qpn: qpn.get() },
            ConnectError::NoPath => Self::NoPath,
        }
    }

    /// Back to the core's error.
    pub fn to_error(&self) -> ConnectError {
        match *self {
            Self::PrivateDataTooLong { len, max } => ConnectError::PrivateDataTooLong { len, max },
            Self::QpnInQuarantine { qpn, remaining_ms } => ConnectError::QpnInQuarantine {
                qpn: Qpn::masked(qpn),
                until: tokio::time::Instant::now().into_std()
                    + std::time::Duration::from_millis(remaining_ms.min(86_400_000)),
            },
            Self::QpnInUse { qpn } => ConnectError::QpnInUse {
                qpn: Qpn::masked(qpn),
            },
            Self::NoPath => ConnectError::NoPath,
        }
    }
}

/// [`CallError`] on the wire.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum WireCallError {
    /// `UnknownConnection`.
    UnknownConnection {
        /// Connection.
        conn: u32,
    },
    /// `WrongState`.
    WrongState {
        /// The call.
        op: String,
        /// The state's number.
        state: u8,
    },
    /// `TooLong`.
    TooLong {
        /// What.
        what: String,
        /// Length.
        len: usize,
        /// Limit.
        max: usize,
    },
    /// `QpnInQuarantine`.
    QpnInQuarantine {
        /// QPN.
        qpn: u32,
    },
    /// `QpnInUse`.
    QpnInUse {
        /// QPN.
        qpn: u32,
    },
}

/// The call names the core uses in [`CallError`] (a `&'static str` on the client side too).
const OPS: [&str; 10] = [
    "accept",
    "apr",
    "establish",
    "load_alternate_path",
    "mra",
    "notify_established",
    "notify_path_migrated",
    "reject",
    "private data",
    "ARI",
];

fn static_name(s: &str) -> &'static str {
    OPS.iter().find(|&&o| o == s).copied().unwrap_or("call")
}

fn state_of(n: u8) -> State {
    [
        State::ReqSent,
        State::ReqRcvd,
        State::MraReqSent,
        State::MraReqRcvd,
        State::RepSent,
        State::RepRcvd,
        State::MraRepSent,
        State::MraRepRcvd,
        State::Established,
        State::DreqSent,
        State::DreqRcvd,
        State::Timewait,
    ]
    .into_iter()
    .find(|s| *s as u8 == n)
    .unwrap_or(State::Idle)
}

impl WireCallError {
    /// From the core's error.
    pub fn from_error(e: &CallError) -> Self {
        match e {
            CallError::UnknownConnection(c) => Self::UnknownConnection { conn: c.0 },
            CallError::WrongState { op, state } => Self::WrongState {
                op: (*op).to_owned(),
                state: *state as u8,
            },
            CallError::TooLong { what, len, max } => Self::TooLong {
                what: (*what).to_owned(),
                len: *len,
                max: *max,
            },
            CallError::QpnInQuarantine { qpn } => Self::QpnInQuarantine { qpn: qpn.get() },
            CallError::QpnInUse { qpn } => Self::QpnInUse { qpn: qpn.get() },
        }
    }

    /// Back to the core's error.
    pub fn to_error(&self) -> CallError {
        match self {
            Self::UnknownConnection { conn } => {
                CallError::UnknownConnection(ibcm_mad::CommId(*conn))
            }
            Self::WrongState { op, state } => CallError::WrongState {
                op: static_name(op),
                state: state_of(*state),
            },
            Self::TooLong { what, len, max } => CallError::TooLong {
                what: static_name(what),
                len: *len,
                max: *max,
            },
            Self::QpnInQuarantine { qpn } => CallError::QpnInQuarantine {
                qpn: Qpn::masked(*qpn),
            },
            Self::QpnInUse { qpn } => CallError::QpnInUse {
                qpn: Qpn::masked(*qpn),
            },
        }
    }
}

/// [`ConnectionError`] on the wire.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum WireConnError {
    /// `Rejected`.
    Rejected {
        /// Reason.
        reason: u16,
        /// ARI.
        ari: Vec<u8>,
        /// Private data.
        private_data: Vec<u8>,
    },
    /// `LocallyRejected`.
    LocallyRejected {
        /// Reason.
        reason: u16,
    },
    /// `TimedOut`.
    TimedOut,
    /// `Stale`.
    Stale,
    /// `Disconnected`.
    Disconnected {
        /// Whether the peer sent the DREQ.
        by_peer: bool,
        /// DREQ private data.
        private_data: Vec<u8>,
    },
    /// `DisconnectTimedOut`.
    DisconnectTimedOut,
    /// `LocallyClosed`.
    LocallyClosed,
}

impl WireConnError {
    /// From the core's error.
    pub fn from_error(e: &ConnectionError) -> Self {
        match e {
            ConnectionError::Rejected {
                reason,
                ari,
                private_data,
            } => Self::Rejected {
                reason: reason.raw(),
                ari: ari.clone(),
                private_data: private_data.clone(),
            },
            ConnectionError::LocallyRejected { reason } => Self::LocallyRejected {
                reason: reason.raw(),
            },
            ConnectionError::TimedOut => Self::TimedOut,
            ConnectionError::Stale => Self::Stale,
            ConnectionError::Disconnected {
                by_peer,
                private_data,
            } => Self::Disconnected {
                by_peer: *by_peer,
                private_data: private_data.clone(),
            },
            ConnectionError::DisconnectTimedOut => Self::DisconnectTimedOut,
            ConnectionError::LocallyClosed => Self::LocallyClosed,
        }
    }

    /// Back to the core's error.
    pub fn to_error(&self) -> ConnectionError {
        match self {
            Self::Rejected {
                reason,
                ari,
                private_data,
            } => ConnectionError::Rejected {
                reason: RejReason::from_raw(*reason),
                ari: ari.clone(),
                private_data: private_data.clone(),
            },
            Self::LocallyRejected { reason } => ConnectionError::LocallyRejected {
                reason: RejReason::from_raw(*reason),
            },
            Self::TimedOut => ConnectionError::TimedOut,
            Self::Stale => ConnectionError::Stale,
            Self::Disconnected {
                by_peer,
                private_data,
            } => ConnectionError::Disconnected {
                by_peer: *by_peer,
                private_data: private_data.clone(),
            },
            Self::DisconnectTimedOut => ConnectionError::DisconnectTimedOut,
            Self::LocallyClosed => ConnectionError::LocallyClosed,
        }
    }
}

/// [`ConnStatus`] on the wire.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum WireStatus {
    /// Being set up.
    Connecting,
    /// Established.
    Established,
    /// Closed (TimeWait may run).
    Closed(WireConnError),
    /// Out of TimeWait.
    Gone(WireConnError),
}

impl WireStatus {
    /// From the runtime's status.
    pub fn from_status(s: &ConnStatus) -> Self {
        match s {
            ConnStatus::Connecting => Self::Connecting,
            ConnStatus::Established => Self::Established,
            ConnStatus::Closed(e) => Self::Closed(WireConnError::from_error(e)),
            ConnStatus::Gone(e) => Self::Gone(WireConnError::from_error(e)),
        }
    }

    /// Back to the runtime's status.
    pub fn to_status(&self) -> ConnStatus {
        match self {
            Self::Connecting => ConnStatus::Connecting,
            Self::Established => ConnStatus::Established,
            Self::Closed(e) => ConnStatus::Closed(e.to_error()),
            Self::Gone(e) => ConnStatus::Gone(e.to_error()),
        }
    }
}

/// A [`PeerAddr`] on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum WirePeer {
    /// `PeerAddr::Udp`.
    Udp(SocketAddr),
    /// `PeerAddr::Ib`.
    Ib {
        /// LID.
        lid: u16,
        /// GID, if any.
        gid: Option<[u8; 16]>,
        /// QPN (1).
        qpn: u32,
        /// Q_Key.
        qkey: u32,
        /// SL.
        sl: u8,
        /// P_Key index.
        pkey_index: u16,
    },
}

impl WirePeer {
    /// From an address.
    pub fn from_peer(p: &PeerAddr) -> Self {
        match p {
            PeerAddr::Udp(a) => Self::Udp(*a),
            PeerAddr::Ib(a) => Self::Ib {
                lid: a.lid.0,
                gid: a.gid.map(|g| g.0),
                qpn: a.qpn.get(),
                qkey: a.qkey.0,
                sl: a.sl,
                pkey_index: a.pkey_index,
            },
        }
    }

    /// Back to an address.
    pub fn to_peer(self) -> PeerAddr {
        match self {
            Self::Udp(a) => PeerAddr::Udp(a),
            Self::Ib {
                lid,
                gid,
                qpn,
                qkey,
                sl,
                pkey_index,
            } => PeerAddr::Ib(IbAddr {
                lid: Lid(lid),
                gid: gid.map(Gid),
                qpn: Qpn::masked(qpn),
                qkey: Qkey(qkey),
                sl,
                pkey_index,
            }),
        }
    }
}

fn body(msg: &CmMessage) -> Vec<u8> {
    let mut v = Vec::with_capacity(MAD_DATA_LEN);
    msg.emit_body(&mut v);
    v
}

fn parse_req(b: &[u8]) -> Result<Req, String> {
    match b.first_chunk::<MAD_DATA_LEN>() {
        Some(d) => match CmMessage::parse_fixed(AttrId::Req, d) {
            CmMessage::Req(r) => Ok(r),
            _ => Err("not a REQ body".into()),
        },
        None => Err(format!("a REQ body of {} bytes", b.len())),
    }
}

fn parse_rep(b: &[u8]) -> Result<Rep, String> {
    match b.first_chunk::<MAD_DATA_LEN>() {
        Some(d) => match CmMessage::parse_fixed(AttrId::Rep, d) {
            CmMessage::Rep(r) => Ok(r),
            _ => Err("not a REP body".into()),
        },
        None => Err(format!("a REP body of {} bytes", b.len())),
    }
}

fn cma(h: Option<&CmaHeader>) -> Result<Option<Vec<u8>>, String> {
    h.map(|h| {
        let mut b = vec![0u8; CmaHeader::LEN];
        h.emit(&mut b).map(|()| b).map_err(|e| e.to_string())
    })
    .transpose()
}

fn parse_cma(b: Option<&Vec<u8>>) -> Result<Option<CmaHeader>, String> {
    b.map(|b| CmaHeader::parse(b).map_err(|e| e.to_string()))
        .transpose()
}

/// [`ConnectParams`] on the wire: the REQ body that carries them, and the rest.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WireConnect {
    /// The peer's CM.
    pub peer: WirePeer,
    /// A REQ with the parameters' fields (232 bytes; its private data unused).
    pub req: Vec<u8>,
    /// Private data.
    pub private_data: Vec<u8>,
    /// The rdma_cm header (36 bytes), if any.
    pub cma: Option<Vec<u8>>,
    /// Whether the REQ's primary path was given.
    pub primary_path: bool,
    /// Whether the REQ's alternate path was given.
    pub alternate_path: bool,
    /// `auto_rtu`.
    pub auto_rtu: bool,
    /// `allow_shared_qpn`.
    pub allow_shared_qpn: bool,
}

impl WireConnect {
    /// From the parameters.
    ///
    /// # Errors
    /// An rdma_cm header that cannot be emitted.
    pub fn from_params(p: &ConnectParams) -> Result<Self, String> {
        let mut req = Req {
            service_id: p.service_id,
            local_qpn: p.local_qpn,
            starting_psn: p.starting_psn,
            partition_key: p.pkey,
            path_mtu: p.path_mtu,
            responder_resources: p.responder_resources,
            initiator_depth: p.initiator_depth,
            remote_cm_response_timeout: p.remote_cm_response_timeout,
            local_cm_response_timeout: p.local_cm_response_timeout,
            max_cm_retries: p.max_cm_retries,
            retry_count: p.retry_count,
            rnr_retry_count: p.rnr_retry_count,
            end_to_end_flow_control: p.flow_control,
            srq: p.srq,
            primary_path: p.primary_path.unwrap_or_default(),
            alternate_path: p.alternate_path.unwrap_or_default(),
            ..Req::default()
        };
        // The packet life time travels in the primary path's ACK timeout slot when no path
        // is given (the REQ has no field of its own for it).
        if p.primary_path.is_none() {
            req.primary_path.local_ack_timeout = p.packet_life_time;
        }
        req.set_transport(p.transport);
        Ok(WireConnect {
            peer: WirePeer::from_peer(&p.peer),
            req: body(&CmMessage::Req(req)),
            private_data: p.private_data.clone(),
            cma: cma(p.cma_header.as_ref())?,
            primary_path: p.primary_path.is_some(),
            alternate_path: p.alternate_path.is_some(),
            auto_rtu: p.auto_rtu,
            allow_shared_qpn: p.allow_shared_qpn,
        })
    }

    /// Back to the parameters.
    ///
    /// # Errors
    /// A malformed REQ body or rdma_cm header.
    pub fn to_params(&self) -> Result<ConnectParams, String> {
        let r = parse_req(&self.req)?;
        let mut p = ConnectParams::new(self.peer.to_peer(), r.service_id, r.local_qpn);
        p.transport = r.transport();
        p.starting_psn = r.starting_psn;
        p.cma_header = parse_cma(self.cma.as_ref())?;
        p.private_data = self.private_data.clone();
        p.primary_path = self.primary_path.then_some(r.primary_path);
        p.alternate_path = self.alternate_path.then_some(r.alternate_path);
        if !self.primary_path {
            p.packet_life_time = r.primary_path.local_ack_timeout;
        }
        p.pkey = r.partition_key;
        p.path_mtu = r.path_mtu;
        p.responder_resources = r.responder_resources;
        p.initiator_depth = r.initiator_depth;
        p.remote_cm_response_timeout = r.remote_cm_response_timeout;
        p.local_cm_response_timeout = r.local_cm_response_timeout;
        p.max_cm_retries = r.max_cm_retries;
        p.retry_count = r.retry_count;
        p.rnr_retry_count = r.rnr_retry_count;
        p.flow_control = r.end_to_end_flow_control;
        p.srq = r.srq;
        p.auto_rtu = self.auto_rtu;
        p.allow_shared_qpn = self.allow_shared_qpn;
        Ok(p)
    }
}

/// [`AcceptParams`] on the wire: the REP body that carries them, and the rest.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WireAccept {
    /// A REP with the parameters' fields (232 bytes; its private data unused).
    pub rep: Vec<u8>,
    /// Private data.
    pub private_data: Vec<u8>,
    /// `xrc_tgt_qpn`.
    pub xrc_tgt_qpn: Option<u32>,
    /// `xrc_tgt_live`.
    pub xrc_tgt_live: bool,
}

impl WireAccept {
    /// From the parameters.
    pub fn from_params(p: &AcceptParams) -> Self {
        let rep = Rep {
            local_qpn: p.local_qpn,
            starting_psn: p.starting_psn,
            responder_resources: p.responder_resources,
            initiator_depth: p.initiator_depth,
            target_ack_delay: p.target_ack_delay,
            failover_accepted: p.failover_accepted,
            end_to_end_flow_control: p.flow_control,
            rnr_retry_count: p.rnr_retry_count,
            srq: p.srq,
            ..Rep::default()
        };
        WireAccept {
            rep: body(&CmMessage::Rep(rep)),
            private_data: p.private_data.clone(),
            xrc_tgt_qpn: p.xrc_tgt_qpn.map(Qpn::get),
            xrc_tgt_live: p.xrc_tgt_live,
        }
    }

    /// Back to the parameters.
    ///
    /// # Errors
    /// A malformed REP body.
    pub fn to_params(&self) -> Result<AcceptParams, String> {
        let r = parse_rep(&self.rep)?;
        let mut p = AcceptParams::new(r.local_qpn);
        p.starting_psn = r.starting_psn;
        p.responder_resources = r.responder_resources;
        p.initiator_depth = r.initiator_depth;
        p.target_ack_delay = r.target_ack_delay;
        p.failover_accepted = r.failover_accepted;
        p.flow_control = r.end_to_end_flow_control;
        p.rnr_retry_count = r.rnr_retry_count;
        p.srq = r.srq;
        p.private_data = self.private_data.clone();
        p.xrc_tgt_qpn = self.xrc_tgt_qpn.map(Qpn::masked);
        p.xrc_tgt_live = self.xrc_tgt_live;
        Ok(p)
    }
}

/// A received REQ ([`ReqInfo`]) on the wire.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WireReq {
    /// Where it came from.
    pub peer: WirePeer,
    /// Its body (232 bytes).
    pub req: Vec<u8>,
    /// The rdma_cm header, if any.
    pub cma: Option<Vec<u8>>,
}

impl WireReq {
    /// From the REQ.
    ///
    /// # Errors
    /// An rdma_cm header that cannot be emitted.
    pub fn from_info(i: &ReqInfo) -> Result<Self, String> {
        Ok(WireReq {
            peer: WirePeer::from_peer(&i.peer),
            req: body(&CmMessage::Req(i.req)),
            cma: cma(i.cma_header.as_ref())?,
        })
    }

    /// Back to the REQ.
    ///
    /// # Errors
    /// A malformed body or header.
    pub fn to_info(&self) -> Result<ReqInfo, String> {
        Ok(ReqInfo {
            peer: self.peer.to_peer(),
            req: parse_req(&self.req)?,
            cma_header: parse_cma(self.cma.as_ref())?,
        })
    }
}

/// A received REP ([`RepInfo`]) on the wire.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WireRep {
    /// Its body (232 bytes).
    pub rep: Vec<u8>,
    /// The QPN to use.
    pub remote_qpn: u32,
}

impl WireRep {
    /// From the REP.
    pub fn from_info(i: &RepInfo) -> Self {
        WireRep {
            rep: body(&CmMessage::Rep(i.rep)),
            remote_qpn: i.remote_qpn.get(),
        }
    }

    /// Back to the REP.
    ///
    /// # Errors
    /// A malformed body.
    pub fn to_info(&self) -> Result<RepInfo, String> {
        Ok(RepInfo {
            rep: parse_rep(&self.rep)?,
            remote_qpn: Qpn::masked(self.remote_qpn),
        })
    }
}

/// A service ID from the wire.
pub(crate) fn sid(v: u64) -> ServiceId {
    ServiceId(v)
}

/// A timeout exponent from the wire (masked to 5 bits).
pub(crate) fn texp(v: u8) -> TimeoutExp {
    TimeoutExp::masked(v)
}

/// Why a frame could not be read.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    /// The socket failed or closed.
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// The length prefix is above [`MAX_FRAME`].
    #[error("frame of {0} bytes is above the {MAX_FRAME}-byte limit")]
    TooLong(usize),
    /// Not a message of this protocol.
    #[error("malformed message: {0}")]
    Malformed(#[from] serde_json::Error),
}

/// Reads one frame and decodes it.
///
/// # Errors
/// [`FrameError`]; an end of stream is `Io(UnexpectedEof)`.
pub async fn read_frame<T, R>(r: &mut R) -> Result<T, FrameError>
where
    T: for<'de> Deserialize<'de>,
    R: AsyncRead + Unpin,
{
    let len = r.read_u32().await? as usize;
    if len > MAX_FRAME {
        return Err(FrameError::TooLong(len));
    }
    let mut buf = vec![0u8; len];
    r.read_exact(&mut buf).await?;
    Ok(serde_json::from_slice(&buf)?)
}

/// Encodes a message as one frame.
///
/// # Errors
/// A message above [`MAX_FRAME`] (none of this protocol's are).
pub fn encode_frame<T: Serialize>(msg: &T) -> Result<Vec<u8>, FrameError> {
    let json = serde_json::to_vec(msg)?;
    if json.len() > MAX_FRAME {
        return Err(FrameError::TooLong(json.len()));
    }
    let len = u32::try_from(json.len()).map_err(|_| FrameError::TooLong(json.len()))?;
    let mut out = Vec::with_capacity(4 + json.len());
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(&json);
    Ok(out)
}

/// Writes one encoded frame.
///
/// # Errors
/// The socket's error.
pub async fn write_frame<W: AsyncWrite + Unpin>(w: &mut W, frame: &[u8]) -> std::io::Result<()> {
    w.write_all(frame).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use ibcm_mad::{Psn, ReqTransport};

    #[test]
    fn connect_params_round_trip() {
        let mut p = ConnectParams::rdma_cm(
            "127.0.0.1:49152".parse().unwrap(),
            "127.0.0.2:7471".parse().unwrap(),
            Qpn::new(0x1234).unwrap(),
        )
        .xrc();
        p.starting_psn = Psn::new(0x55aa).unwrap();
        p.private_data = vec![1, 2, 3];
        p.auto_rtu = false;
        p.packet_life_time = TimeoutExp::masked(11);
        let w = WireConnect::from_params(&p).unwrap();
        let json = serde_json::to_vec(&w).unwrap();
        let back: WireConnect = serde_json::from_slice(&json).unwrap();
        let q = back.to_params().unwrap();
        assert_eq!(q.transport, ReqTransport::Xrc);
        assert_eq!(q.service_id, p.service_id);
        assert_eq!(q.local_qpn, p.local_qpn);
        assert_eq!(q.starting_psn, p.starting_psn);
        assert_eq!(q.cma_header, p.cma_header);
        assert_eq!(q.private_data, p.private_data);
        assert_eq!(q.packet_life_time, p.packet_life_time);
        assert_eq!(q.primary_path, None);
        assert!(!q.auto_rtu);
        assert_eq!(q.peer, p.peer);
    }

    #[test]
    fn accept_and_errors_round_trip() {
        let mut a = AcceptParams::xrc_tgt(Qpn::new(0x77).unwrap());
        a.xrc_tgt_live = true;
        a.private_data = vec![9];
        let b = WireAccept::from_params(&a).to_params().unwrap();
        assert_eq!(b.xrc_tgt_qpn, a.xrc_tgt_qpn);
        assert_eq!(b.srq, a.srq);
        assert_eq!(b.local_qpn, a.local_qpn);
        assert_eq!(b.private_data, a.private_data);
        let e = ConnectionError::Rejected {
            reason: RejReason::from_raw(1),
            ari: vec![1, 2],
            private_data: vec![3],
        };
        assert_eq!(WireConnError::from_error(&e).to_error(), e);
        let c = CallError::WrongState {
            op: "accept",
            state: State::RepSent,
        };
        assert_eq!(WireCallError::from_error(&c).to_error(), c);
    }

    #[tokio::test]
    async fn frames_refuse_oversized_lengths() {
        let f = encode_frame(&ClientMsg {
            seq: 7,
            op: Op::RandomPsn,
        })
        .unwrap();
        let m: ClientMsg = read_frame(&mut &f[..]).await.unwrap();
        assert_eq!(m.seq, 7);
        let big = (MAX_FRAME as u32 + 1).to_be_bytes();
        let r = read_frame::<ClientMsg, _>(&mut &big[..]).await;
        assert!(matches!(r, Err(FrameError::TooLong(_))));
        let junk = [0, 0, 0, 2, b'{', b'x'];
        let r = read_frame::<ClientMsg, _>(&mut &junk[..]).await;
        assert!(matches!(r, Err(FrameError::Malformed(_))));
    }
}
