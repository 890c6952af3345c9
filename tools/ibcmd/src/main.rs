//! `ibcmd`: the node's CM service. One per node: it owns the node's CM MAD channel (RoCEv2
//! over UDP on `--addr`:4791, or Linux umad: a RoCE port with `--addr`, or a native
//! InfiniBand port, LID-routed, with an SA client for the clients' path queries), runs the
//! ibcm endpoint, hosts XRC TGT QPs with their ownership policies, and serves the node's
//! processes on a Unix socket (`ibcm::rt::Cm::attach`). See `docs/ibcmd.md`.
//!
//! ```text
//! ibcmd --addr IP --socket PATH [--umad DEV [--gid-index N]]   (UDP; umad on a RoCE port)
//! ibcmd --umad DEV --socket PATH                               (umad on an InfiniBand port)
//!       [--backend sim|verbs] [--mode 660] [--group NAME|GID]
//!       [--state DIR] [--max-conns-per-client N]
//!       [--max-conns-per-user N] [--max-clients-per-user N] [--max-tgt-qps-per-user N]
//!       [--max-tgt-qps-non-root N] [--listen-backlog N]
//!       [--max-queue-bytes-per-client N] [--max-queue-bytes-per-user N]
//!       [--hello-timeout-ms N] [--reserved-fds N] [--reserve RANGE=UID]…
//!       [--max-half-open N] [--max-half-open-per-peer N] [--max-half-open-per-service N]
//!       [--max-half-open-secs N] [--max-established N] [--max-established-per-peer N]
//!       [--max-path-queries-per-client N] [--max-path-queries-per-user N]
//!       [--max-laps-per-client N] [--max-laps-per-user N]
//! ibcmd leaks --socket PATH [--json]               (orphaned and leaked TGT QPs)
//! ibcmd reclaim --socket PATH [--qpn N]            (destroy orphans: this user's; root: any)
//! ibcmd xrc --socket PATH [--hold]                 (a session: keeper requests, XRC services)
//! ibcmd keeper serve|status|leaks|hold|request …   (the `xrcd-keeper` commands)
//! ```
//!
//! Foreground, logs to standard error (`IBCMD_LOG`, default `info`). SIGTERM or SIGINT: every
//! client's connections get DREQs (REJ while being set up), every TGT QP still live is
//! released ("keeper lost"), the socket is removed, exit 0.

use std::net::{IpAddr, SocketAddr};
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::{Parser, ValueEnum};
use ibcm::proto::{ConnectionError, EndpointConfig, StaleConnection};
use ibcm::rt::node::{
    Journal, JournalEntry, JournalTx, NodeServer, Reservation, ServerConfig, StateDir,
    DEFAULT_STATE_DIR,
};
use ibcm::rt::sa::PathResolver;
use ibcm::rt::umad::IbPort;
use ibcm::rt::{Cm, UdpTransport, UmadTransport};
use ibcm_mad::xrc::{GoneCause, RejectKind, TargetGone};
use ibcm_mad::{CommId, Gid, Guid, Qpn};
use ibcm_xrc::cm::rt::XrcServer;
use ibcm_xrc::cm::{XrcTarget, XrcTargetConfig};
use ibcm_xrc::keeper::node::NodeKeeper;
use ibcm_xrc::keeper::server::KeeperLimits;
use ibcm_xrc::verbs::model::{KernelModel, ModelConfig};
use ibcm_xrc::{RegistryConfig, TgtRegistry, Verbs};
use tokio::net::UnixListener;
use tracing::{info, warn};

mod leaks;
mod session;
mod xrc;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Backend {
    /// The software model of the kernel's XRC semantics.
    Sim,
    /// rdma-core (libibverbs); needs the `rdma` feature.
    Verbs,
}

