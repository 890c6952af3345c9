//! Connection states, in the order and with the names of Linux's `enum ib_cm_state`
//! (docs/protocol.md §4.7).

/// Connection state. Listening and SIDR are kept outside the connection table, so `Listen`,
/// `SidrReqSent` and `SidrReqRcvd` are not connection states here.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum State {
    /// No connection (a connection leaves the table in this state).
    Idle = 0,
    /// Active: REQ sent, waiting for REP.
    ReqSent = 2,
    /// Passive: REQ received, the application has not answered.
    ReqRcvd = 3,
    /// Passive: MRA sent for the REQ.
    MraReqSent = 4,
    /// Active: MRA received for our REQ.
    MraReqRcvd = 5,
    /// Passive: REP sent, waiting for RTU.
    RepSent = 6,
    /// Active: REP received, the application has not sent the RTU.
    RepRcvd = 7,
    /// Active: MRA sent for the REP.
    MraRepSent = 8,
    /// Passive: MRA received for our REP.
    MraRepRcvd = 9,
    /// Connected.
    Established = 10,
    /// DREQ sent, waiting for DREP.
    DreqSent = 11,
    /// DREQ received (transient: the DREP goes out at once).
    DreqRcvd = 12,
    /// Waiting for stray packets to drain before IDs and QPNs may be reused.
    Timewait = 13,
}

impl State {
    /// Every state, in the order of their numbers.
    pub const ALL: [State; 13] = [
        State::Idle,
        State::ReqSent,
        State::ReqRcvd,
        State::MraReqSent,
        State::MraReqRcvd,
        State::RepSent,
        State::RepRcvd,
        State::MraRepSent,
        State::MraRepRcvd,
        State::Established,
        State::DreqSent,
        State::DreqRcvd,
        State::Timewait,
    ];

    /// The kernel's name (`IB_CM_REQ_SENT` → `"REQ_SENT"`).
    pub const fn name(self) -> &'static str {
        match self {
            State::Idle => "IDLE",
            State::ReqSent => "REQ_SENT",
            State::ReqRcvd => "REQ_RCVD",
            State::MraReqSent => "MRA_REQ_SENT",
            State::MraReqRcvd => "MRA_REQ_RCVD",
            State::RepSent => "REP_SENT",
            State::RepRcvd => "REP_RCVD",
            State::MraRepSent => "MRA_REP_SENT",
            State::MraRepRcvd => "MRA_REP_RCVD",
            State::Established => "ESTABLISHED",
            State::DreqSent => "DREQ_SENT",
            State::DreqRcvd => "DREQ_RCVD",
            State::Timewait => "TIMEWAIT",
        }
    }

    /// A passive connection that has not been established yet (counted against
    /// [`EndpointConfig::max_half_open`](super::EndpointConfig::max_half_open)).
    pub const fn is_half_open_passive(self) -> bool {
        matches!(
            self,
            State::ReqRcvd | State::MraReqSent | State::RepSent | State::MraRepRcvd
        )
    }

    /// States in which the connection is being set up.
    pub const fn is_setup(self) -> bool {
        matches!(
            self,
            State::ReqSent
                | State::ReqRcvd
                | State::MraReqSent
                | State::MraReqRcvd
                | State::RepSent
                | State::RepRcvd
                | State::MraRepSent
                | State::MraRepRcvd
        )
    }
}

impl core::fmt::Display for State {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(self.name())
    }
}

/// Alternate-path (LAP) sub-state (`enum ib_cm_lap_state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
#[repr(u8)]
pub enum LapState {
    /// No LAP exchange has happened.
    #[default]
    Uninit = 0,
    /// Idle: a LAP may be sent or received.
    Idle = 1,
    /// LAP sent, waiting for APR.
    LapSent = 2,
    /// LAP received, the application has not answered.
    LapRcvd = 3,
    /// MRA sent for the LAP.
    MraLapSent = 4,
    /// MRA received for our LAP.
    MraLapRcvd = 5,
}

/// Which side of a connection this endpoint is: defined once, in the codec crate, because the
/// capture decoder (`ibcm-trace`) attributes messages to the same two sides.
pub use ibcm_mad::Side;
