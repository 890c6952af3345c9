//! The connection record: its two ends, its kind, what was seen of it (times, counters, the
//! ladder), and the types that describe how it ended.

use std::time::Duration;

use ibcm_mad::{
    AttrId, CommId, Gid, Guid, MsgKind, Qpn, RejReason, ServiceId, SidrStatus, TimeoutExp,
};

use super::data::{DataStats, Verdict};
use super::sa::SaLinks;
use crate::trace::{CmEvent, Icrc, WireAddr};

/// Which end of a connection sent a message (the workspace's one `Side`, from the codec).
pub(crate) use ibcm_mad::Side;

/// The kind of connection, from its REQ.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ConnKind {
    /// RC.
    Rc,
    /// UC.
    Uc,
    /// XRC (REQ Transport Service Type 3, Extended Transport Type 1).
    Xrc,
    /// Another transport type in the REQ (RD, unknown extended type).
    Other,
    /// The REQ is not in the capture.
    Unknown,
    /// A SIDR_REQ / SIDR_REP exchange.
    Sidr,
}

impl ConnKind {
    /// `"RC"`, `"UC"`, `"XRC"`, `"other"`, `"unknown"` or `"SIDR"`.
    pub const fn as_str(self) -> &'static str {
        match self {
            ConnKind::Rc => "RC",
            ConnKind::Uc => "UC",
            ConnKind::Xrc => "XRC",
            ConnKind::Other => "other",
            ConnKind::Unknown => "unknown",
            ConnKind::Sidr => "SIDR",
        }
    }
}

/// One end of a connection, as far as the capture shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct End {
    /// Address (IP, GID or LID) this end sends from.
    pub addr: Option<WireAddr>,
    /// CA GUID (REQ / REP `local_ca_guid`).
    pub ca_guid: Option<Guid>,
    /// Communication ID.
    pub comm_id: Option<CommId>,
    /// QPN (REQ / REP Local QPN; for an XRC target the TGT QPN from the REP's Local EECN).
    pub qpn: Option<Qpn>,
}

/// The phase in which a connection waited for an answer that never came.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Phase {
    /// REQ sent, no REP or REJ.
    Req,
    /// REP sent, no RTU or REJ.
    Rep,
    /// DREQ sent, no DREP.
    Dreq,
    /// SIDR_REQ sent, no SIDR_REP.
    SidrReq,
}

impl Phase {
    /// The message that went unanswered.
    pub const fn request(self) -> &'static str {
        match self {
            Phase::Req => "REQ",
            Phase::Rep => "REP",
            Phase::Dreq => "DREQ",
            Phase::SidrReq => "SIDR_REQ",
        }
    }

    /// The answer that never came.
    pub const fn answer(self) -> &'static str {
        match self {
            Phase::Req => "REP",
            Phase::Rep => "RTU",
            Phase::Dreq => "DREP",
            Phase::SidrReq => "SIDR_REP",
        }
    }
}

/// How a connection ended (as far as the capture shows).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Established and disconnected (DREQ, DREP).
    Closed {
        /// Who sent the DREQ (`None`: only the DREP was seen).
        by: Option<Side>,
    },
    /// Established and still open when the capture (or tracking) ended.
    Established,
    /// Rejected.
    Rejected {
        /// REJ reason.
        reason: RejReason,
        /// Who sent the REJ.
        by: Side,
    },
    /// A request went unanswered for longer than the sender's advertised timeout.
    TimedOut {
        /// What went unanswered.
        phase: Phase,
        /// How many times the request was sent.
        sends: u32,
    },
    /// The capture ended while a request was still within its timeout.
    Waiting {
        /// What was pending.
        phase: Phase,
    },
    /// A SIDR exchange that got its SIDR_REP.
    Resolved {
        /// SIDR_REP status.
        status: SidrStatus,
    },
    /// Messages of a connection whose REQ is not in the capture, with no end seen.
    Partial,
}

impl Outcome {
    /// A short machine-friendly name: `closed`, `established`, `rejected`, `timed_out`,
    /// `waiting`, `resolved`, `partial`.
    pub const fn as_str(&self) -> &'static str {
        match self {
            Outcome::Closed { .. } => "closed",
            Outcome::Established => "established",
            Outcome::Rejected { .. } => "rejected",
            Outcome::TimedOut { .. } => "timed_out",
            Outcome::Waiting { .. } => "waiting",
            // A SIDR_REP with a non-zero status (as `--stats` counts it).
            Outcome::Resolved { status } if status.raw() != 0 => "failed",
            Outcome::Resolved { .. } => "resolved",
            Outcome::Partial => "partial",
        }
    }
}

