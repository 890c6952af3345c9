//! `cm-ping`'s command line: [`Args`] and the parsers of its values.

use std::net::IpAddr;

use clap::{Parser, ValueEnum};

/// Where `--listen` listens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ListenAddr {
    /// A local IP address.
    Ip(IpAddr),
    /// The InfiniBand port of `--umad`.
    Ib,
}

impl ListenAddr {
    /// The IP address, if it is one.
    pub(crate) fn ip(self) -> Option<IpAddr> {
        match self {
            ListenAddr::Ip(ip) => Some(ip),
            ListenAddr::Ib => None,
        }
    }
}

impl std::str::FromStr for ListenAddr {
    type Err = std::net::AddrParseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s == "ib" {
            return Ok(ListenAddr::Ib);
        }
        s.parse().map(ListenAddr::Ip)
    }
}

/// Marker an active cm-ping puts in the REQ private data to ask the passive side to disconnect.
pub(crate) const DISCONNECT_MARKER: &[u8] = b"cm-ping:passive-disconnect";

/// Which side of a connection sends the DREQ (`--disconnect-from`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum Who {
    Active,
    Passive,
}

/// `cm-ping`'s command line (`--help` lists every option).
#[derive(Debug, Parser)]
#[command(
    name = "cm-ping",
    version,
    about = "Connect to / listen on an IB CM service"
)]
pub struct Args {
    /// Listen on this local IP (UDP 4791, or the RoCE port of --umad) and accept connections;
    /// `ib`: on the InfiniBand port of --umad (LID-routed).
    #[arg(long, value_name = "ADDR|ib", conflicts_with = "connect")]
    pub(crate) listen: Option<ListenAddr>,
    /// Connect to ADDR: IP, or IP:PORT for an rdma_cm listener; on the InfiniBand port of
    /// --umad, `lid:N` or `gid:G` (the path from the SA).
    #[arg(long, value_name = "ADDR[:PORT]|lid:N|gid:G")]
    pub(crate) connect: Option<String>,
    /// Local IP to bind when connecting (default: 127.0.0.1 for a loopback peer, else 0.0.0.0).
    #[arg(long)]
    pub(crate) bind: Option<IpAddr>,
    /// Raw IB CM service ID (hex with 0x, or decimal).
    #[arg(long, value_parser = parse_u64, conflicts_with = "port")]
    pub(crate) service_id: Option<u64>,
    /// rdma_cm port (service ID 0x0106 << 16 | P, RDMA_PS_IB for --xrc).
    #[arg(long)]
    pub(crate) port: Option<u16>,
    /// Connections to make.
    #[arg(long, default_value_t = 1)]
    pub(crate) count: u64,
    /// Connections in flight at once.
    #[arg(long, default_value_t = 1)]
    pub(crate) parallel: u64,
    /// XRC (this side is the INI; the listener answers as XRC TGT).
    #[arg(long)]
    pub(crate) xrc: bool,
    /// Private data for the REQ (hex).
    #[arg(long, value_parser = parse_hex)]
    pub(crate) private_data: Option<Hex>,
    /// Which side sends the DREQ.
    #[arg(long, value_enum, default_value_t = Who::Active)]
    pub(crate) disconnect_from: Who,
    /// Keep every connection until all are established, then disconnect them all: the
    /// connect step is timed alone (first REQ to last established, like `cmtime`'s
    /// "connect") and printed as `cm-ping: connect step: N connections in S s (R conn/s)`.
    #[arg(long)]
    pub(crate) hold: bool,
    /// Listener: reject every REQ with this reason (e.g. 28).
    #[arg(long)]
    pub(crate) reject: Option<u16>,
    /// Listener (and --reject-rep): private data for rejects (hex).
    #[arg(long, value_parser = parse_hex)]
    pub(crate) reject_data: Option<Hex>,
    /// Listener: answer each REQ with an MRA, then accept after this many milliseconds.
    #[arg(long)]
    pub(crate) accept_delay: Option<u64>,
    /// Listener, with --accept-delay: send no MRA at once; the endpoint answers a duplicate
    /// REQ that arrives before the accept with an MRA (as Linux does).
    #[arg(long, requires = "accept_delay")]
    pub(crate) mra_on_duplicate: bool,
    /// Listener: answer SIDR_REQs (rdma_cm's RDMA_PS_UDP port space too) with success and
    /// this UD QPN (default: refuse them).
    #[arg(long, value_parser = parse_u64)]
    pub(crate) sidr_qpn: Option<u64>,
    /// Listener: the Q_Key of --sidr-qpn (default rdma_cm's RDMA_UDP_QKEY).
    #[arg(long, value_parser = parse_u64, default_value = "0x01234567")]
    pub(crate) sidr_qkey: u64,
    /// Connect: wait this many milliseconds between the REP and the RTU (the application's
    /// QP work); the peer's REP retransmissions meanwhile are answered with an MRA.
    #[arg(long, conflicts_with = "reject_rep")]
    pub(crate) rtu_delay: Option<u64>,
    /// Connect: reject the REP with this reason (a consumer reject after the REP), with
    /// --reject-data as private data.
    #[arg(long)]
    pub(crate) reject_rep: Option<u16>,
    /// Connect: resolve the service with SIDR (rdma_cm's RDMA_PS_UDP for IP:PORT) instead
    /// of connecting; prints `sidr reply status=S qpn=Q qkey=K pd=HEX`.
    #[arg(long, conflicts_with_all = ["xrc", "hold", "rtu_delay", "reject_rep"])]
    pub(crate) sidr: bool,
    /// Listener: private data for the REP (hex).
    #[arg(long, value_parser = parse_hex)]
    pub(crate) accept_data: Option<Hex>,
    /// CM response timeout exponent for the REQ (4.096 µs × 2^N; default 20): its Remote and
    /// its Local CM Response Timeout (the latter overridden by --local-timeout-exp).
    #[arg(long, default_value_t = 20)]
    pub(crate) timeout_exp: u8,
    /// Max CM retries (default 15).
    #[arg(long, default_value_t = 15)]
    pub(crate) retries: u8,
    /// Keep every connection this much longer in TimeWait (milliseconds; default 0): a late
    /// duplicate DREQ is then answered from TimeWait rather than as an unknown one.
    #[arg(long, default_value_t = 0)]
    pub(crate) timewait_slack: u64,
    /// Use Linux umad on this device instead of UDP.
    #[arg(long, value_name = "DEV")]
    pub(crate) umad: Option<String>,
    /// umad: local GID index of the RoCEv2 IPv4 GID.
    #[arg(long, default_value_t = 1)]
    pub(crate) gid_index: u8,
    /// umad: the local IP address (its GID is ::ffff:IP).
    #[arg(long)]
    pub(crate) local_ip: Option<IpAddr>,
    /// Accept datagrams whose ICRC cannot be verified (peers like rxe whose IPv4 ID is not 0).
    #[arg(long)]
    pub(crate) icrc_lenient: bool,
    /// Use the node's CM service (`ibcmd`) on this Unix socket instead of an endpoint of
    /// this process.
    #[arg(long, value_name = "PATH", conflicts_with = "umad")]
    pub(crate) daemon: Option<std::path::PathBuf>,
    /// Listener with --daemon --xrc: the ownership policy of the TGT QPs the daemon creates.
    #[arg(long, requires = "daemon", requires = "xrc", value_parser = ["explicit", "domain", "process", "shared"])]
    pub(crate) policy: Option<String>,
    /// Keep the connections until SIGINT/SIGTERM or until the peer has ended every one;
    /// print each peer teardown (`conn N closed by peer after MS ms: REASON`).
    #[arg(long, conflicts_with = "listen")]
    pub(crate) stay: bool,
    /// Connect to a lid: or gid: on InfiniBand: also ask the SA for an alternate path (another
    /// SLID and DLID among the paths of a GetTable by GIDs) and put it in the REQ.
    #[arg(long, requires = "umad")]
    pub(crate) alt_path: bool,
    /// Connect with --alt-path: once established, act out Automatic Path Migration: report
    /// the QP migrated to the alternate path, then propose the former primary path as the new
    /// alternate (LAP), which must be loaded (APR status 0).
    #[arg(long, requires = "alt_path")]
    pub(crate) migrate: bool,
    /// Listener: answer LAPs (load every alternate path proposed: APR status 0) rather than
    /// leave them to the endpoint, which answers "unsupported".
    #[arg(long, requires = "listen")]
    pub(crate) accept_laps: bool,
    /// Connect: print the endpoint's counters last, one JSON object (retransmissions, the
    /// transport's counters, every drop by reason), as `--listen` does when it stops.
    #[arg(long, conflicts_with_all = ["listen", "daemon"])]
    pub(crate) stats: bool,
    /// Print only the summary line (and, with --listen, the "listening on" line that tells a
    /// script the listener is ready).
    #[arg(long, short)]
    pub(crate) quiet: bool,
    #[command(flatten)]
    pub(crate) verbs: super::data::VerbsArgs,
    #[command(flatten)]
    pub(crate) req: super::req::ReqArgs,
    #[command(flatten)]
    pub(crate) stateless: super::stateless::StatelessArgs,
}

fn parse_u64(s: &str) -> Result<u64, String> {
    match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(h) => u64::from_str_radix(&h.replace('_', ""), 16).map_err(|e| e.to_string()),
        None => s
            .parse()
            .map_err(|e: std::num::ParseIntError| e.to_string()),
    }
}

/// Bytes given in hex on the command line.
#[derive(Debug, Clone)]
pub(crate) struct Hex(pub(crate) Vec<u8>);

fn parse_hex(s: &str) -> Result<Hex, String> {
    let s = s.trim_start_matches("0x").replace([':', ' ', '_'], "");
    if !s.len().is_multiple_of(2) {
        return Err("odd number of hex digits".into());
    }
    (0..s.len())
        .step_by(2)
        .map(|i| {
            s.get(i..i + 2)
                .and_then(|b| u8::from_str_radix(b, 16).ok())
                .ok_or_else(|| format!("bad hex at {i}"))
        })
        .collect::<Result<Vec<u8>, String>>()
        .map(Hex)
}
