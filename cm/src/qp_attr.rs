//! QP attributes for INIT, RTR and RTS from a connection's REQ and REP: the equivalent of the
//! Linux kernel's `ib_cm_init_qp_attr` (and of librdmacm's `rdma_init_qp_attr` over it).
//!
//! [`qp_attr`] is a pure function. Given the REQ and the REP of one connection, which side we
//! are ([`Side`]) and a few facts about the local port that are not in the messages
//! ([`LocalPort`]), it returns the attributes ([`QpAttr`]) and the attribute mask
//! ([`QpAttrMask`]) to hand to `ibv_modify_qp` for the transition to [`QpState::Init`],
//! [`QpState::Rtr`] or [`QpState::Rts`], for RC, UC, XRC INI and XRC TGT QPs ([`QpType`]).
//! The mask bits and the access flags have the values of rdma-core's `IBV_QP_*` and
//! `IBV_ACCESS_*`, so a verbs layer maps them one to one. Only the fields named by the mask
//! are set; the others keep their [`Default`].
//!
//! The values are the ones the kernel CM computes once the REP is known: on the passive side
//! from the REP it formats (`ib_send_cm_rep`, state REP_SENT onwards: the passive side moves
//! its QP to RTR, or RTS, before it sends that REP), on the active side from the REP it
//! received (`cm_rep_handler`, state REP_RCVD onwards: the active side moves to RTR and RTS
//! before it sends the RTU). The PSNs are taken from the messages; choosing random starting
//! PSNs is the endpoint's job.
//!
//! # Example
//! ```
//! use ibcm::mad::{Psn, Qpn, Rep, Req};
//! use ibcm::qp_attr::{qp_attr, Connection, LinkLayer, LocalPort, QpAttrMask, QpState, Side};
//!
//! let mut req = Req::default();
//! req.local_qpn = Qpn::masked(0x18);
//! req.starting_psn = Psn::masked(0x647bbb);
//! let mut rep = Rep::default();
//! rep.starting_psn = Psn::masked(0x0fd2ad);
//! rep.responder_resources = 1;
//!
//! // The passive side, moving its QP to RTR before it sends this REP.
//! let conn = Connection::new(&req, &rep, Side::Passive, LinkLayer::Ethernet, LocalPort::default());
//! let (attr, mask) = qp_attr(&conn, QpState::Rtr)?;
//! assert!(mask.contains(QpAttrMask::AV | QpAttrMask::DEST_QPN | QpAttrMask::RQ_PSN));
//! assert_eq!(attr.dest_qp_num, req.local_qpn);
//! assert_eq!(attr.rq_psn, rep.starting_psn);
//! assert_eq!(attr.max_dest_rd_atomic, 1);
//! // ... and to RTS: it sends from the PSN the REQ asked for.
//! let (attr, _) = qp_attr(&conn, QpState::Rts)?;
//! assert_eq!(attr.sq_psn, req.starting_psn);
//! # Ok::<(), ibcm::qp_attr::QpAttrError>(())
//! ```
//!
//! # Where each field comes from
//!
//! "REQ.x" and "REP.x" are fields of the messages ([`Req`], [`Rep`]); "path" is the REQ's
//! primary path (alternate path for the `alt_*` fields). The kernel function is named where
//! the rule lives (`drivers/infiniband/core/cm.c` unless said otherwise).
//!
//! | Field (mask bit) | State | Passive side | Active side | Kernel rule |
//! |---|---|---|---|---|
//! | `qp_access_flags` (`ACCESS_FLAGS`) | INIT | REMOTE_WRITE, plus REMOTE_READ and REMOTE_ATOMIC when REP.responder_resources ≠ 0 | the same with REP.initiator_depth | `cm_init_qp_init_attr` on `cm_id_priv->responder_resources` (`ib_send_cm_rep` / `cm_rep_handler`) |
//! | `pkey_index`, `port_num` (`PKEY_INDEX`, `PORT`) | INIT | [`LocalPort`] (the index of REQ.partition_key in the port's P_Key table) | the same | `cm_init_qp_init_attr` (`cm_init_av_by_path`: `ib_find_cached_pkey`) |
//! | `ah_attr.dlid` (`AV`) | RTR | path.local_lid (IB); 0 on RoCE | path.remote_lid (IB); 0 on RoCE | `cm_format_path_lid_from_req` (passive), the path record (active) |
//! | `ah_attr.grh.dgid` | RTR | path.local_gid | path.remote_gid | `cm_format_paths_from_req` |
//! | `ah_attr.grh.flow_label`, `traffic_class` | RTR | path | path | `cm_format_paths_from_req`, `ib_init_ah_attr_from_path` |
//! | `ah_attr.grh.hop_limit` | RTR | the received REQ's GRH hop limit when given ([`Connection::received_hop_limit`]), else path.hop_limit | path.hop_limit | `cm_req_handler` (`work->path[0].hop_limit = grh->hop_limit`) |
//! | `ah_attr.grh` present | RTR | always on RoCE; on IB iff the hop limit > 0 | the same | `ib_init_ah_attr_from_path` |
//! | `ah_attr.sl`, `static_rate` | RTR | path.sl, path.packet_rate | the same | `ib_init_ah_attr_from_path` |
//! | `ah_attr.src_path_bits` | RTR | path.remote_lid & (2^LMC − 1) on IB | path.local_lid & (2^LMC − 1) | `ib_init_ah_attr_from_path` (`get_src_path_mask`) |
//! | `path_mtu` (`PATH_MTU`) | RTR | REQ.path_mtu | REQ.path_mtu | `cm_req_handler` / `ib_send_cm_req` (`path_mtu`) |
//! | `dest_qp_num` (`DEST_QPN`) | RTR | REQ.local_qpn (for XRC: the INI QPN) | REP.local_qpn; XRC INI: REP.local_eecn (the TGT QPN) | `cm_req_handler`, `cm_rep_get_qpn` |
//! | `rq_psn` (`RQ_PSN`) | RTR | REP.starting_psn | REQ.starting_psn | `ib_send_cm_rep` / `ib_send_cm_req` (`rq_psn`) |
//! | `max_dest_rd_atomic` (`MAX_DEST_RD_ATOMIC`) | RTR, RC and XRC TGT | REP.responder_resources | REP.initiator_depth | `cm_init_qp_rtr_attr`; `ib_send_cm_rep` / `cm_rep_handler` |
//! | `min_rnr_timer` (`MIN_RNR_TIMER`) | RTR, RC and XRC TGT | 0 | 0 | `cm_init_qp_rtr_attr` |
//! | `alt_*` (`ALT_PATH`) | RTR, when the REQ has an alternate path with a DLID (IB only) | as for the primary path, from the alternate path | the same | `cm_init_qp_rtr_attr` (`rdma_ah_get_dlid(&alt_av.ah_attr)`) |
//! | `sq_psn` (`SQ_PSN`) | RTS | REQ.starting_psn | REP.starting_psn | `cm_req_handler` / `cm_rep_handler` (`sq_psn`) |
//! | `retry_cnt` (`RETRY_CNT`) | RTS, RC and XRC INI | REQ.retry_count | REQ.retry_count, or [`Connection::retry_count`] | `cm_req_handler` / `ib_send_cm_req` (`retry_count`) |
//! | `rnr_retry` (`RNR_RETRY`) | RTS, RC and XRC INI | REQ.rnr_retry_count | REP.rnr_retry_count | `cm_req_handler` / `cm_rep_handler` |
//! | `max_rd_atomic` (`MAX_QP_RD_ATOMIC`) | RTS, RC and XRC INI | REP.initiator_depth | REP.responder_resources | `cm_init_qp_rts_attr`; `ib_send_cm_rep` / `cm_rep_handler` |
//! | `timeout` (`TIMEOUT`) | RTS, RC, XRC INI and XRC TGT | path life time + 1, the life time being REQ's Local ACK Timeout − 1 (not below 0) | [`ack_timeout`]`(REP.target_ack_delay, life time)` | `cm_format_paths_from_req` + `cm_init_av_by_path`; `cm_rep_handler` |
//! | `path_mig_state` (`PATH_MIG_STATE`) | RTS, with an alternate path | `REARM` | `REARM` | `cm_init_qp_rts_attr` |
//!
//! An alternate path loaded later, by a LAP/APR exchange on the established connection, is
//! not in the REQ: [`alt_path_attr`] computes its attributes (the `ALT_PATH` modify of the QP
//! in RTS, the kernel's `ib_cm_init_qp_attr` for RTS once a LAP was exchanged) from the LAP's
//! path and which end of the exchange we are ([`LapRole`]).
//!
//! The negotiation of responder resources and initiator depth: each side's REQ/REP offer is
//! the other side's limit. The passive side answers with what [`negotiate_accept`] computes
//! (librdmacm's `rdma_accept` default: the REQ's offer capped by the device), and both sides
//! then take the REP's values crosswise, as the table says.
//!
//! Not covered, because the messages do not carry them: the real LIDs of a routed IB path
//! (hop limit > 1: the REQ carries the permissive LID 0xFFFF; the kernel's passive side patches
//! the REQ from the received packet in `cm_process_routed_req`, its active side has them in its
//! path record: patch the REQ's path first), OPA extended LIDs, the destination MAC on RoCE (resolved from the GID by the verbs
//! layer) and the `IB_ACCESS_FLUSH_*` flags (they depend on the device's capabilities).

