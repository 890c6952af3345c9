//! The commands the handles send the driver.

use std::any::Any;
use std::fmt;
use std::time::Instant;

use ibcm_mad::{AprStatus, PathInfo, RejReason, ServiceId, TimeoutExp};

use tokio::sync::{mpsc, oneshot};

use super::slot::SlotRef;
use super::stats::CmStats;
use super::types::{AprAnswer, CmError, IncomingKind, LapArrived, LapPolicy, SidrAnswer};
use crate::proto::{
    AcceptParams, CallError, ConnId, ConnectError, ConnectParams, Endpoint, ListenOptions,
    SidrRepParams, SidrReqParams, StaleConnection, StatelessAccept, StatelessInfo,
};

/// A new active connection: its ID, its slot, and the REQ as sent.
pub(super) type Connected = (ConnId, SlotRef, Box<ibcm_mad::Req>);

pub(crate) type Reply<T> = oneshot::Sender<T>;

/// A SIDR_REQ sent: its ID, and where its answer comes.
pub(crate) type SidrPending = (ConnId, oneshot::Receiver<Result<SidrAnswer, CmError>>);

/// Where the LAPs of a delegated connection go ([`Command::DelegateLaps`]).
pub(crate) type LapSink = mpsc::UnboundedSender<(ConnId, LapArrived)>;

/// Commands from the handles.
#[derive(Debug)]
pub(crate) enum Command {
    Connect {
        params: ConnectParams,
        reply: Reply<Result<Connected, CmError>>,
    },
    Listen {
        service_id: ServiceId,
        options: ListenOptions,
        tx: mpsc::UnboundedSender<(ConnId, IncomingKind)>,
        /// The listener's token (its [`Command::Unlisten`] names it).
        reply: Reply<Result<u64, CmError>>,
    },
    /// [`Cm::listen_stateless`](super::Cm::listen_stateless): `Listen` with a stateless
    /// template, and the channel its established connections go to.
    ListenStateless {
        service_id: ServiceId,
        options: ListenOptions,
        template: StatelessAccept,
        tx: mpsc::UnboundedSender<(ConnId, IncomingKind)>,
        stateless: mpsc::UnboundedSender<(ConnId, Box<StatelessInfo>)>,
        reply: Reply<Result<u64, CmError>>,
    },
    /// A [`Listener`](super::Listener) dropped: removes its own registration only.
    Unlisten {
        service_id: ServiceId,
        token: u64,
    },
    Accept {
        conn: ConnId,
        params: AcceptParams,
        reply: Reply<Result<SlotRef, CallError>>,
    },
    Reject {
        conn: ConnId,
        reason: RejReason,
        ari: Vec<u8>,
        private_data: Vec<u8>,
        reply: Reply<Result<(), CallError>>,
    },
    /// Sends the RTU of a connection whose REP arrived
    /// ([`PendingConnection::establish`](super::PendingConnection::establish)).
    Establish {
        conn: ConnId,
        private_data: Vec<u8>,
        reply: Reply<Result<(), CallError>>,
    },
    Mra {
        conn: ConnId,
        service_timeout: TimeoutExp,
        reply: Reply<Result<(), CallError>>,
    },
    Disconnect {
        conn: ConnId,
        private_data: Vec<u8>,
        reply: Reply<Result<(), CallError>>,
    },
    /// [`Cm::end_stale`](super::Cm::end_stale): a connection of an earlier life, taken into
    /// the table in DREQ_SENT.
    EndStale {
        stale: StaleConnection,
        reply: Reply<Result<SlotRef, CallError>>,
    },
    Sidr {
        params: SidrReqParams,
        /// The request's ID (for [`Command::SidrCancel`]) and where its answer comes.
        reply: Reply<Result<SidrPending, ConnectError>>,
    },
    /// The requester of a SIDR_REQ is gone: the driver forgets it (no retransmission).
    SidrCancel {
        id: ConnId,
    },
    SidrReply {
        id: ConnId,
        params: SidrRepParams,
        reply: Reply<Result<(), CallError>>,
    },
    /// [`Connection::load_alt_path`](super::Connection::load_alt_path): sends a LAP; the
    /// driver keeps `reply` until the APR, the LAP's timeout or the connection's end.
    LoadAltPath {
        conn: ConnId,
        path: PathInfo,
        private_data: Vec<u8>,
        reply: Reply<Result<AprAnswer, CmError>>,
    },
    /// [`Connection::next_lap`](super::Connection::next_lap): the LAP held for `conn`, or the
    /// next one to arrive.
    NextLap {
        conn: ConnId,
        reply: Reply<Result<LapArrived, CmError>>,
    },
    /// A `next_lap` dropped after the driver handed it a LAP and before it took it: the LAP is
    /// held again.
    LapRequeue {
        conn: ConnId,
        lap: LapArrived,
    },
    /// A [`LapRequest`](super::LapRequest) answered: the APR.
    Apr {
        conn: ConnId,
        status: AprStatus,
        additional_info: Vec<u8>,
        private_data: Vec<u8>,
        reply: Reply<Result<(), CallError>>,
    },
    /// A [`LapRequest`](super::LapRequest) dropped unanswered: the driver answers APR
    /// "rejected" and logs that, rate-limited.
    LapUnanswered {
        conn: ConnId,
    },
    /// [`Connection::notify_path_migrated`](super::Connection::notify_path_migrated).
    PathMigrated {
        conn: ConnId,
        reply: Reply<Result<(), CallError>>,
    },
    /// [`Cm::set_lap_policy`](super::Cm::set_lap_policy).
    SetLapPolicy {
        policy: LapPolicy,
        reply: Reply<()>,
    },
    /// The node service's daemon: the LAPs that arrive on `conn` go to `sink`, whatever the
    /// endpoint's [`LapPolicy`], each to be answered with [`Command::Apr`]; `None` gives the
    /// connection back to the policy. A LAP the sink does not take (its receiver is gone) is
    /// answered "unsupported".
    DelegateLaps {
        conn: ConnId,
        sink: Option<LapSink>,
    },
    Stats {
        reply: Reply<CmStats>,
    },
    /// An [`Incoming`](super::Incoming) dropped unanswered: the driver rejects it (REJ 28, or
    /// SIDR status "rejected") and logs that, rate-limited.
    Unanswered {
        id: ConnId,
        sidr: bool,
    },
    /// A [`PendingConnection`](super::PendingConnection) dropped without establish or reject:
    /// the driver rejects the REP (REJ 28) and logs that, rate-limited.
    PendingDropped {
        id: ConnId,
    },
    RandomPsn {
        reply: Reply<ibcm_mad::Psn>,
    },
    Len {
        reply: Reply<usize>,
    },
    /// Runs a closure on the app and the endpoint ([`Cm::with_app`](super::Cm::with_app)).
    WithApp(AppCall),
    /// Ends the driver: every connection is disconnected first, waiting up to `linger` for
    /// the DREPs ([`Cm::shutdown`](super::Cm::shutdown)).
    Shutdown {
        linger: std::time::Duration,
    },
}

/// What [`AppCall`] runs: the app (`None`: the endpoint runs none), the endpoint, now.
pub(crate) type AppFnOnce = dyn FnOnce(Option<&mut dyn Any>, &mut Endpoint, Instant) + Send;

/// A closure for the app and the endpoint, sent to the driver.
pub(crate) struct AppCall(pub(crate) Box<AppFnOnce>);

impl fmt::Debug for AppCall {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("AppCall")
    }
}
