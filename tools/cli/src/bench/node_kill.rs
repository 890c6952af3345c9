//! `cm-bench node-kill`: the time from SIGKILL of a client of the node's CM service
//! (`ibcmd`) to the DREQs on the wire.
//!
//! One `ibcmd` runs on `--daemon-ip` (UDP 4791) and this process is its peer, an ibcm
//! endpoint of its own on `--peer-ip`. Each round:
//!
//! * `rc`: a `cm-ping --daemon … --stay` child connects `--conns` times through the daemon to
//!   this process's listener; once every connection is established here, the child is
//!   SIGKILLed. The daemon sees its socket close and disconnects its connections.
//! * `xrc`: a `cm-ping --daemon … --listen --xrc --policy process` child has the daemon serve
//!   an XRC service; this process connects `--conns` XRC connections to it; then the child is
//!   SIGKILLed, and its process-bound TGT QPs go with it ("target gone (creator exited)").
//!
//! The clock starts just before `kill(2)` and stops for each connection when this process's
//! endpoint has received its DREQ (`Connection::closed` resolves; for XRC a connection whose
//! RTU the daemon had not yet handled ends with the REJ "no QP" carrying the same "target gone"
//! block, and counts the same). Printed per round: first
//! and last DREQ; at the end the median over the rounds of each. Last line:
//! `node-kill: rc first <ms> ms, last <ms> ms; xrc first <ms> ms, last <ms> ms (median of R rounds, N connections)`.

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use ibcm::proto::{AcceptParams, ConnectParams, ConnectionError, EndpointConfig, ListenOptions};
use ibcm::rt::{Cm, Connection, UdpTransport};
use ibcm_mad::xrc::TargetGone;
use ibcm_mad::{Guid, Qpn, ServiceId};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// Options of the benchmark.
#[derive(Debug, Clone)]
pub(crate) struct NodeKillOpts {
    pub(crate) conns: u64,
    pub(crate) rounds: u32,
    pub(crate) daemon_ip: IpAddr,
    pub(crate) peer_ip: IpAddr,
    pub(crate) bin_dir: Option<PathBuf>,
}

fn bin(dir: &Path, name: &str) -> Result<PathBuf> {
    let p = dir.join(name);
    if !p.exists() {
        bail!(
            "{} not found: build it first (cargo build --release -p ibcmd -p ibcm-tools), or give --bin-dir",
            p.display()
        );
    }
    Ok(p)
}

/// Runs the benchmark.
pub(crate) fn node_kill(o: &NodeKillOpts) -> Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(run(o))
}

