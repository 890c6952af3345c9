//! What the core hands back: datagrams to send and events for the application.

use bytes::Bytes;
use ibcm_mad::cma::CmaHeader;
use ibcm_mad::{
    AprStatus, CommId, Guid, PathInfo, Psn, Qkey, Qpn, Rep, Req, ReqTransport, RequestId,
    ServiceId, SidrStatus,
};

use super::PeerAddr;

/// A MAD to send: exactly 256 bytes, to the peer's CM.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transmit {
    /// Destination.
    pub to: PeerAddr,
    /// The MAD.
    pub mad: Bytes,
}

/// Identifies a connection: its local communication ID. IDs are never reused while the
/// connection is in the table (including TimeWait).
pub type ConnId = CommId;

/// An event for the application.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// The connection (or, for SIDR events, the request) it concerns.
    pub conn: ConnId,
    /// What happened.
    pub kind: EventKind,
}

/// What happened.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum EventKind {
    /// Passive: a REQ arrived for a listener. Answer with
    /// [`accept`](super::Endpoint::accept), [`reject`](super::Endpoint::reject) or
    /// [`mra`](super::Endpoint::mra).
    ReqReceived(Box<ReqInfo>),
    /// Active: the peer acknowledged our REQ (or REP/LAP) with an MRA; the wait is extended by
    /// the service timeout.
    MraReceived {
        /// The service timeout the peer announced.
        service_timeout: ibcm_mad::TimeoutExp,
    },
    /// Active: a REP arrived (its private data, QPN, XRC TGT QPN…). With `auto_rtu` off the
    /// application now calls [`establish`](super::Endpoint::establish) (sends the RTU) or
    /// rejects; with `auto_rtu` on the RTU has been sent and [`EventKind::Established`]
    /// follows at once.
    RepReceived(Box<RepInfo>),
    /// The connection is established (RTU sent or received, or COMM_EST reported).
    Established,
    /// Passive: the RTU arrived with private data (not all zeros); [`EventKind::Established`]
    /// follows at once. An RTU whose 224 bytes of private data are all zero, and a connection
    /// established by COMM_EST, have none and no such event.
    RtuReceived {
        /// The RTU's private data (224 bytes on the wire; trailing zeros trimmed).
        private_data: Vec<u8>,
    },
    /// The connection ended or failed. Emitted exactly once per connection; TimeWait may
    /// follow.
    Closed(ConnectionError),
    /// The connection left TimeWait and the table: its local comm ID and QPN may be reused.
    TimewaitExit {
        /// The connection's local QPN (now out of quarantine).
        local_qpn: Qpn,
    },
    /// Passive: a SIDR_REQ arrived for a listener; answer with
    /// [`sidr_reply`](super::Endpoint::sidr_reply).
    SidrReqReceived(Box<SidrReqInfo>),
    /// Passive: a SIDR_REQ reported by [`EventKind::SidrReqReceived`] was not answered within
    /// [`EndpointConfig::sidr_in_lifetime`](super::EndpointConfig::sidr_in_lifetime) (or was
    /// evicted by [`EndpointConfig::max_sidr_in`](super::EndpointConfig::max_sidr_in)); it can
    /// no longer be answered.
    SidrReqExpired,
    /// Active: the SIDR_REP for our SIDR_REQ.
    SidrReply {
        /// Status.
        status: SidrStatus,
        /// The serving UD QP.
        qpn: Qpn,
        /// Its Q_Key.
        qkey: Qkey,
        /// Private data.
        private_data: Vec<u8>,
    },
    /// Active: our SIDR_REQ was never answered.
    SidrTimedOut,
    /// A LAP arrived on an established connection; answer with
    /// [`apr`](super::Endpoint::apr).
    LapReceived {
        /// The proposed alternate path.
        path: PathInfo,
        /// Private data.
        private_data: Vec<u8>,
    },
    /// The APR for our LAP.
    AprReceived {
        /// AP status.
        status: AprStatus,
        /// Additional information.
        additional_info: Vec<u8>,
        /// Private data.
        private_data: Vec<u8>,
    },
    /// Our LAP was never answered.
    LapTimedOut,
    /// Passive: a connection answered statelessly under pressure (docs/protocol.md §5.12) was
    /// established by its RTU: the REQ, the REP sent and the RTU's private data. The
    /// connection is ESTABLISHED already (no [`EventKind::Established`] follows); bring its QP
    /// to RTR and RTS now.
    StatelessEstablished(Box<super::StatelessInfo>),
}

