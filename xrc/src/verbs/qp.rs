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

use core::fmt;
use core::ops::{BitAnd, BitOr, BitOrAssign, Not};

use ibcm_mad::{Psn, Qpn, U3};

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

/// A set of QP attributes (`enum ibv_qp_attr_mask`, same bit values).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct AttrMask(u32);

impl AttrMask {
    /// No attribute.
    pub const EMPTY: Self = Self(0);
    /// `IBV_QP_STATE`.
    pub const STATE: Self = Self(1 << 0);
    /// `IBV_QP_CUR_STATE`.
    pub const CUR_STATE: Self = Self(1 << 1);
    /// `IBV_QP_EN_SQD_ASYNC_NOTIFY`.
    pub const EN_SQD_ASYNC_NOTIFY: Self = Self(1 << 2);
    /// `IBV_QP_ACCESS_FLAGS`.
    pub const ACCESS_FLAGS: Self = Self(1 << 3);
    /// `IBV_QP_PKEY_INDEX`.
    pub const PKEY_INDEX: Self = Self(1 << 4);
    /// `IBV_QP_PORT`.
    pub const PORT: Self = Self(1 << 5);
    /// `IBV_QP_QKEY`.
    pub const QKEY: Self = Self(1 << 6);
    /// `IBV_QP_AV`.
    pub const AV: Self = Self(1 << 7);
    /// `IBV_QP_PATH_MTU`.
    pub const PATH_MTU: Self = Self(1 << 8);
    /// `IBV_QP_TIMEOUT`.
    pub const TIMEOUT: Self = Self(1 << 9);
    /// `IBV_QP_RETRY_CNT`.
    pub const RETRY_CNT: Self = Self(1 << 10);
    /// `IBV_QP_RNR_RETRY`.
    pub const RNR_RETRY: Self = Self(1 << 11);
    /// `IBV_QP_RQ_PSN`.
    pub const RQ_PSN: Self = Self(1 << 12);
    /// `IBV_QP_MAX_QP_RD_ATOMIC`.
    pub const MAX_QP_RD_ATOMIC: Self = Self(1 << 13);
    /// `IBV_QP_ALT_PATH`.
    pub const ALT_PATH: Self = Self(1 << 14);
    /// `IBV_QP_MIN_RNR_TIMER`.
    pub const MIN_RNR_TIMER: Self = Self(1 << 15);
    /// `IBV_QP_SQ_PSN`.
    pub const SQ_PSN: Self = Self(1 << 16);
    /// `IBV_QP_MAX_DEST_RD_ATOMIC`.
    pub const MAX_DEST_RD_ATOMIC: Self = Self(1 << 17);
    /// `IBV_QP_PATH_MIG_STATE`.
    pub const PATH_MIG_STATE: Self = Self(1 << 18);
    /// `IBV_QP_DEST_QPN`.
    pub const DEST_QPN: Self = Self(1 << 20);

    const NAMES: [(Self, &'static str); 20] = [
        (Self::STATE, "STATE"),
        (Self::CUR_STATE, "CUR_STATE"),
        (Self::EN_SQD_ASYNC_NOTIFY, "EN_SQD_ASYNC_NOTIFY"),
        (Self::ACCESS_FLAGS, "ACCESS_FLAGS"),
        (Self::PKEY_INDEX, "PKEY_INDEX"),
        (Self::PORT, "PORT"),
        (Self::QKEY, "QKEY"),
        (Self::AV, "AV"),
        (Self::PATH_MTU, "PATH_MTU"),
        (Self::TIMEOUT, "TIMEOUT"),
        (Self::RETRY_CNT, "RETRY_CNT"),
        (Self::RNR_RETRY, "RNR_RETRY"),
        (Self::RQ_PSN, "RQ_PSN"),
        (Self::MAX_QP_RD_ATOMIC, "MAX_QP_RD_ATOMIC"),
        (Self::ALT_PATH, "ALT_PATH"),
        (Self::MIN_RNR_TIMER, "MIN_RNR_TIMER"),
        (Self::SQ_PSN, "SQ_PSN"),
        (Self::MAX_DEST_RD_ATOMIC, "MAX_DEST_RD_ATOMIC"),
        (Self::PATH_MIG_STATE, "PATH_MIG_STATE"),
        (Self::DEST_QPN, "DEST_QPN"),
    ];

    /// The raw `ibv_qp_attr_mask` bits.
    pub const fn bits(self) -> u32 {
        self.0
    }

    /// Whether every attribute of `other` is in `self`.
    pub const fn contains(self, other: Self) -> bool {
        self.0 & other.0 == other.0
    }

    /// Whether the set is empty.
    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }
}

