//! Errors returned at once for API misuse. (Why a connection *ended* is a
//! [`ConnectionError`](super::ConnectionError), delivered as an event.)

use std::time::Instant;

use ibcm_mad::Qpn;

use super::{ConnId, State};

/// Why [`Endpoint::connect`](super::Endpoint::connect) refused to start a connection.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConnectError {
    /// The private data does not fit (92 bytes, 56 after a CMA header).
    #[error("private data of {len} bytes exceeds the {max}-byte limit")]
    PrivateDataTooLong {
        /// Length given.
        len: usize,
        /// Limit.
        max: usize,
    },
    /// The local QPN belongs to a connection still in TimeWait.
    #[error("QPN {qpn} is quarantined until its connection's TimeWait ends")]
    QpnInQuarantine {
        /// The QPN.
        qpn: Qpn,
        /// When it becomes free.
        until: Instant,
    },
    /// The local QPN is used by another live connection (see
    /// [`ConnectParams::allow_shared_qpn`](super::ConnectParams::allow_shared_qpn)).
    #[error("QPN {qpn} is already used by a live connection")]
    QpnInUse {
        /// The QPN.
        qpn: Qpn,
    },
    /// No primary path was given and none can be derived (the peer address has no GID).
    #[error("no primary path: give one, or a peer address with a GID")]
    NoPath,
}

/// Why a call on an existing connection (accept, reject, disconnect, …) was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CallError {
    /// No connection (or SIDR request) with this ID.
    #[error("no connection {0}")]
    UnknownConnection(ConnId),
    /// The call makes no sense in the connection's current state.
    #[error("{op} is not allowed in state {state}")]
    WrongState {
        /// The operation.
        op: &'static str,
        /// The connection's state.
        state: State,
    },
    /// The private data (or ARI) does not fit the message.
    #[error("{what} of {len} bytes exceeds the {max}-byte limit")]
    TooLong {
        /// Which field.
        what: &'static str,
        /// Length given.
        len: usize,
        /// Limit.
        max: usize,
    },
    /// The QPN belongs to a connection still in TimeWait.
    #[error("QPN {qpn} is quarantined until its connection's TimeWait ends")]
    QpnInQuarantine {
        /// The QPN.
        qpn: Qpn,
    },
    /// The QPN is used by another live connection.
    #[error("QPN {qpn} is already used by a live connection")]
    QpnInUse {
        /// The QPN.
        qpn: Qpn,
    },
    /// The peer of a connection being set up has not proved that it receives (no RTU, no
    /// message echoing our comm ID from its address), and the message would take the bytes
    /// sent to it past three times what it sent, with room kept for the REP and the REJ that
    /// ends the attempt (`docs/protocol.md` §5.8).
    #[error("connection {0}: its peer has not proved that it receives; no more than 3x its bytes go to it")]
    AmplificationLimited(ConnId),
}
