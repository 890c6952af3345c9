//! QP states, attributes and the modify-QP rules for RC, XRC INI and XRC TGT QPs.
//!
//! [`check_modify`] answers the question the kernel's `ib_modify_qp_is_ok` answers: is this
//! transition allowed for this QP type, and are exactly the required attributes present with
//! no attribute outside the required ∪ optional set? A wrong mask is what broke Open MPI's XRC
//! INI path (issue #1839: `MAX_DEST_RD_ATOMIC` on an INI's INIT→RTR). docs/xrc.md §1.6.
//!
//! The attribute mask is never written by hand: [`QpAttr`] has one `Option` per attribute and
//! [`QpAttr::mask`] is the set of fields that are `Some`, so the mask and the values cannot
//! disagree.
//!
//! | Transition | RC | XRC INI | XRC TGT |
//! |---|---|---|---|
//! | RESET→INIT | R: PKEY_INDEX, PORT, ACCESS_FLAGS | same | same |
//! | INIT→INIT | O: PKEY_INDEX, PORT, ACCESS_FLAGS | same | same |
//! | INIT→RTR | R: AV, PATH_MTU, DEST_QPN, RQ_PSN, MAX_DEST_RD_ATOMIC, MIN_RNR_TIMER; O: ALT_PATH, ACCESS_FLAGS, PKEY_INDEX | R: AV, PATH_MTU, DEST_QPN, RQ_PSN; O: as RC | as RC |
//! | RTR→RTS | R: TIMEOUT, RETRY_CNT, RNR_RETRY, SQ_PSN, MAX_QP_RD_ATOMIC; O: CUR_STATE, ALT_PATH, ACCESS_FLAGS, MIN_RNR_TIMER, PATH_MIG_STATE | R: as RC; O: as RC minus MIN_RNR_TIMER | R: TIMEOUT, SQ_PSN; O: as RC |
//! | RTS→RTS, SQD→RTS | O: CUR_STATE, ACCESS_FLAGS, ALT_PATH, PATH_MIG_STATE, MIN_RNR_TIMER | O: as RC minus MIN_RNR_TIMER | O: as RC |
//! | RTS→SQD | O: EN_SQD_ASYNC_NOTIFY | same | same |
//! | SQD→SQD | O: PORT, AV, TIMEOUT, RETRY_CNT, RNR_RETRY, MAX_QP_RD_ATOMIC, MAX_DEST_RD_ATOMIC, ALT_PATH, ACCESS_FLAGS, PKEY_INDEX, MIN_RNR_TIMER, PATH_MIG_STATE | O: as RC minus MAX_DEST_RD_ATOMIC, MIN_RNR_TIMER | O: as RC minus RETRY_CNT, RNR_RETRY, MAX_QP_RD_ATOMIC |
//! | INIT, RTR, RTS, SQD, ERR → RESET or ERR; RESET→RESET | nothing | same | same |
//!
//! RESET→ERR is not allowed (the QP was never initialised). SQE is not a state
//! these QP types can reach. `CUR_STATE` is only accepted from RTR, RTS, SQD or SQE.
//!
//! This file has the states and QP types; `attr.rs` the attributes ([`QpAttr`], [`AttrMask`]
//! and the value types in them); `rules.rs` the table above as code ([`check_modify`],
//! [`ModifyError`]) and the per-handle state machine.

use core::fmt;

mod attr;
mod rules;
#[cfg(test)]
mod tests;

pub use attr::{
    AccessFlags, AddressVector, AltPath, AttrMask, GlobalRoute, MigState, PathMtu, QpAttr,
};
pub(crate) use rules::QpStateMachine;
pub use rules::{check_modify, ModifyError};

/// A QP state (`enum ibv_qp_state`, same numbering).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum QpState {
    /// 0: just created, or reset.
    Reset,
    /// 1: initialised (port, P_Key, access flags set).
    Init,
    /// 2: ready to receive.
    Rtr,
    /// 3: ready to send.
    Rts,
    /// 4: send queue drained.
    Sqd,
    /// 5: send queue error (UD/UC only).
    Sqe,
    /// 6: error.
    Err,
}

impl QpState {
    /// The `ibv_qp_state` value.
    pub const fn raw(self) -> u32 {
        match self {
            Self::Reset => 0,
            Self::Init => 1,
            Self::Rtr => 2,
            Self::Rts => 3,
            Self::Sqd => 4,
            Self::Sqe => 5,
            Self::Err => 6,
        }
    }

    /// The state for an `ibv_qp_state` value, `None` for `IBV_QPS_UNKNOWN` and anything else.
    pub const fn from_raw(v: u32) -> Option<Self> {
        Some(match v {
            0 => Self::Reset,
            1 => Self::Init,
            2 => Self::Rtr,
            3 => Self::Rts,
            4 => Self::Sqd,
            5 => Self::Sqe,
            6 => Self::Err,
            _ => return None,
        })
    }

    /// Short upper-case name ("RTR").
    pub const fn name(self) -> &'static str {
        match self {
            Self::Reset => "RESET",
            Self::Init => "INIT",
            Self::Rtr => "RTR",
            Self::Rts => "RTS",
            Self::Sqd => "SQD",
            Self::Sqe => "SQE",
            Self::Err => "ERR",
        }
    }

    /// Parses a name as printed by [`QpState::name`] (case-insensitive).
    pub fn from_name(s: &str) -> Option<Self> {
        [
            Self::Reset,
            Self::Init,
            Self::Rtr,
            Self::Rts,
            Self::Sqd,
            Self::Sqe,
            Self::Err,
        ]
        .into_iter()
        .find(|st| st.name().eq_ignore_ascii_case(s))
    }
}

impl fmt::Display for QpState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The QP types this crate deals with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum QpType {
    /// Reliable connected (`IBV_QPT_RC`, 2).
    Rc,
    /// XRC initiator, send only (`IBV_QPT_XRC_SEND`, 9; kernel `IB_QPT_XRC_INI`).
    XrcIni,
    /// XRC target, receive only, lives in an XRC domain (`IBV_QPT_XRC_RECV`, 10; kernel
    /// `IB_QPT_XRC_TGT`).
    XrcTgt,
}

impl QpType {
    /// The `ibv_qp_type` value.
    pub const fn raw(self) -> u32 {
        match self {
            Self::Rc => 2,
            Self::XrcIni => 9,
            Self::XrcTgt => 10,
        }
    }

    /// Short name ("XRC_TGT").
    pub const fn name(self) -> &'static str {
        match self {
            Self::Rc => "RC",
            Self::XrcIni => "XRC_INI",
            Self::XrcTgt => "XRC_TGT",
        }
    }
}

impl fmt::Display for QpType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