impl BitOr for AttrMask {
    type Output = Self;
    fn bitor(self, rhs: Self) -> Self {
        Self(self.0 | rhs.0)
    }
}

impl BitOrAssign for AttrMask {
    fn bitor_assign(&mut self, rhs: Self) {
        self.0 |= rhs.0;
    }
}

impl BitAnd for AttrMask {
    type Output = Self;
    fn bitand(self, rhs: Self) -> Self {
        Self(self.0 & rhs.0)
    }
}

impl Not for AttrMask {
    type Output = Self;
    fn not(self) -> Self {
        Self(!self.0)
    }
}

impl fmt::Debug for AttrMask {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "AttrMask({self})")
    }
}

impl fmt::Display for AttrMask {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_empty() {
            return f.write_str("-");
        }
        let mut first = true;
        let mut rest = self.0;
        for (bit, name) in Self::NAMES {
            if self.contains(bit) {
                if !first {
                    f.write_str("|")?;
                }
                f.write_str(name)?;
                first = false;
                rest &= !bit.0;
            }
        }
        if rest != 0 {
            if !first {
                f.write_str("|")?;
            }
            write!(f, "{rest:#x}")?;
        }
        Ok(())
    }
}

/// Path MTU (`enum ibv_mtu`: 1 = 256 … 5 = 4096).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum PathMtu {
    /// 256 bytes.
    Mtu256,
    /// 512 bytes.
    Mtu512,
    /// 1024 bytes.
    Mtu1024,
    /// 2048 bytes.
    Mtu2048,
    /// 4096 bytes.
    Mtu4096,
}

impl PathMtu {
    /// The `ibv_mtu` value (1..=5), also the IBTA MTU code used in CM REQs.
    pub const fn raw(self) -> u32 {
        match self {
            Self::Mtu256 => 1,
            Self::Mtu512 => 2,
            Self::Mtu1024 => 3,
            Self::Mtu2048 => 4,
            Self::Mtu4096 => 5,
        }
    }

    /// The MTU for a code 1..=5.
    pub const fn from_raw(v: u32) -> Option<Self> {
        Some(match v {
            1 => Self::Mtu256,
            2 => Self::Mtu512,
            3 => Self::Mtu1024,
            4 => Self::Mtu2048,
            5 => Self::Mtu4096,
            _ => return None,
        })
    }

    /// The MTU in bytes.
    pub const fn bytes(self) -> u32 {
        128 << self.raw()
    }
}

/// Path migration state (`enum ibv_mig_state`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum MigState {
    /// 0: migrated.
    Migrated,
    /// 1: re-arm.
    Rearm,
    /// 2: armed.
    Armed,
}

impl MigState {
    /// The `ibv_mig_state` value.
    pub const fn raw(self) -> u32 {
        match self {
            Self::Migrated => 0,
            Self::Rearm => 1,
            Self::Armed => 2,
        }
    }
}

/// QP access flags (`enum ibv_access_flags`; the remote-access bits matter for QPs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct AccessFlags(pub u32);

impl AccessFlags {
    /// `IBV_ACCESS_LOCAL_WRITE`.
    pub const LOCAL_WRITE: Self = Self(1 << 0);
    /// `IBV_ACCESS_REMOTE_WRITE`.
    pub const REMOTE_WRITE: Self = Self(1 << 1);
    /// `IBV_ACCESS_REMOTE_READ`.
    pub const REMOTE_READ: Self = Self(1 << 2);
    /// `IBV_ACCESS_REMOTE_ATOMIC`.
    pub const REMOTE_ATOMIC: Self = Self(1 << 3);
}

impl BitOr for AccessFlags {
    type Output = Self;
    fn bitor(self, rhs: Self) -> Self {
        Self(self.0 | rhs.0)
    }
}