/// Why a connection ended.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConnectionError {
    /// The peer sent a REJ.
    #[error("rejected by the peer: {reason} ({})", reason.raw())]
    Rejected {
        /// REJ reason.
        reason: ibcm_mad::RejReason,
        /// Additional rejection information (its declared length).
        ari: Vec<u8>,
        /// REJ private data (148 bytes on the wire; trailing zeros trimmed).
        private_data: Vec<u8>,
    },
    /// This side rejected the connection (application reject, no listener match, REP timeout
    /// REJ, …).
    #[error("rejected locally: {reason} ({})", reason.raw())]
    LocallyRejected {
        /// The REJ reason sent.
        reason: ibcm_mad::RejReason,
    },
    /// The peer never answered (REQ or REP retries exhausted).
    #[error("timed out: no answer after all retries")]
    TimedOut,
    /// The connection was found stale (REJ 10 sent or received, or our QP was reused by a new
    /// connection).
    #[error("stale connection")]
    Stale,
    /// Disconnected with DREQ/DREP.
    #[error("disconnected ({})", if *by_peer { "by the peer" } else { "locally" })]
    Disconnected {
        /// Whether the peer sent the DREQ (else this side did).
        by_peer: bool,
        /// The DREQ's private data (trailing zeros trimmed).
        private_data: Vec<u8>,
    },
    /// Our DREQ was never answered; the connection is down anyway.
    #[error("disconnect timed out (no DREP)")]
    DisconnectTimedOut,
    /// The application aborted the connection during setup.
    #[error("closed locally during setup")]
    LocallyClosed,
    /// The node's CM service (`ibcmd`) refused the connection when the peer had completed
    /// it, and disconnected it: it could not note the connection in its journal (a full file
    /// system, say), so it could not promise to end it at the peer after a crash.
    #[error("refused by the node's CM service: {0}")]
    Refused(String),
}

impl ConnectionError {
    /// The REJ reason, for the two reject variants.
    pub fn rej_reason(&self) -> Option<ibcm_mad::RejReason> {
        match self {
            ConnectionError::Rejected { reason, .. }
            | ConnectionError::LocallyRejected { reason } => Some(*reason),
            _ => None,
        }
    }
}

/// A REQ waiting for the application's answer (the payload of `EventKind::ReqReceived`; the
/// handle an async application answers is `ibcm::rt::Incoming`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReqInfo {
    /// Where it came from.
    pub peer: PeerAddr,
    /// The REQ as received.
    pub req: Req,
    /// The rdma_cm IP header, when the service ID is an rdma_cm IP service and the private
    /// data starts with a valid header.
    pub cma_header: Option<CmaHeader>,
}

impl ReqInfo {
    /// The requested service.
    pub fn service_id(&self) -> ServiceId {
        self.req.service_id
    }

    /// The transport asked for (an XRC REQ makes this side the XRC target).
    pub fn transport(&self) -> ReqTransport {
        self.req.transport()
    }

    /// The initiator's QPN (for XRC: its INI QPN).
    pub fn remote_qpn(&self) -> Qpn {
        self.req.local_qpn
    }

    /// The initiator's CA GUID.
    pub fn remote_ca_guid(&self) -> Guid {
        self.req.local_ca_guid
    }

    /// The PSN the initiator expects to receive first (becomes our send PSN).
    pub fn remote_starting_psn(&self) -> Psn {
        self.req.starting_psn
    }

    /// The application's private data: after the CMA header when there is one (56 bytes),
    /// else all 92 bytes.
    pub fn user_private_data(&self) -> &[u8] {
        let pd = self.req.private_data.as_bytes();
        if self.cma_header.is_some() {
            CmaHeader::user_data(pd)
        } else {
            pd
        }
    }
}

/// A REP received by the active side.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RepInfo {
    /// The REP as received.
    pub rep: Rep,
    /// The remote QPN to use (the TGT QPN from the EECN field for XRC).
    pub remote_qpn: Qpn,
}

/// A SIDR_REQ waiting for the application's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SidrReqInfo {
    /// Where it came from.
    pub peer: PeerAddr,
    /// The sender's request ID.
    pub request_id: RequestId,
    /// The service to resolve.
    pub service_id: ServiceId,
    /// The private data (216 bytes).
    pub private_data: Vec<u8>,
}