async fn wait_for(path: &Path, child: &mut Child) -> Result<()> {
    // The socket appears once the daemon serves; poll its existence (the daemon creates it
    // after binding UDP), and fail if the daemon died.
    for _ in 0..500 {
        if path.exists() {
            return Ok(());
        }
        if let Some(st) = child.try_wait()? {
            bail!("ibcmd exited: {st}");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    bail!("{} did not appear", path.display())
}

async fn run(o: &NodeKillOpts) -> Result<()> {
    let dir = match &o.bin_dir {
        Some(d) => d.clone(),
        None => std::env::current_exe()?
            .parent()
            .ok_or_else(|| anyhow!("no directory of cm-bench"))?
            .to_path_buf(),
    };
    let (ibcmd, cm_ping) = (bin(&dir, "ibcmd")?, bin(&dir, "cm-ping")?);
    let tmp = std::env::temp_dir().join(format!("cm-bench-node-kill-{}", std::process::id()));
    std::fs::create_dir_all(&tmp)?;
    let sock = tmp.join("ibcmd.sock");
    let mut daemon = Command::new(&ibcmd)
        .args(["--addr", &o.daemon_ip.to_string(), "--socket"])
        .arg(&sock)
        .arg("--state")
        .arg(tmp.join("state"))
        .env("IBCMD_LOG", "warn")
        .kill_on_drop(true)
        .spawn()
        .context("cannot start ibcmd")?;
    wait_for(&sock, &mut daemon).await?;
    let udp = UdpTransport::bind(o.peer_ip)
        .await
        .with_context(|| format!("cannot bind UDP {}:4791", o.peer_ip))?;
    let cfg = EndpointConfig {
        local_ca_guid: Guid(0x0002_c903_00be_0001),
        local_gid: ibcm_mad::Gid::from_ip(o.peer_ip),
        ..EndpointConfig::default()
    };
    let (cm, _) = Cm::bind(udp, cfg);
    let mut rc = Vec::new();
    let mut xrc = Vec::new();
    for round in 0..o.rounds {
        let sid = ServiceId(0x1000_0000 + u64::from(round));
        let (f, l) = rc_round(o, &cm, &cm_ping, &sock, sid).await?;
        println!(
            "node-kill round {round}: rc   first DREQ {:.3} ms, last {:.3} ms",
            ms(f),
            ms(l)
        );
        rc.push((f, l));
        let sid = ServiceId(0x2000_0000 + u64::from(round));
        let (f, l) = xrc_round(o, &cm, &cm_ping, &sock, sid).await?;
        println!(
            "node-kill round {round}: xrc  first DREQ {:.3} ms, last {:.3} ms",
            ms(f),
            ms(l)
        );
        xrc.push((f, l));
    }
    let _ = daemon.start_kill();
    let _ = daemon.wait().await;
    let _ = std::fs::remove_dir_all(&tmp);
    let med = |v: &[(Duration, Duration)], last: bool| {
        let mut x: Vec<Duration> = v.iter().map(|p| if last { p.1 } else { p.0 }).collect();
        x.sort();
        x.get(x.len() / 2).copied().unwrap_or_default()
    };
    println!(
        "node-kill: rc first {:.3} ms, last {:.3} ms; xrc first {:.3} ms, last {:.3} ms (median of {} rounds, {} connections)",
        ms(med(&rc, false)),
        ms(med(&rc, true)),
        ms(med(&xrc, false)),
        ms(med(&xrc, true)),
        o.rounds,
        o.conns
    );
    Ok(())
}

/// QPNs of this process, never reused within a run (a closed connection's QPN waits out its
/// TimeWait).
static NEXT_QPN: AtomicU32 = AtomicU32::new(0x100);

fn next_qpn() -> Result<Qpn> {
    Qpn::new(NEXT_QPN.fetch_add(1, Ordering::Relaxed)).ok_or_else(|| anyhow!("out of QPNs"))
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// SIGKILL now; then the time to each connection's DREQ.
async fn kill_and_time(
    child: &mut Child,
    conns: Vec<Connection>,
    want_gone: bool,
) -> Result<(Duration, Duration)> {
    let mut set = tokio::task::JoinSet::new();
    // Waiting from before the kill: no close is missed.
    for c in conns {
        set.spawn(async move {
            let why = c.closed().await;
            (Instant::now(), why)
        });
    }
    let t0 = Instant::now();
    child.start_kill()?;
    let mut times = Vec::new();
    while let Some(r) = set.join_next().await {
        let (t, why) = r?;
        match &why {
            ConnectionError::Disconnected {
                by_peer: true,
                private_data,
            } => {
                let mut pd = private_data.clone();
                pd.resize(pd.len().max(TargetGone::LEN), 0);
                if want_gone && TargetGone::parse(&pd).is_none() {
                    bail!("a DREQ without the target-gone block");
                }
            }
            // XRC: a connection whose RTU the daemon had not yet handled when the target
            // died ends with the REJ that carries the same "target gone" block.
            ConnectionError::Rejected {
                reason,
                private_data,
                ..
            } if want_gone && *reason == ibcm_mad::RejReason::NoQp => {
                let mut pd = private_data.clone();
                pd.resize(pd.len().max(TargetGone::LEN), 0);
                if TargetGone::parse(&pd).is_none() {
                    bail!("a REJ without the target-gone block");
                }
            }
            other => bail!("a connection ended otherwise: {other}"),
        }
        times.push(t.saturating_duration_since(t0));
    }
    let _ = child.wait().await;
    times.sort();
    match (times.first(), times.last()) {
        (Some(&f), Some(&l)) => Ok((f, l)),
        _ => bail!("no connections"),
    }
}

async fn rc_round(
    o: &NodeKillOpts,
    cm: &Cm,
    cm_ping: &Path,
    sock: &Path,
    sid: ServiceId,
) -> Result<(Duration, Duration)> {
    let mut listener = cm.listen(sid, ListenOptions::default()).await?;
    let mut child = Command::new(cm_ping)
        .args([
            "--connect",
            &o.peer_ip.to_string(),
            "--bind",
            &o.daemon_ip.to_string(),
        ])
        .args([
            "--service-id",
            &format!("{:#x}", sid.0),
            "--count",
            &o.conns.to_string(),
        ])
        .args(["--parallel", "8", "--stay", "--quiet", "--daemon"])
        .arg(sock)
        .stdout(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .context("cannot start cm-ping")?;
    let mut conns = Vec::new();
    while (conns.len() as u64) < o.conns {
        let inc = listener
            .next()
            .await
            .ok_or_else(|| anyhow!("listener closed"))?;
        let conn = inc.accept(AcceptParams::new(next_qpn()?)).await?;
        conn.established().await?;
        conns.push(conn);
    }
    kill_and_time(&mut child, conns, false).await
}

async fn xrc_round(
    o: &NodeKillOpts,
    cm: &Cm,
    cm_ping: &Path,
    sock: &Path,
    sid: ServiceId,
) -> Result<(Duration, Duration)> {
    let mut child = Command::new(cm_ping)
        .args([
            "--listen",
            &o.daemon_ip.to_string(),
            "--xrc",
            "--policy",
            "process",
        ])
        .args([
            "--service-id",
            &format!("{:#x}", sid.0),
            "--quiet",
            "--daemon",
        ])
        .arg(sock)
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .context("cannot start cm-ping")?;
    let out = child
        .stdout
        .take()
        .ok_or_else(|| anyhow!("no stdout of cm-ping"))?;
    let mut lines = BufReader::new(out).lines();
    loop {
        match lines.next_line().await? {
            Some(l) if l.starts_with("listening") => break,
            Some(_) => {}
            None => bail!("cm-ping --listen exited before listening"),
        }
    }
    let peer = SocketAddr::new(o.daemon_ip, 4791);
    let mut conns = Vec::new();
    for _ in 0..o.conns {
        let p = ConnectParams::new(peer, sid, next_qpn()?).xrc();
        conns.push(cm.connect(p).await?);
    }
    kill_and_time(&mut child, conns, true).await
}
