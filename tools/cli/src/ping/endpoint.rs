//! The endpoint `cm-ping` runs on: its own (UDP or umad) or the node's CM service's.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use anyhow::{anyhow, Context, Result};
use ibcm::proto::{EndpointConfig, IbAddr, PeerAddr};
use ibcm::rt::{Cm, IcrcPolicy, UdpTransport, UmadTransport};
use ibcm_mad::cma::PortSpace;
use ibcm_mad::{Gid, Guid, ServiceId};

use super::args::Args;

pub(crate) fn service_id(args: &Args, default_port: u16) -> ServiceId {
    match (args.service_id, args.port) {
        (Some(sid), _) => ServiceId(sid),
        (None, Some(p)) => ServiceId::rdma_cm(ps(args), p),
        (None, None) => ServiceId::rdma_cm(ps(args), default_port),
    }
}

fn ps(args: &Args) -> PortSpace {
    if args.xrc {
        PortSpace::Ib
    } else {
        PortSpace::Tcp
    }
}

pub(crate) async fn bind(args: &Args, local: IpAddr) -> Result<(Cm, PeerAddrMaker)> {
    let guid = Guid(0x0002_c903_0000_0000 | u64::from(std::process::id()));
    if let Some(path) = &args.daemon {
        let (cm, _) = super::node::attach_cm(path).await?;
        return Ok((cm, PeerAddrMaker::Udp));
    }
    let cfg = EndpointConfig {
        local_ca_guid: guid,
        local_gid: Gid::from_ip(local),
        timewait_slack: Duration::from_millis(args.timewait_slack),
        ..Default::default()
    };
    let mut cfg = cfg;
    super::stateless::configure(&args.stateless, &mut cfg);
    if let Some(dev) = &args.umad {
        if let Some(port) = super::ib::port(dev)? {
            let t = UmadTransport::open_ib(dev, &port)?;
            let cfg = EndpointConfig {
                local_gid: port.gid,
                ..cfg
            };
            let (cm, _) = Cm::bind(t, cfg);
            return Ok((cm, PeerAddrMaker::Umad));
        }
        let ip = args
            .local_ip
            .ok_or_else(|| anyhow!("--umad needs --local-ip (the address of the RoCE netdev)"))?;
        let t = UmadTransport::open(dev, args.gid_index, Gid::from_ip(ip))?;
        let cfg = EndpointConfig {
            local_gid: Gid::from_ip(ip),
            ..cfg
        };
        let (cm, _) = Cm::bind(t, cfg);
        return Ok((cm, PeerAddrMaker::Umad));
    }
    let mut t = UdpTransport::bind(local)
        .await
        .with_context(|| format!("cannot bind UDP {local}:4791"))?;
    if args.icrc_lenient {
        t = t.with_icrc_policy(IcrcPolicy::Lenient);
    }
    let (cm, _) = Cm::bind(t, cfg);
    Ok((cm, PeerAddrMaker::Udp))
}

#[derive(Debug, Clone, Copy)]
pub(crate) enum PeerAddrMaker {
    Udp,
    Umad,
}

impl PeerAddrMaker {
    pub(crate) fn peer(self, ip: IpAddr) -> PeerAddr {
        match self {
            PeerAddrMaker::Udp => PeerAddr::Udp(SocketAddr::new(ip, 4791)),
            PeerAddrMaker::Umad => PeerAddr::Ib(IbAddr::roce(Gid::from_ip(ip))),
        }
    }
}
