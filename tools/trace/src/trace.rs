//! From capture records to CM events.
//!
//! [`classify`] decodes one record (link layer → IB transport → MAD → CM message) and says
//! what it was: a CM MAD ([`Item::Cm`]), a Subnet Administration MAD ([`Item::Sa`]),
//! something else ([`Item::NonCm`], counted), or a malformed frame ([`Item::Malformed`],
//! reported with its reason). It never fails and never
//! panics: every problem becomes an item.

use std::fmt;
use std::net::IpAddr;
use std::time::Duration;

use crate::capture::Record;
use crate::sa::SaEvent;
use ibcm_mad::frame::bth::Transport;
use ibcm_mad::frame::{self, Encap, IbPacket, IcrcStatus, Opcode, MAD_LEN};
use ibcm_mad::sa::SaMad;
use ibcm_mad::FrameError;
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
    /// The snaplen cut the packet before its end: no verdict.
    NotCaptured,
}

impl Icrc {
    /// `"ok"`, `"bad"` or `"absent"`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Icrc::Ok => "ok",
            Icrc::Bad => "bad",
            Icrc::Absent => "absent",
            Icrc::NotCaptured => "not-captured",
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
    /// `Some(n)` when the capture's snaplen cut the packet inside the MAD: only its first `n`
    /// bytes (of 256, at least [`MIN_CUT_MAD`]) were captured. The fields after them read as
    /// zero, the ICRC is not checked ([`Icrc::NotCaptured`]), and the views mark the message
    /// truncated. `None` for a whole MAD.
    pub captured: Option<u16>,
}

/// The fewest MAD bytes a cut CM packet must have to be decoded: the MAD header (24 bytes)
/// and the two Communication IDs (SIDR: Request ID, P_Key, Service ID's first half) that say
/// which connection it belongs to. A CM packet cut shorter is counted as cut, not decoded.
pub const MIN_CUT_MAD: usize = 32;

/// Largest original packet length a cut record is rebuilt to (zero-filled) for decoding: more
/// than any IB or RoCE packet (4 KiB MTU, jumbo Ethernet) and any IPv4/IPv6 length.
const MAX_REBUILT_LEN: usize = 65_536 + 256;

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
    /// A record the snaplen cut too short to say what it is: the layer it ends in ("IPv4",
    /// "BTH", "CM MAD", …).
    Cut(&'static str),
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
            NonCm::Cut(layer) => write!(f, "cut by the snaplen in the {layer}"),
        }
    }
}

/// An RC or XRC transport packet (a request, an ACK/NAK, a READ response, an atomic ACK), a
/// CNP, or a UD SEND on a QP other than 0 and 1: what the data-path accounting of a connection
/// (its QPNs from the CM exchange, or the QPN and Q_Key of a SIDR_REP) needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RcPacket {
    /// Capture timestamp.
    pub time: Duration,
    /// Sender.
    pub src: WireAddr,
    /// Receiver.
    pub dst: WireAddr,
    /// BTH destination QP.
    pub dest_qp: Qpn,
    /// BTH PSN.
    pub psn: Psn,
    /// BTH opcode.
    pub opcode: Opcode,
    /// AETH syndrome (ACK, READ response First/Last/Only, atomic ACK).
    pub syndrome: Option<u8>,
    /// Length on the wire (the record's original length).
    pub len: u32,
    /// IP ECN (or GRH traffic class low bits) is Congestion Experienced (0b11).
    pub ce: bool,
    /// XRC requests: the XRC SRQ number of the XRCETH (24 bits).
    pub srqn: Option<u32>,
    /// UD SENDs: the DETH source QP and Q_Key.
    pub deth: Option<(Qpn, Qkey)>,
}

