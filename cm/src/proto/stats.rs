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

/// Defines [`Stats`] from one table of its counters: the fields (with their docs),
/// [`Stats::COUNTERS`], [`Stats::counters`], [`Stats::set_counter`] and the `Display` line
/// (`key=value` in table order, `key` the field's name or its `as "label"`). A counter is one
/// line of the table; `CmStats::to_json` and the node daemon's wire form follow
/// [`Stats::counters`].
macro_rules! stats {
    ($($(#[$doc:meta])* $name:ident $(as $label:literal)?,)*) => {
        /// Counters of one endpoint.
        #[derive(Debug, Clone, Default, PartialEq, Eq)]
        pub struct Stats {
            $($(#[$doc])* pub $name: u64,)*
            /// Dropped MADs by reason (indexed by `DropReason as usize`).
            pub dropped: [u64; DropReason::ALL.len()],
        }

        impl Stats {
            /// How many counters [`Stats::counters`] lists.
            pub const COUNTERS: usize = [$(stringify!($name)),*].len();

            /// The labels of the `Display` line, in the order of [`Stats::counters`].
            const LABELS: [&'static str; Self::COUNTERS] = [$(stats!(@label $name $($label)?)),*];

            /// Every counter but the drops, by name (the field's name; the names of
            /// [`CmStats::to_json`](crate::rt::CmStats::to_json) where it has them).
            pub fn counters(&self) -> [(&'static str, u64); Self::COUNTERS] {
                [$((stringify!($name), self.$name)),*]
            }

            /// Sets the counter [`Stats::counters`] names `name`; false if there is none.
            pub fn set_counter(&mut self, name: &str, v: u64) -> bool {
                let c = match name {
                    $(stringify!($name) => &mut self.$name,)*
                    _ => return false,
                };
                *c = v;
                true
            }
        }
    };
    (@label $name:ident) => { stringify!($name) };
    (@label $name:ident $label:literal) => { $label };
}

stats! {
    /// MADs handed to `handle_datagram`.
    rx,
    /// MADs handed out by `poll_transmit` (first sends and retransmissions).
    tx,
    /// Retransmissions among `tx`.
    retransmits,
    /// Replies re-sent because a duplicate request arrived.
    duplicate_replies as "dup_replies",
    /// Connections established.
    established,
    /// REJs sent.
    rej_sent,
    /// REJs received and matched.
    rej_received as "rej_rcvd",
    /// MRAs sent.
    mra_sent,
    /// MRAs received and matched.
    mra_received as "mra_rcvd",
    /// Connection attempts that timed out (REQ or REP).
    timeouts,
    /// REQs refused (REJ 3) because their source held `max_half_open_per_source` half-open
    /// entries.
    half_open_limit,
    /// Half-open entries evicted (oldest first) to make room under `max_half_open` or
    /// `max_half_open_per_service`.
    half_open_evicted,
    /// Half-open entries given up at `max_half_open_lifetime`.
    half_open_expired,
    /// REQs refused (REJ 3) by `max_established` or `max_established_per_peer`.
    established_limit,
    /// MADs not sent (REP retransmissions, REJs, MRAs) because the half-open peer had not
    /// proved it receives and 3 × what it sent had been sent to it (anti-amplification).
    amplification_limited,
    /// Stale connections detected.
    stale,
    /// DREPs sent for DREQs matching no connection.
    orphan_dreps,
    /// Incoming SIDR_REQs forgotten unanswered (lifetime over, or evicted by the cap).
    sidr_in_expired,
    /// Debug log lines suppressed by the core's rate limit (16 per second of endpoint time).
    log_suppressed,
    /// REPs sent statelessly (docs/protocol.md §5.12), repeats for a repeated REQ included.
    stateless_replies,
    /// Connections established from a cookie RTU.
    stateless_established,
    /// Cookie RTUs refused with a REJ although their cookie was valid (listener gone, stale
    /// QPN, a limit, the REP's QPN in use).
    stateless_refused,
    /// Unanswered REQs in the stateless table overwritten by a newer one in their time slot
    /// (their RTU, if it comes, finds nothing).
    stateless_overwritten,
    /// REQs that would have been answered statelessly but whose cookie QPN (the MAC's pick
    /// from the template's range) was in use or quarantined: they took the stateful path.
    stateless_qpn_in_use,
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

    pub(crate) fn drop(&mut self, r: DropReason) {
        if let Some(c) = self.dropped.get_mut(r as usize) {
            *c += 1;
        }
    }
}

impl fmt::Display for Stats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, (label, (_, n))) in Self::LABELS.iter().zip(self.counters()).enumerate() {
            let sep = if i == 0 { "" } else { " " };
            write!(f, "{sep}{label}={n}")?;
        }
        for r in DropReason::ALL {
            let n = self.dropped(r);
            if n > 0 {
                write!(f, " dropped.{}={n}", r.name())?;
            }
        }
        Ok(())
    }
}