use core::fmt;
use core::ops::{BitOr, BitOrAssign};

use crate::mad::cm::{PathInfo, Rep, Req, ReqTransport};
use crate::mad::codes::Mtu;
use crate::mad::types::{FlowLabel, Gid, Lid, Psn, Qpn};

/// Which end of the connection we are (the workspace's one `Side`: `Active` sent the REQ and
/// received the REP, `Passive` received the REQ and sends the REP).
pub use ibcm_mad::Side;

/// The kind of QP the connection drives (`enum ibv_qp_type` for connected QPs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QpType {
    /// Reliable connected (`IBV_QPT_RC`).
    Rc,
    /// Unreliable connected (`IBV_QPT_UC`).
    Uc,
    /// XRC initiator, the active end of an XRC connection (`IBV_QPT_XRC_SEND`).
    XrcIni,
    /// XRC target, the passive end of an XRC connection (`IBV_QPT_XRC_RECV`).
    XrcTgt,
}

impl QpType {
    /// The QP type for `side` of a connection asked for by `req` (the kernel's
    /// `cm_req_get_qp_type` on the passive side; XRC is INI on the active side, TGT on the
    /// passive side). `None` for a transport the CM does not connect (RD, unknown).
    pub fn of(req: &Req, side: Side) -> Option<QpType> {
        match (req.transport(), side) {
            (ReqTransport::Rc, _) => Some(QpType::Rc),
            (ReqTransport::Uc, _) => Some(QpType::Uc),
            (ReqTransport::Xrc, Side::Active) => Some(QpType::XrcIni),
            (ReqTransport::Xrc, Side::Passive) => Some(QpType::XrcTgt),
            (ReqTransport::Other, _) => None,
        }
    }
}

