//! What the filters (`--addr`, `--service-id`, …) and the `-Y` expressions compare with: an
//! address ([`AddrMatch`]) and a number ([`parse_u64`]).

use std::net::IpAddr;
use std::str::FromStr;

use ibcm_mad::{Gid, Lid};

use crate::trace::WireAddr;

/// An address to match: an IP address (also matches the IPv4-mapped / IPv6 GID form), a GID,
/// or a LID.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AddrMatch {
    /// IP address or GID (a GID is written as an IPv6 address).
    Ip(IpAddr),
    /// LID (`lid:N`).
    Lid(Lid),
}

impl FromStr for AddrMatch {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        if let Some(l) = s.strip_prefix("lid:").or_else(|| s.strip_prefix("LID:")) {
            return parse_u64(l)
                .and_then(|v| u16::try_from(v).ok())
                .map(|v| AddrMatch::Lid(Lid(v)))
                .ok_or_else(|| format!("bad LID {l:?}"));
        }
        s.parse::<IpAddr>()
            .map(AddrMatch::Ip)
            .map_err(|_| format!("{s:?} is not an IP address, GID (IPv6 notation) or lid:N"))
    }
}

impl AddrMatch {
    /// The GID this address is (an IP address as its GID form; a LID has none).
    pub(crate) fn gid(self) -> Option<Gid> {
        match self {
            AddrMatch::Ip(ip) => Some(Gid::from_ip(ip)),
            AddrMatch::Lid(_) => None,
        }
    }

    /// Whether `e` is this address.
    pub fn matches(self, e: &WireAddr) -> bool {
        match (self, e) {
            (AddrMatch::Ip(a), WireAddr::Ip(b)) => a == *b || Gid::from_ip(a) == Gid::from_ip(*b),
            (AddrMatch::Ip(_), WireAddr::Gid(g)) => self.gid() == Some(*g),
            (AddrMatch::Lid(a), WireAddr::Lid(b)) => a == *b,
            _ => false,
        }
    }
}

/// Parses a number written in decimal or as `0x` hex.
pub fn parse_u64(s: &str) -> Option<u64> {
    let s = s.trim().replace('_', "");
    match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(h) => u64::from_str_radix(h, 16).ok(),
        None => s.parse().ok(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipv4_matches_mapped_gid() {
        let a: AddrMatch = "10.0.0.1".parse().unwrap();
        let g = Gid::from_ip("10.0.0.1".parse().unwrap());
        assert!(a.matches(&WireAddr::Gid(g)));
    }
}
