//! The data the handles and the driver share: statuses, answers and errors.

use ibcm_mad::{AprStatus, PathInfo, Qpn};

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

/// The APR that answered a LAP this side sent
/// ([`Connection::load_alt_path`](super::Connection::load_alt_path)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AprAnswer {
    /// The AP status: [`AprStatus::Success`] ("path loaded") in an `Ok` of
    /// [`load_alt_path`](super::Connection::load_alt_path), any other in
    /// [`CmError::LapRejected`].
    pub status: AprStatus,
    /// The Additional Information (its declared length, at most 72 bytes).
    pub additional_info: Vec<u8>,
    /// Private data (trailing zeros trimmed).
    pub private_data: Vec<u8>,
}

/// Who answers the LAPs (alternate path proposals) that arrive on an endpoint's connections:
/// [`Cm::set_lap_policy`](super::Cm::set_lap_policy). One setting per endpoint; it applies to
/// the LAPs that arrive after it is set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LapPolicy {
    /// The driver answers every LAP at once with APR status 2,
    /// [`AprStatus::Unsupported`]: alternate paths are not loaded on this endpoint's
    /// connections. The default: an application that never deals with paths leaves no peer
    /// waiting for its LAP to time out.
    #[default]
    Unsupported,
    /// The application answers: a LAP is held for its connection until
    /// [`Connection::next_lap`](super::Connection::next_lap) hands it over as a
    /// [`LapRequest`](super::LapRequest), which the application accepts or rejects (or drops:
    /// APR [`AprStatus::Rejected`]). A LAP on a connection nobody calls `next_lap` for waits
    /// unanswered (the peer's LAP times out), so opt in only when every connection's LAPs are
    /// looked after. LAPs on connections that have no handle (an [`App`](crate::App)'s) are
    /// still answered "unsupported".
    Application,
}

/// A LAP received under [`LapPolicy::Application`], on its way to a
/// [`LapRequest`](super::LapRequest).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LapArrived {
    /// The proposed alternate path, as the LAP carries it (the sender's view).
    pub(crate) path: PathInfo,
    /// The LAP's private data (trailing zeros trimmed).
    pub(crate) private_data: Vec<u8>,
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
    /// [`Connection::load_alt_path`](super::Connection::load_alt_path): the peer answered the
    /// LAP with an APR whose status is not [`AprStatus::Success`]: the alternate path is not
    /// loaded (the connection stays established on the paths it had). The APR's status,
    /// additional information and private data.
    #[error("alternate path not loaded: the peer answered APR status {} ({})", .0.status, .0.status.raw())]
    LapRejected(AprAnswer),
    /// [`Connection::load_alt_path`](super::Connection::load_alt_path): no APR came before the
    /// LAP's last retry timed out. The LAP exchange is over (a new one may start); the
    /// connection stays established.
    #[error("LAP timed out: no APR after all retries")]
    LapTimedOut,
    /// [`Connection::next_lap`](super::Connection::next_lap) while the endpoint's
    /// [`LapPolicy`] is [`LapPolicy::Unsupported`] (the default): the driver answers every
    /// LAP itself, so none would ever come. Set [`LapPolicy::Application`] first.
    #[error("LAPs are answered by the driver (LapPolicy::Unsupported): set LapPolicy::Application to receive them")]
    LapsNotDelegated,
    /// [`Cm::resolve_path`](super::Cm::resolve_path): no path to the target (no SA, no SM,
    /// the SA's error, a path in another partition).
    #[error("no path: {0}")]
    Path(#[from] super::sa::PathError),
}

/// An incoming connection or SIDR request on a [`Listener`](super::Listener).
#[derive(Debug)]
pub enum IncomingKind {
    /// A REQ.
    Connect(Box<ReqInfo>),
    /// A SIDR_REQ.
    Sidr(Box<SidrReqInfo>),
}