/// The link layer of the local port.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LinkLayer {
    /// Native InfiniBand: LID-routed, a GRH only when the path leaves the subnet.
    InfiniBand,
    /// RoCE: always a GRH, no LIDs.
    Ethernet,
}

/// The target state of a transition (`enum ibv_qp_state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum QpState {
    /// Reset (`IBV_QPS_RESET`, 0); never a target of [`qp_attr`].
    #[default]
    Reset,
    /// Initialized (`IBV_QPS_INIT`, 1).
    Init,
    /// Ready to receive (`IBV_QPS_RTR`, 2).
    Rtr,
    /// Ready to send (`IBV_QPS_RTS`, 3).
    Rts,
}

impl QpState {
    /// The `enum ibv_qp_state` value.
    pub const fn ibv(self) -> u32 {
        match self {
            QpState::Reset => 0,
            QpState::Init => 1,
            QpState::Rtr => 2,
            QpState::Rts => 3,
        }
    }
}

/// Path migration state (`enum ibv_mig_state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum MigState {
    /// `IBV_MIG_MIGRATED` (0).
    #[default]
    Migrated,
    /// `IBV_MIG_REARM` (1): the alternate path is loaded and may be armed.
    Rearm,
    /// `IBV_MIG_ARMED` (2).
    Armed,
}

impl MigState {
    /// The `enum ibv_mig_state` value.
    pub const fn ibv(self) -> u32 {
        match self {
            MigState::Migrated => 0,
            MigState::Rearm => 1,
            MigState::Armed => 2,
        }
    }
}

