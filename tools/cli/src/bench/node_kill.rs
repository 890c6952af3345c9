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
//!
//! With `--restart` each round kills the daemon instead of a client: a `cm-ping --daemon …
//! --stay` child holds `--conns` connections to this process's listener; the daemon is
//! SIGKILLed (it sends nothing), the child is stopped, and the daemon is started again on the
//! same socket and state directory. Its journal names the connections of its previous life,
//! and it sends each peer a DREQ. With `--drop-ms N` this process drops every DREQ that
//! arrives in the first N ms after the restart, as a lossy wire would: the daemon must
//! retransmit. The clock starts when the new daemon is spawned and stops for each connection
//! when its DREQ is received here. A round fails if a connection has not ended 10 s after
//! the drop window. Last line:
//! `node-kill --restart: first <ms> ms, last <ms> ms after the restart, drop window <N> ms; C/C connections ended at the peer (median of R rounds)`.

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use bytes::Bytes;
use ibcm::proto::PeerAddr;
use ibcm::proto::{AcceptParams, ConnectParams, ConnectionError, EndpointConfig, ListenOptions};
use ibcm::rt::{Cm, Connection, DatagramTransport, Listener, UdpTransport};
use ibcm_mad::codes::AttrId;
use ibcm_mad::xrc::TargetGone;
use ibcm_mad::{Guid, MadHeader, Qpn, ServiceId};
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
    /// Kill and restart the daemon instead of a client (module docs).
    pub(crate) restart: bool,
    /// With `restart`: DREQs arriving here in the first this many ms after the restart are
    /// dropped.
    pub(crate) drop_ms: u64,
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

/// Starts `ibcmd` on `o.daemon_ip` with `sock` and the state directory `state`.
fn spawn_daemon(ibcmd: &Path, o: &NodeKillOpts, sock: &Path, state: &Path) -> Result<Child> {
    Command::new(ibcmd)
        .args(["--addr", &o.daemon_ip.to_string(), "--socket"])
        .arg(sock)
        .arg("--state")
        .arg(state)
        // Quiet unless the caller asks for the daemon's log.
        .env(
            "IBCMD_LOG",
            std::env::var("IBCMD_LOG").unwrap_or_else(|_| "warn".into()),
        )
        .kill_on_drop(true)
        .spawn()
        .context("cannot start ibcmd")
}

