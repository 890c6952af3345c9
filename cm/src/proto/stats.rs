//! Counters. Every MAD the core drops is counted here with its reason.

use core::fmt;

/// Why an incoming MAD was dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum DropReason {
    /// The bytes are not a valid CM MAD (bad header, truncated, …).
    Malformed,
    /// A CM attribute this CM does not handle (ClassPortInfo, unknown IDs).
    Unsupported,
    /// No connection has the comm ID the message names.
    UnknownCommId,
    /// A connection has the local ID but another remote ID (spoofed or stale).
    MismatchedCommId,
    /// The message is not expected in the connection's state.
    WrongState,
    /// A duplicate of a message already handled, with nothing to re-answer.
    Duplicate,
    /// A DREQ whose Remote QPN/EECN is not the connection's local QPN.
    QpnMismatch,
    /// A message about a connection from another address than the connection's peer (REP,
    /// RTU, MRA, REJ, DREQ, DREP, LAP, APR, or a REQ whose stale-connection check names a
    /// connection of another peer): source validation.
    WrongPeer,
    /// A SIDR message matching no request.
    UnknownSidr,
    /// An RTU for a REQ answered statelessly whose cookie is not that REQ's (forged, or
    /// guessed): docs/protocol.md §5.12.
    BadCookie,
    /// An RTU with a valid cookie whose time slot is over (`stateless_period`).
    ExpiredCookie,
    /// An RTU with a valid cookie that was taken (or refused) already: a replay.
    ReplayedCookie,
}

impl DropReason {
    /// Every reason, in order.
    pub const ALL: [DropReason; 12] = [
        DropReason::Malformed,
        DropReason::Unsupported,
        DropReason::UnknownCommId,
        DropReason::MismatchedCommId,
        DropReason::WrongState,
        DropReason::Duplicate,
        DropReason::QpnMismatch,
        DropReason::WrongPeer,
        DropReason::UnknownSidr,
        DropReason::BadCookie,
        DropReason::ExpiredCookie,
        DropReason::ReplayedCookie,
    ];

    /// Name for display.
    pub const fn name(self) -> &'static str {
        match self {
            DropReason::Malformed => "malformed",
            DropReason::Unsupported => "unsupported",
            DropReason::UnknownCommId => "unknown_comm_id",
            DropReason::MismatchedCommId => "mismatched_comm_id",
            DropReason::WrongState => "wrong_state",
            DropReason::Duplicate => "duplicate",
            DropReason::QpnMismatch => "qpn_mismatch",
            DropReason::WrongPeer => "wrong_peer",
            DropReason::UnknownSidr => "unknown_sidr",
            DropReason::BadCookie => "bad_cookie",
            DropReason::ExpiredCookie => "expired_cookie",
            DropReason::ReplayedCookie => "replayed_cookie",
        }
    }
}

/// Counters of one endpoint.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stats {
    /// MADs handed to `handle_datagram`.
    pub rx: u64,
    /// MADs handed out by `poll_transmit` (first sends and retransmissions).
    pub tx: u64,
    /// Retransmissions among `tx`.
    pub retransmits: u64,
    /// Replies re-sent because a duplicate request arrived.
    pub duplicate_replies: u64,
    /// Connections established.
    pub established: u64,
    /// REJs sent.
    pub rej_sent: u64,
    /// REJs received and matched.
    pub rej_received: u64,
    /// MRAs sent.
    pub mra_sent: u64,
    /// MRAs received and matched.
    pub mra_received: u64,
    /// Connection attempts that timed out (REQ or REP).
    pub timeouts: u64,
    /// REQs refused (REJ 3) because their source held `max_half_open_per_source` half-open
    /// entries.
    pub half_open_limit: u64,
    /// Half-open entries evicted (oldest first) to make room under `max_half_open` or
    /// `max_half_open_per_service`.
    pub half_open_evicted: u64,
    /// Half-open entries given up at `max_half_open_lifetime`.
    pub half_open_expired: u64,
    /// REQs refused (REJ 3) by `max_established` or `max_established_per_peer`.
    pub established_limit: u64,
    /// MADs not sent (REP retransmissions, REJs, MRAs) because the half-open peer had not
    /// proved it receives and 3 × what it sent had been sent to it (anti-amplification).
    pub amplification_limited: u64,
    /// Stale connections detected.
    pub stale: u64,
    /// DREPs sent for DREQs matching no connection.
    pub orphan_dreps: u64,
    /// Debug log lines suppressed by the core's rate limit (16 per second of endpoint time).
    pub log_suppressed: u64,
    /// Incoming SIDR_REQs forgotten unanswered (lifetime over, or evicted by the cap).
    pub sidr_in_expired: u64,
    /// REPs sent statelessly (docs/protocol.md §5.12), repeats for a repeated REQ included.
    pub stateless_replies: u64,
    /// Connections established from a cookie RTU.
    pub stateless_established: u64,
    /// Cookie RTUs refused with a REJ although their cookie was valid (listener gone, stale
    /// QPN, a limit, the REP's QPN in use).
    pub stateless_refused: u64,
    /// Unanswered REQs in the stateless table overwritten by a newer one in their time slot
    /// (their RTU, if it comes, finds nothing).
    pub stateless_overwritten: u64,
    /// Dropped MADs by reason (indexed by `DropReason as usize`).
    pub dropped: [u64; DropReason::ALL.len()],
}