macro_rules! flag_set {
    (
        $(#[$m:meta])*
        $name:ident { $( $(#[$fm:meta])* $flag:ident = $bit:expr, )* }
    ) => {
        $(#[$m])*
        #[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
        pub struct $name(u32);

        impl $name {
            $( $(#[$fm])* pub const $flag: $name = $name($bit); )*

            /// No bit set.
            pub const fn empty() -> Self {
                $name(0)
            }

            /// The raw bits (the verbs value).
            pub const fn bits(self) -> u32 {
                self.0
            }

            /// From raw bits; unknown bits are kept.
            pub const fn from_bits_retain(bits: u32) -> Self {
                $name(bits)
            }

            /// Whether every bit of `other` is set in `self`.
            pub const fn contains(self, other: Self) -> bool {
                self.0 & other.0 == other.0
            }

            /// Whether no bit is set.
            pub const fn is_empty(self) -> bool {
                self.0 == 0
            }
        }

        impl BitOr for $name {
            type Output = $name;
            fn bitor(self, rhs: $name) -> $name {
                $name(self.0 | rhs.0)
            }
        }

        impl BitOrAssign for $name {
            fn bitor_assign(&mut self, rhs: $name) {
                self.0 |= rhs.0;
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, concat!(stringify!($name), "("))?;
                let mut first = true;
                let mut rest = self.0;
                $(
                    if self.0 & $bit != 0 {
                        if !first {
                            f.write_str(" | ")?;
                        }
                        f.write_str(stringify!($flag))?;
                        first = false;
                        rest &= !$bit;
                    }
                )*
                if rest != 0 {
                    if !first {
                        f.write_str(" | ")?;
                    }
                    write!(f, "{rest:#x}")?;
                }
                f.write_str(")")
            }
        }
    };
}

flag_set! {
    /// Which [`QpAttr`] fields a transition sets: the `attr_mask` of `ibv_modify_qp`, bit for
    /// bit (`enum ibv_qp_attr_mask`).
    QpAttrMask {
        /// `IBV_QP_STATE`: [`QpAttr::qp_state`].
        STATE = 1 << 0,
        /// `IBV_QP_CUR_STATE` (never set by the CM).
        CUR_STATE = 1 << 1,
        /// `IBV_QP_EN_SQD_ASYNC_NOTIFY` (never set by the CM).
        EN_SQD_ASYNC_NOTIFY = 1 << 2,
        /// `IBV_QP_ACCESS_FLAGS`: [`QpAttr::qp_access_flags`].
        ACCESS_FLAGS = 1 << 3,
        /// `IBV_QP_PKEY_INDEX`: [`QpAttr::pkey_index`].
        PKEY_INDEX = 1 << 4,
        /// `IBV_QP_PORT`: [`QpAttr::port_num`].
        PORT = 1 << 5,
        /// `IBV_QP_QKEY` (UD only; never set here).
        QKEY = 1 << 6,
        /// `IBV_QP_AV`: [`QpAttr::ah_attr`].
        AV = 1 << 7,
        /// `IBV_QP_PATH_MTU`: [`QpAttr::path_mtu`].
        PATH_MTU = 1 << 8,
        /// `IBV_QP_TIMEOUT`: [`QpAttr::timeout`].
        TIMEOUT = 1 << 9,
        /// `IBV_QP_RETRY_CNT`: [`QpAttr::retry_cnt`].
        RETRY_CNT = 1 << 10,
        /// `IBV_QP_RNR_RETRY`: [`QpAttr::rnr_retry`].
        RNR_RETRY = 1 << 11,
        /// `IBV_QP_RQ_PSN`: [`QpAttr::rq_psn`].
        RQ_PSN = 1 << 12,
        /// `IBV_QP_MAX_QP_RD_ATOMIC`: [`QpAttr::max_rd_atomic`].
        MAX_QP_RD_ATOMIC = 1 << 13,
        /// `IBV_QP_ALT_PATH`: [`QpAttr::alt_ah_attr`], [`QpAttr::alt_pkey_index`],
        /// [`QpAttr::alt_port_num`], [`QpAttr::alt_timeout`].
        ALT_PATH = 1 << 14,
        /// `IBV_QP_MIN_RNR_TIMER`: [`QpAttr::min_rnr_timer`].
        MIN_RNR_TIMER = 1 << 15,
        /// `IBV_QP_SQ_PSN`: [`QpAttr::sq_psn`].
        SQ_PSN = 1 << 16,
        /// `IBV_QP_MAX_DEST_RD_ATOMIC`: [`QpAttr::max_dest_rd_atomic`].
        MAX_DEST_RD_ATOMIC = 1 << 17,
        /// `IBV_QP_PATH_MIG_STATE`: [`QpAttr::path_mig_state`].
        PATH_MIG_STATE = 1 << 18,
        /// `IBV_QP_CAP` (never set by the CM).
        CAP = 1 << 19,
        /// `IBV_QP_DEST_QPN`: [`QpAttr::dest_qp_num`].
        DEST_QPN = 1 << 20,
    }
}

flag_set! {
    /// Remote access rights of the QP (`enum ibv_access_flags`, same bits).
    AccessFlags {
        /// `IBV_ACCESS_LOCAL_WRITE` (a memory-region flag; never set by the CM).
        LOCAL_WRITE = 1 << 0,
        /// `IBV_ACCESS_REMOTE_WRITE`: always granted by the CM.
        REMOTE_WRITE = 1 << 1,
        /// `IBV_ACCESS_REMOTE_READ`: granted when the QP has responder resources.
        REMOTE_READ = 1 << 2,
        /// `IBV_ACCESS_REMOTE_ATOMIC`: granted when the QP has responder resources.
        REMOTE_ATOMIC = 1 << 3,
    }
}

/// The global route header part of an address vector (`struct ibv_global_route`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct GlobalRoute {
    /// Destination GID: the remote port's GID.
    pub dgid: Gid,
    /// Flow label (20 bits), from the path.
    pub flow_label: FlowLabel,
    /// Index of the local source GID in the port's GID table ([`LocalPort::sgid_index`]).
    pub sgid_index: u8,
    /// Hop limit.
    pub hop_limit: u8,
    /// Traffic class, from the path.
    pub traffic_class: u8,
}

/// An address vector (`struct ibv_ah_attr`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct AhAttr {
    /// The GRH, when the path needs one (`is_global` = `grh.is_some()`).
    pub grh: Option<GlobalRoute>,
    /// Destination LID (0 on RoCE, where there are no LIDs).
    pub dlid: Lid,
    /// Service level (4 bits).
    pub sl: u8,
    /// Source path bits: the low LMC bits of the local LID (0 on RoCE).
    pub src_path_bits: u8,
    /// Static rate (`enum ibv_rate`, the path's packet rate; 0 = port current).
    pub static_rate: u8,
    /// Local port number.
    pub port_num: u8,
}

/// QP attributes (the fields of `struct ibv_qp_attr` the CM sets). Only the fields named by
/// the accompanying [`QpAttrMask`] are meaningful.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct QpAttr {
    /// Target state (`STATE`).
    pub qp_state: QpState,
    /// Remote access rights (`ACCESS_FLAGS`, INIT).
    pub qp_access_flags: AccessFlags,
    /// P_Key index of the connection's partition (`PKEY_INDEX`, INIT).
    pub pkey_index: u16,
    /// Local port (`PORT`, INIT).
    pub port_num: u8,
    /// Primary path address vector (`AV`, RTR).
    pub ah_attr: AhAttr,
    /// Path MTU (`PATH_MTU`, RTR; `enum ibv_mtu` is [`Mtu::raw`]).
    pub path_mtu: Mtu,
    /// Remote QPN (`DEST_QPN`, RTR).
    pub dest_qp_num: Qpn,
    /// PSN expected on the first received packet (`RQ_PSN`, RTR).
    pub rq_psn: Psn,
    /// RDMA reads / atomics this QP answers at once (`MAX_DEST_RD_ATOMIC`, RTR).
    pub max_dest_rd_atomic: u8,
    /// Minimum RNR NAK timer code (`MIN_RNR_TIMER`, RTR).
    pub min_rnr_timer: u8,
    /// Alternate path address vector (`ALT_PATH`).
    pub alt_ah_attr: AhAttr,
    /// P_Key index on the alternate path (`ALT_PATH`).
    pub alt_pkey_index: u16,
    /// Local port of the alternate path (`ALT_PATH`).
    pub alt_port_num: u8,
    /// Local ACK timeout exponent on the alternate path (`ALT_PATH`).
    pub alt_timeout: u8,
    /// PSN of the first sent packet (`SQ_PSN`, RTS).
    pub sq_psn: Psn,
    /// Local ACK timeout exponent, 4.096 µs × 2^timeout (`TIMEOUT`, RTS).
    pub timeout: u8,
    /// Transport retries (`RETRY_CNT`, RTS).
    pub retry_cnt: u8,
    /// RNR retries, 7 = infinite (`RNR_RETRY`, RTS).
    pub rnr_retry: u8,
    /// RDMA reads / atomics this QP has outstanding at once (`MAX_QP_RD_ATOMIC`, RTS).
    pub max_rd_atomic: u8,
    /// Path migration state (`PATH_MIG_STATE`, RTS with an alternate path).
    pub path_mig_state: MigState,
}

/// What the attributes need to know about a local port that the messages do not say.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LocalPort {
    /// Port number (1-based).
    pub port_num: u8,
    /// Index of the REQ's Partition Key in the port's P_Key table.
    pub pkey_index: u16,
    /// Index of the local GID (the path's local GID) in the port's GID table.
    pub sgid_index: u8,
    /// The port's LID mask control (IB; 0 on RoCE).
    pub lmc: u8,
}

impl Default for LocalPort {
    fn default() -> Self {
        LocalPort {
            port_num: 1,
            pkey_index: 0,
            sgid_index: 0,
            lmc: 0,
        }
    }
}

/// One connection as [`qp_attr`] sees it. Build it with [`Connection::new`] and set the
/// optional fields when you know better than the messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Connection<'a> {
    /// The REQ (sent by the active side).
    pub req: &'a Req,
    /// The REP (sent by the passive side).
    pub rep: &'a Rep,
    /// Which side we are.
    pub side: Side,
    /// The link layer of the local port.
    pub link_layer: LinkLayer,
    /// The local port of the primary path.
    pub port: LocalPort,
    /// The local port of the alternate path; `None` = the primary path's port.
    pub alt_port: Option<LocalPort>,
    /// Active side: the packet life time of the primary path record the REQ was built from.
    /// `None` = recover it from the REQ's Local ACK Timeout as the passive side does
    /// (timeout − 1), which is exact when the local CA ACK delay is not above it.
    pub packet_life_time: Option<u8>,
    /// Active side: the same for the REQ's alternate path. [`alt_path_attr`] as the sender of
    /// a LAP (either side): the packet life time of the path record the LAP's path was built
    /// from (`None` = the path's Local ACK Timeout − 1).
    pub alt_packet_life_time: Option<u8>,
    /// Active side: the Retry Count asked for when the REQ does not carry it (the kernel
    /// leaves it 0 on the wire for an XRC INI but uses the caller's value at RTS).
    /// `None` = REQ.retry_count.
    pub retry_count: Option<u8>,
    /// Passive side: the hop limit of the GRH the REQ arrived with (the kernel's passive side
    /// uses it instead of the REQ's hop limit). `None` = the REQ's primary hop limit.
    pub received_hop_limit: Option<u8>,
}

impl<'a> Connection<'a> {
    /// A connection with only the facts the messages give plus the local port.
    pub fn new(
        req: &'a Req,
        rep: &'a Rep,
        side: Side,
        link_layer: LinkLayer,
        port: LocalPort,
    ) -> Self {
        Connection {
            req,
            rep,
            side,
            link_layer,
            port,
            alt_port: None,
            packet_life_time: None,
            alt_packet_life_time: None,
            retry_count: None,
            received_hop_limit: None,
        }
    }

    /// The QP type of our end; `None` for a transport the CM does not connect.
    pub fn qp_type(&self) -> Option<QpType> {
        QpType::of(self.req, self.side)
    }

    /// The responder resources of our QP (`max_dest_rd_atomic`): REP.responder_resources on
    /// the passive side, REP.initiator_depth on the active side.
    pub fn responder_resources(&self) -> u8 {
        match self.side {
            Side::Passive => self.rep.responder_resources,
            Side::Active => self.rep.initiator_depth,
        }
    }

    /// The initiator depth of our QP (`max_rd_atomic`): REP.initiator_depth on the passive
    /// side, REP.responder_resources on the active side.
    pub fn initiator_depth(&self) -> u8 {
        match self.side {
            Side::Passive => self.rep.initiator_depth,
            Side::Active => self.rep.responder_resources,
        }
    }

    /// The remote QPN: REQ.local_qpn on the passive side; on the active side REP.local_qpn,
    /// or for XRC the TGT QPN the REP carries in its Local EECN.
    pub fn remote_qpn(&self) -> Qpn {
        match (self.side, self.req.is_xrc()) {
            (Side::Passive, _) => self.req.local_qpn,
            (Side::Active, true) => self.rep.xrc_tgt_qpn(),
            (Side::Active, false) => self.rep.local_qpn,
        }
    }

    /// The PSN our receive queue expects first: REP.starting_psn on the passive side,
    /// REQ.starting_psn on the active side.
    pub fn rq_psn(&self) -> Psn {
        match self.side {
            Side::Passive => self.rep.starting_psn,
            Side::Active => self.req.starting_psn,
        }
    }

    /// The PSN our send queue starts with: REQ.starting_psn on the passive side,
    /// REP.starting_psn on the active side.
    pub fn sq_psn(&self) -> Psn {
        match self.side {
            Side::Passive => self.req.starting_psn,
            Side::Active => self.rep.starting_psn,
        }
    }

    /// The address vector and ACK timeout of `path` (primary or alternate) of the REQ.
    fn av(&self, path: &PathInfo, port: &LocalPort, primary: bool) -> (AhAttr, u8) {
        self.av_from(
            path,
            port,
            primary,
            self.side,
            self.rep.target_ack_delay.get(),
        )
    }

    /// The address vector and ACK timeout of `path`, written from the view of `view`
    /// (`Active`: the path's local end is ours, as in the REQ we sent or the LAP we sent;
    /// `Passive`: the peer's, as in one we received); `target_ack_delay` is the peer's CA ACK
    /// delay for the `Active` view's timeout.
    fn av_from(
        &self,
        path: &PathInfo,
        port: &LocalPort,
        primary: bool,
        view: Side,
        target_ack_delay: u8,
    ) -> (AhAttr, u8) {
        let (dgid, dlid, slid) = match view {
            Side::Passive => (path.local_gid, path.local_lid, path.remote_lid),
            Side::Active => (path.remote_gid, path.remote_lid, path.local_lid),
        };
        let hop_limit = match (view, primary, self.received_hop_limit) {
            (Side::Passive, true, Some(h)) => h,
            _ => path.hop_limit,
        };
        let roce = self.link_layer == LinkLayer::Ethernet;
        let grh = (roce || hop_limit > 0).then_some(GlobalRoute {
            dgid,
            flow_label: path.flow_label,
            sgid_index: port.sgid_index,
            hop_limit,
            traffic_class: path.traffic_class,
        });
        let path_mask = (1u16 << port.lmc.min(7)) - 1;
        let ah = AhAttr {
            grh,
            dlid: if roce { Lid(0) } else { dlid },
            sl: path.sl.get(),
            src_path_bits: if roce { 0 } else { (slid.0 & path_mask) as u8 },
            static_rate: path.packet_rate.raw(),
            port_num: port.port_num,
        };
        // The REQ's Local ACK Timeout is the active side's cm_ack_timeout(ack delay, packet
        // life time); the passive side takes the life time as that minus one.
        let wire = path.local_ack_timeout.get();
        let from_wire = wire.saturating_sub(1);
        let timeout = match view {
            Side::Passive => from_wire + 1,
            Side::Active => {
                let given = if primary {
                    self.packet_life_time
                } else {
                    self.alt_packet_life_time
                };
                ack_timeout(target_ack_delay, given.unwrap_or(from_wire))
            }
        };
        (ah, timeout)
    }

    /// The alternate path's address vector and timeout, when the kernel would load one: the
    /// REQ has an alternate path and its DLID is non-zero (so never on RoCE).
    fn alt_av(&self) -> Option<(AhAttr, u8, LocalPort)> {
        let path = &self.req.alternate_path;
        if self.link_layer != LinkLayer::InfiniBand || !path.is_present() {
            return None;
        }
        let port = self.alt_port.unwrap_or(self.port);
        let (ah, timeout) = self.av(path, &port, false);
        (ah.dlid.0 != 0).then_some((ah, timeout, port))
    }
}

/// Why [`qp_attr`] (or [`alt_path_attr`]) cannot compute attributes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum QpAttrError {
    /// The REQ asks for a transport the CM does not connect (RD, an unknown extended type).
    #[error("the REQ's transport ({0:?}) has no connected QP")]
    UnsupportedTransport(ReqTransport),
    /// [`QpState::Reset`] is not a transition the CM computes.
    #[error("the CM computes attributes for INIT, RTR and RTS only")]
    UnsupportedState,
    /// [`alt_path_attr`]: the path gives the QP no alternate path to load: the link layer is
    /// Ethernet (the kernel's CM loads alternate paths on InfiniBand only and drops LAPs on
    /// RoCE), or the path's destination LID is 0.
    #[error("no alternate path to load: RoCE, or a path without a destination LID")]
    NoAlternatePath,
}

