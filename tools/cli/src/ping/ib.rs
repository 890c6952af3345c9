//! cm-ping on a native InfiniBand port (`--umad DEV` whose port's link layer is InfiniBand):
//! peers named by LID or GID (`--connect lid:N` / `gid:G`, an [`ibcm::sa::PathTarget`]), the
//! path from the SA through an [`ibcm::rt::sa::PathResolver`] (a PathRecord Get, as
//! `rdma_resolve_route` asks for one; with `--alt-path` also an alternate), the REQ's paths,
//! MTU and P_Key from it ([`ibcm::sa::connect_params`]), MADs LID-routed.

use anyhow::{anyhow, Result};
use ibcm::rt::sa::PathResolver;
use ibcm::rt::umad::IbPort;
use ibcm::sa::PathTarget;
use ibcm_mad::sa::PathRecord;

/// The CA ACK delay the REQ's Local ACK Timeout is computed with
/// ([`ibcm::sa::DEFAULT_CA_ACK_DELAY`]: cm-ping opens no verbs device on this path).
pub(crate) const CA_ACK_DELAY: u8 = ibcm::sa::DEFAULT_CA_ACK_DELAY;

/// `lid:N` or `gid:G`; `None` for anything else (an IP target).
pub(crate) fn parse(s: &str) -> Option<Result<PathTarget>> {
    PathTarget::is_written_as_one(s).then(|| s.parse::<PathTarget>().map_err(Into::into))
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

/// The path to `to` from the InfiniBand port of `--umad` (`dev`), in the port's P_Key 0
/// ([`PathResolver::resolve`]). With `alt`, also an alternate path with other LIDs
/// ([`PathResolver::resolve_with_alternate`]), which the SA must have.
pub(crate) async fn path_to(dev: Option<&str>, to: PathTarget, alt: bool) -> Result<Paths> {
    let dev = dev.ok_or_else(|| anyhow!("lid: and gid: targets need --umad DEV"))?;
    let port = port(dev)?
        .ok_or_else(|| anyhow!("{dev}: the port is RoCE; lid: and gid: need an InfiniBand port"))?;
    let r = PathResolver::open(dev, &port)?;
    if !alt {
        let primary = r
            .resolve(to)
            .await
            .map_err(|e| anyhow!("path to {to}: {e}"))?;
        return Ok(Paths {
            primary,
            alternate: None,
        });
    }
    let (primary, alternate) = r
        .resolve_with_alternate(to)
        .await
        .map_err(|e| anyhow!("path to {to}: {e}"))?;
    let alternate = alternate.ok_or_else(|| {
        anyhow!(
            "path to {to}: no alternate path (every path the SA gave shares a LID with the \
             primary: is the SM's LMC 0?)"
        )
    })?;
    Ok(Paths {
        primary,
        alternate: Some(alternate),
    })
}
