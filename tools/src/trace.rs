//! From capture records to CM events.
//!
//! [`classify`] decodes one record (link layer → IB transport → MAD → CM message) and says
//! what it was: a CM MAD ([`Item::Cm`]), something else ([`Item::NonCm`], counted), or a
//! malformed frame ([`Item::Malformed`], reported with its reason). It never fails and never
//! panics: every problem becomes an item.

use std::fmt;
use std::net::IpAddr;
use std::time::Duration;

use ibcm_mad::capture::Record;
use ibcm_mad::frame::{self, Encap, IbPacket, IcrcStatus};
use ibcm_mad::{Gid, Lid, Mad, MgmtClass};

/// One end of a packet: an IP address (RoCEv2), a GID (RoCEv1, IB with GRH) or a LID (IB).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Endpoint {
    /// RoCEv2 IP address.
    Ip(IpAddr),
    /// GID from a GRH.
    Gid(Gid),
    /// LID from an LRH.
    Lid(Lid),
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Endpoint::Ip(ip) => write!(f, "{ip}"),
            Endpoint::Gid(g) => write!(f, "{g}"),
            Endpoint::Lid(l) => write!(f, "LID {l}"),
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
    pub src: Endpoint,
    /// Receiver.
    pub dst: Endpoint,
    /// The MAD.
    pub mad: Mad,
    /// ICRC verdict.
    pub icrc: Icrc,
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
        /// What it was, briefly ("ARP", "RC SEND", "MAD class SubnAdm", …).
        what: String,
    },
    /// A frame that could not be decoded.
    Malformed {
        /// 1-based frame number.
        frame: u64,
        /// Why.
        reason: String,
    },
}

fn endpoints(p: &IbPacket<'_>) -> (Endpoint, Endpoint) {
    if let Some(ip) = &p.ip {
        return (Endpoint::Ip(ip.src_addr()), Endpoint::Ip(ip.dst_addr()));
    }
    if let Some(grh) = &p.grh {
        return (Endpoint::Gid(grh.sgid), Endpoint::Gid(grh.dgid));
    }
    match &p.lrh {
        Some(lrh) => (Endpoint::Lid(lrh.slid), Endpoint::Lid(lrh.dlid)),
        None => (Endpoint::Lid(Lid(0)), Endpoint::Lid(Lid(0))),
    }
}

/// Classifies one capture record.
pub fn classify(rec: &Record<'_>) -> Item {
    let decoded = match frame::decode(rec.link_type, rec.data) {
        Ok(d) => d,
        Err(e) => {
            return Item::Malformed {
                frame: rec.number,
                reason: e.to_string(),
            }
        }
    };
    let p = match decoded {
        frame::Decoded::NotIb { what } => {
            return Item::NonCm {
                what: what.to_string(),
            }
        }
        frame::Decoded::Ib(p) => p,
    };
    let mad = match p.mad() {
        None => {
            return Item::NonCm {
                what: format!("{} {}", p.encap, p.bth.opcode),
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
            what: format!("MAD class {class}"),
        };
    }
    match Mad::parse(mad) {
        Ok(m) => {
            let (src, dst) = endpoints(&p);
            Item::Cm(CmEvent {
                frame: rec.number,
                time: rec.timestamp,
                encap: p.encap,
                src,
                dst,
                mad: m,
                icrc: p.icrc.into(),
            })
        }
        Err(e) => Item::Malformed {
            frame: rec.number,
            reason: format!("CM MAD: {e}"),
        },
    }
}

/// Running totals over a capture.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Totals {
    /// Records read.
    pub frames: u64,
    /// CM MADs.
    pub cm: u64,
    /// Records that were not CM.
    pub non_cm: u64,
    /// Malformed records.
    pub malformed: u64,
    /// CM MADs with a bad ICRC.
    pub bad_icrc: u64,
}

impl Totals {
    /// Counts one item.
    pub fn count(&mut self, item: &Item) {
        self.frames += 1;
        match item {
            Item::Cm(ev) => {
                self.cm += 1;
                if ev.icrc == Icrc::Bad {
                    self.bad_icrc += 1;
                }
            }
            Item::NonCm { .. } => self.non_cm += 1,
            Item::Malformed { .. } => self.malformed += 1,
        }
    }
}