/// Which end of a LAP/APR exchange this side is, for [`alt_path_attr`]. A LAP's path is
/// written from its sender's view (its `local_*` fields are the sender's port), whichever side
/// of the connection (active or passive) sent it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LapRole {
    /// This side sent the LAP (`Connection::load_alt_path` in the async API, the kernel's
    /// `ib_send_cm_lap`): the path is in its own view.
    Sender,
    /// This side received the LAP (`LapRequest` in the async API, the kernel's
    /// `cm_lap_handler`): the path is in the peer's view.
    Receiver,
}

/// The attributes and mask that load `path`, the alternate path a LAP/APR exchange agreed on,
/// into our QP of `conn`, in RTS: the kernel's `ib_cm_init_qp_attr` for RTS once a LAP has been
/// sent or received (`cm_init_qp_rts_attr`, LAP state not UNINIT). The mask is
/// `ALT_PATH | PATH_MIG_STATE`, without `STATE`: an `ibv_modify_qp` of the QP in its current
/// state (the kernel's callers pass the mask as it is); [`QpAttr::qp_state`] says
/// [`QpState::Rts`] for those that want it. [`QpAttr::path_mig_state`] is
/// [`MigState::Rearm`]: the hardware arms the path and, on a failure of the primary one,
/// migrates to it (`IBV_EVENT_PATH_MIG`: then report it, `notify_path_migrated`).
///
/// The receiver of the LAP loads the path before it sends its APR "path loaded"; the sender
/// once that APR has arrived.
///
/// | Field | [`LapRole::Sender`] | [`LapRole::Receiver`] | Kernel rule |
/// |---|---|---|---|
/// | `alt_ah_attr.dlid`, `grh.dgid` | path.remote_lid, path.remote_gid | path.local_lid, path.local_gid | `ib_send_cm_lap` (the path record) / `cm_format_path_from_lap` |
/// | `alt_ah_attr.src_path_bits` | path.local_lid & (2^LMC − 1) | path.remote_lid & (2^LMC − 1) | `ib_init_ah_attr_from_path` |
/// | `alt_ah_attr` GRH, SL, rate | as for the REQ's paths: a GRH iff the hop limit > 0 | the same | `ib_init_ah_attr_from_path` |
/// | `alt_timeout` | [`ack_timeout`]`(peer's CA ACK delay, life time)`: the life time [`Connection::alt_packet_life_time`], else path.local_ack_timeout − 1; the peer's CA ACK delay REP.target_ack_delay on the active side, 0 on the passive side (which never receives one) | path.local_ack_timeout − 1 + 1 | `ib_send_cm_lap` (`cm_ack_timeout(target_ack_delay, …)`) / `cm_format_path_from_lap` + `cm_init_av_by_path` |
/// | `alt_port_num`, `alt_pkey_index` | [`Connection::alt_port`], else [`Connection::port`] | the same | `cm_init_av_by_path` |
///
/// # Errors
/// [`QpAttrError::UnsupportedTransport`] for an RD or unknown transport;
/// [`QpAttrError::NoAlternatePath`] on Ethernet, or for a path whose destination LID (for this
/// side) is 0.
pub fn alt_path_attr(
    conn: &Connection<'_>,
    path: &PathInfo,
    role: LapRole,
) -> Result<(QpAttr, QpAttrMask), QpAttrError> {
    conn.qp_type()
        .ok_or(QpAttrError::UnsupportedTransport(conn.req.transport()))?;
    if conn.link_layer != LinkLayer::InfiniBand {
        return Err(QpAttrError::NoAlternatePath);
    }
    let port = conn.alt_port.unwrap_or(conn.port);
    let (view, target_ack_delay) = match (role, conn.side) {
        (LapRole::Receiver, _) => (Side::Passive, 0),
        (LapRole::Sender, Side::Active) => (Side::Active, conn.rep.target_ack_delay.get()),
        (LapRole::Sender, Side::Passive) => (Side::Active, 0),
    };
    let (ah, timeout) = conn.av_from(path, &port, false, view, target_ack_delay);
    if ah.dlid.0 == 0 {
        return Err(QpAttrError::NoAlternatePath);
    }
    let attr = QpAttr {
        qp_state: QpState::Rts,
        alt_ah_attr: ah,
        alt_timeout: timeout,
        alt_port_num: port.port_num,
        alt_pkey_index: port.pkey_index,
        path_mig_state: MigState::Rearm,
        ..QpAttr::default()
    };
    Ok((attr, QpAttrMask::ALT_PATH | QpAttrMask::PATH_MIG_STATE))
}