#[derive(Debug, Parser)]
#[command(
    name = "ibcmd",
    version,
    about = "The node's CM service",
    after_help = "`ibcmd leaks --socket PATH` lists the daemon's orphaned and leaked TGT QPs; `ibcmd reclaim --socket PATH [--qpn N]` destroys orphans.\n`ibcmd keeper serve|status|leaks|hold|request ...` runs the xrcd-keeper commands."
)]
struct Args {
    /// Local IP: the CM listens on UDP IP:4791 (RoCEv2), or with --umad on a RoCE port the
    /// RoCE netdev's IP. Not with --umad on an InfiniBand port (the CM is reached by LID;
    /// clients name peers lid:N or gid:G).
    #[arg(long)]
    addr: Option<IpAddr>,
    /// The Unix socket clients attach to.
    #[arg(long)]
    socket: PathBuf,
    /// Verbs backend for XRC domains and TGT QPs.
    #[arg(long, value_enum, default_value_t = Backend::Sim)]
    backend: Backend,
    /// Mode of the socket file (octal).
    #[arg(long, default_value = "660", value_parser = parse_mode)]
    mode: u32,
    /// Group of the socket file (a name from /etc/group, or a number).
    #[arg(long)]
    group: Option<String>,
    /// State directory (the journal of live connections): created mode 0700 if missing;
    /// refused if another user owns it or others may write to it.
    #[arg(long, value_name = "DIR", default_value = DEFAULT_STATE_DIR)]
    state: PathBuf,
    /// Use Linux umad on this device instead of UDP: its port's link layer (sysfs) says
    /// RoCE (then --addr) or InfiniBand (LID-routed, path queries answered from the SA).
    #[arg(long, value_name = "DEV")]
    umad: Option<String>,
    /// umad on a RoCE port: local GID index of the RoCEv2 GID of --addr (default 1).
    #[arg(long)]
    gid_index: Option<u8>,
    /// Path queries (lid:N, gid:G) one client (session) may have in flight.
    #[arg(long, default_value_t = ServerConfig::default().max_path_queries)]
    max_path_queries_per_client: usize,
    /// Path queries one Unix user's clients may have in flight together.
    #[arg(long, default_value_t = ServerConfig::default().max_path_queries_per_user)]
    max_path_queries_per_user: usize,
    /// LAP exchanges (path migration) one client (session) may have at once: its LAPs
    /// waiting for their APR and the LAPs held for it unanswered; 0 serves no path migration.
    #[arg(long, default_value_t = ServerConfig::default().max_laps)]
    max_laps_per_client: usize,
    /// LAP exchanges one Unix user's clients may have together.
    #[arg(long, default_value_t = ServerConfig::default().max_laps_per_user)]
    max_laps_per_user: usize,
    /// Connections one client (session) may hold.
    #[arg(long, default_value_t = ServerConfig::default().max_connections)]
    max_conns_per_client: usize,
    /// Connections one Unix user may hold over all its clients.
    #[arg(long, default_value_t = ServerConfig::default().max_connections_per_user)]
    max_conns_per_user: usize,
    /// Live TGT QPs one Unix user's XRC services may have created (orphans included).
    #[arg(long, default_value_t = ServerConfig::default().max_tgt_qps_per_user)]
    max_tgt_qps_per_user: usize,
    /// Live TGT QPs all users but root may have created together (the rest is root's).
    #[arg(long, default_value_t = ServerConfig::default().max_tgt_qps_non_root)]
    max_tgt_qps_non_root: usize,
    /// Clients (sessions) one Unix user may have attached at once.
    #[arg(long, default_value_t = ServerConfig::default().max_sessions_per_user)]
    max_clients_per_user: usize,
    /// Bytes queued towards one client (session) that does not read before it is dropped.
    #[arg(long, default_value_t = ServerConfig::default().queue_bytes)]
    max_queue_bytes_per_client: usize,
    /// Bytes queued towards all the clients of one Unix user before the one over it is
    /// dropped.
    #[arg(long, default_value_t = ServerConfig::default().queue_bytes_per_user)]
    max_queue_bytes_per_user: usize,
    /// Milliseconds a new client has to say hello before it is closed.
    #[arg(long, default_value_t = default_hello_timeout_ms())]
    hello_timeout_ms: u64,
    /// File descriptors kept for root's clients: other users' clients are refused once fewer
    /// would be left below RLIMIT_NOFILE.
    #[arg(long, default_value_t = ServerConfig::default().reserved_fds)]
    reserved_fds: usize,
    /// REQs a listener may have delivered to its client and not yet answered; beyond it the
    /// daemon rejects REQs with REJ 3 "no resources" (a SYN backlog).
    #[arg(long, default_value_t = ServerConfig::default().listen_backlog)]
    listen_backlog: usize,
    /// Service IDs only one user may listen on: `SID=UID` or `FIRST-LAST=UID` (hex with 0x,
    /// or decimal); repeatable.
    #[arg(long, value_name = "RANGE=UID")]
    reserve: Vec<Reservation>,
    /// The endpoint's admission limits (`ibcm::proto::EndpointConfig`).
    #[command(flatten)]
    admission: Admission,
}

