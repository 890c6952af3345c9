//! A peer on an InfiniBand fabric named by LID or GID ([`PathTarget`]): what a path is asked
//! for, in the notation cm-ping's `--connect` and libibcm's `peer` use (`lid:N`, `gid:G`).

use core::fmt;
use std::net::Ipv6Addr;
use std::str::FromStr;

use ibcm_mad::{Gid, Lid, Pkey};

use super::PathQuery;

/// The highest unicast LID (0xC000 and above are multicast, 0xFFFF permissive).
const MAX_UNICAST_LID: u16 = 0xbfff;

/// A port to ask a path to: by its LID (a PathRecord Get by SLID/DLID, what `saquery -p SLID
/// DLID` asks) or by its GID (by SGID/DGID in the local port's default partition, what
/// rdma_cm's route query asks).
///
/// Written `lid:N` (decimal, or hex with `0x`; a unicast LID, 1..=0xBFFF) or `gid:G` (IPv6
/// notation; not the zero GID, not a multicast GID):
///
/// ```
/// use ibcm::sa::PathTarget;
/// let t: PathTarget = "lid:0x1f".parse().unwrap();
/// assert_eq!(t.to_string(), "lid:31");
/// assert!("gid:fe80::2:c903:0:3".parse::<PathTarget>().is_ok());
/// assert!("lid:0".parse::<PathTarget>().is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PathTarget {
    /// A unicast LID.
    Lid(Lid),
    /// A unicast GID.
    Gid(Gid),
}

/// Why a string is not a [`PathTarget`]: the reason, naming the input.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct PathTargetError(String);

impl PathTarget {
    /// `Some` for a unicast LID (1..=0xBFFF).
    pub fn lid(lid: Lid) -> Option<Self> {
        (lid.0 != 0 && lid.0 <= MAX_UNICAST_LID).then_some(PathTarget::Lid(lid))
    }

    /// `Some` for a unicast GID (not zero, not multicast `ff00::/8`).
    pub fn gid(gid: Gid) -> Option<Self> {
        (gid != Gid::ZERO && gid.0[0] != 0xff).then_some(PathTarget::Gid(gid))
    }

    /// Whether `s` is written as a target (`lid:` or `gid:` in front), well-formed or not:
    /// what tells it from an IP address.
    pub fn is_written_as_one(s: &str) -> bool {
        s.starts_with("lid:") || s.starts_with("gid:")
    }

    /// The PathRecord Get for this target from the local port `slid`/`sgid`, whose P_Key 0
    /// is `pkey0`: [`PathQuery::by_lids`] for a LID, [`PathQuery::by_gids`] in partition
    /// `pkey0` for a GID.
    pub fn query(self, slid: Lid, sgid: Gid, pkey0: Pkey) -> PathQuery {
        match self {
            PathTarget::Lid(dlid) => PathQuery::by_lids(slid, dlid),
            PathTarget::Gid(dgid) => PathQuery::by_gids(sgid, dgid, pkey0),
        }
    }
}

impl FromStr for PathTarget {
    type Err = PathTargetError;

    fn from_str(s: &str) -> Result<Self, PathTargetError> {
        let bad = |why: String| PathTargetError(format!("{s:?}: {why}"));
        if let Some(n) = s.strip_prefix("lid:") {
            let (digits, radix) = match n.strip_prefix("0x").or_else(|| n.strip_prefix("0X")) {
                Some(h) => (h, 16),
                None => (n, 10),
            };
            // Digits only (`u16` parsing would take a leading `+`).
            if digits.is_empty() || !digits.chars().all(|c| c.is_digit(radix)) {
                return Err(bad("not a LID (decimal, or hex with 0x)".into()));
            }
            return match u16::from_str_radix(digits, radix) {
                Ok(l) => PathTarget::lid(Lid(l))
                    .ok_or_else(|| bad(format!("{l:#x} is not a unicast LID (1..0xbfff)"))),
                Err(e) => Err(bad(format!("not a LID: {e}"))),
            };
        }
        if let Some(g) = s.strip_prefix("gid:") {
            let a = g
                .parse::<Ipv6Addr>()
                .map_err(|e| bad(format!("not a GID (IPv6 notation): {e}")))?;
            return PathTarget::gid(Gid(a.octets()))
                .ok_or_else(|| bad("the zero GID or a multicast GID names no port".into()));
        }
        Err(bad("neither lid:N nor gid:G".into()))
    }
}

impl fmt::Display for PathTarget {
    /// `lid:N` (decimal) or `gid:G` (IPv6 notation): what [`FromStr`] reads back.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PathTarget::Lid(l) => write!(f, "lid:{}", l.0),
            PathTarget::Gid(g) => write!(f, "gid:{}", Ipv6Addr::from(g.0)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_parse_and_print_back() {
        let t = |s: &str| s.parse::<PathTarget>();
        assert_eq!(t("lid:4"), Ok(PathTarget::Lid(Lid(4))));
        assert_eq!(t("lid:0x1f"), Ok(PathTarget::Lid(Lid(0x1f))));
        assert_eq!(t("lid:0XBFFF"), Ok(PathTarget::Lid(Lid(0xbfff))));
        let g = t("gid:fe80::2:c903:0:3").unwrap();
        assert_eq!(g.to_string(), "gid:fe80::2:c903:0:3");
        assert_eq!(t(&g.to_string()), Ok(g));
        assert_eq!(t("lid:31").unwrap().to_string(), "lid:31");
        for bad in [
            "lid:0",
            "lid:0xc000",
            "lid:65535",
            "lid:65536",
            "lid:",
            "lid:x",
            "lid:+5",
            "lid:0x+5",
            "lid: 5",
            "lid:-1",
            "gid:",
            "gid:nope",
            "gid:::",
            "gid:ff02::1",
            "gid:10.0.0.1",
            "10.0.0.1",
            "LID:5",
            "",
        ] {
            let e = t(bad).unwrap_err();
            assert!(e.to_string().contains(&format!("{bad:?}")), "{bad}: {e}");
        }
        assert!(PathTarget::is_written_as_one("lid:zz"));
        assert!(PathTarget::is_written_as_one("gid:"));
        assert!(!PathTarget::is_written_as_one("10.0.0.1:4791"));
    }

    #[test]
    fn targets_query_by_lids_or_by_gids() {
        let sgid = Gid([0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2]);
        let q = PathTarget::Lid(Lid(9)).query(Lid(2), sgid, Pkey(0xffff));
        assert_eq!(q, PathQuery::by_lids(Lid(2), Lid(9)));
        let dgid = Gid([0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 9]);
        let q = PathTarget::Gid(dgid).query(Lid(2), sgid, Pkey(0x8001));
        assert_eq!(q, PathQuery::by_gids(sgid, dgid, Pkey(0x8001)));
    }
}