/// Extra detail of a ladder entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Detail {
    /// Nothing to add.
    None,
    /// REJ: reason and which message was rejected.
    Rej(RejReason, MsgKind),
    /// MRA: which message, and the service timeout.
    Mra(MsgKind, TimeoutExp),
    /// SIDR_REP status.
    Sidr(SidrStatus),
}

/// One message in a connection's ladder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LadderEntry {
    /// Frame number.
    pub frame: u64,
    /// Capture time.
    pub time: Duration,
    /// Who sent it.
    pub from: Side,
    /// Which message.
    pub attr: AttrId,
    /// Extra detail.
    pub detail: Detail,
    /// A repeat of an earlier message in a new packet (new BTH PSN).
    pub retrans: bool,
    /// The same packet as an earlier entry, captured twice (same BTH PSN).
    pub dup: bool,
    /// ICRC verdict.
    pub icrc: Icrc,
}

/// How many message signatures a connection remembers for retransmission detection.
pub(super) const SIGS: usize = 8;

/// A tracked connection.
// `repr(C)` keeps `id` first, so that `index::prefetch_conn` can name every cache line of it.
#[derive(Debug, Clone)]
#[repr(C)]
pub struct Conn {
    /// Connection number: 1, 2, … in order of first appearance in the file.
    pub id: u64,
    /// Kind.
    pub kind: ConnKind,
    /// The side that sent the REQ.
    pub active: End,
    /// The side that answered.
    pub passive: End,
    /// Service ID (REQ, SIDR_REQ).
    pub service_id: Option<ServiceId>,
    /// The REQ's primary path GIDs (local = the active side's, remote = the passive side's):
    /// on native IB the packets carry only LIDs, so `-a GID` matches the connection by them.
    pub path_gids: Option<(Gid, Gid)>,
    /// SIDR Request ID.
    pub request_id: Option<u32>,
    /// Time of the first message.
    pub first: Duration,
    /// Time of the last message.
    pub last: Duration,
    /// First frame number.
    pub first_frame: u64,
    /// First REQ (or SIDR_REQ) time.
    pub req: Option<Duration>,
    /// Last REQ time.
    pub(super) req_last: Option<Duration>,
    /// REQ transmissions.
    pub req_sends: u32,
    /// First REP time.
    pub rep: Option<Duration>,
    pub(super) rep_last: Option<Duration>,
    /// REP transmissions.
    pub rep_sends: u32,
    /// First RTU time.
    pub rtu: Option<Duration>,
    /// First DREQ: time and sender.
    pub dreq: Option<(Duration, Side)>,
    pub(super) dreq_last: Option<Duration>,
    /// DREQ transmissions.
    pub dreq_sends: u32,
    /// First DREP time.
    pub drep: Option<Duration>,
    /// First REJ: time, sender, reason.
    pub rej: Option<(Duration, Side, RejReason)>,
    /// SIDR_REP: time and status.
    pub sidr_rep: Option<(Duration, SidrStatus)>,
    /// MRAs (not counting retransmitted ones).
    pub mras: u32,
    /// Last MRA: time and service timeout.
    pub(super) mra_last: Option<(Duration, TimeoutExp)>,
    /// LAP and APR messages.
    pub lap_apr: u32,
    /// Repeats of a message in a new packet (new BTH PSN).
    pub retransmissions: u32,
    /// The same packet captured twice (same BTH PSN; merged captures): not counted as messages.
    pub duplicates: u32,
    /// Messages with a bad ICRC.
    pub bad_icrc: u32,
    /// All messages, repeats included.
    pub messages: u32,
    /// REQ timeouts: Remote CM Response Timeout, Local CM Response Timeout, primary path Local
    /// ACK Timeout, Max CM Retries.
    pub(super) req_timeouts: Option<(TimeoutExp, TimeoutExp, TimeoutExp, u8)>,
    /// Recorded ladder entries (empty unless
    /// [`TrackerConfig::record_events`](super::TrackerConfig::record_events)).
    pub events: Vec<LadderEntry>,
    /// Entries not recorded because of
    /// [`TrackerConfig::max_events`](super::TrackerConfig::max_events).
    pub events_dropped: u32,
    pub(super) sigs: [u64; SIGS],
    /// The BTH PSN of the packet that carried each signature.
    pub(super) sig_psns: [u32; SIGS],
    pub(super) sig_next: usize,
    /// Finished at: when set, the connection ended and waits out the grace period.
    pub(super) ended: Option<Duration>,
    /// Why tracking stopped early ("evicted").
    pub evicted: bool,
    /// Outcome, set when finished.
    pub outcome: Outcome,
    /// The RC traffic on the connection's QPNs, when
    /// [`TrackerConfig::data`](super::TrackerConfig::data) is set (boxed: the CM-only views
    /// carry a pointer, not the counters).
    pub data: Option<Box<DataStats>>,
    /// Its QPN keys are in the tracker's data index.
    pub(super) data_keyed: bool,
    /// The SA PathRecord exchanges its REQ's paths follow (boxed: most connections have
    /// none).
    pub(crate) sa: Option<Box<SaLinks>>,
}

