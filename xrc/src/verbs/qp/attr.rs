//! QP attributes: [`QpAttr`] (one `Option` per attribute, its mask derived from the fields
//! that are set), [`AttrMask`], and the value types inside ([`PathMtu`], [`AddressVector`],
//! [`AltPath`], …).

use core::fmt;
use core::ops::{BitAnd, BitOr, BitOrAssign, Not};

use ibcm_mad::{Psn, Qpn, U3};

use super::QpState;

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
