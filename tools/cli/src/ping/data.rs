//! The `--verbs` data path's options ([`VerbsArgs`], [`DataProto`]) and its process-wide
//! counters, which the summary line reports.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use clap::ValueEnum;

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
