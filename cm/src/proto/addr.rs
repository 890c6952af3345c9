//! Where a MAD goes to or comes from.

use core::fmt;
use std::net::SocketAddr;

use ibcm_mad::{Gid, Lid, Qkey, Qpn};

/// The address of a peer's CM (its QP1), as the transport understands it.
///
/// The core never interprets it: it answers a request to the address it came from and sends a
/// connection's later messages to the address the connection was set up with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PeerAddr {
    /// RoCEv2 over UDP (the transport adds BTH/DETH/ICRC), or the in-memory transport and the
    /// simulator, which use socket addresses as node names.
    Udp(SocketAddr),
    /// A native IB / RoCE address for the umad transport.
    Ib(IbAddr),
}

/// Addressing of a remote QP1 through umad.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct IbAddr {
    /// Destination LID (0xFFFF on RoCE).
    pub lid: Lid,
    /// Destination GID; required on RoCE (GRH addressing).
    pub gid: Option<Gid>,
    /// Destination QP (1 for the CM).
    pub qpn: Qpn,
    /// Q_Key (0x8001_0000 for QP1).
    pub qkey: Qkey,
    /// Service level.
    pub sl: u8,
    /// P_Key index.
    pub pkey_index: u16,
}

impl IbAddr {
    /// The CM of a RoCE peer with the given GID.
    pub fn roce(gid: Gid) -> Self {
        IbAddr {
            lid: Lid::PERMISSIVE,
            gid: Some(gid),
            qpn: Qpn::masked(1),
            qkey: Qkey::GSI,
            sl: 0,
            pkey_index: 0,
        }
    }
}

impl PeerAddr {
    /// The IP address, for UDP peers.
    pub fn ip(&self) -> Option<std::net::IpAddr> {
        match self {
            PeerAddr::Udp(sa) => Some(sa.ip()),
            PeerAddr::Ib(ib) => ib.gid.map(Gid::to_ip),
        }
    }

    /// The peer's GID on RoCE: the IPv4-mapped or IPv6 address, or the GRH GID.
    pub fn gid(&self) -> Option<Gid> {
        match self {
            PeerAddr::Udp(sa) => Some(Gid::from_ip(sa.ip())),
            PeerAddr::Ib(ib) => ib.gid,
        }
    }
}

impl From<SocketAddr> for PeerAddr {
    fn from(sa: SocketAddr) -> Self {
        PeerAddr::Udp(sa)
    }
}

impl fmt::Display for PeerAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PeerAddr::Udp(sa) => write!(f, "{sa}"),
            PeerAddr::Ib(ib) => match ib.gid {
                Some(g) => write!(f, "{g}/qp{}", ib.qpn.get()),
                None => write!(f, "lid{}/qp{}", ib.lid, ib.qpn.get()),
            },
        }
    }
}