/// The endpoint's admission limits (`EndpointConfig`): what REQs from the network may make
/// the daemon keep. A REQ beyond a per-peer or established limit is answered with REJ 3
/// "no resources"; at a service's or the endpoint's half-open limit the oldest half-open
/// entry is evicted instead.
#[derive(Debug, clap::Args)]
struct Admission {
    /// Passive connections not yet established (REQ received … RTU) the endpoint keeps.
    #[arg(long, default_value_t = EndpointConfig::default().max_half_open)]
    max_half_open: usize,
    /// Half-open connections one peer host (IP address or GID, any port) may hold; its REQs
    /// beyond are rejected (REJ 3).
    #[arg(long, default_value_t = EndpointConfig::default().max_half_open_per_source)]
    max_half_open_per_peer: usize,
    /// Half-open connections one service ID may hold (beyond: its oldest is evicted).
    #[arg(long, default_value_t = EndpointConfig::default().max_half_open_per_service)]
    max_half_open_per_service: usize,
    /// Seconds a half-open connection may take from its REQ to its RTU.
    #[arg(long, default_value_t = EndpointConfig::default().max_half_open_lifetime.as_secs())]
    max_half_open_secs: u64,
    /// Connections (established until TimeWait, plus half-open) the endpoint keeps.
    #[arg(long, default_value_t = EndpointConfig::default().max_established)]
    max_established: usize,
    /// Connections one peer host may hold (established plus half-open).
    #[arg(long, default_value_t = EndpointConfig::default().max_established_per_peer)]
    max_established_per_peer: usize,
}

impl Admission {
    /// `cfg` with these limits.
    fn apply(&self, cfg: EndpointConfig) -> EndpointConfig {
        EndpointConfig {
            max_half_open: self.max_half_open,
            max_half_open_per_source: self.max_half_open_per_peer,
            max_half_open_per_service: self.max_half_open_per_service,
            max_half_open_lifetime: Duration::from_secs(self.max_half_open_secs),
            max_established: self.max_established,
            max_established_per_peer: self.max_established_per_peer,
            ..cfg
        }
    }
}

/// `ibcmd leaks`.
#[derive(Debug, Parser)]
#[command(
    name = "ibcmd leaks",
    about = "List a running ibcmd's orphaned and leaked XRC TGT QPs"
)]
struct LeaksArgs {
    /// The daemon's socket.
    #[arg(long)]
    socket: PathBuf,
    /// Print the daemon's JSON answer.
    #[arg(long)]
    json: bool,
}

/// `ibcmd reclaim`.
#[derive(Debug, Parser)]
#[command(
    name = "ibcmd reclaim",
    about = "Destroy orphaned XRC TGT QPs of this user (root: of any user) in a running ibcmd"
)]
struct ReclaimArgs {
    /// The daemon's socket.
    #[arg(long)]
    socket: PathBuf,
    /// Only this QP (hex with 0x, or decimal); default: all of them.
    #[arg(long, value_parser = parse_qpn)]
    qpn: Option<u32>,
}

/// `ibcmd xrc`.
#[derive(Debug, Parser)]
#[command(
    name = "ibcmd xrc",
    about = "One session of a running ibcmd driven by JSON lines on stdin: the XRC keeper's \
             requests (open-domain, create, register, unregister, modify, query, …) and XRC \
             services (xrc-listen, xrc-unlisten); one reply line each on stdout"
)]
struct XrcArgs {
    /// The daemon's socket.
    #[arg(long)]
    socket: PathBuf,
    /// Stay attached after the end of input, until killed.
    #[arg(long)]
    hold: bool,
}

fn parse_qpn(s: &str) -> Result<u32, String> {
    let v = match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(h) => u32::from_str_radix(h, 16).ok(),
        None => s.parse().ok(),
    };
    v.filter(|v| *v < 1 << 24)
        .ok_or_else(|| format!("{s:?} is not a QP number"))
}

/// [`ServerConfig`]'s hello timeout in ms, the default of `--hello-timeout-ms`.
fn default_hello_timeout_ms() -> u64 {
    u64::try_from(ServerConfig::default().hello_timeout.as_millis()).unwrap_or(u64::MAX)
}

fn parse_mode(s: &str) -> Result<u32, String> {
    u32::from_str_radix(s, 8)
        .ok()
        .filter(|m| *m <= 0o777)
        .ok_or_else(|| format!("{s:?} is not an octal file mode"))
}

