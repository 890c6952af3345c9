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
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use anyhow::{bail, Result};
use clap::ValueEnum;

mod args;
mod connect;
mod counts;
mod endpoint;
mod listen;
mod node;
mod out;
mod req;
#[cfg(feature = "verbs")]
mod rping;
mod stateless;
mod stay;
#[cfg(feature = "verbs")]
mod ucmatose;
#[cfg(feature = "verbs")]
mod verbs;

/// The data protocol run on each connection's QP.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum DataProto {
    /// rping's RDMA READ/WRITE ping (a kernel `rping` is the peer).
    Rping,
    /// ucmatose's SEND exchange (a kernel `ucmatose` is the peer).
    Ucmatose,
    /// No data: each QP is created, brought up and destroyed, as cmtime does.
    None,
}

/// The `--verbs` options.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct VerbsArgs {
    /// Give every connection a real RC QP on this RDMA device (e.g. rxe0) and exchange data
    /// on it (needs the `verbs` feature; use with --umad on the same device).
    #[arg(long, value_name = "DEVICE")]
    pub(crate) verbs: Option<String>,
    /// --verbs: the data exchanged on each connection.
    #[arg(long, value_enum, default_value_t = DataProto::Rping, requires = "verbs")]
    pub(crate) data: DataProto,
    /// --verbs: bytes per ping / message.
    #[arg(long, default_value_t = 64, requires = "verbs")]
    pub(crate) size: u32,
    /// --verbs: pings per connection (rping client), messages each way (ucmatose).
    #[arg(long, default_value_t = 1, requires = "verbs")]
    pub(crate) pings: u32,
    /// --verbs: the device port.
    #[arg(long, default_value_t = 1, requires = "verbs")]
    pub(crate) verbs_port: u8,
}

/// Connections whose data exchange completed and checked out, those that did not, and the
/// bytes checked.
#[derive(Debug, Default)]
pub(crate) struct DataCounts {
    pub(crate) verified: AtomicU64,
    pub(crate) failed: AtomicU64,
    pub(crate) bytes: AtomicU64,
}

pub(crate) static DATA: DataCounts = DataCounts {
    verified: AtomicU64::new(0),
    failed: AtomicU64::new(0),
    bytes: AtomicU64::new(0),
};

/// Set once `--verbs` opened its device: the summary line reports the data.
pub(crate) static ENABLED: AtomicBool = AtomicBool::new(false);
/// `--data none`: no data is exchanged, so none is expected.
pub(crate) static NO_DATA: AtomicBool = AtomicBool::new(false);

/// What the summary line gets appended with `--verbs` (empty without).
pub(crate) fn summary_suffix() -> String {
    if !ENABLED.load(Ordering::Relaxed) {
        return String::new();
    }
    format!(
        ", {} data verified, {} data failed, {} bytes verified",
        DATA.verified.load(Ordering::Relaxed),
        DATA.failed.load(Ordering::Relaxed),
        DATA.bytes.load(Ordering::Relaxed)
    )
}

/// Whether every connection that was established exchanged its data.
pub(crate) fn data_ok(established: u64) -> bool {
    !ENABLED.load(Ordering::Relaxed)
        || NO_DATA.load(Ordering::Relaxed)
        || (DATA.failed.load(Ordering::Relaxed) == 0
            && DATA.verified.load(Ordering::Relaxed) == established)
}

pub use args::Args;
#[cfg(feature = "verbs")]
pub(crate) use verbs::{connect, init, release_held, serve};

/// With `--verbs`: where the QP work went (stderr), else nothing.
pub(crate) fn report_timing() {
    #[cfg(feature = "verbs")]
    if ENABLED.load(Ordering::Relaxed) {
        eprintln!("{}", verbs::timing_line());
    }
}

/// Without the `verbs` feature there is nothing to release.
#[cfg(not(feature = "verbs"))]
pub(crate) fn release_held() {}

/// Without the `verbs` feature: `--verbs` is refused.
#[cfg(not(feature = "verbs"))]
pub(crate) fn init(args: &Args) -> anyhow::Result<()> {
    if args.verbs.verbs.is_some() {
        anyhow::bail!("--verbs: this cm-ping was built without the `verbs` feature");
    }
    Ok(())
}

/// Without the `verbs` feature nothing reaches here (`init` refused `--verbs`).
#[cfg(not(feature = "verbs"))]
pub(crate) async fn serve(
    _cm: &ibcm::rt::Cm,
    _args: &Args,
    _counts: &counts::Counts,
    _inc: ibcm::rt::Incoming,
) -> anyhow::Result<()> {
    anyhow::bail!("--verbs: this cm-ping was built without the `verbs` feature")
}

/// Without the `verbs` feature nothing reaches here (`init` refused `--verbs`).
#[cfg(not(feature = "verbs"))]
pub(crate) async fn connect(
    _cm: &ibcm::rt::Cm,
    _args: &Args,
    _counts: &counts::Counts,
    _p: ibcm::proto::ConnectParams,
    i: u64,
) -> Option<ibcm::rt::Connection> {
    out::out(
        _args,
        format_args!("connection {i}: built without the `verbs` feature"),
    );
    None
}

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
    init(&args)?;
    if let Some(ip) = args.listen {
        return listen::listen(args, ip).await;
    }
    let Some(target) = args.connect.clone() else {
        bail!("give --listen ADDR or --connect ADDR");
    };
    connect::connect(args, &target).await
}
