//! The node protocol's errors and statuses: the core's [`ConnectError`], [`CallError`],
//! [`ConnectionError`] and the runtime's [`ConnStatus`] as serializable values.

use ibcm_mad::{Qpn, RejReason};
use serde::{Deserialize, Serialize};

use crate::proto::{CallError, ConnectError, ConnectionError, State};
use crate::rt::types::ConnStatus;

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
    /// `AmplificationLimited`.
    AmplificationLimited {
        /// Connection.
        conn: u32,
    },
}

/// The call names the core uses in [`CallError`] (a `&'static str` on the client side too).
const OPS: [&str; 13] = [
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
    "LAP private data",
    "APR additional info",
    "APR private data",
];

fn static_name(s: &str) -> &'static str {
    OPS.iter().find(|&&o| o == s).copied().unwrap_or("call")
}

fn state_of(n: u8) -> State {
    State::ALL
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
            CallError::AmplificationLimited(c) => Self::AmplificationLimited { conn: c.0 },
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
            Self::AmplificationLimited { conn } => {
                CallError::AmplificationLimited(ibcm_mad::CommId(*conn))
            }
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
    /// `Refused`.
    Refused {
        /// Why.
        why: String,
    },
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
            ConnectionError::Refused(why) => Self::Refused { why: why.clone() },
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
            Self::Refused { why } => ConnectionError::Refused(why.clone()),
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
