//! cm-ping on a native InfiniBand port (`--umad DEV` whose port's link layer is InfiniBand):
//! peers named by LID or GID (`--connect lid:N` / `gid:G`), the path from the SA (a
//! PathRecord Get, as `rdma_resolve_route` asks for one), the REQ's primary path, MTU and
//! P_Key from it ([`ibcm::sa::connect_params`]), MADs LID-routed.

use std::net::Ipv6Addr;
use std::path::Path;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use ibcm::rt::sa::Sa;
use ibcm::rt::umad::IbPort;
use ibcm::rt::UmadTransport;
use ibcm::sa::{alternate_path, PathQuery, SaClient, SaConfig};
use ibcm_mad::sa::PathRecord;
use ibcm_mad::{Gid, Lid, U4};

/// The CA ACK delay the REQ's Local ACK Timeout is computed with (IBTA `CA_ACK_DELAY`, the
/// device's `ack_delay`; the kernel reads it from the device). cm-ping opens no verbs device
/// on this path, so it uses 15, rxe's and a common HCA value.
pub(crate) const CA_ACK_DELAY: u8 = 15;

/// A peer on an InfiniBand fabric.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum IbTarget {
    /// `lid:N` (decimal or 0x hex).
    Lid(Lid),
    /// `gid:G` (IPv6 notation).
    Gid(Gid),
}

impl IbTarget {
    /// `lid:N` or `gid:G`; `None` for anything else (an IP target).
    pub(crate) fn parse(s: &str) -> Option<Result<IbTarget>> {
        if let Some(n) = s.strip_prefix("lid:") {
            let v = match n.strip_prefix("0x") {
                Some(h) => u16::from_str_radix(h, 16),
                None => n.parse(),
            };
            return Some(match v {
                Ok(l) if l != 0 && l < 0xc000 => Ok(IbTarget::Lid(Lid(l))),
                Ok(l) => Err(anyhow!("lid:{n}: {l:#x} is not a unicast LID (1..0xbfff)")),
                Err(e) => Err(anyhow!("lid:{n}: {e}")),
            });
        }
        s.strip_prefix("gid:").map(|g| {
            g.parse::<Ipv6Addr>()
                .map(|a| IbTarget::Gid(Gid(a.octets())))
                .map_err(|e| anyhow!("gid:{g}: {e}"))
        })
    }
}

/// The InfiniBand port behind `--umad DEV`, or `None` when it is RoCE.
pub(crate) fn port(dev: &str) -> Result<Option<IbPort>> {
    let p = IbPort::of_umad(dev)?;
    Ok(p.is_infiniband().then_some(p))
}

/// The paths a connection to `to` uses: the primary, and with `--alt-path` an alternate.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Paths {
    pub(crate) primary: PathRecord,
    pub(crate) alternate: Option<PathRecord>,
}

/// The path to `to` from the InfiniBand port of `--umad` (`dev`), whose P_Key must be the
/// port's P_Key 0 (the only one whose index this tool knows). With `alt`, also an alternate
/// path with other LIDs ([`ibcm::sa::alternate_path`]) among the paths a GetTable by GIDs
/// (NumbPath 4) returns; `to` must then be a GID, and the SA must have one.
pub(crate) async fn path_to(dev: Option<&str>, to: IbTarget, alt: bool) -> Result<Paths> {
    let dev = dev.ok_or_else(|| anyhow!("lid: and gid: targets need --umad DEV"))?;
    let port = port(dev)?
        .ok_or_else(|| anyhow!("{dev}: the port is RoCE; lid: and gid: need an InfiniBand port"))?;
    let paths = if alt {
        let IbTarget::Gid(dgid) = to else {
            bail!("--alt-path needs a gid: target (the paths between the two ports)");
        };
        let q = PathQuery {
            table: true,
            numb_path: 4,
            ..PathQuery::by_gids(port.gid, dgid, port.pkey0)
        };
        let recs = query(dev, &port, q).await?;
        let primary = *recs
            .first()
            .ok_or_else(|| anyhow!("path to {to:?}: the SA returned no record"))?;
        let alternate = alternate_path(&primary, &recs).ok_or_else(|| {
            anyhow!(
                "path to {to:?}: no alternate path among the SA's {} records (each shares a \
                 LID with the primary: is the SM's LMC 0?)",
                recs.len()
            )
        })?;
        Paths {
            primary,
            alternate: Some(alternate),
        }
    } else {
        Paths {
            primary: resolve(dev, &port, to).await?,
            alternate: None,
        }
    };
    for rec in [Some(paths.primary), paths.alternate].into_iter().flatten() {
        if rec.pkey.0 & 0x7fff != port.pkey0.0 & 0x7fff {
            bail!(
                "path to {to:?}: P_Key {:#06x} is not the port's P_Key 0 ({:#06x})",
                rec.pkey.0,
                port.pkey0.0
            );
        }
    }
    Ok(paths)
}