/// An address vector (`struct ibv_ah_attr`): how to reach the remote QP.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct AddressVector {
    /// Destination LID (0 or anything on RoCE, where the GRH addresses the peer).
    pub dlid: u16,
    /// Service level (4 bits).
    pub sl: u8,
    /// Source path bits.
    pub src_path_bits: u8,
    /// Static rate (`enum ibv_rate`; 0 = port rate).
    pub static_rate: u8,
    /// Local port, 1-based.
    pub port: u8,
    /// The global route header, required on RoCE.
    pub grh: Option<GlobalRoute>,
}

/// The GRH part of an address vector (`struct ibv_global_route`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct GlobalRoute {
    /// Destination GID (16 bytes, network order).
    pub dgid: [u8; 16],
    /// Flow label (20 bits).
    pub flow_label: u32,
    /// Source GID table index.
    pub sgid_index: u8,
    /// Hop limit.
    pub hop_limit: u8,
    /// Traffic class.
    pub traffic_class: u8,
}

/// An alternate path (`alt_ah_attr`, `alt_pkey_index`, `alt_port_num`, `alt_timeout`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct AltPath {
    /// Alternate address vector.
    pub av: AddressVector,
    /// Alternate P_Key index.
    pub pkey_index: u16,
    /// Alternate port.
    pub port: u8,
    /// Alternate local ACK timeout exponent (5 bits).
    pub timeout: u8,
}

/// Attributes for one `modify_qp` call. The attribute mask is the set of fields that are
/// `Some` ([`QpAttr::mask`]).
///
/// ```
/// use ibcm_xrc::verbs::qp::{check_modify, AttrMask, QpAttr, QpState, QpType, AccessFlags};
///
/// let init = QpAttr::to_init(0, 1, AccessFlags::default());
/// assert_eq!(init.mask(), AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT
///     | AttrMask::ACCESS_FLAGS);
/// assert_eq!(check_modify(QpType::XrcTgt, QpState::Reset, &init), Ok(QpState::Init));
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash, Default)]
pub struct QpAttr {
    /// `IBV_QP_STATE`: the state to move to.
    pub state: Option<QpState>,
    /// `IBV_QP_CUR_STATE`: the state the caller believes the QP is in.
    pub cur_state: Option<QpState>,
    /// `IBV_QP_EN_SQD_ASYNC_NOTIFY`.
    pub en_sqd_async_notify: Option<bool>,
    /// `IBV_QP_ACCESS_FLAGS`.
    pub access_flags: Option<AccessFlags>,
    /// `IBV_QP_PKEY_INDEX`.
    pub pkey_index: Option<u16>,
    /// `IBV_QP_PORT` (1-based).
    pub port: Option<u8>,
    /// `IBV_QP_QKEY` (UD only; never valid for the types here).
    pub qkey: Option<u32>,
    /// `IBV_QP_AV`.
    pub av: Option<AddressVector>,
    /// `IBV_QP_PATH_MTU`.
    pub path_mtu: Option<PathMtu>,
    /// `IBV_QP_TIMEOUT`: local ACK timeout exponent (5 bits, 4.096 µs·2ⁿ).
    pub timeout: Option<u8>,
    /// `IBV_QP_RETRY_CNT`.
    pub retry_cnt: Option<U3>,
    /// `IBV_QP_RNR_RETRY` (7 = infinite).
    pub rnr_retry: Option<U3>,
    /// `IBV_QP_RQ_PSN`.
    pub rq_psn: Option<Psn>,
    /// `IBV_QP_MAX_QP_RD_ATOMIC`.
    pub max_rd_atomic: Option<u8>,
    /// `IBV_QP_ALT_PATH`.
    pub alt_path: Option<AltPath>,
    /// `IBV_QP_MIN_RNR_TIMER` (5-bit code).
    pub min_rnr_timer: Option<u8>,
    /// `IBV_QP_SQ_PSN`.
    pub sq_psn: Option<Psn>,
    /// `IBV_QP_MAX_DEST_RD_ATOMIC`.
    pub max_dest_rd_atomic: Option<u8>,
    /// `IBV_QP_PATH_MIG_STATE`.
    pub path_mig_state: Option<MigState>,
    /// `IBV_QP_DEST_QPN`.
    pub dest_qpn: Option<Qpn>,
}