impl Conn {
    pub(super) fn new(id: u64, ev: &CmEvent, kind: ConnKind) -> Self {
        Conn {
            id,
            kind,
            active: End::default(),
            passive: End::default(),
            service_id: None,
            path_gids: None,
            request_id: None,
            first: ev.time,
            last: ev.time,
            first_frame: ev.frame,
            req: None,
            req_last: None,
            req_sends: 0,
            rep: None,
            rep_last: None,
            rep_sends: 0,
            rtu: None,
            dreq: None,
            dreq_last: None,
            dreq_sends: 0,
            drep: None,
            rej: None,
            sidr_rep: None,
            mras: 0,
            mra_last: None,
            lap_apr: 0,
            retransmissions: 0,
            duplicates: 0,
            bad_icrc: 0,
            messages: 0,
            req_timeouts: None,
            events: Vec::new(),
            events_dropped: 0,
            sigs: [0; SIGS],
            sig_psns: [0; SIGS],
            sig_next: 0,
            ended: None,
            evicted: false,
            outcome: Outcome::Partial,
            data: None,
            data_keyed: false,
            sa: None,
        }
    }

    /// The data-path verdict (`crate::conn` `data` module): for a connection that was
    /// established, or a SIDR exchange that resolved (status 0).
    pub fn data_verdict(&self) -> Option<Verdict> {
        let d = self.data.as_deref()?;
        let up = if self.kind == ConnKind::Sidr {
            self.sidr_rep.is_some_and(|(_, s)| s == SidrStatus::Success)
        } else {
            self.established()
        };
        d.verdict(up)
    }

    /// The last sign of life: the last message, or for a SIDR exchange (which has no
    /// teardown) also the last UD packet on the QP it resolved.
    pub(super) fn activity(&self) -> Duration {
        match (&self.data, self.kind) {
            (Some(d), ConnKind::Sidr) => d.last.map_or(self.last, |l| l.max(self.last)),
            _ => self.last,
        }
    }

    /// Whether the connection reached ESTABLISHED (RTU seen, or a DREQ/DREP after a REP).
    pub fn established(&self) -> bool {
        self.rtu.is_some() || (self.dreq.is_some() || self.drep.is_some())
    }

    /// REQ → RTU (first REQ to first RTU).
    pub fn setup_latency(&self) -> Option<Duration> {
        let (req, rtu) = (self.req?, self.rtu?);
        rtu.checked_sub(req)
    }

    /// DREQ → DREP (first DREQ to first DREP).
    pub fn teardown_latency(&self) -> Option<Duration> {
        let ((dreq, _), drep) = (self.dreq?, self.drep?);
        drep.checked_sub(dreq)
    }

    /// Whether the connection is XRC.
    pub fn is_xrc(&self) -> bool {
        self.kind == ConnKind::Xrc
    }

    /// Whether something went wrong: rejected, timed out, retransmissions, a bad ICRC, or a
    /// REQ path that disagrees with the SA PathRecord it follows.
    pub fn has_problem(&self) -> bool {
        self.has_message_problem() || matches!(self.outcome, Outcome::TimedOut { .. })
    }

    /// Whether a message so far showed a problem (what the per-MAD views mark): a REJ,
    /// retransmissions, a bad ICRC, or a REQ path that disagrees with its SA PathRecord.
    pub(crate) fn has_message_problem(&self) -> bool {
        self.rej.is_some() || self.retransmissions > 0 || self.bad_icrc > 0 || self.sa_differs()
    }

    /// Whether its REQ disagrees with an SA PathRecord it follows.
    pub(crate) fn sa_differs(&self) -> bool {
        self.sa.as_deref().is_some_and(SaLinks::differs)
    }

    /// The end of `side`.
    pub fn end(&self, side: Side) -> &End {
        match side {
            Side::Active => &self.active,
            Side::Passive => &self.passive,
        }
    }

    /// Whether `g` is one of the REQ's primary path GIDs.
    pub fn has_path_gid(&self, g: Gid) -> bool {
        self.path_gids.is_some_and(|(l, r)| l == g || r == g)
    }

    /// Whether `side`'s end is known to have `id` as comm ID.
    pub fn has_comm_id(&self, id: CommId) -> bool {
        self.active.comm_id == Some(id) || self.passive.comm_id == Some(id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outcome_names() {
        assert_eq!(Outcome::Partial.as_str(), "partial");
        assert_eq!(
            Outcome::TimedOut {
                phase: Phase::Req,
                sends: 3
            }
            .as_str(),
            "timed_out"
        );
    }
}
