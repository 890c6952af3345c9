//! The endpoint's records: one connection (what it keeps for its whole life: state,
//! identifiers, peer, timeouts), the request waiting for an answer and the rarely needed data
//! (kept apart, only while there is any: `Io::pending`, `Io::saved`), and the outgoing and
//! incoming SIDR requests, which keep no connection.

use std::time::{Duration, Instant};

use bytes::Bytes;
use ibcm_mad::{CommId, Guid, Qpn, ReqTransport, RequestId, ServiceId, Tid, TimeoutExp};

use super::peers::PeerId;
use super::{LapState, PeerAddr, Side, State};

/// A request waiting for its answer, retransmitted unchanged (`Io::pending`, by local comm ID:
/// only connections in setup, DREQ_SENT or a LAP exchange have one).
#[derive(Debug)]
pub(super) struct Pending {
    pub(super) mad: Bytes,
    pub(super) retries_left: u8,
    pub(super) timeout: Duration,
    /// A REQ's [`ConnectParams::connect_timeout`](super::ConnectParams::connect_timeout):
    /// given up at this instant if still unanswered (REQ_SENT).
    pub(super) deadline: Option<Instant>,
}

/// What a connection saved to answer a duplicate (of a REP, a REQ or a REP it MRAed, a LAP):
/// rarely needed, so kept apart from [`Conn`] (`Io::saved`, by local comm ID) while there is
/// any.
#[derive(Debug, Default)]
pub(super) struct SavedReplies {
    /// Private data of our RTU (to rebuild it for a duplicate REP).
    pub(super) rtu_private_data: Option<Box<[u8]>>,
    /// The last MRA we sent (re-sent on a duplicate of the message it acknowledged).
    pub(super) mra: Option<Bytes>,
    /// The last APR we sent (re-sent on a duplicate LAP).
    pub(super) apr: Option<Bytes>,
}

/// One connection: what it keeps from its REQ until it leaves the table. Its timer, pending
/// request and [`SavedReplies`] live in the endpoint's side tables while it has them.
#[derive(Debug)]
pub(super) struct Conn {
    /// Our comm ID (the key the table finds the record by).
    pub(super) id: CommId,
    pub(super) state: State,
    pub(super) lap: LapState,
    pub(super) side: Side,
    pub(super) transport: ReqTransport,
    /// Closed event already emitted.
    pub(super) closed: bool,
    /// Send the RTU as soon as the REP arrives.
    pub(super) auto_rtu: bool,
    /// The connection counts its local QPN as in use.
    pub(super) holds_qpn: bool,
    pub(super) remote_id: CommId,
    pub(super) local_qpn: Qpn,
    pub(super) remote_qpn: Qpn,
    pub(super) remote_ca_guid: Guid,
    /// The peer, interned in the endpoint's peer table (connections to one node share one
    /// entry).
    pub(super) peer: PeerId,
    pub(super) tid: Tid,
    /// Timeout of our requests on this connection (REQ/REP, then DREQ/LAP), in µs.
    pub(super) request_timeout: Micros,
    pub(super) max_retries: u8,
    /// Packet life time (for the MRA wait).
    pub(super) packet_life_time: TimeoutExp,
    /// TimeWait duration, in µs.
    pub(super) timewait: Micros,
}

impl Conn {
    /// The request timeout and retry budget for a request on this connection.
    pub(super) fn request_budget(&self) -> (Duration, u8) {
        (self.request_timeout.get(), self.max_retries)
    }
}

/// An outgoing SIDR_REQ.
#[derive(Debug)]
pub(super) struct SidrOut {
    pub(super) pending: Pending,
    /// The armed deadline (the timer queue entry it must match).
    pub(super) timer: Option<Instant>,
}

/// An incoming SIDR_REQ waiting for the application.
#[derive(Debug)]
pub(super) struct SidrIn {
    pub(super) peer: PeerAddr,
    pub(super) request_id: RequestId,
    pub(super) service_id: ServiceId,
    pub(super) tid: Tid,
    /// When it is forgotten unanswered (the deadline of its expiry timer, `Timers::insert_sidr_in`).
    pub(super) expires: Instant,
}

/// A duration in microseconds, saturating at ~71 minutes (CM timeouts above that are clamped;
/// keeping them in 4 bytes halves the per-connection record).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct Micros(u32);

impl Micros {
    pub(super) fn from_duration(d: Duration) -> Self {
        Micros(u32::try_from(d.as_micros()).unwrap_or(u32::MAX).max(1))
    }

    pub(super) fn get(self) -> Duration {
        Duration::from_micros(u64::from(self.0))
    }
}

#[cfg(test)]
mod size_tests {
    use super::*;

    /// The per-connection record is most of what `cm-bench scale` pays per established
    /// connection (docs/scale.md: ≤ 128 B including the indexes); keep it from growing
    /// unnoticed. A free slot of the table costs nothing more (`Option` uses the state's
    /// niche).
    #[test]
    fn conn_is_small() {
        assert!(
            core::mem::size_of::<Conn>() <= 56,
            "{}",
            core::mem::size_of::<Conn>()
        );
        assert_eq!(
            core::mem::size_of::<Option<Conn>>(),
            core::mem::size_of::<Conn>()
        );
    }
}
