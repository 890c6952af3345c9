//! The endpoint's records: one connection (its state, identifiers, the request waiting for an
//! answer and its timer), and the outgoing and incoming SIDR requests, which keep no
//! connection.

use std::time::{Duration, Instant};

use bytes::Bytes;
use ibcm_mad::{CommId, Guid, Qpn, ReqTransport, RequestId, ServiceId, Tid, TimeoutExp};

use super::peers::PeerId;
use super::timer::TimerKind;
use super::{LapState, PeerAddr, Side, State};

/// A request waiting for its answer, retransmitted unchanged.
#[derive(Debug)]
pub(super) struct Pending {
    pub(super) mad: Bytes,
    pub(super) retries_left: u8,
    pub(super) timeout: Duration,
    /// A REQ's [`ConnectParams::connect_timeout`](super::ConnectParams::connect_timeout):
    /// given up at this instant if still unanswered (REQ_SENT).
    pub(super) deadline: Option<Instant>,
}

/// Rarely needed per-connection data, boxed to keep [`Conn`] small.
#[derive(Debug, Default)]
pub(super) struct Extra {
    /// Private data of our RTU (to rebuild it for a duplicate REP).
    pub(super) rtu_private_data: Option<Box<[u8]>>,
    /// The last MRA we sent (re-sent on a duplicate of the message it acknowledged).
    pub(super) mra: Option<Bytes>,
    /// The last APR we sent (re-sent on a duplicate LAP).
    pub(super) apr: Option<Bytes>,
}

/// One connection.
#[derive(Debug)]
pub(super) struct Conn {
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
    /// The one armed timer: its deadline and kind ([`TimerKind::Resend`] while `pending` waits
    /// for an answer, [`TimerKind::Timewait`] in TimeWait).
    pub(super) timer: Option<(Instant, TimerKind)>,
    pub(super) pending: Option<Box<Pending>>,
    pub(super) extra: Option<Box<Extra>>,
}

impl Conn {
    /// The rarely needed data, created on first use.
    pub(super) fn extra(&mut self) -> &mut Extra {
        self.extra.get_or_insert_with(Box::default)
    }

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
    /// When it is forgotten unanswered (its `TimerKind::SidrIn` deadline).
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