impl QpAttr {
    /// RESET→INIT attributes (the same for RC, XRC INI and XRC TGT).
    pub fn to_init(pkey_index: u16, port: u8, access: AccessFlags) -> Self {
        Self {
            state: Some(QpState::Init),
            pkey_index: Some(pkey_index),
            port: Some(port),
            access_flags: Some(access),
            ..Self::default()
        }
    }

    /// INIT→RTR attributes for an XRC TGT QP: `dest_qpn` is the peer's **INI** QPN
    /// (docs/xrc.md §1.6, `ibv_xsrq_pingpong` wiring).
    pub fn tgt_to_rtr(
        av: AddressVector,
        mtu: PathMtu,
        ini_qpn: Qpn,
        rq_psn: Psn,
        max_dest_rd_atomic: u8,
        min_rnr_timer: u8,
    ) -> Self {
        Self {
            state: Some(QpState::Rtr),
            av: Some(av),
            path_mtu: Some(mtu),
            dest_qpn: Some(ini_qpn),
            rq_psn: Some(rq_psn),
            max_dest_rd_atomic: Some(max_dest_rd_atomic),
            min_rnr_timer: Some(min_rnr_timer),
            ..Self::default()
        }
    }

    /// INIT→RTR attributes for an XRC INI QP: no responder, so no `MAX_DEST_RD_ATOMIC` and no
    /// `MIN_RNR_TIMER` (passing them is the Open MPI #1839 bug). `dest_qpn` is the **TGT** QPN.
    pub fn ini_to_rtr(av: AddressVector, mtu: PathMtu, tgt_qpn: Qpn, rq_psn: Psn) -> Self {
        Self {
            state: Some(QpState::Rtr),
            av: Some(av),
            path_mtu: Some(mtu),
            dest_qpn: Some(tgt_qpn),
            rq_psn: Some(rq_psn),
            ..Self::default()
        }
    }

    /// RTR→RTS attributes for an XRC TGT QP: only `TIMEOUT` and `SQ_PSN` are required.
    pub fn tgt_to_rts(timeout: u8, sq_psn: Psn) -> Self {
        Self {
            state: Some(QpState::Rts),
            timeout: Some(timeout),
            sq_psn: Some(sq_psn),
            ..Self::default()
        }
    }

    /// RTR→RTS attributes for an XRC INI (or RC) QP.
    pub fn ini_to_rts(
        timeout: u8,
        retry_cnt: U3,
        rnr_retry: U3,
        sq_psn: Psn,
        max_rd_atomic: u8,
    ) -> Self {
        Self {
            state: Some(QpState::Rts),
            timeout: Some(timeout),
            retry_cnt: Some(retry_cnt),
            rnr_retry: Some(rnr_retry),
            sq_psn: Some(sq_psn),
            max_rd_atomic: Some(max_rd_atomic),
            ..Self::default()
        }
    }

    /// Just a state change (e.g. to ERR or RESET).
    pub fn to_state(state: QpState) -> Self {
        Self {
            state: Some(state),
            ..Self::default()
        }
    }

    /// The attribute mask: one bit per field that is `Some`.
    pub fn mask(&self) -> AttrMask {
        let mut m = AttrMask::EMPTY;
        let mut set = |present: bool, bit: AttrMask| {
            if present {
                m |= bit;
            }
        };
        set(self.state.is_some(), AttrMask::STATE);
        set(self.cur_state.is_some(), AttrMask::CUR_STATE);
        set(
            self.en_sqd_async_notify.is_some(),
            AttrMask::EN_SQD_ASYNC_NOTIFY,
        );
        set(self.access_flags.is_some(), AttrMask::ACCESS_FLAGS);
        set(self.pkey_index.is_some(), AttrMask::PKEY_INDEX);
        set(self.port.is_some(), AttrMask::PORT);
        set(self.qkey.is_some(), AttrMask::QKEY);
        set(self.av.is_some(), AttrMask::AV);
        set(self.path_mtu.is_some(), AttrMask::PATH_MTU);
        set(self.timeout.is_some(), AttrMask::TIMEOUT);
        set(self.retry_cnt.is_some(), AttrMask::RETRY_CNT);
        set(self.rnr_retry.is_some(), AttrMask::RNR_RETRY);
        set(self.rq_psn.is_some(), AttrMask::RQ_PSN);
        set(self.max_rd_atomic.is_some(), AttrMask::MAX_QP_RD_ATOMIC);
        set(self.alt_path.is_some(), AttrMask::ALT_PATH);
        set(self.min_rnr_timer.is_some(), AttrMask::MIN_RNR_TIMER);
        set(self.sq_psn.is_some(), AttrMask::SQ_PSN);
        set(
            self.max_dest_rd_atomic.is_some(),
            AttrMask::MAX_DEST_RD_ATOMIC,
        );
        set(self.path_mig_state.is_some(), AttrMask::PATH_MIG_STATE);
        set(self.dest_qpn.is_some(), AttrMask::DEST_QPN);
        m
    }
}

