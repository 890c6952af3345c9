//! `cm-ping`'s program: the binary parses [`Args`] and calls [`run`], which listens
//! (`listen`) or connects (`connect`) on an endpoint of its own or the node's (`endpoint`).
//!
//! The data path (`--verbs DEVICE`, feature `verbs`): every connection gets a real RC QP
//! brought up through the CM in the kernel's order, then exchanges data with a protocol that
//! rdma-core's examples speak (`--data`):
//!
//! * `rping` (default): rping's ping/pong (`librdmacm/examples/rping.c`): the client
//!   advertises its source buffer ({be64 addr, be32 rkey, be32 size} in a SEND), the server
//!   RDMA READs it and answers with a go-ahead SEND, the client advertises its sink buffer,
//!   the server RDMA WRITEs the data back and sends a go-ahead. Both sides check the contents
//!   against rping's pattern (`rdma-ping-N: ` then `A`…`z`), so a kernel `rping -c`/`-s`
//!   is the peer.
//! * `ucmatose`: ucmatose's exchange (`librdmacm/examples/cmatose.c`): the server SENDs
//!   `--pings` messages of `--size` bytes and receives as many, the client receives first,
//!   then answers; the server disconnects. ucmatose sends an uninitialised buffer, so only the
//!   lengths of what arrives are checked.
//! * `none`: the QP is created, brought up and destroyed with the connection, nothing is
//!   sent (cmtime's work per connection; one CQ for all QPs).
//!
//! The summary line gets `, N data verified, F data failed, B bytes verified`.

use std::process::ExitCode;

use anyhow::{bail, Result};

mod args;
mod connect;
mod counts;
mod data;
mod datapath;
mod end;
mod endpoint;
mod ib;
mod listen;
mod node;
mod out;
#[cfg(feature = "verbs")]
mod qp;
mod req;
#[cfg(feature = "verbs")]
mod rping;
mod stateless;
mod stay;
#[cfg(feature = "verbs")]
mod ucmatose;
#[cfg(feature = "verbs")]
mod verbs;

pub use args::Args;

/// Runs `cm-ping` with `args`: listens or connects, prints its lines; the exit code says
/// whether every connection was established (`--connect`; the module docs of the binary).
pub async fn run(args: Args) -> Result<ExitCode> {
    stateless::check(
        &args.stateless,
        args.verbs.verbs.is_some(),
        args.reject.is_some(),
        args.accept_delay.is_some(),
        args.daemon.is_some(),
    )?;
    datapath::init(&args)?;
    if let Some(l) = args.listen {
        let ip = match l.ip() {
            Some(ip) => ip,
            None => {
                let dev = args.umad.as_deref().unwrap_or_default();
                if args.umad.is_none() || ib::port(dev)?.is_none() {
                    bail!("--listen ib needs --umad DEV on an InfiniBand port");
                }
                std::net::Ipv4Addr::UNSPECIFIED.into()
            }
        };
        return listen::listen(args, ip).await;
    }
    let Some(target) = args.connect.clone() else {
        bail!("give --listen ADDR or --connect ADDR");
    };
    connect::connect(args, &target).await
}