impl Stats {
    /// Dropped MADs of one reason.
    pub fn dropped(&self, r: DropReason) -> u64 {
        self.dropped.get(r as usize).copied().unwrap_or(0)
    }

    /// All dropped MADs.
    pub fn dropped_total(&self) -> u64 {
        self.dropped.iter().sum()
    }

    /// Every counter but the drops, by name (the names of [`CmStats::to_json`](crate::rt::CmStats::to_json)
    /// where it has them).
    pub fn counters(&self) -> [(&'static str, u64); 23] {
        [
            ("rx", self.rx),
            ("tx", self.tx),
            ("retransmits", self.retransmits),
            ("duplicate_replies", self.duplicate_replies),
            ("established", self.established),
            ("rej_sent", self.rej_sent),
            ("rej_received", self.rej_received),
            ("mra_sent", self.mra_sent),
            ("mra_received", self.mra_received),
            ("timeouts", self.timeouts),
            ("half_open_limit", self.half_open_limit),
            ("half_open_evicted", self.half_open_evicted),
            ("half_open_expired", self.half_open_expired),
            ("established_limit", self.established_limit),
            ("amplification_limited", self.amplification_limited),
            ("stale", self.stale),
            ("orphan_dreps", self.orphan_dreps),
            ("log_suppressed", self.log_suppressed),
            ("sidr_in_expired", self.sidr_in_expired),
            ("stateless_replies", self.stateless_replies),
            ("stateless_established", self.stateless_established),
            ("stateless_refused", self.stateless_refused),
            ("stateless_overwritten", self.stateless_overwritten),
        ]
    }

    /// Sets the counter [`Stats::counters`] names `name`; false if there is none.
    pub fn set_counter(&mut self, name: &str, v: u64) -> bool {
        let c = match name {
            "rx" => &mut self.rx,
            "tx" => &mut self.tx,
            "retransmits" => &mut self.retransmits,
            "duplicate_replies" => &mut self.duplicate_replies,
            "established" => &mut self.established,
            "rej_sent" => &mut self.rej_sent,
            "rej_received" => &mut self.rej_received,
            "mra_sent" => &mut self.mra_sent,
            "mra_received" => &mut self.mra_received,
            "timeouts" => &mut self.timeouts,
            "half_open_limit" => &mut self.half_open_limit,
            "half_open_evicted" => &mut self.half_open_evicted,
            "half_open_expired" => &mut self.half_open_expired,
            "established_limit" => &mut self.established_limit,
            "amplification_limited" => &mut self.amplification_limited,
            "stale" => &mut self.stale,
            "orphan_dreps" => &mut self.orphan_dreps,
            "log_suppressed" => &mut self.log_suppressed,
            "sidr_in_expired" => &mut self.sidr_in_expired,
            "stateless_replies" => &mut self.stateless_replies,
            "stateless_established" => &mut self.stateless_established,
            "stateless_refused" => &mut self.stateless_refused,
            "stateless_overwritten" => &mut self.stateless_overwritten,
            _ => return false,
        };
        *c = v;
        true
    }

    pub(crate) fn drop(&mut self, r: DropReason) {
        if let Some(c) = self.dropped.get_mut(r as usize) {
            *c += 1;
        }
    }
}

impl fmt::Display for Stats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "rx={} tx={} retransmits={} dup_replies={} established={} rej_sent={} rej_rcvd={} \
             mra_sent={} mra_rcvd={} timeouts={} half_open_limit={} half_open_evicted={} \
             half_open_expired={} established_limit={} amplification_limited={} stale={} orphan_dreps={} sidr_in_expired={} \
             log_suppressed={} stateless_replies={} stateless_established={} stateless_refused={} \
             stateless_overwritten={}",
            self.rx,
            self.tx,
            self.retransmits,
            self.duplicate_replies,
            self.established,
            self.rej_sent,
            self.rej_received,
            self.mra_sent,
            self.mra_received,
            self.timeouts,
            self.half_open_limit,
            self.half_open_evicted,
            self.half_open_expired,
            self.established_limit,
            self.amplification_limited,
            self.stale,
            self.orphan_dreps,
            self.sidr_in_expired,
            self.log_suppressed,
            self.stateless_replies,
            self.stateless_established,
            self.stateless_refused,
            self.stateless_overwritten
        )?;
        for r in DropReason::ALL {
            let n = self.dropped(r);
            if n > 0 {
                write!(f, " dropped.{}={n}", r.name())?;
            }
        }
        Ok(())
    }
}