/// Why [`check_modify`] refused a modify-QP call. The kernel answers all of these with
/// `EINVAL`; this type says which rule was broken.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ModifyError {
    /// The transition does not exist for this QP type (e.g. RESET→RTR, INIT→RTS).
    #[error("{qp_type} QP cannot go from {from} to {to}")]
    InvalidTransition {
        /// QP type.
        qp_type: QpType,
        /// Current state.
        from: QpState,
        /// Requested state.
        to: QpState,
    },
    /// A required attribute is missing.
    #[error("{qp_type} {from}->{to} requires {missing}")]
    MissingAttributes {
        /// QP type.
        qp_type: QpType,
        /// Current state.
        from: QpState,
        /// Requested state.
        to: QpState,
        /// The required attributes that were not given.
        missing: AttrMask,
    },
    /// An attribute is neither required nor optional for this transition.
    #[error("{qp_type} {from}->{to} does not accept {extra}")]
    UnexpectedAttributes {
        /// QP type.
        qp_type: QpType,
        /// Current state.
        from: QpState,
        /// Requested state.
        to: QpState,
        /// The attributes that are not allowed.
        extra: AttrMask,
    },
    /// `cur_state` was given and does not match the QP's state.
    #[error("cur_state {given} does not match the QP's state {actual}")]
    CurStateMismatch {
        /// What the caller said.
        given: QpState,
        /// What the QP is in.
        actual: QpState,
    },
    /// A value is out of range for its field.
    #[error("attribute {field} = {value} is out of range")]
    OutOfRange {
        /// Field name.
        field: &'static str,
        /// Offending value.
        value: u32,
    },
}

/// Required and optional attributes for a transition, or `None` if it is not allowed.
pub(crate) fn transition_rule(
    qp_type: QpType,
    from: QpState,
    to: QpState,
) -> Option<(AttrMask, AttrMask)> {
    use AttrMask as M;
    use QpState as S;
    let ini = qp_type == QpType::XrcIni;
    let tgt = qp_type == QpType::XrcTgt;
    let none = M::EMPTY;
    let rule = match (from, to) {
        (S::Reset, S::Reset) => (none, none),
        (S::Reset, S::Init) => (M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS, none),
        (S::Init | S::Rtr | S::Rts | S::Sqd | S::Sqe | S::Err, S::Reset | S::Err) => (none, none),
        (S::Init, S::Init) => (none, M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS),
        (S::Init, S::Rtr) => {
            let mut req = M::AV | M::PATH_MTU | M::DEST_QPN | M::RQ_PSN;
            if !ini {
                req |= M::MAX_DEST_RD_ATOMIC | M::MIN_RNR_TIMER;
            }
            (req, M::ALT_PATH | M::ACCESS_FLAGS | M::PKEY_INDEX)
        }
        (S::Rtr, S::Rts) => {
            let req = if tgt {
                M::TIMEOUT | M::SQ_PSN
            } else {
                M::TIMEOUT | M::RETRY_CNT | M::RNR_RETRY | M::SQ_PSN | M::MAX_QP_RD_ATOMIC
            };
            let mut opt = M::CUR_STATE | M::ALT_PATH | M::ACCESS_FLAGS | M::PATH_MIG_STATE;
            if !ini {
                opt |= M::MIN_RNR_TIMER;
            }
            (req, opt)
        }
        (S::Rts | S::Sqd, S::Rts) => {
            let mut opt = M::CUR_STATE | M::ACCESS_FLAGS | M::ALT_PATH | M::PATH_MIG_STATE;
            if !ini {
                opt |= M::MIN_RNR_TIMER;
            }
            (none, opt)
        }
        (S::Rts, S::Sqd) => (none, M::EN_SQD_ASYNC_NOTIFY),
        (S::Sqd, S::Sqd) => {
            let common = M::PORT
                | M::AV
                | M::TIMEOUT
                | M::ALT_PATH
                | M::ACCESS_FLAGS
                | M::PKEY_INDEX
                | M::PATH_MIG_STATE;
            let opt = match qp_type {
                QpType::Rc => {
                    common
                        | M::RETRY_CNT
                        | M::RNR_RETRY
                        | M::MAX_QP_RD_ATOMIC
                        | M::MAX_DEST_RD_ATOMIC
                        | M::MIN_RNR_TIMER
                }
                QpType::XrcIni => common | M::RETRY_CNT | M::RNR_RETRY | M::MAX_QP_RD_ATOMIC,
                QpType::XrcTgt => common | M::MAX_DEST_RD_ATOMIC | M::MIN_RNR_TIMER,
            };
            (none, opt)
        }
        _ => return None,
    };
    Some(rule)
}

