//! The `xrcd-keeper` command line (`serve`, `status`, `leaks`, `hold`, `request`), shared by
//! the `xrcd-keeper` binary and `ibcmd keeper`. Usage: the binary's documentation
//! (`xrc/src/bin/xrcd-keeper.rs`).

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use crate::keeper::client::{ClientError, KeeperClient};
use crate::keeper::proto::{HolderView, KeeperEvent, LeakView, Request, StatusReport};
use crate::keeper::server::{serve, Backend, KeeperLimits, ServerConfig};
use crate::verbs::model::ModelConfig;
use crate::RegistryConfig;
use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand, ValueEnum};

/// Holds XRC domains and TGT QPs for other processes.
#[derive(Debug, Parser)]
#[command(
    name = "xrcd-keeper",
    version,
    about = "Holds XRC domains and TGT QPs for other processes, so that they outlive them"
)]
struct Args {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum BackendArg {
    /// The software model (no RDMA device needed).
    Sim,
    /// rdma-core (needs an XRC-capable device and a build with `--features rdma`).
    Verbs,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Run the keeper.
    Serve {
        /// Unix socket to listen on.
        #[arg(long)]
        socket: PathBuf,
        /// Verbs backend.
        #[arg(long, value_enum, default_value = "sim")]
        backend: BackendArg,
        /// RDMA device for `--backend verbs` (default: the first).
        #[arg(long)]
        device: Option<String>,
        /// Quarantine of a released QPN when no connection tells a longer CM TimeWait.
        #[arg(long, default_value_t = 4295)]
        quarantine_ms: u64,
        /// Sessions one Unix user may have open at once.
        #[arg(long, default_value_t = KeeperLimits::default().sessions_per_user)]
        max_clients_per_user: usize,
        /// Domains one Unix user may create.
        #[arg(long, default_value_t = KeeperLimits::default().domains_per_user)]
        max_domains_per_user: usize,
        /// TGT QPs one Unix user may create.
        #[arg(long, default_value_t = KeeperLimits::default().qps_per_user)]
        max_qps_per_user: usize,
    },
    /// Print domains, TGT QPs, their policy and holders, one per line.
    Status {
        /// Unix socket of the keeper.
        #[arg(long)]
        socket: PathBuf,
        /// Print the raw JSON report.
        #[arg(long)]
        json: bool,
    },
    /// List TGT QPs with no live connection, owner or registration.
    Leaks {
        /// Unix socket of the keeper.
        #[arg(long)]
        socket: PathBuf,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Create or register the domain's Shared TGT QP, print its QPN, hold it until killed.
    Hold {
        /// Unix socket of the keeper.
        #[arg(long)]
        socket: PathBuf,
        /// Domain name (opened if the keeper does not have it yet).
        #[arg(long)]
        domain: String,
        /// File naming the domain for other processes (default: a private domain).
        #[arg(long)]
        path: Option<String>,
        /// Hold a Shared TGT QP (the only kind `hold` manages).
        #[arg(long, required = true)]
        shared_qp: bool,
        /// Which Shared QP of the domain (several can be kept under different keys).
        #[arg(long, default_value = "default")]
        key: String,
    },
    /// Send requests (JSON objects of the keeper protocol, one per argument) in one session;
    /// print each result as one JSON line. Stops at the first refusal (exit status 1, the
    /// error on stderr as `request N: <kind>: <message>`).
    Request {
        /// Unix socket of the keeper.
        #[arg(long)]
        socket: PathBuf,
        /// The requests, e.g. `{"op":"status"}`.
        #[arg(required = true)]
        json: Vec<String>,
    },
}

/// Runs the keeper's command line (`xrcd-keeper`, and `ibcmd keeper`): `args` as from
/// [`std::env::args_os`], the program name first. Clap's usage errors and `--help` exit the
/// process as clap does.
pub fn main_from<I, T>(args: I) -> ExitCode
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let args = Args::parse_from(args);
    match run(args) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("xrcd-keeper: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: Args) -> Result<ExitCode> {
    match args.cmd {
        Cmd::Serve {
            socket,
            backend,
            device,
            quarantine_ms,
            max_clients_per_user,
            max_domains_per_user,
            max_qps_per_user,
        } => {
            let mut registry = RegistryConfig::default();
            registry.policy.default_timewait = Duration::from_millis(quarantine_ms);
            let backend = match backend {
                BackendArg::Sim => Backend::Model(ModelConfig::mlx5()),
                BackendArg::Verbs => Backend::Verbs { device },
            };
            serve(&ServerConfig {
                socket,
                backend,
                registry,
                limits: KeeperLimits {
                    sessions_per_user: max_clients_per_user,
                    domains_per_user: max_domains_per_user,
                    qps_per_user: max_qps_per_user,
                },
            })?;
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Status { socket, json } => {
            let mut c = connect(&socket, "status")?;
            let v = c.call(Request::Status)?;
            if json {
                println!("{v}");
            } else {
                let r: StatusReport = serde_json::from_value(v).context("status reply")?;
                print_status(&r);
            }
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Leaks { socket, json } => {
            let mut c = connect(&socket, "leaks")?;
            let v = c.call(Request::Leaks)?;
            if json {
                println!("{v}");
            } else {
                let leaks: Vec<LeakView> = serde_json::from_value(v).context("leaks reply")?;
                if leaks.is_empty() {
                    println!("no leaks");
                }
                for l in leaks {
                    println!(
                        "leak qp {:#08x} domain={} policy={} creator={}",
                        l.qpn,
                        l.domain,
                        l.policy,
                        pid_text(l.creator_pid)
                    );
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Hold {
            socket,
            domain,
            path,
            shared_qp,
            key,
        } => {
            if !shared_qp {
                bail!("hold needs --shared-qp");
            }
            hold(&socket, &domain, path, &key)
        }
        Cmd::Request { socket, json } => {
            let reqs = json
                .iter()
                .map(|j| serde_json::from_str::<Request>(j).with_context(|| format!("request {j}")))
                .collect::<Result<Vec<_>>>()?;
            let mut c = connect(&socket, "request")?;
            for (i, r) in reqs.into_iter().enumerate() {
                match c.call(r) {
                    Ok(v) => println!("{v}"),
                    Err(ClientError::Keeper { kind, message }) => {
                        eprintln!("request {}: {kind}: {message}", i + 1);
                        return Ok(ExitCode::FAILURE);
                    }
                    Err(e) => return Err(e.into()),
                }
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn connect(socket: &std::path::Path, name: &str) -> Result<KeeperClient> {
    KeeperClient::connect(socket, name)
        .with_context(|| format!("cannot reach a keeper on {}", socket.display()))
}

fn pid_text(p: Option<u32>) -> String {
    p.map_or_else(|| "-".to_owned(), |p| p.to_string())
}

fn holder_text(h: &HolderView) -> String {
    let mut s = match &h.conn {
        Some(c) => format!("conn:{c}@{}", pid_text(h.pid)),
        None => pid_text(h.pid),
    };
    if h.count > 1 {
        s.push_str(&format!("x{}", h.count));
    }
    s
}

/// `live`, or `gone:<cause-with-dashes>` (one token, for scripts).
fn life_text(life: &str) -> String {
    match life.strip_prefix("gone: ") {
        Some(cause) => format!("gone:{}", cause.replace(' ', "-")),
        None => life.to_owned(),
    }
}

fn print_status(r: &StatusReport) {
    println!(
        "keeper pid={} epoch={} backend={} device={} sessions={}",
        r.keeper_pid,
        r.epoch,
        r.backend,
        r.device,
        r.sessions.len()
    );
    for s in &r.sessions {
        println!(
            "session {} pid={} name={}",
            s.session,
            pid_text(s.pid),
            if s.name.is_empty() { "-" } else { &s.name }
        );
    }
    for d in &r.domains {
        println!("domain {} path={} state={}", d.name, d.path, d.state);
    }
    for q in &r.qps {
        let holders: Vec<String> = q.holders.iter().map(holder_text).collect();
        println!(
            "qp {:#08x} domain={} policy={} life={} state={} creator={} owner={} holders={} conns={}",
            q.qpn,
            q.domain,
            q.policy,
            life_text(&q.life),
            q.state,
            pid_text(q.creator_pid),
            pid_text(q.owner_pid),
            if holders.is_empty() { "-".to_owned() } else { holders.join(",") },
            if q.conns.is_empty() { "-".to_owned() } else { q.conns.join(",") },
        );
    }
}

fn hold(
    socket: &std::path::Path,
    domain: &str,
    path: Option<String>,
    key: &str,
) -> Result<ExitCode> {
    let mut c = connect(socket, "hold")?;
    c.call(Request::OpenDomain {
        domain: domain.to_owned(),
        path,
        create: true,
        exclusive: false,
    })?;
    let r = c.call(Request::CreateOrRegister {
        domain: domain.to_owned(),
        key: key.to_owned(),
    })?;
    let qpn = r
        .get("qpn")
        .and_then(serde_json::Value::as_u64)
        .context("reply without qpn")?;
    let created = r
        .get("created")
        .and_then(serde_json::Value::as_bool)
        .unwrap_or(false);
    println!("{qpn:#08x}");
    std::io::stdout().flush()?;
    eprintln!(
        "xrcd-keeper hold: {} shared TGT QP {qpn:#08x} in domain {domain} (keeper epoch {}); holding until killed",
        if created { "created" } else { "registered on" },
        c.epoch()
    );
    loop {
        match c.next_event() {
            Ok(ev) => match ev.event {
                KeeperEvent::QpGone { qpn: q, cause } if u64::from(q) == qpn => {
                    eprintln!("xrcd-keeper hold: TGT QP {qpn:#08x} is gone: {cause}");
                    return Ok(ExitCode::from(4));
                }
                _ => {}
            },
            Err(ClientError::KeeperGone) => {
                let why = match c.reconnect(Duration::from_secs(5)) {
                    Err(e) => e.to_string(),
                    // Same keeper, but our connection (and with it our registration) is gone.
                    Ok(()) => {
                        "lost the connection to the keeper: this hold's registration was released"
                            .to_owned()
                    }
                };
                eprintln!("xrcd-keeper hold: {why} (qpn {qpn:#08x})");
                return Ok(ExitCode::from(3));
            }
            Err(e) => return Err(e.into()),
        }
    }
}