/// The attributes and mask for moving our QP of `conn` to `state` (INIT, RTR or RTS): the
/// kernel's `ib_cm_init_qp_attr`. See the [module documentation](self) for each field's rule.
///
/// # Errors
/// [`QpAttrError::UnsupportedTransport`] for an RD or unknown transport,
/// [`QpAttrError::UnsupportedState`] for [`QpState::Reset`].
pub fn qp_attr(conn: &Connection<'_>, state: QpState) -> Result<(QpAttr, QpAttrMask), QpAttrError> {
    let qp_type = conn
        .qp_type()
        .ok_or(QpAttrError::UnsupportedTransport(conn.req.transport()))?;
    let mut attr = QpAttr {
        qp_state: state,
        ..QpAttr::default()
    };
    let mut mask = QpAttrMask::STATE;
    match state {
        QpState::Reset => return Err(QpAttrError::UnsupportedState),
        QpState::Init => {
            mask |= QpAttrMask::ACCESS_FLAGS | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT;
            attr.qp_access_flags = AccessFlags::REMOTE_WRITE;
            if conn.responder_resources() != 0 {
                attr.qp_access_flags |= AccessFlags::REMOTE_READ | AccessFlags::REMOTE_ATOMIC;
            }
            attr.pkey_index = conn.port.pkey_index;
            attr.port_num = conn.port.port_num;
        }
        QpState::Rtr => {
            mask |=
                QpAttrMask::AV | QpAttrMask::PATH_MTU | QpAttrMask::DEST_QPN | QpAttrMask::RQ_PSN;
            attr.ah_attr = conn.av(&conn.req.primary_path, &conn.port, true).0;
            attr.path_mtu = conn.req.path_mtu;
            attr.dest_qp_num = conn.remote_qpn();
            attr.rq_psn = conn.rq_psn();
            if matches!(qp_type, QpType::Rc | QpType::XrcTgt) {
                mask |= QpAttrMask::MAX_DEST_RD_ATOMIC | QpAttrMask::MIN_RNR_TIMER;
                attr.max_dest_rd_atomic = conn.responder_resources();
                attr.min_rnr_timer = 0;
            }
            if let Some((ah, timeout, port)) = conn.alt_av() {
                mask |= QpAttrMask::ALT_PATH;
                attr.alt_ah_attr = ah;
                attr.alt_timeout = timeout;
                attr.alt_port_num = port.port_num;
                attr.alt_pkey_index = port.pkey_index;
            }
        }
        QpState::Rts => {
            mask |= QpAttrMask::SQ_PSN;
            attr.sq_psn = conn.sq_psn();
            if matches!(qp_type, QpType::Rc | QpType::XrcIni) {
                mask |=
                    QpAttrMask::RETRY_CNT | QpAttrMask::RNR_RETRY | QpAttrMask::MAX_QP_RD_ATOMIC;
                attr.retry_cnt = match (conn.side, conn.retry_count) {
                    (Side::Active, Some(n)) => n,
                    _ => conn.req.retry_count.get(),
                };
                attr.rnr_retry = match conn.side {
                    Side::Passive => conn.req.rnr_retry_count.get(),
                    Side::Active => conn.rep.rnr_retry_count.get(),
                };
                attr.max_rd_atomic = conn.initiator_depth();
            }
            if qp_type != QpType::Uc {
                mask |= QpAttrMask::TIMEOUT;
                attr.timeout = conn.av(&conn.req.primary_path, &conn.port, true).1;
            }
            if conn.alt_av().is_some() {
                mask |= QpAttrMask::PATH_MIG_STATE;
                attr.path_mig_state = MigState::Rearm;
            }
        }
    }
    Ok((attr, mask))
}

