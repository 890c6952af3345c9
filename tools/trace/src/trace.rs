//! From capture records to CM events.
//!
//! [`classify`] decodes one record (link layer → IB transport → MAD → CM message) and says
//! what it was: a CM MAD ([`Item::Cm`]), something else ([`Item::NonCm`], counted), or a
//! malformed frame ([`Item::Malformed`], reported with its reason). It never fails and never
//! panics: every problem becomes an item.

use std::fmt;
use std::net::IpAddr;
use std::time::Duration;

use crate::capture::Record;
use ibcm_mad::frame::bth::Transport;
use ibcm_mad::frame::{self, Encap, IbPacket, IcrcStatus, Opcode};
use ibcm_mad::{Gid, Lid, Mad, MgmtClass, Pkey, Psn, Qkey, Qpn};

/// The address of one end of a captured packet: an IP address (RoCEv2), a GID (RoCEv1, IB
/// with GRH) or a LID (IB). (Not a CM endpoint: it names where a packet came from or went to.)
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WireAddr {
    /// RoCEv2 IP address.
    Ip(IpAddr),
    /// GID from a GRH.
    Gid(Gid),
    /// LID from an LRH.
    Lid(Lid),
}

impl fmt::Display for WireAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WireAddr::Ip(ip) => write!(f, "{ip}"),
            WireAddr::Gid(g) => write!(f, "{g}"),
            WireAddr::Lid(l) => write!(f, "LID {l}"),
        }
    }
}

/// ICRC verdict as cm-trace reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Icrc {
    /// Present and correct.
    Ok,
    /// Present and wrong.
    Bad,
    /// Not in the capture (or not checked).
    Absent,
}

impl Icrc {
    /// `"ok"`, `"bad"` or `"absent"`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Icrc::Ok => "ok",
            Icrc::Bad => "bad",
            Icrc::Absent => "absent",
        }
    }
}

impl From<IcrcStatus> for Icrc {
    fn from(s: IcrcStatus) -> Self {
        match s {
            IcrcStatus::Ok => Icrc::Ok,
            IcrcStatus::Bad { .. } => Icrc::Bad,
            IcrcStatus::Absent | IcrcStatus::NotChecked => Icrc::Absent,
        }
    }
}

/// Transport-level details of the packet that carried a CM MAD (shown by `cm-trace -V`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Wire {
    /// BTH P_Key.
    pub pkey: Pkey,
    /// BTH PSN.
    pub psn: Psn,
    /// BTH destination QP (1 for the CM's GSI QP).
    pub dest_qp: Qpn,
    /// DETH source QP.
    pub src_qp: Option<Qpn>,
    /// DETH Q_Key.
    pub qkey: Option<Qkey>,
    /// UDP source port (RoCEv2).
    pub udp_src_port: Option<u16>,
    /// LRH source and destination LIDs (native IB).
    pub lids: Option<(Lid, Lid)>,
    /// IPv4 TTL / IPv6 or GRH hop limit.
    pub hop_limit: Option<u8>,
    /// IPv4 TOS / IPv6 or GRH traffic class.
    pub traffic_class: Option<u8>,
    /// The ICRC as found on the wire (CRC value), when the packet carries one.
    pub icrc_value: Option<u32>,
}

/// A CM MAD found in a capture.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CmEvent {
    /// 1-based frame number in its file.
    pub frame: u64,
    /// Capture timestamp (since the Unix epoch).
    pub time: Duration,
    /// Encapsulation.
    pub encap: Encap,
    /// Sender.
    pub src: WireAddr,
    /// Receiver.
    pub dst: WireAddr,
    /// The MAD.
    pub mad: Mad,
    /// ICRC verdict.
    pub icrc: Icrc,
    /// Transport-level details.
    pub wire: Wire,
}

/// What a non-CM record was, without allocating: the key of cm-trace's non-CM summary.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NonCm {
    /// Not an IB/RoCE transport packet (the decoder's description: "ARP", "IPv4 TCP", …).
    NotIb(&'static str),
    /// An IB transport packet without a MAD (RC/UC/UD data, ACKs, CNPs, …).
    Transport {
        /// How it was carried.
        encap: Encap,
        /// BTH opcode.
        opcode: Opcode,
    },
    /// A MAD of another management class.
    Mad(MgmtClass),
}