/// Checks one modify-QP call against the rules above and returns the state the QP ends up
/// in. Without `state` in `attr` the QP stays in its current state (an attribute-only
/// modify, checked as the `cur → cur` transition).
///
/// # Errors
/// [`ModifyError`] naming the broken rule.
pub fn check_modify(qp_type: QpType, cur: QpState, attr: &QpAttr) -> Result<QpState, ModifyError> {
    let next = attr.state.unwrap_or(cur);
    let mask = attr.mask();
    if let Some(given) = attr.cur_state {
        if given != cur {
            return Err(ModifyError::CurStateMismatch { given, actual: cur });
        }
        if !matches!(
            cur,
            QpState::Rtr | QpState::Rts | QpState::Sqd | QpState::Sqe
        ) {
            return Err(ModifyError::UnexpectedAttributes {
                qp_type,
                from: cur,
                to: next,
                extra: AttrMask::CUR_STATE,
            });
        }
    }
    let (req, opt) = transition_rule(qp_type, cur, next).ok_or(ModifyError::InvalidTransition {
        qp_type,
        from: cur,
        to: next,
    })?;
    let missing = req & !mask;
    if !missing.is_empty() {
        return Err(ModifyError::MissingAttributes {
            qp_type,
            from: cur,
            to: next,
            missing,
        });
    }
    let extra = mask & !(req | opt | AttrMask::STATE);
    if !extra.is_empty() {
        return Err(ModifyError::UnexpectedAttributes {
            qp_type,
            from: cur,
            to: next,
            extra,
        });
    }
    check_ranges(attr)?;
    Ok(next)
}

fn check_ranges(attr: &QpAttr) -> Result<(), ModifyError> {
    let bad = |field: &'static str, value: u32| Err(ModifyError::OutOfRange { field, value });
    if let Some(t) = attr.timeout {
        if t > 31 {
            return bad("timeout", t.into());
        }
    }
    if let Some(t) = attr.min_rnr_timer {
        if t > 31 {
            return bad("min_rnr_timer", t.into());
        }
    }
    if attr.port == Some(0) {
        return bad("port", 0);
    }
    if let Some(av) = &attr.av {
        if av.sl > 15 {
            return bad("av.sl", av.sl.into());
        }
        if let Some(grh) = &av.grh {
            if grh.flow_label > 0xf_ffff {
                return bad("av.grh.flow_label", grh.flow_label);
            }
        }
    }
    if let Some(alt) = &attr.alt_path {
        if alt.timeout > 31 {
            return bad("alt_path.timeout", alt.timeout.into());
        }
    }
    Ok(())
}

/// A QP's state as tracked next to a handle: applies [`check_modify`] and remembers the
/// result, so a caller can refuse a bad transition before any verb is called.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct QpStateMachine {
    qp_type: QpType,
    state: QpState,
}

impl QpStateMachine {
    /// A new QP of `qp_type`, in RESET.
    pub(crate) const fn new(qp_type: QpType) -> Self {
        Self {
            qp_type,
            state: QpState::Reset,
        }
    }

    /// The current state.
    pub(crate) const fn state(&self) -> QpState {
        self.state
    }

