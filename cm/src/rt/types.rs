//! The data the handles and the driver share: statuses, answers and errors.

use ibcm_mad::Qpn;

use crate::proto::{CallError, ConnectError, ConnectionError, ReqInfo, SidrReqInfo};

/// The answer to a SIDR_REQ.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SidrAnswer {
    /// Status.
    pub status: ibcm_mad::SidrStatus,
    /// The serving UD QP.
    pub qpn: Qpn,
    /// Its Q_Key.
    pub qkey: ibcm_mad::Qkey,
    /// Private data (trailing zeros trimmed).
    pub private_data: Vec<u8>,
}

/// What a connection handle can observe.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConnStatus {
    /// Being set up.
    Connecting,
    /// Established.
    Established,
    /// Closed (TimeWait may still run).
    Closed(ConnectionError),
    /// Closed and out of TimeWait: the comm ID and QPN are free again.
    Gone(ConnectionError),
}

impl ConnStatus {
    /// The last status of a connection whose slot nothing updates any more: `Gone`, with the
    /// error it closed with (`LocallyClosed` when it had not closed).
    pub(crate) fn gone(&self) -> ConnStatus {
        ConnStatus::Gone(match self {
            ConnStatus::Closed(e) | ConnStatus::Gone(e) => e.clone(),
            _ => ConnectionError::LocallyClosed,
        })
    }
}

/// Errors of the async API.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CmError {
    /// The connect call was refused at once.
    #[error(transparent)]
    Connect(#[from] ConnectError),
    /// The call on a connection was refused at once.
    #[error(transparent)]
    Call(#[from] CallError),
    /// The connection failed or ended.
    #[error(transparent)]
    Connection(#[from] ConnectionError),
    /// The driver task is gone (shut down, or its transport failed).
    #[error("the CM endpoint's driver task has stopped")]
    DriverGone,
    /// SIDR_REQ unanswered.
    #[error("SIDR request timed out")]
    SidrTimedOut,
    /// [`Cm::listen`](super::Cm::listen): the service ID is listened on already (by another
    /// [`Listener`](super::Listener) of this endpoint, or by its app). Drop the other
    /// listener first.
    #[error("service ID {0} is already listened on by this endpoint")]
    AlreadyListening(ibcm_mad::ServiceId),
    /// The node service (`ibcmd`, [`node`](super::node)) refused the request: the reason
    /// it gave (ownership, quota, a service ID another client listens on, …).
    #[error("the node service refused the request: {0}")]
    Refused(String),
    /// [`Cm::with_app`](super::Cm::with_app): the endpoint runs no application of that type.
    #[error("the CM endpoint runs no application of the requested type")]
    NoApp,
}

/// An incoming connection or SIDR request on a [`Listener`](super::Listener).
#[derive(Debug)]
pub enum IncomingKind {
    /// A REQ.
    Connect(Box<ReqInfo>),
    /// A SIDR_REQ.
    Sidr(Box<SidrReqInfo>),
}