impl fmt::Display for NonCm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NonCm::NotIb(what) => f.write_str(what),
            NonCm::Transport { encap, opcode } => {
                let t = match opcode.transport() {
                    Transport::Rc => "RC",
                    Transport::Uc => "UC",
                    Transport::Rd => "RD",
                    Transport::Ud => "UD",
                    Transport::Cnp => "CNP",
                    Transport::Xrc => "XRC",
                    Transport::Vendor => "vendor",
                };
                match opcode.transport() {
                    Transport::Ud | Transport::Cnp => write!(f, "{encap} {}", opcode.name()),
                    _ => write!(f, "{encap} {t} {}", opcode.name()),
                }
            }
            NonCm::Mad(class) => write!(f, "MAD class {class} ({:#04x})", class.raw()),
        }
    }
}

/// What a capture record was.
#[derive(Debug, Clone, PartialEq, Eq)]
// A `Mad` is large, and items are produced and consumed one at a time; boxing would allocate
// for every CM packet.
#[allow(clippy::large_enum_variant)]
pub enum Item {
    /// A CM MAD.
    Cm(CmEvent),
    /// Not CM: another protocol, IB data traffic, or a MAD of another class.
    NonCm {
        /// What it was.
        what: NonCm,
    },
    /// A frame that could not be decoded.
    Malformed {
        /// 1-based frame number.
        frame: u64,
        /// Why.
        reason: String,
    },
}

fn wire_addrs(p: &IbPacket<'_>) -> (WireAddr, WireAddr) {
    if let Some(ip) = &p.ip {
        return (WireAddr::Ip(ip.src_addr()), WireAddr::Ip(ip.dst_addr()));
    }
    if let Some(grh) = &p.grh {
        return (WireAddr::Gid(grh.sgid), WireAddr::Gid(grh.dgid));
    }
    match &p.lrh {
        Some(lrh) => (WireAddr::Lid(lrh.slid), WireAddr::Lid(lrh.dlid)),
        None => (WireAddr::Lid(Lid(0)), WireAddr::Lid(Lid(0))),
    }
}

fn wire(p: &IbPacket<'_>) -> Wire {
    let (hop_limit, traffic_class) = match (&p.ip, &p.grh) {
        (Some(ip), _) => (Some(ip.hop_limit()), Some(ip.traffic_class())),
        (None, Some(g)) => (Some(g.hop_limit), Some(g.traffic_class)),
        (None, None) => (None, None),
    };
    let icrc_value = match p.icrc {
        IcrcStatus::Absent => None,
        _ => p.packet.last_chunk::<4>().map(|b| u32::from_le_bytes(*b)),
    };
    Wire {
        pkey: p.bth.pkey,
        psn: p.bth.psn,
        dest_qp: p.bth.dest_qp,
        src_qp: p.deth.map(|d| d.src_qp),
        qkey: p.deth.map(|d| d.qkey),
        udp_src_port: p.udp.map(|u| u.src_port),
        lids: p.lrh.map(|l| (l.slid, l.dlid)),
        hop_limit,
        traffic_class,
        icrc_value,
    }
}

/// Classifies one capture record.
pub fn classify(rec: &Record<'_>) -> Item {
    let result = frame::decode(rec.link_type, rec.data);
    let decoded = match &result {
        Ok(d) => d,
        Err(e) => {
            return Item::Malformed {
                frame: rec.number,
                reason: e.to_string(),
            }
        }
    };
    // By reference: the decoded packet is large, and moving it costs a copy.
    let p = match decoded {
        frame::Decoded::NotIb { what } => {
            return Item::NonCm {
                what: NonCm::NotIb(what),
            }
        }
        frame::Decoded::Ib(p) => p,
    };
    let mad = match p.mad() {
        None => {
            return Item::NonCm {
                what: NonCm::Transport {
                    encap: p.encap,
                    opcode: p.bth.opcode,
                },
            }
        }
        Some(Err(e)) => {
            return Item::Malformed {
                frame: rec.number,
                reason: e.to_string(),
            }
        }
        Some(Ok(mad)) => mad,
    };
    // Non-CM MADs are named by their class.
    let class = MgmtClass::from_raw(mad[1]);
    if class != MgmtClass::Cm {
        return Item::NonCm {
            what: NonCm::Mad(class),
        };
    }
    match Mad::parse_fixed(mad) {
        Ok(m) => {
            let (src, dst) = wire_addrs(p);
            Item::Cm(CmEvent {
                frame: rec.number,
                time: rec.timestamp,
                encap: p.encap,
                src,
                dst,
                mad: m,
                icrc: p.icrc.into(),
                wire: wire(p),
            })
        }
        Err(e) => Item::Malformed {
            frame: rec.number,
            reason: format!("CM MAD: {e}"),
        },
    }
}