    /// Validates `attr` and, if valid, moves to the resulting state.
    ///
    /// # Errors
    /// [`ModifyError`]; the state is unchanged then.
    pub(crate) fn apply(&mut self, attr: &QpAttr) -> Result<QpState, ModifyError> {
        let next = check_modify(self.qp_type, self.state, attr)?;
        self.state = next;
        Ok(next)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn psn(v: u32) -> Psn {
        Psn::new(v).unwrap()
    }
    fn qpn(v: u32) -> Qpn {
        Qpn::new(v).unwrap()
    }
    fn u3(v: u8) -> U3 {
        U3::new(v).unwrap()
    }

    fn walk(ty: QpType, steps: &[QpAttr]) -> Result<QpState, ModifyError> {
        let mut sm = QpStateMachine::new(ty);
        for s in steps {
            sm.apply(s)?;
        }
        Ok(sm.state())
    }

    #[test]
    fn tgt_reset_init_rtr_rts() {
        let st = walk(
            QpType::XrcTgt,
            &[
                QpAttr::to_init(0, 1, AccessFlags::default()),
                QpAttr::tgt_to_rtr(
                    AddressVector::default(),
                    PathMtu::Mtu1024,
                    qpn(0x11),
                    psn(1),
                    1,
                    12,
                ),
                QpAttr::tgt_to_rts(14, psn(7)),
            ],
        );
        assert_eq!(st, Ok(QpState::Rts));
    }

    #[test]
    fn ini_reset_init_rtr_rts() {
        let st = walk(
            QpType::XrcIni,
            &[
                QpAttr::to_init(0, 1, AccessFlags::default()),
                QpAttr::ini_to_rtr(
                    AddressVector::default(),
                    PathMtu::Mtu4096,
                    qpn(0x22),
                    psn(1),
                ),
                QpAttr::ini_to_rts(14, u3(7), u3(7), psn(9), 1),
            ],
        );
        assert_eq!(st, Ok(QpState::Rts));
    }

    #[test]
    fn ini_rtr_rejects_max_dest_rd_atomic_open_mpi_1839() {
        let mut a = QpAttr::ini_to_rtr(AddressVector::default(), PathMtu::Mtu1024, qpn(1), psn(1));
        a.max_dest_rd_atomic = Some(4);
        assert_eq!(
            check_modify(QpType::XrcIni, QpState::Init, &a),
            Err(ModifyError::UnexpectedAttributes {
                qp_type: QpType::XrcIni,
                from: QpState::Init,
                to: QpState::Rtr,
                extra: AttrMask::MAX_DEST_RD_ATOMIC,
            })
        );
        // The same attributes are *required* on an RC or TGT QP.
        let b = QpAttr::ini_to_rtr(AddressVector::default(), PathMtu::Mtu1024, qpn(1), psn(1));
        assert!(matches!(
            check_modify(QpType::XrcTgt, QpState::Init, &b),
            Err(ModifyError::MissingAttributes { missing, .. })
                if missing == AttrMask::MAX_DEST_RD_ATOMIC | AttrMask::MIN_RNR_TIMER
        ));
    }

    #[test]
    fn tgt_rts_needs_only_timeout_and_sq_psn() {
        let rc_style = QpAttr::ini_to_rts(14, u3(7), u3(7), psn(1), 1);
        let e = check_modify(QpType::XrcTgt, QpState::Rtr, &rc_style).unwrap_err();
        assert_eq!(
            e,
            ModifyError::UnexpectedAttributes {
                qp_type: QpType::XrcTgt,
                from: QpState::Rtr,
                to: QpState::Rts,
                extra: AttrMask::RETRY_CNT | AttrMask::RNR_RETRY | AttrMask::MAX_QP_RD_ATOMIC,
            }
        );
        let mut only_timeout = QpAttr::to_state(QpState::Rts);
        only_timeout.timeout = Some(14);
        assert!(matches!(
            check_modify(QpType::XrcTgt, QpState::Rtr, &only_timeout),
            Err(ModifyError::MissingAttributes { missing, .. }) if missing == AttrMask::SQ_PSN
        ));
    }

    #[test]
    fn invalid_transitions() {
        for (from, to) in [
            (QpState::Reset, QpState::Rtr),
            (QpState::Reset, QpState::Err),
            (QpState::Init, QpState::Rts),
            (QpState::Err, QpState::Init),
            (QpState::Rtr, QpState::Sqd),
            (QpState::Sqe, QpState::Rts),
        ] {
            let mut a = QpAttr::to_state(to);
            if to == QpState::Rts {
                a.timeout = Some(1);
                a.sq_psn = Some(psn(0));
            }
            assert!(
                matches!(
                    check_modify(QpType::XrcTgt, from, &a),
                    Err(ModifyError::InvalidTransition { .. })
                ),
                "{from}->{to}"
            );
        }
    }

    #[test]
    fn any_to_err_and_reset_take_no_attributes() {
        for from in [
            QpState::Init,
            QpState::Rtr,
            QpState::Rts,
            QpState::Sqd,
            QpState::Err,
        ] {
            assert_eq!(
                check_modify(QpType::XrcTgt, from, &QpAttr::to_state(QpState::Err)),
                Ok(QpState::Err)
            );
            assert_eq!(
                check_modify(QpType::XrcIni, from, &QpAttr::to_state(QpState::Reset)),
                Ok(QpState::Reset)
            );
            let mut a = QpAttr::to_state(QpState::Err);
            a.pkey_index = Some(0);
            assert!(check_modify(QpType::XrcTgt, from, &a).is_err());
        }
    }

    #[test]
    fn cur_state_only_from_rtr_rts_sqd() {
        let mut a = QpAttr::to_state(QpState::Init);
        a.cur_state = Some(QpState::Init);
        assert!(check_modify(QpType::Rc, QpState::Init, &a).is_err());
        let mut b = QpAttr {
            cur_state: Some(QpState::Rts),
            ..QpAttr::default()
        };
        assert_eq!(
            check_modify(QpType::XrcTgt, QpState::Rts, &b),
            Ok(QpState::Rts)
        );
        b.cur_state = Some(QpState::Rtr);
        assert_eq!(
            check_modify(QpType::XrcTgt, QpState::Rts, &b),
            Err(ModifyError::CurStateMismatch {
                given: QpState::Rtr,
                actual: QpState::Rts
            })
        );
    }

    #[test]
    fn sqd_sqd_differs_per_type() {
        let a = QpAttr {
            retry_cnt: Some(u3(3)),
            ..QpAttr::default()
        };
        assert!(check_modify(QpType::XrcIni, QpState::Sqd, &a).is_ok());
        assert!(check_modify(QpType::XrcTgt, QpState::Sqd, &a).is_err());
        let b = QpAttr {
            min_rnr_timer: Some(3),
            ..QpAttr::default()
        };
        assert!(check_modify(QpType::XrcTgt, QpState::Sqd, &b).is_ok());
        assert!(check_modify(QpType::XrcIni, QpState::Sqd, &b).is_err());
        assert!(check_modify(QpType::Rc, QpState::Sqd, &b).is_ok());
    }

    #[test]
    fn ranges() {
        let mut a = QpAttr::tgt_to_rts(32, psn(0));
        assert_eq!(
            check_modify(QpType::XrcTgt, QpState::Rtr, &a),
            Err(ModifyError::OutOfRange {
                field: "timeout",
                value: 32
            })
        );
        a.timeout = Some(31);
        assert!(check_modify(QpType::XrcTgt, QpState::Rtr, &a).is_ok());
        let z = QpAttr::to_init(0, 0, AccessFlags::default());
        assert!(check_modify(QpType::XrcTgt, QpState::Reset, &z).is_err());
    }

    #[test]
    fn failed_apply_keeps_state() {
        let mut sm = QpStateMachine::new(QpType::XrcTgt);
        assert!(sm.apply(&QpAttr::to_state(QpState::Rtr)).is_err());
        assert_eq!(sm.state(), QpState::Reset);
    }

    #[test]
    fn mask_display_and_names() {
        let m = AttrMask::AV | AttrMask::DEST_QPN;
        assert_eq!(m.to_string(), "AV|DEST_QPN");
        assert_eq!(AttrMask::EMPTY.to_string(), "-");
        assert_eq!(QpState::from_name("rtr"), Some(QpState::Rtr));
        assert_eq!(QpState::from_raw(6), Some(QpState::Err));
        assert_eq!(QpState::from_raw(7), None);
        assert_eq!(PathMtu::Mtu4096.bytes(), 4096);
        assert_eq!(PathMtu::from_raw(3), Some(PathMtu::Mtu1024));
    }
}