/// Waits until the daemon `child` serves `path` (a socket a dead daemon left there does not
/// count: it accepts no connection).
async fn wait_serving(path: &Path, child: &mut Child) -> Result<()> {
    for _ in 0..500 {
        if tokio::net::UnixStream::connect(path).await.is_ok() {
            return Ok(());
        }
        if let Some(st) = child.try_wait()? {
            bail!("ibcmd exited: {st}");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    bail!("{} is not served", path.display())
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
    let state = tmp.join("state");
    let mut daemon = spawn_daemon(&ibcmd, o, &sock, &state)?;
    wait_serving(&sock, &mut daemon).await?;
    let udp = UdpTransport::bind(o.peer_ip)
        .await
        .with_context(|| format!("cannot bind UDP {}:4791", o.peer_ip))?;
    let gate = DreqGate::default();
    let cfg = EndpointConfig {
        local_ca_guid: Guid(0x0002_c903_00be_0001),
        local_gid: ibcm_mad::Gid::from_ip(o.peer_ip),
        ..EndpointConfig::default()
    };
    let (cm, _) = Cm::bind(gate.wrap(udp), cfg);
    let r = if o.restart {
        let mut rounds = Vec::new();
        for round in 0..o.rounds {
            let sid = ServiceId(0x3000_0000 + u64::from(round));
            let cx = RestartCx {
                ibcmd: &ibcmd,
                cm_ping: &cm_ping,
                sock: &sock,
                state: &state,
                gate: &gate,
            };
            let (f, l) = restart_round(o, &cm, &cx, &mut daemon, sid).await?;
            println!(
                "node-kill round {round}: restart  first DREQ {:.3} ms, last {:.3} ms after the restart; {} DREQs dropped here",
                ms(f),
                ms(l),
                gate.take_dropped()
            );
            rounds.push((f, l));
        }
        println!(
            "node-kill --restart: first {:.3} ms, last {:.3} ms after the restart, drop window {} ms; {c}/{c} connections ended at the peer (median of {} rounds)",
            ms(median(&rounds, false)),
            ms(median(&rounds, true)),
            o.drop_ms,
            o.rounds,
            c = o.conns,
        );
        Ok(())
    } else {
        client_rounds(o, &cm, &cm_ping, &sock).await
    };
    let _ = daemon.start_kill();
    let _ = daemon.wait().await;
    let _ = std::fs::remove_dir_all(&tmp);
    r
}

fn median(v: &[(Duration, Duration)], last: bool) -> Duration {
    let mut x: Vec<Duration> = v.iter().map(|p| if last { p.1 } else { p.0 }).collect();
    x.sort();
    x.get(x.len() / 2).copied().unwrap_or_default()
}

/// The rounds that kill a client (`rc`, then `xrc`).
async fn client_rounds(o: &NodeKillOpts, cm: &Cm, cm_ping: &Path, sock: &Path) -> Result<()> {
    let mut rc = Vec::new();
    let mut xrc = Vec::new();
    for round in 0..o.rounds {
        let sid = ServiceId(0x1000_0000 + u64::from(round));
        let (f, l) = rc_round(o, cm, cm_ping, sock, sid).await?;
        println!(
            "node-kill round {round}: rc   first DREQ {:.3} ms, last {:.3} ms",
            ms(f),
            ms(l)
        );
        rc.push((f, l));
        let sid = ServiceId(0x2000_0000 + u64::from(round));
        let (f, l) = xrc_round(o, cm, cm_ping, sock, sid).await?;
        println!(
            "node-kill round {round}: xrc  first DREQ {:.3} ms, last {:.3} ms",
            ms(f),
            ms(l)
        );
        xrc.push((f, l));
    }
    println!(
        "node-kill: rc first {:.3} ms, last {:.3} ms; xrc first {:.3} ms, last {:.3} ms (median of {} rounds, {} connections)",
        ms(median(&rc, false)),
        ms(median(&rc, true)),
        ms(median(&xrc, false)),
        ms(median(&xrc, true)),
        o.rounds,
        o.conns
    );
    Ok(())
}

/// Drops the DREQs that reach this process until a deadline: the lossy wire of `--drop-ms`.
#[derive(Debug, Clone, Default)]
struct DreqGate {
    until: Arc<Mutex<Option<Instant>>>,
    dropped: Arc<AtomicU64>,
}

impl DreqGate {
    fn wrap<T: DatagramTransport>(&self, inner: T) -> Gated<T> {
        Gated {
            inner,
            gate: self.clone(),
        }
    }

    /// DREQs are dropped until `t`.
    fn close_until(&self, t: Instant) {
        *self.until.lock().unwrap_or_else(|e| e.into_inner()) = Some(t);
    }

    fn drops(&self, mad: &[u8]) -> bool {
        let closed = self
            .until
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some_and(|t| Instant::now() < t);
        let drop = closed && MadHeader::peek_attr_id(mad) == Some(AttrId::Dreq);
        if drop {
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
        drop
    }

    fn take_dropped(&self) -> u64 {
        self.dropped.swap(0, Ordering::Relaxed)
    }
}

/// A transport behind a [`DreqGate`].
struct Gated<T> {
    inner: T,
    gate: DreqGate,
}

impl<T: DatagramTransport> DatagramTransport for Gated<T> {
    async fn send(&mut self, to: PeerAddr, mad: &[u8]) -> std::io::Result<()> {
        self.inner.send(to, mad).await
    }

    async fn recv(&mut self) -> std::io::Result<(PeerAddr, Bytes)> {
        loop {
            let (from, mad) = self.inner.recv().await?;
            if !self.gate.drops(&mad) {
                return Ok((from, mad));
            }
        }
    }

    fn local_addr(&self) -> PeerAddr {
        self.inner.local_addr()
    }
}

/// What a restart round needs besides the options and the endpoint.
struct RestartCx<'a> {
    ibcmd: &'a Path,
    cm_ping: &'a Path,
    sock: &'a Path,
    state: &'a Path,
    gate: &'a DreqGate,
}

/// Accepts `o.conns` connections from the cm-ping `child`; fails if it exits first (one of
/// its connects failed: it then stops with a non-zero status).
async fn accept_all(
    o: &NodeKillOpts,
    listener: &mut Listener,
    child: &mut Child,
) -> Result<Vec<Connection>> {
    let mut conns = Vec::new();
    while (conns.len() as u64) < o.conns {
        let inc = tokio::select! {
            inc = listener.next() => inc.ok_or_else(|| anyhow!("listener closed"))?,
            st = child.wait() => bail!(
                "cm-ping exited ({}) after {} of {} connections",
                st?,
                conns.len(),
                o.conns
            ),
        };
        let conn = inc.accept(AcceptParams::new(next_qpn()?)).await?;
        conn.established().await?;
        conns.push(conn);
    }
    Ok(conns)
}

/// A `cm-ping --daemon … --stay` child connecting `o.conns` times through the daemon at
/// `sock` to this process's listener on `sid`; with `lines`, its "established" lines are
/// piped to the caller (else it is quiet).
fn stay_client(
    o: &NodeKillOpts,
    cm_ping: &Path,
    sock: &Path,
    sid: ServiceId,
    lines: bool,
) -> Result<Child> {
    let mut c = Command::new(cm_ping);
    c.args([
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
    .args(["--parallel", "8", "--stay", "--daemon"])
    .arg(sock)
    .kill_on_drop(true);
    if lines {
        c.stdout(Stdio::piped());
    } else {
        c.arg("--quiet").stdout(Stdio::null());
    }
    c.spawn().context("cannot start cm-ping")
}

/// One `--restart` round: connections through the daemon, the daemon SIGKILLed and started
/// again; the time from the new start to each connection's DREQ here.
async fn restart_round(
    o: &NodeKillOpts,
    cm: &Cm,
    cx: &RestartCx<'_>,
    daemon: &mut Child,
    sid: ServiceId,
) -> Result<(Duration, Duration)> {
    let mut listener = cm.listen(sid, ListenOptions::default()).await?;
    let mut child = stay_client(o, cx.cm_ping, cx.sock, sid, true)?;
    let out = child
        .stdout
        .take()
        .ok_or_else(|| anyhow!("no stdout of cm-ping"))?;
    let mut lines = BufReader::new(out).lines();
    let conns = accept_all(o, &mut listener, &mut child).await?;
    // The client hears "established" after the daemon has journaled the connection: only
    // then is the daemon's death a test of the journal.
    let mut told = 0;
    while told < o.conns {
        match lines.next_line().await? {
            Some(l) if l.starts_with("established") => told += 1,
            Some(_) => {}
            None => bail!("cm-ping exited before every connection was established"),
        }
    }
    let mut set = tokio::task::JoinSet::new();
    for c in conns {
        set.spawn(async move {
            let why = c.closed().await;
            (Instant::now(), why)
        });
    }
    daemon.start_kill()?;
    let _ = daemon.wait().await;
    child.start_kill()?;
    let _ = child.wait().await;
    let t0 = Instant::now();
    cx.gate.close_until(t0 + Duration::from_millis(o.drop_ms));
    *daemon = spawn_daemon(cx.ibcmd, o, cx.sock, cx.state)?;
    let limit = Duration::from_millis(o.drop_ms) + Duration::from_secs(10);
    let mut times = Vec::new();
    let collect = async {
        while let Some(r) = set.join_next().await {
            let (t, why) = r?;
            match why {
                ConnectionError::Disconnected { by_peer: true, .. } => {
                    times.push(t.saturating_duration_since(t0));
                }
                other => bail!("a connection ended otherwise: {other}"),
            }
        }
        Ok(())
    };
    match tokio::time::timeout(limit, collect).await {
        Ok(r) => r?,
        Err(_) => bail!(
            "{}/{} connections ended at the peer {} ms after the restart",
            times.len(),
            o.conns,
            limit.as_millis()
        ),
    }
    wait_serving(cx.sock, daemon).await?;
    times.sort();
    match (times.first(), times.last()) {
        (Some(&f), Some(&l)) => Ok((f, l)),
        _ => bail!("no connections"),
    }
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
                if want_gone && TargetGone::parse(private_data).is_none() {
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
                if TargetGone::parse(private_data).is_none() {
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
    let mut child = stay_client(o, cm_ping, sock, sid, false)?;
    let conns = accept_all(o, &mut listener, &mut child).await?;
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
        let c = cm.connect(p).await.map_err(|e| {
            // The XRC target says why in the REJ (its "target gone" block).
            let detail = match &e {
                ibcm::rt::CmError::Connection(ConnectionError::Rejected {
                    private_data,
                    ari,
                    ..
                }) => {
                    format!("{:?}; ARI {ari:02x?}", TargetGone::parse(private_data))
                }
                _ => String::new(),
            };
            anyhow!("XRC connect {} of {}: {e} {detail}", conns.len(), o.conns)
        })?;
        conns.push(c);
    }
    kill_and_time(&mut child, conns, true).await
}
