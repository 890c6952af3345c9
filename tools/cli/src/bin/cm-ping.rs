//! `cm-ping`: the ibcm CM engine's command-line face (like rdma-core's `ucmatose`).
//!
//! ```text
//! cm-ping --listen ADDR [--service-id ID | --port P] [--reject REASON] [--accept-delay MS]
//!         [--mra-on-duplicate] [--accept-data HEX] [--sidr-qpn QPN [--sidr-qkey QKEY]]
//!         [--timewait-slack MS] [--stateless [--stateless-threshold N] [--stateless-always]
//!         [--stateless-qpns BASE:COUNT]] [--peer-counts]
//! cm-ping --connect ADDR[:PORT] [--bind IP] [--service-id ID | --port P] [--count N]
//!         [--parallel K] [--hold] [--xrc] [--private-data HEX] [--disconnect-from active|passive]
//!         [--rtu-delay MS | --reject-rep REASON [--reject-data HEX]] [--sidr]
//!         [--stay] [--local-timeout-exp N] [--local-ack-timeout N] [--same-qpn (test only)]
//! cm-ping --daemon PATH …   (any of the above through the node's CM service, `ibcmd`;
//!         a listener takes --xrc --policy explicit|domain|process|shared)
//! ```
//!
//! Transport: RoCEv2 over UDP on port 4791 of the bound IP (default), or Linux umad with
//! `--umad /dev/infiniband/umadN --gid-index I --local-ip IP`. Connecting to `IP:PORT` uses the
//! rdma_cm conventions (service ID `0x0106 << 16 | PORT`, CMA IP header in the private data),
//! so a Linux `rping -s`/`ucmatose` listener answers; `--service-id` gives a raw IB service ID.
//!
//! One line per event; the last line is
//! `cm-ping: N established, R rejected, T timed out, D disconnected, X disconnect timed out`
//! (D counts the connections whose DREQ was answered or came from the peer; X those whose
//! DREQ was never answered). The listener accepts by default and runs until killed:
//! SIGINT/SIGTERM print the summary line, then the endpoint's counters as one JSON object (its
//! last line; [`ibcm::rt::CmStats::to_json`]), and end the process at once: the listener's
//! connections are not disconnected (no DREQ), as a killed peer's are not. The listener's event lines are rate-limited
//! (peers decide how many arrive). `--connect` exits 0 when every connection was established
//! and none of their disconnects timed out, 2 otherwise.
//!
//! QPNs are unique and random within the 24-bit space, start PSNs random (the endpoint's
//! RNG: the default of a connect, drawn with `Cm::random_psn` for an accept): cm-ping has no
//! real QPs, so it chooses them like an application should.

use std::net::{IpAddr, SocketAddr};
use std::process::ExitCode;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use clap::{Parser, ValueEnum};
use ibcm::proto::SidrRepParams;
use ibcm::proto::{AcceptParams, EndpointConfig, IbAddr, ListenOptions, PeerAddr};
use ibcm::rt::{Arrival, Cm, IcrcPolicy, IncomingKind, UdpTransport, UmadTransport};
use ibcm_mad::cma::PortSpace;
use ibcm_mad::{Gid, Guid, Qkey, Qpn, RejReason, ReqTransport, ServiceId, SidrStatus, TimeoutExp};

#[path = "../ping/mod.rs"]
mod ping;
#[path = "../common/qpn.rs"]
mod qpn;
use ping::counts::Counts;
use qpn::QpnAlloc;

/// Marker an active cm-ping puts in the REQ private data to ask the passive side to disconnect.
const DISCONNECT_MARKER: &[u8] = b"cm-ping:passive-disconnect";

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Who {
    Active,
    Passive,
}