/// The path from `port` to `to`: a PathRecord Get to the SA (by SLID/DLID, or by SGID/DGID
/// in the port's default partition).
pub(crate) async fn resolve(dev: &str, port: &IbPort, to: IbTarget) -> Result<PathRecord> {
    let q = match to {
        IbTarget::Lid(l) => PathQuery::by_lids(port.lid, l),
        IbTarget::Gid(g) => PathQuery::by_gids(port.gid, g, port.pkey0),
    };
    let recs = query(dev, port, q).await?;
    recs.first()
        .copied()
        .ok_or_else(|| anyhow!("path to {to:?}: the SA returned no record"))
}

/// The records of query `q`, asked of the SA at the port's SM LID, 1 s per attempt, 3
/// retries.
async fn query(dev: &str, port: &IbPort, q: PathQuery) -> Result<Vec<PathRecord>> {
    if port.lid.0 == 0 || port.sm_lid.0 == 0 {
        bail!(
            "{dev}: the port has no LID ({}) or no SM ({}): is a subnet manager running?",
            port.lid,
            port.sm_lid
        );
    }
    let mut cfg = SaConfig::new(port.port, port.sm_lid);
    cfg.dest.sl = U4::masked(port.sm_sl);
    let t = UmadTransport::open_sa(Path::new(dev), ms(cfg.timeout), port.gid)
        .with_context(|| format!("{dev}: opening the SA agent"))?;
    let sa = Sa::spawn(SaClient::new(cfg, std::process::id()), t);
    match sa.path_records(q).await {
        Ok(r) => Ok(r),
        Err(e) => {
            let st = sa.stats().await.unwrap_or_default();
            bail!(
                "PathRecord query ({}): {e} (sent {}, answered {}, stray answers {})",
                if q.table { "GetTable" } else { "Get" },
                st.sent,
                st.answered,
                st.stray
            );
        }
    }
}

fn ms(d: Duration) -> u32 {
    u32::try_from(d.as_millis()).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_parse() {
        assert_eq!(
            IbTarget::parse("lid:4").unwrap().unwrap(),
            IbTarget::Lid(Lid(4))
        );
        assert_eq!(
            IbTarget::parse("lid:0x1f").unwrap().unwrap(),
            IbTarget::Lid(Lid(0x1f))
        );
        assert!(IbTarget::parse("lid:0").unwrap().is_err());
        assert!(IbTarget::parse("lid:0xc000").unwrap().is_err());
        assert!(IbTarget::parse("lid:x").unwrap().is_err());
        let g = IbTarget::parse("gid:fe80::2:c903:0:3").unwrap().unwrap();
        assert_eq!(
            g,
            IbTarget::Gid(Gid("fe80::2:c903:0:3"
                .parse::<Ipv6Addr>()
                .unwrap()
                .octets()))
        );
        assert!(IbTarget::parse("gid:nope").unwrap().is_err());
        assert!(IbTarget::parse("10.0.0.1").is_none());
    }
}