fn main() -> ExitCode {
    // `ibcmd keeper …` is `xrcd-keeper …`.
    if std::env::args_os().nth(1).is_some_and(|a| a == "keeper") {
        let rest = std::env::args_os().skip(2);
        return ibcm_xrc::keeper::cli::main_from(
            std::iter::once("ibcmd keeper".into()).chain(rest),
        );
    }
    // `ibcmd leaks --socket PATH`: the daemon's orphaned and leaked TGT QPs.
    if std::env::args_os().nth(1).is_some_and(|a| a == "leaks") {
        let args = LeaksArgs::parse_from(
            std::iter::once("ibcmd leaks".into()).chain(std::env::args_os().skip(2)),
        );
        return leaks::main(&args.socket, args.json);
    }
    // `ibcmd xrc --socket PATH [--hold]`: a session driven by JSON lines (the keeper's
    // requests, XRC services).
    if std::env::args_os().nth(1).is_some_and(|a| a == "xrc") {
        let args = XrcArgs::parse_from(
            std::iter::once("ibcmd xrc".into()).chain(std::env::args_os().skip(2)),
        );
        return session::main(&args.socket, args.hold);
    }
    // `ibcmd reclaim --socket PATH [--qpn N]`: destroy orphaned TGT QPs.
    if std::env::args_os().nth(1).is_some_and(|a| a == "reclaim") {
        let args = ReclaimArgs::parse_from(
            std::iter::once("ibcmd reclaim".into()).chain(std::env::args_os().skip(2)),
        );
        return leaks::reclaim(&args.socket, args.qpn);
    }
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("IBCMD_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("ibcmd: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(run(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ibcmd: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// The group id of `g`: a number, or a name in /etc/group.
fn group_id(g: &str) -> Result<u32> {
    if let Ok(n) = g.parse::<u32>() {
        return Ok(n);
    }
    let text = std::fs::read_to_string("/etc/group").context("cannot read /etc/group")?;
    text.lines()
        .filter_map(|l| {
            let mut f = l.split(':');
            let (name, _, gid) = (f.next()?, f.next()?, f.next()?);
            (name == g).then(|| gid.parse::<u32>().ok()).flatten()
        })
        .next()
        .ok_or_else(|| anyhow::anyhow!("no group {g:?} in /etc/group"))
}

/// Makes sure `path` can be bound: nothing there, or a socket nobody serves (a dead
/// daemon's). Anything else is refused, never replaced.
fn clear_socket_path(path: &Path) -> Result<()> {
    match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e).with_context(|| format!("cannot inspect {}", path.display())),
        Ok(m) if !m.file_type().is_socket() => {
            bail!(
                "{} exists and is not a socket: refusing to replace it",
                path.display()
            )
        }
        Ok(_) => {
            if std::os::unix::net::UnixStream::connect(path).is_ok() {
                bail!("{} is served by a running daemon", path.display());
            }
            std::fs::remove_file(path)
                .with_context(|| format!("cannot remove the stale socket {}", path.display()))
        }
    }
}

/// Where the CM's MADs go, from `--addr`, `--umad` and `--gid-index`.
#[derive(Debug)]
enum Mode {
    /// RoCEv2 over UDP on `addr`:4791.
    Udp(IpAddr),
    /// umad on a RoCE port: the netdev's `addr`, its GID at `gid_index`.
    Roce {
        dev: String,
        addr: IpAddr,
        gid_index: u8,
    },
    /// umad on a native InfiniBand port: LID-routed, GID 0, the SA for paths.
    Ib { dev: String, port: IbPort },
}

/// The default `--gid-index` on a RoCE port (GID 1: the RoCEv2 GID of the netdev's first
/// IPv4 address on most drivers).
const DEFAULT_GID_INDEX: u8 = 1;

impl Mode {
    /// The mode of these options; `port_of` reads a umad device's port (sysfs).
    fn of(
        addr: Option<IpAddr>,
        umad: Option<&str>,
        gid_index: Option<u8>,
        port_of: impl FnOnce(&str) -> Result<IbPort>,
    ) -> Result<Mode> {
        let Some(dev) = umad else {
            if gid_index.is_some() {
                bail!("--gid-index is for --umad on a RoCE port");
            }
            let addr = addr.ok_or_else(|| {
                anyhow::anyhow!(
                    "--addr IP is needed: the CM listens on UDP IP:4791 (or give --umad DEV)"
                )
            })?;
            return Ok(Mode::Udp(addr));
        };
        let port = port_of(dev)?;
        if port.is_infiniband() {
            if let Some(a) = addr {
                bail!(
                    "--addr {a}: {dev} is an InfiniBand port ({} port {}), where the CM is \
                     reached by LID: leave --addr out (clients name peers lid:N or gid:G)",
                    port.device,
                    port.port
                );
            }
            if gid_index.is_some() {
                bail!(
                    "--gid-index: {dev} is an InfiniBand port ({} port {}): the CM uses its \
                     GID 0; --gid-index is for RoCE",
                    port.device,
                    port.port
                );
            }
            return Ok(Mode::Ib {
                dev: dev.to_owned(),
                port,
            });
        }
        let addr = addr.ok_or_else(|| {
            anyhow::anyhow!(
                "{dev} is a RoCE port ({} port {}): --addr must be the RoCE netdev's IP address",
                port.device,
                port.port
            )
        })?;
        Ok(Mode::Roce {
            dev: dev.to_owned(),
            addr,
            gid_index: gid_index.unwrap_or(DEFAULT_GID_INDEX),
        })
    }

    /// The local GID of the endpoint.
    fn local_gid(&self) -> Gid {
        match self {
            Mode::Udp(a) | Mode::Roce { addr: a, .. } => Gid::from_ip(*a),
            Mode::Ib { port, .. } => port.gid,
        }
    }

    /// The IP address told to clients at hello (none on InfiniBand).
    fn addr(&self) -> Option<IpAddr> {
        match self {
            Mode::Udp(a) | Mode::Roce { addr: a, .. } => Some(*a),
            Mode::Ib { .. } => None,
        }
    }

    /// One phrase for the log: the mode and where its peers are.
    fn describe(&self) -> String {
        match self {
            Mode::Udp(a) => format!("RoCEv2 over UDP on {}", SocketAddr::new(*a, 4791)),
            Mode::Roce {
                dev,
                addr,
                gid_index,
            } => format!("RoCE through umad {dev} (GID index {gid_index}, {addr}): peers by IP"),
            Mode::Ib { dev, port } => format!(
                "InfiniBand through umad {dev} ({} port {}, LID {}, SM LID {}, GID {}, P_Key 0 \
                 {:#06x}): peers by lid:N or gid:G, paths from the SA",
                port.device,
                port.port,
                port.lid.0,
                port.sm_lid.0,
                std::net::Ipv6Addr::from(port.gid.0),
                port.pkey0.0
            ),
        }
    }
}

/// The CM's MAD channel.
enum Transport {
    Udp(UdpTransport),
    Umad(UmadTransport),
}

/// How long a restart DREQ waits for its DREP before it is sent again. The journal keeps no
/// path timing, so the daemon picks one: half a second, so that a peer unreachable for a
/// while (a lossy wire, a link flap) hears the DREQ within half a second of coming back.
const RESTART_DREQ_TIMEOUT: Duration = Duration::from_millis(500);

/// Retransmissions of a restart DREQ before its connection is forgotten (16 DREQs over 8 s).
const RESTART_DREQ_RETRIES: u8 = 15;

/// Ends the connections of the previous run at their peers: each enters the endpoint in
/// DREQ_SENT ([`Cm::end_stale`]), its DREQ retransmitted by the ordinary DREQ timer; its
/// journal entry goes when the DREP comes or the retries are over.
async fn end_stale(cm: &Cm, stale: Vec<JournalEntry>, journal: &JournalTx) {
    for e in stale {
        // The XRC "target gone (keeper lost)" block for connections on a TGT QP, which tells
        // an ibcm initiator why.
        let private_data = if e.xrc_tgt {
            TargetGone {
                kind: RejectKind::Gone(GoneCause::KeeperLost),
                qpn: None,
            }
            .to_bytes()
            .to_vec()
        } else {
            Vec::new()
        };
        let to = e.peer();
        let s = StaleConnection {
            private_data,
            timeout: RESTART_DREQ_TIMEOUT,
            max_retries: RESTART_DREQ_RETRIES,
            ..StaleConnection::new(
                CommId(e.comm_id),
                CommId(e.remote_comm_id),
                Qpn::masked(e.remote_qpn),
                to,
            )
        };
        match cm.end_stale(s).await {
            Ok(conn) => {
                info!(comm_id = e.comm_id, peer = %to, "DREQ for a connection of the previous run");
                let journal = journal.clone();
                tokio::spawn(async move {
                    let why = conn.closed().await;
                    // Forgotten first: the log line says the journal no longer holds it.
                    journal.remove(e.comm_id);
                    match why {
                        ConnectionError::DisconnectTimedOut => warn!(
                            comm_id = e.comm_id, peer = %to,
                            "DREQ of the previous run unanswered after every retry: forgotten"
                        ),
                        why => info!(
                            comm_id = e.comm_id, peer = %to, end = %why,
                            "DREQ of the previous run answered"
                        ),
                    }
                });
            }
            Err(err) => {
                warn!(comm_id = e.comm_id, peer = %to, error = %err, "DREQ of the previous run not sent");
                journal.remove(e.comm_id);
            }
        }
    }
}

/// The registry's verbs context, a spare one (for the registry that takes over at exit), and
/// the software model behind them (`sim`).
type BackendParts = (Box<dyn Verbs>, Box<dyn Verbs>, Option<KernelModel>);

fn backend(b: Backend) -> Result<BackendParts> {
    match b {
        Backend::Sim => {
            let k = KernelModel::new(ModelConfig::mlx5());
            Ok((Box::new(k.spawn()), Box::new(k.spawn()), Some(k)))
        }
        Backend::Verbs => verbs_backend(),
    }
}

/// rdma-core on the first device. A device without XRC (rxe) is still opened, with a loud
/// warning: the CM serves RC and UC as ever, and every XRC request fails with the provider's
/// own answer (`ibv_open_xrcd`: EOPNOTSUPP on rxe), which reaches the client as the keeper's
/// `no-xrc` refusal (libibcm: `IBCM_EUNSUPPORTED`, the error in the text).
#[cfg(feature = "rdma")]
fn verbs_backend() -> Result<BackendParts> {
    use ibcm_xrc::{RdmaVerbs, VerbsError};
    let (a, xrc) = match RdmaVerbs::open(None) {
        Err(e @ VerbsError::NoXrc { .. }) => {
            warn!(
                why = %e,
                "XRC unavailable: RC and UC are served; every XRC request will fail with the \
                 device's own error"
            );
            (RdmaVerbs::open_unchecked(None), false)
        }
        r => (r, true),
    };
    let a = a.context("cannot open an RDMA device")?;
    let b = if xrc {
        RdmaVerbs::open(None)
    } else {
        RdmaVerbs::open_unchecked(None)
    }
    .context("cannot open an RDMA device")?;
    Ok((Box::new(a), Box::new(b), None))
}

#[cfg(not(feature = "rdma"))]
fn verbs_backend() -> Result<BackendParts> {
    bail!("--backend verbs: ibcmd was not built with rdma (cargo build -p ibcmd --features rdma)")
}

async fn run(args: Args) -> Result<()> {
    // Caught from the start: a SIGTERM right after the socket appears is a clean stop too.
    let mut sigterm = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let mut sigint = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())?;
    clear_socket_path(&args.socket)?;
    let (verbs, spare, kernel) = backend(args.backend)?;
    let mode = Mode::of(args.addr, args.umad.as_deref(), args.gid_index, |dev| {
        IbPort::of_umad(dev).with_context(|| format!("{dev}: cannot read its port from sysfs"))
    })?;
    let transport = match &mode {
        Mode::Udp(addr) => Transport::Udp(
            UdpTransport::bind(*addr)
                .await
                .with_context(|| format!("cannot bind UDP {}", SocketAddr::new(*addr, 4791)))?,
        ),
        Mode::Roce {
            dev,
            addr,
            gid_index,
        } => Transport::Umad(
            UmadTransport::open(dev, *gid_index, Gid::from_ip(*addr))
                .with_context(|| format!("{dev}: cannot open the CM agent"))?,
        ),
        Mode::Ib { dev, port } => {
            if port.lid.0 == 0 || port.sm_lid.0 == 0 {
                warn!(
                    lid = port.lid.0,
                    sm_lid = port.sm_lid.0,
                    "the port has no LID or no SM yet: path queries will fail until the subnet \
                     manager has configured it"
                );
            }
            Transport::Umad(
                UmadTransport::open_ib(dev, port)
                    .with_context(|| format!("{dev}: cannot open the CM agent"))?,
            )
        }
    };
    // The sim backend's data path: XRC SENDs on UDP 4791 reach the model's TGT QPs.
    let (transport, data_rx) = match (transport, &kernel) {
        (Transport::Udp(t), Some(_)) => {
            let (tx, rx) = tokio::sync::mpsc::channel(xrc::DATA_QUEUE);
            (Transport::Udp(t.with_data_sink(tx)), Some(rx))
        }
        (t, _) => (t, None),
    };
    let state = StateDir::open(&args.state)
        .with_context(|| format!("cannot use the state directory {}", args.state.display()))?;
    let (replay, journal) = Journal::open(state)
        .with_context(|| format!("cannot use the journal in {}", args.state.display()))?;
    if !replay.entries.is_empty() {
        info!(
            n = replay.entries.len(),
            skipped = replay.skipped,
            "the previous run left live connections: ending them"
        );
    }
    let cfg = args.admission.apply(EndpointConfig {
        local_ca_guid: Guid(0x0002_c903_00d0_0000 | u64::from(std::process::id())),
        local_gid: mode.local_gid(),
        ..EndpointConfig::default()
    });
    let target = XrcTarget::new(
        TgtRegistry::new(verbs, RegistryConfig::default()),
        XrcTargetConfig::default(),
    );
    let (server, mut driver) = match transport {
        Transport::Udp(t) => XrcServer::bind(t, cfg, target),
        Transport::Umad(t) => XrcServer::bind(t, cfg, target),
    };
    // On InfiniBand the clients' path queries are asked of the port's SA.
    if let Mode::Ib { dev, port } = &mode {
        let paths = PathResolver::open(dev, port)
            .with_context(|| format!("{dev}: cannot open the SA agent"))?;
        if server.cm().set_path_resolver(paths).is_err() {
            bail!("the endpoint has a path resolver already");
        }
    }
    end_stale(server.cm(), replay.entries, &journal).await;
    let keeper = NodeKeeper::new(
        std::process::id(),
        match args.backend {
            Backend::Sim => "sim",
            Backend::Verbs => "verbs",
        },
        KeeperLimits {
            sessions_per_user: args.max_clients_per_user,
            qps_per_user: args.max_tgt_qps_per_user,
            ..KeeperLimits::default()
        },
        std::time::Instant::now(),
    );
    let hooks = xrc::XrcHooks::new(
        server.clone(),
        kernel,
        data_rx,
        Some(journal.clone()),
        keeper,
    )
    .await;
    let journal_left = journal.clone();
    let node = NodeServer::new(
        server.cm().clone(),
        hooks.clone(),
        ServerConfig {
            max_connections: args.max_conns_per_client,
            max_connections_per_user: args.max_conns_per_user,
            max_tgt_qps_per_user: args.max_tgt_qps_per_user,
            max_tgt_qps_non_root: args.max_tgt_qps_non_root,
            max_sessions_per_user: args.max_clients_per_user,
            queue_bytes: args.max_queue_bytes_per_client,
            queue_bytes_per_user: args.max_queue_bytes_per_user,
            hello_timeout: std::time::Duration::from_millis(args.hello_timeout_ms),
            reserved_fds: args.reserved_fds,
            listen_backlog: args.listen_backlog,
            reserved: args.reserve.clone(),
            addr: mode.addr(),
            max_path_queries: args.max_path_queries_per_client,
            max_path_queries_per_user: args.max_path_queries_per_user,
            max_laps: args.max_laps_per_client,
            max_laps_per_user: args.max_laps_per_user,
            infiniband: matches!(mode, Mode::Ib { .. }),
            roce_umad: matches!(mode, Mode::Roce { .. }),
            ..ServerConfig::default()
        },
        Some(journal),
    );
    hooks.set_node(&node);
    let gid = args.group.as_deref().map(group_id).transpose()?;
    let listener = UnixListener::bind(&args.socket)
        .with_context(|| format!("cannot bind {}", args.socket.display()))?;
    if let Some(gid) = gid {
        std::os::unix::fs::chown(&args.socket, None, Some(gid))
            .with_context(|| format!("cannot give {} to group {gid}", args.socket.display()))?;
    }
    std::fs::set_permissions(&args.socket, std::fs::Permissions::from_mode(args.mode))
        .with_context(|| format!("cannot set the mode of {}", args.socket.display()))?;
    info!(
        socket = %args.socket.display(),
        mode = format!("{:o}", args.mode),
        cm = %mode.describe(),
        "ibcmd serving"
    );
    let serve = tokio::spawn(node.clone().serve(listener));
    let why = tokio::select! {
        _ = sigterm.recv() => "SIGTERM".to_string(),
        _ = sigint.recv() => "SIGINT".to_string(),
        r = &mut driver => format!("the endpoint stopped: {r:?}"),
    };
    info!(why = %why, "stopping: disconnecting every client's connections");
    serve.abort();
    // No new clients: the socket goes first.
    if let Err(e) = std::fs::remove_file(&args.socket) {
        warn!(error = %e, "cannot remove the socket");
    }
    node.shutdown().await;
    hooks.release_all(xrc::registry(spare)).await;
    // One more round trip: the DREQs of the release are on the wire. Then their DREPs, for a
    // while: the unanswered stay in the journal for the next start.
    let _ = server.cm().connection_count().await;
    let grace = ServerConfig::default().shutdown_grace;
    if tokio::time::timeout(grace, journal_left.drained())
        .await
        .is_err()
    {
        warn!(
            unanswered = journal_left.len(),
            "DREQs unanswered: their connections stay in the journal for the next start"
        );
    }
    info!("stopped");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_regular_file_is_never_replaced() {
        let dir = std::env::temp_dir().join(format!("ibcmd-unit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("not-a-socket");
        std::fs::write(&f, b"keep me").unwrap();
        let e = clear_socket_path(&f).unwrap_err();
        assert!(e.to_string().contains("not a socket"), "{e}");
        assert_eq!(std::fs::read(&f).unwrap(), b"keep me");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn groups_by_number_and_name() {
        assert_eq!(group_id("4242").unwrap(), 4242);
        assert_eq!(group_id("root").unwrap(), 0);
        assert!(group_id("no-such-group-here").is_err());
    }

    fn port(link: ibcm::rt::umad::LinkLayer) -> IbPort {
        IbPort {
            device: "mlx5_0".into(),
            port: 1,
            link_layer: link,
            lid: ibcm_mad::Lid(4),
            lmc: 0,
            sm_lid: ibcm_mad::Lid(1),
            sm_sl: 0,
            gid: Gid([0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 2, 0xc9, 3, 0, 0, 0, 4]),
            pkey0: ibcm_mad::Pkey(0xffff),
        }
    }

    /// `--addr`, `--umad` and `--gid-index` as each port needs them, and what is wrong said.
    #[test]
    fn the_mode_follows_the_port() {
        use ibcm::rt::umad::LinkLayer::{Ethernet, InfiniBand};
        let ip: IpAddr = "10.0.0.2".parse().unwrap();
        let dev = Some("/dev/infiniband/umad0");
        let ib = |_: &str| Ok(port(InfiniBand));
        let roce = |_: &str| Ok(port(Ethernet));
        let err = |r: Result<Mode>| r.unwrap_err().to_string();

        assert!(matches!(Mode::of(Some(ip), None, None, ib), Ok(Mode::Udp(a)) if a == ip));
        assert!(err(Mode::of(None, None, None, ib)).contains("--addr IP is needed"));
        assert!(err(Mode::of(Some(ip), None, Some(1), ib)).contains("--gid-index is for"));

        let m = Mode::of(None, dev, None, ib).unwrap();
        assert!(matches!(&m, Mode::Ib { port, .. } if port.lid.0 == 4));
        assert_eq!(m.local_gid(), port(InfiniBand).gid);
        assert_eq!(m.addr(), None);
        let d = m.describe();
        assert!(
            d.starts_with("InfiniBand through umad /dev/infiniband/umad0 (mlx5_0 port 1, LID 4")
                && d.contains("GID fe80::2:c903:0:4")
                && d.contains("lid:N or gid:G"),
            "{d}"
        );
        let e = err(Mode::of(Some(ip), dev, None, ib));
        assert!(
            e.contains("is an InfiniBand port") && e.contains("leave --addr out"),
            "{e}"
        );
        let e = err(Mode::of(None, dev, Some(1), ib));
        assert!(e.contains("--gid-index is for RoCE"), "{e}");

        let m = Mode::of(Some(ip), dev, None, roce).unwrap();
        assert!(matches!(m, Mode::Roce { gid_index: 1, .. }));
        assert_eq!(m.local_gid(), Gid::from_ip(ip));
        assert!(matches!(
            Mode::of(Some(ip), dev, Some(3), roce),
            Ok(Mode::Roce { gid_index: 3, .. })
        ));
        let e = err(Mode::of(None, dev, None, roce));
        assert!(
            e.contains("is a RoCE port") && e.contains("--addr must be"),
            "{e}"
        );
        let e = err(Mode::of(None, dev, None, |_| bail!("no such device")));
        assert!(e.contains("no such device"), "{e}");
    }

    #[test]
    fn modes_are_octal() {
        assert_eq!(parse_mode("660"), Ok(0o660));
        assert!(parse_mode("999").is_err());
        assert!(parse_mode("7777").is_err());
    }
}