/// What a capture record was.
#[derive(Debug, Clone, PartialEq, Eq)]
// A `Mad` is large, and items are produced and consumed one at a time; boxing would allocate
// for every CM packet.
#[allow(clippy::large_enum_variant)]
pub enum Item {
    /// A CM MAD.
    Cm(CmEvent),
    /// A Subnet Administration MAD (class 0x03, captured whole): counted as non-CM, shown by
    /// the per-MAD views, and paired with the connections it served (boxed: SA MADs are
    /// rare, and an item stays the size of a CM one).
    Sa(Box<SaEvent>),
    /// Not CM: another protocol, IB data traffic, or a MAD of another class.
    NonCm {
        /// What it was.
        what: NonCm,
        /// The snaplen cut the record short (what it was is read from the bytes captured).
        cut: bool,
        /// For RC / XRC transport packets and CNPs: the fields the data-path accounting needs.
        rc: Option<RcPacket>,
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
///
/// A record cut by the capture's snaplen (`data` shorter than `orig_len`) whose packet does not
/// decode as captured is decoded again from its captured bytes followed by zeros up to
/// `orig_len`, without a CRC check: a CM MAD with at least [`MIN_CUT_MAD`] bytes captured
/// becomes an [`Item::Cm`] with [`CmEvent::captured`] set; anything else becomes an
/// [`Item::NonCm`] with `cut` set (never a malformed frame).
pub fn classify(rec: &Record<'_>) -> Item {
    match frame::decode(rec.link_type, rec.data) {
        Ok(decoded) => classify_decoded(rec, &decoded, None),
        Err(_) if rec.is_truncated() => classify_cut(rec),
        Err(e) => Item::Malformed {
            frame: rec.number,
            reason: e.to_string(),
        },
    }
}

/// A record the snaplen cut: decoded from its captured bytes padded with zeros.
#[cold]
fn classify_cut(rec: &Record<'_>) -> Item {
    let cut = |layer| Item::NonCm {
        what: NonCm::Cut(layer),
        cut: true,
        rc: None,
    };
    let orig = usize::try_from(rec.orig_len).unwrap_or(usize::MAX);
    if orig > MAX_REBUILT_LEN {
        return cut("packet (original length too large to rebuild)");
    }
    // The rebuilt packet goes into a buffer kept per thread (no allocation per cut frame).
    PADDED.with(|buf| {
        let mut padded = buf.borrow_mut();
        padded.clear();
        padded.extend_from_slice(rec.data);
        padded.resize(orig, 0);
        decode_cut(rec, &padded)
    })
}

thread_local! {
    /// [`classify_cut`]'s buffer.
    static PADDED: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Decodes the rebuilt packet `padded` of the cut record `rec`.
fn decode_cut(rec: &Record<'_>, padded: &[u8]) -> Item {
    let cut = |layer| Item::NonCm {
        what: NonCm::Cut(layer),
        cut: true,
        rc: None,
    };
    let cfg = frame::DecodeConfig {
        verify_crc: false,
        ..frame::DecodeConfig::DEFAULT
    };
    match frame::decode_with(&cfg, rec.link_type, padded) {
        Ok(decoded) => {
            let captured = match decoded.ib() {
                // MAD bytes within the captured data.
                Some(p) if p.is_mad() => {
                    rec.data.len().saturating_sub(p.payload_offset).min(MAD_LEN)
                }
                _ => MAD_LEN,
            };
            classify_decoded(rec, &decoded, Some(captured))
        }
        Err(FrameError::Truncated { layer, .. }) => cut(layer),
        Err(_) => cut("packet headers"),
    }
}

/// The data-path fields of an RC / XRC packet, a CNP, or a UD SEND to a QP other than the
/// SMI's and the GSI's; `None` for other transports.
fn rc_packet(rec: &Record<'_>, p: &IbPacket<'_>) -> Option<RcPacket> {
    let op = p.bth.opcode;
    let deth = match op.transport() {
        Transport::Rc | Transport::Xrc | Transport::Cnp => None,
        Transport::Ud if p.bth.dest_qp.get() > 1 => Some(p.deth.map(|d| (d.src_qp, d.qkey))?),
        _ => return None,
    };
    // The XRCETH comes first in the extension headers of XRC requests.
    let srqn = match (op.transport(), op.0 & 0x1f) {
        (Transport::Xrc, 0x0d..=0x12) => None,
        (Transport::Xrc, _) => p
            .ext_headers
            .first_chunk::<4>()
            .map(|b| u32::from_be_bytes(*b) & 0x00ff_ffff),
        _ => None,
    };
    // The AETH comes first in the extension headers of the responses that carry one.
    let syndrome = match op.transport() {
        Transport::Rc | Transport::Xrc
            if matches!(op.0 & 0x1f, 0x0d | 0x0f | 0x10 | 0x11 | 0x12) =>
        {
            p.ext_headers.first().copied()
        }
        _ => None,
    };
    let tc = match (&p.ip, &p.grh) {
        (Some(ip), _) => Some(ip.traffic_class()),
        (None, Some(g)) => Some(g.traffic_class),
        (None, None) => None,
    };
    let (src, dst) = wire_addrs(p);
    Some(RcPacket {
        time: rec.timestamp,
        src,
        dst,
        dest_qp: p.bth.dest_qp,
        psn: p.bth.psn,
        opcode: op,
        syndrome,
        len: rec.orig_len,
        ce: tc.is_some_and(|t| t & 0x03 == 0x03),
        srqn,
        deth,
    })
}

fn classify_decoded(rec: &Record<'_>, decoded: &frame::Decoded<'_>, cut: Option<usize>) -> Item {
    // By reference: the decoded packet is large, and moving it costs a copy.
    let p = match decoded {
        frame::Decoded::NotIb { what } => {
            return Item::NonCm {
                what: NonCm::NotIb(what),
                cut: cut.is_some(),
                rc: None,
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
                cut: cut.is_some(),
                rc: rc_packet(rec, p),
            }
        }
        Some(Err(_)) if cut.is_some() => {
            return Item::NonCm {
                what: NonCm::Cut("MAD"),
                cut: true,
                rc: None,
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
    // A cut MAD: its class is known from 2 bytes, a CM message needs MIN_CUT_MAD.
    let captured = cut.filter(|&n| n < MAD_LEN);
    if captured.is_some_and(|n| n < 2) {
        return Item::NonCm {
            what: NonCm::Cut("MAD header"),
            cut: true,
            rc: None,
        };
    }
    // Non-CM MADs are named by their class; whole SA MADs are decoded.
    let class = MgmtClass::from_raw(mad[1]);
    if class == MgmtClass::SubnAdm && captured.is_none() {
        if let Ok(m) = SaMad::parse(mad) {
            let (src, dst) = wire_addrs(p);
            let mut w = wire(p);
            let icrc = if cut.is_some() {
                w.icrc_value = None;
                Icrc::NotCaptured
            } else {
                p.icrc.into()
            };
            return Item::Sa(Box::new(SaEvent {
                frame: rec.number,
                time: rec.timestamp,
                encap: p.encap,
                src,
                dst,
                mad: m,
                icrc,
                wire: w,
            }));
        }
    }
    if class != MgmtClass::Cm {
        return Item::NonCm {
            what: NonCm::Mad(class),
            cut: cut.is_some(),
            rc: None,
        };
    }
    if captured.is_some_and(|n| n < MIN_CUT_MAD) {
        return Item::NonCm {
            what: NonCm::Cut("CM MAD"),
            cut: true,
            rc: None,
        };
    }
    match Mad::parse_fixed(mad) {
        Ok(m) => {
            let (src, dst) = wire_addrs(p);
            let mut w = wire(p);
            let icrc = if cut.is_some() {
                w.icrc_value = None;
                Icrc::NotCaptured
            } else {
                p.icrc.into()
            };
            Item::Cm(CmEvent {
                frame: rec.number,
                time: rec.timestamp,
                encap: p.encap,
                src,
                dst,
                mad: m,
                icrc,
                wire: w,
                captured: captured.and_then(|n| u16::try_from(n).ok()),
            })
        }
        Err(e) => Item::Malformed {
            frame: rec.number,
            reason: if captured.is_some() {
                format!("CM MAD (cut by the snaplen): {e}")
            } else {
                format!("CM MAD: {e}")
            },
        },
    }
}