/// The local ACK timeout exponent for a path: the kernel's `cm_ack_timeout`. The wanted
/// timeout is 4.096 µs × (2^ca_ack_delay + 2 × 2^packet_life_time); the result is the larger
/// of `ca_ack_delay` and `packet_life_time + 1`, plus one when the other is within a factor
/// of two of it, capped at 31. The active side puts it in the REQ's Local ACK Timeout (with
/// its own CA ACK delay) and, once the REP arrives, sets its QP's timeout with the REP's
/// Target ACK Delay.
pub const fn ack_timeout(ca_ack_delay: u8, packet_life_time: u8) -> u8 {
    let delay = ca_ack_delay as i32;
    let mut t = packet_life_time as i32 + 1;
    if t >= delay {
        if delay >= t - 1 {
            t += 1;
        }
    } else {
        t = delay + if t >= delay - 1 { 1 } else { 0 };
    }
    if t > 31 {
        31
    } else {
        t as u8
    }
}

/// Responder resources and initiator depth for one side's QP, or a REP's offer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct RdAtomic {
    /// Incoming RDMA reads / atomics answered at once (REP Responder Resources).
    pub responder_resources: u8,
    /// Outgoing RDMA reads / atomics outstanding at once (REP Initiator Depth).
    pub initiator_depth: u8,
}

/// What a passive side offers in its REP when the application leaves the choice to the CM:
/// librdmacm's `rdma_accept` default. The REQ's Responder Resources bound our initiator depth
/// and its Initiator Depth bounds our responder resources, each capped by the device
/// (`max_qp_init_rd_atom`, `max_qp_rd_atom` of `ibv_query_device`).
pub fn negotiate_accept(req: &Req, max_qp_rd_atom: u8, max_qp_init_rd_atom: u8) -> RdAtomic {
    RdAtomic {
        responder_resources: req.initiator_depth.min(max_qp_rd_atom),
        initiator_depth: req.responder_resources.min(max_qp_init_rd_atom),
    }
}

#[cfg(test)]
mod tests;
