//! The wire values the XRC formats carry: ownership policy, "gone" cause, SRQ number.

use core::fmt;

use super::XrcDataError;

/// How long a TGT QP lives: chosen when it is created (seed thread options 1, 2a, 2b, plus
/// OFED's reference count). One byte on the wire (`01`..`04`) in [`XrcReqData`] and
/// [`XrcRepData`]; the rules themselves are `ibcm_xrc::policy`'s.
///
/// [`XrcReqData`]: super::XrcReqData
/// [`XrcRepData`]: super::XrcRepData
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum OwnershipPolicy {
    /// Lives until its owner destroys it (seed option 1). Survives its creator (it is then
    /// an orphan any process may adopt or destroy) and pins its domain open.
    Explicit,
    /// Survives its creator; destroyed when its domain is closed (option 2a). On modern
    /// kernels this needs a keeper holding a handle (docs/xrc.md §7).
    DomainBound,
    /// Destroyed when the creating process exits (option 2b).
    ProcessBound,
    /// OFED-style reference count: any process (or connection) registers and unregisters;
    /// destroyed at the last unregistration, including one caused by a process dying.
    Shared,
}

impl OwnershipPolicy {
    /// All four, in matrix order.
    pub const ALL: [Self; 4] = [
        Self::Explicit,
        Self::DomainBound,
        Self::ProcessBound,
        Self::Shared,
    ];

    /// Wire code (REQ/REP private data): 1..=4.
    pub const fn code(self) -> u8 {
        match self {
            Self::Explicit => 1,
            Self::DomainBound => 2,
            Self::ProcessBound => 3,
            Self::Shared => 4,
        }
    }

    /// The policy for a wire code.
    pub const fn from_code(c: u8) -> Option<Self> {
        Some(match c {
            1 => Self::Explicit,
            2 => Self::DomainBound,
            3 => Self::ProcessBound,
            4 => Self::Shared,
            _ => return None,
        })
    }

    /// Lower-case name with a dash (`domain-bound`), as the keeper prints it.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Explicit => "explicit",
            Self::DomainBound => "domain-bound",
            Self::ProcessBound => "process-bound",
            Self::Shared => "shared",
        }
    }

    /// Parses [`OwnershipPolicy::name`] (also accepts `DomainBound` style and `_`).
    pub fn from_name(s: &str) -> Option<Self> {
        let norm: String = s
            .chars()
            .filter(|c| c.is_ascii_alphanumeric())
            .map(|c| c.to_ascii_lowercase())
            .collect();
        Self::ALL
            .into_iter()
            .find(|p| p.name().replace('-', "") == norm)
    }
}

impl fmt::Display for OwnershipPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The optional policy byte of a REQ: `00` means "the target's default".
pub(super) fn policy_code(p: Option<OwnershipPolicy>) -> u8 {
    p.map_or(0, OwnershipPolicy::code)
}

pub(super) fn policy_from(code: u8) -> Result<Option<OwnershipPolicy>, XrcDataError> {
    if code == 0 {
        return Ok(None);
    }
    OwnershipPolicy::from_code(code)
        .map(Some)
        .ok_or(XrcDataError::InvalidField {
            field: "policy",
            value: code.into(),
        })
}

/// Why a TGT QP went away (the `cause` byte of [`TargetGone`](super::TargetGone)).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum GoneCause {
    /// `01`: its owner destroyed it.
    OwnerDestroyed,
    /// `02`: its domain was closed.
    DomainClosed,
    /// `03`: the process that created it exited.
    CreatorExited,
    /// `04`: the last registered process unregistered (or died).
    LastUnregistered,
    /// `05`: the keeper that held it was lost (crash or restart).
    KeeperLost,
    /// `06`: the last connection that held a registration on it left (peer DREQ or timeout).
    PeerLeft,
    /// `07`: no such TGT QP is known (never existed, or forgotten after quarantine).
    Unknown,
}

impl GoneCause {
    /// All seven, in code order.
    pub const ALL: [Self; 7] = [
        Self::OwnerDestroyed,
        Self::DomainClosed,
        Self::CreatorExited,
        Self::LastUnregistered,
        Self::KeeperLost,
        Self::PeerLeft,
        Self::Unknown,
    ];

    /// The wire code.
    pub const fn code(self) -> u8 {
        match self {
            Self::OwnerDestroyed => 1,
            Self::DomainClosed => 2,
            Self::CreatorExited => 3,
            Self::LastUnregistered => 4,
            Self::KeeperLost => 5,
            Self::PeerLeft => 6,
            Self::Unknown => 7,
        }
    }

    /// The cause for a wire code.
    pub const fn from_code(c: u8) -> Option<Self> {
        Some(match c {
            1 => Self::OwnerDestroyed,
            2 => Self::DomainClosed,
            3 => Self::CreatorExited,
            4 => Self::LastUnregistered,
            5 => Self::KeeperLost,
            6 => Self::PeerLeft,
            7 => Self::Unknown,
            _ => return None,
        })
    }

    /// Human-readable text.
    pub const fn text(self) -> &'static str {
        match self {
            Self::OwnerDestroyed => "owner destroyed it",
            Self::DomainClosed => "domain closed",
            Self::CreatorExited => "creator exited",
            Self::LastUnregistered => "last registration dropped",
            Self::KeeperLost => "keeper lost",
            Self::PeerLeft => "last connection left",
            Self::Unknown => "no such TGT QP",
        }
    }
}

impl fmt::Display for GoneCause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.text())
    }
}

/// An XRC SRQ number (24 bits): what a sender puts in each XRC work request to pick the
/// receive queue on the target node (`ibv_get_srq_num`; docs/xrc.md §1.5).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct SrqNum(u32);

impl SrqNum {
    /// Width of the number, in bits.
    pub const BITS: u32 = 24;
    /// Largest valid SRQ number.
    pub const MAX: u32 = (1 << 24) - 1;

    /// The SRQ number, or `None` if `v` needs more than 24 bits.
    pub const fn new(v: u32) -> Option<Self> {
        if v <= Self::MAX {
            Some(Self(v))
        } else {
            None
        }
    }

    /// The low 24 bits of `v` (for a field that is 24 bits wide on the wire).
    pub const fn masked(v: u32) -> Self {
        Self(v & Self::MAX)
    }

    /// The raw value.
    pub const fn get(self) -> u32 {
        self.0
    }
}

impl fmt::Debug for SrqNum {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SrqNum({:#08x})", self.0)
    }
}

impl fmt::Display for SrqNum {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#08x}", self.0)
    }
}