#[derive(Debug, Parser)]
#[command(
    name = "cm-ping",
    version,
    about = "Connect to / listen on an IB CM service"
)]
struct Args {
    /// Listen on this local IP (UDP 4791) and accept connections.
    #[arg(long, value_name = "ADDR", conflicts_with = "connect")]
    listen: Option<IpAddr>,
    /// Connect to ADDR (IP, or IP:PORT for an rdma_cm listener).
    #[arg(long, value_name = "ADDR[:PORT]")]
    connect: Option<String>,
    /// Local IP to bind when connecting (default: 127.0.0.1 for a loopback peer, else 0.0.0.0).
    #[arg(long)]
    bind: Option<IpAddr>,
    /// Raw IB CM service ID (hex with 0x, or decimal).
    #[arg(long, value_parser = parse_u64, conflicts_with = "port")]
    service_id: Option<u64>,
    /// rdma_cm port (service ID 0x0106 << 16 | P, RDMA_PS_IB for --xrc).
    #[arg(long)]
    port: Option<u16>,
    /// Connections to make.
    #[arg(long, default_value_t = 1)]
    count: u64,
    /// Connections in flight at once.
    #[arg(long, default_value_t = 1)]
    parallel: u64,
    /// XRC (this side is the INI; the listener answers as XRC TGT).
    #[arg(long)]
    xrc: bool,
    /// Private data for the REQ (hex).
    #[arg(long, value_parser = parse_hex)]
    private_data: Option<Hex>,
    /// Which side sends the DREQ.
    #[arg(long, value_enum, default_value_t = Who::Active)]
    disconnect_from: Who,
    /// Keep every connection until all are established, then disconnect them all: the
    /// connect step is timed alone (first REQ to last established, like `cmtime`'s
    /// "connect") and printed as `cm-ping: connect step: N connections in S s (R conn/s)`.
    #[arg(long)]
    hold: bool,
    /// Listener: reject every REQ with this reason (e.g. 28).
    #[arg(long)]
    reject: Option<u16>,
    /// Listener (and --reject-rep): private data for rejects (hex).
    #[arg(long, value_parser = parse_hex)]
    reject_data: Option<Hex>,
    /// Listener: answer each REQ with an MRA, then accept after this many milliseconds.
    #[arg(long)]
    accept_delay: Option<u64>,
    /// Listener, with --accept-delay: send no MRA at once; the endpoint answers a duplicate
    /// REQ that arrives before the accept with an MRA (as Linux does).
    #[arg(long, requires = "accept_delay")]
    mra_on_duplicate: bool,
    /// Listener: answer SIDR_REQs (rdma_cm's RDMA_PS_UDP port space too) with success and
    /// this UD QPN (default: refuse them).
    #[arg(long, value_parser = parse_u64)]
    sidr_qpn: Option<u64>,
    /// Listener: the Q_Key of --sidr-qpn (default rdma_cm's RDMA_UDP_QKEY).
    #[arg(long, value_parser = parse_u64, default_value = "0x01234567")]
    sidr_qkey: u64,
    /// Connect: wait this many milliseconds between the REP and the RTU (the application's
    /// QP work); the peer's REP retransmissions meanwhile are answered with an MRA.
    #[arg(long, conflicts_with = "reject_rep")]
    rtu_delay: Option<u64>,
    /// Connect: reject the REP with this reason (a consumer reject after the REP), with
    /// --reject-data as private data.
    #[arg(long)]
    reject_rep: Option<u16>,
    /// Connect: resolve the service with SIDR (rdma_cm's RDMA_PS_UDP for IP:PORT) instead
    /// of connecting; prints `sidr reply status=S qpn=Q qkey=K pd=HEX`.
    #[arg(long, conflicts_with_all = ["xrc", "hold", "rtu_delay", "reject_rep"])]
    sidr: bool,
    /// Listener: private data for the REP (hex).
    #[arg(long, value_parser = parse_hex)]
    accept_data: Option<Hex>,
    /// CM response timeout exponent for the REQ (4.096 µs × 2^N; default 20): its Remote and
    /// its Local CM Response Timeout (the latter overridden by --local-timeout-exp).
    #[arg(long, default_value_t = 20)]
    timeout_exp: u8,
    /// Max CM retries (default 15).
    #[arg(long, default_value_t = 15)]
    retries: u8,
    /// Keep every connection this much longer in TimeWait (milliseconds; default 0): a late
    /// duplicate DREQ is then answered from TimeWait rather than as an unknown one.
    #[arg(long, default_value_t = 0)]
    timewait_slack: u64,
    /// Use Linux umad on this device instead of UDP.
    #[arg(long, value_name = "DEV")]
    umad: Option<String>,
    /// umad: local GID index of the RoCEv2 IPv4 GID.
    #[arg(long, default_value_t = 1)]
    gid_index: u8,
    /// umad: the local IP address (its GID is ::ffff:IP).
    #[arg(long)]
    local_ip: Option<IpAddr>,
    /// Accept datagrams whose ICRC cannot be verified (peers like rxe whose IPv4 ID is not 0).
    #[arg(long)]
    icrc_lenient: bool,
    /// Use the node's CM service (`ibcmd`) on this Unix socket instead of an endpoint of
    /// this process.
    #[arg(long, value_name = "PATH", conflicts_with = "umad")]
    daemon: Option<std::path::PathBuf>,
    /// Listener with --daemon --xrc: the ownership policy of the TGT QPs the daemon creates.
    #[arg(long, requires = "daemon", requires = "xrc", value_parser = ["explicit", "domain", "process", "shared"])]
    policy: Option<String>,
    /// Keep the connections until SIGINT/SIGTERM or until the peer has ended every one;
    /// print each peer teardown (`conn N closed by peer after MS ms: REASON`).
    #[arg(long, conflicts_with = "listen")]
    stay: bool,
    /// Print only the summary line (and, with --listen, the "listening on" line that tells a
    /// script the listener is ready).
    #[arg(long, short)]
    quiet: bool,
    #[command(flatten)]
    verbs: ping::VerbsArgs,
    #[command(flatten)]
    req: ping::req::ReqArgs,
    #[command(flatten)]
    stateless: ping::stateless::StatelessArgs,
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
struct Hex(Vec<u8>);

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

/// Hex of `b` without its trailing zero bytes ("-" when nothing is left).
fn hex_trim(b: &[u8]) -> String {
    let n = b.iter().rposition(|&x| x != 0).map_or(0, |i| i + 1);
    if n == 0 {
        return "-".into();
    }
    b.iter().take(n).map(|x| format!("{x:02x}")).collect()
}

fn main() -> ExitCode {
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("CM_PING_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("cm-ping: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(run(args)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("cm-ping: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn service_id(args: &Args, default_port: u16) -> ServiceId {
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

async fn bind(args: &Args, local: IpAddr) -> Result<(Cm, PeerAddrMaker)> {
    let guid = Guid(0x0002_c903_0000_0000 | u64::from(std::process::id()));
    if let Some(path) = &args.daemon {
        let (cm, _) = ping::node::attach_cm(path).await?;
        return Ok((cm, PeerAddrMaker::Udp));
    }
    let cfg = EndpointConfig {
        local_ca_guid: guid,
        local_gid: Gid::from_ip(local),
        timewait_slack: Duration::from_millis(args.timewait_slack),
        ..Default::default()
    };
    let mut cfg = cfg;
    ping::stateless::configure(&args.stateless, &mut cfg);
    if let Some(dev) = &args.umad {
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
enum PeerAddrMaker {
    Udp,
    Umad,
}

impl PeerAddrMaker {
    fn peer(self, ip: IpAddr) -> PeerAddr {
        match self {
            PeerAddrMaker::Udp => PeerAddr::Udp(SocketAddr::new(ip, 4791)),
            PeerAddrMaker::Umad => PeerAddr::Ib(IbAddr::roce(Gid::from_ip(ip))),
        }
    }
}

async fn run(args: Args) -> Result<ExitCode> {
    ping::stateless::check(
        &args.stateless,
        args.verbs.verbs.is_some(),
        args.reject.is_some(),
        args.accept_delay.is_some(),
        args.daemon.is_some(),
    )?;
    ping::init(&args)?;
    if let Some(ip) = args.listen {
        return listen(args, ip).await;
    }
    let Some(target) = args.connect.clone() else {
        bail!("give --listen ADDR or --connect ADDR");
    };
    ping::connect::connect(args, &target).await
}

fn out(args: &Args, line: std::fmt::Arguments<'_>) {
    if !args.quiet {
        println!("{line}");
    }
}

/// Event lines the listener prints per second; the rest are counted, and the count is printed
/// when the next second starts.
const LINES_PER_SEC: u32 = 200;

/// (window start, lines in it, suppressed in it)
static LINE_LIMIT: Mutex<(Option<Instant>, u32, u64)> = Mutex::new((None, 0, 0));

/// [`out`], rate-limited to [`LINES_PER_SEC`]: the listener's lines about what peers do.
fn out_limited(args: &Args, line: std::fmt::Arguments<'_>) {
    if args.quiet {
        return;
    }
    let Ok(mut l) = LINE_LIMIT.lock() else {
        return;
    };
    let now = Instant::now();
    if l.0
        .is_none_or(|w| now.duration_since(w) >= Duration::from_secs(1))
    {
        if l.2 > 0 {
            println!("({} lines suppressed: rate limit)", l.2);
        }
        *l = (Some(now), 0, 0);
    }
    if l.1 < LINES_PER_SEC {
        l.1 += 1;
        println!("{line}");
    } else {
        l.2 += 1;
    }
}

async fn listen(args: Args, ip: IpAddr) -> Result<ExitCode> {
    let args = Arc::new(args);
    if let (Some(path), true) = (&args.daemon, args.xrc) {
        let (_cm, node) = ping::node::attach_cm(path).await?;
        let policy = args.policy.as_deref().unwrap_or("process");
        let counts = Arc::new(Counts::default());
        ping::node::xrc_listen(&node, service_id(&args, 7471), policy, args.quiet, &counts).await?;
        return Ok(ExitCode::SUCCESS);
    }
    let (cm, _) = bind(&args, ip).await?;
    let sid = service_id(&args, 7471);
    let mut sids = vec![sid];
    // rdma_cm listeners take every port space of a port: TCP for RC, IB for XRC, and UDP for
    // SIDR when this listener answers SIDR.
    if let Some((PortSpace::Tcp, p)) = sid.rdma_cm_port() {
        sids.push(ServiceId::rdma_cm(PortSpace::Ib, p));
        if args.sidr_qpn.is_some() {
            sids.push(ServiceId::rdma_cm(PortSpace::Udp, p));
        }
    }
    let (tx, mut incoming) = tokio::sync::mpsc::unbounded_channel();
    for s in sids {
        // --stateless: every connection port space (SIDR has no stateless answer).
        let stateless = args.stateless.stateless
            && s.rdma_cm_port()
                .is_none_or(|(space, _)| space != PortSpace::Udp);
        let mut l = if stateless {
            let data = args.accept_data.as_ref().map(|h| h.0.as_slice());
            let t = ping::stateless::template(&args.stateless, data);
            cm.listen_stateless(s, ListenOptions::default(), t).await?
        } else {
            cm.listen(s, ListenOptions::default()).await?
        };
        let tx = tx.clone();
        tokio::spawn(async move {
            while let Some(i) = l.next_arrival().await {
                if tx.send(i).is_err() {
                    break;
                }
            }
        });
    }
    drop(tx);
    // Printed even with --quiet: scripts wait for it before they connect.
    println!("listening on {ip} service_id={sid}");
    let counts = Arc::new(Counts::default());
    let qpn = Arc::new(QpnAlloc::new());
    let peers = Arc::new(ping::stateless::PeerCounts::default());
    let mut sigint = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())?;
    let mut sigterm = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    loop {
        let inc = tokio::select! {
            i = incoming.recv() => i,
            _ = sigint.recv() => None,
            _ = sigterm.recv() => None,
        };
        let Some(inc) = inc else {
            break;
        };
        if let Arrival::Stateless(conn, info) = &inc {
            ping::stateless::arrived(&args, &counts, &peers, conn, info);
        }
        let (cm, args, counts, qpn) = (cm.clone(), args.clone(), counts.clone(), qpn.clone());
        let peers = peers.clone();
        tokio::spawn(async move {
            let inc = match inc {
                Arrival::Request(inc) => inc,
                Arrival::Stateless(conn, info) => {
                    return ping::stateless::serve(&args, &counts, &peers, conn, &info).await;
                }
            };
            if let Err(e) = serve_one(&cm, &args, &counts, &qpn, &peers, inc).await {
                out_limited(&args, format_args!("error {e:#}"));
            }
        });
    }
    // Stateless connections already handed over are established: counted (requests still
    // queued are left unanswered).
    while let Ok(inc) = incoming.try_recv() {
        if let Arrival::Stateless(conn, info) = &inc {
            ping::stateless::arrived(&args, &counts, &peers, conn, info);
        }
    }
    ping::report_timing();
    if args.stateless.peer_counts {
        println!("{}", peers.line());
    }
    println!("{}", counts.line());
    // The endpoint's counters, every drop by reason: the last line, one JSON object (the
    // daemon's endpoint is not this client's to report).
    if args.daemon.is_none() {
        println!("{}", cm.stats().await?.to_json());
    }
    // Stopped with its connections up, as a killed peer's would be: the process ends here.
    // Returning would drop the handles while the runtime shuts down, and whether the driver
    // then still ran long enough to send DREQs depended on which task the shutdown reached
    // first (the tests that stop a listener to count what it held rely on no DREQ).
    use std::io::Write as _;
    let _ = std::io::stdout().flush();
    std::process::exit(0)
}

async fn serve_one(
    cm: &Cm,
    args: &Args,
    counts: &Counts,
    qpn: &QpnAlloc,
    peers: &ping::stateless::PeerCounts,
    inc: ibcm::rt::Incoming,
) -> Result<()> {
    let req = match inc.kind() {
        IncomingKind::Connect(req) => req,
        IncomingKind::Sidr(s) => {
            out_limited(
                args,
                format_args!(
                    "sidr request from {} request_id={} sid={} pd={}",
                    s.peer,
                    s.request_id.0,
                    s.service_id,
                    hex_trim(&s.private_data)
                ),
            );
            // Without --sidr-qpn cm-ping serves no UD QP: a SIDR_REQ is refused (explicitly,
            // so nothing is logged).
            let p = match args.sidr_qpn {
                Some(q) => {
                    SidrRepParams::success(Qpn::masked(q as u32), Qkey(args.sidr_qkey as u32))
                }
                None => SidrRepParams {
                    status: SidrStatus::Rejected,
                    ..SidrRepParams::success(Qpn::default(), Qkey(0))
                },
            };
            let status = p.status;
            inc.sidr_reply(p).await?;
            out_limited(args, format_args!("sidr answered status={status:?}"));
            return Ok(());
        }
    };
    let id_hint = req.req.local_comm_id;
    let peer = req.peer;
    let xrc = req.transport() == ReqTransport::Xrc;
    let passive_disconnects = req.user_private_data().starts_with(DISCONNECT_MARKER);
    let cma = req.cma_header.map_or(String::new(), |h| {
        format!(" cma={}:{}->{}", h.src, h.src_port, h.dst)
    });
    out_limited(
        args,
        format_args!(
            "request from {peer} remote_comm_id={id_hint} remote_qpn={} sid={}{}{cma} pd={}",
            req.remote_qpn(),
            req.service_id(),
            if xrc { " XRC" } else { "" },
            hex_trim(req.user_private_data())
        ),
    );
    if let Some(reason) = args.reject {
        let pd = args.reject_data.clone().map(|h| h.0).unwrap_or_default();
        inc.reject(RejReason::from_raw(reason), &[], &pd).await?;
        counts.rejected.fetch_add(1, Ordering::Relaxed);
        out_limited(
            args,
            format_args!("rejected remote_comm_id={id_hint} reason={reason}"),
        );
        return Ok(());
    }
    if let (Some(ms), true) = (args.accept_delay, args.mra_on_duplicate) {
        // No MRA now: a duplicate REQ before the accept gets one from the endpoint
        // (EndpointConfig::mra_on_duplicate_req).
        out_limited(
            args,
            format_args!("accepting remote_comm_id={id_hint} in {ms} ms (MRA on a duplicate REQ)"),
        );
        tokio::time::sleep(Duration::from_millis(ms)).await;
    } else if let Some(ms) = args.accept_delay {
        let t = TimeoutExp::from_duration_ceil(Duration::from_millis(ms * 2));
        inc.mra(t).await?;
        out_limited(
            args,
            format_args!(
                "mra sent remote_comm_id={id_hint} service_timeout={}; accepting in {ms} ms",
                t.get()
            ),
        );
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
    if args.verbs.verbs.is_some() {
        return ping::serve(cm, args, counts, inc).await;
    }
    let q = ping::stateless::stateful_qpn(&args.stateless, qpn);
    let mut p = if xrc {
        // One TGT QP per listener: every XRC connection lands on it. It lives as long as the
        // listener, so a new connection may attach while an earlier one is in TimeWait.
        let mut p = AcceptParams::xrc_tgt(Qpn::masked(0x0ab_cdef));
        p.xrc_tgt_live = true;
        p
    } else {
        AcceptParams::new(q)
    };
    p.starting_psn = cm.random_psn().await?;
    if let Some(h) = &args.accept_data {
        p.private_data = h.0.clone();
    }
    let conn = inc.accept(p).await?;
    match conn.established().await {
        Ok(()) => {
            counts.established.fetch_add(1, Ordering::Relaxed);
            peers.up(peer);
            out_limited(args, format_args!("established conn={}", conn.id()));
        }
        Err(e) => {
            counts.count_error(&e);
            out_limited(args, format_args!("failed conn={} {e}", conn.id()));
            return Ok(());
        }
    }
    let why = if passive_disconnects {
        conn.disconnect(&[]).await
    } else {
        conn.closed().await
    };
    peers.down(peer);
    counts.count_end(&why);
    out_limited(
        args,
        format_args!("disconnected conn={} ({why})", conn.id()),
    );
    Ok(())
}
